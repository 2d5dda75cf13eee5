/* test_kern_gemv.c — the fused batch-1 GEMV kernels (gemv_avx512.c, gemv_avx2.c) vs the
 * scalar reference: every format they take (bf16, q8, q4) × group sizes × scale dtypes ×
 * row lengths that hit one slice, several slices and half-chunk tails × row counts that use
 * every 1..4-row kernel; the expert/MoE accumulate path; the opt-in int8-activation mode
 * against its stated error bound (and the default Q4 int8 kernel bitwise against the former one); the AVX-512 opt-outs kept for before/after A/Bs (the 4-row
 * BF16 and Q4 int8 kernels, TERN_CPU_BF16_X4=1 / TERN_CPU_Q4_SEQ=0) under the same checks; and the pool-split elementwise ops, rope and rmsnorm at
 * prefill sizes (bitwise equal to the reference). */
#include "test_kern_util.h"
#include "backend/cpu/kern.h"

#include <math.h>
#include <unistd.h>

/* Exact kinds: |y - y_ref| per output, relative to Σ_t |w_t·x_t| (the scale of f32 rounding
 * in a dot product; a plain relative error is meaningless for outputs that cancel to ~0).
 * Worst-case summation bounds are ~n·2^-24; observed values are ~1e-7. */
#define TOL 1e-6

static double gemv_err(tern_backend *fast, tern_backend *ref, tern_dtype dt, int bits, int gs, tern_dtype sdt, int out,
                       int in, unsigned long long seed) {
    kt_weight w;
    kt_weight_make(&w, dt, bits, gs, sdt, 1, out, in, 0, seed);
    float *x = kt_randv((size_t)in, seed + 1, 1.0f);
    float *y0 = calloc((size_t)out, sizeof *y0), *y1 = calloc((size_t)out, sizeof *y1);
    ref->vt->matmul(ref, y0, x, 1, &w.t);
    fast->vt->matmul(fast, y1, x, 1, &w.t);
    float *row = malloc(sizeof(float) * (size_t)in);
    double e = 0;
    for (int o = 0; o < out; o++) {
        tern_tensor_row_f32(&w.t, o, row);
        double mag = 0;
        for (int t = 0; t < in; t++) mag += fabs((double)row[t] * x[t]);
        double r = fabs((double)y1[o] - y0[o]) / (mag > 0 ? mag : 1);
        if (!(r <= e)) e = r; /* NaN-propagating max */
    }
    free(row); free(x); free(y0); free(y1);
    kt_weight_free(&w);
    return e;
}

static double worst_seen;

static void grid(const char *isa) {
    worst_seen = 0;
    static const int ins[] = {64, 192, 640, 4096 + 64, 8192 + 128};
    static const int outs[] = {1, 2, 3, 5, 8, 9, 31};
    static const int gss[] = {32, 64, 128};
    static const tern_dtype sdts[] = {TERN_DT_BF16, TERN_DT_F16, TERN_DT_F32};
    for (int nth = 1; nth <= 2; nth++) {
        tern_backend *fast = kt_open_cpu(isa, nth), *ref = kt_open_ref();
        unsigned long long seed = 500 + (unsigned long long)nth;
        for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
            for (size_t o = 0; o < TERN_ARRAY_LEN(outs); o++) {
                double e = gemv_err(fast, ref, TERN_DT_BF16, 0, 0, 0, outs[o], ins[i], seed++);
                if (e > worst_seen) worst_seen = e;
                CHECK(e <= TOL, "%s th%d bf16 out=%d in=%d: %.3g", isa, nth, outs[o], ins[i], e);
                for (int bits = 4; bits <= 8; bits += 4)
                    for (size_t g = 0; g < TERN_ARRAY_LEN(gss); g++) {
                        if (ins[i] % gss[g]) continue;
                        tern_dtype sdt = sdts[seed % 3];
                        e = gemv_err(fast, ref, TERN_DT_Q, bits, gss[g], sdt, outs[o], ins[i], seed++);
                        if (e > worst_seen) worst_seen = e;
                        CHECK(e <= TOL, "%s th%d q%d g%d %s out=%d in=%d: %.3g", isa, nth, bits, gss[g],
                              tern_dtype_name(sdt), outs[o], ins[i], e);
                    }
            }
        tern_backend_close(fast);
        tern_backend_close(ref);
    }
    printf("  %s: worst |y - y_ref| / sum|w x| = %.3g\n", isa, worst_seen);
}

