/*
 * config_quant.c — the MLX quantization block, special token ids, generation_config.json.
 *
 * MLX conversions write (reference/gemma4.md §7.2)
 *   "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
 *                    "<module path>": {"bits": 8, "group_size": 64} | false, ...}
 * (duplicated as "quantization_config"). Keys other than bits/group_size/mode are module
 * paths in stored-tensor naming; an override object with missing fields takes the global
 * values; `false` means the module is stored unquantized. Only affine mode, bits in
 * {2,3,4,5,6,8} and group sizes {32,64,128} are accepted (others: TERN_EUNSUPPORTED).
 * A `quantization_config` with `quant_method: "fp8"` is the DeepSeek-V3 / GLM-5-FP8 block
 * format (reference: transformers' finegrained_fp8 integration): `fmt` "e4m3" (default),
 * `weight_block_size` [rows, cols] (required, each 1..4096), `activation_scheme` "dynamic"
 * (activations are not quantized here either way: the reference is the dequantized model),
 * optional `modules_to_not_convert` [names]. Any other `quant_method` (GPTQ, AWQ,
 * compressed-tensors ...) is rejected rather than misread.
 */
#include "io/config_internal.h"

#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x)                                                                                                     \
    do {                                                                                                           \
        tern_status s_ = (x);                                                                                      \
        if (s_) return s_;                                                                                         \
    } while (0)

static tern_status check_bits_gs(int bits, int gs, const char *where, tern_error *err) {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return tern_err(err, TERN_EUNSUPPORTED, "%sbits: %d is not supported (2, 3, 4, 5, 6 or 8)", where, bits);
    if (gs != 32 && gs != 64 && gs != 128)
        return tern_err(err, TERN_EUNSUPPORTED, "%sgroup_size: %d is not supported (32, 64 or 128)", where, gs);
    return TERN_OK;
}

static tern_status check_mode(const cJSON *o, const char *where, char *mode, size_t n, tern_error *err) {
    TRY(tern_json_str(o, "mode", where, "affine", mode, n, err));
    if (strcmp(mode, "affine"))
        return tern_err(err, TERN_EUNSUPPORTED, "%smode: \"%s\" is not supported (only affine)", where, mode);
    return TERN_OK;
}

static tern_status config_fp8(tern_quant_config *q, const cJSON *qc, const char *where, tern_error *err) {
    char w[300], got[64], fmt[16], act[16];
    snprintf(w, sizeof w, "%squantization_config.", where);
    TRY(tern_json_str(qc, "fmt", w, "e4m3", fmt, sizeof fmt, err));
    if (strcmp(fmt, "e4m3"))
        return tern_err(err, TERN_EUNSUPPORTED, "%sfmt: \"%s\" is not supported (only e4m3)", w, fmt);
    TRY(tern_json_str(qc, "activation_scheme", w, "dynamic", act, sizeof act, err));
    if (strcmp(act, "dynamic"))
        return tern_err(err, TERN_EUNSUPPORTED, "%sactivation_scheme: \"%s\" is not supported (only dynamic)", w, act);
    const cJSON *bs = tern_json_item(qc, "weight_block_size");
    if (!bs)
        return tern_err(err, TERN_EUNSUPPORTED,
                        "%sweight_block_size: missing (per-tensor FP8 scales are not supported, only block scales)", w);
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2)
        return tern_err(err, TERN_EFORMAT, "%sweight_block_size: expected [rows, cols], got %s", w,
                        tern_json_describe(bs, got, sizeof got));
    for (int i = 0; i < 2; i++) {
        int64_t v;
        char what[320];
        snprintf(what, sizeof what, "%sweight_block_size[%d]", w, i);
        TRY(tern_json_value_int(cJSON_GetArrayItem(bs, i), what, 1, 4096, &v, err));
        q->fp8_block[i] = (int)v;
    }
    const cJSON *nc = tern_json_item(qc, "modules_to_not_convert");
    if (nc && !cJSON_IsNull(nc)) {
        if (!cJSON_IsArray(nc))
            return tern_err(err, TERN_EFORMAT, "%smodules_to_not_convert: expected a list of names, got %s", w,
                            tern_json_describe(nc, got, sizeof got));
        int n = cJSON_GetArraySize(nc);
        if (n > 0 && !(q->fp8_skip = calloc((size_t)n, sizeof *q->fp8_skip)))
            return tern_err(err, TERN_ENOMEM, "quantization_config: out of memory");
        for (const cJSON *c = nc->child; c; c = c->next) {
            if (!cJSON_IsString(c))
                return tern_err(err, TERN_EFORMAT, "%smodules_to_not_convert[%d]: expected a string, got %s", w,
                                q->n_fp8_skip, tern_json_describe(c, got, sizeof got));
            if (!(q->fp8_skip[q->n_fp8_skip] = strdup(c->valuestring)))
                return tern_err(err, TERN_ENOMEM, "quantization_config: out of memory");
            q->n_fp8_skip++;
        }
    }
    q->fp8 = 1;
    return TERN_OK;
}

