/*
 * cuda_ops_tests_batch.h — the fused decode ops for many rows (gemm.c: tern__cuda_gemm_n / _glu /
 * _add; the plain bf16 mode, BF16 weights, n > 8). Each fused op is checked against the separate ops
 * on the same backend (same bf16 products, f32 accumulation; cuBLASLt may pick another algorithm for
 * a batched or beta = 1 GEMM, so the bound is 1e-5 rel L2 and the largest difference is printed as an
 * "err batch" line) and against cpu-ref at the plain bf16 bound (1e-2, as cuda_matmul_formats).
 * The served cases must return 1 (the fused path ran), precise weights and n <= 8 must return 0.
 * Shapes: a llama-like layer scaled down (q 256 rows, k/v 64 each as one batched GEMM when
 * uploaded back to back, gate/up 384, down 256 x 384), n = 16, 64 and 100.
 * Part of test_cuda_ops.c.
 */

typedef struct bt_w {
    hw h;
    tern_tensor r, g; /* cpu-ref and GPU copies */
} bt_w;

static int bt_make(bt_w *w, int out, int in) {
    tern_error err = {0};
    w->h = make_w(TERN_DT_BF16, 0, 0, 0, 1, out, in, 0);
    w->r = w->g = w->h.t;
    return !g_ref->vt->upload_weight(g_ref, &w->r, &err) && !g_gpu16->vt->upload_weight(g_gpu16, &w->g, &err);
}

static void bt_free(bt_w *w) {
    g_gpu16->vt->free_weight(g_gpu16, &w->g);
    free_w(&w->h);
}

/* cnt Q4 g64 matrices (BF16 scales) [out[i], in] made into h[i] and uploaded to g as t[i]; 1 when every upload worked
 * (after a failure the rest are made, not uploaded). Free with q4w_free */
static int q4w_make(tern_backend *g, hw *h, tern_tensor *t, int cnt, const int *out, int in) {
    tern_error err = {0};
    int ok = 1;
    for (int i = 0; i < cnt; i++) {
        h[i] = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, out[i], in, 0);
        t[i] = h[i].t;
        ok = ok && !g->vt->upload_weight(g, &t[i], &err);
    }
    return ok;
}
static void q4w_free(tern_backend *g, hw *h, tern_tensor *t, int cnt) {
    for (int i = 0; i < cnt; i++) {
        g->vt->free_weight(g, &t[i]);
        free_w(&h[i]);
    }
}

/* rel L2 of a vs b and the largest |a - b| */
static double bt_diff(const float *a, const float *b, size_t n, double *dmax) {
    *dmax = 0.0;
    for (size_t i = 0; i < n; i++) *dmax = fmax(*dmax, fabs((double)a[i] - b[i]));
    return rel_or_nan(a, b, n);
}

TEST(cuda_batch_fused) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->matmul_n || !g->vt->matmul_glu || !g->vt->matmul_add) {
        SKIP("cuda_batch_fused", "no bf16-mode backend or fused ops");
        return;
    }
    const int H = 256, Q = 256, KV = 64, I = 384;
    bt_w wq, wk, wv, wg, wu, wd;
    int ok = bt_make(&wq, Q, H) && bt_make(&wk, KV, H) && bt_make(&wv, KV, H) && bt_make(&wg, I, H) &&
             bt_make(&wu, I, H) && bt_make(&wd, H, I);
    CHECK(ok, "upload");
    if (!ok) return;
    tern__cuda_bf16_split = 0; /* --compute bf16 (plain), not bf16x2 */
    static const int NS[] = {16, 64, 100, 8};
    for (size_t t = 0; t < TERN_ARRAY_LEN(NS); t++) {
        const int n = NS[t], served = n > 8;
        double dm, rel, rref;
        float *x = rnd((size_t)n * I, 1.0f), *res = rnd((size_t)n * H, 1.0f);
        void *xd = to_gpu(x, (size_t)n * I * 4);
        /* q, k, v: one call; k and v outputs back to back (the batched GEMM's case) */
        float *yd = nan_buf(g, (size_t)n * (Q + 2 * KV)), *sd = nan_buf(g, (size_t)n * (Q + 2 * KV));
        float *const ys[3] = {yd, yd + (size_t)n * Q, yd + (size_t)n * (Q + KV)};
        float *const ss[3] = {sd, sd + (size_t)n * Q, sd + (size_t)n * (Q + KV)};
        const tern_tensor *const ws[3] = {&wq.g, &wk.g, &wv.g};
        const bt_w *bw[3] = {&wq, &wk, &wv};
        const int r3 = g->vt->matmul_n(g, 3, ys, xd, n, ws);
        CHECK(r3 == served, "matmul_n n=%d returned %d", n, r3);
        if (r3) {
            for (int i = 0; i < 3; i++) g->vt->matmul(g, ss[i], xd, n, ws[i]);
            float *a = from_gpu(g, yd, (size_t)n * (Q + 2 * KV)), *b = from_gpu(g, sd, (size_t)n * (Q + 2 * KV));
            rel = bt_diff(a, b, (size_t)n * (Q + 2 * KV), &dm);
            rref = 0.0;
            for (int i = 0; i < 3; i++) {
                const int out = i ? KV : Q;
                float *yr = malloc((size_t)n * out * 4);
                g_ref->vt->matmul(g_ref, yr, x, n, &bw[i]->r);
                rref = fmax(rref, rel_or_nan(a + (ss[i] - sd), yr, (size_t)n * out));
                free(yr);
            }
            printf("  err batch qkv n=%-3d vs separate %.2e (max |d| %.2e) vs cpu-ref %.2e\n", n, rel, dm, rref);
            CHECK(rel <= 1e-5 && rref <= 1e-2, "qkv n=%d: vs separate %.3e, vs cpu-ref %.3e", n, rel, rref);
            free(a); free(b);
        }
        /* gate/up/act, both activations */
        for (int act = 0; act < 2; act++) {
            const int A = act ? TERN_ACT_GELU_TANH : TERN_ACT_SILU;
            float *gd = nan_buf(g, (size_t)n * I), *g2 = nan_buf(g, (size_t)n * I), *u2 = nan_buf(g, (size_t)n * I);
            const int rg = g->vt->matmul_glu(g, gd, xd, n, &wg.g, &wu.g, A);
            CHECK(rg == served, "matmul_glu n=%d act %d returned %d", n, A, rg);
            if (rg) {
                g->vt->matmul(g, g2, xd, n, &wg.g);
                g->vt->matmul(g, u2, xd, n, &wu.g);
                if (A == TERN_ACT_SILU) g->vt->silu_mul(g, g2, g2, u2, (size_t)n * I);
                else g->vt->gelu_tanh_mul(g, g2, g2, u2, (size_t)n * I);
                float *a = from_gpu(g, gd, (size_t)n * I), *b = from_gpu(g, g2, (size_t)n * I);
                float *gr = malloc((size_t)n * I * 4), *ur = malloc((size_t)n * I * 4);
                g_ref->vt->matmul(g_ref, gr, x, n, &wg.r);
                g_ref->vt->matmul(g_ref, ur, x, n, &wu.r);
                if (A == TERN_ACT_SILU) g_ref->vt->silu_mul(g_ref, gr, gr, ur, (size_t)n * I);
                else g_ref->vt->gelu_tanh_mul(g_ref, gr, gr, ur, (size_t)n * I);
                rel = bt_diff(a, b, (size_t)n * I, &dm);
                rref = rel_or_nan(a, gr, (size_t)n * I);
                printf("  err batch glu/%s n=%-3d vs separate %.2e (max |d| %.2e) vs cpu-ref %.2e\n",
                       act ? "gelu" : "silu", n, rel, dm, rref);
                CHECK(rel <= 1e-5 && rref <= 1e-2, "glu n=%d act %d: vs separate %.3e, vs cpu-ref %.3e", n, A, rel,
                      rref);
                free(a); free(b); free(gr); free(ur);
            }
            g->vt->free(g, gd); g->vt->free(g, g2); g->vt->free(g, u2);
        }
        /* y += down(x) */
        {
            void *y1 = to_gpu(res, (size_t)n * H * 4), *y2 = to_gpu(res, (size_t)n * H * 4);
            float *od = nan_buf(g, (size_t)n * H);
            const int ra = g->vt->matmul_add(g, y1, xd, n, &wd.g);
            CHECK(ra == served, "matmul_add n=%d returned %d", n, ra);
            if (ra) {
                g->vt->matmul(g, od, xd, n, &wd.g);
                g->vt->add(g, y2, y2, od, (size_t)n * H);
                float *a = from_gpu(g, y1, (size_t)n * H), *b = from_gpu(g, y2, (size_t)n * H);
                float *yr = malloc((size_t)n * H * 4);
                g_ref->vt->matmul(g_ref, yr, x, n, &wd.r);
                for (size_t i = 0; i < (size_t)n * H; i++) yr[i] += res[i];
                rel = bt_diff(a, b, (size_t)n * H, &dm);
                rref = rel_or_nan(a, yr, (size_t)n * H);
                printf("  err batch add n=%-3d vs separate %.2e (max |d| %.2e) vs cpu-ref %.2e\n", n, rel, dm, rref);
                CHECK(rel <= 1e-5 && rref <= 1e-2, "add n=%d: vs separate %.3e, vs cpu-ref %.3e", n, rel, rref);
                free(a); free(b); free(yr);
            }
            g->vt->free(g, y1); g->vt->free(g, y2); g->vt->free(g, od);
        }
        /* precise weights keep the split GEMMs: refused */
        wd.g.precise = 1;
        {
            void *y1 = nan_buf(g, (size_t)n * H);
            CHECK(g->vt->matmul_add(g, y1, xd, n, &wd.g) == 0, "matmul_add n=%d served a precise weight", n);
            g->vt->free(g, y1);
        }
        wd.g.precise = 0;
        g->vt->free(g, xd); g->vt->free(g, yd); g->vt->free(g, sd);
        free(x); free(res);
    }
    tern__cuda_bf16_split = 1;
    bt_free(&wq); bt_free(&wk); bt_free(&wv); bt_free(&wg); bt_free(&wu); bt_free(&wd);
}

/* sgemm.cu (the skinny GEMM behind those ops for 9..64 rows) at shapes that exercise its edges: row
 * counts that end inside a tile, K long enough to split (S forced to 1 and 3, and the automatic
 * choice), every epilogue (store, y +=, SiLU·up, three matrices). Each result against cpu-ref (bf16
 * bound) and against cuBLASLt (TERN_CUDA_SGEMM=0's path, 1e-5); a split run twice gives the same
 * bits (the cluster's blocks sum the S tiles in split order). */
extern int tern__cuda_sgemm_on, tern__cuda_sgemm_split;

/* op 0: y = W0·x; 1: y = res + W0·x; 2: y = silu(W0·x)·(W1·x); 3: y0|y1|y2 = W0|W1|W2 · x (outputs back to back) */
/* floats of op's output for n rows (op 3: the three outputs back to back) */
static size_t sg_total(int op, const bt_w *w, int nw, int n) {
    size_t tot = 0;
    for (int i = 0; i < (op == 3 ? nw : 1); i++) tot += (size_t)n * w[i].g.shape[0];
    return tot;
}

static float *sg_run(tern_backend *g, int op, const bt_w *w, int nw, const void *xd, const float *res, int n, int on,
                     int split) {
    tern__cuda_sgemm_on = on ? 2 : 0; /* 2: every op (the default takes q|k|v only) */
    tern__cuda_sgemm_split = split;
    const size_t tot = sg_total(op, w, nw, n);
    float *yd = res ? to_gpu(res, tot * 4) : nan_buf(g, tot);
    int r = 1;
    if (op == 0) g->vt->matmul(g, yd, xd, n, &w[0].g);
    else if (op == 1) r = g->vt->matmul_add(g, yd, xd, n, &w[0].g);
    else if (op == 2) r = g->vt->matmul_glu(g, yd, xd, n, &w[0].g, &w[1].g, TERN_ACT_SILU);
    else {
        float *ys[3] = {yd, yd + (size_t)n * w[0].g.shape[0], yd + (size_t)n * (w[0].g.shape[0] + w[1].g.shape[0])};
        const tern_tensor *ws[3] = {&w[0].g, &w[1].g, &w[2].g};
        r = g->vt->matmul_n(g, 3, ys, xd, n, ws);
    }
    float *h = r ? from_gpu(g, yd, tot) : NULL;
    g->vt->free(g, yd);
    tern__cuda_sgemm_on = -1;
    tern__cuda_sgemm_split = 0;
    return h;
}

