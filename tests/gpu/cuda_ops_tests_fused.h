/*
 * cuda_ops_tests_fused.h — the n = 1 GEMV (gemv1) and the fused decode ops (ops.h: matmul_n,
 * matmul_glu, matmul_add, rope_kv_write, rmsnorm_add, norm_matmul (also with its residual fold),
 * rmsnorm_n, norm_rope_kv_write). The fused ops promise bitwise the result of the
 * separate ops on the same backend, and one activation row must give bitwise the row of a
 * multi-row call (batch invariance), so these checks compare bits, not tolerances; the
 * separate ops themselves are checked against cpu-ref elsewhere (cuda_matmul_formats). Shapes
 * include out not a multiple of the rows per block and in = 14336 (llama3-8b down_proj).
 * Part of cuda_ops_tests.h.
 */

static int same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; } k_fused_fmt[] = {
    {TERN_DT_BF16, 0, 0, 0}, {TERN_DT_F16, 0, 0, 0}, {TERN_DT_F32, 0, 0, 0}, {TERN_DT_Q, 4, 64, TERN_DT_BF16},
    {TERN_DT_Q, 2, 32, TERN_DT_BF16}, {TERN_DT_Q, 3, 128, TERN_DT_F16}, {TERN_DT_Q, 5, 64, TERN_DT_F32},
    {TERN_DT_Q, 6, 32, TERN_DT_BF16}, {TERN_DT_Q, 8, 128, TERN_DT_BF16},
};

/* one row alone vs the same row inside n = 3 (multi-row kernel): bitwise. Holds for the CUDA-core
 * kernels; the tensor-core n = 1 GEMV for Q4/Q8 (gemv_mma.cu) sums in another order (f32-accurate,
 * cuda_gemv_mma), so it is switched off here. */
extern int tern__cuda_gemv_mma_on;
TEST(cuda_gemv1_batch_invariant) {
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}};
    const int keep_mma = tern__cuda_gemv_mma_on;
    tern__cuda_gemv_mma_on = 0;
    for (size_t f = 0; f < TERN_ARRAY_LEN(k_fused_fmt); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
            int out = shapes[s][0], in = shapes[s][1];
            hw h = make_w(k_fused_fmt[f].dt, k_fused_fmt[f].bits, k_fused_fmt[f].gs, k_fused_fmt[f].sdt, 1, out, in, 0);
            tern_error err = {0};
            tern_tensor t = h.t;
            if (g_gpu->vt->upload_weight(g_gpu, &t, &err)) { CHECK(0, "upload %s", err.msg); free_w(&h); continue; }
            float *x = rnd((size_t)3 * in, 1.0f);
            void *xd = to_gpu(x, (size_t)3 * in * 4), *y1 = nan_buf(g_gpu, out), *y3 = nan_buf(g_gpu, (size_t)3 * out);
            g_gpu->vt->matmul(g_gpu, y1, xd, 1, &t);
            g_gpu->vt->matmul(g_gpu, y3, xd, 3, &t);
            float *a = from_gpu(g_gpu, y1, out), *b = from_gpu(g_gpu, y3, out);
            char nm[64];
            CHECK(same_bits(a, b, out), "%s %dx%d: n=1 row differs from n=3 row 0", fmt_name(&h.t, nm, sizeof nm), out, in);
            g_gpu->vt->free_weight(g_gpu, &t);
            g_gpu->vt->free(g_gpu, xd); g_gpu->vt->free(g_gpu, y1); g_gpu->vt->free(g_gpu, y3);
            free(x); free(a); free(b); free_w(&h);
        }
    tern__cuda_gemv_mma_on = keep_mma;
}

/* fused matmul_n / matmul_glu / matmul_add vs the separate ops: bitwise */
TEST(cuda_fused_matmuls) {
    tern_backend *g = g_gpu;
    if (!g->vt->matmul_n || !g->vt->matmul_glu || !g->vt->matmul_add) { SKIP("cuda_fused_matmuls", "not built"); return; }
    static const int outs[3] = {300, 77, 64}, ins[] = {384, 2560, 4096};
    /* the fused n = 1 ops use the GEMV; keep the separate ops on it too when qmma is switched on
     * from the environment (TERN_CUDA_QMMA), else the bitwise comparison compares two kernels */
    extern int tern__cuda_qmma_mode;
    const int keep_qmma = tern__cuda_qmma_mode;
    tern__cuda_qmma_mode = 0;
    /* gemv1.cu: both grids (a block per 8 tasks, and TERN_CUDA_G1_GRID's persistent one) give these bits, and so
     * does the persistent grid with TERN_CUDA_G1_EARLY (grid 2: the first round loaded before pdl_wait) and with
     * TERN_CUDA_G1_EPF too (grid 3: the residual's old y read as each task starts) */
    extern int tern__cuda_g1_grid, tern__cuda_g1_early, tern__cuda_g1_epf;
    const int keep_grid = tern__cuda_g1_grid, keep_early = tern__cuda_g1_early, keep_epf = tern__cuda_g1_epf;
#define G1_MODE(m) (tern__cuda_g1_grid = (m) > 0, tern__cuda_g1_early = (m) >= 2 ? 7 : 0, tern__cuda_g1_epf = (m) == 3)
    for (int grid = 0; grid < 4; grid++)
    for (size_t f = 0; f < TERN_ARRAY_LEN(k_fused_fmt); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(ins); s++) {
            G1_MODE(grid);
            int in = ins[s];
            hw h[3];
            tern_tensor t[3];
            tern_error err = {0};
            for (int i = 0; i < 3; i++) {
                int o = i == 1 ? outs[0] : outs[i]; /* gate/up pair: t[0], t[1] share out */
                h[i] = make_w(k_fused_fmt[f].dt, k_fused_fmt[f].bits, k_fused_fmt[f].gs, k_fused_fmt[f].sdt, 1, o, in, 0);
                t[i] = h[i].t;
                CHECK(g->vt->upload_weight(g, &t[i], &err) == TERN_OK, "upload %s", err.msg);
            }
            int tot = 2 * outs[0] + outs[2];
            float *x = rnd(in, 1.0f), *r = rnd(outs[0], 1.0f);
            void *xd = to_gpu(x, (size_t)in * 4), *ya = nan_buf(g, tot), *yb = nan_buf(g, tot);
            float *pa = ya, *pb = yb;
            char nm[64];
            fmt_name(&h[0].t, nm, sizeof nm);
            /* q|k|v */
            float *ys[3] = {pa, pa + outs[0], pa + 2 * outs[0]};
            const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
            CHECK(g->vt->matmul_n(g, 3, ys, xd, 1, ws) == 1, "%s matmul_n refused", nm);
            G1_MODE(0); /* the separate ops: a block per 8 tasks */
            for (int i = 0; i < 3; i++) g->vt->matmul(g, pb + (ys[i] - pa), xd, 1, ws[i]);
            G1_MODE(grid);
            float *a = from_gpu(g, ya, tot), *b = from_gpu(g, yb, tot);
            CHECK(same_bits(a, b, tot), "%s in %d grid %d: matmul_n differs", nm, in, grid);
            free(a); free(b);
            /* gate/up with silu and gelu */
            for (int act = 0; act < 2; act++) {
                CHECK(g->vt->matmul_glu(g, pa, xd, 1, &t[0], &t[1], act) == 1, "%s matmul_glu refused", nm);
                G1_MODE(0);
                g->vt->matmul(g, pb, xd, 1, &t[0]);
                g->vt->matmul(g, pb + outs[0], xd, 1, &t[1]);
                G1_MODE(grid);
                if (act == TERN_ACT_SILU) g->vt->silu_mul(g, pb, pb, pb + outs[0], outs[0]);
                else g->vt->gelu_tanh_mul(g, pb, pb, pb + outs[0], outs[0]);
                a = from_gpu(g, ya, outs[0]);
                b = from_gpu(g, yb, outs[0]);
                CHECK(same_bits(a, b, outs[0]), "%s in %d grid %d: matmul_glu act %d differs", nm, in, grid, act);
                free(a); free(b);
            }
            /* residual */
            g->vt->upload(g, ya, r, outs[0] * 4);
            g->vt->upload(g, yb, r, outs[0] * 4);
            CHECK(g->vt->matmul_add(g, pa, xd, 1, &t[0]) == 1, "%s matmul_add refused", nm);
            G1_MODE(0);
            g->vt->matmul(g, pb + outs[0], xd, 1, &t[0]);
            G1_MODE(grid);
            g->vt->add(g, pb, pb, pb + outs[0], outs[0]);
            a = from_gpu(g, ya, outs[0]);
            b = from_gpu(g, yb, outs[0]);
            CHECK(same_bits(a, b, outs[0]), "%s in %d grid %d: matmul_add differs", nm, in, grid);
            free(a); free(b);
            /* n > 1 is not fused: the op says so and the model runs the separate ops */
            CHECK(g->vt->matmul_add(g, pa, xd, 2, &t[0]) == 0, "matmul_add n=2 should refuse");
            for (int i = 0; i < 3; i++) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); }
            g->vt->free(g, xd); g->vt->free(g, ya); g->vt->free(g, yb);
            free(x); free(r);
        }
