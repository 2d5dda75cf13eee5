/*
 * bench_model_prefill.c — CPU prefill GEMM throughput on the matmul shapes of a real model
 * (llama3-1b: q/o 2048x2048, k/v 512x2048, gate/up 8192x2048, down 2048x8192; out x in),
 * as GFLOP/s and as a fraction of this machine's f32 FMA peak, measured in the same run.
 *
 * Peak: a dependent-free loop of 24 FMA chains on full-width vectors (AVX-512 when the CPU
 * has it, else AVX2), timed in thread CPU time, so it reads FMAs/cycle × clock of one core
 * however busy the machine is; × threads gives the machine peak. The GEMM is timed the same
 * way with --threads 1 (the per-core ceiling: other processes' time slices do not count);
 * with more threads wall time is used, which on a shared machine includes the neighbours.
 * Each format runs over a per-layer set of the shapes (FLOPs weighted like one layer of the
 * model) after a warm-up; reps alternate formats so drift hits all of them alike.
 *
 *   make bench && build/bench_model_prefill [--threads N] [--rows 128] [--reps 5]
 *   TERN_CPU_GEMM=0 build/bench_model_prefill   # the old tile-decode path, for before/after
 */
#include "backend/cpu/cpu.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct fmt { const char *name; tern_dtype dt; int bits; } fmt;

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 24 independent FMA chains (zero operands: no denormal assists), 24 FMAs per iteration. */
#define F8(R, a, b, c, d, e, f, g, h) "vfmadd231ps %%" R "1, %%" R "2, %%" R a "\n vfmadd231ps %%" R "1, %%" R "2, %%" R b \
    "\n vfmadd231ps %%" R "1, %%" R "2, %%" R c "\n vfmadd231ps %%" R "1, %%" R "2, %%" R d "\n vfmadd231ps %%" R "1, %%" R "2, %%" R e \
    "\n vfmadd231ps %%" R "1, %%" R "2, %%" R f "\n vfmadd231ps %%" R "1, %%" R "2, %%" R g "\n vfmadd231ps %%" R "1, %%" R "2, %%" R h "\n"
__attribute__((target("avx512f"))) static void fma512(long iters) {
    __asm__ volatile("vpxord %%zmm1, %%zmm1, %%zmm1\n vpxord %%zmm2, %%zmm2, %%zmm2\n" ::: "xmm1", "xmm2");
    for (long it = 0; it < iters; it++)
        __asm__ volatile(F8("zmm", "3", "4", "5", "6", "7", "8", "9", "10") F8("zmm", "11", "12", "13", "14", "15", "16", "17", "18")
                         F8("zmm", "19", "20", "21", "22", "23", "24", "25", "26")::: "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                         "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
                         "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26");
}
__attribute__((target("avx2,fma"))) static void fma256(long iters) { /* 12 chains: 16 ymm registers */
    __asm__ volatile("vpxor %%ymm1, %%ymm1, %%ymm1\n vpxor %%ymm2, %%ymm2, %%ymm2\n" ::: "xmm1", "xmm2");
    for (long it = 0; it < iters; it++)
        __asm__ volatile(F8("ymm", "3", "4", "5", "6", "7", "8", "9", "10") F8("ymm", "11", "12", "13", "14", "3", "4", "5", "6")
                         F8("ymm", "7", "8", "9", "10", "11", "12", "13", "14")::: "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                         "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14");
}

/* f32 GFLOP/s of one core (best of 5), counting an FMA lane as 2 flops. */
static double fma_peak(int *lanes) {
    int w512 = __builtin_cpu_supports("avx512f"), best_lanes = w512 ? 16 : 8;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        long iters = 2000000;
        double t0 = cpu_s();
        if (w512) fma512(iters);
        else fma256(iters);
        double dt = cpu_s() - t0;
        double g = 24.0 * iters * best_lanes * 2 / dt / 1e9;
        if (g > best) best = g;
    }
    *lanes = best_lanes;
    return best;
}

static void make_weight(tern_tensor *t, const fmt *f, int out, int in, uint64_t *rng) {
    memset(t, 0, sizeof *t);
    t->dtype = f->dt;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->device = -1;
    t->name = "bench";
    size_t rb = tern_tensor_row_bytes(t);
    if (f->dt == TERN_DT_Q) {
        t->bits = f->bits;
        t->group_size = 64;
        t->sdtype = TERN_DT_BF16;
        rb = tern_tensor_row_bytes(t);
        size_t ng = (size_t)out * (size_t)in / 64;
        uint16_t *sc = malloc(ng * 2), *bi = malloc(ng * 2);
        for (size_t i = 0; i < ng; i++) { sc[i] = tern_f32_to_bf16(0.01f); bi[i] = tern_f32_to_bf16(-0.05f); }
        t->scales = sc;
        t->biases = bi;
    }
    size_t nb = (size_t)out * rb;
    uint8_t *d = malloc(nb + 8);
    for (size_t i = 0; i < nb; i += 8) {
        uint64_t v = (*rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17);
        if (f->dt == TERN_DT_BF16) v = (v & 0x83ff83ff83ff83ffull) | 0x3c003c003c003c00ull; /* |w| in [2^-8, 2) */
        if (f->dt == TERN_DT_F32) v = (v & 0x83ffffff83ffffffull) | 0x3c0000003c000000ull;  /* same range */
        memcpy(d + i, &v, 8);
    }
    t->data = d;
}

