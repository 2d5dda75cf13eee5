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
/* Benchmarks (bench/concurrency.c): the engine's backend (its copy_rate on a GPU), and the bytes one decode step of
 * `rows` sequences at context `ctx` reads — every weight once (routed experts: the expected number of distinct
 * experts `rows` tokens touch under uniform routing, E·(1 − (1 − K/E)^rows) a layer) plus each sequence's KV
 * (tern_kv_read_bytes). 0 without a model. */
struct tern_backend *tern__engine_backend(const tern_engine *e);
double tern__engine_step_bytes(const tern_engine *e, int rows, long ctx);

#endif
