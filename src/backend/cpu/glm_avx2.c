/*
 * glm_avx2.c — AVX2+FMA inner products of the fast GLM-5 ops (cpu_glm.h tern_glm_kern).
 *
 * Same contract as glm_avx512.c with 8-float chunks. With 16 ymm registers the 4×4 block is
 * done as two 4×2 halves (8 accumulators + 4 + 2 loads), pv as 4 rows × 16 floats. Each pair's sum is one lane-wise FMA
 * per chunk in t order (the tail chunk through a masked load, zeros add nothing) and then the
 * fixed reduction hsum8 — so a result never depends on na/nb or on the call it was part of.
 * This file is compiled with AVX2/FMA flags (Makefile) and used only when cpuid says so.
 */
#include "backend/cpu/cpu_glm.h"
#include "backend/cpu/vmath.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

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

/* Key / value rows as f32, bf16 or f16 (dots_h / pv_h): 8 elements from p + t widened to f32 exactly (the tail's
 * absent elements as zeros), so a sum over 16-bit rows is bitwise the same sum over their f32 copies. */
enum { F32 = 0, BF16 = 1, F16 = 2 };
#define AI static inline __attribute__((always_inline))
AI __m256 widen(__m128i h, const int fmt) {
    return fmt == BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}
AI __m256 ldk(const void *p, int t, const int fmt) {
    if (fmt == F32) return _mm256_loadu_ps((const float *)p + t);
    return widen(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + t)), fmt);
}
AI __m256 ldk_m(__m256i m, int rem, const void *p, int t, const int fmt) {
    if (fmt == F32) return _mm256_maskload_ps((const float *)p + t, m);
    uint16_t h[8] = {0};
    for (int i = 0; i < rem; i++) h[i] = ((const uint16_t *)p)[t + i];
    return widen(_mm_loadu_si128((const __m128i *)h), fmt);
}
/* row j of the key / value pointers: bf's (f32) or bh's (16-bit) */
AI const void *rowp(const float *const *bf, const uint16_t *const *bh, int j, const int fmt) {
    return fmt == F32 ? (const void *)bf[j] : (const void *)bh[j];
}
/* element t of a row */
AI float elt(const void *p, int t, const int fmt) {
    if (fmt == F32) return ((const float *)p)[t];
    return _mm256_cvtss_f32(widen(_mm_cvtsi32_si128(((const uint16_t *)p)[t]), fmt));
}

/* one query × one key: the per-pair sequence every path below follows */
AI float dot1(const float *a, const void *b, int len, const int fmt) {
    __m256 acc = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= len; t += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + t), ldk(b, t, fmt), acc);
    if (t < len) {
        __m256i m = tail_mask(len - t);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + t, m), ldk_m(m, len - t, b, t, fmt), acc);
    }
    return hsum8(acc);
}

/* 4 queries × 2 keys: 8 accumulators spelled out so they stay in registers */
#define STEP(LA, LB)                                                                                               \
    do {                                                                                                           \
        __m256 b0 = LB(b0p), b1 = LB(b1p), a0 = LA(a[0]), a1 = LA(a[1]);                                          \
        c00 = _mm256_fmadd_ps(a0, b0, c00); c01 = _mm256_fmadd_ps(a0, b1, c01);                                     \
        c10 = _mm256_fmadd_ps(a1, b0, c10); c11 = _mm256_fmadd_ps(a1, b1, c11);                                     \
        __m256 a2 = LA(a[2]), a3 = LA(a[3]);                                                                       \
        c20 = _mm256_fmadd_ps(a2, b0, c20); c21 = _mm256_fmadd_ps(a2, b1, c21);                                     \
        c30 = _mm256_fmadd_ps(a3, b0, c30); c31 = _mm256_fmadd_ps(a3, b1, c31);                                     \
    } while (0)

AI void dots_4x2(const float *const *a, const void *b0p, const void *b1p, int len, float *out, int ldo, const int fmt) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    int t = 0;
#define LA(p) _mm256_loadu_ps((p) + t)
#define LB(p) ldk((p), t, fmt)
    for (; t + 8 <= len; t += 8) STEP(LA, LB);
#undef LA
#undef LB
    if (t < len) {
        __m256i m = tail_mask(len - t);
#define LA(p) _mm256_maskload_ps((p) + t, m)
#define LB(p) ldk_m(m, len - t, (p), t, fmt)
        STEP(LA, LB);
#undef LA
#undef LB
    }
    out[0] = hsum8(c00); out[1] = hsum8(c01);
    out[ldo] = hsum8(c10); out[ldo + 1] = hsum8(c11);
    out[2 * ldo] = hsum8(c20); out[2 * ldo + 1] = hsum8(c21);
    out[3 * ldo] = hsum8(c30); out[3 * ldo + 1] = hsum8(c31);
}

