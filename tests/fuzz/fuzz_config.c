/*
 * fuzz_config.c — libFuzzer target for config.json / generation_config.json parsing.
 *
 * The input is parsed as config.json; on success the derived per-layer table is checked
 * for the invariants model code relies on (positive geometry, kv_src pointing at an
 * earlier-or-same layer of the same type, heads divisible), quantization lookups are
 * exercised, and the same bytes are then merged as a generation_config.json. An optional part after a
 * NUL is read as the model's kv_config.json (against the parsed config) and its first bytes as a
 * --kv-quant spec.
 */
#include "io/config.h"
#include "io/config_internal.h"
#include "io/kv_config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tern_model_config c;
    tern_error err;
    err.msg[0] = 0;
    /* [config.json][NUL kv_config.json / --kv-quant spec] */
    const uint8_t *nul = memchr(data, 0, size);
    const uint8_t *kvj = nul ? nul + 1 : data + size;
    const size_t kvn = (size_t)(data + size - kvj);
    if (nul) size = (size_t)(nul - data);
    tern_status st = tern_config_parse(&c, (const char *)data, size, "config.json", &err);
    if (st == TERN_OK) {
        if (c.n_layer < 1 || !c.layers || c.n_head < 1) __builtin_trap();
        for (int l = 0; l < c.n_layer; l++) {
            const tern_layer_config *L = &c.layers[l];
            if (L->head_dim < 1 || L->n_head_kv < 1 || c.n_head % L->n_head_kv) __builtin_trap();
            if (L->kv_src < 0 || L->kv_src > l || c.layers[L->kv_src].type != L->type) __builtin_trap();
        }
        int bits, gs;
        if (tern_quant_lookup(&c.quant, "model.layers.0.mlp.up_proj", &bits, &gs) &&
            (bits < 2 || bits > 8 || gs < 32 || gs > 128))
            __builtin_trap();
        for (int i = 0; i < c.quant.n_overrides; i++) (void)tern_quant_lookup(&c.quant, c.quant.overrides[i].path, &bits, &gs);
        (void)tern__config_generation(&c, (const char *)data, size, "generation_config.json", &err);
        if (c.n_eos > 8) __builtin_trap();
        /* the part after the NUL as the model's kv_config.json (per-layer page formats) */
        tern_kv_fmt *fmt = calloc((size_t)c.n_layer * 2, sizeof *fmt);
        err.msg[0] = 0;
        if (fmt && nul && tern_kv_config_parse((const char *)kvj, kvn, &c, fmt, &err) != TERN_OK && !err.msg[0])
            __builtin_trap();
        free(fmt);
    } else if (err.msg[0] == 0) {
        __builtin_trap();
    }
    tern_config_free(&c);
    /* the first bytes after the NUL (to another NUL, at most 31) as a --kv-quant spec */
    char spec[32];
    size_t n = 0;
    while (n < kvn && n < sizeof spec - 1 && kvj[n]) { spec[n] = (char)kvj[n]; n++; }
    spec[n] = 0;
    tern_kv_fmt f2[2];
    err.msg[0] = 0;
    if (tern_kv_quant_parse(spec, f2, &err) != TERN_OK && !err.msg[0]) __builtin_trap();
    return 0;
}
