/*
 * lt_gemm.c — every cuBLASLt GEMM of the backend goes through here: the descriptors, which of the heuristic's
 * algorithms a shape runs, and the cache of that choice per shape (gemm.c's paths, glu / mlp / q|k|v, attn_mat.cu,
 * glm.cu's matmul_heads).
 *
 * The choice, in order: TERN_LT_PIN (a configuration built by hand), TERN_LT_PICK / TERN_LT_RANK (the heuristic's
 * answer r, for every shape or per shape), the lm-head-sized GEMMs' timed pick (TERN_LT_TUNE), the batch-decode
 * preference for an unsplit one-wave answer over a split-K first one (TERN_LT_PREFER), else the heuristic's first
 * answer. All but the timed pick give the same algorithm in every process, so the same bits. Moved out of gemm.c in
 * session 70 unchanged (gemm.c keeps the paths that call it, through tern__cuda_lt_gemm / _x).
 */
#include "backend/cuda/gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- cuBLASLt algorithm choice, cached per shape ----
 * cublasLtMatmulAlgoGetHeuristic's first answer is remembered per key (the GEMM's shape, leading
 * dimensions, types, beta and batch count, and which batch strides are zero and their alignment:
 * every stride here is a multiple of 16 elements, and an algorithm does not depend on a stride's
 * value), so eager steps pay the heuristic once per shape instead of on every call (~10 us of CPU
 * each). The same algorithm as before, so the same bits. TERN_LT_CACHE=0 asks on every call. */
#define LT_CACHE 1024
typedef struct lt_key { int m, n, k, ldb, ldc, nb, ab, ct, beta, strides, cty; } lt_key;
typedef struct lt_ent { int used; lt_key key; cublasLtMatmulAlgo_t algo; } lt_ent;
struct tern__cuda_lt_cache { lt_ent e[LT_CACHE]; };


/* TERN_LT_PICK=N (0..7, default 0; read once): take the heuristic's answer N (or its last) instead of its first —
 * for A/B runs of a shape's algorithm (bench_cuda --gemm); other bits than the default */
#define LT_PICK_MAX 8
static int lt_pick(void) {
    static int v = -1;
    if (v < 0) {
        v = tern__cuda_env_int("TERN_LT_PICK", 0);
        v = v < 0 ? 0 : v >= LT_PICK_MAX ? LT_PICK_MAX - 1 : v;
    }
    return v;
}

/* TERN_LT_RANK="m,n,k,r;..." (or '/' between entries; read once): GEMMs of exactly m x n x k (bf16 A, f32 compute; any batch count) take
 * the heuristic's answer r (0..15, or its last) instead of its first. The answers are fixed for one cuBLASLt and
 * GPU, so unlike tuning (lt_tune) every process runs the same algorithm, hence the same bits. bench_cuda --ltsweep
 * prints each answer's entry; gpu_ab.sh section 126 turns a sweep's winners into this list. -1: no entry */
