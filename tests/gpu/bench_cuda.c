/*
 * bench_cuda.c — CUDA backend benchmarks for the GPU machine (built by `make gpu-test`, run by
 * scripts/gpu_check.sh). Not a test: prints a table and CSV lines ("csv,<name>,<us>,<GB/s>").
 *
 * Floors: a decode GEMV must read every weight byte once, so time >= weight bytes / bandwidth;
 * we report achieved GB/s = (packed weight + scales/biases bytes) / time. The bandwidth
 * ceiling is measured in the same run with our own streaming `add` kernel (reads 8, writes 4
 * bytes per element over 3 x 512 MiB). Weights rotate over enough copies (>= 1 GiB) that L2
 * (60 MB) cannot serve them. Attention decode: bytes = K + V of the context read once.
 * Timing: warm-up, then many asynchronous launches between two sync()s on the host clock.
 * `bench_cuda --qmma`: the MLX Q matmul of qmma.cu vs the older kernels (n = 1..64), then stop.
 * `bench_cuda --ltsweep [n ...]`: every cuBLASLt heuristic answer for llama3-8b's batch-decode GEMMs (BENCH_LT_SET=g12:
 * gemma4-12b's, e4b / g31 / a4b: gemma4-e4b's, gemma4-31b's, gemma4-26b-a4b's dense parts), then stop.
 * `bench_cuda --ltsearch [n ...]`: every cuBLASLt configuration for those GEMMs at n rows, timed, with TERN_LT_PIN entries.
 * `bench_cuda --wgemm [n ...]`: wgemm.cu against cuBLASLt for those GEMMs (µs as graphs, output difference).
 * `bench_cuda --moe`: moe_mlp at the gemma4-26b-a4b shapes, moe_mma.cu vs the GEMV pairs, then stop.
 * `bench_cuda --gemm 4096x2816p 2048x2816p ...`: BF16 prefill GEMMs of 2048 rows in the bf16 mode (p: the weight
 * flagged precise, as Gemma 4's q / k), µs and TFLOP/s each, then stop.
 */
#include "backend/cpu/cpu.h"
#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tern_backend *g;
typedef struct tern__cuda tern__cuda;
static unsigned long long seed = 7;

static float frand(void) {
    seed ^= seed >> 12; seed ^= seed << 25; seed ^= seed >> 27;
    return (float)((seed * 2685821657736338717ULL) >> 40) / 8388608.0f - 1.0f;
}

static void *dev_random(size_t bytes) {
    uint8_t *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i += 4) {
        float f = frand() * 0.05f;
        memcpy(h + i, &f, bytes - i < 4 ? bytes - i : 4);
    }
    void *d = g->vt->alloc(g, bytes);
    if (d) g->vt->upload(g, d, h, bytes);
    free(h);
    return d;
}

static double ceiling_gbs;
extern int tern__cuda_gemv_q1_variant; /* gemv.cu: kernel choice for Q weights at n = 1 */
extern int tern__cuda_gemv1_on;        /* gemv.cu: 0 = the older n = 1 kernels for every format */
extern int tern__cuda_gemv_mma_on;     /* gemv_mma.cu: 0 off, 1 Q4, 2 Q4 and Q8 at n = 1 */
static int g_only_var = -1;            /* >= 0: time only this Q n = 1 variant */

static void row(const char *name, double sec, double bytes) {
    double gbs = bytes / sec / 1e9;
    printf("%-44s %10.1f us %9.1f GB/s %6.1f%% of stream-add, %5.1f%% of 4.8 TB/s\n", name, sec * 1e6, gbs,
           ceiling_gbs > 0 ? 100.0 * gbs / ceiling_gbs : 0.0, 100.0 * gbs / 4800.0);
    printf("csv,%s,%.2f,%.1f\n", name, sec * 1e6, gbs);
    fflush(stdout);
}

static void bench_stream(void) {
    size_t n = (512u << 20) / 4;
    float *a = dev_random(n * 4), *b = dev_random(n * 4), *y = g->vt->alloc(g, n * 4);
    if (!a || !b || !y) return;
    for (int i = 0; i < 3; i++) g->vt->add(g, y, a, b, n);
    g->vt->sync(g);
    int reps = 20;
    double t0 = tern_time_s();
    for (int i = 0; i < reps; i++) g->vt->add(g, y, a, b, n);
    g->vt->sync(g);
    double sec = (tern_time_s() - t0) / reps;
    ceiling_gbs = 12.0 * n / sec / 1e9;
    row("stream add 512 MiB x3 (ceiling)", sec, 12.0 * n);
    g->vt->free(g, a); g->vt->free(g, b); g->vt->free(g, y);
}

/* The header of a bench weight [out, in] (host data to be set by the caller; Q: bf16 scales). */
static void bench_tensor(tern_tensor *t, tern_dtype dt, int bits, int gs, int out, int in) {
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->bits = bits;
    t->group_size = gs;
    t->sdtype = TERN_DT_BF16;
    t->device = -1;
    t->name = "bench";
}

/* wb bytes of random codes; BF16 weights: random values in [-0.05, 0.05] instead. */
static void fill_weight(uint8_t *hd, size_t wb, tern_dtype dt) {
    for (size_t i = 0; i < wb; i++) hd[i] = (uint8_t)(frand() * 127 + 128);
    if (dt == TERN_DT_BF16)
        for (size_t i = 0; i < wb / 2; i++) ((uint16_t *)hd)[i] = tern_f32_to_bf16(frand() * 0.05f);
}

/* w[0..copies) = t sharing the host codes hd, scales hs (0.01) and biases hb (-0.05; sb bytes
 * each), uploaded; returns how many made it (say: print the first failure). */
static int upload_copies(tern_tensor *w, int copies, const tern_tensor *t, uint8_t *hd, uint16_t *hs, uint16_t *hb,
                         size_t sb, int say) {
    for (size_t i = 0; i < sb / 2; i++) { hs[i] = tern_f32_to_bf16(0.01f); hb[i] = tern_f32_to_bf16(-0.05f); }
    tern_error err = {0};
    for (int c = 0; c < copies; c++) {
        w[c] = *t;
        w[c].data = hd;
        w[c].scales = hs;
        w[c].biases = hb;
        if (g->vt->upload_weight(g, &w[c], &err) != TERN_OK) {
            if (say) printf("upload: %s\n", err.msg);
            return c;
        }
    }
    return copies;
}

/* A second CUDA backend in compute mode `mode`; NULL when it cannot be opened. */
static tern_backend *open_mode(tern_compute mode) {
    tern_backend *b = NULL;
    tern_backend_opts o = {0};
    o.compute = mode;
    tern_error err = {0};
    return tern_backend_cuda_open(&b, &o, &err) == TERN_OK ? b : NULL;
}

/* one weight format and shape, timed at each row count of ns[] (0-terminated) */
static void bench_gemv(tern_dtype dt, int bits, int gs, int out, int in, const int *ns) {
    int n = 0;
    for (int i = 0; ns[i]; i++) n = ns[i] > n ? ns[i] : n;
    tern_tensor t;
    bench_tensor(&t, dt, bits, gs, out, in);
    size_t rb = tern_tensor_row_bytes(&t), wb = (size_t)out * rb;
    size_t sb = dt == TERN_DT_Q ? (size_t)out * (in / gs) * 2 : 0, bytes = wb + 2 * sb;
    int copies = (int)((1ull << 30) / bytes + 1);
    if (copies > 64) copies = 64;
    tern_tensor *w = calloc(copies, sizeof *w);
    uint8_t *hd = malloc(wb);
    uint16_t *hs = malloc(sb ? sb : 2), *hb = malloc(sb ? sb : 2);
    fill_weight(hd, wb, dt);
    copies = upload_copies(w, copies, &t, hd, hs, hb, sb, 1);
    free(hd); free(hs); free(hb);
    float *x = dev_random((size_t)n * in * 4), *y = g->vt->alloc(g, (size_t)n * out * 4);
    const int keep_variant = tern__cuda_gemv_q1_variant;
    const int v0 = g_only_var >= 0 ? g_only_var : 0, v1 = g_only_var >= 0 ? g_only_var : 5;
    for (int k = 0, var = v0; copies > 0 && x && y && ns[k]; k += !(dt == TERN_DT_Q && ns[k] == 1 && var < v1 && ++var)) {
        n = ns[k];
        if (dt == TERN_DT_Q && n == 1) tern__cuda_gemv_q1_variant = var;
        for (int i = 0; i < copies; i++) g->vt->matmul(g, y, x, n, &w[i]);
        g->vt->sync(g);
        int reps = copies * (bytes < (64u << 20) ? 8 : 3);
        double t0 = tern_time_s();
        for (int i = 0; i < reps; i++) g->vt->matmul(g, y, x, n, &w[i % copies]);
        g->vt->sync(g);
        double sec = (tern_time_s() - t0) / reps;
        char name[96];
        if (dt == TERN_DT_Q && n == 1)
            snprintf(name, sizeof name, "gemv q%d/g%d %dx%d n=1 v%d", bits, gs, out, in, tern__cuda_gemv_q1_variant);
        else if (dt == TERN_DT_Q) snprintf(name, sizeof name, "gemv q%d/g%d %dx%d n=%d", bits, gs, out, in, n);
        else snprintf(name, sizeof name, "gemv %s %dx%d n=%d", tern_dtype_name(dt), out, in, n);
        row(name, sec, (double)bytes);
    }
    tern__cuda_gemv_q1_variant = keep_variant;
    for (int c = 0; c < copies; c++) g->vt->free_weight(g, &w[c]);
    free(w);
    g->vt->free(g, x); g->vt->free(g, y);
}

