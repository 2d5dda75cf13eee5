/*
 * internal.h — what architecture files share: the tern_model struct, the per-architecture
 * vtable, weight-loading helpers that validate shape/dtype and upload, and RoPE tables.
 * Not part of the public API.
 */
#ifndef TERN_MODEL_INTERNAL_H
#define TERN_MODEL_INTERNAL_H

#include "model/model.h"

typedef struct tern_arch_impl {
    const char *name;
    /* Look up, validate and upload every tensor; allocate per-step scratch for max_batch rows. */
    tern_status (*load)(tern_model *m, tern_weights *ws, tern_error *err);
    /* Forward over n <= max_batch rows; device inputs already uploaded (m->d_tokens/d_pos/d_slot).
     * Writes logits for the rows in `want_idx` (host, n_want entries) to host `logits`. */
    tern_status (*forward)(tern_model *m, const tern_batch *b, tern_kv *kv, const int *want_idx,
                           int n_want, float *logits, tern_error *err);
    void (*free)(tern_model *m);
    int spans;   /* 1: forward builds rows with tern__step_rows (bidirectional spans work) */
} tern_arch_impl;

extern const tern_arch_impl tern__gemma4_impl;
extern const tern_arch_impl tern__llama_impl;
extern const tern_arch_impl tern__glm5_impl;

struct tern_model {
    tern_model_config cfg;     /* shallow copy; layers/quant owned by the caller's config */
    tern_backend *be;
    const tern_arch_impl *impl;
    void *arch;                /* architecture-specific weights + scratch */
    int max_batch;
    /* device copies of the step's rows: one upload a sub-batch of n rows — d_in holds tokens | pos | slot as three runs
     * of n (h_in stages them), and d_tokens / d_pos / d_slot point at the runs (so they depend on n, which every step
     * graph's key holds) */
    int32_t *d_in, *h_in;      /* [3 * max_batch] */
    int32_t *d_tokens, *d_pos, *d_slot;
    float *d_embd;             /* [max_batch, n_embd] for embedding-row input */
    /* bidirectional spans of the current sub-batch (model.c): vis_on = this step has spans */
    int vis_on;
    int32_t *d_vis_lo, *d_vis_hi;  /* device [max_batch] */
    int32_t *h_vis_lo, *h_vis_hi;  /* host [max_batch] */
    /* per slot: the span id that ended the previous call at position span_end (0 = none),
     * to refuse a span that continues across calls; grown to the cache's slot count */
    const void *span_kv;
    int32_t *span_id, *span_end;
    int span_slots;
    /* bookkeeping */
    void **allocs; int n_allocs, cap_allocs;           /* device buffers to free */
    tern_tensor **weights; int n_weights, cap_weights; /* uploaded weights to free */
    tern_model_stats stats;
    /* owned when loaded from a directory */
    tern_model_config *own_cfg;
    tern_weights *own_ws;
    /* tensor parallelism (appended; tp.c): set on rank 0's model of a group, whose forward then
     * runs every rank's model in lockstep (tern__tp_forward); NULL otherwise and on ranks > 0 */
    struct tern_tp *tp;
    /* expert offload (appended; src/runtime/experts.h): NULL = every expert uploaded */
    struct tern_experts *experts;
    tern_weights *load_ws;     /* the store being loaded (expert stacks check their file backing) */
    /* on-device sampling (appended; model.c): buffers made at load when the backend has
     * vt->sample; during tern_model_forward_sample, samp = the request, and for the current
     * sub-batch samp_base = index of its first wanted row, samp_any / samp_all = some / every
     * wanted row is drawn on the device (d_srows holds the sub-batch's descriptors) */
    const tern_batch_sample *samp;
    int samp_base, samp_any, samp_all;
    int feed;                  /* tern_model_decode_launch: the draws also land in d_in[0, n), the next step's tokens */
    int fed_n;                 /* rows of the last decode launch (0 once anything else has run: d_in holds no draws) */
    int pipe_off;              /* tern_model_decode_launch refuses from now on (a recorded step graph would not launch) */
    tern_sample_row *d_srows;  /* [max_batch] */
    tern_sample_pair *d_pairs; /* [TERN_MODEL_SAMPLE_PAIRS] */
    int32_t *d_ids;            /* [max_batch] */
    void *d_sscratch;          /* tern_sample_scratch_bytes(n_vocab) */
    /* step graphs (appended; model.c): key of the last big step run eagerly (recorded when it repeats) */
    uint64_t graph_seen;
    /* vocabulary-parallel head (appended; tp.c sets it on every rank before each step): the
     * group's step computes logits (rank 0 got a logits buffer or samples on the device), so
     * every rank computes its vocabulary slice and gathers it to rank 0 */
    int head_need;
};

