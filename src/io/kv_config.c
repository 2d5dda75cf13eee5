/*
 * kv_config.c — `--kv-quant` specs and kv_config.json into per-layer KV page formats
 * (grammar in kv_config.h). Validation against each layer's head_dim happens here for the
 * group fallback only; tern_kv_open checks every format again (ops/kvq.h) with a message
 * naming the layer.
 */
#include "io/kv_config.h"
#include "base/file.h"
#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_uint(const char *s, const char **end) {
    int v = 0, n = 0;
    while (*s >= '0' && *s <= '9' && n < 6) { v = v * 10 + (*s - '0'); s++; n++; }
    *end = s;
    return n ? v : -1;
}

tern_status tern_kv_quant_parse(const char *spec, tern_kv_fmt fmt[2], tern_error *err) {
    memset(fmt, 0, 2 * sizeof *fmt);
    const char *s = spec ? spec : "off", *e;
    if (!strcmp(s, "off") || !strcmp(s, "f32") || !*s) return TERN_OK;
    if (!strcmp(s, "f16") || !strcmp(s, "bf16")) {
        fmt[0].kind = fmt[1].kind = s[0] == 'b' ? TERN_KV_BF16 : TERN_KV_F16;
        return TERN_OK;
    }
    if (!strncmp(s, "turbo", 5)) {
        fmt[0] = (tern_kv_fmt){TERN_KV_TURBO, 4, 0};
        fmt[1] = (tern_kv_fmt){TERN_KV_TURBO, 3, 0};
        if (!s[5]) return TERN_OK;
        int kb = -1, vb = -1;
        if (s[5] == ':') {
            kb = parse_uint(s + 6, &e);
            if (*e == ',') vb = parse_uint(e + 1, &e);
            else if (!*e) vb = kb;
        }
        if (kb < 2 || kb > 4 || vb < 2 || vb > 4 || *e)
            return tern_err(err, TERN_EINVAL, "--kv-quant '%s': expected turbo or turbo:K,V with K and V bits in 2..4", s);
        fmt[0].bits = kb;
        fmt[1].bits = vb;
        return TERN_OK;
    }
    int bits = parse_uint(s, &e), group = 64;
    if (bits >= 0 && *e == ':') group = parse_uint(e + 1, &e);
    if ((bits != 4 && bits != 8) || *e || (group != 32 && group != 64 && group != 128))
        return tern_err(err, TERN_EINVAL, "--kv-quant '%s': expected off, f16, bf16, 8, 4, 8:G or 4:G (G = 32, 64, 128), "
                        "turbo or turbo:K,V", s);
    fmt[0] = fmt[1] = (tern_kv_fmt){TERN_KV_AFFINE, bits, group};
    return TERN_OK;
}

/* Halve an affine group until it divides head_dim (a 64-group spec on a head_dim of 80). */
static void fit_group(tern_kv_fmt *f, int d) {
    if (f->kind != TERN_KV_AFFINE || f->group <= 0 || d <= 0) return;
    while (f->group > 2 && d % f->group) f->group /= 2;
}

static tern_status entry_fmt(const cJSON *it, const char *where, tern_kv_fmt fmt[2], tern_error *err) {
    char mode[16];
    int bits, kb, vb, group;
    tern_status st = tern_json_str(it, "mode", where, "affine", mode, sizeof mode, err);
    if (!st) st = tern_json_int32(it, "bits", where, 0, 16, 0, &bits, err);
    if (!st) st = tern_json_int32(it, "k_bits", where, 0, 16, bits, &kb, err);
    if (!st) st = tern_json_int32(it, "v_bits", where, 0, 16, bits, &vb, err);
    if (!st) st = tern_json_int32(it, "group_size", where, 0, 4096, 64, &group, err);
    if (st) return st;
    memset(fmt, 0, 2 * sizeof *fmt);
    int kind;
    if (!strcmp(mode, "affine")) kind = TERN_KV_AFFINE;
    else if (!strcmp(mode, "turbo")) kind = TERN_KV_TURBO;
    else if (!strcmp(mode, "f16")) kind = TERN_KV_F16;
    else if (!strcmp(mode, "bf16")) kind = TERN_KV_BF16;
    else if (!strcmp(mode, "f32")) kind = TERN_KV_F32;
    else return tern_err(err, TERN_EFORMAT, "%smode: expected affine, turbo, f16, bf16 or f32, got \"%s\"", where, mode);
    int sides[2] = {kb, vb};
    for (int w = 0; w < 2; w++) {
        fmt[w].kind = kind;
        if (kind == TERN_KV_AFFINE || kind == TERN_KV_TURBO) {
            int b = sides[w];
            if (kind == TERN_KV_AFFINE && b == 16) { fmt[w].kind = TERN_KV_BF16; continue; } /* "bits": 16 = unquantized */
            if ((kind == TERN_KV_AFFINE && b != 4 && b != 8) || (kind == TERN_KV_TURBO && (b < 2 || b > 4)))
                return tern_err(err, TERN_EUNSUPPORTED, "%s%s: %d bits not supported (affine 4|8, turbo 2..4)", where,
                                w ? "v_bits" : "k_bits", b);
            fmt[w].bits = b;
            if (kind == TERN_KV_AFFINE) fmt[w].group = group;
        }
    }
    return TERN_OK;
}

