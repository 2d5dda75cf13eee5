/*
 * cuda_ops_tests_kvq.h — compressed KV pages on the GPU (kvq_write.cu, kvq_attn.cu) against
 * cpu-ref, for every kind of ops/kvq.h: f16, bf16, affine q8/q4 (groups 16..64), TurboQuant
 * 2/3/4 bits, K and V formats mixed. Part of cuda_ops_tests.h (uses its helpers).
 *
 *   - cuda_kvq_write_bytes: kv_write on both backends into pools that start with the same
 *     filler; the pools must be byte-identical (the GPU encoder is the CPU encoder), including
 *     special vectors (zero, beyond the f16 range, f16-subnormal, inf/NaN) and rows whose block
 *     is not resident (-1: nothing written). Head dims 64..512 (80 pads the rotation to 128).
 *   - cuda_kvq_attention: caches filled through kv_write, then attention of prefill rows
 *     (row tiling), one decode row per slot (split-K) and both mixed without host copies, over
 *     shuffled block tables, sliding windows with evicted (-1) blocks, GQA up to 32:1, softcap.
 *     Oracle: cpu-ref attention over the same compressed pages, which is bitwise the f32
 *     attention over the decoded cache (test_kern_kvq). Bound: rel L2 <= 1e-5 (f32 summation
 *     order and the rotation's rounding; measured values are printed as "err kvq ..." lines).
 *   - cuda_kvq_graph: a decode step (kv_write + attention) on a TurboQuant cache recorded once
 *     and replayed at other positions equals the step run eagerly.
 */
#include "ops/kvq.h"

typedef struct kvq_pair {
    tern_kv_layer r, g;          /* cpu-ref view (host pools) and GPU view (device pools) */
    int32_t *bt;                 /* host block table (also the ref view's) */
    float *signs;                /* host rotation signs */
    size_t kbytes, vbytes;       /* pool bytes */
} kvq_pair;

static void kvq_pair_open(kvq_pair *p, tern_kv_fmt kf, tern_kv_fmt vf, int nkv, int d, int bs, int window,
                          int nslots, int max_blocks, int nblk, const int32_t *bt) {
    memset(p, 0, sizeof *p);
    size_t recs = (size_t)nblk * bs * nkv;
    p->kbytes = recs * tern_kvq_vec_bytes(&kf, d);
    p->vbytes = recs * tern_kvq_vec_bytes(&vf, d);
    void *kh = malloc(p->kbytes), *vh = malloc(p->vbytes);
    memset(kh, 0xa5, p->kbytes); /* same filler on both sides: unwritten records compare equal */
    memset(vh, 0xa5, p->vbytes);
    size_t tb = (size_t)nslots * max_blocks * sizeof(int32_t);
    p->bt = malloc(tb);
    memcpy(p->bt, bt, tb);
    int P = tern_kvq_rot_dim(d);
    p->signs = malloc(sizeof(float) * (size_t)P);
    tern_kvq_signs(0x5eed + (uint64_t)d, p->signs, P);
    tern_kv_layer v = {0};
    v.dtype = TERN_DT_Q;
    v.n_head_kv = nkv;
    v.head_dim = d;
    v.block_size = bs;
    v.window = window;
    v.max_blocks = max_blocks;
    v.kf = kf;
    v.vf = vf;
    v.rot_dim = P;
    p->r = p->g = v;
    p->r.k = kh;
    p->r.v = vh;
    p->r.block_table = p->bt;
    p->r.rot = p->signs;
    p->g.k = to_gpu(kh, p->kbytes);
    p->g.v = to_gpu(vh, p->vbytes);
    p->g.block_table = to_gpu(p->bt, tb);
    p->g.rot = to_gpu(p->signs, sizeof(float) * (size_t)P);
}

static void kvq_pair_close(kvq_pair *p) {
    g_gpu->vt->free(g_gpu, p->g.k);
    g_gpu->vt->free(g_gpu, p->g.v);
    g_gpu->vt->free(g_gpu, (void *)p->g.block_table);
    g_gpu->vt->free(g_gpu, (void *)p->g.rot);
    free(p->r.k);
    free(p->r.v);
    free(p->bt);
    free(p->signs);
}

/* upload a changed host table to the GPU view */
static void kvq_pair_table(kvq_pair *p, int nslots) {
    g_gpu->vt->upload(g_gpu, (void *)p->g.block_table, p->bt, (size_t)nslots * p->r.max_blocks * sizeof(int32_t));
}

