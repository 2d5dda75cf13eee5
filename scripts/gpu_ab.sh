#!/usr/bin/env bash
# scripts/gpu_ab.sh — the A/Bs of switches written without a GPU, in one device call (~5 min).
#
# Each switch below was committed opt-in and op-tested in code only; this runs its test and times
# it against the default, interleaved (A, B, A, B) so the H200's drift cancels. Run after
# `scripts/gpu_check.sh` has unpacked the prebuilt binaries (GPU_PREBUILT) and passed the op tests:
#   OUT=/tmp/ab bash scripts/gpu_ab.sh      # logs + summary.txt under $OUT
# Switches (docs/CUDA.md): TERN_CUDA_G1_GRID=1 (gemv1's persistent grid) crossed with TERN_CUDA_NORM_FUSE
# (the pre-norm inside the one-row GEMV). Make a switch the default only when it wins here and in the
# model runs.
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

# 1. batch-1 decode: gemv1's grid x the fused pre-norm (bf16 llama3-8b and gemma4-12b, q8 llama3-8b)
for rep in 1 2; do
    for spec in "llama3-8b" "gemma4-12b" "llama3-8b --quant q8 --group 64"; do
        for cfg in "0 0" "0 1" "1 0" "1 1"; do
            set -- $cfg
            tag="$(echo "$spec" | tr -d ' -')_g$1_n$2_$rep"
            TERN_CUDA_G1_GRID=$1 TERN_CUDA_NORM_FUSE=$2 timeout 60 $T bench --random $spec --device cuda --prompt 512 \
                --gen 64 --reps 1 > "$OUT/b1_$tag.txt" 2>&1
            say "b1 $spec grid=$1 normfuse=$2 rep $rep: $(grep '^csv,' "$OUT/b1_$tag.txt" | cut -d, -f7,10 | tail -1)"
        done
    done
done

echo "summary: $S"
