/*
 * test_model_g4_batch.c — Gemma 4 batch decode at the real head dims (256 on sliding layers, 512 on full ones) through
 * whole models: small random-weight models cut from the presets (src/io/presets.c), whose attention keeps the real
 * geometry while the rest shrinks (hidden 512, 6 layers, a 16-token window, vocabulary 1024):
 *   - g12: gemma4-12b's layout — attention_k_eq_v full layers (V is the raw K), one global KV head;
 *   - e4b: gemma4-e4b's — per-layer inputs (PLE) and KV-shared layers (the last two: q only, reading layers 3 and 1).
 * Each sequence is prefilled alone (19-23 tokens: past the window), then two decode steps run every sequence in one
 * batch (16 or 64 rows: the row counts of the batch decode paths, e.g. CUDA's norm_qkv_norm_rope_kv at 9..128).
 *   - CPU (always): the batched decode steps equal the same steps run one row at a time (<= 1e-4 rel L2 per row: the
 *     CPU may pick other kernels for one row and for many).
 *   - CUDA (TERN_TEST_DEVICE=cuda, the bf16 compute mode; otherwise one visible SKIP line): the logits against the CPU
 *     f32 run, with ops.h norm_qkv_norm_rope_kv (TERN_CUDA_G4_QKV, default 3) and without (0): the joined path must
 *     not be further from f32 than the separate ops beyond the bf16 mode's noise (<= 1.5x their error + 5e-3; Gemma 4's
 *     random-weight bf16 runs sit up to ~0.1 from f32, test_model_tp's note), never wildly off (<= 0.5), and it must
 *     have served calls (tern__cuda_qkv_nrk_calls: prefill chunks of 19-23 rows take it too). The second step reads
 *     the pages the first one wrote.
 */
#include "io/config.h"
#include "io/presets.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/kv.h"
#include "test.h"

#include <cjson/cJSON.h>

#if TERN_HAVE_CUDA
extern int tern__cuda_g4_qkv;
extern unsigned long long tern__cuda_qkv_nrk_calls;
#endif

#define MAXS 64
#define STEPS 2

typedef struct geo { const char *name, *preset, *patch; } geo;
static const geo k_geos[] = {
    {"g12", "gemma4-12b",
     "{\"hidden_size\": 512, \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
     " \"num_global_key_value_heads\": 1, \"intermediate_size\": 1024, \"sliding_window\": 16, \"vocab_size\": 1024}"},
    {"e4b", "gemma4-e4b",
     "{\"hidden_size\": 512, \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
     " \"intermediate_size\": 1024, \"sliding_window\": 16, \"num_kv_shared_layers\": 2, \"vocab_size\": 1024,"
     " \"hidden_size_per_layer_input\": 64, \"vocab_size_per_layer_input\": 1024, \"layer_types\": [\"sliding_attention\","
     " \"full_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"]}"},
};

/* the preset's config.json with the patch's fields replaced or added */
static tern_status make_cfg(const geo *g, tern_model_config *cfg, tern_error *e) {
    cJSON *js = cJSON_Parse(tern_preset_config(g->preset)), *patch = cJSON_Parse(g->patch);
    tern_status s = TERN_EFORMAT;
    if (js && patch) {
        for (cJSON *it = patch->child; it; it = it->next) {
            if (cJSON_GetObjectItem(js, it->string)) cJSON_ReplaceItemInObject(js, it->string, cJSON_Duplicate(it, 1));
            else cJSON_AddItemToObject(js, it->string, cJSON_Duplicate(it, 1));
        }
        char *txt = cJSON_PrintUnformatted(js);
        memset(cfg, 0, sizeof *cfg);
        s = txt ? tern_config_parse(cfg, txt, strlen(txt), g->name, e) : TERN_ENOMEM;
        cJSON_free(txt);
    }
    cJSON_Delete(js);
    cJSON_Delete(patch);
    return s;
}

static int plen(int s) { return 19 + s % 5; }
static int32_t tok_at(int s, int i, int V) { return (int32_t)((s * 131u + i * 37u + 7u) % (unsigned)(V - 3) + 3u); }

/* S sequences prefilled one by one, then STEPS decode steps of all S rows (one = 1: each row its own forward);
 * out [STEPS][S][V]. The synthetic store draws each tensor's values as the model asks for it, so every run opens its
 * own (the same seed and load order: the same weights on every backend) */
