/*
 * cuda_ops_tests_attn.h — attention (paged KV, prefill/decode/mixed batches, GQA, sliding
 * window with evicted blocks, softcap, head_dim up to 512), router top-k and the MoE expert
 * MLP (including gate/up as strided views of one fused [E, 2I, H] stack), bidirectional span
 * ranges (tern_rows.vis_lo/vis_hi; never kept in a graph), CUDA vs cpu-ref.
 * Part of cuda_ops_tests.h (uses its helpers); not a standalone header.
 */

/* One attention scenario. variant 0: prefill rows of slot 0 (host copies given: row tiling);
 * 1: one decode row per slot (split-K); 2: both in one batch without host copies; 3: both with
 * host copies (a prefill run for the tensor-core kernel next to decode rows). Runs on g_attn
 * (g_gpu when NULL). */
static tern_backend *g_attn;
static int g_attn_bf16; /* 1: BF16 pages (--kv-quant bf16) instead of F32; 2: F16 pages */
static int g_attn_hole; /* 1: each slot's second block is not resident (a hole inside the visible keys where the
                         * slot has >= 3 blocks: key pos stays resident) */
static float **g_attn_keep; /* non-NULL: attn_case leaves its GPU output there (the caller frees it) */
static int g_attn_late; /* 1: slot 0's last key is written by a kv_write launched right before the attention */
static double attn_case(int nh, int nkv, int d, int window, float softcap, int bs, int nslots, const int *lens, int P,
                        int variant) {
    int maxlen = 0;
    for (int s = 0; s < nslots; s++) maxlen = lens[s] > maxlen ? lens[s] : maxlen;
    int max_blocks = (maxlen + bs - 1) / bs, nblk = nslots * max_blocks + 3;
    size_t tok = (size_t)nkv * d, pool = (size_t)nblk * bs * tok;
    int32_t *bt = malloc((size_t)nslots * max_blocks * sizeof *bt), *perm = malloc(nblk * sizeof *perm);
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(&g_seed) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < nslots * max_blocks; i++) bt[i] = perm[i];
    float *kh = calloc(pool, sizeof *kh), *vh = calloc(pool, sizeof *vh);
    void *kd = nan_buf(g_gpu, g_attn_bf16 ? pool / 2 : pool), *vd = nan_buf(g_gpu, g_attn_bf16 ? pool / 2 : pool);
    void *btd = to_gpu(bt, (size_t)nslots * max_blocks * sizeof *bt);
    const tern_dtype pdt = g_attn_bf16 ? TERN_DT_Q : TERN_DT_F32;
    tern_kv_layer kr = {pdt, nkv, d, bs, window, kh, vh, bt, max_blocks};
    tern_kv_layer kg = {pdt, nkv, d, bs, window, kd, vd, btd, max_blocks};
    if (g_attn_bf16) kr.kf.kind = kr.vf.kind = kg.kf.kind = kg.vf.kind = g_attn_bf16 == 2 ? TERN_KV_F16 : TERN_KV_BF16;
    /* fill each slot's cache through kv_write */
    float *lk = NULL, *lv = NULL; /* g_attn_late: slot 0's last key, written just before the attention */
    for (int s = 0; s < nslots; s++) {
        int n = lens[s] - (g_attn_late && s == 0);
        if (n < lens[s]) { lk = rnd(tok, 1.0f); lv = rnd(tok, 1.0f); }
        int32_t *pos = malloc(n * sizeof *pos), *slot = malloc(n * sizeof *slot);
        for (int r = 0; r < n; r++) { pos[r] = r; slot[r] = s; }
        float *k = rnd((size_t)n * tok, 1.0f), *v = rnd((size_t)n * tok, 1.0f);
        void *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4), *kdd = to_gpu(k, n * tok * 4), *vdd = to_gpu(v, n * tok * 4);
        tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, pos, slot};
        g_ref->vt->kv_write(g_ref, &kr, &rr, k, v);
        g_gpu->vt->kv_write(g_gpu, &kg, &rg, kdd, vdd);
        g_gpu->vt->sync(g_gpu);
        g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, kdd); g_gpu->vt->free(g_gpu, vdd);
        free(pos); free(slot); free(k); free(v);
    }
    /* the query batch */
    int n = 0;
    int32_t *pos = malloc((P + nslots) * sizeof *pos), *slot = malloc((P + nslots) * sizeof *slot);
    if (variant != 1)
        for (int r = 0; r < P; r++) { pos[n] = lens[0] - P + r; slot[n++] = 0; }
    if (variant != 0)
        for (int s = variant == 3 ? 1 : 0; s < nslots; s++) { pos[n] = lens[s] - 1; slot[n++] = s; }
    /* sliding window: evict blocks no query of the slot can see */
    if (window > 0)
        for (int s = 0; s < nslots; s++) {
            int minq = 1 << 30;
            for (int r = 0; r < n; r++)
                if (slot[r] == s && pos[r] < minq) minq = pos[r];
            for (int b = 0; b < max_blocks; b++)
                if ((b + 1) * bs - 1 < minq - window + 1) bt[s * max_blocks + b] = -1;
        }
    if (g_attn_hole)
        for (int s = 0; s < nslots; s++)
            if ((lens[s] + bs - 1) / bs >= 3) bt[s * max_blocks + 1] = -1;
    g_gpu->vt->upload(g_gpu, btd, bt, (size_t)nslots * max_blocks * sizeof *bt);
    size_t qn = (size_t)n * nh * d;
    float *q = rnd(qn, 1.0f), *or_ = malloc(qn * sizeof *or_);
    void *qd = to_gpu(q, qn * 4), *od = nan_buf(g_gpu, qn), *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4);
    tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, variant == 2 ? NULL : pos, variant == 2 ? NULL : slot};
    float scale = 3.0f / sqrtf((float)d);
    void *lpd = NULL, *lsd = NULL, *lkd = NULL, *lvd = NULL;
    if (lk) { /* the late key: on the CPU now, on the GPU queued right before the attention, no sync between */
        int32_t lp = lens[0] - 1, ls = 0;
        tern_rows lr = {1, &lp, &ls, &lp, &ls};
        lpd = to_gpu(&lp, 4); lsd = to_gpu(&ls, 4); lkd = to_gpu(lk, tok * 4); lvd = to_gpu(lv, tok * 4);
        g_ref->vt->kv_write(g_ref, &kr, &lr, lk, lv);
    }
    g_ref->vt->attention(g_ref, or_, q, &rr, nh, &kr, scale, softcap);
    tern_backend *be = g_attn ? g_attn : g_gpu;
    g_gpu->vt->sync(g_gpu); /* uploads went through g_gpu's stream */
    if (lk) {
        int32_t lp = lens[0] - 1, ls = 0;
        tern_rows lg = {1, lpd, lsd, &lp, &ls};
        be->vt->kv_write(be, &kg, &lg, lkd, lvd);
    }
    be->vt->attention(be, od, qd, &rg, nh, &kg, scale, softcap);
    float *og = from_gpu(be, od, qn);
    double rel = rel_or_nan(og, or_, qn);
    g_gpu->vt->free(g_gpu, kd); g_gpu->vt->free(g_gpu, vd); g_gpu->vt->free(g_gpu, btd); g_gpu->vt->free(g_gpu, qd);
    g_gpu->vt->free(g_gpu, od); g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd);
    if (lk) {
        g_gpu->vt->free(g_gpu, lpd); g_gpu->vt->free(g_gpu, lsd); g_gpu->vt->free(g_gpu, lkd); g_gpu->vt->free(g_gpu, lvd);
    }
    free(lk); free(lv);
    free(bt); free(perm); free(kh); free(vh); free(pos); free(slot); free(q); free(or_);
    if (g_attn_keep) *g_attn_keep = og;
    else free(og);
    return rel;
}

