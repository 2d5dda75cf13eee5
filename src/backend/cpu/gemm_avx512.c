/*
 * gemm_avx512.c — the AVX-512 pieces of the blocked prefill GEMM (driver: cpu_matmul.c).
 *
 * y[r][o] = Σ_t x[r][t]·W[o][t] is computed as outer products: for every input t, one
 * broadcast of x[r][t] times a vector of 16 consecutive output features o. The weight strip
 * therefore has to be laid out input-major, wp[t·32 + i] for 32 features i: gemm_pack
 * converts BF16/F32 rows in registers (others through the ISA decoder, bit-identical to the
 * reference) and transposes 16×16 blocks in registers (64 shuffles per 256 floats); x rows
 * are packed the same way, 12 rows per block, input-major. The microkernel holds a 12×32 block of y in 24 zmm accumulators; per input it
 * does 2 aligned weight loads, 12 broadcasts and 24 FMAs, so it is FMA-bound as long as the
 * strip (len·128 bytes) and the packed x block stay in L1/L2. Every y element is one
 * sequential f32 FMA chain over the inputs of a block (exact f32 arithmetic, no reduction
 * tree); the driver adds the blocks of inputs into y in order.
 * The bf16 compute mode's variant (below, AVX512-BF16) packs BF16 rows in input pairs and runs vdpbf16ps on x
 * rounded to bf16: twice the inputs per instruction (llama3-1b bf16 prefill on the 2-core box 131-144 -> 218-225
 * tok/s, bench/NOTES.md (bd)).
 */
#include "backend/cpu/kern.h"

#include <immintrin.h>

#define NR 32
#define MR 12

/* In-place 16×16 transpose: afterwards r[j] lane i holds what r[i] lane j held. */
static inline __attribute__((always_inline)) void tr16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* u[4k+m], 128-bit lane L: element 4L+m of rows 4k..4k+3 */
    for (int k = 0; k < 4; k++) {
        u[4 * k + 0] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
        __m512 c = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44), d = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
        r[0 + m] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[4 + m] = _mm512_shuffle_f32x4(a, c, 0xDD);
        r[8 + m] = _mm512_shuffle_f32x4(b, d, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(b, d, 0xDD);
    }
}

/* 16 inputs (m: the valid ones) of row i as f32: BF16/F32 straight from the weight, else
 * from the decoded copy in tmp. */
static inline __m512 wload(const cpu_wrow *w, int t0, int t, __mmask16 m, const float *tmp) {
    if (w->dtype == TERN_DT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w->data + t0 + t)), 16));
    if (w->dtype == TERN_DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)w->data + t0 + t);
    return _mm512_maskz_loadu_ps(m, tmp + t);
}

void tern__cpu_gemm_pack_avx512(const cpu_wrow *rows, int nrows, int t0, int len, float *tmp, int ld, float *wp,
                                void (*decode)(const cpu_wrow *w, int j0, int len, float *dst)) {
    int direct = rows[0].dtype == TERN_DT_BF16 || rows[0].dtype == TERN_DT_F32;
    if (!direct)
        for (int i = 0; i < nrows; i++) decode(&rows[i], t0, len, tmp + (size_t)i * ld);
    for (int t = 0; t < len; t += 16) {
        int nt = len - t < 16 ? len - t : 16;
        __mmask16 m = (__mmask16)((1u << nt) - 1);
        for (int i0 = 0; i0 < NR; i0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i0 + i < nrows ? wload(&rows[i0 + i], t0, t, m, tmp + (size_t)(i0 + i) * ld) : _mm512_setzero_ps();
            tr16(r);
            for (int j = 0; j < nt; j++) _mm512_store_ps(wp + (size_t)(t + j) * NR + i0, r[j]);
        }
    }
}

void tern__cpu_gemm_pack_x_avx512(const float *const *xr, int mr, int len, float *xp) {
    __mmask16 sm = (__mmask16)((1u << mr) - 1);
    for (int t = 0; t < len; t += 16) {
        int nt = len - t < 16 ? len - t : 16;
        __mmask16 m = (__mmask16)((1u << nt) - 1);
        __m512 r[16];
        for (int i = 0; i < 16; i++) r[i] = i < mr ? _mm512_maskz_loadu_ps(m, xr[i] + t) : _mm512_setzero_ps();
        tr16(r);
        for (int j = 0; j < nt; j++) _mm512_mask_storeu_ps(xp + (size_t)(t + j) * mr, sm, r[j]);
    }
}

/* The microkernel of both GEMMs: BF 0 — per input, 2 weight loads, M broadcasts of x, 2·M FMAs; BF 1 (the bf16
 * mode) — per input pair, 2 loads of bf16 pairs, M dword broadcasts of x pairs, 2·M vdpbf16ps. One prefetch of pf[]
 * per 8 inputs either way. */
static inline __attribute__((always_inline)) void mk_t(int len, const float *xp, const float *wp, float *const *yp,
                                                       const float *ys, int add, int ns, const uint8_t *const *pf,
                                                       int npf, const int M, const int BF) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < M; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    if (add) /* y is revisited once per block of inputs, long out of cache by then: its lines come in while the block runs */
