/*
 * job.c — one generation request between the HTTP thread and the engine thread.
 *
 * The engine callback (engine thread) copies each event into the job's queue under the
 * job's mutex and returns at once: 1 (cancel) once the client is gone, 2 (stop) once a stop
 * string matched. It does not wake the HTTP thread itself: a job whose HTTP thread sleeps
 * goes on the server's wake list, and after the engine step (srv_jobs_after_step) each
 * listed thread is woken once — by the engine thread when there are at most WAKE_INLINE,
 * else by the waker thread, so that many futex wake-ups do not hold up the next step. The
 * last event of a request wakes at once. The HTTP thread takes everything queued in one go
 * (swapping the queue's buffers), so the tokens of several steps become one SSE event when
 * it falls behind. The job is reference-counted (HTTP side + engine side + the wake list)
 * because either may finish first: the engine keeps calling back until its DONE/ERROR
 * event even after the client left. With response_format the engine thread also runs the JSON matcher: the
 * request's mask callback masks the logits, and each TOKEN event advances the matcher
 * before the next mask (both on the engine thread, so the matcher needs no lock).
 *
 * Admission (srv_job_start, before anything reaches the engine): a prompt that leaves no room
 * in the context, or an explicit max_tokens that does not fit after it, is a 400
 * (context_length_exceeded); at most max_concurrency + max_queue jobs are live (s->n_live,
 * dropped on the engine's last event), beyond that a 429 (rate_limit_error, queue_full); a
 * prompt the KV pool can never hold is refused by tern_engine_submit (TERN_ENOMEM) -> 400.
 *
 * A model without a tokenizer (`random:PRESET`) still serves token-id prompts: each generated
 * id is written as the text "<ID>" (srv_id_text), so the output stays visible and reversible.
 *
 * Text (HTTP thread), per token, O(new text): the incremental detokenizer (text/detok.h,
 * special tokens decoded so tool/reasoning markers are seen) -> the output parser
 * (text/toolcall.h: content / reasoning / completed tool calls) when the request has one ->
 * the stop-string matcher (text/stop.h) on the content, which holds back a suffix that could
 * still become a stop string and ends the request (want_stop) on a match.
 */
#include "server/srv.h"
#include "text/detok.h"
#include "text/stop.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct chan_ev {
    tern_event_kind kind;
    tern_finish_reason fin;       /* DONE */
    int np, nc, ng;               /* DONE: usage */
    srv_tokinfo t;                /* TOKEN (top_* filled only up to t.n_top) */
} chan_ev;

struct srv_job {
    tern_server *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    chan_ev *q;                  /* engine side appends here (under mu) */
    int qlen, qcap;
    chan_ev *rq;                 /* HTTP side: the batch taken from q (buffers are swapped) */
    int rlen, rpos, rcap;
    int waiting;                 /* the HTTP thread sleeps on cv (under mu) */
    int notify;                  /* the stream writer drains this job (sse.c): kick it, no cv */
    int wake_queued;             /* in s->wake until the end of the engine step (under mu) */
    char err_msg[TERN_ERROR_MSG_MAX];   /* the ERROR event's message */
    int want_cancel, want_stop;
    uint64_t id;
    srv_params p;
    int fd, n_prompt;
    /* engine-thread state */
    srv_jmatch *jm;              /* response_format matcher, NULL = free text */
    double t_submit, t_last;     /* for TTFT / inter-token latency */
    int n_tok_ev;
    /* text state (HTTP thread only) */
    tern_detok *dt;
    tern_out_parser *op;
    tern_stop *stop;
    char *out, *rout;            /* this piece's content / reasoning */
    size_t out_len, out_cap, rout_len, rout_cap;
    int call_lo;                 /* calls reported before this piece */
    char (*call_ids)[40];
    int n_call_ids;
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
    srv_jmatch_free(j->jm);
    tern_detok_free(j->dt);
    tern_out_parser_free(j->op);
    tern_stop_free(j->stop);
    free(j->call_ids);
    free(j->q);
    free(j->rq);
    free(j->out);
    free(j->rout);
    free(j->toks);
    free(j);
}

