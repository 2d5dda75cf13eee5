/*
 * cmd_generate.c — `tern generate MODEL --ids 2,17,99 --max-tokens N --temperature 0
 * --ignore-eos --print-ids`: prefill + incremental decode through the paged KV cache; stdout
 * gets the new ids (space-separated, one line); a stats line goes to stderr.
 */
#include "cli.h"
#include "cli_util.h"
#include "runtime/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen_out {
    int print_ids, n;
} gen_out;

static int on_token(void *ctx, int tok) {
    gen_out *o = ctx;
    if (o->print_ids) printf(o->n++ ? " %d" : "%d", tok);
    fflush(stdout);
    return 0;
}

int tern_cmd_generate(int argc, char **argv) {
    cli_common c = {0};
    const char *ids_s = NULL, *prompt = NULL;
    long max_tokens = 32, chunk = 512;
    int ignore_eos = 0, print_ids = 0;
    double temperature = -1;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_flag(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ids") && v) { ids_s = v; i++; }
        else if (!strcmp(a, "--max-tokens") && v) { if (cli_int("generate", a, v, 0, 1 << 24, &max_tokens)) return 2; i++; }
        else if (!strcmp(a, "--chunk") && v) { if (cli_int("generate", a, v, 1, 1 << 20, &chunk)) return 2; i++; }
        else if (!strcmp(a, "--temperature") && v) {
            char *end;
            temperature = strtod(v, &end);
            if (*end || temperature < 0 || temperature > 100) return cli_usage_error("generate", "--temperature expects a number in [0, 100], got '%s'", v);
            i++;
        }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--print-ids")) print_ids = 1;
        else if (a[0] != '-' && !c.model) c.model = a;
        else if (a[0] != '-' && !prompt) prompt = a;
        else return cli_usage_error("generate", "unknown or incomplete argument '%s'", a);
    }
    if (!c.model) c.model = "demo";
    if (!ids_s) return cli_usage_error("generate", "text prompts are not available in this build yet; use --ids");
    if (temperature > 0) return cli_usage_error("generate", "sampling (--temperature > 0) is not available in this build yet");
    int32_t *ids;
    int n = cli_parse_ids(ids_s, &ids);
    if (n < 0) return 2;
    if (!c.max_ctx) c.max_ctx = n + (int)max_tokens;
    cli_session s;
    int rc = cli_open(&c, 1, &s);
    if (rc) { free(ids); return rc; }
    const tern_model_config *cfg = tern_model_cfg(s.model);
    gen_out o = {.print_ids = 1};
    (void)print_ids; /* ids are the only output until text prompts land */
    tern_gen_stats st = {0};
    tern_error e = {0};
    tern_status status = tern_generate(s.model, s.kv, 0, ids, n, (int)max_tokens, (int)chunk, cfg->eos_ids,
                                       ignore_eos ? 0 : cfg->n_eos, NULL, NULL, on_token, &o, &st, &e);
    printf("\n");
    if (!status)
        fprintf(stderr, "tern generate: prompt %d tokens %.1f tok/s, generated %d tokens %.1f tok/s\n", st.n_prompt,
                st.t_prefill > 0 ? st.n_prompt / st.t_prefill : 0.0, st.n_gen,
                st.t_decode > 0 && st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0.0);
    free(ids);
    cli_close(&s);
    return status ? cli_fail("generate", &e) : 0;
}
