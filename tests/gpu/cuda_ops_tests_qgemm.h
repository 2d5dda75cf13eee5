/*
 * cuda_ops_tests_qgemm.h — the tensor-core batched matmul (src/backend/cuda/qgemm.cu) against
 * cpu-ref in the bf16 compute mode: every stored format it takes (BF16, F16, MLX affine Q bits
 * 2..8 x groups 32/64/128 x F32/F16/BF16 scales) at row counts around its tile edges (2, 8/9,
 * 16/17, 64/65 and > 64: several column tiles), weight-row counts that are not multiples of
 * the 128-row block, long inputs that split K over blocks (partials + reduction), matrices of
 * strided expert stacks (matmul_expert), and shapes it declines (inputs not a multiple of 128
 * -> the other paths). Bound: the bf16 mode's split-bf16 contract, rel L2 <= 1e-4 (observed
 * ~1e-6; plain bf16 would be ~3e-3). Each check prints "  err <format> n=<rows> bf16q ...".
 * Included by cuda_ops_tests.h after its helpers (make_w, check_matmul).
 */
#ifndef TERN_CUDA_OPS_TESTS_QGEMM_H
#define TERN_CUDA_OPS_TESTS_QGEMM_H

TEST(cuda_qgemm_formats) {
    if (!g_gpu16) { SKIP("cuda_qgemm", "no bf16-mode backend"); return; }
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; } F[] = {
        {TERN_DT_BF16, 0, 0, 0}, {TERN_DT_F16, 0, 0, 0},
        {TERN_DT_Q, 2, 64, TERN_DT_BF16}, {TERN_DT_Q, 3, 64, TERN_DT_BF16}, {TERN_DT_Q, 4, 64, TERN_DT_BF16},
        {TERN_DT_Q, 5, 64, TERN_DT_BF16}, {TERN_DT_Q, 6, 64, TERN_DT_BF16}, {TERN_DT_Q, 8, 64, TERN_DT_BF16},
        {TERN_DT_Q, 4, 32, TERN_DT_F16}, {TERN_DT_Q, 4, 128, TERN_DT_F32}, {TERN_DT_Q, 3, 32, TERN_DT_F32},
        {TERN_DT_Q, 6, 128, TERN_DT_F16}, {TERN_DT_Q, 8, 32, TERN_DT_F32}, {TERN_DT_Q, 2, 128, TERN_DT_F16},
        {TERN_DT_Q, 5, 32, TERN_DT_F16},
    };
    static const int NS[] = {2, 3, 8, 9, 16, 17, 40, 64, 65, 130};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++) {
        hw h = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, 1, 300, 384, 0);
        char nm[64];
        fmt_name(&h.t, nm, sizeof nm);
        for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
            double rel = check_matmul(g_gpu16, &h, NS[i], -1);
            printf("  err %-16s n=%-4d bf16q %.2e\n", nm, NS[i], rel);
            CHECK(rel <= 1e-4, "%s n=%d bf16 mode rel %.3e", nm, NS[i], rel);
        }
        free_w(&h);
    }
}

TEST(cuda_qgemm_shapes) {
    if (!g_gpu16) { SKIP("cuda_qgemm", "no bf16-mode backend"); return; }
    /* split K (few weight rows, long inputs), several row blocks, a declined width (in % 128) */
    static const struct { tern_dtype dt; int bits, gs, out, in; } S[] = {
        {TERN_DT_Q, 4, 64, 64, 4096}, {TERN_DT_BF16, 0, 0, 64, 4096}, {TERN_DT_Q, 8, 128, 1000, 1024},
        {TERN_DT_F16, 0, 0, 257, 2048}, {TERN_DT_Q, 4, 32, 130, 160}, {TERN_DT_BF16, 0, 0, 96, 320},
        {TERN_DT_Q, 3, 32, 1, 256},
    };
    static const int NS[] = {2, 5, 16, 33, 64, 100};
    extern int tern__cuda_qgemm_wave;
    const int keep_wave = tern__cuda_qgemm_wave;
    for (size_t s = 0; s < TERN_ARRAY_LEN(S); s++) {
        hw h = make_w(S[s].dt, S[s].bits, S[s].gs, TERN_DT_BF16, 1, S[s].out, S[s].in, 0);
        char nm[64];
        fmt_name(&h.t, nm, sizeof nm);
        for (int wave = 0; wave < 2; wave++) { /* the fill rule's split, then TERN_QGEMM_WAVE's */
            tern__cuda_qgemm_wave = wave;
            for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
                double rel = check_matmul(g_gpu16, &h, NS[i], -1);
                printf("  err %-16s %dx%d n=%-4d wave %d bf16q %.2e\n", nm, S[s].out, S[s].in, NS[i], wave, rel);
                CHECK(rel <= 1e-4, "%s %dx%d n=%d wave %d rel %.3e", nm, S[s].out, S[s].in, NS[i], wave, rel);
            }
        }
        free_w(&h);
    }
    tern__cuda_qgemm_wave = keep_wave;
}

