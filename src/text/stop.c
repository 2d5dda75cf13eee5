/*
 * stop.c — stop-string matcher (see stop.h).
 *
 * pending = held-back text + new chunk. Every stop occurrence in pending is found with
 * memmem; the one ending first wins. Without a match, the longest suffix of pending that is
 * a proper prefix of some stop string is held back and the rest is emitted. Matches cannot
 * be missed across chunks because everything that could start one is still in pending.
 * Cost per feed: O(|pending| · number of stops) plus the suffix check, which is bounded by
 * the longest stop string.
 */
#include "text/stop.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

struct tern_stop {
    char **stops;
    size_t *lens, n, max_len;
    char *pend;
    size_t pn, pcap;
    char *out;
    size_t ocap;
    int which; /* matched stop, -1 while running */
};

tern_status tern_stop_new(tern_stop **out, const char *const *stops, size_t n_stops, tern_error *err) {
    *out = NULL;
    tern_stop *s = calloc(1, sizeof *s);
    if (!s) return tern_err(err, TERN_ENOMEM, "stop: out of memory");
    s->which = -1;
    s->stops = calloc(n_stops + 1, sizeof *s->stops);
    s->lens = calloc(n_stops + 1, sizeof *s->lens);
    if (!s->stops || !s->lens) { tern_stop_free(s); return tern_err(err, TERN_ENOMEM, "stop: out of memory"); }
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        size_t l = strlen(stops[i]);
        s->stops[s->n] = malloc(l + 1);
        if (!s->stops[s->n]) { tern_stop_free(s); return tern_err(err, TERN_ENOMEM, "stop: out of memory"); }
        memcpy(s->stops[s->n], stops[i], l + 1);
        s->lens[s->n++] = l;
        if (l > s->max_len) s->max_len = l;
    }
    *out = s;
    return TERN_OK;
}

static int grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int emit(tern_stop *s, size_t n, const char **text, size_t *len) {
    if (grow(&s->out, &s->ocap, n + 1)) return TERN_ENOMEM;
    memcpy(s->out, s->pend, n);
    s->out[n] = 0;
    memmove(s->pend, s->pend + n, s->pn - n);
    s->pn -= n;
    *text = s->out;
    *len = n;
    return 0;
}

int tern_stop_feed(tern_stop *s, const char *chunk, size_t n, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (s->which >= 0) return 1;
    if (grow(&s->pend, &s->pcap, s->pn + n + 1)) return TERN_ENOMEM;
    if (n) memcpy(s->pend + s->pn, chunk, n);
    s->pn += n;
    size_t best_end = SIZE_MAX, best_start = 0;
    for (size_t i = 0; i < s->n; i++) {
        const char *h = s->pn >= s->lens[i] ? memmem(s->pend, s->pn, s->stops[i], s->lens[i]) : NULL;
        if (!h) continue;
        size_t st = (size_t)(h - s->pend), en = st + s->lens[i];
        if (en < best_end || (en == best_end && st < best_start)) { best_end = en; best_start = st; s->which = (int)i; }
    }
    if (s->which >= 0) {
        int rc = emit(s, best_start, text, len);
        s->pn = 0;
        return rc ? rc : 1;
    }
    /* hold back the longest suffix that is a proper prefix of a stop string */
    size_t hold = 0;
    for (size_t k = TERN_MIN(s->pn, s->max_len ? s->max_len - 1 : 0); k > 0 && !hold; k--)
        for (size_t i = 0; i < s->n; i++)
            if (s->lens[i] > k && !memcmp(s->pend + s->pn - k, s->stops[i], k)) { hold = k; break; }
    return emit(s, s->pn - hold, text, len);
}

void tern_stop_flush(tern_stop *s, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (s->which >= 0 || !s->pn) return;
    if (emit(s, s->pn, text, len)) { *text = ""; *len = 0; }
}

int tern_stop_which(const tern_stop *s) { return s ? s->which : -1; }

void tern_stop_reset(tern_stop *s) {
    if (!s) return;
    s->pn = 0;
    s->which = -1;
}

void tern_stop_free(tern_stop *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->stops);
    free(s->lens);
    free(s->pend);
    free(s->out);
    free(s);
}
