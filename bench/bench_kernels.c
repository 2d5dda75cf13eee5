/*
 * bench_kernels.c — CPU GEMV (decode, batch 1) throughput vs a memory-read probe.
 *
 * For each matrix (4096×4096, 2816×2112, ...) in bf16, q8 g64 and q4 g64 it alternates a
 * read-bandwidth probe over a buffer of the same size with timed matmul runs, because the
 * bandwidth of shared machines drifts by 2× within seconds: each (probe, kernel) pair gives
 * one ratio = kernel bytes/s ÷ probe bytes/s. It prints a table (median ratio over pairs)
 * and CSV lines ("csv,...") with every pair. Also a small prefill (n=64) point per format.
 *
 *   make bench && build/bench_kernels [--threads N] [--pairs P]
 */
#include "backend/cpu/cpu.h"
#include "base/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cfg { const char *name; tern_dtype dt; int bits; } cfg;

static void fill_weight(tern_tensor *t, tern_dtype dt, int bits, int out, int in, void **bufs) {
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->device = -1;
    t->name = "bench";
    size_t rb = dt == TERN_DT_Q ? (size_t)in * bits / 8 : (size_t)in * 2;
    uint8_t *d = malloc((size_t)out * rb);
    for (size_t i = 0; i < (size_t)out * rb; i++) d[i] = (uint8_t)(i * 2654435761u >> 13);
    if (dt == TERN_DT_BF16)
        for (size_t i = 0; i < (size_t)out * in; i++) ((uint16_t *)d)[i] = tern_f32_to_bf16((float)((i * 7919) % 2000) / 1000.0f - 1.0f);
    t->data = d;
    bufs[0] = d;
    if (dt == TERN_DT_Q) {
        size_t ng = (size_t)out * in / 64;
        uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
        for (size_t i = 0; i < ng; i++) { s[i] = tern_f32_to_bf16(0.01f); b[i] = tern_f32_to_bf16(-0.05f); }
        t->bits = bits;
        t->group_size = 64;
        t->sdtype = TERN_DT_BF16;
        t->scales = s;
        t->biases = b;
        bufs[1] = s;
        bufs[2] = b;
    }
}

static size_t weight_bytes(const tern_tensor *t) {
    size_t b = (size_t)t->shape[0] * tern_tensor_row_bytes(t);
    if (t->dtype == TERN_DT_Q) b += 2 * 2 * (size_t)t->shape[0] * (size_t)t->shape[1] / (size_t)t->group_size;
    return b;
}

static double time_mm(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int iters) {
    double best = 1e30;
    for (int i = 0; i < iters; i++) {
        double t0 = tern_time_s();
        be->vt->matmul(be, y, x, n, w);
        double dt = tern_time_s() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int nth = 0, pairs = 6;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--threads")) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pairs")) pairs = atoi(argv[++i]);
    }
    if (pairs < 1 || pairs > 64) pairs = 6;
    tern_backend_opts o = {.n_threads = nth};
    tern_backend *be = NULL;
    tern_error err = {0};
    if (tern_backend_cpu_open(&be, &o, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    static const int shapes[][2] = {{4096, 4096}, {2816, 2112}, {2112, 2816}, {14336, 4096}};
    static const cfg cfgs[] = {{"bf16", TERN_DT_BF16, 0}, {"q8g64", TERN_DT_Q, 8}, {"q4g64", TERN_DT_Q, 4}};
    printf("isa %s, threads %d (probe uses all %d cores)\n", tern_cpu_isa_name(), nth ? nth : tern_cpu_count(), tern_cpu_count());
    printf("%-6s %-11s %8s %9s %9s %8s %8s %8s %10s\n", "fmt", "out x in", "MB", "kern GB/s", "probe GB/s", "ratio", "min", "max", "pf64 GF/s");
    printf("csv,fmt,out,in,pair,weight_bytes,kernel_s,kernel_gbs,probe_gbs,ratio\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            int out = shapes[s][0], in = shapes[s][1];
            tern_tensor w;
            void *bufs[3] = {0};
            fill_weight(&w, cfgs[c].dt, cfgs[c].bits, out, in, bufs);
            size_t wb = weight_bytes(&w);
            float *x = malloc(sizeof(float) * (size_t)in * 64), *y = malloc(sizeof(float) * (size_t)out * 64);
            for (size_t i = 0; i < (size_t)in * 64; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
            time_mm(be, y, x, 1, &w, 2); /* warm up */
            double ratios[64], kg[64], pg[64];
            for (int p = 0; p < pairs; p++) {
                pg[p] = tern_cpu_membw_probe(wb);
                double dt = time_mm(be, y, x, 1, &w, 5);
                kg[p] = (double)wb / dt / 1e9;
                ratios[p] = kg[p] / pg[p];
                printf("csv,%s,%d,%d,%d,%zu,%.6f,%.2f,%.2f,%.3f\n", cfgs[c].name, out, in, p, wb, dt, kg[p], pg[p], ratios[p]);
            }
            double pf = time_mm(be, y, x, 64, &w, 2);
            double gflops = 2.0 * 64 * out * (double)in / pf / 1e9;
            double sr[64];
            memcpy(sr, ratios, sizeof(double) * (size_t)pairs);
            qsort(sr, (size_t)pairs, sizeof(double), cmp_d);
            qsort(kg, (size_t)pairs, sizeof(double), cmp_d);
            qsort(pg, (size_t)pairs, sizeof(double), cmp_d);
            char dims[32];
            snprintf(dims, sizeof dims, "%dx%d", out, in);
            printf("%-6s %-11s %8.1f %9.1f %9.1f %8.2f %8.2f %8.2f %10.1f\n", cfgs[c].name, dims, wb / 1e6, kg[pairs / 2],
                   pg[pairs / 2], sr[pairs / 2], sr[0], sr[pairs - 1], gflops);
            fflush(stdout);
            free(x); free(y);
            for (int i = 0; i < 3; i++) free(bufs[i]);
        }
    tern_backend_close(be);
    return 0;
}