TEST(cuda_attention_prefill_decode) {
    extern int tern__cuda_ad_r1; /* attn_dec_kernel here, not attn_decode_r1.cu (its own test) */
    const int keep_r1 = tern__cuda_ad_r1;
    tern__cuda_ad_r1 = 0;
    static const struct { int nh, nkv, d, window; float cap; int bs; int lens[3]; int P; } C[] = {
        {8, 2, 128, 0, 0.0f, 16, {300, 37, 1}, 70},
        {8, 8, 64, 0, 0.0f, 32, {129, 500, 3}, 129},
        {4, 1, 256, 24, 50.0f, 16, {200, 90, 10}, 45},
        {8, 2, 512, 0, 0.0f, 16, {150, 64, 17}, 33},
        {32, 1, 512, 40, 0.0f, 8, {120, 41, 2}, 20},   /* G = 32 > heads per block: head split */
        {16, 4, 256, 0, 30.0f, 64, {1000, 2, 700}, 9},
    };
    extern unsigned long long tern__cuda_attn_decode_calls;
    extern unsigned long long tern__cuda_attn_decode_cluster_calls;
    extern int tern__cuda_ad_mode, tern__cuda_ad_hsplit, tern__cuda_ad_cluster;
    const int keep = tern__cuda_ad_mode, keep_hs = tern__cuda_ad_hsplit, keep_cl = tern__cuda_ad_cluster;
    /* the tile kernel, attn_decode.cu, with its head split, and (3, 4) with the splits of a row merged
     * in a thread-block cluster of at most 16 / 4 blocks (TERN_CUDA_AD_CLUSTER) */
    for (int mode = 0; mode <= 4; mode++) {
        const unsigned long long cc = tern__cuda_attn_decode_cluster_calls;
        tern__cuda_ad_mode = mode > 0;
        tern__cuda_ad_hsplit = mode >= 2;
        tern__cuda_ad_cluster = mode == 3 ? 16 : mode == 4 ? 4 : 0;
        for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++)
            for (int v = 0; v < 3; v++) {
                const unsigned long long dc = tern__cuda_attn_decode_calls;
                double rel = attn_case(C[c].nh, C[c].nkv, C[c].d, C[c].window, C[c].cap, C[c].bs, 3, C[c].lens, C[c].P, v);
                printf("  err attention nh=%d nkv=%d d=%d W=%d variant %d dec %d  %.2e\n", C[c].nh, C[c].nkv, C[c].d,
                       C[c].window, v, mode, rel);
                CHECK(rel <= 1e-5, "case %zu variant %d mode %d rel %.2e", c, v, mode, rel);
                /* one decode row per slot goes to attn_decode.cu where G <= 8 (G <= 4 at d 512), any G
                 * with the head split */
                const int G = C[c].nh / C[c].nkv, d = C[c].d;
                const int dec = mode >= 1 && v == 1 && (mode >= 2 || (G <= 8 && (d == 512 ? G <= 4 : d <= 256)));
                CHECK((tern__cuda_attn_decode_calls > dc) == dec, "case %zu variant %d mode %d: decode kernel ran %d, "
                      "expected %d", c, v, mode, tern__cuda_attn_decode_calls > dc, dec);
            }
        CHECK((tern__cuda_attn_decode_cluster_calls > cc) == (mode >= 3), "mode %d: cluster launches %llu", mode,
              tern__cuda_attn_decode_cluster_calls - cc);
    }
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_hsplit = keep_hs;
    tern__cuda_ad_cluster = keep_cl;
    tern__cuda_ad_r1 = keep_r1;
}

/* The cluster merge (TERN_CUDA_AD_CLUSTER) does the global merge's arithmetic in the same order: with the
 * same splits (short contexts plan <= 16) one decode row per slot gives the same bits either way, f32 and
 * BF16 pages, d 128 and 512 (G 4 and 2 per block), a sliding window */
TEST(cuda_attention_decode_cluster_bits) {
    extern int tern__cuda_ad_r1; /* attn_dec_kernel here, not attn_decode_r1.cu (its own test) */
    const int keep_r1 = tern__cuda_ad_r1;
    tern__cuda_ad_r1 = 0;
    extern unsigned long long tern__cuda_attn_decode_cluster_calls;
    extern int tern__cuda_ad_mode, tern__cuda_ad_cluster;
    static const struct { int nh, nkv, d, window, bs; int lens[3]; } C[] = {
        {8, 2, 128, 0, 16, {300, 37, 129}}, {8, 4, 512, 0, 16, {150, 64, 17}}, {16, 4, 128, 100, 16, {400, 250, 90}},
    };
    const int keep = tern__cuda_ad_mode, keep_cl = tern__cuda_ad_cluster, keep_bf = g_attn_bf16;
    tern__cuda_ad_mode = 1;
    for (int bf = 0; bf < 2; bf++)
        for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
            float *o[2] = {NULL, NULL};
            double rel[2];
            const uint64_t seed = g_seed;
            const unsigned long long cc = tern__cuda_attn_decode_cluster_calls;
            g_attn_bf16 = bf;
            for (int m = 0; m < 2; m++) {
                g_seed = seed; /* the same cache and queries */
                tern__cuda_ad_cluster = m ? 16 : 0;
                g_attn_keep = &o[m];
                rel[m] = attn_case(C[c].nh, C[c].nkv, C[c].d, C[c].window, 0.0f, C[c].bs, 3, C[c].lens, 0, 1);
                g_attn_keep = NULL;
            }
            const size_t qn = (size_t)3 * C[c].nh * C[c].d;
            printf("  err attention decode cluster case %zu bf16 %d: %.2e / %.2e\n", c, bf, rel[0], rel[1]);
            CHECK(rel[1] <= 1e-5, "case %zu bf16 %d: rel %.2e", c, bf, rel[1]);
            CHECK(tern__cuda_attn_decode_cluster_calls > cc, "case %zu bf16 %d: no cluster launch", c, bf);
            CHECK(o[0] && o[1] && !memcmp(o[0], o[1], qn * sizeof(float)), "case %zu bf16 %d: cluster merge != global merge",
                  c, bf);
            free(o[0]); free(o[1]);
        }
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_cluster = keep_cl;
    g_attn_bf16 = keep_bf;
    tern__cuda_ad_r1 = keep_r1;
}

/* attn_decode1p.cu (TERN_CUDA_AD_1P; forced here for plans with splits too): one decode row per slot within
 * 1e-5 of the CPU, f32 and BF16 pages, head dims 32..256, 1..4 heads per KV head, sliding windows, a softcap,
 * keys past one warp chunk and past all 8 warps' first chunks */
TEST(cuda_attention_decode_1p) {
    extern unsigned long long tern__cuda_attn_decode_1p_calls;
    extern int tern__cuda_ad_mode, tern__cuda_ad_1p;
    static const struct { int nh, nkv, d, window; float cap; int bs; int lens[3]; } C[] = {
        {8, 2, 128, 0, 0.0f, 16, {300, 37, 129}}, {8, 8, 64, 0, 0.0f, 32, {129, 500, 3}},
        {16, 4, 128, 100, 0.0f, 16, {400, 250, 90}}, {4, 1, 256, 24, 50.0f, 16, {200, 90, 10}},
        {4, 2, 32, 0, 0.0f, 8, {1000, 1, 77}},
    };
    const int keep = tern__cuda_ad_mode, keep_1p = tern__cuda_ad_1p, keep_bf = g_attn_bf16;
    tern__cuda_ad_mode = 1;
    tern__cuda_ad_1p = 2;
    for (int bf = 0; bf < 2; bf++)
        for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
            const unsigned long long calls = tern__cuda_attn_decode_1p_calls;
            g_attn_bf16 = bf;
            const double rel = attn_case(C[c].nh, C[c].nkv, C[c].d, C[c].window, C[c].cap, C[c].bs, 3, C[c].lens, 0, 1);
            printf("  err attention decode 1p case %zu bf16 %d: %.2e\n", c, bf, rel);
            CHECK(rel <= 1e-5, "case %zu bf16 %d: rel %.2e", c, bf, rel);
            CHECK(tern__cuda_attn_decode_1p_calls > calls, "case %zu bf16 %d: the one-pass kernel did not run", c, bf);
        }
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_1p = keep_1p;
    g_attn_bf16 = keep_bf;
}

/* The tensor-core decode attention's cases (attn_decode_tc.cu, one pass and split over the keys): head dims 64 /
 * 128 / 256 / 512, 1..8 heads per KV head, sliding windows, softcaps, a block not resident inside the visible keys
 * (hole), lengths of 1, 2, 3, multiples of the 16-key chunk and not, keys past every warp's first chunk and past
 * one record tile (1024 keys) */
typedef struct { int nh, nkv, d, window; float cap; int bs, hole; int lens[3]; } ad_tc_case;
static const ad_tc_case AD_TC_CASES[] = {
    {8, 2, 128, 0, 0.0f, 16, 0, {300, 37, 129}}, {8, 8, 64, 0, 0.0f, 32, 1, {129, 500, 3}},
    {16, 4, 128, 100, 0.0f, 16, 0, {400, 250, 90}}, {4, 1, 256, 24, 50.0f, 16, 0, {200, 90, 10}},
    {4, 2, 64, 0, 0.0f, 8, 1, {1000, 1, 77}}, {32, 4, 128, 0, 0.0f, 16, 1, {170, 17, 2}},
    {12, 4, 128, 0, 30.0f, 16, 0, {1100, 33, 1}}, {10, 2, 256, 40, 0.0f, 8, 1, {300, 64, 5}},
    {12, 2, 64, 0, 0.0f, 16, 1, {48, 200, 16}}, {7, 1, 256, 0, 0.0f, 16, 1, {95, 31, 160}},
    {32, 8, 128, 0, 0.0f, 16, 1, {513, 17, 2}}, {2, 1, 128, 0, 0.0f, 16, 0, {3000, 2100, 640}},
    /* D 512 (two blocks per row and group of at most 8 heads, one per half of the outputs) */
    {8, 2, 512, 0, 0.0f, 16, 1, {300, 37, 129}}, {16, 2, 512, 0, 30.0f, 16, 0, {200, 17, 1}},
    {4, 4, 512, 40, 0.0f, 8, 1, {95, 31, 1100}}, {8, 1, 512, 0, 0.0f, 16, 0, {1100, 64, 3}},
    {16, 1, 512, 0, 0.0f, 16, 1, {300, 37, 129}}, {32, 2, 512, 50, 20.0f, 16, 0, {200, 17, 1}}, /* 8-head groups */
};
/* one case over BF16 (pg 1) or F16 (pg 2) pages, three decode rows (one per slot): rel error against the CPU */
static double ad_tc_case_run(const ad_tc_case *k, int pg) {
    g_attn_bf16 = pg;
    g_attn_hole = k->hole;
    const double rel = attn_case(k->nh, k->nkv, k->d, k->window, k->cap, k->bs, 3, k->lens, 0, 1);
    g_attn_hole = 0;
    return rel;
}

