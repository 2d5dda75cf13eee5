/*
 * params.c — reading and validating the request fields shared by the APIs into srv_params.
 *
 * Every bad value is a 400 naming the field and the value ("temperature: expected a number
 * in [0, 2], got -3"); nothing is clamped silently except max_tokens by the context later.
 * OpenAI fields: max_tokens / max_completion_tokens, temperature [0,2], top_p (0,1],
 * top_k >= 0 (-1 = off), min_p [0,1], seed, stop (string | [string], <= 16), presence_ and
 * frequency_penalty [-2,2], repetition_penalty (0,10], logit_bias {"id": [-100,100]},
 * logprobs (bool) + top_logprobs [0,20], n (only 1), stream, stream_options.include_usage,
 * ignore_eos and speculative_k (extensions). Anthropic: max_tokens (required), temperature [0,1], top_p,
 * top_k, stop_sequences, stream. Unknown fields are ignored, as the real APIs do.
 */
#include "server/srv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tern_request tern__srv_request_default(void);

int srv_fail(srv_error *e, int http, const char *param, const char *fmt, ...) {
    if (!e) return -1;
    e->http = http;
    e->type = http >= 500 ? "server_error" : http == 401 ? "authentication_error" : http == 404 ? "not_found_error"
              : "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static const cJSON *item(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static const char *desc(const cJSON *v, char *b, size_t n) {
    if (cJSON_IsString(v)) {
        snprintf(b, n, "\"%.40s%s\"", v->valuestring, strlen(v->valuestring) > 40 ? "..." : "");
    } else if (cJSON_IsNumber(v)) snprintf(b, n, "%.17g", v->valuedouble);
    else if (cJSON_IsBool(v)) snprintf(b, n, cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsArray(v)) snprintf(b, n, "an array");
    else if (cJSON_IsObject(v)) snprintf(b, n, "an object");
    else snprintf(b, n, "null");
    return b;
}

int srv_get_num(const cJSON *o, const char *k, double lo, double hi, double *out, srv_error *e) {
    const cJSON *v = item(o, k);
    char b[64];
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return srv_fail(e, 400, k, "%s: expected a number in [%g, %g], got %s", k, lo, hi, desc(v, b, sizeof b));
    *out = v->valuedouble;
    return 1;
}

int srv_get_int(const cJSON *o, const char *k, long long lo, long long hi, long long *out, srv_error *e) {
    const cJSON *v = item(o, k);
    char b[64];
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi)
        return srv_fail(e, 400, k, "%s: expected an integer in [%lld, %lld], got %s", k, lo, hi,
                        desc(v, b, sizeof b));
    *out = (long long)d;
    return 1;
}

int srv_get_bool(const cJSON *o, const char *k, int *out, srv_error *e) {
    const cJSON *v = item(o, k);
    char b[64];
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return srv_fail(e, 400, k, "%s: expected true or false, got %s", k, desc(v, b, sizeof b));
    *out = cJSON_IsTrue(v);
    return 1;
}

int srv_get_str(const cJSON *o, const char *k, const char **out, srv_error *e) {
    const cJSON *v = item(o, k);
    char b[64];
    if (!v) return 0;
    if (!cJSON_IsString(v)) return srv_fail(e, 400, k, "%s: expected a string, got %s", k, desc(v, b, sizeof b));
    *out = v->valuestring;
    return 1;
}

static int add_stop(srv_params *p, const char *s, const char *k, srv_error *e) {
    size_t n = strlen(s);
    if (n == 0) return srv_fail(e, 400, k, "%s: stop strings must not be empty", k);
    if (n > 512) return srv_fail(e, 400, k, "%s: stop string longer than 512 bytes", k);
    if (p->n_stop >= 16) return srv_fail(e, 400, k, "%s: at most 16 stop strings are supported", k);
    char **v = realloc(p->stop, sizeof(char *) * (size_t)(p->n_stop + 1));
    if (!v) return srv_fail(e, 500, k, "out of memory");
    p->stop = v;
    if (!(p->stop[p->n_stop] = strdup(s))) return srv_fail(e, 500, k, "out of memory");
    p->n_stop++;
    return 0;
}

static int parse_stop(srv_params *p, const cJSON *req, const char *k, int allow_string, srv_error *e) {
    const cJSON *v = item(req, k);
    char b[64];
    if (!v) return 0;
    if (cJSON_IsString(v) && allow_string) return add_stop(p, v->valuestring, k, e);
    if (!cJSON_IsArray(v))
        return srv_fail(e, 400, k, "%s: expected %sa list of strings, got %s", k, allow_string ? "a string or " : "",
                        desc(v, b, sizeof b));
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        if (!cJSON_IsString(x))
            return srv_fail(e, 400, k, "%s: expected a list of strings, found %s", k, desc(x, b, sizeof b));
        if (add_stop(p, x->valuestring, k, e)) return -1;
    }
    return 0;
}

