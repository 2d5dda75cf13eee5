/* test_kern_argmax.c — the kernel tables' argmax (kern.h) against the sampler's reference draw at temperature 0
 * (src/sample/sample_ref.c tern__sample_draw): the same id, or the same error code, for every ISA this machine
 * runs (scalar, AVX2, AVX-512), over lengths around the vector widths and the vocabulary size of llama3, values
 * with ties, -inf entries, +-0, and a NaN or +inf at any place; and the fast backend's sample op against the
 * reference op (greedy rows through the kernel, rows with bias, penalties or a temperature through the chain). */
#include "backend/cpu/cpu_impl.h"
#include "sample/sample_ref.h"
#include "test_kern_util.h"

#include <string.h>

static int32_t ref_pick(const float *x, int n) {
    tern_sample_row p = {.mode = TERN_SAMPLE_DRAW, .top_p = 1.0f, .min_p_log = -INFINITY, .rep = 1.0f};
    int bad;
    return tern__sample_draw(x, n, &p, NULL, &bad);
}

/* kind 0: distinct randoms; 1: a few values (ties); 2: mostly -inf; 3: all -inf; 4: zeros of both signs */
static void fill(float *x, int n, int kind, unsigned long long *s) {
    for (int i = 0; i < n; i++) {
        const unsigned long long r = test_rand_u64(s);
        switch (kind) {
        case 0: x[i] = test_randf(s) * 30.0f; break;
        case 1: x[i] = (float)(r % 5) - 2.0f; break;
        case 2: x[i] = r % 7 ? -INFINITY : (float)(r % 3); break;
        case 3: x[i] = -INFINITY; break;
        default: x[i] = r % 3 ? (r & 8 ? 0.0f : -0.0f) : -1.0f; break;
        }
    }
}

static const tern_cpu_kern *table(const char *isa) {
    if (!strcmp(isa, "avx512")) return &tern__cpu_kern_avx512;
    if (!strcmp(isa, "avx2")) return &tern__cpu_kern_avx2;
    return &tern__cpu_kern_scalar;
}

TEST(argmax_vs_reference) {
    static const char *isas[] = {"scalar", "avx2", "avx512"};
    static const int lens[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 1000, 128256};
    float *x = malloc(sizeof(float) * 128256);
    for (size_t s = 0; s < TERN_ARRAY_LEN(isas); s++) {
        if (!kt_isa_ok(isas[s])) continue;
        const tern_cpu_kern *k = table(isas[s]);
        CHECK(k->argmax != NULL, "%s: no argmax", isas[s]);
        if (!k->argmax) continue;
        unsigned long long seed = 12345;
        int cases = 0;
        for (size_t li = 0; li < TERN_ARRAY_LEN(lens); li++) {
            const int n = lens[li];
            for (int kind = 0; kind < 5; kind++)
                for (int sp = 0; sp < (n > 0 ? 6 : 1); sp++) {
                    fill(x, n, kind, &seed);
                    /* sp 1..2: a NaN / +inf somewhere; 3: both, NaN first; 4: both, +inf first; 5: the max at the end */
                    const int a = n ? (int)(test_rand_u64(&seed) % (unsigned)n) : 0, b = n ? (int)(test_rand_u64(&seed) % (unsigned)n) : 0;
                    const int lo = a < b ? a : b, hi = a < b ? b : a;
                    if (sp == 1) x[a] = NAN;
                    if (sp == 2) x[a] = INFINITY;
                    if (sp == 3) { x[hi] = INFINITY; x[lo] = NAN; }
                    if (sp == 4) { x[hi] = NAN; x[lo] = INFINITY; }
                    if (sp == 5) x[n - 1] = 1e30f;
                    const int32_t want = ref_pick(x, n), got = k->argmax(x, n);
                    CHECK(got == want, "%s n=%d kind %d special %d: argmax %d, the reference %d", isas[s], n, kind, sp, got, want);
                    cases++;
                }
        }
        printf("  %s: %d cases\n", isas[s], cases);
    }
    free(x);
}

TEST(sample_op_vs_reference_op) {
    static const char *isas[] = {"avx512", "avx2", "scalar"};
    const int V = 4099, n = 4;
    for (size_t s = 0; s < TERN_ARRAY_LEN(isas); s++) {
        if (!kt_isa_ok(isas[s])) continue;
        tern_backend *be = kt_open_cpu(isas[s], 2);
        CHECK(be != NULL, "open %s", isas[s]);
        if (!be) continue;
        float *l0 = malloc(sizeof(float) * (size_t)V * n), *l1 = malloc(sizeof(float) * (size_t)V * n);
        void *scr = malloc(tern_sample_scratch_bytes(V));
        unsigned long long seed = 777;
        for (int rep = 0; rep < 8; rep++) {
            for (int r = 0; r < n; r++) fill(l0 + (size_t)r * V, V, rep % 2, &seed);
            memcpy(l1, l0, sizeof(float) * (size_t)V * n);
            tern_sample_pair pairs[2] = {{5, 3.0f}, {17, 2.0f}};
            tern_sample_row rows[4];
            for (int r = 0; r < n; r++)
                rows[r] = (tern_sample_row){.mode = TERN_SAMPLE_DRAW, .top_p = 1.0f, .min_p_log = -INFINITY, .rep = 1.0f,
                                            .seed = 9, .step = (uint64_t)rep};
            rows[1].n_bias = 1; /* greedy with a bias: the chain */
            rows[2].temperature = 0.8f, rows[2].inv_t = 1.0 / 0.8;
            rows[3].mode = rep % 3 ? TERN_SAMPLE_DRAW : TERN_SAMPLE_SKIP;
            int32_t i0[4] = {-7, -7, -7, -7}, i1[4] = {-7, -7, -7, -7};
            tern_sample_op_host(NULL, i0, l0, n, V, rows, pairs, scr);
            be->vt->sample(be, i1, l1, n, V, rows, pairs, scr);
            CHECK(!memcmp(i0, i1, sizeof i0), "%s rep %d: ids %d %d %d %d vs the reference %d %d %d %d", isas[s], rep, i1[0],
                  i1[1], i1[2], i1[3], i0[0], i0[1], i0[2], i0[3]);
            CHECK(!memcmp(l0, l1, sizeof(float) * (size_t)V * n), "%s rep %d: logits left differently", isas[s], rep);
        }
        free(l0);
        free(l1);
        free(scr);
        tern_backend_close(be);
    }
}

int main(void) {
    RUN(argmax_vs_reference);
    RUN(sample_op_vs_reference_op);
    return test_done();
}
