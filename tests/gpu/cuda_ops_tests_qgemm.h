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
    for (size_t s = 0; s < TERN_ARRAY_LEN(S); s++) {
        hw h = make_w(S[s].dt, S[s].bits, S[s].gs, TERN_DT_BF16, 1, S[s].out, S[s].in, 0);
        char nm[64];
        fmt_name(&h.t, nm, sizeof nm);
        for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
            double rel = check_matmul(g_gpu16, &h, NS[i], -1);
            printf("  err %-16s %dx%d n=%-4d bf16q %.2e\n", nm, S[s].out, S[s].in, NS[i], rel);
            CHECK(rel <= 1e-4, "%s %dx%d n=%d rel %.3e", nm, S[s].out, S[s].in, NS[i], rel);
        }
        free_w(&h);
    }
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

static void cuda_qgemm_tests(void) {
    RUN(cuda_qgemm_formats);
    RUN(cuda_qgemm_shapes);
    RUN(cuda_qgemm_expert_stack);
}

#endif
