/*
 * pretok.c — tokenizer.json pre-tokenizers (HF `pre_tokenizers/ folder`): pieces → words.
 *
 *   Split {pattern, behavior, invert}   regex (PCRE2) or literal; the five behaviors
 *   ByteLevel {add_prefix_space, use_regex}  optional " " prefix, optional GPT-2 regex split
 *                                        (Isolated), then every byte → GPT-2 bytes_char()
 *   Metaspace {replacement, prepend_scheme, split}  ' ' → replacement; prepend it
 *                                        (always / first = only on the piece that starts the
 *                                        input / never) unless already there; split
 *                                        MergedWithNext on it
 *   Digits {individual_digits}, Whitespace, WhitespaceSplit, Sequence {pretokenizers}
 * Others (BertPreTokenizer, Punctuation, UnicodeScripts, CharDelimiterSplit) → unsupported.
 * Pieces that already are tokens (added tokens, id >= 0) pass through untouched.
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

enum { PT_SEQ, PT_SPLIT, PT_BYTELEVEL, PT_METASPACE, PT_DIGITS, PT_WHITESPACE, PT_WSSPLIT };

static const char *k_gpt2_re = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust regex \w+|[^\w\s]+ with Rust's \w and \s classes spelled out for PCRE2. */
#define RW "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}"
#define RS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char *k_ws_re = "[" RW "]+|[^" RW RS "]+";

/* ---- GPT-2 bytes_char(): printable bytes map to themselves, the other 68 bytes (in byte
 * order) to U+0100.. ---- */
uint16_t tk_byte_char(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint16_t)b;
    if (b <= 0x20) return (uint16_t)(0x100 + b);
    if (b >= 0x7F && b <= 0xA0) return (uint16_t)(0x121 + (b - 0x7F));
    return 0x143; /* 0xAD */
}

int tk_char_to_byte(int32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return cp;
    if (cp >= 0x100 && cp <= 0x120) return cp - 0x100;
    if (cp >= 0x121 && cp <= 0x142) return 0x7F + (cp - 0x121);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* ---- parse ---- */

static int behavior_of(const char *s) {
    if (!strcmp(s, "Isolated")) return TK_ISOLATED;
    if (!strcmp(s, "Removed")) return TK_REMOVED;
    if (!strcmp(s, "MergedWithPrevious")) return TK_MERGED_PREV;
    if (!strcmp(s, "MergedWithNext")) return TK_MERGED_NEXT;
    if (!strcmp(s, "Contiguous")) return TK_CONTIGUOUS;
    return -1;
}

static bool get_bool(const cJSON *j, const char *k, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

tern_status tk_pretok_parse(tk_pretok *pt, const cJSON *j, tern_error *err) {
    memset(pt, 0, sizeof *pt);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: pre_tokenizer without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "Sequence")) {
        pt->type = PT_SEQ;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(a)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: pre_tokenizer Sequence without 'pretokenizers'");
        pt->kids = calloc((size_t)cJSON_GetArraySize(a) + 1, sizeof *pt->kids);
        if (!pt->kids) return tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
        const cJSON *c;
        cJSON_ArrayForEach(c, a) {
            tern_status s = tk_pretok_parse(&pt->kids[pt->n_kids], c, err);
            pt->n_kids++;
            if (s) return s;
        }
        return TERN_OK;
    }
    if (!strcmp(ty, "Split")) {
        pt->type = PT_SPLIT;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        pt->behavior = cJSON_IsString(b) ? behavior_of(b->valuestring) : -1;
        if (pt->behavior < 0)
            return tern_err(err, TERN_EUNSUPPORTED, "tokenizer.json: pre_tokenizer Split behavior '%s' not supported",
                            cJSON_IsString(b) ? b->valuestring : "?");
        pt->invert = get_bool(j, "invert", false);
        return tk_pattern_from_json(&pt->pat, cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                    "tokenizer.json: pre_tokenizer Split", err);
    }
    if (!strcmp(ty, "ByteLevel")) {
        pt->type = PT_BYTELEVEL;
        pt->add_prefix_space = get_bool(j, "add_prefix_space", true);
        pt->use_regex = get_bool(j, "use_regex", true);
        return pt->use_regex ? tk_pattern_regex(&pt->pat, k_gpt2_re, "tokenizer.json: ByteLevel", err) : TERN_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        pt->type = PT_METASPACE;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
        if (!cJSON_IsString(r) || !r->valuestring[0])
            return tern_err(err, TERN_EFORMAT, "tokenizer.json: pre_tokenizer Metaspace needs a 'replacement' character");
        tk_utf8_next(r->valuestring, strlen(r->valuestring), &pt->repl);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        pt->prepend = TK_PREPEND_ALWAYS;
        if (cJSON_IsString(ps)) {
            if (!strcmp(ps->valuestring, "first")) pt->prepend = TK_PREPEND_FIRST;
            else if (!strcmp(ps->valuestring, "never")) pt->prepend = TK_PREPEND_NEVER;
            else if (strcmp(ps->valuestring, "always"))
                return tern_err(err, TERN_EFORMAT, "tokenizer.json: Metaspace prepend_scheme '%s' unknown", ps->valuestring);
        }
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        if (cJSON_IsFalse(ap)) pt->prepend = TK_PREPEND_NEVER;
        pt->split = get_bool(j, "split", true);
        return TERN_OK;
    }
    if (!strcmp(ty, "Digits")) {
        pt->type = PT_DIGITS;
        pt->individual = get_bool(j, "individual_digits", false);
        return TERN_OK;
    }
    if (!strcmp(ty, "Whitespace")) {
        pt->type = PT_WHITESPACE;
        return tk_pattern_regex(&pt->pat, k_ws_re, "tokenizer.json: Whitespace", err);
    }
    if (!strcmp(ty, "WhitespaceSplit")) { pt->type = PT_WSSPLIT; return TERN_OK; }
    return tern_err(err, TERN_EUNSUPPORTED, "tokenizer.json: pre_tokenizer type '%s' not supported", ty);
}

