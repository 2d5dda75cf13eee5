#!/usr/bin/env bash
# tests/fuzz/build.sh — build the libFuzzer targets (clang -fsanitize=fuzzer,address,undefined)
# and run each for a while. Not part of the normal suite: without "run" it only prints a SKIP
# line (tests/run.sh executes every tests/*/*.sh).
#   bash tests/fuzz/build.sh run [SECONDS_PER_TARGET] [TARGET...]
# New crashes land in build/fuzz/artifacts/; minimise them (-minimize_crash=1), fix the bug,
# and copy the small input into tests/fuzz/corpus/<target>/ so regress.sh replays it forever.
set -u
cd "$(dirname "$0")/../.."
if [ "${1:-}" != "run" ]; then
    echo "SKIP: fuzz: run 'bash tests/fuzz/build.sh run [seconds]' to fuzz"
    exit 0
fi
secs="${2:-120}"
shift; shift || true
. tests/fuzz/targets.inc
targets="${*:-$FUZZ_TARGETS}"
command -v clang >/dev/null || { echo "SKIP: fuzz: clang not found"; exit 0; }
out=build/fuzz
mkdir -p "$out/artifacts"
for t in $targets; do
    srcs "$t"
    fuzz_cc clang "-g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -fsanitize=fuzzer,address,undefined
        -fno-sanitize=alignment -fno-sanitize-recover=undefined" "$out/$t" "tests/fuzz/$t.c" $SRC ||
        { echo "FAIL: build $t"; exit 1; }
    mkdir -p "$out/corpus_$t"
    cp -n tests/fuzz/corpus/$t/* "$out/corpus_$t/" 2>/dev/null || true
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    echo "== $t for ${secs}s"
    "$out/$t" "$out/corpus_$t" $dict -max_total_time="$secs" -timeout=10 -max_len=65536 -rss_limit_mb=2048 \
        -artifact_prefix="$out/artifacts/$t-" -print_final_stats=1 2>&1 | tail -25
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then echo "PASS: fuzz $t"; else echo "FAIL: fuzz $t (exit $rc, see $out/artifacts)"; fi
done