/* decode attention over f32 pages (kind TERN_KV_F32) or BF16 pages (kind TERN_KV_BF16, random bits) */
static void bench_attn_decode(int nh, int nkv, int d, int ctx, int nseq, int kind, const char *tag) {
    int bs = 16, mb = (ctx + bs - 1) / bs;
    size_t tok = (size_t)nkv * d, pool = (size_t)nseq * mb * bs * tok;
    float *k = dev_random(pool * 4), *v = dev_random(pool * 4);
    int32_t *bt = malloc((size_t)nseq * mb * 4), *pos = malloc(nseq * 4), *slot = malloc(nseq * 4);
    for (int i = 0; i < nseq * mb; i++) bt[i] = i;
    for (int s = 0; s < nseq; s++) { pos[s] = ctx - 1; slot[s] = s; }
    void *btd = g->vt->alloc(g, (size_t)nseq * mb * 4), *pd = g->vt->alloc(g, nseq * 4), *sd = g->vt->alloc(g, nseq * 4);
    g->vt->upload(g, btd, bt, (size_t)nseq * mb * 4);
    g->vt->upload(g, pd, pos, nseq * 4);
    g->vt->upload(g, sd, slot, nseq * 4);
    float *q = dev_random((size_t)nseq * nh * d * 4), *o = g->vt->alloc(g, (size_t)nseq * nh * d * 4);
    if (k && v && q && o) {
        tern_kv_layer kv = {kind == TERN_KV_BF16 ? TERN_DT_BF16 : TERN_DT_F32, nkv, d, bs, 0, k, v, btd, mb};
        kv.kf.kind = kv.vf.kind = kind;
        tern_rows rows = {nseq, pd, sd, pos, slot};
        for (int i = 0; i < 50; i++) g->vt->attention(g, o, q, &rows, nh, &kv, 0.1f, 0.0f); /* clocks up */
        g->vt->sync(g);
        int reps = 50;
        double t0 = tern_time_s();
        for (int i = 0; i < reps; i++) g->vt->attention(g, o, q, &rows, nh, &kv, 0.1f, 0.0f);
        g->vt->sync(g);
        char name[96];
        snprintf(name, sizeof name, "attn decode nh%d kv%d d%d ctx%d x%d %s", nh, nkv, d, ctx, nseq, tag);
        row(name, (tern_time_s() - t0) / reps, 2.0 * pool * (kind == TERN_KV_BF16 ? 2 : 4));
    }
    g->vt->free(g, k); g->vt->free(g, v); g->vt->free(g, btd); g->vt->free(g, pd); g->vt->free(g, sd);
    g->vt->free(g, q); g->vt->free(g, o);
    free(bt); free(pos); free(slot);
}

/* causal prefill of n tokens in one slot: FLOPs = 4 * nh * d * n(n+1)/2; `tag` names the kernel */
static const char *attn_tag = "";
static int attn_bf16_pages; /* 1: BF16 pages (random bytes of bf16 size; the values do not matter for timing) */
static void bench_attn_prefill(int nh, int nkv, int d, int n) {
    int bs = 16, mb = (n + bs - 1) / bs;
    size_t tok = (size_t)nkv * d, pool = (size_t)mb * bs * tok;
    float *k = dev_random(pool * (attn_bf16_pages ? 2 : 4)), *v = dev_random(pool * (attn_bf16_pages ? 2 : 4));
    int32_t *bt = malloc((size_t)mb * 4), *pos = malloc(n * 4), *slot = malloc(n * 4);
    for (int i = 0; i < mb; i++) bt[i] = i;
    for (int r = 0; r < n; r++) { pos[r] = r; slot[r] = 0; }
    void *btd = g->vt->alloc(g, (size_t)mb * 4), *pd = g->vt->alloc(g, n * 4), *sd = g->vt->alloc(g, n * 4);
    g->vt->upload(g, btd, bt, (size_t)mb * 4);
    g->vt->upload(g, pd, pos, n * 4);
    g->vt->upload(g, sd, slot, n * 4);
    float *q = dev_random((size_t)n * nh * d * 4), *o = g->vt->alloc(g, (size_t)n * nh * d * 4);
    if (k && v && q && o) {
        tern_kv_layer kv = {attn_bf16_pages ? TERN_DT_Q : TERN_DT_F32, nkv, d, bs, 0, k, v, btd, mb};
        if (attn_bf16_pages) kv.kf.kind = kv.vf.kind = TERN_KV_BF16;
        tern_rows rows = {n, pd, sd, pos, slot};
        g->vt->attention(g, o, q, &rows, nh, &kv, 0.1f, 0.0f);
        g->vt->sync(g);
        int reps = 3;
        double t0 = tern_time_s();
        for (int i = 0; i < reps; i++) g->vt->attention(g, o, q, &rows, nh, &kv, 0.1f, 0.0f);
        g->vt->sync(g);
        double sec = (tern_time_s() - t0) / reps, fl = 4.0 * nh * d * (double)n * (n + 1) / 2;
        char name[96];
        snprintf(name, sizeof name, "attn prefill nh%d kv%d d%d n%d%s", nh, nkv, d, n, attn_tag);
        printf("%-52s %10.1f us %9.1f TFLOP/s\n", name, sec * 1e6, fl / sec / 1e12);
        printf("csv,%s,%.2f,%.2f\n", name, sec * 1e6, fl / sec / 1e12);
    }
    g->vt->free(g, k); g->vt->free(g, v); g->vt->free(g, btd); g->vt->free(g, pd); g->vt->free(g, sd);
    g->vt->free(g, q); g->vt->free(g, o);
    free(bt); free(pos); free(slot);
}

/* The prefill attention kernels on one shape: attention.cu's CUDA-core kernel (f32 mode, flash
 * off), the flash kernel in bf16 mode (tile shapes 0..cfgs-1, attn_prefill.cu) and with the
 * split operands in f32 mode (tern__cuda_fa_f32). Back to the defaults after. */
extern int tern__cuda_fa_on, tern__cuda_fa_f32, tern__cuda_fa_cfg;
static void bench_attn_prefill_all(int nh, int nkv, int d, int n, int cfgs) {
    const int on = tern__cuda_fa_on, f32 = tern__cuda_fa_f32, cfg = tern__cuda_fa_cfg;
    tern__cuda_fa_on = 0;
    attn_tag = " cores-f32";
    bench_attn_prefill(nh, nkv, d, n);
    tern__cuda_fa_on = 1;
    tern__cuda_fa_f32 = 1;
    attn_tag = " fa-f32split";
    bench_attn_prefill(nh, nkv, d, n);
    tern__cuda_fa_f32 = f32;
    tern_backend *keep = g;
    if ((g = open_mode(TERN_COMPUTE_BF16))) {
        char tag[48];
        for (int pg = 0; pg < 2; pg++) /* F32 pages, then BF16 pages */
            for (int c = 0; c < cfgs && c < 4; c++) {
                tern__cuda_fa_cfg = c;
                attn_bf16_pages = pg;
                const int k = snprintf(tag, sizeof tag, " fa-bf16%s", pg ? " pages-bf16" : "");
                if (c) snprintf(tag + k, sizeof tag - (size_t)k, " cfg%d", c);
                attn_tag = tag;
                bench_attn_prefill(nh, nkv, d, n);
            }
        attn_bf16_pages = 0;
        tern_backend_close(g);
    }
    g = keep;
    tern__cuda_fa_on = on;
    tern__cuda_fa_cfg = cfg;
    attn_tag = "";
}

/* one GEMM of n rows through vt->matmul (prefill): µs and TFLOP/s; precise: the weight flagged precise (Gemma 4's
 * q / k, routers: in the bf16 mode x goes as a bf16 pair, two GEMMs) */
static void bench_prefill_p(tern_dtype dt, int bits, int out, int in, int n, tern_compute mode, int precise) {
    tern_backend *keep = g, *b = open_mode(mode);
    if (!b) return;
    g = b;
    tern_error err = {0};
    tern_tensor t;
    bench_tensor(&t, dt, bits, 64, out, in);
    t.precise = precise;
    size_t wb = (size_t)out * tern_tensor_row_bytes(&t), sb = dt == TERN_DT_Q ? (size_t)out * (in / 64) * 2 : 0;
    uint8_t *hd = calloc(1, wb);
    uint16_t *hs = calloc(1, sb + 2);
    fill_weight(hd, wb, dt);
    for (size_t i = 0; i < sb / 2; i++) hs[i] = tern_f32_to_bf16(0.01f * (1.0f + frand()));
    t.data = hd; t.scales = hs; t.biases = hs;
    float *x = dev_random((size_t)n * in * 4), *y = g->vt->alloc(g, (size_t)n * out * 4);
    if (g->vt->upload_weight(g, &t, &err) == TERN_OK && x && y) {
        g->vt->matmul(g, y, x, n, &t);
        g->vt->sync(g);
        int reps = 5;
        double t0 = tern_time_s();
        for (int i = 0; i < reps; i++) g->vt->matmul(g, y, x, n, &t);
        g->vt->sync(g);
        double sec = (tern_time_s() - t0) / reps;
        char name[96];
        snprintf(name, sizeof name, "gemm %s%s %dx%d n=%d %s%s", dt == TERN_DT_Q ? "q" : tern_dtype_name(dt),
                 dt == TERN_DT_Q ? (bits == 4 ? "4" : "8") : "", out, in, n, mode == TERN_COMPUTE_F32 ? "f32" : "bf16",
                 precise ? " precise" : "");
        printf("%-44s %10.1f us %9.1f TFLOP/s\n", name, sec * 1e6, 2.0 * n * out * in / sec / 1e12);
        printf("csv,%s,%.2f,%.2f\n", name, sec * 1e6, 2.0 * n * out * in / sec / 1e12);
        g->vt->free_weight(g, &t);
    }
    g->vt->free(g, x); g->vt->free(g, y);
    free(hd); free(hs);
    tern_backend_close(b);
    g = keep;
}
static void bench_prefill(tern_dtype dt, int bits, int out, int in, int n, tern_compute mode) {
    bench_prefill_p(dt, bits, out, in, n, mode, 0);
}

/* The fused decode ops at llama3-8b's shapes for a few rows (batch decode), plain bf16 mode: sgemm.cu
 * (up to 64 rows) vs cuBLASLt (TERN_CUDA_SGEMM=0's path; also at 128 rows). Each op's weights exist in
 * enough copies to leave the L2 cold (>= 400 MB per op); floor = weight bytes / the stream ceiling
 * measured first. */
