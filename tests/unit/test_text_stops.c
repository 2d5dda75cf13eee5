/*
 * test_text_stops.c — the engine's stop-token set (text/stops.h).
 *
 * Synthetic tokenizer.json files in the shape of each family (a tiny byte-level vocab plus
 * that family's added tokens) check which ids tern_stop_ids_build picks: config EOS, the
 * tokenizer's eos_token, and the turn-end tokens present in the vocab, deduplicated, in
 * order, clipped to the model's vocab. Then the demo model end to end: a copy whose
 * `<unused0>` is renamed `<|tool_response>` must stop as soon as that token is sampled
 * (a mask forces it), and run to max_tokens with ignore_eos or with a non-stop token.
 */
#include "test.h"

#include "base/file.h"
#include "io/demo.h"
#include "text/stops.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A tokenizer.json with vocab {a:0, b:1} and the given added tokens at ids 2, 3, ... */
static tern_tokenizer *synth(const char *const *added, int n_added, const char *eos_token) {
    char json[8192], cfg[256], *p = json;
    p += sprintf(p, "{\"version\":\"1.0\",\"added_tokens\":[");
    for (int i = 0; i < n_added; i++)
        p += sprintf(p, "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                        "\"normalized\":false,\"special\":true}", i ? "," : "", 2 + i, added[i]);
    p += sprintf(p, "],\"normalizer\":null,\"pre_tokenizer\":null,\"post_processor\":null,\"decoder\":null,"
                    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
                    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"vocab\":{\"a\":0,\"b\":1");
    for (int i = 0; i < n_added; i++) p += sprintf(p, ",\"%s\":%d", added[i], 2 + i);
    sprintf(p, "},\"merges\":[]}}");
    snprintf(cfg, sizeof cfg, "{\"eos_token\": \"%s\"}", eos_token ? eos_token : "");
    tern_tokenizer *t = NULL;
    tern_error e = {0};
    if (tern_tokenizer_load_json(&t, json, strlen(json), eos_token ? cfg : NULL, "synth", &e))
        printf("  synth tokenizer: %s\n", e.msg);
    return t;
}

static int same(const int32_t *got, int n, const int32_t *want, int nw) {
    if (n != nw) return 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) return 0;
    return 1;
}

