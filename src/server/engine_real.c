/*
 * engine_real.c — the engine table (srv.h) backed by the real engine of include/tern.h.
 *
 * A thin adapter (void * <-> tern_engine *) so the HTTP layer can run against either this
 * or the fake engine of fake_engine.c with the same code. A model without a tokenizer
 * (random:PRESET) detokenizes to "<ID>" per id, the text its requests stream (job.c).
 *
 * The loop is ours rather than tern_engine_run, for one reason: after every step the server
 * wakes the HTTP threads of all requests that got tokens (srv_jobs_after_step), instead of
 * one wake-up per token from inside the event callback. Idle: the loop sleeps on its own
 * condition variable until a submit (which signals it only when the loop is idle) or stop.
 * tern_engine_pending counts requests queued or running, so a submitted request is seen by
 * the next check and reaches the engine without waiting for any timer; the timed wait is a
 * safety net only (an idle server wakes a few times a second to look).
 */
#include "server/srv.h"
#include "runtime/engine_int.h"

#include <stdlib.h>
#include <time.h>

typedef struct real_eng {
    tern_engine *e;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int idle, stop;
} real_eng;

static tern_status r_open(void **out, const tern_engine_opts *o, tern_error *err) {
    *out = NULL;
    real_eng *r = calloc(1, sizeof *r);
    if (!r) return tern_err(err, TERN_ENOMEM, "serve: out of memory");
    tern_status st = tern_engine_open(&r->e, o, err);
    if (st) { free(r); return st; }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    *out = r;
    return TERN_OK;
}

static void r_close(void *p) {
    real_eng *r = p;
    if (!r) return;
    tern_engine_close(r->e);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static tern_status r_submit(void *p, const tern_request *q, uint64_t *id, tern_error *err) {
    real_eng *r = p;
    tern_status st = tern_engine_submit(r->e, q, id, err);
    if (st) return st;
    pthread_mutex_lock(&r->mu);
    if (r->idle) pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return TERN_OK;
}

static void r_cancel(void *p, uint64_t id) { tern_engine_cancel(((real_eng *)p)->e, id); }

static void r_run(void *p, void (*after_step)(void *), void *arg) {
    real_eng *r = p;
    for (;;) {
        if (tern_engine_pending(r->e) == 0) {
            pthread_mutex_lock(&r->mu);
            while (!r->stop && tern_engine_pending(r->e) == 0) {
                r->idle = 1;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 250 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            }
            r->idle = 0;
            pthread_mutex_unlock(&r->mu);
        }
        pthread_mutex_lock(&r->mu);
        int stop = r->stop;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        tern_error err = {0};
        if (tern_engine_step(r->e, &err)) tern_log(TERN_LOG_ERROR, "engine step: %s", err.msg);
        if (after_step) after_step(arg);
    }
}

static void r_stop(void *p) {
    real_eng *r = p;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    tern_engine_stop(r->e);
}

static tern_status r_tokenize(void *p, const char *t, size_t len, int add_special, int32_t **ids, int *n,
                              tern_error *err) {
    return tern_engine_tokenize(((real_eng *)p)->e, t, len, add_special, ids, n, err);
}
/* Without a tokenizer (random:PRESET models) ids read as "<ID><ID>...", as they stream (job.c). */
static tern_status r_detokenize(void *p, const int32_t *ids, int n, char **text, tern_error *err) {
    real_eng *r = p;
    if (tern__engine_tokenizer(r->e) || n < 0 || (n && !ids)) return tern_engine_detokenize(r->e, ids, n, text, err);
    char *t = malloc((size_t)n * SRV_ID_TEXT_MAX + 1);
    if (!t) return tern_err(err, TERN_ENOMEM, "detokenize: out of memory");
    size_t len = 0;
    for (int i = 0; i < n; i++) len += (size_t)srv_id_text(ids[i], t + len);
    t[len] = 0;
    *text = t;
    return TERN_OK;
}
static void r_info(const void *p, tern_model_info *info) { tern_engine_model_info(((const real_eng *)p)->e, info); }
static void r_stats(void *p, tern_engine_stats *st) { tern_engine_get_stats(((real_eng *)p)->e, st); }

static const tern_tokenizer *r_tok(void *p) { return tern__engine_tokenizer(((real_eng *)p)->e); }
static const char *r_dir(void *p) { return tern__engine_dir(((real_eng *)p)->e); }

static const srv_engine_vt k_real = {
    "engine", r_open, r_close, r_submit, r_cancel, r_run, r_stop, r_tokenize, r_detokenize, r_info, r_stats, r_tok, r_dir,
};

const srv_engine_vt *tern__srv_real_engine(void) {
    return &k_real;
}

tern_request tern__srv_request_default(void) {
    return tern_request_default();
}

tern_engine_opts tern__srv_engine_default_opts(void) {
    return tern_engine_default_opts();
}
