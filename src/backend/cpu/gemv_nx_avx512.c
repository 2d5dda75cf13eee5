/*
 * gemv_nx_avx512.c — the fused GEMV for several prepared x at once (a decode step of several
 * sequences, a short prompt, a speculative verify): each weight row is loaded and unpacked once
 * into registers and then multiplied against every x, where calling the one-x kernel per x
 * (gemv_avx512.c) repeats the load and the unpacking for each.
 *
 * Per 64 bytes of Q4 codes (128 inputs) the one-x Q4_I8 kernel spends ~9 vector ops: load, two
 * nibble masks and a shift, two vpdpbusd and ~2.6 in-lane shuffles and adds of its per-group sums
 * (q4g_*, gemv_avx512.h); here the first four are shared (q4g_block, 2-4 x a pass). From 12 x
 * (TERN_CPU_KX) group-64 rows put x in the vector lanes instead (kx_rows below): per 4 codes of a
 * row one broadcast and one vpdpbusd serve 16 x, and the scale work is per group and row, not per
 * chunk and x — 16 sequences of llama3-1b ~1.5x (NOTES (bj)). Exact Q4 shares the widen, the shift and the two table lookups (4 of 6 ops per 32
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
 * Accumulators: Q4_I8 one per x (3-4 x: its block's sums reduced as the chunks come), BF16R 4 chains per x, exact Q4 2 and Q8 3 per row and x (two rows at
 * once), so x go through in blocks of at most 4 to stay within the 32 registers; a row is
 * re-read from L1 for the next block.
 */
#include "backend/cpu/gemv_avx512.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Q4_I8 with x in the vector lanes (GS 64; nx >= kx_min(), default 12): lane j of every vector is x j, so one
 * vpdpbusd multiplies 4 codes of one row, broadcast, by 4 inputs of 16 x at once (64 products), against 2 of them
 * per 128 products plus ~2.6 reduction ops per x and chunk in q4i8_rows (q4g_dots). The codes are unpacked once per row
 * and group into a 64-byte buffer; x is transposed once per set of x (kx_prep: int8 x as [position][x] dwords, d,
 * Σx and rq as [group][x]) and kept per thread, keyed by the x's gemv_prep serial numbers. Per row and x the sums
 * are q4g_dots's, bitwise: the same int32 per group, the same FMA into chain c = g % 16 (A[r][c], one vector a chain
 * with x in lanes), grp_i8's bias chains, and red_pair's tree over the chains in q4g_perm's pairing. */
enum { KX_GS = 64, KX_R = 16, KX_X = 16 };
typedef struct kx_cache {
    unsigned long long gen0, gen1; /* gemv_prep serials of the first and last x; 0: empty */
    int nx, in;
    __m512i xq[CPU_GX_MAX_IN / 4]; /* [dword position][x], over whole 128-input chunks */
    __m512 xd[CPU_GX_MAX_IN / KX_GS + 16], gsum[CPU_GX_MAX_IN / KX_GS + 16], rq[CPU_GX_MAX_IN / KX_GS + 16];
} kx_cache;
/* one per thread (~0.6 MB), allocated on its first several-x call and held by a thread key, whose destructor frees it
 * when the thread ends (a closed backend's pool threads) */
static pthread_key_t kx_key;
static pthread_once_t kx_once = PTHREAD_ONCE_INIT;
static int kx_key_ok;
static void kx_key_make(void) { kx_key_ok = pthread_key_create(&kx_key, free) == 0; }

