/*
 * bench_glm.c — the GLM-5 attention ops at GLM-5's real widths (64 heads, latent 512 + rope
 * 64, indexer 32 × 128, top-2048; reference/glm5.md §9), timed on the scalar spec ("cpu-ref")
 * and the fast CPU backend, plus the choice of glm5.md §4.2 for a prefill chunk:
 *
 *   absorbed  (what glm5.c runs): per head q̃ = W_UK[h]ᵀ qN (matmul_expert), attention over the
 *             latent records (attention_latent), per head o = W_UV[h] ō (matmul_expert);
 *   expanded  (the alternative):  K_nope|V of every key of the context from its latent in one
 *             matmul [T, 512] × [64·448, 512]ᵀ, then plain attention with head_dim 256.
 *
 * Decode rows sit at the end of a context of T keys; the chunk is the last S rows of it. Weights
 * are random bf16 (no files). Prints a table and "csv," lines. With --threads 1 the times are
 * the thread's CPU time (the numbers then hold on a busy shared machine), else wall time.
 *
 *   make bench && build/bench_glm [--threads N] [--ctx T] [--chunk S] [--reps R] [--no-ref]
 */
#include "backend/cpu/cpu.h"
#include "base/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 64, RKV = 512, DR = 64, W = RKV + DR, DN = 192, DV = 256, NI = 32, DI = 128, TOPK = 2048, BS = 64 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static float *fbuf(size_t n, float amp) {
    float *p = malloc(sizeof(float) * n);
    for (size_t i = 0; p && i < n; i++) p[i] = amp * frand();
    return p;
}
static tern_tensor bf16_weight(int d0, int d1, int d2) {
    tern_tensor t = {.dtype = TERN_DT_BF16, .ndim = d0 ? 3 : 2, .device = -1, .name = "bench"};
    size_t n = (size_t)(d0 ? d0 : 1) * d1 * d2;
    uint16_t *p = malloc(2 * n);
    for (size_t i = 0; i < n; i++) p[i] = tern_f32_to_bf16(0.05f * frand());
    int64_t sh[3] = {d0, d1, d2};
    if (d0) memcpy(t.shape, sh, sizeof sh);
    else t.shape[0] = d1, t.shape[1] = d2;
    t.data = p;
    return t;
}

/* a latent / plain paged view of one slot holding positions 0..T-1 (identity block table) */
static tern_kv_layer view(int T, int nkv, int hd, int vdim, int latent, int32_t *table) {
    int mb = (T + BS - 1) / BS;
    for (int i = 0; i < mb; i++) table[i] = i;
    size_t recs = (size_t)mb * BS;
    tern_kv_layer kv = {.dtype = TERN_DT_F32, .n_head_kv = nkv, .head_dim = hd, .block_size = BS, .block_table = table,
                        .max_blocks = mb, .latent = latent, .v_dim = vdim};
    kv.k = fbuf(recs * nkv * hd, 1.0f);
    kv.v = fbuf(recs * nkv * (latent ? vdim : hd), 1.0f);
    return kv;
}

typedef double (*bench_fn)(tern_backend *be, void *ctx);

/* --threads 1 times the thread's CPU time (robust on a shared machine), else wall time */
static int g_cpu_time;
static double now_s(void) {
    if (!g_cpu_time) return tern_time_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double best_ms(tern_backend *be, bench_fn f, void *ctx, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        f(be, ctx);
        double dt = (now_s() - t0) * 1e3;
        if (dt < best) best = dt;
    }
    return best;
}

typedef struct ctx {
    int T, S, n;              /* context, chunk, rows of this call */
    int32_t *pos, *slot, *sel;
    tern_kv_layer lat, plain;
    float *q, *qi, *wi, *out, *qn, *qt, *ol, *tb, *ta, *lat_rows, *kvx;
    tern_tensor uk, uv, wkv;
} ctx;

static tern_rows rows_of(ctx *c) { return (tern_rows){.n = c->n, .pos = c->pos, .slot = c->slot, .pos_host = c->pos, .slot_host = c->slot}; }

static double run_attn(tern_backend *be, void *p) {
    ctx *c = p;
    tern_rows r = rows_of(c);
    be->vt->glm->attention_latent(be, c->out, c->q, &r, H, &c->lat, RKV, 0.0625f, c->T > TOPK ? c->sel : NULL, TOPK);
    return 0;
}
static double run_topk(tern_backend *be, void *p) {
    ctx *c = p;
    tern_rows r = rows_of(c);
    be->vt->glm->dsa_topk(be, c->sel, c->qi, c->wi, &r, NI, &c->lat, 0.088f, TOPK, NULL);
    return 0;
}
static double run_absorbed(tern_backend *be, void *p) { /* glm5.c's attention block minus the shared parts */
    ctx *c = p;
    const tern_backend_vt *v = be->vt;
    for (int h = 0; h < H; h++) {
        v->glm->copy_2d(be, c->ta, DN, c->qn + (size_t)h * DN, H * DN, c->n, DN);
        v->matmul_expert(be, c->tb, c->ta, c->n, &c->uk, h);
        v->glm->copy_2d(be, c->q + (size_t)h * W, H * W, c->tb, RKV, c->n, RKV);
    }
    run_attn(be, c);
    for (int h = 0; h < H; h++) {
        v->glm->copy_2d(be, c->ta, RKV, c->out + (size_t)h * RKV, H * RKV, c->n, RKV);
        v->matmul_expert(be, c->tb, c->ta, c->n, &c->uv, h);
    }
    return 0;
}
static double run_expanded(tern_backend *be, void *p) { /* expand every key of the context, plain attention */
    ctx *c = p;
    const tern_backend_vt *v = be->vt;
    v->matmul(be, c->kvx, c->lat_rows, c->T, &c->wkv); /* [T, H·(DN+DV)] */
    size_t rec = (size_t)H * 256;
    for (int b = 0; b < c->T; b++) /* K = [nope | rope], V: into the plain view (identity table) */
        for (int h = 0; h < H; h++) {
            const float *src = c->kvx + ((size_t)b * H + h) * (DN + DV);
            memcpy((float *)c->plain.k + b * rec + h * 256, src, DN * sizeof(float));
            memcpy((float *)c->plain.k + b * rec + h * 256 + DN, c->lat_rows + (size_t)b * W + RKV, DR * sizeof(float));
            memcpy((float *)c->plain.v + b * rec + h * 256, src + DN, DV * sizeof(float));
        }
    tern_rows r = rows_of(c);
    v->attention(be, c->ta, c->q, &r, H, &c->plain, 0.0625f, 0.0f);
    return 0;
}

