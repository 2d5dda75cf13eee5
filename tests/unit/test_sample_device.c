/*
 * test_sample_device.c — on-device sampling, with the CPU backends' op (which CI has):
 *   - the reference draw (sample_ref.c, with its shortcuts: weight-carrying set, quickselect)
 *     equals a naive reading of the spec in sample_ref.h (sort everything) on random rows;
 *   - the backend op fed by tern_sampler_device_row() draws the tokens the CPU sampler chain
 *     draws (bias, penalty history, every stage, many seeds), errors included;
 *   - the forward driver: tern_model_forward_sample (all rows drawn, and mixed with rows that
 *     keep their logits) equals tern_model_forward + the sampler, token for token;
 *   - the engine: seeded requests (penalties, bias, speculation, logprobs) give the same
 *     tokens with device sampling on and off (TERN_DEVICE_SAMPLE=0) on the same logits;
 *     TERN_TEST_DEVICE=cuda runs both engines on the GPU (CUDA draws vs the CPU sampler);
 *   - the pipelined decode (TERN_ASYNC, sched.c): seven requests through four slots (greedy, seeded, stop ids, a
 *     callback that cancels and one that stops while the next step is queued, bias, a penalty history, one that waits
 *     for a slot) give the same tokens and endings with it on and off, and it did queue steps.
 */
#include "runtime_util.h"
#include "sample_cases.h"
#include "sample/sample_math.h"
#include "sample/sample_ref.h"
#include "backend/cpu/cpu.h"

typedef struct nc { float l; int32_t id; } nc;
static int nc_cmp(const void *a, const void *b) {
    const nc *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The spec of sample_ref.h read literally: every finite token, full sort. */
static int32_t naive_draw(const float *l, int V, const tern_sample_row *p) {
    nc *c = malloc(sizeof *c * (size_t)V);
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (isnan(l[i])) { free(c); return TERN_SAMPLE_ERR_NAN; }
        if (l[i] == INFINITY) { free(c); return TERN_SAMPLE_ERR_INF; }
        if (l[i] != -INFINITY) c[n++] = (nc){l[i], i};
    }
    if (!n) { free(c); return TERN_SAMPLE_ERR_MASKED; }
    qsort(c, (size_t)n, sizeof *c, nc_cmp);
    float mx = c[0].l;
    int32_t best = c[0].id;
    if (p->temperature == 0) { free(c); return best; }
    int keep = n;
    if (p->top_k > 0 && p->top_k < n) keep = p->top_k;
    if (p->top_p < 1) {
        uint64_t tot = 0, cum = 0;
        for (int i = 0; i < keep; i++) tot += tern_sample_weight(tern_sample_x(c[i].l, mx));
        uint64_t thr = tern_sample_top_p_thr(p->top_p, tot);
        for (int i = 0; i < keep; i++) {
            cum += tern_sample_weight(tern_sample_x(c[i].l, mx));
            if (cum >= thr) { keep = i + 1; break; }
        }
    }
    float lmin = mx + p->min_p_log;
    uint8_t *in = calloc((size_t)V, 1);
    for (int i = 0; i < keep; i++) if (c[i].l >= lmin) in[c[i].id] = 1;
    uint64_t tot = 0, cum = 0;
    for (int i = 0; i < V; i++) if (in[i]) tot += tern_sample_weight(tern_sample_x(l[i], mx) * p->inv_t);
    uint64_t target = tern_sample_target(tern_sample_u53(p->seed, p->step), tot);
    int32_t pick = -100;
    for (int i = 0; i < V && pick == -100; i++)
        if (in[i] && target < (cum += tern_sample_weight(tern_sample_x(l[i], mx) * p->inv_t))) pick = i;
    free(in);
    free(c);
    return pick;
}

TEST(reference_draw_equals_naive_spec) {
    unsigned long long rs = 99;
    int Vs[4] = {7, 97, 1000, 5003}, bad = 0, cases = 0;
    for (int vi = 0; vi < 4; vi++) {
        int V = Vs[vi];
        float *l = malloc(sizeof(float) * (size_t)V);
        void *scr = malloc(tern_sample_scratch_bytes(V));
        for (int k = 0; k < 12; k++)
            for (int pi = 0; pi < SC_NPARAM; pi++) {
                sc_row(l, V, k, &rs);
                tern_sampler *s = sc_sampler(pi, V, 1000 + (uint64_t)k, 0, &rs);
                tern_sample_row row;
                tern_sample_pair pairs[8];
                int np = 0;
                if (!s || !tern_sampler_device_row(s, (uint64_t)(k * 31 + pi), &row, pairs, &np, 8)) { bad++; continue; }
                int b;
                int32_t a = tern__sample_draw(l, V, &row, scr, &b), z = naive_draw(l, V, &row);
                cases++;
                if (a != z && bad++ < 5) printf("  V=%d kind=%d params=%d: ref %d naive %d\n", V, k, pi, a, z);
                tern_sampler_free(s);
            }
        free(l);
        free(scr);
    }
    CHECK(bad == 0, "%d of %d cases differ", bad, cases);
}

