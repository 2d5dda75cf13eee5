/*
 * sched.h — the continuous-batching scheduler behind tern_engine (engine thread only).
 *
 * Requests wait in FCFS order and are admitted to free KV slots. Each step builds ONE batch:
 * every request whose next row is a single token (decode) contributes that row; requests still
 * prefilling contribute chunks from the remaining per-step token budget (chunked prefill,
 * interleaved with decode), oldest admission first. One tern_model_forward runs the batch;
 * each request whose last row asked for logits samples its next token with its own
 * counter-based RNG (seed, token index), so its tokens do not depend on the company it keeps.
 *
 * Admission by aggregate KV (memory honesty): submit refuses a prompt the whole pool cannot
 * hold (TERN_ENOMEM naming the blocks) and clips max_tokens to what the pool can hold; a
 * waiting request is admitted only when the free blocks (after evicting idle prefix-cache
 * blocks) cover its next step plus the next step of everything running (the step's rows split
 * as the step will split them: a sliding pool holds one chunk for all slots), else it waits at
 * the head of the queue. Memory is allocated at open, so a step never dies of OOM; a failed
 * allocation (sampler scratch) ends only its request, with an error event.
 * KV pressure: when tern_kv_reserve says TERN_ENOMEM, the most recently admitted request is
 * preempted (its blocks freed, it goes back to the front of the queue and later recomputes
 * prompt + generated-so-far); a prefill chunk that is itself the newest shrinks first.
 * Only a request that cannot fit even alone ends (LENGTH while decoding, ERROR in prefill).
 * With a prefix cache (prefix.h), admission starts a request after its longest cached prefix
 * (sliding-window models too: the window's sliding blocks are shared as well), blocks that
 * fill up are offered to the cache after each forward (before trim), and idle cached blocks
 * are evicted before anyone is preempted.
 *
 * A token in the request's stop list (its stop ids + the model's EOS unless ignore_eos) ends
 * it with TERN_FINISH_STOP and is neither emitted nor counted in n_generated. Callbacks must
 * not call tern_engine_step (submit and cancel are fine).
 *
 * Speculative decoding (tern_request.speculative_k > 0): a request whose next row is a decode
 * row gets a prompt-lookup draft (spec.h) of up to k tokens from the budget left after decode
 * and prefill rows, its KV reserved for n + 1 + d positions (no draft when that does not fit:
 * drafts never preempt anyone). Rows [last token, draft...] all return logits. Verification
 * draws from row j exactly as plain decoding would for that position (same penalty history,
 * same mask callback state, RNG counter = position): if the draw equals draft[j] the draft
 * token is accepted and row j+1 is examined, else the drawn token is taken and the round
 * ends (after an all-accepted draft the last row gives one more token). Because row j's
 * logits are those of the sequence prefix [.., accepted tokens], and every emitted token is
 * the very token the sampler would draw at that position without speculation, greedy output
 * is identical and seeded sampling is identical token for token (draw-and-compare keeps the
 * distribution and the per-position RNG; it accepts less often than rejection sampling
 * against a draft distribution, but a lookup draft has none). The KV is then truncated to
 * the accepted length (tern_kv_truncate) before sliding windows are trimmed.
 *
 * Every buffer a step needs is sized at creation (max_concurrency x budget rows, logits for
 * max_concurrency rows, sampler scratch of n_vocab): a steady-state step allocates nothing.
 */
#ifndef TERN_RUNTIME_SCHED_H
#define TERN_RUNTIME_SCHED_H

#include "model/model.h"
#include "runtime/kv.h"
#include "runtime/prefix.h"
#include "runtime/queue.h"
#include "runtime/spec.h"
#include "sample/sampler.h"

typedef struct tern__req {
    tern__qitem q;            /* first member: queue link + id; reused as the waiting-list link */
    int32_t *tok;             /* [n_prompt + max_new]: prompt, then generated tokens */
    int n_prompt, n_gen, max_new; /* max_new = max_tokens clipped to the context */
    tern_sampling sp;         /* bias arrays point at owned copies */
    tern_sampler *smp;        /* created at first admission (vocab-sized scratch), kept until the end */
    int32_t *stop;            /* stop ids + model EOS unless ignore_eos */
    int n_stop;
    tern_event_fn on_event;
    void *ctx;
    int (*mask)(void *mask_ctx, float *logits, int n_vocab); /* tern_request.mask (optional) */
    void *mask_ctx;
    double t_submit, t_admit, t_first;
    /* scheduler state */
    int slot;                 /* KV slot, -1 while waiting */
    int n_past;               /* tokens whose K/V is in the cache */
    int n_cached;             /* prompt tokens served by the prefix cache (first admission) */
    int admitted;             /* admitted at least once */
    uint64_t admit_seq;       /* larger = admitted more recently */
    int cancel;
    int rows;                 /* rows in the batch being built */
    int n_reg;                /* full blocks already offered to the prefix cache */
    uint64_t chain;           /* prefix-cache hash chain through those blocks */
    /* speculative decoding (prompt lookup, spec.h) */
    int spec_k;               /* max draft tokens per step; 0 = off */
    int spec_d;               /* draft tokens in the batch being built (rows = 1 + spec_d) */
    int logit_row;            /* first logits row of this request in the step */
    int32_t draft[TERN_SPEC_MAX_K];
} tern__req;

typedef struct tern_sched tern_sched;

typedef struct tern_sched_opts {
    int max_concurrency;      /* = KV slots */
    int max_batch_tokens;     /* rows per step (>= max_concurrency) */
    int prefix_blocks;        /* prefix-cache capacity in KV blocks; 0 = off */
    const int32_t *eos;       /* the engine's stop set (text/stops.h), at most 32 ids; */
    int n_eos;                /* n_eos == 0: the config's EOS ids */
    int spec_k;               /* default speculative_k of requests that ask for it (< 0) */
} tern_sched_opts;

/* The scheduler borrows the model and the KV pool (which must have max_concurrency slots). */
tern_status tern__sched_open(tern_sched **out, tern_model *m, tern_kv *kv, const tern_sched_opts *o, tern_error *err);
void tern__sched_close(tern_sched *s);   /* requests still held are freed without events */

/* Validate a public request and build the internal one (thread-safe: reads only immutable
 * facts). TERN_EINVAL with a message naming the field. */
tern_status tern__req_new(const tern_sched *s, const tern_request *r, tern__req **out, tern_error *err);
void tern__req_free(tern__req *r);

/* Append drained submissions (FCFS list linked through q.next) and apply cancellations. */
void tern__sched_add(tern_sched *s, tern__qitem *list, const uint64_t *cancel, int n_cancel);
/* One step: finish cancelled, admit, build the batch, forward, sample, emit events.
 * Returns the number of requests that finished in *n_done. */
tern_status tern__sched_step(tern_sched *s, int *n_done, tern_error *err);
/* End every held request as cancelled (events delivered). Returns how many. */
int tern__sched_cancel_all(tern_sched *s);
int tern__sched_busy(const tern_sched *s);   /* running + waiting > 0 */
/* Fill running/waiting, counters and KV usage (prefix_hit_rate too). */
void tern__sched_stats(const tern_sched *s, tern_engine_stats *st);

#endif
