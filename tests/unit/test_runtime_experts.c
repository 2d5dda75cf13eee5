/*
 * test_runtime_experts.c — expert offload (src/runtime/experts.h) is bit-identical to every
 * expert resident, keeps its slot memory under the cap, and writes a parseable trace.
 *
 * For each MoE parity fixture the model is loaded without offload (the reference run) and with
 * an expert cache of k slots per layer (the minimum), E/2, E, and a byte cap of 25% of the
 * experts; each run does (1) one forward over all_ids (a prefill step: more unique experts
 * than slots -> the in-place path on the CPU, row chunks on CUDA), (2) the same ids one row per
 * step (decode: the slot path, LRU evictions), (3) greedy generation. Logits must be bitwise
 * equal (memcmp) and tokens identical. A random-weight glm5-tiny model (synthetic host-RAM
 * stacks, q4) checks the same for the non-file source. TERN_TEST_DEVICE=cuda runs it on the
 * GPU (the lead's H200 run; scripts/gpu_check.sh style).
 * The I/O thread (opt-in, TERN_EXPERTS_PREFETCH=1; on in the main runs here, and its prefetches must
 * be used in the "mid" run of max(E/2, 2k) slots, CPU), and the mid runs repeated with it off (=0)
 * and with deliberately wrong predictions (=skew): bitwise identical either way. Below 2k slots
 * there are no staging slots and no thread. Staging slots never cost a cached expert: decode with
 * skew at S slots has the hits and misses of decode without prefetch at S - k slots (the regular
 * ones), and reads no more demand bytes. Per-expert HF stacks (glm5_dsa, glm5_dsa_fp8, and a
 * per-expert copy of gemma4_moe_like written to a temporary directory) are not copied at load
 * with offload (tern_weights_stacked_bytes == 0) and give the same logits.
 */
#include "io/presets.h"
#include "model/model.h"
#include "parity_util.h"
#include "runtime/experts.h"
#include "runtime/generate.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIXDIR "tests/parity/fixtures"

static tern_backend *g_be;

typedef struct run_out {
    float *pf, *dec;          /* [na, V] one forward / one row per step */
    int32_t *gen;             /* greedy tokens */
    int n_gen;
    tern_experts_stats xs;
} run_out;

static int on_tok(void *ctx, int tok) {
    run_out *o = ctx;
    o->gen[o->n_gen++] = tok;
    return 0;
}

static void run_free(run_out *o) {
    free(o->pf);
    free(o->dec);
    free(o->gen);
    memset(o, 0, sizeof *o);
}

/* Runs (1)-(3) on model m; 0 on success. */
static int run_model(tern_model *m, const int32_t *ids, int na, int np, run_out *o) {
    const tern_model_config *c = tern_model_cfg(m);
    int V = c->n_vocab;
    tern_error e = {0};
    tern_kv *kv = NULL;
    tern_kv_opts ko = {.n_slots = 2, .max_ctx = na + 8, .block_size = 4};
    if (tern_kv_open(&kv, g_be, c, &ko, &e)) { printf("  kv: %s\n", e.msg); return -1; }
    o->pf = malloc(sizeof(float) * (size_t)na * V);
    o->dec = malloc(sizeof(float) * (size_t)na * V);
    o->gen = malloc(sizeof(int32_t) * (size_t)na);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)na), *slot = calloc((size_t)na, sizeof(int32_t));
    int rc = -1;
    for (int i = 0; i < na; i++) pos[i] = i;
    tern_kv_reserve(kv, 0, na, &e);
    tern_batch b = {.n = na, .tokens = ids, .pos = pos, .slot = slot};
    if (tern_model_forward(m, &b, kv, o->pf, &e)) { printf("  forward: %s\n", e.msg); goto out; }
    tern_kv_release(kv, 0);
    tern_kv_reserve(kv, 0, na, &e);
    for (int i = 0; i < na; i++) {
        tern_batch b1 = {.n = 1, .tokens = ids + i, .pos = pos + i, .slot = slot};
        if (tern_model_forward(m, &b1, kv, o->dec + (size_t)i * V, &e)) { printf("  step %d: %s\n", i, e.msg); goto out; }
    }
    tern_kv_release(kv, 0);
    if (tern_generate(m, kv, 1, ids, np, na - np, 5, NULL, 0, NULL, NULL, (tern_token_fn)on_tok, o, NULL, &e)) {
        printf("  generate: %s\n", e.msg);
        goto out;
    }
    rc = 0;
