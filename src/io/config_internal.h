/*
 * config_internal.h — helpers shared by config.c and config_quant.c (not public API).
 *
 * tern__config_ids: bos/pad/eos ids from one JSON object (fills only what is still unset,
 * so a nested text_config wins over the wrapper). tern__config_quant: the MLX
 * `quantization` / `quantization_config` block. tern__config_generation: merge a
 * generation_config.json (eos ids are unioned; bos/pad and sampling defaults override).
 */
#ifndef TERN_CONFIG_INTERNAL_H
#define TERN_CONFIG_INTERNAL_H

#include "io/config.h"

#include <cjson/cJSON.h>

tern_status tern__config_ids(tern_model_config *cfg, const cJSON *o, const char *where, tern_error *err);
tern_status tern__config_quant(tern_model_config *cfg, const cJSON *root, const char *where, tern_error *err);
/* GLM-5 glm_moe_dsa (config_glm.c) and the RoPE reader it shares with the llama family. */
tern_status tern__config_glm5(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err);
tern_status tern__config_llama_rope(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err);
tern_status tern__config_generation(tern_model_config *cfg, const char *json, size_t len, const char *name,
                                    tern_error *err);

#endif
