#!/usr/bin/env bash
# scripts/gpu_check.sh — build, check and time the CUDA backend on the GPU machine in one call.
#
#   1. env: GPU name, driver, clocks, nvcc version
#   2. build: `make gpu-test` (sm_90 cubin + compute_90 PTX, see NVFLAGS in the Makefile):
#      build/test_cuda_ops (op tests vs the scalar reference) and build/bench_cuda
#   3. tests: every op vs cpu-ref (PASS/FAIL lines; per-format errors as "err" lines)
#   4. benchmarks: build/bench_cuda, then any executable bench/gpu_*.sh that exists
#   5. optional (GPU_CHECK_SANITIZE=1): compute-sanitizer memcheck over the op tests
# Knobs: GPU_OPS_ONLY=a,b runs only the op tests whose names contain a part; GPU_BENCH_KERNELS=0 skips bench_cuda; GPU_BENCH_MODELS="model:quant[:compute[:VAR=V,..]] ..." (whole-model benches; set but
# empty: none), GPU_BENCH_REPS (default 2),
# GPU_BENCH_NOGRAPH="model:quant ..." (the same bench again with TERN_GRAPHS=0, for comparison).
# Writes logs and summary.txt under $OUT (default build/gpu_check) and prints the summary last.
# The device returns at most 8 files from its $OUT: run as `OUT=/tmp/g bash scripts/gpu_check.sh;
# tar cJf "$OUT/logs.tar.xz" -C /tmp/g .` so that every log comes back.
# Every stage has its own timeout so the whole run stays well inside 10 minutes.
#
# Prebuilt binaries (saves the device's build minutes; nvcc here and there is the same 13.0):
#   bash scripts/gpu_check.sh pack [small|ab|serve] # here: make, strip, xz (preset 1, 512 MiB window: ~30 s): build/gpu_prebuilt/bin.tar.xz (~15 MB:
#                                         # op tests, bench_cuda, tern-core, parity, concurrency, TP tests;
#                                         # small: tern-core and concurrency only)
#   GPU_PACK_BASE=FILE bash scripts/gpu_check.sh pack  # also FILE (another tree's tern-core: an A/B against the committed
#                                         # binary, gpu_ab.sh b1e's BIN=build/base/tern-core) as build/base/tern-core,
#                                         # stripped and executable (the shared code packs to almost nothing);
#                                         # GPU_PACK_ALT=FILE likewise as build/alt/tern-core (a third build);
#                                         # GPU_PACK_BASE_CONC=FILE: the base tree's concurrency as build/base/concurrency
#   GPU_PREBUILT=build/gpu_prebuilt/bin.tar.xz bash scripts/gpu_check.sh   # device, carry
#       [".gpudeps", "build/gpu_prebuilt"]: unpacks into build/ and skips both builds
set -u
cd "$(dirname "$0")/.."
PACK_BINS="build/test_cuda_ops build/bench_cuda build/tern-core build/tests/test_parity_core build/concurrency \
build/tests/test_model_tp_core build/tests/test_model_tp_vocab_core build/tests/test_model_tp_offload_core \
build/tests/test_runtime_experts_core build/bench_experts build/tests/test_sample_device build/tests/test_model_g4_batch_core"
[ "${2:-}" = small ] && PACK_BINS="build/tern-core build/concurrency" # next to a peer's binaries (64 MiB carry)
# `pack ab`: what gpu_ab.sh's A/B sections need (op tests, parity, tern-core, concurrency, bench_cuda), ~16 MB beside a peer's
[ "${2:-}" = ab ] && PACK_BINS="build/tern-core build/concurrency build/test_cuda_ops build/tests/test_parity_core build/bench_cuda \
build/tests/test_model_g4_batch_core"
# `pack serve`: the full tern (serve) and the HTTP load generator for scripts/gpu_glm5_serve.sh (carry .gpudeps too)
[ "${2:-}" = serve ] && PACK_BINS="build/tern build/load build/tern-core build/concurrency"
if [ "${1:-}" = pack ]; then
    # a fresh checkout: the Debian headers (scripts/setup.sh) and .gpudeps/ (the device's copies of those libraries,
    # scripts/gpu_deps.sh) first, before minutes of nvcc end in a missing header
    if [ ! -f /usr/include/cjson/cJSON.h ]; then echo "pack: no cJSON headers: run scripts/setup.sh first"; exit 1; fi
    if [ ! -d .gpudeps/root ]; then
        echo "pack: no .gpudeps/ (the libraries the device lacks): running scripts/gpu_deps.sh"
        bash scripts/gpu_deps.sh > /dev/null 2>&1 && [ -d .gpudeps/root ] || { echo "pack: scripts/gpu_deps.sh failed"; exit 1; }
    fi
    T="gpu-test core build/concurrency build/bench_experts build/tests/test_sample_device"
    [ "${2:-}" = serve ] && T="build/tern build/load core build/concurrency"
    make -j"$(nproc)" $T > /dev/null || { echo "pack: build failed"; exit 1; }
    P="${GPU_PACK_DIR:-build/gpu_prebuilt}" # GPU_PACK_DIR: another folder (two people packing at once)
    rm -rf "$P" && mkdir -p "$P/stage"
    for b in $PACK_BINS; do mkdir -p "$P/stage/$(dirname "$b")" && strip -o "$P/stage/$b" "$b"; done
    if [ -n "${GPU_PACK_BASE:-}" ]; then
        mkdir -p "$P/stage/build/base" && strip -o "$P/stage/build/base/tern-core" "$GPU_PACK_BASE" &&
            chmod +x "$P/stage/build/base/tern-core" || { echo "pack: cannot add $GPU_PACK_BASE"; exit 1; }
    fi
    if [ -n "${GPU_PACK_BASE_CONC:-}" ]; then # the same tree's build/concurrency (gpu_ab.sh conc_ab's BIN=build/base/concurrency)
        mkdir -p "$P/stage/build/base" && strip -o "$P/stage/build/base/concurrency" "$GPU_PACK_BASE_CONC" &&
            chmod +x "$P/stage/build/base/concurrency" || { echo "pack: cannot add $GPU_PACK_BASE_CONC"; exit 1; }
    fi
    if [ -n "${GPU_PACK_ALT:-}" ]; then # a third tern-core (build/alt/tern-core): two steps of a change against the base
        mkdir -p "$P/stage/build/alt" && strip -o "$P/stage/build/alt/tern-core" "$GPU_PACK_ALT" &&
            chmod +x "$P/stage/build/alt/tern-core" || { echo "pack: cannot add $GPU_PACK_ALT"; exit 1; }
    fi
    XZ_OPT="--lzma2=preset=1,dict=512MiB -T1" tar cJf "$P/bin.tar.xz" -C "$P/stage" build && rm -rf "$P/stage"
    ls -la "$P/bin.tar.xz"
    exit 0