void tk_pretok_free(tk_pretok *pt) {
    if (!pt) return;
    for (int i = 0; i < pt->n_kids; i++) tk_pretok_free(&pt->kids[i]);
    free(pt->kids);
    tk_pattern_free(&pt->pat);
    memset(pt, 0, sizeof *pt);
}

/* ---- apply ---- */

/* Spans of single characters for which pred() holds. */
static int char_spans(const char *s, size_t n, bool (*pred)(int32_t), tk_spans *m) {
    m->n = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = (size_t)tk_utf8_next(s + i, n - i, &cp);
        if (pred(cp) && tk_spans_push(m, i, i + l)) return -1;
        i += l;
    }
    return 0;
}

static int metaspace(const tk_pretok *pt, const char *s, size_t n, bool at_origin, tk_list *out, tk_buf *buf,
                     tk_spans *m) {
    tk_buf rb = {0};
    if (tk_utf8_put(&rb, pt->repl)) return -1;
    buf->n = 0;
    bool starts = n >= rb.n && !memcmp(s, rb.p, rb.n);
    if (n && s[0] == ' ') starts = true; /* the space becomes the replacement */
    int rc = 0;
    if (pt->prepend == TK_PREPEND_ALWAYS || (pt->prepend == TK_PREPEND_FIRST && at_origin))
        if (!starts && n) rc = tk_buf_put(buf, rb.p, rb.n);
    for (size_t i = 0; i < n && !rc; i++)
        rc = s[i] == ' ' ? tk_buf_put(buf, rb.p, rb.n) : tk_buf_put(buf, s + i, 1);
    if (!rc && !buf->p) rc = tk_buf_reserve(buf, 0);
    if (!rc) {
        if (pt->split) {
            m->n = 0;
            tk_pattern lit = {.lit = rb.p, .lit_len = rb.n};
            rc = tk_pattern_find_all(&lit, buf->p, buf->n, m) < 0 ||
                 tk_split_apply(buf->p, buf->n, m->v, m->n / 2, 0, TK_MERGED_NEXT, at_origin, out);
        } else if (buf->n) {
            rc = tk_list_push(out, buf->p, buf->n, -1, at_origin);
        }
    }
    tk_buf_free(&rb);
    return rc;
}

