/*
 * gemm_avx2.c — the AVX2/FMA pieces of the blocked prefill GEMM (driver: cpu_matmul.c).
 *
 * Same scheme as gemm_avx512.c at half the width: strips of 16 output features packed
 * input-major (wp[t·16 + i], 8×8 in-register transposes; x rows likewise, 6 per block),
 * and a 6×16 microkernel — 12 ymm
 * accumulators, per input 2 weight loads, 6 broadcasts and 12 FMAs (15 of the 16 ymm
 * registers). Each y element is a sequential f32 FMA chain over the block's inputs.
 */
#include "backend/cpu/kern.h"

#include <immintrin.h>
#include <string.h>

#define NR 16
#define MR 6

/* In-place 8×8 transpose: afterwards r[j] lane i holds what r[i] lane j held. */
static inline __attribute__((always_inline)) void tr8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* u[4k+m], 128-bit lane L: element 4L+m of rows 4k..4k+3 */
    for (int k = 0; k < 2; k++) {
        u[4 * k + 0] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
        r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
}

/* Element t of row w as f32 (BF16/F32 from the weight, else the decoded copy). */
static inline float wval(const cpu_wrow *w, int t0, int t, const float *tmp) {
    if (w->dtype == TERN_DT_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)w->data)[t0 + t] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (w->dtype == TERN_DT_F32) {
        float f;
        memcpy(&f, w->data + (size_t)(t0 + t) * 4, 4);
        return f;
    }
    return tmp[t];
}

static inline __m256 wload(const cpu_wrow *w, int t0, int t, const float *tmp) {
    if (w->dtype == TERN_DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w->data + t0 + t))), 16));
    if (w->dtype == TERN_DT_F32) return _mm256_loadu_ps((const float *)w->data + t0 + t);
    return _mm256_loadu_ps(tmp + t);
}

void tern__cpu_gemm_pack_avx2(const cpu_wrow *rows, int nrows, int t0, int len, float *tmp, int ld, float *wp,
                              void (*decode)(const cpu_wrow *w, int j0, int len, float *dst)) {
    int direct = rows[0].dtype == TERN_DT_BF16 || rows[0].dtype == TERN_DT_F32, t = 0;
    if (!direct)
        for (int i = 0; i < nrows; i++) decode(&rows[i], t0, len, tmp + (size_t)i * ld);
    for (; t + 8 <= len; t += 8)
        for (int i0 = 0; i0 < NR; i0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i0 + i < nrows ? wload(&rows[i0 + i], t0, t, tmp + (size_t)(i0 + i) * ld) : _mm256_setzero_ps();
            tr8(r);
            for (int j = 0; j < 8; j++) _mm256_store_ps(wp + (size_t)(t + j) * NR + i0, r[j]);
        }
    for (; t < len; t++)
        for (int i = 0; i < NR; i++) wp[(size_t)t * NR + i] = i < nrows ? wval(&rows[i], t0, t, tmp + (size_t)i * ld) : 0.0f;
}

void tern__cpu_gemm_pack_x_avx2(const float *const *xr, int mr, int len, float *xp) {
    int t = 0;
    for (; t + 8 <= len; t += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; i++) r[i] = i < mr ? _mm256_loadu_ps(xr[i] + t) : _mm256_setzero_ps();
        tr8(r);
        for (int j = 0; j < 8; j++) { /* mr of the 8 lanes */
            float v[8];
            _mm256_storeu_ps(v, r[j]);
            memcpy(xp + (size_t)(t + j) * mr, v, (size_t)mr * sizeof *v);
        }
    }
    for (; t < len; t++)
        for (int i = 0; i < mr; i++) xp[(size_t)t * mr + i] = xr[i][t];
}

static inline __attribute__((always_inline)) void mk_t(int len, const float *xp, const float *wp, float *const *yp,
                                                       const float *ys, int add, int ns, const uint8_t *const *pf,
                                                       int npf, const int M) {
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < M; r++) c0[r] = c1[r] = _mm256_setzero_ps();
    if (add) /* y's line, last touched a block of inputs ago (gemm_avx512.c's mk_t) */
        for (int r = 0; r < M; r++) _mm_prefetch((const char *)yp[r], _MM_HINT_T0);
    for (int t0 = 0; t0 < len; t0 += 8) {
        if (npf > 0) { _mm_prefetch((const char *)*pf++, _MM_HINT_T1); npf--; }
        int t1 = t0 + 8 < len ? t0 + 8 : len;
        for (int t = t0; t < t1; t++, wp += NR, xp += M) {
            __m256 w0 = _mm256_load_ps(wp), w1 = _mm256_load_ps(wp + 8);
#pragma GCC unroll 6
            for (int r = 0; r < M; r++) {
                __m256 xb = _mm256_broadcast_ss(xp + r);
                c0[r] = _mm256_fmadd_ps(w0, xb, c0[r]);
                c1[r] = _mm256_fmadd_ps(w1, xb, c1[r]);
            }
        }
    }
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(ns), iota);
    __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(ns - 8), iota);
#pragma GCC unroll 6
    for (int r = 0; r < M; r++) {
        float *y = yp[r];
        __m256 a0 = c0[r], a1 = c1[r];
        if (add) {
            if (ys) {
                __m256 s = _mm256_set1_ps(ys[r]);
                a0 = _mm256_mul_ps(s, a0);
                a1 = _mm256_mul_ps(s, a1);
            }
            a0 = _mm256_add_ps(_mm256_maskload_ps(y, m0), a0);
            a1 = _mm256_add_ps(_mm256_maskload_ps(y + 8, m1), a1);
        }
        _mm256_maskstore_ps(y, m0, a0);
        _mm256_maskstore_ps(y + 8, m1, a1);
    }
}

#define MK(M) case M: mk_t(len, xp, wp, yp, ys, add, ns, pf, npf, M); return;
void tern__cpu_gemm_mk_avx2(int len, const float *xp, int mr, const float *wp, float *const *yp, const float *ys,
                            int add, int ns, const uint8_t *const *pf, int npf) {
    switch (mr) {
        MK(1) MK(2) MK(3) MK(4) MK(5) MK(6)
    default: return;
    }
}
