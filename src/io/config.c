/*
 * config.c — config.json (+ generation_config.json) → tern_model_config.
 *
 * One entry point per family, each reading top to bottom like the transformers config
 * class it mirrors: gemma4_config() (flat Hub fields or a nested `text_config`, derived
 * per-layer geometry exactly as reference/gemma4.md §2.1, then `per_layer_config`
 * overrides) and llama_config() (llama, mistral, qwen2, qwen3). Missing keys take the
 * transformers defaults (not mlx-lm's); the one exception is Gemma's
 * hidden_size_per_layer_input, which defaults to 256 (both libraries) but is 0 when null.
 * RoPE is read from `rope_parameters` (transformers 5, per layer type for Gemma 4) or the
 * Hub `rope_theta` + `rope_scaling` form. The MLX quantization block and the special token
 * ids live in config_quant.c.
 *
 * Every value is range-checked; messages name the file and the dotted field path, e.g.
 *   config.json: text_config.num_hidden_layers: expected a positive integer, got -3
 * Bad input returns an error; nothing here aborts.
 */
#include "io/config.h"
#include "io/config_internal.h"

#include "base/file.h"
#include "base/json.h"
#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ceilings far above any real model; larger values mean a corrupt or hostile file. */
#define MAX_LAYERS 10000
#define MAX_VOCAB 10000000
#define MAX_DIM 10000000
#define MAX_HEADS 65536
#define MAX_POS 2147483647

#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        tern_status s_ = (x);                                                                                      \
        if (s_) return s_;                                                                                         \
    } while (0)

const char *tern_arch_name(tern_arch a) {
    switch (a) {
    case TERN_ARCH_GEMMA4: return "gemma4";
    case TERN_ARCH_LLAMA: return "llama";
    case TERN_ARCH_QWEN2: return "qwen2";
    case TERN_ARCH_QWEN3: return "qwen3";
    case TERN_ARCH_GLM5: return "glm5";
    default: return "unknown";
    }
}

/* ---- RoPE ------------------------------------------------------------------------ */

static tern_status rope_type_of(const char *s, const char *where, const char *key, tern_rope_type *out,
                                tern_error *err) {
    static const struct { const char *name; tern_rope_type t; } tab[] = {
        {"default", TERN_ROPE_DEFAULT}, {"proportional", TERN_ROPE_PROPORTIONAL}, {"linear", TERN_ROPE_LINEAR},
        {"dynamic", TERN_ROPE_DYNAMIC}, {"llama3", TERN_ROPE_LLAMA3},             {"yarn", TERN_ROPE_YARN},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(tab); i++)
        if (!strcmp(s, tab[i].name)) {
            *out = tab[i].t;
            return TERN_OK;
        }
    return tern_err(err, TERN_EUNSUPPORTED,
                    "%s%s: rope type \"%.40s\" is not supported (default, proportional, linear, dynamic, llama3, yarn)",
                    where, key, s);
}

/* Fill rp from a rope dict (rope_scaling / rope_parameters form). Fields absent in `o`
 * keep their current values, so callers pre-set the defaults. */
