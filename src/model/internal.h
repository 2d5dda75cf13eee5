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
    /* device copies of the step's rows */
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
};

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

/* Device allocation owned by the model (freed with it). NULL + err on failure. */
void *tern__alloc(tern_model *m, size_t bytes, tern_error *err);
#define TERN_ALLOC_F(m, n, err) ((float *)tern__alloc((m), sizeof(float) * (size_t)(n), (err)))

/* Matrix [out, in] (F32/F16/BF16/Q): presence, shape, dtype checked; uploaded; counted. */
tern_status tern__load_matrix(tern_model *m, tern_weights *ws, const char *name, int64_t out, int64_t in,
                              tern_tensor *t, tern_error *err);
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
 * (the device scratch is capped at 64 MB of logits). */
typedef struct tern_out_head {
    float *xs, *logits;  /* device scratch [rows, H], [rows, V] */
    int rows;
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

#endif
