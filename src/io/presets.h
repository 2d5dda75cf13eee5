/*
 * presets.h — config.json text for real model geometries by name, used by
 * `tern bench --random NAME` and the GPU benchmarks to synthesize random weights in memory
 * (no multi-GB downloads). Numbers from reference/gemma4.md §8 and the public configs.
 */
#ifndef TERN_PRESETS_H
#define TERN_PRESETS_H

#include "base/base.h"

/* NULL when unknown. */
const char *tern_preset_config(const char *name);
/* Space-separated list of known names. */
const char *tern_preset_names(void);
/* A model named "random:PRESET[:qB|:bf16]" (tern serve's and the engine's spelling; every CLI command takes it too):
 * spec is the part after "random:". Fills name (cap bytes) with PRESET and *bits with B (0: bf16 weights, also
 * when spelled ":bf16"); B is one of the MLX widths 2, 3, 4, 5, 6, 8. TERN_EINVAL / TERN_ENOTFOUND with *err naming spec or the preset. */
tern_status tern_preset_random_spec(const char *spec, char *name, size_t cap, int *bits, tern_error *err);

#endif
