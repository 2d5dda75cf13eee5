/*
 * bench_glm_gpu.c — GLM-5 per layer and its latent attention on a chosen backend (cpu | cuda),
 * random weights (no files; io/weights.h synthetic store), real geometry from a preset:
 *
 *   1. machine rates: bandwidth (CUDA: the better of a 1 GiB device copy, read + write bytes, and
 *      a decode GEMV over a 512 MiB bf16 matrix; CPU: the streaming read probe) and the matmul rate (bf16 weight N x N times M rows, this backend's
 *      compute mode; on CUDA bf16 mode that op is 2 cuBLAS bf16 GEMMs (split-bf16, gemm.c), so
 *      the raw cuBLAS rate counts both);
 *   2. per layer (a 1-layer model of the preset's widths, vocab cut to 256, indexer "full"):
 *      a dense layer and a MoE layer (all experts resident), per --quant: prefill of each chunk
 *      from position 0 (tok/s vs floor = max(FLOPs / rate, weight bytes / bw)), then decode steps
 *      after the longest chunk (tok/s vs floor = bytes read per token / bw);
 *   2b. the absorbed per-head products (W_UK, W_UV) of 1 / 32 / a chunk of rows: a copy + matmul_expert
 *      + copy per head (the path of backends without matmul_heads) vs one matmul_heads call each;
 *   3. attention_latent alone (absorbed form) for rows at the end of a context T: dense over all
 *      T keys vs DSA (dsa_topk over T indexer keys + attention over the top-k), and the context
 *      where sparse wins (crossover), with and without the indexer's cost (shared layers reuse a
 *      selection).
 * First (--check, default glm5-tiny) the whole model on this backend against the fast CPU backend
 * with the same synthetic weights, prompt past index_topk + decode steps (rel L2 of the logits).
 * Prints tables and "csv," lines. GLM-5 FLOPs per row at position p: 2·(matrix params) +
 * 2·H·(2·kv_lora + rope)·min(p+1, top-k) + (DSA steps) 2·ni·di·(p+1).
 *
 *   make bench-glm && build/bench_glm_gpu --device cuda [--preset glm5-mini] [--quant q4,bf16]
 *       [--chunks 2048,8192] [--ctx 8192,32768,131072] [--rows 1,32] [--gen 8] [--compute bf16|f32]
 *       [--no-layers] [--no-attn] [--no-moe] [--no-heads] [--threads N] [--check PRESET|none]
 * TERN_GLM_ATTN=ref in the environment times CUDA's reference attention kernel instead.
 */
#include "backend/cpu/cpu.h"
#include "io/presets.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXL 16

typedef struct bopts {
    const char *device, *preset, *check; /* check: preset compared with the CPU first, or NULL */
    int quant[4], nq;            /* bits: 0 = bf16 */
    int chunks[MAXL], nchunk, ctx[MAXL], nctx, rows[MAXL], nrows;
    int gen, threads, bf16, layers, attn, moe, heads;
} bopts;

typedef struct rates { double bw, flops, bw_copy, bw_gemv; } rates; /* bytes/s (floors: the better of copy and
                                                                 bf16 GEMV), flop/s (raw cuBLAS-equivalent) */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (s && *s && n < max) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s || v < 1 || v > (1 << 24)) return -1;
        out[n++] = (int)v;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return -1;
    }
    return n;
}

static void *dev_upload(tern_backend *be, const void *h, size_t bytes) {
    void *d = be->vt->alloc(be, bytes ? bytes : 1);
    if (d && bytes) be->vt->upload(be, d, h, bytes);
    return d;
}
static float *dev_rand(tern_backend *be, size_t n, float amp) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    if (!h) return NULL;
    for (size_t i = 0; i < n; i++) h[i] = amp * frand();
    float *d = dev_upload(be, h, sizeof(float) * n);
    free(h);
    return d;
}

/* ---- 1. machine rates ---- */