static tern_status rope_read(const cJSON *o, const char *where, tern_rope_params *rp, tern_error *err) {
    if (!o) return TERN_OK;
    char got[64];
    if (!cJSON_IsObject(o))
        return tern_err(err, TERN_EFORMAT, "%s: expected an object, got %s", where,
                        tern_json_describe(o, got, sizeof got));
    char w[200];
    snprintf(w, sizeof w, "%s.", where);
    const char *tkey = tern_json_item(o, "rope_type") ? "rope_type" : "type";
    char t[32];
    if (tern_json_item(o, tkey)) {
        TRY(tern_json_str(o, tkey, w, NULL, t, sizeof t, err));
        TRY(rope_type_of(t, w, tkey, &rp->type, err));
    }
    TRY(tern_json_num(o, "rope_theta", w, 1e-6, 1e30, rp->theta, 0, &rp->theta, err));
    TRY(tern_json_num(o, "partial_rotary_factor", w, 1e-6, 1.0, rp->partial_rotary_factor, 0,
                      &rp->partial_rotary_factor, err));
    TRY(tern_json_num(o, "factor", w, 1e-6, 1e9, rp->factor, 0, &rp->factor, err));
    TRY(tern_json_num(o, "low_freq_factor", w, 1e-9, 1e9, rp->low_freq_factor, 0, &rp->low_freq_factor, err));
    TRY(tern_json_num(o, "high_freq_factor", w, 1e-9, 1e9, rp->high_freq_factor, 0, &rp->high_freq_factor, err));
    TRY(tern_json_int32(o, "original_max_position_embeddings", w, 1, MAX_POS, rp->original_max_pos,
                        &rp->original_max_pos, err));
    TRY(tern_json_num(o, "beta_fast", w, -1e9, 1e9, rp->beta_fast, 0, &rp->beta_fast, err));
    TRY(tern_json_num(o, "beta_slow", w, -1e9, 1e9, rp->beta_slow, 0, &rp->beta_slow, err));
    TRY(tern_json_num(o, "attention_factor", w, 0, 1e9, rp->attention_factor, 0, &rp->attention_factor, err));
    TRY(tern_json_num(o, "mscale", w, -1e9, 1e9, rp->mscale, 0, &rp->mscale, err));
    TRY(tern_json_num(o, "mscale_all_dim", w, -1e9, 1e9, rp->mscale_all_dim, 0, &rp->mscale_all_dim, err));
    if (rp->type == TERN_ROPE_LLAMA3 && rp->high_freq_factor <= rp->low_freq_factor)
        return tern_err(err, TERN_EFORMAT, "%s: high_freq_factor (%g) must exceed low_freq_factor (%g)", where,
                        rp->high_freq_factor, rp->low_freq_factor);
    return TERN_OK;
}

static void rope_defaults(tern_rope_params *rp, tern_rope_type type, double theta, int max_pos) {
    memset(rp, 0, sizeof *rp);
    rp->type = type;
    rp->theta = theta;
    rp->partial_rotary_factor = 1.0;
    rp->factor = 1.0;
    rp->low_freq_factor = 1.0;  /* llama3 defaults (transformers) */
    rp->high_freq_factor = 4.0;
    rp->original_max_pos = max_pos;
    rp->beta_fast = 32.0;       /* yarn defaults */
    rp->beta_slow = 1.0;
}

/* ---- layer types ----------------------------------------------------------------- */

/* layer_types → layers[].type (validated); `dflt` fills them when the key is absent. */
static tern_status read_layer_types(const cJSON *o, const char *where, tern_model_config *cfg, int *given,
                                    tern_error *err) {
    const cJSON *lt = tern_json_item(o, "layer_types");
    char got[64];
    *given = 0;
    if (!lt) return TERN_OK;
    if (!cJSON_IsArray(lt))
        return tern_err(err, TERN_EFORMAT, "%slayer_types: expected an array, got %s", where,
                        tern_json_describe(lt, got, sizeof got));
    int n = cJSON_GetArraySize(lt);
    if (n != cfg->n_layer)
        return tern_err(err, TERN_EFORMAT, "%slayer_types: has %d entries but num_hidden_layers is %d", where, n,
                        cfg->n_layer);
    int i = 0;
    for (const cJSON *c = lt->child; c; c = c->next, i++) {
        const char *s = cJSON_IsString(c) ? c->valuestring : NULL;
        if (s && !strcmp(s, "full_attention")) cfg->layers[i].type = TERN_LAYER_FULL;
        else if (s && !strcmp(s, "sliding_attention")) cfg->layers[i].type = TERN_LAYER_SLIDING;
        else
            return tern_err(err, TERN_EFORMAT,
                            "%slayer_types[%d]: expected \"full_attention\" or \"sliding_attention\", got %s", where,
                            i, tern_json_describe(c, got, sizeof got));
    }
    *given = 1;
    return TERN_OK;
}

