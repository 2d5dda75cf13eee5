/*
 * sse.c — Server-Sent Events responses driven by a job (srv.h), and the stream writer.
 *
 * The response is created with MHD_create_response_from_callback and an unknown size, so
 * MHD sends it with chunked transfer encoding; its content callback runs on the connection's
 * own thread (thread-per-connection mode). Each piece of a job is formatted by the API family
 * (start / piece / end / error) straight into one reusable buffer (srv_sse_begin/end around
 * the JSON writer, no per-token allocation once it has grown).
 *
 * The stream writer (one thread, when it started): the first content callback of a stream
 * hands the socket to the writer and waits; the writer formats and sends (chunk framing of
 * its own, non-blocking sends, epoll for sockets that are full or closed) the events of all
 * writer-owned streams, woken at most once per engine step (srv_writer_kick from the engine
 * thread) instead of once per stream per step: at high concurrency the per-stream thread
 * wake-ups and context switches were most of the server's CPU per token. When the job ends
 * the writer gives the stream back and the callback returns end-of-stream, so MHD writes the
 * last chunk and keeps the connection alive. MHD does not touch the socket meanwhile: its
 * only thread for the connection is the one waiting in our callback, and the headers have
 * been sent before the first callback. A client that goes away is seen by epoll (RDHUP,
 * errors) or by the job's periodic check; the job is cancelled and the callback returns an
 * error so MHD closes the connection. Many-core machines get up to 4 writer shards (streams
 * round-robin). Without the writer (it could not start) and for HTTP/1.0 clients (no chunked
 * encoding) each callback blocks in srv_job_next and returns each piece to MHD itself.
 */
#include "server/srv.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

enum { W_NONE = 0, W_OWNED = 1, W_DONE = 2, W_GONE = 3 };

typedef struct sse {
    tern_server *s;
    srv_job *job;
    const srv_stream_fmt *f;
    void *ctx;
    tern_jw out;
    size_t sent;
    int started, finished;
    int fd;                      /* client socket (-1: unknown: no writer) */
    /* writer state: wstate under the writer's mu, the rest writer thread only */
    int wstate;
    pthread_cond_t cv;           /* the HTTP thread waits here until wstate leaves W_OWNED */
    char *wb;                    /* framed bytes not yet sent */
    size_t wlen, wsent, wcap;
    int want_out, can_write;     /* EPOLLOUT registered / reported since the last send */
    int gone;                    /* the socket failed or closed */
    double t_blocked;            /* when sends started to block */
} sse;

typedef struct wshard {
    pthread_mutex_t mu;
    int efd, ep;                 /* eventfd (kicks), epoll (sockets + efd) */
    sse **add;                   /* handed over, not yet taken (under mu) */
    int n_add, cap_add;
    int signaled, stop;          /* under mu */
    sse **own;                   /* writer thread only */
    int n_own, cap_own;
    atomic_int active;           /* streams handed to this shard and not yet given back */
    int ok;                      /* thread started */
    pthread_t th;
} wshard;

/* Streams are spread over a few shards (one thread each) so that on a many-core machine the
 * sends (on loopback they also run the receiver's TCP path) do not all queue on one core. */
#define MAX_SHARDS 4
typedef struct srv_writer {
    wshard sh[MAX_SHARDS];
    int n;
    atomic_uint next;            /* round-robin shard of the next stream */
    int sndbuf;                  /* TERN_SSE_SNDBUF: tests shrink the send buffer to reach EAGAIN */
} srv_writer;

void srv_sse_data(tern_jw *out, const char *event, const char *json, size_t n) {
    if (event) {
        tern_jw_text(out, "event: ", 7);
        tern_jw_text(out, event, strlen(event));
        tern_jw_text(out, "\n", 1);
    }
    tern_jw_text(out, "data: ", 6);
    tern_jw_text(out, json, n);
    tern_jw_text(out, "\n\n", 2);
}

void srv_sse_begin(tern_jw *out, const char *event) {
    if (event) {
        tern_jw_text(out, "event: ", 7);
        tern_jw_text(out, event, strlen(event));
        tern_jw_text(out, "\n", 1);
    }
    tern_jw_text(out, "data: ", 6);
}

void srv_sse_end(tern_jw *out) { tern_jw_text(out, "\n\n", 2); }

void srv_sse_value(tern_jw *out, const char *event, tern_jw *v) {
    size_t n;
    char *j = tern_jw_take(v, &n);
    if (!j) { out->oom = 1; return; }
    srv_sse_data(out, event, j, n);
    free(j);
}

void srv_sse_openai_error(tern_jw *out, const srv_error *e) {
    tern_jw w;
    tern_jw_init(&w);
    srv_jw_openai_error(&w, e);
    srv_sse_value(out, NULL, &w);
    srv_sse_done(out);
}

