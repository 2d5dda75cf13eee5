/*
 * engine.c — the public engine API of include/tern.h: backend + model + tokenizer + KV pool +
 * scheduler + the queue that connects other threads to the engine thread.
 *
 * What runs where: tern_engine_submit / cancel / stop / pending / get_stats touch only the
 * queue (queue.c, one mutex) and immutable facts, so any thread may call them. Everything
 * else (step, run, close, tokenize's caller is free but cheap) runs on the engine thread: a
 * step drains the queue into the scheduler, runs one scheduler step (sched.c) and publishes
 * a statistics snapshot back into the queue. tern_engine_run sleeps on the queue's condition
 * variable whenever the scheduler has nothing to do.
 *
 * Model names: a directory, or "demo" (NULL) which resolve_model() turns into the embedded
 * demo model's directory; that is the one hook for names that are not paths. Benchmarks may
 * also name "random:PRESET[:qB]" (io/presets.h): random weights of a real geometry, made in
 * memory (no tokenizer), as `tern bench --random` does.
 */
#include "tern.h"

#include "base/base.h"
#include "base/file.h"
#include "io/demo.h"
#include "io/kv_config.h"
#include "io/presets.h"
#include "model/model.h"
#include "model/tp.h"
#include "runtime/experts.h"
#include "runtime/fit.h"
#include "runtime/kv.h"
#include "runtime/queue.h"
#include "runtime/engine_int.h"
#include "runtime/sched.h"
#include "text/stops.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANCEL_BATCH 64

struct tern_engine {
    tern_backend *be;
    tern_model *m;
    tern_kv *kv;
    tern_sched *s;
    tern__queue q;
    int q_ok;
    tern_tokenizer *tok;
    int32_t stop[TERN_STOP_IDS_MAX]; /* EOS + turn-end tokens (text/stops.h), every request */
    int n_stop;
    int has_template;
    char dir[4096];           /* "" for random:PRESET models */
    tern_model_config *rcfg;  /* random:PRESET: owned config + synthetic weights */
    tern_weights *rws;
    char name[256];
    char arch[32];
    char kv_spec[32];          /* the --kv-quant spec the cache was opened with (defaults applied) */
    int max_batch_tokens;      /* rows per step (defaults applied) */
    uint64_t cancel_ids[CANCEL_BATCH];
    tern_tp *tp;              /* tensor-parallel group (gpus > 1): owns be, m, kv */
};

tern_engine_opts tern_engine_default_opts(void) {
    tern_engine_opts o;
    memset(&o, 0, sizeof o);
    o.device = "auto";
    o.max_concurrency = 8;
    o.max_batch_tokens = 0; /* 0: tern_model_default_batch (CPU 512; GPU 8192, 2048 under 70 GiB) */
    o.kv_quant = "auto";
    o.compute_bf16 = -1; /* bf16 on a GPU, f32 on the CPU */
    return o;
}

/* The one place that maps model names that are not directories ("demo", NULL). */
static tern_status resolve_model(const char *model, char *dir, size_t n, tern_error *err) {
    return tern_model_path_resolve(model, dir, n, err);
}

