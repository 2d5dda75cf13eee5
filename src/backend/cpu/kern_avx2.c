/*
 * kern_avx2.c — the AVX2 + FMA + F16C kernel table (machines without AVX-512).
 *
 * Same structure as kern_avx512.c at 8 lanes:
 *   BF16: widen + shift; F16: vcvtph2ps; block FP8: bit move + one exact multiply, times the
 *   block scale (one rounding, as the reference).
 *   MLX affine, 16 codes (2·bits bytes) at a time: the bytes are broadcast to both 128-bit
 *   lanes, vpshufb gives each 32-bit lane the two bytes its code straddles, vpsrlvd brings
 *   the code to bit 0, then mask, convert and (s·q) + b — two roundings, as the reference.
 *   Loads never read past the slice: the last chunk of a slice goes through a small copy.
 * Microkernel: up to 4 weight rows × 2 activation rows per pass (8 ymm accumulators; 16
 * would spill), run twice for 4 activation rows.
 */
#include "backend/cpu/kern.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define PB(b, t) (char)(((t) * (b)) >> 3), (char)((((t) * (b)) >> 3) + 1), (char)0x80, (char)0x80
#define SH(b, t) (((t) * (b)) & 7)
/* [bits][half]: shuffle for codes 8h..8h+7 (lanes 0-3 in the low 128 bits, 4-7 in the high) */
#define PIDX(b, h) {PB(b, 8 * (h) + 0), PB(b, 8 * (h) + 1), PB(b, 8 * (h) + 2), PB(b, 8 * (h) + 3), \
                    PB(b, 8 * (h) + 4), PB(b, 8 * (h) + 5), PB(b, 8 * (h) + 6), PB(b, 8 * (h) + 7)}
#define PSH(b, h) {SH(b, 8 * (h) + 0), SH(b, 8 * (h) + 1), SH(b, 8 * (h) + 2), SH(b, 8 * (h) + 3), \
                   SH(b, 8 * (h) + 4), SH(b, 8 * (h) + 5), SH(b, 8 * (h) + 6), SH(b, 8 * (h) + 7)}

static const char shuf_idx[9][2][32] __attribute__((aligned(32))) = {
    [2] = {PIDX(2, 0), PIDX(2, 1)}, [3] = {PIDX(3, 0), PIDX(3, 1)}, [4] = {PIDX(4, 0), PIDX(4, 1)},
    [5] = {PIDX(5, 0), PIDX(5, 1)}, [6] = {PIDX(6, 0), PIDX(6, 1)}, [8] = {PIDX(8, 0), PIDX(8, 1)}};
static const int shuf_sh[9][2][8] __attribute__((aligned(32))) = {
    [2] = {PSH(2, 0), PSH(2, 1)}, [3] = {PSH(3, 0), PSH(3, 1)}, [4] = {PSH(4, 0), PSH(4, 1)},
    [5] = {PSH(5, 0), PSH(5, 1)}, [6] = {PSH(6, 0), PSH(6, 1)}, [8] = {PSH(8, 0), PSH(8, 1)}};

static void decode_q(const cpu_wrow *w, int j0, int len, float *dst) {
    const int b = w->bits, gs = w->gs, cb = 2 * b; /* bytes per 16 codes */
    const __m256i i0 = _mm256_load_si256((const __m256i *)shuf_idx[b][0]), i1 = _mm256_load_si256((const __m256i *)shuf_idx[b][1]);
    const __m256i s0 = _mm256_load_si256((const __m256i *)shuf_sh[b][0]), s1 = _mm256_load_si256((const __m256i *)shuf_sh[b][1]);
    const __m256i cmask = _mm256_set1_epi32((1 << b) - 1);
    const uint8_t *src = w->data + (size_t)j0 * b / 8, *end = src + (size_t)len * b / 8;
    float sc[CPU_MAX_GROUPS], bi[CPU_MAX_GROUPS];
    int gb = j0 / gs, ng = len / gs;
    for (int i = 0; i < ng; i++) { /* convert the slice's scales/biases once */
        if (w->sdtype == TERN_DT_F32) { sc[i] = ((const float *)w->scales)[gb + i]; bi[i] = ((const float *)w->biases)[gb + i]; }
        else if (w->sdtype == TERN_DT_BF16) { sc[i] = tern_bf16_to_f32(((const uint16_t *)w->scales)[gb + i]); bi[i] = tern_bf16_to_f32(((const uint16_t *)w->biases)[gb + i]); }
        else { sc[i] = _cvtsh_ss(((const uint16_t *)w->scales)[gb + i]); bi[i] = _cvtsh_ss(((const uint16_t *)w->biases)[gb + i]); }
    }
    for (int g0 = 0, gi = 0; g0 < len; g0 += gs, gi++) {
        __m256 vs = _mm256_set1_ps(sc[gi]);
        __m256 vb = _mm256_set1_ps(bi[gi]);
        float *d = dst + g0;
        for (int t = 0; t < gs; t += 16, src += cb) {
            __m128i raw;
            if (end - src >= 16) raw = _mm_loadu_si128((const __m128i *)src);
            else { uint8_t tmp[16] = {0}; memcpy(tmp, src, (size_t)cb); raw = _mm_loadu_si128((const __m128i *)tmp); }
            __m256i v = _mm256_broadcastsi128_si256(raw);
            __m256i q0 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, i0), s0), cmask);
            __m256i q1 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(v, i1), s1), cmask);
            _mm256_storeu_ps(d + t, _mm256_add_ps(_mm256_mul_ps(vs, _mm256_cvtepi32_ps(q0)), vb));
            _mm256_storeu_ps(d + t + 8, _mm256_add_ps(_mm256_mul_ps(vs, _mm256_cvtepi32_ps(q1)), vb));
        }
    }
}

