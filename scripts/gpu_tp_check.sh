#!/usr/bin/env bash
# scripts/gpu_tp_check.sh — tensor/expert parallelism on a multi-GPU machine (nvidia-h200-x2) in one
# call: binaries (built here, or unpacked from TP_PREBUILT), TP parity on CUDA ranks (f32: exact
# path; bf16: the bf16 bound), greedy ids with --gpus 1 vs N, then decode speed at batch 1
# (tern bench) and at batch C (build/concurrency, steady decode tok/s), 1 GPU vs N.
# Knobs:
#   TP (default 2)            ranks
#   TP_PREBUILT=F.tar.xz      binaries tern-core, concurrency, test_model_tp_core made elsewhere (no build here)
#   GPU_PREBUILT=F.tar.xz     the pack of `scripts/gpu_check.sh pack` (build/... paths; no build here)
#   TP_TESTS=0                skip the parity tests and greedy checks; TP_TEST_COMPUTE (default "f32 bf16")
#   TP_GREEDY="fixture:compute .." greedy --gpus 1 vs N (default: five fixtures f32, two bf16)
#   TP_BENCH="preset:quant .."  batch-1 benches (default "llama3-8b:bf16"); quant bf16 | q4 | q8
#   TP_EAGER="preset:quant .."  the same N-GPU bench again with TERN_TP_GRAPHS=0 (the eager group)
#   TP_CONC_MODELS="preset:quant .." batch-TP_CONC benches (default "llama3-8b:bf16"), TP_CONC (default 64)
#   TP_COMPUTE (default bf16) compute mode of the benches; TP_ONE=0 skips the 1-GPU runs (numbers known)
#   TP_NOP2P="preset:quant .."  the same N-GPU bench again with TERN_TP_P2P=0 (every all-reduce through NCCL)
# A first parity test that fails with the one-shot all-reduce (nccl.c) turns it off for the rest.
# Logs under $OUT; summary.txt is printed last.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_tp}"
mkdir -p "$OUT"
D="$PWD/.gpudeps/root"
export CPATH="$D/usr/include" LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu:$D/gnutls"
export LD_LIBRARY_PATH="$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TP=${TP:-2}
COMP=${TP_COMPUTE:-bf16}
S="$OUT/summary.txt"
: > "$S"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }
nvidia-smi -L > "$OUT/env.txt" 2>&1
nvidia-smi topo -m >> "$OUT/env.txt" 2>&1
stamp "gpus: $(grep -c '^GPU' "$OUT/env.txt")"

if [ -n "${GPU_PREBUILT:-}" ]; then
    tar xJf "$GPU_PREBUILT" || { stamp "cannot unpack $GPU_PREBUILT"; exit 1; }
    TERN=build/tern-core CONC=build/concurrency TEST=build/tests/test_model_tp_core
elif [ -n "${TP_PREBUILT:-}" ]; then
    B=build/tpb
    mkdir -p "$B" && tar xJf "$TP_PREBUILT" -C "$B" || { stamp "cannot unpack $TP_PREBUILT"; exit 1; }
    TERN=$B/tern-core CONC=$B/concurrency TEST=$B/test_model_tp_core
else
    if ! timeout 300 make -j"$(nproc)" build/tern-core build/tests/test_model_tp_core build/concurrency > "$OUT/build.log" 2>&1; then
        stamp "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1
    fi
    TERN=build/tern-core CONC=build/concurrency TEST=build/tests/test_model_tp_core
fi
stamp "binaries ready ($TERN)"

