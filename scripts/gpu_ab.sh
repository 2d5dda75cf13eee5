#!/usr/bin/env bash
# scripts/gpu_ab.sh — the A/Bs of switches written without a GPU, in one device call (~5 min).
#
# Each switch below was committed opt-in (or default in one mode) and op-tested in code only; this
# times it against the alternative, interleaved (A, B, A, B) so the H200's drift cancels. Run after
# `scripts/gpu_check.sh` has unpacked the prebuilt binaries (GPU_PREBUILT) and passed the op tests:
#   OUT=/tmp/ab bash scripts/gpu_ab.sh      # logs + summary.txt under $OUT
# Session 11's sections (NORM_N / NORM_ROPE / NORM_RES / NORM_GEMM) ran and are recorded in bench/NOTES.md
# (t); they were removed from here, as were 1 (TERN_CUDA_GEMV_RING) and 6 (TERN_CUDA_GEMV_FLAT) with their kernels
# in session 14. Sections 1-3 (TERN_CUDA_GEMV_RING, TERN_CUDA_AD_CLUSTER at batch 1 and
# under batch decode) ran in session 12 (NOTES (u)); 4 (TERN_CUDA_GEMV_L2PF / _L2ROLL), 5 (bench_cuda --pattern's
# modes 4-6) and 6 (gemv_flat.cu) in session 13 (NOTES (v)): L2PF = 3 is the default now (its rolling
# variant L2ROLL lost and was removed). 7 (TERN_CUDA_AD_EARLY), 8 (TERN_CUDA_G1_L2PF), 9 (TERN_CUDA_GEMV_SC32),
# 10 (TERN_CUDA_AD_ROPE) and 11 (TERN_MM_ONEWAVE) were written after session 13's last call and ran in session 14
# (NOTES (w)): 7 won (AD_EARLY is the default), 11 kept its default; 8, 9 and 10 lost and were removed. 12
# (TERN_CUDA_GEMV_XR) ran in session 15 and won (default on; NOTES (x)); 13 (TERN_CUDA_QG4) was written
# in session 15 (ran there); 14 (TERN_CUDA_QG4_ST, TERN_CUDA_AD_WANT, TERN_CUDA_AD_1P) was written after session
# 15's last call and lost in session 16; 15 (TERN_CUDA_QG4_WG, WGPAIR) and 16 (TERN_CUDA_AD_TC) won in session 16
# (NOTES (y): defaults now); 17 (TERN_CUDA_AD_TC_MIN) and 18 (TERN_CUDA_QG4_WS) ran in session 17 (NOTES (z)):
# AD_TC_MIN = 64 won (default now, bounded by TERN_CUDA_AD_TC_KEYS), WS lost 2x and was removed; then TERN_MM_BAL
# won (default) and the bound held at 2k keys. In session 18 (NOTES (aa)) 17 (that bound at 8k keys) won
# (TERN_CUDA_AD_TC_KEYS default 16384), 20 (TERN_CUDA_NORM_RES=1 again) lost, and 18 (TERN_CUDA_QG4_PRE), 19
# (TERN_CUDA_SGW) and 21 (TERN_CUDA_QG4_LR), written after session 17's last call, lost or tied and were removed
# with their code (docs/CUDA.md, "Tried and removed"); 22 (TERN_CUDA_AD_TCS) ran and stays opt-in; 23
# (TERN_CUDA_AD_LEAN, TERN_CUDA_AD_CHMIN=64) was written after session 18's last call and ran in session 19 (LEAN won:
# default; CHMIN=64 tied); 24 (TCS's early copies, one block per SM), 25 (the long-context class) and 26
# (TERN_CUDA_CARVE) ran in session 19. 56 and 57 (TERN_CUDA_GEMV_XRW) ran in session 39 (NOTES (ay)): default on. 58-61 (TERN_CUDA_AD_R1, _R1_512) ran in session 40
# (NOTES (az)): default on; 62 (TERN_CUDA_AD_R1_LONG, _R1_PF) ran in session 41 (NOTES (ba)): both lost, removed; 63 (TERN_CUDA_SKIP, a probe) and 64 ran there too; 58's TERN_CUDA_AD_SKIP (no decode attention at all, a measurement) was removed after. 65 (TERN_ASYNC in the scheduler) ran in session 42 (NOTES (bb)); so did 66 (TERN_CUDA_DOWN_SPLIT: the down projection as S K-slices + one kernel adding them and staging the next pre-norm), which tied / lost and was removed. 71-74 (TERN_CUDA_GEMV_MMA_MIN, TERN_CUDA_MM_TAIL, TERN_CUDA_MM_SYNC; 73's SASS capture is 78's with AB78_MODEL) ran in sessions 55-56 (NOTES (bo), (bp)) and were removed with their switches; 77 (TERN_MM_HALF) ran in session 57 (NOTES (bq)): lost 10-23 %, removed. Keep this script as the template for the next switches: make one the default only
# when it wins here and in the model runs.
set -u
cd "$(dirname "$0")/.."
if [ -d .gpudeps/root ]; then
    export LD_LIBRARY_PATH="$PWD/.gpudeps/root/usr/lib/x86_64-linux-gnu:$PWD/.gpudeps/root/gnutls${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
