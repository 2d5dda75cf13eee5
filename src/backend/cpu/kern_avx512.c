/*
 * kern_avx512.c — the AVX-512 kernel table (F/BW/VL + VBMI), compiled with -mavx512*.
 *
 * Decoders (the hot loop of memory-bound GEMV):
 *   BF16: widen 16-bit to 32-bit and shift left 16.  F16: vcvtph2ps.
 *   Block FP8 (e4m3 + f32 scale per 128x128 block): bit move + exact ·2^120, times the scale.
 *   MLX affine, 16 codes at a time: a masked load of the 2·bits bytes that hold them,
 *   vpermb to give each 32-bit lane the two bytes its code straddles, a per-lane variable
 *   shift (vpsrlvd) to bring the code to bit 0, then per group either a table lookup —
 *   vpermps (16-entry table, 2/3/4 bits; the table repeats so bits above the code are
 *   ignored) or vpermt2ps (32 entries, 5 bits) of the group's values s·q + b — or, for 6/8
 *   bits, mask + convert + s·q + b. Table entries are computed as (s·q) + b with two
 *   roundings, exactly like the reference decoder, so decoded weights are bit-identical.
 * Microkernel: up to 4 weight rows × 4 activation rows, 16 zmm accumulators, masked tail.
 */
/* vpermb needs VBMI, which the Makefile's AVX-512 flag set does not include (tern__cpu_kern_pick checks it at run
 * time). GCC takes the target pragma; clang ignores it and takes an attribute applied to every function instead. */
#if !defined(__clang__)
#pragma GCC target("avx512vbmi")
#endif
#include "backend/cpu/kern.h"

#include "backend/cpu/vmath.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vbmi"))), apply_to = function)
#endif

/* vpermb index for 16 codes of b bits: lane t gets bytes o, o+1 (o = t·b/8) in its low half. */
#define PB(b, t) (char)(((t) * (b)) >> 3), (char)((((t) * (b)) >> 3) + 1), (char)((((t) * (b)) >> 3) + 1), (char)((((t) * (b)) >> 3) + 1)
#define PIDX(b) {PB(b, 0), PB(b, 1), PB(b, 2), PB(b, 3), PB(b, 4), PB(b, 5), PB(b, 6), PB(b, 7), \
                  PB(b, 8), PB(b, 9), PB(b, 10), PB(b, 11), PB(b, 12), PB(b, 13), PB(b, 14), PB(b, 15)}
#define SH(b, t) (((t) * (b)) & 7)
#define PSH(b) {SH(b, 0), SH(b, 1), SH(b, 2), SH(b, 3), SH(b, 4), SH(b, 5), SH(b, 6), SH(b, 7), \
                SH(b, 8), SH(b, 9), SH(b, 10), SH(b, 11), SH(b, 12), SH(b, 13), SH(b, 14), SH(b, 15)}

static const char perm_idx[9][64] __attribute__((aligned(64))) = {
    [2] = PIDX(2), [3] = PIDX(3), [4] = PIDX(4), [5] = PIDX(5), [6] = PIDX(6)};
static const int perm_sh[9][16] __attribute__((aligned(64))) = {
    [2] = PSH(2), [3] = PSH(3), [4] = PSH(4), [5] = PSH(5), [6] = PSH(6)};

/* Scales and biases of groups [g0, g0+ng) as f32 (ng <= CPU_MAX_GROUPS), 16 at a time. */
static void load_groups(const cpu_wrow *w, int g0, int ng, float *sc, float *bi) {
    for (int i = 0; i < ng; i += 16) {
        int m = ng - i < 16 ? ng - i : 16;
        __mmask16 k = (__mmask16)((1u << m) - 1);
        const uint8_t *ps[2] = {w->scales, w->biases};
        float *dst[2] = {sc, bi};
        for (int t = 0; t < 2; t++) {
            __m512 v;
            if (w->sdtype == TERN_DT_F32) v = _mm512_maskz_loadu_ps(k, (const float *)ps[t] + g0 + i);
            else {
                __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)ps[t] + g0 + i);
                v = w->sdtype == TERN_DT_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            }
            _mm512_mask_storeu_ps(dst[t] + i, k, v);
        }
    }
}

