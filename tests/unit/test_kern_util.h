/*
 * test_kern_util.h — helpers for the CPU kernel tests (test_kern_*.c): random weights in
 * every stored format, opening the reference and fast backends at a given ISA level.
 */
#ifndef TEST_KERN_UTIL_H
#define TEST_KERN_UTIL_H

#include "backend/cpu/cpu.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 1 when the CPU backend can run kernels at ISA level `isa` ("avx512", "avx2", "scalar") on this machine */
static inline int kt_isa_ok(const char *isa) {
    setenv("TERN_CPU_ISA", isa, 1);
    int ok = !strcmp(tern_cpu_isa_name(), isa);
    unsetenv("TERN_CPU_ISA");
    return ok;
}

/* A weight with its own buffers: E matrices [out, in], optionally `pad` extra rows between
 * matrices (exercises mat_stride views). */
typedef struct kt_weight {
    tern_tensor t;
    void *data, *scales, *biases;
} kt_weight;

static inline void kt_store(void *p, tern_dtype dt, size_t i, float v) {
    if (dt == TERN_DT_F32) ((float *)p)[i] = v;
    else if (dt == TERN_DT_F16) ((uint16_t *)p)[i] = tern_f32_to_f16(v);
    else ((uint16_t *)p)[i] = tern_f32_to_bf16(v);
}

static inline void kt_weight_make(kt_weight *w, tern_dtype dt, int bits, int gs, tern_dtype sdt, int E, int out,
                                  int in, int pad, unsigned long long seed) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ull + 1;
    memset(w, 0, sizeof *w);
    tern_tensor *t = &w->t;
    t->dtype = dt;
    t->ndim = E > 1 ? 3 : 2;
    if (E > 1) { t->shape[0] = E; t->shape[1] = out; t->shape[2] = in; }
    else { t->shape[0] = out; t->shape[1] = in; }
    t->bits = bits;
    t->group_size = gs;
    t->sdtype = sdt;
    t->device = -1;
    t->name = "test";
    size_t rows_per_mat = (size_t)out + (size_t)pad;
    size_t rb = dt == TERN_DT_Q ? (size_t)in * bits / 8 : (size_t)in * tern_dtype_size(dt);
    size_t total_rows = (size_t)E * rows_per_mat;
    w->data = malloc(total_rows * rb + 64);
    uint8_t *d = w->data;
    if (dt == TERN_DT_Q) {
        for (size_t i = 0; i < total_rows * rb; i++) d[i] = (uint8_t)test_rand_u64(&s);
        size_t ng = (size_t)in / gs, ss = tern_dtype_size(sdt);
        w->scales = malloc(total_rows * ng * ss + 8);
        w->biases = malloc(total_rows * ng * ss + 8);
        for (size_t i = 0; i < total_rows * ng; i++) {
            kt_store(w->scales, sdt, i, 0.02f + 0.01f * test_randf(&s));
            kt_store(w->biases, sdt, i, 0.1f * test_randf(&s));
        }
        t->scales = w->scales;
        t->biases = w->biases;
        if (pad) t->mat_stride_s = rows_per_mat * ng * ss;
    } else {
        size_t n = total_rows * (size_t)in;
        for (size_t i = 0; i < n; i++) {
            float v = test_randf(&s) * 0.1f;
            if (dt == TERN_DT_F8_E4M3) d[i] = (uint8_t)(test_rand_u64(&s) & 0x77);
            else kt_store(d, dt, i, v);
        }
    }
    t->data = w->data;
    if (pad) t->mat_stride = rows_per_mat * rb;
}

static inline void kt_weight_free(kt_weight *w) {
    free(w->data);
    free(w->scales);
    free(w->biases);
}

static inline float *kt_randv(size_t n, unsigned long long seed, float scale) {
    unsigned long long s = seed * 0x2545F4914F6CDD1Dull + 7;
    float *v = malloc(n * sizeof *v + 64);
    for (size_t i = 0; i < n; i++) v[i] = test_randf(&s) * scale;
    return v;
}

/* Open the fast CPU backend with kernels capped at `isa` ("avx512", "avx2", "scalar"). */
static inline tern_backend *kt_open_cpu(const char *isa, int nth) {
    setenv("TERN_CPU_ISA", isa, 1);
    tern_backend_opts o = {.n_threads = nth};
    tern_backend *be = NULL;
    tern_error e = {0};
    if (tern_backend_cpu_open(&be, &o, &e) != TERN_OK) printf("  open cpu: %s\n", e.msg);
    unsetenv("TERN_CPU_ISA");
    return be;
}

/* body(be, tag, nth) on the fast CPU backend at each ISA level this machine runs ("avx512", "avx2") with 1, 2
 * and 3 threads (tag "isa/Nt"); a backend that does not open fails the test */
