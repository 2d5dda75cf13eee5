#!/usr/bin/env bash
# cli_contract.sh — the CLI contract of DESIGN.md §7: exit codes (0 ok, 2 bad input, 1 other),
# one-line messages naming what is wrong, the demo model, logits/generate output formats.
set -u
cd "$(dirname "$0")/../.."
T=build/tern
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TERN_CACHE="$tmp/cache"
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; }
expect() { # name, wanted exit code, grep pattern for stderr (or ''), command...
    local name=$1 want=$2 pat=$3; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    if [ "$rc" -ne "$want" ]; then bad "$name (exit $rc, want $want): $(head -c 300 "$tmp/err")"; return; fi
    if [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/err"; then bad "$name (stderr lacks '$pat'): $(head -c 300 "$tmp/err")"; return; fi
    ok "$name"
}

expect help 0 '' $T --help
expect unknown_command 2 "unknown command" $T frobnicate
expect missing_dir 2 "nonexistent" $T logits "$tmp/nonexistent" --ids 1,2 --out "$tmp/l.f32"
expect bad_ids 2 "bad token id" $T logits demo --ids 1,x,3 --out "$tmp/l.f32"
expect ids_out_of_vocab 2 "outside the vocabulary" $T logits demo --ids 1,99999 --out "$tmp/l.f32"
expect bad_threads 2 "threads" $T logits demo --threads -4 --ids 1 --out "$tmp/l.f32"
expect bad_device 2 "device" $T logits demo --device tpu --ids 1 --out "$tmp/l.f32"
mkdir -p "$tmp/m1" && echo '{not json' > "$tmp/m1/config.json"
expect malformed_config 2 "config.json" $T logits "$tmp/m1" --ids 1 --out "$tmp/l.f32"
mkdir -p "$tmp/m2" && echo '{"model_type": "frobnet", "architectures": ["FrobForCausalLM"]}' > "$tmp/m2/config.json"
expect unsupported_arch 2 "frobnet" $T logits "$tmp/m2" --ids 1 --out "$tmp/l.f32"

# demo model: logits size and generate output shape
expect demo_logits 0 '' $T logits demo --ids 2,100,101,102 --out "$tmp/l.f32"
sz=$(stat -c %s "$tmp/l.f32" 2>/dev/null || echo 0)
[ "$sz" -eq $((4 * 264 * 4)) ] && ok demo_logits_size || bad "demo_logits_size ($sz bytes)"
$T generate demo --ids 2,100,101 --max-tokens 5 --temperature 0 --ignore-eos --print-ids >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && grep -Eq '^[0-9]+( [0-9]+){4}$' "$tmp/out"; then ok demo_generate_ids; else bad "demo_generate_ids: $(cat "$tmp/out" "$tmp/err" | head -c 300)"; fi
# truncated safetensors: copy the demo and cut the weights file
cp -r "$TERN_CACHE"/demo-v1 "$tmp/m3" 2>/dev/null && truncate -s 5000 "$tmp/m3/model.safetensors"
expect truncated_safetensors 2 "model.safetensors" $T logits "$tmp/m3" --ids 1 --out "$tmp/l.f32"

# text in, text out on the demo model (byte-level tokenizer + chat template)
$T generate "Hello there" --max-tokens 8 --seed 3 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && grep -q "generated 8 tokens" "$tmp/err"; then ok demo_generate_text; else bad "demo_generate_text: $(head -c 300 "$tmp/err")"; fi
$T generate demo "Hello" --raw --temperature 0 --max-tokens 4 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && ok demo_generate_raw || bad "demo_generate_raw: $(head -c 300 "$tmp/err")"
printf 'hi\nsecond turn\n/exit\n' | $T chat --max-tokens 4 --temperature 0 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && [ "$(grep -c 'generated 4 tokens' "$tmp/err")" -eq 2 ] && grep -q "cached" "$tmp/err"; then ok demo_chat_two_turns; else bad "demo_chat_two_turns: $(head -c 300 "$tmp/err")"; fi
expect generate_bad_temperature 2 "temperature" $T generate "x" --temperature -1
expect generate_bad_top_p 2 "top-p" $T generate "x" --top-p 2

# bench: a prompt list runs on one loaded model, one csv line per (prompt, rep); the floor counts
# the KV read at the mean decode context (last field, MB), so it grows with the prompt
$T bench demo --prompt 16,200 --gen 4 --reps 1 >"$tmp/out" 2>"$tmp/err"
n=$(grep -c '^csv,demo,cpu,' "$tmp/out"); k1=$(grep '^csv,demo,cpu,16,' "$tmp/out" | cut -d, -f11); k2=$(grep '^csv,demo,cpu,200,' "$tmp/out" | cut -d, -f11)
if [ "$n" -eq 2 ] && awk -v a="$k1" -v b="$k2" 'BEGIN{exit !(b > a)}'; then ok bench_prompt_list; else bad "bench_prompt_list: $(head -c 300 "$tmp/out")"; fi
expect bench_bad_prompt_list 2 "prompt" $T bench demo --prompt 16,x

# fit --gpus N: one csv-rank line per rank; a rank holds more than 1/N of the weights (embeddings
# whole) and less than all, and half the KV of one device at N = 2; a split that does not divide
# the heads says so
$T fit --random llama3-8b --quant q4 --ctx 4096 --gpus 2 >"$tmp/out" 2>"$tmp/err"
w1=$(grep '^csv,' "$tmp/out" | cut -d, -f6); kv1=$(grep '^csv,' "$tmp/out" | cut -d, -f10)
wr=$(grep '^csv-rank,2,0,' "$tmp/out" | cut -d, -f4); kvr=$(grep '^csv-rank,2,0,' "$tmp/out" | cut -d, -f5)
if [ "$(grep -c '^csv-rank,2,' "$tmp/out")" -eq 2 ] && awk -v w="$w1" -v r="$wr" -v k="$kv1" -v q="$kvr" \
    'BEGIN{exit !(r > w / 2 && r < w && q * 2 == k)}'; then ok fit_gpus_ranks; else bad "fit_gpus_ranks: $(tail -c 400 "$tmp/out")"; fi
$T fit --random llama3-8b --quant q4 --gpus 3 >"$tmp/out" 2>&1
grep -q "does not split this model: .*num_attention_heads 32" "$tmp/out" && ok fit_gpus_refuses || bad "fit_gpus_refuses: $(tail -c 300 "$tmp/out")"
# GLM-5's latent cache takes f32 or bf16 pages: fit refuses the other kinds as tern_kv_open would, bf16 halves it
expect fit_glm_latent_q8_refused 2 "latent cache (GLM-5) takes f32 or bf16" $T fit --random glm5 --quant q4 --kv-quant 8
$T fit --random glm5 --quant q4 --kv-quant bf16 >"$tmp/out" 2>&1
grep -q "latent cache .*x 2 B, bf16 pages" "$tmp/out" && grep -q "selected KV mode   bf16 (--kv-quant): 109824 B/token" "$tmp/out" &&
    ok fit_glm_latent_bf16 || bad "fit_glm_latent_bf16: $(grep -E 'latent|selected' "$tmp/out" | head -3)"

# every subcommand answers --help with its usage and exit 0
for c in generate chat serve logits tokenize detokenize template info fit bench; do
    $T $c --help >"$tmp/out" 2>&1
    if [ $? -eq 0 ] && grep -q "usage: tern $c" "$tmp/out"; then ok "help_$c"; else bad "help_$c: $(head -c 200 "$tmp/out")"; fi
done

# a preset's config.json for peers (bench/peer_transformers.py): valid JSON, the preset's geometry
$T info --random llama3-8b --config >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && node -e 'const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.exit(c.model_type === "llama" && c.hidden_size === 4096 ? 0 : 1)' "$tmp/out"; then ok info_preset_config
else bad "info_preset_config: $(head -c 200 "$tmp/out" "$tmp/err")"; fi
expect info_config_needs_random 2 "random" $T info --config

# rows per forward: serve --max-batch-tokens is range-checked; generate --chunk changes no greedy id
expect serve_max_batch_tokens_zero 2 "max-batch-tokens" $T serve demo --max-batch-tokens 0
expect serve_max_batch_tokens_text 2 "max-batch-tokens" $T serve demo --max-batch-tokens many
a=$($T generate demo --ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 6 --temperature 0 --ignore-eos --print-ids --chunk 5 2>/dev/null)
b=$($T generate demo --ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 6 --temperature 0 --ignore-eos --print-ids 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok generate_chunk_same_ids || bad "generate_chunk_same_ids: '$a' vs '$b'"
# the pipelined decode (TERN_ASYNC=2: also on a backend without step graphs, which runs each step at once, so this
# checks its count and trim bookkeeping; gemma4_e2b_like slides a window of 7): the same ids as the plain loop
for f in llama3 gemma4_e2b_like; do
    a=$(TERN_ASYNC=0 $T generate tests/parity/fixtures/$f --ids 2,17,99,5 --max-tokens 40 --temperature 0 --ignore-eos --print-ids 2>/dev/null)
    b=$(TERN_ASYNC=2 $T generate tests/parity/fixtures/$f --ids 2,17,99,5 --max-tokens 40 --temperature 0 --ignore-eos --print-ids 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "generate_async_same_ids_$f" || bad "generate_async_same_ids_$f: '$a' vs '$b'"
done
# a chunk longer than the default (the sliding layers' KV must hold window + one chunk): 1500 ids at once
long=$(seq 2 1501 | awk '{ s = s (NR > 1 ? "," : "") (2 + $1 % 200) } END { print s }')
a=$($T generate demo --ids "$long" --max-tokens 4 --temperature 0 --ignore-eos --print-ids --chunk 2048 2>"$tmp/err")
b=$($T generate demo --ids "$long" --max-tokens 4 --temperature 0 --ignore-eos --print-ids 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok generate_long_chunk || bad "generate_long_chunk: '$a' vs '$b' $(head -c 200 "$tmp/err")"
# MODEL random:PRESET[:qB] (the engine's and tern serve's spelling) is --random PRESET [--quant qB] for every command
a=$($T generate random:glm5-tiny:q4 --ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos --print-ids --device cpu 2>/dev/null)
b=$($T generate --random glm5-tiny --quant q4 --ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos --print-ids --device cpu 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok generate_random_model_spelling || bad "generate_random_model_spelling: '$a' vs '$b'"
a=$($T generate random:glm5-tiny:bf16 --ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos --print-ids --device cpu 2>/dev/null)
b=$($T generate random:glm5-tiny --ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos --print-ids --device cpu 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok generate_random_bf16_spelling || bad "generate_random_bf16_spelling: '$a' vs '$b'"
expect random_unknown_preset 2 "unknown preset 'nope'" $T generate random:nope --ids 1,2 --max-tokens 2
expect random_bad_bits 2 "expected random:PRESET" $T logits random:glm5-tiny:q7 --ids 1,2 --out "$tmp/l.f32"
