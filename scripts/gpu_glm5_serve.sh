#!/usr/bin/env bash
# scripts/gpu_glm5_serve.sh — issue 9 in one call: a random-weight model of GLM-5's full geometry (78 layers, 256
# experts, MLA + DSA) served by `tern serve` over 8 GPUs with continuous batching, measured through HTTP:
#   1. `tern fit` — the plan per GPU (weights, KV, scratch) for the flags below;
#   2. `tern serve MODEL --gpus N ...` started, time to ready (the script's clock from exec to `listening on`, and
#      the server's own "ready: engine opened ... in X ms" line), device memory sampled every 2 s throughout
#      (nvidia-smi; on the CPU the server's RSS);
#   3. decode through the server: build/load (closed-loop streaming clients) at concurrency CONC, prompt PROMPT,
#      GEN tokens each: TTFT, ITL p50/p99 (ms per output token), aggregate output tok/s;
#   4. prefill through the server: one client, prompts of PREFILL tokens and 2 new tokens; prefill tok/s =
#      prompt / TTFT p50;
#   5. summary.txt: ready time, peak memory per GPU, the decode and prefill tables (and the SGLang anchor:
#      GLM-5-FP8 on 8xH200, 7.54 ms per output token at concurrency 1, 1,215 output tok/s under load).
# Needs: build/tern (full, with serve) and build/load — here: `make build/tern build/load`; on the GPU machine
# `bash scripts/gpu_check.sh pack serve` here, then carry [".gpudeps", "build/gpu_prebuilt"] and
# GPU_PREBUILT=build/gpu_prebuilt/bin.tar.xz. With fewer GPUs than GPUS on a cuda run it prints SKIP and exits 0.
# The same path runs on the CPU at a reduced size (CI-sized check of the script itself):
#   MODEL=random:glm5-mini:q4 GPUS=2 DEVICE=cpu CONC=1,2 PROMPT=32 GEN=8 PREFILL=256 MAXCTX=512 BUDGET=0 \
#       OUT=build/g9 bash scripts/gpu_glm5_serve.sh
# Knobs (defaults for the 8xH200 run): MODEL random:glm5:q4, GPUS 8, DEVICE cuda, KVQ bf16 (GLM-5's latent cache on
# bf16 pages: 64 x 8k fits 140 GB a GPU), CONC 1,8,64, PROMPT 1024, GEN 128, REQUESTS (per level; load.c's
# default max(4C,16)), PREFILL 8192,32768, MAXCTX 33792, MAXC (max concurrency, default the largest CONC), BUDGET 140
# (GB a GPU; 0: no --memory-budget), COMPUTE (bf16 on a GPU), READY_S 480 (give up waiting for the server), DECODE_S 240
# and PREFILL_S 150 (limits of the load runs; summary.txt is written as it goes, so a call cut short keeps what ran).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_glm5}"
mkdir -p "$OUT"
MODEL=${MODEL:-random:glm5:q4} GPUS=${GPUS:-8} DEVICE=${DEVICE:-cuda} KVQ=${KVQ:-bf16}
CONC=${CONC:-1,8,64} PROMPT=${PROMPT:-1024} GEN=${GEN:-128} PREFILL=${PREFILL:-8192,32768} MAXCTX=${MAXCTX:-33792}
BUDGET=${BUDGET:-140} READY_S=${READY_S:-480}
MAXC=${MAXC:-$(echo "$CONC" | tr ',' '\n' | sort -n | tail -1)}
S="$OUT/summary.txt"
: > "$S"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }

if [ -n "${GPU_PREBUILT:-}" ]; then
    tar xJf "$GPU_PREBUILT" || { stamp "cannot unpack $GPU_PREBUILT"; exit 1; }
fi
if [ -d .gpudeps/root ]; then
    export LD_LIBRARY_PATH="$PWD/.gpudeps/root/usr/lib/x86_64-linux-gnu:$PWD/.gpudeps/root/gnutls${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
TERN=${TERN:-build/tern} LOAD=${LOAD:-build/load}
for b in "$TERN" "$LOAD"; do [ -x "$b" ] || { stamp "missing $b (make build/tern build/load, or pack serve)"; exit 1; }; done
if [ "$DEVICE" = cuda ]; then
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    nvidia-smi -L > "$OUT/env.txt" 2>&1
    if [ "$n" -lt "$GPUS" ]; then stamp "SKIP: $n GPUs here, $GPUS needed"; exit 0; fi
