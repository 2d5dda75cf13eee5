/*
 * gemm_i8_avx512.c — the int8 mode's GEMM (n > 1) for Q8/Q4 weights, AVX-512 VNNI.
 *
 * Same math as the int8 GEMV (gemv_avx512.c, where the bound is derived): x is quantized per
 * weight group g to int8, x̂ = d_g·xq with d_g = max_g|x|/127 (round half to even, the GEMV's
 * code, so a row gets the same xq whatever the batch), and each output is
 *   y = Σ_g s_g·(d_g·Σ_t q_t·xq_t + rq_g) + b_g·Σx_g,   rq_g = C·Σ_g(x − x̂), C = 8 or 128,
 * so |y − y_exact| ≤ ½ Σ_g d_g·Σ_{t∈g} |s_g|·|q_t − C| (+ f32 rounding); test_kern_gemm_i8
 * checks every output against it. Integer sums are exact: only the f32 order differs from
 * the GEMV. Blocking as mm_gemm (cpu_matmul.c): per thread, features in chunks whose y block
 * stays in L2; per block of KC inputs and strip of 32 weight rows, the codes are unpacked to
 * bytes and transposed in registers to wq[t/4][feature][4] (16×16 dword transposes; Q4 in
 * the per-32 order "16 even inputs, then 16 odd" in which packed bytes split into nibbles),
 * scales/biases to f32 [group][feature]. x comes quantized once per call (run_mm: codes in
 * the same order + d, rq, Σx per group) or, for gathered MoE rows, per block into the xbuf.
 * The 6×32 microkernel per 4 inputs: 2 weight loads, 6 dword broadcasts of x, 12 vpdpbusd
 * (64 multiply-adds each) into int32; per group: convert, ·d + rq, ·s, + b·Σx into f32. It
 * also prefetches the next strip, a few lines per group (bursts stall on full fill buffers).
 * Measured (bench/NOTES.md, 2026-11-30): 2.6–2.7× the f32 GEMM per core.
 */
#include "backend/cpu/cpu_impl.h"

#include <immintrin.h>
#include <string.h>

#define NR 32          /* features per strip: two zmm of int32 lanes */
#define MR 6           /* x rows per microkernel: 12 int32 + 12 f32 accumulators */
#define KC 1024        /* inputs per block: a packed strip is 32 KB (L1) */
#define NB 192         /* x rows per block (per-thread quantization: as many as fit the xbuf) */
#define YBLOCK (512 << 10) /* bytes of y one thread revisits per block of inputs (L2) */
#define PF_CAP 640
#define AI static inline __attribute__((always_inline))

_Static_assert(NR * KC + 2 * NR * (KC / 32) * 4 <= CPU_RT_MAX * CPU_CH * 4, "tbuf holds a packed strip");
#define XROW (KC + 3 * (KC / 32) * 4) /* xbuf bytes per row of a per-thread x block */

/* acc += Σ of 4 u8·s8 products per dword lane. As an asm statement: with the intrinsic, GCC
 * copied every accumulator twice per step (24 register moves per 12 vpdpbusd). */
AI __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
}

/* In-place 16×16 dword transpose: afterwards r[j] lane i holds what r[i] lane j held. */
AI void tr16i(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; k++) {
        u[4 * k + 0] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int m = 0; m < 4; m++) {
        __m512i a = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), b = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
        __m512i c = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44), d = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
        r[0 + m] = _mm512_shuffle_i32x4(a, c, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(a, c, 0xDD);
        r[8 + m] = _mm512_shuffle_i32x4(b, d, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
}

/* Codes of inputs [t, t+nt) of one row as bytes (nt = 32 or 64; zeros past nt); Q4 in the
 * per-32 even/odd order. */
AI __m512i codes64(const cpu_wrow *w, int t, int nt) {
    if (w->bits == 8)
        return nt == 64 ? _mm512_loadu_si512(w->data + t) : _mm512_maskz_loadu_epi8(0xffffffffull, w->data + t);
    const uint8_t *p = w->data + t / 2;
    __m256i raw = nt == 64 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi8(0xffffu, p);
    __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(raw, nib), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* lanes lo0 lo1 hi0 hi1 */
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));          /* lo0 hi0 lo1 hi1 */
}

/* A strip of nrows (<= NR) weight rows, inputs [t0, t0+len) (len a multiple of the group,
 * >= 32): codes to wq[t/4][i][4], scales/biases to sp/bp[g][i] (features >= nrows: zero). */
