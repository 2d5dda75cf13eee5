/*
 * cpu_matmul.c — matmul, expert matmul and the MoE block of the fast CPU backend.
 *
 * A plain matmul of 1-16 rows goes first to the decode driver of cpu_decode.c (one pool run,
 * each x prepared once, work stealing, its row limit per format; also matmul_n / matmul_glu /
 * matmul_add); what it declines, expert matmuls and more rows come here. One driver
 * (tern__cpu_mm) serves every weight dtype:
 *   - a few rows (up to the driver's limit, tern__cpu_dec_rows_for) of BF16/Q8/Q4 with
 *     in % 64 == 0: the ISA's fused GEMV (gemv_avx512.c / gemv_avx2.c): each x is laid out in
 *     turn in the thread's buffer (plus Σx per group, or int8 x in TERN_CPU_INT8 mode), then 4
 *     weight rows per pass are read and never written out decoded. For Q8/Q4 the kernels prefetch the same
 *     offsets a few passes of rows ahead (gemv_pf, TERN_CPU_PF; bench/NOTES.md 2026-11-30 (f)).
 * Otherwise, for a tile of weight rows it decodes CPU_CH inputs of each row into an f32
 * tile (F32 weights are used in place), then runs the 4x4 register-blocked microkernel over
 * blocks of 4 activation rows, accumulating into y.
 *   - decode (n <= 8): tiles of 4 rows, 8 KB — the tile stays in L1 and every weight byte is
 *     read once per call.
 *   - n > 8 without a GEMM in the ISA table (scalar, or TERN_CPU_GEMM=0): tiles of 32 rows ×
 *     512 inputs (64 KB, L2), decoded once per call and reused by all n activation rows.
 * Prefill (n > 8) on AVX2/AVX-512 runs the blocked GEMM instead (mm_gemm; kernels in
 * gemm_avx512.c / gemm_avx2.c). Per block of up to GEMM_XROWS (512) rows of x and block of GEMM_KC inputs it packs
 * the rows once (the thread's grown mx buffer, blocks of gemm_mr rows, input-major); then for each strip of gemm_nr
 * weight rows of the thread's features it decodes the strip once into f32 (bf16 pairs in the bf16 mode), packed
 * input-major (its tbuf: 2 × nr·KC floats = 64 KB), and runs the mr × nr outer-product microkernel over all packed
 * rows, which also prefetches the next strip's weight bytes (a miss per row and strip otherwise) and, from the second
 * block of inputs on, the y lines it is about to add to. Each weight byte is decoded once per 512 activation rows
 * (the CPU's prefill chunk), x packed once per block; y gets one block of inputs at a time (stored on the first block
 * unless the job accumulates, then added) — y leaves the cache between blocks, which the prefetch hides (until
 * session 51 the features went in chunks whose y stayed in L2, and x was packed again for every chunk: llama3-1b
 * pp512 +15-40 %, bench/NOTES.md (bk)). TERN_CPU_GEMM=0 keeps
 * the tile path (before/after benchmarks). Measured: bench/NOTES.md (2026-11-30, prefill).
 * Threads split the output features (weight rows), so each thread streams its own slice of
 * the weight and writes disjoint columns of y.
 * The int8 mode (--compute int8 / TERN_CPU_INT8=1) sends every Q8/Q4 matmul the fused GEMV
 * does not take (n > 1, or rows it has no kernel for) to the VNNI GEMM of gemm_i8_avx512.c,
 * with x quantized once per call for all threads (run_mm); both quantize a row of x the same
 * way, so a row's result does not depend on the batch beyond f32 summation order.
 *
 * MoE (moe_mlp): assignments (row, j) are grouped by expert with a counting sort, then two
 * pool runs: (1) gate and up projections of every active expert for the thread's slice of
 * I, followed by act(g)·u in place; (2) the down projection for the thread's slice of H,
 * accumulated into y with the routing weight. Each expert's weights are read once per step.
 *
 * matmul_heads (GLM-5's per-head W_UK / W_UV products, ops.h tern_glm_ops): every head's matmul_expert job in one
 * pool run over the (head, feature) range — the per-head loop was 2 x 64 pool runs and 256 copies a layer.
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void tern__cpu_split(int64_t total, int unit, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t units = (total + unit - 1) / unit;
    int64_t a = units * ith / nth * unit, b = units * (ith + 1) / nth * unit;
    *lo = a < total ? a : total;
    *hi = b < total ? b : total;
}

void tern__cpu_wrow_at(const tern_tensor *t, int mat, int64_t o, cpu_wrow *r) {
    int64_t in = t->shape[t->ndim - 1], out = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    size_t rb = tern_tensor_row_bytes(t);
    size_t ms = t->mat_stride ? t->mat_stride : (size_t)out * rb;
    if (t->mat_map) mat = t->mat_map[mat]; /* expert slot view (tensor.h) */
    r->data = (const uint8_t *)t->data + (size_t)mat * ms + (size_t)o * rb;
    r->dtype = t->dtype;
    r->scales = r->biases = NULL;
    if (t->dtype == TERN_DT_Q) {
        int64_t ng = in / t->group_size;
        size_t ss = tern_dtype_size(t->sdtype);
        size_t mss = t->mat_stride_s ? t->mat_stride_s : (size_t)(out * ng) * ss;
        size_t off = (size_t)mat * mss + (size_t)(o * ng) * ss;
        r->scales = (const uint8_t *)t->scales + off;
        r->biases = (const uint8_t *)t->biases + off;
        r->sdtype = t->sdtype;
        r->bits = t->bits;
        r->gs = t->group_size;
    } else if (tern_tensor_is_fp8_block(t)) { /* the scale row of o's row block */
        size_t srow = (size_t)tern_tensor_fp8_scale_cols(t) * 4;
        size_t mss = t->mat_stride_s ? t->mat_stride_s : tern_tensor_fp8_scale_bytes(t);
        r->scales = (const uint8_t *)t->scales + (size_t)mat * mss + (size_t)(o / t->blk_rows) * srow;
        r->sdtype = TERN_DT_F32;
        r->gs = t->group_size;
    }
}