/* Draw every case with the sampler chain and with the backend op; count mismatches. */
static int op_vs_sampler(tern_backend *be, int V, int reps, unsigned long long seed, int *n_cases) {
    unsigned long long rs = seed;
    int bad = 0;
    float *l = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);
    void *scr = malloc(tern_sample_scratch_bytes(V));
    tern_sample_pair *pairs = malloc(sizeof *pairs * 4096);
    for (int k = 0; k < reps; k++)
        for (int pi = 0; pi < SC_NPARAM; pi++) {
            sc_row(l, V, k, &rs);
            if (k % 9 == 8) l[(unsigned)k % (unsigned)V] = NAN;
            memcpy(l2, l, sizeof(float) * (size_t)V);
            unsigned long long hs = rs;
            tern_sampler *a = sc_sampler(pi, V, 77 + (uint64_t)k, 40, &hs), *b = sc_sampler(pi, V, 77 + (uint64_t)k, 40, &rs);
            tern_sample_row row;
            int np = 0;
            int32_t id = -100;
            if (!a || !b || !tern_sampler_device_row(b, (uint64_t)k, &row, pairs, &np, 4096)) { bad++; goto next; }
            tern_sample_result res;
            tern_error e = {0};
            tern_status st = tern_sampler_sample(a, l, (uint64_t)k, &res, &e);
            be->vt->sample(be, &id, l2, 1, V, &row, pairs, scr);
            tern_sample_result dres;
            tern_error de = {0};
            tern_status dst = tern_sampler_device_result(b, id, &dres, &de);
            (*n_cases)++;
            if ((st != TERN_OK) != (dst != TERN_OK) || (!st && res.id != dres.id)) {
                if (bad++ < 5) printf("  V=%d rep=%d params=%d: sampler %d (%s) op %d\n", V, k, pi, st ? -1 : res.id, e.msg, id);
            }
        next:
            tern_sampler_free(a);
            tern_sampler_free(b);
        }
    free(l); free(l2); free(scr); free(pairs);
    return bad;
}

TEST(cpu_op_equals_sampler_chain) {
    tern_backend *be = NULL;
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 1};
    CHECK(tern_backend_cpu_open(&be, &o, &e) == TERN_OK && be->vt->sample, "cpu backend: %s", e.msg);
    if (!be) return;
    int cases = 0, bad = op_vs_sampler(be, 97, 18, 5, &cases) + op_vs_sampler(be, 4099, 6, 6, &cases);
    CHECK(bad == 0, "%d of %d cases differ", bad, cases);
    tern_backend_close(be);
}

TEST(forward_sample_equals_forward_then_sampler) {
    rt_ref r;
    if (rt_ref_open(&r)) { CHECK(0, "model"); return; }
    CHECK(tern_model_can_sample(r.m), "the cpu backend should offer vt->sample");
    tern_error err = {0};
    tern_kv *kv = NULL;
    tern_kv_opts ko = {.n_slots = 3, .max_ctx = 64};
    if (tern_kv_open(&kv, r.be, tern_model_cfg(r.m), &ko, &err)) { CHECK(0, "kv: %s", err.msg); rt_ref_close(&r); return; }
    int32_t tok[3] = {5, 9, 40}, pos[3] = {0, 0, 0}, slot[3] = {0, 1, 2};
    for (int s = 0; s < 3; s++) tern_kv_reserve(kv, s, 8, NULL);
    tern_batch b = {.n = 3, .tokens = tok, .pos = pos, .slot = slot};
    float ref[3 * RT_V], got[3 * RT_V];
    CHECK(tern_model_forward(r.m, &b, kv, ref, &err) == TERN_OK, "forward: %s", err.msg);
    unsigned long long rs = 3;
    for (int mode = 0; mode < 2; mode++) {   /* 0: every row drawn; 1: row 1 keeps its logits */
        for (int pi = 0; pi < SC_NPARAM; pi++) {
            tern_sampler *sm[3];
            tern_sample_row rows[3];
            tern_sample_pair pairs[256];
            int32_t ids[3] = {-7, -7, -7};
            int np = 0;
            unsigned long long hs = rs;
            for (int k = 0; k < 3; k++) {
                sm[k] = sc_sampler(pi, RT_V, 11 + (uint64_t)k, 10, &hs);
                tern_sampler_device_row(sm[k], 3 + (uint64_t)k, &rows[k], pairs, &np, 256);
            }
            if (mode) rows[1].mode = TERN_SAMPLE_SKIP;
            tern_batch_sample smp = {.rows = rows, .pairs = pairs, .n_pairs = np, .ids = ids};
            CHECK(tern_model_forward_sample(r.m, &b, kv, got, &smp, &err) == TERN_OK, "forward_sample: %s", err.msg);
            for (int k = 0; k < 3; k++) {
                tern_sampler *ref_s = sc_sampler(pi, RT_V, 11 + (uint64_t)k, 10, &rs);
                float row[RT_V];
                memcpy(row, ref + k * RT_V, sizeof row);
                tern_sample_result res;
                CHECK(tern_sampler_sample(ref_s, row, 3 + (uint64_t)k, &res, &err) == TERN_OK, "%s", err.msg);
                if (mode && k == 1)
                    CHECK(!memcmp(got + RT_V, ref + RT_V, sizeof(float) * RT_V), "host row changed");
                else
                    CHECK(ids[k] == res.id, "mode %d params %d row %d: device %d sampler %d", mode, pi, k, ids[k], res.id);
                tern_sampler_free(ref_s);
                tern_sampler_free(sm[k]);
            }
        }
    }
    tern_kv_close(kv);
    rt_ref_close(&r);
}

