/*
 * prompt.c — request messages -> prompt token ids.
 *
 * Chat: the messages are validated (roles system/developer/user/assistant/tool; content a
 * string, null, or a list of text parts — image/audio parts are a 400 "not supported"),
 * then rendered with the model's chat template (text/chat.h) and tokenized WITHOUT the
 * tokenizer's post-processor specials (templates write their own BOS; see chat.h).
 * FALLBACK (models without a chat template, and the fake engine): a plain transcript
 * "role: content\n" per message followed by "assistant:", tokenized with specials. It is
 * a stop-gap so such models still answer; it is not any model's real format.
 * Anthropic requests are first converted to the OpenAI message shape (text blocks joined,
 * tool_use -> assistant tool_calls, tool_result -> role "tool" messages).
 * Raw completion prompts: a string, [string], [ids] or [[ids]] (one prompt only).
 */
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_prompt_free(srv_prompt *p) {
    if (!p) return;
    free(p->ids);
    free(p->text);
    memset(p, 0, sizeof *p);
}

static int tokenize(tern_server *s, const char *text, size_t len, int add_special, srv_prompt *out, srv_error *e) {
    tern_error err = {0};
    tern_status st = s->vt->tokenize(s->eng, text, len, add_special, &out->ids, &out->n, &err);
    if (st == TERN_EUNSUPPORTED) return srv_fail(e, 400, "", "%s", err.msg);
    if (st) return srv_fail(e, 500, "", "tokenize: %s", err.msg);
    return 0;
}

/* The prompt-injection guard (text/tokenizer.h, docs/TEXT.md): with the real engine's
 * tokenizer, a template prompt is rendered from escaped messages (tern_chat_opts.escape_tok)
 * and encoded with TERN_ENC_ESCAPED, and the fallback transcript without parsing specials,
 * so special-token text typed in a message stays text. The fake engine keeps its byte ids. */
static const tern_tokenizer *guard_tok(tern_server *s) {
    return !s->o.fake_engine && s->vt->tokenizer ? s->vt->tokenizer(s->eng) : NULL;
}

static int tokenize_guarded(tern_server *s, const char *text, size_t len, int templated, srv_prompt *out, srv_error *e) {
    const tern_tokenizer *tok = guard_tok(s);
    if (!tok) return tokenize(s, text, len, !templated, out, e);
    unsigned flags = templated ? TERN_ENC_PARSE_SPECIAL | TERN_ENC_ESCAPED : TERN_ENC_ADD_SPECIAL;
    tern_error err = {0};
    size_t n = 0;
    tern_status st = tern_tokenizer_encode_ex(tok, text, len, flags, &out->ids, &n, &err);
    if (st) return srv_fail(e, 500, "", "tokenize: %s", err.msg);
    if (n > (size_t)0x7fffffff) { free(out->ids); out->ids = NULL; return srv_fail(e, 400, "messages", "prompt too long"); }
    out->n = (int)n;
    return 0;
}

/* Content parts: only text is supported. Returns 0 ok. */
static int check_content(const cJSON *c, const char *where, int anthropic, srv_error *e) {
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) return 0;
    if (!cJSON_IsArray(c))
        return srv_fail(e, 400, "messages", "%s.content: expected a string or a list of content parts", where);
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t))
            return srv_fail(e, 400, "messages", "%s.content[%d]: expected an object with a \"type\"", where, i);
        const char *ty = t->valuestring;
        if (!strcmp(ty, "text")) {
            if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "text")))
                return srv_fail(e, 400, "messages", "%s.content[%d].text: expected a string", where, i);
        } else if (!strcmp(ty, "image_url") || !strcmp(ty, "image") || !strcmp(ty, "input_audio") ||
                   !strcmp(ty, "audio") || !strcmp(ty, "document") || !strcmp(ty, "file")) {
            return srv_fail(e, 400, "messages", "%s.content[%d]: content type \"%s\" is not supported (text only)",
                            where, i, ty);
        } else if (anthropic && (!strcmp(ty, "tool_use") || !strcmp(ty, "tool_result") || !strcmp(ty, "thinking") ||
                                 !strcmp(ty, "redacted_thinking"))) {
            /* converted by from_anthropic */
        } else {
            return srv_fail(e, 400, "messages", "%s.content[%d]: unknown content type \"%.40s\"", where, i, ty);
        }
        i++;
    }
    return 0;
}

