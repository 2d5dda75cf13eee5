/*
 * gemv_avx512.h — the helpers shared by the AVX-512 fused GEMV kernels of one x (gemv_avx512.c) and of several
 * (gemv_nx_avx512.c): prefetch, the group scales and biases as f32, the int8 kinds' per-row scale terms, the
 * 128-input Q4_I8 chunk, the paired reduction, Q4_I8's group-sum order (q4g_*: one x and several), the exact Q4 and Q8 kernels for 1-4 rows and 1-4 x (q4_nx, q8_nx:
 * k_q4 and k_q8 are their one-x cases) and the bf16 mode's (bf16r_nx; k_bf16r its one-x case). Internal to src/backend/cpu; include only from *_avx512.c files.
 */
#ifndef TERN_CPU_GEMV_AVX512_H
#define TERN_CPU_GEMV_AVX512_H

#include "backend/cpu/kern.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* Software prefetch of the Q weight stream, gx->pf_data bytes ahead of each read (prep: 1 KB;
 * the driver sets a distance of a few whole passes of rows, see cpu_matmul.c). With ~20
 * vector ops per 64 bytes (q4) the out-of-order window alone keeps too few cache misses
 * outstanding, and the hardware prefetcher falls behind; measured in bench/NOTES.md. Into L2
 * (T1), not L1: an L1 prefetch holds one of the core's few fill buffers until the line
 * arrives, an L2 one queues in the L2's deeper miss queue (q4 decode +6-7 %, q8 and bf16
 * unchanged; bench/NOTES.md (j)); the demand loads then hit L2. */
#define PF(p) _mm_prefetch((const char *)(p) + pfd, _MM_HINT_T1)

/* A stream read by masked loads, which on this project's Zen CPUs do not train the hardware prefetcher: its lines are
 * prefetched into L1 SW_STREAM bytes ahead, and that stream reads ~1.2x faster than plain loads (k_bf16's comment in
 * gemv_avx512.c; bench/NOTES.md (bk)). The mask stays a register (an asm barrier): GCC turns a constant all-ones
 * masked load into a plain one. */
#define SW_STREAM 2048
#define PF_T0(p) _mm_prefetch((const char *)(p) + SW_STREAM, _MM_HINT_T0)
/* The all-lanes mask of such a load, as a register GCC cannot see through */
static inline __attribute__((always_inline)) __mmask64 sw_stream_mask(void) {
    __mmask64 all = ~(__mmask64)0;
    __asm__("" : "+k"(all));
    return all;
}

/* Once per pass: prefetch the scales and biases of the rows pf_sb ahead (a row's: in / gs values of its sdtype). */
AI void pf_groups(const cpu_gx *gx, const cpu_wrow *rw, int NR) {
    if (!gx->pf_sb) return;
    const size_t nb = (size_t)(gx->in / gx->gs) * (rw[0].sdtype == TERN_DT_F32 ? 4 : 2); /* a row's scales */
    for (int r = 0; r < NR; r++)
        for (size_t o = 0; o < nb; o += 64) {
            _mm_prefetch((const char *)rw[r].scales + gx->pf_sb + o, _MM_HINT_T0);
            _mm_prefetch((const char *)rw[r].biases + gx->pf_sb + o, _MM_HINT_T0);
        }
}

/* The scales and biases of the 16 groups from g (lanes off in k: zero) as f32. */
AI void grp_sb(const cpu_wrow *w, int g, __mmask16 k, __m512 *sv, __m512 *bv) {
    if (w->sdtype == TERN_DT_F32) {
        *sv = _mm512_maskz_loadu_ps(k, (const float *)w->scales + g);
        *bv = _mm512_maskz_loadu_ps(k, (const float *)w->biases + g);
    } else {
        __m256i hs = _mm256_maskz_loadu_epi16(k, (const uint16_t *)w->scales + g);
        __m256i hb = _mm256_maskz_loadu_epi16(k, (const uint16_t *)w->biases + g);
        if (w->sdtype == TERN_DT_F16) { *sv = _mm512_cvtph_ps(hs); *bv = _mm512_cvtph_ps(hb); }
        else {
            *sv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hs), 16));
            *bv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hb), 16));
        }
    }
}

