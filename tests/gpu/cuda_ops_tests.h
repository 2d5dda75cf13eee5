/*
 * cuda_ops_tests.h — every op of the CUDA backend against the scalar reference backend
 * (cpu-ref), on random data, over a grid of shapes and weight formats. Included by
 * tests/gpu/test_cuda_ops.c (the GPU machine's test program) and tests/unit/test_cuda_skip.c
 * (the normal suite, which SKIPs visibly when there is no GPU).
 *
 * Metric: rel L2 = ||gpu - ref|| / ||ref|| per op call. Bounds: f32 compute mode 2e-6 for
 * elementwise/norm ops and 1e-5 for reductions (matmul, attention, MoE) — exact f32 arithmetic
 * in a different summation order; bf16 compute mode (prefill GEMM only, split-bf16) 1e-4.
 * Outputs are poisoned with NaN before each GPU call, so an unwritten element fails the test.
 * Each matmul check prints one "  err <format> n=<rows> <rel>" line for the report table.
 */
#ifndef TERN_CUDA_OPS_TESTS_H
#define TERN_CUDA_OPS_TESTS_H

#include "backend/cpu/cpu.h"
#include "base/pool.h"
#include "ops/ops.h"
#include "test.h"

static tern_backend *g_ref, *g_gpu, *g_gpu16;
static tern_pool *g_q4ref_pool; /* the host references' threads (cuda_ops_tests_qgemm.h q4_plain_ref): on first use */
extern int tern__cuda_bf16_split; /* gemm.c: 1 all bf16-mode GEMMs split (bf16x2), 0 only precise weights (bf16) */
static unsigned long long g_seed = 0x9e3779b97f4a7c15ULL;

/* ---- helpers ---- */

static float *rnd(size_t n, float amp) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = amp * test_randf(&g_seed);
    return p;
}

/* x[0..n) rounded to bf16 in place (round to nearest even), so kernels that round x to bf16 stay exact; returns x */
static float *bf16_exact(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = tern_bf16_to_f32(tern_f32_to_bf16(x[i]));
    return x;
}

static void *to_gpu(const void *h, size_t bytes) {
    void *d = g_gpu->vt->alloc(g_gpu, bytes);
    if (d && bytes) g_gpu->vt->upload(g_gpu, d, h, bytes);
    return d;
}

static float *from_gpu(tern_backend *be, const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    be->vt->download(be, h, d, n * sizeof *h);
    return h;
}

static void *nan_buf(tern_backend *be, size_t n) { /* device buffer of n floats filled with NaN */
    float *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    void *d = be->vt->alloc(be, n * sizeof(float));
    be->vt->upload(be, d, h, n * sizeof(float));
    free(h);
    return d;
}

static double rel_or_nan(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
    return test_rel_l2(a, b, n);
}

/* A host weight in any format; nmat > 1 builds a 3-D stack, strided when `gap` > 0. */
typedef struct hw {
    tern_tensor t;
    void *data, *scales, *biases;
} hw;

static void store_f(void *p, tern_dtype dt, size_t i, float v) {
    if (dt == TERN_DT_F32) ((float *)p)[i] = v;
    else if (dt == TERN_DT_F16) ((uint16_t *)p)[i] = tern_f32_to_f16(v);
    else ((uint16_t *)p)[i] = tern_f32_to_bf16(v);
}