TEST(gemv_avx512) { grid("avx512"); }
TEST(gemv_avx512_bf16_x4) { /* the former 4-row BF16 kernel (TERN_CPU_BF16_X4=1) */
    tern__cpu_bf16_x4_set(1);
    grid("avx512");
    tern__cpu_bf16_x4_set(-1);
}
TEST(gemv_avx2) { grid("avx2"); }

/* n = 1 through matmul_expert (strided expert views) and moe_mlp (accumulate with weights) */
TEST(gemv_expert_and_moe) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    if (!kt_isa_ok("avx512")) { tern_backend_close(fast); fast = kt_open_cpu("avx2", 2); }
    int E = 4, H = 256, I = 192;
    struct { tern_dtype dt; int bits, gs; } cf[] = {{TERN_DT_Q, 4, 64}, {TERN_DT_Q, 8, 32}, {TERN_DT_BF16, 0, 0}};
    for (size_t c = 0; c < TERN_ARRAY_LEN(cf); c++) {
        kt_weight g, u, d;
        kt_weight_make(&g, cf[c].dt, cf[c].bits, cf[c].gs, TERN_DT_BF16, E, I, H, 3, 40 + c);
        kt_weight_make(&u, cf[c].dt, cf[c].bits, cf[c].gs, TERN_DT_BF16, E, I, H, 0, 50 + c);
        kt_weight_make(&d, cf[c].dt, cf[c].bits, cf[c].gs, TERN_DT_BF16, E, H, I, 1, 60 + c);
        float *x = kt_randv((size_t)H, 7 + c, 1.0f);
        float y0[256], y1[256], *s0 = malloc(sizeof(float) * 2 * I * 2), *s1 = malloc(sizeof(float) * 2 * I * 2);
        for (int e = 0; e < E; e++) {
            ref->vt->matmul_expert(ref, y0, x, 1, &g.t, e);
            fast->vt->matmul_expert(fast, y1, x, 1, &g.t, e);
            CHECK(test_rel_l2(y1, y0, (size_t)I) <= TOL, "expert %d cfg %zu: %.3g", e, c, test_rel_l2(y1, y0, (size_t)I));
        }
        int32_t idx[2] = {3, 1};
        float wts[2] = {0.7f, 0.3f};
        ref->vt->moe_mlp(ref, y0, x, 1, H, idx, wts, 2, &g.t, &u.t, &d.t, TERN_ACT_SILU, s0);
        fast->vt->moe_mlp(fast, y1, x, 1, H, idx, wts, 2, &g.t, &u.t, &d.t, TERN_ACT_SILU, s1);
        CHECK(test_rel_l2(y1, y0, (size_t)H) <= 1e-5, "moe cfg %zu: %.3g", c, test_rel_l2(y1, y0, (size_t)H));
        free(x); free(s0); free(s1);
        kt_weight_free(&g); kt_weight_free(&u); kt_weight_free(&d);
    }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

/* q code t of a row (MLX packing: little-endian bit stream) */
static unsigned qcode(const uint8_t *row, int bits, int t) {
    return bits == 8 ? row[t] : (row[t / 2] >> (4 * (t & 1))) & 15u;
}

/* The former default Q4 int8 kernel (k_q4i8s, TERN_CPU_Q4_SEQ=4) is k_q4i8r's sums reordered only in time: bitwise
 * the same y, through the backend's matmul (decode driver, 1 and 2 threads), for every group size (64: the masked
 * broadcast path, 128: the broadcast, 32: the permute), scale dtype, slices (in > 64·gs), half-chunk tails and row
 * counts. (The default since session 50, k_q4i8g, sums per group first: its own order, the one the several-x kernels
 * share — test_kern_decode decode_several_rows / decode_x_lanes — within the int8 bound of gemv_int8_bound.) */
