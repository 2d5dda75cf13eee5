/*
 * glm_fast.c — the fast CPU backend's GLM-5 op table (cpu_glm.h tern__cpu_glm_fast_ops):
 * per-backend scratch, the portable inner-product kernels, and the light ops.
 *
 * The light ops (copy_2d, layernorm, rope_interleaved, kv_write_latent, route_group) run
 * the spec's row functions (cpu_glm.c), so they are bit-identical to "cpu-ref"; only the
 * split changes: on the calling thread for decode-sized inputs, rows over the pool from
 * cpu_impl.par_min elements (prefill). Attention and the DSA indexer live in glm_attn.c; matmul_heads
 * (every head's matmul_expert in one pool run, bitwise the per-head loop) in cpu_matmul.c.
 *
 * Scratch (tern_glm_state, in cpu_impl.glm) is made on the first GLM op and grown only when
 * a larger shape appears: the indexer's candidate buffers are sized for a whole slot of the
 * view (max_blocks × block_size keys per thread), so a growing context never reallocates;
 * per-row diagnostics and router scratch grow with the batch size / expert count, which are
 * fixed for a model. On allocation failure an op writes NaN / -1 outputs (visible), as the
 * spec does. TERN_CPU_GLM=ref in the environment makes the table call the spec's ops instead
 * (before/after benchmarks in one binary).
 */
#include "backend/cpu/glm_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- portable kernels: each pair / element summed left to right ---- */

static void dots_scalar(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) {
            float s = 0.0f;
            for (int t = 0; t < len; t++) s += a[i][t] * b[j][t];
            out[i * ldo + j] = s;
        }
}

static void pv_scalar(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n, const float *corr) {
    for (int i = 0; i < no; i++)
        for (int t = 0; t < n; t++) {
            float s = corr ? o[i][t] * corr[i] : o[i][t];
            for (int c = 0; c < nv; c++) s += p[i * ldp + c] * v[c][t];
            o[i][t] = s;
        }
}

/* 16-bit keys / values widened exactly, then the same sums as dots_scalar / pv_scalar */
static inline float half_f32(uint16_t h, int bf) { return bf ? tern_bf16_to_f32(h) : tern_f16_to_f32(h); }

static void dots_h_scalar(const float *const *a, int na, const uint16_t *const *b, int nb, int len, float *out, int ldo, int bf) {
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) {
            float s = 0.0f;
            for (int t = 0; t < len; t++) s += a[i][t] * half_f32(b[j][t], bf);
            out[i * ldo + j] = s;
        }
}

static void pv_h_scalar(float *const *o, int no, const float *p, int ldp, const uint16_t *const *v, int nv, int n,
                        const float *corr, int bf) {
    for (int i = 0; i < no; i++)
        for (int t = 0; t < n; t++) {
            float s = corr ? o[i][t] * corr[i] : o[i][t];
            for (int c = 0; c < nv; c++) s += p[i * ldp + c] * half_f32(v[c][t], bf);
            o[i][t] = s;
        }
}

void tern__glm_tile_max_scalar(float *s, int lds, int nq, int nk, float scale, float cap, const uint32_t *vis, float *mx) {
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * lds, m = -INFINITY;
        for (int c = 0; c < nk; c++) {
            if (!(vis[i] >> c & 1)) { si[c] = -INFINITY; continue; }
            float v = si[c] * scale;
            if (cap > 0.0f) v = cap * tanhf(v / cap);
            si[c] = v;
            if (v > m) m = v;
        }
        mx[i] = m;
    }
}

void tern__glm_tile_exp_scalar(float *s, int lds, int nq, int nk, const float *m, float *l) {
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * lds;
        for (int c = 0; c < nk; c++) {
            si[c] = si[c] == -INFINITY ? 0.0f : expf(si[c] - m[i]);
            l[i] += si[c];
        }
    }
}

const tern_glm_kern tern__glm_kern_scalar = {"scalar", dots_scalar, pv_scalar, tern__glm_tile_max_scalar,
                                             tern__glm_tile_exp_scalar, dots_h_scalar, pv_h_scalar};

/* ---- scratch ---- */

void tern__cpu_glm_free(void *state) {
    tern_glm_state *g = state;
    if (!g) return;
    tern_afree(g->sc);
    tern_afree(g->cpos);
    tern_afree(g->key);
    free(g->gap);
    free(g->rblk);
    tern_afree(g->rsg);
    free(g->rkeep);
    free(g);
}

