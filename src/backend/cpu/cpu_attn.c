/*
 * cpu_attn.c — paged attention for the fast CPU backend.
 *
 * Default (tiles): an item is (block of rows, block of query heads of one KV head), taken from an
 * atomic counter (KV head major, the rows with most keys first). A block is up to R consecutive rows
 * of one sequence at consecutive positions (a prefill chunk), so each key and value read from the
 * cache serves every query of the block (up to TERN_TILE_HB). Keys go in tiles of 32 aligned to
 * key positions (slot = key mod 32); per tile the ISA's 4x4 `dots` of cpu_glm.h give every
 * (query, key) score, each query's mask keeps out what it does not see (row r: its causal window
 * and span, tern_key_range_of), then a tile-wise online softmax (running max m, sum l, the output
 * rescaled by exp(m_old - m_new) when the max grows; e^x through the ISA's tile_exp), then
 * out += p·V through `pv`. A masked key weighs exactly 0 and the slots fix every sum's order, so a
 * row's result does not depend on the thread count, the head or row blocking or the other rows of
 * the batch (test_kern_ops attention_rows_bitwise_any_batch). llama3-1b shapes (32 / 8 heads, d 64)
 * 512 rows at 2048 keys: ~175 -> ~55 ms on 2 threads (bench/NOTES.md (bh)); the per-row tiles before
 * that took decode at 2048 context 7.5-7.7 -> 8.6-8.8 tok/s against the per-key walk (NOTES (m)).
 * Compressed pages (F16 / BF16 / affine / TurboQuant) go through the same tiles, each record decoded once per tile
 * for the whole block (llama3-1b q4 int8 pp1024 with 8-bit pages 124 -> 231 tok/s); F16 / BF16 records are read in
 * place (the ISA's dots_h / pv_h widen them as they load: bitwise the decoded path; decode at 4096 keys 23.5 -> 28-32
 * tok/s, level with f32 pages).
 * TERN_CPU_ATTN=keys: the per-key walk (attn_task: items (row, head), one key at a time through the
 * kernel table's dot/axpy; also the fallback). Table entries < 0 are skipped, never read; keys
 * from the same step were written by kv_write before this runs, so every row of a prefill chunk
 * sees exactly the keys up to its own position.
 */
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/glm_state.h"
#include "ops/kvq.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
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
    return (const float *)tern__cpu_kv_rec(kv, pool, (size_t)kv->head_dim * sizeof(float), s, p, kvh);
}

/* TERN_CPU_ATTN=keys: the per-key walk instead of the tiles (comparisons) */
static int tern_attn_tiled = -1;

/* ---- tiled: an item is (block of rows, block of query heads of one KV head); its keys go in tiles of TERN_TILE_K
 * through tern__tile_attend (glm_state.h: the GLM latent attention's tile step, with V apart from K here and the
 * softcap). Tiles are aligned to key positions (tile j = keys [32j, 32j + 32), slot c = key mod 32), whatever the
 * row sees: a key's slot, and so the order of every sum, is the same alone or shared. A block is up to R
 * consecutive rows of one sequence at consecutive positions (no spans), so each key and value row read serves
 * R x heads queries; each query's own mask (vis) keeps out the keys it does not see, which then change nothing —
 * a row's result is bitwise the same in any block, batch or thread count. */
/* Compressed pages (kv->kf / kv->vf not F32, cpu_kvq.c's codecs): a tile's records are decoded once into f32 rows for
 * every query of the item; TurboQuant keys are compared in the rotated space (queries rotated once: q·k̂ = Rq·ŷ) and
 * TurboQuant values accumulated there and un-rotated once per query at the end (attention is linear in V). */
#define TILE_QMAX_D 512 /* compressed pages: largest key / value width in the tiles (stack rows); wider: the per-key walk */
typedef struct tile_fmt {
    int q;             /* compressed pages */
    int kh, vh;        /* F16 / BF16 keys / values: read in place (TERN_TILE_F16 / BF16), not decoded */
    int kt, vt;        /* TurboQuant keys / values */
    int P, dk, dv;     /* rotated width; key and value widths in the tiles */
    size_t kb, vb;     /* record bytes */
} tile_fmt;

