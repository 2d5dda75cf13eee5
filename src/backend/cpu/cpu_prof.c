/*
 * cpu_prof.c — the fast CPU backend's per-op profiler (TERN_CPU_PROFILE=1), modelled on the CUDA
 * backend's TERN_CUDA_PROFILE (src/backend/cuda/prof.c).
 *
 * Off (the default) the backend keeps its plain vtable: nothing is wrapped, nothing is timed.
 * On, tern__cpu_vt_select hands out a copy whose ops are wrapped: each call is timed on the calling
 * thread with the monotonic clock (CPU ops are synchronous, so that is the op's whole cost, its pool
 * hand-offs included), summed per op kind — matmuls per weight shape and format — and per step.
 * A step runs from its first op to the `download` that ends it (the logits, or the id drawn by the
 * sample op); its phase is the row count its `embed` saw: decode (1 row) or prefill (more). The
 * table, printed to stderr when the backend closes, gives per decode step (and per prefill step):
 * calls, µs and the share of the step's wall time, plus "(between ops)" = wall − the ops' sum (the
 * model driver's host code). The batch-1 driver (cpu_decode.c) adds its own split of the GEMV ops,
 * reported through tern__cpu_prof_dec: x preparation on the caller, the workers' start latency after
 * the pool run begins, the spread of the threads' finishing times and the caller's wait after the
 * last one finished. GLM-5's heavy ops (attention_latent, dsa_topk, matmul_heads) are timed through a wrapped copy
 * of the backend's GLM table. One profiled backend per process.
 */
#include "backend/cpu/cpu_impl.h"
#include "ops/ops_prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROF_KINDS 96

int tern__cpu_prof;                    /* read by cpu_decode.c: 1 while a profiled backend exists */

static tern_backend_vt g_vt;           /* the wrapped copy */
static const tern_backend_vt *g_base;  /* the real ops */
#define PROF_SAMPLES 4096             /* per-call times kept per kind (decode steps), for the median */
typedef struct pk {
    char name[64];
    double s[2];
    long n[2];
    double step_s;
    long step_n;
    float *smp;                        /* [PROF_SAMPLES] µs of the decode calls, the first PROF_SAMPLES */
    int nsmp, step_first;              /* samples kept; index of this step's first sample */
} pk;
static pk g_k[PROF_KINDS];
static int g_nk;
static int g_in_step, g_phase;         /* phase: 0 decode, 1 prefill (from embed's rows) */
static int g_depth;                    /* ops called from inside a wrapped op are not counted again */
static double g_t_step, g_wall[2];
static long g_steps[2];
/* the decode driver's split (seconds summed over calls; calls with 2+ threads) */
static double g_dec[5];
static long g_dec_calls[2];
#define DEC_SAMPLES 65536
static float *g_dec_smp[4];            /* per-call µs of the driver's split: prep, wake, spread, wait */
static int g_dec_n[4];
static float *g_pool;                  /* the sample arrays, one allocation made when profiling starts */

static int kind_id(const char *name) {
    for (int i = 0; i < g_nk; i++)
        if (!strcmp(g_k[i].name, name)) return i;
    if (g_nk == PROF_KINDS) return PROF_KINDS - 1; /* overflow bucket */
    snprintf(g_k[g_nk].name, sizeof g_k[0].name, "%s", name);
    g_k[g_nk].smp = g_pool ? g_pool + (size_t)g_nk * PROF_SAMPLES : NULL;
    return g_nk++;
}

/* The step starts at its embed: what ran before it in the step (the rows' uploads, or a model's loading) is
 * dropped. */
static void step_restart(double t) {
    g_t_step = t;
    for (int i = 0; i < g_nk; i++) {
        g_k[i].step_s = 0;
        g_k[i].step_n = 0;
        g_k[i].nsmp = g_k[i].step_first;
    }
}

