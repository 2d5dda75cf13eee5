/*
 * cpu_backend.c — the fast CPU backend ("cpu"): constructor, vtable, memory, and the
 * light ops (embed, rmsnorm, rope, kv_write, elementwise), plus the bandwidth probe.
 *
 * Heavy ops live next door: cpu_matmul.c (matmul, MoE), cpu_attn.c (attention). The
 * kernel table (kern.h) is picked once at open from cpuid. "Device" memory is host memory;
 * upload_weight only validates (weights stay zero-copy in their mmap). Elementwise ops,
 * rope, rmsnorm, add_bias and copy_cols are one-pass loops: on the calling thread for
 * decode-sized inputs, split over the pool from par_min elements (prefill), where the
 * pool's ~µs dispatch is small next to the pass. Math matches ref.c op for op (same
 * formulas, f32), so results do not depend on the split.
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/cpu_glm.h"
#include "sample/sample_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void cpu_close(tern_backend *be) {
    if (!be) return;
    cpu_impl *c = be->impl;
    if (c) {
        tern_pool_free(c->pool);
        if (c->tbuf)
            for (int i = 0; i < c->nth; i++) tern_afree(c->tbuf[i]);
        free(c->tbuf);
        if (c->xbuf)
            for (int i = 0; i < c->nth; i++) tern_afree(c->xbuf[i]);
        free(c->xbuf);
        tern_afree(c->moe_i);
        tern_afree(c->xq8);
        tern_afree(c->glu);
        tern_afree(c->xrows);
        if (c->mxb)
            for (int i = 0; i < c->nth; i++) tern_afree(c->mxb[i]);
        free(c->mxb);
        free(c->mxcap);
        tern_afree(c->dec_part);
        tern__cpu_glm_free(c->glm);
        free(c);
        tern__cpu_prof_report(); /* TERN_CPU_PROFILE=1: the per-op table (cpu_prof.c) */
    }
    free(be);
}

static void *cpu_alloc(tern_backend *be, size_t bytes) { (void)be; return tern_aalloc(bytes ? bytes : 1); }
static void cpu_free(tern_backend *be, void *p) { (void)be; tern_afree(p); }
static void cpu_copy(tern_backend *be, void *dst, const void *src, size_t bytes) { (void)be; if (bytes) memmove(dst, src, bytes); }
static void cpu_sync(tern_backend *be) { (void)be; }
static tern_status cpu_upload_weight(tern_backend *be, tern_tensor *t, tern_error *err) {
    (void)be;
    tern_status s = tern_cpu_check_weight(t, err);
    if (s == TERN_OK) t->device = -1;
    return s;
}
static void cpu_free_weight(tern_backend *be, tern_tensor *t) { (void)be; (void)t; }

static void cpu_embed(tern_backend *be, float *y, const int32_t *ids, int n, const tern_tensor *emb, float scale) {
    cpu_impl *c = be->impl;
    int64_t V = emb->shape[0], H = emb->shape[emb->ndim - 1];
    for (int r = 0; r < n; r++) {
        float *yr = y + (size_t)r * (size_t)H;
        if (ids[r] < 0 || ids[r] >= V) { memset(yr, 0, (size_t)H * sizeof *yr); continue; }
        if (emb->dtype == TERN_DT_F32 || emb->dtype == TERN_DT_Q || emb->dtype == TERN_DT_BF16 || emb->dtype == TERN_DT_F16) {
            /* whole row through the fast decoder (Q: H is a multiple of the group size) */
            cpu_wrow w;
            tern__cpu_wrow_at(emb, 0, ids[r], &w); /* a 2-D table: matrix 0 */
            for (int j0 = 0; j0 < (int)H; j0 += CPU_CH) c->k->decode(&w, j0, TERN_MIN(CPU_CH, (int)H - j0), yr + j0);
        } else {
            tern_tensor_row_f32(emb, ids[r], yr);
        }
        for (int64_t j = 0; j < H; j++) yr[j] *= scale;
    }
}

typedef struct norm_ctx {
    const tern_cpu_kern *k;
    float *y;
    const float *x, *w;
    int rows, d;
    float eps;
} norm_ctx;

static void norm_task(void *arg, int ith, int nth) {
    norm_ctx *a = arg;
    int64_t lo, hi;
    tern__cpu_split(a->rows, 1, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = a->x + (size_t)r * a->d;
        float *yr = a->y + (size_t)r * a->d;
        float inv = 1.0f / sqrtf(a->k->dot(xr, xr, a->d) / (float)a->d + a->eps);
        a->k->norm_apply(yr, xr, inv, a->w, a->d);
    }
}

