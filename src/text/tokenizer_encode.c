/*
 * tokenizer_encode.c — the encode pipeline in HF order (tokenizer/mod.rs,
 * added_vocabulary.rs), and the post-processors.
 *
 * 1. Added tokens with normalized:false are cut out of the raw text: leftmost-longest
 *    matching over a byte trie (HF uses an Aho-Corasick automaton in LeftmostLongest mode;
 *    the result is the same: the leftmost start wins, then the longest token there). After a
 *    match the scan resumes at its end even when the match is then discarded (a special token
 *    with parse_special=0, or a single_word token that touches a word character), exactly
 *    like HF's iterator. lstrip/rstrip widen the match over Unicode whitespace.
 * 2. Each remaining piece is normalized, then cut again by the normalized:true added tokens
 *    (matched by their normalized form).
 * 3. The pre-tokenizer splits the pieces into words; 4. BPE per word; 5. with add_special,
 *    the post-processor's prefix/suffix ids (TemplateProcessing single = [specials] $A
 *    [specials]; Roberta/Bert = cls $A sep; ByteLevel adds nothing; Sequence composes).
 * Each piece carries "starts at input offset 0" for Metaspace's prepend_scheme "first".
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- trie */

static inline size_t edge_slot(uint64_t k, size_t cap) {
    k *= 0x9E3779B97F4A7C15ull;
    k ^= k >> 32;
    return (size_t)k & (cap - 1);
}

int32_t tk_trie_child(const tk_trie *t, int32_t node, unsigned char c) {
    if (!t->cap) return -1;
    uint64_t k = (uint64_t)node << 8 | c;
    for (size_t j = edge_slot(k, t->cap);; j = (j + 1) & (t->cap - 1)) {
        if (t->child[j] < 0) return -1;
        if (t->key[j] == k) return t->child[j];
    }
}

static int trie_grow(tk_trie *t) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    uint64_t *key = malloc(cap * sizeof *key);
    int32_t *child = malloc(cap * sizeof *child);
    if (!key || !child) { free(key); free(child); return -1; }
    for (size_t i = 0; i < cap; i++) child[i] = -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->child[i] < 0) continue;
        size_t j = edge_slot(t->key[i], cap);
        while (child[j] >= 0) j = (j + 1) & (cap - 1);
        key[j] = t->key[i];
        child[j] = t->child[i];
    }
    free(t->key);
    free(t->child);
    t->key = key;
    t->child = child;
    t->cap = cap;
    return 0;
}

static int32_t trie_new_node(tk_trie *t) {
    if (t->n_nodes == t->node_cap) {
        size_t cap = t->node_cap ? t->node_cap * 2 : 256;
        int32_t *term = realloc(t->term, cap * sizeof *term);
        if (!term) return -1;
        t->term = term;
        t->node_cap = cap;
    }
    t->term[t->n_nodes] = -1;
    return (int32_t)t->n_nodes++;
}

int tk_trie_add(tk_trie *t, const char *s, size_t n, int32_t value) {
    if (!t->n_nodes && trie_new_node(t) < 0) return -1;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int32_t ch = tk_trie_child(t, node, c);
        if (ch < 0) {
            if ((t->n_edges + 1) * 2 > t->cap && trie_grow(t)) return -1;
            if ((ch = trie_new_node(t)) < 0) return -1;
            uint64_t k = (uint64_t)node << 8 | c;
            size_t j = edge_slot(k, t->cap);
            while (t->child[j] >= 0) j = (j + 1) & (t->cap - 1);
            t->key[j] = k;
            t->child[j] = ch;
            t->n_edges++;
        }
        node = ch;
    }
    t->term[node] = value;
    return 0;
}

void tk_trie_free(tk_trie *t) {
    if (!t) return;
    free(t->key);
    free(t->child);
    free(t->term);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- added-token split */

static int32_t last_cp(const char *s, size_t end) {
    size_t p = end - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    int32_t cp;
    tk_utf8_next(s + p, end - p, &cp);
    return cp;
}

/* brk (NULL: none): break marks of an escaped text (tokenizer_guard.c); a match holding one
 * is user text and is not taken as a special token. */
static int split_added(const tern_tokenizer *tok, const tk_trie *tr, const char *s, size_t n, bool at_origin,
                       int parse_special, const uint8_t *brk, tk_list *out) {
    if (!tr->n_nodes) return n ? tk_list_push(out, s, n, -1, at_origin) : 0;
    size_t start_offset = 0, i = 0;
    while (i < n) {
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t j = i; j < n; j++) {
            node = tk_trie_child(tr, node, (unsigned char)s[j]);
            if (node < 0) break;
            if (tr->term[node] >= 0) { best = tr->term[node]; best_len = j + 1 - i; }
        }
        if (best < 0) { i++; continue; }
        size_t start = i, stop = i + best_len;
        i = stop;
        const tk_added *a = &tok->added[best];
        if (a->special && (!parse_special || (brk && memchr(brk + start, 1, stop - start)))) continue;
        if (a->single_word) {
            bool start_space = start == 0 || !tk_is_word(last_cp(s, start));
            int32_t cp = 0;
            if (stop < n) tk_utf8_next(s + stop, n - stop, &cp);
            bool stop_space = stop == n || !tk_is_word(cp);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0 && tk_is_ws(last_cp(s, ns))) {
                size_t p = ns - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int32_t cp;
                int l = tk_utf8_next(s + stop, n - stop, &cp);
                if (!tk_is_ws(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start && tk_list_push(out, s + start_offset, start - start_offset, -1, at_origin && start_offset == 0))
            return -1;
        if (tk_list_push(out, s + start, stop > start ? stop - start : 0, a->id, at_origin && start == 0)) return -1;
        start_offset = stop;
    }
    if (start_offset < n && tk_list_push(out, s + start_offset, n - start_offset, -1, at_origin && start_offset == 0))
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- encode */

static int push_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *src, size_t k) {
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *n + k) c *= 2;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return -1;
        *ids = p;
        *cap = c;
    }
    if (k) memcpy(*ids + *n, src, k * sizeof *src);
    *n += k;
    return 0;
}

