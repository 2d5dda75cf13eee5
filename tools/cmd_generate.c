/*
 * cmd_generate.c — two modes (DESIGN.md §7):
 *   `tern generate MODEL --ids 2,17,99 --max-tokens N --temperature 0 --ignore-eos --print-ids`:
 *     prefill + incremental decode through the paged KV cache (greedy); stdout gets the new ids
 *     (space-separated, one line); a stats line goes to stderr.
 *   `tern generate [MODEL] "prompt" [--raw] [--system S] [sampling flags]`: the model's chat
 *     template is applied (unless --raw), text streams to stdout through the engine.
 */
#include "cli.h"
#include "cli_util.h"
#include "runtime/generate.h"
#ifndef TERN_CORE_ONLY
#include "cli_text.h"
#endif

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

#ifdef TERN_CORE_ONLY
static int generate_text(int argc, char **argv) {
    (void)argc; (void)argv;
    return cli_usage_error("generate", "text prompts need the full tern build; use --ids");
}
#else
/* Text mode: re-parse the arguments for the text flags. */
static int generate_text(int argc, char **argv) {
    cli_text_flags f = {.temperature = -1, .top_p = -1, .min_p = -1, .seed = -1, .compute_bf16 = -1};
    const char *prompt = NULL, *system = NULL, *pos[2];
    int raw = 0, npos = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_text_flag(&f, "generate", argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--raw")) raw = 1;
        else if (!strcmp(a, "--system") && i + 1 < argc) system = argv[++i];
        else if (!strcmp(a, "--print-ids")) ;
        else if (a[0] != '-' && npos < 2) pos[npos++] = a;
        else return cli_usage_error("generate", "unknown or incomplete argument '%s'", a);
    }
    if (npos == 2) { f.model = pos[0]; prompt = pos[1]; }  /* MODEL "prompt" */
    else if (npos == 1) prompt = pos[0];                  /* "prompt" with the demo model */
    if (!prompt) return cli_usage_error("generate", "usage: tern generate [MODEL] \"prompt\" | tern generate MODEL --ids 2,17,99");
    cli_text t;
    int rc = cli_text_open(&t, &f, "generate");
    if (rc) return rc;
    int32_t *ids = NULL;
    int n = 0;
    if (raw || !t.tpl) {
        tern_error e = {0};
        if (tern_engine_tokenize(t.eng, prompt, strlen(prompt), 1, &ids, &n, &e)) {
            cli_text_close(&t);
            return cli_usage_error("generate", "%s", e.msg);
        }
    } else {
        cJSON *msgs = cJSON_CreateArray();
        if (system) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", system);
            cJSON_AddItemToArray(msgs, m);
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", prompt);
        cJSON_AddItemToArray(msgs, m);
        rc = cli_text_chat_ids(&t, msgs, &ids, &n, "generate");
        cJSON_Delete(msgs);
        if (rc) { cli_text_close(&t); return rc; }
    }
    rc = cli_text_run(&t, ids, n, NULL, "generate");
    printf("\n");
    free(ids);
    cli_text_close(&t);
    return rc;
}
#endif

int tern_cmd_generate(int argc, char **argv) {
    int has_ids = 0;
    for (int i = 1; i < argc; i++) has_ids |= !strcmp(argv[i], "--ids");
    if (!has_ids) return generate_text(argc, argv);
    cli_common c = {0};
    const char *ids_s = NULL, *prompt = NULL;
    long max_tokens = 32, chunk = 0; /* --chunk: prompt rows per forward (0: the model's max batch) */
    int ignore_eos = 0, print_ids = 0;
    double temperature = -1;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_flag(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ids") && v) { ids_s = v; i++; }
        else if (!strcmp(a, "--max-tokens") && v) { if (cli_int("generate", a, v, 0, 1 << 24, &max_tokens)) return 2; i++; }
        else if (!strcmp(a, "--chunk") && v) { /* rows per forward: the model's scratch and KV are sized for it */
            if (cli_int("generate", a, v, 1, 1 << 20, &chunk)) return 2;
            c.max_batch = (int)chunk;
            i++;
        }
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
    if (temperature > 0) return cli_usage_error("generate", "sampling (--temperature > 0) is not available in this build yet");
    int32_t *ids;
    int n = cli_parse_ids(ids_s, &ids);
    if (n < 0) return 2;
    if (!c.max_ctx) c.max_ctx = n + (int)max_tokens;
    cli_session s;
    int rc = cli_open(&c, 1, &s);
    if (rc) { free(ids); return rc; }
    const tern_model_config *cfg = tern_model_cfg(s.model);
    chunk = tern_model_max_batch(s.model); /* --chunk sized the model; else its default */
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
