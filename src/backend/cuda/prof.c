/*
 * prof.c — which vtable a CUDA backend gets, and the per-op profiler (TERN_CUDA_PROFILE=1).
 *
 * TERN_CUDA_FUSED=0: the fused decode ops (matmul_n, matmul_glu, matmul_add, rope_kv_write, rmsnorm_add,
 * norm_matmul, rmsnorm_n, norm_rope_kv_write, norm_qkv_rope_kv) are left out, so models run the separate ops (before/after comparisons).
 *
 * TERN_CUDA_PROFILE=1: every op is wrapped so that it records a CUDA event before and after
 * itself; graphs are off (the graph hooks are NULL), so a step runs eagerly and each op's
 * GPU time is measured alone (launch gaps between ops are not counted; the table's total vs
 * the wall time of a step shows them). Events are resolved at each download/sync, summed per
 * op kind — matmuls per weight shape and format — and printed as a table to stderr when the
 * backend closes (tern__cuda_prof_report). One profiled backend per process.
 */
#include "backend/cuda/cuda_internal.h"
#include "ops/ops_prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROF_EV 8192
#define PROF_KINDS 96

static tern_backend_vt g_vt;           /* the selected copy */
static const tern_backend_vt *g_base;  /* the real ops */
static int g_prof;
static cudaEvent_t g_ev[PROF_EV];
static int g_kind_of[PROF_EV / 2], g_pending;
static struct { char name[64]; double ms; long count; } g_kinds[PROF_KINDS];
static int g_nkinds;

static int kind_id(const char *name) {
    for (int i = 0; i < g_nkinds; i++)
        if (!strcmp(g_kinds[i].name, name)) return i;
    if (g_nkinds == PROF_KINDS) return PROF_KINDS - 1; /* overflow bucket */
    snprintf(g_kinds[g_nkinds].name, sizeof g_kinds[0].name, "%s", name);
    return g_nkinds++;
}

static void resolve(tern_backend *be) {
    if (!g_pending) return;
    cudaStream_t st = ((tern__cuda *)be->impl)->stream;
    cudaStreamSynchronize(st);
    for (int i = 0; i < g_pending; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, g_ev[2 * i], g_ev[2 * i + 1]) == cudaSuccess) {
            g_kinds[g_kind_of[i]].ms += ms;
            g_kinds[g_kind_of[i]].count++;
        }
    }
    cudaGetLastError();
    g_pending = 0;
}

static void begin(tern_backend *be) {
    if (g_pending == PROF_EV / 2) resolve(be);
    cudaEventRecord(g_ev[2 * g_pending], ((tern__cuda *)be->impl)->stream);
}
static void end(tern_backend *be, const char *name) {
    cudaEventRecord(g_ev[2 * g_pending + 1], ((tern__cuda *)be->impl)->stream);
    g_kind_of[g_pending++] = kind_id(name);
}

#define TERN_PROF_BEGIN begin(be)
#define TERN_PROF_END(label) end(be, label)
#define WRAP0 TERN_PROF_WRAP_PLAIN
TERN_PROF_PLAIN_OPS(WRAP0)
TERN_PROF_WEIGHT_OPS(TERN_PROF_WRAP_WEIGHT)
TERN_PROF_FUSED_OPS(TERN_PROF_WRAP_FUSED)
WRAP0(embed, (tern_backend *be, float *y, const int32_t *ids, int n, const tern_tensor *e, float s), (be, y, ids, n, e, s))

static int p_matmul_n(tern_backend *be, int k, float *const *y, const float *x, int n, const tern_tensor *const *w) {
    char nm[64];
    begin(be);
    int r = g_base->matmul_n(be, k, y, x, n, w);
    end(be, r ? tern__prof_wname("matmul_n (first)", w[0], nm, sizeof nm) : "(matmul_n refused)");
    return r;
}
static int p_norm_matmul(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, int k,
                         float *const *y, const tern_tensor *const *w, int act, const tern_norm_res *res) {
    char nm[64];
    begin(be);
    int r = g_base->norm_matmul(be, xn, x, nw, eps, n, k, y, w, act, res);
    end(be, r ? tern__prof_wname("norm_matmul (first)", w[0], nm, sizeof nm) : "(norm_matmul refused)");
    return r;
}
static int p_rmsnorm_n(tern_backend *be, int k, float *const *y, const float *const *x, const int *rows, int d,
                       const float *const *w, float eps) {
    begin(be);
    int r = g_base->rmsnorm_n(be, k, y, x, rows, d, w, eps);
    end(be, r ? "rmsnorm_n" : "(rmsnorm_n refused)");
    return r;
}
static int p_norm_rope_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k,
                                float *v, int nh, const float *inv_freq, float mscale, const float *qw, const float *kw,
                                float eps) {
    begin(be);
    int r = g_base->norm_rope_kv_write(be, kv, rows, q, k, v, nh, inv_freq, mscale, qw, kw, eps);
    end(be, r ? "norm_rope_kv_write" : "(norm_rope_kv_write refused)");
    return r;
}
static int p_rmsnorm_add(tern_backend *be, float *x, const float *h, int rows, int d, const float *w, float eps,
                         const float *sc) {
    begin(be);
    int r = g_base->rmsnorm_add(be, x, h, rows, d, w, eps, sc);
    end(be, "rmsnorm_add");
    return r;
}
static void p_download(tern_backend *be, void *dst, const void *src, size_t bytes) {
    begin(be);
    g_base->download(be, dst, src, bytes);
    end(be, "download");
    resolve(be);
}
static void p_sync(tern_backend *be) {
    g_base->sync(be);
    resolve(be);
}