TEST(q4i8_kernels_bitwise) {
    if (!kt_isa_ok("avx512")) { SKIP("q4i8_kernels_bitwise", "needs AVX-512"); return; }
    static const int gss[] = {32, 64, 128};
    static const tern_dtype sdts[] = {TERN_DT_BF16, TERN_DT_F16, TERN_DT_F32};
    static const int ins[] = {128, 192, 640, 2048, 4096 + 64, 8192 + 128, 8192 + 384};
    static const int outs[] = {1, 3, 5, 37};
    int runs = 0, diff = 0;
    for (int nth = 1; nth <= 2; nth++) {
        tern_backend *fast = kt_open_cpu("avx512", nth);
        tern_backend_cpu_set_int8(fast, 1);
        unsigned long long seed = 700 + (unsigned long long)nth;
        for (size_t g = 0; g < TERN_ARRAY_LEN(gss); g++)
            for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
                for (size_t o = 0; o < TERN_ARRAY_LEN(outs); o++) {
                    int gs = gss[g], in = ins[i], out = outs[o];
                    if (in % gs) continue;
                    tern_dtype sdt = sdts[seed % 3];
                    kt_weight w;
                    kt_weight_make(&w, TERN_DT_Q, 4, gs, sdt, 1, out, in, 0, seed++);
                    float *x = kt_randv((size_t)in, seed++, 2.0f);
                    x[in / 3] = -11.0f;
                    float *ya = calloc((size_t)out, sizeof *ya), *yb = calloc((size_t)out, sizeof *yb);
                    tern__cpu_q4_seq_set(3);
                    fast->vt->matmul(fast, ya, x, 1, &w.t);
                    tern__cpu_q4_seq_set(4);
                    fast->vt->matmul(fast, yb, x, 1, &w.t);
                    runs++;
                    if (memcmp(ya, yb, (size_t)out * sizeof *ya)) {
                        diff++;
                        CHECK(0, "th%d q4 g%d %s out=%d in=%d: k_q4i8s differs from k_q4i8r (%.9g vs %.9g)", nth, gs,
                              tern_dtype_name(sdt), out, in, yb[0], ya[0]);
                    }
                    free(x); free(ya); free(yb);
                    kt_weight_free(&w);
                }
        tern_backend_close(fast);
    }
    tern__cpu_q4_seq_set(-1);
    CHECK(runs > 100 && diff == 0, "%d of %d shapes differ", diff, runs);
    printf("  q4 int8: k_q4i8s (former default) == k_q4i8r bitwise over %d shapes\n", runs);
}

/* Int8 mode: |y - y_exact| <= ½ Σ_g d_g Σ_{t∈g} |s_g|·|q_t - C| (C = 8 or 128), d_g = max_{t∈g}|x_t|/127 (plus f32
 * rounding, bounded here by 1e-5·Σ|w·x|). Also prints the typical relative error. */
