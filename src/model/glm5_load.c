/*
 * glm5_load.c — GLM-5 weights and scratch (the forward pass is in glm5.c).
 *
 * Names are the canonical ones of io/weights.h: HF checkpoints (`self_attn.kv_b_proj`,
 * per-expert `mlp.experts.{e}.*`) and mlx-lm conversions (`self_attn.embed_q` /
 * `unembed_out`, `mlp.switch_mlp.*`) both load. Every tensor is checked for shape before
 * anything runs. Tolerated extras: indexer tensors on "shared" layers (some third-party
 * GLM-5.2 files carry them) and the MTP layer `layers.{num_hidden_layers}.*` (transformers
 * ignores it too). A backend without the GLM ops (vt->glm) is refused with
 * TERN_EUNSUPPORTED before any weight is touched.
 */
#include "model/glm5.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static int ops_complete(const tern_glm_ops *g) {
    return g && g->copy_2d && g->layernorm && g->rope_interleaved && g->kv_write_latent && g->dsa_topk &&
           g->attention_latent && g->route_group;
}

/* Cut W_UK (as uk [H, rkv, dn]) and W_UV (uv [H, dv, rkv]) out of kv_b_proj [H·(dn+dv), rkv]. */
static tern_status split_kv_b(tern_model *m, const tern_tensor *w, glm_layer *L, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    int H = c->n_head, dn = c->qk_nope_head_dim, dv = c->v_head_dim, rkv = c->kv_lora_rank;
    int q = w->dtype == TERN_DT_Q || tern_tensor_is_fp8_block(w); /* quantized: split dequantized, f32 */
    tern_dtype dt = q ? TERN_DT_F32 : w->dtype;
    size_t es = tern_dtype_size(dt), rb = tern_tensor_row_bytes(w);
    L->uk_buf = malloc((size_t)H * rkv * dn * es);
    L->uv_buf = malloc((size_t)H * dv * rkv * es);
    float *row = malloc(sizeof(float) * (size_t)rkv);
    if (!L->uk_buf || !L->uv_buf || !row) { free(row); return tern_err(err, TERN_ENOMEM, "out of memory for kv_b_proj"); }
    for (int h = 0; h < H; h++)
        for (int i = 0; i < dn + dv; i++) {
            int64_t r = (int64_t)h * (dn + dv) + i;
            const char *src = (const char *)w->data + (size_t)r * rb;
            if (q) tern_tensor_row_f32(w, r, row), src = (const char *)row;
            for (int cc = 0; cc < rkv; cc++) {
                char *dst = i < dn ? (char *)L->uk_buf + (((size_t)h * rkv + cc) * dn + i) * es
                                   : (char *)L->uv_buf + (((size_t)h * dv + (i - dn)) * rkv + cc) * es;
                memcpy(dst, src + (size_t)cc * es, es);
            }
        }
    free(row);
    tern_tensor *t[2] = {&L->uk, &L->uv};
    int64_t sh[2][3] = {{H, rkv, dn}, {H, dv, rkv}};
    void *buf[2] = {L->uk_buf, L->uv_buf};
    for (int j = 0; j < 2; j++) {
        memset(t[j], 0, sizeof *t[j]);
        t[j]->dtype = dt;
        t[j]->ndim = 3;
        memcpy(t[j]->shape, sh[j], sizeof sh[j]);
        t[j]->data = buf[j];
        t[j]->name = w->name;
        t[j]->device = -1;
        tern_status s = m->be->vt->upload_weight(m->be, t[j], err);
        if (s) return tern_err_wrap(err, s, "uploading the split of '%s'", w->name ? w->name : "kv_b_proj");
    }
    m->stats.n_params += (int64_t)H * (dn + dv) * rkv;
    return TERN_OK;
}