/* the CPU reference of op (0 y = W·x, 1 y = res + W·x, 2 silu(W0·x)·W1·x, 3 q|k|v) over the 200- and 72-row
 * matrices of the sgemm tests: tot floats, malloc'd */
static float *sg_ref(int op, const bt_w *w, const float *x, const float *res, int n, size_t tot) {
    float *ref = malloc(tot * 4), *tmp = malloc((size_t)n * 200 * 4);
    if (op == 3) {
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
            g_ref->vt->matmul(g_ref, ref + off, x, n, &w[i].r);
            off += (size_t)n * w[i].g.shape[0];
        }
    } else {
        g_ref->vt->matmul(g_ref, ref, x, n, &w[0].r);
        if (op == 1) for (size_t i = 0; i < tot; i++) ref[i] += res[i];
        if (op == 2) {
            g_ref->vt->matmul(g_ref, tmp, x, n, &w[1].r);
            g_ref->vt->silu_mul(g_ref, ref, ref, tmp, tot);
        }
    }
    free(tmp);
    return ref;
}

/* sgemm.cu at 9..64 rows: the four forms (y = W·x, y += W·x, silu(gate)·up, q|k|v over 200 / 200 / 72 rows:
 * partial row blocks) at in 1024 and 2048 (its own split, 1 part, 3 parts twice) */
TEST(cuda_sgemm) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->matmul_n || !g->vt->matmul_glu || !g->vt->matmul_add) {
        SKIP("cuda_sgemm", "no bf16-mode backend or fused ops");
        return;
    }
    tern__cuda_bf16_split = 0;
    static const int INS[] = {1024, 2048}, NS[] = {9, 24, 64};
    for (size_t ii = 0; ii < TERN_ARRAY_LEN(INS); ii++) {
        const int in = INS[ii];
        bt_w w[3];
        int ok = bt_make(&w[0], 200, in) && bt_make(&w[1], 200, in) && bt_make(&w[2], 72, in);
        CHECK(ok, "upload");
        if (!ok) return;
        for (size_t t = 0; t < TERN_ARRAY_LEN(NS); t++) {
            const int n = NS[t];
            float *x = rnd((size_t)n * in, 1.0f), *res = rnd((size_t)n * 200, 1.0f);
            void *xd = to_gpu(x, (size_t)n * in * 4);
            for (int op = 0; op < 4; op++) {
                const int nw = op == 3 ? 3 : op == 2 ? 2 : 1;
                const size_t tot = sg_total(op, w, nw, n);
                float *ref = sg_ref(op, w, x, res, n, tot);
                const float *rs = op == 1 ? res : NULL;
                float *a = sg_run(g, op, w, nw, xd, rs, n, 1, 0), *s1 = sg_run(g, op, w, nw, xd, rs, n, 1, 1),
                      *s3 = sg_run(g, op, w, nw, xd, rs, n, 1, 3), *s3b = sg_run(g, op, w, nw, xd, rs, n, 1, 3),
                      *lt = sg_run(g, op, w, nw, xd, rs, n, 0, 0);
                CHECK(a && s1 && s3 && s3b && lt, "sgemm in %d n %d op %d: refused", in, n, op);
                if (a && s1 && s3 && s3b && lt) {
                    double dm;
                    const double rr = rel_or_nan(a, ref, tot), rl = bt_diff(a, lt, tot, &dm),
                                 rsp = rel_or_nan(s3, s1, tot), same = memcmp(s3, s3b, tot * 4) == 0;
                    printf("  err sgemm in=%d n=%-2d op %d vs cpu-ref %.2e vs cublaslt %.2e split 3 vs 1 %.2e%s\n", in,
                           n, op, rr, rl, rsp, same ? "" : " (split runs differ)");
                    CHECK(rr <= 1e-2 && rl <= 1e-5 && rsp <= 1e-5 && same,
                          "sgemm in %d n %d op %d: cpu-ref %.3e, cublaslt %.3e, split %.3e, repeat same %d", in, n, op,
                          rr, rl, rsp, (int)same);
                }
                free(a); free(s1); free(s3); free(s3b); free(lt); free(ref);
            }
            g->vt->free(g, xd);
            free(x); free(res);
        }
        bt_free(&w[0]); bt_free(&w[1]); bt_free(&w[2]);
    }
    tern__cuda_bf16_split = 1;
}

/* norm_matmul for many rows (gemm.c tern__cuda_gemm_norm: one kernel writes rmsnorm(x)·w and its bf16
 * copy, then the GEMMs of matmul_n / matmul_glu) against rmsnorm + the fused op: xn and y bitwise
 * (the same GEMMs on the same bf16 x), n through sgemm (16, 64) and cuBLASLt (200); x in place declines. */
extern int tern__cuda_norm_gemm_on;
TEST(cuda_norm_gemm) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_matmul) { SKIP("cuda_norm_gemm", "no bf16-mode backend or norm_matmul"); return; }
    const int keep = tern__cuda_norm_gemm_on;
    tern__cuda_norm_gemm_on = 1;
    tern__cuda_bf16_split = 0;
    const int H = 512;
    bt_w w[4];
    int ok = bt_make(&w[0], 256, H) && bt_make(&w[1], 64, H) && bt_make(&w[2], 64, H) && bt_make(&w[3], 384, H);
    CHECK(ok, "upload");
    static const int NS[] = {16, 64, 200};
    for (size_t t = 0; ok && t < TERN_ARRAY_LEN(NS); t++) {
        const int n = NS[t];
        float *x = rnd((size_t)n * H, 2.0f), *nw = rnd(H, 1.0f);
        void *xd = to_gpu(x, (size_t)n * H * 4), *nwd = to_gpu(nw, (size_t)H * 4);
        float *xna = nan_buf(g, (size_t)n * H), *xnb = nan_buf(g, (size_t)n * H);
        const size_t tot = (size_t)n * (256 + 64 + 64);
        float *ya = nan_buf(g, tot), *yb = nan_buf(g, tot);
        for (int op = 0; op < 2; op++) { /* 0 q|k|v, 1 gate|up SiLU (gate = up = w[3]: shapes only) */
            const tern_tensor *ws[3] = {op ? &w[3].g : &w[0].g, op ? &w[3].g : &w[1].g, &w[2].g};
            float *ysa[3] = {ya, ya + (size_t)n * 256, ya + (size_t)n * 320}, *ysb[3] = {yb, yb + (size_t)n * 256, yb + (size_t)n * 320};
            const int k = op ? 2 : 3, act = op ? TERN_ACT_SILU : -1;
            const int r = g->vt->norm_matmul(g, xna, xd, nwd, 1e-6f, n, k, ysa, ws, act, NULL);
            CHECK(r == 1, "n %d op %d: norm_matmul declined", n, op);
            g->vt->rmsnorm(g, xnb, xd, n, H, nwd, 1e-6f);
            if (op) CHECK(g->vt->matmul_glu(g, yb, xnb, n, ws[0], ws[1], TERN_ACT_SILU) == 1, "matmul_glu refused");
            else CHECK(g->vt->matmul_n(g, 3, ysb, xnb, n, ws) == 1, "matmul_n refused");
            const size_t cnt = op ? (size_t)n * 384 : tot;
            float *a = from_gpu(g, ya, cnt), *b = from_gpu(g, yb, cnt);
            float *na = from_gpu(g, xna, (size_t)n * H), *nb = from_gpu(g, xnb, (size_t)n * H);
            CHECK(!memcmp(na, nb, (size_t)n * H * 4), "n %d op %d: xn differs from rmsnorm", n, op);
            CHECK(!memcmp(a, b, cnt * 4), "n %d op %d: y differs from rmsnorm + op", n, op);
            printf("  err norm_gemm n=%d op %d: xn %s, y %s\n", n, op, memcmp(na, nb, (size_t)n * H * 4) ? "DIFF" : "same bits",
                   memcmp(a, b, cnt * 4) ? "DIFF" : "same bits");
            free(a); free(b); free(na); free(nb);
        }
        float *ys1[3] = {ya, ya + (size_t)n * 256, ya + (size_t)n * 320};
        const tern_tensor *wq[3] = {&w[0].g, &w[1].g, &w[2].g};
        CHECK(g->vt->norm_matmul(g, xd, xd, nwd, 1e-6f, n, 3, ys1, wq, -1, NULL) == 0, "in place should decline");
        void *bufs[] = {xd, nwd, xna, xnb, ya, yb};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(x); free(nw);
    }
    for (int i = 0; i < 4; i++) bt_free(&w[i]);
    tern__cuda_bf16_split = 1;
    tern__cuda_norm_gemm_on = keep;
}

/* norm_matmul for many rows of Q4 (gemm.c q4_norm_gemm, TERN_CUDA_Q4_NORM: rmsnorm writes xn and the batch Q4 GEMM's
 * staged bf16 x, norm.cu rmsnorm_q4s; qgemm_q4.cu skips q4w_stage_x) against the separate ops — rmsnorm_add in place
 * (with res), rmsnorm, matmul_n / matmul_glu: x', xn and y bitwise. Q4 g64 with BF16 scales, q|k|v and gate|up
 * (SiLU), with and without the residual prologue, 24 / 64 / 100 rows (32- and 64-row column tiles, split and direct);
 * off (TERN_CUDA_Q4_NORM=0) it declines. */
extern int tern__cuda_q4_norm, tern__cuda_norm_res_n, tern__cuda_qg4w_ok;
extern unsigned long long tern__cuda_qg4w_calls;
TEST(cuda_q4_norm) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_matmul || !g->vt->rmsnorm_add) { SKIP("cuda_q4_norm", "no bf16-mode backend or norm_matmul"); return; }
    if (!tern__cuda_qg4w_ok) { SKIP("cuda_q4_norm", "no sm_90a image for this GPU"); return; }
    const int keep = tern__cuda_q4_norm, keep_ng = tern__cuda_norm_gemm_on, keep_rn = tern__cuda_norm_res_n;
    tern__cuda_norm_gemm_on = 1;
    tern__cuda_norm_res_n = 1;
    tern__cuda_bf16_split = 0;
    const int H = 512, O[5] = {256, 128, 128, 384, 384}; /* q, k, v, gate, up */
    hw hq[5];
    tern_tensor t[5];
    const int ok = q4w_make(g, hq, t, 5, O, H);
    CHECK(ok, "upload");
    static const int NS[] = {24, 64, 100};
    for (size_t ni = 0; ok && ni < TERN_ARRAY_LEN(NS); ni++) {
        const int n = NS[ni];
        const size_t cnt = (size_t)n * H, tot = (size_t)n * 512;
        float *hx = rnd(cnt, 2.0f), *hh = rnd(cnt, 1.5f), *hw_ = rnd(H, 1.0f), *hn = rnd(H, 1.0f), sc = 0.8f;
        void *x = to_gpu(hx, cnt * 4), *h = to_gpu(hh, cnt * 4), *wd = to_gpu(hw_, H * 4), *nwd = to_gpu(hn, H * 4),
             *sd = to_gpu(&sc, 4);
        for (int op = 0; op < 2; op++)
            for (int rs = 0; rs < 2; rs++) {
                const tern_tensor *ws[3] = {op ? &t[3] : &t[0], op ? &t[4] : &t[1], &t[2]};
                const int k = op ? 2 : 3, act = op ? TERN_ACT_SILU : -1;
                float *xo = nan_buf(g, cnt), *xp = to_gpu(hx, cnt * 4), *xna = nan_buf(g, cnt), *xnb = nan_buf(g, cnt);
                float *ya = nan_buf(g, tot), *yb = nan_buf(g, tot);
                float *ysa[3] = {ya, ya + (size_t)n * 256, ya + (size_t)n * 384}, *ysb[3] = {yb, yb + (size_t)n * 256, yb + (size_t)n * 384};
                const tern_norm_res r = {xo, h, wd, sd};
                tern__cuda_q4_norm = 0;
                CHECK(g->vt->norm_matmul(g, xna, x, nwd, 1e-6f, n, k, ysa, ws, act, rs ? &r : NULL) == 0,
                      "n %d op %d res %d: served with TERN_CUDA_Q4_NORM=0", n, op, rs);
                tern__cuda_q4_norm = 1;
                const unsigned long long c0 = tern__cuda_qg4w_calls;
                const int ra = g->vt->norm_matmul(g, xna, x, nwd, 1e-6f, n, k, ysa, ws, act, rs ? &r : NULL);
                CHECK(ra == 1 && tern__cuda_qg4w_calls > c0, "n %d op %d res %d: not served (%d)", n, op, rs, ra);
                tern__cuda_q4_norm = 0;
                if (rs) CHECK(g->vt->rmsnorm_add(g, xp, h, n, H, wd, 1e-6f, sd) == 1, "rmsnorm_add refused");
                g->vt->rmsnorm(g, xnb, xp, n, H, nwd, 1e-6f);
                if (op) CHECK(g->vt->matmul_glu(g, yb, xnb, n, ws[0], ws[1], TERN_ACT_SILU) == 1, "matmul_glu refused");
                else CHECK(g->vt->matmul_n(g, 3, ysb, xnb, n, ws) == 1, "matmul_n refused");
                const size_t yc = op ? (size_t)n * 384 : tot;
                float *a = from_gpu(g, ya, yc), *b = from_gpu(g, yb, yc), *na = from_gpu(g, xna, cnt), *nb = from_gpu(g, xnb, cnt);
                const int ysame = !memcmp(a, b, yc * 4), nsame = !memcmp(na, nb, cnt * 4);
                CHECK(nsame, "n %d op %d res %d: xn differs", n, op, rs);
                CHECK(ysame, "n %d op %d res %d: y differs (rel %.3e)", n, op, rs, test_rel_l2(a, b, yc));
                if (rs) {
                    float *pa = from_gpu(g, xo, cnt), *pb = from_gpu(g, xp, cnt);
                    CHECK(!memcmp(pa, pb, cnt * 4), "n %d op %d: x' differs from rmsnorm_add", n, op);
                    free(pa); free(pb);
                }
                printf("  err q4_norm n=%d op %d res %d: xn %s, y %s\n", n, op, rs, nsame ? "same bits" : "DIFF",
                       ysame ? "same bits" : "DIFF");
                free(a); free(b); free(na); free(nb);
                void *bufs[] = {xo, xp, xna, xnb, ya, yb};
                for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
            }
        void *bufs[] = {x, h, wd, nwd, sd};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(hx); free(hh); free(hw_); free(hn);
    }
    q4w_free(g, hq, t, 5);
    tern__cuda_bf16_split = 1;
    tern__cuda_q4_norm = keep;
    tern__cuda_norm_gemm_on = keep_ng;
    tern__cuda_norm_res_n = keep_rn;
}

