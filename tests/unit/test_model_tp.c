/*
 * test_model_tp.c — tensor + expert parallelism (src/model/tp.h) against one rank.
 *
 * For every Llama-family, Gemma 4 and GLM-5 fixture in tests/parity/fixtures: the logits of one
 * forward over all_ids with N = 2 and 4 ranks equal N = 1 within 1e-5 rel L2 per row (the
 * all-reduce sums in another order) with the same argmax on every row, stay within the parity
 * bound of the transformers reference, and greedy decoding (prefill + incremental steps through
 * the ranks' mirrored KV caches) reproduces all_ids exactly. A two-sequence batch checks that
 * every rank follows rank 0's block tables. Geometries that cannot split are refused with a
 * message (MLX q4 with 64-wide groups over 4 ranks; the small quantized GLM-5 fixtures, whose
 * quantized splits tests/parity/tp_glm_quant.mjs covers on partly dequantized copies). CPU
 * ranks by default; TERN_TEST_DEVICE=cuda puts rank i on GPU i (NCCL) and skips when fewer
 * GPUs exist; TERN_TEST_TP="2,4" picks the sizes. TERN_TEST_COMPUTE=bf16 runs every rank in the
 * bf16 compute mode: logits within the fixture's bf16 bound (parity_util.h pu_bf16_bound: max(2e-2,
 * 2 x transformers' own bf16 error)) of one rank and of the reference; argmax and greedy tokens are
 * reported, not required.
 */
#include "model/tp.h"
#include "io/presets.h"
#include "io/weights.h"
#include "tp_util.h"
#include "parity_util.h"
#include "tern.h"
#include "runtime/generate.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>

#define FIXDIR "tests/parity/fixtures"
/* N ranks vs one: only the summation order of the split matmuls differs. Llama-family rows
 * measure <= 1.2e-6; Gemma 4 up to 2.6e-5 (its extra norms after o_proj / down_proj amplify the
 * last-bit differences; one rank is itself ~2e-5 from the transformers reference there). */
#define TP_BOUND 5e-5
/* bf16 compute mode: the bound of test_parity's bf16 mode (one device vs the reference) */

static const char *k_cases[] = {"llama3", "qwen2", "qwen3", "llama3_fp8", "gemma4_dense", "gemma4_f32",
                                "gemma4_e2b_like", "gemma4_perlayer", "gemma4_unified", "gemma4_moe_like",
                                "gemma4_moe_mixed", "gemma4_dense_q4g64", "gemma4_e2b_q8g32",
                                /* GLM-5 from here (k_first_glm) */
                                "glm5_dense", "glm5_dsa", "glm5_yarn", "glm5_dsa_q4", "glm5_dsa_fp8"};
enum { k_first_glm = 13 };

static int g_cuda, g_bf16;

/* What one group size produces for a fixture. */
typedef struct run_out {
    tern_status st;
    char msg[600];
    float *logits;          /* [na, V]: one forward over all_ids */
    float *pair;            /* [2, V]: last rows of two sequences in one batch */
    int32_t *gen;           /* greedy continuation */
    int n_gen;
    int V;
} run_out;

typedef struct gen_ctx { int32_t *out; int n; } gen_ctx;
static int on_tok(void *ctx, int tok) { gen_ctx *g = ctx; g->out[g->n++] = tok; return 0; }

