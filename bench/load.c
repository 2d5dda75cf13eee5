/*
 * load.c — our load generator for `tern serve`: closed-loop clients on loopback (or any base
 * URL), and the same requests driven straight into the engine for the server-overhead figure.
 *
 *   build/load --url http://127.0.0.1:8080 [--direct MODEL] [--conc 1,4,16,64] [--requests N]
 *              [--prompt-tokens 128] [--max-tokens 64] [--threads N] [--device cpu|cuda|auto]
 *              [--max-concurrency N] [--csv FILE]
 *
 * Every request is the same shape on both paths: a prompt of --prompt-tokens token ids (a
 * fixed pseudo-random sequence per request index, so both paths see identical work), greedy,
 * ignore_eos, exactly --max-tokens new tokens. Server path: POST /v1/completions with the ids
 * as the prompt, stream: true (SSE over one keep-alive connection per client; a chunk's
 * arrival time is its token's time, usage gives the exact count). Direct path (--direct MODEL,
 * same engine flags as the server): tern_engine_open in this process, one engine thread
 * (tern_engine_run) and the same client threads submitting and waiting on their callbacks.
 * For each concurrency level C, C clients run until the level's requests are done (default
 * max(4 C, 16)); reported: TTFT p50/p99, inter-token latency p50/p99, aggregate generated
 * tokens/s, error rate, with --direct the overhead 1 - server tok/s / direct tok/s, the
 * engine thread's CPU time per generated token (eng_us; server: from its /metrics) and the
 * whole server process's CPU time per generated token (srv_us: HTTP threads, SSE writer,
 * engine; /metrics process_cpu_seconds_total).
 * A model without a tokenizer (random:PRESET) works too: the server streams "<id>" per token.
 * Both paths time text, not tokens: TTFT is the arrival of the first token that made text
 * appear (a server sends nothing for a token that ends inside a UTF-8 sequence; random
 * weights produce many), ITL the gaps between such arrivals; the direct path runs the same
 * streaming detokenizer over its tokens afterwards to find them.
 * Build: bench/load.sh (it also starts a server and runs both paths on the CPU).
 */
#include "tern.h"
#include "runtime/engine_int.h"
#include "text/detok.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- settings and results ---- */
typedef struct cfg {
    char host[256], port[16];
    int prompt_tokens, max_tokens, n_vocab, requests;
} cfg;

typedef struct res {                  /* one level */
    pthread_mutex_t mu;
    double *ttft, *itl;
    int n_ttft, n_itl, cap_itl;
    long long tokens;
    int errors, done;
    char first_err[200];
} res;

static void res_init(res *r, int n) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->ttft = calloc((size_t)n, sizeof(double));
    r->cap_itl = 1024;
    r->itl = malloc(sizeof(double) * (size_t)r->cap_itl);
}
static void res_free(res *r) { free(r->ttft); free(r->itl); pthread_mutex_destroy(&r->mu); }

/* A finished request: ttft, its inter-token gaps, tokens; err != NULL marks a failure. */
static void res_add(res *r, double ttft, const double *gaps, int n_gaps, int tokens, const char *err) {
    pthread_mutex_lock(&r->mu);
    r->done++;
    if (err) {
        if (!r->errors++) snprintf(r->first_err, sizeof r->first_err, "%.190s", err);
    } else {
        r->ttft[r->n_ttft++] = ttft;
        r->tokens += tokens;
        if (r->n_itl + n_gaps > r->cap_itl) {
            while (r->n_itl + n_gaps > r->cap_itl) r->cap_itl *= 2;
            r->itl = realloc(r->itl, sizeof(double) * (size_t)r->cap_itl);
        }
        memcpy(r->itl + r->n_itl, gaps, sizeof(double) * (size_t)n_gaps);
        r->n_itl += n_gaps;
    }
    pthread_mutex_unlock(&r->mu);
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct(double *v, int n, double p) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmpd);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* Prompt of request i: ids in [16, n_vocab) from a fixed LCG (both paths build the same). */
static void make_prompt(const cfg *c, int i, int32_t *ids) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    int span = c->n_vocab > 32 ? c->n_vocab - 16 : 16;
    for (int k = 0; k < c->prompt_tokens; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[k] = 16 + (int32_t)((x >> 33) % (uint64_t)span);
    }
}