TEST(cuda_qgemm_expert_stack) {
    if (!g_gpu16) { SKIP("cuda_qgemm", "no bf16-mode backend"); return; }
    hw q = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 5, 96, 256, 4096);
    hw b = make_w(TERN_DT_BF16, 0, 0, 0, 4, 64, 128, 1024);
    for (int e = 0; e < 4; e++) {
        double r1 = check_matmul(g_gpu16, &q, e == 3 ? 50 : 3, e), r2 = check_matmul(g_gpu16, &b, e == 2 ? 45 : 7, e);
        CHECK(r1 <= 1e-4 && r2 <= 1e-4, "e=%d rel q4 %.2e bf16 %.2e", e, r1, r2);
    }
    free_w(&q); free_w(&b);
}

/* qgemm_q4.cu: Q4 with BF16 scales in the plain bf16 mode against W and x rounded to bf16 (W as
 * bf16(fmaf(s, q, b)), the plain mode's weight) with double sums: only f32 accumulation differs.
 * want[n][out] = W·x for x [n][in] (already bf16-exact). The rows are shared out over a thread pool (the Q4 sweeps
 * take ~2e10 multiply-adds of reference a pass: on one core with one accumulator chain they were most of
 * test_cuda_ops' time); four double partial sums a dot product (products of bf16 values are exact in double, so
 * the order moves the reference by ~1e-16 at most — on the sweep shapes not at all — far under the tests' 1e-5) */
struct Q4Ref { const hw *h; const float *x; int n; double *want; };
static void q4_plain_ref_rows(void *p, int ith, int nth) {
    const struct Q4Ref *c = p;
    const int out = (int)c->h->t.shape[0], in = (int)c->h->t.shape[1];
    const int r0 = (int)((long)out * ith / nth), r1 = (int)((long)out * (ith + 1) / nth);
    float *wr = malloc((size_t)in * sizeof *wr);
    for (int r = r0; r < r1 && !wr; r++) /* no memory: these rows fail the comparison */
        for (int j = 0; j < c->n; j++) c->want[(size_t)j * out + r] = NAN;
    for (int r = r0; r < r1 && wr; r++) {
        tern_tensor_row_f32(&c->h->t, r, wr);
        bf16_exact(wr, (size_t)in);
        for (int j = 0; j < c->n; j++) {
            const float *xj = c->x + (size_t)j * in;
            double a[4] = {0, 0, 0, 0};
            int k = 0;
            for (; k + 4 <= in; k += 4)
                for (int u = 0; u < 4; u++) a[u] += (double)wr[k + u] * xj[k + u];
            for (; k < in; k++) a[0] += (double)wr[k] * xj[k];
            c->want[(size_t)j * out + r] = (a[0] + a[1]) + (a[2] + a[3]);
        }
    }
    free(wr);
}
static void q4_plain_ref(const hw *h, const float *x, int n, double *want) {
    if (!g_q4ref_pool) g_q4ref_pool = tern_pool_create(0); /* NULL: the calling thread alone */
    struct Q4Ref c = {h, x, n, want};
    tern_pool_run(g_q4ref_pool, q4_plain_ref_rows, &c);
}

