/*
 * sched.c — continuous batching (see sched.h for the policy).
 *
 * Per request the only state that matters is n_past (tokens whose K/V is cached) against
 * n_tok = n_prompt + n_gen (tokens known). need = n_tok - n_past rows remain to be fed: 1 is
 * a decode row, more is (re)prefill. The row that reaches n_tok asks for logits and the next
 * token is sampled from it. A preempted request just drops to n_past = 0 (or its cached
 * prefix) and is fed prompt + generated tokens again; its RNG counter is the token index, so
 * the recomputation samples the very tokens it would have sampled anyway.
 *
 * Layout of a step: sweep cancellations -> admit (FCFS, free slots) -> build rows in admission
 * order (decode rows always; prefill chunks from the budget left by the decode rows), reserving
 * KV as we go and preempting from the newest end on TERN_ENOMEM -> one forward -> advance
 * n_past, trim sliding windows -> sample and emit events for the rows that asked for logits.
 * Sampling: one tern_sampler (src/sample) per request, created at its first admission (so
 * queued requests hold no vocab-sized scratch) and fed the prompt as penalty history; its RNG
 * counter is the position of the token being drawn.
 * On-device sampling: when the model's backend can draw (tern_model_can_sample), every logits
 * row whose sampler allows it (no mask hook, no logprobs; draft rows only without penalty
 * history) is described by tern_sampler_device_row() and drawn on the device: the forward
 * returns its token instead of its logits, the very token tern_sampler_sample() would draw.
 * The other rows keep the logits path. TERN_DEVICE_SAMPLE=0 in the environment turns it off.
 * The pipelined decode (TERN_ASYNC, generate.h tern_async_decode): a step whose rows are all decode rows drawn on the
 * device is launched without waiting (tern_model_decode_launch), and while it runs the next step of the same requests
 * is queued with its draws as tokens (they stay on the device), so the GPU does not wait for the host's events, stops
 * and bookkeeping between steps. Only when nothing would change the batch (fly_next): no request ends with the step in
 * flight by length, none is cancelled, speculates or has a penalty history (the draw after next needs this one
 * accepted), nobody waits for a free slot, the KV takes one more row each. A request that ends by a stop id or its
 * callback while the next step runs leaves a dead row in it (dropped; its KV entry lies past the sequence); the
 * pipeline then drains and the next step is planned as usual. Same tokens as the plain loop. Every such step of at
 * least TERN_ASYNC_ROWS decode rows (default 1) starts a pipeline. H200, llama3-8b 128 + 128 dec tok/s off / on:
 * session 42 (bench/NOTES.md (bb)), two step graphs a batch size (one a parity): bf16 64 sequences 11557 / 11537 ->
 * 11684 / 11781, but 1 and 8 sequences -0.2..-0.5 % (q4 too), so the default was 32 rows; session 43 (NOTES (bc)),
 * one graph for both parities (graph.c retargets its ids copy between two staging halves): bf16 1 / 8 / 64 sequences
 * 231.3 / 230.4, 1204 / 1196, 11458 / 11351 -> 232.8 / 233.1, 1211 / 1216, 11487 / 11438; q4 373.3 / 371.7, 2344 /
 * 2332, 11980 / 12083 -> 374.5 / 373.7, 2338 / 2342, 12173 / 12173 — no loss at any size, hence 1.
 */
#include "runtime/sched.h"
#include "runtime/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tern_sched {
    tern_model *m;
    tern_kv *kv;
    int V, n_slots, budget, max_ctx;
    int spec_default;          /* tern_sched_opts.spec_k */
    int eos[32], n_eos;        /* tern_sched_opts.eos, else the config's EOS */
    tern__req **run;           /* [n_slots] running, in admission order (newest last) */
    int n_run;
    tern__req *wait_head, *wait_tail;
    int n_wait;
    int *free_slots, n_free;
    uint64_t admit_counter;
    /* step buffers */
    int32_t *b_tok, *b_pos, *b_slot;
    uint8_t *b_want;
    tern__req **b_req;         /* [n_slots] requests that asked for logits, in row order */
    float *logits;             /* [logit_cap, V] */
    int logit_cap;             /* n_slots; grown once (to n_slots * (1 + max k)) by speculation */
    int spec_max;              /* largest speculative_k of any request seen */
    int dev_on;                /* on-device sampling (see the top of this file) */
    tern_sample_row *srows;    /* [n_slots * (1 + TERN_SPEC_MAX_K)] one per logits row */
    tern_sample_pair *spairs;  /* [TERN_MODEL_SAMPLE_PAIRS] their lists */
    int32_t *sids;             /* [n_slots * (1 + TERN_SPEC_MAX_K)] tokens drawn on the device */
    /* the pipelined decode (see the top): the step in flight, by parity */
    int async_on;              /* tern_async_decode() at open, with device sampling */
    int async_rows;            /* TERN_ASYNC_ROWS at open (default 1): the fewest decode rows that start a pipeline */
    int fly_n, fly_par;        /* rows of the step in flight (0: none) and its parity */
    uint64_t fly_key[2];
    tern__req **fly_req[2];    /* [n_slots] its requests in row order (NULL: ended while it ran) */
    int32_t *fly_ids[2];       /* [n_slots] its draws */
    int32_t top_ids[TERN_MAX_LOGPROBS];   /* event views of the sampler's top list */
    float top_lp[TERN_MAX_LOGPROBS];
    int cap_blocks[2];         /* KV blocks of each group (0 full, 1 sliding; 0 = group absent) */
    tern_prefix *pc;           /* NULL: no prefix cache */
    int32_t *match, *smatch;   /* [max_ctx / block_size + 1] matched block ids (full, sliding) */
    /* counters */
    long long n_done, n_cancelled, n_failed, prompt_tokens, cached_tokens, gen_tokens, n_preempt;
    long long spec_drafted, spec_accepted;
    long long n_steps, n_queued;
};

/* ---- requests ---------------------------------------------------------------------- */