/* Engine thread: s->wake gets j (with a reference) so that srv_jobs_after_step wakes it. */
static int wake_later(tern_server *s, srv_job *j) {
    if (s->n_wake == s->cap_wake) {
        int nc = s->cap_wake ? s->cap_wake * 2 : 64;
        srv_job **v = realloc(s->wake, sizeof *v * (size_t)nc);
        if (!v) return 0;
        s->wake = v;
        s->cap_wake = nc;
    }
    s->wake[s->n_wake++] = j;
    return 1;
}

/* The engine callback: append the event; wake-ups are left to the end of the step
 * (srv_jobs_after_step), except for the last event of a request, which wakes at once. Only
 * a sleeping HTTP thread is woken; a busy one drains the queue before it sleeps again. */
static int on_event(void *ctx, const tern_event *ev) {
    srv_job *j = ctx;
    int last = ev->kind != TERN_EV_TOKEN;
    double now = tern_time_s();
    if (ev->kind == TERN_EV_TOKEN) {             /* engine-thread state: no lock needed */
        if (j->n_tok_ev++ == 0) srv_metrics_ttft(j->s, now - j->t_submit);
        else srv_metrics_itl(j->s, now - j->t_last);
        j->t_last = now;
    }
    pthread_mutex_lock(&j->mu);
    if (j->qlen == j->qcap) {
        int nc = j->qcap ? j->qcap * 2 : 16;
        chan_ev *nq = realloc(j->q, sizeof(chan_ev) * (size_t)nc);
        if (!nq) {                             /* cannot queue: end the request */
            j->want_cancel = 1;
            pthread_mutex_unlock(&j->mu);
            if (last) {
                atomic_fetch_sub(&j->s->n_live, 1);
                unref(j);
            }
            return 1;
        }
        j->q = nq;
        j->qcap = nc;
    }
    chan_ev *c = &j->q[j->qlen++];
    c->kind = ev->kind;
    if (ev->kind == TERN_EV_TOKEN) {
        if (j->jm && srv_jmatch_accept(j->jm, ev->token)) j->want_cancel = 1;   /* cannot happen when masked */
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
        snprintf(j->err_msg, sizeof j->err_msg, "%s", ev->err && ev->err->msg[0] ? ev->err->msg : "generation failed");
    }
    int rc = j->want_cancel ? 1 : j->want_stop ? 2 : 0;
    int wake_now = 0, kick = j->notify;
    if (kick && !last) {
        j->s->kick_after_step = 1;               /* engine thread only: one kick per step */
        kick = 0;
    } else if (j->waiting && !j->wake_queued) {
        if (!last && wake_later(j->s, j)) {
            j->wake_queued = 1;
            j->refs++;
        } else wake_now = 1;
    }
    pthread_mutex_unlock(&j->mu);
    if (wake_now) pthread_cond_signal(&j->cv);   /* after unlocking: the woken thread needs mu */
    if (kick) srv_writer_kick(j->s);            /* the last event may come outside a step */
    if (last) {
        atomic_fetch_sub(&j->s->n_live, 1);
        unref(j);
    }
    return rc;
}

/* Wake the HTTP threads of jobs taken off a wake list; drops the list's references. */
static void wake_jobs(srv_job **v, int n) {
    for (int i = 0; i < n; i++) {
        srv_job *j = v[i];
        pthread_mutex_lock(&j->mu);
        j->wake_queued = 0;
        int w = j->waiting;
        pthread_mutex_unlock(&j->mu);
        if (w) pthread_cond_signal(&j->cv);
        unref(j);
    }
}

/* The waker thread: wake-ups are system calls (a futex wake, often an IPI to another core),
 * a few microseconds each; with many requests per step they would add up on the engine
 * thread, which is the bottleneck when there are spare cores. So a step's wake list goes to
 * this thread, which wakes them while the engine runs the next step. */
