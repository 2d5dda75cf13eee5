/*
 * tokenizer_guard.c — the prompt-injection guard's two halves (format in tokenizer.h):
 * tern_tokenizer_escape marks untrusted text before it goes into a chat template, and
 * tk_unescape turns a rendered, escaped prompt back into plain text plus a bitmap of break
 * marks, which the added-token splitter (tokenizer_encode.c) consults.
 *
 * Why a break mark BEFORE each occurrence (not inside it): it also covers one-character
 * special tokens, and a mark is then always followed by the token's own first byte, never
 * by another U+FDD0 (no special token starts with one), so the run-length code (2k = k
 * literal, odd = one mark more) is unambiguous. Occurrences are found with a byte trie of
 * the special tokens' contents; every start position is marked, overlapping ones included,
 * so whichever match the leftmost-longest splitter later picks holds a mark. The first-byte
 * bitset keeps the scan at ~1 byte compare per input byte for ordinary text.
 * U+FDD0 is a noncharacter ("for internal use"); text containing it round-trips exactly
 * (doubled by escape, collapsed by encode), so HF parity holds even then.
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#define ESC_LEN 3

static bool is_esc(const char *s, size_t n, size_t i) {
    return i + ESC_LEN <= n && !memcmp(s + i, TERN_TOK_ESC, ESC_LEN);
}

/* 1 if some special token's content starts at s[i]. */
static bool special_at(const tern_tokenizer *tok, const char *s, size_t n, size_t i) {
    unsigned char c0 = (unsigned char)s[i];
    if (!(tok->esc_first[c0 >> 3] & (1u << (c0 & 7)))) return false;
    int32_t node = 0;
    for (size_t j = i; j < n; j++) {
        node = tk_trie_child(&tok->trie_esc, node, (unsigned char)s[j]);
        if (node < 0) return false;
        if (tok->trie_esc.term[node] >= 0) return true;
    }
    return false;
}

tern_status tern_tokenizer_escape(const tern_tokenizer *tok, const char *s, size_t n, char **out, size_t *out_len,
                                  tern_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!tok || (!s && n)) return tern_err(err, TERN_EINVAL, "tokenizer escape: bad arguments");
    tk_buf b = {0};
    size_t run = 0; /* s[run..i) not yet copied */
    int rc = tk_buf_reserve(&b, n + 16);
    for (size_t i = 0; i < n && !rc;) {
        if (is_esc(s, n, i)) { /* a literal U+FDD0: doubled */
            rc = tk_buf_put(&b, s + run, i + ESC_LEN - run) || tk_buf_put(&b, TERN_TOK_ESC, ESC_LEN);
            i += ESC_LEN;
            run = i;
            continue;
        }
        if (tok->trie_esc.n_nodes && special_at(tok, s, n, i)) {
            rc = tk_buf_put(&b, s + run, i - run) || tk_buf_put(&b, TERN_TOK_ESC, ESC_LEN);
            run = i;
        }
        i++;
    }
    if (!rc) rc = tk_buf_put(&b, s + run, n - run);
    if (rc) {
        tk_buf_free(&b);
        return tern_err(err, TERN_ENOMEM, "tokenizer escape: out of memory");
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return TERN_OK;
}

int tk_unescape(const char *s, size_t n, tk_buf *out, uint8_t **brk) {
    *brk = NULL;
    out->n = 0;
    const char *p = memmem(s, n, TERN_TOK_ESC, ESC_LEN);
    if (!p) return tk_buf_put(out, s, n);
    if (!(*brk = calloc(n + 1, 1))) return -1;
    size_t i = 0;
    while (p) {
        size_t at = (size_t)(p - s), r = 0;
        if (tk_buf_put(out, s + i, at - i)) return -1;
        i = at;
        while (is_esc(s, n, i)) { r++; i += ESC_LEN; }
        for (size_t k = 0; k < r / 2; k++)
            if (tk_buf_put(out, TERN_TOK_ESC, ESC_LEN)) return -1;
        if (r & 1) (*brk)[out->n] = 1;
        p = i < n ? memmem(s + i, n - i, TERN_TOK_ESC, ESC_LEN) : NULL;
    }
    return tk_buf_put(out, s + i, n - i);
}
