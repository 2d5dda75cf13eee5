/*
 * weights.c — canonical tensor names → stored safetensors tensors (see weights.h).
 *
 * open: map every safetensors file of the directory, then detect the name prefix by
 * looking for "<prefix>embed_tokens.weight" among the known prefixes.
 * get:  NAME resolves to "<prefix>NAME.weight", else "<prefix>NAME". A module with a
 *       "<base>.scales" companion is MLX-quantized: the weight must be U32, biases present,
 *       bits/group_size come from the config's quantization block (tern_quant_lookup on the
 *       stored module path), and the logical input width is packed_cols*32/bits, which must
 *       agree with the scales' columns * group_size. An F8_E4M3 weight takes its block scales
 *       from "<base>.weight_scale_inv" (DeepSeek-V3 / GLM-5-FP8; block size from the config).
 * Expert stacks ("layers.L.experts.gate|up|down", [E, out, in]) are found in four stored
 * forms: HF fused gate_up_proj (gate/up become strided views, no copy), mlx switch_glu,
 * GLM mlx switch_mlp, and per-expert matrices (a table of each expert's stored bytes, then
 * copied once into one owned buffer, cached; with expert views on (offload) never copied).
 * Every stored tensor touched by a lookup is marked used, so tern_weights_unused can name
 * leftovers; vision/audio towers and rotary buffers never count as leftovers.
 * The config passed to open must outlive the store (its quantization block is read lazily).
 */
#include "io/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stack {
    char *canon, *name;
    tern_tensor t;
    void *w, *s, *b; /* owned buffers (NULL while only viewed) */
    tern_expert_src *src; /* [E]: each expert's stored bytes */
    size_t wb, sb;   /* one expert's data bytes; scales bytes (biases too when Q) */
} stack;

struct tern_weights {
    tern_st_set *st;
    const tern_model_config *cfg;
    char prefix[32];
    uint8_t *used;
    char **ignores;
    int n_ignores;
    stack *stacks;
    int n_stacks;
    struct tern_synth *synth; /* synthetic store (weights_synth.c): tensors made on request */
    tern_weights_shard_fn shard; /* tensor-parallel hook (weights.h), NULL = none */
    tern_weights_local_fn shard_local; /* its local-shape companion for synthetic stores, NULL = none */
    void *shard_ctx;
    int views;              /* per-expert stacks: source tables only, no copy (weights.h) */
    size_t stacked_bytes;   /* bytes copied into per-expert stacks */
};

tern_status tern_weights_open_synth(tern_weights **out, const tern_model_config *cfg, const tern_synth_spec *spec,
                                    tern_error *err) {
    *out = NULL;
    tern_weights *w = calloc(1, sizeof *w);
    if (!w) return tern_err(err, TERN_ENOMEM, "out of memory");
    w->cfg = cfg;
    if (!(w->synth = tern__synth_new(cfg, spec))) { free(w); return tern_err(err, TERN_ENOMEM, "out of memory"); }
    *out = w;
    return TERN_OK;
}

static const char *k_prefixes[] = {"model.language_model.", "language_model.model.", "model.", ""};
static const char *k_towers[] = {"vision_tower", "vision_embedder", "audio_tower", "embed_vision", "embed_audio",
                                 "multi_modal_projector", "rotary_emb."};

static const tern_st_entry *find(tern_weights *w, const char *name) { return tern_st_find(w->st, name); }

static void mark(tern_weights *w, const tern_st_entry *e) {
    if (e) w->used[e - tern_st_at(w->st, 0)] = 1;
}

static const char *fname(const tern_weights *w, const char *stored) {
    const tern_st_entry *e = tern_st_find(w->st, stored);
    return e ? tern_st_file_name(w->st, e->file) : "?";
}