/* ---- server path: HTTP/1.1 over a keep-alive socket ---- */
typedef struct conn { int fd; char buf[65536]; size_t len, off; char *ev; size_t evcap; } conn;

static int conn_open(conn *k, const cfg *c) {
    struct addrinfo h = {0}, *ai = NULL;
    h.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(c->host, c->port, &h, &ai)) return -1;
    k->fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (k->fd < 0 || connect(k->fd, ai->ai_addr, ai->ai_addrlen)) {
        if (k->fd >= 0) close(k->fd);
        freeaddrinfo(ai);
        return k->fd = -1;
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    k->len = k->off = 0;
    return 0;
}

/* Next line (without CRLF) into out; -1 on EOF/error. */
static int read_line(conn *k, char *out, size_t cap) {
    size_t n = 0;
    for (;;) {
        while (k->off < k->len) {
            char ch = k->buf[k->off++];
            if (ch == '\n') { if (n && out[n - 1] == '\r') n--; out[n] = 0; return (int)n; }
            if (n + 1 < cap) out[n++] = ch;
        }
        ssize_t r = recv(k->fd, k->buf, sizeof k->buf, 0);
        if (r <= 0) return -1;
        k->len = (size_t)r;
        k->off = 0;
    }
}

static int read_n(conn *k, char *out, size_t n) {
    size_t got = 0;
    while (got < n) {
        if (k->off < k->len) {
            size_t m = k->len - k->off < n - got ? k->len - k->off : n - got;
            memcpy(out + got, k->buf + k->off, m);
            k->off += m;
            got += m;
            continue;
        }
        ssize_t r = recv(k->fd, k->buf, sizeof k->buf, 0);
        if (r <= 0) return -1;
        k->len = (size_t)r;
        k->off = 0;
    }
    return 0;
}

typedef struct level_ctx {
    const cfg *c;
    res *r;
    atomic_int next;
    const char *direct_model;
    tern_engine *eng;
} level_ctx;

