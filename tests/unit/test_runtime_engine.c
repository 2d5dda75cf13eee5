/*
 * test_runtime_engine.c — the engine + continuous-batching scheduler on a tiny random Llama.
 *
 * Oracle: tern_generate (single sequence, fresh KV) with greedy argmax. Every engine test
 * checks that a request's tokens equal what it produces alone, whatever else shares its
 * batches: several at once with chunked prefill, late joiners, preemption under a tiny KV
 * pool, threads submitting while tern_engine_run works. Also: cancellation frees the KV,
 * seeds reproduce, stop/EOS/length/context endings, and submit validation names the field.
 */
#include "runtime_util.h"
#include "model/model.h"

#include <pthread.h>
#include <stdatomic.h>

static rt_ref REF;
static int HAVE_MODEL;

#define NREQ 6
static int32_t P[NREQ][64];
static int PLEN[NREQ] = {5, 37, 1, 20, 50, 9};
static int32_t EXP[NREQ][64];
static int NEXP[NREQ];
#define GEN 12

static void setup(void) {
    if (!rt_model_dir() || rt_ref_open(&REF)) return;
    for (int i = 0; i < NREQ; i++) {
        rt_prompt(P[i], PLEN[i], 1000 + (unsigned long long)i);
        NEXP[i] = rt_ref_greedy(&REF, P[i], PLEN[i], GEN, EXP[i]);
        if (NEXP[i] != GEN) return;
    }
    HAVE_MODEL = 1;
}

static tern_request greedy_req(int i, rt_col *c) { return rt_greedy(P[i], PLEN[i], GEN, c); }

static void check_same(const rt_col *c, int i) {
    CHECK(c->done && c->last.kind == TERN_EV_DONE, "request %d not done (kind %d, %s)", i, c->last.kind, c->err_msg);
    CHECK(c->errors == 0, "request %d: events after the end", i);
    CHECK(c->n_tok == NEXP[i], "request %d: %d tokens, expected %d", i, c->n_tok, NEXP[i]);
    int diff = -1;
    for (int k = 0; k < c->n_tok && k < NEXP[i]; k++) if (c->toks[k] != EXP[i][k]) { diff = k; break; }
    CHECK(diff < 0, "request %d: token %d is %d, alone it is %d", i, diff, diff >= 0 ? c->toks[diff] : 0, diff >= 0 ? EXP[i][diff] : 0);
}

static void check_kv_empty(tern_engine *e) {
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used == 0, "KV blocks still used: %d of %d", st.kv_blocks_used, st.kv_blocks_total);
    CHECK(st.running == 0 && st.waiting == 0, "running %d waiting %d", st.running, st.waiting);
}

TEST(batch_invariance) {
    /* budget 16 rows: long prompts are chunked and interleave with the decode rows */
    tern_engine *e = rt_engine(4, 16, 0, 256);
    CHECK(e != NULL, "engine");
    if (!e) return;
    rt_col c[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) {
        tern_request r = greedy_req(i, &c[i]);
        uint64_t id = 0;
        tern_error err = {0};
        CHECK(tern_engine_submit(e, &r, &id, &err) == TERN_OK && id > 0, "submit %d: %s", i, err.msg);
    }
    CHECK(tern_engine_pending(e) == NREQ, "pending %d", tern_engine_pending(e));
    int steps = rt_drain(e, 1000);
    CHECK(steps > 0 && steps < 1000, "steps %d", steps);
    for (int i = 0; i < NREQ; i++) {
        check_same(&c[i], i);
        CHECK(c[i].finish == TERN_FINISH_LENGTH, "finish %d", c[i].finish);
        CHECK(c[i].last.n_prompt == PLEN[i] && c[i].last.n_generated == GEN, "usage %d %d", c[i].last.n_prompt, c[i].last.n_generated);
        CHECK(c[i].last.t_total >= c[i].last.t_first_token && c[i].last.t_first_token >= c[i].last.t_queue, "timing");
    }
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.requests_done == NREQ && st.generated_tokens == NREQ * GEN, "done %lld gen %lld", st.requests_done, st.generated_tokens);
    check_kv_empty(e);
    tern_engine_close(e);
}

TEST(join_midrun) {
    tern_engine *e = rt_engine(3, 8, 0, 256);
    if (!e) { CHECK(0, "engine"); return; }
    rt_col c[NREQ] = {0};
    tern_error err = {0};
    int next = 0;
    for (int step = 0; step < 2000 && (next < NREQ || tern_engine_pending(e)); step++) {
        if (next < NREQ && step % 5 == 0) {        /* one more request every 5 steps */
            tern_request r = greedy_req(next, &c[next]);
            CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "submit: %s", err.msg);
            next++;
        }
        CHECK(tern_engine_step(e, &err) == TERN_OK, "step: %s", err.msg);
    }
    for (int i = 0; i < NREQ; i++) check_same(&c[i], i);
    check_kv_empty(e);
    tern_engine_close(e);
}

