/*
 * cpu_decode.c — the decode matmul driver of the fast CPU backend: one pool run per call for
 * up to 3 matrices that share x, with work stealing between the threads, for 1 to 16 rows of x
 * (one sequence's token, or a step of several sequences, a short prompt, a speculative verify).
 *
 * Decode streams every weight byte once per step, so what matters is that every core keeps
 * its memory stream busy from the first to the last byte of each call. Per call:
 *   - each row of x is prepared once, on the calling thread (gemv_prep into its buffer), and
 *     shared read-only by all threads (the fused kernels only read the cpu_gx); each pass of
 *     weight rows is run for every x before the next (read from memory once, then from L1);
 *   - the rows of the k matrices are cut into chunks of CHUNK rows, numbered across the
 *     matrices in order; thread i owns a contiguous range of chunks and walks it forward (one
 *     sequential stream: the kernels' rows-ahead prefetch lands in the rows it reads next);
 *   - within a chunk the kernel gets the table's gemv_pass rows per call (kern.h): 1 for Q8
 *     int8 (one stream per thread rather than 4 a row apart; the BF16 and Q4 int8 kernels read
 *     their rows one after another inside a call), 4 for the others (NOTES (ac));
 *     a thread that runs out takes chunks from the END of the range with the most left (a
 *     compare-and-swap on a (front, back) pair per thread), so a thread slowed by another
 *     process no longer holds the whole step back;
 *   - the epilogue is fused: y = v, y += v (matmul_add: the residual) or y = act(g)·u (gate and
 *     up chunks of the same rows; matmul_glu), so no elementwise pass follows.
 * Every output row is computed by the same kernel call sequence whichever thread takes it, and
 * the epilogues use the formulas of the separate ops (cpu_backend.c ew_task): results are
 * bitwise those of matmul + add / silu_mul / gelu_tanh_mul (test_kern_decode).
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 64 /* rows per claim (64 KB of q4 rows at in = 2048; a multiple of the kernels' 4 and 8). Each claim is a
                  * locked compare-and-swap (and a split GLU chunk a locked add), which waits for the core's earlier
                  * memory operations and holds its later loads back: at 16 rows (16 KB of q4) the Q4 int8 decode
                  * streamed ~10-15 % slower in the high-bandwidth regime (bench/NOTES.md (bg)) */
#define GLU_PAD 16 /* the split GLU's per-chunk counters a cache line apart: gate's and up's threads meet on them */
#define DEC_NMAX TERN_CPU_DEC_NMAX /* most rows of x one call takes (each prepared once; every weight row read once for all) */

enum { EP_STORE, EP_ADD, EP_SILU, EP_GELU };

/* The q|k|v op's rope and cache writes inside its run (tern__cpu_norm_qkv_rope_kv): the thread that stores
 * the last rows of a q head ropes it; of a k head ropes it; the one that completes a KV head's k (roped) and v
 * writes both into the cache. Counters: rows stored per head (q heads, then k, then v heads), then per KV
 * head the halves done (2: k roped and v stored). */
#define ROPE_MAX_HEADS 256
typedef struct dec_rope {
    int d, nh, nkv;
    int32_t pos;
    const float *inv_freq;
    float mscale;
    float cs[256], sn[256];
    float *kdst, *vdst;        /* the cache slots of this row's position (NULL: not resident, nothing written) */
    _Atomic int rows[3 * ROPE_MAX_HEADS];
    _Atomic int kv[ROPE_MAX_HEADS];
} dec_rope;

typedef struct dec_job {
    cpu_impl *c;
    dec_rope *rk;              /* NULL, or the q|k|v op's rope and cache writes */
    int k, ep, nm;             /* matrices; chunk spaces (GLU: gate and up share one, nm = 1, or split: nm = 2) */
    int n;                     /* rows of x (1..DEC_NMAX): y[i] is [n, out_i] */
    const tern_tensor *w[3];
    float *y[3];               /* split GLU: gate's raw outputs into y[0], up's into y[1] (scratch, [n, out]) */
    _Atomic int *halves;       /* split GLU: per chunk, how many of its gate and up halves are stored */
    int64_t c0[4];             /* first chunk of matrix i; c0[k] = total */
    cpu_gx gx[DEC_NMAX];       /* each row of x prepared once (on the caller), shared read-only */
} dec_job;

