/*
 * cuda_ops_tests_moe.h — the sorted, grouped expert GEMM of moe_mlp (src/backend/cuda/moe_gemm.cu)
 * against cpu-ref in the bf16 compute mode. Tokens are routed unevenly on purpose (a skewed
 * expert choice, so one expert gets several 16/64-row tiles, and the last two experts get no
 * rows at all), over several n, E, k, widths with a K tail (I = 96, 160, 192: inputs not a
 * multiple of 128), Q bits 4/8 (groups 32/64/128, F32/F16/BF16 scales), BF16 and F16 weights,
 * both tile heights (TERN_MOE_NT=2/8), the pair path in the same mode (TERN_MOE_GROUPED=0) and a
 * format the grouped GEMM declines (Q3: falls back to the pair path). Bound: the bf16x2 mode's
 * split-bf16 contract, rel L2 <= 1e-4; the plain bf16 mode (x and h rounded) <= 1e-2. Also checked: two runs give the same bits, and a token's
 * row is the same bits alone in a smaller batch (same tile height): the grouped path is
 * batch-invariant for a fixed tile height.
 * TERN_MOE_BENCH=1 in the environment adds a timing table at the gemma4-26b-a4b geometry (H 2816,
 * I 704, 128 experts, top-8, MLX q4 g64): pair path vs grouped (16- and 64-row tiles) per n.
 */
#ifndef TERN_CUDA_OPS_TESTS_MOE_H
#define TERN_CUDA_OPS_TESTS_MOE_H

#include <time.h>

static void *moe_to(tern_backend *be, const void *h, size_t bytes) {
    void *d = be->vt->alloc(be, bytes ? bytes : 4);
    if (d && bytes) be->vt->upload(be, d, h, bytes);
    return d;
}

/* k distinct experts per token among the first E - 2, skewed toward expert 0 (u^3); weights > 0 */
static void moe_route_uneven(int32_t *idx, float *wts, int n, int E, int k) {
    const int eu = E - 2;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                const float u = 0.5f + 0.5f * test_randf(&g_seed);
                e = (int)(eu * u * u * u);
                if (e >= eu) e = eu - 1;
                dup = 0;
                for (int q = 0; q < j; q++) dup |= idx[r * k + q] == e;
            } while (dup);
            idx[r * k + j] = e;
            wts[r * k + j] = 0.2f + 0.4f * (1.0f + test_randf(&g_seed));
        }
}

typedef struct moe_w { /* one expert MLP: host stacks, cpu-ref and gpu views */
    hw g, u, d;
    tern_tensor gr, ur, dr, gg, ug, dg;
} moe_w;

static int moe_w_make(moe_w *m, tern_backend *gpu, tern_dtype dt, int bits, int gs, tern_dtype sdt, int E, int H,
                      int I, int with_ref) {
    tern_error err = {0};
    m->g = make_w(dt, bits, gs, sdt, E, I, H, 0);
    m->u = make_w(dt, bits, gs, sdt, E, I, H, 0);
    m->d = make_w(dt, bits, gs, sdt, E, H, I, 0);
    m->gr = m->gg = m->g.t;
    m->ur = m->ug = m->u.t;
    m->dr = m->dg = m->d.t;
    if (gpu->vt->upload_weight(gpu, &m->gg, &err) || gpu->vt->upload_weight(gpu, &m->ug, &err) ||
        gpu->vt->upload_weight(gpu, &m->dg, &err)) {
        printf("  upload_weight: %s\n", err.msg);
        return 0;
    }
    if (with_ref && (g_ref->vt->upload_weight(g_ref, &m->gr, &err) || g_ref->vt->upload_weight(g_ref, &m->ur, &err) ||
                     g_ref->vt->upload_weight(g_ref, &m->dr, &err))) {
        printf("  upload_weight (ref): %s\n", err.msg);
        return 0;
    }
    return 1;
}

/* m16 = m's host stacks uploaded to the bf16-mode backend g_gpu16 (free with free_weight on g_gpu16) */
static int moe_w_upload16(moe_w *m16, const moe_w *m) {
    *m16 = *m;
    m16->gg = m->g.t; m16->ug = m->u.t; m16->dg = m->d.t;
    tern_error err = {0};
    const int up = !g_gpu16->vt->upload_weight(g_gpu16, &m16->gg, &err) &&
                   !g_gpu16->vt->upload_weight(g_gpu16, &m16->ug, &err) &&
                   !g_gpu16->vt->upload_weight(g_gpu16, &m16->dg, &err);
    CHECK(up, "bf16-mode upload: %s", err.msg);
    return up;
}

