/*
 * test_io_config.c — config.json parsing: Gemma 4 (E2B-like flat, 26B-like nested with
 * k_eq_v + MoE, per_layer_config overrides, defaults), the llama family (llama3 rope
 * scaling, mistral sliding window, qwen2 biases, qwen3 qk-norm, rope_parameters form), the
 * MLX quantization block, GLM-5 glm_moe_dsa (defaults, derived indexer/MLP layer lists, yarn),
 * generation_config.json merging, and bad-input messages.
 */
#include "io/config.h"
#include "io_util.h"
#include "ops/ops.h"
#include "test.h"

#include <math.h>

static tern_error e;

static tern_status parse(tern_model_config *c, const char *json) {
    memset(&e, 0, sizeof e);
    return tern_config_parse(c, json, strlen(json), "config.json", &e);
}

/* expect failure with status want and message containing a and b */
static int bad(const char *json, tern_status want, const char *a, const char *b) {
    tern_model_config c;
    tern_status st = parse(&c, json);
    int ok = st == want && (!a || strstr(e.msg, a)) && (!b || strstr(e.msg, b)) && c.layers == NULL;
    if (!ok) printf("  got %d (want %d): %s\n", st, want, e.msg);
    tern_config_free(&c);
    return ok;
}

static char *e2b_json(char *buf, size_t n) {
    char lt[2048] = "";
    size_t k = 0;
    for (int l = 0; l < 35; l++)
        k += (size_t)snprintf(lt + k, sizeof lt - k, "%s\"%s\"", l ? "," : "",
                              l % 5 == 4 ? "full_attention" : "sliding_attention");
    snprintf(buf, n,
             "{\"architectures\":[\"Gemma4ForCausalLM\"],\"model_type\":\"gemma4_text\",\"vocab_size\":262144,"
             "\"hidden_size\":1536,\"intermediate_size\":6144,\"num_hidden_layers\":35,\"num_attention_heads\":8,"
             "\"num_key_value_heads\":1,\"num_global_key_value_heads\":null,\"head_dim\":256,\"global_head_dim\":512,"
             "\"sliding_window\":512,\"attention_k_eq_v\":false,\"num_kv_shared_layers\":20,"
             "\"hidden_size_per_layer_input\":256,\"vocab_size_per_layer_input\":262144,\"use_double_wide_mlp\":true,"
             "\"enable_moe_block\":false,\"final_logit_softcapping\":30.0,\"rms_norm_eps\":1e-06,"
             "\"max_position_embeddings\":131072,\"layer_types\":[%s],"
             "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0},"
             "\"full_attention\":{\"rope_type\":\"proportional\",\"partial_rotary_factor\":0.25,\"rope_theta\":1000000.0}},"
             "\"bos_token_id\":2,\"eos_token_id\":[1,106],\"pad_token_id\":0}",
             lt);
    return buf;
}

TEST(cfg_gemma4_e2b) {
    char js[8192];
    tern_model_config c;
    CHECK(parse(&c, e2b_json(js, sizeof js)) == TERN_OK, "%s", e.msg);
    if (!c.layers) return;
    CHECK(c.arch == TERN_ARCH_GEMMA4 && !strcmp(c.model_type, "gemma4_text"), "arch");
    CHECK(!strcmp(c.architecture, "Gemma4ForCausalLM"), "architectures");
    CHECK(c.n_layer == 35 && c.n_embd == 1536 && c.n_head == 8 && c.n_vocab == 262144, "dims");
    CHECK(c.ple_dim == 256 && c.ple_vocab == 262144 && c.final_logit_softcap == 30.0, "ple/softcap");
    CHECK(c.tie_embeddings == 1 && c.attn_scale == 1.0 && c.act == TERN_ACT_GELU_TANH && c.qk_norm == 1, "gemma consts");
    CHECK((float)c.embed_scale == sqrtf(1536.0f), "embed scale %g", c.embed_scale);
    for (int l = 0; l < 35; l++) {
        const tern_layer_config *L = &c.layers[l];
        int full = l % 5 == 4;
        CHECK(L->type == (full ? TERN_LAYER_FULL : TERN_LAYER_SLIDING), "type %d", l);
        CHECK(L->head_dim == (full ? 512 : 256) && L->n_head_kv == 1 && !L->k_eq_v && !L->moe, "geom %d", l);
        CHECK(L->n_ff == (l >= 15 ? 12288 : 6144), "n_ff %d = %d", l, L->n_ff);
        int src = l < 15 ? l : (full ? 14 : 13);
        CHECK(L->kv_src == src, "kv_src %d = %d want %d", l, L->kv_src, src);
    }
    CHECK(c.rope_sliding.type == TERN_ROPE_DEFAULT && c.rope_sliding.theta == 10000.0, "rope sliding");
    CHECK(c.rope_full.type == TERN_ROPE_PROPORTIONAL && c.rope_full.theta == 1e6 &&
          c.rope_full.partial_rotary_factor == 0.25 && c.rope_full.factor == 1.0, "rope full");
    CHECK(c.bos_id == 2 && c.pad_id == 0 && c.n_eos == 2 && c.eos_ids[0] == 1 && c.eos_ids[1] == 106, "ids");
    CHECK(!c.quant.enabled, "no quant");
    tern_config_free(&c);
    tern_config_free(&c); /* double free safe */
    tern_config_free(NULL);
}