TEST(cancellation) {
    tern_engine *e = rt_engine(4, 32, 0, 256);
    if (!e) { CHECK(0, "engine"); return; }
    rt_col c[4] = {0};
    uint64_t id[4];
    tern_error err = {0};
    for (int i = 0; i < 4; i++) {
        tern_request r = greedy_req(i, &c[i]);
        r.max_tokens = 40;
        if (i == 2) c[i].cancel_after = 3;       /* the callback cancels */
        if (i == 3) c[i].stop_after = 2;         /* the callback stops (stop string matched) */
        tern_engine_submit(e, &r, &id[i], &err);
    }
    for (int s = 0; s < 200 && c[0].n_tok < 4; s++) tern_engine_step(e, &err);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used > 0, "blocks in use mid-run");
    tern_engine_cancel(e, id[0]);
    tern_engine_cancel(e, 999999);              /* unknown id: harmless */
    int before = c[0].n_tok;
    tern_engine_step(e, &err);
    CHECK(c[0].done && c[0].finish == TERN_FINISH_CANCELLED, "cancelled at the next step (done %d finish %d)", c[0].done, c[0].finish);
    CHECK(c[0].n_tok == before, "no token after cancel");
    rt_drain(e, 1000);
    CHECK(c[1].finish == TERN_FINISH_LENGTH && c[1].n_tok == 40, "others continue: finish %d n %d", c[1].finish, c[1].n_tok);
    CHECK(c[2].finish == TERN_FINISH_CANCELLED && c[2].n_tok == 3, "callback cancel: %d %d", c[2].finish, c[2].n_tok);
    CHECK(c[3].finish == TERN_FINISH_STOP && c[3].n_tok == 2, "callback stop: %d %d", c[3].finish, c[3].n_tok);
    tern_engine_get_stats(e, &st);
    CHECK(st.requests_cancelled == 2 && st.requests_done == 2, "cancelled %lld done %lld", st.requests_cancelled, st.requests_done);
    check_kv_empty(e);
    /* cancel while still queued (before any step) */
    rt_col q = {0};
    tern_request r = greedy_req(1, &q);
    uint64_t qid;
    tern_engine_submit(e, &r, &qid, &err);
    tern_engine_cancel(e, qid);
    tern_engine_step(e, &err);
    CHECK(q.done && q.finish == TERN_FINISH_CANCELLED && q.n_tok == 0, "queued cancel: %d %d", q.finish, q.n_tok);
    /* close with work in flight: every request gets its final event */
    rt_col w[2] = {0};
    for (int i = 0; i < 2; i++) { tern_request rr = greedy_req(i, &w[i]); tern_engine_submit(e, &rr, NULL, &err); }
    tern_engine_step(e, &err);
    tern_engine_close(e);
    CHECK(w[0].done && w[1].done && w[0].finish == TERN_FINISH_CANCELLED, "close cancels: %d %d", w[0].done, w[1].done);
}

TEST(preemption) {
    /* KV pool of 5 blocks (16 tokens each) for 4 slots whose requests need 1-4 blocks each */
    size_t per_block = (size_t)RT_L * 2 * RT_NKV * RT_D * sizeof(float) * 16;
    double gb = (double)(per_block * 5) / 1073741824.0 * 1.0001;
    tern_engine *e = rt_engine(4, 24, gb, 256);
    if (!e) { CHECK(0, "engine"); return; }
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_total == 5, "blocks total %d", st.kv_blocks_total);
    rt_col c[NREQ] = {0};
    tern_error err = {0};
    for (int i = 0; i < NREQ; i++) {
        tern_request r = greedy_req(i, &c[i]);
        CHECK(tern_engine_submit(e, &r, NULL, &err) == TERN_OK, "submit: %s", err.msg);
    }
    int steps = rt_drain(e, 5000);
    CHECK(steps > 0 && steps < 5000, "steps %d", steps);
    for (int i = 0; i < NREQ; i++) check_same(&c[i], i);
    tern_engine_get_stats(e, &st);
    CHECK(st.preemptions > 0, "expected preemptions with a 5-block pool (got %lld)", st.preemptions);
    check_kv_empty(e);
    tern_engine_close(e);

    /* a prompt larger than the whole pool is refused at submit; the others are unaffected */
    e = rt_engine(2, 64, (double)(per_block * 2) / 1073741824.0 * 1.0001, 256);
    if (!e) { CHECK(0, "engine"); return; }
    rt_col big = {0}, small = {0};
    tern_request rb = greedy_req(4, &big);          /* 50 tokens > 32-token pool */
    tern_request rs = greedy_req(2, &small);        /* 1 token prompt + 12 */
    tern_engine_submit(e, &rs, NULL, &err);
    CHECK(tern_engine_submit(e, &rb, NULL, &err) == TERN_ENOMEM && strstr(err.msg, "KV blocks"), "big prompt: '%s'", err.msg);
    rt_drain(e, 1000);
    check_same(&small, 2);
    CHECK(!big.done, "no events for a refused request");
    check_kv_empty(e);
    tern_engine_close(e);
}

