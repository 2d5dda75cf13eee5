/*
 * kv.c — paged KV pools and block tables (see kv.h). Two groups: 0 = full, 1 = sliding.
 * Block tables live on the host (authoritative) and are mirrored to the device by tern_kv_sync: the rows of the slots
 * whose tables changed (a step's few new blocks are small uploads, which the CUDA backend queues without waiting —
 * a whole table of many long slots would be a synchronous copy that stalls a pipelined decode), or the whole table.
 * Blocks are reference counted: a slot's table entry holds one reference, the prefix cache
 * may hold more (tern_kv_share / tern_kv_ref); a block returns to the free list at zero.
 */
#include "runtime/kv.h"
#include "ops/kvq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_group {
    int used_by_layers;   /* number of owning layers in the group */
    int window;           /* 0 for full */
    int n_blocks;
    int *free_list, n_free;
    int *ref;             /* [n_blocks] references (slot tables + prefix cache) */
    int32_t *table;       /* host [n_slots * max_blocks] */
    int32_t *table_dev;   /* device mirror */
    int *trimmed;         /* [n_slots] blocks below this index were freed by trim (sliding) */
    uint8_t *sdirty;      /* [n_slots] the slot's table row changed since the last sync */
    int dirty;            /* 1: some row changed (sdirty says which), 2: the whole table */
} kv_group;

struct tern_kv {
    tern_backend *be;
    int n_layer, block_size, n_slots, max_ctx, max_blocks;
    kv_group g[2];
    tern_kv_layer *views;  /* [n_layer] */
    void **pools;          /* [n_layer * 2] owned device pools */
    void **rots;           /* [n_layer] owned device rotation signs (TURBO layers) */
    size_t *rec;           /* [n_layer * 2] bytes of one (token, kv head) record of K / V */
};

static int layer_group(const tern_model_config *cfg, int l) {
    return cfg->layers[l].type == TERN_LAYER_SLIDING && cfg->sliding_window > 0 ? 1 : 0;
}

/* ---- page formats (per layer, per K/V): record sizes from ops/kvq.h ---- */

static const tern_kv_fmt k_f32_fmt;

static const tern_kv_fmt *layer_fmt(const tern_kv_fmt *formats, int l, int is_v) {
    return formats ? &formats[2 * l + is_v] : &k_f32_fmt;
}

size_t tern_kv_layer_bytes_per_token(const tern_model_config *cfg, const tern_kv_fmt *formats, int l) {
    if (l < 0 || l >= cfg->n_layer || cfg->layers[l].kv_src != l) return 0;
    int d = cfg->layers[l].head_dim;
    /* MLA latent kind (GLM-5): a K record of head_dim elements and a V record of kv_v_dim, f32 or bf16 alike */
    if (cfg->layers[l].kv_latent)
        return ((size_t)d + (size_t)cfg->layers[l].kv_v_dim) * (layer_fmt(formats, l, 0)->kind == TERN_KV_BF16 ? 2 : 4);
    return (size_t)cfg->layers[l].n_head_kv *
           (tern_kvq_vec_bytes(layer_fmt(formats, l, 0), d) + tern_kvq_vec_bytes(layer_fmt(formats, l, 1), d));
}

size_t tern_kv_bytes_per_token_fmt(const tern_model_config *cfg, const tern_kv_fmt *formats) {
    size_t b = 0;
    for (int l = 0; l < cfg->n_layer; l++) b += tern_kv_layer_bytes_per_token(cfg, formats, l);
    return b;
}

size_t tern_kv_bytes_per_token(const tern_model_config *cfg) { return tern_kv_bytes_per_token_fmt(cfg, NULL); }

size_t tern_kv_token_bytes(const tern_kv *kv) {
    size_t b = 0;
    for (int l = 0; kv && l < kv->n_layer; l++)
        if (kv->pools[2 * l]) b += (size_t)kv->views[l].n_head_kv * (kv->rec[2 * l] + kv->rec[2 * l + 1]);
    return b;
}

