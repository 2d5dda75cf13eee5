/* test_kern_qkv_rope.c — the fast CPU backend's norm_qkv_rope_kv for one row (cpu_decode.c: rope and the cache
 * writes inside the q|k|v run) must be bitwise rmsnorm + matmul_n + rope(q) + rope(k) + kv_write of the same backend
 * with it switched off (tern__cpu_qkv_rope_set(0)): xn, q, k, v and both whole cache pools, for BF16 / Q8 / Q4 weights,
 * exact and int8, AVX-512 and AVX2, 1-3 threads (3 on two cores runs the work stealing), several head shapes, rope
 * scales and positions (one in a block that is not resident: nothing written); the scalar table has no fused GEMV and
 * must decline, as must several rows, compressed pages and odd head widths. */
#include "backend/cpu/cpu_impl.h"
#include "test_kern_util.h"

#include <string.h>

typedef struct fmt { tern_dtype dt; int bits, gs; tern_dtype sdt; const char *name; } fmt;

static const fmt fmts[] = {
    {TERN_DT_BF16, 0, 0, 0, "bf16"},
    {TERN_DT_Q, 8, 64, TERN_DT_BF16, "q8g64"},
    {TERN_DT_Q, 4, 64, TERN_DT_BF16, "q4g64"},
};

typedef struct shape { int H, nh, nkv, d; } shape;
/* d 48 and 8: heads that straddle the driver's 64-row chunks, and chunks that hold several heads */
static const shape shapes[] = {{256, 8, 2, 32}, {512, 4, 4, 128}, {128, 8, 8, 16}, {192, 4, 2, 48}, {64, 8, 8, 8}};

typedef struct cache { tern_kv_layer kv; int32_t table[4]; float *k, *v; size_t n; } cache;

static void cache_make(cache *c, int nkv, int d) {
    c->n = (size_t)4 * 16 * nkv * d; /* 4 blocks of 16 positions */
    c->k = malloc(c->n * sizeof(float));
    c->v = malloc(c->n * sizeof(float));
    for (size_t i = 0; i < c->n; i++) c->k[i] = c->v[i] = -3.0f;
    c->table[0] = 2, c->table[1] = 0, c->table[2] = -1, c->table[3] = 1; /* positions 32..47 not resident */
    c->kv = (tern_kv_layer){.dtype = TERN_DT_F32, .n_head_kv = nkv, .head_dim = d, .block_size = 16, .k = c->k,
                            .v = c->v, .block_table = c->table, .max_blocks = 4};
}

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof *a); }

static void check_one(tern_backend *be, const fmt *f, const shape *sh, int int8, int pos, float mscale, const char *tag) {
    const int H = sh->H, nq = sh->nh * sh->d, nk = sh->nkv * sh->d;
    kt_weight w[3];
    const int outs[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) kt_weight_make(&w[i], f->dt, f->bits, f->gs, f->sdt, 1, outs[i], H, 0, 40u + (unsigned)i + (unsigned)pos);
    const tern_tensor *ws[3] = {&w[0].t, &w[1].t, &w[2].t};
    float *x = kt_randv((size_t)H, 7u + (unsigned)pos, 2.0f), *nw = kt_randv((size_t)H, 8, 1.0f);
    float *inv = malloc(sizeof(float) * (size_t)sh->d / 2);
    for (int i = 0; i < sh->d / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)sh->d);
    tern_backend_cpu_set_int8(be, int8);
    const int32_t p32 = pos, s32 = 0;
    const tern_rows rows = {.n = 1, .pos = &p32, .slot = &s32, .pos_host = &p32, .slot_host = &s32};
    cache c[2];
    float *xn[2], *q[2], *k[2], *v[2];
    for (int a = 0; a < 2; a++) {
        cache_make(&c[a], sh->nkv, sh->d);
        xn[a] = kt_randv((size_t)H, 99, 1.0f), q[a] = kt_randv((size_t)nq, 98, 1.0f);
        k[a] = kt_randv((size_t)nk, 97, 1.0f), v[a] = kt_randv((size_t)nk, 96, 1.0f);
    }
    const tern_backend_vt *op = be->vt;
    /* a: the separate ops */
    op->rmsnorm(be, xn[0], x, 1, H, nw, 1e-5f);
    float *const y0[3] = {q[0], k[0], v[0]};
    CHECK(op->matmul_n(be, 3, y0, xn[0], 1, ws), "%s %s: matmul_n not taken", tag, f->name);
    op->rope(be, q[0], 1, sh->nh, sh->d, &p32, inv, mscale);
    op->rope(be, k[0], 1, sh->nkv, sh->d, &p32, inv, mscale);
    op->kv_write(be, &c[0].kv, &rows, k[0], v[0]);
    /* b: fused */
    const int done = op->norm_qkv_rope_kv(be, xn[1], x, nw, 1e-5f, q[1], k[1], v[1], ws, &c[1].kv, &rows, sh->nh, inv, mscale);
    CHECK(done == 1, "%s %s %s H=%d nh=%d nkv=%d d=%d: not taken", tag, f->name, int8 ? "int8" : "exact", H, sh->nh, sh->nkv, sh->d);
    if (done) {
        const char *m = int8 ? "int8" : "exact";
        CHECK(same(xn[0], xn[1], (size_t)H), "%s %s %s d=%d pos %d: xn differs", tag, f->name, m, sh->d, pos);
        CHECK(same(q[0], q[1], (size_t)nq), "%s %s %s d=%d pos %d: q differs", tag, f->name, m, sh->d, pos);
        CHECK(same(k[0], k[1], (size_t)nk), "%s %s %s d=%d pos %d: k differs", tag, f->name, m, sh->d, pos);
        CHECK(same(v[0], v[1], (size_t)nk), "%s %s %s d=%d pos %d: v differs", tag, f->name, m, sh->d, pos);
        CHECK(same(c[0].k, c[1].k, c[0].n) && same(c[0].v, c[1].v, c[0].n), "%s %s %s d=%d pos %d: cache differs", tag,
              f->name, m, sh->d, pos);
    }
    for (int a = 0; a < 2; a++) { free(c[a].k); free(c[a].v); free(xn[a]); free(q[a]); free(k[a]); free(v[a]); }
    for (int i = 0; i < 3; i++) kt_weight_free(&w[i]);
    free(x); free(nw); free(inv);
}