#define LT_RANK_MAX 16
#define LT_RANK_ENTRIES 64
static int lt_rank(int m, int n, int k) {
    static int nr = -1, ent[LT_RANK_ENTRIES][4];
    if (nr < 0) {
        nr = 0;
        for (const char *s = getenv("TERN_LT_RANK"); s && *s && nr < LT_RANK_ENTRIES;) {
            int *v = ent[nr];
            if (sscanf(s, "%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3]) == 4 && v[3] >= 0 && v[3] < LT_RANK_MAX) nr++;
            s = strpbrk(s, ";/");
            if (s) s++;
        }
    }
    for (int i = 0; i < nr; i++)
        if (ent[i][0] == m && ent[i][1] == n && ent[i][2] == k) return ent[i][3];
    return -1;
}

/* Preferred answers (TERN_LT_PREFER, default 1; 0 off). For the skinny GEMMs of batch decode with a long K (down) the
 * heuristic's first answer splits K over a third of a wave where an answer it also offers, without the split and one
 * wave wide, streams the weights faster: for 64..128 rows, when the first answer splits K, the first unsplit answer of
 * 0.85..1 waves is taken (none offered: the first, as before). A few shapes name their answer by configuration (tile,
 * split-K, custom option, cluster shape: sm_90 nvjet). Both are matched among the heuristic's answers, so a cuBLASLt
 * or GPU that offers other answers keeps the first, and every process picks the same (the same bits).
 * H100, session 70 (NOTES (cd), bench_cuda --ltsweep, cold weights): down at 64 / 128 rows, first -> taken: gemma4-12b
 * 49.9 / 53.4 -> 46.2 / 47.9 us, llama3-8b 46.9 / 52.1 -> 43.5 / 45.0; gemma4-12b's gate|up (named) 89.5 / 93.9 ->
 * 86.7 / 89.6; gemma4-e4b's down is offered no unsplit answer. In the models, off / on interleaved on one card:
 * gemma4-12b bf16 at 64 / 128 sequences 5082-5135 / 8127-8144 -> 5220-5239 / 8293-8318 dec tok/s, llama3-8b bf16
 * 9113-9156 / 15675-15698 -> 9402-9433 / 16048-16082; gemma4-e4b and 26b-a4b at 64 unchanged (same ids digests). */
typedef struct lt_pref { int m, n, k, nb; unsigned tile, splitk, custom, cluster; } lt_pref;
static const lt_pref k_lt_prefs[] = {
    {15360, 64, 3840, 2, 134, 1, 0, 3}, {15360, 128, 3840, 2, 21, 1, 3, 7}, /* gemma4-12b gate|up */
};
static int lt_prefer_on(void) {
    static int on = -1;
    if (on < 0) on = tern__cuda_env_int("TERN_LT_PREFER", 1) != 0;
    return on;
}
static const lt_pref *lt_prefer(int m, int n, int k, int nb) {
    for (size_t i = 0; i < sizeof k_lt_prefs / sizeof *k_lt_prefs; i++) {
        const lt_pref *p = &k_lt_prefs[i];
        if (p->m == m && p->n == n && p->k == k && p->nb == nb) return p;
    }
    return NULL;
}
/* gemm.h */
unsigned tern__cuda_lt_cfg(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at) {
    size_t got = 0;
    if (at == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) { /* 16 bits wide: the call wants the exact size */
        uint16_t v = 0;
        return cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &got) == CUBLAS_STATUS_SUCCESS ? v : 9999u;
    }
    uint32_t v = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &got) == CUBLAS_STATUS_SUCCESS ? v : 9999u;
}
/* the answer named by p, or (p NULL) the rule's, else the first */
static int lt_prefer_pick(const cublasLtMatmulHeuristicResult_t *hs, int got, const lt_pref *p) {
    if (!p && tern__cuda_lt_cfg(&hs[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) <= 1) return 0;
    for (int i = 0; i < got; i++) {
        const cublasLtMatmulAlgo_t *a = &hs[i].algo;
        const unsigned sk = tern__cuda_lt_cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
        if (p ? tern__cuda_lt_cfg(a, CUBLASLT_ALGO_CONFIG_TILE_ID) == p->tile && sk == p->splitk &&
                    tern__cuda_lt_cfg(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) == p->custom &&
                    tern__cuda_lt_cfg(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) == p->cluster
              : sk == 1 && hs[i].wavesCount >= 0.85f && hs[i].wavesCount <= 1.0f)
            return i;
    }
    return 0;
}

static int lt_cache_on(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_LT_CACHE", 1) != 0;
    return v;
}

void tern__cuda_lt_cache_free(tern__cuda *c) {
    if (!c) return;
    free(c->lt_cache);
    c->lt_cache = NULL;
}

static lt_ent *lt_slot(tern__cuda *c, const lt_key *k) {
    if (!c->lt_cache && !(c->lt_cache = calloc(1, sizeof(struct tern__cuda_lt_cache)))) return NULL;
    lt_ent *e = c->lt_cache->e;
    unsigned h = 2166136261u;
    const int *p = (const int *)k;
    for (size_t i = 0; i < sizeof *k / sizeof(int); i++) h = (h ^ (unsigned)p[i]) * 16777619u;
    for (int i = 0; i < LT_CACHE; i++) { /* linear probe: the key's slot, or the first free one */
        lt_ent *s = &e[(h + (unsigned)i) % LT_CACHE];
        if (!s->used || !memcmp(&s->key, k, sizeof *k)) return s;
    }
    return NULL; /* full: the caller asks the heuristic every time */
}

/* ---- the heuristic's answers timed for the largest GEMMs (TERN_LT_TUNE, default 1; 0 off) ----
 * The heuristic's first answer is within 1–7 % of the best for every layer GEMM of a batch decode, but 10 % slower on
 * llama3-8b's lm head at 64 rows (291 vs 263 µs; bench_cuda --ltsweep, NOTES (am)), and the best answer depends on
 * the row count, so no fixed pin serves. A plain bf16 GEMM of one matrix with beta 0 whose weights hold at least
 * TERN_LT_TUNE_MELEMS million elements (default 256: lm heads, not layer weights) has its first sighting per shape
 * time up to LT_PICK_MAX answers (one run to warm, three timed, each after an L2 eviction: LT_EVICT_BYTES) and caches
 * the fastest. Eagerly on the stream itself (its pending work is done once the first event completes: the same
 * result); while graph.c records the stream (relaxed mode, the stream drained before recording) on tune_stream over
 * the same operands, whose values do not change the timing; the graph then records the chosen answer. Other captures
 * (lt_sweep.c's thread-local ones) keep the first answer. The answer, hence the summation order, may differ between
 * processes: the bf16 bound, not bits. */
/* bytes of gemm_scratch read before each timed run, more than the H200's 50 MB L2, so a matrix of < 50 MB is timed
 * streaming from HBM as in the model, not from L2 after the warm run. Layer GEMMs stay untuned even so: with
 * TERN_LT_TUNE_MELEMS=16 (q|k|v picked answers up to 24 % faster alone) llama3-8b at 64 sequences ran 1.3–2.8 % slower
 * (H200, session 30, NOTES (aq); 2 % slower without the eviction) */
#define LT_EVICT_BYTES ((size_t)128 << 20)
static int lt_tune_on(long long m, long long k) {
    static long long min = -1;
    if (min < 0) {
        min = tern__cuda_env_int("TERN_LT_TUNE", 1) ? tern__cuda_env_int("TERN_LT_TUNE_MELEMS", 256) : 0;
        min = min > 0 ? min * 1000000LL : 0;
    }
    return min > 0 && m * k >= min;
}

/* index of the fastest of got answers (0 when timing is not possible here) */
static int lt_tune(tern__cuda *c, const tern__cuda_lt_desc *d, const cublasLtMatmulHeuristicResult_t *hs, int got,
                   const void *a, const void *bm, void *y, size_t ws, int m, int n, int k) {
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaStream_t s = c->stream;
    if (got < 2 || cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess) return 0;
    if (cap != cudaStreamCaptureStatusNone) {
        if (!c->capturing) return 0;
        if (!c->tune_stream && cudaStreamCreateWithFlags(&c->tune_stream, cudaStreamNonBlocking) != cudaSuccess) {
            c->tune_stream = NULL;
            cudaGetLastError();
            return 0;
        }
        s = c->tune_stream;
    }
    cudaEvent_t e[2] = {NULL, NULL};
    if (cudaEventCreate(&e[0]) != cudaSuccess || cudaEventCreate(&e[1]) != cudaSuccess) {
        if (e[0]) cudaEventDestroy(e[0]);
        cudaGetLastError();
        return 0;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const size_t ev = c->gemm_scratch_bytes < LT_EVICT_BYTES ? c->gemm_scratch_bytes : LT_EVICT_BYTES;
    float best = 0.0f, t[LT_PICK_MAX] = {0};
    int bi = 0;
    for (int i = 0; i < got; i++) {
        int ok = hs[i].workspaceSize <= ws;
        for (int r = 0; r < 4 && ok; r++) { /* run 0 warms; 1..3 timed, each after an L2 eviction */
            float ms = 0.0f;
            if (r) {
                tern__cuda_l2_evict(c, s, c->gemm_scratch, ev);
                cudaEventRecord(e[0], s);
            }
            ok = cublasLtMatmul(c->lt, d->op, &alpha, a, d->la, bm, d->lb, &beta, y, d->lc, y, d->lc, &hs[i].algo,
                                c->lt_ws, ws, s) == CUBLAS_STATUS_SUCCESS;
            if (ok && r)
                ok = cudaEventRecord(e[1], s) == cudaSuccess && cudaEventSynchronize(e[1]) == cudaSuccess &&
                     cudaEventElapsedTime(&ms, e[0], e[1]) == cudaSuccess;
            t[i] += ms;
        }
        if (ok && (best == 0.0f || t[i] < best)) {
            best = t[i];
            bi = i;
        }
        cudaGetLastError();
    }
    cudaEventDestroy(e[0]);
    cudaEventDestroy(e[1]);
    tern_log(TERN_LOG_INFO, "cuda: GEMM m %d n %d k %d: the heuristic's answer %d of %d, %.1f us (its first %.1f)", m, n,
             k, bi, got, best * 1000.0f / 3, t[0] * 1000.0f / 3);
    return bi;
}

/* The descriptors of one cuBLASLt GEMM (shape as lt_gemm_t below); shared with lt_sweep.c */
tern_status tern__cuda_lt_desc_make(tern__cuda_lt_desc *d, cudaDataType_t cty, int ldc, long long sc, int an,
                                    long long sa, int ldb, long long sb, int m, int n, int k, int nb, cudaDataType_t ab,
                                    cublasComputeType_t ct) {
    memset(d, 0, sizeof *d);
    cublasOperation_t ta = an ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const long long S[3] = {sa, sb, sc};
    if (cublasLtMatmulDescCreate(&d->op, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto fail;
    cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if ((an ? cublasLtMatrixLayoutCreate(&d->la, ab, (uint64_t)m, (uint64_t)k, m)
            : cublasLtMatrixLayoutCreate(&d->la, ab, (uint64_t)k, (uint64_t)m, k)) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    if (cublasLtMatrixLayoutCreate(&d->lb, ab, (uint64_t)k, (uint64_t)n, ldb) != CUBLAS_STATUS_SUCCESS) goto fail;
    if (cublasLtMatrixLayoutCreate(&d->lc, cty, (uint64_t)m, (uint64_t)n, ldc) != CUBLAS_STATUS_SUCCESS) goto fail;
    if (nb >= 1) {
        cublasLtMatrixLayout_t L[3] = {d->la, d->lb, d->lc};
        for (int i = 0; i < 3; i++) {
            cublasLtMatrixLayoutSetAttribute(L[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nb, sizeof nb);
            int64_t s64 = S[i];
            cublasLtMatrixLayoutSetAttribute(L[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s64, sizeof s64);
        }
    }
    return TERN_OK;
fail:
    tern__cuda_lt_desc_free(d);
    return TERN_EDEVICE;
}

void tern__cuda_lt_desc_free(tern__cuda_lt_desc *d) {
    if (!d) return;
    if (d->lc) cublasLtMatrixLayoutDestroy(d->lc);
    if (d->lb) cublasLtMatrixLayoutDestroy(d->lb);
    if (d->la) cublasLtMatrixLayoutDestroy(d->la);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
    memset(d, 0, sizeof *d);
}

int tern__cuda_lt_algo_make(tern__cuda *c, const tern__cuda_lt_desc *d, cudaDataType_t cty,
                            const unsigned cfg[TERN_CUDA_LT_CFG], cublasLtMatmulAlgo_t *al) {
    if (cublasLtMatmulAlgoInit(c->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, cty, cty, (int)cfg[0], al) !=
        CUBLAS_STATUS_SUCCESS)
        return 0;
    const uint32_t tile = cfg[1], stages = cfg[2], red = cfg[4], swz = cfg[5], custom = cfg[6];
    const int32_t splitk = (int32_t)cfg[3];
    const uint16_t cluster = (uint16_t)cfg[7];
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages);
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk);
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red);
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz);
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom);
    cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster);
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    return cublasLtMatmulAlgoCheck(c->lt, d->op, d->la, d->lb, d->lc, d->lc, al, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= TERN_CUDA_LT_WS_BYTES;
}

/* TERN_LT_PIN (gemm.h): the configuration pinned for GEMMs of exactly m x n x k, if any; 1 and *cfg when found */
static int lt_pin(int m, int n, int k, unsigned cfg[TERN_CUDA_LT_CFG]) {
    const char *s = getenv("TERN_LT_PIN");
    while (s && *s) {
        int v[8], used = 0;
        if (sscanf(s, "%d,%d,%d,%d,%d,%d,%d,%d%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &used) == 8 &&
            v[0] == m && v[1] == n && v[2] == k) {
            memset(cfg, 0, TERN_CUDA_LT_CFG * sizeof *cfg);
            for (int i = 0; i < 5; i++) cfg[i] = (unsigned)v[3 + i];
            return 1;
        }
        s = strchr(s, ';');
        if (s) s++;
    }
    return 0;
}

/* C_b (m x n, ld ldc) = op(A_b)·B_b with op(A) = Aᵀ, A_b (k x m, ld k) — or (an = 1) op(A) = A, A_b (m x k, ld
 * m) — and B_b (k x n, ld ldb), C of type cty (f32, or bf16: the f32 accumulators rounded once). nb = 0: one
 * plain GEMM; nb >= 1: a strided batch of nb (A_b at a + b·sa, B_b at bm + b·sb, C_b at y + b·sc, element
 * offsets). beta 0 or 1. */
static tern_status lt_gemm_t(tern__cuda *c, void *y, cudaDataType_t cty, int ldc, long long sc, const void *a, int an,
                             long long sa, const void *bm, int ldb, long long sb, int m, int n, int k, int nb,
                             cudaDataType_t ab, cublasComputeType_t ct, float beta) {
    tern__cuda_lt_desc d;
    cublasLtMatmulPreference_t pref = NULL;
    tern_status st = TERN_EDEVICE;
    size_t ws = TERN_CUDA_LT_WS_BYTES;
    float alpha = 1.0f;
    cublasLtMatmulHeuristicResult_t hs[LT_RANK_MAX], h;
    int got = 0;
    if (cty == CUDA_R_32F && nb == 0 && !an && ab == CUDA_R_16BF && ct == CUBLAS_COMPUTE_32F && ldb == k &&
        (beta == 0.0f || beta == 1.0f) && tern__cuda_wgemm(c, (float *)y, ldc, a, bm, m, n, k, beta != 0.0f))
        return TERN_OK; /* one matrix of a decode batch: wgemm.cu */
    const long long S[3] = {sa, sb, sc};
    int sk = 0; /* which strides are zero, and their alignment class */
    for (int i = 0; i < 3; i++) sk = sk * 8 + (S[i] == 0 ? 0 : S[i] % 16 == 0 ? 1 : S[i] % 8 == 0 ? 2 : 3);
    const lt_key key = {m, n, k, ldb, ldc, nb, (int)ab, (int)ct, beta != 0.0f, nb >= 1 ? sk : 0, (int)cty * 2 + !!an};
    lt_ent *ent = lt_cache_on() ? lt_slot(c, &key) : NULL;
    if (tern__cuda_lt_desc_make(&d, cty, ldc, sc, an, sa, ldb, sb, m, n, k, nb, ab, ct) != TERN_OK) return st;
    if (!ent || !ent->used) {
        unsigned pin[TERN_CUDA_LT_CFG];
        const int pinned = ab == CUDA_R_16BF && ct == CUBLAS_COMPUTE_32F && nb == 0 && !an && lt_pin(m, n, k, pin) &&
                           tern__cuda_lt_algo_make(c, &d, cty, pin, &h.algo);
        if (!pinned) {
            if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) goto done;
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
            const int bf = ab == CUDA_R_16BF && ct == CUBLAS_COMPUTE_32F && !an;
            const int rank = bf ? lt_rank(m, n, k) : -1;
            const int tune = ent && bf && rank < 0 && !lt_pick() && beta == 0.0f && nb == 0 && lt_tune_on(m, k);
            const int pf_on = bf && rank < 0 && !lt_pick() && lt_prefer_on() && n >= 64 && n <= 128;
            const lt_pref *pf = pf_on ? lt_prefer(m, n, k, nb) : NULL;
            /* 0: one answer asked for, as always (tuning: all of them) */
            const int pick = rank >= 0 ? rank : lt_pick();
            if (cublasLtMatmulAlgoGetHeuristic(c->lt, d.op, d.la, d.lb, d.lc, d.lc, pref,
                                               tune ? LT_PICK_MAX : pf_on ? LT_RANK_MAX : pick + 1, hs, &got) !=
                    CUBLAS_STATUS_SUCCESS ||
                got < 1)
                goto done;
            h = hs[tune ? lt_tune(c, &d, hs, got, a, bm, y, ws, m, n, k)
                   : pf_on ? lt_prefer_pick(hs, got, pf)
                        : pick < got ? pick : got - 1];
        }
        if (ent) {
            ent->key = key;
            ent->algo = h.algo;
            ent->used = 1;
        }
    }
    if (cublasLtMatmul(c->lt, d.op, &alpha, a, d.la, bm, d.lb, &beta, y, d.lc, y, d.lc, ent ? &ent->algo : &h.algo,
                       c->lt_ws, ws, c->stream) == CUBLAS_STATUS_SUCCESS)
        st = TERN_OK;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    tern__cuda_lt_desc_free(&d);
    return st;
}

/* the same with f32 C; shared with glm.cu (matmul_heads) */
tern_status tern__cuda_lt_gemm(tern__cuda *c, float *y, int ldc, long long sc, const void *a, long long sa,
                               const void *bm, int ldb, long long sb, int m, int n, int k, int nb, cudaDataType_t ab,
                               cublasComputeType_t ct, float beta) {
    return lt_gemm_t(c, y, CUDA_R_32F, ldc, sc, a, 0, sa, bm, ldb, sb, m, n, k, nb, ab, ct, beta);
}

/* the general form (attn_mat.cu): bf16 A and B, f32 accumulation, C of type cty */
tern_status tern__cuda_lt_gemm_x(tern__cuda *c, void *y, cudaDataType_t cty, int ldc, long long sc, const void *a, int an,
                                 long long sa, const void *bm, int ldb, long long sb, int m, int n, int k, int nb,
                                 float beta) {
    return lt_gemm_t(c, y, cty, ldc, sc, a, an, sa, bm, ldb, sb, m, n, k, nb, CUDA_R_16BF, CUBLAS_COMPUTE_32F, beta);
}