OUT="${OUT:-build/gpu_ab}"
mkdir -p "$OUT"
S="$OUT/summary.txt"
: > "$S"
T=build/tern-core
say() { echo "$*" | tee -a "$S"; }
# q4_gemv VAR "values": BENCH_GEMV1=q4 per-shape GEMV times (XP1 forced) for each value of switch VAR
q4_gemv() {
    local var=$1 v
    for v in $2; do
        env "$var=$v" TERN_CUDA_GEMV_XP1=1 BENCH_GEMV1=q4 timeout 120 build/bench_cuda > "$OUT/gemv_${var}_$v.txt" 2>&1
        say "gemv q4 XP1 $var=$v:"; grep '^\[mma\]' "$OUT/gemv_${var}_$v.txt" | tr -s ' ' | tee -a "$S"
    done
}
# b1_ab VAR "values" "spec;spec": batch-1 decode for each model spec (tern-core bench arguments after
# --random), every value of switch VAR, interleaved, two reps
b1_ab() {
    local var=$1 vals=$2 v m rep tag ms
    IFS=';' read -ra ms <<< "$3"
    for rep in 1 2; do
        for m in "${ms[@]}"; do
            for v in $vals; do
                tag=$(printf '%s' "$m" | tr -c 'a-zA-Z0-9.' '_')
                env "$var=$v" timeout 60 $T bench --random $m --device cuda --prompt 512 --gen 64 --reps 1 \
                    > "$OUT/b1_${var}_${tag}_${v}_$rep.txt" 2>&1
                say "b1 $m $var=$v rep $rep: $(grep '^csv,' "$OUT/b1_${var}_${tag}_${v}_$rep.txt" | cut -d, -f7,10 | tail -1)"
            done
        done
    done
}
# q4_b1 VAR "values": batch-1 decode of llama3-8b and gemma4-12b q4
q4_b1() { b1_ab "$1" "$2" "llama3-8b --quant q4;gemma4-12b --quant q4"; }
# bin_env DEFAULT "words": a setting's words split into _bin (the path of a word BIN=path — another tree's build, carried
# beside — else DEFAULT) and _env (the other words, VAR=value settings for env)
bin_env() {
    local w
    _bin=$1 _env=""
    for w in $2; do case $w in BIN=*) _bin=${w#BIN=} ;; *) _env="$_env $w" ;; esac; done
}
# b1e "VAR=V ..." PROMPT "spec": one batch-1 decode (prompt + 64) with those settings (BIN=path: that tern-core):
# "tok/s,tg/floor"
b1e() {
    bin_env $T "$1"
    env $_env timeout 90 $_bin bench --random $3 --device cuda --prompt $2 --gen 64 --reps 1 > "$OUT/b1e.txt" 2>&1
    grep '^csv,' "$OUT/b1e.txt" | cut -d, -f7,10 | tail -1
}
# b1_sets "settings;settings" "spec;spec" [PROMPT]: batch-1 decode (PROMPT + 64, default 512) of each model spec for
# every setting (a space-separated list of VAR=value), interleaved, AB_REPS reps (default 2)
b1_sets() {
    local sets ms rep m v
    IFS=';' read -ra sets <<< "$1"
    IFS=';' read -ra ms <<< "$2"
    for rep in $(seq "${AB_REPS:-2}"); do
        for m in "${ms[@]}"; do
            for v in "${sets[@]}"; do
                say "b1 $m at ${3:-512} [$v] rep $rep: $(b1e "$v" "${3:-512}" "$m")"
            done
        done
    done
}
# conc_ab "settings;settings" "models" CONC: batch decode (build/concurrency, bf16 compute, 128 + 128) of each
# model at the concurrencies CONC for every setting (a space-separated list of VAR=value; a word BIN=path runs
# that concurrency binary instead, e.g. build/base/concurrency from GPU_PACK_BASE_CONC), interleaved, AB_REPS reps
# (default 2; AB_CONC overrides CONC); one line each: concurrency and steady decode tok/s
conc_ab() {
    local sets rep v m tag
    IFS=';' read -ra sets <<< "$1"
    for rep in $(seq "${AB_REPS:-2}"); do
        for v in "${sets[@]}"; do
            for m in $2; do
                tag=$(printf '%s_%s' "$m" "$v" | tr -c 'a-zA-Z0-9.' '_')
                bin_env build/concurrency "$v" # a word BIN=path runs that concurrency instead
                env $_env timeout 100 $_bin --random $m --device cuda --compute bf16 --conc "${AB_CONC:-$3}" \
                    --prompt 128 --gen 128 --requests 2 --system 16 > "$OUT/conc_${tag}_$rep.txt" 2>&1
                say "concurrency $m $v rep $rep: $(grep '^csv,conc' "$OUT/conc_${tag}_$rep.txt" | cut -d, -f5,9,16 | tr '\n' ' ')"
            done
        done
    done
}
# op_test NAME TAG: the op test NAME alone (build/test_cuda_ops, AB_OP_TIMEOUT s at most, default 150) into
# $OUT/TAG_ops.txt, its pass / fail count and first failed checks in the summary
op_test() {
    TERN_TEST_ONLY=$1 timeout "${AB_OP_TIMEOUT:-150}" build/test_cuda_ops > "$OUT/$2_ops.txt" 2>&1
    say "$1 op test: $(grep -c '^PASS' "$OUT/$2_ops.txt") passed, $(grep -c '^FAIL' "$OUT/$2_ops.txt") failed$(grep -ohE '\([0-9.]+ s\)$' "$OUT/$2_ops.txt" | tr '\n' ' ' | sed 's/^./ &/')"
    grep -E '^FAIL|check failed' "$OUT/$2_ops.txt" | head -5 | tee -a "$S"
}
# ops_ok NAME...: op_test each NAME (tag: NAME without its cuda_ prefix); fails unless every one ran and passed
ops_ok() {
    local t f=0
    for t in "$@"; do
        op_test $t ${t#cuda_}
        grep -q '^FAIL' "$OUT/${t#cuda_}_ops.txt" && f=1
        grep -q '^PASS' "$OUT/${t#cuda_}_ops.txt" || f=1
    done
    return $f
}
# ops_ab N "TESTS" "settings;settings" "models" CONC GLOB: a section's usual body — the op tests TESTS (ops_ok; a failure
# named in the summary as section N's), conc_ab of the settings over the models at CONC, the ids digests of $OUT/GLOB
ops_ab() {
    ops_ok $2 || say "$1: AN OP TEST FAILED"
    conc_ab "$3" "$4" "$5"
    say_digests "$6"
}
# say_digests GLOB: the greedy ids digests of each concurrency log $OUT/GLOB (rep 1) into the summary
say_digests() {
    local f
    for f in "$OUT"/$1; do say "$(basename "$f"): $(grep 'ids digest' "$f" | tr '\n' ' ')"; done
}
# g4_batch NAME [VAR=value ...]: tests/unit/test_model_g4_batch on the GPU (with the settings given) into $OUT/NAME.log;
# counts and its bf16 lines into the summary
g4_batch() {
    local log="$OUT/$1.log"
    shift
    env "$@" TERN_TEST_DEVICE=cuda timeout 120 build/tests/test_model_g4_batch_core > "$log" 2>&1
    say "test_model_g4_batch $*: $(grep -c '^PASS' "$log") passed, $(grep -c '^FAIL' "$log") failed"
    grep -E '^FAIL|check failed|rows, bf16' "$log" | tee -a "$S"
}
# on_checks VAR COMPUTE "fixtures": with VAR=1, model parity on cuda (f32, bf16), then greedy ids of each
# fixture (kv-quant off and 8, in COMPUTE) with VAR=0 and VAR=1 — a switch that keeps bits must say "same"
on_checks() {
    local var=$1 comp m q a b
    for comp in f32 bf16; do
        env "$var=1" TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$comp timeout 120 build/tests/test_parity_core \
            > "$OUT/parity_${var}_$comp.log" 2>&1
        say "$var=1 parity $comp: $(grep -c '^PASS' "$OUT/parity_${var}_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity_${var}_$comp.log") failed"
    done
    for m in $3; do
        for q in off 8; do
            a=$(env "$var=0" timeout 30 $T generate tests/parity/fixtures/$m --ids 2,17,99,45,20,12 --max-tokens 40 \
                --temperature 0 --ignore-eos --print-ids --kv-quant $q --device cuda --compute $2 2>/dev/null | head -1)
            b=$(env "$var=1" timeout 30 $T generate tests/parity/fixtures/$m --ids 2,17,99,45,20,12 --max-tokens 40 \
                --temperature 0 --ignore-eos --print-ids --kv-quant $q --device cuda --compute $2 2>/dev/null | head -1)
            say "$var greedy $m kv-quant $q $2: $([ -n "$a" ] && [ "$a" = "$b" ] && echo same || echo DIFFERENT)"
        done
    done
}
SECTIONS="${AB_SECTIONS:-78}"  # 86 (G1_CPA won: default 2), 87 and 88 (MOE_GU_CPA +0.4 %) ran in session 59 (NOTES (bs)); 81 (EXPERT_PF, removed), 82 (QG4_MAX_N=64 lost), 83 (NORM_ROUTE won), 84 (MOE_DOWN1 won) and 85 (DOWN1_R 2 won) ran in session 58 (NOTES (br)); 80 (mm_ld4 with an L2::256B hint) ran in session 57 (NOTES (bq)): lost 1.5-4 %, removed; 79 (the first chunk's scales packed after the staging, TERN_CUDA_GEMV_L2D) ran in session 57 (NOTES (bq)): both lost, removed; 78 ran in session 57 (NOTES (bq): ncu of llama3-8b's walks); 77 ran in session 57 (NOTES (bq): TERN_MM_HALF lost, removed); 76 ran in session 56 (NOTES (bp): NORM_RES=1 lost again); 75 ran in session 56 (NOTES (bp): +3-5.6 % b1 q4 against the tree before); 74 ran in session 56 (NOTES (bp): acq_rel counting won, clusters lost); 73 ran in session 56 (NOTES (bp): ROT won, now the default; TAIL lost again); 71-72 ran in session 55 (NOTES (bo): MIN and the first mm_tail lost); 70 (TERN_MM_KW, TERN_MM_CT) ran in session 54 (NOTES (bn)): both lost and were removed; 49-50 ran in session 36 (NOTES (av): NRK_HOIST won, ROPE_HOIST tied and was removed); 46-48 ran in session 35 (NOTES (au): XSM lost, G1_XB won, the planner's J and OCC stay); 45 ran in session 35 (NOTES (au): RMSU won); 44: session 28 (wgemm.cu; its parts ran in calls 1-5, NOTES (ao): lost, opt-in); 41-43 ran in session 27 (NOTES (an): QKV_ONE and ATT_O won, defaults now); 38-40 ran in session 26 (NOTES (am): MLP from 32 rows and AD_TC_ST auto won; SGEMM stays), 41 written after its last call; 37 (session 25, TERN_LT_PICK globally) not run: 38's per-shape sweep answers it; 36 ran in session 25 (NOTES (al): 8192-row chunks won, now the default), 35 in session 24 (NOTES (ak)), 34 in session 23 (NOTES (aj)), 31-33 in sessions 21-22 (NOTES (af), (ai)), 1-3 ran in session 12 (NOTES (u)), 4-6 in session 13 (NOTES (v)), 7-11 in session 14 (NOTES (w)), 12-13 in session 15 (NOTES (x)), 14-16 in session 16 (NOTES (y)), old 17-18 in session 17 (NOTES (z)), 17-21 in session 18 (NOTES (aa)), 27-29 (+ the removed 30) in session 20 (NOTES (ad))

if [[ " $SECTIONS " == *" 2 "* ]]; then
# 2. decode attention: a row's splits as one thread-block cluster merged in shared memory
#    (TERN_CUDA_AD_CLUSTER=N, written in session 11 without a GPU; op test cuda_attention_decode_cluster_bits)
for rep in 1 2; do
    for v in 0 8 16; do
        TERN_CUDA_AD_CLUSTER=$v timeout 60 build/bench_cuda --attn-dec1 512 1 bf16 1 > "$OUT/adcl_k_${v}_$rep.txt" 2>&1
        say "attn-dec1 512 keys AD_CLUSTER=$v rep $rep: $(grep '^csv' "$OUT/adcl_k_${v}_$rep.txt" | cut -d, -f2,3 | tail -1)"
        for m in "llama3-8b" "llama3-8b --quant q4"; do
            TERN_CUDA_AD_CLUSTER=$v timeout 60 $T bench --random $m --device cuda --prompt 512 --gen 64 --reps 1 \
                > "$OUT/adcl_${v}_$rep.txt" 2>&1
            say "b1 $m AD_CLUSTER=$v rep $rep: $(grep '^csv,' "$OUT/adcl_${v}_$rep.txt" | cut -d, -f7,10 | tail -1)"
        done
    done
done
fi

# 3. the cluster merge under batch decode (default 16 since session 12's b1 A/B): dec tok/s at 8 and 64
if [[ " $SECTIONS " == *" 3 "* ]]; then
    conc_ab "TERN_CUDA_AD_CLUSTER=0;TERN_CUDA_AD_CLUSTER=16" llama3-8b 8,64
fi

# 4. the Q4 GEMV's walk prefetched into L2 before pdl_wait (TERN_CUDA_GEMV_L2PF=N items per warp; written
#    in session 12 without a GPU): per-shape GEMV times (back-to-back launches overlap through PDL),
#    then batch-1 decode
if [[ " $SECTIONS " == *" 4 "* ]]; then
    q4_gemv TERN_CUDA_GEMV_L2PF "0 3 8 16"
    q4_b1 TERN_CUDA_GEMV_L2PF "0 3 16"
fi

# 5. load patterns without math (bench_cuda --pattern: modes 4-6 written in session 12 without a GPU)
if [[ " $SECTIONS " == *" 5 "* ]]; then
timeout 120 build/bench_cuda --pattern > "$OUT/pattern.txt" 2>&1
grep -i 'pattern' "$OUT/pattern.txt" | tr -s ' ' | tee -a "$S"
fi

# 7. decode attention of one row with its first K/V loads before pdl_wait (TERN_CUDA_AD_EARLY=1; written in
#    session 13 without a GPU; op test cuda_attention_decode_early_bits): correctness end to end first
#    (parity, and greedy ids with and without it over BF16 and q8 pages: decode steps run in graphs with
#    PDL, where a stale key would show), then b1 bf16 and q4
if [[ " $SECTIONS " == *" 7 "* ]]; then
    on_checks TERN_CUDA_AD_EARLY bf16 "llama3 gemma4_e2b_like"
    b1_ab TERN_CUDA_AD_EARLY "0 1" "llama3-8b;llama3-8b --quant q4;gemma4-12b"
fi

# 11. mm_chunks' one-wave step (TERN_MM_ONEWAVE=0 turns it off; committed after session 13's last call): the
#     presets whose J it moves (gemma4-e2b gate|up 2 -> 3, gemma4-26b-a4b q|k|v and global o 1 -> 2) and llama3-8b
if [[ " $SECTIONS " == *" 11 "* ]]; then
    b1_ab TERN_MM_ONEWAVE "0 1" "gemma4-e2b --quant q4;gemma4-26b-a4b --quant q4;llama3-8b --quant q4"
fi

# 13. qgemm_q4.cu (TERN_CUDA_QG4, default on: Q4 with BF16 scales times 2..64 rows in the plain bf16 mode
#     through a cp.async ring; written in session 15): its op test, per-shape µs against qgemm at n = 8..64
#     (bench_cuda --xr; --batched also times n = 128..512 against dequantize + cuBLASLt), parity, then
#     batch decode at 16 / 32 / 64 (q4, bf16 compute) off / on
if [[ " $SECTIONS " == *" 13 "* ]]; then
    op_test cuda_qgemm_q4 qg4
    timeout 150 build/bench_cuda --xr > "$OUT/qg4_bench.txt" 2>&1
    grep '^bmm' "$OUT/qg4_bench.txt" | grep -v ' n=1 \| n=2 \| n=4 ' | tr -s ' ' | tee -a "$S"
    TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=bf16 timeout 120 build/tests/test_parity_core > "$OUT/parity_qg4.log" 2>&1
    say "parity bf16 (qg4 on): $(grep -c '^PASS' "$OUT/parity_qg4.log") passed, $(grep -c '^FAIL' "$OUT/parity_qg4.log") failed"
    conc_ab "TERN_CUDA_QG4=0;TERN_CUDA_QG4=1" llama3-8b:q4 16,32,64
fi

# 14. Written after session 15's last device call (opt-in; default builds unchanged):
#     TERN_CUDA_QG4_ST=6 (qgemm_q4.cu: six cp.async stages at up to 16 rows, where it is bandwidth-bound),
#     TERN_CUDA_AD_WANT=4 (decode attention's split target: 4 blocks per SM) and TERN_CUDA_AD_1P=1
#     (attn_decode1p.cu: one pass per warp, a block per (row, kv head), for launches whose pairs fill the GPU);
#     op tests, µs, then batch decode interleaved (32 / 64 sequences, q4 and bf16)
if [[ " $SECTIONS " == *" 14 "* ]]; then
    TERN_TEST_ONLY=cuda_qgemm_q4,cuda_attention_decode_1p timeout 200 build/test_cuda_ops > "$OUT/st_ops.txt" 2>&1
    say "qg4 (incl. ST 6) + one-pass attention op tests: $(grep -c '^PASS' "$OUT/st_ops.txt") passed, $(grep -c '^FAIL' "$OUT/st_ops.txt") failed"
    grep -E '^FAIL|check failed' "$OUT/st_ops.txt" | head -5 | tee -a "$S"
    for v in 4 6; do
        TERN_CUDA_QG4_ST=$v timeout 100 build/bench_cuda --xr > "$OUT/st_bench_$v.txt" 2>&1
        say "ST=$v: $(grep '^bmm' "$OUT/st_bench_$v.txt" | grep -E 'n=(8|16) qg4' | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ';')"
    done
    conc_ab "TERN_CUDA_QG4_ST=4;TERN_CUDA_QG4_ST=6" llama3-8b:q4 8,16
    conc_ab "TERN_CUDA_AD_WANT=2;TERN_CUDA_AD_WANT=4;TERN_CUDA_AD_1P=1" "llama3-8b:q4 llama3-8b" 32,64
fi

# 15. qgemm_q4_wg.cu (TERN_CUDA_QG4_WG=1, sm_90a wgmma for 17..128 rows; written in session 16): op test, µs
#     at n = 32..128 (bench_cuda --xr), parity with it on, then batch decode interleaved (q4 at 32 / 64 / 128)
if [[ " $SECTIONS " == *" 15 "* ]]; then
    TERN_TEST_ONLY=cuda_qgemm_q4_wg timeout 200 build/test_cuda_ops > "$OUT/wg_ops.txt" 2>&1
    say "qg4 wgmma op test: $(grep -c '^PASS' "$OUT/wg_ops.txt") passed, $(grep -c '^FAIL' "$OUT/wg_ops.txt") failed, $(grep -c '^SKIP' "$OUT/wg_ops.txt") skipped"
    grep -E '^FAIL|check failed|SKIP' "$OUT/wg_ops.txt" | head -5 | tee -a "$S"
    grep 'err ' "$OUT/wg_ops.txt" | sort -k8 -g | tail -2 | tee -a "$S"
    for v in 0 1; do
        TERN_CUDA_QG4_WG=$v timeout 100 build/bench_cuda --xr > "$OUT/wg_bench_$v.txt" 2>&1
        say "WG=$v: $(grep '^bmm' "$OUT/wg_bench_$v.txt" | grep -E 'n=(32|64|128) qg4' | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ';')"
    done
    TERN_CUDA_QG4_WG=1 TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=bf16 timeout 120 build/tests/test_parity_core > "$OUT/parity_wg.log" 2>&1
    say "parity bf16 (wgmma on): $(grep -c '^PASS' "$OUT/parity_wg.log") passed, $(grep -c '^FAIL' "$OUT/parity_wg.log") failed"
    conc_ab "TERN_CUDA_QG4_WG=0;TERN_CUDA_QG4_WG=1 TERN_CUDA_QG4_WGPAIR=0;TERN_CUDA_QG4_WG=1 TERN_CUDA_QG4_WGPAIR=1" \
        llama3-8b:q4 32,64,128
    TERN_CUDA_QG4_WG=1 TERN_CUDA_QG4_WGPAIR=1 timeout 100 /usr/local/cuda/bin/ncu --cache-control none --clock-control none \
        -k regex:qg4w_kernel --launch-skip 400 --launch-count 4 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section ComputeWorkloadAnalysis build/concurrency --random llama3-8b:q4 --device cuda \
        --compute bf16 --conc 64 --prompt 128 --gen 128 --requests 2 --system 16 > "$OUT/wg_ncu.txt" 2>&1
    grep -E "qg4w_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy" \
        "$OUT/wg_ncu.txt" | head -40 | tee -a "$S"
fi

# 16. attn_decode_tc.cu (TERN_CUDA_AD_TC=1: decode attention on mma.sync for launches whose pairs fill the GPU;
#     TERN_CUDA_AD_TC_ST=2: two ring stages at D 128, 3 blocks per SM; written in session 16 without a GPU): op
#     test, ncu time of the attention at 64 sequences, then batch decode interleaved (q4 and bf16 at 32 / 64)
if [[ " $SECTIONS " == *" 16 "* ]]; then
    TERN_TEST_ONLY=cuda_attention_decode_tc timeout 200 build/test_cuda_ops > "$OUT/tc_ops.txt" 2>&1
    say "tensor-core attention op test: $(grep -c '^PASS' "$OUT/tc_ops.txt") passed, $(grep -c '^FAIL' "$OUT/tc_ops.txt") failed"
    grep -E '^FAIL|check failed' "$OUT/tc_ops.txt" | head -5 | tee -a "$S"
    grep 'err ' "$OUT/tc_ops.txt" | sort -k NF -g | tail -2 | tee -a "$S"
    for v in "TERN_CUDA_AD_TC=0" "TERN_CUDA_AD_TC=1" "TERN_CUDA_AD_TC=1 TERN_CUDA_AD_TC_ST=2"; do
        env $v timeout 100 /usr/local/cuda/bin/ncu --cache-control none --clock-control none -k regex:attn_dec \
            --launch-skip 600 --launch-count 8 --metrics gpu__time_duration.sum,dram__bytes_read.sum build/concurrency \
            --random llama3-8b:q4 --device cuda --compute bf16 --conc 64 --prompt 128 --gen 128 --requests 2 --system 16 \
            > "$OUT/tc_ncu.txt" 2>&1
        say "ncu attention at 64, $v: $(grep -E 'attn_dec|gpu__time_duration' "$OUT/tc_ncu.txt" | tail -2 | tr -s ' ' | tr '\n' ' ')"
    done
    conc_ab "TERN_CUDA_AD_TC=0;TERN_CUDA_AD_TC=1;TERN_CUDA_AD_TC=1 TERN_CUDA_AD_TC_ST=2" "llama3-8b:q4 llama3-8b" 32,64
fi


# 22. TERN_CUDA_AD_TCS=1 (attn_decode_tc.cu split over the keys for launches the one-pass tensor-core kernel does
#     not take: one row, a few; written in session 18): its op test, ncu durations of one row's attention against the
#     split kernel at 32..8192 keys, then b1 decode interleaved at 512 (llama3-8b bf16 / q4, gemma4-e4b q4) and 8k.
#     Since session 19 TCS=1 is the default and holds only in long-context steps: TERN_LONG_KEYS=1 keeps this
#     section's meaning (TCS=1 at every length)
if [[ " $SECTIONS " == *" 22 "* ]]; then
    export TERN_LONG_KEYS=1
    op_test cuda_attention_decode_tcs tcs
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for v in 0 1; do
        for ctx in 32 512 2048 8192; do
            TERN_CUDA_AD_TCS=$v timeout 60 $NCU --metrics gpu__time_duration.sum -k regex:attn_dec --launch-skip 55 \
                --launch-count 2 build/bench_cuda --attn-dec1 $ctx 1 bf16 1 > "$OUT/tcs_dur_${v}_$ctx.txt" 2>&1
            say "TCS=$v one row $ctx keys (ncu): $(grep -E 'gpu__time_duration.sum' "$OUT/tcs_dur_${v}_$ctx.txt" | awk '{print $NF}' | tr '\n' ' ') us"
        done
    done
    b1_ab TERN_CUDA_AD_TCS "0 1" "llama3-8b;llama3-8b --quant q4;gemma4-e4b --quant q4"
    for rep in 1 2; do
        for v in 0 1; do
            TERN_CUDA_AD_TCS=$v timeout 90 $T bench --random llama3-8b --quant q4 --device cuda --prompt 8192 --gen 64 \
                --reps 1 > "$OUT/tcs_8k_${v}_$rep.txt" 2>&1
            say "b1 8k llama3-8b q4 TCS=$v rep $rep: $(grep '^csv,' "$OUT/tcs_8k_${v}_$rep.txt" | cut -d, -f7,10 | tail -1)"
        done
    done
    unset TERN_LONG_KEYS
fi

# 23. TERN_CUDA_AD_LEAN=1 (attn_dec_kernel's one-row EARLY instances skipping empty key groups and staging the
#     cluster merge's (M, L); written after session 18's last call, same bits) and TERN_CUDA_AD_CHMIN=64 (splits
#     of >= 64 keys, so a warp's 4 key groups are filled; env only): the early-bits op test (EARLY off / on / LEAN),
#     `bench_cuda --pdl-smem` (pdl_probe.cu: what a kernel in another shared-memory configuration costs PDL),
#     ncu durations of one row at 32..8192 keys, then b1 decode interleaved (llama3-8b bf16 / q4, gemma4-e4b q4)
if [[ " $SECTIONS " == *" 23 "* ]]; then
    op_test cuda_attention_decode_early_bits lean
    timeout 60 build/bench_cuda --pdl-smem > "$OUT/pdl_smem.txt" 2>&1 # does another smem configuration break PDL?
    grep '^pdl-smem' "$OUT/pdl_smem.txt" | tr -s ' ' | tee -a "$S"
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for e in "TERN_CUDA_AD_LEAN=0" "TERN_CUDA_AD_LEAN=1" "TERN_CUDA_AD_CHMIN=64" "TERN_CUDA_AD_LEAN=1 TERN_CUDA_AD_CHMIN=64"; do
        for ctx in 32 512 2048 8192; do
            env $e timeout 60 $NCU --metrics gpu__time_duration.sum -k regex:attn_dec --launch-skip 55 --launch-count 2 \
                build/bench_cuda --attn-dec1 $ctx 1 bf16 1 > "$OUT/lean_dur.txt" 2>&1
            say "$e one row $ctx keys (ncu): $(grep -E 'gpu__time_duration.sum' "$OUT/lean_dur.txt" | awk '{print $NF}' | tr '\n' ' ') us"
        done
    done
    b1_ab TERN_CUDA_AD_LEAN "0 1" "llama3-8b;llama3-8b --quant q4;gemma4-e4b --quant q4"
    b1_ab TERN_CUDA_AD_CHMIN "32 64" "llama3-8b;llama3-8b --quant q4"
fi

# 24. TCS forced (TERN_LONG_KEYS=1: every step is long) with and without its early copies (TERN_CUDA_AD_TCS_EARLY):
#     does the split tensor-core kernel keep PDL's overlap now (session 19; NOTES (aa): it lost 218 -> 200 at 512
#     keys, won 268 -> 279 at 8k)? The early-bits op test checks TCS's bits first. (Session 19 also ran one block per
#     SM, TERN_CUDA_AD_TCS_SMEM=122880: worse, removed; NOTES (ab).)
if [[ " $SECTIONS " == *" 24 "* ]]; then
    op_test cuda_attention_decode_early_bits tcse
    for rep in 1 2; do
        for m in "llama3-8b" "llama3-8b --quant q4" "gemma4-e4b --quant q4"; do
            [ $rep = 2 ] && [ "$m" = "gemma4-e4b --quant q4" ] && continue
            for e in "TERN_CUDA_AD_TCS=0" "TERN_LONG_KEYS=1" "TERN_LONG_KEYS=1 TERN_CUDA_AD_TCS_EARLY=0"; do
                [ $rep = 2 ] && [ "$e" = "TERN_LONG_KEYS=1 TERN_CUDA_AD_TCS_EARLY=0" ] && continue
                say "b1 $m $e rep $rep: $(b1e "$e" 512 "$m")"
            done
        done
    done
    for e in "TERN_CUDA_AD_TCS=0" "TERN_CUDA_AD_TCS=1"; do
        say "b1 8k llama3-8b q4 $e: $(b1e "$e" 8192 "llama3-8b --quant q4")"
    done
fi

# 25. The long-context class (session 19: TCS by default from TERN_LONG_KEYS = 2048 keys): where the split tensor-core
#     kernel starts to win — b1 at 1k / 2k / 4k prompts with TCS never (TERN_CUDA_AD_TCS=0) and always
#     (TERN_LONG_KEYS=1), defaults at 512 and 8k; TCS at 512 with the GEMVs' L2 prefetch off (is what TCS loses the
#     PDL chain's early weight prefetch?); q4 batch decode at 64 (the one-pass tensor-core kernel's prologue moved)
if [[ " $SECTIONS " == *" 25 "* ]]; then
    op_test cuda_attention_decode_tc,cuda_attention_decode_tcs,cuda_attention_decode_early_bits long
    for ctx in 1024 2048 4096; do
        for m in "llama3-8b --quant q4" "llama3-8b"; do
            for e in "TERN_CUDA_AD_TCS=0" "TERN_LONG_KEYS=1"; do
                say "b1 $ctx $m $e: $(b1e "$e" $ctx "$m")"
            done
        done
    done
    for ctx in 512 8192; do
        say "b1 $ctx llama3-8b q4 default: $(b1e "" $ctx "llama3-8b --quant q4")"
    done
    for e in "TERN_CUDA_AD_TCS=0" "TERN_LONG_KEYS=1"; do
        say "b1 512 llama3-8b $e TERN_CUDA_GEMV_L2PF=0: $(b1e "$e TERN_CUDA_GEMV_L2PF=0" 512 llama3-8b)"
    done
    timeout 100 build/concurrency --random llama3-8b:q4 --device cuda --compute bf16 --conc 64 --prompt 128 --gen 128 \
        --requests 2 --system 16 > "$OUT/conc.txt" 2>&1
    say "concurrency llama3-8b:q4 64 default: $(grep '^csv,conc' "$OUT/conc.txt" | cut -d, -f5,9 | tr '\n' ' ')"
fi

# 26. TERN_CUDA_CARVE=P (every kernel's shared-memory carveout preference, session 19): do the SMs' configuration
#     changes between a step's kernels cost the PDL overlap (the split tensor-core attention asks for 228 KB, the
#     GEMVs get 100 KB, rope_kv 32 KB)? b1 at 512 with the default kernels and with TCS forced (TERN_LONG_KEYS=1),
#     each with no preference / 44 (~100 KB) / 100 (MaxShared); gemma4-e4b; 8k q4
if [[ " $SECTIONS " == *" 26 "* ]]; then
    for rep in 1 2; do
        for m in "llama3-8b" "llama3-8b --quant q4"; do
            for e in "TERN_LONG_KEYS=4096" "TERN_CUDA_CARVE=44" "TERN_CUDA_CARVE=100" "TERN_LONG_KEYS=1" \
                     "TERN_LONG_KEYS=1 TERN_CUDA_CARVE=100"; do
                say "b1 512 $m $e rep $rep: $(b1e "$e" 512 "$m")"
            done
        done
    done
    for e in "TERN_LONG_KEYS=4096" "TERN_CUDA_CARVE=44" "TERN_CUDA_CARVE=100"; do
        say "b1 512 gemma4-e4b q4 $e: $(b1e "$e" 512 "gemma4-e4b --quant q4")"
    done
    for e in "TERN_LONG_KEYS=4096" "TERN_CUDA_CARVE=100"; do
        say "b1 8k llama3-8b q4 $e: $(b1e "$e" 8192 "llama3-8b --quant q4")"
    done
fi

# 27. TERN_CUDA_G1_EARLY=1 (session 20): gemv1's BF16 / F16 / Q8 instances load each warp's first round of weights
#     before pdl_wait, as gemv_mma.cu does for Q4 (the bf16 b1 GEMVs ramp up while the previous kernel drains). Op
#     tests (fused and norm_matmul bits with it on), parity + greedy ids on / off, then b1 interleaved
if [[ " $SECTIONS " == *" 27 "* ]]; then
    op_test cuda_fused_matmuls,cuda_norm_matmul,cuda_norm_matmul_res,cuda_gemv1_batch_invariant g1e
    on_checks TERN_CUDA_G1_EARLY bf16 "llama3 gemma4_e2b_like"
    for rep in 1 2; do
        for m in "llama3-8b" "gemma4-12b" "llama3-8b --quant q8" "gemma4-e4b"; do
            for e in "TERN_CUDA_G1_EARLY=0" "TERN_CUDA_G1_EARLY=1"; do
                say "b1 512 $m $e rep $rep: $(b1e "$e" 512 "$m")"
            done
        done
    done
    for e in "TERN_CUDA_G1_EARLY=0" "TERN_CUDA_G1_EARLY=1"; do
        say "b1 8k llama3-8b $e: $(b1e "$e" 8192 "llama3-8b")"
    done
fi

# 28. TERN_CUDA_G1_EARLY per launch mode (a mask: 1 plain = q|k|v and heads, 2 residual = o and down, 4 pair =
#     gate|up; 7 all — section 27 ran 7: q8 +9.5 %, e4b +5 %, 12b +1.7 %, llama3-8b bf16 -1 %) and TERN_CUDA_QKV_ROPE=1
#     (ops.h norm_qkv_rope_kv: llama's q|k|v GEMV with rope_kv_write in its epilogue, one launch fewer a layer):
#     op test, parity + greedy ids on / off, then b1 interleaved
if [[ " $SECTIONS " == *" 28 "* ]]; then
    op_test cuda_norm_qkv_rope_kv,cuda_fused_matmuls qkvr
    on_checks TERN_CUDA_QKV_ROPE bf16 "llama3"
    for rep in 1 2; do
        for e in "TERN_CUDA_G1_EARLY=0" "TERN_CUDA_G1_EARLY=1" "TERN_CUDA_G1_EARLY=2" "TERN_CUDA_G1_EARLY=4" \
                 "TERN_CUDA_G1_EARLY=7" "TERN_CUDA_QKV_ROPE=1" "TERN_CUDA_QKV_ROPE=1 TERN_CUDA_G1_EARLY=1"; do
            say "b1 512 llama3-8b $e rep $rep: $(b1e "$e" 512 llama3-8b)"
        done
    done
    for e in "TERN_CUDA_G1_EARLY=0" "TERN_CUDA_G1_EARLY=1" "TERN_CUDA_G1_EARLY=2" "TERN_CUDA_G1_EARLY=4" "TERN_CUDA_G1_EARLY=7"; do
        say "b1 512 llama3-8b q8 $e: $(b1e "$e" 512 "llama3-8b --quant q8")"
    done
    for e in "TERN_CUDA_QKV_ROPE=0" "TERN_CUDA_QKV_ROPE=1"; do
        say "b1 8k llama3-8b $e: $(b1e "$e" 8192 llama3-8b)"
    done
fi

# 29. Session 20's defaults as first written (TERN_CUDA_G1_EARLY=7, TERN_CUDA_QKV_ROPE=3: also the Q4 GEMV's split-K
#     epilogue) against the old ones, b1 interleaved (AB_REPS reps, default 1); q4 also with the rope on gemv1 only
#     (=1). Ran in session 20 (NOTES (ad)): EARLY 7 stayed the default; the Q4 rope tied at 512 and lost 1.5 % at 8k,
#     so the default is QKV_ROPE=1 (the "TERN_CUDA_G1_EARLY=7" rows below ran with the old default 3). Sections 27-29
#     ran in session 20 (NOTES (ad)); a section 30 (TERN_CUDA_GEMV_CL, the Q4 walk's split K summed through a cluster)
#     ran there too, lost 5 % and was removed with its code (docs/CUDA.md, "Tried and removed")
if [[ " $SECTIONS " == *" 29 "* ]]; then
    op_test cuda_norm_qkv_rope_kv qkvr4
    OLD="TERN_CUDA_G1_EARLY=0 TERN_CUDA_QKV_ROPE=0"
    for rep in $(seq "${AB_REPS:-1}"); do
        for m in "llama3-8b" "llama3-8b --quant q4" "llama3-8b --quant q8" "gemma4-12b" "gemma4-e4b"; do
            for e in "$OLD" "TERN_CUDA_G1_EARLY=7"; do
                say "b1 512 $m [$e] rep $rep: $(b1e "$e" 512 "$m")"
            done
            [ "$m" = "llama3-8b --quant q4" ] && say "b1 512 $m [TERN_CUDA_QKV_ROPE=1] rep $rep: $(b1e "TERN_CUDA_QKV_ROPE=1" 512 "$m")"
        done
    done
    [ "${AB_8K:-1}" = 1 ] && for e in "$OLD" "TERN_CUDA_G1_EARLY=7"; do
        say "b1 8k llama3-8b q4 [$e]: $(b1e "$e" 8192 "llama3-8b --quant q4")"
    done
fi

# 31. TERN_CUDA_PF_ATT (session 21: the o GEMV prefetching its weights into L2 during the one-row attention) ran in
#     session 21 (NOTES (af)): within ±1 %, removed with its code.
# 32. moe_blas.cu (session 21: a prefill chunk's expert MLPs as cuBLAS grouped GEMMs; TERN_MOE_BLAS, default on):
#     op test, parity bf16 with every eager MoE call on it, then gemma4-26b-a4b bf16 prefill off / on (AB_REPS reps)
if [[ " $SECTIONS " == *" 32 "* ]]; then
    op_test cuda_moe_blas,cuda_moe_grouped moeb
    TERN_MOE_GROUPED=1 TERN_MOE_BLAS_MIN=1 TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=bf16 timeout 150 \
        build/tests/test_parity_core > "$OUT/parity_moeb.log" 2>&1
    say "parity bf16 (MoE through moe_blas): $(grep -c '^PASS' "$OUT/parity_moeb.log") passed, $(grep -c '^FAIL' "$OUT/parity_moeb.log") failed"
    grep '^FAIL' "$OUT/parity_moeb.log" | head -5 | tee -a "$S"
    for rep in $(seq "${AB_REPS:-2}"); do
        for e in "TERN_MOE_BLAS=0" "TERN_MOE_BLAS=1"; do
            env $e timeout 150 $T bench --random gemma4-26b-a4b --device cuda --prompt 512,2048,8192 --gen 4 --reps 1 \
                > "$OUT/moeb.txt" 2>&1
            say "26b-a4b bf16 [$e] rep $rep pp tok/s 512,2k,8k: $(grep '^csv,' "$OUT/moeb.txt" | cut -d, -f6 | tr '\n' ' ')"
        done
    done
fi
# 33. the gemma4-26b-a4b prefill projections alone, 2048 rows, bf16 mode (p: precise, as Gemma 4's q / k), with
#     cuBLASLt's heuristic answers 0..3 (TERN_LT_PICK). Ran in session 22 (NOTES (ai)): q 4096x2816p 166-174 µs, answers
#     1-3 within 7 %; (af)'s 721 µs was host time in the eager profile.
if [[ " $SECTIONS " == *" 33 "* ]]; then
    for p in 0 1 2 3; do
        say "TERN_LT_PICK=$p:"
        TERN_LT_PICK=$p timeout 60 build/bench_cuda --gemm 4096x2816p 2048x2816p 8192x2816p 1024x2816p 4096x2816 2816x4096 \
            2>&1 | grep '^gemm' | tr -s ' ' | tee -a "$S"
    done
fi

# 34. prefill where it stands (session 22: the glue kernels, the experts' padded strided batches): the dense and MoE
#     bf16 models at 512 / 2k / 2k again (warm: the first run of a length loads its kernels) / 8k, TERN_MOE_PAD and
#     TERN_CUDA_NRK_WARP off / on for 26b, then the per-kernel table of one 2048-row 26b chunk (ncu durations)
if [[ " $SECTIONS " == *" 34 "* ]]; then
    for rep in $(seq "${AB_REPS:-1}"); do
        for me in "gemma4-26b-a4b TERN_MOE_PAD=0" "gemma4-26b-a4b TERN_MOE_PAD=1" "gemma4-26b-a4b TERN_CUDA_NRK_WARP=0" \
                  "gemma4-12b TERN_CUDA_NRK_WARP=1" "llama3-8b TERN_MOE_PAD=1"; do
            set -- $me
            env "$2" timeout 150 $T bench --random "$1" --device cuda --prompt 512,2048,2048,8192 --gen 1 --reps 1 \
                > "$OUT/pp.txt" 2>&1
            say "$1 bf16 [$2] rep $rep pp tok/s 512,2k,2k,8k: $(grep '^csv,' "$OUT/pp.txt" | cut -d, -f6 | tr '\n' ' ')"
        done
    done
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for m in ${AB_NCU_MODELS:-gemma4-26b-a4b}; do
        timeout 200 "$NCU" --cache-control none --clock-control none --csv --print-units base --metrics gpu__time_duration.sum \
            $T bench --random "$m" --device cuda --prompt 2048 --gen 1 --reps 1 --warmup 0 > "$OUT/ncu_pp_$m.csv" 2>&1
        say "ncu $m 2048-row chunk:"
        python3 scripts/ncu_step.py "$OUT/ncu_pp_$m.csv" --from embed_kernel | head -${AB_NCU_ROWS:-30} | tee -a "$S"
    done
fi

# 35. session 23's switches, written or changed after its last device call: the materialized d-512 attention with key
#     counts padded to 1024 (TERN_CUDA_ATTN_MAT, opt-in until this wins at 8k too), the bf16 MLP (TERN_CUDA_MLP_BF16)
#     rmsnorm_add's many-row launch alone (TERN_CUDA_RMS_VPT) and the residual prologue folded into the many-row
#     pre-norm (TERN_CUDA_NORM_RES_N, opt-in); prefill at 512 / 2k / 2k again / 8k / 16k. Ran in session 24 (NOTES (ak)).
if [[ " $SECTIONS " == *" 35 "* ]]; then
    TERN_TEST_ONLY=cuda_attention_mat,cuda_rmsnorm_vpt,cuda_fused_rmsnorm_add,cuda_norm_gemm_res,cuda_norm_mlp timeout 90 build/test_cuda_ops > "$OUT/ops35.txt" 2>&1
    say "op tests rc $?: $(grep -E '^(PASS|FAIL)' "$OUT/ops35.txt" | tr '\n' ' ')"
    for rep in $(seq "${AB_REPS:-2}"); do
        for me in "gemma4-26b-a4b TERN_CUDA_ATTN_MAT=0" "gemma4-26b-a4b TERN_CUDA_ATTN_MAT=1" "gemma4-12b TERN_CUDA_ATTN_MAT=0" \
                  "gemma4-12b TERN_CUDA_ATTN_MAT=1" "gemma4-12b TERN_CUDA_MLP_BF16=0" "gemma4-26b-a4b TERN_CUDA_RMS_VPT=0" \
                  "gemma4-26b-a4b TERN_CUDA_NORM_RES_N=1"; do
            set -- $me
            env "$2" timeout 150 $T bench --random "$1" --device cuda --prompt 512,2048,2048,8192,16384 --gen 1 --reps 1 \
                > "$OUT/pp.txt" 2>&1
            say "$1 bf16 [$2] rep $rep pp tok/s 512,2k,2k,8k,16k: $(grep '^csv,' "$OUT/pp.txt" | cut -d, -f6 | tr '\n' ' ')"
        done
    done
fi

# 36. prefill chunks of 2048 / 4096 / 8192 rows (`bench --chunk`, the engine's --max-batch-tokens) with gemm_scratch at
#     256 MB (default) and 1024 MB (TERN_CUDA_SCRATCH_MB): a 4096-row chunk's routed pairs fit one MoE pass only in the
#     larger scratch, and ~256 rows an expert should turn the experts' strided batches compute-bound (at ~128 they are
#     bound by reading the weights: NOTES (ak)); the dense GEMMs get more rows too. Decides the GPU default chunk.
#     Also the MoE block's three rmsnorms in one launch (TERN_CUDA_NORM_N=1, off since session 11).
if [[ " $SECTIONS " == *" 36 "* ]]; then
    TERN_TEST_ONLY=cuda_moe_blas,cuda_moe_grouped timeout 90 build/test_cuda_ops > "$OUT/ops36.txt" 2>&1
    say "op tests rc $?: $(grep -E '^(PASS|FAIL)' "$OUT/ops36.txt" | tr '\n' ' ')"
    for rep in $(seq "${AB_REPS:-2}"); do
        for mc in "gemma4-26b-a4b 2048 256" "gemma4-26b-a4b 4096 256" "gemma4-26b-a4b 4096 1024" "gemma4-26b-a4b 8192 1024" \
                  "gemma4-26b-a4b 2048 256 TERN_CUDA_NORM_N=1" "gemma4-12b 2048 256" "gemma4-12b 4096 1024" \
                  "llama3-8b 2048 256" "llama3-8b 4096 1024"; do
            set -- $mc
            env TERN_CUDA_SCRATCH_MB=$3 ${4:-TERN_AB_NONE=1} timeout 150 $T bench --random "$1" --device cuda --prompt 2048,8192,8192,16384 --gen 1 \
                --reps 1 --chunk "$2" > "$OUT/pp.txt" 2>&1
            say "$1 bf16 chunk $2 scratch $3 MB ${4:-} rep $rep pp tok/s 2k,8k,8k,16k: $(grep '^csv,' "$OUT/pp.txt" | cut -d, -f6 | tr '\n' ' ')"
        done
    done
fi

# 37. batch decode of bf16 weights (~0.63 of its floor at 64 sequences, target 0.75; ncu in session 16: cuBLASLt at
#     3.0-3.6 TB/s there): every cuBLASLt GEMM takes the heuristic's answer N instead of its first (TERN_LT_PICK), at 64
#     and 128 sequences. A win here names the algorithm to pin per shape (lt_gemm's cache) — written in session 25.
if [[ " $SECTIONS " == *" 37 "* ]]; then
    conc_ab "TERN_LT_PICK=0;TERN_LT_PICK=1;TERN_LT_PICK=2;TERN_LT_PICK=3" llama3-8b 64,128
fi

# ltsweep_sum FILE "n ...": bench_cuda --ltsweep at those rows into $OUT/FILE.txt; per shape and n the heuristic's first
# answer and the fastest into the summary (what a per-shape pin would take)
ltsweep_sum() {
    timeout 240 build/bench_cuda --ltsweep $2 > "$OUT/$1.txt" 2>&1
    say "ltsweep rc $?: $(grep -c '^ltsweep' "$OUT/$1.txt") lines; per shape and n: first answer, then the fastest"
    grep '^ltsweep' "$OUT/$1.txt" | awk '{ k = $0; sub(/ +#.*/, "", k); us = $0; sub(/.*# *[0-9]+ +/, "", us); us += 0;
        if (!(k in first)) { first[k] = $0; order[++nk] = k }
        if (!(k in best) || us < bu[k]) { best[k] = $0; bu[k] = us } }
        END { for (i = 1; i <= nk; i++) { print "  " first[order[i]]; print "  " best[order[i]] } }' | tee -a "$S"
}

