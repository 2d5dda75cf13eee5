#!/usr/bin/env bash
# tests/fuzz/regress.sh — replay every kept fuzz input (tests/fuzz/corpus/<target>/*) through
# the fuzz targets built WITHOUT libFuzzer (plain main in replay.c), with ASan/UBSan when the
# compiler supports them. Prints one PASS/FAIL line per target. Fast: part of tests/run.sh.
set -u
cd "$(dirname "$0")/../.."
out=build/fuzz
mkdir -p "$out"
cc=${CC:-cc}
command -v clang >/dev/null && cc=clang
SRC="src/io/safetensors.c src/io/config.c src/io/config_quant.c src/io/config_glm.c src/base/base.c src/base/file.c src/base/json.c src/ops/tensor.c"
SAN="-fsanitize=address,undefined -fno-sanitize=alignment -fno-sanitize-recover=undefined"
for t in fuzz_safetensors fuzz_config; do
    files=(tests/fuzz/corpus/$t/*)
    if [ ! -e "${files[0]}" ]; then echo "SKIP: regress $t: empty corpus"; continue; fi
    bin="$out/replay_$t"
    if ! $cc -g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc $SAN tests/fuzz/$t.c tests/fuzz/replay.c $SRC \
            -o "$bin" -lcjson -lm 2>"$out/replay_$t.log"; then
        # no sanitizer runtime here: plain build still catches crashes
        $cc -g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc tests/fuzz/$t.c tests/fuzz/replay.c $SRC \
            -o "$bin" -lcjson -lm || { echo "FAIL: regress $t: build"; continue; }
    fi
    if ASAN_OPTIONS=detect_leaks=1 "$bin" "${files[@]}"; then
        echo "PASS: regress $t (${#files[@]} inputs)"
    else
        echo "FAIL: regress $t"
    fi
done
