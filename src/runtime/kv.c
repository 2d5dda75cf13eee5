/*
 * kv.c — paged KV pools and block tables (see kv.h). Two groups: 0 = full, 1 = sliding.
 * Block tables live on the host (authoritative) and are mirrored to the device by tern_kv_sync.
 * Blocks are reference counted: a slot's table entry holds one reference, the prefix cache
 * may hold more (tern_kv_share / tern_kv_ref); a block returns to the free list at zero.
 */
#include "runtime/kv.h"

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
    int dirty;
} kv_group;

struct tern_kv {
    tern_backend *be;
    int n_layer, block_size, n_slots, max_ctx, max_blocks;
    kv_group g[2];
    tern_kv_layer *views;  /* [n_layer] */
    void **pools;          /* [n_layer * 2] owned device pools */
};

static int layer_group(const tern_model_config *cfg, int l) {
    return cfg->layers[l].type == TERN_LAYER_SLIDING && cfg->sliding_window > 0 ? 1 : 0;
}

size_t tern_kv_bytes_per_token(const tern_model_config *cfg) {
    size_t b = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (cfg->layers[l].kv_src == l) b += 2u * (size_t)cfg->layers[l].n_head_kv * (size_t)cfg->layers[l].head_dim * sizeof(float);
    return b;
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
    kv->views = calloc((size_t)cfg->n_layer, sizeof *kv->views);
    kv->pools = calloc((size_t)cfg->n_layer * 2, sizeof *kv->pools);
    if (!kv->views || !kv->pools) { tern_kv_close(kv); return tern_err(err, TERN_ENOMEM, "kv: out of memory"); }

    /* bytes per block per group (sum over owning layers) */
    size_t per_block[2] = {0, 0};
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->layers[l].kv_src != l) continue;
        int gi = layer_group(cfg, l);
        kv->g[gi].used_by_layers++;
        per_block[gi] += 2u * (size_t)kv->block_size * (size_t)cfg->layers[l].n_head_kv * (size_t)cfg->layers[l].head_dim * sizeof(float);
    }
    kv->g[1].window = cfg->sliding_window;
    /* blocks each slot can need: full = max_blocks; sliding = window blocks + one chunk's worth */
    int need[2];
    need[0] = kv->max_blocks;
    need[1] = TERN_MIN(kv->max_blocks, (cfg->sliding_window + kv->block_size - 1) / kv->block_size + 1 + 512 / kv->block_size);
    size_t want = (size_t)kv->n_slots * ((size_t)need[0] * per_block[0] + (size_t)need[1] * per_block[1]);
    size_t memory = opts && opts->memory ? opts->memory : want;
    double frac = want ? (double)memory / (double)want : 1.0;
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers) continue;
        long nb = (long)((double)kv->n_slots * need[gi] * frac);
        if (nb < 1) nb = 1;
        if (nb > 0x7fffffff / 2) nb = 0x7fffffff / 2;
        g->n_blocks = (int)nb;
        g->free_list = malloc(sizeof(int) * (size_t)nb);
        g->table = malloc(sizeof(int32_t) * (size_t)kv->n_slots * (size_t)kv->max_blocks);
        g->trimmed = calloc((size_t)kv->n_slots, sizeof(int));
        g->ref = calloc((size_t)nb, sizeof(int));
        g->table_dev = be->vt->alloc(be, sizeof(int32_t) * (size_t)kv->n_slots * (size_t)kv->max_blocks);
        if (!g->free_list || !g->table || !g->table_dev || !g->trimmed || !g->ref) { tern_kv_close(kv); return tern_err(err, TERN_ENOMEM, "kv: out of memory for block tables"); }
        for (int i = 0; i < g->n_blocks; i++) g->free_list[i] = g->n_blocks - 1 - i;
        g->n_free = g->n_blocks;
        for (size_t i = 0; i < (size_t)kv->n_slots * (size_t)kv->max_blocks; i++) g->table[i] = -1;
        g->dirty = 1;
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
        size_t bytes = (size_t)kv->g[gi].n_blocks * kv->block_size * (size_t)v->n_head_kv * (size_t)v->head_dim * sizeof(float);
        kv->pools[2 * l] = be->vt->alloc(be, bytes);
        kv->pools[2 * l + 1] = be->vt->alloc(be, bytes);
        if (!kv->pools[2 * l] || !kv->pools[2 * l + 1]) {
            tern_kv_close(kv);
            return tern_err(err, TERN_ENOMEM, "kv: cannot allocate %zu bytes for layer %d", 2 * bytes, l);
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
    for (int gi = 0; gi < 2; gi++) {
        free(kv->g[gi].free_list);
        free(kv->g[gi].table);
        free(kv->g[gi].trimmed);
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

static void group_free_slot_range(kv_group *g, int32_t *row, int from, int to) {
    for (int b = from; b < to; b++)
        if (row[b] >= 0) { block_unref(g, row[b]); row[b] = -1; g->dirty = 1; }
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
            if (row[b] < 0) { row[b] = g->free_list[--g->n_free]; g->ref[row[b]] = 1; g->dirty = 1; }
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
    group_free_slot_range(g, g->table + (size_t)slot * kv->max_blocks, g->trimmed[slot], upto);
    g->trimmed[slot] = upto;
}

void tern_kv_release(tern_kv *kv, int slot) {
    if (!kv || slot < 0 || slot >= kv->n_slots) return;
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers) continue;
        group_free_slot_range(g, g->table + (size_t)slot * kv->max_blocks, 0, kv->max_blocks);
        if (g->trimmed) g->trimmed[slot] = 0;
    }
}

void tern_kv_sync(tern_kv *kv) {
    for (int gi = 0; gi < 2; gi++) {
        kv_group *g = &kv->g[gi];
        if (!g->used_by_layers || !g->dirty) continue;
        kv->be->vt->upload(kv->be, g->table_dev, g->table, sizeof(int32_t) * (size_t)kv->n_slots * kv->max_blocks);
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
    g->dirty = 1;
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
