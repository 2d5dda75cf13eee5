/* test_kern_ops.c — fast CPU backend vs the scalar reference for attention (paged, windows,
 * GQA, head dims 64..512, softcap, prefill chunks), kv_write, rope, rmsnorm, elementwise,
 * route_topk (ties) and moe_mlp (also vs a direct sum); and the thread pool. */
#include "base/pool.h"
#include "test_kern_util.h"

#include <stdatomic.h>

/* A paged cache for n_slots sequences of up to max_pos positions, with block ids shuffled
 * and blocks outside every window marked -1 (and poisoned with NaN in the pools). */
typedef struct kt_cache {
    tern_kv_layer kv;
    int32_t *table;
    float *k, *v;
} kt_cache;

static void cache_make(kt_cache *c, int n_slots, int max_pos, int nkv, int hd, int bs, int window, unsigned long long seed) {
    int mb = (max_pos + bs - 1) / bs, nblk = n_slots * mb;
    c->table = malloc(sizeof(int32_t) * (size_t)nblk);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)nblk);
    unsigned long long s = seed;
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) { int j = (int)(test_rand_u64(&s) % (unsigned)(i + 1)); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int i = 0; i < nblk; i++) c->table[i] = perm[i];
    size_t n = (size_t)nblk * bs * nkv * hd;
    c->k = malloc(n * sizeof(float));
    c->v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) c->k[i] = c->v[i] = NAN; /* never-written slots must not be read */
    c->kv = (tern_kv_layer){.dtype = TERN_DT_F32, .n_head_kv = nkv, .head_dim = hd, .block_size = bs, .window = window,
                            .k = c->k, .v = c->v, .block_table = c->table, .max_blocks = mb};
    free(perm);
}

static void cache_free(kt_cache *c) { free(c->table); free(c->k); free(c->v); }

/* Write positions [p0, p1) of slot s through backend be (k/v rows random). */
static void cache_fill(tern_backend *be, kt_cache *c, int s, int p0, int p1, unsigned long long seed) {
    int n = p1 - p0, w = c->kv.n_head_kv * c->kv.head_dim;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *slot = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) { pos[i] = p0 + i; slot[i] = s; }
    float *k = kt_randv((size_t)n * w, seed, 1.0f), *v = kt_randv((size_t)n * w, seed + 5, 1.0f);
    tern_rows rows = {n, pos, slot, pos, slot};
    be->vt->kv_write(be, &c->kv, &rows, k, v);
    free(pos); free(slot); free(k); free(v);
}

static double attn_case(tern_backend *fast, tern_backend *ref, int nh, int nkv, int hd, int bs, int window,
                        float softcap, unsigned long long seed) {
    /* 2 slots: slot 0 holds 0..40 and decodes one row at 40; slot 1 prefills a chunk 13..29 */
    kt_cache c;
    cache_make(&c, 2, 48, nkv, hd, bs, window, seed);
    cache_fill(ref, &c, 0, 0, 41, seed + 1);
    cache_fill(fast, &c, 1, 0, 30, seed + 2);
    if (window > 0) { /* drop blocks that fell fully out of slot 0's window: never read */
        for (int b = 0; b < c.kv.max_blocks; b++)
            if ((b + 1) * bs - 1 <= 40 - window) c.table[b] = -1;
    }
    int n = 1 + 17;
    int32_t pos[18], slot[18];
    pos[0] = 40; slot[0] = 0;
    for (int i = 1; i < n; i++) { pos[i] = 12 + i; slot[i] = 1; }
    tern_rows rows = {n, pos, slot, pos, slot};
    float *q = kt_randv((size_t)n * nh * hd, seed + 3, 1.0f);
    float *o0 = calloc((size_t)n * nh * hd, sizeof(float)), *o1 = calloc((size_t)n * nh * hd, sizeof(float));
    float scale = 1.0f / sqrtf((float)hd) * 2.0f;
    ref->vt->attention(ref, o0, q, &rows, nh, &c.kv, scale, softcap);
    fast->vt->attention(fast, o1, q, &rows, nh, &c.kv, scale, softcap);
    double err = test_rel_l2(o1, o0, (size_t)n * nh * hd);
    for (size_t i = 0; i < (size_t)n * nh * hd; i++) if (isnan(o0[i])) { err = NAN; break; }
    free(q); free(o0); free(o1);
    cache_free(&c);
    return err;
}