/* (front, back) chunk indices of each thread's range, packed front << 32 | back. */
static inline uint64_t fb_pack(int64_t f, int64_t b) { return (uint64_t)f << 32 | (uint64_t)b; }

/* Claim one chunk: the owner takes the front of its own range, a thief the back of the range
 * with the most chunks left. Returns the chunk index, or -1 when every range is empty. */
static int64_t claim(cpu_impl *c, int ith, int nth) {
    _Atomic uint64_t *own = &c->dec_part[ith].fb;
    uint64_t v = atomic_load_explicit(own, memory_order_relaxed);
    for (;;) {
        int64_t f = (int64_t)(v >> 32), b = (int64_t)(v & 0xffffffffu);
        if (f >= b) break;
        if (atomic_compare_exchange_weak(own, &v, fb_pack(f + 1, b))) return f;
    }
    for (;;) {
        int best = -1;
        int64_t most = 0;
        for (int t = 0; t < nth; t++) {
            if (t == ith) continue;
            uint64_t u = atomic_load_explicit(&c->dec_part[t].fb, memory_order_relaxed);
            int64_t left = (int64_t)(u & 0xffffffffu) - (int64_t)(u >> 32);
            if (left > most) { most = left; best = t; }
        }
        if (best < 0) return -1;
        _Atomic uint64_t *vp = &c->dec_part[best].fb;
        uint64_t u = atomic_load(vp);
        int64_t f = (int64_t)(u >> 32), b = (int64_t)(u & 0xffffffffu);
        if (f < b && atomic_compare_exchange_strong(vp, &u, fb_pack(f, b - 1))) return b - 1;
    }
}

/* Rows per kernel call: the table's gemv_pass for the kind (0: 4), or what tern__cpu_dec_nr_set /
 * TERN_CPU_DEC_NR=N ask (in-process and before/after A/B; up to the table's gemv_nr). */
static _Atomic int dec_nr = -1;
void tern__cpu_dec_nr_set(int nr) { dec_nr = nr < 0 ? -1 : nr; }

static int dec_np(const tern_cpu_kern *k, const cpu_gx *gx) {
    int v = dec_nr;
    if (v < 0) {
        const char *e = getenv("TERN_CPU_DEC_NR");
        v = e && *e ? atoi(e) : 0;
        dec_nr = v < 0 ? 0 : v;
    }
    int most = k->gemv_nr > 0 && k->gemv_nr <= 8 ? k->gemv_nr : 4;
    if (v > 0 && v <= most) return v;
    v = gx->kind > 0 && gx->kind < (int)sizeof k->gemv_pass ? k->gemv_pass[gx->kind] : 0;
    return v > 0 && v <= most ? v : 4;
}
int tern__cpu_dec_np(const tern_cpu_kern *k, const cpu_gx *gx) { return dec_np(k, gx); }

/* Several x through the table's gemv_nx (each weight row unpacked once for all x; the same bits as gemv per x), or
 * with TERN_CPU_GEMV_NX=0 / tern__cpu_gemv_nx_set(0) gemv once per x (before/after A/B). */
static _Atomic int gemv_nx_on = -1;
void tern__cpu_gemv_nx_set(int on) { gemv_nx_on = on < 0 ? -1 : on != 0; }
static int nx_enabled(const tern_cpu_kern *k) { return k->gemv_nx && tern__cpu_switch(&gemv_nx_on, "TERN_CPU_GEMV_NX", 1); }
int tern__cpu_gemv_nx_on(const tern_cpu_kern *k) { return nx_enabled(k); }