static tern_status run(tern_backend *be, const tern_model_config *cfg, int S, int one, float *out, tern_error *e) {
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_weights *ws = NULL;
    tern_model_opts mo = {.max_batch = MAXS};
    tern_synth_spec sp = {.bits = 0, .seed = 29};
    tern_status s = tern_weights_open_synth(&ws, cfg, &sp, e);
    if (!s) s = tern_model_load_from(&m, cfg, ws, be, &mo, e);
    tern_kv_opts ko = {.n_slots = S, .max_ctx = 32, .block_size = 16, .chunk = MAXS};
    if (!s) s = tern_kv_open(&kv, be, cfg, &ko, e);
    const int V = cfg->n_vocab;
    int32_t tok[MAXS], pos[MAXS], slot[MAXS];
    for (int q = 0; !s && q < S; q++) { /* prefill */
        const int n = plen(q);
        for (int i = 0; i < n; i++) { tok[i] = tok_at(q, i, V); pos[i] = i; slot[i] = q; }
        float *lg = malloc(sizeof(float) * (size_t)n * V);
        s = lg ? tern_kv_reserve(kv, q, n, e) : TERN_ENOMEM;
        tern_batch b = {.n = n, .tokens = tok, .pos = pos, .slot = slot};
        if (!s) s = tern_model_forward(m, &b, kv, lg, e);
        free(lg);
    }
    for (int t = 0; !s && t < STEPS; t++) {
        for (int q = 0; q < S; q++) {
            tok[q] = tok_at(q, 100 + t, V);
            pos[q] = plen(q) + t;
            slot[q] = q;
            if (!s) s = tern_kv_reserve(kv, q, pos[q] + 1, e);
        }
        float *o = out + (size_t)t * S * V;
        if (one) {
            for (int q = 0; !s && q < S; q++) {
                tern_batch b = {.n = 1, .tokens = tok + q, .pos = pos + q, .slot = slot + q};
                s = tern_model_forward(m, &b, kv, o + (size_t)q * V, e);
            }
        } else if (!s) {
            tern_batch b = {.n = S, .tokens = tok, .pos = pos, .slot = slot};
            s = tern_model_forward(m, &b, kv, o, e);
        }
    }
    tern_kv_close(kv);
    tern_model_free(m);
    tern_weights_close(ws);
    return s;
}

/* the worst row's rel L2 of a against b over [STEPS][S][V] */
static double worst_row(const float *a, const float *b, int S, int V) {
    double w = 0;
    for (int r = 0; r < STEPS * S; r++) {
        const double d = test_rel_l2(a + (size_t)r * V, b + (size_t)r * V, (size_t)V);
        w = d > w || d != d ? d : w;
    }
    return w;
}

typedef struct model_in { tern_model_config cfg; int ok; } model_in;
static void model_open(const geo *g, model_in *mi) {
    tern_error e = {0};
    memset(mi, 0, sizeof *mi);
    tern_status s = make_cfg(g, &mi->cfg, &e);
    int full = 0, sliding = 0;
    for (int l = 0; !s && l < mi->cfg.n_layer; l++) {
        full += mi->cfg.layers[l].type == TERN_LAYER_FULL;
        sliding += mi->cfg.layers[l].type != TERN_LAYER_FULL;
    }
    CHECK(!s, "%s: %s", g->name, e.msg);
    CHECK(s || (full && sliding), "%s: %d full and %d sliding layers (both kinds wanted)", g->name, full, sliding);
    mi->ok = !s && full && sliding;
}
static void model_close(model_in *mi) { tern_config_free(&mi->cfg); }

static tern_backend *cpu_open(void) {
    tern_backend *be = NULL;
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2, .compute = TERN_COMPUTE_F32};
    if (tern_backend_cpu_open(&be, &o, &e)) printf("  cpu: %s\n", e.msg);
    return be;
}

