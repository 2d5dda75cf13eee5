/*
 * test_kern_glm.c — the GLM-5 ops (ops.h tern_glm_ops) against direct computations, on both
 * CPU backends, over a real paged latent KV cache (src/runtime/kv.c latent kind):
 *   copy_2d, layernorm, rope_interleaved (only the slice moves), kv_write_latent +
 *   attention_latent (dense, with a selection incl. padding / out-of-range entries, and with a
 *   non-resident block), dsa_topk (scores in double, order = score desc then position asc,
 *   dense rows, exact ties, min_gap), route_group (groups, bias for choice only, ties,
 *   normalisation and scaling), and the latent pool geometry (bytes, missing V pool, block copy).
 * Then the fast table against the scalar spec over a grid (hand-built views: permuted blocks,
 * a non-resident block, two slots; head counts that do not fill a head block, records whose
 * length is no multiple of the SIMD width, rows longer than a key tile, selections with padding
 * and out-of-range entries, k at and around pos+1, exact score ties, NaN weights), on every ISA
 * level and 1-3 threads: light ops and routing bit-identical, attention within 2e-5, identical
 * selections; and bit-identical results across thread counts and alone vs in a batch.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_glm.h"
#include "runtime/kv.h"
#include "test.h"
#include "test_kern_util.h"

#define T 37   /* tokens in the cache */
#define BS 4   /* block size */
#define WD 20  /* latent record: 16 latent + 4 rope */
#define DV 12  /* indexer key */

static tern_backend *g_be[2];
static unsigned long long g_seed = 0x5eed1234ull;

static void fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * test_randf(&g_seed);
}

static void latent_cfg(tern_model_config *c, tern_layer_config *L, int vdim) {
    memset(c, 0, sizeof *c);
    memset(L, 0, 2 * sizeof *L);
    c->n_layer = 2;
    c->n_ctx_train = 64;
    c->layers = L;
    for (int l = 0; l < 2; l++) {
        L[l].kv_latent = 1;
        L[l].n_head_kv = 1;
        L[l].head_dim = WD;
        L[l].kv_v_dim = l == 0 ? vdim : 0;
        L[l].kv_src = l;
    }
}

/* a cache with T positions of slot 0 written from K[T][WD], V[T][DV] */
static tern_kv *make_cache(tern_backend *be, float *K, float *V) {
    tern_model_config c;
    static tern_layer_config L[2];
    latent_cfg(&c, L, DV);
    tern_kv *kv = NULL;
    tern_error e = {0};
    tern_kv_opts o = {.block_size = BS, .n_slots = 2, .max_ctx = 64};
    if (tern_kv_open(&kv, be, &c, &o, &e)) { printf("  kv_open: %s\n", e.msg); return NULL; }
    tern_kv_reserve(kv, 0, T, &e);
    tern_kv_sync(kv);
    fill(K, (size_t)T * WD, 1.0f);
    fill(V, (size_t)T * DV, 1.0f);
    int32_t pos[T], slot[T];
    for (int i = 0; i < T; i++) pos[i] = i, slot[i] = 0;
    tern_rows rows = {.n = T, .pos = pos, .slot = slot, .pos_host = pos, .slot_host = slot};
    be->vt->glm->kv_write_latent(be, tern_kv_view(kv, 0), &rows, K, V);
    return kv;
}

TEST(glm_copy_norm_rope) {
    for (int bi = 0; bi < 2; bi++) {
        tern_backend *be = g_be[bi];
        const tern_glm_ops *go = be->vt->glm;
        CHECK(go != NULL, "%s has no glm ops", be->vt->name);
        if (!go) continue;
        float src[6 * 7], dst[6 * 9];
        fill(src, 42, 1.0f);
        for (int i = 0; i < 54; i++) dst[i] = 99.0f;
        go->copy_2d(be, dst + 2, 9, src + 1, 7, 6, 5);
        int ok = 1;
        for (int r = 0; r < 6; r++)
            for (int j = 0; j < 9; j++) ok &= dst[r * 9 + j] == (j >= 2 && j < 7 ? src[r * 7 + 1 + j - 2] : 99.0f);
        CHECK(ok, "%s copy_2d", be->vt->name);

        float x[3 * 10], y[3 * 10], w[10], b[10];
        fill(x, 30, 3.0f); fill(w, 10, 1.0f); fill(b, 10, 1.0f);
        go->layernorm(be, y, x, 3, 10, w, b, 1e-6f);
        double worst = 0;
        for (int r = 0; r < 3; r++) {
            double mu = 0, var = 0;
            for (int j = 0; j < 10; j++) mu += x[r * 10 + j] / 10.0;
            for (int j = 0; j < 10; j++) var += (x[r * 10 + j] - mu) * (x[r * 10 + j] - mu) / 10.0;
            for (int j = 0; j < 10; j++)
                worst = fmax(worst, fabs(y[r * 10 + j] - ((x[r * 10 + j] - mu) / sqrt(var + 1e-6) * w[j] + b[j])));
        }
        CHECK(worst < 1e-5, "%s layernorm err %g", be->vt->name, worst);

        /* rope on the slice [4, 10) of heads of stride 10: pairs (4,5), (6,7), (8,9) */
        float q[2 * 3 * 10], q0[2 * 3 * 10], inv[3] = {1.0f, 0.1f, 0.01f};
        int32_t pos[2] = {3, 17};
        fill(q, 60, 1.0f);
        memcpy(q0, q, sizeof q);
        go->rope_interleaved(be, q, 2, 3, 10, 4, 6, pos, inv, 1.5f);
        worst = 0;
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 3; h++) {
                const float *a = q0 + (r * 3 + h) * 10;
                const float *o = q + (r * 3 + h) * 10;
                for (int j = 0; j < 4; j++) worst = fmax(worst, fabs(o[j] - a[j]) * 1e6); /* untouched */
                for (int i = 0; i < 3; i++) {
                    double th = (double)(float)((float)pos[r] * inv[i]);
                    double e0 = (a[4 + 2 * i] * cos(th) - a[5 + 2 * i] * sin(th)) * 1.5;
                    double e1 = (a[5 + 2 * i] * cos(th) + a[4 + 2 * i] * sin(th)) * 1.5;
                    worst = fmax(worst, fmax(fabs(o[4 + 2 * i] - e0), fabs(o[5 + 2 * i] - e1)));
                }
            }
        CHECK(worst < 1e-5, "%s rope_interleaved err %g", be->vt->name, worst);
    }
}

