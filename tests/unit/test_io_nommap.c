/*
 * test_io_nommap.c — --no-mmap (tern_st_opts.no_mmap, tern_model_opts.no_mmap): tensor bytes read
 * into anonymous memory give bitwise the same logits as the file mapping, and errors stay the same.
 *
 * For the parity fixtures llama3 and gemma4_dense (dense), gemma4_moe_like (MoE), gemma4_dense_q4g64
 * (MLX q4, single-shard index), llama3_fp8 and glm5_dsa_fp8 (FP8 blocks) and a 2-shard copy of
 * llama3 written here (index + two files), the model is loaded twice on the CPU backend and one
 * forward over ref.json's all_ids must be memcmp-equal. At the safetensors level every tensor's
 * bytes must be equal in both modes, every non-empty tensor must live in anonymous memory with
 * --no-mmap (checked through /proc/self/maps), and with the expert-offload rule
 * (tern_st_is_routed_expert) routed experts must stay in the .safetensors mapping; gemma4_moe_like
 * with offload (k slots) + --no-mmap gives the reference logits too. A truncated copy of llama3's
 * file must fail with the identical status and message in both modes.
 */
#include "io/st_write.h"
#include "io/weights.h"
#include "io_util.h"
#include "model/model.h"
#include "parity_util.h"
#include "test.h"

#define FIXDIR "tests/parity/fixtures"

static tern_backend *g_be;

/* 1 if p lies in a mapping whose path ends in ".safetensors", 0 if in another (anonymous) one, -1 unknown. */
static int in_file_mapping(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[1024];
    int r = -1;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || a < lo || a >= hi) continue;
        size_t l = strcspn(line, "\n");
        line[l] = 0;
        r = l >= 12 && !strcmp(line + l - 12, ".safetensors");
        break;
    }
    fclose(f);
    return r;
}

/* Forward all_ids of ref.json through DIR; malloc'd logits [n, V] or NULL. */
static float *forward(const char *dir, const tern_model_opts *mo, int *n_out, int *v_out) {
    char p[600];
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *txt = pu_slurp(p, NULL);
    if (!txt) snprintf(p, sizeof p, FIXDIR "/llama3/ref.json"), txt = pu_slurp(p, NULL); /* the shard copy */
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    int32_t *ids = NULL;
    int n = j ? pu_json_ids(j, "all_ids", &ids) : 0;
    cJSON_Delete(j);
    tern_error e = {0};
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    float *lg = NULL;
    int32_t *pos = calloc((size_t)n + 1, sizeof *pos), *slot = calloc((size_t)n + 1, sizeof *slot);
    if (!n || tern_model_load(&m, dir, g_be, mo, &e)) { printf("  %s: load: %s\n", dir, e.msg); goto out; }
    int V = tern_model_cfg(m)->n_vocab;
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = n + 4, .block_size = 4};
    if (tern_kv_open(&kv, g_be, tern_model_cfg(m), &ko, &e) || tern_kv_reserve(kv, 0, n, &e)) {
        printf("  %s: kv: %s\n", dir, e.msg);
        goto out;
    }
    for (int i = 0; i < n; i++) pos[i] = i;
    lg = malloc(sizeof(float) * (size_t)n * V);
    tern_batch b = {.n = n, .tokens = ids, .pos = pos, .slot = slot};
    if (tern_model_forward(m, &b, kv, lg, &e)) { printf("  %s: forward: %s\n", dir, e.msg); free(lg); lg = NULL; }
    *n_out = n;
    *v_out = V;
out:
    tern_kv_close(kv);
    tern_model_free(m);
    free(ids);
    free(pos);
    free(slot);
    return lg;
}