#undef G1_MODE
    tern__cuda_g1_grid = keep_grid;
    tern__cuda_g1_early = keep_early;
    tern__cuda_g1_epf = keep_epf;
    tern__cuda_qmma_mode = keep_qmma;
}

/* rope_kv_write vs rope + rope + kv_write: q, k and both pools bitwise, on F32 pages and on BF16 / F16
 * pages (the GPU default of the bf16 mode is BF16; the separate write is kvq_write.cu's) */
TEST(cuda_fused_rope_kv_write) {
    tern_backend *g = g_gpu;
    if (!g->vt->rope_kv_write) { SKIP("cuda_fused_rope_kv_write", "not built"); return; }
    const int nh = 8, nkv = 2, d = 128, bs = 16, mb = 8, n = 3, ctx = mb * bs;
    size_t pool = (size_t)mb * bs * nkv * d;
    float *kh = rnd(pool, 1.0f), *q = rnd((size_t)n * nh * d, 1.0f), *k = rnd((size_t)n * nkv * d, 1.0f);
    float *v = rnd((size_t)n * nkv * d, 1.0f), *inv = rnd(d / 2, 0.5f);
    inv[3] = 0.0f; /* identity pair */
    int32_t bt[16], pos[3] = {5, 77, ctx - 1}, slot[3] = {0, 0, 0};
    for (int i = 0; i < mb; i++) bt[i] = (i * 3) % mb;
    bt[1] = -1; /* not resident: never written */
    pos[0] = bs + 2;
    void *btd = to_gpu(bt, sizeof bt), *pd = to_gpu(pos, sizeof pos), *sd = to_gpu(slot, sizeof slot);
    void *invd = to_gpu(inv, d / 2 * 4), *vd = to_gpu(v, (size_t)n * nkv * d * 4);
    uint8_t *ha = malloc(pool * 4), *hb = malloc(pool * 4);
    static const int kinds[] = {TERN_KV_F32, TERN_KV_BF16, TERN_KV_F16};
    static const char *kname[] = {"f32", "bf16", "f16"};
    for (size_t f = 0; f < TERN_ARRAY_LEN(kinds); f++) {
        const size_t pool_b = pool * (f ? 2 : 4); /* the pools start as random bytes (never-written records stay) */
        tern_kv_layer kv[2];
        void *qd[2], *kd[2];
        for (int i = 0; i < 2; i++) {
            kv[i] = (tern_kv_layer){f ? TERN_DT_Q : TERN_DT_F32, nkv, d, bs, 0, to_gpu(kh, pool_b), to_gpu(kh, pool_b),
                                    btd, mb};
            kv[i].kf.kind = kv[i].vf.kind = kinds[f];
            qd[i] = to_gpu(q, (size_t)n * nh * d * 4);
            kd[i] = to_gpu(k, (size_t)n * nkv * d * 4);
        }
        tern_rows rows = {n, pd, sd, pos, slot};
        CHECK(g->vt->rope_kv_write(g, &kv[0], &rows, qd[0], kd[0], vd, nh, invd, 1.25f) == 1, "%s: rope_kv_write refused",
              kname[f]);
        g->vt->rope(g, qd[1], n, nh, d, pd, invd, 1.25f);
        g->vt->rope(g, kd[1], n, nkv, d, pd, invd, 1.25f);
        g->vt->kv_write(g, &kv[1], &rows, kd[1], vd);
        const struct { void *a, *b; size_t bytes; const char *what; } cmp[] = {
            {qd[0], qd[1], (size_t)n * nh * d * 4, "q"}, {kd[0], kd[1], (size_t)n * nkv * d * 4, "k"},
            {kv[0].k, kv[1].k, pool_b, "k pool"}, {kv[0].v, kv[1].v, pool_b, "v pool"}};
        for (size_t i = 0; i < TERN_ARRAY_LEN(cmp); i++) {
            g->vt->download(g, ha, cmp[i].a, cmp[i].bytes);
            g->vt->download(g, hb, cmp[i].b, cmp[i].bytes);
            CHECK(!memcmp(ha, hb, cmp[i].bytes), "rope_kv_write %s pages: %s differs", kname[f], cmp[i].what);
        }
        tern_kv_layer kq = kv[0];
        kq.kf.kind = TERN_KV_AFFINE;
        CHECK(g->vt->rope_kv_write(g, &kq, &rows, qd[0], kd[0], vd, nh, invd, 1.0f) == 0, "mixed / affine pages must refuse");
        for (int i = 0; i < 2; i++) {
            g->vt->free(g, kv[i].k); g->vt->free(g, kv[i].v); g->vt->free(g, qd[i]); g->vt->free(g, kd[i]);
        }
    }
    g->vt->free(g, vd); g->vt->free(g, btd); g->vt->free(g, pd); g->vt->free(g, sd); g->vt->free(g, invd);
    free(kh); free(q); free(k); free(v); free(inv); free(ha); free(hb);
}

/* rmsnorm_add2 (Gemma 4 MoE layers' two post-norm adds in one launch) vs rmsnorm_add(h, h2, w2) then rmsnorm_add(x, h,
 * w, s): x and h' bitwise, h2 untouched; with and without w, w2 and the scalar; one row and 300 (rmsnorm_add's many-row
 * block sizes: two rows a SM and more), at d 96 / 2816 / 5376 / 9000 (the strided walk) */
TEST(cuda_rmsnorm_add2) {
    tern_backend *g = g_gpu;
    if (!g->vt->rmsnorm_add2 || !g->vt->rmsnorm_add) { SKIP("cuda_rmsnorm_add2", "not built"); return; }
    static const int ds[] = {96, 2816, 5376, 9000}, rs[] = {1, 300};
    int ran = 0;
    for (size_t i = 0; i < TERN_ARRAY_LEN(ds); i++)
        for (size_t ri = 0; ri < TERN_ARRAY_LEN(rs); ri++)
            for (int mode = 0; mode < 8; mode++) { /* bit 0: w, bit 1: w2, bit 2: the scalar */
                const int d = ds[i], rows = rs[ri];
                if (rows > 1 && d == 9000 && mode) continue;
                const size_t cnt = (size_t)rows * d;
                float *x = rnd(cnt, 3.0f), *h = rnd(cnt, 20.0f), *h2 = rnd(cnt, 7.0f), *w = rnd((size_t)d, 1.0f),
                      *w2 = rnd((size_t)d, 1.3f), sc = 0.37f;
                void *xa = to_gpu(x, cnt * 4), *xb = to_gpu(x, cnt * 4), *ha = to_gpu(h, cnt * 4), *hb = to_gpu(h, cnt * 4);
                void *h2a = to_gpu(h2, cnt * 4), *h2b = to_gpu(h2, cnt * 4);
                void *wd = to_gpu(w, (size_t)d * 4), *w2d = to_gpu(w2, (size_t)d * 4), *sd = to_gpu(&sc, 4);
                const float *wp = (mode & 1) ? wd : NULL, *w2p = (mode & 2) ? w2d : NULL, *sp = (mode & 4) ? sd : NULL;
                CHECK(g->vt->rmsnorm_add2(g, xa, ha, h2a, rows, d, wp, w2p, 1e-6f, sp) == 1, "rmsnorm_add2 refused d %d", d);
                CHECK(g->vt->rmsnorm_add(g, hb, h2b, rows, d, w2p, 1e-6f, NULL) == 1, "rmsnorm_add refused");
                CHECK(g->vt->rmsnorm_add(g, xb, hb, rows, d, wp, 1e-6f, sp) == 1, "rmsnorm_add refused");
                float *a = from_gpu(g, xa, cnt), *b = from_gpu(g, xb, cnt), *ah = from_gpu(g, ha, cnt),
                      *bh = from_gpu(g, hb, cnt), *h2o = from_gpu(g, h2a, cnt);
                CHECK(same_bits(a, b, cnt), "rmsnorm_add2 d %d rows %d mode %d: x differs from two rmsnorm_adds", d, rows, mode);
                CHECK(same_bits(ah, bh, cnt), "rmsnorm_add2 d %d rows %d mode %d: h differs", d, rows, mode);
                CHECK(same_bits(h2o, h2, cnt), "rmsnorm_add2 d %d rows %d: h2 was written", d, rows);
                void *bufs[] = {xa, xb, ha, hb, h2a, h2b, wd, w2d, sd};
                for (size_t k = 0; k < TERN_ARRAY_LEN(bufs); k++) g->vt->free(g, bufs[k]);
                free(x); free(h); free(h2); free(w); free(w2); free(a); free(b); free(ah); free(bh); free(h2o);
                ran++;
            }
    printf("  rmsnorm_add2: %d cases bitwise\n", ran);
}

