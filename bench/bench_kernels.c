/*
 * bench_kernels.c — CPU GEMV (decode, batch 1) throughput as a ratio to measured DRAM read
 * bandwidth.
 *
 * Decode streams the whole model once per token, so every weight byte comes from DRAM. To
 * measure that (and not the 480 MiB L3 of this machine), a kernel pass runs the GEMV over
 * as many distinct copies of the matrix as fill 2 x L3, back to back; the probe pass reads a
 * buffer of the same size (tern_membw_*). The bandwidth of shared machines drifts by ~2x
 * within seconds, so passes alternate — probe, kernel (exact), kernel (int8 mode, Q
 * formats) — and each (probe, kernel) pair gives one ratio = kernel bytes/s ÷ probe bytes/s.
 * Prints a table (median ratio over pairs, min, max) and "csv," lines with every pair.
 * --hot instead repeats one matrix (it stays in L3), the way llama.cpp's test-backend-ops
 * perf mode times MUL_MAT; use it only for comparisons with that (the ratio column then
 * shows the best kernel GB/s). --hot --threads 1 --shapes l2: one thread on an L2-resident
 * matrix, i.e. the compute ceiling of a kernel per core (timed in thread CPU time).
 *
 *   make bench && build/bench_kernels [--threads N] [--pairs P] [--hot] [--shapes all|big]
 *   TERN_CPU_GEMV=0 build/bench_kernels   # the tile-decode path (no fused GEMV), for before/after
 * --pf B1,B2,..: A/B of the fused GEMV's prefetch distance (bytes; 0 = the old fixed 1 KB):
 * every pair then runs each distance once, right after the probe, in a rotating order.
 * --q4 K1,K2,..: A/B of the Q4 int8 kernel (tern__cpu_q4_seq_set, TERN_CPU_Q4_SEQ's values), each pair runs every
 * K once in a rotating order like --pf (list one K twice for an A/A control; the summary then prints each K's
 * median GB/s and the median over pairs of K / K1 with quartiles).
 * --fmt bf16|q8g64|q4g64 and --mode exact|int8 restrict the table (shorter runs); --shape OUTxIN
 * replaces the shape list with one matrix (e.g. 128256x2048, a llama3-1b head).
 * --thp: madvise(MADV_HUGEPAGE) on the weight arenas before they are written (2 MB pages
 * where the kernel allows transparent huge pages), for A/B against 4 KB pages; each pair then
 * also reads the weight arena itself as a probe and the ratio is against that one.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kern.h"
#include "base/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct cfg { const char *name; tern_dtype dt; int bits; } cfg;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

/* Arena of random weight bytes: bf16 words keep |w| in [2^-8, 2) (no NaN, inf or subnormal). */
static void fill_bytes(uint8_t *d, size_t n) {
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v = next_u64();
        v = (v & 0x83ff83ff83ff83ffull) | 0x3c003c003c003c00ull; /* high byte of each word: 0x3c..0x3f | sign */
        memcpy(d + i, &v, 8);
    }
}

static void make_view(tern_tensor *t, const cfg *c, int out, int in, uint8_t *data, uint16_t *sc, uint16_t *bi) {
    memset(t, 0, sizeof *t);
    t->dtype = c->dt;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->device = -1;
    t->name = "bench";
    t->data = data;
    if (c->dt == TERN_DT_Q) {
        t->bits = c->bits;
        t->group_size = 64;
        t->sdtype = TERN_DT_BF16;
        t->scales = sc;
        t->biases = bi;
    }
}

static size_t weight_bytes(const tern_tensor *t) {
    size_t b = (size_t)t->shape[0] * tern_tensor_row_bytes(t);
    if (t->dtype == TERN_DT_Q) b += 2 * 2 * (size_t)t->shape[0] * (size_t)t->shape[1] / (size_t)t->group_size;
    return b;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* With one thread on a shared machine, time the thread's CPU time (other processes' time
 * slices do not count): that is the per-core compute ceiling. Otherwise wall time. */