/* Folds the step's per-kind sums into its phase. */
static void step_end(double t) {
    const int ph = g_phase;
    g_wall[ph] += t - g_t_step;
    g_steps[ph]++;
    for (int i = 0; i < g_nk; i++) {
        if (ph) g_k[i].nsmp = g_k[i].step_first; /* samples are of decode calls */
        g_k[i].step_first = g_k[i].nsmp;
        g_k[i].s[ph] += g_k[i].step_s;
        g_k[i].n[ph] += g_k[i].step_n;
        g_k[i].step_s = 0;
        g_k[i].step_n = 0;
    }
    g_in_step = 0;
}

static double begin(void) {
    const double t = tern_time_s();
    g_depth++;
    if (!g_in_step) { g_in_step = 1; g_t_step = t; g_phase = 1; }
    return t;
}
static void end(double t0, const char *name) {
    const double t = tern_time_s();
    if (--g_depth) return;
    pk *k = &g_k[kind_id(name)];
    k->step_s += t - t0;
    k->step_n++;
    if (k->smp && k->nsmp < PROF_SAMPLES) k->smp[k->nsmp++] = (float)((t - t0) * 1e6);
}

static void dec_smp(int i, double v) {
    if (g_dec_smp[i] && g_dec_n[i] < DEC_SAMPLES) g_dec_smp[i][g_dec_n[i]++] = (float)(v * 1e6);
}

void tern__cpu_prof_dec(double prep, double wake, double skew, double tail, int threads) {
    if (g_phase) return; /* decode steps only (the driver serves one-row matmuls of prefill steps too: the head) */
    g_dec[0] += prep;
    g_dec_calls[0]++;
    dec_smp(0, prep);
    if (threads > 1) {
        g_dec[1] += wake;
        g_dec[2] += skew;
        g_dec[3] += tail;
        g_dec_calls[1]++;
        dec_smp(1, wake);
        dec_smp(2, skew);
        dec_smp(3, tail);
    }
}

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
/* the q-quantile of n samples (sorted in place); 0 when none */
static double quant(float *v, int n, double q) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_f);
    return v[(int)(q * (n - 1) + 0.5)];
}

#define TERN_PROF_BEGIN const double t0 = begin()
#define TERN_PROF_END(label) end(t0, label)
#define WRAP0 TERN_PROF_WRAP_PLAIN
TERN_PROF_PLAIN_OPS(WRAP0)
TERN_PROF_WEIGHT_OPS(TERN_PROF_WRAP_WEIGHT)
TERN_PROF_FUSED_OPS(TERN_PROF_WRAP_FUSED)
WRAP0(upload, (tern_backend *be, void *dst, const void *src, size_t bytes), (be, dst, src, bytes))
WRAP0(sample, (tern_backend *be, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
               const tern_sample_pair *pairs, void *scratch), (be, ids, logits, n, V, rows, pairs, scratch))

static void p_embed(tern_backend *be, float *y, const int32_t *ids, int n, const tern_tensor *e, float s) {
    const double t0 = begin();
    step_restart(t0);
    g_phase = n > 1;
    g_base->embed(be, y, ids, n, e, s);
    end(t0, "embed");
}
static void p_download(tern_backend *be, void *dst, const void *src, size_t bytes) {
    const double t0 = begin();
    g_base->download(be, dst, src, bytes);
    end(t0, "download");
    step_end(tern_time_s());
}
static int p_matmul_n(tern_backend *be, int k, float *const *y, const float *x, int n, const tern_tensor *const *w) {
    char nm[64];
    const double t0 = begin();
    int r = g_base->matmul_n(be, k, y, x, n, w);
    end(t0, r ? tern__prof_wname(k == 3 ? "matmul_n q|k|v" : "matmul_n", w[0], nm, sizeof nm) : "(matmul_n refused)");
    return r;
}
static int p_norm_matmul(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, int k,
                         float *const *y, const tern_tensor *const *w, int act, const tern_norm_res *res) {
    char nm[64];
    const double t0 = begin();
    int r = g_base->norm_matmul(be, xn, x, nw, eps, n, k, y, w, act, res);
    end(t0, r ? tern__prof_wname(act >= 0 ? "norm_matmul glu" : k == 3 ? "norm_matmul q|k|v" : "norm_matmul", w[0], nm, sizeof nm)
              : "(norm_matmul refused)");
    return r;
}
static int p_rmsnorm_add(tern_backend *be, float *x, const float *h, int rows, int d, const float *w, float eps,
                         const float *sc) {
    const double t0 = begin();
    int r = g_base->rmsnorm_add(be, x, h, rows, d, w, eps, sc);
    end(t0, r ? "rmsnorm_add" : "(rmsnorm_add refused)");
    return r;
}

