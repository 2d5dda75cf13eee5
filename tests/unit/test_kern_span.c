/*
 * test_kern_span.c — attention with bidirectional spans (tern_rows.vis_lo/vis_hi, ops.h) on
 * the CPU backends.
 *
 * One step of several sequences is written into a paged cache (shuffled block ids, blocks no
 * row can see marked -1 and poisoned with NaN), then attended with span ranges as the forward
 * driver builds them: a span's rows see the whole span, other rows pos..pos. Cases cover spans
 * of 1..13 rows, spans longer than the sliding window (keys below the window's lower bound),
 * adjacent spans, a span at position 0, a decode row beside them, GQA / MHA, head dims
 * 64..256, softcap, and compressed pages (f16, bf16, affine, TurboQuant).
 * Oracles:
 *   - the reference against a brute-force double-precision attention written here from the
 *     mask's definition (f32 pages): rel L2 <= 1e-6;
 *   - the fast backend (scalar / AVX2 / AVX-512 kernels) against the reference: <= 2e-6 (f32
 *     pages), <= 5e-6 (compressed pages: cpu_kvq.c rotates queries instead of keys);
 *   - length-1 spans and "no extra keys" ranges are bitwise the causal result (NULL ranges);
 *   - rows whose span adds no key to the causal set are bitwise unchanged, the others differ.
 */
#include "ops/kvq.h"
#include "test_kern_util.h"

#define NSLOT 3

typedef struct sp_cache {
    tern_kv_layer kv;
    int32_t *table;
    float *rot;
    size_t kb, vb;
    int mb;
} sp_cache;

static void cache_make(sp_cache *c, tern_kv_fmt kf, tern_kv_fmt vf, int max_pos, int nkv, int hd, int bs, int window,
                       unsigned long long seed) {
    int mb = (max_pos + bs - 1) / bs, nblk = NSLOT * mb;
    memset(c, 0, sizeof *c);
    c->mb = mb;
    c->table = malloc(sizeof(int32_t) * (size_t)nblk);
    unsigned long long s = seed;
    for (int i = 0; i < nblk; i++) c->table[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(&s) % (unsigned)(i + 1)), t = c->table[i];
        c->table[i] = c->table[j];
        c->table[j] = t;
    }
    c->kb = tern_kvq_vec_bytes(&kf, hd);
    c->vb = tern_kvq_vec_bytes(&vf, hd);
    size_t toks = (size_t)nblk * bs * nkv;
    void *k = malloc(toks * c->kb), *v = malloc(toks * c->vb);
    memset(k, 0xff, toks * c->kb); /* all-ones bytes decode to NaN in every format: never read */
    memset(v, 0xff, toks * c->vb);
    int P = tern_kvq_rot_dim(hd);
    c->rot = malloc(sizeof(float) * (size_t)P);
    tern_kvq_signs(seed + 17, c->rot, P);
    int turbo = kf.kind == TERN_KV_TURBO || vf.kind == TERN_KV_TURBO;
    c->kv = (tern_kv_layer){.dtype = kf.kind || vf.kind ? TERN_DT_Q : TERN_DT_F32, .n_head_kv = nkv, .head_dim = hd,
                            .block_size = bs, .window = window, .k = k, .v = v, .block_table = c->table,
                            .max_blocks = mb, .kf = kf, .vf = vf, .rot_dim = turbo ? P : 0,
                            .rot = turbo ? c->rot : NULL};
}

static void cache_free(sp_cache *c) { free(c->kv.k); free(c->kv.v); free(c->table); free(c->rot); }

/* Mark block b of slot s not resident and poison its pages. */
static void cache_drop(sp_cache *c, int s, int b) {
    int32_t blk = c->table[s * c->mb + b];
    if (blk < 0) return;
    size_t tok = (size_t)blk * c->kv.block_size * c->kv.n_head_kv;
    memset((uint8_t *)c->kv.k + tok * c->kb, 0xff, (size_t)c->kv.block_size * c->kv.n_head_kv * c->kb);
    memset((uint8_t *)c->kv.v + tok * c->vb, 0xff, (size_t)c->kv.block_size * c->kv.n_head_kv * c->vb);
    c->table[s * c->mb + b] = -1;
}

