/*
 * sampler.h — turns one row of logits into a token.
 *
 * The chain, in this fixed order (every stage is skipped when off):
 *   1. logit bias            logits[id] += bias
 *   2. penalties over the last `penalty_last_n` accepted tokens (a ring; prompt tokens count
 *      if the caller accepts them): repetition (HF / llama.cpp rule: a positive logit is
 *      divided by the penalty, a negative one multiplied, once per distinct token), then
 *      presence (-= presence, once per distinct token) and frequency (-= frequency * count)
 *   3. mask hook             callback that may set logits to -INFINITY (constrained decoding)
 *   -- logprobs are taken here: log-softmax of the processed logits at temperature 1, before
 *      any truncation (mlx-lm / OpenAI semantics): the chosen token's logprob + top-N.
 *   4. temperature == 0      greedy argmax (lowest id on ties); stop
 *   5. top-k  6. top-p (on the temperature-1 distribution)  7. min-p (p >= min_p * p_max)
 *   8. temperature           softmax(logit / T) over the survivors
 *   9. draw                  inverse CDF with u = counter-based RNG(seed, step): the same
 *                            (seed, step, logits) always gives the same token, whatever else
 *                            runs in the batch.
 * Steps 4-9 are defined exactly in sample_ref.h (integer weights and sums, the order of the
 * candidates, which set is walked in which order), so that a backend can run them on the
 * device and draw the very same tokens (ops.h vt->sample): tern_sampler_device_row() turns
 * one step of a sampler into the row descriptor that op takes.
 * Logits are modified in place. All scratch is allocated at creation (sized to the vocab):
 * sampling allocates nothing. A sampler serves one sequence (it owns the penalty history).
 */
#ifndef TERN_SAMPLER_H
#define TERN_SAMPLER_H

#include "base/base.h"
#include "ops/ops.h"

#include <stdbool.h>
#include <stdint.h>

#define TERN_MAX_LOGPROBS 20

typedef struct tern_sampler_params {
    float temperature;        /* >= 0; 0 = greedy */
    int top_k;                /* >= 0; 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* (0, 100]; 1 = off */
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    int penalty_last_n;       /* [0, 1<<20] tokens of history the penalties see; 0 = none */
    uint64_t seed;
    const int32_t *bias_ids;  /* logit bias: n_bias (id, value) pairs; copied at creation */
    const float *bias_values;
    int n_bias;
    bool logprobs;            /* fill result.logprob and top[] */
    int top_logprobs;         /* [0, TERN_MAX_LOGPROBS] alternatives */
} tern_sampler_params;

/* temperature 1, top_k 0, top_p 1, min_p 0, penalties off (last_n 64), seed 0, no bias. */
tern_sampler_params tern_sampler_defaults(void);

typedef struct tern_token_logprob { int32_t id; float logprob; } tern_token_logprob;
typedef struct tern_sample_result {
    int32_t id;
    float logprob;            /* when params.logprobs */
    int n_top;
    tern_token_logprob top[TERN_MAX_LOGPROBS]; /* best first */
} tern_sample_result;

/* Mask hook: may set entries of logits[n_vocab] to -INFINITY. Return false to fail the step. */
typedef bool (*tern_sampler_mask_fn)(void *user, float *logits, int n_vocab);

typedef struct tern_sampler tern_sampler;

/* Validates every parameter (message names the parameter and value). */
tern_status tern_sampler_new(const tern_sampler_params *p, int n_vocab, tern_sampler **out, tern_error *err);
void tern_sampler_free(tern_sampler *s);
void tern_sampler_set_mask(tern_sampler *s, tern_sampler_mask_fn fn, void *user);
/* Record a token in the penalty history (prompt tokens and each sampled token). */
void tern_sampler_accept(tern_sampler *s, int32_t id);
void tern_sampler_reset(tern_sampler *s); /* clear the history */
/* Sample from logits[n_vocab] (modified in place) for decode step `step` (the RNG counter:
 * use the position of the token being generated). */
tern_status tern_sampler_sample(tern_sampler *s, float *logits, uint64_t step, tern_sample_result *res,
                                tern_error *err);
/* The RNG: uniform double in [0, 1) from (seed, step). */
double tern_sampler_uniform(uint64_t seed, uint64_t step);

/* Device sampling. Fill *row for drawing step `step` on the device and append the row's lists
 * (its logit bias, then the distinct tokens of its penalty window with their counts) to
 * pairs[*n_pairs .. cap), advancing *n_pairs. Returns false, changing nothing, when the step
 * needs the host: a mask hook, logprobs, or lists that do not fit. After the device drew
 * `id` (or a TERN_SAMPLE_ERR_*), tern_sampler_device_result() fills res (id only) or err. */
bool tern_sampler_device_row(tern_sampler *s, uint64_t step, tern_sample_row *row, tern_sample_pair *pairs,
                             int *n_pairs, int cap);
tern_status tern_sampler_device_result(const tern_sampler *s, int32_t id, tern_sample_result *res, tern_error *err);
/* True when draws depend on the penalty history (penalties on, window non-empty): then
 * consecutive steps cannot be drawn in one device call before the earlier token is accepted. */
bool tern_sampler_uses_history(const tern_sampler *s);

#endif
