/*
 * tokenizer_int.h — internals shared by the tokenizer files (not a public header).
 *
 *   tokenizer_util.c    byte buffers, piece lists, UTF-8 helpers, hashing, patterns (PCRE2
 *                       regex or literal) with HF/onig find_iter semantics, split behaviors
 *   tokenizer_bpe.c     string→id map, merge map, the BPE word algorithm, the word cache
 *   tokenizer.c         loading tokenizer.json / configs, lookups, free
 *   tokenizer_json.c    streaming reader of the big model.vocab / model.merges members
 *   tokenizer_encode.c  added-token splitting, the encode pipeline, post-processors
 *   tokenizer_guard.c   the prompt-injection guard: escape, and decoding escaped text
 *   tokenizer_decode.c  decoders and decode
 *   normalize.c         normalizers        pretok.c   pre-tokenizers
 *
 * Strings are byte ranges (pointer + length) everywhere; nothing assumes NUL termination.
 * All helpers that allocate return 0 on success and -1 on allocation failure.
 */
#ifndef TERN_TEXT_TOKENIZER_INT_H
#define TERN_TEXT_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "base/base.h"
#include "text/tokenizer.h"
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>

/* ---- growable byte buffer ---- */
typedef struct tk_buf { char *p; size_t n, cap; } tk_buf;
int tk_buf_reserve(tk_buf *b, size_t extra);
int tk_buf_put(tk_buf *b, const void *s, size_t n);
void tk_buf_free(tk_buf *b);

/* ---- list of pieces (strings in one buffer; id >= 0: already a token) ---- */
typedef struct tk_piece { size_t off, len; int32_t id; bool at_origin; } tk_piece;
typedef struct tk_list { tk_buf text; tk_piece *v; size_t n, cap; } tk_list;
int tk_list_push(tk_list *l, const char *s, size_t n, int32_t id, bool at_origin);
void tk_list_clear(tk_list *l);
void tk_list_free(tk_list *l);
static inline const char *tk_piece_str(const tk_list *l, size_t i) { return l->text.p + l->v[i].off; }

/* ---- UTF-8 / Unicode ---- */
/* Decode one well-formed scalar at s (n bytes left); returns its length, *cp the value.
 * Input must already be valid UTF-8 (we sanitize at the entry points). */
int tk_utf8_next(const char *s, size_t n, int32_t *cp);
int tk_utf8_put(tk_buf *b, int32_t cp);
/* Rust String::from_utf8_lossy: append s with each maximal invalid subsequence → U+FFFD. */
int tk_utf8_lossy(tk_buf *out, const char *s, size_t n);
bool tk_utf8_valid(const char *s, size_t n);
size_t tk_utf8_invalid_at(const char *s, size_t n); /* the first invalid byte's offset; n when valid */
bool tk_is_ws(int32_t cp);      /* Unicode White_Space (Rust char::is_whitespace, regex \s) */
bool tk_is_word(int32_t cp);    /* Rust regex \w (Alphabetic, M, Nd, Pc, Join_Control) */
bool tk_is_numeric(int32_t cp); /* Rust char::is_numeric (Nd, Nl, No) */

uint64_t tk_hash(const void *s, size_t n);

/* ---- patterns: {"String": s} (literal) or {"Regex": r} (PCRE2, UTF+UCP) ---- */
typedef struct tk_pattern { pcre2_code *re; char *lit; size_t lit_len; } tk_pattern;
tern_status tk_pattern_from_json(tk_pattern *p, const cJSON *j, const char *where, tern_error *err);
tern_status tk_pattern_regex(tk_pattern *p, const char *re, const char *where, tern_error *err);
tern_status tk_pattern_literal(tk_pattern *p, const char *s, size_t n);
void tk_pattern_free(tk_pattern *p);
/* All matches in s[0..n), onig find_iter semantics (an empty match right after the previous
 * match is skipped). *m holds pairs (start, end); returns the number of pairs or -1. */
