/*
 * cuda_ops_tests_glm.h — the GLM-5 ops (vt->glm) of the CUDA backend against the scalar CPU
 * spec (cpu-ref's cpu_glm.c) on random data; outputs are poisoned with NaN first:
 *   - copy_2d, layernorm (with / without weight and bias, in place), rope_interleaved;
 *   - kv_write_latent (pools compared exactly, incl. a row outside the context) and
 *     attention_latent: decode rows (split-K), prefill + decode batches without host copies,
 *     DSA selections with -1 padding, out-of-range and evicted entries, GLM-5 sizes (576/512, 64
 *     heads; the register-tiled kernel) and an unaligned D (the reference kernel);
 *   - dsa_topk: the same selection as the CPU, exactly, incl. exact ties (duplicated keys,
 *     all-zero scores), NaN scores, evicted blocks, dense rows and min_gap; plus an independent
 *     check of the order rule (higher score first, then lower position) on recomputed scores;
 *   - route_group: groups / no groups, bias, ties (quantized logits), norm and scaling;
 *   - matmul_heads (one call for all heads) vs matmul_expert per head, every weight format;
 *   - step graphs: dsa_topk + attention_latent recorded once, replayed at other positions =
 *     eager; a dense-only recording (sel NULL below index_topk) is refused;
 *   - the cache writes, attention and indexer again on bf16 latent pages (written pools bit for
 *     bit, the same bounds and the same selections as on f32 pages).
 * Part of cuda_ops_tests.h (uses its helpers); not a standalone header.
 */

static int same_or_nan(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) return 0;
    return 1;
}

TEST(cuda_glm_small_ops) {
    const tern_glm_ops *R = g_ref->vt->glm, *G = g_gpu->vt->glm;
    CHECK(R && G, "glm op tables: ref %p cuda %p", (const void *)R, (const void *)G);
    if (!R || !G) return;
    /* copy_2d between offset column blocks */
    float src[7 * 13], dst[7 * 9];
    for (int i = 0; i < 7 * 13; i++) src[i] = test_randf(&g_seed);
    for (int i = 0; i < 7 * 9; i++) dst[i] = 99.0f;
    void *sd = to_gpu(src, sizeof src), *dd = to_gpu(dst, sizeof dst);
    R->copy_2d(g_ref, dst + 2, 9, src + 3, 13, 7, 5);
    G->copy_2d(g_gpu, (float *)dd + 2, 9, (const float *)sd + 3, 13, 7, 5);
    float *dg = from_gpu(g_gpu, dd, 7 * 9);
    CHECK(!memcmp(dg, dst, sizeof dst), "copy_2d differs");
    g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, dd); free(dg);

    /* layernorm */
    static const int LN[][2] = {{3, 10}, {5, 128}, {2, 1000}, {4, 32}};
    for (size_t c = 0; c < TERN_ARRAY_LEN(LN); c++)
        for (int v = 0; v < 3; v++) { /* 0: w+b, 1: none, 2: w+b in place */
            int rows = LN[c][0], d = LN[c][1];
            size_t n = (size_t)rows * d;
            float *x = rnd(n, 3.0f), *w = rnd((size_t)d, 1.0f), *b = rnd((size_t)d, 1.0f), *yr = malloc(n * 4);
            for (size_t i = 0; i < n; i++) x[i] += 0.7f; /* a non-zero mean */
            void *xd = to_gpu(x, n * 4), *wd = to_gpu(w, (size_t)d * 4), *bd = to_gpu(b, (size_t)d * 4);
            void *yd = v == 2 ? xd : nan_buf(g_gpu, n);
            R->layernorm(g_ref, yr, x, rows, d, v == 1 ? NULL : w, v == 1 ? NULL : b, 1e-6f);
            G->layernorm(g_gpu, yd, xd, rows, d, v == 1 ? NULL : wd, v == 1 ? NULL : bd, 1e-6f);
            float *yg = from_gpu(g_gpu, yd, n);
            double rel = rel_or_nan(yg, yr, n);
            printf("  err glm layernorm rows=%d d=%d v%d  %.2e\n", rows, d, v, rel);
            CHECK(rel <= 2e-6, "layernorm rows %d d %d variant %d rel %.2e", rows, d, v, rel);
            if (v != 2) g_gpu->vt->free(g_gpu, yd);
            g_gpu->vt->free(g_gpu, xd); g_gpu->vt->free(g_gpu, wd); g_gpu->vt->free(g_gpu, bd);
            free(x); free(w); free(b); free(yr); free(yg);
        }

    /* interleaved rope on a slice, and on whole heads */
    static const int RP[][5] = {{3, 4, 48, 32, 16}, {5, 1, 40, 32, 8}, {2, 8, 32, 0, 32}, {33, 16, 192, 128, 64}};
    for (size_t c = 0; c < TERN_ARRAY_LEN(RP); c++) {
        int n = RP[c][0], nh = RP[c][1], hs = RP[c][2], off = RP[c][3], d = RP[c][4];
        size_t tot = (size_t)n * nh * hs;
        float *x = rnd(tot, 2.0f), *inv = malloc(sizeof(float) * (size_t)(d / 2));
        for (int i = 0; i < d / 2; i++) inv[i] = i % 5 == 3 ? 0.0f : powf(10000.0f, -2.0f * i / d);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
        for (int r = 0; r < n; r++) pos[r] = (int32_t)(test_rand_u64(&g_seed) % 100000);
        void *xd = to_gpu(x, tot * 4), *id = to_gpu(inv, (size_t)(d / 2) * 4), *pd = to_gpu(pos, (size_t)n * 4);
        R->rope_interleaved(g_ref, x, n, nh, hs, off, d, pos, inv, 1.3f);
        G->rope_interleaved(g_gpu, xd, n, nh, hs, off, d, pd, id, 1.3f);
        float *xg = from_gpu(g_gpu, xd, tot);
        double rel = rel_or_nan(xg, x, tot);
        printf("  err glm rope_interleaved n=%d nh=%d d=%d  %.2e\n", n, nh, d, rel);
        CHECK(rel <= 1e-6, "rope_interleaved case %zu rel %.2e", c, rel);
        g_gpu->vt->free(g_gpu, xd); g_gpu->vt->free(g_gpu, id); g_gpu->vt->free(g_gpu, pd);
        free(x); free(inv); free(pos); free(xg);
    }
}

