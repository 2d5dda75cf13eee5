/*
 * lt_sweep.c — every algorithm cuBLASLt's heuristic offers for one GEMM, timed (bench_cuda --ltsweep).
 *
 * gemm.c takes the heuristic's first answer per shape. For the skinny GEMMs of batch decode (a few dozen rows
 * against a whole weight matrix) that answer streams the weights at 2.3-3.3 TB/s on the H200 (NOTES (aa)), so
 * this asks for up to 16 answers and times each on the same operands: the weight rotates over `copies` copies
 * (the L2 stays cold, as in a decode step), launches are timed in a row between two events. One line per answer:
 * its rank, µs, GB/s of the caller's byte count, and the configuration that names it (algorithm id, tile, stages,
 * split-K and its reduction, swizzle, custom option, cluster shape) and its TERN_LT_RANK entry (lt_gemm.c: that shape
 * takes answer r), what a per-shape rule would pin.
 * tern__cuda_lt_search (bench_cuda --ltsearch) goes past the heuristic: every configuration cuBLASLt accepts, with
 * the TERN_LT_PIN entry that selects it (H200, session 27: only algorithm 21 is configurable on sm_90, and it beats
 * the heuristic's nvjet answers only on the head; NOTES (an)). Diagnostic only: no engine path calls them.
 */
#include "backend/cuda/gemm.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWEEP_MAX 16

/* timed launches over `copies` weight copies: four passes, at least 40 */
static int sweep_reps(int copies) { return copies * 4 < 40 ? 40 : copies * 4; }

/* launches r0..r1-1 of algorithm al, launch r on copy r % copies of A; 0 at the first that fails */
static int sweep_run(tern__cuda *c, const tern__cuda_lt_desc *d, const cublasLtMatmulAlgo_t *al, void *y, const void *a,
                     size_t a_step, int copies, const void *bm, float beta, int r0, int r1) {
    const float alpha = 1.0f;
    for (int r = r0; r < r1; r++)
        if (cublasLtMatmul(c->lt, d->op, &alpha, (const char *)a + (size_t)(r % copies) * a_step, d->la, bm, d->lb, &beta,
                           y, d->lc, y, d->lc, al, c->lt_ws, TERN_CUDA_LT_WS_BYTES, c->stream) != CUBLAS_STATUS_SUCCESS)
            return 0;
    return 1;
}

/* µs per launch of algorithm al over reps launches after a warm-up pass over the copies; < 0 when it failed */
static double time_algo(tern__cuda *c, const tern__cuda_lt_desc *d, const cublasLtMatmulAlgo_t *al, void *y, const void *a,
                        size_t a_step, int copies, const void *bm, float beta, int reps, cudaEvent_t e0, cudaEvent_t e1) {
    int ok = sweep_run(c, d, al, y, a, a_step, copies, bm, beta, 0, copies);
    cudaEventRecord(e0, c->stream);
    ok = ok && sweep_run(c, d, al, y, a, a_step, copies, bm, beta, 0, reps);
    cudaEventRecord(e1, c->stream);
    float ms = 0;
    if (!ok || cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
        cudaGetLastError();
        return -1.0;
    }
    return 1e3 * ms / reps;
}

