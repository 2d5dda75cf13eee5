/*
 * normalize.c — tokenizer.json normalizers (HF `normalizers/ folder`), string → string.
 *
 *   Replace {pattern, content}   every non-overlapping match → content (Gemma: " " → "▁")
 *   Prepend {prepend}            prefix, only when the string is non-empty (Llama-2: "▁")
 *   NFC / NFD / NFKC / NFKD      utf8proc (Unicode 15; Qwen uses NFC)
 *   Strip {strip_left, strip_right}  Unicode whitespace
 *   Lowercase                    per character (utf8proc_tolower; İ → i̇ as Rust does)
 *   Sequence {normalizers}       in order
 * Anything else (Precompiled, BertNormalizer, NMT, StripAccents, ByteLevel) is refused with
 * TERN_EUNSUPPORTED. Normalizers run per piece of text between added tokens (as HF does).
 * Offsets are not tracked; the only offset fact the pipeline needs ("does this piece start
 * at the beginning of the input") is carried beside each piece by the caller.
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum { NM_SEQ, NM_REPLACE, NM_PREPEND, NM_NFC, NM_NFD, NM_NFKC, NM_NFKD, NM_STRIP, NM_LOWER };

static tern_status dup_str(const cJSON *j, char **out, size_t *len, const char *where, tern_error *err) {
    if (!cJSON_IsString(j)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: %s must be a string", where);
    *len = strlen(j->valuestring);
    *out = malloc(*len + 1);
    if (!*out) return tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
    memcpy(*out, j->valuestring, *len + 1);
    return TERN_OK;
}

tern_status tk_norm_parse(tk_norm *nm, const cJSON *j, tern_error *err) {
    memset(nm, 0, sizeof *nm);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: normalizer without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "Sequence")) {
        nm->type = NM_SEQ;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(a)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: normalizer Sequence without 'normalizers'");
        int n = cJSON_GetArraySize(a);
        nm->kids = calloc((size_t)n + 1, sizeof *nm->kids);
        if (!nm->kids) return tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
        const cJSON *c;
        cJSON_ArrayForEach(c, a) {
            tern_status s = tk_norm_parse(&nm->kids[nm->n_kids], c, err);
            nm->n_kids++;
            if (s) return s;
        }
        return TERN_OK;
    }
    if (!strcmp(ty, "Replace")) {
        nm->type = NM_REPLACE;
        tern_status s = tk_pattern_from_json(&nm->pat, cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                             "tokenizer.json: normalizer Replace", err);
        if (s) return s;
        return dup_str(cJSON_GetObjectItemCaseSensitive(j, "content"), &nm->content, &nm->content_len,
                       "normalizer Replace 'content'", err);
    }
    if (!strcmp(ty, "Prepend")) {
        nm->type = NM_PREPEND;
        return dup_str(cJSON_GetObjectItemCaseSensitive(j, "prepend"), &nm->content, &nm->content_len,
                       "normalizer Prepend 'prepend'", err);
    }
    if (!strcmp(ty, "NFC")) { nm->type = NM_NFC; return TERN_OK; }
    if (!strcmp(ty, "NFD")) { nm->type = NM_NFD; return TERN_OK; }
    if (!strcmp(ty, "NFKC")) { nm->type = NM_NFKC; return TERN_OK; }
    if (!strcmp(ty, "NFKD")) { nm->type = NM_NFKD; return TERN_OK; }
    if (!strcmp(ty, "Lowercase")) { nm->type = NM_LOWER; return TERN_OK; }
    if (!strcmp(ty, "Strip")) {
        nm->type = NM_STRIP;
        nm->left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
        nm->right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
        return TERN_OK;
    }
    return tern_err(err, TERN_EUNSUPPORTED, "tokenizer.json: normalizer type '%s' not supported", ty);
}

void tk_norm_free(tk_norm *nm) {
    if (!nm) return;
    for (int i = 0; i < nm->n_kids; i++) tk_norm_free(&nm->kids[i]);
    free(nm->kids);
    tk_pattern_free(&nm->pat);
    free(nm->content);
    memset(nm, 0, sizeof *nm);
}

static int unicode_norm(int type, const char *s, size_t n, tk_buf *out) {
    utf8proc_option_t o = UTF8PROC_STABLE;
    if (type == NM_NFC) o |= UTF8PROC_COMPOSE;
    else if (type == NM_NFD) o |= UTF8PROC_DECOMPOSE;
    else if (type == NM_NFKC) o |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else o |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, o);
    if (r < 0) { free(dst); return tk_buf_put(out, s, n); } /* cannot happen on valid UTF-8 */
    int rc = tk_buf_put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

/* Apply one normalizer: in (s, n) → out (appended). */
static int apply1(const tk_norm *nm, const char *s, size_t n, tk_buf *out) {
    switch (nm->type) {
    case NM_REPLACE: {
        tk_spans m = {0};
        long k = tk_pattern_find_all(&nm->pat, s, n, &m);
        if (k < 0) return -1;
        size_t prev = 0;
        int rc = 0;
        for (long i = 0; i < k && !rc; i++) {
            rc = tk_buf_put(out, s + prev, m.v[2 * i] - prev) || tk_buf_put(out, nm->content, nm->content_len);
            prev = m.v[2 * i + 1];
        }
        rc = rc || tk_buf_put(out, s + prev, n - prev);
        tk_spans_free(&m);
        return rc;
    }
    case NM_PREPEND:
        if (n && tk_buf_put(out, nm->content, nm->content_len)) return -1;
        return tk_buf_put(out, s, n);
    case NM_NFC: case NM_NFD: case NM_NFKC: case NM_NFKD:
        return unicode_norm(nm->type, s, n, out);
    case NM_STRIP: {
        size_t a = 0, b = n;
        int32_t cp;
        while (nm->left && a < b) {
            int l = tk_utf8_next(s + a, b - a, &cp);
            if (!tk_is_ws(cp)) break;
            a += (size_t)l;
        }
        while (nm->right && b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            tk_utf8_next(s + p, b - p, &cp);
            if (!tk_is_ws(cp)) break;
            b = p;
        }
        return tk_buf_put(out, s + a, b - a);
    }
    case NM_LOWER:
        if (tk_buf_reserve(out, n)) return -1;
        for (size_t i = 0; i < n;) {
            int32_t cp;
            i += (size_t)tk_utf8_next(s + i, n - i, &cp);
            if (cp == 0x130) { if (tk_buf_put(out, "i\xCC\x87", 3)) return -1; continue; }
            if (tk_utf8_put(out, utf8proc_tolower(cp))) return -1;
        }
        return 0;
    default:
        return tk_buf_put(out, s, n);
    }
}

int tk_norm_apply(const tk_norm *nm, const char *s, size_t n, tk_buf *out) {
    out->n = 0;
    if (nm->type != NM_SEQ) return apply1(nm, s, n, out) || tk_buf_reserve(out, 0);
    if (tk_buf_put(out, s, n)) return -1;
    tk_buf tmp = {0};
    for (int i = 0; i < nm->n_kids; i++) {
        tmp.n = 0;
        if (tk_norm_apply(&nm->kids[i], out->p, out->n, &tmp)) { tk_buf_free(&tmp); return -1; }
        tk_buf t = *out; *out = tmp; tmp = t;
    }
    tk_buf_free(&tmp);
    return 0;
}
