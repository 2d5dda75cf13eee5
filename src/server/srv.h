/*
 * srv.h — internals shared by the src/server files (not for other layers).
 *
 * Flow of one generation request:
 *   http.c      accumulates the body, checks auth/limits, routes to a handler;
 *   openai_*.c / anthropic.c parse + validate into srv_params (params.c), build the prompt
 *               (prompt.c), tokenize, then srv_job_start (job.c) submits to the engine;
 *   job.c       owns the per-request channel: the engine callback (engine thread) only copies
 *               events into it; the HTTP thread drains it, detokenizes incrementally, matches
 *               stop strings with hold-back and hands text pieces to the API formatter;
 *   sse.c       turns a job into a chunked text/event-stream response using the family's
 *               start/piece/end formatters: the stream writer thread formats and sends the
 *               events of all streams (woken once per engine step) while the stream's MHD
 *               thread waits; non-streaming handlers just loop srv_job_next until the end
 *               and write one JSON object.
 * A client that goes away is noticed by polling its socket while waiting (and by MHD's
 * response free callback); the job is then cancelled and the engine frees its KV.
 */
#ifndef TERN_SERVER_SRV_H
#define TERN_SERVER_SRV_H

#include "server/jsonw.h"
#include "server/server.h"
#include "base/base.h"
#include "text/chat.h"
#include "text/toolcall.h"
#include "server/jsonfsm.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* ---- engine table: the real engine (engine_real.c) or the fake one (fake_engine.c) ---- */
typedef struct srv_engine_vt {
    const char *name;
    tern_status (*open)(void **out, const tern_engine_opts *o, tern_error *err);
    void (*close)(void *e);
    tern_status (*submit)(void *e, const tern_request *r, uint64_t *id, tern_error *err);
    void (*cancel)(void *e, uint64_t id);
    /* Engine loop (engine thread) until stop: after_step(arg) runs after every step, so the
     * server can wake the HTTP threads of all requests that got tokens in one pass (job.c). */
    void (*run)(void *e, void (*after_step)(void *arg), void *arg);
    void (*stop)(void *e);
    tern_status (*tokenize)(void *e, const char *text, size_t len, int add_special, int32_t **ids, int *n,
                            tern_error *err);
    tern_status (*detokenize)(void *e, const int32_t *ids, int n, char **text, tern_error *err);
    void (*model_info)(const void *e, tern_model_info *info);
    void (*get_stats)(void *e, tern_engine_stats *st);
    const tern_tokenizer *(*tokenizer)(void *e);   /* for streaming detok + JSON masks */
    const char *(*dir)(void *e);                  /* model directory (start-up report); NULL: none */
} srv_engine_vt;

/* NULL when this binary was linked without the engine. */
const srv_engine_vt *tern__srv_real_engine(void);
const srv_engine_vt *tern__srv_fake_engine(void);
/* tern_request_default() / tern_engine_default_opts(), or equivalent values without the engine. */
tern_request tern__srv_request_default(void);
tern_engine_opts tern__srv_engine_default_opts(void);

enum { SRV_LOADING = 0, SRV_READY = 1, SRV_FAILED = 2 };