static int parse_bias(srv_params *p, const cJSON *req, int n_vocab, srv_error *e) {
    const cJSON *v = item(req, "logit_bias");
    char b[64];
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return srv_fail(e, 400, "logit_bias", "logit_bias: expected an object, got %s",
                                            desc(v, b, sizeof b));
    int n = cJSON_GetArraySize(v);
    if (n > 4096) return srv_fail(e, 400, "logit_bias", "logit_bias: at most 4096 entries, got %d", n);
    if (n == 0) return 0;
    p->bias_ids = malloc(sizeof(int32_t) * (size_t)n);
    p->bias_vals = malloc(sizeof(float) * (size_t)n);
    if (!p->bias_ids || !p->bias_vals) return srv_fail(e, 500, "logit_bias", "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        char *end = NULL;
        long id = strtol(x->string, &end, 10);
        if (!x->string[0] || *end || id < 0 || id >= n_vocab)
            return srv_fail(e, 400, "logit_bias", "logit_bias: key \"%.40s\" is not a token id in [0, %d)", x->string,
                            n_vocab);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < -100 || x->valuedouble > 100)
            return srv_fail(e, 400, "logit_bias", "logit_bias[\"%s\"]: expected a number in [-100, 100], got %s",
                            x->string, desc(x, b, sizeof b));
        p->bias_ids[p->n_bias] = (int32_t)id;
        p->bias_vals[p->n_bias] = (float)x->valuedouble;
        p->n_bias++;
    }
    return 0;
}

static int parse(srv_params *p, const cJSON *req, srv_api api, int n_vocab, int n_ctx, const tern_sampling *dflt,
                 int dflt_seed, srv_error *e);

int srv_params_parse(srv_params *p, const cJSON *req, srv_api api, int n_vocab, int n_ctx, srv_error *e) {
    tern_request d = tern__srv_request_default();
    return parse(p, req, api, n_vocab, n_ctx, &d.sampling, 0, e);
}

/* With the server's default sampling (tern serve --temperature/--top-p/--top-k/--min-p/--seed). */
int srv_params_parse_s(srv_params *p, const cJSON *req, srv_api api, const tern_server *s, srv_error *e) {
    return parse(p, req, api, s->info.n_vocab, s->info.n_ctx, &s->o.sampling, s->o.has_seed, e);
}

