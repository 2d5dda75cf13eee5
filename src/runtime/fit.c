/*
 * fit.c — memory accounting for `tern fit` and the engine's pool sizing (see fit.h), and the
 * GLM-5 geometry arithmetic (latent cache, routed-expert bytes per token per format) that
 * `tern fit` and `tern info` print; checked against reference/glm5.md §9 by test_runtime_glm.
 */
#include "runtime/fit.h"

#include "runtime/kv.h"

#include <string.h>

static int is_sliding(const tern_model_config *c, int l) {
    return c->layers[l].type == TERN_LAYER_SLIDING && c->sliding_window > 0;
}

size_t tern_fit_kv_pool(const tern_model_config *c, const tern_kv_fmt *formats, int ctx, int n_seq, int chunk, int bs) {
    if (ctx <= 0 || n_seq <= 0) return 0;
    if (bs <= 0) bs = 16;
    int64_t nb[2];
    tern_kv_pool_blocks(c->sliding_window, bs, ctx, n_seq, chunk, nb);
    size_t b = 0;
    for (int l = 0; l < c->n_layer; l++)
        b += tern_kv_layer_bytes_per_token(c, formats, l) * (size_t)bs * (size_t)nb[is_sliding(c, l)];
    return b;
}

size_t tern_fit_seq_kv(const tern_model_config *c, const tern_kv_fmt *formats, int n, int chunk, int bs) {
    return tern_fit_kv_pool(c, formats, n, 1, chunk, bs);
}

/* Most sequences of ctx tokens whose pool fits `avail` bytes (0 when none; at most 1e9). */
static int most_seqs(const tern_model_config *c, const tern_kv_fmt *formats, int ctx, int chunk, int bs, size_t avail) {
    enum { CAP = 1000000000 };
    if (!tern_fit_kv_pool(c, formats, ctx, 1, chunk, bs)) return 0;
    int lo = 0, hi = 1;   /* pool(lo) fits (or lo = 0); pool(hi) does not, once the doubling stops */
    while (tern_fit_kv_pool(c, formats, ctx, hi, chunk, bs) <= avail) {
        lo = hi;
        if (hi == CAP) return CAP;
        hi = hi > CAP / 2 ? CAP : 2 * hi;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (tern_fit_kv_pool(c, formats, ctx, mid, chunk, bs) <= avail) lo = mid;
        else hi = mid;
    }
    return lo;
}

size_t tern_fit_scratch(const tern_model_config *c, int B, int n_slots) {
    size_t H = (size_t)c->n_embd, V = (size_t)c->n_vocab, Dmax = 0, KVmax = 0, Imax = (size_t)c->n_ff;
    for (int l = 0; l < c->n_layer; l++) {
        const tern_layer_config *lc = &c->layers[l];
        Dmax = TERN_MAX(Dmax, (size_t)c->n_head * (size_t)lc->head_dim);
        KVmax = TERN_MAX(KVmax, (size_t)lc->n_head_kv * (size_t)lc->head_dim);
        Imax = TERN_MAX(Imax, (size_t)lc->n_ff);
    }
    size_t rows = (size_t)TERN_MAX(B, 1);
    size_t logit_rows = TERN_MAX((size_t)1, TERN_MIN(rows, ((size_t)64 << 20) / (V * 4 + 1)));
    /* x, xn, o, embd [B,H]; q, att [B, nH*D]; k, v [B, nKV*D]; gate, up [B, I]; logits rows */
    size_t f = rows * (4 * H + 2 * Dmax + 2 * KVmax + 2 * Imax) + logit_rows * (H + V);
    if (c->n_expert > 0)
        f += rows * (2 * H + (size_t)c->n_expert + 2 * (size_t)c->n_expert_used * (1 + (size_t)c->n_ff_expert));
    if (c->ple_dim > 0) f += rows * ((size_t)c->n_layer * (size_t)c->ple_dim * 2 + 2 * (size_t)c->ple_dim);
    if (c->arch == TERN_ARCH_GLM5) { /* glm5_load.c scratch: q, latent queries/outputs, indexer, MoE */
        size_t Hh = (size_t)c->n_head, rkv = (size_t)c->kv_lora_rank, dr = (size_t)c->qk_rope_head_dim;
        f += rows * ((size_t)c->q_lora_rank + Hh * ((size_t)c->qk_nope_head_dim + dr) + 2 * (rkv + dr) +
                     Hh * (rkv + dr) + Hh * rkv + Hh * (size_t)c->v_head_dim + (size_t)c->index_n_heads *
                     ((size_t)c->index_head_dim + 1) + (size_t)c->index_head_dim + (size_t)c->index_topk +
                     2 * (size_t)c->n_ff_expert * (size_t)TERN_MAX(c->n_shared_experts, 1));
    }
    return f * sizeof(float) + (size_t)TERN_MAX(n_slots, 1) * V * sizeof(float) + rows * 16;
}