/* 16x16 f32 transpose: out[i][r] = in[r·ld + i] */
AI void kx_tr16(const float *in, size_t ld, float (*out)[16]) {
    __m512 r[16], t[16];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(in + (size_t)i * ld);
    _Pragma("GCC unroll 8")
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 16; i += 4) {
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]), c = _mm512_castps_pd(t[i + 2]),
                      d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4q + k]: 128-bit block b holds element 4b + k of rows 4q..4q+3 */
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++) {
        const __m512 a = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 b = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512 c = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 d = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
        _mm512_store_ps(out[k], _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_store_ps(out[8 + k], _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_store_ps(out[4 + k], _mm512_shuffle_f32x4(b, d, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_store_ps(out[12 + k], _mm512_shuffle_f32x4(b, d, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

/* The thread's transposed copy of these nx (<= 16) x, made if it is not the one it holds; NULL without memory. */
static const kx_cache *kx_prep(const cpu_gx *gx, int nx) {
    pthread_once(&kx_once, kx_key_make);
    if (!kx_key_ok) return NULL;
    kx_cache *k = pthread_getspecific(kx_key);
    if (!k) {
        if (posix_memalign((void **)&k, 64, sizeof *k)) return NULL;
        if (pthread_setspecific(kx_key, k)) {
            free(k);
            return NULL;
        }
        k->gen0 = 0;
    }
    const int in = gx[0].in, ng = in / KX_GS, ngp = (ng + 15) / 16 * 16;
    if (k->gen0 == gx[0].gen && k->gen1 == gx[nx - 1].gen && k->nx == nx && k->in == in) return k;
    k->gen0 = 0; /* invalid while rebuilt */
    float t[16][16] __attribute__((aligned(64)));
    for (int p = 0; p < (in + 127) / 128 * 32; p += 16) { /* 16 dwords of each x -> 16 positions of all x (whole chunks) */
        for (int j = 0; j < 16; j++)
            _mm512_store_si512(t[j], j < nx ? _mm512_loadu_si512(gx[j].xq + 4 * p) : _mm512_setzero_si512());
        kx_tr16(&t[0][0], 16, (float (*)[16])&k->xq[p]);
    }
    for (int g = 0; g < ngp; g += 16) {
        const __mmask16 m = ng - g >= 16 ? 0xffff : (__mmask16)((1u << (ng - g)) - 1);
        for (int f = 0; f < 3; f++) {
            for (int j = 0; j < 16; j++) {
                const float *v = j >= nx ? NULL : f == 0 ? gx[j].xd : f == 1 ? gx[j].gsum : gx[j].rq;
                _mm512_store_ps(t[j], v ? _mm512_maskz_loadu_ps(m, v + g) : _mm512_setzero_ps());
            }
            kx_tr16(&t[0][0], 16, (float (*)[16])(f == 0 ? &k->xd[g] : f == 1 ? &k->gsum[g] : &k->rq[g]));
        }
    }
    k->nx = nx, k->in = in, k->gen1 = gx[nx - 1].gen, k->gen0 = gx[0].gen;
    return k;
}

/* nr (<= 16) rows, nx (<= 16) x through the cache k: y[j·ys + r] */
static void kx_rows(const kx_cache *k, const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) {
    /* codes prefetched into L2 one call's rows (16) ahead: the driver's distance (gx->pf_data, a few 4-row passes)
     * lands inside a 16-row call. llama3-1b q4 int8, 16 sequences, per matmul_glu 2.64 -> 1.84-1.94 ms (NOTES (bj)) */
    const ptrdiff_t pfd = nr > 1 ? (rows[1].data - rows[0].data) * KX_R : 0;
    const int in = k->in, ng = in / KX_GS, ngp = (ng + 15) / 16 * 16;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const int *perm = q4g_perm_of(KX_GS);
    float sc[KX_R][CPU_GX_MAX_IN / KX_GS + 16] __attribute__((aligned(64)));
    __m512 A[KX_R][16];
    float yt[16][16] __attribute__((aligned(64))); /* [row][x], then transposed */
    /* per row: its scales as f32 (bias terms too: grp_i8's chains, slice by slice, reduced at once) */
    for (int r = 0; r < nr; r++) {
        pf_groups(gx, &rows[r], 1);
        __m512 B[16], Bs[16];
        _Pragma("GCC unroll 16")
        for (int c = 0; c < 16; c++) B[c] = A[r][c] = _mm512_setzero_ps();
        for (int g0 = 0; g0 < ng; g0 += CPU_MAX_GROUPS) {
            const int ge = g0 + CPU_MAX_GROUPS < ng ? g0 + CPU_MAX_GROUPS : ng;
            _Pragma("GCC unroll 16")
            for (int c = 0; c < 16; c++) Bs[c] = _mm512_setzero_ps();
            for (int g = g0; g < ge; g += 16) {
                const __mmask16 m = ge - g >= 16 ? 0xffff : (__mmask16)((1u << (ge - g)) - 1);
                __m512 sv, bv;
                grp_sb(&rows[r], g, m, &sv, &bv);
                _mm512_store_ps(sc[r] + g, sv);
                float bb[16] __attribute__((aligned(64)));
                _mm512_store_ps(bb, bv);
                _Pragma("GCC unroll 16")
                for (int c = 0; c < 16; c++) { /* lanes past the slice: fma(0, 0, ·), as grp_i8's masked lanes */
                    Bs[c] = _mm512_fmadd_ps(_mm512_set1_ps(bb[c]), k->gsum[g + c], Bs[c]);
                    Bs[c] = _mm512_fmadd_ps(_mm512_set1_ps(sc[r][g + c]), k->rq[g + c], Bs[c]);
                }
            }
            _Pragma("GCC unroll 16")
            for (int c = 0; c < 16; c++) B[c] = _mm512_add_ps(B[c], Bs[c]);
        }
        __m512 P[8];
        _Pragma("GCC unroll 8")
        for (int l = 0; l < 8; l++) P[l] = _mm512_add_ps(B[l], B[l + 8]);
        _Pragma("GCC unroll 4")
        for (int l = 0; l < 4; l++) P[l] = _mm512_add_ps(P[l], P[l + 4]);
        P[0] = _mm512_add_ps(P[0], P[2]), P[1] = _mm512_add_ps(P[1], P[3]);
        _mm512_store_ps(yt[r], _mm512_add_ps(P[0], P[1])); /* reduce(bs), per x */
    }
    for (int g = 0; g < ng; g++) {
        const int c = g & 15, pl = (g >> 1) * 32 + (g & 1) * 8; /* the group's first low-nibble dword position */
        uint8_t ub[KX_R][64] __attribute__((aligned(64)));
        for (int r = 0; r < nr; r++) { /* low nibbles, then high: the order of the x positions pl.., pl + 16.. */
            if (!(g & 1)) _mm_prefetch((const char *)rows[r].data + (size_t)g * 32 + pfd, _MM_HINT_T1);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(rows[r].data + (size_t)g * 32));
            _mm512_store_si512(ub[r], _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1), nib));
        }
        __m512i X[16];
        _Pragma("GCC unroll 8")
        for (int t = 0; t < 8; t++) X[t] = k->xq[pl + t], X[8 + t] = k->xq[pl + 16 + t];
        const __m512 xd = k->xd[g];
        for (int r0 = 0; r0 < nr; r0 += 4) {
            __m512i a0[4], a1[4];
            const uint8_t *u[4];
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm512_setzero_si512(), u[i] = ub[r0 + i < nr ? r0 + i : r0];
            _Pragma("GCC unroll 8")
            for (int t = 0; t < 16; t += 2) {
                _Pragma("GCC unroll 4")
                for (int i = 0; i < 4; i++) {
                    a0[i] = _mm512_dpbusd_epi32(a0[i], _mm512_set1_epi32(*(const int32_t *)(u[i] + 4 * t)), X[t]);
                    a1[i] = _mm512_dpbusd_epi32(a1[i], _mm512_set1_epi32(*(const int32_t *)(u[i] + 4 * t + 4)), X[t + 1]);
                }
            }
            for (int i = 0; i < 4 && r0 + i < nr; i++) {
                __m512 *ar = &A[r0 + i][c];
                const __m512 ds = _mm512_mul_ps(_mm512_set1_ps(sc[r0 + i][g]), xd);
                *ar = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0[i], a1[i])), ds, *ar);
            }
        }
    }
    const __m512 z = _mm512_setzero_ps();
    for (int r = 0; r < KX_R; r++) {
        if (r >= nr) {
            _mm512_store_ps(yt[r], z);
            continue;
        }
        for (int g = ng; g < ngp; g++) A[r][g & 15] = _mm512_fmadd_ps(z, z, A[r][g & 15]); /* the last block's empty lanes */
        __m512 P[8];
        _Pragma("GCC unroll 8")
        for (int l = 0; l < 8; l++) P[l] = _mm512_add_ps(A[r][perm[l]], A[r][perm[l + 8]]);
        _Pragma("GCC unroll 4")
        for (int l = 0; l < 4; l++) P[l] = _mm512_add_ps(P[l], P[l + 4]);
        P[0] = _mm512_add_ps(P[0], P[2]), P[1] = _mm512_add_ps(P[1], P[3]);
        _mm512_store_ps(yt[r], _mm512_add_ps(_mm512_add_ps(P[0], P[1]), _mm512_load_ps(yt[r])));
    }
    float yo[16][16] __attribute__((aligned(64)));
    kx_tr16(&yt[0][0], 16, yo);
    const __mmask16 km = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    for (int j = 0; j < nx; j++) _mm512_mask_storeu_ps(y + (size_t)j * ys, km, _mm512_load_ps(yo[j]));
}

/* TERN_CPU_KX: the fewest x that take kx_rows (0: never); default 12 */
static _Atomic int kx_min_v = -1;
static int kx_min(void) {
    int v = kx_min_v;
    if (v < 0) {
        const char *e = getenv("TERN_CPU_KX");
        v = e && *e ? atoi(e) : 12;
        kx_min_v = v = v < 0 ? 0 : v;
    }
    return v;
}

/* Q4_I8 g64 through kx_rows, x in blocks of up to 16 and rows of up to 16; 0 when it does not take the call */
static int kx_run(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) {
    const int lo = kx_min();
    if (!lo || nx < lo || gx->gs != KX_GS || !gx->gen) return 0;
    for (int j = 0; j < nx; j += KX_X) {
        const int n = nx - j < KX_X ? nx - j : KX_X;
        const kx_cache *k = kx_prep(gx + j, n);
        if (!k) return 0; /* only on the first block: the buffer, once there, stays */
        for (int r = 0; r < nr; r += KX_R) kx_rows(k, gx + j, n, rows + r, nr - r < KX_R ? nr - r : KX_R, y + (size_t)j * ys + r, ys);
    }
    return 1;
}

/* One block of nx (1..4) x over nr rows, the kernel instantiated for that nx. */
#define NX_SWITCH(nx, call) \
    switch (nx) { \
    case 4: call(4); break; \
    case 3: call(3); break; \
    case 2: call(2); break; \
    default: call(1); break; \
    }

/* Q4_I8: rows in pairs, both rows' scales before either's codes (no row waits on its own scale stores; as k_q4i8g) */
AI void q4i8_pair(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y, size_t ys, const int NX, const int GS) {
    float ds[2][4][CPU_GX_MAX_IN / 32 + 16] __attribute__((aligned(64)));
    __m512 bs[2][4];
    for (int r = 0; r < nr; r++) q4g_scales(gx, rows + r, NX, GS, ds[r], bs[r]);
    for (int r = 0; r < nr; r++) q4g_dots(gx, rows + r, y + r, ys, NX, GS, ds[r], bs[r]);
}
static void q4i8_rows(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys) {
    for (int r = 0; r < nr; r += 2) {
        const int n2 = nr - r < 2 ? 1 : 2;
#define Q4I8(n) (gx->gs == 64 ? q4i8_pair(gx, rows + r, n2, y + r, ys, n, 64) \
                 : gx->gs == 128 ? q4i8_pair(gx, rows + r, n2, y + r, ys, n, 128) : q4i8_pair(gx, rows + r, n2, y + r, ys, n, 32))
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
    if (gx->kind == CPU_GX_Q4_I8 && kx_run(gx, nx, rows, nr, y, ys)) return 1;
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
