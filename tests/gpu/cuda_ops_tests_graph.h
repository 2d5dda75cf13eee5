/*
 * cuda_ops_tests_graph.h — step graphs (vt->graph_*): a small decode step (rmsnorm, q4 GEMV,
 * attention over a paged cache, download) is recorded once and replayed at two other
 * positions uploaded before each replay; every replay must match the same step run eagerly.
 * Also: an upload while recording makes graph_end refuse the graph (the driver then runs the
 * step eagerly), and graph_reset drops what was recorded. Launches that do not wait write their
 * downloads into the staging half they name (cuda_graph_launch_halves). Part of cuda_ops_tests.h.
 */

typedef struct gstep {
    void *x, *xn, *q, *o, *pos, *slot;
    tern_tensor w;
    tern_kv_layer kv;
    int nh, d, H;
} gstep;

/* the step's ops; host copies of pos/slot are given as a caller would (ignored while recording) */
static void gstep_run(const gstep *s, int32_t *pos_host, int32_t *slot_host, float *out) {
    tern_backend *g = g_gpu;
    tern_rows rows = {1, s->pos, s->slot, pos_host, slot_host};
    g->vt->rmsnorm(g, s->xn, s->x, 1, s->H, NULL, 1e-6f);
    g->vt->matmul(g, s->q, s->xn, 1, &s->w);
    g->vt->attention(g, s->o, s->q, &rows, s->nh, &s->kv, 0.125f, 0.0f);
    g->vt->download(g, out, s->o, sizeof(float) * (size_t)s->nh * s->d);
}

TEST(cuda_graph_replay) {
    if (!g_gpu->vt->graph_begin) { SKIP("cuda_graph_replay", "backend has no graphs"); return; }
    const int nh = 4, nkv = 2, d = 64, H = 128, bs = 16, ctx = 160, mb = ctx / bs;
    gstep s = {0};
    s.nh = nh;
    s.d = d;
    s.H = H;
    hw w = make_w(TERN_DT_Q, 4, 64, TERN_DT_BF16, 1, nh * d, H, 0);
    tern_error err = {0};
    s.w = w.t;
    CHECK(g_gpu->vt->upload_weight(g_gpu, &s.w, &err) == TERN_OK, "upload: %s", err.msg);
    size_t tok = (size_t)nkv * d, pool = (size_t)mb * bs * tok;
    float *kh = rnd(pool, 1.0f), *vh = rnd(pool, 1.0f), *xh = rnd(H, 1.0f);
    int32_t bt[10];
    for (int i = 0; i < mb; i++) bt[i] = mb - 1 - i;
    s.kv = (tern_kv_layer){TERN_DT_F32, nkv, d, bs, 0, to_gpu(kh, pool * 4), to_gpu(vh, pool * 4), to_gpu(bt, sizeof bt), mb};
    s.x = to_gpu(xh, H * 4);
    s.xn = g_gpu->vt->alloc(g_gpu, H * 4);
    s.q = g_gpu->vt->alloc(g_gpu, (size_t)nh * d * 4);
    s.o = g_gpu->vt->alloc(g_gpu, (size_t)nh * d * 4);
    int32_t p = 20, sl = 0;
    s.pos = to_gpu(&p, 4);
    s.slot = to_gpu(&sl, 4);
    float eager[256], replay[256];
    size_t ob = sizeof replay;
    /* record at position 20 (nothing runs), then replay at 150 and 3 */
    CHECK(g_gpu->vt->graph_begin(g_gpu, 42, replay, ob) == 1, "graph_begin");
    gstep_run(&s, &p, &sl, replay);
    CHECK(g_gpu->vt->graph_end(g_gpu, 1) == 1, "graph_end refused a clean recording");
    static const int32_t P[] = {150, 3, 20};
    for (int i = 0; i < 3; i++) {
        p = P[i];
        g_gpu->vt->upload(g_gpu, s.pos, &p, 4);
        gstep_run(&s, &p, &sl, eager);
        for (int j = 0; j < 256; j++) replay[j] = NAN;
        CHECK(g_gpu->vt->graph_replay(g_gpu, 42, replay, ob) == 1, "replay at %d", p);
        double rel = rel_or_nan(replay, eager, 256);
        printf("  err graph replay pos %d  %.2e\n", p, rel);
        CHECK(rel <= 1e-5, "graph replay at pos %d differs from eager: rel %.2e", p, rel);
    }
    CHECK(g_gpu->vt->graph_replay(g_gpu, 43, replay, ob) == 0, "replay of an unknown key");
    /* an upload inside the recording spoils it */
    CHECK(g_gpu->vt->graph_begin(g_gpu, 44, replay, ob) == 1, "graph_begin 2");
    g_gpu->vt->upload(g_gpu, s.pos, &p, 4);
    gstep_run(&s, &p, &sl, replay);
    CHECK(g_gpu->vt->graph_end(g_gpu, 1) == 0, "graph_end kept a recording with an upload in it");
    CHECK(g_gpu->vt->graph_replay(g_gpu, 44, replay, ob) == 0, "refused graph replayed");
    g_gpu->vt->graph_reset(g_gpu);
    CHECK(g_gpu->vt->graph_replay(g_gpu, 42, replay, ob) == 0, "graph survived reset");
    g_gpu->vt->free_weight(g_gpu, &s.w);
    void *bufs[] = {s.kv.k, s.kv.v, (void *)s.kv.block_table, s.x, s.xn, s.q, s.o, s.pos, s.slot};
    for (size_t i = 0; i < TERN_ARRAY_LEN(bufs); i++) g_gpu->vt->free(g_gpu, bufs[i]);
    free_w(&w);
    free(kh); free(vh); free(xh);
}

