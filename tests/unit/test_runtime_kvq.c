/*
 * test_runtime_kvq.c — compressed KV cache kinds in the runtime: `--kv-quant` specs and
 * kv_config.json (io/kv_config.h), pool sizing and bytes per token per kind, the refusal of
 * compressed kinds on a non-CPU backend, and — on the tiny Llama, the demo model and the
 * Gemma 4 fixtures (sliding windows, KV-shared layers) — that every kind (f16, bf16, q8, q4,
 * turbo 4/3 and 3/2) keeps the runtime's guarantees, because blocks are only differently
 * formatted: a rejected speculative round leaves bitwise the state of never appending; a
 * shared prefix continues bitwise like a cold run; save/restore continues bitwise. Also
 * the next-token logits against the f32 cache are printed (f16 and q8 bounded on the tiny
 * Llama and the demo).
 */
#include "runtime_util.h"
#include "kv_models.h"
#include "io/demo.h"
#include "io/kv_config.h"
#include "ops/kvq.h"
#include "runtime/kvfile.h"

#include <math.h>

static tern_backend *BE;

TEST(spec_parse) {
    tern_kv_fmt f[2];
    tern_error e = {0};
    CHECK(!tern_kv_quant_parse("off", f, &e) && f[0].kind == TERN_KV_F32 && f[1].kind == TERN_KV_F32, "off");
    CHECK(!tern_kv_quant_parse("bf16", f, &e) && f[0].kind == TERN_KV_BF16, "bf16");
    CHECK(!tern_kv_quant_parse("8", f, &e) && f[0].kind == TERN_KV_AFFINE && f[0].bits == 8 && f[1].group == 64, "8");
    CHECK(!tern_kv_quant_parse("4:32", f, &e) && f[1].bits == 4 && f[0].group == 32, "4:32");
    CHECK(!tern_kv_quant_parse("turbo", f, &e) && f[0].kind == TERN_KV_TURBO && f[0].bits == 4 && f[1].bits == 3, "turbo");
    CHECK(!tern_kv_quant_parse("turbo:3,2", f, &e) && f[0].bits == 3 && f[1].bits == 2, "turbo:3,2");
    CHECK(!tern_kv_quant_parse("turbo:4", f, &e) && f[0].bits == 4 && f[1].bits == 4, "turbo:4");
    const char *bad[] = {"5", "4:48", "turbo:5,3", "turbo:4,", "q4", "turbo3", "8:", "", NULL};
    for (int i = 0; bad[i]; i++) {
        if (!*bad[i]) continue; /* empty = off */
        CHECK(tern_kv_quant_parse(bad[i], f, &e) == TERN_EINVAL && strstr(e.msg, bad[i]), "'%s' accepted (%s)", bad[i], e.msg);
    }
}

TEST(kv_config_json) {
    tern_model_config cfg = {0};
    tern_layer_config layers[4];
    memset(layers, 0, sizeof layers);
    cfg.n_layer = 4;
    cfg.layers = layers;
    for (int l = 0; l < 4; l++) { layers[l].head_dim = l == 3 ? 80 : 128; layers[l].n_head_kv = 2; layers[l].kv_src = l; }
    tern_kv_fmt f[8];
    tern_error e = {0};
    const char *js = "[{\"layer_idx\": 0, \"bits\": 8, \"group_size\": 64},"
                     " {\"layer_idx\": 2, \"mode\": \"turbo\", \"k_bits\": 4, \"v_bits\": 3},"
                     " {\"layer_idx\": 3, \"bits\": 4, \"group_size\": 64}]";
    CHECK(!tern_kv_config_parse(js, strlen(js), &cfg, f, &e), "%s", e.msg);
    CHECK(f[0].kind == TERN_KV_AFFINE && f[0].bits == 8 && f[1].bits == 8, "layer 0");
    CHECK(f[2].kind == TERN_KV_F32 && f[3].kind == TERN_KV_F32, "unlisted layer 1 stays f32");
    CHECK(f[4].kind == TERN_KV_TURBO && f[4].bits == 4 && f[5].bits == 3, "layer 2 turbo");
    const char *bad[][2] = {{"{\"a\": 1}", "array"}, {"[{\"layer_idx\": 9, \"bits\": 4}]", "layer_idx"},
                            {"[{\"layer_idx\": 0, \"bits\": 3}]", "bits"}, {"[{\"layer_idx\": 0, \"mode\": \"x\", \"bits\": 4}]", "mode"},
                            {"[{\"bits\": 4}]", "layer_idx"}, {"[1,", "kv_config.json"}};
    for (int i = 0; i < 6; i++)
        CHECK(tern_kv_config_parse(bad[i][0], strlen(bad[i][0]), &cfg, f, &e) && strstr(e.msg, bad[i][1]), "%s -> %s", bad[i][0], e.msg);
    /* plan: kv_config.json in a directory; group 64 halved to 16 for head_dim 80 */
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/kvq_XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    snprintf(path, sizeof path, "%s/kv_config.json", dir);
    FILE *fp = fopen(path, "w");
    if (fp) { fputs(js, fp); fclose(fp); }
    tern_kv_fmt *pl = NULL;
    const char *src = NULL;
    CHECK(!tern_kv_quant_plan("auto", dir, &cfg, &pl, &src, &e) && pl && !strcmp(src, "kv_config.json"), "auto: %s", e.msg);
    if (pl) CHECK(pl[6].kind == TERN_KV_AFFINE && pl[6].group == 16, "head_dim 80 group %d", pl[6].group);
    free(pl);
    CHECK(!tern_kv_quant_plan("off", dir, &cfg, &pl, &src, &e) && !pl, "off overrides kv_config.json");
    CHECK(!tern_kv_quant_plan("turbo", dir, &cfg, &pl, &src, &e) && pl && pl[0].kind == TERN_KV_TURBO && !strcmp(src, "--kv-quant"), "spec");
    free(pl);
    remove(path);
    CHECK(!tern_kv_quant_plan("auto", dir, &cfg, &pl, &src, &e) && !pl, "auto without kv_config.json = off");
    CHECK(tern_kv_quant_plan("config", dir, &cfg, &pl, &src, &e) == TERN_EINVAL && strstr(e.msg, "kv_config.json"), "config: %s", e.msg);
    rmdir(dir);
}

