/*
 * gemma4.c — Gemma 4 text decoder (gemma4, gemma4_text, gemma4_unified), written to read like
 * reference/gemma4.md §4 / transformers' modeling_gemma4.py.
 *
 *   h = E[id]·√H                              (+ per-layer embeddings when P > 0)
 *   per layer: h += norm(o_proj(attn(rope(norm_q(q)), rope(norm_k(k)), norm0(v))))
 *              h += norm(mlp(norm(h)))         (MoE layers: dense MLP ∥ routed experts, 3 norms)
 *              h += norm(W_p · (gelu(W_g · h) ⊙ ple[l]))   (P > 0)
 *              h *= layer_scalar
 *   logits = softcap(E · norm(h))
 *
 * Attention scale is 1.0; sliding layers see the last W positions; KV-shared layers (the last
 * num_kv_shared_layers) compute only q and read the donor's cache; k_eq_v layers take V from
 * the raw K projection. Every per-layer quantity comes from cfg->layers[l] (config.c derives it).
 */
#include "model/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rows of the second residual buffer (at most the batch): steps of at most this many rows may fold the
 * post-norm adds into the next pre-norm op (ops.h norm_matmul / norm_mlp res; the CUDA backend folds one-row
 * steps into its GEMVs and batch decode steps into the pre-norm kernel of its GEMMs); longer prefill chunks run
 * rmsnorm_add launches */
#define G4_XR_ROWS 256

typedef struct g4_layer {
    float *in_norm, *post_attn_norm, *pre_ff_norm, *post_ff_norm; /* [H] */
    float *q_norm, *k_norm;                                       /* [D] */
    float *layer_scalar;                                          /* [1] */
    tern_tensor wq, wk, wv, wo, gate, up, down;
    /* MoE */
    float *router_scale, *per_expert_scale, *pre_ff2_norm, *post_ff1_norm, *post_ff2_norm;
    tern_tensor router, egate, eup, edown;
    /* PLE */
    tern_tensor ple_gate, ple_proj;
    float *post_ple_norm;
} g4_layer;

typedef struct g4 {
    tern_tensor embed, head, ple_embed, ple_model_proj;
    float *final_norm, *ple_proj_norm;
    g4_layer *L;
    float *inv_full, *inv_sliding;  /* device [D/2] */
    float mscale_full, mscale_sliding;
    /* scratch [max_batch, ...] */
    float *x, *xn, *o, *q, *k, *v, *att, *g, *u, *x2, *m2, *lg, *wts, *moe_scratch;
    float *xr; /* [xr_rows, H]: the other residual buffer when a post-norm add is folded into a pre-norm op */
    int xr_rows;
    int32_t *idx;
    float *ple, *pa, *pg, *pt;
    tern_out_head out;
} g4;

#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static tern_status load_layer(tern_model *m, tern_weights *ws, int l, g4_layer *L, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    const tern_layer_config *lc = &c->layers[l];
    int H = c->n_embd, D = lc->head_dim, nH = c->n_head, nKV = lc->n_head_kv, I = lc->n_ff;
    int shared = lc->kv_src != l;
    char n[160];
    tern_status s;