void tern__cuda_lt_sweep(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, long long sc,
                         const void *a, size_t a_step, int copies, long long sa, const void *bm, int m, int n, int k,
                         int nb, float beta, double bytes) {
    if (!c || copies < 1) return;
    tern__cuda_lt_desc d;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t hs[SWEEP_MAX];
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t ws = TERN_CUDA_LT_WS_BYTES;
    int got = 0;
    const cudaDataType_t cty = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaSetDevice(c->device);
    if (tern__cuda_lt_desc_make(&d, cty, ldc, sc, 0, sa, k, 0, m, n, k, nb, CUDA_R_16BF, CUBLAS_COMPUTE_32F) != TERN_OK) {
        printf("ltsweep %s: no descriptors\n", name);
        return;
    }
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) goto done;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (cublasLtMatmulAlgoGetHeuristic(c->lt, d.op, d.la, d.lb, d.lc, d.lc, pref, SWEEP_MAX, hs, &got) !=
        CUBLAS_STATUS_SUCCESS)
        got = 0;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto done;
    const int reps = sweep_reps(copies);
    for (int i = 0; i < got; i++) {
        const cublasLtMatmulAlgo_t *al = &hs[i].algo;
        const double us = time_algo(c, &d, al, y, a, a_step, copies, bm, beta, reps, e0, e1);
        if (us <= 0) {
            printf("ltsweep %-28s n=%-4d #%-2d failed\n", name, n, i);
            continue;
        }
        static const cublasLtMatmulAlgoConfigAttributes_t at[8] = {
            CUBLASLT_ALGO_CONFIG_ID,            CUBLASLT_ALGO_CONFIG_TILE_ID,       CUBLASLT_ALGO_CONFIG_STAGES_ID,
            CUBLASLT_ALGO_CONFIG_SPLITK_NUM,    CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
            CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,  CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
        unsigned v[8];
        for (int j = 0; j < 8; j++) v[j] = tern__cuda_lt_cfg(al, at[j]);
        printf("ltsweep %-28s n=%-4d #%-2d %8.1f us %7.1f GB/s  algo %u tile %u stages %u splitk %u red %u swz %u "
               "custom %u cluster %u waves %.2f rank %d,%d,%d,%d\n",
               name, n, i, us, bytes / us * 1e-3, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], hs[i].wavesCount, m,
               n, k, i);
        fflush(stdout);
    }
done:
    if (!got) printf("ltsweep %s n=%d: the heuristic gave no answer\n", name, n);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    tern__cuda_lt_desc_free(&d);
}

/* ---- the exhaustive form (bench_cuda --ltsearch): every algorithm id × tile × stages × split-K (1..16) × reduction
 * scheme cuBLASLt accepts for the GEMM (cublasLtMatmulAlgoCheck), each timed briefly (one pass over the copies after a
 * warm-up), the fastest SEARCH_TOP timed again like the sweep; one line each with the TERN_LT_PIN entry that selects
 * it (gemm.c), and the heuristic's first answer beside them. Cluster shape auto, no swizzle, custom option 0. */
#define SEARCH_TOP 8
#define SEARCH_MAX 6000

typedef struct { unsigned cfg[TERN_CUDA_LT_CFG]; double us; } lt_cand;

static int cand_cmp(const void *a, const void *b) {
    const double x = ((const lt_cand *)a)->us, y = ((const lt_cand *)b)->us;
    return x < y ? -1 : x > y;
}

/* an array attribute of an initialized algorithm (tile or stages ids): its count, at most cap (0: none) */
static int cap_ids(const cublasLtMatmulAlgo_t *al, cublasLtMatmulAlgoCapAttributes_t at, uint32_t *ids, int cap) {
    size_t need = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(al, at, NULL, 0, &need) != CUBLAS_STATUS_SUCCESS) return 0;
    int k = (int)(need / sizeof(uint32_t));
    if (k > cap) k = cap;
    if (k <= 0 || cublasLtMatmulAlgoCapGetAttribute(al, at, ids, (size_t)k * sizeof(uint32_t), &need) != CUBLAS_STATUS_SUCCESS)
        return 0;
    return k;
}

