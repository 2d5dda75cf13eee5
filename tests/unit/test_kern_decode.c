/* test_kern_decode.c — the batch-1 driver of the fast CPU backend (cpu_decode.c): matmul,
 * matmul_n, matmul_glu and matmul_add at n = 1 must be bitwise the separate ops of the same
 * backend with the driver off (tern__cpu_dec_set(0): per-matrix pool runs, then add /
 * silu_mul / gelu_tanh_mul), for every fused format, exact and int8 mode, at 1-3 threads
 * (3 threads on a 2-core machine makes the work stealing run), matmul_glu in both chunk orders
 * (tern__cpu_glu_split_set), with several rows of x bitwise each row alone (matmul_expert too: cpu_matmul.c's
 * gemv_nx path), and must decline (return 0,
 * write nothing) what it does not take. */
#include "backend/cpu/cpu_impl.h"
#include "test_kern_util.h"

#include <string.h>

typedef struct fmt { tern_dtype dt; int bits, gs; tern_dtype sdt; const char *name; } fmt;

static const fmt fmts[] = {
    {TERN_DT_BF16, 0, 0, 0, "bf16"},
    {TERN_DT_Q, 8, 64, TERN_DT_BF16, "q8g64"},
    {TERN_DT_Q, 4, 64, TERN_DT_BF16, "q4g64"},
    {TERN_DT_Q, 4, 32, TERN_DT_F16, "q4g32f16"},
    {TERN_DT_Q, 8, 128, TERN_DT_F32, "q8g128f32"},
    {TERN_DT_Q, 4, 128, TERN_DT_F32, "q4g128f32"},
};

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof *a); }

static float *nanv(size_t n) {
    float *v = malloc(n * sizeof *v + 64);
    for (size_t i = 0; i < n; i++) v[i] = NAN;
    return v;
}