/* direct attention of one row/head over the listed positions */
static void attend(const float *K, const float *q, const int *ps, int np, float scale, int dv, double *out) {
    double s[T], m = -1e300, sum = 0;
    for (int c = 0; c < np; c++) {
        double d = 0;
        for (int j = 0; j < WD; j++) d += (double)q[j] * K[ps[c] * WD + j];
        s[c] = d * scale;
        m = fmax(m, s[c]);
    }
    for (int j = 0; j < dv; j++) out[j] = 0;
    for (int c = 0; c < np; c++) {
        double p = exp(s[c] - m);
        sum += p;
        for (int j = 0; j < dv; j++) out[j] += p * K[ps[c] * WD + j];
    }
    for (int j = 0; j < dv; j++) out[j] /= sum;
}

TEST(glm_attention_latent) {
    for (int bi = 0; bi < 2; bi++) {
        tern_backend *be = g_be[bi];
        const tern_glm_ops *go = be->vt->glm;
        static float K[T * WD], V[T * DV];
        tern_kv *kv = make_cache(be, K, V);
        CHECK(kv != NULL, "cache");
        if (!kv) continue;
        const tern_kv_layer *kvl = tern_kv_view(kv, 0);
        CHECK(kvl->latent == 1 && kvl->v_dim == DV && kvl->head_dim == WD && kvl->n_head_kv == 1 && kvl->v, "view");
        CHECK(tern_kv_view(kv, 1)->v == NULL && tern_kv_view(kv, 1)->v_dim == 0, "no V pool on layer 1");
        enum { N = 3, NH = 2, DVO = 16, KS = 6 };
        int32_t pos[N] = {5, 20, 36}, slot[N] = {0, 0, 0};
        tern_rows rows = {.n = N, .pos = pos, .slot = slot, .pos_host = pos, .slot_host = slot};
        float q[N * NH * WD], out[N * NH * DVO];
        fill(q, sizeof q / sizeof *q, 1.0f);
        int32_t sel[N * KS] = {0, 5, 2, 9, -1, 3,  /* 9 > pos 5: ignored */
                               1, 4, 7, 11, 19, 20, 30, 31, 32, 33, 35, 36};
        double worst = 0;
        for (int mode = 0; mode < 2; mode++) {
            go->attention_latent(be, out, q, &rows, NH, kvl, DVO, 0.3f, mode ? sel : NULL, KS);
            for (int r = 0; r < N; r++) {
                int ps[T], np = 0;
                if (mode) {
                    for (int c = 0; c < KS; c++)
                        if (sel[r * KS + c] >= 0 && sel[r * KS + c] <= pos[r]) ps[np++] = sel[r * KS + c];
                } else {
                    for (int b = 0; b <= pos[r]; b++) ps[np++] = b;
                }
                for (int h = 0; h < NH; h++) {
                    double want[DVO];
                    attend(K, q + (r * NH + h) * WD, ps, np, 0.3f, DVO, want);
                    for (int j = 0; j < DVO; j++) worst = fmax(worst, fabs(out[(r * NH + h) * DVO + j] - want[j]));
                }
            }
        }
        CHECK(worst < 1e-5, "%s attention_latent err %g", be->vt->name, worst);
        /* a non-resident block is never read: drop block 1 (positions 4..7) from a copy of the view */
        tern_kv_layer hole = *kvl;
        int32_t table[64];
        memcpy(table, kvl->block_table, sizeof(int32_t) * (size_t)kvl->max_blocks);
        table[1] = -1;
        hole.block_table = table;
        int32_t p1[1] = {10}, s1[1] = {0};
        tern_rows r1 = {.n = 1, .pos = p1, .slot = s1, .pos_host = p1, .slot_host = s1};
        go->attention_latent(be, out, q, &r1, 1, &hole, DVO, 0.3f, NULL, 0);
        int ps[8] = {0, 1, 2, 3, 8, 9, 10}, np = 7;
        double want[DVO], w2 = 0;
        attend(K, q, ps, np, 0.3f, DVO, want);
        for (int j = 0; j < DVO; j++) w2 = fmax(w2, fabs(out[j] - want[j]));
        CHECK(w2 < 1e-5, "%s non-resident block err %g", be->vt->name, w2);
        tern_kv_close(kv);
    }
}