/* One streamed request on connection k. Returns 0, or -1 with why filled (connection reset). */
static int http_one(level_ctx *L, conn *k, int idx, double *gaps, char *why, size_t wn) {
    const cfg *c = L->c;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)c->prompt_tokens);
    make_prompt(c, idx, ids);
    size_t cap = (size_t)c->prompt_tokens * 8 + 512, n = 0;
    char *body = malloc(cap);
    n += (size_t)snprintf(body + n, cap - n, "{\"prompt\":[");
    for (int i = 0; i < c->prompt_tokens; i++) n += (size_t)snprintf(body + n, cap - n, i ? ",%d" : "%d", ids[i]);
    n += (size_t)snprintf(body + n, cap - n, "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true}}", c->max_tokens);
    free(ids);
    char head[512];
    int hn = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", c->host, c->port, n);
    double t0 = now_s();
    if (send(k->fd, head, (size_t)hn, MSG_NOSIGNAL) != hn || send(k->fd, body, n, MSG_NOSIGNAL) != (ssize_t)n) {
        free(body);
        snprintf(why, wn, "send failed");
        return -1;
    }
    free(body);
    char line[8192];
    int status = 0, chunked = 0;
    long clen = -1;
    if (read_line(k, line, sizeof line) < 0) { snprintf(why, wn, "no response"); return -1; }
    sscanf(line, "HTTP/1.%*d %d", &status);
    while (read_line(k, line, sizeof line) > 0) {
        if (!strncasecmp(line, "transfer-encoding:", 18) && strstr(line, "chunked")) chunked = 1;
        if (!strncasecmp(line, "content-length:", 15)) clen = atol(line + 15);
    }
    if (!chunked) {                            /* an error object */
        char *b = calloc(1, clen > 0 ? (size_t)clen + 1 : 1);
        if (clen > 0 && read_n(k, b, (size_t)clen)) { free(b); snprintf(why, wn, "short body"); return -1; }
        char msg[200];
        snprintf(msg, sizeof msg, "HTTP %d: %.150s", status, b);
        free(b);
        res_add(L->r, 0, NULL, 0, 0, msg);
        return 0;
    }
    /* chunked SSE: "data: {...}" events; an event whose "text" is not empty is a token
     * arrival. Scanned, not parsed (the client must cost far less than the server it
     * measures): the server writes "text":"..." and "completion_tokens":N itself. */
    double t_first = 0, t_last = 0;
    int ng = 0, usage_tokens = -1, events = 0;
    size_t evn = 0;
    for (;;) {
        if (read_line(k, line, sizeof line) < 0) { snprintf(why, wn, "stream cut"); return -1; }
        long sz = strtol(line, NULL, 16);
        if (sz == 0) { read_line(k, line, sizeof line); break; }
        if (k->evcap < evn + (size_t)sz + 3) {
            k->evcap = (evn + (size_t)sz + 3) * 2;
            k->ev = realloc(k->ev, k->evcap);
        }
        if (read_n(k, k->ev + evn, (size_t)sz + 2)) { snprintf(why, wn, "stream cut"); return -1; }
        evn += (size_t)sz;                       /* drop the chunk's CRLF */
        k->ev[evn] = 0;
        char *ev = k->ev, *p;
        while ((p = strstr(ev, "\n\n"))) {     /* complete events */
            *p = 0;
            if (!strncmp(ev, "data: ", 6) && strcmp(ev + 6, "[DONE]")) {
                const char *u = strstr(ev, "\"completion_tokens\":");
                if (u) usage_tokens = atoi(u + 20);
                const char *tx = strstr(ev, "\"text\":\"");
                if (tx && tx[8] != '"') {
                    double t = now_s();
                    if (!events++) t_first = t;
                    else if (ng < c->max_tokens * 2) gaps[ng++] = t - t_last;
                    t_last = t;
                }
            }
            ev = p + 2;
        }
        evn -= (size_t)(ev - k->ev);
        memmove(k->ev, ev, evn + 1);
    }
    if (status != 200 || !events) { res_add(L->r, 0, NULL, 0, 0, "stream without tokens"); return 0; }
    res_add(L->r, t_first - t0, gaps, ng, usage_tokens >= 0 ? usage_tokens : events, NULL);
    return 0;
}

static void *http_client(void *arg) {
    level_ctx *L = arg;
    conn k = {.fd = -1};
    double *gaps = malloc(sizeof(double) * (size_t)(L->c->max_tokens * 2 + 4));
    for (;;) {
        int i = atomic_fetch_add(&L->next, 1);
        if (i >= L->c->requests) break;
        char why[128];
        for (int attempt = 0; attempt < 2; attempt++) {        /* one reconnect: the server may close idle sockets */
            if (k.fd < 0 && conn_open(&k, L->c)) { snprintf(why, sizeof why, "connect failed"); continue; }
            if (!http_one(L, &k, i, gaps, why, sizeof why)) { why[0] = 0; break; }
            close(k.fd);
            k.fd = -1;
        }
        if (why[0]) res_add(L->r, 0, NULL, 0, 0, why);
    }
    if (k.fd >= 0) close(k.fd);
    free(k.ev);
    free(gaps);
    return NULL;
}

/* ---- direct path: the engine in this process ---- */
/* The callback (engine thread) only records each token's id and arrival time. Afterwards
 * the client thread runs the streaming detokenizer over the ids, so that TTFT and ITL count
 * the tokens that made text appear, as the server path does (a token that ends inside a
 * UTF-8 sequence, common with random weights, shows up only with a later one). */
typedef struct dreq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, n, events, cap;
    int32_t *ids;
    double *t;
    char err[200];
} dreq;

