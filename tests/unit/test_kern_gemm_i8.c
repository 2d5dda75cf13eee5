/* test_kern_gemm_i8.c — the int8 mode's prefill GEMM (gemm_i8_avx512.c, n > 8, Q8/Q4 with
 * AVX-512 VNNI) against the scalar reference and its stated bound: every output within
 * ½ Σ_g d_g·Σ_{t∈g} |s_g|·|q_t − C| (C = 8 or 128, d_g = max_g|x|/127) plus 1e-5·Σ|w·x| of f32
 * rounding. Shapes leave partial strips, partial row blocks, several input blocks (512) with
 * a tail, more rows than one quantized x block (192); 1 and 3 threads; expert views with
 * padded strides; the MoE block (gathered rows, weighted accumulate). Each row must also
 * match the int8 GEMV of the same row (the same quantization of x: batch invariance up to
 * f32 summation order, 1e-5). */
#include "test_kern_util.h"

#include <math.h>

static unsigned qcode(const uint8_t *row, int bits, int t) {
    return bits == 8 ? row[t] : (row[t / 2] >> (4 * (t & 1))) & 15u;
}

static int has_vnni(void) {
    setenv("TERN_CPU_ISA", "avx512", 1);
    int ok = !strcmp(tern_cpu_isa_name(), "avx512") && __builtin_cpu_supports("avx512vnni");
    unsetenv("TERN_CPU_ISA");
    return ok;
}

static double g_worst_rel;

/* Returns the number of outputs outside the bound; *gv: worst rel L2 of a row vs the GEMV. */
static int check(tern_backend *fast, tern_backend *ref, int bits, int gs, int E, int out, int in, int n, int pad,
                 unsigned long long seed, double *gv) {
    kt_weight w;
    kt_weight_make(&w, TERN_DT_Q, bits, gs, TERN_DT_BF16, E, out, in, pad, seed);
    float *x = kt_randv((size_t)n * in, seed + 1, 1.0f);
    for (int r = 0; r < n; r += 7) x[(size_t)r * in + (r * 13) % in] = 6.0f; /* outliers: coarse groups */
    float *y0 = calloc((size_t)n * out, sizeof *y0), *y1 = calloc((size_t)n * out, sizeof *y1);
    float *y2 = calloc((size_t)out, sizeof *y2);
    size_t rb = tern_tensor_row_bytes(&w.t);
    size_t ms = w.t.mat_stride ? w.t.mat_stride : (size_t)out * rb;
    size_t mss = w.t.mat_stride_s ? w.t.mat_stride_s / 2 : (size_t)out * (size_t)(in / gs);
    int bad = 0, ng = in / gs;
    *gv = 0;
    for (int e = 0; e < E; e++) {
        for (size_t i = 0; i < (size_t)n * out; i++) y1[i] = NAN; /* every element must be written */
        ref->vt->matmul_expert(ref, y0, x, n, &w.t, e);
        fast->vt->matmul_expert(fast, y1, x, n, &w.t, e);
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * in;
            for (int o = 0; o < out; o++) {
                const uint8_t *row = (const uint8_t *)w.t.data + (size_t)e * ms + (size_t)o * rb;
                double bound = 0, mag = 0;
                for (int k = 0; k < ng; k++) {
                    float amax = 0;
                    for (int t = k * gs; t < (k + 1) * gs; t++) amax = fmaxf(amax, fabsf(xr[t]));
                    size_t si = (size_t)e * mss + (size_t)o * ng + k;
                    float s = tern_load_f32(w.t.scales, TERN_DT_BF16, si), b = tern_load_f32(w.t.biases, TERN_DT_BF16, si);
                    double sq = 0;
                    for (int t = k * gs; t < (k + 1) * gs; t++) {
                        unsigned q = qcode(row, bits, t);
                        sq += fabs((double)s) * fabs((double)q - (bits == 4 ? 8.0 : 128.0));
                        mag += fabs(((double)s * q + b) * xr[t]);
                    }
                    bound += 0.5 * amax / 127.0 * sq;
                }
                double diff = fabs((double)y1[(size_t)r * out + o] - y0[(size_t)r * out + o]);
                if (!(diff <= bound * 1.001 + 1e-5 * mag)) bad++;
            }
        }
        double rel = test_rel_l2(y1, y0, (size_t)n * out);
        if (rel > g_worst_rel) g_worst_rel = rel;
        if (in % 64 == 0) /* the fused int8 GEMV takes this row length: same quantization */
            for (int r = 0; r < n; r += 5) {
                fast->vt->matmul_expert(fast, y2, x + (size_t)r * in, 1, &w.t, e);
                double d = test_rel_l2(y1 + (size_t)r * out, y2, (size_t)out);
                if (!(d <= *gv)) *gv = d;
            }
    }
    free(x); free(y0); free(y1); free(y2);
    kt_weight_free(&w);
    return bad;
}

