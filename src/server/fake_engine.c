/*
 * fake_engine.c — a stand-in engine for testing the HTTP layer (`tern serve --fake-engine`).
 *
 * Tokenizer: one token per byte (id = byte + 3); 1 = BOS (added with add_special), 2 = EOS,
 * 0 = pad; ids >= 3 + 256 are "special" and decode to nothing. Decoding is lossy UTF-8 like
 * real tokenizers (a cut multi-byte character becomes U+FFFD), so the server's incremental
 * detokenizer sees the same hazards as with a real model.
 * A real tern_tokenizer with the same ids (byte-level BPE without merges) backs the streaming
 * detokenizer and the JSON masks.
 * Generation: every request answers the fixed reply below byte by byte (it contains
 * multi-byte characters) — or, when the prompt contains "@@reply:TEXT@@", TEXT (the last
 * such script; tests use it to script tool calls and reasoning) — then EOS (finish STOP); with ignore_eos the reply repeats until
 * max_tokens (finish LENGTH). Logprobs: -0.5 for the chosen token, alternatives id+1.. with
 * -1, -2, ... One step emits one token for each running request (up to max_concurrency), runs
 * the server's after_step, then sleeps TERN_FAKE_DELAY_MS (default 2) milliseconds (0: no
 * sleep; 1 gives GPU-like step rates for measuring the server's own per-token cost). A request with a mask callback gets
 * logits preferring its next scripted byte; when the mask forbids it, EOS if allowed, else
 * the smallest allowed id. Sleeps so cancellation and concurrency behave
 * like a real engine. Events are delivered on the engine thread like the real engine does.
 */
#include "io/demo.h"
#include "server/srv.h"
#include "text/tokenizer.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE_VOCAB 300
static const char k_reply[] = "Hello from tern! The quick brown fox jumps over the lazy dog. \xC3\xA9t\xC3\xA9 \xE2\x9C\x93 done.";

typedef struct fake_req {
    struct fake_req *next;
    char *reply;                  /* scripted reply, NULL = k_reply */
    int reply_len;
    uint64_t id;
    tern_request r;
    int n_prompt, n_gen, pos;
    int cancelled;
    double t0;
} fake_req;

typedef struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fake_req *head;
    int stop, running;
    uint64_t next_id;
    int delay_ms, max_conc;
    tern_engine_stats st;
    tern_tokenizer *tok;
    float logits[FAKE_VOCAB];
} fake;

/* tokenizer.json text for the fake ids: 0 pad, 1 bos, 2 eos, 3.. bytes, 259.. specials. */
static char *fake_tokenizer_json(void) {
    static const char *const head[] = {"<pad>", "<bos>", "<eos>"};
    char names[FAKE_VOCAB - 259][16];
    const char *tail[FAKE_VOCAB - 259];
    for (int i = 259; i < FAKE_VOCAB; i++) {
        snprintf(names[i - 259], sizeof names[0], "<|x%d|>", i);
        tail[i - 259] = names[i - 259];
    }
    return tern_bytelevel_tokenizer_json(head, 3, tail, FAKE_VOCAB - 259, NULL);
}

static tern_status f_open(void **out, const tern_engine_opts *o, tern_error *err) {
    fake *f = calloc(1, sizeof *f);
    if (!f) return tern_err(err, TERN_ENOMEM, "fake engine: out of memory");
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    const char *d = getenv("TERN_FAKE_DELAY_MS");
    f->delay_ms = d ? atoi(d) : 2;
    f->max_conc = o && o->max_concurrency > 0 ? o->max_concurrency : 8;
    f->next_id = 1;
    f->st.kv_blocks_total = 1024;
    char *tj = fake_tokenizer_json();
    tern_status st = tj ? tern_tokenizer_load_json(&f->tok, tj, strlen(tj), NULL, "fake", err)
                        : tern_err(err, TERN_ENOMEM, "fake engine: out of memory");
    free(tj);
    if (st) { pthread_mutex_destroy(&f->mu); pthread_cond_destroy(&f->cv); free(f); return st; }
    *out = f;
    return TERN_OK;
}