out:
    if (tern_model_experts(m)) tern_experts_get_stats(tern_model_experts(m), &o->xs);
    free(pos);
    free(slot);
    tern_kv_close(kv);
    return rc;
}

/* Every line a JSON object with the documented keys; hits + misses == unique on slot lines.
 * Returns the number of lines (-1 on a bad one). */
static int check_trace(const char *path, int E) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const char *keys[] = {"layer", "rows", "unique", "hits", "misses", "bytes", "direct", "chunks", "ahead"};
        for (size_t i = 0; j && i < sizeof keys / sizeof *keys; i++)
            if (!cJSON_IsNumber(cJSON_GetObjectItem(j, keys[i]))) j = (cJSON_Delete(j), NULL);
        cJSON *ids = j ? cJSON_GetObjectItem(j, "ids") : NULL;
        int u = j ? cJSON_GetObjectItem(j, "unique")->valueint : -1;
        if (!j || !cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != u) bad++;
        else {
            for (int i = 0; i < u; i++) {
                int e = cJSON_GetArrayItem(ids, i)->valueint;
                if (e < 0 || e >= E) bad++;
            }
            int h = cJSON_GetObjectItem(j, "hits")->valueint, m = cJSON_GetObjectItem(j, "misses")->valueint;
            if (!cJSON_GetObjectItem(j, "direct")->valueint && cJSON_GetObjectItem(j, "chunks")->valueint == 1 &&
                h + m != u)
                bad++;
        }
        cJSON_Delete(j);
        n++;
    }
    fclose(f);
    return bad ? -1 : n;
}

/* Compare one offload configuration against the reference run. */
static void check_config(const char *name, const char *what, tern_model *m, const int32_t *ids, int na, int np,
                         const run_out *ref, int V) {
    run_out o = {0};
    int rc = run_model(m, ids, na, np, &o);
    CHECK(rc == 0, "%s %s: run failed", name, what);
    if (!rc) {
        size_t bytes = sizeof(float) * (size_t)na * V;
        CHECK(!memcmp(o.pf, ref->pf, bytes), "%s %s: one-forward logits differ from all-resident", name, what);
        CHECK(!memcmp(o.dec, ref->dec, bytes), "%s %s: decode logits differ from all-resident", name, what);
        CHECK(o.n_gen == ref->n_gen && !memcmp(o.gen, ref->gen, sizeof(int32_t) * (size_t)o.n_gen),
              "%s %s: greedy tokens differ", name, what);
        printf("  %s %s: %d slots/layer, %.1f KB of slots, %lld calls, %lld hits, %lld misses, %lld in place, %llu B read, "
               "%lld read ahead (%lld used)\n", name, what, o.xs.slots, o.xs.slot_bytes / 1024.0, (long long)o.xs.calls,
               (long long)o.xs.hits, (long long)o.xs.misses, (long long)o.xs.direct, (unsigned long long)o.xs.bytes_read,
               (long long)o.xs.predicted, (long long)o.xs.pred_used);
        printf("    I/O thread %s: %d staging slots, %lld copied ahead, %lld used, %lld staged hits\n",
               o.xs.prefetch_on ? "on" : "off", o.xs.staging, (long long)o.xs.prefetched, (long long)o.xs.prefetch_hits,
               (long long)o.xs.staged);
        const char *pf = getenv("TERN_EXPERTS_PREFETCH");
        if (g_be->device < 0 && !strcmp(what, "mid") && pf && !strcmp(pf, "1") && o.xs.slots >= 2 * o.xs.staging &&
            o.xs.slots < o.xs.n_expert)
            CHECK(o.xs.prefetch_on && o.xs.prefetched > 0 && o.xs.prefetch_hits > 0, "%s %s: no prefetch used", name, what);
        CHECK(o.xs.calls > 0 && o.xs.misses > 0, "%s %s: the expert store was not used", name, what);
    }
    run_free(&o);
}

/* Decode stats (one row per step over ids) of the model in dir with `slots` slots per layer and
 * TERN_EXPERTS_PREFETCH=pf; 0 on success. */