/* rmsnorm_add vs rmsnorm + add (+ scale_dev): bitwise, with and without w and the scalar, at the
 * norm's three block sizes (d < 256, < 1024, >= 1024) */
TEST(cuda_fused_rmsnorm_add) {
    tern_backend *g = g_gpu;
    if (!g->vt->rmsnorm_add) { SKIP("cuda_fused_rmsnorm_add", "not built"); return; }
    static const int ds[] = {96, 640, 2816, 5376};
    const int rows = 5;
    for (size_t i = 0; i < TERN_ARRAY_LEN(ds); i++)
        for (int mode = 0; mode < 4; mode++) { /* bit 0: weight, bit 1: device scalar */
            const int d = ds[i];
            const size_t cnt = (size_t)rows * d;
            float *x = rnd(cnt, 3.0f), *h = rnd(cnt, 20.0f), *w = rnd((size_t)d, 1.0f), sc = 0.37f;
            void *xa = to_gpu(x, cnt * 4), *xb = to_gpu(x, cnt * 4), *ha = to_gpu(h, cnt * 4), *hb = to_gpu(h, cnt * 4);
            void *wd = to_gpu(w, (size_t)d * 4), *sd = to_gpu(&sc, 4);
            const float *wp = (mode & 1) ? wd : NULL, *sp = (mode & 2) ? sd : NULL;
            CHECK(g->vt->rmsnorm_add(g, xa, ha, rows, d, wp, 1e-6f, sp) == 1, "rmsnorm_add refused d %d", d);
            g->vt->rmsnorm(g, hb, hb, rows, d, wp, 1e-6f);
            g->vt->add(g, xb, xb, hb, cnt);
            if (sp) g->vt->scale_dev(g, xb, xb, sp, cnt);
            float *a = from_gpu(g, xa, cnt), *b = from_gpu(g, xb, cnt), *hh = from_gpu(g, ha, cnt);
            CHECK(same_bits(a, b, cnt), "rmsnorm_add d %d mode %d differs from rmsnorm + add (+ scale_dev)", d, mode);
            CHECK(same_bits(hh, h, cnt), "rmsnorm_add d %d wrote h", d);
            void *bufs[] = {xa, xb, ha, hb, wd, sd};
            for (size_t k = 0; k < TERN_ARRAY_LEN(bufs); k++) g->vt->free(g, bufs[k]);
            free(x); free(h); free(w); free(a); free(b); free(hh);
        }
}

/* norm_matmul vs rmsnorm + the op (matmul_n over q|k|v, matmul_glu both acts, the plain matmul): xn and
 * y bitwise, with and without a norm weight, at widths whose rmsnorm runs 128, 256 and 512 threads
 * (gemv1's block is 256: block_rms_inv stands in for rmsnorm's thread count). Q4 runs gemv_mma.cu's
 * kernel, every K-slice block normalising its part of the row. n = 2 and an in-place norm decline. */
TEST(cuda_norm_matmul) {
    tern_backend *g = g_gpu;
    if (!g->vt->norm_matmul) { SKIP("cuda_norm_matmul", "not built"); return; }
    static const int outs[3] = {300, 77, 64}, ins[] = {128, 384, 4096};
    extern int tern__cuda_qmma_mode, tern__cuda_g1_grid, tern__cuda_g1_early, tern__cuda_gemv_rmsu, tern__cuda_g1_xb,
        tern__cuda_g1_cpa;
    const int keep_qmma = tern__cuda_qmma_mode, keep_grid = tern__cuda_g1_grid, keep_early = tern__cuda_g1_early,
              keep_rmsu = tern__cuda_gemv_rmsu, keep_xb = tern__cuda_g1_xb, keep_cpa = tern__cuda_g1_cpa;
    tern__cuda_qmma_mode = 0;
    int fused = 0, declined = 0;
    for (size_t f = 0; f < TERN_ARRAY_LEN(k_fused_fmt); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(ins); s++)
            for (int wmode = 0; wmode < 2; wmode++) {
                const int in = ins[s];
                tern__cuda_g1_grid = (int)(s + wmode) & 1; /* both gemv1 grids (the same bits) */
                tern__cuda_g1_early = (int)(f + s) & 1 ? 7 : 0; /* and the early first round (TERN_CUDA_G1_EARLY) */
                tern__cuda_gemv_rmsu = (int)(f + s + wmode) & 1; /* gemv_mma's pre-norm sums both ways (TERN_CUDA_GEMV_RMSU) */
                tern__cuda_g1_xb = (int)(s + wmode) & 1; /* gemv1's prologue loads batched or not (TERN_CUDA_G1_XB) */
                tern__cuda_g1_cpa = ((int)(f + wmode) & 1) * 2; /* or by cp.async (TERN_CUDA_G1_CPA) */
                hw h[3];
                tern_tensor t[3];
                tern_error err = {0};
                for (int i = 0; i < 3; i++) {
                    h[i] = make_w(k_fused_fmt[f].dt, k_fused_fmt[f].bits, k_fused_fmt[f].gs, k_fused_fmt[f].sdt, 1,
                                  i == 1 ? outs[0] : outs[i], in, 0);
                    t[i] = h[i].t;
                    CHECK(g->vt->upload_weight(g, &t[i], &err) == TERN_OK, "upload %s", err.msg);
                }
                const int tot = 2 * outs[0] + outs[2];
                float *x = rnd((size_t)2 * in, 3.0f), *nw = rnd(in, 1.5f);
                void *xd = to_gpu(x, (size_t)2 * in * 4), *nwd = wmode ? to_gpu(nw, (size_t)in * 4) : NULL;
                float *ya = nan_buf(g, tot), *yb = nan_buf(g, tot), *xna = nan_buf(g, in), *xnb = nan_buf(g, in);
                char nm[64];
                fmt_name(&h[0].t, nm, sizeof nm);
                const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
                for (int op = 0; op < 4; op++) { /* 0 q|k|v, 1 glu silu, 2 glu gelu, 3 one matrix */
                    const int k = op == 0 ? 3 : op == 3 ? 1 : 2, act = op == 1 ? TERN_ACT_SILU : op == 2 ? TERN_ACT_GELU_TANH : -1;
                    float *ysa[3] = {ya, ya + outs[0], ya + 2 * outs[0]}, *ysb[3] = {yb, yb + outs[0], yb + 2 * outs[0]};
                    const int r = g->vt->norm_matmul(g, xna, xd, nwd, 1e-6f, 1, k, ysa, ws, act, NULL);
                    if (!r) {
                        declined++;
                        CHECK(0, "%s in %d op %d: declined", nm, in, op);
                        continue;
                    }
                    fused++;
                    g->vt->rmsnorm(g, xnb, xd, 1, in, nwd, 1e-6f);
                    if (op == 0) CHECK(g->vt->matmul_n(g, 3, ysb, xnb, 1, ws) == 1, "%s matmul_n refused", nm);
                    else if (op == 3) g->vt->matmul(g, yb, xnb, 1, &t[0]);
                    else CHECK(g->vt->matmul_glu(g, yb, xnb, 1, &t[0], &t[1], act) == 1, "%s matmul_glu refused", nm);
                    const int cnt = op == 0 ? tot : outs[0];
                    float *a = from_gpu(g, ya, cnt), *b = from_gpu(g, yb, cnt);
                    float *na = from_gpu(g, xna, in), *nb = from_gpu(g, xnb, in);
                    CHECK(same_bits(na, nb, in), "%s in %d w %d op %d: xn differs from rmsnorm", nm, in, wmode, op);
                    CHECK(same_bits(a, b, cnt), "%s in %d w %d op %d: y differs from rmsnorm + op", nm, in, wmode, op);
                    free(a); free(b); free(na); free(nb);
                }
                float *ys1[1] = {ya};
                CHECK(g->vt->norm_matmul(g, xna, xd, nwd, 1e-6f, 2, 1, ys1, ws, -1, NULL) == 0, "n = 2 should decline");
                CHECK(g->vt->norm_matmul(g, xd, xd, nwd, 1e-6f, 1, 1, ys1, ws, -1, NULL) == 0, "in place should decline");
                for (int i = 0; i < 3; i++) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); }
                void *bufs[] = {xd, nwd, ya, yb, xna, xnb};
                for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) if (bufs[i]) g->vt->free(g, bufs[i]);
                free(x); free(nw);
            }
    printf("  norm_matmul: %d fused, %d declined\n", fused, declined);
    CHECK(fused > 0, "norm_matmul never fused");
    tern__cuda_qmma_mode = keep_qmma;
    tern__cuda_gemv_rmsu = keep_rmsu;
    tern__cuda_g1_xb = keep_xb;
    tern__cuda_g1_grid = keep_grid;
    tern__cuda_g1_early = keep_early;
    tern__cuda_g1_cpa = keep_cpa;
}

