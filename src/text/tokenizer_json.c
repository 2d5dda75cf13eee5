/*
 * tokenizer_json.c — the fast path for the two big members of tokenizer.json.
 *
 * "model.vocab" and "model.merges" are ~95% of a real file (Gemma 3: 262k vocab entries and
 * 515k merges in 33 MB). Building them as a cJSON tree costs ~2M nodes and most of the load
 * time, so they are read here by a small scanner over the raw bytes instead:
 *   tk_json_split  walks the top-level object and the "model" object with real string
 *                  parsing (keys are unescaped before comparing), skips every other value
 *                  (strings via memchr, containers by bracket depth), records the byte spans
 *                  of the first "vocab" object and "merges" array, and returns a copy of the
 *                  text with those two values replaced by {} and [] — cJSON then parses that
 *                  small rest (added tokens, normalizer, ...) and validates it.
 *   tk_json_vocab / tk_json_merges  parse the spans strictly: JSON string escapes (\" \\ \/
 *                  \b \f \n \r \t \uXXXX with surrogate pairs; a lone surrogate is an error,
 *                  as in serde_json), ids as plain non-negative integers.
 * Strings without a backslash are used in place (no copy). Every error names the file and
 * the byte offset or entry; malformed input never reads past the end of the buffer.
 */
#include "text/tokenizer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID (1 << 24) /* as in tokenizer.c: a larger id is a corrupt file */

typedef struct jsc { const char *s; size_t n, i; } jsc;

static void ws(jsc *c) {
    while (c->i < c->n) {
        char ch = c->s[c->i];
        if (ch != ' ' && ch != '\n' && ch != '\r' && ch != '\t') return;
        c->i++;
    }
}

static bool eat(jsc *c, char ch) {
    ws(c);
    if (c->i < c->n && c->s[c->i] == ch) { c->i++; return true; }
    return false;
}

/* c->i at the opening quote; leaves c->i after the closing one. */
static int skip_str(jsc *c) {
    size_t start = ++c->i;
    for (;;) {
        const char *q = c->i < c->n ? memchr(c->s + c->i, '"', c->n - c->i) : NULL;
        if (!q) return -1;
        size_t j = (size_t)(q - c->s), k = j;
        while (k > start && c->s[k - 1] == '\\') k--;
        c->i = j + 1;
        if (((j - k) & 1) == 0) return 0; /* an even run of backslashes: the quote is real */
    }
}

/* Skip one value (structure of nested containers is checked by bracket depth only; cJSON
 * validates whatever stays in the rest copy). */
static int skip_value(jsc *c) {
    ws(c);
    if (c->i >= c->n) return -1;
    char ch = c->s[c->i];
    if (ch == '"') return skip_str(c);
    if (ch == '{' || ch == '[') {
        size_t depth = 0;
        while (c->i < c->n) {
            ch = c->s[c->i];
            if (ch == '"') { if (skip_str(c)) return -1; continue; }
            if (ch == '{' || ch == '[') depth++;
            else if ((ch == '}' || ch == ']') && --depth == 0) { c->i++; return 0; }
            c->i++;
        }
        return -1;
    }
    size_t st = c->i;
    while (c->i < c->n && !strchr(",}] \t\r\n", c->s[c->i]) && c->s[c->i]) c->i++;
    return c->i > st ? 0 : -1;
}

static int hexval(char h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
}

static long hex4(const char *p, size_t left) {
    if (left < 4) return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p[k]);
        if (h < 0) return -1;
        v = v << 4 | h;
    }
    return v;
}

/* Read a string at c->i (the opening quote). Without escapes *out points into the text;
 * otherwise it is unescaped into tmp. Returns 0, or -1 (c->i at the offending byte). */
