/*
 * cuda_ops_tests_mma.h — the tensor-core n = 1 GEMV for MLX Q4/Q8 (gemv_mma.cu) against cpu-ref:
 * every group size, BF16 and F16 scales, one K slice (in = 384) and split K (in = 4096, 14336:
 * the last block of a row block reduces the slices), row counts that are not multiples of the
 * 16-row warp tile or the 128-row block, and a second launch of the same shape (the split-K
 * counters must have been reset). The fused modes (q|k|v, gate/up, residual add) are compared
 * bitwise with the separate ops in cuda_ops_tests_fused.h (small shapes); cuda_gemv_mma_glu_walk
 * checks act(gate)·up when blocks walk several row blocks. Part of cuda_ops_tests.h.
 */

extern unsigned long long tern__cuda_gemv_mma_calls, tern__cuda_gemv_xr_calls;
extern int tern__cuda_gemv_mma_on, tern__cuda_gemv_mma_pp, tern__cuda_gemv_mma_fold, tern__cuda_gemv_mma_xp1,
    tern__cuda_pdl_on, tern__cuda_mm_j;

/* every shape with the chunks per K slice as planned (J = 0: up to 4, fewer for small matrices), one
 * (the old walk) and three (a short last chunk at in = 3840 and 14336, a short last slice) */
TEST(cuda_gemv_mma) {
    const int keep = tern__cuda_gemv_mma_on, keep_j = tern__cuda_mm_j;
    tern__cuda_gemv_mma_on = 2; /* Q8 too (off by default: slower than gemv1 there) */
    static const struct { int bits, gs; tern_dtype sdt; } F[] = {
        {4, 64, TERN_DT_BF16}, {4, 32, TERN_DT_BF16}, {4, 128, TERN_DT_F16}, {8, 64, TERN_DT_BF16},
        {8, 32, TERN_DT_F16}, {8, 128, TERN_DT_BF16}, {4, 64, TERN_DT_F16},
    };
    /* {20000, 4096}, {40000, 384}: more row blocks than launched blocks (each block walks several,
     * split K and not); the others one row block per block */
    static const int shapes[][2] = {{300, 384},    {1037, 4096},  {64, 14336}, {4099, 2048},
                                    {20000, 4096}, {40000, 384}, {777, 3840}};
    static const int js[] = {0, 1, 3};
    for (size_t jj = 0; jj < TERN_ARRAY_LEN(js); jj++)
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
            tern__cuda_mm_j = js[jj];
            hw h = make_w(TERN_DT_Q, F[f].bits, F[f].gs, F[f].sdt, 1, shapes[s][0], shapes[s][1], 0);
            char nm[64];
            fmt_name(&h.t, nm, sizeof nm);
            for (int rep = 0; rep < 2; rep++) {
                const unsigned long long calls = tern__cuda_gemv_mma_calls;
                double rel = check_matmul(g_gpu, &h, 1, -1);
                printf("  err %-16s %dx%d n=1 mma J %d %.2e\n", nm, shapes[s][0], shapes[s][1], js[jj], rel);
                CHECK(rel <= 1e-5, "%s %dx%d J %d rep %d: rel %.3e", nm, shapes[s][0], shapes[s][1], js[jj], rep, rel);
                CHECK(tern__cuda_gemv_mma_calls > calls, "%s %dx%d: the tensor-core GEMV did not run", nm,
                      shapes[s][0], shapes[s][1]);
            }
            free_w(&h);
        }
    tern__cuda_gemv_mma_on = keep;
    tern__cuda_mm_j = keep_j;
}

/* gate/up with 20000 outputs (blocks walk several row blocks, K split): matmul_glu vs the two separate
 * matmuls and act() on the host. J is pinned (4: two slices): fused and separate calls agree only while
 * they keep one J, and mm_balance plans the pair (313 row blocks) and a lone matrix (157) apart */
TEST(cuda_gemv_mma_glu_walk) {
    tern_backend *g = g_gpu;
    if (!g->vt->matmul_glu) { SKIP("cuda_gemv_mma_glu_walk", "not built"); return; }
    extern int tern__cuda_mm_j;
    const int keep_j = tern__cuda_mm_j;
    tern__cuda_mm_j = 4;
    const int out = 20000, in = 4096;
    hw h0 = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, out, in, 0), h1 = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, out, in, 0);
    tern_tensor t0 = h0.t, t1 = h1.t;
    tern_error err = {0};
    CHECK(!g->vt->upload_weight(g, &t0, &err) && !g->vt->upload_weight(g, &t1, &err), "upload %s", err.msg);
    float *x = rnd(in, 1.0f);
    void *xd = to_gpu(x, (size_t)in * 4), *yf = nan_buf(g, out), *yg = nan_buf(g, out), *yu = nan_buf(g, out);
    for (int act = 0; act < 2; act++) {
        const unsigned long long calls = tern__cuda_gemv_mma_calls;
        CHECK(g->vt->matmul_glu(g, yf, xd, 1, &t0, &t1, act) == 1, "matmul_glu refused");
        CHECK(tern__cuda_gemv_mma_calls > calls, "the tensor-core GEMV did not run");
        g->vt->matmul(g, yg, xd, 1, &t0);
        g->vt->matmul(g, yu, xd, 1, &t1);
        float *f = from_gpu(g, yf, out), *a = from_gpu(g, yg, out), *b = from_gpu(g, yu, out);
        double worst = 0;
        for (int i = 0; i < out; i++) {
            const double want = glu_ref(a[i], b[i], act);
            const double e = fabs(f[i] - want) / (fabs(want) + 1e-3);
            if (!(e <= worst)) worst = e; /* NaN-safe */
        }
        printf("  err glu walk act %d: %.2e\n", act, worst);
        CHECK(worst <= 1e-5, "act %d: worst rel %.3e", act, worst);
        free(f); free(a); free(b);
    }
    g->vt->free_weight(g, &t0); g->vt->free_weight(g, &t1);
    g->vt->free(g, xd); g->vt->free(g, yf); g->vt->free(g, yg); g->vt->free(g, yu);
    free(x); free_w(&h0); free_w(&h1);
    tern__cuda_mm_j = keep_j;
}