/* One forward over this model alone (what tern_model_forward does outside a TP group). */
tern_status tern__model_forward_local(tern_model *m, const tern_batch *b, tern_kv *kv, float *logits, tern_error *err);
/* tp.c: run b on every rank of the group (rank 0 = the caller's model and kv). */
tern_status tern__tp_forward(struct tern_tp *tp, const tern_batch *b, tern_kv *kv, float *logits, tern_error *err);

/* The step's rows as ops see them: the driver's device copies of positions / slots and, when
 * the step has bidirectional spans, the per-row visible ranges (ops.h tern_rows.vis_*). */
static inline tern_rows tern__step_rows(const tern_model *m, const tern_batch *b) {
    tern_rows r = {.n = b->n, .pos = m->d_pos, .slot = m->d_slot, .pos_host = b->pos, .slot_host = b->slot};
    if (m->vis_on) {
        r.vis_lo = m->d_vis_lo;
        r.vis_hi = m->d_vis_hi;
        r.vis_lo_host = m->h_vis_lo;
        r.vis_hi_host = m->h_vis_hi;
    }
    return r;
}

/* MoE block of layer l: vt->moe_mlp, or over the expert store's slots when offload is on
 * (src/model/moe.c; identical results). gate/up/down: the layer's stacks as loaded. */
void tern__moe_mlp(tern_model *m, int l, float *y, const float *x, int n, int H, const int32_t *idx,
                   const float *wts, int k, const tern_tensor *gate, const tern_tensor *up,
                   const tern_tensor *down, int act, float *scratch);
/* tern__load_stack with offload on: register the stored stack with the expert store instead
 * of uploading it (moe.c). */
tern_status tern__experts_register(tern_model *m, const char *name, tern_tensor *t, tern_error *err);
/* With offload on: hand an uploaded MoE router (layers.L.router.proj, layers.L.mlp.gate) to the
 * expert store for read-ahead; other names are ignored. */
void tern__experts_router(tern_model *m, const char *name, const tern_tensor *t);

/* Device allocation owned by the model (freed with it). NULL + err on failure. */
void *tern__alloc(tern_model *m, size_t bytes, tern_error *err);
#define TERN_ALLOC_F(m, n, err) ((float *)tern__alloc((m), sizeof(float) * (size_t)(n), (err)))

/* Matrix [out, in] (F32/F16/BF16/Q): presence, shape, dtype checked; uploaded; counted. */
tern_status tern__load_matrix(tern_model *m, tern_weights *ws, const char *name, int64_t out, int64_t in,
                              tern_tensor *t, tern_error *err);
/* uploaded weights read together (q|k|v) into one allocation where the backend does that (ops.h join_weights; the
 * model's own copies for freeing follow); a layout choice only: every op reads them as before. k <= 4 */
void tern__join_weights(tern_model *m, tern_tensor *const *w, int k);
/* Expert stack [E, out, in]. */
tern_status tern__load_stack(tern_model *m, tern_weights *ws, const char *name, int64_t E, int64_t out,
                             int64_t in, tern_tensor *t, tern_error *err);
/* The output head [V, H]: `lm_head` when the config unties it (required then), else the
 * embedding (a stored tied copy of lm_head is accepted and ignored). */
tern_status tern__load_head(tern_model *m, tern_weights *ws, const tern_tensor *embed, tern_tensor *head,
                            tern_error *err);
/* Vector of n floats (any float dtype) converted to f32 on the device. If `optional` and absent,
 * *dev = NULL and OK. `add` is added to every element (0 normally). */
tern_status tern__load_vec(tern_model *m, tern_weights *ws, const char *name, int64_t n, int optional,
                           float **dev, tern_error *err);

/* The output head shared by every architecture: for the rows in want[], logits =
 * softcap(head · norm(x[row])) written to host `out` ([n_want, V]), a chunk of rows at a time
 * (the device scratch is capped at 64 MB of logits). Vocabulary-parallel (cfg.head_vn > 0, tp.c):
 * every rank computes softcap(head_slice · norm(x)) into `part` and gathers it into rank 0's
 * `logits` (vt->gather_cols): each logit is the same dot product as with the whole head. */
