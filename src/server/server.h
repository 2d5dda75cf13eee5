/*
 * server.h — `tern serve`: an OpenAI- and Anthropic-compatible HTTP server (libmicrohttpd).
 *
 * tern_server_start binds the socket, starts the HTTP threads and then loads the model on a
 * background thread, which afterwards becomes the engine thread (tern_engine_run). While the
 * model loads, /health answers 503 and generation endpoints wait for the load to finish.
 * Endpoints: GET /health, /v1/models, /metrics, /stats; POST /v1/chat/completions,
 * /v1/completions, /v1/messages, /tokenize, /detokenize (see docs in each src/server file).
 *
 * The engine is reached through a small table of functions (srv.h) so tests can run the
 * whole HTTP stack against a fake engine (fake_engine.c, `tern serve --fake-engine`).
 */
#ifndef TERN_SERVER_H
#define TERN_SERVER_H

#include "tern.h"

typedef struct tern_server tern_server;

typedef struct tern_server_opts {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* default 8080; 0 = any free port */
    const char *api_key;       /* NULL = no auth; else Bearer / x-api-key must match */
    const char *model_alias;   /* served model id; default: the model's name */
    size_t max_body;           /* request body limit in bytes (default 16 MiB) -> 413 */
    int timeout_s;             /* idle connection timeout (default 600) */
    int max_connections;       /* default 256 */
    int default_max_tokens;    /* when a request gives none (default 4096, clipped to context) */
    int fake_engine;           /* tests: serve the fake engine instead of a model */
    int max_queue;             /* requests waiting for a slot beyond max_concurrency before 429 (default 256) */
    tern_sampling sampling;    /* defaults for fields a request omits (temperature, top_p, top_k, min_p) */
    int has_seed;              /* sampling.seed is a default seed (else each request gets a fresh one) */
    int sampling_set;          /* TERN_SRV_SET_* bits: defaults given by flags; the others come from the
                                  model's generation_config.json when it sets them */
    tern_engine_opts engine;
} tern_server_opts;

tern_server_opts tern_server_default_opts(void);

/* Bind + start serving; the model loads in the background. */
tern_status tern_server_start(tern_server **out, const tern_server_opts *opts, tern_error *err);
int tern_server_port(const tern_server *s);
const char *tern_server_host(const tern_server *s);
/* Block until the model is loaded (TERN_OK) or failed to load (its error). */
tern_status tern_server_wait_loaded(tern_server *s, tern_error *err);
/* What was loaded and the memory plan, several lines of text (empty until loaded). Valid
 * until tern_server_stop. */
const char *tern_server_summary(const tern_server *s);
/* 0 loading, 1 ready, 2 failed (non-blocking). */
int tern__server_load_state(tern_server *s);
/* Stop accepting, end running requests, stop the engine, free everything. Accepts NULL. */
void tern_server_stop(tern_server *s);

enum { TERN_SRV_SET_TEMPERATURE = 1, TERN_SRV_SET_TOP_P = 2, TERN_SRV_SET_TOP_K = 4 };

#endif
