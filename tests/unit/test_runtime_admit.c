/*
 * test_runtime_admit.c — memory honesty in the engine: admission by the aggregate KV of
 * everything running, refusal of what can never fit, generation clipped to the pool, the
 * --memory-budget sizing of the KV pool (runtime/fit.c), and the fit numbers themselves.
 *
 * Tiny random Llama (2 layers, KV block = 16 tokens x 512 bytes); outputs are checked
 * against tern_generate alone, as in test_runtime_engine.c. The sliding-window pool (kv.h
 * tern_kv_pool_blocks: window + one block per slot, plus one chunk shared by all slots) on a
 * small Gemma 4 geometry: its size, that fit.c counts the same bytes, that steps obeying the
 * chunk never run it short, and the demo model prefilling several prompts at once through it.
 */
#include "runtime_util.h"
#include "io/kv_config.h"
#include "runtime/fit.h"

static rt_ref REF;

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
        tern_request r = rt_greedy(p[i], 70, 6, &c[i]);
        CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "submit %d: %s", i, err.msg);
    }
    tern_engine_step(e, &err);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.running == 1 && st.waiting == 2, "after one step: running %d waiting %d", st.running, st.waiting);
    rt_drain(e, 2000);
    for (int i = 0; i < 3; i++) rt_check_ref(&REF, &c[i], p[i], 70, 6, "queued");
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
    tern_request r = rt_greedy(p, 140, 4, &big);          /* 9 blocks > 8 */
    tern_error err = {0};
    CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_ENOMEM && strstr(err.msg, "KV blocks") && strstr(err.msg, "pool holds 8"),
          "never fits: %s", err.msg);
    r = rt_greedy(p, 100, 100, &clip);                    /* fits, but 200 tokens would not */
    CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "clip submit: %s", err.msg);
    rt_drain(e, 2000);
    CHECK(clip.done && clip.finish == TERN_FINISH_LENGTH && clip.n_tok == 8 * 16 - 100, "clipped to the pool: %d tokens, finish %d",
          clip.n_tok, clip.finish);
    rt_check_ref(&REF, &clip, p, 100, 28, "clipped");
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
        tern_request r = rt_greedy(p, 40, 8, &c);
        tern_engine_submit(e, &r, NULL, &err);
        rt_drain(e, 500);
        rt_check_ref(&REF, &c, p, 40, 8, "budgeted engine");
        tern_engine_close(e);
    }
    o.memory_budget_gb = 200e3 / 1073741824.0;
    o.kv_memory_gb = 1.0;
    e = NULL;
    CHECK(tern_engine_open(&e, &o, &err) == TERN_EINVAL && strstr(err.msg, "does not fit"), "kv memory over budget: %s", err.msg);
    tern_engine_close(e);
}

/* 6 layers: 4 sliding (window 64, 1 kv head x 32) + 2 full (1 kv head x 64); 0 on success */
static int gemma_cfg(tern_model_config *cfg) {
    tern_error err = {0};
    const char *js = "{\"model_type\": \"gemma4_text\", \"vocab_size\": 256, \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 6, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32,"
                     " \"global_head_dim\": 64, \"sliding_window\": 64, \"max_position_embeddings\": 4096,"
                     " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\","
                     " \"sliding_attention\", \"sliding_attention\", \"full_attention\"]}";
    if (tern_config_parse(cfg, js, strlen(js), "fit", &err)) { printf("  fit config: %s\n", err.msg); return -1; }
    return 0;
}

/* gemma_cfg's config and a one-thread CPU backend, for the pool tests; 0 when both opened. */
static int pool_setup(tern_model_config *cfg, tern_backend **be) {
    tern_backend_opts bo = {.n_threads = 1};
    tern_error err = {0};
    if (gemma_cfg(cfg)) return -1;
    if (!tern_backend_cpu_open(be, &bo, &err)) return 0;
    printf("  cpu backend: %s\n", err.msg);
    tern_config_free(cfg);
    return -1;
}

static void pool_teardown(tern_model_config *cfg, tern_backend *be) {
    tern_backend_close(be);
    tern_config_free(cfg);
}

TEST(fit_numbers) {
    tern_model_config cfg;
    tern_error err = {0};
    if (gemma_cfg(&cfg)) { CHECK(0, "config"); return; }
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
    CHECK(f.max_ctx > 0 && f.max_ctx < 1024 && tern_fit_kv_pool(&cfg, NULL, f.max_ctx, 4, 32, 16) <= f.kv_avail &&
          tern_fit_kv_pool(&cfg, NULL, f.max_ctx + 1, 4, 32, 16) > f.kv_avail, "max ctx %d at 4", f.max_ctx);
    tern_config_free(&cfg);
}