static hw make_w(tern_dtype dt, int bits, int gs, tern_dtype sdt, int nmat, int out, int in, size_t gap) {
    hw h;
    memset(&h, 0, sizeof h);
    tern_tensor *t = &h.t;
    t->dtype = dt;
    t->ndim = nmat > 1 ? 3 : 2;
    int k = 0;
    if (nmat > 1) t->shape[k++] = nmat;
    t->shape[k++] = out;
    t->shape[k++] = in;
    t->bits = bits;
    t->group_size = gs;
    t->sdtype = sdt;
    t->device = -1;
    t->name = "test";
    size_t rb = tern_tensor_row_bytes(t), mb = (size_t)out * rb, ms = mb + gap;
    t->mat_stride = gap ? ms : 0;
    h.data = malloc(ms * nmat + 16);
    uint8_t *d = h.data;
    float amp = 1.0f / sqrtf((float)in);
    if (dt == TERN_DT_Q) {
        for (size_t i = 0; i < ms * nmat; i++) d[i] = (uint8_t)test_rand_u64(&g_seed);
        size_t ng = (size_t)out * (in / gs), ss = tern_dtype_size(sdt), mss = ng * ss + (gap ? 8 * ss : 0);
        t->mat_stride_s = gap ? mss : 0;
        h.scales = malloc(mss * nmat);
        h.biases = malloc(mss * nmat);
        float qmax = (float)((1 << bits) - 1);
        for (int m = 0; m < nmat; m++)
            for (size_t g = 0; g < mss / ss; g++) {
                store_f((uint8_t *)h.scales + m * mss, sdt, g, amp * 2.0f / qmax * (1.0f + 0.5f * test_randf(&g_seed)));
                store_f((uint8_t *)h.biases + m * mss, sdt, g, -amp * (1.0f + 0.2f * test_randf(&g_seed)));
            }
        t->scales = h.scales;
        t->biases = h.biases;
    } else {
        size_t es = tern_dtype_size(dt);
        for (size_t i = 0; i < ms * nmat / es; i++) store_f(d, dt, i, amp * 1.7f * test_randf(&g_seed));
    }
    t->data = h.data;
    return h;
}

static void free_w(hw *h) {
    free(h->data);
    free(h->scales);
    free(h->biases);
}

static const char *fmt_name(const tern_tensor *t, char *buf, size_t n) {
    if (t->dtype == TERN_DT_Q)
        snprintf(buf, n, "q%d/g%d/%s", t->bits, t->group_size, tern_dtype_name(t->sdtype));
    else if (tern_tensor_is_fp8_block(t))
        snprintf(buf, n, "fp8/%dx%d", t->blk_rows, t->group_size);
    else
        snprintf(buf, n, "%s", tern_dtype_name(t->dtype));
    return buf;
}

/* act(g)·u in double on the host (act: TERN_ACT_SILU, else GELU-tanh) */
static double glu_ref(double g, double u, int act) {
    return (act == TERN_ACT_SILU ? g / (1.0 + exp(-g)) : 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))) * u;
}

/* Compare matmul (e < 0) or matmul_expert on n rows; returns rel error. */
static int g_x_bf16;         /* check_matmul's x rounded to bf16 first: 1 for both sides, 2 the reference's only */
static float g_x_amp = 1.0f; /* check_matmul's x amplitude */
static double check_matmul(tern_backend *gpu, const hw *h, int n, int e) {
    tern_tensor tr = h->t, tg = h->t;
    tern_error err = {0};
    if (g_ref->vt->upload_weight(g_ref, &tr, &err) || gpu->vt->upload_weight(gpu, &tg, &err)) {
        printf("  upload_weight: %s\n", err.msg);
        return INFINITY;
    }
    int out = (int)h->t.shape[h->t.ndim - 2], in = (int)h->t.shape[h->t.ndim - 1];
    float *x = rnd((size_t)n * in, g_x_amp), *yr = malloc((size_t)n * out * sizeof *yr);
    float *xr = g_x_bf16 == 2 ? malloc((size_t)n * in * sizeof *xr) : x; /* the reference's x */
    if (g_x_bf16 == 2) memcpy(xr, x, (size_t)n * in * sizeof *xr);
    if (g_x_bf16) bf16_exact(xr, (size_t)n * in);
    void *xd = to_gpu(x, (size_t)n * in * sizeof *x), *yd = nan_buf(gpu, (size_t)n * out);
    if (gpu != g_gpu) g_gpu->vt->sync(g_gpu); /* x went up through g_gpu's stream (small uploads are async) */
    if (e < 0) {
        g_ref->vt->matmul(g_ref, yr, xr, n, &tr);
        gpu->vt->matmul(gpu, yd, xd, n, &tg);
    } else {
        g_ref->vt->matmul_expert(g_ref, yr, xr, n, &tr, e);
        gpu->vt->matmul_expert(gpu, yd, xd, n, &tg, e);
    }
    float *yg = from_gpu(gpu, yd, (size_t)n * out);
    double rel = rel_or_nan(yg, yr, (size_t)n * out);
    gpu->vt->free_weight(gpu, &tg);
    gpu->vt->free(gpu, xd);
    gpu->vt->free(gpu, yd);
    if (xr != x) free(xr);
    free(x); free(yr); free(yg);
    return rel;
}

