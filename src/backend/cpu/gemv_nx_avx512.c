/*
 * gemv_nx_avx512.c — the fused GEMV for several prepared x at once (a decode step of several
 * sequences, a short prompt, a speculative verify): each weight row is loaded and unpacked once
 * into registers and then multiplied against every x, where calling the one-x kernel per x
 * (gemv_avx512.c) repeats the load and the unpacking for each.
 *
 * Per 64 bytes of Q4 codes (128 inputs) the one-x Q4_I8 kernel spends ~9 vector ops: load, two
 * nibble masks and a shift, two vpdpbusd, a convert and the scale FMAs; here the first four are
 * shared. Exact Q4 shares the widen, the shift and the two table lookups (4 of 6 ops per 32
 * weights), exact Q8 the widen and the convert (2 of 3 per 16); both then bind on f32 x loads,
 * so they take two rows at once with each x loaded into a register once for both (q4_nx, q8_nx
 * in gemv_avx512.h). The bf16 mode's BF16R shares each row's load across the x. Measured in the
 * model (llama3-1b, bench/NOTES.md (bf)), 4 sequences: q4 int8 +40-55 %, exact q4 ~+70 %,
 * exact q8 ~+40 %.
 *
 * Every x gets exactly the arithmetic of the one-x kernel, in its order: the same accumulator
 * chains, the same FMAs on the same operands, the same reductions. So y for one x is bitwise
 * what gemv gives for that x alone, whatever nx and whichever other x come along (a sequence
 * decodes to the same bits alone or in a batch; test_kern_decode decode_several_rows). Where the
 * one-x kernel is not the default (TERN_CPU_Q4_SEQ) or the kind has no several-x kernel, the
 * entry returns 0 and the driver calls gemv per x:
 *   - Q8_I8: the codes feed vpdpbusd as loaded, nothing to share;
 *   - BF16: tried (8 chains per x, x in blocks of 2 or 3) and dropped: 1.2-1.3x on L2-resident
 *     rows but no gain in the model, slower at 8 sequences. Per x the two 64-byte f32 x loads
 *     per 32 weights bind it, and they are not shared.
 *
 * Accumulators: Q4_I8 and BF16R 4 chains per x, exact Q4 2 and Q8 3 per row and x (two rows at
 * once), so x go through in blocks of at most 4 to stay within the 32 registers; a row is
 * re-read from L1 for the next block.
 */
#include "backend/cpu/gemv_avx512.h"

#include <immintrin.h>

/* Q4_I8 (k_q4i8s_t's arithmetic): one row, NX x. The GS 64 scale goes into one accumulator per chain as two
 * lane-masked broadcast FMAs (lanes 0-7, then 8-15): per lane the FMA sequence of k_q4i8s_t's ta/tb pair, which
 * it blends at the end, so the same bits in half the registers. */
AI void q4i8_nx(const cpu_gx *gx, const cpu_wrow *w, float *y, size_t ys, const int NX, const int GS) {
    const ptrdiff_t pfd = gx[0].pf_data;
    const int gs = GS ? GS : gx[0].gs, in = gx[0].in, n512 = in / 512 * 512;
    const __m512i map = lane_groups(8, gs), nib = _mm512_set1_epi8(0x0f);
    const int gsh = __builtin_ctz((unsigned)gs), gpc = 128 >> gsh;
    float ds[4][CPU_GX_MAX_IN / 32 + 16] __attribute__((aligned(64)));
    __m512 bs[4], t[4][4];
    pf_groups(&gx[0], w, 1);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++) {
        bs[j] = _mm512_setzero_ps();
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) t[j][u] = _mm512_setzero_ps();
    }
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) { /* grp_i8's slices, its sums per x */
        const int g0 = j0 / gs;
        float *dsj[4];
        __m512 sl[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) dsj[j] = ds[j] + g0;
        grp_i8_nx(w, g0, (in - j0 < ch ? in - j0 : ch) / gs, gx, NX, dsj, sl);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) bs[j] = _mm512_add_ps(bs[j], sl[j]);
    }
    const uint8_t *src = w->data;
    int c = 0;
    for (; c < n512; c += 512, src += 256) {
        const int g0 = c >> gsh;
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) {
            _mm_prefetch((const char *)src + 64 * u + pfd, _MM_HINT_T0);
            __m512i raw = _mm512_loadu_si512(src + 64 * u);
            PIN(raw);
            const __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NX; j++) {
                const int8_t *xq = gx[j].xq + c + 128 * u;
                const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq)), hi,
                                                      _mm512_loadu_si512(xq + 64));
                const __m512 af = _mm512_cvtepi32_ps(a);
                const float *sp = ds[j] + g0 + gpc * u;
                if (GS == 64) {
                    t[j][u] = _mm512_mask3_fmadd_ps(af, _mm512_set1_ps(sp[0]), t[j][u], 0x00ff);
                    t[j][u] = _mm512_mask3_fmadd_ps(af, _mm512_set1_ps(sp[1]), t[j][u], 0xff00);
                } else if (GS == 128) t[j][u] = _mm512_fmadd_ps(af, _mm512_set1_ps(sp[0]), t[j][u]);
                else t[j][u] = _mm512_fmadd_ps(af, _mm512_permutexvar_ps(map, _mm512_loadu_ps(sp)), t[j][u]);
            }
        }
    }
    for (; c < in; c += 128, src += 64) { /* the tail into chain 0, as k_q4i8s_t; a half chunk at the end */
        _mm_prefetch((const char *)src + pfd, _MM_HINT_T0);
        __m512i raw = _mm512_maskz_loadu_epi8(in - c >= 128 ? ~(__mmask64)0 : 0xffffffffull, src);
        PIN(raw);
        const __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NX; j++) {
            const int8_t *xq = gx[j].xq + c;
            const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq)), hi,
                                                  _mm512_loadu_si512(xq + 64));
            t[j][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(map, _mm512_loadu_ps(ds[j] + (c >> gsh))), t[j][0]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NX; j++)
        y[(size_t)j * ys] = red_pair(_mm512_add_ps(_mm512_add_ps(t[j][0], t[j][1]), _mm512_add_ps(t[j][2], t[j][3])), bs[j]);
}

