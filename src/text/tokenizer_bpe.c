/*
 * tokenizer_bpe.c — the BPE model exactly as HF `tokenizers` runs it (models/bpe/model.rs,
 * word.rs), plus the two hash tables it needs.
 *
 * merge_word: the word's *characters* (not bytes) become the initial symbols; a character
 * missing from the vocab becomes its <0xXX> byte tokens when byte_fallback is on and all of
 * them exist, else the unk token (consecutive unks fused when fuse_unk; note HF does not flush
 * a pending unk before byte-fallback tokens, and neither do we), else it is dropped.
 * merge_all: every adjacent pair found in the merge map goes on a min-heap keyed by
 * (rank, position); pop, skip stale entries (left symbol gone, no right neighbour, or the
 * current pair no longer maps to this entry's new id), merge, push the two new neighbour
 * pairs. ignore_merges: a word that is itself in the vocab is emitted as one id.
 *
 * Words shorter than 256 bytes are cached (word → ids; at most 10,000 entries, then the
 * cache stops growing, as HF's does). The cache is the only mutable state of a tokenizer and
 * is guarded by a mutex.
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#define CACHE_MAX_WORD 256
#define CACHE_MAX_ENTRIES 10000

/* ---------------------------------------------------------------- string map */

/* A slot holds 32 hash bits, the key's offset and length in the key arena and the value
 * (klen == UINT32_MAX: empty), so a lookup touches the slot and the key bytes only — two
 * cache misses in the 262k-entry Gemma vocab, which load time is made of (1.5M lookups).
 * e[] lists the entries in insertion order (for iteration); its koff is increasing. */
#define SLOT_EMPTY UINT32_MAX

static int strmap_grow(tk_strmap *m, size_t want) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    while (cap < want * 2) cap *= 2;
    tk_slot *slot = malloc(cap * sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < cap; i++) slot[i].klen = SLOT_EMPTY;
    for (size_t e = 0; e < m->n; e++) {
        uint64_t h = tk_hash(m->keys.p + m->e[e].koff, m->e[e].klen);
        size_t i = h & (cap - 1);
        while (slot[i].klen != SLOT_EMPTY) i = (i + 1) & (cap - 1);
        slot[i] = (tk_slot){(uint32_t)(h >> 32), m->e[e].koff, m->e[e].klen, m->e[e].val};
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return 0;
}

int tk_strmap_reserve(tk_strmap *m, size_t n) {
    return (n + 1) * 2 > m->cap ? strmap_grow(m, n + 1) : 0;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *s, size_t n) { return tk_strmap_get_h(m, s, n, tk_hash(s, n)); }

void tk_strmap_prefetch(const tk_strmap *m, uint64_t h) {
    if (m->cap) __builtin_prefetch(&m->slot[h & (m->cap - 1)]);
}

int32_t tk_strmap_get_h(const tk_strmap *m, const char *s, size_t n, uint64_t h) {
    if (!m->cap) return -1;
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & (m->cap - 1); m->slot[i].klen != SLOT_EMPTY; i = (i + 1) & (m->cap - 1)) {
        const tk_slot *e = &m->slot[i];
        if (e->tag == tag && e->klen == n && !memcmp(m->keys.p + e->koff, s, n)) return e->val;
    }
    return -1;
}

int tk_strmap_put(tk_strmap *m, const char *s, size_t n, int32_t v) { return tk_strmap_put_h(m, s, n, v, tk_hash(s, n)); }