/* the most keys a row of case k sees (its longest slot, bounded by the window) */
static int ad_case_keys(const ad_tc_case *k) {
    int keys = 0;
    for (int i = 0; i < 3; i++) keys = k->lens[i] > keys ? k->lens[i] : keys;
    return k->window > 0 && k->window < keys ? k->window : keys;
}

/* case k's first slot over pages pg as one row whose last key is written right before the attention (g_attn_late), twice
 * from the same seed: the worse rel error against the CPU; *same: both runs gave the same bits; *ran: `calls` moved in
 * both runs (the kernel under test ran) */
static double ad_late_twice(const ad_tc_case *k, int pg, const unsigned long long *calls, int *ran, int *same) {
    float *o[2] = {NULL, NULL};
    double rel = 0.0;
    const uint64_t seed = g_seed;
    g_attn_bf16 = pg;
    g_attn_late = 1;
    *ran = 1;
    for (int i = 0; i < 2; i++) {
        g_seed = seed;
        g_attn_keep = &o[i];
        const unsigned long long c0 = *calls;
        const double r = attn_case(k->nh, k->nkv, k->d, k->window, k->cap, k->bs, 1, k->lens, 0, 1);
        g_attn_keep = NULL;
        rel = r > rel || r != r ? r : rel;
        *ran &= *calls > c0;
    }
    g_attn_late = 0;
    *same = o[0] && o[1] && !memcmp(o[0], o[1], (size_t)k->nh * k->d * sizeof(float));
    free(o[0]);
    free(o[1]);
    return rel;
}

/* attn_decode_tc.cu (TERN_CUDA_AD_TC; forced here for any plan): AD_TC_CASES within 1e-5 of the CPU (its hi/lo
 * split of q and p keeps near-f32 sums: the Python emulation of its fragments gives ~3e-6 over BF16 pages, ~2e-7
 * over F16), BF16 and F16 pages; the D 128 cases also in every block shape TERN_CUDA_AD_TC_ST names (1 the built-in 4
 * warps × 3 stages, 2: 4 × 2, 3: 2 × 3, 4: 2 × 2; 0 the default picks per launch) */
TEST(cuda_attention_decode_tc) {
    extern unsigned long long tern__cuda_attn_decode_tc_calls;
    extern int tern__cuda_ad_mode, tern__cuda_ad_tc, tern__cuda_ad_tc_st, tern__cuda_ad_tcs;
    const int keep = tern__cuda_ad_mode, keep_tc = tern__cuda_ad_tc, keep_st = tern__cuda_ad_tc_st, keep_bf = g_attn_bf16,
              keep_tcs = tern__cuda_ad_tcs;
    tern__cuda_ad_mode = 1;
    tern__cuda_ad_tc = 2;
    tern__cuda_ad_tcs = 0; /* the one-pass form even for the long cases (a long step takes the split form) */
    for (int st = 0; st <= 4; st++) /* the default (auto) shapes, then D 128 with TERN_CUDA_AD_TC_ST=1..4 */
        for (int pg = 1; pg <= 2; pg++) /* BF16, F16 pages */
            for (size_t c = 0; c < TERN_ARRAY_LEN(AD_TC_CASES); c++) {
                if (st && AD_TC_CASES[c].d != 128) continue;
                const unsigned long long calls = tern__cuda_attn_decode_tc_calls;
                tern__cuda_ad_tc_st = st;
                const double rel = ad_tc_case_run(&AD_TC_CASES[c], pg);
                printf("  err attention decode tc case %zu %s st %d: %.2e\n", c, pg == 1 ? "bf16" : "f16", st, rel);
                CHECK(rel <= 1e-5, "case %zu pages %d st %d: rel %.2e", c, pg, st, rel);
                CHECK(tern__cuda_attn_decode_tc_calls > calls, "case %zu pages %d st %d: the tensor-core kernel did not run",
                      c, pg, st);
            }
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_tc = keep_tc;
    tern__cuda_ad_tc_st = keep_st;
    tern__cuda_ad_tcs = keep_tcs;
    g_attn_bf16 = keep_bf;
}

/* attn_decode_tc.cu split over the keys (TERN_CUDA_AD_TCS, and TERN_CUDA_AD_TCS512 for D 512; forced here for any plan
 * of a few rows): AD_TC_CASES with the keys of each (row, kv head) spread over splits of at least 16 and of 64 keys (the
 * default), within 1e-5 of the CPU, BF16 and F16 pages (rows with fewer keys than one split included). D <= 256: the
 * last split merges; D 512: both halves of the outputs go to the partials and tern__cuda_attn_merge merges them, and
 * each case's first slot also runs as one row whose last key is written right before the attention (g_attn_late: the
 * BF16 EARLY instance issues its first copies before pdl_wait), twice: the same bits */
TEST(cuda_attention_decode_tcs) {
    extern unsigned long long tern__cuda_attn_decode_tc_calls, tern__cuda_attn_decode_tcs512_calls;
    extern int tern__cuda_ad_mode, tern__cuda_ad_tcs, tern__cuda_ad_tcs_ch, tern__cuda_ad_tcs512;
    const int keep = tern__cuda_ad_mode, keep_s = tern__cuda_ad_tcs, keep_ch = tern__cuda_ad_tcs_ch, keep_bf = g_attn_bf16,
              keep_512 = tern__cuda_ad_tcs512;
    tern__cuda_ad_mode = 1;
    tern__cuda_ad_tcs = 2;
    tern__cuda_ad_tcs512 = 2;
    for (int ch = 16; ch <= 64; ch *= 4)
        for (int pg = 1; pg <= 2; pg++) /* BF16, F16 pages */
            for (size_t c = 0; c < TERN_ARRAY_LEN(AD_TC_CASES); c++) {
                const ad_tc_case *k = &AD_TC_CASES[c];
                const int d512 = k->d == 512;
                const unsigned long long *cnt = d512 ? &tern__cuda_attn_decode_tcs512_calls : &tern__cuda_attn_decode_tc_calls;
                const unsigned long long calls = *cnt;
                tern__cuda_ad_tcs_ch = ch;
                const double rel = ad_tc_case_run(k, pg);
                printf("  err attention decode tcs case %zu %s ch %d: %.2e\n", c, pg == 1 ? "bf16" : "f16", ch, rel);
                CHECK(rel <= 1e-5, "case %zu pages %d ch %d: rel %.2e", c, pg, ch, rel);
                /* a plan over at most ch keys has one split: another kernel serves it */
                CHECK(ad_case_keys(k) <= ch || *cnt > calls, "case %zu pages %d ch %d: the split tensor-core kernel did not run",
                      c, pg, ch);
                if (!d512) continue;
                int ran, same;
                const double rl = ad_late_twice(k, pg, cnt, &ran, &same);
                const int k0 = k->window > 0 && k->window < k->lens[0] ? k->window : k->lens[0];
                printf("  err attention decode tcs late case %zu %s ch %d: %.2e\n", c, pg == 1 ? "bf16" : "f16", ch, rl);
                CHECK(rl <= 1e-5, "late case %zu pages %d ch %d: rel %.2e", c, pg, ch, rl);
                CHECK(k0 <= ch || ran, "late case %zu pages %d ch %d: the kernel did not run", c, pg, ch);
                CHECK(same, "late case %zu pages %d ch %d: two runs differ", c, pg, ch);
            }
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_tcs = keep_s;
    tern__cuda_ad_tcs_ch = keep_ch;
    tern__cuda_ad_tcs512 = keep_512;
    g_attn_bf16 = keep_bf;
}

/* attn_decode_r1.cu (TERN_CUDA_AD_R1; forced here for any plan, D 512 with TERN_CUDA_AD_R1_512): AD_TC_CASES of G <= 8
 * (D 64 / 128 / 256 / 512) with three decode rows (one per slot), within 1e-5 of the CPU over BF16 and F16 pages,
 * blocks of 4 and 8 warps in clusters of up to 16 blocks, and in up to 3 / 5 (several chunks a warp); then each case's
 * first slot as one row whose last key is written right before the attention (g_attn_late: the BF16 EARLY instance loads
 * its first chunk before pdl_wait; pages start as NaN, so a stale read of key pos shows), and the same row twice:
 * the same bits (a fixed merge order) */