static void f_close(void *p) {
    fake *f = p;
    if (!f) return;
    while (f->head) {
        fake_req *q = f->head;
        f->head = q->next;
        free((void *)q->r.prompt);
        free(q->reply);
        free(q);
    }
    tern_tokenizer_free(f->tok);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

static tern_status f_submit(void *p, const tern_request *r, uint64_t *id, tern_error *err) {
    fake *f = p;
    if (!r || !r->on_event) return tern_err(err, TERN_EINVAL, "fake engine: request without on_event");
    if (r->n_prompt <= 0) return tern_err(err, TERN_EINVAL, "fake engine: empty prompt");
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= FAKE_VOCAB)
            return tern_err(err, TERN_EINVAL, "fake engine: prompt[%d] = %d out of range", i, r->prompt[i]);
    fake_req *q = calloc(1, sizeof *q);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
    if (!q || !ids) { free(q); free(ids); return tern_err(err, TERN_ENOMEM, "fake engine: out of memory"); }
    memcpy(ids, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    q->r = *r;
    q->r.prompt = ids;
    q->n_prompt = r->n_prompt;
    q->t0 = tern_time_s();
    /* "@@reply:TEXT@@" in the prompt bytes scripts the answer (the last one wins) */
    char *raw = malloc((size_t)r->n_prompt + 1);
    if (raw) {
        int m = 0;
        for (int i = 0; i < r->n_prompt; i++) if (ids[i] >= 3 && ids[i] < 259) raw[m++] = (char)(ids[i] - 3);
        raw[m] = 0;
        char *at = NULL;
        for (char *p = raw; (p = strstr(p, "@@reply:")); p++) at = p;
        char *end = at ? strstr(at + 8, "@@") : NULL;
        if (end && (q->reply = malloc((size_t)(end - at - 8) + 1))) {
            q->reply_len = (int)(end - at - 8);
            memcpy(q->reply, at + 8, (size_t)q->reply_len);
            q->reply[q->reply_len] = 0;
        }
        free(raw);
    }
    pthread_mutex_lock(&f->mu);
    q->id = f->next_id++;
    if (id) *id = q->id;                 /* q may be finished and freed once we unlock */
    fake_req **tail = &f->head;
    while (*tail) tail = &(*tail)->next;
    *tail = q;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return TERN_OK;
}

static void f_cancel(void *p, uint64_t id) {
    fake *f = p;
    pthread_mutex_lock(&f->mu);
    for (fake_req *q = f->head; q; q = q->next)
        if (q->id == id) q->cancelled = 1;
    pthread_mutex_unlock(&f->mu);
}

static void finish(fake *f, fake_req *q, tern_finish_reason why) {
    tern_event ev = {0};
    ev.kind = TERN_EV_DONE;
    ev.request_id = q->id;
    ev.finish = why;
    ev.n_prompt = q->n_prompt;
    ev.n_generated = q->n_gen;
    ev.t_total = tern_time_s() - q->t0;
    q->r.on_event(q->r.ctx, &ev);
    if (why == TERN_FINISH_CANCELLED) f->st.requests_cancelled++;
    else f->st.requests_done++;
    f->st.prompt_tokens += q->n_prompt;
}

/* One token for q; returns 1 when q is finished. */
static int step_one(fake *f, fake_req *q) {
    if (q->cancelled) { finish(f, q, TERN_FINISH_CANCELLED); return 1; }
    if (q->n_gen >= q->r.max_tokens) { finish(f, q, TERN_FINISH_LENGTH); return 1; }
    const char *reply = q->reply ? q->reply : k_reply;
    int len = q->reply ? q->reply_len : (int)sizeof k_reply - 1;
    if (q->pos >= len) {
        if (!q->r.ignore_eos) { finish(f, q, TERN_FINISH_STOP); return 1; }
        q->pos = 0;
    }
    tern_event ev = {0};
    ev.kind = TERN_EV_TOKEN;
    ev.request_id = q->id;
    ev.token = (unsigned char)reply[q->pos++] + 3;
    if (q->r.mask) {
        for (int i = 0; i < FAKE_VOCAB; i++) f->logits[i] = 0;
        f->logits[ev.token] = 1;
        if (q->r.mask(q->r.mask_ctx, f->logits, FAKE_VOCAB)) { finish(f, q, TERN_FINISH_CANCELLED); return 1; }
        if (f->logits[ev.token] != 1) {
            if (f->logits[2] == 0) { finish(f, q, TERN_FINISH_STOP); return 1; }
            int k = 0;
            while (k < FAKE_VOCAB && f->logits[k] != 0) k++;
            if (k == FAKE_VOCAB) { finish(f, q, TERN_FINISH_CANCELLED); return 1; }
            ev.token = k;
        }
    }
    int32_t tops[20];
    float tlp[20];
    int nt = q->r.sampling.n_logprobs;
    if (nt > 20) nt = 20;
    if (nt > 0) {
        ev.logprob = -0.5f;
        for (int i = 0; i < nt; i++) { tops[i] = 3 + (ev.token - 3 + 1 + i) % 256; tlp[i] = -1.0f - (float)i; }
        ev.n_top = nt;
        ev.top_ids = tops;
        ev.top_logprobs = tlp;
    }
    q->n_gen++;
    f->st.generated_tokens++;
    int rc = q->r.on_event(q->r.ctx, &ev);
    if (rc == 1) { finish(f, q, TERN_FINISH_CANCELLED); return 1; }
    if (rc == 2) { finish(f, q, TERN_FINISH_STOP); return 1; }
    return 0;
}

static void f_run(void *p, void (*after_step)(void *), void *arg) {
    fake *f = p;
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        if (!f->head) { pthread_cond_wait(&f->cv, &f->mu); continue; }
        int k = 0, nrun = 0;
        for (fake_req **pp = &f->head; *pp && k < f->max_conc; k++) {
            fake_req *q = *pp;
            nrun++;
            if (step_one(f, q)) {
                *pp = q->next;
                free((void *)q->r.prompt);
                free(q->reply);
                free(q);
            } else pp = &q->next;
        }
        int total = 0;
        for (fake_req *q = f->head; q; q = q->next) total++;
        f->st.running = TERN_MIN(total, f->max_conc);
        f->st.waiting = total - f->st.running;
        f->st.kv_blocks_used = f->st.running;
        pthread_mutex_unlock(&f->mu);
        if (after_step) after_step(arg);
        if (f->delay_ms > 0) {
            struct timespec ts = {f->delay_ms / 1000, (long)(f->delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&f->mu);
        (void)nrun;
    }
    /* stopping: end what is left as cancelled so every request gets its last event */
    while (f->head) {
        fake_req *q = f->head;
        f->head = q->next;
        finish(f, q, TERN_FINISH_CANCELLED);
        free((void *)q->r.prompt);
        free(q->reply);
        free(q);
    }
    pthread_mutex_unlock(&f->mu);
}

static void f_stop(void *p) {
    fake *f = p;
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static tern_status f_tokenize(void *p, const char *t, size_t len, int add_special, int32_t **ids, int *n,
                              tern_error *err) {
    if (len > (1u << 28)) return tern_err(err, TERN_EINVAL, "fake engine: text too long");
    int32_t *v = malloc(sizeof(int32_t) * (len + 1));
    if (!v) return tern_err(err, TERN_ENOMEM, "fake engine: out of memory");
    int k = 0;
    if (add_special) v[k++] = 1;
    for (size_t i = 0; i < len; i++) v[k++] = (unsigned char)t[i] + 3;
    *ids = v;
    *n = k;
    return TERN_OK;
}

static tern_status f_detokenize(void *p, const int32_t *ids, int n, char **text, tern_error *err) {
    unsigned char *raw = malloc((size_t)n + 1);
    char *out = malloc((size_t)n * 3 + 1);
    if (!raw || !out) { free(raw); free(out); return tern_err(err, TERN_ENOMEM, "fake engine: out of memory"); }
    size_t m = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 3 && ids[i] < 259) raw[m++] = (unsigned char)(ids[i] - 3);
    /* lossy UTF-8: whole valid prefix kept; any cut/invalid sequence -> U+FFFD */
    size_t o = 0, i = 0;
    while (i < m) {
        unsigned char c = raw[i];
        size_t need = c < 0x80 ? 1 : c >= 0xF8 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        int valid = need > 0 && i + need <= m;
        for (size_t k = 1; valid && k < need; k++) valid = (raw[i + k] & 0xC0) == 0x80;
        if (valid) { memcpy(out + o, raw + i, need); o += need; i += need; }
        else { memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; i++; }
    }
    out[o] = 0;
    free(raw);
    *text = out;
    return TERN_OK;
}

static void f_info(const void *p, tern_model_info *info) {
    memset(info, 0, sizeof *info);
    info->name = "fake";
    info->arch = "fake";
    info->n_vocab = FAKE_VOCAB;
    info->n_ctx = 4096;
    info->max_batch_tokens = 512; /* the CPU engine's default (no forward pass here) */
    info->n_layer = 1;
    info->n_embd = 8;
    info->bos_id = 1;
    info->eos_ids[0] = 2;
    info->n_eos = 1;
    info->gen_temperature = info->gen_top_p = -1.0f; /* no generation_config.json */
    info->gen_top_k = -1;
    info->has_tokenizer = 1;
}

static void f_stats(void *p, tern_engine_stats *st) {
    fake *f = p;
    pthread_mutex_lock(&f->mu);
    *st = f->st;
    pthread_mutex_unlock(&f->mu);
}

static const tern_tokenizer *f_tok(void *p) { return ((fake *)p)->tok; }

static const srv_engine_vt k_fake = {
    "fake", f_open, f_close, f_submit, f_cancel, f_run, f_stop, f_tokenize, f_detokenize, f_info, f_stats, f_tok,
};

const srv_engine_vt *tern__srv_fake_engine(void) { return &k_fake; }