int tk_strmap_put_h(tk_strmap *m, const char *s, size_t n, int32_t v, uint64_t h) {
    if (n >= UINT32_MAX || m->n >= UINT32_MAX - 1) return -1;
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m, m->n + 1)) return -1;
    uint32_t tag = (uint32_t)(h >> 32);
    size_t i = h & (m->cap - 1);
    for (; m->slot[i].klen != SLOT_EMPTY; i = (i + 1) & (m->cap - 1)) {
        tk_slot *e = &m->slot[i];
        if (e->tag != tag || e->klen != n || memcmp(m->keys.p + e->koff, s, n)) continue;
        e->val = v;
        size_t lo = 0, hi = m->n; /* the entry with this koff (e[] is sorted by koff) */
        while (lo + 1 < hi) { size_t mid = (lo + hi) / 2; if (m->e[mid].koff <= e->koff) lo = mid; else hi = mid; }
        /* an empty key shares its koff with the key stored after it: take the entry of this length (fuzzed: "" put
         * twice rewrote the next key's id in e[], which the id table is built from) */
        while (lo > 0 && m->e[lo].koff == e->koff && m->e[lo].klen != e->klen) lo--;
        m->e[lo].val = v;
        return 0;
    }
    if (m->n == m->ecap) {
        size_t cap = m->ecap ? m->ecap * 2 : 1024;
        while (cap < m->cap / 2) cap *= 2;
        tk_sment *ne = realloc(m->e, cap * sizeof *ne);
        if (!ne) return -1;
        m->e = ne;
        m->ecap = cap;
    }
    if (m->keys.n + n >= UINT32_MAX) return -1;
    m->e[m->n] = (tk_sment){(uint32_t)m->keys.n, (uint32_t)n, v};
    m->slot[i] = (tk_slot){tag, (uint32_t)m->keys.n, (uint32_t)n, v};
    if (tk_buf_put(&m->keys, s, n)) return -1;
    m->n++;
    return 0;
}

void tk_strmap_free(tk_strmap *m) {
    if (!m) return;
    free(m->slot);
    free(m->e);
    tk_buf_free(&m->keys);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- merge map */

static inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }
static inline size_t key_slot(uint64_t k, size_t cap) {
    k ^= k >> 31; k *= 0x9E3779B97F4A7C15ull; k ^= k >> 29;
    return (size_t)k & (cap - 1);
}
#define EMPTY_KEY UINT64_MAX

static int merge_grow(tk_bpe *b, size_t want) {
    size_t cap = b->merge_cap ? b->merge_cap * 2 : 4096;
    while (cap < want * 2) cap *= 2;
    tk_merge *t = malloc(cap * sizeof *t);
    if (!t) return -1;
    for (size_t i = 0; i < cap; i++) t[i].key = EMPTY_KEY;
    for (size_t i = 0; i < b->merge_cap; i++) {
        if (b->merges[i].key == EMPTY_KEY) continue;
        size_t j = key_slot(b->merges[i].key, cap);
        while (t[j].key != EMPTY_KEY) j = (j + 1) & (cap - 1);
        t[j] = b->merges[i];
    }
    free(b->merges);
    b->merges = t;
    b->merge_cap = cap;
    return 0;
}

int tk_merge_reserve(tk_bpe *b, size_t n) { return (n + 1) * 2 > b->merge_cap ? merge_grow(b, n + 1) : 0; }

int tk_merge_put(tk_bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t new_id) {
    if ((b->n_merges + 1) * 2 > b->merge_cap && merge_grow(b, b->n_merges + 1)) return -1;
    uint64_t k = pair_key(a, c);
    size_t j = key_slot(k, b->merge_cap);
    while (b->merges[j].key != EMPTY_KEY && b->merges[j].key != k) j = (j + 1) & (b->merge_cap - 1);
    if (b->merges[j].key == EMPTY_KEY) b->n_merges++;
    b->merges[j] = (tk_merge){k, rank, new_id}; /* a repeated pair: the later rank wins, as in HF */
    return 0;
}

void tk_merge_prefetch(const tk_bpe *b, int32_t a, int32_t c) {
    if (b->merge_cap) __builtin_prefetch(&b->merges[key_slot(pair_key(a, c), b->merge_cap)], 1);
}

