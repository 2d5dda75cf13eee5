/*
 * tern.c — the command-line interface (contract in DESIGN.md §7 / docs/CLI.md).
 */
#include "tern.h"

#include <stdio.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f, "usage: tern <command> [MODEL] [options]\n"
               "commands: logits, generate, info, bench, tokenize, chat, serve\n");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) return usage(stdout);
    fprintf(stderr, "tern: unknown command '%s'\n", argv[1]);
    return 2;
}