#define VEC(dst, len, ...) if ((s = tern__load_vec(m, ws, NAME(n, __VA_ARGS__), (len), 0, &(dst), err))) return s
#define MAT(dst, o, i, ...) if ((s = tern__load_matrix(m, ws, NAME(n, __VA_ARGS__), (o), (i), &(dst), err))) return s
#define STACK(dst, e, o, i, ...) if ((s = tern__load_stack(m, ws, NAME(n, __VA_ARGS__), (e), (o), (i), &(dst), err))) return s
    VEC(L->in_norm, H, "layers.%d.input_layernorm", l);
    VEC(L->post_attn_norm, H, "layers.%d.post_attention_layernorm", l);
    VEC(L->pre_ff_norm, H, "layers.%d.pre_feedforward_layernorm", l);
    VEC(L->post_ff_norm, H, "layers.%d.post_feedforward_layernorm", l);
    VEC(L->q_norm, D, "layers.%d.self_attn.q_norm", l);
    VEC(L->layer_scalar, 1, "layers.%d.layer_scalar", l);
    MAT(L->wq, (int64_t)nH * D, H, "layers.%d.self_attn.q_proj", l);
    L->wq.precise = 1; /* feeds the scale-1 attention logits (gemm.c) */
    MAT(L->wo, H, (int64_t)nH * D, "layers.%d.self_attn.o_proj", l);
    if (!shared) {
        VEC(L->k_norm, D, "layers.%d.self_attn.k_norm", l);
        MAT(L->wk, (int64_t)nKV * D, H, "layers.%d.self_attn.k_proj", l);
        L->wk.precise = 1;
        if (!lc->k_eq_v) MAT(L->wv, (int64_t)nKV * D, H, "layers.%d.self_attn.v_proj", l);
        /* q|k|v (or q|k) in one allocation: norm_qkv_norm_rope_kv's one GEMM (CUDA, many rows) */
        tern__join_weights(m, (tern_tensor *const[]){&L->wq, &L->wk, &L->wv}, lc->k_eq_v ? 2 : 3);
    } else {
        /* checkpoints keep K/V projections of KV-shared layers; they are unused */
        tern_weights_ignore(ws, NAME(n, "layers.%d.self_attn.k_", l));
        tern_weights_ignore(ws, NAME(n, "layers.%d.self_attn.v_", l));
    }
    MAT(L->gate, I, H, "layers.%d.mlp.gate_proj", l);
    MAT(L->up, I, H, "layers.%d.mlp.up_proj", l);
    MAT(L->down, H, I, "layers.%d.mlp.down_proj", l);
    if (lc->moe) {
        int E = c->n_expert, Ie = c->n_ff_expert;
        float *rs;
        VEC(rs, H, "layers.%d.router.scale", l);
        /* fold H^-1/2 into the router scale: z = norm0(r) · scale · H^-1/2 */
        float *host = malloc(sizeof(float) * (size_t)H);
        if (!host) return tern_err(err, TERN_ENOMEM, "out of memory");
        m->be->vt->download(m->be, host, rs, sizeof(float) * (size_t)H);
        float root = 1.0f / sqrtf((float)H);
        for (int i = 0; i < H; i++) host[i] *= root;
        m->be->vt->upload(m->be, rs, host, sizeof(float) * (size_t)H);
        free(host);
        L->router_scale = rs;
        VEC(L->per_expert_scale, E, "layers.%d.router.per_expert_scale", l);
        VEC(L->pre_ff2_norm, H, "layers.%d.pre_feedforward_layernorm_2", l);
        VEC(L->post_ff1_norm, H, "layers.%d.post_feedforward_layernorm_1", l);
        VEC(L->post_ff2_norm, H, "layers.%d.post_feedforward_layernorm_2", l);
        MAT(L->router, E, H, "layers.%d.router.proj", l);
        L->router.precise = 1; /* its logits pick the top-k experts (gemm.c): tiny, kept f32-accurate */
        STACK(L->egate, E, Ie, H, "layers.%d.experts.gate", l);
        STACK(L->eup, E, Ie, H, "layers.%d.experts.up", l);
        STACK(L->edown, E, H, Ie, "layers.%d.experts.down", l);
    }
    if (c->ple_dim > 0) {
        int P = c->ple_dim;
        MAT(L->ple_gate, P, H, "layers.%d.per_layer_input_gate", l);
        MAT(L->ple_proj, H, P, "layers.%d.per_layer_projection", l);
        VEC(L->post_ple_norm, H, "layers.%d.post_per_layer_input_norm", l);
    }
    return TERN_OK;
#undef VEC
#undef MAT
#undef STACK
}