static int decode_stats(const char *dir, const int32_t *ids, int na, int slots, const char *pf, tern_experts_stats *xs) {
    setenv("TERN_EXPERTS_PREFETCH", pf, 1);
    tern_error e = {0};
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_model_opts mo = {.expert_slots = slots};
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = na + 8, .block_size = 4};
    int rc = tern_model_load(&m, dir, g_be, &mo, &e) || tern_kv_open(&kv, g_be, tern_model_cfg(m), &ko, &e) ||
             tern_kv_reserve(kv, 0, na, &e);
    float *lg = rc ? NULL : malloc(sizeof(float) * (size_t)tern_model_cfg(m)->n_vocab);
    for (int i = 0; !rc && i < na; i++) {
        int32_t pos = i, slot = 0;
        tern_batch b1 = {.n = 1, .tokens = ids + i, .pos = &pos, .slot = &slot};
        rc = !lg || tern_model_forward(m, &b1, kv, lg, &e);
    }
    if (rc) printf("  decode (%d slots, prefetch=%s): %s\n", slots, pf, e.msg);
    else tern_experts_get_stats(tern_model_experts(m), xs);
    free(lg);
    tern_kv_close(kv);
    tern_model_free(m);
    unsetenv("TERN_EXPERTS_PREFETCH");
    return rc;
}

/* Wrong predictions (skew) fill only staging slots: the S - k regular slots see exactly the
 * hits and misses of an LRU cache of S - k slots without prefetch, and no more demand bytes
 * (fewer only when a routed expert is found in a staging slot: staged > 0). */
static void check_skew(const char *name, const char *dir, const int32_t *ids, int na, int S, int k) {
    tern_experts_stats a, b, c;
    if (decode_stats(dir, ids, na, S, "skew", &a) || decode_stats(dir, ids, na, S - k, "0", &b) ||
        decode_stats(dir, ids, na, S, "0", &c)) {
        CHECK(0, "%s skew: decode failed", name);
        return;
    }
    uint64_t demand = a.bytes_read - a.prefetch_bytes;
    printf("  %s decode skew@%d (%d staging): %lld hits, %lld misses (%lld staged), %llu B demand + %llu B ahead; "
           "no prefetch @%d: %lld hits, %lld misses, %llu B; @%d: %lld hits, %lld misses, %llu B\n", name, S, a.staging,
           (long long)a.hits, (long long)a.misses, (long long)a.staged, (unsigned long long)demand,
           (unsigned long long)a.prefetch_bytes, S - k, (long long)b.hits, (long long)b.misses,
           (unsigned long long)b.bytes_read, S, (long long)c.hits, (long long)c.misses, (unsigned long long)c.bytes_read);
    CHECK(a.prefetch_on && a.staging == k && a.prefetched > 0, "%s skew: nothing prefetched", name);
    CHECK(!b.prefetch_on && b.staging == 0 && b.prefetch_bytes == 0, "%s skew: prefetch in the =0 run", name);
    CHECK(a.hits == b.hits && a.misses == b.misses, "%s skew: hits/misses %lld/%lld != %lld/%lld without prefetch",
          name, (long long)a.hits, (long long)a.misses, (long long)b.hits, (long long)b.misses);
    CHECK(a.staged ? demand < b.bytes_read : demand == b.bytes_read, "%s skew: demand bytes %llu vs %llu", name,
          (unsigned long long)demand, (unsigned long long)b.bytes_read);
}

static void check_fixture_dir(const char *name, const char *dir);
static void check_fixture(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    check_fixture_dir(name, dir);
}