/* three Q4 matrices (out, out, o2 rows) uploaded for mm_five_ops; nm: the format's name */
static void mm_three_open(tern_backend *g, int bits, int gs, tern_dtype sdt, int out, int o2, int in, hw *h, tern_tensor *t,
                          char *nm) {
    const int rows[3] = {out, out, o2};
    tern_error err = {0};
    for (int i = 0; i < 3; i++) {
        h[i] = make_w(TERN_DT_Q, bits, gs, sdt, 1, rows[i], in, 0);
        t[i] = h[i].t;
        CHECK(g->vt->upload_weight(g, &t[i], &err) == TERN_OK, "upload %s", err.msg);
    }
    fmt_name(&h[0].t, nm, 64);
}
static void mm_three_close(tern_backend *g, hw *h, tern_tensor *t) {
    for (int i = 0; i < 3; i++) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); }
}

/* the five one-row ops of matrices t[0..3) (t[0], t[1]: out rows; t[2]: the third of q|k|v) into
 * res: matmul, q|k|v (tot rows), act(gate)·up with silu and gelu, y += W·x onto r */
static void mm_five_ops(tern_backend *g, const tern_tensor *t, int out, int tot, void *xd, void *yd, const float *r,
                        const char *nm, float **res) {
    float *ys[3] = {(float *)yd, (float *)yd + out, (float *)yd + 2 * out};
    const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
    g->vt->matmul(g, yd, xd, 1, &t[0]);
    res[0] = from_gpu(g, yd, out);
    CHECK(g->vt->matmul_n(g, 3, ys, xd, 1, ws) == 1, "%s matmul_n refused", nm);
    res[1] = from_gpu(g, yd, tot);
    for (int act = 0; act < 2; act++) {
        CHECK(g->vt->matmul_glu(g, yd, xd, 1, &t[0], &t[1], act) == 1, "%s matmul_glu refused", nm);
        res[2 + act] = from_gpu(g, yd, out);
    }
    g->vt->upload(g, yd, r, (size_t)out * 4);
    CHECK(g->vt->matmul_add(g, yd, xd, 1, &t[0]) == 1, "%s matmul_add refused", nm);
    res[4] = from_gpu(g, yd, out);
}

/* TERN_CUDA_GEMV_PP (two register sets for the walk, Q4), TERN_CUDA_PDL (programmatic dependent
 * launch) do the same arithmetic in the same order: plain, q|k|v, gate/up (silu, gelu) and residual
 * results must be the same bits as the plain one-set walk, walking several row blocks or not, split
 * K or not */
TEST(cuda_gemv_mma_pp_bits) {
    tern_backend *g = g_gpu;
    if (!g->vt->matmul_n || !g->vt->matmul_glu || !g->vt->matmul_add) { SKIP("cuda_gemv_mma_pp_bits", "not built"); return; }
    const int keep = tern__cuda_gemv_mma_pp, keep_pdl = tern__cuda_pdl_on, keep_xp = tern__cuda_gemv_mma_xp1;
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_F16}, {128, TERN_DT_BF16},
                                                          {32, TERN_DT_BF16}};
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {20000, 4096}, {40000, 512}};
    for (int xp = 0; xp < 2; xp++) /* the exact kernel, then XP1 */
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
            const int out = shapes[s][0], in = shapes[s][1], o2 = out / 3 + 1, tot = 2 * out + o2;
            hw h[3];
            tern_tensor t[3];
            char nm[64];
            mm_three_open(g, 4, F[f].gs, F[f].sdt, out, o2, in, h, t, nm);
            float *x = rnd(in, 1.0f), *r = rnd(out, 1.0f), *res[3][5];
            const int nv = 3;
            void *xd = to_gpu(x, (size_t)in * 4), *yd = nan_buf(g, tot);
            tern__cuda_gemv_mma_xp1 = xp;
            for (int v = 0; v < nv; v++) { /* 0 plain, 1 two sets, 2 programmatic launch */
                tern__cuda_gemv_mma_pp = v == 1;
                tern__cuda_pdl_on = v == 2;
                mm_five_ops(g, t, out, tot, xd, yd, r, nm, res[v]);
            }
            static const char *what[5] = {"matmul", "q|k|v", "glu silu", "glu gelu", "matmul_add"};
            for (int k = 0; k < 5; k++) {
                for (int v = 1; v < nv; v++)
                    CHECK(same_bits(res[0][k], res[v][k], k == 1 ? tot : out), "%s %dx%d %s xp1 %d: %s != plain launch", nm,
                          out, in, what[k], xp, v == 1 ? "two-set walk" : "programmatic launch");
                for (int v = 0; v < nv; v++) free(res[v][k]);
            }
            mm_three_close(g, h, t);
            g->vt->free(g, xd); g->vt->free(g, yd);
            free(x); free(r);
        }
    tern__cuda_gemv_mma_pp = keep;
    tern__cuda_pdl_on = keep_pdl;
    tern__cuda_gemv_mma_xp1 = keep_xp;
}