fi
flags=(--device "$DEVICE" --gpus "$GPUS" --max-ctx "$MAXCTX" --max-concurrency "$MAXC")
[ "$KVQ" != none ] && flags+=(--kv-quant "$KVQ")
[ "$BUDGET" != 0 ] && flags+=(--memory-budget "$BUDGET")
[ -n "${COMPUTE:-}" ] && flags+=(--compute "$COMPUTE")
preset=${MODEL#random:}; quant=${preset#*:}; [ "$quant" = "$preset" ] && quant=bf16; preset=${preset%%:*}

# 1. the plan
fitf=(--gpus "$GPUS" --ctx "$MAXCTX" --max-concurrency "$MAXC")
[ "$KVQ" != none ] && fitf+=(--kv-quant "$KVQ")
[ "$BUDGET" != 0 ] && fitf+=(--memory-budget "$BUDGET")
if [ "$preset" != "$MODEL" ]; then "$TERN" fit --random "$preset" --quant "$quant" "${fitf[@]}" > "$OUT/fit.txt" 2>&1
else "$TERN" fit "$MODEL" "${fitf[@]}" > "$OUT/fit.txt" 2>&1; fi
stamp "fit exit $?: $(grep -v '^csv' "$OUT/fit.txt" | tail -3 | tr '\n' ' ')"

# 2. the server, with memory sampled beside it
"$TERN" serve "$MODEL" --port 0 "${flags[@]}" > "$OUT/serve.out" 2> "$OUT/serve.err" &
spid=$!
if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2 > "$OUT/mem.csv" 2>/dev/null &
else
    ( while kill -0 $spid 2>/dev/null; do echo "cpu, $(( $(ps -o rss= -p $spid 2>/dev/null || echo 0) / 1024 ))"; sleep 2; done ) \
        > "$OUT/mem.csv" &
fi
mpid=$!
cleanup() { kill -INT $spid 2>/dev/null; sleep 1; kill $spid $mpid 2>/dev/null; }
trap cleanup EXIT
ts=$(date +%s.%N) url=
while :; do
    url=$(sed -n 's/^listening on //p' "$OUT/serve.out")
    [ -n "$url" ] && break
    kill -0 $spid 2>/dev/null || break
    awk -v a="$(date +%s.%N)" -v b="$ts" -v l="$READY_S" 'BEGIN { exit !(a - b > l) }' && break
    sleep 0.2
done
ready=$(awk -v a="$(date +%s.%N)" -v b="$ts" 'BEGIN { printf "%.2f", a - b }') # awk, not bc: the GPU image may lack bc
if [ -z "$url" ]; then stamp "server not ready after ${ready} s"; tail -5 "$OUT/serve.err" | tee -a "$S"; exit 1; fi
stamp "server ready in ${ready} s at $url ($MODEL, ${flags[*]})"
grep -h 'ready:' "$OUT/serve.out" "$OUT/serve.err" | head -2 | tee -a "$S"

# 3. decode at each concurrency
req=()
[ -n "${REQUESTS:-}" ] && req=(--requests "$REQUESTS")
timeout "${DECODE_S:-240}" "$LOAD" --url "$url" --conc "$CONC" --prompt-tokens "$PROMPT" --max-tokens "$GEN" "${req[@]}" \
    --csv "$OUT/decode.csv" > "$OUT/decode.txt" 2>&1
stamp "decode: load exit $? (prompt $PROMPT, $GEN tokens a request)"
grep -v '^#' "$OUT/decode.txt" | tee -a "$S"

# 4. prefill, one request at a time
echo "prompt,ttft_p50_ms,prefill_tok_s" > "$OUT/prefill.csv"
for p in ${PREFILL//,/ }; do
    timeout "${PREFILL_S:-150}" "$LOAD" --url "$url" --conc 1 --requests 2 --prompt-tokens "$p" --max-tokens 2 \
        --csv "$OUT/prefill_$p.csv" > "$OUT/prefill_$p.txt" 2>&1
    rc=$?
    ttft=$(awk -F, 'NR == 2 {print $6}' "$OUT/prefill_$p.csv" 2>/dev/null)
    if [ $rc = 0 ] && [ -n "$ttft" ]; then
        echo "$p,$ttft,$(awk -v p="$p" -v t="$ttft" 'BEGIN { printf "%.1f", (t > 0 ? p * 1000 / t : 0) }')" >> "$OUT/prefill.csv"
    else
        echo "$p,failed (exit $rc)," >> "$OUT/prefill.csv"; tail -3 "$OUT/prefill_$p.txt" >> "$S"
    fi
done
stamp "prefill (TTFT of one request, 2 new tokens):"
awk -F, '{ printf "%-8s %14s %14s\n", $1, $2, $3 }' "$OUT/prefill.csv" | tee -a "$S"

# 5. memory
cleanup
trap - EXIT
wait $spid 2>/dev/null
stamp "peak memory (MiB) per device:"
awk -F', *' 'NF >= 2 { if ($2 > m[$1]) m[$1] = $2 } END { for (d in m) printf "  %s %d\n", d, m[d] }' "$OUT/mem.csv" |
    sort | tee -a "$S"
echo "anchor: SGLang GLM-5-FP8 on 8xH200, 7.54 ms per output token at concurrency 1, 1,215 output tok/s under load" >> "$S"
stamp "done"