/* ---- matmul ---- */

TEST(cuda_matmul_formats) {
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; } F[] = {
        {TERN_DT_F32, 0, 0, 0}, {TERN_DT_F16, 0, 0, 0}, {TERN_DT_BF16, 0, 0, 0},
        {TERN_DT_Q, 2, 64, TERN_DT_BF16}, {TERN_DT_Q, 3, 64, TERN_DT_BF16}, {TERN_DT_Q, 4, 64, TERN_DT_BF16},
        {TERN_DT_Q, 5, 64, TERN_DT_BF16}, {TERN_DT_Q, 6, 64, TERN_DT_BF16}, {TERN_DT_Q, 8, 64, TERN_DT_BF16},
        {TERN_DT_Q, 4, 32, TERN_DT_BF16}, {TERN_DT_Q, 4, 128, TERN_DT_BF16}, {TERN_DT_Q, 3, 32, TERN_DT_F16},
        {TERN_DT_Q, 6, 128, TERN_DT_F32}, {TERN_DT_Q, 8, 32, TERN_DT_F16}, {TERN_DT_Q, 2, 128, TERN_DT_F32},
        {TERN_DT_Q, 5, 32, TERN_DT_BF16},
    };
    static const int NS[] = {1, 2, 3, 5, 8, 13, 40, 160};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++) {
        hw h = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, 1, 300, 384, 0);
        char nm[64];
        fmt_name(&h.t, nm, sizeof nm);
        for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
            double rel = check_matmul(g_gpu, &h, NS[i], -1);
            printf("  err %-16s n=%-4d f32  %.2e\n", nm, NS[i], rel);
            CHECK(rel <= 1e-5, "%s n=%d rel %.3e", nm, NS[i], rel);
            if (NS[i] >= 40 && g_gpu16) {
                rel = check_matmul(g_gpu16, &h, NS[i], -1);
                printf("  err %-16s n=%-4d bf16 %.2e\n", nm, NS[i], rel);
                CHECK(rel <= 1e-4, "%s n=%d bf16 mode rel %.3e", nm, NS[i], rel);
                /* --compute bf16: plain bf16 GEMMs (x and W rounded to 2^-8: ~2e-3 rel on random
                 * data), except weights flagged precise, which keep the split's bound */
                tern__cuda_bf16_split = 0;
                double plain = check_matmul(g_gpu16, &h, NS[i], -1);
                h.t.precise = 1;
                double prec = check_matmul(g_gpu16, &h, NS[i], -1);
                h.t.precise = 0;
                tern__cuda_bf16_split = 1;
                printf("  err %-16s n=%-4d bf16 plain %.2e precise %.2e\n", nm, NS[i], plain, prec);
                CHECK(plain <= 1e-2 && prec <= 1e-4, "%s n=%d bf16 (plain): plain rel %.3e, precise %.3e", nm,
                      NS[i], plain, prec);
            }
        }
        free_w(&h);
    }
}

TEST(cuda_matmul_odd_shapes) {
    /* in not a multiple of the vector chunk -> generic kernel; big out -> many blocks */
    hw a = make_w(TERN_DT_BF16, 0, 0, 0, 1, 77, 100, 0), b = make_w(TERN_DT_F32, 0, 0, 0, 1, 5, 6, 0);
    hw c = make_w(TERN_DT_Q, 4, 32, TERN_DT_BF16, 1, 4099, 96, 0), d = make_w(TERN_DT_F16, 0, 0, 0, 1, 1, 2048, 0);
    int ns[] = {1, 7, 9, 33};
    for (int i = 0; i < 4; i++) {
        double r1 = check_matmul(g_gpu, &a, ns[i], -1), r2 = check_matmul(g_gpu, &b, ns[i], -1);
        double r3 = check_matmul(g_gpu, &c, ns[i], -1), r4 = check_matmul(g_gpu, &d, ns[i], -1);
        CHECK(r1 <= 1e-5 && r2 <= 1e-5 && r3 <= 1e-5 && r4 <= 1e-5, "n=%d rel %.2e %.2e %.2e %.2e", ns[i], r1, r2,
              r3, r4);
    }
    free_w(&a); free_w(&b); free_w(&c); free_w(&d);
}