/* rmsnorm_n (one launch over up to three tensors) vs one rmsnorm per tensor: bitwise, in place as
 * Gemma 4 calls it (q, k, v head norms, v without weight) and out of place, widths 64..512, k 1..3 */
extern int tern__cuda_norm_n;
/* norm.cu's many-row launches (rms_launch<true>, rmsnorm_add's: 128 / 256 threads a row standing in for 2 or 4
 * virtual ones) against the same rows one launch each (one row: a thread per virtual thread), bitwise, with and
 * without the scalar, at d 300 (VPT 2), 2816 and 3840 (VPT 4), 5376 (VPT 2, 16 a virtual thread) and 9000 (the
 * strided walk), 300 rows (over two a SM); rmsnorm and rmsnorm_bf16's f32 / bf16 pair (one thread per virtual
 * thread at any row count) the same way */
struct tern__cuda; /* backend/cuda/cuda_internal.h (not included here: C only) */
void tern__cuda_rmsnorm_bf16(struct tern__cuda *c, float *y, void *yb, void *yl, const float *x, int rows, int d,
                             const float *w, float eps);
TEST(cuda_rmsnorm_vpt) {
    tern_backend *g = g_gpu;
    static const int ds[] = {300, 2816, 3840, 5376, 9000};
    const int n = 300;
    for (size_t di = 0; di < TERN_ARRAY_LEN(ds); di++) {
        const int d = ds[di];
        const size_t cnt = (size_t)n * d;
        float *hx = rnd(cnt, 2.0f), *hh = rnd(cnt, 1.5f), *hw = rnd((size_t)d, 1.0f), sc = 0.75f;
        void *x = to_gpu(hx, cnt * 4), *h = to_gpu(hh, cnt * 4), *w = to_gpu(hw, (size_t)d * 4), *s = to_gpu(&sc, 4);
        float *ya = nan_buf(g, cnt), *yb = nan_buf(g, cnt);
        void *ba = nan_buf(g, cnt), *bb = nan_buf(g, cnt); /* bf16 pairs: 2 x cnt x 2 bytes */
        struct tern__cuda *c = (struct tern__cuda *)g->impl;
        for (int op = 0; op < 4; op++) { /* 0 rmsnorm, 1 rmsnorm_add, 2 rmsnorm_add with s, 3 rmsnorm_bf16 */
            if (op == 1 || op == 2) { g->vt->upload(g, ya, hx, cnt * 4); g->vt->upload(g, yb, hx, cnt * 4); }
            const float *sp = op == 2 ? (const float *)s : NULL;
            if (op == 0) g->vt->rmsnorm(g, ya, x, n, d, w, 1e-6f);
            else if (op < 3) CHECK(g->vt->rmsnorm_add(g, ya, h, n, d, w, 1e-6f, sp) == 1, "rmsnorm_add refused");
            else tern__cuda_rmsnorm_bf16(c, ya, ba, (uint16_t *)ba + cnt, x, n, d, w, 1e-6f);
            for (int r = 0; r < n; r++) {
                const size_t o = (size_t)r * d;
                if (op == 0) g->vt->rmsnorm(g, yb + o, (const float *)x + o, 1, d, w, 1e-6f);
                else if (op < 3) g->vt->rmsnorm_add(g, yb + o, (const float *)h + o, 1, d, w, 1e-6f, sp);
                else tern__cuda_rmsnorm_bf16(c, yb + o, (uint16_t *)bb + o, (uint16_t *)bb + cnt + o,
                                             (const float *)x + o, 1, d, w, 1e-6f);
            }
            float *a = from_gpu(g, ya, cnt), *b = from_gpu(g, yb, cnt);
            CHECK(same_bits(a, b, cnt), "d %d op %d: many rows differ from one row at a time", d, op);
            if (op == 3) {
                float *pa = from_gpu(g, ba, cnt), *pb = from_gpu(g, bb, cnt); /* 2 x cnt bf16 = cnt floats */
                CHECK(same_bits(pa, pb, cnt), "d %d: the bf16 pair differs", d);
                free(pa); free(pb);
            }
            free(a); free(b);
        }
        void *bufs[] = {x, h, w, s, ya, yb, ba, bb};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(hx); free(hh); free(hw);
    }
}

TEST(cuda_rmsnorm_n) {
    tern_backend *g = g_gpu;
    if (!g->vt->rmsnorm_n) { SKIP("cuda_rmsnorm_n", "not built"); return; }
    const int keep = tern__cuda_norm_n;
    tern__cuda_norm_n = 1;
    static const int ds[] = {64, 128, 256, 512};
    static const int rs[3] = {16, 4, 5};
    for (size_t di = 0; di < TERN_ARRAY_LEN(ds); di++)
        for (int k = 1; k <= 3; k++)
            for (int inplace = 0; inplace < 2; inplace++) {
                const int d = ds[di];
                float *ya[3], *yb[3], *xs[3];
                const float *xa[3], *xb[3], *wd[3];
                void *wbuf[3] = {NULL, NULL, NULL};
                float *hx[3];
                for (int i = 0; i < k; i++) {
                    const size_t cnt = (size_t)rs[i] * d;
                    hx[i] = rnd(cnt, 2.0f + (float)i);
                    xs[i] = to_gpu(hx[i], cnt * 4);
                    ya[i] = to_gpu(hx[i], cnt * 4);
                    yb[i] = to_gpu(hx[i], cnt * 4);
                    xa[i] = inplace ? ya[i] : xs[i];
                    xb[i] = inplace ? yb[i] : xs[i];
                    if (i != 2) { /* the third (v) without weight */
                        float *w = rnd((size_t)d, 1.0f);
                        wbuf[i] = to_gpu(w, (size_t)d * 4);
                        free(w);
                    }
                    wd[i] = wbuf[i];
                }
                CHECK(g->vt->rmsnorm_n(g, k, ya, xa, rs, d, wd, 1e-6f) == 1, "rmsnorm_n refused");
                for (int i = 0; i < k; i++) g->vt->rmsnorm(g, yb[i], xb[i], rs[i], d, wd[i], 1e-6f);
                for (int i = 0; i < k; i++) {
                    const size_t cnt = (size_t)rs[i] * d;
                    float *a = from_gpu(g, ya[i], cnt), *b = from_gpu(g, yb[i], cnt);
                    CHECK(same_bits(a, b, cnt), "rmsnorm_n d %d k %d in place %d: tensor %d differs", d, k, inplace, i);
                    free(a); free(b);
                    g->vt->free(g, ya[i]); g->vt->free(g, yb[i]); g->vt->free(g, xs[i]);
                    if (wbuf[i]) g->vt->free(g, wbuf[i]);
                    free(hx[i]);
                }
            }
    tern__cuda_norm_n = keep;
}

