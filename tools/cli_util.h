/*
 * cli_util.h — what the subcommands share: the common flags of DESIGN.md §7, opening a
 * backend + model from a directory (or `demo`), parsing id lists, reporting errors with the
 * contract's exit codes (0 ok, 2 bad input, 1 other).
 */
#ifndef TERN_CLI_UTIL_H
#define TERN_CLI_UTIL_H

#include "model/model.h"
#include "runtime/kv.h"

typedef struct cli_common {
    const char *model;       /* directory or "demo" */
    const char *device;      /* cpu | cuda | auto */
    tern_compute compute;     /* when compute_set: --compute; otherwise bf16 on a GPU, f32 on the CPU */
    int compute_set;
    int threads;
    int max_ctx;
    const char *random;      /* --random NAME: synthesize weights of a preset geometry */
    int random_bits;         /* --quant q4|q8|...: 0 = bf16 */
    int random_group;        /* --group N */
    const char *kv_quant;    /* --kv-quant SPEC (io/kv_config.h); NULL = auto */
    double expert_cache_gb;  /* --expert-cache GB: MoE expert offload slot cache (0 = off) */
    const char *expert_trace;/* --expert-trace FILE: one JSON line per MoE layer call */
    int gpus;                /* --gpus N (alias --tp N): tensor-parallel ranks (model/tp.h); 0 = TERN_TP */
    int no_mmap;             /* --no-mmap: read weights into anonymous 2 MB-page memory (default: mmap) */
    int max_batch;           /* rows per forward the model is sized for (bench --chunk); 0: tern_model_default_batch */
} cli_common;

/* If argv[*i] is a common flag, consume it (and its value) and return 1; 0 if not a common
 * flag; -1 on a bad value (message printed). */
int cli_common_flag(cli_common *c, int argc, char **argv, int *i);

typedef struct cli_session {
    tern_backend *be;
    tern_model *model;
    tern_kv *kv;
    tern_model_config *cfg;  /* owned for --random */
    tern_weights *ws;
    struct tern_tp *tp;      /* --gpus N > 1: the group owns be, model and kv */
} cli_session;

/* Open backend + model (+ a KV cache with n_slots slots when n_slots > 0). Prints the error. */
int cli_open(const cli_common *c, int n_slots, cli_session *s);
void cli_close(cli_session *s);

/* "2,17,99" -> ids. Returns count, or -1 (message printed) on bad syntax. *ids malloc'd. */
int cli_parse_ids(const char *s, int32_t **ids);
/* Print "tern <cmd>: <msg>" and return the contract exit code for the status. */
int cli_fail(const char *cmd, const tern_error *e);
int cli_usage_error(const char *cmd, const char *fmt, ...);
/* Parse an int flag value with range check. */
int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out);

#endif