/* Scales and biases of groups [g0, g0+ng) as f32 (ng <= CPU_MAX_GROUPS); 16 zero entries
 * follow so per-lane loads past the last group read zeros. Kept out of line: inlined into q8_nx it
 * cost the 4-x pass ~40 % (hot, in 2048: 38 -> 53 ns per row per x). */
static __attribute__((noinline, unused)) void grp_f32(const cpu_wrow *w, int g0, int ng, float *sc, float *bi) {
    for (int i = 0; i < ng; i += 16) {
        __m512 sv, bv;
        grp_sb(w, g0 + i, (__mmask16)(ng - i >= 16 ? 0xffff : (1u << (ng - i)) - 1), &sv, &bv);
        _mm512_storeu_ps(sc + i, sv); /* masked-off lanes store zeros */
        _mm512_storeu_ps(bi + i, bv);
    }
    _mm512_storeu_ps(sc + ng, _mm512_setzero_ps());
    _mm512_storeu_ps(bi + ng, _mm512_setzero_ps());
}

/* Σ_g bi[g]·gsum[g] over ng groups (bi is zero-padded to a multiple of 16). */
static inline __m512 bias_dot(const float *bi, const float *gsum, int ng) {
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < ng; i += 16) {
        __mmask16 k = (__mmask16)(ng - i >= 16 ? 0xffff : (1u << (ng - i)) - 1);
        s = _mm512_fmadd_ps(_mm512_loadu_ps(bi + i), _mm512_maskz_loadu_ps(k, gsum + i), s);
    }
    return s;
}

/* Keeps v in a register: GCC otherwise folds the load into each use (a weight load twice, x
 * once per row), which costs load-port slots (measured: the L2-resident ceiling +30-50 %). */
#define PIN(v) __asm__("" : "+v"(v))

/* lane i of a 16-lane vector that covers W consecutive inputs per lane -> its group, relative */
static inline __m512i lane_groups(int W, int gs) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_srlv_epi32(_mm512_mullo_epi32(iota, _mm512_set1_epi32(W)), _mm512_set1_epi32(__builtin_ctz((unsigned)gs)));
}

/* Int8 kinds, groups [g0, g0+ng) of one row for NX (1-4) x, 16 groups at a time: ds[j][g - g0] = s_g·d_g of x j (16
 * zeros follow, for per-lane loads past the last group) and the lanes of bs[j] sum to Σ_g b_g·Σx_g + s_g·rq_g. One
 * pass over the scales and biases (converted once for every x), no staging copy (it cost ~15% of the q4 kernel). */
AI void grp_i8_nx(const cpu_wrow *w, int g0, int ng, const cpu_gx *gx, const int NX, float *const *ds, __m512 *bs) {
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) bs[j] = _mm512_setzero_ps();
    for (int i = 0; i < ng; i += 16) {
        __mmask16 k = (__mmask16)(ng - i >= 16 ? 0xffff : (1u << (ng - i)) - 1);
        __m512 sv, bv;
        grp_sb(w, g0 + i, k, &sv, &bv);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) {
            bs[j] = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(k, gx[j].gsum + g0 + i), bs[j]);
            bs[j] = _mm512_fmadd_ps(sv, _mm512_maskz_loadu_ps(k, gx[j].rq + g0 + i), bs[j]);
            _mm512_storeu_ps(ds[j] + i, _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(k, gx[j].xd + g0 + i)));
        }
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) _mm512_storeu_ps(ds[j] + ng, _mm512_setzero_ps());
}