static void shape_str(char *buf, size_t n, int nd, const int64_t *sh) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)sh[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* ---- open / close ---------------------------------------------------------------- */

tern_status tern_weights_open(tern_weights **out, const char *dir, const tern_model_config *cfg, tern_error *err) {
    return tern_weights_open_opts(out, dir, cfg, NULL, err);
}

tern_status tern_weights_open_opts(tern_weights **out, const char *dir, const tern_model_config *cfg,
                                   const tern_st_opts *sto, tern_error *err) {
    *out = NULL;
    tern_weights *w = calloc(1, sizeof *w);
    if (!w) return tern_err(err, TERN_ENOMEM, "weights: out of memory");
    w->cfg = cfg;
    tern_status st = tern_st_open_opts(&w->st, dir, sto, err);
    if (st) goto fail;
    w->used = calloc((size_t)tern_st_count(w->st) + 1, 1);
    if (!w->used) {
        st = tern_err(err, TERN_ENOMEM, "weights: out of memory");
        goto fail;
    }
    int found = 0;
    for (size_t i = 0; i < TERN_ARRAY_LEN(k_prefixes) && !found; i++) {
        char n[96];
        snprintf(n, sizeof n, "%sembed_tokens.weight", k_prefixes[i]);
        if (find(w, n)) {
            snprintf(w->prefix, sizeof w->prefix, "%s", k_prefixes[i]);
            found = 1;
        }
    }
    if (!found) {
        st = tern_err(err, TERN_ENOTFOUND,
                      "%s: no embed_tokens.weight (tried prefixes model.language_model., language_model.model., "
                      "model. and none)",
                      dir);
        goto fail;
    }
    *out = w;
    return TERN_OK;
fail:
    tern_weights_close(w);
    return st;
}

void tern_weights_close(tern_weights *w) {
    if (!w) return;
    tern__synth_free(w->synth);
    for (int i = 0; i < w->n_stacks; i++) {
        free(w->stacks[i].canon);
        free(w->stacks[i].name);
        tern_afree(w->stacks[i].w);
        tern_afree(w->stacks[i].s);
        tern_afree(w->stacks[i].b);
        free(w->stacks[i].src);
    }
    free(w->stacks);
    for (int i = 0; i < w->n_ignores; i++) free(w->ignores[i]);
    free(w->ignores);
    free(w->used);
    tern_st_close(w->st);
    free(w);
}

/* ---- one module (plain or MLX-quantized) ------------------------------------------ */

/* Block-scaled FP8 (tensor.h): attach "<base>.weight_scale_inv" (or, for a bare fused tensor
 * such as experts.gate_up_proj, "<base>_scale_inv" / "<base>_scales_inv") to the F8_E4M3
 * entry e. The block size comes from the config's fp8 quantization_config; the scale grid
 * must be F32 [.., ceil(out/rows), ceil(in/cols)]. Returns 1 or a negative status. */
static int resolve_fp8(tern_weights *w, const char *base, const tern_st_entry *e, int bare, tern_tensor *t,
                       tern_error *err) {
    char n[512];
    const char *file = tern_st_file_name(w->st, e->file);
    const tern_st_entry *sc = NULL;
    if (bare) {
        snprintf(n, sizeof n, "%s_scale_inv", base);
        if (!(sc = find(w, n))) snprintf(n, sizeof n, "%s_scales_inv", base), sc = find(w, n);
    } else {
        snprintf(n, sizeof n, "%s.weight_scale_inv", base);
        sc = find(w, n);
    }
    const tern_quant_config *q = w->cfg ? &w->cfg->quant : NULL;
    if (!sc)
        return tern_err(err, TERN_EFORMAT, "%s: F8_E4M3 tensor '%.200s' has no block scales '%.200s'", file, e->name, n);
    mark(w, sc);
    if (!q || !q->fp8)
        return tern_err(err, TERN_EFORMAT,
                        "%s: tensor '%.200s' has FP8 block scales but config.json has no quantization_config with "
                        "quant_method \"fp8\"", file, e->name);
    if (sc->dtype != TERN_DT_F32)
        return tern_err(err, TERN_EFORMAT, "%s: FP8 scales '%.200s' have dtype %s (want F32)", file, sc->name,
                        tern_dtype_name(sc->dtype));
    int nd = e->ndim, br = q->fp8_block[0], bc = q->fp8_block[1], ok = nd >= 2 && sc->ndim == nd;
    for (int i = 0; ok && i < nd - 2; i++) ok = sc->shape[i] == e->shape[i];
    if (ok) ok = sc->shape[nd - 2] == (e->shape[nd - 2] + br - 1) / br && sc->shape[nd - 1] == (e->shape[nd - 1] + bc - 1) / bc;
    if (!ok) {
        char a[96], b[96];
        shape_str(a, sizeof a, nd, e->shape);
        shape_str(b, sizeof b, sc->ndim, sc->shape);
        return tern_err(err, TERN_EFORMAT,
                        "%s: FP8 tensor '%.200s' %s: scales '%.200s' are %s, want ceil(out/%d) x ceil(in/%d) "
                        "(weight_block_size [%d, %d])", file, e->name, a, sc->name, b, br, bc, br, bc);
    }
    t->scales = sc->data;
    t->sdtype = TERN_DT_F32;
    t->group_size = bc;
    t->blk_rows = br;
    return 1;
}

/* Resolve stored module `base` ("<base>.weight", or "<base>" itself when bare is set).
 * Returns 1 found (t filled), 0 absent, negative status on a format error. */
static int resolve_module(tern_weights *w, const char *base, int bare, tern_tensor *t, tern_error *err) {
    char n[512];
    snprintf(n, sizeof n, "%s.weight", base);
    const tern_st_entry *e = find(w, n);
    if (!e && bare) e = find(w, base);
    if (!e) return 0;
    memset(t, 0, sizeof *t);
    t->device = -1;
    t->name = e->name;
    t->dtype = e->dtype;
    t->ndim = e->ndim;
    memcpy(t->shape, e->shape, sizeof t->shape);
    t->data = e->data;
    mark(w, e);
    if (e->dtype == TERN_DT_F8_E4M3) return resolve_fp8(w, base, e, bare && !strcmp(e->name, base), t, err);
    snprintf(n, sizeof n, "%s.scales", base);
    const tern_st_entry *sc = find(w, n);
    if (!sc) return 1;
    snprintf(n, sizeof n, "%s.biases", base);
    const tern_st_entry *bi = find(w, n);
    mark(w, sc);
    mark(w, bi);
    const char *file = tern_st_file_name(w->st, e->file);
    const tern_quant_config *q = w->cfg ? &w->cfg->quant : NULL;
    int bits = 0, gs = 0;
    if (!q || !q->enabled)
        return tern_err(err, TERN_EFORMAT,
                        "%s: tensor '%.200s' has MLX scales but config.json has no quantization block", file, e->name);
    if (!tern_quant_lookup(q, base, &bits, &gs))
        return tern_err(err, TERN_EFORMAT,
                        "%s: tensor '%.200s' has MLX scales but config.json marks module '%.150s' as not quantized",
                        file, e->name, base);
    if (!bi)
        return tern_err(err, TERN_EFORMAT, "%s: quantized tensor '%.200s' has scales but no '%.200s'", file, e->name, n);
    if (e->dtype != TERN_DT_U32 || e->ndim < 1)
        return tern_err(err, TERN_EFORMAT, "%s: quantized tensor '%.200s' must be U32 with at least 1 dim, is %s/%dD",
                        file, e->name, tern_dtype_name(e->dtype), e->ndim);
    if (sc->dtype != TERN_DT_BF16 && sc->dtype != TERN_DT_F16 && sc->dtype != TERN_DT_F32)
        return tern_err(err, TERN_EFORMAT, "%s: scales of '%.200s' have dtype %s (want BF16/F16/F32)", file, e->name,
                        tern_dtype_name(sc->dtype));
    int nd = e->ndim, same = sc->ndim == nd && bi->ndim == nd && bi->dtype == sc->dtype;
    for (int i = 0; same && i < nd; i++) same = bi->shape[i] == sc->shape[i] && (i == nd - 1 || sc->shape[i] == e->shape[i]);
    char a[96], b[96], c[96];
    if (!same) {
        shape_str(a, sizeof a, nd, e->shape);
        shape_str(b, sizeof b, sc->ndim, sc->shape);
        shape_str(c, sizeof c, bi->ndim, bi->shape);
        return tern_err(err, TERN_EFORMAT, "%s: quantized tensor '%.200s' %s: scales %s %s / biases %s %s disagree",
                        file, e->name, a, tern_dtype_name(sc->dtype), b, tern_dtype_name(bi->dtype), c);
    }
    int64_t packed = e->shape[nd - 1];
    if ((packed * 32) % bits)
        return tern_err(err, TERN_EFORMAT, "%s: quantized tensor '%.200s': %lld packed words do not hold whole %d-bit codes",
                        file, e->name, (long long)packed, bits);
    int64_t in = packed * 32 / bits;
    if (in % gs || sc->shape[nd - 1] != in / gs)
        return tern_err(err, TERN_EFORMAT,
                        "%s: quantized tensor '%.200s': %lld u32 columns at %d bits = %lld inputs, so scales need "
                        "%lld columns at group_size %d, but have %lld",
                        file, e->name, (long long)packed, bits, (long long)in, (long long)(in / gs), gs,
                        (long long)sc->shape[nd - 1]);
    t->dtype = TERN_DT_Q;
    t->shape[nd - 1] = in;
    t->bits = bits;
    t->group_size = gs;
    t->sdtype = sc->dtype;
    t->scales = sc->data;
    t->biases = bi->data;
    return 1;
}

/* ---- expert stacks ---------------------------------------------------------------- */

/* "layers.L.experts.gate|up|down" → L and kind (0 gate, 1 up, 2 down); 0 if not that form */
static int parse_expert(const char *name, int *layer, int *kind) {
    if (strncmp(name, "layers.", 7)) return 0;
    const char *p = name + 7;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || l < 0 || l > 1000000 || strncmp(end, ".experts.", 9)) return 0;
    const char *k = end + 9;
    *kind = !strcmp(k, "gate") ? 0 : !strcmp(k, "up") ? 1 : !strcmp(k, "down") ? 2 : -1;
    *layer = (int)l;
    return *kind >= 0;
}

