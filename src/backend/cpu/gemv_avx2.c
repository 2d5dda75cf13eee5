/*
 * gemv_avx2.c — fused batch-1 GEMV (decode) kernels for AVX2 + FMA + F16C machines.
 *
 * The same scheme as gemv_avx512.c at 8 lanes, for up to 4 weight rows sharing one x:
 *   BF16: 16 weights = 8 dwords; even weights = dword << 16, odd = dword & 0xffff0000,
 *     against x laid out per 16 inputs as the 8 even ones, then the 8 odd ones.
 *   Q8: Σ_g s_g·Σ_t q_t·x_t + Σ_g b_g·Σx_g, q via vpmovzxbd + vcvtdq2ps.
 *   Q4: 8 bytes -> 8 dwords (vpmovzxbd), low nibble = & 15, high nibble = >> 4, both
 *     converted and FMA'd against x in the same even/odd order; same s/b split as Q8.
 * Exact f32 arithmetic on unrounded x (summation order and the reference's per-weight
 * rounding of s·q + b differ; test_kern_gemv holds them to 1e-6·Σ|w·x|). No int8 mode here:
 * a request for it gets the exact kernels.
 */
#include "backend/cpu/kern.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define PF(p) _mm_prefetch((const char *)(p) + 1024, _MM_HINT_T0) /* see gemv_avx512.c */

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float sload(const uint8_t *p, tern_dtype t, int i) {
    if (t == TERN_DT_F32) return ((const float *)p)[i];
    if (t == TERN_DT_F16) return _cvtsh_ss(((const uint16_t *)p)[i]);
    return tern_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* scales of groups [g0, g0+ng) as f32, and Σ_g b_g·gsum_g over them */
static float grp_scales(const cpu_wrow *w, int g0, int ng, const float *gsum, float *sc) {
    float b = 0.0f;
    for (int i = 0; i < ng; i++) {
        sc[i] = sload(w->scales, w->sdtype, g0 + i);
        b += sload(w->biases, w->sdtype, g0 + i) * gsum[i];
    }
    return b;
}

static int prep(const cpu_wrow *w, int in, int int8, const float *x, void *buf, cpu_gx *gx) {
    (void)int8;
    if (in <= 0 || in > CPU_GX_MAX_IN || in % 64) return 0;
    int kind = w->dtype == TERN_DT_BF16 ? CPU_GX_BF16
             : w->dtype == TERN_DT_Q && w->bits == 8 ? CPU_GX_Q8
             : w->dtype == TERN_DT_Q && w->bits == 4 ? CPU_GX_Q4 : 0;
    if (!kind) return 0;
    float *xp = buf, *gsum = xp + in;
    memset(gx, 0, sizeof *gx);
    gx->kind = kind;
    gx->in = in;
    gx->gs = w->gs;
    gx->xp = kind == CPU_GX_Q8 ? x : xp;
    if (kind != CPU_GX_Q8) /* per 16 inputs: the 8 even ones, then the 8 odd ones */
        for (int b = 0; b < in; b += 16)
            for (int i = 0; i < 8; i++) { xp[b + i] = x[b + 2 * i]; xp[b + 8 + i] = x[b + 2 * i + 1]; }
    if (kind == CPU_GX_BF16) return 1;
    for (int g = 0; g * w->gs < in; g++) {
        __m256 s = _mm256_setzero_ps();
        for (int t = 0; t < w->gs; t += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + g * w->gs + t));
        gsum[g] = hsum8(s);
    }
    gx->gsum = gsum;
    return 1;
}

AI void k_bf16(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) {
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    __m256 ae[4], ao[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) ae[r] = ao[r] = _mm256_setzero_ps();
    for (int t = 0; t < gx->in; t += 16) {
        __m256 xe = _mm256_loadu_ps(gx->xp + t), xo = _mm256_loadu_ps(gx->xp + t + 8);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) {
            if (!(t & 31)) PF((const uint16_t *)rw[r].data + t);
            __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)rw[r].data + t));
            ae[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), xe, ae[r]);
            ao[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), xo, ao[r]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) y[r] = hsum8(_mm256_add_ps(ae[r], ao[r]));
}

/* Q8 (BITS 8) and Q4 (BITS 4): per group Σ q·x in a vector, then · s_g; biases via Σx. */
AI void k_q(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR, const int BITS) {
    const int gs = gx->gs, in = gx->in;
    const __m256i m15 = _mm256_set1_epi32(15);
    float sc[4][CPU_MAX_GROUPS], bsum[4] = {0};
    __m256 tot[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) tot[r] = _mm256_setzero_ps();
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
        int len = in - j0 < ch ? in - j0 : ch, ng = len / gs;
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) bsum[r] += grp_scales(&rw[r], j0 / gs, ng, gx->gsum + j0 / gs, sc[r]);
        for (int g = 0; g < ng; g++) {
            const float *x = gx->xp + j0 + g * gs;
            __m256 acc[4];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) { acc[r] = _mm256_setzero_ps(); PF(rw[r].data + (size_t)(j0 + g * gs) * BITS / 8); }
            for (int t = 0; t < gs; t += 16) {
                __m256 x0 = _mm256_loadu_ps(x + t), x1 = _mm256_loadu_ps(x + t + 8);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < NR; r++) {
                    const uint8_t *s = rw[r].data + (size_t)(j0 + g * gs + t) * BITS / 8;
                    __m256 q0, q1;
                    if (BITS == 8) {
                        q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)));
                        q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + 8))));
                    } else {
                        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s));
                        q0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, m15));
                        q1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
                    }
                    acc[r] = _mm256_fmadd_ps(q0, x0, acc[r]);
                    acc[r] = _mm256_fmadd_ps(q1, x1, acc[r]);
                }
            }
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) tot[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[r][g]), acc[r], tot[r]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) y[r] = hsum8(tot[r]) + bsum[r];
}

AI void k_q8(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) { k_q(gx, rw, y, NR, 8); }
AI void k_q4(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) { k_q(gx, rw, y, NR, 4); }

#define KCASE(K, fn) \
    case K: \
        if (nr == 4) fn(gx, rows, y, 4); \
        else if (nr == 3) fn(gx, rows, y, 3); \
        else if (nr == 2) fn(gx, rows, y, 2); \
        else fn(gx, rows, y, 1); \
        return;

static void gemv(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y) {
    switch (gx->kind) {
        KCASE(CPU_GX_BF16, k_bf16)
        KCASE(CPU_GX_Q8, k_q8)
        KCASE(CPU_GX_Q4, k_q4)
    default: return;
    }
}

int tern__cpu_gemv_prep_avx2(const cpu_wrow *w, int in, int mode, const float *x, void *buf, cpu_gx *gx) {
    return prep(w, in, mode, x, buf, gx); /* no int8 or bf16 kinds here: the exact kernels */
}
void tern__cpu_gemv_avx2(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y) { gemv(gx, rows, nr, y); }
