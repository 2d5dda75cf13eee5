/*
 * cpu_impl.h — state and internal entry points shared by the fast CPU backend's files
 * (cpu_backend.c: vtable + simple ops, cpu_matmul.c: matmul/MoE, cpu_attn.c: attention).
 *
 * All scratch is allocated at open (per-thread decode tiles) or grown on first use of a
 * larger shape (MoE routing lists), never per call in steady state.
 */
#ifndef TERN_CPU_IMPL_H
#define TERN_CPU_IMPL_H

#include "backend/cpu/cpu.h"
#include "backend/cpu/kern.h"
#include "base/pool.h"

#define CPU_CH 512     /* inputs per decoded slice: multiple of every group size, fits L1/L2 */
#define CPU_RT_MAX 32  /* weight rows decoded per tile for batched (prefill) matmuls */

/* One thread's range of decode chunks, (front << 32 | back), on its own cache line (cpu_decode.c). */
typedef struct cpu_dec_part {
    _Atomic uint64_t fb;
    double t0, t1;             /* TERN_CPU_PROFILE=1: when this thread's share of the run began and ended */
    char pad[40];
} cpu_dec_part;

typedef struct cpu_impl {
    tern_pool *pool;
    int nth;
    const tern_cpu_kern *k;
    float **tbuf;             /* [nth] decode tiles, CPU_RT_MAX * CPU_CH floats each */
    void **xbuf;              /* [nth] x prepared for the fused GEMV, CPU_GX_BUF bytes each */
    int fused;                /* 0: fused GEMV off (TERN_CPU_GEMV=0; benchmarks the decode path) */
    int int8;                 /* int8 mode for Q8/Q4 matmuls (--compute int8, TERN_CPU_INT8=1) */
    int gemm_i8;              /* the int8 prefill GEMM can run: AVX-512 table + VNNI */
    int bf16;                 /* the bf16 compute mode's GEMM runs (--compute bf16, AVX512-BF16; TERN_CPU_GEMM_BF16=0 off):
                                 BF16 weights (not tern_tensor.precise) times x rounded to bf16 for n > 8 rows */
    size_t par_min;           /* elementwise ops split over the pool from this many elements */
    int32_t *moe_i;           /* MoE routing lists (grown on demand) */
    size_t moe_cap;           /* capacity of moe_i in int32 */
    void *glm;                /* GLM-5 op scratch (glm_state.h), made on first use */
    void *xq8;                /* int8 mode: x quantized once per matmul (grown on demand) */
    size_t xq8_cap;           /* bytes */
    cpu_dec_part *dec_part;   /* [nth] work-stealing ranges of the decode driver (cpu_decode.c) */
    void *xrows;              /* the driver's prepared x of rows 1.. of a several-row call (made on first use) */
    void **mxb;               /* [nth] several x prepared for mm_gemv's gemv_nx (a thread's own; grown on demand) */
    size_t *mxcap;            /* [nth] bytes of mxb[i] */
    void *glu;                /* the driver's matmul_glu scratch: up's outputs, then per chunk its halves done (grown on demand) */
    size_t glu_cap;           /* bytes */
} cpu_impl;

/* x quantized for the int8 GEMM once per matmul (all rows, shared by the threads): row r's
 * codes at q + r·in (Q4: per 32 inputs the even ones, then the odd ones), its per-group x
 * scale, centring term and Σx at d/rq/sum + r·ng. Valid for weights of group size gs and
 * order q4 only. */
typedef struct cpu_xq {
    const int8_t *q;
    const float *d, *rq, *sum;
    int in, ng, gs, q4;
} cpu_xq;

/* A matmul over rows of x against one matrix of w, for output features [o0, o1).
 * x row r is x + (xrow ? xrow[r] : r) * ldx; the result for (r, o) goes to
 * y[(yrow ? yrow[r] : r) * ldy + o], stored (accum 0) or added times yscale[r] (accum 1). */
typedef struct cpu_mm_job {
    const tern_tensor *w;
    int mat;
    const float *x;
    size_t ldx;
    const int32_t *xrow;
    float *y;
    size_t ldy;
    const int32_t *yrow;
    const float *yscale;
    int accum;
    int n;
    const cpu_xq *xq;         /* int8 mode: x already quantized (NULL: per block, per thread) */
} cpu_mm_job;

void tern__cpu_mm(const cpu_impl *c, int ith, const cpu_mm_job *jb, int64_t o0, int64_t o1);
/* Row o of matrix `mat` of t, located (cpu_matmul.c). */
void tern__cpu_wrow_at(const tern_tensor *t, int mat, int64_t o, cpu_wrow *r);
/* Whether rows of t's matrices can be stepped to (all but block-scaled FP8, whose scale row changes every blk_rows
 * rows): 1, and the byte steps in data (rb) and scales / biases (sb, 0 for unquantized); else 0 (cpu_matmul.c). */
