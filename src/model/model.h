/*
 * model.h — a loaded model: config + weights on a backend + a forward pass over a batch.
 *
 * The forward pass takes a batch of rows from several sequences at once (row = token or an
 * embedding row, absolute position, KV slot), writes each row's K/V into the paged cache
 * (src/runtime/kv.h) and returns final logits (after softcap) for the rows that ask for them.
 * Each architecture lives in its own file (gemma4.c, llama.c) behind tern_arch_impl;
 * model.c holds what they share (loading helpers, scratch, rope tables).
 */
#ifndef TERN_MODEL_H
#define TERN_MODEL_H

#include "io/config.h"
#include "io/weights.h"
#include "ops/ops.h"
#include "runtime/kv.h"

typedef struct tern_batch {
    int n;                    /* rows */
    const int32_t *tokens;    /* [n] token ids, or NULL when embd is given */
    const float *embd;        /* [n, n_embd] input embedding rows (host f32) or NULL */
    const int32_t *pos;       /* [n] absolute positions */
    const int32_t *slot;      /* [n] KV slots */
    const uint8_t *want;      /* [n] 1 = return logits for this row; NULL = every row */
    const int32_t *span;      /* [n] bidirectional span id per row, or NULL (see below) */
} tern_batch;

/* Bidirectional spans (image / audio soft tokens; Gemma 4 use_bidirectional_attention "vision").
 * span[r] = 0: an ordinary causal row. Rows with the same nonzero id form one span (an id names
 * one span of the whole call, whatever the slot): they must be adjacent rows of the batch, of
 * one slot, at consecutive positions in order, all inside this call, and at most max_batch
 * rows. A span never continues into the next call: a span whose first position follows, in the
 * same slot, a span with the same id that ended the previous call is refused (give the next
 * span of a sequence another id, e.g. a running image index). Every row of a span attends to
 * every position of the span — later ones and ones below a sliding window's lower bound
 * included — in addition to its causal (windowed) keys; rows outside the span attend causally
 * as always, so rows before it are unaffected and rows after it see its K/V. A span of one
 * row is exactly the causal row.
 * Violations: TERN_EINVAL naming the span, row and position; models whose attention cannot
 * take spans (GLM-5 MLA): TERN_EUNSUPPORTED. Steps with spans never use step graphs. */

typedef struct tern_model tern_model;

typedef struct tern_model_opts {
    int max_batch;            /* rows per forward the scratch is sized for (0: tern_model_default_batch) */
    int min_batch;            /* (appended) with max_batch 0: the default is raised to at least this (the engine's
                               * max_concurrency: one decode row each) */
    /* expert offload (appended; src/runtime/experts.h, docs/OFFLOAD.md): MoE expert stacks stay
     * in their stored bytes and a bounded slot cache holds the hot ones. Off when both are 0. */
    size_t expert_cache_bytes;/* slot memory over every MoE layer */
    int expert_slots;         /* > 0: slots per MoE layer (overrides the bytes; tests) */
    const char *expert_trace; /* JSON-lines routing trace path, or NULL */
    int no_mmap;              /* (appended) tern_model_load: read tensor bytes into anonymous 2 MB-page
                                 memory instead of using the file mapping; offloaded experts stay
                                 in the file (io/safetensors.h tern_st_opts) */
    int expert_e0;            /* (appended) expert offload on an expert-parallel rank: the global id of
                                 its first expert (model/tp.c sets it per rank) */
} tern_model_opts;

/* Load DIR (config.json + safetensors) onto backend `be`. Every expected tensor is checked
 * for presence, shape and dtype before anything is computed. */
tern_status tern_model_load(tern_model **out, const char *dir, tern_backend *be,
                            const tern_model_opts *opts, tern_error *err);
/* Same from an already-parsed config and weight store (used by the demo and random models;
 * takes ownership of neither). */
tern_status tern_model_load_from(tern_model **out, const tern_model_config *cfg, tern_weights *ws,
                                 tern_backend *be, const tern_model_opts *opts, tern_error *err);
void tern_model_free(tern_model *m);

const tern_model_config *tern_model_cfg(const tern_model *m);
tern_backend *tern_model_backend(const tern_model *m);
int tern_model_max_batch(const tern_model *m); /* rows per forward the scratch was sized for */
/* Rows per forward (prefill chunk) when none is asked for. CPU: 512 (no gain from more, less scratch). GPU with
 * at least 70 GiB (gpu_bytes; 0 = not known, e.g. `tern fit` planning without the GPU): 8192 — a MoE expert's
 * strided batch then gets ~512 rows for one read of its weights instead of ~128, the dense GEMMs longer rows
 * (H200 8k prefill against 2048-row chunks: gemma4-26b-a4b 33.5-36.2k -> 40.4-43.4k tok/s, gemma4-12b +3-5 %,
 * llama3-8b +5-6 %; NOTES (al)); vLLM's server steps 8192 tokens on GPUs of that size too. Smaller GPUs: 2048
 * (an 8B model's prefill ran 13 % faster than in 512-row chunks). The CUDA backend's GEMM scratch follows the
 * rows (vt reserve_rows). The engine's --max-batch-tokens, `tern bench/generate --chunk` and `tern fit` default
 * to it. */
