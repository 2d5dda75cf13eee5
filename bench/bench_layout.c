/*
 * bench_layout.c — issue 2: does a Q int8 decode kernel (k_q4i8r / k_q8i8 through the kernel table's gemv)
 * stream faster when each weight row is one stream — its scales, its biases, then its codes, rows back to
 * back — than in the stored MLX layout (codes, scales and biases in three arrays: three streams per thread)?
 * NOTES (ae): not in the model, and the backend's opt-in repack (TERN_CPU_QIL) was removed in session 20's
 * review; this bench lays both layouts out itself.
 *
 * The same random codes / scales / biases are laid out both ways (per tensor, tern_aalloc + tern_advise_huge),
 * llama-shaped (default llama3-1b: per layer q, k, v, o, gate, up, down, then the head). Each pair runs the
 * long-lived bandwidth probe (tern_membw_run on a 1 GiB buffer opened at start), then every variant once in
 * rotating order; a variant = one layout x one prefetch distance, each matrix one pool run with every thread
 * taking a contiguous block of rows (the decode driver without its stealing), the kernel table's rows per
 * gemv call (1 for Q8 int8, else 4). `read` is the probe's readsum over the interleaved bytes. The kernels
 * are layout-agnostic (cpu_wrow carries three pointers per row), so the outputs of the two layouts are
 * compared bitwise after the run.
 *   --slab        the stored layout's scales / biases from one huge-page arena, as the synthetic store's slabs
 *                 (alone, arrays below 2 MB stay on 4 KB pages: that handicaps the stored layout, NOTES (ae))
 *   --var L:PF[:K],.. variants: s (stored) / i (interleaved) / r (read), prefetch bytes of codes ahead (0: none),
 *                 K the Q4 int8 kernel (tern__cpu_q4_seq_set: 0 4-row, 1 one-row default, 2 k_q4i8r with the L2 prefetch, 3 k_q4i8r);
 *                 default s:8192,i:8192,s:0,i:0,r; --mask M picks a subset (bit i = the i-th)
 *   --tokens N    passes over the whole sequence per variant and pair (default 3)
 * `vs 1st`: the median (and quartiles) over pairs of each variant's GB/s over the first variant's in the same
 * pair — the paired comparison this box's bandwidth swings (~2x within seconds) leave usable; repeat the
 * first variant later in --var for an A/A control.
 *   make build/bench_layout && build/bench_layout --slab --pairs 60 --tokens 1 --var s:8192,i:8192,s:8192,r --mask 15
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/kern.h"
#include "base/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

typedef struct mat {
    int out, in, ng;
    size_t rb, stride;                        /* code bytes per row; interleaved row stride */
    uint8_t *data, *sc, *bi;                  /* the stored layout */
    uint8_t *il;                              /* interleaved: per row scales, biases, codes */
} mat;

static int bits = 4;
static size_t tot_bytes;
/* --slab: the stored layout's scales and biases carved from one 2 MB-aligned, huge-page-advised arena, as the
 * synthetic store's 4 MB slabs do (its arrays are < 2 MB for most matrices; alone they stay on 4 KB pages) */
static uint8_t *slab, *slab_end;

static void *halloc(size_t n) {
    void *p = tern_aalloc(n);
    if (!p) { fprintf(stderr, "bench_layout: out of memory\n"); exit(1); }
    tern_advise_huge(p, n);
    return p;
}

