#!/usr/bin/env bash
# bench/gpu_table.sh — issue 4's benchmark table on the GPU machine, from binaries built here
# (scripts/gpu_check.sh pack; carry [".gpudeps", "build/gpu_prebuilt"]):
#   prefill tok/s at 512, 2k, 8k and decode tok/s after each (tern-core bench --prompt 512,2048,8192;
#   the floor counts weights + the KV a step reads at the mean decode context), and aggregate decode
#   at batch 8, 32, 64, 128 with 128-token prompts and 128 new tokens (build/concurrency, the
#   llama-batched-bench setting), for each MODEL:QUANT of GPU_TABLE (default: llama3-8b, gemma4-e4b,
#   gemma4-12b, gemma4-26b-a4b in bf16 and q4) in compute mode GPU_TABLE_COMPUTE (default bf16).
# Writes $OUT/table.csv (kind,model,quant,compute,size,pp_tps,tg_tps,floor_tps,tg_over_floor) and the runs'
# logs (packed into table_logs.tar.xz at the end); prints the table. Each model runs under its own timeout; split
# GPU_TABLE over two calls when the list is long (a bf16 model is synthesized in host memory first: ~20 s for 8B;
# on an H200 in session 74 four models took 200-245 s a call).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_table}"
mkdir -p "$OUT"
if [ -n "${GPU_PREBUILT:-}" ]; then tar xJf "$GPU_PREBUILT" || exit 1; fi
D="$PWD/.gpudeps/root"
export LD_LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu:$D/gnutls${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
C="${GPU_TABLE_COMPUTE:-bf16}"
T="$OUT/table.csv"
echo "kind,model,quant,compute,size,pp_tps,tg_tps,floor_tps,tg_over_floor" > "$T"
t0=$(date +%s)
for spec in ${GPU_TABLE:-llama3-8b:bf16 llama3-8b:q4 gemma4-e4b:bf16 gemma4-e4b:q4 gemma4-12b:bf16 gemma4-12b:q4 gemma4-26b-a4b:q4}; do
    m=${spec%%:*}; q=${spec##*:}
    log="$OUT/bench_${m}_$q.log"
    timeout "${GPU_TABLE_TIMEOUT:-150}" ./build/tern-core bench --device cuda --random "$m" --quant "$q" --compute "$C" \
        --prompt 512,2048,8192 --gen 64 --reps 1 > "$log" 2>&1
    echo "[$(( $(date +%s) - t0 ))s] bench $spec exit $?"
    # csv,model,backend,prompt,gen,pp,tg,bw,floor,tg/floor,kv_mb
    awk -F, -v q="$q" -v c="$C" '/^csv,/ { printf "single,%s,%s,%s,%s,%s,%s,%s,%s\n", $2, q, c, $4, $6, $7, $9, $10 }' "$log" >> "$T"
    qq=$q; [ "$q" = bf16 ] && qq="" || qq=":$q"
    clog="$OUT/conc_${m}_$q.log"
    timeout "${GPU_TABLE_TIMEOUT:-150}" ./build/concurrency --random "$m$qq" --device cuda --compute "$C" --conc 8,32,64,128 \
        --prompt 128 --gen 128 --system 16 --requests 2 > "$clog" 2>&1
    echo "[$(( $(date +%s) - t0 ))s] concurrency $spec exit $?"
    # csv,conc,model,device,C,prompt,gen,out_tps,dec_tps,...
    # (..., bw, floor_tps, dec_over_floor: the last three fields)
    awk -F, -v m="$m" -v q="$q" -v c="$C" '/^csv,conc,/ { printf "batch,%s,%s,%s,%s,,%s,%s,%s\n", m, q, c, $5, $9, $(NF-1), $NF }' "$clog" >> "$T"
done
if command -v column > /dev/null; then column -s, -t < "$T"; else tr , '\t' < "$T"; fi
# Only 8 files come back from a device call: the per-model logs go into one archive (GPU_TABLE_PACK=0 keeps them
# loose); table.csv and *.log files the caller redirects into stay as they are
if [ "${GPU_TABLE_PACK:-1}" != 0 ]; then
    ( cd "$OUT" && ls bench_*.log conc_*.log 2> /dev/null > .table_files && [ -s .table_files ] &&
        tar cJf table_logs.tar.xz -T .table_files && xargs rm -f < .table_files; rm -f .table_files )
fi