/* Rows [o0, o1) of matrix w through the fused kernel for each of the n prepared x, dec_np weight rows per call and
 * every x on them before the next pass (the weight rows come from memory once, then from L1); v[r·CHUNK + i] = row
 * o0 + i for x r. A row's result is the kernel's on that x alone: the same bits for any n. */
static void rows_gemv(const tern_cpu_kern *k, const cpu_gx *gx, int n, const tern_tensor *w, int64_t o0, int64_t o1,
                      float *v) {
    enum { MAXR = 16 };
    int np = dec_np(k, gx);
    cpu_wrow rows[MAXR], base;
    tern__cpu_wrow_at(w, 0, o0, &base);
    size_t rb = 0, sb = 0;
    const int lin = tern__cpu_wrow_steps(w, &rb, &sb);
    const int nx = n > 1 && nx_enabled(k);
    const int np1 = np; /* gemv's rows per call */
    if (nx && gx->kind > 0 && gx->kind <= CPU_GX_BF16R && k->gemv_nx_pass[gx->kind])
        np = TERN_MIN(k->gemv_nx_pass[gx->kind], MAXR);
    for (int64_t o = o0; o < o1; o += np) {
        int nr = (int)TERN_MIN((int64_t)np, o1 - o);
        tern__cpu_wrow_pass(w, 0, &base, o - o0, o, nr, lin, rb, sb, rows);
        if (!nx || !k->gemv_nx(gx, n, rows, nr, v + (o - o0), CHUNK))
            for (int i = 0; i < nr; i += np1)
                for (int r = 0; r < n; r++)
                    k->gemv(&gx[r], rows + i, TERN_MIN(np1, nr - i), v + (size_t)r * CHUNK + (o - o0) + i);
    }
}

/* n more rows of head h of matrix i were stored: the thread that completes the head ropes it (q, k) and, once k and v
 * of a KV head are both complete, writes them to the cache. */
static void head_rows_done(dec_rope *rk, float *const *y, int i, int h, int n) {
    const int d = rk->d;
    const int base = i == 0 ? 0 : i == 1 ? rk->nh : rk->nh + rk->nkv;
    if (atomic_fetch_add(&rk->rows[base + h], n) + n < d) return;
    if (i < 2) tern__cpu_rope_head(y[i] + (size_t)h * d, d, rk->pos, rk->inv_freq, rk->cs, rk->sn, rk->mscale);
    if (i == 0 || atomic_fetch_add(&rk->kv[h], 1) + 1 < 2) return;
    if (rk->kdst) { /* = kv_write: the whole row's heads are contiguous in a slot */
        memcpy(rk->kdst + (size_t)h * d, y[1] + (size_t)h * d, (size_t)d * sizeof(float));
        memcpy(rk->vdst + (size_t)h * d, y[2] + (size_t)h * d, (size_t)d * sizeof(float));
    }
}

/* rows [o0, o0 + n) of matrix i were stored: each head they reach gets its share (a chunk may span heads, a head
 * chunks) */
static void rope_rows_done(dec_rope *rk, float *const *y, int i, int64_t o0, int n) {
    for (int64_t o = o0, end = o0 + n; o < end;) {
        const int h = (int)(o / rk->d);
        const int64_t e = TERN_MIN((int64_t)(h + 1) * rk->d, end);
        head_rows_done(rk, y, i, h, (int)(e - o));
        o = e;
    }
}