void tern__req_free(tern__req *r) {
    if (!r) return;
    tern_sampler_free(r->smp);
    free(r->tok);
    free(r->stop);
    free((void *)r->sp.bias_ids);
    free((void *)r->sp.bias_values);
    free(r);
}

static int bad_float(float x, float lo, float hi) { return !(x >= lo && x <= hi); } /* NaN -> bad */

tern_status tern__req_new(const tern_sched *s, const tern_request *q, tern__req **out, tern_error *err) {
    *out = NULL;
    if (!q) return tern_err(err, TERN_EINVAL, "request: NULL");
    const tern_sampling *sp = &q->sampling;
    int V = s->V;
    if (!q->prompt || q->n_prompt <= 0) return tern_err(err, TERN_EINVAL, "request.prompt: empty (n_prompt = %d)", q->n_prompt);
    if (q->n_prompt > s->max_ctx)
        return tern_err(err, TERN_EINVAL, "request.n_prompt: %d tokens exceed the context limit %d", q->n_prompt, s->max_ctx);
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= V)
            return tern_err(err, TERN_EINVAL, "request.prompt[%d]: token id %d outside the vocabulary [0, %d)", i, q->prompt[i], V);
    if (q->max_tokens < 0) return tern_err(err, TERN_EINVAL, "request.max_tokens: %d is negative", q->max_tokens);
    if (bad_float(sp->temperature, 0.f, 100.f))
        return tern_err(err, TERN_EINVAL, "sampling.temperature: %g outside [0, 100]", (double)sp->temperature);
    if (sp->top_k < 0) return tern_err(err, TERN_EINVAL, "sampling.top_k: %d is negative", sp->top_k);
    if (bad_float(sp->top_p, 0.f, 1.f) || sp->top_p == 0.f)
        return tern_err(err, TERN_EINVAL, "sampling.top_p: %g outside (0, 1]", (double)sp->top_p);
    if (bad_float(sp->min_p, 0.f, 1.f)) return tern_err(err, TERN_EINVAL, "sampling.min_p: %g outside [0, 1]", (double)sp->min_p);
    if (bad_float(sp->repetition_penalty, 0.f, 100.f) || sp->repetition_penalty == 0.f)
        return tern_err(err, TERN_EINVAL, "sampling.repetition_penalty: %g outside (0, 100]", (double)sp->repetition_penalty);
    if (bad_float(sp->presence_penalty, -2.f, 2.f))
        return tern_err(err, TERN_EINVAL, "sampling.presence_penalty: %g outside [-2, 2]", (double)sp->presence_penalty);
    if (bad_float(sp->frequency_penalty, -2.f, 2.f))
        return tern_err(err, TERN_EINVAL, "sampling.frequency_penalty: %g outside [-2, 2]", (double)sp->frequency_penalty);
    if (sp->penalty_last_n < -1 || sp->penalty_last_n > (1 << 20))
        return tern_err(err, TERN_EINVAL, "sampling.penalty_last_n: %d outside [-1, 1048576] (-1 = whole sequence)", sp->penalty_last_n);
    if (sp->n_logprobs < 0 || sp->n_logprobs > TERN_MAX_LOGPROBS)
        return tern_err(err, TERN_EINVAL, "sampling.n_logprobs: %d outside [0, %d]", sp->n_logprobs, TERN_MAX_LOGPROBS);
    if (sp->n_bias < 0 || sp->n_bias > V || (sp->n_bias > 0 && (!sp->bias_ids || !sp->bias_values)))
        return tern_err(err, TERN_EINVAL, "sampling.n_bias: %d (needs bias_ids and bias_values, at most n_vocab)", sp->n_bias);
    for (int i = 0; i < sp->n_bias; i++) {
        if (sp->bias_ids[i] < 0 || sp->bias_ids[i] >= V)
            return tern_err(err, TERN_EINVAL, "sampling.bias_ids[%d]: token id %d outside the vocabulary [0, %d)", i, sp->bias_ids[i], V);
        if (isnan(sp->bias_values[i]) || sp->bias_values[i] == INFINITY)
            return tern_err(err, TERN_EINVAL, "sampling.bias_values[%d]: %g is not a usable bias", i, (double)sp->bias_values[i]);
    }
    if (q->speculative_k > TERN_SPEC_MAX_K)
        return tern_err(err, TERN_EINVAL, "request.speculative_k: %d above the maximum %d", q->speculative_k, TERN_SPEC_MAX_K);
    if (q->n_stop_ids < 0 || q->n_stop_ids > 1024 || (q->n_stop_ids > 0 && !q->stop_ids))
        return tern_err(err, TERN_EINVAL, "request.n_stop_ids: %d (at most 1024, needs stop_ids)", q->n_stop_ids);
    for (int i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] < 0 || q->stop_ids[i] >= V)
            return tern_err(err, TERN_EINVAL, "request.stop_ids[%d]: token id %d outside the vocabulary [0, %d)", i, q->stop_ids[i], V);

    /* memory honesty: a prompt the whole KV pool cannot hold is refused now, not after a wait */
    for (int g = 0; g < 2; g++) {
        int need = tern_kv_blocks_needed(s->kv, g, q->n_prompt + 1, s->budget);
        if (s->cap_blocks[g] && need > s->cap_blocks[g])
            return tern_err(err, TERN_ENOMEM, "request.n_prompt: %d tokens need %d KV blocks (%s layers), the pool holds %d "
                            "in all (raise --kv-memory / --memory-budget or shorten the prompt)", q->n_prompt, need,
                            g ? "sliding" : "full", s->cap_blocks[g]);
    }
    tern__req *r = calloc(1, sizeof *r);
    if (!r) return tern_err(err, TERN_ENOMEM, "request: out of memory");
    r->n_prompt = q->n_prompt;
    r->max_new = TERN_MIN(q->max_tokens, s->max_ctx - q->n_prompt);
    /* ... and generation stops (LENGTH) where the whole pool would be full */
    if (s->cap_blocks[0]) r->max_new = TERN_MIN(r->max_new, s->cap_blocks[0] * tern_kv_block_size(s->kv) - q->n_prompt);
    r->sp = *sp;
    r->sp.bias_ids = NULL;
    r->sp.bias_values = NULL;
    r->on_event = q->on_event;
    r->ctx = q->ctx;
    r->mask = q->mask;
    r->mask_ctx = q->mask_ctx;
    r->slot = -1;
    r->spec_k = q->speculative_k < 0 ? s->spec_default : q->speculative_k;
    r->t_submit = tern_time_s();
    int n_stop = q->n_stop_ids + (q->ignore_eos ? 0 : s->n_eos);
    r->tok = malloc(sizeof(int32_t) * (size_t)(r->n_prompt + r->max_new));
    r->stop = malloc(sizeof(int32_t) * (size_t)(n_stop + 1));
    int32_t *bi = sp->n_bias ? malloc(sizeof(int32_t) * (size_t)sp->n_bias) : NULL;
    float *bv = sp->n_bias ? malloc(sizeof(float) * (size_t)sp->n_bias) : NULL;
    r->sp.bias_ids = bi;
    r->sp.bias_values = bv;
    if (!r->tok || !r->stop || (sp->n_bias && (!bi || !bv))) {
        tern__req_free(r);
        return tern_err(err, TERN_ENOMEM, "request: out of memory");
    }
    memcpy(r->tok, q->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (sp->n_bias) {
        memcpy(bi, sp->bias_ids, sizeof(int32_t) * (size_t)sp->n_bias);
        memcpy(bv, sp->bias_values, sizeof(float) * (size_t)sp->n_bias);
    }
    if (q->n_stop_ids) memcpy(r->stop, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    r->n_stop = q->n_stop_ids;
    for (int i = 0; !q->ignore_eos && i < s->n_eos; i++) r->stop[r->n_stop++] = s->eos[i];
    *out = r;
    return TERN_OK;
}

/* ---- open / close ------------------------------------------------------------------ */

tern_status tern__sched_open(tern_sched **out, tern_model *m, tern_kv *kv, const tern_sched_opts *o, tern_error *err) {
    *out = NULL;
    const tern_model_config *c = tern_model_cfg(m);
    tern_sched *s = calloc(1, sizeof *s);
    if (!s) return tern_err(err, TERN_ENOMEM, "scheduler: out of memory");
    s->m = m;
    s->kv = kv;
    s->V = c->n_vocab;
    s->n_slots = tern_kv_n_slots(kv);
    s->max_ctx = tern_kv_max_ctx(kv);
    s->budget = TERN_MAX(o->max_batch_tokens, s->n_slots);
    s->spec_default = TERN_MAX(0, TERN_MIN(o->spec_k, TERN_SPEC_MAX_K));
    s->logit_cap = s->n_slots;
    for (int i = 0; i < o->n_eos && i < 32; i++)
        if (o->eos[i] >= 0 && o->eos[i] < s->V) s->eos[s->n_eos++] = o->eos[i];
    for (int i = 0; !o->n_eos && i < c->n_eos && i < 8; i++)
        if (c->eos_ids[i] >= 0 && c->eos_ids[i] < s->V) s->eos[s->n_eos++] = c->eos_ids[i];
    for (int g = 0; g < 2; g++) {
        int used = 0;
        if (tern_kv_has_group(kv, g)) tern_kv_usage(kv, g, &used, &s->cap_blocks[g]);
    }
    size_t B = (size_t)s->budget, S = (size_t)s->n_slots;
    s->run = calloc(S, sizeof *s->run);
    s->free_slots = malloc(sizeof(int) * S);
    s->b_tok = malloc(sizeof(int32_t) * B);
    s->b_pos = malloc(sizeof(int32_t) * B);
    s->b_slot = malloc(sizeof(int32_t) * B);
    s->b_want = malloc(B);
    s->b_req = calloc(S, sizeof *s->b_req);
    s->logits = malloc(sizeof(float) * S * (size_t)s->V);
    if (tern_device_sampling(m)) {
        size_t nr = S * (1 + TERN_SPEC_MAX_K);
        s->srows = calloc(nr, sizeof *s->srows);
        s->sids = calloc(nr, sizeof *s->sids);
        s->spairs = malloc(sizeof *s->spairs * TERN_MODEL_SAMPLE_PAIRS);
        s->dev_on = s->srows && s->sids && s->spairs; /* without them: the logits path */
        for (int p = 0; p < 2; p++) {
            s->fly_req[p] = calloc(S, sizeof *s->fly_req[p]);
            s->fly_ids[p] = calloc(S, sizeof *s->fly_ids[p]);
        }
        s->async_on = s->dev_on && tern_async_decode(m) && s->fly_req[0] && s->fly_req[1] && s->fly_ids[0] && s->fly_ids[1];
        const char *ar = getenv("TERN_ASYNC_ROWS");
        s->async_rows = ar && ar[0] ? TERN_MAX(1, atoi(ar)) : 1;
    }
    tern_status st = TERN_OK;
    if (!s->run || !s->free_slots || !s->b_tok || !s->b_pos || !s->b_slot || !s->b_want || !s->b_req || !s->logits)
        st = tern_err(err, TERN_ENOMEM, "scheduler: out of memory for %d slots x %d rows (vocab %d)", s->n_slots, s->budget, s->V);
    if (!st) st = tern__prefix_open(&s->pc, kv, o->prefix_blocks, err);
    size_t nm = (size_t)(s->max_ctx / tern_kv_block_size(kv) + 1);
    if (!st && s->pc && (!(s->match = malloc(sizeof(int32_t) * nm)) || !(s->smatch = malloc(sizeof(int32_t) * nm))))
        st = tern_err(err, TERN_ENOMEM, "scheduler: out of memory");
    if (st) { tern__sched_close(s); return st; }
    for (int i = 0; i < s->n_slots; i++) s->free_slots[i] = s->n_slots - 1 - i;
    s->n_free = s->n_slots;
    *out = s;
    return TERN_OK;
}

static void fly_drain(tern_sched *s);

void tern__sched_close(tern_sched *s) {
    if (!s) return;
    fly_drain(s);
    for (int i = 0; i < s->n_run; i++) {
        tern_kv_release(s->kv, s->run[i]->slot);
        tern__req_free(s->run[i]);
    }
    for (tern__req *r = s->wait_head, *nx; r; r = nx) { nx = (tern__req *)r->q.next; tern__req_free(r); }
    tern__prefix_close(s->pc);
    free(s->match);
    free(s->smatch);
    free(s->run); free(s->free_slots);
    free(s->b_tok); free(s->b_pos); free(s->b_slot); free(s->b_want); free(s->b_req);
    free(s->logits);
    free(s->srows); free(s->sids); free(s->spairs);
    for (int p = 0; p < 2; p++) { free(s->fly_req[p]); free(s->fly_ids[p]); }
    free(s);
}

/* ---- lists ------------------------------------------------------------------------- */

static void wait_push_back(tern_sched *s, tern__req *r) {
    r->q.next = NULL;
    if (s->wait_tail) s->wait_tail->q.next = &r->q;
    else s->wait_head = r;
    s->wait_tail = r;
    s->n_wait++;
}

static void wait_push_front(tern_sched *s, tern__req *r) {
    r->q.next = s->wait_head ? &s->wait_head->q : NULL;
    if (!s->wait_head) s->wait_tail = r;
    s->wait_head = r;
    s->n_wait++;
}

static tern__req *wait_pop(tern_sched *s) {
    tern__req *r = s->wait_head;
    if (!r) return NULL;
    s->wait_head = (tern__req *)r->q.next;
    if (!s->wait_head) s->wait_tail = NULL;
    r->q.next = NULL;
    s->n_wait--;
    return r;
}

static void run_remove(tern_sched *s, tern__req *r) {
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i] == r) {
            memmove(s->run + i, s->run + i + 1, sizeof *s->run * (size_t)(s->n_run - i - 1));
            s->n_run--;
            return;
        }
}

