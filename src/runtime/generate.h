/*
 * generate.h — single-sequence generation on one KV slot: chunked prefill, then decode
 * one token per step. The continuous-batching scheduler (runtime/sched) generalises this;
 * this path serves the CLI and the parity tests.
 */
#ifndef TERN_GENERATE_H
#define TERN_GENERATE_H

#include "model/model.h"

/* Choose the next token from logits[n_vocab]; return it (or < 0 to stop with an error). */
typedef int (*tern_pick_fn)(void *ctx, const float *logits, int n_vocab);
/* Called after each generated token; return non-zero to stop. */
typedef int (*tern_token_fn)(void *ctx, int token);

typedef struct tern_gen_stats {
    int n_prompt, n_gen;
    double t_prefill, t_decode;   /* seconds */
} tern_gen_stats;

/* Prefill `prompt` into `slot` (chunks of `chunk` rows; 0 = 512), then generate up to max_new
 * tokens. pick == NULL: greedy argmax (lowest id on ties). stop_ids: tokens that end the
 * sequence (not reported through on_token), unless ignore_eos. */
tern_status tern_generate(tern_model *m, tern_kv *kv, int slot, const int32_t *prompt, int n_prompt,
                          int max_new, int chunk, const int32_t *stop_ids, int n_stop,
                          tern_pick_fn pick, void *pick_ctx, tern_token_fn on_token, void *tok_ctx,
                          tern_gen_stats *stats, tern_error *err);

int tern_argmax(const float *x, int n);
/* 1 when the model draws on its device and TERN_DEVICE_SAMPLE=0 does not turn that off (the
 * scheduler and tern_generate both ask) */
int tern_device_sampling(const tern_model *m);
/* 1 when device-drawn decode steps are queued before the previous step's ids reach the host (tern_generate's loop and
 * the scheduler's steady decode; read at each call): where m's steps launch without waiting (step graphs, see
 * tern_model_decode_async), unless TERN_ASYNC=0. TERN_ASYNC=2 pipelines also where each step runs at once (the CPU
 * backend: no gain, a step's ids come back one step later; the tests use it to run the pipeline's bookkeeping) */
int tern_async_decode(const tern_model *m);

#endif
