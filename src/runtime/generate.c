/*
 * generate.c — prefill + decode loop for one sequence (see generate.h). The logits buffer
 * and the per-step arrays are allocated once per call; the decode loop allocates nothing.
 * Greedy without a pick callback draws on the model's device when it can (argmax, lowest id on
 * ties: tern_argmax's rule), so only the id crosses back per step — as the engine's scheduler
 * does; TERN_DEVICE_SAMPLE=0 downloads the logits instead.
 */
#include "runtime/generate.h"

#include <math.h>
#include <stdlib.h>

int tern_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int tern_device_sampling(const tern_model *m) {
    const char *ds = getenv("TERN_DEVICE_SAMPLE");
    return tern_model_can_sample(m) && !(ds && ds[0] == '0');
}

/* TERN_ASYNC (default 1; 0 off; 2 also where steps run at once): device-drawn decode as a pipeline, here and in the
 * engine's scheduler (read at each call, so a test may switch it). H200, session 41 (bench/NOTES.md (ba)): greedy ids the same as the plain loop
 * (llama3 / gemma4_e2b_like / qwen3 fixtures, f32 and bf16); b1 llama3-8b bf16 235.2 / 234.2 -> 235.6 / 235.6 tok/s, q4
 * 370.2 / 371.7 -> 372.9 / 372.7 (the host spent 40-46 us a token between step graphs, part of it with the GPU idle) */
int tern_async_decode(const tern_model *m) {
    const char *e = getenv("TERN_ASYNC");
    if (e && e[0] == '0') return 0;
    if (e && e[0] == '2') return 1;
    return tern_model_decode_async(m);
}

/* what both decode loops of tern_generate share */
typedef struct gen_ctx {
    tern_model *m;
    tern_kv *kv;
    int slot, V, max_new, n_stop;
    const int32_t *stop_ids;
    tern_token_fn on_token;
    void *tok_ctx;
    tern_gen_stats *st;
} gen_ctx;

/* the g-th new token: 1 when it ends the run (a stop id, the callback, the last of max_new; *s set when it is not a
 * token at all), else 0 after counting it */
static int gen_take(const gen_ctx *x, int g, int tok, tern_status *s, tern_error *err) {
    if (tok < 0 || tok >= x->V) {
        *s = tern_err(err, TERN_EINTERNAL, "sampler returned token %d", tok);
        return 1;
    }
    for (int i = 0; i < x->n_stop; i++)
        if (x->stop_ids[i] == tok) return 1;
    x->st->n_gen++;
    if (x->on_token && x->on_token(x->tok_ctx, tok)) return 1;
    return g == x->max_new - 1;
}

/* one decode step taking tok at pos (reserved), waited for: the draw in smp->ids (smp) or the logits (smp NULL) */
static tern_status gen_step(const gen_ctx *x, int tok, int pos, const tern_batch_sample *smp, float *logits,
                            tern_error *err) {
    int32_t t32 = tok, p = pos, sl = x->slot;
    uint8_t w = 1;
    tern_batch b = {.n = 1, .tokens = &t32, .pos = &p, .slot = &sl, .want = &w};
    return smp ? tern_model_forward_sample(x->m, &b, x->kv, NULL, smp, err) : tern_model_forward(x->m, &b, x->kv, logits, err);
}

/* one decode row of x's slot at pos queued (tern_model_decode_launch); tok < 0: the previous launch's draw */
static int gen_launch(const gen_ctx *x, int tok, int pos, int par, const tern_batch_sample *smp, uint64_t *key) {
    int32_t t32 = tok, p = pos, sl = x->slot;
    tern_batch b = {.n = 1, .tokens = tok >= 0 ? &t32 : NULL, .pos = &p, .slot = &sl};
    return tern_model_decode_launch(x->m, &b, x->kv, par, smp, key);
}

/* The decode loop of tern_generate with step t + 1 queued before step t's id reaches the host
 * (tern_model_decode_launch: the id stays on the device and is step t + 1's token). Tokens, stops and callbacks as
 * in the plain loop; a step queued for a token that then ends the run is waited for and dropped (its KV entry lies
 * past the sequence). Steps alternate between two graphs (parity), so a queued step never rewrites the outputs the
 * host has yet to read. Falls back to the plain step when a launch is refused. */
