/*
 * cmd_fit.c — `tern fit MODEL [--ctx N] [--max-concurrency N] [--memory-budget GB]
 * [--kv-quant SPEC] [--max-batch-tokens N] [--random NAME [--quant qB --group G]] [--expert-cache GB]`:
 * memory honesty before anything is loaded. Prints the weight bytes (safetensors sizes of
 * the text model, or a geometry estimate for --random), KV bytes per token for each layer
 * kind (full / sliding / KV-shared) in every page mode, what the sliding layers keep (window + one
 * block per sequence, plus one prefill chunk shared by the pool), the prefill scratch, the total for
 * the requested context and concurrency, and, with a budget, the longest safe context at
 * that concurrency and the most sequences at that context; for GLM-5 also the latent-cache and
 * indexer bytes per token and the routed-expert bytes per token in each weight format; for MoE models the
 * expert geometry and, with --expert-cache GB, the resident set and the expected expert bytes read per decode
 * token (runtime/experts.h tern_experts_fit_plan; "csv-experts," line); with --gpus N every rank's
 * weights, KV, scratch and total ("csv-rank," lines: N, rank, bytes). Numbers come from
 * src/runtime/fit.c, which tern_engine_open uses to size the KV pool from --memory-budget.
 * --device cuda or --gpus N plan with the engine's GPU defaults (8192 rows per step, 2048 on GPUs under
 * 70 GiB; BF16 pages for --kv-quant auto in the bf16 mode). Ends with one CSV line (prefix "csv,").
 * Exit 0 (also when it does not fit: the verdict line says so), 2 on bad arguments or an unreadable model.
 */
#include "cli.h"
#include "cli_util.h"
#include "io/demo.h"
#include "io/kv_config.h"
#include "io/presets.h"
#include "io/safetensors.h"
#include "model/tp.h"
#include "runtime/fit.h"
#include "runtime/experts.h"
#include "runtime/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gb(size_t b) { return (double)b / 1073741824.0; }

/* Text-model weight bytes of a directory (vision / audio towers are never loaded). */
static tern_status dir_weights(const char *dir, size_t *out, size_t *skipped, tern_error *err) {
    tern_st_set *set = NULL;
    tern_status st = tern_st_open(&set, dir, err);
    if (st) return st;
    *out = *skipped = 0;
    for (int i = 0; i < tern_st_count(set); i++) {
        const tern_st_entry *e = tern_st_at(set, i);
        if (strstr(e->name, "vision") || strstr(e->name, "audio")) *skipped += e->nbytes;
        else *out += e->nbytes;
    }
    tern_st_close(set);
    return TERN_OK;
}

/* Bytes of the text model's tensors in DIR whose name `pick` accepts (vision / audio towers never
 * count); 0 when the directory cannot be read. */
static size_t dir_bytes(const char *dir, int (*pick)(const char *name)) {
    tern_st_set *set = NULL;
    size_t b = 0;
    if (tern_st_open(&set, dir, NULL)) return 0;
    for (int i = 0; i < tern_st_count(set); i++) {
        const tern_st_entry *e = tern_st_at(set, i);
        if (pick(e->name) && !strstr(e->name, "vision") && !strstr(e->name, "audio")) b += e->nbytes;
    }
    tern_st_close(set);
    return b;
}

/* Routed-expert stacks as stored (HF fused / per-expert, mlx switch_glu / switch_mlp), not the
 * shared experts. */
static int expert_name(const char *n) {
    return (strstr(n, "experts.") && !strstr(n, "shared_experts")) || strstr(n, "switch_mlp") || strstr(n, "switch_glu");
}
static int embed_name(const char *n) { return strstr(n, "embed") != NULL; }
static int head_name(const char *n) { return strstr(n, "lm_head") != NULL; }

