/*
 * glm_avx2.c — AVX2+FMA inner products of the fast GLM-5 ops (cpu_glm.h tern_glm_kern).
 *
 * Same contract as glm_avx512.c with 8-float chunks. With 16 ymm registers the 4×4 block is
 * done as two 4×2 halves (8 accumulators + 4 + 2 loads). Each pair's sum is one lane-wise FMA
 * per chunk in t order (the tail chunk through a masked load, zeros add nothing) and then the
 * fixed reduction hsum8 — so a result never depends on na/nb or on the call it was part of.
 * This file is compiled with AVX2/FMA flags (Makefile) and used only when cpuid says so.
 */
#include "backend/cpu/cpu_glm.h"

#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

static inline __m256i tail_mask(int rem) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - rem));
}

/* queries a[0..na) (na <= 4) against keys b[0..nb) (nb <= 2) */
static void dots_4x2(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    __m256 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= len; t += 8) {
        __m256 vb[2];
        for (int j = 0; j < nb; j++) vb[j] = _mm256_loadu_ps(b[j] + t);
        for (int i = 0; i < na; i++) {
            __m256 va = _mm256_loadu_ps(a[i] + t);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(va, vb[j], acc[i][j]);
        }
    }
    if (t < len) {
        __m256i m = tail_mask(len - t);
        __m256 vb[2];
        for (int j = 0; j < nb; j++) vb[j] = _mm256_maskload_ps(b[j] + t, m);
        for (int i = 0; i < na; i++) {
            __m256 va = _mm256_maskload_ps(a[i] + t, m);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(va, vb[j], acc[i][j]);
        }
    }
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) out[i * ldo + j] = hsum8(acc[i][j]);
}

static void dots_avx2(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    for (int j = 0; j < nb; j += 2) dots_4x2(a, na, b + j, nb - j < 2 ? nb - j : 2, len, out + j, ldo);
}

static void pv_avx2(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n) {
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 acc[4];
        for (int i = 0; i < no; i++) acc[i] = _mm256_loadu_ps(o[i] + t);
        for (int c = 0; c < nv; c++) {
            __m256 vv = _mm256_loadu_ps(v[c] + t);
            for (int i = 0; i < no; i++) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(p[i * ldp + c]), vv, acc[i]);
        }
        for (int i = 0; i < no; i++) _mm256_storeu_ps(o[i] + t, acc[i]);
    }
    for (; t < n; t++) /* tail: the same FMA per element, one lane at a time */
        for (int i = 0; i < no; i++) {
            float s = o[i][t];
            for (int c = 0; c < nv; c++) s = __builtin_fmaf(p[i * ldp + c], v[c][t], s);
            o[i][t] = s;
        }
}

const tern_glm_kern tern__glm_kern_avx2 = {"avx2", dots_avx2, pv_avx2};
