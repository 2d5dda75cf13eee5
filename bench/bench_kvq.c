/*
 * bench_kvq.c — quality of the compressed KV cache kinds (ops/kvq.h) against the f32 cache:
 * attention-output relative error, next-token KL divergence and top-1 agreement, with KV
 * bytes per token. Not a timed benchmark.
 *
 * Models: the parity fixtures (default: every tests/parity/fixtures/<case> the loader
 * takes), --model DIR, or --random PRESET (synthetic weights, io/presets.c). A sequence of
 * --ctx random token ids is fed in chunks of --chunk rows (teacher forcing) once with the
 * f32 cache and once per kind, in lockstep. For every row at position >= --eval-from:
 *   KL(p_f32 || p_kind) of the next-token distributions, and whether the argmax agrees.
 * Attention error is measured per layer on the kind's own trajectory: the model runs on a
 * thin wrapper backend whose kv_write also writes an f32 "shadow" cache and whose attention
 * also attends over that shadow with the same queries; the error is
 * sqrt(Σ‖o_kind − o_f32‖² / Σ‖o_f32‖²) over all layers, rows and heads (and the worst layer).
 *
 * --synthetic instead measures one attention layer on generated data with the statistics
 * that make KV quantization hard in real models (keys: per-channel offsets and a few
 * outlier channels; values: plain Gaussian; queries scaled for a peaked softmax), and the
 * fast CPU attention's time per call for 8 query rows (decode-like) at that context.
 *
 *   make bench && build/bench_kvq [--random llama3-1b --ctx 320] [--kinds f16,8,4,turbo:4,3]
 */
#include "backend/cpu/cpu.h"
#include "io/kv_config.h"
#include "io/presets.h"
#include "model/model.h"
#include "ops/kvq.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXK 16

/* ---- the tap backend ---- */

static struct {
    tern_backend be;
    tern_backend_vt vt;
    tern_backend *inner;
    tern_kv *q, *shadow;    /* active (kind cache, its f32 shadow); NULL: pass through */
    int n_layer;
    float *buf;
    size_t cap;
    double num[256], den[256];
} T;

static int view_layer(const tern_kv_layer *v) {
    for (int l = 0; l < T.n_layer; l++)
        if (tern_kv_view(T.q, l) == v) return l;
    return -1;
}

static void tap_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v) {
    (void)be;
    T.inner->vt->kv_write(T.inner, kv, rows, k, v);
    int l = T.q ? view_layer(kv) : -1;
    if (l >= 0) T.inner->vt->kv_write(T.inner, tern_kv_view(T.shadow, l), rows, k, v);
}

static void tap_attention(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap) {
    (void)be;
    T.inner->vt->attention(T.inner, out, q, rows, nh, kv, scale, softcap);
    int l = T.q ? view_layer(kv) : -1;
    if (l < 0) return;
    size_t n = (size_t)rows->n * nh * kv->head_dim;
    if (n > T.cap) {
        free(T.buf);
        T.buf = malloc(n * sizeof(float));
        T.cap = T.buf ? n : 0;
        if (!T.buf) return;
    }
    T.inner->vt->attention(T.inner, T.buf, q, rows, nh, tern_kv_view(T.shadow, l), scale, softcap);
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - T.buf[i];
        T.num[l] += d * d;
        T.den[l] += (double)T.buf[i] * T.buf[i];
    }
}

/* ---- one model ---- */

typedef struct kind_res {
    const char *spec;
    tern_kv *kv, *shadow;
    double kl, kl_max, attn_num, attn_den, attn_worst;
    long agree, rows;
    size_t bpt;
} kind_res;

