/*
 * fuzz_toolcall.c — libFuzzer target for the output parser (text/toolcall.c): what a model writes is
 * arbitrary (a random-weight model, a jailbroken one, a prompt that quotes markup), and the server
 * feeds it to this parser while streaming, so it must never crash, hang or lose its invariants.
 *
 * Input: byte 0 picks the formats (tools 0..3, reasoning 0..2), whether the prompt ended inside a
 * reasoning block and whether the request's tools (a fixed schema) are set; byte 1 seeds how the rest is
 * cut into deltas (1..16 bytes, as a detokenizer hands them out). Checked: every delta's pointers are
 * set where its lengths are not zero, the call counts only grow and end at n_calls, every finished call
 * has a name and arguments that parse as a JSON object; the one-shot body parser on the whole text, for
 * every format, either fails with a message or gives the same kind of result.
 */
#include "text/toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":\"object\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"x\",\"parameters\":{\"properties\":{\"a\":{\"type\":\"string\"}}}}}]";

static void check_call(const tern_tool_call *c) {
    if (!c || !c->name || !c->arguments) __builtin_trap();
    cJSON *j = cJSON_Parse(c->arguments);
    if (!j || !cJSON_IsObject(j)) __builtin_trap();
    cJSON_Delete(j);
}

static void check_delta(const tern_out_delta *d, size_t *calls, const tern_out_parser *p) {
    if ((d->content_len && !d->content) || (d->reasoning_len && !d->reasoning)) __builtin_trap();
    if (d->content_len) (void)memchr(d->content, 0, d->content_len); /* readable (ASan) */
    if (d->reasoning_len) (void)memchr(d->reasoning, 0, d->reasoning_len);
    if (d->calls_before != *calls || d->calls_after < d->calls_before || d->calls_after != tern_out_parser_n_calls(p))
        __builtin_trap();
    for (size_t i = d->calls_before; i < d->calls_after; i++) check_call(tern_out_parser_call(p, i));
    *calls = d->calls_after;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int sel = data[0];
    uint32_t seed = data[1] * 2654435761u + 1;
    const char *text = (const char *)data + 2;
    const size_t n = size - 2;
    cJSON *tools = (sel & 0x40) ? cJSON_Parse(k_tools) : NULL;

    tern_out_parser *p = NULL;
    tern_error err;
    err.msg[0] = 0;
    if (tern_out_parser_new((tern_tools_format)(sel & 3), (tern_reason_format)((sel >> 2) % 3), (sel & 0x20) != 0, &p,
                            &err) != TERN_OK) {
        if ((sel & 3) <= TERN_TOOLS_GEMMA4 && ((sel >> 2) % 3) <= TERN_REASON_GEMMA4) __builtin_trap();
        cJSON_Delete(tools);
        return 0;
    }
    if (tools) tern_out_parser_set_tools(p, tools);
    size_t calls = 0, off = 0;
    tern_out_delta d;
    while (off < n) {
        seed = seed * 1103515245u + 12345u;
        size_t k = 1 + (seed >> 16) % 16;
        if (k > n - off) k = n - off;
        memset(&d, 0, sizeof d);
        if (tern_out_parser_feed(p, text + off, k, &d, &err) != TERN_OK) {
            if (!err.msg[0]) __builtin_trap();
            goto done;
        }
        check_delta(&d, &calls, p);
        (void)tern_out_parser_in_reasoning(p);
        off += k;
    }
    memset(&d, 0, sizeof d);
    if (tern_out_parser_finish(p, &d, &err) == TERN_OK) check_delta(&d, &calls, p);
    else if (!err.msg[0]) __builtin_trap();
done:
    tern_out_parser_free(p);

    for (int f = TERN_TOOLS_JSON; f <= TERN_TOOLS_GEMMA4; f++) {
        char *name = NULL, *args = NULL;
        err.msg[0] = 0;
        if (tern_toolcall_parse_body((tern_tools_format)f, text, n, tools, &name, &args, &err) == TERN_OK) {
            const tern_tool_call c = {name, args};
            check_call(&c);
        } else if (!err.msg[0]) {
            __builtin_trap();
        }
        free(name);
        free(args);
    }
    cJSON_Delete(tools);
    return 0;
}