static void run_sampled(tern_engine *e, uint64_t seed, int companions, rt_col *out) {
    tern_error err = {0};
    rt_col other[3] = {0};
    for (int k = 0; k < companions; k++) {
        tern_request r = greedy_req(k + 1, &other[k]);
        r.sampling.temperature = 1.3f;
        r.sampling.seed = 7 + (uint64_t)k;
        tern_engine_submit(e, &r, NULL, &err);
        tern_engine_step(e, &err);                 /* stagger the companions */
    }
    tern_request r = greedy_req(0, out);
    r.max_tokens = 24;
    r.sampling.temperature = 1.5f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = seed;
    r.sampling.n_logprobs = 3;
    tern_engine_submit(e, &r, NULL, &err);
    rt_drain(e, 1000);
}

TEST(seeds) {
    tern_engine *e = rt_engine(4, 16, 0, 256);
    if (!e) { CHECK(0, "engine"); return; }
    rt_col a = {0}, b = {0}, c = {0};
    run_sampled(e, 42, 0, &a);
    run_sampled(e, 42, 3, &b);
    run_sampled(e, 43, 1, &c);
    CHECK(a.n_tok == 24 && b.n_tok == 24, "lengths %d %d", a.n_tok, b.n_tok);
    CHECK(!memcmp(a.toks, b.toks, sizeof(int32_t) * 24), "same seed, different company: different tokens");
    CHECK(memcmp(a.toks, c.toks, sizeof(int32_t) * 24), "different seeds gave identical tokens");
    int lp_ok = 1;
    for (int k = 0; k < a.n_tok; k++) if (!(a.logprob[k] <= 0.f) || a.n_top[k] != 3) lp_ok = 0;
    CHECK(lp_ok, "logprobs: chosen <= 0 and 3 alternatives");
    tern_engine_close(e);
}

TEST(stop_and_length) {
    tern_engine *e = rt_engine(2, 32, 0, 64);
    if (!e) { CHECK(0, "engine"); return; }
    tern_error err = {0};
    /* stop id = the 5th greedy token: 4 tokens come out, then STOP */
    rt_col s = {0};
    tern_request r = greedy_req(3, &s);
    int32_t stop = EXP[3][4];
    int first = 0;
    while (EXP[3][first] != stop) first++;
    r.stop_ids = &stop;
    r.n_stop_ids = 1;
    tern_engine_submit(e, &r, NULL, &err);
    /* context limit: prompt 50 of max_ctx 64 -> 14 tokens at most, LENGTH */
    rt_col l = {0};
    tern_request rl = greedy_req(4, &l);
    rl.max_tokens = 100;
    tern_engine_submit(e, &rl, NULL, &err);
    /* max_tokens 0: ends at once */
    rt_col z = {0};
    tern_request rz = greedy_req(0, &z);
    rz.max_tokens = 0;
    tern_engine_submit(e, &rz, NULL, &err);
    rt_drain(e, 1000);
    CHECK(s.finish == TERN_FINISH_STOP && s.n_tok == first, "stop: finish %d n %d (expected %d)", s.finish, s.n_tok, first);
    CHECK(l.finish == TERN_FINISH_LENGTH && l.n_tok == 14, "context: finish %d n %d", l.finish, l.n_tok);
    CHECK(!memcmp(l.toks, EXP[4], sizeof(int32_t) * GEN), "context-limited tokens match");
    CHECK(z.done && z.finish == TERN_FINISH_LENGTH && z.n_tok == 0, "max_tokens 0: %d %d", z.finish, z.n_tok);
    /* EOS from the model config stops unless ignore_eos: bias EOS up so it comes first */
    rt_col eo = {0};
    tern_request re = greedy_req(1, &eo);
    re.ignore_eos = 0;
    int32_t bid = RT_EOS;
    float bval = 1000.f;
    re.sampling.bias_ids = &bid;
    re.sampling.bias_values = &bval;
    re.sampling.n_bias = 1;
    tern_engine_submit(e, &re, NULL, &err);
    rt_drain(e, 100);
    CHECK(eo.finish == TERN_FINISH_STOP && eo.n_tok == 0, "eos: finish %d n %d", eo.finish, eo.n_tok);
    check_kv_empty(e);
    tern_engine_close(e);
}