static void append(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (!*b && !(*b = malloc(*cap = 1024))) return;
    while (*len + n + 1 > *cap) {
        char *nb = realloc(*b, *cap * 2);
        if (!nb) return;
        *b = nb;
        *cap *= 2;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
}

static void append_content(char **b, size_t *len, size_t *cap, const cJSON *c) {
    if (cJSON_IsString(c)) { append(b, len, cap, c->valuestring, strlen(c->valuestring)); return; }
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(t)) append(b, len, cap, t->valuestring, strlen(t->valuestring));
    }
}

/* FALLBACK transcript for models without a chat template: "role: content\n" ... "assistant:" */
static int render_fallback(const cJSON *msgs, char **out, size_t *out_len) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    const cJSON *m;
    append(&b, &len, &cap, "", 0);
    cJSON_ArrayForEach(m, msgs) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        append(&b, &len, &cap, role, strlen(role));
        append(&b, &len, &cap, ": ", 2);
        append_content(&b, &len, &cap, cJSON_GetObjectItemCaseSensitive(m, "content"));
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (cJSON_IsArray(tc)) {
            char *j = cJSON_PrintUnformatted(tc);
            if (j) { append(&b, &len, &cap, j, strlen(j)); free(j); }
        }
        append(&b, &len, &cap, "\n", 1);
    }
    append(&b, &len, &cap, "assistant:", 10);
    if (!b) return -1;
    *out = b;
    *out_len = len;
    return 0;
}

/* Anthropic messages (+system) -> OpenAI-shaped messages (new array). */
static cJSON *from_anthropic(const cJSON *msgs, const char *system) {
    cJSON *o = cJSON_CreateArray();
    if (!o) return NULL;
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(o, m);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(c)) {
            cJSON *n = cJSON_CreateObject();
            cJSON_AddStringToObject(n, "role", role);
            cJSON_AddStringToObject(n, "content", c->valuestring);
            cJSON_AddItemToArray(o, n);
            continue;
        }
        char *text = NULL;
        size_t len = 0, cap = 0;
        append(&text, &len, &cap, "", 0);
        cJSON *calls = NULL;
        const cJSON *b;
        cJSON_ArrayForEach(b, c) {
            const char *ty = cJSON_GetObjectItemCaseSensitive(b, "type")->valuestring;
            if (!strcmp(ty, "text")) {
                const char *t = cJSON_GetObjectItemCaseSensitive(b, "text")->valuestring;
                append(&text, &len, &cap, t, strlen(t));
            } else if (!strcmp(ty, "tool_use")) {
                if (!calls) calls = cJSON_CreateArray();
                cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(b, "name");
                const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
                cJSON_AddStringToObject(tc, "id", cJSON_IsString(id) ? id->valuestring : "");
                cJSON_AddStringToObject(tc, "type", "function");
                cJSON_AddStringToObject(fn, "name", cJSON_IsString(nm) ? nm->valuestring : "");
                char *args = in ? cJSON_PrintUnformatted(in) : NULL;
                cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
                free(args);
                cJSON_AddItemToObject(tc, "function", fn);
                cJSON_AddItemToArray(calls, tc);
            } else if (!strcmp(ty, "tool_result")) {
                cJSON *n = cJSON_CreateObject();
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
                const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
                char *rt = NULL;
                size_t rl = 0, rcap = 0;
                append(&rt, &rl, &rcap, "", 0);
                if (rc && (cJSON_IsString(rc) || cJSON_IsArray(rc))) append_content(&rt, &rl, &rcap, rc);
                cJSON_AddStringToObject(n, "role", "tool");
                cJSON_AddStringToObject(n, "tool_call_id", cJSON_IsString(id) ? id->valuestring : "");
                cJSON_AddStringToObject(n, "content", rt ? rt : "");
                free(rt);
                cJSON_AddItemToArray(o, n);
            }
        }
        if (len || calls) {
            cJSON *n = cJSON_CreateObject();
            cJSON_AddStringToObject(n, "role", role);
            cJSON_AddStringToObject(n, "content", text ? text : "");
            if (calls) cJSON_AddItemToObject(n, "tool_calls", calls);
            cJSON_AddItemToArray(o, n);
        }
        free(text);
    }
    return o;
}