static void moe_w_free(moe_w *m, tern_backend *gpu) {
    gpu->vt->free_weight(gpu, &m->gg);
    gpu->vt->free_weight(gpu, &m->ug);
    gpu->vt->free_weight(gpu, &m->dg);
    free_w(&m->g); free_w(&m->u); free_w(&m->d);
}

/* y = moe_mlp on the gpu backend (host result, caller frees) */
static float *moe_run(tern_backend *gpu, moe_w *m, const float *x, const int32_t *idx, const float *wts, int n, int H,
                      int I, int k, int act) {
    void *xd = moe_to(gpu, x, (size_t)n * H * 4), *id = moe_to(gpu, idx, (size_t)n * k * 4);
    void *wd = moe_to(gpu, wts, (size_t)n * k * 4);
    void *yd = nan_buf(gpu, (size_t)n * H), *sd = nan_buf(gpu, (size_t)n * k * 2 * I);
    gpu->vt->moe_mlp(gpu, yd, xd, n, H, id, wd, k, &m->gg, &m->ug, &m->dg, act, sd);
    float *y = from_gpu(gpu, yd, (size_t)n * H);
    gpu->vt->free(gpu, xd); gpu->vt->free(gpu, id); gpu->vt->free(gpu, wd);
    gpu->vt->free(gpu, yd); gpu->vt->free(gpu, sd);
    return y;
}

/* every path (TERN_MOE_GROUPED, TERN_MOE_NT) against the reference yr within tol; the grouped one
 * twice (same bits) and for the first half of the tokens alone (same bits: batch-invariant) */
static void moe_paths(moe_w *m, const char *nm, int E, int k, int n, int H, int I, int act, const float *x,
                      const int32_t *idx, const float *wts, const float *yr, double tol, const char *mode) {
    static const char *P[][2] = {{"1", "2"}, {"1", "8"}, {"0", "2"}};
    for (size_t p = 0; p < TERN_ARRAY_LEN(P); p++) {
        setenv("TERN_MOE_GROUPED", P[p][0], 1);
        setenv("TERN_MOE_NT", P[p][1], 1);
        float *yg = moe_run(g_gpu16, m, x, idx, wts, n, H, I, k, act);
        const double rel = rel_or_nan(yg, yr, (size_t)n * H);
        printf("  err moe-grouped %-14s E=%-3d k=%d n=%-3d %s%s %.2e\n", nm, E, k, n,
               P[p][0][0] == '0' ? "pairs" : P[p][1][0] == '2' ? "nt2  " : "nt8  ", mode, rel);
        CHECK(rel <= tol, "%s E %d k %d n %d path %s/%s%s rel %.2e", nm, E, k, n, P[p][0], P[p][1], mode, rel);
        if (P[p][0][0] == '1') {
            float *y2 = moe_run(g_gpu16, m, x, idx, wts, n, H, I, k, act);
            CHECK(!memcmp(y2, yg, (size_t)n * H * 4), "%s n %d%s: two runs differ", nm, n, mode);
            const int h = n / 2 > 0 ? n / 2 : 1;
            float *y3 = moe_run(g_gpu16, m, x, idx, wts, h, H, I, k, act);
            CHECK(!memcmp(y3, yg, (size_t)h * H * 4), "%s n %d%s: first %d rows differ alone", nm, n, mode, h);
            free(y2); free(y3);
        }
        free(yg);
    }
    unsetenv("TERN_MOE_GROUPED");
    unsetenv("TERN_MOE_NT");
}

