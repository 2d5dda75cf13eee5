/*
 * concurrency.c — throughput and latency of the engine versus concurrency, and the
 * prefix-cache speed-up on a shared long system prompt (issue 5's benchmark).
 *
 *   build/concurrency [MODEL | --random PRESET[:qB] [--quant qB]] [--device cpu|cuda] [--threads N]
 *       [--conc 1,4,16,64] [--prompt N] [--gen N] [--system N] [--requests N]
 *       [--max-batch-tokens N] [--kv-quant SPEC] [--compute f32|bf16|bf16x2|int8] [--gpus N] [--one-engine] [--no-prefix]
 *
 * For each concurrency C: an engine with C slots gets C requests at once (distinct random
 * prompts of --prompt tokens, greedy, --gen tokens, EOS ignored) and is stepped until all are
 * done. Reported: aggregate output tok/s over the whole run, aggregate decode tok/s in the
 * steady part (tokens after the last request's first token / the time after it), TTFT
 * p50/p99 (submit -> first token), inter-token latency p50/p99 (all gaps of all requests), and
 * the decode floor: C tokens per step of the bytes a C-row step reads (every weight once; routed
 * experts as many as C tokens touch under uniform routing; each sequence's KV at the mean decode
 * context) at the bandwidth probed before and after the run (`tern bench`'s: the GPU's copy rate,
 * a 1 GiB read on the CPU), and dec tok/s over it.
 * Prefix cache: --requests requests, one after another, each = the same --system tokens + 16
 * own tokens, with the prompt cache off and on: mean TTFT of the requests after the first,
 * hit rate (cached / prompt tokens) and the speed-up. Prints a table and CSV lines ("csv,").
 * --gpus N: tensor/expert-parallel ranks (tern_engine_opts.gpus). --one-engine: one engine with the largest C's slots
 * serves every C (no re-load between them: a full-size model's load takes minutes), --no-prefix skips the prefix part.
 * Every engine open prints its time to ready ("engine ready in S s": weights mapped or synthesized and uploaded,
 * KV allocated).
 */
#include "tern.h"
#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "ops/ops.h"
#include "runtime/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GEN 4096

typedef struct req {
    double t_submit, t_tok[MAX_GEN];
    uint64_t digest; /* FNV-1a over the generated ids (greedy runs compare across settings) */
    int n;
    int done, failed, n_cached;
} req;

static int on_event(void *ctx, const tern_event *ev) {
    req *r = ctx;
    if (ev->kind == TERN_EV_TOKEN) {
        if (r->n < MAX_GEN) r->t_tok[r->n++] = tern_time_s();
        r->digest = (r->digest ^ (uint32_t)ev->token) * 1099511628211ULL;
    }
    else { r->done = 1; r->n_cached = ev->n_cached; r->failed = ev->kind == TERN_EV_ERROR; if (r->failed && ev->err) fprintf(stderr, "request: %s\n", ev->err->msg); }
    return 0;
}

static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static double pct(double *v, int n, double p) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

typedef struct args {
    const char *model, *device, *kv_quant;
    int threads, prompt, gen, system, requests, mbt, gpus, one_engine, no_prefix;
    int conc[16], n_conc;
    int bf16; /* --compute: 0 f32, 1 bf16, 2 bf16x2, 3 int8; -1 (default) bf16 on a GPU, f32 on the CPU */
} args;

static tern_engine *open_engine(const args *a, int conc, int ctx, double cache_gb) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = a->model;
    o.device = a->device;
    o.n_threads = a->threads;
    o.max_concurrency = conc;
    o.max_ctx = ctx;
    o.max_batch_tokens = a->mbt;
    o.compute_bf16 = a->bf16;
    o.prompt_cache_gb = cache_gb;
    o.gpus = a->gpus;
    if (a->kv_quant) o.kv_quant = a->kv_quant;
    tern_engine *e = NULL;
    tern_error err = {0};
    const double t0 = tern_time_s();
    if (tern_engine_open(&e, &o, &err)) { fprintf(stderr, "engine: %s\n", err.msg); return NULL; }
    printf("engine ready in %.2f s (%d slots, context %d)\n", tern_time_s() - t0, conc, ctx);
    printf("csv,ready,%s,%s,%d,%.3f\n", a->model, a->device, conc, tern_time_s() - t0);
    return e;
}