TEST(gemm_i8_grid) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    tern_backend_cpu_set_int8(fast, 1);
    static const int gss[] = {32, 64, 128};
    static const int ns[] = {9, 13, 25, 61};
    static const int outs[] = {1, 17, 33, 70};
    unsigned long long seed = 1;
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t g = 0; g < TERN_ARRAY_LEN(gss); g++)
            for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++) {
                int gs = gss[g], in = gs * (1 + (int)((seed * 5) % 11)), out = outs[seed % TERN_ARRAY_LEN(outs)];
                if (k == 3) in = 512 + 2 * gs; /* a full input block and a tail */
                double gv;
                int bad = check(fast, ref, bits, gs, 1, out, in, ns[k], 0, seed++, &gv);
                CHECK(bad == 0, "q%d g%d out=%d in=%d n=%d: %d outputs outside the int8 bound", bits, gs, out, in, ns[k], bad);
                CHECK(gv <= 1e-5, "q%d g%d out=%d in=%d n=%d: GEMM row vs int8 GEMV %.3g", bits, gs, out, in, ns[k], gv);
            }
    printf("  int8 GEMM: worst relative L2 error vs exact %.3g\n", g_worst_rel);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

/* More rows than one x block, more features than one y chunk, 1 and 3 threads, experts. */
TEST(gemm_i8_big) {
    for (int nth = 1; nth <= 3; nth += 2) {
        tern_backend *fast = kt_open_cpu("avx512", nth), *ref = kt_open_ref();
        tern_backend_cpu_set_int8(fast, 1);
        double g1, g2, g3;
        int b1 = check(fast, ref, 4, 64, 1, 1100, 640, 203, 0, 31, &g1);
        int b2 = check(fast, ref, 8, 32, 3, 45, 96, 19, 5, 33, &g2);
        int b3 = check(fast, ref, 8, 128, 1, 300, 1152, 40, 0, 34, &g3);
        CHECK(b1 + b2 + b3 == 0, "nth=%d outside the bound: %d %d %d", nth, b1, b2, b3);
        CHECK(g1 <= 1e-5 && g3 <= 1e-5, "nth=%d GEMM vs GEMV %.3g %.3g", nth, g1, g3);
        tern_backend_close(fast);
        tern_backend_close(ref);
    }
}

/* MoE: gathered x rows, routing-weighted accumulation into gathered y rows. */
TEST(gemm_i8_moe) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    int E = 4, H = 128, I = 192, k = 2, n = 48;
    kt_weight g, u, d;
    kt_weight_make(&g, TERN_DT_Q, 4, 32, TERN_DT_BF16, E, I, H, 0, 60);
    kt_weight_make(&u, TERN_DT_Q, 8, 64, TERN_DT_BF16, E, I, H, 0, 61);
    kt_weight_make(&d, TERN_DT_Q, 4, 64, TERN_DT_BF16, E, H, I, 0, 62);
    kt_moe m;
    kt_moe_make(&m, ref, n, H, I, E, k, &g, &u, &d, 63, 64);
    double exact = kt_moe_run(&m, fast);
    tern_backend_cpu_set_int8(fast, 1);
    double i8 = kt_moe_run(&m, fast);
    printf("  moe: exact %.3g, int8 %.3g rel L2\n", exact, i8);
    CHECK(exact <= 3e-6, "moe exact %.3g", exact);
    CHECK(i8 > exact && i8 <= 2e-2, "moe int8 %.3g (exact %.3g)", i8, exact);
    kt_moe_free(&m);
    kt_weight_free(&g); kt_weight_free(&u); kt_weight_free(&d);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

int main(void) {
    if (!has_vnni()) { SKIP("gemm_i8", "CPU lacks AVX-512 VNNI (the int8 mode runs the exact kernels)"); return test_done(); }
    RUN(gemm_i8_grid);
    RUN(gemm_i8_big);
    RUN(gemm_i8_moe);
    return test_done();
}
