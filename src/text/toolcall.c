/*
 * toolcall.c — streaming content / reasoning / tool-call splitter and the per-format tool
 * call body parsers (formats and rules in toolcall.h).
 *
 * State machine over a pending-text buffer: CONTENT looks for the reasoning-open and
 * tool-open markers, REASONING for the reasoning-close marker, TOOL for the tool-close
 * marker. Text that cannot contain (the start of) a marker is emitted at once; the longest
 * suffix that is a proper prefix of a marker is held back until more text arrives.
 */
#include "text/toolcall.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct sbuf { char *p; size_t n, cap; } sbuf;
static bool sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return false;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

enum { S_CONTENT, S_REASON, S_TOOL };

struct tern_out_parser {
    tern_tools_format tf;
    tern_reason_format rf;
    int state;
    bool skip_nl; /* after "<|channel>thought": drop one "\n" */
    sbuf pend, content, reason, tool;
    tern_tool_call *calls;
    size_t ncalls, capcalls;
    cJSON *tools;
    const char *r_open, *r_close, *t_open, *t_close;
};

void tern_output_formats_detect(const char *src, tern_tools_format *tools, tern_reason_format *reason) {
    tern_tools_format t = TERN_TOOLS_NONE;
    tern_reason_format r = TERN_REASON_NONE;
    if (src) {
        if (strstr(src, "<|tool_call>")) t = TERN_TOOLS_GEMMA4;
        else if (strstr(src, "<arg_key>")) t = TERN_TOOLS_GLM;
        else if (strstr(src, "<tool_call>")) t = TERN_TOOLS_JSON;
        if (strstr(src, "<|channel>")) r = TERN_REASON_GEMMA4;
        else if (strstr(src, "<think>") || strstr(src, "</think>")) r = TERN_REASON_THINK;
    }
    if (tools) *tools = t;
    if (reason) *reason = r;
}

tern_status tern_out_parser_new(tern_tools_format tf, tern_reason_format rf, bool start_in_reasoning,
                                tern_out_parser **out, tern_error *err) {
    *out = NULL;
    if ((unsigned)tf > TERN_TOOLS_GEMMA4 || (unsigned)rf > TERN_REASON_GEMMA4)
        return tern_err(err, TERN_EINVAL, "output parser: unknown format %d/%d", (int)tf, (int)rf);
    tern_out_parser *p = calloc(1, sizeof *p);
    if (!p) return tern_err(err, TERN_ENOMEM, "output parser: out of memory");
    p->tf = tf;
    p->rf = rf;
    if (rf == TERN_REASON_THINK) { p->r_open = "<think>"; p->r_close = "</think>"; }
    if (rf == TERN_REASON_GEMMA4) { p->r_open = "<|channel>thought"; p->r_close = "<channel|>"; }
    if (tf == TERN_TOOLS_JSON || tf == TERN_TOOLS_GLM) { p->t_open = "<tool_call>"; p->t_close = "</tool_call>"; }
    if (tf == TERN_TOOLS_GEMMA4) { p->t_open = "<|tool_call>"; p->t_close = "<tool_call|>"; }
    p->state = start_in_reasoning && p->r_open ? S_REASON : S_CONTENT;
    p->skip_nl = p->state == S_REASON && rf == TERN_REASON_GEMMA4;
    *out = p;
    return TERN_OK;
}

void tern_out_parser_free(tern_out_parser *p) {
    if (!p) return;
    for (size_t i = 0; i < p->ncalls; i++) { free(p->calls[i].name); free(p->calls[i].arguments); }
    free(p->calls);
    free(p->pend.p); free(p->content.p); free(p->reason.p); free(p->tool.p);
    cJSON_Delete(p->tools);
    free(p);
}

void tern_out_parser_set_tools(tern_out_parser *p, const cJSON *tools) {
    if (!p) return;
    cJSON_Delete(p->tools);
    p->tools = tools && cJSON_IsArray(tools) ? cJSON_Duplicate(tools, 1) : NULL;
}