/* ---- a latent cache on both backends ---- */

typedef struct lcache {
    tern_kv_layer kr, kg;     /* host view (cpu-ref), device view */
    float *kh, *vh;           /* host pools (bf: bf16 records, the pointers typed float only for the f32 form) */
    int bf;
    int32_t *bt;              /* host block table */
    int nslots, lens[4], nblk;
} lcache;

/* Pools of nslots x max_blocks blocks (shuffled), NaN-filled; slot s holds lens[s] records
 * written by one kv_write_latent call (plus a row outside the context, which is skipped).
 * distinct > 0: indexer keys are drawn from that many distinct vectors (exact score ties). bf: bf16 pages (the NaN
 * fill is the same bf16 NaN on both sides; the written records must then match bit for bit). */
static void lcache_make(lcache *c, int D, int Dv, int bs, int nslots, const int *lens, int distinct, int bf) {
    memset(c, 0, sizeof *c);
    c->bf = bf;
    const size_t es = bf ? 2 : 4;
    int maxlen = 0;
    for (int s = 0; s < nslots; s++) maxlen = TERN_MAX(maxlen, lens[s]), c->lens[s] = lens[s];
    int mb = (maxlen + bs - 1) / bs + 1;
    c->nslots = nslots;
    c->nblk = nslots * mb + 2;
    size_t pk = (size_t)c->nblk * bs * D, pv = (size_t)c->nblk * bs * Dv;
    c->kh = malloc(pk * es);
    c->vh = Dv ? malloc(pv * es) : NULL;
    for (size_t i = 0; i < pk; i++) bf ? (void)(((uint16_t *)c->kh)[i] = 0x7fc0) : (void)(c->kh[i] = NAN);
    for (size_t i = 0; Dv && i < pv; i++) bf ? (void)(((uint16_t *)c->vh)[i] = 0x7fc0) : (void)(c->vh[i] = NAN);
    c->bt = malloc(sizeof(int32_t) * (size_t)nslots * mb);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)c->nblk);
    for (int i = 0; i < c->nblk; i++) perm[i] = i;
    for (int i = c->nblk - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(&g_seed) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < nslots * mb; i++) c->bt[i] = perm[i];
    free(perm);
    c->kr = (tern_kv_layer){.dtype = bf ? TERN_DT_BF16 : TERN_DT_F32, .n_head_kv = 1, .head_dim = D, .block_size = bs,
                            .k = c->kh, .v = c->vh, .block_table = c->bt, .max_blocks = mb, .latent = 1, .v_dim = Dv};
    c->kg = c->kr;
    c->kg.k = to_gpu(c->kh, pk * es); /* the host pools' NaN fill */
    c->kg.v = Dv ? to_gpu(c->vh, pv * es) : NULL;
    c->kg.block_table = to_gpu(c->bt, sizeof(int32_t) * (size_t)nslots * mb);
    int n = 1;
    for (int s = 0; s < nslots; s++) n += lens[s];
    int32_t *pos = malloc(sizeof(int32_t) * n), *slot = malloc(sizeof(int32_t) * n);
    int r = 0;
    for (int s = 0; s < nslots; s++)
        for (int p = 0; p < lens[s]; p++) pos[r] = p, slot[r++] = s;
    pos[r] = mb * bs + 3, slot[r++] = 0; /* outside the block table: never written */
    float *k = rnd((size_t)n * D, 1.0f), *v = Dv ? rnd((size_t)n * Dv, 1.0f) : NULL;
    if (distinct > 0)
        for (int i = distinct; i < n; i++) memcpy(v + (size_t)i * Dv, v + (size_t)(i % distinct) * Dv, sizeof(float) * Dv);
    void *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4), *kd = to_gpu(k, (size_t)n * D * 4);
    void *vd = Dv ? to_gpu(v, (size_t)n * Dv * 4) : NULL;
    tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, pos, slot};
    g_ref->vt->glm->kv_write_latent(g_ref, &c->kr, &rr, k, v);
    g_gpu->vt->glm->kv_write_latent(g_gpu, &c->kg, &rg, kd, vd);
    float *kg = from_gpu(g_gpu, c->kg.k, bf ? (pk + 1) / 2 : pk), *vg = Dv ? from_gpu(g_gpu, c->kg.v, bf ? (pv + 1) / 2 : pv) : NULL;
    if (bf) /* bit for bit: CUDA's __float2bfloat16_rn and tern_f32_to_bf16 round the same way */
        CHECK(!memcmp(kg, c->kh, pk * 2) && (!Dv || !memcmp(vg, c->vh, pv * 2)), "kv_write_latent bf16 pools differ (D %d Dv %d)",
              D, Dv);
    else
        CHECK(same_or_nan(kg, c->kh, pk) && (!Dv || same_or_nan(vg, c->vh, pv)), "kv_write_latent pools differ (D %d Dv %d)",
              D, Dv);
    g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, kd); g_gpu->vt->free(g_gpu, vd);
    free(pos); free(slot); free(k); free(v); free(kg); free(vg);
}

