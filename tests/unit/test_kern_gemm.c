/* test_kern_gemm.c — the blocked prefill GEMM (cpu_matmul.c mm_gemm + gemm_avx512.c /
 * gemm_avx2.c, used for n > 8) against the scalar reference: odd shapes that leave partial
 * strips, partial row blocks, partial input blocks and K tails not a multiple of the vector
 * width; more rows than one packed x block; more features than one y chunk; every stored
 * format; expert views with padded strides; and the MoE down projection, which accumulates
 * into gathered y rows with routing weights. Exactness: rel L2 ≤ 3e-6 (f32 sums in another
 * order), the same bound as the other matmul paths. */
#include "test_kern_util.h"

#define TOL 3e-6

static double check(tern_backend *fast, tern_backend *ref, tern_dtype dt, int bits, int gs, int E, int out, int in,
                    int n, int pad, unsigned long long seed) {
    kt_weight w;
    kt_weight_make(&w, dt, bits, gs, TERN_DT_BF16, E, out, in, pad, seed);
    double worst = kt_matmul_worst(fast, ref, &w.t, E, out, in, n, seed + 1);
    kt_weight_free(&w);
    return worst;
}

static void grid(const char *isa) {
    tern_backend *fast = kt_open_cpu(isa, 2), *ref = kt_open_ref();
    static const tern_dtype dts[] = {TERN_DT_F32, TERN_DT_BF16, TERN_DT_F16};
    static const int ins[] = {1, 7, 33, 255, 257, 515};
    static const int ns[] = {9, 12, 13, 25, 61};
    static const int outs[] = {1, 17, 31, 33, 70};
    unsigned long long seed = 1;
    for (size_t d = 0; d < TERN_ARRAY_LEN(dts); d++)
        for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
            for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++) {
                int out = outs[(seed * 7) % TERN_ARRAY_LEN(outs)];
                double err = check(fast, ref, dts[d], 0, 0, 1, out, ins[i], ns[k], 0, seed++);
                CHECK(err <= TOL, "%s %s out=%d in=%d n=%d: rel err %.3g", isa, tern_dtype_name(dts[d]), out, ins[i], ns[k], err);
            }
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    static const int gss[] = {32, 64, 128};
    for (size_t b = 0; b < TERN_ARRAY_LEN(bitss); b++)
        for (size_t g = 0; g < TERN_ARRAY_LEN(gss); g++) {
            int in = gss[g] * (3 + (int)(seed % 7)); /* crosses the 256-input block, not a multiple of it */
            int out = outs[seed % TERN_ARRAY_LEN(outs)], n = ns[seed % TERN_ARRAY_LEN(ns)];
            double err = check(fast, ref, TERN_DT_Q, bitss[b], gss[g], 1, out, in, n, 0, seed++);
            CHECK(err <= TOL, "%s q%d g%d out=%d in=%d n=%d: rel err %.3g", isa, bitss[b], gss[g], out, in, n, err);
        }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(gemm_grid_avx2) { grid("avx2"); }
TEST(gemm_grid_avx512) { grid("avx512"); }

/* More rows than one packed x block (512: e5, 1100 rows in blocks of 504 and a short last one), features over
 * several strips, experts with padded matrix strides, one thread and three (uneven feature split). */
static void big(const char *isa) {
    for (int nth = 1; nth <= 3; nth += 2) {
        tern_backend *fast = kt_open_cpu(isa, nth), *ref = kt_open_ref();
        double e1 = check(fast, ref, TERN_DT_Q, 4, 64, 1, 1100, 320, 203, 0, 31);
        double e2 = check(fast, ref, TERN_DT_BF16, 0, 0, 1, 333, 1031, 200, 0, 32);
        double e3 = check(fast, ref, TERN_DT_Q, 8, 32, 3, 45, 96, 19, 5, 33);
        double e4 = check(fast, ref, TERN_DT_F32, 0, 0, 2, 40, 70, 27, 3, 34);
        double e5 = check(fast, ref, TERN_DT_BF16, 0, 0, 1, 70, 600, 1100, 0, 35);
        CHECK(e1 <= TOL && e2 <= TOL && e3 <= TOL && e4 <= TOL && e5 <= TOL, "%s nth=%d errs %.3g %.3g %.3g %.3g %.3g", isa,
              nth, e1, e2, e3, e4, e5);
        tern_backend_close(fast);
        tern_backend_close(ref);
    }
}

TEST(gemm_big_avx2) { big("avx2"); }
TEST(gemm_big_avx512) { big("avx512"); }

