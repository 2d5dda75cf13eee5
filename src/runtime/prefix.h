/*
 * prefix.h — the prefix cache: full KV blocks addressed by the content of everything before
 * them, so a new request reuses the longest already-computed prefix of its tokens.
 *
 * Key of block b of a sequence: h_b = H(h_{b-1}, tokens[b*bs, (b+1)*bs)), h_{-1} = seed: a hash
 * chain, so equal keys mean equal prefixes (the block's own tokens are stored and compared as
 * well, which makes a false match need a 64-bit collision of the whole chain plus identical
 * block tokens). The cache holds one KV reference per entry and group; a request that
 * matches shares those blocks read-only (tern_kv_share_prefix) and writes only blocks after
 * them. Entries whose blocks nobody else holds are evictable, least recently used first.
 *
 * Only whole blocks are cached, and a request always recomputes at least its last token (its
 * logits are needed). Entries form trees (each entry's parent is the entry of the block before
 * it); only leaves are evicted, so every cached block stays reachable from its root.
 *
 * Sliding-window models (Gemma 4: 5 of 6 layers slide): an entry also keeps the sliding
 * group's block of the same index (when the cache takes the block, before the sequence
 * trims it), referenced and evicted together with the full block. Resuming after k blocks
 * needs the sliding blocks covering the last window before that boundary
 * (tern_kv_window_first); a match is shortened until they are all there. The sliding pool is
 * small (a window per slot), so under its pressure the cache gives up sliding blocks alone,
 * oldest first (tern__prefix_drop_sliding), which keeps the last window of the newest chains. We keep rather than
 * recompute: layer l's K/V over the last window depends on layer l-1's outputs there, which
 * attend over the window before it, so an exact recompute reaches back one window per layer
 * (all of a 35-layer prompt). Cost: a cached block holds the KV of every owning layer, as in
 * a model without sliding layers.
 */
#ifndef TERN_RUNTIME_PREFIX_H
#define TERN_RUNTIME_PREFIX_H

#include "runtime/kv.h"

typedef struct tern_prefix tern_prefix;

/* Cache of at most max_blocks entries of `kv`. *out = NULL (and TERN_OK) when max_blocks <= 0:
 * caching is simply off. */
tern_status tern__prefix_open(tern_prefix **out, tern_kv *kv, int max_blocks, tern_error *err);
void tern__prefix_close(tern_prefix *p);   /* drops the cache's references; accepts NULL */

/* Longest usable cached chain for tok[0..n): fills blocks[0..k) (full group), sblocks[0..k)
 * (sliding group; -1 below the window, may be NULL for models without one) and *chain (hash
 * after k blocks); returns k (<= max). */
int tern__prefix_match(tern_prefix *p, const int32_t *tok, int n, int max, int32_t *blocks, int32_t *sblocks,
                       uint64_t *chain);
/* Register the blocks of `slot` that became full: blocks [*n_reg, n_written / bs) of the
 * sequence tok; advances *n_reg and *chain. Blocks already cached under the same key are skipped. */
void tern__prefix_insert(tern_prefix *p, int slot, const int32_t *tok, int n_written, int *n_reg, uint64_t *chain);
/* Free up to `want` entries held only by the cache (leaves, LRU first); returns how many. */
int tern__prefix_evict(tern_prefix *p, int want);
/* Sliding-group pressure: release up to `want` sliding blocks only the cache holds (LRU
 * entries first; their full blocks stay, so longer chains still match but cannot resume right
 * after them). Returns how many. */
int tern__prefix_drop_sliding(tern_prefix *p, int want);
/* Blocks the cache holds (0 for NULL). */
int tern__prefix_blocks(const tern_prefix *p);

uint64_t tern__prefix_seed(void);

#endif
