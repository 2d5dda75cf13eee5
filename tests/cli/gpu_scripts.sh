#!/usr/bin/env bash
# gpu_scripts.sh — the device-machine scripts checked here, where a mistake costs nothing: every GPU script parses
# (bash -n), and scripts/ncu_step.py sums the right step of a synthetic ncu CSV (the last step of the whole batch,
# not a one-row tail; a step ends with its sampling kernel). Device time is scarce: a script that fails there wastes
# a call.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; }

for f in scripts/gpu_ab.sh scripts/gpu_check.sh scripts/gpu_deps.sh bench/gpu_table.sh; do
    if [ -f "$f" ]; then bash -n "$f" 2> "$tmp/err" && ok "parses: $f" || bad "parses: $f: $(head -c 300 "$tmp/err")"; fi
done

if ! command -v python3 > /dev/null; then
    echo "SKIP: ncu_step: no python3"
    exit 0
fi
# ncu's CSV: a header row starting with "ID", then one row a kernel and metric (name in column 4, grid in 8, the
# value in 14). Three steps: two of 4 rows (gemm 10 us, sample), then a one-row tail (gemm 1 us, sample)
{
    echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    id=0
    row() { echo "\"$id\",\"1\",\"c\",\"h\",\"$1\",\"1\",\"7\",\"(256, 1, 1)\",\"$2\",\"0\",\"9.0\",\"s\",\"gpu__time_duration.sum\",\"ns\",\"$3\""; id=$((id + 1)); }
    row "embed_kernel" "(4, 1, 1)" "1,000"
    for s in 1 2; do row "gemm_kernel(Args)" "(32, 1, 1)" "10,000"; row "sample_kernel(int *)" "(4, 1, 1)" "2,000"; done
    row "gemm_kernel(Args)" "(32, 1, 1)" "1,000"; row "sample_kernel(int *)" "(1, 1, 1)" "2,000"
} > "$tmp/ncu.csv"
out=$(python3 scripts/ncu_step.py "$tmp/ncu.csv" 2>&1)
if echo "$out" | head -1 | grep -q "^2 kernels, 12.0 us" && echo "$out" | grep -q "10.00.*gemm_kernel (32, 1, 1)"; then
    ok "ncu_step: the last step of the widest sampling grid"
else
    bad "ncu_step: $(echo "$out" | head -3 | tr '\n' ' ')"
fi
out=$(python3 scripts/ncu_step.py "$tmp/ncu.csv" --from gemm_kernel 2>&1)
echo "$out" | head -1 | grep -q "^6 kernels, 27.0 us" && ok "ncu_step --from" || bad "ncu_step --from: $(echo "$out" | head -2 | tr '\n' ' ')"