TEST(gemv_int8_bound) {
    if (!kt_isa_ok("avx512")) { SKIP("gemv_int8_bound", "needs AVX-512"); return; }
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    tern_backend_cpu_set_int8(fast, 1);
    static const int gss[] = {32, 64, 128};
    double worst_rel = 0;
    /* Q4 int8 (TERN_CPU_Q4_SEQ): 4 k_q4i8s (sessions 21-49), 3 k_q4i8r (sessions 19-20), 2 k_q4i8r with the L2
     * prefetch, 1 k_q4i8g (default), 0 the 4-row kernel; 4, 3 and 2 give bitwise the same results (checked below and
     * in q4i8_kernels_bitwise) */
    for (int seq = 4; seq >= 0; seq--)
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t g = 0; g < TERN_ARRAY_LEN(gss); g++) {
            tern__cpu_q4_seq_set(seq);
            int gs = gss[g], in = 4096 + (gs == 128 ? 384 : 192), out = 37; /* q4 g<=64: half-chunk tail */
            kt_weight w;
            kt_weight_make(&w, TERN_DT_Q, bits, gs, TERN_DT_BF16, 1, out, in, 0, 90 + bits + g);
            float *x = kt_randv((size_t)in, 91 + g, 2.0f);
            x[5] = 9.0f; /* an outlier: coarser steps for its group */
            float *y0 = calloc((size_t)out, sizeof *y0), *y1 = calloc((size_t)out, sizeof *y1);
            ref->vt->matmul(ref, y0, x, 1, &w.t);
            fast->vt->matmul(fast, y1, x, 1, &w.t);
            if (seq == 2 && bits == 4) { /* the prefetch hint changes the access order only */
                float *y2 = calloc((size_t)out, sizeof *y2);
                tern__cpu_q4_seq_set(4);
                fast->vt->matmul(fast, y2, x, 1, &w.t);
                tern__cpu_q4_seq_set(seq);
                CHECK(!memcmp(y1, y2, (size_t)out * sizeof *y1), "q4 g%d: the L2-prefetch variant differs from k_q4i8s", gs);
                free(y2);
            }
            size_t rb = tern_tensor_row_bytes(&w.t);
            int ng = in / gs, bad = 0;
            for (int o = 0; o < out; o++) {
                const uint8_t *row = (const uint8_t *)w.t.data + (size_t)o * rb;
                double bound = 0, mag = 0;
                for (int k = 0; k < ng; k++) {
                    float amax = 0;
                    for (int t = k * gs; t < (k + 1) * gs; t++) amax = fmaxf(amax, fabsf(x[t]));
                    float s = tern_load_f32(w.t.scales, TERN_DT_BF16, (size_t)o * ng + k);
                    float b = tern_load_f32(w.t.biases, TERN_DT_BF16, (size_t)o * ng + k);
                    double sq = 0;
                    for (int t = k * gs; t < (k + 1) * gs; t++) {
                        unsigned q = qcode(row, bits, t);
                        sq += fabs((double)s) * fabs((double)q - (bits == 4 ? 8.0 : 128.0));
                        mag += fabs(((double)s * q + b) * x[t]);
                    }
                    bound += 0.5 * amax / 127.0 * sq;
                }
                double diff = fabs((double)y1[o] - y0[o]);
                if (!(diff <= bound * 1.001 + 1e-5 * mag)) bad++;
            }
            double rel = test_rel_l2(y1, y0, (size_t)out);
            if (rel > worst_rel) worst_rel = rel;
            CHECK(bad == 0, "q%d g%d seq %d: %d of %d outputs outside the int8 bound (rel err %.3g)", bits, gs, seq, bad, out,
                  rel);
            free(x); free(y0); free(y1);
            kt_weight_free(&w);
        }
    tern__cpu_q4_seq_set(-1);
    printf("  int8 mode: worst relative L2 error vs exact %.3g\n", worst_rel);
    /* switching back gives the exact path again */
    tern_backend_cpu_set_int8(fast, 0);
    double e = gemv_err(fast, ref, TERN_DT_Q, 4, 64, TERN_DT_BF16, 9, 512, 3);
    CHECK(e <= TOL, "exact after int8 off: %.3g", e);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

