/*
 * fuzz_jinja.c — libFuzzer target for chat templates (tokenizer_config.json "chat_template",
 * chat_template.jinja), which come from model directories and are therefore untrusted input.
 *
 * The input is parsed as a template; a template that parses is rendered with a small chat
 * context (messages of each role, tools, bos_token, add_generation_prompt) under tight limits
 * so one input stays fast. Either call may fail, but a failure must carry a message, and a
 * success must give a NUL-terminated string of the stated length within the output limit.
 */
#include "text/jinja.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cJSON *fuzz_ctx(void) {
    static const char *k = "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                           "{\"role\":\"user\",\"content\":\"hi <b> \\u00e9\"},"
                           "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\","
                           "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1,\"y\":[1.5,null,true]}}}]},"
                           "{\"role\":\"tool\",\"content\":\"42\"}],"
                           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
                           "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true}";
    return cJSON_Parse(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static cJSON *ctx;
    if (!ctx) ctx = fuzz_ctx();
    tern_error err;
    err.msg[0] = 0;
    tern_jinja_template *t = NULL;
    if (tern_jinja_parse((const char *)data, size, "fuzz.jinja", &t, &err) != TERN_OK) {
        if (err.msg[0] == 0 || t) __builtin_trap();
        return 0;
    }
    const tern_jinja_limits lim = {1u << 20, 64u << 20, 200000, 64};
    char *out = NULL;
    size_t n = 0;
    err.msg[0] = 0;
    if (tern_jinja_render(t, ctx, &lim, &out, &n, &err) == TERN_OK) {
        if (!out || out[n] != 0 || n > lim.max_output) __builtin_trap(); /* the text may hold NULs */
    } else if (err.msg[0] == 0) {
        __builtin_trap();
    }
    free(out);
    tern_jinja_free(t);
    return 0;
}
