/*
 * jinja.h — a small Jinja2 interpreter for chat templates.
 *
 * Chat templates (tokenizer_config.json "chat_template", chat_template.jinja) are Jinja2
 * programs. This module parses one into an AST once (tern_jinja_parse) and renders it many
 * times (tern_jinja_render) with a context given as a cJSON object, so the server can pass
 * request JSON straight in. Semantics follow what Hugging Face transformers uses:
 * Jinja2 with trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, a `tojson`
 * equal to Python json.dumps(ensure_ascii=False), the globals raise_exception(msg),
 * strftime_now(fmt), range, namespace, dict, and the loopcontrols / generation extensions.
 * Output of non-strings is Python str() (True/None/1.0/[1, 'a']).
 *
 * Numbers from cJSON: cJSON does not keep int vs float, so a JSON number with an integral
 * value of magnitude < 2^53 becomes an int (1.0 renders as 1). Everything else is a float.
 *
 * A parsed template is immutable: several threads may render it at once. A render never
 * aborts: syntax errors, raise_exception, undefined operations and exceeded limits
 * (recursion depth, output size, loop iterations, memory) come back as a tern_status with a
 * message ("template:LINE: ..."). raise_exception gives TERN_EINVAL with the template's own
 * message, so a server can answer 400 with it.
 */
#ifndef TERN_JINJA_H
#define TERN_JINJA_H

#include "base/base.h"

#include <cjson/cJSON.h>

typedef struct tern_jinja_template tern_jinja_template;

typedef struct tern_jinja_limits {
    size_t max_output;     /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;     /* bytes of scratch memory per render (default 512 MiB) */
    uint64_t max_steps;    /* loop iterations + macro calls per render (default 10,000,000) */
    int max_depth;         /* macro-call / expression recursion depth (default 200) */
} tern_jinja_limits;

/* Parse template text (len bytes; need not be NUL-terminated). `name` is used in messages. */
tern_status tern_jinja_parse(const char *src, size_t len, const char *name, tern_jinja_template **out,
                             tern_error *err);
void tern_jinja_free(tern_jinja_template *t);

/* Render with `ctx` (a JSON object whose members become template variables; NULL = empty).
 * On success *out is a NUL-terminated malloc'd string (free with free()), *out_len its length.
 * limits may be NULL for the defaults. */
tern_status tern_jinja_render(const tern_jinja_template *t, const cJSON *ctx, const tern_jinja_limits *limits,
                              char **out, size_t *out_len, tern_error *err);

/* Python json.dumps(v, ensure_ascii=False) of a cJSON value (", " / ": " separators), with
 * the same int rule as above. malloc'd; NULL on allocation failure. */
char *tern_jinja_tojson(const cJSON *v);

#endif