static int use_cpu_time;
static double now_s(void) {
    if (!use_cpu_time) return tern_time_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --thp: the bandwidth probe's read pass over the (huge-page) weight arena itself, so the
 * floor and the kernels see the same page size (the library probe's buffer has 4 KB pages). */
typedef struct arena_rd { const float *p; size_t n; const tern_cpu_kern *k; double sink[64]; } arena_rd;
static void arena_task(void *arg, int ith, int nth) {
    arena_rd *a = arg;
    size_t lo = a->n / 4096 * (size_t)ith / (size_t)nth * 4096, hi = a->n / 4096 * (size_t)(ith + 1) / (size_t)nth * 4096;
    if (lo < hi) a->sink[ith & 63] += a->k->readsum(a->p + lo, hi - lo);
}
static double arena_probe(tern_pool *pool, arena_rd *a) {
    double t0 = tern_time_s();
    tern_pool_run(pool, arena_task, a);
    return (double)(a->n * sizeof(float)) / (tern_time_s() - t0) / 1e9;
}

/* one kernel pass over nv views; returns bytes/s in GB/s */
static double kernel_pass(tern_backend *be, float *y, const float *x, const tern_tensor *v, int nv, size_t wb) {
    double t0 = now_s();
    for (int i = 0; i < nv; i++) be->vt->matmul(be, y, x, 1, &v[i]);
    double dt = now_s() - t0;
    return (double)wb * nv / dt / 1e9;
}

static void stats(double *v, int n, double out[3]) { /* median, min, max */
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    out[0] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    out[1] = v[0];
    out[2] = v[n - 1];
}

/* "a,b,c" -> v[0..): at most max numbers; returns how many */
static int int_list(char *q, long *v, int max) {
    int n = 0;
    while (*q && n < max) {
        v[n++] = strtol(q, &q, 10);
        if (*q == ',') q++;
        else break;
    }
    return n;
}

int main(int argc, char **argv) {
    int nth = 0, pairs = 8, hot = 0, big = 0, npf = 0, only_mode = -1, thp = 0, one_out = 0, one_in = 0, nq4 = 0;
    long pfs[8], q4s[8];
    const char *only_fmt = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pf") && i + 1 < argc) { npf += int_list(argv[++i], pfs + npf, 8 - npf); continue; }
        if (!strcmp(argv[i], "--q4") && i + 1 < argc) { nq4 += int_list(argv[++i], q4s + nq4, 8 - nq4); continue; }
        if (!strcmp(argv[i], "--thp")) { thp = 1; continue; }
        if (!strcmp(argv[i], "--fmt") && i + 1 < argc) { only_fmt = argv[++i]; continue; }
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) { only_mode = !strcmp(argv[++i], "int8"); continue; }
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hot")) hot = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (sscanf(argv[++i], "%dx%d", &one_out, &one_in) != 2 || one_out < 1 || one_in < 1 || one_in % 128) {
                fprintf(stderr, "bench: --shape OUTxIN (IN a multiple of 128)\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) { i++; big = !strcmp(argv[i], "big") ? 1 : !strcmp(argv[i], "l2") ? 2 : 0; }
    }
    if (pairs < 1 || pairs > 64) pairs = 8;
    if (!npf) pfs[npf++] = -1; /* TERN_CPU_PF or the default */
    if (!nq4) q4s[nq4++] = -1; /* TERN_CPU_Q4_SEQ or the default */
    if (npf * nq4 > 8) { fprintf(stderr, "bench: at most 8 --pf x --q4 variants\n"); return 2; }
    use_cpu_time = hot && nth == 1;
    tern_backend_opts o = {.n_threads = nth};
    tern_backend *be = NULL;
    tern_error err = {0};
    if (tern_backend_cpu_open(&be, &o, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    tern_membw *bw = tern_membw_open(0);
    size_t arena = tern_membw_bytes(bw);
    uint8_t *data = tern_aalloc(arena);
    uint16_t *sc = tern_aalloc(arena / 8), *bi = tern_aalloc(arena / 8);
    if (!bw || !data || !sc || !bi) { fprintf(stderr, "bench: out of memory (%zu MB arena)\n", arena >> 20); return 1; }
    if (thp) {
        void *bufs[3] = {data, sc, bi};
        size_t lens[3] = {arena, arena / 8, arena / 8};
        for (int i = 0; i < 3; i++) { /* the whole 4 KB pages inside each buffer */
            uintptr_t a = ((uintptr_t)bufs[i] + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)bufs[i] + lens[i]) & ~(uintptr_t)4095;
            if (e > a && madvise((void *)a, e - a, MADV_HUGEPAGE)) perror("bench: madvise");
        }
    }
    fill_bytes(data, arena);
    tern_pool *apool = thp && !hot ? tern_pool_create(nth) : NULL;
    arena_rd ard = {(const float *)data, arena / sizeof(float), tern__cpu_kern_pick(), {0}};
    for (size_t i = 0; i < arena / 16; i++) { sc[i] = tern_f32_to_bf16(0.01f); bi[i] = tern_f32_to_bf16(-0.05f); }
    static const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {2816, 2112}, {2112, 2816}};
    static const cfg cfgs[] = {{"bf16", TERN_DT_BF16, 0}, {"q8g64", TERN_DT_Q, 8}, {"q4g64", TERN_DT_Q, 4}};
    const char *fu = getenv("TERN_CPU_GEMV");
    printf("isa %s, threads %d, cores %d, %s, fused gemv %s, %s, %s pass = %zu MiB\n", tern_cpu_isa_name(),
           nth ? nth : tern_cpu_count(), tern_cpu_count(), hot ? "HOT (one matrix, cache-resident)" : "cold (DRAM)",
           fu && fu[0] == '0' ? "off" : "on", thp ? "THP advised" : "4 KB pages", hot ? "kernel" : "probe/kernel", arena >> 20);
    printf("%-6s %-11s %-10s %7s %9s %10s %6s %6s %6s %9s\n", "fmt", "out x in", "mode", "MB", "kern GB/s", "probe GB/s",
           "ratio", "min", "max", "pf64 GF/s");
    printf("csv,fmt,out,in,mode,pf,pair,weight_bytes,views,kernel_gbs,probe_gbs,ratio\n");
    static const int l2shapes[][2] = {{256, 4096}, {64, 16384}}; /* fits L2: compute ceiling of one thread (use --hot) */
    int nshapes = one_out ? 1 : big == 1 ? 3 : big == 2 ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < nshapes; s++)
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            int out = one_out ? one_out : big == 2 ? l2shapes[s][0] : shapes[s][0];
            int in = one_out ? one_in : big == 2 ? l2shapes[s][1] : shapes[s][1];
            tern_tensor v0;
            make_view(&v0, &cfgs[c], out, in, data, sc, bi);
            size_t wb = weight_bytes(&v0), db = (size_t)out * tern_tensor_row_bytes(&v0), sb = wb - db;
            int nv = (int)(arena / db);
            if (hot && nv > 64) nv = 64 + (int)(((size_t)64 << 20) / wb); /* ~64 MB of work per pass */
            if (sb && (size_t)nv > arena / 8 / (sb / 2)) nv = (int)(arena / 8 / (sb / 2)); /* scales arena */
            if (nv < 1) continue;
            tern_tensor *views = calloc((size_t)nv, sizeof *views);
            for (int i = 0; i < nv; i++) {
                int k = hot ? 0 : i;
                make_view(&views[i], &cfgs[c], out, in, data + (size_t)k * db, sc + (size_t)k * sb / 4, bi + (size_t)k * sb / 4);
            }
            float *x = malloc(sizeof(float) * (size_t)in * 64), *y = malloc(sizeof(float) * (size_t)out * 64);
            for (size_t i = 0; i < (size_t)in * 64; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
            int nmodes = cfgs[c].dt == TERN_DT_Q ? 2 : 1, nvar = nmodes * npf * nq4;
            if (only_fmt && strcmp(only_fmt, cfgs[c].name)) { free(x); free(y); free(views); continue; }
            kernel_pass(be, y, x, views, nv < 4 ? nv : 4, wb); /* warm up */
            double r[16][64], kg[16][64], pg[64], pt[64];
            for (int p = 0; p < pairs; p++) {
                pg[p] = hot ? 1.0 : tern_membw_run(bw);
                if (apool) pt[p] = arena_probe(apool, &ard);
                for (int q = 0; q < nvar; q++) {
                    int vi = (q + p) % nvar, m = vi % nmodes; /* variant vi: pf vi / nmodes % npf, q4 vi / nmodes / npf, mode m */
                    if (only_mode >= 0 && nmodes == 2 && m != only_mode) continue;
                    tern_backend_cpu_set_int8(be, m);
                    tern__cpu_gemv_pf_set(pfs[vi / nmodes % npf]);
                    tern__cpu_q4_seq_set((int)q4s[vi / nmodes / npf]);
                    kg[vi][p] = kernel_pass(be, y, x, views, nv, wb);
                    r[vi][p] = kg[vi][p] / (apool ? pt[p] : pg[p]); /* --thp: against the same page size */
                    printf("csv,%s,%d,%d,%s,%ld,%d,%zu,%d,%.2f,%.2f,%.3f,q4=%ld\n", cfgs[c].name, out, in, m ? "int8" : "exact",
                           pfs[vi / nmodes % npf], p, wb, nv, kg[vi][p], pg[p], r[vi][p], q4s[vi / nmodes / npf]);
                }
                tern_backend_cpu_set_int8(be, 0);
                tern__cpu_gemv_pf_set(-1);
                tern__cpu_q4_seq_set(-1);
            }
            double t0 = tern_time_s();
            be->vt->matmul(be, y, x, 64, &views[0]);
            double gflops = 2.0 * 64 * out * (double)in / (tern_time_s() - t0) / 1e9;
            double ps[3];
            stats(pg, pairs, ps);
            if (apool) {
                double ts[3];
                stats(pt, pairs, ts);
                printf("%-6s probe on the THP arena: %.1f GB/s median (%.1f-%.1f); 4 KB-page probe %.1f\n", cfgs[c].name, ts[0], ts[1],
                       ts[2], ps[0]);
            }
            for (int vi = 0; vi < nvar; vi++) {
                int m = vi % nmodes;
                if (only_mode >= 0 && nmodes == 2 && m != only_mode) continue;
                double rs[3], ks[3];
                stats(r[vi], pairs, rs);
                stats(kg[vi], pairs, ks);
                char dims[32], mode[48];
                snprintf(dims, sizeof dims, "%dx%d", out, in);
                int n = snprintf(mode, sizeof mode, "%s", m ? "int8" : "exact");
                if (pfs[vi / nmodes % npf] >= 0) n += snprintf(mode + n, sizeof mode - (size_t)n, "/%ld", pfs[vi / nmodes % npf]);
                if (q4s[vi / nmodes / npf] >= 0) snprintf(mode + n, sizeof mode - (size_t)n, "/k%ld", q4s[vi / nmodes / npf]);
                printf("%-6s %-11s %-10s %7.1f %9.1f %10.1f %6.2f %6.2f %6.2f %9.1f", cfgs[c].name, dims, mode,
                       wb / 1e6, ks[0], hot ? 0.0 : ps[0], hot ? ks[2] : rs[0], hot ? 0.0 : rs[1], hot ? 0.0 : rs[2], gflops);
                if (nq4 > 1 && vi >= nmodes) { /* paired: this variant / the first --q4 variant of the same mode */
                    double q[64];
                    for (int p = 0; p < pairs; p++) q[p] = kg[vi][p] / kg[m][p];
                    qsort(q, (size_t)pairs, sizeof *q, cmp_d);
                    int wins = 0;
                    for (int p = 0; p < pairs; p++) wins += q[p] > 1.0;
                    printf("  / k%ld: %.3f [%.3f-%.3f] %d of %d", q4s[0], q[pairs / 2], q[pairs / 4], q[(3 * pairs) / 4], wins, pairs);
                }
                printf("\n");
            }
            fflush(stdout);
            free(x); free(y); free(views);
        }
    tern_membw_close(bw);
    tern_pool_free(apool);
    tern_afree(data); tern_afree(sc); tern_afree(bi);
    tern_backend_close(be);
    return 0;
}