static tern_status alloc_layers(tern_model_config *cfg, tern_error *err) {
    cfg->layers = calloc((size_t)cfg->n_layer, sizeof *cfg->layers);
    if (!cfg->layers) return tern_err(err, TERN_ENOMEM, "config: out of memory for %d layers", cfg->n_layer);
    return TERN_OK;
}

static tern_status check_heads(const tern_model_config *cfg, const char *where, tern_error *err) {
    for (int l = 0; l < cfg->n_layer; l++) {
        const tern_layer_config *L = &cfg->layers[l];
        if (L->n_head_kv < 1 || L->head_dim < 1)
            return tern_err(err, TERN_EFORMAT, "%slayer %d: head_dim %d / num_key_value_heads %d must be positive",
                            where, l, L->head_dim, L->n_head_kv);
        if (cfg->n_head % L->n_head_kv)
            return tern_err(err, TERN_EFORMAT,
                            "%slayer %d: num_attention_heads (%d) is not a multiple of its key/value heads (%d)",
                            where, l, cfg->n_head, L->n_head_kv);
    }
    return TERN_OK;
}

/* ---- Gemma 4 --------------------------------------------------------------------- */

/* per_layer_config: {"5": {"head_dim": 512, "num_key_value_heads": 4}, ...} (or a list). */
static tern_status gemma4_per_layer(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err) {
    const cJSON *plc = tern_json_item(o, "per_layer_config");
    char got[64], w[200];
    if (!plc) return TERN_OK;
    if (!cJSON_IsObject(plc) && !cJSON_IsArray(plc))
        return tern_err(err, TERN_EFORMAT, "%sper_layer_config: expected an object, got %s", where,
                        tern_json_describe(plc, got, sizeof got));
    int idx = 0;
    for (const cJSON *c = plc->child; c; c = c->next, idx++) {
        int l = idx;
        if (cJSON_IsObject(plc)) {
            char *end = NULL;
            long v = c->string ? strtol(c->string, &end, 10) : -1;
            if (!c->string || !*c->string || *end || v < 0 || v >= cfg->n_layer)
                return tern_err(err, TERN_EFORMAT, "%sper_layer_config: key \"%.40s\" is not a layer index in [0, %d)",
                                where, c->string ? c->string : "", cfg->n_layer);
            l = (int)v;
        } else if (idx >= cfg->n_layer) {
            return tern_err(err, TERN_EFORMAT, "%sper_layer_config: has more than %d entries", where, cfg->n_layer);
        }
        if (cJSON_IsNull(c)) continue;
        snprintf(w, sizeof w, "%sper_layer_config.%d.", where, l);
        if (!cJSON_IsObject(c))
            return tern_err(err, TERN_EFORMAT, "%.190s: expected an object, got %s", w,
                            tern_json_describe(c, got, sizeof got));
        tern_layer_config *L = &cfg->layers[l];
        TRY(tern_json_int32(c, "head_dim", w, 1, MAX_HEADS, L->head_dim, &L->head_dim, err));
        TRY(tern_json_int32(c, "num_key_value_heads", w, 1, MAX_HEADS, L->n_head_kv, &L->n_head_kv, err));
        TRY(tern_json_int32(c, "intermediate_size", w, 1, MAX_DIM, L->n_ff, &L->n_ff, err));
    }
    return TERN_OK;
}