/* Tensor bytes equal in both modes; placement as documented. expert_rule: open with the offload rule. */
static void check_set(const char *name, const char *dir, int expert_rule) {
    tern_error e = {0};
    tern_st_set *a = NULL, *b = NULL;
    tern_st_opts o = {.no_mmap = 1, .keep_mapped = expert_rule ? tern_st_is_routed_expert : NULL};
    CHECK(!tern_st_open(&a, dir, &e), "%s: open: %s", name, e.msg);
    CHECK(!tern_st_open_opts(&b, dir, &o, &e), "%s: open --no-mmap: %s", name, e.msg);
    if (!a || !b) goto out;
    CHECK(tern_st_count(a) == tern_st_count(b), "%s: tensor counts differ", name);
    CHECK(tern_st_copied_bytes(a) == 0 && tern_st_copied_bytes(b) > 0, "%s: copied %zu / %zu bytes", name,
          tern_st_copied_bytes(a), tern_st_copied_bytes(b));
    int bad = 0, misplaced = 0, kept = 0, unknown = 0;
    for (int i = 0; i < tern_st_count(a); i++) {
        const tern_st_entry *x = tern_st_at(a, i), *y = tern_st_find(b, x->name);
        if (!y || x->nbytes != y->nbytes || x->dtype != y->dtype || memcmp(x->data, y->data, x->nbytes)) { bad++; continue; }
        if (!y->nbytes) continue;
        int want_file = expert_rule && tern_st_is_routed_expert(y->name, NULL);
        kept += want_file;
        int f = in_file_mapping(y->data);
        unknown += f < 0;
        if (f >= 0 && f != want_file) misplaced++;
        if (!expert_rule && in_file_mapping(x->data) == 0) misplaced++; /* mmap mode: in the file */
    }
    CHECK(!bad, "%s: %d tensors differ between the modes", name, bad);
    CHECK(!misplaced, "%s: %d tensors in the wrong kind of memory", name, misplaced);
    CHECK(!unknown, "%s: %d tensors in no mapping of /proc/self/maps", name, unknown);
    CHECK(!expert_rule || kept > 0, "%s: no routed expert tensor found", name);
out:
    tern_st_close(a);
    tern_st_close(b);
}

static void check_logits(const char *name, const char *dir, int expert_slots) {
    tern_model_opts m0 = {0}, m1 = {.no_mmap = 1, .expert_slots = expert_slots};
    int n0 = 0, v0 = 0, n1 = 0, v1 = 0;
    float *a = forward(dir, &m0, &n0, &v0), *b = forward(dir, &m1, &n1, &v1);
    CHECK(a && b && n0 == n1 && v0 == v1, "%s: a run failed", name);
    if (a && b && n0 == n1 && v0 == v1)
        CHECK(!memcmp(a, b, sizeof(float) * (size_t)n0 * v0), "%s: logits differ with --no-mmap", name);
    free(a);
    free(b);
}

TEST(nommap_fixtures) {
    const char *fx[] = {"llama3", "gemma4_dense", "gemma4_moe_like", "gemma4_dense_q4g64", "llama3_fp8", "glm5_dsa_fp8"};
    for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, FIXDIR "/%s", fx[i]);
        check_set(fx[i], dir, 0);
        check_logits(fx[i], dir, 0);
    }
}

TEST(nommap_expert_offload_keeps_file) {
    check_set("gemma4_moe_like (offload rule)", FIXDIR "/gemma4_moe_like", 1);
    check_set("glm5_dsa (offload rule)", FIXDIR "/glm5_dsa", 1);
    check_logits("gemma4_moe_like offload k slots", FIXDIR "/gemma4_moe_like", 2);
}