static int on_ev(void *ctx, const tern_event *ev) {
    dreq *d = ctx;
    if (ev->kind == TERN_EV_TOKEN) {             /* nothing else touches these until done */
        if (d->events < d->cap) {
            d->ids[d->events] = ev->token;
            d->t[d->events] = now_s();
        }
        d->events++;
        return 0;
    }
    pthread_mutex_lock(&d->mu);
    if (ev->kind == TERN_EV_ERROR) snprintf(d->err, sizeof d->err, "%.190s", ev->err ? ev->err->msg : "error");
    d->n = ev->n_generated;
    d->done = 1;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* Arrival times of the text-producing tokens -> first (TTFT) and gaps; returns the gap count. */
static int text_times(tern_detok *dt, const dreq *d, double t0, double *ttft, double *gaps, int max_gaps) {
    int n = d->events < d->cap ? d->events : d->cap, ng = 0, seen = 0;
    double last = 0;
    *ttft = n ? d->t[0] - t0 : 0;
    if (dt) tern_detok_reset(dt);
    for (int i = 0; i < n; i++) {
        const char *tx = NULL;
        size_t len = 1;                          /* no tokenizer: every token counts */
        tern_error err = {0};
        if (dt && tern_detok_step(dt, d->ids[i], &tx, &len, &err)) len = 1;
        if (!len) continue;
        if (!seen++) *ttft = d->t[i] - t0;
        else if (ng < max_gaps) gaps[ng++] = d->t[i] - last;
        last = d->t[i];
    }
    const char *tx = NULL;                       /* held-back text comes out at the end */
    size_t len = 0;
    tern_error err = {0};
    if (dt && n && !tern_detok_flush(dt, &tx, &len, &err) && len) {
        if (!seen++) *ttft = d->t[n - 1] - t0;
        else if (ng < max_gaps && d->t[n - 1] > last) gaps[ng++] = d->t[n - 1] - last;
    }
    return ng;
}

static void *direct_client(void *arg) {
    level_ctx *L = arg;
    const cfg *c = L->c;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)c->prompt_tokens);
    dreq d;
    d.cap = c->max_tokens + 4;
    d.ids = malloc(sizeof(int32_t) * (size_t)d.cap);
    d.t = malloc(sizeof(double) * (size_t)d.cap);
    double *gaps = malloc(sizeof(double) * (size_t)d.cap);
    tern_detok *dt = NULL;
    const tern_tokenizer *tok = tern__engine_tokenizer(L->eng);
    tern_error derr = {0};
    if (tok && tern_detok_new(&dt, tok, 0, &derr)) dt = NULL;
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cv, NULL);
    for (;;) {
        int i = atomic_fetch_add(&L->next, 1);
        if (i >= c->requests) break;
        make_prompt(c, i, ids);
        d.done = d.n = d.events = 0;
        d.err[0] = 0;
        tern_request r = tern_request_default();
        r.prompt = ids;
        r.n_prompt = c->prompt_tokens;
        r.max_tokens = c->max_tokens;
        r.sampling.temperature = 0;
        r.ignore_eos = 1;
        r.on_event = on_ev;
        r.ctx = &d;
        tern_error err = {0};
        double t0 = now_s();
        if (tern_engine_submit(L->eng, &r, NULL, &err)) { res_add(L->r, 0, NULL, 0, 0, err.msg); continue; }
        pthread_mutex_lock(&d.mu);
        while (!d.done) pthread_cond_wait(&d.cv, &d.mu);
        pthread_mutex_unlock(&d.mu);
        if (d.err[0] || !d.events) { res_add(L->r, 0, NULL, 0, 0, d.err[0] ? d.err : "no tokens"); continue; }
        double ttft;
        int ng = text_times(dt, &d, t0, &ttft, gaps, d.cap);
        res_add(L->r, ttft, gaps, ng, d.n, NULL);
    }
    tern_detok_free(dt);
    pthread_mutex_destroy(&d.mu);
    pthread_cond_destroy(&d.cv);
    free(d.ids);
    free(d.t);
    free(gaps);
    free(ids);
    return NULL;
}

static void *engine_thread(void *e) { tern_engine_run(e); return NULL; }

/* ---- engine-thread CPU time ---- */
/* On a machine with spare cores the engine thread is the bottleneck, so its CPU time per
 * generated token, server minus direct, is the server's cost that shows up as lost
 * throughput there (on a 2-core box the HTTP side's own CPU counts too). Server: the
 * tern_engine_thread_cpu_seconds_total line of GET /metrics; direct: the thread's clock. */
