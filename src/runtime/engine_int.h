/*
 * engine_int.h — what tools inside tern (CLI, server) may reach behind the public engine
 * API: the engine's tokenizer (for incremental detokenization) and its model directory
 * (for the chat template). Read-only; valid while the engine is open.
 */
#ifndef TERN_ENGINE_INT_H
#define TERN_ENGINE_INT_H

#include "tern.h"
#include "text/tokenizer.h"

const tern_tokenizer *tern__engine_tokenizer(const tern_engine *e); /* NULL without one */
const char *tern__engine_dir(const tern_engine *e);

#endif