/* norm_matmul for many rows with precise weights (gemm.c gemm_norm_split: one kernel writes rmsnorm(x)·w and
 * its bf16 pair, then the split GEMMs on the pair and the plain ones on its high half) against rmsnorm + the
 * separate matmuls: xn and y bitwise. q|k|v with q and k precise, q alone, and bf16x2 (every weight split)
 * at 300 rows (the two-GEMM form) and at 200 and 64 rows (the merged GEMM's range); 8 rows (the GEMVs') declines. */
extern int tern__cuda_split_merged;
TEST(cuda_norm_gemm_split) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_matmul) { SKIP("cuda_norm_gemm_split", "no bf16-mode backend or norm_matmul"); return; }
    const int keep = tern__cuda_norm_gemm_on, keep_m = tern__cuda_split_merged;
    tern__cuda_norm_gemm_on = 1;
    tern__cuda_split_merged = 1;
    const int H = 512, O[3] = {256, 128, 128};
    bt_w w[3];
    int ok = bt_make(&w[0], O[0], H) && bt_make(&w[1], O[1], H) && bt_make(&w[2], O[2], H);
    CHECK(ok, "upload");
    static const struct { int n, k, all, served; } C[] = {{300, 3, 0, 1}, {300, 1, 0, 1}, {300, 3, 1, 1}, {200, 3, 0, 1},
                                                                 {64, 3, 0, 1},  {64, 1, 0, 1},  {64, 3, 1, 1},  {8, 3, 0, 0}};
    for (size_t t = 0; ok && t < TERN_ARRAY_LEN(C); t++) {
        const int n = C[t].n, k = C[t].k;
        tern__cuda_bf16_split = C[t].all;
        w[0].g.precise = w[1].g.precise = !C[t].all;
        w[2].g.precise = 0;
        float *x = rnd((size_t)n * H, 2.0f), *nw = rnd(H, 1.0f);
        void *xd = to_gpu(x, (size_t)n * H * 4), *nwd = to_gpu(nw, (size_t)H * 4);
        float *xna = nan_buf(g, (size_t)n * H), *xnb = nan_buf(g, (size_t)n * H);
        const size_t tot = (size_t)n * (O[0] + O[1] + O[2]);
        float *ya = nan_buf(g, tot), *yb = nan_buf(g, tot);
        float *ysa[3] = {ya, ya + (size_t)n * O[0], ya + (size_t)n * (O[0] + O[1])};
        float *ysb[3] = {yb, yb + (size_t)n * O[0], yb + (size_t)n * (O[0] + O[1])};
        const tern_tensor *ws[3] = {&w[0].g, &w[1].g, &w[2].g};
        const int r = g->vt->norm_matmul(g, xna, xd, nwd, 1e-6f, n, k, ysa, ws, -1, NULL);
        CHECK(r == C[t].served, "n %d k %d all %d: norm_matmul returned %d", n, k, C[t].all, r);
        if (r == 1) {
            g->vt->rmsnorm(g, xnb, xd, n, H, nwd, 1e-6f);
            for (int i = 0; i < k; i++) g->vt->matmul(g, ysb[i], xnb, n, ws[i]);
            size_t cnt = 0;
            for (int i = 0; i < k; i++) cnt += (size_t)n * O[i];
            float *a = from_gpu(g, ya, cnt), *b = from_gpu(g, yb, cnt);
            float *na = from_gpu(g, xna, (size_t)n * H), *nb = from_gpu(g, xnb, (size_t)n * H);
            CHECK(!memcmp(na, nb, (size_t)n * H * 4), "n %d k %d all %d: xn differs from rmsnorm", n, k, C[t].all);
            CHECK(!memcmp(a, b, cnt * 4), "n %d k %d all %d: y differs from the separate matmuls", n, k, C[t].all);
            free(a); free(b); free(na); free(nb);
        }
        void *bufs[] = {xd, nwd, xna, xnb, ya, yb};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(x); free(nw);
    }
    for (int i = 0; i < 3; i++) bt_free(&w[i]);
    tern__cuda_bf16_split = 1;
    tern__cuda_norm_gemm_on = keep;
    tern__cuda_split_merged = keep_m;
}

/* norm_mlp for many rows (gemm.c tern__cuda_gemm_mlp: the gate / up products and their glu in bf16) against
 * rmsnorm + matmul_glu + the down matmul (+ the residual add) on the same backend: xn bitwise, y within the plain
 * bf16 mode's bound (1e-2 rel L2; the separate ops keep the products in f32). Gate uploaded before up (one
 * strided batch) and after it, SiLU and GELU, y = and y +=; 32 rows served, 31 rows and xn == x decline. */
TEST(cuda_norm_mlp) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_mlp) { SKIP("cuda_norm_mlp", "no bf16-mode backend or norm_mlp"); return; }
    tern__cuda_bf16_split = 0;
    const int H = 512, I = 384;
    bt_w wa, wb, wd; /* wa uploaded first */
    int ok = bt_make(&wa, I, H) && bt_make(&wb, I, H) && bt_make(&wd, H, I);
    CHECK(ok, "upload");
    static const struct { int n, order, act, add, served; } C[] = {
        {200, 0, TERN_ACT_SILU, 0, 1}, {300, 1, TERN_ACT_GELU_TANH, 0, 1}, {65, 0, TERN_ACT_GELU_TANH, 1, 1},
        {300, 1, TERN_ACT_SILU, 1, 1}, {32, 0, TERN_ACT_SILU, 1, 1}, {31, 0, TERN_ACT_SILU, 0, 0}};
    for (size_t t = 0; ok && t < TERN_ARRAY_LEN(C); t++) {
        const int n = C[t].n, add = C[t].add;
        const tern_tensor *ws[3] = {C[t].order ? &wb.g : &wa.g, C[t].order ? &wa.g : &wb.g, &wd.g};
        float *x = rnd((size_t)n * H, 2.0f), *nw = rnd(H, 1.0f), *r0 = rnd((size_t)n * H, 1.0f);
        void *xd = to_gpu(x, (size_t)n * H * 4), *nwd = to_gpu(nw, (size_t)H * 4);
        float *ya = to_gpu(r0, (size_t)n * H * 4), *yb = to_gpu(r0, (size_t)n * H * 4);
        float *xna = nan_buf(g, (size_t)n * H), *xnb = nan_buf(g, (size_t)n * H), *hb = nan_buf(g, (size_t)n * I);
        const int r = g->vt->norm_mlp(g, xna, xd, nwd, 1e-6f, n, ya, add, ws, C[t].act, NULL);
        CHECK(r == C[t].served, "n %d order %d add %d: norm_mlp returned %d", n, C[t].order, add, r);
        if (r == 1) {
            g->vt->rmsnorm(g, xnb, xd, n, H, nwd, 1e-6f);
            CHECK(g->vt->matmul_glu(g, hb, xnb, n, ws[0], ws[1], C[t].act) == 1, "matmul_glu refused");
            if (add) CHECK(g->vt->matmul_add(g, yb, hb, n, ws[2]) == 1, "matmul_add refused");
            else g->vt->matmul(g, yb, hb, n, ws[2]);
            float *a = from_gpu(g, ya, (size_t)n * H), *b = from_gpu(g, yb, (size_t)n * H);
            float *na = from_gpu(g, xna, (size_t)n * H), *nb = from_gpu(g, xnb, (size_t)n * H);
            double dm;
            const double rel = bt_diff(a, b, (size_t)n * H, &dm);
            printf("  err norm_mlp n=%d order %d act %d add %d vs separate ops %.2e (max %.2e)\n", n, C[t].order,
                   C[t].act, add, rel, dm);
            CHECK(!memcmp(na, nb, (size_t)n * H * 4), "n %d: xn differs from rmsnorm", n);
            CHECK(rel <= 1e-2, "n %d order %d add %d: rel %.3e vs the separate ops", n, C[t].order, add, rel);
            free(a); free(b); free(na); free(nb);
        }
        if (t == 0) CHECK(g->vt->norm_mlp(g, xd, xd, nwd, 1e-6f, n, ya, 0, ws, C[t].act, NULL) == 0, "in place should decline");
        void *bufs[] = {xd, nwd, xna, xnb, ya, yb, hb};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(x); free(nw); free(r0);
    }
    bt_free(&wa); bt_free(&wb); bt_free(&wd);
    tern__cuda_bf16_split = 1;
}

/* q [nq, H], k and v [nk, H] BF16 weights uploaded and joined (ops.h join_weights: one allocation, q the owner);
 * 1 when all of it worked. Free with qkv_free. */
/* q [nq, H], then cnt - 1 matrices [nk, H] (k, v), uploaded and joined */
static int qkv_make_n(tern_backend *g, hw *h, tern_tensor *t, int nq, int nk, int H, int cnt) {
    tern_error err = {0};
    for (int i = 0; i < cnt; i++) {
        h[i] = make_w(TERN_DT_BF16, 0, 0, 0, 1, i ? nk : nq, H, 0);
        t[i] = h[i].t;
        if (g->vt->upload_weight(g, &t[i], &err) != TERN_OK) return 0;
    }
    tern_tensor *tj[3] = {&t[0], &t[1], cnt > 2 ? &t[2] : NULL};
    return g->vt->join_weights(g, tj, cnt) == 1;
}
static int qkv_make(tern_backend *g, hw *h, tern_tensor *t, int nq, int nk, int H) { return qkv_make_n(g, h, t, nq, nk, H, 3); }
static void qkv_free_n(tern_backend *g, hw *h, tern_tensor *t, int cnt) {
    for (int i = cnt - 1; i >= 0; i--) { g->vt->free_weight(g, &t[i]); free_w(&h[i]); } /* q, the owner, last */
}
static void qkv_free(tern_backend *g, hw *h, tern_tensor *t) { qkv_free_n(g, h, t, 3); }
/* the K and V pages (16-bit, pool elements each) of kv[0] and kv[1] bit for bit */
static void kv_pages_same(tern_backend *g, const tern_kv_layer *kv, size_t pool, int n, int d) {
    uint16_t *pa = malloc(pool * 2), *pb = malloc(pool * 2);
    for (int p = 0; p < 2; p++) {
        g->vt->download(g, pa, p ? kv[0].v : kv[0].k, pool * 2);
        g->vt->download(g, pb, p ? kv[1].v : kv[1].k, pool * 2);
        CHECK(!memcmp(pa, pb, pool * 2), "n %d d %d: the %s pages differ", n, d, p ? "V" : "K");
    }
    free(pa); free(pb);
}

