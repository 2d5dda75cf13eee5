/*
 * test_runtime_admit.c — memory honesty in the engine: admission by the aggregate KV of
 * everything running, refusal of what can never fit, generation clipped to the pool, the
 * --memory-budget sizing of the KV pool (runtime/fit.c), and the fit numbers themselves.
 *
 * Tiny random Llama (2 layers, KV block = 16 tokens x 512 bytes); outputs are checked
 * against tern_generate alone, as in test_runtime_engine.c.
 */
#include "runtime_util.h"
#include "runtime/fit.h"

static rt_ref REF;

static tern_request greedy(const int32_t *p, int n, int max_new, rt_col *c) {
    tern_request r = tern_request_default();
    r.prompt = p;
    r.n_prompt = n;
    r.max_tokens = max_new;
    r.sampling.temperature = 0;
    r.ignore_eos = 1;
    r.on_event = rt_on_event;
    r.ctx = c;
    return r;
}

static void check_ref(const rt_col *c, const int32_t *p, int n, int max_new, const char *what) {
    int32_t exp[256];
    int ne = rt_ref_greedy(&REF, p, n, max_new, exp);
    CHECK(c->done && c->last.kind == TERN_EV_DONE, "%s: not done (%s)", what, c->err_msg);
    CHECK(c->n_tok == ne && !memcmp(c->toks, exp, sizeof(int32_t) * (size_t)ne), "%s: tokens differ from the reference", what);
}

#define GB(blocks) ((double)(RT_BLOCK_BYTES * (blocks)) / 1073741824.0 * 1.0001)

TEST(waits_instead_of_thrashing) {
    /* 8 blocks, 3 slots; prompts of 70 tokens need 5 blocks: only one runs at a time */
    tern_engine *e = rt_engine(3, 32, GB(8), 256);
    if (!e) { CHECK(0, "engine"); return; }
    int32_t p[3][80];
    rt_col c[3] = {0};
    tern_error err = {0};
    for (int i = 0; i < 3; i++) {
        rt_prompt(p[i], 70, 500 + (unsigned long long)i);
        tern_request r = greedy(p[i], 70, 6, &c[i]);
        CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "submit %d: %s", i, err.msg);
    }
    tern_engine_step(e, &err);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.running == 1 && st.waiting == 2, "after one step: running %d waiting %d", st.running, st.waiting);
    rt_drain(e, 2000);
    for (int i = 0; i < 3; i++) check_ref(&c[i], p[i], 70, 6, "queued");
    tern_engine_get_stats(e, &st);
    CHECK(st.preemptions == 0, "admission by aggregate KV: no preemption expected, got %lld", st.preemptions);
    CHECK(st.kv_blocks_used == 0, "blocks used %d", st.kv_blocks_used);
    tern_engine_close(e);
}

TEST(never_fits_and_clipping) {
    tern_engine *e = rt_engine(2, 32, GB(8), 256);
    if (!e) { CHECK(0, "engine"); return; }
    int32_t p[200];
    rt_prompt(p, 200, 9);
    rt_col big = {0}, clip = {0};
    tern_request r = greedy(p, 140, 4, &big);          /* 9 blocks > 8 */
    tern_error err = {0};
    CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_ENOMEM && strstr(err.msg, "KV blocks") && strstr(err.msg, "pool holds 8"),
          "never fits: %s", err.msg);
    r = greedy(p, 100, 100, &clip);                    /* fits, but 200 tokens would not */
    CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "clip submit: %s", err.msg);
    rt_drain(e, 2000);
    CHECK(clip.done && clip.finish == TERN_FINISH_LENGTH && clip.n_tok == 8 * 16 - 100, "clipped to the pool: %d tokens, finish %d",
          clip.n_tok, clip.finish);
    check_ref(&clip, p, 100, 28, "clipped");
    tern_engine_close(e);
}