int tern__cpu_wrow_steps(const tern_tensor *t, size_t *rb, size_t *sb) {
    if (tern_tensor_is_fp8_block(t)) return 0;
    *rb = tern_tensor_row_bytes(t);
    *sb = t->dtype == TERN_DT_Q ? (size_t)(t->shape[t->ndim - 1] / t->group_size) * tern_dtype_size(t->sdtype) : 0;
    return 1;
}

/* Every field of a stepped row is stored once and nothing is read back: a struct copy followed by `+=` on its
 * pointers made GCC reload 16 bytes across two of the copy's stores — a failed store-to-load forward (~15 cycles)
 * per row, a fifth of a short-row GEMV (bench/NOTES.md (bg)). */
void tern__cpu_wrow_pass(const tern_tensor *w, int mat, const cpu_wrow *base, int64_t d, int64_t o, int nr, int lin,
                         size_t rb, size_t sb, cpu_wrow *rows) {
    for (int i = 0; i < nr; i++) {
        if (!lin) { tern__cpu_wrow_at(w, mat, o + i, &rows[i]); continue; }
        const size_t k = (size_t)(d + i);
        rows[i] = (cpu_wrow){.data = base->data + k * rb,
                             .scales = sb ? base->scales + k * sb : base->scales,
                             .biases = sb ? base->biases + k * sb : base->biases,
                             .dtype = base->dtype, .sdtype = base->sdtype, .bits = base->bits, .gs = base->gs};
    }
}

/* Prefetch distance of the fused Q8/Q4 GEMV (TERN_CPU_PF=bytes, 0 = the kernels' old 1 KB):
 * the rows of one matrix are contiguous, so a pass over rows o..o+3 prefetches the same
 * offsets in the rows `ahead` later (whole passes, >= pf bytes of weight data ahead) and their
 * scales/biases; each thread thereby runs one deep sequential stream over its slice. */
static _Atomic long pf_bytes = -1;
static long gemv_pf_bytes(void) {
    long b = pf_bytes;
    if (b < 0) {
        const char *e = getenv("TERN_CPU_PF");
        b = e && *e ? strtol(e, NULL, 10) : 8192;
        if (b < 0 || b > (64l << 20)) b = 8192;
        pf_bytes = b;
    }
    return b;
}

void tern__cpu_gemv_pf_set(long bytes) { pf_bytes = bytes < 0 ? -1 : bytes; } /* benchmarks; -1: env/default */