size_t tern_kv_read_bytes(const tern_kv *kv, long ctx) {
    size_t b = 0;
    for (int l = 0; kv && l < kv->n_layer; l++)
        if (kv->pools[2 * l]) {
            const long w = kv->views[l].window, n = w > 0 && w < ctx ? w : ctx;
            b += (size_t)n * (size_t)kv->views[l].n_head_kv * (kv->rec[2 * l] + kv->rec[2 * l + 1]);
        }
    return b;
}

/* kv.h: validate the formats of owning layers (every backend runs every kind: CPU, CUDA). */
tern_status tern_kv_check_formats(const tern_model_config *cfg, const tern_kv_fmt *formats, tern_error *err) {
    if (!formats) return TERN_OK;
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->layers[l].kv_src != l) continue;
        for (int w = 0; w < 2; w++) {
            const tern_kv_fmt *f = layer_fmt(formats, l, w);
            char what[48];
            snprintf(what, sizeof what, "layer %d %s", l, w ? "V" : "K");
            if (cfg->layers[l].kv_latent && ((f->kind != TERN_KV_F32 && f->kind != TERN_KV_BF16) ||
                                             f->kind != layer_fmt(formats, l, 0)->kind))
                return tern_err(err, TERN_EUNSUPPORTED, "kv %s: the MLA latent cache (GLM-5) takes f32 or bf16 pages, "
                                "the same for K and V (--kv-quant off or bf16)", what);
            tern_status st = tern_kvq_check(f, cfg->layers[l].head_dim, what, err);
            if (st) return st;
        }
    }
    return TERN_OK;
}

void tern_kv_pool_blocks(int window, int bs, int max_ctx, int n_slots, int chunk, int64_t out[2]) {
    bs = bs > 0 ? bs : 16;
    chunk = chunk > 0 ? chunk : 512;
    const int64_t n = n_slots > 0 ? n_slots : 1, mb = ((int64_t)TERN_MAX(max_ctx, 0) + bs - 1) / bs;
    const int64_t w = ((int64_t)TERN_MAX(window, 0) + bs - 1) / bs + 1, c = ((int64_t)chunk + bs - 1) / bs;
    out[0] = n * mb;
    /* one slot: its window before the step's first row + a whole chunk of rows (as
     * tern_kv_blocks_needed). All slots in one step: slot i holds <= w + ceil(rows_i / bs) and
     * the ceils sum to <= n + chunk / bs (rows_i >= 1 where a slot takes part, sum rows_i <= chunk) */
    out[1] = TERN_MIN(n * TERN_MIN(mb, w + c), n * (w + 1) + c);
}