static void dec_task(void *arg, int ith, int nth) {
    dec_job *j = arg;
    const tern_cpu_kern *k = j->c->k;
    const int nx = j->n;
    cpu_gx gx[DEC_NMAX]; /* private copies: the prefetch distances are set per matrix */
    memcpy(gx, j->gx, (size_t)nx * sizeof gx[0]);
    float g[DEC_NMAX * CHUNK], u[DEC_NMAX * CHUNK];
    const tern_tensor *pf_w = NULL; /* the matrix gx's prefetch distances are set for */
    int64_t ch;
    if (tern__cpu_prof) j->c->dec_part[ith].t0 = tern_time_s();
    while ((ch = claim(j->c, ith, nth)) >= 0) {
        int i = 0;
        while (i + 1 < j->nm && ch >= j->c0[i + 1]) i++;
        const int64_t lc = ch - j->c0[i]; /* the chunk within its matrix */
        const tern_tensor *w = j->w[i];
        int64_t out = w->shape[w->ndim - 2], o0 = lc * CHUNK, o1 = TERN_MIN(out, o0 + CHUNK);
        if (w != pf_w) { /* the prefetch distances once per matrix, not per chunk (perf: ~0.7 % of a 16-row step) */
            for (int r = 0; r < nx; r++) tern__cpu_gemv_pf(w, &gx[r]);
            pf_w = w;
        }
        rows_gemv(k, gx, nx, w, o0, o1, g);
        const int n = (int)(o1 - o0);
        void (*act)(float *, const float *, const float *, int64_t) = j->ep == EP_SILU ? k->silu_mul : k->gelu_mul;
        if (j->halves) { /* split GLU: store this half; the thread that stores the second applies the act */
            for (int r = 0; r < nx; r++) memcpy(j->y[i] + (size_t)r * out + o0, g + r * CHUNK, (size_t)n * sizeof *g);
            if (atomic_fetch_add(&j->halves[lc * GLU_PAD], 1) == 1)
                for (int r = 0; r < nx; r++) {
                    float *yr = j->y[0] + (size_t)r * out + o0;
                    act(yr, yr, j->y[1] + (size_t)r * out + o0, n);
                }
            continue;
        }
        if (j->ep == EP_SILU || j->ep == EP_GELU) rows_gemv(k, gx, nx, j->w[1], o0, o1, u);
        for (int r = 0; r < nx; r++) {
            float *y = j->y[i] + (size_t)r * out + o0, *gr = g + r * CHUNK;
            switch (j->ep) {
            case EP_STORE:
                memcpy(y, gr, (size_t)n * sizeof *y);
                if (j->rk) rope_rows_done(j->rk, j->y, i, o0, n); /* n = 1 only */
                break;
            case EP_ADD: for (int o = 0; o < n; o++) y[o] = y[o] + gr[o]; break; /* = add(y, y, o) */
            default: act(y, gr, u + r * CHUNK, n); break; /* the ops' own kernels: the same bits */
            }
        }
    }
    if (tern__cpu_prof) j->c->dec_part[ith].t1 = tern_time_s();
}

/* TERN_CPU_PROFILE=1: one call's split (x prep, the workers' start after the run began, the spread of the
 * threads' finishes, the caller's wait after the last) to cpu_prof.c */
static void prof_call(const cpu_impl *c, int nth, double t0, double t1) {
    const double t2 = tern_time_s();
    double wake = 0, lo = c->dec_part[0].t1, hi = lo;
    for (int t = 1; t < nth; t++) {
        wake += c->dec_part[t].t0 - t1;
        lo = TERN_MIN(lo, c->dec_part[t].t1);
        hi = TERN_MAX(hi, c->dec_part[t].t1);
    }
    tern__cpu_prof_dec(t1 - t0, nth > 1 ? wake / (nth - 1) : 0, hi - lo, t2 - hi, nth);
}

/* TERN_CPU_DEC=0: this driver off (the per-matrix path of cpu_matmul.c and the separate ops
 * run instead; before/after benchmarks); tern__cpu_dec_set switches it in-process (A/B). */
static _Atomic int dec_on = -1;
static int dec_enabled(void) {
    return tern__cpu_switch(&dec_on, "TERN_CPU_DEC", 1);
}
void tern__cpu_dec_set(int on) { dec_on = on < 0 ? -1 : on != 0; }

/* matmul_glu's chunk space. Fused (0): per chunk the gate rows, then the same up rows — each thread alternates
 * between two matrices every CHUNK rows (six streams with Q's scales and biases). Split (1, default): gate's
 * chunks, then up's, one range, so each thread streams one matrix at a time as a plain matmul does; the halves
 * meet in a per-chunk counter and whoever stores the second applies the activation (the same kernels on the same
 * values: the same bits). TERN_CPU_GLU_SPLIT=0 / tern__cpu_glu_split_set(0): the fused order (A/B). */
