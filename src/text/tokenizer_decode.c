/*
 * tokenizer_decode.c — decoders (HF `decoders/ folder`) and tern_tokenizer_decode.
 *
 * HF decode(ids, skip_special): map each id to its token string (added-token content first,
 * unknown ids dropped), drop tokens whose string is a special added token when asked, run
 * the decoder chain over the list of strings, join the result. With no decoder the strings
 * are joined with " ". Each decoder maps a list of strings to a list of strings:
 *   Replace      per token, pattern → content (Gemma/Llama-2: "▁" → " ")
 *   ByteFallback runs of "<0xHH>" tokens → their bytes as UTF-8; an invalid run becomes one
 *                U+FFFD per byte
 *   Fuse         join everything into one string
 *   Strip        per token, drop up to `start` leading / `stop` trailing `content` chars
 *   Metaspace    replacement char → ' ', except that in the first token it is dropped
 *                (unless prepend_scheme is "never")
 *   ByteLevel    every token's chars → GPT-2 bytes (a token with a char outside the table is
 *                taken as raw UTF-8), concatenated, then UTF-8-decoded lossily
 *   Sequence     in order
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

enum { DC_SEQ, DC_REPLACE, DC_BYTEFALLBACK, DC_FUSE, DC_STRIP, DC_METASPACE, DC_BYTELEVEL };

tern_status tk_dec_parse(tk_dec *d, const cJSON *j, tern_error *err) {
    memset(d, 0, sizeof *d);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: decoder without a type");
    const char *ty = t->valuestring;
    if (!strcmp(ty, "Sequence")) {
        d->type = DC_SEQ;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(a)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: decoder Sequence without 'decoders'");
        d->kids = calloc((size_t)cJSON_GetArraySize(a) + 1, sizeof *d->kids);
        if (!d->kids) return tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
        const cJSON *c;
        cJSON_ArrayForEach(c, a) {
            tern_status s = tk_dec_parse(&d->kids[d->n_kids], c, err);
            d->n_kids++;
            if (s) return s;
        }
        return TERN_OK;
    }
    if (!strcmp(ty, "Replace")) {
        d->type = DC_REPLACE;
        tern_status s = tk_pattern_from_json(&d->pat, cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                             "tokenizer.json: decoder Replace", err);
        if (s) return s;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c)) return tern_err(err, TERN_EFORMAT, "tokenizer.json: decoder Replace needs 'content'");
        d->content_len = strlen(c->valuestring);
        d->content = malloc(d->content_len + 1);
        if (!d->content) return tern_err(err, TERN_ENOMEM, "tokenizer.json: out of memory");
        memcpy(d->content, c->valuestring, d->content_len + 1);
        return TERN_OK;
    }
    if (!strcmp(ty, "ByteFallback")) { d->type = DC_BYTEFALLBACK; return TERN_OK; }
    if (!strcmp(ty, "Fuse")) { d->type = DC_FUSE; return TERN_OK; }
    if (!strcmp(ty, "ByteLevel")) { d->type = DC_BYTELEVEL; return TERN_OK; }
    if (!strcmp(ty, "Strip")) {
        d->type = DC_STRIP;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "start"), *b = cJSON_GetObjectItemCaseSensitive(j, "stop");
        if (!cJSON_IsString(c) || !c->valuestring[0] || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
            a->valuedouble < 0 || b->valuedouble < 0 || a->valuedouble > 1e6 || b->valuedouble > 1e6)
            return tern_err(err, TERN_EFORMAT, "tokenizer.json: decoder Strip needs 'content' (a char), 'start', 'stop'");
        tk_utf8_next(c->valuestring, strlen(c->valuestring), &d->ch);
        d->start = a->valueint;
        d->stop = b->valueint;
        return TERN_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        d->type = DC_METASPACE;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
        if (!cJSON_IsString(r) || !r->valuestring[0])
            return tern_err(err, TERN_EFORMAT, "tokenizer.json: decoder Metaspace needs a 'replacement'");
        tk_utf8_next(r->valuestring, strlen(r->valuestring), &d->ch);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        d->prepend = TK_PREPEND_ALWAYS;
        if (cJSON_IsString(ps) && !strcmp(ps->valuestring, "never")) d->prepend = TK_PREPEND_NEVER;
        if (cJSON_IsString(ps) && !strcmp(ps->valuestring, "first")) d->prepend = TK_PREPEND_FIRST;
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"))) d->prepend = TK_PREPEND_NEVER;
        return TERN_OK;
    }
    return tern_err(err, TERN_EUNSUPPORTED, "tokenizer.json: decoder type '%s' not supported", ty);
}

void tk_dec_free(tk_dec *d) {
    if (!d) return;
    for (int i = 0; i < d->n_kids; i++) tk_dec_free(&d->kids[i]);
    free(d->kids);
    tk_pattern_free(&d->pat);
    free(d->content);
    memset(d, 0, sizeof *d);
}

static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (x < 0) return -1;
        v = v * 16 + x;
    }
    return v;
}

static int flush_bytes(tk_list *out, tk_buf *bytes) {
    int rc = 0;
    if (!bytes->n) return 0;
    if (tk_utf8_valid(bytes->p, bytes->n)) rc = tk_list_push(out, bytes->p, bytes->n, -1, false);
    else
        for (size_t i = 0; i < bytes->n && !rc; i++) rc = tk_list_push(out, "\xEF\xBF\xBD", 3, -1, false);
    bytes->n = 0;
    return rc;
}

/* One decoder step: in → out (out cleared first). */
static int dec1(const tk_dec *d, const tk_list *in, tk_list *out) {
    tk_list_clear(out);
    tk_buf b = {0};
    tk_spans m = {0};
    int rc = 0;
    switch (d->type) {
    case DC_REPLACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = tk_piece_str(in, i);
            size_t n = in->v[i].len, prev = 0;
            long k = tk_pattern_find_all(&d->pat, s, n, &m);
            b.n = 0;
            rc = k < 0 || tk_buf_reserve(&b, n);
            for (long x = 0; x < k && !rc; x++) {
                rc = tk_buf_put(&b, s + prev, m.v[2 * x] - prev) || tk_buf_put(&b, d->content, d->content_len);
                prev = m.v[2 * x + 1];
            }
            rc = rc || tk_buf_put(&b, s + prev, n - prev) || tk_list_push(out, b.p, b.n, -1, false);
        }
        break;
    case DC_BYTEFALLBACK:
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = tk_piece_str(in, i);
            int v = byte_token(s, in->v[i].len);
            if (v >= 0) { unsigned char c = (unsigned char)v; rc = tk_buf_put(&b, &c, 1); continue; }
            rc = flush_bytes(out, &b) || tk_list_push(out, s, in->v[i].len, -1, false);
        }
        rc = rc || flush_bytes(out, &b);
        break;
    case DC_FUSE:
    case DC_BYTELEVEL:
        rc = tk_buf_reserve(&b, in->text.n);
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = tk_piece_str(in, i);
            size_t n = in->v[i].len, start = b.n;
            if (d->type == DC_FUSE) { rc = tk_buf_put(&b, s, n); continue; }
            bool ok = true;
            for (size_t k = 0; k < n && ok;) {
                int32_t cp;
                k += (size_t)tk_utf8_next(s + k, n - k, &cp);
                int byte = tk_char_to_byte(cp);
                if (byte < 0) ok = false;
                else { unsigned char c = (unsigned char)byte; rc = tk_buf_put(&b, &c, 1); }
            }
            if (!ok) { b.n = start; rc = tk_buf_put(&b, s, n); }
        }
        if (!rc && d->type == DC_BYTELEVEL) {
            tk_buf l = {0};
            rc = tk_utf8_lossy(&l, b.p ? b.p : "", b.n) || tk_list_push(out, l.p ? l.p : "", l.n, -1, false);
            tk_buf_free(&l);
        } else if (!rc) {
            rc = tk_list_push(out, b.p ? b.p : "", b.n, -1, false);
        }
        break;
    case DC_STRIP:
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = tk_piece_str(in, i);
            size_t n = in->v[i].len, a = 0, e = n;
            int32_t cp;
            for (int k = 0; k < d->start && a < n; k++) {
                int l = tk_utf8_next(s + a, n - a, &cp);
                if (cp != d->ch) break;
                a += (size_t)l;
            }
            for (int k = 0; k < d->stop && e > a; k++) {
                size_t p = e - 1;
                while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                tk_utf8_next(s + p, e - p, &cp);
                if (cp != d->ch) break;
                e = p;
            }
            rc = tk_list_push(out, s + a, e - a, -1, false);
        }
        break;
    case DC_METASPACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = tk_piece_str(in, i);
            size_t n = in->v[i].len;
            b.n = 0;
            rc = tk_buf_reserve(&b, n);
            for (size_t k = 0; k < n && !rc;) {
                int32_t cp;
                int l = tk_utf8_next(s + k, n - k, &cp);
                if (cp == d->ch) {
                    if (!(i == 0 && d->prepend != TK_PREPEND_NEVER)) rc = tk_buf_put(&b, " ", 1);
                } else {
                    rc = tk_buf_put(&b, s + k, (size_t)l);
                }
                k += (size_t)l;
            }
            rc = rc || tk_list_push(out, b.p, b.n, -1, false);
        }
        break;
    default:
        for (size_t i = 0; i < in->n && !rc; i++) rc = tk_list_push(out, tk_piece_str(in, i), in->v[i].len, -1, false);
    }
    tk_buf_free(&b);
    tk_spans_free(&m);
    return rc ? -1 : 0;
}