TEST(attention_grid) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    static const int hds[] = {64, 128, 256, 512};
    static const int gqa[][2] = {{4, 4}, {8, 2}, {6, 1}};
    static const int wins[] = {0, 1, 7, 16};
    unsigned long long seed = 1;
    for (size_t h = 0; h < TERN_ARRAY_LEN(hds); h++)
        for (size_t g = 0; g < TERN_ARRAY_LEN(gqa); g++)
            for (size_t w = 0; w < TERN_ARRAY_LEN(wins); w++) {
                int bs = (int)(seed % 3 == 0 ? 16 : seed % 3 == 1 ? 4 : 5);
                float cap = seed % 2 ? 0.0f : 30.0f;
                double err = attn_case(fast, ref, gqa[g][0], gqa[g][1], hds[h], bs, wins[w], cap, seed++);
                CHECK(err <= 2e-6, "hd=%d nh=%d nkv=%d win=%d bs=%d cap=%g: rel err %.3g", hds[h], gqa[g][0], gqa[g][1], wins[w], bs, cap, err);
            }
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(attention_avx2_and_scalar) {
    tern_backend *ref = kt_open_ref();
    for (int i = 0; i < 2; i++) {
        tern_backend *fast = kt_open_cpu(i ? "avx2" : "scalar", 2);
        for (int cap = 0; cap < 2; cap++) { /* with a softcap and without (AVX2: the tile's softmax in 8 lanes) */
            double err = attn_case(fast, ref, 8, 2, 128, 4, 9, cap ? 50.0f : 0.0f, 77 + i);
            CHECK(err <= 2e-6, "%s cap %d rel err %.3g", i ? "avx2" : "scalar", cap, err);
            err = attn_case(fast, ref, 32, 8, 64, 16, 0, cap ? 30.0f : 0.0f, 90 + i);
            CHECK(err <= 2e-6, "%s cap %d (32/8 heads d 64) rel err %.3g", i ? "avx2" : "scalar", cap, err);
        }
        tern_backend_close(fast);
    }
    tern_backend_close(ref);
}

TEST(attention_single_key_is_v) { /* pos 0: softmax over one key = that V row exactly */
    tern_backend *fast = kt_open_cpu("avx512", 1);
    kt_cache c;
    cache_make(&c, 1, 8, 1, 64, 4, 0, 3);
    cache_fill(fast, &c, 0, 0, 1, 9);
    int32_t pos[1] = {0}, slot[1] = {0};
    tern_rows rows = {1, pos, slot, pos, slot};
    float q[64], o[64];
    for (int i = 0; i < 64; i++) q[i] = 0.3f;
    fast->vt->attention(fast, o, q, &rows, 1, &c.kv, 0.125f, 0.0f);
    const float *v0 = c.v + (size_t)c.table[0] * 4 * 64;
    CHECK(!memcmp(o, v0, sizeof o), "output != v");
    cache_free(&c);
    tern_backend_close(fast);
}

/* The tiled attention shares key tiles between rows of one sequence (row blocks) and aligns tiles to key
 * positions: a row's output must be bitwise the same in the whole batch, alone, and in batches cut elsewhere —
 * windows, GQA groups of 1/4/6/8, head dims 64-512, softcap, page sizes 5 and 16, a decode row of another slot
 * in front, and a span row (bidirectional keys) inside the chunk. */