/* one case's rows: n rows of one sequence (slot 0) at positions 3.. wrapping over mb blocks of bs (the tables' hole
 * included), x [n][H] random, all on the GPU too */
typedef struct qkv_rows_in {
    int32_t *pos, *slot;
    float *x;
    void *xd, *pd, *sd;
    tern_rows rows;
} qkv_rows_in;
static void qkv_rows_make(qkv_rows_in *in, int n, int H, int mb, int bs) {
    in->pos = malloc((size_t)n * 4), in->slot = calloc((size_t)n, 4);
    for (int r = 0; r < n; r++) in->pos[r] = 3 + r % (mb * bs - 3);
    in->x = rnd((size_t)n * H, 2.0f);
    in->xd = to_gpu(in->x, (size_t)n * H * 4), in->pd = to_gpu(in->pos, (size_t)n * 4), in->sd = to_gpu(in->slot, (size_t)n * 4);
    in->rows = (tern_rows){n, in->pd, in->sd, in->pos, in->slot};
}
static void qkv_rows_free(tern_backend *g, qkv_rows_in *in) {
    void *b[] = {in->xd, in->pd, in->sd};
    for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
    free(in->pos); free(in->slot); free(in->x);
}

/* for an A/B of two paths: two BF16-paged layers over one block table (pages from khb, mb·bs·nkv·d elements each)
 * and NaN-filled xn [n, H], q [n, nq], k and v [n, nkv·d] for each */
static void qkv_pair_make(tern_backend *g, tern_kv_layer *kv, float **xn, float **q, float **k, float **v, int n, int H,
                          int nkv, int d, int bs, int mb, const uint16_t *khb, void *btd, size_t nq) {
    const size_t nk = (size_t)nkv * d, pool = (size_t)mb * bs * nk;
    for (int i = 0; i < 2; i++) {
        kv[i] = (tern_kv_layer){TERN_DT_Q, nkv, d, bs, 0, to_gpu(khb, pool * 2), to_gpu(khb, pool * 2), btd, mb};
        kv[i].kf.kind = kv[i].vf.kind = TERN_KV_BF16;
        xn[i] = nan_buf(g, (size_t)n * H);
        q[i] = nan_buf(g, (size_t)n * nq);
        k[i] = nan_buf(g, (size_t)n * nk);
        v[i] = nan_buf(g, (size_t)n * nk);
    }
}
static void qkv_pair_free(tern_backend *g, tern_kv_layer *kv, float **xn, float **q, float **k, float **v) {
    for (int i = 0; i < 2; i++) {
        void *b[] = {kv[i].k, kv[i].v, xn[i], q[i], k[i], v[i]};
        for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
    }
}

/* q / k / v of path 0 against path 1 (nq, nk elements): within 1e-4 rel L2 (the same exact products summed in
 * another order), printed under label */
static void qkv_pair_near(tern_backend *g, float **q, float **k, float **v, size_t nq, size_t nk, const char *label) {
    const struct { float *a, *b; size_t len; const char *what; } cmp[] = {
        {q[0], q[1], nq, "q"}, {k[0], k[1], nk, "k"}, {v[0], v[1], nk, "v"}};
    for (size_t i = 0; i < TERN_ARRAY_LEN(cmp); i++) {
        float *a = from_gpu(g, cmp[i].a, cmp[i].len), *b = from_gpu(g, cmp[i].b, cmp[i].len);
        double dm;
        const double rel = bt_diff(a, b, cmp[i].len, &dm);
        printf("  err %s %s vs the separate ops %.2e (max %.2e)\n", label, cmp[i].what, rel, dm);
        CHECK(rel <= 1e-4, "%s %s: rel %.3e", label, cmp[i].what, rel);
        free(a); free(b);
    }
}

/* the BF16 K then V pages (pool elements each) of kv[0] against kv[1]: within 1e-3 rel L2, printed under label */
static void kv_pages_near(tern_backend *g, const tern_kv_layer *kv, size_t pool, const char *label) {
    uint16_t *pa = malloc(pool * 2), *pb = malloc(pool * 2);
    float *fa = malloc(pool * 4), *fb = malloc(pool * 4);
    for (int p = 0; p < 2; p++) {
        g->vt->download(g, pa, p ? kv[0].v : kv[0].k, pool * 2);
        g->vt->download(g, pb, p ? kv[1].v : kv[1].k, pool * 2);
        for (size_t i = 0; i < pool; i++) { fa[i] = tern_bf16_to_f32(pa[i]); fb[i] = tern_bf16_to_f32(pb[i]); }
        double dm;
        const double rel = bt_diff(fa, fb, pool, &dm);
        printf("  err %s %s pages %.2e (max %.2e)\n", label, p ? "v" : "k", rel, dm);
        CHECK(rel <= 1e-3, "%s %s pages: rel %.3e", label, p ? "v" : "k", rel);
    }
    free(pa); free(pb); free(fa); free(fb);
}

/* Gemma 4's attention input for many rows (ops.h norm_qkv_norm_rope_kv, gemm.c tern__cuda_gemm_qkv_nrk): joined
 * q|k|v with q and k precise (the split GEMM over [xh | xl], v on xh), the head norms + rope + cache stores from the
 * GEMM's rows, against norm_matmul + norm_rope_kv_write on the same backend: xn (and with res x') bitwise, q / k / v
 * within 1e-4 (the same exact bf16 products summed in another order), the BF16 K / V pages within 1e-3; d 256 and
 * 512, rows of one sequence over a block table with a hole, 16 / 64 / 100 rows, with and without the residual
 * prologue (x left as is); 8 and 129 rows and TERN_CUDA_G4_QKV=0 refused. */
static void qkv_nrk_case(tern_backend *g, int keqv) {
    const int nw3 = keqv ? 2 : 3; /* matrices: q|k|v, or q|k with V = K */
    extern int tern__cuda_qkv_one_on, tern__cuda_g4_qkv, tern__cuda_norm_res_n;
    const int keep = tern__cuda_qkv_one_on, keep_ng = tern__cuda_norm_gemm_on, keep_g4 = tern__cuda_g4_qkv,
              keep_res = tern__cuda_norm_res_n, keep_m = tern__cuda_split_merged;
    tern__cuda_bf16_split = 0;
    tern__cuda_qkv_one_on = 1; /* join_weights */
    tern__cuda_norm_gemm_on = 1;
    tern__cuda_g4_qkv = keqv ? 2 : 1;
    tern__cuda_norm_res_n = 1;
    tern__cuda_split_merged = 1; /* the reference's norm_matmul over precise q / k at these rows */
    const int H = 512, nh = 4, nkv = 2, bs = 16, mb = 8;
    for (int di = 0; di < 2; di++) {
        const int d = di ? 512 : 256;
        const size_t nq = (size_t)nh * d, nk = (size_t)nkv * d, pool = (size_t)mb * bs * nkv * d;
        hw h[3];
        tern_tensor t[3];
        CHECK(qkv_make_n(g, h, t, (int)nq, (int)nk, H, nw3), "upload / join_weights");
        t[0].precise = t[1].precise = 1;
        const tern_tensor *ws[3] = {&t[0], &t[1], keqv ? NULL : &t[2]};
        float *kh = rnd(pool, 1.0f), *inv = rnd(d / 2, 0.5f), *nw = rnd(H, 1.5f), *qw = rnd(d, 1.0f), *kw = rnd(d, 1.0f);
        float *rw = rnd(H, 1.0f), sc = 0.75f;
        uint16_t *khb = malloc(pool * 2);
        for (size_t i = 0; i < pool; i++) khb[i] = tern_f32_to_bf16(kh[i]);
        int32_t bt[8];
        for (int i = 0; i < mb; i++) bt[i] = (i * 3) % mb;
        bt[1] = -1; /* not resident: those rows write no cache */
        void *btd = to_gpu(bt, sizeof bt), *invd = to_gpu(inv, (size_t)d / 2 * 4), *nwd = to_gpu(nw, (size_t)H * 4),
             *qwd = to_gpu(qw, (size_t)d * 4), *kwd = to_gpu(kw, (size_t)d * 4), *rwd = to_gpu(rw, (size_t)H * 4),
             *scd = to_gpu(&sc, 4);
        static const int ns[] = {16, 64, 100, 8, 129};
        for (size_t ni = 0; ni < TERN_ARRAY_LEN(ns) * 2; ni++) {
            const int n = ns[ni / 2], with_res = ni % 2, served = n > 8 && n <= 128;
            int32_t *pos = malloc((size_t)n * 4), *slot = calloc((size_t)n, 4);
            for (int r = 0; r < n; r++) pos[r] = 3 + r % (mb * bs - 3);
            float *x = rnd((size_t)n * H, 2.0f), *hh = rnd((size_t)n * H, 1.5f);
            void *xd = to_gpu(x, (size_t)n * H * 4), *hd = to_gpu(hh, (size_t)n * H * 4), *pd = to_gpu(pos, (size_t)n * 4),
                 *sd = to_gpu(slot, (size_t)n * 4);
            float *xp = to_gpu(x, (size_t)n * H * 4), *xo = nan_buf(g, (size_t)n * H);
            if (with_res) CHECK(g->vt->rmsnorm_add(g, xp, hd, n, H, rwd, 1e-6f, scd) == 1, "rmsnorm_add refused");
            const tern_norm_res res = {xo, hd, rwd, scd};
            tern_rows rows = {n, pd, sd, pos, slot};
            tern_kv_layer kv[2];
            float *xn[2], *q[2], *k[2], *v[2];
            qkv_pair_make(g, kv, xn, q, k, v, n, H, nkv, d, bs, mb, khb, btd, nq);
            float *ya[3] = {q[0], k[0], v[0]}, *yb[3] = {q[1], k[1], v[1]};
            const int r = g->vt->norm_qkv_norm_rope_kv(g, xn[0], xd, nwd, 1e-6f, ya, ws, &kv[0], &rows, nh, invd, 1.25f, qwd,
                                                       kwd, with_res ? &res : NULL);
            CHECK(r == served, "keqv %d d %d n %d res %d: returned %d", keqv, d, n, with_res, r);
            if (r == 1) {
                CHECK(g->vt->norm_matmul(g, xn[1], xp, nwd, 1e-6f, n, nw3, yb, ws, -1, NULL) == 1, "norm_matmul refused");
                if (keqv) g->vt->scale(g, v[1], k[1], 1.0f, (size_t)n * nk); /* gemma4.c: V = the raw K */
                CHECK(g->vt->norm_rope_kv_write(g, &kv[1], &rows, q[1], k[1], v[1], nh, invd, 1.25f, qwd, kwd, 1e-6f) == 1,
                      "norm_rope_kv_write refused");
                char label[96];
                snprintf(label, sizeof label, "qkv_nrk%s d=%d n=%d res=%d", keqv ? " (v = k)" : "", d, n, with_res);
                qkv_pair_near(g, q, k, v, (size_t)n * nq, (size_t)n * nk, label);
                const size_t cnt = (size_t)n * H;
                float *na = from_gpu(g, xn[0], cnt), *nb = from_gpu(g, xn[1], cnt), *x_h = from_gpu(g, xd, cnt);
                CHECK(!memcmp(na, nb, cnt * 4), "d %d n %d res %d: xn differs", d, n, with_res);
                CHECK(!memcmp(x_h, x, cnt * 4), "d %d n %d res %d: x was written", d, n, with_res);
                if (with_res) {
                    float *oa = from_gpu(g, xo, cnt), *ob = from_gpu(g, xp, cnt);
                    CHECK(!memcmp(oa, ob, cnt * 4), "d %d n %d: x' differs from rmsnorm_add", d, n);
                    free(oa); free(ob);
                }
                free(na); free(nb); free(x_h);
                kv_pages_near(g, kv, pool, label);
                if (ni == 2) { /* off: refused */
                    tern__cuda_g4_qkv = 0;
                    CHECK(g->vt->norm_qkv_norm_rope_kv(g, xn[0], xd, nwd, 1e-6f, ya, ws, &kv[0], &rows, nh, invd, 1.25f,
                                                       qwd, kwd, NULL) == 0, "off: should refuse");
                    tern__cuda_g4_qkv = keqv ? 2 : 1;
                }
            }
            qkv_pair_free(g, kv, xn, q, k, v);
            void *b[] = {xd, hd, pd, sd, xp, xo};
            for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
            free(pos); free(slot); free(x); free(hh);
        }
        void *b[] = {btd, invd, nwd, qwd, kwd, rwd, scd};
        for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
        qkv_free_n(g, h, t, nw3);
        free(kh); free(khb); free(inv); free(nw); free(qw); free(kw); free(rw);
    }
    tern__cuda_bf16_split = 1;
    tern__cuda_qkv_one_on = keep;
    tern__cuda_norm_gemm_on = keep_ng;
    tern__cuda_g4_qkv = keep_g4;
    tern__cuda_norm_res_n = keep_res;
    tern__cuda_split_merged = keep_m;
}

