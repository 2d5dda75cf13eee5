/*
 * tokenizer_util.c — small building blocks of the tokenizer: byte buffers, piece lists,
 * UTF-8 and Unicode-class helpers, hashing, and "patterns".
 *
 * A pattern is what tokenizer.json calls {"String": s} (a literal, HF regex-escapes it) or
 * {"Regex": r}. HF runs regexes with Oniguruma; we use PCRE2 with UTF+UCP, which matched HF
 * on thousands of strings for the Llama-3/GLM/Qwen patterns (see the oracle test). find_all
 * reproduces onig's find_iter: leftmost matches, non-overlapping, and an empty match that
 * starts where the previous match ended is skipped by advancing one character.
 *
 * tk_split_apply turns matches into pieces with HF's SplitDelimiterBehavior semantics
 * (normalizer.rs `split`): the text is first cut into alternating (gap, match) segments,
 * then folded per behavior; empty pieces are dropped (PreTokenizedString::split does that).
 *
 * Unicode classes come from utf8proc; they approximate Rust's tables (the same Unicode
 * general categories; Rust may be a newer Unicode version).
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int tk_buf_reserve(tk_buf *b, size_t extra) {
    size_t need;
    if (!tern_add_ok(b->n, extra + 1, &need)) return -1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (tk_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void tk_buf_free(tk_buf *b) {
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int tk_list_push(tk_list *l, const char *s, size_t n, int32_t id, bool at_origin) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        tk_piece *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    size_t off = l->text.n;
    if (tk_buf_put(&l->text, s, n)) return -1;
    l->v[l->n++] = (tk_piece){off, n, id, at_origin};
    return 0;
}

void tk_list_clear(tk_list *l) {
    l->n = 0;
    l->text.n = 0;
}

void tk_list_free(tk_list *l) {
    if (!l) return;
    tk_buf_free(&l->text);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* ---------------------------------------------------------------- UTF-8 */

int tk_utf8_next(const char *s, size_t n, int32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) { *cp = u[0]; return 1; }
    if (u[0] < 0xE0) { *cp = (u[0] & 0x1F) << 6 | (u[1] & 0x3F); return 2; }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) { *cp = u[0]; return 1; }
        *cp = (u[0] & 0x0F) << 12 | (u[1] & 0x3F) << 6 | (u[2] & 0x3F);
        return 3;
    }
    *cp = (u[0] & 0x07) << 18 | (u[1] & 0x3F) << 12 | (u[2] & 0x3F) << 6 | (u[3] & 0x3F);
    return 4;
}

int tk_utf8_put(tk_buf *b, int32_t cp) {
    char o[4];
    int k;
    if (cp < 0x80) { o[0] = (char)cp; k = 1; }
    else if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); k = 2; }
    else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); k = 3;
    } else {
        o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); k = 4;
    }
    return tk_buf_put(b, o, (size_t)k);
}

/* Length of the valid sequence at u (0 if invalid); *bad gets the length of the maximal
 * invalid prefix (>= 1) when invalid. Follows the Unicode "maximal subpart" rule. */
static size_t utf8_check(const unsigned char *u, size_t n, size_t *bad) {
    unsigned c = u[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *bad = 1; return 0; }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n || u[k] < lo || u[k] > hi) { *bad = k; return 0; }
        lo = 0x80; hi = 0xBF;
    }
    return need + 1;
}

size_t tk_utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, bad;
    while (i < n) {
        if (u[i] < 0x80) { /* ASCII runs 8 bytes at a time (a whole tokenizer.json is checked at load) */
            uint64_t w;
            while (i + 8 <= n && (memcpy(&w, u + i, 8), (w & 0x8080808080808080ull) == 0)) i += 8;
            while (i < n && u[i] < 0x80) i++;
            continue;
        }
        size_t k = utf8_check(u + i, n - i, &bad);
        if (!k) return i;
        i += k;
    }
    return n;
}

bool tk_utf8_valid(const char *s, size_t n) { return tk_utf8_invalid_at(s, n) == n; }

int tk_utf8_lossy(tk_buf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0, bad;
    while (i < n) {
        size_t k = u[i] < 0x80 ? 1 : utf8_check(u + i, n - i, &bad);
        if (k) { i += k; continue; }
        if (tk_buf_put(out, s + run, i - run) || tk_buf_put(out, "\xEF\xBF\xBD", 3)) return -1;
        i += bad;
        run = i;
    }
    return tk_buf_put(out, s + run, n - run);
}

bool tk_is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool tk_is_word(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F189)) return true; /* Other_Alphabetic So */
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
    }
}

