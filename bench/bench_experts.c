/*
 * bench_experts.c — decode tokens/s versus expert-cache size (issue 8, docs/OFFLOAD.md), with the
 * experts on disk.
 *
 *   build/bench_experts [--preset gemma4-26b-a4b] [--layers N] [--bits 4] [--device cpu|cuda]
 *                       [--tokens N] [--threads N] [--cold] [--fracs 0,25,50,100] [--trace FILE]
 *                       [--per-expert]
 *
 * Writes a random-weight Gemma 4 model of the preset's geometry (N layers; MLX affine q`bits`,
 * group 64, mlx expert names) as config.json + model.safetensors into a temporary directory
 * (streamed, never all in memory; deleted at the end), then for each resident share
 * (0% = k slots per layer, the minimum) loads it with the expert cache, runs a 16-token prefill
 * then `--warmup` (32) untimed and N timed decode steps one row at a time, and prints decode tok/s, hits, bytes read per
 * token, slot bytes and the process RSS; finally the same with offload off (every expert
 * uploaded / mapped). --cold drops the file from the page cache before each run (reads then
 * come from the disk). Prints a table and CSV lines ("csv,"). --per-expert stores the experts as
 * HF per-expert tensors (experts.{e}.{gate,up,down}_proj.*: the weight store copies them into
 * stacks without offload, and leaves them in the file with it). The last two columns: experts
 * copied ahead by the I/O thread per token and how many of them the next layer used
 * (TERN_EXPERTS_PREFETCH=0 turns the thread off; --ab runs every share twice, thread off then
 * on, labelled "N%/no" and "N%/io": the before/after comparison in the same minute), then the MB
 * per token the thread copied (in MB/token) and the staging slots per layer (k of the slots).
 */
#include "io/config.h"
#include "io/presets.h"
#include "model/model.h"
#include "runtime/experts.h"
#include "runtime/generate.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct ent {
    char name[200];
    tern_dtype dt;
    int ndim, kind;           /* kind: 0 code words, 1 scales, 2 biases, 3 f32 vector ~1 */
    float damp;               /* scale factor of the values (scales / biases) */
    int64_t shape[3];
    size_t bytes, off;
} ent;

static ent *g_e;
static int g_n, g_cap, g_bits = 4, g_per_expert;

static void add(const char *name, tern_dtype dt, int kind, int ndim, int64_t a, int64_t b, int64_t c) {
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 256;
        g_e = realloc(g_e, sizeof *g_e * (size_t)g_cap);
        if (!g_e) { fprintf(stderr, "out of memory\n"); exit(1); }
    }
    ent *e = &g_e[g_n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "model.%s", name);
    e->dt = dt;
    e->kind = kind;
    e->damp = strstr(name, "o_proj") ? 0.02f : 1.0f; /* see write_model */
    e->ndim = ndim;
    e->shape[0] = a, e->shape[1] = b, e->shape[2] = c;
    e->bytes = tern_dtype_size(dt);
    for (int i = 0; i < ndim; i++) e->bytes *= (size_t)e->shape[i];
}

/* An MLX affine matrix (or expert stack when E > 0) [E,] out x in. */
static void qmat(const char *name, int64_t E, int64_t out, int64_t in) {
    char n[200];
    int nd = E > 0 ? 3 : 2;
    int64_t d0 = E > 0 ? E : out, d1 = E > 0 ? out : in * g_bits / 32, d2 = in * g_bits / 32;
    int64_t s1 = E > 0 ? out : in / 64, s2 = in / 64;
    snprintf(n, sizeof n, "%s.weight", name);
    add(n, TERN_DT_U32, 0, nd, d0, d1, d2);
    snprintf(n, sizeof n, "%s.scales", name);
    add(n, TERN_DT_BF16, 1, nd, d0, s1, s2);
    snprintf(n, sizeof n, "%s.biases", name);
    add(n, TERN_DT_BF16, 2, nd, d0, s1, s2);
}

static void vec(const char *name, int64_t n) {
    char b[200];
    snprintf(b, sizeof b, "%s.weight", name);
    add(b, TERN_DT_F32, 3, 1, n, 0, 0);
}