tern_status tern_kv_open(tern_kv **out, tern_backend *be, const tern_model_config *cfg,
                         const tern_kv_opts *opts, tern_error *err) {
    *out = NULL;
    tern_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return tern_err(err, TERN_ENOMEM, "kv: out of memory");
    kv->be = be;
    kv->n_layer = cfg->n_layer;
    kv->block_size = opts && opts->block_size > 0 ? opts->block_size : 16;
    kv->n_slots = opts && opts->n_slots > 0 ? opts->n_slots : 1;
    int ctx = opts && opts->max_ctx > 0 ? opts->max_ctx : (cfg->n_ctx_train > 0 ? cfg->n_ctx_train : 4096);
    if (!(opts && opts->max_ctx > 0) && ctx > 8192) ctx = 8192;
    kv->max_ctx = ctx;
    kv->max_blocks = (ctx + kv->block_size - 1) / kv->block_size;
    const tern_kv_fmt *formats = opts ? opts->formats : NULL;
    tern_status fst = tern_kv_check_formats(cfg, formats, err);
    if (fst) { free(kv); return fst; }
    kv->views = calloc((size_t)cfg->n_layer, sizeof *kv->views);
    kv->pools = calloc((size_t)cfg->n_layer * 2, sizeof *kv->pools);
    kv->rots = calloc((size_t)cfg->n_layer, sizeof *kv->rots);
    kv->rec = calloc((size_t)cfg->n_layer * 2, sizeof *kv->rec);
    if (!kv->views || !kv->pools || !kv->rots || !kv->rec) { tern_kv_close(kv); return tern_err(err, TERN_ENOMEM, "kv: out of memory"); }

    /* bytes per block per group (sum over owning layers) */
    size_t per_block[2] = {0, 0};
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->layers[l].kv_src != l) continue;
        int gi = layer_group(cfg, l);
        kv->g[gi].used_by_layers++;
        per_block[gi] += (size_t)kv->block_size * tern_kv_layer_bytes_per_token(cfg, formats, l);
    }
    kv->g[1].window = cfg->sliding_window;
    /* blocks of each group for n_slots sequences (sliding: window per slot + one chunk shared) */
    int64_t need[2];
    tern_kv_pool_blocks(cfg->sliding_window, kv->block_size, ctx, kv->n_slots, opts ? opts->chunk : 0, need);
    size_t want = (size_t)need[0] * per_block[0] + (size_t)need[1] * per_block[1];
    size_t memory = opts && opts->memory ? opts->memory : want;
    double frac = want ? (double)memory / (double)want : 1.0;
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers) continue;
        long nb = (long)((double)need[gi] * frac);
        if (nb < 1) nb = 1;
        if (nb > 0x7fffffff / 2) nb = 0x7fffffff / 2;
        g->n_blocks = (int)nb;
        g->free_list = malloc(sizeof(int) * (size_t)nb);
        g->table = malloc(sizeof(int32_t) * (size_t)kv->n_slots * (size_t)kv->max_blocks);
        g->trimmed = calloc((size_t)kv->n_slots, sizeof(int));
        g->sdirty = calloc((size_t)kv->n_slots, 1);
        g->ref = calloc((size_t)nb, sizeof(int));
        g->table_dev = be->vt->alloc(be, sizeof(int32_t) * (size_t)kv->n_slots * (size_t)kv->max_blocks);
        if (!g->free_list || !g->table || !g->table_dev || !g->trimmed || !g->sdirty || !g->ref) { tern_kv_close(kv); return tern_err(err, TERN_ENOMEM, "kv: out of memory for block tables"); }
        for (int i = 0; i < g->n_blocks; i++) g->free_list[i] = g->n_blocks - 1 - i;
        g->n_free = g->n_blocks;
        for (size_t i = 0; i < (size_t)kv->n_slots * (size_t)kv->max_blocks; i++) g->table[i] = -1;
        g->dirty = 2;
    }
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->layers[l].kv_src != l) continue;
        int gi = layer_group(cfg, l);
        tern_kv_layer *v = &kv->views[l];
        v->dtype = TERN_DT_F32;
        v->n_head_kv = cfg->layers[l].n_head_kv;
        v->head_dim = cfg->layers[l].head_dim;
        v->block_size = kv->block_size;
        v->window = gi ? cfg->sliding_window : 0;
        v->max_blocks = kv->max_blocks;
        v->kf = *layer_fmt(formats, l, 0);
        v->vf = *layer_fmt(formats, l, 1);
        v->dtype = v->kf.kind != v->vf.kind ? TERN_DT_Q : v->kf.kind == TERN_KV_F32 ? TERN_DT_F32
                 : v->kf.kind == TERN_KV_F16 ? TERN_DT_F16 : v->kf.kind == TERN_KV_BF16 ? TERN_DT_BF16 : TERN_DT_Q;
        kv->rec[2 * l] = tern_kvq_vec_bytes(&v->kf, v->head_dim);
        kv->rec[2 * l + 1] = tern_kvq_vec_bytes(&v->vf, v->head_dim);
        if (cfg->layers[l].kv_latent) { /* V pool: the indexer key, or none on shared-indexer layers */
            v->latent = 1;
            v->v_dim = cfg->layers[l].kv_v_dim;
            kv->rec[2 * l + 1] = tern_kvq_vec_bytes(&v->vf, v->v_dim); /* f32 or bf16 (tern_kv_check_formats) */
        }
        size_t slots = (size_t)kv->g[gi].n_blocks * kv->block_size * (size_t)v->n_head_kv;
        kv->pools[2 * l] = be->vt->alloc(be, slots * kv->rec[2 * l]);
        kv->pools[2 * l + 1] = kv->rec[2 * l + 1] ? be->vt->alloc(be, slots * kv->rec[2 * l + 1]) : NULL;
        if (!kv->pools[2 * l] || (!kv->pools[2 * l + 1] && kv->rec[2 * l + 1])) {
            tern_kv_close(kv);
            return tern_err(err, TERN_ENOMEM, "kv: cannot allocate %zu bytes for layer %d",
                            slots * (kv->rec[2 * l] + kv->rec[2 * l + 1]), l);
        }
        if (v->kf.kind == TERN_KV_TURBO || v->vf.kind == TERN_KV_TURBO) {
            /* the layer's fixed rotation: seeded by the layer index, so a saved cache restores */
            float signs[TERN_KVQ_MAX_ROT];
            v->rot_dim = tern_kvq_rot_dim(v->head_dim);
            tern_kvq_signs(0x7e2b5eedull + (uint64_t)l * 0x9e3779b97f4a7c15ull, signs, v->rot_dim);
            if (!(kv->rots[l] = be->vt->alloc(be, sizeof(float) * (size_t)v->rot_dim))) {
                tern_kv_close(kv);
                return tern_err(err, TERN_ENOMEM, "kv: cannot allocate the rotation of layer %d", l);
            }
            be->vt->upload(be, kv->rots[l], signs, sizeof(float) * (size_t)v->rot_dim);
            v->rot = kv->rots[l];
        }
        v->k = kv->pools[2 * l];
        v->v = kv->pools[2 * l + 1];
        v->block_table = kv->g[gi].table_dev;
    }
    for (int l = 0; l < cfg->n_layer; l++) {
        int src = cfg->layers[l].kv_src;
        if (src != l) kv->views[l] = kv->views[src];
    }
    *out = kv;
    return TERN_OK;
}

