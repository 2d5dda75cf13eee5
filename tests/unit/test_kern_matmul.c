/* test_kern_matmul.c — fast CPU matmul / matmul_expert / embed vs the scalar reference,
 * at every ISA level this machine has, over dtypes × shapes × MLX quantization formats. */
#include "test_kern_util.h"

/* Compare matmul (E == 1) or matmul_expert (E > 1, every expert) for one weight config. */
static double check_one(tern_backend *fast, tern_backend *ref, tern_dtype dt, int bits, int gs, tern_dtype sdt,
                        int E, int out, int in, int n, int pad, unsigned long long seed) {
    kt_weight w;
    kt_weight_make(&w, dt, bits, gs, sdt, E, out, in, pad, seed);
    double worst = kt_matmul_worst(fast, ref, &w.t, E, out, in, n, seed + 1);
    kt_weight_free(&w);
    return worst;
}

#define TOL 3e-6

static void grid_float(const char *isa) {
    tern_backend *fast = kt_open_cpu(isa, 2), *ref = kt_open_ref();
    static const tern_dtype dts[] = {TERN_DT_F32, TERN_DT_F16, TERN_DT_BF16, TERN_DT_F8_E4M3};
    static const int ins[] = {1, 7, 16, 33, 100, 515, 1031};
    static const int ns[] = {1, 2, 3, 4, 5, 8, 9, 17};
    unsigned long long seed = 1;
    for (size_t d = 0; d < TERN_ARRAY_LEN(dts); d++)
        for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
            for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++) {
                int out = 1 + (int)((seed * 37) % 45);
                double err = check_one(fast, ref, dts[d], 0, 0, 0, 1, out, ins[i], ns[k], 0, seed++);
                CHECK(err <= TOL, "%s %s out=%d in=%d n=%d: rel err %.3g", isa, tern_dtype_name(dts[d]), out, ins[i], ns[k], err);
            }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

