/*
 * test_api_example.c — the engine API end to end, using nothing but include/tern.h.
 * It doubles as the manual's example: open the embedded demo model, tokenize a prompt,
 * run the engine on its own thread, submit one request from the main thread, collect the
 * streamed tokens in the callback (which runs on the engine thread, so it only copies and
 * signals), wait for DONE, then detokenize.
 *
 * Test harness (bottom): points TERN_CACHE at a scratch directory so the demo model is not
 * written into the user's cache, and checks what the example printed.
 */
#include "tern.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the callback shares with the main thread. */
typedef struct stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[64];
    int n, done;
    tern_event last;                 /* the DONE / ERROR event (its err pointer is not kept) */
    char err[TERN_ERROR_MSG_MAX];
} stream;

static int on_event(void *ctx, const tern_event *ev) {
    stream *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (ev->kind == TERN_EV_TOKEN) {
        if (s->n < 64) s->tokens[s->n++] = ev->token;
    } else {
        s->last = *ev;
        if (ev->kind == TERN_EV_ERROR) snprintf(s->err, sizeof s->err, "%s", ev->err->msg);
        s->done = 1;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;                        /* 1 would cancel the request, 2 would stop it */
}

static void *engine_main(void *e) {
    tern_engine_run(e);              /* steps until tern_engine_stop; sleeps when idle */
    return NULL;
}

/* Returns 0 on success; fills `text` with the generated text. */
static int example(char *text, size_t cap, tern_engine_stats *stats_out) {
    tern_error err = {0};
    tern_engine_opts o = tern_engine_default_opts();
    o.model = "demo";                /* or a Hugging Face model directory */
    o.device = "cpu";
    o.n_threads = 2;
    o.max_concurrency = 4;
    tern_engine *e = NULL;
    if (tern_engine_open(&e, &o, &err)) { fprintf(stderr, "open: %s\n", err.msg); return 1; }

    tern_model_info info;
    tern_engine_model_info(e, &info);
    printf("model %s (%s): vocab %d, context %d, tokenizer %d\n", info.name, info.arch, info.n_vocab, info.n_ctx,
           info.has_tokenizer);

    int32_t *prompt = NULL;
    int n_prompt = 0;
    const char *msg = "Hello, tern!";
    if (tern_engine_tokenize(e, msg, strlen(msg), 1, &prompt, &n_prompt, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        tern_engine_close(e);
        return 1;
    }

    pthread_t th;
    pthread_create(&th, NULL, engine_main, e);

    stream s = {.n = 0};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    tern_request r = tern_request_default();
    r.prompt = prompt;               /* copied by submit */
    r.n_prompt = n_prompt;
    r.max_tokens = 16;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 1234;          /* same seed -> same text, whatever else is running */
    r.ignore_eos = 1;
    r.on_event = on_event;
    r.ctx = &s;
    uint64_t id = 0;
    int rc = 0;
    if (tern_engine_submit(e, &r, &id, &err)) { fprintf(stderr, "submit: %s\n", err.msg); rc = 1; }
    free(prompt);

    pthread_mutex_lock(&s.mu);
    while (!rc && !s.done) pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);

    tern_engine_stop(e);
    pthread_join(th, NULL);
    tern_engine_get_stats(e, stats_out);   /* thread-safe; here after the last step */

    if (!rc && s.last.kind == TERN_EV_ERROR) { fprintf(stderr, "request failed: %s\n", s.err); rc = 1; }
    if (!rc) {
        char *out = NULL;
        if (tern_engine_detokenize(e, s.tokens, s.n, &out, &err)) { fprintf(stderr, "detokenize: %s\n", err.msg); rc = 1; }
        else {
            printf("request %llu: %d prompt + %d generated tokens, first token after %.3f s, total %.3f s\n",
                   (unsigned long long)id, s.last.n_prompt, s.last.n_generated, s.last.t_first_token, s.last.t_total);
            snprintf(text, cap, "%s", out);
            free(out);
        }
    }
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    tern_engine_close(e);
    return rc;
}

/* ---- test harness ------------------------------------------------------------------ */

int main(void) {
    char dir[] = "/tmp/tern_api_XXXXXX";
    const char *pre = getenv("TERN_CACHE");
    if (!pre || !*pre) {
        if (!mkdtemp(dir)) { printf("FAIL: api_example: mkdtemp\n"); return 1; }
        setenv("TERN_CACHE", dir, 1);
    }
    char text[1024] = "";
    tern_engine_stats st;
    memset(&st, 0, sizeof st);
    int rc = example(text, sizeof text, &st);
    if (!pre || !*pre) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) {}
    }
    if (rc) { printf("FAIL: api_example\n"); return 1; }
    printf("text: \"%s\"\n", text);
    int ok = st.requests_done == 1 && st.generated_tokens == 16 && st.kv_blocks_used == 0;
    printf("%s: api_example\n", ok ? "PASS" : "FAIL");
    if (!ok) printf("  stats: done %lld generated %lld kv used %d\n", st.requests_done, st.generated_tokens, st.kv_blocks_used);
    return ok ? 0 : 1;
}
