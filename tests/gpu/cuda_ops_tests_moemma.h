/*
 * cuda_ops_tests_moemma.h — moe_mlp's tensor-core pair path for Q4 experts (src/backend/cuda/moe_mma.cu)
 * against cpu-ref: groups 32/64/128 with BF16 and F16 scales, E 16 / k 4 and E 128 / k 8, H 256..2816,
 * I 64..704 (down rows ending inside a 64-byte step: I = 64, 160, 192, 704), n = 1, 2, 3, 8, SiLU and
 * GELU-tanh. Bound: max |gpu - ref| / max |ref| <= 1e-5 (exact f32 terms, another summation order);
 * rel L2 printed too. Also: tern__cuda_moe_mma_calls moves; a second run gives the same bits (the
 * counters were reset, the sums are in fixed order); tern__cuda_moe_mma_on = 0 runs the older pair path
 * (printed next to it); dead pairs (ids -1 and >= E) add nothing; the plain bf16 mode (x and h rounded)
 * stays within its bound; and a recorded graph replayed with other routes gives eager's bits.
 * Included by tests/gpu/test_cuda_ops.c after cuda_ops_tests_moe.h (moe_w, moe_run, moe_route_uneven).
 */
#ifndef TERN_CUDA_OPS_TESTS_MOEMMA_H
#define TERN_CUDA_OPS_TESTS_MOEMMA_H

extern unsigned long long tern__cuda_moe_mma_calls;
extern int tern__cuda_moe_mma_on;

/* max |a - b| / max |b| (NaN anywhere in a but not b: infinity) */
static double mo_maxrel(const float *a, const float *b, size_t n) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return m > 0.0 ? e / m : e;
}

static const char *mo_act(int act) { return act == TERN_ACT_SILU ? "silu" : "gelu"; }

TEST(cuda_moe_mma) {
    static const struct { int gs; tern_dtype sdt; int act, E, k, H, I; } C[] = {
        {64, TERN_DT_BF16, TERN_ACT_GELU_TANH, 128, 8, 2816, 704}, /* gemma4-26b-a4b */
        {32, TERN_DT_F16, TERN_ACT_SILU, 16, 4, 256, 64},
        {128, TERN_DT_BF16, TERN_ACT_SILU, 16, 4, 1024, 256},
        {64, TERN_DT_F16, TERN_ACT_GELU_TANH, 128, 8, 512, 192},
        {32, TERN_DT_BF16, TERN_ACT_GELU_TANH, 16, 4, 2816, 160},
        {128, TERN_DT_F16, TERN_ACT_GELU_TANH, 16, 4, 384, 384},
    };
    static const int NS[] = {1, 2, 3, 8};
    const int keep = tern__cuda_moe_mma_on;
    for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
        const int H = C[c].H, I = C[c].I, E = C[c].E, k = C[c].k, act = C[c].act;
        moe_w m;
        const int ok = moe_w_make(&m, g_gpu, TERN_DT_Q, 4, C[c].gs, C[c].sdt, E, H, I, 0);
        CHECK(ok, "upload case %zu", c);
        if (!ok) continue;
        char nm[64];
        fmt_name(&m.g.t, nm, sizeof nm);
        for (size_t ni = 0; ni < TERN_ARRAY_LEN(NS); ni++) {
            const int n = NS[ni];
            float *x = rnd((size_t)n * H, 1.0f), *wts = malloc((size_t)n * k * sizeof *wts);
            int32_t *idx = malloc((size_t)n * k * sizeof *idx);
            moe_route_uneven(idx, wts, n, E, k);
            if (c == 1 && n == 3) { idx[1] = -1; idx[k + 2] = E + 5; } /* dead pairs: no term */
            float *yr = malloc((size_t)n * H * sizeof *yr), *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
            g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &m.gr, &m.ur, &m.dr, act, scr);
            tern__cuda_moe_mma_on = 1;
            unsigned long long c0 = tern__cuda_moe_mma_calls;
            float *yf = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, act);
            CHECK(tern__cuda_moe_mma_calls == c0 + 1, "%s E %d n %d: moe_mma calls %llu", nm, E, n,
                  tern__cuda_moe_mma_calls - c0);
            float *y2 = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, act);
            CHECK(!memcmp(yf, y2, (size_t)n * H * 4), "%s E %d n %d: two runs differ", nm, E, n);
            tern__cuda_moe_mma_on = 0;
            c0 = tern__cuda_moe_mma_calls;
            float *yo = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, act);
            CHECK(tern__cuda_moe_mma_calls == c0, "%s n %d: TERN_CUDA_MOE_MMA=0 still ran moe_mma", nm, n);
            tern__cuda_moe_mma_on = 1;
            const double rel = mo_maxrel(yf, yr, (size_t)n * H), l2 = rel_or_nan(yf, yr, (size_t)n * H);
            const double relo = mo_maxrel(yo, yr, (size_t)n * H);
            printf("  err moe-mma %-14s E=%-3d k=%d H=%-4d I=%-3d n=%d %s max %.2e l2 %.2e (old path max %.2e)\n", nm,
                   E, k, H, I, n, mo_act(act), rel, l2, relo);
            CHECK(rel <= 1e-5, "%s E %d k %d H %d I %d n %d: max rel %.2e", nm, E, k, H, I, n, rel);
            /* --compute bf16 (plain): x and h rounded to bf16 on this path and the old one alike;
             * E 128 and n 2: few pairs, the pair path (not the grouped GEMM) */
            if (g_gpu16 && E == 128 && n == 2) {
                moe_w m16;
                const int up = moe_w_upload16(&m16, &m);
                if (up) {
                    tern__cuda_bf16_split = 0;
                    c0 = tern__cuda_moe_mma_calls;
                    float *yb = moe_run(g_gpu16, &m16, x, idx, wts, n, H, I, k, act);
                    CHECK(tern__cuda_moe_mma_calls == c0 + 1, "%s n %d plain bf16: moe_mma did not run", nm, n);
                    tern__cuda_moe_mma_on = 0;
                    float *ybo = moe_run(g_gpu16, &m16, x, idx, wts, n, H, I, k, act);
                    tern__cuda_moe_mma_on = 1;
                    tern__cuda_bf16_split = 1;
                    const double rb = rel_or_nan(yb, yr, (size_t)n * H), rbo = rel_or_nan(ybo, yr, (size_t)n * H);
                    printf("  err moe-mma %-14s E=%-3d n=%d plain bf16 l2 %.2e (old path %.2e, paths differ by max "
                           "%.2e)\n", nm, E, n, rb, rbo, mo_maxrel(yb, ybo, (size_t)n * H));
                    CHECK(rb <= 1e-2, "%s n %d plain bf16: rel %.2e", nm, n, rb);
                    free(yb); free(ybo);
                }
                g_gpu16->vt->free_weight(g_gpu16, &m16.gg);
                g_gpu16->vt->free_weight(g_gpu16, &m16.ug);
                g_gpu16->vt->free_weight(g_gpu16, &m16.dg);
            }
            free(x); free(wts); free(idx); free(yr); free(scr); free(yf); free(y2); free(yo);
        }
        moe_w_free(&m, g_gpu);
    }
    tern__cuda_moe_mma_on = keep;
}

