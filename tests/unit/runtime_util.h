/*
 * runtime_util.h — helpers for the runtime tests: a tiny random-weight Llama written to a
 * temp directory (config.json + model.safetensors), a reference greedy run through
 * tern_generate on a fresh KV cache, and an event collector for engine requests.
 * Header-only; included by tests/unit/test_runtime_*.c.
 */
#ifndef TERN_RUNTIME_UTIL_H
#define TERN_RUNTIME_UTIL_H

#include "test.h"
#include "io/st_write.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/kv.h"
#include "tern.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RT_V 97
#define RT_H 32
#define RT_FF 64
#define RT_L 2
#define RT_NH 4
#define RT_NKV 2
#define RT_D 8
#define RT_EOS 1

static char rt_dir_[256];

static void rt_cleanup(void) {
    char cmd[300];
    if (!rt_dir_[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rt_dir_);
    if (system(cmd)) {}
}

static float *rt_rand(size_t n, float scale, float offset, unsigned long long *seed) {
    float *p = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * test_randf(seed);
    return p;
}

/* Write the tiny model once; returns its directory (NULL on failure). */
static const char *rt_model_dir(void) {
    if (rt_dir_[0]) return rt_dir_;
    const char *t = getenv("TMPDIR");
    snprintf(rt_dir_, sizeof rt_dir_, "%s/tern_rt_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(rt_dir_)) { perror("mkdtemp"); rt_dir_[0] = 0; return NULL; }
    atexit(rt_cleanup);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", rt_dir_);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d,"
               " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
               " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
               " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
               " \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": %d,"
               " \"hidden_act\": \"silu\"}\n", RT_V, RT_H, RT_FF, RT_L, RT_NH, RT_NKV, RT_D, RT_EOS);
    fclose(f);
    unsigned long long seed = 0x1234567ULL;
    tern_st_wentry e[64];
    float *bufs[64];
    char names[64][96];
    int n = 0;
#define ADD(nm, d0, d1, sc, off) do { \
        snprintf(names[n], sizeof names[n], "%s", nm); \
        bufs[n] = rt_rand((size_t)(d0) * (size_t)((d1) ? (d1) : 1), sc, off, &seed); \
        e[n] = (tern_st_wentry){.name = names[n], .dtype = TERN_DT_F32, .ndim = (d1) ? 2 : 1, \
                                .shape = {(d0), (d1)}, .data = bufs[n]}; n++; } while (0)
    ADD("model.embed_tokens.weight", RT_V, RT_H, 1.0f, 0.f);
    ADD("model.norm.weight", RT_H, 0, 0.2f, 1.f);
    ADD("lm_head.weight", RT_V, RT_H, 0.5f, 0.f);
    for (int l = 0; l < RT_L; l++) {
        char nm[96];
#define LN(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), nm)
        ADD(LN("input_layernorm.weight"), RT_H, 0, 0.2f, 1.f);
        ADD(LN("post_attention_layernorm.weight"), RT_H, 0, 0.2f, 1.f);
        ADD(LN("self_attn.q_proj.weight"), RT_NH * RT_D, RT_H, 0.4f, 0.f);
        ADD(LN("self_attn.k_proj.weight"), RT_NKV * RT_D, RT_H, 0.4f, 0.f);
        ADD(LN("self_attn.v_proj.weight"), RT_NKV * RT_D, RT_H, 0.4f, 0.f);
        ADD(LN("self_attn.o_proj.weight"), RT_H, RT_NH * RT_D, 0.3f, 0.f);
        ADD(LN("mlp.gate_proj.weight"), RT_FF, RT_H, 0.3f, 0.f);
        ADD(LN("mlp.up_proj.weight"), RT_FF, RT_H, 0.3f, 0.f);
        ADD(LN("mlp.down_proj.weight"), RT_H, RT_FF, 0.3f, 0.f);
#undef LN
    }
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", rt_dir_);
    tern_error err = {0};
    tern_status st = tern_st_write(path, e, n, &err);
    for (int i = 0; i < n; i++) free(bufs[i]);
    if (st) { printf("  cannot write test model: %s\n", err.msg); return NULL; }
    return rt_dir_;
}

/* Reference: greedy tokens of `prompt` alone (tern_generate on a fresh single-slot KV). */
typedef struct rt_ref { tern_backend *be; tern_model *m; } rt_ref;

static int rt_ref_open(rt_ref *r) {
    tern_error err = {0};
    memset(r, 0, sizeof *r);
    tern_backend_opts bo = {.n_threads = 2};
    if (tern_backend_cpu_open(&r->be, &bo, &err)) { printf("  backend: %s\n", err.msg); return -1; }
    if (tern_model_load(&r->m, rt_model_dir(), r->be, NULL, &err)) { printf("  model: %s\n", err.msg); return -1; }
    return 0;
}

static void rt_ref_close(rt_ref *r) {
    tern_model_free(r->m);
    tern_backend_close(r->be);
}

typedef struct rt_toks { int32_t t[512]; int n; } rt_toks;
static int rt_on_tok(void *ctx, int tok) { rt_toks *o = ctx; if (o->n < 512) o->t[o->n++] = tok; return 0; }