void srv_sse_done(tern_jw *out) { tern_jw_text(out, "data: [DONE]\n\n", 14); }

/* ---- the stream writer ---- */

static void kick_shard(wshard *w) {
    pthread_mutex_lock(&w->mu);
    int sig = !w->signaled;
    w->signaled = 1;
    pthread_mutex_unlock(&w->mu);
    if (sig) {
        uint64_t one = 1;
        ssize_t r = write(w->efd, &one, sizeof one);
        (void)r;                                 /* a full counter still wakes the writer */
    }
}

void srv_writer_kick(tern_server *s) {
    srv_writer *wr = s ? s->writer : NULL;
    if (!wr) return;
    for (int i = 0; i < wr->n; i++)
        if (atomic_load(&wr->sh[i].active)) kick_shard(&wr->sh[i]);
}

static int grow_list(sse ***v, int *cap, int n) {
    if (n < *cap) return 1;
    int nc = *cap ? *cap * 2 : 64;
    sse **nv = realloc(*v, sizeof *nv * (size_t)nc);
    if (!nv) return 0;
    *v = nv;
    *cap = nc;
    return 1;
}

static void watch(wshard *w, sse *x, int op, int out) {
    struct epoll_event ev = {.events = EPOLLRDHUP | (out ? EPOLLOUT : 0), .data.ptr = x};
    if (epoll_ctl(w->ep, op, x->fd, &ev) && op != EPOLL_CTL_DEL) x->gone = 1;
    x->want_out = out;
}

/* Send what is framed; 1 = all sent, 0 = the socket is full (EPOLLOUT armed), -1 = failed. */
static int flush_out(wshard *w, sse *x) {
    while (x->wsent < x->wlen) {
        ssize_t n = send(x->fd, x->wb + x->wsent, x->wlen - x->wsent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) { x->wsent += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!x->want_out) watch(w, x, EPOLL_CTL_MOD, 1);
            if (!x->t_blocked) x->t_blocked = tern_time_s();
            return 0;
        }
        return -1;
    }
    x->wlen = x->wsent = 0;
    x->t_blocked = 0;
    if (x->want_out) watch(w, x, EPOLL_CTL_MOD, 0);
    return 1;
}

/* x->out (one or more SSE events) -> one HTTP chunk in x->wb. */
static int frame(sse *x) {
    size_t n = x->out.len;
    if (!n) return 1;
    size_t need = x->wlen + n + 24;
    if (need > x->wcap) {
        size_t c = x->wcap ? x->wcap : 4096;
        while (c < need) c *= 2;
        char *nb = realloc(x->wb, c);
        if (!nb) return 0;
        x->wb = nb;
        x->wcap = c;
    }
    x->wlen += (size_t)snprintf(x->wb + x->wlen, 20, "%zx\r\n", n);
    memcpy(x->wb + x->wlen, x->out.buf, n);
    x->wlen += n;
    memcpy(x->wb + x->wlen, "\r\n", 2);
    x->wlen += 2;
    tern_jw_reset(&x->out);
    return 1;
}

/* Format whatever the job has and send it. Returns W_OWNED (more to come), W_DONE, W_GONE. */
static int pump(wshard *w, sse *x) {
    tern_server *s = x->s;
    if (x->gone) { srv_job_client_gone(x->job); return W_GONE; }
    if (x->wsent < x->wlen) {                   /* a full socket: wait for EPOLLOUT */
        int stalled = atomic_load(&s->stopping) || tern_time_s() - x->t_blocked > (s->o.timeout_s > 0 ? s->o.timeout_s : 600);
        if (stalled) { srv_job_client_gone(x->job); return W_GONE; }
        if (!x->can_write) return W_OWNED;       /* no EPOLLOUT yet: do not retry the send */
        x->can_write = 0;
        int r = flush_out(w, x);
        if (r < 0) { srv_job_client_gone(x->job); return W_GONE; }
        if (!r) return W_OWNED;
    }
    tern_jw_reset(&x->out);
    if (!x->started) {
        x->started = 1;
        x->f->start(x->ctx, &x->out);
    }
    while (!x->finished) {
        srv_piece p;
        srv_result res;
        srv_error e = {0};
        int rc = srv_job_next_nowait(x->job, &p, &res, &e);
        if (rc == 2) break;
        if (rc == 1) x->f->piece(x->ctx, &p, &x->out);
        else if (rc == 0) { x->f->end(x->ctx, &res, &x->out); x->finished = 1; }
        else if (e.http == 499) return W_GONE;   /* the job saw the closed socket itself */
        else { x->f->error(x->ctx, &e, &x->out); x->finished = 1; }
    }
    if (x->out.oom || !frame(x)) { srv_job_client_gone(x->job); return W_GONE; }
    int r = flush_out(w, x);
    if (r < 0) { srv_job_client_gone(x->job); return W_GONE; }
    return r && x->finished ? W_DONE : W_OWNED;
}

