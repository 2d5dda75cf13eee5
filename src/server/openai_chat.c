/*
 * openai_chat.c — POST /v1/chat/completions (OpenAI Chat Completions).
 *
 * Request: messages (prompt.c), model (must be ours if given), the sampling fields of
 * params.c, tools (passed to the chat template unless tool_choice is "none"), tool_choice
 * "none" | "auto" ("required" and a named function are refused with 400: nothing forces the
 * model to call, and silently not calling would be worse), chat_template_kwargs (extra
 * template variables, e.g. enable_thinking), reasoning_effort ("none" -> enable_thinking
 * false, other levels -> true), response_format text / json_object / json_schema
 * (constrained decoding, output.c + jsonfsm.c).
 * Output: the text is split by the model's markup (output.c) into content, reasoning
 * (message.reasoning_content and .reasoning) and tool_calls [{id, type, function{name,
 * arguments}}]; finish_reason "tool_calls" when calls were made. Streamed: reasoning and
 * content deltas as they come; each tool call as one delta {index, id, type, function{name,
 * arguments}} when its markup closes.
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

struct chat_ctx {
    tern_server *s;
    srv_job *job;
    char id[64];
    long long created;
    int include_usage, logprobs, top_logprobs;
    int completions;           /* 1: legacy text_completion shapes (openai_completions.c) */
};

const char *srv_finish_str(srv_end e) { return e == SRV_END_LENGTH ? "length" : "stop"; }

typedef struct chat_ctx chat_ctx;
static void write_calls(srv_job *j, tern_jw *w, int lo, int hi, int stream);

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

/* a chunk's head up to its one choice's open "delta" object */
static void chunk_delta(chat_ctx *c, tern_jw *w) {
    chunk_head(c, w);
    tern_jw_obj(w);
    tern_jw_kint(w, "index", 0);
    tern_jw_key(w, "delta");
    tern_jw_obj(w);
}

static void s_start(void *ctx, tern_jw *out) {
    chat_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    chunk_delta(c, &w);
    tern_jw_kstr(&w, "role", "assistant");
    tern_jw_kstr(&w, "content", "");
    tern_jw_end(&w);
    tern_jw_knull(&w, "logprobs");
    tern_jw_knull(&w, "finish_reason");
    tern_jw_end(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    srv_sse_value(out, NULL, &w);
}

static void s_piece(void *ctx, const srv_piece *p, tern_jw *out) {
    chat_ctx *c = ctx;
    if (!p->len && !p->reasoning_len && p->call_hi == p->call_lo && !(c->logprobs && p->n_toks)) return;
    tern_jw *w = out;                            /* per token: written in place, no copies */
    srv_sse_begin(out, NULL);
    chunk_delta(c, w);
    if (p->len || !p->reasoning_len) tern_jw_kstrn(w, "content", p->text, p->len);
    if (p->reasoning_len) {
        tern_jw_kstrn(w, "reasoning_content", p->reasoning, p->reasoning_len);
        tern_jw_kstrn(w, "reasoning", p->reasoning, p->reasoning_len);
    }
    if (p->call_hi > p->call_lo) write_calls(c->job, w, p->call_lo, p->call_hi, 1);
    tern_jw_end(w);
    if (c->logprobs) {
        tern_jw_key(w, "logprobs");
        tern_jw_obj(w);
        tern_jw_key(w, "content");
        tern_jw_arr(w);
        srv_write_chat_logprobs(c->s, w, p->toks, p->n_toks, c->top_logprobs);
        tern_jw_end(w);
        tern_jw_end(w);
    } else tern_jw_knull(w, "logprobs");
    tern_jw_knull(w, "finish_reason");
    tern_jw_end(w);
    tern_jw_end(w);
    tern_jw_end(w);
    srv_sse_end(out);
}

static void s_end(void *ctx, const srv_result *r, tern_jw *out) {
    chat_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    chunk_delta(c, &w);
    tern_jw_end(&w);
    tern_jw_knull(&w, "logprobs");
    tern_jw_kstr(&w, "finish_reason", srv_finish_str_r(r));
    tern_jw_end(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    srv_sse_value(out, NULL, &w);
    if (c->include_usage) {
        tern_jw_init(&w);
        chunk_head(c, &w);
        tern_jw_end(&w);
        srv_write_usage(&w, r);
        tern_jw_end(&w);
        srv_sse_value(out, NULL, &w);
    }
    srv_sse_done(out);
}

static void s_error(void *ctx, const srv_error *e, tern_jw *out) {
    (void)ctx;
    srv_sse_openai_error(out, e);
}

/* "tool_calls": [...] for calls [lo, hi) of job j; stream: with "index". */
static void write_calls(srv_job *j, tern_jw *w, int lo, int hi, int stream) {
    tern_jw_key(w, "tool_calls");
    tern_jw_arr(w);
    for (int i = lo; i < hi; i++) {
        const char *id = NULL;
        const tern_tool_call *tc = srv_job_call(j, i, &id);
        if (!tc) continue;
        tern_jw_obj(w);
        if (stream) tern_jw_kint(w, "index", i);
        tern_jw_kstr(w, "id", id);
        tern_jw_kstr(w, "type", "function");
        tern_jw_key(w, "function");
        tern_jw_obj(w);
        tern_jw_kstr(w, "name", tc->name ? tc->name : "");
        tern_jw_kstr(w, "arguments", tc->arguments ? tc->arguments : "{}");
        tern_jw_end(w);
        tern_jw_end(w);
    }
    tern_jw_end(w);
}

/* tools / tool_choice -> (tools to render, parser on). Returns 0 or -1 (e). */
static int tool_choice(const cJSON *req, const cJSON **tools, srv_error *e) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
    *tools = NULL;
    if (t && !cJSON_IsNull(t) && !cJSON_IsArray(t)) return srv_fail(e, 400, "tools", "tools: expected a list");
    const cJSON *x;
    int i = 0;
    cJSON_ArrayForEach(x, t) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(x, "function");
        if (!cJSON_IsObject(x) || !cJSON_IsObject(fn) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")))
            return srv_fail(e, 400, "tools", "tools[%d]: expected {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        i++;
    }
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) return 0;
        if (!(cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto"))) {
            if ((cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) || cJSON_IsObject(tc))
                return srv_fail(e, 400, "tool_choice",
                                "tool_choice: only \"auto\" and \"none\" are supported (forcing a tool call is not)");
            return srv_fail(e, 400, "tool_choice", "tool_choice: expected \"none\", \"auto\", \"required\" or an object");
        }
    }
    if (cJSON_IsArray(t) && cJSON_GetArraySize(t) > 0) *tools = t;
    return 0;
}

static const srv_stream_fmt k_chat_stream = {s_start, s_piece, s_end, s_error, free};

int srv_collect(srv_job *j, char **text, size_t *len, srv_tokinfo **toks, int *n_toks, srv_result *res,
                srv_error *e) {
    char *r = NULL;
    size_t rl = 0;
    int rc = srv_collect2(j, text, len, &r, &rl, toks, n_toks, res, e);
    free(r);
    return rc;
}

/* text[0, len) += p[0, n) and a terminating NUL, growing *cap by doubling; 0, or -1 (out of memory) */
static int append_text(char **text, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        while (nc < *len + n + 1) nc *= 2;
        char *b = realloc(*text, nc);
        if (!b) return -1;
        *text = b;
        *cap = nc;
    }
    if (n) memcpy(*text + *len, p, n);
    *len += n;
    (*text)[*len] = 0;
    return 0;
}