static void grid_quant(const char *isa) {
    tern_backend *fast = kt_open_cpu(isa, 2), *ref = kt_open_ref();
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    static const int gss[] = {32, 64, 128};
    static const tern_dtype sdts[] = {TERN_DT_BF16, TERN_DT_F16, TERN_DT_F32};
    static const int ns[] = {1, 3, 4, 9, 17};
    unsigned long long seed = 100;
    for (size_t b = 0; b < TERN_ARRAY_LEN(bitss); b++)
        for (size_t g = 0; g < TERN_ARRAY_LEN(gss); g++)
            for (size_t s = 0; s < TERN_ARRAY_LEN(sdts); s++) {
                int n = ns[seed % TERN_ARRAY_LEN(ns)];
                int in = gss[g] * (1 + (int)(seed % 9)); /* 1..9 groups: not a multiple of 512 */
                int out = 3 + (int)((seed * 13) % 40);
                double err = check_one(fast, ref, TERN_DT_Q, bitss[b], gss[g], sdts[s], 1, out, in, n, 0, seed++);
                CHECK(err <= TOL, "%s q%d g%d %s out=%d in=%d n=%d: rel err %.3g", isa, bitss[b], gss[g],
                      tern_dtype_name(sdts[s]), out, in, n, err);
            }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(matmul_float_scalar) { grid_float("scalar"); }
TEST(matmul_float_avx2) { grid_float("avx2"); }
TEST(matmul_float_avx512) { grid_float("avx512"); }
TEST(matmul_quant_scalar) { grid_quant("scalar"); }
TEST(matmul_quant_avx2) { grid_quant("avx2"); }
TEST(matmul_quant_avx512) { grid_quant("avx512"); }

TEST(matmul_large_in_and_n) {
    tern_backend *fast = kt_open_cpu("avx512", 0), *ref = kt_open_ref();
    double e1 = check_one(fast, ref, TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 70, 2048 + 64, 33, 0, 7);
    double e2 = check_one(fast, ref, TERN_DT_BF16, 0, 0, 0, 1, 67, 1500, 40, 0, 8);
    double e3 = check_one(fast, ref, TERN_DT_F32, 0, 0, 0, 1, 130, 600, 1, 0, 9);
    CHECK(e1 <= TOL && e2 <= TOL && e3 <= TOL, "errs %.3g %.3g %.3g", e1, e2, e3);
    /* the fused 4-bit GEMV (n = 1) over every group size and scale dtype, in > one slice */
    static const tern_dtype sdts[] = {TERN_DT_BF16, TERN_DT_F16, TERN_DT_F32};
    for (int gs = 32; gs <= 128; gs *= 2)
        for (int s = 0; s < 3; s++) {
            double e = check_one(fast, ref, TERN_DT_Q, 4, gs, sdts[s], 1, 37, 1536 + gs, 1, 0, (unsigned long long)(gs + s));
            CHECK(e <= TOL, "q4 gemv gs=%d %s: %.3g", gs, tern_dtype_name(sdts[s]), e);
        }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(matmul_expert_strided_views) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    double e1 = check_one(fast, ref, TERN_DT_Q, 4, 32, TERN_DT_BF16, 3, 21, 96, 2, 5, 11);
    double e2 = check_one(fast, ref, TERN_DT_BF16, 0, 0, 0, 4, 19, 40, 1, 3, 12);
    double e3 = check_one(fast, ref, TERN_DT_Q, 3, 64, TERN_DT_F16, 2, 9, 128, 6, 2, 13);
    CHECK(e1 <= TOL && e2 <= TOL && e3 <= TOL, "errs %.3g %.3g %.3g", e1, e2, e3);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(embed_all_dtypes) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    int32_t ids[5] = {0, 6, 3, -1, 99};
    struct { tern_dtype dt; int bits, gs; } cf[] = {{TERN_DT_F32, 0, 0}, {TERN_DT_BF16, 0, 0}, {TERN_DT_F16, 0, 0},
                                                   {TERN_DT_Q, 4, 64}, {TERN_DT_Q, 6, 32}, {TERN_DT_Q, 8, 128}};
    for (size_t c = 0; c < TERN_ARRAY_LEN(cf); c++) {
        kt_weight w;
        int H = 256;
        kt_weight_make(&w, cf[c].dt, cf[c].bits, cf[c].gs, TERN_DT_BF16, 1, 7, H, 0, 20 + c);
        float y0[5 * 256], y1[5 * 256];
        ref->vt->embed(ref, y0, ids, 5, &w.t, 1.5f);
        fast->vt->embed(fast, y1, ids, 5, &w.t, 1.5f);
        CHECK(!memcmp(y0, y1, sizeof y0), "embed %s differs", tern_dtype_name(cf[c].dt));
        kt_weight_free(&w);
    }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(upload_weight_rejects_bad_formats) {
    tern_backend *fast = kt_open_cpu("scalar", 1);
    kt_weight w;
    tern_error e = {0};
    kt_weight_make(&w, TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 4, 128, 0, 1);
    CHECK(fast->vt->upload_weight(fast, &w.t, &e) == TERN_OK, "%s", e.msg);
    w.t.bits = 7;
    CHECK(fast->vt->upload_weight(fast, &w.t, &e) == TERN_EUNSUPPORTED, "7 bits accepted");
    w.t.bits = 4; w.t.group_size = 48;
    CHECK(fast->vt->upload_weight(fast, &w.t, &e) == TERN_EUNSUPPORTED, "gs 48 accepted");
    w.t.dtype = TERN_DT_I32;
    CHECK(fast->vt->upload_weight(fast, &w.t, &e) == TERN_EUNSUPPORTED && strstr(e.msg, "test"), "%s", e.msg);
    kt_weight_free(&w);
    tern_backend_close(fast);
}

int main(void) {
    RUN(matmul_float_scalar);
    RUN(matmul_quant_scalar);
    if (kt_isa_ok("avx2")) { RUN(matmul_float_avx2); RUN(matmul_quant_avx2); }
    else SKIP("matmul_avx2", "CPU lacks AVX2/FMA/F16C");
    if (kt_isa_ok("avx512")) { RUN(matmul_float_avx512); RUN(matmul_quant_avx512); }
    else SKIP("matmul_avx512", "CPU lacks AVX-512 (F/BW/VL/VBMI)");
    RUN(matmul_large_in_and_n);
    RUN(matmul_expert_strided_views);
    RUN(embed_all_dtypes);
    RUN(upload_weight_rejects_bad_formats);
    return test_done();
}