static int parse(srv_params *p, const cJSON *req, srv_api api, int n_vocab, int n_ctx, const tern_sampling *dflt,
                 int dflt_seed, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->speculative_k = -1; /* the engine's default */
    p->s = *dflt;
    p->has_seed = dflt_seed;
    p->s.bias_ids = NULL;
    p->s.bias_values = NULL;
    p->s.n_bias = 0;
    p->s.n_logprobs = 0;
    if (!cJSON_IsObject(req)) return srv_fail(e, 400, "", "request body must be a JSON object");
    double x;
    long long i;
    int r, bv;
    int max_ctx = n_ctx > 0 ? n_ctx : 1 << 30;

    const char *mt_key = "max_tokens";
    if ((r = srv_get_int(req, "max_tokens", 1, max_ctx, &i, e)) < 0) return -1;
    if (r) p->max_tokens = (int)i;
    if (api == SRV_API_OPENAI) {
        if ((r = srv_get_int(req, "max_completion_tokens", 1, max_ctx, &i, e)) < 0) return -1;
        if (r) { p->max_tokens = (int)i; mt_key = "max_completion_tokens"; }
    } else if (!p->max_tokens) {
        return srv_fail(e, 400, "max_tokens", "max_tokens: field required");
    }
    (void)mt_key;

    double tmax = api == SRV_API_ANTHROPIC ? 1.0 : 2.0;
    if ((r = srv_get_num(req, "temperature", 0, tmax, &x, e)) < 0) return -1;
    if (r) p->s.temperature = (float)x;
    if ((r = srv_get_num(req, "top_p", 0, 1, &x, e)) < 0) return -1;
    if (r) {
        if (x <= 0) return srv_fail(e, 400, "top_p", "top_p: expected a number in (0, 1], got 0");
        p->s.top_p = (float)x;
    }
    if ((r = srv_get_int(req, "top_k", -1, 1 << 24, &i, e)) < 0) return -1;
    if (r) p->s.top_k = i < 0 ? 0 : (int)i;
    if ((r = srv_get_num(req, "min_p", 0, 1, &x, e)) < 0) return -1;
    if (r) p->s.min_p = (float)x;
    if ((r = srv_get_bool(req, "stream", &bv, e)) < 0) return -1;
    if (r) p->stream = bv;
    if ((r = srv_get_bool(req, "ignore_eos", &bv, e)) < 0) return -1;
    if (r) p->ignore_eos = bv;
    if ((r = srv_get_int(req, "speculative_k", 0, TERN_SPEC_MAX_K, &i, e)) < 0) return -1;
    if (r) p->speculative_k = (int)i;

    if (api == SRV_API_ANTHROPIC) {
        if (parse_stop(p, req, "stop_sequences", 0, e)) return -1;
        return 0;
    }

    /* seed: any 64-bit integer (negative values wrap, as two's complement) */
    if ((r = srv_get_int(req, "seed", -(1LL << 53), 1LL << 53, &i, e)) < 0) return -1;
    if (r) { p->s.seed = (uint64_t)i; p->has_seed = 1; }
    if ((r = srv_get_num(req, "presence_penalty", -2, 2, &x, e)) < 0) return -1;
    if (r) p->s.presence_penalty = (float)x;
    if ((r = srv_get_num(req, "frequency_penalty", -2, 2, &x, e)) < 0) return -1;
    if (r) p->s.frequency_penalty = (float)x;
    if ((r = srv_get_num(req, "repetition_penalty", 0, 10, &x, e)) < 0) return -1;
    if (r) {
        if (x <= 0) return srv_fail(e, 400, "repetition_penalty", "repetition_penalty: must be > 0, got %g", x);
        p->s.repetition_penalty = (float)x;
    }
    if ((r = srv_get_int(req, "n", 1, 1 << 20, &i, e)) < 0) return -1;
    if (r && i != 1)
        return srv_fail(e, 400, "n", "n: only n = 1 is supported, got %lld", i);
    if (parse_stop(p, req, "stop", 1, e)) return -1;
    if (parse_bias(p, req, n_vocab, e)) return -1;
    p->s.bias_ids = p->bias_ids;
    p->s.bias_values = p->bias_vals;
    p->s.n_bias = p->n_bias;

    /* logprobs: bool in chat; an integer 0..5 in the legacy completions API */
    const cJSON *lp = item(req, "logprobs");
    if (lp) {
        if (cJSON_IsBool(lp)) p->logprobs = cJSON_IsTrue(lp);
        else if ((r = srv_get_int(req, "logprobs", 0, 20, &i, e)) < 0) return -1;
        else { p->logprobs = 1; p->top_logprobs = (int)i; }
    }
    if ((r = srv_get_int(req, "top_logprobs", 0, 20, &i, e)) < 0) return -1;
    if (r) {
        if (!p->logprobs && i > 0)
            return srv_fail(e, 400, "top_logprobs", "top_logprobs: requires logprobs to be true");
        p->top_logprobs = (int)i;
    }
    if (p->logprobs) p->s.n_logprobs = p->top_logprobs > 0 ? p->top_logprobs : 1;

    const cJSON *so = item(req, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return srv_fail(e, 400, "stream_options", "stream_options: expected an object");
        if (srv_get_bool(so, "include_usage", &p->include_usage, e) < 0) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    return 0;
}

int srv_reasoning_effort(const cJSON *req, int *enable, srv_error *e) {
    const char *v = NULL;
    *enable = -1;
    const cJSON *r = item(req, "reasoning");          /* Responses API: {"effort": ...} */
    if (r && cJSON_IsObject(r) && srv_get_str(r, "effort", &v, e) < 0) return -1;
    if (!v && srv_get_str(req, "reasoning_effort", &v, e) < 0) return -1;
    if (!v) return 0;
    if (!strcmp(v, "none")) *enable = 0;
    else if (!strcmp(v, "minimal") || !strcmp(v, "low") || !strcmp(v, "medium") || !strcmp(v, "high")) *enable = 1;
    else return srv_fail(e, 400, "reasoning_effort",
                         "reasoning_effort: expected none, minimal, low, medium or high, got \"%.40s\"", v);
    return 0;
}

void srv_params_free(srv_params *p) {
    if (!p) return;
    cJSON_Delete(p->tools);
    srv_jgram_free(p->gram);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    free(p->bias_ids);
    free(p->bias_vals);
    memset(p, 0, sizeof *p);
}
