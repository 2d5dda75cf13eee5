/*
 * bench_tokenizer.c — tokenizer encode speed without process start-up, for
 * bench/tokenizer_speed.mjs (which runs HF `tokenizers` on the same text in the same run).
 *
 *   build/bench_tokenizer MODEL_DIR|tokenizer.json TEXTS.jsonl [--reps N] [--threads T] [--no-special]
 *
 * TEXTS.jsonl holds one JSON string per line; all are read into memory first, then each
 * repetition encodes every string with tern_tokenizer_encode (add_special unless
 * --no-special, special-token text parsed as HF encode does). With --threads T the strings are
 * dealt round-robin to T threads (like HF encodeBatch's thread pool). Prints one JSON line:
 * {"bytes", "texts", "tokens", "load_s", "rep_s": [...], "best_s", "mb_s", "tok_s"}; best_s is
 * the fastest repetition (the word cache is warm after the first, as HF's BPE cache is).
 * Exit 2 on bad arguments or files.
 */
#include "base/base.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const tern_tokenizer *tok;
    char **s;
    size_t *len, n, tokens;
    int t, nt, add_special, failed;
} job;

static void *work(void *p) {
    job *j = p;
    tern_error e = {0};
    for (size_t i = (size_t)j->t; i < j->n; i += (size_t)j->nt) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tern_tokenizer_encode(j->tok, j->s[i], j->len[i], j->add_special, 1, &ids, &n, &e)) {
            fprintf(stderr, "bench_tokenizer: text %zu: %s\n", i, e.msg);
            j->failed = 1;
            return NULL;
        }
        j->tokens += n;
        free(ids);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *model = NULL, *path = NULL;
    int reps = 3, threads = 1, add_special = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-special")) add_special = 0;
        else if (!model) model = argv[i];
        else if (!path) path = argv[i];
        else { fprintf(stderr, "bench_tokenizer: unexpected argument '%s'\n", argv[i]); return 2; }
    }
    if (!model || !path || reps < 1 || reps > 100 || threads < 1 || threads > 256) {
        fprintf(stderr, "usage: bench_tokenizer MODEL_DIR TEXTS.jsonl [--reps N] [--threads T] [--no-special]\n");
        return 2;
    }
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "bench_tokenizer: %s: cannot open\n", path); return 2; }
    size_t n = 0, cap = 0, bytes = 0;
    char **s = NULL, *line = NULL;
    size_t *len = NULL, lcap = 0;
    ssize_t ll;
    while ((ll = getline(&line, &lcap, f)) >= 0) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)ll);
        if (!cJSON_IsString(j)) { fprintf(stderr, "bench_tokenizer: %s:%zu: not a JSON string\n", path, n + 1); return 2; }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            s = realloc(s, cap * sizeof *s);
            len = realloc(len, cap * sizeof *len);
            if (!s || !len) return 1;
        }
        len[n] = strlen(j->valuestring);
        s[n] = strdup(j->valuestring);
        bytes += len[n++];
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    tern_tokenizer *tok = NULL;
    tern_error e = {0};
    double t0 = tern_time_s();
    if (tern_tokenizer_load(&tok, model, &e)) { fprintf(stderr, "bench_tokenizer: %s\n", e.msg); return 2; }
    double load_s = tern_time_s() - t0, best = 1e30, rep_s[100];
    size_t tokens = 0;
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    for (int r = 0; r < reps; r++) {
        t0 = tern_time_s();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (job){.tok = tok, .s = s, .len = len, .n = n, .t = t, .nt = threads, .add_special = add_special};
            if (threads > 1) pthread_create(&th[t], NULL, work, &jobs[t]);
        }
        if (threads == 1) work(&jobs[0]);
        else for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        rep_s[r] = tern_time_s() - t0;
        tokens = 0;
        for (int t = 0; t < threads; t++) {
            if (jobs[t].failed) return 1;
            tokens += jobs[t].tokens;
        }
        if (rep_s[r] < best) best = rep_s[r];
    }
    printf("{\"bytes\": %zu, \"texts\": %zu, \"tokens\": %zu, \"threads\": %d, \"load_s\": %.4f, \"rep_s\": [", bytes, n, tokens,
           threads, load_s);
    for (int r = 0; r < reps; r++) printf("%s%.4f", r ? ", " : "", rep_s[r]);
    printf("], \"best_s\": %.4f, \"mb_s\": %.3f, \"tok_s\": %.0f}\n", best, bytes / best / 1e6, tokens / best);
    for (size_t i = 0; i < n; i++) free(s[i]);
    free(s);
    free(len);
    free(jobs);
    free(th);
    tern_tokenizer_free(tok);
    return 0;
}
