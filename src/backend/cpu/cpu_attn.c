/*
 * cpu_attn.c — paged attention for the fast CPU backend.
 *
 * Default (tiles): an item is (row, block of query heads of one KV head). The row's visible keys
 * (lo..pos, lo = pos-W+1 with a window; with bidirectional spans the union with the row's span
 * range, tern_key_range_of in ops.h) are cut into tiles of 32 in key order; per tile the ISA's 4x4
 * `dots` of cpu_glm.h give every (head, key) score with one key load serving four heads, then a
 * tile-wise online softmax in f32 (running max m, sum l, the output rescaled by exp(m_old - m_new)
 * when the max grows), then out += p·V through `pv`. Each sum's order is fixed by the ISA and the
 * row's own key stream, so a row's result does not depend on the thread count, the head blocking
 * or the other rows of the batch. llama3-1b bf16 at 2048 context (2 threads): decode 7.5-7.7 ->
 * 8.6-8.8 tok/s, prefill 68 -> 79-81 tok/s against the per-key walk (bench/NOTES.md (m)).
 * TERN_CPU_ATTN=keys: the per-key walk (attn_task: items (row, head), one key at a time through the
 * kernel table's dot/axpy; also the fallback). Table entries < 0 are skipped, never read; keys
 * from the same step were written by kv_write before this runs, so every row of a prefill chunk
 * sees exactly the keys up to its own position.
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/glm_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct attn_ctx {
    const tern_cpu_kern *k;
    float *out;
    const float *q;
    const tern_rows *rows;
    int nh;
    const tern_kv_layer *kv;
    float scale, softcap;
} attn_ctx;

static const float *kv_vec(const tern_kv_layer *kv, const void *pool, int s, int p, int kvh) {
    if (s < 0 || p < 0 || p / kv->block_size >= kv->max_blocks) return NULL;
    int32_t blk = kv->block_table[(size_t)s * kv->max_blocks + p / kv->block_size];
    if (blk < 0) return NULL;
    size_t tok = (size_t)blk * kv->block_size + (size_t)(p % kv->block_size);
    return (const float *)pool + (tok * kv->n_head_kv + kvh) * kv->head_dim;
}

/* TERN_CPU_ATTN=keys: the per-key walk instead of the tiles (comparisons) */
static int tern_attn_tiled = -1;

/* ---- tiled: an item is (row, block of up to TERN_TILE_HB query heads of one KV head); its visible
 * keys go in tiles of TERN_TILE_K, in key order, through tern__tile_attend (glm_state.h: the GLM
 * latent attention's tile step, with V apart from K here and the softcap). */
typedef struct tile_ctx {
    attn_ctx a;
    const tern_glm_kern *gk;
    int hb, nhb; /* heads per item, items per (row, KV head) */
} tile_ctx;

static void tile_item(const tile_ctx *c, int r, int kvh, int h0, int nq) {
    const attn_ctx *a = &c->a;
    const tern_kv_layer *kv = a->kv;
    const int d = kv->head_dim, s = a->rows->slot[r];
    tern_tile_acc t;
    for (int i = 0; i < nq; i++) {
        const size_t row = (size_t)r * a->nh + (size_t)h0 + i;
        t.qp[i] = a->q + row * d;
        t.op[i] = a->out + row * d;
        memset(t.op[i], 0, (size_t)d * sizeof(float));
        t.m[i] = -INFINITY;
        t.l[i] = 0.0f;
    }
    tern_key_range kr = tern_key_range_of(kv, a->rows, r);
    const float *kp[TERN_TILE_K], *vp[TERN_TILE_K];
    int nk = 0;
    for (int b = kr.first; b <= kr.last; b++) {
        const float *kk = tern_key_visible(&kr, b) ? kv_vec(kv, kv->k, s, b, kvh) : NULL;
        if (!kk) continue;
        kp[nk] = kk;
        vp[nk++] = kv_vec(kv, kv->v, s, b, kvh);
        if (nk == TERN_TILE_K) { tern__tile_attend(c->gk, &t, nq, kp, vp, nk, d, d, a->scale, a->softcap); nk = 0; }
    }
    if (nk) tern__tile_attend(c->gk, &t, nq, kp, vp, nk, d, d, a->scale, a->softcap);
    for (int i = 0; i < nq; i++)
        if (t.l[i] > 0.0f) a->k->scal(t.op[i], 1.0f / t.l[i], d);
}