/* kv_write of n rows (k, v: host [n][nkv][d]) on both backends */
static void kvq_write(kvq_pair *p, int n, const int32_t *pos, const int32_t *slot, const float *k, const float *v) {
    size_t m = (size_t)n * p->r.n_head_kv * p->r.head_dim * sizeof(float);
    void *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4), *kd = to_gpu(k, m), *vd = to_gpu(v, m);
    tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, pos, slot};
    g_ref->vt->kv_write(g_ref, &p->r, &rr, k, v);
    g_gpu->vt->kv_write(g_gpu, &p->g, &rg, kd, vd);
    g_gpu->vt->sync(g_gpu);
    g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, kd); g_gpu->vt->free(g_gpu, vd);
}

/* first differing byte of the K (is_v 0) or V pool, -1 when identical */
static long kvq_pool_diff(const kvq_pair *p, int is_v) {
    size_t nb = is_v ? p->vbytes : p->kbytes;
    uint8_t *h = malloc(nb);
    g_gpu->vt->download(g_gpu, h, is_v ? p->g.v : p->g.k, nb);
    const uint8_t *r = is_v ? p->r.v : p->r.k;
    long at = -1;
    for (size_t i = 0; i < nb && at < 0; i++)
        if (h[i] != r[i]) at = (long)i;
    free(h);
    return at;
}

static const char *kvq_pair_name(const kvq_pair *p, char *buf, size_t n) {
    char a[16], b[16];
    snprintf(buf, n, "K %s V %s", tern_kvq_name(&p->r.kf, a, sizeof a), tern_kvq_name(&p->r.vf, b, sizeof b));
    return buf;
}

#define KVQ_F16 {TERN_KV_F16, 0, 0}
#define KVQ_BF16 {TERN_KV_BF16, 0, 0}
#define KVQ_F32 {TERN_KV_F32, 0, 0}
#define KVQ_A(b, g) {TERN_KV_AFFINE, b, g}
#define KVQ_T(b) {TERN_KV_TURBO, b, 0}

TEST(cuda_kvq_write_bytes) {
    static const tern_kv_fmt F[] = {KVQ_F16, KVQ_BF16, KVQ_A(8, 64), KVQ_A(8, 32), KVQ_A(4, 32), KVQ_A(4, 16),
                                    KVQ_A(4, 64), KVQ_T(2), KVQ_T(3), KVQ_T(4)};
    static const int D[] = {64, 80, 128, 256, 512};
    const int nkv = 2, bs = 4, nslots = 2, mb = 6, nblk = 14, n = 40;
    int32_t bt[12], pos[40], slot[40];
    for (int i = 0; i < nslots * mb; i++) bt[i] = (i * 5 + 3) % nblk; /* shuffled */
    bt[2] = -1;                                                       /* slot 0 block 2 not resident */
    bt[mb + 4] = -1;
    for (int r = 0; r < n; r++) { /* distinct (slot, pos) pairs in a scattered order */
        int idx = (r * 7) % (nslots * mb * bs);
        slot[r] = idx / (mb * bs);
        pos[r] = idx % (mb * bs);
    }
    pos[5] = mb * bs + 3; /* past the table: skipped */
    for (size_t fi = 0; fi < TERN_ARRAY_LEN(F); fi++)
        for (size_t di = 0; di < TERN_ARRAY_LEN(D); di++) {
            int d = D[di];
            if (!tern_kvq_vec_bytes(&F[fi], d)) continue;
            size_t m = (size_t)n * nkv * d;
            float *k = rnd(m, 2.0f), *v = rnd(m, 0.5f);
            /* special vectors: zero; beyond f16 range; f16-subnormal; inf and NaN; -0 mixed with +0 */
            for (int i = 0; i < d; i++) {
                k[0 * d + i] = 0.0f;
                k[1 * d + i] = 9.0e4f * test_randf(&g_seed);
                k[2 * d + i] = 3.0e-6f * test_randf(&g_seed);
                v[3 * d + i] = i % 2 ? -0.0f : 0.0f;
                v[4 * d + i] = 70000.0f + (float)i;
            }
            k[3 * d + 5] = INFINITY;
            v[5 * d + 7] = NAN;
            v[6 * d + 1] = -INFINITY;
            kvq_pair p;
            tern_kv_fmt vf = F[(fi + 3) % TERN_ARRAY_LEN(F)];
            if (!tern_kvq_vec_bytes(&vf, d)) vf = F[fi];
            kvq_pair_open(&p, F[fi], vf, nkv, d, bs, 0, nslots, mb, nblk, bt);
            kvq_write(&p, n, pos, slot, k, v);
            long dk = kvq_pool_diff(&p, 0), dv = kvq_pool_diff(&p, 1);
            char nm[48];
            CHECK(dk < 0 && dv < 0, "%s d=%d: pools differ from the CPU encoder (K at byte %ld, V at byte %ld)",
                  kvq_pair_name(&p, nm, sizeof nm), d, dk, dv);
            kvq_pair_close(&p);
            free(k); free(v);
        }
}

