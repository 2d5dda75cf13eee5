/*
 * fuzz_http.c — libFuzzer target for the whole HTTP stack: two servers started once per process on free ports —
 * one on the fake engine (`tern serve --fake-engine`'s, steps without sleeping), one on the real engine with the
 * embedded demo model on the CPU (prefix cache and speculative decoding on, so requests reach the scheduler,
 * sampler, constrained decoding and cancellation for real) — and, per input, one request over a fresh TCP
 * connection: any route and method, bodies the fuzzer writes, streaming or not, clients that read a part of the
 * reply (or none, or send half the body) and vanish.
 *
 * Checked: a complete request to a known route gets a status line, never a 5xx (bad input is the client's
 * fault: 4xx); the server answers the next connection (a crash or a wedged engine shows there). Raw mode
 * (selector 15) sends the input's bytes as they are — request line and headers included — and checks only
 * that the server is still up afterwards.
 *
 * Input: byte 0 selects the route (below; bit 7: the demo-model server), byte 1 the client: bits 0-1 0 read the whole reply, 1 read one
 * byte, 2 read 256 bytes, 3 send half the body and close; bit 2 an Authorization header; bit 3
 * "Connection: keep-alive" instead of close (the client reads one byte of the reply and leaves). The rest is
 * the body.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct { const char *method, *path; } k_routes[] = {
    {"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}, {"POST", "/v1/messages"},
    {"POST", "/v1/responses"},        {"POST", "/v1/messages/count_tokens"}, {"POST", "/tokenize"},
    {"POST", "/detokenize"},          {"POST", "/v1/embeddings"},  {"GET", "/v1/models"},
    {"GET", "/health"},               {"GET", "/metrics"},         {"GET", "/stats"},
    {"GET", "/v1/models/fake"},       {"POST", "/v1/models"},      {"GET", "/v1/chat/completions"},
};
#define RAW 15

static tern_server *g_srvs[2]; /* fake engine, demo model */
static int g_ports[2], g_port;
static int g_rerr; /* the last read's errno (0: the server closed) */

static void stop_servers(void) {
    for (int i = 0; i < 2; i++) {
        tern_server_stop(g_srvs[i]);
        g_srvs[i] = NULL;
    }
}

static void start_server(int demo) {
    g_port = g_ports[demo];
    if (g_srvs[demo]) return;
    signal(SIGPIPE, SIG_IGN); /* a write to a connection the server closed */
    setenv("TERN_FAKE_DELAY_MS", "0", 1);
    tern_server_opts o = tern_server_default_opts();
    o.port = 0;
    o.fake_engine = !demo;
    o.default_max_tokens = 48;
    o.timeout_s = 5;
    o.max_body = 1 << 20;
    if (demo) {
        o.engine.model = "demo";
        o.engine.device = "cpu";
        o.engine.n_threads = 1;
        o.engine.max_concurrency = 4;
        o.engine.max_ctx = 512;
        o.engine.prompt_cache_gb = 0.01;
        o.engine.speculative_k = 2;
    }
    tern_error err = {0};
    if (tern_server_start(&g_srvs[demo], &o, &err) != TERN_OK || tern_server_wait_loaded(g_srvs[demo], &err) != TERN_OK) {
        fprintf(stderr, "fuzz_http: cannot start the %s server: %s\n", demo ? "demo" : "fake", err.msg);
        abort();
    }
    g_port = g_ports[demo] = tern_server_port(g_srvs[demo]);
    static int once;
    if (!once++) atexit(stop_servers);
}