static tern_status open_backend(tern_engine *e, const tern_engine_opts *o, tern_error *err) {
    const char *dev = o->device && *o->device ? o->device : "auto";
    if (strcmp(dev, "cpu") && strcmp(dev, "cuda") && strcmp(dev, "auto"))
        return tern_err(err, TERN_EINVAL, "engine opts.device: expected cpu, cuda or auto, got '%s'", dev);
    /* compute_bf16 < 0: bf16 where a GPU runs the model, f32 where the CPU does */
    const tern_compute gpu_c = o->compute_bf16 == 2   ? TERN_COMPUTE_BF16X2
                               : o->compute_bf16 == 3 ? TERN_COMPUTE_INT8 /* CUDA: bf16 + int8 x in Q4 GEMVs */
                               : o->compute_bf16      ? TERN_COMPUTE_BF16
                                                      : TERN_COMPUTE_F32;
    const tern_compute cpu_c = o->compute_bf16 < 0 ? TERN_COMPUTE_F32
                               : o->compute_bf16 == 3 ? TERN_COMPUTE_INT8 : gpu_c;
    tern_backend_opts bo = {.n_threads = o->n_threads, .device = 0, .compute = gpu_c};
    int ranks = o->gpus > 0 ? o->gpus : tern_tp_env();
    if (ranks > 1) { /* tensor parallel: GPUs 0..ranks-1, or CPU ranks with device cpu */
        const int cuda = strcmp(dev, "cpu") != 0;
        tern_tp_opts to = {.n = ranks, .cuda = cuda, .n_threads = o->n_threads, .compute = cuda ? gpu_c : cpu_c};
        tern_status st = tern_tp_open(&e->tp, &to, err);
        if (st && !strcmp(dev, "auto")) {
            tern_log(TERN_LOG_INFO, "engine: %s; %d CPU ranks instead", err ? err->msg : "no GPUs", ranks);
            to.cuda = 0;
            to.compute = cpu_c;
            st = tern_tp_open(&e->tp, &to, err);
        }
        if (!st) e->be = tern_tp_backend(e->tp, 0);
        return st;
    }
    if (strcmp(dev, "cpu")) {
        tern_error ce = {0};
        tern_status st = tern_backend_cuda_open(&e->be, &bo, &ce);
        if (st && !strcmp(dev, "cuda")) { if (err) *err = ce; return st; }
        if (!st) return TERN_OK;
    }
    bo.compute = cpu_c;
    return tern_backend_cpu_open(&e->be, &bo, err);
}

/* has_chat_template: a chat_template.jinja file, or a "chat_template" key in tokenizer_config.json. */
static int find_template(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    if (tern_is_file(p)) return 1;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    char *txt = NULL;
    size_t len = 0;
    if (tern_file_read(p, (size_t)64 << 20, &txt, &len, NULL)) return 0;
    int has = strstr(txt, "\"chat_template\"") != NULL;
    free(txt);
    return has;
}

static tern_status check_opts(const tern_engine_opts *o, tern_error *err) {
    if (o->max_concurrency < 0 || o->max_concurrency > 4096)
        return tern_err(err, TERN_EINVAL, "engine opts.max_concurrency: %d outside [1, 4096]", o->max_concurrency);
    if (o->max_ctx < 0) return tern_err(err, TERN_EINVAL, "engine opts.max_ctx: %d is negative", o->max_ctx);
    if (o->compute_bf16 < -1 || o->compute_bf16 > 3)
        return tern_err(err, TERN_EINVAL, "engine opts.compute_bf16: %d outside [-1, 3]", o->compute_bf16);
    if (o->max_batch_tokens < 0 || o->max_batch_tokens > (1 << 20))
        return tern_err(err, TERN_EINVAL, "engine opts.max_batch_tokens: %d outside [1, 1048576]", o->max_batch_tokens);
    if (!(o->prompt_cache_gb >= 0 && o->prompt_cache_gb < 1e6))
        return tern_err(err, TERN_EINVAL, "engine opts.prompt_cache_gb: %g is not a size", o->prompt_cache_gb);
    if (!(o->memory_budget_gb >= 0 && o->memory_budget_gb < 1e6))
        return tern_err(err, TERN_EINVAL, "engine opts.memory_budget_gb: %g is not a size", o->memory_budget_gb);
    if (!(o->expert_cache_gb >= 0 && o->expert_cache_gb < 1e6))
        return tern_err(err, TERN_EINVAL, "engine opts.expert_cache_gb: %g is not a size", o->expert_cache_gb);
    if (!(o->kv_memory_gb >= 0 && o->kv_memory_gb < 1e6))
        return tern_err(err, TERN_EINVAL, "engine opts.kv_memory_gb: %g is not a size", o->kv_memory_gb);
    if (o->n_threads < 0) return tern_err(err, TERN_EINVAL, "engine opts.n_threads: %d is negative", o->n_threads);
    if (o->speculative_k < 0 || o->speculative_k > TERN_SPEC_MAX_K)
        return tern_err(err, TERN_EINVAL, "engine opts.speculative_k: %d outside [0, %d]", o->speculative_k, TERN_SPEC_MAX_K);
    tern_kv_fmt kvf[2];
    if (o->kv_quant && *o->kv_quant && strcmp(o->kv_quant, "auto") && strcmp(o->kv_quant, "config") &&
        tern_kv_quant_parse(o->kv_quant, kvf, err))
        return TERN_EINVAL;
    return TERN_OK;
}