tern_status tern_kv_config_parse(const char *json, size_t len, const tern_model_config *cfg,
                                 tern_kv_fmt *formats, tern_error *err) {
    memset(formats, 0, (size_t)cfg->n_layer * 2 * sizeof *formats);
    cJSON *root = NULL;
    tern_status st = tern_json_parse(json, len, "kv_config.json", &root, err);
    if (st) return st;
    const cJSON *arr = cJSON_IsArray(root) ? root : tern_json_item(root, "layers");
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(root);
        return tern_err(err, TERN_EFORMAT, "kv_config.json: expected an array of {layer_idx, bits, group_size}");
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char where[64];
        snprintf(where, sizeof where, "kv_config.json: [%d].", i++);
        int l = 0;
        tern_kv_fmt f[2];
        if (!cJSON_IsObject(it)) st = tern_err(err, TERN_EFORMAT, "%s expected an object", where);
        if (!st) st = tern_json_int32(it, "layer_idx", where, 0, cfg->n_layer - 1, TERN_JSON_REQUIRED, &l, err);
        if (!st) st = entry_fmt(it, where, f, err);
        if (st) break;
        formats[2 * l] = f[0];
        formats[2 * l + 1] = f[1];
    }
    cJSON_Delete(root);
    return st;
}

const char *tern_kv_quant_default(const char *spec, int gpu, int plain_bf16) {
    if (spec && *spec && strcmp(spec, "auto")) return spec;
    return !gpu ? "auto" : plain_bf16 ? "gpu-bf16" : "off";
}

tern_status tern_kv_quant_plan(const char *spec, const char *dir, const tern_model_config *cfg,
                               tern_kv_fmt **out, const char **source, tern_error *err) {
    *out = NULL;
    if (source) *source = "off";
    const char *s = spec && *spec ? spec : "auto";
    int is_auto = !strcmp(s, "auto"), is_config = !strcmp(s, "config");
    tern_kv_fmt *f = calloc((size_t)cfg->n_layer * 2, sizeof *f);
    if (!f) return tern_err(err, TERN_ENOMEM, "kv formats: out of memory");
    tern_status st = TERN_OK;
    if (is_auto || is_config) {
        char path[4200];
        snprintf(path, sizeof path, "%s/kv_config.json", dir ? dir : "");
        if (!dir || !tern_is_file(path)) {
            free(f);
            return is_config ? tern_err(err, TERN_EINVAL, "--kv-quant config: the model has no kv_config.json") : TERN_OK;
        }
        char *txt = NULL;
        size_t len = 0;
        st = tern_file_read(path, (size_t)1 << 20, &txt, &len, err);
        if (!st) st = tern_kv_config_parse(txt, len, cfg, f, err);
        free(txt);
        if (source) *source = "kv_config.json";
    } else if (!strcmp(s, "gpu-bf16")) {
        for (int l = 0; l < cfg->n_layer; l++)
            /* not GLM-5's latent cache: its DSA selections (tie-free in f32) would move with bf16 indexer keys and
             * latents; bf16 latent pages are asked for with --kv-quant bf16 */
            if (!cfg->layers[l].kv_latent) f[2 * l].kind = f[2 * l + 1].kind = TERN_KV_BF16;
        if (source) *source = "auto (bf16 pages on the GPU)";
    } else {
        tern_kv_fmt one[2];
        st = tern_kv_quant_parse(s, one, err);
        for (int l = 0; !st && l < cfg->n_layer; l++) { f[2 * l] = one[0]; f[2 * l + 1] = one[1]; }
        if (source) *source = "--kv-quant";
    }
    int any = 0;
    for (int l = 0; !st && l < cfg->n_layer; l++)
        for (int w = 0; w < 2; w++) {
            fit_group(&f[2 * l + w], cfg->layers[l].head_dim);
            any |= f[2 * l + w].kind != TERN_KV_F32;
        }
    if (st || !any) {
        free(f);
        if (!st && source) *source = "off";
        return st;
    }
    *out = f;
    return TERN_OK;
}