static void decode_q(const cpu_wrow *w, int j0, int len, float *dst) {
    const int b = w->bits, gs = w->gs;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 iota_hi = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
    const __m512i idx = _mm512_load_si512(perm_idx[b]);
    const __m512i sh = _mm512_load_si512(perm_sh[b]);
    const __mmask64 lm = (__mmask64)((1ull << (2 * b)) - 1); /* 16 codes = 2·b bytes */
    const __m512i cmask = _mm512_set1_epi32((1 << b) - 1);
    const __m512 rep = b == 2 ? _mm512_set1_ps(4.0f) : _mm512_set1_ps(8.0f);
    const uint8_t *src = w->data + (size_t)j0 * b / 8;
    float sc[CPU_MAX_GROUPS], bi[CPU_MAX_GROUPS];
    load_groups(w, j0 / gs, len / gs, sc, bi);
    for (int g0 = 0, gi = 0; g0 < len; g0 += gs, gi++) {
        __m512 vs = _mm512_set1_ps(sc[gi]);
        __m512 vb = _mm512_set1_ps(bi[gi]);
        float *d = dst + g0;
        if (b == 8) {
            for (int t = 0; t < gs; t += 16, src += 16) {
                __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src)));
                _mm512_storeu_ps(d + t, _mm512_add_ps(_mm512_mul_ps(vs, q), vb));
            }
        } else if (b == 6) {
            for (int t = 0; t < gs; t += 16, src += 12) {
                __m512i v = _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(lm, src));
                v = _mm512_and_si512(_mm512_srlv_epi32(v, sh), cmask);
                _mm512_storeu_ps(d + t, _mm512_add_ps(_mm512_mul_ps(vs, _mm512_cvtepi32_ps(v)), vb));
            }
        } else if (b == 5) {
            __m512 lo = _mm512_add_ps(_mm512_mul_ps(vs, iota), vb), hi = _mm512_add_ps(_mm512_mul_ps(vs, iota_hi), vb);
            for (int t = 0; t < gs; t += 16, src += 10) {
                __m512i v = _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(lm, src));
                _mm512_storeu_ps(d + t, _mm512_permutex2var_ps(lo, _mm512_srlv_epi32(v, sh), hi));
            }
        } else { /* 2, 3, 4 bits: 16-entry table indexed by bits [3:0]; entry i holds code i mod 2^b */
            __m512 qv = b == 4 ? iota : _mm512_sub_ps(iota, _mm512_mul_ps(rep, _mm512_roundscale_ps(_mm512_div_ps(iota, rep), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)));
            __m512 lut = _mm512_add_ps(_mm512_mul_ps(vs, qv), vb);
            for (int t = 0; t < gs; t += 16, src += 2 * b) {
                __m512i v = _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(lm, src));
                _mm512_storeu_ps(d + t, _mm512_permutexvar_ps(_mm512_srlv_epi32(v, sh), lut));
            }
        }
    }
}

/* 16 e4m3 bytes -> f32, exact: the 7 magnitude bits moved to f32 bits 20..26 read as a float
 * equal value·2^-120 (normals and subnormals alike), so one multiply by 2^120 restores it; the
 * sign bit goes to bit 31; 0x7f/0xff are NaN as in the reference. */
static inline __m512 f8x16(const uint8_t *p) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
    __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)), _mm512_set1_ps(0x1p120f));
    f = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24)));
    return _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)), _mm512_set1_ps(__builtin_nanf("")));
}

/* Block FP8 slice: per column block, 16 codes at a time times the block's scale; returns how
 * many leading elements were done (the rest of the last block goes to the scalar decoder). */