tern_status tern_tokenizer_encode(const tern_tokenizer *tok, const char *text, size_t len, int add_special,
                                  int parse_special, int32_t **ids_out, size_t *n_out, tern_error *err) {
    return tern_tokenizer_encode_ex(tok, text, len, (add_special ? TERN_ENC_ADD_SPECIAL : 0u) |
                                    (parse_special ? TERN_ENC_PARSE_SPECIAL : 0u), ids_out, n_out, err);
}

tern_status tern_tokenizer_encode_ex(const tern_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                     int32_t **ids_out, size_t *n_out, tern_error *err) {
    *ids_out = NULL;
    *n_out = 0;
    if (!tok || (!text && len)) return tern_err(err, TERN_EINVAL, "tokenizer encode: bad arguments");
    tern_tokenizer *mt = (tern_tokenizer *)tok; /* only the mutex-guarded BPE cache is written */
    int add_special = (flags & TERN_ENC_ADD_SPECIAL) != 0, parse_special = (flags & TERN_ENC_PARSE_SPECIAL) != 0;
    tk_buf clean = {0}, unesc = {0}, nb = {0};
    tk_list l0 = {0}, l1 = {0}, tmp = {0};
    uint8_t *brk = NULL;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    tern_status st = TERN_OK;
    int rc = 0;
    if (!text) text = "";
    if (!tk_utf8_valid(text, len)) {
        if (tk_utf8_lossy(&clean, text, len)) goto oom;
        text = clean.p;
        len = clean.n;
    }
    if (flags & TERN_ENC_ESCAPED) { /* the guard: decode the escapes, keep where the breaks were */
        if (tk_unescape(text, len, &unesc, &brk)) goto oom;
        text = unesc.p;
        len = unesc.n;
    }
    if (split_added(tok, &tok->trie_raw, text, len, true, parse_special, brk, &l0)) goto oom;
    for (size_t i = 0; i < l0.n; i++) {
        const tk_piece *pc = &l0.v[i];
        const char *s = tk_piece_str(&l0, i);
        if (pc->id >= 0) { if (tk_list_push(&l1, s, pc->len, pc->id, pc->at_origin)) goto oom; continue; }
        size_t sl = pc->len;
        /* l0 covers the text contiguously, so a piece's offset in l0 is its offset in text;
         * a piece holding user text (a break) matches normalized specials as text */
        int ps = parse_special && !(brk && memchr(brk + pc->off, 1, pc->len));
        if (tok->has_norm) {
            if (tk_norm_apply(&tok->norm, s, sl, &nb)) goto oom;
            s = nb.p;
            sl = nb.n;
        }
        if (split_added(tok, &tok->trie_norm, s, sl, pc->at_origin, ps, NULL, &l1)) goto oom;
    }
    if (tok->has_pretok && tk_pretok_apply(&tok->pretok, &l1, &tmp)) goto oom;
    if (add_special && push_ids(&ids, &n, &cap, tok->post_pre, tok->n_post_pre)) goto oom;
    for (size_t i = 0; i < l1.n && !st; i++) {
        if (l1.v[i].id >= 0) { rc = push_ids(&ids, &n, &cap, &l1.v[i].id, 1); if (rc) goto oom; continue; }
        st = tk_bpe_word(&mt->bpe, tk_piece_str(&l1, i), l1.v[i].len, &ids, &n, &cap, err);
    }
    if (!st && add_special && push_ids(&ids, &n, &cap, tok->post_suf, tok->n_post_suf)) goto oom;
    goto done;
oom:
    st = tern_err(err, TERN_ENOMEM, "tokenizer encode: out of memory");
done:
    tk_buf_free(&clean);
    tk_buf_free(&unesc);
    tk_buf_free(&nb);
    free(brk);
    tk_list_free(&l0);
    tk_list_free(&l1);
    tk_list_free(&tmp);
    if (st) { free(ids); return st; }
    *ids_out = ids ? ids : malloc(sizeof(int32_t)); /* non-NULL even when empty */
    if (!*ids_out) return tern_err(err, TERN_ENOMEM, "tokenizer encode: out of memory");
    *n_out = n;
    return TERN_OK;
}