TEST(cuda_moe_grouped) {
    if (!g_gpu16) { SKIP("cuda_moe_grouped", "no bf16-mode backend"); return; }
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; int act, H, I, E, k, ns[3]; } C[] = {
        {TERN_DT_Q, 4, 64, TERN_DT_BF16, TERN_ACT_GELU_TANH, 256, 192, 16, 4, {9, 40, 130}},
        {TERN_DT_Q, 8, 32, TERN_DT_F16, TERN_ACT_SILU, 384, 160, 8, 2, {3, 64, 300}},
        {TERN_DT_BF16, 0, 0, 0, TERN_ACT_SILU, 256, 128, 32, 8, {1, 5, 50}},
        {TERN_DT_F16, 0, 0, 0, TERN_ACT_GELU_TANH, 128, 96, 12, 3, {17, 100, 0}},
        {TERN_DT_Q, 4, 128, TERN_DT_F32, TERN_ACT_SILU, 256, 256, 64, 6, {2, 33, 0}},
        {TERN_DT_Q, 3, 64, TERN_DT_BF16, TERN_ACT_GELU_TANH, 256, 128, 8, 2, {20, 0, 0}}, /* declined -> pairs */
    };
    for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
        const int H = C[c].H, I = C[c].I, E = C[c].E, k = C[c].k;
        moe_w m;
        int ok = moe_w_make(&m, g_gpu16, C[c].dt, C[c].bits, C[c].gs, C[c].sdt, E, H, I, 1);
        CHECK(ok, "upload case %zu", c);
        char nm[64];
        fmt_name(&m.g.t, nm, sizeof nm);
        for (int i = 0; ok && i < 3 && C[c].ns[i]; i++) {
            const int n = C[c].ns[i];
            float *x = rnd((size_t)n * H, 1.0f), *wts = malloc((size_t)n * k * sizeof *wts);
            int32_t *idx = malloc((size_t)n * k * sizeof *idx);
            moe_route_uneven(idx, wts, n, E, k);
            float *yr = malloc((size_t)n * H * sizeof *yr), *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
            g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &m.gr, &m.ur, &m.dr, C[c].act, scr);
            moe_paths(&m, nm, E, k, n, H, I, C[c].act, x, idx, wts, yr, 1e-4, "");
            /* the default choice (pair count threshold) */
            float *yd = moe_run(g_gpu16, &m, x, idx, wts, n, H, I, k, C[c].act);
            const double rel = rel_or_nan(yd, yr, (size_t)n * H);
            CHECK(rel <= 1e-4, "%s E %d k %d n %d default path rel %.2e", nm, E, k, n, rel);
            /* --compute bf16 (plain): x and h rounded to bf16 on both paths (Q experts as bf16 in the
             * grouped GEMM, exact on the pair path): ~2e-3 on random data; grouped still deterministic
             * and the same bits for a token alone in a smaller batch */
            tern__cuda_bf16_split = 0;
            moe_paths(&m, nm, E, k, n, H, I, C[c].act, x, idx, wts, yr, 1e-2, " plain");
            tern__cuda_bf16_split = 1;
            free(yd); free(x); free(wts); free(idx); free(yr); free(scr);
        }
        moe_w_free(&m, g_gpu16);
    }
}

/* moe_blas.cu (cuBLAS grouped GEMMs for large chunks, plain bf16 mode, BF16 experts; TERN_MOE_BLAS): against
 * cpu-ref within the plain bound (x, the projections' outputs and h rounded to bf16), two runs the same bits,
 * experts without rows (the last two) and skewed counts, in both forms (the grouped calls, the padded strided
 * batches), and an even routing with pairs that have no local expert; the mma path on the same data for comparison */
TEST(cuda_moe_blas) {
    if (!g_gpu16) { SKIP("cuda_moe_blas", "no bf16-mode backend"); return; }
    static const struct { int act, H, I, E, k, n, even; } C[] = { /* even: every expert n·k/E rows */
        {TERN_ACT_GELU_TANH, 256, 192, 16, 4, 300, 0},
        {TERN_ACT_SILU, 384, 96, 8, 2, 700, 0},
        {TERN_ACT_GELU_TANH, 256, 192, 16, 4, 200, 1},
    };
    tern__cuda_bf16_split = 0;
    for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
        const int H = C[c].H, I = C[c].I, E = C[c].E, k = C[c].k, n = C[c].n;
        moe_w m;
        int ok = moe_w_make(&m, g_gpu16, TERN_DT_BF16, 0, 0, 0, E, H, I, 1);
        CHECK(ok, "upload case %zu", c);
        if (!ok) continue;
        float *x = rnd((size_t)n * H, 1.0f), *wts = malloc((size_t)n * k * sizeof *wts);
        int32_t *idx = malloc((size_t)n * k * sizeof *idx);
        moe_route_uneven(idx, wts, n, E, k);
        for (int p = 0; C[c].even && p < n * k; p++) /* distinct in a row; every 7th pair without a local expert (-1:
                                                       * expert parallelism), which every path skips */
            idx[p] = p % 7 == 3 ? -1 : (p / k * k + p % k * (E / k) + p / k) % E;
        float *yr = malloc((size_t)n * H * sizeof *yr), *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
        g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &m.gr, &m.ur, &m.dr, C[c].act, scr);
        setenv("TERN_MOE_GROUPED", "1", 1);
        extern unsigned long long tern__cuda_moe_blas_calls, tern__cuda_moe_pad_calls;
        extern int tern__cuda_moe_pad;
        const int keep_pad = tern__cuda_moe_pad;
        for (int form = 0; form < 2; form++) { /* 0: the grouped calls, 1: the padded strided batches (forced) */
            tern__cuda_moe_pad = form ? 2 : 0;
            const unsigned long long calls = tern__cuda_moe_blas_calls, pads = tern__cuda_moe_pad_calls;
            float *yb = moe_run(g_gpu16, &m, x, idx, wts, n, H, I, k, C[c].act);
            float *y2 = moe_run(g_gpu16, &m, x, idx, wts, n, H, I, k, C[c].act);
            const double rel = rel_or_nan(yb, yr, (size_t)n * H);
            printf("  err moe-blas %s E=%-3d k=%d n=%-4d H=%d I=%d %.2e\n", form ? "padded" : "grouped", E, k, n, H, I, rel);
            CHECK(rel <= 1e-2, "moe blas form %d E %d k %d n %d rel %.2e", form, E, k, n, rel);
            CHECK(!memcmp(yb, y2, (size_t)n * H * 4), "moe blas form %d n %d: two runs differ", form, n);
            CHECK(tern__cuda_moe_blas_calls == calls + 2, "moe blas form %d n %d: the path did not run (%llu calls)", form,
                  n, tern__cuda_moe_blas_calls - calls);
            /* the skewed cases' padded rows do not fit the caller's scratch: the grouped calls run them */
            CHECK(tern__cuda_moe_pad_calls == pads + (form && C[c].even ? 2 : 0), "moe blas n %d: %llu padded calls in form %d",
                  n, tern__cuda_moe_pad_calls - pads, form);
            free(yb); free(y2);
        }
        tern__cuda_moe_pad = keep_pad;
        unsetenv("TERN_MOE_GROUPED");
        free(x); free(wts); free(idx); free(yr); free(scr);
        moe_w_free(&m, g_gpu16);
    }
    tern__cuda_bf16_split = 1;
}