static void rows_bitwise_on(tern_backend *be, const char *tag, int nth) {
    static const int shp[][3] = {{32, 8, 64}, {8, 1, 256}, {6, 1, 128}, {4, 4, 64}, {8, 2, 512}};
    static const int wins[] = {0, 7, 40};
    unsigned long long seed = 500 + (unsigned)nth;
    for (size_t h = 0; h < TERN_ARRAY_LEN(shp); h++)
        for (size_t w = 0; w < TERN_ARRAY_LEN(wins); w++) {
            const int nh = shp[h][0], nkv = shp[h][1], hd = shp[h][2], bs = (h + w) % 2 ? 5 : 16;
            kt_cache c;
            cache_make(&c, 2, 96, nkv, hd, bs, wins[w], seed);
            cache_fill(be, &c, 0, 0, 71, seed + 1);
            cache_fill(be, &c, 1, 0, 60, seed + 2);
            enum { N = 1 + 47 };
            int32_t pos[N], slot[N], vlo[N], vhi[N];
            pos[0] = 70; slot[0] = 0;
            for (int i = 1; i < N; i++) { pos[i] = 12 + i; slot[i] = 1; }
            for (int i = 0; i < N; i++) { vlo[i] = pos[i]; vhi[i] = pos[i]; }
            vlo[20] = 29; vhi[20] = 35; /* row 20 (pos 32) also sees 33..35, and 29..31 below its window */
            const size_t rw = (size_t)nh * hd;
            float *q = kt_randv(N * rw, seed + 3, 1.0f), *all = malloc(sizeof(float) * N * rw), *one = malloc(sizeof(float) * N * rw);
            const float cap = w == 1 ? 20.0f : 0.0f, scale = 1.0f / sqrtf((float)hd);
            for (int spans = 0; spans < 2; spans++) {
                tern_rows rows = {N, pos, slot, pos, slot};
                if (spans) { rows.vis_lo = rows.vis_lo_host = vlo; rows.vis_hi = rows.vis_hi_host = vhi; }
                be->vt->attention(be, all, q, &rows, nh, &c.kv, scale, cap);
                for (int cut = 1; cut <= 5; cut += 2) /* batches of 1, 3, 5 rows */
                    for (int r = 0; r < N; r += cut) {
                        const int n = TERN_MIN(cut, N - r);
                        tern_rows sub = {n, pos + r, slot + r, pos + r, slot + r};
                        if (spans) { sub.vis_lo = sub.vis_lo_host = vlo + r; sub.vis_hi = sub.vis_hi_host = vhi + r; }
                        be->vt->attention(be, one + r * rw, q + r * rw, &sub, nh, &c.kv, scale, cap);
                    }
                CHECK(!memcmp(all, one, sizeof(float) * N * rw), "%s nh=%d nkv=%d d=%d win=%d bs=%d spans=%d: rows differ in a batch",
                      tag, nh, nkv, hd, wins[w], bs, spans);
            }
            free(q); free(all); free(one);
            cache_free(&c);
            seed += 10;
        }
}

TEST(attention_rows_bitwise_any_batch) { kt_each_cpu(rows_bitwise_on); }

TEST(rope_rmsnorm_elementwise) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    int n = 5, nh = 3, d = 128, N = n * nh * d;
    float *a = kt_randv((size_t)N, 1, 2.0f), *b = kt_randv((size_t)N, 2, 2.0f), *w = kt_randv((size_t)d, 3, 1.0f);
    float *y0 = malloc(sizeof(float) * (size_t)N), *y1 = malloc(sizeof(float) * (size_t)N);
    int32_t pos[5] = {0, 1, 17, 1000, 40000};
    float inv[64];
    for (int i = 0; i < 64; i++) inv[i] = i < 60 ? powf(10000.0f, -(float)i / 64.0f) : 0.0f;
