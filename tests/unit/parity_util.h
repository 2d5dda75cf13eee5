/*
 * parity_util.h — helpers for the tests that read the parity fixtures (tests/parity/fixtures:
 * config + safetensors + ref.json + ref_logits.f32, made by scripts/make_fixtures.py):
 *   - pu_slurp: a whole file into a NUL-terminated malloc'd buffer (ref.json as text, the
 *     reference logits as raw f32), NULL when it cannot be read;
 *   - pu_json_ids: an integer array of ref.json ("prompt_ids", "all_ids") as int32 tokens;
 *   - pu_bf16_bound: the bf16 compute mode's per-fixture bound (tests/parity/README.md).
 * Header-only; included by tests/unit/test_parity.c, test_model_tp.c, test_model_glm.c and
 * test_runtime_experts.c.
 */
#ifndef TERN_PARITY_UTIL_H
#define TERN_PARITY_UTIL_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The file's bytes + a trailing NUL; *len (optional) gets the byte count (0 on failure). Caller frees. */
static inline char *pu_slurp(const char *path, size_t *len) {
    if (len) *len = 0;
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

/* root[key] (an array of integers) into a malloc'd *out (at least one element); its length. */
static inline int pu_json_ids(cJSON *root, const char *key, int32_t **out) {
    cJSON *a = cJSON_GetObjectItem(root, key);
    int n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) (*out)[i] = cJSON_GetArrayItem(a, i)->valueint;
    return n;
}

/* Leading "_"-separated words that a and b share ("gemma4_moe_mixed", "gemma4_moe_like": 2). */
static inline int pu_common_words(const char *a, const char *b) {
    int words = 0;
    for (size_t i = 0;; i++) {
        const int ea = a[i] == 0 || a[i] == '_', eb = b[i] == 0 || b[i] == '_';
        if (ea || eb) {
            if (!(ea && eb)) return words;
            words++;
            if (!a[i] || !b[i]) return words;
        } else if (a[i] != b[i]) {
            return words;
        }
    }
}

/* The bf16 mode's bound for fixture `name`: max(2e-2, 2 × transformers' own bf16 error on it), from
 * DIR/_hf_bf16.json (`make_fixtures.py --bf16-check`, which skips the MLX / FP8 copies: transformers
 * cannot load them). A case without its own figure takes that of its nearest sibling: the case that
 * shares the most leading name words (glm5_dsa_q4 → glm5_dsa, gemma4_moe_mixed → gemma4_moe_like:
 * a quantized MoE model routes as chaotically as the bf16 one), the smallest figure among ties. */
static inline double pu_bf16_bound(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/_hf_bf16.json", dir);
    char *js = pu_slurp(path, NULL);
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    free(js);
    const cJSON *hf = cJSON_GetObjectItem(root, "cases");
    double fig = 0;
    int best = 0;
    for (cJSON *c = hf ? hf->child : NULL; c; c = c->next) {
        const cJSON *v = cJSON_GetObjectItem(c, "max_rel_l2");
        if (!cJSON_IsNumber(v)) continue;
        const int w = pu_common_words(c->string, name);
        if (w > best || (w == best && w > 0 && v->valuedouble < fig)) {
            fig = v->valuedouble;
            best = w;
        }
    }
    cJSON_Delete(root);
    return 2 * fig > 2e-2 ? 2 * fig : 2e-2;
}

#endif