static void check_fixture_dir(const char *name, const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    char *js = pu_slurp(path, NULL);
    if (!js) { printf("SKIP: experts_%s: no fixture\n", name); return; }
    cJSON *ref = cJSON_Parse(js);
    int32_t *ids = NULL;
    int na = pu_json_ids(ref, "all_ids", &ids), np = cJSON_GetArraySize(cJSON_GetObjectItem(ref, "prompt_ids"));
    t_cur_fail_ = 0;
    tern_error e = {0};
    tern_model *m = NULL;
    run_out r = {0};
    tern_status s = tern_model_load(&m, dir, g_be, NULL, &e);
    if (s == TERN_EUNSUPPORTED && g_be->device >= 0) {
        printf("SKIP: experts_%s: %s\n", name, e.msg);
        goto out;
    }
    CHECK(s == TERN_OK, "%s: load: %s", name, e.msg);
    if (s || run_model(m, ids, na, np, &r)) { CHECK(0, "%s: reference run failed", name); goto out; }
    const tern_model_config *c = tern_model_cfg(m);
    int V = c->n_vocab, E = c->n_expert, k = c->n_expert_used;
    tern_model_free(m);
    m = NULL;
    int mid = E / 2 > 2 * k ? E / 2 : 2 * k;
    if (mid >= E) mid = E / 2 > k ? E / 2 : k;
    int slots[3] = {k, mid, E};
    const char *what[3] = {"min", "mid", "all"};
    setenv("TERN_EXPERTS_PREFETCH", "1", 1); /* the I/O thread is opt-in: test it on here */
    for (int i = 0; i < 3; i++) {
        tern_model_opts mo = {.expert_slots = slots[i]};
        if ((s = tern_model_load(&m, dir, g_be, &mo, &e))) { CHECK(0, "%s: load (%d slots): %s", name, slots[i], e.msg); break; }
        check_config(name, what[i], m, ids, na, np, &r, V);
        tern_model_free(m);
        m = NULL;
    }
    /* the I/O thread off, and prefetching wrong experts: same bits (mid: with fewer than 2k slots
     * there are no staging slots, so nothing is prefetched) */
    const char *pf_modes[2] = {"0", "skew"};
    for (int i = 0; i < 2 && g_be->device < 0; i++) {
        setenv("TERN_EXPERTS_PREFETCH", pf_modes[i], 1);
        tern_model_opts mo = {.expert_slots = slots[1]};
        char what_pf[32];
        snprintf(what_pf, sizeof what_pf, "mid prefetch=%s", pf_modes[i]);
        if ((s = tern_model_load(&m, dir, g_be, &mo, &e))) CHECK(0, "%s: load (%s): %s", name, what_pf, e.msg);
        else check_config(name, what_pf, m, ids, na, np, &r, V);
        tern_model_free(m);
        m = NULL;
        unsetenv("TERN_EXPERTS_PREFETCH");
    }
    if (g_be->device < 0 && mid >= 2 * k) check_skew(name, dir, ids, na, mid, k);
    /* the device path (row chunks whose experts fit k slots) on the CPU: close, not bitwise (the
     * CPU moe groups rows per expert, so chunking changes its batch shapes) */
    if (g_be->device < 0) {
        setenv("TERN_EXPERTS_CHUNKS", "1", 1);
        tern_model_opts mk = {.expert_slots = k};
        if ((s = tern_model_load(&m, dir, g_be, &mk, &e))) CHECK(0, "%s: load (chunks): %s", name, e.msg);
        else {
            run_out o = {0};
            CHECK(run_model(m, ids, na, np, &o) == 0, "%s chunks: run failed", name);
            double worst = 0;
            for (int t = 0; o.pf && t < na; t++) {
                double d = test_rel_l2(o.pf + (size_t)t * V, r.pf + (size_t)t * V, (size_t)V);
                if (d > worst) worst = d;
            }
            printf("  %s chunks: %lld chunks, prefill logits max rel L2 %.3g vs all-resident\n", name,
                   (long long)o.xs.chunks, worst);
            CHECK(o.xs.chunks > 0 && o.xs.direct == 0, "%s chunks: path not taken", name);
            CHECK(worst <= 1e-5, "%s chunks: rel L2 %.3g", name, worst);
            CHECK(o.dec && !memcmp(o.dec, r.dec, sizeof(float) * (size_t)na * V), "%s chunks: decode logits differ", name);
            CHECK(o.n_gen == r.n_gen && !memcmp(o.gen, r.gen, sizeof(int32_t) * (size_t)o.n_gen), "%s chunks: tokens", name);
            run_free(&o);
        }
        tern_model_free(m);
        m = NULL;
        unsetenv("TERN_EXPERTS_CHUNKS");
    }
    /* a byte cap of 25% of the experts (clamped up to k slots), with a trace */
    tern_model_opts mo = {.expert_slots = E};
    tern_experts_stats xs;
    if (!tern_model_load(&m, dir, g_be, &mo, &e)) {
        tern_experts_get_stats(tern_model_experts(m), &xs);
        tern_model_free(m);
        m = NULL;
        char tp[256];
        snprintf(tp, sizeof tp, "%s/tern_experts_%d.jsonl", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
        size_t cap = xs.slot_bytes / 4;
        tern_model_opts mc = {.expert_cache_bytes = cap, .expert_trace = tp};
        if ((s = tern_model_load(&m, dir, g_be, &mc, &e))) CHECK(0, "%s: load (cap): %s", name, e.msg);
        else {
            tern_experts_get_stats(tern_model_experts(m), &xs);
            int min_slots = xs.slots == k; /* a cap below k slots is raised to k (warned) */
            CHECK(min_slots || xs.slot_bytes <= cap, "%s: slot bytes %zu over the cap %zu", name, xs.slot_bytes, cap);
            check_config(name, "cap25%", m, ids, na, np, &r, V);
            tern_experts_get_stats(tern_model_experts(m), &xs);
            int lines = check_trace(tp, E);
            CHECK(lines > 0 && lines == (int)xs.calls, "%s: trace %d lines, %lld calls", name, lines, (long long)xs.calls);
        }
        unlink(tp);
    }
out:
    tern_model_free(m);
    run_free(&r);
    if (t_cur_fail_) { printf("FAIL: experts_%s\n", name); t_fail_++; }
    else if (!r.pf && s == TERN_EUNSUPPORTED) {}
    else { printf("PASS: experts_%s\n", name); t_pass_++; }
    fflush(stdout);
    free(ids);
    cJSON_Delete(ref);
    free(js);
}

/* Synthetic weights (host RAM, not a file mapping): glm5-tiny q4 with 2 layers. */
TEST(experts_synthetic_glm5_tiny) {
    const char *js = tern_preset_config("glm5-tiny");
    if (!js) { CHECK(0, "no glm5-tiny preset"); return; }
    tern_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tern_error e = {0};
    tern_weights *ws = NULL;
    tern_synth_spec sp = {.bits = 4, .group_size = 64, .seed = 7};
    tern_status s = tern_config_parse(&cfg, js, strlen(js), "glm5-tiny", &e);
    if (!s) s = tern_weights_open_synth(&ws, &cfg, &sp, &e);
    CHECK(s == TERN_OK, "synth: %s", e.msg);
    if (s) { tern_config_free(&cfg); return; }
    int32_t ids[12] = {1, 5, 9, 200, 31, 7, 4000, 12, 3, 3, 88, 1000};
    tern_model *m = NULL;
    run_out r = {0};
    tern_model_opts mo = {.max_batch = 16};
    if ((s = tern_model_load_from(&m, &cfg, ws, g_be, &mo, &e)) || run_model(m, ids, 12, 4, &r))
        CHECK(0, "reference: %s", e.msg);
    else {
        int E = cfg.n_expert, k = cfg.n_expert_used;
        tern_model_free(m);
        m = NULL;
        tern_weights_close(ws); /* the same seed and request order give the same weights again */
        ws = NULL;
        tern_model_opts mx = {.max_batch = 16, .expert_slots = k};
        if ((s = tern_weights_open_synth(&ws, &cfg, &sp, &e)) || (s = tern_model_load_from(&m, &cfg, ws, g_be, &mx, &e)))
            CHECK(0, "offload load: %s", e.msg);
        else check_config("glm5-tiny", "min", m, ids, 12, 4, &r, cfg.n_vocab);
        (void)E;
    }
    tern_model_free(m);
    run_free(&r);
    tern_weights_close(ws);
    tern_config_free(&cfg);
}

/* Write src/{config.json,ref.json,model.safetensors} into dst with the HF fused expert stacks
 * (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) split into per-expert
 * matrices "experts.{e}.{gate,up,down}_proj.weight". 0 on success. */
static int copy_file(const char *from, const char *to) {
    size_t n = 0;
    char *d = pu_slurp(from, &n);
    if (!d) return -1;
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(d, 1, n, f) == n ? 0 : -1;
    if (f) fclose(f);
    free(d);
    return rc;
}

static int write_per_expert(const char *src, const char *dst) {
    char a[700], b[700];
    const char *files[] = {"config.json", "ref.json"};
    if (mkdir(dst, 0700)) return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        if (copy_file(a, b)) return -1;
    }
    snprintf(a, sizeof a, "%s/model.safetensors", src);
    size_t len = 0;
    uint8_t *st = (uint8_t *)pu_slurp(a, &len);
    if (!st || len < 8) { free(st); return -1; }
    uint64_t hl = 0;
    memcpy(&hl, st, 8);
    cJSON *h = cJSON_ParseWithLength((const char *)st + 8, (size_t)hl), *out = cJSON_CreateObject();
    const uint8_t *base = st + 8 + hl;
    uint8_t *data = malloc(len), *p = data;
    int rc = h && data ? 0 : -1;
    for (cJSON *t = h ? h->child : NULL; t && !rc; t = t->next) {
        if (!strcmp(t->string, "__metadata__")) continue;
        cJSON *sh = cJSON_GetObjectItem(t, "shape"), *of = cJSON_GetObjectItem(t, "data_offsets");
        const char *dt = cJSON_GetObjectItem(t, "dtype")->valuestring;
        size_t o0 = (size_t)cJSON_GetArrayItem(of, 0)->valuedouble, o1 = (size_t)cJSON_GetArrayItem(of, 1)->valuedouble;
        const char *nm = t->string, *gu = strstr(nm, "experts.gate_up_proj"), *dn = strstr(nm, "experts.down_proj");
        int parts = gu ? 2 : dn ? 1 : 0;
        if (!parts || cJSON_GetArraySize(sh) != 3) { /* copied as is */
            memcpy(p, base + o0, o1 - o0);
            cJSON *nt = cJSON_Duplicate(t, 1);
            cJSON_ReplaceItemInArray(cJSON_GetObjectItem(nt, "data_offsets"), 0, cJSON_CreateNumber((double)(p - data)));
            cJSON_ReplaceItemInArray(cJSON_GetObjectItem(nt, "data_offsets"), 1,
                                     cJSON_CreateNumber((double)(p - data + (o1 - o0))));
            cJSON_AddItemToObject(out, nm, nt);
            p += o1 - o0;
            continue;
        }
        int E = cJSON_GetArrayItem(sh, 0)->valueint, R = cJSON_GetArrayItem(sh, 1)->valueint / parts,
            C = cJSON_GetArrayItem(sh, 2)->valueint;
        size_t mb = (o1 - o0) / (size_t)E / (size_t)parts; /* one matrix's bytes */
        int pre = (int)((gu ? gu : dn) - nm) + 8;        /* "...experts." */
        for (int e = 0; e < E; e++)
            for (int q = 0; q < parts; q++) {
                char n2[300];
                snprintf(n2, sizeof n2, "%.*s%d.%s_proj.weight", pre, nm, e, dn ? "down" : q ? "up" : "gate");
                memcpy(p, base + o0 + ((size_t)e * parts + q) * mb, mb);
                cJSON *nt = cJSON_CreateObject();
                int shp[2] = {R, C};
                double offs[2] = {(double)(p - data), (double)(p - data + mb)};
                cJSON_AddStringToObject(nt, "dtype", dt);
                cJSON_AddItemToObject(nt, "shape", cJSON_CreateIntArray(shp, 2));
                cJSON_AddItemToObject(nt, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
                cJSON_AddItemToObject(out, n2, nt);
                p += mb;
            }
    }
    char *hj = rc ? NULL : cJSON_PrintUnformatted(out);
    snprintf(b, sizeof b, "%s/model.safetensors", dst);
    FILE *f = hj ? fopen(b, "wb") : NULL;
    if (f) {
        uint64_t nl = strlen(hj);
        rc = fwrite(&nl, 8, 1, f) == 1 && fwrite(hj, 1, nl, f) == nl && fwrite(data, 1, (size_t)(p - data), f) ==
             (size_t)(p - data) ? 0 : -1;
        fclose(f);
    } else rc = -1;
    free(hj);
    cJSON_Delete(h);
    cJSON_Delete(out);
    free(data);
    free(st);
    return rc;
}

static void rm_dir(const char *dst) {
    const char *files[] = {"config.json", "ref.json", "model.safetensors"};
    char b[700];
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        unlink(b);
    }
    rmdir(dst);
}

