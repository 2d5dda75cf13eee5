/*
 * model.c — the architecture-independent part of a model: dispatch by arch, weight-loading
 * helpers (shape/dtype validation, upload, stats), RoPE frequency tables, and the forward
 * driver that splits a batch into max_batch pieces (in order, so later rows see earlier
 * rows' K/V exactly as in one pass) and picks the rows that want logits.
 *
 * Step graphs: on backends that offer them (vt->graph_*), a decode-sized step (n <= 32 rows,
 * every row wants logits) is recorded once per shape and replayed afterwards; bigger decode steps
 * (up to TERN_GRAPH_MAX_ROWS, default 128: batch-64 decode on the H200 +6 % with one GPU, +7 % with
 * two, greedy ids of 64 requests identical to eager and to the CPU, bench/NOTES.md (m)) are recorded
 * when the same shape comes twice in a row, so batches whose size changes every step
 * do not re-record. The key covers
 * what the recorded op sequence depends on: the model, the KV views (pools, block tables),
 * the row count and the input kind; positions, slots and tokens are device inputs uploaded
 * before each replay. The architectures' forward functions have no host-dependent control
 * flow for such steps, except dynamic RoPE (its table follows the longest position), which
 * therefore always runs eagerly. TERN_GRAPHS=0 in the environment turns graphs off.
 *
 * Bidirectional spans (model.h): the driver validates tern_batch.span, never cuts a span
 * between two sub-batches, and turns it into per-row visible key ranges (tern_rows.vis_lo/hi,
 * uploaded to d_vis_*; the architectures pick them up through tern__step_rows). Steps with
 * spans always run eagerly (the recorded op sequence of a graph has no span ranges).
 */
#include "model/internal.h"
#include "runtime/experts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int track(void ***arr, int *n, int *cap, void *p) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        void **na = realloc(*arr, sizeof(void *) * (size_t)nc);
        if (!na) return 0;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return 1;
}

void *tern__alloc(tern_model *m, size_t bytes, tern_error *err) {
    void *p = m->be->vt->alloc(m->be, bytes ? bytes : 16);
    if (!p || !track(&m->allocs, &m->n_allocs, &m->cap_allocs, p)) {
        if (p) m->be->vt->free(m->be, p);
        tern_err(err, TERN_ENOMEM, "cannot allocate %zu bytes on the %s backend", bytes, m->be->vt->name);
        return NULL;
    }
    return p;
}

float *tern__upload_f32(tern_model *m, const float *host, size_t n, tern_error *err) {
    float *d = TERN_ALLOC_F(m, n, err);
    if (d) m->be->vt->upload(m->be, d, host, n * sizeof(float));
    return d;
}

static tern_status check_dtype(const tern_tensor *t, const char *name, tern_error *err) {
    switch (t->dtype) {
    case TERN_DT_F32: case TERN_DT_F16: case TERN_DT_BF16: case TERN_DT_Q: return TERN_OK;
    case TERN_DT_F8_E4M3: /* block-scaled FP8 only (a bare e4m3 matrix has no known scale) */
        if (tern_tensor_is_fp8_block(t)) return TERN_OK;
        /* fall through */
    default:
        return tern_err(err, TERN_EUNSUPPORTED, "tensor '%s' (%s): dtype %s is not supported for a weight matrix",
                        name, t->name ? t->name : "?", tern_dtype_name(t->dtype));
    }
}

static tern_status upload(tern_model *m, tern_tensor *t, const char *name, tern_error *err) {
    tern_status s = check_dtype(t, name, err);
    if (s) return s;
    int64_t ne = tern_tensor_nelem(t);
    m->stats.n_params += ne;
    int64_t rows = ne / t->shape[t->ndim - 1];
    size_t bytes = (size_t)rows * tern_tensor_row_bytes(t);
    if (t->dtype == TERN_DT_Q) bytes += 2 * (size_t)(ne / t->group_size) * tern_dtype_size(t->sdtype);
    if (tern_tensor_is_fp8_block(t)) bytes += (size_t)(ne / (t->shape[t->ndim - 1] * (t->ndim >= 2 ? t->shape[t->ndim - 2] : 1))) * tern_tensor_fp8_scale_bytes(t);
    m->stats.bytes_by_dtype[t->dtype] += bytes;
    if (strstr(name, "experts.") && !strstr(name, "shared_experts.")) { /* routed: k of E per token */
        m->stats.bytes_per_token += (double)bytes * m->cfg.n_expert_used / (m->cfg.n_expert ? m->cfg.n_expert : 1);
        m->stats.expert_bytes += (double)bytes;
    }
    else if (!strcmp(name, "embed_tokens_per_layer") || (!strcmp(name, "embed_tokens") && !m->cfg.tie_embeddings))
        m->stats.bytes_per_token += (double)bytes / (double)t->shape[0]; /* one row per token */
    else
        m->stats.bytes_per_token += (double)bytes;
    if (m->experts && t->ndim == 3 && strstr(name, ".experts.")) /* offload: stays stored (moe.c) */
        return tern__experts_register(m, name, t, err);
    s = m->be->vt->upload_weight(m->be, t, err);
    if (s) return tern_err_wrap(err, s, "uploading '%s'", name);
    if (m->experts) tern__experts_router(m, name, t); /* offload read-ahead uses the routers (moe.c) */
    tern_tensor *keep = malloc(sizeof *keep);
    if (!keep) return tern_err(err, TERN_ENOMEM, "out of memory");
    *keep = *t;
    if (!track((void ***)&m->weights, &m->n_weights, &m->cap_weights, keep)) { free(keep); return tern_err(err, TERN_ENOMEM, "out of memory"); }
    return TERN_OK;
}

tern_status tern__load_matrix(tern_model *m, tern_weights *ws, const char *name, int64_t out, int64_t in,
                              tern_tensor *t, tern_error *err) {
    int64_t shape[2] = {out, in};
    tern_status s = tern_weights_get(ws, name, 2, shape, t, err);
    return s ? s : upload(m, t, name, err);
}