tern_status tern__config_quant(tern_model_config *cfg, const cJSON *root, const char *where, tern_error *err) {
    tern_quant_config *q = &cfg->quant;
    const char *key = "quantization";
    const cJSON *b = tern_json_item(root, key);
    char w[300], got[64], mode[16];
    if (!b) {
        const cJSON *qc = tern_json_item(root, "quantization_config");
        if (!qc) return TERN_OK;
        key = "quantization_config";
        if (!cJSON_IsObject(qc))
            return tern_err(err, TERN_EFORMAT, "%squantization_config: expected an object, got %s", where,
                            tern_json_describe(qc, got, sizeof got));
        const cJSON *qm = tern_json_item(qc, "quant_method");
        if (qm && cJSON_IsString(qm) && !strcmp(qm->valuestring, "fp8")) return config_fp8(q, qc, where, err);
        if (qm)
            return tern_err(err, TERN_EUNSUPPORTED,
                            "%squantization_config.quant_method: %s is not supported (only MLX affine quantization)",
                            where, tern_json_describe(qm, got, sizeof got));
        if (!tern_json_item(qc, "bits") && !tern_json_item(qc, "group_size")) return TERN_OK;
        b = qc;
    }
    if (cJSON_IsFalse(b)) return TERN_OK;
    if (!cJSON_IsObject(b))
        return tern_err(err, TERN_EFORMAT, "%s%s: expected an object, got %s", where, key,
                        tern_json_describe(b, got, sizeof got));
    snprintf(w, sizeof w, "%s%s.", where, key);
    q->enabled = 1;
    TRY(tern_json_int32(b, "bits", w, 0, 64, 4, &q->bits, err));
    TRY(tern_json_int32(b, "group_size", w, 0, 1 << 20, 64, &q->group_size, err));
    TRY(check_mode(b, w, q->mode, sizeof q->mode, err));
    TRY(check_bits_gs(q->bits, q->group_size, w, err));
    int n = 0;
    for (const cJSON *c = b->child; c; c = c->next) n += cJSON_IsObject(c) || cJSON_IsBool(c);
    if (!n) return TERN_OK;
    q->overrides = calloc((size_t)n, sizeof *q->overrides);
    if (!q->overrides) return tern_err(err, TERN_ENOMEM, "%s: out of memory", key);
    for (const cJSON *c = b->child; c; c = c->next) {
        if (!c->string || !(cJSON_IsObject(c) || cJSON_IsBool(c))) continue;
        tern_quant_override *o = &q->overrides[q->n_overrides];
        o->bits = q->bits;
        o->group_size = q->group_size;
        o->disabled = cJSON_IsFalse(c);
        if (cJSON_IsObject(c)) {
            snprintf(w, sizeof w, "%s%s.%.200s.", where, key, c->string);
            TRY(tern_json_int32(c, "bits", w, 0, 64, q->bits, &o->bits, err));
            TRY(tern_json_int32(c, "group_size", w, 0, 1 << 20, q->group_size, &o->group_size, err));
            TRY(check_mode(c, w, mode, sizeof mode, err));
            TRY(check_bits_gs(o->bits, o->group_size, w, err));
        }
        o->path = strdup(c->string);
        if (!o->path) return tern_err(err, TERN_ENOMEM, "%s: out of memory", key);
        q->n_overrides++;
    }
    return TERN_OK;
}