static void fill(int32_t *p, int n, int vocab, unsigned long long seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = 3 + (int32_t)((seed >> 33) % (unsigned long long)(vocab - 3));
    }
}

static int submit(tern_engine *e, const int32_t *p, int n, int gen, req *r) {
    tern_request q = tern_request_default();
    q.prompt = p;
    q.n_prompt = n;
    q.max_tokens = gen;
    q.sampling.temperature = 0;
    q.ignore_eos = 1;
    q.on_event = on_event;
    q.ctx = r;
    tern_error err = {0};
    r->t_submit = tern_time_s();
    if (tern_engine_submit(e, &q, NULL, &err)) { fprintf(stderr, "submit: %s\n", err.msg); return -1; }
    return 0;
}

static int drain(tern_engine *e) {
    tern_error err = {0};
    while (tern_engine_pending(e))
        if (tern_engine_step(e, &err)) { fprintf(stderr, "step: %s\n", err.msg); return -1; }
    return 0;
}

/* The floor's bandwidth, GB/s, as `tern bench` measures it: the backend's device-to-device copy rate on a GPU (bytes
 * read plus written), a fresh 1 GiB read on the CPU. 0 when it cannot be measured. */
static double probe(tern_engine *e) {
    tern_backend *be = tern__engine_backend(e);
    if (!be) return 0;
    if (be->device < 0) return tern_cpu_membw_probe((size_t)1 << 30);
    return be->vt->copy_rate ? be->vt->copy_rate(be, (size_t)512 << 20) : 0;
}

static int run_conc(const args *a, int C, tern_engine *shared) {
    tern_engine *e = shared ? shared : open_engine(a, C, a->prompt + a->gen + 8, 0);
    if (!e) return -1;
    tern_model_info mi;
    tern_engine_model_info(e, &mi);
    req *rs = calloc((size_t)C, sizeof *rs);
    for (int i = 0; i < C; i++) rs[i].digest = 14695981039346656037ULL;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)a->prompt * (size_t)C);
    double *ttft = malloc(sizeof(double) * (size_t)C), *itl = malloc(sizeof(double) * (size_t)C * (size_t)a->gen);
    if (!rs || !p || !ttft || !itl) { fprintf(stderr, "out of memory\n"); return -1; }
    for (int i = 0; i < C; i++) fill(p + (size_t)i * a->prompt, a->prompt, mi.n_vocab, 1000 + (unsigned long long)i);
    const double bw0 = probe(e);
    double t0 = tern_time_s();
    for (int i = 0; i < C; i++) if (submit(e, p + (size_t)i * a->prompt, a->prompt, a->gen, &rs[i])) return -1;
    if (drain(e)) return -1;
    double t1 = tern_time_s(), t_allfirst = 0, t_end = 0;
    const double bw = (bw0 + probe(e)) / 2;
    /* the decode floor: C sequences' step (weights once, the experts C tokens touch, each sequence's KV at the mean
     * decode context) at the probed bandwidth */
    const double step_bytes = tern__engine_step_bytes(e, C, a->prompt + a->gen / 2);
    const double floor_tps = bw > 0 && step_bytes > 0 ? C * bw * 1e9 / step_bytes : 0;
    long total = 0, steady = 0;
    int n_itl = 0;
    for (int i = 0; i < C; i++) {
        if (rs[i].failed || rs[i].n == 0) { fprintf(stderr, "request %d failed\n", i); return -1; }
        ttft[i] = rs[i].t_tok[0] - rs[i].t_submit;
        t_allfirst = TERN_MAX(t_allfirst, rs[i].t_tok[0]);
        t_end = TERN_MAX(t_end, rs[i].t_tok[rs[i].n - 1]);
        total += rs[i].n;
        for (int k = 1; k < rs[i].n; k++) itl[n_itl++] = rs[i].t_tok[k] - rs[i].t_tok[k - 1];
    }
    for (int i = 0; i < C; i++) for (int k = 0; k < rs[i].n; k++) steady += rs[i].t_tok[k] > t_allfirst;
    double out_tps = total / (t1 - t0), dec_tps = t_end > t_allfirst ? steady / (t_end - t_allfirst) : 0;
    double tt50 = pct(ttft, C, 0.5), tt99 = pct(ttft, C, 0.99), it50 = pct(itl, n_itl, 0.5), it99 = pct(itl, n_itl, 0.99);
    const double ratio = floor_tps > 0 ? dec_tps / floor_tps : 0;
    printf("%5d %10.2f %10.2f %10.1f %10.1f %10.1f %10.1f %8.2f %8.1f %10.1f %8.3f\n", C, out_tps, dec_tps, tt50 * 1e3,
           tt99 * 1e3, it50 * 1e3, it99 * 1e3, t1 - t0, bw, floor_tps, ratio);
    /* fields 2-13 as before; appended: bandwidth GB/s, floor tok/s, dec / floor */
    printf("csv,conc,%s,%s,%d,%d,%d,%.3f,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.4f\n", a->model, a->device, C, a->prompt,
           a->gen, out_tps, dec_tps, tt50 * 1e3, tt99 * 1e3, it50 * 1e3, it99 * 1e3, bw, floor_tps, ratio);
    uint64_t dg = 14695981039346656037ULL; /* the requests' digests in submit order */
    for (int i = 0; i < C; i++) dg = (dg ^ rs[i].digest) * 1099511628211ULL;
    printf("ids digest %d requests: %016llx\n", C, (unsigned long long)dg);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    printf("steps %lld, %lld of them queued before the previous step's ids came back (TERN_ASYNC)\n", st.steps,
           st.steps_queued);
    fflush(stdout);
    free(rs); free(p); free(ttft); free(itl);
    if (!shared) tern_engine_close(e);
    return 0;
}

