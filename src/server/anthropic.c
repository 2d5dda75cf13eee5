/*
 * anthropic.c — POST /v1/messages (Anthropic Messages API).
 *
 * Request: model, max_tokens (required), messages (user/assistant; content a string or
 * blocks: text, tool_use, tool_result; images are 400), system (string or text blocks),
 * stop_sequences, temperature [0,1], top_p, top_k, stream, tools (passed to the template).
 * Response: {id "msg_...", type "message", role, model, content[{type "text", text}],
 * stop_reason end_turn | max_tokens | stop_sequence, stop_sequence, usage{input_tokens,
 * output_tokens, cache_read_input_tokens, cache_creation_input_tokens}}.
 * Streaming events, in this exact order: message_start, content_block_start, ping,
 * content_block_delta (text_delta)*, content_block_stop, message_delta (stop_reason +
 * usage.output_tokens), message_stop. Errors use {"type":"error","error":{type, message}}.
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>

typedef struct msg_ctx {
    tern_server *s;
    char id[64];
    int n_prompt;
    char **stop;               /* copy of the stop strings, to report which matched */
    int n_stop;
} msg_ctx;

static void ctx_free(void *p) {
    msg_ctx *c = p;
    if (!c) return;
    for (int i = 0; i < c->n_stop; i++) free(c->stop[i]);
    free(c->stop);
    free(c);
}

static void event(tern_jw *out, const char *name, tern_jw *v) {
    size_t n;
    char *j = tern_jw_take(v, &n);
    if (!j) { out->oom = 1; return; }
    srv_sse_data(out, name, j, n);
    free(j);
}

static const char *stop_reason(const srv_result *r) {
    return r->end == SRV_END_LENGTH ? "max_tokens" : r->end == SRV_END_STOP_STRING ? "stop_sequence" : "end_turn";
}

static void write_stop(msg_ctx *c, tern_jw *w, const srv_result *r) {
    tern_jw_kstr(w, "stop_reason", stop_reason(r));
    if (r->end == SRV_END_STOP_STRING && r->stop_index >= 0 && r->stop_index < c->n_stop)
        tern_jw_kstr(w, "stop_sequence", c->stop[r->stop_index]);
    else tern_jw_knull(w, "stop_sequence");
}

static void s_start(void *ctx, tern_jw *out) {
    msg_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "message_start");
    tern_jw_key(&w, "message");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "id", c->id);
    tern_jw_kstr(&w, "type", "message");
    tern_jw_kstr(&w, "role", "assistant");
    tern_jw_kstr(&w, "model", c->s->served);
    tern_jw_key(&w, "content");
    tern_jw_arr(&w);
    tern_jw_end(&w);
    tern_jw_knull(&w, "stop_reason");
    tern_jw_knull(&w, "stop_sequence");
    tern_jw_key(&w, "usage");
    tern_jw_obj(&w);
    tern_jw_kint(&w, "input_tokens", c->n_prompt);
    tern_jw_kint(&w, "output_tokens", 0);
    tern_jw_end(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    event(out, "message_start", &w);

    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "content_block_start");
    tern_jw_kint(&w, "index", 0);
    tern_jw_key(&w, "content_block");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "text");
    tern_jw_kstr(&w, "text", "");
    tern_jw_end(&w);
    tern_jw_end(&w);
    event(out, "content_block_start", &w);

    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "ping");
    tern_jw_end(&w);
    event(out, "ping", &w);
}

static void s_piece(void *ctx, const srv_piece *p, tern_jw *out) {
    (void)ctx;
    if (!p->len) return;
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "content_block_delta");
    tern_jw_kint(&w, "index", 0);
    tern_jw_key(&w, "delta");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "text_delta");
    tern_jw_kstrn(&w, "text", p->text, p->len);
    tern_jw_end(&w);
    tern_jw_end(&w);
    event(out, "content_block_delta", &w);
}

static void s_end(void *ctx, const srv_result *r, tern_jw *out) {
    msg_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "content_block_stop");
    tern_jw_kint(&w, "index", 0);
    tern_jw_end(&w);
    event(out, "content_block_stop", &w);

    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "message_delta");
    tern_jw_key(&w, "delta");
    tern_jw_obj(&w);
    write_stop(c, &w, r);
    tern_jw_end(&w);
    tern_jw_key(&w, "usage");
    tern_jw_obj(&w);
    tern_jw_kint(&w, "output_tokens", r->n_generated);
    tern_jw_end(&w);
    tern_jw_end(&w);
    event(out, "message_delta", &w);

    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "message_stop");
    tern_jw_end(&w);
    event(out, "message_stop", &w);
}