/* norm_matmul with the post-norm residual add folded in (res): x' in x_out, xn and y bitwise those of
 * rmsnorm_add (x += rmsnorm(h)·w, ·s) + rmsnorm + the op; with and without the post-norm weight and the
 * scalar; both gemv1 grids; BF16 and Q8 (gemv1) and Q4 (gemv_mma.cu, every K-slice block forming the
 * whole x', its pre-norm sums both ways: TERN_CUDA_GEMV_RMSU), widths 384 / 4096 / 5376 (Gemma 4 12B's
 * hidden size: 11 registers per rmsnorm thread). With the inner add (res h2, mode bit 2: h += rmsnorm(h2)·w2 first,
 * Gemma 4's MoE layers) gemv1 matches rmsnorm_add(h, h2, w2) + the above, and gemv_mma (Q4) declines. */
extern int tern__cuda_norm_res;
TEST(cuda_norm_matmul_res) {
    tern_backend *g = g_gpu;
    if (!g->vt->norm_matmul) { SKIP("cuda_norm_matmul_res", "not built"); return; }
    extern int tern__cuda_g1_grid, tern__cuda_gemv_rmsu, tern__cuda_g1_xb, tern__cuda_g1_cpa;
    const int keep = tern__cuda_norm_res, keep_grid = tern__cuda_g1_grid, keep_rmsu = tern__cuda_gemv_rmsu,
              keep_xb = tern__cuda_g1_xb, keep_cpa = tern__cuda_g1_cpa;
    tern__cuda_norm_res = 1;
    static const int ins[] = {384, 4096, 5376};
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; } F[] = {
        {TERN_DT_BF16, 0, 0, 0}, {TERN_DT_Q, 8, 64, TERN_DT_BF16}, {TERN_DT_Q, 4, 64, TERN_DT_BF16}};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
        for (size_t si = 0; si < TERN_ARRAY_LEN(ins); si++)
            for (int mode = 0; mode < 8; mode++) { /* bit 0: post-norm weight, bit 1: scalar, bit 2: inner add h2 */
                const int in = ins[si], out = 300;
                tern__cuda_g1_grid = mode & 1;
                tern__cuda_gemv_rmsu = (int)((mode >> 1) ^ si) & 1; /* gemv_mma's pre-norm sums both ways */
                tern__cuda_g1_xb = (int)((mode >> 1) ^ (mode & 1) ^ si) & 1; /* gemv1's prologue loads batched or not */
                hw h[2];
                tern_tensor t[2];
                tern_error err = {0};
                for (int i = 0; i < 2; i++) {
                    h[i] = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, 1, out, in, 0);
                    t[i] = h[i].t;
                    CHECK(g->vt->upload_weight(g, &t[i], &err) == TERN_OK, "upload %s", err.msg);
                }
                float *x = rnd(in, 3.0f), *hh = rnd(in, 20.0f), *wp = rnd(in, 1.0f), *wn = rnd(in, 1.5f), sc = 0.37f;
                void *xd = to_gpu(x, (size_t)in * 4), *hd = to_gpu(hh, (size_t)in * 4), *xbd = to_gpu(x, (size_t)in * 4);
                void *hbd = to_gpu(hh, (size_t)in * 4), *wpd = to_gpu(wp, (size_t)in * 4), *wnd = to_gpu(wn, (size_t)in * 4);
                void *sd = to_gpu(&sc, 4);
                float *h2 = rnd(in, 7.0f), *w2 = rnd(in, 1.2f);
                void *h2d = to_gpu(h2, (size_t)in * 4), *h2bd = to_gpu(h2, (size_t)in * 4), *w2d = to_gpu(w2, (size_t)in * 4);
                float *xo = nan_buf(g, in), *xna = nan_buf(g, in), *xnb = nan_buf(g, in), *ya = nan_buf(g, out), *yb = nan_buf(g, out);
                const float *pw = (mode & 1) ? wpd : NULL, *ps = (mode & 2) ? sd : NULL;
                const int inner = mode >> 2 & 1;
                tern__cuda_g1_cpa = inner ? 1 : (int)((mode ^ si ^ f) & 1) * 2; /* gemv1's prologue by cp.async or not */
                /* the inner add runs on the cpa prologue only: BF16 weights whose regions (row, h, w2, x, w, nw) fit 96 KB */
                const int regions = 4 + (mode & 1) * 2, fits = F[f].dt == TERN_DT_BF16 && regions * in * 4 <= 96 * 1024;
                const tern_norm_res r = {xo, hd, pw, ps, inner ? h2d : NULL, inner && (mode & 1) ? w2d : NULL};
                const tern_tensor *ws[2] = {&t[0], &t[1]};
                float *ysa[1] = {ya};
                char nm[64];
                fmt_name(&h[0].t, nm, sizeof nm);
                const int ok = g->vt->norm_matmul(g, xna, xd, wnd, 1e-6f, 1, 2, ysa, ws, TERN_ACT_GELU_TANH, &r);
                if (inner && !fits) {
                    CHECK(!ok, "%s in %d mode %d: the inner add should decline here", nm, in, mode);
                } else {
                    CHECK(ok, "%s in %d mode %d: declined", nm, in, mode);
                    /* the separate ops: (h += rmsnorm(h2)·w2,) x += rmsnorm(h)·w (·s) in place, then rmsnorm, then gate|up */
                    if (inner)
                        CHECK(g->vt->rmsnorm_add(g, hbd, h2bd, 1, in, r.w2, 1e-6f, NULL) == 1, "rmsnorm_add refused");
                    CHECK(g->vt->rmsnorm_add(g, xbd, hbd, 1, in, pw, 1e-6f, ps) == 1, "rmsnorm_add refused");
                    g->vt->rmsnorm(g, xnb, xbd, 1, in, wnd, 1e-6f);
                    CHECK(g->vt->matmul_glu(g, yb, xnb, 1, &t[0], &t[1], TERN_ACT_GELU_TANH) == 1, "matmul_glu refused");
                    float *a1 = from_gpu(g, xo, in), *b1 = from_gpu(g, xbd, in), *a2 = from_gpu(g, xna, in), *b2 = from_gpu(g, xnb, in);
                    float *a3 = from_gpu(g, ya, out), *b3 = from_gpu(g, yb, out), *x0 = from_gpu(g, xd, in);
                    CHECK(same_bits(a1, b1, in), "%s in %d mode %d: x' differs from rmsnorm_add", nm, in, mode);
                    CHECK(same_bits(a2, b2, in), "%s in %d mode %d: xn differs", nm, in, mode);
                    CHECK(same_bits(a3, b3, out), "%s in %d mode %d: y differs", nm, in, mode);
                    CHECK(same_bits(x0, x, in), "%s in %d mode %d: x was written", nm, in, mode);
                    free(a1); free(b1); free(a2); free(b2); free(a3); free(b3); free(x0);
                }
                for (int i = 0; i < 2; i++) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); }
                void *bufs[] = {xd, hd, xbd, hbd, wpd, wnd, sd, xo, xna, xnb, ya, yb, h2d, h2bd, w2d};
                for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
                free(x); free(hh); free(wp); free(wn); free(h2); free(w2);
            }
    tern__cuda_norm_res = keep;
    tern__cuda_gemv_rmsu = keep_rmsu;
    tern__cuda_g1_xb = keep_xb;
    tern__cuda_g1_grid = keep_grid;
    tern__cuda_g1_cpa = keep_cpa;
}

/* matmul_act_mul (Gemma 4's per-layer input gate: the post-norm residual add, the gate's matmul and gelu·ple in one
 * launch) vs rmsnorm_add + matmul + gelu_tanh_mul / silu_mul: x' and y bitwise, without res, with res (with and
 * without the post-norm weight and the scalar), BF16 and F16 weights, widths 384, 2560 and 4096, both
 * gemv1 grids; Q4 g64 the same with TERN_CUDA_GEMV_MMA=0 keeping it off the tensor-core GEMV (gemv1 serves the
 * separate matmul too: its Q4 instance runs for the shapes the walk declines); Q4 that the tensor-core GEMV takes,
 * and several rows, decline. */
