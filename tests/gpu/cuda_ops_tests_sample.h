/*
 * cuda_ops_tests_sample.h — on-device sampling (ops.h vt->sample, src/backend/cuda/sample.cu)
 * against the CPU sampler chain: many random logit rows (spread, peaked, flat, exact ties,
 * -inf holes, signed zeros, NaN) x every parameter set of tests/unit/sample_cases.h x seeds,
 * vocabularies from 7 to 262144, several rows per launch (one of them SKIP), and the same
 * launch recorded in a step graph and replayed. Pass = identical tokens (and identical error
 * kinds) in every case; prints "  err sample <V> mismatches <n>" lines for the report.
 * Included by cuda_ops_tests.h.
 */
#ifndef TERN_CUDA_OPS_TESTS_SAMPLE_H
#define TERN_CUDA_OPS_TESTS_SAMPLE_H

#include "../unit/sample_cases.h"

#define SMP_ROWS 6

/* One launch of SMP_ROWS rows of vocabulary V on the GPU (row 2 is SKIP) vs the sampler chain.
 * Returns mismatches; *n counts compared rows. graph: record the launch, then replay it. */
static int smp_launch(int V, int kind, int pi, uint64_t seed, int graph, int *n) {
    unsigned long long rs = seed * 7919 + (unsigned long long)V;
    size_t rowb = sizeof(float) * (size_t)V;
    float *l = malloc(rowb * SMP_ROWS);
    tern_sample_row rows[SMP_ROWS];
    tern_sample_pair *pairs = malloc(sizeof *pairs * 4096);
    int np = 0, bad = 0;
    tern_sampler *ref[SMP_ROWS];
    for (int r = 0; r < SMP_ROWS; r++) {
        sc_row(l + (size_t)r * V, V, kind + r, &rs);
        if (kind == 5 && r == 4) l[(size_t)r * V + V / 2] = NAN;
        unsigned long long hs = rs;
        tern_sampler *s = sc_sampler(pi, V, seed + (uint64_t)r, 40, &hs);
        ref[r] = sc_sampler(pi, V, seed + (uint64_t)r, 40, &rs);
        if (!s || !ref[r] || !tern_sampler_device_row(s, seed * 3 + (uint64_t)r, &rows[r], pairs, &np, 4096)) bad++;
        tern_sampler_free(s);
    }
    rows[2].mode = TERN_SAMPLE_SKIP;
    int32_t ids[SMP_ROWS];
    for (int r = 0; r < SMP_ROWS; r++) ids[r] = -77;
    float *dl = to_gpu(l, rowb * SMP_ROWS);
    void *drows = to_gpu(rows, sizeof rows), *dpairs = to_gpu(pairs, sizeof *pairs * (size_t)(np ? np : 1));
    int32_t *dids = to_gpu(ids, sizeof ids);
    if (!graph) {
        g_gpu->vt->sample(g_gpu, dids, dl, SMP_ROWS, V, drows, dpairs, NULL);
        g_gpu->vt->download(g_gpu, ids, dids, sizeof ids);
    } else {
        /* record: the logits are consumed in place, so re-upload them before the replay */
        int ok = g_gpu->vt->graph_begin(g_gpu, 0x5a3b1e ^ (uint64_t)V, ids, sizeof ids);
        CHECK(ok, "graph_begin");
        if (ok) {
            g_gpu->vt->sample(g_gpu, dids, dl, SMP_ROWS, V, drows, dpairs, NULL);
            g_gpu->vt->download(g_gpu, ids, dids, sizeof ids);
            CHECK(g_gpu->vt->graph_end(g_gpu, 1), "graph_end");
            g_gpu->vt->upload(g_gpu, dl, l, rowb * SMP_ROWS);
            CHECK(g_gpu->vt->graph_replay(g_gpu, 0x5a3b1e ^ (uint64_t)V, ids, sizeof ids), "graph_replay");
        }
    }
    for (int r = 0; r < SMP_ROWS; r++) {
        if (!ref[r]) continue;
        if (r == 2) {
            if (ids[r] != -77) { bad++; printf("  SKIP row written: %d\n", ids[r]); }
            continue;
        }
        tern_sample_result res;
        tern_error e = {0};
        tern_status st = tern_sampler_sample(ref[r], l + (size_t)r * V, seed * 3 + (uint64_t)r, &res, &e);
        int want = st ? (strstr(e.msg, "NaN") ? TERN_SAMPLE_ERR_NAN : strstr(e.msg, "+inf") ? TERN_SAMPLE_ERR_INF
                                                                                             : TERN_SAMPLE_ERR_MASKED)
                      : res.id;
        (*n)++;
        if (ids[r] != want && bad++ < 8)
            printf("  V=%d kind=%d params=%d seed=%llu row=%d graph=%d: cuda %d cpu %d\n", V, kind + r, pi,
                   (unsigned long long)seed, r, graph, ids[r], want);
        tern_sampler_free(ref[r]);
    }
    g_gpu->vt->free(g_gpu, dl);
    g_gpu->vt->free(g_gpu, drows);
    g_gpu->vt->free(g_gpu, dpairs);
    g_gpu->vt->free(g_gpu, dids);
    free(l);
    free(pairs);
    return bad;
}

TEST(cuda_sample_matches_cpu_sampler) {
    if (!g_gpu->vt->sample) { CHECK(0, "cuda backend has no sample op"); return; }
    static const int Vs[] = {7, 97, 1000, 32000, 151552, 262144};
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        int V = Vs[vi], n = 0, bad = 0;
        int seeds = V <= 1000 ? 6 : V <= 32000 ? 2 : 1;
        for (int sd = 0; sd < seeds; sd++)
            for (int kind = 0; kind < 6; kind++)
                for (int pi = 0; pi < SC_NPARAM; pi++)
                    bad += smp_launch(V, kind, pi, 1 + (uint64_t)sd * 1000 + (uint64_t)kind, 0, &n);
        printf("  err sample V=%d mismatches %d of %d\n", V, bad, n);
        CHECK(bad == 0, "V=%d: %d of %d rows differ from the CPU sampler", V, bad, n);
    }
}

TEST(cuda_sample_in_graph) {
    if (!g_gpu->vt->sample || !g_gpu->vt->graph_begin) return;
    int n = 0, bad = 0;
    for (int pi = 0; pi < SC_NPARAM; pi++) bad += smp_launch(32000, pi % 6, pi, 5 + (uint64_t)pi, 1, &n);
    g_gpu->vt->graph_reset(g_gpu);
    CHECK(bad == 0, "%d of %d rows differ when replayed from a graph", bad, n);
}

static void cuda_sample_tests(void) {
    RUN(cuda_sample_matches_cpu_sampler);
    RUN(cuda_sample_in_graph);
}

#endif