typedef struct tern_out_head {
    float *xs, *logits;  /* device scratch [rows, H], [rows, V] (vocabulary-parallel: rank 0 only) */
    int rows;
    float *part;         /* (appended) vocabulary-parallel: [rows, head_vn], else NULL */
} tern_out_head;
tern_status tern__out_head_init(tern_model *m, tern_out_head *h, tern_error *err);
void tern__out_head_logits(tern_model *m, const tern_out_head *h, const float *x, const int *want, int n_want,
                           const float *norm, const tern_tensor *head, float *out);

/* RoPE inverse frequencies for one rope kind over head dim D: fills inv[D/2] (host) and
 * *mscale (yarn attention factor, else 1). max_pos: largest position in the step (dynamic). */
tern_status tern__rope_inv_freq(const tern_rope_params *rp, int D, int max_pos, float *inv, float *mscale,
                                tern_error *err);

/* Upload host floats into a model-owned device array. */
float *tern__upload_f32(tern_model *m, const float *host, size_t n, tern_error *err);

/* Fused decode ops (ops.h, appended): one call each in model code; when the backend does not
 * fuse the case (NULL op or a 0 return) the separate ops run, with bitwise the same result. */
static inline void tern__matmul_qkv(tern_model *m, float *q, float *k, float *v, const float *x, int n,
                                    const tern_tensor *wq, const tern_tensor *wk, const tern_tensor *wv) {
    const tern_backend_vt *op = m->be->vt;
    float *const ys[3] = {q, k, v};
    const tern_tensor *const ws[3] = {wq, wk, wv};
    if (op->matmul_n && op->matmul_n(m->be, 3, ys, x, n, ws)) return;
    for (int i = 0; i < 3; i++) op->matmul(m->be, ys[i], x, n, ws[i]);
}
/* xn = rmsnorm(x)·nw over rows of d = wq's `in`, then q|k|v = xn·W_iᵀ: one launch when the backend
 * fuses the norm into the matmul (ops.h norm_matmul), else rmsnorm + tern__matmul_qkv; bitwise the same */
static inline void tern__norm_matmul_qkv(tern_model *m, float *xn, const float *x, const float *nw, float eps, int n,
                                         float *q, float *k, float *v, const tern_tensor *wq, const tern_tensor *wk,
                                         const tern_tensor *wv) {
    const tern_backend_vt *op = m->be->vt;
    float *const ys[3] = {q, k, v};
    const tern_tensor *const ws[3] = {wq, wk, wv};
    if (op->norm_matmul && op->norm_matmul(m->be, xn, x, nw, eps, n, 3, ys, ws, -1, NULL)) return;
    op->rmsnorm(m->be, xn, x, n, (int)wq->shape[wq->ndim - 1], nw, eps);
    tern__matmul_qkv(m, q, k, v, xn, n, wq, wk, wv);
}
/* xn = rmsnorm(x)·nw, then y = xn·Wᵀ (one matrix: the output head) */
static inline void tern__norm_matmul(tern_model *m, float *xn, const float *x, const float *nw, float eps, int n,
                                     float *y, const tern_tensor *w) {
    const tern_backend_vt *op = m->be->vt;
    float *const ys[1] = {y};
    const tern_tensor *const ws[1] = {w};
    if (op->norm_matmul && op->norm_matmul(m->be, xn, x, nw, eps, n, 1, ys, ws, -1, NULL)) return;
    op->rmsnorm(m->be, xn, x, n, (int)w->shape[w->ndim - 1], nw, eps);
    op->matmul(m->be, y, xn, n, w);
}
static inline void tern__matmul_glu(tern_model *m, float *y, float *tmp, const float *x, int n,
                                    const tern_tensor *gate, const tern_tensor *up, int act);
/* xn = rmsnorm(x)·nw, then y = act(xn·gateᵀ) ⊙ (xn·upᵀ) (tmp: scratch of the unfused path) */
static inline void tern__norm_matmul_glu(tern_model *m, float *xn, const float *x, const float *nw, float eps, int n,
                                         float *y, float *tmp, const tern_tensor *gate, const tern_tensor *up,
                                         int act) {
    const tern_backend_vt *op = m->be->vt;
    float *const ys[1] = {y};
    const tern_tensor *const ws[2] = {gate, up};
    if (op->norm_matmul && op->norm_matmul(m->be, xn, x, nw, eps, n, 2, ys, ws, act, NULL)) return;
    op->rmsnorm(m->be, xn, x, n, (int)gate->shape[gate->ndim - 1], nw, eps);
    tern__matmul_glu(m, y, tmp, xn, n, gate, up, act);
}
/* y[i] = rmsnorm(x[i])·w[i] for i < k (rows[i] rows of d): one launch when the backend can (ops.h
 * rmsnorm_n), else k rmsnorm calls; bitwise the same */