static void cpu_rmsnorm(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, float eps) {
    cpu_impl *c = be->impl;
    norm_ctx a = {c->k, y, x, w, rows, d, eps};
    if (rows >= 2 && (size_t)rows * (size_t)d >= 8192 && c->nth > 1) tern_pool_run(c->pool, norm_task, &a);
    else norm_task(&a, 0, 1);
}

/* ---- rope: rows split over the pool (or heads, for one long row) ---- */

typedef struct rope_ctx {
    float *x;
    int n, nh, d;
    const int32_t *pos;
    const float *inv_freq;
    float mscale;
} rope_ctx;

static void rope_rows(const rope_ctx *a, int r, int h0, int h1) {
    float cs[256], sn[256]; /* head_dim <= 512 */
    tern__cpu_rope_table(a->pos[r], a->inv_freq, a->d, cs, sn);
    for (int h = h0; h < h1; h++) tern__cpu_rope_head(a->x + ((size_t)r * a->nh + h) * a->d, a->d, a->pos[r], a->inv_freq, cs, sn, a->mscale);
}

static void rope_task(void *arg, int ith, int nth) {
    rope_ctx *a = arg;
    int64_t lo, hi;
    if (a->n >= nth) {
        tern__cpu_split(a->n, 1, ith, nth, &lo, &hi);
        for (int64_t r = lo; r < hi; r++) rope_rows(a, (int)r, 0, a->nh);
    } else {
        for (int r = 0; r < a->n; r++) {
            tern__cpu_split(a->nh, 1, ith, nth, &lo, &hi);
            if (lo < hi) rope_rows(a, r, (int)lo, (int)hi);
        }
    }
}

static void cpu_rope(tern_backend *be, float *x, int n, int nh, int d, const int32_t *pos, const float *inv_freq, float mscale) {
    cpu_impl *c = be->impl;
    rope_ctx a = {x, n, nh, d, pos, inv_freq, mscale};
    if ((size_t)n * nh * d >= c->par_min / 4 && c->nth > 1) tern_pool_run(c->pool, rope_task, &a);
    else rope_task(&a, 0, 1);
}

static void cpu_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v) {
    if (kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32) { tern__cpu_kv_write_q(be, kv, rows, k, v); return; }
    (void)be;
    const size_t hb = (size_t)kv->head_dim * sizeof(float);          /* a head's record */
    const size_t n = (size_t)kv->n_head_kv * (size_t)kv->head_dim;   /* a position's floats */
    for (int r = 0; r < rows->n; r++) { /* head 0's record: the position's heads follow it */
        uint8_t *kd = tern__cpu_kv_rec(kv, kv->k, hb, rows->slot[r], rows->pos[r], 0);
        uint8_t *vd = tern__cpu_kv_rec(kv, kv->v, hb, rows->slot[r], rows->pos[r], 0);
        if (!kd) continue;
        memcpy(kd, k + (size_t)r * n, n * sizeof(float));
        memcpy(vd, v + (size_t)r * n, n * sizeof(float));
    }
}

/* ---- elementwise: one pass, split in cache-line units over the pool when n is large
 * (prefill); every element is computed by the same formula as ref.c either way. ---- */

enum { EW_ADD, EW_MUL, EW_SCALE, EW_GELU, EW_SILU, EW_SOFTCAP };

typedef struct ew_ctx {
    int op;
    const tern_cpu_kern *k;
    float *y;
    const float *a, *b;
    float s;
    size_t n;
} ew_ctx;

static void ew_task(void *arg, int ith, int nth) {
    ew_ctx *e = arg;
    int64_t lo, hi;
    tern__cpu_split((int64_t)e->n, 16, ith, nth, &lo, &hi);
    float *y = e->y, s = e->s;
    const float *a = e->a, *b = e->b;
    switch (e->op) {
    case EW_ADD: for (int64_t i = lo; i < hi; i++) y[i] = a[i] + b[i]; break;
    case EW_MUL: for (int64_t i = lo; i < hi; i++) y[i] = a[i] * b[i]; break;
    case EW_SCALE: for (int64_t i = lo; i < hi; i++) y[i] = a[i] * s; break;
    case EW_GELU: e->k->gelu_mul(y + lo, a + lo, b ? b + lo : NULL, hi - lo); break;
    case EW_SILU: e->k->silu_mul(y + lo, a + lo, b ? b + lo : NULL, hi - lo); break;
    case EW_SOFTCAP: e->k->softcap(y + lo, hi - lo, s); break;
    default: break;
    }
}