static void free_slot(tern_sched *s, tern__req *r) {
    if (r->slot < 0) return;
    tern_kv_release(s->kv, r->slot);
    s->free_slots[s->n_free++] = r->slot;
    r->slot = -1;
}

/* ---- events ------------------------------------------------------------------------ */

static int emit(tern__req *r, const tern_event *ev) { return r->on_event ? r->on_event(r->ctx, ev) : 0; }

/* End r (already removed from run / waiting): last event, counters, free. */
static void finish(tern_sched *s, tern__req *r, tern_finish_reason why, const tern_error *e) {
    free_slot(s, r);
    double now = tern_time_s();
    tern_event ev = {.request_id = r->q.id, .finish = why, .n_prompt = r->n_prompt, .n_cached = r->n_cached,
                     .n_generated = r->n_gen, .t_total = now - r->t_submit};
    ev.t_queue = (r->admitted ? r->t_admit : now) - r->t_submit;
    ev.t_first_token = r->t_first > 0 ? r->t_first - r->t_submit : 0;
    if (e) {
        ev.kind = TERN_EV_ERROR;
        ev.err = e;
        s->n_failed++;
    } else {
        ev.kind = TERN_EV_DONE;
        if (why == TERN_FINISH_CANCELLED) s->n_cancelled++;
        else s->n_done++;
    }
    emit(r, &ev);
    tern__req_free(r);
}