typedef struct kvq_acase {
    tern_kv_fmt kf, vf;
    int nh, nkv, d, window;
    float cap;
    int bs, lens[3], P;
} kvq_acase;

/* One scenario; variant 0: prefill rows of slot 0 (host copies: row tiling), 1: one decode
 * row per slot (split-K), 2: both in one batch without host copies. Returns rel L2. */
static double kvq_attn_case(const kvq_acase *c, int variant) {
    const int nslots = 3, nkv = c->nkv, d = c->d, bs = c->bs, nh = c->nh;
    int maxlen = 0;
    for (int s = 0; s < nslots; s++) maxlen = c->lens[s] > maxlen ? c->lens[s] : maxlen;
    int max_blocks = (maxlen + bs - 1) / bs, nblk = nslots * max_blocks + 3;
    int32_t *bt = malloc((size_t)nslots * max_blocks * sizeof *bt), *perm = malloc(nblk * sizeof *perm);
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(&g_seed) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < nslots * max_blocks; i++) bt[i] = perm[i];
    kvq_pair p;
    kvq_pair_open(&p, c->kf, c->vf, nkv, d, bs, c->window, nslots, max_blocks, nblk, bt);
    size_t tok = (size_t)nkv * d;
    for (int s = 0; s < nslots; s++) { /* fill each slot in chunks of up to 64 rows */
        for (int r0 = 0; r0 < c->lens[s]; r0 += 64) {
            int n = c->lens[s] - r0 < 64 ? c->lens[s] - r0 : 64;
            int32_t pos[64], slot[64];
            for (int r = 0; r < n; r++) { pos[r] = r0 + r; slot[r] = s; }
            float *k = rnd((size_t)n * tok, 1.0f), *v = rnd((size_t)n * tok, 1.0f);
            kvq_write(&p, n, pos, slot, k, v);
            free(k); free(v);
        }
    }
    long diff = kvq_pool_diff(&p, 0) >= 0 || kvq_pool_diff(&p, 1) >= 0;
    int n = 0;
    int32_t *pos = malloc((c->P + nslots) * sizeof *pos), *slot = malloc((c->P + nslots) * sizeof *slot);
    if (variant != 1)
        for (int r = 0; r < c->P; r++) { pos[n] = c->lens[0] - c->P + r; slot[n++] = 0; }
    if (variant != 0)
        for (int s = 0; s < nslots; s++) { pos[n] = c->lens[s] - 1; slot[n++] = s; }
    if (c->window > 0) /* sliding window: evict the blocks no query of the slot can see */
        for (int s = 0; s < nslots; s++) {
            int minq = 1 << 30;
            for (int r = 0; r < n; r++)
                if (slot[r] == s && pos[r] < minq) minq = pos[r];
            for (int b = 0; b < max_blocks; b++)
                if ((b + 1) * bs - 1 < minq - c->window + 1) p.bt[s * max_blocks + b] = -1;
        }
    kvq_pair_table(&p, nslots);
    size_t qn = (size_t)n * nh * d;
    float *q = rnd(qn, 1.0f), *or_ = malloc(qn * sizeof *or_);
    void *qd = to_gpu(q, qn * 4), *od = nan_buf(g_gpu, qn), *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4);
    tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, variant == 2 ? NULL : pos, variant == 2 ? NULL : slot};
    float scale = 3.0f / sqrtf((float)d);
    g_ref->vt->attention(g_ref, or_, q, &rr, nh, &p.r, scale, c->cap);
    g_gpu->vt->attention(g_gpu, od, qd, &rg, nh, &p.g, scale, c->cap);
    float *og = from_gpu(g_gpu, od, qn);
    double rel = diff ? INFINITY : rel_or_nan(og, or_, qn);
    g_gpu->vt->free(g_gpu, qd); g_gpu->vt->free(g_gpu, od); g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd);
    kvq_pair_close(&p);
    free(bt); free(perm); free(pos); free(slot); free(q); free(or_); free(og);
    return rel;
}