void tern__cpu_gemv_pf(const tern_tensor *w, cpu_gx *gx) {
    long want = gemv_pf_bytes();
    size_t rb = tern_tensor_row_bytes(w);
    /* BF16: the AVX-512 kernel reads rows one at a time with no software prefetch since NOTES (ac); these
     * distances reach only the AVX2 kernel and the former AVX-512 one (TERN_CPU_BF16_X4=1).
     * TERN_CPU_PF_BF16=1 (opt-in): BF16 rows take the passes-ahead distance too (by default they keep the
     * kernel's 1 KB in-row prefetch, tuned at ~30 GB/s). Session 13, this box at ~70 GB/s (NOTES (v)):
     * one 8192x2048 GEMV 0.72 → 0.76-0.77 of the probe (5 pairs, 8-32 KB), llama3-1b decode 17.5 → 17.7
     * tok/s median of 4 interleaved — inside the noise, so not the default */
    static int pfbf = -1;
    if (pfbf < 0) { const char *e = getenv("TERN_CPU_PF_BF16"); pfbf = e && *e == '1'; }
    /* A BF16 matrix of >= 256 MB (an lm head: one long stream per thread) takes a 64 KB passes-ahead distance by
     * default. Session 18, this box at ~50-70 GB/s (NOTES (aa)): llama3-1b's 128256x2048 head inside the model
     * 35.2 / 38.0 / 34.8 → 41.4 / 39.5 / 42.0 GB/s (three interleaved rounds; gate|up unchanged, hence not for all) */
    const size_t rows = w->ndim >= 2 ? (size_t)w->shape[w->ndim - 2] : 1;
    const int head = w->dtype == TERN_DT_BF16 && !pfbf && rb * rows >= ((size_t)256 << 20);
    if (head && want) want = want > 65536 ? want : 65536;
    if (!want || !rb || (w->dtype != TERN_DT_Q && !((pfbf || head) && w->dtype == TERN_DT_BF16))) return;
    int64_t ahead = ((int64_t)((size_t)want + rb - 1) / (int64_t)rb + 3) / 4 * 4;
    gx->pf_data = (ptrdiff_t)(ahead * (int64_t)rb);
    gx->pf_sb = w->dtype != TERN_DT_Q ? 0 : (ptrdiff_t)(ahead * (w->shape[w->ndim - 1] / w->group_size) * (int64_t)tern_dtype_size(w->sdtype));
}

/* The thread's grown buffer of at least `need` bytes (shared by mm_gemv's several x and mm_gemm's packed x, never
 * both in one call; NULL if it cannot grow). */
static void *mx_bytes(const cpu_impl *c, int ith, size_t need) {
    if (c->mxcap[ith] < need) {
        void *p = tern_aalloc(need);
        if (!p) return NULL;
        tern_afree(c->mxb[ith]);
        c->mxb[ith] = p;
        c->mxcap[ith] = need;
    }
    return c->mxb[ith];
}

/* The thread's buffer for n prepared x of `in` inputs. */
static void *mx_buf(const cpu_impl *c, int ith, int n, int in) { return mx_bytes(c, ith, (size_t)n * CPU_GX_BYTES(in)); }

/* y row r of the job gets v[i] for features o..o+nr (stored, or added times yscale[r]) */
static inline void mm_put(const cpu_mm_job *jb, int r, int64_t o, int nr, const float *v) {
    float *y = jb->y + (size_t)(jb->yrow ? jb->yrow[r] : r) * jb->ldy + o;
    if (jb->accum) {
        float s = jb->yscale ? jb->yscale[r] : 1.0f;
        for (int i = 0; i < nr; i++) y[i] += s * v[i];
    } else
        for (int i = 0; i < nr; i++) y[i] = v[i];
}

/* A few rows of x (up to the decode driver's limit for the format, tern__cpu_dec_rows_for) through the ISA's fused
 * GEMV, as the decode driver runs them: every row of x prepared into the thread's buffer (c->xbuf for one row, mxb for
 * several), then each pass of weight rows loaded once for all of them — through the table's gemv_nx where it has one
 * (an expert's slice is otherwise re-read per row), else gemv per row on rows still in L1. When the several-row buffer
 * cannot be had, the rows go one at a time. Each row of x gets the kernel's result on it alone: the same bits at any
 * n, as the decode driver's. Returns 0 when the kernel table has no fused kernel for this format/shape (known at the
 * first row, before anything is written) or n is over the limit (the caller then runs the GEMMs or decodes tiles). */
static int mm_gemv(const cpu_impl *c, int ith, const cpu_mm_job *jb, int64_t o0, int64_t o1) {
    const tern_cpu_kern *k = c->k;
    const tern_tensor *w = jb->w;
    const int in = (int)w->shape[w->ndim - 1], n = jb->n;
    if (!c->fused || !k->gemv_prep || o0 >= o1 || n < 1 || n > tern__cpu_dec_rows_for(c, w)) return 0;
    uint8_t *buf = n > 1 ? mx_buf(c, ith, n, in) : NULL;
    const int nb = buf ? n : 1; /* rows of x per group */
    if (!buf) buf = c->xbuf[ith];
    const int mode = tern__cpu_gx_mode(c, w), nx = nb > 1 && tern__cpu_gemv_nx_on(k);
    cpu_gx gx[TERN_CPU_DEC_NMAX];
    cpu_wrow rows[8], base;
    tern__cpu_wrow_at(w, jb->mat, o0, &base);
    size_t rb = 0, sb = 0;
    const int lin = tern__cpu_wrow_steps(w, &rb, &sb);
    float v[TERN_CPU_DEC_NMAX * 8];
    for (int r0 = 0; r0 < n; r0 += nb) {
        for (int i = 0; i < nb; i++) {
            const float *x = jb->x + (size_t)(jb->xrow ? jb->xrow[r0 + i] : r0 + i) * jb->ldx;
            if (!k->gemv_prep(&base, in, mode, x, buf + (size_t)i * CPU_GX_BYTES(in), &gx[i])) return 0;
            tern__cpu_gemv_pf(w, &gx[i]);
        }
        const int np = tern__cpu_dec_np(k, &gx[0]);
        for (int64_t o = o0; o < o1; o += np) {
            int nr = (int)TERN_MIN((int64_t)np, o1 - o);
            tern__cpu_wrow_pass(w, jb->mat, &base, o - o0, o, nr, lin, rb, sb, rows);
            if (!nx || !k->gemv_nx(gx, nb, rows, nr, v, 8))
                for (int i = 0; i < nb; i++) k->gemv(&gx[i], rows, nr, v + (size_t)i * 8);
            for (int i = 0; i < nb; i++) mm_put(jb, r0 + i, o, nr, v + (size_t)i * 8);
        }
    }
    return 1;
}

