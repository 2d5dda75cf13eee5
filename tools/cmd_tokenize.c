/*
 * cmd_tokenize.c — `tern tokenize` and `tern detokenize` (DESIGN.md §7).
 *
 *   tern tokenize MODEL --text-file F      ids of the whole file, one line
 *   tern tokenize MODEL --jsonl F          one JSON string per line in → one line of ids out
 *   tern tokenize MODEL --text STR         ids of STR
 *     --no-special        do not add the post-processor's special tokens (BOS ...)
 *     --no-parse-special  special-token text in the input stays text (HF split_special_tokens)
 *     --tokens            print token strings (JSON) instead of ids
 *     --stats             load / encode timings on stderr
 *   tern detokenize MODEL --ids 1,2,3      decoded text to stdout (no newline added)
 *   tern detokenize MODEL --jsonl F        one JSON array of ids per line → one JSON string
 *     --skip-special      drop special tokens (HF skip_special_tokens)
 * MODEL is a model folder (or a folder holding only tokenizer files), or a tokenizer.json.
 * Exit: 0 ok, 2 bad input (file, arguments, JSON line) with a one-line message, 1 otherwise.
 */
#include "cli.h"
#include "base/base.h"
#include "io/demo.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(tern_status st, const char *cmd, const tern_error *e) {
    fprintf(stderr, "tern %s: %s\n", cmd, e->msg);
    return tern_status_exit_code(st);
}

/* MODEL: a directory, a tokenizer.json, or the word `demo` */
static tern_status load(tern_tokenizer **tok, const char *model, tern_error *e) {
    char dir[4096];
    tern_status st = tern_model_path_resolve(model, dir, sizeof dir, e);
    return st ? st : tern_tokenizer_load(tok, dir, e);
}

static int usage(const char *cmd) {
    if (!strcmp(cmd, "tokenize"))
        fprintf(stderr, "usage: tern tokenize MODEL (--text-file F | --jsonl F | --text STR) [--no-special] "
                        "[--no-parse-special] [--tokens] [--stats]\n");
    else
        fprintf(stderr, "usage: tern detokenize MODEL (--ids 1,2,3 | --jsonl F) [--skip-special]\n");
    return 2;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *p = realloc(b, cap *= 2);
        if (!p) { free(b); b = NULL; }
        else b = p;
    }
    fclose(f);
    *len = n;
    return b;
}