static void run(const char *dir, int N, const int32_t *all, int na, int np, run_out *o) {
    memset(o, 0, sizeof *o);
    tern_error e = {0};
    tern_tp *tp = NULL;
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_tp_opts to = {.n = N, .cuda = g_cuda, .n_threads = 0, .compute = g_bf16 ? TERN_COMPUTE_BF16 : TERN_COMPUTE_F32};
    tern_status s = tern_tp_open(&tp, &to, &e);
    if (!s) s = tern_tp_load_dir(tp, dir, NULL, &m, &e);
    tern_kv_opts ko = {.n_slots = 2, .max_ctx = na + 8, .block_size = 4};
    if (!s) s = tern_tp_kv_open(tp, &ko, &kv, &e);
    if (s) goto out;
    int V = o->V = tern_model_cfg(m)->n_vocab;
    o->logits = malloc(sizeof(float) * (size_t)na * V);
    o->pair = malloc(sizeof(float) * 2 * (size_t)V);
    o->gen = malloc(sizeof(int32_t) * (size_t)na);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)2 * na), *slot = malloc(sizeof(int32_t) * (size_t)2 * na);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)2 * na);
    uint8_t *want = calloc((size_t)2 * na, 1);
    for (int i = 0; i < na; i++) { pos[i] = i; slot[i] = 0; }
    /* one forward over all_ids */
    if (!(s = tern_kv_reserve(kv, 0, na, &e))) {
        tern_batch b = {.n = na, .tokens = all, .pos = pos, .slot = slot};
        s = tern_model_forward(m, &b, kv, o->logits, &e);
    }
    tern_kv_release(kv, 0);
    /* two sequences in one batch: slot 1 first (np rows), then slot 0 (na rows); last rows want logits */
    if (!s && !(s = tern_kv_reserve(kv, 1, np, &e)) && !(s = tern_kv_reserve(kv, 0, na, &e))) {
        int n = 0;
        for (int i = 0; i < np; i++, n++) { tok[n] = all[i]; pos[n] = i; slot[n] = 1; want[n] = i == np - 1; }
        for (int i = 0; i < na; i++, n++) { tok[n] = all[i]; pos[n] = i; slot[n] = 0; want[n] = i == na - 1; }
        tern_batch b = {.n = n, .tokens = tok, .pos = pos, .slot = slot, .want = want};
        s = tern_model_forward(m, &b, kv, o->pair, &e);
    }
    tern_kv_release(kv, 0);
    tern_kv_release(kv, 1);
    /* greedy: prefill in chunks of 3 rows, then one row per step */
    if (!s) {
        gen_ctx g = {o->gen, 0};
        s = tern_generate(m, kv, 1, all, np, na - np, 3, NULL, 0, NULL, NULL, on_tok, &g, NULL, &e);
        o->n_gen = g.n;
    }
    free(pos); free(slot); free(tok); free(want);
out:
    o->st = s;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    tern_tp_close(tp);
}

static void free_out(run_out *o) { free(o->logits); free(o->pair); free(o->gen); }

static int g_sizes[4] = {2, 4}, g_n_sizes = 2;

static void check_case(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    snprintf(path, sizeof path, "%s/ref.json", dir);
    char *js = pu_slurp(path, NULL);
    if (!js) { printf("  %s: no fixture\n", name); return; }
    cJSON *ref = cJSON_Parse(js);
    int32_t *prompt, *all;
    int np = pu_json_ids(ref, "prompt_ids", &prompt), na = pu_json_ids(ref, "all_ids", &all);
    size_t nbytes = 0;
    snprintf(path, sizeof path, "%s/ref_logits.f32", dir);
    float *oracle = (float *)pu_slurp(path, &nbytes);
    int quant = strstr(name, "_q") || strstr(name, "mixed") || strstr(name, "_fp8");
    /* bf16: the fixture's bf16 bound (parity_util.h) both against the reference and against N = 1
     * (ranks round their partial sums at other points than one GPU does) */
    const double bb = g_bf16 ? pu_bf16_bound(FIXDIR, name) : 0;
    double bound = g_bf16 ? bb : quant ? 1e-3 : 1e-4, tp_bound = g_bf16 ? bb : TP_BOUND;
    run_out one;
    run(dir, 1, all, na, np, &one);
    CHECK(one.st == TERN_OK, "%s N=1: %s", name, one.msg);
    int V = one.V;
    double one_ref = 0;
    for (int t = 0; oracle && !one.st && t < na; t++)
        one_ref = fmax(one_ref, test_rel_l2(one.logits + (size_t)t * V, oracle + (size_t)t * V, (size_t)V));
    if (oracle && nbytes != (size_t)na * V * sizeof(float)) { free(oracle); oracle = NULL; }
    for (int si = 0; si < g_n_sizes && !one.st; si++) {
        int N = g_sizes[si];
        run_out o;
        run(dir, N, all, na, np, &o);
        if (o.st == TERN_EUNSUPPORTED) { /* a geometry that does not split: refused with its reason */
            printf("  %s N=%d refused: %s\n", name, N, o.msg);
            CHECK(strstr(o.msg, "tensor parallel") != NULL, "%s N=%d: refusal should say why: %s", name, N, o.msg);
            free_out(&o);
            continue;
        }
        CHECK(o.st == TERN_OK, "%s N=%d: %s", name, N, o.msg);
        if (o.st) { free_out(&o); continue; }
        double worst = 0, worst_ref = 0;
        int bad_arg = -1;
        for (int t = 0; t < na; t++) {
            const float *a = o.logits + (size_t)t * V, *b = one.logits + (size_t)t * V;
            double r = test_rel_l2(a, b, (size_t)V);
            if (r > worst) worst = r;
            if (oracle) {
                double rr = test_rel_l2(a, oracle + (size_t)t * V, (size_t)V);
                if (rr > worst_ref) worst_ref = rr;
            }
            if (tern_argmax(a, V) != tern_argmax(b, V) && bad_arg < 0) bad_arg = t;
        }
        CHECK(worst <= tp_bound, "%s N=%d: logits differ from N=1 by %.3g rel", name, N, worst);
        CHECK(g_bf16 || bad_arg < 0, "%s N=%d: argmax differs at row %d", name, N, bad_arg);
        CHECK(!oracle || worst_ref <= bound, "%s N=%d: %.3g rel from the reference (bound %.0e)", name, N, worst_ref, bound);
        double pr = test_rel_l2(o.pair, one.pair, 2 * (size_t)V);
        CHECK(pr <= tp_bound, "%s N=%d: two-sequence batch differs by %.3g rel", name, N, pr);
        int same = o.n_gen == na - np;
        for (int i = 0; same && i < o.n_gen; i++) same = o.gen[i] == all[np + i];
        CHECK(g_bf16 || same, "%s N=%d: greedy tokens differ (%d generated)", name, N, o.n_gen);
        printf("  %s N=%d: max rel vs N=1 %.2e, vs reference %.2e (N=1: %.2e), greedy %s\n", name, N, worst, worst_ref, one_ref,
               same ? "identical" : "DIFFERENT");
        free_out(&o);
    }
    free_out(&one);
    free(oracle);
    free(prompt);
    free(all);
    cJSON_Delete(ref);
    free(js);
}

