#!/usr/bin/env bash
# scripts/gpu_runtime_bench.sh — issue 5/6 benchmarks on the GPU machine in one call: builds the
# full tern with the carried Debian libraries (.gpudeps: cJSON, PCRE2, libmicrohttpd + GnuTLS,
# utf8proc, extracted with `apt-get download` + `dpkg -x`; pass carry [".gpudeps"]), then
#   1. bench/concurrency on CUDA: throughput/latency vs concurrency + prefix-cache speed-up
#   2. bench/load.sh demo: the HTTP server vs the engine driven directly (server overhead; a toy
#      model, so the server's per-token cost is exposed: the worst case)
#   3. bench/load.sh random:llama3-8b:q4 (no tokenizer: token-id prompts, "<id>" text): the
#      same with realistic step times (LOAD_REAL_MODEL, LOAD_REAL_CONC, LOAD_REAL_MAXTOK)
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
RM="${LOAD_REAL_MODEL:-random:llama3-8b:q4}"
CONC="${LOAD_REAL_CONC:-1,4,16,64}" PROMPT="${LOAD_REAL_PROMPT:-128}" MAXTOK="${LOAD_REAL_MAXTOK:-32}" \
    timeout "${LOAD_REAL_TIMEOUT:-420}" bash bench/load.sh "$RM" --device cuda --max-concurrency 64 --max-ctx 1024 \
    > "$OUT/load_real.log" 2>&1
stamp "load ($RM on cuda) exit $?"
grep -v '^csv,' "$OUT/load_real.log" | tail -20 | tee -a "$OUT/summary.txt"