typedef struct tk_spans { size_t *v; size_t n, cap; } tk_spans;
long tk_pattern_find_all(const tk_pattern *p, const char *s, size_t n, tk_spans *m);
/* append the span [s, e) (grows m); -1 when out of memory */
int tk_spans_push(tk_spans *m, size_t s, size_t e);
void tk_spans_free(tk_spans *m);

/* Split behaviors (HF SplitDelimiterBehavior). */
enum { TK_ISOLATED, TK_REMOVED, TK_MERGED_PREV, TK_MERGED_NEXT, TK_CONTIGUOUS };
/* Split s (matches given as pairs in m, sorted, non-overlapping; `invert` swaps match/gap)
 * with `behavior`, appending non-empty pieces to out. The first piece inherits at_origin. */
int tk_split_apply(const char *s, size_t n, const size_t *m, size_t n_m, int invert, int behavior,
                   bool at_origin, tk_list *out);

/* ---- string → int32 map (open addressing; keys copied into an arena) ---- */
typedef struct tk_sment { uint32_t koff, klen; int32_t val; } tk_sment;
typedef struct tk_slot { uint32_t tag, koff, klen; int32_t val; } tk_slot;
typedef struct tk_strmap { tk_slot *slot; size_t cap, n; tk_buf keys; tk_sment *e; size_t ecap; } tk_strmap;
int tk_strmap_put(tk_strmap *m, const char *s, size_t n, int32_t v); /* overwrites */
int32_t tk_strmap_get(const tk_strmap *m, const char *s, size_t n);  /* -1 if absent */
/* The same with h = tk_hash(s, n) already computed; prefetch: warm the slot for a later get
 * (the loader batches lookups so that their cache misses overlap). */
int32_t tk_strmap_get_h(const tk_strmap *m, const char *s, size_t n, uint64_t h);
void tk_strmap_prefetch(const tk_strmap *m, uint64_t h);
int tk_strmap_put_h(tk_strmap *m, const char *s, size_t n, int32_t v, uint64_t h);
int tk_strmap_reserve(tk_strmap *m, size_t n);
void tk_strmap_free(tk_strmap *m);

/* ---- BPE model ---- */
typedef struct tk_merge { uint64_t key; uint32_t rank; int32_t new_id; } tk_merge;
typedef struct tk_bpe {
    tk_strmap vocab;
    tk_merge *merges; size_t merge_cap, n_merges;
    int32_t unk_id;           /* -1: no unk token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix; size_t cont_len, eow_len;
    int32_t byte_id[256];     /* id of "<0xXX>", -1 if absent */
    /* word cache: word → ids; guarded by mu */
    pthread_mutex_t mu; tk_strmap cache; int32_t *cache_ids; size_t cache_n, cache_cap;
} tk_bpe;
int tk_merge_reserve(tk_bpe *b, size_t n);
int tk_merge_put(tk_bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t new_id);
void tk_merge_prefetch(const tk_bpe *b, int32_t a, int32_t c);
/* Tokenize one word (valid UTF-8), appending ids to *ids. */
tern_status tk_bpe_word(tk_bpe *b, const char *w, size_t n, int32_t **ids, size_t *n_ids, size_t *cap,
                        tern_error *err);
void tk_bpe_free(tk_bpe *b);

/* ---- pipeline components ---- */
typedef struct tk_norm {
    int type; tk_pattern pat; char *content; size_t content_len; bool left, right;
    struct tk_norm *kids; int n_kids;
} tk_norm;
tern_status tk_norm_parse(tk_norm *nm, const cJSON *j, tern_error *err);
int tk_norm_apply(const tk_norm *nm, const char *s, size_t n, tk_buf *out); /* out is reset */
void tk_norm_free(tk_norm *nm);

