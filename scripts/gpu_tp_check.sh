#!/usr/bin/env bash
# scripts/gpu_tp_check.sh — tensor/expert parallelism on a multi-GPU machine (nvidia-h200-x2) in one
# call: full build with the carried Debian libraries (.gpudeps), TP parity on CUDA ranks, greedy ids
# with --gpus 1 vs N, then decode speed at batch 1 (tern bench) and at batch 64 (build/concurrency).
# Knobs: TP (default 2), TP_MODELS (default "llama3-8b"), TP_CONC (default 64). Logs under $OUT.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_tp}"
mkdir -p "$OUT"
D="$PWD/.gpudeps/root"
export CPATH="$D/usr/include" LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu:$D/gnutls"
export LD_LIBRARY_PATH="$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TP=${TP:-2}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi -L > "$OUT/env.txt" 2>&1
stamp "gpus: $(grep -c GPU "$OUT/env.txt")"
if ! timeout 300 make -j"$(nproc)" build/tern build/tests/test_model_tp build/concurrency > "$OUT/build.log" 2>&1; then
    stamp "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1
fi
stamp "build ok"
TERN_TEST_DEVICE=cuda TERN_TEST_TP=$TP timeout 90 ./build/tests/test_model_tp > "$OUT/tp_test.log" 2>&1
stamp "test_model_tp on cuda (tp $TP) exit $?: $(grep -c '^PASS' "$OUT/tp_test.log") passed, $(grep -c '^FAIL' "$OUT/tp_test.log") failed"
grep -E '^FAIL|check failed' "$OUT/tp_test.log" | head -10 | tee -a "$OUT/summary.txt"
F=tests/parity/fixtures
for m in llama3 qwen3 gemma4_dense gemma4_moe_like; do
    a=$(timeout 30 ./build/tern generate "$F/$m" --ids 2,17,99,45,20,12 --max-tokens 40 --temperature 0 --ignore-eos --print-ids --device cuda --gpus 1 2>/dev/null | head -1)
    b=$(timeout 30 ./build/tern generate "$F/$m" --ids 2,17,99,45,20,12 --max-tokens 40 --temperature 0 --ignore-eos --print-ids --device cuda --gpus "$TP" 2>/dev/null | head -1)
    [ "$a" = "$b" ] && r=same || r="DIFFER: [$a] vs [$b]"
    stamp "greedy $m --gpus 1 vs $TP: $r"
done
for m in ${TP_MODELS:-llama3-8b}; do
    for g in 1 "$TP"; do
        timeout 120 ./build/tern bench --device cuda --gpus "$g" --random "$m" --quant bf16 --compute bf16 --prompt 512 --gen 64 --reps 1 \
            > "$OUT/bench_${m}_$g.log" 2>&1
        stamp "bench $m bf16 --gpus $g exit $?: $(grep '^csv,' "$OUT/bench_${m}_$g.log" | tail -2 | tr '\n' ' ')"
    done
    for g in 1 "$TP"; do
        TERN_TP=$g timeout 120 ./build/concurrency --random "$m" --device cuda --conc "${TP_CONC:-64}" --compute bf16 --prompt 128 --gen 64 \
            --system 16 --requests 2 > "$OUT/conc_${m}_$g.log" 2>&1
        stamp "concurrency $m tp $g exit $?"
        grep -E '^ +[0-9]+ ' "$OUT/conc_${m}_$g.log" | head -3 | tee -a "$OUT/summary.txt"
    done
done
echo "================ summary ================"
cat "$OUT/summary.txt"