/* TERN_CUDA_GEMV_FOLD (Q4: pairs left at 128 + nibble, 128 folded into the bias): not the same bits,
 * so against cpu-ref; its error is printed next to the default's and bounded by 1e-4 (the model
 * parity bound per row; the default kernel stays within 1e-5). */
TEST(cuda_gemv_mma_fold) {
    const int keep = tern__cuda_gemv_mma_fold;
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_F16}, {128, TERN_DT_BF16}};
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {20000, 4096}};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
            hw h = make_w(TERN_DT_Q, 4, F[f].gs, F[f].sdt, 1, shapes[s][0], shapes[s][1], 0);
            char nm[64];
            fmt_name(&h.t, nm, sizeof nm);
            double rel[2];
            for (int v = 0; v < 2; v++) { /* default, FOLD */
                tern__cuda_gemv_mma_fold = v == 1;
                rel[v] = check_matmul(g_gpu, &h, 1, -1);
            }
            printf("  err %-16s %dx%d n=1 mma %.2e fold %.2e\n", nm, shapes[s][0], shapes[s][1], rel[0], rel[1]);
            CHECK(rel[1] <= 1e-4, "%s %dx%d: folded rel %.3e", nm, shapes[s][0], shapes[s][1], rel[1]);
            free_w(&h);
        }
    tern__cuda_gemv_mma_fold = keep;
}

/* One Q matrix (bits, out x in, group gs, scales sdt) times one row on backend g against cpu-ref: the rel L2 it
 * returns; nm gets the format's name; checks that the tensor-core GEMV (or its opt-in variants) ran */
static double mm_q_rel(tern_backend *g, int bits, int gs, tern_dtype sdt, int out, int in, char *nm, size_t nn) {
    hw h = make_w(TERN_DT_Q, bits, gs, sdt, 1, out, in, 0);
    fmt_name(&h.t, nm, nn);
    const unsigned long long calls = tern__cuda_gemv_mma_calls;
    const double rel = check_matmul(g, &h, 1, -1);
    CHECK(tern__cuda_gemv_mma_calls > calls, "%s %dx%d: the tensor-core GEMV did not run", nm, out, in);
    free_w(&h);
    return rel;
}

/* y bitwise the same with a walk switch that must not change the sums off and on (*knob 0 / 1, restored after):
 * the exact and the XP1 walk, groups 32 / 64 / 128, one slice, split K with few and many (> 8) slices, with the
 * pre-norm, a gate|up pair (matmul_glu), three rows (gemv_xr) and a matrix whose grid walks (more row blocks than
 * blocks) */
static void mm_knob_bits(int *knob, const char *what) {
    tern_backend *g = g_gpu;
    const int keep = *knob, keep_xp1 = tern__cuda_gemv_mma_xp1;
    static const int gss[] = {32, 64, 128}, shp[][2] = {{1037, 4096}, {2560, 256}, {640, 10240}, {2048, 2560}, {10240, 2560}};
    for (int xp1 = 0; xp1 < 2; xp1++)
        for (size_t gi = 0; gi < TERN_ARRAY_LEN(gss); gi++)
            for (size_t si = 0; si < TERN_ARRAY_LEN(shp); si++) {
                const int out = shp[si][0], in = shp[si][1], pair = si == 3, n = si == 0 ? 3 : 1;
                tern__cuda_gemv_mma_xp1 = xp1;
                hw h = make_w(TERN_DT_Q, 4, gss[gi], TERN_DT_BF16, 1, out, in, 0);
                hw h2 = make_w(TERN_DT_Q, 4, gss[gi], TERN_DT_BF16, 1, out, in, 0);
                tern_tensor t = h.t, t2 = h2.t;
                tern_error err = {0};
                CHECK(g->vt->upload_weight(g, &t, &err) == TERN_OK, "upload %s", err.msg);
                CHECK(g->vt->upload_weight(g, &t2, &err) == TERN_OK, "upload %s", err.msg);
                float *x = rnd((size_t)n * in, 1.0f), *nw = rnd(in, 1.0f);
                void *xd = to_gpu(x, (size_t)n * in * 4), *nwd = to_gpu(nw, (size_t)in * 4);
                float *y[2], *xn = nan_buf(g, in);
                for (int r = 0; r < 2; r++) {
                    *knob = r;
                    y[r] = nan_buf(g, (size_t)n * out);
                    float *const ys[1] = {y[r]};
                    const tern_tensor *const ws[1] = {&t};
                    const unsigned long long calls = tern__cuda_gemv_mma_calls;
                    if (si == 1) CHECK(g->vt->norm_matmul(g, xn, xd, nwd, 1e-6f, 1, 1, ys, ws, -1, NULL) == 1, "norm_matmul refused");
                    else if (pair) CHECK(g->vt->matmul_glu(g, y[r], xd, 1, &t, &t2, TERN_ACT_GELU_TANH) == 1, "matmul_glu refused");
                    else g->vt->matmul(g, y[r], xd, n, &t);
                    if (n == 1) CHECK(tern__cuda_gemv_mma_calls == calls + 1, "q4 g%d %dx%d: the walk did not run", gss[gi], out, in);
                }
                float *a0 = from_gpu(g, y[0], (size_t)n * out), *a1 = from_gpu(g, y[1], (size_t)n * out);
                CHECK(same_bits(a0, a1, (size_t)n * out), "%s: q4 g%d %dx%d n %d xp1 %d changed y", what, gss[gi], out, in, n, xp1);
                free(a0); free(a1);
                g->vt->free_weight(g, &t);
                g->vt->free_weight(g, &t2);
                free_w(&h);
                free_w(&h2);
                void *bufs[] = {xd, nwd, xn, y[0], y[1]};
                for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
                free(x); free(nw);
            }
    *knob = keep;
    tern__cuda_gemv_mma_xp1 = keep_xp1;
}

