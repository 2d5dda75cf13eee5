/*
 * glm5.h — what glm5.c (forward) and glm5_load.c (weights, scratch) share: the GLM-5 weight
 * and scratch layout. Internal to src/model.
 *
 * Per layer the attention keeps W_UK as uk [H, kv_lora, nope] (so q̃_h = uk[h]·qN_h is one
 * matmul_expert, or all heads at once through vt->glm->matmul_heads) and W_UV as uv [H, v, kv_lora]; both are mlx's embed_q / unembed_out as
 * stored, or are built once at load from HF's kv_b_proj [H·(nope+v), kv_lora] (exact copies
 * for float dtypes, dequantized to f32 for MLX-quantized ones) and owned here.
 */
#ifndef TERN_MODEL_GLM5_H
#define TERN_MODEL_GLM5_H

#include "model/internal.h"

typedef struct glm_layer {
    float *in_norm, *post_norm, *q_a_norm, *kv_a_norm;
    tern_tensor q_a, q_b, kv_a, o;
    tern_tensor uk, uv;
    void *uk_buf, *uv_buf;      /* owned when cut out of kv_b_proj */
    int dsa_full;
    tern_tensor idx_q, idx_k, idx_w;
    float *idx_norm_w, *idx_norm_b;
    int moe;
    tern_tensor gate, up, down; /* dense MLP, or the shared experts of a MoE layer */
    tern_tensor router, eg, eu, ed;
    float *bias;                /* e_score_correction_bias [E] */
} glm_layer;

typedef struct glm {
    tern_tensor embed, head;
    float *final_norm;
    glm_layer *L;
    float *inv;                 /* device [d_r/2] RoPE inverse frequencies */
    /* scratch [max_batch, ...] */
    float *x, *xn, *o, *cq, *q, *ckv, *lat, *ik, *iq, *iw, *qc, *ol, *ta, *tb, *att;
    float *gt, *up, *rl, *wts, *moe_scr;
    int32_t *idx, *sel;
    tern_out_head out;
} glm;

/* Shared-expert MLP width: the whole n_ff_expert * n_shared_experts, or a tensor-parallel
 * rank's slice of it (config n_ff_shared, set by tp.c). */
static inline int tern__glm5_shared_width(const tern_model_config *c) {
    return c->n_ff_shared > 0 ? c->n_ff_shared : c->n_ff_expert * c->n_shared_experts;
}

tern_status tern__glm5_load(tern_model *m, tern_weights *ws, tern_error *err);
void tern__glm5_free(tern_model *m);

#endif