int tern__cpu_wrow_steps(const tern_tensor *t, size_t *rb, size_t *sb);
/* rows[0..nr) = rows o..o+nr of matrix mat: row o0 (located once, in *base) stepped d = o − o0 rows on where
 * tern__cpu_wrow_steps allows it (lin), else each row located (cpu_matmul.c). */
void tern__cpu_wrow_pass(const tern_tensor *w, int mat, const cpu_wrow *base, int64_t d, int64_t o, int nr, int lin,
                         size_t rb, size_t sb, cpu_wrow *rows);
/* The int8 mode's prefill GEMM (gemm_i8_avx512.c; only when c->gemm_i8): features [o0, o1)
 * of a job with Q8/Q4 weights; returns 0 (nothing done) for other formats/group sizes. */
int tern__cpu_gemm_i8(const cpu_impl *c, int ith, const cpu_mm_job *jb, int64_t o0, int64_t o1);
/* Whether tern__cpu_gemm_i8 takes weight w; and one row of x (in inputs) quantized for it,
 * into q[in], d/rq/sum[in/gs] (the cpu_xq layout). */
int tern__cpu_gemm_i8_fits(const tern_tensor *w);
void tern__cpu_quant_x_i8(const float *x, int in, int gs, int q4, int8_t *q, float *d, float *rq, float *sum);
/* Even split of [0, total) over nth threads in units of `unit`. */
void tern__cpu_split(int64_t total, int unit, int ith, int nth, int64_t *lo, int64_t *hi);

/* Decode driver (cpu_decode.c): one pool run for up to 3 matrices sharing x (1..16 rows), fused
 * epilogue, work stealing. Each returns 0 (nothing done) when the fused GEMV does not take the
 * format or n is over its limit (tern__cpu_dec_rows_for); the ops.h fused-op contract: results
 * bitwise those of the separate ops, and each row of x bitwise that row alone. */
int tern__cpu_gemv1(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w);
#define TERN_CPU_DEC_NMAX 16          /* most rows of x the driver ever takes (its limit per format: cpu_decode.c) */
int tern__cpu_dec_rows_for(const cpu_impl *c, const tern_tensor *w); /* the driver's (and mm_gemv's) limit for w */
void tern__cpu_dec_rows_set(int n);   /* A/B: one limit for every format (1..16; 0: the per-format defaults; -1: TERN_CPU_DEC_ROWS) */
int tern__cpu_matmul_n(tern_backend *be, int k, float *const *y, const float *x, int n, const tern_tensor *const *w);
int tern__cpu_matmul_glu(tern_backend *be, float *y, const float *x, int n, const tern_tensor *gate,
                         const tern_tensor *up, int act);
int tern__cpu_matmul_add(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w);
int tern__cpu_norm_qkv_rope_kv(tern_backend *be, float *xn, const float *x, const float *nw, float eps, float *q,
                               float *k, float *v, const tern_tensor *const *w, const tern_kv_layer *kv,
                               const tern_rows *rows, int nh, const float *inv_freq, float mscale);
void tern__cpu_qkv_rope_set(int on); /* A/B: 1 the fused op above (default), 0 it declines; -1: TERN_CPU_QKV_ROPE */
void tern__cpu_glu_split_set(int on); /* A/B: matmul_glu's gate then up chunks (1, default) or interleaved (0); -1: TERN_CPU_GLU_SPLIT */
/* gemv_prep's mode for weight w: the int8 mode, and the bf16 mode for BF16 weights not marked precise (kern.h). */
static inline int tern__cpu_gx_mode(const cpu_impl *c, const tern_tensor *w) {
    return (c->int8 ? CPU_GX_INT8 : 0) | (c->bf16 && w->dtype == TERN_DT_BF16 && !w->precise ? CPU_GX_XBF16 : 0);
}
void tern__cpu_gemv_nx_set(int on); /* A/B: several x through the table's gemv_nx (1, default) or gemv per x (0); -1: TERN_CPU_GEMV_NX */
int tern__cpu_gemv_nx_on(const tern_cpu_kern *k); /* the table has gemv_nx and it is on (cpu_decode.c) */
int tern__cpu_dec_np(const tern_cpu_kern *k, const cpu_gx *gx); /* weight rows per fused-GEMV call for gx's kind */
void tern__cpu_dec_set(int on); /* A/B: 0 off, 1 on, -1 back to TERN_CPU_DEC (default on) */
void tern__cpu_dec_nr_set(int nr); /* A/B: rows per fused-GEMV pass (0: the table's gemv_pass; -1: TERN_CPU_DEC_NR) */
void tern__cpu_argmax_set(int on); /* A/B: greedy rows of the sample op through kern.h argmax (1, default) or the
                                    * sampler's chain (0); -1: TERN_CPU_ARGMAX */