TEST(glm_dsa_topk) {
    for (int bi = 0; bi < 2; bi++) {
        tern_backend *be = g_be[bi];
        const tern_glm_ops *go = be->vt->glm;
        static float K[T * WD], V[T * DV];
        tern_kv *kv = make_cache(be, K, V);
        if (!kv) { CHECK(0, "cache"); continue; }
        const tern_kv_layer *kvl = tern_kv_view(kv, 0);
        enum { N = 4, NI = 3, KS = 8 };
        int32_t pos[N] = {3, 7, 21, 36}, slot[N] = {0, 0, 0, 0}, sel[N * KS];
        tern_rows rows = {.n = N, .pos = pos, .slot = slot, .pos_host = pos, .slot_host = slot};
        float q[N * NI * DV], w[N * NI], gap = NAN;
        fill(q, sizeof q / sizeof *q, 1.0f);
        fill(w, sizeof w / sizeof *w, 1.0f); /* negative weights too */
        go->dsa_topk(be, sel, q, w, &rows, NI, kvl, 0.25f, KS, &gap);
        int ok = 1;
        double min_gap = 1e300;
        for (int r = 0; r < N; r++) {
            const int32_t *sr = sel + r * KS;
            if (pos[r] + 1 <= KS) { /* dense row: 0..pos then -1 */
                for (int i = 0; i < KS; i++) ok &= sr[i] == (i <= pos[r] ? i : -1);
                continue;
            }
            double I[T];
            int ord[T];
            for (int b = 0; b <= pos[r]; b++) {
                I[b] = 0;
                for (int j = 0; j < NI; j++) {
                    double d = 0;
                    for (int c = 0; c < DV; c++) d += (double)q[(r * NI + j) * DV + c] * V[b * DV + c];
                    d *= 0.25;
                    if (d > 0) I[b] += w[r * NI + j] * d;
                }
                ord[b] = b;
            }
            for (int i = 1; i <= pos[r]; i++) /* insertion sort: score desc, position asc */
                for (int j = i; j > 0 && (I[ord[j]] > I[ord[j - 1]] ||
                                          (I[ord[j]] == I[ord[j - 1]] && ord[j] < ord[j - 1])); j--) {
                    int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
                }
            min_gap = fmin(min_gap, I[ord[KS - 1]] - I[ord[KS]]);
            int want[KS];
            memcpy(want, ord, sizeof want);
            for (int i = 1; i < KS; i++) /* ascending positions */
                for (int j = i; j > 0 && want[j] < want[j - 1]; j--) { int t = want[j]; want[j] = want[j - 1]; want[j - 1] = t; }
            for (int i = 0; i < KS; i++) ok &= sr[i] == want[i];
        }
        CHECK(ok, "%s dsa_topk selection", be->vt->name);
        CHECK(fabs(gap - min_gap) < 1e-5, "%s min_gap %g vs %g", be->vt->name, gap, min_gap);
        /* exact ties (zero queries: every score 0): the lowest positions win */
        memset(q, 0, sizeof q);
        go->dsa_topk(be, sel, q, w, &rows, NI, kvl, 0.25f, KS, NULL);
        ok = 1;
        for (int i = 0; i < KS; i++) ok &= sel[3 * KS + i] == i;
        CHECK(ok, "%s ties -> lowest positions", be->vt->name);
        tern_kv_close(kv);
    }
}

TEST(glm_route_group) {
    enum { N = 6, E = 16, G = 4, GK = 2, KE = 4 };
    for (int bi = 0; bi < 2; bi++) {
        tern_backend *be = g_be[bi];
        const tern_glm_ops *go = be->vt->glm;
        float lg[N * E], bias[E], wts[N * KE];
        int32_t idx[N * KE];
        fill(lg, N * E, 3.0f);
        fill(bias, E, 0.5f);
        for (int norm = 0; norm < 2; norm++) {
            tern_route_group p = {.n_group = G, .topk_group = GK, .norm = norm, .scaling = 2.5f, .bias = bias};
            go->route_group(be, idx, wts, lg, N, E, KE, &p);
            int ok = 1;
            double worst = 0;
            for (int r = 0; r < N; r++) {
                double sg[E], ch[E], gs[G];
                for (int e = 0; e < E; e++) sg[e] = 1 / (1 + exp(-lg[r * E + e])), ch[e] = sg[e] + bias[e];
                for (int g = 0; g < G; g++) { /* top-2 sum of 4 */
                    double a = -1e9, b = -1e9;
                    for (int e = g * 4; e < g * 4 + 4; e++) { if (ch[e] > a) { b = a; a = ch[e]; } else if (ch[e] > b) b = ch[e]; }
                    gs[g] = a + b;
                }
                int kept[G] = {0};
                for (int t = 0; t < GK; t++) {
                    int bg = -1;
                    for (int g = 0; g < G; g++) if (!kept[g] && (bg < 0 || gs[g] > gs[bg])) bg = g;
                    kept[bg] = 1;
                }
                int used[E] = {0}, want[KE];
                double sum = 0;
                for (int j = 0; j < KE; j++) {
                    int be_ = -1;
                    for (int e = 0; e < E; e++) if (kept[e / 4] && !used[e] && (be_ < 0 || ch[e] > ch[be_])) be_ = e;
                    used[be_] = 1;
                    want[j] = be_;
                    sum += sg[be_];
                }
                for (int j = 0; j < KE; j++) {
                    ok &= idx[r * KE + j] == want[j];
                    double ww = sg[want[j]] / (norm ? sum + 1e-20 : 1.0) * 2.5;
                    worst = fmax(worst, fabs(wts[r * KE + j] - ww));
                }
            }
            CHECK(ok, "%s route_group experts (norm %d)", be->vt->name, norm);
            CHECK(worst < 1e-5, "%s route_group weights err %g", be->vt->name, worst);
        }
        /* ties everywhere: lower groups, then lower experts; weights from sigmoid only */
        memset(lg, 0, sizeof lg);
        tern_route_group p = {.n_group = G, .topk_group = GK, .norm = 1, .scaling = 1.0f, .bias = NULL};
        go->route_group(be, idx, wts, lg, 1, E, KE, &p);
        CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && idx[3] == 3 && fabsf(wts[0] - 0.25f) < 1e-6f, "%s ties",
              be->vt->name);
    }
}