/* The step: history positions already in the cache, then rows with span ids (0 = causal).
 * slot 0: 9 history positions, then text, a 1-row span, text, a 5-row span, an adjacent
 *         13-row span (longer than every window tested), text;
 * slot 1: one decode row at position 30 (no span);
 * slot 2: a 4-row span at position 0, then 2 text rows. */
typedef struct step {
    int n, hist[NSLOT];
    int32_t pos[48], slot[48], span[48], vlo[48], vhi[48];
} step;

static void step_make(step *st) {
    memset(st, 0, sizeof *st);
    static const int ids0[] = {0, 0, 1, 0, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0};
    st->hist[0] = 9;
    st->hist[1] = 30;
    st->hist[2] = 0;
    int n = 0;
    for (int i = 0; i < (int)TERN_ARRAY_LEN(ids0); i++) { st->pos[n] = 9 + i; st->slot[n] = 0; st->span[n++] = ids0[i]; }
    st->pos[n] = 30; st->slot[n] = 1; st->span[n++] = 0;
    for (int i = 0; i < 6; i++) { st->pos[n] = i; st->slot[n] = 2; st->span[n++] = i < 4 ? 4 : 0; }
    st->n = n;
    /* ranges as the driver builds them: whole span for span rows, pos..pos otherwise */
    for (int r = 0; r < n; r++) {
        st->vlo[r] = st->vhi[r] = st->pos[r];
        if (!st->span[r]) continue;
        for (int j = r; j >= 0 && st->span[j] == st->span[r] && st->slot[j] == st->slot[r]; j--) st->vlo[r] = st->pos[j];
        for (int j = r; j < n && st->span[j] == st->span[r] && st->slot[j] == st->slot[r]; j++) st->vhi[r] = st->pos[j];
    }
}

/* Fill history and the step's own K/V (ref kv_write), then drop blocks below every row's
 * first visible key. */
static void step_fill(tern_backend *ref, sp_cache *c, const step *st, unsigned long long seed) {
    int w = c->kv.n_head_kv * c->kv.head_dim;
    for (int s = 0; s < NSLOT; s++) {
        int h = st->hist[s];
        if (!h) continue;
        int32_t pos[64], slot[64];
        for (int i = 0; i < h; i++) { pos[i] = i; slot[i] = s; }
        float *k = kt_randv((size_t)h * w, seed + (unsigned)s, 1.0f), *v = kt_randv((size_t)h * w, seed + 7 + (unsigned)s, 1.0f);
        tern_rows rows = {h, pos, slot, pos, slot};
        ref->vt->kv_write(ref, &c->kv, &rows, k, v);
        free(k); free(v);
    }
    float *k = kt_randv((size_t)st->n * w, seed + 11, 1.0f), *v = kt_randv((size_t)st->n * w, seed + 13, 1.0f);
    tern_rows rows = {st->n, st->pos, st->slot, st->pos, st->slot};
    ref->vt->kv_write(ref, &c->kv, &rows, k, v);
    free(k); free(v);
    int W = c->kv.window;
    for (int s = 0; s < NSLOT && W > 0; s++) {
        int first = 1 << 30;
        for (int r = 0; r < st->n; r++) {
            if (st->slot[r] != s) continue;
            int lo = st->pos[r] - W + 1;
            if (st->vlo[r] < lo) lo = st->vlo[r];
            if (lo < first) first = lo;
        }
        for (int b = 0; b < c->mb; b++)
            if ((b + 1) * c->kv.block_size - 1 < first) cache_drop(c, s, b);
    }
}