static _Atomic int glu_split = -1;
void tern__cpu_glu_split_set(int on) { glu_split = on < 0 ? -1 : on != 0; }

/* The split GLU's scratch for `out` rows and nx rows of x: up's outputs and the chunks' counters (zeroed); NULL when
 * out of memory. */
static float *glu_scratch(cpu_impl *c, int64_t out, int nx, _Atomic int **halves) {
    const size_t fb = ((size_t)out * (size_t)nx * sizeof(float) + 63) & ~(size_t)63, nch = (size_t)((out + CHUNK - 1) / CHUNK);
    const size_t need = fb + nch * GLU_PAD * sizeof(_Atomic int);
    if (need > c->glu_cap) {
        void *p = tern_aalloc(need);
        if (!p) return NULL;
        tern_afree(c->glu);
        c->glu = p;
        c->glu_cap = need;
    }
    *halves = (_Atomic int *)((uint8_t *)c->glu + fb);
    for (size_t i = 0; i < nch; i++) atomic_init(&(*halves)[i * GLU_PAD], 0);
    return c->glu;
}

/* Most rows of x a call on weight w takes; more go to the batched matmul path (cpu_matmul.c). Up to it, a step of
 * several sequences reads each weight row once and gets for every row of x the same bits as that row alone; the cost
 * is the kernel's arithmetic once per row of x, which the blocked GEMMs amortize better as rows grow. Measured
 * (bench/NOTES.md (be), llama3-1b, decode tok/s of 2-16 sequences): Q weights in the int8 mode (the VNNI GEMM) 8
 * (Q8: 6 — at 8 sequences the GEMM won 73-77 to 62-63 tok/s, at 4 the driver 54-56 to 33-36; Q4 with the several-x
 * kernel 16 — at 16 sequences the driver 125-128 to the GEMM's 116-126, NOTES (bf)), the others (the
 * f32 GEMM: BF16, exact Q; the bf16 mode's vdpbf16ps GEMM) 16.
 * TERN_CPU_DEC_ROWS=N (1..DEC_NMAX) or tern__cpu_dec_rows_set sets one limit for all. */
static _Atomic int dec_rows = -1; /* -1: unread; 0: the per-format defaults */
void tern__cpu_dec_rows_set(int n) { dec_rows = n < 0 ? -1 : n > DEC_NMAX ? DEC_NMAX : n; }
int tern__cpu_dec_rows_for(const cpu_impl *c, const tern_tensor *w) {
    int v = dec_rows;
    if (v < 0) {
        const char *e = getenv("TERN_CPU_DEC_ROWS");
        v = e && *e ? atoi(e) : 0;
        dec_rows = v = v < 0 ? 0 : v > DEC_NMAX ? DEC_NMAX : v;
    }
    if (v > 0) return v;
    if (c->int8 && c->gemm_i8 && w->dtype == TERN_DT_Q) return w->bits == 8 ? 6 : nx_enabled(c->k) ? 16 : 8;
    return 16; /* the bf16 mode too: its vdpbf16ps GEMV (12 / 16 sequences 76 / 85-89 tok/s, its GEMM 48-51 / 60) */
}

/* Each row of x but the first prepared into its own buffer (the first takes the caller's xbuf[0]): DEC_NMAX - 1
 * buffers of CPU_GX_BUF (~200 KB) made on the first call with several rows; NULL when out of memory. */
static void *xrows_buf(cpu_impl *c) {
    if (!c->xrows) c->xrows = tern_aalloc((size_t)(DEC_NMAX - 1) * CPU_GX_BUF);
    return c->xrows;
}