TEST(cuda_kvq_attention) {
    static const kvq_acase C[] = {
        {KVQ_F16, KVQ_F16, 8, 2, 128, 0, 0.0f, 16, {300, 37, 1}, 70},
        {KVQ_BF16, KVQ_BF16, 8, 8, 64, 0, 0.0f, 32, {129, 200, 3}, 64},
        {KVQ_A(8, 64), KVQ_A(8, 64), 4, 1, 256, 24, 50.0f, 16, {200, 90, 10}, 45},
        {KVQ_A(4, 32), KVQ_A(4, 32), 8, 2, 512, 0, 0.0f, 16, {150, 64, 17}, 33},
        {KVQ_A(4, 16), KVQ_A(8, 16), 6, 3, 80, 0, 0.0f, 16, {90, 20, 4}, 25},
        {KVQ_T(4), KVQ_T(4), 16, 4, 128, 0, 0.0f, 64, {400, 2, 300}, 9},
        {KVQ_T(4), KVQ_T(3), 32, 1, 512, 40, 0.0f, 8, {120, 41, 2}, 20}, /* G 32 > heads per block */
        {KVQ_T(3), KVQ_T(3), 4, 2, 80, 0, 30.0f, 16, {100, 50, 5}, 17},  /* P 128 > head_dim */
        {KVQ_T(2), KVQ_T(2), 4, 4, 64, 0, 0.0f, 16, {90, 33, 1}, 30},
        {KVQ_T(4), KVQ_F32, 8, 2, 256, 0, 0.0f, 16, {160, 20, 7}, 24},
        {KVQ_F32, KVQ_T(3), 8, 2, 128, 16, 0.0f, 16, {140, 30, 3}, 21},
        {KVQ_A(8, 32), KVQ_T(3), 8, 2, 128, 0, 0.0f, 16, {110, 70, 2}, 16},
        {KVQ_F16, KVQ_A(4, 64), 12, 2, 192, 0, 0.0f, 16, {130, 8, 60}, 12},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(C); i++)
        for (int v = 0; v < 3; v++) {
            double rel = kvq_attn_case(&C[i], v);
            char a[16], b[16];
            tern_kvq_name(&C[i].kf, a, sizeof a);
            tern_kvq_name(&C[i].vf, b, sizeof b);
            printf("  err kvq K %s V %s nh=%d nkv=%d d=%d W=%d variant %d  %.2e\n", a, b, C[i].nh, C[i].nkv, C[i].d,
                   C[i].window, v, rel);
            CHECK(rel <= 1e-5, "K %s V %s d %d variant %d: rel %.2e (inf: pools differ or NaN)", a, b, C[i].d, v, rel);
        }
    /* BF16 / F16 pages, one decode row per slot: attn_decode.cu takes them (and the split merge at
     * 1000 keys); the tile kernel (TERN_CUDA_ATTN_DEC=0) gives the same within the f32 bound */
    extern unsigned long long tern__cuda_attn_decode_calls;
    extern int tern__cuda_ad_mode;
    const int keep = tern__cuda_ad_mode;
    static const kvq_acase D2[] = {
        {KVQ_BF16, KVQ_BF16, 32, 8, 128, 0, 0.0f, 16, {1000, 37, 1}, 4},
        {KVQ_F16, KVQ_F16, 16, 2, 256, 64, 30.0f, 16, {700, 200, 3}, 4},
        {KVQ_BF16, KVQ_BF16, 16, 4, 512, 0, 0.0f, 16, {300, 5, 90}, 4},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(D2); i++)
        for (int mode = 0; mode <= 1; mode++) {
            tern__cuda_ad_mode = mode;
            const unsigned long long dc = tern__cuda_attn_decode_calls;
            double rel = kvq_attn_case(&D2[i], 1);
            char a[16];
            tern_kvq_name(&D2[i].kf, a, sizeof a);
            printf("  err kvq %s decode nh=%d nkv=%d d=%d W=%d mode %d  %.2e\n", a, D2[i].nh, D2[i].nkv, D2[i].d,
                   D2[i].window, mode, rel);
            CHECK(rel <= 1e-5, "%s d %d decode mode %d: rel %.2e", a, D2[i].d, mode, rel);
            CHECK((tern__cuda_attn_decode_calls > dc) == (mode == 1), "%s d %d mode %d: attn_decode ran %d", a, D2[i].d, mode,
                  tern__cuda_attn_decode_calls > dc);
        }
    tern__cuda_ad_mode = keep;
}

