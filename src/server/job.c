/*
 * job.c — one generation request between the HTTP thread and the engine thread.
 *
 * The engine callback (engine thread) copies each event into the job's queue under the
 * job's mutex and returns at once: 1 (cancel) once the client is gone, 2 (stop) once a stop
 * string matched. The job is reference-counted (HTTP side + engine side) because either may
 * finish first: the engine keeps calling back until its DONE/ERROR event even after the
 * client left.
 *
 * Text: decode-and-diff incremental detokenization over a sliding window (prefix_off,
 * read_off — the window start keeps SentencePiece-style leading spaces right), holding
 * back output that ends in U+FFFD (a character cut between tokens). Stop strings are
 * matched on the text with hold-back: text that could be the start of a stop string is
 * not sent until the next token decides; on a match only the text before it is sent.
 */
#include "server/srv.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct chan_ev {
    tern_event_kind kind;
    srv_tokinfo t;
    tern_finish_reason fin;
    int np, nc, ng;
    char msg[TERN_ERROR_MSG_MAX];
} chan_ev;

struct srv_job {
    tern_server *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    chan_ev *q;
    int qhead, qlen, qcap;
    int want_cancel, want_stop;
    uint64_t id;
    srv_params p;
    int fd, n_prompt;
    /* text state (HTTP thread only) */
    int32_t *ids;
    int n_ids, cap_ids, prefix_off, read_off;
    char *pend;
    size_t pend_len, pend_cap;
    char *out;
    size_t out_len, out_cap;
    srv_tokinfo *toks;
    int n_toks, cap_toks;
    int text_done, done, failed;
    double t_check;              /* last client/stop check */
    srv_result res;
};

static void unref(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int r = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (r > 0) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    srv_params_free(&j->p);
    free(j->q);
    free(j->ids);
    free(j->pend);
    free(j->out);
    free(j->toks);
    free(j);
}

static int on_event(void *ctx, const tern_event *ev) {
    srv_job *j = ctx;
    int last = ev->kind != TERN_EV_TOKEN;
    pthread_mutex_lock(&j->mu);
    if (j->qlen == j->qcap || j->qhead + j->qlen == j->qcap) {
        /* compact, then grow */
        if (j->qhead) { memmove(j->q, j->q + j->qhead, sizeof(chan_ev) * (size_t)j->qlen); j->qhead = 0; }
        if (j->qlen == j->qcap) {
            int nc = j->qcap ? j->qcap * 2 : 16;
            chan_ev *nq = realloc(j->q, sizeof(chan_ev) * (size_t)nc);
            if (!nq) {                         /* cannot queue: end the request */
                j->want_cancel = 1;
                pthread_mutex_unlock(&j->mu);
                if (last) unref(j);
                return 1;
            }
            j->q = nq;
            j->qcap = nc;
        }
    }
    chan_ev *c = &j->q[j->qhead + j->qlen++];
    memset(c, 0, offsetof(chan_ev, msg) + 1);
    c->kind = ev->kind;
    if (ev->kind == TERN_EV_TOKEN) {
        c->t.id = ev->token;
        c->t.logprob = ev->logprob;
        int nt = ev->n_top < 0 ? 0 : ev->n_top > 20 ? 20 : ev->n_top;
        if (!ev->top_ids || !ev->top_logprobs) nt = 0;
        c->t.n_top = nt;
        for (int i = 0; i < nt; i++) { c->t.top_ids[i] = ev->top_ids[i]; c->t.top_lps[i] = ev->top_logprobs[i]; }
    } else if (ev->kind == TERN_EV_DONE) {
        c->fin = ev->finish;
        c->np = ev->n_prompt;
        c->nc = ev->n_cached;
        c->ng = ev->n_generated;
    } else {
        snprintf(c->msg, sizeof c->msg, "%s", ev->err && ev->err->msg[0] ? ev->err->msg : "generation failed");
    }
    int rc = j->want_cancel ? 1 : j->want_stop ? 2 : 0;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (last) unref(j);
    return rc;
}