static int read_str(jsc *c, tk_buf *tmp, const char **out, size_t *len) {
    if (c->i >= c->n || c->s[c->i] != '"') return -1;
    size_t start = ++c->i;
    const char *q = memchr(c->s + start, '"', c->n - start);
    if (!q) return -1;
    size_t end = (size_t)(q - c->s);
    if (!memchr(c->s + start, '\\', end - start)) {
        *out = c->s + start;
        *len = end - start;
        c->i = end + 1;
        return 0;
    }
    tmp->n = 0;
    size_t i = start, run = start;
    for (;;) {
        if (i >= c->n) { c->i = i; return -1; }
        char ch = c->s[i];
        if (ch == '"') break;
        if (ch != '\\') { i++; continue; }
        if (tk_buf_put(tmp, c->s + run, i - run) || i + 1 >= c->n) { c->i = i; return -1; }
        char e = c->s[i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            if (tk_buf_put(tmp, &map[simple - "\"\\/bfnrt"], 1)) { c->i = i; return -1; }
            i += 2;
        } else if (e == 'u') {
            long cp = hex4(c->s + i + 2, c->n - i - 2);
            i += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* high surrogate: a low one must follow */
                long lo = i + 1 < c->n && c->s[i] == '\\' && c->s[i + 1] == 'u' ? hex4(c->s + i + 2, c->n - i - 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) { c->i = i; return -1; }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            } else if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) {
                c->i = i - 6;
                return -1;
            }
            if (tk_utf8_put(tmp, (int32_t)cp)) { c->i = i; return -1; }
        } else {
            c->i = i;
            return -1;
        }
        run = i;
    }
    if (tk_buf_put(tmp, c->s + run, i - run)) return -1;
    c->i = i + 1;
    *out = tmp->p;
    *len = tmp->n;
    return 0;
}

/* Size the tables once from the bytes per entry of the first SAMPLE entries (files are
 * uniform), instead of rehashing as they grow or over-allocating from the byte count. */
#define SAMPLE 512
static int reserve_from_sample(tk_strmap *m, tk_bpe *b, size_t cnt, size_t used, size_t total) {
    size_t est = (size_t)((double)total / (double)(used ? used : 1) * (double)cnt * 1.1) + 16;
    if (est > (size_t)MAX_ID * 4) est = (size_t)MAX_ID * 4;
    return m ? tk_strmap_reserve(m, est) : tk_merge_reserve(b, est);
}

static bool key_is(const char *k, size_t kl, const char *want) { return kl == strlen(want) && !memcmp(k, want, kl); }

tern_status tk_json_split(const char *js, size_t n, tk_jspan *vocab, tk_jspan *merges, char **rest, size_t *rest_n,
                          const char *name, tern_error *err) {
    *rest = NULL;
    *rest_n = 0;
    memset(vocab, 0, sizeof *vocab);
    memset(merges, 0, sizeof *merges);
    jsc c = {js, n, 0};
    tk_buf kb = {0};
    const char *k;
    size_t kl;
    bool seen_model = false;
    if (!eat(&c, '{')) return tern_err(err, TERN_EFORMAT, "%s: not a JSON object", name);
    if (!eat(&c, '}'))
        for (;;) {
            ws(&c);
            if (read_str(&c, &kb, &k, &kl) || !eat(&c, ':')) goto bad;
            ws(&c);
            if (!seen_model && key_is(k, kl, "model") && c.i < n && js[c.i] == '{') {
                seen_model = true;
                c.i++;
                if (!eat(&c, '}'))
                    for (;;) {
                        ws(&c);
                        if (read_str(&c, &kb, &k, &kl) || !eat(&c, ':')) goto bad;
                        ws(&c);
                        tk_jspan *sp = key_is(k, kl, "vocab") ? vocab : key_is(k, kl, "merges") ? merges : NULL;
                        char want = sp == vocab ? '{' : '[';
                        size_t st = c.i;
                        if (skip_value(&c)) goto bad;
                        if (sp && !sp->len && js[st] == want) *sp = (tk_jspan){st, c.i - st};
                        if (eat(&c, '}')) break;
                        if (!eat(&c, ',')) goto bad;
                    }
            } else if (skip_value(&c)) {
                goto bad;
            }
            if (eat(&c, '}')) break;
            if (!eat(&c, ',')) goto bad;
        }
    tk_buf_free(&kb);
    /* the rest: the text with the two spans replaced by empty containers */
    tk_jspan *a = vocab, *b = merges;
    if (b->len && (!a->len || b->off < a->off)) { a = merges; b = vocab; }
    tk_buf r = {0};
    size_t at = 0;
    tk_jspan *order[2] = {a, b};
    for (int t = 0; t < 2; t++) {
        if (!order[t]->len) continue;
        if (tk_buf_put(&r, js + at, order[t]->off - at) || tk_buf_put(&r, order[t] == vocab ? "{}" : "[]", 2)) goto oom;
        at = order[t]->off + order[t]->len;
    }
    if (tk_buf_put(&r, js + at, n - at)) goto oom;
    *rest = r.p;
    *rest_n = r.n;
    return TERN_OK;
oom:
    tk_buf_free(&r);
    return tern_err(err, TERN_ENOMEM, "%s: out of memory", name);
bad:
    tk_buf_free(&kb);
    return tern_err(err, TERN_EFORMAT, "%s: not a JSON object (malformed JSON near byte %zu)", name, c.i);
}

