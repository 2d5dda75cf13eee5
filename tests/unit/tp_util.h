/*
 * tp_util.h — for the tensor-parallel tests (test_model_tp*.c):
 *   - tp_gpus_ok(n, what): with TERN_TEST_DEVICE=cuda, opens and closes a group of n CUDA ranks;
 *     when that fails (fewer GPUs, no CUDA build) prints "SKIP: what: reason" and returns 0;
 *   - tp_fixture: a parity fixture's prompt_ids / all_ids (tests/parity/fixtures/NAME/ref.json);
 *   - the three probes both offload and vocabulary tests compare bit for bit on one slot (slot 0;
 *     greedy generation in slot 1): tp_full (a forward of all_ids, every row's logits),
 *     tp_step (a logit-free prefill of the prompt, then one decode step's logits) and tp_greedy
 *     (the greedy continuation of the prompt, up to 256 ids).
 * Header-only; uses parity_util.h.
 */
#ifndef TERN_TP_UTIL_H
#define TERN_TP_UTIL_H

#include "model/tp.h"
#include "parity_util.h"
#include "runtime/generate.h"

#include <stdio.h>
#include <string.h>

static inline int tp_gpus_ok(int n, const char *what) {
    tern_tp *tp = NULL;
    tern_error e = {0};
    tern_tp_opts to = {.n = n, .cuda = 1};
    if (tern_tp_open(&tp, &to, &e)) {
        printf("SKIP: %s: %s\n", what, e.msg);
        return 0;
    }
    tern_tp_close(tp);
    return 1;
}

typedef struct tp_fixture { int32_t *prompt, *all; int np, na; } tp_fixture;

/* 1 when the fixture has a prompt and at least two generated ids */
static inline int tp_fix_load(const char *fixdir, const char *name, tp_fixture *f) {
    char path[600];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/%s/ref.json", fixdir, name);
    char *js = pu_slurp(path, NULL);
    if (!js) return 0;
    cJSON *ref = cJSON_Parse(js);
    f->np = pu_json_ids(ref, "prompt_ids", &f->prompt);
    f->na = pu_json_ids(ref, "all_ids", &f->all);
    cJSON_Delete(ref);
    free(js);
    return f->np > 0 && f->na > f->np + 1;
}

static inline void tp_fix_free(tp_fixture *f) { free(f->prompt); free(f->all); }

/* logits [na, V] of a forward of all_ids in slot 0 (pos, slot: scratch of na entries) */
static inline tern_status tp_full(tern_model *m, tern_kv *kv, const tp_fixture *f, int32_t *pos, int32_t *slot,
                                  float *out, tern_error *e) {
    for (int i = 0; i < f->na; i++) { pos[i] = i; slot[i] = 0; }
    tern_status s = tern_kv_reserve(kv, 0, f->na, e);
    if (!s) {
        tern_batch b = {.n = f->na, .tokens = f->all, .pos = pos, .slot = slot};
        s = tern_model_forward(m, &b, kv, out, e);
    }
    tern_kv_release(kv, 0);
    return s;
}

/* logits [V] of the decode step after a prefill of the prompt that asked for no logits */
static inline tern_status tp_step(tern_model *m, tern_kv *kv, const tp_fixture *f, int32_t *pos, int32_t *slot,
                                  float *out, tern_error *e) {
    const int np = f->np;
    for (int i = 0; i <= np; i++) { pos[i] = i; slot[i] = 0; }
    tern_status s = tern_kv_reserve(kv, 0, np + 1, e);
    if (!s) {
        tern_batch b = {.n = np, .tokens = f->all, .pos = pos, .slot = slot};
        s = tern_model_forward(m, &b, kv, NULL, e);
        tern_batch b1 = {.n = 1, .tokens = f->all + np, .pos = pos + np, .slot = slot};
        if (!s) s = tern_model_forward(m, &b1, kv, out, e);
    }
    tern_kv_release(kv, 0);
    return s;
}

typedef struct tp_ids { int32_t *out; int n; } tp_ids;
static inline int tp_on_tok(void *ctx, int tok) {
    tp_ids *g = (tp_ids *)ctx;
    if (g->n < 256) g->out[g->n++] = tok;
    return 0;
}

/* the greedy continuation of the prompt in slot 1: gen[256], *n_gen ids */
static inline tern_status tp_greedy(tern_model *m, tern_kv *kv, const tp_fixture *f, int32_t *gen, int *n_gen,
                                    tern_error *e) {
    tp_ids g = {gen, 0};
    tern_status s = tern_generate(m, kv, 1, f->all, f->np, f->na - f->np, 3, NULL, 0, NULL, NULL, tp_on_tok, &g, NULL, e);
    *n_gen = g.n;
    return s;
}

#endif
