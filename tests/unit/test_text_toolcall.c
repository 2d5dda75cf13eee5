/*
 * test_text_toolcall.c — the output parser: Gemma 4, GLM and JSON (Qwen/Hermes) tool calls,
 * <think> and Gemma channel reasoning, fed whole and one byte at a time (markers split
 * across deltas), malformed markup falling back to content, schema-aware string values,
 * and format detection from template text.
 */
#include "test.h"

#include "text/toolcall.h"

#include <stdbool.h>

typedef struct collected { char content[2048], reasoning[2048]; size_t nc, nr; } collected;

static void add(collected *c, const tern_out_delta *d) {
    memcpy(c->content + c->nc, d->content, d->content_len);
    c->nc += d->content_len;
    c->content[c->nc] = 0;
    memcpy(c->reasoning + c->nr, d->reasoning, d->reasoning_len);
    c->nr += d->reasoning_len;
    c->reasoning[c->nr] = 0;
}

/* Parse `text` with chunk size `chunk` (0 = all at once). */
static tern_out_parser *parse(tern_tools_format tf, tern_reason_format rf, bool start_reason, const char *text,
                              size_t chunk, collected *c, const cJSON *tools) {
    tern_out_parser *p = NULL;
    tern_error e = {0};
    memset(c, 0, sizeof *c);
    if (tern_out_parser_new(tf, rf, start_reason, &p, &e)) return NULL;
    tern_out_parser_set_tools(p, tools);
    size_t n = strlen(text), step = chunk ? chunk : n;
    tern_out_delta d;
    for (size_t i = 0; i < n; i += step) {
        size_t k = i + step > n ? n - i : step;
        tern_out_parser_feed(p, text + i, k, &d, &e);
        add(c, &d);
    }
    tern_out_parser_finish(p, &d, &e);
    add(c, &d);
    return p;
}

static bool call_is(const tern_out_parser *p, size_t i, const char *name, const char *args) {
    const tern_tool_call *c = tern_out_parser_call(p, i);
    if (!c) { printf("  no call %zu\n", i); return false; }
    if (strcmp(c->name, name) || strcmp(c->arguments, args)) {
        printf("  call %zu = %s %s, want %s %s\n", i, c->name, c->arguments, name, args);
        return false;
    }
    return true;
}

static const size_t k_chunks[] = {0, 1, 2, 3, 7};

TEST(gemma4_calls_and_channel) {
    const char *out = "<|channel>thought\nLet me check.<channel|>Sure.<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,"
                      "days:2,opts:{metric:true,tags:[<|\"|>a<|\"|>,1.5]},note:null}<tool_call|>"
                      "<|tool_call>call:search{q:<|\"|>{not json}<|\"|>}<tool_call|>";
    for (size_t k = 0; k < TERN_ARRAY_LEN(k_chunks); k++) {
        collected c;
        tern_out_parser *p = parse(TERN_TOOLS_GEMMA4, TERN_REASON_GEMMA4, false, out, k_chunks[k], &c, NULL);
        CHECK(p != NULL, "new failed");
        CHECK(!strcmp(c.reasoning, "Let me check."), "chunk %zu reasoning [%s]", k_chunks[k], c.reasoning);
        CHECK(!strcmp(c.content, "Sure."), "chunk %zu content [%s]", k_chunks[k], c.content);
        CHECK(tern_out_parser_n_calls(p) == 2, "chunk %zu: %zu calls", k_chunks[k], tern_out_parser_n_calls(p));
        CHECK(call_is(p, 0, "get_weather", "{\"city\":\"Paris, FR\",\"days\":2,\"opts\":{\"metric\":true,\"tags\":[\"a\",1.5]},\"note\":null}"), "call 0");
        CHECK(call_is(p, 1, "search", "{\"q\":\"{not json}\"}"), "call 1");
        tern_out_parser_free(p);
    }
}

TEST(glm_calls_and_think) {
    /* GLM-4.7 style (no newlines) and GLM-4.6 style (newlines between parts) */
    const char *out = "plan</think>Checking.<tool_call>get_weather<arg_key>location</arg_key><arg_value>Tokyo</arg_value>"
                      "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
                      "<tool_call>lookup\n<arg_key>id</arg_key>\n<arg_value>007</arg_value>\n<arg_key>filter</arg_key>\n"
                      "<arg_value>{\"a\": [1, 2]}</arg_value>\n</tool_call>";
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"id\":{\"type\":\"string\"},\"filter\":{\"type\":\"object\"}}}}}]");
    for (size_t k = 0; k < TERN_ARRAY_LEN(k_chunks); k++) {
        collected c;
        tern_out_parser *p = parse(TERN_TOOLS_GLM, TERN_REASON_THINK, true, out, k_chunks[k], &c, tools);
        CHECK(!strcmp(c.reasoning, "plan"), "reasoning [%s]", c.reasoning);
        CHECK(!strcmp(c.content, "Checking."), "chunk %zu content [%s]", k_chunks[k], c.content);
        CHECK(tern_out_parser_n_calls(p) == 2, "%zu calls", tern_out_parser_n_calls(p));
        CHECK(call_is(p, 0, "get_weather", "{\"location\":\"Tokyo\",\"days\":3}"), "call 0");
        CHECK(call_is(p, 1, "lookup", "{\"id\":\"007\",\"filter\":{\"a\":[1,2]}}"), "call 1 (schema keeps id a string)");
        tern_out_parser_free(p);
    }
    cJSON_Delete(tools);
}