void tern__join_weights(tern_model *m, tern_tensor *const *w, int k) {
    if (!m->be->vt->join_weights || k < 2 || k > 4) return;
    const void *old[4];
    for (int i = 0; i < k; i++) old[i] = w[i]->data;
    if (!m->be->vt->join_weights(m->be, w, k)) return;
    for (int j = 0; j < m->n_weights; j++) /* the copies model close frees: the new places, and who owns them */
        for (int i = 0; i < k; i++)
            if (m->weights[j]->data == old[i]) {
                m->weights[j]->data = w[i]->data;
                m->weights[j]->joined = w[i]->joined;
                break;
            }
}

tern_status tern__load_stack(tern_model *m, tern_weights *ws, const char *name, int64_t E, int64_t out,
                             int64_t in, tern_tensor *t, tern_error *err) {
    int64_t shape[3] = {E, out, in};
    tern_status s = tern_weights_get(ws, name, 3, shape, t, err);
    return s ? s : upload(m, t, name, err);
}

/* Rows [v0, v0 + vn) of a 2-D matrix as a view (same storage: the tied head of a vocabulary-
 * parallel rank). Backends keep the stored row layout on upload, so offsets work on both sides. */
static tern_status head_rows(tern_tensor *t, int64_t v0, int64_t vn, tern_error *err) {
    if (t->ndim != 2 || t->mat_map)
        return tern_err(err, TERN_EUNSUPPORTED, "vocabulary-parallel head: '%s' is not a plain matrix", t->name ? t->name : "?");
    if (tern_tensor_is_fp8_block(t)) {
        if (v0 % t->blk_rows)
            return tern_err(err, TERN_EUNSUPPORTED, "vocabulary-parallel head: row %lld is not on an FP8 block of %d rows",
                            (long long)v0, t->blk_rows);
        t->scales = (const uint8_t *)t->scales + (size_t)(v0 / t->blk_rows) * (size_t)tern_tensor_fp8_scale_cols(t) * 4;
    } else if (t->dtype == TERN_DT_Q) {
        size_t sr = (size_t)(t->shape[1] / t->group_size) * tern_dtype_size(t->sdtype);
        t->scales = (const uint8_t *)t->scales + (size_t)v0 * sr;
        t->biases = (const uint8_t *)t->biases + (size_t)v0 * sr;
    }
    t->data = (const uint8_t *)t->data + (size_t)v0 * tern_tensor_row_bytes(t);
    t->shape[0] = vn;
    return TERN_OK;
}

tern_status tern__load_head(tern_model *m, tern_weights *ws, const tern_tensor *embed, tern_tensor *head,
                            tern_error *err) {
    int64_t V = m->cfg.n_vocab, v0 = 0, vn = V;
    if (m->cfg.head_vn > 0) { /* vocabulary-parallel rank (tp.c): its slice of the head */
        v0 = m->cfg.head_v0;
        vn = m->cfg.head_vn;
        if (v0 < 0 || v0 + vn > V)
            return tern_err(err, TERN_EINVAL, "vocabulary-parallel head: rows [%lld, %lld) outside the vocabulary of %lld",
                            (long long)v0, (long long)(v0 + vn), (long long)V);
    }
    int64_t shape[2] = {vn, m->cfg.n_embd};
    if (m->cfg.tie_embeddings) {
        int has = tern_weights_try(ws, "lm_head", 2, shape, head, err);
        if (has < 0) return (tern_status)has;
        *head = *embed;
        return vn == V ? TERN_OK : head_rows(head, v0, vn, err);
    }
    return tern__load_matrix(m, ws, "lm_head", shape[0], shape[1], head, err);
}

tern_status tern__load_vec(tern_model *m, tern_weights *ws, const char *name, int64_t n, int optional,
                           float **dev, tern_error *err) {
    tern_tensor t;
    int64_t shape[1] = {n};
    *dev = NULL;
    int found = tern_weights_try(ws, name, 1, shape, &t, err);
    if (found < 0) return (tern_status)found;
    if (!found) return optional ? TERN_OK : tern_err(err, TERN_ENOTFOUND, "missing tensor '%s'", name);
    if (t.dtype != TERN_DT_F32 && t.dtype != TERN_DT_F16 && t.dtype != TERN_DT_BF16 && t.dtype != TERN_DT_F64)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor '%s': dtype %s not supported for a vector", name, tern_dtype_name(t.dtype));
    float *host = malloc(sizeof(float) * (size_t)n);
    if (!host) return tern_err(err, TERN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) host[i] = tern_load_f32(t.data, t.dtype, (size_t)i);
    m->stats.n_params += n;
    m->stats.bytes_by_dtype[t.dtype] += (size_t)n * tern_dtype_size(t.dtype);
    *dev = tern__upload_f32(m, host, (size_t)n, err);
    free(host);
    return *dev ? TERN_OK : TERN_ENOMEM;
}

/* ---- output head ---------------------------------------------------------------------- */

tern_status tern__out_head_init(tern_model *m, tern_out_head *h, tern_error *err) {
    int64_t V = m->cfg.n_vocab;
    h->rows = (int)TERN_MAX(1, TERN_MIN((int64_t)m->max_batch, (int64_t)(64u << 20) / (V * 4)));
    if (!(h->xs = TERN_ALLOC_F(m, (size_t)h->rows * m->cfg.n_embd, err))) return TERN_ENOMEM;
    h->part = NULL;
    if (m->cfg.head_vn > 0) { /* vocabulary-parallel: the slice here, the whole rows on rank 0 only */
        if (!(h->part = TERN_ALLOC_F(m, (size_t)h->rows * m->cfg.head_vn, err))) return TERN_ENOMEM;
        h->logits = NULL;
        if (m->cfg.head_v0 == 0 && !(h->logits = TERN_ALLOC_F(m, (size_t)h->rows * V, err))) return TERN_ENOMEM;
        return TERN_OK;
    }
    if (!(h->logits = TERN_ALLOC_F(m, (size_t)h->rows * V, err))) return TERN_ENOMEM;
    return TERN_OK;
}

/* the end of the run of consecutive row indices w[i], w[i] + 1, ... that starts at i (at most n) */
static int run_end(const int *w, int i, int n) {
    int j = i + 1;
    while (j < n && w[j] == w[j - 1] + 1) j++;
    return j;
}

