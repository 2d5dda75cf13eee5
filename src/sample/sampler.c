/*
 * sampler.c — the sampling chain of sampler.h.
 *
 * Cost per token is O(n_vocab) for the passes over the logits; sorting happens only for
 * top-p, and only over the candidates within 40 nats of the best logit (the rest carry less
 * than n_vocab * e^-40 of the temperature-1 mass, so they can never be inside the nucleus).
 * Without top-k / top-p the draw walks the candidates in id order, so no sort is needed.
 * Sums are in double. Ties are broken by the lower id everywhere, for determinism.
 */
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand { float logit; int32_t id; } cand;

struct tern_sampler {
    tern_sampler_params p;
    int n_vocab;
    int32_t *bias_ids;
    float *bias_vals;
    int32_t *ring;      /* last penalty_last_n accepted tokens */
    int ring_n, ring_pos;
    int32_t *counts;    /* occurrences of each id inside the ring */
    uint32_t *stamp;    /* distinct-token marker for the current step */
    uint32_t stamp_gen;
    cand *c;            /* candidates scratch [n_vocab] */
    double *prob;       /* [n_vocab] */
    tern_sampler_mask_fn mask;
    void *mask_user;
};

tern_sampler_params tern_sampler_defaults(void) {
    tern_sampler_params p = {0};
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.penalty_last_n = 64;
    return p;
}

