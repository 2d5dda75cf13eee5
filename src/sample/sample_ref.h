/*
 * sample_ref.h — the draw (sampler.h steps 4-9) as a plain function of processed logits and a
 * tern_sample_row, and the backend sampling op (ops.h vt->sample) for host-memory backends.
 *
 * This is the spec the CUDA kernel (src/backend/cuda/sample.cu) reproduces token for token;
 * tern_sampler_sample() runs the very same function after its bias / penalties / mask steps.
 * The definition, in order, for temperature T > 0 over the finite logits (mx = their max):
 *   order O: logit descending, id ascending (a total order);
 *   top-k  (0 < k < n): keep the first k in O;
 *   top-p  (< 1): w1 = W(l - mx) (sample_math.h), total1 = their sum over the kept set,
 *          thr = (uint64)(top_p * total1); keep the shortest prefix in O with sum >= thr;
 *   min-p  (> 0): keep l >= mx + logf(min_p) (float add);
 *   draw:  wT = W((l - mx) * (1/T)); target = floor(u53 * ΣwT / 2^53); walk the kept tokens in
 *          ascending id order and take the one whose [cum, cum + wT) holds target.
 * Only tokens with x1 = l - mx >= -30 or x1/T >= -30 can carry weight, so both sides work on
 * that set (a prefix of O) — the result is the same as over every token.
 */
#ifndef TERN_SAMPLE_REF_H
#define TERN_SAMPLE_REF_H

#include "ops/ops.h"

/* The draw's first pass, alone the greedy pick: the index of the largest logit (the lowest on ties; -inf never
 * counts), or TERN_SAMPLE_ERR_NAN / _INF at the first NaN / +inf (*bad = its index; else -1), or
 * TERN_SAMPLE_ERR_MASKED when every logit is -inf. mx_out (may be NULL): the largest logit. The CPU kernel
 * tables' argmax (src/backend/cpu/kern.h) gives the same answers; the scalar table calls this. */
int32_t tern__sample_argmax(const float *logits, int V, float *mx_out, int *bad);

/* The draw on processed logits [V] (not modified). Returns the token, or TERN_SAMPLE_ERR_*
 * with *bad = the first offending index (NaN / +inf; -1 when every token is masked).
 * scratch: tern_sample_scratch_bytes(V) bytes. */
int32_t tern__sample_draw(const float *logits, int V, const tern_sample_row *p, void *scratch, int *bad);

/* One row as the backend op does it: bias list (in order), penalties over the history list,
 * then the draw. logits [V] are modified in place. */
int32_t tern__sample_row(float *logits, int V, const tern_sample_row *p, const tern_sample_pair *pairs,
                         void *scratch);

/* vt->sample for backends whose memory is host memory (cpu, cpu-ref). */
void tern_sample_op_host(tern_backend *be, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
                         const tern_sample_pair *pairs, void *scratch);

#endif
