/*
 * kern_scalar.c — the portable kernel table (plain C) and the cpuid-based choice between
 * it and the SIMD tables. The decoder here is the reference bit-stream decode applied to a
 * slice; it is also the fallback the SIMD decoders call for formats they do not special-case
 * and for tails.
 */
#include "backend/cpu/kern.h"
#include "sample/sample_ref.h"

#include <math.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <string.h>

float tern__cpu_sload(const uint8_t *p, tern_dtype t, int i) { return tern_load_f32(p, t, (size_t)i); }

void tern__cpu_decode_scalar(const cpu_wrow *w, int j0, int len, float *dst) {
    if (w->dtype == TERN_DT_F8_E4M3 && w->scales) { /* block FP8: e4m3 · the f32 scale of its column block */
        for (int j = 0; j < len; j++)
            dst[j] = tern_f8e4m3_to_f32(w->data[j0 + j]) * tern__cpu_sload(w->scales, TERN_DT_F32, (j0 + j) / w->gs);
        return;
    }
    if (w->dtype != TERN_DT_Q) {
        for (int j = 0; j < len; j++) dst[j] = tern_load_f32(w->data, w->dtype, (size_t)(j0 + j));
        return;
    }
    uint32_t mask = (1u << w->bits) - 1u;
    for (int j = 0; j < len; j++) {
        uint64_t bit = (uint64_t)(j0 + j) * (uint64_t)w->bits;
        unsigned shift = (unsigned)(bit & 7);
        uint32_t v = w->data[bit >> 3];
        if (shift + (unsigned)w->bits > 8) v |= (uint32_t)w->data[(bit >> 3) + 1] << 8;
        int g = (j0 + j) / w->gs;
        float s = tern__cpu_sload(w->scales, w->sdtype, g), b = tern__cpu_sload(w->biases, w->sdtype, g);
        dst[j] = s * (float)((v >> shift) & mask) + b;
    }
}

static void mk_scalar(const float *const *w, int nw, const float *const *x, int nx, int len, float acc[4][4]) {
    for (int i = 0; i < nw; i++)
        for (int j = 0; j < nx; j++) {
            float s = 0.0f;
            for (int t = 0; t < len; t++) s += w[i][t] * x[j][t];
            acc[i][j] = s;
        }
}

static float dot_scalar(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_scalar(float *y, float a, const float *x, int n) { for (int i = 0; i < n; i++) y[i] += a * x[i]; }
static void scal_scalar(float *y, float a, int n) { for (int i = 0; i < n; i++) y[i] *= a; }

static double readsum_scalar(const float *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t m = n / 2, i = 0;
    for (; i + 4 <= m; i += 4) { a0 += q[i]; a1 += q[i + 1]; a2 += q[i + 2]; a3 += q[i + 3]; }
    return (double)(a0 ^ a1 ^ a2 ^ a3);
}

static int32_t argmax_scalar(const float *x, int n) { /* the sampler's own first pass */
    int bad;
    return tern__sample_argmax(x, n, NULL, &bad);
}

/* The elementwise activations in libm's formulas (the reference's; the AVX-512 table has vector versions) */
float tern__gelu_tanh(float x); /* ref.c */
void tern__cpu_softcap_scalar(float *y, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) y[i] = cap * tanhf(y[i] / cap);
}
void tern__cpu_gelu_mul_scalar(float *y, const float *g, const float *u, int64_t n) {
    if (u) for (int64_t i = 0; i < n; i++) y[i] = tern__gelu_tanh(g[i]) * u[i];
    else for (int64_t i = 0; i < n; i++) y[i] = tern__gelu_tanh(g[i]);
}
void tern__cpu_silu_mul_scalar(float *y, const float *g, const float *u, int64_t n) {
    if (u) for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    else for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i]));
}

/* RMSNorm's scaling, y = (x·s)·w in that order (the SIMD tables' tails are this loop) */
static void norm_apply_scalar(float *y, const float *x, float s, const float *w, int n) {
    if (w) for (int j = 0; j < n; j++) y[j] = x[j] * s * w[j];
    else for (int j = 0; j < n; j++) y[j] = x[j] * s;
}

const tern_cpu_kern tern__cpu_kern_scalar = {
    .name = "scalar",
    .decode = tern__cpu_decode_scalar,
    .mk = mk_scalar,
    .dot = dot_scalar,
    .axpy = axpy_scalar,
    .scal = scal_scalar,
    .readsum = readsum_scalar,
    .argmax = argmax_scalar,
    .softcap = tern__cpu_softcap_scalar,
    .gelu_mul = tern__cpu_gelu_mul_scalar,
    .silu_mul = tern__cpu_silu_mul_scalar,
    .norm_apply = norm_apply_scalar,
};

const tern_cpu_kern *tern__cpu_kern_pick(void) {
    const char *cap = getenv("TERN_CPU_ISA");
    int lvl = 2;
    if (cap && !strcmp(cap, "scalar")) lvl = 0;
    else if (cap && !strcmp(cap, "avx2")) lvl = 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0; /* F16C: CPUID.1:ECX bit 29 (clang's __builtin_cpu_supports lacks "f16c") */
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    int has512 = has2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
    if (lvl >= 2 && has512) return &tern__cpu_kern_avx512;
    if (lvl >= 1 && has2) return &tern__cpu_kern_avx2;
#endif
    return &tern__cpu_kern_scalar;
}