static void lcache_evict(lcache *c, int slot, int blk) { /* block blk of slot is no longer resident */
    c->bt[slot * c->kr.max_blocks + blk] = -1;
    g_gpu->vt->upload(g_gpu, (void *)c->kg.block_table, c->bt, sizeof(int32_t) * (size_t)c->nslots * c->kr.max_blocks);
}

static void lcache_free(lcache *c) {
    g_gpu->vt->free(g_gpu, c->kg.k);
    g_gpu->vt->free(g_gpu, c->kg.v);
    g_gpu->vt->free(g_gpu, (void *)c->kg.block_table);
    free(c->kh); free(c->vh); free(c->bt);
}

/* query rows: variant 0 one decode row per slot; 1 the last P positions of slot 0 + decode rows */
static int lrows(const lcache *c, int variant, int P, int32_t *pos, int32_t *slot) {
    int n = 0;
    if (variant == 1)
        for (int i = 0; i < P; i++) pos[n] = c->lens[0] - P + i, slot[n++] = 0;
    for (int s = 0; s < c->nslots; s++) pos[n] = c->lens[s] - 1, slot[n++] = s;
    return n;
}

TEST(cuda_glm_latent_attention) {
    static const struct { int D, dv, nh, bs, lens[3], P, ksel; } C[] = {
        {48, 32, 4, 4, {37, 9, 130}, 12, 8},
        {20, 16, 3, 4, {50, 1, 17}, 20, 16},
        {576, 512, 16, 16, {300, 40, 7}, 9, 64},
        {96, 64, 40, 8, {260, 100, 33}, 5, 32},
        {576, 512, 64, 16, {700, 20, 3}, 6, 256},  /* GLM-5: 4 head blocks (register-tiled kernel) */
        {576, 256, 20, 16, {90, 33, 2}, 7, 48},    /* a partial head block, half the P·V threads */
        {22, 14, 5, 4, {40, 11, 3}, 9, 16},        /* D % 4 != 0: the reference kernel */
    };
    for (size_t cb = 0; cb < 2 * TERN_ARRAY_LEN(C); cb++) { /* every case on f32, then on bf16 pages */
        const size_t ci = cb % TERN_ARRAY_LEN(C);
        const int bf = cb >= TERN_ARRAY_LEN(C);
        lcache c;
        lcache_make(&c, C[ci].D, 0, C[ci].bs, 3, C[ci].lens, 0, bf);
        lcache_evict(&c, 0, 1);
        int D = C[ci].D, dv = C[ci].dv, nh = C[ci].nh, K = C[ci].ksel;
        for (int v = 0; v < 4; v++) { /* 0/1: rows variant, dense; 2/3: same with a selection */
            int32_t pos[64], slot[64];
            int n = lrows(&c, v & 1, C[ci].P, pos, slot);
            size_t qn = (size_t)n * nh * D, on = (size_t)n * nh * dv;
            float *q = rnd(qn, 1.0f), *orf = malloc(on * 4);
            int32_t *sel = NULL;
            if (v >= 2) { /* random ascending subsets, -1 padded, with junk entries */
                sel = malloc(sizeof(int32_t) * (size_t)n * K);
                for (int r = 0; r < n; r++) {
                    int m = 0;
                    for (int b = 0; b <= pos[r] && m < K; b++)
                        if (test_rand_u64(&g_seed) % 3 == 0 || pos[r] < K) sel[r * K + m++] = b;
                    if (m < K) sel[r * K + m++] = pos[r] + 5; /* beyond the row: ignored */
                    while (m < K) sel[r * K + m++] = -1;
                }
            }
            void *qd = to_gpu(q, qn * 4), *od = nan_buf(g_gpu, on), *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4);
            void *seld = sel ? to_gpu(sel, sizeof(int32_t) * (size_t)n * K) : NULL;
            int hostcopies = v == 0 || v == 2;
            tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, hostcopies ? pos : NULL, hostcopies ? slot : NULL};
            float scale = 1.7f / sqrtf((float)D);
            g_ref->vt->glm->attention_latent(g_ref, orf, q, &rr, nh, &c.kr, dv, scale, sel, K);
            g_gpu->vt->glm->attention_latent(g_gpu, od, qd, &rg, nh, &c.kg, dv, scale, seld, K);
            float *og = from_gpu(g_gpu, od, on);
            double rel = rel_or_nan(og, orf, on);
            printf("  err glm attention_latent D=%d dv=%d nh=%d variant %d%s  %.2e\n", D, dv, nh, v, bf ? " bf16" : "", rel);
            CHECK(rel <= 1e-5, "attention_latent case %zu variant %d%s rel %.2e", ci, v, bf ? " bf16" : "", rel);
            g_gpu->vt->free(g_gpu, qd); g_gpu->vt->free(g_gpu, od); g_gpu->vt->free(g_gpu, pd);
            g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, seld);
            free(q); free(orf); free(og); free(sel);
        }
        lcache_free(&c);
    }
}