void tern__cuda_lt_search(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, const void *a, size_t a_step,
                          int copies, const void *bm, int m, int n, int k, float beta, double bytes) {
    if (!c || copies < 1) return;
    const cudaDataType_t cty = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    tern__cuda_lt_desc d;
    cudaEvent_t e0 = NULL, e1 = NULL;
    lt_cand *cand = malloc(SEARCH_MAX * sizeof *cand);
    int nc = 0, ids[256], nid = 0, checked = 0;
    cudaSetDevice(c->device);
    if (!cand || tern__cuda_lt_desc_make(&d, cty, ldc, 0, 0, 0, k, 0, m, n, k, 0, CUDA_R_16BF, CUBLAS_COMPUTE_32F) != TERN_OK) {
        printf("ltsearch %s: no descriptors\n", name);
        free(cand);
        return;
    }
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto done;
    if (cublasLtMatmulAlgoGetIds(c->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, cty, cty, 256, ids, &nid) !=
        CUBLAS_STATUS_SUCCESS)
        nid = 0;
    static const unsigned SPLITS[] = {1, 2, 3, 4, 6, 8, 12, 16}, REDS[] = {1, 2, 4}; /* in place, compute type, output type */
    for (int i = 0; i < nid && nc < SEARCH_MAX; i++) {
        cublasLtMatmulAlgo_t al;
        if (cublasLtMatmulAlgoInit(c->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, cty, cty, ids[i], &al) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        uint32_t tiles[128], stages[128], red_mask = 0;
        int32_t splitk = 0;
        size_t got = 0;
        int nt = cap_ids(&al, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, 128), ns = cap_ids(&al, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, 128);
        if (!nt) { tiles[0] = 0; nt = 1; }
        if (!ns) { stages[0] = 0; ns = 1; }
        cublasLtMatmulAlgoCapGetAttribute(&al, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk, sizeof splitk, &got);
        cublasLtMatmulAlgoCapGetAttribute(&al, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask, sizeof red_mask, &got);
        for (int t = 0; t < nt; t++)
            for (int s = 0; s < ns; s++)
                for (size_t sp = 0; sp < (splitk ? TERN_ARRAY_LEN(SPLITS) : 1); sp++)
                    for (size_t r = 0; r < (SPLITS[sp] > 1 ? TERN_ARRAY_LEN(REDS) : 1); r++) {
                        if (SPLITS[sp] > 1 && !(red_mask & REDS[r])) continue;
                        const unsigned cfg[TERN_CUDA_LT_CFG] = {(unsigned)ids[i], tiles[t], stages[s], SPLITS[sp],
                                                                SPLITS[sp] > 1 ? REDS[r] : 0, 0, 0, 0};
                        cublasLtMatmulAlgo_t x;
                        checked++;
                        if (nc >= SEARCH_MAX || !tern__cuda_lt_algo_make(c, &d, cty, cfg, &x)) continue;
                        const double us = time_algo(c, &d, &x, y, a, a_step, copies, bm, beta, copies, e0, e1);
                        if (us <= 0) continue;
                        memcpy(cand[nc].cfg, cfg, sizeof cfg);
                        cand[nc++].us = us;
                    }
    }
    qsort(cand, (size_t)nc, sizeof *cand, cand_cmp);
    printf("ltsearch %-28s n=%-4d %d algorithm ids, %d configurations checked, %d ran\n", name, n, nid, checked, nc);
    const int reps = sweep_reps(copies);
    for (int i = 0; i < nc && i < SEARCH_TOP; i++) {
        cublasLtMatmulAlgo_t x;
        if (!tern__cuda_lt_algo_make(c, &d, cty, cand[i].cfg, &x)) continue;
        const double us = time_algo(c, &d, &x, y, a, a_step, copies, bm, beta, reps, e0, e1);
        const unsigned *g = cand[i].cfg;
        printf("ltsearch %-28s n=%-4d top%d %8.1f us %7.1f GB/s  pin %d,%d,%d,%u,%u,%u,%u,%u\n", name, n, i, us,
               bytes / us * 1e-3, m, n, k, g[0], g[1], g[2], g[3], g[4]);
    }
    fflush(stdout);
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    tern__cuda_lt_desc_free(&d);
    free(cand);
}

/* ---- wgemm.cu against cuBLASLt (bench_cuda --wgemm): y [n][m] (+)= X [n][k]·W [m][k]ᵀ with valid bf16 operands,
 * once each from the same y for the difference (rel L2 and the largest), then each path timed as one CUDA graph of
 * `reps` launches over weight copies rotating through >= 400 MB (cold L2; the graph keeps host launch costs out of
 * the figure, as the decode step's graph does). */
extern int tern__cuda_wgemm_on;
extern unsigned long long tern__cuda_wgemm_calls;

static double wg_graph_us(tern__cuda *c, int on, float *y, const uint8_t *w, size_t wb, int copies, const void *x,
                          int m, int n, int k, float beta, cudaEvent_t e0, cudaEvent_t e1) {
    const int reps = sweep_reps(copies);
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ge = NULL;
    float ms = -1.0f;
    tern__cuda_wgemm_on = on;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1.0;
    int ok = 1;
    for (int r = 0; r < reps && ok; r++)
        ok = tern__cuda_lt_gemm(c, y, m, 0, w + (size_t)(r % copies) * wb, 0, x, k, 0, m, n, k, 0, CUDA_R_16BF,
                                CUBLAS_COMPUTE_32F, beta) == TERN_OK;
    if (cudaStreamEndCapture(c->stream, &gr) != cudaSuccess || !ok ||
        cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess || cudaGraphLaunch(ge, c->stream) != cudaSuccess)
        goto done;
    cudaEventRecord(e0, c->stream);
    cudaGraphLaunch(ge, c->stream);
    cudaEventRecord(e1, c->stream);
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) ms = -1.0f;
done:
    if (ge) cudaGraphExecDestroy(ge);
    if (gr) cudaGraphDestroy(gr);
    cudaGetLastError();
    return ms < 0 ? -1.0 : 1e3 * ms / reps;
}

