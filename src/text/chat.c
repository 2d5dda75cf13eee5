/*
 * chat.c — chat template loading and rendering on top of the Jinja interpreter (chat.h).
 * The render context is a cJSON object built per call: normalized copies of messages and
 * tools, the flags and special tokens, then the caller's extra kwargs.
 */
#include "text/chat.h"

#include "base/file.h"
#include "text/jinja.h"

#include <stdlib.h>
#include <string.h>

struct tern_chat_template {
    tern_jinja_template *tpl;
    char *src;
    char *bos, *eos, *unk, *pad;
};

static char *dupn(const char *s) {
    if (!s) return NULL;
    return strdup(s);
}

tern_status tern_chat_template_from_string(const char *src, size_t len, const char *bos, const char *eos,
                                           tern_chat_template **out, tern_error *err) {
    *out = NULL;
    tern_chat_template *t = calloc(1, sizeof *t);
    if (!t) return tern_err(err, TERN_ENOMEM, "chat template: out of memory");
    t->src = malloc(len + 1);
    if (!t->src) { free(t); return tern_err(err, TERN_ENOMEM, "chat template: out of memory"); }
    memcpy(t->src, src, len);
    t->src[len] = 0;
    t->bos = dupn(bos);
    t->eos = dupn(eos);
    tern_status st = tern_jinja_parse(t->src, len, "chat_template", &t->tpl, err);
    if (st) { tern_chat_template_free(t); return st; }
    *out = t;
    return TERN_OK;
}

void tern_chat_template_free(tern_chat_template *t) {
    if (!t) return;
    tern_jinja_free(t->tpl);
    free(t->src);
    free(t->bos); free(t->eos); free(t->unk); free(t->pad);
    free(t);
}

const char *tern_chat_template_source(const tern_chat_template *t) { return t && t->src ? t->src : ""; }
const char *tern_chat_template_bos(const tern_chat_template *t) { return t && t->bos ? t->bos : ""; }
const char *tern_chat_template_eos(const tern_chat_template *t) { return t && t->eos ? t->eos : ""; }

/* "x" or {"content": "x"} */
static const char *token_text(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

tern_status tern_chat_template_load(const char *dir, tern_chat_template **out, tern_error *err) {
    *out = NULL;
    char path[4096];
    char *cfg_text = NULL, *tpl_text = NULL;
    size_t cfg_len = 0, tpl_len = 0;
    cJSON *cfg = NULL;
    tern_status st;
    if ((st = tern_path_join(path, sizeof path, dir, "tokenizer_config.json", err))) return st;
    if (tern_is_file(path)) {
        if ((st = tern_file_read(path, (size_t)64 << 20, &cfg_text, &cfg_len, err))) return st;
        cfg = cJSON_ParseWithLength(cfg_text, cfg_len);
        free(cfg_text);
        if (!cfg || !cJSON_IsObject(cfg)) {
            cJSON_Delete(cfg);
            return tern_err(err, TERN_EFORMAT, "%s: not a JSON object", path);
        }
    }
    if ((st = tern_path_join(path, sizeof path, dir, "chat_template.jinja", err))) goto done;
    const char *src = NULL;
    if (tern_is_file(path)) {
        if ((st = tern_file_read(path, (size_t)16 << 20, &tpl_text, &tpl_len, err))) goto done;
        src = tpl_text;
    } else if (cfg) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(ct)) src = ct->valuestring;
        else if (cJSON_IsArray(ct)) {
            const cJSON *first = NULL;
            for (const cJSON *e = ct->child; e; e = e->next) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (!cJSON_IsString(tx)) continue;
                if (!first) first = tx;
                if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default")) { first = tx; break; }
            }
            if (first) src = first->valuestring;
        } else if (ct) {
            st = tern_err(err, TERN_EFORMAT, "%s/tokenizer_config.json: chat_template: expected a string or a list", dir);
            goto done;
        }
        if (src) tpl_len = strlen(src);
    }
    if (!src) {
        st = tern_err(err, TERN_ENOTFOUND, "%s: no chat template (chat_template.jinja or tokenizer_config.json chat_template)", dir);
        goto done;
    }
    st = tern_chat_template_from_string(src, tpl_len, cfg ? token_text(cfg, "bos_token") : NULL,
                                        cfg ? token_text(cfg, "eos_token") : NULL, out, err);
    if (!st && cfg) {
        (*out)->unk = dupn(token_text(cfg, "unk_token"));
        (*out)->pad = dupn(token_text(cfg, "pad_token"));
    }
done:
    free(tpl_text);
    cJSON_Delete(cfg);
    return st;
}