/* One format, shape and mode on backend be: every fused op vs the separate ops. */
static void check_ops(tern_backend *be, const fmt *f, int in, const int *outs, int int8, unsigned long long seed,
                      const char *tag) {
    const tern_backend_vt *op = be->vt;
    kt_weight w[3];
    for (int i = 0; i < 3; i++) kt_weight_make(&w[i], f->dt, f->bits, f->gs, f->sdt, 1, outs[i], in, 0, seed + (unsigned)i);
    float *x = kt_randv((size_t)in, seed + 7, 1.0f);
    tern_backend_cpu_set_int8(be, int8);
    const char *m = int8 ? "int8" : "exact";
    /* matmul */
    float *a = nanv((size_t)outs[0]), *b = nanv((size_t)outs[0]);
    tern__cpu_dec_set(0);
    op->matmul(be, a, x, 1, &w[0].t);
    tern__cpu_dec_set(1);
    op->matmul(be, b, x, 1, &w[0].t);
    CHECK(same(a, b, (size_t)outs[0]), "%s %s %s in=%d out=%d: matmul differs from the per-matrix path", tag, f->name, m, in, outs[0]);
    /* matmul_n, k = 1..3 */
    for (int k = 1; k <= 3; k++) {
        float *ys0[3], *ys1[3];
        const tern_tensor *ws[3] = {&w[0].t, &w[1].t, &w[2].t};
        tern__cpu_dec_set(0);
        for (int i = 0; i < k; i++) { ys0[i] = nanv((size_t)outs[i]); ys1[i] = nanv((size_t)outs[i]); op->matmul(be, ys0[i], x, 1, ws[i]); }
        tern__cpu_dec_set(1);
        int done = op->matmul_n(be, k, ys1, x, 1, ws);
        CHECK(done == 1, "%s %s %s: matmul_n k=%d not taken", tag, f->name, m, k);
        for (int i = 0; i < k; i++) {
            CHECK(same(ys0[i], ys1[i], (size_t)outs[i]), "%s %s %s in=%d: matmul_n k=%d matrix %d (out=%d) differs", tag, f->name, m,
                  in, k, i, outs[i]);
            free(ys0[i]);
            free(ys1[i]);
        }
    }
    /* matmul_add: y = y + x·Wᵀ */
    float *y0 = kt_randv((size_t)outs[0], seed + 9, 1.0f), *y1 = malloc((size_t)outs[0] * sizeof *y1), *o = nanv((size_t)outs[0]);
    memcpy(y1, y0, (size_t)outs[0] * sizeof *y1);
    tern__cpu_dec_set(0);
    op->matmul(be, o, x, 1, &w[0].t);
    op->add(be, y0, y0, o, (size_t)outs[0]);
    tern__cpu_dec_set(1);
    CHECK(op->matmul_add(be, y1, x, 1, &w[0].t) == 1, "%s %s %s: matmul_add not taken", tag, f->name, m);
    CHECK(same(y0, y1, (size_t)outs[0]), "%s %s %s in=%d out=%d: matmul_add differs from matmul + add", tag, f->name, m, in, outs[0]);
    /* matmul_glu (gate = w[0], up = a copy of the shape of w[0] with w[1]'s seed) */
    kt_weight up;
    kt_weight_make(&up, f->dt, f->bits, f->gs, f->sdt, 1, outs[0], in, 0, seed + 11);
    for (int act = 0; act < 2; act++) {
        int a_id = act ? TERN_ACT_GELU_TANH : TERN_ACT_SILU;
        float *g0 = nanv((size_t)outs[0]), *u0 = nanv((size_t)outs[0]), *g1 = nanv((size_t)outs[0]);
        tern__cpu_dec_set(0);
        op->matmul(be, g0, x, 1, &w[0].t);
        op->matmul(be, u0, x, 1, &up.t);
        if (act) op->gelu_tanh_mul(be, g0, g0, u0, (size_t)outs[0]);
        else op->silu_mul(be, g0, g0, u0, (size_t)outs[0]);
        tern__cpu_dec_set(1);
        for (int split = 0; split < 2; split++) { /* gate and up chunks interleaved, or gate's then up's */
            tern__cpu_glu_split_set(split);
            for (size_t r = 0; r < (size_t)outs[0]; r++) g1[r] = NAN;
            CHECK(op->matmul_glu(be, g1, x, 1, &w[0].t, &up.t, a_id) == 1, "%s %s %s: matmul_glu not taken", tag, f->name, m);
            CHECK(same(g0, g1, (size_t)outs[0]), "%s %s %s in=%d out=%d: matmul_glu (%s, %s) differs from matmul + %s", tag, f->name,
                  m, in, outs[0], act ? "gelu" : "silu", split ? "split" : "interleaved", act ? "gelu_tanh_mul" : "silu_mul");
        }
        tern__cpu_glu_split_set(-1);
        free(g0); free(u0); free(g1);
    }
    tern__cpu_dec_set(-1);
    tern_backend_cpu_set_int8(be, 0);
    kt_weight_free(&up);
    free(y0); free(y1); free(o); free(a); free(b); free(x);
    for (int i = 0; i < 3; i++) kt_weight_free(&w[i]);
}

static void fused_ops_on(tern_backend *be, const char *tag, int nth) {
    /* out: not multiples of the 64-row chunk; in·out from below to above the pool threshold */
    static const int outs_small[3] = {5, 3, 9}, outs_big[3] = {301, 37, 70}, outs_wide[3] = {64, 17, 130};
    for (size_t f = 0; f < TERN_ARRAY_LEN(fmts); f++)
        for (int int8 = 0; int8 < 2; int8++) {
            unsigned long long seed = 1000 * f + 10 * (unsigned)nth + (unsigned)int8;
            check_ops(be, &fmts[f], 256, outs_small, int8, seed, tag);
            check_ops(be, &fmts[f], 512, outs_big, int8, seed + 1, tag);
            check_ops(be, &fmts[f], 2048, outs_wide, int8, seed + 2, tag);
        }
}

TEST(decode_fused_ops_bitwise) { kt_each_cpu(fused_ops_on); }

/* Several rows of x in one call (a decode step of several sequences, up to tern__cpu_dec_rows): every op's row r is
 * bitwise the same op on row r alone — matmul, matmul_n (k = 3), matmul_add, matmul_glu in both chunk orders. */