/* ---- DSA indexer ---- */

/* the indexer score of key record kb for query row (qr, wr), in the spec's f32 order */
static float dsa_score_ref(const float *qr, const float *wr, const float *kb, int nh, int Dv, float scale) {
    float score = 0.0f;
    for (int j = 0; j < nh; j++) {
        float dot = 0.0f;
        for (int c = 0; c < Dv; c++) dot += qr[j * Dv + c] * kb[c];
        dot *= scale;
        if (dot > 0.0f) score += wr[j] * dot;
    }
    return score;
}

/* a ranks above b: higher score, then lower position; NaN lowest */
static int dsa_above(float sa, int pa, float sb, int pb) {
    if (isnan(sa)) return isnan(sb) && pa < pb;
    if (isnan(sb)) return 1;
    return sa > sb || (sa == sb && pa < pb);
}

/* independent check of one sparse row's selection: sorted, resident, right size, and every
 * selected key ranks above every resident key left out */
static int dsa_rule_ok(const lcache *c, const int32_t *sel, int k, int a, int s, const float *qr, const float *wr,
                       int nh, float scale) {
    int Dv = c->kr.v_dim, bs = c->kr.block_size, mb = c->kr.max_blocks, nres = 0, m = 0;
    float *sc = malloc(sizeof(float) * (size_t)(a + 1));
    char *in = calloc((size_t)a + 1, 1);
    for (int b = 0; b <= a; b++) {
        int blk = b / bs < mb ? c->bt[s * mb + b / bs] : -1;
        sc[b] = NAN;
        if (blk < 0) continue;
        nres++;
        sc[b] = dsa_score_ref(qr, wr, c->vh + ((size_t)blk * bs + b % bs) * Dv, nh, Dv, scale);
        in[b] = 2; /* resident */
    }
    int ok = 1;
    for (int i = 0; i < k; i++) {
        int b = sel[i];
        if (b < 0) { ok &= i >= TERN_MIN(k, nres); continue; }
        ok &= b <= a && in[b] == 2 && (m == 0 || b > sel[i - 1]);
        if (b <= a) in[b] = 3;
        m++;
    }
    ok &= m == TERN_MIN(k, nres);
    int worst = -1, best = -1; /* worst selected, best left out */
    for (int b = 0; b <= a && ok; b++) {
        if (in[b] == 3 && (worst < 0 || dsa_above(sc[worst], worst, sc[b], b))) worst = b;
        if (in[b] == 2 && (best < 0 || dsa_above(sc[b], b, sc[best], best))) best = b;
    }
    if (ok && worst >= 0 && best >= 0) ok = dsa_above(sc[worst], worst, sc[best], best);
    free(sc);
    free(in);
    return ok;
}