TEST(cuda_matmul_act_mul) {
    tern_backend *g = g_gpu;
    if (!g->vt->matmul_act_mul) { SKIP("cuda_matmul_act_mul", "not built"); return; }
    extern int tern__cuda_g1_grid, tern__cuda_g1_xb, tern__cuda_gemv_mma_on, tern__cuda_g1_cpa, tern__cuda_g1_epf;
    const int keep_grid = tern__cuda_g1_grid, keep_xb = tern__cuda_g1_xb, keep_on = tern__cuda_gemv_mma_on,
              keep_cpa = tern__cuda_g1_cpa, keep_epf = tern__cuda_g1_epf;
    static const int ins[] = {384, 2560, 4096};
    static const tern_dtype dts[] = {TERN_DT_BF16, TERN_DT_F16, TERN_DT_Q};
    for (size_t f = 0; f < TERN_ARRAY_LEN(dts); f++)
        for (size_t si = 0; si < TERN_ARRAY_LEN(ins); si++)
            for (int mode = 0; mode < 5; mode++) { /* 0: no res; 1..4: res, bit 0 of mode-1 weight, bit 1 scalar */
                const int in = ins[si], out = 256 + 2 * (int)si, act = mode & 1 ? TERN_ACT_SILU : TERN_ACT_GELU_TANH;
                tern__cuda_g1_grid = (int)(f + mode) & 1;
                tern__cuda_g1_xb = (int)(si + (mode >> 1)) & 1; /* the prologue's loads batched or not (TERN_CUDA_G1_XB) */
                tern__cuda_g1_cpa = ((int)(f + si + mode) & 1) * 2; /* or by cp.async (TERN_CUDA_G1_CPA; no act·mul instance) */
                tern__cuda_g1_epf = (int)(si + mode) & 1; /* mv[o] read as the task starts or at its end (TERN_CUDA_G1_EPF) */
                tern__cuda_gemv_mma_on = dts[f] == TERN_DT_Q ? 0 : keep_on;
                hw h = dts[f] == TERN_DT_Q ? make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, out, in, 0)
                                           : make_w(dts[f], 0, 0, 0, 1, out, in, 0);
                tern_tensor t = h.t;
                tern_error err = {0};
                CHECK(g->vt->upload_weight(g, &t, &err) == TERN_OK, "upload %s", err.msg);
                float *x = rnd(in, 3.0f), *hh = rnd(in, 20.0f), *wp = rnd(in, 1.0f), *v = rnd(out, 2.0f), sc = 0.37f;
                void *xd = to_gpu(x, (size_t)in * 4), *hd = to_gpu(hh, (size_t)in * 4), *xbd = to_gpu(x, (size_t)in * 4);
                void *hbd = to_gpu(hh, (size_t)in * 4), *wpd = to_gpu(wp, (size_t)in * 4), *sd = to_gpu(&sc, 4);
                void *vd = to_gpu(v, (size_t)out * 4);
                float *xo = nan_buf(g, in), *ya = nan_buf(g, out), *yb = nan_buf(g, out);
                const int rm = mode - 1;
                const float *pw = mode && (rm & 1) ? wpd : NULL, *ps = mode && (rm & 2) ? sd : NULL;
                const tern_norm_res r = {xo, hd, pw, ps};
                char nm[64];
                fmt_name(&h.t, nm, sizeof nm);
                CHECK(g->vt->matmul_act_mul(g, ya, xd, 1, &t, act, vd, mode ? &r : NULL, 1e-6f) == 1,
                      "%s in %d mode %d: declined", nm, in, mode);
                if (mode) CHECK(g->vt->rmsnorm_add(g, xbd, hbd, 1, in, pw, 1e-6f, ps) == 1, "rmsnorm_add refused");
                g->vt->matmul(g, yb, xbd, 1, &t);
                if (act == TERN_ACT_SILU) g->vt->silu_mul(g, yb, yb, vd, out);
                else g->vt->gelu_tanh_mul(g, yb, yb, vd, out);
                float *a3 = from_gpu(g, ya, out), *b3 = from_gpu(g, yb, out), *x0 = from_gpu(g, xd, in);
                CHECK(same_bits(a3, b3, out), "%s in %d mode %d: y differs", nm, in, mode);
                CHECK(same_bits(x0, x, in), "%s in %d mode %d: x was written", nm, in, mode);
                if (mode) {
                    float *a1 = from_gpu(g, xo, in), *b1 = from_gpu(g, xbd, in);
                    CHECK(same_bits(a1, b1, in), "%s in %d mode %d: x' differs from rmsnorm_add", nm, in, mode);
                    free(a1); free(b1);
                }
                CHECK(g->vt->matmul_act_mul(g, ya, xd, 2, &t, act, vd, NULL, 1e-6f) == 0, "n = 2 should decline");
                free(a3); free(b3); free(x0);
                g->vt->free_weight(g, &t);
                free_w(&h);
                void *bufs[] = {xd, hd, xbd, hbd, wpd, sd, vd, xo, ya, yb};
                for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
                free(x); free(hh); free(wp); free(v);
            }
    tern__cuda_gemv_mma_on = keep_on;
    tern__cuda_g1_cpa = keep_cpa;
    tern__cuda_g1_epf = keep_epf;
    { /* Q4 that the tensor-core GEMV takes declines (it has no such epilogue) */
        hw h = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 256, 2560, 0);
        tern_tensor t = h.t;
        tern_error err = {0};
        CHECK(g->vt->upload_weight(g, &t, &err) == TERN_OK, "upload %s", err.msg);
        float *x = rnd(2560, 1.0f);
        void *xd = to_gpu(x, 2560 * 4), *vd = to_gpu(x, 256 * 4);
        float *y = nan_buf(g, 256);
        CHECK(g->vt->matmul_act_mul(g, y, xd, 1, &t, TERN_ACT_GELU_TANH, vd, NULL, 1e-6f) == 0, "q4 should decline");
        g->vt->free_weight(g, &t);
        free_w(&h);
        g->vt->free(g, xd); g->vt->free(g, vd); g->vt->free(g, y);
        free(x);
    }
    tern__cuda_g1_xb = keep_xb;
    tern__cuda_g1_grid = keep_grid;
}

/* norm_rope_kv_write (Gemma 4's q / k / v head norms + rope + cache stores in one launch) vs rmsnorm ×3 +
 * rope_kv_write: q, k, v and both pools bitwise, F32 / BF16 / F16 pages, head dims 256 and 512 (Gemma 4's
 * sliding and global layers: the warp form) and 128 (the block form), an identity rope pair and a block that
 * is not resident; and q alone (k = v = NULL) vs rmsnorm + rope. */