/* The engines these tests compare: four slots, 32 rows a step, f32 on both devices (the GPU default is bf16) */
static tern_engine *engine_small(const char *device) {
    tern_engine_opts o = tern_engine_default_opts();
    o.model = rt_model_dir();
    o.device = device;
    o.compute_bf16 = 0;
    o.n_threads = 2;
    o.max_concurrency = 4;
    o.max_batch_tokens = 32;
    o.max_ctx = 256;
    tern_engine *e = NULL;
    tern_error err = {0};
    if (tern_engine_open(&e, &o, &err)) printf("  engine_open (%s): %s\n", device, err.msg);
    return e;
}

/* Four concurrent seeded requests of different kinds; tokens of each into out[k]. */
static void engine_run(const char *device, int dev_sample, rt_col out[4]) {
    setenv("TERN_DEVICE_SAMPLE", dev_sample ? "1" : "0", 1);
    tern_engine *e = engine_small(device);
    tern_error err = {0};
    if (!e) return;
    int32_t prompt[4][12];
    int32_t bid[2] = {3, 17};
    float bval[2] = {1.5f, -2.0f};
    for (int k = 0; k < 4; k++) {
        rt_prompt(prompt[k], 12, 100 + (unsigned long long)k);
        memset(&out[k], 0, sizeof out[k]);
        tern_request r = tern_request_default();
        r.prompt = prompt[k];
        r.n_prompt = 12;
        r.max_tokens = k == 3 ? 8 : 20;   /* later steps: every row on the device (graphs) */
        r.ignore_eos = 1;
        r.on_event = rt_on_event;
        r.ctx = &out[k];
        r.sampling.seed = 1234 + (uint64_t)k;
        r.sampling.temperature = 1.2f;
        if (k == 0) { r.sampling.top_k = 20; r.sampling.top_p = 0.9f; }
        if (k == 1) { r.sampling.repetition_penalty = 1.4f; r.sampling.frequency_penalty = 0.3f;
                      r.sampling.bias_ids = bid; r.sampling.bias_values = bval; r.sampling.n_bias = 2; }
        if (k == 2) { r.sampling.min_p = 0.05f; r.speculative_k = 4; }
        if (k == 3) r.sampling.n_logprobs = 2;   /* host path */
        if (tern_engine_submit(e, &r, NULL, &err)) printf("  submit: %s\n", err.msg);
    }
    rt_drain(e, 2000);
    tern_engine_close(e);
    unsetenv("TERN_DEVICE_SAMPLE");
}

TEST(engine_device_sampling_equals_host) {
    const char *dev = getenv("TERN_TEST_DEVICE") ? getenv("TERN_TEST_DEVICE") : "cpu";
    rt_col host[4], devc[4];
    engine_run(dev, 0, host);
    engine_run(dev, 1, devc);
    for (int k = 0; k < 4; k++) {
        int n = k == 3 ? 8 : 20;
        CHECK(host[k].n_tok == n && devc[k].n_tok == n, "request %d: %d / %d tokens (%s)", k, host[k].n_tok,
              devc[k].n_tok, devc[k].err_msg);
        CHECK(!memcmp(host[k].toks, devc[k].toks, sizeof(int32_t) * (size_t)n), "request %d: tokens differ (%s)", k, dev);
    }
}