/* `--expert-cache GB`: the resident set and the expected expert bytes read per decode token. */
static void print_experts(const tern_model_config *cfg, const char *dir, int bits, int group, double cache_gb) {
    int nl = 0;
    for (int l = 0; l < cfg->n_layer; l++) nl += cfg->layers[l].moe != 0;
    if (cfg->n_expert <= 0 || !nl) return;
    size_t b;
    if (dir && *dir) b = dir_bytes(dir, expert_name) / ((size_t)nl * (size_t)cfg->n_expert);
    else { /* --random: one expert = 3 matrices of hidden x expert intermediate */
        double w = 3.0 * cfg->n_embd * (double)cfg->n_ff_expert;
        b = (size_t)(w * (bits > 0 ? bits / 8.0 + 4.0 / (group > 0 ? group : 64) : 2.0));
    }
    if (!b) return;
    tern_experts_fit f;
    tern_experts_fit_plan(b, cfg->n_expert, nl, cfg->n_expert_used, (size_t)(cache_gb * 1073741824.0), &f);
    printf("\nexperts        %d MoE layers x %d experts x %.3f MB = %.3f GB; %d routed per token (%.3f GB read per "
           "token when streamed)\n", nl, cfg->n_expert, b / 1e6, gb((size_t)nl * cfg->n_expert * b), cfg->n_expert_used,
           (double)nl * cfg->n_expert_used * b / 1e9);
    if (cache_gb > 0)
        printf("expert cache   %.3f GB: %d of %d experts per layer resident (%.1f%%), %.3f GB of slots; expected "
               "%.3f GB read per decode token (uniform routing, LRU hit rate = resident share)\n",
               cache_gb, f.slots, cfg->n_expert, 100.0 * f.resident_frac, gb(f.resident_bytes), f.bytes_per_token / 1e9);
    else printf("expert cache   off (--expert-cache GB offloads): every expert resident\n");
    printf("csv-experts,%d,%d,%d,%zu,%.3f,%d,%zu,%.0f\n", nl, cfg->n_expert, cfg->n_expert_used, b, cache_gb, f.slots,
           f.resident_bytes, f.bytes_per_token);
}

/* Embedding tables (replicated on every rank: lookups) and the untied output head (split by
 * vocabulary rows) of the stored text model, or of the --random geometry's estimate. */
static void embed_head_bytes(const char *dir, const tern_model_config *c, int bits, int group, size_t *emb, size_t *head) {
    if (dir && *dir) {
        *emb = dir_bytes(dir, embed_name);
        *head = dir_bytes(dir, head_name);
    } else {
        tern_fit_embed_estimate(c, bits, group, emb, head);
    }
}

/* --gpus N: every rank's share — its local configuration (heads, kv heads, widths, experts,
 * head rows) from model/tp.c, the embeddings whole, everything else split N ways (an estimate:
 * norms and routers, replicated, are counted split; they are small) */
static int print_ranks(const tern_model_config *cfg, const char *dir, int bits, int group, const tern_kv_fmt *fmt,
                       size_t wbytes, const tern_fit_opts *fo, int N) {
    size_t emb, head;
    embed_head_bytes(dir, cfg, bits, group, &emb, &head);
    const size_t rest = wbytes > emb + head ? wbytes - emb - head : 0;
    printf("\nper GPU (--gpus %d: attention heads, MLP widths and experts split, embeddings on every rank%s):\n", N,
           head ? ", output head split by vocabulary rows" : "");
    printf("  %-5s %12s %12s %12s %12s %s\n", "rank", "weights GB", "KV GB", "scratch GB", "total GB", fo->budget_gb > 0 ? "budget" : "");
    char csv[TERN_TP_MAX][160];
    int nr = 0;
    size_t host = 0;
    for (int r = 0; r < N; r++) {
        tern_model_config lc;
        tern_error e = {0};
        if (tern_tp_rank_config(cfg, N, r, &lc, &e)) {
            printf("  --gpus %d does not split this model: %s\n", N, e.msg);
            return 1;
        }
        double hshare = lc.head_vn > 0 ? (double)lc.head_vn / cfg->n_vocab : 1.0;
        size_t w = emb + rest / (size_t)N + (size_t)(head * hshare);
        tern_fit fr;
        host += w;
        if (!tern_fit_plan(&lc, fmt, w, fo, &fr, &e)) {
            printf("  %-5d %12.3f %12.3f %12.3f %12.3f %s\n", r, gb(w), gb(fr.kv_total), gb(fr.scratch), gb(fr.total),
                   fo->budget_gb > 0 ? (fr.fits ? "fits" : "DOES NOT FIT") : "");
            snprintf(csv[nr++], sizeof csv[0], "csv-rank,%d,%d,%zu,%zu,%zu,%zu,%d", N, r, w, fr.kv_total, fr.scratch,
                     fr.total, fr.fits);
        }
        free(lc.layers);
    }
    for (int r = 0; r < nr; r++) printf("%s\n", csv[r]);
    if (!dir) /* weights_synth.c makes each rank's share in host memory and keeps it there */
        printf("host memory        %10.3f GB: the ranks' random weights, made in host memory and kept beside the GPUs' copies\n",
               gb(host));
    return 0;
}

static int parse_gb(const char *flag, const char *v, double *out) {
    char *end;
    double d = v ? strtod(v, &end) : -1;
    if (!v || end == v || *end || !(d >= 0 && d < 1e6)) return cli_usage_error("fit", "%s expects gigabytes >= 0, got '%s'", flag, v ? v : "");
    *out = d;
    return 0;
}