/* Run a job to its end, collecting content, reasoning (+ tokens when logprobs). 0 or -1 (e). */
int srv_collect2(srv_job *j, char **text, size_t *len, char **rtext, size_t *rlen, srv_tokinfo **toks, int *n_toks,
                 srv_result *res, srv_error *e) {
    size_t cap = 0, rcap = 0;
    int tcap = 0;
    *text = NULL; *len = 0; *toks = NULL; *n_toks = 0; *rtext = NULL; *rlen = 0;
    for (;;) {
        srv_piece p;
        int rc = srv_job_next(j, &p, res, e);
        if (rc < 0) return -1;
        if (rc == 0) break;
        if (append_text(text, len, &cap, p.text, p.len) ||
            (p.reasoning_len && append_text(rtext, rlen, &rcap, p.reasoning, p.reasoning_len)))
            return srv_fail(e, 500, "", "out of memory");
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
    if (srv_params_parse_s(&p, req, SRV_API_OPENAI, s, &e)) goto fail;
    if (srv_response_format(s, &p, cJSON_GetObjectItemCaseSensitive(req, "response_format"), "response_format", &e))
        goto fail;
    const cJSON *tools = NULL;
    int think = -1;
    if (tool_choice(req, &tools, &e) || srv_reasoning_effort(req, &think, &e)) goto fail;
    if (srv_prompt_chat2(s, cJSON_GetObjectItemCaseSensitive(req, "messages"), NULL, tools,
                         cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs"), 0, think, &pr, &e) ||
        srv_output_setup(s, &p, &pr, tools, tools != NULL, &e))
        goto fail;
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
        c.job = job;
        *hc = c;
        return srv_stream(r, job, &k_chat_stream, hc);
    }
    char *rtext = NULL;
    size_t rlen = 0;
    if (srv_collect2(job, &text, &len, &rtext, &rlen, &toks, &n_toks, &res, &e)) { free(rtext); goto fail; }

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
    if (len || !res.n_calls) tern_jw_kstrn(&w, "content", text, len);
    else tern_jw_knull(&w, "content");
    if (rlen) {
        tern_jw_kstrn(&w, "reasoning_content", rtext, rlen);
        tern_jw_kstrn(&w, "reasoning", rtext, rlen);
    }
    if (res.n_calls) write_calls(job, &w, 0, res.n_calls, 0);
    tern_jw_end(&w);
    free(rtext);
    srv_job_free(job);
    job = NULL;
    if (c.logprobs) {
        tern_jw_key(&w, "logprobs");
        tern_jw_obj(&w);
        tern_jw_key(&w, "content");
        tern_jw_arr(&w);
        srv_write_chat_logprobs(s, &w, toks, n_toks, c.top_logprobs);
        tern_jw_end(&w);
        tern_jw_end(&w);
    } else tern_jw_knull(&w, "logprobs");
    tern_jw_kstr(&w, "finish_reason", srv_finish_str_r(&res));
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
