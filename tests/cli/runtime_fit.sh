#!/usr/bin/env bash
# runtime_fit.sh — `tern fit`: exit codes, the numbers it prints for the demo (whose KV per
# token is known: 1 full + 3 sliding layers), a random preset, and a budget verdict.
set -u
cd "$(dirname "$0")/../.."
T=build/tern
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TERN_CACHE="$tmp/cache"
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; }
[ -x "$T" ] || { echo "SKIP: fit (build/tern absent)"; exit 0; }

$T fit demo --ctx 1024 --max-concurrency 4 --memory-budget 1 >"$tmp/out" 2>"$tmp/err"
rc=$?
csv=$(grep '^csv,' "$tmp/out")
# csv,name,spec,ctx,conc,weights,kv_full_tok,kv_sliding_tok,kv_seq,kv_total,scratch,total,budget,fits,max_ctx,max_conc
IFS=, read -r _ name spec ctx conc w kf ks seq tot scr all bud fits mctx mconc <<<"$csv"
# blocks of 16 tokens: full layers 1024 tokens per sequence; sliding layers (window 32: wb = 2 + 1 blocks) one
# sequence min(64, wb + 32) blocks (512-row CPU chunk), 4 sequences min(4 x that, 4 x (wb + 1) + 32)
win=$(sed -n 's/.*(window \([0-9]*\)).*/\1/p' "$tmp/out"); wb=$(( (${win:-0} + 15) / 16 + 1 ))
one=$(( wb + 32 < 64 ? wb + 32 : 64 )); four=$(( 4 * (wb + 1) + 32 < 4 * one ? 4 * (wb + 1) + 32 : 4 * one ))
if [ $rc -eq 0 ] && [ "$ctx" = 1024 ] && [ "$conc" = 4 ] && [ "$fits" = 1 ] && [ "$w" -gt 0 ] && [ "$kf" -gt 0 ] &&
   [ "$ks" = $((3 * kf / 2)) ] && [ "$win" = 32 ] && [ "$seq" = $((1024 * kf + one * 16 * ks)) ] &&
   [ "$tot" = $((4 * 1024 * kf + four * 16 * ks)) ] && [ "$tot" -lt $((4 * seq)) ]; then ok fit_demo
else bad "fit_demo (rc $rc): $csv $(head -c 300 "$tmp/err")"; fi
grep -q "sliding" "$tmp/out" && grep -q "turbo" "$tmp/out" && grep -q "max safe context" "$tmp/out" && ok fit_demo_table || bad fit_demo_table

$T fit --random qwen3-0.6b --ctx 8192 --max-concurrency 8 --memory-budget 4 >"$tmp/out" 2>"$tmp/err"
csv=$(grep '^csv,' "$tmp/out")
IFS=, read -r _ name spec ctx conc w kf ks seq tot scr all bud fits mctx mconc <<<"$csv"
# 28 layers x 8 kv heads x 128 x 2 (K, V) x 4 bytes = 229376 bytes per token in f32 pages
if [ "$kf" = 229376 ] && [ "$fits" = 0 ] && [ "$mctx" -gt 0 ] && [ "$mctx" -lt 8192 ] && [ "$mconc" -ge 1 ]; then ok fit_random_budget
else bad "fit_random_budget: $csv"; fi