static int decode_f8(const cpu_wrow *w, int j0, int len, float *dst) {
    int t = 0;
    while (t < len) {
        int j = j0 + t, end = w->scales ? (j / w->gs + 1) * w->gs - j0 : len;
        if (end > len) end = len;
        __m512 s = _mm512_set1_ps(w->scales ? ((const float *)(const void *)w->scales)[j / w->gs] : 1.0f);
        for (; t + 16 <= end; t += 16) _mm512_storeu_ps(dst + t, _mm512_mul_ps(f8x16(w->data + j0 + t), s));
        if (t < end) {
            cpu_wrow one = *w;
            tern__cpu_decode_scalar(&one, j0 + t, end - t, dst + t);
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
        for (; t + 16 <= len; t += 16)
            _mm512_storeu_ps(dst + t, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + t))), 16)));
        break;
    }
    case TERN_DT_F16: {
        const uint16_t *s = (const uint16_t *)w->data + j0;
        for (; t + 16 <= len; t += 16) _mm512_storeu_ps(dst + t, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + t))));
        break;
    }
    default: break;
    }
    if (t < len) {
        cpu_wrow tail = *w;
        tern__cpu_decode_scalar(&tail, j0 + t, len - t, dst + t);
    }
}

/* ---- f32 microkernels ---- */

static inline __attribute__((always_inline)) void mk_t(const float *const *w, const float *const *x, int len,
                                                       float acc[4][4], const int NW, const int NX) {
    __m512 a[4][4];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NX; j++) a[i][j] = _mm512_setzero_ps();
    int t = 0;
    for (; t + 16 <= len; t += 16) {
        __m512 xv[4];
        for (int j = 0; j < NX; j++) xv[j] = _mm512_loadu_ps(x[j] + t);
        for (int i = 0; i < NW; i++) {
            __m512 wv = _mm512_loadu_ps(w[i] + t);
            for (int j = 0; j < NX; j++) a[i][j] = _mm512_fmadd_ps(wv, xv[j], a[i][j]);
        }
    }
    if (t < len) {
        __mmask16 m = (__mmask16)((1u << (len - t)) - 1);
        __m512 xv[4];
        for (int j = 0; j < NX; j++) xv[j] = _mm512_maskz_loadu_ps(m, x[j] + t);
        for (int i = 0; i < NW; i++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, w[i] + t);
            for (int j = 0; j < NX; j++) a[i][j] = _mm512_fmadd_ps(wv, xv[j], a[i][j]);
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NX; j++) acc[i][j] = _mm512_reduce_add_ps(a[i][j]);
}

/* One weight row against one activation row: 4 independent accumulators hide FMA latency. */
static float dot(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int t = 0;
    for (; t + 64 <= n; t += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + t), _mm512_loadu_ps(b + t), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + t + 16), _mm512_loadu_ps(b + t + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + t + 32), _mm512_loadu_ps(b + t + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + t + 48), _mm512_loadu_ps(b + t + 48), s3);
    }
    for (; t + 16 <= n; t += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + t), _mm512_loadu_ps(b + t), s0);
    if (t < n) {
        __mmask16 m = (__mmask16)((1u << (n - t)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + t), _mm512_maskz_loadu_ps(m, b + t), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

#define MK(NW, NX) case (NW) * 8 + (NX): mk_t(w, x, len, acc, NW, NX); return;
static void mk(const float *const *w, int nw, const float *const *x, int nx, int len, float acc[4][4]) {
    if (nw == 1 && nx == 1) { acc[0][0] = dot(w[0], x[0], len); return; }
    switch (nw * 8 + nx) {
        MK(1, 2) MK(1, 3) MK(1, 4)
        MK(2, 1) MK(2, 2) MK(2, 3) MK(2, 4)
        MK(3, 1) MK(3, 2) MK(3, 3) MK(3, 4)
        MK(4, 1) MK(4, 2) MK(4, 3) MK(4, 4)
    default: return;
    }
}

static void axpy(float *y, float a, const float *x, int n) {
    __m512 va = _mm512_set1_ps(a);
    int t = 0;
    for (; t + 16 <= n; t += 16) _mm512_storeu_ps(y + t, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + t), _mm512_loadu_ps(y + t)));
    if (t < n) {
        __mmask16 m = (__mmask16)((1u << (n - t)) - 1);
        _mm512_mask_storeu_ps(y + t, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + t), _mm512_maskz_loadu_ps(m, y + t)));
    }
}

/* y = (x·s)·w per element, the scalar loop's two roundings in its order */
static void norm_apply(float *y, const float *x, float s, const float *w, int n) {
    const __m512 vs = _mm512_set1_ps(s);
    int t = 0;
    if (w)
        for (; t + 16 <= n; t += 16) _mm512_storeu_ps(y + t, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + t), vs), _mm512_loadu_ps(w + t)));
    else
        for (; t + 16 <= n; t += 16) _mm512_storeu_ps(y + t, _mm512_mul_ps(_mm512_loadu_ps(x + t), vs));
    for (; t < n; t++) y[t] = w ? x[t] * s * w[t] : x[t] * s;
}

