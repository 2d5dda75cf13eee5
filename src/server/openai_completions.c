/*
 * openai_completions.c — POST /v1/completions (OpenAI legacy text completions).
 *
 * prompt: a string (tokenized with the tokenizer's specials, no chat template), [string],
 * a list of token ids or [[ids]] — one prompt only; echo, suffix and best_of > 1 are 400.
 * logprobs is an integer (alternatives per token) in this API; the response uses the
 * legacy shape {tokens, token_logprobs, top_logprobs[{token: logprob}], text_offset}.
 * Response: text_completion {id, object, created, model, choices[{text, index, logprobs,
 * finish_reason}], usage}; streaming: text_completion chunks, the last one carrying
 * finish_reason (and usage when stream_options.include_usage), then [DONE].
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cmpl_ctx {
    tern_server *s;
    char id[64];
    long long created;
    int include_usage, logprobs, top;
    size_t offset;             /* text_offset of the next token */
} cmpl_ctx;

static void legacy_logprobs(cmpl_ctx *c, tern_jw *w, const srv_tokinfo *t, int n) {
    tern_jw_key(w, "logprobs");
    if (!c->logprobs) { tern_jw_null(w); return; }
    char **txt = calloc((size_t)(n ? n : 1), sizeof(char *));
    for (int i = 0; i < n && txt; i++) txt[i] = srv_token_text(c->s, t[i].id);
    tern_jw_obj(w);
    tern_jw_key(w, "tokens");
    tern_jw_arr(w);
    for (int i = 0; i < n; i++) tern_jw_str(w, txt && txt[i] ? txt[i] : "");
    tern_jw_end(w);
    tern_jw_key(w, "token_logprobs");
    tern_jw_arr(w);
    for (int i = 0; i < n; i++) tern_jw_double(w, t[i].logprob);
    tern_jw_end(w);
    tern_jw_key(w, "top_logprobs");
    tern_jw_arr(w);
    for (int i = 0; i < n; i++) {
        tern_jw_obj(w);
        for (int k = 0; k < t[i].n_top && k < c->top; k++) {
            char *tt = srv_token_text(c->s, t[i].top_ids[k]);
            tern_jw_kdouble(w, tt ? tt : "", t[i].top_lps[k]);
            free(tt);
        }
        tern_jw_end(w);
    }
    tern_jw_end(w);
    tern_jw_key(w, "text_offset");
    tern_jw_arr(w);
    for (int i = 0; i < n; i++) {
        tern_jw_int(w, (long long)c->offset);
        c->offset += txt && txt[i] ? strlen(txt[i]) : 0;
    }
    tern_jw_end(w);
    tern_jw_end(w);
    for (int i = 0; i < n && txt; i++) free(txt[i]);
    free(txt);
}

static void head(cmpl_ctx *c, tern_jw *w) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "id", c->id);
    tern_jw_kstr(w, "object", "text_completion");
    tern_jw_kint(w, "created", c->created);
    tern_jw_kstr(w, "model", c->s->served);
    tern_jw_kstr(w, "system_fingerprint", "tern");
    tern_jw_key(w, "choices");
    tern_jw_arr(w);
}

static void choice(cmpl_ctx *c, tern_jw *w, const char *text, size_t len, const srv_tokinfo *t, int n,
                   const char *finish) {
    tern_jw_obj(w);
    tern_jw_kstrn(w, "text", text, len);
    tern_jw_kint(w, "index", 0);
    legacy_logprobs(c, w, t, n);
    if (finish) tern_jw_kstr(w, "finish_reason", finish);
    else tern_jw_knull(w, "finish_reason");
    tern_jw_end(w);
}

static void s_start(void *ctx, tern_jw *out) { (void)ctx; (void)out; }

static void s_piece(void *ctx, const srv_piece *p, tern_jw *out) {
    cmpl_ctx *c = ctx;
    if (!p->len && !(c->logprobs && p->n_toks)) return;
    srv_sse_begin(out, NULL);                    /* per token: written in place, no copies */
    head(c, out);
    choice(c, out, p->text, p->len, p->toks, p->n_toks, NULL);
    tern_jw_end(out);
    tern_jw_end(out);
    srv_sse_end(out);
}

static void s_end(void *ctx, const srv_result *r, tern_jw *out) {
    cmpl_ctx *c = ctx;
    tern_jw w;
    tern_jw_init(&w);
    head(c, &w);
    int lp = c->logprobs;
    c->logprobs = 0;
    choice(c, &w, "", 0, NULL, 0, srv_finish_str(r->end));
    c->logprobs = lp;
    tern_jw_end(&w);
    if (c->include_usage) srv_write_usage(&w, r);
    tern_jw_end(&w);
    srv_sse_value(out, NULL, &w);
    srv_sse_done(out);
}

/* the same error event as a chat stream's (srv_jw_openai_error's value, then [DONE]) */
static void s_error(void *ctx, const srv_error *e, tern_jw *out) {
    (void)ctx;
    srv_sse_openai_error(out, e);
}

static const srv_stream_fmt k_cmpl_stream = {s_start, s_piece, s_end, s_error, free};

enum MHD_Result srv_handle_completions(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL;
    srv_params p = {0};
    srv_prompt pr = {0};
    srv_job *job = NULL;
    char *text = NULL;
    srv_tokinfo *toks = NULL;
    int n_toks = 0, b;
    long long bo;
    size_t len = 0;
    srv_result res = {0};
    enum MHD_Result ret;

    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e) || srv_check_model(s, req, &e)) goto fail;
    if (srv_params_parse_s(&p, req, SRV_API_OPENAI, s, &e)) goto fail;
    if (srv_get_bool(req, "echo", &b, &e) < 0) goto fail;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "echo"))) {
        srv_fail(&e, 400, "echo", "echo: not supported");
        goto fail;
    }
    if (cJSON_GetObjectItemCaseSensitive(req, "suffix") &&
        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(req, "suffix"))) {
        srv_fail(&e, 400, "suffix", "suffix: not supported");
        goto fail;
    }
    if (srv_get_int(req, "best_of", 1, 1, &bo, &e) < 0) goto fail;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (!prompt || cJSON_IsNull(prompt)) { srv_fail(&e, 400, "prompt", "prompt: field required"); goto fail; }
    if (srv_prompt_raw(s, prompt, &pr, &e)) goto fail;
    cmpl_ctx c = {.s = s, .created = (long long)time(NULL), .include_usage = p.include_usage, .logprobs = p.logprobs,
                  .top = p.top_logprobs};
    int stream = p.stream;
    srv_make_id(s, "cmpl-", c.id, sizeof c.id);
    if (srv_job_start(s, &pr, &p, r->fd, &job, &e)) goto fail;
    srv_prompt_free(&pr);
    cJSON_Delete(req);
    req = NULL;
    if (stream) {
        cmpl_ctx *hc = malloc(sizeof *hc);
        if (!hc) { srv_job_free(job); return MHD_NO; }
        *hc = c;
        return srv_stream(r, job, &k_cmpl_stream, hc);
    }
    if (srv_collect(job, &text, &len, &toks, &n_toks, &res, &e)) goto fail;
    srv_job_free(job);
    job = NULL;
    tern_jw w;
    tern_jw_init(&w);
    head(&c, &w);
    choice(&c, &w, text, len, toks, n_toks, srv_finish_str(res.end));
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
