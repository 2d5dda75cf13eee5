/*
 * test_runtime_spec.c — speculative decoding (prompt lookup) in the scheduler.
 *
 * The promise is "same output, fewer steps": greedy requests must produce exactly the tokens
 * of plain decoding with speculative_k = 0, 4 and 8 — alone, batched with non-speculative
 * requests, with a prefix cache, on the tiny Llama, the demo model (sliding window) and the
 * Gemma 4 / Qwen 3 parity fixtures (sliding windows 32 and 8, KV-shared layers); seeded
 * sampling (temperature, top-k/p, repetition penalty) must give the same tokens with and
 * without speculation (draw-and-compare verification). A repetitive prompt must show accepted
 * drafts, and KV usage must return to its baseline when the requests end (rolled-back draft
 * blocks are freed). The drafter itself is checked on hand-made sequences.
 */
#include "runtime_util.h"
#include "runtime/spec.h"

#define NGEN 40

static tern_request req(const int32_t *p, int n, int max_tokens, int k, rt_col *c) {
    tern_request r = rt_greedy(p, n, max_tokens, c);
    r.speculative_k = k;
    return r;
}

/* A prompt that repeats a random phrase (prompt lookup has something to find). */
static void rep_prompt(int32_t *p, int n, int period, int vocab, unsigned long long seed) {
    for (int i = 0; i < period; i++) p[i] = (int32_t)(test_rand_u64(&seed) % (uint64_t)(vocab - 3)) + 3;
    for (int i = period; i < n; i++) p[i] = p[i - period];
}

static int same(const rt_col *a, const rt_col *b) {
    return a->done && b->done && a->n_tok == b->n_tok && a->n_tok > 0 &&
           !memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n_tok) && a->finish == b->finish;
}

static int kv_used(tern_engine *e) {
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    return st.kv_blocks_used - st.kv_blocks_cached;   /* blocks held by requests */
}

TEST(drafter) {
    int32_t t[] = {5, 6, 7, 8, 9, 5, 6, 7}, d[8];
    int n = tern__spec_draft(t, 8, 4, d);   /* suffix 5 6 7 seen at 0: draft 8 9 5 6 */
    CHECK(n == 4 && d[0] == 8 && d[1] == 9 && d[2] == 5 && d[3] == 6, "trigram draft (%d: %d %d)", n, d[0], d[1]);
    int32_t u[] = {1, 2, 3, 4, 2, 9, 4, 2};   /* trigram 9 4 2 unseen; bigram 4 2 at 3: 9 4 2, then periodic */
    n = tern__spec_draft(u, 8, 7, d);
    CHECK(n == 7 && d[0] == 9 && d[1] == 4 && d[2] == 2 && d[3] == 9 && d[6] == 9, "bigram draft, extrapolated (%d)", n);
    int32_t x[] = {3, 5, 5, 5, 5}; /* a run drafts k copies */
    n = tern__spec_draft(x, 5, 4, d);
    CHECK(n == 4 && d[0] == 5 && d[3] == 5, "run of one token (%d)", n);
    int32_t v[] = {1, 2, 3, 2, 4, 5, 2};      /* unigram 2, most recent earlier occurrence at 3 */
    n = tern__spec_draft(v, 7, 2, d);
    CHECK(n == 2 && d[0] == 4 && d[1] == 5, "unigram, most recent (%d: %d)", n, d[0]);
    int32_t w[] = {1, 2, 3};
    CHECK(tern__spec_draft(w, 3, 4, d) == 0 && tern__spec_draft(t, 8, 0, d) == 0 && tern__spec_draft(t, 1, 4, d) == 0,
          "no match / k 0 / too short");
}

/* Run one request per prompt together on e; returns 0 on success. */
static int run_batch(tern_engine *e, int np, int32_t (*p)[64], const int *n, const int *k, rt_col *c, double temp,
                     int max_tokens) {
    for (int i = 0; i < np; i++) {
        memset(&c[i], 0, sizeof c[i]);
        tern_request r = req(p[i], n[i], max_tokens, k[i], &c[i]);
        if (temp > 0) {
            r.sampling.temperature = (float)temp;
            r.sampling.top_k = 20;
            r.sampling.top_p = 0.95f;
            r.sampling.repetition_penalty = 1.05f;
            r.sampling.seed = 1000 + (uint64_t)n[i];   /* per prompt, not per batch position */
        }
        tern_error err = {0};
        if (tern_engine_submit(e, &r, NULL, &err)) { printf("  submit: %s\n", err.msg); return -1; }
    }
    return rt_drain(e, 5000) < 0 ? -1 : 0;
}

