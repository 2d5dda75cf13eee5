#!/usr/bin/env bash
# tests/run.sh — run every test binary (build/tests/test_*) and every executable test
# script (tests/*/*.sh, tests/*/*.mjs run with node), count PASS/FAIL lines, and end with
# "N passed, N failed" (plus ", N skipped"). A program that exits non-zero without printing
# a FAIL line counts as one failure. Usage: tests/run.sh [filter-substring]
set -u
cd "$(dirname "$0")/.."
filter="${1:-}"
log=build/test-log.txt
mkdir -p build
: > "$log"
pass=0; fail=0; skip=0
run_one() {
    local name="$1"; shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "== $name (exit $rc)" "$out" >> "$log"
    local p f s
    p=$(printf '%s\n' "$out" | grep -c '^PASS: ' || true)
    f=$(printf '%s\n' "$out" | grep -c '^FAIL: ' || true)
    s=$(printf '%s\n' "$out" | grep -c '^SKIP: ' || true)
    printf '%s\n' "$out" | grep -E '^(FAIL|SKIP): |check failed' | sed "s|^|  [$name] |"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1; echo "  [$name] FAIL: exited with status $rc"
        printf '%s\n' "$out" | tail -5 | sed "s|^|  [$name]   |"
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    printf '%-40s %4d passed %3d failed %3d skipped\n' "$name" "$p" "$f" "$s"
}
for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *"$filter"*) ;; *) continue ;; esac
    run_one "$(basename "$t")" "$t"
done
for s in tests/*/*.sh tests/*/*.mjs; do
    [ -f "$s" ] || continue
    case "$s" in *"$filter"*) ;; *) continue ;; esac
    case "$s" in
        *.sh) run_one "$s" bash "$s" ;;
        *.mjs) run_one "$s" node "$s" ;;
    esac
done
echo "full log: $log"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