static void make(mat *m, int out, int in) {
    m->out = out, m->in = in, m->ng = in / 64;
    m->rb = (size_t)in * (size_t)bits / 8;
    m->stride = m->rb + 4 * (size_t)m->ng;
    size_t db = (size_t)out * m->rb, sb = (size_t)out * (size_t)m->ng * 2;
    m->data = halloc(db), m->il = halloc((size_t)out * m->stride);
    if (slab && (size_t)(slab_end - slab) >= 2 * ((sb + 63) & ~(size_t)63)) {
        m->sc = slab, slab += (sb + 63) & ~(size_t)63;
        m->bi = slab, slab += (sb + 63) & ~(size_t)63;
    } else m->sc = halloc(sb), m->bi = halloc(sb);
    for (size_t i = 0; i + 8 <= db; i += 8) { uint64_t v = next_u64(); memcpy(m->data + i, &v, 8); }
    uint16_t *s = (uint16_t *)m->sc, *b = (uint16_t *)m->bi;
    for (size_t i = 0; i < sb / 2; i++) {
        uint64_t v = next_u64();
        s[i] = tern_f32_to_bf16(0.005f + (float)(v & 1023) * 1e-5f);
        b[i] = tern_f32_to_bf16(-0.05f + (float)((v >> 10) & 1023) * 1e-4f);
    }
    for (int o = 0; o < out; o++) {
        uint8_t *r = m->il + (size_t)o * m->stride;
        memcpy(r, m->sc + (size_t)o * m->ng * 2, (size_t)m->ng * 2);
        memcpy(r + m->ng * 2, m->bi + (size_t)o * m->ng * 2, (size_t)m->ng * 2);
        memcpy(r + m->ng * 4, m->data + (size_t)o * m->rb, m->rb);
    }
    tot_bytes += db + 2 * sb;
}

static cpu_wrow row_of(const mat *m, int il, int o) {
    cpu_wrow w = {.dtype = TERN_DT_Q, .sdtype = TERN_DT_BF16, .bits = bits, .gs = 64};
    if (il) {
        const uint8_t *r = m->il + (size_t)o * m->stride;
        w.scales = r, w.biases = r + m->ng * 2, w.data = r + m->ng * 4;
    } else {
        w.data = m->data + (size_t)o * m->rb;
        w.scales = m->sc + (size_t)o * m->ng * 2, w.biases = m->bi + (size_t)o * m->ng * 2;
    }
    return w;
}

typedef struct job {
    const tern_cpu_kern *k;
    const mat *m;
    int il;
    cpu_gx gx;
    float *y;
    int np; /* rows per gemv call: the kernel table's gemv_pass for the kind (0: 4), as the decode driver */
} job;

static void task(void *arg, int ith, int nth) {
    job *j = arg;
    const mat *m = j->m;
    int64_t lo, hi;
    tern__cpu_split(m->out, 16, ith, nth, &lo, &hi);
    cpu_wrow rows[4];
    const int np = j->np;
    for (int64_t o = lo; o < hi; o += np) {
        int nr = (int)(hi - o < np ? hi - o : np);
        for (int i = 0; i < nr; i++) rows[i] = row_of(m, j->il, (int)o + i);
        j->k->gemv(&j->gx, rows, nr, j->y + o);
    }
}