size_t tern_out_parser_n_calls(const tern_out_parser *p) { return p ? p->ncalls : 0; }
const tern_tool_call *tern_out_parser_call(const tern_out_parser *p, size_t i) {
    return p && i < p->ncalls ? &p->calls[i] : NULL;
}
bool tern_out_parser_in_reasoning(const tern_out_parser *p) { return p && p->state == S_REASON; }

/* ---------------- body parsers ---------------- */

static bool param_is_string(const cJSON *tools, const char *fname, const char *key) {
    if (!tools) return false;
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!fn) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, fname)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"), "properties");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        return cJSON_IsString(ty) && !strcmp(ty->valuestring, "string");
    }
    return false;
}

/* A bare value: JSON scalar/object/array if it parses as one, else a string. */
static cJSON *bare_value(const char *s, size_t n, bool force_string) {
    char *t = malloc(n + 1);
    if (!t) return NULL;
    memcpy(t, s, n);
    t[n] = 0;
    cJSON *v = NULL;
    if (!force_string) {
        const char *end = NULL;
        v = cJSON_ParseWithOpts(t, &end, 0);
        if (v && (cJSON_IsString(v) || (end && *end))) { cJSON_Delete(v); v = NULL; }
    }
    if (!v) v = cJSON_CreateString(t);
    free(t);
    return v;
}