static double q4_plain_rel(tern_backend *gpu, const hw *h, int n) {
    const int out = (int)h->t.shape[0], in = (int)h->t.shape[1];
    tern_tensor tg = h->t;
    tern_error err = {0};
    if (gpu->vt->upload_weight(gpu, &tg, &err)) return INFINITY;
    float *x = bf16_exact(rnd((size_t)n * in, 1.0f), (size_t)n * in), *want = malloc((size_t)n * out * 4);
    double *wd = malloc((size_t)n * out * sizeof *wd);
    q4_plain_ref(h, x, n, wd);
    for (size_t i = 0; i < (size_t)n * out; i++) want[i] = (float)wd[i];
    void *xd = to_gpu(x, (size_t)n * in * 4), *yd = nan_buf(gpu, (size_t)n * out);
    if (gpu != g_gpu) g_gpu->vt->sync(g_gpu);
    gpu->vt->matmul(gpu, yd, xd, n, &tg);
    float *yg = from_gpu(gpu, yd, (size_t)n * out);
    const double rel = rel_or_nan(yg, want, (size_t)n * out);
    gpu->vt->free_weight(gpu, &tg);
    gpu->vt->free(gpu, xd); gpu->vt->free(gpu, yd);
    free(x); free(want); free(wd); free(yg);
    return rel;
}

/* the fused forms through qgemm_q4.cu: q|k|v (matmul_n, three shapes), act(gate)·up (both acts),
 * y += W·x, against q4_plain_ref (+ act, + the residual) on the host */
static double q4_fused_rel(tern_backend *g, int n, int gs) {
    enum { NM = 6 };
    static const int shp[NM][2] = {{512, 2048}, {128, 2048}, {200, 2048}, {1536, 512}, {1536, 512}, {512, 1536}};
    hw h[NM];
    tern_tensor t[NM];
    double *ref[NM];
    double worst = 0;
    tern_error err = {0};
    for (int i = 0; i < NM; i++) {
        h[i] = make_w(TERN_DT_Q, 4, gs, TERN_DT_BF16, 1, shp[i][0], shp[i][1], 0);
        t[i] = h[i].t;
        if (g->vt->upload_weight(g, &t[i], &err)) return INFINITY;
    }
    float *xa = bf16_exact(rnd((size_t)n * 2048, 1.0f), (size_t)n * 2048);
    float *xb = bf16_exact(rnd((size_t)n * 512, 1.0f), (size_t)n * 512);
    float *xc = bf16_exact(rnd((size_t)n * 1536, 1.0f), (size_t)n * 1536);
    float *res = rnd((size_t)n * 512, 1.0f);
    for (int i = 0; i < NM; i++) {
        ref[i] = malloc((size_t)n * shp[i][0] * sizeof(double));
        q4_plain_ref(&h[i], i < 3 ? xa : i < 5 ? xb : xc, n, ref[i]);
    }
    void *xad = to_gpu(xa, (size_t)n * 2048 * 4), *xbd = to_gpu(xb, (size_t)n * 512 * 4), *xcd = to_gpu(xc, (size_t)n * 1536 * 4);
    float *y3 = nan_buf(g, (size_t)n * 840), *yg = nan_buf(g, (size_t)n * 1536), *yr = to_gpu(res, (size_t)n * 512 * 4);
    g_gpu->vt->sync(g_gpu);
    float *const ys[3] = {y3, y3 + (size_t)n * 512, y3 + (size_t)n * 640};
    const tern_tensor *const ws[3] = {&t[0], &t[1], &t[2]};
    int ok = g->vt->matmul_n(g, 3, ys, xad, n, ws);
    float *o3 = from_gpu(g, y3, (size_t)n * 840);
    for (int act = 0; act < 2 && ok; act++) {
        const int a = act ? TERN_ACT_GELU_TANH : TERN_ACT_SILU;
        ok = g->vt->matmul_glu(g, yg, xbd, n, &t[3], &t[4], a);
        float *og = from_gpu(g, yg, (size_t)n * 1536), *wg = malloc((size_t)n * 1536 * 4);
        for (size_t i = 0; i < (size_t)n * 1536; i++) wg[i] = (float)glu_ref(ref[3][i], ref[4][i], a);
        const double e = rel_or_nan(og, wg, (size_t)n * 1536);
        if (!(e <= worst)) worst = e;
        free(og); free(wg);
    }
    ok = ok && g->vt->matmul_add(g, yr, xcd, n, &t[5]);
    float *orr = from_gpu(g, yr, (size_t)n * 512), *w3 = malloc((size_t)n * 840 * 4), *wr = malloc((size_t)n * 512 * 4);
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < (size_t)n * shp[i][0]; j++) w3[(i == 0 ? 0 : i == 1 ? 512 : 640) * (size_t)n + j] = (float)ref[i][j];
    for (size_t j = 0; j < (size_t)n * 512; j++) wr[j] = (float)(res[j] + ref[5][j]);
    double e = rel_or_nan(o3, w3, (size_t)n * 840);
    if (!(e <= worst)) worst = e;
    e = rel_or_nan(orr, wr, (size_t)n * 512);
    if (!(e <= worst)) worst = e;
    if (!ok) worst = INFINITY;
    free(o3); free(orr); free(w3); free(wr);
    for (int i = 0; i < NM; i++) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); free(ref[i]); }
    g->vt->free(g, xad); g->vt->free(g, xbd); g->vt->free(g, xcd);
    g->vt->free(g, y3); g->vt->free(g, yg); g->vt->free(g, yr);
    free(xa); free(xb); free(xc); free(res);
    return worst;
}

