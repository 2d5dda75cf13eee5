/*
 * test_sample.c — the sampler chain: parameter validation, greedy, determinism per (seed,
 * step), each stage's effect (bias, repetition/presence/frequency penalties with a window,
 * mask hook, top-k, top-p, min-p, temperature), logprobs, and a chi-square check that draws
 * follow softmax(logits / T) on a small vocabulary.
 */
#include "test.h"

#include "sample/sampler.h"

#include <math.h>

static tern_sampler *mk(tern_sampler_params p, int V) {
    tern_sampler *s = NULL;
    tern_error e = {0};
    if (tern_sampler_new(&p, V, &s, &e)) printf("  sampler_new: %s\n", e.msg);
    return s;
}

static int32_t draw(tern_sampler *s, const float *logits, int V, uint64_t step) {
    float buf[64];
    memcpy(buf, logits, (size_t)V * sizeof *buf);
    tern_sample_result r;
    tern_error e = {0};
    if (tern_sampler_sample(s, buf, step, &r, &e)) { printf("  sample: %s\n", e.msg); return -1; }
    return r.id;
}

TEST(validation_names_parameter) {
    struct { const char *name; tern_sampler_params p; } bad[8];
    for (int i = 0; i < 8; i++) bad[i].p = tern_sampler_defaults();
    bad[0].name = "temperature"; bad[0].p.temperature = -0.5f;
    bad[1].name = "top_p"; bad[1].p.top_p = 0;
    bad[2].name = "top_p"; bad[2].p.top_p = 1.5f;
    bad[3].name = "top_k"; bad[3].p.top_k = -1;
    bad[4].name = "min_p"; bad[4].p.min_p = 2;
    bad[5].name = "repetition_penalty"; bad[5].p.repetition_penalty = 0;
    bad[6].name = "presence_penalty"; bad[6].p.presence_penalty = 5;
    bad[7].name = "frequency_penalty"; bad[7].p.frequency_penalty = NAN;
    for (int i = 0; i < 8; i++) {
        tern_sampler *s = NULL;
        tern_error e = {0};
        CHECK(tern_sampler_new(&bad[i].p, 10, &s, &e) == TERN_EINVAL && !s, "%s accepted", bad[i].name);
        CHECK(strstr(e.msg, bad[i].name) != NULL, "message '%s' lacks %s", e.msg, bad[i].name);
    }
    tern_sampler_params p = tern_sampler_defaults();
    int32_t id = 10;
    float v = 1;
    p.bias_ids = &id; p.bias_values = &v; p.n_bias = 1;
    tern_sampler *s = NULL;
    tern_error e = {0};
    CHECK(tern_sampler_new(&p, 10, &s, &e) == TERN_EINVAL && strstr(e.msg, "logit_bias"), "bad bias id accepted");
    tern_sampler_free(NULL);
}

TEST(greedy_and_ties) {
    tern_sampler_params p = tern_sampler_defaults();
    p.temperature = 0;
    tern_sampler *s = mk(p, 5);
    float l[5] = {1, 3, 3, -1, 2};
    CHECK(draw(s, l, 5, 0) == 1, "argmax with tie should pick the lower id");
    tern_sampler_free(s);
    p.temperature = 1;
    p.top_k = 1;
    s = mk(p, 5);
    for (int st = 0; st < 20; st++) CHECK(draw(s, l, 5, (uint64_t)st) == 1, "top_k=1 must be greedy");
    tern_sampler_free(s);
}

TEST(determinism_per_seed_and_step) {
    tern_sampler_params p = tern_sampler_defaults();
    p.seed = 42;
    float l[8] = {0.1f, 0.5f, 0.2f, 0.9f, 0.0f, 0.4f, 0.3f, 0.7f};
    tern_sampler *a = mk(p, 8), *b = mk(p, 8);
    int same = 0, diffseed = 0;
    for (int st = 0; st < 200; st++) {
        int32_t x = draw(a, l, 8, (uint64_t)st);
        /* b is used out of order: results depend only on (seed, step) */
        int32_t y = draw(b, l, 8, (uint64_t)st);
        same += x == y;
    }
    CHECK(same == 200, "same seed/step gave different tokens (%d/200)", same);
    p.seed = 43;
    tern_sampler *c = mk(p, 8);
    for (int st = 0; st < 200; st++) diffseed += draw(a, l, 8, (uint64_t)st) != draw(c, l, 8, (uint64_t)st);
    CHECK(diffseed > 50, "a different seed changed only %d/200 draws", diffseed);
    CHECK(tern_sampler_uniform(1, 2) == tern_sampler_uniform(1, 2), "uniform not a function");
    tern_sampler_free(a); tern_sampler_free(b); tern_sampler_free(c);
}