TEST(submit_validation) {
    tern_engine *e = rt_engine(2, 16, 0, 64);
    if (!e) { CHECK(0, "engine"); return; }
    int32_t ids[80] = {0};
    for (int i = 0; i < 80; i++) ids[i] = 3;
    struct { const char *field; tern_request r; } cases[16];
    int n = 0;
#define CASE(f, stmt) do { cases[n].field = f; cases[n].r = tern_request_default(); cases[n].r.prompt = ids; \
                           cases[n].r.n_prompt = 4; { tern_request *q = &cases[n].r; (void)q; stmt; } n++; } while (0)
    CASE("prompt", q->n_prompt = 0);
    CASE("prompt", q->prompt = NULL);
    CASE("prompt[2]", ids[2] = RT_V);
    CASE("n_prompt", q->n_prompt = 80);
    CASE("max_tokens", q->max_tokens = -1);
    CASE("temperature", q->sampling.temperature = -0.5f);
    CASE("temperature", q->sampling.temperature = NAN);
    CASE("top_p", q->sampling.top_p = 0.f);
    CASE("top_k", q->sampling.top_k = -3);
    CASE("min_p", q->sampling.min_p = 2.f);
    CASE("repetition_penalty", q->sampling.repetition_penalty = 0.f);
    CASE("n_logprobs", q->sampling.n_logprobs = 21);
    CASE("n_bias", q->sampling.n_bias = 2);
    static int32_t bad_stop = -4;
    CASE("stop_ids[0]", q->stop_ids = &bad_stop; q->n_stop_ids = 1);
#undef CASE
    for (int i = 0; i < n; i++) {
        tern_error err = {0};
        uint64_t id = 77;
        if (i == 3) ids[2] = 3;   /* undo the out-of-vocab id after its case */
        tern_status st = tern_engine_submit(e, &cases[i].r, &id, &err);
        CHECK(st == TERN_EINVAL && err.code == TERN_EINVAL, "case %d (%s): status %d", i, cases[i].field, st);
        CHECK(strstr(err.msg, cases[i].field) != NULL, "case %d: message '%s' does not name '%s'", i, err.msg, cases[i].field);
        CHECK(id == 0, "case %d: id set on failure", i);
    }
    CHECK(tern_engine_pending(e) == 0, "nothing queued");
    tern_error err = {0};
    CHECK(tern_engine_submit(e, NULL, NULL, &err) == TERN_EINVAL, "NULL request");
    int32_t *tk = NULL;
    int nt = 0;
    CHECK(tern_engine_tokenize(e, "hi", 2, 1, &tk, &nt, &err) == TERN_EUNSUPPORTED, "no tokenizer");
    tern_model_info mi;
    tern_engine_model_info(e, &mi);
    CHECK(mi.n_vocab == RT_V && mi.n_layer == RT_L && mi.n_ctx == 64 && !mi.has_tokenizer, "model info %d %d %d", mi.n_vocab, mi.n_layer, mi.n_ctx);
    CHECK(mi.n_eos == 1 && mi.eos_ids[0] == RT_EOS && mi.arch && mi.name, "eos %d", mi.n_eos);
    tern_engine_close(e);
    tern_engine_close(NULL);
    /* bad engine options */
    tern_engine_opts o = tern_engine_default_opts();
    o.model = rt_model_dir();
    o.device = "tpu";
    tern_engine *e2 = NULL;
    CHECK(tern_engine_open(&e2, &o, &err) == TERN_EINVAL && strstr(err.msg, "device") && !e2, "bad device: %s", err.msg);
    o.device = "cpu";
    o.compute_bf16 = 7;
    CHECK(tern_engine_open(&e2, &o, &err) == TERN_EINVAL && strstr(err.msg, "compute_bf16") && !e2, "bad compute: %s", err.msg);
    o.compute_bf16 = 3; /* int8 on the CPU */
    CHECK(tern_engine_open(&e2, &o, &err) == TERN_OK && e2, "int8 compute: %s", err.msg);
    tern_engine_close(e2);
    e2 = NULL;
    o.compute_bf16 = -1;
    o.model = "/nonexistent-model-dir";
    CHECK(tern_engine_open(&e2, &o, &err) != TERN_OK && !e2, "missing model");
}