/* TERN_CUDA_MM_ROT (mm_stage's table stores in a rotated order): the same table, so the same bits */
TEST(cuda_gemv_mma_rot) {
    extern int tern__cuda_mm_rot;
    mm_knob_bits(&tern__cuda_mm_rot, "rot");
}

/* The XP1 walks' x is the bf16-rounded row: x not exact in bf16 goes in, the reference gets it rounded (g_x_bf16 =
 * 2), and the two agree as closely as with bf16-exact x (Σx of the rounded values: FOLD's 128·s·Σx must cancel the
 * MMAs' 128s — with the f32 row's Σx this was ~4e-2 at Q4, ~1.6e-1 at Q2) */
TEST(cuda_gemv_mma_xp1_rounded) {
    const int keep = tern__cuda_gemv_mma_xp1;
    tern__cuda_gemv_mma_xp1 = 1;
    g_x_bf16 = 2;
    /* amplitudes 1, 1e6 and 1e-6: Q8X scales x into f16's range per K slice (mm_stage_q8x) */
    static const int bits[] = {4, 2, 3, 5, 6, 8}, gss[] = {64, 32, 128};
    static const float amps[] = {1.0f, 1e6f, 1e-6f};
    for (size_t b = 0; b < TERN_ARRAY_LEN(bits); b++)
        for (size_t gi = 0; gi < TERN_ARRAY_LEN(gss); gi++)
            for (size_t ai = 0; ai < TERN_ARRAY_LEN(amps); ai++) {
                if (ai && bits[b] != 8 && gi) continue;
                char nm[64];
                g_x_amp = amps[ai];
                const double rel = mm_q_rel(g_gpu, bits[b], gss[gi], TERN_DT_BF16, 1037, 4096, nm, sizeof nm);
                printf("  err q%d/g%d 1037x4096 xp1, x (amplitude %.0e) rounded by the kernel: %.2e\n", bits[b], gss[gi],
                       amps[ai], rel);
                CHECK(rel <= (bits[b] == 2 ? 4e-5 : 1e-5), "q%d g%d amp %.0e: rel %.3e against the bf16-rounded x", bits[b],
                      gss[gi], amps[ai], rel);
            }
    g_x_amp = 1.0f;
    g_x_bf16 = 0;
    tern__cuda_gemv_mma_xp1 = keep;
}

/* TERN_CUDA_GEMV_XP1 (Q4, default in the plain bf16 mode: x rounded to bf16, one MMA column per group,
 * a chunk's groups folded once): with x exact in bf16 its products are exact and it sums in f32, so
 * against cpu-ref within 1e-5 like the exact kernel; every group size and scale type, J auto / 1 / 3
 * (short last chunks at in = 3840 and 14336), split K, several row blocks per block */
TEST(cuda_gemv_mma_xp1) {
    const int keep = tern__cuda_gemv_mma_xp1, keep_j = tern__cuda_mm_j;
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_F16}, {128, TERN_DT_BF16},
                                                          {64, TERN_DT_F16}, {32, TERN_DT_BF16}};
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {20000, 4096}, {777, 3840}, {4099, 2048}};
    static const int js[] = {0, 1, 3};
    tern__cuda_gemv_mma_xp1 = 1;
    g_x_bf16 = 1;
    for (size_t jj = 0; jj < TERN_ARRAY_LEN(js); jj++)
        for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
            for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
                tern__cuda_mm_j = js[jj];
                char nm[64];
                const double rel = mm_q_rel(g_gpu, 4, F[f].gs, F[f].sdt, shapes[s][0], shapes[s][1], nm, sizeof nm);
                printf("  err %-16s %dx%d n=1 mma xp1 J %d %.2e\n", nm, shapes[s][0], shapes[s][1], js[jj], rel);
                CHECK(rel <= 1e-5, "%s %dx%d J %d: xp1 rel %.3e", nm, shapes[s][0], shapes[s][1], js[jj], rel);
            }
    g_x_bf16 = 0;
    tern__cuda_gemv_mma_xp1 = keep;
    tern__cuda_mm_j = keep_j;
}

/* TERN_CUDA_GEMV_WIDE (Q2 / Q3 / Q5 / Q6 on XP1's walk, gemv_mma.cuh mm_decode_w): with x exact in bf16 its
 * products are exact and it sums in f32, so against cpu-ref within 1e-5 like Q4's (Q2 4e-5, below); every width, group size and
 * scale type, J auto / 1 / 3 (short last chunks at in = 3840 and 14336), split K, several row blocks per block.
 * Then the fused one-row forms on it (q|k|v, act(gate)·up, y += W·x) against cpu-ref's separate ops. */