static void log_softmax(const float *x, int n, double *out) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) m = fmax(m, x[i]);
    for (int i = 0; i < n; i++) s += exp(x[i] - m);
    double lse = m + log(s);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static int forward(tern_model *m, tern_kv *kv, tern_kv *shadow, const int32_t *tok, int p0, int n, const uint8_t *want,
                   float *logits) {
    int32_t pos[512], slot[512];
    tern_error e = {0};
    for (int i = 0; i < n; i++) { pos[i] = p0 + i; slot[i] = 0; }
    if (tern_kv_reserve(kv, 0, p0 + n, &e) || (shadow && tern_kv_reserve(shadow, 0, p0 + n, &e))) {
        fprintf(stderr, "reserve: %s\n", e.msg);
        return -1;
    }
    if (shadow) tern_kv_sync(shadow);
    tern_batch b = {.n = n, .tokens = tok + p0, .pos = pos, .slot = slot, .want = want};
    if (tern_model_forward(m, &b, kv, logits, &e)) { fprintf(stderr, "forward: %s\n", e.msg); return -1; }
    return 0;
}

static int run_model(const char *label, tern_model *m, const char **kinds, int nk, int ctx, int chunk, int eval_from,
                     unsigned long long seed) {
    const tern_model_config *cfg = tern_model_cfg(m);
    int V = cfg->n_vocab, rc = -1;
    if (ctx > cfg->n_ctx_train && cfg->n_ctx_train > 0) ctx = cfg->n_ctx_train;
    if (eval_from >= ctx) eval_from = ctx / 2;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)ctx);
    for (int i = 0; i < ctx; i++) { seed = seed * 6364136223846793005ull + 1442695040888963407ull; tok[i] = 3 + (int)((seed >> 33) % (uint64_t)(V - 3)); }
    float *lr = malloc(sizeof(float) * (size_t)chunk * V), *lq = malloc(sizeof(float) * (size_t)chunk * V);
    double *a = malloc(sizeof(double) * V), *b = malloc(sizeof(double) * V);
    kind_res R[MAXK];
    memset(R, 0, sizeof R);
    tern_kv *ref = NULL;
    tern_error e = {0};
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = ctx};
    if (tern_kv_open(&ref, &T.be, cfg, &ko, &e)) { fprintf(stderr, "%s: kv: %s\n", label, e.msg); goto out; }
    for (int k = 0; k < nk; k++) {
        tern_kv_fmt *f = NULL;
        R[k].spec = kinds[k];
        if (tern_kv_quant_plan(kinds[k], NULL, cfg, &f, NULL, &e)) { fprintf(stderr, "%s: %s\n", kinds[k], e.msg); goto out; }
        tern_kv_opts kq = ko;
        kq.formats = f;
        tern_status st = tern_kv_open(&R[k].kv, &T.be, cfg, &kq, &e);
        if (!st) st = tern_kv_open(&R[k].shadow, &T.be, cfg, &ko, &e);
        free(f);
        if (st) { printf("\n%s: skipped (%s)\n", label, e.msg); rc = st == TERN_EUNSUPPORTED ? 1 : -1; goto out; }
        R[k].bpt = tern_kv_token_bytes(R[k].kv);
    }
    uint8_t want[512];
    for (int p0 = 0; p0 < ctx; p0 += chunk) {
        int n = ctx - p0 < chunk ? ctx - p0 : chunk, nw = 0;
        for (int i = 0; i < n; i++) nw += (want[i] = p0 + i >= eval_from && p0 + i < ctx - 1);
        if (!nw) want[n - 1] = 1, nw = 1;
        T.q = NULL;
        if (forward(m, ref, NULL, tok, p0, n, want, lr)) goto out;
        for (int k = 0; k < nk; k++) {
            T.q = R[k].kv;
            T.shadow = R[k].shadow;
            memset(T.num, 0, sizeof T.num);
            memset(T.den, 0, sizeof T.den);
            int fr = forward(m, R[k].kv, R[k].shadow, tok, p0, n, want, lq);
            T.q = NULL;
            if (fr) goto out;
            double sn = 0, sd = 0;
            for (int l = 0; l < T.n_layer; l++) {
                sn += T.num[l];
                sd += T.den[l];
                if (T.den[l] > 0) R[k].attn_worst = fmax(R[k].attn_worst, sqrt(T.num[l] / T.den[l]));
            }
            R[k].attn_num += sn;
            R[k].attn_den += sd;
            int w = 0;
            for (int i = 0; i < n; i++) {
                if (!want[i] || p0 + i < eval_from || p0 + i >= ctx - 1) { w += want[i]; continue; }
                const float *x = lr + (size_t)w * V, *y = lq + (size_t)w * V;
                log_softmax(x, V, a);
                log_softmax(y, V, b);
                double kl = 0;
                for (int j = 0; j < V; j++) kl += exp(a[j]) * (a[j] - b[j]);
                R[k].kl += kl;
                R[k].kl_max = fmax(R[k].kl_max, kl);
                R[k].agree += argmax(x, V) == argmax(y, V);
                R[k].rows++;
                w++;
            }
        }
    }
    size_t f32b = tern_kv_bytes_per_token(cfg);
    printf("\n%s: ctx %d, eval rows %d..%d, f32 KV %zu bytes/token\n", label, ctx, eval_from, ctx - 2, f32b);
    printf("  %-11s %9s %7s %9s %11s %11s %11s %8s\n", "kind", "bytes/tok", "x f32", "bits/elem", "attn relerr",
           "worst layer", "KL mean", "top1 %");
    for (int k = 0; k < nk; k++) {
        double kl = R[k].rows ? R[k].kl / R[k].rows : 0, attn = R[k].attn_den > 0 ? sqrt(R[k].attn_num / R[k].attn_den) : 0;
        printf("  %-11s %9zu %7.2f %9.2f %11.3e %11.3e %11.3e %8.2f\n", R[k].spec, R[k].bpt, (double)f32b / R[k].bpt,
               32.0 * R[k].bpt / f32b, attn, R[k].attn_worst, kl, R[k].rows ? 100.0 * R[k].agree / R[k].rows : 0);
        printf("csv,%s,%s,%d,%zu,%.4f,%.4e,%.4e,%.4e,%.4e,%.4f\n", label, R[k].spec, ctx, R[k].bpt, 32.0 * R[k].bpt / f32b,
               attn, R[k].attn_worst, kl, R[k].kl_max, R[k].rows ? 100.0 * R[k].agree / R[k].rows : 0);
    }
    fflush(stdout);
    rc = 0;