/* 8 e4m3 bytes -> f32, exact (see kern_avx512.c f8x16). */
static inline __m256 f8x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7f));
    __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), _mm256_set1_ps(0x1p120f));
    f = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(f), _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24)));
    __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
    return _mm256_blendv_ps(f, _mm256_set1_ps(__builtin_nanf("")), nan);
}

static int decode_f8(const cpu_wrow *w, int j0, int len, float *dst) {
    int t = 0;
    while (t < len) {
        int j = j0 + t, end = w->scales ? (j / w->gs + 1) * w->gs - j0 : len;
        if (end > len) end = len;
        __m256 s = _mm256_set1_ps(w->scales ? ((const float *)(const void *)w->scales)[j / w->gs] : 1.0f);
        for (; t + 8 <= end; t += 8) _mm256_storeu_ps(dst + t, _mm256_mul_ps(f8x8(w->data + j0 + t), s));
        if (t < end) {
            tern__cpu_decode_scalar(w, j0 + t, end - t, dst + t);
            t = end;
        }
    }
    return t;
}

static void decode(const cpu_wrow *w, int j0, int len, float *dst) {
    int t = 0;
    switch (w->dtype) {
    case TERN_DT_Q: decode_q(w, j0, len, dst); return;
    case TERN_DT_F8_E4M3: t = decode_f8(w, j0, len, dst); break;
    case TERN_DT_F32: memcpy(dst, (const float *)w->data + j0, (size_t)len * sizeof *dst); return;
    case TERN_DT_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + j0;
        for (; t + 8 <= len; t += 8)
            _mm256_storeu_ps(dst + t, _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + t))), 16)));
        break;
    }
    case TERN_DT_F16: {
        const uint16_t *s = (const uint16_t *)w->data + j0;
        for (; t + 8 <= len; t += 8) _mm256_storeu_ps(dst + t, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + t))));
        break;
    }
    default: break;
    }
    if (t < len) tern__cpu_decode_scalar(w, j0 + t, len - t, dst + t);
}

/* ---- f32 microkernels ---- */

static inline __m256i tail_mask(int r) { /* lanes < r set */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void mk_t(const float *const *w, const float *const *x, int len,
                                                       float acc[4][4], int xo, const int NW, const int NX) {
    __m256 a[4][2];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NX; j++) a[i][j] = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= len; t += 8) {
        __m256 xv[2];
        for (int j = 0; j < NX; j++) xv[j] = _mm256_loadu_ps(x[xo + j] + t);
        for (int i = 0; i < NW; i++) {
            __m256 wv = _mm256_loadu_ps(w[i] + t);
            for (int j = 0; j < NX; j++) a[i][j] = _mm256_fmadd_ps(wv, xv[j], a[i][j]);
        }
    }
    if (t < len) {
        __m256i m = tail_mask(len - t);
        __m256 xv[2];
        for (int j = 0; j < NX; j++) xv[j] = _mm256_maskload_ps(x[xo + j] + t, m);
        for (int i = 0; i < NW; i++) {
            __m256 wv = _mm256_maskload_ps(w[i] + t, m);
            for (int j = 0; j < NX; j++) a[i][j] = _mm256_fmadd_ps(wv, xv[j], a[i][j]);
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NX; j++) acc[i][xo + j] = hsum(a[i][j]);
}

static float dot(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int t = 0;
    for (; t + 32 <= n; t += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(b + t), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + t + 8), _mm256_loadu_ps(b + t + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + t + 16), _mm256_loadu_ps(b + t + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + t + 24), _mm256_loadu_ps(b + t + 24), s3);
    }
    for (; t + 8 <= n; t += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(b + t), s0);
    if (t < n) {
        __m256i m = tail_mask(n - t);
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + t, m), _mm256_maskload_ps(b + t, m), s1);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

