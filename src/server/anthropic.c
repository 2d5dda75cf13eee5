/*
 * anthropic.c — POST /v1/messages (Anthropic Messages API).
 *
 * Request: model, max_tokens (required), messages (user/assistant; content a string or
 * blocks: text, tool_use, tool_result; images are 400), system (string or text blocks),
 * stop_sequences, temperature [0,1], top_p, top_k, stream, tools (passed to the template).
 * Response: {id "msg_...", type "message", role, model, content[{type "text", text}],
 * stop_reason end_turn | max_tokens | stop_sequence, stop_sequence, usage{input_tokens,
 * output_tokens, cache_read_input_tokens, cache_creation_input_tokens}}.
 * Tools: Anthropic tool definitions {name, description, input_schema} are converted to the
 * OpenAI form for the template; tool_choice {"type": "auto"|"none"} ("any"/"tool": 400, as
 * in the chat API). Output blocks: "thinking" (reasoning), "text", then one "tool_use"
 * {id "toolu_...", name, input} per call; stop_reason "tool_use" when calls were made.
 * Streaming events, in this exact order: message_start, content_block_start, ping,
 * content_block_delta*, content_block_stop (a start/delta/stop group per block: thinking
 * blocks with thinking_delta, text with text_delta, tool_use with one input_json_delta),
 * message_delta (stop_reason + usage.output_tokens), message_stop. Errors use
 * {"type":"error","error":{type, message}}. POST /v1/messages/count_tokens answers
 * {"input_tokens": n} for the same body (no generation).
 */
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct msg_ctx {
    tern_server *s;
    srv_job *job;
    int block;                 /* open block: 0 none, 1 thinking, 2 text */
    int n_blocks, pinged;
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

static const char *stop_reason(const srv_result *r) {
    return r->end == SRV_END_LENGTH ? "max_tokens" : r->end == SRV_END_STOP_STRING ? "stop_sequence"
           : r->n_calls > 0 ? "tool_use" : "end_turn";
}

/* The tool_use block of call i (its "input" is the arguments object). */
static void tool_use(srv_job *j, int i, tern_jw *w, int empty_input) {
    const char *id = NULL;
    const tern_tool_call *tc = srv_job_call(j, i, &id);
    char tid[48];
    snprintf(tid, sizeof tid, "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : "0");
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", "tool_use");
    tern_jw_kstr(w, "id", tid);
    tern_jw_kstr(w, "name", tc && tc->name ? tc->name : "");
    tern_jw_key(w, "input");
    if (empty_input || !tc || !tc->arguments) { tern_jw_obj(w); tern_jw_end(w); }
    else tern_jw_raw(w, tc->arguments, strlen(tc->arguments));
    tern_jw_end(w);
}

static void block_stop(msg_ctx *c, tern_jw *out) {
    if (!c->block) return;
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "content_block_stop");
    tern_jw_kint(&w, "index", c->n_blocks - 1);
    tern_jw_end(&w);
    srv_sse_value(out, "content_block_stop", &w);
    c->block = 0;
}

static void ping(msg_ctx *c, tern_jw *out) {
    if (c->pinged) return;
    c->pinged = 1;
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "ping");
    tern_jw_end(&w);
    srv_sse_value(out, "ping", &w);
}

/* a content-block event's head: {"type": type, "index": index, key: (the caller writes it, then closes) */
static void event_head(tern_jw *w, const char *type, int index, const char *key) {
    tern_jw_init(w);
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", type);
    tern_jw_kint(w, "index", index);
    tern_jw_key(w, key);
}

/* Open a thinking (1) or text (2) block unless it is the open one. */
static void block_open(msg_ctx *c, int kind, tern_jw *out) {
    if (c->block == kind) return;
    block_stop(c, out);
    tern_jw w;
    event_head(&w, "content_block_start", c->n_blocks++, "content_block");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", kind == 1 ? "thinking" : "text");
    if (kind == 1) { tern_jw_kstr(&w, "thinking", ""); tern_jw_kstr(&w, "signature", ""); }
    else tern_jw_kstr(&w, "text", "");
    tern_jw_end(&w);
    tern_jw_end(&w);
    srv_sse_value(out, "content_block_start", &w);
    c->block = kind;
    ping(c, out);
}