TEST(cuda_matmul_expert_strided_stack) {
    hw q = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 5, 96, 256, 4096);
    hw b = make_w(TERN_DT_BF16, 0, 0, 0, 4, 64, 128, 1024);
    for (int e = 0; e < 4; e++) {
        double r1 = check_matmul(g_gpu, &q, e == 3 ? 50 : 3, e), r2 = check_matmul(g_gpu, &b, e == 2 ? 45 : 1, e);
        CHECK(r1 <= 1e-5 && r2 <= 1e-5, "e=%d rel q4 %.2e bf16 %.2e", e, r1, r2);
    }
    free_w(&q); free_w(&b);
}

TEST(cuda_upload_weight_rejects) {
    hw h = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, 8, 128, 0);
    tern_error err = {0};
    h.t.bits = 7;
    CHECK(g_gpu->vt->upload_weight(g_gpu, &h.t, &err) == TERN_EUNSUPPORTED, "7-bit accepted");
    h.t.bits = 4;
    h.t.group_size = 48;
    CHECK(g_gpu->vt->upload_weight(g_gpu, &h.t, &err) == TERN_EUNSUPPORTED, "gs 48 accepted");
    CHECK(strstr(err.msg, "test") != NULL, "message names the tensor: %s", err.msg);
    h.t.dtype = TERN_DT_I32;
    CHECK(g_gpu->vt->upload_weight(g_gpu, &h.t, &err) == TERN_EUNSUPPORTED, "I32 accepted");
    free_w(&h);
}

/* ---- small ops ---- */

TEST(cuda_embed) {
    hw ws[2] = {make_w(TERN_DT_Q, 6, 32, TERN_DT_BF16, 1, 50, 192, 0), make_w(TERN_DT_BF16, 0, 0, 0, 1, 50, 200, 0)};
    int32_t ids[6] = {0, 49, 7, 7, 60 /* out of range -> zero row */, 13};
    for (int k = 0; k < 2; k++) {
        tern_tensor tr = ws[k].t, tg = ws[k].t;
        tern_error err = {0};
        CHECK(!g_ref->vt->upload_weight(g_ref, &tr, &err) && !g_gpu->vt->upload_weight(g_gpu, &tg, &err), "%s", err.msg);
        int H = (int)tr.shape[1];
        float *yr = malloc(6 * H * sizeof *yr);
        void *idd = to_gpu(ids, sizeof ids), *yd = nan_buf(g_gpu, 6 * (size_t)H);
        g_ref->vt->embed(g_ref, yr, ids, 6, &tr, 1.5f);
        g_gpu->vt->embed(g_gpu, yd, idd, 6, &tg, 1.5f);
        float *yg = from_gpu(g_gpu, yd, 6 * (size_t)H);
        double rel = rel_or_nan(yg, yr, 6 * (size_t)H);
        CHECK(rel <= 2e-6, "embed %d rel %.2e", k, rel);
        g_gpu->vt->free_weight(g_gpu, &tg);
        g_gpu->vt->free(g_gpu, idd); g_gpu->vt->free(g_gpu, yd);
        free(yr); free(yg); free_w(&ws[k]);
    }
}

/* run one unary/binary op on both backends and compare */
enum { OP_RMS, OP_RMS_NOW, OP_ROPE, OP_ADD, OP_MUL, OP_SCALE, OP_SCALE_DEV, OP_GELU, OP_GELU1, OP_SILU, OP_SILU1,
       OP_SOFTCAP, OP_BIAS, OP_COPY, OP_COUNT };
