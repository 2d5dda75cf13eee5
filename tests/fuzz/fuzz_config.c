/*
 * fuzz_config.c — libFuzzer target for config.json / generation_config.json parsing.
 *
 * The input is parsed as config.json; on success the derived per-layer table is checked
 * for the invariants model code relies on (positive geometry, kv_src pointing at an
 * earlier-or-same layer of the same type, heads divisible), quantization lookups are
 * exercised, and the same bytes are then merged as a generation_config.json.
 */
#include "io/config.h"
#include "io/config_internal.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tern_model_config c;
    tern_error err;
    err.msg[0] = 0;
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
    } else if (err.msg[0] == 0) {
        __builtin_trap();
    }
    tern_config_free(&c);
    return 0;
}