/* moe_mlp recorded once into a step graph, replayed after new routes and weights were uploaded: the
 * kernels read the expert ids on the device, so every replay must give the eager run's bits */
TEST(cuda_moe_mma_graph) {
    tern_backend *g = g_gpu;
    if (!g->vt->graph_begin) { SKIP("cuda_moe_mma_graph", "backend has no graphs"); return; }
    const int E = 16, k = 4, H = 512, I = 192, n = 3, act = TERN_ACT_SILU;
    moe_w m;
    if (!moe_w_make(&m, g, TERN_DT_Q, 4, 64, TERN_DT_BF16, E, H, I, 0)) { CHECK(0, "upload"); return; }
    float *x = rnd((size_t)n * H, 1.0f), *wts = malloc((size_t)n * k * sizeof *wts);
    int32_t *idx = malloc((size_t)n * k * sizeof *idx);
    moe_route_uneven(idx, wts, n, E, k);
    void *xd = moe_to(g, x, (size_t)n * H * 4), *id = moe_to(g, idx, (size_t)n * k * 4);
    void *wd = moe_to(g, wts, (size_t)n * k * 4), *yd = nan_buf(g, (size_t)n * H);
    void *sd = nan_buf(g, (size_t)n * k * 2 * I);
    const size_t ob = (size_t)n * H * 4;
    float *rep = malloc(ob), *eager = malloc(ob), *yr = malloc(ob), *scr = malloc((size_t)n * k * 2 * I * 4);
    tern__cuda_moe_mma_on = 1;
    CHECK(g->vt->graph_begin(g, 4711, rep, ob) == 1, "graph_begin");
    g->vt->moe_mlp(g, yd, xd, n, H, id, wd, k, &m.gg, &m.ug, &m.dg, act, sd);
    g->vt->download(g, rep, yd, ob);
    CHECK(g->vt->graph_end(g, 1) == 1, "graph_end refused the recording");
    for (int round = 0; round < 3; round++) {
        if (round) moe_route_uneven(idx, wts, n, E, k); /* round 0: the recorded routes */
        g->vt->upload(g, id, idx, (size_t)n * k * 4);
        g->vt->upload(g, wd, wts, (size_t)n * k * 4);
        const unsigned long long c0 = tern__cuda_moe_mma_calls;
        g->vt->moe_mlp(g, yd, xd, n, H, id, wd, k, &m.gg, &m.ug, &m.dg, act, sd);
        g->vt->download(g, eager, yd, ob);
        CHECK(tern__cuda_moe_mma_calls == c0 + 1, "round %d: moe_mma did not run eagerly", round);
        for (int i = 0; i < n * H; i++) rep[i] = NAN;
        CHECK(g->vt->graph_replay(g, 4711, rep, ob) == 1, "replay round %d", round);
        g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &m.gr, &m.ur, &m.dr, act, scr);
        const double rel = mo_maxrel(rep, yr, (size_t)n * H);
        printf("  err moe-mma graph replay round %d max %.2e\n", round, rel);
        CHECK(!memcmp(rep, eager, ob), "round %d: replay differs from eager", round);
        CHECK(rel <= 1e-5, "round %d: replay max rel %.2e", round, rel);
    }
    g->vt->graph_reset(g);
    g->vt->free(g, xd); g->vt->free(g, id); g->vt->free(g, wd); g->vt->free(g, yd); g->vt->free(g, sd);
    moe_w_free(&m, g);
    free(x); free(wts); free(idx); free(rep); free(eager); free(yr); free(scr);
}

static void cuda_moemma_tests(void) {
    RUN(cuda_moe_mma);
    RUN(cuda_moe_mma_graph);
}

#endif