/* both forms: q|k|v, then attention_k_eq_v (Gemma 4's full layers: q|k joined, w[2] NULL, V = the raw K projection;
 * the reference copies k to v before norm_rope_kv_write as gemma4.c does) */
TEST(cuda_qkv_nrk) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_qkv_norm_rope_kv || !g->vt->join_weights || !g->vt->norm_rope_kv_write) {
        SKIP("cuda_qkv_nrk", "no bf16-mode backend");
        return;
    }
    qkv_nrk_case(g, 0);
    qkv_nrk_case(g, 1);
}

/* q|k|v as one matrix for many rows (TERN_CUDA_QKV_ONE, forced here): join_weights puts k and v right after q, then
 * norm_qkv_rope_kv (one GEMM + rope_kv_rows) against norm_matmul + rope_kv_write on the same backend: xn bitwise,
 * q / k / v within 1e-4 (the same exact bf16 products summed in another order), the BF16 K / V pages within 1e-3;
 * rows of one sequence over a block table with a hole (nothing written there), 16 / 64 / 100 rows; off: refused */
TEST(cuda_qkv_one) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_qkv_rope_kv || !g->vt->join_weights) { SKIP("cuda_qkv_one", "no bf16-mode backend"); return; }
    extern int tern__cuda_qkv_one_on, tern__cuda_qkv_one_min;
    const int keep = tern__cuda_qkv_one_on, keep_ng = tern__cuda_norm_gemm_on, keep_min = tern__cuda_qkv_one_min;
    tern__cuda_qkv_one_min = 2;
    tern__cuda_bf16_split = 0;
    tern__cuda_qkv_one_on = 1;
    tern__cuda_norm_gemm_on = 1; /* the reference's norm_matmul from 2 rows (default: from 32) */
    const int H = 512, nh = 8, nkv = 2, d = 64, bs = 16, mb = 8;
    const size_t nq = (size_t)nh * d, nk = (size_t)nkv * d, pool = (size_t)mb * bs * nkv * d;
    hw h[3];
    tern_tensor t[3];
    CHECK(qkv_make(g, h, t, (int)nq, (int)nk, H), "upload / join_weights");
    CHECK((const uint8_t *)t[1].data == (const uint8_t *)t[0].data + nq * H * 2 &&
              (const uint8_t *)t[2].data == (const uint8_t *)t[1].data + nk * H * 2 && t[1].joined && t[2].joined && !t[0].joined,
          "joined layout");
    const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
    static const int ns[] = {16, 64, 100};
    float *kh = rnd(pool, 1.0f), *inv = rnd(d / 2, 0.5f), *nw = rnd(H, 1.5f);
    uint16_t *khb = malloc(pool * 2); /* the pages' first contents: valid bf16 (no NaN patterns to compare) */
    for (size_t i = 0; i < pool; i++) khb[i] = tern_f32_to_bf16(kh[i]);
    int32_t bt[8];
    for (int i = 0; i < mb; i++) bt[i] = (i * 3) % mb;
    bt[1] = -1; /* not resident: those rows write no cache */
    void *btd = to_gpu(bt, sizeof bt), *invd = to_gpu(inv, (size_t)d / 2 * 4), *nwd = to_gpu(nw, (size_t)H * 4);
    for (size_t ni = 0; ni < TERN_ARRAY_LEN(ns); ni++) {
        const int n = ns[ni];
        qkv_rows_in in;
        qkv_rows_make(&in, n, H, mb, bs);
        void *xd = in.xd;
        tern_rows rows = in.rows;
        tern_kv_layer kv[2];
        float *xn[2], *q[2], *k[2], *v[2];
        qkv_pair_make(g, kv, xn, q, k, v, n, H, nkv, d, bs, mb, khb, btd, nq);
        CHECK(g->vt->norm_qkv_rope_kv(g, xn[0], xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kv[0], &rows, nh, invd, 1.25f) == 1,
              "n %d: norm_qkv_rope_kv refused", n);
        float *ys[3] = {q[1], k[1], v[1]};
        CHECK(g->vt->norm_matmul(g, xn[1], xd, nwd, 1e-6f, n, 3, ys, ws, -1, NULL) == 1, "n %d: norm_matmul refused", n);
        CHECK(g->vt->rope_kv_write(g, &kv[1], &rows, q[1], k[1], v[1], nh, invd, 1.25f) == 1, "rope_kv_write refused");
        char label[64];
        snprintf(label, sizeof label, "qkv_one n=%d", n);
        qkv_pair_near(g, q, k, v, (size_t)n * nq, (size_t)n * nk, label);
        float *na = from_gpu(g, xn[0], (size_t)n * H), *nb = from_gpu(g, xn[1], (size_t)n * H);
        CHECK(!memcmp(na, nb, (size_t)n * H * 4), "n %d: xn differs", n);
        free(na); free(nb);
        kv_pages_near(g, kv, pool, label);
        if (ni == 0) { /* off: refused, the caller runs the separate ops */
            tern__cuda_qkv_one_on = 0;
            CHECK(g->vt->norm_qkv_rope_kv(g, xn[0], xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kv[0], &rows, nh, invd, 1.25f) == 0,
                  "off: should refuse");
            tern__cuda_qkv_one_on = 1;
        }
        qkv_pair_free(g, kv, xn, q, k, v);
        qkv_rows_free(g, &in);
    }
    void *b[] = {btd, invd, nwd};
    for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
    qkv_free(g, h, t);
    free(kh); free(khb); free(inv); free(nw);
    tern__cuda_qkv_one_on = keep;
    tern__cuda_norm_gemm_on = keep_ng;
    tern__cuda_qkv_one_min = keep_min;
    tern__cuda_bf16_split = 1;
}

/* 1 when the n floats at device pointers a and b have the same bits */
static int gpu_same(tern_backend *g, const float *a, const float *b, size_t n) {
    float *ha = from_gpu(g, a, n), *hb = from_gpu(g, b, n);
    const int same = same_bits(ha, hb, n);
    free(ha); free(hb);
    return same;
}

/* norm_qkv_rope_kv for many rows of Q4 (gemm.c tern__cuda_q4_qkv_rope, TERN_CUDA_Q4_QKV: the pre-norm writes the
 * batch Q4 GEMM's staged x, the GEMM leaves its K slices, fused.cu rope_kv_parts sums them into the rope and cache
 * stores) against rmsnorm + matmul_n + rope_kv_write on the same backend: xn, q, k, v and the BF16 K / V pages
 * bitwise. Q4 g64 (BF16 scales), rows of one sequence over a block table with a hole; hidden 2048 (the GEMM splits K:
 * the parts path) and 512 (no split: y written, then rope_kv_write), 24 / 64 / 100 rows; off: refused */
TEST(cuda_q4_qkv_rope) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_qkv_rope_kv || !g->vt->rope_kv_write) { SKIP("cuda_q4_qkv_rope", "no bf16-mode backend"); return; }
    if (!tern__cuda_qg4w_ok) { SKIP("cuda_q4_qkv_rope", "no sm_90a image for this GPU"); return; }
    extern int tern__cuda_q4_qkv;
    const int keep = tern__cuda_q4_qkv;
    tern__cuda_bf16_split = 0;
    const int nh = 8, nkv = 2, d = 64, bs = 16, mb = 8;
    const size_t nq = (size_t)nh * d, nk = (size_t)nkv * d, pool = (size_t)mb * bs * nkv * d;
    float *kh = rnd(pool, 1.0f), *inv = rnd(d / 2, 0.5f);
    uint16_t *khb = malloc(pool * 2); /* the pages' first contents: valid bf16 */
    for (size_t i = 0; i < pool; i++) khb[i] = tern_f32_to_bf16(kh[i]);
    int32_t bt[8];
    for (int i = 0; i < mb; i++) bt[i] = (i * 3) % mb;
    bt[1] = -1; /* not resident: those rows write no cache */
    void *btd = to_gpu(bt, sizeof bt), *invd = to_gpu(inv, (size_t)d / 2 * 4);
    for (int hi = 0; hi < 2; hi++) {
        const int H = hi ? 512 : 2048;
        hw h[3];
        tern_tensor t[3];
        tern_error err = {0};
        int ok = 1;
        for (int i = 0; i < 3; i++) {
            h[i] = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, i ? (int)nk : (int)nq, H, 0);
            t[i] = h[i].t;
            ok = ok && !g->vt->upload_weight(g, &t[i], &err);
        }
        CHECK(ok, "upload");
        const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
        float *nw = rnd(H, 1.5f);
        void *nwd = to_gpu(nw, (size_t)H * 4);
        static const int ns[] = {24, 64, 100};
        for (size_t ni = 0; ok && ni < TERN_ARRAY_LEN(ns); ni++) {
            const int n = ns[ni];
            qkv_rows_in in;
            qkv_rows_make(&in, n, H, mb, bs);
            float *xn[2], *q[2], *k[2], *v[2];
            tern_kv_layer kv[2];
            qkv_pair_make(g, kv, xn, q, k, v, n, H, nkv, d, bs, mb, khb, btd, nq);
            tern__cuda_q4_qkv = 0;
            CHECK(g->vt->norm_qkv_rope_kv(g, xn[0], in.xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kv[0], &in.rows, nh, invd, 1.25f) == 0,
                  "H %d n %d: served with TERN_CUDA_Q4_QKV=0", H, n);
            tern__cuda_q4_qkv = 1;
            const unsigned long long c0 = tern__cuda_qg4w_calls;
            CHECK(g->vt->norm_qkv_rope_kv(g, xn[0], in.xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kv[0], &in.rows, nh, invd, 1.25f) == 1 &&
                      tern__cuda_qg4w_calls > c0,
                  "H %d n %d: not served", H, n);
            tern__cuda_q4_qkv = 0;
            float *ys[3] = {q[1], k[1], v[1]};
            g->vt->rmsnorm(g, xn[1], in.xd, n, H, nwd, 1e-6f);
            CHECK(g->vt->matmul_n(g, 3, ys, xn[1], n, ws) == 1, "matmul_n refused");
            CHECK(g->vt->rope_kv_write(g, &kv[1], &in.rows, q[1], k[1], v[1], nh, invd, 1.25f) == 1, "rope_kv_write refused");
            const int sn = gpu_same(g, xn[0], xn[1], (size_t)n * H), sq = gpu_same(g, q[0], q[1], (size_t)n * nq),
                      sk = gpu_same(g, k[0], k[1], (size_t)n * nk), sv = gpu_same(g, v[0], v[1], (size_t)n * nk);
            printf("  err q4_qkv_rope H %d n=%d: xn %s, q %s, k %s, v %s\n", H, n, sn ? "same" : "DIFF", sq ? "same" : "DIFF",
                   sk ? "same" : "DIFF", sv ? "same" : "DIFF");
            CHECK(sn && sq && sk && sv, "H %d n %d: not bitwise the separate ops", H, n);
            kv_pages_same(g, kv, pool, n, d);
            qkv_pair_free(g, kv, xn, q, k, v);
            qkv_rows_free(g, &in);
        }
        g->vt->free(g, nwd);
        free(nw);
        for (int i = 0; i < 3; i++) {
            g->vt->free_weight(g, &t[i]);
            free_w(&h[i]);
        }
    }
    void *b[] = {btd, invd};
    for (size_t j = 0; j < TERN_ARRAY_LEN(b); j++) g->vt->free(g, b[j]);
    free(kh); free(khb); free(inv);
    tern__cuda_q4_qkv = keep;
    tern__cuda_bf16_split = 1;
}

/* ops.h norm_qkv_attention_o (cuda_backend.c: the joined q|k|v GEMM, then the batch decode attention roping q and k and
 * writing the cache itself, attn_decode_tc.cu's ROPE instances) against norm_qkv_rope_kv + attention_o on the same
 * backend: y, xn and the K / V pages bitwise. Rows of distinct sequences over a block-table permutation: BF16 pages at
 * D 128 with 64 rows (128 pairs: the 4-warp shape) and 160 rows (320 pairs: the 2-warp shape), F16 pages at D 64 with 48
 * rows; 16 rows (32 pairs: not the tensor-core kernel's), rows sharing a sequence, and a hidden size under nh·d (the
 * attention's bf16 output would overlap the GEMM's rows) take rope_kv_rows + the plain attention inside the op (the rope
 * counter does not move), again bitwise. */