static tern_status gemma4_rope(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err) {
    rope_defaults(&cfg->rope_sliding, TERN_ROPE_DEFAULT, 10000.0, cfg->n_ctx_train);
    rope_defaults(&cfg->rope_full, TERN_ROPE_PROPORTIONAL, 1000000.0, cfg->n_ctx_train);
    cfg->rope_full.partial_rotary_factor = 0.25;
    const cJSON *rp = tern_json_item(o, "rope_parameters");
    char got[64], w[200];
    if (!rp) return TERN_OK;
    if (!cJSON_IsObject(rp))
        return tern_err(err, TERN_EFORMAT, "%srope_parameters: expected an object, got %s", where,
                        tern_json_describe(rp, got, sizeof got));
    const cJSON *sl = tern_json_item(rp, "sliding_attention"), *fu = tern_json_item(rp, "full_attention");
    if (fu) cfg->rope_full.partial_rotary_factor = 1.0; /* an explicit dict states its own factor */
    snprintf(w, sizeof w, "%srope_parameters.sliding_attention", where);
    TRY(rope_read(sl, w, &cfg->rope_sliding, err));
    snprintf(w, sizeof w, "%srope_parameters.full_attention", where);
    TRY(rope_read(fu, w, &cfg->rope_full, err));
    return TERN_OK;
}

