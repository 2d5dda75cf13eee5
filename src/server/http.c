/*
 * http.c — the HTTP side of `tern serve`: socket, libmicrohttpd daemon, routing, body
 * limits, auth, CORS, error replies, and the server's lifetime (start, load, stop).
 *
 * Threads: MHD runs one thread per connection (so a handler may block waiting for tokens,
 * and a streaming response's content callback may block too); one more thread loads the
 * model and then runs the engine loop (the vt's run, which calls srv_jobs_after_step after
 * every step); a waker thread (job.c) wakes the HTTP threads after steps with many tokens.
 * Accepted sockets have TCP_NODELAY (inherited, and MHD sets it too): one SSE event per
 * write, never held back by Nagle. The listening socket is ours (so `--port 0` can
 * report the port it got, and IPv6 hosts work); MHD gets it through MHD_OPTION_LISTEN_SOCKET.
 *
 * Per request: the body is collected up to max_body; a larger one is read and dropped and
 * answered 413 at the end (one announced as more than 64 MiB over the limit is answered
 * at once and the connection closed);
 * then auth (`Authorization: Bearer KEY` or `x-api-key: KEY`; /health stays open), routing
 * (404 unknown path, 405 wrong method, OPTIONS preflight 204), and the handler.
 * Idle connections (a slow or stuck client) are closed after timeout_s, and every response
 * says so (`Keep-Alive: timeout=N`) so keep-alive clients do not reuse a socket as it closes;
 * 429/503 carry `Retry-After`. A JSON body must be one object, nothing after it, with every
 * string and key valid UTF-8 (else 400 naming the path: plan.c).
 */
#include "server/srv.h"
#include "io/demo.h"

#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

tern_engine_opts tern__srv_engine_default_opts(void);

#define DISCARD_MAX ((unsigned long long)64 << 20)

typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    int too_large;
} conn_ctx;

tern_server_opts tern_server_default_opts(void) {
    tern_server_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.max_body = (size_t)16 << 20;
    o.timeout_s = 600;
    o.max_connections = 256;
    o.default_max_tokens = 4096;
    o.max_queue = 256;
    o.sampling = tern__srv_request_default().sampling;
    o.engine = tern__srv_engine_default_opts();
    return o;
}

void srv_add_common_headers(tern_server *s, struct MHD_Response *resp) {
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(resp, "Server", "tern");
    /* tell keep-alive clients when we close idle connections, so that they do not reuse a
     * socket at the moment the server closes it (undici subtracts a second from this) */
    char ka[32];
    snprintf(ka, sizeof ka, "timeout=%d", s->o.timeout_s);
    MHD_add_response_header(resp, "Keep-Alive", ka);
}

enum MHD_Result srv_reply(srv_req *r, int status, const char *ctype, const char *body, size_t len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    if (ctype) MHD_add_response_header(resp, "Content-Type", ctype);
    srv_add_common_headers(r->s, resp);
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (status >= 500) atomic_fetch_add(&r->s->n_http_5xx, 1);
    else if (status >= 400) atomic_fetch_add(&r->s->n_http_4xx, 1);
    srv_metrics_http(r->s, status);
    return ret;
}

enum MHD_Result srv_reply_jw(srv_req *r, int status, tern_jw *w) {
    size_t n = 0;
    char *s = tern_jw_take(w, &n);
    if (!s) return srv_reply(r, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 37);
    enum MHD_Result ret = srv_reply(r, status, "application/json", s, n);
    free(s);
    return ret;
}

static int http_status(const srv_error *e) { return e->http == 499 ? 400 : e->http ? e->http : 500; }

void srv_jw_openai_error(tern_jw *w, const srv_error *e) {
    tern_jw_obj(w);
    tern_jw_key(w, "error");
    tern_jw_obj(w);
    tern_jw_kstr(w, "message", e->msg);
    tern_jw_kstr(w, "type", e->type ? e->type : e->http >= 500 ? "server_error" : "invalid_request_error");
    if (e->param[0]) tern_jw_kstr(w, "param", e->param);
    else tern_jw_knull(w, "param");
    if (e->code) tern_jw_kstr(w, "code", e->code);
    else tern_jw_knull(w, "code");
    tern_jw_end(w);
    tern_jw_end(w);
}