/* Q4 (g32 / g64 / g128) on five shapes at each n of ns against the bf16-rounded reference: within 1e-5, and the
 * launch counter `calls` moved each time (`what` names the kernel in the messages) */
static const int q4_gss[] = {64, 32, 128};
static const int q4_shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {4099, 2048}, {128, 128}};
static void q4_plain_sweep(tern_backend *g, const int *ns, size_t nn, const char *what,
                           const unsigned long long *calls) {
    for (size_t f = 0; f < TERN_ARRAY_LEN(q4_gss); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(q4_shapes); s++) {
            hw h = make_w(TERN_DT_Q, 4, q4_gss[f], TERN_DT_BF16, 1, q4_shapes[s][0], q4_shapes[s][1], 0);
            char nm[64];
            fmt_name(&h.t, nm, sizeof nm);
            for (size_t k = 0; k < nn; k++) {
                const unsigned long long c0 = *calls;
                const double rel = q4_plain_rel(g, &h, ns[k]);
                printf("  err %-16s %dx%d n=%-3d %s %.2e\n", nm, q4_shapes[s][0], q4_shapes[s][1], ns[k], what, rel);
                CHECK(rel <= 1e-5, "%s %dx%d n=%d: %s rel %.3e", nm, q4_shapes[s][0], q4_shapes[s][1], ns[k], what, rel);
                CHECK(*calls > c0, "%s n=%d: %s did not run", nm, ns[k], what);
            }
            free_w(&h);
        }
}

/* the fused forms (q4_fused_rel: q|k|v, act(gate)·up, y += W·x) for g32 / g64 / g128 at each n of ns: within 1e-5,
 * and each of the 4 fused ops ran the kernel `calls` counts */
static void q4_fused_sweep(tern_backend *g, const int *ns, size_t nn, const char *what,
                           const unsigned long long *calls) {
    for (size_t f = 0; f < TERN_ARRAY_LEN(q4_gss) && g->vt->matmul_n; f++)
        for (size_t k = 0; k < nn; k++) {
            const unsigned long long c0 = *calls;
            const double rel = q4_fused_rel(g, ns[k], q4_gss[f]);
            printf("  err %s fused g%d n=%d %.2e\n", what, q4_gss[f], ns[k], rel);
            CHECK(rel <= 1e-5, "%s fused g%d n=%d: rel %.3e", what, q4_gss[f], ns[k], rel);
            CHECK(*calls >= c0 + 4, "%s fused g%d n=%d: ran %llu of 4 fused ops", what, q4_gss[f], ns[k], *calls - c0);
        }
}