/* ---- blocked GEMM (n > 8) ---- */

#define GEMM_KC 256 /* inputs per block: a 32-row strip is 32 KB of f32 (L1), nb·KC of x fits L2 */
#define GEMM_XROWS 512 /* x rows per block: packed once per block of inputs for every strip (512 KB, L2) */
#define GEMM_XMIN 96   /* fewer rows use the xbuf */
_Static_assert(2 * 32 * GEMM_KC <= CPU_RT_MAX * CPU_CH, "tbuf holds a decoded strip and its packed copy");

static int gemm_enabled(void) {
    static _Atomic int on = -1; /* TERN_CPU_GEMM=0: the tile-decode path (before/after benchmarks) */
    return tern__cpu_switch(&on, "TERN_CPU_GEMM", 1);
}

/* x rows [r0, r0+nbk), inputs [t0, t0+len) into blocks of mr rows: xp[b·xw + t·mr + r], xw = len floats a row
 * (f32) or len / 2 dwords (bf16 pairs). */
static void gemm_pack_x(const tern_cpu_kern *k, int bf, const cpu_mm_job *jb, int r0, int nbk, int t0, int len, float *xp) {
    const float *xr[16];
    const int xw = bf ? len / 2 : len;
    for (int b0 = 0; b0 < nbk; b0 += k->gemm_mr) {
        int mr = TERN_MIN(k->gemm_mr, nbk - b0);
        for (int r = 0; r < mr; r++) {
            int rr = r0 + b0 + r;
            xr[r] = jb->x + (size_t)(jb->xrow ? jb->xrow[rr] : rr) * jb->ldx + t0;
        }
        (bf ? k->gemm_bf16_pack_x : k->gemm_pack_x)(xr, mr, len, xp + (size_t)b0 * xw);
    }
}

/* The cache lines of strip rows [s0, s0+ns), inputs [t0, t0+len) (plus their scales and
 * biases) into pf[<= cap]. The microkernel prefetches them, spread over its inner loop, while
 * it works on the previous strip: otherwise every row of every strip starts with a miss. */
#define GEMM_PF_CAP 640
static int gemm_pf_list(const tern_tensor *w, int mat, int64_t s0, int ns, int t0, int len, const uint8_t **pf) {
    cpu_wrow row;
    int np = 0;
    for (int i = 0; i < ns; i++) {
        tern__cpu_wrow_at(w, mat, s0 + i, &row);
        size_t b0, b1;
        if (w->dtype == TERN_DT_Q) {
            b0 = (size_t)t0 * (size_t)w->bits / 8;
            b1 = (size_t)(t0 + len) * (size_t)w->bits / 8;
            size_t g0 = (size_t)(t0 / w->group_size) * tern_dtype_size(w->sdtype);
            if (np + 2 <= GEMM_PF_CAP) { pf[np++] = row.scales + g0; pf[np++] = row.biases + g0; }
        } else {
            size_t es = tern_dtype_size(w->dtype);
            b0 = (size_t)t0 * es;
            b1 = (size_t)(t0 + len) * es;
        }
        for (size_t b = b0 & ~(size_t)63; b < b1 && np < GEMM_PF_CAP; b += 64) pf[np++] = row.data + b;
    }
    return np;
}