static inline void tern__rmsnorm_n(tern_model *m, int k, float *const *y, const float *const *x, const int *rows,
                                   int d, const float *const *w, float eps) {
    const tern_backend_vt *op = m->be->vt;
    if (op->rmsnorm_n && op->rmsnorm_n(m->be, k, y, x, rows, d, w, eps)) return;
    for (int i = 0; i < k; i++) op->rmsnorm(m->be, y[i], x[i], rows[i], d, w[i], eps);
}
/* A MoE block's head: three RMSNorms of n rows (rmsnorm_n), the router's logits of y[1] and the top-k — ops.h
 * norm_route_topk where the backend serves it (one launch), else those three ops */
static inline void tern__norm_route_topk(tern_model *m, int n, int d, float *const *y, const float *const *x,
                                         const float *const *w, float eps, const tern_tensor *router, float *logits,
                                         int32_t *idx, float *wts, int E, int k, int mode, const float *pes) {
    const tern_backend_vt *op = m->be->vt;
    if (op->norm_route_topk &&
        op->norm_route_topk(m->be, n, d, y, x, w, eps, router, logits, idx, wts, E, k, mode, pes))
        return;
    const int nr[3] = {n, n, n};
    tern__rmsnorm_n(m, 3, y, x, nr, d, w, eps);
    op->matmul(m->be, logits, y[1], n, router);
    op->route_topk(m->be, idx, wts, logits, n, E, k, mode, pes);
}
/* y = act(a) ⊙ b over cnt elements, act TERN_ACT_SILU or TERN_ACT_GELU_TANH */
static inline void tern__act_mul(tern_model *m, float *y, const float *a, const float *b, size_t cnt, int act) {
    if (act == TERN_ACT_SILU) m->be->vt->silu_mul(m->be, y, a, b, cnt);
    else m->be->vt->gelu_tanh_mul(m->be, y, a, b, cnt);
}
/* y = act(x·gateᵀ) ⊙ (x·upᵀ); tmp [n, I] is scratch for the unfused path */
static inline void tern__matmul_glu(tern_model *m, float *y, float *tmp, const float *x, int n,
                                    const tern_tensor *gate, const tern_tensor *up, int act) {
    const tern_backend_vt *op = m->be->vt;
    if (op->matmul_glu && op->matmul_glu(m->be, y, x, n, gate, up, act)) return;
    size_t cnt = (size_t)n * (size_t)gate->shape[gate->ndim - 2];
    op->matmul(m->be, y, x, n, gate);
    op->matmul(m->be, tmp, x, n, up);
    tern__act_mul(m, y, y, tmp, cnt, act);
}
/* y += x·Wᵀ in one launch when the backend can (never in a tensor-parallel group, whose
 * partial products are summed between the matmul and the add). Returns 0 when the caller
 * must run matmul + allreduce + add itself. */
static inline int tern__matmul_add(tern_model *m, float *y, const float *x, int n, const tern_tensor *w) {
    const tern_backend_vt *op = m->be->vt;
    return !op->allreduce_sum && op->matmul_add && op->matmul_add(m->be, y, x, n, w);
}
/* y += wo·attention(q) (the attention's output through att): one backend op when it can (ops.h attention_o), else
 * the attention, then matmul_add, or matmul and the tensor-parallel residual add */
static inline void tern__attention_o(tern_model *m, float *y, float *att, float *o, const float *q, const tern_rows *rows,
                                     int nh, const tern_kv_layer *kv, float scale, float softcap, const tern_tensor *wo) {
    const tern_backend_vt *op = m->be->vt;
    if (!op->allreduce_sum && op->attention_o && op->attention_o(m->be, y, att, q, rows, nh, kv, scale, softcap, wo, 1))
        return;
    op->attention(m->be, att, q, rows, nh, kv, scale, softcap);
    if (tern__matmul_add(m, y, att, rows->n, wo)) return;
    op->matmul(m->be, o, att, rows->n, wo);
    tern_allreduce_add(m->be, y, o, (size_t)rows->n * wo->shape[0]);
}
/* o = wo·attention(q) (the attention's output through att): one backend op when it can, else the two */
static inline void tern__attention_matmul(tern_model *m, float *o, float *att, const float *q, const tern_rows *rows,
                                          int nh, const tern_kv_layer *kv, float scale, float softcap,
                                          const tern_tensor *wo) {
    const tern_backend_vt *op = m->be->vt;
    if (op->attention_o && op->attention_o(m->be, o, att, q, rows, nh, kv, scale, softcap, wo, 0)) return;
    op->attention(m->be, att, q, rows, nh, kv, scale, softcap);
    op->matmul(m->be, o, att, rows->n, wo);
}
/* x = (x + rmsnorm(h)·w) · (s ? s[0] : 1): the post-norm residual add (and Gemma 4's layer scalar) in
 * one launch when the backend can; h is scratch afterwards */