/* One x: ds as above, the returned lanes its sum. */
AI __m512 grp_i8(const cpu_wrow *w, int g0, int ng, const cpu_gx *gx, float *ds) {
    __m512 bs;
    grp_i8_nx(w, g0, ng, gx, 1, &ds, &bs);
    return bs;
}

/* reduce(a) + reduce(b) in one shuffle tree for both: _mm512_reduce_add_ps's pairing (hi + lo 256, hi + lo 128,
 * [2,3] + [0,1], [1] + [0]; a + b = b + a in IEEE), so bitwise the two separate reductions and their sum */
AI float red_pair(__m512 a, __m512 b) {
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_cvtss_f32(s) + _mm_cvtss_f32(_mm512_extractf32x4_ps(s, 2));
}

/* One 128-input chunk of a row (64 code bytes at src, x at xq): lane i = Σ over inputs 8i..8i+7 of q·xq (int32,
 * exact). raw is pinned: GCC otherwise loads it twice (once folded into the and). */
AI __m512i q4i8_chunk(const uint8_t *src, const int8_t *xq, __m512i nib, __mmask64 ld) {
    __m512i raw = _mm512_maskz_loadu_epi8(ld, src);
    PIN(raw);
    __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq)), hi, _mm512_loadu_si512(xq + 64));
}

/* Q4_I8's order (session 50; bench/NOTES.md (bj)): per row and x, Σ q·xq of each weight group as one exact int32,
 * then f32 only per block of 16 groups: A = fma(cvt(sums), s·d, A), lane l of A accumulating group 16b + perm[l]
 * of every block b (perm: where the in-lane reduction below leaves each group), and y = red_pair(A, bs) with bs the
 * bias terms of grp_i8. Every Q4_I8 kernel of the default path computes exactly this — one x (q4g_scales and
 * q4g_dots_stream: k_q4i8g), 1-4 x sharing each row's unpacking (q4g_scales and q4g_dots: gemv_nx_avx512.c
 * q4i8_rows), and the x-in-lanes kernel of gemv_nx_avx512.c, which holds one
 * row's 16 A chains as 16 vectors and reduces them in perm's pairing — so a row gives the same bits alone or in
 * any batch. */
static const int q4g_perm[3][16] = { /* lane -> group of a block, for GS 32, 64, 128 (a wrong entry pairs a group with
                                       * another's scale: test_kern_gemv gemv_int8_bound and decode_x_lanes fail) */
    {0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15},
    {0, 4, 2, 6, 1, 5, 3, 7, 8, 12, 10, 14, 9, 13, 11, 15},
    {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15},
};
AI const int *q4g_perm_of(int gs) { return q4g_perm[gs == 32 ? 0 : gs == 64 ? 1 : 2]; }

/* lane-pair sums within 128-bit blocks (a's and b's interleaved), and across blocks (a's two pairs, then b's) */
AI __m512i q4g_hadd(__m512i a, __m512i b) { return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b)); }
AI __m512i q4g_bsum(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The GS / 8 chunk sums of a block of 16 groups (q4i8_chunk's: GS 32 four groups a chunk, 64 two, 128 one) -> lane l
 * = Σ of group perm[l]: in-lane shuffles and adds only (a vpermt2d tree was slower), exact in int32. */
AI __m512i q4g_red(__m512i *a, const int GS) {
    if (GS == 32) return q4g_hadd(q4g_hadd(a[0], a[1]), q4g_hadd(a[2], a[3]));
    __m512i t[8], p[4];
    _Pragma("GCC unroll 8")
    for (int i = 0; i < GS / 16; i++) t[i] = q4g_hadd(a[2 * i], a[2 * i + 1]);
    _Pragma("GCC unroll 4")
    for (int i = 0; i < GS / 32; i++) p[i] = q4g_hadd(t[2 * i], t[2 * i + 1]);
    if (GS == 64) return q4g_bsum(p[0], p[1]);
    return q4g_bsum(q4g_bsum(p[0], p[1]), q4g_bsum(p[2], p[3]));
}

/* Q4_I8 in this order, part one: grp_i8's ds = s·d per group (16 zeros after) and bias sums bs for NX x on row w. */
AI void q4g_scales(const cpu_gx *gx, const cpu_wrow *w, const int NX, const int GS, float (*ds)[CPU_GX_MAX_IN / 32 + 16],
                   __m512 *bs) {
    const int in = gx[0].in;
    pf_groups(&gx[0], w, 1);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) bs[j] = _mm512_setzero_ps();
    for (int j0 = 0, ch = CPU_MAX_GROUPS * GS; j0 < in; j0 += ch) { /* grp_i8's slices, its sums per x */
        const int g0 = j0 / GS;
        float *dsj[4];
        __m512 sl[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) dsj[j] = ds[j] + g0;
        grp_i8_nx(w, g0, (in - j0 < ch ? in - j0 : ch) / GS, gx, NX, dsj, sl);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) bs[j] = _mm512_add_ps(bs[j], sl[j]);
    }
}

