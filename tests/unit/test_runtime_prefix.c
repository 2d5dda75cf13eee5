/*
 * test_runtime_prefix.c — reference-counted KV blocks (kv.c) and the prefix cache
 * (prefix.c + its use in the scheduler) on the tiny random Llama.
 *
 * Oracle as in test_runtime_engine.c: a request served from cached blocks must produce the
 * tokens tern_generate produces alone on a fresh cache. Checked: reuse of whole blocks only,
 * the last prompt token always recomputed, several requests sharing one cached prefix at
 * once, multi-turn reuse of generated tokens, eviction under a tiny pool, the cache's blocks
 * accounted in the stats, and sliding-window models (demo + Gemma 4 fixtures): hits, partial
 * hits and concurrent hits give bitwise the tokens and top-20 logprobs of a cold run.
 */
#include "runtime_util.h"
#include "runtime/prefix.h"

#include <math.h>

static rt_ref REF;

TEST(kv_refcounts) {
    tern_model_config cfg;
    char json[600];
    snprintf(json, sizeof json, "{\"model_type\": \"llama\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
             " \"max_position_embeddings\": 256}", RT_V, RT_H, RT_FF, RT_L, RT_NH, RT_NKV, RT_D);
    tern_error err = {0};
    CHECK(tern_config_parse(&cfg, json, strlen(json), "test", &err) == TERN_OK, "config: %s", err.msg);
    tern_kv *kv = NULL;
    tern_kv_opts ko = {.n_slots = 2, .max_ctx = 64, .memory = RT_BLOCK_BYTES * 6};
    CHECK(tern_kv_open(&kv, REF.be, &cfg, &ko, &err) == TERN_OK, "kv: %s", err.msg);
    if (!kv) { tern_config_free(&cfg); return; }
    int used, total;
    tern_kv_usage(kv, 0, &used, &total);
    CHECK(total == 6 && used == 0, "total %d used %d", total, used);
    CHECK(tern_kv_reserve(kv, 0, 40, &err) == TERN_OK, "reserve");
    int32_t b[3];
    for (int i = 0; i < 3; i++) { b[i] = tern_kv_block(kv, 0, i); CHECK(b[i] >= 0 && tern_kv_refcount(kv, b[i]) == 1, "block %d", i); }
    CHECK(tern_kv_block(kv, 0, 3) == -1, "no 4th block");
    for (int i = 0; i < 2; i++) tern_kv_ref(kv, b[i]);              /* the "cache" keeps two */
    CHECK(tern_kv_share(kv, 1, b, 2, &err) == TERN_OK, "share: %s", err.msg);
    CHECK(tern_kv_refcount(kv, b[0]) == 3, "refcount %d", tern_kv_refcount(kv, b[0]));
    CHECK(tern_kv_share(kv, 1, b, 1, &err) == TERN_EINVAL, "share into occupied entries refused");
    CHECK(tern_kv_reserve(kv, 1, 40, &err) == TERN_OK, "reserve after share");
    tern_kv_usage(kv, 0, &used, &total);
    CHECK(used == 4, "used %d (3 + 1 private)", used);
    tern_kv_release(kv, 0);
    tern_kv_usage(kv, 0, &used, &total);
    CHECK(used == 3 && tern_kv_refcount(kv, b[2]) == 0, "after release of slot 0: used %d", used);
    tern_kv_release(kv, 1);
    tern_kv_usage(kv, 0, &used, &total);
    CHECK(used == 2, "cache references keep 2 blocks: %d", used);
    tern_kv_unref(kv, b[0]); tern_kv_unref(kv, b[1]);
    tern_kv_unref(kv, b[1]);                                          /* extra unref: ignored */
    tern_kv_usage(kv, 0, &used, &total);
    CHECK(used == 0, "all free: %d", used);
    CHECK(tern_kv_reserve(kv, 0, 64, &err) == TERN_OK && tern_kv_reserve(kv, 1, 40, &err) == TERN_ENOMEM, "pool accounting intact");
    tern_kv_close(kv);
    tern_config_free(&cfg);
}