AI void dots_t(const float *const *a, int na, const float *const *bf, const uint16_t *const *bh, int nb, int len,
            float *out, int ldo, const int fmt) {
    int j = 0;
    if (na == 4)
        for (; j + 2 <= nb; j += 2) dots_4x2(a, rowp(bf, bh, j, fmt), rowp(bf, bh, j + 1, fmt), len, out + j, ldo, fmt);
    for (; j < nb; j++)
        for (int i = 0; i < na; i++) out[i * ldo + j] = dot1(a[i], rowp(bf, bh, j, fmt), len, fmt);
}

/* 4 output rows × 16 floats per pass: 8 accumulators, 2 value loads + 4 broadcasts per key */
AI void pv_4x16(float *const *o, const float *p, int ldp, const float *const *vf, const uint16_t *const *vh, int nv, int t,
                const float *corr, const int fmt) {
    __m256 a00 = _mm256_loadu_ps(o[0] + t), a01 = _mm256_loadu_ps(o[0] + t + 8);
    __m256 a10 = _mm256_loadu_ps(o[1] + t), a11 = _mm256_loadu_ps(o[1] + t + 8);
    __m256 a20 = _mm256_loadu_ps(o[2] + t), a21 = _mm256_loadu_ps(o[2] + t + 8);
    __m256 a30 = _mm256_loadu_ps(o[3] + t), a31 = _mm256_loadu_ps(o[3] + t + 8);
    if (corr) {
        __m256 c0 = _mm256_set1_ps(corr[0]), c1 = _mm256_set1_ps(corr[1]), c2 = _mm256_set1_ps(corr[2]), c3 = _mm256_set1_ps(corr[3]);
        a00 = _mm256_mul_ps(a00, c0); a01 = _mm256_mul_ps(a01, c0); a10 = _mm256_mul_ps(a10, c1); a11 = _mm256_mul_ps(a11, c1);
        a20 = _mm256_mul_ps(a20, c2); a21 = _mm256_mul_ps(a21, c2); a30 = _mm256_mul_ps(a30, c3); a31 = _mm256_mul_ps(a31, c3);
    }
    for (int c = 0; c < nv; c++) {
        const void *vc = rowp(vf, vh, c, fmt);
        __m256 v0 = ldk(vc, t, fmt), v1 = ldk(vc, t + 8, fmt), pp;
        pp = _mm256_set1_ps(p[c]); a00 = _mm256_fmadd_ps(pp, v0, a00); a01 = _mm256_fmadd_ps(pp, v1, a01);
        pp = _mm256_set1_ps(p[ldp + c]); a10 = _mm256_fmadd_ps(pp, v0, a10); a11 = _mm256_fmadd_ps(pp, v1, a11);
        pp = _mm256_set1_ps(p[2 * ldp + c]); a20 = _mm256_fmadd_ps(pp, v0, a20); a21 = _mm256_fmadd_ps(pp, v1, a21);
        pp = _mm256_set1_ps(p[3 * ldp + c]); a30 = _mm256_fmadd_ps(pp, v0, a30); a31 = _mm256_fmadd_ps(pp, v1, a31);
    }
    _mm256_storeu_ps(o[0] + t, a00); _mm256_storeu_ps(o[0] + t + 8, a01);
    _mm256_storeu_ps(o[1] + t, a10); _mm256_storeu_ps(o[1] + t + 8, a11);
    _mm256_storeu_ps(o[2] + t, a20); _mm256_storeu_ps(o[2] + t + 8, a21);
    _mm256_storeu_ps(o[3] + t, a30); _mm256_storeu_ps(o[3] + t + 8, a31);
}

AI void pv_t(float *const *o, int no, const float *p, int ldp, const float *const *vf, const uint16_t *const *vh, int nv,
             int n, const float *corr, const int fmt) {
    int t = 0;
    if (no == 4)
        for (; t + 16 <= n; t += 16) pv_4x16(o, p, ldp, vf, vh, nv, t, corr, fmt);
    for (; t + 8 <= n; t += 8) /* the rest: one row and 8 floats at a time, the same FMA sequence */
        for (int i = 0; i < no; i++) {
            __m256 acc = _mm256_loadu_ps(o[i] + t);
            if (corr) acc = _mm256_mul_ps(acc, _mm256_set1_ps(corr[i]));
            for (int c = 0; c < nv; c++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(p[i * ldp + c]), ldk(rowp(vf, vh, c, fmt), t, fmt), acc);
            _mm256_storeu_ps(o[i] + t, acc);
        }
    for (; t < n; t++) /* tail: one lane at a time */
        for (int i = 0; i < no; i++) {
            float s = corr ? o[i][t] * corr[i] : o[i][t];
            for (int c = 0; c < nv; c++) s = __builtin_fmaf(p[i * ldp + c], elt(rowp(vf, vh, c, fmt), t, fmt), s);
            o[i][t] = s;
        }
}