static int dec_run(const tk_dec *d, tk_list *l) {
    if (d->type == DC_SEQ) {
        for (int i = 0; i < d->n_kids; i++)
            if (dec_run(&d->kids[i], l)) return -1;
        return 0;
    }
    tk_list out = {0};
    if (dec1(d, l, &out)) { tk_list_free(&out); return -1; }
    tk_list_free(l);
    *l = out;
    return 0;
}

int tk_decode_tokens(const tern_tokenizer *tok, const char **s, const size_t *n, size_t count, tk_buf *out) {
    out->n = 0;
    if (tk_buf_reserve(out, 0)) return -1;
    out->p[0] = 0;
    tk_list l = {0};
    int rc = 0;
    for (size_t i = 0; i < count && !rc; i++) rc = tk_list_push(&l, s[i], n[i], -1, false);
    if (!rc && tok->has_dec) rc = dec_run(&tok->dec, &l);
    for (size_t i = 0; i < l.n && !rc; i++) {
        if (!tok->has_dec && i && tk_buf_put(out, " ", 1)) rc = -1;
        else rc = tk_buf_put(out, tk_piece_str(&l, i), l.v[i].len);
    }
    tk_list_free(&l);
    return rc;
}

tern_status tern_tokenizer_decode(const tern_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                                  char **str, size_t *len, tern_error *err) {
    *str = NULL;
    if (len) *len = 0;
    if (!tok || (!ids && n)) return tern_err(err, TERN_EINVAL, "tokenizer decode: bad arguments");
    const char **ss = malloc((n + 1) * sizeof *ss);
    size_t *ns = malloc((n + 1) * sizeof *ns);
    tk_buf out = {0};
    size_t k = 0;
    int rc = !ss || !ns;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= tok->n_ids || tok->id_off[id] == SIZE_MAX) continue;
        if (skip_special && tok->id_special[id]) continue;
        ss[k] = tok->id_text.p + tok->id_off[id];
        ns[k++] = tok->id_len[id];
    }
    rc = rc || tk_decode_tokens(tok, ss, ns, k, &out);
    free(ss);
    free(ns);
    if (rc) { tk_buf_free(&out); return tern_err(err, TERN_ENOMEM, "tokenizer decode: out of memory"); }
    *str = out.p;
    if (len) *len = out.n;
    return TERN_OK;
}
