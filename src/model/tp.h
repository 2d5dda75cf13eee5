/*
 * tp.h — tensor + expert parallelism over the GPUs of one host (or CPU ranks, for tests).
 *
 * A TP group of N ranks: each rank has its own backend (CUDA device i, or a CPU backend with
 * 1/N of the threads), its own rank-local model (its shard of the weights, a config with the
 * local head / intermediate counts) and its own KV cache (its kv heads). A forward on rank 0's
 * model runs every rank's forward in lockstep on one host thread per rank; the model code is the
 * single-device code plus tern_allreduce_sum() after each row-parallel matmul (ops.h). Rank 0's
 * model, cache and backend are what the engine / CLI see; the group owns all of them.
 *
 * Sharding (docs/OFFLOAD.md "Multi-GPU"): q/k/v and gate/up split by output rows (heads /
 * intermediate: views), o_proj/down_proj by input columns (gathered once into new buffers; MLX
 * affine weights need in/N to be a multiple of the group size), kv heads with their q heads
 * (replicated when n_head_kv < N), routed experts by expert id (expert parallelism: every rank
 * routes every row with the replicated router and runs only its own experts); embeddings,
 * norms and router are replicated; the output head is vocabulary-parallel (rank r computes the
 * logits of its contiguous vocabulary rows — lm_head rows, or a row view of the whole tied
 * embedding — and gathers them into rank 0's logits, where device sampling draws). GLM-5: heads split (q_b_proj rows, W_UK/W_UV by
 * head, o_proj columns), latent cache / DSA indexer / route_group replicated, experts by id,
 * shared experts and dense layers like a dense MLP. Communication: NCCL on CUDA ranks, an
 * in-process barrier + host sum on CPU ranks (f32), NCCL in f32 or (bf16 compute) bf16 on CUDA
 * ranks. Each CUDA rank records and replays its own step graphs, all-reduces included, with
 * every graph decision taken by the whole group (tp.c).
 */
#ifndef TERN_TP_H
#define TERN_TP_H

#include "model/model.h"

typedef struct tern_tp tern_tp;

#define TERN_TP_MAX 16

typedef struct tern_tp_opts {
    int n;                /* ranks, 1..TERN_TP_MAX */
    int cuda;             /* 1: rank i on GPU i (NCCL); 0: CPU ranks */
    int n_threads;        /* CPU: threads over all ranks (0 = all cores), split evenly */
    tern_compute compute;
} tern_tp_opts;

/* Rank r's local configuration in a group of N (heads, kv heads, widths, the head's vocabulary rows
 * head_v0/head_vn) as tern_tp_load makes it, for planning (tern fit --gpus N); refuses geometries
 * that do not split. out->layers is malloc'd (free it; the other arrays are cfg's). */
tern_status tern_tp_rank_config(const tern_model_config *cfg, int N, int r, tern_model_config *out, tern_error *err);

/* Open the ranks' backends and the communicator. */
tern_status tern_tp_open(tern_tp **out, const tern_tp_opts *opts, tern_error *err);
/* Frees every rank's cache, model, backend and thread; accepts NULL. */
void tern_tp_close(tern_tp *tp);

int tern_tp_size(const tern_tp *tp);
tern_backend *tern_tp_backend(const tern_tp *tp, int rank);

/* Shard cfg + ws over the ranks and load the rank-local models (one after another; the store's
 * shard hook is set meanwhile). *out = rank 0's model: tern_model_forward on it runs the group.
 * cfg and ws must outlive the group. Refuses geometries that do not split, naming the field. */
tern_status tern_tp_load(tern_tp *tp, const tern_model_config *cfg, tern_weights *ws, const tern_model_opts *mo,
                         tern_model **out, tern_error *err);
/* Same from a model directory (config and weights owned by the group). */
tern_status tern_tp_load_dir(tern_tp *tp, const char *dir, const tern_model_opts *mo, tern_model **out,
                             tern_error *err);
/* One KV cache per rank with the same options; *out = rank 0's (the one to pass to forward).
 * Block tables follow rank 0's: its allocation decisions are copied to the ranks each step. */
tern_status tern_tp_kv_open(tern_tp *tp, const tern_kv_opts *ko, tern_kv **out, tern_error *err);

/* Ranks asked for by the environment: TERN_TP=N (tests, CPU), else 1. */
int tern_tp_env(void);