/* One 128-input chunk of NX x (64 code bytes at p, inputs from c; ld: the bytes to load, a mask the caller forms, see
 * q4g_dots_stream): v[j] lane i = Σ of q·xq over inputs 8i..8i+7 of x j (int32, exact); the line pfd ahead prefetched
 * into L1. The low and high nibbles are unpacked once for every x (q4i8_chunk is the one-x form without the prefetch). */
AI void q4g_chunk(const cpu_gx *gx, const uint8_t *p, int c, __mmask64 ld, ptrdiff_t pfd, const int NX, __m512i *v) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    _mm_prefetch((const char *)p + pfd, _MM_HINT_T0);
    __m512i raw = _mm512_maskz_loadu_epi8(ld, p);
    PIN(raw);
    const __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) {
        const int8_t *xq = gx[j].xq + c;
        v[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq)), hi,
                                   _mm512_loadu_si512(xq + 64));
    }
}

/* One block of 16 groups (GS / 8 chunks from input c0, code bytes at src) of NX x into A: WHOLE (compile-time) when the
 * block lies inside the row, else chunks past the row's end count as zero and a last half chunk is masked. */
AI void q4g_block(const cpu_gx *gx, const uint8_t *src, int c0, const int NX, const int GS, const int WHOLE, __m512 *A,
                  float (*ds)[CPU_GX_MAX_IN / 32 + 16], int b, __m512i perm) {
    const ptrdiff_t pfd = gx[0].pf_data;
    const int in = gx[0].in, cpb = GS / 8;
    __m512i st[4][5]; /* 3-4 x: q4g_red's tree reduced as the chunks come (a binary counter: few live vectors; holding
                       * all chunks of 4 x took 32 registers: 4 x 17.4 -> 16.4 ns a row and x hot) */
    __m512i ch[2][16]; /* 1-2 x: all chunks, then q4g_red */
    _Pragma("GCC unroll 16")
    for (int u = 0; u < cpb; u++) {
        const int c = c0 + 128 * u;
        __m512i v[4];
        if (!WHOLE && c >= in) {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NX; j++) v[j] = _mm512_setzero_si512();
        } else {
            q4g_chunk(gx, src + 64 * u, c, WHOLE || in - c >= 128 ? ~(__mmask64)0 : ((__mmask64)1 << ((in - c) / 2)) - 1,
                      pfd, NX, v);
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) {
            if (NX <= 2) {
                ch[j][u] = v[j];
                continue;
            }
            int lvl = 0;
            _Pragma("GCC unroll 5")
            for (int m = u; m & 1; m >>= 1, lvl++) /* levels 1-2 pair lanes in blocks, 3-4 blocks (q4g_red) */
                v[j] = lvl < 2 ? q4g_hadd(st[j][lvl], v[j]) : q4g_bsum(st[j][lvl], v[j]);
            st[j][lvl] = v[j];
        }
    }
    const int top = GS == 32 ? 2 : GS == 64 ? 3 : 4;
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++)
        A[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(NX <= 2 ? q4g_red(ch[j], GS) : st[j][top]),
                               _mm512_permutexvar_ps(perm, _mm512_loadu_ps(ds[j] + 16 * b)), A[j]);
}