static int validate_messages(const cJSON *msgs, int anthropic, srv_error *e) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return srv_fail(e, 400, "messages", "messages: expected a non-empty list of messages");
    const cJSON *m;
    int i = 0;
    char where[48];
    cJSON_ArrayForEach(m, msgs) {
        snprintf(where, sizeof where, "messages[%d]", i);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(r))
            return srv_fail(e, 400, "messages", "%s: expected an object with a string \"role\"", where);
        const char *role = r->valuestring;
        int ok = anthropic ? (!strcmp(role, "user") || !strcmp(role, "assistant"))
                           : (!strcmp(role, "system") || !strcmp(role, "developer") || !strcmp(role, "user") ||
                              !strcmp(role, "assistant") || !strcmp(role, "tool") || !strcmp(role, "function"));
        if (!ok) return srv_fail(e, 400, "messages", "%s.role: unsupported role \"%.32s\"", where, role);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (anthropic && !cJSON_IsString(c) && !cJSON_IsArray(c))
            return srv_fail(e, 400, "messages", "%s.content: expected a string or a list of content blocks", where);
        if (!anthropic && (!c || cJSON_IsNull(c)) && strcmp(role, "assistant"))
            return srv_fail(e, 400, "messages", "%s.content: field required", where);
        if (check_content(c, where, anthropic, e)) return -1;
        i++;
    }
    return 0;
}

int srv_prompt_chat(tern_server *s, const cJSON *messages, const char *system, const cJSON *tools,
                    const cJSON *template_kwargs, int anthropic, srv_prompt *out, srv_error *e) {
    return srv_prompt_chat2(s, messages, system, tools, template_kwargs, anthropic, -1, out, e);
}

int srv_prompt_chat2(tern_server *s, const cJSON *messages, const char *system, const cJSON *tools,
                     const cJSON *template_kwargs, int anthropic, int enable_thinking, srv_prompt *out,
                     srv_error *e) {
    memset(out, 0, sizeof *out);
    if (template_kwargs && !cJSON_IsNull(template_kwargs) && !cJSON_IsObject(template_kwargs))
        return srv_fail(e, 400, "chat_template_kwargs", "chat_template_kwargs: expected an object");
    if (!cJSON_IsObject(template_kwargs)) template_kwargs = NULL;
    if (validate_messages(messages, anthropic, e)) return -1;
    cJSON *conv = NULL;
    const cJSON *msgs = messages;
    if (anthropic) {
        if (!(conv = from_anthropic(messages, system))) return srv_fail(e, 500, "", "out of memory");
        msgs = conv;
    }
    char *text = NULL;
    size_t len = 0;
    int add_special = 1, rc = 0;
    if (s->tmpl) {
        tern_chat_opts co = {.messages = msgs, .tools = tools, .add_generation_prompt = true, .enable_thinking = enable_thinking,
                             .extra = template_kwargs, .flatten_text_parts = true, .escape_tok = guard_tok(s)};
        tern_error err = {0};
        tern_status st = tern_chat_render(s->tmpl, &co, &text, &len, NULL, &err);
        if (st) {
            cJSON_Delete(conv);
            return srv_fail(e, st == TERN_EINVAL ? 400 : 500, "messages", "chat template: %s", err.msg);
        }
        add_special = 0;
    } else if (render_fallback(msgs, &text, &len)) {
        cJSON_Delete(conv);
        return srv_fail(e, 500, "", "out of memory");
    }
    cJSON_Delete(conv);
    rc = tokenize_guarded(s, text, len, !add_special, out, e);
    out->text = text;
    if (rc) srv_prompt_free(out);
    return rc;
}

int srv_prompt_raw(tern_server *s, const cJSON *prompt, srv_prompt *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    const cJSON *p = prompt;
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;                                   /* [string] or [[ids]] */
    if (cJSON_IsString(p)) {
        if (tokenize(s, p->valuestring, strlen(p->valuestring), 1, out, e)) return -1;
        out->text = strdup(p->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return srv_fail(e, 400, "prompt", "prompt: expected a string, a list of token ids, or a list with one of them");
    int n = cJSON_GetArraySize(p);
    if (!(out->ids = malloc(sizeof(int32_t) * (size_t)n))) return srv_fail(e, 500, "", "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, p) {
        double d = cJSON_IsNumber(x) ? x->valuedouble : -1;
        if (!srv_is_token_id(d, s->info.n_vocab)) {
            srv_prompt_free(out);
            return srv_fail(e, 400, "prompt", "prompt[%d]: expected a token id in [0, %d)", out->n ? out->n : 0,
                            s->info.n_vocab);
        }
        out->ids[out->n++] = (int32_t)d;
    }
    return 0;
}