static void pack_w(const cpu_wrow *rows, int nrows, int t0, int len, uint8_t *wq, float *sp, float *bp) {
    for (int t = 0; t < len; t += 64) {
        int nt = len - t < 64 ? len - t : 64;
        for (int i0 = 0; i0 < NR; i0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = i0 + i < nrows ? codes64(&rows[i0 + i], t0 + t, nt) : _mm512_setzero_si512();
            tr16i(r);
            for (int j = 0; j < nt / 4; j++) _mm512_store_si512(wq + (size_t)(t / 4 + j) * (NR * 4) + i0 * 4, r[j]);
        }
    }
    int gs = rows[0].gs, ng = len / gs, g0 = t0 / gs;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(NR));
    memset(sp, 0, sizeof(float) * NR * (size_t)ng);
    memset(bp, 0, sizeof(float) * NR * (size_t)ng);
    for (int i = 0; i < nrows; i++) /* one row's groups, 16 per vector, scattered to [g][i] */
        for (int g = 0; g < ng; g += 16) {
            __mmask16 k = (__mmask16)(ng - g >= 16 ? 0xffff : (1u << (ng - g)) - 1);
            const uint8_t *ps[2] = {rows[i].scales, rows[i].biases};
            float *dst[2] = {sp, bp};
            for (int j = 0; j < 2; j++) {
                __m512 v;
                if (rows[i].sdtype == TERN_DT_F32) v = _mm512_maskz_loadu_ps(k, (const float *)ps[j] + g0 + g);
                else {
                    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)ps[j] + g0 + g);
                    v = rows[i].sdtype == TERN_DT_F16 ? _mm512_cvtph_ps(h)
                                                     : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                }
                _mm512_mask_i32scatter_ps(dst[j] + (size_t)g * NR + i, k, idx, v, 4);
            }
        }
}

/* dst[0..16) = round(v·inv) clamped to [-127, 127] (as the GEMV's quant16); returns the ints */
AI __m512i quant16(__m512 v, __m512 inv, int8_t *dst) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(q));
    return q;
}

/* One row of x, inputs [0, len): codes xq[len], and per group d, rq, Σx. */
void tern__cpu_quant_x_i8(const float *x, int len, int gs, int q4, int8_t *xq, float *xd, float *xr, float *xg) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const float cq = q4 ? 8.0f : 128.0f;
    for (int g = 0; g * gs < len; g++) {
        const float *xp = x + g * gs;
        __m512 m = _mm512_setzero_ps(), s = _mm512_setzero_ps();
        for (int t = 0; t < gs; t += 16) {
            __m512 v = _mm512_loadu_ps(xp + t);
            m = _mm512_max_ps(m, _mm512_abs_ps(v));
            s = _mm512_add_ps(s, v);
        }
        float amax = _mm512_reduce_max_ps(m), gsum = _mm512_reduce_add_ps(s);
        float d = amax / 127.0f;
        __m512 iv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512i sq = _mm512_setzero_si512();
        int8_t *q = xq + g * gs;
        for (int t = 0; t < gs; t += 32) {
            __m512 v0 = _mm512_loadu_ps(xp + t), v1 = _mm512_loadu_ps(xp + t + 16);
            if (q4) {
                __m512 e = _mm512_permutex2var_ps(v0, ev, v1), o = _mm512_permutex2var_ps(v0, od, v1);
                v0 = e;
                v1 = o;
            }
            sq = _mm512_add_epi32(sq, quant16(v0, iv, q + t));
            sq = _mm512_add_epi32(sq, quant16(v1, iv, q + t + 16));
        }
        xd[g] = d;
        xg[g] = gsum;
        xr[g] = cq * (gsum - d * (float)_mm512_reduce_add_epi32(sq));
    }
}

/* M (1..MR) rows × the first ns features of a strip over ng groups of gs inputs; stores
 * (add 0) or adds (add 1; times ys[r] if ys) the 32 results of each row into yp[r]. */