struct tern_server {
    tern_server_opts o;
    char host[256];
    char api_key[512];
    char served[256];          /* model id we report and accept */
    int port;
    int listen_fd;
    struct MHD_Daemon *mhd;
    const srv_engine_vt *vt;
    void *eng;
    tern_model_info info;
    tern_chat_template *tmpl;  /* NULL: plain fallback format (prompt.c) */
    pthread_t engine_thread;
    int engine_thread_started;
    pthread_mutex_t mu;        /* guards state/load_err, broadcasts on load */
    pthread_cond_t cv;
    int state;
    tern_error load_err;
    atomic_int stopping;
    long long created;         /* unix time of start */
    double t_start;
    atomic_ullong next_id;
    atomic_llong n_http, n_http_4xx, n_http_5xx, n_streams, n_disconnects;
    tern_tools_format tools_fmt;   /* output markup of the model's template (toolcall.h) */
    tern_reason_format reason_fmt;
    pthread_mutex_t vocab_mu;
    srv_jvocab *jvocab;            /* token bytes for JSON masks, built on first use */
    struct srv_metrics *metrics;   /* metrics.c */
    struct srv_store *store;       /* responses.c: previous_response_id store */
    atomic_int n_live;             /* jobs submitted and not yet ended (admission, job.c) */
    clockid_t engine_clock;        /* CPU-time clock of the engine thread (for /metrics) */
    atomic_int has_engine_clock;
    struct srv_job **wake;         /* engine thread only: jobs to wake after this step (job.c) */
    int n_wake, cap_wake;
    struct srv_waker *waker;       /* job.c: wakes HTTP threads off the engine thread */
    struct srv_writer *writer;     /* sse.c: writes every SSE stream; NULL: each HTTP thread writes its own */
    int kick_after_step;           /* engine thread only: a writer-owned job got events this step */
    atomic_llong n_rejected;       /* 429s: the wait queue was full */
    char summary[2048];            /* start-up report: model + memory plan (plan.c) */
    double t_loaded;               /* seconds from start to ready */
};

/* ---- errors carried to the API formatter ---- */
typedef struct srv_error {
    int http;                  /* 400, 404, 413, 500, 503 ... */
    const char *type;          /* "invalid_request_error", "server_error", ... */
    char param[64];            /* offending field, "" if none */
    const char *code;          /* optional machine code, NULL */
    char msg[TERN_ERROR_MSG_MAX];
} srv_error;

/* Fill e; returns -1 so handlers can `return srv_fail(...)`. */
int srv_fail(srv_error *e, int http, const char *param, const char *fmt, ...) TERN_PRINTF(4, 5);

/* ---- generation parameters (params.c) ---- */
typedef enum { SRV_API_OPENAI = 0, SRV_API_ANTHROPIC = 1 } srv_api;

typedef struct srv_params {
    tern_sampling s;           /* bias arrays point into bias_ids/bias_vals below */
    int max_tokens;            /* 0 = server default */
    int ignore_eos;
    int speculative_k;          /* extension: -1 = server default, 0 = off, 1..16 */
    int stream, include_usage;
    int logprobs, top_logprobs;
    char **stop;               /* stop strings (owned) */
    int n_stop;
    int32_t *bias_ids;         /* owned */
    float *bias_vals;
    int n_bias;
    int has_seed;
    /* output handling (set by the handlers after the prompt is built) */
    int parse_output;          /* run the tool-call / reasoning parser (toolcall.h) */
    int start_in_reasoning;    /* the prompt ends inside an open reasoning block */
    cJSON *tools;              /* owned copy of the request's tools (schema-aware parsing) */
    srv_jgram *gram;           /* owned: response_format grammar, NULL = free text */
} srv_params;

/* Read the sampling/limit fields shared by the APIs from a request object. n_vocab bounds
 * logit_bias ids; n_ctx bounds max_tokens. Returns 0 or -1 with e filled. Omitted fields take
 * the engine's request defaults; srv_params_parse_s takes the server's (--temperature ...). */
int srv_params_parse(srv_params *p, const cJSON *req, srv_api api, int n_vocab, int n_ctx, srv_error *e);
int srv_params_parse_s(srv_params *p, const cJSON *req, srv_api api, const tern_server *s, srv_error *e);
void srv_params_free(srv_params *p);

/* Typed field helpers (absent or null -> 0 and *out untouched). Return 1 present, 0 absent,
 * -1 error (e filled naming the field). */
int srv_get_num(const cJSON *o, const char *k, double lo, double hi, double *out, srv_error *e);
int srv_get_int(const cJSON *o, const char *k, long long lo, long long hi, long long *out, srv_error *e);
/* 1 when the JSON number d is a token id of a vocabulary of n: an integer in [0, n). Compared as a double first (a
 * cast of a value past int's range is undefined) */
static inline int srv_is_token_id(double d, int n) { return d >= 0 && d < (double)n && d == (double)(int32_t)d; }
int srv_get_bool(const cJSON *o, const char *k, int *out, srv_error *e);
int srv_get_str(const cJSON *o, const char *k, const char **out, srv_error *e);