void tern__out_head_logits(tern_model *m, const tern_out_head *h, const float *x, const int *want, int n_want,
                           const float *norm, const tern_tensor *head, float *out) {
    const tern_backend_vt *op = m->be->vt;
    tern_backend *be = m->be;
    int H = m->cfg.n_embd, V = m->cfg.n_vocab, vn = m->cfg.head_vn;
    /* nobody reads them (e.g. ranks > 0 of a tensor-parallel group, without a vocabulary split) */
    if (vn > 0 ? !m->head_need || !op->gather_cols : !out && !m->samp_any) return;
    for (int i0 = 0; i0 < n_want; i0 += h->rows) {
        int nr = TERN_MIN(h->rows, n_want - i0);
        const float eps = (float)m->cfg.norm_eps;
        float *y = vn > 0 ? h->part : h->logits;
        /* the wanted rows in runs of consecutive rows: one run (a decode step, every row wanted) is normalized
         * straight from x into xs, fused with the head where it can; several (the last row of each prompt of a
         * prefill chunk) are gathered one copy a run (a launch a row cost a batch-64 decode step ~2 % on the H200) */
        const int *w = want + i0;
        if (run_end(w, 0, nr) == nr) {
            tern__norm_matmul(m, h->xs, x + (size_t)w[0] * H, norm, eps, nr, y, head);
        } else {
            for (int i = 0, j; i < nr; i = j) {
                j = run_end(w, i, nr);
                op->copy_cols(be, h->xs + (size_t)i * H, x + (size_t)w[i] * H, j - i, H, H, 0);
            }
            op->rmsnorm(be, h->xs, h->xs, nr, H, norm, eps);
            op->matmul(be, y, h->xs, nr, head);
        }
        if (vn > 0) { /* this rank's slice (softcap is per element), gathered into rank 0's rows */
            if (m->cfg.final_logit_softcap > 0) op->softcap(be, h->part, (size_t)nr * vn, (float)m->cfg.final_logit_softcap);
            op->gather_cols(be, h->logits, h->part, nr, V, m->cfg.head_v0, vn);
            if (!h->logits) continue; /* ranks > 0: nothing to download or draw */
        } else {
            if (m->cfg.final_logit_softcap > 0) op->softcap(be, h->logits, (size_t)nr * V, (float)m->cfg.final_logit_softcap);
        }
        if (out && !m->samp_all) op->download(be, out + (size_t)i0 * V, h->logits, sizeof(float) * (size_t)nr * V);
        if (m->samp_any) { /* on-device sampling: one int32 per drawn row comes back */
            int32_t *ids = (m->feed ? m->d_in : m->d_ids) + i0; /* feed: the next step's tokens (every row wanted) */
            op->sample(be, ids, h->logits, nr, V, m->d_srows + i0, m->d_pairs, m->d_sscratch);
            op->download(be, m->samp->ids + m->samp_base + i0, ids, sizeof(int32_t) * (size_t)nr);
        }
    }
}

/* ---- RoPE ---------------------------------------------------------------------------- */

