/*
 * cpu_kvq.c — kv_write and paged attention of the fast CPU backend for compressed KV pages
 * (F16, BF16, affine 8/4-bit, TurboQuant; byte layout and reference codec in ops/kvq.h).
 *
 * kv_write: (row, kv head) pairs split over the pool, each encoded by tern_kvq_encode — the
 * reference encoder itself, so both CPU backends write identical bytes.
 *
 * attention: by default cpu_attn.c's tiles run on these pages too (a tile's records decoded once
 * for every query of its row block, through tern__cpu_kvq_decode here). The per-key walk below
 * remains for keys or values wider than the tiles take (> 512) and TERN_CPU_ATTN=keys: a work item
 * is (row, kv head, a chunk of that head's query heads). Each key and
 * value record is decoded once per item into a small f32 buffer and used by every query head
 * of the chunk (GQA reuse), with the same online softmax as cpu_attn.c. TurboQuant keys are
 * never un-rotated: each query is rotated once (q·k̂ = Rq·ŷ), and for TurboQuant values the
 * output is accumulated in the rotated space and un-rotated once per head at the end
 * (attention is linear in V). Results per head do not depend on how heads are chunked or
 * on the thread count. Differences from the reference (which decodes to the original space)
 * are f32 summation order and the rotation's rounding: ~1e-6 relative.
 */
#include "backend/cpu/cpu_impl.h"
#include "ops/kvq.h"

#include <math.h>
#include <string.h>

#define HC_MAX 8   /* query heads per work item (stack buffers: HC_MAX * TERN_KVQ_MAX_ROT floats) */

/* ---- kv_write ---- */

typedef struct kvw_ctx {
    const tern_kv_layer *kv;
    const tern_rows *rows;
    const float *k, *v;
    size_t kb, vb;
} kvw_ctx;

static void kvw_task(void *arg, int ith, int nth) {
    kvw_ctx *a = arg;
    const tern_kv_layer *kv = a->kv;
    float scratch[TERN_KVQ_MAX_ROT];
    int64_t lo, hi;
    tern__cpu_split((int64_t)a->rows->n * kv->n_head_kv, 1, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        int r = (int)(it / kv->n_head_kv), h = (int)(it % kv->n_head_kv);
        int s = a->rows->slot[r], p = a->rows->pos[r];
        uint8_t *kd = tern__cpu_kv_rec(kv, kv->k, a->kb, s, p, h), *vd = tern__cpu_kv_rec(kv, kv->v, a->vb, s, p, h);
        if (!kd || !vd) continue;
        tern_kvq_encode(&kv->kf, kv->head_dim, kv->rot, a->k + (size_t)it * kv->head_dim, kd, scratch);
        tern_kvq_encode(&kv->vf, kv->head_dim, kv->rot, a->v + (size_t)it * kv->head_dim, vd, scratch);
    }
}

void tern__cpu_kv_write_q(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v) {
    cpu_impl *c = be->impl;
    kvw_ctx a = {kv, rows, k, v, tern_kvq_vec_bytes(&kv->kf, kv->head_dim), tern_kvq_vec_bytes(&kv->vf, kv->head_dim)};
    if ((int64_t)rows->n * kv->n_head_kv < 4) kvw_task(&a, 0, 1);
    else tern_pool_run(c->pool, kvw_task, &a);
}

/* ---- record decoders (same values as tern_kvq_decode / tern_kvq_decode_rotated) ---- */