/* ---- prompt building (prompt.c) ---- */
typedef struct srv_prompt {
    int32_t *ids;
    int n;
    char *text;                /* the rendered prompt (debug; NULL for raw ids) */
} srv_prompt;
/* OpenAI-style messages array (system/developer/user/assistant/tool) -> token ids. `system`
 * (Anthropic top-level) is prepended when non-NULL. anthropic=1 reads Anthropic content
 * blocks. template_kwargs: the request's chat_template_kwargs object (or NULL). */
int srv_prompt_chat(tern_server *s, const cJSON *messages, const char *system, const cJSON *tools,
                    const cJSON *template_kwargs, int anthropic, srv_prompt *out, srv_error *e);
/* Same, with enable_thinking (-1 = not passed). */
int srv_prompt_chat2(tern_server *s, const cJSON *messages, const char *system, const cJSON *tools,
                     const cJSON *template_kwargs, int anthropic, int enable_thinking, srv_prompt *out,
                     srv_error *e);
/* Raw completion prompt: string, [string], [ids], [[ids]]. */
int srv_prompt_raw(tern_server *s, const cJSON *prompt, srv_prompt *out, srv_error *e);
void srv_prompt_free(srv_prompt *p);

/* ---- jobs (job.c) ---- */
typedef struct srv_job srv_job;

typedef struct srv_tokinfo {   /* one generated token, for logprobs */
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[20];
    float top_lps[20];
} srv_tokinfo;

typedef struct srv_piece {
    const char *text;          /* new content text (may be empty); valid until the next call */
    size_t len;
    const char *reasoning;     /* new reasoning text (may be empty) */
    size_t reasoning_len;
    int call_lo, call_hi;      /* tool calls [call_lo, call_hi) completed in this piece */
    const srv_tokinfo *toks;   /* tokens consumed since the previous piece */
    int n_toks;
} srv_piece;

typedef enum { SRV_END_STOP, SRV_END_LENGTH, SRV_END_STOP_STRING, SRV_END_CANCELLED } srv_end;

typedef struct srv_result {    /* valid once srv_job_next returned 0 */
    srv_end end;
    int stop_index;            /* SRV_END_STOP_STRING: which stop string */
    int n_prompt, n_cached, n_generated;
    int n_calls;               /* tool calls parsed (finish_reason tool_calls when > 0) */
} srv_result;

int srv_job_start(tern_server *s, const srv_prompt *pr, srv_params *p, int fd, srv_job **out,
                  srv_error *e);   /* p is moved into the job (zeroed) */
/* Engine thread, after every engine step (the vt's after_step): wake the HTTP threads waiting
 * on jobs that received events during the step — one wake per request per step. */
void srv_jobs_after_step(void *server);
/* The thread that does those wake-ups when a step has many (job.c); without it (start
 * failed) the engine thread does them. stop wakes what is left, then joins. */
int srv_waker_start(tern_server *s);
void srv_waker_stop(tern_server *s);
/* Wait for the next piece: 1 = piece filled, 0 = finished (result filled), -1 = failed
 * (e filled: engine error, client gone (http 499), server stopping). */
int srv_job_next(srv_job *j, srv_piece *out, srv_result *res, srv_error *e);
/* The same without waiting: 2 = nothing new yet. */
int srv_job_next_nowait(srv_job *j, srv_piece *out, srv_result *res, srv_error *e);
/* From now on the job's events kick the stream writer (srv_writer_kick, once per engine step)
 * instead of waking a thread waiting in srv_job_next. */
void srv_job_set_notify(srv_job *j);
/* The client went away (seen by the stream writer): cancel, count the disconnect. */
void srv_job_client_gone(srv_job *j);
void srv_job_free(srv_job *j);   /* cancels if still running; accepts NULL */
const srv_params *srv_job_params(const srv_job *j);
/* Tool call i of a job (name, arguments JSON, id "call_..."); NULL if out of range. */
const tern_tool_call *srv_job_call(const srv_job *j, int i, const char **id);
/* Configure output parsing for a chat request: formats from the server, start_in_reasoning
 * from the rendered prompt, tools copied. tools_on: the request may produce tool calls. */