/* The tensors gemma4.c loads for this config (its load_layer, in stored mlx form). */
static void gemma4_tensors(const tern_model_config *c) {
    char n[160];
    int64_t H = c->n_embd;
    qmat("embed_tokens", 0, c->n_vocab, H);
    vec("norm", H);
    for (int l = 0; l < c->n_layer; l++) {
        const tern_layer_config *lc = &c->layers[l];
        int64_t D = lc->head_dim, q = (int64_t)c->n_head * D, kv = (int64_t)lc->n_head_kv * D;
        const char *v1[] = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm"};
        for (int i = 0; i < 4; i++) { snprintf(n, sizeof n, "layers.%d.%s", l, v1[i]); vec(n, H); }
        snprintf(n, sizeof n, "layers.%d.self_attn.q_norm", l); vec(n, D);
        snprintf(n, sizeof n, "layers.%d.layer_scalar", l); vec(n, 1);
        snprintf(n, sizeof n, "layers.%d.self_attn.q_proj", l); qmat(n, 0, q, H);
        snprintf(n, sizeof n, "layers.%d.self_attn.o_proj", l); qmat(n, 0, H, q);
        if (lc->kv_src == l) {
            snprintf(n, sizeof n, "layers.%d.self_attn.k_norm", l); vec(n, D);
            snprintf(n, sizeof n, "layers.%d.self_attn.k_proj", l); qmat(n, 0, kv, H);
            if (!lc->k_eq_v) { snprintf(n, sizeof n, "layers.%d.self_attn.v_proj", l); qmat(n, 0, kv, H); }
        }
        snprintf(n, sizeof n, "layers.%d.mlp.gate_proj", l); qmat(n, 0, lc->n_ff, H);
        snprintf(n, sizeof n, "layers.%d.mlp.up_proj", l); qmat(n, 0, lc->n_ff, H);
        snprintf(n, sizeof n, "layers.%d.mlp.down_proj", l); qmat(n, 0, H, lc->n_ff);
        if (lc->moe) {
            int64_t E = c->n_expert, I = c->n_ff_expert;
            snprintf(n, sizeof n, "layers.%d.router.scale", l); vec(n, H);
            snprintf(n, sizeof n, "layers.%d.router.per_expert_scale", l); vec(n, E);
            const char *v2[] = {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"};
            for (int i = 0; i < 3; i++) { snprintf(n, sizeof n, "layers.%d.%s", l, v2[i]); vec(n, H); }
            snprintf(n, sizeof n, "layers.%d.router.proj", l); qmat(n, 0, E, H);
            if (g_per_expert)
                for (int64_t x = 0; x < E; x++) {
                    snprintf(n, sizeof n, "layers.%d.experts.%lld.gate_proj", l, (long long)x); qmat(n, 0, I, H);
                    snprintf(n, sizeof n, "layers.%d.experts.%lld.up_proj", l, (long long)x); qmat(n, 0, I, H);
                    snprintf(n, sizeof n, "layers.%d.experts.%lld.down_proj", l, (long long)x); qmat(n, 0, H, I);
                }
            else {
                snprintf(n, sizeof n, "layers.%d.experts.switch_glu.gate_proj", l); qmat(n, E, I, H);
                snprintf(n, sizeof n, "layers.%d.experts.switch_glu.up_proj", l); qmat(n, E, I, H);
                snprintf(n, sizeof n, "layers.%d.experts.switch_glu.down_proj", l); qmat(n, E, H, I);
            }
        }
    }
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) { g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return g_rng; }

/* Values: codes uniform, scale ~2^-8, bias = -7.5 scale (zero-mean weights), vectors ~1. The
 * attention output projection is damped (x0.02): with random weights attention returns nearly
 * the mean of the values at every step, a component shared by consecutive tokens that would make
 * every token route to the same experts; damped, routing follows the token (the hit rates are
 * printed: they decide what the benchmark measures). */
static int write_model(const char *dir, const char *config_json) {
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    fputs(config_json, f);
    fclose(f);
    cJSON *h = cJSON_CreateObject();
    size_t off = 0;
    for (int i = 0; i < g_n; i++) {
        ent *e = &g_e[i];
        e->off = off;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "dtype", e->dt == TERN_DT_U32 ? "U32" : e->dt == TERN_DT_BF16 ? "BF16" : "F32");
        double sh[3] = {(double)e->shape[0], (double)e->shape[1], (double)e->shape[2]};
        cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(sh, e->ndim));
        double o2[2] = {(double)off, (double)(off + e->bytes)};
        cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(o2, 2));
        cJSON_AddItemToObject(h, e->name, t);
        off += e->bytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(js), pad = (8 - hl % 8) % 8;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (!(f = fopen(p, "wb"))) { free(js); return -1; }
    uint64_t n = hl + pad;
    fwrite(&n, 8, 1, f);
    fwrite(js, 1, hl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    free(js);
    static uint8_t buf[1 << 20];
    for (int i = 0; i < g_n; i++) {
        ent *e = &g_e[i];
        for (size_t done = 0; done < e->bytes;) {
            size_t len = e->bytes - done < sizeof buf ? e->bytes - done : sizeof buf;
            if (e->kind == 0) for (size_t j = 0; j < len; j += 8) { uint64_t r = rnd(); memcpy(buf + j, &r, len - j < 8 ? len - j : 8); }
            else if (e->kind == 3) for (size_t j = 0; j < len; j += 4) { float v = 1.0f + (float)(rnd() % 1000) * 1e-5f; memcpy(buf + j, &v, 4); }
            else for (size_t j = 0; j < len; j += 2) { /* scale ~ 2^-8, bias = -7.5 scale: centred codes */
                float s = 0.0039f * e->damp; /* bias = -7.5 scale exactly: a jittered scale would
                                                   give every weight a common positive mean */
                uint16_t v = tern_f32_to_bf16(e->kind == 1 ? s : -7.5f * s);
                memcpy(buf + j, &v, 2);
            }
            if (fwrite(buf, 1, len, f) != len) { fclose(f); return -1; }
            done += len;
        }
    }
    return fclose(f) ? -1 : 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) v = atol(line + 6);
    if (f) fclose(f);
    return v;
}