TEST(cuda_gemv_mma_wide) {
    tern_backend *g = g_gpu;
    if (!g->vt->matmul_n || !g->vt->matmul_glu || !g->vt->matmul_add) { SKIP("cuda_gemv_mma_wide", "not built"); return; }
    const int keep = tern__cuda_gemv_mma_xp1, keep_j = tern__cuda_mm_j;
    static const int bits[] = {2, 3, 5, 6, 8}; /* 8: Q8X (f16 MMAs) */
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_F16}, {128, TERN_DT_BF16},
                                                          {32, TERN_DT_BF16}};
    /* `in` a multiple of 256 (the walk's double steps; gemv1 serves the rest) */
    static const int shapes[][2] = {{300, 512}, {1037, 4096}, {64, 14336}, {20000, 4096}, {777, 3840}, {4099, 2048}};
    static const int js[] = {0, 1, 3};
    tern__cuda_gemv_mma_xp1 = 1;
    g_x_bf16 = 1;
    double worst = 0;
    for (size_t b = 0; b < TERN_ARRAY_LEN(bits); b++)
        for (size_t jj = 0; jj < TERN_ARRAY_LEN(js); jj++)
            for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
                for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
                    if (jj && s >= 3 && s != 4) continue; /* J 1 / 3 on the small, the 14336 and the 3840 shapes */
                    tern__cuda_mm_j = js[jj];
                    char nm[64];
                    const double rel = mm_q_rel(g, bits[b], F[f].gs, F[f].sdt, shapes[s][0], shapes[s][1], nm, sizeof nm);
                    if (!(rel <= worst)) worst = rel;
                    /* FOLD's 128 rides along in the f32 sums: relative to the codes' own term it weighs
                     * 128 / (mean code), 85 at Q2 against 17 at Q4 (H200: q2 worst 1.1e-5, q3..q6 <= 2e-6) */
                    const double bound = bits[b] == 2 ? 4e-5 : 1e-5;
                    CHECK(rel <= bound, "%s %dx%d J %d: wide rel %.3e", nm, shapes[s][0], shapes[s][1], js[jj], rel);
                }
    printf("  err wide Q GEMV (q2 / q3 / q5 / q6 / q8), worst rel L2 %.2e\n", worst);
    tern__cuda_mm_j = 0;
    /* fused forms: q|k|v (out, out, o2 rows), gate/up, y += W·x against cpu-ref's separate matmuls */
    for (size_t b = 0; b < TERN_ARRAY_LEN(bits); b++) {
        const int out = 1037, o2 = 256, in = 2560, gs = b & 1 ? 32 : 64, tot = 2 * out + o2;
        const int rows[3] = {out, out, o2};
        hw h[3];
        tern_tensor t[3], tr[3];
        tern_error err = {0};
        for (int i = 0; i < 3; i++) {
            h[i] = make_w(TERN_DT_Q, bits[b], gs, TERN_DT_BF16, 1, rows[i], in, 0);
            t[i] = tr[i] = h[i].t;
            CHECK(g->vt->upload_weight(g, &t[i], &err) == TERN_OK && g_ref->vt->upload_weight(g_ref, &tr[i], &err) == TERN_OK,
                  "upload %s", err.msg);
        }
        char nm[64];
        fmt_name(&h[0].t, nm, sizeof nm);
        float *x = rnd(in, 1.0f), *r = rnd(out, 1.0f), *ref[3];
        bf16_exact(x, in);
        for (int i = 0; i < 3; i++) {
            ref[i] = malloc((size_t)rows[i] * sizeof(float));
            g_ref->vt->matmul(g_ref, ref[i], x, 1, &tr[i]);
        }
        void *xd = to_gpu(x, (size_t)in * 4), *yd = nan_buf(g, tot);
        float *res[5];
        const unsigned long long calls = tern__cuda_gemv_mma_calls;
        mm_five_ops(g, t, out, tot, xd, yd, r, nm, res);
        CHECK(tern__cuda_gemv_mma_calls >= calls + 5, "%s: the tensor-core GEMV did not serve the fused forms", nm);
        float *want = malloc((size_t)tot * sizeof(float));
        double e[5];
        e[0] = rel_or_nan(res[0], ref[0], out);
        memcpy(want, ref[0], out * 4); memcpy(want + out, ref[1], out * 4); memcpy(want + 2 * out, ref[2], o2 * 4);
        e[1] = rel_or_nan(res[1], want, tot);
        for (int act = 0; act < 2; act++) {
            for (int i = 0; i < out; i++) want[i] = (float)glu_ref(ref[0][i], ref[1][i], act);
            e[2 + act] = rel_or_nan(res[2 + act], want, out);
        }
        for (int i = 0; i < out; i++) want[i] = r[i] + ref[0][i];
        e[4] = rel_or_nan(res[4], want, out);
        printf("  err %-16s fused: matmul %.2e qkv %.2e silu %.2e gelu %.2e add %.2e\n", nm, e[0], e[1], e[2], e[3], e[4]);
        for (int i = 0; i < 5; i++) CHECK(e[i] <= (bits[b] == 2 ? 4e-5 : 1e-5), "%s fused form %d: rel %.3e", nm, i, e[i]);
        for (int i = 0; i < 5; i++) free(res[i]);
        for (int i = 0; i < 3; i++) { free(ref[i]); g->vt->free_weight(g, &t[i]); free_w(&h[i]); }
        g->vt->free(g, xd); g->vt->free(g, yd);
        free(x); free(r); free(want);
    }
    g_x_bf16 = 0;
    tern__cuda_gemv_mma_xp1 = keep;
    tern__cuda_mm_j = keep_j;
}