static const char *k_26b =
    "{\"architectures\":[\"Gemma4ForConditionalGeneration\"],\"model_type\":\"gemma4\",\"eos_token_id\":[1,106],"
    "\"vision_config\":{\"model_type\":\"gemma4_vision\"},"
    "\"text_config\":{\"model_type\":\"gemma4_text\",\"hidden_size\":2816,\"intermediate_size\":2112,"
    "\"num_hidden_layers\":30,\"num_attention_heads\":16,\"num_key_value_heads\":8,\"num_global_key_value_heads\":2,"
    "\"head_dim\":256,\"global_head_dim\":512,\"attention_k_eq_v\":true,\"sliding_window\":1024,"
    "\"hidden_size_per_layer_input\":0,\"enable_moe_block\":true,\"num_experts\":128,\"top_k_experts\":8,"
    "\"moe_intermediate_size\":704,\"final_logit_softcapping\":30.0,\"max_position_embeddings\":262144}}";

TEST(cfg_gemma4_26b_nested) {
    tern_model_config c;
    CHECK(parse(&c, k_26b) == TERN_OK, "%s", e.msg);
    if (!c.layers) return;
    CHECK(!strcmp(c.model_type, "gemma4_text") && !strcmp(c.architecture, "Gemma4ForConditionalGeneration"), "types");
    CHECK(c.n_layer == 30 && c.n_expert == 128 && c.n_expert_used == 8 && c.n_ff_expert == 704, "moe");
    CHECK(c.ple_dim == 0 && c.sliding_window == 1024 && c.n_ctx_train == 262144, "misc");
    CHECK(c.n_eos == 2 && c.eos_ids[1] == 106, "eos from wrapper");
    for (int l = 0; l < 30; l++) {
        const tern_layer_config *L = &c.layers[l];
        int full = l % 6 == 5; /* default pattern; the last (29) is full anyway */
        CHECK(L->type == (full ? TERN_LAYER_FULL : TERN_LAYER_SLIDING), "type %d", l);
        CHECK(L->k_eq_v == full && L->head_dim == (full ? 512 : 256) && L->n_head_kv == (full ? 2 : 8), "geom %d", l);
        CHECK(L->moe == 1 && L->n_ff == 2112 && L->kv_src == l, "moe/ff %d", l);
    }
    CHECK(c.rope_full.type == TERN_ROPE_PROPORTIONAL && c.rope_full.partial_rotary_factor == 0.25, "default rope");
    tern_config_free(&c);
}