tern_glm_state *tern__glm_state(tern_backend *be) {
    cpu_impl *c = be->impl;
    if (c->glm) return c->glm;
    tern_glm_state *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->nth = c->nth;
    g->pool = c->pool;
    g->par_min = c->par_min;
    const char *sp = getenv("TERN_CPU_GLM");
    g->spec = sp && !strcmp(sp, "ref");
    const char *isa = c->k->name;
    g->gk = !strcmp(isa, "avx512") ? &tern__glm_kern_avx512
            : !strcmp(isa, "avx2") ? &tern__glm_kern_avx2
                                   : &tern__glm_kern_scalar;
    c->glm = g;
    return g;
}

int tern__glm_reserve_keys(tern_glm_state *g, size_t cap) {
    if (cap <= g->cap) return 1;
    tern_afree(g->sc);
    tern_afree(g->cpos);
    tern_afree(g->key);
    size_t n = cap * (size_t)g->nth;
    g->sc = tern_aalloc(n * sizeof *g->sc);
    g->cpos = tern_aalloc(n * sizeof *g->cpos);
    g->key = tern_aalloc(n * sizeof *g->key);
    g->cap = g->sc && g->cpos && g->key ? cap : 0;
    return g->cap != 0;
}

int tern__glm_reserve_rows(tern_glm_state *g, int n) {
    if (n <= g->gap_cap) return 1;
    float *p = realloc(g->gap, sizeof(float) * (size_t)n);
    if (!p) return 0;
    g->gap = p;
    g->gap_cap = n;
    return 1;
}

int tern__glm_reserve_blocks(tern_glm_state *g, int n) {
    if (n + 1 <= g->rblk_cap) return 1;
    int *p = realloc(g->rblk, sizeof(int) * (size_t)(n + 1));
    if (!p) return 0;
    g->rblk = p;
    g->rblk_cap = n + 1;
    return 1;
}

static int reserve_route(tern_glm_state *g, int E, int G) {
    if (E <= g->route_e && G <= g->route_g) return 1;
    tern_afree(g->rsg);
    free(g->rkeep);
    g->route_e = TERN_MAX(E, g->route_e);
    g->route_g = TERN_MAX(G, g->route_g);
    g->rsg = tern_aalloc(sizeof(float) * 2 * (size_t)g->route_e * (size_t)g->nth);
    g->rkeep = malloc(((size_t)g->route_e + (size_t)g->route_g) * (size_t)g->nth);
    if (!g->rsg || !g->rkeep) {
        tern_afree(g->rsg);
        free(g->rkeep);
        g->rsg = NULL;
        g->rkeep = NULL;
        g->route_e = g->route_g = 0;
        return 0;
    }
    return 1;
}

/* TERN_CPU_GLM=ref (read once, at the first GLM op): run the spec's table instead (benchmarks) */
#define SPEC(be) (tern__glm_state(be) && tern__glm_state(be)->spec)

/* ---- light ops: one row function (the spec's), rows split over the pool when large ---- */

enum { OP_COPY, OP_LN, OP_ROPE, OP_KVW, OP_ROUTE };

typedef struct row_ctx {
    int op, n;
    tern_glm_state *g;
    /* copy_2d */
    float *dst;
    const float *src;
    int ldd, lds, w;
    /* layernorm */
    float *y;
    const float *x, *lw, *lb;
    int d;
    float eps;
    /* rope */
    int nh, hs, off;
    const int32_t *pos;
    const float *inv;
    float ms;
    /* kv write */
    const tern_kv_layer *kv;
    const tern_rows *rows;
    const float *k, *v;
    /* route */
    int32_t *idx;
    float *wts;
    int E, kk;
    const tern_route_group *rg;
} row_ctx;

static void row_task(void *arg, int ith, int nth) {
    row_ctx *a = arg;
    int64_t lo, hi;
    tern__cpu_split(a->n, 1, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        switch (a->op) {
        case OP_COPY: memcpy(a->dst + (size_t)r * a->ldd, a->src + (size_t)r * a->lds, sizeof(float) * (size_t)a->w); break;
        case OP_LN: tern__glm_layernorm_row(a->y + (size_t)r * a->d, a->x + (size_t)r * a->d, a->d, a->lw, a->lb, a->eps); break;
        case OP_ROPE:
            tern__glm_rope_row(a->y + (size_t)r * a->nh * a->hs, 0, a->nh, a->hs, a->off, a->d, a->pos[r], a->inv, a->ms);
            break;
        case OP_KVW:
            tern__glm_kv_write_row(a->kv, a->rows->slot[r], a->rows->pos[r], a->k + (size_t)r * a->kv->head_dim,
                                   a->v ? a->v + (size_t)r * a->kv->v_dim : NULL);
            break;
        case OP_ROUTE: {
            tern_glm_state *g = a->g;
            tern__glm_route_row(a->idx + (size_t)r * a->kk, a->wts + (size_t)r * a->kk, a->x + (size_t)r * a->E, a->E,
                                a->kk, a->rg, g->rsg + (size_t)ith * 2 * g->route_e,
                                g->rkeep + (size_t)ith * ((size_t)g->route_e + (size_t)g->route_g));
            break;
        }
        default: break;
        }
    }
}