static rates measure_rates(tern_backend *be, int on_gpu) {
    rates r = {0, 0, 0, 0};
    if (!on_gpu) {
        r.bw = tern_cpu_membw_probe(0) * 1e9;
    } else {
        const int w = 4096, n = (1 << 28) / w; /* 1 GiB of f32 */
        float *a = be->vt->alloc(be, sizeof(float) * (size_t)w * n), *b = be->vt->alloc(be, sizeof(float) * (size_t)w * n);
        if (a && b) {
            double best = 1e30;
            for (int i = 0; i < 4; i++) {
                be->vt->sync(be);
                double t0 = tern_time_s();
                be->vt->glm->copy_2d(be, b, w, a, w, n, w);
                be->vt->sync(be);
                double dt = tern_time_s() - t0;
                if (i && dt < best) best = dt;
            }
            r.bw = 2.0 * sizeof(float) * (double)w * n / best;
        }
        be->vt->free(be, a);
        be->vt->free(be, b);
        /* a decode GEMV over a 512 MiB bf16 matrix reads at least as fast as the copy: take the better */
        const int O = 16384, I = 16384;
        tern_tensor g = {.dtype = TERN_DT_BF16, .ndim = 2, .shape = {O, I}, .device = -1, .name = "bench"};
        void *gh = malloc((size_t)O * I * 2);
        tern_error ge = {0};
        if (gh) {
            memset(gh, 0x3c, (size_t)O * I * 2); /* bf16 0x3c3c: finite */
            g.data = gh;
            if (be->vt->upload_weight(be, &g, &ge) == TERN_OK) {
                float *x = dev_rand(be, I, 1.0f), *y = be->vt->alloc(be, sizeof(float) * O);
                double best = 1e30;
                for (int i = 0; x && y && i < 6; i++) {
                    be->vt->sync(be);
                    double t0 = tern_time_s();
                    be->vt->matmul(be, y, x, 1, &g);
                    be->vt->sync(be);
                    double dt = tern_time_s() - t0;
                    if (i && dt < best) best = dt;
                }
                r.bw_gemv = 2.0 * O * (double)I / best;
                if (be->vt->free_weight) be->vt->free_weight(be, &g);
                be->vt->free(be, x);
                be->vt->free(be, y);
            }
            free(gh);
        }
        r.bw_copy = r.bw;
        if (r.bw_gemv > r.bw) r.bw = r.bw_gemv;
    }
    const int N = on_gpu ? 8192 : 512, M = on_gpu ? 2048 : 64; /* M·N·4 bytes < half of gemm.c's scratch */
    tern_tensor t = {.dtype = TERN_DT_BF16, .ndim = 2, .shape = {N, N}, .device = -1, .name = "bench"};
    uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)N * N);
    tern_error e = {0};
    if (!wh) return r;
    for (size_t i = 0; i < (size_t)N * N; i++) wh[i] = tern_f32_to_bf16(0.02f * frand());
    t.data = wh;
    if (be->vt->upload_weight(be, &t, &e) == TERN_OK) {
        float *x = dev_rand(be, (size_t)M * N, 1.0f), *y = be->vt->alloc(be, sizeof(float) * (size_t)M * N);
        double best = 1e30;
        for (int i = 0; x && y && i < 4; i++) {
            be->vt->sync(be);
            double t0 = tern_time_s();
            be->vt->matmul(be, y, x, M, &t);
            be->vt->sync(be);
            double dt = tern_time_s() - t0;
            if (i && dt < best) best = dt;
        }
        const int gemms = 1; /* --compute bf16: one plain bf16 GEMM (bf16x2 would run two) */
        r.flops = gemms * 2.0 * M * (double)N * N / best;
        if (be->vt->free_weight) be->vt->free_weight(be, &t);
        be->vt->free(be, x);
        be->vt->free(be, y);
    } else {
        fprintf(stderr, "bench_glm_gpu: matmul rate: %s\n", e.msg);
    }
    free(wh);
    return r;
}

/* ---- 2. per layer ---- */

/* Replace the value of "key" in a JSON object text (numbers, strings or flat arrays). */
static char *json_set(char *js, const char *key, const char *val) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *p = strstr(js, pat);
    if (!p) return js;
    char *v = p + strlen(pat), *e = v;
    while (*e == ' ') e++;
    if (*e == '[') e = strchr(e, ']') + 1;
    else while (*e && *e != ',' && *e != '}') e++;
    size_t n = strlen(js) + strlen(val) + 8;
    char *o = malloc(n);
    if (!o) return js;
    snprintf(o, n, "%.*s %s%s", (int)(v - js), js, val, e);
    free(js);
    return o;
}

/* matrix parameters one row multiplies (experts: the k chosen), and its attention FLOPs at pos p */
static double layer_mm_params(const tern_model_config *c, int moe, int sparse) {
    double D = c->n_embd, H = c->n_head, rq = c->q_lora_rank, rkv = c->kv_lora_rank;
    double dq = c->qk_nope_head_dim + c->qk_rope_head_dim, W = rkv + c->qk_rope_head_dim;
    double p = rq * D + H * dq * rq + W * D + D * H * c->v_head_dim + H * rkv * c->qk_nope_head_dim +
               H * c->v_head_dim * rkv + (double)c->index_head_dim * D;
    if (sparse) p += (double)c->index_n_heads * c->index_head_dim * rq + (double)c->index_n_heads * D;
    if (moe) p += (double)c->n_expert * D + 3.0 * D * c->n_ff_expert * (c->n_expert_used + c->n_shared_experts);
    else p += 3.0 * D * c->n_ff;
    return p;
}
static double attn_flops(const tern_model_config *c, long p, int sparse) {
    long keys = p + 1 < c->index_topk ? p + 1 : c->index_topk;
    if (!sparse) keys = p + 1;
    double f = 2.0 * c->n_head * (2.0 * c->kv_lora_rank + c->qk_rope_head_dim) * (double)keys;
    if (sparse) f += 2.0 * c->index_n_heads * c->index_head_dim * (double)(p + 1);
    return f;
}

