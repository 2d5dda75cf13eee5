/*
 * fuzz_chat.c — libFuzzer target for a chat request's conversation rendered to prompt text
 * (text/chat.c tern_chat_render): the messages, tools and chat_template_kwargs a client sends go
 * through message normalization (string tool-call arguments parsed into objects, text-part lists
 * flattened) and then a template that walks them the way model templates do.
 *
 * Input: byte 0 selects the options (flatten, keep string arguments, generation prompt, thinking
 * -1/0/1); the rest is parsed as JSON: an object's "messages", "tools" and "extra" members, or an array
 * taken as the messages. Every render either succeeds with text that is NUL-terminated at its length,
 * or fails with a message (HTTP 400 in the server).
 */
#include "text/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a template of our own in the usual shape: system first, content as a string or a list of parts, assistant
 * tool calls with mapping arguments, tool results, tools rendered as JSON, kwargs read */
static const char k_tmpl[] =
    "{{ bos_token }}{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant', 'tool', 'developer'] %}"
    "{{ raise_exception('unknown role ' ~ m.role) }}{% endif %}"
    "<{{ m.role }}>"
    "{% if m.content is string %}{{ m.content | trim }}"
    "{% elif m.content is iterable %}{% for p in m.content %}"
    "{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' or p.type == 'image_url' %}<img>"
    "{% else %}[{{ p.type }}]{% endif %}{% endfor %}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{% set f = c.function if c.function is defined else c %}"
    "<call name=\"{{ f.name }}\">{% if f.arguments is mapping %}{% for k, v in f.arguments | items %}"
    "{{ k }}={{ v | tojson }};{% endfor %}{% else %}{{ f.arguments }}{% endif %}</call>{% endfor %}{% endif %}"
    "{% if m.role == 'tool' and m.tool_call_id %} id={{ m.tool_call_id }}{% endif %}"
    "</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}{% if lang is defined %}[{{ lang }}]{% endif %}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tern_chat_template *t;
    tern_error err;
    err.msg[0] = 0;
    if (!t && tern_chat_template_from_string(k_tmpl, sizeof k_tmpl - 1, "<s>", "</s>", &t, &err) != TERN_OK)
        __builtin_trap();
    if (size < 1) return 0;
    const int sel = data[0];
    cJSON *j = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!j) return 0;
    const cJSON *msgs = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *tools = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "tools") : NULL;
    const cJSON *extra = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "extra") : NULL;
    tern_chat_opts o = {0};
    o.messages = msgs;
    o.tools = tools;
    o.extra = extra;
    o.flatten_text_parts = sel & 1;
    o.keep_string_args = (sel & 2) != 0;
    o.add_generation_prompt = (sel & 4) != 0;
    o.enable_thinking = ((sel >> 3) % 3) - 1;
    char *out = NULL;
    size_t n = 0;
    bool bos = false;
    if (tern_chat_render(t, &o, &out, &n, &bos, &err) == TERN_OK) {
        if (!out || strlen(out) > n || out[n] != 0) __builtin_trap();
    } else if (!err.msg[0]) {
        __builtin_trap();
    }
    free(out);
    cJSON_Delete(j);
    return 0;
}
