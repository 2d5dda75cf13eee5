/*
 * bench_spec.c — decode tokens/s with and without prompt-lookup speculative decoding.
 *
 *   build/bench_spec [MODEL] [--k K] [--tokens N] [--rounds R] [--threads T]
 *
 * One greedy request per run on a repetitive prompt (a 12-token phrase repeated to 96 tokens,
 * the case prompt lookup is for: code edits, quoting, lists). Runs alternate k = 0 and k = K
 * (interleaved, so a noisy machine hurts both alike); decode rate = tokens after the first over
 * the time after the first token. Prints a table and CSV; checks the outputs are identical.
 * MODEL: a directory, "demo", or "random:PRESET[:q4]" (synthetic weights: acceptance then
 * depends on what the random model happens to repeat).
 */
#include "tern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run { int32_t tok[4096]; int n; tern_event done; } run;

static int on_event(void *ctx, const tern_event *ev) {
    run *r = ctx;
    if (ev->kind == TERN_EV_TOKEN && r->n < 4096) r->tok[r->n++] = ev->token;
    if (ev->kind != TERN_EV_TOKEN) r->done = *ev;
    return 0;
}

int main(int argc, char **argv) {
    const char *model = "demo";
    int K = 8, N = 128, R = 3, T = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--k") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) R = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) T = atoi(argv[++i]);
        else model = argv[i];
    }
    tern_engine_opts o = tern_engine_default_opts();
    o.model = model;
    o.device = "cpu";
    o.n_threads = T;
    o.max_concurrency = 1;
    o.max_ctx = 1024;
    o.max_batch_tokens = 128;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) { fprintf(stderr, "bench_spec: %s\n", err.msg); return tern_status_exit_code(err.code); }
    tern_model_info mi;
    tern_engine_model_info(e, &mi);
    int32_t prompt[96];
    unsigned long long s = 42;
    for (int i = 0; i < 12; i++) { s = s * 6364136223846793005ULL + 1442695040888963407ULL; prompt[i] = (int32_t)((s >> 33) % (uint64_t)(mi.n_vocab - 3)) + 3; }
    for (int i = 12; i < 96; i++) prompt[i] = prompt[i - 12];
    double rate[2] = {0, 0};
    run ref = {0};
    long long drafted = 0, accepted = 0;
    printf("model %s, %d new tokens, k = %d, %d rounds (interleaved)\n", model, N, K, R);
    printf("round,k,decode_tok_s,drafted,accepted\n");
    for (int round = 0; round < R; round++)
        for (int v = 0; v < 2; v++) {
            run *r = calloc(1, sizeof *r);
            tern_request q = tern_request_default();
            q.prompt = prompt;
            q.n_prompt = 96;
            q.max_tokens = N;
            q.ignore_eos = 1;
            q.sampling.temperature = 0;
            q.speculative_k = v ? K : 0;
            q.on_event = on_event;
            q.ctx = r;
            tern_engine_stats s0, s1;
            tern_engine_get_stats(e, &s0);
            if (tern_engine_submit(e, &q, NULL, &err)) { fprintf(stderr, "bench_spec: %s\n", err.msg); return 1; }
            while (tern_engine_pending(e)) if (tern_engine_step(e, &err)) { fprintf(stderr, "bench_spec: %s\n", err.msg); return 1; }
            tern_engine_get_stats(e, &s1);
            double tg = r->done.t_total - r->done.t_first_token, tps = r->n > 1 && tg > 0 ? (r->n - 1) / tg : 0;
            rate[v] += tps / R;
            if (v) { drafted += s1.spec_drafted - s0.spec_drafted; accepted += s1.spec_accepted - s0.spec_accepted; }
            printf("%d,%d,%.2f,%lld,%lld\n", round, v ? K : 0, tps, s1.spec_drafted - s0.spec_drafted, s1.spec_accepted - s0.spec_accepted);
            if (!ref.n) ref = *r;
            else if (r->n != ref.n || memcmp(r->tok, ref.tok, sizeof(int32_t) * (size_t)r->n)) printf("MISMATCH: outputs differ\n");
            free(r);
        }
    printf("\n| k | decode tok/s (mean of %d) | drafted | accepted |\n|---|---|---|---|\n", R);
    printf("| 0 | %.2f | - | - |\n| %d | %.2f | %lld | %lld (%.0f %%) |\nspeedup %.2fx\n", rate[0], K, rate[1], drafted,
           accepted, drafted ? 100.0 * (double)accepted / (double)drafted : 0.0, rate[0] > 0 ? rate[1] / rate[0] : 0.0);
    tern_engine_close(e);
    return 0;
}