/* Vocab entries are inserted in batches too: hash and prefetch the slots of BATCH keys, then
 * insert them in file order (a repeated key: the later id wins, as before). */
#define BATCH 128
typedef struct vent { size_t off; uint32_t len; bool esc; int32_t id; } vent;

static int vflush(tk_strmap *m, const char *s, vent *v, size_t n, tk_buf *esc) {
    uint64_t h[BATCH];
    for (size_t i = 0; i < n; i++) {
        h[i] = tk_hash((v[i].esc ? esc->p : s) + v[i].off, v[i].len);
        tk_strmap_prefetch(m, h[i]);
    }
    for (size_t i = 0; i < n; i++)
        if (tk_strmap_put_h(m, (v[i].esc ? esc->p : s) + v[i].off, v[i].len, v[i].id, h[i])) return -1;
    esc->n = 0;
    return 0;
}

tern_status tk_json_vocab(tern_tokenizer *tok, const char *s, size_t n, tern_error *err) {
    tk_bpe *b = &tok->bpe;
    jsc c = {s, n, 0};
    tk_buf kb = {0}, esc = {0};
    vent v[BATCH];
    size_t nv = 0, cnt = 0;
    const char *k = "";
    size_t kl = 0;
    tern_status st = TERN_OK;
    if (!eat(&c, '{')) goto bad;
    if (!eat(&c, '}'))
        for (;;) {
            ws(&c);
            if (read_str(&c, &kb, &k, &kl) || !eat(&c, ':')) goto bad;
            ws(&c);
            uint64_t id = 0;
            size_t d0 = c.i;
            while (c.i < n && s[c.i] >= '0' && s[c.i] <= '9' && id < MAX_ID) id = id * 10 + (uint64_t)(s[c.i++] - '0');
            if (c.i == d0 || id >= MAX_ID || kl >= UINT32_MAX || (c.i < n && strchr(".eE0123456789", s[c.i]) && s[c.i])) {
                st = tern_err(err, TERN_EFORMAT, "%s: vocab entry '%.*s' has a bad id (want an integer in [0, %d))", tok->name,
                              (int)TERN_MIN(kl, 60), k, MAX_ID);
                goto done;
            }
            bool in_text = k >= s && k < s + n;
            v[nv] = (vent){in_text ? (size_t)(k - s) : esc.n, (uint32_t)kl, !in_text, (int32_t)id};
            if ((!in_text && tk_buf_put(&esc, k, kl)) || (++cnt == SAMPLE && reserve_from_sample(&b->vocab, NULL, cnt, c.i, n)) ||
                (++nv == BATCH && vflush(&b->vocab, s, v, nv, &esc)))
                goto oom;
            if (nv == BATCH) nv = 0;
            if (eat(&c, '}')) break;
            if (!eat(&c, ',')) goto bad;
        }
    if (vflush(&b->vocab, s, v, nv, &esc)) goto oom;
    goto done;
oom:
    st = tern_err(err, TERN_ENOMEM, "%s: out of memory (vocab)", tok->name);
    goto done;
bad:
    st = tern_err(err, TERN_EFORMAT, "%s: model.vocab: malformed JSON near entry '%.*s' (byte %zu of the vocab)", tok->name,
                  (int)TERN_MIN(kl, 60), k, c.i);
done:
    tk_buf_free(&kb);
    tk_buf_free(&esc);
    return st;
}