static void show(const char *what, const int32_t *ids, int n) {
    printf("  %s:", what);
    for (int i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

TEST(stops_config_only) {
    int32_t ids[TERN_STOP_IDS_MAX];
    int n, eos[] = {7, 3, 7, 500, -1};
    tern_stop_ids_build(eos, 5, NULL, 100, ids, &n); /* dup, out of vocab, negative dropped */
    int32_t want[] = {7, 3};
    CHECK(same(ids, n, want, 2), "n=%d", n);
    tern_stop_ids_build(NULL, 0, NULL, 100, ids, &n);
    CHECK(n == 0, "n=%d", n);
}

TEST(stops_gemma4) {
    /* ids: <pad>2 <eos>3 <|turn>4 <turn|>5 <|tool_call>6 <tool_call|>7 <|tool_response>8 <tool_response|>9 */
    const char *a[] = {"<pad>", "<eos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>"};
    tern_tokenizer *t = synth(a, 8, "<eos>");
    CHECK(t != NULL, "load");
    if (!t) return;
    int32_t ids[TERN_STOP_IDS_MAX];
    int n, eos[] = {3, 5};
    tern_stop_ids_build(eos, 2, t, 10, ids, &n);
    int32_t want[] = {3, 5, 8}; /* config EOS, then <|tool_response> (<turn|> already in) */
    if (!same(ids, n, want, 3)) show("gemma4", ids, n);
    CHECK(same(ids, n, want, 3), "n=%d", n);
    /* a logits row smaller than the tokenizer: ids past it are dropped */
    tern_stop_ids_build(eos, 2, t, 8, ids, &n);
    CHECK(n == 2 && ids[0] == 3 && ids[1] == 5, "n=%d", n);
    tern_tokenizer_free(t);
}

TEST(stops_gemma3) {
    const char *a[] = {"<eos>", "<start_of_turn>", "<end_of_turn>"};
    tern_tokenizer *t = synth(a, 3, "<eos>");
    int32_t ids[TERN_STOP_IDS_MAX];
    int n, eos[] = {2};
    tern_stop_ids_build(eos, 1, t, 5, ids, &n);
    int32_t want[] = {2, 4};
    if (!same(ids, n, want, 2)) show("gemma3", ids, n);
    CHECK(same(ids, n, want, 2), "n=%d", n);
    tern_tokenizer_free(t);
}

TEST(stops_glm) {
    /* GLM-5 lists <|endoftext|>, <|user|>, <|observation|> in config; an older copy only the first */
    const char *a[] = {"<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>"};
    tern_tokenizer *t = synth(a, 8, "<|endoftext|>");
    int32_t ids[TERN_STOP_IDS_MAX];
    int n, eos[] = {2};
    tern_stop_ids_build(eos, 1, t, 10, ids, &n);
    int32_t want[] = {2, 8, 6}; /* <|observation|> comes before <|user|> in the list */
    if (!same(ids, n, want, 3)) show("glm", ids, n);
    CHECK(same(ids, n, want, 3), "n=%d", n);
    tern_tokenizer_free(t);
}

TEST(stops_qwen_llama3) {
    const char *q[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"};
    tern_tokenizer *t = synth(q, 4, "<|im_end|>");
    int32_t ids[TERN_STOP_IDS_MAX];
    int n, eos[] = {2}; /* a config that lists only <|endoftext|> */
    tern_stop_ids_build(eos, 1, t, 6, ids, &n);
    int32_t want[] = {2, 4};
    CHECK(same(ids, n, want, 2), "qwen n=%d", n);
    tern_tokenizer_free(t);
    const char *l[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"};
    t = synth(l, 4, "<|end_of_text|>");
    int eos3[] = {3};
    tern_stop_ids_build(eos3, 1, t, 6, ids, &n);
    int32_t want3[] = {3, 5, 4}; /* <|eot_id|> before <|eom_id|> in the list */
    if (!same(ids, n, want3, 3)) show("llama3", ids, n);
    CHECK(same(ids, n, want3, 3), "llama3 n=%d", n);
    tern_tokenizer_free(t);
    /* no eos_token, no turn-end tokens: config EOS only */
    const char *z[] = {"<x>"};
    t = synth(z, 1, NULL);
    tern_stop_ids_build(eos, 1, t, 3, ids, &n);
    CHECK(n == 1 && ids[0] == 2, "plain n=%d", n);
    tern_tokenizer_free(t);
}

/* ---- end to end through the engine with the demo model ---- */

typedef struct { int force, n_tok, done; tern_finish_reason finish; } run_state;

static int force_mask(void *ctx, float *logits, int n_vocab) {
    run_state *r = ctx;
    for (int i = 0; i < n_vocab; i++)
        if (i != r->force) logits[i] = -INFINITY;
    return 0;
}

static int on_ev(void *ctx, const tern_event *ev) {
    run_state *r = ctx;
    if (ev->kind == TERN_EV_TOKEN) r->n_tok++;
    else { r->done = 1; r->finish = ev->finish; }
    return 0;
}

static run_state run_forced(tern_engine *eng, int force, int ignore_eos) {
    run_state r = {.force = force};
    int32_t prompt[] = {2, 3, 40, 41};
    tern_request q = tern_request_default();
    q.prompt = prompt;
    q.n_prompt = 4;
    q.max_tokens = 3;
    q.ignore_eos = ignore_eos;
    q.sampling.temperature = 0;
    q.mask = force_mask;
    q.mask_ctx = &r;
    q.on_event = on_ev;
    q.ctx = &r;
    tern_error e = {0};
    uint64_t id;
    if (tern_engine_submit(eng, &q, &id, &e)) { printf("  submit: %s\n", e.msg); return r; }
    for (int i = 0; i < 100 && !r.done; i++)
        if (tern_engine_step(eng, &e)) { printf("  step: %s\n", e.msg); break; }
    return r;
}

TEST(stops_engine_demo_turn_end) {
    char demo[4096], dir[512], cmd[5000];
    tern_error e = {0};
    if (tern_model_path_resolve("demo", demo, sizeof demo, &e)) { CHECK(0, "demo: %s", e.msg); return; }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tern_stops_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s'/", demo, dir);
    CHECK(system(cmd) == 0, "copy demo");
    /* rename <unused0> (id 5) to <|tool_response>: a turn-end token the config does not list */
    char path[600], *txt = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK(tern_file_read(path, 1 << 24, &txt, &len, &e) == 0, "read: %s", e.msg);
    FILE *f = fopen(path, "w");
    for (size_t i = 0; txt && f && i < len; i++) {
        if (!strncmp(txt + i, "<unused0>", 9)) { fputs("<|tool_response>", f); i += 8; }
        else fputc(txt[i], f);
    }
    if (f) fclose(f);
    free(txt);

    tern_engine_opts o = tern_engine_default_opts();
    o.model = dir;
    o.device = "cpu";
    o.max_concurrency = 1;
    tern_engine *eng = NULL;
    if (tern_engine_open(&eng, &o, &e)) { CHECK(0, "open: %s", e.msg); goto out; }
    tern_model_info mi;
    tern_engine_model_info(eng, &mi);
    CHECK(mi.n_eos == 3 && mi.eos_ids[0] == 1 && mi.eos_ids[1] == 4 && mi.eos_ids[2] == 5,
          "stop set n=%d [%d %d %d]", mi.n_eos, mi.eos_ids[0], mi.eos_ids[1], mi.eos_ids[2]);
    run_state r = run_forced(eng, 5, 0);
    CHECK(r.done && r.finish == TERN_FINISH_STOP && r.n_tok == 0, "<|tool_response>: finish %d, %d tokens", r.finish, r.n_tok);
    r = run_forced(eng, 4, 0);
    CHECK(r.done && r.finish == TERN_FINISH_STOP && r.n_tok == 0, "<turn|>: finish %d, %d tokens", r.finish, r.n_tok);
    r = run_forced(eng, 5, 1);
    CHECK(r.done && r.finish == TERN_FINISH_LENGTH && r.n_tok == 3, "ignore_eos: finish %d, %d tokens", r.finish, r.n_tok);
    r = run_forced(eng, 6, 0);
    CHECK(r.done && r.finish == TERN_FINISH_LENGTH && r.n_tok == 3, "<unused1>: finish %d, %d tokens", r.finish, r.n_tok);
    tern_engine_close(eng);
out:
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
}

int main(void) {
    RUN(stops_config_only);
    RUN(stops_gemma4);
    RUN(stops_gemma3);
    RUN(stops_glm);
    RUN(stops_qwen_llama3);
    RUN(stops_engine_demo_turn_end);
    return test_done();
}
