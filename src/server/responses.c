/*
 * responses.c — POST /v1/responses (OpenAI Responses API) and POST /v1/embeddings (400).
 *
 * Request: input (a string, or items: messages {role, content: string | [{type input_text /
 * output_text / text, text}]}, function_call {call_id, name, arguments},
 * function_call_output {call_id, output}; reasoning items are skipped), instructions (a
 * system message for this turn only), previous_response_id (the stored conversation of an
 * earlier response is prepended), tools [{type "function", name, description, parameters}],
 * tool_choice none/auto, max_output_tokens, temperature, top_p, stream, reasoning.effort,
 * text.format (text / json_object / json_schema {schema}), store (default true).
 * The items become chat messages and run through the same path as /v1/chat/completions.
 * Response: {id "resp_...", object "response", created_at, status completed | incomplete
 * (incomplete_details.reason max_output_tokens), model, output [reasoning?, message?,
 * function_call*], usage {input_tokens, input_tokens_details.cached_tokens, output_tokens,
 * output_tokens_details.reasoning_tokens, total_tokens}}.
 * Streaming events (each with sequence_number): response.created, response.in_progress,
 * per item response.output_item.added ... response.output_item.done (message items with
 * content_part.added, output_text.delta*, output_text.done, content_part.done; reasoning
 * items with reasoning_text.delta* and .done; function calls with function_call_arguments.delta /
 * .done), then response.completed (or response.incomplete) with the whole response.
 * Store: the last 256 stored conversations (FIFO), in memory; an unknown
 * previous_response_id is a 404.
 */
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STORE_MAX 256

typedef struct srv_store {
    pthread_mutex_t mu;
    char id[STORE_MAX][64];
    cJSON *conv[STORE_MAX];
    int next;
} srv_store;

static pthread_mutex_t g_store_init = PTHREAD_MUTEX_INITIALIZER;

static srv_store *store_get(tern_server *s) {
    pthread_mutex_lock(&g_store_init);
    if (!s->store && (s->store = calloc(1, sizeof *s->store))) pthread_mutex_init(&s->store->mu, NULL);
    pthread_mutex_unlock(&g_store_init);
    return s->store;
}

void srv_responses_free(tern_server *s) {
    if (!s || !s->store) return;
    for (int i = 0; i < STORE_MAX; i++) cJSON_Delete(s->store->conv[i]);
    pthread_mutex_destroy(&s->store->mu);
    free(s->store);
    s->store = NULL;
}

static void store_put(tern_server *s, const char *id, cJSON *conv) {   /* takes conv */
    srv_store *st = store_get(s);
    if (!st) { cJSON_Delete(conv); return; }
    pthread_mutex_lock(&st->mu);
    int i = st->next;
    st->next = (st->next + 1) % STORE_MAX;
    cJSON_Delete(st->conv[i]);
    st->conv[i] = conv;
    snprintf(st->id[i], sizeof st->id[i], "%s", id);
    pthread_mutex_unlock(&st->mu);
}

static cJSON *store_copy(tern_server *s, const char *id) {
    srv_store *st = store_get(s);
    cJSON *r = NULL;
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < STORE_MAX; i++)
        if (st->conv[i] && !strcmp(st->id[i], id)) { r = cJSON_Duplicate(st->conv[i], 1); break; }
    pthread_mutex_unlock(&st->mu);
    return r;
}

/* ---- input items -> chat messages ------------------------------------------------------- */

static int part_text(const cJSON *c, char **out, srv_error *e, const char *where) {
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : srv_fail(e, 500, "", "out of memory");
    if (!cJSON_IsArray(c)) return srv_fail(e, 400, "input", "%s.content: expected a string or a list of parts", where);
    size_t n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type"), *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) || !cJSON_IsString(t) ||
            (strcmp(ty->valuestring, "input_text") && strcmp(ty->valuestring, "output_text") && strcmp(ty->valuestring, "text")))
            return srv_fail(e, 400, "input", "%s.content: only text parts are supported (input_text, output_text)", where);
        n += strlen(t->valuestring);
    }
    char *b = malloc(n + 1);
    if (!b) return srv_fail(e, 500, "", "out of memory");
    b[0] = 0;
    cJSON_ArrayForEach(p, c) strcat(b, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    *out = b;
    return 0;
}

