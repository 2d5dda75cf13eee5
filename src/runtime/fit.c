/*
 * fit.c — memory accounting for `tern fit` and the engine's pool sizing (see fit.h).
 */
#include "runtime/fit.h"

#include "runtime/kv.h"

#include <string.h>

static int is_sliding(const tern_model_config *c, int l) {
    return c->layers[l].type == TERN_LAYER_SLIDING && c->sliding_window > 0;
}

size_t tern_fit_seq_kv(const tern_model_config *c, const tern_kv_fmt *formats, int n, int chunk, int bs) {
    if (n <= 0) return 0;
    if (bs <= 0) bs = 16;
    size_t blocks = ((size_t)n + (size_t)bs - 1) / (size_t)bs;
    size_t wblocks = ((size_t)c->sliding_window + (size_t)bs - 1) / (size_t)bs + 1 + ((size_t)TERN_MAX(chunk, 1) + (size_t)bs - 1) / (size_t)bs;
    size_t b = 0;
    for (int l = 0; l < c->n_layer; l++) {
        size_t t = tern_kv_layer_bytes_per_token(c, formats, l);
        b += t * (size_t)bs * (is_sliding(c, l) ? TERN_MIN(blocks, wblocks) : blocks);
    }
    return b;
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
    return f * sizeof(float) + (size_t)TERN_MAX(n_slots, 1) * V * sizeof(float) + rows * 16;
}

size_t tern_fit_weight_estimate(const tern_model_config *c, int bits, int group) {
    double per = bits ? bits / 8.0 + 4.0 / (group > 0 ? group : 64) : 2.0; /* bytes per matrix weight */
    double H = c->n_embd, V = c->n_vocab, w = 0, vec = 0;
    w += V * H;                                           /* embed_tokens */
    if (!c->tie_embeddings) w += V * H;                   /* lm_head */
    vec += H;                                             /* final norm */
    if (c->ple_dim > 0) {                                 /* Gemma 4 per-layer inputs */
        double P = c->ple_dim, L = c->n_layer;
        w += (c->ple_vocab > 0 ? c->ple_vocab : V) * L * P + H * L * P + L * 2 * H * P;
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
    f->kv_total = f->kv_seq * (size_t)f->max_concurrency;
    f->scratch = tern_fit_scratch(c, f->max_batch_tokens, f->max_concurrency);
    f->total = f->weight_bytes + f->scratch + f->kv_total;
    f->fits = 1;
    if (budget > 0) {
        double b = budget * 1073741824.0, fixed = (double)f->weight_bytes + (double)f->scratch;
        f->kv_avail = b > fixed ? (size_t)(b - fixed) : 0;
        f->fits = (double)f->total <= b;
        f->max_conc = f->kv_seq ? (int)TERN_MIN((double)(f->kv_avail / f->kv_seq), 1e9) : 0;
        int hi = TERN_MAX(c->n_ctx_train, ctx), lo = 0;   /* longest ctx with C sequences */
        while (lo < hi) {
            int mid = lo + (hi - lo + 1) / 2;
            if (tern_fit_seq_kv(c, formats, mid, f->max_batch_tokens, f->block_size) * (size_t)f->max_concurrency <= f->kv_avail) lo = mid;
            else hi = mid - 1;
        }
        f->max_ctx = lo;
    }
    return TERN_OK;
}
