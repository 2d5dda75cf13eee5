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

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"generate", tern_cmd_generate, "generate text or ids from a prompt"},
    {"chat", tern_cmd_chat, "interactive chat"},
    {"serve", tern_cmd_serve, "OpenAI/Anthropic-compatible HTTP server"},
    {"logits", tern_cmd_logits, "write final logits of one forward pass"},
    {"tokenize", tern_cmd_tokenize, "text -> token ids"},
    {"detokenize", tern_cmd_detokenize, "token ids -> text"},
    {"template", tern_cmd_template, "render the model's chat template"},
    {"info", tern_cmd_info, "describe a model directory"},
    {"fit", tern_cmd_fit, "memory plan for a model"},
    {"bench", tern_cmd_bench, "prefill/decode speed"},
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
        if (!k_cmds[i].fn) {
            fprintf(stderr, "tern: command '%s' is not available in this build\n", argv[1]);
            return 1;
        }
        return k_cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "tern: unknown command '%s' (try tern --help)\n", argv[1]);
    return 2;
}