static tern_status g4_load(tern_model *m, tern_weights *ws, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    int H = c->n_embd, V = c->n_vocab, N = c->n_layer, B = m->max_batch, P = c->ple_dim;
    g4 *g = calloc(1, sizeof *g);
    if (!g) return tern_err(err, TERN_ENOMEM, "out of memory");
    m->arch = g;
    g->L = calloc((size_t)N, sizeof *g->L);
    if (!g->L) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_status s;
    if ((s = tern__load_matrix(m, ws, "embed_tokens", V, H, &g->embed, err))) return s;
    if ((s = tern__load_vec(m, ws, "norm", H, 0, &g->final_norm, err))) return s;
    if ((s = tern__load_head(m, ws, &g->embed, &g->head, err))) return s;
    if (P > 0) {
        if ((s = tern__load_matrix(m, ws, "embed_tokens_per_layer", c->ple_vocab, (int64_t)N * P, &g->ple_embed, err))) return s;
        if ((s = tern__load_matrix(m, ws, "per_layer_model_projection", (int64_t)N * P, H, &g->ple_model_proj, err))) return s;
        if ((s = tern__load_vec(m, ws, "per_layer_projection_norm", P, 0, &g->ple_proj_norm, err))) return s;
    }
    int Dmax = 1, KVDmax = 1, Imax = 1;
    for (int l = 0; l < N; l++) {
        const tern_layer_config *lc = &c->layers[l];
        if ((s = load_layer(m, ws, l, &g->L[l], err))) return s;
        Dmax = TERN_MAX(Dmax, c->n_head * lc->head_dim);
        KVDmax = TERN_MAX(KVDmax, lc->n_head_kv * lc->head_dim);
        Imax = TERN_MAX(Imax, lc->n_ff);
    }
    /* rope tables: one per layer type (head dims are uniform within a type) */
    int Df = 0, Ds = 0;
    for (int l = 0; l < N; l++) {
        if (c->layers[l].type == TERN_LAYER_FULL) Df = c->layers[l].head_dim;
        else Ds = c->layers[l].head_dim;
    }
    float host[1024];
    if (Df) {
        if (Df / 2 > 1024) return tern_err(err, TERN_EUNSUPPORTED, "head_dim %d too large", Df);
        if ((s = tern__rope_inv_freq(&c->rope_full, Df, 0, host, &g->mscale_full, err))) return s;
        if (!(g->inv_full = tern__upload_f32(m, host, (size_t)Df / 2, err))) return TERN_ENOMEM;
    }
    if (Ds) {
        if (Ds / 2 > 1024) return tern_err(err, TERN_EUNSUPPORTED, "head_dim %d too large", Ds);
        if ((s = tern__rope_inv_freq(&c->rope_sliding, Ds, 0, host, &g->mscale_sliding, err))) return s;
        if (!(g->inv_sliding = tern__upload_f32(m, host, (size_t)Ds / 2, err))) return TERN_ENOMEM;
    }
    /* scratch */
    if ((s = tern__out_head_init(m, &g->out, err))) return s;
#define SCR(p, cnt) if (!((p) = TERN_ALLOC_F(m, (size_t)(cnt), err))) return TERN_ENOMEM
    SCR(g->x, (size_t)B * H); SCR(g->xn, (size_t)B * H); SCR(g->o, (size_t)B * H);
    g->xr_rows = B < G4_XR_ROWS ? B : G4_XR_ROWS;
    SCR(g->xr, (size_t)g->xr_rows * H);
    SCR(g->q, (size_t)B * Dmax); SCR(g->att, (size_t)B * Dmax);
    SCR(g->k, (size_t)B * KVDmax); SCR(g->v, (size_t)B * KVDmax);
    SCR(g->g, (size_t)B * Imax); SCR(g->u, (size_t)B * Imax);
   
    if (c->n_expert > 0) {
        int E = c->n_expert, K = c->n_expert_used;
        SCR(g->x2, (size_t)B * H); SCR(g->m2, (size_t)B * H); SCR(g->lg, (size_t)B * E); SCR(g->wts, (size_t)B * K);
        SCR(g->moe_scratch, (size_t)B * K * 2 * c->n_ff_expert);
        if (!(g->idx = tern__alloc(m, sizeof(int32_t) * (size_t)B * K, err))) return TERN_ENOMEM;
    }
    if (P > 0) {
        SCR(g->ple, (size_t)B * N * P); SCR(g->pa, (size_t)B * N * P); SCR(g->pg, (size_t)B * P); SCR(g->pt, (size_t)B * P);
    }
#undef SCR
    return TERN_OK;
}

static void g4_free(tern_model *m) {
    g4 *g = m->arch;
    if (!g) return;
    free(g->L);
    free(g);
    m->arch = NULL;
}