static inline void tern__rmsnorm_add(tern_model *m, float *x, float *h, int rows, int d, const float *w, float eps,
                                     const float *s) {
    const tern_backend_vt *op = m->be->vt;
    if (op->rmsnorm_add && op->rmsnorm_add(m->be, x, h, rows, d, w, eps, s)) return;
    op->rmsnorm(m->be, h, h, rows, d, w, eps);
    op->add(m->be, x, x, h, (size_t)rows * d);
    if (s) op->scale_dev(m->be, x, x, s, (size_t)rows * d);
}
/* A post-norm residual add x = (x + rmsnorm(h)·w)·(s ? s[0] : 1) held back so that the next pre-norm
 * matmul can fold it in (ops.h norm_matmul's res); Gemma 4's post-attention and post-FFN norms. */
typedef struct tern_pending_res {
    float *h;
    const float *w, *s;
    int on;
    float *h2;        /* NULL, or an inner add h = h + rmsnorm(h2)·w2 first (ops.h tern_norm_res h2) */
    const float *w2;
} tern_pending_res;
/* the pending add run as rmsnorm_add launches: the inner one (h2) first, then x's — one launch where the backend
 * serves ops.h rmsnorm_add2 (bitwise the two) */
static inline void tern__pending_add(tern_model *m, float *x, const tern_pending_res *p, int n, int d, float eps) {
    const tern_backend_vt *op = m->be->vt;
    if (p->h2 && op->rmsnorm_add2 && op->rmsnorm_add2(m->be, x, p->h, p->h2, n, d, p->w, p->w2, eps, p->s)) return;
    if (p->h2) tern__rmsnorm_add(m, p->h, p->h2, n, d, p->w2, eps, NULL);
    tern__rmsnorm_add(m, x, p->h, n, d, p->w, eps, p->s);
}

/* the pending add as the residual prologue of a fused op (ops.h tern_norm_res), x' written to xo */
static inline tern_norm_res tern__pending_res(const tern_pending_res *p, float *xo) {
    return (tern_norm_res){xo, p->h, p->w, p->s, p->h2, p->w2};
}
/* The residual stream *x (rows n of d) gets the pending add, then the pre-norm op runs on rmsnorm(*x)·nw:
 * act < 0: y[0..k) = xn·W_iᵀ (k = 1: the plain matmul); act >= 0: y[0] = act(xn·w[0]ᵀ) ⊙ (xn·w[1]ᵀ)
 * (tmp: scratch of the unfused glu). When the backend folds the add in, x' lands in *xo and the two
 * pointers swap (x' is then *x); otherwise (or *xo NULL: no room for n rows) rmsnorm_add runs in place. Either way *x holds the
 * same bits afterwards and the pending add is consumed. */
/* a fused op wrote x' to *xo (norm_matmul's / norm_mlp's res): x' becomes the residual stream */
static inline void tern__pending_taken(float **x, float **xo, tern_pending_res *p) {
    float *t = *x;
    *x = *xo;
    *xo = t;
    p->on = 0;
}
static inline void tern__pending_norm_op(tern_model *m, float **x, float **xo, tern_pending_res *p, float *xn,
                                         const float *nw, float eps, int n, int d, int k, float *const *y,
                                         const tern_tensor *const *w, int act, float *tmp) {
    const tern_backend_vt *op = m->be->vt;
    if (p->on) {
        const tern_norm_res r = tern__pending_res(p, *xo);
        if (*xo && op->norm_matmul && op->norm_matmul(m->be, xn, *x, nw, eps, n, k, y, w, act, &r)) {
            tern__pending_taken(x, xo, p);
            return;
        }
        p->on = 0;
        tern__pending_add(m, *x, p, n, d, eps);
    }
    if (act >= 0) tern__norm_matmul_glu(m, xn, *x, nw, eps, n, y[0], tmp, w[0], w[1], act);
    else if (k == 3) tern__norm_matmul_qkv(m, xn, *x, nw, eps, n, y[0], y[1], y[2], w[0], w[1], w[2]);
    else tern__norm_matmul(m, xn, *x, nw, eps, n, y[0], w[0]);
}
/* Gemma 4's attention input in one backend op (ops.h norm_qkv_norm_rope_kv: the pre-normed q|k|v, their head norms,
 * rope and the cache stores), the pending add folded in where the backend can (x' lands in *xo and the pointers swap,
 * as in tern__pending_norm_op), else (an inner add h2 the pre-norm ops never fold) run first. 0 when the backend does
 * not serve it: the caller runs tern__pending_norm_op and norm_rope_kv_write (the pending add may have been consumed
 * by then: p->on says). */
