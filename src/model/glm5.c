/*
 * glm5.c — GLM-5 / 5.1 / 5.2 (`glm_moe_dsa`): MLA with a latent KV cache, DSA sparse
 * attention, grouped sigmoid MoE (reference/glm5.md §3–§4; transformers 5.17 is the oracle).
 *
 *   x = E[id]
 *   per layer: h = rms(x)
 *     cQ = rms(W_qa h, 1e-6);  q = W_qb cQ → per head [nope d_n ; rope d_r], rope on the slice
 *     [c ; kR] = W_kva h;  c = rms(c, 1e-6), kR = rope(kR)  → cache record [c ; kR] (+ indexer key)
 *     full layers: kI = rope-first(LayerNorm(W_k h)) → cache; when pos+1 > index_topk the
 *       indexer scores I[s] = Σ_j w_j·relu(q_j·kI_s/√d_i) pick the top-k keys (else: all keys)
 *     shared layers: reuse the last full layer's selection
 *     absorbed attention: q̃_h = W_UK[h]ᵀ qN_h;  s = scale·([q̃_h ; qR_h]·[c ; kR]);
 *       o_h = W_UV[h] Σ softmax(s)·c;   x += W_o concat(o_h)
 *     x += dense SwiGLU (first layers) or Σ routed experts (sigmoid + bias routing) + shared
 *   logits = lm_head(rms(x))
 * Tensor parallel (tp.c): a rank holds H/N heads (q_b rows, W_UK/W_UV, o_proj columns), its
 * experts and a slice of the dense / shared MLP; latent cache, DSA indexer and router are
 * replicated. Two all-reduces per layer: after o_proj, and after routed + shared are summed.
 * RoPE pairs adjacent elements (interleaved), in q, kR and the indexer alike. W_UK/W_UV come
 * from mlx's embed_q / unembed_out or are cut out of HF's kv_b_proj at load (glm5_load.c).
 * The latent form is used for prefill and decode alike (one code path, same sums).
 */
#include "model/glm5.h"

#include <math.h>
#include <stdlib.h>

