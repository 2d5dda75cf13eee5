/*
 * gemm_avx512.c — the AVX-512 pieces of the blocked prefill GEMM (driver: cpu_matmul.c).
 *
 * y[r][o] = Σ_t x[r][t]·W[o][t] is computed as outer products: for every input t, one
 * broadcast of x[r][t] times a vector of 16 consecutive output features o. The weight strip
 * therefore has to be laid out input-major, wp[t·32 + i] for 32 features i: the driver
 * decodes 32 weight rows into f32 rows (the ISA decoder, bit-identical to the reference)
 * and gemm_pack transposes them with 16×16 in-register transposes (64 shuffles per 256
 * floats). The microkernel holds a 12×32 block of y in 24 zmm accumulators; per input it
 * does 2 aligned weight loads, 12 broadcasts and 24 FMAs, so it is FMA-bound as long as the
 * strip (len·128 bytes) and the packed x block stay in L1/L2. Every y element is one
 * sequential f32 FMA chain over the inputs of a block (exact f32 arithmetic, no reduction
 * tree); the driver adds the blocks of inputs into y in order.
 */
#include "backend/cpu/kern.h"

#include <immintrin.h>

#define NR 32
#define MR 12

/* 16 rows (src + i·ld, 16 floats each) to 16 columns: dst + j·NR holds column j. */
static inline void tr16(const float *src, int ld, float *dst) {
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)i * ld);
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* u[4k+m], 128-bit lane L: column 4L+m of rows 4k..4k+3 */
    for (int k = 0; k < 4; k++) {
        u[4 * k + 0] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
        __m512 c = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44), d = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
        _mm512_store_ps(dst + (size_t)(0 + m) * NR, _mm512_shuffle_f32x4(a, c, 0x88));
        _mm512_store_ps(dst + (size_t)(4 + m) * NR, _mm512_shuffle_f32x4(a, c, 0xDD));
        _mm512_store_ps(dst + (size_t)(8 + m) * NR, _mm512_shuffle_f32x4(b, d, 0x88));
        _mm512_store_ps(dst + (size_t)(12 + m) * NR, _mm512_shuffle_f32x4(b, d, 0xDD));
    }
}

void tern__cpu_gemm_pack_avx512(const float *tmp, int ld, int len, float *wp) {
    int t = 0;
    for (; t + 16 <= len; t += 16)
        for (int i0 = 0; i0 < NR; i0 += 16) tr16(tmp + (size_t)i0 * ld + t, ld, wp + (size_t)t * NR + i0);
    for (; t < len; t++)
        for (int i = 0; i < NR; i++) wp[(size_t)t * NR + i] = tmp[(size_t)i * ld + t];
}

static inline __attribute__((always_inline)) void mk_t(int len, const float *xp, const float *wp, float *const *yp,
                                                       const float *ys, int add, int ns, const uint8_t *const *pf,
                                                       int npf, const int M) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < M; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int t0 = 0; t0 < len; t0 += 8) {
        if (npf > 0) { _mm_prefetch((const char *)*pf++, _MM_HINT_T1); npf--; }
        int t1 = t0 + 8 < len ? t0 + 8 : len;
        for (int t = t0; t < t1; t++, wp += NR, xp += M) {
            __m512 w0 = _mm512_load_ps(wp), w1 = _mm512_load_ps(wp + 16);
#pragma GCC unroll 12
            for (int r = 0; r < M; r++) {
                __m512 xb = _mm512_set1_ps(xp[r]);
                c0[r] = _mm512_fmadd_ps(w0, xb, c0[r]);
                c1[r] = _mm512_fmadd_ps(w1, xb, c1[r]);
            }
        }
    }
    __mmask16 m0 = ns >= 16 ? 0xFFFF : (__mmask16)((1u << ns) - 1);
    __mmask16 m1 = ns >= 32 ? 0xFFFF : ns > 16 ? (__mmask16)((1u << (ns - 16)) - 1) : 0;
#pragma GCC unroll 12
    for (int r = 0; r < M; r++) {
        float *y = yp[r];
        __m512 a0 = c0[r], a1 = c1[r];
        if (add) {
            if (ys) {
                __m512 s = _mm512_set1_ps(ys[r]);
                a0 = _mm512_mul_ps(s, a0);
                a1 = _mm512_mul_ps(s, a1);
            }
            a0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), a0);
            a1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), a1);
        }
        _mm512_mask_storeu_ps(y, m0, a0);
        _mm512_mask_storeu_ps(y + 16, m1, a1);
    }
}

#define MK(M) case M: mk_t(len, xp, wp, yp, ys, add, ns, pf, npf, M); return;
void tern__cpu_gemm_mk_avx512(int len, const float *xp, int mr, const float *wp, float *const *yp, const float *ys,
                              int add, int ns, const uint8_t *const *pf, int npf) {
    switch (mr) {
        MK(1) MK(2) MK(3) MK(4) MK(5) MK(6) MK(7) MK(8) MK(9) MK(10) MK(11) MK(12)
    default: return;
    }
}
