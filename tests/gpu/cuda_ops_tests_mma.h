/*
 * cuda_ops_tests_mma.h — the tensor-core n = 1 GEMV for MLX Q4/Q8 (gemv_mma.cu) against cpu-ref:
 * every group size, BF16 and F16 scales, one K slice (in = 384) and split K (in = 4096, 14336:
 * the last block of a row block reduces the slices), row counts that are not multiples of the
 * 16-row warp tile or the 128-row block, and a second launch of the same shape (the split-K
 * counters must have been reset). The fused modes (q|k|v, gate/up, residual add) are compared
 * bitwise with the separate ops in cuda_ops_tests_fused.h. Part of cuda_ops_tests.h.
 */

extern unsigned long long tern__cuda_gemv_mma_calls;
extern int tern__cuda_gemv_mma_on;

TEST(cuda_gemv_mma) {
    const int keep = tern__cuda_gemv_mma_on;
    tern__cuda_gemv_mma_on = 2; /* Q8 too (off by default: slower than gemv1 there) */
    static const struct { int bits, gs; tern_dtype sdt; } F[] = {
        {4, 64, TERN_DT_BF16}, {4, 32, TERN_DT_BF16}, {4, 128, TERN_DT_F16}, {8, 64, TERN_DT_BF16},
        {8, 32, TERN_DT_F16}, {8, 128, TERN_DT_BF16}, {4, 64, TERN_DT_F16},
    };
    static const int shapes[][2] = {{300, 384}, {1037, 4096}, {64, 14336}, {4099, 2048}};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
            hw h = make_w(TERN_DT_Q, F[f].bits, F[f].gs, F[f].sdt, 1, shapes[s][0], shapes[s][1], 0);
            char nm[64];
            fmt_name(&h.t, nm, sizeof nm);
            for (int rep = 0; rep < 2; rep++) {
                const unsigned long long calls = tern__cuda_gemv_mma_calls;
                double rel = check_matmul(g_gpu, &h, 1, -1);
                printf("  err %-16s %dx%d n=1 mma %.2e\n", nm, shapes[s][0], shapes[s][1], rel);
                CHECK(rel <= 1e-5, "%s %dx%d rep %d: rel %.3e", nm, shapes[s][0], shapes[s][1], rep, rel);
                CHECK(tern__cuda_gemv_mma_calls > calls, "%s %dx%d: the tensor-core GEMV did not run", nm,
                      shapes[s][0], shapes[s][1]);
            }
            free_w(&h);
        }
    tern__cuda_gemv_mma_on = keep;
}

static void cuda_mma_tests(void) { RUN(cuda_gemv_mma); }