#pragma GCC unroll 12
        for (int r = 0; r < M; r++) {
            _mm_prefetch((const char *)yp[r], _MM_HINT_T0);
            _mm_prefetch((const char *)(yp[r] + 16), _MM_HINT_T0);
        }
    const int steps = BF ? len / 2 : len, per = BF ? 4 : 8; /* steps of one input (pair) */
    for (int t0 = 0; t0 < steps; t0 += per) {
        if (npf > 0) { _mm_prefetch((const char *)*pf++, _MM_HINT_T1); npf--; }
        int t1 = t0 + per < steps ? t0 + per : steps;
        for (int t = t0; t < t1; t++, wp += NR, xp += M) {
            __m512 w0 = _mm512_load_ps(wp), w1 = _mm512_load_ps(wp + 16);
#pragma GCC unroll 12
            for (int r = 0; r < M; r++) {
                __m512 xb = _mm512_set1_ps(xp[r]); /* BF: the pair's 32 bits as they are */
                if (BF) {
                    c0[r] = _mm512_dpbf16_ps(c0[r], (__m512bh)w0, (__m512bh)xb);
                    c1[r] = _mm512_dpbf16_ps(c1[r], (__m512bh)w1, (__m512bh)xb);
                } else {
                    c0[r] = _mm512_fmadd_ps(w0, xb, c0[r]);
                    c1[r] = _mm512_fmadd_ps(w1, xb, c1[r]);
                }
            }
        }
    }
    __mmask16 m0, m1;
    cpu_strip_masks(ns, &m0, &m1);
#pragma GCC unroll 12
    for (int r = 0; r < M; r++) cpu_strip_store(yp[r], c0[r], c1[r], ys, r, add, m0, m1);
}

/* mk_t for mr = 1..12 rows (constant M: the accumulators stay in registers) */
#define MK(M) case M: mk_t(len, xp, wp, yp, ys, add, ns, pf, npf, M, bf); return;
#define MK_ENTRY(name, BF)                                                                                        \
    void name(int len, const float *xp, int mr, const float *wp, float *const *yp, const float *ys, int add, int ns, \
              const uint8_t *const *pf, int npf) {                                                               \
        const int bf = BF;                                                                                     \
        switch (mr) {                                                                                          \
            MK(1) MK(2) MK(3) MK(4) MK(5) MK(6) MK(7) MK(8) MK(9) MK(10) MK(11) MK(12)                           \
        default: return;                                                                                       \
        }                                                                                                      \
    }
MK_ENTRY(tern__cpu_gemm_mk_avx512, 0)

/* ---- the bf16 compute mode's GEMM (AVX512-BF16; --compute bf16, BF16 weights) ----
 * x rounded to bf16 (round to nearest even, vcvtne2ps2bf16) times the stored bf16 weights through vdpbf16ps:
 * per f32 lane acc += x[t]·w[t] + x[t+1]·w[t+1] — the bf16 products are exact in f32, the sums f32 (the
 * instruction flushes denormal inputs and outputs). Layout as the f32 GEMM's with inputs in pairs: the strip
 * wp[p·64 + 2i + j] (bf16) = w[feature i][t0 + 2p + j], built by one 16×16 dword transpose per 16 features ×
 * 32 inputs straight from the rows; x as dwords xp[p·mr + r] = (x[r][2p], x[r][2p+1]). The 12×32 microkernel per
 * input pair (mk_t with BF 1): 2 weight loads, 12 dword broadcasts, 24 vdpbf16ps (twice the f32 kernel's inputs per
 * instruction).
 * len is even (the driver declines odd input counts). */
void tern__cpu_gemm_pack_bf16_avx512(const cpu_wrow *rows, int nrows, int t0, int len, float *tmp, int ld, float *wp,
                                     void (*decode)(const cpu_wrow *w, int j0, int len, float *dst)) {
    (void)tmp, (void)ld, (void)decode;
    uint32_t *dst = (uint32_t *)wp;
    for (int t = 0; t < len; t += 32) {
        int nt = len - t < 32 ? len - t : 32; /* inputs, even */
        __mmask32 m = nt == 32 ? ~(__mmask32)0 : (__mmask32)((1u << nt) - 1);
        for (int i0 = 0; i0 < 32; i0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i0 + i < nrows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, (const uint16_t *)rows[i0 + i].data + t0 + t))
                                      : _mm512_setzero_ps();
            tr16(r); /* r[p] lane i: feature i0 + i's pair p (32-bit moves only) */
            for (int p = 0; p < nt / 2; p++) _mm512_store_ps((float *)(dst + (size_t)(t / 2 + p) * 32 + i0), r[p]);
        }
    }
}

/* x rows as bf16 pairs, 32 inputs of every row at a time: each row's 16 pairs as one vector, one 16×16 dword transpose,
 * then per pair the mr rows' dwords in one masked store (a scalar scatter of the pairs cost ~0.6 of the microkernel's
 * time in a llama3-1b prefill, perf) */
void tern__cpu_gemm_pack_x_bf16_avx512(const float *const *xr, int mr, int len, float *xp) {
    __mmask16 sm = (__mmask16)((1u << mr) - 1);
    for (int t = 0; t < len; t += 32) {
        int nt = len - t < 32 ? len - t : 32;
        __mmask16 lo = (__mmask16)((1u << (nt < 16 ? nt : 16)) - 1), hi = (__mmask16)(nt > 16 ? (1u << (nt - 16)) - 1 : 0);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < mr ? (__m512)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, xr[i] + t + 16), _mm512_maskz_loadu_ps(lo, xr[i] + t))
                          : _mm512_setzero_ps();
        tr16(r); /* r[p] lane i: row i's pair p */
        for (int p = 0; p < nt / 2; p++) _mm512_mask_storeu_ps(xp + (size_t)(t / 2 + p) * mr, sm, r[p]);
    }
}

MK_ENTRY(tern__cpu_gemm_mk_bf16_avx512, 1)
