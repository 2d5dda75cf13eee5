/*
 * cmd_info.c — `tern info MODEL`: architecture, geometry, parameters, bytes per stored dtype,
 * quantization (MLX affine or FP8 blocks), KV bytes per token; for GLM-5 the MLA / indexer
 * geometry, latent-cache bytes and routed-expert bytes per token in each format. Loads the model
 * on the CPU backend (weights stay mmap'd). `tern info --random NAME --config` prints the preset's
 * config.json instead (for peers that build the same geometry, e.g. bench/peer_transformers.py).
 */
#include "cli.h"
#include "cli_util.h"
#include "io/presets.h"
#include "runtime/fit.h"
#include "runtime/kv.h"

#include <stdio.h>
#include <string.h>

int tern_cmd_info(int argc, char **argv) {
    cli_common c = {.device = "cpu"};
    int config = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_flag(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--config")) config = 1;
        else if (argv[i][0] != '-' && !c.model) c.model = argv[i];
        else return cli_usage_error("info", "unknown argument '%s'", argv[i]);
    }
    if (config) {
        if (!c.random) return cli_usage_error("info", "--config prints a preset's config.json: give --random NAME");
        printf("%s\n", tern_preset_config(c.random));
        return 0;
    }
    if (!c.model) c.model = "demo";
    c.device = "cpu";
    cli_session s;
    int rc = cli_open(&c, 0, &s);
    if (rc) return rc;
    const tern_model_config *cfg = tern_model_cfg(s.model);
    tern_model_stats st;
    tern_model_get_stats(s.model, &st);
    int n_full = 0, n_sliding = 0, n_shared = 0, n_moe = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->layers[l].type == TERN_LAYER_FULL) n_full++; else n_sliding++;
        if (cfg->layers[l].kv_src != l) n_shared++;
        if (cfg->layers[l].moe) n_moe++;
    }
    printf("model         %s\n", c.model);
    printf("weights       %s\n", c.random ? "synthetic (anonymous memory)" : c.no_mmap ? "read into memory (--no-mmap, 2 MB pages)"
                                                                                     : "mmap of the files (--no-mmap reads them in)");
    printf("architecture  %s (model_type %s, %s)\n", tern_arch_name(cfg->arch), cfg->model_type, cfg->architecture);
    printf("layers        %d (%d full, %d sliding window %d, %d KV-shared, %d MoE)\n", cfg->n_layer, n_full, n_sliding,
           cfg->sliding_window, n_shared, n_moe);
    printf("hidden        %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d\n", cfg->n_embd, cfg->n_head,
           cfg->n_head_kv, cfg->head_dim, cfg->n_ff, cfg->n_vocab);
    if (cfg->n_expert) printf("experts       %d, %d per token, width %d\n", cfg->n_expert, cfg->n_expert_used, cfg->n_ff_expert);
    if (cfg->ple_dim) printf("per-layer emb %d per layer\n", cfg->ple_dim);
    printf("parameters    %.3f M\n", st.n_params / 1e6);
    size_t total = 0;
    for (int d = 0; d < TERN_DT_COUNT; d++) {
        if (!st.bytes_by_dtype[d]) continue;
        printf("bytes %-7s %.3f MB\n", d == TERN_DT_Q ? "MLX-q" : tern_dtype_name((tern_dtype)d), st.bytes_by_dtype[d] / 1e6);
        total += st.bytes_by_dtype[d];
    }
    printf("bytes total   %.3f MB\n", total / 1e6);
    if (cfg->quant.enabled)
        printf("quantization  MLX %s, %d bits, group %d, %d per-module overrides\n", cfg->quant.mode, cfg->quant.bits,
               cfg->quant.group_size, cfg->quant.n_overrides);
    else if (cfg->quant.fp8)
        printf("quantization  FP8 e4m3, weight blocks %dx%d with F32 scales, %d modules not converted\n",
               cfg->quant.fp8_block[0], cfg->quant.fp8_block[1], cfg->quant.n_fp8_skip);
    else
        printf("quantization  none\n");
    printf("KV per token  %zu bytes (f32 cache, layers that own a cache)\n", tern_kv_bytes_per_token(cfg));
    tern_fit_glm g;
    if (tern_fit_glm_geometry(cfg, &g)) {
        printf("GLM-5 MLA     q_lora %d, kv_lora %d, nope %d, rope %d, v %d; indexer %d heads x %d, top-%d on %d of %d "
               "layers\n", cfg->q_lora_rank, cfg->kv_lora_rank, cfg->qk_nope_head_dim, cfg->qk_rope_head_dim,
               cfg->v_head_dim, cfg->index_n_heads, cfg->index_head_dim, cfg->index_topk, g.n_full_indexer, g.n_layer);
        printf("latent cache  %zu B/token + indexer keys %zu B/token (f32 pages; half with --kv-quant bf16)\n", g.latent_token,
               g.indexer_token);
        printf("experts/token");
        for (int q = 0; q < TERN_FIT_NQ; q++)
            printf(" %s %.3f GB%s", tern_fit_quant_name(q), g.expert_token[q] / 1e9, q + 1 < TERN_FIT_NQ ? "," : "");
        printf(" (%d MoE layers x %d routed experts read per token)\n", g.n_moe, cfg->n_expert_used);
        printf("active        %.3f M of %.3f M parameters per token\n", g.params_active / 1e6, g.params_total / 1e6);
    }
    printf("context       %d (max_position_embeddings)\n", cfg->n_ctx_train);
    cli_close(&s);
    return 0;
}