/* Whether one prepared x serves every matrix: same input length, format and grouping. */
static int same_x(const tern_tensor *a, const tern_tensor *b) {
    if (a->dtype != b->dtype || a->precise != b->precise || a->shape[a->ndim - 1] != b->shape[b->ndim - 1]) return 0;
    return a->dtype != TERN_DT_Q || (a->bits == b->bits && a->group_size == b->group_size);
}

/* Runs the job (k matrices, epilogue ep) when the fused GEMV takes the format; 0 otherwise
 * (nothing written). */
static int dec_run(tern_backend *be, int kk, int ep, const tern_tensor *const *w, float *const *y, const float *x,
                   int nx, dec_rope *rk) {
    cpu_impl *c = be->impl;
    const tern_cpu_kern *k = c->k;
    if (!c->fused || !k->gemv_prep || !c->dec_part || kk < 1 || kk > 3 || !dec_enabled()) return 0;
    if (nx < 1 || nx > tern__cpu_dec_rows_for(c, w[0]) || (nx > 1 && (rk || !xrows_buf(c)))) return 0;
    for (int i = 0; i < kk; i++) {
        if (w[i]->ndim < 2 || w[i]->mat_map || !same_x(w[0], w[i])) return 0;
        if (w[i]->shape[w[i]->ndim - 2] >= (int64_t)CHUNK << 30) return 0; /* chunk indices fit 32 bits */
    }
    if ((ep == EP_SILU || ep == EP_GELU) && w[0]->shape[w[0]->ndim - 2] != w[1]->shape[w[1]->ndim - 2]) return 0;
    int in = (int)w[0]->shape[w[0]->ndim - 1];
    const double tp0 = tern__cpu_prof ? tern_time_s() : 0;
    const int glu = ep == EP_SILU || ep == EP_GELU;
    dec_job j = {.c = c, .rk = rk, .k = kk, .ep = ep, .nm = glu ? 1 : kk, .n = nx};
    cpu_wrow r0;
    tern__cpu_wrow_at(w[0], 0, 0, &r0);
    const int mode = tern__cpu_gx_mode(c, w[0]);
    for (int r = 0; r < nx; r++) {
        void *buf = r ? (uint8_t *)c->xrows + (size_t)(r - 1) * CPU_GX_BUF : c->xbuf[0];
        if (!k->gemv_prep(&r0, in, mode, x + (size_t)r * (size_t)in, buf, &j.gx[r])) return 0;
    }
    for (int i = 0; i < kk; i++) { j.w[i] = w[i]; j.y[i] = y[i]; }
    if (glu && tern__cpu_switch(&glu_split, "TERN_CPU_GLU_SPLIT", 1) &&
        (j.y[1] = glu_scratch(c, w[0]->shape[w[0]->ndim - 2], nx, &j.halves)) != NULL)
        j.nm = 2;
    int nm = j.nm;
    j.c0[0] = 0;
    for (int i = 0; i < nm; i++) j.c0[i + 1] = j.c0[i] + (w[i]->shape[w[i]->ndim - 2] + CHUNK - 1) / CHUNK;
    int64_t total = j.c0[nm];
    double work = (double)total * CHUNK * in * (nm < kk ? 2 : 1) * nx;
    int nth = work < 65536.0 ? 1 : c->nth; /* as run_mm: waking the pool costs more than that */
    for (int t = 0; t < c->nth; t++) {
        int64_t lo = total * t / nth, hi = total * (t + 1) / nth;
        if (t >= nth) lo = hi = 0;
        atomic_store(&c->dec_part[t].fb, fb_pack(lo, hi));
    }
    const double tp1 = tern__cpu_prof ? tern_time_s() : 0;
    if (nth == 1) dec_task(&j, 0, 1);
    else tern_pool_run(c->pool, dec_task, &j);
    if (tern__cpu_prof) prof_call(c, nth, tp0, tp1);
    return 1;
}

int tern__cpu_gemv1(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w) {
    return dec_run(be, 1, EP_STORE, &w, &y, x, n, NULL);
}

