/*
 * kvfile.h — KV persistence: save a sequence's KV prefix to a file and restore it later.
 *
 * A file holds the tokens, the KV pages of every owning layer (full layers: all blocks;
 * sliding layers: only the blocks the window still needs) and two fingerprints: the model
 * (config geometry + the caller's weights id, e.g. tern_kv_weights_id of the model
 * directory) and the KV layout (block size, per-layer page bytes and group). A restore
 * checks both and names what differs; a mismatched model, a truncated or corrupt file
 * (64-bit checksum of the payload) is an error, never a crash. Restore maps the file
 * (mmap) and uploads the pages straight from the mapping into freshly reserved blocks.
 *
 * Continuing after a restore: the slot holds positions [0, n_tokens); feed the next token
 * at position n_tokens. (To re-create the logits of the last saved token instead, save
 * n - 1 tokens and feed the last one.) Pages are copied byte for byte, so the format is
 * whatever kv.c stores; files are for the same build and page format.
 */
#ifndef TERN_RUNTIME_KVFILE_H
#define TERN_RUNTIME_KVFILE_H

#include "runtime/kv.h"

/* Hash of the model geometry that shapes the KV (architecture, layers, heads, windows). */
uint64_t tern_kv_config_id(const tern_model_config *cfg);
/* Cheap id of a model directory's weights: names, sizes and the first and last 64 KiB of
 * each *.safetensors file. 0 when none can be read. */
uint64_t tern_kv_weights_id(const char *dir);

/* Save positions [0, n_tokens) of `slot` (tokens[] are the sequence's ids). model_id: the
 * caller's model fingerprint (e.g. tern_kv_config_id(cfg) ^ tern_kv_weights_id(dir)). */
tern_status tern_kv_save(tern_kv *kv, int slot, const int32_t *tokens, int n_tokens, uint64_t model_id,
                         const char *path, tern_error *err);
/* Restore into the empty `slot`; *tokens (malloc'd, caller frees) and *n_tokens receive the
 * saved sequence. On error the slot is left empty. */
tern_status tern_kv_restore(tern_kv *kv, int slot, uint64_t model_id, const char *path, int32_t **tokens,
                            int *n_tokens, tern_error *err);

#endif
