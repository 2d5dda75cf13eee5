/*
 * bench_seq.c — one decode token's GEMVs of a llama-shaped model in model order, against the
 * same matrices called one at a time and against the bandwidth probe's own read kernel over the
 * same bytes, each as a ratio to a paired memory-bandwidth probe.
 *
 * bench_kernels times one shape repeated over copies in one arena; `tern bench` times whole
 * tokens. This sits between them (issue 2: the model's GEMVs streamed at ~0.5-0.65 of the probe
 * while one GEMV alone was reported at ~0.87; NOTES (ac)): the weights are allocated per tensor
 * as the synthetic model does (tern_aalloc + tern_advise_huge, random bytes), and every pair
 * runs the probe, then each variant (× each --cfg) once in a rotating order:
 *   tok   per layer matmul_n(q|k|v), matmul_add(o), matmul_glu(gate, up), matmul_add(down);
 *         then the head (matmul): the calls llama.c makes at batch 1, nothing between them;
 *   mlp   matmul_glu of every layer only (2 x I x H per call);
 *   one   vt->matmul over every layer's gate then up (I x H each, = bench_kernels' repeat);
 *   head  the head alone (V x H);
 *   gaps  as tok, with a single-threaded pass over a 16 KB buffer between calls (the model's
 *         rmsnorm / rope / attention run between its GEMVs; the pool's worker may sleep);
 *   read  the probe's readsum over each matrix's weight bytes in tok's order, halves per thread
 *         (what the memory gives this access pattern with no arithmetic);
 *   fresh tern_cpu_membw_probe (1 GiB): `tern bench`'s floor probe, a fresh buffer each call, best of 3
 *         (GB/s as it reports them); fresh1: a fresh buffer of the paired probe's size, one pass;
 *   model --model PRESET: the real model (synthetic weights, same backend) decoding --tokens
 *         tokens through tern_generate, timed as tern bench does (GB/s from tok's bytes).
 * GB/s counts weight bytes (+ Q scales/biases) per token × --tokens. Geometry: --dims
 * H,KV,I,L,V (default llama3-1b 2048,512,8192,16,128256); --fmt bf16|q8|q4 (group 64, BF16
 * scales), --int8, --bf16 (the bf16 mode), --nx N (tok only: N rows of x a call, a decode step of N sequences; GB/s
 * still counts the weights once a step), --threads N, --pairs P, --only tok,one,.. (a subset), --gap-us U (default
 * 100). --cfg NR:PF:X4,..: A/B inside one process — rows per GEMV call (0: the kernel table's
 * default; tern__cpu_dec_nr_set), prefetch bytes (-1: default; tern__cpu_gemv_pf_set), the
 * former 4-row BF16 kernel (1 on, 0 off, -1 TERN_CPU_BF16_X4; tern__cpu_bf16_x4_set); an optional 4th field
 * NR:PF:X4:Q4 picks the Q4 int8 kernel (tern__cpu_q4_seq_set, TERN_CPU_Q4_SEQ's values; -1: the env); a 5th
 * NR:PF:X4:Q4:S sets session 21's switches as a mask (s21_set below; -1: the env).
 *   make build/bench_seq && build/bench_seq --model llama3-1b --tokens 3 --only tok,model,read --cfg 4:-1:1,0:-1:0
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/kern.h"
#include "base/pool.h"
#include "io/config.h"
#include "io/presets.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { V_TOK, V_MLP, V_ONE, V_HEAD, V_GAPS, V_MODEL, V_READ, V_FRESH, V_FRESH1, NVAR };
static const char *const vname[NVAR] = {"tok", "mlp", "one", "head", "gaps", "model", "read", "fresh", "fresh1"};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static tern_dtype fdt = TERN_DT_BF16;
static int fbits;
static size_t total_bytes;

/* Arrays below 2 MB (scales, biases) from 2 MB-aligned, huge-page-advised 4 MB slabs, as the synthetic store
 * carves them (alone they stay on 4 KB pages, which slowed the stored Q layout's scale streams, NOTES (ae)). */
static void *small_alloc(size_t n) {
    static uint8_t *slab, *end;
    void *p;
    if (n >= ((size_t)2 << 20)) {
        p = tern_aalloc(n);
        if (p) tern_advise_huge(p, n);
    } else {
        n = (n + 63) & ~(size_t)63;
        if (!slab || (size_t)(end - slab) < n) {
            if (posix_memalign((void **)&slab, (size_t)2 << 20, (size_t)4 << 20)) slab = NULL;
            if (slab) { madvise(slab, (size_t)4 << 20, MADV_HUGEPAGE); end = slab + ((size_t)4 << 20); }
        }
        p = slab;
        if (slab) slab += n;
    }
    if (!p) { fprintf(stderr, "bench_seq: out of memory\n"); exit(1); }
    return p;
}