static void *writer_main(void *arg) {
    wshard *w = arg;
    struct epoll_event evs[64];
    sse **ret = NULL;                            /* streams to give back after this round */
    int *ret_st = NULL, n_ret = 0, cap_ret = 0;
    for (;;) {
        int n = epoll_wait(w->ep, evs, 64, 50);  /* the timeout drives the jobs' client checks */
        pthread_mutex_lock(&w->mu);
        int stop = w->stop;
        w->signaled = 0;
        for (int i = 0; i < w->n_add; i++) {
            sse *x = w->add[i];
            if (!grow_list(&w->own, &w->cap_own, w->n_own)) {
                x->wstate = W_GONE;
                pthread_cond_signal(&x->cv);
                atomic_fetch_sub(&w->active, 1);
                continue;
            }
            w->own[w->n_own++] = x;
            watch(w, x, EPOLL_CTL_ADD, 0);
        }
        w->n_add = 0;
        pthread_mutex_unlock(&w->mu);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == w) {
                uint64_t v;
                ssize_t r = read(w->efd, &v, sizeof v);
                (void)r;
                continue;
            }
            sse *x = evs[i].data.ptr;
            if (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) x->gone = 1;
            if (evs[i].events & EPOLLOUT) x->can_write = 1;
        }
        for (int i = 0; i < w->n_own;) {        /* a round over every stream: cheap */
            sse *x = w->own[i];
            int st = pump(w, x);
            if (st == W_OWNED) { i++; continue; }
            watch(w, x, EPOLL_CTL_DEL, 0);
            w->own[i] = w->own[--w->n_own];
            if (n_ret == cap_ret) {
                int nc = cap_ret ? cap_ret * 2 : 64;
                sse **nr = realloc(ret, sizeof *nr * (size_t)nc);
                int *ns = realloc(ret_st, sizeof *ns * (size_t)nc);
                if (nr) ret = nr;
                if (ns) ret_st = ns;
                if (!nr || !ns) { i++; w->own[w->n_own++] = x; continue; }   /* retry next round */
                cap_ret = nc;
            }
            ret[n_ret] = x;
            ret_st[n_ret++] = st;
        }
        if (n_ret) {                             /* after the round: x may be freed once woken */
            pthread_mutex_lock(&w->mu);
            for (int i = 0; i < n_ret; i++) {
                ret[i]->wstate = ret_st[i];
                pthread_cond_signal(&ret[i]->cv);
                atomic_fetch_sub(&w->active, 1);
            }
            pthread_mutex_unlock(&w->mu);
            n_ret = 0;
        }
        if (stop && !w->n_own) {
            pthread_mutex_lock(&w->mu);
            int left = w->n_add;
            pthread_mutex_unlock(&w->mu);
            if (!left) break;
        }
    }
    free(ret);
    free(ret_st);
    return NULL;
}

static int shard_open(wshard *w) {
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
    if (w->efd < 0 || w->ep < 0 || epoll_ctl(w->ep, EPOLL_CTL_ADD, w->efd, &ev)) return -1;
    pthread_mutex_init(&w->mu, NULL);
    if (pthread_create(&w->th, NULL, writer_main, w)) { pthread_mutex_destroy(&w->mu); return -1; }
    w->ok = 1;
    return 0;
}

static void shard_close(wshard *w) {
    if (w->ok) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_mutex_unlock(&w->mu);
        kick_shard(w);
        pthread_join(w->th, NULL);
        pthread_mutex_destroy(&w->mu);
    }
    if (w->efd >= 0) close(w->efd);
    if (w->ep >= 0) close(w->ep);
    free(w->add);
    free(w->own);
}

int srv_writer_start(tern_server *s) {
    srv_writer *wr = calloc(1, sizeof *wr);
    if (!wr) return -1;
    const char *sb = getenv("TERN_SSE_SNDBUF");
    wr->sndbuf = sb ? atoi(sb) : 0;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int n = nc >= 8 ? (int)(nc / 8) : 1;         /* 1 shard up to 15 cores, 2 at 16, 4 from 32 */
    const char *ns = getenv("TERN_SSE_WRITERS");  /* tests / benchmarks: force the count */
    if (ns && atoi(ns) > 0) n = atoi(ns);
    wr->n = n > MAX_SHARDS ? MAX_SHARDS : n;
    for (int i = 0; i < wr->n; i++) wr->sh[i].efd = wr->sh[i].ep = -1;
    for (int i = 0; i < wr->n; i++)
        if (shard_open(&wr->sh[i])) {
            for (int k = 0; k < wr->n; k++) shard_close(&wr->sh[k]);
            free(wr);
            return -1;
        }
    s->writer = wr;
    return 0;
}

