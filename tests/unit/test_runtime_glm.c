/*
 * test_runtime_glm.c — GLM-5 (glm_moe_dsa: MLA latent pages + DSA indexer-key pages) through
 * the runtime, on the parity fixtures glm5_dsa (DSA active: index_topk 8 over longer prompts,
 * full + shared indexer layers, MoE) and glm5_dsa_fp8 (the same with FP8 block weights):
 *   - continuous batching: several requests of different lengths at once give the tokens and
 *     top-20 logprobs of each request alone (logprobs within 1e-4; the largest difference is
 *     printed; equal tokens required);
 *   - the prefix cache over latent pages: hits, partial hits and concurrent hits match the
 *     cold run the same way, and report the cached token counts;
 *   - speculative rollback (tern_kv_truncate) and KV persistence (tern_kv_save/restore, latent
 *     and indexer pages through kvfile.c): bitwise like never having appended / like the
 *     original sequence — on f32 pages and on bf16 ones (--kv-quant bf16);
 *   - `tern fit` arithmetic for the real GLM-5 / GLM-5.2 geometry equals reference/glm5.md §9
 *     (latent bytes per token, indexer keys, routed-expert bytes per token per format,
 *     parameter counts).
 * Fixtures absent -> SKIP (visible).
 */
#include "runtime_util.h"
#include "io/kv_config.h"
#include "io/presets.h"
#include "runtime/fit.h"
#include "runtime/kvfile.h"

#include <math.h>

static const char *FX[] = {"tests/parity/fixtures/glm5_dsa", "tests/parity/fixtures/glm5_dsa_fp8"};

/* rt_greedy with the top-20 logprobs the cold / hit comparisons read */
static tern_request greedy(const int32_t *p, int n, int max_new, rt_col *c) {
    tern_request r = rt_greedy(p, n, max_new, c);
    r.sampling.n_logprobs = 20;
    return r;
}

static tern_engine *open_glm(const char *model, double cache_gb, int conc) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = model;
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = conc;
    o.max_ctx = 160;
    o.max_batch_tokens = 24; /* chunked prefill: DSA selections span chunks */
    o.prompt_cache_gb = cache_gb;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) { printf("  %s: %s\n", model, err.msg); return NULL; }
    return e;
}

/* same tokens; logprob difference accumulated into *maxd; <= 1e-4 */
static int same_run(const rt_col *a, const rt_col *b, double *maxd) {
    if (!a->done || !b->done || a->n_tok != b->n_tok || a->n_tok == 0 ||
        memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n_tok))
        return 0;
    for (int k = 0; k < a->n_tok; k++) {
        double d = fabs((double)a->logprob[k] - (double)b->logprob[k]);
        if (d > *maxd) *maxd = d;
    }
    return *maxd <= 1e-4;
}

enum { NR = 4 };
static int32_t PR[NR][96];
static const int LEN[NR] = {40, 9, 70, 33};

static void prompts(int V) {
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < LEN[i]; j++) PR[i][j] = 3 + (j * 37 + 11 * i + 5) % (V - 3);
    for (int j = 0; j < 48; j++) PR[2][j] = PR[0][j % 40]; /* request 2 shares request 0's first 32+ tokens */
}