enum MHD_Result srv_reply_openai_error(srv_req *r, const srv_error *e) {
    tern_jw w;
    tern_jw_init(&w);
    srv_jw_openai_error(&w, e);
    return srv_reply_jw(r, http_status(e), &w);
}

static const char *anthropic_error_type(const srv_error *e) {
    return e->http == 401 ? "authentication_error" : e->http == 404 ? "not_found_error"
           : e->http == 413 ? "request_too_large" : e->http == 429 ? "rate_limit_error"
           : e->http == 503 ? "overloaded_error"
           : e->http >= 500 ? "api_error" : "invalid_request_error";
}

void srv_write_anthropic_error(tern_jw *w, const srv_error *e) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", "error");
    tern_jw_key(w, "error");
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", anthropic_error_type(e));
    tern_jw_kstr(w, "message", e->msg);
    tern_jw_end(w);
    tern_jw_end(w);
}

enum MHD_Result srv_reply_anthropic_error(srv_req *r, const srv_error *e) {
    tern_jw w;
    tern_jw_init(&w);
    srv_write_anthropic_error(&w, e);
    return srv_reply_jw(r, http_status(e), &w);
}

int srv_parse_body(srv_req *r, cJSON **out, srv_error *e) {
    *out = NULL;
    if (!r->body || !r->body_len) return srv_fail(e, 400, "", "the request body is empty (expected a JSON object)");
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(r->body, r->body_len, &end, 0);
    if (!j) {
        size_t off = end && end >= r->body && end <= r->body + r->body_len ? (size_t)(end - r->body) : 0;
        return srv_fail(e, 400, "", "the request body is not valid JSON (error near byte %zu)", off);
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return srv_fail(e, 400, "", "the request body must be a JSON object");
    }
    for (const char *p = end; p && p < r->body + r->body_len; p++)      /* one value, then only space */
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            size_t off = (size_t)(p - r->body);
            cJSON_Delete(j);
            return srv_fail(e, 400, "", "the request body has data after the JSON object (at byte %zu)", off);
        }
    char path[128];
    if (srv_json_bad_utf8(j, path, sizeof path)) {
        cJSON_Delete(j);
        return srv_fail(e, 400, path, "%s: the string is not valid UTF-8", path);
    }
    *out = j;
    return 0;
}

int srv_wait_ready(tern_server *s, srv_error *e) {
    pthread_mutex_lock(&s->mu);
    while (s->state == SRV_LOADING && !atomic_load(&s->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    if (st == SRV_READY && !atomic_load(&s->stopping)) return 0;
    if (st == SRV_FAILED) return srv_fail(e, 503, "", "the model failed to load: %s", s->load_err.msg);
    return srv_fail(e, 503, "", "the server is shutting down");
}

int srv_check_model(tern_server *s, const cJSON *req, srv_error *e) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (!m || cJSON_IsNull(m)) return 0;
    if (!cJSON_IsString(m)) return srv_fail(e, 400, "model", "model: expected a string");
    const char *v = m->valuestring;
    if (!*v || !strcmp(v, s->served) || (s->info.name && !strcmp(v, s->info.name))) return 0;
    /* accept "org/name" when name is what we serve (clients often send the Hub id) */
    const char *slash = strrchr(v, '/');
    if (slash && !strcmp(slash + 1, s->served)) return 0;
    srv_fail(e, 404, "model", "model '%.200s' is not served here (this server serves '%s')", v, s->served);
    e->code = "model_not_found";
    return -1;
}

void srv_make_id(tern_server *s, const char *prefix, char *buf, size_t n) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(s->t_start * 1e9) ^
                 ((uint64_t)getpid() << 32);
    char r[25];
    for (int i = 0; i < 24; i++) {
        x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 29;
        r[i] = al[x % 62];
    }
    r[24] = 0;
    snprintf(buf, n, "%s%s", prefix, r);
}

