/*
 * kv.h — the paged KV cache: block pools per layer, block tables per sequence slot.
 *
 * Layers are grouped by cache kind: "full" layers keep every position, "sliding" layers keep
 * only the blocks that can still be seen by a window of W tokens. Each group has its own block
 * ids and free list and one block table per slot ([n_slots][max_blocks], -1 = not resident),
 * shared by all layers of the group; each layer owns a pool [n_blocks][block_size][n_kv][D]
 * of its own geometry. KV-shared layers (Gemma 4) own nothing and are handed the donor's view.
 * The model sees only tern_kv_layer views (ops.h); this file owns allocation.
 *
 * Life of a sequence: tern_kv_reserve(slot, n) before a step that writes positions < n;
 * tern_kv_trim(slot, pos) after it (frees sliding blocks no later query can see);
 * tern_kv_release(slot) when it ends. tern_kv_sync() uploads changed tables before a forward.
 */
#ifndef TERN_KV_H
#define TERN_KV_H

#include "io/config.h"
#include "ops/ops.h"

typedef struct tern_kv tern_kv;

typedef struct tern_kv_opts {
    int block_size;      /* tokens per block (default 16) */
    int n_slots;         /* concurrent sequences (default 1) */
    int max_ctx;         /* longest sequence (default: config n_ctx_train capped at 8192) */
    size_t memory;       /* bytes for all pools; 0 = enough for n_slots * max_ctx */
    /* Page formats: NULL = every layer F32; else [n_layer * 2], K of layer l at [2l] and V at
     * [2l+1] (entries of layers that read another layer's cache are ignored). See
     * io/kv_config.h for building it from --kv-quant / kv_config.json. Compressed kinds
     * are CPU-only for now (TERN_EUNSUPPORTED on other backends). */
    const tern_kv_fmt *formats;
    int chunk;           /* rows per forward step over all slots (sizes a sliding group); 0 = 512 */
} tern_kv_opts;

/* Blocks of each group (out[0] full, out[1] sliding) a pool for n_slots sequences of up to
 * max_ctx tokens holds when one forward step carries at most `chunk` rows over all slots: what
 * tern_kv_open allocates without opts.memory (with it, both scale by memory / these bytes);
 * runtime/fit.c counts the same. Full: every block of every slot. Sliding: a slot holds at most
 * its window plus its rows of the step (tern_kv_blocks_needed), capped at max_ctx; trim runs after
 * every step and the rows of a step sum to <= chunk, so all slots together hold at most
 * n_slots * (window blocks + 2) + chunk blocks: the smaller of that and n_slots times one slot's
 * most. block_size <= 0: 16; chunk <= 0: 512. */
void tern_kv_pool_blocks(int window, int block_size, int max_ctx, int n_slots, int chunk, int64_t out[2]);
/* Whether a cache of cfg can take these page formats (NULL: f32; tern_kv_open asks the same): e.g. GLM-5's latent
 * layers take f32 or bf16 only. */
tern_status tern_kv_check_formats(const tern_model_config *cfg, const tern_kv_fmt *formats, tern_error *err);

tern_status tern_kv_open(tern_kv **out, tern_backend *be, const tern_model_config *cfg,
                         const tern_kv_opts *opts, tern_error *err);
void tern_kv_close(tern_kv *kv);

/* Ensure positions [0, n_tokens) of `slot` have blocks (only the window for sliding groups).
 * TERN_ENOMEM (nothing changed) when the pool is exhausted; TERN_EINVAL past max_ctx. */
tern_status tern_kv_reserve(tern_kv *kv, int slot, int n_tokens, tern_error *err);
/* Free sliding-group blocks entirely below min_pos - window + 1: no future query at >= min_pos sees them. */
void tern_kv_trim(tern_kv *kv, int slot, int min_pos);
/* Free every block of the slot. */
void tern_kv_release(tern_kv *kv, int slot);
/* Upload dirty block tables to the device. Call before a forward. */
void tern_kv_sync(tern_kv *kv);

const tern_kv_layer *tern_kv_view(const tern_kv *kv, int layer);
int tern_kv_n_slots(const tern_kv *kv);
int tern_kv_max_ctx(const tern_kv *kv);
/* Bytes of KV per token summed over layers that own a cache (full-attention accounting),
 * for F32 pages / for the given formats (as in tern_kv_opts) / for one layer (0 if it owns
 * no cache) / of an open cache. */
size_t tern_kv_bytes_per_token(const tern_model_config *cfg);
size_t tern_kv_bytes_per_token_fmt(const tern_model_config *cfg, const tern_kv_fmt *formats);
size_t tern_kv_layer_bytes_per_token(const tern_model_config *cfg, const tern_kv_fmt *formats, int layer);
size_t tern_kv_token_bytes(const tern_kv *kv);
/* Bytes one query at context `ctx` reads from an open cache (sliding layers: their window) — the
 * KV part of a decode step's floor */