/* Part two: the codes of row w against NX x, given ds and bs; y[j·ys] */
AI void q4g_dots(const cpu_gx *gx, const cpu_wrow *w, float *y, size_t ys, const int NX, const int GS,
                        float (*ds)[CPU_GX_MAX_IN / 32 + 16], const __m512 *bs) {
    const int in = gx[0].in, nw = in / (16 * GS), nb = (in / GS + 15) / 16; /* whole blocks, all blocks */
    const __m512i perm = _mm512_loadu_si512(q4g_perm_of(GS));
    __m512 A[4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) A[j] = _mm512_setzero_ps();
    int b = 0;
    for (; b < nw; b++) q4g_block(gx, w->data + (size_t)b * 8 * GS, b * 16 * GS, NX, GS, 1, A, ds, b, perm);
    if (b < nb) q4g_block(gx, w->data + (size_t)b * 8 * GS, b * 16 * GS, NX, GS, 0, A, ds, b, perm);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) y[(size_t)j * ys] = red_pair(A[j], bs[j]);
}

/* q4g_dots_stream's chunks of one block (GS / 8 of them from input c0, code bytes at src) into a[j][u] for NX x: the
 * first NCH (compile-time) loaded — the last may be part of a chunk, its mask computed per chunk from `whole`, a flag
 * the compiler cannot see through (see q4g_dots_stream) — and the rest zero at compile time, so that q4g_red folds them
 * away (a row of 1536 inputs in groups of 64 ends in 4 of a block's 8 chunks; of 256 in 2). */
AI void q4g_chunks(const cpu_gx *gx, const uint8_t *src, int c0, const int NX, const int GS, const int NCH, int whole,
                   __m512i (*a)[16]) {
    const ptrdiff_t pfd = gx[0].pf_data;
    const int in = gx[0].in, cpb = GS / 8;
    _Pragma("GCC unroll 16")
    for (int u = 0; u < cpb; u++) {
        const int c = c0 + 128 * u;
        if (u >= NCH) {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NX; j++) a[j][u] = _mm512_setzero_si512();
            continue;
        }
        __m512i v[4];
        q4g_chunk(gx, src + 64 * u, c, whole || in - c >= 128 ? ~(__mmask64)0 : ((__mmask64)1 << ((in - c) / 2)) - 1, pfd,
                  NX, v);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) a[j][u] = v[j];
    }
}

/* a block's chunk sums into A (lane l: group 16b + perm[l]) */
AI void q4g_fold(__m512i (*a)[16], const int NX, const int GS, __m512 *A, float (*ds)[CPU_GX_MAX_IN / 32 + 16], int b,
                 __m512i perm) {
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++)
        A[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4g_red(a[j], GS)), _mm512_permutexvar_ps(perm, _mm512_loadu_ps(ds[j] + 16 * b)), A[j]);
}

/* q4g_dots_stream's last block when it is partial: its first NCH chunks */
AI void q4g_tail(const cpu_gx *gx, const uint8_t *src, int c0, const int NX, const int GS, const int NCH, __m512 *A,
                 float (*ds)[CPU_GX_MAX_IN / 32 + 16], int b, __m512i perm) {
    __m512i a[4][16];
    q4g_chunks(gx, src, c0, NX, GS, NCH, 0, a);
    q4g_fold(a, NX, GS, A, ds, b, perm);
}