# 38. bf16 batch decode, written in session 26: (a) every cuBLASLt heuristic answer for llama3-8b's decode GEMMs at
#     32 / 64 / 128 rows (bench_cuda --ltsweep; the fastest per shape, its rank and configuration, into the summary:
#     what a per-shape rule would pin), (b) the MLP's bf16 form (norm_mlp: gate|up in bf16 rows, the act kernel, down
#     reading h) from 9 rows instead of 65 (TERN_CUDA_MLP_MIN), at 16 / 32 / 64 sequences.
if [[ " $SECTIONS " == *" 38 "* ]]; then
    ltsweep_sum ltsweep "${AB_SWEEP_N:-32 64 128}"
    conc_ab "TERN_CUDA_MLP_MIN=65;TERN_CUDA_MLP_MIN=9" llama3-8b 16,32,64
fi

# 39. bf16 batch decode, written in session 26 after section 38: q|k|v at 9..64 rows on sgemm.cu (TERN_CUDA_SGEMM=1, the
#     default since session 9) or as cuBLASLt's q GEMM + k|v strided batch (=0): section 38's sweep timed the latter at
#     12.5 + 10.1 µs at 64 rows against sgemm's 24.3 in session 18 (bench_cuda --sgemm times both here); and Gemma 4's
#     MLP at 32 / 64 sequences with norm_mlp from 32 rows (the new default) or 65 (before).
if [[ " $SECTIONS " == *" 39 "* ]]; then
    timeout 120 build/bench_cuda --sgemm > "$OUT/sgemm.txt" 2>&1
    say "bench_cuda --sgemm rc $?:"; grep -E '^fused q\|k\|v' "$OUT/sgemm.txt" | tr -s ' ' | tee -a "$S"
    conc_ab "TERN_CUDA_SGEMM=1;TERN_CUDA_SGEMM=0;TERN_CUDA_SGEMM_ROWS=16" llama3-8b 16,32,64
    AB_REPS=1 conc_ab "TERN_CUDA_MLP_MIN=65;TERN_CUDA_MLP_MIN=32" gemma4-12b 32,64
fi

# 40. batch decode attention (attn_decode_tc.cu) at 64 llama3-8b sequences: 512 blocks of 4 warps run in two waves of
#     2 blocks per SM (22 µs a layer for ~50 MB of K/V, NOTES (y)); TERN_CUDA_AD_TC_ST=3 builds them of 2 warps with 3
#     ring stages (4 blocks per SM: one wave of 528), =4 of 2 warps with 2 stages (5 per SM). Written in session 26;
#     the op test first (every variant against the CPU). Ran there (NOTES (am)): 2 × 2 won at 64, lost at 32, tied at
#     128, so the default (0) is now auto (2 × 2 past one wave of the built-in shape) and 1 forces the built-in one.
if [[ " $SECTIONS " == *" 40 "* ]]; then
    op_test cuda_attention_decode_tc tc40
    grep 'err attention decode tc' "$OUT/tc40_ops.txt" | awk '{ print $NF }' | sort -g | tail -1 | sed 's/^/  worst /' | tee -a "$S"
    conc_ab "TERN_CUDA_AD_TC_ST=1;TERN_CUDA_AD_TC_ST=0;TERN_CUDA_AD_TC_ST=3" llama3-8b 32,64,128
fi

# 41. q|k|v as one matrix for many rows (TERN_CUDA_QKV_ONE=1; written in session 26 after its last device call): the
#     three weights joined at load, one cuBLASLt GEMM (17.7 µs for llama3-8b at 64 rows in section 38's sweep, against
#     sgemm.cu's 24.3) and rope_kv_rows. The op test, model parity with it on (qwen2 / qwen3 / llama3 take it in their
#     prefill rows; greedy ids may differ from off in bf16: another summation order), then batch decode.
if [[ " $SECTIONS " == *" 41 "* ]]; then
    op_test cuda_qkv_one qkv41
    grep 'err qkv_one' "$OUT/qkv41_ops.txt" | head -12 | tee -a "$S"
    on_checks TERN_CUDA_QKV_ONE bf16 "llama3 qwen2"
    conc_ab "TERN_CUDA_QKV_ONE=0;TERN_CUDA_QKV_ONE=1" llama3-8b 16,32,64,128
fi

# 42. session 27: q|k|v as one matrix is the default from 32 rows (section 41 won on the H100 at 64 / 128: NOTES (an));
#     TERN_CUDA_QKV_ONE_MIN=9 asks whether it also wins below 32 (against sgemm.cu's one launch), and the attention
#     handing the o GEMM its bf16 input (ops.h attention_o, TERN_CUDA_ATT_O, default on) against off; b1 with the
#     joined weights off / on (the GEMVs read the same bytes, now adjacent). Op tests first.
if [[ " $SECTIONS " == *" 42 "* ]]; then
    op_test cuda_qkv_one,cuda_attention_o,cuda_attention_decode_tc,cuda_norm_qkv_rope_kv,cuda_batch_fused ops42
    grep -E 'err (qkv_one|attention_o)' "$OUT/ops42_ops.txt" | head -12 | tee -a "$S"
    on_checks TERN_CUDA_ATT_O bf16 "llama3 qwen2"
    b1_ab TERN_CUDA_QKV_ONE "0 1" "llama3-8b"
    AB_REPS=1 AB_CONC=16,32 conc_ab "TERN_CUDA_QKV_ONE_MIN=32;TERN_CUDA_QKV_ONE_MIN=9" llama3-8b 16,32
    AB_CONC=64,128 conc_ab "TERN_AB_NONE=1;TERN_CUDA_ATT_O=0;TERN_CUDA_QKV_ONE=0" llama3-8b 64,128
fi

# 43. session 27, after section 42: Gemma 4's o = wo·att through attention_o too (add = 0; its sliding layers' batch
#     decode attention is attn_decode_tc.cu at D 256, the global ones write f32 and are staged), op test, parity with
#     it, then gemma4-12b batch decode with TERN_CUDA_ATT_O off / on.
if [[ " $SECTIONS " == *" 43 "* ]]; then
    op_test cuda_attention_o ops43
    on_checks TERN_CUDA_ATT_O bf16 "gemma4_dense gemma4_e2b_like"
    conc_ab "TERN_CUDA_ATT_O=0;TERN_CUDA_ATT_O=1" gemma4-12b 64
fi

# 44. session 28: wgemm.cu (TERN_CUDA_WGEMM=1: the one-matrix bf16 GEMMs of 17..128 rows on TMA + wgmma, K split
#     over a cluster): its op test, bench_cuda --wgemm (µs against cuBLASLt as graphs, output difference), parity
#     and greedy ids with it, then llama3-8b batch decode with it off / on.
if [[ " $SECTIONS " == *" 44 "* ]]; then
    op_test cuda_wgemm ops44
    timeout 200 build/bench_cuda --wgemm ${WGEMM_N:-32 64 128} > "$OUT/wgemm_bench.txt" 2>&1
    grep '^wgemm' "$OUT/wgemm_bench.txt" | tee -a "$S"
    [ -n "${WGEMM_CHECKS-1}" ] && on_checks TERN_CUDA_WGEMM bf16 "llama3 qwen2"
    conc_ab "TERN_CUDA_WGEMM=0;TERN_CUDA_WGEMM=1" llama3-8b "32,64,128"
fi

# 45. session 34, written after its last call: TERN_CUDA_GEMV_RMSU (default 1; gemv_mma's pre-norm sum of squares
#     with a thread's loads issued together instead of 16 dependent L2 round trips a block at K 4096; the same bits).
#     Op tests that run it both ways bitwise against rmsnorm + the op, parity and greedy ids with it, then b1 q4
#     llama3-8b and gemma4-12b with it off / on (interleaved, two reps). Keep 1 only if it wins (NOTES (at)).
if [[ " $SECTIONS " == *" 45 "* ]]; then
    op_test cuda_norm_matmul,cuda_gemv_mma,cuda_norm_qkv_rope_kv ops45
    on_checks TERN_CUDA_GEMV_RMSU bf16 "gemma4_dense_q4g64 gemma4_moe_mixed"
    q4_b1 TERN_CUDA_GEMV_RMSU "0 1"
fi

# 46. session 35 (RMSU won in 45: NOTES (au)): the rest of the pre-norm prologues' serial loads. TERN_CUDA_GEMV_XSM
#     (gemv_mma: the slice's normalised x formed once into shared memory, then the B table, Σx and block 0's writes
#     read it there) on b1 q4; TERN_CUDA_G1_XB (gemv1: the residual and norm passes load 4 float4s a thread
#     together) on b1 bf16. Both the same bits; op tests run each both ways.
if [[ " $SECTIONS " == *" 46 "* ]]; then
    op_test cuda_norm_matmul,cuda_norm_matmul_res,cuda_matmul_act_mul,cuda_norm_qkv_rope_kv ops46
    on_checks TERN_CUDA_GEMV_XSM bf16 "gemma4_dense_q4g64 gemma4_moe_mixed"
    on_checks TERN_CUDA_G1_XB bf16 "gemma4_dense llama3"
    q4_b1 TERN_CUDA_GEMV_XSM "0 1"
    b1_ab TERN_CUDA_G1_XB "0 1" "gemma4-e4b;llama3-8b;gemma4-26b-a4b"
    if [ -n "${AB_NCU-1}" ]; then # one q4 decode step's kernels with both on (scripts/ncu_step.py reads it)
        TERN_CUDA_GEMV_XSM=1 TERN_CUDA_G1_XB=1 timeout 200 /usr/local/cuda/bin/ncu --graph-profiling node \
            --cache-control none --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
            $T bench --random llama3-8b --quant q4 --device cuda --prompt 64 --gen 3 --reps 1 --warmup 0 \
            > "$OUT/ncu_q4.csv" 2>&1
        python3 scripts/ncu_step.py "$OUT/ncu_q4.csv" 2>&1 | head -30 | tee -a "$S"
        xz -f "$OUT/ncu_q4.csv"
    fi
fi

# 47. session 35 after 46 (XSM lost and was removed, G1_XB won: default now). Op tests of the final tree, parity
#     with the defaults, then whether RMSU moved the Q4 walk's best chunks per K slice (TERN_MM_J: 0 the planner's,
#     1-4 forced for every matrix) or the head's blocks per SM (TERN_CUDA_GEMV_OCC: 0 the planner's, 2).
if [[ " $SECTIONS " == *" 47 "* ]]; then
    op_test cuda_norm_matmul,cuda_norm_matmul_res,cuda_matmul_act_mul,cuda_norm_qkv_rope_kv,cuda_gemv_mma ops47
    for comp in f32 bf16; do
        TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$comp timeout 120 build/tests/test_parity_core > "$OUT/parity_$comp.log" 2>&1
        say "defaults parity $comp: $(grep -c '^PASS' "$OUT/parity_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity_$comp.log") failed"
    done
    q4_b1 TERN_MM_J "0 1 2 3 4"
    q4_b1 TERN_CUDA_GEMV_OCC "0 2"
fi

# 48. session 35 after 47 (the planner's J won against every forced J; the heads at two blocks an SM edged three by
#     0.5 % on llama3-8b and gemma4-12b): the head's blocks per SM again, on the four q4 models.
if [[ " $SECTIONS " == *" 48 "* ]]; then
    b1_ab TERN_CUDA_GEMV_OCC "0 2" "llama3-8b --quant q4;gemma4-12b --quant q4;gemma4-e4b --quant q4;gemma4-26b-a4b --quant q4"
fi

# 49. session 35, written after its last device call: TERN_CUDA_NRK_HOIST (default 1, untimed): Gemma 4's head norms +
#     rope + cache stores (fused.cu norm_rope_kv_warp, decode steps) load the norm weight, the rope frequencies and v with
#     x instead of after the sum of squares and the q / k stores (4-8 dependent L2 trips for the frequencies, one for
#     v). Same bits: the op test runs both ways. Keep 1 only if it wins on the Gemma 4 models (b1 bf16 and q4).
if [[ " $SECTIONS " == *" 49 "* ]]; then
    op_test cuda_norm_rope_kv ops49
    on_checks TERN_CUDA_NRK_HOIST bf16 "gemma4_dense gemma4_e2b_like"
    b1_ab TERN_CUDA_NRK_HOIST "0 1" "gemma4-e4b;gemma4-26b-a4b;gemma4-12b;gemma4-e4b --quant q4"
fi

# 50. session 36: TERN_CUDA_ROPE_HOIST: rope_kv_kernel's k threads loading v, slot and the block-table entry before
#     their first store. Ran in session 36 (NOTES (av)): a tie, removed with its code (the variable now changes
#     nothing: both arms of its A/B run the same binary, kept as the record); QKV_ROPE=3 +0.8 % at 512 but −1.9 % at
#     8k, stays opt-in.
if [[ " $SECTIONS " == *" 50 "* ]]; then
    op_test cuda_fused_rope_kv_write ops50
    on_checks TERN_CUDA_ROPE_HOIST bf16 "llama3 qwen2"
    b1_ab TERN_CUDA_ROPE_HOIST "0 1" "llama3-8b --quant q4;llama3-8b --quant q4"
    b1_ab TERN_CUDA_QKV_ROPE "1 3" "llama3-8b --quant q4"
fi

# 51. session 36, ran in session 37 (NOTES (aw): the fix holds, 32 rows +60 %; the defaults stay): Gemma 4 batch decode steps slower at some row counts than at more (NOTES (av): gemma4-e4b
#     q4 10.2 ms a step at 32 rows vs 7.3 at 64, gemma4-26b-a4b q4 18.5 vs 10.6; e4b bf16 6.4 at 8 rows vs 5.7 at 32).
#     Found by reading after the call, fixed untimed: qgemm.cu raised its 64-row tiles' shared memory at its first
#     17..64-row call unless a graph was being recorded — and a <= 32-row step is recorded at first sight, so Gemma 4's
#     precise q / k projections got the n-row CUDA-core GEMV baked into the graph. Now raised at open. The defaults'
#     32-row q4 figures below should sit between the 8- and 64-row ones; if they do, the other switches only confirm.
#     Where the several-row paths change: the Q4 kernels at 32 rows (qgemm_q4.cu's 32-row tiles, its wgmma form), the
#     BF16 one at 8 (qgemm.cu up to TERN_CUDA_QGEMM_MAX_N_BF16 rows, cuBLASLt above); then per-op GPU time of a 32- and
#     a 64-row step (TERN_CUDA_PROFILE=1: eager, unfused ops; the table is on stderr).
if [[ " $SECTIONS " == *" 51 "* ]]; then
    AB_REPS=1 AB_CONC=32,64 conc_ab "TERN_CUDA_QG4=1;TERN_CUDA_QG4_WG=0;TERN_CUDA_QG4_MAX_N=16" "gemma4-e4b:q4 gemma4-26b-a4b:q4"
    AB_REPS=1 AB_CONC=8,16,32 conc_ab "TERN_CUDA_QGEMM_MAX_N_BF16=8;TERN_CUDA_QGEMM_MAX_N_BF16=1" "gemma4-e4b"
    for c in 32 64; do
        TERN_CUDA_PROFILE=1 timeout 100 build/concurrency --random gemma4-e4b:q4 --device cuda --compute bf16 --conc $c \
            --prompt 128 --gen 128 --requests 2 --system 16 > "$OUT/prof51_$c.txt" 2>&1
        say "profile e4b q4 at $c rows: $(grep -c '' "$OUT/prof51_$c.txt") lines in prof51_$c.txt"
    done
fi

# 52. ran in session 37 (NOTES (aw)): batch-1 decode over every MLX width (issue 4 asks for GEMVs near bandwidth at bits 2-8; q4 and q8 are
#     the only ones in PERFORMANCE.md), llama3-8b and gemma4-12b, one rep each (~2 min)
if [[ " $SECTIONS " == *" 52 "* ]]; then
    for m in llama3-8b gemma4-12b; do
        for q in q2 q3 q5 q6 q8; do
            timeout 90 $T bench --random $m --quant $q --device cuda --prompt 512 --gen 64 --reps 1 > "$OUT/b1w_${m}_$q.txt" 2>&1
            say "b1 $m --quant $q: $(grep '^csv,' "$OUT/b1w_${m}_$q.txt" | cut -d, -f7,10 | tail -1)"
        done
    done
fi

# 53. session 37: D 512 batch decode attention on tensor cores (TERN_CUDA_AD_TC512, default on; NOTES (aw)): the op test,
#     the kernel alone at the global layers' shapes (26b-a4b 16 / 2, e4b 8 / 2, 12b 16 / 1) and batch decode on / off
if [[ " $SECTIONS " == *" 53 "* ]]; then
    op_test cuda_attention_decode_tc ops53
    for n in 32 64 128; do
        for c in "16 2 512" "8 2 512" "16 1 512"; do
            for v in 0 1; do
                say "attn-dec1 192 keys $n rows [$c] TC512=$v: $(TERN_CUDA_AD_TC512=$v timeout 60 build/bench_cuda --attn-dec1 192 $n bf16 1 $c | grep '^csv' | cut -d, -f3)"
            done
        done
    done
    AB_REPS=2 AB_CONC=32,64 conc_ab "TERN_CUDA_AD_TC512=0;TERN_CUDA_AD_TC512=1" "gemma4-26b-a4b:q4 gemma4-12b"
fi