int tern__cpu_matmul_n(tern_backend *be, int k, float *const *y, const float *x, int n, const tern_tensor *const *w) {
    return dec_run(be, k, EP_STORE, w, y, x, n, NULL);
}

int tern__cpu_matmul_glu(tern_backend *be, float *y, const float *x, int n, const tern_tensor *gate,
                         const tern_tensor *up, int act) {
    if (act != TERN_ACT_SILU && act != TERN_ACT_GELU_TANH) return 0;
    const tern_tensor *w[2] = {gate, up};
    float *ys[2] = {y, NULL};
    return dec_run(be, 2, act == TERN_ACT_SILU ? EP_SILU : EP_GELU, w, ys, x, n, NULL);
}

int tern__cpu_matmul_add(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w) {
    return dec_run(be, 1, EP_ADD, &w, &y, x, n, NULL);
}

/* ops.h norm_qkv_rope_kv for one row: rmsnorm on the caller (the backend's own op), then the q|k|v run with the
 * rope and the cache writes of each head done by the thread that completes it (rope_rows_done), so no single-thread
 * pass follows the run. Bitwise rmsnorm + matmul_n + rope + rope + kv_write: the same kernels and chunks, the
 * same rope code (cpu_impl.h), the same bytes into the same slots. Declines (0, nothing rotated or written) what
 * it does not take: several rows, compressed or latent pages, odd heads or heads wider than 512, shapes that do
 * not match the heads, formats the driver declines; TERN_CPU_QKV_ROPE=0 (or tern__cpu_qkv_rope_set(0)) declines
 * everything (the separate ops run: before/after). */
static _Atomic int qkv_rope_on = -1;
void tern__cpu_qkv_rope_set(int on) { qkv_rope_on = on < 0 ? -1 : on != 0; }

int tern__cpu_norm_qkv_rope_kv(tern_backend *be, float *xn, const float *x, const float *nw, float eps, float *q,
                               float *k, float *v, const tern_tensor *const *w, const tern_kv_layer *kv,
                               const tern_rows *rows, int nh, const float *inv_freq, float mscale) {
    const int on = tern__cpu_switch(&qkv_rope_on, "TERN_CPU_QKV_ROPE", 1);
    const int d = kv->head_dim, nkv = kv->n_head_kv;
    if (!on || rows->n != 1 || kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32 || kv->latent) return 0;
    if (d < 2 || d > 512 || d % 2 || nh < 1 || nh > ROPE_MAX_HEADS || nkv < 1 || nkv > ROPE_MAX_HEADS) return 0;
    for (int i = 0; i < 3; i++)
        if (w[i]->ndim != 2 || w[i]->shape[0] != (int64_t)(i ? nkv : nh) * d) return 0;
    dec_rope rk = {.d = d, .nh = nh, .nkv = nkv, .pos = rows->pos[0], .inv_freq = inv_freq, .mscale = mscale};
    for (int i = 0; i < nh + 2 * nkv; i++) atomic_init(&rk.rows[i], 0);
    for (int i = 0; i < nkv; i++) atomic_init(&rk.kv[i], 0);
    tern__cpu_rope_table(rk.pos, inv_freq, d, rk.cs, rk.sn);
    const int s = rows->slot[0], p = rows->pos[0]; /* as cpu_kv_write */
    if (s >= 0 && p >= 0 && p / kv->block_size < kv->max_blocks) {
        const int32_t blk = kv->block_table[(size_t)s * kv->max_blocks + p / kv->block_size];
        if (blk >= 0) {
            const size_t off = ((size_t)blk * kv->block_size + (size_t)(p % kv->block_size)) * (size_t)nkv * (size_t)d;
            rk.kdst = (float *)kv->k + off;
            rk.vdst = (float *)kv->v + off;
        }
    }
    be->vt->rmsnorm(be, xn, x, 1, (int)w[0]->shape[1], nw, eps);
    float *const ys[3] = {q, k, v};
    return dec_run(be, 3, EP_STORE, w, ys, xn, 1, &rk);
}
