/*
 * presets.c — config.json strings of real geometries (see presets.h).
 */
#include "io/presets.h"

#include <stdio.h>
#include <string.h>

#define G4_ROPE "\"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}," \
    " \"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0}}"
#define G4_COMMON "\"model_type\": \"gemma4_text\", \"vocab_size\": 262144, \"head_dim\": 256, \"global_head_dim\": 512," \
    " \"rms_norm_eps\": 1e-06, \"final_logit_softcapping\": 30.0, \"tie_word_embeddings\": true," \
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"bos_token_id\": 2, \"eos_token_id\": [1, 106], " G4_ROPE

#define GLM5_COMMON "\"model_type\": \"glm_moe_dsa\", \"architectures\": [\"GlmMoeDsaForCausalLM\"]," \
    " \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true," \
    " \"routed_scaling_factor\": 2.5, \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false," \
    " \"hidden_act\": \"silu\", \"max_position_embeddings\": 202752, \"bos_token_id\": 0, \"eos_token_id\": 1," \
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}"

#define GLM5_COMMON_NOROPE "\"model_type\": \"glm_moe_dsa\", \"architectures\": [\"GlmMoeDsaForCausalLM\"]," \
    " \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true," \
    " \"routed_scaling_factor\": 2.5, \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false," \
    " \"hidden_act\": \"silu\", \"bos_token_id\": 0, \"eos_token_id\": [154820, 154827, 154829]"
#define GLM5_GEOM " \"hidden_size\": 6144, \"vocab_size\": 154880, \"num_attention_heads\": 64," \
    " \"num_key_value_heads\": 64, \"q_lora_rank\": 2048, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 192," \
    " \"qk_rope_head_dim\": 64, \"v_head_dim\": 256, \"intermediate_size\": 12288, \"moe_intermediate_size\": 2048," \
    " \"n_routed_experts\": 256, \"num_experts_per_tok\": 8, \"index_topk\": 2048, \"index_head_dim\": 128," \
    " \"index_n_heads\": 32"

