/*
 * cmd_bench.c — `tern bench MODEL [--prompt N[,N..]] [--gen N] [--reps R] [--warmup W] [--chunk N]`: prefill and decode
 * tokens/s, reported against the floor: bytes one decode step reads (weights + the KV cache at the
 * mean decode context, sliding layers at their window) over the memory read bandwidth measured
 * right before and after each timed run (this machine's bandwidth moves). On a GPU the probe is the
 * backend's device-to-device copy rate (vt->copy_rate: 512 MiB copies, bytes read plus written, best
 * of 3 timed rounds), the issue-4 definition of the floor's bandwidth; --bw GB/s overrides it.
 * Several prompt lengths run on one loaded model, after one untimed warm-up run (--warmup 0 skips it):
 * the first run pays one-time costs (cuBLASLt algorithm choice, decode-graph capture, first touch of
 * scratch) that made a lone first prompt read 2.6x slow on the H200. --chunk N: prefill rows per
 * forward (the model's scratch is sized for it; default tern_model_default_batch: 8192 on a GPU of 70+ GiB,
 * 2048 on smaller ones, 512 on the CPU, as the engine's --max-batch-tokens). Prints a table and one CSV
 * line per run (prefix "csv,"; field 11 is the KV MB of the floor).
 * On the CPU the floor is reported twice. `bw GB/s` / `tg/floor`: tern_cpu_membw_probe, a 1 GiB buffer
 * allocated, written and read (best of 3 short passes) before and after each run — fresh memory, read in a burst.
 * `ll GB/s` / `tg/ll`: a sustained read of one 1 GiB buffer allocated when the bench starts and kept (long-lived
 * memory, as the weights are), right after each run, pass after pass for as long as that run's decode took (at
 * least 3 passes): bytes over elapsed time; CSV fields 12 and 13 (CPU only). tg/ll is the honest ratio: the same
 * kind of memory read for the same time as the decode. On this project's 2-core VM a 1 s read gets ~0.82 of the
 * best-of-3 burst (bench/NOTES.md (ae)) and fresh memory read 1.1-1.7x faster than long-lived in (ac).
 */
#include "backend/cpu/cpu.h"
#include "cli.h"
#include "cli_util.h"
#include "runtime/experts.h"
#include "runtime/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double probe(int on_cpu, tern_backend *be) {
    if (on_cpu) return tern_cpu_membw_probe((size_t)1 << 30);
    return be && be->vt->copy_rate ? be->vt->copy_rate(be, (size_t)512 << 20) : 0.0;
}

/* The long-lived sustained probe: passes over the buffer opened at the bench's start until `secs` have
 * elapsed (at least 3), bytes over time (0 without a buffer). */
static double probe_ll(tern_membw *ll, double secs) {
    if (!ll) return 0.0;
    double t0 = tern_time_s(), dt = 0;
    int n = 0;
    do {
        tern_membw_run(ll);
        n++;
        dt = tern_time_s() - t0;
    } while (n < 3 || dt < secs);
    return dt > 0 ? (double)n * (double)tern_membw_bytes(ll) / dt / 1e9 : 0.0;
}