/* Normalize one message in place (it is our own copy). */
static void normalize_message(cJSON *m, const tern_chat_opts *o) {
    if (!cJSON_IsObject(m)) return;
    cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!o->keep_string_args && cJSON_IsArray(tcs)) {
        for (cJSON *tc = tcs->child; tc; tc = tc->next) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (!cJSON_IsString(args)) continue;
            cJSON *parsed = cJSON_Parse(args->valuestring);
            if (parsed && cJSON_IsObject(parsed)) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
            else cJSON_Delete(parsed);
        }
    }
    cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (o->flatten_text_parts && cJSON_IsArray(content) && content->child) {
        size_t total = 0;
        for (cJSON *p = content->child; p; p = p->next) {
            cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type"), *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) return;
            total += strlen(tx->valuestring);
        }
        char *s = malloc(total + 1);
        if (!s) return;
        size_t n = 0;
        for (cJSON *p = content->child; p; p = p->next) {
            const char *tx = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
            size_t k = strlen(tx);
            memcpy(s + n, tx, k);
            n += k;
        }
        s[n] = 0;
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(s));
        free(s);
    }
}

/* Replace a malloc'd string by its escaped form (NULL-safe; keys flagged const are left). */
static tern_status escape_str(char **s, const tern_tokenizer *tok, tern_error *err) {
    if (!*s) return TERN_OK;
    char *e = NULL;
    size_t n = strlen(*s);
    tern_status st = tern_tokenizer_escape(tok, *s, n, &e, NULL, err);
    if (st) return st;
    free(*s);
    *s = e;
    return TERN_OK;
}

tern_status tern_chat_escape_json(cJSON *j, const tern_tokenizer *tok, tern_error *err) {
    if (!tok) return TERN_OK;
    tern_status st = TERN_OK;
    for (; j && !st; j = j->next) { /* siblings iteratively, children recursively */
        if (j->string && !(j->type & cJSON_StringIsConst)) st = escape_str(&j->string, tok, err);
        if (!st && cJSON_IsString(j) && !(j->type & cJSON_IsReference)) st = escape_str(&j->valuestring, tok, err);
        if (!st && (cJSON_IsArray(j) || cJSON_IsObject(j)) && j->child) st = tern_chat_escape_json(j->child, tok, err);
    }
    return st;
}

static void add_str(cJSON *ctx, const char *k, const char *v) {
    if (v) cJSON_AddItemToObject(ctx, k, cJSON_CreateString(v));
}

tern_status tern_chat_render(const tern_chat_template *t, const tern_chat_opts *o, char **out, size_t *out_len,
                             bool *starts_with_bos, tern_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (starts_with_bos) *starts_with_bos = false;
    if (!t || !o) return tern_err(err, TERN_EINVAL, "chat render: NULL argument");
    if (!cJSON_IsArray(o->messages)) return tern_err(err, TERN_EINVAL, "chat render: messages must be an array");
    if (o->tools && !cJSON_IsArray(o->tools) && !cJSON_IsNull(o->tools))
        return tern_err(err, TERN_EINVAL, "chat render: tools must be an array");
    if (o->extra && !cJSON_IsObject(o->extra)) return tern_err(err, TERN_EINVAL, "chat render: extra kwargs must be an object");
    cJSON *ctx = cJSON_CreateObject();
    cJSON *msgs = cJSON_Duplicate(o->messages, 1);
    if (!ctx || !msgs) { cJSON_Delete(ctx); cJSON_Delete(msgs); return tern_err(err, TERN_ENOMEM, "chat render: out of memory"); }
    for (cJSON *m = msgs->child; m; m = m->next) normalize_message(m, o);
    cJSON_AddItemToObject(ctx, "messages", msgs);
    cJSON *tools = o->tools && cJSON_IsArray(o->tools) ? cJSON_Duplicate(o->tools, 1) : NULL;
    if (tools) cJSON_AddItemToObject(ctx, "tools", tools);
    if (o->escape_tok) { /* after normalization: parsed arguments and joined parts are escaped too */
        tern_status est = tern_chat_escape_json(msgs->child, o->escape_tok, err);
        if (!est) est = tern_chat_escape_json(tools ? tools->child : NULL, o->escape_tok, err);
        if (est) { cJSON_Delete(ctx); return est; }
    }
    cJSON_AddItemToObject(ctx, "add_generation_prompt", cJSON_CreateBool(o->add_generation_prompt));
    add_str(ctx, "bos_token", t->bos);
    add_str(ctx, "eos_token", t->eos);
    add_str(ctx, "unk_token", t->unk);
    add_str(ctx, "pad_token", t->pad);
    if (o->enable_thinking >= 0) cJSON_AddItemToObject(ctx, "enable_thinking", cJSON_CreateBool(o->enable_thinking));
    if (o->extra)
        for (const cJSON *c = o->extra->child; c; c = c->next) {
            if (!c->string || !strcmp(c->string, "messages") || !strcmp(c->string, "tools")) continue;
            cJSON_DeleteItemFromObjectCaseSensitive(ctx, c->string);
            cJSON_AddItemToObject(ctx, c->string, cJSON_Duplicate(c, 1));
        }
    size_t n = 0;
    tern_status st = tern_jinja_render(t->tpl, ctx, NULL, out, &n, err);
    cJSON_Delete(ctx);
    if (st) return st;
    if (out_len) *out_len = n;
    if (starts_with_bos && t->bos && t->bos[0]) *starts_with_bos = !strncmp(*out, t->bos, strlen(t->bos));
    return TERN_OK;
}