static const char *k_opname[OP_COUNT] = {"rmsnorm", "rmsnorm(no w)", "rope", "add", "mul", "scale", "scale_dev",
                                         "gelu_tanh_mul", "gelu_tanh", "silu_mul", "silu", "softcap", "add_bias",
                                         "copy_cols"};

static double run_small(int op, int rows, int d) {
    size_t n = (size_t)rows * d;
    float *a = rnd(n, 4.0f), *b = rnd(n, 2.0f), *w = rnd((size_t)d, 1.0f);
    int32_t *pos = malloc(rows * sizeof *pos);
    for (int r = 0; r < rows; r++) pos[r] = (int32_t)(test_rand_u64(&g_seed) % 100000);
    for (int i = 1; i < d / 2; i += 5) w[i] = 0.0f; /* identity rope lanes */
    for (int i = 0; i < d; i++) w[i] = fabsf(w[i]);
    float *yr = malloc(n * sizeof *yr), s = 0.75f;
    memcpy(yr, a, n * sizeof *yr);
    void *ad = to_gpu(a, n * 4), *bd = to_gpu(b, n * 4), *wd = to_gpu(w, (size_t)d * 4), *pd = to_gpu(pos, rows * 4);
    void *yd = nan_buf(g_gpu, n);
    const tern_backend_vt *R = g_ref->vt, *G = g_gpu->vt;
    size_t outn = n;
    switch (op) {
    case OP_RMS: R->rmsnorm(g_ref, yr, a, rows, d, w, 1e-6f); G->rmsnorm(g_gpu, yd, ad, rows, d, wd, 1e-6f); break;
    case OP_RMS_NOW: R->rmsnorm(g_ref, yr, yr, rows, d, NULL, 1e-5f); G->rmsnorm(g_gpu, ad, ad, rows, d, NULL, 1e-5f);
        yd = (G->free(g_gpu, yd), ad); ad = NULL; break;
    case OP_ROPE: { /* treat rows as n=rows/2 tokens x 2 heads */
        R->rope(g_ref, yr, rows / 2, 2, d, pos, w, 1.25f);
        G->rope(g_gpu, ad, rows / 2, 2, d, pd, wd, 1.25f);
        G->free(g_gpu, yd); yd = ad; ad = NULL;
        break;
    }
    case OP_ADD: R->add(g_ref, yr, a, b, n); G->add(g_gpu, yd, ad, bd, n); break;
    case OP_MUL: R->mul(g_ref, yr, a, b, n); G->mul(g_gpu, yd, ad, bd, n); break;
    case OP_SCALE: R->scale(g_ref, yr, a, s, n); G->scale(g_gpu, yd, ad, s, n); break;
    case OP_SCALE_DEV: R->scale_dev(g_ref, yr, a, w, n); G->scale_dev(g_gpu, yd, ad, wd, n); break;
    case OP_GELU: R->gelu_tanh_mul(g_ref, yr, a, b, n); G->gelu_tanh_mul(g_gpu, yd, ad, bd, n); break;
    case OP_GELU1: R->gelu_tanh_mul(g_ref, yr, a, NULL, n); G->gelu_tanh_mul(g_gpu, yd, ad, NULL, n); break;
    case OP_SILU: R->silu_mul(g_ref, yr, a, b, n); G->silu_mul(g_gpu, yd, ad, bd, n); break;
    case OP_SILU1: R->silu_mul(g_ref, yr, a, NULL, n); G->silu_mul(g_gpu, yd, ad, NULL, n); break;
    case OP_SOFTCAP: R->softcap(g_ref, yr, n, 3.0f); G->softcap(g_gpu, ad, n, 3.0f); G->free(g_gpu, yd); yd = ad;
        ad = NULL; break;
    case OP_BIAS: R->add_bias(g_ref, yr, w, rows, d); G->add_bias(g_gpu, ad, wd, rows, d); G->free(g_gpu, yd);
        yd = ad; ad = NULL; break;
    case OP_COPY: R->copy_cols(g_ref, yr, a, rows, d / 3, d, d / 2); G->copy_cols(g_gpu, yd, ad, rows, d / 3, d, d / 2);
        outn = (size_t)rows * (d / 3); break;
    }
    float *yg = from_gpu(g_gpu, yd, outn);
    double rel = rel_or_nan(yg, yr, outn);
    G->free(g_gpu, ad); G->free(g_gpu, bd); G->free(g_gpu, wd); G->free(g_gpu, pd); G->free(g_gpu, yd);
    free(a); free(b); free(w); free(pos); free(yr); free(yg);
    return rel;
}

