#!/usr/bin/env bash
# sanitize.sh — build `tern` with sanitizers and run the server tests against those builds:
#   ASan + UBSan (build/asan/tern): every tests/server/*.mjs;
#   TSan (build/tsan/tern): the concurrency-heavy ones (model_e2e: 32 concurrent clients, queue,
#   abort; abuse: 2000 bad requests on 4 connections + a good client + vanishing clients;
#   http_api: concurrent streams, disconnects; stream_writer: the SSE writer thread).
# The builds are CPU-only (no CUDA), -O1 -g, into build/asan and build/tsan (not the normal
# build). A sanitizer report makes the server exit non-zero (the tests' clean_shutdown check
# fails) and is also found in the report files, which this script prints as FAIL lines.
# Not part of the default suite: it takes minutes, so it SKIPs unless TERN_SANITIZE=1.
# Usage: TERN_SANITIZE=1 bash tests/server/sanitize.sh [asan|tsan|all]
set -u
cd "$(dirname "$0")/../.."
if [ "${TERN_SANITIZE:-0}" != 1 ]; then
    echo "SKIP: sanitize: set TERN_SANITIZE=1 to build with ASan/UBSan/TSan and run the server tests (minutes)"
    exit 0
fi
which="${1:-all}"
jobs=$(nproc 2>/dev/null || echo 2)
CC=${CC:-cc}
BASE="-O1 -g -fno-omit-frame-pointer -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -fno-strict-aliasing -w"
LIBS="-lcjson -lpcre2-8 -lmicrohttpd -lutf8proc -lpthread -lm"
AVX2="-mavx2 -mfma -mf16c"
AVX512="$AVX2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni"
nfail=0

build() {   # build KIND "SANITIZER FLAGS"
    local kind=$1 san=$2 out=build/$1
    mkdir -p "$out/obj"
    local srcs
    srcs=$(ls src/*/*.c src/*/*/*.c 2>/dev/null | grep -v '^src/backend/cuda/')
    # one object per source, compiled in parallel; SIMD files get their flags
    if ! printf '%s\n' $srcs | xargs -P "$jobs" -I{} sh -c '
            f={}; o='"$out"'/obj/$(echo "$f" | tr / _).o; extra=""
            case "$f" in *_avx512.c) extra="'"$AVX512"'";; *_avx2.c) extra="'"$AVX2"'";; esac
            '"$CC"' '"$BASE $san"' $extra -c "$f" -o "$o"' ; then
        echo "FAIL: sanitize_build_$kind: compile error"; return 1
    fi
    rm -f "$out/libtern.a" && ar rcs "$out/libtern.a" "$out"/obj/*.o
    if ! $CC $BASE $san -Itools tools/*.c "$out/libtern.a" -o "$out/tern" $LIBS; then
        echo "FAIL: sanitize_build_$kind: link error"; return 1
    fi
    echo "PASS: sanitize_build_$kind"
}

run() {     # run KIND TEST...
    local kind=$1; shift
    local logdir=build/$kind/logs
    rm -rf "$logdir" && mkdir -p "$logdir"
    for t in "$@"; do
        local name
        name=$(basename "$t" .mjs)
        echo "# $kind: $t"
        TERN_BIN="build/$kind/tern" node "$t" 2>&1 | sed "s/^\(PASS\|FAIL\|SKIP\): /\1: ${kind}_${name}_/"
    done
    local reports
    reports=$(grep -l -E 'ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:|WARNING: ThreadSanitizer' "$logdir"/* 2>/dev/null)
    if [ -n "$reports" ]; then
        for r in $reports; do
            echo "FAIL: ${kind}_report $(basename "$r"): $(grep -m1 -E 'ERROR:|runtime error:|WARNING:' "$r")"
            sed -n '1,40p' "$r" | sed 's/^/#   /'
        done
        nfail=$((nfail + 1))
    else
        echo "PASS: ${kind}_no_reports"
    fi
}

if [ "$which" = asan ] || [ "$which" = all ]; then
    if build asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined"; then
        export ASAN_OPTIONS="log_path=$PWD/build/asan/logs/asan:detect_leaks=1:abort_on_error=0"
        export UBSAN_OPTIONS="log_path=$PWD/build/asan/logs/ubsan:print_stacktrace=1:halt_on_error=1"
        run asan tests/server/*.mjs
        unset ASAN_OPTIONS UBSAN_OPTIONS
    else nfail=$((nfail + 1)); fi
fi
if [ "$which" = tsan ] || [ "$which" = all ]; then
    if build tsan "-fsanitize=thread"; then
        export TSAN_OPTIONS="log_path=$PWD/build/tsan/logs/tsan:halt_on_error=0:second_deadlock_stack=1"
        run tsan tests/server/model_e2e.mjs tests/server/abuse.mjs tests/server/http_api.mjs tests/server/stream_writer.mjs
        unset TSAN_OPTIONS
    else nfail=$((nfail + 1)); fi
fi
[ "$nfail" -eq 0 ]