/* One block of nx (1..4) x over nr rows, the kernel instantiated for that nx. */
#define NX_SWITCH(nx, call) \
    switch (nx) { \
    case 4: call(4); break; \
    case 3: call(3); break; \
    case 2: call(2); break; \
    default: call(1); break; \
    }

static void q4i8_rows(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) {
    for (int r = 0; r < nr; r++) {
#define Q4I8(n) (gx->gs == 64 ? q4i8_nx(gx, rows + r, y + r, ys, n, 64) \
                 : gx->gs == 128 ? q4i8_nx(gx, rows + r, y + r, ys, n, 128) : q4i8_nx(gx, rows + r, y + r, ys, n, 0))
        NX_SWITCH(nx, Q4I8)
#undef Q4I8
    }
}

static void bf16r_rows(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) {
    for (int r = 0; r < nr; r++) {
#define BFR(n) bf16r_nx(gx, rows + r, y + r, ys, n)
        NX_SWITCH(nx, BFR)
#undef BFR
    }
}

/* Exact Q4 / Q8: rows two at a time (each x loaded once for both), an odd last row alone. */
#define NR_NX(kern, R) \
    switch (nx) { \
    case 4: kern(gx, rows + r, y + r, ys, R, 4); break; \
    case 3: kern(gx, rows + r, y + r, ys, R, 3); break; \
    case 2: kern(gx, rows + r, y + r, ys, R, 2); break; \
    default: kern(gx, rows + r, y + r, ys, R, 1); break; \
    }
#define ROWS_IN_PAIRS(kern) \
    for (int r = 0; r < nr; r += 2) { \
        if (r + 2 <= nr) { NR_NX(kern, 2) } \
        else { NR_NX(kern, 1) } \
    }

static void q4_rows(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) { ROWS_IN_PAIRS(q4_nx) }
static void q8_rows(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) { ROWS_IN_PAIRS(q8_nx) }

int tern__cpu_gemv_nx_avx512(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) {
    void (*f)(const cpu_gx *, int, const cpu_wrow *, int, float *, size_t) = NULL;
    const int blk = 4;
    if (nx < 1 || !tern__cpu_gemv_avx512_std(gx->kind)) return 0;
    switch (gx->kind) {
    case CPU_GX_Q4_I8:
        if (gx->gs == 32 || gx->gs == 64 || gx->gs == 128) f = q4i8_rows; /* k_q4i8s's sizes */
        break;
    case CPU_GX_Q4: f = q4_rows; break;
    case CPU_GX_BF16R: f = bf16r_rows; break;
    case CPU_GX_Q8: f = q8_rows; break;
    default: break;
    }
    if (!f) return 0;
    if (nx == 1) { /* the one-x kernel: it sets up the scales of all nr rows before the first row's loop */
        tern__cpu_gemv_avx512(gx, rows, nr, y);
        return 1;
    }
    /* blocks as even as possible (5 = 3 + 2, not 4 + 1: a block of one x shares nothing and waits on its scales) */
    const int nb = (nx + blk - 1) / blk;
    for (int b = 0, j = 0; b < nb; b++) {
        const int n = nx / nb + (b < nx % nb);
        f(gx + j, n, rows, nr, y + (size_t)j * ys, ys);
        j += n;
    }
    return 1;
}
