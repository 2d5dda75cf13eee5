/*
 * glm_avx512.c — AVX-512 inner products of the fast GLM-5 ops (cpu_glm.h tern_glm_kern).
 *
 * dots: up to 4×4 (query, key) pairs per call share their loads: per 16-float chunk, 4 + 4
 * loads feed 16 FMAs into 16 accumulators (24 of the 32 zmm registers). Every pair's sum is
 * the same sequence — one lane-wise FMA per chunk in t order (the tail chunk masked, zeros
 * add nothing), then the 16 lanes in one fixed tree (hsum; dots_4x4 reduces four accumulators
 * at once with the same pairs) — whatever na/nb are, so a score does not depend on which
 * other heads or keys shared the call.
 * pv: per 16-float chunk of the output, the (up to 4) output rows stay in registers while the
 * value rows stream by: o += p_c·v_c in c order per element.
 * dots_h / pv_h: the same with the keys / values as bf16 or f16 rows, each 16 elements widened to f32 as they are
 * loaded (exact), so the sums are bitwise those over the widened rows (16-bit KV pages read in place).
 * tile_max / tile_exp: the attention tiles' softmax 16 keys at a time (vmath.h vexp and
 * vtanh for expf and the softcap's tanhf).
 * This file is compiled with AVX-512 flags (Makefile) and used only when cpuid says so.
 */
#include "backend/cpu/cpu_glm.h"
#include "backend/cpu/vmath.h"

#include <immintrin.h>

static inline __mmask16 tail_mask(int rem) { return (__mmask16)((1u << rem) - 1u); }

/* Σ of 16 lanes as one fixed tree: the 256-bit halves, then the 128-bit halves, then lanes (0 + 2, 1 + 3), then
 * those two — GCC's _mm512_reduce_add_ps order, spelled out so every sum here (dot1, dots_4x4's four-at-once
 * form, the softmax's) is the same whatever the compiler. */
static inline float hsum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, _MM_SHUFFLE(0, 0, 0, 1))));
}

/* hsum of a, b, c, d at once (the same pairs at every level, fewer shuffles): into o[0..3]. */
static inline void hsum4(__m512 a, __m512 b, __m512 c, __m512 d, float *o) {
    /* level 1: [a.lo256 | b.lo256] + [a.hi256 | b.hi256] */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    /* level 2: 128-bit blocks [a0 a1 b0 b1] [c0 c1 d0 d1] -> [a0 b0 c0 d0] + [a1 b1 c1 d1] */
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    /* levels 3 and 4 inside each 128-bit block: (0 + 2, 1 + 3), then those two */
    u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(0, 0, 0, 1)));
    _mm_storeu_ps(o, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u)));
}

/* Key / value rows as f32, bf16 or f16 (dots_h / pv_h): 16 elements from p + t widened to f32 exactly, so a sum over
 * 16-bit rows is bitwise the same sum over their f32 copies. Queries and outputs are always f32. */
enum { F32 = 0, BF16 = 1, F16 = 2 };
#define AI static inline __attribute__((always_inline))
AI __m512 widen(__m256i h, const int fmt) {
    return fmt == BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}
AI __m512 ldk(const void *p, int t, const int fmt) {
    if (fmt == F32) return _mm512_loadu_ps((const float *)p + t);
    return widen(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + t)), fmt);
}
AI __m512 ldk_m(__mmask16 m, const void *p, int t, const int fmt) {
    if (fmt == F32) return _mm512_maskz_loadu_ps(m, (const float *)p + t);
    return widen(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + t), fmt);
}
/* row j of the key / value pointers: bf's (f32) or bh's (16-bit) */
AI const void *rowp(const float *const *bf, const uint16_t *const *bh, int j, const int fmt) {
    return fmt == F32 ? (const void *)bf[j] : (const void *)bh[j];
}

/* 4 queries × 4 keys: 16 accumulators spelled out so they stay in registers */
#define FMA4(i, va)                                                                                                \
    c##i##0 = _mm512_fmadd_ps(va, b0, c##i##0); c##i##1 = _mm512_fmadd_ps(va, b1, c##i##1);                       \
    c##i##2 = _mm512_fmadd_ps(va, b2, c##i##2); c##i##3 = _mm512_fmadd_ps(va, b3, c##i##3)