static int run_prefix(const args *a) {
    printf("\nprefix cache: %d requests one after another, shared system prompt of %d tokens + 16 own, %d generated\n",
           a->requests, a->system, a->gen);
    printf("%-6s %12s %12s %10s\n", "cache", "TTFT ms", "total s", "hit rate");
    double mean[2] = {0, 0};
    for (int on = 0; on < 2; on++) {
        tern_engine *e = open_engine(a, 1, a->system + 16 + a->gen + 8, on ? 1.0 : 0);
        if (!e) return -1;
        tern_model_info mi;
        tern_engine_model_info(e, &mi);
        int n = a->system + 16;
        int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
        req *r = calloc(1, sizeof *r);
        if (!p || !r) return -1;
        fill(p, a->system, mi.n_vocab, 7);
        double t0 = tern_time_s(), sum = 0;
        for (int i = 0; i < a->requests; i++) {
            fill(p + a->system, 16, mi.n_vocab, 100 + (unsigned long long)i);
            memset(r, 0, sizeof *r);
            if (submit(e, p, n, a->gen, r) || drain(e) || r->failed || !r->n) return -1;
            if (i > 0) sum += r->t_tok[0] - r->t_submit;   /* the first request fills the cache */
            if (getenv("BENCH_VERBOSE")) fprintf(stderr, "  request %d: %d cached tokens\n", i, r->n_cached);
        }
        double t1 = tern_time_s();
        tern_engine_stats st;
        tern_engine_get_stats(e, &st);
        mean[on] = a->requests > 1 ? sum / (a->requests - 1) : 0;
        printf("%-6s %12.1f %12.2f %10.3f\n", on ? "on" : "off", mean[on] * 1e3, t1 - t0, st.prefix_hit_rate);
        printf("csv,prefix,%s,%s,%d,%d,%s,%.2f,%.3f\n", a->model, a->device, a->system, a->requests, on ? "on" : "off",
               mean[on] * 1e3, st.prefix_hit_rate);
        free(p); free(r);
        tern_engine_close(e);
    }
    printf("TTFT speed-up with the prefix cache: %.2fx\n", mean[1] > 0 ? mean[0] / mean[1] : 0);
    return 0;
}

