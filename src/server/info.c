/*
 * info.c — the small endpoints: GET /health, /v1/models[/ID], /metrics, /stats and
 * POST /tokenize, /detokenize.
 *
 * /health: 200 {"status": "ok"} (byte-exact mlx-lm shape) once the model is loaded, 503
 * {"status": "loading"} before, 503 {"status": "error", "message"} if loading failed; it
 * never needs the API key. /metrics is Prometheus text format (tern_* names, counters end
 * in _total); /stats is the same numbers as JSON plus the model facts.
 * /tokenize {"content" | "text": str, "add_special": bool (default true)} -> {"tokens": [..]}
 * (with "with_pieces": true -> [{"id", "piece"}]); /detokenize {"tokens": [ids]} ->
 * {"content": str}.
 */
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum MHD_Result srv_handle_health(srv_req *r) {
    tern_server *s = r->s;
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    if (st == SRV_READY) return srv_reply(r, 200, "application/json", "{\"status\": \"ok\"}", 16);
    if (st == SRV_LOADING) return srv_reply(r, 503, "application/json", "{\"status\": \"loading\"}", 21);
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "status", "error");
    tern_jw_kstr(&w, "message", s->load_err.msg);
    tern_jw_end(&w);
    return srv_reply_jw(r, 503, &w);
}

static void model_obj(tern_server *s, tern_jw *w) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "id", s->served);
    tern_jw_kstr(w, "object", "model");
    tern_jw_kint(w, "created", s->created);
    tern_jw_kstr(w, "owned_by", "tern");
    tern_jw_kint(w, "context_window", s->info.n_ctx);
    tern_jw_kstr(w, "arch", s->info.arch ? s->info.arch : "");
    tern_jw_end(w);
}

enum MHD_Result srv_handle_models(srv_req *r, const char *id) {
    tern_server *s = r->s;
    srv_error e = {0};
    if (srv_wait_ready(s, &e)) return srv_reply_openai_error(r, &e);
    tern_jw w;
    tern_jw_init(&w);
    if (id) {
        const char *slash = strrchr(id, '/');
        if (strcmp(id, s->served) && !(slash && !strcmp(slash + 1, s->served))) {
            srv_fail(&e, 404, "model", "model '%.200s' is not served here", id);
            e.code = "model_not_found";
            tern_jw_free(&w);
            return srv_reply_openai_error(r, &e);
        }
        model_obj(s, &w);
        return srv_reply_jw(r, 200, &w);
    }
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "object", "list");
    tern_jw_key(&w, "data");
    tern_jw_arr(&w);
    model_obj(s, &w);
    tern_jw_end(&w);
    tern_jw_end(&w);
    return srv_reply_jw(r, 200, &w);
}

static void stats(tern_server *s, tern_engine_stats *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&s->mu);
    int ready = s->state == SRV_READY;
    pthread_mutex_unlock(&s->mu);
    if (ready) s->vt->get_stats(s->eng, st);
}