TEST(glm_latent_pool) {
    tern_model_config c;
    tern_layer_config L[2];
    latent_cfg(&c, L, DV);
    CHECK(tern_kv_bytes_per_token(&c) == (size_t)(2 * WD + DV) * 4, "bytes/token %zu", tern_kv_bytes_per_token(&c));
    tern_kv *kv = NULL;
    tern_error e = {0};
    tern_kv_opts o = {.block_size = BS, .n_slots = 1, .max_ctx = 16};
    CHECK(tern_kv_open(&kv, g_be[1], &c, &o, &e) == TERN_OK, "%s", e.msg);
    if (!kv) return;
    CHECK(tern_kv_layer_page_bytes(kv, 0, 0) == BS * WD * 4 && tern_kv_layer_page_bytes(kv, 0, 1) == BS * DV * 4 &&
              tern_kv_layer_page_bytes(kv, 1, 1) == 0, "page bytes");
    CHECK(tern_kv_reserve(kv, 0, 8, &e) == TERN_OK, "%s", e.msg);
    float kp[BS * WD], vp[BS * DV], kq[BS * WD], vq[BS * DV];
    fill(kp, BS * WD, 1.0f);
    fill(vp, BS * DV, 1.0f);
    int blk = tern_kv_block(kv, 0, 1);
    CHECK(tern_kv_block_copy(kv, 0, blk, kp, vp, 1, &e) == TERN_OK && tern_kv_block_copy(kv, 0, blk, kq, vq, 0, &e) == TERN_OK &&
              !memcmp(kp, kq, sizeof kp) && !memcmp(vp, vq, sizeof vp), "block copy with V");
    CHECK(tern_kv_block_copy(kv, 1, blk, kp, NULL, 1, &e) == TERN_OK && tern_kv_block_copy(kv, 1, blk, kq, NULL, 0, &e) == TERN_OK &&
              !memcmp(kp, kq, sizeof kp), "block copy without V");
    tern_kv_close(kv);
    tern_kv_fmt f[4] = {{.kind = TERN_KV_AFFINE, .bits = 8, .group = 4}};
    o.formats = f;
    CHECK(tern_kv_open(&kv, g_be[1], &c, &o, &e) == TERN_EUNSUPPORTED && strstr(e.msg, "latent"), "%s", e.msg);
}

/* ---- fast table vs the spec over a grid ---------------------------------------------------- */

enum { NBE = 6 };
static tern_backend *g_fast[NBE]; /* [0] ref, then fast: default ISA x 1/2/3 threads, avx2, scalar */
static const char *g_fast_name[NBE] = {"ref", "fast/1", "fast/2", "fast/3", "avx2/2", "scalar/2"};

typedef struct gview {
    tern_kv_layer kv;
    float *K, *V;
    int32_t *table;
} gview;

/* Two slots of up to max_pos+1 positions, blocks assigned in a shuffled order; block 2 of
 * slot 1 is not resident. ints: small integer values (exact dot products). */
static void make_view(gview *g, int wd, int dv, int bs, int max_pos, int ints) {
    int mb = max_pos / bs + 1, nb = 2 * mb;
    memset(g, 0, sizeof *g);
    g->K = malloc(sizeof(float) * (size_t)nb * bs * wd);
    g->V = dv ? malloc(sizeof(float) * (size_t)nb * bs * dv) : NULL;
    g->table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) g->table[i] = i;
    for (int i = nb - 1; i > 0; i--) { /* shuffle */
        int j = (int)(test_rand_u64(&g_seed) % (unsigned long long)(i + 1)), t = g->table[i];
        g->table[i] = g->table[j];
        g->table[j] = t;
    }
    if (mb > 2) g->table[mb + 2] = -1;
    for (size_t i = 0; i < (size_t)nb * bs * wd; i++)
        g->K[i] = ints ? (float)(int)(test_rand_u64(&g_seed) % 7) - 3.0f : test_randf(&g_seed);
    for (size_t i = 0; g->V && i < (size_t)nb * bs * dv; i++)
        g->V[i] = ints ? (float)(int)(test_rand_u64(&g_seed) % 7) - 3.0f : test_randf(&g_seed);
    g->kv = (tern_kv_layer){.dtype = TERN_DT_F32, .n_head_kv = 1, .head_dim = wd, .block_size = bs, .k = g->K,
                            .v = g->V, .block_table = g->table, .max_blocks = mb, .latent = 1, .v_dim = dv};
}