static int add_items(cJSON *msgs, const cJSON *input, srv_error *e) {
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return 0;
    }
    if (!cJSON_IsArray(input)) return srv_fail(e, 400, "input", "input: expected a string or a list of items");
    const cJSON *it;
    int i = 0;
    char where[48];
    cJSON_ArrayForEach(it, input) {
        snprintf(where, sizeof where, "input[%d]", i++);
        if (!cJSON_IsObject(it)) return srv_fail(e, 400, "input", "%s: expected an object", where);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "message";
        if (!strcmp(t, "message")) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
            if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant") &&
                                          strcmp(role->valuestring, "system") && strcmp(role->valuestring, "developer")))
                return srv_fail(e, 400, "input", "%s.role: expected user, assistant, system or developer", where);
            char *txt = NULL;
            if (part_text(cJSON_GetObjectItemCaseSensitive(it, "content"), &txt, e, where)) return -1;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", role->valuestring);
            cJSON_AddStringToObject(m, "content", txt);
            free(txt);
            cJSON_AddItemToArray(msgs, m);
        } else if (!strcmp(t, "function_call")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id"), *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(nm) || !cJSON_IsString(args))
                return srv_fail(e, 400, "input", "%s: function_call needs string call_id, name and arguments", where);
            cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
            const cJSON *lr = cJSON_GetObjectItemCaseSensitive(last, "role");
            cJSON *m = last;
            if (!cJSON_IsString(lr) || strcmp(lr->valuestring, "assistant")) {
                m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "assistant");
                cJSON_AddStringToObject(m, "content", "");
                cJSON_AddItemToArray(msgs, m);
            }
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
            cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(fn, "name", nm->valuestring);
            cJSON_AddStringToObject(fn, "arguments", args->valuestring);
            cJSON_AddItemToObject(c, "function", fn);
            cJSON_AddItemToArray(calls, c);
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id"), *out = cJSON_GetObjectItemCaseSensitive(it, "output");
            if (!cJSON_IsString(id) || !out)
                return srv_fail(e, 400, "input", "%s: function_call_output needs call_id and output", where);
            char *txt = NULL;
            if (cJSON_IsString(out)) txt = strdup(out->valuestring);
            else if (part_text(out, &txt, e, where)) return -1;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", txt ? txt : "");
            free(txt);
            cJSON_AddItemToArray(msgs, m);
        } else if (strcmp(t, "reasoning")) {
            return srv_fail(e, 400, "input", "%s: item type \"%.40s\" is not supported", where, t);
        }
    }
    return 0;
}

/* Responses tools [{type function, name, ...}] -> chat tools. */
static int read_tools(const cJSON *req, cJSON **out, srv_error *e) {
    *out = NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) return 0;
    if (tc && !cJSON_IsNull(tc) && !(cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto")))
        return srv_fail(e, 400, "tool_choice", "tool_choice: only \"auto\" and \"none\" are supported");
    if (!t || cJSON_IsNull(t)) return 0;
    if (!cJSON_IsArray(t)) return srv_fail(e, 400, "tools", "tools: expected a list");
    if (!cJSON_GetArraySize(t)) return 0;
    cJSON *o = cJSON_CreateArray();
    const cJSON *x;
    int i = 0;
    cJSON_ArrayForEach(x, t) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type"), *nm = cJSON_GetObjectItemCaseSensitive(x, "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm)) {
            cJSON_Delete(o);
            return srv_fail(e, 400, "tools", "tools[%d]: only {\"type\": \"function\", \"name\": ...} tools are supported", i);
        }
        cJSON *d = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(x, "description"), *pa = cJSON_GetObjectItemCaseSensitive(x, "parameters");
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_IsObject(pa) ? cJSON_Duplicate(pa, 1) : cJSON_CreateObject());
        cJSON_AddItemToObject(d, "function", fn);
        cJSON_AddItemToArray(o, d);
        i++;
    }
    *out = o;
    return 0;
}

/* ---- output ------------------------------------------------------------------------- */

typedef struct resp_ctx {
    tern_server *s;
    srv_job *job;
    char id[64], msg_id[64], rs_id[64];
    long long created;
    char *text, *rtext;
    size_t len, cap, rlen, rcap;
    int open;                  /* stream: 0 none, 1 reasoning item, 2 message item */
    int n_items, seq;
    cJSON *conv;               /* the conversation to store (owned), NULL = do not store */
} resp_ctx;