static tern_status forward_rows(tern_model *m, tern_kv *kv, int p0, int n, float *logits, tern_error *e) {
    int32_t *tok = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * n), *slot = calloc((size_t)n, 4);
    uint8_t *want = calloc((size_t)n, 1);
    tern_status s = TERN_ENOMEM;
    if (tok && pos && slot && want) {
        for (int i = 0; i < n; i++) tok[i] = 2 + (i * 7919) % 200, pos[i] = p0 + i;
        want[n - 1] = 1;
        tern_batch b = {.n = n, .tokens = tok, .pos = pos, .slot = slot, .want = want};
        s = tern_kv_reserve(kv, 0, p0 + n, e);
        if (!s) tern_kv_sync(kv);
        if (!s) s = tern_model_forward(m, &b, kv, logits, e);
    } else {
        tern_err(e, s, "out of memory");
    }
    free(tok); free(pos); free(slot); free(want);
    return s;
}

static const char *quant_name(int bits, char *buf, size_t n) {
    if (!bits) snprintf(buf, n, "bf16");
    else snprintf(buf, n, "q%d", bits);
    return buf;
}

static int bench_layer(tern_backend *be, const bopts *o, const rates *rt, int moe, int bits) {
    const char *base = tern_preset_config(o->preset);
    char *js = strdup(base), qn[16], kind[8];
    snprintf(kind, sizeof kind, "%s", moe ? "moe" : "dense");
    quant_name(bits, qn, sizeof qn);
    js = json_set(js, "num_hidden_layers", "1");
    js = json_set(js, "vocab_size", "256");
    js = json_set(js, "first_k_dense_replace", moe ? "0" : "1");
    js = json_set(js, "indexer_types", "[\"full\"]");
    tern_error e = {0};
    tern_model_config cfg = {0};
    tern_weights *ws = NULL;
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    float *logits = NULL;
    int maxc = 1, rc = 1;
    for (int i = 0; i < o->nchunk; i++) maxc = TERN_MAX(maxc, o->chunks[i]);
    tern_synth_spec sp = {.bits = bits, .group_size = 64, .seed = 7};
    tern_model_opts mo = {.max_batch = maxc};
    double t0 = tern_time_s();
    tern_status s = tern_config_parse(&cfg, js, strlen(js), o->preset, &e);
    if (!s) s = tern_weights_open_synth(&ws, &cfg, &sp, &e);
    if (!s) s = tern_model_load_from(&m, &cfg, ws, be, &mo, &e);
    tern_kv_opts ko = {.n_slots = 1, .max_ctx = maxc + o->gen + 8};
    if (!s) s = tern_kv_open(&kv, be, &cfg, &ko, &e);
    if (!s && !(logits = malloc(sizeof(float) * 256))) s = tern_err(&e, TERN_ENOMEM, "out of memory");
    if (s) { fprintf(stderr, "bench_glm_gpu: %s layer %s: %s\n", kind, qn, e.msg); goto done; }
    double t_load = tern_time_s() - t0;
    tern_model_stats st;
    tern_model_get_stats(m, &st);
    double wbytes = 0;
    for (int d = 0; d < TERN_DT_COUNT; d++) wbytes += (double)st.bytes_by_dtype[d];
    /* decode bytes: model.c counts "shared_experts." as routed experts (k/E of them): add the rest */
    double bpp = st.n_params ? wbytes / (double)st.n_params : 2.0, dec_bytes = st.bytes_per_token;
    if (moe) dec_bytes += 3.0 * cfg.n_embd * cfg.n_ff_expert * cfg.n_shared_experts * bpp *
                          (1.0 - (double)cfg.n_expert_used / cfg.n_expert);
    printf("%s layer, %s: %.2f GB of weights (%.1f s to make and load)\n", kind, qn, wbytes / 1e9, t_load);
    if ((s = forward_rows(m, kv, 0, TERN_MIN(64, maxc), logits, &e))) goto fail; /* warm-up: GEMM paths */
    for (int i = 0; i < o->nchunk; i++) {
        int S = o->chunks[i];
        double t = tern_time_s();
        if ((s = forward_rows(m, kv, 0, S, logits, &e))) goto fail;
        t = tern_time_s() - t;
        int sparse = S > cfg.index_topk;
        double fl = layer_mm_params(&cfg, moe, sparse) * 2.0 * S;
        for (long p = 0; p < S; p++) fl += attn_flops(&cfg, p, sparse);
        double floor_s = TERN_MAX(rt->flops > 0 ? fl / rt->flops : 0, rt->bw > 0 ? wbytes / rt->bw : 0);
        printf("  prefill %-6d %10.1f tok/s  %9.2f ms  floor %9.2f ms (%5.1f%%)  %.2f TFLOP/s\n", S, S / t, t * 1e3,
               floor_s * 1e3, 100.0 * floor_s / t, fl / t / 1e12);
        printf("csv,layer,%s,%s,prefill,%d,%.3f,%.3f,%.3f\n", kind, qn, S, t * 1e3, floor_s * 1e3, S / t);
    }
    /* decode after the longest chunk (its cache is filled): warm-up steps record step graphs */
    int p0 = maxc;
    for (int i = 0; i < 2 && !s; i++) s = forward_rows(m, kv, p0 + i, 1, logits, &e);
    double best = 1e30, sum = 0;
    for (int i = 0; i < o->gen && !s; i++) {
        double t = tern_time_s();
        s = forward_rows(m, kv, p0 + 2 + i, 1, logits, &e);
        t = tern_time_s() - t;
        best = TERN_MIN(best, t);
        sum += t;
    }
    if (s) goto fail;
    {
        int sparse = p0 + 1 > cfg.index_topk;
        double floor_s = rt->bw > 0 ? dec_bytes / rt->bw : 0, mean = sum / o->gen;
        printf("  decode @%-6d %9.1f tok/s  %9.3f ms (mean %.3f)  floor %7.3f ms (%5.1f%%)  %.1f MB/token, %.2f "
               "GFLOP\n", p0, 1.0 / best, best * 1e3, mean * 1e3, floor_s * 1e3, 100.0 * floor_s / best, dec_bytes / 1e6,
               (2.0 * layer_mm_params(&cfg, moe, sparse) + attn_flops(&cfg, p0, sparse)) / 1e9);
        printf("csv,layer,%s,%s,decode,%d,%.4f,%.4f,%.1f\n", kind, qn, p0, best * 1e3, floor_s * 1e3, 1.0 / best);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_glm_gpu: %s layer %s: %s\n", kind, qn, e.msg);
done:
    free(logits);
    tern_kv_close(kv);
    tern_model_free(m);
    tern_weights_close(ws);
    tern_config_free(&cfg);
    free(js);
    return rc;
}

/* ---- 2b. the absorbed per-head products: one matmul_heads call vs a matmul_expert per head ---- */

static void heads_loop(tern_backend *be, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                       const tern_tensor *w, float *ta, float *tb) {
    int out = (int)w->shape[1], in = (int)w->shape[2];
    for (int h = 0; h < nh; h++) {
        be->vt->glm->copy_2d(be, ta, in, x + (size_t)h * hx, ldx, n, in);
        be->vt->matmul_expert(be, tb, ta, n, w, h);
        be->vt->glm->copy_2d(be, y + (size_t)h * hy, ldy, tb, out, n, out);
    }
}

static int bench_heads(tern_backend *be, const bopts *o, int on_gpu) {
    const char *js = tern_preset_config(o->preset);
    tern_model_config cfg = {0};
    tern_error e = {0};
    if (tern_config_parse(&cfg, js, strlen(js), o->preset, &e)) { fprintf(stderr, "bench_glm_gpu: %s\n", e.msg); return 1; }
    int H = cfg.n_head, rkv = cfg.kv_lora_rank, dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim;
    int dq = dn + dr, W = rkv + dr, N = 1, rc = 0;
    for (int i = 0; i < o->nchunk; i++) N = TERN_MAX(N, o->chunks[i]);
    N = TERN_MIN(N, 2048);
    int ns[3] = {1, 32, N};
    printf("absorbed per-head products (W_UK %d x %d x %d, W_UV %d x %d x %d), ms: matmul_expert per head vs "
           "matmul_heads\n", H, rkv, dn, H, dv, rkv);
    if (!be->vt->glm->matmul_heads) printf("  (backend %s has no matmul_heads: skipped)\n", be->vt->name);
    for (int q = 0; q < o->nq && be->vt->glm->matmul_heads; q++) {
        tern_weights *ws = NULL;
        tern_synth_spec sp = {.bits = o->quant[q], .group_size = 64, .seed = 5};
        tern_tensor uk, uv;
        int64_t shk[3] = {H, rkv, dn}, shv[3] = {H, dv, rkv};
        tern_status s = tern_weights_open_synth(&ws, &cfg, &sp, &e);
        if (!s) s = tern_weights_get(ws, "bench.embed_q", 3, shk, &uk, &e);
        if (!s) s = tern_weights_get(ws, "bench.unembed_out", 3, shv, &uv, &e);
        if (!s) s = be->vt->upload_weight(be, &uk, &e);
        if (!s) s = be->vt->upload_weight(be, &uv, &e);
        float *x1 = dev_rand(be, (size_t)N * H * dq, 1.0f), *y1 = be->vt->alloc(be, sizeof(float) * (size_t)N * H * W);
        float *x2 = dev_rand(be, (size_t)N * H * rkv, 1.0f), *y2 = be->vt->alloc(be, sizeof(float) * (size_t)N * H * dv);
        float *ta = be->vt->alloc(be, sizeof(float) * (size_t)N * TERN_MAX(dn, rkv));
        float *tb = be->vt->alloc(be, sizeof(float) * (size_t)N * TERN_MAX(rkv, dv));
        if (s || !x1 || !y1 || !x2 || !y2 || !ta || !tb) {
            fprintf(stderr, "bench_glm_gpu: heads: %s\n", s ? e.msg : "out of memory");
            rc = 1;
        }
        char qn[16];
        quant_name(o->quant[q], qn, sizeof qn);
        for (int i = 0; i < 3 && !rc; i++) {
            int n = ns[i], inner = on_gpu ? (n > 64 ? 3 : 20) : 1;
            double t[2];
            for (int v = 0; v < 2; v++) {
                double best = 1e30;
                for (int rep = 0; rep < 3; rep++) {
                    be->vt->sync(be);
                    double t0 = tern_time_s();
                    for (int k = 0; k < inner; k++) {
                        if (v == 0) {
                            heads_loop(be, y1, H * W, W, x1, H * dq, dq, n, H, &uk, ta, tb);
                            heads_loop(be, y2, H * dv, dv, x2, H * rkv, rkv, n, H, &uv, ta, tb);
                        } else {
                            be->vt->glm->matmul_heads(be, y1, H * W, W, x1, H * dq, dq, n, H, &uk);
                            be->vt->glm->matmul_heads(be, y2, H * dv, dv, x2, H * rkv, rkv, n, H, &uv);
                        }
                    }
                    be->vt->sync(be);
                    best = TERN_MIN(best, (tern_time_s() - t0) / inner);
                }
                t[v] = best * 1e3;
            }
            printf("  %-5s rows %-5d per head %9.3f   matmul_heads %9.3f   (%.1fx)\n", qn, n, t[0], t[1], t[0] / t[1]);
            printf("csv,heads,%s,%d,%.4f,%.4f\n", qn, n, t[0], t[1]);
        }
        if (!s && be->vt->free_weight) { be->vt->free_weight(be, &uk); be->vt->free_weight(be, &uv); }
        be->vt->free(be, x1); be->vt->free(be, y1); be->vt->free(be, x2); be->vt->free(be, y2);
        be->vt->free(be, ta); be->vt->free(be, tb);
        tern_weights_close(ws);
        if (rc) break;
    }
    tern_config_free(&cfg);
    return rc;
}

/* ---- 3. latent attention: dense vs DSA ---- */

typedef struct actx {
    tern_backend *be;
    tern_kv_layer kv;
    tern_rows rows;
    float *q, *qi, *wi, *out, scale;
    int32_t *sel;
    int H, rkv, ni, K;
} actx;

static void a_dense(actx *a) { a->be->vt->glm->attention_latent(a->be, a->out, a->q, &a->rows, a->H, &a->kv, a->rkv, a->scale, NULL, a->K); }
static void a_sparse(actx *a) { a->be->vt->glm->attention_latent(a->be, a->out, a->q, &a->rows, a->H, &a->kv, a->rkv, a->scale, a->sel, a->K); }
static void a_topk(actx *a) { a->be->vt->glm->dsa_topk(a->be, a->sel, a->qi, a->wi, &a->rows, a->ni, &a->kv, 0.088f, a->K, NULL); }

static double time_ms(actx *a, void (*fn)(actx *), int inner) {
    fn(a);
    a->be->vt->sync(a->be);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = tern_time_s();
        for (int i = 0; i < inner; i++) fn(a);
        a->be->vt->sync(a->be);
        best = TERN_MIN(best, (tern_time_s() - t0) / inner);
    }
    return best * 1e3;
}