static double metrics_engine_cpu(const cfg *c, double *proc) {
    conn k = {.fd = -1};
    *proc = -1;
    if (conn_open(&k, c)) return -1;
    char req[300];
    int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", c->host, c->port);
    double v = -1;
    if (send(k.fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
        char line[1024];
        while (read_line(&k, line, sizeof line) >= 0)
            if (!strncmp(line, "tern_engine_thread_cpu_seconds_total ", 37)) v = atof(line + 37);
            else if (!strncmp(line, "process_cpu_seconds_total ", 26)) *proc = atof(line + 26);
    }
    close(k.fd);
    return v;
}

static double thread_cpu(pthread_t t) {
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(t, &cid) || clock_gettime(cid, &ts)) return -1;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- driver ---- */
typedef struct row { double ttft50, ttft99, itl50, itl99, tps, err_rate, wall, eng_us, srv_us; } row;

static row run_level(const cfg *c, int conc, tern_engine *eng, pthread_t et) {
    res r;
    res_init(&r, c->requests);
    level_ctx L = {.c = c, .r = &r, .eng = eng};
    atomic_init(&L.next, 0);
    pthread_t *th = malloc(sizeof(pthread_t) * (size_t)conc);
    double p0 = -1, p1 = -1;
    double cpu0 = eng ? thread_cpu(et) : metrics_engine_cpu(c, &p0);
    double t0 = now_s();
    for (int i = 0; i < conc; i++) pthread_create(&th[i], NULL, eng ? direct_client : http_client, &L);
    for (int i = 0; i < conc; i++) pthread_join(th[i], NULL);
    double wall = now_s() - t0;
    double cpu1 = eng ? thread_cpu(et) : metrics_engine_cpu(c, &p1);
    free(th);
    row w = {.ttft50 = pct(r.ttft, r.n_ttft, 0.5), .ttft99 = pct(r.ttft, r.n_ttft, 0.99), .itl50 = pct(r.itl, r.n_itl, 0.5),
             .itl99 = pct(r.itl, r.n_itl, 0.99), .tps = wall > 0 ? (double)r.tokens / wall : 0,
             .err_rate = r.done ? (double)r.errors / r.done : 0, .wall = wall,
             .eng_us = cpu0 >= 0 && cpu1 >= 0 && r.tokens ? (cpu1 - cpu0) * 1e6 / (double)r.tokens : -1,
             .srv_us = p0 >= 0 && p1 >= 0 && r.tokens ? (p1 - p0) * 1e6 / (double)r.tokens : -1};
    if (r.errors) fprintf(stderr, "load: %d of %d requests failed; first: %s\n", r.errors, r.done, r.first_err);
    res_free(&r);
    return w;
}

static int usage(void) {
    fprintf(stderr, "usage: load --url http://HOST:PORT [--direct MODEL] [--conc 1,4,16,64] [--requests N] "
                    "[--prompt-tokens N] [--max-tokens N] [--threads N] [--device D] [--max-concurrency N] [--max-ctx N] "
                    "[--compute f32|bf16] [--kv-quant SPEC] [--csv FILE]\n");
    return 2;
}

int main(int argc, char **argv) {
    cfg c = {.prompt_tokens = 128, .max_tokens = 64, .n_vocab = 0};
    const char *url = NULL, *direct = NULL, *conc_s = "1,4,16,64", *csv = NULL;
    int requests = 0;
    tern_engine_opts eo = tern_engine_default_opts();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (!strcmp(a, "--url")) url = v;
        else if (!strcmp(a, "--direct")) direct = v;
        else if (!strcmp(a, "--conc")) conc_s = v;
        else if (!strcmp(a, "--requests")) requests = atoi(v);
        else if (!strcmp(a, "--prompt-tokens")) c.prompt_tokens = atoi(v);
        else if (!strcmp(a, "--max-tokens")) c.max_tokens = atoi(v);
        else if (!strcmp(a, "--threads")) eo.n_threads = atoi(v);
        else if (!strcmp(a, "--device")) eo.device = v;
        else if (!strcmp(a, "--max-concurrency")) eo.max_concurrency = atoi(v);
        else if (!strcmp(a, "--max-ctx")) eo.max_ctx = atoi(v);
        else if (!strcmp(a, "--compute")) eo.compute_bf16 = !strcmp(v, "bf16x2") ? 2 : !strcmp(v, "bf16");
        else if (!strcmp(a, "--kv-quant")) eo.kv_quant = v;
        else if (!strcmp(a, "--csv")) csv = v;
        else return usage();
        i++;
    }
    if (!url && !direct) return usage();
    if (c.prompt_tokens < 1 || c.max_tokens < 1) return usage();
    if (url) {
        const char *h = strstr(url, "://");
        h = h ? h + 3 : url;
        const char *colon = strrchr(h, ':');
        size_t hl = colon ? (size_t)(colon - h) : strcspn(h, "/");
        snprintf(c.host, sizeof c.host, "%.*s", (int)hl, h);
        snprintf(c.port, sizeof c.port, "%.*s", colon ? (int)strcspn(colon + 1, "/") : 2, colon ? colon + 1 : "80");
    }
    tern_engine *eng = NULL;
    pthread_t et = pthread_self();
    if (direct) {
        eo.model = direct;
        tern_error err = {0};
        if (tern_engine_open(&eng, &eo, &err)) { fprintf(stderr, "load: %s\n", err.msg); return 1; }
        tern_model_info mi;
        tern_engine_model_info(eng, &mi);
        c.n_vocab = mi.n_vocab;
        pthread_create(&et, NULL, engine_thread, eng);
    }
    if (!c.n_vocab) c.n_vocab = 256;        /* server only: ids below 256 exist in every vocabulary */
    FILE *cf = csv ? fopen(csv, "w") : NULL;
    if (cf) fprintf(cf, "path,concurrency,requests,prompt_tokens,max_tokens,ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,tok_s,error_rate,"
                        "engine_cpu_us_per_tok,server_cpu_us_per_tok\n");
    printf("%-7s %5s %6s %10s %10s %9s %9s %10s %7s %9s %8s %8s\n", "path", "conc", "reqs", "ttft_p50", "ttft_p99", "itl_p50",
           "itl_p99", "tok/s", "errors", "overhead", "eng_us", "srv_us");
    char *list = strdup(conc_s);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int conc = atoi(tok);
        if (conc < 1) continue;
        c.requests = requests > 0 ? requests : conc * 4 > 16 ? conc * 4 : 16;
        row rs = {0}, rd = {0};
        if (url) rs = run_level(&c, conc, NULL, et);
        if (eng) rd = run_level(&c, conc, eng, et);
        for (int p = 0; p < 2; p++) {
            if ((p == 0 && !url) || (p == 1 && !eng)) continue;
            row *w = p ? &rd : &rs;
            char ov[32] = "";
            if (!p && eng && rd.tps > 0) snprintf(ov, sizeof ov, "%+.1f%%", 100.0 * (1.0 - rs.tps / rd.tps));
            char eu[32] = "-";
            if (w->eng_us >= 0) snprintf(eu, sizeof eu, "%.1f", w->eng_us);
            char su[32] = "-";
            if (w->srv_us >= 0) snprintf(su, sizeof su, "%.1f", w->srv_us);
            printf("%-7s %5d %6d %8.1fms %8.1fms %7.2fms %7.2fms %10.1f %6.1f%% %9s %8s %8s\n", p ? "direct" : "server", conc,
                   c.requests, w->ttft50 * 1e3, w->ttft99 * 1e3, w->itl50 * 1e3, w->itl99 * 1e3, w->tps,
                   100 * w->err_rate, ov, eu, su);
            if (cf) fprintf(cf, "%s,%d,%d,%d,%d,%.3f,%.3f,%.4f,%.4f,%.2f,%.4f,%.2f,%.2f\n", p ? "direct" : "server", conc, c.requests,
                            c.prompt_tokens, c.max_tokens, w->ttft50 * 1e3, w->ttft99 * 1e3, w->itl50 * 1e3,
                            w->itl99 * 1e3, w->tps, w->err_rate, w->eng_us, p ? -1.0 : w->srv_us);
        }
        fflush(stdout);
    }
    free(list);
    if (cf) fclose(cf);
    if (eng) {
        tern_engine_stop(eng);
        pthread_join(et, NULL);
        tern_engine_close(eng);
    }
    return 0;
}