static void scal(float *y, float a, int n) {
    __m512 va = _mm512_set1_ps(a);
    int t = 0;
    for (; t + 16 <= n; t += 16) _mm512_storeu_ps(y + t, _mm512_mul_ps(va, _mm512_loadu_ps(y + t)));
    for (; t < n; t++) y[t] *= a;
}

static double readsum(const float *p, size_t n) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t t = 0;
    for (; t + 64 <= n; t += 64) {
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + t));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(p + t + 16));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(p + t + 32));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(p + t + 48));
    }
    s0 = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
    return (double)_mm512_reduce_add_epi64(s0);
}

/* Fused 4-bit GEMV row: per group a 16-entry table of s·q + b (the reference's rounding),
 * per 32 inputs one byte-to-dword widen, one shift and two vpermps lookups feeding FMAs
 * against x in q4 order (lanes = even inputs, then odd inputs). */
static float gemv_q4(const cpu_wrow *w, int in, const float *xq) {
    const int gs = w->gs;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float sc[CPU_MAX_GROUPS], bi[CPU_MAX_GROUPS];
    const uint8_t *src = w->data;
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
        int len = in - j0 < ch ? in - j0 : ch;
        load_groups(w, j0 / gs, len / gs, sc, bi);
        for (int g0 = 0, gi = 0; g0 < len; g0 += gs, gi++) {
            __m512 lut = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(sc[gi]), iota), _mm512_set1_ps(bi[gi]));
            const float *x = xq + j0 + g0;
            for (int t = 0; t < gs; t += 32, src += 16) { /* alternate accumulator pairs */
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
                __m512 lo = _mm512_permutexvar_ps(v, lut), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
                if (t & 32) {
                    a2 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + t), a2);
                    a3 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + t + 16), a3);
                } else {
                    a0 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + t), a0);
                    a1 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + t + 16), a1);
                }
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* y = cap·tanh(y / cap) (the logit softcap), 16 lanes at a time, the tail masked */
static void softcap_v(float *y, int64_t n, float cap) {
    const __m512 c = _mm512_set1_ps(cap), ic = _mm512_set1_ps(1.0f / cap);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, y + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(c, vtanh(_mm512_mul_ps(v, ic))));
    }
}

/* y = silu(g)·u = g / (1 + e^-g)·u (u NULL: silu(g)), the reference's formula with vexp for expf; NaN lanes keep
 * theirs (through the arithmetic) */
static void silu_mul_v(float *y, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 v = _mm512_div_ps(x, _mm512_add_ps(one, vexp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), v, x);
        if (u) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* y = gelu_tanh(g) · u (u NULL: gelu_tanh(g)), the reference's formula 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) */
static void gelu_mul_v(float *y, const float *g, const float *u, int64_t n) {
    const __m512 c = _mm512_set1_ps(0.7978845608028654f), k = _mm512_set1_ps(0.044715f), h = _mm512_set1_ps(0.5f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 in = _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(k, _mm512_mul_ps(x, x)), x, x));
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(h, x), _mm512_add_ps(_mm512_set1_ps(1.0f), vtanh(in)));
        if (u) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* Two running (max, first index) lane sets over alternate blocks of 16 (independent chains); a lane takes a
 * value only when strictly larger, so each lane keeps its first index of its max, and the lowest index among
 * the lanes that reach the overall max is the first occurrence. A block with a NaN or +inf returns at once:
 * no earlier block had one. */
static int32_t argmax(const float *x, int n) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), pinf = _mm512_set1_ps(INFINITY);
    const __m512i step = _mm512_set1_epi32(16);
    __m512 m0 = ninf, m1 = ninf;
    __m512i i0 = _mm512_set1_epi32(-1), i1 = i0;
    __m512i c0 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), c1 = _mm512_add_epi32(c0, step);
    const __m512i step2 = _mm512_add_epi32(step, step);
    int t = 0;
