/*
 * cli.h — subcommands of the `tern` CLI. Each lives in its own tools/cmd_<name>.c and is
 * declared weak in tern.c, so a subcommand that is not built yet reports itself as such.
 * Contract: int tern_cmd_<name>(int argc, char **argv) with argv[0] = "<name>"; returns the
 * process exit status (0 ok, 2 bad input with a one-line message on stderr, 1 other failure).
 */
#ifndef TERN_CLI_H
#define TERN_CLI_H

int tern_cmd_logits(int argc, char **argv);
int tern_cmd_generate(int argc, char **argv);
int tern_cmd_info(int argc, char **argv);
int tern_cmd_bench(int argc, char **argv);
int tern_cmd_tokenize(int argc, char **argv);
int tern_cmd_detokenize(int argc, char **argv);
int tern_cmd_template(int argc, char **argv);
int tern_cmd_chat(int argc, char **argv);
int tern_cmd_serve(int argc, char **argv);
int tern_cmd_fit(int argc, char **argv);

#endif