static tern_status validate(const tern_sampler_params *p, int n_vocab, tern_error *err) {
    if (n_vocab <= 0) return tern_err(err, TERN_EINVAL, "sampler: n_vocab must be positive, got %d", n_vocab);
    if (!isfinite(p->temperature) || p->temperature < 0)
        return tern_err(err, TERN_EINVAL, "sampler: temperature must be >= 0, got %g", p->temperature);
    if (p->top_k < 0) return tern_err(err, TERN_EINVAL, "sampler: top_k must be >= 0, got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return tern_err(err, TERN_EINVAL, "sampler: top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return tern_err(err, TERN_EINVAL, "sampler: min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 100))
        return tern_err(err, TERN_EINVAL, "sampler: repetition_penalty must be in (0, 100], got %g", p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return tern_err(err, TERN_EINVAL, "sampler: presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return tern_err(err, TERN_EINVAL, "sampler: frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (p->penalty_last_n < 0 || p->penalty_last_n > (1 << 20))
        return tern_err(err, TERN_EINVAL, "sampler: penalty_last_n must be in [0, 1048576], got %d", p->penalty_last_n);
    if (p->top_logprobs < 0 || p->top_logprobs > TERN_MAX_LOGPROBS)
        return tern_err(err, TERN_EINVAL, "sampler: top_logprobs must be in [0, %d], got %d", TERN_MAX_LOGPROBS, p->top_logprobs);
    if (p->n_bias < 0 || (p->n_bias && (!p->bias_ids || !p->bias_values)))
        return tern_err(err, TERN_EINVAL, "sampler: logit_bias: bad count %d", p->n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= n_vocab)
            return tern_err(err, TERN_EINVAL, "sampler: logit_bias: token id %d outside [0, %d)", p->bias_ids[i], n_vocab);
        if (isnan(p->bias_values[i]) || p->bias_values[i] == INFINITY)
            return tern_err(err, TERN_EINVAL, "sampler: logit_bias: value for token %d must be finite or -inf", p->bias_ids[i]);
    }
    return TERN_OK;
}

tern_status tern_sampler_new(const tern_sampler_params *p, int n_vocab, tern_sampler **out, tern_error *err) {
    *out = NULL;
    if (!p) return tern_err(err, TERN_EINVAL, "sampler: NULL params");
    tern_status st = validate(p, n_vocab, err);
    if (st) return st;
    tern_sampler *s = calloc(1, sizeof *s);
    if (!s) return tern_err(err, TERN_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    size_t V = (size_t)n_vocab;
    s->counts = calloc(V, sizeof *s->counts);
    s->stamp = calloc(V, sizeof *s->stamp);
    s->c = malloc(V * sizeof *s->c);
    s->prob = malloc(V * sizeof *s->prob);
    s->ring = malloc((size_t)(p->penalty_last_n ? p->penalty_last_n : 1) * sizeof *s->ring);
    if (p->n_bias) {
        s->bias_ids = malloc((size_t)p->n_bias * sizeof *s->bias_ids);
        s->bias_vals = malloc((size_t)p->n_bias * sizeof *s->bias_vals);
    }
    if (!s->counts || !s->stamp || !s->c || !s->prob || !s->ring || (p->n_bias && (!s->bias_ids || !s->bias_vals))) {
        tern_sampler_free(s);
        return tern_err(err, TERN_ENOMEM, "sampler: out of memory for a vocabulary of %d", n_vocab);
    }
    if (p->n_bias) {
        memcpy(s->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof *s->bias_ids);
        memcpy(s->bias_vals, p->bias_values, (size_t)p->n_bias * sizeof *s->bias_vals);
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias_values = s->bias_vals;
    *out = s;
    return TERN_OK;
}

void tern_sampler_free(tern_sampler *s) {
    if (!s) return;
    free(s->bias_ids); free(s->bias_vals); free(s->ring); free(s->counts); free(s->stamp); free(s->c); free(s->prob);
    free(s);
}

void tern_sampler_set_mask(tern_sampler *s, tern_sampler_mask_fn fn, void *user) {
    if (!s) return;
    s->mask = fn;
    s->mask_user = user;
}

void tern_sampler_accept(tern_sampler *s, int32_t id) {
    if (!s || s->p.penalty_last_n == 0 || id < 0 || id >= s->n_vocab) return;
    if (s->ring_n == s->p.penalty_last_n) {
        s->counts[s->ring[s->ring_pos]]--;
    } else s->ring_n++;
    s->ring[s->ring_pos] = id;
    s->counts[id]++;
    s->ring_pos = (s->ring_pos + 1) % s->p.penalty_last_n;
}

void tern_sampler_reset(tern_sampler *s) {
    if (!s) return;
    for (int i = 0; i < s->ring_n; i++) s->counts[s->ring[i]] = 0;
    s->ring_n = 0;
    s->ring_pos = 0;
}

/* splitmix64 finalizer over (seed, step): a counter-based generator, no state. */
double tern_sampler_uniform(uint64_t seed, uint64_t step) {
    uint64_t z = seed ^ ((step + 1) * 0x9E3779B97F4A7C15ULL);
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int cand_cmp(const void *a, const void *b) { /* logit desc, id asc */
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static bool better(const cand *x, const cand *y) { return x->logit > y->logit || (x->logit == y->logit && x->id < y->id); }

/* Move the k best candidates to c[0..k) (unordered): quickselect. */
static void select_top(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand piv = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (better(&c[i], &piv)) i++;
            while (better(&piv, &c[j])) j--;
            if (i <= j) { cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

static void apply_penalties(tern_sampler *s, float *logits) {
    const tern_sampler_params *p = &s->p;
    if (!s->ring_n || (p->repetition_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0)) return;
    if (++s->stamp_gen == 0) { memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp); s->stamp_gen = 1; }
    for (int i = 0; i < s->ring_n; i++) {
        int32_t id = s->ring[i];
        if (s->stamp[id] == s->stamp_gen) continue;
        s->stamp[id] = s->stamp_gen;
        float l = logits[id];
        if (p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
        logits[id] = l;
    }
}

static void fill_logprobs(tern_sampler *s, const float *logits, tern_sample_result *res) {
    int V = s->n_vocab, N = s->p.top_logprobs;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    res->n_top = 0;
    for (int i = 0; i < V && N; i++) { /* insertion into the best-N list */
        float l = logits[i];
        if (res->n_top == N && !(l > res->top[N - 1].logprob)) continue;
        int k = res->n_top < N ? res->n_top++ : N - 1;
        while (k > 0 && l > res->top[k - 1].logprob) { res->top[k] = res->top[k - 1]; k--; }
        res->top[k].id = i;
        res->top[k].logprob = l;
    }
    for (int k = 0; k < res->n_top; k++) res->top[k].logprob = (float)(res->top[k].logprob - lse);
    res->logprob = (float)(logits[res->id] - lse);
}

tern_status tern_sampler_sample(tern_sampler *s, float *logits, uint64_t step, tern_sample_result *res,
                                tern_error *err) {
    if (!s || !logits || !res) return tern_err(err, TERN_EINVAL, "sampler: NULL argument");
    const tern_sampler_params *p = &s->p;
    int V = s->n_vocab;
    memset(res, 0, sizeof *res);
    for (int i = 0; i < p->n_bias; i++) logits[s->bias_ids[i]] += s->bias_vals[i];
    apply_penalties(s, logits);
    if (s->mask && !s->mask(s->mask_user, logits, V)) return tern_err(err, TERN_EINVAL, "sampler: mask hook failed");

    /* candidates: finite logits */
    cand *c = s->c;
    int n = 0, best = 0;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (isnan(l)) return tern_err(err, TERN_EINVAL, "sampler: logit %d is NaN", i);
        if (l == -INFINITY) continue;
        if (l == INFINITY) return tern_err(err, TERN_EINVAL, "sampler: logit %d is +inf", i);
        c[n].logit = l;
        c[n].id = i;
        if (l > mx) { mx = l; best = n; } /* strict: the lowest id wins ties */
        n++;
    }
    if (!n) return tern_err(err, TERN_EINVAL, "sampler: every token is masked");
    if (p->temperature == 0) {
        res->id = c[best].id;
    } else {
        if (p->top_k > 0 && p->top_k < n) { select_top(c, n, p->top_k); n = p->top_k; }
        if (p->top_p < 1) {
            int m = 0;
            for (int i = 0; i < n; i++)
                if (c[i].logit >= mx - 40.0f) c[m++] = c[i];
            n = m;
            qsort(c, (size_t)n, sizeof *c, cand_cmp);
            double sum = 0;
            for (int i = 0; i < n; i++) sum += (s->prob[i] = exp((double)c[i].logit - mx));
            double cum = 0, target = (double)p->top_p * sum;
            int keep = n;
            for (int i = 0; i < n; i++) {
                cum += s->prob[i];
                if (cum >= target) { keep = i + 1; break; }
            }
            n = keep;
        }
        if (p->min_p > 0) {
            float thr = mx + logf(p->min_p);
            int m = 0;
            for (int i = 0; i < n; i++)
                if (c[i].logit >= thr) c[m++] = c[i];
            n = m;
        }
        double inv_t = 1.0 / p->temperature, sum = 0;
        for (int i = 0; i < n; i++) sum += (s->prob[i] = exp(((double)c[i].logit - mx) * inv_t));
        double u = tern_sampler_uniform(p->seed, step) * sum, cum = 0;
        int pick = n - 1;
        for (int i = 0; i < n; i++) {
            cum += s->prob[i];
            if (u < cum) { pick = i; break; }
        }
        res->id = c[pick].id;
    }
    if (p->logprobs || p->top_logprobs) fill_logprobs(s, logits, res);
    return TERN_OK;
}