static void fail(tern_sched *s, tern__req *r, tern_status code, const char *msg) {
    tern_error e = {.code = code};
    tern_err(&e, code, "request %llu: %s", (unsigned long long)r->q.id, msg);
    finish(s, r, TERN_FINISH_NONE, &e);
}

/* ---- admission, cancellation, preemption ------------------------------------------- */

void tern__sched_add(tern_sched *s, tern__qitem *list, const uint64_t *cancel, int n_cancel) {
    for (tern__qitem *it = list, *nx; it; it = nx) {
        nx = it->next;
        tern__req *r = (tern__req *)it;
        r->cancel = it->cancelled;
        wait_push_back(s, r);
    }
    for (int k = 0; k < n_cancel; k++) {
        for (int i = 0; i < s->n_run; i++) if (s->run[i]->q.id == cancel[k]) s->run[i]->cancel = 1;
        for (tern__req *r = s->wait_head; r; r = (tern__req *)r->q.next) if (r->q.id == cancel[k]) r->cancel = 1;
    }
}

static int sweep_cancelled(tern_sched *s) {
    int n = 0;
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i]->cancel) { tern__req *r = s->run[i]; run_remove(s, r); i--; finish(s, r, TERN_FINISH_CANCELLED, NULL); n++; }
    tern__req *prev = NULL;
    for (tern__req *r = s->wait_head, *nx; r; r = nx) {
        nx = (tern__req *)r->q.next;
        if (!r->cancel) { prev = r; continue; }
        if (prev) prev->q.next = nx ? &nx->q : NULL;
        else s->wait_head = nx;
        if (!nx) s->wait_tail = prev;
        s->n_wait--;
        finish(s, r, TERN_FINISH_CANCELLED, NULL);
        n++;
    }
    return n;
}

int tern__sched_cancel_all(tern_sched *s) {
    fly_drain(s); /* its draws are dropped: every request ends here */
    for (int i = 0; i < s->n_run; i++) s->run[i]->cancel = 1;
    for (tern__req *r = s->wait_head; r; r = (tern__req *)r->q.next) r->cancel = 1;
    return sweep_cancelled(s);
}

/* Sampler mask hook -> the request's own constrained-decoding callback. */
static bool req_mask(void *user, float *logits, int n_vocab) {
    tern__req *r = user;
    return r->mask(r->mask_ctx, logits, n_vocab) == 0;
}

/* Blocks of group g that r still needs to run its next step of `rows` rows, beyond what its slot
 * holds: the full group counts the whole sequence + 1 (admission by aggregate KV); a sliding
 * group only the window and the step's rows (none when r gets no rows this step). */