/* The int8 mode (a backend opened with TERN_COMPUTE_INT8: Q4 one-row GEMVs quantize x per group, the
 * CPU int8 kernels' rule, gemv_mma.cu XI8) against cpu-ref: every group size and scale type, J auto /
 * 1 / 3, split K, several row blocks per block. The CPU's bound is ½ Σ_g d_g·Σ|s|·|q − 8| per output
 * (held per output by the CPU's test). Here x is uniform in [-1, 1], so d_g ≈ 1/127 and the x error
 * (uniform ±d/2) alone gives ~4e-3 relative L2 (H200, session 12: worst 4.87e-3 over these cases);
 * held as rel L2 <= 1e-2. */
TEST(cuda_gemv_mma_i8) {
    tern_backend *g8 = NULL;
    tern_error err = {0};
    tern_backend_opts o = {.compute = TERN_COMPUTE_INT8};
    if (tern_backend_cuda_open(&g8, &o, &err) != TERN_OK) { SKIP("cuda_gemv_mma_i8", err.msg); return; }
    CHECK(g8->compute == TERN_COMPUTE_BF16, "an int8 backend reports the bf16 mode, got %d", (int)g8->compute);
    const int keep_j = tern__cuda_mm_j;
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_F16}, {128, TERN_DT_BF16},
                                                          {32, TERN_DT_BF16}};
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {20000, 4096}, {777, 3840}};
    static const int js[] = {0, 1, 3};
    double worst = 0;
    for (size_t jj = 0; jj < TERN_ARRAY_LEN(js); jj++)
        for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
            for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
                tern__cuda_mm_j = js[jj];
                char nm[64];
                const double rel = mm_q_rel(g8, 4, F[f].gs, F[f].sdt, shapes[s][0], shapes[s][1], nm, sizeof nm);
                if (!(rel <= worst)) worst = rel;
                CHECK(rel <= 1e-2, "%s %dx%d J %d: int8 rel %.3e", nm, shapes[s][0], shapes[s][1], js[jj], rel);
            }
    printf("  err int8 Q4 GEMV, worst rel L2 %.2e\n", worst);
    tern__cuda_mm_j = keep_j;
    g8->vt->close(g8);
}

/* gemv_xr.cu (TERN_CUDA_GEMV_XR: 2..8 x rows times Q4 in the plain bf16 mode, columns = (x row, group)):
 * with x exact in bf16 its products are exact and it sums in f32, so against cpu-ref within 1e-5; every
 * group size and scale type, n = 2, 3, 5, 8 (NT 1..4 tiles at g32), one and split K, J auto / 1; the
 * fused forms (q|k|v, act(gate)·up, y += W·x) against cpu-ref's separate ops; a row's bits do not depend
 * on n (rows 0, 1 alone and among 8) */