TERN_TEST_DEVICE=cuda TERN_TEST_TP=$TP timeout 60 "$TEST" > "$OUT/tp_smoke.log" 2>&1
rc=$?
stamp "smoke: test_model_tp on cuda (tp $TP, f32, one-shot all-reduce) exit $rc: $(grep -c '^PASS' "$OUT/tp_smoke.log") passed"
if [ $rc != 0 ]; then export TERN_TP_P2P=0; stamp "one-shot all-reduce OFF for the rest"; grep -E 'check failed' "$OUT/tp_smoke.log" | head -5 | tee -a "$S"; fi
if [ "${TP_TESTS:-1}" = 1 ]; then
    for comp in ${TP_TEST_COMPUTE-f32 bf16}; do
        TERN_TEST_DEVICE=cuda TERN_TEST_TP=$TP TERN_TEST_COMPUTE=$comp timeout 120 "$TEST" > "$OUT/tp_test_$comp.log" 2>&1
        rc=$?
        stamp "test_model_tp on cuda (tp $TP, $comp) exit $rc: $(grep -c '^PASS' "$OUT/tp_test_$comp.log") passed, $(grep -c '^FAIL' "$OUT/tp_test_$comp.log") failed"
        grep -E '^FAIL|check failed|not kept' "$OUT/tp_test_$comp.log" | head -8 | tee -a "$S"
        grep -E 'gemma4_dense N=|glm5_dsa N=|llama3 N=' "$OUT/tp_test_$comp.log" | head -3 | tee -a "$S"
    done
    F=tests/parity/fixtures
    for mc in ${TP_GREEDY-llama3:f32 qwen3:f32 gemma4_dense:f32 gemma4_moe_like:f32 glm5_dsa:f32 llama3:bf16 gemma4_dense:bf16}; do
        m=${mc%%:*} comp=${mc#*:}
        a=$(timeout 30 "$TERN" generate "$F/$m" --ids 2,17,99,45,20,12 --max-tokens 40 --temperature 0 --ignore-eos --print-ids --device cuda --compute $comp --gpus 1 2>/dev/null | head -1)
        b=$(timeout 30 "$TERN" generate "$F/$m" --ids 2,17,99,45,20,12 --max-tokens 40 --temperature 0 --ignore-eos --print-ids --device cuda --compute $comp --gpus "$TP" 2>>"$OUT/greedy_err.log" | head -1)
        [ -n "$a" ] && [ "$a" = "$b" ] && r=same || r="DIFFER: [$a] vs [$b]"
        stamp "greedy $m $comp --gpus 1 vs $TP: $r"
    done
fi

# one batch-1 bench: $1 preset, $2 quant, $3 gpus, $4 label, env before
bench1() {
    local log="$OUT/bench_${1}_${2}_${3}_$4.log"
    timeout 150 "$TERN" bench --device cuda --gpus "$3" --random "$1" --quant "$2" --compute "$COMP" --prompt 128 --gen 64 --reps 2 > "$log" 2>&1
    local rc=$?
    stamp "bench $1 $2 $COMP gpus $3 $4 exit $rc: $(grep '^csv,' "$log" | tail -1 | cut -d, -f6-8)  (pp, tg tok/s, bw)"
    grep -iE 'error|not kept|fail' "$log" | head -3 | tee -a "$S"
}
for mq in ${TP_BENCH-llama3-8b:bf16}; do
    m=${mq%%:*} q=${mq#*:}
    [ "${TP_ONE:-1}" = 1 ] && bench1 "$m" "$q" 1 graphs
    bench1 "$m" "$q" "$TP" graphs
done
for mq in ${TP_NOP2P-}; do
    m=${mq%%:*} q=${mq#*:}
    TERN_TP_P2P=0 bench1 "$m" "$q" "$TP" nccl
done
for mq in ${TP_EAGER-}; do
    m=${mq%%:*} q=${mq#*:}
    TERN_TP_GRAPHS=0 bench1 "$m" "$q" "$TP" eager
done

# batch C: steady decode tok/s of build/concurrency (stopped once its concurrency line is out:
# the prefix-cache part after it reloads the model twice)
conc1() {
    local log="$OUT/conc_${1}_${2}_$3.log" spec="$1" pid i
    [ "$2" != bf16 ] && spec="$1:$2"
    TERN_TP=$3 timeout 200 "$CONC" --random "$spec" --device cuda --conc "${TP_CONC:-64}" --compute "$COMP" --prompt 128 --gen 64 \
        --system 16 --requests 2 > "$log" 2>&1 &
    pid=$!
    for i in $(seq 1 400); do
        grep -q '^csv,conc' "$log" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    stamp "concurrency $1 $2 $COMP tp $3: $(grep '^csv,conc' "$log" | cut -d, -f5-9)  (C, prompt, gen, out tok/s, decode tok/s)"
    grep -iE 'error|engine:|step:|not kept' "$log" | head -3 | tee -a "$S"
}
for mq in ${TP_CONC_MODELS-llama3-8b:bf16}; do
    m=${mq%%:*} q=${mq#*:}
    [ "${TP_ONE:-1}" = 1 ] && conc1 "$m" "$q" 1
    conc1 "$m" "$q" "$TP"
done
echo "================ summary ================"
cat "$S"