/* Merges are resolved in batches: hash all the strings of a batch and prefetch their slots,
 * then look them up, so the cache misses of 3 lookups per merge overlap instead of queueing
 * (about 3x faster on Gemma's 515k merges). Strings are kept as
 * offsets: into the merges text, or (escaped ones) into the batch's own buffer. */
typedef struct mref { size_t ao, bo; uint32_t al, bl; bool esc; } mref;
typedef struct mbatch { mref v[BATCH]; size_t n; tk_buf esc, cat; } mbatch;

static tern_status flush(tern_tokenizer *tok, const char *js, mbatch *mb, uint32_t *rank, tern_error *err) {
    tk_bpe *b = &tok->bpe;
    const char *A[BATCH], *B[BATCH];
    uint64_t ha[BATCH], hb[BATCH], hn[BATCH];
    int32_t ia[BATCH], ib[BATCH], in[BATCH];
    size_t co[BATCH], cl[BATCH], n = mb->n;
    for (size_t i = 0; i < n; i++) {
        const char *base = mb->v[i].esc ? mb->esc.p : js;
        A[i] = base + mb->v[i].ao;
        B[i] = base + mb->v[i].bo;
        ha[i] = tk_hash(A[i], mb->v[i].al);
        hb[i] = tk_hash(B[i], mb->v[i].bl);
        tk_strmap_prefetch(&b->vocab, ha[i]);
        tk_strmap_prefetch(&b->vocab, hb[i]);
    }
    mb->cat.n = 0;
    for (size_t i = 0; i < n; i++) {
        ia[i] = tk_strmap_get_h(&b->vocab, A[i], mb->v[i].al, ha[i]);
        ib[i] = tk_strmap_get_h(&b->vocab, B[i], mb->v[i].bl, hb[i]);
        const char *c = B[i];
        size_t l = mb->v[i].bl;
        if (b->cont_len && l >= b->cont_len && !memcmp(c, b->cont_prefix, b->cont_len)) { c += b->cont_len; l -= b->cont_len; }
        co[i] = mb->cat.n;
        if (tk_buf_put(&mb->cat, A[i], mb->v[i].al) || tk_buf_put(&mb->cat, c, l)) return tern_err(err, TERN_ENOMEM, "out of memory");
        cl[i] = mb->cat.n - co[i];
    }
    for (size_t i = 0; i < n; i++) {
        hn[i] = tk_hash(mb->cat.p + co[i], cl[i]);
        tk_strmap_prefetch(&b->vocab, hn[i]);
    }
    for (size_t i = 0; i < n; i++) {
        in[i] = tk_strmap_get_h(&b->vocab, mb->cat.p + co[i], cl[i], hn[i]);
        if (ia[i] < 0 || ib[i] < 0 || in[i] < 0)
            return tern_err(err, TERN_EFORMAT, "%s: merge %zu ('%.*s' + '%.*s') uses a token missing from the vocab", tok->name,
                            *rank + i + 1, (int)TERN_MIN(mb->v[i].al, 40), A[i], (int)TERN_MIN(mb->v[i].bl, 40), B[i]);
        tk_merge_prefetch(b, ia[i], ib[i]);
    }
    for (size_t i = 0; i < n; i++)
        if (tk_merge_put(b, ia[i], ib[i], (*rank)++, in[i])) return tern_err(err, TERN_ENOMEM, "out of memory (merges)");
    mb->n = 0;
    mb->esc.n = 0;
    return TERN_OK;
}

