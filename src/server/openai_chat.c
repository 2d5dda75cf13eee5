/*
 * openai_chat.c — POST /v1/chat/completions (OpenAI Chat Completions).
 *
 * Request: messages (prompt.c), model (must be ours if given), the sampling fields of
 * params.c, tools (passed to the chat template unless tool_choice is "none"),
 * chat_template_kwargs (extra template variables, e.g. enable_thinking), response_format "text" only (json_object /
 * json_schema need constrained decoding: 400 until then).
 * Response: chat.completion {id, object, created, model, choices[{index, message{role,
 * content}, logprobs, finish_reason}], usage{prompt_tokens, completion_tokens, total_tokens,
 * prompt_tokens_details{cached_tokens}}}. Streaming: chat.completion.chunk events — first
 * delta {role, content ""}, then content deltas, then an empty delta with finish_reason,
 * then (stream_options.include_usage) a chunk with empty choices and usage, then [DONE].
 * Logprobs use OpenAI's shape: content[{token, logprob, bytes, top_logprobs[...]}].
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct chat_ctx {
    tern_server *s;
    char id[64];
    long long created;
    int include_usage, logprobs, top_logprobs;
    int completions;           /* 1: legacy text_completion shapes (openai_completions.c) */
} chat_ctx;

const char *srv_finish_str(srv_end e) { return e == SRV_END_LENGTH ? "length" : "stop"; }

static void write_bytes(tern_jw *w, const char *t) {
    tern_jw_key(w, "bytes");
    tern_jw_arr(w);
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) tern_jw_int(w, *p);
    tern_jw_end(w);
}

/* OpenAI chat logprobs entries for n tokens (inside an open "content" array). */
void srv_write_chat_logprobs(tern_server *s, tern_jw *w, const srv_tokinfo *t, int n, int top) {
    for (int i = 0; i < n; i++) {
        char *txt = srv_token_text(s, t[i].id);
        tern_jw_obj(w);
        tern_jw_kstr(w, "token", txt ? txt : "");
        tern_jw_kdouble(w, "logprob", t[i].logprob);
        write_bytes(w, txt ? txt : "");
        tern_jw_key(w, "top_logprobs");
        tern_jw_arr(w);
        for (int k = 0; k < t[i].n_top && k < top; k++) {
            char *tt = srv_token_text(s, t[i].top_ids[k]);
            tern_jw_obj(w);
            tern_jw_kstr(w, "token", tt ? tt : "");
            tern_jw_kdouble(w, "logprob", t[i].top_lps[k]);
            write_bytes(w, tt ? tt : "");
            tern_jw_end(w);
            free(tt);
        }
        tern_jw_end(w);
        tern_jw_end(w);
        free(txt);
    }
}

void srv_write_usage(tern_jw *w, const srv_result *r) {
    tern_jw_key(w, "usage");
    tern_jw_obj(w);
    tern_jw_kint(w, "prompt_tokens", r->n_prompt);
    tern_jw_kint(w, "completion_tokens", r->n_generated);
    tern_jw_kint(w, "total_tokens", r->n_prompt + r->n_generated);
    tern_jw_key(w, "prompt_tokens_details");
    tern_jw_obj(w);
    tern_jw_kint(w, "cached_tokens", r->n_cached);
    tern_jw_end(w);
    tern_jw_end(w);
}

static void chunk_head(chat_ctx *c, tern_jw *w) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "id", c->id);
    tern_jw_kstr(w, "object", "chat.completion.chunk");
    tern_jw_kint(w, "created", c->created);
    tern_jw_kstr(w, "model", c->s->served);
    tern_jw_kstr(w, "system_fingerprint", "tern");
    tern_jw_key(w, "choices");
    tern_jw_arr(w);
}

/* Serialize the value in `v` as one SSE data event onto out. */
static void flush_event(tern_jw *v, tern_jw *out) {
    size_t n;
    char *j = tern_jw_take(v, &n);
    if (!j) { out->oom = 1; return; }
    srv_sse_data(out, NULL, j, n);
    free(j);
}

