/*
 * cuda_ops_tests_fp8.h — block-scaled FP8 weights (DeepSeek-V3 / GLM-5-FP8: e4m3 bytes + one
 * F32 scale per block of rows x columns, tensor.h) on the CUDA backend against cpu-ref:
 * the vector GEMV (block columns a multiple of 32), the generic warp-per-row kernel (other
 * block widths or unaligned rows), the prefill GEMM path (rows dequantized by welem, in both
 * compute modes), strided expert stacks (matmul_expert and moe_mlp) and the embedding.
 * Included by cuda_ops_tests.h; bounds as there (f32 1e-5, bf16 mode 1e-4).
 */
#ifndef TERN_CUDA_OPS_TESTS_FP8_H
#define TERN_CUDA_OPS_TESTS_FP8_H

/* nmat matrices [out, in] (gap extra rows between matrices) + F32 scales per [br, bc] block */
static hw make_fp8(int nmat, int out, int in, int br, int bc, int gap) {
    hw h;
    memset(&h, 0, sizeof h);
    tern_tensor *t = &h.t;
    t->dtype = TERN_DT_F8_E4M3;
    t->ndim = nmat > 1 ? 3 : 2;
    int k = 0;
    if (nmat > 1) t->shape[k++] = nmat;
    t->shape[k++] = out;
    t->shape[k++] = in;
    t->sdtype = TERN_DT_F32;
    t->group_size = bc;
    t->blk_rows = br;
    t->device = -1;
    t->name = "test-fp8";
    size_t rows = (size_t)out + (size_t)gap, so = (size_t)(out + br - 1) / br + (gap ? 1 : 0);
    size_t sc = (size_t)(in + bc - 1) / bc;
    h.data = malloc(rows * in * nmat + 16);
    h.scales = malloc(so * sc * nmat * sizeof(float) + 16);
    for (size_t i = 0; i < rows * in * nmat; i++) {
        uint8_t b = (uint8_t)test_rand_u64(&g_seed);
        ((uint8_t *)h.data)[i] = (b & 0x7f) == 0x7f ? 0x3f : b;
    }
    float amp = 1.0f / sqrtf((float)in) / 200.0f; /* e4m3 codes reach 448 */
    for (size_t i = 0; i < so * sc * nmat; i++) ((float *)h.scales)[i] = amp * (1.0f + 0.5f * test_randf(&g_seed));
    t->data = h.data;
    t->scales = h.scales;
    if (gap) {
        t->mat_stride = rows * in;
        t->mat_stride_s = so * sc * sizeof(float);
    }
    return h;
}

TEST(cuda_matmul_fp8) {
    static const struct { int out, in, br, bc; } S[] = {
        {300, 384, 128, 128}, {257, 640, 128, 128}, {96, 200, 32, 64}, {130, 96, 7, 16}, {64, 100, 16, 128}};
    static const int NS[] = {1, 2, 5, 8, 16, 40, 160};
    for (size_t s = 0; s < TERN_ARRAY_LEN(S); s++) {
        hw h = make_fp8(1, S[s].out, S[s].in, S[s].br, S[s].bc, 0);
        for (size_t i = 0; i < TERN_ARRAY_LEN(NS); i++) {
            double rel = check_matmul(g_gpu, &h, NS[i], -1);
            printf("  err fp8/%dx%d %dx%d n=%-4d f32  %.2e\n", S[s].br, S[s].bc, S[s].out, S[s].in, NS[i], rel);
            CHECK(rel <= 1e-5, "fp8 %dx%d out %d in %d n=%d rel %.3e", S[s].br, S[s].bc, S[s].out, S[s].in, NS[i], rel);
            if (NS[i] >= 40 && g_gpu16) {
                rel = check_matmul(g_gpu16, &h, NS[i], -1);
                CHECK(rel <= 1e-4, "fp8 bf16 mode n=%d rel %.3e", NS[i], rel);
            }
        }
        free_w(&h);
    }
}

