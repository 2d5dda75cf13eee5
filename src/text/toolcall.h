/*
 * toolcall.h — streaming parser that splits model output text into content, reasoning and
 * tool calls.
 *
 * Formats (exact markup from the models' chat templates / tokenizer configs):
 *   TOOLS_JSON   <tool_call>{"name": N, "arguments": {...}}</tool_call>         (Qwen, Hermes)
 *   TOOLS_GLM    <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
 *                (GLM-4.5+; newlines between the parts allowed as GLM-4.6 writes them). V is
 *                raw text for strings, JSON otherwise.
 *   TOOLS_GEMMA4 <|tool_call>call:N{k:v,...}<tool_call|>  with Gemma's value syntax: strings
 *                <|"|>…<|"|>, bare keys, numbers / true / false / null, nested {…} and […].
 *   REASON_THINK   <think>…</think>                 (Qwen3, GLM)
 *   REASON_GEMMA4  <|channel>thought\n…<channel|>     (Gemma 4 thinking channel)
 * Markers must arrive as text (decode special tokens for these formats).
 *
 * Streaming: feed text deltas of any size (a marker may be split across deltas); each feed
 * returns the content and reasoning text that is certain, holding back only a suffix that
 * could still become a marker. Tool markup is withheld until its closing marker; then the
 * call is parsed into a name and a JSON object string. Markup that fails to parse is given
 * back as content (never lost). `finish` flushes held-back text (an unterminated tool call
 * becomes content). After a tool call, whitespace-only content is dropped.
 * Values without a schema: GLM and Gemma bare values that parse as JSON keep their JSON type,
 * anything else is a string; with tools set (tern_out_parser_set_tools), a parameter whose
 * schema type is "string" always stays a string.
 */
#ifndef TERN_TOOLCALL_H
#define TERN_TOOLCALL_H

#include "base/base.h"

#include <cjson/cJSON.h>
#include <stdbool.h>

typedef enum { TERN_TOOLS_NONE, TERN_TOOLS_JSON, TERN_TOOLS_GLM, TERN_TOOLS_GEMMA4 } tern_tools_format;
typedef enum { TERN_REASON_NONE, TERN_REASON_THINK, TERN_REASON_GEMMA4 } tern_reason_format;

/* Guess both formats from a chat template's source text (markers it writes). */
void tern_output_formats_detect(const char *template_src, tern_tools_format *tools, tern_reason_format *reason);

typedef struct tern_tool_call {
    char *name;
    char *arguments; /* JSON object text, e.g. {"city":"Paris","days":2} */
} tern_tool_call;

typedef struct tern_out_delta {
    const char *content;   /* new content text (not NUL-terminated; valid until the next call) */
    size_t content_len;
    const char *reasoning; /* new reasoning text */
    size_t reasoning_len;
    size_t calls_before;   /* tool calls completed before this call ...               */
    size_t calls_after;    /* ... and after it: calls [calls_before, calls_after) are new */
} tern_out_delta;

typedef struct tern_out_parser tern_out_parser;

/* start_in_reasoning: the prompt ended inside an open reasoning block (e.g. "<think>"). */
tern_status tern_out_parser_new(tern_tools_format tools, tern_reason_format reason, bool start_in_reasoning,
                                tern_out_parser **out, tern_error *err);
void tern_out_parser_free(tern_out_parser *p);
/* Optional: the request's tools array (OpenAI form), used for schema-aware value types. */
void tern_out_parser_set_tools(tern_out_parser *p, const cJSON *tools);
tern_status tern_out_parser_feed(tern_out_parser *p, const char *text, size_t n, tern_out_delta *d, tern_error *err);
tern_status tern_out_parser_finish(tern_out_parser *p, tern_out_delta *d, tern_error *err);
size_t tern_out_parser_n_calls(const tern_out_parser *p);
const tern_tool_call *tern_out_parser_call(const tern_out_parser *p, size_t i);
bool tern_out_parser_in_reasoning(const tern_out_parser *p);

/* One-shot helpers (also used by the streaming parser): parse one tool-call body, i.e. the
 * text between the markers. *name and *args_json are malloc'd. TERN_EFORMAT if malformed. */
tern_status tern_toolcall_parse_body(tern_tools_format f, const char *body, size_t n, const cJSON *tools,
                                     char **name, char **args_json, tern_error *err);

#endif
