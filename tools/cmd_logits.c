/*
 * cmd_logits.c — `tern logits MODEL --ids 2,17,99 --out FILE`: one forward over the ids;
 * FILE = float32 little-endian [n_ids, vocab] final logits (after softcap), no header.
 */
#include "cli.h"
#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tern_cmd_logits(int argc, char **argv) {
    cli_common c = {0};
    const char *ids_s = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_flag(&c, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_s = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] != '-' && !c.model) c.model = argv[i];
        else return cli_usage_error("logits", "unknown or incomplete argument '%s'", argv[i]);
    }
    if (!c.model) c.model = "demo";
    if (!ids_s || !out) return cli_usage_error("logits", "usage: tern logits MODEL --ids 2,17,99 --out FILE");
    int32_t *ids;
    int n = cli_parse_ids(ids_s, &ids);
    if (n < 0) return 2;
    if (!c.max_ctx) c.max_ctx = n;
    cli_session s;
    int rc = cli_open(&c, 1, &s);
    if (rc) { free(ids); return rc; }
    int V = tern_model_cfg(s.model)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *slot = calloc((size_t)n, sizeof(int32_t));
    tern_error e = {0};
    tern_status st = (!logits || !pos || !slot) ? tern_err(&e, TERN_ENOMEM, "out of memory") : TERN_OK;
    if (!st) st = tern_kv_reserve(s.kv, 0, n, &e);
    if (!st) {
        for (int i = 0; i < n; i++) pos[i] = i;
        tern_batch b = {.n = n, .tokens = ids, .pos = pos, .slot = slot};
        double t0 = tern_time_s();
        st = tern_model_forward(s.model, &b, s.kv, logits, &e);
        if (!st) fprintf(stderr, "tern logits: %d tokens in %.3f s\n", n, tern_time_s() - t0);
    }
    if (!st) {
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V) st = tern_err(&e, TERN_EIO, "cannot write '%s'", out);
        if (f && fclose(f) && !st) st = tern_err(&e, TERN_EIO, "cannot write '%s'", out);
    }
    free(logits); free(pos); free(slot); free(ids);
    cli_close(&s);
    return st ? cli_fail("logits", &e) : 0;
}