static inline int tern__pending_qkv_nrk(tern_model *m, float **x, float **xo, tern_pending_res *p, float *xn,
                                        const float *nw, float eps, float *const *y, const tern_tensor *const *w,
                                        const tern_kv_layer *kv, const tern_rows *rows, int nh, const float *inv_freq,
                                        float mscale, const float *qw, const float *kw) {
    const tern_backend_vt *op = m->be->vt;
    if (!op->norm_qkv_norm_rope_kv || rows->n < 2) return 0;
    if (p->on && *xo) {
        const tern_norm_res r = tern__pending_res(p, *xo);
        if (op->norm_qkv_norm_rope_kv(m->be, xn, *x, nw, eps, y, w, kv, rows, nh, inv_freq, mscale, qw, kw, &r)) {
            tern__pending_taken(x, xo, p);
            return 1;
        }
    }
    if (p->on && !p->h2) return 0; /* refused with the plain fold: tern__pending_norm_op may still fold it */
    if (p->on) { /* an inner add (MoE layers), which the pre-norm ops do not fold: run it, then try without */
        p->on = 0;
        tern__pending_add(m, *x, p, rows->n, (int)w[0]->shape[w[0]->ndim - 1], eps);
    }
    return op->norm_qkv_norm_rope_kv(m->be, xn, *x, nw, eps, y, w, kv, rows, nh, inv_freq, mscale, qw, kw, NULL);
}
/* the pending add, now (before anything other than a pre-norm op reads x) */
static inline void tern__pending_flush(tern_model *m, float *x, tern_pending_res *p, int n, int d, float eps) {
    if (p->on) tern__pending_add(m, x, p, n, d, eps);
    p->on = 0;
}
/* y = act(x'·wᵀ) ⊙ v where x' is the residual stream *x after the pending add (Gemma 4's per-layer input gate): one
 * backend op where it can (ops.h matmul_act_mul), folding the pending add in (x' lands in *xo and the pointers swap,
 * as in tern__pending_norm_op), else the add, then the op or the matmul and the elementwise act·v. Either way *x holds
 * the same bits afterwards. */
static inline void tern__pending_matmul_act_mul(tern_model *m, float **x, float **xo, tern_pending_res *p, int n, int d,
                                                float eps, float *y, const tern_tensor *w, int act, const float *v) {
    const tern_backend_vt *op = m->be->vt;
    if (op->matmul_act_mul && p->on && *xo) {
        const tern_norm_res r = tern__pending_res(p, *xo);
        if (op->matmul_act_mul(m->be, y, *x, n, w, act, v, &r, eps)) {
            tern__pending_taken(x, xo, p);
            return;
        }
    }
    tern__pending_flush(m, *x, p, n, d, eps);
    if (op->matmul_act_mul && op->matmul_act_mul(m->be, y, *x, n, w, act, v, NULL, eps)) return;
    op->matmul(m->be, y, *x, n, w);
    tern__act_mul(m, y, y, v, (size_t)n * (size_t)w->shape[w->ndim - 2], act);
}
/* Gemma 4's per-layer input block: y = (act(x'·wgᵀ) ⊙ v)·wpᵀ, x' the residual stream *x after the pending add, v the
 * layer's column slice of the per-layer inputs (row r at v + r·ldv; pt [n, wg.out]: scratch for its copy, pg [n,
 * wg.out]: the gate's): many rows in one backend op where it can (ops.h ple_block, the add folded in: x' lands in *xo
 * and the pointers swap), else the gate (tern__pending_matmul_act_mul, on a copy of the slice when n > 1) and the
 * projection. Either way *x and y hold the same bits afterwards. */