TEST(json_calls_qwen) {
    const char *out = "<think>\nhmm\n</think>\n\nOK.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>";
    for (size_t k = 0; k < TERN_ARRAY_LEN(k_chunks); k++) {
        collected c;
        tern_out_parser *p = parse(TERN_TOOLS_JSON, TERN_REASON_THINK, false, out, k_chunks[k], &c, NULL);
        CHECK(!strcmp(c.reasoning, "\nhmm\n"), "reasoning [%s]", c.reasoning);
        CHECK(!strcmp(c.content, "\n\nOK.\n"), "content [%s]", c.content);
        CHECK(tern_out_parser_n_calls(p) == 2, "%zu calls", tern_out_parser_n_calls(p));
        CHECK(call_is(p, 0, "get_weather", "{\"city\":\"Paris\"}"), "call 0");
        CHECK(call_is(p, 1, "f", "{\"x\":1}"), "call 1");
        tern_out_parser_free(p);
    }
}

TEST(malformed_markup_becomes_content) {
    collected c;
    tern_out_parser *p = parse(TERN_TOOLS_JSON, TERN_REASON_NONE, false, "a<tool_call>{broken</tool_call>b", 1, &c, NULL);
    CHECK(tern_out_parser_n_calls(p) == 0, "a call was produced");
    CHECK(!strcmp(c.content, "a<tool_call>{broken</tool_call>b"), "content [%s]", c.content);
    tern_out_parser_free(p);
    p = parse(TERN_TOOLS_GEMMA4, TERN_REASON_NONE, false, "x<|tool_call>call:f{a:", 2, &c, NULL);
    CHECK(!strcmp(c.content, "x<|tool_call>call:f{a:"), "unterminated: [%s]", c.content);
    tern_out_parser_free(p);
    p = parse(TERN_TOOLS_GLM, TERN_REASON_NONE, false, "<tool_call>f<arg_key>k</arg_key></tool_call>", 0, &c, NULL);
    CHECK(tern_out_parser_n_calls(p) == 0 && strstr(c.content, "<arg_key>k"), "glm malformed: [%s]", c.content);
    tern_out_parser_free(p);
    /* partial marker at the end that never completes is flushed as content */
    p = parse(TERN_TOOLS_JSON, TERN_REASON_THINK, false, "text <tool_ca", 1, &c, NULL);
    CHECK(!strcmp(c.content, "text <tool_ca"), "flush: [%s]", c.content);
    tern_out_parser_free(p);
}

TEST(holdback_is_minimal) {
    tern_out_parser *p = NULL;
    tern_error e = {0};
    tern_out_parser_new(TERN_TOOLS_JSON, TERN_REASON_THINK, false, &p, &e);
    tern_out_delta d;
    tern_out_parser_feed(p, "Hello <", 7, &d, &e);
    CHECK(d.content_len == 6 && !memcmp(d.content, "Hello ", 6), "emitted [%.*s]", (int)d.content_len, d.content);
    tern_out_parser_feed(p, "b>", 2, &d, &e);
    CHECK(d.content_len == 3 && !memcmp(d.content, "<b>", 3), "emitted [%.*s]", (int)d.content_len, d.content);
    tern_out_parser_free(p);
    CHECK(tern_out_parser_new((tern_tools_format)9, TERN_REASON_NONE, false, &p, &e) == TERN_EINVAL, "bad format accepted");
    tern_out_parser_free(NULL);
}

TEST(detect_formats) {
    tern_tools_format t;
    tern_reason_format r;
    tern_output_formats_detect("{{ '<|tool_call>call:' }}{{ '<|channel>thought' }}", &t, &r);
    CHECK(t == TERN_TOOLS_GEMMA4 && r == TERN_REASON_GEMMA4, "gemma4 %d %d", t, r);
    tern_output_formats_detect("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><think></think>", &t, &r);
    CHECK(t == TERN_TOOLS_GLM && r == TERN_REASON_THINK, "glm %d %d", t, r);
    tern_output_formats_detect("<tool_call>\\n{\"name\": <think>", &t, &r);
    CHECK(t == TERN_TOOLS_JSON && r == TERN_REASON_THINK, "qwen %d %d", t, r);
    tern_output_formats_detect("{{ bos_token }}<start_of_turn>", &t, &r);
    CHECK(t == TERN_TOOLS_NONE && r == TERN_REASON_NONE, "gemma3 %d %d", t, r);
}

int main(void) {
    RUN(gemma4_calls_and_channel);
    RUN(glm_calls_and_think);
    RUN(json_calls_qwen);
    RUN(malformed_markup_becomes_content);
    RUN(holdback_is_minimal);
    RUN(detect_formats);
    return test_done();
}