static void several_rows(tern_backend *be, const fmt *f, int in, const int *outs, int mode, int nx, unsigned long long seed,
                         const char *tag) {
    const tern_backend_vt *op = be->vt;
    kt_weight w[3];
    for (int i = 0; i < 3; i++) kt_weight_make(&w[i], f->dt, f->bits, f->gs, f->sdt, 1, outs[i], in, 0, seed + (unsigned)i);
    const tern_tensor *ws[3] = {&w[0].t, &w[1].t, &w[2].t};
    float *x = kt_randv((size_t)nx * in, seed + 7, 1.0f), *y0 = kt_randv((size_t)nx * outs[0], seed + 9, 1.0f);
    float *a[3], *b[3];
    for (int i = 0; i < 3; i++) { a[i] = nanv((size_t)nx * outs[i]); b[i] = nanv((size_t)nx * outs[i]); }
    tern_backend_cpu_set_int8(be, mode == 1);
    tern_backend_cpu_set_bf16(be, mode == 2);
    const char *m = mode == 1 ? "int8" : mode == 2 ? "bf16" : "exact";
    for (int kind = 0; kind < 5; kind++) { /* matmul, matmul_n, matmul_add, glu interleaved, glu split */
        tern__cpu_glu_split_set(kind == 4);
        for (int i = 0; i < 3; i++)
            for (size_t e = 0; e < (size_t)nx * outs[i]; e++) a[i][e] = b[i][e] = NAN;
        memcpy(a[0], y0, (size_t)nx * outs[0] * sizeof *y0);
        memcpy(b[0], y0, (size_t)nx * outs[0] * sizeof *y0);
        int done = 1;
        for (int r = -1; r < nx; r++) { /* r = -1: all rows in one call (into b); then each row alone (into a) */
            const float *xr = x + (size_t)(r < 0 ? 0 : r) * in;
            const int n = r < 0 ? nx : 1;
            float *yr[3];
            for (int i = 0; i < 3; i++) yr[i] = r < 0 ? b[i] : a[i] + (size_t)r * outs[i];
            switch (kind) {
            case 0: op->matmul(be, yr[0], xr, n, ws[0]); break;
            case 1: done &= op->matmul_n(be, 3, yr, xr, n, ws) == 1; break;
            case 2: done &= op->matmul_add(be, yr[0], xr, n, ws[0]) == 1; break;
            default: done &= op->matmul_glu(be, yr[0], xr, n, ws[0], ws[0], kind == 3 ? TERN_ACT_SILU : TERN_ACT_GELU_TANH) == 1;
            }
        }
        static const char *const kn[5] = {"matmul", "matmul_n", "matmul_add", "matmul_glu silu", "matmul_glu gelu split"};
        CHECK(done, "%s %s %s n=%d: %s not taken", tag, f->name, m, nx, kn[kind]);
        for (int i = 0; i < (kind == 1 ? 3 : 1); i++)
            CHECK(same(a[i], b[i], (size_t)nx * outs[i]), "%s %s %s in=%d n=%d: %s matrix %d differs from its rows alone", tag,
                  f->name, m, in, nx, kn[kind], i);
    }
    tern__cpu_glu_split_set(-1);
    { /* matmul_expert (the fused GEMV of cpu_matmul.c, several x through gemv_nx): expert 2 of a 3-D stack */
        kt_weight we;
        kt_weight_make(&we, f->dt, f->bits, f->gs, f->sdt, 3, outs[0], in, 1, seed + 5);
        for (size_t e = 0; e < (size_t)nx * outs[0]; e++) a[0][e] = b[0][e] = NAN;
        op->matmul_expert(be, b[0], x, nx, &we.t, 2);
        for (int r = 0; r < nx; r++) op->matmul_expert(be, a[0] + (size_t)r * outs[0], x + (size_t)r * in, 1, &we.t, 2);
        CHECK(same(a[0], b[0], (size_t)nx * outs[0]), "%s %s %s in=%d n=%d: matmul_expert differs from its rows alone", tag,
              f->name, m, in, nx);
        kt_weight_free(&we);
    }
    tern_backend_cpu_set_int8(be, 0);
    tern_backend_cpu_set_bf16(be, 0);
    for (int i = 0; i < 3; i++) { free(a[i]); free(b[i]); kt_weight_free(&w[i]); }
    free(x); free(y0);
}