static double yarn_find_dim(double n_rot, int D, double base, int orig) {
    return (D * log((double)orig / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

tern_status tern__rope_inv_freq(const tern_rope_params *rp, int D, int max_pos, float *inv, float *mscale,
                                tern_error *err) {
    int half = D / 2;
    *mscale = 1.0f;
    double factor = rp->factor > 0 ? rp->factor : 1.0;
    float base = (float)rp->theta;
    switch (rp->type) {
    case TERN_ROPE_NONE:
        for (int i = 0; i < half; i++) inv[i] = 0.0f;
        return TERN_OK;
    case TERN_ROPE_DEFAULT:
    case TERN_ROPE_LINEAR:
    case TERN_ROPE_DYNAMIC:
    case TERN_ROPE_LLAMA3:
    case TERN_ROPE_YARN: {
        double prf = rp->partial_rotary_factor > 0 ? rp->partial_rotary_factor : 1.0;
        if (prf != 1.0)
            return tern_err(err, TERN_EUNSUPPORTED, "rope: partial_rotary_factor %g is not supported for this rope type", prf);
        if (rp->type == TERN_ROPE_DYNAMIC && rp->original_max_pos > 0 && max_pos + 1 > rp->original_max_pos) {
            /* transformers' dynamic NTK: grow the base with the sequence length */
            double seq = max_pos + 1;
            double b = rp->theta * pow(factor * seq / rp->original_max_pos - (factor - 1), (double)D / (D - 2));
            base = (float)b;
        }
        /* fp32 as transformers: 1 / base^(arange(0, D, 2) / D) */
        for (int i = 0; i < half; i++) inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)D);
        if (rp->type == TERN_ROPE_LINEAR)
            for (int i = 0; i < half; i++) inv[i] = (float)(inv[i] / factor);
        if (rp->type == TERN_ROPE_LLAMA3) {
            double lf = rp->low_freq_factor > 0 ? rp->low_freq_factor : 1.0;
            double hf = rp->high_freq_factor > 0 ? rp->high_freq_factor : 4.0;
            double old = rp->original_max_pos > 0 ? rp->original_max_pos : 8192;
            double low_wl = old / lf, high_wl = old / hf;
            for (int i = 0; i < half; i++) {
                double f = inv[i], wl = 2 * M_PI / f, nf;
                if (wl < high_wl) nf = f;
                else if (wl > low_wl) nf = f / factor;
                else {
                    double smooth = (old / wl - lf) / (hf - lf);
                    nf = (1 - smooth) * f / factor + smooth * f;
                }
                inv[i] = (float)nf;
            }
        }
        if (rp->type == TERN_ROPE_YARN) {
            int orig = rp->original_max_pos > 0 ? rp->original_max_pos : 4096;
            double bf = rp->beta_fast > 0 ? rp->beta_fast : 32, bs = rp->beta_slow > 0 ? rp->beta_slow : 1;
            double lo = floor(yarn_find_dim(bf, D, rp->theta, orig)), hi = ceil(yarn_find_dim(bs, D, rp->theta, orig));
            if (lo < 0) lo = 0;
            if (hi > D - 1) hi = D - 1;
            if (lo == hi) hi += 0.001;
            for (int i = 0; i < half; i++) {
                double ramp = ((double)i - lo) / (hi - lo);
                ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
                double extrap_mask = 1 - ramp;
                double f = inv[i];
                inv[i] = (float)(f / factor * (1 - extrap_mask) + f * extrap_mask);
            }
            double af = rp->attention_factor;
            if (af <= 0) {
                if (rp->mscale > 0 && rp->mscale_all_dim > 0) {
                    double a = factor <= 1 ? 1 : 0.1 * rp->mscale * log(factor) + 1;
                    double b2 = factor <= 1 ? 1 : 0.1 * rp->mscale_all_dim * log(factor) + 1;
                    af = a / b2;
                } else af = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
            }
            *mscale = (float)af;
        }
        return TERN_OK;
    }
    case TERN_ROPE_PROPORTIONAL: {
        double p = rp->partial_rotary_factor > 0 ? rp->partial_rotary_factor : 1.0;
        int R = (int)(p * D / 2); /* rotated pairs; exponent over the full D (gemma4.md §3.3) */
        for (int i = 0; i < half; i++)
            inv[i] = i < R ? (float)((1.0f / powf(base, (float)(2 * i) / (float)D)) / factor) : 0.0f;
        return TERN_OK;
    }
    }
    return tern_err(err, TERN_EUNSUPPORTED, "rope type %d not supported", (int)rp->type);
}

/* ---- load / free / forward --------------------------------------------------------- */

/* d_tokens / d_pos / d_slot at the runs of a sub-batch of n rows in d_in */
static void in_layout(tern_model *m, int n) {
    m->d_tokens = m->d_in;
    m->d_pos = m->d_in + n;
    m->d_slot = m->d_in + 2 * (size_t)n;
}
/* the sub-batch's tokens | positions | slots as one upload (one copy a step instead of three); without tokens
 * (embedding rows, or a fed decode launch whose tokens are the previous step's draws in d_in) only the last two */
static void in_upload(tern_model *m, const tern_batch *sub) {
    const int n = sub->n;
    in_layout(m, n);
    if (sub->tokens) memcpy(m->h_in, sub->tokens, sizeof(int32_t) * (size_t)n);
    memcpy(m->h_in + n, sub->pos, sizeof(int32_t) * (size_t)n);
    memcpy(m->h_in + 2 * (size_t)n, sub->slot, sizeof(int32_t) * (size_t)n);
    const size_t skip = sub->tokens ? 0 : (size_t)n;
    m->be->vt->upload(m->be, m->d_in + skip, m->h_in + skip, sizeof(int32_t) * (3 * (size_t)n - skip));
}

static const tern_arch_impl *impl_for(tern_arch a) {
    switch (a) {
    case TERN_ARCH_GEMMA4: return &tern__gemma4_impl;
    case TERN_ARCH_LLAMA: case TERN_ARCH_QWEN2: case TERN_ARCH_QWEN3: return &tern__llama_impl;
    case TERN_ARCH_GLM5: return &tern__glm5_impl;
    default: return NULL;
    }
}

tern_status tern_model_load_from(tern_model **out, const tern_model_config *cfg, tern_weights *ws,
                                 tern_backend *be, const tern_model_opts *opts, tern_error *err) {
    *out = NULL;
    const tern_arch_impl *impl = impl_for(cfg->arch);
    if (!impl) return tern_err(err, TERN_EUNSUPPORTED, "architecture '%s' (%s) is not supported yet", cfg->model_type, tern_arch_name(cfg->arch));
    tern_model *m = calloc(1, sizeof *m);
    if (!m) return tern_err(err, TERN_ENOMEM, "out of memory");
    m->cfg = *cfg;
    m->be = be;
    m->impl = impl;
    m->max_batch = opts && opts->max_batch > 0 ? opts->max_batch
                 : TERN_MAX(tern_model_default_batch(be->device >= 0, be->mem_bytes), opts ? opts->min_batch : 0);
    tern_status s = be->vt->reserve_rows ? be->vt->reserve_rows(be, m->max_batch, err) : TERN_OK;
    if (!s && (!(m->d_in = tern__alloc(m, sizeof(int32_t) * 3 * (size_t)m->max_batch, err)) ||
        !(m->d_vis_lo = tern__alloc(m, sizeof(int32_t) * (size_t)m->max_batch, err)) ||
        !(m->d_vis_hi = tern__alloc(m, sizeof(int32_t) * (size_t)m->max_batch, err)) ||
        !(m->d_embd = TERN_ALLOC_F(m, (size_t)m->max_batch * cfg->n_embd, err))))
        s = TERN_ENOMEM;
    if (!s && be->vt->sample && /* on-device sampling buffers (tern_model_forward_sample) */
        (!(m->d_srows = tern__alloc(m, sizeof(tern_sample_row) * (size_t)m->max_batch, err)) ||
         !(m->d_pairs = tern__alloc(m, sizeof(tern_sample_pair) * TERN_MODEL_SAMPLE_PAIRS, err)) ||
         !(m->d_ids = tern__alloc(m, sizeof(int32_t) * (size_t)m->max_batch, err)) ||
         !(m->d_sscratch = tern__alloc(m, tern_sample_scratch_bytes(cfg->n_vocab), err))))
        s = TERN_ENOMEM;
    if (!s && (!(m->h_vis_lo = malloc(sizeof(int32_t) * (size_t)m->max_batch)) ||
               !(m->h_vis_hi = malloc(sizeof(int32_t) * (size_t)m->max_batch)) ||
               !(m->h_in = malloc(sizeof(int32_t) * 3 * (size_t)m->max_batch))))
        s = tern_err(err, TERN_ENOMEM, "out of memory");
    if (!s) in_layout(m, m->max_batch);
    if (!s && opts && (opts->expert_cache_bytes || opts->expert_slots) && cfg->n_expert > 0) {
        tern_experts_opts xo = {.cap_bytes = opts->expert_cache_bytes, .slots = opts->expert_slots,
                                .trace = opts->expert_trace, .e0 = opts->expert_e0};
        s = tern_experts_open(&m->experts, be, cfg->n_layer, &xo, err);
        m->load_ws = ws;
        tern_weights_set_expert_views(ws, 1); /* per-expert stacks: not copied, read from the file (moe.c) */
    }
    if (!s) s = impl->load(m, ws, err);
    if (!s && m->experts) s = tern_experts_plan(m->experts, cfg->n_expert_used, err);
    if (m->load_ws) tern_weights_set_expert_views(ws, 0);
    m->load_ws = NULL;
    if (!s) {
        const char *names[16];
        int nu = tern_weights_unused(ws, names, 16);
        for (int i = 0; i < nu && i < 16; i++) tern_log(TERN_LOG_WARN, "unexpected tensor '%s' (not used by %s)", names[i], impl->name);
        if (nu > 16) tern_log(TERN_LOG_WARN, "... and %d more unexpected tensors", nu - 16);
    }
    if (s) { tern_model_free(m); return s; }
    *out = m;
    return TERN_OK;
}

tern_status tern_model_load(tern_model **out, const char *dir, tern_backend *be, const tern_model_opts *opts,
                            tern_error *err) {
    *out = NULL;
    tern_model_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_weights *ws = NULL;
    tern_status s = tern_config_load(cfg, dir, err);
    if (!s) {
        tern_st_opts sto = {.no_mmap = opts && opts->no_mmap};
        if (sto.no_mmap && (opts->expert_cache_bytes || opts->expert_slots) && cfg->n_expert > 0)
            sto.keep_mapped = tern_st_is_routed_expert; /* offload reads the experts from the file */
        s = tern_weights_open_opts(&ws, dir, cfg, &sto, err);
        if (!s && sto.no_mmap)
            tern_log(TERN_LOG_INFO, "%s: --no-mmap: %.1f MB of tensors read into anonymous memory", dir,
                     tern_st_copied_bytes(tern_weights_set(ws)) / 1e6);
    }
    if (!s) s = tern_model_load_from(out, cfg, ws, be, opts, err);
    if (s) {
        tern_weights_close(ws);
        tern_config_free(cfg);
        free(cfg);
        return s;
    }
    (*out)->own_cfg = cfg;
    (*out)->own_ws = ws;
    return TERN_OK;
}

void tern_model_free(tern_model *m) {
    if (!m) return;
    if (m->be && m->be->vt->graph_reset) m->be->vt->graph_reset(m->be); /* graphs hold our buffers */
    if (m->impl && m->impl->free) m->impl->free(m);
    tern_experts_close(m->experts);
    for (int i = 0; i < m->n_weights; i++) {
        if (m->be->vt->free_weight) m->be->vt->free_weight(m->be, m->weights[i]);
        free(m->weights[i]);
    }
    for (int i = 0; i < m->n_allocs; i++) m->be->vt->free(m->be, m->allocs[i]);
    free(m->weights);
    free(m->allocs);
    free(m->h_vis_lo);
    free(m->h_in);
    free(m->h_vis_hi);
    free(m->span_id);
    free(m->span_end);
    tern_weights_close(m->own_ws);
    if (m->own_cfg) { tern_config_free(m->own_cfg); free(m->own_cfg); }
    free(m);
}

const tern_model_config *tern_model_cfg(const tern_model *m) { return &m->cfg; }
tern_backend *tern_model_backend(const tern_model *m) { return m->be; }
int tern_model_max_batch(const tern_model *m) { return m ? m->max_batch : 0; }
int tern_model_default_batch(int gpu, size_t gpu_bytes) {
    return !gpu ? 512 : !gpu_bytes || gpu_bytes >= TERN_BIG_GPU_BYTES ? 8192 : 2048;
}
void tern_model_get_stats(const tern_model *m, tern_model_stats *st) { *st = m->stats; }

/* ---- step graphs ---------------------------------------------------------------------- */

#define GRAPH_EAGER_ROWS 32 /* recorded at first sight; bigger steps when they repeat */
#define GRAPH_MAX_ROWS 128

static int graph_max_rows(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TERN_GRAPH_MAX_ROWS");
        v = e && e[0] ? atoi(e) : GRAPH_MAX_ROWS;
        if (v < 0) v = 0;
    }
    return v;
}

