/*
 * cli_text.h — text in, text out for `tern generate "prompt"` and `tern chat`: an engine,
 * the model's chat template, and a streaming run that prints detokenized text as it comes.
 */
#ifndef TERN_CLI_TEXT_H
#define TERN_CLI_TEXT_H

#include "tern.h"
#include "text/chat.h"
#include "text/detok.h"

typedef struct cli_text {
    tern_engine *eng;
    tern_chat_template *tpl;   /* NULL: raw prompts only */
    tern_detok *detok;
    tern_sampling sp;
    int max_tokens, ignore_eos;
} cli_text;

typedef struct cli_text_flags {
    const char *model, *device;
    int threads, max_ctx, compute_bf16;
    double temperature, top_p, min_p;   /* < 0: the model's generation_config / defaults */
    int top_k, max_tokens, ignore_eos;
    long long seed;                     /* < 0: random */
    const char *kv_quant;               /* --kv-quant SPEC; NULL = auto (io/kv_config.h) */
    int speculative;                    /* --speculative K: prompt-lookup draft length; 0 = off */
    int gpus;                           /* --gpus N (--tp N): tensor-parallel ranks (model/tp.h); 0 = TERN_TP */
    double expert_cache_gb;             /* --expert-cache GB: MoE expert offload (0 = off) */
    const char *expert_trace;           /* --expert-trace FILE */
} cli_text_flags;

/* Parse a sampling/text flag at argv[*i] (consuming its value). 1 consumed, 0 not ours, -1 bad. */
int cli_text_flag(cli_text_flags *f, const char *cmd, int argc, char **argv, int *i);
int cli_text_open(cli_text *t, const cli_text_flags *f, const char *cmd);
void cli_text_close(cli_text *t);
/* Render messages (JSON array) with the template (add_generation_prompt) into prompt ids. */
int cli_text_chat_ids(cli_text *t, const cJSON *messages, int32_t **ids, int *n, const char *cmd);
/* Generate from ids, streaming text to stdout; *reply (malloc'd, may be NULL) gets the text. */
int cli_text_run(cli_text *t, const int32_t *ids, int n, char **reply, const char *cmd);

#endif