void tern_kv_close(tern_kv *kv) {
    if (!kv) return;
    for (int i = 0; kv->pools && i < kv->n_layer * 2; i++) kv->be->vt->free(kv->be, kv->pools[i]);
    for (int i = 0; kv->rots && i < kv->n_layer; i++) kv->be->vt->free(kv->be, kv->rots[i]);
    free(kv->rots);
    free(kv->rec);
    for (int gi = 0; gi < 2; gi++) {
        free(kv->g[gi].free_list);
        free(kv->g[gi].table);
        free(kv->g[gi].trimmed);
        free(kv->g[gi].sdirty);
        free(kv->g[gi].ref);
        if (kv->g[gi].table_dev) kv->be->vt->free(kv->be, kv->g[gi].table_dev);
    }
    free(kv->pools);
    free(kv->views);
    free(kv);
}

static void block_unref(kv_group *g, int b) {
    if (--g->ref[b] == 0) g->free_list[g->n_free++] = b;
}

/* slot's table row changed (tern_kv_sync uploads it) */
static void mark(kv_group *g, int slot) {
    g->sdirty[slot] = 1;
    if (!g->dirty) g->dirty = 1;
}

static void group_free_slot_range(const tern_kv *kv, kv_group *g, int slot, int from, int to) {
    int32_t *row = g->table + (size_t)slot * kv->max_blocks;
    for (int b = from; b < to; b++)
        if (row[b] >= 0) { block_unref(g, row[b]); row[b] = -1; mark(g, slot); }
}

tern_status tern_kv_reserve(tern_kv *kv, int slot, int n_tokens, tern_error *err) {
    if (slot < 0 || slot >= kv->n_slots) return tern_err(err, TERN_EINVAL, "kv: slot %d out of range", slot);
    if (n_tokens > kv->max_ctx)
        return tern_err(err, TERN_EINVAL, "kv: sequence of %d tokens exceeds the context limit %d", n_tokens, kv->max_ctx);
    int last = (n_tokens + kv->block_size - 1) / kv->block_size;
    /* count first so failure changes nothing */
    int want[2] = {0, 0};
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers) continue;
        int32_t *row = g->table + (size_t)slot * kv->max_blocks;
        int first = g->trimmed[slot]; /* blocks trim() freed are never needed again */
        for (int b = first; b < last; b++) if (row[b] < 0) want[gi]++;
        if (want[gi] > g->n_free)
            return tern_err(err, TERN_ENOMEM, "kv: out of blocks (%s group: need %d, free %d)", gi ? "sliding" : "full", want[gi], g->n_free);
    }
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers) continue;
        int32_t *row = g->table + (size_t)slot * kv->max_blocks;
        int first = g->trimmed[slot]; /* blocks trim() freed are never needed again */
        for (int b = first; b < last; b++)
            if (row[b] < 0) { row[b] = g->free_list[--g->n_free]; g->ref[row[b]] = 1; mark(g, slot); }
    }
    return TERN_OK;
}