typedef struct tk_pretok {
    int type; tk_pattern pat; int behavior; bool invert;
    bool add_prefix_space, use_regex, split, individual;
    int32_t repl; int prepend; /* Metaspace */
    struct tk_pretok *kids; int n_kids;
} tk_pretok;
enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER };
tern_status tk_pretok_parse(tk_pretok *pt, const cJSON *j, tern_error *err);
/* Replace the text pieces of *l (id < 0) by their pre-tokenized words; uses *tmp. */
int tk_pretok_apply(const tk_pretok *pt, tk_list *l, tk_list *tmp);
void tk_pretok_free(tk_pretok *pt);
uint16_t tk_byte_char(unsigned b);            /* GPT-2 bytes_char() */
int tk_char_to_byte(int32_t cp);             /* inverse, -1 if not in the table */

typedef struct tk_dec {
    int type; tk_pattern pat; char *content; size_t content_len;
    int32_t ch; int start, stop, prepend;
    struct tk_dec *kids; int n_kids;
} tk_dec;
tern_status tk_dec_parse(tk_dec *d, const cJSON *j, tern_error *err);
void tk_dec_free(tk_dec *d);

typedef struct tk_added {
    char *content; size_t len;      /* as written */
    char *norm; size_t norm_len;    /* normalized form (normalized tokens; == content if none) */
    int32_t id; bool special, normalized, lstrip, rstrip, single_word;
} tk_added;

/* Byte trie for leftmost-longest matching of added tokens. */
typedef struct tk_trie { uint64_t *key; int32_t *child; size_t cap, n_edges; int32_t *term; size_t n_nodes, node_cap; } tk_trie;
int tk_trie_add(tk_trie *t, const char *s, size_t n, int32_t value);
int32_t tk_trie_child(const tk_trie *t, int32_t node, unsigned char c); /* -1: none */
void tk_trie_free(tk_trie *t);

struct tern_tokenizer {
    char *name;
    tk_bpe bpe;
    /* id → token text (added content first); off == SIZE_MAX: no token */
    tk_buf id_text; size_t *id_off; uint32_t *id_len; size_t n_ids;
    uint8_t *id_special;              /* token string is in the special set */
    tk_added *added; size_t n_added;
    tk_strmap added_map;              /* content → id */
    tk_trie trie_raw, trie_norm;      /* values: index into added[] */
    tk_trie trie_esc;                 /* contents of the special tokens (the injection guard) */
    uint8_t esc_first[32];            /* bitset: first bytes of those contents */
    bool has_norm, has_pretok, has_dec;
    tk_norm norm; tk_pretok pretok; tk_dec dec;
    int32_t *post_pre, *post_suf; size_t n_post_pre, n_post_suf; /* add_special wrap */
    int32_t bos_id, eos_id; int add_bos, add_eos;
};

/* tokenizer_json.c: the streaming reader of model.vocab / model.merges. */
typedef struct tk_jspan { size_t off, len; } tk_jspan; /* byte range of a JSON value; len 0: absent */
tern_status tk_json_split(const char *js, size_t n, tk_jspan *vocab, tk_jspan *merges, char **rest, size_t *rest_n,
                          const char *name, tern_error *err);
tern_status tk_json_vocab(tern_tokenizer *tok, const char *s, size_t n, tern_error *err);
tern_status tk_json_merges(tern_tokenizer *tok, const char *s, size_t n, tern_error *err);

/* tokenizer_decode.c: decode token strings (ptr/len arrays) into *out (reset first). */
int tk_decode_tokens(const tern_tokenizer *tok, const char **s, const size_t *n, size_t count, tk_buf *out);
/* tokenizer_guard.c: decode escaped text (tokenizer.h, TERN_ENC_ESCAPED): *out gets the text
 * with break marks removed and doubled U+FDD0 collapsed; *brk (malloc'd, out->n + 1 bytes,
 * NULL when the text holds no U+FDD0) marks "a break precedes byte i". 0 or -1 (OOM). */
int tk_unescape(const char *s, size_t n, tk_buf *out, uint8_t **brk);
/* tokenizer_encode.c */
tern_status tk_post_parse(tern_tokenizer *tok, const cJSON *j, tern_error *err);

#endif