int tern_cmd_bench(int argc, char **argv) {
    cli_common c = {0};
    long n_prompt = 128, n_gen = 32, reps = 3, warmup = 1, chunk = 0; /* --chunk: prefill rows per forward (0: the model's) */
    long prompts[16];
    int n_prompts = 0;
    double bw_given = 0; /* --bw GB/s: the floor's bandwidth when it cannot be probed (GPU) */
    int probe_only = 0;  /* --probe: print the memory read bandwidth and exit (peer benchmarks) */
    for (int i = 1; i < argc; i++) {
        int r = cli_common_flag(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--prompt") && v) { /* N or a comma list */
            n_prompts = 0;
            for (const char *p = v; *p;) {
                if (n_prompts == 16) return cli_usage_error("bench", "--prompt takes at most 16 lengths");
                char tok[32];
                size_t len = strcspn(p, ",");
                snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
                if (cli_int("bench", a, tok, 1, 1 << 20, &prompts[n_prompts])) return 2;
                n_prompts++;
                p += len + (p[len] == ',');
            }
            i++;
        }
        else if (!strcmp(a, "--gen") && v) { if (cli_int("bench", a, v, 1, 1 << 20, &n_gen)) return 2; i++; }
        else if (!strcmp(a, "--bw") && v) { bw_given = atof(v); if (bw_given <= 0) return cli_usage_error("bench", "--bw expects GB/s > 0"); i++; }
        else if (!strcmp(a, "--reps") && v) { if (cli_int("bench", a, v, 1, 1000, &reps)) return 2; i++; }
        else if (!strcmp(a, "--warmup") && v) { if (cli_int("bench", a, v, 0, 100, &warmup)) return 2; i++; }
        else if (!strcmp(a, "--chunk") && v) { if (cli_int("bench", a, v, 1, 65536, &chunk)) return 2; c.max_batch = (int)chunk; i++; }
        else if (!strcmp(a, "--probe")) probe_only = 1;
        else if (a[0] != '-' && !c.model) c.model = a;
        else return cli_usage_error("bench", "unknown or incomplete argument '%s'", a);
    }
    if (probe_only) {
        printf("membw %.2f GB/s\n", probe(1, NULL));
        return 0;
    }
    if (!c.model) c.model = c.random ? c.random : "demo";
    if (!n_prompts) prompts[n_prompts++] = n_prompt;
    n_prompt = prompts[0]; /* the longest sizes the cache and the ids */
    for (int k = 1; k < n_prompts; k++) n_prompt = TERN_MAX(n_prompt, prompts[k]);
    c.max_ctx = (int)(n_prompt + n_gen + 1);
    cli_session s;
    const double t_open = tern_time_s();
    int rc = cli_open(&c, 1, &s);
    if (rc) return rc;
    const double t_load = tern_time_s() - t_open; /* time to ready: files mapped or weights synthesized, uploaded */
    const tern_model_config *cfg = tern_model_cfg(s.model);
    tern_model_stats ms;
    tern_model_get_stats(s.model, &ms);
    int on_cpu = tern_model_backend(s.model)->device < 0;
    chunk = tern_model_max_batch(s.model); /* --chunk sized the model; else its default */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    for (long i = 0; i < n_prompt; i++) ids[i] = (int32_t)((i * 7919 + 2) % cfg->n_vocab);
    const tern_compute comp = tern_model_backend(s.model)->compute; /* bf16x2 reports bf16 (ops.h) */
    printf("model %s (%s), backend %s%s%s, compute %s, weights read per token %.1f MB, ready in %.1f s\n", c.model,
           tern_arch_name(cfg->arch), tern_model_backend(s.model)->vt->name, on_cpu ? ", isa " : "",
           on_cpu ? tern_cpu_isa_name() : "",
           comp == TERN_COMPUTE_INT8 || (c.compute_set && c.compute == TERN_COMPUTE_INT8 && !on_cpu) ? "int8"
           : comp != TERN_COMPUTE_BF16 ? "f32"
           : c.compute_set && c.compute == TERN_COMPUTE_BF16X2 && !on_cpu ? "bf16x2" : "bf16",
           ms.bytes_per_token / 1e6, t_load);
    tern_membw *ll = on_cpu && bw_given <= 0 ? tern_membw_open((size_t)1 << 30) : NULL; /* long-lived probe buffer */
    if (ll) printf("%-4s %10s %10s %10s %10s %8s %8s %8s %8s\n", "rep", "pp tok/s", "tg tok/s", "bw GB/s", "floor t/s", "tg/floor",
                   "ms/tok", "ll GB/s", "tg/ll");
    else printf("%-4s %10s %10s %10s %10s %8s %8s\n", "rep", "pp tok/s", "tg tok/s", "bw GB/s", "floor t/s", "tg/floor", "ms/tok");
    tern_error e = {0};
    for (long w = 0; w < warmup; w++) { /* untimed: the shortest prompt (at most one prefill chunk) */
        long np = prompts[0];
        for (int k = 1; k < n_prompts; k++) np = TERN_MIN(np, prompts[k]);
        tern_gen_stats st = {0};
        tern_status status = tern_generate(s.model, s.kv, 0, ids, (int)TERN_MIN(np, chunk), 3, (int)chunk, NULL, 0, NULL, NULL,
                                           NULL, NULL, &st, &e);
        tern_kv_release(s.kv, 0);
        if (status) { free(ids); tern_membw_close(ll); cli_close(&s); return cli_fail("bench", &e); }
    }
    for (int k = 0; k < n_prompts; k++)
        for (long r = 0; r < reps; r++) {
            const long np = prompts[k];
            double bw0 = bw_given > 0 ? 0 : probe(on_cpu, tern_model_backend(s.model));
            tern_gen_stats st = {0};
            tern_status status = tern_generate(s.model, s.kv, 0, ids, (int)np, (int)n_gen + 1, (int)chunk, NULL, 0, NULL, NULL,
                                               NULL, NULL, &st, &e);
            tern_kv_release(s.kv, 0);
            if (status) { free(ids); tern_membw_close(ll); cli_close(&s); return cli_fail("bench", &e); }
            double bw1 = bw_given > 0 ? 0 : probe(on_cpu, tern_model_backend(s.model)), bw = (bw0 + bw1) / 2;
            double llbw = probe_ll(ll, st.t_decode);
            if (bw_given > 0) bw = bw_given;
            double pp = st.n_prompt / st.t_prefill, tg = st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0;
            const size_t kvb = tern_kv_read_bytes(s.kv, np + n_gen / 2); /* mean decode context */
            double floor_tps = bw > 0 ? bw * 1e9 / ((double)ms.bytes_per_token + (double)kvb) : 0;
            if (n_prompts > 1 && r == 0) printf("prompt %ld (KV read per step at the mean decode context: %.1f MB)\n", np, kvb / 1e6);
            double ll_tps = llbw > 0 ? llbw * 1e9 / ((double)ms.bytes_per_token + (double)kvb) : 0;
            printf("%-4ld %10.1f %10.2f %10.1f %10.2f %8.2f %8.2f", r, pp, tg, bw, floor_tps,
                   floor_tps > 0 ? tg / floor_tps : 0, tg > 0 ? 1e3 / tg : 0);
            if (ll) printf(" %8.1f %8.2f", llbw, ll_tps > 0 ? tg / ll_tps : 0);
            printf("\n");
            printf("csv,%s,%s,%ld,%ld,%.2f,%.3f,%.2f,%.3f,%.4f,%.1f", c.model, tern_model_backend(s.model)->vt->name, np,
                   n_gen, pp, tg, bw, floor_tps, floor_tps > 0 ? tg / floor_tps : 0, kvb / 1e6);
            if (ll) printf(",%.2f,%.4f", llbw, ll_tps > 0 ? tg / ll_tps : 0);
            printf("\n");
        }
    if (tern_model_experts(s.model)) { /* --expert-cache: what the slot cache did over every rep */
        tern_experts_stats xs;
        tern_experts_get_stats(tern_model_experts(s.model), &xs);
        double n = (double)(xs.hits + xs.misses);
        printf("expert cache: %d of %d experts per layer resident, %.1f MB of slots; hit rate %.3f, %.1f MB read, "
               "%lld calls (%lld read in place)\n", xs.slots, xs.n_expert, xs.slot_bytes / 1e6, n > 0 ? xs.hits / n : 0,
               xs.bytes_read / 1e6, (long long)xs.calls, (long long)xs.direct);
    }
    free(ids);
    tern_membw_close(ll);
    cli_close(&s);
    return 0;
}
