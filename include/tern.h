/*
 * tern.h — the public C API of tern, an LLM inference engine.
 *
 * Conventions (the whole library follows them):
 *   - Every fallible function returns tern_status: TERN_OK (0) or a negative code.
 *   - Functions that can fail also take an optional `tern_error *err`; when non-NULL
 *     it receives a one-line human message naming the file, field or parameter at fault.
 *   - Objects come in pairs `tern_x_open/_close` or `_init/_free`; every close/free accepts NULL.
 *   - Input can never abort the process: bad files, configs, requests are errors, not crashes.
 *
 * This header grows with the engine (engine/request/sampling API); see docs/ARCHITECTURE.md.
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tern_status {
    TERN_OK = 0,
    TERN_EINVAL = -1,      /* bad argument / bad request parameter */
    TERN_EIO = -2,         /* file could not be opened / read / mapped */
    TERN_EFORMAT = -3,     /* file content malformed (safetensors, json, config) */
    TERN_EUNSUPPORTED = -4,/* valid but not supported (architecture, dtype, quant bits) */
    TERN_ENOMEM = -5,      /* allocation failed or memory budget exceeded */
    TERN_EDEVICE = -6,     /* accelerator error */
    TERN_ECANCELLED = -7,  /* request cancelled */
    TERN_ENOTFOUND = -8,   /* named thing (tensor, file, model) absent */
    TERN_EINTERNAL = -9    /* bug: an invariant failed */
} tern_status;

#define TERN_ERROR_MSG_MAX 512

typedef struct tern_error {
    tern_status code;
    char msg[TERN_ERROR_MSG_MAX];
} tern_error;

/* Short stable name of a status ("ok", "invalid argument", ...). */
const char *tern_status_str(tern_status s);

/* Process exit code for a status per the CLI contract: 0 ok, 2 bad input, 1 otherwise. */
int tern_status_exit_code(tern_status s);


/* ======================================================================================
 * Engine: a loaded model + tokenizer + chat template + KV pool + scheduler.
 *
 * Threading: one engine thread runs the scheduler (tern_engine_run, or tern_engine_step in a
 * loop); any thread may submit and cancel requests. Events of a request are delivered by its
 * callback ON THE ENGINE THREAD: keep callbacks short (copy the data into your own queue).
 *
 *   tern_engine *e; tern_engine_opts o = tern_engine_default_opts(); o.model = "path";
 *   if (tern_engine_open(&e, &o, &err)) ... ;
 *   tern_request r = tern_request_default(); r.prompt = ids; r.n_prompt = n; r.on_event = cb;
 *   uint64_t id; tern_engine_submit(e, &r, &id, &err);
 *   while (tern_engine_pending(e)) tern_engine_step(e, &err);     // or a thread: tern_engine_run
 * ====================================================================================== */

typedef struct tern_engine tern_engine;

typedef struct tern_engine_opts {
    const char *model;        /* model directory, or "demo" (the embedded tiny model); NULL = demo */
    const char *device;       /* "cpu", "cuda", "auto" (default auto) */
    int compute_bf16;         /* 0: exact f32 path; 1: bf16 compute where the backend has it (matmul inputs
                                 rounded to bf16); 2: bf16x2 (inputs as a bf16 pair: f32-accurate products);
                                 3: int8 on the CPU (x quantized per group for Q4/Q8 weights; bf16 on a GPU);
                                 -1 (tern_engine_default_opts): bf16 on a GPU, f32 on the CPU */
    int n_threads;            /* CPU threads, 0 = all cores */
    int max_concurrency;      /* sequences decoded together (KV slots); default 8 */
    int max_ctx;              /* longest sequence; 0 = min(model context, 8192) */
    int max_batch_tokens;     /* rows per forward step (prefill chunk budget); 0 (default): 8192 on a GPU of 70+ GiB,
                               * 2048 on smaller GPUs, 512 on the CPU; at least max_concurrency */
    double kv_memory_gb;      /* KV pool size; 0 = derived (max_concurrency * max_ctx) */
    double memory_budget_gb;  /* everything; 0 = unlimited */
    double prompt_cache_gb;   /* prefix-cache cap; 0 disables */
    const char *kv_quant;     /* "auto" (default: kv_config.json if present, else off), "off", "f16",
                                 "bf16", "8", "4", "8:32", "turbo[:k,v]", "config" (io/kv_config.h) */
    int speculative_k;        /* default draft length of requests that ask for the engine default
                                 (tern_request.speculative_k < 0); 0 = off, at most TERN_SPEC_MAX_K */
    int gpus;                 /* (appended) tensor-parallel ranks: GPUs 0..gpus-1 with device cuda/auto, CPU
                                 ranks with device cpu (tests); 0 = TERN_TP from the environment, else 1 */
    double expert_cache_gb;   /* (appended) MoE expert offload: slot cache over every MoE layer (RAM on the
                                 CPU, VRAM on CUDA); experts stay in their stored bytes; 0 = off (docs/OFFLOAD.md) */
    const char *expert_trace; /* (appended) routing trace: one JSON line per MoE layer call, or NULL */
    int no_mmap;              /* (appended) 1: read the weights into anonymous memory (2 MB pages) instead
                                 of mapping the files (default 0: mmap); offloaded experts stay in the file */
} tern_engine_opts;