/* Returns 0 when the ISA table has no GEMM or the format does not fit its blocking. */
static int mm_gemm(const cpu_impl *c, int ith, const cpu_mm_job *jb, int64_t o0, int64_t o1) {
    const tern_cpu_kern *k = c->k;
    const tern_tensor *w = jb->w;
    const int NR = k->gemm_nr, MR = k->gemm_mr;
    int in = (int)w->shape[w->ndim - 1], n = jb->n, kc = GEMM_KC;
    if (!k->gemm_mk || !gemm_enabled() || NR > 32 || MR > 16) return 0;
    if (w->dtype == TERN_DT_Q) {
        if (w->group_size <= 0 || w->group_size > kc) return 0;
        kc = kc / w->group_size * w->group_size; /* decode slices start on a group */
    }
    /* the bf16 mode: BF16 weights (not precise) in pairs, twice the inputs per block in the same bytes */
    const int bf = c->bf16 && w->dtype == TERN_DT_BF16 && !w->precise && in % 2 == 0 && NR == 32;
    if (bf) kc = 2 * GEMM_KC;
    const int xw = bf ? kc / 2 : kc; /* x floats / dwords a row per block */
    void (*pack)(const cpu_wrow *, int, int, int, float *, int, float *, void (*)(const cpu_wrow *, int, int, float *)) =
        bf ? k->gemm_bf16_pack : k->gemm_pack;
    void (*mk)(int, const float *, int, const float *, float *const *, const float *, int, int, const uint8_t *const *, int) =
        bf ? k->gemm_bf16_mk : k->gemm_mk;
    float *tmp = c->tbuf[ith], *wp = tmp + (size_t)NR * GEMM_KC; /* both within CPU_RT_MAX·CPU_CH */
    /* x of up to GEMM_XROWS rows per block in the thread's grown buffer (the xbuf's ~190 rows if it cannot grow) */
    int nb = n <= GEMM_XROWS ? n : GEMM_XROWS / MR * MR;
    float *xp = nb > GEMM_XMIN ? mx_bytes(c, ith, (size_t)nb * (size_t)xw * sizeof(float)) : NULL;
    if (!xp) xp = c->xbuf[ith], nb = (int)(CPU_GX_BUF / sizeof(float) / (size_t)xw) / MR * MR;
    float *yp[16], ys[16];
    const uint8_t *pf[GEMM_PF_CAP];
    cpu_wrow rows[32];
    for (int r0 = 0; r0 < n; r0 += nb) {
        int nbk = TERN_MIN(nb, n - r0), nblk = (nbk + MR - 1) / MR;
        for (int t0 = 0; t0 < in; t0 += kc) {
            int len = TERN_MIN(kc, in - t0), add = jb->accum || t0 > 0;
            gemm_pack_x(k, bf, jb, r0, nbk, t0, len, xp); /* once per block of rows and inputs */
            for (int64_t s0 = o0; s0 < o1; s0 += NR) {
                int ns = (int)TERN_MIN((int64_t)NR, o1 - s0);
                for (int i = 0; i < ns; i++) tern__cpu_wrow_at(w, jb->mat, s0 + i, &rows[i]);
                pack(rows, ns, t0, len, tmp, kc, wp, k->decode);
                /* prefetch the next strip: the following one, else the first of the next inputs */
                int np = 0, per;
                if (s0 + NR < o1) np = gemm_pf_list(w, jb->mat, s0 + NR, (int)TERN_MIN((int64_t)NR, o1 - s0 - NR), t0, len, pf);
                else if (t0 + kc < in)
                    np = gemm_pf_list(w, jb->mat, o0, (int)TERN_MIN((int64_t)NR, o1 - o0), t0 + kc, TERN_MIN(kc, in - t0 - kc), pf);
                per = TERN_MIN((np + nblk - 1) / nblk, (len + 7) / 8);
                for (int b0 = 0, p0 = 0; b0 < nbk; b0 += MR, p0 += per) {
                    int mr = TERN_MIN(MR, nbk - b0), npf = TERN_MAX(0, TERN_MIN(per, np - p0));
                    for (int r = 0; r < mr; r++) {
                        int rr = r0 + b0 + r;
                        yp[r] = jb->y + (size_t)(jb->yrow ? jb->yrow[rr] : rr) * jb->ldy + s0;
                        ys[r] = jb->yscale ? jb->yscale[rr] : 1.0f;
                    }
                    mk(len, xp + (size_t)b0 * (bf ? len / 2 : len), mr, wp, yp, jb->accum && jb->yscale ? ys : NULL, add,
                       ns, pf + TERN_MIN(p0, np), npf);
                }
            }
        }
    }
    return 1;
}

