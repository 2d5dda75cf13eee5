/*
 * test_parity.c — model logits against Hugging Face transformers (DESIGN.md §5).
 *
 * For every folder in tests/parity/fixtures/ (config + safetensors + ref.json + ref_logits.f32):
 *   - one forward over all_ids: every row within the bound (rel L2) and the same argmax;
 *   - greedy generation from prompt_ids reproduces all_ids exactly (prefill + decode path);
 *   - batch invariance: the sequence and a shorter prefix of it in one batch (two slots, rows
 *     interleaved) give the same logits as alone.
 * Bound: 1e-4 for float checkpoints (f32 path is exact arithmetic); MLX-quantized and FP8 (`_fp8`)
 * fixtures are compared with their dequantized reference at 1e-3 (the kernels sum scale·Σxq + bias·Σx
 * per group, a different rounding order than dequantize-then-dot; FP8 measures ~1e-6).
 * The int8 compute mode (CPU, TERN_COMPUTE_INT8: x quantized per weight group for Q8/Q4 matmuls)
 * runs as a second pass: over the MLX-quantized fixtures (batch invariance ≤ 1e-4; their error vs
 * the reference is printed, not bounded: these tiny random models are chaotic, see int8_synth),
 * and its logits bound on a well-conditioned synthetic llama (TERN_TEST_COMPUTE=int8: only this).
 * With TERN_TEST_DEVICE=cuda TERN_TEST_COMPUTE=int8 both run on the GPU, whose int8 mode is the bf16
 * mode with int8 x in the Q4 one-row GEMVs (so the bf16 mode's unbounded batch invariance applies).
 * The bf16 modes (CUDA; TERN_TEST_COMPUTE=bf16 | bf16x2):
 *   - bf16x2 (GEMM inputs as a bf16 pair, f32-accurate): every row within 2e-2, batch ≤ 1e-2;
 *   - bf16 (GEMM inputs rounded to bf16, as in every engine's bf16 mode): every row within
 *     max(2e-2, 2 × what transformers itself reaches in bfloat16 on that fixture) — these tiny
 *     random models are chaotic, their bf16 error is made of discrete flips (MoE routing, DSA
 *     top-k, near-tied argmaxes) that land on other rows with other rounding points, hence the
 *     factor 2 (measured on the H200: gemma4_moe_like 0.39 vs transformers' 0.23) — the figures are in
 *     fixtures/_hf_bf16.json (`make_fixtures.py --bf16-check`; a case without its own figure takes
 *     that of its nearest sibling by name — glm5_dsa_q4 → glm5_dsa, gemma4_moe_mixed → gemma4_moe_like).
 *     Batched rows are held to the same bound; batch vs alone is printed, not bounded: every n >= 2
 *     path rounds x to bf16, but a Q/FP8 weight enters the tensor-core paths as bf16 (Wh) and the
 *     fallback GEMVs exact, and n = 1 keeps f32 x (measured up to 0.064 on the chaotic quantized
 *     fixtures; BF16 weights: sum order only). With a DSA indexer, bf16 rounding moves its scores off the fixture's tie-free
 *     gaps, so top-k choices flip (transformers' own bf16 run: 1.03 on glm5_dsa) and a flip's row
 *     depends on the order of sums, i.e. on the batch: there only the rows before index_topk
 *     (every key selected, so nothing can flip) are held to a bound, the base 2e-2, alone and
 *     batched; the rest are printed.
 *   The cache is the one the engine opens on that backend (tern_kv_quant_default): BF16 pages in
 *   the bf16 mode on a GPU (as transformers' bfloat16 run keeps them), F32 otherwise.
 * TERN_TEST_CASES=SUBSTR runs only the fixtures whose name contains it (tests/cli/parity_norm_res.sh).
 */
#include "io/kv_config.h"
#include "model/model.h"
#include "parity_util.h"
#include "runtime/generate.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>