/* q4g_dots as one loop over each block's chunks with the row-end test inside it, the same sums: slower from L1/L2
 * (hot, in 2048 ~32 vs ~23 ns a row) but faster from memory, where the one-x kernel runs — bench_seq's token of
 * llama3-1b GEMVs against k_q4i8s, paired: 1.13-1.26x with this loop, 1.03-1.07x with q4g_dots (NOTES (bj)). Used for
 * one x (k_q4i8g). Part of the reason is its load: the mask is computed per chunk, so it stays a masked load, which
 * leaves the stream to the prefetch into L1 (SW_STREAM's note; q4g_block's WHOLE path has a constant mask, which GCC
 * turns into a plain load; NOTES (bk)). Not all of it: q4g_dots with q4g_block's row-end test on for every block, also
 * runtime-masked, measured 0.95x, and so did its chunk body shared with q4g_block through one inline helper in session
 * 50 (0.94-0.98x; with the shared rows-pass only, 1.06x): the codegen is fragile — re-run bench_seq after touching
 * this function. Session 52 (NOTES (bl)): the whole blocks in a loop of their own and a partial
 * last block through q4g_tail, bitwise the same — with the row-end mask still computed per chunk from a flag the
 * compiler cannot see, 1.01-1.04x from memory (bench_seq, llama3-1b, 10-12 pairs; 1.02 at 1536 inputs) and 1.11-1.16x
 * hot on rows of 256 inputs; with the mask a constant register (sw_stream_mask, as k_bf16) the same loop ran 1.07-1.23x
 * faster hot and 0.90-0.97x from memory. In its review the chunk body became one helper with q4g_block's (q4g_chunk;
 * the mask as an argument): the one-x token 1.038 / 1.05x against the session's loop (bench_seq, 12 pairs each order),
 * 2 / 4 x 44.6-48.0 vs 36.5-43.7 / 27.2-29.1 vs 27.7-30.1 GB/s (bench_seq --nx, four alternated runs). */
AI void q4g_dots_stream(const cpu_gx *gx, const cpu_wrow *w, float *y, size_t ys, const int NX, const int GS,
                        float (*ds)[CPU_GX_MAX_IN / 32 + 16], const __m512 *bs) {
    const int in = gx[0].in, nw = in / (16 * GS), cpb = GS / 8;
    const __m512i perm = _mm512_loadu_si512(q4g_perm_of(GS));
    __m512 A[4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) A[j] = _mm512_setzero_ps();
    const uint8_t *src = w->data;
    int b = 0, c0 = 0;
    for (; b < nw; b++, c0 += 16 * GS, src += 64 * cpb) {
        __m512i a[4][16];
        int whole = 1;
        __asm__("" : "+r"(whole)); /* the row-end mask stays computed per chunk (see above) */
        q4g_chunks(gx, src, c0, NX, GS, GS / 8, whole, a);
        q4g_fold(a, NX, GS, A, ds, b, perm);
    }
    if (c0 < in) {
        const int nch = (in - c0 + 127) / 128; /* 1 .. cpb - 1 */
#define Q4G_TAIL(N) \
    case N: \
        if (N < cpb) q4g_tail(gx, src, c0, NX, GS, N, A, ds, b, perm); \
        break;
        switch (nch) {
            Q4G_TAIL(1) Q4G_TAIL(2) Q4G_TAIL(3) Q4G_TAIL(4) Q4G_TAIL(5) Q4G_TAIL(6) Q4G_TAIL(7) Q4G_TAIL(8)
            Q4G_TAIL(9) Q4G_TAIL(10) Q4G_TAIL(11) Q4G_TAIL(12) Q4G_TAIL(13) Q4G_TAIL(14) Q4G_TAIL(15)
        }
#undef Q4G_TAIL
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) y[(size_t)j * ys] = red_pair(A[j], bs[j]);
}

/* Exact Q4: per group a 16-entry table of s·q + b (rounded as the reference decoder does), per 32 inputs one
 * byte-to-dword widen, one shift and two vpermps lookups feeding FMAs against x in q4 order (16 even inputs, then 16
 * odd ones). NR (1-4) rows, NX (1-4) x: per group and row the table once, its two lookups per 32 weights once, then
 * per x the two FMAs into that row's two chains — k_q4 is NX 1 (gemv_avx512.c), gemv_nx_avx512.c takes several x
 * (NR·NX <= 8 there), so each x's sums are those of k_q4 on it alone, bitwise. */