/* Brute force from the mask's definition, double precision, f32 pages only. */
static void brute(float *out, const float *q, const step *st, int nh, const sp_cache *c, float scale, float cap) {
    const tern_kv_layer *kv = &c->kv;
    int d = kv->head_dim, group = nh / kv->n_head_kv, W = kv->window;
    double *sc = malloc(sizeof(double) * 64), *acc = malloc(sizeof(double) * (size_t)d);
    for (int r = 0; r < st->n; r++)
        for (int h = 0; h < nh; h++) {
            int p = st->pos[r], s = st->slot[r], kvh = h / group;
            const float *qv = q + ((size_t)r * nh + h) * d;
            double m = -INFINITY, sum = 0;
            for (int b = 0; b < 64; b++) {
                int causal = b <= p && (W == 0 || b > p - W), span = b >= st->vlo[r] && b <= st->vhi[r];
                sc[b] = -INFINITY;
                if (!causal && !span) continue;
                int32_t blk = kv->block_table[s * kv->max_blocks + b / kv->block_size];
                const float *kk = (const float *)kv->k + (((size_t)blk * kv->block_size + b % kv->block_size) * kv->n_head_kv + kvh) * d;
                double dot = 0;
                for (int i = 0; i < d; i++) dot += (double)qv[i] * kk[i];
                dot *= scale;
                if (cap > 0) dot = cap * tanh(dot / cap);
                sc[b] = dot;
                if (dot > m) m = dot;
            }
            for (int i = 0; i < d; i++) acc[i] = 0;
            for (int b = 0; b < 64; b++) {
                if (sc[b] == -INFINITY) continue;
                double e = exp(sc[b] - m);
                sum += e;
                int32_t blk = kv->block_table[s * kv->max_blocks + b / kv->block_size];
                const float *vv = (const float *)kv->v + (((size_t)blk * kv->block_size + b % kv->block_size) * kv->n_head_kv + kvh) * d;
                for (int i = 0; i < d; i++) acc[i] += e * vv[i];
            }
            float *o = out + ((size_t)r * nh + h) * d;
            for (int i = 0; i < d; i++) o[i] = (float)(acc[i] / sum);
        }
    free(sc);
    free(acc);
}

static int has_nan(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) if (isnan(x[i])) return 1;
    return 0;
}

/* Does the span add a key to row r's causal (windowed) set? */
static int adds_keys(const step *st, int r, int W) {
    int lo = W > 0 ? st->pos[r] - W + 1 : 0;
    if (lo < 0) lo = 0;
    return st->vhi[r] > st->pos[r] || st->vlo[r] < lo;
}

typedef struct scase { tern_kv_fmt kf, vf; int nh, nkv, d, bs, window; float cap; } scase;

static void run_case(const scase *cs, tern_backend *ref, tern_backend *const *fast, int nfast, unsigned long long seed) {
    step st;
    step_make(&st);
    sp_cache c;
    cache_make(&c, cs->kf, cs->vf, 64, cs->nkv, cs->d, cs->bs, cs->window, seed);
    step_fill(ref, &c, &st, seed);
    int n = st.n, nh = cs->nh, d = cs->d, f32 = !cs->kf.kind && !cs->vf.kind;
    size_t no = (size_t)n * nh * d;
    float *q = kt_randv(no, seed + 3, 1.0f), *o_ref = malloc(no * 4), *o_f = malloc(no * 4), *o_c = malloc(no * 4);
    float *o_1 = malloc(no * 4);
    float scale = 2.0f / sqrtf((float)d);
    tern_rows rows = {n, st.pos, st.slot, st.pos, st.slot, st.vlo, st.vhi, st.vlo, st.vhi};
    tern_rows causal = {n, st.pos, st.slot, st.pos, st.slot};
    char kn[16], vn[16];
    tern_kvq_name(&cs->kf, kn, sizeof kn);
    tern_kvq_name(&cs->vf, vn, sizeof vn);
    char what[160];
    snprintf(what, sizeof what, "K %s V %s nh=%d nkv=%d d=%d bs=%d W=%d cap=%g", kn, vn, nh, cs->nkv, d, cs->bs,
             cs->window, cs->cap);

    ref->vt->attention(ref, o_ref, q, &rows, nh, &c.kv, scale, cs->cap);
    CHECK(!has_nan(o_ref, no), "%s: reference output has NaN (read a dropped block?)", what);
    if (f32) {
        float *o_b = malloc(no * 4);
        brute(o_b, q, &st, nh, &c, scale, cs->cap);
        double e = test_rel_l2(o_ref, o_b, no);
        CHECK(e <= 1e-6, "%s: reference vs brute force %.3g", what, e);
        free(o_b);
    }
    /* rows the span does not widen: bitwise the causal result; the others differ */
    ref->vt->attention(ref, o_c, q, &causal, nh, &c.kv, scale, cs->cap);
    for (int r = 0; r < n; r++) {
        size_t off = (size_t)r * nh * d, len = (size_t)nh * d * 4;
        int same = !memcmp(o_ref + off, o_c + off, len);
        if (adds_keys(&st, r, cs->window)) CHECK(!same, "%s: row %d (span) equals the causal result", what, r);
        else CHECK(same, "%s: row %d (no extra keys) differs from the causal result", what, r);
    }
    for (int i = 0; i < nfast; i++) {
        tern_backend *fb = fast[i];
        fb->vt->attention(fb, o_f, q, &rows, nh, &c.kv, scale, cs->cap);
        double e = test_rel_l2(o_f, o_ref, no);
        if (has_nan(o_f, no)) e = INFINITY;
        CHECK(e <= (f32 ? 2e-6 : 5e-6), "%s: fast #%d vs reference %.3g", what, i, e);
        /* ranges adding nothing (pos..pos, or empty) are bitwise the causal step */
        int32_t elo[48], ehi[48];
        for (int r = 0; r < n; r++) { elo[r] = r % 2 ? st.pos[r] : 1; ehi[r] = r % 2 ? st.pos[r] : 0; }
        tern_rows none = {n, st.pos, st.slot, st.pos, st.slot, elo, ehi, elo, ehi};
        fb->vt->attention(fb, o_f, q, &none, nh, &c.kv, scale, cs->cap);
        fb->vt->attention(fb, o_1, q, &causal, nh, &c.kv, scale, cs->cap);
        CHECK(!memcmp(o_f, o_1, no * 4), "%s: fast #%d: empty / pos..pos ranges differ from no ranges", what, i);
    }
    {   /* the same on the reference */
        int32_t elo[48], ehi[48];
        for (int r = 0; r < n; r++) { elo[r] = r % 2 ? st.pos[r] : 5; ehi[r] = r % 2 ? st.pos[r] : 4; }
        tern_rows none = {n, st.pos, st.slot, st.pos, st.slot, elo, ehi, elo, ehi};
        ref->vt->attention(ref, o_f, q, &none, nh, &c.kv, scale, cs->cap);
        CHECK(!memcmp(o_f, o_c, no * 4), "%s: reference: empty / pos..pos ranges differ from no ranges", what);
    }
    free(q); free(o_ref); free(o_f); free(o_c); free(o_1);
    cache_free(&c);
}

