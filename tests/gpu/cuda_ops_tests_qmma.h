/*
 * cuda_ops_tests_qmma.h — the Q matmul with unconverted codes on tensor cores
 * (src/backend/cuda/qmma.cu) against cpu-ref, whatever the default of its switch: the tests set
 * tern__cuda_qmma_mode = 2 (bf16 mode with x = xh + xl, f32 mode with x = xh + xm + xl) and
 * restore it after. Grid: bits 4, 8 x groups 32/64/128 x F32/F16/BF16 scales x n in {1, 2, 3, 8,
 * 16, 33, 64} on 300 x 384 (out not a multiple of the 128-row block); long inputs (4096, 14336;
 * split K + reduction) and many row blocks at n in {1, 8, 33, 64}; batch invariance (a row's
 * output has the same bits at n = 1, 33, 64). Each check also asserts that the new kernel ran
 * (its launch counter moved), so a silent decline cannot pass. Also gemm.c's row chunks. Bounds: f32 mode 1e-5, bf16x2 mode
 * 1e-4 (the existing matmul bounds), the plain bf16 mode (one x part, n >= 2) 1e-2. Lines "  err <format> n=<rows> qmma-f32|qmma-bf16 <rel>".
 * Included by cuda_ops_tests.h after its helpers (make_w, check_matmul).
 */
#ifndef TERN_CUDA_OPS_TESTS_QMMA_H
#define TERN_CUDA_OPS_TESTS_QMMA_H

#ifdef TERN_HAVE_CUDA
extern int tern__cuda_qmma_mode, tern__cuda_qmma_maxn, tern__cuda_qmma_minn, tern__cuda_gemv_xr, tern__cuda_qg4_on;
extern unsigned long long tern__cuda_qmma_calls;

/* qmma in both compute modes for every n of 1..64 (the default row limits are the dispatch's choice), and back */
static int qmma_keep[3];
static void qmma_force(void) {
    qmma_keep[0] = tern__cuda_qmma_mode, qmma_keep[1] = tern__cuda_qmma_maxn, qmma_keep[2] = tern__cuda_qmma_minn;
    tern__cuda_qmma_mode = 2, tern__cuda_qmma_maxn = 64, tern__cuda_qmma_minn = 1;
}
static void qmma_restore(void) {
    tern__cuda_qmma_mode = qmma_keep[0], tern__cuda_qmma_maxn = qmma_keep[1], tern__cuda_qmma_minn = qmma_keep[2];
}

/* check one weight at one n in both compute modes through the new kernel */
static void qmma_check(const hw *h, const char *nm, int n) {
    qmma_force();
    tern_backend *be[2] = {g_gpu, g_gpu16};
    for (int m = 0; m < 2; m++) {
        if (!be[m]) continue;
        const unsigned long long c0 = tern__cuda_qmma_calls;
        const double rel = check_matmul(be[m], h, n, -1), tol = m ? 1e-4 : 1e-5;
        const int ran = tern__cuda_qmma_calls == c0 + 1;
        printf("  err %-16s %dx%d n=%-3d qmma-%s %.2e%s\n", nm, (int)h->t.shape[0], (int)h->t.shape[1], n,
               m ? "bf16" : "f32", rel, ran ? "" : " (not run)");
        CHECK(ran, "%s n=%d mode %d: qmma did not run", nm, n, m);
        CHECK(rel <= tol, "%s %dx%d n=%d %s rel %.3e", nm, (int)h->t.shape[0], (int)h->t.shape[1], n, m ? "bf16" : "f32",
              rel);
        if (m && n >= 2) { /* the plain bf16 mode: one x part (x rounded to bf16), codes and scales exact */
            const int keep_xr = tern__cuda_gemv_xr, keep_q4 = tern__cuda_qg4_on; /* they come first for Q4 */
            tern__cuda_bf16_split = tern__cuda_gemv_xr = tern__cuda_qg4_on = 0;
            const unsigned long long c1 = tern__cuda_qmma_calls;
            const double rp = check_matmul(be[m], h, n, -1);
            tern__cuda_bf16_split = 1;
            tern__cuda_gemv_xr = keep_xr;
            tern__cuda_qg4_on = keep_q4;
            printf("  err %-16s %dx%d n=%-3d qmma-plain %.2e\n", nm, (int)h->t.shape[0], (int)h->t.shape[1], n, rp);
            CHECK(tern__cuda_qmma_calls == c1 + 1, "%s n=%d plain: qmma did not run", nm, n);
            CHECK(rp <= 1e-2, "%s n=%d plain rel %.3e", nm, n, rp);
        }
    }
    qmma_restore();
}