static void ctx_free(void *p) {
    resp_ctx *c = p;
    if (!c) return;
    free(c->text);
    free(c->rtext);
    cJSON_Delete(c->conv);
    free(c);
}

static int grow_append(char **b, size_t *len, size_t *cap, const char *t, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        while (nc < *len + n + 1) nc *= 2;
        char *x = realloc(*b, nc);
        if (!x) return 0;
        *b = x;
        *cap = nc;
    }
    memcpy(*b + *len, t, n);
    *len += n;
    (*b)[*len] = 0;
    return 1;
}

static void call_item(resp_ctx *c, int i, tern_jw *w, int done) {
    const char *id = NULL;
    const tern_tool_call *tc = srv_job_call(c->job, i, &id);
    char fid[48];
    snprintf(fid, sizeof fid, "fc_%s", id && !strncmp(id, "call_", 5) ? id + 5 : "0");
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", "function_call");
    tern_jw_kstr(w, "id", fid);
    tern_jw_kstr(w, "call_id", id ? id : "");
    tern_jw_kstr(w, "name", tc && tc->name ? tc->name : "");
    tern_jw_kstr(w, "arguments", done && tc && tc->arguments ? tc->arguments : done ? "{}" : "");
    tern_jw_kstr(w, "status", done ? "completed" : "in_progress");
    tern_jw_end(w);
}

static void msg_item(resp_ctx *c, tern_jw *w, int done) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", "message");
    tern_jw_kstr(w, "id", c->msg_id);
    tern_jw_kstr(w, "status", done ? "completed" : "in_progress");
    tern_jw_kstr(w, "role", "assistant");
    tern_jw_key(w, "content");
    tern_jw_arr(w);
    if (done) {
        tern_jw_obj(w);
        tern_jw_kstr(w, "type", "output_text");
        tern_jw_kstrn(w, "text", c->text ? c->text : "", c->len);
        tern_jw_key(w, "annotations");
        tern_jw_arr(w);
        tern_jw_end(w);
        tern_jw_end(w);
    }
    tern_jw_end(w);
    tern_jw_end(w);
}

static void rs_item(resp_ctx *c, tern_jw *w, int done) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", "reasoning");
    tern_jw_kstr(w, "id", c->rs_id);
    tern_jw_key(w, "summary");
    tern_jw_arr(w);
    tern_jw_end(w);
    tern_jw_key(w, "content");
    tern_jw_arr(w);
    if (done) {
        tern_jw_obj(w);
        tern_jw_kstr(w, "type", "reasoning_text");
        tern_jw_kstrn(w, "text", c->rtext ? c->rtext : "", c->rlen);
        tern_jw_end(w);
    }
    tern_jw_end(w);
    tern_jw_end(w);
}

/* The whole response object; res NULL = in progress (no output, no usage). */
static void write_response(resp_ctx *c, const srv_result *res, tern_jw *w) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "id", c->id);
    tern_jw_kstr(w, "object", "response");
    tern_jw_kint(w, "created_at", c->created);
    int incomplete = res && res->end == SRV_END_LENGTH;
    tern_jw_kstr(w, "status", !res ? "in_progress" : incomplete ? "incomplete" : "completed");
    if (incomplete) {
        tern_jw_key(w, "incomplete_details");
        tern_jw_obj(w);
        tern_jw_kstr(w, "reason", "max_output_tokens");
        tern_jw_end(w);
    } else tern_jw_knull(w, "incomplete_details");
    tern_jw_knull(w, "error");
    tern_jw_kstr(w, "model", c->s->served);
    tern_jw_key(w, "output");
    tern_jw_arr(w);
    if (res) {
        if (c->rlen) rs_item(c, w, 1);
        if (c->len || !res->n_calls) msg_item(c, w, 1);
        for (int i = 0; i < res->n_calls; i++) call_item(c, i, w, 1);
    }
    tern_jw_end(w);
    tern_jw_kbool(w, "parallel_tool_calls", 1);
    tern_jw_key(w, "tools");
    tern_jw_arr(w);
    tern_jw_end(w);
    tern_jw_kstr(w, "tool_choice", "auto");
    if (res) {
        tern_jw_key(w, "usage");
        tern_jw_obj(w);
        tern_jw_kint(w, "input_tokens", res->n_prompt);
        tern_jw_key(w, "input_tokens_details");
        tern_jw_obj(w);
        tern_jw_kint(w, "cached_tokens", res->n_cached);
        tern_jw_end(w);
        tern_jw_kint(w, "output_tokens", res->n_generated);
        tern_jw_key(w, "output_tokens_details");
        tern_jw_obj(w);
        tern_jw_kint(w, "reasoning_tokens", 0);
        tern_jw_end(w);
        tern_jw_kint(w, "total_tokens", res->n_prompt + res->n_generated);
        tern_jw_end(w);
    } else tern_jw_knull(w, "usage");
    tern_jw_end(w);
}