static double xr_fused_rel(tern_backend *g, int bits, int gs, tern_dtype sdt, int out, int o2, int in, int n) {
    hw h[3];
    tern_tensor t[3], tr[3];
    char nm[64];
    mm_three_open(g, bits, gs, sdt, out, o2, in, h, t, nm);
    tern_error err = {0};
    for (int i = 0; i < 3; i++) {
        tr[i] = h[i].t;
        CHECK(g_ref->vt->upload_weight(g_ref, &tr[i], &err) == TERN_OK, "ref upload %s", err.msg);
    }
    const int rows[3] = {out, out, o2};
    float *x = rnd((size_t)n * in, 1.0f), *r = rnd((size_t)n * out, 1.0f), *ref[3];
    bf16_exact(x, (size_t)n * in);
    void *xd = to_gpu(x, (size_t)n * in * 4), *yd[3];
    for (int i = 0; i < 3; i++) {
        ref[i] = malloc((size_t)n * rows[i] * sizeof(float));
        g_ref->vt->matmul(g_ref, ref[i], x, n, &tr[i]);
        yd[i] = nan_buf(g, (size_t)n * rows[i]);
    }
    double worst = 0;
    const unsigned long long calls = tern__cuda_gemv_xr_calls;
    const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
    g_gpu->vt->sync(g_gpu); /* x went up through g_gpu's stream */
    float *ys[3] = {yd[0], yd[1], yd[2]};
    CHECK(g->vt->matmul_n(g, 3, ys, xd, n, ws) == 1, "%s n=%d matmul_n refused", nm, n);
    for (int i = 0; i < 3; i++) {
        float *y = from_gpu(g, yd[i], (size_t)n * rows[i]);
        const double e = rel_or_nan(y, ref[i], (size_t)n * rows[i]);
        if (!(e <= worst)) worst = e;
        free(y);
    }
    float *want = malloc((size_t)n * out * sizeof(float));
    for (int act = 0; act < 2; act++) {
        CHECK(g->vt->matmul_glu(g, yd[0], xd, n, &t[0], &t[1], act) == 1, "%s n=%d matmul_glu refused", nm, n);
        for (size_t i = 0; i < (size_t)n * out; i++) want[i] = (float)glu_ref(ref[0][i], ref[1][i], act);
        float *y = from_gpu(g, yd[0], (size_t)n * out);
        const double e = rel_or_nan(y, want, (size_t)n * out);
        if (!(e <= worst)) worst = e;
        free(y);
    }
    g->vt->upload(g, yd[0], r, (size_t)n * out * 4);
    CHECK(g->vt->matmul_add(g, yd[0], xd, n, &t[0]) == 1, "%s n=%d matmul_add refused", nm, n);
    for (size_t i = 0; i < (size_t)n * out; i++) want[i] = r[i] + ref[0][i];
    float *y = from_gpu(g, yd[0], (size_t)n * out);
    const double e = rel_or_nan(y, want, (size_t)n * out);
    if (!(e <= worst)) worst = e;
    free(y);
    CHECK(tern__cuda_gemv_xr_calls >= calls + 4, "%s n=%d: gemv_xr ran %llu of 4 fused ops", nm, n,
          tern__cuda_gemv_xr_calls - calls);
    for (int i = 0; i < 3; i++) { g_ref->vt->free_weight(g_ref, &tr[i]); g->vt->free(g, yd[i]); free(ref[i]); }
    mm_three_close(g, h, t);
    g->vt->free(g, xd);
    free(x); free(r); free(want);
    return worst;
}
/* batch invariance of gemv_xr.cu: rows 0, 1 of a Qbits g64 matmul alone (n = 2) and among 8, the same bits */
static void xr_rows_same(tern_backend *g, int bits) {
    const int out = 4099, in = 2048;
    hw h = make_w(TERN_DT_Q, bits, 64, TERN_DT_BF16, 1, out, in, 0);
    tern_tensor t = h.t;
    tern_error err = {0};
    CHECK(g->vt->upload_weight(g, &t, &err) == TERN_OK, "upload %s", err.msg);
    float *x = rnd((size_t)8 * in, 1.0f);
    void *xd = to_gpu(x, (size_t)8 * in * 4), *y8 = nan_buf(g, (size_t)8 * out), *y2 = nan_buf(g, (size_t)2 * out);
    g_gpu->vt->sync(g_gpu);
    g->vt->matmul(g, y8, xd, 8, &t);
    g->vt->matmul(g, y2, xd, 2, &t);
    float *a = from_gpu(g, y8, (size_t)2 * out), *c = from_gpu(g, y2, (size_t)2 * out);
    CHECK(same_bits(a, c, (size_t)2 * out), "xr q%d: rows 0, 1 differ between n = 2 and n = 8", bits);
    free(a); free(c); free(x);
    g->vt->free(g, xd); g->vt->free(g, y8); g->vt->free(g, y2);
    g->vt->free_weight(g, &t);
    free_w(&h);
}
TEST(cuda_gemv_xr) {
    extern int tern__cuda_gemv_xr, tern__cuda_gemv_xr_max_n;
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->matmul_n) { SKIP("cuda_gemv_xr", "no bf16-mode backend"); return; }
    const int keep = tern__cuda_gemv_xr, keep_j = tern__cuda_mm_j, keep_split = tern__cuda_bf16_split;
    const int keep_max = tern__cuda_gemv_xr_max_n;
    tern__cuda_gemv_xr = 1;
    tern__cuda_gemv_xr_max_n = 8; /* every row count it can serve */
    tern__cuda_bf16_split = 0; /* the plain bf16 mode */
    g_x_bf16 = 1;
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_BF16}, {128, TERN_DT_BF16},
                                                          {32, TERN_DT_F16}, {64, TERN_DT_F16}};
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {4099, 2048}, {777, 3840}};
    static const int ns[] = {2, 3, 5, 8}, js[] = {0, 1};
    for (size_t jj = 0; jj < TERN_ARRAY_LEN(js); jj++)
        for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
            for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++)
                for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++) {
                    tern__cuda_mm_j = js[jj];
                    hw h = make_w(TERN_DT_Q, 4, F[f].gs, F[f].sdt, 1, shapes[s][0], shapes[s][1], 0);
                    char nm[64];
                    fmt_name(&h.t, nm, sizeof nm);
                    const unsigned long long calls = tern__cuda_gemv_xr_calls;
                    const double rel = check_matmul(g, &h, ns[k], -1);
                    printf("  err %-16s %dx%d n=%d xr J %d %.2e\n", nm, shapes[s][0], shapes[s][1], ns[k], js[jj], rel);
                    CHECK(rel <= 1e-5, "%s %dx%d n=%d J %d: xr rel %.3e", nm, shapes[s][0], shapes[s][1], ns[k], js[jj], rel);
                    CHECK(tern__cuda_gemv_xr_calls > calls, "%s %dx%d n=%d: gemv_xr did not run", nm, shapes[s][0],
                          shapes[s][1], ns[k]);
                    free_w(&h);
                }
    tern__cuda_mm_j = 0;
    for (size_t f = 0; f < 3; f++)
        for (int n = 2; n <= 8; n += 3) {
            const double rel = xr_fused_rel(g, 4, F[f].gs, F[f].sdt, 1037, 300, 4096, n);
            printf("  err xr fused g%d n=%d %.2e\n", F[f].gs, n, rel);
            CHECK(rel <= 1e-5, "fused g%d n=%d: rel %.3e", F[f].gs, n, rel);
        }
    xr_rows_same(g, 4); /* batch invariance */
    g_x_bf16 = 0;
    tern__cuda_gemv_xr = keep;
    tern__cuda_gemv_xr_max_n = keep_max;
    tern__cuda_mm_j = keep_j;
    tern__cuda_bf16_split = keep_split;
}

/* gemv_xr.cu's other widths (TERN_CUDA_GEMV_XRW: Q2 / Q3 / Q5 / Q6 on bf16 MMAs, Q8 on f16 ones; columns = (x row,
 * run or group), folded per step): x given unrounded and the reference fed its bf16 rounding (the mode's x: the
 * table and Σx must both see the rounded values); every width, group size and scale type, n = 2, 3, 5, 8, one and
 * split K, J auto / 1; the fused forms; rows 0, 1 the same bits alone and among 8 */
