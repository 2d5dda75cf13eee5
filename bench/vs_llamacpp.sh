#!/usr/bin/env bash
# vs_llamacpp.sh — whole-model CPU benchmark, tern vs llama.cpp, interleaved on one machine.
#
# Usage: bench/vs_llamacpp.sh LLAMA_BENCH GGUF_DIR [ROUNDS] [PRESET]
#   LLAMA_BENCH  a llama-bench binary built from source (CPU only; see bench/NOTES.md)
#   GGUF_DIR     holds $PRESET-bf16.gguf, $PRESET-q8_0.gguf, $PRESET-q4_0.gguf: random weights of
#                the same geometry as tern's `--random $PRESET` (made with llama.cpp's gguf-py and
#                llama-quantize --pure; none of it is part of this repository)
# Env: TERN (default build/tern), THREADS (2), PP (128), TG (32), FORMATS (default
#      "bf16:bf16 q8:q8_0 q4:q4_0", tern quant:gguf suffix pairs), INT8 (default 1) adds the engine
#      tern-int8 (`--compute int8`: x quantized to int8 per weight group for Q8/Q4 matmuls, as
#      llama.cpp's Q8_0/Q4_0 paths do) for the q formats, BF16 (default 1) adds tern-bf16 (`--compute bf16`: x
#      rounded to bf16 in the prefill GEMM, vdpbf16ps, as llama.cpp's BF16 path does) for bf16, BEFORE=1 adds tern with TERN_CPU_GEMM=0
#      (the tile-decode prefill path), for before/after numbers. TERN_MODELS=DIR: tern reads real
#      files instead of --random: DIR/bf16, DIR/q8, DIR/q4 are model dirs of the same geometry
#      (random weights written once as safetensors; bench/NOTES.md (j)), loaded with --no-mmap
#      (2 MB pages; NO_MMAP=0 keeps the file mapping). DEC0=1 adds the engines tern-dec0 /
#      tern-int8-dec0 (TERN_CPU_DEC=0: the batch-1 driver of cpu_decode.c off), for before/after.
#      llama.cpp always runs with -lm none (weights read into memory, no mmap).
#
# Each round runs, per format: bandwidth probe, llama-bench (1 rep), probe, tern bench (1 rep),
# probe — so every engine's floor (bytes per token / bandwidth) uses the bandwidth of the same
# minute (mean of the probes around its run). Bytes per token = weights + KV cache read at the
# mean decode context (PP + (TG+1)/2 keys per layer): weights are tern's count for both engines
# (same geometry and bits per weight; llama.cpp's file size would also count tables read one
# row per token, such as Gemma 4's per-layer embeddings); the KV part is each engine's own
# cache format: tern f32 (4 bytes per element, its default), llama.cpp f16 (2). Its size per
# position and byte comes from config.json (layers x 2 x kv heads x head dim; TERN_MODELS dir,
# else KV_ELEMS=<elements per position> must be given, or the KV part is 0 and a note says so).
# Prints one "csv," line per run and a table of medians over rounds, including tern/llama.cpp
# ratios computed per round.
set -u
LB=${1:?usage: vs_llamacpp.sh LLAMA_BENCH GGUF_DIR [ROUNDS] [PRESET]}
DIR=${2:?usage: vs_llamacpp.sh LLAMA_BENCH GGUF_DIR [ROUNDS] [PRESET]}
ROUNDS=${3:-3}
PRESET=${4:-llama3-1b}
TERN=${TERN:-build/tern}
THREADS=${THREADS:-2}
PP=${PP:-128}
TG=${TG:-32}
OUT=$(mktemp)
TBIN=$(mktemp) # a private copy: a rebuild of $TERN mid-run (shared trees) must not break the run
trap 'rm -f "$OUT" "$TBIN"' EXIT
cp "$TERN" "$TBIN" && chmod +x "$TBIN" && TERN=$TBIN || exit 1

probe() { "$TERN" bench --probe | awk '{print $2}'; }

# llama-bench, one repetition each of pp and tg; prints "pp tg model_bytes"
run_llama() {
    "$LB" -m "$1" -p "$PP" -n "$TG" -t "$THREADS" -r 1 -lm none -o jsonl 2>/dev/null |
        awk '{ ts = $0; sub(/.*"avg_ts": */, "", ts); sub(/[,}].*/, "", ts);
               sz = $0; sub(/.*"model_size": */, "", sz); sub(/[,}].*/, "", sz);
               if ($0 ~ /"n_prompt": 0,/) tg = ts; else pp = ts }
             END { print pp, tg, sz }'
}

