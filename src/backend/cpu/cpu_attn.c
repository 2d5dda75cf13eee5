/*
 * cpu_attn.c — paged attention for the fast CPU backend.
 *
 * Work items are (row, query head) pairs split evenly over the pool. Each item walks the
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
    /* one decode row of a tiny model: not worth waking the pool (same per-(row, head) results) */
    if (rows->pos_host && rows->n * nh <= 4 && (int64_t)rows->pos_host[0] * kv->head_dim < 16384) attn_task(&a, 0, 1);
    else tern_pool_run(c->pool, attn_task, &a);
}
