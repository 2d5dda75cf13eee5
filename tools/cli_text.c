/*
 * cli_text.c — see cli_text.h. The engine runs on this thread: submit, then step until the
 * request is done; tokens arrive in the event callback and are detokenized incrementally.
 */
#include "cli_text.h"

#include "cli_util.h"
#include "runtime/engine_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int num_flag(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= lo && x <= hi))
        return cli_usage_error(cmd, "%s expects a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "");
    *out = x;
    return 0;
}

int cli_text_flag(cli_text_flags *f, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    double x;
    if (!strcmp(a, "--temperature")) { if (num_flag(cmd, a, v, 0, 100, &f->temperature)) return -1; }
    else if (!strcmp(a, "--top-p")) { if (num_flag(cmd, a, v, 1e-9, 1, &f->top_p)) return -1; }
    else if (!strcmp(a, "--min-p")) { if (num_flag(cmd, a, v, 0, 1, &f->min_p)) return -1; }
    else if (!strcmp(a, "--top-k")) { if (num_flag(cmd, a, v, 0, 1e9, &x)) return -1; f->top_k = (int)x; }
    else if (!strcmp(a, "--max-tokens")) { if (num_flag(cmd, a, v, 0, 1 << 24, &x)) return -1; f->max_tokens = (int)x; }
    else if (!strcmp(a, "--seed")) { if (num_flag(cmd, a, v, 0, 9e15, &x)) return -1; f->seed = (long long)x; }
    else if (!strcmp(a, "--threads")) { if (num_flag(cmd, a, v, 0, 1024, &x)) return -1; f->threads = (int)x; }
    else if (!strcmp(a, "--speculative")) { if (num_flag(cmd, a, v, 0, TERN_SPEC_MAX_K, &x)) return -1; f->speculative = (int)x; }
    else if (!strcmp(a, "--max-ctx")) { if (num_flag(cmd, a, v, 1, 1 << 24, &x)) return -1; f->max_ctx = (int)x; }
    else if (!strcmp(a, "--gpus") || !strcmp(a, "--tp")) { if (num_flag(cmd, a, v, 1, 16, &x)) return -1; f->gpus = (int)x; }
    else if (!strcmp(a, "--expert-cache")) { if (num_flag(cmd, a, v, 0, 1e6, &f->expert_cache_gb)) return -1; }
    else if (!strcmp(a, "--expert-trace")) { if (!v) { cli_usage_error(cmd, "--expert-trace expects a file"); return -1; } f->expert_trace = v; }
    else if (!strcmp(a, "--device")) {
        if (!v || (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto"))) { cli_usage_error(cmd, "--device expects cpu, cuda or auto"); return -1; }
        f->device = v;
    } else if (!strcmp(a, "--compute")) {
        if (!v || (strcmp(v, "f32") && strcmp(v, "bf16") && strcmp(v, "bf16x2") && strcmp(v, "int8"))) {
            cli_usage_error(cmd, "--compute expects f32, bf16, bf16x2 or int8, got '%s'", v ? v : "");
            return -1;
        }
        f->compute_bf16 = !strcmp(v, "int8") ? 3 : !strcmp(v, "bf16x2") ? 2 : !strcmp(v, "bf16");
    } else if (!strcmp(a, "--kv-quant")) {
        if (!v) { cli_usage_error(cmd, "--kv-quant expects a value"); return -1; }
        f->kv_quant = v; /* checked by tern_engine_open (exit 2 with the spec named) */
    } else if (!strcmp(a, "--ignore-eos")) { f->ignore_eos = 1; return 1; }
    else return 0;
    (*i)++;
    return 1;
}

int cli_text_open(cli_text *t, const cli_text_flags *f, const char *cmd) {
    memset(t, 0, sizeof *t);
    tern_error e = {0};
    tern_engine_opts o = tern_engine_default_opts();
    o.model = f->model;
    o.device = f->device ? f->device : "auto";
    o.n_threads = f->threads;
    o.max_ctx = f->max_ctx;
    o.compute_bf16 = f->compute_bf16;
    if (f->kv_quant) o.kv_quant = f->kv_quant;
    o.speculative_k = f->speculative;
    o.gpus = f->gpus;
    o.expert_cache_gb = f->expert_cache_gb;
    o.expert_trace = f->expert_trace;
    o.max_concurrency = 1;
    o.prompt_cache_gb = 0.25; /* chat turns share their prefix */
    if (tern_engine_open(&t->eng, &o, &e)) {
        fprintf(stderr, "tern %s: %s\n", cmd, e.msg);
        return tern_status_exit_code(e.code);
    }
    const tern_tokenizer *tok = tern__engine_tokenizer(t->eng);
    if (!tok) {
        fprintf(stderr, "tern %s: the model directory has no tokenizer.json (use --ids)\n", cmd);
        cli_text_close(t);
        return 2;
    }
    if (tern_detok_new(&t->detok, tok, 1, &e)) {
        fprintf(stderr, "tern %s: %s\n", cmd, e.msg);
        cli_text_close(t);
        return 1;
    }
    tern_status s = tern_chat_template_load(tern__engine_dir(t->eng), &t->tpl, &e);
    if (s && s != TERN_ENOTFOUND) tern_log(TERN_LOG_WARN, "chat template not loaded: %s", e.msg);
    /* sampling: flags, else the model's generation_config.json, else greedy-safe defaults */
    tern_model_info mi;
    tern_engine_model_info(t->eng, &mi);
    t->sp.temperature = f->temperature >= 0 ? (float)f->temperature : mi.gen_temperature >= 0 ? mi.gen_temperature : 0.8f;
    t->sp.top_p = f->top_p > 0 ? (float)f->top_p : mi.gen_top_p > 0 ? mi.gen_top_p : 0.95f;
    t->sp.min_p = f->min_p > 0 ? (float)f->min_p : 0.0f;
    t->sp.top_k = f->top_k > 0 ? f->top_k : mi.gen_top_k > 0 ? mi.gen_top_k : 0;
    t->sp.repetition_penalty = 1.0f;
    t->sp.seed = f->seed >= 0 ? (uint64_t)f->seed : (uint64_t)time(NULL);
    t->max_tokens = f->max_tokens > 0 ? f->max_tokens : 256;
    t->ignore_eos = f->ignore_eos;
    return 0;
}

void cli_text_close(cli_text *t) {
    tern_detok_free(t->detok);
    tern_chat_template_free(t->tpl);
    tern_engine_close(t->eng);
    memset(t, 0, sizeof *t);
}

int cli_text_chat_ids(cli_text *t, const cJSON *messages, int32_t **ids, int *n, const char *cmd) {
    tern_error e = {0};
    if (!t->tpl) {
        fprintf(stderr, "tern %s: the model has no chat template (use --raw)\n", cmd);
        return 2;
    }
    /* the injection guard (tokenizer.h): messages are escaped, the prompt is encoded with
     * TERN_ENC_ESCAPED, so special-token text the user types stays text */
    const tern_tokenizer *tok = tern__engine_tokenizer(t->eng);
    tern_chat_opts co = {.messages = messages, .add_generation_prompt = true, .enable_thinking = -1, .escape_tok = tok};
    char *text = NULL;
    size_t len = 0, cnt = 0;
    if (tern_chat_render(t->tpl, &co, &text, &len, NULL, &e)) {
        fprintf(stderr, "tern %s: chat template: %s\n", cmd, e.msg);
        return 2;
    }
    /* the template writes its own specials (chat.h: BOS rule) */
    tern_status s = tern_tokenizer_encode_ex(tok, text, len, TERN_ENC_PARSE_SPECIAL | TERN_ENC_ESCAPED, ids, &cnt, &e);
    free(text);
    if (!s && cnt > 0x7fffffff) { free(*ids); *ids = NULL; s = tern_err(&e, TERN_EINVAL, "prompt too long"); }
    if (s) { fprintf(stderr, "tern %s: %s\n", cmd, e.msg); return tern_status_exit_code(s); }
    *n = (int)cnt;
    return 0;
}

typedef struct run_ctx {
    cli_text *t;
    char *buf;
    size_t len, cap;
    int done, failed;
    tern_event last;
    char errmsg[TERN_ERROR_MSG_MAX];
} run_ctx;

static void emit(run_ctx *r, const char *s, size_t n) {
    if (!n) return;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    if (r->len + n + 1 > r->cap) {
        size_t nc = (r->cap + n + 1) * 2;
        char *nb = realloc(r->buf, nc);
        if (!nb) return;
        r->buf = nb;
        r->cap = nc;
    }
    memcpy(r->buf + r->len, s, n);
    r->len += n;
    r->buf[r->len] = 0;
}

static int on_event(void *ctx, const tern_event *ev) {
    run_ctx *r = ctx;
    const char *s;
    size_t n;
    if (ev->kind == TERN_EV_TOKEN) {
        if (!tern_detok_step(r->t->detok, ev->token, &s, &n, NULL)) emit(r, s, n);
    } else {
        if (!tern_detok_flush(r->t->detok, &s, &n, NULL)) emit(r, s, n);
        r->done = 1;
        r->last = *ev;
        if (ev->kind == TERN_EV_ERROR) {
            r->failed = 1;
            snprintf(r->errmsg, sizeof r->errmsg, "%s", ev->err ? ev->err->msg : "generation failed");
        }
    }
    return 0;
}

int cli_text_run(cli_text *t, const int32_t *ids, int n, char **reply, const char *cmd) {
    run_ctx r = {.t = t};
    tern_error e = {0};
    tern_request req = tern_request_default();
    req.prompt = ids;
    req.n_prompt = n;
    req.max_tokens = t->max_tokens;
    req.sampling = t->sp;
    req.ignore_eos = t->ignore_eos;
    req.on_event = on_event;
    req.ctx = &r;
    tern_detok_reset(t->detok);
    uint64_t id;
    if (tern_engine_submit(t->eng, &req, &id, &e)) {
        fprintf(stderr, "tern %s: %s\n", cmd, e.msg);
        return tern_status_exit_code(e.code);
    }
    while (!r.done) {
        if (tern_engine_step(t->eng, &e)) {
            fprintf(stderr, "tern %s: %s\n", cmd, e.msg);
            free(r.buf);
            return 1;
        }
    }
    if (r.failed) { fprintf(stderr, "\ntern %s: %s\n", cmd, r.errmsg); free(r.buf); return 1; }
    t->sp.seed++; /* a new draw next turn */
    /* stats: TTFT is submit -> first token (queue + prefill of the uncached part + one
     * sample); decode rate counts every token sampled after the first, the stop token too */
    const tern_event *d = &r.last;
    double tg = d->t_total - d->t_first_token;
    int n_sampled = d->n_generated + (d->finish == TERN_FINISH_STOP ? 1 : 0);
    int n_prefill = d->n_prompt - d->n_cached;
    fprintf(stderr, "\n[prompt %d tokens (%d cached), generated %d tokens, TTFT %.3f s, prefill %.1f tok/s, "
                    "decode %.1f tok/s, %s]\n",
            d->n_prompt, d->n_cached, d->n_generated, d->t_first_token,
            d->t_first_token > 0 ? n_prefill / d->t_first_token : 0.0,
            n_sampled > 1 && tg > 0 ? (n_sampled - 1) / tg : 0.0,
            d->finish == TERN_FINISH_STOP ? "stop" : d->finish == TERN_FINISH_LENGTH ? "length" : "cancelled");
    if (reply) *reply = r.buf;
    else free(r.buf);
    return 0;
}
