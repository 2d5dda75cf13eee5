#!/usr/bin/env bash
# tests/fuzz/regress.sh — replay every kept fuzz input (tests/fuzz/corpus/<target>/*) through
# the fuzz targets built WITHOUT libFuzzer (plain main in replay.c), with ASan/UBSan when the
# compiler supports them (fuzz_model: its harness only, linked with build/libtern.a; targets.inc).
# Prints one PASS/FAIL line per target. Fast: part of tests/run.sh.
set -u
cd "$(dirname "$0")/../.."
out=build/fuzz
mkdir -p "$out"
cc=${CC:-cc}
command -v clang >/dev/null && cc=clang
. tests/fuzz/targets.inc
SAN="-fsanitize=address,undefined -fno-sanitize=alignment -fno-sanitize-recover=undefined"
for t in $FUZZ_TARGETS; do
    srcs "$t"
    files=(tests/fuzz/corpus/$t/*)
    if [ ! -e "${files[0]}" ]; then echo "SKIP: regress $t: empty corpus"; continue; fi
    if [ "$LIBREPLAY" = 1 ]; then
        bin="$out/replay_lib_$t"
        # against the library as the suite's build made it (-o: never rebuilt here, with other make variables)
        if [ ! -f build/libtern.a ]; then echo "SKIP: regress $t: build/libtern.a not built"; continue; fi
        make -s -o build/libtern.a "$bin" >"$out/replay_$t.log" 2>&1 ||
            { echo "FAIL: regress $t: build (see $out/replay_$t.log)"; continue; }
    else
        bin="$out/replay_$t"
        flags="-g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc"
        if ! fuzz_cc "$cc" "$flags $SAN" "$bin" tests/fuzz/$t.c tests/fuzz/replay.c $SRC 2>"$out/replay_$t.log"; then
            # no sanitizer runtime here: plain build still catches crashes
            fuzz_cc "$cc" "$flags" "$bin" tests/fuzz/$t.c tests/fuzz/replay.c $SRC ||
                { echo "FAIL: regress $t: build"; continue; }
        fi
    fi
    if ASAN_OPTIONS=detect_leaks=1 "$bin" "${files[@]}"; then
        echo "PASS: regress $t (${#files[@]} inputs)"
    else
        echo "FAIL: regress $t"
    fi
done