/* The sliding pool written out here, not with kv.c's helper: w = window blocks + 1 (a window's
 * first position may sit anywhere in a block), c = chunk blocks; one slot holds at most
 * min(ctx blocks, w + c); n slots at most n * (w + 1) + c (each its window and a decode block,
 * plus the chunk the step's prefill rows share). */
static long sliding_blocks(int window, int ctx, int n, int chunk) {
    long mb = (ctx + 15) / 16, w = (window + 15) / 16 + 1, c = (chunk + 15) / 16;
    long one = mb < w + c ? mb : w + c;
    return TERN_MIN(n * one, n * (w + 1) + c);
}

static tern_kv *open_pool(tern_backend *be, const tern_model_config *cfg, const tern_kv_fmt *fmt, int n, int ctx,
                          int chunk, size_t memory) {
    tern_kv_opts ko = {.n_slots = n, .max_ctx = ctx, .chunk = chunk, .formats = fmt, .memory = memory};
    tern_kv *kv = NULL;
    tern_error err = {0};
    if (tern_kv_open(&kv, be, cfg, &ko, &err)) printf("  kv %d x %d chunk %d: %s\n", n, ctx, chunk, err.msg);
    return kv;
}

/* (a) the pool's blocks follow the rule; (b) it allocates exactly what tern_fit_plan counts */
TEST(sliding_pool_size) {
    tern_model_config cfg;
    tern_backend *be = NULL;
    tern_error err = {0};
    if (pool_setup(&cfg, &be)) { CHECK(0, "setup"); return; }
    const struct { int n, ctx, chunk; } cs[] = {{1, 1024, 32}, {1, 1024, 512}, {4, 1024, 32}, {4, 1024, 256}, {8, 1024, 512},
                                                {3, 48, 256}, {6, 256, 8}, {2, 4096, 2048}};
    const char *modes[] = {"off", "bf16", "8"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        tern_kv_fmt *fmt = NULL;
        if (tern_kv_quant_plan(modes[m], NULL, &cfg, &fmt, NULL, &err)) { CHECK(0, "kv-quant %s: %s", modes[m], err.msg); continue; }
        for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
            const int n = cs[i].n, ctx = cs[i].ctx, chunk = cs[i].chunk;
            tern_kv *kv = open_pool(be, &cfg, fmt, n, ctx, chunk, 0);
            if (!kv) { CHECK(0, "open"); continue; }
            int used, full, sl;
            tern_kv_usage(kv, 0, &used, &full);
            tern_kv_usage(kv, 1, &used, &sl);
            CHECK(full == n * ((ctx + 15) / 16) && sl == sliding_blocks(64, ctx, n, chunk),
                  "%s %d x %d chunk %d: full %d sliding %d blocks (expected %d, %ld)", modes[m], n, ctx, chunk, full, sl,
                  n * ((ctx + 15) / 16), sliding_blocks(64, ctx, n, chunk));
            tern_fit f;
            tern_fit_opts fo = {.ctx = ctx, .max_concurrency = n, .max_batch_tokens = chunk};
            size_t pool = tern_kv_pool_bytes(kv);
            CHECK(tern_fit_plan(&cfg, fmt, 1000, &fo, &f, &err) == TERN_OK && f.kv_total == pool &&
                  tern_fit_kv_pool(&cfg, fmt, ctx, n, chunk, 16) == pool && (n > 1 || f.kv_seq == pool),
                  "%s %d x %d chunk %d: kv pool %zu bytes, fit kv_total %zu, kv_seq %zu", modes[m], n, ctx, chunk, pool,
                  f.kv_total, f.kv_seq);
            /* opts.memory: both groups scale by memory / the pool's bytes */
            tern_kv *half = open_pool(be, &cfg, fmt, n, ctx, chunk, pool / 2);
            if (half) {
                int hf, hs;
                tern_kv_usage(half, 0, &used, &hf);
                tern_kv_usage(half, 1, &used, &hs);
                CHECK(abs(2 * hf - full) <= 2 && abs(2 * hs - sl) <= 2 && tern_kv_pool_bytes(half) <= pool / 2,
                      "%s %d x %d half memory: %d + %d blocks of %d + %d", modes[m], n, ctx, hf, hs, full, sl);
                tern_kv_close(half);
            }
            tern_kv_close(kv);
        }
        free(fmt);
    }
    pool_teardown(&cfg, be);
}

/* Steps as the scheduler builds them (a decode row for every sequence past its prompt, prefill
 * chunks in slot order from the rows left, at most `chunk` rows in all; trim after the step;
 * a finished sequence is released and another starts) never run the sliding group short. */