TEST(reuse_and_multiturn) {
    tern_engine *e = rt_engine_pc(4, 32, 0, 256, 0.01);
    if (!e) { CHECK(0, "engine"); return; }
    int32_t p[200];
    rt_prompt(p, 50, 77);
    rt_col a = {0}, b = {0};
    tern_request r = rt_greedy(p, 50, 12, &a);
    tern_error err = {0};
    tern_engine_submit(e, &r, NULL, &err);
    rt_drain(e, 1000);
    rt_check_ref(&REF, &a, p, 50, 12, "first");
    CHECK(a.last.n_cached == 0, "cold cache: n_cached %d", a.last.n_cached);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_cached == 3 && st.kv_blocks_used == 3, "blocks of 61 written tokens cached: %d (used %d)", st.kv_blocks_cached, st.kv_blocks_used);
    r = rt_greedy(p, 50, 12, &b);
    tern_engine_submit(e, &r, NULL, &err);
    rt_drain(e, 1000);
    rt_check_ref(&REF, &b, p, 50, 12, "repeat");
    CHECK(b.last.n_cached == 48, "repeat: n_cached %d (3 whole blocks)", b.last.n_cached);
    /* exactly two blocks: the last token is recomputed, so only one block is reused */
    rt_col c = {0};
    r = rt_greedy(p, 32, 4, &c);
    tern_engine_submit(e, &r, NULL, &err);
    rt_drain(e, 1000);
    rt_check_ref(&REF, &c, p, 32, 4, "two blocks");
    CHECK(c.last.n_cached == 16, "two-block prompt: n_cached %d", c.last.n_cached);
    /* multi-turn: prompt + answer + a new turn reuses the answer's blocks too */
    memcpy(p + 50, a.toks, sizeof(int32_t) * 12);
    rt_prompt(p + 62, 20, 78);
    rt_col d = {0};
    r = rt_greedy(p, 82, 12, &d);
    tern_engine_submit(e, &r, NULL, &err);
    rt_drain(e, 1000);
    rt_check_ref(&REF, &d, p, 82, 12, "multi-turn");
    CHECK(d.last.n_cached == 48, "multi-turn: n_cached %d (61 tokens were written: 3 blocks)", d.last.n_cached);
    tern_engine_get_stats(e, &st);
    CHECK(st.cached_tokens == 48 + 16 + 48 && st.prefix_hit_rate > 0, "cached_tokens %lld", st.cached_tokens);
    CHECK(st.kv_blocks_used == st.kv_blocks_cached && st.running == 0, "idle: used %d cached %d", st.kv_blocks_used, st.kv_blocks_cached);
    tern_engine_close(e);
}

TEST(shared_concurrently) {
    tern_engine *e = rt_engine_pc(4, 24, 0, 256, 0.01);
    if (!e) { CHECK(0, "engine"); return; }
    int32_t p[5][60];
    rt_prompt(p[0], 60, 90);
    for (int i = 1; i < 5; i++) { memcpy(p[i], p[0], sizeof(int32_t) * 40); rt_prompt(p[i] + 40, 20, 90 + (unsigned long long)i); }
    rt_col c[5] = {0};
    tern_error err = {0};
    tern_request r = rt_greedy(p[0], 60, 6, &c[0]);
    tern_engine_submit(e, &r, NULL, &err);
    rt_drain(e, 1000);
    for (int i = 1; i < 5; i++) { r = rt_greedy(p[i], 60, 10, &c[i]); tern_engine_submit(e, &r, NULL, &err); }
    rt_drain(e, 1000);
    rt_check_ref(&REF, &c[0], p[0], 60, 6, "warm-up");
    for (int i = 1; i < 5; i++) {
        rt_check_ref(&REF, &c[i], p[i], 60, 10, "sharer");
        CHECK(c[i].last.n_cached == 32, "sharer %d: n_cached %d", i, c[i].last.n_cached);
    }
    tern_engine_close(e);
}

TEST(eviction_under_pressure) {
    /* 8 blocks of KV for 3 slots, cache allowed to hold all of them */
    tern_engine *e = rt_engine_pc(3, 16, (double)(RT_BLOCK_BYTES * 8) / 1073741824.0 * 1.0001, 256, 1.0);
    if (!e) { CHECK(0, "engine"); return; }
    enum { N = 10 };
    int32_t p[N][50];
    int len[N];
    rt_col c[N] = {0};
    tern_error err = {0};
    for (int i = 0; i < N; i++) {
        len[i] = 20 + 3 * i;
        rt_prompt(p[i], len[i], 200 + (unsigned long long)(i % 4));   /* some repeat earlier prefixes */
        tern_request r = rt_greedy(p[i], len[i], 8, &c[i]);
        tern_engine_submit(e, &r, NULL, &err);
        if (i % 3 == 2) rt_drain(e, 2000);
    }
    rt_drain(e, 5000);
    for (int i = 0; i < N; i++) rt_check_ref(&REF, &c[i], p[i], len[i], 8, "pressure");
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used == st.kv_blocks_cached && st.kv_blocks_cached <= 8, "used %d cached %d", st.kv_blocks_used, st.kv_blocks_cached);
    CHECK(st.cached_tokens > 0, "some reuse: %lld", st.cached_tokens);
    tern_engine_close(e);
}