static int same_layout(const tern_tensor *a, const tern_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->bits != b->bits || a->group_size != b->group_size ||
        a->sdtype != b->sdtype || a->blk_rows != b->blk_rows || !a->scales != !b->scales)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* Copy a views stack's experts into owned buffers (s->w/s/b) and point s->t at them. */
static int materialize(tern_weights *w, stack *s, tern_error *err) {
    int E = (int)s->t.shape[0];
    size_t wb = s->wb, sb = s->sb, total;
    int qb = s->t.dtype == TERN_DT_Q;
    if (!tern_mul_ok(wb, (size_t)E, &total) || !(s->w = tern_aalloc(total)) ||
        (sb && (!(s->s = tern_aalloc(sb * (size_t)E)) || (qb && !(s->b = tern_aalloc(sb * (size_t)E)))))) {
        tern_afree(s->w);
        tern_afree(s->s);
        s->w = s->s = NULL;
        return tern_err(err, TERN_ENOMEM, "weights: cannot allocate %d stacked experts for %s", E, s->canon);
    }
    for (int e = 0; e < E; e++) {
        memcpy((uint8_t *)s->w + (size_t)e * wb, s->src[e].data, wb);
        if (sb) {
            memcpy((uint8_t *)s->s + (size_t)e * sb, s->src[e].scales, sb);
            if (qb) memcpy((uint8_t *)s->b + (size_t)e * sb, s->src[e].biases, sb);
        }
    }
    w->stacked_bytes += total + (sb ? sb * (size_t)E * (qb ? 2 : 1) : 0);
    s->t.data = s->w;
    s->t.scales = sb ? s->s : NULL;
    s->t.biases = qb ? s->b : NULL;
    return 1;
}