TEST(cuda_qkv_attention_o) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_qkv_attention_o || !g->vt->join_weights) {
        SKIP("cuda_qkv_attention_o", "no bf16-mode backend");
        return;
    }
    extern int tern__cuda_qkv_one_on, tern__cuda_qkv_one_min, tern__cuda_qkv_att;
    extern unsigned long long tern__cuda_attn_decode_rope_calls;
    const int keep = tern__cuda_qkv_one_on, keep_min = tern__cuda_qkv_one_min, keep_att = tern__cuda_qkv_att;
    tern__cuda_qkv_att = 1; /* TERN_CUDA_QKV_ATT may have turned it off */
    tern__cuda_qkv_one_on = 1;
    tern__cuda_qkv_one_min = 2;
    tern__cuda_bf16_split = 0;
    static const struct { int n, d, nh, H, kind, shared, fused; } C[] = {
        {64, 128, 8, 1024, TERN_KV_BF16, 0, 1}, {160, 128, 8, 1024, TERN_KV_BF16, 0, 1}, {48, 64, 16, 1024, TERN_KV_F16, 0, 1},
        {16, 128, 8, 1024, TERN_KV_BF16, 0, 0}, {64, 128, 8, 1024, TERN_KV_BF16, 1, 0}, {64, 128, 8, 512, TERN_KV_BF16, 0, 0}};
    const int nkv = 2, bs = 16, mb = 4, S = 160;
    for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++) {
        const int n = C[ci].n, d = C[ci].d, nh = C[ci].nh, H = C[ci].H;
        const size_t nq = (size_t)nh * d, nk = (size_t)nkv * d, pool = (size_t)S * mb * bs * nk;
        hw h[3], hwo = make_w(TERN_DT_BF16, 0, 0, 0, 1, H, (int)nq, 0);
        tern_tensor t[3], wo = hwo.t;
        tern_error err = {0};
        CHECK(g->vt->upload_weight(g, &wo, &err) == TERN_OK, "upload wo %s", err.msg);
        CHECK(qkv_make(g, h, t, (int)nq, (int)nk, H), "upload / join_weights");
        const tern_tensor *ws[3] = {&t[0], &t[1], &t[2]};
        float *kh = rnd(pool, 1.0f), *inv = rnd(d / 2, 0.5f), *nw = rnd(H, 1.5f), *x = rnd((size_t)n * H, 2.0f);
        float *y0 = rnd((size_t)n * H, 1.0f);
        uint16_t *kb = malloc(pool * 2);
        for (size_t i = 0; i < pool; i++) kb[i] = C[ci].kind == TERN_KV_F16 ? tern_f32_to_f16(kh[i]) : tern_f32_to_bf16(kh[i]);
        int32_t *bt = malloc((size_t)S * mb * 4), *pos = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4);
        for (int i = 0; i < S * mb; i++) bt[i] = (i * 7) % (S * mb);
        bt[5] = bt[7] = -1; /* slot 1's blocks 1 and 3 not resident (rows at 20 / 21 and 54): those write no cache */
        for (int r = 0; r < n; r++) {
            slot[r] = C[ci].shared ? r / 2 : r;
            pos[r] = C[ci].shared ? 20 + r % 2 : 17 + (r * 37) % (mb * bs - 17);
        }
        void *btd = to_gpu(bt, (size_t)S * mb * 4), *invd = to_gpu(inv, (size_t)d / 2 * 4), *nwd = to_gpu(nw, (size_t)H * 4);
        void *xd = to_gpu(x, (size_t)n * H * 4), *pd = to_gpu(pos, (size_t)n * 4), *sd = to_gpu(slot, (size_t)n * 4);
        tern_rows rows = {n, pd, sd, pos, slot};
        tern_kv_layer kv[2];
        float *xn[2], *q[2], *k[2], *v[2], *att[2], *y[2];
        for (int i = 0; i < 2; i++) {
            kv[i] = (tern_kv_layer){TERN_DT_Q, nkv, d, bs, 0, to_gpu(kb, pool * 2), to_gpu(kb, pool * 2), btd, mb};
            kv[i].kf.kind = kv[i].vf.kind = C[ci].kind;
            xn[i] = nan_buf(g, (size_t)n * H);
            q[i] = nan_buf(g, (size_t)n * nq);
            k[i] = nan_buf(g, (size_t)n * nk);
            v[i] = nan_buf(g, (size_t)n * nk);
            att[i] = nan_buf(g, (size_t)n * nq);
            y[i] = to_gpu(y0, (size_t)n * H * 4);
        }
        const float scale = 1.0f / sqrtf((float)d);
        const unsigned long long before = tern__cuda_attn_decode_rope_calls;
        CHECK(g->vt->norm_qkv_attention_o(g, xn[0], xd, nwd, 1e-6f, q[0], k[0], v[0], ws, &kv[0], &rows, nh, invd, 1.25f,
                                          y[0], att[0], scale, 0.0f, &wo) == 1,
              "n %d d %d: norm_qkv_attention_o refused", n, d);
        const unsigned long long took = tern__cuda_attn_decode_rope_calls - before;
        CHECK(took == (unsigned long long)C[ci].fused, "n %d d %d shared %d: the rope-folded attention ran %llu times", n, d,
              C[ci].shared, took);
        CHECK(g->vt->norm_qkv_rope_kv(g, xn[1], xd, nwd, 1e-6f, q[1], k[1], v[1], ws, &kv[1], &rows, nh, invd, 1.25f) == 1,
              "n %d: norm_qkv_rope_kv refused", n);
        CHECK(g->vt->attention_o(g, y[1], att[1], q[1], &rows, nh, &kv[1], scale, 0.0f, &wo, 1) == 1,
              "n %d: attention_o refused", n);
        float *a = from_gpu(g, y[0], (size_t)n * H), *b = from_gpu(g, y[1], (size_t)n * H);
        float *na = from_gpu(g, xn[0], (size_t)n * H), *nb = from_gpu(g, xn[1], (size_t)n * H);
        double dm;
        const double rel = bt_diff(a, b, (size_t)n * H, &dm);
        printf("  err qkv_attention_o n=%d d=%d kind %d shared %d vs norm_qkv_rope_kv + attention_o %.2e (max %.2e)\n", n,
               d, C[ci].kind, C[ci].shared, rel, dm);
        CHECK(!memcmp(a, b, (size_t)n * H * 4), "n %d d %d: y differs (rel %.2e)", n, d, rel);
        CHECK(!memcmp(na, nb, (size_t)n * H * 4), "n %d d %d: xn differs", n, d);
        free(a); free(b); free(na); free(nb);
        kv_pages_same(g, kv, pool, n, d);
        for (int i = 0; i < 2; i++) {
            void *fb[] = {kv[i].k, kv[i].v, xn[i], q[i], k[i], v[i], att[i], y[i]};
            for (size_t j = 0; j < TERN_ARRAY_LEN(fb); j++) g->vt->free(g, fb[j]);
        }
        void *fb[] = {btd, invd, nwd, xd, pd, sd};
        for (size_t j = 0; j < TERN_ARRAY_LEN(fb); j++) g->vt->free(g, fb[j]);
        qkv_free(g, h, t);
        g->vt->free_weight(g, &wo);
        free_w(&hwo);
        free(kh); free(inv); free(nw); free(x); free(y0); free(kb); free(bt); free(pos); free(slot);
    }
    tern__cuda_qkv_one_on = keep;
    tern__cuda_qkv_one_min = keep_min;
    tern__cuda_qkv_att = keep_att;
    tern__cuda_bf16_split = 1;
}

/* The rope-folded attention kernel itself (attn_decode.cu tern__cuda_attn_decode_rope, f32 output: no attention_o
 * handoff, so no bf16 rounding hides a difference) against fused.cu's rope_kv_rows + the plain decode attention over
 * the same unroped rows: the attention's f32 output and the K / V pages bit for bit. BF16 pages at D 128 (64 rows: the
 * 4-warp shape; 160: the 2-warp shape), F16 at D 64, a rope scale of 1.25 and a zero frequency (f = 0: no rotation). */
struct tern__cuda;
int tern__cuda_attn_decode_rope(struct tern__cuda *c, float *out, const tern_rows *rows, int nh, const tern_kv_layer *kv,
                                float scale, float softcap, const float *src, int ld, const float *inv_freq, float mscale);
int tern__cuda_rope_kv_rows(struct tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *src, int ld,
                            float *q, float *k, float *v, int nh, const float *inv_freq, float mscale);
int tern__cuda_attn_decode_q(struct tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                             const tern_kv_layer *kv, float scale, float softcap);
TEST(cuda_attention_decode_rope_bits) {
    tern_backend *g = g_gpu16;
    if (!g) { SKIP("cuda_attention_decode_rope_bits", "no bf16-mode backend"); return; }
    struct tern__cuda *c = (struct tern__cuda *)g->impl;
    static const struct { int n, d, nh, kind; } C[] = {
        {64, 128, 8, TERN_KV_BF16}, {160, 128, 8, TERN_KV_BF16}, {48, 64, 16, TERN_KV_F16}};
    const int nkv = 2, bs = 16, mb = 4, S = 160;
    for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++) {
        const int n = C[ci].n, d = C[ci].d, nh = C[ci].nh, M = (nh + 2 * nkv) * d;
        const size_t nq = (size_t)nh * d, nk = (size_t)nkv * d, pool = (size_t)S * mb * bs * nk;
        float *src = rnd((size_t)n * M, 2.0f), *inv = rnd(d / 2, 0.5f), *kh = rnd(pool, 1.0f);
        inv[3] = 0.0f;
        uint16_t *kb = malloc(pool * 2);
        for (size_t i = 0; i < pool; i++) kb[i] = C[ci].kind == TERN_KV_F16 ? tern_f32_to_f16(kh[i]) : tern_f32_to_bf16(kh[i]);
        int32_t *bt = malloc((size_t)S * mb * 4), *pos = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4);
        for (int i = 0; i < S * mb; i++) bt[i] = (i * 7) % (S * mb);
        for (int r = 0; r < n; r++) { slot[r] = r; pos[r] = 17 + (r * 37) % (mb * bs - 17); }
        void *srcd = to_gpu(src, (size_t)n * M * 4), *invd = to_gpu(inv, (size_t)d / 2 * 4), *btd = to_gpu(bt, (size_t)S * mb * 4);
        void *pd = to_gpu(pos, (size_t)n * 4), *sd = to_gpu(slot, (size_t)n * 4);
        tern_rows rows = {n, pd, sd, pos, slot};
        tern_kv_layer kv[2];
        float *out[2], *q = nan_buf(g, (size_t)n * nq), *k = nan_buf(g, (size_t)n * nk), *v = nan_buf(g, (size_t)n * nk);
        for (int i = 0; i < 2; i++) {
            kv[i] = (tern_kv_layer){TERN_DT_Q, nkv, d, bs, 0, to_gpu(kb, pool * 2), to_gpu(kb, pool * 2), btd, mb};
            kv[i].kf.kind = kv[i].vf.kind = C[ci].kind;
            out[i] = nan_buf(g, (size_t)n * nq);
        }
        const float scale = 1.0f / sqrtf((float)d);
        CHECK(tern__cuda_rope_kv_rows(c, &kv[0], &rows, srcd, M, q, k, v, nh, invd, 1.25f) == 1, "rope_kv_rows refused");
        CHECK(tern__cuda_attn_decode_q(c, out[0], q, &rows, nh, &kv[0], scale, 0.0f) == 1, "n %d: the plain attention refused", n);
        CHECK(tern__cuda_attn_decode_rope(c, out[1], &rows, nh, &kv[1], scale, 0.0f, srcd, M, invd, 1.25f) == 1,
              "n %d d %d: the rope-folded attention refused", n, d);
        float *a = from_gpu(g, out[0], (size_t)n * nq), *b = from_gpu(g, out[1], (size_t)n * nq);
        double dm;
        const double rel = bt_diff(a, b, (size_t)n * nq, &dm);
        printf("  err attention decode rope n=%d d=%d kind %d vs rope_kv_rows + attention %.2e (max %.2e)\n", n, d,
               C[ci].kind, rel, dm);
        CHECK(!memcmp(a, b, (size_t)n * nq * 4), "n %d d %d: the attention differs (rel %.2e)", n, d, rel);
        free(a); free(b);
        kv_pages_same(g, kv, pool, n, d);
        void *fb[] = {kv[0].k, kv[0].v, kv[1].k, kv[1].v, out[0], out[1], q, k, v, srcd, invd, btd, pd, sd};
        for (size_t j = 0; j < TERN_ARRAY_LEN(fb); j++) g->vt->free(g, fb[j]);
        free(src); free(inv); free(kh); free(kb); free(bt); free(pos); free(slot);
    }
}

