/*
 * sampler.c — the sampling chain of sampler.h.
 *
 * Steps 1-3 (bias, penalties, mask hook) and logprobs live here; steps 4-9 are the reference
 * draw of sample_ref.c (integer weights and sums, sample_math.h), which the device op
 * reproduces token for token. The penalty history is a ring of the last penalty_last_n
 * accepted tokens with per-id counts; tern_sampler_device_row() hands the distinct ids of
 * that ring and their counts to the device as a short list.
 * Cost per token is O(n_vocab) for the passes over the logits; sorting happens only for
 * top-p, and only over the tokens that can carry weight. Ties go to the lower id everywhere.
 */
#include "sample/sampler.h"
#include "sample/sample_math.h"
#include "sample/sample_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    void *scratch;      /* tern_sample_scratch_bytes(n_vocab) for the draw */
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
    if (n_vocab <= 0 || n_vocab > TERN_SAMPLE_MAX_VOCAB)
        return tern_err(err, TERN_EINVAL, "sampler: n_vocab must be in [1, %d], got %d", TERN_SAMPLE_MAX_VOCAB, n_vocab);
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
    s->scratch = malloc(tern_sample_scratch_bytes(n_vocab));
    s->ring = malloc((size_t)(p->penalty_last_n ? p->penalty_last_n : 1) * sizeof *s->ring);
    if (p->n_bias) {
        s->bias_ids = malloc((size_t)p->n_bias * sizeof *s->bias_ids);
        s->bias_vals = malloc((size_t)p->n_bias * sizeof *s->bias_vals);
    }
    if (!s->counts || !s->stamp || !s->scratch || !s->ring || (p->n_bias && (!s->bias_ids || !s->bias_vals))) {
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
    free(s->bias_ids); free(s->bias_vals); free(s->ring); free(s->counts); free(s->stamp); free(s->scratch);
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
    return (double)tern_sample_u53(seed, step) * (1.0 / 9007199254740992.0);
}

static bool penalties_on(const tern_sampler *s) {
    const tern_sampler_params *p = &s->p;
    return s->ring_n && (p->repetition_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0);
}

static void apply_penalties(tern_sampler *s, float *logits) {
    const tern_sampler_params *p = &s->p;
    if (!penalties_on(s)) return;
    if (++s->stamp_gen == 0) { memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp); s->stamp_gen = 1; }
    for (int i = 0; i < s->ring_n; i++) {
        int32_t id = s->ring[i];
        if (s->stamp[id] == s->stamp_gen) continue;
        s->stamp[id] = s->stamp_gen;
        logits[id] = tern_sample_penalize(logits[id], p->repetition_penalty, p->presence_penalty,
                                          p->frequency_penalty, (float)s->counts[id]);
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

/* The draw parameters of one step (lists are attached by tern_sampler_device_row). */
static void fill_row(const tern_sampler *s, uint64_t step, tern_sample_row *row) {
    const tern_sampler_params *p = &s->p;
    memset(row, 0, sizeof *row);
    row->mode = TERN_SAMPLE_DRAW;
    row->top_k = p->top_k;
    row->temperature = p->temperature;
    row->top_p = p->top_p;
    row->min_p_log = p->min_p > 0 ? logf(p->min_p) : -INFINITY;
    row->rep = p->repetition_penalty;
    row->presence = p->presence_penalty;
    row->frequency = p->frequency_penalty;
    row->inv_t = p->temperature > 0 ? 1.0 / (double)p->temperature : 0.0;
    row->seed = p->seed;
    row->step = step;
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

    tern_sample_row row;
    fill_row(s, step, &row);
    int bad;
    int32_t id = tern__sample_draw(logits, V, &row, s->scratch, &bad);
    if (id == TERN_SAMPLE_ERR_NAN) return tern_err(err, TERN_EINVAL, "sampler: logit %d is NaN", bad);
    if (id == TERN_SAMPLE_ERR_INF) return tern_err(err, TERN_EINVAL, "sampler: logit %d is +inf", bad);
    if (id < 0) return tern_err(err, TERN_EINVAL, "sampler: every token is masked");
    res->id = id;
    if (p->logprobs || p->top_logprobs) fill_logprobs(s, logits, res);
    return TERN_OK;
}

/* ---- device sampling ------------------------------------------------------------------ */

bool tern_sampler_uses_history(const tern_sampler *s) { return s && penalties_on(s); }

bool tern_sampler_device_row(tern_sampler *s, uint64_t step, tern_sample_row *row, tern_sample_pair *pairs,
                             int *n_pairs, int cap) {
    if (!s || s->mask || s->p.logprobs || s->p.top_logprobs) return false;
    int n0 = *n_pairs, n = n0;
    if (s->p.n_bias > cap - n) return false;
    fill_row(s, step, row);
    row->bias_off = n;
    row->n_bias = s->p.n_bias;
    for (int i = 0; i < s->p.n_bias; i++) pairs[n++] = (tern_sample_pair){s->bias_ids[i], s->bias_vals[i]};
    row->hist_off = n;
    if (penalties_on(s)) {
        if (s->ring_n > cap - n) return false; /* distinct ids <= ring entries */
        if (++s->stamp_gen == 0) { memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp); s->stamp_gen = 1; }
        for (int i = 0; i < s->ring_n; i++) {
            int32_t id = s->ring[i];
            if (s->stamp[id] == s->stamp_gen) continue;
            s->stamp[id] = s->stamp_gen;
            pairs[n++] = (tern_sample_pair){id, (float)s->counts[id]};
        }
    }
    row->n_hist = n - row->hist_off;
    *n_pairs = n;
    return true;
}

tern_status tern_sampler_device_result(const tern_sampler *s, int32_t id, tern_sample_result *res, tern_error *err) {
    memset(res, 0, sizeof *res);
    if (id == TERN_SAMPLE_ERR_NAN) return tern_err(err, TERN_EINVAL, "sampler: a logit is NaN (device sampling)");
    if (id == TERN_SAMPLE_ERR_INF) return tern_err(err, TERN_EINVAL, "sampler: a logit is +inf (device sampling)");
    if (id == TERN_SAMPLE_ERR_MASKED) return tern_err(err, TERN_EINVAL, "sampler: every token is masked");
    if (!s || id < 0 || id >= s->n_vocab)
        return tern_err(err, TERN_EINTERNAL, "sampler: the device returned token %d outside [0, %d)", id, s ? s->n_vocab : 0);
    res->id = id;
    return TERN_OK;
}