/* Tests (CPU ranks have no step graphs): give every rank's real backend these graph entries
 * (vtable ops.h semantics, called with the real backend) and route them through the group as
 * on CUDA ranks. Call after tern_tp_open, before the first forward. */
typedef struct tern_tp_graph_ops {
    int (*replay)(tern_backend *be, uint64_t key, void *out, size_t out_bytes);
    int (*begin)(tern_backend *be, uint64_t key, void *out, size_t out_bytes);
    int (*end)(tern_backend *be, int ok);
    void (*reset)(tern_backend *be);
} tern_tp_graph_ops;
void tern__tp_test_graphs(tern_tp *tp, const tern_tp_graph_ops *ops);

/* ---- CUDA side (src/backend/cuda/nccl.c, tp_remap.cu; only in CUDA builds) ---- */
typedef struct tern__nccl tern__nccl;
/* One communicator per rank (ncclCommInitAll over the ranks' devices); sets NCCL_NVLS_ENABLE=0
 * in the environment first unless it is set. */
tern_status tern__nccl_open(tern__nccl **out, tern_backend *const *bes, int n, tern_error *err);
void tern__nccl_close(tern__nccl *c);
/* In-place sum of y[count] over the ranks, enqueued on rank's backend stream (capturable);
 * bf16 on the wire when the ranks compute in bf16 (TERN_TP_ALLREDUCE=f32: always f32). */
void tern__nccl_allreduce(tern__nccl *c, int rank, tern_backend *be, float *y, size_t count);
/* x[count] += the rank-order sum of y in one kernel (the one-shot peer path, f32 wire); returns
 * 0 without enqueueing anything when that path does not apply (then: allreduce + add). */
int tern__nccl_allreduce_add(tern__nccl *c, int rank, tern_backend *be, float *x, float *y, size_t count);
/* Vocabulary-parallel head: rank q's src [rows, w[q]] goes to columns [c0[q], c0[q] + w[q]) of
 * rank 0's dst [rows, ld] (peer reads, else NCCL send/recv + 2-D copies); every rank calls it. */
void tern__nccl_gather_cols(tern__nccl *c, int rank, tern_backend *be, float *dst, const float *src, int rows,
                            int ld, const int *c0, const int *w);
/* Make be's GPU the calling thread's current device (ops that do not set it themselves). */
void tern__cuda_bind(tern_backend *be);
/* idx[i] = idx[i] - e0 when e0 <= idx[i] < e1, else -1 (on be's stream). */
void tern__cuda_expert_remap(tern_backend *be, int32_t *idx, int n, int e0, int e1);
/* One-shot all-reduce over peer memory (tp_remap.cu), for n <= cap floats: every rank calls it
 * with the same n in the same order; bufs[q] = rank q's staging [2][cap] floats, flags[q] rank
 * q's flags [TERN_TP_P2P_BLOCKS][TERN_TP_P2P_MAXR] (zeroed), cnt this rank's epochs
 * [TERN_TP_P2P_BLOCKS] (zeroed); peers' memory must be accessible (peer access enabled). */
#define TERN_TP_P2P_MAXR 8
#define TERN_TP_P2P_BLOCKS 32
void tern__cuda_tp_p2p_allreduce(tern_backend *be, float *y, size_t n, float *const *bufs, unsigned *const *flags,
                                 unsigned *cnt, size_t cap, int nr, int rank);
/* The same kernel with the residual add fused: x[i] += (rank-order sum) instead of y[i] = sum. */
void tern__cuda_tp_p2p_allreduce_add(tern_backend *be, float *x, float *y, size_t n, float *const *bufs,
                                     unsigned *const *flags, unsigned *cnt, size_t cap, int nr, int rank);
/* Gather over the same staging and barrier: rank q stages src [rows, w[q]] (rows * max w <= cap),
 * rank 0 copies every rank's block into dst [rows, ld] at columns c0[q]. */
void tern__cuda_tp_p2p_gather(tern_backend *be, float *dst, const float *src, int rows, int ld, const int *c0,
                              const int *w, float *const *bufs, unsigned *const *flags, unsigned *cnt, size_t cap,
                              int nr, int rank);
/* to_bf16: dst bf16[n] = src f32[n] (nearest even); else dst f32[n] = src bf16[n] (be's stream). */
void tern__cuda_tp_convert(tern_backend *be, void *dst, const void *src, size_t n, int to_bf16);

#endif