/* per-expert matrices "<base>.{e}.<kind>_proj" for e in [0, E): a source table of each expert's
 * stored bytes, then (views off) copied into one [E, out, in] stack */
static int stack_experts(tern_weights *w, const char *canon, const char *base, const char *kname, tern_tensor *t,
                         tern_error *err) {
    char n[512];
    tern_tensor t0;
    snprintf(n, sizeof n, "%s.0.%s", base, kname);
    int r = resolve_module(w, n, 0, &t0, err);
    if (r <= 0) return r;
    if (t0.ndim != 2)
        return tern_err(err, TERN_EFORMAT, "%s: expert tensor '%.200s' must be 2-D, is %dD", fname(w, t0.name),
                        t0.name, t0.ndim);
    int E = w->cfg ? w->cfg->n_expert : 0;
    if (E <= 0) /* no count in the config: take every consecutive expert present */
        for (E = 1;; E++) {
            snprintf(n, sizeof n, "%s.%d.%s.weight", base, E, kname);
            if (!find(w, n)) break;
        }
    stack *ns = realloc(w->stacks, (size_t)(w->n_stacks + 1) * sizeof *ns);
    if (!ns) return tern_err(err, TERN_ENOMEM, "weights: out of memory");
    w->stacks = ns;
    stack *s = &w->stacks[w->n_stacks];
    memset(s, 0, sizeof *s);
    s->wb = tern_tensor_row_bytes(&t0) * (size_t)t0.shape[0];
    if (t0.dtype == TERN_DT_Q) s->sb = (size_t)(t0.shape[0] * (t0.shape[1] / t0.group_size)) * tern_dtype_size(t0.sdtype);
    else if (tern_tensor_is_fp8_block(&t0)) s->sb = tern_tensor_fp8_scale_bytes(&t0);
    if (!(s->src = calloc((size_t)E, sizeof *s->src))) return tern_err(err, TERN_ENOMEM, "weights: out of memory");
    int rc = 1;
    for (int e = 0; e < E && rc > 0; e++) {
        tern_tensor te;
        snprintf(n, sizeof n, "%s.%d.%s", base, e, kname);
        int re = resolve_module(w, n, 0, &te, err);
        if (re == 0) rc = tern_err(err, TERN_ENOTFOUND, "weights: expert %d of %d missing: no '%.300s.weight'", e, E, n);
        else if (re < 0) rc = re;
        else if (!same_layout(&te, &t0)) {
            char a[96], b[96];
            shape_str(a, sizeof a, te.ndim, te.shape);
            shape_str(b, sizeof b, t0.ndim, t0.shape);
            rc = tern_err(err, TERN_EFORMAT, "%s: expert tensor '%.200s' is %s %s but expert 0 is %s %s",
                          fname(w, te.name), te.name, tern_dtype_name(te.dtype), a, tern_dtype_name(t0.dtype), b);
        } else {
            s->src[e].data = te.data;
            s->src[e].scales = te.scales;
            s->src[e].biases = te.biases;
        }
    }
    snprintf(n, sizeof n, "%s.*.%s.weight", base, kname);
    s->canon = strdup(canon);
    s->name = strdup(n);
    if (rc > 0 && (!s->canon || !s->name)) rc = tern_err(err, TERN_ENOMEM, "weights: out of memory");
    s->t = t0;
    s->t.ndim = 3;
    s->t.shape[0] = E;
    s->t.shape[1] = t0.shape[0];
    s->t.shape[2] = t0.shape[1];
    s->t.name = s->name;
    if (rc > 0 && !w->views) rc = materialize(w, s, err);
    if (rc < 0) {
        free(s->canon);
        free(s->name);
        free(s->src);
        return rc;
    }
    w->n_stacks++;
    *t = s->t;
    return 1;
}