static double moe_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* TERN_MOE_BENCH=1: µs per moe_mlp call at the gemma4-26b-a4b geometry, uniform random routing,
 * for a range of n; TERN_MOE_BENCH=N (> 1): that n only (e.g. under a profiler) */
static void cuda_moe_bench(void) {
    const char *v = getenv("TERN_MOE_BENCH");
    const int only = v ? atoi(v) : 0;
    if (only < 1 || !g_gpu16) return;
    const int H = 2816, I = 704, E = 128, k = 8, act = TERN_ACT_GELU_TANH;
    static const int NS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048};
    static const char *P[][2] = {{"0", "2"}, {"1", "2"}, {"1", "8"}};
    moe_w m;
    if (!moe_w_make(&m, g_gpu16, TERN_DT_Q, 4, 64, TERN_DT_BF16, E, H, I, 0)) return;
    tern_backend *b = g_gpu16;
    printf("  bench moe gemma4-26b-a4b q4 g64 (H %d, I %d, E %d, k %d), us per call: pairs / grouped nt2 / nt8\n",
           H, I, E, k);
    for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
        const int n = only > 1 ? only : NS[i];
        if (only > 1 && i > 0) break;
        float *x = rnd((size_t)n * H, 1.0f), *wts = malloc((size_t)n * k * sizeof *wts);
        int32_t *idx = malloc((size_t)n * k * sizeof *idx);
        for (int r = 0; r < n; r++)
            for (int j = 0; j < k; j++) {
                int e, dup;
                do {
                    e = (int)(test_rand_u64(&g_seed) % E);
                    dup = 0;
                    for (int q = 0; q < j; q++) dup |= idx[r * k + q] == e;
                } while (dup);
                idx[r * k + j] = e;
                wts[r * k + j] = 1.0f / k;
            }
        void *xd = moe_to(b, x, (size_t)n * H * 4), *id = moe_to(b, idx, (size_t)n * k * 4);
        void *wd = moe_to(b, wts, (size_t)n * k * 4);
        void *yd = b->vt->alloc(b, (size_t)n * H * 4), *sd = b->vt->alloc(b, (size_t)n * k * 2 * I * 4);
        double us[3];
        for (int p = 0; p < 3; p++) {
            setenv("TERN_MOE_GROUPED", P[p][0], 1);
            setenv("TERN_MOE_NT", P[p][1], 1);
            const int reps = n >= 512 ? 5 : 20;
            for (int r = 0; r < 2; r++) b->vt->moe_mlp(b, yd, xd, n, H, id, wd, k, &m.gg, &m.ug, &m.dg, act, sd);
            b->vt->sync(b);
            const double t0 = moe_now();
            for (int r = 0; r < reps; r++) b->vt->moe_mlp(b, yd, xd, n, H, id, wd, k, &m.gg, &m.ug, &m.dg, act, sd);
            b->vt->sync(b);
            us[p] = (moe_now() - t0) / reps * 1e6;
        }
        unsetenv("TERN_MOE_GROUPED");
        unsetenv("TERN_MOE_NT");
        printf("  bench moe n=%-5d pairs=%-6d %9.1f %9.1f %9.1f\n", n, n * k, us[0], us[1], us[2]);
        printf("csv,moe,%d,%.1f,%.1f,%.1f\n", n, us[0], us[1], us[2]);
        b->vt->free(b, xd); b->vt->free(b, id); b->vt->free(b, wd); b->vt->free(b, yd); b->vt->free(b, sd);
        free(x); free(wts); free(idx);
    }
    moe_w_free(&m, g_gpu16);
}