#define SAME(what) CHECK(test_rel_l2(y1, y0, (size_t)N) <= 1e-6, "%s: %.3g", what, test_rel_l2(y1, y0, (size_t)N))
    memcpy(y0, a, sizeof(float) * N); memcpy(y1, a, sizeof(float) * N);
    ref->vt->rope(ref, y0, n, nh, d, pos, inv, 1.25f); fast->vt->rope(fast, y1, n, nh, d, pos, inv, 1.25f); SAME("rope");
    ref->vt->rmsnorm(ref, y0, a, n * nh, d, w, 1e-6f); fast->vt->rmsnorm(fast, y1, a, n * nh, d, w, 1e-6f); SAME("rmsnorm");
    ref->vt->rmsnorm(ref, y0, a, n * nh, d, NULL, 1e-6f); fast->vt->rmsnorm(fast, y1, a, n * nh, d, NULL, 1e-6f); SAME("rmsnorm no w");
    memcpy(y1, a, sizeof(float) * N);
    fast->vt->rmsnorm(fast, y1, y1, n * nh, d, w, 1e-6f); ref->vt->rmsnorm(ref, y0, a, n * nh, d, w, 1e-6f); SAME("rmsnorm in place");
    ref->vt->add(ref, y0, a, b, N); fast->vt->add(fast, y1, a, b, N); SAME("add");
    ref->vt->mul(ref, y0, a, b, N); fast->vt->mul(fast, y1, a, b, N); SAME("mul");
    ref->vt->gelu_tanh_mul(ref, y0, a, b, N); fast->vt->gelu_tanh_mul(fast, y1, a, b, N); SAME("gelu");
    ref->vt->gelu_tanh_mul(ref, y0, a, NULL, N); fast->vt->gelu_tanh_mul(fast, y1, a, NULL, N); SAME("gelu1");
    ref->vt->silu_mul(ref, y0, a, b, N); fast->vt->silu_mul(fast, y1, a, b, N); SAME("silu");
    memcpy(y0, a, sizeof(float) * N); memcpy(y1, a, sizeof(float) * N);
    ref->vt->softcap(ref, y0, N, 3.0f); fast->vt->softcap(fast, y1, N, 3.0f); SAME("softcap");
    ref->vt->add_bias(ref, y0, w, n * nh, d); fast->vt->add_bias(fast, y1, w, n * nh, d); SAME("add_bias");
    ref->vt->copy_cols(ref, y0, a, 6, 50, 200, 13); fast->vt->copy_cols(fast, y1, a, 6, 50, 200, 13);
    CHECK(!memcmp(y0, y1, sizeof(float) * 300), "copy_cols");
    CHECK(fabsf(y1[0] - a[13]) == 0.0f && y1[50] == a[213], "copy_cols layout");
    free(a); free(b); free(w); free(y0); free(y1);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(route_topk_ties_and_scale) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    float logits[2 * 6] = {1, 3, 3, 0, 3, -1, /* row 1: */ 0, 0, 0, 0, 0, 0};
    float pes[6] = {1, 2, 3, 4, 5, 6};
    int32_t idx[2][3];
    float wts[2][3];
    for (int b = 0; b < 2; b++) {
        tern_backend *be = b ? fast : ref;
        be->vt->route_topk(be, &idx[0][0], &wts[0][0], logits, 2, 6, 3, TERN_ROUTE_SOFTMAX_TOPK, NULL);
        CHECK(idx[0][0] == 1 && idx[0][1] == 2 && idx[0][2] == 4, "row0 %d %d %d", idx[0][0], idx[0][1], idx[0][2]);
        CHECK(idx[1][0] == 0 && idx[1][1] == 1 && idx[1][2] == 2, "row1 %d %d %d", idx[1][0], idx[1][1], idx[1][2]);
        CHECK(fabsf(wts[0][0] - 1.0f / 3) < 1e-6f && fabsf(wts[1][2] - 1.0f / 3) < 1e-6f, "renorm %g", wts[0][0]);
        be->vt->route_topk(be, &idx[0][0], &wts[0][0], logits, 2, 6, 3, TERN_ROUTE_SOFTMAX_TOPK, pes);
        CHECK(fabsf(wts[0][2] - 5.0f / 3) < 1e-6f, "per_expert_scale %g", wts[0][2]);
    }
    /* a near-tie resolved by probability, not index */
    float l2[4] = {0.5f, 0.5f + 1e-6f, -2, -3};
    fast->vt->route_topk(fast, &idx[0][0], &wts[0][0], l2, 1, 4, 1, TERN_ROUTE_SOFTMAX_TOPK, NULL);
    CHECK(idx[0][0] == 1 && wts[0][0] == 1.0f, "near tie %d %g", idx[0][0], wts[0][0]);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