static void ew_run(tern_backend *be, int op, float *y, const float *a, const float *b, float s, size_t n) {
    cpu_impl *c = be->impl;
    ew_ctx e = {op, c->k, y, a, b, s, n};
    /* transcendental ops are ~10x the work per element: split them earlier */
    size_t min = op >= EW_GELU ? c->par_min / 8 : c->par_min;
    if (n >= min && c->nth > 1) tern_pool_run(c->pool, ew_task, &e);
    else ew_task(&e, 0, 1);
}

static void cpu_add(tern_backend *be, float *y, const float *a, const float *b, size_t n) { ew_run(be, EW_ADD, y, a, b, 0.0f, n); }
static void cpu_mul(tern_backend *be, float *y, const float *a, const float *b, size_t n) { ew_run(be, EW_MUL, y, a, b, 0.0f, n); }
static void cpu_scale(tern_backend *be, float *y, const float *x, float s, size_t n) { ew_run(be, EW_SCALE, y, x, NULL, s, n); }
static void cpu_scale_dev(tern_backend *be, float *y, const float *x, const float *s, size_t n) { ew_run(be, EW_SCALE, y, x, NULL, s[0], n); }
static void cpu_gelu_tanh_mul(tern_backend *be, float *y, const float *g, const float *u, size_t n) { ew_run(be, EW_GELU, y, g, u, 0.0f, n); }
static void cpu_silu_mul(tern_backend *be, float *y, const float *g, const float *u, size_t n) { ew_run(be, EW_SILU, y, g, u, 0.0f, n); }
static void cpu_softcap(tern_backend *be, float *y, size_t n, float cap) { ew_run(be, EW_SOFTCAP, y, NULL, NULL, cap, n); }

typedef struct rowop_ctx { float *dst; const float *src; int n, w, ss, off; } rowop_ctx;

static void add_bias_task(void *arg, int ith, int nth) {
    rowop_ctx *a = arg;
    int64_t lo, hi;
    tern__cpu_split(a->n, 1, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        for (int j = 0; j < a->w; j++) a->dst[(size_t)r * a->w + j] += a->src[j];
}

static void copy_cols_task(void *arg, int ith, int nth) {
    rowop_ctx *a = arg;
    int64_t lo, hi;
    tern__cpu_split(a->n, 1, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) memmove(a->dst + (size_t)r * a->w, a->src + (size_t)r * a->ss + a->off, (size_t)a->w * sizeof(float));
}

static void cpu_add_bias(tern_backend *be, float *y, const float *bias, int n, int d) {
    cpu_impl *c = be->impl;
    rowop_ctx a = {y, bias, n, d, 0, 0};
    if (n >= 2 && (size_t)n * d >= c->par_min && c->nth > 1) tern_pool_run(c->pool, add_bias_task, &a);
    else add_bias_task(&a, 0, 1);
}

static void cpu_copy_cols(tern_backend *be, float *dst, const float *src, int n, int w, int ss, int off) {
    cpu_impl *c = be->impl;
    rowop_ctx a = {dst, src, n, w, ss, off};
    /* rows of dst and src may overlap only when dst == src (in-place narrowing): keep that serial */
    int disjoint = dst + (size_t)n * w <= src || src + (size_t)(n - 1) * ss + off + w <= dst;
    if (n >= 2 && (size_t)n * w >= c->par_min && c->nth > 1 && disjoint) tern_pool_run(c->pool, copy_cols_task, &a);
    else copy_cols_task(&a, 0, 1);
}

static int cpu_norm_matmul(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, int k,
                           float *const *y, const tern_tensor *const *w, int act, const tern_norm_res *res);
static int cpu_matmul_act_mul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int act,
                              const float *v, const tern_norm_res *res, float eps);

/* The sample op: a greedy row with neither bias nor penalties (the decode loop's usual case) takes the kernel
 * table's argmax, the same answer as the sampler's chain (kern.h; one vector pass over the vocabulary instead
 * of the reference's scalar one: llama3-1b's 128256 logits ~150 -> ~15 us); other rows go to the chain.
 * TERN_CPU_ARGMAX=0: every row through the chain (before/after). */