TEST(chi_square_matches_softmax) {
    enum { V = 6, N = 60000 };
    float l[V] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f};
    tern_sampler_params p = tern_sampler_defaults();
    p.temperature = 0.8f;
    p.seed = 7;
    tern_sampler *s = mk(p, V);
    int cnt[V] = {0};
    for (int i = 0; i < N; i++) {
        int32_t id = draw(s, l, V, (uint64_t)i);
        if (id >= 0) cnt[id]++;
    }
    double z = 0, pr[V], chi = 0;
    for (int i = 0; i < V; i++) z += (pr[i] = exp(l[i] / 0.8));
    for (int i = 0; i < V; i++) {
        double e = N * pr[i] / z;
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    CHECK(chi < 25.0, "chi-square %.2f too large for 5 dof", chi); /* p ~ 1e-4 */
    tern_sampler_free(s);
}

TEST(bias_and_mask) {
    float l[4] = {0, 0, 5, 0};
    tern_sampler_params p = tern_sampler_defaults();
    p.temperature = 0;
    int32_t ids[2] = {2, 0};
    float vals[2] = {-INFINITY, 10};
    p.bias_ids = ids; p.bias_values = vals; p.n_bias = 2;
    tern_sampler *s = mk(p, 4);
    CHECK(draw(s, l, 4, 0) == 0, "bias not applied");
    tern_sampler_free(s);
}

static bool mask_all_but_3(void *u, float *logits, int n) {
    (void)u;
    for (int i = 0; i < n; i++) if (i != 3) logits[i] = -INFINITY;
    return true;
}
static bool mask_all(void *u, float *logits, int n) {
    (void)u;
    for (int i = 0; i < n; i++) logits[i] = -INFINITY;
    return true;
}

TEST(mask_hook) {
    float l[4] = {9, 8, 7, 1};
    tern_sampler_params p = tern_sampler_defaults();
    tern_sampler *s = mk(p, 4);
    tern_sampler_set_mask(s, mask_all_but_3, NULL);
    for (int st = 0; st < 10; st++) CHECK(draw(s, l, 4, (uint64_t)st) == 3, "mask ignored");
    tern_sampler_set_mask(s, mask_all, NULL);
    float b[4] = {1, 2, 3, 4};
    tern_sample_result r;
    tern_error e = {0};
    CHECK(tern_sampler_sample(s, b, 0, &r, &e) == TERN_EINVAL, "all-masked must fail cleanly");
    tern_sampler_free(s);
}

TEST(penalties_window) {
    tern_sampler_params p = tern_sampler_defaults();
    p.repetition_penalty = 2.0f;
    p.penalty_last_n = 2;
    tern_sampler *s = mk(p, 4);
    tern_sampler_accept(s, 0);
    tern_sampler_accept(s, 1);
    tern_sampler_accept(s, 1);
    float l[4] = {4, 4, -2, 1};
    tern_sample_result r;
    tern_error e = {0};
    p.temperature = 0;
    tern_sampler_sample(s, l, 0, &r, &e);
    /* window holds [1, 1]: token 1 divided once (positive), token 0 out of the window */
    CHECK(l[0] == 4 && l[1] == 2 && l[2] == -2, "repetition: %g %g %g", l[0], l[1], l[2]);
    tern_sampler_free(s);

    p = tern_sampler_defaults();
    p.repetition_penalty = 2.0f;
    s = mk(p, 4);
    tern_sampler_accept(s, 2);
    float m[4] = {0, 0, -2, 0};
    tern_sampler_sample(s, m, 0, &r, &e);
    CHECK(m[2] == -4, "negative logits are multiplied: %g", m[2]);
    tern_sampler_free(s);

    p = tern_sampler_defaults();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    s = mk(p, 4);
    tern_sampler_accept(s, 1);
    tern_sampler_accept(s, 1);
    tern_sampler_accept(s, 3);
    float q[4] = {1, 1, 1, 1};
    tern_sampler_sample(s, q, 0, &r, &e);
    CHECK(fabsf(q[1] - (1 - 0.5f - 0.5f)) < 1e-6 && fabsf(q[3] - (1 - 0.5f - 0.25f)) < 1e-6 && q[0] == 1,
          "presence/frequency: %g %g %g", q[0], q[1], q[3]);
    tern_sampler_reset(s);
    float w[4] = {1, 1, 1, 1};
    tern_sampler_sample(s, w, 0, &r, &e);
    CHECK(w[1] == 1, "reset kept history");
    tern_sampler_free(s);
}