double tern_fit_bytes_per_weight(int q) {
    switch (q) {
    case TERN_FIT_Q8: return 1.0 + 4.0 / 64;
    case TERN_FIT_Q4: return 0.5 + 4.0 / 64;
    case TERN_FIT_FP8: return 1.0 + 4.0 / (128.0 * 128.0);
    default: return 2.0;
    }
}

const char *tern_fit_quant_name(int q) {
    static const char *n[TERN_FIT_NQ] = {"bf16", "mlx-q8g64", "mlx-q4g64", "fp8-b128"};
    return q >= 0 && q < TERN_FIT_NQ ? n[q] : "?";
}

/* GLM-5 matrices: *lin = linear weights (quantizable), *emb = embed + head + routers (stay bf16 in FP8
 * checkpoints), *vec = norm vectors / biases; *act = weights read per token. */
static void glm_params(const tern_model_config *c, double *lin, double *emb, double *vec, double *act) {
    double D = c->n_embd, V = c->n_vocab, H = c->n_head, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    double dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    double ni = c->index_n_heads, di = c->index_head_dim, E = c->n_expert, k = c->n_expert_used;
    double Im = c->n_ff_expert, Is = Im * c->n_shared_experts;
    *lin = 0, *emb = V * D * (c->tie_embeddings ? 1 : 2), *vec = D, *act = V * D;
    for (int l = 0; l < c->n_layer; l++) {
        double at = D * rq + rq * H * (dn + dr) + D * (rkv + dr) + rkv * H * (dn + dv) + H * dv * D;
        if (c->layers[l].dsa_full) at += rq * ni * di + D * di + D * ni, *vec += 2 * di;
        *vec += 2 * D + rq + rkv;
        *lin += at;
        *act += at;
        if (c->layers[l].moe) {
            *lin += (E + c->n_shared_experts) * 3 * D * Im;
            *emb += D * E;
            *vec += E;
            *act += (k * 3 * D * Im) + 3 * D * Is + D * E;
        } else {
            *lin += 3 * D * c->n_ff;
            *act += 3 * D * c->n_ff;
        }
    }
}