/* "random:PRESET[:qB]": a preset geometry with synthetic weights (bf16, or MLX affine B bits). */
static tern_status load_random(tern_engine *e, const char *spec, const tern_model_opts *mo, tern_error *err) {
    char name[64];
    int bits;
    tern_status st = tern_preset_random_spec(spec, name, sizeof name, &bits, err);
    if (st) return tern_err_wrap(err, st, "engine opts.model");
    const char *js = tern_preset_config(name);
    if (!(e->rcfg = calloc(1, sizeof *e->rcfg))) return tern_err(err, TERN_ENOMEM, "engine: out of memory");
    tern_synth_spec sp = {.bits = bits, .group_size = 64};
    st = tern_config_parse(e->rcfg, js, strlen(js), name, err);
    if (!st) st = tern_weights_open_synth(&e->rws, e->rcfg, &sp, err);
    if (!st && e->tp) st = tern_tp_load(e->tp, e->rcfg, e->rws, mo, &e->m, err);
    else if (!st) st = tern_model_load_from(&e->m, e->rcfg, e->rws, e->be, mo, err);
    return st;
}

/* --memory-budget: the KV pool gets what the weights (as loaded), the forward scratch and a GPU backend's own
 * buffers leave (runtime/fit.c), capped at what max_concurrency sequences of max_ctx need. */
static tern_status size_kv(tern_engine *e, const tern_engine_opts *o, const tern_kv_fmt *fmt, size_t *memory, tern_error *err) {
    if (o->memory_budget_gb <= 0) return TERN_OK;
    const tern_model_config *c = tern_model_cfg(e->m);
    tern_model_stats ms;
    tern_model_get_stats(e->m, &ms);
    size_t w = 0;
    for (int i = 0; i < TERN_DT_COUNT; i++) w += ms.bytes_by_dtype[i];
    tern_experts_stats xs; /* expert offload: the slots are resident, the stored experts are not */
    tern_experts_get_stats(tern_model_experts(e->m), &xs);
    size_t stored = (size_t)xs.n_layers * (size_t)xs.n_expert * xs.expert_bytes;
    if (xs.n_layers) w = (w > stored ? w - stored : 0) + xs.slot_bytes;
    const int gpu = e->be && e->be->device >= 0;
    tern_fit_opts fo = {.ctx = o->max_ctx, .max_concurrency = o->max_concurrency, .max_batch_tokens = o->max_batch_tokens,
                        .budget_gb = o->memory_budget_gb,
                        .device_fixed = gpu ? tern_backend_cuda_fixed_bytes(o->max_batch_tokens) : 0,
                        .device_context = gpu ? tern_backend_cuda_context_bytes() : 0};
    tern_fit f;
    tern_status st = tern_fit_plan(c, fmt, w, &fo, &f, err);
    if (st) return st;
    double gbf = 1073741824.0;
    if (f.kv_avail < tern_fit_seq_kv(c, fmt, TERN_MIN(f.ctx, f.max_batch_tokens), f.max_batch_tokens, 16))
        return tern_err(err, TERN_ENOMEM, "memory budget %.3f GB is too small: weights %.3f GB + scratch %.3f GB leave "
                        "%.3f GB for the KV cache, less than one sequence of %d tokens (see `tern fit`)",
                        o->memory_budget_gb, w / gbf, (f.scratch + f.device_fixed + f.device_context) / gbf, f.kv_avail / gbf,
                        TERN_MIN(f.ctx, f.max_batch_tokens));
    if (*memory > f.kv_avail)
        return tern_err(err, TERN_EINVAL, "kv memory %.3f GB does not fit the memory budget %.3f GB (weights %.3f GB + "
                        "scratch %.3f GB leave %.3f GB)", *memory / gbf, o->memory_budget_gb, w / gbf,
                        (f.scratch + f.device_fixed + f.device_context) / gbf, f.kv_avail / gbf);
    if (!*memory) *memory = TERN_MIN(f.kv_total, f.kv_avail);
    if (f.kv_total > f.kv_avail)
        tern_log(TERN_LOG_INFO, "engine: memory budget %.2f GB: KV pool %.3f GB (%d x %d tokens would need %.3f GB; "
                 "requests wait for room)", o->memory_budget_gb, *memory / gbf, f.max_concurrency, f.ctx, f.kv_total / gbf);
    return TERN_OK;
}