enum MHD_Result srv_handle_metrics(srv_req *r) {
    tern_server *s = r->s;
    tern_engine_stats st;
    stats(s, &st);
    char b[4096];
    int n = snprintf(b, sizeof b,
        "# HELP tern_requests_running Requests being decoded.\n# TYPE tern_requests_running gauge\n"
        "tern_requests_running %d\n"
        "# HELP tern_requests_waiting Requests queued for a slot.\n# TYPE tern_requests_waiting gauge\n"
        "tern_requests_waiting %d\n"
        "# HELP tern_requests_done_total Requests finished.\n# TYPE tern_requests_done_total counter\n"
        "tern_requests_done_total %lld\n"
        "# HELP tern_requests_cancelled_total Requests cancelled.\n# TYPE tern_requests_cancelled_total counter\n"
        "tern_requests_cancelled_total %lld\n"
        "# HELP tern_requests_failed_total Requests failed.\n# TYPE tern_requests_failed_total counter\n"
        "tern_requests_failed_total %lld\n"
        "# HELP tern_prompt_tokens_total Prompt tokens processed.\n# TYPE tern_prompt_tokens_total counter\n"
        "tern_prompt_tokens_total %lld\n"
        "# HELP tern_cached_tokens_total Prompt tokens served from the prefix cache.\n"
        "# TYPE tern_cached_tokens_total counter\ntern_cached_tokens_total %lld\n"
        "# HELP tern_generated_tokens_total Tokens generated.\n# TYPE tern_generated_tokens_total counter\n"
        "tern_generated_tokens_total %lld\n"
        "# HELP tern_kv_blocks_used KV blocks in use.\n# TYPE tern_kv_blocks_used gauge\ntern_kv_blocks_used %d\n"
        "# HELP tern_kv_blocks_total KV blocks in the pool.\n# TYPE tern_kv_blocks_total gauge\ntern_kv_blocks_total %d\n"
        "# HELP tern_prefix_hit_rate Fraction of prompt tokens served from the prefix cache.\n"
        "# TYPE tern_prefix_hit_rate gauge\ntern_prefix_hit_rate %g\n"
        "# HELP tern_http_requests_total HTTP requests received.\n# TYPE tern_http_requests_total counter\n"
        "tern_http_requests_total %lld\n"
        "# HELP tern_http_errors_total HTTP error responses by class.\n# TYPE tern_http_errors_total counter\n"
        "tern_http_errors_total{class=\"4xx\"} %lld\ntern_http_errors_total{class=\"5xx\"} %lld\n"
        "# HELP tern_http_streams_total Streaming responses started.\n# TYPE tern_http_streams_total counter\n"
        "tern_http_streams_total %lld\n"
        "# HELP tern_http_disconnects_total Clients that left before their answer ended.\n"
        "# TYPE tern_http_disconnects_total counter\ntern_http_disconnects_total %lld\n"
        "# HELP tern_uptime_seconds Seconds since the server started.\n# TYPE tern_uptime_seconds gauge\n"
        "tern_uptime_seconds %.3f\n",
        st.running, st.waiting, st.requests_done, st.requests_cancelled, st.requests_failed, st.prompt_tokens,
        st.cached_tokens, st.generated_tokens, st.kv_blocks_used, st.kv_blocks_total, st.prefix_hit_rate,
        (long long)atomic_load(&s->n_http), (long long)atomic_load(&s->n_http_4xx),
        (long long)atomic_load(&s->n_http_5xx), (long long)atomic_load(&s->n_streams),
        (long long)atomic_load(&s->n_disconnects), tern_time_s() - s->t_start);
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_text(&w, b, (size_t)(n < (int)sizeof b ? n : (int)sizeof b - 1));
    n = snprintf(b, sizeof b,
        "# HELP tern_kv_blocks_free KV blocks free.\n# TYPE tern_kv_blocks_free gauge\ntern_kv_blocks_free %d\n"
        "# HELP tern_kv_blocks_cached KV blocks held by the prefix cache.\n# TYPE tern_kv_blocks_cached gauge\n"
        "tern_kv_blocks_cached %d\n"
        "# HELP tern_preemptions_total Requests evicted from the KV pool to be recomputed.\n"
        "# TYPE tern_preemptions_total counter\ntern_preemptions_total %lld\n"
        "# HELP tern_http_rejected_total Requests refused with 429 because the wait queue was full.\n"
        "# TYPE tern_http_rejected_total counter\ntern_http_rejected_total %lld\n"
        "# HELP tern_spec_drafted_total Speculative draft tokens checked.\n"
        "# TYPE tern_spec_drafted_total counter\ntern_spec_drafted_total %lld\n"
        "# HELP tern_spec_accepted_total Speculative draft tokens accepted.\n"
        "# TYPE tern_spec_accepted_total counter\ntern_spec_accepted_total %lld\n"
        "# HELP tern_steps_total Forward steps run.\n# TYPE tern_steps_total counter\ntern_steps_total %lld\n"
        "# HELP tern_steps_queued_total Decode steps queued before the previous step's tokens reached the host.\n"
        "# TYPE tern_steps_queued_total counter\ntern_steps_queued_total %lld\n",
        st.kv_blocks_total - st.kv_blocks_used, st.kv_blocks_cached, st.preemptions,
        (long long)atomic_load(&s->n_rejected), (long long)st.spec_drafted, (long long)st.spec_accepted, st.steps,
        st.steps_queued);
    tern_jw_text(&w, b, (size_t)(n < (int)sizeof b ? n : (int)sizeof b - 1));
    srv_metrics_write(s, &w);
    size_t len = 0;
    char *txt = tern_jw_take(&w, &len);
    if (!txt) return srv_reply(r, 500, "text/plain", "out of memory\n", 14);
    enum MHD_Result ret = srv_reply(r, 200, "text/plain; version=0.0.4; charset=utf-8", txt, len);
    free(txt);
    return ret;
}