static void dec_affine(const tern_kv_fmt *f, int d, const uint8_t *rec, float *x) {
    int g = f->group, ng = d / g;
    const uint8_t *codes = rec + (size_t)ng * 4;
    for (int gi = 0; gi < ng; gi++) {
        uint16_t hs, hm;
        memcpy(&hs, rec + (size_t)gi * 2, 2);
        memcpy(&hm, rec + (size_t)ng * 2 + (size_t)gi * 2, 2);
        float sc = tern_f16_to_f32(hs), mn = tern_f16_to_f32(hm);
        float *xg = x + (size_t)gi * g;
        if (f->bits == 8) {
            const uint8_t *c = codes + (size_t)gi * g;
            for (int i = 0; i < g; i++) xg[i] = sc * (float)c[i] + mn;
        } else {
            const uint8_t *c = codes + (size_t)gi * g / 2;
            for (int i = 0; i < g / 2; i++) {
                xg[2 * i] = sc * (float)(c[i] & 15) + mn;
                xg[2 * i + 1] = sc * (float)(c[i] >> 4) + mn;
            }
        }
    }
}

static void dec_turbo(const tern_kv_fmt *f, int P, const uint8_t *rec, float *y) {
    const float *cb = tern_kvq_codebook(f->bits);
    float scale, t[16];
    memcpy(&scale, rec, 4);
    for (int i = 0; i < (1 << f->bits); i++) t[i] = scale * cb[i];
    const uint8_t *c = rec + 4;
    if (f->bits == 4) {
        for (int i = 0; i < P / 2; i++) { y[2 * i] = t[c[i] & 15]; y[2 * i + 1] = t[c[i] >> 4]; }
    } else if (f->bits == 2) {
        for (int i = 0; i < P / 4; i++)
            for (int j = 0; j < 4; j++) y[4 * i + j] = t[(c[i] >> (2 * j)) & 3];
    } else { /* 3 bits: 8 codes in 3 bytes */
        for (int i = 0; i < P / 8; i++) {
            uint32_t w = (uint32_t)c[3 * i] | (uint32_t)c[3 * i + 1] << 8 | (uint32_t)c[3 * i + 2] << 16;
            for (int j = 0; j < 8; j++) y[8 * i + j] = t[(w >> (3 * j)) & 7];
        }
    }
}

/* Decode a record into x: d values (P rotated-space values for TURBO). F16/BF16 use the ISA
 * table's weight-row decoder (F16C / shifts; the conversions are exact either way). */
void tern__cpu_kvq_decode(const tern_cpu_kern *k, const tern_kv_fmt *f, int d, int P, const uint8_t *rec, float *x) {
    switch (f->kind) {
    case TERN_KV_F16: case TERN_KV_BF16: {
        cpu_wrow w = {.data = rec, .dtype = f->kind == TERN_KV_F16 ? TERN_DT_F16 : TERN_DT_BF16};
        k->decode(&w, 0, d, x);
        break;
    }
    case TERN_KV_AFFINE: dec_affine(f, d, rec, x); break;
    case TERN_KV_TURBO: dec_turbo(f, P, rec, x); break;
    default: memcpy(x, rec, (size_t)d * 4); break;
    }
}

/* ---- attention ---- */

typedef struct attq_ctx {
    const tern_cpu_kern *k;
    float *out;
    const float *q;
    const tern_rows *rows;
    int nh, hc, nchunk;       /* heads per item, chunks per kv head */
    const tern_kv_layer *kv;
    float scale, softcap;
    size_t kb, vb;
} attq_ctx;