static inline const tk_merge *merge_get(const tk_bpe *b, int32_t a, int32_t c) {
    if (!b->merge_cap) return NULL;
    uint64_t k = pair_key(a, c);
    for (size_t j = key_slot(k, b->merge_cap);; j = (j + 1) & (b->merge_cap - 1)) {
        if (b->merges[j].key == k) return &b->merges[j];
        if (b->merges[j].key == EMPTY_KEY) return NULL;
    }
}

/* ---------------------------------------------------------------- the word algorithm */

typedef struct { uint32_t rank, pos; int32_t new_id; } hent;
typedef struct { int32_t c; int32_t prev, next; uint32_t len; } sym;

static inline bool hless(hent a, hent b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void hpush(hent *h, size_t *n, hent x) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!hless(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static hent hpop(hent *h, size_t *n) {
    hent top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        hent best = x;
        if (l < *n && hless(h[l], best)) { m = l; best = h[l]; }
        if (r < *n && hless(h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = x;
    return top;
}

static int push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return -1;
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

/* Build the initial symbols of word w; returns count or -1 on OOM. */
static long initial_symbols(const tk_bpe *b, const char *w, size_t n, sym *sy, tk_buf *tmp) {
    long k = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t cl = (size_t)tk_utf8_next(w + i, n - i, &cp);
        const char *s = w + i;
        size_t sl = cl;
        if ((i > 0 && b->cont_len) || (i + cl == n && b->eow_len)) {
            tmp->n = 0;
            if (i > 0 && tk_buf_put(tmp, b->cont_prefix, b->cont_len)) return -1;
            if (tk_buf_put(tmp, s, cl)) return -1;
            if (i + cl == n && tk_buf_put(tmp, b->eow_suffix, b->eow_len)) return -1;
            s = tmp->p;
            sl = tmp->n;
        }
        int32_t id = tk_strmap_get(&b->vocab, s, sl);
        i += cl;
        if (id >= 0) {
            if (unk >= 0) { sy[k++] = (sym){unk, 0, 0, unk_len}; unk = -1; }
            sy[k++] = (sym){id, 0, 0, (uint32_t)cl};
            continue;
        }
        if (b->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < sl; j++) all = all && b->byte_id[(unsigned char)s[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < sl; j++) sy[k++] = (sym){b->byte_id[(unsigned char)s[j]], 0, 0, 1};
                continue;
            }
        }
        if (b->unk_id >= 0) {
            if (unk >= 0 && b->fuse_unk) unk_len += (uint32_t)cl;
            else {
                if (unk >= 0) sy[k++] = (sym){unk, 0, 0, unk_len};
                unk = b->unk_id;
                unk_len = (uint32_t)cl;
            }
        }
    }
    if (unk >= 0) sy[k++] = (sym){unk, 0, 0, unk_len};
    return k;
}

static int merge_word(const tk_bpe *b, const char *w, size_t n, int32_t **ids, size_t *n_ids, size_t *cap) {
    tk_buf tmp = {0};
    /* at most one symbol per byte (+ the prefix/suffix bytes when byte fallback splits them) */
    size_t max_sym = n * (1 + b->cont_len + b->eow_len) + 1;
    sym *sy = malloc(max_sym * sizeof *sy);
    hent *h = malloc(max_sym * 2 * sizeof *h + sizeof *h);
    long k = sy && h ? initial_symbols(b, w, n, sy, &tmp) : -1;
    if (k < 0) { free(sy); free(h); tk_buf_free(&tmp); return -1; }
    for (long i = 0; i < k; i++) { sy[i].prev = (int32_t)i - 1; sy[i].next = i + 1 < k ? (int32_t)i + 1 : -1; }
    size_t hn = 0, hcap = max_sym * 2;
    for (long i = 0; i + 1 < k; i++) {
        const tk_merge *m = merge_get(b, sy[i].c, sy[i + 1].c);
        if (m) hpush(h, &hn, (hent){m->rank, (uint32_t)i, m->new_id});
    }
    while (hn) {
        hent top = hpop(h, &hn);
        sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym *right = &sy[cur->next];
        const tk_merge *m = merge_get(b, cur->c, right->c);
        if (!m || m->new_id != top.new_id) continue;
        cur->c = top.new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0) sy[cur->next].prev = (int32_t)top.pos;
        if (hn + 2 > hcap) continue; /* cannot happen: each merge adds at most 2 entries */
        if (cur->prev >= 0) {
            const tk_merge *pm = merge_get(b, sy[cur->prev].c, cur->c);
            if (pm) hpush(h, &hn, (hent){pm->rank, (uint32_t)cur->prev, pm->new_id});
        }
        if (cur->next >= 0) {
            const tk_merge *nm = merge_get(b, cur->c, sy[cur->next].c);
            if (nm) hpush(h, &hn, (hent){nm->rank, top.pos, nm->new_id});
        }
    }
    int rc = 0;
    for (long i = 0; i < k && !rc; i++)
        if (sy[i].len) rc = push_id(ids, n_ids, cap, sy[i].c);
    free(sy);
    free(h);
    tk_buf_free(&tmp);
    return rc;
}

tern_status tk_bpe_word(tk_bpe *b, const char *w, size_t n, int32_t **ids, size_t *n_ids, size_t *cap,
                        tern_error *err) {
    if (n == 0) return TERN_OK;
    if (b->ignore_merges) {
        int32_t id = tk_strmap_get(&b->vocab, w, n);
        if (id >= 0) return push_id(ids, n_ids, cap, id) ? tern_err(err, TERN_ENOMEM, "tokenizer: out of memory") : TERN_OK;
    }
    bool cacheable = n < CACHE_MAX_WORD;
    if (cacheable) {
        pthread_mutex_lock(&b->mu);
        int32_t off = tk_strmap_get(&b->cache, w, n);
        int rc = 0;
        if (off >= 0)
            for (int32_t i = 0; i < b->cache_ids[off] && !rc; i++) rc = push_id(ids, n_ids, cap, b->cache_ids[off + 1 + i]);
        pthread_mutex_unlock(&b->mu);
        if (rc) return tern_err(err, TERN_ENOMEM, "tokenizer: out of memory");
        if (off >= 0) return TERN_OK;
    }
    size_t first = *n_ids;
    if (merge_word(b, w, n, ids, n_ids, cap)) return tern_err(err, TERN_ENOMEM, "tokenizer: out of memory");
    if (!cacheable) return TERN_OK;
    pthread_mutex_lock(&b->mu);
    size_t cnt = *n_ids - first;
    if (b->cache.n < CACHE_MAX_ENTRIES && b->cache_n + cnt + 1 < INT32_MAX && tk_strmap_get(&b->cache, w, n) < 0) {
        if (b->cache_n + cnt + 1 > b->cache_cap) {
            size_t c = b->cache_cap ? b->cache_cap * 2 : 4096;
            while (c < b->cache_n + cnt + 1) c *= 2;
            int32_t *p = realloc(b->cache_ids, c * sizeof *p);
            if (p) { b->cache_ids = p; b->cache_cap = c; }
        }
        if (b->cache_n + cnt + 1 <= b->cache_cap && !tk_strmap_put(&b->cache, w, n, (int32_t)b->cache_n)) {
            b->cache_ids[b->cache_n] = (int32_t)cnt;
            if (cnt) memcpy(b->cache_ids + b->cache_n + 1, *ids + first, cnt * sizeof(int32_t)); /* *ids may be NULL at 0 */
            b->cache_n += cnt + 1;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return TERN_OK;
}

void tk_bpe_free(tk_bpe *b) {
    if (!b) return;
    tk_strmap_free(&b->vocab);
    tk_strmap_free(&b->cache);
    free(b->merges);
    free(b->cache_ids);
    free(b->cont_prefix);
    free(b->eow_suffix);
    pthread_mutex_destroy(&b->mu);
}
