/*
 * test_model_tp_graphs.c — the group's step-graph protocol (src/model/tp.c) on CPU ranks.
 *
 * CUDA ranks record and replay their own step graphs, NCCL calls included; a rank that replays
 * while another runs eagerly would wait in its all-reduce forever, so every graph decision must
 * be the same on all ranks. CPU backends have no graphs, so this test gives the ranks fake
 * graph entries (tern__tp_test_graphs): "recording" runs the ops as usual, and the replay right
 * after a kept recording returns 1 (the step was computed while recording), any later replay
 * 0 — a rank out of step with the others then runs its all-reduces alone and the test hangs or
 * decodes wrong tokens. Checked over greedy decoding of fixtures with 2 ranks:
 *   - the tokens are the reference's; every rank saw the same replay/begin keys in the same order
 *     (the group key), and graphs were really attempted;
 *   - rank 1 failing one begin: rank 0 drops its recording (end(0)) and the step runs eagerly;
 *   - rank 1 failing one end: every rank resets its graphs and the key is never recorded again;
 *   - device sampling with tensor parallelism (rank 0 draws): greedy draws equal the reference,
 *     and a step mixing drawn and host rows makes no graph call on any rank.
 */
#include "model/tp.h"
#include "model/model.h"
#include "parity_util.h"
#include "runtime/generate.h"
#include "runtime/kv.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#define FIXDIR "tests/parity/fixtures"
#define MAXLOG 8192

typedef struct fake {
    void *impl;                 /* the rank's backend (wrapper and real share impl) */
    int rank;
    int rec, just;
    uint64_t cur, just_key;
    int n_begin, n_end, n_replay, n_reset;
    char op[MAXLOG];            /* 'R' replay, 'B' begin, 'E' end (key = ok), 'X' reset */
    uint64_t key[MAXLOG];
    int nlog;
} fake;

static fake g_f[2];
static int g_fail_begin_at, g_fail_end_at; /* rank 1's nth begin / end fails (0: never) */

static fake *find(tern_backend *be) {
    for (int i = 0; i < 2; i++)
        if (g_f[i].impl == be->impl) return &g_f[i];
    return NULL;
}

static void note(fake *f, char op, uint64_t key) {
    if (f->nlog < MAXLOG) { f->op[f->nlog] = op; f->key[f->nlog++] = key; }
}

static int f_replay(tern_backend *be, uint64_t key, void *out, size_t bytes) {
    (void)out; (void)bytes;
    fake *f = find(be);
    if (!f) return 0;
    note(f, 'R', key);
    f->n_replay++;
    int hit = f->just && f->just_key == key;
    f->just = 0;
    return hit;
}

static int f_begin(tern_backend *be, uint64_t key, void *out, size_t bytes) {
    (void)out; (void)bytes;
    fake *f = find(be);
    if (!f) return 0;
    note(f, 'B', key);
    f->n_begin++;
    if (f->rank == 1 && f->n_begin == g_fail_begin_at) return 0;
    f->rec = 1;
    f->cur = key;
    return 1;
}

static int f_end(tern_backend *be, int ok) {
    fake *f = find(be);
    if (!f) return 0;
    note(f, 'E', (uint64_t)ok);
    f->n_end++;
    if (!f->rec) return 0;
    f->rec = 0;
    if (!ok || (f->rank == 1 && f->n_end == g_fail_end_at)) return 0;
    f->just = 1;
    f->just_key = f->cur;
    return 1;
}

static void f_reset(tern_backend *be) {
    fake *f = find(be);
    if (!f) return;
    note(f, 'X', 0);
    f->n_reset++;
    f->just = f->rec = 0;
}

static const tern_tp_graph_ops k_ops = {f_replay, f_begin, f_end, f_reset};

typedef struct fix { cJSON *ref; char *js; int32_t *prompt, *all; int np, na; } fix;

static int fix_open(fix *x, const char *name) {
    char path[600];
    memset(x, 0, sizeof *x);
    snprintf(path, sizeof path, FIXDIR "/%s/ref.json", name);
    if (!(x->js = pu_slurp(path, NULL))) return 0;
    x->ref = cJSON_Parse(x->js);
    x->np = pu_json_ids(x->ref, "prompt_ids", &x->prompt);
    x->na = pu_json_ids(x->ref, "all_ids", &x->all);
    return x->np > 0 && x->na > x->np;
}

static void fix_close(fix *x) {
    free(x->prompt);
    free(x->all);
    cJSON_Delete(x->ref);
    free(x->js);
}

typedef struct gen_ctx { int32_t out[256]; int n; } gen_ctx;
static int on_tok(void *ctx, int tok) { gen_ctx *g = ctx; if (g->n < 256) g->out[g->n++] = tok; return 0; }