/* Plain (k = 0, alone) vs speculative (k = 4 / 8, alone and batched with k = 0 requests). */
static void compare_model(tern_engine *e, int vocab, const char *name, int ngen, double temp, long long *acc) {
    int32_t p[4][64];
    int n[4] = {30, 22, 41, 17};
    for (int i = 0; i < 4; i++) rep_prompt(p[i], n[i], 5 + i, vocab, 77 + (unsigned long long)i * 13);
    rt_col ref[4], c[4];
    int base = kv_used(e);
    for (int i = 0; i < 4; i++) {
        int k0 = 0;
        if (run_batch(e, 1, &p[i], &n[i], &k0, &ref[i], temp, ngen)) { CHECK(0, "%s: plain run", name); return; }
    }
    tern_engine_stats s0, s1;
    tern_engine_get_stats(e, &s0);
    int ks[] = {4, 8};
    for (int t = 0; t < 2; t++) {
        int ok = 1;
        for (int i = 0; i < 4; i++) {
            int k = ks[t];
            if (run_batch(e, 1, &p[i], &n[i], &k, &c[i], temp, ngen)) { ok = 0; break; }
            ok &= same(&c[i], &ref[i]);
        }
        CHECK(ok, "%s: %s k=%d alone == k=0", name, temp > 0 ? "sampled" : "greedy", ks[t]);
        int kb[4] = {ks[t], 0, ks[t], 0};   /* batched: speculative next to plain requests */
        ok = !run_batch(e, 4, p, n, kb, c, temp, ngen);
        for (int i = 0; i < 4; i++) ok &= same(&c[i], &ref[i]);
        CHECK(ok, "%s: %s k=%d batched with k=0 requests == alone", name, temp > 0 ? "sampled" : "greedy", ks[t]);
    }
    tern_engine_get_stats(e, &s1);
    CHECK(kv_used(e) == base, "%s: KV blocks back to baseline (%d vs %d)", name, kv_used(e), base);
    printf("  %s (%s): drafted %lld, accepted %lld\n", name, temp > 0 ? "sampled" : "greedy",
           s1.spec_drafted - s0.spec_drafted, s1.spec_accepted - s0.spec_accepted);
    if (acc) *acc = s1.spec_accepted - s0.spec_accepted;
}

TEST(tiny_llama_greedy) {
    tern_engine *e = rt_engine(4, 64, 0, 256);
    CHECK(e != NULL, "engine");
    if (!e) return;
    long long acc = 0;
    compare_model(e, RT_V, "tiny llama", NGEN, 0, &acc);
    CHECK(acc > 0, "repetitive prompts: accepted drafts > 0 (%lld)", acc);
    /* against the single-sequence reference (tern_generate) too */
    rt_ref ref;
    if (!rt_ref_open(&ref)) {
        int32_t p[64], want[NGEN];
        rep_prompt(p, 30, 5, RT_V, 5);
        int nw = rt_ref_greedy(&ref, p, 30, NGEN, want);
        rt_col c;
        memset(&c, 0, sizeof c);
        tern_request r = req(p, 30, NGEN, 8, &c);
        tern_engine_submit(e, &r, NULL, NULL);
        rt_drain(e, 1000);
        CHECK(nw == NGEN && c.n_tok == NGEN && !memcmp(c.toks, want, sizeof want), "k=8 == tern_generate reference");
    }
    rt_ref_close(&ref);
    tern_engine_close(e);
}

TEST(tiny_llama_sampled) {
    tern_engine *e = rt_engine(4, 64, 0, 256);
    CHECK(e != NULL, "engine");
    if (!e) return;
    long long acc = 0;
    compare_model(e, RT_V, "tiny llama", NGEN, 0.3, &acc);
    CHECK(acc > 0, "sampled: some drafts accepted (%lld)", acc);
    tern_engine_close(e);
}

