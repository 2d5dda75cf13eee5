/*
 * test_kern_kvq.c — compressed KV pages (ops/kvq.h): the codec, and kv_write + attention of
 * both CPU backends for every kind (f16, bf16, affine q8/q4 at groups 32/64, TurboQuant 2..4
 * bits with K and V bits chosen separately), GQA and MHA, head_dim 64/80/128/256 (80 pads the
 * rotation to 128), windows with freed blocks, softcap, two slots, block tables shuffled.
 *
 * Oracles and bounds:
 *   - the Lloyd–Max tables are re-derived here by Lloyd iteration (|Δ| <= 1e-5);
 *   - R is orthogonal: unrotate(rotate(x)) = x within 1e-6 relative;
 *   - codec: f16/bf16 relative error <= 2^-11 / 2^-8 per element; affine per element
 *     <= scale/2 + |min|·2^-11 (+1 ulp); TurboQuant mean relative MSE within 1.25x of the
 *     Lloyd–Max MSE of its bit width (D = 128);
 *   - both backends write identical bytes; the reference attention over compressed pages is
 *     BITWISE the f32 reference attention over the decoded ("dequantized") cache; the fast
 *     kernel is within 2e-6 relative of it and bitwise the same for 1 and 2 threads;
 *   - error versus attention over the exact f32 K/V (printed per kind) stays under a
 *     stated bound per kind (these are loose: random data, not a quality measurement —
 *     bench/bench_kvq.c measures quality on models).
 */
#include "backend/cpu/cpu.h"
#include "ops/kvq.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static tern_backend *REF, *FAST, *FAST1;

/* ---- codec ---- */