static void drop_cache(const char *dir) {
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int fd = open(p, O_RDONLY);
    if (fd >= 0) { posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); close(fd); }
}

int main(int argc, char **argv) {
    const char *preset = "gemma4-26b-a4b", *device = "cpu", *fracs = "0,25,50,100";
    int layers = 4, tokens = 32, threads = 0, cold = 0, warmup = 32, ab_mode = 0;
    const char *trace = NULL; /* --trace FILE: the routing trace of the last offloaded run */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cold")) { cold = 1; continue; }
        if (!strcmp(a, "--per-expert")) { g_per_expert = 1; continue; }
        if (!strcmp(a, "--ab")) { ab_mode = 1; continue; }
        if (!v) { fprintf(stderr, "bench_experts: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--bits")) g_bits = atoi(v);
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--tokens")) tokens = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--fracs")) fracs = v;
        else if (!strcmp(a, "--trace")) trace = v;
        else { fprintf(stderr, "bench_experts: unknown flag %s\n", a); return 2; }
        i++;
    }
    if (layers < 1 || tokens < 1 || (g_bits != 4 && g_bits != 8)) { fprintf(stderr, "bench_experts: bad --layers/--tokens/--bits\n"); return 2; }
    const char *js = tern_preset_config(preset);
    cJSON *cj = js ? cJSON_Parse(js) : NULL;
    if (!cj || !strstr(js, "gemma4")) { fprintf(stderr, "bench_experts: preset '%s' is not a Gemma 4 preset\n", preset); return 2; }
    int full_layers = cJSON_GetObjectItem(cj, "num_hidden_layers")->valueint;
    if (layers > full_layers) layers = full_layers;
    cJSON_ReplaceItemInObject(cj, "num_hidden_layers", cJSON_CreateNumber(layers));
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "group_size", 64);
    cJSON_AddNumberToObject(q, "bits", g_bits);
    cJSON_AddItemToObject(cj, "quantization", q);
    char *cfg_js = cJSON_Print(cj);
    cJSON_Delete(cj);
    tern_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tern_error e = {0};
    if (tern_config_parse(&cfg, cfg_js, strlen(cfg_js), preset, &e)) { fprintf(stderr, "config: %s\n", e.msg); return 1; }
    gemma4_tensors(&cfg);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tern_bench_experts_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    double t0 = now_s();
    int wr = write_model(dir, cfg_js);
    size_t total = 0;
    for (int i = 0; i < g_n; i++) total += g_e[i].bytes;
    fprintf(stderr, "bench_experts: wrote %s layers of %s (q%d, %.2f GB) in %.1f s\n", "the", preset, g_bits, total / 1e9, now_s() - t0);
    int E = cfg.n_expert, k = cfg.n_expert_used, rc = 0;
    printf("decode with experts on disk: %s, %d of %d layers, q%d, device %s, %d decode tokens%s\n", preset, layers,
           full_layers, g_bits, device, tokens, cold ? ", page cache dropped before each run" : "");
    printf("%-8s %7s %10s %9s %9s %12s %11s %11s %10s %9s %9s %9s %4s\n", "resident", "slots", "decode t/s", "hit rate",
           "MB/token", "slot MB", "RSS load MB", "RSS end MB", "prefill s", "ahead/tok", "used/tok", "ahead MB", "stg");
    char list[256];
    snprintf(list, sizeof list, "%s,off", fracs);
    for (char *tok = strtok(wr ? NULL : list, ","); tok; tok = strtok(NULL, ","))
      for (int ab = ab_mode ? 0 : -1; ab < 2; ab++) { /* --ab: each share with the I/O thread off, then on */
        int off = !strcmp(tok, "off"), pct = off ? 100 : atoi(tok);
        if (off && ab == 1) break;
        if (ab >= 0) setenv("TERN_EXPERTS_PREFETCH", ab ? "1" : "0", 1);
        int slots = (int)((double)E * pct / 100.0 + 0.5);
        if (slots < k) slots = k;
        if (cold) drop_cache(dir);
        tern_backend *be = NULL;
        tern_backend_opts bo = {.n_threads = threads};
        tern_status s = strcmp(device, "cuda") ? tern_backend_cpu_open(&be, &bo, &e) : tern_backend_cuda_open(&be, &bo, &e);
        tern_model *m = NULL;
        tern_model_opts mo = {.max_batch = 64, .expert_slots = off ? 0 : slots, .expert_trace = off ? NULL : trace};
        tern_kv *kv = NULL;
        tern_kv_opts ko = {.n_slots = 1, .max_ctx = 16 + warmup + tokens + 8};
        if (!s) s = tern_model_load(&m, dir, be, &mo, &e);
        if (!s) s = tern_kv_open(&kv, be, &cfg, &ko, &e);
        if (s) { fprintf(stderr, "bench_experts: %s\n", e.msg); rc = 1; tern_model_free(m); tern_backend_close(be); break; }
        int32_t ids[16], pos[16], slot[16] = {0}, ids2[256];
        uint64_t seed = 12345;
        for (int i = 0; i < 16; i++) { seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; ids[i] = (int32_t)((seed >> 33) % (uint64_t)cfg.n_vocab); pos[i] = i; }
        for (int i = 0; i < 256; i++) { seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; ids2[i] = (int32_t)((seed >> 33) % (uint64_t)cfg.n_vocab); }
        float *lg = malloc(sizeof(float) * (size_t)cfg.n_vocab * 16);
        tern_kv_reserve(kv, 0, 16 + warmup + tokens, &e);
        long rss_load = rss_kb();
        double a = now_s();
        tern_batch b = {.n = 16, .tokens = ids, .pos = pos, .slot = slot, .want = NULL};
        s = tern_model_forward(m, &b, kv, lg, &e);
        double pf = now_s() - a;
        tern_experts_stats x0, x1;
        int32_t t = tern_argmax(lg + (size_t)15 * cfg.n_vocab, cfg.n_vocab);
        for (int i = 0; i < warmup + tokens && !s; i++) {
            if (i == warmup) { /* the timed part: the cache is in its steady state */
                tern_experts_get_stats(tern_model_experts(m), &x0);
                a = now_s();
            }
            int32_t p = 16 + i;
            tern_batch b1 = {.n = 1, .tokens = &t, .pos = &p, .slot = slot};
            s = tern_model_forward(m, &b1, kv, lg, &e);
            /* random next ids (same sequence in every run): a random model's greedy text repeats one
             * token, whose routing never changes; real text routes like this (uniform-ish) */
            if (tern_argmax(lg, cfg.n_vocab) < 0) break; /* the greedy pick, as decode does */
            t = ids2[i % 256];
        }
        double dt = now_s() - a;
        tern_experts_get_stats(tern_model_experts(m), &x1);
        double calls = (double)(x1.hits + x1.misses - x0.hits - x0.misses);
        double hit = off ? 1.0 : calls > 0 ? (double)(x1.hits - x0.hits) / calls : 0;
        double mbt = off ? 0 : (double)(x1.bytes_read - x0.bytes_read) / tokens / 1e6;
        long rss = rss_kb();
        if (s) { fprintf(stderr, "bench_experts: forward: %s\n", e.msg); rc = 1; }
        char lab[16];
        snprintf(lab, sizeof lab, off ? "off" : ab < 0 ? "%d%%" : ab ? "%d%%/io" : "%d%%/no", pct);
        double pre = (double)(x1.prefetched - x0.prefetched) / tokens, used = (double)(x1.prefetch_hits - x0.prefetch_hits) / tokens;
        double pmb = (double)(x1.prefetch_bytes - x0.prefetch_bytes) / tokens / 1e6;
        printf("%-8s %7d %10.2f %9.3f %9.2f %12.1f %11.1f %11.1f %10.3f %9.1f %9.1f %9.2f %4d\n", lab, off ? E : slots,
               tokens / dt, hit, mbt, x1.slot_bytes / 1e6, rss_load / 1024.0, rss / 1024.0, pf, pre, used, pmb, x1.staging);
        printf("csv,%s,%s,%d,%s,%d,%.3f,%.4f,%.3f,%.1f,%.1f,%.1f,%.4f,%.2f,%.2f,%.3f,%d\n", preset, device, layers, lab,
               off ? E : slots, tokens / dt, hit, mbt, x1.slot_bytes / 1e6, rss_load / 1024.0, rss / 1024.0, pf, pre, used,
               pmb, x1.staging);
        fflush(stdout);
        free(lg);
        tern_kv_close(kv);
        tern_model_free(m);
        tern_backend_close(be);
    }
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir); unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir); unlink(p);
    rmdir(dir);
    tern_config_free(&cfg);
    free(cfg_js);
    free(g_e);
    return rc || wr;
}