static int growth(const tern_sched *s, const tern__req *r, int g, int rows) {
    if (g == 1 && rows <= 0) return 0;
    int need = tern_kv_blocks_needed(s->kv, g, r->n_prompt + r->n_gen + 1, TERN_MAX(rows, 1));
    int held = tern_kv_slot_blocks(s->kv, g, r->slot);
    return need > held ? need - held : 0;
}

/* Rows the next step gives r, as tern__sched_step splits the budget: a decode row each, then
 * prefill chunks in admission order from what the decode rows leave (*pre counts it down). */
static int step_rows(const tern_sched *s, const tern__req *r, int *pre) {
    int need = r->n_prompt + r->n_gen - r->n_past;
    if (need <= 1) return need;
    int rows = TERN_MAX(0, TERN_MIN(need, *pre));
    *pre -= rows;
    return rows;
}

/* Admission by aggregate KV: r (slot assigned, cached prefix shared) starts only if the free
 * blocks cover its next step plus the next step of everything running (the step's rows split
 * as the step will: the sliding pool holds one chunk for all, kv.h tern_kv_pool_blocks); idle
 * prefix-cache blocks are evicted to make room. Alone it always starts (submit refused what
 * never fits). */
static int fits(tern_sched *s, const tern__req *r) {
    int n_dec = r->n_prompt + r->n_gen - r->n_past == 1;
    for (int i = 0; i < s->n_run; i++) n_dec += s->run[i]->n_prompt + s->run[i]->n_gen - s->run[i]->n_past == 1;
    for (int g = 0; g < 2; g++) {
        if (!s->cap_blocks[g]) continue;
        int pre = s->budget - n_dec, want = 0;
        for (int i = 0; i < s->n_run; i++) want += growth(s, s->run[i], g, step_rows(s, s->run[i], &pre));
        want += growth(s, r, g, step_rows(s, r, &pre));
        int avail = tern_kv_free_blocks(s->kv, g);
        while (want > avail && g == 1 && tern__prefix_drop_sliding(s->pc, want - avail) > 0) avail = tern_kv_free_blocks(s->kv, g);
        while (want > avail && tern__prefix_evict(s->pc, want - avail) > 0) avail = tern_kv_free_blocks(s->kv, g);
        if (want > avail && s->n_run > 0) return 0;
    }
    return 1;
}

static int admit(tern_sched *s) {
    int n = 0;
    while (s->n_free > 0 && s->wait_head) {
        tern__req *r = wait_pop(s);
        if (!r->smp && r->max_new > 0) {
            /* the sampler is created on first admission; the prompt is its penalty history */
            tern_sampler_params sp = tern_sampler_defaults();
            sp.temperature = r->sp.temperature;
            sp.top_k = r->sp.top_k;
            sp.top_p = r->sp.top_p;
            sp.min_p = r->sp.min_p;
            sp.repetition_penalty = r->sp.repetition_penalty;
            sp.presence_penalty = r->sp.presence_penalty;
            sp.frequency_penalty = r->sp.frequency_penalty;
            sp.penalty_last_n = r->sp.penalty_last_n >= 0 ? r->sp.penalty_last_n
                                                          : TERN_MIN(r->n_prompt + r->max_new, 1 << 20);
            sp.seed = r->sp.seed;
            sp.bias_ids = r->sp.bias_ids;
            sp.bias_values = r->sp.bias_values;
            sp.n_bias = r->sp.n_bias;
            sp.logprobs = r->sp.n_logprobs > 0;
            sp.top_logprobs = r->sp.n_logprobs;
            tern_error e = {0};
            if (tern_sampler_new(&sp, s->V, &r->smp, &e)) { finish(s, r, TERN_FINISH_NONE, &e); n++; continue; }
            for (int i = 0; i < r->n_prompt; i++) tern_sampler_accept(r->smp, r->tok[i]);
            if (r->mask) tern_sampler_set_mask(r->smp, req_mask, r);
        }
        r->slot = s->free_slots[--s->n_free];
        r->admit_seq = ++s->admit_counter;
        r->n_past = 0;
        r->n_reg = 0;
        r->chain = tern__prefix_seed();
        if (s->pc && r->max_new > 0) {
            /* reuse whole cached blocks, but always recompute the last known token */
            int n_tok = r->n_prompt + r->n_gen, bs = tern_kv_block_size(s->kv);
            uint64_t chain;
            int k = tern__prefix_match(s->pc, r->tok, n_tok, (n_tok - 1) / bs, s->match, s->smatch, &chain);
            if (k > 0 && !tern_kv_share_prefix(s->kv, r->slot, s->match, s->smatch, k, NULL)) {
                r->n_past = k * bs;
                r->n_reg = k;
                r->chain = chain;
            }
        }
        if (r->max_new > 0 && !fits(s, r)) {   /* wait at the head of the queue (FCFS) */
            free_slot(s, r);
            r->n_past = 0;
            wait_push_front(s, r);
            break;
        }
        if (!r->admitted) {
            r->admitted = 1;
            r->t_admit = tern_time_s();
            r->n_cached = TERN_MIN(r->n_past, r->n_prompt);
            s->prompt_tokens += r->n_prompt;
            s->cached_tokens += r->n_cached;
        }
        if (r->max_new == 0) { finish(s, r, TERN_FINISH_LENGTH, NULL); n++; continue; }
        s->run[s->n_run++] = r;
    }
    return n;
}

static void preempt(tern_sched *s, tern__req *r) {
    if (r->n_past > 0) s->n_preempt++;   /* count only evictions that throw work away */
    run_remove(s, r);
    free_slot(s, r);
    r->n_past = 0;
    r->rows = 0;
    r->n_reg = 0;
    wait_push_front(s, r);
    tern_log(TERN_LOG_INFO, "sched: preempted request %llu (%d tokens to recompute)", (unsigned long long)r->q.id,
             r->n_prompt + r->n_gen);
}

/* ---- one step ---------------------------------------------------------------------- */