fi
if [ -d .gpudeps/root ]; then # the carried Debian libraries (cJSON, ...) for tern-core and the parity tests
    export LD_LIBRARY_PATH="$PWD/.gpudeps/root/usr/lib/x86_64-linux-gnu:$PWD/.gpudeps/root/gnutls${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
PREBUILT=0
if [ -n "${GPU_PREBUILT:-}" ]; then
    tar xJf "$GPU_PREBUILT" || { echo "cannot unpack $GPU_PREBUILT"; exit 1; }
    PREBUILT=1
fi
OUT="${OUT:-build/gpu_check}"
mkdir -p "$OUT"
S="$OUT/summary.txt"
: > "$S"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader 2>&1
  nvcc --version 2>&1 | tail -1; } > "$OUT/env.txt"
stamp "gpu: $(head -1 "$OUT/env.txt")"

jobs=$(nproc 2>/dev/null || echo 4)
if [ $PREBUILT = 1 ]; then
    echo "prebuilt binaries from $GPU_PREBUILT" > "$OUT/build.log"
elif ! timeout 300 make -j"$jobs" gpu-test > "$OUT/build.log" 2>&1; then
    stamp "BUILD FAILED (tail of build.log follows)"
    tail -40 "$OUT/build.log"
    exit 1
fi
stamp "build ok ($(grep -c -E 'warning' "$OUT/build.log") warnings)"