TEST(cuda_glm_dsa_topk) {
    static const struct { int Dv, nh, bs, k, lens[3], distinct; } C[] = {
        {32, 8, 4, 8, {40, 8, 25}, 0},
        {32, 8, 16, 64, {700, 64, 300}, 0},
        {32, 8, 16, 64, {700, 65, 300}, 5},   /* duplicated keys: exact score ties */
        {128, 32, 64, 300, {1000, 301, 520}, 0},
        {24, 2, 8, 16, {200, 90, 17}, 3},      /* few heads: all-zero scores are common */
    };
    for (size_t cb = 0; cb < 2 * TERN_ARRAY_LEN(C); cb++) { /* every case on f32, then on bf16 pages */
        const size_t ci = cb % TERN_ARRAY_LEN(C);
        const int bf = cb >= TERN_ARRAY_LEN(C);
        lcache c;
        int Dv = C[ci].Dv, nh = C[ci].nh, k = C[ci].k;
        lcache_make(&c, 8, Dv, C[ci].bs, 3, C[ci].lens, C[ci].distinct, bf);
        lcache_evict(&c, 0, 2);
        for (int v = 0; v < 2; v++) {
            int32_t pos[64], slot[64];
            int n = lrows(&c, 1, 6, pos, slot);
            pos[n] = k / 2, slot[n++] = 2;  /* a dense row */
            pos[n] = C[ci].lens[0] - 1, slot[n++] = 0; /* weights all zero: every score 0 */
            pos[n] = C[ci].lens[2] - 1, slot[n++] = 2; /* w[0] = NaN: NaN scores */
            float *q = rnd((size_t)n * nh * Dv, 1.0f), *w = rnd((size_t)n * nh, 1.0f);
            for (int j = 0; j < nh; j++) w[(n - 2) * nh + j] = 0.0f;
            w[(n - 1) * nh] = NAN;
            int32_t *sr = malloc(sizeof(int32_t) * (size_t)n * k), *sg = malloc(sizeof(int32_t) * (size_t)n * k);
            void *qd = to_gpu(q, (size_t)n * nh * Dv * 4), *wd = to_gpu(w, (size_t)n * nh * 4);
            void *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4), *seld = nan_buf(g_gpu, (size_t)n * k);
            tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, v ? NULL : pos, v ? NULL : slot};
            float scale = 1.0f / sqrtf((float)Dv), gr = NAN, gg = NAN;
            g_ref->vt->glm->dsa_topk(g_ref, sr, q, w, &rr, nh, &c.kr, scale, k, &gr);
            g_gpu->vt->glm->dsa_topk(g_gpu, seld, qd, wd, &rg, nh, &c.kg, scale, k, &gg);
            g_gpu->vt->download(g_gpu, sg, seld, sizeof(int32_t) * (size_t)n * k);
            int same = !memcmp(sr, sg, sizeof(int32_t) * (size_t)n * k), rule = 1, bad = -1;
            for (int r = 0; r < n; r++)
                if (!bf && pos[r] + 1 > k && !dsa_rule_ok(&c, sg + (size_t)r * k, k, pos[r], slot[r], q + (size_t)r * nh * Dv,
                                                   w + (size_t)r * nh, nh, scale)) rule = 0, bad = r;
            int zero_ok = 1; /* the all-zero row: the lowest resident positions */
            for (int i = 0, b = 0; i < k && zero_ok; i++, b++) {
                while (c.bt[b / C[ci].bs] < 0) b++;
                zero_ok = sg[(size_t)(n - 2) * k + i] == b;
            }
            printf("  err glm dsa_topk Dv=%d nh=%d k=%d variant %d%s: %s, min_gap cpu %.3g cuda %.3g\n", Dv, nh, k, v,
                   bf ? " bf16" : "", same ? "same selection" : "DIFFERENT", gr, gg);
            CHECK(same, "dsa_topk case %zu variant %d: selection differs from the CPU", ci, v);
            CHECK(rule, "dsa_topk case %zu variant %d: row %d breaks the order rule", ci, v, bad);
            CHECK(zero_ok, "dsa_topk case %zu: all-zero scores must select the lowest positions", ci);
            CHECK(gr == gg || (isnan(gr) && isnan(gg)), "dsa_topk case %zu min_gap cpu %g cuda %g", ci, gr, gg);
            g_gpu->vt->free(g_gpu, qd); g_gpu->vt->free(g_gpu, wd); g_gpu->vt->free(g_gpu, pd);
            g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, seld);
            free(q); free(w); free(sr); free(sg);
        }
        lcache_free(&c);
    }
}