int tern_fit_glm_geometry(const tern_model_config *c, tern_fit_glm *g) {
    memset(g, 0, sizeof *g);
    if (c->arch != TERN_ARCH_GLM5) return 0;
    g->n_layer = c->n_layer;
    for (int l = 0; l < c->n_layer; l++) {
        g->n_full_indexer += c->layers[l].dsa_full;
        g->n_moe += c->layers[l].moe;
        g->latent_token += (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * sizeof(float);
        if (c->layers[l].dsa_full) g->indexer_token += (size_t)c->index_head_dim * sizeof(float);
    }
    g->expert_params = 3.0 * c->n_embd * c->n_ff_expert;
    for (int q = 0; q < TERN_FIT_NQ; q++)
        g->expert_token[q] = (double)g->n_moe * c->n_expert_used * g->expert_params * tern_fit_bytes_per_weight(q);
    double lin, emb, vec, act;
    glm_params(c, &lin, &emb, &vec, &act);
    g->params_total = lin + emb + vec;
    g->params_active = act;
    return 1;
}

/* weights in embedding tables: the token embedding and Gemma 4's per-layer input table */
static double embed_weights(const tern_model_config *c) {
    double e = (double)c->n_vocab * c->n_embd;
    if (c->ple_dim > 0) e += (double)(c->ple_vocab > 0 ? c->ple_vocab : c->n_vocab) * c->n_layer * c->ple_dim;
    return e;
}

void tern_fit_embed_estimate(const tern_model_config *c, int bits, int group, size_t *emb, size_t *head) {
    const double per = bits > 0 ? bits / 8.0 + 4.0 / (group > 0 ? group : 64) : 2.0;
    *emb = (size_t)(embed_weights(c) * per);
    *head = c->tie_embeddings ? 0 : (size_t)((double)c->n_vocab * c->n_embd * per);
}

size_t tern_fit_weight_estimate(const tern_model_config *c, int bits, int group) {
    if (c->arch == TERN_ARCH_GLM5) {
        double lin, emb, vec, act;
        glm_params(c, &lin, &emb, &vec, &act);
        if (bits < 0) return (size_t)(lin * tern_fit_bytes_per_weight(TERN_FIT_FP8) + emb * 2 + vec * 4);
        double per = bits ? bits / 8.0 + 4.0 / (group > 0 ? group : 64) : 2.0;
        return (size_t)((lin + emb) * per + vec * 4);
    }
    if (bits < 0) bits = 8, group = 128 * 128 * 2; /* FP8 elsewhere: ~1 byte per weight */
    double per = bits ? bits / 8.0 + 4.0 / (group > 0 ? group : 64) : 2.0; /* bytes per matrix weight */
    double H = c->n_embd, V = c->n_vocab, w = 0, vec = 0;
    w += embed_weights(c) + (c->tie_embeddings ? 0 : V * H); /* embeddings, lm_head */
    vec += H;                                             /* final norm */
    if (c->ple_dim > 0) {                                 /* Gemma 4 per-layer input projections */
        double P = c->ple_dim, L = c->n_layer;
        w += H * L * P + L * 2 * H * P;
    }
    for (int l = 0; l < c->n_layer; l++) {
        const tern_layer_config *lc = &c->layers[l];
        double D = lc->head_dim, q = (double)c->n_head * D, kv = (double)lc->n_head_kv * D;
        w += H * q + q * H;                               /* q_proj, o_proj */
        if (lc->kv_src == l) w += H * kv * (lc->k_eq_v ? 1 : 2);
        if (lc->n_ff > 0) w += 3 * H * lc->n_ff;          /* gate, up, down */
        if (lc->moe && c->n_expert > 0) w += (double)c->n_expert * 3 * H * c->n_ff_expert + H * c->n_expert;
        vec += 6 * H + 2 * D;                             /* norms, q/k norms */
    }
    return (size_t)(w * per + vec * 4);
}

tern_status tern_fit_plan(const tern_model_config *c, const tern_kv_fmt *formats, size_t weight_bytes,
                          const tern_fit_opts *o, tern_fit *f, tern_error *err) {
    memset(f, 0, sizeof *f);
    int ctx = o && o->ctx > 0 ? o->ctx : TERN_MIN(c->n_ctx_train > 0 ? c->n_ctx_train : 4096, 8192);
    f->ctx = ctx;
    f->max_concurrency = o && o->max_concurrency > 0 ? o->max_concurrency : 8;
    f->max_batch_tokens = o && o->max_batch_tokens > 0 ? o->max_batch_tokens : 512;
    f->block_size = o && o->block_size > 0 ? o->block_size : 16;
    double budget = o ? o->budget_gb : 0;
    if (!(budget >= 0 && budget < 1e6)) return tern_err(err, TERN_EINVAL, "fit: memory budget %g GB is not a size", budget);
    f->window = c->sliding_window;
    for (int l = 0; l < c->n_layer; l++) {
        size_t t = tern_kv_layer_bytes_per_token(c, formats, l);
        if (c->layers[l].kv_src != l) f->n_shared++;
        else if (is_sliding(c, l)) { f->n_sliding++; f->kv_token_sliding += t; }
        else { f->n_full++; f->kv_token_full += t; }
    }
    f->weight_bytes = weight_bytes;
    f->kv_seq = tern_fit_seq_kv(c, formats, ctx, f->max_batch_tokens, f->block_size);
    f->kv_total = tern_fit_kv_pool(c, formats, ctx, f->max_concurrency, f->max_batch_tokens, f->block_size);
    f->scratch = tern_fit_scratch(c, f->max_batch_tokens, f->max_concurrency);
    f->device_fixed = o ? o->device_fixed : 0;
    f->device_context = o ? o->device_context : 0;
    f->total = f->weight_bytes + f->scratch + f->device_fixed + f->device_context + f->kv_total;
    f->fits = 1;
    if (budget > 0) {
        double b = budget * 1073741824.0, fixed = (double)f->weight_bytes + (double)f->scratch + (double)f->device_fixed +
                                     (double)f->device_context;
        f->kv_avail = b > fixed ? (size_t)(b - fixed) : 0;
        f->fits = (double)f->total <= b;
        /* the pool is not linear in the sequences (the sliding chunk is shared): search both */
        f->max_conc = most_seqs(c, formats, ctx, f->max_batch_tokens, f->block_size, f->kv_avail);
        int hi = TERN_MAX(c->n_ctx_train, ctx), lo = 0;   /* longest ctx with C sequences */
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            if (tern_fit_kv_pool(c, formats, mid, f->max_concurrency, f->max_batch_tokens, f->block_size) <= f->kv_avail) lo = mid;
            else hi = mid - 1;
        }
        f->max_ctx = lo;
    }
    return TERN_OK;
}