#define TERN_BIG_GPU_BYTES ((size_t)70 << 30)
int tern_model_default_batch(int gpu, size_t gpu_bytes);

/* One forward step. logits: host [n_want, n_vocab] (rows in batch order). The KV of every row is
 * written; tern_kv_reserve must have been called for each slot's positions. On error the
 * cache contents for these positions are unspecified but nothing else changes. */
tern_status tern_model_forward(tern_model *m, const tern_batch *b, tern_kv *kv, float *logits, tern_error *err);

/* Parameter count and bytes by stored dtype, for `tern info`. */
typedef struct tern_model_stats {
    int64_t n_params;
    size_t bytes_by_dtype[TERN_DT_COUNT];
    double bytes_per_token;   /* weight bytes one decode step reads (experts: K/E of them;
                                 embedding tables count once only when they are the tied head) */
    double expert_bytes;      /* (appended) bytes of every routed expert matrix (bytes_per_token holds K/E of them) */
} tern_model_stats;
void tern_model_get_stats(const tern_model *m, tern_model_stats *st);

/* On-device sampling (appended). The rows that ask for logits may ask for a token instead,
 * drawn by the backend (ops.h vt->sample) so that one int32 per row comes back instead of
 * n_vocab floats. smp->rows[k] describes the k-th wanted row of the batch: mode
 * TERN_SAMPLE_DRAW -> smp->ids[k] = its token (or a TERN_SAMPLE_ERR_*); TERN_SAMPLE_SKIP ->
 * its logits land at logits + k*V as with tern_model_forward (the logits rows of drawn tokens
 * and the ids of logits rows are unspecified). pairs: the lists the rows point into (at most TERN_MODEL_SAMPLE_PAIRS).
 * A step whose wanted rows are all drawn on the device runs as a step graph that downloads
 * only the ids; mixed steps run eagerly. smp == NULL: tern_model_forward. */
#define TERN_MODEL_SAMPLE_PAIRS (1 << 16)
typedef struct tern_batch_sample {
    const tern_sample_row *rows;  /* [n_want] */
    const tern_sample_pair *pairs;
    int n_pairs;
    int32_t *ids;                 /* [n_want] out */
} tern_batch_sample;
/* 1 when this model can draw on its device (the backend has vt->sample; tensor parallel: rank 0 draws). */
int tern_model_can_sample(const tern_model *m);
tern_status tern_model_forward_sample(tern_model *m, const tern_batch *b, tern_kv *kv, float *logits,
                                      const tern_batch_sample *smp, tern_error *err);
/* The pipelined decode (runtime/generate.c, runtime/sched.c): b holds n decode rows (every row wanted, no embeddings
 * or spans; n <= max_batch), each drawn on the device (smp->rows[0, n) mode TERN_SAMPLE_DRAW), queued as a step graph
 * without waiting. b->tokens NULL: row i's token is what row i of the previously launched step drew — it stays on the
 * device, so the host may queue this step before it has those ids (refused unless the launch before it had the same n
 * rows and nothing else ran on the model since). smp->ids are filled by tern_model_decode_wait(key); steps alternate
 * parity so that a queued step never rewrites outputs the host has yet to read. The caller reserves the KV positions
 * first, and releases or trims only what the queued steps do not read. Without graph launches (the CPU backend,
 * TERN_GRAPHS=0) the step runs at once (key 0) with the same semantics. Returns 1 and *key when queued, 0 when this
 * model cannot (tensor parallel, expert offload, dynamic rope, no device sampling, rows it refuses): run the step with
 * tern_model_forward_sample then. */
int tern_model_decode_launch(tern_model *m, const tern_batch *b, tern_kv *kv, int parity, const tern_batch_sample *smp,
                             uint64_t *key);
/* 1 when tern_model_decode_launch queues steps without waiting (a backend with step graphs, graphs on, and a model it
 * takes: no tensor parallelism, expert offload or dynamic rope); 0 when it would run each step at once or refuse */
int tern_model_decode_async(const tern_model *m);
/* waits for the n-row step launched with key and fills its smp->ids; 1 on success */
int tern_model_decode_wait(tern_model *m, uint64_t key, int n, const tern_batch_sample *smp);
/* The expert store when offload is on, else NULL (stats: tern_experts_get_stats). */
const struct tern_experts *tern_model_experts(const tern_model *m);

#endif