#define STEP(LA, LB)                                                                                               \
    do {                                                                                                           \
        __m512 b0 = LB(b[0]), b1 = LB(b[1]), b2 = LB(b[2]), b3 = LB(b[3]);                                          \
        __m512 a0 = LA(a[0]), a1 = LA(a[1]);                                                                       \
        FMA4(0, a0); FMA4(1, a1);                                                                                  \
        __m512 a2 = LA(a[2]), a3 = LA(a[3]);                                                                       \
        FMA4(2, a2); FMA4(3, a3);                                                                                  \
    } while (0)

AI void dots_4x4(const float *const *a, const void *const b[4], int len, float *out, int ldo, const int fmt) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    int t = 0;
#define LA(p) _mm512_loadu_ps((p) + t)
#define LB(p) ldk((p), t, fmt)
    for (; t + 16 <= len; t += 16) STEP(LA, LB);
#undef LA
#undef LB
    if (t < len) {
        __mmask16 m = tail_mask(len - t);
#define LA(p) _mm512_maskz_loadu_ps(m, (p) + t)
#define LB(p) ldk_m(m, (p), t, fmt)
        STEP(LA, LB);
#undef LA
#undef LB
    }
    hsum4(c00, c01, c02, c03, out);
    hsum4(c10, c11, c12, c13, out + ldo);
    hsum4(c20, c21, c22, c23, out + 2 * ldo);
    hsum4(c30, c31, c32, c33, out + 3 * ldo);
}

/* one query × one key: the same per-pair sequence as dots_4x4 */
AI float dot1(const float *a, const void *b, int len, const int fmt) {
    __m512 acc = _mm512_setzero_ps();
    int t = 0;
    for (; t + 16 <= len; t += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + t), ldk(b, t, fmt), acc);
    if (t < len) {
        __mmask16 m = tail_mask(len - t);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + t), ldk_m(m, b, t, fmt), acc);
    }
    return hsum(acc);
}

AI void dots_t(const float *const *a, int na, const float *const *bf, const uint16_t *const *bh, int nb, int len,
            float *out, int ldo, const int fmt) {
    if (na == 4 && nb == 4) {
        const void *const b[4] = {rowp(bf, bh, 0, fmt), rowp(bf, bh, 1, fmt), rowp(bf, bh, 2, fmt), rowp(bf, bh, 3, fmt)};
        dots_4x4(a, b, len, out, ldo, fmt);
        return;
    }
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) out[i * ldo + j] = dot1(a[i], rowp(bf, bh, j, fmt), len, fmt);
}

