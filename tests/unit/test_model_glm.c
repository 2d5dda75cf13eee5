/*
 * test_model_glm.c — GLM-5 model checks beyond the generic parity suite (test_parity.c runs
 * every glm5_* fixture on the fast CPU backend):
 *   - the scalar reference backend ("cpu-ref") reproduces the glm5_dsa reference (1e-4);
 *   - DSA is really active in that fixture: with index_topk raised past the sequence the rows
 *     that fit in index_topk keys are unchanged and later rows move far from the reference;
 *   - a backend without the GLM ops (as CUDA is today) refuses the model with
 *     TERN_EUNSUPPORTED and a message that says what is missing.
 * Fixtures live in tests/parity/fixtures (made by scripts/make_fixtures.py).
 */
#include "backend/cpu/cpu.h"
#include "model/model.h"
#include "parity_util.h"
#include "test.h"

#include <cjson/cJSON.h>

#define FIX "tests/parity/fixtures/glm5_dsa"

typedef struct fixture {
    int32_t ids[64];
    int n, V;
    float *ref;
} fixture;

static int load_fixture(fixture *fx) {
    char *js = pu_slurp(FIX "/ref.json", NULL);
    if (!js) return 0;
    cJSON *r = cJSON_Parse(js);
    cJSON *a = cJSON_GetObjectItem(r, "all_ids"), *sh = cJSON_GetObjectItem(r, "logits_shape");
    fx->n = cJSON_GetArraySize(a);
    fx->V = cJSON_GetArrayItem(sh, 1)->valueint;
    for (int i = 0; i < fx->n && i < 64; i++) fx->ids[i] = cJSON_GetArrayItem(a, i)->valueint;
    cJSON_Delete(r);
    free(js);
    size_t nb = 0;
    fx->ref = (float *)pu_slurp(FIX "/ref_logits.f32", &nb);
    return fx->ref && nb == (size_t)fx->n * fx->V * 4 && fx->n <= 64;
}

/* one forward over the fixture's ids -> per-row rel L2 against the reference */
static tern_status run(tern_model *m, tern_backend *be, const fixture *fx, double *rel, tern_error *e) {
    tern_kv *kv = NULL;
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = fx->n, .block_size = 8};
    tern_status s = tern_kv_open(&kv, be, tern_model_cfg(m), &ko, e);
    if (s) return s;
    int32_t pos[64], slot[64] = {0};
    for (int i = 0; i < fx->n; i++) pos[i] = i;
    float *got = malloc(sizeof(float) * (size_t)fx->n * fx->V);
    if (!(s = tern_kv_reserve(kv, 0, fx->n, e))) {
        tern_batch b = {.n = fx->n, .tokens = fx->ids, .pos = pos, .slot = slot};
        s = tern_model_forward(m, &b, kv, got, e);
    }
    for (int t = 0; !s && t < fx->n; t++)
        rel[t] = test_rel_l2(got + (size_t)t * fx->V, fx->ref + (size_t)t * fx->V, (size_t)fx->V);
    free(got);
    tern_kv_close(kv);
    return s;
}

static fixture g_fx;

TEST(glm_ref_backend) {
    tern_backend *be = NULL;
    tern_error e = {0};
    CHECK(tern_backend_cpu_ref_open(&be, NULL, &e) == TERN_OK, "%s", e.msg);
    tern_model *m = NULL;
    tern_model_opts mo = {.max_batch = 16}; /* two sub-batches: the second sees the first's cache */
    CHECK(tern_model_load(&m, FIX, be, &mo, &e) == TERN_OK, "%s", e.msg);
    double rel[64] = {0}, worst = 0;
    if (m) CHECK(run(m, be, &g_fx, rel, &e) == TERN_OK, "%s", e.msg);
    for (int t = 0; t < g_fx.n; t++) worst = fmax(worst, rel[t]);
    printf("  cpu-ref glm5_dsa worst row rel L2 %.3g\n", worst);
    CHECK(worst <= 1e-4, "cpu-ref rel %.3g", worst);
    tern_model_free(m);
    tern_backend_close(be);
}

TEST(glm_dsa_is_active) {
    tern_backend *be = NULL;
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2};
    CHECK(tern_backend_cpu_open(&be, &o, &e) == TERN_OK, "%s", e.msg);
    tern_model_config cfg;
    tern_weights *ws = NULL;
    tern_model *m = NULL;
    CHECK(tern_config_load(&cfg, FIX, &e) == TERN_OK, "%s", e.msg);
    int K = cfg.index_topk;
    cfg.index_topk = 1000; /* every row dense */
    CHECK(tern_weights_open(&ws, FIX, &cfg, &e) == TERN_OK, "%s", e.msg);
    if (ws) CHECK(tern_model_load_from(&m, &cfg, ws, be, NULL, &e) == TERN_OK, "%s", e.msg);
    double rel[64] = {0}, early = 0, late = 0;
    if (m) CHECK(run(m, be, &g_fx, rel, &e) == TERN_OK, "%s", e.msg);
    for (int t = 0; t < g_fx.n; t++) {
        if (t + 1 <= K) early = fmax(early, rel[t]);
        else late = fmax(late, rel[t]);
    }
    printf("  dense instead of DSA: rows <= index_topk %.3g, later rows %.3g\n", early, late);
    CHECK(early <= 1e-4 && late > 1e-2, "early %.3g late %.3g", early, late);
    tern_model_free(m);
    tern_weights_close(ws);
    tern_config_free(&cfg);
    tern_backend_close(be);
}

TEST(glm_backend_without_ops) {
    tern_backend *be = NULL;
    tern_error e = {0};
    CHECK(tern_backend_cpu_ref_open(&be, NULL, &e) == TERN_OK, "%s", e.msg);
    if (!be) return;
    tern_backend_vt vt = *be->vt; /* a backend like CUDA today: no GLM kernels */
    vt.glm = NULL;
    tern_backend fake = *be;
    fake.vt = &vt;
    tern_model *m = NULL;
    tern_status s = tern_model_load(&m, FIX, &fake, NULL, &e);
    CHECK(s == TERN_EUNSUPPORTED && m == NULL && strstr(e.msg, "MLA/DSA") && strstr(e.msg, "cpu-ref"), "%d %s", s,
          e.msg);
    tern_backend_close(be);
}

int main(void) {
    if (!load_fixture(&g_fx)) {
        SKIP("glm_model", FIX " is missing (scripts/make_fixtures.py)");
        return 0;
    }
    RUN(glm_ref_backend);
    RUN(glm_dsa_is_active);
    RUN(glm_backend_without_ops);
    free(g_fx.ref);
    return test_done();
}