static int resolve_experts(tern_weights *w, const char *canon, int layer, int kind, tern_tensor *t, tern_error *err) {
    static const char *kn[] = {"gate_proj", "up_proj", "down_proj"};
    char base[256];
    int r;
    for (int i = 0; i < w->n_stacks; i++)
        if (!strcmp(w->stacks[i].canon, canon)) {
            if (!w->views && !w->stacks[i].w && (r = materialize(w, &w->stacks[i], err)) < 0) return r;
            *t = w->stacks[i].t;
            return 1;
        }
    /* HF fused: experts.gate_up_proj [E, 2I, H] (gate rows first) + experts.down_proj [E, H, I] */
    snprintf(base, sizeof base, "%slayers.%d.experts.%s", w->prefix, layer, kind == 2 ? "down_proj" : "gate_up_proj");
    if ((r = resolve_module(w, base, 1, t, err)) != 0) {
        if (r < 0 || kind == 2) return r;
        if (t->ndim != 3 || t->shape[1] % 2)
            return tern_err(err, TERN_EFORMAT, "%s: '%.200s' must be [E, 2*I, H], is %dD with %lld rows",
                            fname(w, t->name), t->name, t->ndim, (long long)t->shape[1]);
        int64_t I = t->shape[1] / 2;
        size_t rb = tern_tensor_row_bytes(t);
        size_t ss = t->dtype == TERN_DT_Q ? (size_t)(t->shape[2] / t->group_size) * tern_dtype_size(t->sdtype) : 0;
        if (tern_tensor_is_fp8_block(t)) { /* gate/up views over the scale grid: whole row blocks each */
            if (I % t->blk_rows)
                return tern_err(err, TERN_EUNSUPPORTED, "%s: FP8 '%.200s': I = %lld is not a multiple of the %d-row "
                                "scale block, so gate and up cannot be split", fname(w, t->name), t->name,
                                (long long)I, t->blk_rows);
            size_t srow = (size_t)tern_tensor_fp8_scale_cols(t) * 4;
            t->mat_stride = (size_t)(2 * I) * rb;
            t->mat_stride_s = (size_t)(2 * I / t->blk_rows) * srow;
            t->shape[1] = I;
            if (kind == 1) {
                t->data = (const uint8_t *)t->data + (size_t)I * rb;
                t->scales = (const uint8_t *)t->scales + (size_t)(I / t->blk_rows) * srow;
            }
            return 1;
        }
        t->mat_stride = (size_t)(2 * I) * rb;
        t->mat_stride_s = (size_t)(2 * I) * ss;
        t->shape[1] = I;
        if (kind == 1) {
            t->data = (const uint8_t *)t->data + (size_t)I * rb;
            if (ss) {
                t->scales = (const uint8_t *)t->scales + (size_t)I * ss;
                t->biases = (const uint8_t *)t->biases + (size_t)I * ss;
            }
        }
        return 1;
    }
    /* mlx Gemma 4: experts.switch_glu.*; GLM mlx: mlp.switch_mlp.* */
    snprintf(base, sizeof base, "%slayers.%d.experts.switch_glu.%s", w->prefix, layer, kn[kind]);
    if ((r = resolve_module(w, base, 0, t, err)) != 0) return r;
    snprintf(base, sizeof base, "%slayers.%d.mlp.switch_mlp.%s", w->prefix, layer, kn[kind]);
    if ((r = resolve_module(w, base, 0, t, err)) != 0) return r;
    /* per-expert matrices */
    snprintf(base, sizeof base, "%slayers.%d.mlp.experts", w->prefix, layer);
    if ((r = stack_experts(w, canon, base, kn[kind], t, err)) != 0) return r;
    snprintf(base, sizeof base, "%slayers.%d.experts", w->prefix, layer);
    return stack_experts(w, canon, base, kn[kind], t, err);
}