#define FIXDIR "tests/parity/fixtures"

static int g_cases, g_bf16, g_int8, g_skipped; /* g_bf16: 1 bf16, 2 bf16x2 */

/* The int8 pass covers the MLX-quantized fixtures (Q8/Q4 matmuls; others run exact). */
static int int8_case(const char *name) {
    return (strstr(name, "_q") != NULL || strstr(name, "mixed") != NULL) && !strstr(name, "_fp8");
}

static void check_case(const char *name, tern_backend *be) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    snprintf(path, sizeof path, "%s/ref.json", dir);
    char *js = pu_slurp(path, NULL);
    if (!js) return;
    g_cases++;
    cJSON *ref = cJSON_Parse(js);
    int32_t *prompt, *all;
    int np = pu_json_ids(ref, "prompt_ids", &prompt), na = pu_json_ids(ref, "all_ids", &all);
    int quant = strstr(name, "_q") != NULL || strstr(name, "mixed") != NULL || strstr(name, "_fp8") != NULL;
    double bound = g_bf16 == 1 ? pu_bf16_bound(FIXDIR, name) : g_bf16 ? 2e-2 : quant ? 1e-3 : 1e-4;
    size_t nbytes;
    snprintf(path, sizeof path, "%s/ref_logits.f32", dir);
    float *want = (float *)pu_slurp(path, &nbytes);

    tern_model *m = NULL;
    tern_error e = {0};
    tern_status s = tern_model_load(&m, dir, be, NULL, &e);
    if (s == TERN_EUNSUPPORTED && be->device >= 0) { /* a model this backend has no kernels for */
        printf("SKIP: parity_%s: %s\n", name, e.msg);
        g_skipped = 1;
        goto out;
    }
    CHECK(s == TERN_OK, "%s: load: %s", name, e.msg);
    if (s) goto out;
    const tern_model_config *cfg = tern_model_cfg(m);
    int V = cfg->n_vocab;
    CHECK(nbytes == (size_t)na * V * 4, "%s: ref_logits size %zu vs %d x %d", name, nbytes, na, V);
    if (nbytes != (size_t)na * V * 4) goto out;

    tern_kv *kv = NULL;
    tern_kv_opts ko = {.n_slots = 2, .max_ctx = na + 8, .block_size = 4};
    tern_kv_fmt *kvf = NULL; /* the cache the engine opens on this backend (bf16 mode on a GPU: BF16 pages) */
    s = tern_kv_quant_plan(tern_kv_quant_default(NULL, be->device >= 0, g_bf16 == 1), NULL, cfg, &kvf, NULL, &e);
    ko.formats = kvf;
    if (!s) s = tern_kv_open(&kv, be, cfg, &ko, &e);
    free(kvf);
    CHECK(s == TERN_OK, "%s: kv: %s", name, e.msg);
    if (s) goto out;

    /* 1. one forward over all_ids */
    float *got = malloc(sizeof(float) * (size_t)na * V);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)na * 2), *slot = calloc((size_t)na * 2, sizeof(int32_t));
    for (int i = 0; i < na; i++) pos[i] = i;
    tern_kv_reserve(kv, 0, na, &e);
    tern_batch b = {.n = na, .tokens = all, .pos = pos, .slot = slot};
    s = tern_model_forward(m, &b, kv, got, &e);
    CHECK(s == TERN_OK, "%s: forward: %s", name, e.msg);
    /* bf16 mode with a DSA indexer: the rows before index_topk (see the top of the file) */
    const int nchk = g_bf16 == 1 && cfg->index_topk > 0 && cfg->index_topk < na ? cfg->index_topk : na;
    if (nchk < na) { /* nothing can flip there: the base bound (measured <= 8.3e-3 on the H200) */
        bound = 2e-2;
        printf("  %s: DSA in the bf16 mode: rows 0..%d bounded by %.0e, the rest printed\n", name, nchk - 1, bound);
    }
    double worst = 0, rest = 0;
    int worst_row = -1, argmax_bad = 0;
    for (int t = nchk; t < na && !s; t++) {
        double r = test_rel_l2(got + (size_t)t * V, want + (size_t)t * V, (size_t)V);
        if (r > rest) rest = r;
    }
    if (nchk < na) printf("  %s: rows %d..%d: worst rel L2 %.3g\n", name, nchk, na - 1, rest);
    for (int t = 0; t < nchk && !s; t++) {
        double r = test_rel_l2(got + (size_t)t * V, want + (size_t)t * V, (size_t)V);
        if (r > worst) { worst = r; worst_row = t; }
        if (tern_argmax(got + (size_t)t * V, V) != tern_argmax(want + (size_t)t * V, V)) argmax_bad++;
    }
    printf("  %s: worst row rel L2 %.3g (row %d), argmax mismatches %d\n", name, worst, worst_row, argmax_bad);
    if (g_int8) CHECK(worst < 10.0, "%s: int8 logits not finite/bounded (rel L2 %.3g)", name, worst); /* chaotic: see int8_synth */
    else CHECK(worst <= bound, "%s: rel L2 %.3g at row %d > %.0e", name, worst, worst_row, bound);
    if (!g_bf16 && !g_int8) CHECK(argmax_bad == 0, "%s: %d rows with a different argmax", name, argmax_bad);
    tern_kv_release(kv, 0);

    /* 2. greedy continuation through prefill + decode (small prefill chunks exercise paging) */
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)na);
    memcpy(gen, prompt, sizeof(int32_t) * (size_t)np);
    struct { int32_t *buf; int n; } acc = {gen, np};
    int on_tok(void *ctx, int tok);
    s = tern_generate(m, kv, 1, prompt, np, na - np, 5, NULL, 0, NULL, NULL,
                      (tern_token_fn)on_tok, &acc, NULL, &e);
    CHECK(s == TERN_OK, "%s: generate: %s", name, e.msg);
    if (!g_bf16 && !g_int8)
        CHECK(acc.n == na && !memcmp(gen, all, sizeof(int32_t) * (size_t)na), "%s: greedy continuation differs (%d tokens)", name, acc.n);
    tern_kv_release(kv, 1);

    /* 3. batch invariance: all_ids in slot 0 and its first k tokens in slot 1, rows interleaved */
    int k = na / 2, nb = na + k, r = 0;
    int32_t *tok2 = malloc(sizeof(int32_t) * (size_t)nb);
    float *got2 = malloc(sizeof(float) * (size_t)nb * V);
    int *src = malloc(sizeof(int) * (size_t)nb);
    for (int t = 0; t < na; t++) {
        tok2[r] = all[t]; pos[r] = t; slot[r] = 0; src[r++] = t;
        if (t < k) { tok2[r] = all[t]; pos[r] = t; slot[r] = 1; src[r++] = t; }
    }
    tern_kv_reserve(kv, 0, na, &e);
    tern_kv_reserve(kv, 1, k, &e);
    tern_batch b2 = {.n = nb, .tokens = tok2, .pos = pos, .slot = slot};
    s = tern_model_forward(m, &b2, kv, got2, &e);
    CHECK(s == TERN_OK, "%s: batched forward: %s", name, e.msg);
    double bw = 0, bref = 0;
    for (int i = 0; i < nb && !s; i++) {
        double d = test_rel_l2(got2 + (size_t)i * V, got + (size_t)src[i] * V, (size_t)V);
        double r = test_rel_l2(got2 + (size_t)i * V, want + (size_t)src[i] * V, (size_t)V);
        if (src[i] >= nchk) continue; /* DSA rows past index_topk in the bf16 mode (top of the file) */
        if (d > bw) bw = d;
        if (r > bref) bref = r;
    }
    printf("  %s: batch vs alone max rel L2 %.3g (batched vs reference %.3g)\n", name, bw, bref);
    if (!g_int8) CHECK(bref <= bound, "%s: batched rows rel L2 %.3g vs reference > %.0e", name, bref, bound);
    /* int8 mode: activations rounded to int8 per group turn any difference into whole steps of the
     * grid. MoE layers on the CPU group a batch's rows by expert, so their f32 sums already differ
     * from the row alone by ~2e-6 (the f32 bound below); in int8 mode such a row can move by
     * whole grid steps. Since session 45 an expert's rows take the GEMV kernels up to 8 rows and
     * the VNNI GEMM above (two f32 orders), so a 20-row prefill alone and a 30-row batch split
     * some experts differently: gemma4_moe_mixed moves 1.3e-2 on this chaotic fixture (int8 vs
     * the reference 0.2; 2e-6 in f32). Decode rows (<= 8 an expert) take the same kernel alone or
     * batched. MoE's int8 bound is 5e-2 */
    const int moe = tern_model_cfg(m)->n_expert > 0;
    if (g_bf16 != 1) /* the bf16 mode: measured and printed above (top of the file) */
        CHECK(bw <= (g_int8 && moe ? 5e-2 : g_bf16 ? 1e-2 : g_int8 ? 1e-4 : 1e-5), "%s: batched logits differ from alone by %.3g",
              name, bw);
    free(tok2); free(got2); free(src); free(gen); free(got); free(pos); free(slot);
    tern_kv_close(kv);