const tern_backend_vt *tern__cuda_vt_select(const tern_backend_vt *base) {
    const int nofuse = tern__cuda_env_int("TERN_CUDA_FUSED", 1) == 0;
    const int prof = tern__cuda_env_int("TERN_CUDA_PROFILE", 0) != 0;
    if (!nofuse && !prof) return base;
    if (prof && g_prof) return base; /* one profiled backend per process */
    g_vt = *base;
    g_base = base;
    if (nofuse) g_vt.matmul_n = NULL, g_vt.matmul_glu = NULL, g_vt.matmul_add = NULL, g_vt.rope_kv_write = NULL, g_vt.rmsnorm_add = NULL,
                  g_vt.norm_matmul = NULL, g_vt.rmsnorm_n = NULL, g_vt.norm_rope_kv_write = NULL,
                  g_vt.norm_qkv_rope_kv = NULL, g_vt.norm_mlp = NULL, g_vt.attention_o = NULL,
                  g_vt.norm_qkv_attention_o = NULL, g_vt.matmul_act_mul = NULL, g_vt.norm_route_topk = NULL,
                  g_vt.rmsnorm_add2 = NULL;
    if (prof) {
        for (int i = 0; i < PROF_EV; i++)
            if (cudaEventCreate(&g_ev[i]) != cudaSuccess) return cudaGetLastError(), base;
        g_prof = 1;
        g_vt.graph_replay = NULL, g_vt.graph_begin = NULL, g_vt.graph_end = NULL, g_vt.graph_reset = NULL;
        g_vt.attention_o = NULL; /* the attention and the projection as the two profiled ops */
        g_vt.norm_qkv_attention_o = NULL;
        g_vt.matmul_act_mul = NULL; /* the matmul and the act·v as the two profiled ops */
        g_vt.norm_route_topk = NULL; /* the norms, the router and the top-k as their own profiled ops */
        g_vt.rmsnorm_add2 = NULL;    /* its two rmsnorm_adds as profiled ops */
#define SET(nm) g_vt.nm = g_vt.nm ? p_##nm : NULL
        SET(rmsnorm); SET(rope); SET(kv_write); SET(attention); SET(add); SET(mul); SET(scale); SET(scale_dev);
        SET(gelu_tanh_mul); SET(silu_mul); SET(softcap); SET(add_bias); SET(copy_cols); SET(embed);
        SET(route_topk); SET(moe_mlp); SET(matmul); SET(matmul_expert); SET(matmul_n); SET(matmul_glu);
        SET(matmul_add); SET(rope_kv_write); SET(rmsnorm_add); SET(norm_matmul); SET(rmsnorm_n); SET(norm_rope_kv_write);
        SET(norm_qkv_rope_kv); SET(norm_mlp); SET(download); SET(sync);
#undef SET
    }
    return &g_vt;
}

static int by_ms(const void *a, const void *b) {
    const int *x = a, *y = b;
    double d = g_kinds[*y].ms - g_kinds[*x].ms;
    return d > 0 ? 1 : d < 0 ? -1 : 0;
}

void tern__cuda_prof_report(void) {
    if (!g_prof || !g_nkinds) return;
    int ord[PROF_KINDS];
    double total = 0;
    for (int i = 0; i < g_nkinds; i++) ord[i] = i, total += g_kinds[i].ms;
    qsort(ord, (size_t)g_nkinds, sizeof ord[0], by_ms);
    fprintf(stderr, "cuda profile (eager, event-timed GPU time per op kind; total %.3f ms)\n", total);
    fprintf(stderr, "%-44s %9s %10s %9s %6s\n", "op", "calls", "total ms", "avg us", "%");
    for (int j = 0; j < g_nkinds; j++) {
        int i = ord[j];
        fprintf(stderr, "%-44s %9ld %10.3f %9.2f %6.1f\n", g_kinds[i].name, g_kinds[i].count, g_kinds[i].ms,
                g_kinds[i].count ? 1e3 * g_kinds[i].ms / g_kinds[i].count : 0.0,
                total > 0 ? 100.0 * g_kinds[i].ms / total : 0.0);
    }
    g_nkinds = 0;
}