TEST(cuda_qgemm_q4) {
    extern int tern__cuda_qg4_on, tern__cuda_gemv_xr, tern__cuda_qg4_wg;
    extern unsigned long long tern__cuda_qg4_calls;
    tern_backend *g = g_gpu16;
    if (!g) { SKIP("cuda_qgemm_q4", "no bf16-mode backend"); return; }
    const int keep = tern__cuda_qg4_on, keep_xr = tern__cuda_gemv_xr, keep_split = tern__cuda_bf16_split;
    const int keep_wg = tern__cuda_qg4_wg;
    tern__cuda_qg4_on = 1;
    tern__cuda_qg4_wg = 0; /* the mma.sync kernel at every n (cuda_qgemm_q4_wg tests the wgmma one) */
    tern__cuda_gemv_xr = 0; /* n = 2..8 here too */
    tern__cuda_bf16_split = 0;
    const int *gss = q4_gss, (*shapes)[2] = q4_shapes;
    static const int ns[] = {2, 9, 16, 17, 33, 64, 65, 128};
    q4_plain_sweep(g, ns, TERN_ARRAY_LEN(ns), "qg4", &tern__cuda_qg4_calls);
    static const int nf[] = {5, 13, 29, 61};
    q4_fused_sweep(g, nf, TERN_ARRAY_LEN(nf), "qg4", &tern__cuda_qg4_calls);
    { /* six stages at up to 16 rows (TERN_CUDA_QG4_ST=6) */
        extern int tern__cuda_qg4_st;
        const int keep_st = tern__cuda_qg4_st;
        tern__cuda_qg4_st = 6;
        for (size_t f = 0; f < 2; f++)
            for (int s = 0; s < 4; s++) {
                hw h = make_w(TERN_DT_Q, 4, gss[f], TERN_DT_BF16, 1, shapes[s][0], shapes[s][1], 0);
                for (int n = 2; n <= 16; n += 7) { /* 2, 9, 16 */
                    const double rel = q4_plain_rel(g, &h, n);
                    printf("  err q4/g%d %dx%d n=%d qg4 ST 6 %.2e\n", gss[f], shapes[s][0], shapes[s][1], n, rel);
                    CHECK(rel <= 1e-5, "g%d %dx%d n=%d: qg4 ST 6 rel %.3e", gss[f], shapes[s][0], shapes[s][1], n, rel);
                }
                free_w(&h);
            }
        tern__cuda_qg4_st = keep_st;
    }
    tern__cuda_qg4_wg = keep_wg;
    tern__cuda_qg4_on = keep;
    tern__cuda_gemv_xr = keep_xr;
    tern__cuda_bf16_split = keep_split;
}

/* the wgmma kernel's sweeps: plain at each n of ns, then the fused forms at each of nf with act(gate)·up as split
 * gate / up blocks and as TERN_CUDA_QG4_WGPAIR's blocks; tag ends the kernel's name in the messages, calls counts its
 * launches */
static void q4_wg_sweeps(tern_backend *g, const int *ns, size_t nn, const int *nf, size_t nnf, const char *tag,
                         const unsigned long long *calls) {
    extern int tern__cuda_qg4_wgpair;
    const int keep_pair = tern__cuda_qg4_wgpair;
    char what[48];
    snprintf(what, sizeof what, "qg4 wgmma%s", tag);
    q4_plain_sweep(g, ns, nn, what, calls);
    for (int pair = 0; pair < 2; pair++) {
        tern__cuda_qg4_wgpair = pair;
        snprintf(what, sizeof what, "qg4 wgmma%s%s", pair ? " pair" : "", tag);
        q4_fused_sweep(g, nf, nnf, what, calls);
    }
    tern__cuda_qg4_wgpair = keep_pair;
}

/* the row counts the wgmma kernel's sweeps take: plain, and fused */
static const int q4w_ns[] = {17, 32, 33, 64, 65, 100, 128}, q4w_nf[] = {29, 61, 93, 125};

/* the wgmma kernel's sweeps again with *flag = v, then *flag as it was; skipped (why) where ok is 0 */
static void q4_wg_pass(tern_backend *g, int *flag, int v, int ok, const char *tag, const char *why) {
    extern unsigned long long tern__cuda_qg4w_calls;
    if (!ok) {
        char name[64];
        snprintf(name, sizeof name, "cuda_qgemm_q4_wg%s", tag);
        SKIP(name, why);
        return;
    }
    const int keep = *flag;
    *flag = v;
    q4_wg_sweeps(g, q4w_ns, TERN_ARRAY_LEN(q4w_ns), q4w_nf, TERN_ARRAY_LEN(q4w_nf), tag, &tern__cuda_qg4w_calls);
    *flag = keep;
}

/* qgemm_q4_wg.cu (TERN_CUDA_QG4_WG; sm_90a): the wgmma kernel at 17..128 rows (32- and 64-row column tiles),
 * plain and fused, against the same bf16-rounded reference as the mma.sync kernel; again with the 32-column tiles'
 * half-tile wgmmas waited for at once (TERN_CUDA_QG4_ASY=0), with the K split down to one tile a block
 * (TERN_CUDA_QG4_MINT=1) and with session 68's split (TERN_CUDA_QG4_WAVE=2; the default splits by waves) */