void tern__cpu_mm(const cpu_impl *c, int ith, const cpu_mm_job *jb, int64_t o0, int64_t o1) {
    const tern_cpu_kern *k = c->k;
    float *tile = c->tbuf[ith];
    const tern_tensor *w = jb->w;
    int in = (int)w->shape[w->ndim - 1];
    int n = jb->n, rt = n <= 8 ? 4 : CPU_RT_MAX;
    int f32 = w->dtype == TERN_DT_F32;
    cpu_wrow rows[CPU_RT_MAX];
    const float *wp[CPU_RT_MAX];
    if (n <= TERN_CPU_DEC_NMAX && mm_gemv(c, ith, jb, o0, o1)) return;
    /* int8 mode: every n the fused GEMV does not take (the same quantization of x either way) */
    if (c->int8 && c->gemm_i8 && tern__cpu_gemm_i8(c, ith, jb, o0, o1)) return;
    if (n > 8 && mm_gemm(c, ith, jb, o0, o1)) return;
    if (n == 1 && k->gemv_q4 && w->dtype == TERN_DT_Q && w->bits == 4 && in <= CPU_RT_MAX * CPU_CH) {
        /* decode fast path: fused 4-bit GEMV, x permuted once into the thread's tile */
        const float *x = jb->x + (size_t)(jb->xrow ? jb->xrow[0] : 0) * jb->ldx;
        float *y = jb->y + (size_t)(jb->yrow ? jb->yrow[0] : 0) * jb->ldy;
        float s = jb->yscale ? jb->yscale[0] : 1.0f;
        cpu_q4_permute(x, in, tile);
        for (int64_t o = o0; o < o1; o++) {
            tern__cpu_wrow_at(w, jb->mat, o, &rows[0]);
            float v = k->gemv_q4(&rows[0], in, tile);
            if (jb->accum) y[o] += s * v;
            else y[o] = v;
        }
        return;
    }
    for (int64_t ot = o0; ot < o1; ot += rt) {
        int nt = (int)TERN_MIN((int64_t)rt, o1 - ot);
        for (int i = 0; i < nt; i++) tern__cpu_wrow_at(w, jb->mat, ot + i, &rows[i]);
        for (int j0 = 0; j0 < in; j0 += CPU_CH) {
            int len = TERN_MIN(CPU_CH, in - j0);
            for (int i = 0; i < nt; i++) {
                if (f32) { wp[i] = (const float *)rows[i].data + j0; continue; }
                k->decode(&rows[i], j0, len, tile + (size_t)i * CPU_CH);
                wp[i] = tile + (size_t)i * CPU_CH;
            }
            for (int r0 = 0; r0 < n; r0 += 4) {
                int nx = TERN_MIN(4, n - r0);
                const float *xp[4];
                float *yp[4];
                for (int j = 0; j < nx; j++) {
                    int r = r0 + j;
                    xp[j] = jb->x + (size_t)(jb->xrow ? jb->xrow[r] : r) * jb->ldx + j0;
                    yp[j] = jb->y + (size_t)(jb->yrow ? jb->yrow[r] : r) * jb->ldy + ot;
                }
                for (int i0 = 0; i0 < nt; i0 += 4) {
                    int nw = TERN_MIN(4, nt - i0);
                    float acc[4][4];
                    k->mk(wp + i0, nw, xp, nx, len, acc);
                    for (int j = 0; j < nx; j++) {
                        float *yr = yp[j] + i0;
                        if (jb->accum) {
                            float s = jb->yscale ? jb->yscale[r0 + j] : 1.0f;
                            for (int i = 0; i < nw; i++) yr[i] += s * acc[i][j];
                        } else if (j0 == 0) {
                            for (int i = 0; i < nw; i++) yr[i] = acc[i][j];
                        } else {
                            for (int i = 0; i < nw; i++) yr[i] += acc[i][j];
                        }
                    }
                }
            }
        }
    }
}

/* ---- matmul / matmul_expert ---- */

typedef struct mm_ctx {
    cpu_impl *c;
    const cpu_mm_job *jb;
    int64_t out;
} mm_ctx;

static void mm_task(void *arg, int ith, int nth) {
    mm_ctx *m = arg;
    int64_t lo, hi;
    tern__cpu_split(m->out, m->jb->n > 8 ? 32 : 16, ith, nth, &lo, &hi); /* 32: whole GEMM strips */
    if (lo < hi) tern__cpu_mm(m->c, ith, m->jb, lo, hi);
}

/* Int8 mode, n > 8: quantize x once for all threads (rows split over the pool). */
typedef struct xq_ctx {
    const float *x;
    cpu_xq *v;
    int n;
} xq_ctx;