static inline void tern__pending_ple(tern_model *m, float **x, float **xo, tern_pending_res *p, int n, int d, float eps,
                                     float *y, float *pg, float *pt, const tern_tensor *wg, const tern_tensor *wp, int act,
                                     const float *v, long ldv) {
    const tern_backend_vt *op = m->be->vt;
    if (op->ple_block && n > 1 && p->on && *xo) {
        const tern_norm_res r = tern__pending_res(p, *xo);
        if (op->ple_block(m->be, y, pg, *x, n, wg, wp, act, v, ldv, &r, eps)) {
            tern__pending_taken(x, xo, p);
            return;
        }
    }
    const int P = (int)wg->shape[wg->ndim - 2];
    if (n > 1) { /* the slice's rows made contiguous */
        op->copy_cols(m->be, pt, v, n, P, (int)ldv, 0);
        v = pt;
    }
    tern__pending_matmul_act_mul(m, x, xo, p, n, d, eps, pg, wg, act, v);
    op->matmul(m->be, y, pg, n, wp);
}
/* The MLP in one backend op where the backend runs it whole (ops.h norm_mlp; many rows only): y = glu(rmsnorm(x)·nw)
 * ·w[2]ᵀ (add = 0) or y += that (add = 1; y may be x: the pre-norm reads x before anything writes y), w = {gate, up,
 * down}. Returns 1 when done, 0 when the caller runs tern__norm_matmul_glu + the down matmul (never taken with add in
 * a tensor-parallel group, whose down products are summed before the add). */
static inline int tern__norm_mlp(tern_model *m, float *xn, const float *x, const float *nw, float eps, int n, float *y,
                                 int add, const tern_tensor *const *w, int act) {
    const tern_backend_vt *op = m->be->vt;
    return op->norm_mlp && n > 1 && !(add && op->allreduce_sum) &&
           op->norm_mlp(m->be, xn, x, nw, eps, n, y, add, w, act, NULL);
}
/* tern__pending_norm_op's glu (act >= 0) followed by the down projection y = h·w[2]ᵀ (h [n, I]: the glu product;
 * tmp: the unfused glu's scratch): many rows try the whole MLP as one op (ops.h norm_mlp), with the pending add
 * folded in where the backend can (then x' lands in *xo and the pointers swap, as in tern__pending_norm_op), else
 * after the add; one-row steps keep norm_matmul's fold. */
static inline void tern__pending_mlp(tern_model *m, float **x, float **xo, tern_pending_res *p, float *xn,
                                     const float *nw, float eps, int n, int d, float *y, float *h, float *tmp,
                                     const tern_tensor *const *w, int act) {
    if (m->be->vt->norm_mlp && n > 1) {
        if (p->on && *xo) {
            const tern_norm_res r = tern__pending_res(p, *xo);
            if (m->be->vt->norm_mlp(m->be, xn, *x, nw, eps, n, y, 0, w, act, &r)) {
                tern__pending_taken(x, xo, p);
                return;
            }
        }
        tern__pending_flush(m, *x, p, n, d, eps);
        if (tern__norm_mlp(m, xn, *x, nw, eps, n, y, 0, w, act)) return;
    }
    float *const ys[1] = {h};
    tern__pending_norm_op(m, x, xo, p, xn, nw, eps, n, d, 2, ys, w, act, tmp);
    m->be->vt->matmul(m->be, y, h, n, w[2]);
}
/* per-head q = rmsnorm(q)·qw, k = rmsnorm(k)·kw, v = rmsnorm(v), then rope + kv_write (Gemma 4): one launch
 * when the backend can (ops.h norm_rope_kv_write), else rmsnorm_n + rope_kv_write; bitwise the same */
static inline void tern__rope_kv_write(tern_model *m, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                       float *k, const float *v, int nh, const float *inv_freq, float mscale);
static inline void tern__norm_rope_kv_write(tern_model *m, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                            float *k, float *v, int nh, const float *inv_freq, float mscale,
                                            const float *qw, const float *kw, float eps) {
    const tern_backend_vt *op = m->be->vt;
    if (op->norm_rope_kv_write &&
        op->norm_rope_kv_write(m->be, kv, rows, q, k, v, nh, inv_freq, mscale, qw, kw, eps))
        return;
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    float *const ny[3] = {q, k, v};
    const float *const nx[3] = {q, k, v}, *const nw[3] = {qw, kw, NULL};
    const int nr[3] = {n * nh, n * nkv, n * nkv};
    tern__rmsnorm_n(m, 3, ny, nx, nr, d, nw, eps);
    tern__rope_kv_write(m, kv, rows, q, k, v, nh, inv_freq, mscale);
}
/* per head of d: q = rope(rmsnorm(q)·qw), nothing stored (a KV-shared layer's query, Gemma 4): ops.h norm_rope_kv_write
 * with k = v = NULL where the backend can, else rmsnorm + rope; bitwise the same */
