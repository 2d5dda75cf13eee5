/*
 * prefix.c — the prefix cache (see prefix.h): a chained hash table of entries (key = chain
 * hash through the block, the block's tokens, its KV block ids in both groups, its parent
 * entry and number of cached children) plus an LRU list. All arrays are sized at open;
 * match / insert / evict allocate nothing.
 */
#include "runtime/prefix.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t key;
    int32_t block;             /* full-group KV block id; -1 = entry unused */
    int32_t sblock;            /* sliding-group block of the same index; -1 = none */
    int parent, n_child;       /* entry of the previous block (-1 for a root); cached children */
    int bnext;                 /* next entry in the bucket */
    int prev, next;            /* LRU neighbours (head = most recent); `next` links the free list */
} entry;

struct tern_prefix {
    tern_kv *kv;
    int bs, cap, n, sliding;
    entry *e;
    int32_t *toks;             /* [cap * bs] tokens of each entry's block */
    int *bucket;               /* [mask + 1] first entry or -1 */
    uint64_t mask;
    int free_head, lru_head, lru_tail;
    int *hit, max_seq;         /* [max_seq] entries matched by the current lookup */
    unsigned char *prot;       /* [cap] scratch of drop_sliding */
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
    int used = 0, full = 0;
    tern_kv_usage(kv, 0, &used, &full);
    if (max_blocks <= 0 || full <= 0 || !tern_kv_has_group(kv, 0)) return TERN_OK;
    tern_prefix *p = calloc(1, sizeof *p);
    if (!p) return tern_err(err, TERN_ENOMEM, "prefix cache: out of memory");
    p->kv = kv;
    p->bs = tern_kv_block_size(kv);
    p->sliding = tern_kv_has_group(kv, 1);
    p->cap = TERN_MIN(max_blocks, full);
    uint64_t nb = 16;
    while (nb < 2 * (uint64_t)p->cap) nb <<= 1;
    p->mask = nb - 1;
    p->e = malloc(sizeof *p->e * (size_t)p->cap);
    p->toks = malloc(sizeof *p->toks * (size_t)p->cap * (size_t)p->bs);
    p->bucket = malloc(sizeof *p->bucket * (size_t)nb);
    p->max_seq = tern_kv_max_ctx(kv) / p->bs + 1;
    p->hit = malloc(sizeof *p->hit * (size_t)p->max_seq);
    p->prot = malloc((size_t)p->cap);
    if (!p->e || !p->toks || !p->bucket || !p->hit || !p->prot) {
        tern__prefix_close(p);
        return tern_err(err, TERN_ENOMEM, "prefix cache: out of memory for %d blocks", p->cap);
    }
    for (uint64_t i = 0; i < nb; i++) p->bucket[i] = -1;
    for (int i = 0; i < p->cap; i++)
        p->e[i] = (entry){.block = -1, .sblock = -1, .parent = -1, .bnext = -1, .prev = -1, .next = i + 1 < p->cap ? i + 1 : -1};
    p->free_head = 0;
    p->lru_head = p->lru_tail = -1;
    *out = p;
    return TERN_OK;
}

void tern__prefix_close(tern_prefix *p) {
    if (!p) return;
    for (int i = 0; p->e && i < p->cap; i++) {
        if (p->e[i].block >= 0) tern_kv_group_unref(p->kv, 0, p->e[i].block);
        if (p->e[i].sblock >= 0) tern_kv_group_unref(p->kv, 1, p->e[i].sblock);
    }
    free(p->e); free(p->toks); free(p->bucket); free(p->hit); free(p->prot);
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
    tern_kv_group_unref(p->kv, 0, x->block);
    if (x->sblock >= 0) tern_kv_group_unref(p->kv, 1, x->sblock);
    if (x->parent >= 0) p->e[x->parent].n_child--;
    *x = (entry){.block = -1, .sblock = -1, .parent = -1, .bnext = -1, .prev = -1, .next = p->free_head};
    p->free_head = i;
    p->n--;
}