int srv_output_setup(tern_server *s, srv_params *p, const srv_prompt *pr, const cJSON *tools, int tools_on,
                     srv_error *e);
/* response_format / text.format: {"type": "text" | "json_object" | "json_schema", ...}. The
 * json_schema form is {"json_schema": {"schema": {...}}} (chat) or {"schema": {...}}
 * (responses). Compiles p->gram. param names the field for errors. */
int srv_response_format(tern_server *s, srv_params *p, const cJSON *rf, const char *param, srv_error *e);
/* A model without a tokenizer: token id -> "<ID>" (the text it streams, /detokenize and
 * logprob entries show); returns the length. */
#define SRV_ID_TEXT_MAX 16
int srv_id_text(int32_t id, char buf[SRV_ID_TEXT_MAX]);
/* Token text for logprob entries (decode of the single id); malloc'd. */
char *srv_token_text(tern_server *s, int32_t id);

/* ---- SSE streaming (sse.c) ---- */
typedef struct srv_req srv_req;   /* http.c, below */
typedef struct srv_stream_fmt {
    void (*start)(void *ctx, tern_jw *out);
    void (*piece)(void *ctx, const srv_piece *p, tern_jw *out);
    void (*end)(void *ctx, const srv_result *r, tern_jw *out);
    void (*error)(void *ctx, const srv_error *e, tern_jw *out);
    void (*free_ctx)(void *ctx);
} srv_stream_fmt;
/* Queue a 200 text/event-stream response that drives job j; takes ownership of j and ctx. */
enum MHD_Result srv_stream(srv_req *r, srv_job *j, const srv_stream_fmt *f, void *ctx);
/* The stream writer (sse.c): one thread that formats and sends the SSE events of every
 * stream, woken at most once per engine step; the HTTP thread of a stream only hands its
 * socket over and waits for the end. start/stop: server start-up and shut-down (stop after
 * MHD has stopped); kick: new events for writer-owned jobs (any thread; no-op without one). */
int srv_writer_start(tern_server *s);
void srv_writer_stop(tern_server *s);
void srv_writer_kick(tern_server *s);
/* Append "data: <json>\n\n" / "event: NAME\ndata: <json>\n\n" framing around a jw value. */
void srv_sse_data(tern_jw *out, const char *event, const char *json, size_t n);
/* The same framing around a value written straight into out (no copy): begin, one complete
 * JSON value, end. For the per-token events. */
void srv_sse_begin(tern_jw *out, const char *event);
void srv_sse_end(tern_jw *out);
/* srv_sse_data of the finished value in v (taken: v is left empty); out->oom when it cannot be */
void srv_sse_value(tern_jw *out, const char *event, tern_jw *v);
/* An OpenAI stream's error event (srv_jw_openai_error's value, as a reply's body has it) and the final [DONE] */
void srv_sse_openai_error(tern_jw *out, const srv_error *e);
/* An OpenAI stream's last event: data: [DONE] */
void srv_sse_done(tern_jw *out);

/* ---- HTTP helpers (http.c) ---- */
struct srv_req {
    tern_server *s;
    struct MHD_Connection *conn;
    const char *url, *method;
    const char *body;
    size_t body_len;
    int fd;                    /* client socket, for disconnect polling */
    int http11;                /* HTTP/1.1: streams are chunked (the stream writer frames them) */
};

enum MHD_Result srv_reply(srv_req *r, int status, const char *ctype, const char *body, size_t len);
enum MHD_Result srv_reply_jw(srv_req *r, int status, tern_jw *w);   /* consumes w */
enum MHD_Result srv_reply_openai_error(srv_req *r, const srv_error *e);
/* The OpenAI error value {"error": {message, type, param, code}} of e (the reply's body, a stream's error event) */
void srv_jw_openai_error(tern_jw *w, const srv_error *e);
enum MHD_Result srv_reply_anthropic_error(srv_req *r, const srv_error *e);
/* Anthropic's error object {"type":"error","error":{"type":T,"message":...}} with T from the HTTP status (401
 * authentication_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503 overloaded_error, other
 * 5xx api_error, else invalid_request_error): the reply body and a stream's error event alike */