TEST(cuda_norm_rope_elementwise) {
    static const int shapes[][2] = {{1, 64}, {6, 256}, {34, 2816}, {4, 5376}, {2, 130}};
    for (int op = 0; op < OP_COUNT; op++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
            double rel = run_small(op, shapes[s][0] * 2, shapes[s][1]);
            double tol = (op == OP_RMS || op == OP_RMS_NOW || op == OP_ROPE) ? 1e-5 : 2e-6;
            CHECK(rel <= tol, "%s rows %d d %d rel %.2e", k_opname[op], shapes[s][0] * 2, shapes[s][1], rel);
        }
}

#include "gpu/cuda_ops_tests_attn.h"
#include "gpu/cuda_ops_tests_graph.h"
#include "gpu/cuda_ops_tests_glm.h"
#include "gpu/cuda_ops_tests_fp8.h"
#include "gpu/cuda_ops_tests_kvq.h"
#include "gpu/cuda_ops_tests_fused.h"
#include "gpu/cuda_ops_tests_qgemm.h"
#include "gpu/cuda_ops_tests_qmma.h"
#include "gpu/cuda_ops_tests_sample.h"
#include "gpu/cuda_ops_tests_mma.h"

static int cuda_ops_run_all(void) {
    RUN(cuda_upload_weight_rejects);
    RUN(cuda_matmul_formats);
    RUN(cuda_matmul_odd_shapes);
    RUN(cuda_matmul_expert_strided_stack);
    RUN(cuda_embed);
    RUN(cuda_norm_rope_elementwise);
    RUN(cuda_attention_prefill_decode);
    RUN(cuda_attention_decode_cluster_bits);
    RUN(cuda_attention_decode_1p);
    RUN(cuda_attention_decode_tc);
    RUN(cuda_attention_decode_tcs);
    RUN(cuda_attention_decode_r1);
    RUN(cuda_attention_decode_early_bits);
    RUN(cuda_attention_spans);
    RUN(cuda_attention_flash);
    RUN(cuda_attention_mat);
    RUN(cuda_route_topk);
    RUN(cuda_moe_mlp);
    RUN(cuda_norm_route_topk);
    RUN(cuda_graph_replay);
    RUN(cuda_graph_launch_halves);
    cuda_glm_tests();
    cuda_fp8_tests();
    cuda_kvq_tests();
    cuda_fused_tests();
    cuda_qgemm_tests();
    cuda_qmma_tests();
    cuda_sample_tests();
    cuda_mma_tests();
    return test_done();
}

/* Open the backends; returns 0 with *why filled when there is no usable GPU. */
static int cuda_ops_open(char *why, size_t n) {
    tern_error err = {0};
    tern_backend_opts o = {0};
    if (tern_backend_cuda_open(&g_gpu, &o, &err) != TERN_OK) {
        snprintf(why, n, "%s", err.msg);
        return 0;
    }
    o.compute = TERN_COMPUTE_BF16;
    if (tern_backend_cuda_open(&g_gpu16, &o, &err) != TERN_OK) g_gpu16 = NULL;
    tern__cuda_bf16_split = 1; /* the bounds below are bf16x2's (the split); cuda_matmul_formats checks plain */
    if (tern_backend_cpu_ref_open(&g_ref, NULL, &err) != TERN_OK) {
        snprintf(why, n, "cpu-ref: %s", err.msg);
        return 0;
    }
    return 1;
}

static void cuda_ops_close(void) {
    tern_backend_close(g_gpu);
    tern_backend_close(g_gpu16);
    tern_backend_close(g_ref);
    tern_pool_free(g_q4ref_pool);
    g_q4ref_pool = NULL;
}

#endif