static void moe_case(const char *isa, tern_dtype dt, int bits, int act, int n, unsigned long long seed) {
    tern_backend *fast = kt_open_cpu(isa, 2), *ref = kt_open_ref();
    int E = 6, H = 64, I = 96, k = 3;
    kt_weight gu, dn; /* gate and up as views into one fused [E, 2I, H] stack, like HF */
    kt_weight_make(&gu, dt, bits, 32, TERN_DT_BF16, E, 2 * I, H, 0, seed);
    kt_weight_make(&dn, dt, bits, 32, TERN_DT_BF16, E, H, I, 0, seed + 1);
    tern_tensor gate = gu.t, up = gu.t;
    size_t rb = tern_tensor_row_bytes(&gu.t);
    gate.shape[1] = up.shape[1] = I;
    gate.mat_stride = up.mat_stride = (size_t)2 * I * rb;
    up.data = (const uint8_t *)gu.t.data + (size_t)I * rb;
    if (dt == TERN_DT_Q) {
        size_t srb = (size_t)(H / 32) * 2;
        gate.mat_stride_s = up.mat_stride_s = (size_t)2 * I * srb;
        up.scales = (const uint8_t *)gu.t.scales + (size_t)I * srb;
        up.biases = (const uint8_t *)gu.t.biases + (size_t)I * srb;
    }
    float *x = kt_randv((size_t)n * H, seed + 2, 1.0f), *logits = kt_randv((size_t)n * E, seed + 3, 3.0f);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)n * k);
    float *wts = malloc(sizeof(float) * (size_t)n * k), *scratch = malloc(sizeof(float) * (size_t)n * k * 2 * I);
    float *y0 = malloc(sizeof(float) * (size_t)n * H), *y1 = malloc(sizeof(float) * (size_t)n * H), *y2 = calloc((size_t)n * H, sizeof(float));
    ref->vt->route_topk(ref, idx, wts, logits, n, E, k, TERN_ROUTE_SOFTMAX_TOPK, NULL);
    ref->vt->moe_mlp(ref, y0, x, n, H, idx, wts, k, &gate, &up, &dn.t, act, scratch);
    fast->vt->moe_mlp(fast, y1, x, n, H, idx, wts, k, &gate, &up, &dn.t, act, scratch);
    /* direct sum with the reference ops */
    float g[96], u[96], o[64];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int e = idx[r * k + j];
            ref->vt->matmul_expert(ref, g, x + (size_t)r * H, 1, &gate, e);
            ref->vt->matmul_expert(ref, u, x + (size_t)r * H, 1, &up, e);
            if (act == TERN_ACT_SILU) ref->vt->silu_mul(ref, g, g, u, (size_t)I);
            else ref->vt->gelu_tanh_mul(ref, g, g, u, (size_t)I);
            ref->vt->matmul_expert(ref, o, g, 1, &dn.t, e);
            for (int i = 0; i < H; i++) y2[(size_t)r * H + i] += wts[r * k + j] * o[i];
        }
    double e1 = test_rel_l2(y1, y0, (size_t)n * H), e2 = test_rel_l2(y0, y2, (size_t)n * H);
    CHECK(e1 <= 3e-6 && e2 <= 1e-6, "%s %s n=%d: fast vs ref %.3g, ref vs direct %.3g", isa, tern_dtype_name(dt), n, e1, e2);
    free(x); free(logits); free(idx); free(wts); free(scratch); free(y0); free(y1); free(y2);
    kt_weight_free(&gu); kt_weight_free(&dn);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(moe_mlp_vs_ref_and_direct) {
    moe_case("avx512", TERN_DT_Q, 4, TERN_ACT_GELU_TANH, 1, 1);
    moe_case("avx512", TERN_DT_Q, 8, TERN_ACT_SILU, 7, 2);
    moe_case("avx2", TERN_DT_BF16, 0, TERN_ACT_GELU_TANH, 13, 3);
    moe_case("scalar", TERN_DT_F32, 0, TERN_ACT_SILU, 3, 4);
}

static void pool_add(void *ctx, int ith, int nth) {
    atomic_int *c = ctx;
    atomic_fetch_add(&c[ith], 1);
    atomic_fetch_add(&c[64], nth);
}

TEST(pool_runs_every_thread_each_time) {
    for (int nt = 1; nt <= 4; nt++) {
        tern_pool *p = tern_pool_create(nt);
        atomic_int c[65] = {0};
        for (int it = 0; it < 2000; it++) tern_pool_run(p, pool_add, c);
        for (int i = 0; i < nt; i++) CHECK(atomic_load(&c[i]) == 2000, "nt=%d thread %d ran %d", nt, i, atomic_load(&c[i]));
        CHECK(atomic_load(&c[64]) == 2000 * nt * nt, "nth seen %d", atomic_load(&c[64]));
        tern_pool_free(p);
    }
    tern_pool_free(NULL);
    atomic_int c[65] = {0};
    tern_pool_run(NULL, pool_add, c);
    CHECK(atomic_load(&c[0]) == 1, "NULL pool runs inline");
}