_Static_assert(TERN_SAMPLE_ERR_MASKED == -1 && TERN_SAMPLE_ERR_NAN == -2 && TERN_SAMPLE_ERR_INF == -3,
               "kern.h argmax codes");
static _Atomic int argmax_on = -1;
void tern__cpu_argmax_set(int on) { argmax_on = on < 0 ? -1 : on != 0; }

static void cpu_sample(tern_backend *be, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
                       const tern_sample_pair *pairs, void *scratch) {
    const int fast = tern__cpu_switch(&argmax_on, "TERN_CPU_ARGMAX", 1);
    const cpu_impl *c = be->impl;
    for (int r = 0; r < n; r++) {
        const tern_sample_row *p = &rows[r];
        if (p->mode != TERN_SAMPLE_DRAW) continue;
        float *lr = logits + (size_t)r * V;
        if (fast && c->k->argmax && p->temperature == 0 && !p->n_bias && !p->n_hist) ids[r] = c->k->argmax(lr, V);
        else tern_sample_op_host(be, ids + r, lr, 1, V, p, pairs, scratch);
    }
}

static const tern_backend_vt cpu_vt = {
    .name = "cpu",
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .upload_weight = cpu_upload_weight,
    .free_weight = cpu_free_weight,
    .matmul = tern__cpu_matmul,
    .matmul_expert = tern__cpu_matmul_expert,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = tern__cpu_attention,
    .add = cpu_add,
    .mul = cpu_mul,
    .scale = cpu_scale,
    .scale_dev = cpu_scale_dev,
    .gelu_tanh_mul = cpu_gelu_tanh_mul,
    .silu_mul = cpu_silu_mul,
    .softcap = cpu_softcap,
    .add_bias = cpu_add_bias,
    .copy_cols = cpu_copy_cols,
    .route_topk = tern__cpu_route_topk,
    .moe_mlp = tern__cpu_moe_mlp,
    .glm = &tern__cpu_glm_fast_ops, /* GLM-5 ops (glm_fast.c, glm_attn.c) */
    .sample = cpu_sample, /* the CPU sampler's draw (src/sample/sample_ref.c; greedy rows: kern.h argmax) */
    .matmul_n = tern__cpu_matmul_n, /* the decode driver's fused ops, 1-16 rows (cpu_decode.c) */
    .matmul_glu = tern__cpu_matmul_glu,
    .matmul_add = tern__cpu_matmul_add,
    .norm_matmul = cpu_norm_matmul, /* tests only (TERN_CPU_NORM_RES=1) */
    .matmul_act_mul = cpu_matmul_act_mul, /* tests only (TERN_CPU_NORM_RES=1) */
    .norm_qkv_rope_kv = tern__cpu_norm_qkv_rope_kv, /* one decode row: rope and cache writes inside the q|k|v run (cpu_decode.c) */
};

/* The residual fold of the test hooks below, by this backend's own ops: res->x_out = (x·1 + rmsnorm(h)·w)·s with h
 * normalised in place (scratch afterwards, as the model's tern__rmsnorm_add leaves it); with h2, first h += rmsnorm(h2)·w2
 * (h2 normalised in place) */
static void cpu_res_fold(tern_backend *be, const tern_norm_res *res, const float *x, int n, int d, float eps) {
    const size_t cnt = (size_t)n * (size_t)d;
    float *h = (float *)res->h;
    if (res->h2) {
        float *h2 = (float *)res->h2;
        cpu_rmsnorm(be, h2, h2, n, d, res->w2, eps);
        cpu_add(be, h, h, h2, cnt);
    }
    cpu_scale(be, res->x_out, x, 1.0f, cnt);
    cpu_rmsnorm(be, h, h, n, d, res->w, eps);
    cpu_add(be, res->x_out, res->x_out, h, cnt);
    if (res->s) cpu_scale_dev(be, res->x_out, res->x_out, res->s, cnt);
}

/* TERN_CPU_NORM_RES=1 (tests only: no speed to gain here): ops.h norm_matmul with its residual fold, by
 * composition of this backend's own ops, so that a model's residual-buffer swap (gemma4.c, which the
 * CUDA backend's fold drives) runs in the CPU parity tests too. Serves q|k|v and one-matrix ops; the
 * gate|up form declines before touching anything (the model then runs rmsnorm_add + the op). The
 * values are those of the unfused path: x' = (x·1 + rmsnorm(h)·w)·s with h normalised in place (as
 * the model's tern__rmsnorm_add leaves it), then rmsnorm and the matmuls. */