#define ARGMAX_BLOCK(v, m, ix, c, at)                                                                            \
    do {                                                                                                        \
        const __mmask16 sp = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v, pinf, _CMP_EQ_OQ); \
        if (sp) {                                                                                               \
            const int j = (at) + __builtin_ctz(sp);                                                             \
            return x[j] != x[j] ? -2 : -3;                                                                      \
        }                                                                                                       \
        const __mmask16 gt = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ);                                              \
        m = _mm512_mask_mov_ps(m, gt, v);                                                                       \
        ix = _mm512_mask_mov_epi32(ix, gt, c);                                                                  \
    } while (0)
    for (; t + 32 <= n; t += 32) {
        const __m512 v0 = _mm512_loadu_ps(x + t), v1 = _mm512_loadu_ps(x + t + 16);
        ARGMAX_BLOCK(v0, m0, i0, c0, t);
        ARGMAX_BLOCK(v1, m1, i1, c1, t + 16);
        c0 = _mm512_add_epi32(c0, step2);
        c1 = _mm512_add_epi32(c1, step2);
    }
    for (; t < n; t += 16) { /* the tail: masked loads, -inf beyond n */
        const __mmask16 k = n - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - t)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(ninf, k, x + t);
        ARGMAX_BLOCK(v, m0, i0, c0, t);
        c0 = _mm512_add_epi32(c0, step);
    }
#undef ARGMAX_BLOCK
    const __mmask16 g1 = _mm512_cmp_ps_mask(m1, m0, _CMP_GT_OQ);
    const __mmask16 e1 = _mm512_cmp_ps_mask(m1, m0, _CMP_EQ_OQ);
    /* per lane: the larger max, or on a tie the lower index of the two (-1 = none never ties above -inf) */
    const __m512i lo = _mm512_min_epi32(i0, i1);
    i0 = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(i0, g1, i1), e1, lo);
    m0 = _mm512_mask_mov_ps(m0, g1, m1);
    const float mx = _mm512_reduce_max_ps(m0);
    if (mx == -INFINITY) return -1;
    return _mm512_mask_reduce_min_epi32(_mm512_cmp_ps_mask(m0, _mm512_set1_ps(mx), _CMP_EQ_OQ), i0);
}

const tern_cpu_kern tern__cpu_kern_avx512 = {
    .gemv_q4 = gemv_q4,
    .gemv_prep = tern__cpu_gemv_prep_avx512,
    .gemv = tern__cpu_gemv_avx512,
    .gemv_nx = tern__cpu_gemv_nx_avx512, /* several x: each row unpacked once for all (Q4_I8, BF16, Q4) */
    .gemv_nr = 8, /* the Q8_I8 kernel takes 8 rows; 8 per call measured neutral (NOTES (k)) */
    /* one row per call for Q8_I8: llama3-1b's GEMVs in the model ~40 -> ~47-52 GB/s (NOTES (ac)); Q4_I8 reads
     * its rows one at a time inside the call (k_q4i8r, 4 chains a row), the exact Q kinds keep 4 (one row per
     * call lost there: one accumulator chain a row) */
    .gemv_pass = {[CPU_GX_Q8_I8] = 1},
    .gemv_nx_pass = {[CPU_GX_Q4_I8] = 16},
    .name = "avx512",
    .decode = decode,
    .mk = mk,
    .dot = dot,
    .axpy = axpy,
    .scal = scal,
    .norm_apply = norm_apply,
    .readsum = readsum,
    .argmax = argmax,
    .gemm_nr = 32,
    .gemm_mr = 12,
    .gemm_pack = tern__cpu_gemm_pack_avx512,
    .gemm_pack_x = tern__cpu_gemm_pack_x_avx512,
    .gemm_mk = tern__cpu_gemm_mk_avx512,
    .gemm_bf16_pack = tern__cpu_gemm_pack_bf16_avx512,
    .gemm_bf16_pack_x = tern__cpu_gemm_pack_x_bf16_avx512,
    .gemm_bf16_mk = tern__cpu_gemm_mk_bf16_avx512,
    .softcap = softcap_v,
    .gelu_mul = gelu_mul_v,
    .silu_mul = silu_mul_v,
};

#if defined(__clang__)
#pragma clang attribute pop
#endif