/* Remember the conversation plus this answer under the response id. */
static void remember(resp_ctx *c, const srv_result *res) {
    if (!c->conv) return;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", c->text ? c->text : "");
    if (res->n_calls) {
        cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < res->n_calls; i++) {
            const char *id = NULL;
            const tern_tool_call *tc = srv_job_call(c->job, i, &id);
            if (!tc) continue;
            cJSON *x = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "id", id);
            cJSON_AddStringToObject(x, "type", "function");
            cJSON_AddStringToObject(fn, "name", tc->name ? tc->name : "");
            cJSON_AddStringToObject(fn, "arguments", tc->arguments ? tc->arguments : "{}");
            cJSON_AddItemToObject(x, "function", fn);
            cJSON_AddItemToArray(calls, x);
        }
    }
    cJSON_AddItemToArray(c->conv, m);
    store_put(c->s, c->id, c->conv);
    c->conv = NULL;
}

/* ---- streaming ---------------------------------------------------------------------- */

static void ev_begin(resp_ctx *c, tern_jw *w, const char *type) {
    tern_jw_init(w);
    tern_jw_obj(w);
    tern_jw_kstr(w, "type", type);
    tern_jw_kint(w, "sequence_number", c->seq++);
}

static void ev_end(tern_jw *w, const char *type, tern_jw *out) {
    tern_jw_end(w);
    srv_sse_value(out, type, w);
}

static void item_event(resp_ctx *c, const char *type, int kind, int call, int done, tern_jw *out) {
    tern_jw w;
    ev_begin(c, &w, type);
    tern_jw_kint(&w, "output_index", c->n_items - (done ? 1 : 1));
    tern_jw_key(&w, "item");
    if (kind == 1) rs_item(c, &w, done);
    else if (kind == 2) msg_item(c, &w, done);
    else call_item(c, call, &w, done);
    ev_end(&w, type, out);
}

static void part_event(resp_ctx *c, const char *type, int done, tern_jw *out) {
    tern_jw w;
    ev_begin(c, &w, type);
    tern_jw_kstr(&w, "item_id", c->msg_id);
    tern_jw_kint(&w, "output_index", c->n_items - 1);
    tern_jw_kint(&w, "content_index", 0);
    tern_jw_key(&w, "part");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "type", "output_text");
    tern_jw_kstrn(&w, "text", done && c->text ? c->text : "", done ? c->len : 0);
    tern_jw_key(&w, "annotations");
    tern_jw_arr(&w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    ev_end(&w, type, out);
}

static void text_event(resp_ctx *c, const char *type, int reasoning, const char *t, size_t n, int done, tern_jw *out) {
    tern_jw w;
    ev_begin(c, &w, type);
    tern_jw_kstr(&w, "item_id", reasoning ? c->rs_id : c->msg_id);
    tern_jw_kint(&w, "output_index", c->n_items - 1);
    tern_jw_kint(&w, "content_index", 0);
    tern_jw_kstrn(&w, done ? "text" : "delta", t, n);
    if (!reasoning) { tern_jw_key(&w, "logprobs"); tern_jw_arr(&w); tern_jw_end(&w); }
    ev_end(&w, type, out);
}

static void close_open(resp_ctx *c, tern_jw *out) {
    if (c->open == 1) {
        text_event(c, "response.reasoning_text.done", 1, c->rtext ? c->rtext : "", c->rlen, 1, out);
        item_event(c, "response.output_item.done", 1, 0, 1, out);
    } else if (c->open == 2) {
        text_event(c, "response.output_text.done", 0, c->text ? c->text : "", c->len, 1, out);
        part_event(c, "response.content_part.done", 1, out);
        item_event(c, "response.output_item.done", 2, 0, 1, out);
    }
    c->open = 0;
}