/* ---- lookup ----------------------------------------------------------------------- */

static int resolve(tern_weights *w, const char *name, tern_tensor *t, char *tried, size_t tn, tern_error *err) {
    char base[512];
    int layer, kind, r;
    if (!strcmp(name, "lm_head")) {
        /* top level, under the wrapper ("language_model.lm_head"), or under the prefix */
        char parent[32];
        size_t pl = strlen(w->prefix);
        snprintf(parent, sizeof parent, "%s", w->prefix);
        if (pl >= 6 && !strcmp(parent + pl - 6, "model.")) parent[pl - 6] = 0;
        const char *cands[3] = {"", parent, w->prefix};
        for (int i = 0; i < 3; i++) {
            snprintf(base, sizeof base, "%slm_head", cands[i]);
            if ((r = resolve_module(w, base, 0, t, err)) != 0) return r;
        }
        snprintf(tried, tn, "lm_head.weight, %slm_head.weight, %slm_head.weight", parent, w->prefix);
        return 0;
    }
    if (parse_expert(name, &layer, &kind)) {
        snprintf(tried, tn, "%slayers.%d.experts.{gate_up_proj,down_proj,switch_glu.*}, mlp.switch_mlp.*, "
                 "mlp.experts.N.*", w->prefix, layer);
        return resolve_experts(w, name, layer, kind, t, err);
    }
    snprintf(base, sizeof base, "%s%s", w->prefix, name);
    snprintf(tried, tn, "%.190s.weight, %.190s", base, base);
    return resolve_module(w, base, 1, t, err);
}

int tern_weights_try(tern_weights *w, const char *name, int ndim, const int64_t *shape, tern_tensor *t,
                     tern_error *err) {
    char tried[400];
    tern_tensor tmp;
    memset(t, 0, sizeof *t);
    if (!w || !name) return tern_err(err, TERN_EINVAL, "weights: NULL store or name");
    int r;
    if (w->synth && w->shard) { /* synthetic tensors are made in the shape asked for, stacks in the rank's part */
        int64_t loc[TERN_MAX_DIMS];
        const int64_t *sh = shape;
        if (shape && ndim >= 1 && ndim <= TERN_MAX_DIMS && w->shard_local) {
            memcpy(loc, shape, sizeof *loc * (size_t)ndim);
            w->shard_local(w->shard_ctx, name, ndim, loc);
            sh = loc;
        }
        if ((r = tern__synth_try(w->synth, name, ndim, sh, &tmp, err)) <= 0) return r;
        if ((r = w->shard(w->shard_ctx, name, ndim, shape, &tmp, err)) < 0) return r;
        *t = tmp;
        return 1;
    }
    if (w->synth) return tern__synth_try(w->synth, name, ndim, shape, t, err);
    r = resolve(w, name, &tmp, tried, sizeof tried, err);
    if (r <= 0) return r;
    if (w->shard && (r = w->shard(w->shard_ctx, name, ndim, shape, &tmp, err)) != 0) {
        if (r < 0) return r;
        *t = tmp;
        return 1;
    }
    if (shape) {
        int ok = tmp.ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = tmp.shape[i] == shape[i];
        if (!ok) {
            char a[96], b[96];
            shape_str(a, sizeof a, ndim, shape);
            shape_str(b, sizeof b, tmp.ndim, tmp.shape);
            return tern_err(err, TERN_EFORMAT, "%s: tensor '%.150s' (stored as '%.150s'): expected shape %s, got %s",
                            fname(w, tmp.name), name, tmp.name, a, b);
        }
    }
    *t = tmp;
    return 1;
}