typedef struct tile_ctx {
    attn_ctx a;
    const tern_glm_kern *gk;
    int hb, nhb;      /* heads per item, head blocks per KV head */
    int nblk;         /* row blocks: rows [blk[i], blk[i + 1]) */
    const int *blk;
    int64_t items;
    atomic_llong next;
    tile_fmt f;
} tile_ctx;

#define TK TERN_TILE_K
static const float zero_row[512]; /* the keys and values of absent slots (weight 0; head_dim <= 512) */
static const uint16_t zero_h[512]; /* the same for 16-bit pages read in place */

/* Bits of slots [lo, hi] ∩ [B, B + TK) of the tile at B. */
static inline uint32_t range_bits(int B, int lo, int hi) {
    if (lo < B) lo = B;
    if (hi > B + TK - 1) hi = B + TK - 1;
    if (lo > hi) return 0;
    const int n = hi - lo + 1;
    return (n == 32 ? ~(uint32_t)0 : ((uint32_t)1 << n) - 1) << (lo - B);
}

/* TERN_TILE_BF16 / F16 for 16-bit pages (read in place), else TERN_TILE_F32 (f32 rows or decoded ones) */
static int tile_rows_fmt(int kind) {
    return kind == TERN_KV_BF16 ? TERN_TILE_BF16 : kind == TERN_KV_F16 ? TERN_TILE_F16 : TERN_TILE_F32;
}

static tile_fmt tile_fmt_of(const tern_kv_layer *kv) {
    tile_fmt f = {0};
    f.q = kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32;
    f.kt = kv->kf.kind == TERN_KV_TURBO;
    f.kh = tile_rows_fmt(kv->kf.kind);
    f.vh = tile_rows_fmt(kv->vf.kind);
    f.vt = kv->vf.kind == TERN_KV_TURBO;
    f.P = f.kt || f.vt ? kv->rot_dim : kv->head_dim;
    f.dk = f.kt ? f.P : kv->head_dim;
    f.dv = f.vt ? f.P : kv->head_dim;
    f.kb = f.q ? tern_kvq_vec_bytes(&kv->kf, kv->head_dim) : (size_t)kv->head_dim * sizeof(float);
    f.vb = f.q ? tern_kvq_vec_bytes(&kv->vf, kv->head_dim) : (size_t)kv->head_dim * sizeof(float);
    return f;
}