int srv_client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return 0;
    return (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

int srv_job_start(tern_server *s, const srv_prompt *pr, srv_params *p, int fd, srv_job **out, srv_error *e) {
    *out = NULL;
    int n_ctx = s->info.n_ctx > 0 ? s->info.n_ctx : 1 << 30;
    if (pr->n <= 0) { srv_params_free(p); return srv_fail(e, 400, "messages", "the prompt is empty"); }
    if (pr->n >= n_ctx) {
        srv_params_free(p);
        return srv_fail(e, 400, "messages", "the prompt has %d tokens; the context holds %d", pr->n, n_ctx);
    }
    srv_job *j = calloc(1, sizeof *j);
    if (!j) { srv_params_free(p); return srv_fail(e, 500, "", "out of memory"); }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->s = s;
    j->p = *p;
    memset(p, 0, sizeof *p);
    j->fd = fd;
    j->n_prompt = pr->n;
    j->refs = 2;

    tern_request r = tern__srv_request_default();
    r.prompt = pr->ids;
    r.n_prompt = pr->n;
    int mt = j->p.max_tokens > 0 ? j->p.max_tokens : s->o.default_max_tokens;
    if (mt > n_ctx - pr->n) mt = n_ctx - pr->n;
    r.max_tokens = mt;
    r.sampling = j->p.s;
    if (!j->p.has_seed) {
        uint64_t x = atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
        x ^= x >> 31;
        r.sampling.seed = x * 0xBF58476D1CE4E5B9ull;
    }
    r.ignore_eos = j->p.ignore_eos;
    r.on_event = on_event;
    r.ctx = j;
    tern_error err = {0};
    tern_status st = s->vt->submit(s->eng, &r, &j->id, &err);
    if (st != TERN_OK) {
        j->refs = 1;
        unref(j);
        return srv_fail(e, st == TERN_EINVAL ? 400 : 500, "", "%s", err.msg[0] ? err.msg : tern_status_str(st));
    }
    *out = j;
    return 0;
}

const srv_params *srv_job_params(const srv_job *j) { return &j->p; }

static int grow(char **b, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *nb = realloc(*b, c);
    if (!nb) return 0;
    *b = nb;
    *cap = c;
    return 1;
}

static int emit(srv_job *j, const char *t, size_t n) {
    if (!grow(&j->out, &j->out_cap, j->out_len + n + 1)) return 0;
    memcpy(j->out + j->out_len, t, n);
    j->out_len += n;
    j->out[j->out_len] = 0;
    return 1;
}

/* Push decoded text through the stop matcher. at_end: no more text will come. */
static int push_text(srv_job *j, const char *t, size_t n, int at_end) {
    if (j->text_done) return 1;
    if (!grow(&j->pend, &j->pend_cap, j->pend_len + n + 1)) return 0;
    memcpy(j->pend + j->pend_len, t, n);
    j->pend_len += n;
    size_t best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < j->p.n_stop; i++) {
        const char *hit = memmem(j->pend, j->pend_len, j->p.stop[i], strlen(j->p.stop[i]));
        if (hit && (size_t)(hit - j->pend) < best) { best = (size_t)(hit - j->pend); which = i; }
    }
    if (which >= 0) {
        if (!emit(j, j->pend, best)) return 0;
        j->pend_len = 0;
        j->text_done = 1;
        j->res.end = SRV_END_STOP_STRING;
        j->res.stop_index = which;
        pthread_mutex_lock(&j->mu);
        j->want_stop = 1;
        pthread_mutex_unlock(&j->mu);
        return 1;
    }
    size_t hold = 0;
    if (!at_end)
        for (int i = 0; i < j->p.n_stop; i++) {
            size_t sl = strlen(j->p.stop[i]);
            for (size_t k = TERN_MIN(sl - 1, j->pend_len); k > hold; k--)
                if (!memcmp(j->pend + j->pend_len - k, j->p.stop[i], k)) { hold = k; break; }
        }
    if (!emit(j, j->pend, j->pend_len - hold)) return 0;
    memmove(j->pend, j->pend + j->pend_len - hold, hold);
    j->pend_len = hold;
    return 1;
}

static int ends_with_fffd(const char *t, size_t n) { return n >= 3 && !memcmp(t + n - 3, "\xEF\xBF\xBD", 3); }

/* Decode-and-diff: emit the text the new tokens added. */
static int detok_step(srv_job *j, int at_end, srv_error *e) {
    tern_error err = {0};
    char *pre = NULL, *full = NULL;
    if (j->s->vt->detokenize(j->s->eng, j->ids + j->prefix_off, j->read_off - j->prefix_off, &pre, &err) ||
        j->s->vt->detokenize(j->s->eng, j->ids + j->prefix_off, j->n_ids - j->prefix_off, &full, &err)) {
        free(pre);
        free(full);
        return srv_fail(e, 500, "", "detokenize: %s", err.msg);
    }
    size_t lp = strlen(pre), lf = strlen(full);
    int ok = 1;
    if (lf > lp && (at_end || !ends_with_fffd(full, lf))) {
        ok = push_text(j, full + lp, lf - lp, at_end);
        j->prefix_off = j->read_off;
        j->read_off = j->n_ids;
    } else if (at_end) ok = push_text(j, "", 0, 1);
    free(pre);
    free(full);
    return ok ? 0 : srv_fail(e, 500, "", "out of memory");
}

