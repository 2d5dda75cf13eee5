/*
 * config.h — a Hugging Face model directory's config.json (+ generation_config.json)
 * parsed into tern_model_config: one flat description every architecture file reads.
 *
 * Handles: top-level or nested `text_config` (Gemma4ForConditionalGeneration); Gemma 4's
 * flat Hub fields (head_dim, global_head_dim, num_global_key_value_heads, layer_types, ...)
 * and transformers >= 5.15 `per_layer_config` overrides; RoPE in the Hub
 * `rope_theta`/`rope_scaling` form and in the `rope_parameters` form (per layer type for
 * Gemma 4); the MLX `quantization` block (global bits/group_size + per-module overrides).
 * Per-layer geometry is derived here exactly as reference/gemma4.md §2.1 says, so model
 * code only reads cfg->layers[l].
 *
 * Errors name the file and the field: "config.json: text_config.hidden_size: expected a
 * positive integer, got \"abc\"".
 */
#ifndef TERN_CONFIG_H
#define TERN_CONFIG_H

#include "base/base.h"

typedef enum tern_arch {
    TERN_ARCH_UNKNOWN = 0,
    TERN_ARCH_GEMMA4,   /* gemma4, gemma4_text, gemma4_unified(_text) */
    TERN_ARCH_LLAMA,    /* llama, mistral */
    TERN_ARCH_QWEN2,
    TERN_ARCH_QWEN3,
    TERN_ARCH_GLM5,     /* glm_moe_dsa (issue 7) */
} tern_arch;

typedef enum tern_rope_type {
    TERN_ROPE_NONE = 0,
    TERN_ROPE_DEFAULT,
    TERN_ROPE_PROPORTIONAL, /* Gemma 4 full layers */
    TERN_ROPE_LINEAR,
    TERN_ROPE_DYNAMIC,
    TERN_ROPE_LLAMA3,
    TERN_ROPE_YARN,
} tern_rope_type;

typedef struct tern_rope_params {
    tern_rope_type type;
    double theta;                 /* rope_theta */
    double partial_rotary_factor; /* 1.0 when absent */
    double factor;                /* scaling factor, 1.0 when absent */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int original_max_pos;         /* llama3 / yarn / dynamic */
    double beta_fast, beta_slow;  /* yarn */
    double attention_factor;      /* yarn: 0 = derive (mscale) */
    double mscale, mscale_all_dim;/* yarn (deepseek style) */
} tern_rope_params;

typedef enum { TERN_LAYER_FULL = 0, TERN_LAYER_SLIDING = 1 } tern_layer_type;

typedef struct tern_layer_config {
    tern_layer_type type;
    int head_dim;        /* D_l */
    int n_head_kv;       /* nKV_l */
    int n_ff;            /* dense MLP width I_l */
    int k_eq_v;          /* Gemma 4: V comes from the K projection (no v_proj) */
    int kv_src;          /* layer whose KV this layer reads (== own index unless KV-shared) */
    int moe;             /* layer has a routed-expert block */
    /* GLM-5 (appended): KV page geometry of the MLA latent kind and the DSA indexer mode */
    int kv_latent;       /* 1: K pool = one record of head_dim floats per token (latent + rope key,
                            n_head_kv = 1), V pool = kv_v_dim floats per token (indexer key) */
    int kv_v_dim;        /* latent kind: V floats per token; 0 = no V pool (shared-indexer layer) */
    int dsa_full;        /* GLM-5: 1 = own indexer ("full"), 0 = reuses the last full layer's top-k */
} tern_layer_config;

/* One MLX quantization override: module path (as stored) -> bits/group_size or disabled. */
typedef struct tern_quant_override {
    char *path;
    int bits, group_size;
    int disabled;        /* `false` in the config: module stored unquantized */
} tern_quant_override;

typedef struct tern_quant_config {
    int enabled;         /* a `quantization` (or `quantization_config` with mlx keys) block exists */
    int bits, group_size;
    char mode[16];       /* "affine" (others rejected as unsupported at load) */
    tern_quant_override *overrides;
    int n_overrides;
    /* FP8 block quantization (appended; DeepSeek-V3 / GLM-5-FP8 `quantization_config` with
     * quant_method "fp8", fmt "e4m3", weight_block_size [rows, cols], activation_scheme
     * "dynamic"). Modules are FP8 where a `<module>.weight_scale_inv` is stored; the rest
     * (norms, router gate, embeddings, lm_head, modules_to_not_convert) stay as stored. */
    int fp8;             /* 1: such a block exists (enabled stays 0: no MLX scales expected) */
    int fp8_block[2];    /* weight_block_size: rows, cols */
    char **fp8_skip;     /* modules_to_not_convert (informational; owned) */
    int n_fp8_skip;
} tern_quant_config;