enum MHD_Result srv_handle_stats(srv_req *r) {
    tern_server *s = r->s;
    tern_engine_stats st;
    stats(s, &st);
    pthread_mutex_lock(&s->mu);
    int state = s->state;
    pthread_mutex_unlock(&s->mu);
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "status", state == SRV_READY ? "ok" : state == SRV_LOADING ? "loading" : "error");
    tern_jw_kdouble(&w, "uptime_s", tern_time_s() - s->t_start);
    tern_jw_key(&w, "model");
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "id", s->served);
    tern_jw_kstr(&w, "arch", s->info.arch ? s->info.arch : "");
    tern_jw_kint(&w, "n_ctx", s->info.n_ctx);
    tern_jw_kint(&w, "n_vocab", s->info.n_vocab);
    tern_jw_kint(&w, "n_layer", s->info.n_layer);
    tern_jw_kint(&w, "n_embd", s->info.n_embd);
    tern_jw_kbool(&w, "chat_template", s->tmpl != NULL);
    tern_jw_kstr(&w, "engine", s->vt->name);
    tern_jw_end(&w);
    tern_jw_key(&w, "engine");
    tern_jw_obj(&w);
    tern_jw_kint(&w, "running", st.running);
    tern_jw_kint(&w, "waiting", st.waiting);
    tern_jw_kint(&w, "requests_done", st.requests_done);
    tern_jw_kint(&w, "requests_cancelled", st.requests_cancelled);
    tern_jw_kint(&w, "requests_failed", st.requests_failed);
    tern_jw_kint(&w, "prompt_tokens", st.prompt_tokens);
    tern_jw_kint(&w, "cached_tokens", st.cached_tokens);
    tern_jw_kint(&w, "generated_tokens", st.generated_tokens);
    tern_jw_kint(&w, "kv_blocks_used", st.kv_blocks_used);
    tern_jw_kint(&w, "kv_blocks_total", st.kv_blocks_total);
    tern_jw_kdouble(&w, "prefix_hit_rate", st.prefix_hit_rate);
    tern_jw_end(&w);
    tern_jw_key(&w, "http");
    tern_jw_obj(&w);
    tern_jw_kint(&w, "requests", atomic_load(&s->n_http));
    tern_jw_kint(&w, "errors_4xx", atomic_load(&s->n_http_4xx));
    tern_jw_kint(&w, "errors_5xx", atomic_load(&s->n_http_5xx));
    tern_jw_kint(&w, "streams", atomic_load(&s->n_streams));
    tern_jw_kint(&w, "disconnects", atomic_load(&s->n_disconnects));
    tern_jw_kint(&w, "rejected_queue_full", atomic_load(&s->n_rejected));
    tern_jw_kint(&w, "live_requests", atomic_load(&s->n_live));
    tern_jw_end(&w);
    tern_jw_end(&w);
    return srv_reply_jw(r, 200, &w);
}

enum MHD_Result srv_handle_tokenize(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL;
    const char *text = NULL;
    int add_special = 1, pieces = 0;
    int32_t *ids = NULL;
    int n = 0;
    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e)) goto fail;
    if (srv_get_str(req, "content", &text, &e) < 0 || (!text && srv_get_str(req, "text", &text, &e) < 0)) goto fail;
    if (!text) { srv_fail(&e, 400, "content", "content: field required (a string)"); goto fail; }
    if (srv_get_bool(req, "add_special", &add_special, &e) < 0 || srv_get_bool(req, "with_pieces", &pieces, &e) < 0)
        goto fail;
    tern_error err = {0};
    tern_status st = s->vt->tokenize(s->eng, text, strlen(text), add_special, &ids, &n, &err);
    if (st) { srv_fail(&e, st == TERN_EUNSUPPORTED || st == TERN_EINVAL ? 400 : 500, "content", "%s", err.msg); goto fail; }
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_key(&w, "tokens");
    tern_jw_arr(&w);
    for (int i = 0; i < n; i++) {
        if (!pieces) { tern_jw_int(&w, ids[i]); continue; }
        char *t = srv_token_text(s, ids[i]);
        tern_jw_obj(&w);
        tern_jw_kint(&w, "id", ids[i]);
        tern_jw_kstr(&w, "piece", t ? t : "");
        tern_jw_end(&w);
        free(t);
    }
    tern_jw_end(&w);
    tern_jw_end(&w);
    free(ids);
    cJSON_Delete(req);
    return srv_reply_jw(r, 200, &w);
fail:
    free(ids);
    cJSON_Delete(req);
    return srv_reply_openai_error(r, &e);
}

enum MHD_Result srv_handle_detokenize(srv_req *r) {
    tern_server *s = r->s;
    srv_error e = {0};
    cJSON *req = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    if (srv_parse_body(r, &req, &e) || srv_wait_ready(s, &e)) goto fail;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tokens");
    if (!cJSON_IsArray(t)) { srv_fail(&e, 400, "tokens", "tokens: expected a list of token ids"); goto fail; }
    int n = cJSON_GetArraySize(t), k = 0;
    ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!ids) { srv_fail(&e, 500, "", "out of memory"); goto fail; }
    const cJSON *x;
    cJSON_ArrayForEach(x, t) {
        double d = cJSON_IsNumber(x) ? x->valuedouble : -1;
        if (!srv_is_token_id(d, s->info.n_vocab)) {
            srv_fail(&e, 400, "tokens", "tokens[%d]: expected a token id in [0, %d)", k, s->info.n_vocab);
            goto fail;
        }
        ids[k++] = (int32_t)d;
    }
    tern_error err = {0};
    tern_status st = s->vt->detokenize(s->eng, ids, k, &text, &err);
    if (st) { srv_fail(&e, st == TERN_EUNSUPPORTED ? 400 : 500, "tokens", "%s", err.msg); goto fail; }
    tern_jw w;
    tern_jw_init(&w);
    tern_jw_obj(&w);
    tern_jw_kstr(&w, "content", text);
    tern_jw_end(&w);
    free(text);
    free(ids);
    cJSON_Delete(req);
    return srv_reply_jw(r, 200, &w);
fail:
    free(text);
    free(ids);
    cJSON_Delete(req);
    return srv_reply_openai_error(r, &e);
}