typedef struct srv_waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job **v;                 /* handed over by the engine thread, not yet woken */
    int n, cap;
    int busy, stop;
    pthread_t th;
} srv_waker;

/* Up to this many wake-ups per step are done on the engine thread: one more thread hop
 * costs about as much as a wake-up, and with few requests the engine thread is not busy. */
#define WAKE_INLINE 2

static void *waker_main(void *arg) {
    srv_waker *w = arg;
    srv_job **mine = NULL;
    int cap = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->n && !w->stop) {
            w->busy = 0;
            pthread_cond_wait(&w->cv, &w->mu);
        }
        if (!w->n) break;                        /* stopping and nothing left */
        w->busy = 1;
        srv_job **t = mine;                      /* take the list: swap the arrays */
        int tc = cap, n = w->n;
        mine = w->v;
        cap = w->cap;
        w->v = t;
        w->cap = tc;
        w->n = 0;
        pthread_mutex_unlock(&w->mu);
        wake_jobs(mine, n);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    free(mine);
    return NULL;
}

int srv_waker_start(tern_server *s) {
    srv_waker *w = calloc(1, sizeof *w);
    if (!w) return -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->busy = 1;
    if (pthread_create(&w->th, NULL, waker_main, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return -1;
    }
    s->waker = w;
    return 0;
}

void srv_waker_stop(tern_server *s) {
    srv_waker *w = s ? s->waker : NULL;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);                   /* it wakes what was left first */
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->v);
    free(w);
    s->waker = NULL;
}

void srv_jobs_after_step(void *server) {
    tern_server *s = server;
    srv_waker *w = s->waker;
    if (s->kick_after_step) {
        s->kick_after_step = 0;
        srv_writer_kick(s);
    }
    if (!s->n_wake) return;
    if (w && s->n_wake > WAKE_INLINE) {
        pthread_mutex_lock(&w->mu);
        int room = w->n + s->n_wake <= w->cap;
        if (!room) {
            int nc = (w->n + s->n_wake) * 2;
            srv_job **v = realloc(w->v, sizeof *v * (size_t)nc);
            if (v) { w->v = v; w->cap = nc; room = 1; }
        }
        int sig = 0;
        if (room) {
            memcpy(w->v + w->n, s->wake, sizeof *s->wake * (size_t)s->n_wake);
            w->n += s->n_wake;
            s->n_wake = 0;
            sig = !w->busy;
        }
        pthread_mutex_unlock(&w->mu);
        if (sig) pthread_cond_signal(&w->cv);
        if (!s->n_wake) return;
    }
    wake_jobs(s->wake, s->n_wake);
    s->n_wake = 0;
}