TEST(cuda_attention_decode_r1) {
    extern unsigned long long tern__cuda_attn_decode_r1_calls;
    extern int tern__cuda_ad_mode, tern__cuda_ad_r1, tern__cuda_ad_r1_w, tern__cuda_ad_r1_smax, tern__cuda_ad_r1_512,
        tern__cuda_ad_r1_ahead, tern__cuda_ad_r1_tr;
    const int keep = tern__cuda_ad_mode, keep_r1 = tern__cuda_ad_r1, keep_w = tern__cuda_ad_r1_w, keep_bf = g_attn_bf16,
              keep_s = tern__cuda_ad_r1_smax, keep_512 = tern__cuda_ad_r1_512, keep_ah = tern__cuda_ad_r1_ahead,
              keep_tr = tern__cuda_ad_r1_tr;
    /* warps a block, blocks a (row, kv head) at most, TERN_CUDA_AD_R1_AHEAD (0: records as each chunk's loads go out,
     * 1: a chunk ahead), TERN_CUDA_AD_R1_TR (the transposed form for G <= 4) */
    static const int SHAPE[9][4] = {{4, 16, 1, 0}, {8, 16, 1, 0}, {4, 3, 1, 0}, {8, 5, 1, 0}, {4, 3, 0, 0},
                                    {8, 5, 0, 0},  {4, 16, 1, 1}, {8, 5, 1, 1}, {4, 3, 0, 1}};
    tern__cuda_ad_mode = 1;
    tern__cuda_ad_r1 = 2;
    tern__cuda_ad_r1_512 = 1;
    for (int sh = 0; sh < 9; sh++)
        for (int pg = 1; pg <= 2; pg++) /* BF16, F16 pages */
            for (size_t c = 0; c < TERN_ARRAY_LEN(AD_TC_CASES); c++) {
                const ad_tc_case *k = &AD_TC_CASES[c];
                const int w = SHAPE[sh][0];
                if (k->nh / k->nkv > 8) continue; /* served by the split kernels */
                tern__cuda_ad_r1_w = w;
                tern__cuda_ad_r1_smax = SHAPE[sh][1];
                tern__cuda_ad_r1_ahead = SHAPE[sh][2];
                tern__cuda_ad_r1_tr = SHAPE[sh][3];
                unsigned long long calls = tern__cuda_attn_decode_r1_calls;
                double rel = ad_tc_case_run(k, pg);
                printf("  err attention decode r1 case %zu %s w %d s %d ahead %d tr %d: %.2e\n", c, pg == 1 ? "bf16" : "f16",
                       w, SHAPE[sh][1], SHAPE[sh][2], SHAPE[sh][3], rel);
                CHECK(rel <= 1e-5, "case %zu pages %d w %d: rel %.2e", c, pg, w, rel);
                CHECK(tern__cuda_attn_decode_r1_calls > calls, "case %zu pages %d w %d: the r1 kernel did not run", c, pg, w);
                int ran, same;
                const double rl = ad_late_twice(k, pg, &tern__cuda_attn_decode_r1_calls, &ran, &same);
                printf("  err attention decode r1 late case %zu %s w %d s %d: %.2e\n", c, pg == 1 ? "bf16" : "f16", w,
                       SHAPE[sh][1], rl);
                CHECK(rl <= 1e-5, "late case %zu pages %d w %d: rel %.2e", c, pg, w, rl);
                CHECK(ran, "late case %zu pages %d w %d: the r1 kernel did not run", c, pg, w);
                CHECK(same, "late case %zu pages %d w %d: two runs differ", c, pg, w);
            }
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_r1 = keep_r1;
    tern__cuda_ad_r1_w = keep_w;
    tern__cuda_ad_r1_smax = keep_s;
    tern__cuda_ad_r1_512 = keep_512;
    tern__cuda_ad_r1_ahead = keep_ah;
    tern__cuda_ad_r1_tr = keep_tr;
    g_attn_bf16 = keep_bf;
}

/* TERN_CUDA_AD_EARLY: one decode row issues its first K/V loads before pdl_wait and reloads key pos after
 * it — the same bits as without. Its last key is written right before the attention (g_attn_late: pages
 * start as NaN, so a stale read shows); each case runs with EARLY off, on, and on with LEAN (TERN_CUDA_AD_LEAN:
 * empty key groups skipped, the cluster merge's (M, L) staged): all within 1e-5 of the CPU and the same bits; f32
 * and BF16 pages (f32 ones run the plain kernel either way), with and without the cluster merge, head dims 32 ..
 * 512, a sliding window, several splits and rounds. Then the split tensor-core kernel (TERN_CUDA_AD_TCS forced)
 * with TERN_CUDA_AD_TCS_EARLY off and on (its first tile's copies before pdl_wait): the same bits again (head
 * dims it does not serve run the split kernel both times) */
TEST(cuda_attention_decode_early_bits) {
    extern int tern__cuda_ad_r1; /* attn_dec_kernel here, not attn_decode_r1.cu (its own test) */
    const int keep_r1 = tern__cuda_ad_r1;
    tern__cuda_ad_r1 = 0;
    extern int tern__cuda_ad_mode, tern__cuda_ad_cluster, tern__cuda_ad_early, tern__cuda_ad_lean, tern__cuda_ad_tcs,
        tern__cuda_ad_tcs_early;
    static const struct { int nh, nkv, d, window, bs, len; } C[] = {
        {8, 2, 128, 0, 16, 300}, {8, 4, 512, 0, 16, 150}, {16, 4, 128, 100, 16, 400}, {32, 8, 128, 0, 16, 20},
        {4, 1, 32, 0, 16, 77}, {8, 2, 256, 0, 16, 1500}, {4, 2, 64, 0, 16, 2}, {8, 8, 64, 0, 16, 1100},
    };
    static const char *const MODE[5] = {"off", "on", "lean", "tcs", "tcs early"};
    const int keep = tern__cuda_ad_mode, keep_cl = tern__cuda_ad_cluster, keep_bf = g_attn_bf16,
              keep_early = tern__cuda_ad_early, keep_lean = tern__cuda_ad_lean, keep_tcs = tern__cuda_ad_tcs,
              keep_tcse = tern__cuda_ad_tcs_early;
    tern__cuda_ad_mode = 1;
    g_attn_late = 1;
    for (int cl = 0; cl < 2; cl++)
        for (int bf = 0; bf < 2; bf++)
            for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++) {
                float *o[5] = {NULL, NULL, NULL, NULL, NULL};
                double rel[5];
                const uint64_t seed = g_seed;
                tern__cuda_ad_cluster = cl ? 16 : 0;
                g_attn_bf16 = bf;
                for (int m = 0; m < 5; m++) { /* EARLY off, on, LEAN; TCS with and without its early copies */
                    g_seed = seed; /* the same cache and queries */
                    tern__cuda_ad_early = m > 0;
                    tern__cuda_ad_lean = m == 2;
                    tern__cuda_ad_tcs = m >= 3 ? 2 : 0;
                    tern__cuda_ad_tcs_early = m == 4;
                    g_attn_keep = &o[m];
                    rel[m] = attn_case(C[c].nh, C[c].nkv, C[c].d, C[c].window, 0.0f, C[c].bs, 1, &C[c].len, 0, 1);
                    g_attn_keep = NULL;
                }
                const size_t qn = (size_t)C[c].nh * C[c].d;
                printf("  err attention decode early case %zu cluster %d bf16 %d: %.2e / %.2e / %.2e (lean) / %.2e / %.2e "
                       "(tcs)\n", c, cl, bf, rel[0], rel[1], rel[2], rel[3], rel[4]);
                for (int m = 0; m < 5; m++)
                    CHECK(rel[m] <= 1e-5, "early case %zu cluster %d bf16 %d %s: rel %.2e", c, cl, bf, MODE[m], rel[m]);
                for (int m = 1; m < 5; m++) {
                    const int ref = m == 4 ? 3 : 0;
                    if (m == 3) continue; /* TCS is another kernel: its bits are compared with its early form */
                    CHECK(o[ref] && o[m] && !memcmp(o[ref], o[m], qn * sizeof(float)),
                          "early case %zu cluster %d bf16 %d: %s and %s bits differ", c, cl, bf, MODE[ref], MODE[m]);
                }
                for (int m = 0; m < 5; m++) free(o[m]);
            }
    g_attn_late = 0;
    tern__cuda_ad_mode = keep;
    tern__cuda_ad_cluster = keep_cl;
    tern__cuda_ad_early = keep_early;
    tern__cuda_ad_lean = keep_lean;
    tern__cuda_ad_tcs = keep_tcs;
    tern__cuda_ad_tcs_early = keep_tcse;
    g_attn_bf16 = keep_bf;
    tern__cuda_ad_r1 = keep_r1;
}

/* route_topk vs the CPU: idx the same, wts within 1e-5; both forms of the kernel's picks (TERN_CUDA_ROUTE_LANES: lane 0
 * storing them one by one, or the k lanes at once; k 40 keeps the first form either way), bitwise the same */