/* Per-expert stacks with offload are not copied at load (tern_weights_stacked_bytes), without
 * offload they are (also on a store that served views first), and all three give the same logits. */
static void check_no_copy(const char *name, const char *dir) {
    tern_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tern_error e = {0};
    tern_weights *w1 = NULL, *w2 = NULL;
    tern_model *m = NULL;
    int32_t ids[6] = {1, 2, 3, 4, 5, 6};
    float *lg[3] = {0};
    size_t copied[3] = {0};
    t_cur_fail_ = 0;
    tern_status s = tern_config_load(&cfg, dir, &e);
    if (!s) s = tern_weights_open(&w1, dir, &cfg, &e);
    if (!s) s = tern_weights_open(&w2, dir, &cfg, &e);
    CHECK(!s, "%s: open: %s", name, e.msg);
    int V = cfg.n_vocab;
    for (int i = 0; i < 3 && !s; i++) {
        tern_weights *ws = i == 0 ? w1 : w2; /* resident; offload; resident again on the views store */
        tern_model_opts mo = {.max_batch = 8, .expert_slots = i == 1 ? cfg.n_expert_used : 0};
        tern_kv *kv = NULL;
        tern_kv_opts ko = {.n_slots = 1, .max_ctx = 16, .block_size = 4};
        int32_t pos[6] = {0, 1, 2, 3, 4, 5}, slot[6] = {0};
        tern_batch b = {.n = 6, .tokens = ids, .pos = pos, .slot = slot};
        lg[i] = malloc(sizeof(float) * 6 * (size_t)V);
        if ((s = tern_model_load_from(&m, &cfg, ws, g_be, &mo, &e)) || (s = tern_kv_open(&kv, g_be, &cfg, &ko, &e)) ||
            (s = tern_kv_reserve(kv, 0, 6, &e)) || (s = tern_model_forward(m, &b, kv, lg[i], &e)))
            CHECK(0, "%s: run %d: %s", name, i, e.msg);
        copied[i] = tern_weights_stacked_bytes(ws);
        tern_kv_close(kv);
        tern_model_free(m);
        m = NULL;
    }
    if (!s) {
        printf("  %s: bytes copied into expert stacks at load: resident %zu, offload %zu, resident after %zu\n", name,
               copied[0], copied[1], copied[2]);
        CHECK(copied[0] > 0 && copied[1] == 0 && copied[2] == copied[0], "%s: stacked bytes %zu / %zu / %zu", name,
              copied[0], copied[1], copied[2]);
        CHECK(!memcmp(lg[0], lg[1], sizeof(float) * 6 * (size_t)V) && !memcmp(lg[0], lg[2], sizeof(float) * 6 * (size_t)V),
              "%s: logits differ", name);
    }
    for (int i = 0; i < 3; i++) free(lg[i]);
    tern_weights_close(w1);
    tern_weights_close(w2);
    tern_config_free(&cfg);
    if (t_cur_fail_) { printf("FAIL: experts_no_copy_%s\n", name); t_fail_++; }
    else { printf("PASS: experts_no_copy_%s\n", name); t_pass_++; }
}