TEST(memory_budget_sizing) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = rt_model_dir();
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = 4;
    o.max_ctx = 256;
    o.max_batch_tokens = 32;
    o.memory_budget_gb = 1e-5;                        /* ~10 KB: less than the weights */
    tern_engine *e = NULL;
    tern_error err = {0};
    CHECK(tern_engine_open(&e, &o, &err) == TERN_ENOMEM && strstr(err.msg, "memory budget"), "tiny budget: %s", err.msg);
    tern_engine_close(e);
    e = NULL;
    /* weights ~33 KB + scratch: a 200 KB budget leaves room for some but not all 4 x 256 tokens */
    o.memory_budget_gb = 200e3 / 1073741824.0;
    CHECK(tern_engine_open(&e, &o, &err) == TERN_OK, "200 KB budget: %s", err.msg);
    if (e) {
        tern_engine_stats st;
        tern_engine_get_stats(e, &st);
        CHECK(st.kv_blocks_total > 0 && (size_t)st.kv_blocks_total * RT_BLOCK_BYTES < 200000 && st.kv_blocks_total < 4 * 16,
              "pool of %d blocks within the budget", st.kv_blocks_total);
        int32_t p[64];
        rt_prompt(p, 40, 3);
        rt_col c = {0};
        tern_request r = greedy(p, 40, 8, &c);
        tern_engine_submit(e, &r, NULL, &err);
        rt_drain(e, 500);
        check_ref(&c, p, 40, 8, "budgeted engine");
        tern_engine_close(e);
    }
    o.memory_budget_gb = 200e3 / 1073741824.0;
    o.kv_memory_gb = 1.0;
    e = NULL;
    CHECK(tern_engine_open(&e, &o, &err) == TERN_EINVAL && strstr(err.msg, "does not fit"), "kv memory over budget: %s", err.msg);
    tern_engine_close(e);
}

TEST(fit_numbers) {
    tern_model_config cfg;
    tern_error err = {0};
    const char *js = "{\"model_type\": \"gemma4_text\", \"vocab_size\": 256, \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 6, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32,"
                     " \"global_head_dim\": 64, \"sliding_window\": 64, \"max_position_embeddings\": 4096,"
                     " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\","
                     " \"sliding_attention\", \"sliding_attention\", \"full_attention\"]}";
    if (tern_config_parse(&cfg, js, strlen(js), "fit", &err)) { printf("SKIP: fit config: %s\n", err.msg); return; }
    tern_fit f;
    tern_fit_opts fo = {.ctx = 1024, .max_concurrency = 4, .max_batch_tokens = 32, .budget_gb = 0};
    CHECK(tern_fit_plan(&cfg, NULL, 1000, &fo, &f, &err) == TERN_OK, "plan: %s", err.msg);
    size_t full_tok = 0, sl_tok = 0;
    for (int l = 0; l < cfg.n_layer; l++) {
        size_t t = 2 * (size_t)cfg.layers[l].n_head_kv * (size_t)cfg.layers[l].head_dim * 4;
        if (cfg.layers[l].type == TERN_LAYER_SLIDING) sl_tok += t; else full_tok += t;
    }
    CHECK(f.n_full == 2 && f.n_sliding == 4 && f.kv_token_full == full_tok && f.kv_token_sliding == sl_tok,
          "per-token: full %zu (exp %zu), sliding %zu (exp %zu)", f.kv_token_full, full_tok, f.kv_token_sliding, sl_tok);
    /* sliding: window 64 -> 4 blocks + 1 + a 32-row chunk (2 blocks) = 7 blocks of 16 */
    CHECK(f.kv_seq == full_tok * 1024 + sl_tok * 7 * 16, "per sequence %zu", f.kv_seq);
    fo.budget_gb = (1000.0 + (double)f.scratch + 2.5 * (double)f.kv_seq) / 1073741824.0;
    CHECK(tern_fit_plan(&cfg, NULL, 1000, &fo, &f, &err) == TERN_OK && !f.fits && f.max_conc == 2, "budget: fits %d conc %d",
          f.fits, f.max_conc);
    CHECK(f.max_ctx > 0 && f.max_ctx < 1024 && tern_fit_seq_kv(&cfg, NULL, f.max_ctx, 32, 16) * 4 <= f.kv_avail &&
          tern_fit_seq_kv(&cfg, NULL, f.max_ctx + 16, 32, 16) * 4 > f.kv_avail, "max ctx %d at 4", f.max_ctx);
    tern_config_free(&cfg);
}

int main(void) {
    if (!rt_model_dir() || rt_ref_open(&REF)) { printf("FAIL: setup: tiny model\n"); return 1; }
    RUN(waits_instead_of_thrashing);
    RUN(never_fits_and_clipping);
    RUN(memory_budget_sizing);
    RUN(fit_numbers);
    rt_ref_close(&REF);
    return test_done();
}