tern_status tern_engine_open(tern_engine **out, const tern_engine_opts *opts, tern_error *err) {
    if (!out) return tern_err(err, TERN_EINVAL, "tern_engine_open: out is NULL");
    *out = NULL;
    tern_engine_opts o = opts ? *opts : tern_engine_default_opts();
    tern_status st = check_opts(&o, err);
    if (st) return st;
    if (!o.max_concurrency) o.max_concurrency = 8;

    tern_engine *e = calloc(1, sizeof *e);
    if (!e) return tern_err(err, TERN_ENOMEM, "engine: out of memory");
    if ((st = tern__queue_init(&e->q, err))) { free(e); return st; }
    e->q_ok = 1;
    int is_random = o.model && !strncmp(o.model, "random:", 7);
    if (!is_random && (st = resolve_model(o.model, e->dir, sizeof e->dir, err))) goto fail;
    snprintf(e->name, sizeof e->name, "%s", !o.model || !strcmp(o.model, "demo") ? "demo" : is_random ? o.model + 7 : tern_path_base(e->dir));
    if ((st = open_backend(e, &o, err))) goto fail;
    if (o.max_batch_tokens && o.max_batch_tokens < o.max_concurrency) o.max_batch_tokens = o.max_concurrency;
    tern_log(TERN_LOG_INFO, "engine: backend %s, compute %s", e->be->vt->name,
             e->be->compute == TERN_COMPUTE_INT8 ? "int8"
             : e->be->compute != TERN_COMPUTE_BF16 ? "f32"
             : o.compute_bf16 == 2 && e->be->device >= 0 ? "bf16x2"
             : o.compute_bf16 == 3 && e->be->device >= 0 ? "int8"
                                                          : "bf16");
    tern_model_opts mo = {.max_batch = o.max_batch_tokens, .min_batch = o.max_concurrency, .expert_trace = o.expert_trace,
                          .expert_cache_bytes = (size_t)(o.expert_cache_gb * 1073741824.0), .no_mmap = o.no_mmap};
    if (!is_random && o.model && strcmp(o.model, "demo"))
        tern_log(TERN_LOG_INFO, "weights: %s", o.no_mmap ? "read into memory (--no-mmap, 2 MB pages)" : "mmap of the files");
    if (is_random) st = load_random(e, o.model + 7, &mo, err);
    else if (e->tp) st = tern_tp_load_dir(e->tp, e->dir, &mo, &e->m, err);
    else st = tern_model_load(&e->m, e->dir, e->be, &mo, err);
    if (st) goto fail;
    o.max_batch_tokens = e->max_batch_tokens = tern_model_max_batch(e->m); /* 0 asked: the model's default */
    const tern_model_config *c = tern_model_cfg(e->m);
    snprintf(e->arch, sizeof e->arch, "%s", tern_arch_name(c->arch));
    tern_kv_fmt *kv_formats = NULL; /* per-layer page formats: --kv-quant or kv_config.json */
    const char *kvq = tern_kv_quant_default(o.kv_quant, e->be->device >= 0, /* auto on a GPU: bf16 pages (bf16 mode) */
                                            e->be->compute == TERN_COMPUTE_BF16 && o.compute_bf16 != 2);
    if ((st = tern_kv_quant_plan(kvq, is_random ? NULL : e->dir, c, &kv_formats, NULL, err))) goto fail;
    snprintf(e->kv_spec, sizeof e->kv_spec, "%s", kvq);
    tern_kv_opts ko = {.n_slots = o.max_concurrency, .max_ctx = o.max_ctx, .chunk = o.max_batch_tokens,
                       .memory = (size_t)(o.kv_memory_gb * 1073741824.0), .formats = kv_formats};
    st = size_kv(e, &o, kv_formats, &ko.memory, err);
    if (!st) st = e->tp ? tern_tp_kv_open(e->tp, &ko, &e->kv, err) : tern_kv_open(&e->kv, e->be, c, &ko, err);
    free(kv_formats);
    if (st) goto fail;
    tern_sched_opts so = {.max_concurrency = o.max_concurrency, .max_batch_tokens = o.max_batch_tokens,
                          .spec_k = o.speculative_k};
    size_t block_bytes = tern_kv_token_bytes(e->kv) * (size_t)tern_kv_block_size(e->kv);
    if (o.prompt_cache_gb > 0 && block_bytes)
        so.prefix_blocks = (int)TERN_MIN(o.prompt_cache_gb * 1073741824.0 / (double)block_bytes, 1e9);
    char tp[4200];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", e->dir);
    if (e->dir[0] && tern_is_file(tp)) {
        tern_error te = {0};
        if (tern_tokenizer_load(&e->tok, e->dir, &te))
            tern_log(TERN_LOG_WARN, "engine: tokenizer not loaded (%s); token ids only", te.msg);
    }
    /* the stop set of every request (unless ignore_eos): config + tokenizer EOS + turn ends */
    tern_stop_ids_build(c->eos_ids, c->n_eos, e->tok, c->n_vocab, e->stop, &e->n_stop);
    so.eos = e->stop;
    so.n_eos = e->n_stop;
    if ((st = tern__sched_open(&e->s, e->m, e->kv, &so, err))) goto fail;
    e->has_template = e->dir[0] && find_template(e->dir);
    tern_engine_stats st0;
    tern__sched_stats(e->s, &st0);
    tern__queue_publish(&e->q, &st0);
    *out = e;
    return TERN_OK;
fail:
    tern_engine_close(e);
    return st;
}