static inline void tern__norm_rope_q(tern_model *m, const tern_kv_layer *kv, const tern_rows *rows, float *q, int nh,
                                     int d, const float *inv_freq, float mscale, const float *qw, float eps) {
    const tern_backend_vt *op = m->be->vt;
    if (op->norm_rope_kv_write && kv->head_dim == d &&
        op->norm_rope_kv_write(m->be, kv, rows, q, NULL, NULL, nh, inv_freq, mscale, qw, NULL, eps))
        return;
    op->rmsnorm(m->be, q, q, rows->n * nh, d, qw, eps);
    op->rope(m->be, q, rows->n, nh, d, rows->pos, inv_freq, mscale);
}
/* xn = rmsnorm(x)·nw, q|k|v = xn·{wq, wk, wv}ᵀ, then rope_kv_write: one launch for a decode row when the backend
 * can (ops.h norm_qkv_rope_kv; bitwise the same), for many rows one GEMM over joined weights where the backend
 * has that path (the CUDA bf16 mode under TERN_CUDA_QKV_ONE), else norm_matmul + rope_kv_write */
static inline void tern__norm_qkv_rope_kv(tern_model *m, float *xn, const float *x, const float *nw, float eps,
                                          float *q, float *k, float *v, const tern_tensor *wq, const tern_tensor *wk,
                                          const tern_tensor *wv, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                                          const float *inv_freq, float mscale) {
    const tern_backend_vt *op = m->be->vt;
    const tern_tensor *const ws[3] = {wq, wk, wv};
    if (op->norm_qkv_rope_kv && op->norm_qkv_rope_kv(m->be, xn, x, nw, eps, q, k, v, ws, kv, rows, nh, inv_freq, mscale))
        return;
    tern__norm_matmul_qkv(m, xn, x, nw, eps, rows->n, q, k, v, wq, wk, wv);
    tern__rope_kv_write(m, kv, rows, q, k, v, nh, inv_freq, mscale);
}
/* tern__norm_qkv_rope_kv, then tern__attention_o (y += wo·attention): one backend op where it can (ops.h
 * norm_qkv_attention_o; not in tensor-parallel groups, as attention_o), else the two */
static inline void tern__norm_qkv_attention_o(tern_model *m, float *xn, const float *x, const float *nw, float eps,
                                              float *q, float *k, float *v, const tern_tensor *wq,
                                              const tern_tensor *wk, const tern_tensor *wv, const tern_kv_layer *kv,
                                              const tern_rows *rows, int nh, const float *inv_freq, float mscale,
                                              float *y, float *att, float *o, float scale, float softcap,
                                              const tern_tensor *wo) {
    const tern_backend_vt *op = m->be->vt;
    const tern_tensor *const ws[3] = {wq, wk, wv};
    if (!op->allreduce_sum && op->norm_qkv_attention_o &&
        op->norm_qkv_attention_o(m->be, xn, x, nw, eps, q, k, v, ws, kv, rows, nh, inv_freq, mscale, y, att, scale,
                                 softcap, wo))
        return;
    tern__norm_qkv_rope_kv(m, xn, x, nw, eps, q, k, v, wq, wk, wv, kv, rows, nh, inv_freq, mscale);
    tern__attention_o(m, y, att, o, q, rows, nh, kv, scale, softcap, wo);
}
/* rope(q), rope(k) at rows->pos, then kv_write(k, v) */
static inline void tern__rope_kv_write(tern_model *m, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                       float *k, const float *v, int nh, const float *inv_freq, float mscale) {
    const tern_backend_vt *op = m->be->vt;
    if (op->rope_kv_write && op->rope_kv_write(m->be, kv, rows, q, k, v, nh, inv_freq, mscale)) return;
    op->rope(m->be, q, rows->n, nh, kv->head_dim, rows->pos, inv_freq, mscale);
    op->rope(m->be, k, rows->n, kv->n_head_kv, kv->head_dim, rows->pos, inv_freq, mscale);
    op->kv_write(m->be, kv, rows, k, v);
}

#endif