/* Open a 2-rank CPU group on fixture `name` with the fake graphs; NULL tp on failure. */
static tern_status open_group(const char *name, int max_ctx, tern_tp **tp, tern_model **m, tern_kv **kv, tern_error *e) {
    char dir[512];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    memset(g_f, 0, sizeof g_f);
    tern_tp_opts to = {.n = 2, .cuda = 0, .n_threads = 2};
    tern_status s = tern_tp_open(tp, &to, e);
    if (s) return s;
    for (int r = 0; r < 2; r++) { g_f[r].impl = tern_tp_backend(*tp, r)->impl; g_f[r].rank = r; }
    tern__tp_test_graphs(*tp, &k_ops);
    s = tern_tp_load_dir(*tp, dir, NULL, m, e);
    tern_kv_opts ko = {.n_slots = 2, .max_ctx = max_ctx, .block_size = 4};
    if (!s) s = tern_tp_kv_open(*tp, &ko, kv, e);
    return s;
}

/* The R and B entries of both ranks: same ops, same keys, same order. */
static int same_decisions(void) {
    int i = 0, j = 0;
    for (;;) {
        while (i < g_f[0].nlog && g_f[0].op[i] != 'R' && g_f[0].op[i] != 'B') i++;
        while (j < g_f[1].nlog && g_f[1].op[j] != 'R' && g_f[1].op[j] != 'B') j++;
        if (i == g_f[0].nlog || j == g_f[1].nlog) return i == g_f[0].nlog && j == g_f[1].nlog;
        if (g_f[0].op[i] != g_f[1].op[j] || g_f[0].key[i] != g_f[1].key[j]) return 0;
        i++, j++;
    }
}

static void greedy_case(const char *name, int fail_begin, int fail_end) {
    fix x;
    if (!fix_open(&x, name)) { printf("  %s: no fixture\n", name); fix_close(&x); return; }
    g_fail_begin_at = fail_begin;
    g_fail_end_at = fail_end;
    tern_tp *tp = NULL;
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_error e = {0};
    tern_status s = open_group(name, x.na + 8, &tp, &m, &kv, &e);
    CHECK(s == TERN_OK, "%s: %s", name, e.msg);
    gen_ctx g = {.n = 0};
    if (!s) s = tern_generate(m, kv, 0, x.all, x.np, x.na - x.np, 3, NULL, 0, NULL, NULL, on_tok, &g, NULL, &e);
    CHECK(s == TERN_OK, "%s: generate: %s", name, e.msg);
    int same = g.n == x.na - x.np;
    for (int i = 0; same && i < g.n; i++) same = g.out[i] == x.all[x.np + i];
    CHECK(same, "%s (fail begin %d, end %d): greedy tokens differ from the reference (%d generated)", name,
          fail_begin, fail_end, g.n);
    CHECK(g_f[0].n_begin > 0 && g_f[0].n_replay > 0, "%s: no graph was attempted", name);
    CHECK(same_decisions(), "%s: the ranks took different graph decisions", name);
    if (fail_begin) { /* rank 0 began, then dropped its recording since rank 1 could not begin */
        int dropped = 0;
        for (int i = 0, k = 0; i + 1 < g_f[0].nlog; i++)
            if (g_f[0].op[i] == 'B' && ++k == fail_begin) dropped = g_f[0].op[i + 1] == 'E' && g_f[0].key[i + 1] == 0;
        CHECK(dropped, "%s: rank 0 kept recording after rank 1's begin failed", name);
    }
    if (fail_end) { /* kept by rank 0 only: every rank reset, and that key is never recorded again */
        const fake *f = &g_f[1];
        int ie = -1, later = 0;
        for (int i = 0, k = 0; i < f->nlog && ie < 0; i++)
            if (f->op[i] == 'E' && ++k == fail_end) ie = i;
        uint64_t key = 0;
        for (int i = ie - 1; i >= 0 && !key; i--)
            if (f->op[i] == 'B') key = f->key[i];
        for (int i = ie + 1; ie >= 0 && i < f->nlog; i++) later += f->op[i] == 'B' && f->key[i] == key;
        CHECK(ie >= 0 && key, "%s: rank 1 made fewer than %d ends", name, fail_end);
        CHECK(g_f[0].n_reset >= 1 && g_f[1].n_reset >= 1, "%s: no reset after a graph kept by one rank only", name);
        CHECK(later == 0, "%s: the failed key was recorded again %d times", name, later);
    }
    printf("  %s (fail begin %d, end %d): %d generated, %d replays / %d begins / %d resets per rank\n", name, fail_begin,
           fail_end, g.n, g_f[0].n_replay, g_f[0].n_begin, g_f[0].n_reset);
    tern_tp_close(tp);
    g_fail_begin_at = g_fail_end_at = 0;
    fix_close(&x);
}