out:
    tern_model_free(m);
    free(want); free(prompt); free(all);
    cJSON_Delete(ref);
    free(js);
}

int on_tok(void *ctx, int tok) {
    struct { int32_t *buf; int n; } *a = ctx;
    a->buf[a->n++] = tok;
    return 0;
}

static void parity_fixtures(int int8) {
    tern_backend *be = NULL;
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2};
    /* TERN_TEST_DEVICE=cuda runs the same fixtures on the GPU (scripts/gpu_check.sh);
     * TERN_TEST_COMPUTE=bf16 | bf16x2 selects a bf16 compute mode (bounds at the top of the file). */
    const char *dev = getenv("TERN_TEST_DEVICE"), *comp = getenv("TERN_TEST_COMPUTE");
    if (comp && !strcmp(comp, "bf16")) { o.compute = TERN_COMPUTE_BF16; g_bf16 = 1; }
    if (comp && !strcmp(comp, "bf16x2")) { o.compute = TERN_COMPUTE_BF16X2; g_bf16 = 2; }
    if (int8) { o.compute = TERN_COMPUTE_INT8; g_int8 = 1; }
    if (int8 && dev && !strcmp(dev, "cuda")) g_bf16 = 1; /* a GPU's int8 mode is its bf16 mode (Q4 GEMVs aside) */
    g_cases = 0;
    tern_status bs = dev && !strcmp(dev, "cuda") ? tern_backend_cuda_open(&be, &o, &e) : tern_backend_cpu_open(&be, &o, &e);
    if (bs) { printf("FAIL: parity: %s backend: %s\n", dev ? dev : "cpu", e.msg); t_fail_++; return; }
    printf("  parity on backend %s (%s compute)\n", be->vt->name,
           g_int8 ? "int8" : g_bf16 == 2 ? "bf16x2" : g_bf16 ? "bf16" : "f32");
    DIR *d = opendir(FIXDIR);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char refp[600];
        struct stat sb;
        snprintf(refp, sizeof refp, FIXDIR "/%s/ref.json", de->d_name);
        if (de->d_name[0] == '.' || stat(refp, &sb) != 0) continue;
        if (g_int8 && !int8_case(de->d_name)) continue;
        const char *only = getenv("TERN_TEST_CASES"); /* a substring of the fixture names to run */
        if (only && *only && !strstr(de->d_name, only)) continue;
        t_cur_fail_ = 0;
        g_skipped = 0;
        check_case(de->d_name, be);
        if (g_skipped) continue;
        const char *sfx = g_int8 ? "_int8" : "";
        if (t_cur_fail_) { printf("FAIL: parity_%s%s\n", de->d_name, sfx); t_fail_++; }
        else { printf("PASS: parity_%s%s\n", de->d_name, sfx); t_pass_++; }
        fflush(stdout);
    }
    if (d) closedir(d);
    if (!g_cases) { printf("FAIL: parity: no fixtures found under %s\n", FIXDIR); t_fail_++; }
    tern_backend_close(be);
}