int main(int argc, char **argv) {
    int nth = 0, T = 4096, S = 512, reps = 3, ref = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) S = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-ref")) ref = 0;
        else { fprintf(stderr, "usage: bench_glm [--threads N] [--ctx T] [--chunk S] [--reps R] [--no-ref]\n"); return 2; }
    }
    if (T < 1 || S < 1 || S > T) { fprintf(stderr, "bench_glm: need 1 <= chunk <= ctx\n"); return 2; }
    g_cpu_time = nth == 1;
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = nth};
    tern_backend *fast = NULL, *rb = NULL;
    if (tern_backend_cpu_open(&fast, &o, &e) || tern_backend_cpu_ref_open(&rb, &o, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    ctx c = {.T = T, .S = S};
    int32_t *t1 = malloc(sizeof(int32_t) * (T / BS + 2)), *t2 = malloc(sizeof(int32_t) * (T / BS + 2));
    c.lat = view(T, 1, W, DI, 1, t1);
    c.pos = malloc(sizeof(int32_t) * S);
    c.slot = calloc((size_t)S, sizeof(int32_t));
    c.sel = malloc(sizeof(int32_t) * (size_t)S * TOPK);
    for (int i = 0; i < S; i++) c.pos[i] = T - S + i;
    c.q = fbuf((size_t)S * H * W, 0.3f);
    c.qi = fbuf((size_t)S * NI * DI, 1.0f);
    c.wi = fbuf((size_t)S * NI, 1.0f);
    c.out = fbuf((size_t)S * H * RKV, 0.0f);
    c.qn = fbuf((size_t)S * H * DN, 1.0f);
    c.ta = fbuf((size_t)S * H * RKV, 0.0f);
    c.tb = fbuf((size_t)S * RKV, 0.0f);
    printf("GLM-5 widths: %d heads, latent %d + rope %d, indexer %d x %d, top-%d; ctx %d, chunk %d; isa %s, %d threads"
           " (%s time)\n", H, RKV, DR, NI, DI, TOPK, T, S, tern_cpu_isa_name(), nth ? nth : tern_cpu_count(),
           g_cpu_time ? "CPU" : "wall");
    printf("%-34s %12s %12s %8s\n", "op", "ref ms", "fast ms", "speedup");
    const char *names[4] = {"dsa_topk (decode row)", "attention_latent (decode row)", "dsa_topk (chunk)", "attention_latent (chunk)"};
    bench_fn fns[4] = {run_topk, run_attn, run_topk, run_attn};
    for (int i = 0; i < 4; i++) {
        c.n = i < 2 ? 1 : S;
        if (i < 2) c.pos[0] = T - 1;
        else c.pos[0] = T - S;
        if (T > TOPK) run_topk(fast, &c); /* a real selection for the attention */
        double rm = ref && (i < 2 || (double)S * T < 3e6) ? best_ms(rb, fns[i], &c, i < 2 ? reps : 1) : 0;
        double fm = best_ms(fast, fns[i], &c, reps);
        printf("%-34s %12.3f %12.3f %8.1f\n", names[i], rm, fm, rm > 0 ? rm / fm : 0);
        printf("csv,%s,%d,%d,%.4f,%.4f\n", names[i], T, c.n, rm, fm);
    }
    /* §4.2: absorbed vs expanded for the chunk (fast backend) */
    c.n = S;
    c.pos[0] = T - S;
    c.uk = bf16_weight(H, RKV, DN);
    c.uv = bf16_weight(H, DV, RKV);
    c.wkv = bf16_weight(0, H * (DN + DV), RKV);
    c.lat_rows = fbuf((size_t)T * W, 1.0f);
    c.kvx = fbuf((size_t)T * H * (DN + DV), 0.0f);
    c.plain = view(T, H, 256, 0, 0, t2);
    if (T > TOPK) run_topk(fast, &c);
    double ab = best_ms(fast, run_absorbed, &c, reps), ex = T <= TOPK ? best_ms(fast, run_expanded, &c, reps) : 0;
    printf("chunk of %d at ctx %d: absorbed %.1f ms, expanded %s%.1f ms\n", S, T, ab, T <= TOPK ? "" : "(n/a: DSA) ", ex);
    printf("csv,chunk,%d,%d,%.3f,%.3f\n", T, S, ab, ex);
    tern_backend_close(fast);
    tern_backend_close(rb);
    return 0;
}