/* bf16(v), round to nearest even (finite v) */
static float bf16_rne(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

/* The bf16 mode's GEMV (vdpbf16ps on x rounded to bf16): per output within f32 summation error of Σ w·bf16(x) in
 * double, |y - y_ref| <= 1e-6·Σ|w·x̂|, over row lengths with and without a 64-input tail and 1..31 rows; weights
 * marked precise keep the exact kernel (the f32 result, bitwise). */
TEST(gemv_bf16_mode) {
    if (!kt_isa_ok("avx512") || !__builtin_cpu_supports("avx512bf16")) { SKIP("gemv_bf16_mode", "needs AVX512-BF16"); return; }
    tern_backend *fast = kt_open_cpu("avx512", 2), *exact = kt_open_cpu("avx512", 2);
    tern_backend_cpu_set_bf16(fast, 1);
    static const int ins[] = {64, 192, 640, 4096 + 64};
    static const int outs[] = {1, 3, 5, 9, 31};
    double worst = 0, moved = 0;
    unsigned long long seed = 700;
    for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
        for (size_t o = 0; o < TERN_ARRAY_LEN(outs); o++) {
            const int in = ins[i], out = outs[o];
            kt_weight w;
            kt_weight_make(&w, TERN_DT_BF16, 0, 0, 0, 1, out, in, 0, seed++);
            float *x = kt_randv((size_t)in, seed++, 1.0f), *row = malloc(sizeof(float) * (size_t)in);
            float *y = calloc((size_t)out, sizeof *y), *ye = calloc((size_t)out, sizeof *ye), *yp = calloc((size_t)out, sizeof *yp);
            fast->vt->matmul(fast, y, x, 1, &w.t);
            exact->vt->matmul(exact, ye, x, 1, &w.t);
            w.t.precise = 1;
            fast->vt->matmul(fast, yp, x, 1, &w.t);
            CHECK(!memcmp(yp, ye, (size_t)out * sizeof *y), "bf16 mode in=%d out=%d: a precise weight did not keep the exact kernel", in, out);
            for (int r = 0; r < out; r++) {
                tern_tensor_row_f32(&w.t, r, row);
                double ref = 0, mag = 0;
                for (int t = 0; t < in; t++) {
                    ref += (double)row[t] * bf16_rne(x[t]);
                    mag += fabs((double)row[t] * bf16_rne(x[t]));
                }
                double e = fabs((double)y[r] - ref) / (mag > 0 ? mag : 1);
                if (!(e <= worst)) worst = e;
                double m = fabs((double)y[r] - ye[r]) / (mag > 0 ? mag : 1);
                if (m > moved) moved = m;
            }
            CHECK(worst <= TOL, "bf16 mode in=%d out=%d: |y - Σ w·bf16(x)| / Σ|w·x̂| = %.3g", in, out, worst);
            free(x); free(row); free(y); free(ye); free(yp);
            kt_weight_free(&w);
        }
    printf("  bf16 mode: worst |y - y_ref(bf16 x)| / sum|w x| = %.3g; from the exact f32 result up to %.3g\n", worst, moved);
    tern_backend_close(fast);
    tern_backend_close(exact);
}

/* Prefill-sized elementwise ops, rope and rmsnorm run split over the pool: results must be
 * bitwise those of the reference (same formula per element). */
TEST(parallel_elementwise_bitwise) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    int n = 40, nh = 8, d = 256;
    size_t N = (size_t)n * nh * d;
    float *a = kt_randv(N, 11, 2.0f), *b = kt_randv(N, 12, 2.0f), *w = kt_randv((size_t)d * nh, 13, 1.0f);
    float *y0 = malloc(sizeof(float) * N), *y1 = malloc(sizeof(float) * N);
    int32_t pos[40];
    for (int i = 0; i < n; i++) pos[i] = i * 37;
    float inv[128];
    for (int i = 0; i < 128; i++) inv[i] = powf(10000.0f, -(float)i / 128.0f);
#define BITWISE(what) CHECK(!memcmp(y0, y1, sizeof(float) * N), "%s differs", what)
    ref->vt->add(ref, y0, a, b, N); fast->vt->add(fast, y1, a, b, N); BITWISE("add");
    ref->vt->mul(ref, y0, a, b, N); fast->vt->mul(fast, y1, a, b, N); BITWISE("mul");
    ref->vt->scale(ref, y0, a, 0.3f, N); fast->vt->scale(fast, y1, a, 0.3f, N); BITWISE("scale");
    /* silu, gelu and softcap run the vector exp / tanh (kern_avx512.c; within 3e-7 of libm, test_kern_ops): the
     * split over threads is bitwise one thread's, and near the reference */
    tern_backend *one = kt_open_cpu("avx512", 1);
    one->vt->silu_mul(one, y0, a, b, N); fast->vt->silu_mul(fast, y1, a, b, N); BITWISE("silu");
    ref->vt->silu_mul(ref, y0, a, b, N);
    CHECK(test_rel_l2(y1, y0, N) <= 1e-6, "silu vs reference %.3g", test_rel_l2(y1, y0, N));
    one->vt->gelu_tanh_mul(one, y0, a, b, N); fast->vt->gelu_tanh_mul(fast, y1, a, b, N); BITWISE("gelu");
    ref->vt->gelu_tanh_mul(ref, y0, a, b, N);
    CHECK(test_rel_l2(y1, y0, N) <= 1e-6, "gelu vs reference %.3g", test_rel_l2(y1, y0, N));
    memcpy(y0, a, sizeof(float) * N); memcpy(y1, a, sizeof(float) * N);
    one->vt->softcap(one, y0, N, 3.0f); fast->vt->softcap(fast, y1, N, 3.0f); BITWISE("softcap");
    memcpy(y0, a, sizeof(float) * N);
    ref->vt->softcap(ref, y0, N, 3.0f);
    CHECK(test_rel_l2(y1, y0, N) <= 1e-6, "softcap vs reference %.3g", test_rel_l2(y1, y0, N));
    tern_backend_close(one);
    memcpy(y0, a, sizeof(float) * N); memcpy(y1, a, sizeof(float) * N);
    ref->vt->rope(ref, y0, n, nh, d, pos, inv, 1.1f); fast->vt->rope(fast, y1, n, nh, d, pos, inv, 1.1f); BITWISE("rope rows");
    memcpy(y0, a, sizeof(float) * N); memcpy(y1, a, sizeof(float) * N);
    ref->vt->rope(ref, y0, 1, n * nh, d, pos + 3, inv, 1.0f); fast->vt->rope(fast, y1, 1, n * nh, d, pos + 3, inv, 1.0f);
    BITWISE("rope heads");
    ref->vt->add_bias(ref, y0, w, n * nh / 8, d * 8); fast->vt->add_bias(fast, y1, w, n * nh / 8, d * 8); BITWISE("add_bias");
    ref->vt->copy_cols(ref, y0, a, n, 1000, nh * d, 7); fast->vt->copy_cols(fast, y1, a, n, 1000, nh * d, 7);
    CHECK(!memcmp(y0, y1, sizeof(float) * (size_t)n * 1000), "copy_cols differs");
    ref->vt->rmsnorm(ref, y0, a, n * nh, d, w, 1e-6f); fast->vt->rmsnorm(fast, y1, a, n * nh, d, w, 1e-6f);
    CHECK(test_rel_l2(y1, y0, N) <= 1e-6, "rmsnorm %.3g", test_rel_l2(y1, y0, N));
    free(a); free(b); free(w); free(y0); free(y1);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(probe_size_exceeds_llc) {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t b = tern_membw_default_bytes();
    CHECK(b >= ((size_t)64 << 20) && b <= ((size_t)2 << 30), "default probe bytes %zu", b);
    if (l3 > 0 && 2 * (size_t)l3 <= ((size_t)2 << 30)) CHECK(b >= 2 * (size_t)l3, "probe %zu < 2 x L3 %ld", b, l3);
    tern_membw_close(NULL);
    CHECK(tern_membw_run(NULL) == 0.0 && tern_membw_bytes(NULL) == 0, "NULL probe");
}

int main(void) {
    if (kt_isa_ok("avx512")) {
        RUN(gemv_avx512);
        RUN(gemv_avx512_bf16_x4);
    } else {
        SKIP("gemv_avx512", "CPU lacks AVX-512 (F/BW/VL/VBMI)");
    }
    if (kt_isa_ok("avx2")) RUN(gemv_avx2);
    else SKIP("gemv_avx2", "CPU lacks AVX2/FMA/F16C");
    RUN(gemv_expert_and_moe);
    RUN(gemv_int8_bound);
    RUN(gemv_bf16_mode);
    RUN(q4i8_kernels_bitwise);
    RUN(parallel_elementwise_bitwise);
    RUN(probe_size_exceeds_llc);
    return test_done();
}