TEST(cuda_qmma_formats) {
    static const int BITS[] = {4, 8}, GS[] = {32, 64, 128};
    static const tern_dtype SDT[] = {TERN_DT_F32, TERN_DT_F16, TERN_DT_BF16};
    static const int NS[] = {1, 2, 3, 8, 16, 33, 64};
    for (int bi = 0; bi < 2; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int si = 0; si < 3; si++) {
                hw h = make_w(TERN_DT_Q, BITS[bi], GS[gi], SDT[si], 1, 300, 384, 0);
                char nm[64];
                fmt_name(&h.t, nm, sizeof nm);
                for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) qmma_check(&h, nm, NS[i]);
                free_w(&h);
            }
}

TEST(cuda_qmma_shapes) {
    static const struct { int bits, gs; tern_dtype sdt; int out, in; } S[] = {
        {4, 64, TERN_DT_BF16, 520, 4096}, {8, 64, TERN_DT_BF16, 260, 4096}, {4, 128, TERN_DT_F16, 136, 14336},
        {8, 32, TERN_DT_F32, 72, 14336}, {4, 32, TERN_DT_BF16, 4100, 256}, {8, 128, TERN_DT_F16, 1, 128},
    };
    static const int NS[] = {1, 8, 33, 64};
    for (size_t s = 0; s < TERN_ARRAY_LEN(S); s++) {
        /* each shape's data from its own seed, not from whatever the tests before it drew: one output
         * row at n = 1 is a single dot product, and a draw where it nearly cancels makes a relative
         * error of f32 rounding look like 1e-4 (session 10, after cuda_sgemm began drawing more) */
        g_seed = 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL * (s + 1);
        hw h = make_w(TERN_DT_Q, S[s].bits, S[s].gs, S[s].sdt, 1, S[s].out, S[s].in, 0);
        char nm[64];
        fmt_name(&h.t, nm, sizeof nm);
        for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) qmma_check(&h, nm, NS[i]);
        free_w(&h);
    }
}

/* y rows of one x at n = 1, 33, 64: row 0 (and row 32) must have the same bits */
TEST(cuda_qmma_batch_invariant) {
    qmma_force();
    hw h = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 300, 4096, 0);
    tern_backend *be[2] = {g_gpu, g_gpu16};
    for (int m = 0; m < 2; m++) {
        if (!be[m]) continue;
        tern_tensor tg = h.t;
        tern_error err = {0};
        if (be[m]->vt->upload_weight(be[m], &tg, &err) != TERN_OK) {
            CHECK(0, "upload: %s", err.msg);
            continue;
        }
        const int out = 300, in = 4096, ns[3] = {1, 33, 64};
        float *x = rnd((size_t)64 * in, 1.0f), *y[3];
        void *xd = to_gpu(x, (size_t)64 * in * sizeof *x);
        for (int k = 0; k < 3; k++) {
            void *yd = nan_buf(be[m], (size_t)ns[k] * out);
            be[m]->vt->matmul(be[m], yd, xd, ns[k], &tg);
            y[k] = from_gpu(be[m], yd, (size_t)ns[k] * out);
            be[m]->vt->free(be[m], yd);
        }
        CHECK(!memcmp(y[0], y[1], out * sizeof(float)) && !memcmp(y[0], y[2], out * sizeof(float)),
              "mode %d: row 0 differs between n = 1, 33, 64", m);
        CHECK(!memcmp(y[1] + 32 * out, y[2] + 32 * out, out * sizeof(float)), "mode %d: row 32 differs (n 33 vs 64)", m);
        for (int k = 0; k < 3; k++) free(y[k]);
        be[m]->vt->free(be[m], xd);
        be[m]->vt->free_weight(be[m], &tg);
        free(x);
    }
    free_w(&h);
    qmma_restore();
}

/* gemm.c: a bf16-mode prefill whose bf16 activation pair (n·in·4 bytes) exceeds half the GEMM
 * scratch runs in row chunks (before: the 16-row GEMV; that gave the same numbers, slowly, so this
 * guards the chunked results, not the speed) */
TEST(cuda_gemm_row_chunks) {
    if (!g_gpu16) { SKIP("cuda_gemm_row_chunks", "no bf16-mode backend"); return; }
    hw h = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 24, 16384, 0);
    const double rel = check_matmul(g_gpu16, &h, 2100, -1);
    printf("  err q4/g64/BF16 24x16384 n=2100 bf16 (row chunks) %.2e\n", rel);
    CHECK(rel <= 1e-4, "row-chunked gemm rel %.3e", rel);
    free_w(&h);
}

static void cuda_qmma_tests(void) {
    RUN(cuda_qmma_formats);
    RUN(cuda_qmma_shapes);
    RUN(cuda_qmma_batch_invariant);
    RUN(cuda_gemm_row_chunks);
}
#else
static void cuda_qmma_tests(void) { SKIP("cuda_qmma", "no CUDA build"); }
#endif

#endif