/* ---- grouped sigmoid router ---- */

TEST(cuda_glm_route_group) {
    static const struct { int E, k, G, Gk, norm; float scaling; int n; } C[] = {
        {256, 8, 8, 4, 1, 2.5f, 37}, {256, 8, 1, 1, 1, 1.0f, 5}, {64, 6, 4, 2, 0, 1.5f, 9}, {8, 2, 4, 2, 1, 1.0f, 33},
        {160, 8, 1, 1, 1, 2.5f, 3}, {384, 8, 8, 3, 1, 1.0f, 2},
    };
    for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++)
        for (int v = 0; v < 3; v++) { /* 0: bias, 1: no bias, 2: quantized logits + bias (ties) */
            int E = C[ci].E, k = C[ci].k, n = C[ci].n;
            float *lg = rnd((size_t)n * E, 3.0f), *bias = rnd((size_t)E, 0.1f), *wr = malloc(sizeof(float) * n * k);
            if (v == 2) {
                for (size_t i = 0; i < (size_t)n * E; i++) lg[i] = roundf(lg[i]);
                for (int e = 0; e < E; e++) bias[e] = 0.25f * roundf(bias[e] * 20.0f);
            }
            int32_t *ir = malloc(sizeof(int32_t) * n * k), *ig = malloc(sizeof(int32_t) * n * k);
            void *lgd = to_gpu(lg, (size_t)n * E * 4), *bd = to_gpu(bias, (size_t)E * 4);
            void *id = g_gpu->vt->alloc(g_gpu, sizeof(int32_t) * n * k), *wd = nan_buf(g_gpu, (size_t)n * k);
            tern_route_group pr = {C[ci].G, C[ci].Gk, C[ci].norm, C[ci].scaling, v == 1 ? NULL : bias}, pg = pr;
            pg.bias = v == 1 ? NULL : bd;
            g_ref->vt->glm->route_group(g_ref, ir, wr, lg, n, E, k, &pr);
            g_gpu->vt->glm->route_group(g_gpu, id, wd, lgd, n, E, k, &pg);
            g_gpu->vt->download(g_gpu, ig, id, sizeof(int32_t) * n * k);
            float *wg = from_gpu(g_gpu, wd, (size_t)n * k);
            int same = !memcmp(ir, ig, sizeof(int32_t) * n * k);
            double rel = rel_or_nan(wg, wr, (size_t)n * k);
            CHECK(same && rel <= 1e-6, "route_group E %d k %d G %d/%d variant %d: idx %s, wts rel %.2e", E, k, C[ci].G,
                  C[ci].Gk, v, same ? "same" : "differ", rel);
            g_gpu->vt->free(g_gpu, lgd); g_gpu->vt->free(g_gpu, bd); g_gpu->vt->free(g_gpu, id); g_gpu->vt->free(g_gpu, wd);
            free(lg); free(bias); free(wr); free(ir); free(ig); free(wg);
        }
}

/* ---- step graphs ---- */