static tern_status open_kv_spec(tern_kv **kv, tern_backend *be, const tern_model_config *cfg, const char *spec, int slots,
                                int bs, size_t memory, tern_error *err) {
    tern_kv_fmt *f = NULL;
    *kv = NULL;
    tern_status st = tern_kv_quant_plan(spec, NULL, cfg, &f, NULL, err);
    tern_kv_opts ko = {.n_slots = slots, .max_ctx = 128, .block_size = bs, .memory = memory, .formats = f};
    if (!st) st = tern_kv_open(kv, be, cfg, &ko, err);
    free(f);
    return st;
}

TEST(sizing_and_backend_check) {
    rt_ref r;
    if (rt_ref_open(&r)) { CHECK(0, "model"); return; }
    const tern_model_config *cfg = tern_model_cfg(r.m);
    const char *specs[] = {"off", "f16", "8", "4", "turbo:4,3", "turbo:2,2"};
    /* D = 8: q8/q4 groups fall back to 8 (2 scale halves per record); turbo P = 8 + f32 scale */
    size_t rec[6][2] = {{32, 32}, {16, 16}, {12, 12}, {8, 8}, {8, 7}, {6, 6}};
    size_t f32_bpt = tern_kv_bytes_per_token(cfg);
    for (int i = 0; i < 6; i++) {
        tern_kv *kv = NULL;
        tern_error e = {0};
        size_t mem = 64 * 1024;
        CHECK(!open_kv_spec(&kv, BE, cfg, specs[i], 2, 16, mem, &e), "%s: %s", specs[i], e.msg);
        if (!kv) continue;
        size_t want = (size_t)RT_L * RT_NKV * (rec[i][0] + rec[i][1]);
        int used, total;
        tern_kv_usage(kv, 0, &used, &total);
        CHECK(tern_kv_token_bytes(kv) == want, "%s: %zu bytes/token, want %zu", specs[i], tern_kv_token_bytes(kv), want);
        CHECK(total == (int)(mem / (want * 16)), "%s: %d blocks in %zu bytes", specs[i], total, mem);
        CHECK(tern_kv_layer_page_bytes(kv, 0, 1) == 16 * RT_NKV * rec[i][1], "%s: V page", specs[i]);
        printf("  %-9s %4zu bytes/token (f32 %zu, %.2fx smaller), %d blocks in 64 KiB\n", specs[i], want, f32_bpt,
               (double)f32_bpt / (double)want, total);
        tern_kv_close(kv);
    }
    /* a device backend (device >= 0) opens compressed kinds too (the CUDA kernels are verified
     * on the H200 by tests/gpu/cuda_ops_tests_kvq.h) */
    tern_backend fake = *BE;
    fake.device = 0;
    tern_kv *kv = NULL;
    tern_error e = {0};
    CHECK(!open_kv_spec(&kv, &fake, cfg, "4", 1, 16, 0, &e), "q4 on device: %s", e.msg);
    tern_kv_close(kv);
    kv = NULL;
    CHECK(!open_kv_spec(&kv, &fake, cfg, "off", 1, 16, 0, &e), "f32 on device: %s", e.msg);
    tern_kv_close(kv);
    rt_ref_close(&r);
}