tern_status tern__glm5_load(tern_model *m, tern_weights *ws, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    if (!ops_complete(m->be->vt->glm))
        return tern_err(err, TERN_EUNSUPPORTED, "glm_moe_dsa (GLM-5) needs the MLA/DSA kernels, which the %s backend "
                        "does not have yet (use --device cpu)", m->be->vt->name);
    int D = c->n_embd, V = c->n_vocab, H = c->n_head, B = m->max_batch;
    int dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim, rkv = c->kv_lora_rank;
    int rq = c->q_lora_rank, dq = dn + dr, W = rkv + dr, ni = c->index_n_heads, di = c->index_head_dim;
    int E = c->n_expert, k = c->n_expert_used, Im = c->n_ff_expert, Is = tern__glm5_shared_width(c);
    glm *g = calloc(1, sizeof *g);
    if (!g) return tern_err(err, TERN_ENOMEM, "out of memory");
    m->arch = g;
    if (!(g->L = calloc((size_t)c->n_layer, sizeof *g->L))) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_status s;
    char n[192];
    if ((s = tern__load_matrix(m, ws, "embed_tokens", V, D, &g->embed, err))) return s;
    if ((s = tern__load_vec(m, ws, "norm", D, 0, &g->final_norm, err))) return s;
    if ((s = tern__load_head(m, ws, &g->embed, &g->head, err))) return s;
    tern_weights_ignore(ws, NAME(n, "layers.%d.", c->n_layer)); /* the MTP layer */
    int Imax = 1;
    for (int l = 0; l < c->n_layer; l++) {
        glm_layer *L = &g->L[l];
        L->dsa_full = c->layers[l].dsa_full;
        L->moe = c->layers[l].moe;
#define VEC(dst, len, ...) if ((s = tern__load_vec(m, ws, NAME(n, __VA_ARGS__), (len), 0, &(dst), err))) return s
#define MAT(dst, o, i, ...) if ((s = tern__load_matrix(m, ws, NAME(n, __VA_ARGS__), (o), (i), &(dst), err))) return s
#define STK(dst, o, i, ...) if ((s = tern__load_stack(m, ws, NAME(n, __VA_ARGS__), E, (o), (i), &(dst), err))) return s
        VEC(L->in_norm, D, "layers.%d.input_layernorm", l);
        VEC(L->post_norm, D, "layers.%d.post_attention_layernorm", l);
        MAT(L->q_a, rq, D, "layers.%d.self_attn.q_a_proj", l);
        VEC(L->q_a_norm, rq, "layers.%d.self_attn.q_a_layernorm", l);
        MAT(L->q_b, (int64_t)H * dq, rq, "layers.%d.self_attn.q_b_proj", l);
        MAT(L->kv_a, W, D, "layers.%d.self_attn.kv_a_proj_with_mqa", l);
        L->q_a.precise = L->q_b.precise = L->kv_a.precise = 1; /* feed the attention logits (gemm.c) */
        VEC(L->kv_a_norm, rkv, "layers.%d.self_attn.kv_a_layernorm", l);
        MAT(L->o, D, (int64_t)H * dv, "layers.%d.self_attn.o_proj", l);
        int64_t shk[3] = {H, rkv, dn};
        int has = tern_weights_try(ws, NAME(n, "layers.%d.self_attn.embed_q", l), 3, shk, &L->uk, err);
        if (has < 0) return (tern_status)has;
        if (has) { /* mlx-lm layout: [H, rkv, dn] and [H, dv, rkv] as stored */
            if ((s = tern__load_stack(m, ws, NAME(n, "layers.%d.self_attn.embed_q", l), H, rkv, dn, &L->uk, err))) return s;
            if ((s = tern__load_stack(m, ws, NAME(n, "layers.%d.self_attn.unembed_out", l), H, dv, rkv, &L->uv, err))) return s;
        } else {
            tern_tensor kvb;
            int64_t sh[2] = {(int64_t)H * (dn + dv), rkv};
            if ((s = tern_weights_get(ws, NAME(n, "layers.%d.self_attn.kv_b_proj", l), 2, sh, &kvb, err))) return s;
            if ((s = split_kv_b(m, &kvb, L, err))) return s;
        }
        if (L->dsa_full) {
            MAT(L->idx_q, (int64_t)ni * di, rq, "layers.%d.self_attn.indexer.wq_b", l);
            MAT(L->idx_k, di, D, "layers.%d.self_attn.indexer.wk", l);
            MAT(L->idx_w, ni, D, "layers.%d.self_attn.indexer.weights_proj", l);
            L->idx_q.precise = L->idx_k.precise = L->idx_w.precise = 1;
            VEC(L->idx_norm_w, di, "layers.%d.self_attn.indexer.k_norm", l);
            VEC(L->idx_norm_b, di, "layers.%d.self_attn.indexer.k_norm.bias", l);
        } else {
            tern_weights_ignore(ws, NAME(n, "layers.%d.self_attn.indexer.", l));
        }
        if (L->moe) {
            MAT(L->router, E, D, "layers.%d.mlp.gate", l);
            L->router.precise = 1; /* its logits pick the top-k experts (gemm.c) */
            VEC(L->bias, E, "layers.%d.mlp.gate.e_score_correction_bias", l);
            STK(L->eg, Im, D, "layers.%d.experts.gate", l);
            STK(L->eu, Im, D, "layers.%d.experts.up", l);
            STK(L->ed, D, Im, "layers.%d.experts.down", l);
            if (Is > 0) {
                MAT(L->gate, Is, D, "layers.%d.mlp.shared_experts.gate_proj", l);
                MAT(L->up, Is, D, "layers.%d.mlp.shared_experts.up_proj", l);
                MAT(L->down, D, Is, "layers.%d.mlp.shared_experts.down_proj", l);
            }
            Imax = TERN_MAX(Imax, Is);
        } else {
            MAT(L->gate, c->n_ff, D, "layers.%d.mlp.gate_proj", l);
            MAT(L->up, c->n_ff, D, "layers.%d.mlp.up_proj", l);
            MAT(L->down, D, c->n_ff, "layers.%d.mlp.down_proj", l);
            Imax = TERN_MAX(Imax, c->n_ff);
        }
#undef VEC
#undef MAT
#undef STK
    }
    float inv[4096], mscale;
    if (dr / 2 > (int)TERN_ARRAY_LEN(inv)) return tern_err(err, TERN_EUNSUPPORTED, "qk_rope_head_dim %d too large", dr);
    if ((s = tern__rope_inv_freq(&c->rope_full, dr, 0, inv, &mscale, err))) return s;
    if (!(g->inv = tern__upload_f32(m, inv, (size_t)dr / 2, err))) return TERN_ENOMEM;
    if ((s = tern__out_head_init(m, &g->out, err))) return s;
    size_t b = (size_t)B;
#define SCR(p, cnt) if (!((p) = TERN_ALLOC_F(m, (size_t)(cnt), err))) return TERN_ENOMEM
    SCR(g->x, b * D); SCR(g->xn, b * D); SCR(g->o, b * D); SCR(g->cq, b * rq); SCR(g->q, b * H * dq);
    SCR(g->ckv, b * W); SCR(g->lat, b * rkv); SCR(g->ik, b * di); SCR(g->iq, b * ni * di); SCR(g->iw, b * ni);
    SCR(g->qc, b * H * W); SCR(g->ol, b * H * rkv); SCR(g->ta, b * TERN_MAX(dn, rkv)); SCR(g->tb, b * TERN_MAX(rkv, dv));
    SCR(g->att, b * H * dv); SCR(g->gt, b * Imax); SCR(g->up, b * Imax); SCR(g->rl, b * E); SCR(g->wts, b * k);
    SCR(g->moe_scr, b * k * 2 * (size_t)Im);
#undef SCR
    if (!(g->idx = tern__alloc(m, sizeof(int32_t) * b * k, err))) return TERN_ENOMEM;
    if (!(g->sel = tern__alloc(m, sizeof(int32_t) * b * (size_t)c->index_topk, err))) return TERN_ENOMEM;
    return TERN_OK;
}

void tern__glm5_free(tern_model *m) {
    glm *g = m->arch;
    if (!g) return;
    for (int l = 0; g->L && l < m->cfg.n_layer; l++) {
        glm_layer *L = &g->L[l];
        if (L->uk_buf && m->be->vt->free_weight) { m->be->vt->free_weight(m->be, &L->uk); m->be->vt->free_weight(m->be, &L->uv); }
        free(L->uk_buf);
        free(L->uv_buf);
    }
    free(g->L);
    free(g);
    m->arch = NULL;
}