static tern_backend *g_ref, *g_fast[3];

TEST(span_attention_f32_grid) {
    static const int hds[] = {64, 128, 256};
    static const int gqa[][2] = {{4, 4}, {8, 2}, {6, 1}};
    static const int wins[] = {0, 3, 8};
    unsigned long long seed = 100;
    for (size_t h = 0; h < TERN_ARRAY_LEN(hds); h++)
        for (size_t g = 0; g < TERN_ARRAY_LEN(gqa); g++)
            for (size_t w = 0; w < TERN_ARRAY_LEN(wins); w++) {
                scase cs = {{0}, {0}, gqa[g][0], gqa[g][1], hds[h], seed % 3 == 0 ? 16 : seed % 3 == 1 ? 4 : 5, wins[w],
                            seed % 2 ? 0.0f : 20.0f};
                run_case(&cs, g_ref, g_fast, 3, seed++);
            }
}

TEST(span_attention_compressed_pages) {
    static const scase C[] = {
        {{TERN_KV_F16, 0, 0}, {TERN_KV_F16, 0, 0}, 8, 2, 128, 4, 0, 0.0f},
        {{TERN_KV_BF16, 0, 0}, {TERN_KV_BF16, 0, 0}, 4, 4, 64, 5, 6, 0.0f},
        {{TERN_KV_AFFINE, 8, 64}, {TERN_KV_AFFINE, 4, 32}, 8, 2, 128, 4, 8, 30.0f},
        {{TERN_KV_TURBO, 4, 0}, {TERN_KV_TURBO, 3, 0}, 16, 2, 128, 16, 3, 0.0f},
        {{TERN_KV_BF16, 0, 0}, {TERN_KV_TURBO, 2, 0}, 4, 1, 80, 5, 0, 0.0f},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(C); i++) run_case(&C[i], g_ref, g_fast, 3, 500 + i);
}

int main(void) {
    g_ref = kt_open_ref();
    for (int i = 0; i < 3; i++) g_fast[i] = kt_open_cpu(kt_isas[i], i == 2 ? 1 : 2);
    RUN(span_attention_f32_grid);
    RUN(span_attention_compressed_pages);
    for (int i = 0; i < 3; i++) tern_backend_close(g_fast[i]);
    tern_backend_close(g_ref);
    return test_done();
}
