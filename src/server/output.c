/*
 * output.c — how a request's output is shaped: tool-call / reasoning parsing and
 * response_format (constrained decoding), shared by the chat, messages and responses APIs.
 *
 * Parsing: the server detects the markup of the model's chat template once at load
 * (tern_output_formats_detect); a request turns the parser on when its output may hold tool
 * calls (tools given and tool_choice not "none") or the template has a reasoning format.
 * start_in_reasoning: the rendered prompt ends inside an open reasoning block (its last
 * opening marker comes after its last closing marker), as thinking templates write it.
 * response_format: "text" (nothing), "json_object" (any JSON object) or "json_schema"
 * (the schema subset of jsonfsm.h) -> a compiled grammar in p->gram; the token-bytes table
 * it needs is built once per server on first use. A grammar turns the parser off: the
 * output is the JSON document itself.
 */
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *srv_finish_str_r(const srv_result *r) {
    if (r->n_calls > 0 && r->end != SRV_END_LENGTH) return "tool_calls";
    return srv_finish_str(r->end);
}

static const char *last(const char *hay, const char *needle) {
    const char *r = NULL;
    for (const char *p = hay; (p = strstr(p, needle)); p++) r = p;
    return r;
}

int srv_output_setup(tern_server *s, srv_params *p, const srv_prompt *pr, const cJSON *tools, int tools_on,
                     srv_error *e) {
    int tools_fmt = tools_on && tools ? s->tools_fmt : TERN_TOOLS_NONE;
    p->parse_output = tools_fmt != TERN_TOOLS_NONE || s->reason_fmt != TERN_REASON_NONE;
    if (!p->parse_output) return 0;
    if (tools && tools_on && !(p->tools = cJSON_Duplicate(tools, 1))) return srv_fail(e, 500, "", "out of memory");
    if (pr->text) {
        const char *open = s->reason_fmt == TERN_REASON_THINK ? "<think>" : s->reason_fmt == TERN_REASON_GEMMA4 ? "<|channel>" : NULL;
        const char *close = s->reason_fmt == TERN_REASON_THINK ? "</think>" : "<channel|>";
        const char *o = open ? last(pr->text, open) : NULL, *c = open ? last(pr->text, close) : NULL;
        p->start_in_reasoning = o && (!c || c < o);
    }
    return 0;
}

static int ensure_vocab(tern_server *s, srv_error *e) {
    pthread_mutex_lock(&s->vocab_mu);
    if (!s->jvocab) {
        const tern_tokenizer *tok = s->vt->tokenizer ? s->vt->tokenizer(s->eng) : NULL;
        tern_error err = {0};
        double t0 = tern_time_s();
        if (srv_jvocab_from_tokenizer(tok, s->info.n_vocab, s->info.eos_ids, s->info.n_eos, &s->jvocab, &err)) {
            pthread_mutex_unlock(&s->vocab_mu);
            return srv_fail(e, err.code == TERN_ENOMEM ? 500 : 400, "response_format", "response_format: %s", err.msg);
        }
        tern_log(TERN_LOG_INFO, "serve: token table for constrained decoding built in %.0f ms", (tern_time_s() - t0) * 1e3);
    }
    pthread_mutex_unlock(&s->vocab_mu);
    return 0;
}

int srv_response_format(tern_server *s, srv_params *p, const cJSON *rf, const char *param, srv_error *e) {
    if (!rf || cJSON_IsNull(rf)) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        return srv_fail(e, 400, param, "%s: expected an object with a \"type\"", param);
    const char *ty = t->valuestring;
    if (!strcmp(ty, "text")) return 0;
    const cJSON *schema = NULL;
    if (!strcmp(ty, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        const cJSON *holder = cJSON_IsObject(js) ? js : rf;   /* chat: {json_schema: {schema}}; responses: {schema} */
        schema = cJSON_GetObjectItemCaseSensitive(holder, "schema");
        if (!cJSON_IsObject(schema) && !cJSON_IsTrue(schema))
            return srv_fail(e, 400, param, "%s: json_schema needs a \"schema\" object", param);
        if (cJSON_IsTrue(schema)) schema = NULL;
    } else if (strcmp(ty, "json_object")) {
        return srv_fail(e, 400, param, "%s: type must be \"text\", \"json_object\" or \"json_schema\", got \"%.40s\"",
                        param, ty);
    }
    tern_error err = {0};
    if (srv_jgram_compile(schema, &p->gram, &err))
        return srv_fail(e, err.code == TERN_ENOMEM ? 500 : 400, param, "%s: %s", param, err.msg);
    return ensure_vocab(s, e);
}