/* the decode step of the graph test: kv_write of one row, then attention, then download */
static void kvq_gstep(kvq_pair *p, void *kd, void *vd, void *qd, void *od, void *pd, void *sd, int32_t *ph, int32_t *sh,
                      int nh, float *out) {
    tern_backend *g = g_gpu;
    tern_rows rows = {1, pd, sd, ph, sh};
    g->vt->kv_write(g, &p->g, &rows, kd, vd);
    g->vt->attention(g, od, qd, &rows, nh, &p->g, 0.125f, 0.0f);
    g->vt->download(g, out, od, sizeof(float) * (size_t)nh * p->g.head_dim);
}

TEST(cuda_kvq_graph) {
    if (!g_gpu->vt->graph_begin) { SKIP("cuda_kvq_graph", "backend has no graphs"); return; }
    const int nh = 8, nkv = 2, d = 128, bs = 16, mb = 12, len = 150;
    const tern_kv_fmt kf = KVQ_T(4), vf = KVQ_T(3);
    int32_t bt[12];
    for (int i = 0; i < mb; i++) bt[i] = (i * 7 + 2) % mb;
    kvq_pair p;
    kvq_pair_open(&p, kf, vf, nkv, d, bs, 0, 1, mb, mb, bt);
    size_t tok = (size_t)nkv * d;
    for (int r0 = 0; r0 < len; r0 += 50) {
        int32_t pos[50], slot[50];
        for (int r = 0; r < 50; r++) { pos[r] = r0 + r; slot[r] = 0; }
        float *k = rnd(50 * tok, 1.0f), *v = rnd(50 * tok, 1.0f);
        kvq_write(&p, 50, pos, slot, k, v);
        free(k); free(v);
    }
    float *kh = rnd(tok, 1.0f), *vh = rnd(tok, 1.0f), *qh = rnd((size_t)nh * d, 1.0f);
    void *kd = to_gpu(kh, tok * 4), *vd = to_gpu(vh, tok * 4), *qd = to_gpu(qh, (size_t)nh * d * 4);
    void *od = g_gpu->vt->alloc(g_gpu, (size_t)nh * d * 4);
    int32_t ph = len, sh = 0;
    void *pd = to_gpu(&ph, 4), *sd = to_gpu(&sh, 4);
    float eager[1024], replay[1024];
    size_t ob = sizeof(float) * (size_t)nh * d;
    CHECK(g_gpu->vt->graph_begin(g_gpu, 0x6b7671, replay, ob) == 1, "graph_begin");
    kvq_gstep(&p, kd, vd, qd, od, pd, sd, &ph, &sh, nh, replay);
    CHECK(g_gpu->vt->graph_end(g_gpu, 1) == 1, "graph_end refused a clean recording");
    static const int32_t PS[] = {160, 20, 151, 150};
    for (int i = 0; i < 4; i++) {
        ph = PS[i];
        g_gpu->vt->upload(g_gpu, pd, &ph, 4);
        kvq_gstep(&p, kd, vd, qd, od, pd, sd, &ph, &sh, nh, eager);
        for (int j = 0; j < nh * d; j++) replay[j] = NAN;
        CHECK(g_gpu->vt->graph_replay(g_gpu, 0x6b7671, replay, ob) == 1, "replay at %d", ph);
        double rel = rel_or_nan(replay, eager, (size_t)nh * d);
        printf("  err kvq graph replay pos %d  %.2e\n", ph, rel);
        CHECK(rel <= 1e-5, "turbo graph replay at pos %d differs from eager: rel %.2e", ph, rel);
    }
    g_gpu->vt->graph_reset(g_gpu);
    g_gpu->vt->free(g_gpu, kd); g_gpu->vt->free(g_gpu, vd); g_gpu->vt->free(g_gpu, qd); g_gpu->vt->free(g_gpu, od);
    g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd);
    kvq_pair_close(&p);
    free(kh); free(vh); free(qh);
}

static void cuda_kvq_tests(void) {
    RUN(cuda_kvq_write_bytes);
    RUN(cuda_kvq_attention);
    RUN(cuda_kvq_graph);
}