static void free_weight(tern_tensor *t) {
    free((void *)t->data);
    free((void *)t->scales);
    free((void *)t->biases);
}

int main(int argc, char **argv) {
    int nth = 1, rows = 128, reps = 5;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fmt") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "usage: bench_model_prefill [--threads N] [--rows N] [--reps N] [--fmt f32|bf16|q8g64|q4g64]\n"); return 2; }
    }
    if (nth < 1 || rows < 1 || reps < 1 || reps > 100) { fprintf(stderr, "bad arguments\n"); return 2; }
    tern_backend_opts o = {.n_threads = nth};
    tern_backend *be = NULL;
    tern_error err = {0};
    if (tern_backend_cpu_open(&be, &o, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    static const int shapes[][3] = {{2048, 2048, 2}, {512, 2048, 2}, {8192, 2048, 2}, {2048, 8192, 1}}; /* out, in, count */
    static const fmt fmts[] = {{"f32", TERN_DT_F32, 0}, {"bf16", TERN_DT_BF16, 0}, {"q8g64", TERN_DT_Q, 8}, {"q4g64", TERN_DT_Q, 4}};
    enum { NF = sizeof fmts / sizeof fmts[0], NS = sizeof shapes / sizeof shapes[0] };
    tern_tensor w[NF][NS];
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    size_t max_in = 8192, max_out = 8192;
    for (int f = 0; f < NF; f++)
        for (int s = 0; s < NS; s++) make_weight(&w[f][s], &fmts[f], shapes[s][0], shapes[s][1], &rng);
    float *x = malloc(sizeof(float) * max_in * (size_t)rows), *y = malloc(sizeof(float) * max_out * (size_t)rows);
    for (size_t i = 0; i < max_in * (size_t)rows; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
    int lanes;
    double peak1 = fma_peak(&lanes);
    const char *g = getenv("TERN_CPU_GEMM");
    printf("isa %s, threads %d, rows %d, path %s; f32 FMA peak %.1f GFLOP/s per core (%d lanes), %.1f for %d threads\n",
           tern_cpu_isa_name(), nth, rows, g && g[0] == '0' ? "tile-decode (TERN_CPU_GEMM=0)" : "blocked GEMM", peak1, lanes,
           peak1 * nth, nth);
    double gf[NF][100], shape_gf[NF][NS];
    int skip[NF] = {0};
    for (int f = 0; f < NF; f++) skip[f] = only && strcmp(only, fmts[f].name);
    for (int f = 0; f < NF; f++) /* warm up */
        if (!skip[f])
        for (int s = 0; s < NS; s++) be->vt->matmul(be, y, x, rows, &w[f][s]);
    for (int r = 0; r < reps; r++)
        for (int f = 0; f < NF; f++) {
            if (skip[f]) continue;
            double flops = 0, tt = 0;
            for (int s = 0; s < NS; s++) {
                double t0 = nth == 1 ? cpu_s() : wall_s();
                for (int c = 0; c < shapes[s][2]; c++) be->vt->matmul(be, y, x, rows, &w[f][s]);
                double dt = (nth == 1 ? cpu_s() : wall_s()) - t0;
                double fl = 2.0 * rows * shapes[s][0] * (double)shapes[s][1] * shapes[s][2];
                flops += fl;
                tt += dt;
                if (r == 0 || fl / dt / 1e9 > shape_gf[f][s]) shape_gf[f][s] = fl / dt / 1e9;
            }
            gf[f][r] = flops / tt / 1e9;
            printf("csv,%s,%d,%d,%d,%.2f\n", fmts[f].name, nth, rows, r, gf[f][r]);
        }
    printf("%-6s %12s %12s %8s   best per shape (GFLOP/s): %s\n", "fmt", "layer GF/s", "best GF/s", "of peak",
           "2048x2048 512x2048 8192x2048 2048x8192");
    for (int f = 0; f < NF; f++) {
        if (skip[f]) continue;
        double best = 0, sum = 0;
        for (int r = 0; r < reps; r++) { sum += gf[f][r]; if (gf[f][r] > best) best = gf[f][r]; }
        printf("%-6s %12.1f %12.1f %7.0f%%  ", fmts[f].name, sum / reps, best, 100.0 * best / (peak1 * nth));
        for (int s = 0; s < NS; s++) printf(" %9.1f", shape_gf[f][s]);
        printf("\n");
    }
    for (int f = 0; f < NF; f++)
        for (int s = 0; s < NS; s++) free_weight(&w[f][s]);
    free(x); free(y);
    tern_backend_close(be);
    return 0;
}