/* k more of r's rows are in the cache: offer full blocks to the prefix cache before trim drops the sliding blocks it
 * keeps too */
static void rows_cached(tern_sched *s, tern__req *r, int k) {
    r->n_past += k;
    tern__prefix_insert(s->pc, r->slot, r->tok, r->n_past, &r->n_reg, &r->chain);
    tern_kv_trim(s->kv, r->slot, r->n_past);
}

/* Reserve KV for r's rows, preempting or shrinking as sched.h says. Returns the rows to run
 * (0: r left the running set: preempted, or finished into *n_done). */
static int reserve_rows(tern_sched *s, int i, int rows, int *n_done) {
    tern__req *r = s->run[i];
    for (;;) {
        tern_error e = {0};
        tern_status st = tern_kv_reserve(s->kv, r->slot, r->n_past + rows, &e);
        if (!st) return rows;
        if (st != TERN_ENOMEM) { run_remove(s, r); finish(s, r, TERN_FINISH_NONE, &e); (*n_done)++; return 0; }
        int ws = tern_kv_blocks_needed(s->kv, 1, r->n_past + rows, rows) - tern_kv_slot_blocks(s->kv, 1, r->slot);
        if (ws > tern_kv_free_blocks(s->kv, 1) && tern__prefix_drop_sliding(s->pc, ws - tern_kv_free_blocks(s->kv, 1)) > 0) continue;
        if (tern__prefix_evict(s->pc, rows / tern_kv_block_size(s->kv) + 1) > 0) continue;
        if (s->n_run - 1 > i) { preempt(s, s->run[s->n_run - 1]); continue; }
        if (rows > 1) { rows /= 2; continue; }
        if (i > 0) { preempt(s, r); return 0; }
        run_remove(s, r);
        if (r->n_gen > 0) finish(s, r, TERN_FINISH_LENGTH, NULL);
        else fail(s, r, TERN_ENOMEM, "the KV pool is too small for this prompt");
        (*n_done)++;
        return 0;
    }
}

/* Sample r's next token from its logits row (or take the token the device drew: logits NULL,
 * dev_id) and emit; 1 if r finished (r is freed then). *tok_out: the token drawn. */
static int advance(tern_sched *s, tern__req *r, float *logits, int32_t dev_id, int *tok_out) {
    tern_sample_result so;
    tern_error e = {0};
    if (logits ? tern_sampler_sample(r->smp, logits, (uint64_t)(r->n_prompt + r->n_gen), &so, &e)
               : tern_sampler_device_result(r->smp, dev_id, &so, &e)) {
        run_remove(s, r);
        finish(s, r, TERN_FINISH_NONE, &e);
        return 1;
    }
    int tok = so.id;
    *tok_out = tok;
    if (r->t_first <= 0) r->t_first = tern_time_s();
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop[i] == tok) { run_remove(s, r); finish(s, r, TERN_FINISH_STOP, NULL); return 1; }
    r->tok[r->n_prompt + r->n_gen++] = tok;
    tern_sampler_accept(r->smp, tok);
    s->gen_tokens++;
    for (int i = 0; i < so.n_top; i++) { s->top_ids[i] = so.top[i].id; s->top_lp[i] = so.top[i].logprob; }
    tern_event ev = {.kind = TERN_EV_TOKEN, .request_id = r->q.id, .token = tok, .logprob = so.logprob,
                     .n_top = so.n_top, .top_ids = s->top_ids, .top_logprobs = s->top_lp};
    int rc = emit(r, &ev);
    tern_finish_reason why = rc == 1 ? TERN_FINISH_CANCELLED : rc == 2 ? TERN_FINISH_STOP
                           : r->n_gen >= r->max_new ? TERN_FINISH_LENGTH : TERN_FINISH_NONE;
    if (why == TERN_FINISH_NONE) return 0;
    run_remove(s, r);
    finish(s, r, why, NULL);
    return 1;
}

/* Draw from r's rows [last token, draft...] in order (sched.h): accept draft[j] while the
 * draw equals it; then roll the KV back to the accepted length and commit. 1 if r finished. */
static int verify(tern_sched *s, tern__req *r, float *rows, const int32_t *ids) {
    int d = r->spec_d, a = 0, tok = -1;
    r->spec_d = 0;
    s->spec_drafted += d;
    for (int j = 0; j <= d; j++) {
        if (advance(s, r, ids ? NULL : rows + (size_t)j * s->V, ids ? ids[j] : 0, &tok)) {
            s->spec_accepted += a;
            return 1;
        }
        if (j == d || tok != r->draft[j]) break;
        a++;
    }
    s->spec_accepted += a;
    /* K/V of positions < n_past + a hold exactly the accepted tokens; the rest is forgotten */
    tern_error e = {0};
    if (tern_kv_truncate(s->kv, r->slot, r->n_past + a, &e)) {
        run_remove(s, r);
        finish(s, r, TERN_FINISH_NONE, &e);
        return 1;
    }
    rows_cached(s, r, a);
    return 0;
}

/* Give decode rows of speculating requests a draft from the budget left (rows are already
 * reserved for everything else; a draft that does not fit in the KV pool is dropped). */
static void plan_drafts(tern_sched *s, int budget_left, int n_want) {
    for (int i = 0; i < s->n_run && budget_left > 0; i++) {
        tern__req *r = s->run[i];
        int n_tok = r->n_prompt + r->n_gen;
        r->spec_d = 0;
        if (!r->spec_k || r->rows != 1 || n_tok - r->n_past != 1) continue;
        if (r->spec_k > s->spec_max) s->spec_max = r->spec_k;
        if (s->logit_cap < s->n_slots * (1 + s->spec_max)) {   /* once per new max k, never in steady state */
            int cap = s->n_slots * (1 + s->spec_max);
            float *nl = realloc(s->logits, sizeof(float) * (size_t)cap * (size_t)s->V);
            if (nl) { s->logits = nl; s->logit_cap = cap; }
        }
        int k = TERN_MIN(r->spec_k, r->max_new - r->n_gen - 1);   /* d accepted + 1 drawn <= what is left */
        k = TERN_MIN(k, TERN_MIN(budget_left, s->logit_cap - n_want));
        int d = tern__spec_draft(r->tok, n_tok, k, r->draft);
        if (d <= 0 || tern_kv_reserve(s->kv, r->slot, n_tok + d, NULL)) continue;
        r->spec_d = d;
        r->rows += d;
        budget_left -= d;
        n_want += d;
    }
}