/* llama3 split into two shards (alternating tensors) + index; config copied. */
TEST(nommap_sharded) {
    tern_error e = {0};
    tern_st_set *s = NULL;
    CHECK(!tern_st_open(&s, FIXDIR "/llama3", &e), "open: %s", e.msg);
    if (!s) return;
    io_mkdir("shard");
    int n = tern_st_count(s), k[2] = {0, 0};
    tern_st_wentry *w[2] = {calloc((size_t)n, sizeof(tern_st_wentry)), calloc((size_t)n, sizeof(tern_st_wentry))};
    char *idx = malloc(64 + (size_t)n * 300), *q = idx;
    q += sprintf(q, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < n; i++) {
        const tern_st_entry *t = tern_st_at(s, i);
        tern_st_wentry *d = &w[i & 1][k[i & 1]++];
        d->name = t->name;
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        memcpy(d->shape, t->shape, sizeof d->shape);
        d->data = t->data;
        q += sprintf(q, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", t->name, (i & 1) + 1);
    }
    sprintf(q, "}}");
    CHECK(!tern_st_write(io_path("shard/model-00001-of-00002.safetensors"), w[0], k[0], &e), "write: %s", e.msg);
    CHECK(!tern_st_write(io_path("shard/model-00002-of-00002.safetensors"), w[1], k[1], &e), "write: %s", e.msg);
    io_write_file(io_path("shard/model.safetensors.index.json"), idx, strlen(idx));
    size_t cl = 0;
    char *cfg = pu_slurp(FIXDIR "/llama3/config.json", &cl);
    if (cfg) io_write_file(io_path("shard/config.json"), cfg, cl);
    free(cfg);
    free(idx);
    free(w[0]);
    free(w[1]);
    tern_st_close(s);
    check_set("llama3 2 shards", io_path("shard"), 0);
    check_logits("llama3 2 shards", io_path("shard"), 0);
    tern_st_set *t = NULL;
    tern_st_opts o = {.no_mmap = 1};
    if (!tern_st_open_opts(&t, io_path("shard"), &o, &e)) CHECK(tern_st_file_count(t) == 2, "shards: %d files", tern_st_file_count(t));
    tern_st_close(t);
}

/* A truncated file: the same status and message in both modes (set and model load). */
TEST(nommap_truncated) {
    size_t len = 0;
    char *buf = pu_slurp(FIXDIR "/llama3/model.safetensors", &len);
    char *cfg = NULL;
    size_t cl = 0;
    CHECK(buf && len > 1000, "read llama3");
    if (!buf) return;
    io_mkdir("trunc");
    io_write_file(io_path("trunc/model.safetensors"), buf, len - 100);
    if ((cfg = pu_slurp(FIXDIR "/llama3/config.json", &cl))) io_write_file(io_path("trunc/config.json"), cfg, cl);
    tern_error e0 = {0}, e1 = {0};
    tern_st_set *s = NULL;
    tern_st_opts o = {.no_mmap = 1};
    tern_status a = tern_st_open(&s, io_path("trunc"), &e0);
    tern_status b = tern_st_open_opts(&s, io_path("trunc"), &o, &e1);
    CHECK(a != TERN_OK && a == b && !strcmp(e0.msg, e1.msg), "set: %d '%s' vs %d '%s'", a, e0.msg, b, e1.msg);
    CHECK(strstr(e1.msg, "model.safetensors") && strstr(e1.msg, "beyond the data section"), "message: %s", e1.msg);
    printf("  truncated: %s\n", e1.msg);
    tern_model *m = NULL;
    tern_model_opts m0 = {0}, m1 = {.no_mmap = 1};
    memset(&e0, 0, sizeof e0);
    memset(&e1, 0, sizeof e1);
    a = tern_model_load(&m, io_path("trunc"), g_be, &m0, &e0);
    tern_model_free(m);
    b = tern_model_load(&m, io_path("trunc"), g_be, &m1, &e1);
    tern_model_free(m);
    CHECK(a != TERN_OK && a == b && !strcmp(e0.msg, e1.msg), "model: %d '%s' vs %d '%s'", a, e0.msg, b, e1.msg);
    free(buf);
    free(cfg);
}

int main(void) {
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2};
    if (tern_backend_cpu_open(&g_be, &o, &e)) { printf("FAIL: nommap: cpu backend: %s\n", e.msg); return 1; }
    RUN(nommap_fixtures);
    RUN(nommap_expert_offload_keeps_file);
    RUN(nommap_sharded);
    RUN(nommap_truncated);
    tern_backend_close(g_be);
    io_cleanup();
    return test_done();
}
