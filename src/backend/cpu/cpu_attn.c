/*
 * cpu_attn.c — paged attention for the fast CPU backend.
 *
 * Work items are (row, query head) pairs split evenly over the pool — or, for GQA when there are
 * at least as many (row, KV head) pairs as threads, (row, KV head) pairs whose query heads walk
 * the keys together (one load of each K/V row for the group; the same bits). Each item walks the
 * visible keys of its row (lo..pos, lo = pos-W+1 with a window; with bidirectional spans the
 * union with the row's span range, tern_key_range_of in ops.h) through the block table and
 * keeps an online softmax in f32: running max m, running sum l, and the unnormalised output
 * o (rescaled by exp(m_old - m_new) when the max grows). Dot products and the p·v updates
 * are the ISA kernel table's dot/axpy, so head_dim is any size (64..512 in practice) and no
 * scratch beyond the output row is needed. Table entries < 0 are skipped, never read; keys
 * from the same step were written by kv_write before this runs, so every row of a prefill
 * chunk sees exactly the keys up to its own position.
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>
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

/* Query heads h0 .. h0+nq-1 of row r (all of KV head kvh) walk the row's visible keys together:
 * each K and V row is loaded once for them; per head the operations and their order do not depend
 * on nq, so any grouping gives the same bits. */
#define ATTN_GMAX 16
static void walk_keys(const attn_ctx *a, int r, int kvh, int h0, int nq) {
    const tern_kv_layer *kv = a->kv;
    const tern_cpu_kern *k = a->k;
    const int d = kv->head_dim, nh = a->nh, s = a->rows->slot[r];
    tern_key_range kr = tern_key_range_of(kv, a->rows, r);
    const float *qv[ATTN_GMAX];
    float *o[ATTN_GMAX], m[ATTN_GMAX], l[ATTN_GMAX];
    for (int j = 0; j < nq; j++) {
        const size_t row = (size_t)r * nh + (size_t)h0 + j;
        qv[j] = a->q + row * d;
        o[j] = a->out + row * d;
        memset(o[j], 0, (size_t)d * sizeof *o[j]);
        m[j] = -INFINITY;
        l[j] = 0.0f;
    }
    for (int b = kr.first; b <= kr.last; b++) {
        const float *kk = tern_key_visible(&kr, b) ? kv_vec(kv, kv->k, s, b, kvh) : NULL;
        if (!kk) continue;
        const float *vv = kv_vec(kv, kv->v, s, b, kvh);
        for (int j = 0; j < nq; j++) {
            float sc = k->dot(qv[j], kk, d) * a->scale;
            if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
            if (sc > m[j]) {
                if (l[j] > 0.0f) {
                    float corr = expf(m[j] - sc);
                    k->scal(o[j], corr, d);
                    l[j] *= corr;
                }
                m[j] = sc;
            }
            float p = expf(sc - m[j]);
            l[j] += p;
            k->axpy(o[j], p, vv, d);
        }
    }
    for (int j = 0; j < nq; j++)
        if (l[j] > 0.0f) k->scal(o[j], 1.0f / l[j], d);
}

/* items (row, query head) */
static void attn_task(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    const int nh = a->nh, group = nh / a->kv->n_head_kv;
    int64_t lo_i, hi_i;
    tern__cpu_split((int64_t)a->rows->n * nh, 1, ith, nth, &lo_i, &hi_i);
    for (int64_t it = lo_i; it < hi_i; it++) {
        const int r = (int)(it / nh), h = (int)(it % nh);
        walk_keys(a, r, h / group, h, 1);
    }
}

/* items (row, KV head): the group's query heads together */
static void attn_task_grouped(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    const int nkv = a->kv->n_head_kv, G = a->nh / nkv;
    int64_t lo_i, hi_i;
    tern__cpu_split((int64_t)a->rows->n * nkv, 1, ith, nth, &lo_i, &hi_i);
    for (int64_t it = lo_i; it < hi_i; it++) {
        const int r = (int)(it / nkv), kvh = (int)(it % nkv);
        walk_keys(a, r, kvh, kvh * G, G);
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
    /* one decode row of a tiny model: not worth waking the pool (same per-(row, head) results) */
    if (rows->pos_host && rows->n * nh <= 4 && (int64_t)rows->pos_host[0] * kv->head_dim < 16384) attn_task(&a, 0, 1);
    else if (nh / kv->n_head_kv > 1 && nh / kv->n_head_kv <= ATTN_GMAX && rows->n * kv->n_head_kv >= tern_pool_size(c->pool))
        tern_pool_run(c->pool, attn_task_grouped, &a); /* GQA with enough (row, KV head) items for the pool */
    else tern_pool_run(c->pool, attn_task, &a);
}
