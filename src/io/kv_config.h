/*
 * kv_config.h — choosing the KV cache page format of every layer: the `--kv-quant` spec
 * (DESIGN.md §7) and a model's `kv_config.json` (per-layer bits, as OptiQ / mlx-community
 * models ship it).
 *
 * Spec grammar (K and V alike unless noted):
 *   off | f32        full precision (default)
 *   f16 | bf16       16-bit floats
 *   8 | 4            affine 8/4-bit, groups of 64 along head_dim (MLX's default group)
 *   8:32 | 4:32      ... with another group size (32, 64 or 128)
 *   turbo            TurboQuant, 4-bit keys, 3-bit values
 *   turbo:K,V        TurboQuant with K-bit keys and V-bit values (2..4), e.g. turbo:4,3
 *   auto             kv_config.json when the model has one, else off (engine default on CPUs;
 *                    on a GPU see tern_kv_quant_default)
 *   config           kv_config.json, which must exist
 *   gpu-bf16         (internal, what auto means on a GPU in the bf16 mode) bf16 on every layer that
 *                    takes it, f32 on GLM's MLA latent layers
 * kv_config.json: a JSON array of {"layer_idx": L, "bits": B, "group_size": G} (affine,
 * OptiQ's form), optionally with "mode": "affine" | "turbo" | "f16" | "bf16" | "f32" and
 * "k_bits" / "v_bits" overriding "bits" per side. Layers it does not list stay F32.
 * An affine group that does not divide a layer's head_dim is halved until it does.
 */
#ifndef TERN_KV_CONFIG_H
#define TERN_KV_CONFIG_H

#include "io/config.h"
#include "ops/ops.h"

/* One spec (not auto/config) -> fmt[0] (K), fmt[1] (V). Errors name the spec. */
tern_status tern_kv_quant_parse(const char *spec, tern_kv_fmt fmt[2], tern_error *err);

/* kv_config.json text -> formats[n_layer * 2] (K at [2l], V at [2l+1]); unlisted layers F32. */
tern_status tern_kv_config_parse(const char *json, size_t len, const tern_model_config *cfg,
                                 tern_kv_fmt *formats, tern_error *err);

/* The formats to open a cache with (tern_kv_opts.formats): *out = NULL for all-F32, else a
 * malloc'd [n_layer * 2] array the caller frees. dir may be NULL (random models): then auto
 * means off and config is an error. *source (optional) is set to "kv_config.json", "--kv-quant"
 * or "off" for reports. */
tern_status tern_kv_quant_plan(const char *spec, const char *dir, const tern_model_config *cfg,
                               tern_kv_fmt **out, const char **source, tern_error *err);

/* The spec a backend opens its cache with for `spec` (NULL, "" and "auto" mean auto): explicit
 * specs pass through; auto on a CPU stays auto; auto on a GPU is "gpu-bf16" in the plain bf16
 * compute mode (BF16 pages: what transformers and llama.cpp keep on GPUs, half the bytes of F32;
 * the flash prefill and decode kernels read them) and "off" in the f32 and bf16x2 modes (exact /
 * f32-accurate contracts). One rule for the engine, the CLI and the server's memory report. */
const char *tern_kv_quant_default(const char *spec, int gpu, int plain_bf16);

#endif
