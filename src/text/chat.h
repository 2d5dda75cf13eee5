/*
 * chat.h — chat templates: load a model's template and render a conversation to prompt text.
 *
 * Loading (tern_chat_template_load, model directory DIR), first found wins:
 *   1. DIR/chat_template.jinja (Gemma 4, GLM-4.7+ ship it separately);
 *   2. DIR/tokenizer_config.json "chat_template": a string, or a list of {name, template}
 *      from which "default" is taken (else the first entry).
 * bos_token / eos_token / unk_token / pad_token come from tokenizer_config.json (a string or
 * an AddedToken object {"content": ...}); they are passed to the template like transformers
 * does.
 *
 * Rendering passes: messages, tools (only when given), add_generation_prompt, the special
 * tokens, enable_thinking (only when set), then every member of `extra` (the request's
 * chat_template_kwargs; they override the above except messages/tools).
 * Message normalization (on by default, as OpenAI-style clients need):
 *   - assistant tool_calls[].function.arguments given as a JSON string is parsed into an
 *     object (templates such as Gemma 4 require a mapping); an unparsable string is kept;
 *   - with flatten_text_parts, content given as a list of only {"type":"text"} parts becomes
 *     one string (parts joined with no separator).
 *
 * The BOS rule (avoids a double BOS): templates emit their own special tokens (Gemma writes
 * `<bos>`, GLM `[gMASK]<sop>`), exactly like transformers' apply_chat_template(tokenize=True),
 * which encodes the rendered text with add_special_tokens=False. So: ALWAYS encode a rendered
 * chat prompt without the tokenizer's post-processor specials. `starts_with_bos` reports
 * whether the text begins with the BOS token text; a caller that wants a BOS for a template
 * that does not write one may add it only when this is false.
 */
#ifndef TERN_CHAT_H
#define TERN_CHAT_H

#include "base/base.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdbool.h>

typedef struct tern_chat_template tern_chat_template;

/* Load from a model directory (see above). TERN_ENOTFOUND if it has no template. */
tern_status tern_chat_template_load(const char *dir, tern_chat_template **out, tern_error *err);
/* From template text; bos/eos may be NULL (then the variables are undefined). */
tern_status tern_chat_template_from_string(const char *src, size_t len, const char *bos, const char *eos,
                                           tern_chat_template **out, tern_error *err);
void tern_chat_template_free(tern_chat_template *t);
const char *tern_chat_template_source(const tern_chat_template *t); /* template text */
const char *tern_chat_template_bos(const tern_chat_template *t);    /* "" when unknown */
const char *tern_chat_template_eos(const tern_chat_template *t);

typedef struct tern_chat_opts {
    const cJSON *messages;      /* array of {role, content, ...} (required) */
    const cJSON *tools;         /* array of tool definitions, or NULL */
    bool add_generation_prompt;
    int enable_thinking;        /* -1: not passed to the template; 0 / 1: false / true */
    const cJSON *extra;         /* object of extra template variables, or NULL */
    bool keep_string_args;      /* do not parse string tool-call arguments into objects */
    bool flatten_text_parts;    /* text-only content part lists -> one string */
    /* The prompt-injection guard (tokenizer.h): non-NULL = after normalization, every string
     * in messages and tools (values and object keys) is escaped with tern_tokenizer_escape, so
     * special-token text typed by a user stays text. Encode the result with
     * TERN_ENC_PARSE_SPECIAL | TERN_ENC_ESCAPED. NULL: no escaping (the output is as before). */
    const tern_tokenizer *escape_tok;
} tern_chat_opts;

/* Escape every string inside j in place (values and object keys, recursively) with
 * tern_tokenizer_escape: what tern_chat_render does with escape_tok set. */
tern_status tern_chat_escape_json(cJSON *j, const tern_tokenizer *tok, tern_error *err);

/* Render. *out is malloc'd (free()); *starts_with_bos may be NULL. Template errors (including
 * raise_exception) are TERN_EINVAL with the template's message: answer them as HTTP 400. */
tern_status tern_chat_render(const tern_chat_template *t, const tern_chat_opts *o, char **out, size_t *out_len,
                             bool *starts_with_bos, tern_error *err);

#endif