$T fit demo --kv-quant 4 >"$tmp/out" 2>&1 && grep -q "selected KV mode   4" "$tmp/out" && ok fit_kv_quant || bad "fit_kv_quant: $(head -c 300 "$tmp/out")"
$T fit demo --memory-budget -3 >/dev/null 2>"$tmp/err"; [ $? -eq 2 ] && ok fit_bad_budget || bad fit_bad_budget
$T fit "$tmp/none" >/dev/null 2>"$tmp/err"; [ $? -eq 2 ] && grep -q none "$tmp/err" && ok fit_missing_model || bad "fit_missing_model: $(cat "$tmp/err")"
# planning for a GPU (--device cuda, no GPU needed): BF16 pages (half of f32's 229376 B/token) and
# 8192 rows per step, the engine's defaults on a GPU of 70+ GiB or none here to ask (2048 on smaller ones);
# --compute bf16x2 keeps F32 pages
$T fit --random qwen3-0.6b --ctx 4096 --device cuda >"$tmp/out" 2>&1
kf=$(grep '^csv,' "$tmp/out" | cut -d, -f7)
rows=$(grep -o '[0-9]* rows per step' "$tmp/out" | cut -d' ' -f1)
{ [ "$rows" = 8192 ] || { [ "$rows" = 2048 ] && command -v nvidia-smi >/dev/null; }; } && [ "$kf" = 114688 ] &&
    ok fit_gpu_defaults || bad "fit_gpu_defaults: $kf $(grep -i 'rows per step' "$tmp/out")"
$T fit --random qwen3-0.6b --ctx 4096 --device cuda --compute bf16x2 >"$tmp/out" 2>&1
kf=$(grep '^csv,' "$tmp/out" | cut -d, -f7)
[ "$kf" = 229376 ] && ok fit_gpu_bf16x2_f32_pages || bad "fit_gpu_bf16x2_f32_pages: $kf"
# a GPU plan counts the CUDA backend's own buffers in the total: GEMM scratch following the rows per step (256 MB a
# 2048 rows, at least 256; TERN_CUDA_SCRATCH_MB sets it), cuBLASLt workspace 32 MB, split-K partials 32 MB; a CPU
# plan does not. Without CUDA in the build: no such line.
$T fit --random qwen3-0.6b --ctx 4096 --device cuda --max-batch-tokens 2048 >"$tmp/out" 2>&1
TERN_CUDA_SCRATCH_MB=1024 $T fit --random qwen3-0.6b --ctx 4096 --device cuda --max-batch-tokens 2048 >"$tmp/out2" 2>&1
$T fit --random qwen3-0.6b --ctx 4096 >"$tmp/out3" 2>&1
$T fit --random qwen3-0.6b --ctx 4096 --device cuda --max-batch-tokens 8192 >"$tmp/out4" 2>&1
$T fit --random qwen3-0.6b --ctx 4096 --device cuda --max-batch-tokens 4096 >"$tmp/out5" 2>&1
if grep -q "device buffers" "$tmp/out"; then
    grep -q "device buffers          0.312 GB" "$tmp/out" && grep -q "device buffers          1.062 GB" "$tmp/out2" &&
        ! grep -q "device buffers" "$tmp/out3" && grep -q "device buffers          1.062 GB" "$tmp/out4" &&
        grep -q "device buffers          0.562 GB" "$tmp/out5" && ok fit_gpu_device_buffers ||
        bad "fit_gpu_device_buffers: $(grep 'device buffers' "$tmp/out" "$tmp/out2" "$tmp/out3" "$tmp/out4" "$tmp/out5")"
else
    ok fit_gpu_device_buffers_nocuda # a build without CUDA plans no device buffers
fi
# ... and the CUDA context (measured on an H200: ops.h tern_backend_cuda_context_bytes), in the total: weights + KV +
# scratch + buffers + context; a CPU plan has no such line
if grep -q "device buffers" "$tmp/out"; then
    sum=$(awk '/^weights |^KV total |^prefill scratch |^device buffers |^CUDA context / { for (i = 1; i <= NF; i++) if ($(i + 1) == "GB") { s += $i; break } }
               /^total / { t = $2 } END { d = s - t; if (d < 0) d = -d; print (d < 0.003 ? "ok" : s " vs " t) }' "$tmp/out")
    grep -q "CUDA context            0.527 GB" "$tmp/out" && ! grep -q "CUDA context" "$tmp/out3" && [ "$sum" = ok ] &&
        ok fit_gpu_context || bad "fit_gpu_context: $sum $(grep 'CUDA context' "$tmp/out" "$tmp/out3")"
fi