/* 4 output rows × 64 floats per pass: 16 accumulators, 4 value loads + 4 broadcasts per key */
AI void pv_4x64(float *const *o, const float *p, int ldp, const float *const *vf, const uint16_t *const *vh, int nv, int t,
                const float *corr, const int fmt) {
    __m512 a[4][4];
    for (int i = 0; i < 4; i++)
        for (int u = 0; u < 4; u++) {
            a[i][u] = _mm512_loadu_ps(o[i] + t + 16 * u);
            if (corr) a[i][u] = _mm512_mul_ps(a[i][u], _mm512_set1_ps(corr[i]));
        }
    for (int c = 0; c < nv; c++) {
        const void *vc = rowp(vf, vh, c, fmt);
        __m512 v0 = ldk(vc, t, fmt), v1 = ldk(vc, t + 16, fmt), v2 = ldk(vc, t + 32, fmt), v3 = ldk(vc, t + 48, fmt);
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

AI void pv_t(float *const *o, int no, const float *p, int ldp, const float *const *vf, const uint16_t *const *vh, int nv,
             int n, const float *corr, const int fmt) {
    int t = 0;
    if (no == 4)
        for (; t + 64 <= n; t += 64) pv_4x64(o, p, ldp, vf, vh, nv, t, corr, fmt);
    for (; t < n; t += 16) { /* the rest: one row and 16 floats at a time, the same FMA sequence */
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : tail_mask(n - t);
        for (int i = 0; i < no; i++) {
            __m512 acc = _mm512_maskz_loadu_ps(m, o[i] + t);
            if (corr) acc = _mm512_mul_ps(acc, _mm512_set1_ps(corr[i]));
            for (int c = 0; c < nv; c++) acc = _mm512_fmadd_ps(_mm512_set1_ps(p[i * ldp + c]), ldk_m(m, rowp(vf, vh, c, fmt), t, fmt), acc);
            _mm512_mask_storeu_ps(o[i] + t, m, acc);
        }
    }
}

static void dots_avx512(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    dots_t(a, na, b, NULL, nb, len, out, ldo, F32);
}
static void pv_avx512(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n, const float *corr) {
    pv_t(o, no, p, ldp, v, NULL, nv, n, corr, F32);
}
static void dots_h_avx512(const float *const *a, int na, const uint16_t *const *b, int nb, int len, float *out, int ldo, int bf) {
    if (bf) dots_t(a, na, NULL, b, nb, len, out, ldo, BF16);
    else dots_t(a, na, NULL, b, nb, len, out, ldo, F16);
}
static void pv_h_avx512(float *const *o, int no, const float *p, int ldp, const uint16_t *const *v, int nv, int n,
                        const float *corr, int bf) {
    if (bf) pv_t(o, no, p, ldp, NULL, v, nv, n, corr, BF16);
    else pv_t(o, no, p, ldp, NULL, v, nv, n, corr, F16);
}

/* The tile's scores 16 at a time (the softcap through vtanh); each query's max as one lane-wise max then a
 * reduction (NaN lanes ignored: the running max is the second operand). */
static void tile_max_avx512(float *s, int lds, int nq, int nk, float scale, float cap, const uint32_t *vis, float *mx) {
    const __m512 sc = _mm512_set1_ps(scale), cp = _mm512_set1_ps(cap), ninf = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * lds;
        __m512 m = ninf;
        for (int c = 0; c < nk; c += 16) {
            const __mmask16 ld = nk - c >= 16 ? (__mmask16)0xffff : tail_mask(nk - c), k = ld & (__mmask16)(vis[i] >> c);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(ld, si + c), sc);
            if (cap > 0.0f) v = _mm512_mul_ps(cp, vtanh(_mm512_div_ps(v, cp)));
            _mm512_mask_storeu_ps(si + c, ld, _mm512_mask_blend_ps(k, ninf, v));
            m = _mm512_mask_max_ps(m, k, v, m);
        }
        mx[i] = _mm512_reduce_max_ps(m);
    }
}

/* p = e^(s - m) through vexp (-inf scores: 0); per query the sum lane-wise over the tile's 16-key halves, then
 * hsum. Two queries at a time: their exponentials are independent chains (one vexp is ~17 dependent operations). */
static inline __m512 tile_p(float *si, int c, int nk, __m512 mv) {
    const __mmask16 k = nk - c >= 16 ? (__mmask16)0xffff : tail_mask(nk - c);
    const __m512 v = _mm512_maskz_loadu_ps(k, si + c);
    const __m512 p = _mm512_maskz_mov_ps(_mm512_mask_cmp_ps_mask(k, v, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ),
                                         vexp(_mm512_sub_ps(v, mv)));
    _mm512_mask_storeu_ps(si + c, k, p);
    return p;
}
static void tile_exp_avx512(float *s, int lds, int nq, int nk, const float *m, float *l) {
    int i = 0;
    for (; i + 2 <= nq; i += 2) {
        float *s0 = s + (size_t)i * lds, *s1 = s0 + lds;
        const __m512 m0 = _mm512_set1_ps(m[i]), m1 = _mm512_set1_ps(m[i + 1]);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        for (int c = 0; c < nk; c += 16) {
            const __m512 p0 = tile_p(s0, c, nk, m0), p1 = tile_p(s1, c, nk, m1);
            a0 = _mm512_add_ps(a0, p0);
            a1 = _mm512_add_ps(a1, p1);
        }
        l[i] += hsum(a0);
        l[i + 1] += hsum(a1);
    }
    for (; i < nq; i++) {
        float *s0 = s + (size_t)i * lds;
        const __m512 m0 = _mm512_set1_ps(m[i]);
        __m512 a0 = _mm512_setzero_ps();
        for (int c = 0; c < nk; c += 16) a0 = _mm512_add_ps(a0, tile_p(s0, c, nk, m0));
        l[i] += hsum(a0);
    }
}

const tern_glm_kern tern__glm_kern_avx512 = {"avx512", dots_avx512, pv_avx512, tile_max_avx512, tile_exp_avx512, dots_h_avx512,
                                             pv_h_avx512};
