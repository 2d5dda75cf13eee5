#!/usr/bin/env bash
# load.sh — build bench/load.c, start `tern serve MODEL` on a free loopback port, and measure
# the server against the engine driven directly with the same requests (bench/load.c).
#   bash bench/load.sh [MODEL] [extra flags for both, e.g. --threads 1 --max-concurrency 64]
# Env: CONC (default 1,4,16,64), REQUESTS (per level; default max(4*conc,16)), PROMPT (128),
# MAXTOK (64), CSV (a file for the CSV rows). To measure a server that is already running
# (e.g. on the GPU machine): build/load --url http://HOST:PORT [--direct MODEL --device cuda].
set -eu
cd "$(dirname "$0")/.."
model="${1:-demo}"; shift || true
make -s build/libtern.a build/tern
cflags="-O2 -g -std=c11 -D_GNU_SOURCE -Iinclude -Isrc"
libs="-lcjson -lpcre2-8 -lmicrohttpd -lutf8proc -lpthread -lm"
if nm build/libtern.a 2>/dev/null | grep -q cudaMalloc; then
    cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
    libs="$libs -L$cuda/lib64 -Wl,-rpath,$cuda/lib64 -lcublasLt -lcublas -lcudart -lstdc++"
fi
cc $cflags bench/load.c build/libtern.a -o build/load $libs
out=$(mktemp)
build/tern serve "$model" --port 0 "$@" > "$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 1 600); do grep -q '^listening on' "$out" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$out")
[ -n "$url" ] || { echo "server did not start"; cat "$out"; exit 1; }
grep -v '^listening' "$out" | sed 's/^/# /'
# engine flags that load.c understands are passed on to the direct path
direct_flags=()
while [ $# -gt 0 ]; do
    case "$1" in --threads|--device|--max-concurrency) direct_flags+=("$1" "$2"); shift 2 ;; *) shift ;; esac
done
build/load --url "$url" --direct "$model" --conc "${CONC:-1,4,16,64}" --requests "${REQUESTS:-0}" \
    --prompt-tokens "${PROMPT:-128}" --max-tokens "${MAXTOK:-64}" ${CSV:+--csv "$CSV"} "${direct_flags[@]}"