TEST(top_k_top_p_min_p) {
    float l[5] = {3, 2, 1, 0, -1};
    tern_sampler_params p = tern_sampler_defaults();
    p.top_k = 2;
    tern_sampler *s = mk(p, 5);
    for (int st = 0; st < 300; st++) { int32_t id = draw(s, l, 5, (uint64_t)st); CHECK(id == 0 || id == 1, "top_k leak %d", id); }
    tern_sampler_free(s);
    /* softmax(3,2,1,0,-1) = .636 .234 .086 .032 .012: top_p 0.8 keeps {0,1}; 0.9 keeps {0,1,2} */
    p = tern_sampler_defaults();
    p.top_p = 0.8f;
    s = mk(p, 5);
    int seen[5] = {0};
    for (int st = 0; st < 2000; st++) seen[draw(s, l, 5, (uint64_t)st)]++;
    CHECK(seen[0] && seen[1] && !seen[2] && !seen[3] && !seen[4], "top_p 0.8: %d %d %d", seen[0], seen[1], seen[2]);
    tern_sampler_free(s);
    p.top_p = 0.9f;
    s = mk(p, 5);
    memset(seen, 0, sizeof seen);
    for (int st = 0; st < 4000; st++) seen[draw(s, l, 5, (uint64_t)st)]++;
    CHECK(seen[2] && !seen[3] && !seen[4], "top_p 0.9: %d %d %d", seen[2], seen[3], seen[4]);
    tern_sampler_free(s);
    /* min_p 0.1: keep p >= 0.0636 -> {0,1,2} */
    p = tern_sampler_defaults();
    p.min_p = 0.1f;
    s = mk(p, 5);
    memset(seen, 0, sizeof seen);
    for (int st = 0; st < 4000; st++) seen[draw(s, l, 5, (uint64_t)st)]++;
    CHECK(seen[2] && !seen[3] && !seen[4], "min_p: %d %d %d", seen[2], seen[3], seen[4]);
    tern_sampler_free(s);
    /* low temperature concentrates on the best token */
    p = tern_sampler_defaults();
    p.temperature = 0.05f;
    s = mk(p, 5);
    int best = 0;
    for (int st = 0; st < 500; st++) best += draw(s, l, 5, (uint64_t)st) == 0;
    CHECK(best == 500, "T=0.05 picked the best token only %d/500", best);
    tern_sampler_free(s);
}

TEST(logprobs_from_processed_distribution) {
    float l[4] = {2, 1, 0, -1};
    tern_sampler_params p = tern_sampler_defaults();
    p.temperature = 0;
    p.logprobs = true;
    p.top_logprobs = 3;
    tern_sampler *s = mk(p, 4);
    float b[4];
    memcpy(b, l, sizeof b);
    tern_sample_result r;
    tern_error e = {0};
    CHECK(tern_sampler_sample(s, b, 0, &r, &e) == TERN_OK, "%s", e.msg);
    double z = exp(2) + exp(1) + exp(0) + exp(-1);
    CHECK(r.id == 0 && fabs(r.logprob - (2 - log(z))) < 1e-5, "logprob %g", r.logprob);
    CHECK(r.n_top == 3 && r.top[0].id == 0 && r.top[1].id == 1 && r.top[2].id == 2, "top ids");
    CHECK(fabs(r.top[2].logprob - (0 - log(z))) < 1e-5, "top[2] logprob %g", r.top[2].logprob);
    tern_sampler_free(s);
}

TEST(large_vocab_speed) {
    enum { V = 262144 };
    float *l = malloc(V * sizeof *l), *b = malloc(V * sizeof *b);
    unsigned long long rng = 99;
    for (int i = 0; i < V; i++) l[i] = 5 * test_randf(&rng);
    tern_sampler_params p = tern_sampler_defaults();
    p.top_p = 0.95f;
    p.top_k = 0;
    p.temperature = 0.7f;
    p.repetition_penalty = 1.1f;
    tern_sampler *s = mk(p, V);
    for (int i = 0; i < 64; i++) tern_sampler_accept(s, i * 7);
    double t0 = tern_time_s();
    tern_sample_result r;
    tern_error e = {0};
    for (int st = 0; st < 20; st++) {
        memcpy(b, l, V * sizeof *b);
        CHECK(tern_sampler_sample(s, b, (uint64_t)st, &r, &e) == TERN_OK, "%s", e.msg);
    }
    double ms = (tern_time_s() - t0) * 1000 / 20;
    CHECK(ms < 200, "%.1f ms per token on a 262k vocabulary", ms);
    tern_sampler_free(s);
    free(l); free(b);
}

int main(void) {
    RUN(validation_names_parameter);
    RUN(greedy_and_ties);
    RUN(determinism_per_seed_and_step);
    RUN(chi_square_matches_softmax);
    RUN(bias_and_mask);
    RUN(mask_hook);
    RUN(penalties_window);
    RUN(top_k_top_p_min_p);
    RUN(logprobs_from_processed_distribution);
    RUN(large_vocab_speed);
    return test_done();
}