static void free_view(gview *g) { free(g->K); free(g->V); free(g->table); }

static int bits_eq(const void *a, const void *b, size_t n) { return !memcmp(a, b, n); }

TEST(glm_fast_attention_grid) {
    static const int geo[3][4] = {{20, 16, 4, 0}, {72, 64, 16, 0}, {37, 37, 8, 0}}; /* wd, dv out, block */
    static const int heads[4] = {1, 5, 16, 19};
    enum { N = 7, KS = 40 };
    int32_t pos[N] = {0, 31, 32, 33, 100, 150, 199}, slot[N] = {0, 1, 0, 1, 0, 1, 0}, sel[N * KS];
    tern_rows rows = {.n = N, .pos = pos, .slot = slot, .pos_host = pos, .slot_host = slot};
    for (int r = 0; r < N; r++) /* ascending sample, some -1, one entry past pos */
        for (int c = 0; c < KS; c++) {
            int b = (int)((long)c * (pos[r] + 1) / KS);
            sel[r * KS + c] = c % 9 == 4 ? -1 : c == KS - 1 ? pos[r] + 2 : b;
        }
    double worst = 0;
    int thr_ok = 1, batch_ok = 1;
    for (int gi = 0; gi < 3; gi++) {
        gview v;
        make_view(&v, geo[gi][0], 0, geo[gi][2], 199, 0);
        int wd = geo[gi][0], dvo = geo[gi][1];
        for (int hi = 0; hi < 4; hi++)
            for (int mode = 0; mode < 2; mode++) {
                int nh = heads[hi];
                size_t nq = (size_t)N * nh * wd, no = (size_t)N * nh * dvo;
                float *q = malloc(sizeof(float) * nq), *out[NBE], *one = malloc(sizeof(float) * no);
                fill(q, nq, 1.0f);
                for (int b = 0; b < NBE; b++) {
                    out[b] = malloc(sizeof(float) * no);
                    g_fast[b]->vt->glm->attention_latent(g_fast[b], out[b], q, &rows, nh, &v.kv, dvo, 0.2f,
                                                         mode ? sel : NULL, KS);
                    for (size_t i = 0; b > 0 && i < no; i++) worst = fmax(worst, fabs(out[b][i] - out[0][i]));
                }
                thr_ok &= bits_eq(out[1], out[2], no * 4) && bits_eq(out[1], out[3], no * 4);
                for (int r = 0; r < N; r++) { /* each row alone gives the same bits */
                    tern_rows r1 = {.n = 1, .pos = pos + r, .slot = slot + r, .pos_host = pos + r, .slot_host = slot + r};
                    g_fast[2]->vt->glm->attention_latent(g_fast[2], one, q + (size_t)r * nh * wd, &r1, nh, &v.kv, dvo,
                                                         0.2f, mode ? sel + r * KS : NULL, KS);
                    batch_ok &= bits_eq(one, out[2] + (size_t)r * nh * dvo, sizeof(float) * (size_t)nh * dvo);
                }
                for (int b = 0; b < NBE; b++) free(out[b]);
                free(q);
                free(one);
            }
        free_view(&v);
    }
    CHECK(worst < 2e-5, "attention fast vs ref err %g", worst);
    CHECK(thr_ok, "attention differs across thread counts");
    CHECK(batch_ok, "attention of a row alone differs from the row in a batch");
}

/* dots_h / pv_h (16-bit keys and values read in place: BF16 / F16 KV pages, GLM's bf16 latent pages) against dots / pv
 * on the rows widened to f32, bitwise, on every ISA table: every na / nb / no, lengths around the SIMD widths, f16
 * subnormals, with and without the rescale */