TEST(cfg_gemma4_per_layer_and_defaults) {
    tern_model_config c;
    /* re-saved form: no global_head_dim (null), per_layer_config overrides; last layer forced full */
    const char *js =
        "{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":7,\"hidden_size\":64,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"head_dim\":16,\"global_head_dim\":null,\"intermediate_size\":128,"
        "\"vocab_size\":100,\"per_layer_config\":{\"5\":{\"head_dim\":32,\"num_key_value_heads\":4},"
        "\"6\":{\"head_dim\":32}}}";
    CHECK(parse(&c, js) == TERN_OK, "%s", e.msg);
    if (c.layers) {
        CHECK(c.layers[5].type == TERN_LAYER_FULL && c.layers[5].head_dim == 32 && c.layers[5].n_head_kv == 4, "l5");
        CHECK(c.layers[6].type == TERN_LAYER_FULL && c.layers[6].head_dim == 32 && c.layers[6].n_head_kv == 2, "l6");
        CHECK(c.layers[4].type == TERN_LAYER_SLIDING && c.layers[4].head_dim == 16, "l4");
        CHECK(c.ple_dim == 256 && c.final_logit_softcap == 0 && c.sliding_window == 512 && c.norm_eps == 1e-6, "defaults");
    }
    tern_config_free(&c);
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":4,\"per_layer_config\":{\"9\":{}}}",
              TERN_EFORMAT, "per_layer_config", "\"9\""), "plc index");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":4,\"per_layer_config\":{\"1\":{\"head_dim\":-2}}}",
              TERN_EFORMAT, "per_layer_config.1.head_dim", "-2"), "plc value");
}

TEST(cfg_llama_family) {
    tern_model_config c;
    const char *l3 =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":128256,"
        "\"hidden_size\":2048,\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
        "\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"tie_word_embeddings\":true,"
        "\"max_position_embeddings\":131072,\"bos_token_id\":128000,\"eos_token_id\":128001,"
        "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}";
    CHECK(parse(&c, l3) == TERN_OK, "%s", e.msg);
    if (c.layers) {
        CHECK(c.arch == TERN_ARCH_LLAMA && c.head_dim == 64 && c.n_head_kv == 8 && c.act == TERN_ACT_SILU, "llama");
        CHECK(c.rope_full.type == TERN_ROPE_LLAMA3 && c.rope_full.factor == 32.0 && c.rope_full.theta == 500000.0 &&
              c.rope_full.original_max_pos == 8192 && c.rope_full.high_freq_factor == 4.0, "llama3 rope");
        CHECK(c.attn_scale == 0 && c.embed_scale == 0 && c.norm_eps == 1e-5 && c.tie_embeddings == 1, "scales");
        CHECK(c.layers[3].type == TERN_LAYER_FULL && c.sliding_window == 0 && !c.attention_bias && !c.qk_norm, "full");
        CHECK(c.n_eos == 1 && c.eos_ids[0] == 128001 && c.bos_id == 128000, "ids");
    }
    tern_config_free(&c);

    const char *q2 = "{\"model_type\":\"qwen2\",\"vocab_size\":151936,\"hidden_size\":896,\"intermediate_size\":4864,"
                     "\"num_hidden_layers\":24,\"num_attention_heads\":14,\"num_key_value_heads\":2,"
                     "\"rope_theta\":1000000.0,\"tie_word_embeddings\":true,\"use_sliding_window\":false,"
                     "\"sliding_window\":32768,\"max_window_layers\":21,\"rope_scaling\":null}";
    CHECK(parse(&c, q2) == TERN_OK, "%s", e.msg);
    if (c.layers) {
        CHECK(c.arch == TERN_ARCH_QWEN2 && c.attention_bias == 1 && c.head_dim == 64 && c.tie_embeddings, "qwen2");
        CHECK(c.sliding_window == 0 && c.layers[23].type == TERN_LAYER_FULL, "qwen2 no sliding");
        CHECK(c.rope_full.type == TERN_ROPE_DEFAULT && c.rope_full.theta == 1e6, "rope");
    }
    tern_config_free(&c);

    const char *q3 = "{\"model_type\":\"qwen3\",\"vocab_size\":151936,\"hidden_size\":1024,\"intermediate_size\":3072,"
                     "\"num_hidden_layers\":28,\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":128,"
                     "\"attention_bias\":false,\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                     "\"rope_theta\":1000000,\"original_max_position_embeddings\":32768}}";
    CHECK(parse(&c, q3) == TERN_OK, "%s", e.msg);
    if (c.layers) {
        CHECK(c.arch == TERN_ARCH_QWEN3 && c.qk_norm == 1 && c.head_dim == 128 && c.layers[0].head_dim == 128, "qwen3");
        CHECK(!c.attention_bias && !c.tie_embeddings, "qwen3 flags");
        CHECK(c.rope_full.type == TERN_ROPE_YARN && c.rope_full.factor == 4.0 && c.rope_full.theta == 1e6 &&
              c.rope_full.original_max_pos == 32768 && c.rope_full.beta_fast == 32 && c.rope_full.beta_slow == 1,
              "yarn");
    }
    tern_config_free(&c);

    const char *mi = "{\"model_type\":\"mistral\",\"vocab_size\":32000,\"hidden_size\":4096,\"intermediate_size\":14336,"
                     "\"num_hidden_layers\":4,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":null,"
                     "\"sliding_window\":4096,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0},"
                     "\"partial_rotary_factor\":0.5}";
    CHECK(parse(&c, mi) == TERN_OK, "%s", e.msg);
    if (c.layers) {
        CHECK(c.arch == TERN_ARCH_LLAMA && c.sliding_window == 4096 && c.head_dim == 128, "mistral");
        for (int l = 0; l < 4; l++) CHECK(c.layers[l].type == TERN_LAYER_SLIDING, "sliding %d", l);
        CHECK(c.rope_full.type == TERN_ROPE_LINEAR && c.rope_full.factor == 2.0 &&
              c.rope_full.partial_rotary_factor == 0.5, "linear rope");
    }
    tern_config_free(&c);
}