static int cpu_norm_matmul(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, int k,
                           float *const *y, const tern_tensor *const *w, int act, const tern_norm_res *res) {
    static _Atomic int on_cache = -1;
    const int on = tern__cpu_switch(&on_cache, "TERN_CPU_NORM_RES", 0);
    if (!on || !res || act >= 0 || (k != 1 && k != 3) || xn == x || !res->x_out) return 0;
    const tern_backend_vt *op = be->vt;
    const int d = (int)w[0]->shape[w[0]->ndim - 1];
    cpu_res_fold(be, res, x, n, d, eps);
    cpu_rmsnorm(be, xn, res->x_out, n, d, nw, eps);
    if (k == 3 && op->matmul_n && op->matmul_n(be, 3, y, xn, n, w)) return 1;
    for (int i = 0; i < k; i++) op->matmul(be, y[i], xn, n, w[i]);
    return 1;
}

/* TERN_CPU_NORM_RES=1 (tests only, as cpu_norm_matmul): ops.h matmul_act_mul by composition, so that gemma4.c's
 * per-layer input gate runs its residual fold and buffer swap in the CPU parity tests: cpu_res_fold, then
 * y = act(x'·wᵀ) ⊙ v. Declines without res (the model's plain path is the same ops). */
static int cpu_matmul_act_mul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int act,
                              const float *v, const tern_norm_res *res, float eps) {
    static _Atomic int on_cache = -1;
    const int on = tern__cpu_switch(&on_cache, "TERN_CPU_NORM_RES", 0);
    if (!on || !res || !res->x_out) return 0;
    const size_t cy = (size_t)n * (size_t)w->shape[w->ndim - 2];
    cpu_res_fold(be, res, x, n, (int)w->shape[w->ndim - 1], eps);
    be->vt->matmul(be, y, res->x_out, n, w);
    if (act == TERN_ACT_SILU) cpu_silu_mul(be, y, y, v, cy);
    else cpu_gelu_tanh_mul(be, y, y, v, cy);
    return 1;
}

void tern_backend_cpu_set_int8(tern_backend *be, int on) {
    if (be && be->vt->close == cpu_close) ((cpu_impl *)be->impl)->int8 = on != 0; /* the profiled copy too */
}

void tern_backend_cpu_set_bf16(tern_backend *be, int on) {
    if (!be || be->vt->close != cpu_close) return;
    cpu_impl *c = be->impl;
    c->bf16 = on && c->k->gemm_bf16_mk && __builtin_cpu_supports("avx512bf16");
}

const char *tern_cpu_isa_name(void) { return tern__cpu_kern_pick()->name; }