/* Describe the step's logits rows for on-device sampling: a request's rows [last token,
 * draft...] are all drawn on the device or none is. Returns 1 when some row is. */
static int device_rows(tern_sched *s, int nw, int nl, int *n_pairs) {
    *n_pairs = 0;
    if (!s->dev_on) return 0;
    int any = 0;
    for (int k = 0; k < nl; k++) s->srows[k].mode = TERN_SAMPLE_SKIP;
    for (int w = 0; w < nw; w++) {
        tern__req *r = s->b_req[w];
        int d = r->spec_d, np0 = *n_pairs, ok = 1;
        if (d && tern_sampler_uses_history(r->smp)) continue; /* draft j+1 needs token j accepted first */
        for (int j = 0; j <= d && ok; j++)
            ok = tern_sampler_device_row(r->smp, (uint64_t)(r->n_prompt + r->n_gen + j), &s->srows[r->logit_row + j],
                                         s->spairs, n_pairs, TERN_MODEL_SAMPLE_PAIRS);
        if (!ok) {
            for (int j = 0; j <= d; j++) s->srows[r->logit_row + j].mode = TERN_SAMPLE_SKIP;
            *n_pairs = np0;
            continue;
        }
        any = 1;
    }
    return any;
}

/* ---- the pipelined decode (see the top) ------------------------------------------------ */

/* wait for the step in flight and drop its draws (close, cancel_all) */
static void fly_drain(tern_sched *s) {
    if (!s->fly_n) return;
    const tern_batch_sample smp = {.ids = s->fly_ids[s->fly_par]};
    tern_model_decode_wait(s->m, s->fly_key[s->fly_par], s->fly_n, &smp);
    s->fly_n = 0;
}

/* Queue the step after the one in flight: the same requests' next rows, their tokens the flying step's draws. Only
 * when nothing would change the batch (the top of this file); 1 when queued. */
static int fly_next(tern_sched *s) {
    const int p = s->fly_par, q = p ^ 1, n = s->fly_n;
    tern__req **R = s->fly_req[p];
    if (!s->async_on || n != s->n_run || (s->n_wait > 0 && s->n_free > 0)) return 0;
    int np = 0;
    for (int i = 0; i < n; i++) {
        tern__req *r = R[i]; /* its row in flight is at n_past and draws token n_gen */
        if (!r || r->cancel || r->spec_k || r->n_gen + 2 > r->max_new || tern_sampler_uses_history(r->smp)) return 0;
        if (!tern_sampler_device_row(r->smp, (uint64_t)(r->n_prompt + r->n_gen + 1), &s->srows[i], s->spairs, &np,
                                     TERN_MODEL_SAMPLE_PAIRS) ||
            tern_kv_reserve(s->kv, r->slot, r->n_past + 2, NULL))
            return 0;
        s->b_pos[i] = r->n_past + 1;
        s->b_slot[i] = r->slot;
    }
    const tern_batch b = {.n = n, .pos = s->b_pos, .slot = s->b_slot};
    const tern_batch_sample smp = {.rows = s->srows, .pairs = s->spairs, .n_pairs = np, .ids = s->fly_ids[q]};
    if (!tern_model_decode_launch(s->m, &b, s->kv, q, &smp, &s->fly_key[q])) return 0;
    memcpy(s->fly_req[q], R, sizeof *R * (size_t)n);
    s->n_queued++;
    return 1;
}

/* Take the step in flight: queue the next one first (fly_next), wait, then each request's row is in the cache (n_past,
 * prefix cache, trim) and its draw advances it (events); one that ends leaves a dead row in the queued step. Returns
 * the requests that finished. */
static int fly_step(tern_sched *s, tern_status *st, tern_error *err) {
    const int p = s->fly_par, q = p ^ 1, n = s->fly_n;
    tern__req **R = s->fly_req[p];
    const int next = fly_next(s);
    int done = 0;
    s->fly_n = 0;
    s->n_steps++;
    const tern_batch_sample smp = {.ids = s->fly_ids[p]};
    if (!tern_model_decode_wait(s->m, s->fly_key[p], n, &smp)) {
        tern_error e = {0};
        *st = tern_err(&e, TERN_EINTERNAL, "pipelined decode: a step of %d decode rows did not complete", n);
        const tern_batch_sample sq = {.ids = s->fly_ids[q]};
        if (next) tern_model_decode_wait(s->m, s->fly_key[q], n, &sq);
        for (int i = 0; i < n; i++)
            if (R[i]) { run_remove(s, R[i]); finish(s, R[i], TERN_FINISH_NONE, &e); done++; }
        if (err) *err = e;
        return done;
    }
    for (int i = 0; i < n; i++) {
        tern__req *r = R[i];
        if (r) rows_cached(s, r, 1); /* trim keeps the queued row's window (from n_past - W + 1 on) */
    }
    for (int i = 0; i < n; i++) {
        int tok;
        if (R[i] && advance(s, R[i], NULL, s->fly_ids[p][i], &tok)) {
            done++;
            if (next) s->fly_req[q][i] = NULL;
        }
    }
    if (next) {
        s->fly_n = n;
        s->fly_par = q;
    }
    return done;
}

/* The planned step's rows are all decode rows drawn on the device (b: nb rows, requests b_req in row order): launch it
 * without waiting and take it as the pipeline's first step. 0: run it the plain way. */
