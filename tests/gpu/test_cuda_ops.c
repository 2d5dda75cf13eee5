/*
 * test_cuda_ops.c — the CUDA backend's op tests for the GPU machine (built by `make gpu-test`
 * as build/test_cuda_ops; scripts/gpu_check.sh runs it). Every op against the scalar
 * reference backend; prints PASS/FAIL/SKIP lines like every other test binary, plus
 * "  err ..." lines with the measured error per format for the report.
 */
#include "gpu/cuda_ops_tests.h"
#include "gpu/cuda_ops_tests_moe.h"
#include "gpu/cuda_ops_tests_moemma.h"
#include "gpu/cuda_ops_tests_batch.h"

/* moe_mlp's fused gate/up/act launch (gemv.cu moe_gateup_kernel, default on) against cpu-ref and
 * bit for bit against the 3-launch path (TERN_CUDA_MOE_FUSED=0) and against other row tiles
 * (TERN_CUDA_MOE_RT; a token's h must not depend on the tiling), f32 and bf16 compute modes
 * (few pairs: the pair path), E 16, k 4, n 1 and 3. tern__cuda_moe_fused_calls must move for the
 * served formats and stay put for the last case (BF16 rows of 200: not chunk-aligned, fallback). */
extern unsigned long long tern__cuda_moe_fused_calls;
extern int tern__cuda_moe_fused_on, tern__cuda_moe_rt;