out:
    T.q = NULL;
    tern_kv_close(ref);
    for (int k = 0; k < nk; k++) { tern_kv_close(R[k].kv); tern_kv_close(R[k].shadow); }
    free(tok); free(lr); free(lq); free(a); free(b);
    return rc;
}

/* ---- synthetic attention heads ---- */

static double gauss(unsigned long long *s) {
    double u1, u2;
    *s = *s * 6364136223846793005ull + 1442695040888963407ull; u1 = ((*s >> 11) + 0.5) / 9007199254740992.0;
    *s = *s * 6364136223846793005ull + 1442695040888963407ull; u2 = ((*s >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

static void synthetic(tern_backend *be, const char **kinds, int nk, int ctx) {
    enum { D = 128, NKV = 4, NH = 16, NQ = 8 };
    unsigned long long s = 42;
    float *k = malloc(sizeof(float) * (size_t)ctx * NKV * D), *v = malloc(sizeof(float) * (size_t)ctx * NKV * D);
    float off[D], amp[D];
    for (int i = 0; i < D; i++) { off[i] = (float)(0.5 * gauss(&s)); amp[i] = i % 16 == 3 ? 8.0f : 1.0f; }
    for (size_t t = 0; t < (size_t)ctx * NKV; t++)
        for (int i = 0; i < D; i++) { k[t * D + i] = off[i] + amp[i] * (float)gauss(&s); v[t * D + i] = (float)gauss(&s); }
    float *q = malloc(sizeof(float) * NQ * NH * D), *o0 = malloc(sizeof(float) * NQ * NH * D), *o1 = malloc(sizeof(float) * NQ * NH * D);
    for (int i = 0; i < NQ * NH * D; i++) q[i] = (float)(1.5 * gauss(&s));
    int32_t pos[NQ], slot[NQ];
    for (int i = 0; i < NQ; i++) { pos[i] = ctx - 1 - i * (ctx / NQ); slot[i] = 0; }
    tern_rows rows = {NQ, pos, slot, pos, slot};
    int nb = ctx;  /* block size 1: identity table */
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i;
    float signs[D];
    tern_kvq_signs(7, signs, D);
    printf("\nsynthetic heads: D %d, %d kv heads, %d query heads, ctx %d; keys: channel offsets N(0,0.25) + every 16th "
           "channel x8; values N(0,1); q ~ 1.5 N(0,1)\n", D, NKV, NH, ctx);
    printf("  %-11s %9s %11s %12s\n", "kind", "bits/elem", "attn relerr", "attn ms/call");
    for (int kk = -1; kk < nk; kk++) {
        tern_kv_fmt f[2] = {{0}, {0}};
        tern_error e = {0};
        if (kk >= 0 && tern_kv_quant_parse(kinds[kk], f, &e)) { fprintf(stderr, "%s\n", e.msg); continue; }
        tern_kv_layer L = {.n_head_kv = NKV, .head_dim = D, .block_size = 1, .max_blocks = nb, .block_table = table,
                           .kf = f[0], .vf = f[1], .rot_dim = D, .rot = signs};
        size_t kb = tern_kvq_vec_bytes(&f[0], D), vb = tern_kvq_vec_bytes(&f[1], D);
        L.k = malloc(kb * (size_t)ctx * NKV);
        L.v = malloc(vb * (size_t)ctx * NKV);
        for (int p0 = 0; p0 < ctx; p0 += 64) {
            int n = ctx - p0 < 64 ? ctx - p0 : 64;
            int32_t wp[64], ws[64];
            for (int i = 0; i < n; i++) { wp[i] = p0 + i; ws[i] = 0; }
            tern_rows wr = {n, wp, ws, wp, ws};
            be->vt->kv_write(be, &L, &wr, k + (size_t)p0 * NKV * D, v + (size_t)p0 * NKV * D);
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int rep = 0; rep < 5; rep++)
            be->vt->attention(be, kk < 0 ? o0 : o1, q, &rows, NH, &L, 1.0f / sqrtf((float)D), 0.0f);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6) / 5;
        if (kk < 0) printf("  %-11s %9.2f %11s %12.3f\n", "f32", 32.0, "-", ms);
        if (kk >= 0) {
            double num = 0, den = 0;
            for (int i = 0; i < NQ * NH * D; i++) { num += ((double)o1[i] - o0[i]) * ((double)o1[i] - o0[i]); den += (double)o0[i] * o0[i]; }
            printf("  %-11s %9.2f %11.3e %12.3f\n", kinds[kk], (tern_kvq_bits_per_elem(&f[0], D) + tern_kvq_bits_per_elem(&f[1], D)) / 2,
                   sqrt(num / den), ms);
            printf("csv,synthetic,%s,%d,%.4f,%.4e,%.4f\n", kinds[kk], ctx,
                   (tern_kvq_bits_per_elem(&f[0], D) + tern_kvq_bits_per_elem(&f[1], D)) / 2, sqrt(num / den), ms);
        }
        free(L.k);
        free(L.v);
    }
    free(k); free(v); free(q); free(o0); free(o1); free(table);
}

int main(int argc, char **argv) {
    const char *model = NULL, *random = NULL, *kind_list = "f16,bf16,8,8:32,4,4:32,turbo:4,4,turbo:4,3,turbo:3,3,turbo:3,2";
    int ctx = 256, chunk = 64, eval_from = 32, threads = 0, synth = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--model") && v) model = argv[++i];
        else if (!strcmp(argv[i], "--random") && v) random = argv[++i];
        else if (!strcmp(argv[i], "--kinds") && v) kind_list = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && v) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && v) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--eval-from") && v) eval_from = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--synthetic")) synth = 1;
        else { fprintf(stderr, "usage: bench_kvq [--model DIR | --random PRESET | --synthetic] [--ctx N] [--chunk N] "
                               "[--eval-from N] [--kinds a,b,...] [--threads N]\n"); return 2; }
    }
    if (ctx < 2 || chunk < 1 || chunk > 512) { fprintf(stderr, "bench_kvq: bad --ctx/--chunk\n"); return 2; }
    /* kinds: split on commas, but "turbo:K,V" keeps its comma */
    static char kbuf[1024];
    const char *kinds[MAXK];
    int nk = 0;
    snprintf(kbuf, sizeof kbuf, "%s", kind_list);
    for (char *p = kbuf; *p && nk < MAXK;) {
        kinds[nk++] = p;
        char *c = strchr(p, ',');
        if (c && !strncmp(p, "turbo:", 6) && c[1] >= '0' && c[1] <= '9' && (c[2] == ',' || !c[2])) c = strchr(c + 1, ',');
        if (!c) break;
        *c = 0;
        p = c + 1;
    }
    tern_error e = {0};
    tern_backend_opts bo = {.n_threads = threads};
    if (tern_backend_cpu_open(&T.inner, &bo, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    printf("bench_kvq: cpu backend (%s), kinds:", tern_cpu_isa_name());
    for (int k = 0; k < nk; k++) printf(" %s", kinds[k]);
    printf("\n");
    if (synth) { synthetic(T.inner, kinds, nk, ctx); tern_backend_close(T.inner); return 0; }
    T.be = *T.inner;
    T.vt = *T.inner->vt;
    T.vt.kv_write = tap_kv_write;
    T.vt.attention = tap_attention;
    T.be.vt = &T.vt;
    char dirs[32][300];
    int nd = 0;
    if (model) snprintf(dirs[nd++], 300, "%s", model);
    else if (!random) {
        DIR *d = opendir("tests/parity/fixtures");
        struct dirent *de;
        while (d && (de = readdir(d)) && nd < 32)
            if (de->d_name[0] != '.' && de->d_name[0] != '_' && !strchr(de->d_name, '.'))
                snprintf(dirs[nd++], 300, "tests/parity/fixtures/%s", de->d_name);
        if (d) closedir(d);
        qsort(dirs, (size_t)nd, sizeof dirs[0], (int (*)(const void *, const void *))strcmp);
    }
    int failed = 0;
    for (int i = 0; i <= nd; i++) {
        tern_model *m = NULL;
        tern_model_config cfg;
        tern_weights *ws = NULL;
        const char *label;
        memset(&cfg, 0, sizeof cfg);
        if (i < nd) {
            label = strrchr(dirs[i], '/') ? strrchr(dirs[i], '/') + 1 : dirs[i];
            if (tern_model_load(&m, dirs[i], &T.be, NULL, &e)) { printf("\n%s: skipped (%s)\n", label, e.msg); continue; }
        } else {
            if (!random) break;
            label = random;
            const char *js = tern_preset_config(random);
            tern_synth_spec spec = {.bits = 0, .group_size = 64};
            if (!js || tern_config_parse(&cfg, js, strlen(js), random, &e) || tern_weights_open_synth(&ws, &cfg, &spec, &e) ||
                tern_model_load_from(&m, &cfg, ws, &T.be, NULL, &e)) {
                fprintf(stderr, "%s: %s\n", random, js ? e.msg : "unknown preset");
                tern_weights_close(ws);
                tern_config_free(&cfg);
                return 2;
            }
        }
        T.n_layer = tern_model_cfg(m)->n_layer;
        clock_t t0 = clock();
        int rc = run_model(label, m, kinds, nk, ctx, chunk, eval_from, 0x5eed + (unsigned long long)i);
        failed |= rc < 0;
        if (!rc) printf("  (%.1f s cpu)\n", (double)(clock() - t0) / CLOCKS_PER_SEC);
        tern_model_free(m);
        tern_weights_close(ws);
        tern_config_free(&cfg);
    }
    free(T.buf);
    tern_backend_close(T.inner);
    return failed;
}