static void tile_task(void *arg, int ith, int nth) {
    const tile_ctx *c = arg;
    const attn_ctx *a = &c->a;
    const int nkv = a->kv->n_head_kv, G = a->nh / nkv;
    int64_t lo_i, hi_i;
    tern__cpu_split((int64_t)a->rows->n * nkv * c->nhb, 1, ith, nth, &lo_i, &hi_i);
    for (int64_t it = lo_i; it < hi_i; it++) {
        const int r = (int)(it / ((int64_t)nkv * c->nhb)), rem = (int)(it % ((int64_t)nkv * c->nhb));
        const int kvh = rem / c->nhb, h0 = kvh * G + (rem % c->nhb) * c->hb;
        tile_item(c, r, kvh, h0, TERN_MIN(c->hb, kvh * G + G - h0));
    }
}

/* per key: items (row, query head), one key at a time through the kernel table's dot/axpy */
static void attn_task(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    const tern_kv_layer *kv = a->kv;
    const tern_cpu_kern *k = a->k;
    int d = kv->head_dim, nh = a->nh, group = nh / kv->n_head_kv;
    int64_t lo_i, hi_i;
    tern__cpu_split((int64_t)a->rows->n * nh, 1, ith, nth, &lo_i, &hi_i);
    for (int64_t it = lo_i; it < hi_i; it++) {
        int r = (int)(it / nh), h = (int)(it % nh), kvh = h / group;
        int s = a->rows->slot[r];
        tern_key_range kr = tern_key_range_of(kv, a->rows, r);
        const float *qv = a->q + (size_t)it * d;
        float *o = a->out + (size_t)it * d;
        memset(o, 0, (size_t)d * sizeof *o);
        float m = -INFINITY, l = 0.0f;
        for (int b = kr.first; b <= kr.last; b++) {
            const float *kk = tern_key_visible(&kr, b) ? kv_vec(kv, kv->k, s, b, kvh) : NULL;
            if (!kk) continue;
            float sc = k->dot(qv, kk, d) * a->scale;
            if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
            if (sc > m) {
                if (l > 0.0f) {
                    float corr = expf(m - sc);
                    k->scal(o, corr, d);
                    l *= corr;
                }
                m = sc;
            }
            float p = expf(sc - m);
            l += p;
            k->axpy(o, p, kv_vec(kv, kv->v, s, b, kvh), d);
        }
        if (l > 0.0f) k->scal(o, 1.0f / l, d);
    }
}

void tern__cpu_attention(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                         const tern_kv_layer *kv, float scale, float softcap) {
    if (kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32) { /* compressed pages: cpu_kvq.c */
        tern__cpu_attention_q(be, out, q, rows, nh, kv, scale, softcap);
        return;
    }
    cpu_impl *c = be->impl;
    attn_ctx a = {c->k, out, q, rows, nh, kv, scale, softcap};
    if (tern_attn_tiled < 0) {
        const char *e = getenv("TERN_CPU_ATTN");
        tern_attn_tiled = !(e && !strcmp(e, "keys"));
    }
    /* one decode row of a tiny model: not worth waking the pool (same per-(row, head) results) */
    const int tiny = rows->pos_host && rows->n * nh <= 4 && (int64_t)rows->pos_host[0] * kv->head_dim < 16384;
    tern_glm_state *g = tern_attn_tiled ? tern__glm_state(be) : NULL;
    if (g && nh % kv->n_head_kv == 0) { /* tiled; heads of a KV group in blocks that still give every thread work
                                          * (the blocking never changes a row's bits: batch == alone) */
        const int G = nh / kv->n_head_kv;
        int hb = TERN_MIN(G, TERN_TILE_HB);
        while (hb > 1 && (int64_t)rows->n * kv->n_head_kv * ((G + hb - 1) / hb) < c->nth) hb = (hb + 1) / 2;
        tile_ctx tc = {a, g->gk, hb, (G + hb - 1) / hb};
        if (tiny) tile_task(&tc, 0, 1);
        else tern_pool_run(c->pool, tile_task, &tc);
        return;
    }
    if (tiny) attn_task(&a, 0, 1);
    else tern_pool_run(c->pool, attn_task, &a);
}