static void open_kind(resp_ctx *c, int kind, tern_jw *out) {
    if (c->open == kind) return;
    close_open(c, out);
    c->n_items++;
    c->open = kind;
    item_event(c, "response.output_item.added", kind, 0, 0, out);
    if (kind == 2) part_event(c, "response.content_part.added", 0, out);
}

static void s_start(void *ctx, tern_jw *out) {
    resp_ctx *c = ctx;
    static const char *k[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        tern_jw w;
        ev_begin(c, &w, k[i]);
        tern_jw_key(&w, "response");
        write_response(c, NULL, &w);
        ev_end(&w, k[i], out);
    }
}

static void s_piece(void *ctx, const srv_piece *p, tern_jw *out) {
    resp_ctx *c = ctx;
    if (p->reasoning_len) {
        open_kind(c, 1, out);
        if (!grow_append(&c->rtext, &c->rlen, &c->rcap, p->reasoning, p->reasoning_len)) { out->oom = 1; return; }
        text_event(c, "response.reasoning_text.delta", 1, p->reasoning, p->reasoning_len, 0, out);
    }
    if (p->len) {
        open_kind(c, 2, out);
        if (!grow_append(&c->text, &c->len, &c->cap, p->text, p->len)) { out->oom = 1; return; }
        text_event(c, "response.output_text.delta", 0, p->text, p->len, 0, out);
    }
    for (int i = p->call_lo; i < p->call_hi; i++) {
        close_open(c, out);
        c->n_items++;
        item_event(c, "response.output_item.added", 3, i, 0, out);
        const tern_tool_call *tc = srv_job_call(c->job, i, NULL);
        const char *args = tc && tc->arguments ? tc->arguments : "{}";
        char fid[48];
        const char *id = NULL;
        srv_job_call(c->job, i, &id);
        snprintf(fid, sizeof fid, "fc_%s", id && !strncmp(id, "call_", 5) ? id + 5 : "0");
        static const char *k[] = {"response.function_call_arguments.delta", "response.function_call_arguments.done"};
        for (int d = 0; d < 2; d++) {
            tern_jw w;
            ev_begin(c, &w, k[d]);
            tern_jw_kstr(&w, "item_id", fid);
            tern_jw_kint(&w, "output_index", c->n_items - 1);
            tern_jw_kstr(&w, d ? "arguments" : "delta", args);
            ev_end(&w, k[d], out);
        }
        item_event(c, "response.output_item.done", 3, i, 1, out);
    }
}

static void s_end(void *ctx, const srv_result *r, tern_jw *out) {
    resp_ctx *c = ctx;
    if (!c->n_items && !r->n_calls) open_kind(c, 2, out);    /* an empty answer is still a message */
    close_open(c, out);
    const char *k = r->end == SRV_END_LENGTH ? "response.incomplete" : "response.completed";
    tern_jw w;
    ev_begin(c, &w, k);
    tern_jw_key(&w, "response");
    write_response(c, r, &w);
    ev_end(&w, k, out);
    remember(c, r);
}

static void s_error(void *ctx, const srv_error *e, tern_jw *out) {
    resp_ctx *c = ctx;
    tern_jw w;
    ev_begin(c, &w, "error");
    tern_jw_kstr(&w, "code", e->http >= 500 ? "server_error" : "invalid_request_error");
    tern_jw_kstr(&w, "message", e->msg);
    tern_jw_knull(&w, "param");
    ev_end(&w, "error", out);
}

static const srv_stream_fmt k_resp_stream = {s_start, s_piece, s_end, s_error, ctx_free};

/* ---- handler ------------------------------------------------------------------------ */