typedef struct tern_model_config {
    tern_arch arch;
    char model_type[64];     /* e.g. "gemma4_text" (the text model's type) */
    char architecture[96];   /* architectures[0], e.g. "Gemma4ForConditionalGeneration" */

    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int n_ctx_train;         /* max_position_embeddings */
    double norm_eps;
    int tie_embeddings;
    int attention_bias;      /* qwen2: q/k/v biases */
    int qk_norm;             /* qwen3 / gemma4: per-head q_norm/k_norm */
    int act;                 /* TERN_ACT_GELU_TANH / TERN_ACT_SILU (ops.h) */

    /* Gemma 4 */
    int global_head_dim, n_head_kv_global;
    int sliding_window;
    int n_kv_shared_layers;
    int ple_dim;             /* hidden_size_per_layer_input (0 = none) */
    int ple_vocab;           /* vocab_size_per_layer_input */
    int double_wide_mlp;
    int attention_k_eq_v;
    double final_logit_softcap; /* 0 = none */
    double attn_logit_softcap;  /* 0 = none */
    double attn_scale;       /* 0 = 1/sqrt(head_dim); Gemma 4 sets 1.0 */
    double embed_scale;      /* 0 = none; Gemma: sqrt(n_embd) in f32 */

    /* MoE (Gemma 4 26B-A4B; GLM later) */
    int n_expert, n_expert_used, n_ff_expert;

    tern_rope_params rope_full;    /* llama/qwen: the only rope */
    tern_rope_params rope_sliding; /* gemma4 sliding layers */

    tern_layer_config *layers;     /* [n_layer], owned */

    tern_quant_config quant;

    /* GLM-5 glm_moe_dsa (appended; reference/glm5.md §2). The KV geometry of its layers is in
     * layers[l].kv_latent / head_dim (= kv_lora_rank + qk_rope_head_dim) / kv_v_dim. */
    int q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int index_n_heads, index_head_dim, index_topk;
    int n_group, topk_group;       /* group-limited routing: E/n_group experts per group */
    int norm_topk_prob;            /* renormalise the chosen sigmoid weights */
    double routed_scaling_factor;  /* multiplies the routed weights (shared expert unscaled) */
    int n_shared_experts;          /* shared MLP width = n_ff_expert * n_shared_experts */
    int first_k_dense_replace;
    double mla_norm_eps;           /* q_a/kv_a RMSNorm eps: 1e-6, hard-wired in transformers */
    double index_norm_eps;         /* indexer k_norm LayerNorm eps: 1e-6 */
    double rope_mscale;            /* yarn attention factor on cos/sin (1 otherwise); attn_scale
                                      already holds d_qk^-1/2 times yarn's mscale_all_dim^2 */

    /* generation_config.json / config special ids (-1 when absent) */
    int bos_id, pad_id;
    int eos_ids[8];
    int n_eos;
    double gen_temperature, gen_top_p; int gen_top_k; /* < 0 when absent */

    /* GLM-5 (appended; tensor parallelism): shared-expert MLP width of a rank-local config (its
     * slice); 0 = the whole n_ff_expert * n_shared_experts. Never read from config.json. */
    int n_ff_shared;
    /* Tensor parallelism (appended): the vocabulary-parallel output head of a rank-local config
     * holds rows [head_v0, head_v0 + head_vn) of the head (lm_head, or the tied embedding, which
     * stays whole for the lookup); head_vn 0 = all n_vocab rows. Never read from config.json. */
    int head_v0, head_vn;
} tern_model_config;

/* Parse DIR/config.json (+ DIR/generation_config.json if present). */
tern_status tern_config_load(tern_model_config *cfg, const char *dir, tern_error *err);
/* Parse from a JSON string (tests, embedded demo). `name` is used in messages. */
tern_status tern_config_parse(tern_model_config *cfg, const char *json, size_t len, const char *name, tern_error *err);
void tern_config_free(tern_model_config *cfg); /* frees owned arrays; accepts NULL */

/* Quantization for a stored module path (e.g. "language_model.model.layers.0.mlp.up_proj"):
 * returns 1 and fills bits/gs if quantized per config defaults/overrides, 0 if disabled. */
int tern_quant_lookup(const tern_quant_config *q, const char *path, int *bits, int *group_size);

const char *tern_arch_name(tern_arch a);

#endif