static void block_delta(msg_ctx *c, int kind, const char *t, size_t n, tern_jw *out) {
    if (!n) return;
    block_open(c, kind, out);
    tern_jw w;
    event_head(&w, "content_block_delta", c->n_blocks - 1, "delta");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", kind == 1 ? "thinking_delta" : "text_delta");
    tern_jw_kstrn(&w, kind == 1 ? "thinking" : "text", t, n);
    tern_jw_end(&w);
    tern_jw_end(&w);
    srv_sse_value(out, "content_block_delta", &w);
}

static void stream_call(msg_ctx *c, int i, tern_jw *out) {
    block_stop(c, out);
    const tern_tool_call *tc = srv_job_call(c->job, i, NULL);
    tern_jw w;
    event_head(&w, "content_block_start", c->n_blocks++, "content_block");
    tool_use(c->job, i, &w, 1);
    tern_jw_end(&w);
    srv_sse_value(out, "content_block_start", &w);
    ping(c, out);
    c->block = 3;
    event_head(&w, "content_block_delta", c->n_blocks - 1, "delta");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "input_json_delta");
    tern_jw_kstr(&w, "partial_json", tc && tc->arguments ? tc->arguments : "{}");
    tern_jw_end(&w);
    tern_jw_end(&w);
    srv_sse_value(out, "content_block_delta", &w);
    block_stop(c, out);
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
    srv_sse_value(out, "message_start", &w);
}

static void s_piece(void *ctx, const srv_piece *p, tern_jw *out) {
    msg_ctx *c = ctx;
    block_delta(c, 1, p->reasoning, p->reasoning_len, out);
    block_delta(c, 2, p->text, p->len, out);
    for (int i = p->call_lo; i < p->call_hi; i++) stream_call(c, i, out);
}

static void s_end(void *ctx, const srv_result *r, tern_jw *out) {
    msg_ctx *c = ctx;
    if (!c->n_blocks) block_open(c, 2, out);       /* an empty answer still has one text block */
    block_stop(c, out);
    tern_jw w;

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
    srv_sse_value(out, "message_delta", &w);

    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "message_stop");
    tern_jw_end(&w);
    srv_sse_value(out, "message_stop", &w);
}

static void s_error(void *ctx, const srv_error *e, tern_jw *out) {
    (void)ctx;
    tern_jw w;
    tern_jw_init(&w);
    srv_write_anthropic_error(&w, e); /* the same type names as a reply's (a 429 mid-stream is rate_limit_error) */
    srv_sse_value(out, "error", &w);
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

/* Anthropic tools [{name, description, input_schema}] -> OpenAI form (new array) in *out;
 * tool_choice {"type": auto|none|any|tool}. *out NULL when no tools apply. */
static int read_tools(const cJSON *req, cJSON **out, srv_error *e) {
    *out = NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
            return srv_fail(e, 400, "tool_choice", "tool_choice: expected an object with a \"type\"");
        if (!strcmp(ty->valuestring, "none")) return 0;
        if (strcmp(ty->valuestring, "auto"))
            return srv_fail(e, 400, "tool_choice", "tool_choice: only \"auto\" and \"none\" are supported, got \"%.40s\"",
                            ty->valuestring);
    }
    if (!t || cJSON_IsNull(t)) return 0;
    if (!cJSON_IsArray(t)) return srv_fail(e, 400, "tools", "tools: expected a list");
    if (!cJSON_GetArraySize(t)) return 0;
    cJSON *o = cJSON_CreateArray();
    if (!o) return srv_fail(e, 500, "", "out of memory");
    const cJSON *x;
    int i = 0;
    cJSON_ArrayForEach(x, t) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(x, "name");
        if (!cJSON_IsObject(x) || !cJSON_IsString(nm)) {
            cJSON_Delete(o);
            return srv_fail(e, 400, "tools", "tools[%d]: expected an object with a \"name\"", i);
        }
        cJSON *d = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(x, "description");
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(x, "input_schema");
        cJSON_AddItemToObject(fn, "parameters", sc ? cJSON_Duplicate(sc, 1) : cJSON_CreateObject());
        cJSON_AddItemToObject(d, "function", fn);
        cJSON_AddItemToArray(o, d);
        i++;
    }
    *out = o;
    return 0;
}