typedef struct rd_job { const tern_cpu_kern *k; const uint8_t *p; size_t n; double sink[64]; } rd_job;
static void rd_task(void *arg, int ith, int nth) {
    rd_job *j = arg;
    size_t units = j->n / 4096, lo = units * (size_t)ith / (size_t)nth * 4096, hi = units * (size_t)(ith + 1) / (size_t)nth * 4096;
    if (lo < hi) j->sink[ith & 63] += j->k->readsum((const float *)(j->p + lo), (hi - lo) / sizeof(float));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* variants (--var L:PF,..): layout s (stored) / i (interleaved) / r (readsum over the interleaved bytes) and the
 * prefetch distance in bytes of codes ahead (whole passes of 4 rows, as the decode driver; 0: none) */
#define NV_MAX 8
static int NV = 5;
static char vl[NV_MAX] = {'s', 'i', 's', 'i', 'r'};
static long vpf[NV_MAX] = {8192, 8192, 0, 0, 0};
static int vk[NV_MAX] = {-1, -1, -1, -1, -1, -1, -1, -1}; /* Q4 int8 kernel: tern__cpu_q4_seq_set (-1: TERN_CPU_Q4_SEQ) */
static char vn[NV_MAX][24];

int main(int argc, char **argv) {
    int H = 2048, KV = 512, I = 8192, L = 16, V = 128256, nth = 0, pairs = 5, want = 0x1f, ntok = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dims") && v) { if (sscanf(argv[++i], "%d,%d,%d,%d,%d", &H, &KV, &I, &L, &V) != 5) return 2; }
        else if (!strcmp(a, "--fmt") && v) { i++; bits = !strcmp(v, "q8") ? 8 : 4; }
        else if (!strcmp(a, "--threads") && v) nth = atoi(argv[++i]);
        else if (!strcmp(a, "--pairs") && v) pairs = atoi(argv[++i]);
        else if (!strcmp(a, "--var") && v) {
            NV = 0;
            for (char *q = argv[++i]; *q && NV < NV_MAX;) {
                vl[NV] = *q++;
                vpf[NV] = *q == ':' ? strtol(q + 1, &q, 10) : 0;
                vk[NV] = *q == ':' ? (int)strtol(q + 1, &q, 10) : -1;
                NV++;
                if (*q == ',') q++;
                else break;
            }
        }
        else if (!strcmp(a, "--slab")) {
            size_t n = (size_t)1 << 30; /* scales + biases of llama3-1b q4: ~43 MB; generous */
            uint8_t *p = NULL;
            if (posix_memalign((void **)&p, (size_t)2 << 20, n)) return 1;
            madvise(p, n, MADV_HUGEPAGE);
            slab = p, slab_end = p + n;
        }
        else if (!strcmp(a, "--tokens") && v) ntok = atoi(argv[++i]);
        else if (!strcmp(a, "--mask") && v) want = (int)strtol(argv[++i], NULL, 0);
        else { fprintf(stderr, "bench_layout: unknown argument %s\n", a); return 2; }
    }
    if (pairs < 1 || pairs > 256) pairs = 5;
    const tern_cpu_kern *k = tern__cpu_kern_pick();
    if (!k->gemv_prep) { fprintf(stderr, "bench_layout: no fused GEMV here\n"); return 1; }
    int nm = 7 * L + 1;
    mat *ms = calloc((size_t)nm, sizeof *ms);
    for (int l = 0; l < L; l++) {
        make(&ms[7 * l + 0], H, H); make(&ms[7 * l + 1], KV, H); make(&ms[7 * l + 2], KV, H); make(&ms[7 * l + 3], H, H);
        make(&ms[7 * l + 4], I, H); make(&ms[7 * l + 5], I, H); make(&ms[7 * l + 6], H, I);
    }
    make(&ms[7 * L], V, H);
    int mx = H > I ? H : I;
    float *x = tern_aalloc(sizeof(float) * (size_t)mx), *y = tern_aalloc(sizeof(float) * (size_t)V);
    float *y2 = tern_aalloc(sizeof(float) * (size_t)V);
    void *buf = tern_aalloc(CPU_GX_BUF);
    for (int i = 0; i < mx; i++) x[i] = (float)((i * 37) % 101) * 0.02f - 1.0f;
    cpu_gx gxh, gxi; /* prepared x for in = H and in = I (the same for both layouts) */
    void *bufi = tern_aalloc(CPU_GX_BUF);
    cpu_wrow r0 = row_of(&ms[0], 0, 0);
    if (!k->gemv_prep(&r0, H, 1, x, buf, &gxh) || !k->gemv_prep(&r0, I, 1, x, bufi, &gxi)) { fprintf(stderr, "no prep\n"); return 1; }
    int np = gxh.kind < (int)sizeof k->gemv_pass && k->gemv_pass[gxh.kind] ? k->gemv_pass[gxh.kind] : 4;
    tern_membw *bw = tern_membw_open((size_t)1 << 30);
    tern_pool *pool = tern_pool_create(nth);
    rd_job rj = {.k = k};
    printf("isa %s, threads %d, q%d g64 int8, dims H %d KV %d I %d L %d V %d, %.1f MB per layout\n", tern_cpu_isa_name(),
           nth ? nth : tern_cpu_count(), bits, H, KV, I, L, V, tot_bytes / 1e6);
    for (int vi = 0; vi < NV; vi++)
        snprintf(vn[vi], sizeof vn[vi], vl[vi] == 'r' ? "read" : "%s-pf%ld-k%d", vl[vi] == 'i' ? "il" : "sep", vpf[vi], vk[vi]);
    double r[NV_MAX][256], g[NV_MAX][256], pg[256], rel[NV_MAX][256];
    for (int p = -1; p < pairs; p++) {
        double probe = tern_membw_run(bw);
        for (int q = 0; q < NV; q++) {
            int vi = (q + (p < 0 ? 0 : p)) % NV;
            if (!(want >> vi & 1)) continue;
            tern__cpu_q4_seq_set(vk[vi]);
            double t0 = tern_time_s();
            for (int it = 0; it < ntok; it++)
            for (int i = 0; i < nm; i++) {
                const mat *m = &ms[i];
                if (vl[vi] == 'r') {
                    rj.p = m->il, rj.n = (size_t)m->out * m->stride;
                    tern_pool_run(pool, rd_task, &rj);
                    continue;
                }
                job j = {.k = k, .m = m, .il = vl[vi] == 'i', .gx = m->in == H ? gxh : gxi, .y = y, .np = np};
                if (vpf[vi] > 0) { /* the decode driver's distance: whole passes of 4 rows, >= pf bytes of codes ahead */
                    int64_t ahead = ((int64_t)(((size_t)vpf[vi] + m->rb - 1) / m->rb) + 3) / 4 * 4;
                    j.gx.pf_data = (ptrdiff_t)(ahead * (int64_t)(j.il ? m->stride : m->rb));
                    j.gx.pf_sb = (ptrdiff_t)(ahead * (int64_t)(j.il ? m->stride : (size_t)m->ng * 2));
                } else j.gx.pf_data = 0, j.gx.pf_sb = 0;
                tern_pool_run(pool, task, &j);
            }
            double dt = tern_time_s() - t0;
            if (p < 0) continue;
            g[vi][p] = (double)tot_bytes * ntok / dt / 1e9;
            r[vi][p] = g[vi][p] / probe;
            pg[p] = probe;
            printf("csv,%s,%d,%.2f,%.2f,%.3f\n", vn[vi], p, g[vi][p], probe, r[vi][p]);
        }
    }
    /* both layouts give the same outputs, bit for bit */
    int same = 1;
    for (int i = 0; i < nm && same; i++) {
        job a = {.k = k, .m = &ms[i], .il = 0, .gx = ms[i].in == H ? gxh : gxi, .y = y, .np = np};
        job b = a;
        b.il = 1, b.y = y2;
        tern_pool_run(pool, task, &a);
        tern_pool_run(pool, task, &b);
        same = !memcmp(y, y2, sizeof(float) * (size_t)ms[i].out);
    }
    for (int vi = 0; vi < NV; vi++) /* paired: each variant over the first one measured in the same pair */
        for (int p = 0; p < pairs; p++) rel[vi][p] = g[vi][p] / g[__builtin_ctz((unsigned)want)][p];
    qsort(pg, (size_t)pairs, sizeof *pg, cmp_d);
    printf("outputs bitwise equal: %s\nprobe median %.1f GB/s (%.1f-%.1f)\n%-9s %7s %6s %6s %6s\n", same ? "yes" : "NO", pg[pairs / 2], pg[0],
           pg[pairs - 1], "variant", "GB/s", "ratio", "min", "max");
    for (int vi = 0; vi < NV; vi++) {
        if (!(want >> vi & 1)) continue;
        qsort(r[vi], (size_t)pairs, sizeof(double), cmp_d);
        qsort(g[vi], (size_t)pairs, sizeof(double), cmp_d);
        qsort(rel[vi], (size_t)pairs, sizeof(double), cmp_d);
        printf("%-9s %7.1f %6.2f %6.2f %6.2f %8.3f %8.3f %8.3f\n", vn[vi], g[vi][pairs / 2], r[vi][pairs / 2], r[vi][0], r[vi][pairs - 1],
               rel[vi][pairs / 2], rel[vi][pairs / 4], rel[vi][3 * pairs / 4]);
    }
    tern_membw_close(bw);
    tern_pool_free(pool);
    return same ? 0 : 1;
}
