#!/usr/bin/env bash
# scripts/gpu_ab.sh — the A/Bs of switches written without a GPU, in one device call (~7 min).
#
# Each switch below was committed opt-in and op-tested in code only; this runs its test and times
# it against the default, interleaved (A, B, A, B) so the H200's drift cancels. Run after
# `scripts/gpu_check.sh` has unpacked the prebuilt binaries (GPU_PREBUILT) and passed the op tests:
#   OUT=/tmp/ab bash scripts/gpu_ab.sh      # logs + summary.txt under $OUT
# Switches (docs/CUDA.md), written in session 10 without a GPU and timed here in session 11 (bench/NOTES.md
# (t)): TERN_CUDA_NORM_N=1 (Gemma 4's q, k, v head norms in one launch; still off), TERN_CUDA_NORM_ROPE
# (those norms inside the rope + cache-store launch; now default), TERN_CUDA_NORM_RES (Gemma 4's post-norm
# residual adds folded into the next one-row GEMV; now default for gemv1, =1 also gemv_mma) and
# TERN_CUDA_NORM_GEMM (the pre-norm and the bf16 x of the many-row GEMMs in one kernel; =2 default: from
# 32 rows). Every value below is set explicitly, so the runs still compare all-off against each switch.
# Keep this script as the template for the next opt-in switches: make one the default only when it wins
# here and in the model runs. Section 3 (TERN_CUDA_AD_CLUSTER) is session 11's, not yet run.
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

# 0. the switches' parity first (f32 and bf16: greedy ids and logits against the fixtures, gemma4 variants)
for comp in f32 bf16; do
    TERN_CUDA_NORM_N=1 TERN_CUDA_NORM_RES=1 TERN_CUDA_NORM_GEMM=1 TERN_CUDA_NORM_ROPE=1 TERN_TEST_DEVICE=cuda \
        TERN_TEST_COMPUTE=$comp \
        timeout 120 build/tests/test_parity_core > "$OUT/parity_switches_$comp.log" 2>&1
    say "parity ($comp) with NORM_N, NORM_RES, NORM_GEMM, NORM_ROPE on: $(grep -c '^PASS' "$OUT/parity_switches_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity_switches_$comp.log") failed"
done

# 1. Gemma 4: head norms in one launch (NORM_N), post-norm adds folded into the next GEMV (NORM_RES);
#    batch-1 decode of gemma4-12b and e4b (bf16)
for rep in 1 2; do
    for spec in gemma4-12b gemma4-e4b; do
        for cfg in "0 0 0" "1 0 0" "0 0 1" "0 1 0" "0 1 1"; do
            set -- $cfg
            TERN_CUDA_NORM_N=$1 TERN_CUDA_NORM_RES=$2 TERN_CUDA_NORM_ROPE=$3 timeout 60 $T bench --random $spec \
                --device cuda --prompt 512 --gen 64 --reps 1 > "$OUT/normn_${spec}_$1$2$3_$rep.txt" 2>&1
            say "b1 $spec NORM_N=$1 NORM_RES=$2 NORM_ROPE=$3 rep $rep: $(grep '^csv,' "$OUT/normn_${spec}_$1$2$3_$rep.txt" | cut -d, -f7,10 | tail -1)"
        done
    done
done

# 2. pre-norm + bf16 staging in one kernel for many rows: batch decode (dec tok/s at 16 and 64 sequences)
for rep in 1 2; do
    for v in 0 1; do
        TERN_CUDA_NORM_GEMM=$v timeout 60 build/concurrency --random llama3-8b --device cuda --conc 16,64 --prompt 128 \
            --gen 128 --requests 2 --system 16 > "$OUT/normgemm_${v}_$rep.txt" 2>&1
        say "concurrency NORM_GEMM=$v rep $rep: $(grep '^csv,conc' "$OUT/normgemm_${v}_$rep.txt" | cut -d, -f5,9 | tr '\n' ' ')"
    done
done

# 3. decode attention: a row's splits as one thread-block cluster merged in shared memory
#    (TERN_CUDA_AD_CLUSTER=N, written in session 11 without a GPU; op test cuda_attention_decode_cluster_bits)
for rep in 1 2; do
    for v in 0 8 16; do
        TERN_CUDA_AD_CLUSTER=$v timeout 60 build/bench_cuda --attn-dec1 512 1 bf16 1 > "$OUT/adcl_k_${v}_$rep.txt" 2>&1
        say "attn-dec1 512 keys AD_CLUSTER=$v rep $rep: $(grep '^csv' "$OUT/adcl_k_${v}_$rep.txt" | cut -d, -f2,3 | tail -1)"
        for m in "llama3-8b" "llama3-8b --quant q4"; do
            TERN_CUDA_AD_CLUSTER=$v timeout 60 $T bench --random $m --device cuda --prompt 512 --gen 64 --reps 1 \
                > "$OUT/adcl_${v}_$rep.txt" 2>&1
            say "b1 $m AD_CLUSTER=$v rep $rep: $(grep '^csv,' "$OUT/adcl_${v}_$rep.txt" | cut -d, -f7,10 | tail -1)"
        done
    done
done

echo "summary: $S"
