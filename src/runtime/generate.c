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
    for (int g = 0; g < max_new; g++) {
        int tok = dev ? did : pick ? pick(pick_ctx, logits, V) : tern_argmax(logits, V);
        if (tok < 0 || tok >= V) { s = tern_err(err, TERN_EINTERNAL, "sampler returned token %d", tok); goto done; }
        int stop = 0;
        for (int i = 0; i < n_stop; i++) if (stop_ids[i] == tok) stop = 1;
        if (stop) break;
        st.n_gen++;
        if (on_token && on_token(tok_ctx, tok)) break;
        if (g == max_new - 1) break;
        /* decode step */
        if ((s = tern_kv_reserve(kv, slot, cur + 1, err))) goto done;
        int32_t t32 = tok, p = cur, sl = slot;
        uint8_t w = 1;
        tern_batch b = {.n = 1, .tokens = &t32, .pos = &p, .slot = &sl, .want = &w};
        if ((s = dev ? tern_model_forward_sample(m, &b, kv, NULL, &smp, err) : tern_model_forward(m, &b, kv, logits, err)))
            goto done;
        cur++;
        tern_kv_trim(kv, slot, cur);
    }
    st.t_decode = tern_time_s() - t0;
    if (stats) *stats = st;
done:
    free(logits); free(pos); free(slots); free(want);
    return s;
}