TEST(cuda_route_topk) {
    static const int EK[][3] = {{128, 8, 37}, {256, 8, 5}, {8, 2, 64}, {60, 6, 3}, {1000, 4, 2}, {64, 40, 3}, {128, 32, 2}};
    extern int tern__cuda_route_lanes;
    const int keep = tern__cuda_route_lanes;
    for (size_t c = 0; c < TERN_ARRAY_LEN(EK); c++) {
        int E = EK[c][0], k = EK[c][1], n = EK[c][2];
        for (int with_scale = 0; with_scale < 2; with_scale++) {
            float *lg = rnd((size_t)n * E, 3.0f), *pes = rnd((size_t)E, 1.0f), *wr = malloc(n * k * sizeof *wr);
            int32_t *ir = malloc(n * k * sizeof *ir), *ig[2];
            float *wg[2];
            void *lgd = to_gpu(lg, (size_t)n * E * 4), *pd = to_gpu(pes, (size_t)E * 4);
            void *id = g_gpu->vt->alloc(g_gpu, n * k * 4), *wd = nan_buf(g_gpu, (size_t)n * k);
            g_ref->vt->route_topk(g_ref, ir, wr, lg, n, E, k, TERN_ROUTE_SOFTMAX_TOPK, with_scale ? pes : NULL);
            for (int lanes = 0; lanes < 2; lanes++) {
                tern__cuda_route_lanes = lanes;
                g_gpu->vt->route_topk(g_gpu, id, wd, lgd, n, E, k, TERN_ROUTE_SOFTMAX_TOPK, with_scale ? pd : NULL);
                ig[lanes] = malloc(n * k * sizeof *ig[lanes]);
                g_gpu->vt->download(g_gpu, ig[lanes], id, n * k * 4);
                wg[lanes] = from_gpu(g_gpu, wd, (size_t)n * k);
                int same = !memcmp(ir, ig[lanes], n * k * 4);
                double rel = rel_or_nan(wg[lanes], wr, (size_t)n * k);
                CHECK(same && rel <= 1e-5, "E %d k %d n %d scale %d lanes %d: idx %s, wts rel %.2e", E, k, n, with_scale,
                      lanes, same ? "same" : "differ", rel);
            }
            CHECK(!memcmp(ig[0], ig[1], n * k * 4) && !memcmp(wg[0], wg[1], n * k * 4),
                  "E %d k %d n %d scale %d: the two forms differ", E, k, n, with_scale);
            g_gpu->vt->free(g_gpu, lgd); g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, id); g_gpu->vt->free(g_gpu, wd);
            free(lg); free(pes); free(wr); free(ir);
            for (int i = 0; i < 2; i++) { free(ig[i]); free(wg[i]); }
        }
    }
    tern__cuda_route_lanes = keep;
}

/* gate/up as views of one fused stack [E, 2I, H] (HF experts.gate_up_proj layout) */
static void split_fused(const hw *f, tern_tensor *gate, tern_tensor *up, int I) {
    *gate = *up = f->t;
    gate->shape[1] = up->shape[1] = I;
    size_t rb = tern_tensor_row_bytes(&f->t), mb = (size_t)2 * I * rb;
    gate->mat_stride = up->mat_stride = mb;
    up->data = (const uint8_t *)f->t.data + (size_t)I * rb;
    if (f->t.dtype == TERN_DT_Q) {
        size_t ng = (size_t)f->t.shape[2] / f->t.group_size, ss = tern_dtype_size(f->t.sdtype);
        gate->mat_stride_s = up->mat_stride_s = (size_t)2 * I * ng * ss;
        up->scales = (const uint8_t *)f->t.scales + (size_t)I * ng * ss;
        up->biases = (const uint8_t *)f->t.biases + (size_t)I * ng * ss;
    }
}

TEST(cuda_moe_mlp) {
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; int act; } F[] = {
        {TERN_DT_Q, 4, 64, TERN_DT_BF16, TERN_ACT_GELU_TANH}, {TERN_DT_BF16, 0, 0, 0, TERN_ACT_SILU},
        {TERN_DT_Q, 8, 32, TERN_DT_F16, TERN_ACT_SILU}, {TERN_DT_Q, 3, 64, TERN_DT_BF16, TERN_ACT_GELU_TANH},
        {TERN_DT_F32, 0, 0, 0, TERN_ACT_GELU_TANH},
    };
    const int H = 256, I = 192, E = 8, k = 3;
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++) {
        hw fused = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, E, 2 * I, H, 0);
        hw down = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, E, H, I, 0);
        tern_tensor gr, ur, gg, ug, dr = down.t, dg = down.t;
        split_fused(&fused, &gr, &ur, I);
        gg = gr;
        ug = ur;
        tern_error err = {0};
        int ok = !g_gpu->vt->upload_weight(g_gpu, &gg, &err) && !g_gpu->vt->upload_weight(g_gpu, &ug, &err) &&
                 !g_gpu->vt->upload_weight(g_gpu, &dg, &err) && !g_ref->vt->upload_weight(g_ref, &gr, &err) &&
                 !g_ref->vt->upload_weight(g_ref, &ur, &err) && !g_ref->vt->upload_weight(g_ref, &dr, &err);
        CHECK(ok, "upload: %s", err.msg);
        static const int NS[] = {1, 5, 40};
        for (size_t i = 0; ok && i < TERN_ARRAY_LEN(NS); i++) {
            int n = NS[i];
            float *x = rnd((size_t)n * H, 1.0f), *lg = rnd((size_t)n * E, 2.0f), *wts = malloc(n * k * sizeof *wts);
            int32_t *idx = malloc(n * k * sizeof *idx);
            g_ref->vt->route_topk(g_ref, idx, wts, lg, n, E, k, TERN_ROUTE_SOFTMAX_TOPK, NULL);
            float *yr = malloc((size_t)n * H * sizeof *yr), *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
            void *xd = to_gpu(x, (size_t)n * H * 4), *id = to_gpu(idx, n * k * 4), *wd = to_gpu(wts, n * k * 4);
            void *yd = nan_buf(g_gpu, (size_t)n * H), *sd = nan_buf(g_gpu, (size_t)n * k * 2 * I);
            g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &gr, &ur, &dr, F[f].act, scr);
            g_gpu->vt->moe_mlp(g_gpu, yd, xd, n, H, id, wd, k, &gg, &ug, &dg, F[f].act, sd);
            float *yg = from_gpu(g_gpu, yd, (size_t)n * H);
            double rel = rel_or_nan(yg, yr, (size_t)n * H);
            char nm[64];
            printf("  err moe %-16s n=%-3d %.2e\n", fmt_name(&fused.t, nm, sizeof nm), n, rel);
            CHECK(rel <= 1e-5, "%s n %d rel %.2e", nm, n, rel);
            { /* moe_gateup's x staging by cp.async or by the load loop (TERN_CUDA_MOE_GU_CPA): the same bits */
                extern int tern__cuda_moe_gu_cpa;
                const int keep = tern__cuda_moe_gu_cpa;
                tern__cuda_moe_gu_cpa = keep == 0;
                void *y2 = nan_buf(g_gpu, (size_t)n * H);
                g_gpu->vt->moe_mlp(g_gpu, y2, xd, n, H, id, wd, k, &gg, &ug, &dg, F[f].act, sd);
                float *yb = from_gpu(g_gpu, y2, (size_t)n * H);
                CHECK(!memcmp(yb, yg, (size_t)n * H * sizeof *yb), "%s n %d: the two x stagings differ", nm, n);
                tern__cuda_moe_gu_cpa = keep;
                g_gpu->vt->free(g_gpu, y2);
                free(yb);
            }
            g_gpu->vt->free(g_gpu, xd); g_gpu->vt->free(g_gpu, id); g_gpu->vt->free(g_gpu, wd);
            g_gpu->vt->free(g_gpu, yd); g_gpu->vt->free(g_gpu, sd);
            free(x); free(lg); free(wts); free(idx); free(yr); free(scr); free(yg);
        }
        g_gpu->vt->free_weight(g_gpu, &gg); g_gpu->vt->free_weight(g_gpu, &ug); g_gpu->vt->free_weight(g_gpu, &dg);
        free_w(&fused); free_w(&down);
    }
}

/* ops.h norm_route_topk (moe.cu, one launch) against the three ops it stands for (rmsnorm_n, the router matmul,
 * route_topk): the norms bitwise, the logits within f32 rounding, the same experts; twice in a row bitwise (the
 * arrival counter back at zero); more than one row declined */