static void s_start(void *ctx, tern_jw *out) {
    chat_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    chunk_head(c, &w);
    tern_jw_obj(&w);
    tern_jw_kint(&w, "index", 0);
    tern_jw_key(&w, "delta");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "role", "assistant");
    tern_jw_kstr(&w, "content", "");
    tern_jw_end(&w);
    tern_jw_knull(&w, "logprobs");
    tern_jw_knull(&w, "finish_reason");
    tern_jw_end(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    flush_event(&w, out);
}

static void s_piece(void *ctx, const srv_piece *p, tern_jw *out) {
    chat_ctx *c = ctx;
    if (!p->len && !(c->logprobs && p->n_toks)) return;
    tern_jw w;
    tern_jw_init(&w);
    chunk_head(c, &w);
    tern_jw_obj(&w);
    tern_jw_kint(&w, "index", 0);
    tern_jw_key(&w, "delta");
    tern_jw_obj(&w);
    tern_jw_kstrn(&w, "content", p->text, p->len);
    tern_jw_end(&w);
    if (c->logprobs) {
        tern_jw_key(&w, "logprobs");
        tern_jw_obj(&w);
        tern_jw_key(&w, "content");
        tern_jw_arr(&w);
        srv_write_chat_logprobs(c->s, &w, p->toks, p->n_toks, c->top_logprobs);
        tern_jw_end(&w);
        tern_jw_end(&w);
    } else tern_jw_knull(&w, "logprobs");
    tern_jw_knull(&w, "finish_reason");
    tern_jw_end(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    flush_event(&w, out);
}

static void s_end(void *ctx, const srv_result *r, tern_jw *out) {
    chat_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    chunk_head(c, &w);
    tern_jw_obj(&w);
    tern_jw_kint(&w, "index", 0);
    tern_jw_key(&w, "delta");
    tern_jw_obj(&w);
    tern_jw_end(&w);
    tern_jw_knull(&w, "logprobs");
    tern_jw_kstr(&w, "finish_reason", srv_finish_str(r->end));
    tern_jw_end(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    flush_event(&w, out);
    if (c->include_usage) {
        tern_jw_init(&w);
        chunk_head(c, &w);
        tern_jw_end(&w);
        srv_write_usage(&w, r);
        tern_jw_end(&w);
        flush_event(&w, out);
    }
    tern_jw_text(out, "data: [DONE]\n\n", 14);
}

static void s_error(void *ctx, const srv_error *e, tern_jw *out) {
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_key(&w, "error");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "message", e->msg);
    tern_jw_kstr(&w, "type", e->http >= 500 ? "server_error" : "invalid_request_error");
    tern_jw_knull(&w, "param");
    tern_jw_knull(&w, "code");
    tern_jw_end(&w);
    tern_jw_end(&w);
    flush_event(&w, out);
    tern_jw_text(out, "data: [DONE]\n\n", 14);
    (void)ctx;
}

static const srv_stream_fmt k_chat_stream = {s_start, s_piece, s_end, s_error, free};

/* Run a job to its end, collecting text (+ tokens when logprobs). Returns 0 or -1 (e). */
int srv_collect(srv_job *j, char **text, size_t *len, srv_tokinfo **toks, int *n_toks, srv_result *res,
                srv_error *e) {
    size_t cap = 0;
    int tcap = 0;
    *text = NULL; *len = 0; *toks = NULL; *n_toks = 0;
    for (;;) {
        srv_piece p;
        int rc = srv_job_next(j, &p, res, e);
        if (rc < 0) return -1;
        if (rc == 0) break;
        if (*len + p.len + 1 > cap) {
            size_t nc = cap ? cap * 2 : 1024;
            while (nc < *len + p.len + 1) nc *= 2;
            char *b = realloc(*text, nc);
            if (!b) return srv_fail(e, 500, "", "out of memory");
            *text = b;
            cap = nc;
        }
        memcpy(*text + *len, p.text, p.len);
        *len += p.len;
        (*text)[*len] = 0;
        if (p.n_toks) {
            if (*n_toks + p.n_toks > tcap) {
                int nc = tcap ? tcap * 2 : 64;
                while (nc < *n_toks + p.n_toks) nc *= 2;
                srv_tokinfo *v = realloc(*toks, sizeof(srv_tokinfo) * (size_t)nc);
                if (!v) return srv_fail(e, 500, "", "out of memory");
                *toks = v;
                tcap = nc;
            }
            memcpy(*toks + *n_toks, p.toks, sizeof(srv_tokinfo) * (size_t)p.n_toks);
            *n_toks += p.n_toks;
        }
    }
    if (!*text && !(*text = calloc(1, 1))) return srv_fail(e, 500, "", "out of memory");
    return 0;
}

enum MHD_Result srv_handle_chat(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL;
    srv_params p = {0};
    srv_prompt pr = {0};
    srv_job *job = NULL;
    char *text = NULL;
    srv_tokinfo *toks = NULL;
    int n_toks = 0;
    size_t len = 0;
    srv_result res = {0};
    enum MHD_Result ret;

    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e) || srv_check_model(s, req, &e)) goto fail;
    if (srv_params_parse(&p, req, SRV_API_OPENAI, s->info.n_vocab, s->info.n_ctx, &e)) goto fail;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(t)) {
            srv_fail(&e, 400, "response_format", "response_format: expected an object with a \"type\"");
            goto fail;
        }
        if (strcmp(t->valuestring, "text")) {
            srv_fail(&e, 400, "response_format", "response_format: type \"%.40s\" is not supported yet (only \"text\")",
                     t->valuestring);
            goto fail;
        }
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) {
        srv_fail(&e, 400, "tools", "tools: expected a list");
        goto fail;
    }
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0 ||
        (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")))
        tools = NULL;
    if (srv_prompt_chat(s, cJSON_GetObjectItemCaseSensitive(req, "messages"), NULL, tools,
                        cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs"), 0, &pr, &e)) goto fail;
    int stream = p.stream;
    chat_ctx c = {.s = s, .created = (long long)time(NULL), .include_usage = p.include_usage,
                  .logprobs = p.logprobs, .top_logprobs = p.top_logprobs};
    srv_make_id(s, "chatcmpl-", c.id, sizeof c.id);
    if (srv_job_start(s, &pr, &p, r->fd, &job, &e)) goto fail;
    srv_prompt_free(&pr);
    cJSON_Delete(req);
    req = NULL;
    if (stream) {
        chat_ctx *hc = malloc(sizeof *hc);
        if (!hc) { srv_job_free(job); return MHD_NO; }
        *hc = c;
        return srv_stream(s, r->conn, job, &k_chat_stream, hc);
    }
    if (srv_collect(job, &text, &len, &toks, &n_toks, &res, &e)) goto fail;
    srv_job_free(job);
    job = NULL;

    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "id", c.id);
    tern_jw_kstr(&w, "object", "chat.completion");
    tern_jw_kint(&w, "created", c.created);
    tern_jw_kstr(&w, "model", s->served);
    tern_jw_kstr(&w, "system_fingerprint", "tern");
    tern_jw_key(&w, "choices");
    tern_jw_arr(&w);
    tern_jw_obj(&w);
    tern_jw_kint(&w, "index", 0);
    tern_jw_key(&w, "message");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "role", "assistant");
    tern_jw_kstrn(&w, "content", text, len);
    tern_jw_end(&w);
    if (c.logprobs) {
        tern_jw_key(&w, "logprobs");
        tern_jw_obj(&w);
        tern_jw_key(&w, "content");
        tern_jw_arr(&w);
        srv_write_chat_logprobs(s, &w, toks, n_toks, c.top_logprobs);
        tern_jw_end(&w);
        tern_jw_end(&w);
    } else tern_jw_knull(&w, "logprobs");
    tern_jw_kstr(&w, "finish_reason", srv_finish_str(res.end));
    tern_jw_end(&w);
    tern_jw_end(&w);
    srv_write_usage(&w, &res);
    tern_jw_end(&w);
    free(text);
    free(toks);
    return srv_reply_jw(r, 200, &w);

fail:
    ret = e.http == 499 ? MHD_NO : srv_reply_openai_error(r, &e);
    srv_job_free(job);
    free(text);
    free(toks);
    srv_prompt_free(&pr);
    srv_params_free(&p);
    cJSON_Delete(req);
    return ret;
}