TEST(cuda_gemv_xr_wide) {
    extern int tern__cuda_gemv_xr, tern__cuda_gemv_xr_max_n, tern__cuda_gemv_xrw, tern__cuda_gemv_xrw_max_n,
        tern__cuda_gemv_xrw_small_n;
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->matmul_n) { SKIP("cuda_gemv_xr_wide", "no bf16-mode backend"); return; }
    const int keep = tern__cuda_gemv_xr, keep_w = tern__cuda_gemv_xrw, keep_j = tern__cuda_mm_j;
    const int keep_split = tern__cuda_bf16_split, keep_max = tern__cuda_gemv_xr_max_n, keep_wmax = tern__cuda_gemv_xrw_max_n;
    tern__cuda_gemv_xr = tern__cuda_gemv_xrw = 1;
    const int keep_small = tern__cuda_gemv_xrw_small_n;
    tern__cuda_gemv_xr_max_n = tern__cuda_gemv_xrw_max_n = tern__cuda_gemv_xrw_small_n = 8;
    tern__cuda_bf16_split = 0; /* the plain bf16 mode */
    g_x_bf16 = 2;
    static const int bits[] = {2, 3, 5, 6, 8};
    static const struct { int gs; tern_dtype sdt; } F[] = {{64, TERN_DT_BF16}, {32, TERN_DT_BF16}, {128, TERN_DT_BF16},
                                                          {32, TERN_DT_F16}, {64, TERN_DT_F16}};
    static const int shapes[][2] = {{300, 512}, {1037, 4096}, {64, 14336}, {4099, 2048}, {777, 3840}};
    static const int ns[] = {2, 3, 5, 8}, js[] = {0, 1};
    double worst[5] = {0, 0, 0, 0, 0};
    for (size_t b = 0; b < TERN_ARRAY_LEN(bits); b++)
        for (size_t jj = 0; jj < TERN_ARRAY_LEN(js); jj++)
            for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
                for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++)
                    for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++) {
                        if (jj && (s == 2 || s == 3)) continue; /* J 1 on the small and the 3840 shapes */
                        tern__cuda_mm_j = js[jj];
                        hw h = make_w(TERN_DT_Q, bits[b], F[f].gs, F[f].sdt, 1, shapes[s][0], shapes[s][1], 0);
                        char nm[64];
                        fmt_name(&h.t, nm, sizeof nm);
                        const unsigned long long calls = tern__cuda_gemv_xr_calls;
                        const double rel = check_matmul(g, &h, ns[k], -1);
                        /* Q8 g32 serves 4 rows at most: qgemm.cu takes the rest, with its bf16-rounded weights */
                        const bool built = !(bits[b] == 8 && F[f].gs == 32 && ns[k] > 4);
                        const double bound = bits[b] == 2 ? 4e-5 : 1e-5; /* FOLD's 128 in the sums, as cuda_gemv_mma_wide */
                        CHECK(!built || rel <= bound, "%s %dx%d n=%d J %d: xr rel %.3e", nm, shapes[s][0], shapes[s][1],
                              ns[k], js[jj], rel);
                        if (built && !(rel <= worst[b])) worst[b] = rel;
                        CHECK(!built || tern__cuda_gemv_xr_calls > calls, "%s %dx%d n=%d: gemv_xr did not run", nm,
                              shapes[s][0], shapes[s][1], ns[k]);
                        free_w(&h);
                    }
    printf("  err xr wide, worst rel L2 q2 %.2e q3 %.2e q5 %.2e q6 %.2e q8 %.2e\n", worst[0], worst[1], worst[2], worst[3],
           worst[4]);
    tern__cuda_mm_j = 0;
    g_x_bf16 = 1; /* xr_fused_rel rounds x itself */
    for (size_t b = 0; b < TERN_ARRAY_LEN(bits); b++)
        for (int n = 2; n <= 8; n += 3) {
            const int gs = b & 1 ? 32 : 64;
            if (bits[b] == 8 && gs == 32 && n > 4) continue;
            const double rel = xr_fused_rel(g, bits[b], gs, TERN_DT_BF16, 1037, 300, 4096, n);
            printf("  err xr fused q%d g%d n=%d %.2e\n", bits[b], gs, n, rel);
            CHECK(rel <= (bits[b] == 2 ? 4e-5 : 1e-5), "fused q%d g%d n=%d: rel %.3e", bits[b], gs, n, rel);
        }
    for (size_t b = 0; b < TERN_ARRAY_LEN(bits); b++) xr_rows_same(g, bits[b]); /* batch invariance */
    g_x_bf16 = 0;
    tern__cuda_gemv_xr = keep;
    tern__cuda_gemv_xrw = keep_w;
    tern__cuda_gemv_xr_max_n = keep_max;
    tern__cuda_gemv_xrw_max_n = keep_wmax;
    tern__cuda_gemv_xrw_small_n = keep_small;
    tern__cuda_mm_j = keep_j;
    tern__cuda_bf16_split = keep_split;
}

static void cuda_mma_tests(void) {
    RUN(cuda_gemv_mma_i8);
    RUN(cuda_gemv_mma_xp1);
    RUN(cuda_gemv_mma_wide);
    RUN(cuda_gemv_mma_xp1_rounded);
    RUN(cuda_gemv_mma_fold);
    RUN(cuda_gemv_mma_rot);
    RUN(cuda_gemv_mma_pp_bits);
    RUN(cuda_gemv_mma);
    RUN(cuda_gemv_mma_glu_walk);
    RUN(cuda_gemv_xr);
    RUN(cuda_gemv_xr_wide);
}