bool tk_is_numeric(int32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

uint64_t tk_hash(const void *s, size_t n) {
    const unsigned char *p = s;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

/* ---------------------------------------------------------------- patterns */

tern_status tk_pattern_regex(tk_pattern *p, const char *re, const char *where, tern_error *err) {
    int ec;
    PCRE2_SIZE eo;
    memset(p, 0, sizeof *p);
    p->re = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tern_err(err, TERN_EUNSUPPORTED, "%s: regex '%.80s' not supported (PCRE2: %s at %zu)", where, re,
                        (char *)msg, (size_t)eo);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return TERN_OK;
}

tern_status tk_pattern_literal(tk_pattern *p, const char *s, size_t n) {
    memset(p, 0, sizeof *p);
    p->lit = malloc(n + 1);
    if (!p->lit) return TERN_ENOMEM;
    memcpy(p->lit, s, n);
    p->lit[n] = 0;
    p->lit_len = n;
    return TERN_OK;
}

tern_status tk_pattern_from_json(tk_pattern *p, const cJSON *j, const char *where, tern_error *err) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "Regex");
    memset(p, 0, sizeof *p);
    if (cJSON_IsString(s)) {
        if (tk_pattern_literal(p, s->valuestring, strlen(s->valuestring)))
            return tern_err(err, TERN_ENOMEM, "%s: out of memory", where);
        return TERN_OK;
    }
    if (cJSON_IsString(r)) return tk_pattern_regex(p, r->valuestring, where, err);
    return tern_err(err, TERN_EFORMAT, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

void tk_pattern_free(tk_pattern *p) {
    if (!p) return;
    if (p->re) pcre2_code_free(p->re);
    free(p->lit);
    memset(p, 0, sizeof *p);
}

int tk_spans_push(tk_spans *m, size_t s, size_t e) {
    if (m->n + 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        size_t *v = realloc(m->v, cap * sizeof *v);
        if (!v) return -1;
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = s;
    m->v[m->n++] = e;
    return 0;
}

void tk_spans_free(tk_spans *m) {
    if (!m) return;
    free(m->v);
    m->v = NULL;
    m->n = m->cap = 0;
}

static size_t char_len_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 1;
    int32_t cp;
    return (size_t)tk_utf8_next(s + i, n - i, &cp);
}

long tk_pattern_find_all(const tk_pattern *p, const char *s, size_t n, tk_spans *m) {
    m->n = 0;
    if (!p->re) {
        if (!p->lit_len) return 0;
        for (size_t i = 0; i + p->lit_len <= n;) {
            const char *h = memmem(s + i, n - i, p->lit, p->lit_len);
            if (!h) break;
            size_t st = (size_t)(h - s);
            if (tk_spans_push(m, st, st + p->lit_len)) return -1;
            i = st + p->lit_len;
        }
        return (long)(m->n / 2);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!md) return -1;
    size_t pos = 0, last_end = 0;
    bool have_last = false;
    uint32_t opts = PCRE2_NO_UTF_CHECK;
    while (pos <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, opts, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) { opts |= PCRE2_NO_JIT; continue; }
        if (rc < 0) break; /* no match (or resource limit: treat as no further matches) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && have_last && last_end == me) {
            pos = me + char_len_at(s, n, me);
            continue;
        }
        if (tk_spans_push(m, ms, me)) { pcre2_match_data_free(md); return -1; }
        pos = me;
        last_end = me;
        have_last = true;
    }
    pcre2_match_data_free(md);
    return (long)(m->n / 2);
}

/* ---------------------------------------------------------------- split behaviors */

typedef struct { size_t s, e; bool m; } seg;

int tk_split_apply(const char *s, size_t n, const size_t *mt, size_t n_m, int invert, int behavior,
                   bool at_origin, tk_list *out) {
    if (n == 0) return 0; /* an empty piece yields nothing (empty pieces are dropped) */
    seg *sg = malloc((2 * n_m + 1) * sizeof *sg);
    size_t *r = malloc((2 * n_m + 1) * 2 * sizeof *r);
    if (!sg || !r) { free(sg); free(r); return -1; }
    size_t k = 0, prev = 0;
    for (size_t i = 0; i < n_m; i++) {
        size_t ms = mt[2 * i], me = mt[2 * i + 1];
        if (prev != ms) sg[k++] = (seg){prev, ms, false};
        sg[k++] = (seg){ms, me, true};
        prev = me;
    }
    if (prev != n) sg[k++] = (seg){prev, n, false};
    if (invert)
        for (size_t i = 0; i < k; i++) sg[i].m = !sg[i].m;
    size_t nr = 0;
    bool pm = false;
    switch (behavior) {
    case TK_ISOLATED:
        for (size_t i = 0; i < k; i++) { r[2 * nr] = sg[i].s; r[2 * nr + 1] = sg[i].e; nr++; }
        break;
    case TK_REMOVED:
        for (size_t i = 0; i < k; i++)
            if (!sg[i].m) { r[2 * nr] = sg[i].s; r[2 * nr + 1] = sg[i].e; nr++; }
        break;
    case TK_CONTIGUOUS:
        for (size_t i = 0; i < k; i++) {
            if (sg[i].m == pm && nr) r[2 * nr - 1] = sg[i].e;
            else { r[2 * nr] = sg[i].s; r[2 * nr + 1] = sg[i].e; nr++; }
            pm = sg[i].m;
        }
        break;
    case TK_MERGED_PREV:
        for (size_t i = 0; i < k; i++) {
            if (sg[i].m && !pm && nr) r[2 * nr - 1] = sg[i].e;
            else { r[2 * nr] = sg[i].s; r[2 * nr + 1] = sg[i].e; nr++; }
            pm = sg[i].m;
        }
        break;
    default: /* TK_MERGED_NEXT: fold from the right */
        for (size_t i = k; i-- > 0;) {
            if (sg[i].m && !pm && nr) r[2 * nr - 2] = sg[i].s;
            else { r[2 * nr] = sg[i].s; r[2 * nr + 1] = sg[i].e; nr++; }
            pm = sg[i].m;
        }
        for (size_t i = 0; i < nr / 2; i++) {
            size_t a0 = r[2 * i], a1 = r[2 * i + 1];
            r[2 * i] = r[2 * (nr - 1 - i)];
            r[2 * i + 1] = r[2 * (nr - 1 - i) + 1];
            r[2 * (nr - 1 - i)] = a0;
            r[2 * (nr - 1 - i) + 1] = a1;
        }
        break;
    }
    int rc = 0;
    for (size_t i = 0; i < nr && !rc; i++)
        if (r[2 * i + 1] > r[2 * i])
            rc = tk_list_push(out, s + r[2 * i], r[2 * i + 1] - r[2 * i], -1, at_origin && r[2 * i] == 0);
    free(sg);
    free(r);
    return rc;
}