/* the residual prologue for many rows (gemm.c norm_stage, TERN_CUDA_NORM_RES_N): norm_matmul (q|k|v with q
 * precise: the split form; gate|up SiLU) and norm_mlp with res against the same ops without it on x' =
 * rmsnorm_add(x, h): x', xn and y bitwise (the same GEMMs on the same bytes); x left as is. 300 and 64 rows. */
extern int tern__cuda_norm_res_n;
TEST(cuda_norm_gemm_res) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->norm_matmul || !g->vt->norm_mlp || !g->vt->rmsnorm_add) {
        SKIP("cuda_norm_gemm_res", "no bf16-mode backend or fused ops");
        return;
    }
    const int keep = tern__cuda_norm_res_n, keep_ng = tern__cuda_norm_gemm_on, keep_m = tern__cuda_split_merged;
    tern__cuda_norm_res_n = 1;
    tern__cuda_norm_gemm_on = 1;
    tern__cuda_split_merged = 1;
    tern__cuda_bf16_split = 0;
    const int H = 512, I = 384;
    bt_w w[6]; /* q 256, k 128, v 128, gate, up, down */
    int ok = bt_make(&w[0], 256, H) && bt_make(&w[1], 128, H) && bt_make(&w[2], 128, H) && bt_make(&w[3], I, H) &&
             bt_make(&w[4], I, H) && bt_make(&w[5], H, I);
    CHECK(ok, "upload");
    w[0].g.precise = 1;
    for (int ni = 0; ok && ni < 2; ni++) { /* the two-GEMM split form, then the merged one (batch decode) */
        const int n = ni ? 64 : 300;
        const size_t cnt = (size_t)n * H;
        float *hx = rnd(cnt, 2.0f), *hh = rnd(cnt, 1.5f), *hw = rnd(H, 1.0f), *hn = rnd(H, 1.0f), sc = 0.8f;
        void *x = to_gpu(hx, cnt * 4), *h = to_gpu(hh, cnt * 4), *wd = to_gpu(hw, H * 4), *nwd = to_gpu(hn, H * 4),
             *sd = to_gpu(&sc, 4);
        float *xp = to_gpu(hx, cnt * 4); /* x' the separate way */
        CHECK(g->vt->rmsnorm_add(g, xp, h, n, H, wd, 1e-6f, sd) == 1, "rmsnorm_add refused");
        const size_t ycnt = (size_t)n * 512;
        for (int op = 0; ok && op < 3; op++) { /* 0 q|k|v, 1 gate|up, 2 the MLP */
            float *xo = nan_buf(g, cnt), *xna = nan_buf(g, cnt), *xnb = nan_buf(g, cnt);
            float *ya = nan_buf(g, ycnt), *yb = nan_buf(g, ycnt);
            float *ysa[3] = {ya, ya + (size_t)n * 256, ya + (size_t)n * 384}, *ysb[3] = {yb, yb + (size_t)n * 256, yb + (size_t)n * 384};
            const tern_tensor *wq[3] = {&w[0].g, &w[1].g, &w[2].g}, *wm[3] = {&w[3].g, &w[4].g, &w[5].g};
            const tern_norm_res r = {xo, h, wd, sd};
            int ra, rb;
            size_t yc;
            if (op == 0) {
                ra = g->vt->norm_matmul(g, xna, x, nwd, 1e-6f, n, 3, ysa, wq, -1, &r);
                rb = g->vt->norm_matmul(g, xnb, xp, nwd, 1e-6f, n, 3, ysb, wq, -1, NULL);
                yc = ycnt;
            } else if (op == 1) {
                ra = g->vt->norm_matmul(g, xna, x, nwd, 1e-6f, n, 2, ysa, wm, TERN_ACT_SILU, &r);
                rb = g->vt->norm_matmul(g, xnb, xp, nwd, 1e-6f, n, 2, ysb, wm, TERN_ACT_SILU, NULL);
                yc = (size_t)n * I;
            } else {
                ra = g->vt->norm_mlp(g, xna, x, nwd, 1e-6f, n, ya, 0, wm, TERN_ACT_GELU_TANH, &r);
                rb = g->vt->norm_mlp(g, xnb, xp, nwd, 1e-6f, n, yb, 0, wm, TERN_ACT_GELU_TANH, NULL);
                yc = cnt;
            }
            CHECK(ra == 1 && rb == 1, "n %d op %d: returned %d / %d", n, op, ra, rb);
            float *a = from_gpu(g, xo, cnt), *b = from_gpu(g, xp, cnt), *na = from_gpu(g, xna, cnt), *nb = from_gpu(g, xnb, cnt);
            float *ya_h = from_gpu(g, ya, yc), *yb_h = from_gpu(g, yb, yc), *x_h = from_gpu(g, x, cnt);
            CHECK(!memcmp(a, b, cnt * 4), "n %d op %d: x' differs from rmsnorm_add", n, op);
            CHECK(!memcmp(na, nb, cnt * 4), "n %d op %d: xn differs", n, op);
            CHECK(!memcmp(ya_h, yb_h, yc * 4), "n %d op %d: y differs", n, op);
            CHECK(!memcmp(x_h, hx, cnt * 4), "n %d op %d: x was written", n, op);
            free(a); free(b); free(na); free(nb); free(ya_h); free(yb_h); free(x_h);
            void *bufs[] = {xo, xna, xnb, ya, yb};
            for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        }
        void *bufs[] = {x, h, wd, nwd, sd, xp};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        free(hx); free(hh); free(hw); free(hn);
    }
    for (int i = 0; i < 6; i++) bt_free(&w[i]);
    tern__cuda_bf16_split = 1;
    tern__cuda_norm_res_n = keep;
    tern__cuda_norm_gemm_on = keep_ng;
    tern__cuda_split_merged = keep_m;
}

/* ops.h ple_block (gemm.c tern__cuda_ple_block, TERN_CUDA_PLE_N): Gemma 4's per-layer input block for many rows against
 * the ops src/model/internal.h tern__pending_ple runs otherwise — rmsnorm_add in place, copy_cols of the layer's slice
 * (v at column P of rows 3·P wide), matmul, gelu_tanh_mul / silu_mul, matmul: x' and y bitwise, x left as is; with the
 * residual add (with and without its scalar) and without it (x' = x); 16, 64 and 100 rows. Refused: 8 rows, the
 * switch off, the inner add h2. */
extern int tern__cuda_ple_n, tern__cuda_sgemm_on;
extern unsigned long long tern__cuda_ple_calls;
/* one ple_block case's inputs, host copies kept: x and the pending add's h [n, H], h's norm weight, the scalar 0.8 and
 * the per-layer inputs [n, L·P] (cuda_ple_block) */
typedef struct ple_in {
    float *hx, *hh, *hw, *hp, sc;
    void *x, *h, *wd, *sd, *ple;
} ple_in;
static void ple_in_make(ple_in *p, int n, int H, int P, int L) {
    const size_t cnt = (size_t)n * H;
    p->hx = rnd(cnt, 2.0f), p->hh = rnd(cnt, 1.5f), p->hw = rnd(H, 1.0f), p->hp = rnd((size_t)n * L * P, 1.0f);
    p->sc = 0.8f;
    p->x = to_gpu(p->hx, cnt * 4), p->h = to_gpu(p->hh, cnt * 4), p->wd = to_gpu(p->hw, H * 4);
    p->sd = to_gpu(&p->sc, 4), p->ple = to_gpu(p->hp, (size_t)n * L * P * 4);
}
static void ple_in_free(tern_backend *g, ple_in *p) {
    void *bufs[] = {p->x, p->h, p->wd, p->sd, p->ple};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
    free(p->hx); free(p->hh); free(p->hw); free(p->hp);
}
TEST(cuda_ple_block) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->ple_block || !g->vt->copy_cols) {
        SKIP("cuda_ple_block", "no bf16-mode backend or ple_block");
        return;
    }
    const int keep = tern__cuda_ple_n, keep_sg = tern__cuda_sgemm_on;
    tern__cuda_ple_n = 1;
    tern__cuda_sgemm_on = 1; /* sgemm.cu's default: the separate matmuls take cuBLASLt */
    tern__cuda_bf16_split = 0;
    const int H = 512, P = 64, L = 3;
    bt_w w[2]; /* gate [P, H], projection [H, P] */
    const int ok = bt_make(&w[0], P, H) && bt_make(&w[1], H, P);
    CHECK(ok, "upload");
    const unsigned long long calls0 = tern__cuda_ple_calls;
    int served = 0;
    for (int ni = 0; ok && ni < 3; ni++) {
        const int n = ni == 0 ? 16 : ni == 1 ? 64 : 100;
        const size_t cnt = (size_t)n * H, pc = (size_t)n * P;
        ple_in in;
        ple_in_make(&in, n, H, P, L);
        const float *hx = in.hx;
        void *x = in.x, *h = in.h, *wd = in.wd, *sd = in.sd, *ple = in.ple;
        for (int mode = 0; mode < 4; mode++) { /* 0 res with the scalar, 1 res without, 2 no res, 3 res + SiLU */
            const int act = mode == 3 ? TERN_ACT_SILU : TERN_ACT_GELU_TANH;
            float *xo = nan_buf(g, cnt), *ya = nan_buf(g, cnt), *yb = nan_buf(g, cnt), *pga = nan_buf(g, pc),
                  *pgb = nan_buf(g, pc), *pt = nan_buf(g, pc);
            float *xp = to_gpu(hx, cnt * 4); /* x' the separate way */
            const tern_norm_res r = {xo, h, wd, mode == 1 ? NULL : sd};
            const int ra = g->vt->ple_block(g, ya, pga, x, n, &w[0].g, &w[1].g, act, (const float *)ple + P, (long)L * P,
                                            mode == 2 ? NULL : &r, 1e-6f);
            if (mode != 2) CHECK(g->vt->rmsnorm_add(g, xp, h, n, H, wd, 1e-6f, mode == 1 ? NULL : sd) == 1, "rmsnorm_add");
            g->vt->copy_cols(g, pt, ple, n, P, L * P, P);
            g->vt->matmul(g, pgb, xp, n, &w[0].g);
            if (act == TERN_ACT_SILU) g->vt->silu_mul(g, pgb, pgb, pt, pc);
            else g->vt->gelu_tanh_mul(g, pgb, pgb, pt, pc);
            g->vt->matmul(g, yb, pgb, n, &w[1].g);
            CHECK(ra == 1, "n %d mode %d: not served", n, mode);
            served += ra == 1;
            float *a = from_gpu(g, ya, cnt), *b = from_gpu(g, yb, cnt), *x_h = from_gpu(g, x, cnt);
            double dm;
            const double d = bt_diff(a, b, cnt, &dm);
            CHECK(!memcmp(a, b, cnt * 4), "n %d mode %d: y differs from the separate ops (rel %.3e, max %.3e)", n, mode, d, dm);
            CHECK(!memcmp(x_h, hx, cnt * 4), "n %d mode %d: x was written", n, mode);
            if (mode != 2) {
                float *xa = from_gpu(g, xo, cnt), *xb = from_gpu(g, xp, cnt);
                CHECK(!memcmp(xa, xb, cnt * 4), "n %d mode %d: x' differs from rmsnorm_add", n, mode);
                free(xa); free(xb);
            }
            free(a); free(b); free(x_h);
            void *bufs[] = {xo, ya, yb, pga, pgb, pt, xp};
            for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        }
        if (n == 16) { /* refusals */
            float *y = nan_buf(g, cnt), *pg = nan_buf(g, pc), *xo = nan_buf(g, cnt);
            const tern_norm_res r = {xo, h, wd, sd}, r2 = {xo, h, wd, sd, h, wd};
            CHECK(g->vt->ple_block(g, y, pg, x, 8, &w[0].g, &w[1].g, TERN_ACT_GELU_TANH, (const float *)ple, L * P, &r,
                                   1e-6f) == 0, "8 rows served");
            CHECK(g->vt->ple_block(g, y, pg, x, n, &w[0].g, &w[1].g, TERN_ACT_GELU_TANH, (const float *)ple, L * P, &r2,
                                   1e-6f) == 0, "the inner add served");
            tern__cuda_ple_n = 0;
            CHECK(g->vt->ple_block(g, y, pg, x, n, &w[0].g, &w[1].g, TERN_ACT_GELU_TANH, (const float *)ple, L * P, &r,
                                   1e-6f) == 0, "served with TERN_CUDA_PLE_N=0");
            tern__cuda_ple_n = 1;
            void *bufs[] = {y, pg, xo};
            for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g->vt->free(g, bufs[i]);
        }
        ple_in_free(g, &in);
    }
    CHECK(tern__cuda_ple_calls - calls0 == (unsigned long long)served, "calls %llu for %d served",
          tern__cuda_ple_calls - calls0, served);
    for (int i = 0; i < 2; i++) bt_free(&w[i]);
    tern__cuda_bf16_split = 1;
    tern__cuda_ple_n = keep;
    tern__cuda_sgemm_on = keep_sg;
}