extern int tern__cuda_norm_rope, tern__cuda_nrk_hoist;
TEST(cuda_norm_rope_kv) {
    tern_backend *g = g_gpu;
    if (!g->vt->norm_rope_kv_write) { SKIP("cuda_norm_rope_kv", "not built"); return; }
    const int keep = tern__cuda_norm_rope, keep_hoist = tern__cuda_nrk_hoist;
    tern__cuda_norm_rope = 1;
    static const int ds[] = {256, 512, 128};
    for (size_t di = 0; di < TERN_ARRAY_LEN(ds); di++) {
        const int nh = 8, nkv = 2, d = ds[di], bs = 16, mb = 8, n = 5, ctx = mb * bs;
        const size_t pool = (size_t)mb * bs * nkv * d, nq = (size_t)n * nh * d, nk = (size_t)n * nkv * d;
        float *kh = rnd(pool, 1.0f), *q = rnd(nq, 3.0f), *k = rnd(nk, 3.0f), *v = rnd(nk, 3.0f), *inv = rnd(d / 2, 0.5f);
        float *qw = rnd(d, 1.0f), *kw = rnd(d, 1.0f);
        inv[3] = 0.0f; /* identity pair */
        int32_t bt[8], pos[5] = {bs + 2, 77, ctx - 1, 3, 40}, slot[5] = {0, 0, 0, 0, 0};
        for (int i = 0; i < mb; i++) bt[i] = (i * 3) % mb;
        bt[1] = -1; /* not resident: never written */
        void *btd = to_gpu(bt, sizeof bt), *pd = to_gpu(pos, sizeof pos), *sd = to_gpu(slot, sizeof slot);
        void *invd = to_gpu(inv, (size_t)d / 2 * 4), *qwd = to_gpu(qw, (size_t)d * 4), *kwd = to_gpu(kw, (size_t)d * 4);
        uint8_t *ha = malloc(pool * 4), *hb = malloc(pool * 4);
        static const int kinds[] = {TERN_KV_F32, TERN_KV_BF16, TERN_KV_F16};
        static const char *kname[] = {"f32", "bf16", "f16"};
        for (size_t f = 0; f < TERN_ARRAY_LEN(kinds); f++) {
            const size_t pool_b = pool * (f ? 2 : 4);
            tern__cuda_nrk_hoist = (int)(di + f) & 1; /* the warp form's loads hoisted or not (TERN_CUDA_NRK_HOIST) */
            tern_kv_layer kv[2];
            void *qd[2], *kd[2], *vd[2];
            for (int i = 0; i < 2; i++) {
                kv[i] = (tern_kv_layer){f ? TERN_DT_Q : TERN_DT_F32, nkv, d, bs, 0, to_gpu(kh, pool_b), to_gpu(kh, pool_b),
                                        btd, mb};
                kv[i].kf.kind = kv[i].vf.kind = kinds[f];
                qd[i] = to_gpu(q, nq * 4);
                kd[i] = to_gpu(k, nk * 4);
                vd[i] = to_gpu(v, nk * 4);
            }
            tern_rows rows = {n, pd, sd, pos, slot};
            CHECK(g->vt->norm_rope_kv_write(g, &kv[0], &rows, qd[0], kd[0], vd[0], nh, invd, 1.25f, qwd, kwd, 1e-6f) == 1,
                  "d %d %s: norm_rope_kv_write refused", d, kname[f]);
            g->vt->rmsnorm(g, qd[1], qd[1], n * nh, d, qwd, 1e-6f);
            g->vt->rmsnorm(g, kd[1], kd[1], n * nkv, d, kwd, 1e-6f);
            g->vt->rmsnorm(g, vd[1], vd[1], n * nkv, d, NULL, 1e-6f);
            CHECK(g->vt->rope_kv_write(g, &kv[1], &rows, qd[1], kd[1], vd[1], nh, invd, 1.25f) == 1, "rope_kv_write refused");
            const struct { void *a, *b; size_t bytes; const char *what; } cmp[] = {
                {qd[0], qd[1], nq * 4, "q"}, {kd[0], kd[1], nk * 4, "k"}, {vd[0], vd[1], nk * 4, "v"},
                {kv[0].k, kv[1].k, pool_b, "k pool"}, {kv[0].v, kv[1].v, pool_b, "v pool"}};
            for (size_t i = 0; i < TERN_ARRAY_LEN(cmp); i++) {
                g->vt->download(g, ha, cmp[i].a, cmp[i].bytes);
                g->vt->download(g, hb, cmp[i].b, cmp[i].bytes);
                CHECK(!memcmp(ha, hb, cmp[i].bytes), "norm_rope_kv_write d %d %s pages: %s differs", d, kname[f], cmp[i].what);
            }
            /* q only (k = v = NULL: a KV-shared layer's query) vs rmsnorm + rope; the pages stay as they were */
            g->vt->upload(g, qd[0], q, nq * 4);
            g->vt->upload(g, qd[1], q, nq * 4);
            g->vt->download(g, hb, kv[0].k, pool_b);
            CHECK(g->vt->norm_rope_kv_write(g, &kv[0], &rows, qd[0], NULL, NULL, nh, invd, 1.25f, qwd, NULL, 1e-6f) == 1,
                  "d %d %s: q-only norm_rope_kv_write refused", d, kname[f]);
            g->vt->download(g, ha, kv[0].k, pool_b);
            CHECK(!memcmp(ha, hb, pool_b), "q-only norm_rope_kv_write d %d %s: a page was written", d, kname[f]);
            g->vt->rmsnorm(g, qd[1], qd[1], n * nh, d, qwd, 1e-6f);
            g->vt->rope(g, qd[1], n, nh, d, pd, invd, 1.25f);
            g->vt->download(g, ha, qd[0], nq * 4);
            g->vt->download(g, hb, qd[1], nq * 4);
            CHECK(!memcmp(ha, hb, nq * 4), "q-only norm_rope_kv_write d %d %s pages: q differs from rmsnorm + rope", d, kname[f]);
            for (int i = 0; i < 2; i++) {
                g->vt->free(g, kv[i].k); g->vt->free(g, kv[i].v);
                g->vt->free(g, qd[i]); g->vt->free(g, kd[i]); g->vt->free(g, vd[i]);
            }
        }
        void *bufs[] = {btd, pd, sd, invd, qwd, kwd};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(kh); free(q); free(k); free(v); free(inv); free(qw); free(kw); free(ha); free(hb);
    }
    tern__cuda_norm_rope = keep;
    tern__cuda_nrk_hoist = keep_hoist;
}


/* norm_qkv_rope_kv (the pre-normed q|k|v GEMV with rope_kv_write in its epilogue, TERN_CUDA_QKV_ROPE) vs
 * norm_matmul + rope_kv_write: xn, q, k, v and both pools bitwise, BF16 / F16 weights (gemv1, with and without
 * TERN_CUDA_G1_EARLY) and Q4 g64 (gemv_mma's XP1 walk, forced here, in its split-K epilogue), F32 / BF16 / F16
 * pages, head dims 64 / 128 / 256, at a resident and a non-resident position. Q4 refuses where a head does not
 * fit its row blocks (d 256) or K is not split (in 384); affine pages refuse. */
