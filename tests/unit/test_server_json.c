/*
 * test_server_json.c — the server's JSON writer (src/server/jsonw.c) and request-field
 * validation (src/server/params.c): escaping, invalid UTF-8 repair, Python-repr floats,
 * nesting/commas, and the 400 messages for bad sampling fields.
 */
#include "server/srv.h"
#include "test.h"

static char *render(void (*fn)(tern_jw *)) {
    tern_jw w;
    tern_jw_init(&w);
    fn(&w);
    return tern_jw_take(&w, NULL);
}

static void nested(tern_jw *w) {
    tern_jw_obj(w);
    tern_jw_kstr(w, "a", "x");
    tern_jw_key(w, "b");
    tern_jw_arr(w);
    tern_jw_int(w, 1);
    tern_jw_obj(w);
    tern_jw_end(w);
    tern_jw_arr(w);
    tern_jw_end(w);
    tern_jw_null(w);
    tern_jw_end(w);
    tern_jw_kbool(w, "c", 1);
    tern_jw_kdouble(w, "d", 0.1);
    tern_jw_end(w);
}

TEST(writer_nesting_and_commas) {
    char *s = render(nested);
    CHECK(s && !strcmp(s, "{\"a\":\"x\",\"b\":[1,{},[],null],\"c\":true,\"d\":0.1}"), "got %s", s);
    cJSON *j = cJSON_Parse(s);
    CHECK(j != NULL, "not parseable");
    cJSON_Delete(j);
    free(s);
}

static void strings(tern_jw *w) {
    tern_jw_arr(w);
    tern_jw_str(w, "q\"b\\n\n\t\x01");
    tern_jw_str(w, "\xC3\xA9\xE2\x9C\x93");             /* valid UTF-8 passes through */
    tern_jw_strn(w, "a\xFF" "b\xC3", 4);                 /* invalid byte + cut sequence */
    tern_jw_strn(w, "z\0z", 3);                          /* embedded NUL */
    tern_jw_str(w, NULL);
    tern_jw_end(w);
}

TEST(writer_string_escaping_and_utf8_repair) {
    char *s = render(strings);
    const char *want = "[\"q\\\"b\\\\n\\n\\t\\u0001\",\"\xC3\xA9\xE2\x9C\x93\",\"a\xEF\xBF\xBD" "b\xEF\xBF\xBD\","
                       "\"z\\u0000z\",null]";
    CHECK(s && !strcmp(s, want), "got %s", s);
    cJSON *j = cJSON_Parse(s);
    CHECK(j != NULL, "not parseable");
    cJSON_Delete(j);
    free(s);
}