/* One matrix in its own allocation(s), like the synthetic store: bf16 words with |w| in
 * [2^-8, 2), or random codes with scale 0.01 / bias -0.05. */
static void make(tern_tensor *t, int out, int in) {
    memset(t, 0, sizeof *t);
    t->dtype = fdt;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->device = -1;
    t->name = "seq";
    if (fdt == TERN_DT_Q) { t->bits = fbits; t->group_size = 64; t->sdtype = TERN_DT_BF16; }
    size_t db = (size_t)out * tern_tensor_row_bytes(t);
    uint8_t *d = tern_aalloc(db);
    if (!d) { fprintf(stderr, "bench_seq: out of memory\n"); exit(1); }
    tern_advise_huge(d, db);
    for (size_t i = 0; i + 8 <= db; i += 8) {
        uint64_t v = next_u64();
        if (fdt == TERN_DT_BF16) v = (v & 0x83ff83ff83ff83ffull) | 0x3c003c003c003c00ull;
        memcpy(d + i, &v, 8);
    }
    t->data = d;
    total_bytes += db;
    if (fdt != TERN_DT_Q) return;
    size_t ng = (size_t)out * (size_t)in / 64;
    uint16_t *sc = small_alloc(ng * 2), *bi = small_alloc(ng * 2);
    for (size_t i = 0; i < ng; i++) { sc[i] = tern_f32_to_bf16(0.01f); bi[i] = tern_f32_to_bf16(-0.05f); }
    t->scales = sc;
    t->biases = bi;
    total_bytes += 4 * ng;
}

static size_t wbytes(const tern_tensor *t) {
    size_t b = (size_t)t->shape[0] * tern_tensor_row_bytes(t);
    return t->dtype == TERN_DT_Q ? b + 4 * (size_t)t->shape[0] * (size_t)t->shape[1] / 64 : b;
}

typedef struct layer { tern_tensor q, k, v, o, g, u, d; } layer;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* read: the probe's kernel (readsum) over each matrix's weight bytes in model order, halves per thread */
typedef struct rd_job { const tern_cpu_kern *k; const uint8_t *p; size_t n; double sink[64]; } rd_job;
static void rd_task(void *arg, int ith, int nth) {
    rd_job *j = arg;
    size_t units = j->n / 4096, lo = units * (size_t)ith / (size_t)nth * 4096, hi = units * (size_t)(ith + 1) / (size_t)nth * 4096;
    if (lo < hi) j->sink[ith & 63] += j->k->readsum((const float *)(j->p + lo), (hi - lo) / sizeof(float));
}
static void rd(tern_pool *pool, rd_job *j, const tern_tensor *t) {
    j->p = t->data;
    j->n = (size_t)t->shape[0] * tern_tensor_row_bytes(t);
    tern_pool_run(pool, rd_task, j);
}

static volatile float gap_sink;
static void gap(const float *buf, int us) { /* single-threaded work between calls, ~us µs */
    if (us <= 0) return;
    double t0 = tern_time_s();
    float s = 0;
    while ((tern_time_s() - t0) * 1e6 < us)
        for (int i = 0; i < 4096; i++) s += buf[i];
    gap_sink = s;
}

#define MAXCFG 6
static int cnr[MAXCFG] = {0}, ncfg = 1;
static long cpf[MAXCFG] = {-1};
static int cx4[MAXCFG] = {-1};
static int cq4[MAXCFG] = {-1, -1, -1, -1, -1, -1}; /* Q4 int8 kernel (tern__cpu_q4_seq_set; -1: TERN_CPU_Q4_SEQ) */
static int cs21[MAXCFG] = {-1, -1, -1, -1, -1, -1}; /* session 21's switches, a mask (s21_set; -1: their env) */

/* The 5th --cfg field: bit 0 the sample op's argmax (tern__cpu_argmax_set), bit 1 the q|k|v op with rope and the
 * cache writes inside its run (tern__cpu_qkv_rope_set), bit 2 matmul_glu's split order (tern__cpu_glu_split_set),
 * bit 3 several x through the kernel table's gemv_nx (tern__cpu_gemv_nx_set);
 * -1 leaves them to their environment variables. */