TEST(tp_parity_llama) {
    for (size_t i = 0; i < 4; i++) check_case(k_cases[i]);
}

TEST(tp_parity_gemma4) {
    for (size_t i = 4; i < k_first_glm; i++) check_case(k_cases[i]);
}

/* GLM-5: heads split (MLA), latent cache + DSA indexer + router replicated, experts by id,
 * shared experts and dense first layers like a dense MLP. The quantized fixtures are too small
 * to split (FP8 blocks of 128, MLX groups of 32 against 16..48 columns per rank): refused,
 * naming the tensor. */
TEST(tp_parity_glm5) {
    for (size_t i = k_first_glm; i < TERN_ARRAY_LEN(k_cases); i++) check_case(k_cases[i]);
}

#ifndef TERN_CORE_ONLY
/* The engine (scheduler, prefix cache, speculative rollback) over a 2-rank group: three requests
 * one after another reproduce the reference continuation; the second and third share the first's
 * full prompt blocks through the prefix cache (when the prompt fills one) and the third verifies
 * drafts (tables rolled back). */
typedef struct ereq { int32_t toks[64]; int n, done, failed; } ereq;
static int on_ev(void *ctx, const tern_event *ev) {
    ereq *r = ctx;
    if (ev->kind == TERN_EV_TOKEN && r->n < 64) r->toks[r->n++] = ev->token;
    if (ev->kind != TERN_EV_TOKEN) { r->done = 1; r->failed = ev->kind == TERN_EV_ERROR; }
    return 0;
}

static void engine_case(const char *name, int N, int expect_cached) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    snprintf(path, sizeof path, "%s/ref.json", dir);
    char *js = pu_slurp(path, NULL);
    if (!js) return;
    cJSON *ref = cJSON_Parse(js);
    int32_t *prompt, *all;
    int np = pu_json_ids(ref, "prompt_ids", &prompt), na = pu_json_ids(ref, "all_ids", &all);
    tern_engine_opts o = tern_engine_default_opts();
    o.model = dir;
    o.device = g_cuda ? "cuda" : "cpu";
    o.compute_bf16 = g_bf16; /* not the GPU default (bf16): the greedy ids are the f32 reference's */
    o.gpus = N;
    o.max_concurrency = 4;
    o.prompt_cache_gb = 0.01;
    tern_engine *eng = NULL;
    tern_error e = {0};
    CHECK(tern_engine_open(&eng, &o, &e) == TERN_OK, "%s gpus=%d: %s", name, N, e.msg);
    ereq rq[3];
    memset(rq, 0, sizeof rq);
    for (int i = 0; eng && i < 3; i++) {
        tern_request r = tern_request_default();
        r.prompt = prompt;
        r.n_prompt = np;
        r.max_tokens = na - np;
        r.sampling.temperature = 0;
        r.ignore_eos = 1;
        r.speculative_k = i == 2 ? 3 : 0;
        r.on_event = on_ev;
        r.ctx = &rq[i];
        CHECK(tern_engine_submit(eng, &r, NULL, &e) == TERN_OK, "%s", e.msg);
        for (int k = 0; k < 10000 && !rq[i].done; k++) /* one after another: later ones hit the prefix cache */
            if (tern_engine_step(eng, &e)) { CHECK(0, "step: %s", e.msg); break; }
    }
    for (int i = 0; eng && i < 3; i++) {
        int same = rq[i].done && !rq[i].failed && rq[i].n == na - np;
        for (int t = 0; same && t < rq[i].n; t++) same = rq[i].toks[t] == all[np + t];
        CHECK(same, "%s gpus=%d request %d: tokens differ from the reference (%d generated)", name, N, i, rq[i].n);
    }
    if (eng) { /* the later requests really took the prefix cache and the speculative path */
        tern_engine_stats es;
        tern_engine_get_stats(eng, &es);
        printf("  %s gpus=%d: %lld prompt tokens from the prefix cache, %lld drafted (%lld accepted)\n", name, N,
               es.cached_tokens, es.spec_drafted, es.spec_accepted);
        CHECK(!expect_cached || es.cached_tokens > 0, "%s gpus=%d: no prompt token came from the prefix cache", name, N);
    }
    tern_engine_close(eng);
    free(prompt);
    free(all);
    cJSON_Delete(ref);
    free(js);
}