static int bench_attn(tern_backend *be, const bopts *o, int on_gpu) {
    const char *js = tern_preset_config(o->preset);
    tern_model_config cfg = {0};
    tern_error e = {0};
    if (tern_config_parse(&cfg, js, strlen(js), o->preset, &e)) { fprintf(stderr, "bench_glm_gpu: %s\n", e.msg); return 1; }
    int H = cfg.n_head, rkv = cfg.kv_lora_rank, D = rkv + cfg.qk_rope_head_dim, ni = cfg.index_n_heads;
    int di = cfg.index_head_dim, K = cfg.index_topk, BS = 64, Tmax = 1, Rmax = 1, rc = 0;
    tern_config_free(&cfg);
    for (int i = 0; i < o->nctx; i++) Tmax = TERN_MAX(Tmax, o->ctx[i]);
    for (int i = 0; i < o->nrows; i++) Rmax = TERN_MAX(Rmax, o->rows[i]);
    int mb = (Tmax + BS - 1) / BS;
    int32_t *bt = malloc(sizeof(int32_t) * mb), *pos = malloc(sizeof(int32_t) * Rmax), *slot = calloc((size_t)Rmax, 4);
    for (int i = 0; i < mb; i++) bt[i] = i;
    actx a = {.be = be, .H = H, .rkv = rkv, .ni = ni, .K = K, .scale = 1.0f / 24.0f};
    a.kv = (tern_kv_layer){.dtype = TERN_DT_F32, .n_head_kv = 1, .head_dim = D, .block_size = BS, .max_blocks = mb,
                           .latent = 1, .v_dim = di};
    a.kv.k = dev_rand(be, (size_t)mb * BS * D, 1.0f);
    a.kv.v = dev_rand(be, (size_t)mb * BS * di, 1.0f);
    a.kv.block_table = dev_upload(be, bt, sizeof(int32_t) * mb);
    a.q = dev_rand(be, (size_t)Rmax * H * D, 0.3f);
    a.qi = dev_rand(be, (size_t)Rmax * ni * di, 1.0f);
    a.wi = dev_rand(be, (size_t)Rmax * ni, 1.0f);
    a.out = be->vt->alloc(be, sizeof(float) * (size_t)Rmax * H * rkv);
    a.sel = be->vt->alloc(be, sizeof(int32_t) * (size_t)Rmax * K);
    int32_t *dpos = be->vt->alloc(be, sizeof(int32_t) * Rmax), *dslot = dev_upload(be, slot, sizeof(int32_t) * Rmax);
    if (!a.kv.k || !a.kv.v || !a.q || !a.qi || !a.wi || !a.out || !a.sel || !dpos || !dslot) {
        fprintf(stderr, "bench_glm_gpu: attention: out of memory\n");
        rc = 1;
        goto done;
    }
    printf("latent attention (absorbed; %d heads, record %d, values %d; indexer %d x %d, top-%d), ms per call\n", H, D,
           rkv, ni, di, K);
    printf("%8s %5s %10s %10s %10s %12s %8s\n", "context", "rows", "dense", "dsa_topk", "sparse", "topk+sparse", "winner");
    for (int ri = 0; ri < o->nrows; ri++) {
        int R = o->rows[ri], cross = 0, cross_shared = 0;
        for (int ti = 0; ti < o->nctx; ti++) {
            int T = o->ctx[ti];
            if (R > T) continue;
            for (int r = 0; r < R; r++) pos[r] = T - R + r;
            be->vt->upload(be, dpos, pos, sizeof(int32_t) * R);
            a.rows = (tern_rows){.n = R, .pos = dpos, .slot = dslot, .pos_host = pos, .slot_host = slot};
            int inner = on_gpu ? 10 : 1;
            double dn = time_ms(&a, a_dense, inner), tk = 0, sp = 0;
            if (T > K) {
                tk = time_ms(&a, a_topk, inner);
                sp = time_ms(&a, a_sparse, inner);
            }
            const char *win = T <= K ? "dense(=)" : tk + sp < dn ? "sparse" : "dense";
            if (T > K && !cross && tk + sp < dn) cross = T;
            if (T > K && !cross_shared && sp < dn) cross_shared = T;
            printf("%8d %5d %10.3f %10.3f %10.3f %12.3f %8s\n", T, R, dn, tk, sp, tk + sp, win);
            printf("csv,attn,%d,%d,%.4f,%.4f,%.4f\n", T, R, dn, tk, sp);
        }
        printf("crossover (rows %d): sparse incl. dsa_topk wins from context %s%d; with a shared selection from %s%d\n",
               R, cross ? "" : "none of the listed, > ", cross ? cross : Tmax, cross_shared ? "" : "none, > ",
               cross_shared ? cross_shared : Tmax);
        printf("csv,crossover,%d,%d,%d\n", R, cross, cross_shared);
    }
done:
    be->vt->free(be, a.kv.k); be->vt->free(be, a.kv.v); be->vt->free(be, (void *)a.kv.block_table);
    be->vt->free(be, a.q); be->vt->free(be, a.qi); be->vt->free(be, a.wi); be->vt->free(be, a.out);
    be->vt->free(be, a.sel); be->vt->free(be, dpos); be->vt->free(be, dslot);
    free(bt); free(pos); free(slot);
    return rc;
}