tern_engine_opts tern_engine_default_opts(void);
tern_status tern_engine_open(tern_engine **out, const tern_engine_opts *opts, tern_error *err);
void tern_engine_close(tern_engine *e);   /* cancels what is running; accepts NULL */

/* Sampling parameters (the sampler chain order is documented in src/sample/sampler.h). */
typedef struct tern_sampling {
    float temperature;        /* 0 = greedy (default 1.0 via tern_request_default; generation_config may set) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty, frequency_penalty; /* 0 = off */
    int penalty_last_n;       /* window of past tokens for penalties; -1 = whole sequence */
    uint64_t seed;            /* same seed -> same tokens, whatever else is in the batch */
    const int32_t *bias_ids;  /* logit_bias: n_bias (id, value) pairs */
    const float *bias_values;
    int n_bias;
    int n_logprobs;           /* 0 = none; >0: chosen token logprob + this many alternatives (<= 20) */
} tern_sampling;

typedef enum tern_event_kind {
    TERN_EV_TOKEN = 1,        /* a generated token */
    TERN_EV_DONE = 2,         /* request finished (finish_reason set); last event */
    TERN_EV_ERROR = 3         /* request failed (message in err); last event */
} tern_event_kind;

typedef enum tern_finish_reason {
    TERN_FINISH_NONE = 0,
    TERN_FINISH_STOP = 1,     /* EOS or a stop token */
    TERN_FINISH_LENGTH = 2,   /* max_tokens reached or the context is full */
    TERN_FINISH_CANCELLED = 3 /* tern_engine_cancel or the callback asked to stop */
} tern_finish_reason;

typedef struct tern_event {
    tern_event_kind kind;
    uint64_t request_id;
    int32_t token;            /* TOKEN */
    float logprob;            /* TOKEN, when n_logprobs > 0 */
    int n_top;                /* TOKEN: alternatives below */
    const int32_t *top_ids;
    const float *top_logprobs;
    tern_finish_reason finish; /* DONE */
    int n_prompt, n_cached, n_generated; /* usage (DONE; n_cached = prompt tokens served from the prefix cache;
                                            n_generated = TOKEN events: a matched stop/EOS token is not emitted) */
    double t_queue, t_first_token, t_total; /* seconds since submit (DONE) */
    const tern_error *err;    /* ERROR */
} tern_event;

/* Return 0 to continue; 1 to end the request as cancelled (TERN_FINISH_CANCELLED); 2 to end it
 * as stopped (TERN_FINISH_STOP, e.g. the caller matched a stop string in the text). */
typedef int (*tern_event_fn)(void *ctx, const tern_event *ev);

