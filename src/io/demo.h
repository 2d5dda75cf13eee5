/*
 * demo.h — MODEL names that are not directories. `demo` is the embedded tiny model: a
 * Gemma 4-shaped decoder (4 layers: 3 sliding + 1 full, hidden 64) with a byte-level
 * tokenizer and a small chat template, materialized on first use into the user's cache
 * directory ($TERN_CACHE, else $XDG_CACHE_HOME/tern, else ~/.cache/tern, else /tmp) so that
 * every loader (config, safetensors, tokenizer, template) runs on real files.
 * Its weights are synthesized from a fixed seed: the text it writes is not meaningful.
 */
#ifndef TERN_DEMO_H
#define TERN_DEMO_H

#include "base/base.h"

/* If `model` is "demo" (or NULL), materialize the demo and write its directory into buf;
 * otherwise copy `model` into buf. */
tern_status tern_model_path_resolve(const char *model, char *buf, size_t n, tern_error *err);

/* tokenizer.json text of a byte-level BPE with no merges: special tokens `head` (ids 0..),
 * the 256 bytes (GPT-2 byte alphabet), then special tokens `tail`; `bos` (one of head, or NULL)
 * is added by a TemplateProcessing post-processor. malloc'd; NULL on allocation failure.
 * Used by the demo model and the server's fake engine. */
char *tern_bytelevel_tokenizer_json(const char *const *head, int n_head, const char *const *tail, int n_tail,
                                    const char *bos);

#endif