# GPU_OPS_ONLY=a,b: only the op tests whose names contain a part (TERN_TEST_ONLY for test_cuda_ops alone; an exported
# TERN_TEST_ONLY would also filter the RUN() tests of the parity and offload programs below: session 25 lost three)
if [ -n "${TERN_TEST_ONLY:-}" ]; then stamp "TERN_TEST_ONLY=$TERN_TEST_ONLY filters the op tests only (GPU_OPS_ONLY says so)"; fi
TERN_TEST_ONLY="${GPU_OPS_ONLY:-${TERN_TEST_ONLY:-}}" timeout 420 ./build/test_cuda_ops > "$OUT/test.log" 2>&1
trc=$?
unset TERN_TEST_ONLY # the model checks below always run whole
p=$(grep -c '^PASS: ' "$OUT/test.log"); f=$(grep -c '^FAIL: ' "$OUT/test.log"); s=$(grep -c '^SKIP: ' "$OUT/test.log")
stamp "op tests: $p passed, $f failed, $s skipped (exit $trc)"
grep -E '^(FAIL|SKIP): |check failed' "$OUT/test.log" | head -30 | tee -a "$S"
# the slowest op tests (those of 2 s or more print their time): where the call's minutes go
stamp "slowest op tests: $(grep -E '^(PASS|FAIL): .*\([0-9.]+ s\)$' "$OUT/test.log" | sed -E 's/^[A-Z]+: ([^ ]+) \(([0-9.]+) s\)$/\2 \1/' |
    sort -rn | head -6 | awk '{printf "%s %s s; ", $2, $1}')"
# worst error per format family, for the report
awk '/^  err /{k=$2" "$3" "$4; v=$NF+0; if(!(k in m)||v>m[k])m[k]=v} END{for(k in m)printf "  max err %-28s %.2e\n",k,m[k]}' \
    "$OUT/test.log" | sort | tee -a "$S" > /dev/null

# GPU_CHECK_EXTRA="cmd1;cmd2": extra commands after the op tests (each logged to extra_N.log, summary gets its tail)
if [ -n "${GPU_CHECK_EXTRA:-}" ]; then
    i=0
    IFS=';' read -ra xs <<< "$GPU_CHECK_EXTRA"
    for x in "${xs[@]}"; do
        i=$((i + 1))
        timeout 120 bash -c "$x" > "$OUT/extra_$i.log" 2>&1
        stamp "extra $i ($x) exit $?"
        grep -E '^(FAIL|csv)|passed|failed' "$OUT/extra_$i.log" | tail -12 | tee -a "$S" > /dev/null
    done
fi
if [ "${GPU_BENCH_KERNELS:-1}" = 1 ]; then
    timeout 200 ./build/bench_cuda > "$OUT/bench.log" 2>&1
    stamp "bench_cuda exit $?"
    grep -v '^csv,' "$OUT/bench.log" >> "$S"
fi
for b in bench/gpu_*.sh; do   # GPU_BENCH_SCRIPTS=1: also every bench/gpu_*.sh (gpu_table.sh: ~2 min)
    [ -x "$b" ] && [ "${GPU_BENCH_SCRIPTS:-0}" = 1 ] || continue
    timeout 120 "$b" > "$OUT/$(basename "$b" .sh).log" 2>&1
    stamp "$b exit $?"
done