/* ---- the runtime's guarantees with every kind ---- */



static double rel(const float *a, const float *b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) { d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); r += (double)b[i] * b[i]; }
    return sqrt(d / (r > 0 ? r : 1));
}

enum { NP = 45, NK = 6 };

static void kind_case(mdl *M, const char *spec, const float *f32_next) {
    const tern_model_config *cfg = tern_model_cfg(M->m);
    int V = M->V;
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
    int32_t P[NP], T[NK], x = 7, *tok = NULL;
    for (int j = 0; j < NP; j++) P[j] = 3 + (j * 31 + 5) % (TERN_MIN(V, RT_V) - 3);
    for (int j = 0; j < NK; j++) T[j] = 3 + (j * 17 + 2) % (TERN_MIN(V, RT_V) - 3);
    tern_kv *kr = NULL, *ks = NULL;
    tern_error e = {0};
    int ntok = 0;
    char path[300];
    snprintf(path, sizeof path, "%s/tern_kvq_%d.kv", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    if (open_kv_spec(&kr, BE, cfg, spec, 1, 16, 0, &e) || open_kv_spec(&ks, BE, cfg, spec, 3, 16, 0, &e)) {
        CHECK(0, "%s %s: kv: %s", M->name, spec, e.msg);
        goto out;
    }
    /* reference: prefill, next token */
    CHECK(!prefill(M, kr, 0, P, NP, tmp) && fwd(M, kr, 0, &x, 1, NP, ref), "%s %s: reference", M->name, spec);
    double q = rel(ref, f32_next, V);
    /* 1. a rejected speculative round */
    CHECK(!prefill(M, ks, 0, P, NP, tmp) && fwd(M, ks, 0, T, NK, NP, tmp), "round");
    CHECK(!tern_kv_truncate(ks, 0, NP, &e), "%s %s: truncate: %s", M->name, spec, e.msg);
    tern_kv_trim(ks, 0, NP);
    CHECK(fwd(M, ks, 0, &x, 1, NP, got) && !memcmp(got, ref, sizeof(float) * V), "%s %s: rollback differs (rel %.3g)",
          M->name, spec, rel(got, ref, V));
    /* 2. save / restore */
    CHECK(!tern_kv_truncate(ks, 0, NP, &e), "truncate");
    CHECK(!tern_kv_save(ks, 0, P, NP, M->id, path, &e), "%s %s: save: %s", M->name, spec, e.msg);
    CHECK(!tern_kv_restore(ks, 1, M->id, path, &tok, &ntok, &e) && ntok == NP, "%s %s: restore: %s", M->name, spec, e.msg);
    CHECK(fwd(M, ks, 1, &x, 1, NP, got) && !memcmp(got, ref, sizeof(float) * V), "%s %s: restored continuation differs (rel %.3g)",
          M->name, spec, rel(got, ref, V));
    free(tok);
    tern_kv_release(ks, 0);
    tern_kv_release(ks, 1);
    tern_kv_release(kr, 0);
    /* 3. a shared 32-token prefix continues like a cold run */
    int32_t full[2], slid[2];
    CHECK(!prefill(M, kr, 0, P, 32, tmp) && fwd(M, kr, 0, P + 32, NP - 32, 32, tmp) && fwd(M, kr, 0, &x, 1, NP, ref), "cold");
    CHECK(!prefill(M, ks, 0, P, 32, tmp), "prefix");
    for (int b = 0; b < 2; b++) { full[b] = tern_kv_group_block(ks, 0, 0, b); slid[b] = tern_kv_group_block(ks, 1, 0, b); }
    CHECK(!tern_kv_share_prefix(ks, 2, full, slid, 2, &e), "%s %s: share: %s", M->name, spec, e.msg);
    CHECK(fwd(M, ks, 2, P + 32, NP - 32, 32, tmp) && fwd(M, ks, 2, &x, 1, NP, got) && !memcmp(got, ref, sizeof(float) * V),
          "%s %s: shared prefix differs from cold (rel %.3g)", M->name, spec, rel(got, ref, V));
    char nm[16];
    printf("  %-16s %-9s (%s): rollback, restore, shared prefix bitwise; next logits vs f32 KV rel %.2e\n", M->name, spec,
           tern_kvq_name(&tern_kv_view(kr, 0)->kf, nm, sizeof nm), q);
    /* bounds only on the well-conditioned models: the Gemma 4 fixtures (random norm weights,
     * attention scale 1) amplify any KV perturbation, f16 included (bench/NOTES.md) */
    int tame = !strcmp(M->name, "llama-tiny") || !strcmp(M->name, "demo");
    if (tame && !strcmp(spec, "f16")) CHECK(q < 1e-2, "%s f16 vs f32 %g", M->name, q);
    if (tame && !strcmp(spec, "8")) CHECK(q < 3e-2, "%s q8 vs f32 %g", M->name, q);
out:
    remove(path);
    tern_kv_close(kr);
    tern_kv_close(ks);
    free(ref); free(got); free(tmp);
}


TEST(every_kind_keeps_runtime_guarantees) {
    char tmp[] = "/tmp/tern_kvq_XXXXXX";
    const char *pre = getenv("TERN_CACHE");
    if (!pre || !*pre) { if (!mkdtemp(tmp)) { CHECK(0, "mkdtemp"); return; } setenv("TERN_CACHE", tmp, 1); }
    tern_error err = {0};
    mdl ms[5] = {0};
    const int nm = kvm_load_all(ms, BE);
    CHECK(nm >= 2, "models loaded: %d", nm);
    const char *specs[] = {"f16", "bf16", "8", "4:32", "turbo:4,3", "turbo:3,2"};
    for (int i = 0; i < nm; i++) {
        int V = ms[i].V;
        float *f32n = malloc(sizeof(float) * V), *tmpl = malloc(sizeof(float) * V);
        int32_t P[NP], x = 7;
        for (int j = 0; j < NP; j++) P[j] = 3 + (j * 31 + 5) % (TERN_MIN(V, RT_V) - 3);
        tern_kv *kv = NULL;
        if (!open_kv_spec(&kv, BE, tern_model_cfg(ms[i].m), "off", 1, 16, 0, &err) && !prefill(&ms[i], kv, 0, P, NP, tmpl) &&
            fwd(&ms[i], kv, 0, &x, 1, NP, f32n))
            for (int s = 0; s < 6; s++) kind_case(&ms[i], specs[s], f32n);
        else CHECK(0, "%s: f32 run", ms[i].name);
        tern_kv_close(kv);
        free(f32n); free(tmpl);
    }
    for (int i = 0; i < nm; i++) tern_model_free(ms[i].m);
    if (!pre || !*pre) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd)) {}
        unsetenv("TERN_CACHE");
    }
}

