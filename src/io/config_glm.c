/*
 * config_glm.c — config.json of GLM-5 / 5.1 / 5.2 (`glm_moe_dsa`) → tern_model_config.
 *
 * Mirrors GlmMoeDsaConfig of transformers 5.17 (reference/glm5.md §2): class defaults are
 * GLM-5's; `mlp_layer_types` wins over `first_k_dense_replace`; `indexer_types` wins over
 * `index_topk_pattern` ("FSS..."), which wins over the index_topk_freq / index_skip_topk_offset
 * formula (layer i is "full" iff max(i - offset + 1, 0) % freq == 0; freq 1 = all full);
 * `head_dim` in the file is ignored (transformers overwrites it with qk_rope_head_dim);
 * `rope_interleave` / `indexer_rope_interleave` are ignored (5.17 always pairs adjacent
 * elements); RoPE comes from `rope_parameters` or the legacy `rope_theta` + `rope_scaling`.
 * Hard-wired constants live in data here: q_a/kv_a RMSNorm eps 1e-6, indexer LayerNorm eps 1e-6.
 * The softmax scale is d_qk^-1/2, times mscale(factor, mscale_all_dim)^2 under yarn (§3.3).
 *
 * The KV page geometry is the MLA latent kind: per token and layer one K record of
 * kv_lora_rank + qk_rope_head_dim floats (normalized latent, roped key) and, on "full"
 * indexer layers, a V record of index_head_dim floats (the indexer key).
 * Messages name the file and the field, like the rest of config.c.
 */
#include "io/config_internal.h"

#include "base/json.h"
#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        tern_status s_ = (x);                                                                                      \
        if (s_) return s_;                                                                                         \
    } while (0)

#define BIG 10000000
#define HEADS 65536

/* A per-layer list of two words (`a` -> 1, `b` -> 0) into out[n]; *given = 0 when absent. */
static tern_status word_list(const cJSON *o, const char *key, const char *where, int n, const char *a, const char *b,
                             int *out, int *given, tern_error *err) {
    const cJSON *v = tern_json_item(o, key);
    char got[64];
    *given = 0;
    if (!v) return TERN_OK;
    if (!cJSON_IsArray(v))
        return tern_err(err, TERN_EFORMAT, "%s%s: expected an array, got %s", where, key,
                        tern_json_describe(v, got, sizeof got));
    if (cJSON_GetArraySize(v) != n)
        return tern_err(err, TERN_EFORMAT, "%s%s: has %d entries but num_hidden_layers is %d", where, key,
                        cJSON_GetArraySize(v), n);
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        const char *s = cJSON_IsString(c) ? c->valuestring : NULL;
        if (s && !strcmp(s, a)) out[i] = 1;
        else if (s && !strcmp(s, b)) out[i] = 0;
        else
            return tern_err(err, TERN_EFORMAT, "%s%s[%d]: expected \"%s\" or \"%s\", got %s", where, key, i, a, b,
                            tern_json_describe(c, got, sizeof got));
    }
    *given = 1;
    return TERN_OK;
}

/* indexer_types, else index_topk_pattern ("FS.." or a list), else the freq/offset formula. */
static tern_status indexer_types(const cJSON *o, const char *where, int n, int *full, tern_error *err) {
    int given = 0;
    TRY(word_list(o, "indexer_types", where, n, "full", "shared", full, &given, err));
    if (given) return TERN_OK;
    const cJSON *p = tern_json_item(o, "index_topk_pattern");
    char got[64];
    if (cJSON_IsString(p)) {
        const char *s = p->valuestring;
        if ((int)strlen(s) != n)
            return tern_err(err, TERN_EFORMAT, "%sindex_topk_pattern: has %d letters but num_hidden_layers is %d",
                            where, (int)strlen(s), n);
        for (int i = 0; i < n; i++) {
            if (s[i] != 'F' && s[i] != 'S')
                return tern_err(err, TERN_EFORMAT, "%sindex_topk_pattern[%d]: expected 'F' or 'S', got '%c'", where, i,
                                s[i]);
            full[i] = s[i] == 'F';
        }
        return TERN_OK;
    }
    if (p) {
        TRY(word_list(o, "index_topk_pattern", where, n, "full", "shared", full, &given, err));
        if (given) return TERN_OK;
        return tern_err(err, TERN_EFORMAT, "%sindex_topk_pattern: expected a string or a list, got %s", where,
                        tern_json_describe(p, got, sizeof got));
    }
    int freq, offset;
    TRY(tern_json_int32(o, "index_topk_freq", where, -BIG, BIG, 1, &freq, err));
    TRY(tern_json_int32(o, "index_skip_topk_offset", where, -BIG, BIG, 2, &offset, err));
    if (freq < 1) freq = 1; /* transformers: max(freq, 1) */
    for (int i = 0; i < n; i++) full[i] = (TERN_MAX(i - offset + 1, 0) % freq) == 0;
    return TERN_OK;
}