/* GLM-5's heavy ops (ops.h tern_glm_ops), through a wrapped copy of the backend's table */
static tern_glm_ops g_glm;
static void p_attention_latent(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                               const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel) {
    const double t0 = begin();
    g_base->glm->attention_latent(be, out, q, rows, nh, kv, dv, scale, sel, k_sel);
    end(t0, sel ? "attention_latent (selected)" : "attention_latent");
}
static void p_dsa_topk(tern_backend *be, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                       const tern_kv_layer *kv, float scale, int k, float *min_gap) {
    const double t0 = begin();
    g_base->glm->dsa_topk(be, sel, q, w, rows, nh, kv, scale, k, min_gap);
    end(t0, "dsa_topk");
}
static void p_matmul_heads(tern_backend *be, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                           const tern_tensor *w) {
    char nm[64];
    const double t0 = begin();
    g_base->glm->matmul_heads(be, y, ldy, hy, x, ldx, hx, n, nh, w);
    end(t0, tern__prof_wname("matmul_heads", w, nm, sizeof nm));
}

const tern_backend_vt *tern__cpu_vt_select(const tern_backend_vt *base) {
    const char *e = getenv("TERN_CPU_PROFILE");
    if (!(e && e[0] == '1') || g_base) return base; /* off, or a profiled backend exists already */
    g_vt = *base;
    g_base = base;
    tern__cpu_prof = 1;
    g_pool = malloc(sizeof(float) * ((size_t)PROF_KINDS * PROF_SAMPLES + 4 * (size_t)DEC_SAMPLES));
    for (int i = 0; g_pool && i < 4; i++) g_dec_smp[i] = g_pool + (size_t)PROF_KINDS * PROF_SAMPLES + (size_t)i * DEC_SAMPLES;
#define SET(nm) g_vt.nm = g_vt.nm ? p_##nm : NULL
    SET(rmsnorm); SET(rope); SET(kv_write); SET(attention); SET(add); SET(mul); SET(scale); SET(scale_dev);
    SET(gelu_tanh_mul); SET(silu_mul); SET(softcap); SET(add_bias); SET(copy_cols); SET(embed); SET(upload);
    SET(route_topk); SET(moe_mlp); SET(sample); SET(matmul); SET(matmul_expert); SET(matmul_n); SET(matmul_glu);
    SET(matmul_add); SET(norm_matmul); SET(rope_kv_write); SET(norm_qkv_rope_kv); SET(norm_mlp); SET(rmsnorm_add); SET(download);
#undef SET
    if (base->glm) {
        g_glm = *base->glm;
        if (g_glm.attention_latent) g_glm.attention_latent = p_attention_latent;
        if (g_glm.dsa_topk) g_glm.dsa_topk = p_dsa_topk;
        if (g_glm.matmul_heads) g_glm.matmul_heads = p_matmul_heads;
        g_vt.glm = &g_glm;
    }
    return &g_vt;
}

static int g_sort_ph;
static int by_time(const void *a, const void *b) {
    const int *x = a, *y = b;
    double d = g_k[*y].s[g_sort_ph] - g_k[*x].s[g_sort_ph];
    return d > 0 ? 1 : d < 0 ? -1 : 0;
}