static int fly_start(tern_sched *s, const tern_batch *b, int nw, int nl, int n_pairs) {
    if (!s->async_on || b->n != nw || nl != nw || nw < s->async_rows) return 0;
    for (int k = 0; k < nl; k++)
        if (s->srows[k].mode != TERN_SAMPLE_DRAW) return 0;
    const tern_batch_sample smp = {.rows = s->srows, .pairs = s->spairs, .n_pairs = n_pairs, .ids = s->fly_ids[0]};
    if (!tern_model_decode_launch(s->m, b, s->kv, 0, &smp, &s->fly_key[0])) return 0;
    memcpy(s->fly_req[0], s->b_req, sizeof *s->b_req * (size_t)nw);
    for (int i = 0; i < s->n_run; i++) s->run[i]->rows = 0;
    s->fly_n = nw;
    s->fly_par = 0;
    return 1;
}

tern_status tern__sched_step(tern_sched *s, int *n_done, tern_error *err) {
    if (s->fly_n) { /* the pipeline: no admission or sweep until it drains (fly_next) */
        tern_status st = TERN_OK;
        *n_done = fly_step(s, &st, err);
        return st;
    }
    *n_done = sweep_cancelled(s);
    *n_done += admit(s);
    int n_dec = 0;
    for (int i = 0; i < s->n_run; i++) n_dec += s->run[i]->n_prompt + s->run[i]->n_gen - s->run[i]->n_past == 1;
    int pre_budget = s->budget - n_dec, n_rows = 0, n_want = 0;
    for (int i = 0; i < s->n_run; i++) {   /* reserve decode rows and prefill chunks */
        tern__req *r = s->run[i];
        int n_tok = r->n_prompt + r->n_gen, need = n_tok - r->n_past;
        int rows = need == 1 ? 1 : TERN_MIN(need, pre_budget);
        r->rows = 0;
        r->spec_d = 0;
        if (rows <= 0) continue;
        rows = reserve_rows(s, i, rows, n_done);
        if (!rows) { i--; continue; } /* r left the running set at index i */
        r->rows = rows;
        n_rows += rows;
        n_want += r->n_past + rows == n_tok;
        if (need > 1) pre_budget -= rows;
    }
    plan_drafts(s, s->budget - n_rows, n_want);
    int nb = 0, nw = 0, nl = 0;
    for (int i = 0; i < s->n_run; i++) {   /* lay out the batch in admission order */
        tern__req *r = s->run[i];
        int n_tok = r->n_prompt + r->n_gen;
        for (int j = 0; j < r->rows; j++) {
            int p = r->n_past + j;
            s->b_tok[nb] = p < n_tok ? r->tok[p] : r->draft[p - n_tok];
            s->b_pos[nb] = p;
            s->b_slot[nb] = r->slot;
            s->b_want[nb] = p >= n_tok - 1;
            if (p == n_tok - 1) { s->b_req[nw++] = r; r->logit_row = nl; }
            nl += s->b_want[nb];
            nb++;
        }
    }
    if (nb == 0) return TERN_OK;
    tern_batch b = {.n = nb, .tokens = s->b_tok, .pos = s->b_pos, .slot = s->b_slot, .want = s->b_want};
    tern_error fe = {0};
    tern_batch_sample smp = {.rows = s->srows, .pairs = s->spairs, .ids = s->sids};
    int dev = device_rows(s, nw, nl, &smp.n_pairs);
    if (dev && fly_start(s, &b, nw, nl, smp.n_pairs)) {
        tern_status st = TERN_OK;
        *n_done += fly_step(s, &st, err);
        return st;
    }
    s->n_steps++;
    tern_status st = dev ? tern_model_forward_sample(s->m, &b, s->kv, s->logits, &smp, &fe)
                         : tern_model_forward(s->m, &b, s->kv, s->logits, &fe);
    if (st) {
        for (int i = s->n_run - 1; i >= 0; i--) {
            tern__req *r = s->run[i];
            if (!r->rows) continue;
            run_remove(s, r);
            finish(s, r, TERN_FINISH_NONE, &fe);
            (*n_done)++;
        }
        if (err) *err = fe;
        return st;
    }
    for (int i = 0; i < s->n_run; i++) {
        tern__req *r = s->run[i];
        if (!r->rows) continue;
        rows_cached(s, r, r->rows - r->spec_d);   /* draft rows are tentative until verified */
        r->rows = 0;
    }
    for (int w = 0; w < nw; w++) {
        tern__req *r = s->b_req[w];
        float *row = s->logits + (size_t)r->logit_row * s->V;
        const int32_t *ids = dev && s->srows[r->logit_row].mode == TERN_SAMPLE_DRAW ? s->sids + r->logit_row : NULL;
        int tok;
        *n_done += r->spec_d ? verify(s, r, row, ids) : advance(s, r, ids ? NULL : row, ids ? ids[0] : 0, &tok);
    }
    return TERN_OK;
}

int tern__sched_busy(const tern_sched *s) { return s->n_run + s->n_wait + s->fly_n > 0; }

void tern__sched_stats(const tern_sched *s, tern_engine_stats *st) {
    memset(st, 0, sizeof *st);
    st->running = s->n_run;
    st->waiting = s->n_wait;
    st->requests_done = s->n_done;
    st->requests_cancelled = s->n_cancelled;
    st->requests_failed = s->n_failed;
    st->prompt_tokens = s->prompt_tokens;
    st->cached_tokens = s->cached_tokens;
    st->generated_tokens = s->gen_tokens;
    for (int g = 0; g < 2; g++) {
        int used = 0, total = 0;
        tern_kv_usage(s->kv, g, &used, &total);
        st->kv_blocks_used += used;
        st->kv_blocks_total += total;
    }
    st->preemptions = s->n_preempt;
    st->kv_blocks_cached = tern__prefix_blocks(s->pc);
    st->spec_drafted = s->spec_drafted;
    st->spec_accepted = s->spec_accepted;
    st->steps = s->n_steps;
    st->steps_queued = s->n_queued;
    st->prefix_hit_rate = s->prompt_tokens ? (double)s->cached_tokens / (double)s->prompt_tokens : 0.0;
}