static tern_status gemma4_config(const cJSON *root, const char *rwhere, const cJSON *o, const char *where,
                                 tern_model_config *cfg, tern_error *err) {
    cfg->arch = TERN_ARCH_GEMMA4;
    TRY(tern_json_int32(o, "vocab_size", where, 1, MAX_VOCAB, 262144, &cfg->n_vocab, err));
    TRY(tern_json_int32(o, "hidden_size", where, 1, MAX_DIM, 2304, &cfg->n_embd, err));
    TRY(tern_json_int32(o, "intermediate_size", where, 1, MAX_DIM, 9216, &cfg->n_ff, err));
    TRY(tern_json_int32(o, "num_hidden_layers", where, 1, MAX_LAYERS, 30, &cfg->n_layer, err));
    TRY(tern_json_int32(o, "num_attention_heads", where, 1, MAX_HEADS, 8, &cfg->n_head, err));
    TRY(tern_json_int32(o, "num_key_value_heads", where, 1, MAX_HEADS, 4, &cfg->n_head_kv, err));
    TRY(tern_json_int32(o, "num_global_key_value_heads", where, 1, MAX_HEADS, 0, &cfg->n_head_kv_global, err));
    TRY(tern_json_int32(o, "head_dim", where, 1, MAX_HEADS, 256, &cfg->head_dim, err));
    /* explicit null means "none" for these two (transformers keeps None; missing takes the default) */
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "global_head_dim"))) cfg->global_head_dim = 0;
    else TRY(tern_json_int32(o, "global_head_dim", where, 0, MAX_HEADS, 512, &cfg->global_head_dim, err));
    TRY(tern_json_int32(o, "sliding_window", where, 1, MAX_POS, 512, &cfg->sliding_window, err));
    TRY(tern_json_bool(o, "attention_k_eq_v", where, 0, &cfg->attention_k_eq_v, err));
    TRY(tern_json_int32(o, "num_kv_shared_layers", where, 0, cfg->n_layer, 0, &cfg->n_kv_shared_layers, err));
    /* gemma4_unified (the 12B) has no per-layer embeddings: its config omits the key */
    const cJSON *mt_item = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    int unified = cJSON_IsString(mt_item) && !strncmp(mt_item->valuestring, "gemma4_unified", 14);
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "hidden_size_per_layer_input"))) cfg->ple_dim = 0;
    else TRY(tern_json_int32(o, "hidden_size_per_layer_input", where, 0, MAX_DIM, unified ? 0 : 256, &cfg->ple_dim, err));
    TRY(tern_json_int32(o, "vocab_size_per_layer_input", where, 1, MAX_VOCAB, 262144, &cfg->ple_vocab, err));
    if (!cfg->ple_dim) cfg->ple_vocab = 0;
    TRY(tern_json_bool(o, "use_double_wide_mlp", where, 0, &cfg->double_wide_mlp, err));
    TRY(tern_json_num(o, "final_logit_softcapping", where, 0, 1e9, 0, 0, &cfg->final_logit_softcap, err));
    TRY(tern_json_num(o, "rms_norm_eps", where, 0, 1, 1e-6, 0, &cfg->norm_eps, err));
    TRY(tern_json_int32(o, "max_position_embeddings", where, 1, MAX_POS, 131072, &cfg->n_ctx_train, err));
    TRY(tern_json_bool(o, "attention_bias", where, 0, &cfg->attention_bias, err));
    /* tie_word_embeddings may sit on the wrapper or the text config */
    const cJSON *tsrc = tern_json_item(o, "tie_word_embeddings") ? o : root;
    TRY(tern_json_bool(tsrc, "tie_word_embeddings", tsrc == o ? where : rwhere, 1, &cfg->tie_embeddings,
                       err));
    int moe = 0;
    TRY(tern_json_bool(o, "enable_moe_block", where, 0, &moe, err));
    if (moe) {
        TRY(tern_json_int32(o, "num_experts", where, 1, MAX_HEADS, TERN_JSON_REQUIRED, &cfg->n_expert, err));
        TRY(tern_json_int32(o, "top_k_experts", where, 1, cfg->n_expert, TERN_JSON_REQUIRED, &cfg->n_expert_used,
                            err));
        TRY(tern_json_int32(o, "moe_intermediate_size", where, 1, MAX_DIM, TERN_JSON_REQUIRED, &cfg->n_ff_expert,
                            err));
    }
    cfg->attn_scale = 1.0;
    cfg->embed_scale = (double)sqrtf((float)cfg->n_embd);
    cfg->act = TERN_ACT_GELU_TANH;
    cfg->qk_norm = 1;
    TRY(gemma4_rope(o, where, cfg, err));

    TRY(alloc_layers(cfg, err));
    int given = 0;
    TRY(read_layer_types(o, where, cfg, &given, err));
    for (int l = 0; !given && l < cfg->n_layer; l++)
        cfg->layers[l].type = (l % 6 == 5) ? TERN_LAYER_FULL : TERN_LAYER_SLIDING;
    cfg->layers[cfg->n_layer - 1].type = TERN_LAYER_FULL; /* transformers forces the last layer to full */

    /* reference/gemma4.md §2.1 */
    int first_shared = cfg->n_layer - cfg->n_kv_shared_layers;
    for (int l = 0; l < cfg->n_layer; l++) {
        tern_layer_config *L = &cfg->layers[l];
        int full = L->type == TERN_LAYER_FULL, shared = cfg->n_kv_shared_layers > 0 && l >= first_shared;
        L->head_dim = (full && cfg->global_head_dim) ? cfg->global_head_dim : cfg->head_dim;
        L->k_eq_v = cfg->attention_k_eq_v && full;
        L->n_head_kv = (L->k_eq_v && cfg->n_head_kv_global) ? cfg->n_head_kv_global : cfg->n_head_kv;
        L->n_ff = cfg->n_ff * ((cfg->double_wide_mlp && shared) ? 2 : 1);
        L->moe = moe;
        L->kv_src = l;
        if (shared) {
            L->kv_src = -1;
            for (int j = first_shared - 1; j >= 0; j--)
                if (cfg->layers[j].type == L->type) {
                    L->kv_src = j;
                    break;
                }
            if (L->kv_src < 0)
                return tern_err(err, TERN_EFORMAT,
                                "%snum_kv_shared_layers: layer %d (%s) shares KV but no earlier non-shared layer has "
                                "that type",
                                where, l, full ? "full_attention" : "sliding_attention");
        }
    }
    TRY(gemma4_per_layer(o, where, cfg, err));
    for (int l = first_shared; l < cfg->n_layer; l++) {
        const tern_layer_config *L = &cfg->layers[l], *S = &cfg->layers[L->kv_src];
        if (L->head_dim != S->head_dim || L->n_head_kv != S->n_head_kv)
            return tern_err(err, TERN_EFORMAT,
                            "%slayer %d shares KV with layer %d but their geometry differs (head_dim %d vs %d, "
                            "kv heads %d vs %d)",
                            where, l, L->kv_src, L->head_dim, S->head_dim, L->n_head_kv, S->n_head_kv);
    }
    if (!cfg->n_head_kv_global) cfg->n_head_kv_global = cfg->n_head_kv;
    return check_heads(cfg, where, err);
}