static void s21_set(int m) {
    tern__cpu_argmax_set(m < 0 ? -1 : m & 1);
    tern__cpu_qkv_rope_set(m < 0 ? -1 : (m >> 1) & 1);
    tern__cpu_glu_split_set(m < 0 ? -1 : (m >> 2) & 1);
    tern__cpu_gemv_nx_set(m < 0 ? -1 : (m >> 3) & 1);
}

int main(int argc, char **argv) {
    int H = 2048, KV = 512, I = 8192, L = 16, V = 128256, nth = 0, pairs = 5, int8 = 0, bf16 = 0, nx = 1, gap_us = 100;
    int want[NVAR] = {1, 1, 1, 1, 1, 0, 1, 0, 0}, ntok = 1;
    const char *preset = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dims") && v) { if (sscanf(argv[++i], "%d,%d,%d,%d,%d", &H, &KV, &I, &L, &V) != 5) return 2; }
        else if (!strcmp(a, "--fmt") && v) {
            i++;
            if (!strcmp(v, "q8")) { fdt = TERN_DT_Q; fbits = 8; }
            else if (!strcmp(v, "q4")) { fdt = TERN_DT_Q; fbits = 4; }
        }
        else if (!strcmp(a, "--int8")) int8 = 1;
        else if (!strcmp(a, "--bf16")) bf16 = 1;
        else if (!strcmp(a, "--nx") && v) nx = atoi(argv[++i]);
        else if (!strcmp(a, "--model") && v) { preset = argv[++i]; }
        else if (!strcmp(a, "--tokens") && v) ntok = atoi(argv[++i]);
        else if (!strcmp(a, "--cfg") && v) { /* NR:PF,NR:PF,..: rows per pass (0: 4) and prefetch bytes (-1: default) */
            ncfg = 0;
            for (char *q = argv[++i]; *q && ncfg < MAXCFG;) {
                cnr[ncfg] = (int)strtol(q, &q, 10);
                cpf[ncfg] = *q == ':' ? strtol(q + 1, &q, 10) : -1;
                cx4[ncfg] = *q == ':' ? (int)strtol(q + 1, &q, 10) : -1;
                cq4[ncfg] = *q == ':' ? (int)strtol(q + 1, &q, 10) : -1;
                cs21[ncfg] = *q == ':' ? (int)strtol(q + 1, &q, 10) : -1;
                ncfg++;
                if (*q == ',') q++;
                else break;
            }
        }
        else if (!strcmp(a, "--threads") && v) nth = atoi(argv[++i]);
        else if (!strcmp(a, "--pairs") && v) pairs = atoi(argv[++i]);
        else if (!strcmp(a, "--gap-us") && v) gap_us = atoi(argv[++i]);
        else if (!strcmp(a, "--only") && v) {
            for (int k = 0; k < NVAR; k++) { /* exact names in the comma list */
                size_t n = strlen(vname[k]);
                want[k] = 0;
                for (const char *q = v; *q; q += strcspn(q, ",") + (q[strcspn(q, ",")] == ','))
                    if (strcspn(q, ",") == n && !strncmp(q, vname[k], n)) want[k] = 1;
            }
            i++;
        }
        else { fprintf(stderr, "bench_seq: unknown argument %s\n", a); return 2; }
    }
    if (pairs < 1 || pairs > 64) pairs = 5;
    if (nx < 1 || nx > 16) nx = 1;
    tern_backend_opts o = {.n_threads = nth};
    tern_backend *be = NULL;
    tern_error err = {0};
    if (tern_backend_cpu_open(&be, &o, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    tern_backend_cpu_set_int8(be, int8);
    tern_backend_cpu_set_bf16(be, bf16);
    layer *ly = calloc((size_t)L, sizeof *ly);
    tern_tensor head;
    for (int l = 0; l < L; l++) {
        make(&ly[l].q, H, H); make(&ly[l].k, KV, H); make(&ly[l].v, KV, H); make(&ly[l].o, H, H);
        make(&ly[l].g, I, H); make(&ly[l].u, I, H); make(&ly[l].d, H, I);
    }
    make(&head, V, H);
    tern_model *model = NULL;
    tern_kv *kv = NULL;
    tern_model_config mcfg;
    tern_weights *ws = NULL;
    int32_t ids[8];
    if (preset) { /* the real model on the same backend: decode steps of tern_generate */
        const char *js = tern_preset_config(preset);
        tern_synth_spec spec = {.bits = fdt == TERN_DT_Q ? fbits : 0, .group_size = 64};
        memset(&mcfg, 0, sizeof mcfg);
        tern_status st = js ? tern_config_parse(&mcfg, js, strlen(js), preset, &err) : TERN_EINVAL;
        if (!st) st = tern_weights_open_synth(&ws, &mcfg, &spec, &err);
        tern_model_opts mo = {0};
        if (!st) st = tern_model_load_from(&model, &mcfg, ws, be, &mo, &err);
        tern_kv_opts ko = {.n_slots = 1, .max_ctx = 64};
        if (!st) st = tern_kv_open(&kv, be, &mcfg, &ko, &err);
        if (st) { fprintf(stderr, "bench_seq: %s\n", err.msg); return 1; }
        for (int i = 0; i < 8; i++) ids[i] = (i * 7919 + 2) % mcfg.n_vocab;
        want[V_MODEL] = 1;
    }
    tern_membw *bw = tern_membw_open(0);
    tern_pool *rpool = tern_pool_create(nth);
    rd_job rj = {.k = tern__cpu_kern_pick()};
    const size_t N = (size_t)nx; /* rows of x per call (--nx: a decode step of nx sequences) */
    float *x = tern_aalloc(sizeof(float) * (size_t)I * N), *yq = tern_aalloc(sizeof(float) * (size_t)H * 3 * N);
    float *yk = yq + H * N, *yv = yk + H * N, *ym = tern_aalloc(sizeof(float) * (size_t)I * N);
    float *res = tern_aalloc(sizeof(float) * (size_t)H * N);
    float *logits = tern_aalloc(sizeof(float) * (size_t)V * N), *gbuf = tern_aalloc(sizeof(float) * 4096);
    if (!bw || !x || !yq || !ym || !res || !logits || !gbuf) { fprintf(stderr, "bench_seq: out of memory\n"); return 1; }
    for (size_t i = 0; i < (size_t)I * N; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f + 0.01f * (float)(i / (size_t)I);
    memset(res, 0, sizeof(float) * (size_t)H * N);
    memset(gbuf, 0, sizeof(float) * 4096);
    size_t vb[NVAR] = {0};
    for (int l = 0; l < L; l++) {
        size_t lb = wbytes(&ly[l].q) + wbytes(&ly[l].k) + wbytes(&ly[l].v) + wbytes(&ly[l].o) + wbytes(&ly[l].g) +
                    wbytes(&ly[l].u) + wbytes(&ly[l].d);
        vb[V_TOK] += lb;
        vb[V_MLP] += wbytes(&ly[l].g) + wbytes(&ly[l].u);
    }
    vb[V_TOK] += wbytes(&head);
    vb[V_GAPS] = vb[V_TOK];
    vb[V_ONE] = vb[V_MLP];
    vb[V_HEAD] = wbytes(&head);
    vb[V_MODEL] = vb[V_TOK];
    vb[V_READ] = vb[V_TOK];
    vb[V_FRESH] = (size_t)1 << 30;
    vb[V_FRESH1] = tern_membw_bytes(bw);
    for (int vi = 0; vi < V_FRESH; vi++) vb[vi] *= (size_t)ntok;
    printf("isa %s, threads %d, %s%s, dims H %d KV %d I %d L %d V %d, %.1f MB of weights, probe %zu MiB, gap %d us\n",
           tern_cpu_isa_name(), nth ? nth : tern_cpu_count(), fdt == TERN_DT_BF16 ? "bf16" : fbits == 8 ? "q8g64" : "q4g64",
           int8 ? " int8" : "", H, KV, I, L, V, total_bytes / 1e6, tern_membw_bytes(bw) >> 20, gap_us);
    printf("csv,variant,nr,pf,pair,gbs,probe_gbs,ratio\n");
    double r[NVAR * MAXCFG][64], kg[NVAR * MAXCFG][64], pg[64];
    const int nall = NVAR * ncfg;
    for (int p = -1; p < pairs; p++) { /* p = -1: warm-up, not recorded */
        double probe = tern_membw_run(bw);
        for (int q = 0; q < nall; q++) {
            int xi = (q + (p < 0 ? 0 : p)) % nall, vi = xi % NVAR, ci = xi / NVAR;
            if (!want[vi]) continue;
            tern__cpu_dec_nr_set(cnr[ci]);
            tern__cpu_gemv_pf_set(cpf[ci]);
            tern__cpu_bf16_x4_set(cx4[ci]);
            tern__cpu_q4_seq_set(cq4[ci]);
            s21_set(cs21[ci]);
            double t0 = tern_time_s();
            double dt = -1;
            if (vi == V_FRESH) { /* tern bench's floor probe: a fresh 1 GiB buffer, best of 3 */
                double g = tern_cpu_membw_probe((size_t)1 << 30);
                dt = g > 0 ? (double)vb[vi] / (g * 1e9) : 1;
            } else if (vi == V_FRESH1) { /* a fresh buffer of the probe's size, its first timed pass */
                tern_membw *fb = tern_membw_open(0);
                double g = tern_membw_run(fb);
                tern_membw_close(fb);
                dt = g > 0 ? (double)vb[vi] / (g * 1e9) : 1;
            } else if (vi == V_MODEL) {
                tern_gen_stats st = {0};
                tern_generate(model, kv, 0, ids, 4, ntok + 1, 0, NULL, 0, NULL, NULL, NULL, NULL, &st, &err);
                tern_kv_release(kv, 0);
                dt = st.t_decode;
            } else for (int it = 0; it < ntok; it++) if (vi == V_READ) {
                for (int l = 0; l < L; l++) {
                    rd(rpool, &rj, &ly[l].q); rd(rpool, &rj, &ly[l].k); rd(rpool, &rj, &ly[l].v); rd(rpool, &rj, &ly[l].o);
                    rd(rpool, &rj, &ly[l].g); rd(rpool, &rj, &ly[l].u); rd(rpool, &rj, &ly[l].d);
                }
                rd(rpool, &rj, &head);
            } else if (vi == V_TOK || vi == V_GAPS) {
                int gu = vi == V_GAPS ? gap_us : 0;
                for (int l = 0; l < L; l++) {
                    const tern_tensor *w3[3] = {&ly[l].q, &ly[l].k, &ly[l].v};
                    float *y3[3] = {yq, yk, yv};
                    gap(gbuf, gu);
                    be->vt->matmul_n(be, 3, y3, x, nx, w3);
                    gap(gbuf, gu);
                    be->vt->matmul_add(be, res, x, nx, &ly[l].o);
                    gap(gbuf, gu);
                    be->vt->matmul_glu(be, ym, x, nx, &ly[l].g, &ly[l].u, TERN_ACT_SILU);
                    be->vt->matmul_add(be, res, x, nx, &ly[l].d); /* x: its first H of I inputs stand in */
                }
                gap(gbuf, gu);
                be->vt->matmul(be, logits, x, nx, &head);
            } else if (vi == V_MLP) {
                for (int l = 0; l < L; l++) be->vt->matmul_glu(be, ym, x, 1, &ly[l].g, &ly[l].u, TERN_ACT_SILU);
            } else if (vi == V_ONE) {
                for (int l = 0; l < L; l++) { be->vt->matmul(be, ym, x, 1, &ly[l].g); be->vt->matmul(be, ym, x, 1, &ly[l].u); }
            } else be->vt->matmul(be, logits, x, 1, &head);
            if (dt < 0) dt = tern_time_s() - t0;
            double g = (double)vb[vi] / dt / 1e9;
            if (p < 0) continue;
            kg[xi][p] = g;
            r[xi][p] = g / probe;
            pg[p] = probe;
            char vtag[32]; /* with several --cfg: variant.cN (N = the cfg's index) */
            snprintf(vtag, sizeof vtag, ncfg > 1 ? "%s.c%d" : "%s", vname[vi], ci);
            printf("csv,%s,%d,%ld,%d,%.2f,%.2f,%.3f\n", vtag, cnr[ci], cpf[ci], p, g, probe, g / probe);
        }
    }
    qsort(pg, (size_t)pairs, sizeof *pg, cmp_d);
    printf("probe median %.1f GB/s (%.1f-%.1f)\n%-5s %3s %7s %2s %9s %7s %6s %6s %6s\n", pg[pairs / 2], pg[0], pg[pairs - 1], "var", "nr",
           "pf", "x4", "GB/s", "MB", "ratio", "min", "max");
    for (int xi = 0; xi < nall; xi++) {
        int vi = xi % NVAR, ci = xi / NVAR;
        if (!want[vi]) continue;
        qsort(r[xi], (size_t)pairs, sizeof(double), cmp_d);
        qsort(kg[xi], (size_t)pairs, sizeof(double), cmp_d);
        printf("%-5s %3d %7ld %2d %9.1f %7.1f %6.2f %6.2f %6.2f\n", vname[vi], cnr[ci], cpf[ci], cx4[ci], kg[xi][pairs / 2], vb[vi] / 1e6,
               r[xi][pairs / 2], r[xi][0], r[xi][pairs - 1]);
    }
    tern_membw_close(bw);
    tern_pool_free(rpool);
    tern_kv_close(kv);
    tern_model_free(model);
    tern_weights_close(ws);
    if (preset) tern_config_free(&mcfg);
    tern_backend_close(be);
    return 0;
}