static void report_phase(int ph) {
    if (!g_steps[ph]) return;
    const double ns = (double)g_steps[ph], wall = g_wall[ph] / ns * 1e6;
    int ord[PROF_KINDS];
    double sum = 0;
    for (int i = 0; i < g_nk; i++) ord[i] = i, sum += g_k[i].s[ph];
    g_sort_ph = ph;
    qsort(ord, (size_t)g_nk, sizeof ord[0], by_time);
    fprintf(stderr, "cpu profile, %s: %ld steps, %.1f us per step (wall, first op to the download)\n",
            ph ? "prefill" : "decode", g_steps[ph], wall);
    fprintf(stderr, "%-46s %9s %11s %9s %6s%s\n", "op (per step)", "calls", "us", "avg us", "%",
            ph ? "" : "  med us  p90 us");
    for (int j = 0; j < g_nk; j++) {
        pk *k = &g_k[ord[j]];
        if (!k->n[ph]) continue;
        fprintf(stderr, "%-46s %9.1f %11.1f %9.2f %6.1f", k->name, k->n[ph] / ns, k->s[ph] / ns * 1e6,
                k->s[ph] / (double)k->n[ph] * 1e6, wall > 0 ? 100.0 * k->s[ph] / ns * 1e6 / wall : 0.0);
        if (!ph && k->smp) fprintf(stderr, " %8.2f %7.2f", quant(k->smp, k->nsmp, 0.5), quant(k->smp, k->nsmp, 0.9));
        fprintf(stderr, "\n");
    }
    const double gap = wall - sum / ns * 1e6;
    fprintf(stderr, "%-46s %9s %11.1f %9s %6.1f\n", "(between ops)", "", gap, "", wall > 0 ? 100.0 * gap / wall : 0.0);
}

void tern__cpu_prof_report(void) {
    if (!g_base) return;
    if (g_in_step) step_end(tern_time_s()); /* an unfinished step (no download) */
    report_phase(0);
    report_phase(1);
    if (g_dec_calls[0]) {
        static const char *const what[4] = {"x prep (caller)", "worker start after the run began",
                                            "spread of the threads' finishes", "caller wait after the last finish"};
        const double nc[4] = {(double)g_dec_calls[0], (double)g_dec_calls[1], (double)g_dec_calls[1], (double)g_dec_calls[1]};
        fprintf(stderr, "cpu profile, batch-1 GEMV driver in decode steps: %ld calls (%.1f per step), %ld on the pool\n",
                g_dec_calls[0], g_steps[0] ? (double)g_dec_calls[0] / (double)g_steps[0] : 0.0, g_dec_calls[1]);
        fprintf(stderr, "%-42s %8s %7s %7s %8s %9s %11s %9s\n", "per call", "mean us", "med us", "p90 us", "p99 us",
                "max us", "us per step", ">20us/st");
        for (int i = 0; i < 4; i++) {
            if (!nc[i]) continue;
            float *v = g_dec_smp[i];
            const int n = g_dec_n[i];
            long big = 0;
            for (int j = 0; j < n; j++) big += v[j] > 20.0f;
            fprintf(stderr, "%-42s %8.2f %7.2f %7.2f %8.2f %9.1f %11.1f %9.2f\n", what[i], g_dec[i] / nc[i] * 1e6,
                    quant(v, n, 0.5), quant(v, n, 0.9), quant(v, n, 0.99), quant(v, n, 1.0),
                    g_steps[0] ? g_dec[i] / (double)g_steps[0] * 1e6 : 0.0, g_steps[0] ? (double)big / (double)g_steps[0] : 0.0);
        }
    }
    for (int i = 0; i < g_nk; i++) {
        float *smp = g_k[i].smp;
        memset(&g_k[i], 0, sizeof g_k[i]);
        g_k[i].smp = smp;
    }
    g_nk = 0;
    g_steps[0] = g_steps[1] = 0;
    g_wall[0] = g_wall[1] = 0;
    memset(g_dec, 0, sizeof g_dec);
    g_dec_calls[0] = g_dec_calls[1] = 0;
    memset(g_dec_n, 0, sizeof g_dec_n);
}