TEST(tp_graphs_greedy) {
    greedy_case("llama3", 0, 0);
    greedy_case("gemma4_moe_like", 0, 0);
    greedy_case("glm5_dsa", 0, 0);
}

TEST(tp_graphs_rank_fails) {
    greedy_case("llama3", 3, 0);
    greedy_case("llama3", 0, 4);
    greedy_case("gemma4_moe_like", 2, 5);
}

/* Device sampling through the group: rank 0 draws greedy ids; a step with one drawn and one
 * host row runs eagerly on every rank (no graph call at all). */
TEST(tp_graphs_device_sampling) {
    fix x;
    if (!fix_open(&x, "llama3")) { fix_close(&x); return; }
    tern_tp *tp = NULL;
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_error e = {0};
    tern_status s = open_group("llama3", x.na + 8, &tp, &m, &kv, &e);
    CHECK(s == TERN_OK, "%s", e.msg);
    CHECK(!s && tern_model_can_sample(m), "a tensor-parallel model should sample on rank 0");
    int V = s ? 0 : tern_model_cfg(m)->n_vocab;
    float *logits = malloc(sizeof(float) * 2 * (size_t)(V > 0 ? V : 1));
    int32_t pos[2], slot[2], tok[2], ids[2] = {-1, -1};
    int32_t *ppos = malloc(sizeof(int32_t) * (size_t)x.na), *pslot = calloc((size_t)x.na, sizeof(int32_t));
    uint8_t *want = calloc((size_t)x.na, 1);
    for (int i = 0; i < x.na; i++) ppos[i] = i;
    /* prefill the prompt into slots 0 and 1 (last row wants logits) */
    for (int sl = 0; sl < 2 && !s; sl++) {
        if ((s = tern_kv_reserve(kv, sl, x.na, &e))) break;
        for (int i = 0; i < x.np; i++) { pslot[i] = sl; want[i] = i == x.np - 1; }
        tern_batch b = {.n = x.np, .tokens = x.all, .pos = ppos, .slot = pslot, .want = want};
        s = tern_model_forward(m, &b, kv, logits, &e);
    }
    CHECK(s == TERN_OK, "prefill: %s", e.msg);
    tern_sample_row rows[2];
    memset(rows, 0, sizeof rows);
    for (int k = 0; k < 2; k++) { rows[k].mode = TERN_SAMPLE_DRAW; rows[k].top_p = 1; rows[k].rep = 1; rows[k].min_p_log = -INFINITY; }
    int ok_draws = 1, before = 0;
    /* decode: the token at position np (the first generated one) is fed back each step */
    for (int t = x.np; t < x.na - 1 && !s; t++) {
        pos[0] = t; slot[0] = 0; tok[0] = x.all[t];
        tern_batch b = {.n = 1, .tokens = tok, .pos = pos, .slot = slot};
        tern_batch_sample smp = {.rows = rows, .ids = ids};
        s = tern_model_forward_sample(m, &b, kv, NULL, &smp, &e);
        ok_draws &= ids[0] == x.all[t + 1];
    }
    CHECK(s == TERN_OK && ok_draws, "drawn greedy ids differ from the reference: %s", e.msg);
    CHECK(g_f[0].n_replay > 0, "device-sampled steps made no graph call");
    /* mixed: slot 0 drawn, slot 1 on the host (its logits come back), one step of 2 rows */
    before = g_f[0].nlog + g_f[1].nlog;
    if (!s) {
        pos[0] = x.na - 1; slot[0] = 0; tok[0] = x.all[x.na - 1];
        pos[1] = x.np; slot[1] = 1; tok[1] = x.all[x.np];
        rows[1].mode = TERN_SAMPLE_SKIP;
        tern_batch b = {.n = 2, .tokens = tok, .pos = pos, .slot = slot};
        tern_batch_sample smp = {.rows = rows, .ids = ids};
        s = tern_model_forward_sample(m, &b, kv, logits, &smp, &e);
        CHECK(s == TERN_OK, "mixed step: %s", e.msg);
        CHECK(g_f[0].nlog + g_f[1].nlog == before, "a mixed step made %d graph calls", g_f[0].nlog + g_f[1].nlog - before);
        if (!s && x.np + 1 < x.na)
            CHECK(tern_argmax(logits + V, V) == x.all[x.np + 1], "host row of the mixed step: wrong logits");
    }
    free(logits); free(ppos); free(pslot); free(want);
    tern_tp_close(tp);
    fix_close(&x);
}

int main(void) {
    RUN(tp_graphs_greedy);
    RUN(tp_graphs_rank_fails);
    RUN(tp_graphs_device_sampling);
    return test_done();
}
