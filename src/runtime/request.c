/*
 * request.c — tern_request_default (include/tern.h): what a request holds before its caller fills it in.
 * On its own so that code which only builds requests (the server's parameter parser, its fuzz target)
 * links it without the engine.
 */
#include "tern.h"

#include <string.h>

tern_request tern_request_default(void) {
    tern_request r;
    memset(&r, 0, sizeof r);
    r.max_tokens = 256;
    r.sampling.temperature = 1.0f;
    r.sampling.top_p = 1.0f;
    r.sampling.repetition_penalty = 1.0f;
    r.sampling.penalty_last_n = -1;
    r.speculative_k = -1;     /* the engine's default (off unless tern_engine_opts.speculative_k) */
    return r;
}