# 54. session 38: the other MLX widths' one-row GEMVs on XP1's tensor-core walk (TERN_CUDA_GEMV_WIDE, default 1;
#     gemv_mma.cuh mm_decode_w): op test, per-shape GEMV times (mma = the walk, gemv1 = before), parity with it on,
#     and batch-1 decode with it off / on (llama3-8b q2 / q3 / q5 / q6, gemma4-12b q3 / q6), one rep interleaved
if [[ " $SECTIONS " == *" 54 "* ]]; then
    op_test cuda_gemv_mma_wide,cuda_fused_matmuls,cuda_norm_matmul ops54
    TERN_CUDA_GEMV_XP1=1 BENCH_GEMV1=wide timeout 150 build/bench_cuda > "$OUT/gemv_wide.txt" 2>&1
    say "gemv wide (µs, GB/s):"; grep -E '^\[(mma|gemv1)\]' "$OUT/gemv_wide.txt" | tr -s ' ' | tee -a "$S"
    on_checks TERN_CUDA_GEMV_WIDE bf16 "gemma4_moe_mixed"
    b1_ab TERN_CUDA_GEMV_WIDE "0 1" "llama3-8b --quant q3;llama3-8b --quant q6;llama3-8b --quant q2;llama3-8b --quant q5;gemma4-12b --quant q3"
fi

# 55. session 38, after 54: Q8 on XP1's walk with f16 MMAs (TERN_CUDA_GEMV_Q8X, default 1; mm_stage_q8x) and XP1's Σx
#     of the bf16-rounded x (a fix: FOLD's 128·s·Σx did not cancel the MMAs' 128s, ~4 % rel L2 at Q4): op tests,
#     per-shape times (mma = Q8X for q8), batch-1 decode q8 with Q8X off / on, and q4 with the fix (one rep)
if [[ " $SECTIONS " == *" 55 "* ]]; then
    op_test cuda_gemv_mma_wide,cuda_gemv_mma_xp1_rounded,cuda_gemv_mma_xp1,cuda_gemv_mma,cuda_gemv_mma_pp_bits,cuda_gemv_mma_fold,cuda_norm_matmul ops55
    TERN_CUDA_GEMV_XP1=1 BENCH_GEMV1=wide timeout 150 build/bench_cuda > "$OUT/gemv_wide55.txt" 2>&1
    say "gemv (µs, GB/s):"; grep -E '^\[(mma|gemv1)\] gemv q[48]' "$OUT/gemv_wide55.txt" | tr -s ' ' | tee -a "$S"
    b1_ab TERN_CUDA_GEMV_Q8X "0 1" "llama3-8b --quant q8;gemma4-12b --quant q8"
    for m in llama3-8b gemma4-12b gemma4-e4b; do
        say "b1 $m q4 (Σx fix): $(b1e "" 512 "$m --quant q4")"
    done
fi

# 56. session 39: 2..8 rows of the other MLX widths on tensor cores (gemv_xr.cu gemv_xrw_kernel, TERN_CUDA_GEMV_XRW,
#     default 1; before: qgemm.cu): op tests, per-shape times (bench_cuda --xrw: xr = the new kernel, qgemm = before,
#     before = the one-row GEMV at n = 1), parity with it on, batch decode at 2 / 4 / 8 sequences off / on
if [[ " $SECTIONS " == *" 56 "* ]]; then
    op_test cuda_gemv_xr_wide,cuda_gemv_xr,cuda_gemv_mma_wide ops56
    timeout 240 build/bench_cuda --xrw > "$OUT/xrw56.txt" 2>&1
    say "bmm (µs):"; grep -E '^bmm' "$OUT/xrw56.txt" | tr -s ' ' | cut -d' ' -f2-7 | tee -a "$S"
    for comp in bf16; do
        TERN_CUDA_GEMV_XRW=1 TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$comp timeout 120 build/tests/test_parity_core \
            > "$OUT/parity56_$comp.log" 2>&1
        say "XRW=1 parity $comp: $(grep -c '^PASS' "$OUT/parity56_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity56_$comp.log") failed"
    done
    AB_REPS=${AB_REPS:-2} AB_CONC=2,4,8 conc_ab "TERN_CUDA_GEMV_XRW=0;TERN_CUDA_GEMV_XRW=1" "llama3-8b:q8 llama3-8b:q3 llama3-8b:q6"
fi

# 57. session 39, after 56: its op tests again (Q8 g32's unbuilt rows out of the bound) and the small-matrix bound
#     (matrices under 2^25 codes keep qgemm.cu from 6 rows): batch decode at 6 / 8 sequences, one rep
if [[ " $SECTIONS " == *" 57 "* ]]; then
    op_test cuda_gemv_xr_wide,cuda_gemv_xr ops57
    AB_REPS=1 AB_CONC=6,8 conc_ab "TERN_CUDA_GEMV_XRW=0;TERN_CUDA_GEMV_XRW=1" "llama3-8b:q8 llama3-8b:q6"
fi

# 58. session 40: one-row decode attention on register-fed tensor cores (attn_decode_r1.cu, TERN_CUDA_AD_R1, opt-in until
#     timed; TERN_CUDA_AD_R1_W warps a block): op tests, the kernel alone (one row, llama3-8b heads) at 512 / 2048 keys,
#     batch-1 decode off / on (2 and 4 warps: 2 was removed after), and with no decode attention at all
#     (TERN_CUDA_AD_SKIP=1, a temporary measurement switch, removed after this ran: wrong outputs, the bound on what a
#     faster attention can give)
# attn_shape "NH NKV D" "settings;settings" KEYS...: the one-row kernel alone (bench_cuda --attn-dec1 KEYS 1 bf16 1 NH NKV
# D), µs and GB/s per setting; attn1 "settings;..." KEYS...: the same with llama3-8b's heads
attn_shape() {
    local sh=$1 sets k v
    IFS=';' read -ra sets <<< "$2"
    shift 2
    for k in "$@"; do
        for v in "${sets[@]}"; do
            say "attn-dec1 [$sh] $k keys [$v]: $(env $v timeout 60 build/bench_cuda --attn-dec1 $k 1 bf16 1 $sh | grep '^csv' | cut -d, -f3,4)"
        done
    done
}
attn1() { attn_shape "32 8 128" "$@"; }
if [[ " $SECTIONS " == *" 58 "* ]]; then
    op_test cuda_attention_decode_r1,cuda_attention_decode_early_bits,cuda_attention_prefill_decode ops58
    attn1 "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=4" 512 2048
    b1_sets "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=4;TERN_CUDA_AD_SKIP=1" \
        "llama3-8b;llama3-8b --quant q4"
    AB_REPS=1 b1_sets "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_SKIP=1" "llama3-8b --quant q4" 2048
    AB_REPS=1 b1_sets "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_SKIP=1" "gemma4-e4b --quant q4"
fi

# 59. session 40, after 58 (R1 with 4 warps won +3.5 %, 2 warps in clusters of 16 tied; no attention at all +8.4 % bf16,
#     +17.6 % q4): the cluster merge with every remote load in flight, 8-warp blocks, clusters capped at 8 or 16
if [[ " $SECTIONS " == *" 59 "* ]]; then
    op_test cuda_attention_decode_r1 ops59
    R59="TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_SMAX=8;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=8"
    R59="$R59;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=8 TERN_CUDA_AD_R1_SMAX=8"
    attn1 "$R59;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=8 TERN_CUDA_AD_R1_SMAX=4" 512 2048
    b1_sets "$R59" "llama3-8b;llama3-8b --quant q4"
    AB_REPS=1 b1_sets "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=8;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=8 TERN_CUDA_AD_R1_SMAX=8" \
        "llama3-8b --quant q4;llama3-8b" 2048
fi

# 60. session 40, after 59 (R1 default on: 4 warps, clusters of up to 16): D 256 (Gemma 4's sliding layers, a warp pair a
#     chunk, each half of the dimensions) — op test, batch-1 decode of the Gemma 4 models off / on (4 and 8 warps), and a
#     few llama3-8b sequences (R1 takes launches of up to 4 rows)
if [[ " $SECTIONS " == *" 60 "* ]]; then
    op_test cuda_attention_decode_r1 ops60
    b1_sets "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1;TERN_CUDA_AD_R1=1 TERN_CUDA_AD_R1_W=8" \
        "gemma4-e4b --quant q4;gemma4-12b;gemma4-26b-a4b --quant q4"
    AB_REPS=1 AB_CONC=2,4 conc_ab "TERN_CUDA_AD_R1=0;TERN_CUDA_AD_R1=1" "llama3-8b llama3-8b:q4"
fi

# 61. session 40, after 60: D 512 (Gemma 4's global layers) on attn_decode_r1.cu (TERN_CUDA_AD_R1_512; ran: default
#     on): op test, batch-1 decode of gemma4-e4b / 26b-a4b q4 off / on
if [[ " $SECTIONS " == *" 61 "* ]]; then
    op_test cuda_attention_decode_r1 ops61
    b1_sets "TERN_CUDA_AD_R1_512=0;TERN_CUDA_AD_R1_512=1" "gemma4-e4b --quant q4;gemma4-26b-a4b --quant q4"
fi