void tern_kv_trim(tern_kv *kv, int slot, int min_pos) {
    kv_group *g = &kv->g[1];
    if (!g->used_by_layers || g->window <= 0 || slot < 0 || slot >= kv->n_slots) return;
    int lowest_visible = min_pos - g->window + 1;
    if (lowest_visible <= 0) return;
    int upto = lowest_visible / kv->block_size;
    if (upto <= g->trimmed[slot]) return;
    group_free_slot_range(kv, g, slot, g->trimmed[slot], upto);
    g->trimmed[slot] = upto;
}

void tern_kv_release(tern_kv *kv, int slot) {
    if (!kv || slot < 0 || slot >= kv->n_slots) return;
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers) continue;
        group_free_slot_range(kv, g, slot, 0, kv->max_blocks);
        if (g->trimmed) g->trimmed[slot] = 0;
    }
}

void tern_kv_sync(tern_kv *kv) {
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers || !g->dirty) continue;
        const size_t rb = sizeof(int32_t) * (size_t)kv->max_blocks; /* one slot's row */
        if (g->dirty == 2) {
            kv->be->vt->upload(kv->be, g->table_dev, g->table, rb * (size_t)kv->n_slots);
        } else {
            for (int s = 0; s < kv->n_slots;) { /* runs of changed rows */
                if (!g->sdirty[s]) { s++; continue; }
                int e = s + 1;
                while (e < kv->n_slots && g->sdirty[e]) e++;
                kv->be->vt->upload(kv->be, (uint8_t *)g->table_dev + rb * (size_t)s, g->table + (size_t)s * kv->max_blocks,
                                   rb * (size_t)(e - s));
                s = e;
            }
        }
        memset(g->sdirty, 0, (size_t)kv->n_slots);
        g->dirty = 0;
    }
}

const tern_kv_layer *tern_kv_view(const tern_kv *kv, int layer) { return &kv->views[layer]; }
int tern_kv_n_slots(const tern_kv *kv) { return kv->n_slots; }
int tern_kv_max_ctx(const tern_kv *kv) { return kv->max_ctx; }

void tern_kv_usage(const tern_kv *kv, int group, int *used, int *total) {
    const kv_group *g = &kv->g[group & 1];
    *total = g->n_blocks;
    *used = g->n_blocks - g->n_free;
}

size_t tern_kv_pool_bytes(const tern_kv *kv) {
    size_t b = 0;
    for (int l = 0; kv && l < kv->n_layer; l++)
        if (kv->pools[2 * l])
            b += (size_t)kv->g[tern_kv_layer_group(kv, l)].n_blocks * (size_t)kv->block_size * (size_t)kv->views[l].n_head_kv *
                 (kv->rec[2 * l] + kv->rec[2 * l + 1]);
    return b;
}

/* ---- shared blocks (prefix cache); group 0 only ------------------------------------- */

int tern_kv_block_size(const tern_kv *kv) { return kv->block_size; }

int tern_kv_block(const tern_kv *kv, int slot, int index) {
    const kv_group *g = &kv->g[0];
    if (!g->used_by_layers || slot < 0 || slot >= kv->n_slots || index < 0 || index >= kv->max_blocks) return -1;
    return g->table[(size_t)slot * kv->max_blocks + index];
}