static void several_rows_on(tern_backend *be, const char *tag, int nth) {
    static const int outs_small[3] = {5, 3, 9}, outs_big[3] = {301, 37, 70};
    /* the several-x kernels take x in blocks of 4 (3 for BF16): full blocks, remainders, several blocks */
    static const int nxs[] = {2, 3, 4, 5, 7, TERN_CPU_DEC_NMAX};
    tern__cpu_dec_rows_set(TERN_CPU_DEC_NMAX);
    for (size_t f = 0; f < TERN_ARRAY_LEN(fmts); f++)
        for (int mode = 0; mode < 3; mode++) { /* exact, int8 (Q rows), bf16 (BF16 rows) */
            if (mode == 2 && fmts[f].dt != TERN_DT_BF16) continue;
            for (size_t i = 0; i < TERN_ARRAY_LEN(nxs); i++) {
                const int nx = nxs[i];
                unsigned long long seed = 3000 * f + 10 * (unsigned)nth + (unsigned)mode + 100 * (unsigned)nx;
                several_rows(be, &fmts[f], 256, outs_small, mode, nx, seed, tag);
                several_rows(be, &fmts[f], 512, outs_big, mode, nx, seed + 1, tag);
                if (nx <= 5) several_rows(be, &fmts[f], 2816, outs_small, mode, nx, seed + 2, tag); /* 5 x 512 + a tail */
                if (nx <= 5 && (!fmts[f].gs || 320 % fmts[f].gs == 0)) /* a half 128 chunk (whole groups only) */
                    several_rows(be, &fmts[f], 320, outs_small, mode, nx, seed + 3, tag);
            }
        }
    tern__cpu_dec_rows_set(-1);
}

TEST(decode_several_rows) { kt_each_cpu(several_rows_on); }

/* Q4 g64 int8 with x in the vector lanes (gemv_nx_avx512.c kx_rows, from TERN_CPU_KX x): rows of one group (half a
 * chunk), a last block of 12 groups, two bias slices (65 and 130 groups), 12..16 x (lanes left empty; 8 x: q4i8_rows)
 * — every row bitwise the one-x kernel's on it alone. */
static void x_lanes_on(tern_backend *be, const char *tag, int nth) {
    static const int outs[3] = {37, 5, 19}, ins[] = {64, 320, 2816, 4160, 8320};
    static const int nxs[] = {8, 12, 13, 16};
    tern__cpu_dec_rows_set(TERN_CPU_DEC_NMAX);
    for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
        for (size_t n = 0; n < TERN_ARRAY_LEN(nxs); n++)
            several_rows(be, &fmts[2], ins[i], outs, 1, nxs[n], 9000 + 37 * i + 5 * n + (unsigned)nth, tag);
    tern__cpu_dec_rows_set(-1);
}
TEST(decode_x_lanes) { kt_each_cpu(x_lanes_on); }

/* Rows per kernel pass (tern__cpu_dec_nr_set, up to the table's gemv_nr: 8 for AVX-512): a
 * row's result does not depend on how many rows share the pass, so 1..8 rows per pass are
 * bitwise the default (the table's gemv_pass: 1 or 4 by kind), for every format (Q8_I8 runs 8
 * rows in one kernel call, the others split the pass), exact and int8, row counts not
 * multiples of 8. */