TEST(cuda_glm_graph) {
    if (!g_gpu->vt->graph_begin) { SKIP("cuda_glm_graph", "backend has no graphs"); return; }
    const tern_glm_ops *G = g_gpu->vt->glm;
    const int D = 48, dv = 32, Dv = 32, nh = 4, ni = 8, K = 16, lens[2] = {120, 60};
    lcache c;
    lcache_make(&c, D, Dv, 8, 2, lens, 0, 0);
    float *q = rnd((size_t)nh * D, 1.0f), *iq = rnd((size_t)ni * Dv, 1.0f), *iw = rnd((size_t)ni, 1.0f);
    void *qd = to_gpu(q, sizeof(float) * nh * D), *iqd = to_gpu(iq, sizeof(float) * ni * Dv), *iwd = to_gpu(iw, 4 * ni);
    void *od = g_gpu->vt->alloc(g_gpu, sizeof(float) * nh * dv), *seld = g_gpu->vt->alloc(g_gpu, sizeof(int32_t) * K);
    int32_t p = 100, s = 0;
    void *pd = to_gpu(&p, 4), *sd = to_gpu(&s, 4);
    unsigned char eager[4 * (4 * 32 + 16)], replay[sizeof eager];
    size_t ob = sizeof replay, osel = sizeof(float) * nh * dv;
#define GLM_STEP(buf, dense)                                                                                      \
    do {                                                                                                          \
        tern_rows rows = {1, pd, sd, &p, &s};                                                                     \
        if (!(dense)) G->dsa_topk(g_gpu, seld, iqd, iwd, &rows, ni, &c.kg, 0.2f, K, NULL);                       \
        G->attention_latent(g_gpu, od, qd, &rows, nh, &c.kg, dv, 0.15f, (dense) ? NULL : seld, K);              \
        g_gpu->vt->download(g_gpu, (buf), od, osel);                                                              \
        g_gpu->vt->download(g_gpu, (buf) + osel, seld, sizeof(int32_t) * K);                                      \
    } while (0)
    CHECK(g_gpu->vt->graph_begin(g_gpu, 0x61, replay, ob) == 1, "graph_begin");
    GLM_STEP(replay, 0);
    CHECK(g_gpu->vt->graph_end(g_gpu, 1) == 1, "graph_end refused the GLM step");
    static const int32_t P[][2] = {{119, 0}, {10, 1}, {59, 1}, {16, 0}};
    for (int i = 0; i < 4; i++) {
        p = P[i][0];
        s = P[i][1];
        g_gpu->vt->upload(g_gpu, pd, &p, 4);
        g_gpu->vt->upload(g_gpu, sd, &s, 4);
        GLM_STEP(eager, 0);
        memset(replay, 0xff, sizeof replay);
        CHECK(g_gpu->vt->graph_replay(g_gpu, 0x61, replay, ob) == 1, "replay at %d", p);
        CHECK(!memcmp(replay + osel, eager + osel, sizeof(int32_t) * K), "replayed selection differs at pos %d", p);
        double rel = rel_or_nan((float *)replay, (float *)eager, (size_t)nh * dv);
        printf("  err glm graph replay pos %d  %.2e\n", p, rel);
        CHECK(rel <= 1e-5, "graph replay at pos %d differs from eager: rel %.2e", p, rel);
    }
    /* dense attention below index_topk only: the graph would be wrong past K -> refused */
    p = 5;
    g_gpu->vt->upload(g_gpu, pd, &p, 4);
    CHECK(g_gpu->vt->graph_begin(g_gpu, 0x62, replay, ob) == 1, "graph_begin 2");
    GLM_STEP(replay, 1);
    CHECK(g_gpu->vt->graph_end(g_gpu, 1) == 0, "graph_end kept a dense-only GLM step");
#undef GLM_STEP
    g_gpu->vt->graph_reset(g_gpu);
    void *bufs[] = {qd, iqd, iwd, od, seld, pd, sd};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g_gpu->vt->free(g_gpu, bufs[i]);
    lcache_free(&c);
    free(q); free(iq); free(iw);
}

/* matmul_heads vs cpu-ref's matmul_expert per head on gathered rows (what glm5.c did before):
 * the GLM-5 shapes (W_UK 512x192 from q [n, H, 256], W_UV 256x512 from ō [n, H, 512]) and odd
 * ones (generic decoder, in not a multiple of 8), decode and prefill row counts, both modes. */