tern_status tern_kv_share(tern_kv *kv, int slot, const int32_t *blocks, int n, tern_error *err) {
    kv_group *g = &kv->g[0];
    if (slot < 0 || slot >= kv->n_slots || n < 0 || n > kv->max_blocks)
        return tern_err(err, TERN_EINVAL, "kv: share of %d blocks into slot %d out of range", n, slot);
    if (kv->g[1].used_by_layers) return tern_err(err, TERN_EUNSUPPORTED, "kv: shared blocks need a model without sliding layers");
    int32_t *row = g->table + (size_t)slot * kv->max_blocks;
    for (int b = 0; b < n; b++) {
        if (row[b] >= 0) return tern_err(err, TERN_EINVAL, "kv: slot %d already holds block index %d", slot, b);
        if (blocks[b] < 0 || blocks[b] >= g->n_blocks || g->ref[blocks[b]] <= 0)
            return tern_err(err, TERN_EINVAL, "kv: block %d is not live", blocks[b]);
    }
    for (int b = 0; b < n; b++) { row[b] = blocks[b]; g->ref[blocks[b]]++; }
    mark(g, slot);
    return TERN_OK;
}

void tern_kv_ref(tern_kv *kv, int block) {
    kv_group *g = &kv->g[0];
    if (block >= 0 && block < g->n_blocks && g->ref[block] > 0) g->ref[block]++;
}

void tern_kv_unref(tern_kv *kv, int block) {
    kv_group *g = &kv->g[0];
    if (block >= 0 && block < g->n_blocks && g->ref[block] > 0) block_unref(g, block);
}

int tern_kv_refcount(const tern_kv *kv, int block) {
    const kv_group *g = &kv->g[0];
    return block >= 0 && block < g->n_blocks ? g->ref[block] : 0;
}

/* ---- appended: group-aware sharing (sliding prefix cache), rollback, block I/O --------
 * These work on block tables and reference counts only, plus whole-block byte copies for
 * persistence, so they do not depend on what a page holds (f32 today, quantized kinds later),
 * as long as a position's K/V is stored within its own block and a write of position p
 * fully replaces what p held (true of per-token formats). */

static int group_ok(const tern_kv *kv, int group) {
    return group >= 0 && group < 2 && kv->g[group].used_by_layers > 0;
}

int tern_kv_has_group(const tern_kv *kv, int group) { return kv && group_ok(kv, group); }

int tern_kv_window(const tern_kv *kv) { return group_ok(kv, 1) ? kv->g[1].window : 0; }

int tern_kv_window_first(const tern_kv *kv, int n_tokens) {
    int w = tern_kv_window(kv);
    if (w <= 0) return 0;
    int lo = n_tokens - w + 1;
    return lo > 0 ? lo / kv->block_size : 0;
}

int tern_kv_group_block(const tern_kv *kv, int group, int slot, int index) {
    if (!group_ok(kv, group) || slot < 0 || slot >= kv->n_slots || index < 0 || index >= kv->max_blocks) return -1;
    return kv->g[group].table[(size_t)slot * kv->max_blocks + index];
}

void tern_kv_group_ref(tern_kv *kv, int group, int block) {
    if (!group_ok(kv, group)) return;
    kv_group *g = &kv->g[group];
    if (block >= 0 && block < g->n_blocks && g->ref[block] > 0) g->ref[block]++;
}

void tern_kv_group_unref(tern_kv *kv, int group, int block) {
    if (!group_ok(kv, group)) return;
    kv_group *g = &kv->g[group];
    if (block >= 0 && block < g->n_blocks && g->ref[block] > 0) block_unref(g, block);
}

int tern_kv_group_refcount(const tern_kv *kv, int group, int block) {
    if (!group_ok(kv, group)) return 0;
    const kv_group *g = &kv->g[group];
    return block >= 0 && block < g->n_blocks ? g->ref[block] : 0;
}

int tern_kv_free_blocks(const tern_kv *kv, int group) { return group_ok(kv, group) ? kv->g[group].n_free : 0; }

int tern_kv_slot_blocks(const tern_kv *kv, int group, int slot) {
    if (!group_ok(kv, group) || slot < 0 || slot >= kv->n_slots) return 0;
    const int32_t *row = kv->g[group].table + (size_t)slot * kv->max_blocks;
    int n = 0;
    for (int b = 0; b < kv->max_blocks; b++) n += row[b] >= 0;
    return n;
}