static int auth_ok(tern_server *s, struct MHD_Connection *c) {
    if (!s->api_key[0]) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    const char *got = NULL;
    if (a && !strncasecmp(a, "Bearer ", 7)) got = a + 7;
    else if (x) got = x;
    if (!got) return 0;
    size_t n = strlen(s->api_key), m = strlen(got);
    unsigned diff = (unsigned)(n ^ m);                /* constant time over the key */
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)s->api_key[i] ^ (unsigned char)(i < m ? got[i] : 0);
    return diff == 0;
}

typedef enum { R_NONE, R_GET, R_POST } route_m;

static enum MHD_Result route(srv_req *r) {
    tern_server *s = r->s;
    const char *u = r->url;
    int anth = !strcmp(u, "/v1/messages") || !strcmp(u, "/v1/messages/count_tokens");
    int is_get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD");
    int is_post = !strcmp(r->method, "POST");
    srv_error e = {0};
    if (!strcmp(r->method, "OPTIONS")) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        srv_add_common_headers(s, resp);
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
        enum MHD_Result ret = MHD_queue_response(r->conn, 204, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    static const struct { const char *path; route_m m; } k_routes[] = {
        {"/health", R_GET}, {"/v1/health", R_GET}, {"/v1/models", R_GET}, {"/metrics", R_GET}, {"/stats", R_GET},
        {"/v1/chat/completions", R_POST}, {"/chat/completions", R_POST}, {"/v1/completions", R_POST},
        {"/completions", R_POST}, {"/v1/messages", R_POST}, {"/tokenize", R_POST}, {"/detokenize", R_POST},
        {"/v1/responses", R_POST}, {"/responses", R_POST}, {"/v1/embeddings", R_POST}, {"/embeddings", R_POST},
        {"/v1/messages/count_tokens", R_POST},
    };
    route_m want = R_NONE;
    for (size_t i = 0; i < TERN_ARRAY_LEN(k_routes); i++)
        if (!strcmp(u, k_routes[i].path)) want = k_routes[i].m;
    const char *model_id = NULL;
    if (!strncmp(u, "/v1/models/", 11) && u[11]) { want = R_GET; model_id = u + 11; }
    if (want == R_NONE) {
        srv_fail(&e, 404, "", "no route for %s %.200s", r->method, u);
        return anth ? srv_reply_anthropic_error(r, &e) : srv_reply_openai_error(r, &e);
    }
    if ((want == R_GET && !is_get) || (want == R_POST && !is_post)) {
        srv_fail(&e, 405, "", "method %s is not allowed on %.200s (use %s)", r->method, u,
                 want == R_GET ? "GET" : "POST");
        struct MHD_Response *resp;
        tern_jw w;
        tern_jw_init(&w);
        tern_jw_obj(&w);
        tern_jw_key(&w, "error");
        tern_jw_obj(&w);
        tern_jw_kstr(&w, "message", e.msg);
        tern_jw_kstr(&w, "type", "invalid_request_error");
        tern_jw_knull(&w, "param");
        tern_jw_knull(&w, "code");
        tern_jw_end(&w);
        tern_jw_end(&w);
        size_t n;
        char *b = tern_jw_take(&w, &n);
        resp = MHD_create_response_from_buffer(b ? n : 0, b ? b : (void *)"", MHD_RESPMEM_MUST_COPY);
        free(b);
        srv_add_common_headers(s, resp);
        MHD_add_response_header(resp, "Content-Type", "application/json");
        MHD_add_response_header(resp, "Allow", want == R_GET ? "GET, HEAD, OPTIONS" : "POST, OPTIONS");
        enum MHD_Result ret = MHD_queue_response(r->conn, 405, resp);
        MHD_destroy_response(resp);
        atomic_fetch_add(&s->n_http_4xx, 1);
        return ret;
    }
    if (strcmp(u, "/health") && strcmp(u, "/v1/health") && !auth_ok(s, r->conn)) {
        srv_fail(&e, 401, "", "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)");
        e.code = "invalid_api_key";
        return anth ? srv_reply_anthropic_error(r, &e) : srv_reply_openai_error(r, &e);
    }
    if (!strcmp(u, "/health") || !strcmp(u, "/v1/health")) return srv_handle_health(r);
    if (!strcmp(u, "/v1/models") || model_id) return srv_handle_models(r, model_id);
    if (!strcmp(u, "/metrics")) return srv_handle_metrics(r);
    if (!strcmp(u, "/stats")) return srv_handle_stats(r);
    if (!strcmp(u, "/v1/chat/completions") || !strcmp(u, "/chat/completions")) return srv_handle_chat(r);
    if (!strcmp(u, "/v1/completions") || !strcmp(u, "/completions")) return srv_handle_completions(r);
    if (!strcmp(u, "/v1/messages/count_tokens")) return srv_handle_count_tokens(r);
    if (anth) return srv_handle_messages(r);
    if (!strcmp(u, "/v1/responses") || !strcmp(u, "/responses")) return srv_handle_responses(r);
    if (!strcmp(u, "/v1/embeddings") || !strcmp(u, "/embeddings")) return srv_handle_embeddings(r);
    if (!strcmp(u, "/tokenize")) return srv_handle_tokenize(r);
    return srv_handle_detokenize(r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    tern_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        atomic_fetch_add(&s->n_http, 1);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end = NULL;
            unsigned long long v = strtoull(cl, &end, 10);
            if (end == cl || *end || v > s->o.max_body) cc->too_large = 1;
            /* beyond DISCARD_MAX answer at once and let MHD close the connection; below it,
             * read and drop the body first, so the client is not reset mid-send and sees 413 */
            if (cc->too_large && (end == cl || *end || v - s->o.max_body > DISCARD_MAX)) cc->too_large = 2;
        }
        if (cc->too_large != 2) return MHD_YES;
    }
    if (*upload_size && cc->too_large != 2) {
        if (!cc->too_large) {
            if (cc->len + *upload_size > s->o.max_body) {
                cc->too_large = 1;
                free(cc->body);
                cc->body = NULL;
                cc->len = cc->cap = 0;
            } else {
                if (cc->len + *upload_size + 1 > cc->cap) {
                    size_t nc = cc->cap ? cc->cap : 4096;
                    while (nc < cc->len + *upload_size + 1) nc *= 2;
                    char *b = realloc(cc->body, nc);
                    if (!b) return MHD_NO;
                    cc->body = b;
                    cc->cap = nc;
                }
                memcpy(cc->body + cc->len, upload, *upload_size);
                cc->len += *upload_size;
                cc->body[cc->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    srv_req r = {.s = s, .conn = conn, .url = url, .method = method, .body = cc->body, .body_len = cc->len, .fd = -1,
                 .http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1)};
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) r.fd = ci->connect_fd;
    if (cc->too_large) {
        srv_error e = {0};
        srv_fail(&e, 413, "", "request body larger than the limit of %zu bytes", s->o.max_body);
        return !strcmp(url, "/v1/messages") ? srv_reply_anthropic_error(&r, &e) : srv_reply_openai_error(&r, &e);
    }
    return route(&r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn_ctx *cc = *con_cls;
    (void)cls; (void)c; (void)toe;
    if (!cc) return;
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

static int open_listener(const char *host, int port, int *out_port, tern_error *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) return tern_err(err, TERN_EINVAL, "--host '%s': %s", host, gai_strerror(rc)), -1;
    int fd = -1;
    char why[128] = "no address";
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* accepted sockets inherit it: SSE events are small writes, and Nagle would hold each
         * one back until the client's (delayed) ACK of the previous one */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (!bind(fd, a->ai_addr, a->ai_addrlen) && !listen(fd, 128)) break;
        snprintf(why, sizeof why, "%s", strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return tern_err(err, TERN_EIO, "cannot listen on %s:%d: %s", host, port, why), -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *out_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* MHD's own messages ("closing connection" after a client left, ...) at info level. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char b[512];
    (void)cls;
    vsnprintf(b, sizeof b, fmt, ap);
    size_t n = strlen(b);
    while (n && b[n - 1] == '\n') b[--n] = 0;
    tern_log(TERN_LOG_INFO, "http: %s", b);
}

static void *engine_main(void *arg) {
    tern_server *s = arg;
    tern_error err = {0};
    void *eng = NULL;
    if (!pthread_getcpuclockid(pthread_self(), &s->engine_clock)) atomic_store(&s->has_engine_clock, 1);
    double t0 = tern_time_s();
    tern_status st = s->vt->open(&eng, &s->o.engine, &err);
    double t_opened = tern_time_s(), t_open = t_opened - t0;
    if (st == TERN_OK) {
        s->eng = eng;
        s->vt->model_info(eng, &s->info);
        /* sampling defaults: request fields, then flags, then generation_config.json */
        if (!(s->o.sampling_set & TERN_SRV_SET_TEMPERATURE) && s->info.gen_temperature >= 0)
            s->o.sampling.temperature = s->info.gen_temperature;
        if (!(s->o.sampling_set & TERN_SRV_SET_TOP_P) && s->info.gen_top_p > 0) s->o.sampling.top_p = s->info.gen_top_p;
        if (!(s->o.sampling_set & TERN_SRV_SET_TOP_K) && s->info.gen_top_k >= 0) s->o.sampling.top_k = s->info.gen_top_k;
        s->tools_fmt = TERN_TOOLS_JSON;          /* no template (fake engine, fallback format): Hermes markup */
        s->reason_fmt = TERN_REASON_THINK;
        if (!s->o.fake_engine && s->info.has_chat_template) {
            char dir[4096];
            tern_error te = {0};
            if (!tern_model_path_resolve(s->o.engine.model, dir, sizeof dir, &te) &&
                tern_chat_template_load(dir, &s->tmpl, &te))
                tern_log(TERN_LOG_WARN, "serve: chat template not loaded (%s); using the plain fallback format", te.msg);
            if (s->tmpl) tern_output_formats_detect(tern_chat_template_source(s->tmpl), &s->tools_fmt, &s->reason_fmt);
        }
        if (!s->info.has_tokenizer && !s->o.fake_engine)
            tern_log(TERN_LOG_WARN, "serve: model has no tokenizer; only token-id prompts (/v1/completions) work, and the text of each generated id is \"<ID>\"");
        snprintf(s->served, sizeof s->served, "%s", s->o.model_alias ? s->o.model_alias
                                                     : s->info.name ? s->info.name : "model");
        s->t_loaded = tern_time_s() - s->t_start;
        srv_plan_summary(s, t_open, t_opened);
    }
    pthread_mutex_lock(&s->mu);
    s->state = st == TERN_OK ? SRV_READY : SRV_FAILED;
    if (st) s->load_err = err;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (st) {
        tern_log(TERN_LOG_INFO, "serve: %s", err.msg);      /* the caller reports it */
        return NULL;
    }
    tern_log(TERN_LOG_INFO, "serve: model '%s' ready", s->served);
    s->vt->run(eng, srv_jobs_after_step, s);
    atomic_store(&s->has_engine_clock, 0);
    srv_jobs_after_step(s);                      /* wake-ups queued by a last partial step */
    return NULL;
}

tern_status tern_server_start(tern_server **out, const tern_server_opts *opts, tern_error *err) {
    *out = NULL;
    tern_server *s = calloc(1, sizeof *s);
    if (!s) return tern_err(err, TERN_ENOMEM, "serve: out of memory");
    s->o = opts ? *opts : tern_server_default_opts();
    snprintf(s->host, sizeof s->host, "%s", s->o.host ? s->o.host : "127.0.0.1");
    if (s->o.api_key) snprintf(s->api_key, sizeof s->api_key, "%s", s->o.api_key);
    s->o.host = s->host;
    s->o.api_key = NULL;
    if (!s->o.max_body) s->o.max_body = (size_t)16 << 20;
    if (s->o.timeout_s <= 0) s->o.timeout_s = 600;
    if (s->o.max_connections <= 0) s->o.max_connections = 256;
    if (s->o.default_max_tokens <= 0) s->o.default_max_tokens = 4096;
    s->vt = s->o.fake_engine ? tern__srv_fake_engine() : tern__srv_real_engine();
    if (!s->vt) { free(s); return tern_err(err, TERN_EUNSUPPORTED, "serve: this binary has no engine"); }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->vocab_mu, NULL);
    if (srv_metrics_init(s)) { free(s); return tern_err(err, TERN_ENOMEM, "serve: out of memory"); }
    s->created = (long long)time(NULL);
    s->t_start = tern_time_s();
    snprintf(s->served, sizeof s->served, "%s", s->o.model_alias ? s->o.model_alias : "loading");
    if (s->o.port < 0 || s->o.port > 65535) {
        tern_server_stop(s);
        return tern_err(err, TERN_EINVAL, "--port %d: expected 0..65535", opts->port);
    }
    s->listen_fd = open_listener(s->host, s->o.port, &s->port, err);
    if (s->listen_fd < 0) { s->listen_fd = 0; tern_server_stop(s); return err ? err->code : TERN_EIO; }
    if (srv_writer_start(s)) tern_log(TERN_LOG_WARN, "serve: no stream writer; each HTTP thread writes its own stream");
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                  MHD_USE_ERROR_LOG,
                              0, NULL, NULL, on_request, s,
                              MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->listen_fd,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.timeout_s,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_END);
    if (!s->mhd) {
        close(s->listen_fd);
        s->listen_fd = 0;
        tern_server_stop(s);
        return tern_err(err, TERN_EIO, "serve: could not start the HTTP daemon");
    }
    if (srv_waker_start(s)) tern_log(TERN_LOG_WARN, "serve: no waker thread; the engine thread wakes the HTTP threads");
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) {
        tern_server_stop(s);
        return tern_err(err, TERN_EINTERNAL, "serve: could not start the engine thread");
    }
    s->engine_thread_started = 1;
    *out = s;
    return TERN_OK;
}

int tern__server_load_state(tern_server *s) {
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st;
}

int tern_server_port(const tern_server *s) { return s ? s->port : 0; }
const char *tern_server_summary(const tern_server *s) { return s ? s->summary : ""; }
const char *tern_server_host(const tern_server *s) { return s ? s->host : ""; }

tern_status tern_server_wait_loaded(tern_server *s, tern_error *err) {
    srv_error e = {0};
    if (!srv_wait_ready(s, &e)) return TERN_OK;
    return tern_err(err, s->load_err.code ? s->load_err.code : TERN_EINTERNAL, "%s", s->load_err.msg[0] ? s->load_err.msg : e.msg);
}

void tern_server_stop(tern_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->engine_thread_started) {
        /* wait for the load to finish (it cannot be interrupted), then stop the loop */
        pthread_mutex_lock(&s->mu);
        while (s->state == SRV_LOADING) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        if (s->eng) s->vt->stop(s->eng);
        pthread_join(s->engine_thread, NULL);
    }
    srv_waker_stop(s);                            /* after the engine's last step; before MHD */
    if (s->mhd) MHD_stop_daemon(s->mhd);          /* handlers see `stopping`; MHD closes the socket */
    else if (s->listen_fd > 0) close(s->listen_fd);
    srv_writer_stop(s);                           /* after MHD: its streams' threads have returned */
    if (s->eng) s->vt->close(s->eng);
    tern_chat_template_free(s->tmpl);
    srv_jvocab_free(s->jvocab);
    srv_metrics_free(s);
    srv_responses_free(s);
    free(s->wake);
    pthread_mutex_destroy(&s->vocab_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