/* work = floats touched; rows go over the pool only when there are several and enough work */
static void run_rows(tern_glm_state *g, row_ctx *a, size_t work) {
    if (g && g->nth > 1 && a->n >= 2 && work >= g->par_min) tern_pool_run(g->pool, row_task, a);
    else row_task(a, 0, 1);
}

static void copy_2d(tern_backend *be, float *dst, int ldd, const float *src, int lds, int n, int w) {
    if (SPEC(be)) { tern__cpu_glm_ops.copy_2d(be, dst, ldd, src, lds, n, w); return; }
    row_ctx a = {.op = OP_COPY, .n = n, .dst = dst, .ldd = ldd, .src = src, .lds = lds, .w = w};
    /* rows may overlap only in place-like copies: those stay serial, in row order */
    int disjoint = n < 1 || dst + (size_t)(n - 1) * ldd + w <= src || src + (size_t)(n - 1) * lds + w <= dst;
    run_rows(disjoint ? tern__glm_state(be) : NULL, &a, (size_t)n * w);
}

static void layernorm(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, const float *b,
                      float eps) {
    if (SPEC(be)) { tern__cpu_glm_ops.layernorm(be, y, x, rows, d, w, b, eps); return; }
    row_ctx a = {.op = OP_LN, .n = rows, .y = y, .x = x, .d = d, .lw = w, .lb = b, .eps = eps};
    run_rows(tern__glm_state(be), &a, (size_t)rows * d * 4);
}

static void rope_interleaved(tern_backend *be, float *x, int n, int nh, int hs, int off, int d, const int32_t *pos,
                             const float *inv_freq, float mscale) {
    if (SPEC(be)) { tern__cpu_glm_ops.rope_interleaved(be, x, n, nh, hs, off, d, pos, inv_freq, mscale); return; }
    row_ctx a = {.op = OP_ROPE, .n = n, .y = x, .nh = nh, .hs = hs, .off = off, .d = d, .pos = pos, .inv = inv_freq,
                 .ms = mscale};
    run_rows(tern__glm_state(be), &a, (size_t)n * nh * d * 4);
}

static void kv_write_latent(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                            const float *v) {
    if (SPEC(be)) { tern__cpu_glm_ops.kv_write_latent(be, kv, rows, k, v); return; }
    row_ctx a = {.op = OP_KVW, .n = rows->n, .kv = kv, .rows = rows, .k = k, .v = v};
    run_rows(tern__glm_state(be), &a, (size_t)rows->n * (kv->head_dim + kv->v_dim));
}

static void route_group(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                        const tern_route_group *p) {
    if (SPEC(be)) { tern__cpu_glm_ops.route_group(be, idx, wts, logits, n, E, k, p); return; }
    tern_glm_state *g = tern__glm_state(be);
    int G = p->n_group > 0 ? p->n_group : 1;
    if (!g || !reserve_route(g, E, G)) {
        for (size_t j = 0; j < (size_t)n * k; j++) { idx[j] = 0; wts[j] = NAN; }
        return;
    }
    row_ctx a = {.op = OP_ROUTE, .n = n, .g = g, .idx = idx, .wts = wts, .x = logits, .E = E, .kk = k, .rg = p};
    run_rows(g, &a, (size_t)n * E * 16); /* sigmoid + k scans per expert */
}

const tern_glm_ops tern__cpu_glm_fast_ops = {
    .copy_2d = copy_2d,
    .layernorm = layernorm,
    .rope_interleaved = rope_interleaved,
    .kv_write_latent = kv_write_latent,
    .dsa_topk = tern__glm_dsa_topk,
    .attention_latent = tern__glm_attention_latent,
    .route_group = route_group,
    .matmul_heads = tern__cpu_matmul_heads,
};