/* a ends with "." + b */
static int dot_suffix(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    return la > lb && a[la - lb - 1] == '.' && !strcmp(a + la - lb, b);
}

int tern_quant_lookup(const tern_quant_config *q, const char *path, int *bits, int *group_size) {
    if (!q || !q->enabled || !path) return 0;
    const tern_quant_override *hit = NULL;
    for (int i = 0; i < q->n_overrides && !hit; i++)
        if (!strcmp(q->overrides[i].path, path)) hit = &q->overrides[i];
    for (int i = 0; i < q->n_overrides && !hit; i++)
        if (dot_suffix(path, q->overrides[i].path) || dot_suffix(q->overrides[i].path, path)) hit = &q->overrides[i];
    if (hit && hit->disabled) return 0;
    if (bits) *bits = hit ? hit->bits : q->bits;
    if (group_size) *group_size = hit ? hit->group_size : q->group_size;
    return 1;
}

/* ---- token ids ------------------------------------------------------------------- */

static void add_eos(tern_model_config *cfg, int id) {
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return;
    if (cfg->n_eos < (int)TERN_ARRAY_LEN(cfg->eos_ids)) cfg->eos_ids[cfg->n_eos++] = id;
    else tern_log(TERN_LOG_WARN, "config: more than %d eos ids; ignoring %d", cfg->n_eos, id);
}

static tern_status read_eos(tern_model_config *cfg, const cJSON *o, const char *where, tern_error *err) {
    const cJSON *e = tern_json_item(o, "eos_token_id");
    char what[300];
    int64_t v;
    snprintf(what, sizeof what, "%seos_token_id", where);
    if (!e) return TERN_OK;
    if (cJSON_IsArray(e)) {
        int i = 0;
        for (const cJSON *c = e->child; c; c = c->next, i++) {
            snprintf(what, sizeof what, "%seos_token_id[%d]", where, i);
            TRY(tern_json_value_int(c, what, 0, 2147483647, &v, err));
            add_eos(cfg, (int)v);
        }
        return TERN_OK;
    }
    TRY(tern_json_value_int(e, what, 0, 2147483647, &v, err));
    add_eos(cfg, (int)v);
    return TERN_OK;
}

tern_status tern__config_ids(tern_model_config *cfg, const cJSON *o, const char *where, tern_error *err) {
    if (cfg->bos_id < 0) TRY(tern_json_int32(o, "bos_token_id", where, 0, 2147483647, -1, &cfg->bos_id, err));
    if (cfg->pad_id < 0) TRY(tern_json_int32(o, "pad_token_id", where, 0, 2147483647, -1, &cfg->pad_id, err));
    if (cfg->n_eos == 0) TRY(read_eos(cfg, o, where, err));
    return TERN_OK;
}

tern_status tern__config_generation(tern_model_config *cfg, const char *json, size_t len, const char *name,
                                    tern_error *err) {
    cJSON *g = NULL;
    char where[300], got[64];
    snprintf(where, sizeof where, "%.250s: ", name);
    TRY(tern_json_parse(json, len, name, &g, err));
    tern_status st = TERN_OK;
    if (!cJSON_IsObject(g)) {
        st = tern_err(err, TERN_EFORMAT, "%s: expected a JSON object, got %s", name,
                      tern_json_describe(g, got, sizeof got));
        goto done;
    }
    if ((st = read_eos(cfg, g, where, err))) goto done;
    if ((st = tern_json_int32(g, "bos_token_id", where, 0, 2147483647, cfg->bos_id, &cfg->bos_id, err))) goto done;
    if ((st = tern_json_int32(g, "pad_token_id", where, 0, 2147483647, cfg->pad_id, &cfg->pad_id, err))) goto done;
    if ((st = tern_json_num(g, "temperature", where, 0, 1e6, -1, 0, &cfg->gen_temperature, err))) goto done;
    if ((st = tern_json_num(g, "top_p", where, 0, 1, -1, 0, &cfg->gen_top_p, err))) goto done;
    st = tern_json_int32(g, "top_k", where, 0, 2147483647, -1, &cfg->gen_top_k, err);
done:
    cJSON_Delete(g);
    return st;
}
