#!/usr/bin/env bash
# glm5_serve_script.sh — scripts/gpu_glm5_serve.sh (issue 9's one-call measurement on 8 GPUs) on the CPU at a
# reduced size: a random glm5-tiny over 2 CPU ranks served by `tern serve --gpus 2`, decode at concurrency 1 and 2 and
# one prefill through HTTP (build/load). Keeps the script's plumbing (fit, ready time, load tables, prefill rate,
# memory samples) working until an 8-GPU machine runs it for real.
set -u
cd "$(dirname "$0")/../.."
[ -x build/tern ] && [ -x build/load ] || { echo "SKIP: glm5_serve_script (build/tern or build/load absent)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MODEL=random:glm5-tiny:q4 GPUS=2 DEVICE=cpu CONC=1,2 PROMPT=16 GEN=4 REQUESTS=4 PREFILL=64 MAXCTX=128 BUDGET=0 \
    OUT="$tmp" timeout 120 bash scripts/gpu_glm5_serve.sh > "$tmp/log" 2>&1
rc=$?
S="$tmp/summary.txt"
if [ $rc = 0 ] && grep -q 'server ready in' "$S" && grep -q 'ready: engine opened' "$S"; then echo "PASS: glm5_serve_ready"
else echo "FAIL: glm5_serve_ready (exit $rc): $(tail -5 "$tmp/log" | tr '\n' ' ')"; fi
rows=$(awk '$1 == "server" && ($2 == 1 || $2 == 2) && $3 == 4 && $9 == "0.0%" && $8 > 0' "$S" | wc -l)
[ "$rows" = 2 ] && echo "PASS: glm5_serve_decode" || echo "FAIL: glm5_serve_decode: $(grep -A3 'decode:' "$S" | tr '\n' ' ')"
pre=$(awk -F, '$1 == 64 {print $3}' "$tmp/prefill.csv" 2>/dev/null)
[ -n "$pre" ] && awk -v v="$pre" 'BEGIN { exit !(v > 0) }' && echo "PASS: glm5_serve_prefill" ||
    echo "FAIL: glm5_serve_prefill: $(cat "$tmp/prefill.csv" 2>/dev/null | tr '\n' ' ')"
grep -Eq '^  cpu [0-9]+' "$S" && echo "PASS: glm5_serve_memory" || echo "FAIL: glm5_serve_memory: $(tail -3 "$S" | tr '\n' ' ')"