int tern_cmd_fit(int argc, char **argv) {
    cli_common c = {0};
    long ctx = 0, conc = 8, mbt = 0; /* 0: the engine's default for the device planned for */
    double budget = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_flag(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ctx")) { if (cli_int("fit", a, v, 1, 1 << 24, &ctx)) return 2; i++; }
        else if (!strcmp(a, "--max-concurrency")) { if (cli_int("fit", a, v, 1, 4096, &conc)) return 2; i++; }
        else if (!strcmp(a, "--max-batch-tokens")) { if (cli_int("fit", a, v, 1, 1 << 20, &mbt)) return 2; i++; }
        else if (!strcmp(a, "--memory-budget")) { if (parse_gb(a, v, &budget)) return 2; i++; }
        else if (a[0] != '-' && !c.model) c.model = a;
        else return cli_usage_error("fit", "unknown or incomplete argument '%s'", a);
    }
    if (!ctx && c.max_ctx) ctx = c.max_ctx;
    /* planning for GPUs (--device cuda or --gpus N): the engine's GPU defaults — 8192 rows per step on GPUs of 70+
     * GiB or when none is here to ask, else 2048 (tern_model_default_batch) and, for --kv-quant auto in the bf16
     * mode, BF16 pages */
    const int gpu = c.gpus > 1 || (c.device && !strcmp(c.device, "cuda"));
    tern_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tern_error e = {0};
    tern_status st;
    char dir[4096] = "";
    size_t wbytes = 0, skipped = 0;
    const char *name = c.random ? c.random : c.model ? c.model : "demo";
    if (c.random) {
        const char *js = tern_preset_config(c.random);
        st = tern_config_parse(&cfg, js, strlen(js), c.random, &e);
        if (!st) wbytes = tern_fit_weight_estimate(&cfg, c.random_bits, c.random_group ? c.random_group : 64);
    } else {
        st = tern_model_path_resolve(name, dir, sizeof dir, &e);
        if (!st) st = tern_config_load(&cfg, dir, &e);
        if (!st) st = dir_weights(dir, &wbytes, &skipped, &e);
    }
    if (st) { tern_config_free(&cfg); return cli_fail("fit", &e); }
    if (!mbt) mbt = tern_model_default_batch(gpu, gpu ? tern_backend_cuda_device_bytes(0) : 0);
    tern_kv_fmt *fmt = NULL;
    const char *src = NULL, *spec = tern_kv_quant_default(c.kv_quant ? c.kv_quant : "auto", gpu,
                                                          !c.compute_set || c.compute == TERN_COMPUTE_BF16);
    if ((st = tern_kv_quant_plan(spec, c.random ? NULL : dir, &cfg, &fmt, &src, &e)) ||
        (st = tern_kv_check_formats(&cfg, fmt, &e))) {
        free(fmt);
        tern_config_free(&cfg);
        return cli_fail("fit", &e);
    }
    tern_fit_opts fo = {.ctx = (int)ctx, .max_concurrency = (int)conc, .max_batch_tokens = (int)mbt, .budget_gb = budget,
                        .device_fixed = gpu ? tern_backend_cuda_fixed_bytes((int)mbt) : 0,
                        .device_context = gpu ? tern_backend_cuda_context_bytes() : 0};
    tern_fit f;
    if ((st = tern_fit_plan(&cfg, fmt, wbytes, &fo, &f, &e))) { free(fmt); tern_config_free(&cfg); return cli_fail("fit", &e); }

    printf("model %s (%s): %d layers = %d full + %d sliding (window %d) + %d KV-shared\n", name, tern_arch_name(cfg.arch),
           cfg.n_layer, f.n_full, f.n_sliding, f.window, f.n_shared);
    printf("weights        %10.3f GB%s", gb(wbytes), c.random ? " (estimate from the geometry)" : " (safetensors, text model)");
    if (skipped) printf(", +%.3f GB vision/audio not loaded", gb(skipped));
    printf("\n");
    tern_fit_glm g;
    if (tern_fit_glm_geometry(&cfg, &g)) { /* MLA latent cache: f32 pages, or bf16 in the selected KV mode */
        size_t es = 4;
        for (int l = 0; l < cfg.n_layer; l++)
            if (cfg.layers[l].kv_latent && fmt && fmt[2 * l].kind == TERN_KV_BF16) es = 2;
        printf("\nGLM-5 geometry: %.1f B parameters, %.1f B active per token; %d MoE layers, %d of %d with a full indexer\n",
               g.params_total / 1e9, g.params_active / 1e9, g.n_moe, g.n_full_indexer, g.n_layer);
        printf("  latent cache     %zu B/token (%d layers x (kv_lora %d + rope %d) x %zu B, %s pages)\n",
               g.latent_token / 4 * es, g.n_layer, cfg.kv_lora_rank, cfg.qk_rope_head_dim, es, es == 2 ? "bf16" : "f32");
        printf("  indexer keys     %zu B/token (%d full layers x %d x %zu B)\n", g.indexer_token / 4 * es, g.n_full_indexer,
               cfg.index_head_dim, es);
        printf("  routed experts read per token (%d layers x %d experts x %.2f M weights):\n", g.n_moe, cfg.n_expert_used,
               g.expert_params / 1e6);
        for (int q = 0; q < TERN_FIT_NQ; q++)
            printf("    %-10s %8.3f GB (1e9 B)  %.4f B/weight\n", tern_fit_quant_name(q), g.expert_token[q] / 1e9,
                   tern_fit_bytes_per_weight(q));
    }
    print_experts(&cfg, c.random ? NULL : dir, c.random_bits, c.random_group, c.expert_cache_gb);
    printf("\nKV bytes per token (per sequence, summed over the layers of each kind):\n");
    printf("  %-12s %12s %12s %12s\n", "mode", "full", "sliding", "shared");
    const char *modes[] = {"off", "bf16", "8", "4", "turbo:4,4", "turbo:4,3", "turbo:3,3", "turbo:3,2"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        tern_kv_fmt *mf = NULL;
        if (tern_kv_quant_plan(modes[m], NULL, &cfg, &mf, NULL, NULL)) continue;
        if (tern_kv_check_formats(&cfg, mf, NULL)) { /* e.g. GLM-5's latent layers: f32 or bf16 only */
            printf("  %-12s %12s\n", modes[m], "-");
            free(mf);
            continue;
        }
        tern_fit fm;
        tern_fit_opts o2 = fo;
        o2.budget_gb = 0;
        if (!tern_fit_plan(&cfg, mf, wbytes, &o2, &fm, NULL))
            printf("  %-12s %12zu %12zu %12d\n", modes[m], fm.kv_token_full, fm.kv_token_sliding, 0);
        free(mf);
    }
    if (f.n_sliding > 0) { /* the sliding group's blocks as kv.c sizes them */
        int64_t nb1[2], nbn[2];
        tern_kv_pool_blocks(f.window, f.block_size, f.ctx, 1, f.max_batch_tokens, nb1);
        tern_kv_pool_blocks(f.window, f.block_size, f.ctx, f.max_concurrency, f.max_batch_tokens, nbn);
        printf("  (sliding layers keep only window + one step per sequence, plus one prefill chunk shared by the pool:\n"
               "   %lld tokens for %d sequences; one sequence alone at most %lld)\n",
               (long long)(nbn[1] * f.block_size), f.max_concurrency, (long long)(nb1[1] * f.block_size));
    }
    printf("\n");
    printf("selected KV mode   %s (%s): %zu B/token full, %zu B/token sliding\n", spec, src ? src : "?", f.kv_token_full, f.kv_token_sliding);
    printf("KV per sequence    %10.3f GB at ctx %d\n", gb(f.kv_seq), f.ctx);
    printf("KV total           %10.3f GB for %d sequences\n", gb(f.kv_total), f.max_concurrency);
    printf("prefill scratch    %10.3f GB (%d rows per step; estimate)\n", gb(f.scratch), f.max_batch_tokens);
    if (f.device_fixed)
        printf("device buffers     %10.3f GB (CUDA: GEMM scratch, cuBLASLt workspace, split-K partials)\n",
               gb(f.device_fixed));
    if (f.device_context)
        printf("CUDA context       %10.3f GB (context, cuBLAS, loaded kernels: measured on an H200, CUDA 13)\n",
               gb(f.device_context));
    printf("total              %10.3f GB\n", gb(f.total));
    if (budget > 0) {
        printf("budget             %10.3f GB: %s; %.3f GB left for KV\n", budget, f.fits ? "FITS" : "DOES NOT FIT", gb(f.kv_avail));
        printf("max safe context   %d tokens at %d concurrent sequences\n", f.max_ctx, f.max_concurrency);
        printf("max concurrency    %d sequences of %d tokens\n", f.max_conc, f.ctx);
    }
    if (c.gpus > 1) print_ranks(&cfg, c.random ? NULL : dir, c.random_bits, c.random_group, fmt, wbytes, &fo, c.gpus);
    printf("csv,%s,%s,%d,%d,%.0f,%zu,%zu,%zu,%zu,%zu,%zu,%.3f,%d,%d,%d\n", name, spec, f.ctx, f.max_concurrency,
           (double)wbytes, f.kv_token_full, f.kv_token_sliding, f.kv_seq, f.kv_total, f.scratch, f.total, budget, f.fits,
           f.max_ctx, f.max_conc);
    free(fmt);
    tern_config_free(&cfg);
    return 0;
}