/* The fast backend's vector tanh / exp (kern_avx512.c vtanh, vexp: softcap, gelu_tanh_mul, silu_mul) against libm, element by
 * element: every x in [-20, 20] on a 1e-4 grid, tiny and denormal values, ±0, ±inf and NaN. */
TEST(vector_tanh_vs_tanhf) {
    tern_backend *fast = kt_open_cpu("avx512", 2), *ref = kt_open_ref();
    const int G = 400001, T = 16, N = G + T;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *g0 = malloc(sizeof(float) * N),
          *g1 = malloc(sizeof(float) * N);
    for (int i = 0; i < G; i++) x[i] = -20.0f + 1e-4f * (float)i;
    const float tail[16] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, 1e-10f, -1e-5f, 0.5499999f, 0.55f, 0.5500001f,
                            9.0f, 9.5f, INFINITY, -INFINITY, NAN, 3e38f};
    memcpy(x + G, tail, sizeof tail);
    memcpy(y, x, sizeof(float) * N);
    fast->vt->softcap(fast, y, (size_t)N, 1.0f);
    double worst = 0;
    int wi = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        float want = tanhf(x[i]);
        if (isnan(want)) { bad += !isnan(y[i]); continue; }
        double err = fabs((double)y[i] - want) / fmax(fabs((double)want), 1e-37);
        if (err > worst) worst = err, wi = i;
    }
    printf("  vector tanh: worst rel error %.3g at x = %.9g (%.9g vs tanhf %.9g)\n", worst, x[wi], y[wi], tanhf(x[wi]));
    CHECK(worst <= 3e-7 && !bad, "tanh: rel error %.3g at %.9g, %d NaN lost", worst, x[wi], bad);
    CHECK(y[G + 12] == 1.0f && y[G + 13] == -1.0f && y[G + 0] == 0.0f && signbit(y[G + 1]), "tanh: inf / zero lanes");
    ref->vt->gelu_tanh_mul(ref, g0, x, NULL, (size_t)N);
    fast->vt->gelu_tanh_mul(fast, g1, x, NULL, (size_t)N);
    double gw = 0;
    for (int i = 0; i < N; i++)
        if (!isnan(g0[i]) && isfinite(x[i])) gw = fmax(gw, fabs((double)g1[i] - g0[i]) / fmax(fabs((double)x[i]), 1e-37));
    /* relative to |x|: for x << 0 both compute 1 + tanh(z) with tanh(z) near -1, so an ulp of tanh is a large part of
     * a tiny result there (the reference formula's own cancellation), but never more than ulps of x's scale */
    printf("  vector gelu_tanh: worst |error| / |x| %.3g\n", gw);
    CHECK(gw <= 3e-7, "gelu_tanh: %.3g", gw);
    /* silu through the vector exp: relative to |x| as well (x / (1 + e^-x) vanishes for x << 0); NaN kept */
    ref->vt->silu_mul(ref, g0, x, NULL, (size_t)N);
    fast->vt->silu_mul(fast, g1, x, NULL, (size_t)N);
    double sw = 0;
    int snan = 0;
    for (int i = 0; i < N; i++) {
        if (isnan(x[i])) { snan += !isnan(g1[i]); continue; }
        if (isfinite(x[i])) sw = fmax(sw, fabs((double)g1[i] - g0[i]) / fmax(fabs((double)x[i]), 1e-37));
    }
    printf("  vector silu: worst |error| / |x| %.3g\n", sw);
    CHECK(sw <= 3e-7 && !snan, "silu: %.3g, %d NaN lost", sw, snan);
    CHECK(g1[G + 12] == INFINITY, "silu: +inf -> %g", g1[G + 12]); /* -inf: libm's formula gives NaN, ours -inf */
    free(x); free(y); free(g0); free(g1);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

int main(void) {
    RUN(attention_grid);
    RUN(attention_avx2_and_scalar);
    RUN(attention_single_key_is_v);
    RUN(attention_rows_bitwise_any_batch);
    RUN(rope_rmsnorm_elementwise);
    RUN(route_topk_ties_and_scale);
    RUN(moe_mlp_vs_ref_and_direct);
    RUN(pool_runs_every_thread_each_time);
    if (kt_isa_ok("avx512")) RUN(vector_tanh_vs_tanhf);
    else SKIP("vector_tanh_vs_tanhf", "CPU lacks AVX-512");
    return test_done();
}