void srv_write_anthropic_error(tern_jw *w, const srv_error *e);
void srv_add_common_headers(tern_server *s, struct MHD_Response *resp);
/* Parse the body as a JSON object (errors -> e, 400; a string or key that is not valid UTF-8
 * -> 400 naming its path, e.g. messages[0].content). */
int srv_parse_body(srv_req *r, cJSON **out, srv_error *e);
/* Wait until the model is loaded; -1 (503 in e) if loading failed or the server stops. */
int srv_wait_ready(tern_server *s, srv_error *e);
/* Check the request's "model" field against the served id (absent is fine). */
int srv_check_model(tern_server *s, const cJSON *req, srv_error *e);
/* "chatcmpl-" + 24 random characters */
void srv_make_id(tern_server *s, const char *prefix, char *buf, size_t n);
int srv_client_gone(int fd);

/* ---- shared response pieces (openai_chat.c) ---- */
const char *srv_finish_str(srv_end e);                       /* "stop" / "length" */
const char *srv_finish_str_r(const srv_result *r);          /* + "tool_calls" */
void srv_write_usage(tern_jw *w, const srv_result *r);      /* "usage": {...} (OpenAI) */
void srv_write_chat_logprobs(tern_server *s, tern_jw *w, const srv_tokinfo *t, int n, int top);
/* Run a non-streaming job to its end: text (malloc'd), tokens (malloc'd, logprobs only). */
int srv_collect(srv_job *j, char **text, size_t *len, srv_tokinfo **toks, int *n_toks, srv_result *res,
                srv_error *e);
/* Same, also collecting reasoning text (malloc'd, may be NULL when none). The job stays
 * valid (its tool calls can be read) until srv_job_free. */
int srv_collect2(srv_job *j, char **text, size_t *len, char **rtext, size_t *rlen, srv_tokinfo **toks, int *n_toks,
                 srv_result *res, srv_error *e);

/* ---- handlers ---- */
enum MHD_Result srv_handle_chat(srv_req *r);
enum MHD_Result srv_handle_completions(srv_req *r);
enum MHD_Result srv_handle_messages(srv_req *r);
enum MHD_Result srv_handle_health(srv_req *r);
enum MHD_Result srv_handle_models(srv_req *r, const char *id);
enum MHD_Result srv_handle_metrics(srv_req *r);
enum MHD_Result srv_handle_stats(srv_req *r);
enum MHD_Result srv_handle_tokenize(srv_req *r);
enum MHD_Result srv_handle_detokenize(srv_req *r);
enum MHD_Result srv_handle_responses(srv_req *r);
enum MHD_Result srv_handle_embeddings(srv_req *r);
enum MHD_Result srv_handle_count_tokens(srv_req *r);

/* ---- metrics (metrics.c) ---- */
int srv_metrics_init(tern_server *s);
void srv_metrics_free(tern_server *s);
void srv_metrics_http(tern_server *s, int status);           /* one HTTP answer */
void srv_metrics_ttft(tern_server *s, double seconds);
void srv_metrics_itl(tern_server *s, double seconds);
/* Prometheus text for the request/latency metrics (appended to /metrics). */
void srv_metrics_write(tern_server *s, tern_jw *out);

void srv_responses_free(tern_server *s);                   /* responses.c: the store */

/* ---- start-up report (plan.c) ---- */
/* Fill s->summary after the model loaded: model facts, weights bytes, KV pool bytes/blocks,
 * KV bytes per token; t_open = seconds the engine took to open, t_opened = when it returned
 * (tern_time_s), so the report also says how long the rest of the start-up took. */
void srv_plan_summary(tern_server *s, double t_open, double t_opened);
/* Path of the first string or key in v that is not valid UTF-8 ("" if all are); 1 if found. */
int srv_json_bad_utf8(const cJSON *v, char *path, size_t n);

/* ---- reasoning switch (params.c) ---- */
/* reasoning_effort ("none" -> off; minimal/low/medium/high -> on) -> -1 unset, 0, 1. */
int srv_reasoning_effort(const cJSON *req, int *enable, srv_error *e);

#endif