TEST(glm_kern_half_rows_bitwise) {
    static const int lens[] = {1, 3, 8, 15, 16, 17, 20, 37, 64, 72, 100, 128, 200, 256, 512};
    const tern_glm_kern *tab[3] = {&tern__glm_kern_scalar, &tern__glm_kern_avx2, &tern__glm_kern_avx512};
    const char *isa[3] = {"scalar", "avx2", "avx512"};
    enum { NV = 32, L = 512 };
    float *a[4], *o0[4], *o1[4], *w[NV], p[4 * NV], corr[4] = {0.5f, 1.0f, 0.25f, 0.75f};
    uint16_t *h[NV];
    for (int i = 0; i < 4; i++) { a[i] = malloc(4 * L); o0[i] = malloc(4 * L); o1[i] = malloc(4 * L); }
    for (int c = 0; c < NV; c++) { w[c] = malloc(4 * L); h[c] = malloc(2 * L); }
    int bad = 0, cases = 0;
    for (int ti = 0; ti < 3; ti++) {
        if (ti > 0 && !kt_isa_ok(isa[ti])) continue;
        const tern_glm_kern *k = tab[ti];
        for (int bf = 0; bf < 2; bf++) {
            for (int i = 0; i < 4; i++) fill(a[i], L, 1.0f);
            for (int c = 0; c < NV; c++)
                for (int t = 0; t < L; t++) {
                    float x = test_randf(&g_seed) * (t % 23 == 5 ? 1e-6f : 2.0f); /* some f16 subnormals */
                    h[c][t] = bf ? tern_f32_to_bf16(x) : tern_f32_to_f16(x);
                    w[c][t] = bf ? tern_bf16_to_f32(h[c][t]) : tern_f16_to_f32(h[c][t]);
                }
            for (int i = 0; i < 4 * NV; i++) p[i] = test_randf(&g_seed) + 1.0f;
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                const int len = lens[li];
                for (int na = 1; na <= 4; na++)
                    for (int nb = 1; nb <= 4; nb++) {
                        float r0[16], r1[16];
                        k->dots((const float *const *)a, na, (const float *const *)w + 1, nb, len, r0, 4);
                        k->dots_h((const float *const *)a, na, (const uint16_t *const *)h + 1, nb, len, r1, 4, bf);
                        for (int i = 0; i < na; i++) bad += !bits_eq(r0 + 4 * i, r1 + 4 * i, 4 * (size_t)nb);
                        cases++;
                    }
                for (int no = 1; no <= 4; no++)
                    for (int nv = 1; nv <= NV; nv += 7)
                        for (int cr = 0; cr < 2; cr++) {
                            for (int i = 0; i < no; i++) { fill(o0[i], len, 1.0f); memcpy(o1[i], o0[i], 4 * (size_t)len); }
                            k->pv(o0, no, p, NV, (const float *const *)w, nv, len, cr ? corr : NULL);
                            k->pv_h(o1, no, p, NV, (const uint16_t *const *)h, nv, len, cr ? corr : NULL, bf);
                            for (int i = 0; i < no; i++) bad += !bits_eq(o0[i], o1[i], 4 * (size_t)len);
                            cases++;
                        }
            }
        }
        printf("  %s: %d cases\n", isa[ti], cases);
    }
    CHECK(bad == 0, "%d of %d 16-bit row cases differ from the widened f32 rows", bad, cases);
    for (int i = 0; i < 4; i++) { free(a[i]); free(o0[i]); free(o1[i]); }
    for (int c = 0; c < NV; c++) { free(w[c]); free(h[c]); }
}

/* one dsa_topk call on every backend; returns 1 when all selections (and gaps, if exact) agree */
static int topk_all(const gview *v, const float *q, const float *w, const tern_rows *rows, int nh, int k, int exact,
                    double *gap_err, int *thr_ok) {
    size_t ns = (size_t)rows->n * k;
    int32_t *sel[NBE];
    float gap[NBE];
    int ok = 1;
    for (int b = 0; b < NBE; b++) {
        sel[b] = malloc(sizeof(int32_t) * ns);
        gap[b] = NAN;
        g_fast[b]->vt->glm->dsa_topk(g_fast[b], sel[b], q, w, rows, nh, &v->kv, 0.25f, k, &gap[b]);
        if (b == 0) continue;
        ok &= bits_eq(sel[b], sel[0], ns * 4);
        if (exact) ok &= isnan(gap[b]) ? isnan(gap[0]) : gap[b] == gap[0];
        else if (!isnan(gap[0])) *gap_err = fmax(*gap_err, fabs(gap[b] - gap[0]));
    }
    *thr_ok &= isnan(gap[1]) ? isnan(gap[2]) && isnan(gap[3]) : gap[1] == gap[2] && gap[1] == gap[3];
    for (int b = 0; b < NBE; b++) free(sel[b]);
    return ok;
}

TEST(glm_fast_topk_grid) {
    static const int ks[4] = {1, 8, 32, 100};
    enum { N = 8, NI = 5, DVI = 33 };
    int32_t pos[N] = {0, 7, 8, 31, 32, 100, 101, 199}, slot[N] = {0, 1, 0, 1, 0, 1, 0, 1};
    tern_rows rows = {.n = N, .pos = pos, .slot = slot, .pos_host = pos, .slot_host = slot};
    double gap_err = 0;
    int thr_ok = 1;
    for (int ints = 0; ints < 2; ints++) {
        gview v;
        make_view(&v, 8, DVI, 8, 1500, ints);
        float q[N * NI * DVI], w[N * NI];
        for (int i = 0; i < N * NI * DVI; i++) q[i] = ints ? (float)(int)(test_rand_u64(&g_seed) % 5) - 2.0f : test_randf(&g_seed);
        for (int i = 0; i < N * NI; i++) w[i] = ints ? (float)(int)(test_rand_u64(&g_seed) % 5) - 2.0f : test_randf(&g_seed);
        for (int ki = 0; ki < 4; ki++) {
            int k = ks[ki];
            CHECK(topk_all(&v, q, w, &rows, NI, k, ints, &gap_err, &thr_ok), "dsa_topk selections differ (ints %d, k %d)", ints, k);
        }
        /* one long row alone: its keys are split over the threads */
        int32_t p1[1] = {1500}, s1[1] = {1};
        tern_rows r1 = {.n = 1, .pos = p1, .slot = s1, .pos_host = p1, .slot_host = s1};
        CHECK(topk_all(&v, q, w, &r1, NI, 64, ints, &gap_err, &thr_ok), "dsa_topk long row (ints %d)", ints);
        /* ties everywhere (zero queries) and a NaN weight: lowest positions, NaN scores last */
        float qz[N * NI * DVI], wn[N * NI];
        memset(qz, 0, sizeof qz);
        memcpy(wn, w, sizeof w);
        wn[NI * 7 + 2] = NAN;
        CHECK(topk_all(&v, qz, w, &rows, NI, 8, 1, &gap_err, &thr_ok), "dsa_topk ties (ints %d)", ints);
        CHECK(topk_all(&v, q, wn, &rows, NI, 8, ints, &gap_err, &thr_ok), "dsa_topk NaN weight (ints %d)", ints);
        free_view(&v);
    }
    CHECK(gap_err < 1e-5, "min_gap fast vs ref err %g", gap_err);
    CHECK(thr_ok, "min_gap differs across thread counts");
}