int tern__prefix_match(tern_prefix *p, const int32_t *tok, int n, int max, int32_t *blocks, int32_t *sblocks,
                       uint64_t *chain) {
    uint64_t h = tern__prefix_seed();
    *chain = h;
    if (!p) return 0;
    max = TERN_MIN(TERN_MIN(max, n / p->bs), p->max_seq);
    int k = 0;
    for (; k < max; k++) {
        int i = find(p, block_key(h, tok + (size_t)k * p->bs, p->bs), tok + (size_t)k * p->bs);
        if (i < 0) break;
        p->hit[k] = i;
        h = p->e[i].key;
    }
    /* sliding layers: resuming after k blocks needs the sliding blocks of the last window */
    while (p->sliding && k > 0) {
        int lo = tern_kv_window_first(p->kv, k * p->bs), ok = 1;
        for (int j = lo; j < k && ok; j++) ok = p->e[p->hit[j]].sblock >= 0;
        if (ok) break;
        k--;
    }
    for (int j = 0; j < k; j++) {
        blocks[j] = p->e[p->hit[j]].block;
        if (sblocks) sblocks[j] = p->e[p->hit[j]].sblock;
    }
    /* touch from the end back to the root: roots become the most recent, leaves go first */
    for (int j = k - 1; j >= 0; j--) { lru_unlink(p, p->hit[j]); lru_front(p, p->hit[j]); }
    *chain = k ? p->e[p->hit[k - 1]].key : tern__prefix_seed();
    return k;
}

static int evictable(const tern_prefix *p, const entry *x) {
    return x->n_child == 0 && tern_kv_group_refcount(p->kv, 0, x->block) == 1 &&
           (x->sblock < 0 || tern_kv_group_refcount(p->kv, 1, x->sblock) == 1);
}

int tern__prefix_evict(tern_prefix *p, int want) {
    if (!p) return 0;
    int freed = 0;
    while (freed < want) {
        int got = 0;
        /* removing a leaf may turn its parent into one: rescan until nothing more goes */
        for (int i = p->lru_tail; i >= 0 && freed < want;) {
            int prev = p->e[i].prev;
            if (evictable(p, &p->e[i])) { remove_entry(p, i); freed++; got++; }
            i = prev;
        }
        if (!got) break;
    }
    return freed;
}

/* Likely resume points are chain ends and branch points (n_child != 1): protect the sliding
 * blocks of the window before each of them, drop the others first (LRU order), then those. */
int tern__prefix_drop_sliding(tern_prefix *p, int want) {
    if (!p || !p->sliding) return 0;
    int wb = (tern_kv_window(p->kv) + p->bs - 2) / p->bs + 1;   /* blocks a window can touch */
    memset(p->prot, 0, (size_t)p->cap);
    for (int i = 0; i < p->cap; i++) {
        if (p->e[i].block < 0 || p->e[i].n_child == 1) continue;
        for (int j = i, d = 0; j >= 0 && d < wb; j = p->e[j].parent, d++) p->prot[j] = 1;
    }
    int freed = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = p->lru_tail; i >= 0 && freed < want; i = p->e[i].prev) {
            entry *x = &p->e[i];
            if (x->sblock < 0 || (!pass && p->prot[i]) || tern_kv_group_refcount(p->kv, 1, x->sblock) != 1) continue;
            tern_kv_group_unref(p->kv, 1, x->sblock);
            x->sblock = -1;
            freed++;
        }
    return freed;
}

void tern__prefix_insert(tern_prefix *p, int slot, const int32_t *tok, int n_written, int *n_reg, uint64_t *chain) {
    if (!p) return;
    int full = n_written / p->bs;
    for (int b = *n_reg; b < full; b++) {
        const int32_t *t = tok + (size_t)b * p->bs;
        uint64_t prev_key = *chain, key = block_key(prev_key, t, p->bs);
        *chain = key;
        *n_reg = b + 1;
        if (find(p, key, t) >= 0) continue;            /* same content already cached */
        int parent = b > 0 ? find(p, prev_key, t - p->bs) : -1;
        if (b > 0 && parent < 0) continue;             /* its parent was evicted: unreachable */
        int blk = tern_kv_group_block(p->kv, 0, slot, b);
        int sblk = p->sliding ? tern_kv_group_block(p->kv, 1, slot, b) : -1;
        if (blk < 0) continue;
        if (p->free_head < 0 && !tern__prefix_evict(p, 1)) continue;  /* full of blocks in use */
        if (parent >= 0 && p->e[parent].block < 0) continue;          /* evicted just now */
        int i = p->free_head;
        p->free_head = p->e[i].next;
        entry *x = &p->e[i];
        *x = (entry){.key = key, .block = blk, .sblock = sblk, .parent = parent, .bnext = p->bucket[key & p->mask],
                     .prev = -1, .next = -1};
        memcpy(p->toks + (size_t)i * p->bs, t, sizeof *t * (size_t)p->bs);
        p->bucket[key & p->mask] = i;
        lru_front(p, i);
        tern_kv_group_ref(p->kv, 0, blk);
        if (sblk >= 0) tern_kv_group_ref(p->kv, 1, sblk);
        if (parent >= 0) p->e[parent].n_child++;
        p->n++;
    }
}

int tern__prefix_blocks(const tern_prefix *p) { return p ? p->n : 0; }