/* ---- Llama family (llama, mistral, qwen2, qwen3) ---------------------------------- */

static tern_status llama_rope(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err) {
    double theta;
    char w[200];
    TRY(tern_json_num(o, "rope_theta", where, 1e-6, 1e30, 10000.0, 0, &theta, err));
    rope_defaults(&cfg->rope_full, TERN_ROPE_DEFAULT, theta, cfg->n_ctx_train);
    TRY(tern_json_num(o, "partial_rotary_factor", where, 1e-6, 1.0, 1.0, 0, &cfg->rope_full.partial_rotary_factor,
                      err));
    const char *key = tern_json_item(o, "rope_parameters") ? "rope_parameters" : "rope_scaling";
    snprintf(w, sizeof w, "%.170s%s", where, key);
    TRY(rope_read(tern_json_item(o, key), w, &cfg->rope_full, err));
    cfg->rope_sliding = cfg->rope_full; /* sliding layers (mistral/qwen) use the same rope */
    return TERN_OK;
}

static tern_status llama_config(const cJSON *o, const char *where, const char *mt, tern_model_config *cfg,
                                tern_error *err) {
    int qwen2 = !strcmp(mt, "qwen2"), qwen3 = !strcmp(mt, "qwen3"), mistral = !strcmp(mt, "mistral");
    cfg->arch = qwen2 ? TERN_ARCH_QWEN2 : qwen3 ? TERN_ARCH_QWEN3 : TERN_ARCH_LLAMA;
    TRY(tern_json_int32(o, "vocab_size", where, 1, MAX_VOCAB, TERN_JSON_REQUIRED, &cfg->n_vocab, err));
    TRY(tern_json_int32(o, "hidden_size", where, 1, MAX_DIM, TERN_JSON_REQUIRED, &cfg->n_embd, err));
    TRY(tern_json_int32(o, "intermediate_size", where, 1, MAX_DIM, TERN_JSON_REQUIRED, &cfg->n_ff, err));
    TRY(tern_json_int32(o, "num_hidden_layers", where, 1, MAX_LAYERS, TERN_JSON_REQUIRED, &cfg->n_layer, err));
    TRY(tern_json_int32(o, "num_attention_heads", where, 1, MAX_HEADS, TERN_JSON_REQUIRED, &cfg->n_head, err));
    TRY(tern_json_int32(o, "num_key_value_heads", where, 1, MAX_HEADS, cfg->n_head, &cfg->n_head_kv, err));
    if (!tern_json_item(o, "head_dim") && cfg->n_embd % cfg->n_head)
        return tern_err(err, TERN_EFORMAT, "%shidden_size (%d) is not a multiple of num_attention_heads (%d)", where,
                        cfg->n_embd, cfg->n_head);
    TRY(tern_json_int32(o, "head_dim", where, 1, MAX_HEADS, cfg->n_embd / cfg->n_head, &cfg->head_dim, err));
    char act[32];
    TRY(tern_json_str(o, "hidden_act", where, "silu", act, sizeof act, err));
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return tern_err(err, TERN_EUNSUPPORTED, "%shidden_act: \"%s\" is not supported (silu)", where, act);
    cfg->act = TERN_ACT_SILU;
    TRY(tern_json_num(o, "rms_norm_eps", where, 0, 1, 1e-6, 0, &cfg->norm_eps, err));
    TRY(tern_json_bool(o, "tie_word_embeddings", where, 0, &cfg->tie_embeddings, err));
    int def_ctx = (qwen2 || qwen3) ? 32768 : mistral ? 131072 : 2048;
    TRY(tern_json_int32(o, "max_position_embeddings", where, 1, MAX_POS, def_ctx, &cfg->n_ctx_train, err));
    if (qwen2) cfg->attention_bias = 1; /* Qwen2 always has q/k/v biases */
    else TRY(tern_json_bool(o, "attention_bias", where, 0, &cfg->attention_bias, err));
    cfg->qk_norm = qwen3;
    cfg->attn_scale = 0;
    cfg->embed_scale = 0;
    TRY(llama_rope(o, where, cfg, err));

    /* sliding window: mistral applies it to every layer; qwen to layers >= max_window_layers */
    int use_sw = 1, max_window_layers = 0;
    if (qwen2 || qwen3) {
        TRY(tern_json_bool(o, "use_sliding_window", where, 0, &use_sw, err));
        TRY(tern_json_int32(o, "max_window_layers", where, 0, MAX_LAYERS, 28, &max_window_layers, err));
    }
    int sw = 0;
    if (mistral || qwen2 || qwen3) TRY(tern_json_int32(o, "sliding_window", where, 1, MAX_POS, 0, &sw, err));
    if (!use_sw) sw = 0;
    TRY(alloc_layers(cfg, err));
    int given = 0;
    TRY(read_layer_types(o, where, cfg, &given, err));
    for (int l = 0; l < cfg->n_layer; l++) {
        tern_layer_config *L = &cfg->layers[l];
        if (!given) L->type = (sw && l >= max_window_layers) ? TERN_LAYER_SLIDING : TERN_LAYER_FULL;
        L->head_dim = cfg->head_dim;
        L->n_head_kv = cfg->n_head_kv;
        L->n_ff = cfg->n_ff;
        L->kv_src = l;
    }
    int any_sliding = 0;
    for (int l = 0; l < cfg->n_layer; l++) any_sliding |= cfg->layers[l].type == TERN_LAYER_SLIDING;
    if (any_sliding && !sw) {
        TRY(tern_json_int32(o, "sliding_window", where, 1, MAX_POS, TERN_JSON_REQUIRED, &sw, err));
    }
    cfg->sliding_window = any_sliding ? sw : 0;
    return check_heads(cfg, where, err);
}