AI void mk_t(int ng, int gs, const uint8_t *wq, const float *sp, const float *bp, const int8_t *xq, size_t ldx,
             const float *xd, const float *xr, const float *xg, int ldg, float *const *yp, const float *ys, int add, int ns,
             const uint8_t *const *pf, int npf, const int M) {
    const int pg = (npf + ng - 1) / ng; /* prefetches per group: spread, so misses never queue up */
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < M; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512i a0[MR], a1[MR];
#pragma GCC unroll 6
        for (int r = 0; r < M; r++) a0[r] = a1[r] = _mm512_setzero_si512();
        for (int e = 0; e < pg && npf > 0; e++, npf--) _mm_prefetch((const char *)*pf++, _MM_HINT_T1);
        const uint8_t *w = wq + (size_t)g * gs * NR;
        const int8_t *x = xq + g * gs;
        for (int t = 0; t < gs; t += 4, w += NR * 4) {
            __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 64);
#pragma GCC unroll 6
            for (int r = 0; r < M; r++) {
                int32_t v;
                memcpy(&v, x + r * ldx + t, 4);
                __m512i xb = _mm512_set1_epi32(v);
                a0[r] = dpbusd(a0[r], w0, xb);
                a1[r] = dpbusd(a1[r], w1, xb);
            }
        }
        __m512 s0 = _mm512_load_ps(sp + g * NR), s1 = _mm512_load_ps(sp + g * NR + 16);
        __m512 b0 = _mm512_load_ps(bp + g * NR), b1 = _mm512_load_ps(bp + g * NR + 16);
#pragma GCC unroll 6
        for (int r = 0; r < M; r++) {
            __m512 d = _mm512_set1_ps(xd[r * ldg + g]), q = _mm512_set1_ps(xr[r * ldg + g]);
            __m512 gx = _mm512_set1_ps(xg[r * ldg + g]);
            __m512 f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0[r]), d, q), f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[r]), d, q);
            c0[r] = _mm512_fmadd_ps(b0, gx, _mm512_fmadd_ps(f0, s0, c0[r]));
            c1[r] = _mm512_fmadd_ps(b1, gx, _mm512_fmadd_ps(f1, s1, c1[r]));
        }
    }
    __mmask16 m0, m1;
    cpu_strip_masks(ns, &m0, &m1);
#pragma GCC unroll 6
    for (int r = 0; r < M; r++) cpu_strip_store(yp[r], c0[r], c1[r], ys, r, add, m0, m1);
}

#define MK(M) \
    case M: mk_t(ng, gs, wq, sp, bp, xq, ldx, xd, xr, xg, ldg, yp, ys, add, ns, pf, npf, M); return;
static void mk(int mr, int ng, int gs, const uint8_t *wq, const float *sp, const float *bp, const int8_t *xq, size_t ldx,
               const float *xd, const float *xr, const float *xg, int ldg, float *const *yp, const float *ys, int add, int ns,
               const uint8_t *const *pf, int npf) {
    switch (mr) {
        MK(1) MK(2) MK(3) MK(4) MK(5) MK(6)
    default: return;
    }
}

/* Cache lines of strip rows [s0, s0+ns), inputs [t0, t0+len), and their scales/biases. */
static int pf_list(const tern_tensor *w, int mat, int64_t s0, int ns, int t0, int len, const uint8_t **pf) {
    cpu_wrow row;
    int np = 0;
    size_t b0 = (size_t)t0 * (size_t)w->bits / 8, b1 = (size_t)(t0 + len) * (size_t)w->bits / 8;
    size_t g0 = (size_t)(t0 / w->group_size) * tern_dtype_size(w->sdtype);
    for (int i = 0; i < ns && np + 2 <= PF_CAP; i++) {
        tern__cpu_wrow_at(w, mat, s0 + i, &row);
        pf[np++] = row.scales + g0;
        pf[np++] = row.biases + g0;
        for (size_t b = b0 & ~(size_t)63; b < b1 && np < PF_CAP; b += 64) pf[np++] = row.data + b;
    }
    return np;
}

int tern__cpu_gemm_i8_fits(const tern_tensor *w) {
    int gs = w->group_size;
    return w->dtype == TERN_DT_Q && (w->bits == 4 || w->bits == 8) && gs >= 32 && gs <= KC && gs % 32 == 0 &&
           KC % gs == 0 && w->shape[w->ndim - 1] % gs == 0;
}