/* After MHD stopped: every stream has been given back (their HTTP threads are gone). */
void srv_writer_stop(tern_server *s) {
    srv_writer *wr = s ? s->writer : NULL;
    if (!wr) return;
    for (int i = 0; i < wr->n; i++) shard_close(&wr->sh[i]);
    s->writer = NULL;                            /* later job events (engine close) kick nothing */
    free(wr);
}

/* HTTP thread: hand the stream to the writer and wait until it gives it back. Returns
 * W_DONE / W_GONE, or W_NONE when the writer did not take it. */
static int hand_over(sse *x) {
    srv_writer *wr = x->s->writer;
    if (!wr || x->fd < 0) return W_NONE;
    wshard *w = &wr->sh[atomic_fetch_add(&wr->next, 1) % (unsigned)wr->n];
    int zero = 0, one = 1;                       /* our sends go out at once */
    setsockopt(x->fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
    setsockopt(x->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (wr->sndbuf > 0) setsockopt(x->fd, SOL_SOCKET, SO_SNDBUF, &wr->sndbuf, sizeof wr->sndbuf);
    pthread_cond_init(&x->cv, NULL);
    pthread_mutex_lock(&w->mu);
    if (w->stop || !grow_list(&w->add, &w->cap_add, w->n_add)) {
        pthread_mutex_unlock(&w->mu);
        pthread_cond_destroy(&x->cv);
        return W_NONE;
    }
    x->wstate = W_OWNED;
    w->add[w->n_add++] = x;
    atomic_fetch_add(&w->active, 1);
    pthread_mutex_unlock(&w->mu);
    srv_job_set_notify(x->job);                  /* then kick: events before it are drained too */
    kick_shard(w);
    pthread_mutex_lock(&w->mu);
    while (x->wstate == W_OWNED) pthread_cond_wait(&x->cv, &w->mu);
    int st = x->wstate;
    pthread_mutex_unlock(&w->mu);
    pthread_cond_destroy(&x->cv);
    return st;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    sse *x = cls;
    (void)pos;
    if (!x->started && x->wstate == W_NONE) {
        int st = hand_over(x);
        if (st == W_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
        if (st == W_GONE) return MHD_CONTENT_READER_END_WITH_ERROR;
        x->wstate = -1;                          /* not taken: write it ourselves */
    }
    while (x->out.len - x->sent == 0) {
        if (x->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        tern_jw_reset(&x->out);
        x->sent = 0;
        if (!x->started) {
            x->started = 1;
            x->f->start(x->ctx, &x->out);
            continue;
        }
        srv_piece p;
        srv_result res;
        srv_error e = {0};
        int rc = srv_job_next(x->job, &p, &res, &e);
        if (rc > 0) x->f->piece(x->ctx, &p, &x->out);
        else if (rc == 0) { x->f->end(x->ctx, &res, &x->out); x->finished = 1; }
        else {
            if (e.http == 499) { x->finished = 1; return MHD_CONTENT_READER_END_WITH_ERROR; } /* nobody to tell */
            x->f->error(x->ctx, &e, &x->out);
            x->finished = 1;
        }
        if (x->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = x->out.len - x->sent;
    if (n > max) n = max;
    memcpy(buf, x->out.buf + x->sent, n);
    x->sent += n;
    return (ssize_t)n;
}

static void release(void *cls) {
    sse *x = cls;
    srv_job_free(x->job);                       /* cancels the request if it still runs */
    if (x->f->free_ctx) x->f->free_ctx(x->ctx);
    tern_jw_free(&x->out);
    free(x->wb);
    free(x);
}

enum MHD_Result srv_stream(srv_req *r, srv_job *j, const srv_stream_fmt *f, void *ctx) {
    tern_server *s = r->s;
    struct MHD_Connection *c = r->conn;
    sse *x = calloc(1, sizeof *x);
    if (!x) {
        srv_job_free(j);
        if (f->free_ctx) f->free_ctx(ctx);
        return MHD_NO;
    }
    x->s = s;
    x->job = j;
    x->f = f;
    x->ctx = ctx;
    x->fd = r->http11 ? r->fd : -1;              /* HTTP/1.0: no chunks, MHD writes it itself */
    tern_jw_init(&x->out);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, x, release);
    if (!resp) { release(x); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    srv_add_common_headers(s, resp);
    atomic_fetch_add(&s->n_streams, 1);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}