tern_status tern_weights_get(tern_weights *w, const char *name, int ndim, const int64_t *shape, tern_tensor *t,
                             tern_error *err) {
    int r = tern_weights_try(w, name, ndim, shape, t, err);
    if (r > 0) return TERN_OK;
    if (r < 0) return (tern_status)r;
    char tried[400];
    tern_tensor tmp;
    resolve(w, name, &tmp, tried, sizeof tried, NULL);
    return tern_err(err, TERN_ENOTFOUND, "weights: tensor '%.100s' not found (tried %.350s)", name, tried);
}

/* ---- bookkeeping ------------------------------------------------------------------ */

void tern_weights_ignore(tern_weights *w, const char *canonical_prefix) {
    if (!w || w->synth) return;
    if (!w || !canonical_prefix) return;
    char **ni = realloc(w->ignores, (size_t)(w->n_ignores + 1) * sizeof *ni);
    if (!ni) return;
    w->ignores = ni;
    size_t n = strlen(w->prefix) + strlen(canonical_prefix) + 1;
    char *s = malloc(n);
    if (!s) return;
    snprintf(s, n, "%s%s", w->prefix, canonical_prefix);
    w->ignores[w->n_ignores++] = s;
}

static int ignored(const tern_weights *w, const char *name) {
    for (size_t i = 0; i < TERN_ARRAY_LEN(k_towers); i++)
        if (strstr(name, k_towers[i])) return 1;
    for (int i = 0; i < w->n_ignores; i++)
        if (!strncmp(name, w->ignores[i], strlen(w->ignores[i]))) return 1;
    return 0;
}

int tern_weights_unused(const tern_weights *w, const char **names, int max) {
    if (!w || w->synth) return 0;
    int n = 0;
    for (int i = 0; i < tern_st_count(w->st); i++) {
        const tern_st_entry *e = tern_st_at(w->st, i);
        if (w->used[i] || ignored(w, e->name)) continue;
        if (names && n < max) names[n] = e->name;
        n++;
    }
    return n;
}

void tern_weights_set_shard(tern_weights *w, tern_weights_shard_fn fn, void *ctx) {
    if (!w) return;
    w->shard = fn;
    w->shard_ctx = ctx;
    if (!fn) w->shard_local = NULL;
}

void tern_weights_set_shard_local(tern_weights *w, tern_weights_local_fn fn) {
    if (w) w->shard_local = fn;
}

const char *tern_weights_prefix(const tern_weights *w) { return w ? w->prefix : ""; }

const tern_st_set *tern_weights_set(const tern_weights *w) { return w ? w->st : NULL; }

void tern_weights_set_expert_views(tern_weights *w, int on) {
    if (w) w->views = on != 0;
}

const tern_expert_src *tern_weights_expert_views(const tern_weights *w, const tern_tensor *stack, int e0) {
    if (!w || !stack || !stack->name || stack->ndim != 3 || e0 < 0) return NULL;
    for (int i = 0; i < w->n_stacks; i++)
        if (!strcmp(w->stacks[i].name, stack->name) && e0 + stack->shape[0] <= w->stacks[i].t.shape[0])
            return w->stacks[i].src + e0;
    return NULL;
}

size_t tern_weights_stacked_bytes(const tern_weights *w) { return w ? w->stacked_bytes : 0; }

size_t tern_weights_synth_bytes(const tern_weights *w) { return w ? tern__synth_bytes(w->synth) : 0; }
