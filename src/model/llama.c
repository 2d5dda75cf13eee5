/*
 * llama.c — the Llama / Mistral / Qwen2 / Qwen3 dense decoder family.
 *
 *   h = E[id]
 *   per layer: x = norm(h); q,k,v = W·x (+bias: qwen2); qwen3: per-head norm of q and k;
 *              rope(q), rope(k) (default / linear / dynamic / llama3 / yarn);
 *              h += o_proj(attn(q, K, V)) with scale 1/√D (GQA; sliding window if configured)
 *              h += down(silu(gate(norm(h))) ⊙ up(norm(h)))
 *   logits = lm_head(norm(h))   (lm_head tied to E when tie_word_embeddings)
 */
#include "model/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct ll_layer {
    float *in_norm, *post_norm, *q_norm, *k_norm, *bq, *bk, *bv;
    tern_tensor wq, wk, wv, wo, gate, up, down;
} ll_layer;

typedef struct ll {
    tern_tensor embed, head;
    float *final_norm;
    ll_layer *L;
    float *inv;         /* device [D/2] */
    float *inv_host;
    float mscale;
    int inv_max_pos;    /* dynamic rope: largest position the table was built for */
    float *x, *xn, *o, *q, *k, *v, *att, *g, *u;
    tern_out_head out;
} ll;

#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static tern_status ll_load(tern_model *m, tern_weights *ws, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    int H = c->n_embd, V = c->n_vocab, N = c->n_layer, B = m->max_batch, nH = c->n_head;
    ll *g = calloc(1, sizeof *g);
    if (!g) return tern_err(err, TERN_ENOMEM, "out of memory");
    m->arch = g;
    if (!(g->L = calloc((size_t)N, sizeof *g->L))) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_status s;
    char n[160];
    if ((s = tern__load_matrix(m, ws, "embed_tokens", V, H, &g->embed, err))) return s;
    if ((s = tern__load_vec(m, ws, "norm", H, 0, &g->final_norm, err))) return s;
    if ((s = tern__load_head(m, ws, &g->embed, &g->head, err))) return s;
    int Dmax = 1, KVmax = 1, Imax = 1, D = 0;
    for (int l = 0; l < N; l++) {
        const tern_layer_config *lc = &c->layers[l];
        ll_layer *L = &g->L[l];
        int Dl = lc->head_dim, nKV = lc->n_head_kv, I = lc->n_ff;
        if (D && Dl != D) return tern_err(err, TERN_EUNSUPPORTED, "layer %d: head_dim %d differs from %d", l, Dl, D);
        D = Dl;
        Dmax = TERN_MAX(Dmax, nH * Dl);
        KVmax = TERN_MAX(KVmax, nKV * Dl);
        Imax = TERN_MAX(Imax, I);
#define VEC(dst, len, opt, ...) if ((s = tern__load_vec(m, ws, NAME(n, __VA_ARGS__), (len), (opt), &(dst), err))) return s
#define MAT(dst, o, i, ...) if ((s = tern__load_matrix(m, ws, NAME(n, __VA_ARGS__), (o), (i), &(dst), err))) return s
        VEC(L->in_norm, H, 0, "layers.%d.input_layernorm", l);
        VEC(L->post_norm, H, 0, "layers.%d.post_attention_layernorm", l);
        MAT(L->wq, (int64_t)nH * Dl, H, "layers.%d.self_attn.q_proj", l);
        MAT(L->wk, (int64_t)nKV * Dl, H, "layers.%d.self_attn.k_proj", l);
        /* no `precise` on q/k (unlike Gemma 4 / GLM): attention here is scaled by 1/sqrt(D), and the
         * bf16 mode runs them as plain bf16 GEMMs like transformers and llama.cpp (docs/MODELS.md) */
        MAT(L->wv, (int64_t)nKV * Dl, H, "layers.%d.self_attn.v_proj", l);
        MAT(L->wo, H, (int64_t)nH * Dl, "layers.%d.self_attn.o_proj", l);
        if (c->attention_bias) {
            VEC(L->bq, (int64_t)nH * Dl, 0, "layers.%d.self_attn.q_proj.bias", l);
            VEC(L->bk, (int64_t)nKV * Dl, 0, "layers.%d.self_attn.k_proj.bias", l);
            VEC(L->bv, (int64_t)nKV * Dl, 0, "layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->qk_norm) {
            VEC(L->q_norm, Dl, 0, "layers.%d.self_attn.q_norm", l);
            VEC(L->k_norm, Dl, 0, "layers.%d.self_attn.k_norm", l);
        }
        tern__join_weights(m, (tern_tensor *const[]){&L->wq, &L->wk, &L->wv}, 3); /* one GEMM for many rows (CUDA, TERN_CUDA_QKV_ONE) */
        MAT(L->gate, I, H, "layers.%d.mlp.gate_proj", l);
        MAT(L->up, I, H, "layers.%d.mlp.up_proj", l);
        MAT(L->down, H, I, "layers.%d.mlp.down_proj", l);
#undef VEC
#undef MAT
    }
    if (!(g->inv_host = malloc(sizeof(float) * (size_t)(D / 2 + 1)))) return tern_err(err, TERN_ENOMEM, "out of memory");
    if ((s = tern__rope_inv_freq(&c->rope_full, D, 0, g->inv_host, &g->mscale, err))) return s;
    if (!(g->inv = tern__upload_f32(m, g->inv_host, (size_t)D / 2, err))) return TERN_ENOMEM;
    if ((s = tern__out_head_init(m, &g->out, err))) return s;
#define SCR(p, cnt) if (!((p) = TERN_ALLOC_F(m, (size_t)(cnt), err))) return TERN_ENOMEM
    SCR(g->x, (size_t)B * H); SCR(g->xn, (size_t)B * H); SCR(g->o, (size_t)B * H);
    SCR(g->q, (size_t)B * Dmax); SCR(g->att, (size_t)B * Dmax);
    SCR(g->k, (size_t)B * KVmax); SCR(g->v, (size_t)B * KVmax);
    SCR(g->g, (size_t)B * Imax); SCR(g->u, (size_t)B * Imax);
   
#undef SCR
    return TERN_OK;
}