TEST(cuda_matmul_fp8_experts) {
    hw h = make_fp8(4, 160, 256, 128, 128, 64);
    for (int e = 0; e < 4; e++) {
        double r = check_matmul(g_gpu, &h, e == 2 ? 70 : 1 + e, e);
        CHECK(r <= 1e-5, "expert %d rel %.2e", e, r);
    }
    free_w(&h);
    /* embedding rows decode exactly like the reference */
    hw em = make_fp8(1, 50, 256, 128, 128, 0);
    tern_tensor tr = em.t, tg = em.t;
    tern_error err = {0};
    CHECK(!g_ref->vt->upload_weight(g_ref, &tr, &err) && !g_gpu->vt->upload_weight(g_gpu, &tg, &err), "%s", err.msg);
    int32_t ids[4] = {0, 49, 7, 60};
    float *yr = malloc(4 * 256 * sizeof *yr);
    void *idd = to_gpu(ids, sizeof ids), *yd = nan_buf(g_gpu, 4 * 256);
    g_ref->vt->embed(g_ref, yr, ids, 4, &tr, 1.0f);
    g_gpu->vt->embed(g_gpu, yd, idd, 4, &tg, 1.0f);
    float *yg = from_gpu(g_gpu, yd, 4 * 256);
    for (int i = 0; i < 4 * 256; i++)
        if (memcmp(yg + i, yr + i, sizeof *yr)) { /* the first differing element, for the log */
            const int r = i / 256, j = i % 256, id = ids[r];
            printf("  fp8 embed: row %d (id %d) col %d: cuda %a ref %a code 0x%02x\n", r, id, j, yg[i], yr[i],
                   id >= 0 && id < 50 ? ((const uint8_t *)em.data)[(size_t)id * 256 + j] : 0);
            /* what the kernel saw: the tensor's block geometry, the scales on the device, a few ratios */
            float sd[2] = {0, 0};
            g_gpu->vt->download(g_gpu, sd, tg.scales, sizeof sd);
            printf("  fp8 embed: tensor blk_rows %d group %d fp8-block %d device %d; device scales %a %a host %a %a\n",
                   tg.blk_rows, tg.group_size, tern_tensor_is_fp8_block(&tg), tg.device, sd[0], sd[1],
                   ((const float *)em.scales)[0], ((const float *)em.scales)[1]);
            for (int q = 0; q < 4; q++)
                printf("  fp8 embed: col %d cuda/ref %.6g (row 1 %.6g)\n", q, yg[q] / yr[q], yg[256 + q] / yr[256 + q]);
            break;
        }
    CHECK(!memcmp(yg, yr, 4 * 256 * sizeof *yr), "fp8 embed differs from the reference");
    g_gpu->vt->free_weight(g_gpu, &tg);
    g_gpu->vt->free(g_gpu, idd); g_gpu->vt->free(g_gpu, yd);
    free(yr); free(yg); free_w(&em);
    /* upload checks */
    hw b = make_fp8(1, 8, 64, 128, 128, 0);
    b.t.sdtype = TERN_DT_BF16;
    CHECK(g_gpu->vt->upload_weight(g_gpu, &b.t, &err) == TERN_EUNSUPPORTED && strstr(err.msg, "test-fp8"), "%s", err.msg);
    free_w(&b);
}

TEST(cuda_moe_mlp_fp8) {
    const int E = 6, H = 256, I = 128, k = 2, n = 5;
    hw g = make_fp8(E, I, H, 128, 128, 0), u = make_fp8(E, I, H, 128, 128, 0), d = make_fp8(E, H, I, 128, 128, 0);
    tern_tensor gr = g.t, ur = u.t, dr = d.t, gg = g.t, ug = u.t, dg = d.t;
    tern_error err = {0};
    CHECK(!g_gpu->vt->upload_weight(g_gpu, &gg, &err) && !g_gpu->vt->upload_weight(g_gpu, &ug, &err) &&
          !g_gpu->vt->upload_weight(g_gpu, &dg, &err), "%s", err.msg);
    float *x = rnd((size_t)n * H, 1.0f), wts[n * k], *yr = malloc((size_t)n * H * sizeof *yr);
    int32_t idx[n * k];
    for (int i = 0; i < n * k; i++) { idx[i] = (i * 5 + i / k) % E; wts[i] = 0.3f + 0.1f * (float)i; }
    float *scr = malloc((size_t)n * k * 2 * I * sizeof *scr);
    g_ref->vt->moe_mlp(g_ref, yr, x, n, H, idx, wts, k, &gr, &ur, &dr, TERN_ACT_SILU, scr);
    void *xd = to_gpu(x, (size_t)n * H * 4), *idd = to_gpu(idx, sizeof idx), *wd = to_gpu(wts, sizeof wts);
    void *yd = nan_buf(g_gpu, (size_t)n * H), *sd = g_gpu->vt->alloc(g_gpu, (size_t)n * k * 2 * I * 4);
    g_gpu->vt->moe_mlp(g_gpu, yd, xd, n, H, idd, wd, k, &gg, &ug, &dg, TERN_ACT_SILU, sd);
    float *yg = from_gpu(g_gpu, yd, (size_t)n * H);
    double rel = rel_or_nan(yg, yr, (size_t)n * H);
    printf("  err fp8 moe_mlp %.2e\n", rel);
    CHECK(rel <= 1e-5, "fp8 moe_mlp rel %.2e", rel);
    g_gpu->vt->free_weight(g_gpu, &gg); g_gpu->vt->free_weight(g_gpu, &ug); g_gpu->vt->free_weight(g_gpu, &dg);
    g_gpu->vt->free(g_gpu, xd); g_gpu->vt->free(g_gpu, idd); g_gpu->vt->free(g_gpu, wd);
    g_gpu->vt->free(g_gpu, yd); g_gpu->vt->free(g_gpu, sd);
    free(x); free(yr); free(yg); free(scr);
    free_w(&g); free_w(&u); free_w(&d);
}

static void cuda_fp8_tests(void) {
    RUN(cuda_matmul_fp8);
    RUN(cuda_matmul_fp8_experts);
    RUN(cuda_moe_mlp_fp8);
}

#endif