extern int tern__cuda_sgemm_on, tern__cuda_sgemm_split;

static void bench_sgemm(void) {
    tern_backend *keep = g, *b = open_mode(TERN_COMPUTE_BF16);
    if (!b) return;
    g = b;
    enum { QKV, GLU, O, DOWN, HEAD, NOPS };
    static const char *names[NOPS] = {"q|k|v 4096+1024+1024 x4096", "gate|up 2x14336x4096", "o (add) 4096x4096",
                                      "down (add) 4096x14336", "head 128256x4096"};
    static const int shp[NOPS][3][2] = {{{4096, 4096}, {1024, 4096}, {1024, 4096}}, {{14336, 4096}, {14336, 4096}},
                                        {{4096, 4096}}, {{4096, 14336}}, {{128256, 4096}}};
    static const int nw[NOPS] = {3, 2, 1, 1, 1}, ns[] = {9, 16, 32, 48, 64, 128};
    const int nmax = 128;
    if (getenv("BENCH_SG_SPLIT")) tern__cuda_sgemm_split = atoi(getenv("BENCH_SG_SPLIT")); /* force S */
    float *x = dev_random((size_t)nmax * 14336 * 4), *y[3];
    for (int i = 0; i < 3; i++) y[i] = g->vt->alloc(g, (size_t)nmax * 128256 * 4);
    for (int op = 0; op < NOPS; op++) {
        size_t bytes = 0;
        for (int i = 0; i < nw[op]; i++) bytes += (size_t)shp[op][i][0] * shp[op][i][1] * 2;
        int copies = (int)((400u << 20) / bytes + 1);
        if (copies > 16) copies = 16;
        tern_tensor *w = calloc((size_t)copies * 3, sizeof *w);
        int ok = 1;
        for (int i = 0; i < nw[op] && ok; i++) {
            tern_tensor t;
            bench_tensor(&t, TERN_DT_BF16, 0, 64, shp[op][i][0], shp[op][i][1]);
            size_t wb = (size_t)shp[op][i][0] * shp[op][i][1] * 2;
            uint8_t *hd = malloc(wb);
            fill_weight(hd, wb, TERN_DT_BF16);
            tern_tensor *wc = malloc(sizeof *wc * copies);
            ok = upload_copies(wc, copies, &t, hd, NULL, NULL, 0, 1) == copies;
            for (int c = 0; c < copies; c++) w[c * 3 + i] = wc[c];
            free(wc);
            free(hd);
        }
        for (int k = 0; ok && k < (int)(sizeof ns / sizeof ns[0]); k++)
            for (int path = 0; path < 2; path++) { /* cuBLASLt, sgemm (n <= 64) */
                const int n = ns[k];
                if (path == 1 && n > 64) continue;
                tern__cuda_sgemm_on = path ? 2 : 0;
                int served = 1;
                double sec = 0;
                for (int pass = 0; pass < 2 && served; pass++) { /* pass 0 warms up */
                    const int reps = pass ? copies * 4 : copies;
                    double t0 = tern_time_s();
                    for (int r = 0; r < reps && served; r++) {
                        const tern_tensor *wr = &w[(r % copies) * 3];
                        const tern_tensor *wp[3] = {wr, wr + 1, wr + 2};
                        switch (op) {
                        case QKV: served = g->vt->matmul_n(g, 3, y, x, n, wp); break;
                        case GLU: served = g->vt->matmul_glu(g, y[0], x, n, wr, wr + 1, TERN_ACT_SILU); break;
                        case O: case DOWN: served = g->vt->matmul_add(g, y[0], x, n, wr); break;
                        default: g->vt->matmul(g, y[0], x, n, wr); break;
                        }
                    }
                    g->vt->sync(g);
                    sec = (tern_time_s() - t0) / reps;
                }
                char name[96];
                snprintf(name, sizeof name, "fused %s n=%d %s", names[op], n, path ? "sgemm" : "cublaslt");
                if (!served) { printf("%-48s refused\n", name); continue; }
                const double gbs = bytes / sec / 1e9;
                printf("%-48s %8.1f us %8.1f GB/s  %.2f of stream\n", name, sec * 1e6, gbs, ceiling_gbs > 0 ? gbs / ceiling_gbs : 0);
                printf("csv,%s,%.2f,%.1f\n", name, sec * 1e6, gbs);
            }
        for (int c = 0; c < copies; c++)
            for (int i = 0; i < nw[op]; i++) g->vt->free_weight(g, &w[c * 3 + i]);
        free(w);
    }
    tern__cuda_sgemm_on = -1;
    g->vt->free(g, x);
    for (int i = 0; i < 3; i++) g->vt->free(g, y[i]);
    tern_backend_close(b);
    g = keep;
}

/* Batched matmul in the bf16 compute mode (decode of n sequences at once, short prefills): the
 * tensor-core kernel (qgemm.cu) vs the paths before it (GEMV / dequantize + cuBLASLt), chosen by
 * the row limits qgemm.cu exports. Floor = max(weight bytes / stream-add ceiling, useful FLOPs
 * 2·n·out·in / 989 TFLOP/s dense bf16): "floor" = floor time / measured time. */
extern int tern__cuda_qgemm_max_n_q, tern__cuda_qgemm_max_n_bf16, tern__cuda_qgemm_split_mul;

static int split_sweep; /* BENCH_SPLIT=1: also time qgemm's K-split targets 1, 4, 8 x SMs */
static int xr_sweep;   /* bench_cuda --xr: also gemv_xr.cu (TERN_CUDA_GEMV_XR) at n <= 8 */
extern int tern__cuda_gemv_xr, tern__cuda_gemv_xr_max_n, tern__cuda_qg4_on, tern__cuda_qg4_max_n;
extern int tern__cuda_gemv_xrw, tern__cuda_gemv_xrw_max_n, tern__cuda_gemv_xrw_small_n;

