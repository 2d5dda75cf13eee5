/*
 * prefix.c — the prefix cache (see prefix.h): a chained hash table of entries (key = chain
 * hash through the block, the block's tokens, its KV block id) plus an LRU list. All arrays
 * are sized at open; match / insert / evict allocate nothing.
 */
#include "runtime/prefix.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t key;
    int32_t block;             /* KV block id; -1 = entry unused */
    int bnext;                 /* next entry in the bucket */
    int prev, next;            /* LRU neighbours (head = most recent); `next` links the free list */
} entry;

struct tern_prefix {
    tern_kv *kv;
    int bs, cap, n;
    entry *e;
    int32_t *toks;             /* [cap * bs] tokens of each entry's block */
    int *bucket;               /* [mask + 1] first entry or -1 */
    uint64_t mask;
    int free_head, lru_head, lru_tail;
    int *hit, max_seq;         /* [max_seq] entries matched by the current lookup */
};

uint64_t tern__prefix_seed(void) { return 0x74657266ULL; /* "tern" */ }

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t block_key(uint64_t prev, const int32_t *t, int bs) {
    uint64_t h = mix64(prev);
    for (int i = 0; i < bs; i++) h = mix64(h ^ (uint64_t)(uint32_t)t[i]);
    return h;
}

tern_status tern__prefix_open(tern_prefix **out, tern_kv *kv, int max_blocks, tern_error *err) {
    *out = NULL;
    int used = 0, sliding = 0, full = 0;
    tern_kv_usage(kv, 1, &used, &sliding);
    tern_kv_usage(kv, 0, &used, &full);
    if (max_blocks <= 0 || sliding > 0 || full <= 0) return TERN_OK;
    tern_prefix *p = calloc(1, sizeof *p);
    if (!p) return tern_err(err, TERN_ENOMEM, "prefix cache: out of memory");
    p->kv = kv;
    p->bs = tern_kv_block_size(kv);
    p->cap = TERN_MIN(max_blocks, full);
    uint64_t nb = 16;
    while (nb < 2 * (uint64_t)p->cap) nb <<= 1;
    p->mask = nb - 1;
    p->e = malloc(sizeof *p->e * (size_t)p->cap);
    p->toks = malloc(sizeof *p->toks * (size_t)p->cap * (size_t)p->bs);
    p->bucket = malloc(sizeof *p->bucket * (size_t)nb);
    p->max_seq = tern_kv_max_ctx(kv) / p->bs + 1;
    p->hit = malloc(sizeof *p->hit * (size_t)p->max_seq);
    if (!p->e || !p->toks || !p->bucket || !p->hit) {
        tern__prefix_close(p);
        return tern_err(err, TERN_ENOMEM, "prefix cache: out of memory for %d blocks", p->cap);
    }
    for (uint64_t i = 0; i < nb; i++) p->bucket[i] = -1;
    for (int i = 0; i < p->cap; i++) p->e[i] = (entry){.block = -1, .bnext = -1, .prev = -1, .next = i + 1 < p->cap ? i + 1 : -1};
    p->free_head = 0;
    p->lru_head = p->lru_tail = -1;
    *out = p;
    return TERN_OK;
}

void tern__prefix_close(tern_prefix *p) {
    if (!p) return;
    for (int i = 0; p->e && i < p->cap; i++)
        if (p->e[i].block >= 0) tern_kv_unref(p->kv, p->e[i].block);
    free(p->e); free(p->toks); free(p->bucket); free(p->hit);
    free(p);
}

static int find(const tern_prefix *p, uint64_t key, const int32_t *t) {
    for (int i = p->bucket[key & p->mask]; i >= 0; i = p->e[i].bnext)
        if (p->e[i].key == key && !memcmp(p->toks + (size_t)i * p->bs, t, sizeof *t * (size_t)p->bs)) return i;
    return -1;
}

static void lru_unlink(tern_prefix *p, int i) {
    entry *x = &p->e[i];
    if (x->prev >= 0) p->e[x->prev].next = x->next; else p->lru_head = x->next;
    if (x->next >= 0) p->e[x->next].prev = x->prev; else p->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_front(tern_prefix *p, int i) {
    entry *x = &p->e[i];
    x->prev = -1;
    x->next = p->lru_head;
    if (p->lru_head >= 0) p->e[p->lru_head].prev = i; else p->lru_tail = i;
    p->lru_head = i;
}

static void remove_entry(tern_prefix *p, int i) {
    entry *x = &p->e[i];
    int *link = &p->bucket[x->key & p->mask];
    while (*link != i) link = &p->e[*link].bnext;
    *link = x->bnext;
    lru_unlink(p, i);
    tern_kv_unref(p->kv, x->block);
    x->block = -1;
    x->bnext = -1;
    x->next = p->free_head;
    p->free_head = i;
    p->n--;
}

int tern__prefix_match(tern_prefix *p, const int32_t *tok, int n, int max, int32_t *blocks, uint64_t *chain) {
    uint64_t h = tern__prefix_seed();
    *chain = h;
    if (!p) return 0;
    max = TERN_MIN(TERN_MIN(max, n / p->bs), p->max_seq);
    int k = 0;
    for (; k < max; k++) {
        uint64_t h2 = block_key(h, tok + (size_t)k * p->bs, p->bs);
        int i = find(p, h2, tok + (size_t)k * p->bs);
        if (i < 0) break;
        blocks[k] = p->e[i].block;
        p->hit[k] = i;
        h = h2;
    }
    /* touch from the end back to the root: roots become the most recent, leaves go first */
    for (int j = k - 1; j >= 0; j--) { lru_unlink(p, p->hit[j]); lru_front(p, p->hit[j]); }
    *chain = h;
    return k;
}

int tern__prefix_evict(tern_prefix *p, int want) {
    if (!p) return 0;
    int freed = 0;
    for (int i = p->lru_tail; i >= 0 && freed < want;) {
        int prev = p->e[i].prev;
        if (tern_kv_refcount(p->kv, p->e[i].block) == 1) { remove_entry(p, i); freed++; }
        i = prev;
    }
    return freed;
}

void tern__prefix_insert(tern_prefix *p, int slot, const int32_t *tok, int n_written, int *n_reg, uint64_t *chain) {
    if (!p) return;
    int full = n_written / p->bs;
    for (int b = *n_reg; b < full; b++) {
        const int32_t *t = tok + (size_t)b * p->bs;
        uint64_t key = block_key(*chain, t, p->bs);
        *chain = key;
        *n_reg = b + 1;
        if (find(p, key, t) >= 0) continue;            /* same content already cached */
        int blk = tern_kv_block(p->kv, slot, b);
        if (blk < 0) continue;
        if (p->free_head < 0 && !tern__prefix_evict(p, 1)) continue;  /* full of blocks in use */
        int i = p->free_head;
        p->free_head = p->e[i].next;
        entry *x = &p->e[i];
        x->key = key;
        x->block = blk;
        memcpy(p->toks + (size_t)i * p->bs, t, sizeof *t * (size_t)p->bs);
        x->bnext = p->bucket[key & p->mask];
        p->bucket[key & p->mask] = i;
        lru_front(p, i);
        tern_kv_ref(p->kv, blk);
        p->n++;
    }
}

int tern__prefix_blocks(const tern_prefix *p) { return p ? p->n : 0; }