/* ---- the int8 mode on a well-conditioned model ----
 * The quantized fixtures above are chaotic (random norm weights, softcaps): rounding x to bf16
 * before every matmul of the exact path already moves their logits by 0.1–0.8 rel L2, so there
 * the int8 pass checks batch invariance and reports the error. Its bound is checked here: a
 * small llama with synthetic MLX q4/q8 g64 weights (tern_weights_open_synth; norms ≈ 1), int8
 * mode vs the exact path on the same weights (itself held to the HF reference above), through
 * the prefill GEMM (one forward of all rows) and the decode GEMV (one row per step). */
#define SYNTH_LLAMA "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 2048," \
    " \"hidden_size\": 512, \"intermediate_size\": 1536, \"num_hidden_layers\": 2, \"num_attention_heads\": 8," \
    " \"num_key_value_heads\": 2, \"head_dim\": 64, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0," \
    " \"tie_word_embeddings\": true, \"max_position_embeddings\": 256}"
/* Measured (2026-11-30): q4 1.5e-3 (rounding x to bf16 instead: 7e-4); the synthetic q8
 * weights (256-level codes, the same small scales) are ill-conditioned: 0.13 (bf16 x: 0.045). With the chunk-seeded
 * synthetic fill (2026-12-04): q4 1.4e-3, q8 0.11; one q4 row's argmax flips on a tie (exact logits 5e-4 apart, the
 * row's largest error 5e-3), which the argmax check allows. */