/* Sliding-window models: a hit must give bitwise the logits of a cold run. The engine does not
 * expose logits, so each request asks for 20 top logprobs per token: tokens and all those
 * values are compared bitwise against an engine with the cache off. */
typedef struct sl_run { rt_col c; } sl_run;

static tern_engine *open_model_ctx(const char *model, double cache_gb, int conc, int ctx, int mbt) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = model;
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = conc;
    o.max_ctx = ctx;
    o.max_batch_tokens = mbt;
    o.prompt_cache_gb = cache_gb;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) { printf("  %s: %s\n", model, err.msg); return NULL; }
    return e;
}

/* 24-row steps: chunked prefill, sliding blocks are trimmed between chunks */
static tern_engine *open_model(const char *model, double cache_gb) { return open_model_ctx(model, cache_gb, 3, 160, 24); }

static void run_one(tern_engine *e, const int32_t *p, int n, rt_col *c) {
    memset(c, 0, sizeof *c);
    tern_request r = rt_greedy(p, n, 8, c);
    r.sampling.n_logprobs = 20;
    tern_error err = {0};
    if (tern_engine_submit(e, &r, NULL, &err)) { printf("  submit: %s\n", err.msg); return; }
    rt_drain(e, 2000);
}

/* Same tokens, logprobs within 1e-4; *maxd accumulates the largest difference. Bitwise equality
 * needs batch-invariant kernels: a hit prefills fewer rows (and concurrent hits decode several
 * rows at once) than the cold run, and some CPU kernels (MoE grouping, n>1 matmul vs gemv)
 * round differently with the row count. */
static int close_run(const rt_col *a, const rt_col *b, double *maxd) {
    if (!a->done || !b->done || a->n_tok != b->n_tok || a->n_tok == 0 ||
        memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n_tok)) return 0;
    for (int k = 0; k < a->n_tok; k++) {
        double d = fabs((double)a->logprob[k] - (double)b->logprob[k]);
        if (d > *maxd) *maxd = d;
    }
    return *maxd <= 1e-4;
}

static void sliding_case(const char *model, int vocab) {
    double max_alone = 0, max_conc = 0;
    enum { NP = 4 };
    static int32_t p[NP][120];
    int len[NP] = {70, 70, 75, 100};
    for (int i = 0; i < NP; i++) for (int j = 0; j < len[i]; j++) p[i][j] = 3 + (j * 37 + 11) % (vocab - 3);
    for (int j = 40; j < len[2]; j++) p[2][j] = 3 + (j * 53 + 5) % (vocab - 3);      /* shares 40 tokens */
    for (int j = 17; j < len[3]; j++) p[3][j] = 3 + (j * 29 + 1) % (vocab - 3);      /* shares 17 */
    tern_engine *cold = open_model(model, 0), *warm = open_model(model, 0.01);
    if (!cold || !warm) { CHECK(0, "%s: engines", model); tern_engine_close(cold); tern_engine_close(warm); return; }
    rt_col ref[NP], got[NP];
    for (int i = 0; i < NP; i++) run_one(cold, p[i], len[i], &ref[i]);
    for (int i = 0; i < NP; i++) run_one(warm, p[i], len[i], &got[i]);
    int want_cached[NP] = {0, 64, 32, 16};
    for (int i = 0; i < NP; i++) {
        CHECK(close_run(&ref[i], &got[i], &max_alone), "%s request %d: tokens/logprobs differ from the cold run (%s)", model, i, got[i].err_msg);
        CHECK(got[i].last.n_cached == want_cached[i], "%s request %d: n_cached %d, expected %d", model, i,
              got[i].last.n_cached, want_cached[i]);
    }
    /* concurrently: three hits at once, sharing the cached blocks */
    rt_col c3[3] = {0};
    tern_error err = {0};
    for (int i = 0; i < 3; i++) {
        tern_request r = rt_greedy(p[i + 1], len[i + 1], 8, &c3[i]);
        r.sampling.n_logprobs = 20;
        tern_engine_submit(warm, &r, NULL, &err);
    }
    rt_drain(warm, 2000);
    for (int i = 0; i < 3; i++) {
        CHECK(close_run(&ref[i + 1], &c3[i], &max_conc) && c3[i].last.n_cached > 0, "%s concurrent hit %d: tokens differ", model, i);
    }
    /* the same three together with the cache off: the batch alone explains the difference */
    rt_col k3[3] = {0};
    double max_cold = 0;
    for (int i = 0; i < 3; i++) {
        tern_request r = rt_greedy(p[i + 1], len[i + 1], 8, &k3[i]);
        r.sampling.n_logprobs = 20;
        tern_engine_submit(cold, &r, NULL, &err);
    }
    rt_drain(cold, 2000);
    for (int i = 0; i < 3; i++) CHECK(close_run(&ref[i + 1], &k3[i], &max_cold), "%s: cold batch %d", model, i);
    printf("  %s: max |logprob diff| vs cold alone: hit alone %.3g (%s); hits in a batch of 3 %.3g; cold in a batch of 3 %.3g\n",
           model, max_alone, max_alone == 0 ? "bitwise" : "kernels not batch-invariant", max_conc, max_cold);
    tern_engine_stats st;
    tern_engine_get_stats(warm, &st);
    CHECK(st.kv_blocks_cached > 0 && st.running == 0, "%s: cached blocks %d", model, st.kv_blocks_cached);
    tern_engine_close(cold);
    tern_engine_close(warm);
}