TEST(cfg_quantization) {
    tern_model_config c;
    const char *js =
        "{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
        "\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
        "\"model.layers.0.mlp.down_proj\":{\"bits\":8},\"model.layers.1.mlp.up_proj\":{\"group_size\":32,\"bits\":6},"
        "\"model.embed_tokens\":false},"
        "\"quantization_config\":{\"group_size\":64,\"bits\":4}}";
    CHECK(parse(&c, js) == TERN_OK, "%s", e.msg);
    int b = 0, g = 0;
    CHECK(c.quant.enabled && c.quant.bits == 4 && c.quant.group_size == 64 && !strcmp(c.quant.mode, "affine"), "global");
    CHECK(c.quant.n_overrides == 3, "n overrides %d", c.quant.n_overrides);
    CHECK(tern_quant_lookup(&c.quant, "model.layers.0.mlp.up_proj", &b, &g) == 1 && b == 4 && g == 64, "default");
    CHECK(tern_quant_lookup(&c.quant, "model.layers.0.mlp.down_proj", &b, &g) == 1 && b == 8 && g == 64, "override bits");
    CHECK(tern_quant_lookup(&c.quant, "model.layers.1.mlp.up_proj", &b, &g) == 1 && b == 6 && g == 32, "override both");
    CHECK(tern_quant_lookup(&c.quant, "model.embed_tokens", &b, &g) == 0, "false = disabled");
    CHECK(tern_quant_lookup(NULL, "x", &b, &g) == 0, "NULL");
    tern_config_free(&c);
    CHECK(parse(&c, "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":128,"
                    "\"num_hidden_layers\":2,\"num_attention_heads\":4}") == TERN_OK && !c.quant.enabled &&
              tern_quant_lookup(&c.quant, "x", &b, &g) == 0,
          "no quant");
    tern_config_free(&c);
#define QBASE "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":128," \
              "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
    CHECK(bad(QBASE "\"quantization\":{\"bits\":7,\"group_size\":64}}", TERN_EUNSUPPORTED, "quantization.bits", "7"),
          "bits 7");
    CHECK(bad(QBASE "\"quantization\":{\"bits\":4,\"group_size\":16}}", TERN_EUNSUPPORTED, "quantization.group_size",
              "16"), "gs 16");
    CHECK(bad(QBASE "\"quantization\":{\"bits\":4,\"group_size\":32,\"mode\":\"mxfp4\"}}", TERN_EUNSUPPORTED,
              "quantization.mode", "mxfp4"), "mode");
    CHECK(bad(QBASE "\"quantization\":{\"bits\":4,\"group_size\":32,\"a.b\":{\"bits\":1}}}", TERN_EUNSUPPORTED,
              "quantization.a.b.bits", "1"), "override bits");
    CHECK(bad(QBASE "\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}}", TERN_EUNSUPPORTED,
              "quant_method", "gptq"), "gptq");
}