static int graphs_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("TERN_GRAPHS");
        on = !(e && e[0] == '0');
    }
    return on;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 31);
}

static uint64_t step_key(const tern_model *m, const tern_kv *kv, const tern_batch *b, int n_want, int has_out) {
    uint64_t h = mix(0, (uint64_t)(uintptr_t)m);
    h = mix(h, (uint64_t)(uintptr_t)kv);
    h = mix(h, (uint64_t)b->n);
    h = mix(h, b->tokens ? 1 : 2);
    h = mix(h, (uint64_t)n_want);
    h = mix(h, (uint64_t)has_out);
    h = mix(h, (uint64_t)m->head_need); /* vocabulary-parallel ranks > 0: the head runs or not */
    h = mix(h, (uint64_t)tern_slot_seqs(b->slot, b->n)); /* the CUDA attention's decode choice (ops.h) */
    h = mix(h, (uint64_t)tern_rows_long(b->pos, b->n));   /* ... and its long-context kernel (ops.h) */
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const tern_kv_layer *v = tern_kv_view(kv, l);
        h = mix(h, (uint64_t)(uintptr_t)v->k);
        h = mix(h, (uint64_t)(uintptr_t)v->v);
        h = mix(h, (uint64_t)(uintptr_t)v->block_table);
        h = mix(h, ((uint64_t)v->max_blocks << 32) ^ ((uint64_t)v->block_size << 16) ^ (uint64_t)v->window);
        h = mix(h, ((uint64_t)v->n_head_kv << 32) ^ ((uint64_t)v->head_dim << 8) ^ (uint64_t)v->dtype);
    }
    return h;
}

/* Record (not run) the sub-batch's forward as the step graph `key`, its downloads landing in gout's bytes; 1 when kept */
static int record(tern_model *m, const tern_batch *sub, tern_kv *kv, const int *wi, int n_want, float *out, uint64_t key,
                  void *gout, size_t bytes) {
    const tern_backend_vt *vt = m->be->vt;
    if (!vt->graph_begin(m->be, key, gout, bytes)) return 0;
    tern_error scratch = {0};
    const tern_status s = m->impl->forward(m, sub, kv, wi, n_want, out, &scratch);
    return vt->graph_end(m->be, s == TERN_OK);
}

