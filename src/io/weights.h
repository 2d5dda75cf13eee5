/*
 * weights.h — tensor lookup by canonical name over a model directory's safetensors.
 *
 * Canonical names are the HF text-model suffixes without any prefix:
 *   "embed_tokens", "norm", "layers.3.self_attn.q_proj", "layers.3.layer_scalar",
 *   "layers.3.router.scale", "layers.3.experts.gate", ... (see below)
 * The store detects the prefix in use ("model.", "model.language_model.",
 * "language_model.model.", none) and resolves `<name>.weight` / `<name>` (no suffix for
 * tensors such as layer_scalar), MLX quantized modules (`<name>.weight` u32 +
 * `<name>.scales` + `<name>.biases` with bits/group from the config's quantization block),
 * tied `lm_head`, and expert stacks in every stored form:
 *   canonical "layers.L.experts.gate" / ".up" / ".down" → 3-D [E, out, in] tensors from
 *     HF fused   experts.gate_up_proj [E, 2I, H] (views with mat_stride) + experts.down_proj,
 *     mlx        experts.switch_glu.{gate,up,down}_proj.weight (Gemma 4),
 *                mlp.switch_mlp.{gate,up,down}_proj.weight (GLM),
 *     per-expert mlp.experts.{e}.{gate,up,down}_proj.weight (stacked by copying once; with
 *                expert views on, not copied: a per-expert source table, see below).
 * Vision/audio tower tensors are ignored. Tensors never requested are reported by
 * tern_weights_unused() so a loader can name unexpected tensors.
 */
#ifndef TERN_WEIGHTS_H
#define TERN_WEIGHTS_H

#include "io/config.h"
#include "io/safetensors.h"
#include "ops/tensor.h"

typedef struct tern_weights tern_weights;

tern_status tern_weights_open(tern_weights **out, const char *dir, const tern_model_config *cfg, tern_error *err);
void tern_weights_close(tern_weights *w);
/* Same with safetensors open options (appended; --no-mmap, io/safetensors.h). NULL = mmap. */
tern_status tern_weights_open_opts(tern_weights **out, const char *dir, const tern_model_config *cfg,
                                   const tern_st_opts *sto, tern_error *err);

/* Look up a canonical tensor. Fills *t (logical shape; dtype TERN_DT_Q for MLX-quantized).
 * Returns TERN_ENOTFOUND (message names the canonical and the stored names tried).
 * If `shape` is non-NULL (ndim entries), also checks the logical shape and returns
 * TERN_EFORMAT naming the tensor, the file, the expected and the actual shape. */
tern_status tern_weights_get(tern_weights *w, const char *name, int ndim, const int64_t *shape,
                             tern_tensor *t, tern_error *err);
/* Like get, but absence is not an error: returns 0 (and leaves *t zeroed) if missing, 1 if found,
 * negative status on a shape/format mismatch. */
int tern_weights_try(tern_weights *w, const char *name, int ndim, const int64_t *shape,
                     tern_tensor *t, tern_error *err);

/* Names of stored tensors that no get/try touched (excluding ignored towers and known-unused
 * tensors marked with tern_weights_ignore). Returns count; fills up to max names. */
int tern_weights_unused(const tern_weights *w, const char **names, int max);
void tern_weights_ignore(tern_weights *w, const char *canonical_prefix);

/* A synthetic store for benchmarks: every get/try of a shaped tensor returns fresh random
 * data of that shape (no files), in the stored format of `spec`: bf16, or MLX affine Q with
 * spec->bits / group_size for matrices (vectors stay f32 near 1). "lm_head" is absent when the
 * config ties embeddings. Memory is owned by the store. */
typedef struct tern_synth_spec {
    int bits;          /* 0 = bf16; 2..8 = MLX affine */
    int group_size;    /* default 64 */
    uint64_t seed;
} tern_synth_spec;
tern_status tern_weights_open_synth(tern_weights **out, const tern_model_config *cfg, const tern_synth_spec *spec,
                                    tern_error *err);
/* internal (weights_synth.c) */
struct tern_synth *tern__synth_new(const tern_model_config *cfg, const tern_synth_spec *spec);
void tern__synth_free(struct tern_synth *s);
int tern__synth_try(struct tern_synth *s, const char *name, int ndim, const int64_t *shape, tern_tensor *t,
                    tern_error *err);

/* Shard hook (appended; tensor parallelism, src/model/tp.c). When set, every get/try passes the
 * found tensor through fn before the shape check: fn may replace *t by its rank's part (a view,
 * or a copy it owns) and returns 1 when it did (it has then checked the shape itself against the
 * requested local `shape`), 0 to leave *t to the ordinary check, or a negative status with
 * *err filled. fn NULL removes the hook. The store never frees what fn made. */
typedef int (*tern_weights_shard_fn)(void *ctx, const char *name, int ndim, const int64_t *shape, tern_tensor *t,
                                     tern_error *err);
void tern_weights_set_shard(tern_weights *w, tern_weights_shard_fn fn, void *ctx);
/* Its companion for synthetic stores (appended): before a synthetic tensor is made for a get/try, fn may shrink
 * `shape` (a copy of the requested one) to the rank's part — an expert or head stack asked for whole, whose shard
 * would be a view of a few of its matrices — so a rank makes only what it holds (GLM-5's 256 experts over 8 ranks:
 * 1/8 of the host memory and fill time). The shard fn then sees the local tensor and leaves it. Set after
 * tern_weights_set_shard with the same ctx; removing the shard fn removes it. */
typedef void (*tern_weights_local_fn)(void *ctx, const char *name, int ndim, int64_t *shape);
void tern_weights_set_shard_local(tern_weights *w, tern_weights_local_fn fn);

/* The detected stored-name prefix ("model.", "model.language_model.", ... or ""). */
const char *tern_weights_prefix(const tern_weights *w);
/* The underlying safetensors set (for metadata / listing). */
const tern_st_set *tern_weights_set(const tern_weights *w);

/* Per-expert sources (appended; expert offload, docs/OFFLOAD.md). With views on, a stack built
 * from per-expert tensors ("mlp.experts.{e}.*") is NOT copied: get/try return a [E, out, in]
 * tensor whose data/scales/biases are expert 0's stored bytes (the other experts are elsewhere:
 * only tern_weights_expert_views tells where), and the table below gives every expert's stored
 * bytes (inside the file mapping). Only the expert store may use such a tensor. A views stack
 * requested again with views off is copied then. Default off. */
typedef struct tern_expert_src {
    const void *data, *scales, *biases; /* expert e's matrix; MLX scales + biases, or FP8 block scales */
} tern_expert_src;
void tern_weights_set_expert_views(tern_weights *w, int on);
/* The E-entry source table of a per-expert stack returned by get/try (matched by its name), or
 * NULL for a stack stored contiguously (fused / mlx). Also given when the stack was copied too
 * (views off earlier): the store may read either. Owned by the store. */
/* e0: the stack holds experts [e0, e0 + stack->shape[0]) of the stored ones (an expert-parallel
 * rank's cut); the table returned starts at expert e0 */
const tern_expert_src *tern_weights_expert_views(const tern_weights *w, const tern_tensor *stack, int e0);
/* Bytes copied so far into stacks built from per-expert tensors (0 = none copied). */
size_t tern_weights_stacked_bytes(const tern_weights *w);
/* Host bytes a synthetic store has allocated so far (0 for a file store). */
size_t tern_weights_synth_bytes(const tern_weights *w);
size_t tern__synth_bytes(const struct tern_synth *s); /* internal (weights_synth.c) */

#endif