#define INT8_SYNTH_BOUND_Q4 5e-3
#define INT8_SYNTH_BOUND_Q8 0.3

static int forward_rows(tern_model *m, tern_kv *kv, const int32_t *ids, int n, int step, float *logits, tern_error *e) {
    int V = tern_model_cfg(m)->n_vocab;
    if (tern_kv_reserve(kv, 0, n, e)) return -1;
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        int32_t pos[64], slot[64] = {0};
        for (int j = 0; j < k; j++) pos[j] = i + j;
        tern_batch b = {.n = k, .tokens = ids + i, .pos = pos, .slot = slot};
        if (tern_model_forward(m, &b, kv, logits + (size_t)i * V, e)) return -1;
    }
    tern_kv_release(kv, 0);
    return 0;
}

static int g_cuda; /* int8_synth's int8 model on the GPU */

static void int8_synth(int bits) {
    tern_model_config cfg = {0};
    tern_weights *ws[2] = {NULL, NULL}; /* one store per model: synthetic tensors are made on request */
    tern_backend *be[2] = {NULL, NULL};
    tern_model *m[2] = {NULL, NULL};
    tern_kv *kv[2] = {NULL, NULL};
    tern_error e = {0};
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 13) % 2048);
    tern_synth_spec spec = {.bits = bits, .group_size = 64, .seed = 77};
    tern_status s = tern_config_parse(&cfg, SYNTH_LLAMA, strlen(SYNTH_LLAMA), "synth-llama", &e);
    for (int k = 0; k < 2 && !s; k++) {
        tern_backend_opts o = {.n_threads = 2, .compute = k ? TERN_COMPUTE_INT8 : TERN_COMPUTE_F32};
        tern_kv_opts ko = {.n_slots = 1, .max_ctx = N + 8, .block_size = 8};
        s = tern_weights_open_synth(&ws[k], &cfg, &spec, &e);
        /* TERN_TEST_DEVICE=cuda: the int8 model on the GPU (the bf16 mode with int8 x in the Q4 one-row
         * GEMVs, gemv_mma.cu XI8), against the exact CPU path */
        if (!s) s = k && g_cuda ? tern_backend_cuda_open(&be[k], &o, &e) : tern_backend_cpu_open(&be[k], &o, &e);
        if (!s) s = tern_model_load_from(&m[k], &cfg, ws[k], be[k], NULL, &e);
        if (!s) s = tern_kv_open(&kv[k], be[k], &cfg, &ko, &e);
    }
    CHECK(s == TERN_OK, "synth q%d: %s", bits, e.msg);
    if (s) goto out;
    int V = cfg.n_vocab;
    float *ref = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    CHECK(forward_rows(m[0], kv[0], ids, N, N, ref, &e) == 0, "synth q%d exact: %s", bits, e.msg);
    for (int step = N; step >= 1; step = step == N ? 1 : 0) { /* prefill GEMM, then decode GEMV */
        CHECK(forward_rows(m[1], kv[1], ids, N, step, got, &e) == 0, "synth q%d int8: %s", bits, e.msg);
        double worst = 0;
        int amx = 0;
        for (int t = 0; t < N; t++) {
            double r = test_rel_l2(got + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
            if (!(r <= worst)) worst = r;
            /* a flip counts unless it is a tie at the int8 error's scale: the exact logits of the two picks closer
             * than twice the row's largest logit error */
            const float *gr = got + (size_t)t * V, *rr = ref + (size_t)t * V;
            int ag = tern_argmax(gr, V), ar = tern_argmax(rr, V);
            double emax = 0;
            for (int i = 0; i < V; i++) emax = fmax(emax, fabs((double)gr[i] - rr[i]));
            if (ag != ar) {
                printf("  synth q%d int8 row %d: argmax %d (exact logit %.5f) vs %d (%.5f), largest error %.5f\n", bits, t,
                       ag, rr[ag], ar, rr[ar], emax);
                amx += rr[ar] - rr[ag] > 2 * emax;
            }
        }
        printf("  synth llama q%d int8 %s: worst row rel L2 vs exact %.3g, argmax mismatches %d of %d\n", bits,
               step > 1 ? "prefill" : "decode", worst, amx, N);
        double bound = bits == 4 ? INT8_SYNTH_BOUND_Q4 : INT8_SYNTH_BOUND_Q8;
        CHECK(worst <= bound, "synth q%d int8 %s: rel L2 %.3g > %.1e", bits, step > 1 ? "prefill" : "decode", worst, bound);
        if (bits == 4) CHECK(amx == 0, "synth q4 int8: %d rows with a different argmax (not a tie)", amx);
    }
    free(ref);
    free(got);
out:
    for (int k = 0; k < 2; k++) {
        tern_kv_close(kv[k]);
        tern_model_free(m[k]);
        tern_backend_close(be[k]);
        tern_weights_close(ws[k]);
    }
    tern_config_free(&cfg);
}

TEST(parity_int8_synth_q4) { int8_synth(4); }
TEST(parity_int8_synth_q8) { int8_synth(8); }

int main(void) {
    const char *dev = getenv("TERN_TEST_DEVICE"), *comp = getenv("TERN_TEST_COMPUTE");
    int cpu = !(dev && !strcmp(dev, "cuda"));
    if (!(comp && !strcmp(comp, "int8"))) parity_fixtures(0);
    /* the int8 mode: on the CPU by default, on the GPU with TERN_TEST_COMPUTE=int8 (its Q4 decode GEMVs) */
    if ((cpu && !(comp && !strcmp(comp, "bf16"))) || (!cpu && comp && !strcmp(comp, "int8"))) {
        g_cuda = !cpu;
        parity_fixtures(1);
        RUN(parity_int8_synth_q4);
        RUN(parity_int8_synth_q8);
    }
    return test_done();
}
