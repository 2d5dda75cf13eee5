/*
 * metrics.c — request and latency metrics for GET /metrics (Prometheus text format).
 *
 * HTTP answers are counted by status code (tern_http_responses_total{code="..."}). Time to
 * first token and inter-token latency are histograms (cumulative buckets, _sum, _count)
 * observed on the engine thread as TOKEN events arrive (job.c). One mutex guards it all:
 * observations are a few adds, far below a decode step.
 */
#include "server/srv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double k_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
#define NB (int)(sizeof k_buckets / sizeof k_buckets[0])

typedef struct hist {
    long long count[NB + 1];      /* per bucket (not cumulative); last = +Inf */
    long long n;
    double sum;
} hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    long long by_code[600];
    hist ttft, itl;
} srv_metrics;

int srv_metrics_init(tern_server *s) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return -1;
    pthread_mutex_init(&m->mu, NULL);
    s->metrics = m;
    return 0;
}

void srv_metrics_free(tern_server *s) {
    if (!s || !s->metrics) return;
    pthread_mutex_destroy(&s->metrics->mu);
    free(s->metrics);
    s->metrics = NULL;
}

void srv_metrics_http(tern_server *s, int status) {
    srv_metrics *m = s->metrics;
    if (!m || status < 100 || status >= 600) return;
    pthread_mutex_lock(&m->mu);
    m->by_code[status]++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(srv_metrics *m, hist *h, double x) {
    int b = 0;
    while (b < NB && x > k_buckets[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->count[b]++;
    h->n++;
    h->sum += x;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_ttft(tern_server *s, double x) { if (s->metrics) observe(s->metrics, &s->metrics->ttft, x); }
void srv_metrics_itl(tern_server *s, double x) { if (s->metrics) observe(s->metrics, &s->metrics->itl, x); }

static void text(tern_jw *o, const char *fmt, ...) TERN_PRINTF(2, 3);
static void text(tern_jw *o, const char *fmt, ...) {
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n > 0) tern_jw_text(o, b, (size_t)TERN_MIN(n, (int)sizeof b - 1));
}

static void write_hist(tern_jw *o, const char *name, const char *help, const hist *h) {
    text(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long long cum = 0;
    for (int b = 0; b < NB; b++) {
        cum += h->count[b];
        text(o, "%s_bucket{le=\"%g\"} %lld\n", name, k_buckets[b], cum);
    }
    text(o, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name, h->n, name, h->sum, name, h->n);
}

void srv_metrics_write(tern_server *s, tern_jw *o) {
    srv_metrics *m = s->metrics;
    if (!m) return;
    srv_metrics c;
    pthread_mutex_lock(&m->mu);
    memcpy(c.by_code, m->by_code, sizeof c.by_code);
    c.ttft = m->ttft;
    c.itl = m->itl;
    pthread_mutex_unlock(&m->mu);
    text(o, "# HELP tern_http_responses_total HTTP responses by status code.\n"
            "# TYPE tern_http_responses_total counter\n");
    for (int i = 100; i < 600; i++)
        if (c.by_code[i]) text(o, "tern_http_responses_total{code=\"%d\"} %lld\n", i, c.by_code[i]);
    struct timespec ts;
    if (atomic_load(&s->has_engine_clock) && !clock_gettime(s->engine_clock, &ts))
        text(o, "# HELP tern_engine_thread_cpu_seconds_total CPU time of the engine thread (model, scheduler and "
                "event callbacks).\n# TYPE tern_engine_thread_cpu_seconds_total counter\n"
                "tern_engine_thread_cpu_seconds_total %.6f\n", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    if (!clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts))   /* all threads: the server's total cost */
        text(o, "# HELP process_cpu_seconds_total Total user and system CPU time of the server process.\n"
                "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.6f\n",
             (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    write_hist(o, "tern_time_to_first_token_seconds", "Time from submit to the first generated token.", &c.ttft);
    write_hist(o, "tern_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", &c.itl);
}