int main(int argc, char **argv) {
    args a = {.model = "demo", .device = "cpu", .prompt = 64, .gen = 32, .system = 1024, .requests = 8, .mbt = 0,
              .conc = {1, 4, 16, 64}, .n_conc = 4, .bf16 = -1};
    static char rnd[128];
    const char *quant = NULL; /* --quant q4: tern-core bench's spelling of --random PRESET:q4 */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int has = v != NULL;
        if (!strcmp(f, "--device") && has) { a.device = v; i++; }
        else if (!strcmp(f, "--random") && has) { snprintf(rnd, sizeof rnd, "random:%s", v); a.model = rnd; i++; }
        else if (!strcmp(f, "--quant") && has) { quant = v; i++; }
        else if (!strcmp(f, "--threads") && has) { a.threads = atoi(v); i++; }
        else if (!strcmp(f, "--prompt") && has) { a.prompt = atoi(v); i++; }
        else if (!strcmp(f, "--gen") && has) { a.gen = atoi(v); i++; }
        else if (!strcmp(f, "--system") && has) { a.system = atoi(v); i++; }
        else if (!strcmp(f, "--requests") && has) { a.requests = atoi(v); i++; }
        else if (!strcmp(f, "--max-batch-tokens") && has) { a.mbt = atoi(v); i++; }
        else if (!strcmp(f, "--kv-quant") && has) { a.kv_quant = v; i++; }
        else if (!strcmp(f, "--gpus") && has) { a.gpus = atoi(v); i++; }
        else if (!strcmp(f, "--one-engine")) a.one_engine = 1;
        else if (!strcmp(f, "--no-prefix")) a.no_prefix = 1;
        else if (!strcmp(f, "--compute") && has) { a.bf16 = !strcmp(v, "int8") ? 3 : !strcmp(v, "bf16x2") ? 2 : !strcmp(v, "bf16"); i++; }
        else if (!strcmp(f, "--conc") && has) {
            a.n_conc = 0;
            for (const char *s = v; *s && a.n_conc < 16;) {
                a.conc[a.n_conc++] = atoi(s);
                s = strchr(s, ',');
                if (!s) break;
                s++;
            }
            i++;
        } else if (f[0] != '-') a.model = f;
        else { fprintf(stderr, "concurrency: unknown or incomplete argument '%s'\n", f); return 2; }
    }
    if (quant) {
        if (a.model != rnd || strchr(rnd, ':' ) != strrchr(rnd, ':')) {
            fprintf(stderr, "concurrency: --quant needs --random PRESET (without its own :qB)\n");
            return 2;
        }
        const size_t l = strlen(rnd);
        snprintf(rnd + l, sizeof rnd - l, ":%s", quant);
    }
    if (a.prompt < 1 || a.gen < 2 || a.gen > MAX_GEN || a.system < 16 || a.requests < 2 || a.mbt < 0) {
        fprintf(stderr, "concurrency: need --prompt >= 1, 2 <= --gen <= %d, --system >= 16, --requests >= 2\n", MAX_GEN);
        return 2;
    }
    for (int i = 0; i < a.n_conc; i++) if (a.conc[i] < 1 || a.conc[i] > 4096) { fprintf(stderr, "concurrency: bad --conc\n"); return 2; }
    if (a.gpus < 0 || a.gpus > 64) { fprintf(stderr, "concurrency: bad --gpus\n"); return 2; }
    char mbt[64];
    snprintf(mbt, sizeof mbt, a.mbt ? "%d" : "the engine's (GPU 8192, 2048 under 70 GiB; CPU 512)", a.mbt);
    printf("model %s, device %s, prompt %d, gen %d, max batch tokens %s\n", a.model, a.device, a.prompt, a.gen, mbt);
    printf("%5s %10s %10s %10s %10s %10s %10s %8s %8s %10s %8s\n", "conc", "out tok/s", "dec tok/s", "TTFT p50", "TTFT p99",
           "ITL p50", "ITL p99", "wall s", "bw GB/s", "floor t/s", "dec/flr");
    tern_engine *one = NULL;
    if (a.one_engine) {
        int cmax = 1;
        for (int i = 0; i < a.n_conc; i++) cmax = TERN_MAX(cmax, a.conc[i]);
        if (!(one = open_engine(&a, cmax, a.prompt + a.gen + 8, 0))) return 1;
    }
    for (int i = 0; i < a.n_conc; i++) if (run_conc(&a, a.conc[i], one)) return 1;
    tern_engine_close(one);
    if (!a.no_prefix && run_prefix(&a)) return 1;
    return 0;
}