# whole models on the GPU: build the core CLI + parity test with a carried libcjson (.gpudeps, made
# here with `apt-get download libcjson1 libcjson-dev` + dpkg -x; pass `carry: [".gpudeps"]`)
if [ -d .gpudeps/root ]; then
    export CPATH="$PWD/.gpudeps/root/usr/include" LIBRARY_PATH="$PWD/.gpudeps/root/usr/lib/x86_64-linux-gnu"
    export LD_LIBRARY_PATH="$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ $PREBUILT = 1 ] || rm -f build/libtern_core.a  # its member list depends on the Makefile
    if [ $PREBUILT = 1 ] || timeout 300 make -j"$jobs" core > "$OUT/core_build.log" 2>&1; then
        stamp "core build ok"
        for comp in f32 bf16 bf16x2 int8; do   # int8: the fixtures' int8 pass + the synthetic bound (GPU int8 mode)
            TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$comp timeout 120 ./build/tests/test_parity_core > "$OUT/parity_$comp.log" 2>&1
            stamp "model parity on cuda ($comp): $(grep -c '^PASS' "$OUT/parity_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity_$comp.log") failed"
            grep -E '^FAIL|check failed|worst row' "$OUT/parity_$comp.log" | head -30 >> "$S"
        done
        # expert offload on one GPU: logits and ids bitwise those of the resident model
        TERN_TEST_DEVICE=cuda timeout 120 ./build/tests/test_runtime_experts_core > "$OUT/experts.log" 2>&1
        stamp "expert offload on cuda: $(grep -c '^PASS' "$OUT/experts.log") passed, $(grep -c '^FAIL' "$OUT/experts.log") failed"
        grep -E '^FAIL|check failed' "$OUT/experts.log" | head -8 >> "$S"
        # Gemma 4 batch decode at the real head dims (16 / 64 rows): norm_qkv_norm_rope_kv on and off against cpu f32
        TERN_TEST_DEVICE=cuda timeout 120 ./build/tests/test_model_g4_batch_core > "$OUT/g4_batch.log" 2>&1
        stamp "gemma4 batch decode on cuda: $(grep -c '^PASS' "$OUT/g4_batch.log") passed, $(grep -c '^FAIL' "$OUT/g4_batch.log") failed"
        grep -E '^FAIL|check failed|rows, bf16' "$OUT/g4_batch.log" | head -8 >> "$S"
        # compressed KV pages end to end: greedy ids on cuda vs cpu for every --kv-quant kind
        F=tests/parity/fixtures
        gen40() { timeout 30 ./build/tern-core generate "$F/$1" --ids 2,17,99,45,20,12 --max-tokens 40 --temperature 0 \
                    --ignore-eos --print-ids --kv-quant "$2" --device "$3" --compute "$4" 2>/dev/null | head -1; }
        first_diff() { python3 -c 'import sys;a,b=sys.argv[1].split(),sys.argv[2].split();n=0
for x,y in zip(a,b):
    if x!=y: break
    n+=1
print(n,len(a),len(b))' "$1" "$2" 2>/dev/null; }
        for m in llama3 gemma4_e2b_like; do
            for q in off 8 4 turbo; do
                stamp "kv-quant $q $m: cuda vs cpu greedy, first mismatch at / cpu / cuda tokens: $(first_diff \
                    "$(gen40 $m $q cpu f32)" "$(gen40 $m $q cuda f32)")"
            done
            # the long-context step class (ops.h; the split tensor-core decode attention over BF16 pages) from
            # position 23: its graphs recorded apart, the same greedy ids as the default classes
            stamp "long class from 24 keys $m bf16: default vs TERN_LONG_KEYS=24 greedy, first mismatch at / tokens: \
$(first_diff "$(gen40 $m off cuda bf16)" "$(TERN_LONG_KEYS=24 gen40 $m off cuda bf16)")"
            # the pipelined decode (runtime/generate.c, TERN_ASYNC): step t + 1 queued on step t's draw, the same ids
            for c in f32 bf16; do
                stamp "pipelined decode $m $c: TERN_ASYNC=0 vs 1 greedy, first mismatch at / tokens: \
$(first_diff "$(TERN_ASYNC=0 gen40 $m off cuda $c)" "$(TERN_ASYNC=1 gen40 $m off cuda $c)")"
            done
        done
        # GLM-5's latent cache on bf16 pages (--kv-quant bf16; glm_attn.cu): the same greedy ids as the CPU's
        for m in glm5_dense glm5_dsa; do
            stamp "kv-quant bf16 $m: cuda vs cpu greedy, first mismatch at / cpu / cuda tokens: $(first_diff \
                "$(gen40 $m bf16 cpu f32)" "$(gen40 $m bf16 cuda f32)")"
        done
        # fused batch-decode paths against the separate ops in the model (STATUS lesson 16: an op test that compares
        # after a bf16 rounding can pass while the model diverges): concurrency's greedy ids digest with each switch
        # on and off (TERN_LT_TUNE=0: the same cuBLASLt answers in both runs); the two lines must agree
        digest() { env TERN_LT_TUNE=0 "$@" timeout 90 ./build/concurrency --random llama3-1b --device cuda --compute bf16 \
                     --conc 16 --prompt 32 --gen 32 --requests 2 --system 16 2>&1 | grep 'ids digest' | head -1; }
        # device sampling in the engine (CUDA draws vs the CPU sampler) and its pipelined decode (sched.c, TERN_ASYNC:
        # seeded / stopped / cancelled requests, the same tokens on and off) on the GPU
        TERN_TEST_DEVICE=cuda timeout 120 ./build/tests/test_sample_device > "$OUT/sample_device.log" 2>&1
        stamp "engine device sampling on cuda: $(grep -c '^PASS' "$OUT/sample_device.log") passed, $(grep -c '^FAIL' \
"$OUT/sample_device.log") failed; $(grep 'steps queued ahead' "$OUT/sample_device.log" | head -1)"
        grep -E '^FAIL|check failed' "$OUT/sample_device.log" | head -8 >> "$S"
        # (the scheduler pipelines every decode step from TERN_ASYNC_ROWS = 1 rows by default; set here all the same)
        d1=$(digest TERN_ASYNC=1 TERN_ASYNC_ROWS=1); d0=$(digest TERN_ASYNC=0)
        stamp "fused-path digest TERN_ASYNC (rows 1) on / off: $([ -n "$d1" ] && [ "$d1" = "$d0" ] && echo same || echo DIFFERENT) ($d1 / $d0)"
        for sw in TERN_CUDA_QKV_ATT TERN_CUDA_ATT_O; do
            d1=$(digest $sw=1); d0=$(digest $sw=0)
            stamp "fused-path digest $sw on / off: $([ -n "$d1" ] && [ "$d1" = "$d0" ] && echo same || echo DIFFERENT) ($d1 / $d0)"
        done
        : > "$OUT/model_bench.log"
        # spec: model:quant[:compute[:VAR=V,VAR=V]]  (compute f32|bf16, default f32; env for that run only)
        for spec in ${GPU_BENCH_MODELS-llama3-8b:bf16 llama3-8b:q4 gemma4-e4b:q4 gemma4-12b:bf16 gemma4-26b-a4b:q4}; do
            IFS=: read -r m q comp envs <<< "$spec"
            echo "== $spec" >> "$OUT/model_bench.log"
            env ${envs//,/ } timeout 150 ./build/tern-core bench --device cuda --random "$m" --quant "$q" \
                --compute "${comp:-f32}" --prompt 512 --gen 64 --reps "${GPU_BENCH_REPS:-2}" >> "$OUT/model_bench.log" 2>&1
            stamp "bench $spec exit $?: $(grep '^csv,' "$OUT/model_bench.log" | tail -1)"
        done
        for spec in ${GPU_BENCH_NOGRAPH:-}; do
            m=${spec%%:*}; q=${spec##*:}
            echo "== $m $q TERN_GRAPHS=0" >> "$OUT/model_bench.log"
            TERN_GRAPHS=0 timeout 150 ./build/tern-core bench --device cuda --random "$m" --quant "$q" --prompt 512 --gen 64 \
                --reps "${GPU_BENCH_REPS:-2}" >> "$OUT/model_bench.log" 2>&1
            stamp "bench $m $q (no graphs) exit $?: $(grep '^csv,' "$OUT/model_bench.log" | tail -1)"
        done
    else
        stamp "CORE BUILD FAILED"; tail -30 "$OUT/core_build.log"
    fi
fi

if [ "${GPU_CHECK_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
    timeout 100 compute-sanitizer --tool memcheck --print-limit 20 ./build/test_cuda_ops > "$OUT/memcheck.log" 2>&1
    stamp "memcheck exit $? ($(grep -c -E 'Invalid|ERROR SUMMARY: [1-9]' "$OUT/memcheck.log") error lines)"
    grep -E 'ERROR SUMMARY|Invalid' "$OUT/memcheck.log" | head -10 | tee -a "$S"
fi

echo "================ summary ================"
cat "$S"
[ "$trc" -eq 0 ]
