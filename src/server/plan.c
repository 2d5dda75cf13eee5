/*
 * plan.c — the start-up report of `tern serve` (what was loaded, the memory plan, how long it
 * took) and the UTF-8 check of request bodies.
 *
 * The report is computed once, on the engine thread, right after the engine opened: the
 * model facts come from tern_model_info, the KV pool's block count from the engine's stats,
 * and the byte figures from the same accounting the engine uses to size its pool
 * (runtime/fit.h over io/config.h + io/kv_config.h): weights = the safetensors files as
 * mapped, KV bytes per token for the page formats in effect (full-attention layers; sliding
 * layers separately), the pool = --kv-memory, else what --memory-budget leaves, else
 * max_concurrency sequences of the context. It is printed by `tern serve` before
 * `listening on ...` and kept in s->summary.
 *
 * srv_json_bad_utf8 walks a parsed body: cJSON copies bytes of strings through unchecked,
 * so a string (or key) with invalid UTF-8 would otherwise reach the tokenizer and the
 * output; it is a 400 naming the path instead (messages[0].content).
 */
#include "server/srv.h"
#include "base/file.h"
#include "io/config.h"
#include "io/kv_config.h"
#include "runtime/fit.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Sum of *.safetensors sizes in dir (the weights as mapped); *n_files counts them. */
static size_t weight_bytes(const char *dir, int *n_files) {
    *n_files = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t total = 0;
    struct dirent *de;
    char p[4400];
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) || !S_ISREG(st.st_mode)) continue;
        total += (size_t)st.st_size;
        (*n_files)++;
    }
    closedir(d);
    return total;
}

static const char *human(size_t b, char *buf, size_t n) {
    double x = (double)b;
    if (x >= 1073741824.0) snprintf(buf, n, "%.2f GiB", x / 1073741824.0);
    else if (x >= 1048576.0) snprintf(buf, n, "%.2f MiB", x / 1048576.0);
    else if (x >= 1024.0) snprintf(buf, n, "%.1f KiB", x / 1024.0);
    else snprintf(buf, n, "%zu B", b);
    return buf;
}

/* The memory lines for the real engine; "" when the figures cannot be derived. */
static void memory_lines(tern_server *s, const tern_engine_stats *st, char *out, size_t n) {
    out[0] = 0;
    const char *dir = s->vt->dir ? s->vt->dir(s->eng) : NULL;
    if (!dir || !*dir) return;
    tern_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tern_error err = {0};
    if (tern_config_load(&cfg, dir, &err)) {
        snprintf(out, n, "memory: (plan unavailable: %s)\n", err.msg);
        return;
    }
    const tern_engine_opts *o = &s->o.engine;
    const char *spec = s->info.kv_quant ? s->info.kv_quant : o->kv_quant; /* what the engine opened */
    tern_kv_fmt *fmt = NULL;
    const char *source = "off";
    if (tern_kv_quant_plan(spec, dir, &cfg, &fmt, &source, &err)) fmt = NULL, source = "off";
    int nf = 0;
    size_t w = weight_bytes(dir, &nf);
    tern_fit_opts fo = {.ctx = s->info.n_ctx, .max_concurrency = o->max_concurrency ? o->max_concurrency : 8,
                        .max_batch_tokens = s->info.max_batch_tokens ? s->info.max_batch_tokens : o->max_batch_tokens,
                        .budget_gb = o->memory_budget_gb};
    tern_fit f;
    memset(&f, 0, sizeof f);
    if (tern_fit_plan(&cfg, fmt, w, &fo, &f, &err)) {
        snprintf(out, n, "memory: weights %zu bytes; (KV plan unavailable: %s)\n", w, err.msg);
    } else {
        size_t pool = o->kv_memory_gb > 0 ? (size_t)(o->kv_memory_gb * 1073741824.0)
                      : o->memory_budget_gb > 0 ? TERN_MIN(f.kv_total, f.kv_avail) : f.kv_total;
        char a[32], b[32], c[32], d[32], e2[32];
        snprintf(out, n,
                 "memory: weights %s (%zu bytes in %d safetensors file%s, mapped)\n"
                 "memory: KV pool %s (%zu bytes), %d blocks of %d tokens, %s per token (%zu bytes; full layers %zu, "
                 "sliding %zu), kv-quant %s\n"
                 "memory: forward scratch ~%s; one sequence of %d tokens needs %s of KV%s\n",
                 human(w, a, sizeof a), w, nf, nf == 1 ? "" : "s", human(pool, b, sizeof b), pool, st->kv_blocks_total,
                 f.block_size ? f.block_size : 16, human(f.kv_token_full + f.kv_token_sliding, c, sizeof c),
                 f.kv_token_full + f.kv_token_sliding, f.kv_token_full, f.kv_token_sliding, source,
                 human(f.scratch, d, sizeof d), f.ctx, human(f.kv_seq, e2, sizeof e2),
                 o->memory_budget_gb > 0 ? " (pool sized by --memory-budget)" : "");
    }
    free(fmt);
    tern_config_free(&cfg);
}