/* TERN_CUDA_MOE_DOWN1 (moe.cu moe_down1_kernel: the pair path's BF16 / F16 down projection, a term a warp) against
 * the CPU reference and against gemv_kernel's expert mode, on g_gpu (the f32 mode: the pair path at any n): output rows
 * not a multiple of 4, I of one round (704) and of two (1600), k 8 and 11 (a warp with two terms), a dead term (-1:
 * skipped alike, GPU forms compared), blocks of R = 2, 4 and 8 rows */
TEST(cuda_moe_down1) {
    extern int tern__cuda_moe_down1;
    extern unsigned long long tern__cuda_moe_down1_calls;
    extern int tern__cuda_moe_down1_r;
    const int keep = tern__cuda_moe_down1, keep_r = tern__cuda_moe_down1_r;
    static const struct { tern_dtype dt; int I, k, R; } F[] = {
        {TERN_DT_BF16, 704, 8, 4}, {TERN_DT_F16, 704, 11, 2}, {TERN_DT_BF16, 1600, 8, 8}, {TERN_DT_BF16, 704, 8, 2}};
    const int H = 302, E = 16;
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++) {
        const int I = F[f].I, k = F[f].k;
        tern__cuda_moe_down1_r = F[f].R;
        moe_w m;
        const int ok = moe_w_make(&m, g_gpu, F[f].dt, 0, 0, 0, E, H, I, 1);
        CHECK(ok, "upload");
        for (int n = 1; ok && n <= 3; n += 2)
            for (int dead = 0; dead < 2; dead++) {
                float *x = rnd((size_t)n * H, 1.0f), *lg = rnd((size_t)n * E, 2.0f), *wts = malloc(n * k * sizeof *wts);
                int32_t *idx = malloc(n * k * sizeof *idx);
                g_ref->vt->route_topk(g_ref, idx, wts, lg, n, E, k, TERN_ROUTE_SOFTMAX_TOPK, NULL);
                float *yr = malloc((size_t)n * H * sizeof *yr), *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
                if (!dead) g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &m.gr, &m.ur, &m.dr, TERN_ACT_GELU_TANH, scr);
                else idx[1] = -1;
                float *yg[2];
                unsigned long long c0 = 0;
                for (int v = 0; v < 2; v++) {
                    tern__cuda_moe_down1 = v;
                    c0 = tern__cuda_moe_down1_calls;
                    yg[v] = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, TERN_ACT_GELU_TANH);
                }
                char nm[64];
                fmt_name(&m.d.t, nm, sizeof nm);
                if (n == 1) CHECK(tern__cuda_moe_down1_calls == c0 + 1, "%s: moe_down1 did not run", nm);
                const double rv = rel_or_nan(yg[1], yg[0], (size_t)n * H);
                const double rr = dead ? 0.0 : rel_or_nan(yg[1], yr, (size_t)n * H);
                CHECK(rv <= 1e-6 && rr <= 1e-5, "%s I %d k %d n %d dead %d: rel %.2e to gemv_kernel, %.2e to cpu-ref", nm,
                      I, k, n, dead, rv, rr);
                printf("  moe_down1 %-14s I %-4d k %-2d R %d n %d dead %d: rel %.1e to gemv_kernel, %.1e to cpu-ref\n",
                       nm, I, k, F[f].R, n, dead, rv, rr);
                free(x); free(lg); free(wts); free(idx); free(yr); free(scr); free(yg[0]); free(yg[1]);
            }
        moe_w_free(&m, g_gpu);
    }
    tern__cuda_moe_down1 = keep;
    tern__cuda_moe_down1_r = keep_r;
}

static void cuda_moe_tests(void) {
    RUN(cuda_moe_grouped);
    RUN(cuda_moe_blas);
    RUN(cuda_moe_down1);
    cuda_moe_bench();
}

#endif
