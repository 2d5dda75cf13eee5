/*
 * presets.h — config.json text for real model geometries by name, used by
 * `tern bench --random NAME` and the GPU benchmarks to synthesize random weights in memory
 * (no multi-GB downloads). Numbers from reference/gemma4.md §8 and the public configs.
 */
#ifndef TERN_PRESETS_H
#define TERN_PRESETS_H

/* NULL when unknown. */
const char *tern_preset_config(const char *name);
/* Space-separated list of known names. */
const char *tern_preset_names(void);

#endif