int tern_kv_blocks_needed(const tern_kv *kv, int group, int n_tokens, int chunk) {
    if (!group_ok(kv, group) || n_tokens <= 0) return 0;
    int last = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (group == 0) return last;
    /* a sliding sequence holds the window before its oldest row plus the rows of one step */
    int w = (kv->g[1].window + kv->block_size - 1) / kv->block_size + 1;
    int c = (TERN_MAX(chunk, 1) + kv->block_size - 1) / kv->block_size;
    return TERN_MIN(last, w + c);
}

tern_status tern_kv_share_prefix(tern_kv *kv, int slot, const int32_t *full, const int32_t *sliding, int n,
                                 tern_error *err) {
    if (slot < 0 || slot >= kv->n_slots || n < 0 || n > kv->max_blocks)
        return tern_err(err, TERN_EINVAL, "kv: share of %d blocks into slot %d out of range", n, slot);
    int lo = tern_kv_window_first(kv, n * kv->block_size);
    for (int gi = 0; gi < 2; gi++) {
        if (!group_ok(kv, gi)) continue;
        const kv_group *g = &kv->g[gi];
        const int32_t *src = gi ? sliding : full;
        const int32_t *row = g->table + (size_t)slot * kv->max_blocks;
        for (int b = 0; b < kv->max_blocks; b++)
            if (row[b] >= 0) return tern_err(err, TERN_EINVAL, "kv: slot %d is not empty (block index %d)", slot, b);
        for (int b = gi ? lo : 0; b < n; b++)
            if (!src || src[b] < 0 || src[b] >= g->n_blocks || g->ref[src[b]] <= 0)
                return tern_err(err, TERN_EINVAL, "kv: %s block at index %d is not live", gi ? "sliding" : "full", b);
    }
    for (int gi = 0; gi < 2; gi++) {
        if (!group_ok(kv, gi)) continue;
        kv_group *g = &kv->g[gi];
        const int32_t *src = gi ? sliding : full;
        int32_t *row = g->table + (size_t)slot * kv->max_blocks;
        for (int b = gi ? lo : 0; b < n; b++) { row[b] = src[b]; g->ref[src[b]]++; }
        if (gi) g->trimmed[slot] = lo;
        mark(g, slot);
    }
    return TERN_OK;
}

tern_status tern_kv_truncate(tern_kv *kv, int slot, int new_len, tern_error *err) {
    if (!kv || slot < 0 || slot >= kv->n_slots) return tern_err(err, TERN_EINVAL, "kv_truncate: slot %d out of range", slot);
    if (new_len < 0 || new_len > kv->max_ctx)
        return tern_err(err, TERN_EINVAL, "kv_truncate: length %d outside [0, %d]", new_len, kv->max_ctx);
    int bs = kv->block_size, keep = (new_len + bs - 1) / bs;
    if (new_len > 0 && group_ok(kv, 1) && kv->g[1].trimmed[slot] > tern_kv_window_first(kv, new_len))
        return tern_err(err, TERN_EINVAL, "kv_truncate: slot %d cannot go back to %d tokens: its sliding blocks below "
                        "index %d were trimmed (during a speculative round trim only to the committed length)",
                        slot, new_len, kv->g[1].trimmed[slot]);
    for (int gi = 0; gi < 2 && new_len % bs; gi++) {
        if (!group_ok(kv, gi)) continue;
        int b = kv->g[gi].table[(size_t)slot * kv->max_blocks + new_len / bs];
        if (b >= 0 && kv->g[gi].ref[b] > 1)
            return tern_err(err, TERN_EINVAL, "kv_truncate: slot %d: %d tokens ends inside a shared block (index %d)",
                            slot, new_len, new_len / bs);
    }
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!group_ok(kv, gi)) continue;
        group_free_slot_range(kv, g, slot, keep, kv->max_blocks);
        if (new_len == 0 && g->trimmed) g->trimmed[slot] = 0;
    }
    return TERN_OK;
}