/* for config_glm.c: the same rope_theta / rope_scaling / rope_parameters reading */
tern_status tern__config_llama_rope(const cJSON *o, const char *where, tern_model_config *cfg, tern_error *err) {
    return llama_rope(o, where, cfg, err);
}

/* ---- entry points ---------------------------------------------------------------- */

static const char *k_supported =
    "gemma4, gemma4_text, gemma4_unified, gemma4_unified_text, llama, mistral, qwen2, qwen3, glm_moe_dsa";

static tern_status parse_root(tern_model_config *cfg, const cJSON *root, const char *name, tern_error *err) {
    char where[200], got[64], mt[64];
    snprintf(where, sizeof where, "%.150s: ", name);
    if (!cJSON_IsObject(root))
        return tern_err(err, TERN_EFORMAT, "%s: expected a JSON object, got %s", name,
                        tern_json_describe(root, got, sizeof got));
    TRY(tern_json_str(root, "model_type", where, NULL, mt, sizeof mt, err));
    const cJSON *arch = tern_json_item(root, "architectures");
    if (cJSON_IsArray(arch) && cJSON_IsString(arch->child) && arch->child->valuestring)
        snprintf(cfg->architecture, sizeof cfg->architecture, "%s", arch->child->valuestring);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);

    if (!strcmp(mt, "gemma4") || !strcmp(mt, "gemma4_unified")) {
        const cJSON *tc = tern_json_item(root, "text_config");
        if (!cJSON_IsObject(tc))
            return tern_err(err, TERN_EFORMAT, "%stext_config: expected an object (model_type \"%s\"), got %s", where,
                            mt, tern_json_describe(tc, got, sizeof got));
        snprintf(cfg->model_type, sizeof cfg->model_type, "%.50s_text", mt);
        char w2[220];
        snprintf(w2, sizeof w2, "%stext_config.", where);
        TRY(tern_json_str(tc, "model_type", w2, cfg->model_type, cfg->model_type, sizeof cfg->model_type, err));
        TRY(gemma4_config(root, where, tc, w2, cfg, err));
        TRY(tern__config_ids(cfg, tc, w2, err));
    } else if (!strcmp(mt, "gemma4_text") || !strcmp(mt, "gemma4_unified_text")) {
        TRY(gemma4_config(root, where, root, where, cfg, err));
    } else if (!strcmp(mt, "llama") || !strcmp(mt, "mistral") || !strcmp(mt, "qwen2") || !strcmp(mt, "qwen3")) {
        TRY(llama_config(root, where, mt, cfg, err));
    } else if (!strcmp(mt, "glm_moe_dsa")) {
        TRY(tern__config_glm5(root, where, cfg, err));
    } else {
        return tern_err(err, TERN_EUNSUPPORTED, "%smodel_type \"%s\" is not supported (supported: %s)", where, mt,
                        k_supported);
    }
    TRY(tern__config_ids(cfg, root, where, err));
    return tern__config_quant(cfg, root, where, err);
}