TEST(cuda_norm_qkv_rope_kv) {
    tern_backend *g = g_gpu;
    if (!g->vt->norm_qkv_rope_kv) { SKIP("cuda_norm_qkv_rope_kv", "not built"); return; }
    extern int tern__cuda_qkv_rope, tern__cuda_g1_early, tern__cuda_gemv_mma_xp1, tern__cuda_g1_xb, tern__cuda_g1_cpa;
    const int keep = tern__cuda_qkv_rope, keep_early = tern__cuda_g1_early, keep_xp1 = tern__cuda_gemv_mma_xp1,
              keep_xb = tern__cuda_g1_xb, keep_cpa = tern__cuda_g1_cpa;
    tern__cuda_qkv_rope = 3;
    tern__cuda_gemv_mma_xp1 = 1;
    /* q4: whether the Q4 GEMV serves the case (split K, heads inside its 128-row blocks) */
    static const struct { int nh, nkv, d, in, q4; } C[] = {
        {8, 2, 128, 384, 0}, {4, 4, 64, 4096, 1}, {8, 1, 256, 1536, 0}, {8, 2, 128, 4096, 1}, {8, 2, 256, 2560, 0}};
    static const tern_dtype wdt[] = {TERN_DT_BF16, TERN_DT_F16, TERN_DT_Q};
    static const int kinds[] = {TERN_KV_F32, TERN_KV_BF16, TERN_KV_F16};
    static const char *kname[] = {"f32", "bf16", "f16"};
    int ran = 0;
    for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++)
        for (size_t wi = 0; wi < TERN_ARRAY_LEN(wdt); wi++)
            for (size_t f = 0; f < TERN_ARRAY_LEN(kinds); f++)
                for (int early = 0; early < 2; early++) {
                    const int nh = C[ci].nh, nkv = C[ci].nkv, d = C[ci].d, in = C[ci].in, bs = 16, mb = 8;
                    const size_t pool = (size_t)mb * bs * nkv * d, pool_b = pool * (f ? 2 : 4);
                    const size_t nq = (size_t)nh * d, nk = (size_t)nkv * d;
                    tern__cuda_g1_early = early ? 7 : 0;
                    tern__cuda_g1_xb = (int)(f + early) & 1; /* TERN_CUDA_G1_XB both ways */
                    tern__cuda_g1_cpa = early ? 2 * (int)(f & 1) : 0; /* the cp.async prologue (TERN_CUDA_G1_CPA) */
                    hw h[3];
                    tern_tensor t[3];
                    tern_error err = {0};
                    for (int i = 0; i < 3; i++) {
                        h[i] = wdt[wi] == TERN_DT_Q ? make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, i ? (int)nk : (int)nq, in, 0)
                                                    : make_w(wdt[wi], 0, 0, 0, 1, i ? (int)nk : (int)nq, in, 0);
                        t[i] = h[i].t;
                        CHECK(g->vt->upload_weight(g, &t[i], &err) == TERN_OK, "upload %s", err.msg);
                    }
                    const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
                    float *x = rnd(in, 3.0f), *nw = rnd(in, 1.5f), *kh = rnd(pool, 1.0f), *inv = rnd(d / 2, 0.5f);
                    inv[3] = 0.0f; /* identity pair */
                    int32_t bt[8], slot[1] = {0};
                    for (int i = 0; i < mb; i++) bt[i] = (i * 3) % mb;
                    bt[1] = -1; /* not resident: never written */
                    void *xd = to_gpu(x, (size_t)in * 4), *nwd = to_gpu(nw, (size_t)in * 4), *btd = to_gpu(bt, sizeof bt);
                    void *sd = to_gpu(slot, sizeof slot), *invd = to_gpu(inv, (size_t)d / 2 * 4);
                    uint8_t *ha = malloc(pool * 4), *hb = malloc(pool * 4);
                    for (int pi = 0; pi < 2; pi++) {
                        int32_t pos[1] = {pi ? bs + 3 : 5 * bs + 7}; /* block 1 is not resident */
                        void *pd = to_gpu(pos, sizeof pos);
                        tern_kv_layer kv[2];
                        float *xn[2], *q[2], *k[2], *v[2];
                        for (int i = 0; i < 2; i++) {
                            kv[i] = (tern_kv_layer){f ? TERN_DT_Q : TERN_DT_F32, nkv, d, bs, 0, to_gpu(kh, pool_b),
                                                    to_gpu(kh, pool_b), btd, mb};
                            kv[i].kf.kind = kv[i].vf.kind = kinds[f];
                            xn[i] = nan_buf(g, in);
                            q[i] = nan_buf(g, nq);
                            k[i] = nan_buf(g, nk);
                            v[i] = nan_buf(g, nk);
                        }
                        tern_rows rows = {1, pd, sd, pos, slot};
                        const int r = g->vt->norm_qkv_rope_kv(g, xn[0], xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kv[0], &rows,
                                                              nh, invd, 1.25f);
                        char nm[96];
                        snprintf(nm, sizeof nm, "%s h%d/%d d%d in%d %s pages early %d pos %d",
                                 wdt[wi] == TERN_DT_BF16 ? "bf16" : wdt[wi] == TERN_DT_F16 ? "f16" : "q4", nh, nkv, d, in,
                                 kname[f], early, pos[0]);
                        const int want = wdt[wi] != TERN_DT_Q || C[ci].q4;
                        CHECK(r == want, "%s: norm_qkv_rope_kv %s", nm, want ? "refused" : "should refuse");
                        if (!r) { /* what the model runs then: compare the separate ops with themselves (nothing) */
                            for (int i = 0; i < 2; i++) {
                                void *b[] = {kv[i].k, kv[i].v, xn[i], q[i], k[i], v[i]};
                                for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
                            }
                            g->vt->free(g, pd);
                            continue;
                        }
                        float *ys[3] = {q[1], k[1], v[1]};
                        CHECK(g->vt->norm_matmul(g, xn[1], xd, nwd, 1e-6f, 1, 3, ys, ws, -1, NULL) == 1, "norm_matmul refused");
                        CHECK(g->vt->rope_kv_write(g, &kv[1], &rows, q[1], k[1], v[1], nh, invd, 1.25f) == 1,
                              "rope_kv_write refused");
                        const struct { void *a, *b; size_t bytes; const char *what; } cmp[] = {
                            {xn[0], xn[1], (size_t)in * 4, "xn"}, {q[0], q[1], nq * 4, "q"}, {k[0], k[1], nk * 4, "k"},
                            {v[0], v[1], nk * 4, "v"}, {kv[0].k, kv[1].k, pool_b, "k pool"}, {kv[0].v, kv[1].v, pool_b, "v pool"}};
                        for (size_t i = 0; i < TERN_ARRAY_LEN(cmp); i++) {
                            g->vt->download(g, ha, cmp[i].a, cmp[i].bytes);
                            g->vt->download(g, hb, cmp[i].b, cmp[i].bytes);
                            CHECK(!memcmp(ha, hb, cmp[i].bytes), "norm_qkv_rope_kv %s: %s differs", nm, cmp[i].what);
                        }
                        ran += r;
                        if (ci == 0 && wi == 0 && early == 0 && pi == 0) {
                            tern_kv_layer kq = kv[0];
                            kq.kf.kind = kq.vf.kind = TERN_KV_AFFINE;
                            CHECK(g->vt->norm_qkv_rope_kv(g, xn[0], xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kq, &rows, nh, invd,
                                                          1.0f) == 0, "affine pages must refuse");
                        }
                        for (int i = 0; i < 2; i++) {
                            void *b[] = {kv[i].k, kv[i].v, xn[i], q[i], k[i], v[i]};
                            for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
                        }
                        g->vt->free(g, pd);
                    }
                    void *b[] = {xd, nwd, btd, sd, invd};
                    for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
                    for (int i = 0; i < 3; i++) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); }
                    free(x); free(nw); free(kh); free(inv); free(ha); free(hb);
                }
    printf("  norm_qkv_rope_kv: %d fused cases\n", ran);
    tern__cuda_qkv_rope = keep;
    tern__cuda_g1_xb = keep_xb;
    tern__cuda_g1_early = keep_early;
    tern__cuda_gemv_mma_xp1 = keep_xp1;
    tern__cuda_g1_cpa = keep_cpa;
}

/* the elementwise family's 4-wide kernel (aligned arrays, n % 4 == 0) against its scalar kernel (the same arrays
 * one float further on: misaligned), every op, bitwise */
TEST(cuda_ew_vector) {
    tern_backend *g = g_gpu;
    const size_t n = 4 * 1000;
    float *a = rnd(n, 4.0f), *b = rnd(n, 2.0f), s1 = 0.75f;
    float *ad[2] = {nan_buf(g, n + 1), nan_buf(g, n + 1)}, *bd[2] = {nan_buf(g, n + 1), nan_buf(g, n + 1)};
    float *yd[2] = {nan_buf(g, n + 1), nan_buf(g, n + 1)}, *sd = to_gpu(&s1, 4);
    for (int mis = 0; mis < 2; mis++) { /* 0: a, b, y 16-byte aligned; 1: the same values one float on */
        g->vt->upload(g, ad[mis] + mis, a, n * 4);
        g->vt->upload(g, bd[mis] + mis, b, n * 4);
    }
    for (int op = 0; op < 8; op++) {
        float *out[2];
        for (int mis = 0; mis < 2; mis++) {
            float *yy = yd[mis] + mis, *aa = ad[mis] + mis, *bb = bd[mis] + mis;
            g->vt->upload(g, yy, a, n * 4); /* softcap works in place */
            switch (op) {
            case 0: g->vt->add(g, yy, aa, bb, n); break;
            case 1: g->vt->mul(g, yy, aa, bb, n); break;
            case 2: g->vt->scale(g, yy, aa, 1.5f, n); break;
            case 3: g->vt->scale_dev(g, yy, aa, sd, n); break;
            case 4: g->vt->gelu_tanh_mul(g, yy, aa, bb, n); break;
            case 5: g->vt->gelu_tanh_mul(g, yy, aa, NULL, n); break;
            case 6: g->vt->silu_mul(g, yy, aa, bb, n); break;
            default: g->vt->softcap(g, yy, n, 3.0f); break;
            }
            out[mis] = from_gpu(g, yy, n);
        }
        CHECK(!memcmp(out[0], out[1], n * 4), "elementwise op %d: the 4-wide kernel differs from the scalar one", op);
        free(out[0]); free(out[1]);
    }
    void *bufs[] = {ad[0], ad[1], bd[0], bd[1], yd[0], yd[1], sd};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
    free(a); free(b);
}

static void cuda_fused_tests(void) {
    RUN(cuda_ew_vector);
    RUN(cuda_norm_qkv_rope_kv);
    RUN(cuda_norm_rope_kv);
    RUN(cuda_matmul_act_mul);
    RUN(cuda_norm_matmul_res);
    RUN(cuda_rmsnorm_vpt);
    RUN(cuda_rmsnorm_n);
    RUN(cuda_norm_matmul);
    RUN(cuda_fused_rmsnorm_add);
    RUN(cuda_rmsnorm_add2);
    RUN(cuda_gemv1_batch_invariant);
    RUN(cuda_fused_matmuls);
    RUN(cuda_fused_rope_kv_write);
}