/* ---------------------------------------------------------------- post-processors */

static int append(int32_t **v, size_t *n, const int32_t *src, size_t k, bool front) {
    int32_t *p = realloc(*v, (*n + k + 1) * sizeof *p);
    if (!p) return -1;
    if (front) { memmove(p + k, p, *n * sizeof *p); if (k) memcpy(p, src, k * sizeof *p); }
    else if (k) memcpy(p + *n, src, k * sizeof *p);
    *v = p;
    *n += k;
    return 0;
}

static tern_status special_pair(tern_tokenizer *tok, const cJSON *j, const char *what, int32_t *id, tern_error *err) {
    /* ["<s>", 0] */
    const cJSON *a = cJSON_GetArrayItem(j, 0), *b = cJSON_GetArrayItem(j, 1);
    if (!cJSON_IsArray(j) || !cJSON_IsString(a) || !cJSON_IsNumber(b))
        return tern_err(err, TERN_EFORMAT, "tokenizer.json: post_processor '%s' must be [token, id]", what);
    if (b->valuedouble < 0 || b->valuedouble >= (double)(1 << 24))
        return tern_err(err, TERN_EFORMAT, "tokenizer.json: post_processor '%s' id %g out of range", what, b->valuedouble);
    *id = (int32_t)b->valuedouble;
    return TERN_OK;
}

static tern_status post1(tern_tokenizer *tok, const cJSON *j, int32_t **pre, size_t *npre, int32_t **suf,
                         size_t *nsuf, tern_error *err) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: post_processor without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "ByteLevel")) return TERN_OK;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "processors"), *c;
        if (!cJSON_IsArray(a)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: post_processor Sequence without 'processors'");
        cJSON_ArrayForEach(c, a) {
            tern_status s = post1(tok, c, pre, npre, suf, nsuf, err);
            if (s) return s;
        }
        return TERN_OK;
    }
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        int32_t cls, sep;
        tern_status s = special_pair(tok, cJSON_GetObjectItemCaseSensitive(j, "cls"), "cls", &cls, err);
        if (!s) s = special_pair(tok, cJSON_GetObjectItemCaseSensitive(j, "sep"), "sep", &sep, err);
        if (s) return s;
        if (append(pre, npre, &cls, 1, true) || append(suf, nsuf, &sep, 1, false))
            return tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
        return TERN_OK;
    }
    if (strcmp(ty, "TemplateProcessing"))
        return tern_err(err, TERN_EUNSUPPORTED, "tokenizer.json: post_processor type '%s' not supported", ty);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    if (!cJSON_IsArray(single)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: TemplateProcessing without 'single'");
    int32_t *p = NULL, *q = NULL;
    size_t np = 0, nq = 0;
    int seen_a = 0;
    const cJSON *it;
    tern_status st = TERN_OK;
    cJSON_ArrayForEach(it, single) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *tk = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (seq) { seen_a++; continue; }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tk, "id");
        const cJSON *ent = cJSON_IsString(name) ? cJSON_GetObjectItemCaseSensitive(sp, name->valuestring) : NULL;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ent, "ids"), *x;
        if (!cJSON_IsArray(v)) {
            st = tern_err(err, TERN_EFORMAT, "tokenizer.json: TemplateProcessing special token '%s' has no ids",
                          cJSON_IsString(name) ? name->valuestring : "?");
            break;
        }
        cJSON_ArrayForEach(x, v) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= (double)(1 << 24)) {
                st = tern_err(err, TERN_EFORMAT, "tokenizer.json: TemplateProcessing id out of range");
                break;
            }
            int32_t id = (int32_t)x->valuedouble;
            if (append(seen_a ? &q : &p, seen_a ? &nq : &np, &id, 1, false)) { st = tern_err(err, TERN_ENOMEM, "out of memory"); break; }
        }
    }
    if (!st && seen_a != 1)
        st = tern_err(err, TERN_EUNSUPPORTED, "tokenizer.json: TemplateProcessing 'single' must hold $A exactly once");
    if (!st && (append(pre, npre, p, np, true) || append(suf, nsuf, q, nq, false)))
        st = tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
    free(p);
    free(q);
    return st;
}

tern_status tk_post_parse(tern_tokenizer *tok, const cJSON *j, tern_error *err) {
    if (!j || cJSON_IsNull(j)) return TERN_OK;
    return post1(tok, j, &tok->post_pre, &tok->n_post_pre, &tok->post_suf, &tok->n_post_suf, err);
}
