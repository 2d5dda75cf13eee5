/*
 * tern.c — the command-line entry point: dispatches to tools/cmd_*.c (contract in
 * DESIGN.md §7). Subcommands are weak symbols so the CLI builds while some are missing.
 */
#include "cli.h"
#include "tern.h"

#include <stdio.h>
#include <string.h>

#define WEAK __attribute__((weak))
WEAK int tern_cmd_logits(int, char **);
WEAK int tern_cmd_generate(int, char **);
WEAK int tern_cmd_info(int, char **);
WEAK int tern_cmd_bench(int, char **);
WEAK int tern_cmd_tokenize(int, char **);
WEAK int tern_cmd_detokenize(int, char **);
WEAK int tern_cmd_template(int, char **);
WEAK int tern_cmd_chat(int, char **);
WEAK int tern_cmd_serve(int, char **);
WEAK int tern_cmd_fit(int, char **);

#define COMMON "[--device cpu|cuda|auto] [--compute f32|bf16|bf16x2|int8] [--threads N] [--max-ctx N] [--kv-quant SPEC]" \
    " [--gpus N] [--expert-cache GB] [--expert-trace FILE] [--no-mmap]"
#define SAMPLING "[--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed N] [--max-tokens N] [--speculative K]"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
    const char *usage; /* NULL: the command prints its own (serve) */
} k_cmds[] = {
    {"generate", tern_cmd_generate, "generate text or ids from a prompt",
     "tern generate [MODEL] \"prompt\" [--raw] [--system S] " SAMPLING " " COMMON "\n"
     "       tern generate MODEL --ids 2,17,99 --max-tokens N --temperature 0 [--ignore-eos] [--print-ids] " COMMON},
    {"chat", tern_cmd_chat, "interactive chat", "tern chat [MODEL] [--system S] " SAMPLING " " COMMON
     "\n       (one user turn per stdin line; /reset clears the history, /exit ends)"},
    {"serve", tern_cmd_serve, "OpenAI/Anthropic-compatible HTTP server", NULL},
    {"logits", tern_cmd_logits, "write final logits of one forward pass",
     "tern logits MODEL --ids 2,17,99 --out FILE " COMMON "\n       (FILE: float32 LE [n_ids, vocab], after softcap)"},
    {"tokenize", tern_cmd_tokenize, "text -> token ids",
     "tern tokenize MODEL (--text-file F | --jsonl F | --text STR) [--no-special] [--no-parse-special] [--tokens] [--stats]"},
    {"detokenize", tern_cmd_detokenize, "token ids -> text", "tern detokenize MODEL (--ids 1,2,3 | --jsonl F) [--skip-special]"},
    {"template", tern_cmd_template, "render the model's chat template",
     "tern template MODEL --messages-file F.json [--tools F.json] [--add-generation-prompt]"},
    {"info", tern_cmd_info, "describe a model directory", "tern info [MODEL] | tern info --random NAME [--config]"},
    {"fit", tern_cmd_fit, "memory plan for a model",
     "tern fit MODEL|--random PRESET [--ctx N] [--max-concurrency N] [--memory-budget GB] [--kv-quant SPEC] "
     "[--expert-cache GB]"},
    {"bench", tern_cmd_bench, "prefill/decode speed",
     "tern bench [MODEL | --random PRESET [--quant bf16|q8|q4|...] [--group 32|64|128]] [--prompt N[,N..]] [--gen N] [--reps R] [--warmup W] [--chunk N] "
     "[--bw GB/s] [--probe] " COMMON},
};

static int usage(FILE *f) {
    fprintf(f, "usage: tern <command> [MODEL] [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-11s %s%s\n", k_cmds[i].name, k_cmds[i].help, k_cmds[i].fn ? "" : " (not built)");
    fprintf(f, "\nMODEL is a model directory or `demo` (the embedded tiny model).\n");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) return usage(stdout);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++) {
        if (strcmp(argv[1], k_cmds[i].name)) continue;
        if (argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) && k_cmds[i].usage) {
            printf("%s: %s\nusage: %s\nMODEL is a model directory or `demo`.\n", k_cmds[i].name, k_cmds[i].help, k_cmds[i].usage);
            return 0;
        }
        if (!k_cmds[i].fn) {
            fprintf(stderr, "tern: command '%s' is not available in this build\n", argv[1]);
            return 1;
        }
        return k_cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "tern: unknown command '%s' (try tern --help)\n", argv[1]);
    return 2;
}
