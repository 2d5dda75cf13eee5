/*
 * engine_real.c — the engine table (srv.h) backed by the real engine of include/tern.h.
 *
 * A thin adapter (void * <-> tern_engine *) so the HTTP layer can run against either this
 * or the fake engine of fake_engine.c with the same code.
 */
#include "server/srv.h"
#include "runtime/engine_int.h"

static tern_status r_open(void **out, const tern_engine_opts *o, tern_error *err) {
    tern_engine *e = NULL;
    tern_status st = tern_engine_open(&e, o, err);
    *out = e;
    return st;
}
static void r_close(void *e) { tern_engine_close(e); }
static tern_status r_submit(void *e, const tern_request *r, uint64_t *id, tern_error *err) {
    return tern_engine_submit(e, r, id, err);
}
static void r_cancel(void *e, uint64_t id) { tern_engine_cancel(e, id); }
static void r_run(void *e) { tern_engine_run(e); }
static void r_stop(void *e) { tern_engine_stop(e); }
static tern_status r_tokenize(void *e, const char *t, size_t len, int add_special, int32_t **ids, int *n,
                              tern_error *err) {
    return tern_engine_tokenize(e, t, len, add_special, ids, n, err);
}
static tern_status r_detokenize(void *e, const int32_t *ids, int n, char **text, tern_error *err) {
    return tern_engine_detokenize(e, ids, n, text, err);
}
static void r_info(const void *e, tern_model_info *info) { tern_engine_model_info(e, info); }
static void r_stats(void *e, tern_engine_stats *st) { tern_engine_get_stats(e, st); }

static const tern_tokenizer *r_tok(void *e) { return tern__engine_tokenizer(e); }
static const char *r_dir(void *e) { return tern__engine_dir(e); }

static const srv_engine_vt k_real = {
    "engine", r_open, r_close, r_submit, r_cancel, r_run, r_stop, r_tokenize, r_detokenize, r_info, r_stats, r_tok, r_dir,
};

const srv_engine_vt *tern__srv_real_engine(void) {
    return &k_real;
}

tern_request tern__srv_request_default(void) {
    return tern_request_default();
}

tern_engine_opts tern__srv_engine_default_opts(void) {
    return tern_engine_default_opts();
}
