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
 */
#include "model/model.h"
#include "runtime/generate.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>

#define FIXDIR "tests/parity/fixtures"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static int json_ids(cJSON *root, const char *key, int32_t **out) {
    cJSON *a = cJSON_GetObjectItem(root, key);
    int n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) (*out)[i] = cJSON_GetArrayItem(a, i)->valueint;
    return n;
}

static int g_cases, g_bf16, g_skipped;

static void check_case(const char *name, tern_backend *be) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    snprintf(path, sizeof path, "%s/ref.json", dir);
    char *js = slurp(path, NULL);
    if (!js) return;
    g_cases++;
    cJSON *ref = cJSON_Parse(js);
    int32_t *prompt, *all;
    int np = json_ids(ref, "prompt_ids", &prompt), na = json_ids(ref, "all_ids", &all);
    int quant = strstr(name, "_q") != NULL || strstr(name, "mixed") != NULL || strstr(name, "_fp8") != NULL;
    double bound = g_bf16 ? 2e-2 : quant ? 1e-3 : 1e-4;
    size_t nbytes;
    snprintf(path, sizeof path, "%s/ref_logits.f32", dir);
    float *want = (float *)slurp(path, &nbytes);

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
    s = tern_kv_open(&kv, be, cfg, &ko, &e);
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
    double worst = 0;
    int worst_row = -1, argmax_bad = 0;
    for (int t = 0; t < na && !s; t++) {
        double r = test_rel_l2(got + (size_t)t * V, want + (size_t)t * V, (size_t)V);
        if (r > worst) { worst = r; worst_row = t; }
        if (tern_argmax(got + (size_t)t * V, V) != tern_argmax(want + (size_t)t * V, V)) argmax_bad++;
    }
    printf("  %s: worst row rel L2 %.3g (row %d), argmax mismatches %d\n", name, worst, worst_row, argmax_bad);
    CHECK(worst <= bound, "%s: rel L2 %.3g at row %d > %.0e", name, worst, worst_row, bound);
    if (!g_bf16) CHECK(argmax_bad == 0, "%s: %d rows with a different argmax", name, argmax_bad);
    tern_kv_release(kv, 0);

    /* 2. greedy continuation through prefill + decode (small prefill chunks exercise paging) */
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)na);
    memcpy(gen, prompt, sizeof(int32_t) * (size_t)np);
    struct { int32_t *buf; int n; } acc = {gen, np};
    int on_tok(void *ctx, int tok);
    s = tern_generate(m, kv, 1, prompt, np, na - np, 5, NULL, 0, NULL, NULL,
                      (tern_token_fn)on_tok, &acc, NULL, &e);
    CHECK(s == TERN_OK, "%s: generate: %s", name, e.msg);
    if (!g_bf16)
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
    double bw = 0;
    for (int i = 0; i < nb && !s; i++) {
        double d = test_rel_l2(got2 + (size_t)i * V, got + (size_t)src[i] * V, (size_t)V);
        if (d > bw) bw = d;
    }
    printf("  %s: batch vs alone max rel L2 %.3g\n", name, bw);
    CHECK(bw <= (g_bf16 ? 1e-2 : 1e-5), "%s: batched logits differ from alone by %.3g", name, bw);
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

static void parity_fixtures(void) {
    tern_backend *be = NULL;
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2};
    /* TERN_TEST_DEVICE=cuda runs the same fixtures on the GPU (scripts/gpu_check.sh);
     * TERN_TEST_COMPUTE=bf16 selects the bf16 compute mode (bound 2e-2 then). */
    const char *dev = getenv("TERN_TEST_DEVICE"), *comp = getenv("TERN_TEST_COMPUTE");
    if (comp && !strcmp(comp, "bf16")) { o.compute = TERN_COMPUTE_BF16; g_bf16 = 1; }
    tern_status bs = dev && !strcmp(dev, "cuda") ? tern_backend_cuda_open(&be, &o, &e) : tern_backend_cpu_open(&be, &o, &e);
    if (bs) { printf("FAIL: parity: %s backend: %s\n", dev ? dev : "cpu", e.msg); t_fail_++; return; }
    printf("  parity on backend %s (%s compute)\n", be->vt->name, g_bf16 ? "bf16" : "f32");
    DIR *d = opendir(FIXDIR);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char refp[600];
        struct stat sb;
        snprintf(refp, sizeof refp, FIXDIR "/%s/ref.json", de->d_name);
        if (de->d_name[0] == '.' || stat(refp, &sb) != 0) continue;
        t_cur_fail_ = 0;
        g_skipped = 0;
        check_case(de->d_name, be);
        if (g_skipped) continue;
        if (t_cur_fail_) { printf("FAIL: parity_%s\n", de->d_name); t_fail_++; }
        else { printf("PASS: parity_%s\n", de->d_name); t_pass_++; }
        fflush(stdout);
    }
    if (d) closedir(d);
    if (!g_cases) { printf("FAIL: parity: no fixtures found under %s\n", FIXDIR); t_fail_++; }
    tern_backend_close(be);
}

int main(void) {
    parity_fixtures();
    return test_done();
}