/* ops.h attention_o (gemm.c attn_o_begin / _end around the attention): the batch decode attention on tensor cores
 * (TERN_CUDA_AD_TC forced) writes the o GEMM's bf16 input itself. Against attention + matmul_add on the same backend:
 * y bitwise (the same bf16 values into the same GEMM), and att left unwritten (NaN) — the handoff happened; the same
 * for add = 0 against attention + matmul (Gemma 4's o = wo·att). 24 and 64 decode rows over BF16 pages with a block table, nh 8, nkv 2, d 128; prefill-shaped rows (a sequence's rows
 * together) take the flash kernel, which writes f32 and is staged: y bitwise again */
TEST(cuda_attention_o) {
    tern_backend *g = g_gpu16;
    if (!g || !g->vt->attention_o) { SKIP("cuda_attention_o", "no bf16-mode backend"); return; }
    extern int tern__cuda_ad_mode, tern__cuda_ad_tc;
    const int keep_mode = tern__cuda_ad_mode, keep_tc = tern__cuda_ad_tc;
    tern__cuda_ad_mode = 1;
    tern__cuda_ad_tc = 2;
    tern__cuda_bf16_split = 0;
    const int nh = 8, nkv = 2, d = 128, H = 256, bs = 16, mb = 16, S = 64;
    extern int tern__cuda_q4_att_o;
    const int keep_q4 = tern__cuda_q4_att_o;
    for (int wq = 0; wq < 2; wq++) { /* the o projection in BF16, then in Q4 g64 (TERN_CUDA_Q4_ATT_O) */
        tern__cuda_q4_att_o = wq;
        const size_t tok = (size_t)nkv * d, pool = (size_t)S * mb * bs * tok, in = (size_t)nh * d;
        tern_error err = {0};
        hw hwo = wq ? make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, H, (int)in, 0) : make_w(TERN_DT_BF16, 0, 0, 0, 1, H, (int)in, 0);
        tern_tensor wo = hwo.t;
        CHECK(g->vt->upload_weight(g, &wo, &err) == TERN_OK, "upload %s", err.msg);
        float *kf = rnd(pool, 1.0f);
        uint16_t *kb = malloc(pool * 2);
        for (size_t i = 0; i < pool; i++) kb[i] = tern_f32_to_bf16(kf[i]);
        int32_t *bt = malloc((size_t)S * mb * 4);
        for (int i = 0; i < S * mb; i++) bt[i] = (i * 7) % (S * mb); /* 7 is prime to S·mb: a permutation */
        tern_kv_layer kv = {TERN_DT_Q, nkv, d, bs, 0, to_gpu(kb, pool * 2), to_gpu(kb, pool * 2),
                           to_gpu(bt, (size_t)S * mb * 4), mb};
        kv.kf.kind = kv.vf.kind = TERN_KV_BF16;
        static const struct { int n, prefill; } C[] = {{24, 0}, {64, 0}, {40, 1}};
        for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++) {
            const int n = C[ci].n;
            int32_t *pos = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4);
            for (int r = 0; r < n; r++) {
                pos[r] = C[ci].prefill ? 60 + r : 30 + (r * 37) % (mb * bs - 30);
                slot[r] = C[ci].prefill ? 3 : r;
            }
            float *q = rnd((size_t)n * in, 1.0f), *y0 = rnd((size_t)n * H, 1.0f);
            void *qd = to_gpu(q, (size_t)n * in * 4), *pd = to_gpu(pos, (size_t)n * 4), *sd = to_gpu(slot, (size_t)n * 4);
            void *ya = to_gpu(y0, (size_t)n * H * 4), *yb = to_gpu(y0, (size_t)n * H * 4);
            float *att[2] = {nan_buf(g, (size_t)n * in), nan_buf(g, (size_t)n * in)};
            float *oa = nan_buf(g, (size_t)n * H), *ob = nan_buf(g, (size_t)n * H), *att2 = nan_buf(g, (size_t)n * in);
            tern_rows rows = {n, pd, sd, pos, slot};
            const float scale = 1.0f / sqrtf((float)d);
            g->vt->attention(g, att[0], qd, &rows, nh, &kv, scale, 0.0f);
            CHECK(g->vt->matmul_add(g, ya, att[0], n, &wo) == 1, "n %d: matmul_add refused", n);
            CHECK(g->vt->attention_o(g, yb, att[1], qd, &rows, nh, &kv, scale, 0.0f, &wo, 1) == 1, "n %d: attention_o refused", n);
            g->vt->matmul(g, oa, att[0], n, &wo); /* add = 0 */
            CHECK(g->vt->attention_o(g, ob, att2, qd, &rows, nh, &kv, scale, 0.0f, &wo, 0) == 1, "n %d: attention_o (add 0) refused", n);
            {
                float *p = from_gpu(g, oa, (size_t)n * H), *r = from_gpu(g, ob, (size_t)n * H);
                CHECK(!memcmp(p, r, (size_t)n * H * 4), "n %d: o differs (add 0)", n);
                free(p); free(r);
            }
            float *a = from_gpu(g, ya, (size_t)n * H), *b = from_gpu(g, yb, (size_t)n * H), *ab = from_gpu(g, att[1], (size_t)n * in);
            double dm;
            const double rel = bt_diff(a, b, (size_t)n * H, &dm);
            printf("  err attention_o %s n=%d %s vs attention + matmul_add %.2e (max %.2e)\n", wq ? "q4" : "bf16", n,
                   C[ci].prefill ? "prefill" : "decode", rel, dm);
            CHECK(!memcmp(a, b, (size_t)n * H * 4), "n %d: y differs (rel %.2e)", n, rel);
            CHECK(C[ci].prefill ? !isnan(ab[0]) : isnan(ab[0]) && isnan(ab[(size_t)n * in - 1]),
                  "n %d: att %s", n, C[ci].prefill ? "not written (prefill)" : "written: the bf16 handoff did not happen");
            free(a); free(b); free(ab);
            void *fb[] = {qd, pd, sd, ya, yb, att[0], att[1], oa, ob, att2};
            for (size_t j = 0; j < TERN_ARRAY_LEN(fb); j++) g->vt->free(g, fb[j]);
            free(pos); free(slot); free(q); free(y0);
        }
        void *fb[] = {kv.k, kv.v, (void *)kv.block_table};
        for (size_t j = 0; j < TERN_ARRAY_LEN(fb); j++) g->vt->free(g, fb[j]);
        g->vt->free_weight(g, &wo);
        free_w(&hwo);
        free(kf); free(kb); free(bt);
    }
    tern__cuda_q4_att_o = keep_q4;
    tern__cuda_ad_mode = keep_mode;
    tern__cuda_ad_tc = keep_tc;
    tern__cuda_bf16_split = 1;
}

/* wgemm.cu (TMA + wgmma, TERN_CUDA_WGEMM forced): matmul and matmul_add over BF16 weights in the plain bf16 mode
 * with it on against cuBLASLt (off) on the same backend — the same exact bf16 products summed in another order, so
 * within 1e-5 rel L2 — and against cpu-ref at the plain bf16 bound. Shapes: a small layer (S = 8 K parts of one
 * tile each, fewer tiles than ring stages), ragged features and inputs (1000: a partial feature tile and a partial
 * K tile, zeros from TMA), a long K (8192: 16 tiles a part) and 17..128 rows (batch tiles of 32, 64, 128; 100 rows
 * a partial one); 16 rows (under TERN_CUDA_WGEMM_MIN) must not take it. */
TEST(cuda_wgemm) {
    tern_backend *g = g_gpu16;
    if (!g) { SKIP("cuda_wgemm", "no bf16-mode backend"); return; }
    extern int tern__cuda_wgemm_on, tern__cuda_wgemm_min;
    extern unsigned long long tern__cuda_wgemm_calls;
    const int keep_on = tern__cuda_wgemm_on, keep_min = tern__cuda_wgemm_min;
    tern__cuda_bf16_split = 0;
    tern__cuda_wgemm_min = 17;
    static const struct { int out, in, n; } C[] = {{256, 512, 17}, {256, 512, 64}, {1000, 1000, 40}, {1000, 1000, 100},
                                                   {512, 8192, 128}, {384, 640, 33}, {256, 512, 16}};
    for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++) {
        const int out = C[ci].out, in = C[ci].in, n = C[ci].n;
        bt_w w;
        CHECK(bt_make(&w, out, in), "upload %dx%d", out, in);
        float *x = rnd((size_t)n * in, 1.0f), *y0 = rnd((size_t)n * out, 1.0f);
        void *xd = to_gpu(x, (size_t)n * in * 4);
        float *res[2][2];
        unsigned long long took = 0;
        for (int on = 0; on < 2; on++) {
            tern__cuda_wgemm_on = on;
            const unsigned long long before = tern__cuda_wgemm_calls;
            void *ya = to_gpu(y0, (size_t)n * out * 4), *yp = nan_buf(g, (size_t)n * out);
            CHECK(g->vt->matmul_add(g, ya, xd, n, &w.g) == 1, "%dx%d n %d: matmul_add refused", out, in, n);
            g->vt->matmul(g, yp, xd, n, &w.g);
            res[on][0] = from_gpu(g, ya, (size_t)n * out);
            res[on][1] = from_gpu(g, yp, (size_t)n * out);
            if (on) took = tern__cuda_wgemm_calls - before;
            g->vt->free(g, ya); g->vt->free(g, yp);
        }
        CHECK(n >= 17 ? took == 2 : took == 0, "%dx%d n %d: wgemm ran %llu times", out, in, n, took);
        float *ref = malloc((size_t)n * out * 4);
        g_ref->vt->matmul(g_ref, ref, x, n, &w.r);
        for (int op = 0; op < 2; op++) {
            double dm;
            const double rel = bt_diff(res[1][op], res[0][op], (size_t)n * out, &dm);
            if (op == 0) /* the reference's y + x·Wᵀ */
                for (size_t i = 0; i < (size_t)n * out; i++) res[1][op][i] -= y0[i];
            const double rr = test_rel_l2(res[1][op], ref, (size_t)n * out);
            printf("  err wgemm %dx%d n=%d %s vs cuBLASLt %.2e (max %.2e), vs cpu-ref %.2e\n", out, in, n,
                   op ? "matmul" : "matmul_add", rel, dm, rr);
            CHECK(rel <= 1e-5, "%dx%d n %d %s: rel %.3e vs cuBLASLt", out, in, n, op ? "matmul" : "matmul_add", rel);
            CHECK(rr <= 1e-2, "%dx%d n %d: rel %.3e vs cpu-ref", out, in, n, rr);
        }
        for (int on = 0; on < 2; on++) { free(res[on][0]); free(res[on][1]); }
        free(ref); free(x); free(y0);
        g->vt->free(g, xd);
        bt_free(&w);
    }
    tern__cuda_wgemm_on = keep_on;
    tern__cuda_wgemm_min = keep_min;
    tern__cuda_bf16_split = 1;
}

static void cuda_batch_tests(void) {
    RUN(cuda_wgemm);
    RUN(cuda_norm_gemm_res);
    RUN(cuda_ple_block);
    RUN(cuda_norm_mlp);
    RUN(cuda_qkv_one);
    RUN(cuda_qkv_nrk);
    RUN(cuda_attention_o);
    RUN(cuda_qkv_attention_o);
    RUN(cuda_attention_decode_rope_bits);
    RUN(cuda_norm_gemm_split);
    RUN(cuda_q4_norm);
    RUN(cuda_q4_qkv_rope);
    RUN(cuda_batch_fused);
    RUN(cuda_norm_gemm);
    RUN(cuda_sgemm);
}