tern_status tern_kv_reserve_resume(tern_kv *kv, int slot, int n_tokens, tern_error *err) {
    if (!kv || slot < 0 || slot >= kv->n_slots) return tern_err(err, TERN_EINVAL, "kv: slot %d out of range", slot);
    for (int gi = 0; gi < 2; gi++)
        if (tern_kv_slot_blocks(kv, gi, slot)) return tern_err(err, TERN_EINVAL, "kv: slot %d is not empty", slot);
    if (group_ok(kv, 1)) kv->g[1].trimmed[slot] = tern_kv_window_first(kv, n_tokens);
    tern_status st = tern_kv_reserve(kv, slot, n_tokens, err);
    if (st && group_ok(kv, 1)) kv->g[1].trimmed[slot] = 0;
    return st;
}

int tern_kv_layer_group(const tern_kv *kv, int layer) {
    if (!kv || layer < 0 || layer >= kv->n_layer || !kv->pools[2 * layer]) return -1;
    return kv->views[layer].window > 0 ? 1 : 0;
}

size_t tern_kv_layer_block_bytes(const tern_kv *kv, int layer) {
    if (tern_kv_layer_group(kv, layer) < 0) return 0;
    /* the larger of the K and V pages (they differ for e.g. turbo:4,3); tern_kv_block_copy
     * moves each pool's exact page size, so a buffer of this size fits either */
    return (size_t)kv->block_size * (size_t)kv->views[layer].n_head_kv * TERN_MAX(kv->rec[2 * layer], kv->rec[2 * layer + 1]);
}

size_t tern_kv_layer_page_bytes(const tern_kv *kv, int layer, int is_v) {
    if (tern_kv_layer_group(kv, layer) < 0) return 0;
    return (size_t)kv->block_size * (size_t)kv->views[layer].n_head_kv * kv->rec[2 * layer + (is_v ? 1 : 0)];
}

tern_status tern_kv_block_copy(tern_kv *kv, int layer, int block, void *k, void *v, int to_device, tern_error *err) {
    int gi = tern_kv_layer_group(kv, layer);
    if (gi < 0 || block < 0 || block >= kv->g[gi].n_blocks)
        return tern_err(err, TERN_EINVAL, "kv: layer %d block %d has no page", layer, block);
    size_t bk = tern_kv_layer_page_bytes(kv, layer, 0), bv = tern_kv_layer_page_bytes(kv, layer, 1);
    char *pk = (char *)kv->pools[2 * layer] + (size_t)block * bk;
    char *pv = bv ? (char *)kv->pools[2 * layer + 1] + (size_t)block * bv : NULL; /* latent layers may have no V */
    if (to_device) { kv->be->vt->upload(kv->be, pk, k, bk); if (pv) kv->be->vt->upload(kv->be, pv, v, bv); }
    else { kv->be->vt->download(kv->be, k, pk, bk); if (pv) kv->be->vt->download(kv->be, v, pv, bv); }
    return TERN_OK;
}

int tern_kv_n_layer(const tern_kv *kv) { return kv ? kv->n_layer : 0; }

tern_status tern_kv_mirror(tern_kv *dst, const tern_kv *src, tern_error *err) {
    if (!dst || !src) return tern_err(err, TERN_EINVAL, "kv mirror: NULL cache");
    if (dst->n_slots != src->n_slots || dst->max_blocks != src->max_blocks || dst->block_size != src->block_size)
        return tern_err(err, TERN_EINVAL, "kv mirror: caches differ (slots %d/%d, blocks per slot %d/%d)", dst->n_slots,
                        src->n_slots, dst->max_blocks, src->max_blocks);
    for (int gi = 0; gi < 2; gi++)
        if (!dst->g[gi].used_by_layers != !src->g[gi].used_by_layers || dst->g[gi].n_blocks != src->g[gi].n_blocks)
            return tern_err(err, TERN_EINVAL, "kv mirror: group %d differs (%d vs %d blocks)", gi, dst->g[gi].n_blocks,
                            src->g[gi].n_blocks);
    size_t bytes = sizeof(int32_t) * (size_t)src->n_slots * src->max_blocks;
    for (int gi = 0; gi < 2; gi++) {
        kv_group *d = &dst->g[gi];
        const kv_group *s = &src->g[gi];
        if (!d->used_by_layers || !memcmp(d->table, s->table, bytes)) continue;
        memcpy(d->table, s->table, bytes);
        d->dirty = 2;
    }
    return TERN_OK;
}
