#!/usr/bin/env bash
# scripts/gpu_runtime_bench.sh — issue 5/6 benchmarks on the GPU machine in one call: builds the
# full tern with the carried Debian libraries (.gpudeps: cJSON, PCRE2, libmicrohttpd + GnuTLS,
# utf8proc, extracted with `apt-get download` + `dpkg -x`; pass carry [".gpudeps"]), then
#   1. bench/concurrency on CUDA: throughput/latency vs concurrency + prefix-cache speed-up
#   2. bench/load.sh: the HTTP server vs the engine driven directly (server overhead)
# Logs under $OUT; a summary is printed last.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_runtime}"
mkdir -p "$OUT"
D="$PWD/.gpudeps/root"
export CPATH="$D/usr/include" LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu:$D/gnutls"
export LD_LIBRARY_PATH="$LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
if ! timeout 400 make -j"$(nproc)" build/libtern.a build/tern build/concurrency > "$OUT/build.log" 2>&1; then
    stamp "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1
fi
stamp "build ok"
M="${BENCH_MODEL:-random:llama3-8b:q4}"
timeout "${CONC_TIMEOUT:-150}" ./build/concurrency "$M" --device cuda --conc "${CONC:-1,4,16,64}" --prompt 256 --gen 64 \
    --system 2048 --requests 6 > "$OUT/concurrency.log" 2>&1
stamp "concurrency ($M) exit $?"
grep -v '^csv,' "$OUT/concurrency.log" | tail -20 | tee -a "$OUT/summary.txt"
CONC="${LOAD_CONC:-1,4,16,64}" timeout "${LOAD_TIMEOUT:-120}" bash bench/load.sh demo --device cuda --max-concurrency 64 \
    > "$OUT/load.log" 2>&1
stamp "load (demo on cuda) exit $?"
grep -v '^csv,' "$OUT/load.log" | tail -20 | tee -a "$OUT/summary.txt"