int srv_client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return 0;
    return (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int job_mask(void *ctx, float *logits, int n_vocab) {
    srv_job *j = ctx;
    return srv_jmatch_mask(j->jm, logits, n_vocab);
}

int srv_job_start(tern_server *s, const srv_prompt *pr, srv_params *p, int fd, srv_job **out, srv_error *e) {
    *out = NULL;
    int n_ctx = s->info.n_ctx > 0 ? s->info.n_ctx : 1 << 30;
    if (pr->n <= 0) { srv_params_free(p); return srv_fail(e, 400, "messages", "the prompt is empty"); }
    if (pr->n >= n_ctx) {
        srv_params_free(p);
        srv_fail(e, 400, "messages", "the prompt has %d tokens; the context holds %d", pr->n, n_ctx);
        e->code = "context_length_exceeded";
        return -1;
    }
    /* an explicit max_tokens that cannot fit after the prompt is refused before generation
     * (as OpenAI and vLLM do); the server default is clipped to the context instead */
    if (p->max_tokens > 0 && (long long)pr->n + p->max_tokens > n_ctx) {
        int mt = p->max_tokens;
        srv_params_free(p);
        srv_fail(e, 400, "max_tokens", "this model's maximum context length is %d tokens, but %lld were requested "
                 "(%d in the prompt, %d for the completion); reduce the prompt or max_tokens", n_ctx,
                 (long long)pr->n + mt, pr->n, mt);
        e->code = "context_length_exceeded";
        return -1;
    }
    /* admission: at most max_concurrency running + max_queue waiting; beyond that 429 now
     * rather than an unbounded wait (clients retry after Retry-After) */
    int conc = s->o.engine.max_concurrency > 0 ? s->o.engine.max_concurrency : 8;
    int cap = conc + (s->o.max_queue > 0 ? s->o.max_queue : 0);
    if (atomic_fetch_add(&s->n_live, 1) >= cap) {
        atomic_fetch_sub(&s->n_live, 1);
        atomic_fetch_add(&s->n_rejected, 1);
        srv_params_free(p);
        srv_fail(e, 429, "", "the server is busy: %d requests running or waiting (max concurrency %d + max queue %d); "
                 "retry later", cap, conc, s->o.max_queue);
        e->type = "rate_limit_error";
        e->code = "queue_full";
        return -1;
    }
    const tern_tokenizer *tok = s->vt->tokenizer ? s->vt->tokenizer(s->eng) : NULL;
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        atomic_fetch_sub(&s->n_live, 1);
        srv_params_free(p);
        return srv_fail(e, 500, "", "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->s = s;
    j->p = *p;
    memset(p, 0, sizeof *p);
    j->fd = fd;
    j->n_prompt = pr->n;
    j->refs = 1;
    j->res.stop_index = -1;
    tern_error ie = {0};
    int bad = tok && tern_detok_new(&j->dt, tok, 0, &ie) != TERN_OK;   /* no tokenizer: ids as text */
    if (!bad && j->p.parse_output && !j->p.gram) {
        bad = tern_out_parser_new(j->p.tools ? s->tools_fmt : TERN_TOOLS_NONE, s->reason_fmt, j->p.start_in_reasoning, &j->op, &ie) != TERN_OK;
        if (!bad && j->p.tools) tern_out_parser_set_tools(j->op, j->p.tools);
    }
    if (!bad && j->p.n_stop) bad = tern_stop_new(&j->stop, (const char *const *)j->p.stop, (size_t)j->p.n_stop, &ie) != TERN_OK;
    if (!bad && j->p.gram) {
        pthread_mutex_lock(&s->vocab_mu);
        srv_jvocab *v = s->jvocab;
        pthread_mutex_unlock(&s->vocab_mu);
        bad = !v || srv_jmatch_new(j->p.gram, v, &j->jm, &ie) != TERN_OK;
        if (!v) snprintf(ie.msg, sizeof ie.msg, "response_format: no token table");
    }
    if (bad) {
        atomic_fetch_sub(&s->n_live, 1);
        unref(j);
        return srv_fail(e, 500, "", "output setup: %s", ie.msg);
    }
    j->refs = 2;
    j->t_submit = tern_time_s();

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
    r.speculative_k = j->p.speculative_k;
    r.on_event = on_event;
    r.ctx = j;
    if (j->jm) { r.mask = job_mask; r.mask_ctx = j; }
    tern_error err = {0};
    tern_status st = s->vt->submit(s->eng, &r, &j->id, &err);
    if (st != TERN_OK) {
        j->refs = 1;
        atomic_fetch_sub(&s->n_live, 1);
        unref(j);
        /* EINVAL: a bad value; ENOMEM at submit: the prompt can never fit in the KV pool */
        srv_fail(e, st == TERN_EINVAL || st == TERN_ENOMEM ? 400 : 500, "", "%s", err.msg[0] ? err.msg : tern_status_str(st));
        if (st == TERN_ENOMEM) e->code = "context_length_exceeded";
        return -1;
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

static int append(char **b, size_t *len, size_t *cap, const char *t, size_t n) {
    if (!n) return 1;
    if (!grow(b, cap, *len + n + 1)) return 0;
    memcpy(*b + *len, t, n);
    *len += n;
    (*b)[*len] = 0;
    return 1;
}

/* Content -> stop matcher -> this piece's text. */
static int put_content(srv_job *j, const char *t, size_t n, int at_end) {
    if (j->text_done) return 1;
    if (!j->stop) return append(&j->out, &j->out_len, &j->out_cap, t, n);
    const char *o;
    size_t ol;
    int r = tern_stop_feed(j->stop, t, n, &o, &ol);
    if (r < 0) return 0;
    if (!append(&j->out, &j->out_len, &j->out_cap, o, ol)) return 0;
    if (r == 1) {
        j->text_done = 1;
        j->res.end = SRV_END_STOP_STRING;
        j->res.stop_index = tern_stop_which(j->stop);
        pthread_mutex_lock(&j->mu);
        j->want_stop = 1;
        pthread_mutex_unlock(&j->mu);
        return 1;
    }
    if (at_end) {
        tern_stop_flush(j->stop, &o, &ol);
        return append(&j->out, &j->out_len, &j->out_cap, o, ol);
    }
    return 1;
}

static int note_calls(srv_job *j, size_t n_calls) {
    while (j->n_call_ids < (int)n_calls) {
        char (*v)[40] = realloc(j->call_ids, sizeof *v * (size_t)(j->n_call_ids + 1));
        if (!v) return 0;
        j->call_ids = v;
        srv_make_id(j->s, "call_", v[j->n_call_ids], sizeof v[0]);
        j->n_call_ids++;
    }
    j->res.n_calls = j->n_call_ids;
    return 1;
}

/* Decoded text -> output parser (when on) -> content / reasoning / calls. */
static int put_text(srv_job *j, const char *t, size_t n, int at_end) {
    if (j->text_done) return 1;
    if (!j->op) return put_content(j, t, n, at_end);
    tern_out_delta d;
    tern_error err = {0};
    if (tern_out_parser_feed(j->op, t, n, &d, &err)) return 0;
    if (!append(&j->rout, &j->rout_len, &j->rout_cap, d.reasoning, d.reasoning_len) ||
        !put_content(j, d.content, d.content_len, 0) || !note_calls(j, d.calls_after))
        return 0;
    if (!at_end) return 1;
    if (tern_out_parser_finish(j->op, &d, &err)) return 0;
    return append(&j->rout, &j->rout_len, &j->rout_cap, d.reasoning, d.reasoning_len) &&
           put_content(j, d.content, d.content_len, 1) && note_calls(j, d.calls_after);
}

int srv_id_text(int32_t id, char buf[SRV_ID_TEXT_MAX]) {
    return snprintf(buf, SRV_ID_TEXT_MAX, "<%d>", (int)id);
}

static int detok_step(srv_job *j, const int32_t *id, srv_error *e) {
    const char *t = NULL;
    size_t n = 0;
    tern_error err = {0};
    char idt[SRV_ID_TEXT_MAX];
    if (!j->dt) {                                /* a model without a tokenizer: "<id>" per token */
        if (id) n = (size_t)srv_id_text(*id, idt);
        return put_text(j, id ? idt : "", n, id == NULL) ? 0 : srv_fail(e, 500, "", "out of memory");
    }
    tern_status st = id ? tern_detok_step(j->dt, *id, &t, &n, &err) : tern_detok_flush(j->dt, &t, &n, &err);
    if (st) return srv_fail(e, 500, "", "detokenize: %s", err.msg);
    return put_text(j, t, n, id == NULL) ? 0 : srv_fail(e, 500, "", "out of memory");
}

const tern_tool_call *srv_job_call(const srv_job *j, int i, const char **id) {
    if (!j->op || i < 0 || i >= j->n_call_ids) return NULL;
    if (id) *id = j->call_ids[i];
    return tern_out_parser_call(j->op, (size_t)i);
}

static int take_token(srv_job *j, const srv_tokinfo *t, srv_error *e) {
    if (j->text_done) return 0;
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
    return detok_step(j, &t->id, e);
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

void srv_job_set_notify(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->notify = 1;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_client_gone(srv_job *j) {
    if (j->failed || j->done) return;
    cancel_job(j);
    j->failed = 1;
    atomic_fetch_add(&j->s->n_disconnects, 1);
}

static int job_next(srv_job *j, srv_piece *out, srv_result *res, srv_error *e, int nowait);

int srv_job_next(srv_job *j, srv_piece *out, srv_result *res, srv_error *e) { return job_next(j, out, res, e, 0); }
int srv_job_next_nowait(srv_job *j, srv_piece *out, srv_result *res, srv_error *e) { return job_next(j, out, res, e, 1); }

static int job_next(srv_job *j, srv_piece *out, srv_result *res, srv_error *e, int nowait) {
    memset(out, 0, sizeof *out);
    j->out_len = 0;
    j->rout_len = 0;
    j->n_toks = 0;
    j->call_lo = j->n_call_ids;
    if (j->failed) return srv_fail(e, 500, "", "request already failed");
    if (j->done) { *res = j->res; return 0; }
    for (;;) {
        double now = tern_time_s();
        if (now - j->t_check >= 0.05) {          /* also while tokens keep coming */
            j->t_check = now;
            if (check_gone(j, e)) return -1;
        }
        if (j->rpos == j->rlen) {                /* take everything queued: swap the buffers */
            pthread_mutex_lock(&j->mu);
            if (nowait && j->qlen == 0) {
                pthread_mutex_unlock(&j->mu);
                if (j->out_len || j->rout_len || j->n_call_ids > j->call_lo || j->n_toks) break;   /* a piece */
                return 2;
            }
            while (j->qlen == 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                j->waiting = 1;
                pthread_cond_timedwait(&j->cv, &j->mu, &ts);
                j->waiting = 0;
                if (j->qlen) break;
                pthread_mutex_unlock(&j->mu);
                j->t_check = tern_time_s();
                if (check_gone(j, e)) return -1;
                pthread_mutex_lock(&j->mu);
            }
            chan_ev *t = j->rq;
            int tc = j->rcap;
            j->rq = j->q;
            j->rcap = j->qcap;
            j->rlen = j->qlen;
            j->q = t;
            j->qcap = tc;
            j->qlen = 0;
            pthread_mutex_unlock(&j->mu);
            j->rpos = 0;
        }
        while (j->rpos < j->rlen && !j->done) {
            chan_ev *c = &j->rq[j->rpos++];
            if (c->kind == TERN_EV_TOKEN) {
                if (take_token(j, &c->t, e)) { cancel_job(j); j->failed = 1; return -1; }
            } else if (c->kind == TERN_EV_ERROR) {
                j->failed = 1;
                return srv_fail(e, 500, "", "%s", j->err_msg);
            } else {
                if (!j->text_done && detok_step(j, NULL, e)) { j->failed = 1; return -1; }
                if (!j->text_done)
                    j->res.end = c->fin == TERN_FINISH_LENGTH ? SRV_END_LENGTH
                                 : c->fin == TERN_FINISH_CANCELLED ? SRV_END_CANCELLED : SRV_END_STOP;
                j->text_done = 1;
                j->res.n_prompt = c->np ? c->np : j->n_prompt;
                j->res.n_cached = c->nc;
                j->res.n_generated = c->ng;
                j->done = 1;
            }
        }
        if (j->out_len || j->rout_len || j->n_call_ids > j->call_lo || j->n_toks || j->done) break;
    }
    out->text = j->out ? j->out : "";
    out->len = j->out_len;
    out->reasoning = j->rout ? j->rout : "";
    out->reasoning_len = j->rout_len;
    out->call_lo = j->call_lo;
    out->call_hi = j->n_call_ids;
    out->toks = j->toks;
    out->n_toks = j->n_toks;
    if (j->done && !j->out_len && !j->rout_len && out->call_hi == out->call_lo && !j->n_toks) { *res = j->res; return 0; }
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
    if (!s->vt->tokenizer || !s->vt->tokenizer(s->eng)) {
        char b[SRV_ID_TEXT_MAX];
        srv_id_text(id, b);
        return strdup(b);
    }
    if (s->vt->detokenize(s->eng, &id, 1, &t, &err) != TERN_OK) return strdup("");
    return t;
}