static void attq_task(void *arg, int ith, int nth) {
    attq_ctx *a = arg;
    const tern_kv_layer *kv = a->kv;
    const tern_cpu_kern *k = a->k;
    int d = kv->head_dim, nkv = kv->n_head_kv, group = a->nh / nkv;
    int kt = kv->kf.kind == TERN_KV_TURBO, vt = kv->vf.kind == TERN_KV_TURBO;
    int P = kt || vt ? kv->rot_dim : d, dk = kt ? P : d, dv = vt ? P : d;
    float qb[HC_MAX][TERN_KVQ_MAX_ROT], ob[HC_MAX][TERN_KVQ_MAX_ROT];
    float kx[TERN_KVQ_MAX_ROT], vx[TERN_KVQ_MAX_ROT], m[HC_MAX], l[HC_MAX], p[HC_MAX];
    int64_t lo_i, hi_i;
    tern__cpu_split((int64_t)a->rows->n * nkv * a->nchunk, 1, ith, nth, &lo_i, &hi_i);
    for (int64_t it = lo_i; it < hi_i; it++) {
        int r = (int)(it / ((int64_t)nkv * a->nchunk)), rem = (int)(it % ((int64_t)nkv * a->nchunk));
        int kvh = rem / a->nchunk, h0 = kvh * group + (rem % a->nchunk) * a->hc;
        int h1 = TERN_MIN(h0 + a->hc, (kvh + 1) * group), nhc = h1 - h0;
        if (nhc <= 0) continue;
        int s = a->rows->slot[r];
        tern_key_range kr = tern_key_range_of(kv, a->rows, r); /* causal/window ∪ span (ops.h) */
        const float *qh[HC_MAX];
        float *oh[HC_MAX];
        for (int j = 0; j < nhc; j++) {
            const float *qv = a->q + ((size_t)r * a->nh + h0 + j) * d;
            if (kt) { tern_kvq_rotate(kv->rot, P, qv, d, qb[j]); qh[j] = qb[j]; }
            else qh[j] = qv;
            oh[j] = vt ? ob[j] : a->out + ((size_t)r * a->nh + h0 + j) * d;
            memset(oh[j], 0, (size_t)dv * sizeof(float));
            m[j] = -INFINITY;
            l[j] = 0.0f;
        }
        for (int b = kr.first; b <= kr.last; b++) {
            const uint8_t *krec = tern_key_visible(&kr, b) ? tern__cpu_kv_rec(kv, kv->k, a->kb, s, b, kvh) : NULL;
            if (!krec) continue;
            tern__cpu_kvq_decode(k, &kv->kf, d, P, krec, kx);
            for (int j = 0; j < nhc; j++) {
                float sc = k->dot(qh[j], kx, dk) * a->scale;
                if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
                if (sc > m[j]) {
                    if (l[j] > 0.0f) {
                        float corr = expf(m[j] - sc);
                        k->scal(oh[j], corr, dv);
                        l[j] *= corr;
                    }
                    m[j] = sc;
                }
                p[j] = expf(sc - m[j]);
                l[j] += p[j];
            }
            tern__cpu_kvq_decode(k, &kv->vf, d, P, tern__cpu_kv_rec(kv, kv->v, a->vb, s, b, kvh), vx);
            for (int j = 0; j < nhc; j++) k->axpy(oh[j], p[j], vx, dv);
        }
        for (int j = 0; j < nhc; j++) {
            if (l[j] > 0.0f) k->scal(oh[j], 1.0f / l[j], dv);
            if (vt) tern_kvq_unrotate(kv->rot, P, oh[j], a->out + ((size_t)r * a->nh + h0 + j) * d, d);
        }
    }
}

void tern__cpu_attention_q(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                           const tern_kv_layer *kv, float scale, float softcap) {
    cpu_impl *c = be->impl;
    int group = nh / kv->n_head_kv;
    int64_t items = (int64_t)rows->n * kv->n_head_kv;
    /* split a kv head's query heads over threads only when there are too few items */
    int nchunk = items >= c->nth ? 1 : (int)TERN_MIN((int64_t)group, (c->nth + items - 1) / items);
    nchunk = TERN_MAX(nchunk, (group + HC_MAX - 1) / HC_MAX);
    int hc = (group + nchunk - 1) / nchunk;
    nchunk = (group + hc - 1) / hc;
    attq_ctx a = {c->k, out, q, rows, nh, hc, nchunk, kv, scale, softcap,
                  tern_kvq_vec_bytes(&kv->kf, kv->head_dim), tern_kvq_vec_bytes(&kv->vf, kv->head_dim)};
    tern_pool_run(c->pool, attq_task, &a);
}