TEST(sliding_pool_steps) {
    tern_model_config cfg;
    tern_backend *be = NULL;
    tern_error err = {0};
    if (pool_setup(&cfg, &be)) { CHECK(0, "setup"); return; }
    const struct { int n, chunk; } cs[] = {{4, 64}, {6, 40}, {3, 256}, {8, 17}};
    unsigned long long seed = 77;
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        const int n = cs[i].n, chunk = cs[i].chunk, ctx = 1024;
        tern_kv *kv = open_pool(be, &cfg, NULL, n, ctx, chunk, 0);
        if (!kv) { CHECK(0, "open"); continue; }
        int len[8] = {0}, prompt[8] = {0}, past[8] = {0}, peak = 0, total, used, bad = 0, done = 0;
        for (int step = 0; step < 3000 && !bad; step++) {
            for (int k = 0; k < n; k++)
                if (!len[k]) {   /* a new sequence: prompt 1..900, then up to 100 generated */
                    prompt[k] = 1 + (int)(test_rand_u64(&seed) % 900);
                    len[k] = TERN_MIN(ctx, prompt[k] + 1 + (int)(test_rand_u64(&seed) % 100));
                    past[k] = 0;
                }
            int rows[8], left = chunk;
            for (int k = 0; k < n; k++) left -= past[k] >= prompt[k];
            for (int k = 0; k < n; k++) {
                rows[k] = past[k] >= prompt[k] ? 1 : TERN_MIN(prompt[k] - past[k], TERN_MAX(left, 0));
                if (past[k] < prompt[k]) left -= rows[k];
                if (rows[k] && tern_kv_reserve(kv, k, past[k] + rows[k], &err)) {
                    CHECK(0, "%d slots chunk %d step %d slot %d: %s", n, chunk, step, k, err.msg);
                    bad = 1;
                    break;
                }
            }
            tern_kv_usage(kv, 1, &used, &total);
            peak = TERN_MAX(peak, used);
            for (int k = 0; k < n && !bad; k++) {
                past[k] += rows[k];
                tern_kv_trim(kv, k, past[k]);
                if (past[k] >= len[k]) { tern_kv_release(kv, k); len[k] = 0; done++; }
            }
        }
        printf("  %d slots, chunk %d: %d sequences; sliding blocks used at most %d of %d (one slot alone: %ld)\n", n, chunk,
               done, peak, total, sliding_blocks(64, ctx, 1, chunk));
        tern_kv_close(kv);
    }
    pool_teardown(&cfg, be);
}

/* (d) max_conc and max_ctx from a budget: n sequences fit, n + 1 do not, and the pools tern_kv_open
 * allocates for them agree */
TEST(fit_limits_match_pool) {
    tern_model_config cfg;
    tern_backend *be = NULL;
    tern_error err = {0};
    if (pool_setup(&cfg, &be)) { CHECK(0, "setup"); return; }
    const int ctx = 1024, chunk = 256, C = 4;
    tern_fit f;
    tern_fit_opts fo = {.ctx = ctx, .max_concurrency = C, .max_batch_tokens = chunk};
    CHECK(tern_fit_plan(&cfg, NULL, 1000, &fo, &f, &err) == TERN_OK, "plan: %s", err.msg);
    /* a budget leaving exactly the pool of 5 sequences: 5 x one sequence is more (the chunk counted 5 times) */
    size_t pool5 = tern_fit_kv_pool(&cfg, NULL, ctx, 5, chunk, 16);
    fo.budget_gb = (1000.0 + (double)f.scratch + (double)pool5 + 0.5) / 1073741824.0;
    CHECK(tern_fit_plan(&cfg, NULL, 1000, &fo, &f, &err) == TERN_OK && f.fits, "budget plan: %s", err.msg);
    CHECK(f.kv_avail >= pool5 && f.max_conc == 5 && 5 * f.kv_seq > f.kv_avail, "max_conc %d (avail %zu, pool of 5 %zu, "
          "one sequence %zu)", f.max_conc, f.kv_avail, pool5, f.kv_seq);
    tern_kv *a = open_pool(be, &cfg, NULL, f.max_conc, ctx, chunk, 0), *b = open_pool(be, &cfg, NULL, f.max_conc + 1, ctx, chunk, 0);
    CHECK(a && b && tern_kv_pool_bytes(a) <= f.kv_avail && tern_kv_pool_bytes(b) > f.kv_avail,
          "%d sequences: %zu bytes, %d: %zu, avail %zu", f.max_conc, tern_kv_pool_bytes(a), f.max_conc + 1,
          tern_kv_pool_bytes(b), f.kv_avail);
    tern_kv_close(a);
    tern_kv_close(b);
    a = open_pool(be, &cfg, NULL, C, f.max_ctx, chunk, 0);
    b = open_pool(be, &cfg, NULL, C, f.max_ctx + 1, chunk, 0);
    CHECK(f.max_ctx > ctx && a && b && tern_kv_pool_bytes(a) <= f.kv_avail && tern_kv_pool_bytes(b) > f.kv_avail,
          "max_ctx %d at %d: %zu bytes, +1 token: %zu, avail %zu", f.max_ctx, C, a ? tern_kv_pool_bytes(a) : 0,
          b ? tern_kv_pool_bytes(b) : 0, f.kv_avail);
    tern_kv_close(a);
    tern_kv_close(b);
    pool_teardown(&cfg, be);
}

