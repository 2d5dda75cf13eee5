#!/usr/bin/env bash
# scripts/gpu_ab.sh — the A/Bs of switches written without a GPU, in one device call (~5 min).
#
# Each switch below was committed opt-in and op-tested in code only; this runs its test and times
# it against the default, interleaved (A, B, A, B) so the H200's drift cancels. Run after
# `scripts/gpu_check.sh` has unpacked the prebuilt binaries (GPU_PREBUILT) and passed the op tests:
#   OUT=/tmp/ab bash scripts/gpu_ab.sh      # logs + summary.txt under $OUT
# Switches (docs/CUDA.md): TERN_CUDA_SGEMM_CFG=1 (sgemm.cu 8 warps x 256 rows), TERN_CUDA_SGEMM=2 (sgemm
# for every fused op), TERN_CUDA_G1_PIPE=1 (gemv1's pipelined walk), TERN_EXPERTS_PREFETCH=1 with
# staging slots (experts.c). Make a switch the default only when it wins here and in the model runs.
set -u
cd "$(dirname "$0")/.."
if [ -d .gpudeps/root ]; then
    export LD_LIBRARY_PATH="$PWD/.gpudeps/root/usr/lib/x86_64-linux-gnu:$PWD/.gpudeps/root/gnutls${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
OUT="${OUT:-build/gpu_ab}"
mkdir -p "$OUT"
S="$OUT/summary.txt"
: > "$S"
T=build/tern-core
say() { echo "$*" | tee -a "$S"; }

# 1. sgemm: cuBLASLt vs 4 warps vs 8 warps per fused op and row count ("sgemm8w" rows)
timeout 150 build/bench_cuda --sgemm > "$OUT/sgemm.txt" 2>&1
say "== bench_cuda --sgemm (us): op n cublaslt / sgemm / sgemm8w"
grep '^csv,fused' "$OUT/sgemm.txt" | awk -F, '{split($2, a, " n="); split(a[2], b, " "); k = a[1] " n=" b[1];
    v[k] = v[k] sprintf(" %8.1f", $3)} END {for (k in v) print k v[k]}' | sort | tee -a "$S"

# 2. batch decode, whole model: sgemm levels and shapes (dec tok/s at 16 and 64 sequences)
for rep in 1 2; do
    for cfg in "1 0" "2 0" "1 1" "2 1"; do
        set -- $cfg
        TERN_CUDA_SGEMM=$1 TERN_CUDA_SGEMM_CFG=$2 timeout 60 build/concurrency --random llama3-8b --device cuda \
            --conc 16,64 --prompt 128 --gen 128 --requests 2 --system 16 > "$OUT/conc_$1_$2_$rep.txt" 2>&1
        say "concurrency sgemm=$1 cfg=$2 rep $rep: $(grep '^csv,conc' "$OUT/conc_$1_$2_$rep.txt" | cut -d, -f5,9 | tr '\n' ' ')"
    done
done

# 3. batch-1 decode: gemv1's pipelined walk (llama3-8b bf16: q|k|v, o, down, gate|up at n = 1)
for rep in 1 2; do
    for p in 0 1; do
        TERN_CUDA_G1_PIPE=$p timeout 60 $T bench --random llama3-8b --device cuda --prompt 512 --gen 64 --reps 1 \
            > "$OUT/g1_${p}_$rep.txt" 2>&1
        say "bench llama3-8b b1 G1_PIPE=$p rep $rep: $(grep '^csv,' "$OUT/g1_${p}_$rep.txt" | cut -d, -f7,10 | tail -1)"
    done
done

# 4. expert prefetch with staging slots (copy engine beside the kernels): off / on per resident share
timeout 200 build/bench_experts --device cuda --layers 8 --tokens 32 --warmup 32 --fracs 0,25,50 --ab \
    > "$OUT/experts_ab.txt" 2>&1
say "== bench_experts --device cuda --ab (exit $?)"
grep -v '^csv' "$OUT/experts_ab.txt" | tail -12 | tee -a "$S" > /dev/null
echo "summary: $S"
