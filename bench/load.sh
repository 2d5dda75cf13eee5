#!/usr/bin/env bash
# load.sh — build bench/load.c, start `tern serve MODEL` on a free loopback port, and measure
# the server against the engine driven directly with the same requests (bench/load.c).
#   bash bench/load.sh [MODEL] [extra flags for both, e.g. --threads 1 --max-concurrency 64]
# Env: CONC (default 1,4,16,64), REQUESTS (per level; default max(4*conc,16)), PROMPT (128),
# MAXTOK (64), CSV (a file for the CSV rows), TERN_BIN (the server binary, default build/tern:
# A/B runs against a copy of an older build).
# MODEL may be random:PRESET[:qB] (e.g. random:qwen3-0.6b:q4, random:llama3-8b:q4): random weights
# of a real geometry and no tokenizer; the server then answers the token-id prompts with "<id>"
# text per token (src/server/job.c), so step times are realistic. Pass --max-ctx 1024 or so:
# both engines (server + direct) size their KV pools from it. To measure a server that is already running
# (e.g. on the GPU machine): build/load --url http://HOST:PORT [--direct MODEL --device cuda].
set -eu
cd "$(dirname "$0")/.."
model="${1:-demo}"; shift || true
make -s build/libtern.a build/tern
cflags="-O2 -g -std=c11 -D_GNU_SOURCE -Iinclude -Isrc"
# link exactly as the Makefile links build/tern (CUDA, NCCL ... when libtern.a has them)
libs=$(printf 'tern-print-ldlibs:\n\t@echo $(LDLIBS)\n' | make -s --no-print-directory -f Makefile -f - tern-print-ldlibs 2>/dev/null) ||
    libs="-lcjson -lpcre2-8 -lmicrohttpd -lutf8proc -lpthread -lm"
cc $cflags bench/load.c build/libtern.a -o build/load $libs
out=$(mktemp)
"${TERN_BIN:-build/tern}" serve "$model" --port 0 "$@" > "$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 1 3000); do   # up to 5 min: random:PRESET weights are made at start-up
    grep -q '^listening on' "$out" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
url=$(sed -n 's/^listening on //p' "$out")
[ -n "$url" ] || { echo "server did not start"; cat "$out"; exit 1; }
grep -v '^listening' "$out" | sed 's/^/# /'
# engine flags that load.c understands are passed on to the direct path
direct_flags=()
while [ $# -gt 0 ]; do
    case "$1" in --threads|--device|--max-concurrency|--max-ctx|--compute|--kv-quant) direct_flags+=("$1" "$2"); shift 2 ;;
    *) shift ;; esac
done
build/load --url "$url" --direct "$model" --conc "${CONC:-1,4,16,64}" --requests "${REQUESTS:-0}" \
    --prompt-tokens "${PROMPT:-128}" --max-tokens "${MAXTOK:-64}" ${CSV:+--csv "$CSV"} "${direct_flags[@]}"
# the whole server process over all levels (also for servers without process_cpu_seconds_total)
if [ -r /proc/$pid/stat ]; then
    ticks=$(awk '{print $14 + $15}' /proc/$pid/stat)
    gen=$(curl -s "$url/metrics" 2>/dev/null | sed -n 's/^tern_generated_tokens_total //p')
    [ -n "$gen" ] && [ "$gen" -gt 0 ] && awk -v t="$ticks" -v g="$gen" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "# server process: %.2f s CPU for %d generated tokens = %.1f us/token (all levels)\n", t / hz, g, t / hz * 1e6 / g }'
fi