void tern_engine_close(tern_engine *e) {
    if (!e) return;
    if (e->s && e->q_ok) {
        int n = 0;
        tern__qitem *list = tern__queue_drain(&e->q, e->cancel_ids, CANCEL_BATCH, &n);
        tern__sched_add(e->s, list, NULL, 0);
        tern__queue_done(&e->q, tern__sched_cancel_all(e->s));
    }
    tern__sched_close(e->s);
    if (e->tp) { /* the group owns every rank's cache, model and backend */
        tern_tp_close(e->tp);
        e->kv = NULL;
        e->m = NULL;
        e->be = NULL;
    }
    tern_kv_close(e->kv);
    tern_model_free(e->m);
    tern_weights_close(e->rws);
    if (e->rcfg) { tern_config_free(e->rcfg); free(e->rcfg); }
    tern_backend_close(e->be);
    tern_tokenizer_free(e->tok);
    if (e->q_ok) tern__queue_free(&e->q);
    free(e);
}

tern_status tern_engine_submit(tern_engine *e, const tern_request *r, uint64_t *id, tern_error *err) {
    if (id) *id = 0;
    if (!e) return tern_err(err, TERN_EINVAL, "tern_engine_submit: engine is NULL");
    tern__req *q = NULL;
    tern_status st = tern__req_new(e->s, r, &q, err);
    if (st) return st;
    uint64_t got = tern__queue_push(&e->q, &q->q);
    if (id) *id = got;
    return TERN_OK;
}

void tern_engine_cancel(tern_engine *e, uint64_t id) {
    if (e) tern__queue_cancel(&e->q, id);
}

tern_status tern_engine_step(tern_engine *e, tern_error *err) {
    if (!e) return tern_err(err, TERN_EINVAL, "tern_engine_step: engine is NULL");
    int n_cancel = 0, n_done = 0;
    tern__qitem *list = tern__queue_drain(&e->q, e->cancel_ids, CANCEL_BATCH, &n_cancel);
    tern__sched_add(e->s, list, e->cancel_ids, n_cancel);
    tern_status st = tern__sched_step(e->s, &n_done, err);
    if (n_done) tern__queue_done(&e->q, n_done);
    tern_engine_stats ss;
    tern__sched_stats(e->s, &ss);
    tern__queue_publish(&e->q, &ss);
    return st;
}

int tern_engine_pending(tern_engine *e) { return e ? tern__queue_live(&e->q) : 0; }