/* MoE with enough tokens that experts get > 8 rows: the gate/up GEMM writes gathered rows,
 * the down GEMM adds routing-weighted results into gathered y rows. */
static void moe(const char *isa, tern_dtype dt, int bits, int n, unsigned long long seed) {
    tern_backend *fast = kt_open_cpu(isa, 2), *ref = kt_open_ref();
    int E = 4, H = 96, I = 160, k = 2;
    kt_weight g, u, d;
    kt_weight_make(&g, dt, bits, 32, TERN_DT_BF16, E, I, H, 0, seed);
    kt_weight_make(&u, dt, bits, 32, TERN_DT_BF16, E, I, H, 0, seed + 1);
    kt_weight_make(&d, dt, bits, 32, TERN_DT_BF16, E, H, I, 0, seed + 2);
    kt_moe m;
    kt_moe_make(&m, ref, n, H, I, E, k, &g, &u, &d, seed + 3, seed + 4);
    double err = kt_moe_run(&m, fast);
    CHECK(err <= TOL, "%s %s n=%d: moe rel err %.3g", isa, tern_dtype_name(dt), n, err);
    kt_moe_free(&m);
    kt_weight_free(&g); kt_weight_free(&u); kt_weight_free(&d);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(gemm_moe) {
    moe("avx512", TERN_DT_Q, 4, 48, 50);
    moe("avx512", TERN_DT_BF16, 0, 37, 51);
    moe("avx2", TERN_DT_Q, 8, 41, 52);
}

/* The bf16 compute mode's GEMM (AVX512-BF16: x rounded to bf16, vdpbf16ps over BF16 weights) against the
 * reference fed x rounded to bf16 the same way (round to nearest even): the bf16 products are exact in f32 on both
 * sides, so only the order of the f32 sums differs — the exact bound TOL. The decode driver's vdpbf16ps GEMV (1-16
 * rows, in % 64 == 0) rounds x the same way. Odd input counts, F32 weights, tern_tensor.precise weights and one row
 * of a length the GEMV does not take keep the f32 path (x exact); routed MoE experts (gathered rows, the down
 * projection accumulating with routing weights) within the bf16 rounding's own size of the exact result. */
static float bf16_round(float v) { return tern_bf16_to_f32(tern_f32_to_bf16(v)); }

static double bf16_case(tern_backend *fast, tern_backend *ref, tern_dtype dt, int precise, int E, int out, int in,
                        int n, int pad, unsigned long long seed, int *rounded) {
    kt_weight w;
    kt_weight_make(&w, dt, 0, 0, TERN_DT_BF16, E, out, in, pad, seed);
    w.t.precise = precise;
    float *x = kt_randv((size_t)n * in, seed + 1, 1.0f), *xr = malloc(sizeof(float) * (size_t)n * in);
    /* the bf16 mode rounds x for BF16 weights (not precise): the GEMM (even in) and the fused vdpbf16ps GEMV (in % 64
     * == 0); one row of another length takes the exact decode + dot path */
    *rounded = dt == TERN_DT_BF16 && !precise && in % 2 == 0 && (n > 1 || in % 64 == 0);
    for (size_t i = 0; i < (size_t)n * in; i++) xr[i] = *rounded ? bf16_round(x[i]) : x[i];
    float *y0 = calloc((size_t)n * out, sizeof *y0), *y1 = calloc((size_t)n * out, sizeof *y1);
    double worst = 0;
    for (int e = 0; e < E; e++) {
        for (size_t i = 0; i < (size_t)n * out; i++) y1[i] = NAN;
        if (E > 1) { ref->vt->matmul_expert(ref, y0, xr, n, &w.t, e); fast->vt->matmul_expert(fast, y1, x, n, &w.t, e); }
        else { ref->vt->matmul(ref, y0, xr, n, &w.t); fast->vt->matmul(fast, y1, x, n, &w.t); }
        double err = test_rel_l2(y1, y0, (size_t)n * out);
        if (!(err <= worst)) worst = err;
    }
    free(x); free(xr); free(y0); free(y1);
    kt_weight_free(&w);
    return worst;
}

TEST(gemm_bf16_mode) {
    tern_backend *ref = kt_open_ref();
    for (int nth = 1; nth <= 3; nth += 2) {
        setenv("TERN_CPU_ISA", "avx512", 1);
        tern_backend_opts o = {.n_threads = nth, .compute = TERN_COMPUTE_BF16};
        tern_backend *fast = NULL;
        tern_error e = {0};
        CHECK(tern_backend_cpu_open(&fast, &o, &e) == TERN_OK, "open: %s", e.msg);
        unsetenv("TERN_CPU_ISA");
        if (!fast) break;
        static const int ins[] = {2, 64, 254, 258, 512, 514, 1030, 2050, 33};
        static const int ns[] = {9, 13, 25, 61, 200};
        static const int outs[] = {1, 17, 31, 33, 70};
        unsigned long long seed = 100;
        int n_rounded = 0, rounded;
        for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
            for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++, seed++) {
                int out = outs[(seed * 7) % TERN_ARRAY_LEN(outs)];
                double err = bf16_case(fast, ref, TERN_DT_BF16, 0, 1, out, ins[i], ns[k], 0, seed, &rounded);
                n_rounded += rounded;
                CHECK(err <= TOL, "bf16 mode %dt out=%d in=%d n=%d: rel err %.3g (x %s)", nth, out, ins[i], ns[k], err,
                      rounded ? "rounded" : "exact");
            }
        CHECK(n_rounded == 8 * 5, "%d cases took the bf16 GEMM", n_rounded); /* every even in, n > 8 */
        /* experts with padded strides, many rows and features, a precise weight (exact x), F32 weights (exact x), n = 8
         * (the decode driver's vdpbf16ps GEMV) */
        double e1 = bf16_case(fast, ref, TERN_DT_BF16, 0, 3, 45, 96, 19, 5, 300, &rounded);
        double e2 = bf16_case(fast, ref, TERN_DT_BF16, 0, 1, 1100, 1026, 203, 0, 301, &rounded);
        double e3 = bf16_case(fast, ref, TERN_DT_BF16, 1, 1, 70, 256, 40, 0, 302, &rounded);
        CHECK(!rounded, "a precise weight took the bf16 GEMM");
        double e4 = bf16_case(fast, ref, TERN_DT_F32, 0, 2, 40, 70, 27, 3, 303, &rounded);
        double e5 = bf16_case(fast, ref, TERN_DT_BF16, 0, 1, 70, 256, 8, 0, 304, &rounded);
        double e6 = bf16_case(fast, ref, TERN_DT_BF16, 0, 1, 70, 600, 1100, 0, 305, &rounded); /* 3 blocks of x rows */
        CHECK(e1 <= TOL && e2 <= TOL && e3 <= TOL && e4 <= TOL && e5 <= TOL && e6 <= TOL,
              "bf16 mode %dt: %.3g %.3g %.3g %.3g %.3g %.3g", nth, e1, e2, e3, e4, e5, e6);
        /* routed experts in the bf16 mode: x rounded in gate/up and in down; vs the exact result */
        int E = 4, H = 96, I = 160, k = 2;
        kt_weight g, u, d;
        kt_weight_make(&g, TERN_DT_BF16, 0, 32, TERN_DT_BF16, E, I, H, 0, 310);
        kt_weight_make(&u, TERN_DT_BF16, 0, 32, TERN_DT_BF16, E, I, H, 0, 311);
        kt_weight_make(&d, TERN_DT_BF16, 0, 32, TERN_DT_BF16, E, H, I, 0, 312);
        kt_moe m;
        kt_moe_make(&m, ref, 48, H, I, E, k, &g, &u, &d, 313, 314);
        double em = kt_moe_run(&m, fast);
        printf("  bf16 mode %dt: routed experts (48 rows) rel L2 vs exact x %.3g\n", nth, em);
        CHECK(em > 0 && em <= 4e-3, "bf16 mode %dt: moe rel err %.3g (bf16 x: ~1e-3 expected, not 0)", nth, em);
        kt_moe_free(&m);
        kt_weight_free(&g); kt_weight_free(&u); kt_weight_free(&d);
        tern_backend_close(fast);
    }
    tern_backend_close(ref);
}

int main(void) {
    if (kt_isa_ok("avx2")) { RUN(gemm_grid_avx2); RUN(gemm_big_avx2); }
    else SKIP("gemm_avx2", "CPU lacks AVX2/FMA/F16C");
    if (kt_isa_ok("avx512")) { RUN(gemm_grid_avx512); RUN(gemm_big_avx512); }
    else SKIP("gemm_avx512", "CPU lacks AVX-512");
    if (kt_isa_ok("avx2")) RUN(gemm_moe);
    if (kt_isa_ok("avx512") && __builtin_cpu_supports("avx512bf16")) RUN(gemm_bf16_mode);
    else SKIP("gemm_bf16_mode", "CPU lacks AVX512-BF16");
    return test_done();
}