/* GLM-5 (glm_moe_dsa): class defaults, the GLM-5.2 derived indexer pattern, explicit lists,
 * yarn (values from the glm5_yarn fixture's transformers model), bad inputs */
TEST(cfg_glm5) {
    tern_model_config c;
    CHECK(parse(&c, "{\"model_type\":\"glm_moe_dsa\"}") == TERN_OK, "%s", e.msg);
    if (c.layers) {
        CHECK(c.arch == TERN_ARCH_GLM5 && c.n_layer == 78 && c.n_embd == 6144 && c.n_vocab == 154880 && c.n_head == 64,
              "glm5 dims");
        CHECK(c.q_lora_rank == 2048 && c.kv_lora_rank == 512 && c.qk_nope_head_dim == 192 && c.qk_rope_head_dim == 64 &&
              c.v_head_dim == 256 && c.head_dim == 256, "mla dims");
        CHECK(c.n_expert == 256 && c.n_expert_used == 8 && c.n_ff_expert == 2048 && c.n_shared_experts == 1 &&
              c.n_group == 1 && c.topk_group == 1 && c.norm_topk_prob && c.routed_scaling_factor == 2.5, "moe");
        CHECK(c.index_topk == 2048 && c.index_n_heads == 32 && c.index_head_dim == 128, "indexer");
        CHECK(c.norm_eps == 1e-5 && c.mla_norm_eps == 1e-6 && c.index_norm_eps == 1e-6 && !c.tie_embeddings, "eps");
        CHECK(fabs(c.attn_scale - 1.0 / 16) < 1e-12 && c.rope_mscale == 1.0 && c.rope_full.theta == 10000.0, "scale");
        int full = 0, moe = 0;
        for (int l = 0; l < 78; l++) full += c.layers[l].dsa_full, moe += c.layers[l].moe;
        CHECK(full == 78 && moe == 75 && !c.layers[2].moe && c.layers[3].moe, "all full, 3 dense");
        CHECK(c.layers[5].kv_latent && c.layers[5].head_dim == 576 && c.layers[5].n_head_kv == 1 &&
              c.layers[5].kv_v_dim == 128 && c.layers[5].kv_src == 5, "latent kv geometry");
    }
    tern_config_free(&c);
    /* GLM-5.2: freq 4, offset 3 -> full = {0, 1, 2, 6, 10, ..., 74}; head_dim 192 ignored */
    CHECK(parse(&c, "{\"model_type\":\"glm_moe_dsa\",\"index_topk_freq\":4,\"index_skip_topk_offset\":3,"
                    "\"head_dim\":192,\"rope_parameters\":{\"rope_theta\":8000000,\"rope_type\":\"default\"},"
                    "\"rope_interleave\":true,\"indexer_rope_interleave\":true,\"num_nextn_predict_layers\":1}") == TERN_OK,
          "%s", e.msg);
    if (c.layers) {
        int full = 0, ok = 1;
        for (int l = 0; l < 78; l++) {
            int want = l <= 2 || (l - 2) % 4 == 0;
            full += c.layers[l].dsa_full;
            ok &= c.layers[l].dsa_full == want && c.layers[l].kv_v_dim == (want ? 128 : 0);
        }
        CHECK(ok && full == 21, "glm-5.2 pattern: %d full", full);
        CHECK(c.head_dim == 256 && c.rope_full.theta == 8e6, "head_dim ignored, theta");
    }
    tern_config_free(&c);
#define GBASE "{\"model_type\":\"glm_moe_dsa\",\"num_hidden_layers\":4,\"n_routed_experts\":8,\"n_group\":2," \
              "\"topk_group\":1,\"num_experts_per_tok\":3,"
    CHECK(parse(&c, GBASE "\"mlp_layer_types\":[\"dense\",\"sparse\",\"dense\",\"sparse\"],"
                    "\"index_topk_pattern\":\"FSFS\",\"first_k_dense_replace\":0}") == TERN_OK, "%s", e.msg);
    if (c.layers)
        CHECK(!c.layers[0].moe && c.layers[1].moe && !c.layers[2].moe && c.layers[1].dsa_full == 0 &&
              c.layers[2].dsa_full == 1, "explicit lists");
    tern_config_free(&c);
    CHECK(parse(&c, GBASE "\"indexer_types\":[\"full\",\"full\",\"shared\",\"full\"],\"index_topk_pattern\":\"FSSS\","
                    "\"first_k_dense_replace\":1}") == TERN_OK, "%s", e.msg);
    if (c.layers) CHECK(c.layers[1].dsa_full && !c.layers[2].dsa_full && !c.layers[0].moe && c.layers[1].moe,
                        "indexer_types wins");
    tern_config_free(&c);
    /* yarn, Hub form (glm5_yarn fixture: transformers 5.17 built attention_scaling 1.0249579607969668 and a
     * softmax scale of 0.1781279581324309 for d_qk = 48) */
    CHECK(parse(&c, "{\"model_type\":\"glm_moe_dsa\",\"num_hidden_layers\":2,\"qk_nope_head_dim\":32,"
                    "\"qk_rope_head_dim\":16,\"rope_theta\":10000.0,\"rope_scaling\":{\"rope_type\":\"yarn\","
                    "\"factor\":4.0,\"original_max_position_embeddings\":128,\"mscale\":1.0,\"mscale_all_dim\":0.8}}") == TERN_OK,
          "%s", e.msg);
    CHECK(c.rope_full.type == TERN_ROPE_YARN && fabs(c.rope_mscale - 1.0249579607969668) < 1e-12 &&
              fabs(c.attn_scale - 0.1781279581324309) < 1e-12, "yarn: %.17g %.17g", c.rope_mscale, c.attn_scale);
    tern_config_free(&c);
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"num_key_value_heads\":8}", TERN_EFORMAT,
              "num_key_value_heads: 8", "64"), "kv heads");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"n_group\":3}", TERN_EFORMAT, "n_group: 3", NULL), "groups");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"n_routed_experts\":8,\"n_group\":4,\"topk_group\":1}",
              TERN_EFORMAT, "num_experts_per_tok: 8", NULL), "too few kept experts");
    CHECK(bad(GBASE "\"indexer_types\":[\"shared\",\"full\",\"full\",\"full\"]}", TERN_EFORMAT, "indexer_types[0]",
              "full"), "layer 0 shared");
    CHECK(bad(GBASE "\"mlp_layer_types\":[\"dense\",\"moe\",\"dense\",\"dense\"]}", TERN_EFORMAT,
              "mlp_layer_types[1]", "\"moe\""), "mlp type");
    CHECK(bad(GBASE "\"index_topk_pattern\":\"FS\"}", TERN_EFORMAT, "index_topk_pattern", "2 letters"), "pattern");
    CHECK(bad(GBASE "\"indexer_types\":[\"full\"]}", TERN_EFORMAT, "indexer_types", "1 entries"), "types length");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"q_lora_rank\":null}", TERN_EUNSUPPORTED, "q_lora_rank", NULL),
          "no q lora");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"qk_rope_head_dim\":7}", TERN_EFORMAT, "qk_rope_head_dim: 7",
              "even"), "odd rope");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"hidden_act\":\"gelu\"}", TERN_EUNSUPPORTED, "hidden_act", "gelu"),
          "act");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8}}",
              TERN_EUNSUPPORTED, "only default and yarn", NULL), "rope kind");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"attention_bias\":true}", TERN_EUNSUPPORTED, "attention_bias",
              NULL), "bias");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"index_head_dim\":32}", TERN_EFORMAT, "index_head_dim: 32",
              "qk_rope_head_dim 64"), "index dim");