static int take_token(srv_job *j, const srv_tokinfo *t, srv_error *e) {
    if (j->text_done) return 0;
    if (j->n_ids == j->cap_ids) {
        int nc = j->cap_ids ? j->cap_ids * 2 : 64;
        int32_t *v = realloc(j->ids, sizeof(int32_t) * (size_t)nc);
        if (!v) return srv_fail(e, 500, "", "out of memory");
        j->ids = v;
        j->cap_ids = nc;
    }
    j->ids[j->n_ids++] = t->id;
    if (j->p.logprobs) {
        if (j->n_toks == j->cap_toks) {
            int nc = j->cap_toks ? j->cap_toks * 2 : 16;
            srv_tokinfo *v = realloc(j->toks, sizeof(srv_tokinfo) * (size_t)nc);
            if (!v) return srv_fail(e, 500, "", "out of memory");
            j->toks = v;
            j->cap_toks = nc;
        }
        j->toks[j->n_toks++] = *t;
    }
    return detok_step(j, 0, e);
}

static void cancel_job(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->want_cancel = 1;
    pthread_mutex_unlock(&j->mu);
    j->s->vt->cancel(j->s->eng, j->id);
}

/* Client gone or server stopping: cancel the request and fail with 499 / 503. */
static int check_gone(srv_job *j, srv_error *e) {
    if (atomic_load(&j->s->stopping)) {
        cancel_job(j);
        j->failed = 1;
        return srv_fail(e, 503, "", "the server is shutting down");
    }
    if (srv_client_gone(j->fd)) {
        cancel_job(j);
        j->failed = 1;
        atomic_fetch_add(&j->s->n_disconnects, 1);
        return srv_fail(e, 499, "", "client disconnected");
    }
    return 0;
}

int srv_job_next(srv_job *j, srv_piece *out, srv_result *res, srv_error *e) {
    memset(out, 0, sizeof *out);
    j->out_len = 0;
    j->n_toks = 0;
    if (j->failed) return srv_fail(e, 500, "", "request already failed");
    if (j->done) { *res = j->res; return 0; }
    for (;;) {
        chan_ev batch[32];
        int nb = 0;
        double now = tern_time_s();
        if (now - j->t_check >= 0.05) {          /* also while tokens keep coming */
            j->t_check = now;
            if (check_gone(j, e)) return -1;
        }
        pthread_mutex_lock(&j->mu);
        while (j->qlen == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
            if (j->qlen) break;
            pthread_mutex_unlock(&j->mu);
            j->t_check = tern_time_s();
            if (check_gone(j, e)) return -1;
            pthread_mutex_lock(&j->mu);
        }
        while (j->qlen && nb < 32) {
            batch[nb++] = j->q[j->qhead++];
            j->qlen--;
        }
        if (!j->qlen) j->qhead = 0;
        pthread_mutex_unlock(&j->mu);
        for (int i = 0; i < nb; i++) {
            chan_ev *c = &batch[i];
            if (c->kind == TERN_EV_TOKEN) {
                if (take_token(j, &c->t, e)) { cancel_job(j); j->failed = 1; return -1; }
            } else if (c->kind == TERN_EV_ERROR) {
                j->failed = 1;
                return srv_fail(e, 500, "", "%s", c->msg);
            } else {
                if (!j->text_done && detok_step(j, 1, e)) { j->failed = 1; return -1; }
                if (!j->text_done)
                    j->res.end = c->fin == TERN_FINISH_LENGTH ? SRV_END_LENGTH
                                 : c->fin == TERN_FINISH_CANCELLED ? SRV_END_CANCELLED : SRV_END_STOP;
                j->text_done = 1;
                j->res.n_prompt = c->np ? c->np : j->n_prompt;
                j->res.n_cached = c->nc;
                j->res.n_generated = c->ng;
                j->done = 1;
                break;
            }
        }
        if (j->out_len || j->n_toks || j->done) break;
    }
    out->text = j->out ? j->out : "";
    out->len = j->out_len;
    out->toks = j->toks;
    out->n_toks = j->n_toks;
    if (j->done && !j->out_len && !j->n_toks) { *res = j->res; return 0; }
    return 1;
}

void srv_job_free(srv_job *j) {
    if (!j) return;
    if (!j->done) cancel_job(j);
    unref(j);
}

char *srv_token_text(tern_server *s, int32_t id) {
    char *t = NULL;
    tern_error err;
    if (s->vt->detokenize(s->eng, &id, 1, &t, &err) != TERN_OK) return strdup("");
    return t;
}