TEST(engine_kv_quant_option) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = rt_model_dir();
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = 2;
    o.max_ctx = 128;
    const char *ok[] = {"turbo:4,3", "8", "off", "auto"};
    for (int i = 0; i < 4; i++) {
        tern_engine *e = NULL;
        tern_error err = {0};
        o.kv_quant = ok[i];
        CHECK(!tern_engine_open(&e, &o, &err), "%s: %s", ok[i], err.msg);
        if (!e) continue;
        rt_col c = {0};
        int32_t prompt[12];
        rt_prompt(prompt, 12, 5);
        tern_request rq = rt_greedy(prompt, 12, 8, &c);
        CHECK(!tern_engine_submit(e, &rq, NULL, &err), "submit: %s", err.msg);
        rt_drain(e, 100);
        CHECK(c.done && c.n_tok == 8, "%s: %d tokens (%s)", ok[i], c.n_tok, c.err_msg);
        tern_engine_close(e);
    }
    tern_engine *e = NULL;
    tern_error err = {0};
    o.kv_quant = "5";
    CHECK(tern_engine_open(&e, &o, &err) == TERN_EINVAL && strstr(err.msg, "'5'"), "bad spec: %s", err.msg);
    o.kv_quant = "config";
    CHECK(tern_engine_open(&e, &o, &err) == TERN_EINVAL && strstr(err.msg, "kv_config.json"), "config: %s", err.msg);
}

void *kvq_unused_[] = {(void *)rt_ref_greedy, (void *)rt_engine};

int main(void) {
    tern_backend_opts bo = {.n_threads = 2};
    tern_error err = {0};
    if (!rt_model_dir() || tern_backend_cpu_open(&BE, &bo, &err)) { printf("FAIL: setup: %s\n", err.msg); return 1; }
    RUN(spec_parse);
    RUN(kv_config_json);
    RUN(sizing_and_backend_check);
    RUN(every_kind_keeps_runtime_guarantees);
    RUN(engine_kv_quant_option);
    tern_backend_close(BE);
    return test_done();
}