static void dots_avx2(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    dots_t(a, na, b, NULL, nb, len, out, ldo, F32);
}
static void pv_avx2(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n, const float *corr) {
    pv_t(o, no, p, ldp, v, NULL, nv, n, corr, F32);
}
static void dots_h_avx2(const float *const *a, int na, const uint16_t *const *b, int nb, int len, float *out, int ldo, int bf) {
    if (bf) dots_t(a, na, NULL, b, nb, len, out, ldo, BF16);
    else dots_t(a, na, NULL, b, nb, len, out, ldo, F16);
}
static void pv_h_avx2(float *const *o, int no, const float *p, int ldp, const uint16_t *const *v, int nv, int n,
                      const float *corr, int bf) {
    if (bf) pv_t(o, no, p, ldp, NULL, v, nv, n, corr, BF16);
    else pv_t(o, no, p, ldp, NULL, v, nv, n, corr, F16);
}

/* lanes c..c+7 of a tile row: set where bit (c + i) of bits is set and c + i < nk */
static inline __m256 lane_mask(uint32_t bits, int c, int nk) {
    uint32_t b = bits >> c;
    if (nk - c < 8) b &= (1u << (nk - c)) - 1u;
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)b), sel), sel));
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

/* The tile's scores 8 at a time (with a softcap: the portable loop, tanhf); NaN scores ignored (the running max is
 * the second operand of max). */
static void tile_max_avx2(float *s, int lds, int nq, int nk, float scale, float cap, const uint32_t *vis, float *mx) {
    if (cap > 0.0f) { tern__glm_tile_max_scalar(s, lds, nq, nk, scale, cap, vis, mx); return; }
    const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * lds;
        __m256 m = ninf;
        for (int c = 0; c < nk; c += 8) {
            const __m256i ld = tail_mask(nk - c < 8 ? nk - c : 8);
            const __m256 v = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(si + c), sc), lane_mask(vis[i], c, nk));
            _mm256_maskstore_ps(si + c, ld, v);
            m = _mm256_max_ps(v, m);
        }
        mx[i] = hmax8(m);
    }
}

/* p = e^(s - m) through vexp8 (-inf scores and lanes past nk: 0); per query the sum lane-wise over the tile's 8-key
 * quarters, then hsum8. */
static inline __m256 tile_p8(float *si, int c, int nk, __m256 mv) {
    const __m256i ld = tail_mask(nk - c < 8 ? nk - c : 8);
    const __m256 v = _mm256_loadu_ps(si + c); /* inside the tile's TERN_TILE_K floats */
    const __m256 ok = _mm256_and_ps(_mm256_castsi256_ps(ld), _mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ));
    const __m256 p = _mm256_and_ps(ok, vexp8(_mm256_sub_ps(v, mv)));
    _mm256_maskstore_ps(si + c, ld, p);
    return p;
}
static void tile_exp_avx2(float *s, int lds, int nq, int nk, const float *m, float *l) {
    int i = 0;
    for (; i + 2 <= nq; i += 2) {
        float *s0 = s + (size_t)i * lds, *s1 = s0 + lds;
        const __m256 m0 = _mm256_set1_ps(m[i]), m1 = _mm256_set1_ps(m[i + 1]);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (int c = 0; c < nk; c += 8) {
            a0 = _mm256_add_ps(a0, tile_p8(s0, c, nk, m0));
            a1 = _mm256_add_ps(a1, tile_p8(s1, c, nk, m1));
        }
        l[i] += hsum8(a0);
        l[i + 1] += hsum8(a1);
    }
    for (; i < nq; i++) {
        float *s0 = s + (size_t)i * lds;
        const __m256 m0 = _mm256_set1_ps(m[i]);
        __m256 a0 = _mm256_setzero_ps();
        for (int c = 0; c < nk; c += 8) a0 = _mm256_add_ps(a0, tile_p8(s0, c, nk, m0));
        l[i] += hsum8(a0);
    }
}

const tern_glm_kern tern__glm_kern_avx2 = {"avx2", dots_avx2, pv_avx2, tile_max_avx2, tile_exp_avx2, dots_h_avx2, pv_h_avx2};
