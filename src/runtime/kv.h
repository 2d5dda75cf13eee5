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
} tern_kv_opts;

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
/* Bytes of KV per token summed over layers that own a cache (full-attention accounting). */
size_t tern_kv_bytes_per_token(const tern_model_config *cfg);
/* Blocks in use / total, per group (0 full, 1 sliding). */
void tern_kv_usage(const tern_kv *kv, int group, int *used, int *total);

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

#endif