/* Seven requests through four slots; tokens and endings into out[k]; *queued: steps queued ahead (stats). */
#define PIPE_N 7
static void engine_pipe_run(const char *device, int async, rt_col out[PIPE_N], long long *queued, long long *steps) {
    setenv("TERN_ASYNC", async ? "2" : "0", 1); /* 2: also on the CPU, whose steps run at once */
    setenv("TERN_ASYNC_ROWS", "1", 1);
    tern_engine *e = engine_small(device);
    tern_error err = {0};
    *queued = *steps = -1;
    if (!e) {
        unsetenv("TERN_ASYNC");
        unsetenv("TERN_ASYNC_ROWS");
        return;
    }
    int32_t prompt[PIPE_N][10], stop[2] = {5, 66}, bid[2] = {3, 17};
    float bval[2] = {1.5f, -2.0f};
    for (int k = 0; k < PIPE_N; k++) {
        rt_prompt(prompt[k], 10, 500 + (unsigned long long)k);
        memset(&out[k], 0, sizeof out[k]);
        tern_request r = tern_request_default();
        r.prompt = prompt[k];
        r.n_prompt = 10;
        r.max_tokens = 24 + 3 * k;
        r.ignore_eos = 1;
        r.on_event = rt_on_event;
        r.ctx = &out[k];
        r.sampling.seed = 77 + (uint64_t)k;
        r.sampling.temperature = k == 0 || k == 6 ? 0.0f : 1.1f;
        if (k == 1) { r.stop_ids = stop; r.n_stop_ids = 2; }
        if (k == 2) out[k].cancel_after = 7;   /* the callback cancels while the next step is queued */
        if (k == 3) out[k].stop_after = 12;
        if (k == 4) { r.sampling.bias_ids = bid; r.sampling.bias_values = bval; r.sampling.n_bias = 2; }
        if (k == 5) { r.sampling.repetition_penalty = 1.3f; r.max_tokens = 6; } /* no queued steps while it runs */
        if (tern_engine_submit(e, &r, NULL, &err)) printf("  submit: %s\n", err.msg);
    }
    rt_drain(e, 4000);
    tern_engine_stats st;
    tern_engine_get_stats(e, &st);
    *queued = st.steps_queued;
    *steps = st.steps;
    tern_engine_close(e);
    unsetenv("TERN_ASYNC");
    unsetenv("TERN_ASYNC_ROWS");
}

TEST(engine_pipelined_decode_equals_plain) {
    const char *dev = getenv("TERN_TEST_DEVICE") ? getenv("TERN_TEST_DEVICE") : "cpu";
    rt_col a[PIPE_N], b[PIPE_N];
    long long qa, qb, sa, sb;
    engine_pipe_run(dev, 0, a, &qa, &sa);
    engine_pipe_run(dev, 1, b, &qb, &sb);
    CHECK(qa == 0 && qb > 0, "steps queued ahead: %lld with TERN_ASYNC=0, %lld with 1 (of %lld / %lld steps)", qa, qb, sa, sb);
    printf("  %s: %lld of %lld steps queued ahead with the pipeline on\n", dev, qb, sb);
    for (int k = 0; k < PIPE_N; k++) {
        CHECK(a[k].done && b[k].done && !a[k].errors && !b[k].errors, "request %d: not ended once (%s / %s)", k,
              a[k].err_msg, b[k].err_msg);
        CHECK(a[k].n_tok == b[k].n_tok && a[k].n_tok > 0, "request %d: %d / %d tokens", k, a[k].n_tok, b[k].n_tok);
        CHECK(a[k].finish == b[k].finish, "request %d: finish %d / %d", k, (int)a[k].finish, (int)b[k].finish);
        CHECK(!memcmp(a[k].toks, b[k].toks, sizeof(int32_t) * (size_t)a[k].n_tok), "request %d: tokens differ (%s)", k, dev);
    }
    CHECK(b[1].finish == TERN_FINISH_STOP, "request 1: finish %d after %d tokens (stop id 66 expected)", (int)b[1].finish, b[1].n_tok);
    CHECK(b[2].finish == TERN_FINISH_CANCELLED && b[2].n_tok == 7, "request 2: finish %d after %d tokens", (int)b[2].finish, b[2].n_tok);
    CHECK(b[3].finish == TERN_FINISH_STOP && b[3].n_tok == 12, "request 3: finish %d after %d tokens", (int)b[3].finish, b[3].n_tok);
}

int main(void) {
    (void)rt_ref_greedy;
    RUN(reference_draw_equals_naive_spec);
    RUN(cpu_op_equals_sampler_chain);
    RUN(forward_sample_equals_forward_then_sampler);
    RUN(engine_device_sampling_equals_host);
    RUN(engine_pipelined_decode_equals_plain);
    return test_done();
}