TEST(python_repr_floats) {
    static const struct { double v; const char *want; } k[] = {
        {0.1, "0.1"}, {100.0, "100.0"}, {-0.5, "-0.5"}, {1e-05, "1e-05"}, {0.0001, "0.0001"},
        {1e16, "1e+16"}, {1234567890123456.0, "1234567890123456.0"}, {1.5e300, "1.5e+300"},
        {0.0, "0.0"}, {-0.0, "-0.0"}, {(double)-0.6931472f, "-0.6931471824645996"},
        {123.456, "123.456"}, {5e-324, "5e-324"}, {NAN, "null"}, {INFINITY, "null"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(k); i++) {
        char b[64];
        tern_jw_fmt_double(k[i].v, b, sizeof b);
        CHECK(!strcmp(b, k[i].want), "%.17g -> %s, want %s", k[i].v, b, k[i].want);
    }
}

TEST(utf8_complete_prefix) {
    CHECK(tern_utf8_complete_prefix("ab", 2) == 2, "ascii");
    CHECK(tern_utf8_complete_prefix("a\xC3", 2) == 1, "cut 2-byte");
    CHECK(tern_utf8_complete_prefix("a\xE2\x9C", 3) == 1, "cut 3-byte");
    CHECK(tern_utf8_complete_prefix("a\xE2\x9C\x93", 4) == 4, "whole 3-byte");
    CHECK(tern_utf8_complete_prefix("\xF0\x9F\x98", 3) == 0, "cut 4-byte");
}

static int parse(const char *json, srv_api api, srv_params *p, srv_error *e) {
    cJSON *j = cJSON_Parse(json);
    int rc = srv_params_parse(p, j, api, 1000, 4096, e);
    cJSON_Delete(j);
    return rc;
}

TEST(params_valid) {
    srv_params p;
    srv_error e = {0};
    int rc = parse("{\"max_tokens\":10,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":-1,"
                   "\"stop\":[\"a\",\"bc\"],\"logit_bias\":{\"5\":-100,\"7\":2.5},\"logprobs\":true,\"top_logprobs\":3,"
                   "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":1,\"frequency_penalty\":0.5}",
                   SRV_API_OPENAI, &p, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.msg);
    CHECK(p.max_tokens == 10 && p.s.top_k == 40 && p.n_stop == 2 && p.n_bias == 2, "fields");
    CHECK(p.s.bias_ids == p.bias_ids && p.bias_ids[1] == 7 && p.bias_vals[0] == -100.0f, "bias");
    CHECK(p.s.n_logprobs == 3 && p.stream && p.include_usage && p.has_seed, "flags");
    CHECK(p.s.seed == (uint64_t)-1, "seed wraps");
    srv_params_free(&p);
    rc = parse("{\"stop\":\"x\",\"max_completion_tokens\":7}", SRV_API_OPENAI, &p, &e);
    CHECK(rc == 0 && p.n_stop == 1 && p.max_tokens == 7, "string stop / max_completion_tokens");
    srv_params_free(&p);
    rc = parse("{\"max_tokens\":5,\"stop_sequences\":[\"\\n\\nHuman:\"],\"temperature\":1}", SRV_API_ANTHROPIC, &p, &e);
    CHECK(rc == 0 && p.n_stop == 1 && p.max_tokens == 5, "anthropic: %s", e.msg);
    srv_params_free(&p);
}

TEST(params_rejected_with_field_name) {
    static const struct { const char *json; srv_api api; const char *param; const char *msg_has; } k[] = {
        {"{\"max_tokens\":-1}", SRV_API_OPENAI, "max_tokens", "got -1"},
        {"{\"max_tokens\":1e12}", SRV_API_OPENAI, "max_tokens", "[1, 4096]"},
        {"{\"max_tokens\":2.5}", SRV_API_OPENAI, "max_tokens", "integer"},
        {"{\"temperature\":-3}", SRV_API_OPENAI, "temperature", "got -3"},
        {"{\"temperature\":\"hot\"}", SRV_API_OPENAI, "temperature", "\"hot\""},
        {"{\"top_p\":0}", SRV_API_OPENAI, "top_p", "(0, 1]"},
        {"{\"n\":3}", SRV_API_OPENAI, "n", "only n = 1"},
        {"{\"stop\":[1]}", SRV_API_OPENAI, "stop", "strings"},
        {"{\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
         SRV_API_OPENAI, "stop", "at most 16"},
        {"{\"logit_bias\":{\"1000\":1}}", SRV_API_OPENAI, "logit_bias", "[0, 1000)"},
        {"{\"logit_bias\":{\"3\":true}}", SRV_API_OPENAI, "logit_bias", "[-100, 100]"},
        {"{\"top_logprobs\":2}", SRV_API_OPENAI, "top_logprobs", "requires logprobs"},
        {"{\"stream_options\":{\"include_usage\":1}}", SRV_API_OPENAI, "stream_options.include_usage", "true or false"},
        {"{\"messages\":[]}", SRV_API_ANTHROPIC, "max_tokens", "required"},
        {"{\"max_tokens\":5,\"temperature\":1.5}", SRV_API_ANTHROPIC, "temperature", "[0, 1]"},
        {"{\"max_tokens\":5,\"stop_sequences\":\"x\"}", SRV_API_ANTHROPIC, "stop_sequences", "list"},
        {"[1]", SRV_API_OPENAI, "", "JSON object"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(k); i++) {
        srv_params p;
        srv_error e = {0};
        int rc = parse(k[i].json, k[i].api, &p, &e);
        CHECK(rc == -1 && e.http == 400, "%s: rc %d http %d", k[i].json, rc, e.http);
        CHECK(!strcmp(e.param, k[i].param), "%s: param '%s', want '%s'", k[i].json, e.param, k[i].param);
        CHECK(strstr(e.msg, k[i].msg_has) != NULL, "%s: message '%s' lacks '%s'", k[i].json, e.msg, k[i].msg_has);
        srv_params_free(&p);
    }
}

/* The SSE helpers (sse.c): a value framed as one data event (named or not, the writer left empty), and an OpenAI
 * stream's error event — {"error": {message, type, param, code}} as a reply's body has it, then [DONE], for chat
 * and completions alike */
TEST(sse_value_and_openai_error) {
    tern_jw out, v;
    tern_jw_init(&out);
    tern_jw_init(&v);
    tern_jw_obj(&v);
    tern_jw_kint(&v, "a", 1);
    tern_jw_end(&v);
    srv_sse_value(&out, NULL, &v);
    tern_jw_init(&v);
    tern_jw_arr(&v);
    tern_jw_end(&v);
    srv_sse_value(&out, "ping", &v);
    srv_error e = {0};
    srv_fail(&e, 503, "", "the server is shutting down");
    srv_sse_openai_error(&out, &e);
    char *s = tern_jw_take(&out, NULL);
    const char *want = "data: {\"a\":1}\n\n"
                       "event: ping\ndata: []\n\n"
                       "data: {\"error\":{\"message\":\"the server is shutting down\",\"type\":\"server_error\","
                       "\"param\":null,\"code\":null}}\n\n"
                       "data: [DONE]\n\n";
    CHECK(s && !strcmp(s, want), "got [%s]", s ? s : "(null)");
    free(s);
    srv_fail(&e, 400, "x", "bad x");
    tern_jw_init(&out);
    srv_sse_openai_error(&out, &e);
    s = tern_jw_take(&out, NULL);
    CHECK(s && strstr(s, "\"type\":\"invalid_request_error\",\"param\":\"x\",\"code\":null"), "got [%s]", s ? s : "(null)");
    free(s);
}

int main(void) {
    RUN(writer_nesting_and_commas);
    RUN(sse_value_and_openai_error);
    RUN(writer_string_escaping_and_utf8_repair);
    RUN(python_repr_floats);
    RUN(utf8_complete_prefix);
    RUN(params_valid);
    RUN(params_rejected_with_field_name);
    return test_done();
}