TEST(glm_fast_light_ops) {
    enum { N = 300, D = 128, NH = 3, HS = 40 };
    static float x[N * D], y[NBE][N * D], xr[NBE][N * NH * HS], cp[NBE][N * 40];
    static int32_t pos[N], slot[N];
    float w[D], b[D], inv[8];
    fill(x, N * D, 3.0f); fill(w, D, 1.0f); fill(b, D, 1.0f);
    for (int i = 0; i < 8; i++) inv[i] = powf(0.3f, (float)i);
    for (int i = 0; i < N; i++) pos[i] = i * 37 % 1000, slot[i] = i % 2;
    int ok = 1;
    for (int n = 1; n <= N; n += N - 1) { /* one row (serial) and many (pool) */
        for (int be = 0; be < NBE; be++) {
            const tern_glm_ops *go = g_fast[be]->vt->glm;
            go->layernorm(g_fast[be], y[be], x, n, D, w, b, 1e-6f);
            memcpy(xr[be], x, sizeof(float) * (size_t)n * NH * HS);
            go->rope_interleaved(g_fast[be], xr[be], n, NH, HS, 24, 16, pos, inv, 1.25f);
            ok &= bits_eq(y[be], y[0], sizeof(float) * (size_t)n * D) && bits_eq(xr[be], xr[0], sizeof(float) * (size_t)n * NH * HS);
            memset(cp[be], 0, sizeof cp[be]);
            go->copy_2d(g_fast[be], cp[be] + 3, 40, x + 1, D, n, 30);
            ok &= bits_eq(cp[be], cp[0], sizeof cp[be]);
        }
    }
    CHECK(ok, "layernorm / rope / copy_2d differ from the spec");
    /* cache writes: the same records land in the same places */
    gview v[2];
    unsigned long long sd = g_seed;
    for (int i = 0; i < 2; i++) { g_seed = sd; make_view(&v[i], 20, 12, 4, N, 0); }
    fill(x, N * D, 1.0f);
    float *vv = x + (size_t)N * 20;
    g_fast[0]->vt->glm->kv_write_latent(g_fast[0], &v[0].kv, &(tern_rows){.n = N, .pos = pos, .slot = slot}, x, vv);
    g_fast[2]->vt->glm->kv_write_latent(g_fast[2], &v[1].kv, &(tern_rows){.n = N, .pos = pos, .slot = slot}, x, vv);
    size_t nrec = (size_t)2 * v[0].kv.max_blocks * 4;
    CHECK(bits_eq(v[0].K, v[1].K, nrec * 20 * 4) && bits_eq(v[0].V, v[1].V, nrec * 12 * 4), "kv_write_latent differs");
    free_view(&v[0]);
    free_view(&v[1]);
}

TEST(glm_fast_route_grid) {
    static const int cfg[4][5] = {{64, 8, 3, 6, 100}, {16, 1, 1, 4, 2}, {2048, 16, 4, 8, 3}, {256, 1, 1, 8, 40}};
    int ok = 1;
    for (int ci = 0; ci < 4; ci++) {
        int E = cfg[ci][0], n = cfg[ci][4], k = cfg[ci][3];
        float *lg = malloc(sizeof(float) * (size_t)n * E), *bias = malloc(sizeof(float) * (size_t)E);
        fill(lg, (size_t)n * E, 3.0f);
        fill(bias, (size_t)E, 0.5f);
        if (ci == 3) memset(lg, 0, sizeof(float) * (size_t)n * E); /* ties */
        tern_route_group p = {.n_group = cfg[ci][1], .topk_group = cfg[ci][2], .norm = ci != 1, .scaling = 2.5f,
                              .bias = ci == 3 ? NULL : bias};
        int32_t *idx[NBE];
        float *wts[NBE];
        for (int b = 0; b < NBE; b++) {
            idx[b] = malloc(sizeof(int32_t) * (size_t)n * k);
            wts[b] = malloc(sizeof(float) * (size_t)n * k);
            g_fast[b]->vt->glm->route_group(g_fast[b], idx[b], wts[b], lg, n, E, k, &p);
            ok &= bits_eq(idx[b], idx[0], sizeof(int32_t) * (size_t)n * k) && bits_eq(wts[b], wts[0], sizeof(float) * (size_t)n * k);
        }
        for (int b = 0; b < NBE; b++) { free(idx[b]); free(wts[b]); }
        free(lg);
        free(bias);
    }
    CHECK(ok, "route_group differs from the spec");
}