AI void q4_nx(const cpu_gx *gx, const cpu_wrow *rw, float *y, size_t ys, const int NR, const int NX) {
    const ptrdiff_t pfd = gx[0].pf_data;
    pf_groups(&gx[0], rw, NR);
    const int gs = gx[0].gs, in = gx[0].in;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float sc[4][CPU_MAX_GROUPS + 16], bi[4][CPU_MAX_GROUPS + 16];
    __m512 a0[4][4], a1[4][4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) {
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) a0[r][j] = a1[r][j] = _mm512_setzero_ps();
    }
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
        int len = in - j0 < ch ? in - j0 : ch, ng = len / gs;
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) grp_f32(&rw[r], j0 / gs, ng, sc[r], bi[r]);
        for (int g = 0; g < ng; g++) {
            __m512 lut[4];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) {
                PF(rw[r].data + (j0 + g * gs) / 2);
                lut[r] = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(sc[r][g]), iota), _mm512_set1_ps(bi[r][g]));
            }
            const int x0 = j0 + g * gs;
            for (int t = 0; t < gs; t += 32) {
                __m512 xl[4], xh[4]; /* each x once for all NR rows */
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NX; j++) {
                    xl[j] = _mm512_loadu_ps(gx[j].xp + x0 + t);
                    xh[j] = _mm512_loadu_ps(gx[j].xp + x0 + t + 16);
                    if (NR > 1) { PIN(xl[j]); PIN(xh[j]); }
                }
                _Pragma("GCC unroll 4")
                for (int r = 0; r < NR; r++) {
                    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rw[r].data + (x0 + t) / 2)));
                    const __m512 wl = _mm512_permutexvar_ps(v, lut[r]), wh = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut[r]);
                    _Pragma("GCC unroll 4")
                    for (int j = 0; j < NX; j++) {
                        a0[r][j] = _mm512_fmadd_ps(wl, xl[j], a0[r][j]);
                        a1[r][j] = _mm512_fmadd_ps(wh, xh[j], a1[r][j]);
                    }
                }
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) {
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) y[(size_t)j * ys + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r][j], a1[r][j]));
    }
}

/* Exact Q8: Σ_g s_g·Σ_t q_t·x_t + Σ_g b_g·Σx_g, q via vpmovzxbd + vcvtdq2ps + FMA. NR (1-4) rows, NX (1-4) x: per
 * 16 weights the widen and convert once, then per x one FMA into that row's group chain; k_q8 is NX 1, gemv_nx
 * takes several x (NR·NX <= 8 there) with each x's sums those of k_q8 on it alone. */