static void config_init(tern_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = cfg->pad_id = -1;
    cfg->gen_temperature = cfg->gen_top_p = -1;
    cfg->gen_top_k = -1;
}

tern_status tern_config_parse(tern_model_config *cfg, const char *json, size_t len, const char *name, tern_error *err) {
    config_init(cfg);
    if (!name) name = "config.json";
    cJSON *root = NULL;
    tern_status st = tern_json_parse(json, len, name, &root, err);
    if (!st) st = parse_root(cfg, root, name, err);
    cJSON_Delete(root);
    if (st) {
        tern_arch a = cfg->arch;
        tern_config_free(cfg);
        config_init(cfg);
        cfg->arch = a;
    }
    return st;
}

tern_status tern_config_load(tern_model_config *cfg, const char *dir, tern_error *err) {
    char path[4096];
    char *txt = NULL;
    size_t len = 0;
    config_init(cfg);
    TRY(tern_path_join(path, sizeof path, dir, "config.json", err));
    TRY(tern_file_read(path, (size_t)64 << 20, &txt, &len, err));
    tern_status st = tern_config_parse(cfg, txt, len, path, err);
    free(txt);
    if (st) return st;
    if ((st = tern_path_join(path, sizeof path, dir, "generation_config.json", err))) goto fail;
    if (tern_is_file(path)) {
        if ((st = tern_file_read(path, (size_t)16 << 20, &txt, &len, err))) goto fail;
        st = tern__config_generation(cfg, txt, len, path, err);
        free(txt);
        if (st) goto fail;
    }
    return TERN_OK;
fail:
    tern_config_free(cfg);
    return st;
}

void tern_config_free(tern_model_config *cfg) {
    if (!cfg) return;
    free(cfg->layers);
    cfg->layers = NULL;
    for (int i = 0; i < cfg->quant.n_overrides; i++) free(cfg->quant.overrides[i].path);
    free(cfg->quant.overrides);
    cfg->quant.overrides = NULL;
    cfg->quant.n_overrides = 0;
    for (int i = 0; i < cfg->quant.n_fp8_skip; i++) free(cfg->quant.fp8_skip[i]);
    free(cfg->quant.fp8_skip);
    cfg->quant.fp8_skip = NULL;
    cfg->quant.n_fp8_skip = 0;
}