void tern_engine_run(tern_engine *e) {
    if (!e) return;
    while (!tern__queue_wait(&e->q, tern__sched_busy(e->s))) {
        tern_error err = {0};
        if (tern_engine_step(e, &err)) tern_log(TERN_LOG_ERROR, "engine step: %s", err.msg);
    }
}

void tern_engine_stop(tern_engine *e) {
    if (e) tern__queue_stop(&e->q);
}

tern_status tern_engine_tokenize(tern_engine *e, const char *text, size_t len, int add_special,
                                 int32_t **ids, int *n, tern_error *err) {
    if (ids) *ids = NULL;
    if (n) *n = 0;
    if (!e || !ids || !n || (!text && len)) return tern_err(err, TERN_EINVAL, "tern_engine_tokenize: NULL argument");
    if (!e->tok) return tern_err(err, TERN_EUNSUPPORTED, "model '%s' has no tokenizer (tokenizer.json)", e->name);
    size_t cnt = 0;
    tern_status st = tern_tokenizer_encode(e->tok, text ? text : "", len, add_special, 1, ids, &cnt, err);
    if (st) return st;
    if (cnt > (size_t)0x7fffffff) { free(*ids); *ids = NULL; return tern_err(err, TERN_EINVAL, "tokenize: text too long"); }
    *n = (int)cnt;
    return TERN_OK;
}

tern_status tern_engine_detokenize(tern_engine *e, const int32_t *ids, int n, char **text, tern_error *err) {
    if (text) *text = NULL;
    if (!e || !text || n < 0 || (!ids && n)) return tern_err(err, TERN_EINVAL, "tern_engine_detokenize: bad argument");
    if (!e->tok) return tern_err(err, TERN_EUNSUPPORTED, "model '%s' has no tokenizer (tokenizer.json)", e->name);
    return tern_tokenizer_decode(e->tok, ids, (size_t)n, 0, text, NULL, err);
}

void tern_engine_model_info(const tern_engine *e, tern_model_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->gen_temperature = info->gen_top_p = -1.0f;
    info->gen_top_k = -1;
    if (!e) return;
    const tern_model_config *c = tern_model_cfg(e->m);
    info->name = e->name;
    info->arch = e->arch;
    info->n_vocab = c->n_vocab;
    info->n_ctx = tern_kv_max_ctx(e->kv);
    info->n_layer = c->n_layer;
    info->n_embd = c->n_embd;
    info->bos_id = c->bos_id;
    for (int i = 0; i < e->n_stop && i < 8; i++) info->eos_ids[info->n_eos++] = e->stop[i]; /* the stop set */
    info->has_tokenizer = e->tok != NULL;
    info->has_chat_template = e->has_template;
    info->gen_temperature = (float)c->gen_temperature;
    info->gen_top_p = (float)c->gen_top_p;
    info->gen_top_k = c->gen_top_k;
    info->kv_quant = e->kv_spec[0] ? e->kv_spec : NULL;
    info->max_batch_tokens = e->max_batch_tokens;
}

void tern_engine_get_stats(tern_engine *e, tern_engine_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (e) tern__queue_stats(&e->q, st);
}

/* ---- internal accessors (engine_int.h) ---- */
const tern_tokenizer *tern__engine_tokenizer(const tern_engine *e) { return e ? e->tok : NULL; }
const char *tern__engine_dir(const tern_engine *e) { return e ? e->dir : ""; }

struct tern_backend *tern__engine_backend(const tern_engine *e) { return e ? e->be : NULL; }

double tern__engine_step_bytes(const tern_engine *e, int rows, long ctx) {
    if (!e || !e->m || rows < 1) return 0;
    tern_model_stats ms;
    tern_model_get_stats(e->m, &ms);
    const tern_model_config *c = tern_model_cfg(e->m);
    const double f = c->n_expert > 0 ? (double)c->n_expert_used / c->n_expert : 0; /* K/E */
    const double touched = f > 0 ? 1.0 - pow(1.0 - f, rows) : 0; /* share of a layer's experts rows tokens touch */
    return ms.bytes_per_token - ms.expert_bytes * f + ms.expert_bytes * touched +
           (double)rows * (double)(e->kv ? tern_kv_read_bytes(e->kv, ctx) : 0);
}