static void tile_item(const tile_ctx *c, int blk, int kvh, int h0, int nq) {
    const attn_ctx *a = &c->a;
    const tern_kv_layer *kv = a->kv;
    const tile_fmt *f = &c->f;
    const int d = kv->head_dim, r0 = c->blk[blk], nr = c->blk[blk + 1] - r0, s = a->rows->slot[r0], nqt = nr * nq;
    const int dk = f->dk, dv = f->dv;
    float qrot[f->kt ? nqt * f->P : 1] __attribute__((aligned(64))), orot[f->vt ? nqt * f->P : 1] __attribute__((aligned(64)));
    float kdec[f->q && !f->kh ? TK * dk : 1] __attribute__((aligned(64))), vdec[f->q && !f->vh ? TK * dv : 1] __attribute__((aligned(64)));
    tern_tile_acc t;
    tern_key_range kr[TERN_TILE_HB];
    int first = INT32_MAX, last = -1;
    for (int rr = 0; rr < nr; rr++) {
        kr[rr] = tern_key_range_of(kv, a->rows, r0 + rr);
        first = TERN_MIN(first, kr[rr].first);
        last = TERN_MAX(last, kr[rr].last);
        for (int i = 0; i < nq; i++) {
            const int qi = rr * nq + i;
            const size_t row = (size_t)(r0 + rr) * a->nh + (size_t)h0 + i;
            t.qp[qi] = a->q + row * d;
            if (f->kt) {
                tern_kvq_rotate(kv->rot, f->P, t.qp[qi], d, qrot + (size_t)qi * f->P);
                t.qp[qi] = qrot + (size_t)qi * f->P;
            }
            t.op[qi] = f->vt ? orot + (size_t)qi * f->P : a->out + row * d;
            memset(t.op[qi], 0, (size_t)dv * sizeof(float));
            t.m[qi] = -INFINITY;
            t.l[qi] = 0.0f;
        }
    }
    const float *kp[TK], *vp[TK];
    const uint16_t *kh[TK], *vh[TK];
    const tern_tile_rows ktr = {kp, kh, f->kh}, vtr = {vp, vh, f->vh};
    const uint8_t *kr8[TK], *vr8[TK];
    uint32_t vis[TERN_TILE_HB], rvis[TERN_TILE_HB];
    const int bs = kv->block_size;
    const size_t kst = (size_t)kv->n_head_kv * f->kb, vst = (size_t)kv->n_head_kv * f->vb; /* bytes from one position of a page to the next */
    for (int B = first >= 0 ? first - first % TK : 0; B <= last; B += TK) {
        uint32_t any = 0;
        for (int rr = 0; rr < nr; rr++) {
            rvis[rr] = range_bits(B, kr[rr].lo, kr[rr].hi) | range_bits(B, kr[rr].vlo, kr[rr].vhi);
            any |= rvis[rr];
        }
        uint32_t res = 0; /* resident slots among those */
        for (int b = B + (any ? __builtin_ctz(any) : TK); b < B + TK && (any >> (b - B));) { /* a page at a time */
            const int end = TERN_MIN(B + TK - 1, (b / bs + 1) * bs - 1);
            const uint8_t *k0 = tern__cpu_kv_rec(kv, kv->k, f->kb, s, b, kvh), *v0 = k0 ? tern__cpu_kv_rec(kv, kv->v, f->vb, s, b, kvh) : NULL;
            if (k0) res |= range_bits(B, b, end);
            for (size_t ko = 0, vo = 0; b <= end; b++, ko += kst, vo += vst) {
                kr8[b - B] = k0 ? k0 + ko : NULL;
                vr8[b - B] = k0 ? v0 + vo : NULL;
            }
        }
        any &= res;
        if (!any) continue;
        const int nk = 32 - __builtin_clz(any); /* slots [0, nk): absent ones below the last read zeros */
        if (f->q || nr == 1) /* the tile's records requested together before any is read: a decode row's tile serves a
                              * few queries and a compressed one is decoded record by record, so their misses otherwise
                              * come one after another (llama3-1b q4 int8 at 4096 keys: bf16 pages 15-18 -> 27-28 tok/s,
                              * f32 27 -> 30-34; a prefill block's f32 tile: 3-5 % slower with 16-query tiles, +1.5 %
                              * with 32, so not there; NOTES (bh), (bi)) */
            for (int c0 = 0; c0 < nk; c0++)
                if (any >> c0 & 1) {
                    for (size_t o = 0; o < f->kb; o += 64) __builtin_prefetch(kr8[c0] + o, 0, 3);
                    for (size_t o = 0; o < f->vb; o += 64) __builtin_prefetch(vr8[c0] + o, 0, 3);
                }
        for (int c0 = 0; c0 < nk; c0++) {
            if (!(any >> c0 & 1)) { kp[c0] = vp[c0] = zero_row; kh[c0] = vh[c0] = zero_h; continue; }
            if (!f->q) { kp[c0] = (const float *)kr8[c0]; vp[c0] = (const float *)vr8[c0]; continue; }
            if (f->kh) kh[c0] = (const uint16_t *)kr8[c0];
            else { /* decoded once for every query */
                float *kx = kdec + (size_t)c0 * dk;
                tern__cpu_kvq_decode(a->k, &kv->kf, d, f->P, kr8[c0], kx);
                kp[c0] = kx;
            }
            if (f->vh) vh[c0] = (const uint16_t *)vr8[c0];
            else {
                float *vx = vdec + (size_t)c0 * dv;
                tern__cpu_kvq_decode(a->k, &kv->vf, d, f->P, vr8[c0], vx);
                vp[c0] = vx;
            }
        }
        for (int rr = 0; rr < nr; rr++)
            for (int i = 0; i < nq; i++) vis[rr * nq + i] = rvis[rr] & res;
        tern__tile_attend(c->gk, &t, nqt, &ktr, &vtr, nk, dk, dv, a->scale, a->softcap, vis);
    }
    for (int i = 0; i < nqt; i++) {
        if (t.l[i] > 0.0f) a->k->scal(t.op[i], 1.0f / t.l[i], dv);
        if (f->vt) {
            const int rr = i / nq;
            tern_kvq_unrotate(kv->rot, f->P, t.op[i], a->out + ((size_t)(r0 + rr) * a->nh + (size_t)h0 + i % nq) * d, d);
        }
    }
}

