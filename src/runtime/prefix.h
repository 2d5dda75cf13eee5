/*
 * prefix.h — the prefix cache: full KV blocks addressed by the content of everything before
 * them, so a new request reuses the longest already-computed prefix of its tokens.
 *
 * Key of block b of a sequence: h_b = H(h_{b-1}, tokens[b*bs, (b+1)*bs)), h_{-1} = seed: a hash
 * chain, so equal keys mean equal prefixes (the block's own tokens are stored and compared as
 * well, which makes a false match need a 64-bit collision of the whole chain plus identical
 * block tokens). The cache holds one KV reference per entry (tern_kv_ref); a request that
 * matches shares those blocks read-only (tern_kv_share) and writes only blocks after them.
 * Entries whose block nobody else holds are evictable, least recently used first (match
 * touches a chain from its end to its root, so roots outlive their children).
 *
 * Only whole blocks are cached, and a request always recomputes at least its last token (its
 * logits are needed). Models with sliding-window layers are not cached yet: the window's
 * blocks are dropped as the sequence advances, so a prefix would need the last window of the
 * sliding group as well (tern__prefix_open returns NULL cache, reuse off).
 */
#ifndef TERN_RUNTIME_PREFIX_H
#define TERN_RUNTIME_PREFIX_H

#include "runtime/kv.h"

typedef struct tern_prefix tern_prefix;

/* Cache of at most max_blocks blocks of `kv`. *out = NULL (and TERN_OK) when max_blocks <= 0
 * or the model has sliding layers: caching is simply off. */
tern_status tern__prefix_open(tern_prefix **out, tern_kv *kv, int max_blocks, tern_error *err);
void tern__prefix_close(tern_prefix *p);   /* drops the cache's references; accepts NULL */

/* Longest cached chain for tok[0..n): fills blocks[0..k) (k <= max) and *chain (hash after k
 * blocks); returns k. */
int tern__prefix_match(tern_prefix *p, const int32_t *tok, int n, int max, int32_t *blocks, uint64_t *chain);
/* Register the blocks of `slot` that became full: blocks [*n_reg, n_written / bs) of the
 * sequence tok; advances *n_reg and *chain. Blocks already cached under the same key are skipped. */
void tern__prefix_insert(tern_prefix *p, int slot, const int32_t *tok, int n_written, int *n_reg, uint64_t *chain);
/* Free up to `want` blocks held only by the cache (LRU first); returns how many were freed. */
int tern__prefix_evict(tern_prefix *p, int want);
/* Blocks the cache holds (0 for NULL). */
int tern__prefix_blocks(const tern_prefix *p);

uint64_t tern__prefix_seed(void);

#endif