static void bitwise_on(tern_backend *be, const char *tag, int nth) {
    static const int poss[] = {0, 5, 17, 40, 63}; /* 40: a block that is not resident */
    (void)nth;
    for (size_t fi = 0; fi < TERN_ARRAY_LEN(fmts); fi++)
        for (int int8 = 0; int8 <= (fmts[fi].dt == TERN_DT_Q); int8++)
            for (size_t si = 0; si < TERN_ARRAY_LEN(shapes); si++)
                for (size_t pi = 0; pi < TERN_ARRAY_LEN(poss); pi++) {
                    tern__cpu_qkv_rope_set(0);
                    tern__cpu_qkv_rope_set(1);
                    check_one(be, &fmts[fi], &shapes[si], int8, poss[pi], pi % 2 ? 1.0f : 1.25f, tag);
                }
}

TEST(norm_qkv_rope_kv_bitwise) { kt_each_cpu(bitwise_on); }

TEST(norm_qkv_rope_kv_declines) {
    const shape sh = {256, 8, 2, 32};
    kt_weight w[3];
    const int outs[3] = {sh.nh * sh.d, sh.nkv * sh.d, sh.nkv * sh.d};
    for (int i = 0; i < 3; i++) kt_weight_make(&w[i], TERN_DT_BF16, 0, 0, 0, 1, outs[i], sh.H, 0, 5u + (unsigned)i);
    const tern_tensor *ws[3] = {&w[0].t, &w[1].t, &w[2].t};
    float *x = kt_randv((size_t)sh.H * 2, 1, 1.0f), *xn = kt_randv((size_t)sh.H * 2, 2, 1.0f);
    float *q = kt_randv((size_t)outs[0] * 2, 3, 1.0f), *k = kt_randv((size_t)outs[1] * 2, 4, 1.0f), *v = kt_randv((size_t)outs[1] * 2, 5, 1.0f);
    float *q0 = malloc(sizeof(float) * (size_t)outs[0] * 2), inv[16];
    memcpy(q0, q, sizeof(float) * (size_t)outs[0] * 2);
    for (int i = 0; i < 16; i++) inv[i] = 0.1f * (float)i;
    cache c;
    cache_make(&c, sh.nkv, sh.d);
    int32_t pos[2] = {3, 4}, slot[2] = {0, 0};
    tern_rows r1 = {.n = 1, .pos = pos, .slot = slot, .pos_host = pos, .slot_host = slot}, r2 = r1;
    r2.n = 2;
    if (kt_isa_ok("scalar")) {
        tern_backend *be = kt_open_cpu("scalar", 2);
        CHECK(be && be->vt->norm_qkv_rope_kv(be, xn, x, NULL, 1e-5f, q, k, v, ws, &c.kv, &r1, sh.nh, inv, 1.0f) == 0,
              "scalar: taken without a fused GEMV");
        tern_backend_close(be);
    }
    const char *isa = kt_isa_ok("avx512") ? "avx512" : kt_isa_ok("avx2") ? "avx2" : NULL;
    if (isa) {
        tern_backend *be = kt_open_cpu(isa, 2);
        CHECK(be && be->vt->norm_qkv_rope_kv(be, xn, x, NULL, 1e-5f, q, k, v, ws, &c.kv, &r2, sh.nh, inv, 1.0f) == 0,
              "%s: two rows taken", isa);
        c.kv.kf.kind = TERN_KV_BF16;
        CHECK(be && be->vt->norm_qkv_rope_kv(be, xn, x, NULL, 1e-5f, q, k, v, ws, &c.kv, &r1, sh.nh, inv, 1.0f) == 0,
              "%s: bf16 pages taken", isa);
        c.kv.kf.kind = TERN_KV_F32;
        c.kv.head_dim = 7; /* an odd head width (no rope pairs) */
        CHECK(be && be->vt->norm_qkv_rope_kv(be, xn, x, NULL, 1e-5f, q, k, v, ws, &c.kv, &r1, sh.nh, inv, 1.0f) == 0,
              "%s: heads of 7 taken", isa);
        c.kv.head_dim = sh.d, c.kv.n_head_kv = sh.nkv;
        tern__cpu_qkv_rope_set(0);
        CHECK(be && be->vt->norm_qkv_rope_kv(be, xn, x, NULL, 1e-5f, q, k, v, ws, &c.kv, &r1, sh.nh, inv, 1.0f) == 0,
              "%s: taken while switched off", isa);
        tern__cpu_qkv_rope_set(-1);
        CHECK(!memcmp(q, q0, sizeof(float) * (size_t)outs[0] * 2), "%s: a declined call wrote q", isa);
        tern_backend_close(be);
    }
    for (int i = 0; i < 3; i++) kt_weight_free(&w[i]);
    free(x); free(xn); free(q); free(k); free(v); free(q0); free(c.k); free(c.v);
}

int main(void) {
    RUN(norm_qkv_rope_kv_bitwise);
    RUN(norm_qkv_rope_kv_declines);
    return test_done();
}