# 64. session 41, after 63 (a b1 llama3-8b layer's launches cost, past their bytes at the copy rate: q|k|v 7.9 µs,
#     attention 6.7, gate|up 6.3, down 6.1, o 3.9): the q|k|v rope epilogue's step data (pos, slot, block table) read
#     before pdl_wait and its inv_freq with the task's weights (gemv1.cu, gemv_mma.cu; the same bits), gemv1's x staged
#     8 float4s a thread at a time (down: 2 round trips instead of 5): op tests, then b1 of the committed tree's
#     tern-core (packed as build/base/tern-core: GPU_PACK_BASE=that-tree/build/tern-core gpu_check.sh pack) against
#     this one (TERN_CUDA_PDL=1: the default, a label). TERN_CUDA_SKIP (section 63's probe: 1 q|k|v, 2 attention, 4 o,
#     8 gate|up, 16 down not issued) and TERN_CUDA_NWPF (the norm weights' lines into L1 before pdl_wait: a tie) ran in
#     session 41 and were removed (NOTES (ba))
if [[ " $SECTIONS " == *" 64 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_norm_qkv_rope_kv,cuda_fused_matmuls,cuda_norm_matmul,cuda_norm_matmul_res,cuda_matmul_act_mul,cuda_gemv_mma,cuda_attention_decode_r1 ops64
    b1_sets "BIN=build/base/tern-core;TERN_CUDA_PDL=1" "llama3-8b;llama3-8b --quant q4;gemma4-12b"
fi

# 65. session 42: the scheduler's pipelined decode (sched.c, TERN_ASYNC: a step of decode rows drawn on the device is
#     queued on the previous step's draws before their ids reach the host) off / on: batch decode of llama3-8b bf16 and
#     q4 at 1 / 8 / 64 sequences (128 + 128), the steps queued ahead as the runs report them
if [[ " $SECTIONS " == *" 65 "* ]]; then
    conc_ab "TERN_ASYNC=0;TERN_ASYNC=1" "${AB65_MODELS:-llama3-8b llama3-8b:q4}" 1,8,64
    for f in "$OUT"/conc_*TERN_ASYNC*; do say "  $(basename "$f"): $(grep '^steps' "$f" | tr '\n' ' ')"; done
fi

# 66. session 43: one step graph for both parities of the pipelined decode (graph.c: the copy nodes retargeted between
#     two pinned halves per launch) — the engine's pipeline test on cuda, the digest with every step pipelined, then
#     batch decode of llama3-8b bf16 and q4 at 1 / 8 / 64 sequences with the pipeline off and on from 1 row
#     (TERN_ASYNC_ROWS=1; session 42's two graphs a size lost 0.2-0.5 % at 1 and 8)
if [[ " $SECTIONS " == *" 66 "* ]]; then
    TERN_TEST_DEVICE=cuda TERN_LOG=warn timeout 120 build/tests/test_sample_device > "$OUT/sample66.txt" 2>&1
    say "engine tests on cuda: $(grep -c '^PASS' "$OUT/sample66.txt") passed, $(grep -c '^FAIL' "$OUT/sample66.txt") failed; \
$(grep 'steps queued ahead' "$OUT/sample66.txt" | head -1); halves warnings: $(grep -c 'cannot switch' "$OUT/sample66.txt")"
    grep -E '^FAIL|check failed' "$OUT/sample66.txt" | head -5 | tee -a "$S"
    dg() { env TERN_LT_TUNE=0 "$@" timeout 90 build/concurrency --random llama3-1b --device cuda --compute bf16 \
             --conc 16 --prompt 32 --gen 32 --requests 2 --system 16 2>&1 | grep 'ids digest' | head -1; }
    say "digest TERN_ASYNC_ROWS=1 / TERN_ASYNC=0: $(dg TERN_ASYNC_ROWS=1) / $(dg TERN_ASYNC=0)"
    conc_ab "TERN_ASYNC=0;TERN_ASYNC_ROWS=1" "${AB66_MODELS:-llama3-8b llama3-8b:q4}" 1,8,64
    for f in "$OUT"/conc_*TERN_ASYNC*; do say "  $(basename "$f"): $(grep -E '^steps|cannot switch' "$f" | tr '\n' ' ')"; done
fi

# 67. session 43: TERN_CUDA_LT_PDL (the edge into each cuBLASLt call's first kernel of a recorded step made programmatic,
#     as our kernels' are) ran once and was removed: its op test (a producer writing the GEMM's input 100 us after
#     triggering its dependents) got the product of the old input — cuBLASLt's kernels do not wait for the kernel
#     before them (no griddepcontrol.wait), so they can only follow a full edge (NOTES (bc)). The graph tests remain:
if [[ " $SECTIONS " == *" 67 "* ]]; then
    op_test cuda_graph_ ops67
fi

# 68. session 49: TERN_CUDA_QMMA (qmma.cu: codes straight into mma.sync for 2..64 rows, op-tested since it was written,
#     never timed) against the default q4 batch kernels (gemv_xr / qgemm_q4_wg): batch decode of llama3-8b q4 at 2 / 8 /
#     32 / 64 sequences (128 + 128), and gemma4-12b q4 at 8 / 64
if [[ " $SECTIONS " == *" 68 "* ]]; then
    conc_ab "TERN_CUDA_QMMA=0;TERN_CUDA_QMMA=1" "llama3-8b:q4" 2,8,32,64
    conc_ab "TERN_CUDA_QMMA=0;TERN_CUDA_QMMA=1" "gemma4-12b:q4" 8,64
fi

# 69. session 49: QMMA by default for 2..16 rows (TERN_CUDA_QMMA_N; section 68: gemma4-12b q4 +6.6 % at 8 sequences,
#     -3.3 % at 64): the op tests, then off / default (2..16) / every n up to 64, batch decode at 2..32 sequences of the
#     Gemma 4 q4 geometries and llama3-8b q8
if [[ " $SECTIONS " == *" 69 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_qmma,cuda_qgemm,cuda_gemv_xr ops69
    conc_ab "TERN_CUDA_QMMA=0;TERN_CUDA_QMMA=1;TERN_CUDA_QMMA_N=64" "${AB69_MODELS:-gemma4-12b:q4 gemma4-e4b:q4 gemma4-26b-a4b:q4 llama3-8b:q8}" 2,8,16,32
fi

# 75. session 56: acq_rel split-K counting everywhere (split_k.cuh: gemv_mma / gemv_xr, which section 74 timed, and
#     now moe_mma and attn_decode's last-block merges) and the removals (MIN, TAIL, clusters), against the tree before
#     them (build/base/tern-core: GPU_PACK_BASE=<HEAD's tern-core> gpu_check.sh pack; ROT on there too). Every op test
#     and cuda parity, then b1 q4 at 512 (and 8192: attn_decode's splits), and the MoE gemma4-26b-a4b (moe_mma).
if [[ " $SECTIONS " == *" 75 "* ]]; then
    if [ "${AB_OPS:-1}" = 1 ]; then
        timeout 300 build/test_cuda_ops > "$OUT/ops75_ops.txt" 2>&1
        say "all op tests: $(grep -c '^PASS' "$OUT/ops75_ops.txt") passed, $(grep -c '^FAIL' "$OUT/ops75_ops.txt") failed, $(tail -1 "$OUT/ops75_ops.txt")"
        grep -E '^FAIL|check failed' "$OUT/ops75_ops.txt" | head -5 | tee -a "$S"
        for comp in f32 bf16; do
            TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$comp timeout 120 build/tests/test_parity_core > "$OUT/parity75_$comp.log" 2>&1
            say "parity $comp: $(grep -c '^PASS' "$OUT/parity75_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity75_$comp.log") failed"
        done
    fi
    b1_sets "BIN=build/base/tern-core TERN_CUDA_MM_ROT=1;TERN_CUDA_MM_ROT=1" \
        "${AB75_MODELS:-gemma4-e4b --quant q4;gemma4-12b --quant q4;llama3-8b --quant q4;gemma4-26b-a4b --quant q4}"
    b1_sets "BIN=build/base/tern-core TERN_CUDA_MM_ROT=1;TERN_CUDA_MM_ROT=1" "llama3-8b --quant q4;gemma4-12b --quant q4" 8192
fi

# 76. session 56: TERN_CUDA_NORM_RES=1 again (the pending post-norm adds folded into the Q4 walk's staging: every K-slice
#     block forms x'; lost 7 % in session 18 before RMSU batched the staging's row sums and the hand-off lost its fences):
#     gemma4 q4 b1, default (2: gemv1 only) against 1.
if [[ " $SECTIONS " == *" 76 "* ]]; then
    b1_sets "TERN_CUDA_NORM_RES=2;TERN_CUDA_NORM_RES=1" \
        "${AB76_MODELS:-gemma4-e4b --quant q4;gemma4-12b --quant q4;gemma4-26b-a4b --quant q4}"
fi

# 78. session 57: where llama3-8b's Q4 walks spend their time on an H100 (the steady state of long walks, where e4b's
#     section-73 profile was mostly prologue): the load patterns alone (bench_cuda --pattern), the walk per llama3-8b
#     shape (BENCH_GEMV1=q4), then per walk of layer 0 (q|k|v, o, gate|up, down: the first four one-row walks of a
#     decode step) ncu's per-instruction SASS counters (wN_sass.csv: scripts/ncu_sass.py) and its details page.
#     AB78_MODEL=M profiles another model's first four walks (the removed section 73 did gemma4-e4b's gate|up).
if [[ " $SECTIONS " == *" 78 "* ]]; then
    timeout 120 build/bench_cuda --pattern > "$OUT/pattern78.txt" 2>&1
    grep '^csv' "$OUT/pattern78.txt" | cut -d, -f2- | tee -a "$S"
    TERN_CUDA_GEMV_XP1=1 BENCH_GEMV1=q4 timeout 120 build/bench_cuda > "$OUT/gemv78.txt" 2>&1
    grep '^csv' "$OUT/gemv78.txt" | cut -d, -f2- | tee -a "$S"
    NCU=/usr/local/cuda/bin/ncu
    for k in 0 1 2 3; do
        timeout 150 $NCU --graph-profiling node -k regex:gemv_mma_kernel --launch-skip $k --launch-count 1 \
            --section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight \
            --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis -o "$OUT/w$k" $T bench \
            --random "${AB78_MODEL:-llama3-8b}" --quant q4 --device cuda --prompt 16 --gen 2 --reps 1 --warmup 0 > "$OUT/w${k}_log.txt" 2>&1
        timeout 60 $NCU --import "$OUT/w$k.ncu-rep" --page source --csv --print-source sass > "$OUT/w${k}_sass.csv" 2>/dev/null
        timeout 60 $NCU --import "$OUT/w$k.ncu-rep" --page details > "$OUT/w${k}_details.txt" 2>&1
        say "walk $k: $(grep -E 'Grid Size|Duration|Registers Per|DRAM Throughput|Achieved Occupancy' "$OUT/w${k}_details.txt" | tr -s ' ' | tr '\n' ';')"
        python3 scripts/ncu_sass.py "$OUT/w${k}_sass.csv" --top 8 2>&1 | head -40 >> "$S"
        rm -f "$OUT/w$k.ncu-rep"
    done
fi

# 82. session 57 (queued, no code; ran in session 58, NOTES (br): 64 lost 41 % at 128 sequences): batch-128 decode of Q4 ran slower than bf16's on the H100 (llama3-8b 12143 vs
#     15320 dec tok/s, gemma4-12b 5634 vs 7445; 64 rows: 11707, 5274 — NOTES (bq) 4): 65..128 rows of Q4 on qgemm_q4's
#     wgmma kernel (TERN_CUDA_QG4_MAX_N=128, the default) against dequantize + cuBLASLt above 64 rows (=64).
if [[ " $SECTIONS " == *" 82 "* ]]; then
    conc_ab "TERN_CUDA_QG4_MAX_N=128;TERN_CUDA_QG4_MAX_N=64" "llama3-8b:q4 gemma4-12b:q4" 64,128
fi

# 83. session 58: TERN_CUDA_NORM_ROUTE (moe.cu norm_route_kernel: Gemma 4's MoE block head for one row — the three
#     norms, the router's logits over f32 x and the top-k — one launch instead of rmsnorm_n + the router GEMV +
#     route_kernel, ~14 µs of a 26b-a4b layer serialized, NOTES (bq) 8). Op tests, parity + greedy ids with it on,
#     b1 of gemma4-26b-a4b bf16 / q4 off / on, the fused kernel's time (ncu). Ran in session 58 (NOTES (br)): the first
#     form lost 3.5 %, the second won 0.4-1.3 % (default since); EXPERT_PF (section 81, removed) lost at 2 and 8.
if [[ " $SECTIONS " == *" 83 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_norm_route_topk,cuda_route_topk ops83
    [ "${AB_OPS:-1}" = 1 ] && on_checks TERN_CUDA_NORM_ROUTE bf16 "gemma4_moe_like gemma4_moe_mixed"
    b1_sets "${AB83_SETS:-TERN_CUDA_NORM_ROUTE=0;TERN_CUDA_NORM_ROUTE=1}" \
        "${AB83_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-26b-a4b --quant q4}"
    for v in 0 1; do
        TERN_CUDA_NORM_ROUTE=$v timeout 120 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none \
            --clock-control none -k regex:'norm_route|rmsnorm_n|route_kernel' --metrics gpu__time_duration.sum --csv \
            --print-units base $T bench --random gemma4-26b-a4b --device cuda --prompt 64 --gen 2 --reps 1 --warmup 0 \
            > "$OUT/ncu83_$v.csv" 2>&1
        say "NORM_ROUTE $v (ncu, µs each, the last step's launches): $(grep -E 'norm_route|rmsnorm_n|route_kernel' \
            "$OUT/ncu83_$v.csv" | tail -60 | awk -F'","' '{n = $5; sub(/[<(].*/, "", n); gsub(/[",]/, "", $NF); t[n] += $NF; c[n]++}
            END {for (k in t) printf "%s %.2f x%d  ", k, t[k] / c[k] / 1000, c[k]}')"
    done
fi

# 84. session 58 (ran in session 58, NOTES (br): +4.4 %, default since): TERN_CUDA_MOE_DOWN1 (moe.cu moe_down1_kernel: the pair path's BF16 / F16 experts' down projection,
#     a term a warp with every chunk load of a term in flight; gemv_kernel's expert mode walked a warp's k terms one
#     after another: gemma4-26b-a4b bf16's down 17.9 µs for 32 MB, NOTES (bq) 8). Op tests, parity + greedy ids with
#     it on, b1 of gemma4-26b-a4b bf16 off / on (q4's experts take moe_mma), the down kernels' times (ncu).
if [[ " $SECTIONS " == *" 84 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_moe_down1,cuda_moe_mlp ops84
    [ "${AB_OPS:-1}" = 1 ] && on_checks TERN_CUDA_MOE_DOWN1 bf16 "gemma4_moe_like gemma4_moe_mixed"
    b1_sets "TERN_CUDA_MOE_DOWN1=0;TERN_CUDA_MOE_DOWN1=1" "${AB84_MODELS:-gemma4-26b-a4b --quant bf16}"
    for v in 0 1; do
        TERN_CUDA_MOE_DOWN1=$v timeout 120 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none \
            --clock-control none -k regex:'moe_down1|gemv_kernel' --metrics gpu__time_duration.sum --csv \
            --print-units base $T bench --random gemma4-26b-a4b --device cuda --prompt 64 --gen 2 --reps 1 --warmup 0 \
            > "$OUT/ncu84_$v.csv" 2>&1
        say "MOE_DOWN1 $v (ncu, µs each, the last step's launches): $(grep -E 'moe_down1|gemv_kernel' \
            "$OUT/ncu84_$v.csv" | tail -30 | awk -F'","' '{n = $5; sub(/[<(].*/, "", n); gsub(/[",]/, "", $NF); t[n] += $NF; c[n]++}
            END {for (k in t) printf "%s %.2f x%d  ", k, t[k] / c[k] / 1000, c[k]}')"
    done
fi

# 85. session 58 (ran in session 58, NOTES (br): 2 won, the default since): moe_down1_kernel's rows a block, TERN_CUDA_MOE_DOWN1_R 2 / 4 (default) / 8 (registers 62 / 111 /
#     168: 4 / 2 / 1 blocks an SM; 4 ran 16.0 µs for 32 MB in section 84, ~0.69 of the copy rate): b1 of
#     gemma4-26b-a4b bf16, and the kernel's time for each (ncu).
if [[ " $SECTIONS " == *" 85 "* ]]; then
    b1_sets "TERN_CUDA_MOE_DOWN1_R=2;TERN_CUDA_MOE_DOWN1_R=4;TERN_CUDA_MOE_DOWN1_R=8" "${AB85_MODELS:-gemma4-26b-a4b --quant bf16}"
    [ "${AB85_NCU:-1}" = 1 ] && for v in 2 4 8; do
        TERN_CUDA_MOE_DOWN1_R=$v timeout 120 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none \
            --clock-control none -k regex:moe_down1 --metrics gpu__time_duration.sum --csv \
            --print-units base $T bench --random gemma4-26b-a4b --device cuda --prompt 64 --gen 2 --reps 1 --warmup 0 \
            > "$OUT/ncu85_$v.csv" 2>&1
        say "MOE_DOWN1_R $v (ncu, µs each): $(grep moe_down1 "$OUT/ncu85_$v.csv" | tail -30 |
            awk -F'","' '{gsub(/[",]/, "", $NF); s += $NF; n++} END {if (n) printf "%.2f x%d", s / n / 1000, n}')"
    done
fi

# 86. session 59: Gemma 4 MoE layers' last post-norm add (o += rmsnorm(m2)·w, the experts onto the dense branch) folded
#     into the next layer's q|k|v prologue (tern_norm_res h2; gemv1's EARLY instances under __launch_bounds__(256, 2)).
#     A probe in this session (an uncommitted gemma4.c leaving that rmsnorm_add out) read gemma4-26b-a4b bf16 b1
#     247.2 -> 254.0 tok/s: the launch cost ~3.7 us a layer. Op tests, parity, greedy ids against the base binary, b1 of
#     the models whose gemv1 instances the bound touches, the base (GPU_PACK_BASE: the tree before) against this one.
if [[ " $SECTIONS " == *" 86 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_norm_matmul_res,cuda_matmul_act_mul,cuda_norm_matmul,cuda_norm_qkv_rope_kv,cuda_moe_mlp ops86
    for comp in f32 bf16; do
        TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$comp timeout 120 build/tests/test_parity_core > "$OUT/parity86_$comp.log" 2>&1
        say "parity $comp: $(grep -c '^PASS' "$OUT/parity86_$comp.log") passed, $(grep -c '^FAIL' "$OUT/parity86_$comp.log") failed"
    done
    for m in gemma4_moe_like gemma4_moe_mixed gemma4_dense; do
        for comp in f32 bf16; do
            a=$(timeout 30 build/base/tern-core generate tests/parity/fixtures/$m --ids 2,17,99,45,20,12 --max-tokens 40 \
                --temperature 0 --ignore-eos --print-ids --device cuda --compute $comp 2>/dev/null | head -1)
            b=$(timeout 30 $T generate tests/parity/fixtures/$m --ids 2,17,99,45,20,12 --max-tokens 40 \
                --temperature 0 --ignore-eos --print-ids --device cuda --compute $comp 2>/dev/null | head -1)
            say "greedy $m $comp base vs new: $([ -n "$a" ] && [ "$a" = "$b" ] && echo same || echo DIFFERENT)"
        done
    done
    b1_sets "${AB86_SETS:-BIN=build/base/tern-core;TERN_CUDA_G1_CPA=2;TERN_CUDA_G1_CPA=1}" \
        "${AB86_MODELS:-gemma4-26b-a4b --quant bf16;llama3-8b --quant bf16;gemma4-12b --quant bf16;gemma4-e4b --quant bf16}"
fi

# 87. session 59, after 86 (TERN_CUDA_G1_CPA=2 the default): the whole op-test program, and b1 at a long prompt
#     (AB87_PROMPT, default 8192) of the models whose gemv1 prologues changed, the base (GPU_PACK_BASE) against this tree.
if [[ " $SECTIONS " == *" 87 "* ]]; then
    timeout 400 build/test_cuda_ops > "$OUT/ops87.txt" 2>&1
    say "op tests (all): $(grep -c '^PASS' "$OUT/ops87.txt") passed, $(grep -c '^FAIL' "$OUT/ops87.txt") failed, $(grep -c '^SKIP' "$OUT/ops87.txt") skipped"
    grep -E '^FAIL|check failed' "$OUT/ops87.txt" | head -5 | tee -a "$S"
    b1_sets "${AB87_SETS:-BIN=build/base/tern-core;TERN_CUDA_G1_CPA=2}" \
        "${AB87_MODELS:-gemma4-e4b --quant bf16;gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16}" "${AB87_PROMPT:-8192}"
fi

# 88. session 59, after 87 (ran in session 59, NOTES (bs) 4: +0.4 %, default on): TERN_CUDA_MOE_GU_CPA (moe_gateup_kernel stages x_t by cp.async: one round trip instead of
#     the load-then-store loop's three at in 2816). Op test cuda_moe_mlp (both stagings bitwise), b1 of
#     gemma4-26b-a4b bf16 off / on.
if [[ " $SECTIONS " == *" 88 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_moe_mlp ops88
    b1_sets "TERN_CUDA_MOE_GU_CPA=0;TERN_CUDA_MOE_GU_CPA=1" "${AB88_MODELS:-gemma4-26b-a4b --quant bf16}"
fi

# 89. session 59, written after its last call (not yet run on a GPU): ops.h rmsnorm_add2 (norm.cu rmsnorm_add2_kernel:
#     Gemma 4 MoE layers' two pending post-norm adds — the experts' onto the dense branch, then the layer's last — in one
#     launch where no pre-norm GEMV folds them: Q4 decode (gemv_mma declines res), prefill, the step's last flush).
#     `TERN_CUDA_NORM_ADD2=0` runs the two rmsnorm_add launches. Op test cuda_rmsnorm_add2 (bitwise the two), parity, b1 of
#     gemma4-26b-a4b q4 (each layer: one launch fewer) and bf16 (a control: only the last flush), and its prefill.
if [[ " $SECTIONS " == *" 89 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_rmsnorm_add2,cuda_fused_rmsnorm_add,cuda_norm_matmul_res,cuda_matmul_act_mul ops89
    [ "${AB_OPS:-1}" = 1 ] && on_checks TERN_CUDA_NORM_ADD2 bf16 "gemma4_moe_like gemma4_moe_mixed"
    b1_sets "TERN_CUDA_NORM_ADD2=0;TERN_CUDA_NORM_ADD2=1" "${AB89_MODELS:-gemma4-26b-a4b --quant q4;gemma4-26b-a4b --quant bf16}"
    b1_sets "TERN_CUDA_NORM_ADD2=0;TERN_CUDA_NORM_ADD2=1" "gemma4-26b-a4b --quant q4" 2048
fi

# 90. session 60: where Gemma 4's b1 step at 8k loses (e4b 0.621, 26b-a4b 0.632 of the floor; 0.69 / 0.66 at 512): the
#     one-row decode attention alone on their shapes (bench_cuda --attn-dec1 CTX 1 bf16 1 NH NKV D; K and V of the
#     keys once / time, so the GB/s column is the copy-rate ratio's numerator) under each kernel choice: default, R1
#     forced (TERN_CUDA_AD_R1=2), the long class's TCS off / forced, the head split off
#     First run (session 60, H100): every choice ~70 µs for 33.5 MB at 8192 keys (0.48 TB/s). Then TERN_CUDA_AD_TCS512
#     (attn_decode_tc.cu's D 512 split, merged by tern__cuda_attn_merge): op test, the kernel alone, b1 at 8192 / 512.
if [[ " $SECTIONS " == *" 90 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_attention_decode_tcs,cuda_attention_decode_tc ops90
    A90="TERN_CUDA_AD_TCS512=0;TERN_CUDA_AD_TCS512=1;TERN_CUDA_AD_TCS512=2"
    attn_shape "16 2 512" "$A90" 512 2048 8192
    attn_shape "8 2 512" "$A90" 512 8192
    attn_shape "16 2 512" "TERN_CUDA_AD_TCS_CH=128;TERN_CUDA_AD_TCS_CH=256" 8192
    b1_sets "TERN_CUDA_AD_TCS512=0;TERN_CUDA_AD_TCS512=1" "${AB90_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-e4b --quant bf16}" 8192
    b1_sets "TERN_CUDA_AD_TCS512=0;TERN_CUDA_AD_TCS512=2" "${AB90_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-e4b --quant bf16}"
fi

# 91. session 60: which attention kernels a long-context b1 step runs (ncu -k on the attention and merge kernels only: the
#     rest run unprofiled), gemma4-26b-a4b and gemma4-e4b bf16 at 8192, the last decode step's launches (name, grid,
#     µs); and the kernel-alone case split into its launches
ncu_last() { # ncu_last CSV N: the last N profiled launches (name, grid, µs)
    python3 - "$1" "$2" <<'PY' 2>&1 | tee -a "$S"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if head is None:
    print("no ncu table in", sys.argv[1]); sys.exit(0)
ks = [(r[4], r[8], float(r[14].replace(",", "")) / 1000) for r in rows[head + 1:] if len(r) > 14]
for name, grid, us in ks[-int(sys.argv[2]):]:
    print("%8.2f us  %-14s %s" % (us, grid, name[:110]))
PY
}
if [[ " $SECTIONS " == *" 91 "* ]]; then
    NCU=/usr/local/cuda/bin/ncu
    for m in gemma4-26b-a4b gemma4-e4b; do
        for v in 0 1; do
            say "ncu attention kernels, $m bf16 at 8192, TERN_CUDA_AD_TCS512=$v (the last decode step's):"
            TERN_CUDA_AD_TCS512=$v timeout 240 $NCU --graph-profiling node --cache-control none --clock-control none \
                -k regex:'attn|merge' --metrics gpu__time_duration.sum --csv --print-units base \
                $T bench --random $m --quant bf16 --device cuda --prompt 8192 --gen 3 --reps 1 --warmup 0 \
                > "$OUT/ncu_attn_${m}_$v.csv" 2>&1
            ncu_last "$OUT/ncu_attn_${m}_$v.csv" "${AB91_N:-16}"
        done
    done
    for sh in "16 2 512" "8 2 512"; do
        say "ncu bench_cuda --attn-dec1 8192 1 bf16 1 $sh (TCS512=1):"
        timeout 120 $NCU --cache-control none --clock-control none -k regex:'attn|merge' --launch-skip 100 --launch-count 4 \
            --metrics gpu__time_duration.sum --csv --print-units base build/bench_cuda --attn-dec1 8192 1 bf16 1 $sh \
            > "$OUT/ncu_attn1_${sh// /_}.csv" 2>&1
        ncu_last "$OUT/ncu_attn1_${sh// /_}.csv" 4
    done
fi

# 92. session 60: attn_merge_kernel a block per (row, 64 outputs) (was a block per row: 15 µs for one row of 16 heads × 512
#     over 33 splits, serialized); the whole op-test program (every split-K attention merges through it); the kernel
#     alone; b1 at 8192 of the Gemma 4 models against the session-59 tern-core (BIN=build/base/tern-core) and, for
#     gemma4-26b-a4b (whose b1 barely moved with TCS512 although its attention kernels went 73 → 39 µs serialized),
#     diagnostics: PDL off, and the head split off (a much slower kernel: is the step sensitive to it at all?)
if [[ " $SECTIONS " == *" 92 "* ]]; then
    if [ "${AB_OPS:-1}" = 1 ]; then
        timeout 400 build/test_cuda_ops > "$OUT/ops92_all.txt" 2>&1
        say "op tests (all): $(grep -c '^PASS' "$OUT/ops92_all.txt") passed, $(grep -c '^FAIL' "$OUT/ops92_all.txt") failed"
        grep -E '^FAIL|check failed' "$OUT/ops92_all.txt" | head -5 | tee -a "$S"
    fi
    attn_shape "16 2 512" "TERN_CUDA_AD_TCS512=1" 8192
    attn_shape "8 2 512" "TERN_CUDA_AD_TCS512=1" 8192
    attn_shape "16 1 512" "TERN_CUDA_AD_TCS512=0;TERN_CUDA_AD_TCS512=1" 8192
    b1_sets "${AB92_SETS:-BIN=build/base/tern-core;X=0}" \
        "${AB92_MODELS:-gemma4-e4b --quant bf16;gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16}" 8192
    AB_REPS=1 b1_sets "TERN_CUDA_AD_TCS512=0 TERN_CUDA_AD_HSPLIT=0;TERN_CUDA_AD_TCS512=0 TERN_CUDA_PDL=0;TERN_CUDA_PDL=0" \
        "gemma4-26b-a4b --quant bf16" 8192
fi

# 93. session 60 (section 92 could not start): attn_decode_r1.cu with several clusters a (row, kv head)
#     (TERN_CUDA_AD_R1_NC=8, committed as 1, lost and removed after: the clusters' sums merged by tern__cuda_attn_merge) and in long steps
#     (TERN_CUDA_AD_R1_LONG=1) against TCS512 / TCS; attn_merge_kernel a block per (row, 64 outputs). The whole
#     op-test program; the kernels alone; b1 at 8192 against the session-59 tern-core (BIN=build/base/tern-core), and at
#     512 (where NC stays 1: only the merge and nothing else changed)
if [[ " $SECTIONS " == *" 93 "* ]]; then
    if [ "${AB_OPS:-1}" = 1 ]; then
        timeout 300 build/test_cuda_ops > "$OUT/ops93_all.txt" 2>&1
        say "op tests (all): $(grep -c '^PASS' "$OUT/ops93_all.txt") passed, $(grep -c '^FAIL' "$OUT/ops93_all.txt") failed"
        grep -E '^FAIL|check failed' "$OUT/ops93_all.txt" | head -5 | tee -a "$S"
    fi
    A93="TERN_CUDA_AD_TCS512=1;TERN_CUDA_AD_R1_LONG=1 TERN_CUDA_AD_R1_NC=8;TERN_CUDA_AD_R1_LONG=1 TERN_CUDA_AD_R1_NC=16"
    attn_shape "16 2 512" "$A93" 8192
    attn_shape "8 2 512" "$A93" 8192
    attn_shape "16 1 512" "TERN_CUDA_AD_TCS512=1" 8192
    attn_shape "16 8 256" "TERN_CUDA_AD_R1_NC=1;TERN_CUDA_AD_R1_NC=8" 1024
    attn_shape "32 8 128" "TERN_CUDA_AD_R1_NC=1;TERN_CUDA_AD_R1_NC=8" 2048
    attn_shape "32 8 128" "X=0;TERN_CUDA_AD_R1_LONG=1 TERN_CUDA_AD_R1_NC=8" 8192
    b1_sets "BIN=build/base/tern-core;X=0;TERN_CUDA_AD_R1_NC=8;TERN_CUDA_AD_R1_LONG=1 TERN_CUDA_AD_R1_NC=8" \
        "${AB93_MODELS:-gemma4-e4b --quant bf16;gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16}" 8192
    b1_sets "BIN=build/base/tern-core;X=0;TERN_CUDA_AD_R1_LONG=1 TERN_CUDA_AD_R1_NC=8" "llama3-8b --quant bf16" 8192
    AB_REPS=1 b1_sets "BIN=build/base/tern-core;X=0" \
        "gemma4-e4b --quant bf16;gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16;llama3-8b --quant bf16"
fi

# 94. session 60, after 93 (r1's several clusters, TERN_CUDA_AD_R1_NC / _LONG, lost everywhere and were removed): the
#     decode-attention op tests again, and r1 with 8 warps (TERN_CUDA_AD_R1_W=8) for the sliding layers of a long step
#     (1024-key windows of gemma4-26b-a4b / 12b: two chunks a walker at 4 warps, one at 8)
if [[ " $SECTIONS " == *" 94 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_attention_decode_r1,cuda_attention_decode_tcs,cuda_attention_decode_tc ops94
    attn_shape "16 8 256" "TERN_CUDA_AD_R1_W=4;TERN_CUDA_AD_R1_W=8" 1024
    attn_shape "8 2 256" "TERN_CUDA_AD_R1_W=4;TERN_CUDA_AD_R1_W=8" 512
    AB_REPS=1 b1_sets "TERN_CUDA_AD_R1_W=4;TERN_CUDA_AD_R1_W=8" \
        "${AB94_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16;gemma4-e4b --quant bf16}" 8192
fi

# 95. session 60, written after its last call (not yet run): TCS512's splits over 1 / 2 / 3 waves of one block an SM
#     (TERN_CUDA_AD_TCS512_WAVES; more splits, shorter walks, a merge over more partials), the kernel alone at 8192 and
#     32768 keys and b1 at 8192; and the whole attention side of a long b1 step as it stands (section 91's ncu listing).
#     Ran in session 61 (NOTES (bu)): one wave won and TERN_CUDA_AD_TCS512_WAVES was removed; TCS512_ROWS default 8.
if [[ " $SECTIONS " == *" 95 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_attention_decode_tcs,cuda_attention_decode_tc,cuda_attention_decode_r1 ops95
    A95="TERN_CUDA_AD_TCS512_WAVES=1;TERN_CUDA_AD_TCS512_WAVES=2;TERN_CUDA_AD_TCS512_WAVES=3"
    attn_shape "16 2 512" "$A95" 8192 32768
    attn_shape "16 1 512" "$A95" 8192
    b1_sets "TERN_CUDA_AD_TCS512_WAVES=1;TERN_CUDA_AD_TCS512_WAVES=2" \
        "${AB95_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-e4b --quant bf16;gemma4-12b --quant bf16}" 8192
    # a few sequences at 8k: TCS512 up to 16 rows (TERN_CUDA_AD_TCS512_ROWS) against the split kernel above 4
    for rep in 1 2; do
        for v in 4 16; do
            TERN_CUDA_AD_TCS512_ROWS=$v timeout 150 build/concurrency --random gemma4-26b-a4b --device cuda --compute bf16 \
                --conc 8 --prompt 8192 --gen 64 --no-prefix > "$OUT/conc95.txt" 2>&1
            say "concurrency 8 at 8192 gemma4-26b-a4b bf16 TCS512_ROWS=$v rep $rep: $(grep '^csv,conc' "$OUT/conc95.txt" | cut -d, -f5,9,16 | tail -1)"
        done
    done
    # prefill against another build (GPU_PACK_BASE: build/base/tern-core) — attn_merge_kernel's grid changed in session 60
    if [ -x build/base/tern-core ]; then
        for rep in 1 2; do
            for m in "llama3-8b --quant bf16" "gemma4-26b-a4b --quant bf16"; do
                for bin in build/base/tern-core $T; do
                    timeout 90 $bin bench --random $m --device cuda --prompt 2048 --gen 1 --reps 1 > "$OUT/pp95.txt" 2>&1
                    say "pp2048 $m [$bin] rep $rep: $(grep '^csv,' "$OUT/pp95.txt" | cut -d, -f6 | tail -1)"
                done
            done
        done
    fi
fi

# 96. session 61: where r1 spends a sliding layer of gemma4-26b-a4b / 12b at 8k (16 / 8 heads, D 256, 1024-key window;
#     ~11 µs eager for 8.4 MB): blocks a cluster (TERN_CUDA_AD_R1_SMAX), warps a block, clusters spread over SMs
#     (TERN_CUDA_CLUSTER_SPREAD) against llama3-8b's D 128; ncu's sections (occupancy, cluster launch, warp stalls,
#     memory) of one launch; records a chunk ahead (TERN_CUDA_AD_R1_AHEAD) alone and in b1 at 8k / 512. Ran once (NOTES
#     (bu)); TERN_CUDA_CLUSTER_SPREAD (a cluster scheduling policy switch) tied and was removed after.
if [[ " $SECTIONS " == *" 96 "* ]]; then
    NCU=/usr/local/cuda/bin/ncu
    A96="TERN_CUDA_AD_R1_SMAX=16;TERN_CUDA_AD_R1_SMAX=8;TERN_CUDA_AD_R1_SMAX=4;TERN_CUDA_AD_R1_W=8"
    A96="$A96;TERN_CUDA_CLUSTER_SPREAD=1;TERN_CUDA_CLUSTER_SPREAD=1 TERN_CUDA_AD_R1_W=8"
    attn_shape "16 8 256" "$A96" 1024 256
    attn_shape "32 8 128" "TERN_CUDA_AD_R1_SMAX=16;TERN_CUDA_AD_R1_SMAX=8" 1024
    # the next chunk's records a chunk ahead (TERN_CUDA_AD_R1_AHEAD, written this session; bitwise the same)
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_attention_decode_r1 ops96
    A96B="TERN_CUDA_AD_R1_AHEAD=0;TERN_CUDA_AD_R1_AHEAD=1"
    attn_shape "16 8 256" "$A96B" 1024 512
    attn_shape "32 8 128" "$A96B" 512 2048
    A96B="$A96B;TERN_CUDA_AD_R1_AHEAD=1 TERN_CUDA_CLUSTER_SPREAD=1"
    AB_REPS=2 b1_sets "$A96B" "${AB96_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16}" 8192
    AB_REPS=1 b1_sets "$A96B" "llama3-8b --quant bf16;gemma4-e4b --quant bf16" 512
    for sh in "16 8 256" "32 8 128"; do
        say "ncu sections, bench_cuda --attn-dec1 1024 1 bf16 1 $sh (r1):"
        timeout 150 $NCU --cache-control none --clock-control none -k regex:attn_dec_r1 --launch-skip 20 --launch-count 1 \
            --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis build/bench_cuda --attn-dec1 1024 1 bf16 1 $sh \
            > "$OUT/ncu96_${sh// /_}.txt" 2>&1
        grep -E '^ +[A-Z][A-Za-z /().%-]+ +[a-zA-Z/%]* +[0-9.,]+$' "$OUT/ncu96_${sh// /_}.txt" | tr -s ' ' | head -80 | tee -a "$S"
    done
fi

# 97. session 61: r1 without a cluster (TERN_CUDA_AD_R1_LB: the last block of a (row, kv head) merged the blocks'
#     partials) lost everywhere (NOTES (bu)) and was removed with its section.

# 98. session 61: TERN_CUDA_AD_R1_AHEAD=2 (the next chunk's V loaded with its K into a second set of registers) against 1
#     (records a chunk ahead, the default): the kernel alone, b1 at 8k / 512, 4 sequences at 8k (r1's few-row launches).
#     Ran once (NOTES (bu)): 2 tied (202 -> 227 registers) and was removed; AHEAD=0 stays as the switch's off value.
if [[ " $SECTIONS " == *" 98 "* ]]; then
    [ "${AB_OPS:-1}" = 1 ] && op_test cuda_attention_decode_r1 ops98
    A98="TERN_CUDA_AD_R1_AHEAD=1;TERN_CUDA_AD_R1_AHEAD=2"
    attn_shape "16 8 256" "$A98" 1024 256
    attn_shape "32 8 128" "$A98" 512 2048
    b1_sets "$A98" "${AB98_MODELS:-gemma4-26b-a4b --quant bf16;gemma4-12b --quant bf16}" 8192
    AB_REPS=1 b1_sets "$A98" "llama3-8b --quant bf16;gemma4-e4b --quant bf16;gemma4-26b-a4b --quant bf16" 512
    for v in 0 1 2; do
        TERN_CUDA_AD_R1_AHEAD=$v timeout 150 build/concurrency --random gemma4-26b-a4b --device cuda --compute bf16 \
            --conc 4 --prompt 8192 --gen 64 --no-prefix > "$OUT/conc98.txt" 2>&1
        say "concurrency 4 at 8192 gemma4-26b-a4b bf16 TERN_CUDA_AD_R1_AHEAD=$v: $(grep '^csv,conc' "$OUT/conc98.txt" | cut -d, -f5,9,16 | tail -1)"
    done
fi

# 99. session 61, written after its last call (ran in session 62 with TR on, NOTES (bv)): where r1's ~2200 instructions a warp go at a sliding layer
#     of gemma4-26b-a4b / 12b (16 / 8 heads, D 256, 1024 keys; section 96): ncu's source counters of one launch, SASS
#     instructions executed and warp-stall samples summed by opcode and listed for the 40 hottest instructions
#     (AB99_SHAPE / AB99_KEYS: another shape)
if [[ " $SECTIONS " == *" 99 "* ]]; then
    NCU=/usr/local/cuda/bin/ncu
    sh99=${AB99_SHAPE:-16 8 256}
    timeout 200 $NCU --cache-control none --clock-control none -k regex:attn_dec_r1 --launch-skip 20 --launch-count 1 \
        --section SourceCounters --section WarpStateStats -f -o "$OUT/ncu99" \
        build/bench_cuda --attn-dec1 "${AB99_KEYS:-1024}" 1 bf16 1 $sh99 > "$OUT/ncu99_run.txt" 2>&1
    $NCU -i "$OUT/ncu99.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu99_sass.csv" 2>&1
    say "ncu source counters, r1 [$sh99] at ${AB99_KEYS:-1024} keys:"
    python3 - "$OUT/ncu99_sass.csv" <<'PY' 2>&1 | tee -a "$S"
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hi = next((i for i, r in enumerate(rows) if any("Source" == c for c in r)), None)
if hi is None:
    print("no source table"); sys.exit(0)
h = rows[hi]
def col(*keys):
    return next((i for i, c in enumerate(h) if all(k in c for k in keys)), None)
cs, ce, cw = col("Source"), col("Instructions Executed"), col("Warp Stall Sampling (All")
num = lambda r, i: float(r[i].replace(",", "")) if i is not None and i < len(r) and r[i].strip() not in ("", "-") else 0.0
ins = [(r[cs].strip(), num(r, ce), num(r, cw)) for r in rows[hi + 1:] if cs is not None and len(r) > cs]
tot_e = sum(e for _, e, _ in ins) or 1.0
tot_w = sum(w for _, _, w in ins) or 1.0
by = collections.defaultdict(lambda: [0.0, 0.0])
for src, e, w in ins:
    op = src.split()[0] if src else "?"
    if op.startswith("@"):
        op = src.split()[1] if len(src.split()) > 1 else op
    op = op.split(".")[0]
    by[op][0] += e; by[op][1] += w
print("executed %.0f warp-instructions, %.0f stall samples" % (tot_e, tot_w))
for op, (e, w) in sorted(by.items(), key=lambda kv: -kv[1][1])[:20]:
    print("  %-10s %5.1f %% of instructions  %5.1f %% of stall samples" % (op, 100 * e / tot_e, 100 * w / tot_w))
print("hottest instructions (stall samples):")
for idx, (src, e, w) in sorted(enumerate(ins), key=lambda t: -t[1][2])[:40]:
    print("  #%-5d %5.1f %%  %-70s exec %.0f" % (idx, 100 * w / tot_w, src[:70], e))
PY
fi

# 100. session 61, written after its last call: r1's transposed form for G <= 4 (TERN_CUDA_AD_R1_TR=1: S^T = K·Q^T and
#      (P·V)^T = V^T·P^T, hi / lo of up to 4 heads in the 8 columns; half the mmas and accumulators). Ran in session 62 as
#      section 101 (r1_ab, with a base build beside) and 102's first loop (4 sequences at 8k); NOTES (bv): TR won and is
#      the default. Its copy of r1_ab's body was removed.

# 101. session 62: section 100 with the session's ad_rec (the KV block index as a multiply and a shift instead of a
#      division by the runtime block size, every decode-attention kernel) against the tree before it (build/base/tern-core:
#      `GPU_PACK_BASE=<7c859d0's tern-core> gpu_check.sh pack`); the decode / prefill attention op tests first (they stop
#      the section on a failure), then r1's kernel alone TR 0 / 1, b1 at 8k and 512 for base / TR 0 / TR 1, parity and
#      greedy ids with TR on (r1_ab below: AB_R1_MODELS, AB_R1_FIXTURES)
# r1_ab VAR OPS TAG [SET]: a default-off r1 switch VAR against VAR=0 and the tree before (build/base/tern-core when
# carried) — the op tests OPS first (a failure stops it), then the kernel alone at the sliding layers' shapes (SET: one
# more setting at 16 / 8 x 256), b1 at 8k (AB_R1_MODELS) and 512, parity and greedy ids with VAR on (AB_R1_FIXTURES)
r1_ab() {
    local var=$1 a b
    op_test "$2" "$3"
    if grep -q '^FAIL' "$OUT/$3_ops.txt" || ! grep -q '^PASS' "$OUT/$3_ops.txt"; then
        say "$2 op tests failed: $var not timed"
        return
    fi
    a="$var=0;$var=1"
    attn_shape "16 8 256" "$a${4:+;$4}" 1024 256
    attn_shape "8 2 256" "$a" 512
    attn_shape "32 8 128" "$a" 512
    b="BIN=build/base/tern-core;$a"
    [ -x build/base/tern-core ] || b="$a"
    b1_sets "$b" "${AB_R1_MODELS:-gemma4-12b --quant bf16;gemma4-26b-a4b --quant bf16}" 8192
    AB_REPS=1 b1_sets "$b" "llama3-8b --quant bf16;gemma4-e4b --quant bf16;llama3-8b --quant q4" 512
    on_checks "$var" bf16 "${AB_R1_FIXTURES:-gemma4_moe_like llama3}"
}
if [[ " $SECTIONS " == *" 101 "* ]]; then
    r1_ab TERN_CUDA_AD_R1_TR cuda_attention_decode,cuda_attention_prefill ops101 "TERN_CUDA_AD_R1_TR=1 TERN_CUDA_AD_R1_SMAX=8"
fi

# 102. session 62, after 101 (r1's TR form won: default on): a few sequences at 8k with TR 0 / 1 (gemma4-26b-a4b, 4),
#      and TCS512 up to 4 / 8 rows (TERN_CUDA_AD_TCS512_ROWS; 8 won on 26b-a4b at 8 sequences, section 95) on gemma4-e4b /
#      12b at 8 sequences and 8k (AB102_CONC); the q4 b1 figures at 512 (AB102_Q4); with 99 before it: r1's ncu source
#      counters with TR on
if [[ " $SECTIONS " == *" 102 "* ]]; then
    for v in 0 1; do
        TERN_CUDA_AD_R1_TR=$v timeout 150 build/concurrency --random gemma4-26b-a4b --device cuda --compute bf16 \
            --conc 4 --prompt 8192 --gen 64 --no-prefix > "$OUT/conc102.txt" 2>&1
        say "concurrency 4 at 8192 gemma4-26b-a4b bf16 TERN_CUDA_AD_R1_TR=$v: $(grep '^csv,conc' "$OUT/conc102.txt" | cut -d, -f5,9,16 | tail -1)"
    done
    for m in gemma4-e4b gemma4-12b; do
        for v in 4 8; do
            TERN_CUDA_AD_TCS512_ROWS=$v timeout 150 build/concurrency --random $m --device cuda --compute bf16 \
                --conc "${AB102_CONC:-8}" --prompt 8192 --gen 64 --no-prefix > "$OUT/conc102.txt" 2>&1
            say "concurrency ${AB102_CONC:-8} at 8192 $m bf16 TCS512_ROWS=$v: $(grep '^csv,conc' "$OUT/conc102.txt" | cut -d, -f5,9,16 | tail -1)"
        done
    done
    # the q4 b1 figures with this tree (last taken in session 57): one rep each at 512
    AB_REPS=1 b1_sets "TERN_CUDA_AD_R1_TR=1" "${AB102_Q4:-gemma4-e4b --quant q4;gemma4-12b --quant q4;gemma4-26b-a4b --quant q4}" 512
fi

# 103. session 62, written after section 99 (ncu of r1 at the sliding layers' shape: the two cluster barriers' waits and
#      fences ~29 % of the stall samples, the last one — blocks waiting for the others' remote reads — 17 %):
#      TERN_CUDA_AD_R1_PUSH=1, the blocks write the cluster merge's inputs into their owners' shared memory, so the merge
#      reads only local memory and needs no barrier after it; against PUSH=0 and the tree before (build/base/tern-core)
#      Ran in session 62 (NOTES (bv)): the kernel alone 2-3 % faster, but the build with it 0.3-1.4 % slower in b1 even
#      with PUSH=0 (more static shared memory, another register allocation) — removed with its switch; kept as a record
#      (`r1_ab TERN_CUDA_AD_R1_PUSH cuda_attention_decode_r1 ops103` ran it).

# 104. session 63: weights into L2 by a small kernel while latency-bound ones run (TERN_CUDA_L2PF_O: o's before a
#      one-row attention; TERN_CUDA_L2PF_NEXT via an ops.h prefetch hint: down before the glu, the next q|k|v before
#      down). Ran in session 63 (NOTES (bw)): lost everywhere (llama3-8b bf16 183.2 -> 176.2 at 16 MB, 162.8 at 32;
#      q4 347.3 -> 335.5, NEXT 309.6; gemma4-12b at 8k 104.7 -> 101.5) — removed with l2pf.cu; kept as a record.
# 105. session 63: is a GEMV fed from L2 faster? `bench_cuda --persist`'s production chains as they are and with
#      BENCH_PERSIST_SAME=1 (every launch on copy 0: L2-resident where it fits). Ran in session 63 (NOTES (bw)).
if [[ " $SECTIONS " == *" 105 "* ]]; then
    for e in BENCH_PERSIST_NONE=1 BENCH_PERSIST_SAME=1; do
        env $e timeout 150 build/bench_cuda --persist > "$OUT/persist105_$e.txt" 2>&1
        say "persist [$e]:"; grep '^persist production' "$OUT/persist105_$e.txt" | tr -s ' ' | tee -a "$S"
    done
fi

# 106. session 63: the b1 table on whatever card comes (the H200's when one is lent): every model in bf16 and q4 at 512
#      with the Q4 walk's own L2 prefetch (TERN_CUDA_GEMV_L2PF) 3 and 0 (session 52's chain on an H100: 0 was 1.5 %
#      faster; since this section ran the default follows the card, section 107), one rep; the bf16 models at 8192,
#      AB_REPS reps (default 2)
if [[ " $SECTIONS " == *" 106 "* ]]; then
    AB_REPS=1 b1_sets "TERN_CUDA_GEMV_L2PF=3;TERN_CUDA_GEMV_L2PF=0" "${AB106_512:-llama3-8b --quant q4;gemma4-e4b --quant q4;gemma4-12b --quant q4;gemma4-26b-a4b --quant q4;llama3-8b --quant bf16;gemma4-e4b --quant bf16;gemma4-12b --quant bf16;gemma4-26b-a4b --quant bf16}" 512
    b1_sets "TERN_CUDA_GEMV_L2PF=3" "${AB106_8K:-gemma4-12b --quant bf16;gemma4-26b-a4b --quant bf16;gemma4-e4b --quant bf16;llama3-8b --quant bf16}" 8192
fi

# 107. session 63, written after its last call (ran in session 64, NOTES (bx): unset = 0 on the H100, as designed): TERN_CUDA_GEMV_L2PF's per-device default (0 under 4 TB/s peak memory,
#      3 above; c->mem_peak from the device attributes) — the default must time as the explicit value for that card:
#      b1 q4 at 512 with the variable unset, =0 and =3, two reps (AB107_MODELS)
if [[ " $SECTIONS " == *" 107 "* ]]; then
    nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader | tee -a "$S"
    b1_sets "TERN_CUDA_GEMV_L2PF_UNSET=1;TERN_CUDA_GEMV_L2PF=0;TERN_CUDA_GEMV_L2PF=3" \
        "${AB107_MODELS:-llama3-8b --quant q4;gemma4-12b --quant q4}" 512
fi

# 108. session 64 (ran, NOTES (bx)): attn_decode_tc.cu's q staging at D > 128 with every thread's loads in flight
#      (tc_stage_q) against the tree before: the kernel alone 16 / 1 × 512 at 8192 keys 22.0 → 21.3 µs, b1 bf16 at
#      8192 gemma4-12b +0.3 %, 26b-a4b and e4b ties. Its body is 109's with the copies' change.
# 109. session 64 (ran, NOTES (bx): kept): attn_decode_tc.cu's copies addressed by one IMAD.WIDE.U32 a key (the lane's piece of token 0 +
#      rec · the pool's bytes a token) instead of 64-bit offsets with clamps per copy (ncu, 16 / 1 × 512: ~36
#      instructions a key, more than the chunk's mmas), with 108's q staging, against the tree before (build/base):
#      op tests (stops on a failure), the kernel alone at 8192 keys (D 512 shapes and llama3-8b's 32 / 8 × 128), b1
#      bf16 at 8192 (AB109_MODELS) and 512 (AB109_512), AB_REPS reps, then batch decode 128 + 128 of the unsplit
#      instances against build/base/concurrency (GPU_PACK_BASE_CONC; AB109_CONC models, "" skips; AB109_N
#      concurrency, default 64). Also attn_decode_r1.cu's K / V addresses the same way (a record times the bytes a token,
#      unsigned): build/alt/tern-core (GPU_PACK_ALT) is the tree with the attn_decode_tc.cu change alone
if [[ " $SECTIONS " == *" 109 "* ]]; then
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S"
    if ops_ok cuda_attention_decode_tcs cuda_attention_decode_tc cuda_attention_decode_early_bits cuda_attention_decode_r1; then
        if [ -x build/bench_cuda ] && [ -n "${AB109_KERNEL-x}" ]; then
            for sh in "8192 16 1 512" "8192 16 2 512" "8192 8 2 512" "8192 32 8 128" "1024 16 8 256" "512 32 8 128"; do
                for rep in 1 2; do
                    say "attn-dec1 1 row [$sh] rep $rep: $(timeout 60 build/bench_cuda --attn-dec1 ${sh%% *} 1 bf16 1 ${sh#* } | grep '^csv' | tail -1)"
                done
            done
        fi
        B=build/base/tern-core A="BIN=build/alt/tern-core;"
        [ -x $B ] || B=$T
        [ -x build/alt/tern-core ] || A=""
        [ -n "${AB109_MODELS-x}" ] &&
            b1_sets "BIN=$B;${A}X=1" "${AB109_MODELS:-gemma4-12b --quant bf16;gemma4-26b-a4b --quant bf16;llama3-8b --quant bf16}" 8192
        [ -n "${AB109_512-x}" ] &&
            b1_sets "BIN=$B;${A}X=1" "${AB109_512:-llama3-8b --quant bf16;gemma4-e4b --quant bf16}" 512
        if [ -n "${AB109_CONC-x}" ] && [ -x build/base/concurrency ]; then
            conc_ab "BIN=build/base/concurrency;X=1" "${AB109_CONC:-llama3-8b:bf16 gemma4-12b:bf16}" "${AB109_N:-64}"
        fi
    else
        say "109: an op test failed, no timings"
    fi
fi

# 110. session 64 (ran, NOTES (bx): the lazy rescale kept, TCS_EARLY=0 lost): attn_decode_tc.cu's lazy rescale (TC_TAU: the online softmax's reference max moves only when a
#      chunk's passes it by more than 8 nats, so O's D/8·4 multiplies a lane are skipped past the first chunks; other
#      bits, within the op tests' bounds) against the tree before (build/base), and TERN_CUDA_AD_TCS_EARLY=0 on the base
#      (ncu: ~10 % of TCS512's stall samples wait for q behind the early copies): op tests, parity, the kernel alone,
#      b1 bf16 at 8192 (AB110_MODELS), batch decode at 64 (AB110_CONC, one rep; "" skips)
if [[ " $SECTIONS " == *" 110 "* ]]; then
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$S"
    f=0
    ops_ok cuda_attention_decode_tcs cuda_attention_decode_tc cuda_attention_decode_early_bits || f=1
    for c in f32 bf16; do
        TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=$c timeout 120 build/tests/test_parity_core > "$OUT/parity110_$c.log" 2>&1
        say "parity $c: $(grep -c '^PASS' "$OUT/parity110_$c.log") passed, $(grep -c '^FAIL' "$OUT/parity110_$c.log") failed"
    done
    if [ $f = 0 ]; then
        for sh in "8192 16 1 512" "8192 32 8 128"; do
            say "attn-dec1 1 row [$sh]: $(timeout 60 build/bench_cuda --attn-dec1 ${sh%% *} 1 bf16 1 ${sh#* } | grep '^csv' | tail -1)"
        done
        B=build/base/tern-core
        [ -x $B ] || B=$T
        [ -n "${AB110_MODELS-x}" ] && b1_sets "BIN=$B;BIN=$B TERN_CUDA_AD_TCS_EARLY=0;X=1" \
            "${AB110_MODELS:-gemma4-12b --quant bf16;gemma4-26b-a4b --quant bf16}" 8192
        if [ -n "${AB110_CONC-x}" ] && [ -x build/base/concurrency ]; then
            AB_REPS=1 conc_ab "BIN=build/base/concurrency;X=1" "${AB110_CONC:-gemma4-12b:bf16 llama3-8b:bf16}" 64
        fi
    else
        say "110: an op test failed, no timings"
    fi
fi

# 111. session 64 (ran, NOTES (bx); removed): TERN_CUDA_AD_TCS512_PAIR (TCS512 as 4 pairs of warps) — op test passed,
#      the kernel alone 22.1 → 25.8 µs, b1 bf16 at 8192 gemma4-12b −1.6 %, 26b-a4b −1.5 %; the switch and its code are gone.

# 112. session 64 (session 65: the device has no nsys — "112: no nsys on this machine"; NOTES (by)): a b1 step's kernels as they run inside the graph, overlapped by PDL (ncu serialises them:
#      NOTES (bx) 6) — `nsys profile --cuda-graph-trace=node` of tern-core bench, its kernel trace through
#      scripts/ncu_step.py (each kernel's exposed time: how far it extended the step). Needs nsys on the device
#      (skipped with a message otherwise). AB112_MODELS: "spec@prompt;..." (default gemma4-12b bf16 at 8192, llama3-8b
#      bf16 and q4 at 512, gemma4-12b q4 at 512); AB112_CONC: "model:quant ..." decoded by build/concurrency at 64 sequences (128 + 32; default
#      gemma4-12b:bf16, "" none)
if [[ " $SECTIONS " == *" 112 "* ]]; then
    NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
    # nsys_one TAG TITLE CMD...: CMD under nsys, its kernel trace through ncu_step.py into the summary, the trace kept (xz)
    nsys_one() {
        local tag=$1 title=$2
        shift 2
        timeout 200 "$NSYS" profile -t cuda --cuda-graph-trace=node --force-overwrite true -o "$OUT/nsys_$tag" "$@" \
            > "$OUT/nsys_$tag.log" 2>&1
        timeout 200 "$NSYS" stats -r cuda_gpu_trace -f csv -o "$OUT/nsys_$tag" "$OUT/nsys_$tag.nsys-rep" >> "$OUT/nsys_$tag.log" 2>&1
        local f
        f=$(ls "$OUT"/nsys_"$tag"*gpu_trace*.csv 2>/dev/null | head -1) # nsys names it PREFIX_cuda_gpu_trace.csv
        say "$title (in-graph step):"
        python3 scripts/ncu_step.py "${f:-$OUT/nsys_${tag}_cuda_gpu_trace.csv}" 2>&1 | head -${AB_NCU_ROWS:-16} | tee -a "$S"
        rm -f "$OUT/nsys_$tag.nsys-rep" "$OUT/nsys_$tag.sqlite"
        [ -n "$f" ] && xz -f "$f"
    }
    if [ -z "$NSYS" ]; then
        say "112: no nsys on this machine"
    else
        IFS=';' read -ra ms <<< "${AB112_MODELS:-gemma4-12b --quant bf16@8192;llama3-8b --quant bf16@512;llama3-8b --quant q4@512;gemma4-12b --quant q4@512}"
        for m in "${ms[@]}"; do
            nsys_one "$(printf '%s' "${m%@*}_${m#*@}" | tr -c 'a-zA-Z0-9.' '_')" "nsys ${m%@*} at ${m#*@}" \
                $T bench --random ${m%@*} --device cuda --prompt ${m#*@} --gen 8 --reps 1 --warmup 0
        done
        for m in ${AB112_CONC-gemma4-12b:bf16}; do
            nsys_one "$(printf 'conc64_%s' "$m" | tr -c 'a-zA-Z0-9.' '_')" "nsys $m at 64 sequences" \
                build/concurrency --random $m --device cuda --compute bf16 --conc 64 --prompt 128 --gen 32 --requests 1 --system 16
        done
    fi
fi

# 113. session 65-66, removed: TERN_CUDA_G1_HN (Gemma 4's head norms, rope and cache stores in the one-row q|k|v GEMV's
#      epilogue) lost 6-7 % in both forms (b1 bf16 gemma4-12b at 8192 102.7 -> 96.9, e4b at 512 223.8 -> 208.0 on an
#      H100) and its gemma4-12b ids digest differed — NOTES (bz)

# ncu_conc64 SECONDS MODEL GEN FILE NCU-ARGS...: build/concurrency (bf16 compute, 64 sequences — NCU_CONC: another
# count — of 128 + GEN, no prefix part) under ncu (graph nodes, no cache flush, no clock lock, CSV in base units) into
# $OUT/FILE.csv, stderr FILE.err
ncu_conc64() {
    local to=$1 m=$2 gen=$3 f=$4
    shift 4
    timeout "$to" /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none --clock-control none "$@" --csv \
        --print-units base build/concurrency --random "$m" --device cuda --compute bf16 --conc "${NCU_CONC:-64}" \
        --prompt 128 --gen "$gen" --requests 2 --no-prefix > "$OUT/$f.csv" 2> "$OUT/$f.err"
}

# 114. session 65-66: where a batch-64 decode step goes (the device has no nsys: ncu, serialized, so use the
#      shares) — build/concurrency at 64 sequences (128 + 8) under ncu --graph-profiling node, the last step's kernels
#      through scripts/ncu_step.py (AB114_MODELS: "model:quant ...", default gemma4-12b:bf16, 0.69-0.70 of its floor
#      against llama3-8b's 0.79)
if [[ " $SECTIONS " == *" 114 "* ]]; then
    for m in ${AB114_MODELS:-gemma4-12b:bf16}; do
        tag=$(printf '%s' "$m" | tr -c 'a-zA-Z0-9.' '_')
        ncu_conc64 240 $m 8 ncu114_$tag --metrics gpu__time_duration.sum
        say "ncu $m at 64 sequences (serialized, one step):"
        python3 scripts/ncu_step.py "$OUT/ncu114_$tag.csv" --seq 24 2>&1 | head -${AB_NCU_ROWS:-48} | tee -a "$S"
        xz -f "$OUT/ncu114_$tag.csv"
    done
fi

# 115. session 66: attn_decode.cu's and attn_decode1p.cu's K / V rows addressed by one mul.wide.u32 a key (the record
#      times the elements a token; was a signed 64-bit product) — attn_decode_tc.cu's and r1's change of session 64 for
#      the batch kernels (attn_decode.cu serves steps whose (row, kv head) pairs do not fill two blocks an SM: llama3-8b
#      to ~32 sequences). Op tests, then batch decode against build/base/concurrency (GPU_PACK_BASE_CONC: the tree before)
#      at AB115_CONC (default 8,32,64) for AB115_MODELS (default llama3-8b gemma4-12b), ids digests base / new
if [[ " $SECTIONS " == *" 115 "* ]]; then
    if ops_ok cuda_attention_decode_1p cuda_attention_decode_cluster_bits cuda_attention_decode_early_bits \
        cuda_attention_decode_rope_bits cuda_attention_prefill_decode; then
        conc_ab "BIN=build/base/concurrency;TERN_AB=new" "${AB115_MODELS:-llama3-8b gemma4-12b}" "${AB115_CONC:-8,32,64}"
        say_digests "conc_*_1.txt"
    else
        say "115: an op test failed, no timings"
    fi
fi

# 116. session 66: what bounds the batch Q4 GEMM (qgemm_q4_wg.cu at 17..128 rows; llama3-8b q4 at 64 sequences runs at
#      ~0.36 of its floor) — ncu's speed-of-light section and the L2 / DRAM bytes of every launch whose name matches
#      AB116_KERNELS (default qg4w) in a 64-sequence decode (AB116_MODEL default llama3-8b:q4), averaged per name and
#      grid. The hypothesis: each 128-row block reads its 64 rows of x (bf16) for every K tile — twice the bytes of the
#      tile's weights — so L2, not DRAM, is the wall. Session 67 ran its detail pass by hand (NOTES (ca) 3: neither
#      wall: every one at 25-45 %, 25 % occupancy, latency-bound; L2 3-4x DRAM bytes)
if [[ " $SECTIONS " == *" 116 "* ]]; then
    m=${AB116_MODEL:-llama3-8b:q4}
    ncu_conc64 300 $m 4 ncu116 --kernel-name "regex:${AB116_KERNELS:-qg4w}" --section SpeedOfLight \
        --metrics lts__t_bytes.sum,dram__bytes_read.sum
    # the same launches' stall, pipe and memory detail (four launches past the first 40: decode steps)
    ncu_conc64 200 $m 4 ncu116d --kernel-name "regex:${AB116_KERNELS:-qg4w}" --launch-skip 40 --launch-count 4 \
        --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy
    say "116: ncu speed of light, $m at 64 sequences, kernels ${AB116_KERNELS:-qg4w}; then every metric of one launch:"
    python3 - "$OUT/ncu116.csv" "$OUT/ncu116d.csv" <<'PY' 2>&1 | head -110 | tee -a "$S"
import collections, csv, sys

def table(path):  # (column index by name, data rows) of an ncu CSV, or None
    rows = list(csv.reader(open(path)))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        print("no ncu table in", path); return None
    h = {c: j for j, c in enumerate(rows[head])}
    # metric rows end at their value (shorter than the header, whose last columns are the rules'); rule rows have none
    return h, [r for r in rows[head + 1:] if len(r) > h["Metric Value"] and r[h["Metric Name"]]]

t = table(sys.argv[1])
if t:
    h, rows = t
    per = collections.defaultdict(dict)
    for r in rows:
        k = (r[h["ID"]], r[h["Kernel Name"]][:60], r[h["Grid Size"]], r[h["Block Size"]])
        try: per[k][r[h["Metric Name"]]] = float(r[h["Metric Value"]].replace(",", ""))
        except ValueError: pass
    agg = collections.defaultdict(list)
    for (i, name, grid, blk), m in per.items(): agg[(name, grid, blk)].append(m)
    want = ["Duration", "DRAM Throughput", "L2 Cache Throughput", "L1/TEX Cache Throughput", "Compute (SM) Throughput",
            "lts__t_bytes.sum", "dram__bytes_read.sum"]
    print("%-48s %-14s %5s %8s %6s %6s %6s %6s %8s %8s" % ("kernel", "grid", "calls", "us", "DRAM%", "L2%", "L1%", "SM%",
          "L2 MB", "DRAM MB"))
    for (name, grid, blk), ms in sorted(agg.items(), key=lambda kv: -sum(m.get("Duration", 0) for m in kv[1]))[:30]:
        avg = {w: sum(m.get(w, 0) for m in ms) / len(ms) for w in want}
        print("%-48s %-14s %5d %8.2f %6.1f %6.1f %6.1f %6.1f %8.2f %8.2f" % (name[:48], grid, len(ms),
              avg["Duration"] / 1000, avg["DRAM Throughput"], avg["L2 Cache Throughput"], avg["L1/TEX Cache Throughput"],
              avg["Compute (SM) Throughput"], avg["lts__t_bytes.sum"] / 1e6, avg["dram__bytes_read.sum"] / 1e6))
t = table(sys.argv[2])
if t:
    h, rows = t
    first = rows[0][h["ID"]] if rows else None
    if rows: print(rows[0][h["Kernel Name"]][:80], rows[0][h["Grid Size"]])
    for r in rows:
        if r[h["ID"]] != first: break
        print("  %-28s %-58s %s %s" % (r[h["Section Name"]][:28], r[h["Metric Name"]][:58], r[h["Metric Value"]],
              r[h["Metric Unit"]]))
PY
    tail -3 "$OUT/ncu116.err" "$OUT/ncu116d.err" | tee -a "$S"
    xz -f "$OUT/ncu116.csv"
    xz -f "$OUT/ncu116d.csv"
fi

# 117 (TERN_CUDA_QG4_CL, the batch Q4 GEMM's split K summed in clusters) and 118 (TERN_CUDA_GEMV_BR, the one-row Q4
#      walk through per-warp bulk-copy rings) ran in session 67 (NOTES (ca)): both lost (CL −19 to −37 %, BR −5 to
#      −14 %) and were removed with their code and op tests.
# 119 ran in session 68 on an H100 (NOTES (cb)): WAVE won at 32 sequences (+3-4.5 %), lost at 8 (-7-11 %), tied at
#      64: TERN_CUDA_QG4_WAVE=2 (the 17-32-row tile only) is the default. 115 ran there too: a tie, digests the same.
# 119. session 67: TERN_CUDA_QG4_WAVE=1 (the batch Q4 GEMM's K split rounded down to one wave: ncu put
#      llama3-8b's down and q|k|v at 64 rows at 288 blocks for 264 slots, "a partial wave of 24"; session 15 lost with
#      the same rule on qgemm_q4.cu's older kernel, 8652 → 8492 at 64). Batch decode off / on (AB119_MODELS default
#      llama3-8b:q4 gemma4-12b:q4, AB119_CONC default 8,32,64) with ids digests (other slices: other bits, a digest may
#      differ)
if [[ " $SECTIONS " == *" 119 "* ]]; then
    conc_ab "TERN_CUDA_QG4_WAVE=0;TERN_CUDA_QG4_WAVE=1" "${AB119_MODELS:-llama3-8b:q4 gemma4-12b:q4}" "${AB119_CONC:-8,32,64}"
    say_digests "conc_*QG4_WAVE*_1.txt"
fi

# 120. session 68, written without a GPU run (the device refused every start after the first two calls): the Gemma 4
#      batch decode's pre-norm and q|k|v launches (ncu of gemma4-12b bf16 at 64 sequences, section 114, NOTES (cb)).
#      Three opt-in switches: TERN_CUDA_SPLIT_MERGED=1 (gemm.c gemm_norm_split's merged form: precise q / k up to 256
#      rows after one pre-norm kernel that writes xn and the bf16 pair, the plain v on its high half; was rmsnorm +
#      three conversions; bitwise), TERN_CUDA_NORM_RES_N=1 (the post-norm adds folded into the pre-norm kernels, now
#      also at batch steps: gemma4.c's second residual buffer holds 256 rows; bitwise) and TERN_CUDA_G4_QKV (ops.h
#      norm_qkv_norm_rope_kv: q|k|v joined at load as one split GEMM, nrk_rows norming / roping / storing from its rows;
#      bit 0 sliding layers, bit 1 full layers' q|k with V = K; the bf16 bound). Op tests (timed even if one fails: the
#      summary says so), then batch decode at AB120_CONC (default 32,64: 8 rows take none of these paths) for
#      AB120_MODELS (default gemma4-12b, bf16) over AB120_SETS (default: all off; the two bitwise ones — digests must
#      match all-off; + G4_QKV=1; + G4_QKV=3), then b1 of gemma4-12b bf16 at 512 with TERN_CUDA_QKV_ONE=0 (no joined
#      weights) and the default (joined: must not cost the one-row path). Make each default where it wins.
if [[ " $SECTIONS " == *" 120 "* ]]; then
    ops_ok ${AB120_OPS:-cuda_qkv_nrk cuda_norm_gemm_split cuda_norm_gemm_res cuda_norm_mlp cuda_norm_rope_kv} || say "120: AN OP TEST FAILED"
    on="TERN_CUDA_NORM_RES_N=1 TERN_CUDA_SPLIT_MERGED=1"
    conc_ab "${AB120_SETS:-TERN_CUDA_NORM_RES_N=0;$on;$on TERN_CUDA_G4_QKV=1;$on TERN_CUDA_G4_QKV=3}" \
        "${AB120_MODELS:-gemma4-12b}" "${AB120_CONC:-32,64}"
    say_digests "conc_*_1.txt"
    for rep in $(seq "${AB120_B1_REPS:-2}"); do
        for v in 0 1; do say "b1 gemma4-12b bf16 512 TERN_CUDA_QKV_ONE=$v rep $rep: $(b1e "TERN_CUDA_QKV_ONE=$v" 512 gemma4-12b)"; done
    done
fi

# 121. session 69: section 120's three switches on the other Gemma 4 geometries (e4b: head dims 256 / 512, KV shared
#      layers; 26b-a4b: MoE, k_eq_v full layers) — batch decode at AB121_CONC (default 32,64) for AB121_MODELS (default
#      gemma4-e4b gemma4-26b-a4b, bf16), all off against AB121_ON (default all three on), ids digests
if [[ " $SECTIONS " == *" 121 "* ]]; then
    conc_ab "TERN_CUDA_NORM_RES_N=0;${AB121_ON:-TERN_CUDA_NORM_RES_N=1 TERN_CUDA_SPLIT_MERGED=1 TERN_CUDA_G4_QKV=3}" \
        "${AB121_MODELS:-gemma4-e4b gemma4-26b-a4b}" "${AB121_CONC:-32,64}"
    say_digests "conc_*_1.txt"
fi

# 122. session 69: test_model_g4_batch on the GPU (the joined path against the separate ops and cpu f32 at the real head
#      dims, 16 / 64 rows), then the new defaults (NORM_RES_N, SPLIT_MERGED on, G4_QKV=3) against all three off, batch decode of
#      AB122_MODELS (default gemma4-12b) at AB122_CONC (default 32,64), ids digests (the defaults must give section 120's
#      G4_QKV=3 digests)
if [[ " $SECTIONS " == *" 122 "* ]]; then
    g4_batch g4_batch
    conc_ab "TERN_AB=default;TERN_CUDA_NORM_RES_N=0 TERN_CUDA_SPLIT_MERGED=0 TERN_CUDA_G4_QKV=0" \
        "${AB122_MODELS:-gemma4-12b}" "${AB122_CONC:-32,64}"
    say_digests "conc_*_1.txt"
fi

# 123. session 69: every cuBLASLt heuristic answer for gemma4-12b's batch-decode GEMMs (BENCH_LT_SET=g12: o, down,
#      joined q|k|v, gate|up in bf16 rows) at AB123_N (default 64 128: q|k|v runs at 2n columns) — ncu with section
#      120's switches on put q|k|v (29 µs for 63 MB) and o (15 µs for 31 MB) at ~2.1 TB/s against gate|up's 2.6
if [[ " $SECTIONS " == *" 123 "* ]]; then
    export BENCH_LT_SET=g12
    ltsweep_sum ltsweep_g12 "${AB123_N:-64 128}"
    unset BENCH_LT_SET
fi

# 124. session 69: batch decode over any settings — AB124_SETS (";"-separated env words, e.g. a TERN_LT_PIN entry that
#      section 123 found faster alone: "TERN_AB=default;TERN_LT_PIN=8192,128,3840,..."), AB124_MODELS (default
#      gemma4-12b), AB124_CONC (default 64); ids digests. A GEMM picked faster alone ran slower in the model before
#      (session 30, NOTES (aq)): pin only what wins here
if [[ " $SECTIONS " == *" 124 "* ]]; then
    conc_ab "${AB124_SETS:-TERN_AB=default}" "${AB124_MODELS:-gemma4-12b}" "${AB124_CONC:-64}"
    say_digests "conc_*_1.txt"
fi

# 125. session 69, written after the device budget ran out: TERN_CUDA_PLE_N=1 (ops.h ple_block: Gemma 4's per-layer input
#      block at batch steps in four launches instead of seven — rmsnorm_add_bf16, the gate GEMM, act_mul_bf16 reading the
#      slice in place, the projection GEMM; bitwise the separate ops). Op test cuda_ple_block, test_model_g4_batch with it
#      on, then batch decode off / on for AB125_MODELS (default gemma4-e4b) at AB125_CONC (default 32,64): the ids
#      digests must be equal. Make it the default if it wins.
if [[ " $SECTIONS " == *" 125 "* ]]; then
    ops_ok cuda_ple_block || say "125: THE OP TEST FAILED"
    g4_batch g4_batch_ple TERN_CUDA_PLE_N=1
    conc_ab "TERN_CUDA_PLE_N=0;TERN_CUDA_PLE_N=1" "${AB125_MODELS:-gemma4-e4b}" "${AB125_CONC:-32,64}"
    say_digests "conc_*PLE_N*_1.txt"
fi

# 126. session 70: a model's batch-decode GEMMs by heuristic rank (lt_gemm.c TERN_LT_RANK) — bench_cuda --ltsweep over
#      AB126_SET (BENCH_LT_SET: e4b, the default, g12, g31, a4b, or llama) at AB126_N (default 64 128), each shape's fastest answer kept
#      where it beats the first by 3 % or more, then batch decode of AB126_MODELS (default gemma4-e4b) at AB126_CONC
#      (default 64) with the default answers and with those ranks; ids digests (other answers: other sums, the bf16 bound)
if [[ " $SECTIONS " == *" 126 "* ]]; then
    export BENCH_LT_SET=${AB126_SET:-e4b}
    ltsweep_sum ltsweep_126 "${AB126_N:-64 128}"
    unset BENCH_LT_SET
    rank=$(grep '^ltsweep.* rank ' "$OUT/ltsweep_126.txt" | awk '{ us = -1; for (i = 1; i < NF; i++) if ($i ~ /^#[0-9]+$/) us = $(i + 1) + 0;
        r = $NF; k = r; sub(/,[0-9]+$/, "", k); if (us <= 0) next
        if (!(k in first)) { first[k] = us; order[++nk] = k }
        if (!(k in bu) || us < bu[k]) { bu[k] = us; br[k] = r } }
        END { for (i = 1; i <= nk; i++) { k = order[i]; if (bu[k] < 0.97 * first[k]) printf "%s%s", (o++ ? "/" : ""), br[k] } }')
    say "126: TERN_LT_RANK=${rank:-(none: no answer 3 % faster than the first)}"
    if [ -n "$rank" ]; then
        conc_ab "TERN_AB=default;TERN_LT_RANK=$rank" "${AB126_MODELS:-gemma4-e4b}" "${AB126_CONC:-64}"
        say_digests "conc_*_1.txt"
    fi
fi

# 127. session 70 (ran in session 71, NOTES (ce); removed): TERN_CUDA_PLE_N=2 (ple_mma.cu, Gemma 4's per-layer input
#      gate as a split-K tensor-core kernel and the projection as a second) — op tests passed, e4b at 32 / 64 / 128
#      sequences 5286 / 10147 / 15554 -> 5148 / 9194 / 13817 dec tok/s

# 128. session 70 (ran in session 71, NOTES (ce)): where the batch Q4 GEMM's warps wait, instruction by instruction — ncu's SourceCounters
#      (warp-state samples per SASS instruction; the build has -lineinfo) for one qg4w launch of a 64-sequence decode
#      step (AB128_MODEL, default llama3-8b:q4; AB128_KERNELS, default qg4w), saved as a report, then its source page
#      as CSV; the summary lists the 40 instructions with the most stall samples and the stall reasons' totals.
#      Session 67 found it latency-bound (~9 cycles between a warp's instructions, 25 % occupancy): this says which
#      waits (the ring's barrier, cp.async, wgmma.wait, the decode's dependences) to attack
if [[ " $SECTIONS " == *" 128 "* ]]; then
    m=${AB128_MODEL:-llama3-8b:q4}
    timeout 240 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none --clock-control none \
        --kernel-name "regex:${AB128_KERNELS:-qg4w}" --launch-skip 40 --launch-count 1 --section SourceCounters \
        --section WarpStateStats --import-source yes -f -o "$OUT/ncu128" build/concurrency --random "$m" --device cuda \
        --compute bf16 --conc 64 --prompt 128 --gen 4 --requests 2 --no-prefix > "$OUT/ncu128.log" 2>&1
    say "128: ncu rc $? ($m, ${AB128_KERNELS:-qg4w}, one launch)"
    timeout 120 /usr/local/cuda/bin/ncu -i "$OUT/ncu128.ncu-rep" --page source --csv --print-source sass \
        > "$OUT/ncu128_sass.csv" 2> "$OUT/ncu128_sass.err"
    timeout 60 /usr/local/cuda/bin/ncu -i "$OUT/ncu128.ncu-rep" --page details --csv > "$OUT/ncu128_details.csv" 2>&1
    python3 - "$OUT/ncu128_sass.csv" <<'PY' 2>&1 | head -70 | tee -a "$S"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if r]
head = next((i for i, r in enumerate(rows) if any("Source" == c.strip() or "Address" in c for c in r)), None)
if head is None:
    print("no source table; first lines:"); [print("  ", ",".join(r)[:160]) for r in rows[:8]]; sys.exit()
h = [c.strip() for c in rows[head]]
def col(*keys):
    for k in keys:
        for j, c in enumerate(h):
            if k.lower() in c.lower(): return j
    return None
src, samp = col("Source"), col("Warp Stall Sampling (All", "Sampling Data (All", "Stall Sampling")
print("columns:", len(h), "| source", h[src] if src is not None else None, "| samples", h[samp] if samp is not None else None)
if samp is None: print("  ", " | ".join(h)[:600]); sys.exit()
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[head + 1:] if len(r) > max(src, samp)]
tot = sum(num(r[samp]) for r in body) or 1.0
print("instructions %d, stall samples %d" % (len(body), tot))
for r in sorted(body, key=lambda r: -num(r[samp]))[:40]:
    print("%6.2f%%  %s" % (100 * num(r[samp]) / tot, r[src].strip()[:110]))
# the per-reason columns (names with "stall_" or "Stall"), summed over the kernel
reasons = [(j, c) for j, c in enumerate(h) if ("stall" in c.lower() and j != samp)]
agg = sorted(((sum(num(r[j]) for r in body), c) for j, c in reasons), reverse=True)[:12]
for v, c in agg: print("  reason %-60s %10.0f" % (c[:60], v))
PY
fi

# 129. session 71 (ran, NOTES (ce); removed): TERN_CUDA_QG4_LATE=1 (qgemm_q4_wg.cu: a tile's scales and biases paired
#      in tile() instead of right after their loads) — the stalls moved elsewhere (section 128 with it: long_sb 998 ->
#      632 samples, the same total), llama3-8b q4 / gemma4-12b q4 at 32 / 64 / 128 sequences within ±1 %

# 130. session 71 (ran as part of 131, NOTES (ce): +1.3–2.9 %, kept): the batch Q4 GEMMs' decode with its and-or as one LOP3 (qgemm_q4.cuh q4_deq: 0x43004300 from the
#      kernel arguments, Q4Args.magic; the same bits). Op tests cuda_qgemm_q4 / _wg, the kernels alone (bench_cuda --xr),
#      then batch decode of AB130_MODELS (default llama3-8b:q4 gemma4-12b:q4) at AB130_CONC (default 32,64,128) against
#      the tree before it (pack with GPU_PACK_BASE_CONC=<that tree's build/concurrency>): ids digests equal
if [[ " $SECTIONS " == *" 130 "* ]]; then
    ops_ok cuda_qgemm_q4 cuda_qgemm_q4_wg || say "130: AN OP TEST FAILED"
    timeout 100 build/bench_cuda --xr > "$OUT/magic_bench.txt" 2>&1
    say "bench --xr: $(grep '^bmm' "$OUT/magic_bench.txt" | grep -E 'n=(8|16|32|64|128) qg4' | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ';')"
    [ -x build/base/concurrency ] || say "130: no build/base/concurrency (GPU_PACK_BASE_CONC)"
    conc_ab "TERN_AB=base BIN=build/base/concurrency;TERN_AB=magic" "${AB130_MODELS:-llama3-8b:q4 gemma4-12b:q4}" \
        "${AB130_CONC:-32,64,128}"
    say_digests "conc_*_1.txt"
fi

# 131, 133, 135, 136, 137 (sessions 71-72: TERN_CUDA_QG4_PIPE, _QG4_RED, _QG4_LB, _Q4_MLP and their sets) ran in session 73
#      on an H100, lost and were removed with their switches (NOTES (cg)).

# 132. session 71 (ran in session 73: a win with TERN_CUDA_Q4_ATT_O, both default now, NOTES (cg)): TERN_CUDA_Q4_NORM=1 (gemm.c q4_norm_gemm: norm_matmul for
#      many Q4 rows with the pre-norm writing the batch Q4 GEMM's staged bf16 x itself, norm.cu rmsnorm_q4s — one
#      q4w_stage_x launch fewer for q|k|v and for gate|up a layer; bitwise). Op test cuda_q4_norm, then batch decode of
#      AB132_MODELS (default llama3-8b:q4 gemma4-12b:q4) at AB132_CONC (default 32,64,128), 0 against 1: ids digests equal
if [[ " $SECTIONS " == *" 132 "* ]]; then
    ops_ab 132 cuda_q4_norm "TERN_CUDA_Q4_NORM=0;TERN_CUDA_Q4_NORM=1" "${AB132_MODELS:-llama3-8b:q4 gemma4-12b:q4}" \
        "${AB132_CONC:-32,64,128}" "conc_*Q4_NORM*_1.txt"
    grep 'err q4_norm' "$OUT/q4_norm_ops.txt" | grep -c 'same bits, y same bits' | sed 's/^/132: bitwise cases /' | tee -a "$S"
fi

# 134. session 71 (ran in session 73: mixed, -1.3 to +0.8 %, opt-in; NOTES (cg)): TERN_CUDA_Q4_QKV=1 (gemm.c tern__cuda_q4_qkv_rope: norm_qkv_rope_kv
#      for many Q4 rows — section 132's staged pre-norm, and the q|k|v GEMM's K slices summed inside the rope and cache
#      stores, fused.cu rope_kv_parts, instead of qg4_reduce + rope_kv_write; bitwise). Op test cuda_q4_qkv_rope, then
#      batch decode of AB134_MODELS (default llama3-8b:q4) at AB134_CONC (default 32,64,128): off, Q4_QKV, and Q4_QKV with
#      Q4_NORM (the MLP's pre-norm too); ids digests equal
if [[ " $SECTIONS " == *" 134 "* ]]; then
    ops_ab 134 cuda_q4_qkv_rope "TERN_CUDA_Q4_QKV=0;TERN_CUDA_Q4_QKV=1;TERN_CUDA_Q4_QKV=1 TERN_CUDA_Q4_NORM=1" \
        "${AB134_MODELS:-llama3-8b:q4}" "${AB134_CONC:-32,64,128}" "conc_*Q4_QKV*_1.txt"
    grep 'err q4_qkv_rope' "$OUT/q4_qkv_rope_ops.txt" | head -6 | tee -a "$S"
fi

# 138. session 73 (ran in session 76 on an H100: a tie, −0.7 to +0.4 %, NOTES (cj); opt-in): TERN_CUDA_Q4_QKV=1 on the new defaults (Q4_NORM and Q4_ATT_O on) — its one mixed result again, with
#      two reps: op tests cuda_q4_qkv_rope / cuda_q4_norm / cuda_attention_o, then batch decode of AB138_MODELS (default
#      llama3-8b:q4 gemma4-12b:q4) at AB138_CONC (default 32,64,128), off against on; ids digests equal
if [[ " $SECTIONS " == *" 138 "* ]]; then
    ops_ab 138 "cuda_q4_qkv_rope cuda_q4_norm cuda_attention_o" "${AB138_SETS:-TERN_AB=default;TERN_CUDA_Q4_QKV=1}" \
        "${AB138_MODELS:-llama3-8b:q4 gemma4-12b:q4}" "${AB138_CONC:-32,64,128}" "conc_*_1.txt"
fi

# 139. session 73 (ran in session 74 on an H200, NOTES (ch); the 128-sequence step is the widest one since
#      ncu_step.py picks the last step of the whole batch): why 128 sequences of llama3-8b q4 barely beat 64 (11.9k against 11.5k dec tok/s on an H100: the step
#      takes ~1.9x as long for 2x the rows, 0.23 of the floor against 0.35) — one step's kernels at 64 and at 128
#      sequences under ncu (serialized; compare the shares and each kernel's 64 → 128 growth: the Q4 GEMMs' second
#      column tile re-decodes every weight tile, attention doubles with the KV). AB139_MODELS (default llama3-8b:q4)
if [[ " $SECTIONS " == *" 139 "* ]]; then
    for m in ${AB139_MODELS:-llama3-8b:q4}; do
        for c in 64 128; do
            tag=$(printf '%s_%s' "$m" "$c" | tr -c 'a-zA-Z0-9.' '_')
            NCU_CONC=$c ncu_conc64 300 $m 8 ncu139_$tag --metrics gpu__time_duration.sum
            say "ncu $m at $c sequences (serialized, one step):"
            python3 scripts/ncu_step.py "$OUT/ncu139_$tag.csv" --seq 24 2>&1 | head -${AB_NCU_ROWS:-40} | tee -a "$S"
            xz -f "$OUT/ncu139_$tag.csv"
        done
    done
fi

# 140. (session 73's TERN_CUDA_QG4_N128, 65..128 rows as one 128-column wgmma tile) ran in session 74 on an H200 and
#      lost: kernel alone at n = 128 4096x14336 66.3 → 71.8 µs, llama3-8b q4 at 96 / 128 sequences −7 / −1.5 %,
#      gemma4-12b −10 / −5 % (NOTES (ch)); removed with its op-test pass.

# 141. session 74 (ran in session 75 on an H200, NOTES (ci): at 64 rows the copies and barriers alone ~65 % of the
#      kernel, no decode ≈ full, no wgmmas −20 %): what a 64-column tile's chain in qg4w costs without each part — TERN_CUDA_QG4_PROBE (timing
#      only, outputs wrong; the plain 64-column instance alone, so n = 33..128 rows outside the gate|up pair): 1 no
#      decode (raw words as A), 2 no wgmma, 3 neither. bench_cuda --xr's qg4 rows at n = 64 and 128 for each value.
#      At 64 and 128 rows the kernel runs at ~27 % of the tensor cores' bf16 rate and its time doubles with the
#      columns (NOTES (ch)): if 1 ≈ 0, the wgmma chain (issue, the per-tile wait, the barrier) bounds it; if 2 ≈ 0, the
#      decode and the copies do
if [[ " $SECTIONS " == *" 141 "* ]]; then
    AB_OP_TIMEOUT=300 ops_ok cuda_qgemm_q4_wg || say "141: AN OP TEST FAILED" # after N128's removal, + occ3 / asy / mint1
    grep -E 'err .*(occ3|asy)' "$OUT/qgemm_q4_wg_ops.txt" | sort -k8 -g | tail -3 | tee -a "$S"
    for v in 0 1 2 3 0; do
        TERN_CUDA_QG4_PROBE=$v timeout 100 build/bench_cuda --xr > "$OUT/probe_bench_$v.txt" 2>&1
        say "PROBE=$v: $(grep '^bmm' "$OUT/probe_bench_$v.txt" | grep -E 'n=(64|128) qg4' | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ';')"
    done
fi

# 142. session 74 (ran in session 76 on an H100: −10 to −15 %, removed — the switch now does nothing; NOTES (cj)): TERN_CUDA_QG4_OCC=3 — the batch Q4 GEMM (qg4w) at three blocks an SM (24 warps, 80
#      registers, a 3-stage ring; the 64-column tiles decoded and multiplied in two halves; small spills at 64 columns:
#      4 / 16 bytes plain, 24 / 92 pair) with the split K aimed at 3 blocks an SM. The kernels alone at n = 32 / 64 /
#      128 both ways, then batch decode of AB142_MODELS (default llama3-8b:q4 gemma4-12b:q4) at AB142_CONC (default
#      32,64,128), 2 against 3 (another split K: digests may differ). Run 141 first (its op test covers OCC 3)
# qg4_switch VAR "a b" MODELS CONC: the batch Q4 GEMMs alone (bench_cuda --xr, n = 32 / 64 / 128) for VAR=a and b,
# then batch decode of MODELS at CONC a against b, and the ids digests
qg4_switch() {
    local v
    for v in $2; do
        env "$1=$v" timeout 100 build/bench_cuda --xr > "$OUT/xr_${1}_$v.txt" 2>&1
        say "$1=$v: $(grep '^bmm' "$OUT/xr_${1}_$v.txt" | grep -E 'n=(32|64|128) qg4' | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ';')"
    done
    conc_ab "$1=${2% *};$1=${2#* }" "$3" "$4"
    say_digests "conc_*${1}*_1.txt"
}
if [[ " $SECTIONS " == *" 142 "* ]]; then
    qg4_switch TERN_CUDA_QG4_OCC "2 3" "${AB142_MODELS:-llama3-8b:q4 gemma4-12b:q4}" "${AB142_CONC:-32,64,128}"
fi

# 143. session 74 (ran in session 75 on an H200, NOTES (ci): won at 32 rows only — now the 32-column default; the
#      64-column form lost 5–9 % and is no longer built, so =1 here now times only the 32-column tiles): TERN_CUDA_QG4_ASY=1 — the batch Q4 GEMM (qg4w) with each tile in two halves whose wgmmas
#      stay in flight while the warp decodes the next half (wait_group 1; two 16-register fragment sets, 128
#      registers, two blocks an SM as the default; the ring two tiles ahead instead of three, since a tile's x is read
#      until the next one starts). The same sums in the same order as the default (ids digests should match). Kernels
#      alone (n = 32 / 64 / 128), then batch decode of AB143_MODELS (default llama3-8b:q4 gemma4-12b:q4) at AB143_CONC
#      (default 32,64,128), 0 against 1. Run 141 first (its op test covers ASY)
if [[ " $SECTIONS " == *" 143 "* ]]; then
    qg4_switch TERN_CUDA_QG4_ASY "0 1" "${AB143_MODELS:-llama3-8b:q4 gemma4-12b:q4}" "${AB143_CONC:-32,64,128}"
fi

# 144. session 74: where a batch-1 decode step goes on this card — ncu (serialized: use the shares) of one b1 step of
#      each of AB144_MODELS (default "gemma4-e4b gemma4-26b-a4b llama3-8b", bf16: 0.607 / 0.570 / 0.839 of the floor
#      on an H200 against 0.70 / 0.67 / 0.92 on an H100, NOTES (ch); llama3-8b's step exceeds its floor by ~21 µs a
#      layer there against ~14 on an H100); tern-core bench --prompt 64 --gen 4, the last step's kernels by
#      ncu_step.py. Compare with the H100 figures in NOTES (bq) / (bs) to see which launches grow relative to the bytes
#      (the fixed costs) on an H200
if [[ " $SECTIONS " == *" 144 "* ]]; then
    for m in ${AB144_MODELS:-gemma4-e4b gemma4-26b-a4b llama3-8b}; do
        tag=$(printf '%s' "$m" | tr -c 'a-zA-Z0-9.' '_')
        timeout 240 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none --clock-control none \
            --metrics gpu__time_duration.sum --csv --print-units base $T bench --random $m --device cuda --prompt 64 \
            --gen 4 --reps 1 --warmup 0 > "$OUT/ncu144_$tag.csv" 2> "$OUT/ncu144_$tag.err"
        say "ncu $m b1 (serialized, one step):"
        python3 scripts/ncu_step.py "$OUT/ncu144_$tag.csv" --seq 40 2>&1 | head -${AB_NCU_ROWS:-64} | tee -a "$S"
        xz -f "$OUT/ncu144_$tag.csv"
    done
fi

# 145. session 74 (ran in session 75 on an H200 but its ncu, NOTES (ci): MINT=2 +3 % on e4b at 32 / 64, −3.6 % at 128 —
#      now the rule at one column tile; QG4=0 0.55–0.89× the default): the small Gemma 4 geometries' q4 batch decode — on the H200 gemma4-e4b q4 at 64 sequences ran 9574
#      dec tok/s (0.118 of its floor) against 11296 for bf16 (NOTES (ch) 2): its Q4 GEMMs have K = 2560 (20 tiles of
#      128), so the split K stops at nkt / 4 = 5 slices and a block walks 4 tiles. A/B of the batch Q4 kernels against
#      the dequantize + cuBLASLt path they replaced (TERN_CUDA_QG4=0) on AB145_MODELS (default gemma4-e4b:q4
#      gemma4-26b-a4b:q4) at AB145_CONC (default 32,64,128), then ncu of one e4b q4 step at 64 sequences (section
#      114's form); and TERN_CUDA_QG4_MINT=2 (the split down to 2 tiles a block: 10 slices at K = 2560; other
#      partial sums). What to build next for small-K shapes
if [[ " $SECTIONS " == *" 145 "* ]]; then
    conc_ab "TERN_CUDA_QG4=1;TERN_CUDA_QG4=0;TERN_CUDA_QG4_MINT=2" "${AB145_MODELS:-gemma4-e4b:q4 gemma4-26b-a4b:q4}" \
        "${AB145_CONC:-32,64,128}"
    ncu_conc64 240 gemma4-e4b:q4 8 ncu145_e4b_q4 --metrics gpu__time_duration.sum
    say "ncu gemma4-e4b:q4 at 64 sequences (serialized, one step):"
    python3 scripts/ncu_step.py "$OUT/ncu145_e4b_q4.csv" --seq 30 2>&1 | head -${AB_NCU_ROWS:-48} | tee -a "$S"
    xz -f "$OUT/ncu145_e4b_q4.csv"
fi

# 146. session 75 (ran in session 75 on an H200: 12 + 3 passed; glm_attn.cu's at_softmax added after, unrun): the exact
#      paged-attention kernels (attention.cu attn_kernel, kvq_attn.cu kvq_attn_kernel) share their per-tile softmax /
#      P·V, key range and stores through attn_tile.cuh, and glm_attn.cu's latent kernel its softmax step (their f32
#      instruction sequences unchanged, registers the same or fewer, no spills; the address code differs): every
#      cuda_attention*, cuda_kvq* and cuda_glm_latent* op test
if [[ " $SECTIONS " == *" 146 "* ]]; then
    AB_OP_TIMEOUT=240 ops_ok cuda_attention cuda_kvq cuda_glm_latent || say "146: AN OP TEST FAILED"
fi

# 147. session 75 (ran in session 76 on an H100: −10 / −3 % at 64 / 128, removed — the switch now does nothing; NOTES (cj)): TERN_CUDA_QG4_WG4=1 — the batch Q4 GEMM's 64-column tiles (33..128 rows) in blocks of four
#      warpgroups (512 threads, one block an SM, 256 W rows; pair 128 gate + 128 up) sharing each x tile: section
#      141's probe put ~65 % of the 64-row kernel in the copies and barriers, and a two-warpgroup block copies 16 KB of
#      x per 8 KB of codes; this halves the x bytes. Op test first (its wg4 pass), then the kernels alone (n = 32 / 64 /
#      128) and batch decode of AB147_MODELS (default llama3-8b:q4 gemma4-12b:q4) at AB147_CONC (default 64,128), 0
#      against 1 (another split K: digests may differ)
if [[ " $SECTIONS " == *" 147 "* ]]; then
    AB_OP_TIMEOUT=300 ops_ok cuda_qgemm_q4_wg || say "147: AN OP TEST FAILED"
    grep -E 'err .*wg4' "$OUT/qgemm_q4_wg_ops.txt" | sort -k8 -g | tail -2 | tee -a "$S"
    qg4_switch TERN_CUDA_QG4_WG4 "0 1" "${AB147_MODELS:-llama3-8b:q4 gemma4-12b:q4}" "${AB147_CONC:-64,128}"
fi

# 148. session 76 (its model A/B ran in session 76 on an H100 at 64 sequences: e4b / 26b-a4b q4 +2.5 / +2.4 % with both, NOTES
#      (cj); TERN_QGEMM_WAVE now default 1 — pass TERN_QGEMM_WAVE=0 for the rule before): the K split by waves (cuda_internal.h tern__cuda_split_waves) — ncu of a gemma4-e4b q4 64-sequence
#      step on an H100 (NOTES (cj)): its precise q / k on qgemm.cu (one block an SM) ran 160 blocks on 132 SMs, its
#      down projection 280 blocks on 264 slots, each a nearly empty second wave. Op tests (cuda_qgemm_shapes with
#      TERN_QGEMM_WAVE's pass, cuda_qgemm_q4_wg with its wave3 pass), then batch decode of AB148_MODELS (default
#      gemma4-e4b:q4 gemma4-26b-a4b:q4) at AB148_CONC (default 32,64): default, TERN_QGEMM_WAVE=1, and that with
#      TERN_CUDA_QG4_WAVE=3 (other splits: digests may differ)
if [[ " $SECTIONS " == *" 148 "* ]]; then
    AB_OP_TIMEOUT=300 ops_ok cuda_qgemm_shapes cuda_qgemm_q4_wg || say "148: AN OP TEST FAILED"
    conc_ab "${AB148_SETS:-TERN_AB=default;TERN_QGEMM_WAVE=1;TERN_QGEMM_WAVE=1 TERN_CUDA_QG4_WAVE=3}" \
        "${AB148_MODELS:-gemma4-e4b:q4 gemma4-26b-a4b:q4}" "${AB148_CONC:-32,64}"
    say_digests "conc_*_1.txt"
fi

# 149. session 76 (unrun): TERN_CUDA_G1_EPF=1 — gemv1's residual (o, down, the PLE projection) and act·mul (the PLE
#      gate) epilogues take their operand (the old y[o], mv[o]) as each task starts instead of after its sums: one
#      dependent L2 trip off every task's tail, the same bits. ncu of a gemma4-e4b b1 bf16 step (NOTES (cj) 8): six
#      small launches a layer carry ~35 µs of fixed cost. Op tests (cuda_fused_matmuls' grid-3 pass, cuda_matmul_act_mul),
#      then b1 at 512 of AB149_MODELS (default gemma4-e4b; gemma4-26b-a4b; llama3-8b; gemma4-12b, bf16), 0 against 1,
#      AB_REPS reps (default 2)
if [[ " $SECTIONS " == *" 149 "* ]]; then
    ops_ok cuda_fused_matmuls cuda_matmul_act_mul || say "149: AN OP TEST FAILED"
    b1_sets "TERN_CUDA_G1_EPF=0;TERN_CUDA_G1_EPF=1" "${AB149_MODELS:-gemma4-e4b;gemma4-26b-a4b;llama3-8b;gemma4-12b}"
fi

# 150. session 77 (ran on an H100 in session 77, NOTES (ck): TMA 1 +5.4–6.4 % on llama3-8b q4, now the default from K
#      3072 — rerun it with AB150_SETS="TERN_CUDA_QG4_TMA=0;TERN_AB=default" to time the default rule): TERN_CUDA_QG4_TMA=1 — the batch Q4 GEMM's tiles (qg4w's: same decode, same wgmmas, the same
#      bits) sent by the Tensor Memory Accelerator into a 4-stage ring of mbarriers, each warp waiting on its stage alone
#      and freeing it by one arrival; thread 0 refills a stage once all 8 warps freed it: no block barrier and no
#      per-thread copy instructions in the walk (section 141: at 64 rows qg4w's copies and barriers alone ~65 % of it).
#      Op test cuda_qgemm_q4_tma (sweeps + bitwise against qg4w), the kernels alone (bench_cuda --xr, n = 32 / 64 / 128)
#      0 / 1 / 2 / 3 (=2: ASY's half tiles; =3: four warpgroups over 256 rows, one block an SM), then batch decode of
#      AB150_MODELS (default llama3-8b:q4) at AB150_CONC (default 32,64,128) for AB150_SETS (default TMA 0, 1, 2, 3)
if [[ " $SECTIONS " == *" 150 "* ]]; then
    AB_OP_TIMEOUT=${AB_OP_TIMEOUT:-300} ops_ok cuda_qgemm_q4_tma || say "150: AN OP TEST FAILED"
    grep -E '^(FAIL|  bits)' "$OUT/qgemm_q4_tma_ops.txt" | grep -v ' 0 of ' | head -5 | tee -a "$S"
    for v in 0 1 2 3; do
        TERN_CUDA_QG4_TMA=$v timeout 100 build/bench_cuda --xr > "$OUT/xr_tma_$v.txt" 2>&1
        say "TERN_CUDA_QG4_TMA=$v: $(grep '^bmm' "$OUT/xr_tma_$v.txt" | grep -E 'n=(32|64|128) qg4' | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ';')"
    done
    conc_ab "${AB150_SETS:-TERN_CUDA_QG4_TMA=0;TERN_CUDA_QG4_TMA=1;TERN_CUDA_QG4_TMA=2;TERN_CUDA_QG4_TMA=3}" \
        "${AB150_MODELS:-llama3-8b:q4}" "${AB150_CONC:-32,64,128}"
    say_digests "conc_*_1.txt" # every setting's (TERN_AB=default's too)
fi

# 151. (session 77's TERN_CUDA_QG4_TMA_LR=1, the TMA form's stages refilled by the last warp to free them through a
#      shared-memory count) ran in session 78 on an H100 and lost: kernel alone n = 32 14336x4096 26.1 → 34.7 µs,
#      4096x14336 23.6 → 32.3 µs; llama3-8b q4 at 32 sequences 8061 → 6893 dec tok/s (−14.5 %) (NOTES (cl)); removed
#      with its op-test pass.

# 152. session 78: TERN_CUDA_QG4_WAVE=4 (now the default) — the batch Q4 GEMM's K split by waves (tern__cuda_split_waves)
#      at 17+ rows, the ceiling rule at 5..16 (= 3 from 17 rows, = 2 below 17, whose one-wave rounding lost at 8
#      sequences in session 68). Op test cuda_qgemm_q4_wg (its wave3 / wave4 passes; no qg4t instance changed), then batch
#      decode of AB152_MODELS (default gemma4-e4b:q4 gemma4-26b-a4b:q4 llama3-8b:q4) at AB152_CONC (default 32,64,128):
#      TERN_CUDA_QG4_WAVE=2 (the rule before) against the default (other splits: digests may differ)
if [[ " $SECTIONS " == *" 152 "* ]]; then
    AB_OP_TIMEOUT=${AB_OP_TIMEOUT:-300} ops_ab 152 "cuda_qgemm_q4_wg" "${AB152_SETS:-TERN_CUDA_QG4_WAVE=2;TERN_AB=default}" \
        "${AB152_MODELS:-gemma4-e4b:q4 gemma4-26b-a4b:q4 llama3-8b:q4}" "${AB152_CONC:-32,64,128}" "conc_*_1.txt"
fi

# 153. session 78: the TMA default's K floor (TERN_CUDA_QG4_TMA_MIN, default 3072) — session 78's one rep of 0 against
#      the default gave gemma4-e4b q4 −0.6 / −0.1 / −1.2 % at 32 / 64 / 128 (its down, K 10240, and its global layers' o,
#      K 4096, on TMA): TERN_CUDA_QG4_TMA_MIN=11000 (e4b wholly on qg4w; 26b-a4b's K-4096 o too) against the default on
#      AB153_MODELS (default gemma4-e4b:q4 gemma4-26b-a4b:q4) at AB153_CONC (default 32,64,128), AB_REPS reps (2)
if [[ " $SECTIONS " == *" 153 "* ]]; then
    conc_ab "TERN_CUDA_QG4_TMA_MIN=11000;TERN_AB=default" "${AB153_MODELS:-gemma4-e4b:q4 gemma4-26b-a4b:q4}" \
        "${AB153_CONC:-32,64,128}"
    say_digests "conc_*_1.txt"
fi

# Only 8 files come back from a device call: the per-run logs go into one archive (AB_PACK=0 keeps them loose);
# summary.txt and *.log (the caller's redirect, still open) stay as they are
if [ "${AB_PACK:-1}" != 0 ]; then
    ( cd "$OUT" && find . -maxdepth 1 -type f ! -name summary.txt ! -name '*.log' ! -name ab_logs.tar.xz ! -name .ab_files -printf '%f\n' |
        sort > .ab_files && [ -s .ab_files ] && tar cJf ab_logs.tar.xz -T .ab_files && xargs rm -f < .ab_files; rm -f .ab_files )
fi
echo "summary: $S"