static void ll_free(tern_model *m) {
    ll *g = m->arch;
    if (!g) return;
    free(g->inv_host);
    free(g->L);
    free(g);
    m->arch = NULL;
}

static tern_status ll_forward(tern_model *m, const tern_batch *b, tern_kv *kv, const int *want, int n_want,
                              float *logits, tern_error *err) {
    const tern_model_config *c = &m->cfg;
    const tern_backend_vt *op = m->be->vt;
    tern_backend *be = m->be;
    ll *g = m->arch;
    int n = b->n, H = c->n_embd, N = c->n_layer, nH = c->n_head;
    float eps = (float)c->norm_eps;
    tern_rows rows = tern__step_rows(m, b);

    if (c->rope_full.type == TERN_ROPE_DYNAMIC) { /* the table depends on the sequence length */
        int maxp = 0;
        for (int r = 0; r < n; r++) maxp = TERN_MAX(maxp, b->pos[r]);
        if (maxp > g->inv_max_pos) {
            int D = c->layers[0].head_dim;
            tern_status s = tern__rope_inv_freq(&c->rope_full, D, maxp, g->inv_host, &g->mscale, err);
            if (s) return s;
            op->upload(be, g->inv, g->inv_host, sizeof(float) * (size_t)D / 2);
            g->inv_max_pos = maxp;
        }
    }
    if (b->tokens) op->embed(be, g->x, m->d_tokens, n, &g->embed, 1.0f);
    else op->scale(be, g->x, m->d_embd, 1.0f, (size_t)n * H);

    for (int l = 0; l < N; l++) {
        const tern_layer_config *lc = &c->layers[l];
        ll_layer *L = &g->L[l];
        int D = lc->head_dim, nKV = lc->n_head_kv;
        const tern_kv_layer *kvl = tern_kv_view(kv, l);
        float scale = c->attn_scale > 0 ? (float)c->attn_scale : 1.0f / sqrtf((float)D);
        if (!L->bq && !L->q_norm) {
            /* pre-norm, q|k|v, rope q, k; cache k, v (one launch for a CUDA decode row); x += o_proj(attention) */
            tern__norm_qkv_attention_o(m, g->xn, g->x, L->in_norm, eps, g->q, g->k, g->v, &L->wq, &L->wk, &L->wv, kvl,
                                       &rows, nH, g->inv, g->mscale, g->x, g->att, g->o, scale,
                                       (float)c->attn_logit_softcap, &L->wo);
        } else {
            tern__norm_matmul_qkv(m, g->xn, g->x, L->in_norm, eps, n, g->q, g->k, g->v, &L->wq, &L->wk, &L->wv);
            if (L->bq) {
                op->add_bias(be, g->q, L->bq, n, nH * D);
                op->add_bias(be, g->k, L->bk, n, nKV * D);
                op->add_bias(be, g->v, L->bv, n, nKV * D);
            }
            if (L->q_norm) {
                op->rmsnorm(be, g->q, g->q, n * nH, D, L->q_norm, eps);
                op->rmsnorm(be, g->k, g->k, n * nKV, D, L->k_norm, eps);
            }
            tern__rope_kv_write(m, kvl, &rows, g->q, g->k, g->v, nH, g->inv, g->mscale); /* rope q, k; cache k, v */
            /* x += o_proj(attention); tensor parallel: x += the sum of the ranks' heads */
            tern__attention_o(m, g->x, g->att, g->o, g->q, &rows, nH, kvl, scale, (float)c->attn_logit_softcap, &L->wo);
        }

        const tern_tensor *const mw[3] = {&L->gate, &L->up, &L->down};
        if (tern__norm_mlp(m, g->xn, g->x, L->post_norm, eps, n, g->x, 1, mw, TERN_ACT_SILU))
            continue; /* x += down(silu(rmsnorm(x)·gate)·up) in one op */
        tern__norm_matmul_glu(m, g->xn, g->x, L->post_norm, eps, n, g->g, g->u, &L->gate, &L->up,
                              TERN_ACT_SILU); /* silu(rmsnorm(x)·gate)·up */
        if (!tern__matmul_add(m, g->x, g->g, n, &L->down)) { /* x += down(...) */
            op->matmul(be, g->o, g->g, n, &L->down);
            tern_allreduce_add(be, g->x, g->o, (size_t)n * H);
        }
    }
    tern__out_head_logits(m, &g->out, g->x, want, n_want, g->final_norm, &g->head, logits);
    return TERN_OK;
}

const tern_arch_impl tern__llama_impl = {"llama", ll_load, ll_forward, ll_free, 1};