static void batching_and_prefix(const char *model) {
    tern_engine *cold = open_glm(model, 0, 4), *warm = open_glm(model, 0.01, 4);
    if (!cold || !warm) { CHECK(0, "%s: engines", model); tern_engine_close(cold); tern_engine_close(warm); return; }
    rt_col alone[NR], batch[NR], hit[NR];
    tern_error err = {0};
    for (int i = 0; i < NR; i++) { /* alone, one after the other */
        memset(&alone[i], 0, sizeof alone[i]);
        tern_request r = greedy(PR[i], LEN[i], 8, &alone[i]);
        CHECK(!tern_engine_submit(cold, &r, NULL, &err), "submit: %s", err.msg);
        rt_drain(cold, 4000);
    }
    memset(batch, 0, sizeof batch); /* all at once: continuous batching, rows of 4 sequences per step */
    for (int i = 0; i < NR; i++) {
        tern_request r = greedy(PR[i], LEN[i], 8, &batch[i]);
        CHECK(!tern_engine_submit(cold, &r, NULL, &err), "submit: %s", err.msg);
    }
    rt_drain(cold, 4000);
    double mb = 0;
    for (int i = 0; i < NR; i++)
        CHECK(same_run(&alone[i], &batch[i], &mb), "%s request %d: batched run differs from alone (%s)", model, i,
              batch[i].err_msg);
    /* prefix cache: request 0 fills it; 2 shares 32 tokens (two 16-blocks), then all at once */
    for (int i = 0; i < NR; i++) {
        memset(&hit[i], 0, sizeof hit[i]);
        tern_request r = greedy(PR[i], LEN[i], 8, &hit[i]);
        CHECK(!tern_engine_submit(warm, &r, NULL, &err), "submit: %s", err.msg);
        rt_drain(warm, 4000);
    }
    double mh = 0;
    for (int i = 0; i < NR; i++) CHECK(same_run(&alone[i], &hit[i], &mh), "%s request %d: cache-on run differs", model, i);
    CHECK(hit[2].last.n_cached == 32, "%s: request 2 n_cached %d, expected 32 (two blocks shared with request 0)", model,
          hit[2].last.n_cached);
    rt_col again[NR];
    memset(again, 0, sizeof again);
    for (int i = 0; i < NR; i++) {
        tern_request r = greedy(PR[i], LEN[i], 8, &again[i]);
        CHECK(!tern_engine_submit(warm, &r, NULL, &err), "submit: %s", err.msg);
    }
    rt_drain(warm, 4000);
    double mc = 0;
    int cached = 0;
    for (int i = 0; i < NR; i++) {
        CHECK(same_run(&alone[i], &again[i], &mc), "%s request %d: concurrent hit differs", model, i);
        cached += again[i].last.n_cached;
    }
    /* whole 16-token blocks before the last prompt token: 40 -> 32, 9 -> 0, 70 -> 64, 33 -> 32 */
    CHECK(cached == 32 + 0 + 64 + 32, "%s: concurrent hits served %d cached tokens, expected 128", model, cached);
    printf("  %s: max |logprob diff| vs alone: batch of %d %.3g, cache hits %.3g, concurrent hits %.3g (%d cached tokens)\n",
           model, NR, mb, mh, mc, cached);
    tern_engine_close(cold);
    tern_engine_close(warm);
}

TEST(glm_batching_and_prefix_cache) {
    int n = 0;
    for (size_t f = 0; f < TERN_ARRAY_LEN(FX); f++) {
        if (access(FX[f], F_OK)) { printf("SKIP: fixture %s absent\n", FX[f]); continue; }
        prompts(256);
        batching_and_prefix(FX[f]);
        n++;
    }
    CHECK(n > 0, "no GLM fixture");
}

/* ---- rollback and persistence on the model level ---- */

static tern_backend *BE;

static int fwd(tern_model *m, tern_kv *kv, int slot, const int32_t *t, int n, int pos0, float *logits) {
    int32_t pos[128], sl[128];
    uint8_t want[128] = {0};
    tern_error err = {0};
    for (int i = 0; i < n; i++) { pos[i] = pos0 + i; sl[i] = slot; }
    want[n - 1] = 1;
    if (tern_kv_reserve(kv, slot, pos0 + n, &err)) { printf("  reserve: %s\n", err.msg); return -1; }
    tern_batch b = {.n = n, .tokens = t, .pos = pos, .slot = sl, .want = want};
    if (tern_model_forward(m, &b, kv, logits, &err)) { printf("  forward: %s\n", err.msg); return -1; }
    return 0;
}

static int prefill(tern_model *m, tern_kv *kv, int slot, const int32_t *t, int n, float *logits) {
    for (int p = 0; p < n; p += 16)
        if (fwd(m, kv, slot, t + p, TERN_MIN(16, n - p), p, logits)) return -1;
    return 0;
}

static const tern_kv_fmt *g_fmt; /* the caches' page formats (NULL: f32) */
static tern_kv *open_kv(tern_model *m, int slots, int bs) {
    tern_kv_opts ko = {.n_slots = slots, .max_ctx = 128, .block_size = bs, .formats = g_fmt};
    tern_kv *kv = NULL;
    tern_error err = {0};
    if (tern_kv_open(&kv, BE, tern_model_cfg(m), &ko, &err)) printf("  kv: %s\n", err.msg);
    return kv;
}