TEST(decode_rows_per_pass) {
    tern_backend *be = kt_open_cpu("avx512", 2);
    if (!be) { SKIP("decode_rows_per_pass", "needs AVX-512"); return; }
    static const int outs[] = {13, 301, 64};
    for (size_t f = 0; f < TERN_ARRAY_LEN(fmts); f++)
        for (int int8 = 0; int8 < 2; int8++)
            for (size_t o = 0; o < TERN_ARRAY_LEN(outs); o++) {
                int in = o == 2 ? 2048 : 512;
                kt_weight w;
                kt_weight_make(&w, fmts[f].dt, fmts[f].bits, fmts[f].gs, fmts[f].sdt, 1, outs[o], in, 0, 77 + f * 10 + o);
                float *x = kt_randv((size_t)in, 5 + o, 1.0f), *a = nanv((size_t)outs[o]), *b = nanv((size_t)outs[o]);
                tern_backend_cpu_set_int8(be, int8);
                tern__cpu_dec_nr_set(0);
                be->vt->matmul(be, a, x, 1, &w.t);
                for (int nr = 1; nr <= 8; nr++) {
                    tern__cpu_dec_nr_set(nr);
                    be->vt->matmul(be, b, x, 1, &w.t);
                    CHECK(same(a, b, (size_t)outs[o]), "%s %s out=%d: %d rows per pass differ from the default", fmts[f].name,
                          int8 ? "int8" : "exact", outs[o], nr);
                }
                tern__cpu_dec_nr_set(0);
                free(x); free(a); free(b);
                kt_weight_free(&w);
            }
    tern_backend_cpu_set_int8(be, 0);
    tern_backend_close(be);
}

TEST(decode_declines) {
    tern_backend *be = kt_open_cpu("avx512", 2);
    if (!be) be = kt_open_cpu("avx2", 2);
    CHECK(be != NULL, "open cpu");
    if (!be) return;
    const tern_backend_vt *op = be->vt;
    kt_weight q4, q8, f32, odd;
    kt_weight_make(&q4, TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 40, 256, 0, 1);
    kt_weight_make(&q8, TERN_DT_Q, 8, 64, TERN_DT_BF16, 1, 40, 256, 0, 2);
    kt_weight_make(&f32, TERN_DT_F32, 0, 0, 0, 1, 40, 256, 0, 3);
    kt_weight_make(&odd, TERN_DT_BF16, 0, 0, 0, 1, 40, 100, 0, 4); /* in % 64 != 0 */
    float *x = kt_randv(512, 5, 1.0f), *y = nanv(80), *ys[3] = {y, y + 40, y + 40};
    const tern_tensor *mixed[2] = {&q4.t, &q8.t}, *one[1] = {&f32.t}, *two[2] = {&odd.t, &odd.t};
    CHECK(op->matmul_n(be, 2, ys, x, 1, mixed) == 0, "matmul_n took q4 and q8 together");
    CHECK(op->matmul_n(be, 1, ys, x, 1, one) == 0, "matmul_n took an F32 weight");
    CHECK(op->matmul_n(be, 2, ys, x, 1, two) == 0, "matmul_n took in = 100");
    CHECK(op->matmul_n(be, 1, ys, x, TERN_CPU_DEC_NMAX + 1, (const tern_tensor *const[]){&q4.t}) == 0, "matmul_n took n = 17");
    CHECK(op->matmul_glu(be, y, x, 1, &q4.t, &q8.t, TERN_ACT_SILU) == 0, "matmul_glu took mixed formats");
    tern__cpu_dec_rows_set(1); /* TERN_CPU_DEC_ROWS=1: one row only */
    CHECK(op->matmul_add(be, y, x, 2, &q4.t) == 0, "matmul_add took n = 2 with one row allowed");
    tern__cpu_dec_rows_set(-1);
    int untouched = 1;
    for (int i = 0; i < 80; i++) untouched &= isnan(y[i]) != 0;
    CHECK(untouched, "a declined call wrote y");
    free(x); free(y);
    kt_weight_free(&q4); kt_weight_free(&q8); kt_weight_free(&f32); kt_weight_free(&odd);
    tern_backend_close(be);
}

int main(void) {
    if (!kt_isa_ok("avx2") && !kt_isa_ok("avx512")) {
        SKIP("decode_fused_ops_bitwise", "CPU lacks AVX2/FMA/F16C: no fused GEMV");
        return test_done();
    }
    RUN(decode_fused_ops_bitwise);
    RUN(decode_several_rows);
    RUN(decode_x_lanes);
    RUN(decode_rows_per_pass);
    RUN(decode_declines);
    return test_done();
}
