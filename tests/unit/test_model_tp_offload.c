/*
 * test_model_tp_offload.c — expert offload inside a tensor/expert-parallel group (model/tp.c +
 * runtime/experts.c) on CPU ranks.
 *
 * Each rank holds experts [e0, e0 + E/N) and, with offload on, caches them in its own slots
 * (1/N of the slot memory, per-expert sources starting at its first expert, read-ahead with the
 * global router mapped to its own experts). Claim: offload changes no bit — for N = 2 the logits
 * of a full forward of all_ids, of a decode step after a logit-free prefill and the greedy ids
 * are memcmp-identical with and without offload, at the minimum slot count (k per layer: most
 * routed experts miss) and at E/N, with the I/O thread and read-ahead off and on
 * (TERN_EXPERTS_PREFETCH=1). Fixtures cover the stored layouts: HF fused 3-D (gemma4_moe_like),
 * per-expert tensors (glm5_dsa: the views path), mlx switch_glu stacks (gemma4_moe_mixed).
 * TERN_TEST_DEVICE=cuda puts rank i on GPU i (skips with fewer than 2 GPUs).
 */
#include "model/tp.h"
#include "tp_util.h"
#include "parity_util.h"
#include "runtime/experts.h"
#include "runtime/generate.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define FIXDIR "tests/parity/fixtures"

static int g_cuda;

typedef struct run_out {
    tern_status st;
    char msg[600];
    int V, n_gen, misses, predicted;
    float *full, *step;
    int32_t gen[256];
} run_out;

/* slots: 0 no offload, else slots per MoE layer on every rank */
static void run(const char *name, int N, int slots, const tp_fixture *f, run_out *o) {
    memset(o, 0, sizeof *o);
    char dir[512];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    tern_error e = {0};
    tern_tp *tp = NULL;
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_tp_opts to = {.n = N, .cuda = g_cuda, .n_threads = g_cuda ? 0 : N, .compute = TERN_COMPUTE_F32};
    tern_model_opts mo = {.expert_slots = slots};
    tern_status s = tern_tp_open(&tp, &to, &e);
    if (!s) s = tern_tp_load_dir(tp, dir, slots ? &mo : NULL, &m, &e);
    const int na = f->na;
    tern_kv_opts ko = {.n_slots = 2, .max_ctx = na + 8, .block_size = 4};
    if (!s) s = tern_tp_kv_open(tp, &ko, &kv, &e);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)na), *slot = calloc((size_t)na, sizeof(int32_t));
    if (s) goto done;
    int V = o->V = tern_model_cfg(m)->n_vocab;
    o->full = malloc(sizeof(float) * (size_t)na * V);
    o->step = malloc(sizeof(float) * (size_t)V);
    s = tp_full(m, kv, f, pos, slot, o->full, &e);
    if (!s) s = tp_step(m, kv, f, pos, slot, o->step, &e); /* prefill without logits, one decode step */
    if (!s) s = tp_greedy(m, kv, f, o->gen, &o->n_gen, &e);
    if (!s && slots) {
        const struct tern_experts *x = tern_model_experts(m);
        tern_experts_stats xs = {0};
        if (x) tern_experts_get_stats(x, &xs);
        o->misses = x ? (int)xs.misses : -1;
        o->predicted = x ? (int)xs.predicted : -1;
    }
done:
    free(pos);
    free(slot);
    o->st = s;
    snprintf(o->msg, sizeof o->msg, "%s", e.msg);
    tern_tp_close(tp);
}

static void out_free(run_out *o) { free(o->full); free(o->step); }

static void check_fixture(const char *name, int N) {
    tp_fixture fx;
    if (!tp_fix_load(FIXDIR, name, &fx)) { printf("  %s: no fixture\n", name); tp_fix_free(&fx); return; }
    const int na = fx.na;
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, FIXDIR "/%s", name);
    tern_model_config cfg;
    tern_error e = {0};
    CHECK(tern_config_load(&cfg, cfgp, &e) == TERN_OK, "%s: %s", name, e.msg);
    const int El = cfg.n_expert / N, k = cfg.n_expert_used;
    run_out base;
    run(name, N, 0, &fx, &base);
    CHECK(base.st == TERN_OK, "%s N=%d without offload: %s", name, N, base.msg);
    const int slot_counts[2] = {k, El};
    for (int pf = 0; pf < 2 && !base.st; pf++) {
        if (pf) setenv("TERN_EXPERTS_PREFETCH", "1", 1);
        for (int i = 0; i < 2; i++) {
            run_out o;
            run(name, N, slot_counts[i], &fx, &o);
            CHECK(o.st == TERN_OK, "%s N=%d slots %d: %s", name, N, slot_counts[i], o.msg);
            if (!o.st) {
                const size_t V = (size_t)base.V;
                int same = !memcmp(o.full, base.full, sizeof(float) * (size_t)na * V) &&
                           !memcmp(o.step, base.step, sizeof(float) * V) && o.n_gen == base.n_gen &&
                           !memcmp(o.gen, base.gen, sizeof(int32_t) * (size_t)base.n_gen);
                CHECK(same, "%s N=%d slots %d prefetch %d: offload changed logits or ids", name, N, slot_counts[i], pf);
                printf("  %s N=%d, %d of %d experts per rank in %d slots, prefetch %d: %s (rank 0: %d misses, %d read "
                       "ahead)\n", name, N, El, cfg.n_expert, slot_counts[i], pf, same ? "bitwise" : "DIFFERENT", o.misses,
                       o.predicted);
                /* the read-ahead maps the global router's choices to this rank's experts */
                CHECK(o.predicted > 0 || slot_counts[i] == El, "%s: no read-ahead on rank 0", name);
            }
            out_free(&o);
        }
        unsetenv("TERN_EXPERTS_PREFETCH");
    }
    out_free(&base);
    tern_config_free(&cfg);
    tp_fix_free(&fx);
}

TEST(tp_offload_layouts) {
    check_fixture("gemma4_moe_like", 2);  /* HF fused gate_up_proj / down_proj */
    check_fixture("glm5_dsa", 2);         /* per-expert tensors: source tables from expert e0 */
    check_fixture("gemma4_moe_mixed", 2); /* mlx switch_glu stacks, mixed quantization */
}

int main(void) {
    const char *dev = getenv("TERN_TEST_DEVICE");
    if (dev && !strcmp(dev, "cuda")) {
        g_cuda = 1;
        if (!tp_gpus_ok(2, "tp_offload on cuda")) return 0;
    }
    RUN(tp_offload_layouts);
    return test_done();
}