TEST(tp_engine) {
    /* llama3 / gemma4_moe_like prompts (13, 14 tokens) are shorter than one KV block: nothing to
     * share; glm5_dsa's 24 share one block of 16 (latent cache + DSA past index_topk = 8 keys) */
    engine_case("llama3", g_sizes[0], 0);
    engine_case("gemma4_moe_like", g_sizes[0], 0);
    engine_case("glm5_dsa", g_sizes[0], 1);
}
#endif

/* MLX q4 with groups of 64 over 4 ranks: o_proj's 128 inputs give 32 per rank -> refused, named. */
TEST(tp_refuses_unsplittable_groups) {
    tern_error e = {0};
    tern_tp *tp = NULL;
    tern_model *m = NULL;
    tern_tp_opts to = {.n = 4, .cuda = 0};
    tern_status s = tern_tp_open(&tp, &to, &e);
    CHECK(s == TERN_OK, "%s", e.msg);
    if (!s) s = tern_tp_load_dir(tp, FIXDIR "/gemma4_dense_q4g64", NULL, &m, &e);
    CHECK(s == TERN_EUNSUPPORTED && strstr(e.msg, "group size"), "status %d: %s", (int)s, e.msg);
    tern_tp_close(tp);
    /* heads that do not divide */
    tp = NULL;
    to.n = 3;
    s = tern_tp_open(&tp, &to, &e);
    if (!s) s = tern_tp_load_dir(tp, FIXDIR "/llama3", NULL, &m, &e);
    CHECK(s == TERN_EUNSUPPORTED && strstr(e.msg, "num_attention_heads"), "status %d: %s", (int)s, e.msg);
    tern_tp_close(tp);
    /* GLM-5: 4 MLA heads over 3 ranks; FP8 q_b_proj rows below one scale block, named */
    tp = NULL;
    s = tern_tp_open(&tp, &to, &e);
    if (!s) s = tern_tp_load_dir(tp, FIXDIR "/glm5_dsa", NULL, &m, &e);
    CHECK(s == TERN_EUNSUPPORTED && strstr(e.msg, "num_attention_heads"), "status %d: %s", (int)s, e.msg);
    tern_tp_close(tp);
    tp = NULL;
    to.n = 2;
    s = tern_tp_open(&tp, &to, &e);
    if (!s) s = tern_tp_load_dir(tp, FIXDIR "/glm5_dsa_fp8", NULL, &m, &e);
    CHECK(s == TERN_EUNSUPPORTED && strstr(e.msg, "q_b_proj") && strstr(e.msg, "FP8"), "status %d: %s", (int)s, e.msg);
    tern_tp_close(tp);
}

/* A synthetic (random-weight) store under expert parallelism makes only each rank's experts: glm5-tiny widened
 * to 64 experts of 1024 (8 MB of q4 codes a stack, so they are buffers of their own and the store's byte count
 * sees them) holds experts for 2 ranks in about the bytes of one — not each rank all 64 and a view of its half,
 * which for GLM-5 over 8 ranks was 8 x 370 GB of host memory. A step through the group then runs. */