/* matmul_heads (one pool run over every head) against the model's fallback — per head a copy of the head's x
 * slice, matmul_expert, a copy into y — bitwise, for every stored format, decode and GEMM row counts, the f32 /
 * int8 / bf16 modes; y's padding between heads is left alone. The spec table has no matmul_heads (the model loops). */
TEST(glm_fast_matmul_heads) {
    enum { NH = 5, OUT = 40, HX = 200, PAD = 3 };
    static const struct { tern_dtype dt; int bits, gs, in; } fm[] = {
        {TERN_DT_Q, 4, 64, 192}, {TERN_DT_Q, 8, 32, 96}, {TERN_DT_Q, 4, 32, 192}, {TERN_DT_BF16, 0, 0, 128},
        {TERN_DT_F32, 0, 0, 96}, {TERN_DT_Q, 8, 64, 128}};
    static const int ns[] = {1, 2, 5, 9, 20};
    CHECK(g_fast[0]->vt->glm->matmul_heads == NULL, "the spec table has matmul_heads");
    int ok = 1, runs = 0;
    for (size_t f = 0; f < TERN_ARRAY_LEN(fm); f++) {
        kt_weight w;
        kt_weight_make(&w, fm[f].dt, fm[f].bits, fm[f].gs, TERN_DT_BF16, NH, OUT, fm[f].in, 0, 77 + f);
        const int in = fm[f].in, ldx = NH * HX, hy = OUT + PAD, ldy = NH * hy;
        float *x = kt_randv((size_t)20 * ldx, 5 + f, 1.0f), *ta = malloc(sizeof(float) * 20 * in),
              *tb = malloc(sizeof(float) * 20 * OUT), *y0 = malloc(sizeof(float) * 20 * ldy), *y1 = malloc(sizeof(float) * 20 * ldy);
        for (int b = 1; b < NBE; b++) {
            tern_backend *be = g_fast[b];
            const tern_glm_ops *go = be->vt->glm;
            for (int mode = 0; mode < 3; mode++) {
                tern_backend_cpu_set_int8(be, mode == 1);
                tern_backend_cpu_set_bf16(be, mode == 2);
                for (size_t ni = 0; ni < TERN_ARRAY_LEN(ns); ni++) {
                    int n = ns[ni];
                    for (size_t i = 0; i < (size_t)n * ldy; i++) y0[i] = y1[i] = -7.0f;
                    for (int h = 0; h < NH; h++) {
                        go->copy_2d(be, ta, in, x + (size_t)h * HX, ldx, n, in);
                        be->vt->matmul_expert(be, tb, ta, n, &w.t, h);
                        go->copy_2d(be, y0 + (size_t)h * hy, ldy, tb, OUT, n, OUT);
                    }
                    go->matmul_heads(be, y1, ldy, hy, x, ldx, HX, n, NH, &w.t);
                    int same = bits_eq(y0, y1, sizeof(float) * (size_t)n * ldy);
                    if (!same) printf("  %s: format %zu mode %d n %d: matmul_heads differs from the per-head loop\n", g_fast_name[b], f, mode, n);
                    ok &= same;
                    runs++;
                }
            }
            tern_backend_cpu_set_int8(be, 0);
            tern_backend_cpu_set_bf16(be, 0);
        }
        free(x); free(ta); free(tb); free(y0); free(y1);
        kt_weight_free(&w);
    }
    CHECK(ok, "matmul_heads differs from the per-head loop");
    printf("  matmul_heads: %d cases bitwise\n", runs);
}

int main(void) {
    tern_error e = {0};
    tern_backend_opts o = {.n_threads = 2};
    if (tern_backend_cpu_ref_open(&g_be[0], &o, &e) || tern_backend_cpu_open(&g_be[1], &o, &e)) {
        printf("FAIL: glm ops: backend: %s\n", e.msg);
        return 1;
    }
    RUN(glm_copy_norm_rope);
    RUN(glm_attention_latent);
    RUN(glm_dsa_topk);
    RUN(glm_route_group);
    RUN(glm_latent_pool);
    g_fast[0] = g_be[0];
    for (int b = 1; b < NBE; b++) {
        tern_backend_opts fo = {.n_threads = b <= 3 ? b : 2};
        if (b >= 4) setenv("TERN_CPU_ISA", b == 4 ? "avx2" : "scalar", 1);
        if (tern_backend_cpu_open(&g_fast[b], &fo, &e)) { printf("FAIL: glm fast grid: %s\n", e.msg); return 1; }
        printf("  %s: kernels of isa %s\n", g_fast_name[b], tern_cpu_isa_name());
        unsetenv("TERN_CPU_ISA");
    }
    RUN(glm_kern_half_rows_bitwise);
    RUN(glm_fast_attention_grid);
    RUN(glm_fast_topk_grid);
    RUN(glm_fast_light_ops);
    RUN(glm_fast_route_grid);
    RUN(glm_fast_matmul_heads);
    for (int b = 1; b < NBE; b++) tern_backend_close(g_fast[b]);
    tern_backend_close(g_be[0]);
    tern_backend_close(g_be[1]);
    return test_done();
}