/* Run one sub-batch through a step graph; 1 when done that way, 0 when the caller must run
 * it eagerly. */
static int forward_graph(tern_model *m, const tern_batch *sub, tern_kv *kv, const int *wi, int n_want,
                         float *out) {
    const tern_backend_vt *vt = m->be->vt;
    if (!vt->graph_replay || !vt->graph_begin || !vt->graph_end || !graphs_enabled()) return 0;
    if (sub->n > graph_max_rows() || n_want != sub->n || m->cfg.rope_full.type == TERN_ROPE_DYNAMIC) return 0;
    if (m->vis_on) return 0; /* span ranges are host-side control flow: never recorded */
    if (m->experts) return 0; /* expert offload decides on the host after routing */
    if (m->samp_any && !m->samp_all) return 0; /* mixed host / device rows: eager */
    size_t bytes = out ? sizeof(float) * (size_t)n_want * m->cfg.n_vocab : 0;
    void *gout = out; /* where the recorded downloads land: logits, or the drawn ids */
    if (m->samp_all) {
        gout = m->samp->ids + m->samp_base;
        bytes = sizeof(int32_t) * (size_t)n_want;
    }
    uint64_t key = step_key(m, kv, sub, n_want, m->samp_all ? 2 : out != NULL);
    if (vt->graph_replay(m->be, key, gout, bytes)) return 1;
    if (sub->n > GRAPH_EAGER_ROWS && m->graph_seen != key) { /* big step: record when it repeats */
        m->graph_seen = key;
        return 0;
    }
    return record(m, sub, kv, wi, n_want, out, key, gout, bytes) && vt->graph_replay(m->be, key, gout, bytes);
}

/* ---- bidirectional spans ------------------------------------------------------------ */

typedef struct span_group { int32_t id; int row; } span_group;