static size_t synth_group_bytes(int N, tern_status *st, char *msg, size_t cap) {
    tern_error e = {0};
    tern_model_config cfg;
    tern_weights *ws = NULL;
    tern_tp *tp = NULL;
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    memset(&cfg, 0, sizeof cfg);
    cJSON *js = cJSON_Parse(tern_preset_config("glm5-tiny"));
    cJSON_ReplaceItemInObject(js, "n_routed_experts", cJSON_CreateNumber(64));
    cJSON_ReplaceItemInObject(js, "moe_intermediate_size", cJSON_CreateNumber(1024));
    char *txt = cJSON_PrintUnformatted(js);
    tern_synth_spec sp = {.bits = 4, .group_size = 64, .seed = 11};
    tern_status s = tern_config_parse(&cfg, txt, strlen(txt), "glm5-tiny-wide", &e);
    if (!s) s = tern_weights_open_synth(&ws, &cfg, &sp, &e);
    tern_tp_opts to = {.n = N, .cuda = 0, .compute = TERN_COMPUTE_F32};
    if (!s) s = tern_tp_open(&tp, &to, &e);
    if (!s) s = tern_tp_load(tp, &cfg, ws, NULL, &m, &e);
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = 16, .block_size = 4};
    if (!s) s = tern_tp_kv_open(tp, &ko, &kv, &e);
    float *lg = malloc(sizeof(float) * 3 * (size_t)cfg.n_vocab);
    if (!s) s = tern_kv_reserve(kv, 0, 3, &e);
    if (!s) {
        int32_t tok[3] = {5, 77, 1234}, pos[3] = {0, 1, 2}, slot[3] = {0, 0, 0};
        tern_batch b = {.n = 3, .tokens = tok, .pos = pos, .slot = slot};
        s = tern_model_forward(m, &b, kv, lg, &e);
        for (int i = 0; !s && i < 3 * cfg.n_vocab; i++)
            if (!isfinite(lg[i])) s = tern_err(&e, TERN_EFORMAT, "logit %d not finite", i);
    }
    size_t bytes = tern_weights_synth_bytes(ws);
    *st = s;
    snprintf(msg, cap, "%s", e.msg);
    free(lg);
    tern_tp_close(tp);
    tern_weights_close(ws);
    tern_config_free(&cfg);
    cJSON_free(txt);
    cJSON_Delete(js);
    return bytes;
}

TEST(tp_synth_local_experts) {
    char msg[600];
    tern_status s1, s2;
    size_t b1 = synth_group_bytes(1, &s1, msg, sizeof msg);
    CHECK(s1 == TERN_OK, "one rank: %s", msg);
    size_t b2 = synth_group_bytes(2, &s2, msg, sizeof msg);
    CHECK(s2 == TERN_OK, "two ranks: %s", msg);
    /* routed experts: 3 MoE layers x 3 stacks x 64 x 1024 x 256 q4 codes (their scales sit in shared slabs) */
    size_t experts = (size_t)3 * 3 * 64 * 1024 * 256 / 2;
    printf("  synthetic glm5-tiny, 64 experts: one rank %.1f MB, two ranks %.1f MB (routed expert codes %.1f MB)\n",
           b1 / 1e6, b2 / 1e6, experts / 1e6);
    CHECK(b1 > experts, "one rank made %zu bytes, fewer than the experts' %zu", b1, experts);
    CHECK(b2 + experts <= 2 * b1, "two ranks made %zu bytes: the experts twice (one rank %zu)", b2, b1);
}

int main(void) {
    const char *dev = getenv("TERN_TEST_DEVICE"), *sz = getenv("TERN_TEST_TP");
    g_cuda = dev && !strcmp(dev, "cuda");
    const char *comp = getenv("TERN_TEST_COMPUTE");
    g_bf16 = comp && !strcmp(comp, "bf16");
    if (sz && *sz) {
        g_n_sizes = 0;
        for (const char *p = sz; *p && g_n_sizes < 4;) {
            int v = atoi(p);
            if (v >= 2 && v <= TERN_TP_MAX) g_sizes[g_n_sizes++] = v;
            while (*p && *p != ',') p++;
            if (*p) p++;
        }
    }
    if (g_cuda) { /* enough GPUs for the largest size? */
        int need = 1;
        for (int i = 0; i < g_n_sizes; i++) need = TERN_MAX(need, g_sizes[i]);
        if (!tp_gpus_ok(need, "tp_parity")) return 0;
    }
    RUN(tp_parity_llama);
    RUN(tp_parity_gemma4);
    RUN(tp_parity_glm5);
    if (!g_cuda) RUN(tp_refuses_unsplittable_groups);
    if (!g_cuda) RUN(tp_synth_local_experts);
#ifndef TERN_CORE_ONLY
    RUN(tp_engine);
#endif
    return test_done();
}
