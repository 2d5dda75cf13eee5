/*
 * cmd_template.c — `tern template`: render a chat template, for tests and debugging.
 *
 *   tern template MODEL_DIR --messages-file FILE [--tools FILE] [--add-generation-prompt] [options]
 *   tern template --template-file T.jinja [--bos S] [--eos S] --messages-file FILE [options]
 * (--messages FILE is the same as --messages-file FILE.)
 * FILE holds a JSON array of messages, or an object {"messages": [...], "tools": [...],
 * "add_generation_prompt": bool, "enable_thinking": bool, ...} whose other members are
 * passed as extra template variables. Options: --tools FILE, --add-generation-prompt,
 * --enable-thinking 0|1, --kwargs JSON (object of extra variables), --keep-string-args,
 * --flatten-text, --raw (FILE is the complete Jinja context; no chat processing),
 * --check-bos (print "starts_with_bos=0|1" on stderr).
 * The rendered text goes to stdout byte for byte (no newline added). Exit 0 ok, 2 bad input
 * or a template error (message on stderr), 1 other failures.
 */
#include "cli.h"

#include "base/base.h"
#include "base/file.h"
#include "io/demo.h"
#include "text/chat.h"
#include "text/jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(tern_status st, const tern_error *e) {
    fprintf(stderr, "tern template: %s\n", e->msg);
    return tern_status_exit_code(st);
}

static cJSON *read_json(const char *path, tern_error *e, tern_status *st) {
    char *buf = NULL;
    size_t n = 0;
    *st = tern_file_read(path, (size_t)256 << 20, &buf, &n, e);
    if (*st) return NULL;
    cJSON *j = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!j) *st = tern_err(e, TERN_EFORMAT, "%s: invalid JSON", path);
    return j;
}

int tern_cmd_template(int argc, char **argv) {
    const char *dir = NULL, *tfile = NULL, *bos = NULL, *eos = NULL, *msgs_path = NULL, *tools_path = NULL;
    const char *kwargs = NULL;
    tern_chat_opts o = {0};
    o.enable_thinking = -1;
    bool raw = false, check_bos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--template-file") && has) tfile = argv[++i];
        else if (!strcmp(a, "--bos") && has) bos = argv[++i];
        else if (!strcmp(a, "--eos") && has) eos = argv[++i];
        else if ((!strcmp(a, "--messages-file") || !strcmp(a, "--messages")) && has) msgs_path = argv[++i];
        else if (!strcmp(a, "--tools") && has) tools_path = argv[++i];
        else if (!strcmp(a, "--kwargs") && has) kwargs = argv[++i];
        else if (!strcmp(a, "--enable-thinking") && has) o.enable_thinking = atoi(argv[++i]) != 0;
        else if (!strcmp(a, "--add-generation-prompt")) o.add_generation_prompt = true;
        else if (!strcmp(a, "--keep-string-args")) o.keep_string_args = true;
        else if (!strcmp(a, "--flatten-text")) o.flatten_text_parts = true;
        else if (!strcmp(a, "--raw")) raw = true;
        else if (!strcmp(a, "--check-bos")) check_bos = true;
        else if (a[0] != '-' && !dir) dir = a;
        else {
            fprintf(stderr, "tern template: unknown or incomplete option '%s'\n"
                            "usage: tern template MODEL_DIR|--template-file F --messages-file FILE [--tools FILE] "
                            "[--add-generation-prompt] [options]\n", a);
            return 2;
        }
    }
    if ((!dir && !tfile) || !msgs_path) {
        fprintf(stderr, "tern template: need MODEL_DIR or --template-file, and --messages-file FILE\n");
        return 2;
    }
    tern_error e = {0};
    tern_status st;
    tern_chat_template *t = NULL;
    cJSON *spec = NULL, *tools = NULL, *extra = NULL;
    char *out = NULL;
    size_t n = 0;
    int rc = 0;
    if (tfile) {
        char *src = NULL;
        size_t len = 0;
        if ((st = tern_file_read(tfile, (size_t)16 << 20, &src, &len, &e))) return fail(st, &e);
        st = tern_chat_template_from_string(src, len, bos, eos, &t, &e);
        free(src);
    } else {
        char mdir[4096]; /* MODEL may be the word `demo` */
        st = tern_model_path_resolve(dir, mdir, sizeof mdir, &e);
        if (!st) st = tern_chat_template_load(mdir, &t, &e);
    }
    if (st) return fail(st, &e);
    if (!(spec = read_json(msgs_path, &e, &st))) { rc = fail(st, &e); goto done; }
    if (raw) {
        if (!cJSON_IsObject(spec)) { fprintf(stderr, "tern template: --raw needs a JSON object\n"); rc = 2; goto done; }
        tern_jinja_template *jt = NULL;
        const char *src = tern_chat_template_source(t);
        if ((st = tern_jinja_parse(src, strlen(src), "template", &jt, &e))) { rc = fail(st, &e); goto done; }
        st = tern_jinja_render(jt, spec, NULL, &out, &n, &e);
        tern_jinja_free(jt);
        if (st) { rc = fail(st, &e); goto done; }
    } else {
        extra = cJSON_CreateObject();
        if (cJSON_IsArray(spec)) o.messages = spec;
        else if (cJSON_IsObject(spec)) {
            for (cJSON *c = spec->child; c; c = c->next) {
                if (!strcmp(c->string, "messages")) o.messages = c;
                else if (!strcmp(c->string, "tools")) o.tools = c;
                else if (!strcmp(c->string, "add_generation_prompt")) o.add_generation_prompt = cJSON_IsTrue(c);
                else if (!strcmp(c->string, "enable_thinking") && cJSON_IsBool(c)) o.enable_thinking = cJSON_IsTrue(c);
                else cJSON_AddItemToObject(extra, c->string, cJSON_Duplicate(c, 1));
            }
        }
        if (!o.messages) { fprintf(stderr, "tern template: %s: no messages array\n", msgs_path); rc = 2; goto done; }
        if (tools_path) {
            if (!(tools = read_json(tools_path, &e, &st))) { rc = fail(st, &e); goto done; }
            o.tools = tools;
        }
        if (kwargs) {
            cJSON *kw = cJSON_Parse(kwargs);
            if (!cJSON_IsObject(kw)) { cJSON_Delete(kw); fprintf(stderr, "tern template: --kwargs: not a JSON object\n"); rc = 2; goto done; }
            for (cJSON *c = kw->child; c; c = c->next) cJSON_AddItemToObject(extra, c->string, cJSON_Duplicate(c, 1));
            cJSON_Delete(kw);
        }
        o.extra = extra;
        bool sb = false;
        if ((st = tern_chat_render(t, &o, &out, &n, &sb, &e))) { rc = fail(st, &e); goto done; }
        if (check_bos) fprintf(stderr, "starts_with_bos=%d\n", sb ? 1 : 0);
    }
    if (fwrite(out, 1, n, stdout) != n) rc = 1;
    fflush(stdout);
done:
    free(out);
    cJSON_Delete(spec);
    cJSON_Delete(tools);
    cJSON_Delete(extra);
    tern_chat_template_free(t);
    return rc;
}
