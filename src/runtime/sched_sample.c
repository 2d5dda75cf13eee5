/*
 * sched_sample.c — the scheduler's sampler chain (see sched_sample.h for the order).
 *
 * Sampling at temperature T keeps only candidates within 30·T nats of the best logit before
 * sorting (their total probability is < V·e^-30, far below f32 resolution), so a 256k
 * vocabulary costs one pass plus a sort of the few plausible tokens.
 */
#include "runtime/sched_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand { float x; int32_t id; } cand;

struct tern__sampler {
    int V;
    cand *c;                  /* [V] candidates */
    int32_t *cnt;             /* [V] occurrence counts (zero between calls) */
    int32_t *touched;         /* [V] ids with cnt != 0 */
    int32_t top_ids[TERN__MAX_TOP];
    float top_lp[TERN__MAX_TOP];
};

tern_status tern__sampler_new(tern__sampler **out, int V, tern_error *err) {
    *out = NULL;
    tern__sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->V = V;
        s->c = malloc(sizeof *s->c * (size_t)V);
        s->cnt = calloc((size_t)V, sizeof *s->cnt);
        s->touched = malloc(sizeof *s->touched * (size_t)V);
    }
    if (!s || !s->c || !s->cnt || !s->touched) {
        tern__sampler_free(s);
        return tern_err(err, TERN_ENOMEM, "sampler: out of memory (vocab %d)", V);
    }
    *out = s;
    return TERN_OK;
}

void tern__sampler_free(tern__sampler *s) {
    if (!s) return;
    free(s->c); free(s->cnt); free(s->touched);
    free(s);
}

static uint64_t mix64(uint64_t z) {   /* splitmix64 finalizer */
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double tern__rng_uniform(uint64_t seed, uint64_t counter) {
    return (double)(mix64(seed ^ mix64(counter ^ 0x5851f42d4c957f2dULL)) >> 11) * 0x1.0p-53;
}

static void penalize(tern__sampler *s, const tern_sampling *sp, const int32_t *hist, int n_hist, float *x) {
    if (sp->repetition_penalty == 1.f && sp->presence_penalty == 0.f && sp->frequency_penalty == 0.f) return;
    int n = sp->penalty_last_n < 0 ? n_hist : TERN_MIN(sp->penalty_last_n, n_hist);
    int nt = 0;
    for (int i = n_hist - n; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->V) continue;
        if (!s->cnt[t]++) s->touched[nt++] = t;
    }
    for (int i = 0; i < nt; i++) {
        int32_t t = s->touched[i];
        float v = x[t];
        if (sp->repetition_penalty != 1.f) v = v > 0 ? v / sp->repetition_penalty : v * sp->repetition_penalty;
        v -= sp->frequency_penalty * (float)s->cnt[t] + sp->presence_penalty;
        x[t] = v;
        s->cnt[t] = 0;
    }
}

static int by_x_desc(const void *a, const void *b) {
    const cand *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? 1 : -1;
    return p->id < q->id ? -1 : p->id > q->id;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

int tern__sample(tern__sampler *s, const tern_sampling *sp, const int32_t *hist, int n_hist, int idx,
                 float *x, tern__sample_out *out) {
    int V = s->V;
    memset(out, 0, sizeof *out);
    penalize(s, sp, hist, n_hist, x);
    for (int i = 0; i < sp->n_bias; i++) x[sp->bias_ids[i]] += sp->bias_values[i];
    float mx = x[argmax(x, V)];
    double lse = 0;
    if (sp->n_logprobs > 0) {
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
        lse = mx + log(sum);
        /* top alternatives by insertion into a short sorted list */
        int k = TERN_MIN(sp->n_logprobs, TERN__MAX_TOP), n = 0;
        for (int i = 0; i < V; i++) {
            if (n == k && x[i] <= x[s->top_ids[n - 1]]) continue;
            int j = n < k ? n++ : n - 1;
            while (j > 0 && x[s->top_ids[j - 1]] < x[i]) { s->top_ids[j] = s->top_ids[j - 1]; j--; }
            s->top_ids[j] = i;
        }
        for (int j = 0; j < n; j++) s->top_lp[j] = (float)(x[s->top_ids[j]] - lse);
        out->n_top = n;
        out->top_ids = s->top_ids;
        out->top_logprobs = s->top_lp;
    }
    int tok;
    if (sp->temperature <= 0.f || sp->top_k == 1) {
        tok = argmax(x, V);
    } else {
        float T = sp->temperature, floor_x = mx - 30.f * T;
        int n = 0;
        for (int i = 0; i < V; i++) if (x[i] >= floor_x) s->c[n++] = (cand){x[i], i};
        qsort(s->c, (size_t)n, sizeof *s->c, by_x_desc);
        if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
        double sum = 0;
        for (int i = 0; i < n; i++) { double p = exp(((double)s->c[i].x - mx) / T); s->c[i].x = (float)p; sum += p; }
        if (sp->top_p < 1.f) {
            double cum = 0;
            for (int i = 0; i < n; i++) { cum += s->c[i].x / sum; if (cum >= sp->top_p) { n = i + 1; break; } }
        }
        if (sp->min_p > 0.f) {
            float lim = sp->min_p * s->c[0].x;
            int m = 1;
            while (m < n && s->c[m].x >= lim) m++;
            n = m;
        }
        sum = 0;
        for (int i = 0; i < n; i++) sum += s->c[i].x;
        double u = tern__rng_uniform(sp->seed, (uint64_t)idx) * sum, cum = 0;
        tok = s->c[n - 1].id;
        for (int i = 0; i < n; i++) { cum += s->c[i].x; if (u < cum) { tok = s->c[i].id; break; } }
    }
    if (sp->n_logprobs > 0) out->logprob = (float)(x[tok] - lse);
    return tok;
}
