/*
 * sched_sample.h — the scheduler's token picker: a small, complete-enough sampler chain used
 * until (and as a fallback beside) src/sample/. Chain order: repetition / presence /
 * frequency penalties over the last penalty_last_n tokens of the sequence -> logit bias ->
 * logprobs (log-softmax of these logits) -> greedy when temperature == 0, else temperature ->
 * top-k -> top-p -> min-p -> draw.
 *
 * The draw uses a counter-based RNG: u = hash(seed, token index). A request's tokens thus
 * depend only on its own seed and history, never on the batch around it or on how often it
 * was preempted and recomputed. Scratch is sized for n_vocab at creation; sampling allocates
 * nothing.
 */
#ifndef TERN_RUNTIME_SCHED_SAMPLE_H
#define TERN_RUNTIME_SCHED_SAMPLE_H

#include "base/base.h"

#define TERN__MAX_TOP 20

typedef struct tern__sampler tern__sampler;

typedef struct tern__sample_out {
    float logprob;             /* of the chosen token (0 unless n_logprobs > 0) */
    int n_top;
    const int32_t *top_ids;    /* point into the sampler: valid until the next call */
    const float *top_logprobs;
} tern__sample_out;

tern_status tern__sampler_new(tern__sampler **out, int n_vocab, tern_error *err);
void tern__sampler_free(tern__sampler *s);

/* Pick the token at sequence index `idx` (the RNG counter) given hist[0..n_hist) (the sequence
 * so far, for penalties). logits[n_vocab] is modified in place. */
int tern__sample(tern__sampler *s, const tern_sampling *sp, const int32_t *hist, int n_hist, int idx,
                 float *logits, tern__sample_out *out);

/* The counter-based uniform in [0, 1) the sampler draws with. */
double tern__rng_uniform(uint64_t seed, uint64_t counter);

#endif
