/*
 * fit.h — memory honesty: what a model costs before it is loaded, and how much context and
 * concurrency a memory budget allows. Used by `tern fit` and by tern_engine_open (sizing the
 * KV pool from --memory-budget) so both quote the same numbers.
 *
 * Accounting (bytes): weights (as stored: safetensors sizes, or an estimate for --random);
 * KV per token per owning layer in its page format (kv.h: tern_kv_layer_bytes_per_token);
 * every full-layer block up to ctx for each sequence; a sliding layer holds per sequence only
 * the blocks of its window plus one step's rows, and one step's rows over all sequences are at
 * most max_batch_tokens, so the pool keeps window + one block per sequence plus one prefill
 * chunk shared by all (kv.h tern_kv_pool_blocks, what kv.c allocates); forward scratch
 * for max_batch_tokens rows (the model's activation buffers, an estimate from the geometry)
 * plus the scheduler's logits rows. KV-shared layers own nothing.
 */
#ifndef TERN_RUNTIME_FIT_H
#define TERN_RUNTIME_FIT_H

#include "io/config.h"
#include "ops/ops.h"

typedef struct tern_fit_opts {
    int ctx;                 /* tokens per sequence (0: min(n_ctx_train, 8192)) */
    int max_concurrency;     /* sequences (0: 8) */
    int max_batch_tokens;    /* rows per forward / prefill chunk (0: 512) */
    int block_size;          /* KV block (0: 16) */
    double budget_gb;        /* everything; 0 = no budget */
    size_t device_fixed;     /* the backend's own buffers (tern_backend_cuda_fixed_bytes on a GPU; 0 on the CPU) */
    size_t device_context;   /* the GPU context's own memory (tern_backend_cuda_context_bytes on a GPU; 0 on the CPU) */
} tern_fit_opts;

typedef struct tern_fit {
    int ctx, max_concurrency, max_batch_tokens, block_size;
    int n_full, n_sliding, n_shared, window;
    size_t weight_bytes;
    size_t kv_token_full, kv_token_sliding; /* bytes per token, summed over owning layers */
    size_t kv_seq;           /* KV of one sequence of ctx tokens (alone in the pool) */
    size_t kv_total;         /* the pool for max_concurrency sequences (tern_fit_kv_pool) */
    size_t scratch;          /* forward scratch + scheduler logits */
    size_t device_fixed;     /* the backend's own buffers (opts) */
    size_t device_context;   /* the GPU context (opts) */
    size_t total;            /* weights + scratch + device_fixed + device_context + kv_total */
    /* with a budget */
    size_t kv_avail;         /* budget - weights - scratch - device_fixed (0 when negative) */
    int fits;                /* total <= budget (1 without a budget) */
    int max_ctx;             /* longest ctx whose pool for max_concurrency sequences fits kv_avail (0: none) */
    int max_conc;            /* most sequences of ctx whose pool fits kv_avail */
} tern_fit;

/* Bytes of the KV pool tern_kv_open allocates for n_seq sequences of ctx tokens with steps of
 * chunk rows (block_size <= 0: 16; chunk <= 0: 512). Not n_seq times one sequence: the sliding
 * layers' chunk is counted once. */
size_t tern_fit_kv_pool(const tern_model_config *cfg, const tern_kv_fmt *formats, int ctx, int n_seq, int chunk,
                        int block_size);
/* KV bytes of one sequence of n tokens alone: tern_fit_kv_pool(n, 1 sequence). */
size_t tern_fit_seq_kv(const tern_model_config *cfg, const tern_kv_fmt *formats, int n, int chunk, int block_size);
/* Forward scratch estimate for max_batch rows and n_slots logits rows. */
size_t tern_fit_scratch(const tern_model_config *cfg, int max_batch, int n_slots);
/* Stored weight bytes estimated from the geometry (bits 0 = bf16 matrices, else MLX affine
 * with group g: bits/8 + 4/g bytes per weight; bits < 0: FP8 block-128 for the linear layers,
 * bf16 embeddings / head / router); vectors f32. For --random presets. GLM-5 configs are
 * counted with their MLA / indexer / MoE shapes. */
size_t tern_fit_weight_estimate(const tern_model_config *cfg, int bits, int group);
/* The part of that estimate in embedding tables (token embedding, Gemma 4 per-layer inputs) and in
 * an untied output head (0 when tied), for per-rank plans (tern fit --gpus N); dense models. */
void tern_fit_embed_estimate(const tern_model_config *cfg, int bits, int group, size_t *emb, size_t *head);
/* GLM-5 (glm_moe_dsa) geometry, reference/glm5.md §9. Cache bytes are for this engine's f32 latent
 * pages (tern_kv_layer_bytes_per_token): per layer kv_lora_rank + qk_rope_head_dim floats (normalized
 * latent + roped key), plus index_head_dim floats of indexer key on each "full" indexer layer.
 * Routed-expert bytes per token = MoE layers x experts per token x one expert's stored bytes
 * (3 matrices of hidden x moe_intermediate) in each format: bf16 (2 B/weight), MLX affine q8 / q4
 * at group 64 (bits/8 + 4/64: bf16 scale + bias per group), FP8 e4m3 with 128x128 F32 block
 * scales (1 + 4/16384). Returns 0 (and zeroes *g) for other architectures. */
enum { TERN_FIT_BF16 = 0, TERN_FIT_Q8 = 1, TERN_FIT_Q4 = 2, TERN_FIT_FP8 = 3, TERN_FIT_NQ = 4 };
typedef struct tern_fit_glm {
    int n_layer, n_full_indexer, n_moe;
    size_t latent_token;     /* Σ layers (kv_lora_rank + qk_rope_head_dim) * 4 */
    size_t indexer_token;    /* Σ full layers index_head_dim * 4 */
    double expert_params;    /* one routed expert: 3 * hidden * moe_intermediate */
    double expert_token[TERN_FIT_NQ]; /* routed-expert bytes read per token, by format */
    double params_total, params_active; /* whole model (no MTP layer); active per token */
} tern_fit_glm;
int tern_fit_glm_geometry(const tern_model_config *cfg, tern_fit_glm *g);
const char *tern_fit_quant_name(int q);   /* "bf16", "mlx-q8g64", "mlx-q4g64", "fp8-b128" */
double tern_fit_bytes_per_weight(int q);  /* stored bytes per matrix weight of format q */

tern_status tern_fit_plan(const tern_model_config *cfg, const tern_kv_fmt *formats, size_t weight_bytes,
                          const tern_fit_opts *o, tern_fit *f, tern_error *err);

#endif