/* gemma4_moe_like with per-expert tensors (a temporary copy): the whole check, then no copy. */
static void check_gemma_per_expert(void) {
    char dst[512];
    snprintf(dst, sizeof dst, "%s/tern_pe_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    if (access(FIXDIR "/gemma4_moe_like/model.safetensors", R_OK)) { printf("SKIP: experts_gemma_per_expert: no fixture\n"); return; }
    if (write_per_expert(FIXDIR "/gemma4_moe_like", dst)) {
        rm_dir(dst);
        CHECK(0, "cannot write the per-expert copy in %s", dst);
        printf("FAIL: experts_gemma_per_expert\n");
        t_fail_++;
        return;
    }
    check_fixture_dir("gemma4_moe_like_per_expert", dst);
    check_no_copy("gemma4_moe_like_per_expert", dst);
    rm_dir(dst);
}

int main(void) {
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2};
    const char *dev = getenv("TERN_TEST_DEVICE");
    tern_status bs = dev && !strcmp(dev, "cuda") ? tern_backend_cuda_open(&g_be, &o, &e) : tern_backend_cpu_open(&g_be, &o, &e);
    if (bs) { printf("FAIL: experts: %s backend: %s\n", dev ? dev : "cpu", e.msg); return 1; }
    printf("  expert offload on backend %s\n", g_be->vt->name);
    const char *fx[] = {"gemma4_moe_like", "gemma4_moe_mixed", "glm5_dsa", "glm5_dsa_q4", "glm5_dsa_fp8"};
    for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) check_fixture(fx[i]);
    if (g_be->device < 0) { /* load-time checks: the backend does not matter */
        check_no_copy("glm5_dsa", FIXDIR "/glm5_dsa");
        check_no_copy("glm5_dsa_fp8", FIXDIR "/glm5_dsa_fp8");
    }
    check_gemma_per_expert();
    RUN(experts_synthetic_glm5_tiny);
    tern_backend_close(g_be);
    return test_done();
}
