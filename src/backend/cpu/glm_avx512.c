/*
 * glm_avx512.c — AVX-512 inner products of the fast GLM-5 ops (cpu_glm.h tern_glm_kern).
 *
 * dots: up to 4×4 (query, key) pairs per call share their loads: per 16-float chunk, 4 + 4
 * loads feed 16 FMAs into 16 accumulators (24 of the 32 zmm registers). Every pair's sum is
 * the same sequence — one lane-wise FMA per chunk in t order (the tail chunk masked, zeros
 * add nothing), then _mm512_reduce_add_ps — whatever na/nb are, so a score does not depend
 * on which other heads or keys shared the call.
 * pv: per 16-float chunk of the output, the (up to 4) output rows stay in registers while the
 * value rows stream by: o += p_c·v_c in c order per element.
 * This file is compiled with AVX-512 flags (Makefile) and used only when cpuid says so.
 */
#include "backend/cpu/cpu_glm.h"

#include <immintrin.h>

static inline __mmask16 tail_mask(int rem) { return (__mmask16)((1u << rem) - 1u); }

/* 4 queries × 4 keys: 16 accumulators spelled out so they stay in registers */
#define FMA4(i, va)                                                                                                \
    c##i##0 = _mm512_fmadd_ps(va, b0, c##i##0); c##i##1 = _mm512_fmadd_ps(va, b1, c##i##1);                       \
    c##i##2 = _mm512_fmadd_ps(va, b2, c##i##2); c##i##3 = _mm512_fmadd_ps(va, b3, c##i##3)
#define STEP(LOAD)                                                                                                 \
    do {                                                                                                           \
        __m512 b0 = LOAD(b[0]), b1 = LOAD(b[1]), b2 = LOAD(b[2]), b3 = LOAD(b[3]);                                  \
        __m512 a0 = LOAD(a[0]), a1 = LOAD(a[1]);                                                                   \
        FMA4(0, a0); FMA4(1, a1);                                                                                  \
        __m512 a2 = LOAD(a[2]), a3 = LOAD(a[3]);                                                                   \
        FMA4(2, a2); FMA4(3, a3);                                                                                  \
    } while (0)

static void dots_4x4(const float *const *a, const float *const *b, int len, float *out, int ldo) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    int t = 0;
#define LD(p) _mm512_loadu_ps((p) + t)
    for (; t + 16 <= len; t += 16) STEP(LD);
#undef LD
    if (t < len) {
        __mmask16 m = tail_mask(len - t);
#define LD(p) _mm512_maskz_loadu_ps(m, (p) + t)
        STEP(LD);
#undef LD
    }
    float *o0 = out, *o1 = out + ldo, *o2 = out + 2 * ldo, *o3 = out + 3 * ldo;
    o0[0] = _mm512_reduce_add_ps(c00); o0[1] = _mm512_reduce_add_ps(c01); o0[2] = _mm512_reduce_add_ps(c02); o0[3] = _mm512_reduce_add_ps(c03);
    o1[0] = _mm512_reduce_add_ps(c10); o1[1] = _mm512_reduce_add_ps(c11); o1[2] = _mm512_reduce_add_ps(c12); o1[3] = _mm512_reduce_add_ps(c13);
    o2[0] = _mm512_reduce_add_ps(c20); o2[1] = _mm512_reduce_add_ps(c21); o2[2] = _mm512_reduce_add_ps(c22); o2[3] = _mm512_reduce_add_ps(c23);
    o3[0] = _mm512_reduce_add_ps(c30); o3[1] = _mm512_reduce_add_ps(c31); o3[2] = _mm512_reduce_add_ps(c32); o3[3] = _mm512_reduce_add_ps(c33);
}

/* one query × one key: the same per-pair sequence as dots_4x4 */
static float dot1(const float *a, const float *b, int len) {
    __m512 acc = _mm512_setzero_ps();
    int t = 0;
    for (; t + 16 <= len; t += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + t), _mm512_loadu_ps(b + t), acc);
    if (t < len) {
        __mmask16 m = tail_mask(len - t);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + t), _mm512_maskz_loadu_ps(m, b + t), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static void dots_avx512(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    if (na == 4 && nb == 4) { dots_4x4(a, b, len, out, ldo); return; }
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) out[i * ldo + j] = dot1(a[i], b[j], len);
}

/* 4 output rows × 64 floats per pass: 16 accumulators, 4 value loads + 4 broadcasts per key */
static void pv_4x64(float *const *o, const float *p, int ldp, const float *const *v, int nv, int t) {
    __m512 a[4][4];
    for (int i = 0; i < 4; i++)
        for (int u = 0; u < 4; u++) a[i][u] = _mm512_loadu_ps(o[i] + t + 16 * u);
    for (int c = 0; c < nv; c++) {
        const float *vc = v[c] + t;
        __m512 v0 = _mm512_loadu_ps(vc), v1 = _mm512_loadu_ps(vc + 16), v2 = _mm512_loadu_ps(vc + 32),
               v3 = _mm512_loadu_ps(vc + 48);
#define ROW(i)                                                                                                     \
    do {                                                                                                           \
        __m512 pp = _mm512_set1_ps(p[(i) * ldp + c]);                                                              \
        a[i][0] = _mm512_fmadd_ps(pp, v0, a[i][0]); a[i][1] = _mm512_fmadd_ps(pp, v1, a[i][1]);                     \
        a[i][2] = _mm512_fmadd_ps(pp, v2, a[i][2]); a[i][3] = _mm512_fmadd_ps(pp, v3, a[i][3]);                     \
    } while (0)
        ROW(0); ROW(1); ROW(2); ROW(3);
#undef ROW
    }
    for (int i = 0; i < 4; i++)
        for (int u = 0; u < 4; u++) _mm512_storeu_ps(o[i] + t + 16 * u, a[i][u]);
}

static void pv_avx512(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n) {
    int t = 0;
    if (no == 4)
        for (; t + 64 <= n; t += 64) pv_4x64(o, p, ldp, v, nv, t);
    for (; t < n; t += 16) { /* the rest: one row and 16 floats at a time, the same FMA sequence */
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : tail_mask(n - t);
        for (int i = 0; i < no; i++) {
            __m512 acc = _mm512_maskz_loadu_ps(m, o[i] + t);
            for (int c = 0; c < nv; c++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(p[i * ldp + c]), _mm512_maskz_loadu_ps(m, v[c] + t), acc);
            _mm512_mask_storeu_ps(o[i] + t, m, acc);
        }
    }
}

const tern_glm_kern tern__glm_kern_avx512 = {"avx512", dots_avx512, pv_avx512};