/* A shared prompt much longer than the sliding pool (one slot: window + one 512-row chunk):
 * the cache must give up old sliding blocks, yet keep the window before the shared boundary. */
static void sliding_pressure(void) {
    enum { SYS = 1024, N = SYS + 16 };
    static int32_t p[N];
    for (int j = 0; j < SYS; j++) p[j] = 3 + (j * 37 + 11) % 250;
    tern_engine *cold = open_model_ctx("demo", 0, 1, 1200, 512), *warm = open_model_ctx("demo", 0.05, 1, 1200, 512);
    if (!cold || !warm) { CHECK(0, "demo engines"); tern_engine_close(cold); tern_engine_close(warm); return; }
    double maxd = 0;
    for (int i = 0; i < 3; i++) {
        for (int j = SYS; j < N; j++) p[j] = 3 + (j * 13 + 7 * i) % 250;
        rt_col ref, got;
        run_one(cold, p, N, &ref);
        run_one(warm, p, N, &got);
        CHECK(close_run(&ref, &got, &maxd), "pressure request %d differs from the cold run", i);
        CHECK(got.last.n_cached == (i ? SYS : 0), "pressure request %d: n_cached %d, expected %d", i, got.last.n_cached, i ? SYS : 0);
    }
    printf("  demo, %d shared tokens through a %d-token sliding pool: max |logprob diff| %.3g\n", SYS, 35 * 16, maxd);
    tern_engine_close(cold);
    tern_engine_close(warm);
}

TEST(sliding_models_hit_same_logits) {
    char dir[] = "/tmp/tern_rtp_XXXXXX";
    const char *pre = getenv("TERN_CACHE");
    if (!pre || !*pre) { if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; } setenv("TERN_CACHE", dir, 1); }
    sliding_case("demo", 256);
    sliding_pressure();
    const char *fx[] = {"gemma4_dense", "gemma4_e2b_like", "gemma4_moe_like", "gemma4_perlayer"};
    for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/parity/fixtures/%s", fx[i]);
        if (access(path, F_OK)) { printf("SKIP: fixture %s absent\n", fx[i]); continue; }
        sliding_case(path, 256);
    }
    if (!pre || !*pre) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) {}
        unsetenv("TERN_CACHE");
    }
}

int main(void) {
    if (!rt_model_dir() || rt_ref_open(&REF)) { printf("FAIL: setup: tiny model\n"); return 1; }
    RUN(kv_refcounts);
    RUN(reuse_and_multiturn);
    RUN(shared_concurrently);
    RUN(eviction_under_pressure);
    RUN(sliding_models_hit_same_logits);
    rt_ref_close(&REF);
    return test_done();
}