tern_status tern_backend_cpu_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err) {
    *out = NULL;
    int nth = opts && opts->n_threads > 0 ? opts->n_threads : tern_cpu_count();
    tern_backend *be = calloc(1, sizeof *be);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!be || !c) { free(be); free(c); return tern_err(err, TERN_ENOMEM, "cpu backend: out of memory"); }
    be->vt = tern__cpu_vt_select(&cpu_vt); /* TERN_CPU_PROFILE=1: the timed copy (cpu_prof.c) */
    be->device = -1;
    be->compute = opts ? opts->compute : TERN_COMPUTE_F32;
    if (be->compute == TERN_COMPUTE_BF16X2) be->compute = TERN_COMPUTE_BF16; /* one bf16 mode on the CPU */
    be->impl = c;
    c->k = tern__cpu_kern_pick();
    const char *g8 = getenv("TERN_CPU_GEMM_I8"); /* =0: the int8 mode's prefill runs the f32 GEMM */
    c->gemm_i8 = c->k == &tern__cpu_kern_avx512 && __builtin_cpu_supports("avx512vnni") && !(g8 && g8[0] == '0');
    const char *gb = getenv("TERN_CPU_GEMM_BF16"); /* =0: the bf16 mode's prefill runs the f32 GEMM (exact x) */
    c->bf16 = be->compute == TERN_COMPUTE_BF16 && c->k->gemm_bf16_mk && __builtin_cpu_supports("avx512bf16") &&
              !(gb && gb[0] == '0');
    c->pool = tern_pool_create(nth);
    if (!c->pool) { cpu_close(be); return tern_err(err, TERN_ENOMEM, "cpu backend: cannot start %d threads", nth); }
    c->nth = tern_pool_size(c->pool);
    c->tbuf = calloc((size_t)c->nth, sizeof *c->tbuf);
    c->xbuf = calloc((size_t)c->nth, sizeof *c->xbuf);
    c->mxb = calloc((size_t)c->nth, sizeof *c->mxb);
    c->mxcap = calloc((size_t)c->nth, sizeof *c->mxcap);
    const char *i8 = getenv("TERN_CPU_INT8");
    c->int8 = (i8 && i8[0] == '1') || be->compute == TERN_COMPUTE_INT8; /* --compute int8 */
    const char *fu = getenv("TERN_CPU_GEMV");
    c->fused = !(fu && fu[0] == '0');
    c->par_min = 1u << 15;
    c->dec_part = tern_aalloc((size_t)c->nth * sizeof *c->dec_part);
    if (!c->tbuf || !c->xbuf || !c->mxb || !c->mxcap || !c->dec_part) { cpu_close(be); return tern_err(err, TERN_ENOMEM, "cpu backend: out of memory"); }
    for (int i = 0; i < c->nth; i++) {
        c->tbuf[i] = tern_aalloc((size_t)CPU_RT_MAX * CPU_CH * sizeof(float));
        c->xbuf[i] = tern_aalloc(CPU_GX_BUF);
        if (!c->tbuf[i] || !c->xbuf[i]) { cpu_close(be); return tern_err(err, TERN_ENOMEM, "cpu backend: out of memory (decode tiles)"); }
    }
    *out = be;
    return TERN_OK;
}

/* ---- memory bandwidth probe ----
 * The buffer is at least twice the last-level cache (this machine's L3 is 480 MiB), so a
 * pass measures DRAM, not cache: the number decode GEMV over a whole model is bounded by. */

struct tern_membw {
    const tern_cpu_kern *k;
    tern_pool *pool;
    float *p;
    size_t n;
    double sink[64];
};

static void bw_task(void *arg, int ith, int nth) {
    tern_membw *b = arg;
    int64_t lo, hi;
    tern__cpu_split((int64_t)b->n, 4096, ith, nth, &lo, &hi);
    if (lo < hi) b->sink[ith & 63] += b->k->readsum(b->p + lo, (size_t)(hi - lo));
}

size_t tern_membw_default_bytes(void) {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t b = l3 > 0 ? 2 * (size_t)l3 : (size_t)256 << 20;
    if (b < ((size_t)64 << 20)) b = (size_t)64 << 20;
    if (b > ((size_t)2 << 30)) b = (size_t)2 << 30;
    return b;
}

tern_membw *tern_membw_open(size_t bytes) {
    size_t min = tern_membw_default_bytes();
    if (bytes < min) bytes = min;
    tern_membw *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->n = bytes / sizeof(float) / 4096 * 4096;
    b->k = tern__cpu_kern_pick();
    b->p = tern_aalloc(b->n * sizeof *b->p);
    tern_advise_huge(b->p, b->n * sizeof *b->p); /* the same pages as the weights it is compared with */
    b->pool = tern_pool_create(0);
    if (!b->p || !b->pool) { tern_membw_close(b); return NULL; }
    for (size_t i = 0; i < b->n; i++) b->p[i] = (float)(i & 1023);
    tern_pool_run(b->pool, bw_task, b); /* warm up: page faults, TLB */
    return b;
}

size_t tern_membw_bytes(const tern_membw *b) { return b ? b->n * sizeof(float) : 0; }

double tern_membw_run(tern_membw *b) {
    if (!b) return 0.0;
    double t0 = tern_time_s();
    tern_pool_run(b->pool, bw_task, b);
    double dt = tern_time_s() - t0;
    return dt > 0 ? (double)(b->n * sizeof(float)) / dt / 1e9 : 0.0;
}

void tern_membw_close(tern_membw *b) {
    if (!b) return;
    tern_pool_free(b->pool);
    tern_afree(b->p);
    free(b);
}

double tern_cpu_membw_probe(size_t bytes) {
    tern_membw *b = tern_membw_open(bytes);
    double best = 0.0;
    for (int it = 0; b && it < 3; it++) {
        double g = tern_membw_run(b);
        if (g > best) best = g;
    }
    tern_membw_close(b);
    return best;
}