AI void q8_nx(const cpu_gx *gx, const cpu_wrow *rw, float *y, size_t ys, const int NR, const int NX) {
    const ptrdiff_t pfd = gx[0].pf_data;
    pf_groups(&gx[0], rw, NR);
    const int gs = gx[0].gs, in = gx[0].in;
    float sc[4][CPU_MAX_GROUPS + 16], bi[4][CPU_MAX_GROUPS + 16];
    __m512 tot[4][4], bs[4][4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) {
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) tot[r][j] = bs[r][j] = _mm512_setzero_ps();
    }
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
        int len = in - j0 < ch ? in - j0 : ch, ng = len / gs;
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) {
            grp_f32(&rw[r], j0 / gs, ng, sc[r], bi[r]);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NX; j++) bs[r][j] = _mm512_add_ps(bs[r][j], bias_dot(bi[r], gx[j].gsum + j0 / gs, ng));
        }
        for (int g = 0; g < ng; g++) {
            const int x0 = j0 + g * gs;
            __m512 acc[4][4];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) {
                PF(rw[r].data + x0);
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NX; j++) acc[r][j] = _mm512_setzero_ps();
            }
            for (int t = 0; t < gs; t += 16) {
                __m512 xv[4]; /* each x once for all NR rows (in registers: the f32 x loads bind these kernels) */
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NX; j++) { xv[j] = _mm512_loadu_ps(gx[j].xp + x0 + t); PIN(xv[j]); }
                _Pragma("GCC unroll 4")
                for (int r = 0; r < NR; r++) {
                    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rw[r].data + x0 + t))));
                    _Pragma("GCC unroll 4")
                    for (int j = 0; j < NX; j++) acc[r][j] = _mm512_fmadd_ps(q, xv[j], acc[r][j]);
                }
            }
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) {
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NX; j++) tot[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(sc[r][g]), acc[r][j], tot[r][j]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) {
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) y[(size_t)j * ys + r] = _mm512_reduce_add_ps(tot[r][j]) + _mm512_reduce_add_ps(bs[r][j]);
    }
}

/* BF16R (the bf16 mode): x rounded to bf16 once in prep, each row through vdpbf16ps — per f32 lane
 * acc += w[2p]·x̂[2p] + w[2p+1]·x̂[2p+1] (bf16 products exact in f32, f32 sums; denormals flushed, as the bf16 GEMM).
 * One row, NX (1-4) x: per x 4 chains over 128 inputs, the tail (in % 128 == 64) into chains 0 and 1; per 32 weights
 * one load for all x, then per x one vdpbf16ps. k_bf16r is NX 1 (rows one after another, one stream per thread, as
 * k_bf16), gemv_nx_avx512.c takes several x, each with k_bf16r's sums on it alone. With several x the codes are
 * prefetched pf_data ahead (prep: 4 KB, a 2048-input row): a row is then consumed slowly enough that demand misses
 * stalled it — rows from DRAM, one thread, ns per row per x at 4 / 8 x: 41 / 36 -> 31-33 / 25-29 (1-8 KB ahead); one
 * x, SW_STREAM ahead, the codes through a masked load (SW_STREAM's note): bench_seq --bf16 token 1.07x (NOTES (bk));
 * several x keep plain loads (masked ones in q4g_block's 2-4 x read a tie or slower). */
AI void bf16r_nx(const cpu_gx *gx, const cpu_wrow *w, float *y, size_t ys, const int NX) {
    const int in = gx[0].in;
    const ptrdiff_t pfd = NX > 1 ? gx[0].pf_data : SW_STREAM; /* one x: PF_T0's stream */
    const uint16_t *p = (const uint16_t *)w->data;
    const __mmask64 all = sw_stream_mask();
    __m512 a[4][4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) {
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) a[j][u] = _mm512_setzero_ps();
    }
    int t = 0;
    for (; t + 128 <= in; t += 128) {
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) {
            _mm_prefetch((const char *)(p + t + 32 * u) + pfd, _MM_HINT_T0);
            __m512i v = NX == 1 ? _mm512_maskz_loadu_epi8(all, p + t + 32 * u) : _mm512_loadu_si512(p + t + 32 * u);
            PIN(v);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NX; j++)
                a[j][u] = _mm512_dpbf16_ps(a[j][u], (__m512bh)v, (__m512bh)_mm512_loadu_si512(gx[j].xb + t + 32 * u));
        }
    }
    for (int u = 0; t < in; t += 32, u++) { /* in % 128 == 64: u = 0, 1 */
        __m512i v = _mm512_loadu_si512(p + t);
        PIN(v);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) a[j][u & 1] = _mm512_dpbf16_ps(a[j][u & 1], (__m512bh)v, (__m512bh)_mm512_loadu_si512(gx[j].xb + t));
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++)
        y[(size_t)j * ys] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[j][0], a[j][1]), _mm512_add_ps(a[j][2], a[j][3])));
}

#endif