TEST(cuda_qgemm_q4_wg) {
    extern int tern__cuda_qg4_on, tern__cuda_gemv_xr, tern__cuda_qg4_wg, tern__cuda_qg4w_ok, tern__cuda_qg4_tma;
    extern unsigned long long tern__cuda_qg4w_calls;
    extern int tern__cuda_qg4w_asy, tern__cuda_qg4_mint, tern__cuda_qg4_wave;
    tern_backend *g = g_gpu16;
    if (!g) { SKIP("cuda_qgemm_q4_wg", "no bf16-mode backend"); return; }
    if (!tern__cuda_qg4w_ok) { SKIP("cuda_qgemm_q4_wg", "no sm_90a image for this GPU"); return; }
    const int keep = tern__cuda_qg4_on, keep_xr = tern__cuda_gemv_xr, keep_split = tern__cuda_bf16_split;
    const int keep_wg = tern__cuda_qg4_wg, keep_tma = tern__cuda_qg4_tma;
    tern__cuda_qg4_on = 1;
    tern__cuda_qg4_wg = 1;
    tern__cuda_qg4_tma = 0; /* qg4w itself (cuda_qgemm_q4_tma tests the TMA form, the default at K >= 3072) */
    tern__cuda_gemv_xr = 0;
    tern__cuda_bf16_split = 0;
    q4_wg_sweeps(g, q4w_ns, TERN_ARRAY_LEN(q4w_ns), q4w_nf, TERN_ARRAY_LEN(q4w_nf), "", &tern__cuda_qg4w_calls);
    /* TERN_CUDA_QG4_ASY=0: the 32-column tiles without their half tiles' wgmmas in flight (the default since session
     * 75; the same sums either way: the same k-step order into the same accumulators) */
    q4_wg_pass(g, &tern__cuda_qg4w_asy, 0, 1, " asy0", NULL);
    /* TERN_CUDA_QG4_MINT=1: the split down to one K tile a block (the ring's prologue then holds fewer tiles than
     * its stages) */
    q4_wg_pass(g, &tern__cuda_qg4_mint, 1, 1, " mint1", NULL);
    /* TERN_CUDA_QG4_WAVE: the sweeps above ran the default (4: the split by waves, tern__cuda_split_waves); 2 (the
     * rule before session 78: the fill rule, rounded down to one wave at 17..32 rows) and 3 (by waves at every row
     * count; here the same as 4) */
    q4_wg_pass(g, &tern__cuda_qg4_wave, 2, 1, " wave2", NULL);
    tern__cuda_qg4_on = keep;
    tern__cuda_qg4_wg = keep_wg;
    tern__cuda_qg4_tma = keep_tma;
    tern__cuda_gemv_xr = keep_xr;
    tern__cuda_bf16_split = keep_split;
}

/* y = W·x through the batch Q4 GEMM with TERN_CUDA_QG4_TMA at v, into host memory */
static float *q4_tma_y(tern_backend *g, tern_tensor *t, void *xd, int n, int v) {
    extern int tern__cuda_qg4_tma;
    const int out = (int)t->shape[0], keep = tern__cuda_qg4_tma;
    tern__cuda_qg4_tma = v;
    void *yd = nan_buf(g, (size_t)n * out);
    g->vt->matmul(g, yd, xd, n, t);
    float *y = from_gpu(g, yd, (size_t)n * out);
    g->vt->free(g, yd);
    tern__cuda_qg4_tma = keep;
    return y;
}

/* qgemm_q4_wg.cu's TMA form (TERN_CUDA_QG4_TMA=1: the stages sent by the Tensor Memory Accelerator, each warp waiting
 * on its stage's barrier alone; =2 with ASY's half tiles; =3 four warpgroups over 256 rows): the wgmma kernel's sweeps with each (plain at 17..128 rows,
 * the fused forms, the pair blocks), again with the split down to one K tile a block (fewer tiles than stages), and
 * bitwise qg4w's outputs on the plain shapes (the same tiles, decode and wgmmas in the same order) */