TEST(cuda_norm_route_topk) {
    extern int tern__cuda_norm_route;
    extern unsigned long long tern__cuda_norm_route_calls;
    const int keep = tern__cuda_norm_route;
    static const struct { tern_dtype dt; int bits, gs; tern_dtype sdt; int d, E, k; } F[] = {
        {TERN_DT_BF16, 0, 0, 0, 2816, 128, 8},         {TERN_DT_Q, 4, 64, TERN_DT_BF16, 2816, 128, 8},
        {TERN_DT_Q, 8, 32, TERN_DT_F16, 1536, 203, 4}, {TERN_DT_F32, 0, 0, 0, 512, 64, 6},
        {TERN_DT_Q, 4, 128, TERN_DT_F32, 1024, 256, 8}};
    for (size_t f = 0; f < TERN_ARRAY_LEN(F); f++) {
        const int d = F[f].d, E = F[f].E, k = F[f].k;
        hw r = make_w(F[f].dt, F[f].bits, F[f].gs, F[f].sdt, 1, E, d, 0);
        tern_tensor rt = r.t;
        rt.precise = 1;
        tern_error err = {0};
        const int up_ok = !g_gpu->vt->upload_weight(g_gpu, &rt, &err);
        CHECK(up_ok, "upload: %s", err.msg);
        if (!up_ok) { free_w(&r); continue; }
        float *o = rnd(d, 2.0f), *x = rnd(d, 3.0f), *pes = rnd(E, 1.0f), *w[3];
        void *xd = to_gpu(x, d * 4), *pd = to_gpu(pes, E * 4), *wd[3];
        for (int i = 0; i < 3; i++) {
            w[i] = rnd(d, 1.0f);
            for (int j = 0; j < d; j++) w[i][j] += 1.0f;
            wd[i] = to_gpu(w[i], d * 4);
        }
        float *got[3][6] = {{0}}; /* run v: o, y1, y2, logits, wts, idx (as bits) */
        for (int v = 0; v < 3; v++) {
            tern__cuda_norm_route = v > 0;
            void *od = to_gpu(o, d * 4), *y1 = nan_buf(g_gpu, d), *y2 = nan_buf(g_gpu, d), *lg = nan_buf(g_gpu, E),
                 *wt = nan_buf(g_gpu, k), *id = nan_buf(g_gpu, k);
            float *ys[3] = {od, y1, y2};
            const float *xs[3] = {od, xd, xd}, *ws[3] = {wd[0], wd[1], wd[2]};
            const unsigned long long c0 = tern__cuda_norm_route_calls;
            int done = g_gpu->vt->norm_route_topk(g_gpu, 1, d, ys, xs, ws, 1e-6f, &rt, lg, id, wt, E, k,
                                                  TERN_ROUTE_SOFTMAX_TOPK, pd);
            CHECK(done == (v > 0) && tern__cuda_norm_route_calls == c0 + (v > 0), "case %zu run %d: served %d", f, v,
                  done);
            if (!done) {
                const int nr[3] = {1, 1, 1};
                g_gpu->vt->rmsnorm_n(g_gpu, 3, ys, xs, nr, d, ws, 1e-6f);
                g_gpu->vt->matmul(g_gpu, lg, y1, 1, &rt);
                g_gpu->vt->route_topk(g_gpu, id, wt, lg, 1, E, k, TERN_ROUTE_SOFTMAX_TOPK, pd);
            }
            got[v][0] = from_gpu(g_gpu, od, d);
            got[v][1] = from_gpu(g_gpu, y1, d);
            got[v][2] = from_gpu(g_gpu, y2, d);
            got[v][3] = from_gpu(g_gpu, lg, E);
            got[v][4] = from_gpu(g_gpu, wt, k);
            got[v][5] = from_gpu(g_gpu, id, k);
            void *fr[] = {od, y1, y2, lg, wt, id};
            for (int i = 0; i < 6; i++) g_gpu->vt->free(g_gpu, fr[i]);
        }
        char nm[64];
        fmt_name(&r.t, nm, sizeof nm);
        for (int i = 0; i < 3; i++)
            CHECK(!memcmp(got[0][i], got[1][i], d * 4), "%s: norm %d not bitwise rmsnorm_n", nm, i);
        const double rl = rel_or_nan(got[1][3], got[0][3], E), rw = rel_or_nan(got[1][4], got[0][4], k);
        const int same = !memcmp(got[0][5], got[1][5], k * 4);
        CHECK(rl <= 1e-5 && rw <= 1e-5 && same, "%s E %d k %d: logits rel %.2e, wts rel %.2e, ids %s", nm, E, k, rl, rw,
              same ? "same" : "differ");
        for (int i = 0; i < 6; i++)
            CHECK(!memcmp(got[1][i], got[2][i], (i < 3 ? d : i == 3 ? E : k) * 4), "%s: run 2 differs in %d", nm, i);
        {   /* more than one row: declined, nothing launched */
            float *ys[3] = {NULL, NULL, NULL};
            const float *xs[3] = {NULL, NULL, NULL}, *ws[3] = {NULL, NULL, NULL};
            CHECK(!g_gpu->vt->norm_route_topk(g_gpu, 2, d, ys, xs, ws, 1e-6f, &rt, NULL, NULL, NULL, E, k,
                                              TERN_ROUTE_SOFTMAX_TOPK, NULL), "%s: two rows served", nm);
        }
        printf("  norm_route_topk %-16s d %d E %d k %d: norms bitwise, logits rel %.1e, ids same\n", nm, d, E, k, rl);
        for (int v = 0; v < 3; v++)
            for (int i = 0; i < 6; i++) free(got[v][i]);
        for (int i = 0; i < 3; i++) { g_gpu->vt->free(g_gpu, wd[i]); free(w[i]); }
        g_gpu->vt->free(g_gpu, xd); g_gpu->vt->free(g_gpu, pd);
        free(o); free(x); free(pes);
        g_gpu->vt->free_weight(g_gpu, &rt);
        free_w(&r);
    }
    tern__cuda_norm_route = keep;
}

#include "ops/kvq.h"

/* Bidirectional spans (tern_rows.vis_lo/vis_hi): slot 0 prefills its last P rows cut into
 * spans of 1, 3, window+5 and the rest (text rows between), slot 1 has a 4-row span ending at
 * its last position, slot 2 one decode row; ranges as the forward driver builds them (whole
 * span / pos..pos). Blocks below every row's first visible key are evicted (-1). variant 0:
 * host copies given (row tiles), 1: none (graph-style planning), 2: slot 1's span and the
 * decode row only (few blocks: split-K). Pages in formats kf/vf (f32 or compressed: the
 * kvq_attn.cu kernel); never-written records are all-ones bytes (NaN in every format). */
static void *bytes_gpu(size_t n, int fill) {
    uint8_t *h = malloc(n ? n : 1);
    memset(h, fill, n);
    void *d = to_gpu(h, n);
    free(h);
    return d;
}