static void s_error(void *ctx, const srv_error *e, tern_jw *out) {
    (void)ctx;
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "error");
    tern_jw_key(&w, "error");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", e->http == 503 ? "overloaded_error" : e->http >= 500 ? "api_error" : "invalid_request_error");
    tern_jw_kstr(&w, "message", e->msg);
    tern_jw_end(&w);
    tern_jw_end(&w);
    event(out, "error", &w);
}

static const srv_stream_fmt k_msg_stream = {s_start, s_piece, s_end, s_error, ctx_free};

/* system: a string or a list of text blocks -> one string (malloc'd), or NULL if absent. */
static int read_system(const cJSON *req, char **out, srv_error *e) {
    *out = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "system");
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) { *out = strdup(v->valuestring); return *out ? 0 : srv_fail(e, 500, "", "out of memory"); }
    if (!cJSON_IsArray(v)) return srv_fail(e, 400, "system", "system: expected a string or a list of text blocks");
    size_t len = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, v) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsString(t)) return srv_fail(e, 400, "system", "system: expected text blocks {type, text}");
        len += strlen(t->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return srv_fail(e, 500, "", "out of memory");
    s[0] = 0;
    cJSON_ArrayForEach(b, v) strcat(s, cJSON_GetObjectItemCaseSensitive(b, "text")->valuestring);
    *out = s;
    return 0;
}

enum MHD_Result srv_handle_messages(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL;
    srv_params p = {0};
    srv_prompt pr = {0};
    srv_job *job = NULL;
    char *text = NULL, *system = NULL;
    srv_tokinfo *toks = NULL;
    int n_toks = 0;
    size_t len = 0;
    srv_result res = {0};
    msg_ctx *c = NULL;
    enum MHD_Result ret;

    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e) || srv_check_model(s, req, &e)) goto fail;
    if (srv_params_parse(&p, req, SRV_API_ANTHROPIC, s->info.n_vocab, s->info.n_ctx, &e)) goto fail;
    if (read_system(req, &system, &e)) goto fail;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0) tools = NULL;
    if (srv_prompt_chat(s, cJSON_GetObjectItemCaseSensitive(req, "messages"), system, tools, NULL, 1, &pr, &e)) goto fail;
    if (!(c = calloc(1, sizeof *c))) { srv_fail(&e, 500, "", "out of memory"); goto fail; }
    c->s = s;
    c->n_prompt = pr.n;
    srv_make_id(s, "msg_", c->id, sizeof c->id);
    if (p.n_stop && (c->stop = calloc((size_t)p.n_stop, sizeof(char *)))) {
        for (int i = 0; i < p.n_stop; i++) c->stop[i] = strdup(p.stop[i]);
        c->n_stop = p.n_stop;
    }
    int stream = p.stream;
    if (srv_job_start(s, &pr, &p, r->fd, &job, &e)) goto fail;
    srv_prompt_free(&pr);
    free(system);
    system = NULL;
    cJSON_Delete(req);
    req = NULL;
    if (stream) return srv_stream(s, r->conn, job, &k_msg_stream, c);
    if (srv_collect(job, &text, &len, &toks, &n_toks, &res, &e)) goto fail;
    srv_job_free(job);
    job = NULL;

    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "id", c->id);
    tern_jw_kstr(&w, "type", "message");
    tern_jw_kstr(&w, "role", "assistant");
    tern_jw_kstr(&w, "model", s->served);
    tern_jw_key(&w, "content");
    tern_jw_arr(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "text");
    tern_jw_kstrn(&w, "text", text, len);
    tern_jw_end(&w);
    tern_jw_end(&w);
    write_stop(c, &w, &res);
    tern_jw_key(&w, "usage");
    tern_jw_obj(&w);
    tern_jw_kint(&w, "input_tokens", res.n_prompt - res.n_cached);
    tern_jw_kint(&w, "output_tokens", res.n_generated);
    tern_jw_kint(&w, "cache_read_input_tokens", res.n_cached);
    tern_jw_kint(&w, "cache_creation_input_tokens", 0);
    tern_jw_end(&w);
    tern_jw_end(&w);
    free(text);
    free(toks);
    ctx_free(c);
    return srv_reply_jw(r, 200, &w);

fail:
    ret = e.http == 499 ? MHD_NO : srv_reply_anthropic_error(r, &e);
    srv_job_free(job);
    free(text);
    free(toks);
    free(system);
    ctx_free(c);
    srv_prompt_free(&pr);
    srv_params_free(&p);
    cJSON_Delete(req);
    return ret;
}