/* the next of a fixed sequence of values in [-1, 1) (the same operands every run) */
static float lcg_unit(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

void tern__cuda_wgemm_bench(tern__cuda *c, const char *name, int m, int k, float beta, const int *ns, int nn) {
    const size_t wb = (size_t)m * k * 2;
    int copies = (int)((400u << 20) / wb + 1), nmax = 1;
    if (copies > 16) copies = 16;
    for (int i = 0; i < nn; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
    const size_t xe = (size_t)nmax * k, ye = (size_t)nmax * m;
    uint16_t *h = malloc((wb > xe * 2 ? wb : xe * 2));
    float *y0 = malloc(ye * 4), *ya = malloc(ye * 4), *yb = malloc(ye * 4);
    uint8_t *w = NULL;
    void *x = NULL;
    float *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    const int keep = tern__cuda_wgemm_on;
    cudaSetDevice(c->device);
    if (!h || !y0 || !ya || !yb || cudaMalloc((void **)&w, wb * copies) != cudaSuccess ||
        cudaMalloc(&x, xe * 2) != cudaSuccess || cudaMalloc((void **)&y, ye * 4) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        printf("wgemm %s: no memory\n", name);
        goto done;
    }
    uint32_t s = 12345u;
    const float amp = 1.0f / sqrtf((float)k);
    for (size_t i = 0; i < wb / 2; i++) h[i] = tern_f32_to_bf16(amp * lcg_unit(&s));
    cudaStreamSynchronize(c->stream);
    for (int i = 0; i < copies; i++) cudaMemcpy(w + (size_t)i * wb, h, wb, cudaMemcpyHostToDevice);
    for (size_t i = 0; i < xe; i++) h[i] = tern_f32_to_bf16(lcg_unit(&s));
    cudaMemcpy(x, h, xe * 2, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    for (size_t i = 0; i < ye; i++) y0[i] = lcg_unit(&s);
    for (int i = 0; i < nn; i++) {
        const int n = ns[i];
        float *out[2] = {ya, yb};
        int served = 0;
        for (int on = 0; on < 2; on++) {
            const unsigned long long before = tern__cuda_wgemm_calls;
            tern__cuda_wgemm_on = on;
            cudaMemcpy(y, y0, (size_t)n * m * 4, cudaMemcpyHostToDevice);
            cudaDeviceSynchronize();
            tern__cuda_lt_gemm(c, y, m, 0, w, 0, x, k, 0, m, n, k, 0, CUDA_R_16BF, CUBLAS_COMPUTE_32F, beta);
            cudaStreamSynchronize(c->stream); /* the backend's stream does not wait for the legacy one */
            if (cudaMemcpy(out[on], y, (size_t)n * m * 4, cudaMemcpyDeviceToHost) != cudaSuccess) cudaGetLastError();
            if (on) served = tern__cuda_wgemm_calls > before;
        }
        double d2 = 0, r2 = 0, dmax = 0;
        for (size_t j = 0; j < (size_t)n * m; j++) {
            const double dd = (double)ya[j] - yb[j];
            d2 += dd * dd;
            r2 += (double)ya[j] * ya[j];
            dmax = fabs(dd) > dmax ? fabs(dd) : dmax;
        }
        const double ua = wg_graph_us(c, 0, y, w, wb, copies, x, m, n, k, beta, e0, e1);
        const double ub = wg_graph_us(c, 1, y, w, wb, copies, x, m, n, k, beta, e0, e1);
        printf("wgemm %-26s n=%-4d cublasLt %8.1f us %7.1f GB/s | wgemm %8.1f us %7.1f GB/s %s| rel %.2e max %.2e\n",
               name, n, ua, wb / ua * 1e-3, ub, wb / ub * 1e-3, served ? "" : "(not served) ",
               r2 > 0 ? sqrt(d2 / r2) : 0.0, dmax);
        fflush(stdout);
    }
done:
    tern__cuda_wgemm_on = keep;
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    cudaGetLastError();
    free(h); free(y0); free(ya); free(yb);
}