static double attn_span_case(tern_kv_fmt kf, tern_kv_fmt vf, int nh, int nkv, int d, int window, float softcap,
                             int bs, const int *lens, int P, int variant) {
    const int nslots = 3;
    int maxlen = 0;
    for (int s = 0; s < nslots; s++) maxlen = lens[s] > maxlen ? lens[s] : maxlen;
    int max_blocks = (maxlen + bs - 1) / bs, nblk = nslots * max_blocks + 3;
    size_t tok = (size_t)nkv * d;
    int32_t *bt = malloc((size_t)nslots * max_blocks * sizeof *bt), *perm = malloc(nblk * sizeof *perm);
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(test_rand_u64(&g_seed) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < nslots * max_blocks; i++) bt[i] = perm[i];
    size_t recs = (size_t)nblk * bs * nkv, kbytes = recs * tern_kvq_vec_bytes(&kf, d), vbytes = recs * tern_kvq_vec_bytes(&vf, d);
    uint8_t *kh = malloc(kbytes), *vh = malloc(vbytes);
    memset(kh, 0xff, kbytes);
    memset(vh, 0xff, vbytes);
    void *kd = bytes_gpu(kbytes, 0xff), *vd = bytes_gpu(vbytes, 0xff);
    void *btd = to_gpu(bt, (size_t)nslots * max_blocks * sizeof *bt);
    int RP = tern_kvq_rot_dim(d), turbo = kf.kind == TERN_KV_TURBO || vf.kind == TERN_KV_TURBO;
    float *signs = malloc(sizeof(float) * (size_t)RP);
    tern_kvq_signs(0x5a11 + (uint64_t)d, signs, RP);
    void *rotd = to_gpu(signs, sizeof(float) * (size_t)RP);
    tern_kv_layer kr = {kf.kind || vf.kind ? TERN_DT_Q : TERN_DT_F32, nkv, d, bs, window, kh, vh, bt, max_blocks};
    kr.kf = kf;
    kr.vf = vf;
    kr.rot_dim = turbo ? RP : 0;
    kr.rot = turbo ? signs : NULL;
    tern_kv_layer kg = kr;
    kg.k = kd;
    kg.v = vd;
    kg.block_table = btd;
    kg.rot = turbo ? rotd : NULL;
    for (int s = 0; s < nslots; s++) {
        int n = lens[s];
        int32_t *pos = malloc(n * sizeof *pos), *slot = malloc(n * sizeof *slot);
        for (int r = 0; r < n; r++) { pos[r] = r; slot[r] = s; }
        float *k = rnd((size_t)n * tok, 1.0f), *v = rnd((size_t)n * tok, 1.0f);
        void *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4), *kdd = to_gpu(k, n * tok * 4), *vdd = to_gpu(v, n * tok * 4);
        tern_rows rr = {n, pos, slot, pos, slot}, rg = {n, pd, sd, pos, slot};
        g_ref->vt->kv_write(g_ref, &kr, &rr, k, v);
        g_gpu->vt->kv_write(g_gpu, &kg, &rg, kdd, vdd);
        g_gpu->vt->sync(g_gpu);
        g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd); g_gpu->vt->free(g_gpu, kdd); g_gpu->vt->free(g_gpu, vdd);
        free(pos); free(slot); free(k); free(v);
    }
    int cap = P + 8, n = 0;
    int32_t *pos = malloc(cap * sizeof *pos), *slot = malloc(cap * sizeof *slot), *id = calloc(cap, sizeof *id);
    int32_t *vlo = malloc(cap * sizeof *vlo), *vhi = malloc(cap * sizeof *vhi);
    if (variant != 2) { /* slot 0: text, span 1, text, span 3, text, span window+5, rest one span */
        int cut[5] = {1, 2, 3, 6, 7}, big = 7 + window + 5;
        for (int r = 0; r < P; r++) {
            pos[n] = lens[0] - P + r;
            slot[n] = 0;
            id[n++] = r < cut[0] ? 0 : r < cut[1] ? 1 : r < cut[2] ? 0 : r < cut[3] ? 2 : r < cut[4] ? 0 : r < big ? 3 : 4;
        }
    }
    for (int r = 0; r < 4; r++) { pos[n] = lens[1] - 4 + r; slot[n] = 1; id[n++] = 5; }
    pos[n] = lens[2] - 1; slot[n] = 2; id[n++] = 0;
    for (int r = 0; r < n; r++) {
        vlo[r] = vhi[r] = pos[r];
        for (int j = r; id[r] && j >= 0 && id[j] == id[r]; j--) vlo[r] = pos[j];
        for (int j = r; id[r] && j < n && id[j] == id[r]; j++) vhi[r] = pos[j];
    }
    if (window > 0)
        for (int s = 0; s < nslots; s++) {
            int first = 1 << 30;
            for (int r = 0; r < n; r++)
                if (slot[r] == s) {
                    int lo = pos[r] - window + 1 < vlo[r] ? pos[r] - window + 1 : vlo[r];
                    first = lo < first ? lo : first;
                }
            for (int b = 0; b < max_blocks; b++)
                if ((b + 1) * bs - 1 < first) bt[s * max_blocks + b] = -1;
        }
    if (g_attn_hole)
        for (int s = 0; s < nslots; s++)
            if ((lens[s] + bs - 1) / bs >= 3) bt[s * max_blocks + 1] = -1;
    g_gpu->vt->upload(g_gpu, btd, bt, (size_t)nslots * max_blocks * sizeof *bt);
    size_t qn = (size_t)n * nh * d;
    float *q = rnd(qn, 1.0f), *or_ = malloc(qn * sizeof *or_);
    void *qd = to_gpu(q, qn * 4), *od = nan_buf(g_gpu, qn), *pd = to_gpu(pos, n * 4), *sd = to_gpu(slot, n * 4);
    void *lod = to_gpu(vlo, n * 4), *hid = to_gpu(vhi, n * 4);
    int host = variant != 1;
    tern_rows rr = {n, pos, slot, pos, slot, vlo, vhi, vlo, vhi};
    tern_rows rg = {n, pd, sd, host ? pos : NULL, host ? slot : NULL, lod, hid, host ? vlo : NULL, host ? vhi : NULL};
    float scale = 3.0f / sqrtf((float)d);
    g_ref->vt->attention(g_ref, or_, q, &rr, nh, &kr, scale, softcap);
    tern_backend *be = g_attn ? g_attn : g_gpu;
    g_gpu->vt->sync(g_gpu);
    be->vt->attention(be, od, qd, &rg, nh, &kg, scale, softcap);
    float *og = from_gpu(be, od, qn);
    double rel = rel_or_nan(og, or_, qn);
    g_gpu->vt->free(g_gpu, kd); g_gpu->vt->free(g_gpu, vd); g_gpu->vt->free(g_gpu, btd); g_gpu->vt->free(g_gpu, qd);
    g_gpu->vt->free(g_gpu, od); g_gpu->vt->free(g_gpu, pd); g_gpu->vt->free(g_gpu, sd);
    g_gpu->vt->free(g_gpu, lod); g_gpu->vt->free(g_gpu, hid); g_gpu->vt->free(g_gpu, rotd);
    free(signs);
    free(bt); free(perm); free(kh); free(vh); free(pos); free(slot); free(id); free(vlo); free(vhi);
    free(q); free(or_); free(og);
    return rel;
}

TEST(cuda_attention_spans) {
    static const struct { int nh, nkv, d, window; float cap; int bs; int lens[3]; int P; } C[] = {
        {8, 2, 128, 0, 0.0f, 16, {300, 37, 1}, 70},
        {4, 1, 256, 24, 50.0f, 16, {200, 90, 10}, 45},
        {8, 8, 64, 8, 0.0f, 4, {129, 500, 3}, 40},
        {32, 1, 512, 40, 0.0f, 8, {120, 41, 2}, 60},
        {16, 4, 256, 6, 30.0f, 64, {1000, 20, 700}, 25},
    };
    const tern_kv_fmt f32 = {0};
    for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++)
        for (int v = 0; v < 3; v++) {
            double rel = attn_span_case(f32, f32, C[c].nh, C[c].nkv, C[c].d, C[c].window, C[c].cap, C[c].bs, C[c].lens,
                                        C[c].P, v);
            printf("  err attention spans nh=%d nkv=%d d=%d W=%d variant %d  %.2e\n", C[c].nh, C[c].nkv, C[c].d,
                   C[c].window, v, rel);
            CHECK(rel <= 1e-5, "case %zu variant %d rel %.2e", c, v, rel);
        }
    /* compressed pages (kvq_attn.cu) */
    static const struct { tern_kv_fmt kf, vf; int nh, nkv, d, window, bs; } Q[] = {
        {{TERN_KV_F16, 0, 0}, {TERN_KV_F16, 0, 0}, 8, 2, 128, 0, 16},
        {{TERN_KV_AFFINE, 8, 64}, {TERN_KV_AFFINE, 4, 32}, 8, 2, 128, 24, 16},
        {{TERN_KV_TURBO, 4, 0}, {TERN_KV_TURBO, 3, 0}, 16, 4, 256, 6, 8},
        {{TERN_KV_BF16, 0, 0}, {TERN_KV_TURBO, 2, 0}, 4, 1, 80, 8, 4},
    };
    static const int qlens[3] = {160, 60, 5};
    for (size_t c = 0; c < TERN_ARRAY_LEN(Q); c++)
        for (int v = 0; v < 3; v++) {
            double rel = attn_span_case(Q[c].kf, Q[c].vf, Q[c].nh, Q[c].nkv, Q[c].d, Q[c].window, 0.0f, Q[c].bs, qlens,
                                        40, v);
            char kn[16], vn[16];
            tern_kvq_name(&Q[c].kf, kn, sizeof kn);
            tern_kvq_name(&Q[c].vf, vn, sizeof vn);
            printf("  err attention spans K %s V %s d=%d W=%d variant %d  %.2e\n", kn, vn, Q[c].d, Q[c].window, v, rel);
            CHECK(rel <= 1e-5, "K %s V %s variant %d rel %.2e", kn, vn, v, rel);
        }
    /* a step with spans is never kept as a graph: recording one marks the capture bad */
    if (g_gpu->vt->graph_begin) {
        int32_t pos[2] = {0, 1}, slot[2] = {0, 0}, lo[2] = {0, 0}, hi[2] = {1, 1}, bt[1] = {0};
        float z[2 * 64] = {0}, out[2 * 64];
        void *pd = to_gpu(pos, 8), *sd = to_gpu(slot, 8), *lod = to_gpu(lo, 8), *hid = to_gpu(hi, 8);
        void *k = to_gpu(z, sizeof z), *v = to_gpu(z, sizeof z), *btd = to_gpu(bt, 4), *qd = to_gpu(z, sizeof z);
        void *od = g_gpu->vt->alloc(g_gpu, sizeof z);
        tern_kv_layer kv = {TERN_DT_F32, 1, 64, 4, 0, k, v, btd, 1};
        tern_rows rows = {2, pd, sd, pos, slot, lod, hid, lo, hi};
        CHECK(g_gpu->vt->graph_begin(g_gpu, 4242, out, sizeof out) == 1, "graph_begin");
        g_gpu->vt->attention(g_gpu, od, qd, &rows, 1, &kv, 0.125f, 0.0f);
        g_gpu->vt->download(g_gpu, out, od, sizeof out);
        CHECK(g_gpu->vt->graph_end(g_gpu, 1) == 0, "a recording with span attention was kept");
        void *bufs[] = {pd, sd, lod, hid, k, v, btd, qd, od};
        for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g_gpu->vt->free(g_gpu, bufs[i]);
    }
}