void srv_plan_summary(tern_server *s, double t_open, double t_opened) {
    tern_engine_stats st;
    memset(&st, 0, sizeof st);
    s->vt->get_stats(s->eng, &st);
    const tern_model_info *in = &s->info;
    const tern_sampling *sp = &s->o.sampling;
    char mem[1200], seed[32];
    memory_lines(s, &st, mem, sizeof mem);
    if (s->o.has_seed) snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed);
    else snprintf(seed, sizeof seed, "per request");
    int conc = s->o.engine.max_concurrency ? s->o.engine.max_concurrency : 8;
    size_t k = (size_t)snprintf(s->summary, sizeof s->summary,
        "model: %s (%s, %d layers, n_embd %d, vocab %d), context %d, tokenizer %s, chat template %s\n"
        "%s"
        "serve: %smax concurrency %d, max batch tokens %d, max queue %d, KV blocks %d; defaults temperature %g top_p %g top_k %d "
        "min_p %g seed %s\n",
        s->served, in->arch ? in->arch : "?", in->n_layer, in->n_embd, in->n_vocab, in->n_ctx,
        in->has_tokenizer ? "yes" : "no", s->tmpl ? "yes" : "no", mem,
        s->o.fake_engine ? "fake engine, " : "", conc,
        in->max_batch_tokens ? in->max_batch_tokens : s->o.engine.max_batch_tokens, s->o.max_queue, st.kv_blocks_total, (double)sp->temperature, (double)sp->top_p, sp->top_k,
        (double)sp->min_p, seed);
    if (k < sizeof s->summary)
        snprintf(s->summary + k, sizeof s->summary - k,
                 "ready: engine opened (weights mapped, KV allocated) in %.1f ms; serving %.1f ms later\n",
                 t_open * 1e3, (tern_time_s() - t_opened) * 1e3);
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 prefix rules (RFC 3629): no overlongs, no surrogates, <= U+10FFFF. */
static int utf8_ok(const unsigned char *p) {
    while (*p) {
        unsigned c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c == 0xE0) { n = 2; lo = 0xA0; }
        else if (c == 0xED) { n = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) n = 2;
        else if (c == 0xF0) { n = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) n = 3;
        else if (c == 0xF4) { n = 3; hi = 0x8F; }
        else return 0;
        if (p[1] < lo || p[1] > hi) return 0;
        for (int i = 2; i <= n; i++)
            if (p[i] < 0x80 || p[i] > 0xBF) return 0;
        p += n + 1;
    }
    return 1;
}

static int walk(const cJSON *v, char *path, size_t n, size_t len) {
    if (len >= n) len = n - 1;
    if (cJSON_IsString(v) && v->valuestring && !utf8_ok((const unsigned char *)v->valuestring)) return 1;
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return 0;
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        size_t k;
        if (cJSON_IsArray(v)) k = (size_t)snprintf(path + len, n - len, "[%d]", i);
        else {
            if (c->string && !utf8_ok((const unsigned char *)c->string)) {
                snprintf(path + len, n - len, "%s", len ? " (a key)" : "a key of the body");
                return 1;
            }
            k = (size_t)snprintf(path + len, n - len, "%s%.40s", len ? "." : "", c->string ? c->string : "");
        }
        if (walk(c, path, n, len + k)) return 1;
        path[len < n ? len : n - 1] = 0;
    }
    return 0;
}

int srv_json_bad_utf8(const cJSON *v, char *path, size_t n) {
    if (!path || n < 2) return 0;
    path[0] = 0;
    if (!walk(v, path, n, 0)) return 0;
    if (!path[0]) snprintf(path, n, "(body)");
    return 1;
}