static tern_status gen_pipelined(const gen_ctx *x, int32_t first, const tern_sample_row *row, int *cur_io,
                                 tern_error *err) {
    int32_t ids[2] = {-1, -1};
    const tern_batch_sample smp[2] = {{.rows = row, .ids = &ids[0]}, {.rows = row, .ids = &ids[1]}};
    uint64_t key[2] = {0, 0};
    int cur = *cur_io, tok = first, par = 0, queued = 0; /* queued: the step taking tok at cur is in flight (parity par) */
    tern_status s = TERN_OK;
    for (int g = 0; g < x->max_new && !gen_take(x, g, tok, &s, err); g++) {
        if (!queued) { /* the step taking tok (known on the host) at cur */
            if ((s = tern_kv_reserve(x->kv, x->slot, cur + 1, err))) break;
            if (!gen_launch(x, tok, cur, par, &smp[par], &key[par])) {
                if ((s = gen_step(x, tok, cur, &smp[par], NULL, err))) break;
                tok = ids[par];
                cur++;
                tern_kv_trim(x->kv, x->slot, cur);
                continue;
            }
        }
        /* the step after it (its token: this step's draw, on the device), if another token may be needed */
        int next = 0;
        if (g + 2 < x->max_new && !tern_kv_reserve(x->kv, x->slot, cur + 2, NULL))
            next = gen_launch(x, -1, cur + 1, par ^ 1, &smp[par ^ 1], &key[par ^ 1]);
        if (!tern_model_decode_wait(x->m, key[par], 1, &smp[par])) {
            s = tern_err(err, TERN_EINTERNAL, "pipelined decode: the step at position %d did not complete", cur);
            if (next) tern_model_decode_wait(x->m, key[par ^ 1], 1, &smp[par ^ 1]);
            queued = 0;
            break;
        }
        tok = ids[par];
        cur++;
        tern_kv_trim(x->kv, x->slot, cur); /* sliding blocks below the queued step's window (it reads from cur - W + 1 on) */
        par ^= 1;
        queued = next;
    }
    if (queued) tern_model_decode_wait(x->m, key[par], 1, &smp[par]); /* a step for a token that ended the run */
    tern_kv_trim(x->kv, x->slot, cur);
    *cur_io = cur;
    return s;
}

tern_status tern_generate(tern_model *m, tern_kv *kv, int slot, const int32_t *prompt, int n_prompt,
                          int max_new, int chunk, const int32_t *stop_ids, int n_stop,
                          tern_pick_fn pick, void *pick_ctx, tern_token_fn on_token, void *tok_ctx,
                          tern_gen_stats *stats, tern_error *err) {
    const tern_model_config *c = tern_model_cfg(m);
    int V = c->n_vocab;
    if (n_prompt <= 0) return tern_err(err, TERN_EINVAL, "empty prompt");
    if (chunk <= 0) chunk = 512;
    if (chunk > n_prompt) chunk = n_prompt;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)chunk), *slots = malloc(sizeof(int32_t) * (size_t)chunk);
    uint8_t *want = calloc((size_t)chunk, 1);
    tern_status s = TERN_OK;
    if (!logits || !pos || !slots || !want) { s = tern_err(err, TERN_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < chunk; i++) slots[i] = slot;
    tern_gen_stats st = {.n_prompt = n_prompt};
    const int dev = !pick && tern_device_sampling(m);
    tern_sample_row row = {.mode = TERN_SAMPLE_DRAW, .top_p = 1.0f, .min_p_log = -INFINITY, .rep = 1.0f};
    int32_t did = -1;
    tern_batch_sample smp = {.rows = &row, .ids = &did};
    double t0 = tern_time_s();
    /* prefill in chunks; logits only for the last prompt row */
    for (int p0 = 0; p0 < n_prompt; p0 += chunk) {
        int nr = TERN_MIN(chunk, n_prompt - p0);
        if ((s = tern_kv_reserve(kv, slot, p0 + nr, err))) goto done;
        for (int i = 0; i < nr; i++) { pos[i] = p0 + i; want[i] = (p0 + i == n_prompt - 1); }
        tern_batch b = {.n = nr, .tokens = prompt + p0, .pos = pos, .slot = slots, .want = want};
        const int last = p0 + nr == n_prompt;
        if ((s = dev && last ? tern_model_forward_sample(m, &b, kv, NULL, &smp, err) : tern_model_forward(m, &b, kv, last ? logits : NULL, err)))
            goto done;
        tern_kv_trim(kv, slot, p0 + nr);
    }
    st.t_prefill = tern_time_s() - t0;
    t0 = tern_time_s();
    int cur = n_prompt;
    const gen_ctx x = {m, kv, slot, V, max_new, n_stop, stop_ids, on_token, tok_ctx, &st};
    if (dev && tern_async_decode(x.m)) { /* the pipelined decode: the same tokens, the GPU not waiting for the host */
        if ((s = gen_pipelined(&x, did, &row, &cur, err))) goto done;
    } else {
        for (int g = 0; g < max_new; g++) {
            const int tok = dev ? did : pick ? pick(pick_ctx, logits, V) : tern_argmax(logits, V);
            if (gen_take(&x, g, tok, &s, err)) break;
            if ((s = tern_kv_reserve(kv, slot, cur + 1, err)) || (s = gen_step(&x, tok, cur, dev ? &smp : NULL, logits, err)))
                goto done;
            cur++;
            tern_kv_trim(kv, slot, cur);
        }
        if (s) goto done;
    }
    st.t_decode = tern_time_s() - t0;
    if (stats) *stats = st;
done:
    free(logits); free(pos); free(slots); free(want);
    return s;
}