# tern bench, one rep; prints "pp tg weight_bytes_per_token"; $2: extra flags (e.g. --compute int8)
run_tern() {
    local src="--random $PRESET --quant $1"
    if [ -n "${TERN_MODELS:-}" ]; then
        src="$TERN_MODELS/$1 --device cpu"
        [ "${NO_MMAP:-1}" = 1 ] && src="$src --no-mmap"
    fi
    # shellcheck disable=SC2086
    "$TERN" bench $src --prompt "$PP" --gen "$TG" --threads "$THREADS" --reps 1 ${2:-} 2>/dev/null |
        awk '/weights read per token/ { for (i = 1; i <= NF; i++) if ($i == "token") mb = $(i + 1) }
             /^csv,/ { split($0, f, ","); pp = f[6]; tg = f[7] }
             END { print pp, tg, mb * 1e6 }'
}

# KV elements per position (all layers, K and V) from the model's config.json
kv_elems() {
    local cf=$1/config.json
    [ -f "$cf" ] || { echo 0; return; }
    tr -d ' \n' <"$cf" | awk '{
        n = split("num_hidden_layers num_key_value_heads head_dim hidden_size num_attention_heads", k, " ")
        for (i = 1; i <= n; i++) { v[k[i]] = 0; if (match($0, "\"" k[i] "\":[0-9]+")) { s = substr($0, RSTART, RLENGTH); sub(/.*:/, "", s); v[k[i]] = s } }
        hd = v["head_dim"] > 0 ? v["head_dim"] : (v["num_attention_heads"] > 0 ? v["hidden_size"] / v["num_attention_heads"] : 0)
        print v["num_hidden_layers"] * 2 * v["num_key_value_heads"] * hd }'
}
KVE=${KV_ELEMS:-0}
[ "$KVE" = 0 ] && [ -n "${TERN_MODELS:-}" ] && for d in "$TERN_MODELS"/*/; do KVE=$(kv_elems "$d"); [ "$KVE" != 0 ] && break; done
KVCTX=$(awk -v p="$PP" -v t="$TG" 'BEGIN { print p + (t + 1) / 2 }')
[ "$KVE" = 0 ] && echo "note: KV elements per position unknown (set KV_ELEMS): floors count weights only" >&2
kvb() { awk -v e="$KVE" -v c="$KVCTX" -v b="$1" 'BEGIN { printf "%.0f", e * c * b }'; } # KV bytes per token, $1 bytes/elem
KV_TERN=$(kvb 4)
KV_LLAMA=$(kvb 2)

fmts=${FORMATS:-"bf16:bf16 q8:q8_0 q4:q4_0"}
echo "# floor bytes per token = weights + KV at mean decode context $KVCTX: tern +$KV_TERN B (f32), llama.cpp +$KV_LLAMA B (f16)"
echo "csv,round,format,engine,pp_tps,tg_tps,bw_gbs,floor_bytes,floor_tps,tg_over_floor"
for r in $(seq 1 "$ROUNDS"); do
    for pair in $fmts; do
        tq=${pair%%:*}
        gq=${pair##*:}
        b0=$(probe)
        read -r lpp ltg lsz < <(run_llama "$DIR/$PRESET-$gq.gguf")
        b1=$(probe)
        read -r tpp ttg tsz < <(run_tern "$tq")
        b2=$(probe)
        engines="llama.cpp:$lpp:$ltg:$tsz:$b0:$b1 tern:$tpp:$ttg:$tsz:$b1:$b2" # one floor: same geometry and bits
        if [ "${INT8:-1}" = 1 ] && [ "$tq" != bf16 ]; then
            read -r ipp itg isz < <(run_tern "$tq" "--compute int8")
            b4=$(probe)
            engines="$engines tern-int8:$ipp:$itg:$isz:$b2:$b4"
            b2=$b4 # the next engine's floor starts from this probe
        fi
        if [ "${BF16:-1}" = 1 ] && [ "$tq" = bf16 ]; then
            read -r hpp htg hsz < <(run_tern "$tq" "--compute bf16")
            b7=$(probe)
            engines="$engines tern-bf16:$hpp:$htg:$hsz:$b2:$b7"
            b2=$b7
        fi
        if [ "${DEC0:-0}" = 1 ]; then
            read -r dpp dtg dsz < <(TERN_CPU_DEC=0 run_tern "$tq")
            b5=$(probe)
            engines="$engines tern-dec0:$dpp:$dtg:$dsz:$b2:$b5"
            b2=$b5
            if [ "${INT8:-1}" = 1 ] && [ "$tq" != bf16 ]; then
                read -r epp etg esz < <(TERN_CPU_DEC=0 run_tern "$tq" "--compute int8")
                b6=$(probe)
                engines="$engines tern-int8-dec0:$epp:$etg:$esz:$b2:$b6"
                b2=$b6
            fi
        fi
        if [ "${BEFORE:-0}" = 1 ]; then
            read -r opp otg osz < <(TERN_CPU_GEMM=0 run_tern "$tq")
            b3=$(probe)
            engines="$engines tern-tile:$opp:$otg:$osz:$b2:$b3"
        fi
        for e in $engines; do
            IFS=: read -r name pp tg sz ba bb <<<"$e"
            kvx=$KV_TERN
            [ "$name" = llama.cpp ] && kvx=$KV_LLAMA
            awk -v r="$r" -v f="$tq" -v n="$name" -v pp="$pp" -v tg="$tg" -v sz="$sz" -v kv="$kvx" -v ba="$ba" -v bb="$bb" 'BEGIN {
                bw = (ba + bb) / 2; sz = sz > 0 ? sz + kv : 0; fl = sz > 0 ? bw * 1e9 / sz : 0
                printf "csv,%d,%s,%s,%.2f,%.3f,%.2f,%.0f,%.3f,%.3f\n", r, f, n, pp, tg, bw, sz, fl, (fl > 0 ? tg / fl : 0) }'
        done | tee -a "$OUT"
    done
done

# medians over rounds; tern/llama.cpp ratios per round, then their median
awk -F, '
function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                 return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ k = $3 SUBSEP $4; n[k]++; PP[k, n[k]] = $5; TGv[k, n[k]] = $6; BW[k, n[k]] = $7; RF[k, n[k]] = $10
  v[$2, $3, $4, "pp"] = $5; v[$2, $3, $4, "tg"] = $6; v[$2, $3, $4, "rf"] = $10; rounds[$2] = 1; fm[$3] = 1; en[$4] = 1 }
END {
  printf "\n%-6s %-10s %9s %9s %9s %9s   %s\n", "format", "engine", "pp tok/s", "tg tok/s", "bw GB/s", "tg/floor", "(medians over rounds)"
  split("bf16 q8 q4", F, " "); split("llama.cpp tern tern-int8 tern-bf16 tern-dec0 tern-int8-dec0 tern-tile", E, " ")
  for (i = 1; i <= 3; i++) for (j = 1; j <= 7; j++) { k = F[i] SUBSEP E[j]; if (!(k in n)) continue
      for (m = 1; m <= n[k]; m++) { a[m] = PP[k, m]; b[m] = TGv[k, m]; c[m] = BW[k, m]; d[m] = RF[k, m] }
      x1 = med(a, n[k]); x2 = med(b, n[k]); x3 = med(c, n[k]); x4 = med(d, n[k])
      printf "%-6s %-10s %9.2f %9.3f %9.2f %9.3f\n", F[i], E[j], x1, x2, x3, x4 }
  printf "\n%-6s %-10s %14s %14s %18s\n", "format", "engine", "pp x/llama", "tg x/llama", "tg/floor x/llama"
  split("tern tern-int8 tern-bf16 tern-dec0 tern-int8-dec0", T, " ")
  for (i = 1; i <= 3; i++) for (j = 1; j <= 5; j++) { q = 0
      for (r in rounds) if (v[r, F[i], "llama.cpp", "pp"] > 0 && v[r, F[i], T[j], "pp"] > 0) { q++
          a[q] = v[r, F[i], T[j], "pp"] / v[r, F[i], "llama.cpp", "pp"]
          b[q] = v[r, F[i], "llama.cpp", "tg"] > 0 ? v[r, F[i], T[j], "tg"] / v[r, F[i], "llama.cpp", "tg"] : 0
          c[q] = v[r, F[i], "llama.cpp", "rf"] > 0 ? v[r, F[i], T[j], "rf"] / v[r, F[i], "llama.cpp", "rf"] : 0 }
      if (q) printf "%-6s %-10s %14.2f %14.2f %18.2f\n", F[i], T[j], med(a, q), med(b, q), med(c, q) }
}' "$OUT"