static tern_engine *demo_engine(int conc, int mbt, double kv_gb) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = "demo";
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = conc;
    o.max_ctx = 256;
    o.max_batch_tokens = mbt;
    o.kv_memory_gb = kv_gb;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) printf("  demo engine: %s\n", err.msg);
    return e;
}

/* (c) the demo model (3 sliding layers, window 32, + 1 full) with 3 slots and 64-row steps: its
 * pool keeps 16 sliding blocks (3 x 4 + 4), not 3 x 7. Prompts of 40, 150 and 120 tokens prefill
 * in the same steps; each gives the tokens it gives alone, without preemption. With 60 % of that
 * pool they still do (rows shrink or requests wait / are preempted). */
TEST(sliding_prefill_together) {
    enum { N = 3, GEN = 10 };
    const int lens[N] = {40, 150, 120};
    static int32_t p[N][160];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < lens[i]; j++) p[i][j] = 3 + (j * (37 + 6 * i) + 11 * i) % 250;
    rt_col ref[N];
    tern_engine *alone = demo_engine(1, 64, 0);
    if (!alone) { CHECK(0, "demo engine"); return; }
    tern_error err = {0};
    for (int i = 0; i < N; i++) {
        memset(&ref[i], 0, sizeof ref[i]);
        tern_request r = rt_greedy(p[i], lens[i], GEN, &ref[i]);
        CHECK(tern_engine_submit(alone, &r, NULL, &err) == TERN_OK, "alone %d: %s", i, err.msg);
        rt_drain(alone, 2000);
        CHECK(ref[i].done && ref[i].n_tok == GEN, "alone %d: %d tokens (%s)", i, ref[i].n_tok, ref[i].err_msg);
    }
    tern_engine_close(alone);
    const size_t block_bytes = 16 * 768;   /* the three sliding layers' bytes per token x 16 */
    for (int pass = 0; pass < 2; pass++) {
        /* pass 1: 60 % of the pool (the full group's 48 blocks of 512 B/token scale too) */
        double gbytes = pass ? 0.6 * (48.0 * 16 * 512 + 16.0 * block_bytes) / 1073741824.0 : 0;
        tern_engine *e = demo_engine(N, 64, gbytes);
        if (!e) { CHECK(0, "demo engine"); return; }
        tern_engine_stats st;
        tern_engine_get_stats(e, &st);
        CHECK(pass || st.kv_blocks_total == 3 * 16 + sliding_blocks(32, 256, 3, 64), "pool of %d blocks", st.kv_blocks_total);
        rt_col c[N];
        for (int i = 0; i < N; i++) {
            memset(&c[i], 0, sizeof c[i]);
            tern_request r = rt_greedy(p[i], lens[i], GEN, &c[i]);
            CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "submit %d: %s", i, err.msg);
        }
        tern_engine_step(e, &err);
        tern_engine_get_stats(e, &st);
        CHECK(pass || st.running == N, "after one step: running %d of %d", st.running, N);
        rt_drain(e, 2000);
        for (int i = 0; i < N; i++)
            CHECK(c[i].done && c[i].finish == TERN_FINISH_LENGTH && c[i].n_tok == GEN &&
                  !memcmp(c[i].toks, ref[i].toks, sizeof(int32_t) * GEN), "pass %d request %d: %d tokens (%s), differ "
                  "from alone", pass, i, c[i].n_tok, c[i].err_msg);
        tern_engine_get_stats(e, &st);
        CHECK(pass || st.preemptions == 0, "preemptions %lld", st.preemptions);
        CHECK(st.kv_blocks_used == 0, "blocks used %d after all", st.kv_blocks_used);
        printf("  demo, %d prompts at once, %s pool (%d blocks): %lld preemptions\n", N, pass ? "60 %" : "the whole",
               st.kv_blocks_total, st.preemptions);
        tern_engine_close(e);
    }
}

int main(void) {
    if (!rt_model_dir() || rt_ref_open(&REF)) { printf("FAIL: setup: tiny model\n"); return 1; }
    RUN(waits_instead_of_thrashing);
    RUN(never_fits_and_clipping);
    RUN(memory_budget_sizing);
    RUN(fit_numbers);
    RUN(sliding_pool_size);
    RUN(sliding_pool_steps);
    RUN(fit_limits_match_pool);
    RUN(sliding_prefill_together);
    rt_ref_close(&REF);
    return test_done();
}