/* graph_launch into two staging halves: one graph (x += 1; download x) queued twice without waiting, the later half
 * waited for first — each half keeps its own launch's value (one shared staging would give both the last one) */
TEST(cuda_graph_launch_halves) {
    const tern_backend_vt *vt = g_gpu->vt;
    if (!vt->graph_begin || !vt->graph_launch || !vt->graph_wait) { SKIP("cuda_graph_launch_halves", "no graph launches"); return; }
    const float zero[4] = {0}, one[4] = {1, 1, 1, 1};
    float *x = to_gpu(zero, sizeof zero), *u = to_gpu(one, sizeof one), out[4] = {0}, a[4], b[4];
    const uint64_t key = 4242;
    CHECK(vt->graph_begin(g_gpu, key, out, sizeof out) == 1, "graph_begin");
    vt->add(g_gpu, x, x, u, 4);
    vt->download(g_gpu, out, x, sizeof out);
    CHECK(vt->graph_end(g_gpu, 1) == 1, "graph_end");
    for (int round = 0; round < 3; round++) { /* x counts 2·round + 1, 2·round + 2 */
        CHECK(vt->graph_launch(g_gpu, key, 0) == 1 && vt->graph_launch(g_gpu, key, 1) == 1, "launch round %d", round);
        for (int i = 0; i < 4; i++) a[i] = b[i] = NAN;
        CHECK(vt->graph_wait(g_gpu, key, 1, b, sizeof b) == 1 && vt->graph_wait(g_gpu, key, 0, a, sizeof a) == 1,
              "wait round %d", round);
        for (int i = 0; i < 4; i++)
            CHECK(a[i] == (float)(2 * round + 1) && b[i] == (float)(2 * round + 2),
                  "round %d element %d: half 0 read %g, half 1 read %g", round, i, a[i], b[i]);
    }
    for (int i = 0; i < 4; i++) a[i] = NAN;
    CHECK(vt->graph_replay(g_gpu, key, a, sizeof a) == 1 && a[0] == 7.0f, "replay after the halves read %g", a[0]);
    vt->graph_reset(g_gpu);
    vt->free(g_gpu, x);
    vt->free(g_gpu, u);
}