int tern__cpu_gemm_i8(const cpu_impl *c, int ith, const cpu_mm_job *jb, int64_t o0, int64_t o1) {
    const tern_tensor *w = jb->w;
    if (!tern__cpu_gemm_i8_fits(w)) return 0;
    int in = (int)w->shape[w->ndim - 1], n = jb->n, gs = w->group_size, q4 = w->bits == 4;
    uint8_t *wq = (uint8_t *)c->tbuf[ith];
    float *sp = (float *)(wq + NR * KC), *bp = sp + NR * (KC / 32);
    /* x: quantized once per call (jb->xq, rows indexed like jb->x), else here per block of
     * rows and inputs into the thread's xbuf */
    const cpu_xq *sx = jb->xq && jb->xq->gs == gs && jb->xq->q4 == q4 && jb->xq->in == in ? jb->xq : NULL;
    int nb = sx ? NB : (int)(CPU_GX_BUF / XROW) / MR * MR, bg = KC / 32;
    int8_t *bq = (int8_t *)c->xbuf[ith];
    float *bd = (float *)(bq + (size_t)nb * KC), *br = bd + nb * bg, *bs = br + nb * bg;
    float *yp[MR], ys[MR];
    const uint8_t *pf[PF_CAP];
    cpu_wrow rows[NR];
    for (int r0 = 0; r0 < n; r0 += nb) {
        int nbk = TERN_MIN(nb, n - r0);
        int64_t nc = TERN_MAX((int64_t)NR, (int64_t)(YBLOCK / sizeof(float) / (size_t)nbk) / NR * NR);
        for (int64_t c0 = o0; c0 < o1; c0 += nc) {
            int64_t c1 = TERN_MIN(o1, c0 + nc);
            for (int t0 = 0; t0 < in; t0 += KC) {
                int len = TERN_MIN(KC, in - t0), ng = len / gs, add = jb->accum || t0 > 0;
                if (!sx)
                    for (int r = 0; r < nbk; r++) {
                        int rr = r0 + r;
                        const float *x = jb->x + (size_t)(jb->xrow ? jb->xrow[rr] : rr) * jb->ldx + t0;
                        tern__cpu_quant_x_i8(x, len, gs, q4, bq + (size_t)r * KC, bd + r * bg, br + r * bg, bs + r * bg);
                    }
                for (int64_t s0 = c0; s0 < c1; s0 += NR) {
                    int ns = (int)TERN_MIN((int64_t)NR, c1 - s0);
                    for (int i = 0; i < ns; i++) tern__cpu_wrow_at(w, jb->mat, s0 + i, &rows[i]);
                    pack_w(rows, ns, t0, len, wq, sp, bp);
                    /* prefetch the next strip (or the chunk's first strip of the next block) into L2,
                     * spread over the row blocks: every weight row of a strip starts with a miss otherwise */
                    int np = 0, nblk = (nbk + MR - 1) / MR;
                    if (s0 + NR < c1) np = pf_list(w, jb->mat, s0 + NR, (int)TERN_MIN((int64_t)NR, c1 - s0 - NR), t0, len, pf);
                    else if (t0 + KC < in)
                        np = pf_list(w, jb->mat, c0, (int)TERN_MIN((int64_t)NR, c1 - c0), t0 + KC, TERN_MIN(KC, in - t0 - KC), pf);
                    int per = (np + nblk - 1) / nblk, p = 0;
                    for (int b0 = 0; b0 < nbk; b0 += MR) {
                        int mr = TERN_MIN(MR, nbk - b0);
                        int npf = TERN_MAX(0, TERN_MIN(per, np - p));
                        for (int r = 0; r < mr; r++) {
                            int rr = r0 + b0 + r;
                            yp[r] = jb->y + (size_t)(jb->yrow ? jb->yrow[rr] : rr) * jb->ldy + s0;
                            ys[r] = jb->yscale ? jb->yscale[rr] : 1.0f;
                        }
                        const float *ysc = jb->accum && jb->yscale ? ys : NULL;
                        if (sx) { /* the shared x is indexed by job row (run_mm sets it only without xrow) */
                            size_t xr0 = (size_t)(r0 + b0), ldg = (size_t)sx->ng, g0 = (size_t)(t0 / gs);
                            mk(mr, ng, gs, wq, sp, bp, sx->q + xr0 * in + t0, (size_t)in, sx->d + xr0 * ldg + g0,
                               sx->rq + xr0 * ldg + g0, sx->sum + xr0 * ldg + g0, (int)ldg, yp, ysc, add, ns, pf + p, npf);
                        } else {
                            mk(mr, ng, gs, wq, sp, bp, bq + (size_t)b0 * KC, KC, bd + b0 * bg, br + b0 * bg, bs + b0 * bg,
                               bg, yp, ysc, add, ns, pf + p, npf);
                        }
                        p += npf;
                    }
                }
            }
        }
    }
    return 1;
}