enum MHD_Result srv_handle_count_tokens(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL, *tools = NULL;
    char *system = NULL;
    srv_prompt pr = {0};
    enum MHD_Result ret;
    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e) || srv_check_model(s, req, &e) ||
        read_system(req, &system, &e) || read_tools(req, &tools, &e) ||
        srv_prompt_chat(s, cJSON_GetObjectItemCaseSensitive(req, "messages"), system, tools, NULL, 1, &pr, &e)) {
        ret = srv_reply_anthropic_error(r, &e);
    } else {
        tern_jw w;
        tern_jw_init(&w);
        tern_jw_obj(&w);
        tern_jw_kint(&w, "input_tokens", pr.n);
        tern_jw_end(&w);
        ret = srv_reply_jw(r, 200, &w);
    }
    srv_prompt_free(&pr);
    free(system);
    cJSON_Delete(tools);
    cJSON_Delete(req);
    return ret;
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
    cJSON *tools = NULL;
    char *rtext = NULL;
    size_t rlen = 0;
    enum MHD_Result ret;

    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e) || srv_check_model(s, req, &e)) goto fail;
    if (srv_params_parse_s(&p, req, SRV_API_ANTHROPIC, s, &e)) goto fail;
    if (read_system(req, &system, &e) || read_tools(req, &tools, &e)) goto fail;
    int think = -1;
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(req, "thinking");   /* {"type": "enabled"|"disabled"} */
    const cJSON *tht = cJSON_GetObjectItemCaseSensitive(th, "type");
    if (cJSON_IsString(tht)) think = !strcmp(tht->valuestring, "enabled");
    if (srv_prompt_chat2(s, cJSON_GetObjectItemCaseSensitive(req, "messages"), system, tools, NULL, 1, think, &pr, &e) ||
        srv_output_setup(s, &p, &pr, tools, tools != NULL, &e))
        goto fail;
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
    cJSON_Delete(tools);
    tools = NULL;
    if (stream) { c->job = job; return srv_stream(r, job, &k_msg_stream, c); }
    if (srv_collect2(job, &text, &len, &rtext, &rlen, &toks, &n_toks, &res, &e)) goto fail;

    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "id", c->id);
    tern_jw_kstr(&w, "type", "message");
    tern_jw_kstr(&w, "role", "assistant");
    tern_jw_kstr(&w, "model", s->served);
    tern_jw_key(&w, "content");
    tern_jw_arr(&w);
    if (rlen) {
        tern_jw_obj(&w);
        tern_jw_kstr(&w, "type", "thinking");
        tern_jw_kstrn(&w, "thinking", rtext, rlen);
        tern_jw_kstr(&w, "signature", "");
        tern_jw_end(&w);
    }
    if (len || !res.n_calls) {
        tern_jw_obj(&w);
        tern_jw_kstr(&w, "type", "text");
        tern_jw_kstrn(&w, "text", text, len);
        tern_jw_end(&w);
    }
    for (int i = 0; i < res.n_calls; i++) tool_use(job, i, &w, 0);
    tern_jw_end(&w);
    srv_job_free(job);
    job = NULL;
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
    free(rtext);
    free(toks);
    ctx_free(c);
    return srv_reply_jw(r, 200, &w);

fail:
    ret = e.http == 499 ? MHD_NO : srv_reply_anthropic_error(r, &e);
    srv_job_free(job);
    free(text);
    free(rtext);
    cJSON_Delete(tools);
    free(toks);
    free(system);
    ctx_free(c);
    srv_prompt_free(&pr);
    srv_params_free(&p);
    cJSON_Delete(req);
    return ret;
}