static void check_heads(const hw *h, int n, int nh, int ldx, int hx, int ldy, int hy, double rel[2]) {
    tern_tensor tr = h->t;
    tern_error err = {0};
    rel[0] = rel[1] = INFINITY;
    if (g_ref->vt->upload_weight(g_ref, &tr, &err)) { printf("  upload_weight: %s\n", err.msg); return; }
    int out = (int)h->t.shape[1], in = (int)h->t.shape[2];
    size_t nx = (size_t)n * ldx, ny = (size_t)n * ldy, nc = (size_t)n * nh * out;
    float *x = rnd(nx, 1.0f), *yr = malloc(nc * 4), *xa = malloc((size_t)n * in * 4), *ya = malloc((size_t)n * out * 4);
    float *yc = malloc(nc * 4);
    for (int e = 0; e < nh; e++) {
        for (int r = 0; r < n; r++) memcpy(xa + (size_t)r * in, x + (size_t)r * ldx + (size_t)e * hx, (size_t)in * 4);
        g_ref->vt->matmul_expert(g_ref, ya, xa, n, &tr, e);
        for (int r = 0; r < n; r++) memcpy(yr + ((size_t)r * nh + e) * out, ya + (size_t)r * out, (size_t)out * 4);
    }
    tern_backend *gb[2] = {g_gpu, g_gpu16};
    for (int m = 0; m < 2; m++) {
        tern_backend *gpu = gb[m];
        tern_tensor tg = h->t;
        if (!gpu || gpu->vt->upload_weight(gpu, &tg, &err)) continue;
        void *xd = to_gpu(x, nx * 4), *yd = nan_buf(gpu, ny);
        gpu->vt->glm->matmul_heads(gpu, yd, ldy, hy, xd, ldx, hx, n, nh, &tg);
        float *yg = from_gpu(gpu, yd, ny);
        for (int r = 0; r < n; r++) /* the heads' columns only (the rest stays NaN) */
            for (int e = 0; e < nh; e++)
                memcpy(yc + ((size_t)r * nh + e) * out, yg + (size_t)r * ldy + (size_t)e * hy, (size_t)out * 4);
        rel[m] = rel_or_nan(yc, yr, nc);
        gpu->vt->free_weight(gpu, &tg);
        gpu->vt->free(gpu, xd); gpu->vt->free(gpu, yd);
        free(yg);
    }
    free(x); free(yr); free(xa); free(ya); free(yc);
}

TEST(cuda_glm_matmul_heads) {
    CHECK(g_gpu->vt->glm && g_gpu->vt->glm->matmul_heads, "cuda backend has no matmul_heads");
    if (!g_gpu->vt->glm || !g_gpu->vt->glm->matmul_heads) return;
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; } F[] = {
        {TERN_DT_BF16, 0, 0, 0}, {TERN_DT_Q, 4, 64, TERN_DT_BF16}, {TERN_DT_F32, 0, 0, 0}, {TERN_DT_F16, 0, 0, 0},
        {TERN_DT_Q, 8, 32, TERN_DT_F16}, {TERN_DT_Q, 3, 64, TERN_DT_BF16},
    };
    /* nh, out, in, ldx, hx, ldy, hy */
    static const int S[][7] = {{64, 512, 192, 64 * 256, 256, 64 * 576, 576}, {64, 256, 512, 64 * 512, 512, 64 * 256, 256},
                               {3, 40, 24, 3 * 24, 24, 3 * 40, 40}, {5, 17, 36, 5 * 40 + 3, 40, 5 * 20, 20}};
    static const int NS[] = {1, 2, 5, 8, 13, 40, 100};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++)
        for (size_t s = 0; s < TERN_ARRAY_LEN(S); s++) {
            if (F[f].dt == TERN_DT_Q && S[s][2] % F[f].gs) continue;
            hw h = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, S[s][0], S[s][1], S[s][2], 0);
            char nm[64];
            fmt_name(&h.t, nm, sizeof nm);
            for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
                int n = NS[i];
                if (S[s][0] == 64 && (n == 2 || n == 8 || (n == 100 && f > 1))) continue; /* keep the test short */
                double rel[2];
                check_heads(&h, n, S[s][0], S[s][3], S[s][4], S[s][5], S[s][6], rel);
                printf("  err glm matmul_heads %-14s %dx%dx%d n=%-3d f32 %.2e bf16 %.2e\n", nm, S[s][0], S[s][1],
                       S[s][2], n, rel[0], rel[1]);
                CHECK(rel[0] <= 1e-5, "matmul_heads %s shape %zu n=%d rel %.3e", nm, s, n, rel[0]);
                if (g_gpu16)  /* GEMV rows (<= 16; packed <= 32) are exact f32 in both modes; more: split-bf16 GEMM */
                    CHECK(rel[1] <= (n > 16 ? 1e-4 : 1e-5), "matmul_heads %s shape %zu n=%d bf16 mode rel %.3e", nm, s,
                          n, rel[1]);
            }
            free_w(&h);
        }
}

static void cuda_glm_tests(void) {
    RUN(cuda_glm_matmul_heads);
    RUN(cuda_glm_small_ops);
    RUN(cuda_glm_latent_attention);
    RUN(cuda_glm_dsa_topk);
    RUN(cuda_glm_route_group);
    RUN(cuda_glm_graph);
}