static tern_status g4_forward(tern_model *m, const tern_batch *b, tern_kv *kv, const int *want, int n_want,
                              float *logits, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    const tern_backend_vt *op = m->be->vt;
    tern_backend *be = m->be;
    g4 *g = m->arch;
    int n = b->n, H = c->n_embd, N = c->n_layer, P = c->ple_dim;
    float eps = (float)c->norm_eps;
    tern_rows rows = tern__step_rows(m, b);

    /* embeddings: h0 = E[id]·√H (f32 √H; bf16-rounded in the bf16 compute mode, as transformers) */
    float es = (float)c->embed_scale;
    if (be->compute == TERN_COMPUTE_BF16) es = tern_bf16_to_f32(tern_f32_to_bf16(es));
    /* the residual stream: x, or xr after a post-norm add was folded into a GEMV (they swap then) */
    float *x = g->x, *xo = n <= g->xr_rows ? g->xr : NULL;
    tern_pending_res pend = {0};
    if (b->tokens) op->embed(be, x, m->d_tokens, n, &g->embed, es);
    else op->scale(be, x, m->d_embd, 1.0f, (size_t)n * H);

    if (P > 0) {
        if (!b->tokens) return tern_err(err, TERN_EUNSUPPORTED, "gemma4: per-layer embeddings need token ids, not embedding rows");
        /* ple[t, l] = (norm(W_plmp·h0 · H^-1/2)[l] + E_ple[id][l]·√P) · 2^-1/2 */
        op->embed(be, g->pa, m->d_tokens, n, &g->ple_embed, sqrtf((float)P));
        op->matmul(be, g->ple, x, n, &g->ple_model_proj);
        op->scale(be, g->ple, g->ple, 1.0f / sqrtf((float)H), (size_t)n * N * P);
        op->rmsnorm(be, g->ple, g->ple, n * N, P, g->ple_proj_norm, eps);
        op->add(be, g->ple, g->ple, g->pa, (size_t)n * N * P);
        op->scale(be, g->ple, g->ple, 1.0f / sqrtf(2.0f), (size_t)n * N * P);
    }

    for (int l = 0; l < N; l++) {
        const tern_layer_config *lc = &c->layers[l];
        g4_layer *L = &g->L[l];
        int D = lc->head_dim, nH = c->n_head, nKV = lc->n_head_kv;
        int full = lc->type == TERN_LAYER_FULL;
        const float *inv = full ? g->inv_full : g->inv_sliding;
        float ms = full ? g->mscale_full : g->mscale_sliding;
        const tern_kv_layer *kvl = tern_kv_view(kv, l);

        /* (a) attention */
        int qkv = lc->kv_src == l && !lc->k_eq_v; /* q, k, v projections in one call */
        float *const ys[3] = {g->q, g->k, g->v};
        const tern_tensor *const ws[3] = {&L->wq, &L->wk, &L->wv}, *const ws_kv[3] = {&L->wq, &L->wk, NULL};
        /* many rows: the projections, head norms, rope and cache stores in one op where the backend has it (V = K:
         * the op's w[2] NULL) */
        int in_done = lc->kv_src == l && tern__pending_qkv_nrk(m, &x, &xo, &pend, g->xn, L->in_norm, eps, ys,
                                                               qkv ? ws : ws_kv, kvl, &rows, nH, inv, ms, L->q_norm,
                                                               L->k_norm);
        if (!in_done) { /* else the previous layer's last post-norm add folds in here when the backend can */
            tern__pending_norm_op(m, &x, &xo, &pend, g->xn, L->in_norm, eps, n, H, qkv ? 3 : 1, ys, ws, -1, NULL);
            if (lc->kv_src == l) { /* xn stays for k when k is its own matmul */
                if (lc->k_eq_v) { /* V = raw K projection */
                    op->matmul(be, g->k, g->xn, n, &L->wk);
                    op->scale(be, g->v, g->k, 1.0f, (size_t)n * nKV * D);
                }
                /* per-head norms of q, k and v (v without weight), rope q, k; cache k, v */
                tern__norm_rope_kv_write(m, kvl, &rows, g->q, g->k, g->v, nH, inv, ms, L->q_norm, L->k_norm, eps);
            } else { /* KV-shared: q's head norms and rope only */
                tern__norm_rope_q(m, kvl, &rows, g->q, nH, D, inv, ms, L->q_norm, eps);
            }
        }
        float scale = c->attn_scale > 0 ? (float)c->attn_scale : 1.0f / sqrtf((float)D);
        tern__attention_matmul(m, g->o, g->att, g->q, &rows, nH, kvl, scale, (float)c->attn_logit_softcap, &L->wo);
        tern_allreduce_sum(be, g->o, (size_t)n * H); /* tensor parallel: sum the ranks' heads */
        pend = (tern_pending_res){g->o, L->post_attn_norm, NULL, 1}; /* x += rmsnorm(o)·w, folded below */

        /* (b) feed-forward: dense MLP, and in MoE layers the routed experts beside it */
        {   /* down(gelu(rmsnorm(x)·gate)·up) */
            const tern_tensor *const ws[3] = {&L->gate, &L->up, &L->down};
            tern__pending_mlp(m, &x, &xo, &pend, g->xn, L->pre_ff_norm, eps, n, H, g->o, g->g, g->u, ws,
                              TERN_ACT_GELU_TANH);
        }
        tern_allreduce_sum(be, g->o, (size_t)n * H);
        float *h2 = NULL; /* the experts' output, its post-norm add onto o still to come (pending) */
        if (lc->moe) {
            int E = c->n_expert, K = c->n_expert_used;
            /* the dense branch's post-norm, the router's input norm0(r)·scale·H^-1/2 (into m2, free until the
             * experts write it) and the experts' pre-norm, the router and the top-k: one launch where the backend
             * serves norm_route_topk */
            float *ny[3] = {g->o, g->m2, g->x2};
            const float *nx[3] = {g->o, x, x}, *nw[3] = {L->post_ff1_norm, L->router_scale, L->pre_ff2_norm};
            tern__norm_route_topk(m, n, H, ny, nx, nw, eps, &L->router, g->lg, g->idx, g->wts, E, K,
                                  TERN_ROUTE_SOFTMAX_TOPK, L->per_expert_scale);
            tern__moe_mlp(m, l, g->m2, g->x2, n, H, g->idx, g->wts, K, &L->egate, &L->eup, &L->edown,
                        TERN_ACT_GELU_TANH, g->moe_scratch);
            tern_allreduce_sum(be, g->m2, (size_t)n * H); /* expert parallel: each rank ran its experts */
            /* o += rmsnorm(m2)·w: folded with the post-FFN add into the next op that takes the pending add where the
             * backend can (tern_pending_res h2; CUDA: that GEMV's prologue), a launch fewer a layer */
            h2 = g->m2;
        }
        /* the layer scalar (h *= layer_scalar) rides on the layer's last residual add, which the next
         * layer's q|k|v folds in (pending) */
        if (P > 0) {
            /* (c) per-layer input gate: pg = gelu(W_g·h) ⊙ ple[l] after h += norm(mlp), then o = W_proj·pg (one row:
             * the add and the gate's product in one launch where the backend can, ops.h matmul_act_mul; many rows: the
             * whole block in one op, ops.h ple_block) */
            pend = (tern_pending_res){g->o, L->post_ff_norm, NULL, 1, h2, L->post_ff2_norm};
            /* this layer's slice of ple: row r at ple + r·N·P + l·P (one row: contiguous) */
            tern__pending_ple(m, &x, &xo, &pend, n, H, eps, g->o, g->pg, g->pt, &L->ple_gate, &L->ple_proj,
                              TERN_ACT_GELU_TANH, g->ple + (size_t)l * P, (long)N * P);
            pend = (tern_pending_res){g->o, L->post_ple_norm, L->layer_scalar, 1};
        } else {
            pend = (tern_pending_res){g->o, L->post_ff_norm, L->layer_scalar, 1, h2, L->post_ff2_norm};
        }
    }
    tern__pending_flush(m, x, &pend, n, H, eps);

    /* logits for the requested rows, a chunk of rows at a time */
    tern__out_head_logits(m, &g->out, x, want, n_want, g->final_norm, &g->head, logits);
    return TERN_OK;
}

const tern_arch_impl tern__gemma4_impl = {"gemma4", g4_load, g4_forward, g4_free, 1};
