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
targets="${*:-fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_jinja fuzz_request}"
command -v clang >/dev/null || { echo "SKIP: fuzz: clang not found"; exit 0; }
out=build/fuzz
mkdir -p "$out/artifacts"
BASE="src/base/base.c src/base/file.c src/base/json.c"
# srcs TARGET: the sources and libraries a target links (SRC, LIBS)
srcs() {
    case "$1" in
        fuzz_jinja) SRC="src/text/jinja_*.c $BASE" LIBS="-lcjson -lutf8proc -lm" ;;
        fuzz_tokenizer) SRC="src/text/tokenizer*.c src/text/normalize.c src/text/pretok.c $BASE"
                        LIBS="-lcjson -lpcre2-8 -lutf8proc -lm" ;;
        fuzz_request) SRC="src/server/params.c src/server/jsonfsm.c src/text/tokenizer*.c src/text/normalize.c src/text/pretok.c $BASE"
                      LIBS="-lcjson -lpcre2-8 -lutf8proc -lm" ;;
        *) SRC="src/io/safetensors.c src/io/config.c src/io/config_quant.c src/io/config_glm.c $BASE src/ops/tensor.c"
           LIBS="-lcjson -lm" ;;
    esac
}
for t in $targets; do
    srcs "$t"
    clang -g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -fsanitize=fuzzer,address,undefined \
        -fno-sanitize=alignment -fno-sanitize-recover=undefined \
        "tests/fuzz/$t.c" $SRC -o "$out/$t" $LIBS || { echo "FAIL: build $t"; exit 1; }
    mkdir -p "$out/corpus_$t"
    cp -n tests/fuzz/corpus/$t/* "$out/corpus_$t/" 2>/dev/null || true
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    echo "== $t for ${secs}s"
    "$out/$t" "$out/corpus_$t" $dict -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
        -artifact_prefix="$out/artifacts/$t-" -print_final_stats=1 2>&1 | tail -25
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then echo "PASS: fuzz $t"; else echo "FAIL: fuzz $t (exit $rc, see $out/artifacts)"; fi
done