TEST(cuda_qgemm_q4_tma) {
    extern int tern__cuda_qg4_on, tern__cuda_gemv_xr, tern__cuda_qg4_wg, tern__cuda_qg4w_ok, tern__cuda_qg4t_ok;
    extern int tern__cuda_qg4_tma, tern__cuda_qg4_mint;
    extern unsigned long long tern__cuda_qg4t_calls;
    tern_backend *g = g_gpu16;
    if (!g) { SKIP("cuda_qgemm_q4_tma", "no bf16-mode backend"); return; }
    if (!tern__cuda_qg4w_ok || !tern__cuda_qg4t_ok) { SKIP("cuda_qgemm_q4_tma", "no sm_90a image or TMA encoder"); return; }
    const int keep = tern__cuda_qg4_on, keep_xr = tern__cuda_gemv_xr, keep_split = tern__cuda_bf16_split;
    const int keep_wg = tern__cuda_qg4_wg, keep_tma = tern__cuda_qg4_tma;
    tern__cuda_qg4_on = 1;
    tern__cuda_qg4_wg = 1;
    tern__cuda_gemv_xr = 0;
    tern__cuda_bf16_split = 0;
    q4_wg_pass(g, &tern__cuda_qg4_tma, 1, 1, " tma", NULL);
    q4_wg_pass(g, &tern__cuda_qg4_tma, 2, 1, " tma2", NULL);
    q4_wg_pass(g, &tern__cuda_qg4_tma, 3, 1, " tma3", NULL);
    q4_wg_pass(g, &tern__cuda_qg4_tma, 4, 1, " tma default", NULL); /* 1 at K >= 3072, qg4w below */
    tern__cuda_qg4_tma = 1;
    q4_wg_pass(g, &tern__cuda_qg4_mint, 1, 1, " tma mint1", NULL);
    tern__cuda_qg4_tma = keep_tma;
    static const int nb[] = {17, 33, 64, 100, 128};
    for (size_t s = 0; s < TERN_ARRAY_LEN(q4_shapes); s++) {
        hw h = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, q4_shapes[s][0], q4_shapes[s][1], 0);
        tern_tensor t = h.t;
        tern_error err = {0};
        if (g->vt->upload_weight(g, &t, &err)) { CHECK(0, "upload: %s", err.msg); free_w(&h); continue; }
        const int out = q4_shapes[s][0], in = q4_shapes[s][1];
        for (size_t k = 0; k < TERN_ARRAY_LEN(nb); k++) {
            const int n = nb[k];
            float *x = bf16_exact(rnd((size_t)n * in, 1.0f), (size_t)n * in);
            void *xd = to_gpu(x, (size_t)n * in * 4);
            if (g != g_gpu) g_gpu->vt->sync(g_gpu);
            const unsigned long long c0 = tern__cuda_qg4t_calls;
            float *y0 = q4_tma_y(g, &t, xd, n, 0);
            for (int v = 1; v <= 3; v++) {
                float *y1 = q4_tma_y(g, &t, xd, n, v);
                size_t bad = 0;
                for (size_t i = 0; i < (size_t)n * out; i++) bad += memcmp(&y0[i], &y1[i], 4) != 0;
                printf("  bits q4/g64 %dx%d n=%d tma %d vs qg4w: %zu of %zu differ\n", out, in, n, v, bad, (size_t)n * out);
                CHECK(bad == 0, "%dx%d n=%d: tma %d differs from qg4w in %zu outputs", out, in, n, v, bad);
                free(y1);
            }
            CHECK(tern__cuda_qg4t_calls >= c0 + 3, "%dx%d n=%d: the TMA form did not run", out, in, n);
            free(y0); free(x);
            g->vt->free(g, xd);
        }
        g->vt->free_weight(g, &t);
        free_w(&h);
    }
    tern__cuda_qg4_on = keep;
    tern__cuda_qg4_wg = keep_wg;
    tern__cuda_gemv_xr = keep_xr;
    tern__cuda_bf16_split = keep_split;
}

static void cuda_qgemm_tests(void) {
    RUN(cuda_qgemm_q4);
    RUN(cuda_qgemm_q4_wg);
    RUN(cuda_qgemm_q4_tma);
    RUN(cuda_qgemm_formats);
    RUN(cuda_qgemm_shapes);
    RUN(cuda_qgemm_expert_stack);
}

#endif