#undef GBASE
}

TEST(cfg_bad_inputs) {
    CHECK(bad("{\"model_type\":\"gemma4\",\"text_config\":{\"num_hidden_layers\":-3}}", TERN_EFORMAT,
              "config.json: text_config.num_hidden_layers: expected a positive integer, got -3", NULL), "neg layers");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":3,\"layer_types\":[\"full_attention\"]}",
              TERN_EFORMAT, "layer_types", "1 entries"), "layer_types length");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":2,\"layer_types\":[\"full_attention\",\"x\"]}",
              TERN_EFORMAT, "layer_types[1]", "\"x\""), "layer_types value");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"num_attention_heads\":8,\"num_key_value_heads\":3}", TERN_EFORMAT,
              "num_attention_heads (8)", "(3)"), "heads");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"vocab_size\":100000000}", TERN_EFORMAT, "vocab_size", "100000000"),
          "absurd vocab");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"hidden_size\":\"abc\"}", TERN_EFORMAT, "hidden_size", "\"abc\""),
          "string dim");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true}", TERN_EFORMAT, "num_experts", "missing"),
          "moe missing");
    CHECK(bad("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":4,\"num_kv_shared_layers\":4}", TERN_EFORMAT,
              "num_kv_shared_layers", NULL), "all shared");
    CHECK(bad("{\"model_type\":\"gemma4\"}", TERN_EFORMAT, "text_config", NULL), "wrapper without text_config");
    CHECK(bad("{\"model_type\":\"llama\",\"vocab_size\":10,\"intermediate_size\":8,\"num_hidden_layers\":1,"
              "\"num_attention_heads\":1}", TERN_EFORMAT, "config.json: hidden_size", "missing"), "missing hidden");
    CHECK(bad("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":10,\"intermediate_size\":8,"
              "\"num_hidden_layers\":1,\"num_attention_heads\":3}", TERN_EFORMAT, "hidden_size (10)", NULL), "hd");
    CHECK(bad("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
              "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"longrope\"}}",
              TERN_EUNSUPPORTED, "rope_scaling.rope_type", "longrope"), "rope type");
    CHECK(bad("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
              "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"eos_token_id\":[1,\"x\"]}",
              TERN_EFORMAT, "eos_token_id[1]", NULL), "eos");
    CHECK(bad("{\"model_type\":\"falcon\"}", TERN_EUNSUPPORTED, "falcon", "gemma4_text"), "unknown type");
    CHECK(bad("{\"model_type\":\"glm_moe_dsa\",\"kv_lora_rank\":0}", TERN_EFORMAT, "config.json: kv_lora_rank",
              NULL), "glm");
    CHECK(bad("{\"hidden_size\":3}", TERN_EFORMAT, "model_type", "missing"), "no model_type");
    CHECK(bad("{\"model_type\": \"llama\",\n \"x\": [1,}", TERN_EFORMAT, "not valid JSON", "line 2"), "not json");
    CHECK(bad("[1]", TERN_EFORMAT, "expected a JSON object", NULL), "array");
    CHECK(bad("", TERN_EFORMAT, "empty", NULL), "empty");
}

