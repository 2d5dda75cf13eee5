/*
 * detok.c — incremental detokenizer (see detok.h): HF DecodeStream's window algorithm.
 *
 * State: ids[0..n) the window, prefix = decode(ids[0..prefix_index)) as already emitted.
 * step(id): (1) if there is no prefix yet, try to make one from the current window; (2)
 * append id and decode the window; (3) if the result is longer than the prefix and does not
 * end in U+FFFD, emit the tail past the prefix, drop the ids before prefix_index, and
 * re-decode what is left as the new prefix. HF reports an error when the new text does not
 * start with the prefix (a decoder that rewrites earlier text); we never saw one in practice
 * and emit the tail past the prefix length (at a character boundary) instead of failing.
 */
#include "text/detok.h"
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

struct tern_detok {
    const tern_tokenizer *tok;
    int skip;
    int32_t *ids;
    size_t n, cap, prefix_index;
    tk_buf prefix, cur, out;
};

/* Decode ids into *out (like tern_tokenizer_decode, into a reusable buffer). */
static int decode_into(const tern_detok *d, const int32_t *ids, size_t n, tk_buf *out) {
    char *s;
    size_t len;
    if (tern_tokenizer_decode(d->tok, ids, n, d->skip, &s, &len, NULL)) return -1;
    out->n = 0;
    int rc = tk_buf_put(out, s, len);
    free(s);
    return rc;
}

static bool ends_replacement(const tk_buf *b) { return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3); }

tern_status tern_detok_new(tern_detok **out, const tern_tokenizer *tok, int skip_special, tern_error *err) {
    *out = NULL;
    if (!tok) return tern_err(err, TERN_EINVAL, "detok: no tokenizer");
    tern_detok *d = calloc(1, sizeof *d);
    if (!d || tk_buf_reserve(&d->prefix, 0) || tk_buf_reserve(&d->out, 0)) {
        tern_detok_free(d);
        return tern_err(err, TERN_ENOMEM, "detok: out of memory");
    }
    d->tok = tok;
    d->skip = skip_special;
    *out = d;
    return TERN_OK;
}

void tern_detok_reset(tern_detok *d) {
    if (!d) return;
    d->n = d->prefix_index = 0;
    d->prefix.n = 0;
}

tern_status tern_detok_step(tern_detok *d, int32_t id, const char **text, size_t *len, tern_error *err) {
    *text = "";
    *len = 0;
    if (d->prefix.n == 0 && d->n) {
        if (decode_into(d, d->ids, d->n, &d->cur)) goto oom;
        if (!ends_replacement(&d->cur)) {
            tk_buf t = d->prefix; d->prefix = d->cur; d->cur = t;
            d->prefix_index = d->n;
        }
    }
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 32;
        int32_t *p = realloc(d->ids, c * sizeof *p);
        if (!p) goto oom;
        d->ids = p;
        d->cap = c;
    }
    d->ids[d->n++] = id;
    if (decode_into(d, d->ids, d->n, &d->cur)) goto oom;
    if (d->cur.n <= d->prefix.n || ends_replacement(&d->cur)) return TERN_OK;
    size_t from = d->prefix.n;
    if (memcmp(d->cur.p, d->prefix.p, d->prefix.n))
        while (from < d->cur.n && ((unsigned char)d->cur.p[from] & 0xC0) == 0x80) from++;
    d->out.n = 0;
    if (tk_buf_put(&d->out, d->cur.p + from, d->cur.n - from)) goto oom;
    size_t new_prefix_index = d->n - d->prefix_index;
    memmove(d->ids, d->ids + d->prefix_index, new_prefix_index * sizeof *d->ids);
    d->n = new_prefix_index;
    if (decode_into(d, d->ids, d->n, &d->prefix)) goto oom;
    d->prefix_index = new_prefix_index;
    *text = d->out.p;
    *len = d->out.n;
    return TERN_OK;
oom:
    return tern_err(err, TERN_ENOMEM, "detok: out of memory");
}

tern_status tern_detok_flush(tern_detok *d, const char **text, size_t *len, tern_error *err) {
    *text = "";
    *len = 0;
    if (!d->n) { tern_detok_reset(d); return TERN_OK; }
    if (decode_into(d, d->ids, d->n, &d->cur)) return tern_err(err, TERN_ENOMEM, "detok: out of memory");
    d->out.n = 0;
    size_t from = d->prefix.n;
    if (d->cur.n > from) {
        if (memcmp(d->cur.p, d->prefix.p, d->prefix.n))
            while (from < d->cur.n && ((unsigned char)d->cur.p[from] & 0xC0) == 0x80) from++;
        if (tk_buf_put(&d->out, d->cur.p + from, d->cur.n - from)) return tern_err(err, TERN_ENOMEM, "detok: out of memory");
    }
    tern_detok_reset(d);
    *text = d->out.p;
    *len = d->out.n;
    return TERN_OK;
}

void tern_detok_free(tern_detok *d) {
    if (!d) return;
    free(d->ids);
    tk_buf_free(&d->prefix);
    tk_buf_free(&d->cur);
    tk_buf_free(&d->out);
    free(d);
}