static void tile_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    tile_ctx *c = arg;
    const attn_ctx *a = &c->a;
    const int G = a->nh / a->kv->n_head_kv;
    const int64_t per_kvh = (int64_t)c->nblk * c->nhb;
    for (;;) { /* KV head major (a thread's next item reads the same head's keys), last blocks (most keys) first */
        const int64_t it = atomic_fetch_add(&c->next, 1);
        if (it >= c->items) return;
        const int kvh = (int)(it / per_kvh);
        const int64_t rem = it % per_kvh;
        const int blk = c->nblk - 1 - (int)(rem / c->nhb), h0 = kvh * G + (int)(rem % c->nhb) * c->hb;
        tile_item(c, blk, kvh, h0, TERN_MIN(c->hb, kvh * G + G - h0));
    }
}

/* Row blocks of up to R rows (one slot, consecutive positions, no span) into blk; returns their count. */
static int row_blocks(const tern_rows *rows, int R, int *blk) {
    int nb = 0;
    for (int r = 0; r < rows->n;) {
        int e = r + 1;
        const int span = rows->vis_lo && rows->vis_lo[r] <= rows->vis_hi[r];
        while (!span && e < rows->n && e - r < R && rows->slot[e] == rows->slot[r] && rows->pos[e] == rows->pos[r] + (e - r) &&
               !(rows->vis_lo && rows->vis_lo[e] <= rows->vis_hi[e]))
            e++;
        blk[nb++] = r;
        r = e;
    }
    blk[nb] = rows->n;
    return nb;
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
    cpu_impl *c = be->impl;
    attn_ctx a = {c->k, out, q, rows, nh, kv, scale, softcap};
    if (tern_attn_tiled < 0) {
        const char *e = getenv("TERN_CPU_ATTN");
        tern_attn_tiled = !(e && !strcmp(e, "keys"));
    }
    /* one decode row of a tiny model: not worth waking the pool (same per-(row, head) results) */
    const int tiny = rows->pos_host && rows->n * nh <= 4 && (int64_t)rows->pos_host[0] * kv->head_dim < 16384;
    const tile_fmt f = tile_fmt_of(kv);
    tern_glm_state *g = tern_attn_tiled ? tern__glm_state(be) : NULL;
    if (g && nh % kv->n_head_kv == 0 && f.dk <= TILE_QMAX_D && f.dv <= TILE_QMAX_D && tern__glm_reserve_blocks(g, rows->n)) {
        /* tiled; heads of a KV group in blocks that still give every thread work, rows in blocks that fill a tile's
         * TERN_TILE_HB queries (neither blocking changes a row's bits: batch == alone) */
        const int G = nh / kv->n_head_kv;
        int hb = TERN_MIN(G, TERN_TILE_HB);
        while (hb > 1 && (int64_t)rows->n * kv->n_head_kv * ((G + hb - 1) / hb) < c->nth) hb = (hb + 1) / 2;
        int R = TERN_MIN(TERN_TILE_HB / hb, 8);
        while (R > 1 && (int64_t)(rows->n + R - 1) / R * kv->n_head_kv * ((G + hb - 1) / hb) < 2 * c->nth) R /= 2;
        tile_ctx tc = {a, g->gk, hb, (G + hb - 1) / hb, 0, g->rblk, 0, 0, f};
        tc.nblk = row_blocks(rows, R, g->rblk);
        tc.items = (int64_t)kv->n_head_kv * tc.nhb * tc.nblk;
        atomic_init(&tc.next, 0);
        if (tiny) tile_task(&tc, 0, 1);
        else tern_pool_run(c->pool, tile_task, &tc);
        return;
    }
    if (f.q) { /* compressed pages: cpu_kvq.c's per-key walk */
        tern__cpu_attention_q(be, out, q, rows, nh, kv, scale, softcap);
        return;
    }
    if (tiny) attn_task(&a, 0, 1);
    else tern_pool_run(c->pool, attn_task, &a);
}