static const struct { const char *name, *json; } k_presets[] = {
    {"gemma4-e2b", "{" G4_COMMON ", \"hidden_size\": 1536, \"num_hidden_layers\": 35, \"num_attention_heads\": 8,"
                   " \"num_key_value_heads\": 1, \"intermediate_size\": 6144, \"sliding_window\": 512,"
                   " \"num_kv_shared_layers\": 20, \"hidden_size_per_layer_input\": 256, \"vocab_size_per_layer_input\": 262144,"
                   " \"use_double_wide_mlp\": true, \"sliding_window_pattern\": 5, \"max_position_embeddings\": 131072,"
                   " \"layer_types\": [\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\"]}"},
    {"gemma4-e4b", "{" G4_COMMON ", \"hidden_size\": 2560, \"num_hidden_layers\": 42, \"num_attention_heads\": 8,"
                   " \"num_key_value_heads\": 2, \"intermediate_size\": 10240, \"sliding_window\": 512,"
                   " \"num_kv_shared_layers\": 18, \"hidden_size_per_layer_input\": 256, \"vocab_size_per_layer_input\": 262144,"
                   " \"use_double_wide_mlp\": false, \"max_position_embeddings\": 131072}"},
    {"gemma4-12b", "{" G4_COMMON ", \"hidden_size\": 3840, \"num_hidden_layers\": 48, \"num_attention_heads\": 16,"
                   " \"num_key_value_heads\": 8, \"num_global_key_value_heads\": 1, \"attention_k_eq_v\": true,"
                   " \"intermediate_size\": 15360, \"sliding_window\": 1024, \"num_kv_shared_layers\": 0,"
                   " \"hidden_size_per_layer_input\": 0, \"max_position_embeddings\": 262144}"},
    {"gemma4-26b-a4b", "{" G4_COMMON ", \"hidden_size\": 2816, \"num_hidden_layers\": 30, \"num_attention_heads\": 16,"
                   " \"num_key_value_heads\": 8, \"num_global_key_value_heads\": 2, \"attention_k_eq_v\": true,"
                   " \"intermediate_size\": 2112, \"sliding_window\": 1024, \"num_kv_shared_layers\": 0,"
                   " \"hidden_size_per_layer_input\": 0, \"enable_moe_block\": true, \"num_experts\": 128,"
                   " \"top_k_experts\": 8, \"moe_intermediate_size\": 704, \"max_position_embeddings\": 262144}"},
    {"gemma4-31b", "{" G4_COMMON ", \"hidden_size\": 5376, \"num_hidden_layers\": 60, \"num_attention_heads\": 32,"
                   " \"num_key_value_heads\": 16, \"num_global_key_value_heads\": 4, \"attention_k_eq_v\": true,"
                   " \"intermediate_size\": 21504, \"sliding_window\": 1024, \"num_kv_shared_layers\": 0,"
                   " \"hidden_size_per_layer_input\": 0, \"max_position_embeddings\": 262144}"},
    {"llama3-8b", "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 128256,"
                  " \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
                  " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
                  " \"max_position_embeddings\": 131072, \"bos_token_id\": 128000, \"eos_token_id\": 128001,"
                  " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                  " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}"},
    {"llama3-1b", "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 128256,"
                  " \"hidden_size\": 2048, \"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32,"
                  " \"num_key_value_heads\": 8, \"head_dim\": 64, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
                  " \"tie_word_embeddings\": true, \"max_position_embeddings\": 131072, \"bos_token_id\": 128000,"
                  " \"eos_token_id\": 128001, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0,"
                  " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}"},
    {"qwen3-0.6b", "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 151936,"
                   " \"hidden_size\": 1024, \"intermediate_size\": 3072, \"num_hidden_layers\": 28, \"num_attention_heads\": 16,"
                   " \"num_key_value_heads\": 8, \"head_dim\": 128, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
                   " \"tie_word_embeddings\": true, \"max_position_embeddings\": 40960, \"bos_token_id\": 151643,"
                   " \"eos_token_id\": 151645}"},
    /* GLM-5 / GLM-5.1 full geometry (reference/glm5.md §9.1): 78 layers, 3 dense, indexer on every
     * layer. For `tern fit` / `tern info --random` arithmetic (743.9 B parameters: not for bench). */
    {"glm5", "{" GLM5_COMMON_NOROPE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0},"
             " \"max_position_embeddings\": 202752," GLM5_GEOM ", \"num_hidden_layers\": 78, \"first_k_dense_replace\": 3}"},
    /* GLM-5.2: the same plus IndexCache (21 full / 57 shared indexer layers) and rope_theta 8e6 */
    {"glm5.2", "{" GLM5_COMMON_NOROPE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 8000000.0},"
               " \"max_position_embeddings\": 1048576," GLM5_GEOM ", \"num_hidden_layers\": 78, \"first_k_dense_replace\": 3,"
               " \"index_topk_freq\": 4, \"index_skip_topk_offset\": 3}"},
    /* GLM-5 (reference/glm5.md §9.1) cut to 2 layers: one dense with a full indexer, one MoE
     * (256 experts, top-8) sharing its selection (GLM-5.2 style). About 7 GB at --quant q4
     * (the experts alone are 19 GB in bf16, the --random default). */
    {"glm5-mini", "{" GLM5_COMMON ", \"hidden_size\": 6144, \"vocab_size\": 154880, \"num_hidden_layers\": 2,"
                  " \"num_attention_heads\": 64, \"num_key_value_heads\": 64, \"q_lora_rank\": 2048,"
                  " \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 192, \"qk_rope_head_dim\": 64, \"v_head_dim\": 256,"
                  " \"intermediate_size\": 12288, \"moe_intermediate_size\": 2048, \"n_routed_experts\": 256,"
                  " \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 1, \"index_topk\": 2048,"
                  " \"index_head_dim\": 128, \"index_n_heads\": 32, \"indexer_types\": [\"full\", \"shared\"]}"},
    /* GLM-5 (reference/glm5.md §9.1) cut to its first 8 layers: 3 dense (first_k_dense_replace)
     * and 5 MoE (256 experts, top-8, one shared expert), MLA heads and a DSA indexer on every
     * layer as in "glm5". The multi-GPU slice: ~52 B parameters, ~29 GB at --quant q4 (fits one
     * H200, so --gpus 2 compares against --gpus 1 on the same geometry). */
    {"glm5-slice8", "{" GLM5_COMMON ", " GLM5_GEOM ", \"num_hidden_layers\": 8, \"first_k_dense_replace\": 3}"},
    /* the same structure at toy widths; index_topk 64 so DSA selects from the 65th token on */
    {"glm5-tiny", "{" GLM5_COMMON ", \"hidden_size\": 256, \"vocab_size\": 4096, \"num_hidden_layers\": 4,"
                  " \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"q_lora_rank\": 128,"
                  " \"kv_lora_rank\": 64, \"qk_nope_head_dim\": 32, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
                  " \"intermediate_size\": 512, \"moe_intermediate_size\": 128, \"n_routed_experts\": 16,"
                  " \"num_experts_per_tok\": 4, \"first_k_dense_replace\": 1, \"index_topk\": 64,"
                  " \"index_head_dim\": 32, \"index_n_heads\": 4,"
                  " \"indexer_types\": [\"full\", \"shared\", \"full\", \"shared\"]}"},
};

const char *tern_preset_config(const char *name) {
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (name && !strcmp(name, k_presets[i].name)) return k_presets[i].json;
    return NULL;
}

tern_status tern_preset_random_spec(const char *spec, char *name, size_t cap, int *bits, tern_error *err) {
    snprintf(name, cap, "%s", spec ? spec : "");
    char *colon = strchr(name, ':');
    *bits = 0;
    if (colon) {
        *colon = 0;
        const int bf16 = !strcmp(colon + 1, "bf16"); /* the unquantized default, spelled out */
        if (!bf16 && (colon[1] != 'q' || colon[2] < '2' || colon[2] > '8' || colon[2] == '7' || colon[3]))
            return tern_err(err, TERN_EINVAL, "'random:%s': expected random:PRESET[:bf16|q2|q3|q4|q5|q6|q8]", spec);
        *bits = bf16 ? 0 : colon[2] - '0';
    }
    if (!tern_preset_config(name))
        return tern_err(err, TERN_ENOTFOUND, "unknown preset '%s' (known: %s)", name, tern_preset_names());
    return TERN_OK;
}

const char *tern_preset_names(void) {
    return "gemma4-e2b gemma4-e4b gemma4-12b gemma4-26b-a4b gemma4-31b llama3-8b llama3-1b qwen3-0.6b glm5 glm5.2 glm5-mini glm5-slice8 glm5-tiny";
}