TEST(g4_batch_cpu_rows_alone) {
    tern_backend *be = cpu_open();
    CHECK(be != NULL, "cpu backend");
    for (size_t gi = 0; be && gi < sizeof k_geos / sizeof k_geos[0]; gi++) {
        model_in mi;
        model_open(&k_geos[gi], &mi);
        if (!mi.ok) { model_close(&mi); continue; }
        const int S = 16, V = mi.cfg.n_vocab;
        float *a = malloc(sizeof(float) * STEPS * S * V), *b = malloc(sizeof(float) * STEPS * S * V);
        tern_error e = {0};
        tern_status s = run(be, &mi.cfg, S, 0, a, &e);
        if (!s) s = run(be, &mi.cfg, S, 1, b, &e);
        CHECK(!s, "%s: %s", k_geos[gi].name, e.msg);
        if (!s) {
            const double w = worst_row(a, b, S, V);
            printf("  %s: %d rows a step vs one at a time, worst row %.2e\n", k_geos[gi].name, S, w);
            CHECK(w <= 1e-4, "%s: batched decode differs from rows alone: %.3e", k_geos[gi].name, w);
        }
        free(a); free(b);
        model_close(&mi);
    }
    tern_backend_close(be);
}

#if TERN_HAVE_CUDA
static tern_backend *g_gpu; /* main opens it when TERN_TEST_DEVICE=cuda */

TEST(g4_batch_cuda_qkv_nrk) {
    tern_backend *gpu = g_gpu, *cpu = cpu_open();
    tern_error e = {0};
    const int keep = tern__cuda_g4_qkv;
    for (size_t gi = 0; cpu && gi < sizeof k_geos / sizeof k_geos[0]; gi++) {
        model_in mi;
        model_open(&k_geos[gi], &mi);
        for (int S = 16; mi.ok && S <= MAXS; S *= 4) {
            const int V = mi.cfg.n_vocab;
            const size_t sz = sizeof(float) * STEPS * S * V;
            float *ref = malloc(sz), *on = malloc(sz), *off = malloc(sz);
            tern_status s = run(cpu, &mi.cfg, S, 0, ref, &e);
            tern__cuda_g4_qkv = 3;
            const unsigned long long c0 = tern__cuda_qkv_nrk_calls;
            if (!s) s = run(gpu, &mi.cfg, S, 0, on, &e);
            const unsigned long long calls = tern__cuda_qkv_nrk_calls - c0;
            tern__cuda_g4_qkv = 0;
            if (!s) s = run(gpu, &mi.cfg, S, 0, off, &e);
            CHECK(!s, "%s, %d rows: %s", k_geos[gi].name, S, e.msg);
            if (!s) {
                const double eon = worst_row(on, ref, S, V), eoff = worst_row(off, ref, S, V);
                const double d = worst_row(on, off, S, V);
                printf("  %s, %d rows, bf16 vs cpu f32 (worst row): joined q|k|v %.2e, separate ops %.2e; joined vs "
                       "separate %.2e; %llu joined calls\n", k_geos[gi].name, S, eon, eoff, d, calls);
                CHECK(eon <= 1.5 * eoff + 5e-3 && eon <= 0.5, "%s, %d rows: joined %.3e against separate %.3e",
                      k_geos[gi].name, S, eon, eoff);
                CHECK(calls > 0, "%s, %d rows: norm_qkv_norm_rope_kv served no call", k_geos[gi].name, S);
            }
            free(ref); free(on); free(off);
        }
        model_close(&mi);
    }
    tern__cuda_g4_qkv = keep;
    tern_backend_close(cpu);
}
#endif

int main(void) {
    RUN(g4_batch_cpu_rows_alone);
    const char *dev = getenv("TERN_TEST_DEVICE");
    if (!dev || strcmp(dev, "cuda")) {
        SKIP("g4_batch_cuda_qkv_nrk", "cuda: not asked for (TERN_TEST_DEVICE=cuda runs it on the GPU)");
        return test_done();
    }
#if TERN_HAVE_CUDA
    tern_error e = {0};
    tern_backend_opts o = {.compute = TERN_COMPUTE_BF16};
    if (tern_backend_cuda_open(&g_gpu, &o, &e)) {
        char why[TERN_ERROR_MSG_MAX + 16];
        snprintf(why, sizeof why, "cuda: no GPU (%s)", e.msg);
        SKIP("g4_batch_cuda_qkv_nrk", why);
    } else {
        RUN(g4_batch_cuda_qkv_nrk);
    }
    tern_backend_close(g_gpu);
#else
    SKIP("g4_batch_cuda_qkv_nrk", "cuda: built without CUDA");
#endif
    return test_done();
}