static void bench_batched(tern_dtype dt, int bits, int out, int in, const int *ns) {
    tern_backend *keep = g, *b = open_mode(TERN_COMPUTE_BF16);
    if (!b) return;
    g = b;
    tern_tensor t;
    bench_tensor(&t, dt, bits, 64, out, in);
    size_t wb = (size_t)out * tern_tensor_row_bytes(&t), sb = dt == TERN_DT_Q ? (size_t)out * (in / 64) * 2 : 0;
    size_t bytes = wb + 2 * sb;
    int copies = (int)((1ull << 30) / bytes + 1), nmax = 0;
    if (copies > 32) copies = 32;
    for (int i = 0; ns[i]; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
    tern_tensor *w = calloc(copies, sizeof *w);
    uint8_t *hd = malloc(wb);
    uint16_t *hs = malloc(sb + 2), *hb = malloc(sb + 2);
    fill_weight(hd, wb, dt);
    copies = upload_copies(w, copies, &t, hd, hs, hb, sb, 0);
    free(hd); free(hs); free(hb);
    float *x = dev_random((size_t)nmax * in * 4), *y = g->vt->alloc(g, (size_t)nmax * out * 4);
    const int kq = tern__cuda_qgemm_max_n_q, kb = tern__cuda_qgemm_max_n_bf16, k4 = tern__cuda_qg4_on;
    const int kw = tern__cuda_gemv_xrw, kwm = tern__cuda_gemv_xrw_max_n, kws = tern__cuda_gemv_xrw_small_n;
    for (int k = 0; copies > 0 && x && y && ns[k]; k++)
        for (int path = 0; path < 7; path++) { /* 0: before (qgemm off), 1: qgemm, 2..4: split x1/x4/x8, 5: gemv_xr,
                                                  6: qgemm_q4.cu */
            const int n = ns[k], sm[7] = {2, 2, 1, 4, 8, 2, 2};
            if ((path >= 1 && n == 1) || (path >= 2 && path <= 4 && (!split_sweep || dt != TERN_DT_Q || out != in)))
                continue;
            if (path == 5 && (!xr_sweep || dt != TERN_DT_Q || n > 8)) continue;
            if (path == 6 && (dt != TERN_DT_Q || bits != 4 || (xr_sweep && n < 8))) continue;
            tern__cuda_gemv_xr = tern__cuda_gemv_xrw = path == 5;
            tern__cuda_gemv_xr_max_n = tern__cuda_gemv_xrw_max_n = tern__cuda_gemv_xrw_small_n = 8;
            tern__cuda_qg4_on = path == 6;
            tern__cuda_qg4_max_n = 1 << 30;
            tern__cuda_qgemm_max_n_q = path ? 1 << 30 : 0;
            tern__cuda_qgemm_max_n_bf16 = path ? 1 << 30 : 0;
            tern__cuda_qgemm_split_mul = sm[path];
            for (int i = 0; i < copies; i++) g->vt->matmul(g, y, x, n, &w[i]);
            g->vt->sync(g);
            int reps = copies * (n >= 64 ? 2 : 4);
            double t0 = tern_time_s();
            for (int i = 0; i < reps; i++) g->vt->matmul(g, y, x, n, &w[i % copies]);
            g->vt->sync(g);
            double sec = (tern_time_s() - t0) / reps, fl = 2.0 * n * out * (double)in;
            double fb = ceiling_gbs > 0 ? bytes / (ceiling_gbs * 1e9) : bytes / 3.3e12, ff = fl / 989e12;
            char name[96];
            char fmt[16];
            snprintf(fmt, sizeof fmt, "q%d/g64", bits);
            snprintf(name, sizeof name, "bmm %s %dx%d n=%d %s%s", dt == TERN_DT_Q ? fmt : "BF16", out, in, n,
                     path == 6 ? "qg4" : path == 5 ? "xr" : path ? "qgemm" : "before",
                     path >= 2 && path <= 4 ? (path == 2 ? " split1" : path == 3 ? " split4" : " split8") : "");
            printf("%-44s %10.1f us %8.1f GB/s %7.1f TFLOP/s  floor %.2f\n", name, sec * 1e6, bytes / sec / 1e9,
                   fl / sec / 1e12, (fb > ff ? fb : ff) / sec);
            printf("csv,%s,%.2f,%.1f,%.2f\n", name, sec * 1e6, bytes / sec / 1e9, fl / sec / 1e12);
            fflush(stdout);
        }
    tern__cuda_qgemm_max_n_q = kq;
    tern__cuda_qgemm_max_n_bf16 = kb;
    tern__cuda_qgemm_split_mul = 2;
    tern__cuda_gemv_xr = 0;
    tern__cuda_gemv_xr_max_n = 4;
    tern__cuda_gemv_xrw = kw;
    tern__cuda_gemv_xrw_max_n = kwm;
    tern__cuda_gemv_xrw_small_n = kws;
    tern__cuda_qg4_on = k4;
    tern__cuda_qg4_max_n = 128;
    for (int c = 0; c < copies; c++) g->vt->free_weight(g, &w[c]);
    free(w);
    g->vt->free(g, x); g->vt->free(g, y);
    tern_backend_close(b);
    g = keep;
}

/* `bench_cuda --qmma`: MLX Q matmul at n = 1, 8, 32, 64 on the llama3-8b shapes, the older kernels
 * (GEMV for n = 1, qgemm.cu for n >= 2 in the bf16 mode; GEMV / cuBLASLt in the f32 mode) vs
 * qmma.cu (tern__cuda_qmma_mode 1 in the bf16 mode, 2 in the f32 mode). "floor" = time at the
 * stream-add ceiling measured in this run / measured time (weights + scales + biases read once). */
extern int tern__cuda_qmma_mode;

static void bench_qmma(int bits, int out, int in, tern_compute mode) {
    static const int ns[] = {1, 8, 32, 64};
    tern_backend *keep = g, *b = open_mode(mode);
    if (!b) return;
    g = b;
    tern_tensor t;
    bench_tensor(&t, TERN_DT_Q, bits, 64, out, in);
    size_t wb = (size_t)out * tern_tensor_row_bytes(&t), sb = (size_t)out * (in / 64) * 2, bytes = wb + 2 * sb;
    int copies = (int)((1ull << 30) / bytes + 1);
    if (copies > 32) copies = 32;
    tern_tensor *w = calloc(copies, sizeof *w);
    uint8_t *hd = malloc(wb);
    uint16_t *hs = malloc(sb), *hb = malloc(sb);
    fill_weight(hd, wb, TERN_DT_Q);
    copies = upload_copies(w, copies, &t, hd, hs, hb, sb, 0);
    free(hd); free(hs); free(hb);
    float *x = dev_random((size_t)64 * in * 4), *y = g->vt->alloc(g, (size_t)64 * out * 4);
    const int keep_mode = tern__cuda_qmma_mode;
    for (int k = 0; copies > 0 && x && y && k < 4; k++)
        for (int path = 0; path < 2; path++) {
            const int n = ns[k];
            tern__cuda_qmma_mode = path ? (mode == TERN_COMPUTE_F32 ? 2 : 1) : 0;
            for (int i = 0; i < copies; i++) g->vt->matmul(g, y, x, n, &w[i]);
            g->vt->sync(g);
            int reps = copies * 4;
            double t0 = tern_time_s();
            for (int i = 0; i < reps; i++) g->vt->matmul(g, y, x, n, &w[i % copies]);
            g->vt->sync(g);
            double sec = (tern_time_s() - t0) / reps, gbs = bytes / sec / 1e9;
            double fb = ceiling_gbs > 0 ? bytes / (ceiling_gbs * 1e9) : bytes / 3.3e12;
            char name[96];
            snprintf(name, sizeof name, "qmm q%d/g64 %dx%d n=%d %s %s", bits, out, in, n,
                     mode == TERN_COMPUTE_F32 ? "f32" : "bf16", path ? "qmma" : "old");
            printf("%-44s %10.2f us %8.1f GB/s  floor %.2f\n", name, sec * 1e6, gbs, fb / sec);
            printf("csv,%s,%.2f,%.1f,%.3f\n", name, sec * 1e6, gbs, fb / sec);
            fflush(stdout);
        }
    tern__cuda_qmma_mode = keep_mode;
    for (int c = 0; c < copies; c++) g->vt->free_weight(g, &w[c]);
    free(w);
    g->vt->free(g, x); g->vt->free(g, y);
    tern_backend_close(b);
    g = keep;
}

/* `bench_cuda --prof`: one launch of each n = 1 matmul of interest (for ncu -k regex:gemv|qmma),
 * no ceiling run: q4/q8/bf16 4096x14336 (gemv1), q4 14336x4096 (gemv_q1), q4 via qmma (f32 mode). */
static void prof_one(tern_dtype dt, int bits, int out, int in) {
    tern_tensor t, w;
    bench_tensor(&t, dt, bits, 64, out, in);
    size_t wb = (size_t)out * tern_tensor_row_bytes(&t), sb = dt == TERN_DT_Q ? (size_t)out * (in / 64) * 2 : 0;
    uint8_t *hd = malloc(wb);
    uint16_t *hs = malloc(sb + 2), *hb = malloc(sb + 2);
    fill_weight(hd, wb, dt);
    int ok = upload_copies(&w, 1, &t, hd, hs, hb, sb, 1);
    free(hd); free(hs); free(hb);
    float *x = dev_random((size_t)in * 4), *y = g->vt->alloc(g, (size_t)out * 4);
    if (ok && x && y) {
        g->vt->matmul(g, y, x, 1, &w);
        g->vt->sync(g);
        printf("prof: %s q%d %dx%d launched\n", tern_dtype_name(dt), bits, out, in);
        g->vt->free_weight(g, &w);
    }
    g->vt->free(g, x); g->vt->free(g, y);
}

/* `bench_cuda --ltsweep [n ...]`: every cuBLASLt heuristic answer for the plain bf16 GEMMs of llama3-8b batch decode
 * (lt_sweep.c): o / down with beta 1, q, k|v and gate|up as strided batches of two (f32 C as matmul_n / matmul_glu
 * write it; gate|up also in bf16 rows [gate | up] as norm_mlp writes them), q|k|v as one matrix and the head, at n rows (default 32 64
 * 128); the weights rotate over >= 400 MB of copies */
void tern__cuda_lt_sweep(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, long long sc, const void *a,
                         size_t a_step, int copies, long long sa, const void *bm, int m, int n, int k, int nb,
                         float beta, double bytes);
static void bench_ltsweep(int argc, char **argv) {
    tern__cuda *c = (tern__cuda *)g->impl;
    typedef struct { const char *name; int m, k, nb, c16; float beta; } Shape;
    static const Shape llama[] = {
        {"o 4096x4096 +=", 4096, 4096, 0, 0, 1.0f},       {"down 4096x14336 +=", 4096, 14336, 0, 0, 1.0f},
        {"q 4096x4096", 4096, 4096, 0, 0, 0.0f},          {"k|v 2x1024x4096", 1024, 4096, 2, 0, 0.0f},
        {"gate|up 2x14336x4096 f32", 14336, 4096, 2, 0, 0.0f}, {"gate|up 2x14336x4096 bf16", 14336, 4096, 2, 1, 0.0f},
        {"q|k|v 6144x4096 (one matrix)", 6144, 4096, 0, 0, 0.0f}, {"head 128256x4096", 128256, 4096, 0, 0, 0.0f}};
    /* BENCH_LT_SET=g12: gemma4-12b's sliding layer in the bf16 mode (o and down with beta 0: both outputs are normed
     * before the residual add; q|k|v joined, run at 2n columns when q / k are precise) */
    static const Shape g12[] = {
        {"o 3840x4096", 3840, 4096, 0, 0, 0.0f}, {"down 3840x15360", 3840, 15360, 0, 0, 0.0f},
        {"q|k|v 8192x3840 (one matrix)", 8192, 3840, 0, 0, 0.0f}, {"gate|up 2x15360x3840 bf16", 15360, 3840, 2, 1, 0.0f}};
    /* BENCH_LT_SET=e4b: gemma4-e4b's batch-decode GEMMs (session 70 ncu at 64 sequences: q|k|v and the KV-shared
     * layers' q at 1.2-1.5 TB/s, the per-layer input gate on 32 CTAs at 7.5 us) */
    static const Shape e4b[] = {
        {"o 2560x2048", 2560, 2048, 0, 0, 0.0f},          {"o global 2560x4096", 2560, 4096, 0, 0, 0.0f},
        {"down 2560x10240", 2560, 10240, 0, 0, 0.0f},     {"q|k|v 3072x2560 (one matrix)", 3072, 2560, 0, 0, 0.0f},
        {"q|k|v global 6144x2560", 6144, 2560, 0, 0, 0.0f}, {"q shared 2048x2560", 2048, 2560, 0, 0, 0.0f},
        {"ple gate 256x2560", 256, 2560, 0, 0, 0.0f},     {"ple proj 2560x256", 2560, 256, 0, 0, 0.0f},
        {"gate|up 2x10240x2560 bf16", 10240, 2560, 2, 1, 0.0f}};
    /* BENCH_LT_SET=g31: gemma4-31b's sliding layer; a4b: gemma4-26b-a4b's dense parts (attention, the shared MLP) */
    static const Shape g31[] = {
        {"o 5376x8192", 5376, 8192, 0, 0, 0.0f}, {"down 5376x21504", 5376, 21504, 0, 0, 0.0f},
        {"q|k|v 16384x5376 (one matrix)", 16384, 5376, 0, 0, 0.0f},
        {"gate|up 2x21504x5376 bf16", 21504, 5376, 2, 1, 0.0f}};
    static const Shape a4b[] = {
        {"o 2816x4096", 2816, 4096, 0, 0, 0.0f}, {"q|k|v 8192x2816 (one matrix)", 8192, 2816, 0, 0, 0.0f},
        {"down 2816x2112", 2816, 2112, 0, 0, 0.0f}, {"gate|up 2x2112x2816 bf16", 2112, 2816, 2, 1, 0.0f}};
#define LT_SET(v) {#v, v, (int)(sizeof v / sizeof *v)}
    static const struct { const char *name; const Shape *sh; int n; } sets[] = {
        LT_SET(llama), LT_SET(g12), LT_SET(e4b), LT_SET(g31), LT_SET(a4b)};
#undef LT_SET
    const char *set = getenv("BENCH_LT_SET");
    int si = 0; /* unset or unknown: llama3-8b's */
    for (int i = 1; set && i < (int)(sizeof sets / sizeof *sets); i++)
        if (!strcmp(set, sets[i].name)) si = i;
    const Shape *sh = sets[si].sh;
    const int NSH = sets[si].n;
    int ns[16], nn = 0;
    for (int i = 2; i < argc && nn < 16; i++)
        if (atoi(argv[i]) > 0) ns[nn++] = atoi(argv[i]);
    if (!nn) { ns[0] = 32; ns[1] = 64; ns[2] = 128; nn = 3; }
    int nmax = 0;
    for (int i = 0; i < nn; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
    void *x = dev_random((size_t)nmax * 21504 * 2), *y = g->vt->alloc(g, (size_t)nmax * 128256 * 4);
    for (int s = 0; s < NSH && x && y; s++) {
        const int nb = sh[s].nb ? sh[s].nb : 1;
        const size_t wb = (size_t)sh[s].m * sh[s].k * 2 * nb;
        int copies = (int)((400u << 20) / wb + 1);
        if (copies > 16) copies = 16;
        void *w = dev_random(wb * copies);
        if (!w) { printf("ltsweep %s: no memory\n", sh[s].name); continue; }
        for (int i = 0; i < nn; i++) {
            const int n = ns[i], m = sh[s].m;
            /* C: f32 [nb][n][m] (ld m, batch stride n·m), or bf16 rows [first m | second m] (ld 2m, stride m) */
            const int ldc = sh[s].c16 ? 2 * m : m;
            const long long sc = sh[s].c16 ? m : (long long)n * m;
            tern__cuda_lt_sweep(c, sh[s].name, y, sh[s].c16, ldc, sh[s].nb ? sc : 0, w, wb, copies,
                                sh[s].nb ? (long long)m * sh[s].k : 0, x, m, n, sh[s].k, sh[s].nb, sh[s].beta,
                                (double)wb);
        }
        g->vt->free(g, w);
    }
    g->vt->free(g, x);
    g->vt->free(g, y);
}

/* `bench_cuda --ltsearch [n ...]`: every configuration cuBLASLt accepts (lt_sweep.c tern__cuda_lt_search) for the
 * plain GEMMs of llama3-8b batch decode that run as one matrix — o and down with beta 1, q|k|v (joined), the head —
 * at n rows (default 64), the fastest with their TERN_LT_PIN entries */
void tern__cuda_lt_search(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, const void *a, size_t a_step,
                          int copies, const void *bm, int m, int n, int k, float beta, double bytes);
static void bench_ltsearch(int argc, char **argv) {
    tern__cuda *c = (tern__cuda *)g->impl;
    static const struct { const char *name; int m, k; float beta; } sh[] = {
        {"down 4096x14336 +=", 4096, 14336, 1.0f}, {"o 4096x4096 +=", 4096, 4096, 1.0f},
        {"q|k|v 6144x4096 (one matrix)", 6144, 4096, 0.0f}, {"head 128256x4096", 128256, 4096, 0.0f}};
    int ns[16], nn = 0;
    for (int i = 2; i < argc && nn < 16; i++)
        if (atoi(argv[i]) > 0) ns[nn++] = atoi(argv[i]);
    if (!nn) ns[nn++] = 64;
    int nmax = 0;
    for (int i = 0; i < nn; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
    void *x = dev_random((size_t)nmax * 14336 * 2), *y = g->vt->alloc(g, (size_t)nmax * 128256 * 4);
    const char *only = getenv("LTSEARCH_ONLY"); /* a part of the shape names to search (default: every shape) */
    for (size_t s = 0; s < sizeof sh / sizeof sh[0] && x && y; s++) {
        if (only && !strstr(sh[s].name, only)) continue;
        const size_t wb = (size_t)sh[s].m * sh[s].k * 2;
        int copies = (int)((400u << 20) / wb + 1);
        if (copies > 16) copies = 16;
        void *w = dev_random(wb * copies);
        if (!w) { printf("ltsearch %s: no memory\n", sh[s].name); continue; }
        for (int i = 0; i < nn; i++)
            tern__cuda_lt_search(c, sh[s].name, y, 0, sh[s].m, w, wb, copies, x, sh[s].m, ns[i], sh[s].k, sh[s].beta,
                                 (double)wb);
        g->vt->free(g, w);
    }
    g->vt->free(g, x);
    g->vt->free(g, y);
}

/* `bench_cuda --wgemm [n ...]`: wgemm.cu (TMA + wgmma) against cuBLASLt for the one-matrix GEMMs of llama3-8b batch
 * decode (o and down with beta 1, q|k|v joined, the head) and a ragged shape, at n rows (default 32 64 128): µs as
 * CUDA graphs over cold weights, and the difference of the two outputs (lt_sweep.c tern__cuda_wgemm_bench) */
void tern__cuda_wgemm_bench(tern__cuda *c, const char *name, int m, int k, float beta, const int *ns, int nn);
static void bench_wgemm(int argc, char **argv) {
    static const struct { const char *name; int m, k; float beta; } sh[] = {
        {"down 4096x14336 +=", 4096, 14336, 1.0f}, {"o 4096x4096 +=", 4096, 4096, 1.0f},
        {"q|k|v 6144x4096", 6144, 4096, 0.0f},     {"gate|up 28672x4096", 28672, 4096, 0.0f},
        {"head 128256x4096", 128256, 4096, 0.0f},  {"ragged 1000x1000 +=", 1000, 1000, 1.0f}};
    int ns[16], nn = 0;
    for (int i = 2; i < argc && nn < 16; i++)
        if (atoi(argv[i]) > 0) ns[nn++] = atoi(argv[i]);
    if (!nn) { ns[0] = 32; ns[1] = 64; ns[2] = 128; nn = 3; }
    const char *only = getenv("WGEMM_ONLY"); /* a part of the shape names (default: every shape) */
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        if (!only || strstr(sh[s].name, only))
            tern__cuda_wgemm_bench((tern__cuda *)g->impl, sh[s].name, sh[s].m, sh[s].k, sh[s].beta, ns, nn);
}

/* `bench_cuda --pattern`: gemv_mma.cu's load pattern alone vs contiguous ones (GB/s of useful bytes) */
void tern__cuda_mm_probe(tern__cuda *c, const void *w, int rows, int rb, int mode, void *sink);
static void bench_pattern(int rows, int rb) {
    size_t bytes = (size_t)rows * rb;
    int copies = (int)((2ull << 30) / bytes + 1);
    if (copies > 32) copies = 32;
    void *w[32] = {0}, *sink = g->vt->alloc(g, 64u << 20);
    for (int i = 0; i < copies; i++) w[i] = dev_random(bytes);
    tern__cuda *c = (tern__cuda *)g->impl;
    static const char *nm[7] = {"mma slices", "mma rows", "2 rows x 512B", "flat stream", "ring lane-own",
                                "ring 512B", "flat stream x4"};
    for (int mode = 0; mode < 7; mode++) {
        if (mode == 4 || mode == 5) {
            if (rb % 256) continue; /* whole 256-byte chunks per row */
        }
        for (int i = 0; i < copies; i++) tern__cuda_mm_probe(c, w[i], rows, rb, mode, sink);
        g->vt->sync(g);
        int reps = copies * 4;
        double t0 = tern_time_s();
        for (int i = 0; i < reps; i++) tern__cuda_mm_probe(c, w[i % copies], rows, rb, mode, sink);
        g->vt->sync(g);
        char name[96];
        snprintf(name, sizeof name, "pattern %s %dx%dB", nm[mode], rows, rb);
        row(name, (tern_time_s() - t0) / reps, (double)bytes);
    }
    for (int i = 0; i < copies; i++) g->vt->free(g, w[i]);
    g->vt->free(g, sink);
}

/* `bench_cuda --pdl-smem` (pdl_probe.cu): a graph of 32 × (one-row 4096x4096 BF16 GEMV, probe kernel) against
 * 32 GEMVs alone, per probe shape — 72 or 128 blocks of 128 threads asking for `smem` bytes of dynamic shared
 * memory, with or without the MaxShared carveout hint; "cost" = the graph's µs above the GEMVs alone, per probe.
 * Whether a kernel in another shared-memory configuration breaks PDL's overlap (TERN_CUDA_AD_TCS, NOTES (aa)) */
void tern__cuda_pdl_probe(tern__cuda *c, int blocks, int smem, int carve, int *sink);
double tern__cuda_probe_graph(tern__cuda *c, int phase, int reps);
static void bench_pdl_smem(void) {
    tern__cuda *c = (tern__cuda *)g->impl;
    tern_tensor t, w;
    bench_tensor(&t, TERN_DT_BF16, 0, 0, 4096, 4096);
    const size_t wb = (size_t)4096 * 4096 * 2;
    uint8_t *hd = malloc(wb);
    uint16_t hs[1], hb[1];
    fill_weight(hd, wb, TERN_DT_BF16);
    const int ok = upload_copies(&w, 1, &t, hd, hs, hb, 0, 1) == 1;
    free(hd);
    float *x = dev_random(4096 * 4), *y = g->vt->alloc(g, 4096 * 4);
    int *sink = g->vt->alloc(g, 64);
    static const struct { int blocks, smem, carve; } P[] = {
        {0, 0, 0},         {72, 512, 0},  {72, 16 << 10, 0}, {72, 36 << 10, 0}, {72, 36 << 10, 1},
        {72, 108 << 10, 0}, {72, 108 << 10, 1}, {128, 17 << 10, 0}, {128, 108 << 10, 1},
    };
    double base = -1.0;
    for (size_t i = 0; ok && x && y && sink && i < sizeof P / sizeof P[0]; i++) {
        double us = -1.0;
        if (tern__cuda_probe_graph(c, 0, 0) == 0.0) {
            for (int k = 0; k < 32; k++) {
                g->vt->matmul(g, y, x, 1, &w);
                if (P[i].blocks) tern__cuda_pdl_probe(c, P[i].blocks, P[i].smem, P[i].carve, sink);
            }
            us = tern__cuda_probe_graph(c, 1, 50);
        }
        if (!P[i].blocks) base = us;
        char name[96];
        if (!P[i].blocks) snprintf(name, sizeof name, "pdl-smem 32 GEMVs alone");
        else snprintf(name, sizeof name, "pdl-smem + %d blocks x %d KB%s", P[i].blocks, P[i].smem >> 10, P[i].carve ? " MaxShared" : "");
        printf("%-52s %10.1f us   cost %6.2f us a probe\n", name, us, base > 0 && us > 0 ? (us - base) / 32 : -1.0);
        printf("csv,%s,%.2f,%.3f\n", name, us, base > 0 && us > 0 ? (us - base) / 32 : -1.0);
    }
    if (ok) g->vt->free_weight(g, &w);
    g->vt->free(g, x); g->vt->free(g, y); g->vt->free(g, sink);
}

/* `bench_cuda --persist` (persist_probe.cu): a chain of dependent one-row BF16 GEMVs in a llama3-8b layer's shapes
 * (q|k|v 6144x4096, o 4096x4096, gate|up 28672x4096, down 4096x14336; x of each = y of the one before), 8 layers, as
 * a graph of the production matmuls (gemv1 under PDL), as a graph of the probe's GEMV launched per op (with and
 * without the first lines into L2 before pdl_wait), and as one persistent launch of the same GEMV with a grid
 * barrier between ops (with and without the next op's first lines into L2 before each barrier). Every weight is its
 * own copy, so no op reads another's bytes from L2. µs a chain, a op, and TB/s against the stream-add ceiling. */
int tern__cuda_persist_probe(tern__cuda *c, const void *const *w, const float *const *x, float *const *y,
                             const int *out, const int *in, int n, int mode, void *scratch);
static void bench_persist(void) {
    enum { L = 8, N = 4 * L, YMAX = 28672 };
    static const int sh[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    tern__cuda *c = (tern__cuda *)g->impl;
    tern_tensor t, w[N];
    const void *wd[N];
    const float *xs[N];
    float *ys[N + 1];
    int out[N], in[N], nw = 0;
    double bytes = 0;
    const size_t hb = (size_t)28672 * 4096 * 2;
    uint8_t *hd = malloc(hb);
    uint16_t h1[1];
    if (!hd) return;
    fill_weight(hd, hb, TERN_DT_BF16);
    for (int i = 0; i < N; i++) {
        out[i] = sh[i % 4][0];
        in[i] = sh[i % 4][1];
        bench_tensor(&t, TERN_DT_BF16, 0, 0, out[i], in[i]);
        if (upload_copies(&w[i], 1, &t, hd, h1, h1, 0, 1) != 1) break;
        wd[i] = w[i].data;
        bytes += (double)out[i] * in[i] * 2;
        nw++;
    }
    free(hd);
    for (int i = 0; i <= N; i++) ys[i] = i ? g->vt->alloc(g, YMAX * 4) : dev_random(YMAX * 4);
    void *scratch = g->vt->alloc(g, (size_t)N * 64 + 64);
    int ok = nw == N && scratch;
    for (int i = 0; ok && i <= N; i++) ok = ys[i] != NULL;
    if (!ok) {
        printf("persist: setup failed\n");
        goto done;
    }
    {
        float *z = calloc(YMAX, 4);
        for (int i = 1; z && i <= N; i++) g->vt->upload(g, ys[i], z, YMAX * 4);
        free(z);
    }
    for (int i = 0; i < N; i++) xs[i] = ys[i];
    if (tern__cuda_persist_probe(c, wd, xs, ys + 1, out, in, N, -1, scratch) != 0) {
        printf("persist: the persistent grid cannot be resident\n");
        goto done;
    }
    /* the first two ops both ways (their values stay finite): y1, y2 of the production chain against the persistent one */
    {
        float *a = malloc(2 * YMAX * 4), *b = malloc(2 * YMAX * 4);
        g->vt->matmul(g, ys[1], ys[0], 1, &w[0]);
        g->vt->matmul(g, ys[2], ys[1], 1, &w[1]);
        g->vt->sync(g);
        g->vt->download(g, a, ys[1], (size_t)out[0] * 4);
        g->vt->download(g, a + YMAX, ys[2], (size_t)out[1] * 4);
        tern__cuda_persist_probe(c, wd, xs, ys + 1, out, in, 2, -1, scratch);
        tern__cuda_persist_probe(c, wd, xs, ys + 1, out, in, 2, 2, scratch);
        g->vt->sync(g);
        g->vt->download(g, b, ys[1], (size_t)out[0] * 4);
        g->vt->download(g, b + YMAX, ys[2], (size_t)out[1] * 4);
        for (int k = 0; k < 2; k++) {
            double d2 = 0, r2 = 0;
            for (int i = 0; i < out[k]; i++) {
                double d = (double)a[k * YMAX + i] - b[k * YMAX + i];
                d2 += d * d;
                r2 += (double)a[k * YMAX + i] * a[k * YMAX + i];
            }
            printf("persist: op %d, persistent vs production: rel L2 %.2e\n", k, sqrt(d2 / (r2 > 0 ? r2 : 1)));
        }
        free(a);
        free(b);
        tern__cuda_persist_probe(c, wd, xs, ys + 1, out, in, N, -1, scratch);
    }
    static const char *nm[5] = {"production matmul (gemv1, PDL)", "probe GEMV a launch per op", "probe GEMV a launch + L2 first lines",
                                "persistent, grid barrier", "persistent + next op's lines to L2"};
    for (int rep = 0; rep < 2; rep++)
        for (int v = 0; v < 5; v++) {
            double us = -1.0;
            if (tern__cuda_probe_graph(c, 0, 0) == 0.0) {
                int rc = 0;
                if (v == 0)
                    for (int i = 0; i < N; i++) g->vt->matmul(g, ys[i + 1], ys[i], 1, &w[i]);
                else rc = tern__cuda_persist_probe(c, wd, xs, ys + 1, out, in, N, v - 1, scratch);
                us = tern__cuda_probe_graph(c, 1, 20);
                if (rc) us = -1.0;
            }
            const double tbs = us > 0 ? bytes / us / 1e6 : 0;
            printf("persist %-40s %9.1f us a chain %7.2f us an op %6.2f TB/s %5.1f%% of stream-add\n", nm[v], us,
                   us / N, tbs, ceiling_gbs > 0 ? 100.0 * tbs * 1000 / ceiling_gbs : 0.0);
            printf("csv,persist,%s,%d,%.2f,%.3f\n", nm[v], rep, us, tbs);
            fflush(stdout);
        }
    /* the production matmuls per shape: 32 launches of one shape (bf16, then MLX q4 g64), each its own copy, on a
     * backend in the plain bf16 mode (the GPU default: Q4 takes the XP1 walk there) */
    /* BENCH_PERSIST_SAME=1: every launch on copy 0 (its weights from L2 where they fit: the GEMV fed from L2; session
     * 63 (NOTES (bw)): the Q4 layer chain 16.6 -> 8.0 us an op, bf16 4096x4096 12.4 -> 7.4) */
    const char *se = getenv("BENCH_PERSIST_SAME");
    const int same = se && atoi(se) > 0;
    tern_backend *keep = g, *gb = open_mode(TERN_COMPUTE_BF16);
    if (!gb) goto done;
    g = gb;
    c = (tern__cuda *)g->impl;
    for (int q = 0; q < 2; q++)
        for (int k = -1; k < 4; k++) {
            tern_tensor wq[N];
            int nq = 0;
            double qb = 0;
            if (q) { /* the layer's Q4 copies */
                const int mo = 28672, mi = 14336;
                uint8_t *hq = malloc((size_t)mo * 4096 / 2 > (size_t)4096 * mi / 2 ? (size_t)mo * 4096 / 2 : (size_t)4096 * mi / 2);
                uint16_t *hs = malloc((size_t)mo * (mi / 64) * 2), *hbq = malloc((size_t)mo * (mi / 64) * 2);
                if (!hq || !hs || !hbq) { free(hq); free(hs); free(hbq); break; }
                fill_weight(hq, (size_t)mo * 4096 / 2, TERN_DT_Q);
                for (int i = 0; i < N; i++) {
                    const int s4 = k < 0 ? i % 4 : k;
                    bench_tensor(&t, TERN_DT_Q, 4, 64, sh[s4][0], sh[s4][1]);
                    if (upload_copies(&wq[i], 1, &t, hq, hs, hbq, (size_t)sh[s4][0] * (sh[s4][1] / 64) * 2, 1) != 1) break;
                    qb += (double)sh[s4][0] * sh[s4][1] / 2 + (double)sh[s4][0] * (sh[s4][1] / 64) * 4;
                    nq++;
                }
                free(hq); free(hs); free(hbq);
            } else {
                if (k < 0) continue; /* the bf16 layer chain ran above */
                uint8_t *hd2 = malloc((size_t)sh[k][0] * sh[k][1] * 2);
                if (!hd2) break;
                fill_weight(hd2, (size_t)sh[k][0] * sh[k][1] * 2, TERN_DT_BF16);
                for (int i = 0; i < N; i++) {
                    bench_tensor(&t, TERN_DT_BF16, 0, 0, sh[k][0], sh[k][1]);
                    if (upload_copies(&wq[i], 1, &t, hd2, h1, h1, 0, 1) != 1) break;
                    qb += (double)sh[k][0] * sh[k][1] * 2;
                    nq++;
                }
                free(hd2);
            }
            double us = -1.0;
            if (nq == N && tern__cuda_probe_graph(c, 0, 0) == 0.0) {
                for (int i = 0; i < N; i++) g->vt->matmul(g, ys[i + 1], ys[i], 1, &wq[same ? 0 : i]);
                us = tern__cuda_probe_graph(c, 1, 20);
            }
            const double tbs = us > 0 ? qb / us / 1e6 : 0;
            char name[64];
            if (k < 0) snprintf(name, sizeof name, "%s layer chain", q ? "q4" : "bf16");
            else snprintf(name, sizeof name, "%s %dx%d x32", q ? "q4" : "bf16", sh[k][0], sh[k][1]);
            printf("persist production %-28s %9.1f us %7.2f us an op %6.2f TB/s %5.1f%% of stream-add\n", name, us, us / N,
                   tbs, ceiling_gbs > 0 ? 100.0 * tbs * 1000 / ceiling_gbs : 0.0);
            printf("csv,persist-prod,%s,%.2f,%.3f\n", name, us, tbs);
            fflush(stdout);
            for (int i = 0; i < nq; i++) g->vt->free_weight(g, &wq[i]);
        }
    g = keep;
    tern_backend_close(gb);
done:
    for (int i = 0; i < nw; i++) g->vt->free_weight(g, &w[i]);
    for (int i = 0; i <= N; i++) g->vt->free(g, ys[i]);
    g->vt->free(g, scratch);
}

/* `bench_cuda --moe`: moe_mlp at the gemma4-26b-a4b geometry (H 2816, I 704, E 128, top-8, MLX q4 g64,
 * bf16 scales) for n = 1, 2, 4, 8: moe_mma.cu's tensor-core pairs ("mma"; "mma-late": its down kernel
 * loads after its wait) and TERN_CUDA_MOE_MMA=0 ("gemv": the CUDA-core expert GEMVs). Routes: 64
 * random sets (distinct experts per token) cycled call by call, so the experts come from HBM, not L2.
 * GB/s = bytes of the distinct experts a call touches (codes, scales, biases of gate, up and down) /
 * time. */
extern int tern__cuda_moe_mma_on, tern__cuda_moe_mma_early;
static void bench_moe(void) {
    const int H = 2816, I = 704, E = 128, k = 8, gs = 64, R = 64, nmax = 8;
    static const int NS[] = {1, 2, 4, 8};
    tern_tensor t[3], w[3];
    const int shp[3][2] = {{I, H}, {I, H}, {H, I}}; /* gate, up: [E, I, H]; down: [E, H, I] */
    size_t ebytes = 0;
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        bench_tensor(&t[i], TERN_DT_Q, 4, gs, shp[i][0], shp[i][1]);
        t[i].ndim = 3;
        t[i].shape[0] = E; t[i].shape[1] = shp[i][0]; t[i].shape[2] = shp[i][1];
        const size_t wb = (size_t)E * shp[i][0] * shp[i][1] / 2, sb = (size_t)E * shp[i][0] * (shp[i][1] / gs) * 2;
        ebytes += (wb + 2 * sb) / E;
        uint8_t *hd = malloc(wb);
        uint16_t *hs = malloc(sb), *hb = malloc(sb);
        fill_weight(hd, wb, TERN_DT_Q);
        ok &= hd && hs && hb && upload_copies(&w[i], 1, &t[i], hd, hs, hb, sb, 1) == 1;
        free(hd); free(hs); free(hb);
    }
    int32_t *idx = malloc(sizeof *idx * R * nmax * k);
    float *wts = malloc(sizeof *wts * R * nmax * k);
    for (int i = 0; i < R * nmax * k; i++) {
        int e, dup;
        do { /* distinct within the token's k */
            e = (int)((frand() * 0.5f + 0.5f) * E) % E;
            dup = 0;
            for (int q = i - i % k; q < i; q++) dup |= idx[q] == e;
        } while (dup);
        idx[i] = e;
        wts[i] = 1.0f / k;
    }
    int32_t *idd = g->vt->alloc(g, sizeof *idx * R * nmax * k);
    float *wd = g->vt->alloc(g, sizeof *wts * R * nmax * k), *x = dev_random((size_t)nmax * H * 4);
    float *y = g->vt->alloc(g, (size_t)nmax * H * 4), *scr = g->vt->alloc(g, (size_t)nmax * k * 2 * I * 4);
    if (!ok || !idd || !wd || !x || !y || !scr) { printf("bench moe: setup failed\n"); ok = 0; }
    if (ok) {
        g->vt->upload(g, idd, idx, sizeof *idx * R * nmax * k);
        g->vt->upload(g, wd, wts, sizeof *wts * R * nmax * k);
    }
    const int keep = tern__cuda_moe_mma_on;
    for (size_t ni = 0; ok && ni < sizeof NS / sizeof NS[0]; ni++) {
        const int n = NS[ni];
        double touched = 0.0; /* distinct experts per call, averaged over the route sets */
        for (int r = 0; r < R; r++) {
            unsigned char seen[128] = {0};
            for (int i = 0; i < n * k; i++) touched += !seen[idx[r * nmax * k + i]]++;
        }
        touched /= R;
        for (int path = 0; path < 3; path++) { /* mma; mma, down's loads after its wait; gemv */
            tern__cuda_moe_mma_on = path < 2;
            tern__cuda_moe_mma_early = path == 0;
            for (int r = 0; r < R; r++)
                g->vt->moe_mlp(g, y, x, n, H, idd + r * nmax * k, wd + r * nmax * k, k, &w[0], &w[1], &w[2],
                               TERN_ACT_GELU_TANH, scr);
            g->vt->sync(g);
            const int reps = 4 * R;
            const double t0 = tern_time_s();
            for (int i = 0; i < reps; i++) {
                const int r = i % R;
                g->vt->moe_mlp(g, y, x, n, H, idd + r * nmax * k, wd + r * nmax * k, k, &w[0], &w[1], &w[2],
                               TERN_ACT_GELU_TANH, scr);
            }
            g->vt->sync(g);
            char name[96];
            snprintf(name, sizeof name, "moe %dx%dx%d k%d q4/g%d n=%d %s", H, I, E, k, gs, n,
                     path == 0 ? "mma" : path == 1 ? "mma-late" : "gemv");
            row(name, (tern_time_s() - t0) / reps, touched * (double)ebytes);
        }
    }
    tern__cuda_moe_mma_on = keep;
    tern__cuda_moe_mma_early = 1;
    for (int i = 0; i < 3; i++) g->vt->free_weight(g, &w[i]);
    g->vt->free(g, idd); g->vt->free(g, wd); g->vt->free(g, x); g->vt->free(g, y); g->vt->free(g, scr);
    free(idx); free(wts);
}

int main(int argc, char **argv) {

    tern_error err = {0};
    tern_backend_opts o = {0};
    if (tern_backend_cuda_open(&g, &o, &err) != TERN_OK) {
        printf("SKIP: bench_cuda: %s\n", err.msg);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--prof")) {
        prof_one(TERN_DT_Q, 4, 4096, 14336);
        prof_one(TERN_DT_Q, 8, 4096, 14336);
        prof_one(TERN_DT_BF16, 0, 4096, 14336);
        prof_one(TERN_DT_Q, 4, 14336, 4096);
        prof_one(TERN_DT_Q, 4, 128256, 4096);
        prof_one(TERN_DT_BF16, 0, 128256, 4096);
        tern_backend *keep = g;
        tern__cuda_qmma_mode = 2;
        if ((g = open_mode(TERN_COMPUTE_F32))) {
            prof_one(TERN_DT_Q, 4, 4096, 14336);
            tern_backend_close(g);
        }
        g = keep;
        tern_backend_close(g);
        return 0;
    }
    if (argc > 5 && !strcmp(argv[1], "--attn-dec1")) { /* one case (for ncu): CTX NSEQ f32|bf16 MODE [NH NKV D] */
        extern int tern__cuda_ad_mode;
        tern__cuda_ad_mode = atoi(argv[5]);
        const int nh = argc > 8 ? atoi(argv[6]) : 32, nkv = argc > 8 ? atoi(argv[7]) : 8, d = argc > 8 ? atoi(argv[8]) : 128;
        bench_attn_decode(nh, nkv, d, atoi(argv[2]), atoi(argv[3]), strcmp(argv[4], "bf16") ? TERN_KV_F32 : TERN_KV_BF16,
                          argv[4]);
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--attn-dec")) { /* decode attention: tile kernels vs attn_decode.cu, f32 and bf16 pages */
        extern int tern__cuda_ad_mode, tern__cuda_ad_hsplit;
        static const int ctxs[] = {192, 1024, 8192};
        static const struct { int mode, kind; const char *tag; } M[] = {
            {0, TERN_KV_F32, "f32 tiles"}, {1, TERN_KV_F32, "f32 dec"}, {0, TERN_KV_BF16, "bf16 tiles"}, {1, TERN_KV_BF16, "bf16 dec"},
            {2, TERN_KV_F32, "f32 dec-hsplit"}, {2, TERN_KV_BF16, "bf16 dec-hsplit"}};
        for (int i = 0; i < 3; i++)
            for (int m = 0; m < 6; m++) {
                tern__cuda_ad_mode = M[m].mode > 0;
                tern__cuda_ad_hsplit = M[m].mode == 2; /* groups above 8 (4 at d 512) in several blocks */
                if (M[m].mode < 2) {
                    bench_attn_decode(32, 8, 128, ctxs[i], 1, M[m].kind, M[m].tag);
                    bench_attn_decode(32, 8, 128, ctxs[i], 64, M[m].kind, M[m].tag);
                    bench_attn_decode(16, 8, 256, ctxs[i], 1, M[m].kind, M[m].tag);
                }
                bench_attn_decode(16, 2, 512, ctxs[i], 1, M[m].kind, M[m].tag);  /* Gemma 4 26B-A4B global */
                bench_attn_decode(16, 1, 512, ctxs[i], 1, M[m].kind, M[m].tag);  /* 12B global: G = 16 */
                bench_attn_decode(16, 1, 512, ctxs[i], 32, M[m].kind, M[m].tag);
            }
        tern__cuda_ad_hsplit = 0;
        tern_backend_close(g);
        return 0;
    }
    if (argc > 5 && !strcmp(argv[1], "--attn1")) { /* one prefill case (for ncu): NH NKV D N, bf16 mode, BF16 pages */
        tern_backend *keep = g;
        if ((g = open_mode(TERN_COMPUTE_BF16))) {
            attn_bf16_pages = 1;
            attn_tag = " fa-bf16 pages-bf16";
            bench_attn_prefill(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
            tern_backend_close(g);
        }
        tern_backend_close(keep);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--attn")) { /* prefill attention only: every kernel and tile shape */
        bench_attn_prefill_all(32, 8, 128, 2048, 4);
        bench_attn_prefill_all(32, 8, 128, 8192, 4);
        bench_attn_prefill_all(16, 8, 256, 2048, 4);
        bench_attn_prefill_all(16, 8, 256, 8192, 4);
        bench_attn_prefill_all(8, 8, 64, 8192, 4);
        { /* d 512 (Gemma 4 global layers): the two-pass flash kernel (bf16 rows) vs the CUDA cores */
            extern int tern__cuda_fa512;
            const int keep512 = tern__cuda_fa512;
            tern__cuda_fa512 = 1;
            bench_attn_prefill_all(16, 4, 512, 2048, 1);
            bench_attn_prefill_all(16, 4, 512, 8192, 1);
            tern__cuda_fa512 = keep512;
        }
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--gemm")) { /* prefill GEMMs, bf16 mode: --gemm OUTxIN[p] ... (p: precise), n 2048 */
        for (int i = 2; i < argc; i++) {
            int out = 0, in = 0;
            char p = 0;
            if (sscanf(argv[i], "%dx%d%c", &out, &in, &p) >= 2 && out > 0 && in > 0)
                bench_prefill_p(TERN_DT_BF16, 0, out, in, 2048, TERN_COMPUTE_BF16, p == 'p');
        }
        tern_backend_close(g);
        return 0;
    }
    bench_stream();
    if (argc > 1 && !strcmp(argv[1], "--sgemm")) { /* fused decode ops at 9..128 rows: sgemm.cu vs cuBLASLt */
        bench_sgemm();
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--ltsearch")) { /* every configuration cuBLASLt accepts, timed */
        bench_ltsearch(argc, argv);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--wgemm")) { /* wgemm.cu against cuBLASLt, batch-decode GEMMs */
        bench_wgemm(argc, argv);
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--ltsweep")) { /* cuBLASLt's heuristic answers for batch-decode GEMMs */
        bench_ltsweep(argc, argv);
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--moe")) { /* moe_mlp at the gemma4-26b-a4b shapes: moe_mma.cu vs the GEMVs */
        bench_moe();
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--persist")) { /* persist_probe.cu: a GEMV chain a launch per op vs one persistent kernel */
        bench_stream();
        bench_persist();
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--pdl-smem")) {
        bench_pdl_smem();
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--pattern")) {
        bench_pattern(14336, 2048);
        bench_pattern(4096, 7168);
        bench_pattern(128256, 2048);
        bench_pattern(4096, 8192);
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--qmma")) { /* llama3-8b shapes, q4 and q8: older kernels vs qmma.cu */
        static const int shp[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
        for (int m = 0; m < 2; m++)
            for (int s = 0; s < 3; s++) {
                bench_qmma(4, shp[s][0], shp[s][1], m ? TERN_COMPUTE_F32 : TERN_COMPUTE_BF16);
                bench_qmma(8, shp[s][0], shp[s][1], m ? TERN_COMPUTE_F32 : TERN_COMPUTE_BF16);
            }
        tern_backend_close(g);
        return 0;
    }
    if (getenv("BENCH_GEMV1")) { /* n = 1 on the llama3-8b shapes, every format: new (v5) vs old kernel */
        static const int ls[][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
        static const struct { tern_dtype dt; int bits, gs; } fm[] = {
            {TERN_DT_BF16, 0, 0}, {TERN_DT_Q, 4, 64}, {TERN_DT_Q, 8, 64}, {TERN_DT_Q, 2, 64}, {TERN_DT_Q, 3, 64},
            {TERN_DT_Q, 5, 64}, {TERN_DT_Q, 6, 64}, {TERN_DT_Q, 4, 32}, {TERN_DT_Q, 4, 128}};
        static const int one[] = {1, 0};
        const int only_q4 = !strcmp(getenv("BENCH_GEMV1"), "q4"); /* BENCH_GEMV1=q4: q4 g64 only */
        const int wide = !strcmp(getenv("BENCH_GEMV1"), "wide"); /* =wide: q4, q8 and q2 / q3 / q5 / q6 g64 */
        for (size_t f = 0; f < sizeof fm / sizeof fm[0]; f++)
            for (int s = 0; s < 5; s++) {
                if ((only_q4 && f != 1) || (wide && (f < 1 || f > 6 || s == 1))) continue;
                if (f >= 3 && s != 0 && s != 3 && !wide) continue; /* other formats: one square, one wide shape */
                /* 0: tensor-core gemv_mma (Q4/Q8, and the other widths on XP1's walk), 1: gemv1, 2: the older kernel */
                const int mma_ok = fm[f].dt == TERN_DT_Q;
                for (int v = mma_ok ? 0 : 1; v < (s == 4 || wide ? 2 : 3); v++) {
                    tern__cuda_gemv_mma_on = v == 0 ? 2 : 0;
                    tern__cuda_gemv1_on = v <= 1;
                    g_only_var = v == 2 ? 4 : 5;
                    printf("[%s] ", v == 0 ? "mma" : v == 1 ? "gemv1" : "old");
                    bench_gemv(fm[f].dt, fm[f].bits, fm[f].gs, ls[s][0], ls[s][1], one);
                }
            }
        tern__cuda_gemv1_on = 1;
        tern__cuda_gemv_mma_on = 1;
        g_only_var = -1;
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--xr")) { /* llama3-8b shapes, q4, n = 1..128: before / qgemm / gemv_xr.cu (n <= 8) / qgemm_q4.cu (n >= 8) */
        static const int shp[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}}, nx[] = {1, 2, 4, 8, 16, 32, 64, 128, 0};
        xr_sweep = 1;
        for (int s = 0; s < 3; s++) bench_batched(TERN_DT_Q, 4, shp[s][0], shp[s][1], nx);
        tern_backend_close(g);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--xrw")) { /* the other widths (g64), n = 1..8: the one-row GEMV / qgemm / gemv_xr.cu */
        static const int shp[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}}, nx[] = {1, 2, 3, 4, 6, 8, 0};
        static const int wb[] = {2, 3, 5, 6, 8};
        xr_sweep = 1;
        for (int b = 0; b < 5; b++)
            for (int s = 0; s < 3; s++) bench_batched(TERN_DT_Q, wb[b], shp[s][0], shp[s][1], nx);
        tern_backend_close(g);
        return 0;
    }
    { /* llama3-8b shapes, bf16 compute mode: qgemm vs before; `bench_cuda --batched` stops here */
        split_sweep = getenv("BENCH_SPLIT") && getenv("BENCH_SPLIT")[0] == '1';
        static const int shp[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
        static const int nb[] = {1, 8, 16, 32, 64, 128, 0}, nq[] = {1, 8, 16, 32, 64, 128, 256, 512, 0};
        for (int s = 0; s < 3; s++) {
            bench_batched(TERN_DT_BF16, 0, shp[s][0], shp[s][1], nb);
            bench_batched(TERN_DT_Q, 4, shp[s][0], shp[s][1], nq);
        }
        if (argc > 1 && !strcmp(argv[1], "--batched")) {
            tern_backend_close(g);
            return 0;
        }
    }
    static const int shapes[][2] = {{8192, 8192}, {28672, 4096}, {4096, 14336}, {1024, 4096}};
    static const int n_all[] = {1, 2, 4, 8, 16, 0}, n_1_8[] = {1, 8, 0}, n_1[] = {1, 0};
    for (int s = 0; s < 4; s++) {
        const int *ns = s == 0 ? n_all : s == 3 ? n_1 : n_1_8;
        bench_gemv(TERN_DT_BF16, 0, 0, shapes[s][0], shapes[s][1], ns);
        bench_gemv(TERN_DT_Q, 4, 64, shapes[s][0], shapes[s][1], ns);
        bench_gemv(TERN_DT_Q, 8, 64, shapes[s][0], shapes[s][1], ns);
    }
    bench_gemv(TERN_DT_Q, 3, 64, 8192, 8192, n_1);
    bench_gemv(TERN_DT_Q, 6, 64, 8192, 8192, n_1);
    bench_gemv(TERN_DT_F32, 0, 0, 8192, 8192, n_1);
    bench_attn_decode(32, 8, 128, 8192, 1, TERN_KV_F32, "");
    bench_attn_decode(32, 8, 128, 4096, 16, TERN_KV_F32, "");
    bench_attn_decode(32, 4, 512, 4096, 4, TERN_KV_F32, "");
    bench_attn_prefill_all(32, 8, 128, 2048, 1);
    bench_attn_prefill_all(32, 8, 128, 8192, 1);
    bench_attn_prefill_all(16, 8, 256, 2048, 1);
    bench_attn_prefill_all(16, 8, 256, 8192, 1);
    bench_attn_prefill(32, 4, 512, 1024);
    bench_prefill(TERN_DT_BF16, 0, 8192, 8192, 2048, TERN_COMPUTE_BF16);
    bench_prefill(TERN_DT_BF16, 0, 8192, 8192, 2048, TERN_COMPUTE_F32);
    bench_prefill(TERN_DT_Q, 4, 8192, 8192, 2048, TERN_COMPUTE_BF16);
    bench_prefill(TERN_DT_Q, 4, 8192, 8192, 2048, TERN_COMPUTE_F32);
    tern_backend_close(g);
    return 0;
}