static void xq_task(void *arg, int ith, int nth) {
    xq_ctx *a = arg;
    cpu_xq *v = a->v;
    int64_t lo, hi;
    tern__cpu_split(a->n, 1, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        tern__cpu_quant_x_i8(a->x + (size_t)r * v->in, v->in, v->gs, v->q4, (int8_t *)v->q + (size_t)r * v->in,
                             (float *)v->d + (size_t)r * v->ng, (float *)v->rq + (size_t)r * v->ng,
                             (float *)v->sum + (size_t)r * v->ng);
}

static const cpu_xq *quant_x_shared(cpu_impl *c, const float *x, int n, const tern_tensor *w, cpu_xq *v) {
    int in = (int)w->shape[w->ndim - 1], ng = in / w->group_size;
    size_t qb = ((size_t)n * (size_t)in + 63) / 64 * 64, need = qb + 3 * (size_t)n * (size_t)ng * sizeof(float);
    if (need > c->xq8_cap) {
        void *p = tern_aalloc(need);
        if (!p) return NULL; /* the GEMM quantizes per block instead */
        tern_afree(c->xq8);
        c->xq8 = p;
        c->xq8_cap = need;
    }
    float *f = (float *)((uint8_t *)c->xq8 + qb);
    *v = (cpu_xq){.q = c->xq8, .d = f, .rq = f + (size_t)n * ng, .sum = f + 2 * (size_t)n * ng,
                  .in = in, .ng = ng, .gs = w->group_size, .q4 = w->bits == 4};
    xq_ctx a = {x, v, n};
    tern_pool_run(c->pool, xq_task, &a);
    return v;
}

static void run_mm(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int mat) {
    cpu_impl *c = be->impl;
    int64_t in = w->shape[w->ndim - 1], out = w->ndim >= 2 ? w->shape[w->ndim - 2] : 1;
    if (n <= 0) return;
    if (mat == 0 && n <= TERN_CPU_DEC_NMAX && tern__cpu_gemv1(be, y, x, n, w)) return; /* cpu_decode.c (its limit per format) */
    cpu_mm_job jb = {.w = w, .mat = mat, .x = x, .ldx = (size_t)in, .y = y, .ldy = (size_t)out, .n = n};
    cpu_xq xq;
    if (n > 1 && c->int8 && c->gemm_i8 && tern__cpu_gemm_i8_fits(w)) jb.xq = quant_x_shared(c, x, n, w, &xq);
    mm_ctx m = {c, &jb, out};
    /* small products run on the calling thread: waking the pool costs more than they do
     * (each output row is computed by one thread either way, so results are identical) */
    if ((double)n * (double)out * (double)in < 65536.0) mm_task(&m, 0, 1);
    else tern_pool_run(c->pool, mm_task, &m);
}

void tern__cpu_matmul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w) { run_mm(be, y, x, n, w, 0); }
void tern__cpu_matmul_expert(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int e) {
    run_mm(be, y, x, n, w, e);
}

/* ---- matmul_heads (ops.h tern_glm_ops): one matmul per head of a stack, one pool run ---- */

typedef struct heads_ctx {
    cpu_impl *c;
    float *y;
    const float *x;
    size_t ldy, hy, ldx, hx;
    int n, nh, unit;
    const tern_tensor *w;
    int64_t out, per; /* features per head; units per head */
} heads_ctx;

/* The thread's share of the (head, feature unit) range; each head's part is head h's matmul_expert job over those
 * features — the same kernels per output as the per-head loop, so the same bits. */
static void heads_task(void *arg, int ith, int nth) {
    const heads_ctx *m = arg;
    int64_t lo, hi;
    tern__cpu_split((int64_t)m->nh * m->per, 1, ith, nth, &lo, &hi);
    while (lo < hi) {
        int h = (int)(lo / m->per);
        int64_t u1 = TERN_MIN(hi, (int64_t)(h + 1) * m->per);
        int64_t o0 = (lo - (int64_t)h * m->per) * m->unit, o1 = TERN_MIN(m->out, (u1 - (int64_t)h * m->per) * m->unit);
        cpu_mm_job jb = {.w = m->w, .mat = h, .x = m->x + (size_t)h * m->hx, .ldx = m->ldx,
                         .y = m->y + (size_t)h * m->hy, .ldy = m->ldy, .n = m->n};
        if (o0 < o1) tern__cpu_mm(m->c, ith, &jb, o0, o1);
        lo = u1;
    }
}

void tern__cpu_matmul_heads(tern_backend *be, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                            const tern_tensor *w) {
    cpu_impl *c = be->impl;
    if (n <= 0 || nh <= 0 || !w || w->ndim != 3 || nh > w->shape[0]) return;
    const int64_t in = w->shape[2], out = w->shape[1];
    const int unit = n > 8 ? 32 : 16; /* as mm_task: whole GEMM strips */
    heads_ctx m = {.c = c, .y = y, .x = x, .ldy = (size_t)ldy, .hy = (size_t)hy, .ldx = (size_t)ldx, .hx = (size_t)hx,
                   .n = n, .nh = nh, .unit = unit, .w = w, .out = out, .per = (out + unit - 1) / unit};
    if ((double)n * (double)out * (double)in * nh < 65536.0) heads_task(&m, 0, 1);
    else tern_pool_run(c->pool, heads_task, &m);
}