static int group_cmp(const void *a, const void *b) {
    const span_group *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* Validate b->span (model.h); *has = 1 when some row is in a span. */
static tern_status spans_check(const tern_model *m, const tern_batch *b, const tern_kv *kv, int *has,
                               tern_error *err) {
    *has = 0;
    if (!b->span) return TERN_OK;
    int ng = 0;
    for (int r = 0; r < b->n; r++)
        if (b->span[r] && (r == 0 || b->span[r - 1] != b->span[r])) ng++;
    if (!ng) return TERN_OK;
    *has = 1;
    if (!m->impl->spans)
        return tern_err(err, TERN_EUNSUPPORTED, "bidirectional spans (batch.span) are not supported by the %s (%s) attention",
                        m->impl->name, m->cfg.model_type);
    int track = m->span_id && m->span_kv == (const void *)kv;
    span_group *g = malloc(sizeof *g * (size_t)ng);
    if (!g) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_status s = TERN_OK;
    ng = 0;
    for (int r = 0; r < b->n && !s; r++) {
        int32_t id = b->span[r];
        if (!id) continue;
        if (r > 0 && b->span[r - 1] == id) { /* continues the span started at g[ng-1].row */
            int r0 = g[ng - 1].row;
            if (b->slot[r] != b->slot[r0])
                s = tern_err(err, TERN_EINVAL, "span %d mixes slots: row %d is in slot %d, row %d in slot %d", id, r0,
                             b->slot[r0], r, b->slot[r]);
            else if (b->pos[r] != b->pos[r - 1] + 1)
                s = tern_err(err, TERN_EINVAL, "span %d is not contiguous: row %d has position %d after position %d "
                             "(a span's rows are consecutive positions in order)", id, r, b->pos[r], b->pos[r - 1]);
            else if (r - r0 + 1 > m->max_batch)
                s = tern_err(err, TERN_EINVAL, "span %d (from row %d) has more than %d rows, the most one forward step "
                             "holds (max_batch)", id, r0, m->max_batch);
            continue;
        }
        int sl = b->slot[r];
        if (track && sl < m->span_slots && m->span_id[sl] == id && m->span_end[sl] + 1 == b->pos[r])
            s = tern_err(err, TERN_EINVAL, "span %d at row %d (slot %d, position %d) continues the span that ended the "
                         "previous step at position %d: a span must lie entirely inside one step", id, r, sl,
                         b->pos[r], m->span_end[sl]);
        g[ng].id = id;
        g[ng++].row = r;
    }
    if (!s) {
        qsort(g, (size_t)ng, sizeof *g, group_cmp);
        for (int i = 1; i < ng && !s; i++)
            if (g[i].id == g[i - 1].id)
                s = tern_err(err, TERN_EINVAL, "span %d is split: rows %d and %d start separate runs (a span's rows "
                             "must be adjacent in the batch and lie inside this step)", g[i].id, g[i - 1].row, g[i].row);
    }
    free(g);
    return s;
}

/* After a successful step: remember, per slot, the span that ended it (to refuse its
 * continuation in the next step). Nothing to do until the first step with spans. */
static void spans_commit(tern_model *m, const tern_batch *b, const tern_kv *kv, int has) {
    int ns = tern_kv_n_slots(kv);
    if (!has && (!m->span_id || m->span_kv != (const void *)kv)) return;
    if (m->span_kv != (const void *)kv || m->span_slots < ns) {
        int32_t *id = calloc((size_t)ns, sizeof *id), *end = calloc((size_t)ns, sizeof *end);
        if (!id || !end) { free(id); free(end); return; } /* the check is a diagnostic: skip it */
        if (m->span_kv == (const void *)kv && m->span_id) {
            memcpy(id, m->span_id, sizeof *id * (size_t)m->span_slots);
            memcpy(end, m->span_end, sizeof *end * (size_t)m->span_slots);
        }
        free(m->span_id);
        free(m->span_end);
        m->span_id = id;
        m->span_end = end;
        m->span_slots = ns;
        m->span_kv = kv;
    }
    for (int r = 0; r < b->n; r++) { /* a slot's last row in the batch decides */
        int sl = b->slot[r];
        m->span_id[sl] = b->span ? b->span[r] : 0;
        m->span_end[sl] = b->pos[r];
    }
}

/* Rows of the next sub-batch starting at r0: at most max_batch, never cutting a span. */
static int sub_rows(const tern_model *m, const tern_batch *b, int r0) {
    int n = TERN_MIN(m->max_batch, b->n - r0);
    if (b->span && r0 + n < b->n) {
        int cut = r0 + n; /* first row of the next piece */
        while (cut > r0 && b->span[cut] && b->span[cut - 1] == b->span[cut]) cut--;
        if (cut > r0) n = cut - r0; /* (spans_check bounds a span by max_batch rows) */
    }
    return n;
}

/* Visible ranges of the sub-batch's rows: the whole span for span rows, pos..pos otherwise. */
static void spans_fill(tern_model *m, const tern_batch *sub) {
    for (int r = 0; r < sub->n;) {
        int r1 = r + 1;
        if (sub->span[r])
            while (r1 < sub->n && sub->span[r1] == sub->span[r]) r1++;
        else r1 = r + 1;
        for (int i = r; i < r1; i++) {
            m->h_vis_lo[i] = sub->span[r] ? sub->pos[r] : sub->pos[i];
            m->h_vis_hi[i] = sub->span[r] ? sub->pos[r1 - 1] : sub->pos[i];
        }
        r = r1;
    }
    m->be->vt->upload(m->be, m->d_vis_lo, m->h_vis_lo, sizeof(int32_t) * (size_t)sub->n);
    m->be->vt->upload(m->be, m->d_vis_hi, m->h_vis_hi, sizeof(int32_t) * (size_t)sub->n);
}

/* ---- on-device sampling ------------------------------------------------------------- */

/* Tensor parallel: rank 0 draws (its logits are the group's; tp.c keeps the ranks' graph
 * decisions in step). */
int tern_model_can_sample(const tern_model *m) { return m && m->be->vt->sample && m->d_srows; }

/* The sub-batch's wanted rows are samp->rows[k0, k0 + n_want): note which are drawn on the
 * device and upload their descriptors (before any graph replays or records). */
static void samp_sub(tern_model *m, int k0, int n_want) {
    int dev = 0;
    for (int k = 0; k < n_want; k++) dev += m->samp->rows[k0 + k].mode == TERN_SAMPLE_DRAW;
    m->samp_base = k0;
    m->samp_any = dev > 0;
    m->samp_all = dev > 0 && dev == n_want;
    if (dev) m->be->vt->upload(m->be, m->d_srows, m->samp->rows + k0, sizeof(tern_sample_row) * (size_t)n_want);
}

/* a device-sampling request's arrays and pair count; row k's lists inside the pairs (rows drawn on the host: any) */
static int samp_request_ok(const tern_batch_sample *smp) {
    return smp->rows && smp->ids && smp->n_pairs >= 0 && smp->n_pairs <= TERN_MODEL_SAMPLE_PAIRS &&
           (!smp->n_pairs || smp->pairs);
}
static int samp_row_ok(const tern_batch_sample *smp, int k) {
    const tern_sample_row *p = &smp->rows[k];
    return p->mode != TERN_SAMPLE_DRAW || (p->n_bias >= 0 && p->n_hist >= 0 && p->bias_off >= 0 && p->hist_off >= 0 &&
                                           p->bias_off <= smp->n_pairs - p->n_bias && p->hist_off <= smp->n_pairs - p->n_hist);
}

tern_status tern_model_forward_sample(tern_model *m, const tern_batch *b, tern_kv *kv, float *logits,
                                      const tern_batch_sample *smp, tern_error *err) {
    if (!smp) return tern_model_forward(m, b, kv, logits, err);
    if (!tern_model_can_sample(m))
        return tern_err(err, TERN_EUNSUPPORTED, "device sampling: not available on the %s backend%s", m->be->vt->name,
                        m->tp ? " with tensor parallelism" : "");
    if (!samp_request_ok(smp))
        return tern_err(err, TERN_EINVAL, "device sampling: bad request (n_pairs %d, at most %d)", smp->n_pairs,
                        TERN_MODEL_SAMPLE_PAIRS);
    int n_want = 0;
    for (int r = 0; r < b->n; r++) n_want += !b->want || b->want[r];
    for (int k = 0; k < n_want; k++)
        if (!samp_row_ok(smp, k))
            return tern_err(err, TERN_EINVAL, "device sampling: row %d: lists outside the %d pairs", k, smp->n_pairs);
    if (smp->n_pairs) m->be->vt->upload(m->be, m->d_pairs, smp->pairs, sizeof(tern_sample_pair) * (size_t)smp->n_pairs);
    m->samp = smp;
    tern_status s = tern_model_forward(m, b, kv, logits, err);
    m->samp = NULL;
    m->samp_any = m->samp_all = 0;
    return s;
}

/* what keeps tern_model_decode_launch from taking any step of this model */
static int decode_refused(const tern_model *m) {
    return m->tp || m->experts || m->pipe_off || m->cfg.rope_full.type == TERN_ROPE_DYNAMIC || !tern_model_can_sample(m);
}

/* model.h: decode rows queued as a step graph without waiting (the feed variant of the step's key; one graph for both
 * parities, each writing its ids into its own staging half: *key's low bit is the parity), or run at once where the
 * backend cannot launch graphs */
int tern_model_decode_launch(tern_model *m, const tern_batch *b, tern_kv *kv, int parity, const tern_batch_sample *smp,
                             uint64_t *key) {
    const tern_backend_vt *vt = m->be->vt;
    const int n = b ? b->n : 0;
    *key = 0;
    if (decode_refused(m)) return 0;
    if (n < 1 || n > m->max_batch || n > 1024 || b->embd || b->span || (!b->tokens && n != m->fed_n)) return 0;
    if (!smp || !samp_request_ok(smp)) return 0;
    for (int r = 0; r < n; r++) {
        if ((b->want && !b->want[r]) || smp->rows[r].mode != TERN_SAMPLE_DRAW || !samp_row_ok(smp, r)) return 0;
        if ((b->tokens && (b->tokens[r] < 0 || b->tokens[r] >= m->cfg.n_vocab)) || b->pos[r] < 0 ||
            b->pos[r] >= tern_kv_max_ctx(kv) || b->slot[r] < 0 || b->slot[r] >= tern_kv_n_slots(kv))
            return 0;
    }
    const int graphs = tern_model_decode_async(m) && n <= graph_max_rows();
    tern_kv_sync(kv);
    if (smp->n_pairs) vt->upload(m->be, m->d_pairs, smp->pairs, sizeof(tern_sample_pair) * (size_t)smp->n_pairs);
    in_upload(m, b); /* fed (no tokens): d_in[0, n) holds the previous step's draws */
    tern_batch sub = *b; /* the recorded step reads its tokens from d_in either way: the key's feed variant */
    sub.tokens = m->h_in;
    sub.want = NULL;
    int wi[1024];
    for (int r = 0; r < n; r++) wi[r] = r;
    m->samp = smp;
    samp_sub(m, 0, n);
    m->feed = 1;
    int ok;
    if (graphs) {
        const uint64_t gk = ((step_key(m, kv, &sub, n, 2) ^ 0x3c6ef372fe94f82aull) & ~1ull) | 2; /* even, not 0 */
        *key = gk | (uint64_t)(parity & 1); /* 0 means "ran at once" */
        ok = vt->graph_launch(m->be, gk, parity & 1);
        if (!ok && record(m, &sub, kv, wi, n, NULL, gk, smp->ids, sizeof(int32_t) * (size_t)n)) {
            ok = vt->graph_launch(m->be, gk, parity & 1);
            m->pipe_off = !ok; /* a graph just recorded that will not launch (its outputs cannot switch halves): stop */
        }
    } else {
        tern_error scratch = {0};
        ok = m->impl->forward(m, &sub, kv, wi, n, NULL, &scratch) == TERN_OK;
    }
    m->feed = 0;
    m->samp = NULL;
    m->samp_any = m->samp_all = 0;
    m->fed_n = ok ? n : 0;
    return ok;
}
int tern_model_decode_async(const tern_model *m) {
    const tern_backend_vt *vt = m->be->vt;
    return !decode_refused(m) && vt->graph_launch && vt->graph_wait && vt->graph_begin && vt->graph_end && graphs_enabled();
}
int tern_model_decode_wait(tern_model *m, uint64_t key, int n, const tern_batch_sample *smp) {
    const tern_backend_vt *vt = m->be->vt;
    if (!smp || !smp->ids || n < 1) return 0;
    return !key || (vt->graph_wait && vt->graph_wait(m->be, key & ~1ull, (int)(key & 1), smp->ids, sizeof(int32_t) * (size_t)n));
}

tern_status tern_model_forward(tern_model *m, const tern_batch *b, tern_kv *kv, float *logits, tern_error *err) {
    if (m->tp) return tern__tp_forward(m->tp, b, kv, logits, err); /* tensor parallel: every rank (tp.c) */
    return tern__model_forward_local(m, b, kv, logits, err);
}

tern_status tern__model_forward_local(tern_model *m, const tern_batch *b, tern_kv *kv, float *logits, tern_error *err) {
    if (b->n <= 0) return TERN_OK;
    if (!b->tokens && !b->embd) return tern_err(err, TERN_EINVAL, "batch has neither tokens nor embeddings");
    for (int r = 0; r < b->n; r++) {
        if (b->tokens && (b->tokens[r] < 0 || b->tokens[r] >= m->cfg.n_vocab))
            return tern_err(err, TERN_EINVAL, "token id %d at row %d is outside the vocabulary [0, %d)", b->tokens[r], r, m->cfg.n_vocab);
        if (b->pos[r] < 0 || b->pos[r] >= tern_kv_max_ctx(kv))
            return tern_err(err, TERN_EINVAL, "position %d at row %d is outside the context [0, %d)", b->pos[r], r, tern_kv_max_ctx(kv));
        if (b->slot[r] < 0 || b->slot[r] >= tern_kv_n_slots(kv))
            return tern_err(err, TERN_EINVAL, "slot %d at row %d is out of range", b->slot[r], r);
    }
    int has_spans;
    tern_status s = spans_check(m, b, kv, &has_spans, err);
    if (s) return s;
    tern_kv_sync(kv);
    m->fed_n = 0; /* d_in is rewritten: a fed launch has no draws to read */
    int want_idx[1024];
    size_t out_off = 0;
    for (int r0 = 0, n; r0 < b->n; r0 += n) {
        n = sub_rows(m, b, r0);
        tern_batch sub = *b;
        sub.n = n;
        sub.tokens = b->tokens ? b->tokens + r0 : NULL;
        sub.embd = b->embd ? b->embd + (size_t)r0 * m->cfg.n_embd : NULL;
        sub.pos = b->pos + r0;
        sub.slot = b->slot + r0;
        sub.want = b->want ? b->want + r0 : NULL;
        sub.span = has_spans ? b->span + r0 : NULL;
        in_upload(m, &sub);
        if (sub.embd) m->be->vt->upload(m->be, m->d_embd, sub.embd, sizeof(float) * (size_t)n * m->cfg.n_embd);
        m->vis_on = 0;
        if (sub.span)
            for (int r = 0; r < n && !m->vis_on; r++) m->vis_on = sub.span[r] != 0;
        if (m->vis_on) spans_fill(m, &sub);
        /* logits rows in chunks of at most 1024 */
        int n_want = 0;
        for (int r = 0; r < n; r++) if (!sub.want || sub.want[r]) n_want++;
        int *wi = n_want <= (int)TERN_ARRAY_LEN(want_idx) ? want_idx : malloc(sizeof(int) * (size_t)n_want);
        if (!wi) { m->vis_on = 0; return tern_err(err, TERN_ENOMEM, "out of memory"); }
        n_want = 0;
        for (int r = 0; r < n; r++) if (!sub.want || sub.want[r]) wi[n_want++] = r;
        float *out = logits ? logits + out_off : NULL;
        if (m->samp) samp_sub(m, (int)(out_off / (size_t)m->cfg.n_vocab), n_want);
        s = forward_graph(m, &sub, kv, wi, n_want, out) ? TERN_OK : m->impl->forward(m, &sub, kv, wi, n_want, out, err);
        m->vis_on = 0;
        m->samp_any = m->samp_all = 0;
        if (wi != want_idx) free(wi);
        if (s) return s;
        out_off += (size_t)n_want * m->cfg.n_vocab;
    }
    spans_commit(m, b, kv, has_spans);
    return TERN_OK;
}