/* attn_mat.cu: d-512 prefill runs of >= 128 rows with the scores materialized (bf16 mode, BF16 pages) against
 * cpu-ref at the bf16 bound, and the path must have run: G 8 and 16 (gemma4-26b-a4b's and 12b's global layers), a
 * continuation chunk, softcap, a page not resident inside the keys, block sizes 16..64, the run alone and next to
 * decode rows, and sub-chunks of 100 rows (three S / P·V rounds in one run). */
extern int tern__cuda_attn_mat, tern__cuda_attn_mat_rmax;
extern unsigned long long tern__cuda_attn_mat_calls;
TEST(cuda_attention_mat) {
    if (!g_gpu16) { SKIP("cuda_attention_mat", "no bf16-mode backend"); return; }
    static const struct { int nh, nkv; float cap; int bs; int lens[3]; int P, hole, rmax; } C[] = {
        {16, 2, 0.0f, 16, {300, 37, 1}, 300, 0, 0},
        {16, 1, 0.0f, 32, {700, 64, 17}, 200, 0, 0},
        {8, 2, 30.0f, 16, {517, 5, 3}, 517, 1, 0},
        {8, 4, 0.0f, 64, {1000, 2, 700}, 129, 0, 0},
        {16, 2, 0.0f, 16, {333, 20, 9}, 250, 0, 100},
    };
    const int keep = tern__cuda_attn_mat;
    tern__cuda_attn_mat = 1;
    g_attn = g_gpu16;
    g_attn_bf16 = 1;
    for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++)
        for (int v = 0; v < 4; v += 3) {
            const unsigned long long before = tern__cuda_attn_mat_calls;
            g_attn_hole = C[c].hole;
            tern__cuda_attn_mat_rmax = C[c].rmax;
            const double rel = attn_case(C[c].nh, C[c].nkv, 512, 0, C[c].cap, C[c].bs, 3, C[c].lens, C[c].P, v);
            printf("  err attention mat nh=%d nkv=%d cap %g bs %d P=%d hole %d rmax %d variant %d  %.2e\n", C[c].nh,
                   C[c].nkv, C[c].cap, C[c].bs, C[c].P, C[c].hole, C[c].rmax, v, rel);
            CHECK(tern__cuda_attn_mat_calls > before, "case %zu variant %d: the materialized path did not run", c, v);
            CHECK(rel <= 1e-2, "case %zu variant %d rel %.2e", c, v, rel);
        }
    g_attn_hole = 0;
    tern__cuda_attn_mat_rmax = 0;
    g_attn_bf16 = 0;
    g_attn = NULL;
    tern__cuda_attn_mat = keep;
}

/* The tensor-core prefill kernel (attn_prefill.cu): prefill runs from position 0 and
 * continuation chunks (split-K), odd row counts, GQA group sizes 1..32 (6: a block's vectors
 * not a multiple of the group), window + evicted blocks, softcap, d = 64..512 (512: two passes
 * over the V columns, bf16 mode, switched on here; the f32 mode keeps the CUDA-core kernel), spans;
 * variant 0 (the run alone) and 3 (next to decode rows).
 * Modes: bf16 (plain bf16 operands) and f32 with the split kernel forced on (tern__cuda_fa_f32;
 * its default is measured here and stated in attn_prefill.cu). */
extern int tern__cuda_fa_f32, tern__cuda_fa_cfg, tern__cuda_fa512;
extern unsigned long long tern__cuda_fa512_calls, tern__cuda_fa_bf16_calls;
TEST(cuda_attention_flash) {
    static const struct { int nh, nkv, d, window; float cap; int bs; int lens[3]; int P; } C[] = {
        {8, 2, 128, 0, 0.0f, 16, {300, 37, 1}, 300},
        {8, 8, 64, 0, 0.0f, 32, {517, 500, 3}, 517},
        {4, 1, 256, 24, 50.0f, 16, {400, 90, 10}, 257},
        {12, 2, 128, 100, 30.0f, 8, {700, 5, 300}, 333},
        {16, 4, 256, 0, 0.0f, 64, {1000, 2, 700}, 65},
        {32, 1, 128, 0, 0.0f, 16, {200, 20, 9}, 161},
        {8, 2, 512, 0, 0.0f, 16, {150, 64, 17}, 100},
        {8, 4, 64, 50, 0.0f, 4, {600, 30, 30}, 35},
    };
    const int keep_f32 = tern__cuda_fa_f32, keep_cfg = tern__cuda_fa_cfg, keep_512 = tern__cuda_fa512,
              keep_mat = tern__cuda_attn_mat;
    tern__cuda_fa512 = 1;
    tern__cuda_attn_mat = 0; /* d 512 runs of >= 128 rows stay here (attn_mat.cu has its own test) */
    for (int mode = 0; mode < 2; mode++) {
        g_attn = mode == 0 ? g_gpu16 : g_gpu;
        if (!g_attn) continue;
        tern__cuda_fa_f32 = 1;
        const double bound = mode == 0 ? 1e-2 : 1e-5;
        double worst = 0;
        for (int pg = 0; pg < (mode == 0 ? 2 : 1); pg++) /* bf16 mode: F32 pages, then BF16 pages (cp.async tiles) */
            for (int cfg = 0; cfg < (mode == 0 ? 4 : 1); cfg++) {
                tern__cuda_fa_cfg = cfg;
                g_attn_bf16 = pg;
                for (size_t c = 0; c < TERN_ARRAY_LEN(C); c++)
                    for (int v = 0; v < (cfg ? 1 : 4); v += 3) {
                        const unsigned long long c512 = tern__cuda_fa512_calls, cbf = tern__cuda_fa_bf16_calls;
                        double rel = attn_case(C[c].nh, C[c].nkv, C[c].d, C[c].window, C[c].cap, C[c].bs, 3, C[c].lens,
                                               C[c].P, v);
                        if (pg && (cfg == 0 || C[c].d != 512)) /* d 512 has one tile shape */
                            CHECK(tern__cuda_fa_bf16_calls > cbf, "BF16 pages cfg %d case %zu: the flash kernel did not run",
                                  cfg, c);
                        if (mode == 0 && cfg == 0 && C[c].d == 512)
                            CHECK(tern__cuda_fa512_calls > c512, "d 512 variant %d: the two-pass flash kernel did not run", v);
                        printf("  err attention flash %s%s cfg %d nh=%d nkv=%d d=%d W=%d P=%d variant %d  %.2e\n",
                               mode ? "f32" : "bf16", pg ? " bf16-pages" : "", cfg, C[c].nh, C[c].nkv, C[c].d,
                               C[c].window, C[c].P, v, rel);
                        CHECK(rel <= bound, "%s pages %d cfg %d case %zu variant %d rel %.2e", mode ? "f32" : "bf16", pg,
                              cfg, c, v, rel);
                        worst = rel > worst ? rel : worst;
                    }
            }
        g_attn_bf16 = 0;
        static const struct { int nh, nkv, d, window; float cap; int bs; int lens[3]; int P; } S[] = {
            {8, 2, 128, 0, 0.0f, 16, {300, 37, 1}, 70},
            {4, 1, 256, 24, 50.0f, 16, {200, 90, 10}, 45},
            {8, 8, 64, 8, 0.0f, 4, {129, 500, 3}, 40},
            {16, 4, 256, 6, 30.0f, 64, {1000, 20, 700}, 125},
        };
        const tern_kv_fmt pf[2] = {{0}, {TERN_KV_BF16, 0, 0}};
        tern__cuda_fa_cfg = 0;
        for (int pg = 0; pg < (mode == 0 ? 2 : 1); pg++)
        for (size_t c = 0; c < TERN_ARRAY_LEN(S); c++)
            for (int v = 0; v < 2; v++) {
                double rel = attn_span_case(pf[pg], pf[pg], S[c].nh, S[c].nkv, S[c].d, S[c].window, S[c].cap, S[c].bs,
                                            S[c].lens, S[c].P, v);
                printf("  err attention flash spans %s%s nh=%d d=%d W=%d variant %d  %.2e\n", mode ? "f32" : "bf16",
                       pg ? " bf16-pages" : "", S[c].nh, S[c].d, S[c].window, v, rel);
                CHECK(rel <= bound, "%s spans case %zu variant %d rel %.2e", mode ? "f32" : "bf16", c, v, rel);
                worst = rel > worst ? rel : worst;
            }
        printf("  err attention flash %s worst %.2e\n", mode ? "f32-split" : "bf16", worst);
    }
    g_attn = NULL;
    tern__cuda_fa_f32 = keep_f32;
    tern__cuda_fa_cfg = keep_cfg;
    tern__cuda_fa512 = keep_512;
    tern__cuda_attn_mat = keep_mat;
}