#define MKW(NW)                                                     \
    case NW:                                                        \
        for (int xo = 0; xo < nx; xo += 2) {                        \
            if (nx - xo >= 2) mk_t(w, x, len, acc, xo, NW, 2);      \
            else mk_t(w, x, len, acc, xo, NW, 1);                   \
        }                                                           \
        return;
static void mk(const float *const *w, int nw, const float *const *x, int nx, int len, float acc[4][4]) {
    if (nw == 1 && nx == 1) { acc[0][0] = dot(w[0], x[0], len); return; }
    switch (nw) { MKW(1) MKW(2) MKW(3) MKW(4) default: return; }
}

static void axpy(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int t = 0;
    for (; t + 8 <= n; t += 8) _mm256_storeu_ps(y + t, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + t), _mm256_loadu_ps(y + t)));
    for (; t < n; t++) y[t] += a * x[t];
}

/* y = (x·s)·w per element, the scalar loop's two roundings in its order */
static void norm_apply(float *y, const float *x, float s, const float *w, int n) {
    const __m256 vs = _mm256_set1_ps(s);
    int t = 0;
    if (w)
        for (; t + 8 <= n; t += 8) _mm256_storeu_ps(y + t, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + t), vs), _mm256_loadu_ps(w + t)));
    else
        for (; t + 8 <= n; t += 8) _mm256_storeu_ps(y + t, _mm256_mul_ps(_mm256_loadu_ps(x + t), vs));
    for (; t < n; t++) y[t] = w ? x[t] * s * w[t] : x[t] * s;
}

static void scal(float *y, float a, int n) {
    __m256 va = _mm256_set1_ps(a);
    int t = 0;
    for (; t + 8 <= n; t += 8) _mm256_storeu_ps(y + t, _mm256_mul_ps(va, _mm256_loadu_ps(y + t)));
    for (; t < n; t++) y[t] *= a;
}

static double readsum(const float *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t t = 0;
    for (; t + 32 <= n; t += 32) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + t)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + t + 8)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + t + 16)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + t + 24)));
    }
    s0 = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    return (double)(_mm256_extract_epi64(s0, 0) ^ _mm256_extract_epi64(s0, 1) ^ _mm256_extract_epi64(s0, 2) ^ _mm256_extract_epi64(s0, 3));
}

/* As kern_avx512.c's: one (max, first index) lane set over blocks of 8, strictly-larger updates; a block with a
 * NaN or +inf returns at once (no earlier block had one). */
static int32_t argmax(const float *x, int n) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), pinf = _mm256_set1_ps(INFINITY);
    __m256 m = ninf;
    __m256i ix = _mm256_set1_epi32(-1), c = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    float tail[8];
    for (int t = 0; t < n; t += 8) {
        const float *p = x + t;
        if (n - t < 8) { /* the tail, -inf beyond n */
            for (int j = 0; j < 8; j++) tail[j] = t + j < n ? x[t + j] : -INFINITY;
            p = tail;
        }
        const __m256 v = _mm256_loadu_ps(p);
        const int sp = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(v, pinf, _CMP_EQ_OQ)));
        if (sp) {
            const int j = t + __builtin_ctz((unsigned)sp);
            return x[j] != x[j] ? -2 : -3;
        }
        const __m256 gt = _mm256_cmp_ps(v, m, _CMP_GT_OQ);
        m = _mm256_blendv_ps(m, v, gt);
        ix = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(ix), _mm256_castsi256_ps(c), gt));
        c = _mm256_add_epi32(c, step);
    }
    float mv[8];
    int32_t iv[8];
    _mm256_storeu_ps(mv, m);
    _mm256_storeu_si256((__m256i *)iv, ix);
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++) mx = mv[j] > mx ? mv[j] : mx;
    if (mx == -INFINITY) return -1;
    int32_t best = -1;
    for (int j = 0; j < 8; j++)
        if (mv[j] == mx && (best < 0 || iv[j] < best)) best = iv[j];
    return best;
}

const tern_cpu_kern tern__cpu_kern_avx2 = {
    .name = "avx2",
    .gemv_prep = tern__cpu_gemv_prep_avx2,
    .gemv = tern__cpu_gemv_avx2,
    .decode = decode,
    .mk = mk,
    .dot = dot,
    .axpy = axpy,
    .scal = scal,
    .norm_apply = norm_apply,
    .readsum = readsum,
    .argmax = argmax,
    .gemm_nr = 16,
    .gemm_mr = 6,
    .gemm_pack = tern__cpu_gemm_pack_avx2,
    .gemm_pack_x = tern__cpu_gemm_pack_x_avx2,
    .gemm_mk = tern__cpu_gemm_mk_avx2,
    .softcap = tern__cpu_softcap_scalar,
    .gelu_mul = tern__cpu_gelu_mul_scalar,
    .silu_mul = tern__cpu_silu_mul_scalar,
};