/* Sets gx's prefetch distances for matrix w (cpu_matmul.c; TERN_CPU_PF). */
void tern__cpu_gemv_pf(const tern_tensor *w, cpu_gx *gx);

void tern__cpu_matmul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w);
void tern__cpu_matmul_expert(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int e);
/* ops.h tern_glm_ops.matmul_heads: matmul_expert of every head h < nh (x, y strided by ldx / hx, ldy / hy) in one pool
 * run; bitwise the per-head loop (cpu_matmul.c). */
void tern__cpu_matmul_heads(tern_backend *be, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                            const tern_tensor *w);
void tern__cpu_route_topk(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                          int mode, const float *pes);
void tern__cpu_moe_mlp(tern_backend *be, float *y, const float *x, int n, int H, const int32_t *idx, const float *wts,
                       int k, const tern_tensor *gate, const tern_tensor *up, const tern_tensor *down, int act,
                       float *scratch);
void tern__cpu_attention(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                         const tern_kv_layer *kv, float scale, float softcap);
/* Compressed KV pages (kv->kf / kv->vf not F32): cpu_kvq.c. */
void tern__cpu_kv_write_q(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v);
void tern__cpu_attention_q(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                           const tern_kv_layer *kv, float scale, float softcap);
/* The record of (slot s, position p, KV head kvh) in a paged pool of rb-byte records (a head's f32 row, or a
 * compressed record); NULL when the position is not resident (slot or block out of range, block table entry < 0). */
static inline uint8_t *tern__cpu_kv_rec(const tern_kv_layer *kv, const void *pool, size_t rb, int s, int p, int kvh) {
    if (s < 0 || p < 0 || p / kv->block_size >= kv->max_blocks) return NULL;
    const int32_t blk = kv->block_table[(size_t)s * kv->max_blocks + p / kv->block_size];
    if (blk < 0) return NULL;
    const size_t tok = (size_t)blk * kv->block_size + (size_t)(p % kv->block_size);
    return (uint8_t *)pool + (tok * kv->n_head_kv + kvh) * rb;
}
/* One record of format f into x: d values, or P rotated-space values for TurboQuant. */
void tern__cpu_kvq_decode(const tern_cpu_kern *k, const tern_kv_fmt *f, int d, int P, const uint8_t *rec, float *x);

/* TERN_CPU_PROFILE=1 (cpu_prof.c): the vtable a backend gets (base itself when off), the table printed at
 * close, the flag the decode driver checks, and the driver's split of one call (seconds). */
const tern_backend_vt *tern__cpu_vt_select(const tern_backend_vt *base);
void tern__cpu_prof_report(void);
extern int tern__cpu_prof;
void tern__cpu_prof_dec(double prep, double wake, double skew, double tail, int threads);

/* rope (cpu_backend.c) and the fused q|k|v op with rope (cpu_decode.c) share these, so that both give the same
 * bits: the angles' cosines and sines of one position for i < min(d/2, 256), then one head rotated in place
 * (ops.h rope; i >= 256 recomputes its angle). */
#include <math.h>
static inline void tern__cpu_rope_table(int32_t pos, const float *inv_freq, int d, float *cs, float *sn) {
    for (int i = 0; i < d / 2 && i < 256; i++) {
        const float th = (float)pos * inv_freq[i];
        cs[i] = cosf(th);
        sn[i] = sinf(th);
    }
}
static inline void tern__cpu_rope_head(float *v, int d, int32_t pos, const float *inv_freq, const float *cs,
                                       const float *sn, float mscale) {
    const int half = d / 2;
    for (int i = 0; i < half; i++) {
        const float c = i < 256 ? cs[i] : cosf((float)pos * inv_freq[i]);
        const float s = i < 256 ? sn[i] : sinf((float)pos * inv_freq[i]);
        const float p = v[i], q = v[i + half];
        v[i] = (p * c - q * s) * mscale;
        v[i + half] = (q * c + p * s) * mscale;
    }
}

/* Shared with ref.c (same math in both backends). */
float tern__gelu_tanh(float x);
void tern__route_topk_row(int32_t *idx, float *wts, const float *logits, int E, int k, const float *pes);

#endif