TEST(cuda_moe_fused) {
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; int act, H, I, fused; } C[] = {
        {TERN_DT_Q, 4, 64, TERN_DT_BF16, TERN_ACT_GELU_TANH, 512, 192, 1},
        {TERN_DT_Q, 8, 32, TERN_DT_F16, TERN_ACT_SILU, 256, 160, 1},
        {TERN_DT_BF16, 0, 0, 0, TERN_ACT_SILU, 384, 200, 1},
        {TERN_DT_F8_E4M3, 0, 128, TERN_DT_F32, TERN_ACT_GELU_TANH, 256, 136, 1},
        {TERN_DT_Q, 3, 64, TERN_DT_F32, TERN_ACT_SILU, 256, 128, 1},
        {TERN_DT_BF16, 0, 0, 0, TERN_ACT_GELU_TANH, 200, 96, 0},
    };
    const int E = 16, k = 4;
    static const int RT[] = {1, 5, 64};
    const int keep_mma = tern__cuda_moe_mma_on;
    tern__cuda_moe_mma_on = 0; /* Q4 would take moe_mma.cu (cuda_ops_tests_moemma.h) */
    for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
        const int H = C[c].H, I = C[c].I;
        moe_w m;
        int ok = 1;
        if (C[c].dt == TERN_DT_F8_E4M3) { /* 128x128 blocks; I = 136: a partial row block */
            memset(&m, 0, sizeof m);
            m.g = make_fp8(E, I, H, 128, 128, 0);
            m.u = make_fp8(E, I, H, 128, 128, 0);
            m.d = make_fp8(E, H, I, 128, 128, 0);
            m.gr = m.gg = m.g.t; m.ur = m.ug = m.u.t; m.dr = m.dg = m.d.t;
            tern_error err = {0};
            ok = !g_gpu->vt->upload_weight(g_gpu, &m.gg, &err) && !g_gpu->vt->upload_weight(g_gpu, &m.ug, &err) &&
                 !g_gpu->vt->upload_weight(g_gpu, &m.dg, &err);
        } else {
            ok = moe_w_make(&m, g_gpu, C[c].dt, C[c].bits, C[c].gs, C[c].sdt, E, H, I, 0);
        }
        CHECK(ok, "upload case %zu", c);
        if (!ok) continue;
        char nm[64];
        fmt_name(&m.g.t, nm, sizeof nm);
        for (int n = 1; n <= 3; n += 2) {
            float *x = rnd((size_t)n * H, 1.0f), *wts = malloc((size_t)n * k * sizeof *wts);
            int32_t *idx = malloc((size_t)n * k * sizeof *idx);
            moe_route_uneven(idx, wts, n, E, k);
            float *yr = malloc((size_t)n * H * sizeof *yr), *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
            g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &m.gr, &m.ur, &m.dr, C[c].act, scr);
            tern__cuda_moe_fused_on = 1;
            unsigned long long c0 = tern__cuda_moe_fused_calls;
            float *yf = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, C[c].act);
            const double rel = rel_or_nan(yf, yr, (size_t)n * H);
            printf("  err moe-fused %-14s n=%d %.2e\n", nm, n, rel);
            CHECK(rel <= 1e-5, "%s n %d fused rel %.2e", nm, n, rel);
            CHECK(tern__cuda_moe_fused_calls - c0 == (unsigned long long)C[c].fused, "%s n %d: fused calls %llu",
                  nm, n, tern__cuda_moe_fused_calls - c0);
            tern__cuda_moe_fused_on = 0;
            c0 = tern__cuda_moe_fused_calls;
            float *yo = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, C[c].act);
            tern__cuda_moe_fused_on = 1;
            CHECK(tern__cuda_moe_fused_calls == c0, "%s n %d: TERN_CUDA_MOE_FUSED=0 still fused", nm, n);
            double dmax = 0.0;
            for (size_t i = 0; i < (size_t)n * H; i++) dmax = fmax(dmax, fabs((double)yf[i] - yo[i]));
            CHECK(!memcmp(yf, yo, (size_t)n * H * 4), "%s n %d: fused != 3-launch path (max |diff| %.3e)", nm, n,
                  dmax);
            for (size_t r = 0; r < TERN_ARRAY_LEN(RT); r++) {
                tern__cuda_moe_rt = RT[r];
                float *yt = moe_run(g_gpu, &m, x, idx, wts, n, H, I, k, C[c].act);
                CHECK(!memcmp(yf, yt, (size_t)n * H * 4), "%s n %d: row tile %d changes bits", nm, n, RT[r]);
                free(yt);
            }
            tern__cuda_moe_rt = 0;
            if (g_gpu16) { /* bf16 mode, few pairs: the same pair path, the same bits */
                moe_w m16;
                const int up = moe_w_upload16(&m16, &m);
                if (up) {
                    c0 = tern__cuda_moe_fused_calls;
                    float *yb = moe_run(g_gpu16, &m16, x, idx, wts, n, H, I, k, C[c].act);
                    CHECK(tern__cuda_moe_fused_calls - c0 == (unsigned long long)C[c].fused, "%s n %d bf16 mode: "
                          "fused calls %llu", nm, n, tern__cuda_moe_fused_calls - c0);
                    CHECK(!memcmp(yf, yb, (size_t)n * H * 4), "%s n %d: bf16 mode differs from f32 mode", nm, n);
                    free(yb);
                }
                g_gpu16->vt->free_weight(g_gpu16, &m16.gg);
                g_gpu16->vt->free_weight(g_gpu16, &m16.ug);
                g_gpu16->vt->free_weight(g_gpu16, &m16.dg);
            }
            free(x); free(wts); free(idx); free(yr); free(scr); free(yf); free(yo);
        }
        moe_w_free(&m, g_gpu);
    }
    tern__cuda_moe_mma_on = keep_mma;
}

int main(void) {
    char why[TERN_ERROR_MSG_MAX + 32];
    if (!cuda_ops_open(why, sizeof why)) {
        printf("SKIP: cuda: no GPU (%s)\n", why);
        cuda_ops_close();
        return 0;
    }
    int rc = cuda_ops_run_all();
    cuda_moe_tests();
    RUN(cuda_moe_fused);
    cuda_moemma_tests(); /* moe_mma.cu: Q4 pairs on tensor cores */
    cuda_batch_tests();  /* gemm.c: the fused ops for many rows */
    rc |= test_done();
    cuda_ops_close();
    return rc;
}