static tern_status glm_forward(tern_model *m, const tern_batch *b, tern_kv *kv, const int *want, int n_want,
                               float *logits, tern_error *err) {
    (void)err;
    const tern_model_config *c = &m->cfg;
    const tern_backend_vt *op = m->be->vt;
    const tern_glm_ops *go = op->glm;
    tern_backend *be = m->be;
    glm *g = m->arch;
    int n = b->n, D = c->n_embd, H = c->n_head;
    int dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim, rkv = c->kv_lora_rank;
    int rq = c->q_lora_rank, dq = dn + dr, W = rkv + dr, ni = c->index_n_heads, di = c->index_head_dim;
    int K = c->index_topk, E = c->n_expert, k = c->n_expert_used;
    float eps = (float)c->norm_eps, meps = (float)c->mla_norm_eps, ms = (float)c->rope_mscale;
    tern_rows rows = {.n = n, .pos = m->d_pos, .slot = m->d_slot, .pos_host = b->pos, .slot_host = b->slot};
    int maxp = 0;
    for (int r = 0; r < n; r++) maxp = TERN_MAX(maxp, b->pos[r]);
    /* Any row beyond index_topk keys: DSA selects. Backends that record decode steps as graphs
     * always select once the cache can exceed K, so a recorded step stays valid as the context
     * grows (with <= K keys the selection is every key, in order: identical to dense). */
    int sparse = maxp + 1 > K || (op->graph_begin && tern_kv_max_ctx(kv) > K), have_sel = 0;
    tern_route_group rg = {.n_group = c->n_group, .topk_group = c->topk_group, .norm = c->norm_topk_prob,
                           .scaling = (float)c->routed_scaling_factor};

    if (b->tokens) op->embed(be, g->x, m->d_tokens, n, &g->embed, 1.0f);
    else op->scale(be, g->x, m->d_embd, 1.0f, (size_t)n * D);

    for (int l = 0; l < c->n_layer; l++) {
        const glm_layer *L = &g->L[l];
        const tern_kv_layer *kvl = tern_kv_view(kv, l);
        op->rmsnorm(be, g->xn, g->x, n, D, L->in_norm, eps);

        /* queries: [n, H, nope | rope] */
        op->matmul(be, g->cq, g->xn, n, &L->q_a);
        op->rmsnorm(be, g->cq, g->cq, n, rq, L->q_a_norm, meps);
        op->matmul(be, g->q, g->cq, n, &L->q_b);
        go->rope_interleaved(be, g->q, n, H, dq, dn, dr, m->d_pos, g->inv, ms);

        /* cache record [normalized latent | roped key] (+ the indexer key on full layers) */
        op->matmul(be, g->ckv, g->xn, n, &L->kv_a);
        go->copy_2d(be, g->lat, rkv, g->ckv, W, n, rkv);
        op->rmsnorm(be, g->lat, g->lat, n, rkv, L->kv_a_norm, meps);
        go->copy_2d(be, g->ckv, W, g->lat, rkv, n, rkv);
        go->rope_interleaved(be, g->ckv, n, 1, W, rkv, dr, m->d_pos, g->inv, ms);
        if (L->dsa_full) {
            op->matmul(be, g->ik, g->xn, n, &L->idx_k);
            go->layernorm(be, g->ik, g->ik, n, di, L->idx_norm_w, L->idx_norm_b, (float)c->index_norm_eps);
            go->rope_interleaved(be, g->ik, n, 1, di, 0, dr, m->d_pos, g->inv, ms);
        }
        go->kv_write_latent(be, kvl, &rows, g->ckv, L->dsa_full ? g->ik : NULL);

        /* DSA: this layer's selection (full) or the last full layer's (shared) */
        if (L->dsa_full) {
            have_sel = sparse;
            if (sparse) {
                op->matmul(be, g->iq, g->cq, n, &L->idx_q);
                go->rope_interleaved(be, g->iq, n, ni, di, 0, dr, m->d_pos, g->inv, ms);
                op->matmul(be, g->iw, g->xn, n, &L->idx_w);
                op->scale(be, g->iw, g->iw, 1.0f / sqrtf((float)ni), (size_t)n * ni);
                go->dsa_topk(be, g->sel, g->iq, g->iw, &rows, ni, kvl, 1.0f / sqrtf((float)di), K, NULL);
            }
        }

        /* absorbed query [n, H, q̃ (rkv) | qR (dr)]; per-head products in one call when the
         * backend has matmul_heads, else one matmul_expert per head */
        if (go->matmul_heads) go->matmul_heads(be, g->qc, H * W, W, g->q, H * dq, dq, n, H, &L->uk);
        else
            for (int h = 0; h < H; h++) {
                go->copy_2d(be, g->ta, dn, g->q + (size_t)h * dq, H * dq, n, dn);
                op->matmul_expert(be, g->tb, g->ta, n, &L->uk, h);
                go->copy_2d(be, g->qc + (size_t)h * W, H * W, g->tb, rkv, n, rkv);
            }
        go->copy_2d(be, g->qc + rkv, W, g->q + dn, dq, n * H, dr);
        go->attention_latent(be, g->ol, g->qc, &rows, H, kvl, rkv, (float)c->attn_scale, have_sel ? g->sel : NULL, K);
        if (go->matmul_heads) go->matmul_heads(be, g->att, H * dv, dv, g->ol, H * rkv, rkv, n, H, &L->uv);
        else
            for (int h = 0; h < H; h++) {
                go->copy_2d(be, g->ta, rkv, g->ol + (size_t)h * rkv, H * rkv, n, rkv);
                op->matmul_expert(be, g->tb, g->ta, n, &L->uv, h);
                go->copy_2d(be, g->att + (size_t)h * dv, H * dv, g->tb, dv, n, dv);
            }
        op->matmul(be, g->o, g->att, n, &L->o);
        tern_allreduce_add(be, g->x, g->o, (size_t)n * D); /* tensor parallel: x += sum of the ranks' heads */

        /* MLP: dense SwiGLU, or routed experts + shared experts, summed into o before the one
         * all-reduce (tensor parallel: each rank ran its experts and its slice of the MLP) */
        op->rmsnorm(be, g->xn, g->x, n, D, L->post_norm, eps);
        int I = L->moe ? tern__glm5_shared_width(c) : c->n_ff;
        if (L->moe) {
            op->matmul(be, g->rl, g->xn, n, &L->router);
            rg.bias = L->bias;
            go->route_group(be, g->idx, g->wts, g->rl, n, E, k, &rg);
            tern__moe_mlp(m, l, g->o, g->xn, n, D, g->idx, g->wts, k, &L->eg, &L->eu, &L->ed, TERN_ACT_SILU, g->moe_scr);
        }
        if (I > 0) {
            op->matmul(be, g->gt, g->xn, n, &L->gate);
            op->matmul(be, g->up, g->xn, n, &L->up);
            op->silu_mul(be, g->gt, g->gt, g->up, (size_t)n * I);
            op->matmul(be, L->moe ? g->xn : g->o, g->gt, n, &L->down); /* xn is free once gate/up ran */
            if (L->moe) op->add(be, g->o, g->o, g->xn, (size_t)n * D);
        }
        if (L->moe || I > 0) {
            tern_allreduce_add(be, g->x, g->o, (size_t)n * D);
        }
    }
    tern__out_head_logits(m, &g->out, g->x, want, n_want, g->final_norm, &g->head, logits);
    return TERN_OK;
}

const tern_arch_impl tern__glm5_impl = {"glm5", tern__glm5_load, glm_forward, tern__glm5_free};