typedef struct tern_request {
    const int32_t *prompt;    /* copied at submit */
    int n_prompt;
    int max_tokens;           /* default 256; clipped to the context */
    tern_sampling sampling;
    const int32_t *stop_ids;  /* extra stop tokens (EOS ids of the model are added unless ignore_eos) */
    int n_stop_ids;
    int ignore_eos;
    int priority;             /* reserved */
    tern_event_fn on_event;
    void *ctx;
    /* Optional constrained decoding: called on the engine thread before each token is sampled
     * (after bias and penalties); may set logits to -INFINITY. Nonzero return fails the request.
     * The callee tracks its own state (e.g. from on_event TOKEN events, which arrive before
     * the next call). */
    int (*mask)(void *mask_ctx, float *logits, int n_vocab);
    void *mask_ctx;
    /* Speculative decoding by prompt lookup (n-gram drafts from the request's own tokens):
     * up to this many drafted tokens are verified per step. 0 = off, < 0 = the engine's
     * default (tern_request_default sets -1), at most TERN_SPEC_MAX_K. Output is the same as
     * without speculation: greedy tokens identical, sampled tokens identical for a seed. */
    int speculative_k;
} tern_request;

#define TERN_SPEC_MAX_K 16

tern_request tern_request_default(void);

/* Thread-safe. Validates (prompt ids in range, lengths, sampling params) and queues the request. */
tern_status tern_engine_submit(tern_engine *e, const tern_request *r, uint64_t *id, tern_error *err);
/* Thread-safe. The request ends at the next step with TERN_FINISH_CANCELLED; its KV is freed. */
void tern_engine_cancel(tern_engine *e, uint64_t id);
/* Engine thread: one scheduler step (admit, one forward over the batch, sample, emit events).
 * Returns TERN_OK also when idle. */
tern_status tern_engine_step(tern_engine *e, tern_error *err);
/* Number of requests queued or running. */
int tern_engine_pending(tern_engine *e);
/* Engine thread: step until tern_engine_stop is called (sleeps when idle). */
void tern_engine_run(tern_engine *e);
void tern_engine_stop(tern_engine *e);      /* thread-safe */

/* Text side (NULL tokenizer: TERN_EUNSUPPORTED). Returned buffers are malloc'd: free(). */
tern_status tern_engine_tokenize(tern_engine *e, const char *text, size_t len, int add_special,
                                 int32_t **ids, int *n, tern_error *err);
tern_status tern_engine_detokenize(tern_engine *e, const int32_t *ids, int n, char **text, tern_error *err);

/* Model facts for servers and tools. */
typedef struct tern_model_info {
    const char *name;         /* directory base name or "demo" */
    const char *arch;
    int n_vocab, n_ctx, n_layer, n_embd;
    int bos_id, eos_ids[8], n_eos;
    int has_tokenizer, has_chat_template;
    /* sampling defaults from generation_config.json; < 0 when the file does not set them */
    float gen_temperature, gen_top_p;
    int gen_top_k;
    const char *kv_quant;     /* the --kv-quant spec the KV cache was opened with, defaults applied
                               * ("gpu-bf16" = auto on a GPU in the bf16 mode; io/kv_config.h); NULL: unknown */
    int max_batch_tokens;     /* rows per forward step the engine runs (defaults applied); 0: unknown */
} tern_model_info;
void tern_engine_model_info(const tern_engine *e, tern_model_info *info);

/* Counters for /metrics and /stats (thread-safe snapshot). */
typedef struct tern_engine_stats {
    int running, waiting;
    long long requests_done, requests_cancelled, requests_failed;
    long long prompt_tokens, cached_tokens, generated_tokens;
    int kv_blocks_used, kv_blocks_total;
    double prefix_hit_rate;
    long long preemptions;    /* requests evicted from the KV pool to be recomputed later */
    int kv_blocks_cached;     /* blocks held by the prefix cache (counted in kv_blocks_used too) */
    long long spec_drafted;   /* speculative draft tokens verified */
    long long spec_accepted;  /* ... of which accepted (each saved one decode step) */
    long long steps;          /* forward steps run (appended) */
    long long steps_queued;   /* ... of which were queued before the previous step's tokens reached the host
                                 (the pipelined decode, TERN_ASYNC) */
} tern_engine_stats;
void tern_engine_get_stats(tern_engine *e, tern_engine_stats *st);

#ifdef __cplusplus
}
#endif
#endif