/* JSON string writer, byte-identical to JavaScript's JSON.stringify for valid UTF-8. */
static void put_json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\b') fputs("\\b", f);
        else if (c == '\f') fputs("\\f", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void print_ids(const tern_tokenizer *tok, const int32_t *ids, size_t n, int tokens) {
    if (tokens) fputc('[', stdout);
    for (size_t i = 0; i < n; i++) {
        if (tokens) {
            size_t l = 0;
            const char *s = tern_tokenizer_id_to_token(tok, ids[i], &l);
            if (i) fputc(',', stdout);
            put_json_str(stdout, s ? s : "", s ? l : 0);
        } else {
            printf(i ? " %d" : "%d", ids[i]);
        }
    }
    if (tokens) fputc(']', stdout);
    fputc('\n', stdout);
}

int tern_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text_file = NULL, *jsonl = NULL, *text = NULL;
    int add_special = 1, parse_special = 1, tokens = 0, stats = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--text-file") && i + 1 < argc) text_file = argv[++i];
        else if (!strcmp(a, "--jsonl") && i + 1 < argc) jsonl = argv[++i];
        else if (!strcmp(a, "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(a, "--no-special")) add_special = 0;
        else if (!strcmp(a, "--no-parse-special")) parse_special = 0;
        else if (!strcmp(a, "--tokens")) tokens = 1;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (a[0] != '-' && !model) model = a;
        else { fprintf(stderr, "tern tokenize: unknown or incomplete argument '%s'\n", a); return usage("tokenize"); }
    }
    if (!model || (!!text_file + !!jsonl + !!text) != 1) return usage("tokenize");
    tern_error e = {0};
    tern_tokenizer *tok = NULL;
    double t0 = tern_time_s();
    tern_status st = load(&tok, model, &e);
    if (st) return fail(st, "tokenize", &e);
    double t_load = tern_time_s() - t0, t_enc = 0;
    size_t n_in = 0, n_tok = 0, n_bytes = 0;
    int rc = 0;
    if (jsonl) {
        FILE *f = fopen(jsonl, "rb");
        if (!f) { fprintf(stderr, "tern tokenize: %s: cannot open\n", jsonl); tern_tokenizer_free(tok); return 2; }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        size_t lineno = 0;
        while ((len = getline(&line, &cap, f)) >= 0) {
            lineno++;
            cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
            if (!cJSON_IsString(j)) {
                fprintf(stderr, "tern tokenize: %s:%zu: not a JSON string\n", jsonl, lineno);
                cJSON_Delete(j);
                rc = 2;
                break;
            }
            int32_t *ids;
            size_t n;
            size_t sl = strlen(j->valuestring);
            double t1 = tern_time_s();
            st = tern_tokenizer_encode(tok, j->valuestring, sl, add_special, parse_special, &ids, &n, &e);
            t_enc += tern_time_s() - t1;
            cJSON_Delete(j);
            if (st) { rc = fail(st, "tokenize", &e); break; }
            print_ids(tok, ids, n, tokens);
            n_in++; n_tok += n; n_bytes += sl;
            free(ids);
        }
        free(line);
        fclose(f);
    } else {
        size_t len = 0;
        char *buf = text ? NULL : slurp(text_file, &len);
        if (!text && !buf) { fprintf(stderr, "tern tokenize: %s: cannot read\n", text_file); tern_tokenizer_free(tok); return 2; }
        if (text) len = strlen(text);
        int32_t *ids;
        size_t n;
        double t1 = tern_time_s();
        st = tern_tokenizer_encode(tok, text ? text : buf, len, add_special, parse_special, &ids, &n, &e);
        t_enc = tern_time_s() - t1;
        free(buf);
        if (st) rc = fail(st, "tokenize", &e);
        else { print_ids(tok, ids, n, tokens); free(ids); n_in = 1; n_tok = n; n_bytes = len; }
    }
    if (stats)
        fprintf(stderr, "load %.3f s; encoded %zu texts, %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", t_load, n_in,
                n_bytes, n_tok, t_enc, t_enc > 0 ? n_bytes / t_enc / 1e6 : 0.0);
    tern_tokenizer_free(tok);
    fflush(stdout);
    return rc;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return -1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) return -1;
        if (*n == cap) {
            int32_t *p = realloc(*ids, (cap *= 2) * sizeof *p);
            if (!p) return -1;
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return 0;
}

int tern_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL, *jsonl = NULL;
    int skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--ids") && i + 1 < argc) ids_arg = argv[++i];
        else if (!strcmp(a, "--jsonl") && i + 1 < argc) jsonl = argv[++i];
        else if (!strcmp(a, "--skip-special")) skip = 1;
        else if (a[0] != '-' && !model) model = a;
        else { fprintf(stderr, "tern detokenize: unknown or incomplete argument '%s'\n", a); return usage("detokenize"); }
    }
    if (!model || !!ids_arg + !!jsonl != 1) return usage("detokenize");
    int32_t *ids = NULL;
    size_t n = 0;
    if (ids_arg && parse_ids(ids_arg, &ids, &n)) {
        free(ids);
        fprintf(stderr, "tern detokenize: --ids '%s' is not a comma-separated list of ids\n", ids_arg);
        return 2;
    }
    tern_error e = {0};
    tern_tokenizer *tok = NULL;
    tern_status st = load(&tok, model, &e);
    if (st) { free(ids); return fail(st, "detokenize", &e); }
    int rc = 0;
    char *s;
    size_t len;
    if (ids_arg) {
        st = tern_tokenizer_decode(tok, ids, n, skip, &s, &len, &e);
        if (st) rc = fail(st, "detokenize", &e);
        else { fwrite(s, 1, len, stdout); free(s); }
    } else {
        FILE *f = fopen(jsonl, "rb");
        char *line = NULL;
        size_t cap = 0, lineno = 0;
        ssize_t ll;
        if (!f) { fprintf(stderr, "tern detokenize: %s: cannot open\n", jsonl); rc = 2; }
        while (f && (ll = getline(&line, &cap, f)) >= 0) {
            lineno++;
            cJSON *j = cJSON_ParseWithLength(line, (size_t)ll), *x;
            if (!cJSON_IsArray(j)) { fprintf(stderr, "tern detokenize: %s:%zu: not a JSON array\n", jsonl, lineno); cJSON_Delete(j); rc = 2; break; }
            n = 0;
            free(ids);
            ids = malloc(((size_t)cJSON_GetArraySize(j) + 1) * sizeof *ids);
            if (!ids) { cJSON_Delete(j); rc = 1; break; }
            cJSON_ArrayForEach(x, j) ids[n++] = cJSON_IsNumber(x) ? (int32_t)x->valuedouble : -1;
            cJSON_Delete(j);
            st = tern_tokenizer_decode(tok, ids, n, skip, &s, &len, &e);
            if (st) { rc = fail(st, "detokenize", &e); break; }
            put_json_str(stdout, s, len);
            fputc('\n', stdout);
            free(s);
        }
        free(line);
        if (f) fclose(f);
    }
    free(ids);
    tern_tokenizer_free(tok);
    fflush(stdout);
    return rc;
}