/* ---- routing ---- */

void tern__cpu_route_topk(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                          int mode, const float *pes) {
    (void)be; (void)mode;
    for (int r = 0; r < n; r++) tern__route_topk_row(idx + (size_t)r * k, wts + (size_t)r * k, logits + (size_t)r * E, E, k, pes);
}

/* ---- MoE ---- */

typedef struct moe_ctx {
    cpu_impl *c;
    float *y, *scratch, *wsorted;
    const float *x;
    int H, I, act, n_active;
    const int32_t *active, *start, *cnt, *xrow; /* xrow[p]: token row of sorted assignment p */
    const tern_tensor *gate, *up, *down;
} moe_ctx;

static void moe_gate_up(void *arg, int ith, int nth) {
    moe_ctx *m = arg;
    int64_t lo, hi;
    tern__cpu_split(m->I, 16, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    size_t ld = 2 * (size_t)m->I;
    for (int a = 0; a < m->n_active; a++) {
        int e = m->active[a], p0 = m->start[e], ne = m->cnt[e];
        float *g = m->scratch + (size_t)p0 * ld;
        cpu_mm_job jb = {.w = m->gate, .mat = e, .x = m->x, .ldx = (size_t)m->H, .xrow = m->xrow + p0,
                         .y = g, .ldy = ld, .n = ne};
        tern__cpu_mm(m->c, ith, &jb, lo, hi);
        jb.w = m->up;
        jb.y = g + m->I;
        tern__cpu_mm(m->c, ith, &jb, lo, hi);
        for (int p = 0; p < ne; p++) {
            float *gp = g + (size_t)p * ld, *up = gp + m->I;
            /* the silu_mul / gelu_tanh_mul ops' kernels: the same bits */
            (m->act == TERN_ACT_SILU ? m->c->k->silu_mul : m->c->k->gelu_mul)(gp + lo, gp + lo, up + lo, hi - lo);
        }
    }
}

static void moe_down(void *arg, int ith, int nth) {
    moe_ctx *m = arg;
    int64_t lo, hi;
    tern__cpu_split(m->H, 16, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    size_t ld = 2 * (size_t)m->I;
    for (int a = 0; a < m->n_active; a++) {
        int e = m->active[a], p0 = m->start[e];
        cpu_mm_job jb = {.w = m->down, .mat = e, .x = m->scratch + (size_t)p0 * ld, .ldx = ld,
                         .y = m->y, .ldy = (size_t)m->H, .yrow = m->xrow + p0, .yscale = m->wsorted + p0,
                         .accum = 1, .n = m->cnt[e]};
        tern__cpu_mm(m->c, ith, &jb, lo, hi);
    }
}

void tern__cpu_moe_mlp(tern_backend *be, float *y, const float *x, int n, int H, const int32_t *idx, const float *wts,
                       int k, const tern_tensor *gate, const tern_tensor *up, const tern_tensor *down, int act,
                       float *scratch) {
    cpu_impl *c = be->impl;
    int E = (int)gate->shape[0], I = (int)gate->shape[1];
    size_t na = (size_t)n * (size_t)k;
    /* layout of moe_i: cnt[E] start[E] fill[E] active[E] xrow[na] wsorted[na] (floats as bits) */
    size_t need = 4 * (size_t)E + 2 * na;
    memset(y, 0, (size_t)n * H * sizeof *y);
    if (need > c->moe_cap) {
        int32_t *p = tern_aalloc(need * sizeof *p);
        if (!p) { for (size_t i = 0; i < (size_t)n * H; i++) y[i] = NAN; return; }
        tern_afree(c->moe_i);
        c->moe_i = p;
        c->moe_cap = need;
    }
    int32_t *cnt = c->moe_i, *start = cnt + E, *fill = start + E, *active = fill + E, *xrow = active + E;
    float *wsorted = (float *)(xrow + na);
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (size_t a = 0; a < na; a++)
        if (idx[a] >= 0 && idx[a] < E) cnt[idx[a]]++;
    int n_active = 0, acc = 0;
    for (int e = 0; e < E; e++) {
        start[e] = acc;
        fill[e] = 0;
        acc += cnt[e];
        if (cnt[e]) active[n_active++] = e;
    }
    for (size_t a = 0; a < na; a++) {
        int e = idx[a];
        if (e < 0 || e >= E) continue;
        int p = start[e] + fill[e]++;
        xrow[p] = (int32_t)(a / (size_t)k);
        wsorted[p] = wts[a];
    }
    moe_ctx m = {c, y, scratch, wsorted, x, H, I, act, n_active, active, start, cnt, xrow, gate, up, down};
    tern_pool_run(c->pool, moe_gate_up, &m);
    tern_pool_run(c->pool, moe_down, &m);
}
