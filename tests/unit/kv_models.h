/*
 * kv_models.h — what the KV-cache runtime tests (test_runtime_kvops.c, test_runtime_kvq.c) share: the models they
 * walk (the tiny Llama of runtime_util.h, the demo model, the Gemma 4 parity fixtures that are present), one forward
 * of up to 128 rows with logits of its last row, and a prefill in chunks of 16 rows with trims, like the scheduler.
 * Header-only; include after runtime_util.h.
 */
#ifndef TERN_KV_MODELS_H
#define TERN_KV_MODELS_H

#include "runtime_util.h"
#include "io/demo.h"
#include "runtime/kvfile.h"

/* a loaded model: its name, vocabulary and KV-cache id (config ^ weights) */
typedef struct mdl { const char *name; tern_model *m; int V; uint64_t id; } mdl;

static int kvm_load(mdl *M, tern_backend *be, const char *name, const char *dir) {
    tern_error err = {0};
    M->name = name;
    if (tern_model_load(&M->m, dir, be, NULL, &err)) { printf("  %s: %s\n", name, err.msg); return -1; }
    M->V = tern_model_cfg(M->m)->n_vocab;
    M->id = tern_kv_config_id(tern_model_cfg(M->m)) ^ tern_kv_weights_id(dir);
    return 0;
}

/* the tiny Llama, the demo and the Gemma 4 fixtures present into ms[0..5); returns how many loaded */
static int kvm_load_all(mdl *ms, tern_backend *be) {
    tern_error err = {0};
    char dir[4096];
    int nm = 0;
    if (!kvm_load(&ms[nm], be, "llama-tiny", rt_model_dir())) nm++;
    if (!tern_model_path_resolve("demo", dir, sizeof dir, &err) && !kvm_load(&ms[nm], be, "demo", dir)) nm++;
    static const char *const fx[] = {"gemma4_dense", "gemma4_e2b_like", "gemma4_moe_like"};
    for (int i = 0; i < 3; i++) {
        char p[256];
        snprintf(p, sizeof p, "tests/parity/fixtures/%s", fx[i]);
        if (access(p, F_OK)) { printf("  (fixture %s absent)\n", fx[i]); continue; }
        if (!kvm_load(&ms[nm], be, fx[i], p)) nm++;
    }
    return nm;
}

/* rows pos0 .. pos0 + n - 1 (n <= 128) of slot: logits of the last one, NULL on error */
static float *fwd(mdl *M, tern_kv *kv, int slot, const int32_t *t, int n, int pos0, float *logits) {
    int32_t pos[128], sl[128];
    uint8_t want[128] = {0};
    tern_error err = {0};
    for (int i = 0; i < n; i++) { pos[i] = pos0 + i; sl[i] = slot; }
    want[n - 1] = 1;
    if (tern_kv_reserve(kv, slot, pos0 + n, &err)) { printf("  reserve: %s\n", err.msg); return NULL; }
    tern_batch b = {.n = n, .tokens = t, .pos = pos, .slot = sl, .want = want};
    if (tern_model_forward(M->m, &b, kv, logits, &err)) { printf("  forward: %s\n", err.msg); return NULL; }
    return logits;
}

/* prefill in chunks of 16 rows with trims, like the scheduler */
static int prefill(mdl *M, tern_kv *kv, int slot, const int32_t *t, int n, float *logits) {
    for (int p = 0; p < n; p += 16) {
        int k = TERN_MIN(16, n - p);
        if (!fwd(M, kv, slot, t + p, k, p, logits)) return -1;
        tern_kv_trim(kv, slot, p + k);
    }
    return 0;
}

#endif