/* ---- 0. the whole model on this backend vs the fast CPU backend (same synthetic weights) ---- */

static int check_vs_cpu(tern_backend *be, const bopts *o, int bits) {
    const char *js = tern_preset_config(o->check);
    tern_backend *cpu = NULL;
    tern_backend_opts co = {.n_threads = o->threads};
    tern_error e = {0};
    tern_model_config cfg = {0};
    tern_weights *ws[2] = {NULL, NULL};
    tern_model *m[2] = {NULL, NULL};
    tern_kv *kv[2] = {NULL, NULL};
    float *lg[2] = {NULL, NULL};
    int rc = 1, P = 0;
    tern_status s = tern_backend_cpu_open(&cpu, &co, &e);
    if (!s) s = tern_config_parse(&cfg, js, strlen(js), o->check, &e);
    if (s) goto done;
    P = cfg.index_topk + cfg.index_topk / 2 + 5; /* past index_topk: DSA selects */
    tern_backend *bs[2] = {be, cpu};
    for (int i = 0; i < 2 && !s; i++) {
        tern_synth_spec sp = {.bits = bits, .group_size = 64, .seed = 11};
        tern_model_opts mo = {.max_batch = P};
        tern_kv_opts ko = {.n_slots = 1, .max_ctx = P + 8};
        s = tern_weights_open_synth(&ws[i], &cfg, &sp, &e);
        if (!s) s = tern_model_load_from(&m[i], &cfg, ws[i], bs[i], &mo, &e);
        if (!s) s = tern_kv_open(&kv[i], bs[i], &cfg, &ko, &e);
        if (!s && !(lg[i] = malloc(sizeof(float) * (size_t)cfg.n_vocab))) s = tern_err(&e, TERN_ENOMEM, "out of memory");
    }
    if (s) goto done;
    double worst = 0;
    for (int step = 0; step < 4 && !s; step++) { /* the prompt, then 3 decode steps */
        int p0 = step ? P + step - 1 : 0, n = step ? 1 : P;
        for (int i = 0; i < 2 && !s; i++) s = forward_rows(m[i], kv[i], p0, n, lg[i], &e);
        if (s) break;
        double num = 0, den = 0;
        for (int v = 0; v < cfg.n_vocab; v++) {
            double d = (double)lg[0][v] - lg[1][v];
            num += d * d;
            den += (double)lg[1][v] * lg[1][v];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!(rel <= worst)) worst = rel; /* NaN sticks */
    }
    if (s) goto done;
    char qn[16];
    rc = !(worst <= 1e-2);
    printf("check %s %s: %s vs cpu logits, prompt %d (DSA from %d) + 3 decode steps: worst rel L2 %.2e %s\n", o->check,
           quant_name(bits, qn, sizeof qn), be->vt->name, P, cfg.index_topk + 1, worst, rc ? "FAIL" : "ok");
    printf("csv,check,%s,%s,%.3e\n", o->check, qn, worst);
done:
    if (s) fprintf(stderr, "bench_glm_gpu: check: %s\n", e.msg);
    for (int i = 0; i < 2; i++) {
        free(lg[i]);
        tern_kv_close(kv[i]);
        tern_model_free(m[i]);
        tern_weights_close(ws[i]);
    }
    tern_config_free(&cfg);
    tern_backend_close(cpu);
    return rc;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_glm_gpu [--device cpu|cuda] [--preset NAME] [--quant q4,bf16] [--chunks N,..] "
                    "[--ctx T,..] [--rows R,..] [--gen N] [--compute bf16|f32] [--threads N] [--check PRESET|none] "
                    "[--no-layers] [--no-attn] [--no-moe] [--no-heads]\n");
    return 2;
}