static int connect_server(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {20, 0}; /* a reply that never ends shows as a hang */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    /* close() resets the connection: no TIME_WAIT on this side, or ~700 inputs a second would run out of local
     * ports within a minute (and a reset is one more way for a client to vanish) */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&a, sizeof a)) < 0 && (errno == EINTR || errno == EALREADY)) {
    }
    if (rc < 0 && errno != EISCONN) { /* EISCONN: an interrupted attempt completed */
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue; /* libFuzzer's timer: calls with socket timeouts are not restarted */
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* reads up to max bytes (0: until the server closes) into buf (the first cap - 1 kept); the byte count */
static size_t read_reply(int fd, char *buf, size_t cap, size_t max) {
    size_t got = 0, kept = 0;
    char tmp[4096];
    for (;;) {
        size_t want = sizeof tmp;
        if (max && max - got < want) want = max - got;
        if (!want) break;
        ssize_t k = recv(fd, tmp, want, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            g_rerr = k < 0 ? errno : 0;
            break;
        }
        if (kept < cap - 1) {
            size_t c = (size_t)k < cap - 1 - kept ? (size_t)k : cap - 1 - kept;
            memcpy(buf + kept, tmp, c);
            kept += c;
        }
        got += (size_t)k;
    }
    buf[kept] = 0;
    return got;
}

/* GET /health on a new connection: 1 when it gave 200 */
static int health_ok(void) {
    int fd = connect_server();
    if (fd < 0) return 0;
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char buf[256] = "";
    const int ok = send_all(fd, req, sizeof req - 1) == 0 && read_reply(fd, buf, sizeof buf, 0) > 0 &&
                   !strncmp(buf, "HTTP/1.1 200", 12);
    close(fd);
    return ok;
}

/* the server still answers. A connection can be turned away while the connections of clients that just vanished
 * are still being torn down (one thread each, at most max_connections): that must pass within 5 s (a loaded CI
 * machine replays the kept inputs too). */
static void check_alive(void) {
    for (int i = 0; i < 500; i++) {
        if (health_ok()) return;
        usleep(10000);
    }
    fprintf(stderr, "fuzz_http: /health fails for 5 s after the input (%s)\n", strerror(errno));
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    start_server(data[0] >> 7);
    const int sel = (data[0] & 0x7f) % (RAW + 1), mode = data[1] & 3, auth = data[1] >> 2 & 1, keep = data[1] >> 3 & 1;
    const uint8_t *body = data + 2;
    const size_t blen = size - 2;
    int fd = connect_server();
    if (fd < 0) { fprintf(stderr, "fuzz_http: connect failed: %s\n", strerror(errno)); abort(); }
    if (sel == RAW) {
        send_all(fd, body, blen);
        shutdown(fd, SHUT_WR);
        char buf[64];
        read_reply(fd, buf, sizeof buf, 1 << 20);
        close(fd);
        check_alive();
        return 0;
    }
    char head[512];
    const int hn = snprintf(head, sizeof head,
                            "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s"
                            "Content-Length: %zu\r\nConnection: %s\r\n\r\n",
                            k_routes[sel].method, k_routes[sel].path, auth ? "Authorization: Bearer fuzz\r\n" : "",
                            blen, keep ? "keep-alive" : "close");
    if (send_all(fd, head, (size_t)hn) < 0) { close(fd); check_alive(); return 0; }
    if (mode == 3) { /* half the body, then gone */
        send_all(fd, body, blen / 2);
        close(fd);
        check_alive();
        return 0;
    }
    if (send_all(fd, body, blen) < 0) { close(fd); check_alive(); return 0; }
    char buf[256];
    /* keep-alive: the connection stays open after the reply, so the client reads its first byte and leaves */
    const size_t got = read_reply(fd, buf, sizeof buf, keep || mode == 1 ? 1 : mode == 2 ? 256 : 0);
    close(fd);
    if (mode == 0 && !keep) {
        int st = 0;
        if (!got || sscanf(buf, "HTTP/1.1 %d", &st) != 1) {
            fprintf(stderr, "fuzz_http: %s %s: no status line (%zu bytes; %s; health now %d)\n", k_routes[sel].method,
                    k_routes[sel].path, got, g_rerr ? strerror(g_rerr) : "closed", health_ok());
            abort();
        }
        if (st >= 500) {
            fprintf(stderr, "fuzz_http: %s %s: HTTP %d: %.200s\n", k_routes[sel].method, k_routes[sel].path, st, buf);
            abort();
        }
    }
    check_alive();
    return 0;
}