TEST(cfg_load_dir_generation) {
    io_mkdir("m1");
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", io_path("m1"));
    io_write_text(p, "{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"eos_token_id\":5}");
    snprintf(p, sizeof p, "%s/generation_config.json", io_path("m1"));
    io_write_text(p, "{\"eos_token_id\":[5,7],\"bos_token_id\":3,\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20}");
    tern_model_config c;
    CHECK(tern_config_load(&c, io_path("m1"), &e) == TERN_OK, "%s", e.msg);
    CHECK(c.n_eos == 2 && c.eos_ids[0] == 5 && c.eos_ids[1] == 7 && c.bos_id == 3, "merged ids");
    CHECK(c.gen_temperature == 0.6 && c.gen_top_p == 0.95 && c.gen_top_k == 20 && c.pad_id == -1, "sampling");
    tern_config_free(&c);
    io_write_text(p, "{\"top_p\": 3}");
    CHECK(tern_config_load(&c, io_path("m1"), &e) == TERN_EFORMAT && strstr(e.msg, "generation_config.json: top_p"),
          "%s", e.msg);
    io_mkdir("m2");
    CHECK(tern_config_load(&c, io_path("m2"), &e) == TERN_ENOTFOUND && strstr(e.msg, "config.json"), "%s", e.msg);
}

int main(void) {
    RUN(cfg_gemma4_e2b);
    RUN(cfg_gemma4_26b_nested);
    RUN(cfg_gemma4_per_layer_and_defaults);
    RUN(cfg_llama_family);
    RUN(cfg_quantization);
    RUN(cfg_glm5);
    RUN(cfg_bad_inputs);
    RUN(cfg_load_dir_generation);
    io_cleanup();
    return test_done();
}