size_t tern_kv_read_bytes(const tern_kv *kv, long ctx);
/* Blocks in use / total, per group (0 full, 1 sliding). */
void tern_kv_usage(const tern_kv *kv, int group, int *used, int *total);
/* Bytes of every K / V pool of an open cache (what it allocated; block tables not counted). */
size_t tern_kv_pool_bytes(const tern_kv *kv);

/* Shared blocks (prefix cache), full group only. A block is reference counted: each slot
 * table entry holds one reference, tern_kv_ref adds one for another holder (the prefix cache);
 * it returns to the free list when the last reference goes. Only full, never-rewritten blocks
 * may be shared. */
int tern_kv_block_size(const tern_kv *kv);
/* Block id at block index `index` of the slot's table (-1 if none). */
int tern_kv_block(const tern_kv *kv, int slot, int index);
/* Make blocks[0..n) the first n blocks of an empty slot (one more reference each).
 * TERN_EUNSUPPORTED when the model has sliding layers. */
tern_status tern_kv_share(tern_kv *kv, int slot, const int32_t *blocks, int n, tern_error *err);
void tern_kv_ref(tern_kv *kv, int block);
void tern_kv_unref(tern_kv *kv, int block);
int tern_kv_refcount(const tern_kv *kv, int block);


/* ---- appended (runtime policy): sliding-aware sharing, rollback, block I/O -------------
 * Groups: 0 = full, 1 = sliding. Block ids are per group. */
int tern_kv_has_group(const tern_kv *kv, int group);
int tern_kv_window(const tern_kv *kv);               /* sliding window W; 0 without a sliding group */
/* First sliding block index a sequence of n_tokens still needs to continue (0 without sliding). */
int tern_kv_window_first(const tern_kv *kv, int n_tokens);
int tern_kv_group_block(const tern_kv *kv, int group, int slot, int index);
void tern_kv_group_ref(tern_kv *kv, int group, int block);
void tern_kv_group_unref(tern_kv *kv, int group, int block);
int tern_kv_group_refcount(const tern_kv *kv, int group, int block);
int tern_kv_free_blocks(const tern_kv *kv, int group);
int tern_kv_slot_blocks(const tern_kv *kv, int group, int slot);   /* blocks the slot's table holds */
/* Blocks of `group` a sequence of n_tokens holds at most while fed in steps of `chunk` rows. */
int tern_kv_blocks_needed(const tern_kv *kv, int group, int n_tokens, int chunk);
/* Make the first n blocks of an empty slot shared copies: full[0..n) in the full group and,
 * for a sliding group, sliding[lo..n) with lo = tern_kv_window_first(n * block_size) (entries
 * below lo are ignored). One more reference each; nothing changes on error. */
tern_status tern_kv_share_prefix(tern_kv *kv, int slot, const int32_t *full, const int32_t *sliding, int n,
                                 tern_error *err);
/* Speculative rollback: forget positions >= new_len (blocks past it are released; stale
 * positions inside the last kept block are overwritten by the next writes). Rounds: with n
 * committed tokens, reserve n + k, forward the k tentative rows, do NOT trim past n; then
 * truncate to the accepted length and trim to it (= commit). TERN_EINVAL (nothing changed)
 * if trim already dropped sliding blocks new_len needs, or new_len ends inside a shared block. */
tern_status tern_kv_truncate(tern_kv *kv, int slot, int new_len, tern_error *err);
/* Reserve an empty slot for a restored sequence of n_tokens: full blocks [0, n) and only the
 * sliding blocks its window needs. */
tern_status tern_kv_reserve_resume(tern_kv *kv, int slot, int n_tokens, tern_error *err);
int tern_kv_n_layer(const tern_kv *kv);
/* Owning layer's group (-1: the layer reads another layer's cache). */
int tern_kv_layer_group(const tern_kv *kv, int layer);
/* Bytes of one block page of K (and of V) of an owning layer; 0 otherwise. With compressed
 * kinds K and V pages can differ: this is the larger one (a buffer that fits either), and
 * tern_kv_layer_page_bytes gives the exact size of K (is_v 0) or V (is_v 1). */
size_t tern_kv_layer_block_bytes(const tern_kv *kv, int layer);
size_t tern_kv_layer_page_bytes(const tern_kv *kv, int layer, int is_v);
/* Copy one block's K and V pages between host buffers and the pool (to_device 1: upload). */
tern_status tern_kv_block_copy(tern_kv *kv, int layer, int block, void *k, void *v, int to_device, tern_error *err);

/* Tensor parallelism (appended; src/model/tp.c): make dst's block tables equal to src's (host
 * copies; uploaded by dst's next tern_kv_sync). Both caches must have the same slots, blocks per
 * slot, block counts and groups (rank caches opened with the same options); their pools and
 * head counts may differ. TERN_EINVAL (nothing changed) otherwise. */
tern_status tern_kv_mirror(tern_kv *dst, const tern_kv *src, tern_error *err);

#endif