typedef void (*kt_cpu_body)(tern_backend *be, const char *tag, int nth);
static inline void kt_each_cpu(kt_cpu_body body) {
    static const char *isas[] = {"avx512", "avx2"};
    for (size_t s = 0; s < TERN_ARRAY_LEN(isas); s++) {
        if (!kt_isa_ok(isas[s])) continue;
        for (int nth = 1; nth <= 3; nth++) {
            tern_backend *be = kt_open_cpu(isas[s], nth);
            CHECK(be != NULL, "open %s", isas[s]);
            if (!be) continue;
            char tag[32];
            snprintf(tag, sizeof tag, "%s/%dt", isas[s], nth);
            body(be, tag, nth);
            tern_backend_close(be);
        }
    }
}

static inline tern_backend *kt_open_ref(void) {
    tern_backend *be = NULL;
    tern_backend_cpu_ref_open(&be, NULL, NULL);
    return be;
}

static const char *const kt_isas[] = {"scalar", "avx2", "avx512"};

/* Worst rel L2 error of `fast` vs `ref` for y[n, out] = x[n, in]·Wᵀ with weight t: matmul when
 * E == 1, else matmul_expert for every expert e < E. x is kt_randv(n·in, seed, 1). y1 is filled
 * with NaN before each call, so an element the fast backend does not write fails the check. */
static inline double kt_matmul_worst(tern_backend *fast, tern_backend *ref, const tern_tensor *t, int E, int out,
                                     int in, int n, unsigned long long seed) {
    float *x = kt_randv((size_t)n * in, seed, 1.0f);
    float *y0 = calloc((size_t)n * out, sizeof *y0), *y1 = calloc((size_t)n * out, sizeof *y1);
    double worst = 0;
    for (int e = 0; e < E; e++) {
        for (size_t i = 0; i < (size_t)n * out; i++) y1[i] = NAN;
        if (E > 1) {
            ref->vt->matmul_expert(ref, y0, x, n, t, e);
            fast->vt->matmul_expert(fast, y1, x, n, t, e);
        } else {
            ref->vt->matmul(ref, y0, x, n, t);
            fast->vt->matmul(fast, y1, x, n, t);
        }
        double err = test_rel_l2(y1, y0, (size_t)n * out);
        if (!(err <= worst)) worst = err; /* NaN-propagating max */
    }
    free(x); free(y0); free(y1);
    return worst;
}

/* A routed MoE case (test_kern_gemm*.c): x [n, H] (seed sx) and router logits [n, E] (seed sl,
 * scale 3) routed top-k by the reference backend, whose SiLU moe_mlp output is y0; kt_moe_run
 * writes a backend's output to y1 and returns its rel L2 error vs y0. */
typedef struct kt_moe {
    int n, H, k;
    const tern_tensor *g, *u, *d;
    float *x, *logits, *wts, *scratch, *y0, *y1;
    int32_t *idx;
} kt_moe;

static inline void kt_moe_make(kt_moe *m, tern_backend *ref, int n, int H, int I, int E, int k, const kt_weight *g,
                               const kt_weight *u, const kt_weight *d, unsigned long long sx, unsigned long long sl) {
    *m = (kt_moe){.n = n, .H = H, .k = k, .g = &g->t, .u = &u->t, .d = &d->t};
    m->x = kt_randv((size_t)n * H, sx, 1.0f);
    m->logits = kt_randv((size_t)n * E, sl, 3.0f);
    m->idx = malloc(sizeof(int32_t) * (size_t)n * k);
    m->wts = malloc(sizeof(float) * (size_t)n * k);
    m->scratch = malloc(sizeof(float) * (size_t)n * k * 2 * I);
    m->y0 = malloc(sizeof(float) * (size_t)n * H);
    m->y1 = malloc(sizeof(float) * (size_t)n * H);
    ref->vt->route_topk(ref, m->idx, m->wts, m->logits, n, E, k, TERN_ROUTE_SOFTMAX_TOPK, NULL);
    ref->vt->moe_mlp(ref, m->y0, m->x, n, H, m->idx, m->wts, k, m->g, m->u, m->d, TERN_ACT_SILU, m->scratch);
}

static inline double kt_moe_run(kt_moe *m, tern_backend *be) {
    be->vt->moe_mlp(be, m->y1, m->x, m->n, m->H, m->idx, m->wts, m->k, m->g, m->u, m->d, TERN_ACT_SILU, m->scratch);
    return test_rel_l2(m->y1, m->y0, (size_t)m->n * m->H);
}

static inline void kt_moe_free(kt_moe *m) {
    free(m->x); free(m->logits); free(m->idx); free(m->wts); free(m->scratch); free(m->y0); free(m->y1);
}

#endif