static void kvops(const char *dir, int bs) {
    enum { NP = 45, K = 12 };
    int32_t P[NP], T[K], x = 7, *tok = NULL;
    tern_model *m = NULL;
    tern_error err = {0};
    if (tern_model_load(&m, dir, BE, NULL, &err)) { CHECK(0, "%s: %s", dir, err.msg); return; }
    int V = tern_model_cfg(m)->n_vocab, n = 0;
    uint64_t id = tern_kv_config_id(tern_model_cfg(m)) ^ tern_kv_weights_id(dir);
    for (int j = 0; j < NP; j++) P[j] = 3 + (j * 31 + 5) % (V - 3);
    for (int j = 0; j < K; j++) T[j] = 3 + (j * 17 + 2) % (V - 3);
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
    tern_kv *kr = open_kv(m, 1, bs), *ks = open_kv(m, 2, bs), *kb = open_kv(m, 3, bs);
    char path[256];
    const char *td = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/tern_glmkv_%d.bin", td && *td ? td : "/tmp", (int)getpid());
    if (!kr || !ks || !kb) { CHECK(0, "kv"); goto out; }
    /* rollback of a whole speculative round: bitwise as never appended */
    CHECK(!prefill(m, kr, 0, P, NP, tmp) && !fwd(m, kr, 0, &x, 1, NP, ref), "reference");
    CHECK(!prefill(m, ks, 1, P, NP, tmp) && !fwd(m, ks, 1, T, K, NP, tmp), "round");
    CHECK(tern_kv_truncate(ks, 1, NP, &err) == TERN_OK, "truncate: %s", err.msg);
    CHECK(!fwd(m, ks, 1, &x, 1, NP, got) && !memcmp(got, ref, sizeof(float) * V), "%s bs %d: rollback differs", dir, bs);
    /* accept 3 of K == appending those 3 (smaller batch: within 1e-5) */
    tern_kv_release(kr, 0);
    tern_kv_release(ks, 1);
    CHECK(!prefill(m, kr, 0, P, NP, tmp) && !fwd(m, kr, 0, T, 3, NP, tmp) && !fwd(m, kr, 0, &x, 1, NP + 3, ref), "ref accept");
    CHECK(!prefill(m, ks, 1, P, NP, tmp) && !fwd(m, ks, 1, T, K, NP, tmp), "round 2");
    CHECK(tern_kv_truncate(ks, 1, NP + 3, &err) == TERN_OK, "truncate 2: %s", err.msg);
    CHECK(!fwd(m, ks, 1, &x, 1, NP + 3, got), "next");
    double d = 0, r = 0;
    for (int i = 0; i < V; i++) { d += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]); r += (double)ref[i] * ref[i]; }
    d = sqrt(d / r);
    CHECK(d <= 1e-5 && tern_argmax(got, V) == tern_argmax(ref, V), "%s bs %d: accept 3 of %d: rel %.3g", dir, bs, K, d);
    /* persistence: save after the prompt, restore into another cache, continue bitwise */
    tern_kv_release(kr, 0);
    CHECK(!prefill(m, kr, 0, P, NP, tmp), "prefill");
    CHECK(tern_kv_save(kr, 0, P, NP, id, path, &err) == TERN_OK, "save: %s", err.msg);
    CHECK(!fwd(m, kr, 0, &x, 1, NP, ref), "continue original");
    CHECK(tern_kv_restore(kb, 2, id, path, &tok, &n, &err) == TERN_OK, "%s: restore: %s", dir, err.msg);
    CHECK(n == NP && tok && !memcmp(tok, P, sizeof P), "restored tokens");
    free(tok);
    CHECK(!fwd(m, kb, 2, &x, 1, NP, got) && !memcmp(got, ref, sizeof(float) * V), "%s bs %d: restored continuation differs",
          dir, bs);
    printf("  %s bs %d%s: rollback bitwise, accept-3 rel %.3g, restore bitwise\n", dir, bs, g_fmt ? " bf16 pages" : "", d);
out:
    remove(path);
    tern_kv_close(kr); tern_kv_close(ks); tern_kv_close(kb);
    tern_model_free(m);
    free(ref); free(got); free(tmp);
}

TEST(glm_rollback_and_persist) {
    tern_backend_opts bo = {.n_threads = 2};
    tern_error err = {0};
    if (tern_backend_cpu_open(&BE, &bo, &err)) { CHECK(0, "backend: %s", err.msg); return; }
    for (size_t f = 0; f < TERN_ARRAY_LEN(FX); f++) {
        if (access(FX[f], F_OK)) { printf("SKIP: fixture %s absent\n", FX[f]); continue; }
        kvops(FX[f], 4);
        kvops(FX[f], 16);
    }
    tern_model_config c; /* the latent records on bf16 pages too */
    tern_kv_fmt *bf = NULL;
    if (!access(FX[0], F_OK) && !tern_config_load(&c, FX[0], &err)) {
        CHECK(tern_kv_quant_plan("bf16", NULL, &c, &bf, NULL, &err) == TERN_OK && bf, "bf16 plan: %s", err.msg);
        g_fmt = bf;
        if (bf) kvops(FX[0], 16);
        g_fmt = NULL;
        free(bf);
        tern_config_free(&c);
    }
    tern_backend_close(BE);
}

/* ---- fit / info arithmetic on the real geometry (reference/glm5.md §9) ---- */

static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }

TEST(glm_fit_geometry) {
    tern_model_config c;
    tern_error err = {0};
    const char *js = tern_preset_config("glm5");
    CHECK(js && !tern_config_parse(&c, js, strlen(js), "glm5", &err), "glm5 preset: %s", err.msg);
    tern_fit_glm g;
    CHECK(tern_fit_glm_geometry(&c, &g), "not GLM");
    /* §9.4: 576 latent+rope values per layer = 1152 B bf16 x 78; this cache holds f32 (x2) */
    CHECK(g.latent_token == (size_t)78 * 1152 * 2 && g.latent_token == (size_t)78 * (512 + 64) * 4, "latent %zu", g.latent_token);
    /* indexer keys: 128 values per full layer = 256 B bf16, every layer of GLM-5 */
    CHECK(g.indexer_token == (size_t)78 * 256 * 2 && g.n_full_indexer == 78, "indexer %zu", g.indexer_token);
    CHECK(tern_kv_bytes_per_token(&c) == g.latent_token + g.indexer_token, "kv.c %zu vs %zu",
          tern_kv_bytes_per_token(&c), g.latent_token + g.indexer_token);
    /* §9.2 / §9.3: 743.9 B params, 40.8 B active; one expert 37.75 M; routed experts per token 45.3 GB bf16,
     * 22.7 GB fp8, 24.1 GB MLX 8-bit g64, 12.7 GB MLX 4-bit g64 (75 layers x 8 experts) */
    CHECK(near(g.params_total, 743.9e9, 0.06e9) && near(g.params_active, 40.8e9, 0.06e9), "params %.4g active %.4g",
          g.params_total, g.params_active);
    CHECK(near(g.expert_params, 37.75e6, 0.01e6) && g.n_moe == 75, "expert %.6g, %d MoE layers", g.expert_params, g.n_moe);
    CHECK(near(g.expert_token[TERN_FIT_BF16], 45.3e9, 0.06e9) && near(g.expert_token[TERN_FIT_FP8], 22.7e9, 0.06e9) &&
              near(g.expert_token[TERN_FIT_Q8], 24.1e9, 0.06e9) && near(g.expert_token[TERN_FIT_Q4], 12.7e9, 0.06e9),
          "experts/token %.4g %.4g %.4g %.4g", g.expert_token[0], g.expert_token[1], g.expert_token[2], g.expert_token[3]);
    /* §9.3 totals: bf16 1488 GB, MLX 4-bit g64 418 GB; fp8 "744 GB raw" counts every weight at 1 byte,
     * but FP8 checkpoints keep embed + lm_head (2 x 0.95 G) and the routers (75 x 1.6 M) in bf16:
     * 744 + 1.90 + 0.12 = 746.0 GB, plus 0.05 GB of F32 block scales */
    CHECK(near((double)tern_fit_weight_estimate(&c, 0, 64), 1488e9, 1e9) &&
              near((double)tern_fit_weight_estimate(&c, 4, 64), 418e9, 1e9) &&
              near((double)tern_fit_weight_estimate(&c, -1, 0), 746.1e9, 0.2e9),
          "weights %zu %zu %zu", tern_fit_weight_estimate(&c, 0, 64), tern_fit_weight_estimate(&c, 4, 64),
          tern_fit_weight_estimate(&c, -1, 0));
    tern_config_free(&c);
    /* GLM-5.2: 21 full indexer layers of 78; 743.4 B parameters */
    js = tern_preset_config("glm5.2");
    CHECK(js && !tern_config_parse(&c, js, strlen(js), "glm5.2", &err), "glm5.2 preset: %s", err.msg);
    tern_fit_glm_geometry(&c, &g);
    CHECK(g.n_full_indexer == 21 && g.indexer_token == (size_t)21 * 128 * 4 && near(g.params_total, 743.4e9, 0.06e9),
          "glm5.2: %d full, %zu B, %.4g params", g.n_full_indexer, g.indexer_token, g.params_total);
    tern_config_free(&c);
}

/* runtime_util.h helpers this file does not use */
void *glm_unused_[] = {(void *)rt_prompt, (void *)rt_ref_greedy, (void *)rt_ref_close, (void *)rt_ref_open,
                       (void *)rt_model_dir};

int main(void) {
    char tmp[] = "/tmp/tern_rtg_XXXXXX";
    const char *pre = getenv("TERN_CACHE");
    if (!pre || !*pre) { if (!mkdtemp(tmp)) { printf("FAIL: mkdtemp\n"); return 1; } setenv("TERN_CACHE", tmp, 1); }
    RUN(glm_fit_geometry);
    RUN(glm_rollback_and_persist);
    RUN(glm_batching_and_prefix_cache);
    if (!pre || !*pre) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd)) {}
    }
    return test_done();
}