static double phi(double x) { return exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double Phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

TEST(codebook_is_lloyd_max) {
    for (int b = 1; b <= 4; b++) {
        int n = 1 << b;
        double c[16], t[17];
        for (int i = 0; i < n; i++) c[i] = -3.0 + 6.0 * (i + 0.5) / n;
        for (int it = 0; it < 20000; it++) {
            for (int i = 1; i < n; i++) t[i] = 0.5 * (c[i - 1] + c[i]);
            for (int i = 0; i < n; i++) {
                double pa = i ? phi(t[i]) : 0, pb = i < n - 1 ? phi(t[i + 1]) : 0;
                double Pa = i ? Phi(t[i]) : 0, Pb = i < n - 1 ? Phi(t[i + 1]) : 1;
                c[i] = (pa - pb) / (Pb - Pa);
            }
        }
        const float *cb = tern_kvq_codebook(b);
        for (int i = 0; i < n; i++) CHECK(fabs(cb[i] - c[i]) < 1e-5, "bits %d level %d: %g vs %g", b, i, cb[i], c[i]);
    }
    CHECK(!tern_kvq_codebook(5), "5-bit codebook should not exist");
}

TEST(rotation_is_orthogonal) {
    unsigned long long s = 7;
    float sg[256], x[200], y[256], z[200];
    int dims[3] = {8, 80, 200};
    for (int t = 0; t < 3; t++) {
        int d = dims[t], P = tern_kvq_rot_dim(d);
        tern_kvq_signs(99 + t, sg, P);
        double nx = 0, ny = 0;
        for (int i = 0; i < d; i++) { x[i] = test_randf(&s); nx += (double)x[i] * x[i]; }
        tern_kvq_rotate(sg, P, x, d, y);
        for (int i = 0; i < P; i++) ny += (double)y[i] * y[i];
        CHECK(fabs(nx - ny) < 1e-5 * nx, "d=%d norm %g vs %g", d, nx, ny);
        tern_kvq_unrotate(sg, P, y, z, d);
        CHECK(test_rel_l2(z, x, (size_t)d) < 1e-6, "d=%d round trip %g", d, test_rel_l2(z, x, (size_t)d));
    }
    CHECK(tern_kvq_rot_dim(128) == 128 && tern_kvq_rot_dim(129) == 256 && tern_kvq_rot_dim(3) == 8, "rot_dim");
}

/* Key-like data: per-channel offsets, a few large outlier channels. */
static void keylike(float *x, int d, unsigned long long *s) {
    for (int i = 0; i < d; i++) x[i] = test_randf(s) * (i % 13 == 0 ? 6.0f : 1.0f) + 0.3f * (float)((i * 7) % 5 - 2);
}

TEST(codec_bounds) {
    unsigned long long s = 11;
    float x[256], y[256], scratch[TERN_KVQ_MAX_ROT], sg[256];
    uint8_t rec[2048];
    tern_kvq_signs(5, sg, 256);
    int d = 128;
    tern_kv_fmt fl[3] = {{TERN_KV_F16, 0, 0}, {TERN_KV_BF16, 0, 0}, {TERN_KV_F32, 0, 0}};
    double tol[3] = {1.0 / 2048, 1.0 / 256, 0};
    for (int k = 0; k < 3; k++)
        for (int rep = 0; rep < 20; rep++) {
            keylike(x, d, &s);
            tern_kvq_encode(&fl[k], d, NULL, x, rec, scratch);
            tern_kvq_decode(&fl[k], d, NULL, rec, y, scratch);
            for (int i = 0; i < d; i++) CHECK(fabs(y[i] - x[i]) <= tol[k] * fabs(x[i]) + 1e-30, "kind %d elem %d", k, i);
        }
    for (int bits = 4; bits <= 8; bits += 4)
        for (int g = 32; g <= 64; g *= 2) {
            tern_kv_fmt f = {TERN_KV_AFFINE, bits, g};
            CHECK(tern_kvq_vec_bytes(&f, d) == (size_t)(d / g * 4 + d * bits / 8), "bytes");
            double worst = 0;
            for (int rep = 0; rep < 50; rep++) {
                keylike(x, d, &s);
                tern_kvq_encode(&f, d, NULL, x, rec, scratch);
                tern_kvq_decode(&f, d, NULL, rec, y, scratch);
                for (int gi = 0; gi < d / g; gi++) {
                    float mn = x[gi * g], mx = mn;
                    for (int i = 0; i < g; i++) { mn = fminf(mn, x[gi * g + i]); mx = fmaxf(mx, x[gi * g + i]); }
                    double sc = (mx - mn) / ((1 << bits) - 1) * (1 + 1.0 / 1024);
                    double bound = sc / 2 + fabs(mn) / 2048 + 1e-6;
                    for (int i = 0; i < g; i++) {
                        double e = fabs(y[gi * g + i] - x[gi * g + i]);
                        if (e / bound > worst) worst = e / bound;
                    }
                }
            }
            CHECK(worst <= 1.0, "q%dg%d: error/bound %.3f", bits, g, worst);
        }
    const double lm[5] = {0, 0.3634, 0.1175, 0.03455, 0.009501};
    for (int bits = 2; bits <= 4; bits++) {
        tern_kv_fmt f = {TERN_KV_TURBO, bits, 0};
        CHECK(tern_kvq_vec_bytes(&f, d) == (size_t)(4 + d * bits / 8), "bytes");
        double mse = 0;
        int n = 200;
        for (int rep = 0; rep < n; rep++) {
            keylike(x, d, &s);
            tern_kvq_encode(&f, d, sg, x, rec, scratch);
            tern_kvq_decode(&f, d, sg, rec, y, scratch);
            double r = test_rel_l2(y, x, (size_t)d);
            mse += r * r / n;
        }
        printf("  turbo%d: relative MSE %.5f (Lloyd-Max N(0,1): %.5f)\n", bits, mse, lm[bits]);
        CHECK(mse <= 1.25 * lm[bits], "turbo%d mse %g", bits, mse);
    }
    /* zero and non-finite vectors never crash; zero stays zero */
    memset(x, 0, sizeof x);
    tern_kv_fmt t3 = {TERN_KV_TURBO, 3, 0}, q4 = {TERN_KV_AFFINE, 4, 32};
    tern_kvq_encode(&t3, d, sg, x, rec, scratch);
    tern_kvq_decode(&t3, d, sg, rec, y, scratch);
    CHECK(y[0] == 0 && y[d - 1] == 0, "zero vector");
    x[3] = NAN; x[4] = INFINITY;
    tern_kvq_encode(&q4, d, NULL, x, rec, scratch);
    tern_kvq_decode(&q4, d, NULL, rec, y, scratch);
    CHECK(isfinite(y[0]) && isfinite(y[40]), "affine with NaN/inf input keeps other groups finite");
    tern_kv_fmt bad = {TERN_KV_AFFINE, 4, 48};
    tern_error e = {0};
    CHECK(tern_kvq_check(&bad, 128, "layer 0 K", &e) == TERN_EUNSUPPORTED && strstr(e.msg, "layer 0 K"), "%s", e.msg);
}

/* ---- kv_write + attention ---- */

typedef struct kvbuf {
    tern_kv_layer v;
    int32_t *table;
    float *rot;
} kvbuf;

#define NSLOT 2
#define MAXB 8
#define BS 4
#define T 29

static void kvbuf_make(kvbuf *b, tern_kv_fmt kf, tern_kv_fmt vf, int nkv, int d, int window, const int32_t *table) {
    memset(b, 0, sizeof *b);
    b->v.n_head_kv = nkv;
    b->v.head_dim = d;
    b->v.block_size = BS;
    b->v.window = window;
    b->v.max_blocks = MAXB;
    b->v.kf = kf;
    b->v.vf = vf;
    size_t n = (size_t)NSLOT * MAXB * BS * nkv;
    b->v.k = calloc(n, tern_kvq_vec_bytes(&kf, d));
    b->v.v = calloc(n, tern_kvq_vec_bytes(&vf, d));
    b->table = malloc(sizeof(int32_t) * NSLOT * MAXB);
    memcpy(b->table, table, sizeof(int32_t) * NSLOT * MAXB);
    b->v.block_table = b->table;
    b->v.rot_dim = tern_kvq_rot_dim(d);
    b->rot = malloc(sizeof(float) * (size_t)b->v.rot_dim);
    tern_kvq_signs(1234, b->rot, b->v.rot_dim);
    b->v.rot = kf.kind == TERN_KV_TURBO || vf.kind == TERN_KV_TURBO ? b->rot : NULL;
}

static void kvbuf_free(kvbuf *b) { free(b->v.k); free(b->v.v); free(b->table); free(b->rot); }

static size_t pool_bytes(const kvbuf *b, int is_v) {
    return (size_t)NSLOT * MAXB * BS * b->v.n_head_kv * tern_kvq_vec_bytes(is_v ? &b->v.vf : &b->v.kf, b->v.head_dim);
}

/* Write positions [0, T) of both slots in chunks of 5 rows that mix the slots. */
static void write_all(tern_backend *be, kvbuf *b, const float *k, const float *v) {
    int nkv = b->v.n_head_kv, d = b->v.head_dim;
    int32_t pos[5], slot[5];
    float kk[5 * 4 * 256], vv[5 * 4 * 256];
    int n = 0;
    for (int i = 0; i < NSLOT * T; i++) {
        int s = i % NSLOT, p = i / NSLOT;
        pos[n] = p; slot[n] = s;
        memcpy(kk + (size_t)n * nkv * d, k + ((size_t)s * T + p) * nkv * d, sizeof(float) * nkv * d);
        memcpy(vv + (size_t)n * nkv * d, v + ((size_t)s * T + p) * nkv * d, sizeof(float) * nkv * d);
        if (++n == 5 || i == NSLOT * T - 1) {
            tern_rows r = {n, pos, slot, pos, slot};
            be->vt->kv_write(be, &b->v, &r, kk, vv);
            n = 0;
        }
    }
}

/* F32 copy of the decoded cache (same table). */
static void dequant_into(const kvbuf *q, kvbuf *f) {
    int nkv = q->v.n_head_kv, d = q->v.head_dim;
    float scratch[TERN_KVQ_MAX_ROT];
    size_t kb = tern_kvq_vec_bytes(&q->v.kf, d), vb = tern_kvq_vec_bytes(&q->v.vf, d);
    for (size_t r = 0; r < (size_t)NSLOT * MAXB * BS * nkv; r++) {
        tern_kvq_decode(&q->v.kf, d, q->rot, (const uint8_t *)q->v.k + r * kb, (float *)f->v.k + r * d, scratch);
        tern_kvq_decode(&q->v.vf, d, q->rot, (const uint8_t *)q->v.v + r * vb, (float *)f->v.v + r * d, scratch);
    }
}

typedef struct acase { tern_kv_fmt kf, vf; int d, nh, nkv, window; float softcap; double bound; } acase;

static void run_case(const acase *c, unsigned long long seed) {
    int d = c->d, nkv = c->nkv, nh = c->nh;
    int32_t table[NSLOT * MAXB];
    for (int i = 0; i < NSLOT * MAXB; i++) table[i] = (i * 5 + 3) % (NSLOT * MAXB); /* shuffled */
    size_t nkvd = (size_t)NSLOT * T * nkv * d;
    float *k = malloc(sizeof(float) * nkvd), *v = malloc(sizeof(float) * nkvd);
    unsigned long long s = seed;
    for (size_t i = 0; i < nkvd; i += (size_t)d) { keylike(k + i, d, &s); for (int j = 0; j < d; j++) v[i + j] = test_randf(&s); }
    tern_kv_fmt f32 = {0};
    kvbuf R, F, D, X;
    kvbuf_make(&R, c->kf, c->vf, nkv, d, c->window, table);
    kvbuf_make(&F, c->kf, c->vf, nkv, d, c->window, table);
    kvbuf_make(&D, f32, f32, nkv, d, c->window, table);
    kvbuf_make(&X, f32, f32, nkv, d, c->window, table);
    write_all(REF, &R, k, v);
    write_all(FAST, &F, k, v);
    write_all(REF, &X, k, v);
    CHECK(!memcmp(R.v.k, F.v.k, pool_bytes(&R, 0)) && !memcmp(R.v.v, F.v.v, pool_bytes(&R, 1)), "backends wrote different bytes");
    dequant_into(&R, &D);
    if (c->window) R.table[0] = F.table[0] = D.table[0] = X.table[0] = -1; /* slot 0's first block freed by trim */
    int32_t pos[6] = {T - 1, T - 2, 3, T / 2, 0, T - 1}, slot[6] = {0, 1, 1, 0, 0, 1};
    if (c->window) pos[2] = c->window + 3; /* slot 1 sees its window only */
    int n = 6;
    tern_rows rows = {n, pos, slot, pos, slot};
    size_t no = (size_t)n * nh * d;
    float *q = malloc(sizeof(float) * no), *oR = malloc(sizeof(float) * no), *oF = malloc(sizeof(float) * no);
    float *oF1 = malloc(sizeof(float) * no), *oD = malloc(sizeof(float) * no), *oX = malloc(sizeof(float) * no);
    for (size_t i = 0; i < no; i++) q[i] = 3.0f * test_randf(&s);
    float scale = 1.0f / sqrtf((float)d);
    REF->vt->attention(REF, oR, q, &rows, nh, &R.v, scale, c->softcap);
    REF->vt->attention(REF, oD, q, &rows, nh, &D.v, scale, c->softcap);
    REF->vt->attention(REF, oX, q, &rows, nh, &X.v, scale, c->softcap);
    FAST->vt->attention(FAST, oF, q, &rows, nh, &F.v, scale, c->softcap);
    FAST1->vt->attention(FAST1, oF1, q, &rows, nh, &F.v, scale, c->softcap);
    double md = 0;
    for (size_t i = 0; i < no; i++) md = fmax(md, fabs((double)oR[i] - oD[i]));
    char kn[16], vn[16];
    tern_kvq_name(&c->kf, kn, sizeof kn);
    tern_kvq_name(&c->vf, vn, sizeof vn);
    double ef = test_rel_l2(oF, oD, no), ex = test_rel_l2(oR, oX, no);
    CHECK(md == 0.0, "K %s V %s d=%d: reference differs from attention over the dequantized cache by %g", kn, vn, d, md);
    CHECK(ef <= 2e-6, "K %s V %s d=%d: fast vs dequantized reference %g", kn, vn, d, ef);
    CHECK(!memcmp(oF, oF1, sizeof(float) * no), "K %s V %s d=%d: 1 vs 2 threads differ", kn, vn, d);
    CHECK(ex <= c->bound, "K %s V %s d=%d: error vs exact f32 KV %g > %g", kn, vn, d, ex, c->bound);
    printf("  K %-6s V %-6s d=%3d nh=%d nkv=%d W=%d: vs f32 KV %.2e, fast vs dequant ref %.1e\n", kn, vn, d, nh, nkv,
           c->window, ex, ef);
    { /* a prefill chunk of slot 1 (its rows share key tiles) gives each row bitwise what the row alone gets */
        enum { NC = T - 10 };
        int32_t cp[NC], cs[NC];
        for (int i = 0; i < NC; i++) { cp[i] = 10 + i; cs[i] = 1; }
        const size_t rw = (size_t)nh * d;
        float *cq = malloc(sizeof(float) * NC * rw), *ca = malloc(sizeof(float) * NC * rw), *c1 = malloc(sizeof(float) * NC * rw);
        for (size_t i = 0; i < NC * rw; i++) cq[i] = 3.0f * test_randf(&s);
        tern_rows cr = {NC, cp, cs, cp, cs};
        FAST->vt->attention(FAST, ca, cq, &cr, nh, &F.v, scale, c->softcap);
        for (int i = 0; i < NC; i++) {
            tern_rows one = {1, cp + i, cs + i, cp + i, cs + i};
            FAST->vt->attention(FAST, c1 + i * rw, cq + i * rw, &one, nh, &F.v, scale, c->softcap);
        }
        CHECK(!memcmp(ca, c1, sizeof(float) * NC * rw), "K %s V %s d=%d: a chunk's rows differ from each row alone", kn, vn, d);
        free(cq); free(ca); free(c1);
    }
    kvbuf_free(&R); kvbuf_free(&F); kvbuf_free(&D); kvbuf_free(&X);
    free(k); free(v); free(q); free(oR); free(oF); free(oF1); free(oD); free(oX);
}

TEST(write_and_attention_every_kind) {
    const tern_kv_fmt f16 = {TERN_KV_F16, 0, 0}, bf16 = {TERN_KV_BF16, 0, 0}, f32 = {0, 0, 0};
    const tern_kv_fmt q8 = {TERN_KV_AFFINE, 8, 64}, q4 = {TERN_KV_AFFINE, 4, 32}, q4g16 = {TERN_KV_AFFINE, 4, 16};
    const tern_kv_fmt t2 = {TERN_KV_TURBO, 2, 0}, t3 = {TERN_KV_TURBO, 3, 0}, t4 = {TERN_KV_TURBO, 4, 0};
    const acase cases[] = {
        {f16, f16, 128, 8, 2, 0, 0, 2e-3},
        {bf16, bf16, 64, 4, 4, 0, 0, 1e-2},
        {q8, q8, 128, 8, 2, 0, 0, 2e-2},
        {q8, q8, 256, 2, 1, 8, 30.0f, 2e-2},
        {q4, q4, 128, 8, 2, 0, 0, 0.15},
        {q4g16, q4g16, 80, 4, 2, 0, 0, 0.15},
        {t4, t4, 128, 8, 2, 0, 0, 0.2},
        {t4, t3, 128, 16, 2, 6, 0, 0.25},
        {t3, t3, 80, 4, 2, 0, 50.0f, 0.3},
        {t2, t2, 64, 4, 4, 0, 0, 0.6},
        {t4, f32, 128, 4, 1, 0, 0, 0.2},
        {f32, t3, 256, 4, 2, 0, 0, 0.3},
        {q8, t3, 128, 8, 2, 0, 0, 0.3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 100 + i);
}

int main(void) {
    tern_error e = {0};
    tern_backend_opts o2 = {.n_threads = 2}, o1 = {.n_threads = 1};
    if (tern_backend_cpu_ref_open(&REF, NULL, &e) || tern_backend_cpu_open(&FAST, &o2, &e) ||
        tern_backend_cpu_open(&FAST1, &o1, &e)) {
        printf("FAIL: backends: %s\n", e.msg);
        return 1;
    }
    RUN(codebook_is_lloyd_max);
    RUN(rotation_is_orthogonal);
    RUN(codec_bounds);
    RUN(write_and_attention_every_kind);
    tern_backend_close(REF);
    tern_backend_close(FAST);
    tern_backend_close(FAST1);
    return test_done();
}