static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

tern_status tern__config_glm5(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err) {
    cfg->arch = TERN_ARCH_GLM5;
    char got[64];
    TRY(tern_json_int32(o, "vocab_size", where, 1, BIG, 154880, &cfg->n_vocab, err));
    TRY(tern_json_int32(o, "hidden_size", where, 1, BIG, 6144, &cfg->n_embd, err));
    TRY(tern_json_int32(o, "intermediate_size", where, 1, BIG, 12288, &cfg->n_ff, err));
    TRY(tern_json_int32(o, "moe_intermediate_size", where, 1, BIG, 2048, &cfg->n_ff_expert, err));
    TRY(tern_json_int32(o, "num_hidden_layers", where, 1, 10000, 78, &cfg->n_layer, err));
    TRY(tern_json_int32(o, "num_attention_heads", where, 1, HEADS, 64, &cfg->n_head, err));
    TRY(tern_json_int32(o, "num_key_value_heads", where, 1, HEADS, cfg->n_head, &cfg->n_head_kv, err));
    if (cfg->n_head_kv != cfg->n_head)
        return tern_err(err, TERN_EFORMAT, "%snum_key_value_heads: %d must equal num_attention_heads (%d) for MLA",
                        where, cfg->n_head_kv, cfg->n_head);
    if (!tern_json_item(o, "q_lora_rank") && cJSON_GetObjectItemCaseSensitive(o, "q_lora_rank"))
        return tern_err(err, TERN_EUNSUPPORTED, "%sq_lora_rank: null (a plain q_proj) is not supported", where);
    TRY(tern_json_int32(o, "q_lora_rank", where, 1, BIG, 2048, &cfg->q_lora_rank, err));
    TRY(tern_json_int32(o, "kv_lora_rank", where, 1, BIG, 512, &cfg->kv_lora_rank, err));
    TRY(tern_json_int32(o, "qk_nope_head_dim", where, 1, HEADS, 192, &cfg->qk_nope_head_dim, err));
    TRY(tern_json_int32(o, "qk_rope_head_dim", where, 2, HEADS, 64, &cfg->qk_rope_head_dim, err));
    TRY(tern_json_int32(o, "v_head_dim", where, 1, HEADS, 256, &cfg->v_head_dim, err));
    if (cfg->qk_rope_head_dim % 2)
        return tern_err(err, TERN_EFORMAT, "%sqk_rope_head_dim: %d must be even", where, cfg->qk_rope_head_dim);

    /* MoE: n_routed_experts (alias num_local_experts; legacy num_experts wins) */
    const char *ekey = tern_json_item(o, "num_experts") ? "num_experts"
                       : tern_json_item(o, "n_routed_experts") ? "n_routed_experts"
                       : "num_local_experts";
    TRY(tern_json_int32(o, ekey, where, 1, HEADS, 256, &cfg->n_expert, err));
    TRY(tern_json_int32(o, "num_experts_per_tok", where, 1, cfg->n_expert, 8, &cfg->n_expert_used, err));
    TRY(tern_json_int32(o, "n_shared_experts", where, 0, 1024, 1, &cfg->n_shared_experts, err));
    TRY(tern_json_int32(o, "n_group", where, 1, cfg->n_expert, 1, &cfg->n_group, err));
    TRY(tern_json_int32(o, "topk_group", where, 1, cfg->n_group, 1, &cfg->topk_group, err));
    TRY(tern_json_bool(o, "norm_topk_prob", where, 1, &cfg->norm_topk_prob, err));
    TRY(tern_json_num(o, "routed_scaling_factor", where, 0, 1e6, 2.5, 0, &cfg->routed_scaling_factor, err));
    int per = cfg->n_expert / cfg->n_group;
    if (cfg->n_expert % cfg->n_group || per < 2)
        return tern_err(err, TERN_EFORMAT,
                        "%sn_group: %d groups of n_routed_experts %d must each hold at least 2 experts (the group "
                        "score sums the top 2)", where, cfg->n_group, cfg->n_expert);
    if (cfg->n_expert_used > cfg->topk_group * per)
        return tern_err(err, TERN_EFORMAT, "%snum_experts_per_tok: %d exceeds the %d experts of topk_group %d groups",
                        where, cfg->n_expert_used, cfg->topk_group * per, cfg->topk_group);

    /* DSA indexer */
    TRY(tern_json_int32(o, "index_topk", where, 1, 1 << 24, 2048, &cfg->index_topk, err));
    TRY(tern_json_int32(o, "index_head_dim", where, 1, HEADS, 128, &cfg->index_head_dim, err));
    TRY(tern_json_int32(o, "index_n_heads", where, 1, HEADS, 32, &cfg->index_n_heads, err));
    if (cfg->index_head_dim < cfg->qk_rope_head_dim)
        return tern_err(err, TERN_EFORMAT, "%sindex_head_dim: %d is smaller than qk_rope_head_dim %d", where,
                        cfg->index_head_dim, cfg->qk_rope_head_dim);

    char act[32];
    TRY(tern_json_str(o, "hidden_act", where, "silu", act, sizeof act, err));
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return tern_err(err, TERN_EUNSUPPORTED, "%shidden_act: \"%s\" is not supported (silu)", where, act);
    cfg->act = TERN_ACT_SILU;
    TRY(tern_json_bool(o, "attention_bias", where, 0, &cfg->attention_bias, err));
    if (cfg->attention_bias)
        return tern_err(err, TERN_EUNSUPPORTED, "%sattention_bias: true is not supported for glm_moe_dsa", where);
    int mlp_bias;
    TRY(tern_json_bool(o, "mlp_bias", where, 0, &mlp_bias, err));
    if (mlp_bias) return tern_err(err, TERN_EUNSUPPORTED, "%smlp_bias: true is not supported for glm_moe_dsa", where);
    TRY(tern_json_num(o, "rms_norm_eps", where, 0, 1, 1e-5, 0, &cfg->norm_eps, err));
    TRY(tern_json_bool(o, "tie_word_embeddings", where, 0, &cfg->tie_embeddings, err));
    TRY(tern_json_int32(o, "max_position_embeddings", where, 1, 0x7fffffff, 202752, &cfg->n_ctx_train, err));
    TRY(tern_json_int32(o, "first_k_dense_replace", where, 0, 10000, 3, &cfg->first_k_dense_replace, err));
    cfg->mla_norm_eps = 1e-6;
    cfg->index_norm_eps = 1e-6;
    cfg->head_dim = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim; /* d_qk, for display */

    /* RoPE over the qk_rope_head_dim slice; transformers' default theta is 10000 when absent */
    TRY(tern__config_llama_rope(o, where, cfg, err));
    const tern_rope_params *rp = &cfg->rope_full;
    if (rp->type != TERN_ROPE_DEFAULT && rp->type != TERN_ROPE_YARN)
        return tern_err(err, TERN_EUNSUPPORTED, "%srope: only default and yarn RoPE are supported for glm_moe_dsa",
                        where);
    cfg->attn_scale = 1.0 / sqrt((double)cfg->head_dim);
    cfg->rope_mscale = 1.0;
    if (rp->type == TERN_ROPE_YARN) {
        double f = rp->factor;
        cfg->rope_mscale = rp->attention_factor > 0 ? rp->attention_factor
                           : (rp->mscale > 0 && rp->mscale_all_dim > 0)
                               ? yarn_mscale(f, rp->mscale) / yarn_mscale(f, rp->mscale_all_dim)
                               : yarn_mscale(f, 1.0);
        if (rp->mscale_all_dim > 0) cfg->attn_scale *= yarn_mscale(f, rp->mscale_all_dim) * yarn_mscale(f, rp->mscale_all_dim);
    }

    /* per-layer lists */
    int n = cfg->n_layer, given = 0;
    cfg->layers = calloc((size_t)n, sizeof *cfg->layers);
    int *tmp = calloc((size_t)n, sizeof *tmp);
    if (!cfg->layers || !tmp) { free(tmp); return tern_err(err, TERN_ENOMEM, "config: out of memory for %d layers", n); }
    tern_status st = word_list(o, "mlp_layer_types", where, n, "sparse", "dense", tmp, &given, err);
    for (int l = 0; !st && l < n; l++) cfg->layers[l].moe = given ? tmp[l] : l >= cfg->first_k_dense_replace;
    if (!st) st = indexer_types(o, where, n, tmp, err);
    if (!st && !tmp[0])
        st = tern_err(err, TERN_EFORMAT, "%sindexer_types[0]: layer 0 must be \"full\" (a shared layer reuses the top-k "
                      "of an earlier full layer)", where);
    for (int l = 0; !st && l < n; l++) {
        tern_layer_config *L = &cfg->layers[l];
        L->type = TERN_LAYER_FULL;
        L->dsa_full = tmp[l];
        L->kv_latent = 1;
        L->n_head_kv = 1;
        L->head_dim = cfg->kv_lora_rank + cfg->qk_rope_head_dim;
        L->kv_v_dim = tmp[l] ? cfg->index_head_dim : 0;
        L->n_ff = cfg->n_ff;
        L->kv_src = l;
    }
    free(tmp);
    (void)got;
    return st;
}