int bench_glm_gpu_main(int argc, char **argv) {
    bopts o = {.device = "cuda", .preset = "glm5-mini", .check = "glm5-tiny", .gen = 8, .bf16 = 1, .layers = 1, .attn = 1, .moe = 1,
               .heads = 1};
    const char *quant = "q4,bf16", *chunks = "2048,8192", *ctx = "2560,4096,8192,16384,32768,65536,131072", *rows = "1,32";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-layers")) { o.layers = 0; continue; }
        if (!strcmp(a, "--no-attn")) { o.attn = 0; continue; }
        if (!strcmp(a, "--no-moe")) { o.moe = 0; continue; }
        if (!strcmp(a, "--no-heads")) { o.heads = 0; continue; }
        if (!v) return usage();
        i++;
        if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--preset")) o.preset = v;
        else if (!strcmp(a, "--quant")) quant = v;
        else if (!strcmp(a, "--chunks")) chunks = v;
        else if (!strcmp(a, "--ctx")) ctx = v;
        else if (!strcmp(a, "--rows")) rows = v;
        else if (!strcmp(a, "--gen")) o.gen = atoi(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--compute")) o.bf16 = !strcmp(v, "bf16");
        else if (!strcmp(a, "--check")) o.check = strcmp(v, "none") ? v : NULL;
        else return usage();
    }
    for (const char *p = quant; *p;) {
        if (o.nq < 4 && !strncmp(p, "bf16", 4)) o.quant[o.nq++] = 0, p += 4;
        else if (o.nq < 4 && p[0] == 'q' && p[1] >= '2' && p[1] <= '8') o.quant[o.nq++] = p[1] - '0', p += 2;
        else return usage();
        if (*p == ',') p++;
    }
    if ((o.nchunk = parse_list(chunks, o.chunks, MAXL)) < 1 || (o.nctx = parse_list(ctx, o.ctx, MAXL)) < 1 ||
        (o.nrows = parse_list(rows, o.rows, MAXL)) < 1 || o.gen < 1)
        return usage();
    if (!tern_preset_config(o.preset) || (o.check && !tern_preset_config(o.check))) {
        fprintf(stderr, "bench_glm_gpu: unknown preset %s\n", tern_preset_config(o.preset) ? o.check : o.preset);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive a timeout kill */
    int on_gpu = !strcmp(o.device, "cuda");
    if (!on_gpu && strcmp(o.device, "cpu")) return usage();
    tern_error e = {0};
    tern_backend *be = NULL;
    tern_backend_opts bo = {.n_threads = o.threads, .compute = on_gpu && o.bf16 ? TERN_COMPUTE_BF16 : TERN_COMPUTE_F32};
    if ((on_gpu ? tern_backend_cuda_open(&be, &bo, &e) : tern_backend_cpu_open(&be, &bo, &e)) != TERN_OK) {
        fprintf(stderr, "bench_glm_gpu: %s\n", e.msg);
        return 1;
    }
    if (!be->vt->glm) { fprintf(stderr, "bench_glm_gpu: backend %s has no GLM ops\n", be->vt->name); tern_backend_close(be); return 1; }
    rates rt = measure_rates(be, on_gpu);
    printf("GLM-5 bench: %s backend (%s compute), preset %s; copy bandwidth %.0f GB/s, matmul rate %.1f TFLOP/s%s\n",
           be->vt->name, bo.compute == TERN_COMPUTE_BF16 ? "bf16" : "f32", o.preset, rt.bw / 1e9, rt.flops / 1e12,
           on_gpu && o.bf16 ? " (raw cuBLAS bf16: 2 GEMMs per split-bf16 matmul)" : "");
    if (on_gpu) printf("  (bandwidth: device copy %.0f GB/s read+write, bf16 GEMV %.0f GB/s read; floors use the higher)\n",
                       rt.bw_copy / 1e9, rt.bw_gemv / 1e9);
    printf("csv,rates,%s,%.1f,%.3f,%.1f,%.1f\n", be->vt->name, rt.bw / 1e9, rt.flops / 1e12, rt.bw_copy / 1e9,
           rt.bw_gemv / 1e9);
    int rc = 0;
    for (int q = 0; o.check && q < o.nq; q++) rc |= check_vs_cpu(be, &o, o.quant[q]);
    if (o.heads) rc |= bench_heads(be, &o, on_gpu);
    if (o.attn) rc |= bench_attn(be, &o, on_gpu);
    if (o.layers)
        for (int q = 0; q < o.nq; q++)
            for (int moe = 0; moe <= o.moe; moe++) rc |= bench_layer(be, &o, &rt, moe, o.quant[q]);
    tern_backend_close(be);
    return rc;
}

#ifndef BENCH_GLM_GPU_NO_MAIN
int main(int argc, char **argv) { return bench_glm_gpu_main(argc, argv); }
#endif