/* ---- threads submitting while tern_engine_run works --------------------------------- */

#define NTHR 4
#define PER_THR 6
static tern_engine *TE;
static rt_col TCOL[NTHR][PER_THR];
static atomic_int TDONE;

static int thr_event(void *ctx, const tern_event *ev) {
    int rc = rt_on_event(ctx, ev);
    if (ev->kind != TERN_EV_TOKEN) atomic_fetch_add(&TDONE, 1);
    return rc;
}

static void *submitter(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int k = 0; k < PER_THR; k++) {
        int i = (t + k) % NREQ;
        tern_request r = greedy_req(i, &TCOL[t][k]);
        r.on_event = thr_event;
        tern_error err = {0};
        if (tern_engine_submit(TE, &r, NULL, &err)) TCOL[t][k].errors += 100;
        tern_engine_stats st;
        tern_engine_get_stats(TE, &st);
        if (k % 2) usleep(1000);
    }
    return NULL;
}

static void *engine_thread(void *arg) { tern_engine_run(arg); return NULL; }

/* The rows per step: tern_model_default_batch's rule, the engine's read-back of the model's default (0 asked), at
 * least max_concurrency, and an explicit value kept. */
TEST(batch_defaults) {
    CHECK(tern_model_default_batch(0, 0) == 512 && tern_model_default_batch(0, (size_t)80 << 30) == 512, "cpu default");
    CHECK(tern_model_default_batch(1, 0) == 8192 && tern_model_default_batch(1, (size_t)141 << 30) == 8192 &&
          tern_model_default_batch(1, (size_t)70 << 30) == 8192, "big or unknown GPU default");
    CHECK(tern_model_default_batch(1, (size_t)24 << 30) == 2048, "small GPU default");
    if (!HAVE_MODEL) return;
    const char *dev = getenv("TERN_TEST_DEVICE");
    const int gpu = dev && strcmp(dev, "cpu"); /* a GPU's default depends on its memory: 2048 or 8192 */
    const struct { int conc, asked, want; } cs[] = {{4, 0, 512}, {600, 0, 600}, {4, 64, 64}, {8, 4, 8}};
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        tern_engine *e = rt_engine(cs[i].conc, cs[i].asked, 0, 128);
        if (!e) { CHECK(0, "engine %zu", i); continue; }
        tern_model_info mi;
        tern_engine_model_info(e, &mi);
        const int want = gpu && !cs[i].asked ? (cs[i].conc > 2048 ? cs[i].conc : -1) : cs[i].want;
        CHECK(want < 0 ? mi.max_batch_tokens == 2048 || mi.max_batch_tokens == 8192 : mi.max_batch_tokens == want,
              "conc %d asked %d: %d rows per step, want %d", cs[i].conc, cs[i].asked, mi.max_batch_tokens, want);
        tern_engine_close(e);
    }
}

TEST(thread_stress) {
    TE = rt_engine(3, 16, 0, 256);
    if (!TE) { CHECK(0, "engine"); return; }
    pthread_t eng, th[NTHR];
    pthread_create(&eng, NULL, engine_thread, TE);
    for (int t = 0; t < NTHR; t++) pthread_create(&th[t], NULL, submitter, (void *)(intptr_t)t);
    for (int t = 0; t < NTHR; t++) pthread_join(th[t], NULL);
    for (int w = 0; w < 20000 && atomic_load(&TDONE) < NTHR * PER_THR; w++) usleep(1000);
    CHECK(atomic_load(&TDONE) == NTHR * PER_THR, "finished %d of %d", atomic_load(&TDONE), NTHR * PER_THR);
    usleep(2000);                                  /* the engine sleeps on the condvar now */
    CHECK(tern_engine_pending(TE) == 0, "pending %d", tern_engine_pending(TE));
    tern_engine_stop(TE);
    pthread_join(eng, NULL);
    for (int t = 0; t < NTHR; t++)
        for (int k = 0; k < PER_THR; k++) check_same(&TCOL[t][k], (t + k) % NREQ);
    check_kv_empty(TE);
    tern_engine_close(TE);
}

int main(void) {
    setup();
    if (!HAVE_MODEL) {
        printf("FAIL: setup: the tiny Llama could not be written, loaded or run\n");
        return 1;
    }
    RUN(submit_validation);
    RUN(batch_invariance);
    RUN(join_midrun);
    RUN(cancellation);
    RUN(preemption);
    RUN(seeds);
    RUN(stop_and_length);
    RUN(thread_stress);
    RUN(batch_defaults);
    rt_ref_close(&REF);
    return test_done();
}