static void trim(const char **s, size_t *n) {
    while (*n && isspace((unsigned char)**s)) { (*s)++; (*n)--; }
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

static const char *find(const char *s, size_t n, const char *needle) {
    return memmem(s, n, needle, strlen(needle));
}

/* Gemma 4 value syntax */
#define GQ "<|\"|>"
typedef struct gp { const char *s; size_t i, n; int depth; const cJSON *tools; const char *fname; } gp;
static cJSON *g_value(gp *g, bool force_string);
static void g_ws(gp *g) { while (g->i < g->n && isspace((unsigned char)g->s[g->i])) g->i++; }
static bool g_lit(gp *g, const char *lit) {
    size_t k = strlen(lit);
    if (g->i + k <= g->n && !memcmp(g->s + g->i, lit, k)) { g->i += k; return true; }
    return false;
}
static cJSON *g_string(gp *g) { /* after opening quote token */
    const char *e = find(g->s + g->i, g->n - g->i, GQ);
    if (!e) return NULL;
    size_t len = (size_t)(e - (g->s + g->i));
    char *t = malloc(len + 1);
    if (!t) return NULL;
    memcpy(t, g->s + g->i, len);
    t[len] = 0;
    cJSON *v = cJSON_CreateString(t);
    free(t);
    g->i += len + strlen(GQ);
    return v;
}
static cJSON *g_object(gp *g, bool top) { /* after '{'; top: the arguments object (schema-aware) */
    cJSON *o = cJSON_CreateObject();
    g_ws(g);
    if (g_lit(g, "}")) return o;
    for (;;) {
        g_ws(g);
        char *key = NULL;
        if (g_lit(g, GQ)) {
            cJSON *k = g_string(g);
            if (!k) goto bad;
            key = strdup(k->valuestring);
            cJSON_Delete(k);
        } else {
            size_t st = g->i;
            while (g->i < g->n && g->s[g->i] != ':' && g->s[g->i] != '}' && g->s[g->i] != ',') g->i++;
            const char *ks = g->s + st;
            size_t kn = g->i - st;
            trim(&ks, &kn);
            if (!kn) goto bad;
            key = strndup(ks, kn);
        }
        g_ws(g);
        if (!key || !g_lit(g, ":")) { free(key); goto bad; }
        cJSON *v = g_value(g, top && param_is_string(g->tools, g->fname, key));
        if (!v) { free(key); goto bad; }
        cJSON_AddItemToObject(o, key, v);
        free(key);
        g_ws(g);
        if (g_lit(g, ",")) continue;
        if (g_lit(g, "}")) return o;
        goto bad;
    }
bad:
    cJSON_Delete(o);
    return NULL;
}
static cJSON *g_value(gp *g, bool force_string) {
    if (++g->depth > 64) return NULL;
    g_ws(g);
    cJSON *v = NULL;
    if (g_lit(g, GQ)) v = g_string(g);
    else if (g_lit(g, "{")) v = g_object(g, false);
    else if (g_lit(g, "[")) {
        v = cJSON_CreateArray();
        g_ws(g);
        if (!g_lit(g, "]"))
            for (;;) {
                cJSON *x = g_value(g, false);
                if (!x) { cJSON_Delete(v); v = NULL; break; }
                cJSON_AddItemToArray(v, x);
                g_ws(g);
                if (g_lit(g, ",")) continue;
                if (g_lit(g, "]")) break;
                cJSON_Delete(v); v = NULL; break;
            }
    } else {
        size_t st = g->i;
        while (g->i < g->n && g->s[g->i] != ',' && g->s[g->i] != '}' && g->s[g->i] != ']') g->i++;
        const char *s = g->s + st;
        size_t n = g->i - st;
        trim(&s, &n);
        v = bare_value(s, n, force_string);
    }
    g->depth--;
    return v;
}

static tern_status parse_gemma4(const char *b, size_t n, const cJSON *tools, char **name, cJSON **args, tern_error *err) {
    trim(&b, &n);
    if (n < 5 || memcmp(b, "call:", 5)) return tern_err(err, TERN_EFORMAT, "gemma4 tool call: missing 'call:'");
    const char *br = memchr(b, '{', n);
    if (!br) return tern_err(err, TERN_EFORMAT, "gemma4 tool call: missing '{'");
    const char *ns = b + 5;
    size_t nn = (size_t)(br - ns);
    trim(&ns, &nn);
    if (!nn) return tern_err(err, TERN_EFORMAT, "gemma4 tool call: empty name");
    *name = strndup(ns, nn);
    gp g = {br + 1, 0, n - (size_t)(br + 1 - b), 0, tools, *name};
    cJSON *o = g_object(&g, true);
    g_ws(&g);
    if (!o || g.i != g.n) {
        cJSON_Delete(o);
        free(*name);
        *name = NULL;
        return tern_err(err, TERN_EFORMAT, "gemma4 tool call: malformed arguments");
    }
    *args = o;
    return TERN_OK;
}

static tern_status parse_glm(const char *b, size_t n, const cJSON *tools, char **name, cJSON **args, tern_error *err) {
    const char *k = find(b, n, "<arg_key>");
    const char *ns = b;
    size_t nn = k ? (size_t)(k - b) : n;
    trim(&ns, &nn);
    if (!nn) return tern_err(err, TERN_EFORMAT, "glm tool call: empty name");
    *name = strndup(ns, nn);
    cJSON *o = cJSON_CreateObject();
    const char *e = b + n;
    while (k) {
        const char *ks = k + 9, *ke = find(ks, (size_t)(e - ks), "</arg_key>");
        if (!ke) goto bad;
        const char *vs = find(ke, (size_t)(e - ke), "<arg_value>");
        if (!vs) goto bad;
        vs += 11;
        const char *ve = find(vs, (size_t)(e - vs), "</arg_value>");
        if (!ve) goto bad;
        const char *kk = ks;
        size_t kn = (size_t)(ke - ks);
        trim(&kk, &kn);
        char *key = strndup(kk, kn);
        cJSON *v = bare_value(vs, (size_t)(ve - vs), param_is_string(tools, *name, key));
        cJSON_AddItemToObject(o, key, v);
        free(key);
        const char *rest = ve + 12;
        k = find(rest, (size_t)(e - rest), "<arg_key>");
        if (!k) {
            const char *t = rest;
            size_t tn = (size_t)(e - rest);
            trim(&t, &tn);
            if (tn) goto bad;
        }
    }
    *args = o;
    return TERN_OK;
bad:
    cJSON_Delete(o);
    free(*name);
    *name = NULL;
    return tern_err(err, TERN_EFORMAT, "glm tool call: malformed <arg_key>/<arg_value> pairs");
}

static tern_status parse_json(const char *b, size_t n, char **name, cJSON **args, tern_error *err) {
    cJSON *j = cJSON_ParseWithLength(b, n);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    if (!cJSON_IsObject(j) || !cJSON_IsString(nm)) {
        cJSON_Delete(j);
        return tern_err(err, TERN_EFORMAT, "json tool call: expected {\"name\": ..., \"arguments\": {...}}");
    }
    *name = strdup(nm->valuestring);
    if (cJSON_IsString(a)) *args = cJSON_Parse(a->valuestring);
    else if (cJSON_IsObject(a)) *args = cJSON_Duplicate(a, 1);
    else *args = cJSON_CreateObject();
    cJSON_Delete(j);
    if (!*args || !cJSON_IsObject(*args)) {
        cJSON_Delete(*args);
        *args = NULL;
        free(*name);
        *name = NULL;
        return tern_err(err, TERN_EFORMAT, "json tool call: arguments is not a JSON object");
    }
    return TERN_OK;
}

tern_status tern_toolcall_parse_body(tern_tools_format f, const char *body, size_t n, const cJSON *tools,
                                     char **name, char **args_json, tern_error *err) {
    *name = NULL;
    *args_json = NULL;
    cJSON *args = NULL;
    tern_status st;
    switch (f) {
    case TERN_TOOLS_JSON: st = parse_json(body, n, name, &args, err); break;
    case TERN_TOOLS_GLM: st = parse_glm(body, n, tools, name, &args, err); break;
    case TERN_TOOLS_GEMMA4: st = parse_gemma4(body, n, tools, name, &args, err); break;
    default: return tern_err(err, TERN_EINVAL, "tool call: no tool format");
    }
    if (st) return st;
    *args_json = cJSON_PrintUnformatted(args);
    cJSON_Delete(args);
    if (!*name || !*args_json) {
        free(*name); free(*args_json);
        *name = *args_json = NULL;
        return tern_err(err, TERN_ENOMEM, "tool call: out of memory");
    }
    return TERN_OK;
}

/* ---------------- streaming ---------------- */

/* Length of the longest suffix of s[0..n) that is a proper prefix of marker m. */
static size_t partial(const char *s, size_t n, const char *m) {
    if (!m) return 0;
    size_t ml = strlen(m);
    for (size_t k = TERN_MIN(n, ml - 1); k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static bool emit_content(tern_out_parser *p, const char *s, size_t n) {
    if (!n) return true;
    if (p->ncalls) { /* after a tool call, drop whitespace-only content */
        size_t i = 0;
        while (i < n && isspace((unsigned char)s[i])) i++;
        if (i == n) return true;
    }
    return sb_put(&p->content, s, n);
}

static bool emit_reason(tern_out_parser *p, const char *s, size_t n) {
    if (p->skip_nl && n) {
        if (s[0] == '\n') { s++; n--; }
        p->skip_nl = false;
    }
    return sb_put(&p->reason, s, n);
}

static tern_status finish_tool(tern_out_parser *p, tern_error *err) {
    char *name = NULL, *args = NULL;
    tern_error e2;
    if (tern_toolcall_parse_body(p->tf, p->tool.p ? p->tool.p : "", p->tool.n, p->tools, &name, &args, &e2)) {
        /* fall back: give the raw markup back as content */
        bool ok = sb_put(&p->content, p->t_open, strlen(p->t_open)) && sb_put(&p->content, p->tool.p, p->tool.n) &&
                  sb_put(&p->content, p->t_close, strlen(p->t_close));
        p->tool.n = 0;
        return ok ? TERN_OK : tern_err(err, TERN_ENOMEM, "output parser: out of memory");
    }
    p->tool.n = 0;
    if (p->ncalls == p->capcalls) {
        size_t nc = p->capcalls ? p->capcalls * 2 : 4;
        tern_tool_call *c = realloc(p->calls, nc * sizeof *c);
        if (!c) { free(name); free(args); return tern_err(err, TERN_ENOMEM, "output parser: out of memory"); }
        p->calls = c;
        p->capcalls = nc;
    }
    p->calls[p->ncalls].name = name;
    p->calls[p->ncalls].arguments = args;
    p->ncalls++;
    return TERN_OK;
}

static tern_status run(tern_out_parser *p, bool final, tern_error *err) {
    for (;;) {
        const char *s = p->pend.p ? p->pend.p : "";
        size_t n = p->pend.n, used = 0;
        bool progress = false;
        if (p->state == S_CONTENT) {
            const char *ro = p->r_open ? find(s, n, p->r_open) : NULL;
            const char *to = p->t_open ? find(s, n, p->t_open) : NULL;
            const char *m = ro && (!to || ro < to) ? ro : to;
            if (m) {
                if (!emit_content(p, s, (size_t)(m - s))) goto oom;
                if (m == ro) { used = (size_t)(m - s) + strlen(p->r_open); p->state = S_REASON; p->skip_nl = p->rf == TERN_REASON_GEMMA4; }
                else { used = (size_t)(m - s) + strlen(p->t_open); p->state = S_TOOL; p->tool.n = 0; }
                progress = true;
            } else {
                size_t hold = final ? 0 : TERN_MAX(partial(s, n, p->r_open), partial(s, n, p->t_open));
                if (!emit_content(p, s, n - hold)) goto oom;
                used = n - hold;
            }
        } else if (p->state == S_REASON) {
            const char *m = find(s, n, p->r_close);
            if (m) {
                if (!emit_reason(p, s, (size_t)(m - s))) goto oom;
                used = (size_t)(m - s) + strlen(p->r_close);
                p->state = S_CONTENT;
                progress = true;
            } else {
                size_t hold = final ? 0 : partial(s, n, p->r_close);
                if (p->skip_nl && n - hold == 0) hold = n;
                if (!emit_reason(p, s, n - hold)) goto oom;
                used = n - hold;
            }
        } else {
            const char *m = find(s, n, p->t_close);
            if (m) {
                if (!sb_put(&p->tool, s, (size_t)(m - s))) goto oom;
                used = (size_t)(m - s) + strlen(p->t_close);
                p->state = S_CONTENT;
                tern_status st = finish_tool(p, err);
                if (st) return st;
                progress = true;
            } else {
                size_t hold = final ? 0 : partial(s, n, p->t_close);
                if (!sb_put(&p->tool, s, n - hold)) goto oom;
                used = n - hold;
                if (final) { /* unterminated: the markup becomes content */
                    if (!sb_put(&p->content, p->t_open, strlen(p->t_open)) || !sb_put(&p->content, p->tool.p, p->tool.n)) goto oom;
                    p->tool.n = 0;
                    p->state = S_CONTENT;
                }
            }
        }
        if (used) memmove(p->pend.p, p->pend.p + used, n - used); /* used > 0: pend holds text (p non-NULL) */
        p->pend.n = n - used;
        if (p->pend.p) p->pend.p[p->pend.n] = 0;
        if (!progress) return TERN_OK;
    }
oom:
    return tern_err(err, TERN_ENOMEM, "output parser: out of memory");
}

static void fill(tern_out_parser *p, tern_out_delta *d, size_t before) {
    if (!d) return;
    d->content = p->content.p ? p->content.p : "";
    d->content_len = p->content.n;
    d->reasoning = p->reason.p ? p->reason.p : "";
    d->reasoning_len = p->reason.n;
    d->calls_before = before;
    d->calls_after = p->ncalls;
}

tern_status tern_out_parser_feed(tern_out_parser *p, const char *text, size_t n, tern_out_delta *d, tern_error *err) {
    if (!p) return tern_err(err, TERN_EINVAL, "output parser: NULL");
    size_t before = p->ncalls;
    p->content.n = 0;
    p->reason.n = 0;
    if (n && !sb_put(&p->pend, text, n)) return tern_err(err, TERN_ENOMEM, "output parser: out of memory");
    tern_status st = run(p, false, err);
    fill(p, d, before);
    return st;
}

tern_status tern_out_parser_finish(tern_out_parser *p, tern_out_delta *d, tern_error *err) {
    if (!p) return tern_err(err, TERN_EINVAL, "output parser: NULL");
    size_t before = p->ncalls;
    p->content.n = 0;
    p->reason.n = 0;
    tern_status st = run(p, true, err);
    fill(p, d, before);
    return st;
}
