/*
 * test_server_guard.c — the request guards added for robustness (src/server/plan.c,
 * params.c): the UTF-8 walk over a parsed body (RFC 3629: overlongs, surrogates, > U+10FFFF,
 * truncated sequences, bad keys) names the path of the first bad string; server default
 * sampling applies to omitted fields only (srv_params_parse_s).
 */
#include "server/srv.h"
#include "test.h"

#include <string.h>

/* Build {"messages":[{"role":"user","content":"<bytes>"}]} with raw bytes inside. */
static cJSON *body_with(const char *bytes) {
    char buf[256];
    snprintf(buf, sizeof buf, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"ok\"},"
                              "{\"role\":\"user\",\"content\":\"a%sb\"}]}", bytes);
    return cJSON_Parse(buf);
}

TEST(utf8_valid_strings_pass) {
    static const char *ok[] = {"", "plain", "\xc3\xa9t\xc3\xa9", "\xe2\x9c\x93", "\xf0\x9f\x98\x80", "\xed\x9f\xbf",
                               "\xee\x80\x80", "\xf4\x8f\xbf\xbf"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cJSON *j = body_with(ok[i]);
        char path[128];
        CHECK(j && !srv_json_bad_utf8(j, path, sizeof path), "case %zu flagged at %s", i, path);
        cJSON_Delete(j);
    }
}

TEST(utf8_invalid_strings_named) {
    static const char *bad[] = {
        "\xff", "\xc0\xaf",           /* overlong '/' */
        "\xe0\x80\xaf",               /* overlong 3-byte */
        "\xed\xa0\x80",               /* UTF-16 surrogate */
        "\xf4\x90\x80\x80",           /* > U+10FFFF */
        "\xf5\x80\x80\x80", "\xc3",   /* truncated before 'b' */
        "\xe2\x82", "\x80", "\xf0\x9f\x98",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *j = body_with(bad[i]);
        char path[128] = "";
        CHECK(j && srv_json_bad_utf8(j, path, sizeof path), "case %zu not flagged", i);
        CHECK(!strcmp(path, "messages[1].content"), "case %zu: path %s", i, path);
        cJSON_Delete(j);
    }
}

TEST(utf8_bad_key_and_deep_path) {
    cJSON *j = cJSON_Parse("{\"a\":{\"b\":[1,{\"\xc3\":2}]}}");
    char path[128] = "";
    CHECK(j && srv_json_bad_utf8(j, path, sizeof path), "bad key not flagged");
    CHECK(!strcmp(path, "a.b[1] (a key)"), "path %s", path);
    cJSON_Delete(j);
    j = cJSON_Parse("{\"\xff\":1}");
    CHECK(j && srv_json_bad_utf8(j, path, sizeof path) && !strcmp(path, "a key of the body"), "top key: %s", path);
    cJSON_Delete(j);
    /* a long path is cut, never overflows */
    char deep[4096] = "";
    size_t n = 0;
    for (int i = 0; i < 200; i++) n += (size_t)snprintf(deep + n, sizeof deep - n, "{\"key%03d\":", i);
    n += (size_t)snprintf(deep + n, sizeof deep - n, "\"\xff\"");
    for (int i = 0; i < 200; i++) deep[n++] = '}';
    deep[n] = 0;
    j = cJSON_Parse(deep);
    char small[40];
    CHECK(j && srv_json_bad_utf8(j, small, sizeof small) && strlen(small) < sizeof small, "deep: %s", small);
    cJSON_Delete(j);
}

TEST(server_default_sampling) {
    tern_server s;
    memset(&s, 0, sizeof s);
    s.info.n_vocab = 100;
    s.info.n_ctx = 512;
    s.o.sampling.temperature = 0.25f;
    s.o.sampling.top_p = 0.5f;
    s.o.sampling.top_k = 7;
    s.o.sampling.min_p = 0.1f;
    s.o.sampling.repetition_penalty = 1.0f;
    s.o.sampling.seed = 42;
    s.o.has_seed = 1;
    cJSON *req = cJSON_Parse("{\"messages\":[],\"top_k\":3}");
    srv_params p;
    srv_error e = {0};
    CHECK(!srv_params_parse_s(&p, req, SRV_API_OPENAI, &s, &e), "parse: %s", e.msg);
    CHECK(p.s.temperature == 0.25f && p.s.top_p == 0.5f && p.s.min_p == 0.1f, "defaults not applied");
    CHECK(p.s.top_k == 3, "request top_k overridden: %d", p.s.top_k);
    CHECK(p.has_seed && p.s.seed == 42, "default seed");
    srv_params_free(&p);
    cJSON_Delete(req);
    req = cJSON_Parse("{\"temperature\":0,\"seed\":5}");
    CHECK(!srv_params_parse_s(&p, req, SRV_API_OPENAI, &s, &e), "parse: %s", e.msg);
    CHECK(p.s.temperature == 0.0f && p.s.seed == 5, "explicit fields win");
    srv_params_free(&p);
    cJSON_Delete(req);
}

int main(void) {
    RUN(utf8_valid_strings_pass);
    RUN(utf8_invalid_strings_named);
    RUN(utf8_bad_key_and_deep_path);
    RUN(server_default_sampling);
    return test_done();
}
