/*
 * vmath.h — e^x (and tanh) for f32 vectors, shared by the files compiled with AVX2 or AVX-512 flags:
 * kern_avx512.c (SiLU, GELU-tanh, the logit softcap), glm_avx512.c and glm_avx2.c (the attention tiles'
 * softmax and softcap). One set of constants; each function within a few f32 ulp of expf / tanhf
 * (test_kern_ops). Internal to src/backend/cpu; include only from AVX2 / AVX-512 translation units.
 */
#ifndef TERN_VMATH_H
#define TERN_VMATH_H

#include <immintrin.h>

#define VEXP_HI 88.0f                          /* z clamped to [VEXP_LO, VEXP_HI] */
#define VEXP_LO (-87.0f)
#define VEXP_LOG2E 1.44269504088896341f
#define VEXP_LN2_HI 0.693145751953125f          /* n·ln2_hi exact for |n| < 2^10 */
#define VEXP_LN2_LO 1.42860682030941723212e-6f
/* e^r = Σ r^i / i!, i = 0..8 (Horner from the top) */
static const float vexp_c[9] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040, 1.0f / 40320};

#ifdef __AVX2__
/* vexp for 8 lanes (AVX2): the same steps, 2^n built in the exponent field (n stays in [-126, 127]). */
static inline __m256 vexp8(__m256 z) {
    z = _mm256_max_ps(_mm256_min_ps(z, _mm256_set1_ps(VEXP_HI)), _mm256_set1_ps(VEXP_LO));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(VEXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VEXP_LN2_HI), z);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VEXP_LN2_LO), r);
    __m256 e = _mm256_set1_ps(vexp_c[8]);
    for (int i = 7; i >= 0; i--) e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(vexp_c[i]));
    const __m256i pw = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(pw));
}
#endif

#ifdef __AVX512F__
/* e^z for 16 lanes, z clamped to [-87, 88] (beyond, callers' results no longer depend on it): e^z = 2^n e^r with
 * n = round(z log2 e), r = z - n ln 2 in two parts (n ln2_hi exact), e^r by its Taylor series to r^8 (|r| <= ln2 / 2,
 * the first omitted term < 3e-10 of the result), 2^n by vscalefps. */
static inline __m512 vexp(__m512 z) {
    z = _mm512_max_ps(_mm512_min_ps(z, _mm512_set1_ps(VEXP_HI)), _mm512_set1_ps(VEXP_LO));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(z, _mm512_set1_ps(VEXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VEXP_LN2_HI), z);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VEXP_LN2_LO), r);
    __m512 e = _mm512_set1_ps(vexp_c[8]);
    for (int i = 7; i >= 0; i--) e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(vexp_c[i]));
    return _mm512_scalef_ps(e, n);
}

/* tanh for 16 lanes, within ~2 f32 ulp of tanhf (test_kern_ops checks it over [-20, 20], tiny values, ±inf, NaN):
 * |x| < 0.55: the odd Taylor series to x^21 in Horner form (the first omitted term is < 1.5e-8 of the result);
 * else tanh|x| = (1 - t) / (1 + t), t = e^(-2|x|) with |x| clamped to 9 (tanh = 1 in f32 beyond). Sign copied
 * back; NaN lanes return their input. The softcap of Gemma's 262k-entry vocabulary took 1.5 ms a token in tanhf. */
static inline __m512 vtanh(__m512 x) {
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    __m512 a = _mm512_andnot_ps(sgn, x), a2 = _mm512_mul_ps(a, a);
    static const float tc[] = {-0.333333333333f, 0.133333333333f, -0.0539682539683f, 0.0218694885362f,
                               -0.00886323552990f, 0.00359212803657f, -0.00145583438705f, 0.000590027440946f,
                               -0.000239129114244f, 0.0000969153795830f};
    __m512 p = _mm512_set1_ps(tc[9]);
    for (int i = 8; i >= 0; i--) p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(tc[i]));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, a2), a, a);
    __m512 t = vexp(_mm512_mul_ps(_mm512_min_ps(a, _mm512_set1_ps(9.0f)), _mm512_set1_ps(-2.0f))), one = _mm512_set1_ps(1.0f);
    __m512 big = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
    __m512 y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.55f), _CMP_LT_OQ), big, small);
    y = _mm512_or_ps(y, _mm512_and_ps(x, sgn));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}
#endif

#endif