/* Greedy continuation (EOS ignored) of at most max_new tokens; returns count or -1. */
static int rt_ref_greedy(rt_ref *r, const int32_t *prompt, int n, int max_new, int32_t *out) {
    tern_error err = {0};
    tern_kv *kv = NULL;
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = 512};
    if (tern_kv_open(&kv, r->be, tern_model_cfg(r->m), &ko, &err)) { printf("  kv: %s\n", err.msg); return -1; }
    rt_toks o = {.n = 0};
    tern_status st = tern_generate(r->m, kv, 0, prompt, n, max_new, 0, NULL, 0, NULL, NULL, rt_on_tok, &o, NULL, &err);
    tern_kv_close(kv);
    if (st) { printf("  generate: %s\n", err.msg); return -1; }
    memcpy(out, o.t, sizeof(int32_t) * (size_t)o.n);
    return o.n;
}

/* Event collector: one per request. */
typedef struct rt_col {
    int32_t toks[512];
    int n_tok, done, errors, cancel_after, stop_after;
    tern_finish_reason finish;
    tern_event last;
    char err_msg[TERN_ERROR_MSG_MAX];
    float logprob[512];
    int n_top[512];
} rt_col;

static int rt_on_event(void *ctx, const tern_event *ev) {
    rt_col *c = ctx;
    if (ev->kind == TERN_EV_TOKEN) {
        if (c->done) c->errors++;  /* token after the end */
        if (c->n_tok < 512) { c->logprob[c->n_tok] = ev->logprob; c->n_top[c->n_tok] = ev->n_top; c->toks[c->n_tok++] = ev->token; }
        if (c->cancel_after && c->n_tok >= c->cancel_after) return 1;
        if (c->stop_after && c->n_tok >= c->stop_after) return 2;
        return 0;
    }
    if (c->done) c->errors++;      /* two final events */
    c->done = 1;
    c->last = *ev;
    c->finish = ev->finish;
    if (ev->kind == TERN_EV_ERROR && ev->err) snprintf(c->err_msg, sizeof c->err_msg, "%s", ev->err->msg);
    return 0;
}

/* A greedy request (EOS ignored) of at most max_new tokens whose events land in c. */
static inline tern_request rt_greedy(const int32_t *p, int n, int max_new, rt_col *c) {
    tern_request r = tern_request_default();
    r.prompt = p;
    r.n_prompt = n;
    r.max_tokens = max_new;
    r.sampling.temperature = 0;
    r.ignore_eos = 1;
    r.on_event = rt_on_event;
    r.ctx = c;
    return r;
}

/* c ran to completion with the tokens ref gives the prompt alone (rt_ref_greedy: at most 512, its rt_toks). */
static inline void rt_check_ref(rt_ref *ref, const rt_col *c, const int32_t *p, int n, int max_new, const char *what) {
    int32_t exp[512];
    int ne = rt_ref_greedy(ref, p, n, max_new, exp);
    CHECK(c->done && c->last.kind == TERN_EV_DONE, "%s: not done (%s)", what, c->err_msg);
    CHECK(ne >= 0 && c->n_tok == ne && !memcmp(c->toks, exp, sizeof(int32_t) * (size_t)ne),
          "%s: tokens differ from the reference", what);
}

/* Deterministic prompt of n ids (not EOS) from a seed. */
static void rt_prompt(int32_t *p, int n, unsigned long long seed) {
    for (int i = 0; i < n; i++) {
        p[i] = (int32_t)(test_rand_u64(&seed) % (RT_V - 2)) + 2;
    }
}

static tern_engine *rt_engine_pc(int conc, int budget, double kv_gb, int max_ctx, double cache_gb) {
    tern_engine_opts o = tern_engine_default_opts();
    o.prompt_cache_gb = cache_gb;
    o.model = rt_model_dir();
    o.device = getenv("TERN_TEST_DEVICE") ? getenv("TERN_TEST_DEVICE") : "cpu";  /* cuda on a GPU machine */
    o.compute_bf16 = 0; /* exact f32 on any device (the GPU default is bf16): tests compare with rt_ref */
    o.n_threads = 2;
    o.max_concurrency = conc;
    o.max_batch_tokens = budget;
    o.kv_memory_gb = kv_gb;
    o.max_ctx = max_ctx;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) { printf("  engine_open: %s\n", err.msg); return NULL; }
    return e;
}

static inline tern_engine *rt_engine(int conc, int budget, double kv_gb, int max_ctx) {
    return rt_engine_pc(conc, budget, kv_gb, max_ctx, 0);
}

/* Bytes of one 16-token KV block of the tiny model. */
#define RT_BLOCK_BYTES ((size_t)RT_L * 2 * RT_NKV * RT_D * sizeof(float) * 16)

static int rt_drain(tern_engine *e, int max_steps) {
    tern_error err = {0};
    int steps = 0;
    while (tern_engine_pending(e) && steps < max_steps) {
        if (tern_engine_step(e, &err)) { printf("  step: %s\n", err.msg); return -1; }
        steps++;
    }
    return steps;
}

#endif