/* Queue one merge; a and b point into the text [s, s+n) or (escaped) elsewhere. */
static int queue(mbatch *mb, const char *s, size_t n, const char *a, size_t al, const char *b, size_t bl) {
    mref *r = &mb->v[mb->n++];
    bool in_text = a >= s && a < s + n && b >= s && b <= s + n;
    r->esc = !in_text;
    r->al = (uint32_t)al;
    r->bl = (uint32_t)bl;
    if (in_text) {
        r->ao = (size_t)(a - s);
        r->bo = (size_t)(b - s);
        return 0;
    }
    r->ao = mb->esc.n;
    if (tk_buf_put(&mb->esc, a, al)) return -1;
    r->bo = mb->esc.n;
    return tk_buf_put(&mb->esc, b, bl);
}

tern_status tk_json_merges(tern_tokenizer *tok, const char *s, size_t n, tern_error *err) {
    jsc c = {s, n, 0};
    tk_buf t1 = {0}, t2 = {0};
    mbatch *mb = calloc(1, sizeof *mb);
    uint32_t rank = 0;
    size_t cnt = 0;
    tern_status st = TERN_OK;
    if (!mb) return tern_err(err, TERN_ENOMEM, "%s: out of memory (merges)", tok->name);
    if (!eat(&c, '[')) goto bad;
    if (!eat(&c, ']'))
        for (;;) {
            const char *a, *b;
            size_t al, bl;
            ws(&c);
            if (c.i < n && s[c.i] == '"') {
                if (read_str(&c, &t1, &a, &al)) goto bad;
                if (al >= 8 && !memcmp(a, "#version", 8)) goto next;
                const char *sp = memchr(a, ' ', al);
                if (!sp || memchr(sp + 1, ' ', al - (size_t)(sp + 1 - a))) {
                    st = tern_err(err, TERN_EFORMAT, "%s: merge %zu '%.*s' is not 'a b'", tok->name, rank + mb->n + 1,
                                  (int)TERN_MIN(al, 60), a);
                    break;
                }
                b = sp + 1;
                bl = al - (size_t)(b - a);
                al = (size_t)(sp - a);
            } else if (c.i < n && s[c.i] == '[') {
                c.i++;
                ws(&c);
                if (read_str(&c, &t1, &a, &al) || !eat(&c, ',')) goto pair_bad;
                ws(&c);
                if (read_str(&c, &t2, &b, &bl) || !eat(&c, ']')) goto pair_bad;
            } else {
                goto pair_bad;
            }
            if (al >= UINT32_MAX || bl >= UINT32_MAX || (++cnt == SAMPLE && reserve_from_sample(NULL, &tok->bpe, cnt, c.i, n)) ||
                queue(mb, s, n, a, al, b, bl)) {
                st = tern_err(err, TERN_ENOMEM, "%s: out of memory (merges)", tok->name);
                break;
            }
            if (mb->n == BATCH && (st = flush(tok, s, mb, &rank, err))) break;
        next:
            if (eat(&c, ']')) break;
            if (!eat(&c, ',')) goto bad;
        }
    if (!st) st = flush(tok, s, mb, &rank, err);
    goto done;
pair_bad:
    st = tern_err(err, TERN_EFORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", tok->name, rank + mb->n + 1);
    goto done;
bad:
    st = tern_err(err, TERN_EFORMAT, "%s: model.merges: malformed JSON near merge %zu (byte %zu of the merges)", tok->name,
                  rank + mb->n + 1, c.i);
done:
    tk_buf_free(&t1);
    tk_buf_free(&t2);
    tk_buf_free(&mb->esc);
    tk_buf_free(&mb->cat);
    free(mb);
    return st;
}