static int bytelevel(const tk_pretok *pt, const char *s, size_t n, bool at_origin, tk_list *out, tk_buf *buf,
                     tk_spans *m, tk_list *tmp) {
    buf->n = 0;
    if (pt->add_prefix_space && (n == 0 || s[0] != ' ') && n && tk_buf_put(buf, " ", 1)) return -1;
    if (tk_buf_put(buf, s, n)) return -1;
    tk_list_clear(tmp);
    if (pt->use_regex) {
        if (tk_pattern_find_all(&pt->pat, buf->p, buf->n, m) < 0 ||
            tk_split_apply(buf->p, buf->n, m->v, m->n / 2, 0, TK_ISOLATED, at_origin, tmp))
            return -1;
    } else if (buf->n && tk_list_push(tmp, buf->p, buf->n, -1, at_origin)) {
        return -1;
    }
    for (size_t i = 0; i < tmp->n; i++) {
        const unsigned char *p = (const unsigned char *)tk_piece_str(tmp, i);
        buf->n = 0;
        if (tk_buf_reserve(buf, tmp->v[i].len * 2)) return -1;
        for (size_t k = 0; k < tmp->v[i].len; k++) {
            uint16_t c = tk_byte_char(p[k]);
            if (c < 0x80) buf->p[buf->n++] = (char)c;
            else {
                buf->p[buf->n++] = (char)(0xC0 | c >> 6);
                buf->p[buf->n++] = (char)(0x80 | (c & 0x3F));
            }
        }
        if (tk_list_push(out, buf->p, buf->n, -1, tmp->v[i].at_origin)) return -1;
    }
    return 0;
}

static int apply1(const tk_pretok *pt, tk_list *l, tk_list *out, tk_list *tmp) {
    tk_list_clear(out);
    tk_spans m = {0};
    tk_buf buf = {0};
    int rc = 0;
    for (size_t i = 0; i < l->n && !rc; i++) {
        const tk_piece *pc = &l->v[i];
        const char *s = tk_piece_str(l, i);
        if (pc->id >= 0) { rc = tk_list_push(out, s, pc->len, pc->id, pc->at_origin); continue; }
        switch (pt->type) {
        case PT_SPLIT:
        case PT_WHITESPACE: {
            int beh = pt->type == PT_SPLIT ? pt->behavior : TK_REMOVED;
            bool inv = pt->type == PT_SPLIT ? pt->invert : true;
            rc = tk_pattern_find_all(&pt->pat, s, pc->len, &m) < 0 ||
                 tk_split_apply(s, pc->len, m.v, m.n / 2, inv, beh, pc->at_origin, out);
            break;
        }
        case PT_DIGITS:
            rc = char_spans(s, pc->len, tk_is_numeric, &m) ||
                 tk_split_apply(s, pc->len, m.v, m.n / 2, 0, pt->individual ? TK_ISOLATED : TK_CONTIGUOUS,
                                pc->at_origin, out);
            break;
        case PT_WSSPLIT:
            rc = char_spans(s, pc->len, tk_is_ws, &m) ||
                 tk_split_apply(s, pc->len, m.v, m.n / 2, 0, TK_REMOVED, pc->at_origin, out);
            break;
        case PT_METASPACE:
            rc = metaspace(pt, s, pc->len, pc->at_origin, out, &buf, &m);
            break;
        case PT_BYTELEVEL:
            rc = bytelevel(pt, s, pc->len, pc->at_origin, out, &buf, &m, tmp);
            break;
        default:
            rc = tk_list_push(out, s, pc->len, -1, pc->at_origin);
        }
    }
    tk_spans_free(&m);
    tk_buf_free(&buf);
    return rc ? -1 : 0;
}

int tk_pretok_apply(const tk_pretok *pt, tk_list *l, tk_list *tmp) {
    if (pt->type == PT_SEQ) {
        for (int i = 0; i < pt->n_kids; i++)
            if (tk_pretok_apply(&pt->kids[i], l, tmp)) return -1;
        return 0;
    }
    tk_list out = {0}, scratch = {0};
    int rc = apply1(pt, l, &out, &scratch);
    tk_list_free(&scratch);
    if (rc) { tk_list_free(&out); return -1; }
    tk_list_free(l);
    *l = out;
    (void)tmp;
    return 0;
}