enum MHD_Result srv_handle_responses(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL, *msgs = NULL, *tools = NULL;
    srv_params p = {0};
    srv_prompt pr = {0};
    srv_job *job = NULL;
    resp_ctx *c = NULL;
    srv_tokinfo *toks = NULL;
    int n_toks = 0, think = -1, store = 1;
    srv_result res = {0};
    enum MHD_Result ret;

    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e) || srv_check_model(s, req, &e)) goto fail;
    if (srv_params_parse_s(&p, req, SRV_API_OPENAI, s, &e)) goto fail;
    long long mo = 0;
    int rc = srv_get_int(req, "max_output_tokens", 1, s->info.n_ctx > 0 ? s->info.n_ctx : 1 << 30, &mo, &e);
    if (rc < 0) goto fail;
    if (rc) p.max_tokens = (int)mo;
    if (srv_get_bool(req, "store", &store, &e) < 0 || srv_reasoning_effort(req, &think, &e) || read_tools(req, &tools, &e))
        goto fail;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(req, "text");
    if (text && !cJSON_IsNull(text) && !cJSON_IsObject(text)) { srv_fail(&e, 400, "text", "text: expected an object"); goto fail; }
    if (srv_response_format(s, &p, cJSON_GetObjectItemCaseSensitive(text, "format"), "text.format", &e)) goto fail;
    if (!(msgs = cJSON_CreateArray())) { srv_fail(&e, 500, "", "out of memory"); goto fail; }
    const char *prev = NULL;
    if (srv_get_str(req, "previous_response_id", &prev, &e) < 0) goto fail;
    if (prev) {
        cJSON *old = store_copy(s, prev);
        if (!old) { srv_fail(&e, 404, "previous_response_id", "previous_response_id: response '%.80s' not found", prev); goto fail; }
        cJSON_Delete(msgs);
        msgs = old;
    }
    const char *instr = NULL;
    if (srv_get_str(req, "instructions", &instr, &e) < 0) goto fail;
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(req, "input");
    if (!input) { srv_fail(&e, 400, "input", "input: field required"); goto fail; }
    if (add_items(msgs, input, &e)) goto fail;
    cJSON *turn = msgs;                                /* with this turn's instructions in front */
    cJSON *with_sys = NULL;
    if (instr) {
        with_sys = cJSON_CreateArray();
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", instr);
        cJSON_AddItemToArray(with_sys, m);
        const cJSON *x;
        cJSON_ArrayForEach(x, msgs) cJSON_AddItemToArray(with_sys, cJSON_Duplicate(x, 1));
        turn = with_sys;
    }
    rc = srv_prompt_chat2(s, turn, NULL, tools, NULL, 0, think, &pr, &e);
    cJSON_Delete(with_sys);
    if (rc || srv_output_setup(s, &p, &pr, tools, tools != NULL, &e)) goto fail;
    if (!(c = calloc(1, sizeof *c))) { srv_fail(&e, 500, "", "out of memory"); goto fail; }
    c->s = s;
    c->created = (long long)time(NULL);
    srv_make_id(s, "resp_", c->id, sizeof c->id);
    srv_make_id(s, "msg_", c->msg_id, sizeof c->msg_id);
    srv_make_id(s, "rs_", c->rs_id, sizeof c->rs_id);
    if (store) { c->conv = msgs; msgs = NULL; }
    int stream = p.stream;
    if (srv_job_start(s, &pr, &p, r->fd, &job, &e)) goto fail;
    c->job = job;
    srv_prompt_free(&pr);
    cJSON_Delete(req);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    req = msgs = tools = NULL;
    if (stream) return srv_stream(r, job, &k_resp_stream, c);
    if (srv_collect2(job, &c->text, &c->len, &c->rtext, &c->rlen, &toks, &n_toks, &res, &e)) goto fail;
    tern_jw w;
    tern_jw_init(&w);
    write_response(c, &res, &w);
    remember(c, &res);
    srv_job_free(job);
    free(toks);
    ctx_free(c);
    return srv_reply_jw(r, 200, &w);

fail:
    ret = e.http == 499 ? MHD_NO : srv_reply_openai_error(r, &e);
    srv_job_free(job);
    free(toks);
    ctx_free(c);
    srv_prompt_free(&pr);
    srv_params_free(&p);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(req);
    return ret;
}

enum MHD_Result srv_handle_embeddings(srv_req *r) {
    srv_error e = {0};
    srv_fail(&e, 400, "model", "embeddings are not supported: model '%s' is a text-generation model (no embedding "
             "models are served yet)", r->s->served);
    e.code = "model_not_supported";
    return srv_reply_openai_error(r, &e);
}