TEST(tiny_llama_prefix_cache_and_limits) {
    /* prefix cache on: drafts never reach the cache, rollback never cuts a shared block */
    tern_engine *e = rt_engine_pc(3, 32, 0, 256, 0.01);
    CHECK(e != NULL, "engine");
    if (!e) return;
    compare_model(e, RT_V, "tiny llama + prefix cache", NGEN, 0, NULL);
    /* max_tokens smaller than k, and a stop token inside an accepted draft */
    int32_t p[64];
    rep_prompt(p, 30, 5, RT_V, 9);
    rt_col a, b;
    for (int mt = 1; mt <= 3; mt++) {
        memset(&a, 0, sizeof a); memset(&b, 0, sizeof b);
        tern_request ra = req(p, 30, mt, 0, &a), rb = req(p, 30, mt, 8, &b);
        tern_engine_submit(e, &ra, NULL, NULL);
        tern_engine_submit(e, &rb, NULL, NULL);
        rt_drain(e, 1000);
        CHECK(same(&a, &b) && b.n_tok == mt && b.finish == TERN_FINISH_LENGTH, "max_tokens %d with k=8", mt);
    }
    memset(&a, 0, sizeof a);
    tern_request ra = req(p, 30, NGEN, 0, &a);
    tern_engine_submit(e, &ra, NULL, NULL);
    rt_drain(e, 1000);
    if (a.n_tok > 6) {
        int32_t stop = a.toks[6];
        int first = 0;
        while (a.toks[first] != stop) first++;
        memset(&b, 0, sizeof b);
        tern_request rb = req(p, 30, NGEN, 8, &b);
        rb.stop_ids = &stop;
        rb.n_stop_ids = 1;
        tern_engine_submit(e, &rb, NULL, NULL);
        rt_drain(e, 1000);
        CHECK(b.done && b.finish == TERN_FINISH_STOP && b.n_tok == first && !memcmp(b.toks, a.toks, sizeof(int32_t) * (size_t)first),
              "stop token inside a draft ends the request where plain decoding does (%d vs %d)", b.n_tok, first);
    }
    tern_request bad = req(p, 30, 4, TERN_SPEC_MAX_K + 1, &b);
    tern_error err = {0};
    CHECK(tern_engine_submit(e, &bad, NULL, &err) == TERN_EINVAL && strstr(err.msg, "speculative_k"), "k too large refused");
    tern_engine_close(e);
}

static tern_engine *open_model(const char *model, int spec_default) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = model;
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = 4;
    o.max_ctx = 160;
    o.max_batch_tokens = 48;
    o.speculative_k = spec_default;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) { printf("  %s: %s\n", model, err.msg); return NULL; }
    return e;
}

TEST(demo_and_fixtures) {
    const char *fx[] = {"demo", "gemma4_dense", "gemma4_e2b_like", "qwen3"};
    for (int i = 0; i < 4; i++) {
        char path[256];
        if (i == 0) snprintf(path, sizeof path, "demo");
        else snprintf(path, sizeof path, "tests/parity/fixtures/%s", fx[i]);
        if (i && access(path, F_OK)) { printf("SKIP: fixture %s absent\n", fx[i]); continue; }
        tern_engine *e = open_model(path, 0);
        CHECK(e != NULL, "%s: engine", fx[i]);
        if (!e) continue;
        tern_model_info mi;
        tern_engine_model_info(e, &mi);
        compare_model(e, mi.n_vocab, fx[i], 48, 0, NULL);   /* 17..41 prompt + 48 > windows 8 / 32 */
        compare_model(e, mi.n_vocab, fx[i], 48, 0.5, NULL);
        tern_engine_close(e);
    }
    /* the engine default applies to tern_request_default() requests */
    tern_engine *e = open_model("demo", 4);
    CHECK(e != NULL, "demo with speculative_k default 4");
    if (!e) return;
    int32_t p[64];
    rep_prompt(p, 30, 5, 256, 3);
    rt_col c;
    memset(&c, 0, sizeof c);
    tern_request r = req(p, 30, 24, -1, &c);
    tern_engine_submit(e, &r, NULL, NULL);
    rt_drain(e, 1000);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(c.n_tok == 24 && st.spec_drafted > 0, "engine default k used (drafted %lld)", st.spec_drafted);
    tern_engine_close(e);
}

int main(void) {
    (void)rt_prompt;
    RUN(drafter);
    RUN(tiny_llama_greedy);
    RUN(tiny_llama_sampled);
    RUN(tiny_llama_prefix_cache_and_limits);
    RUN(demo_and_fixtures);
    return test_done();
}
