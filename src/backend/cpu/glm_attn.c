/*
 * glm_attn.c — the fast CPU backend's absorbed MLA attention and DSA indexer (ops.h
 * attention_latent, dsa_topk; the scalar spec is cpu_glm.c).
 *
 * attention_latent: work items are (row, block of heads), taken from an atomic counter,
 * most expensive rows first. An item streams its row's visible keys (dense 0..pos, or the
 * selection; non-resident and out-of-range entries skipped) in tiles of TK records: scores
 * for all its heads against the tile (4×4 register blocks of the ISA's `dots`, so one key load
 * serves several heads), then a tile-wise online softmax (running max m, sum l, the output
 * rescaled when m grows) and out += p·K[0:dv] through `pv`. Tiles are cut from the row's own
 * key stream and every pair/element sums in an order fixed by the ISA, so a row's result does
 * not depend on the thread count, the head blocking, or the other rows of the batch.
 *
 * dsa_topk: I[b] = Σ_j w_j·relu(scale·q_j·kI_b), j ascending, for the resident keys of the
 * row. Each (score, position) becomes one 64-bit rank key (order-preserving float bits, -0
 * folded onto +0, NaN lowest; then the complement of the position, so lower positions win
 * ties) — unique keys, so a quickselect picks exactly the spec's set in O(T); a scan in
 * position order writes it ascending. Rows go over the pool; a lone row (decode) splits its
 * keys over the pool for the scores instead (per-key arithmetic is the same either way).
 * Candidate buffers come from tern_glm_state (sized for a whole slot once).
 *
 * bf16 latent pages: a tile's records are decoded into f32 on the item's stack first (exact), then
 * the same kernels run on them — the f32 pages' arithmetic on the stored values.
 */
#include "backend/cpu/glm_state.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define TK TERN_TILE_K     /* keys per tile */
#define HB_MAX TERN_TILE_HB /* heads per attention work item */

/* ---- attention ------------------------------------------------------------------------- */

typedef struct att_ctx {
    const tern_glm_kern *gk;
    float *out;
    const float *q;
    const tern_rows *rows;
    int nh, hb, nhb;
    const tern_kv_layer *kv;
    int dv;
    float scale;
    const int32_t *sel;
    int k_sel;
    int64_t items;
    atomic_llong next;
} att_ctx;

void tern__tile_attend(const tern_glm_kern *gk, tern_tile_acc *t, int nq, const tern_tile_rows *k, const tern_tile_rows *v,
                       int nk, int d, int dv, float scale, float softcap, const uint32_t *vis) {
    for (int c = 0; c < nk; c += 4) /* 4 keys stay in L1 while every query passes them (d 256: a tile's K is 32 KB) */
        for (int i = 0; i < nq; i += 4) {
            const int na = TERN_MIN(4, nq - i), nb = TERN_MIN(4, nk - c);
            if (k->fmt == TERN_TILE_F32) gk->dots(t->qp + i, na, k->f + c, nb, d, t->sc + i * TK + c, TK);
            else gk->dots_h(t->qp + i, na, k->h + c, nb, d, t->sc + i * TK + c, TK, k->fmt == TERN_TILE_BF16);
        }
    uint32_t all[TERN_TILE_HB];
    if (!vis) {
        for (int i = 0; i < TERN_TILE_HB; i++) all[i] = ~(uint32_t)0;
        vis = all;
    }
    float mx[TERN_TILE_HB], corr[TERN_TILE_HB];
    gk->tile_max(t->sc, TK, nq, nk, scale, softcap, vis, mx);
    int any = 0;
    for (int i = 0; i < nq; i++) {
        corr[i] = 1.0f; /* the output's rescale, applied by pv as it loads o (x 1: the same bits) */
        if (mx[i] > t->m[i]) {
            if (t->l[i] > 0.0f) {
                corr[i] = expf(t->m[i] - mx[i]);
                t->l[i] *= corr[i];
                any = 1;
            }
            t->m[i] = mx[i];
        }
    }
    gk->tile_exp(t->sc, TK, nq, nk, t->m, t->l);
    for (int i = 0; i < nq; i += 4) {
        const int no = TERN_MIN(4, nq - i);
        if (v->fmt == TERN_TILE_F32) gk->pv(t->op + i, no, t->sc + i * TK, TK, v->f, nk, dv, any ? corr + i : NULL);
        else gk->pv_h(t->op + i, no, t->sc + i * TK, TK, v->h, nk, dv, any ? corr + i : NULL, v->fmt == TERN_TILE_BF16);
    }
}

static void att_item(const att_ctx *a, int r, int h0, int h1) {
    const tern_kv_layer *kv = a->kv;
    int D = kv->head_dim, nq = h1 - h0, pos = a->rows->pos[r], s = a->rows->slot[r];
    tern_tile_acc t;
    for (int i = 0; i < nq; i++) {
        t.qp[i] = a->q + ((size_t)r * a->nh + h0 + i) * D;
        t.op[i] = a->out + ((size_t)r * a->nh + h0 + i) * a->dv;
        memset(t.op[i], 0, sizeof(float) * (size_t)a->dv);
        t.m[i] = -INFINITY;
        t.l[i] = 0.0f;
    }
    const int32_t *sr = a->sel ? a->sel + (size_t)r * a->k_sel : NULL;
    int cnt = sr ? a->k_sel : pos + 1, nk = 0;
    const float *kp[TK];
    const uint16_t *kh[TK]; /* bf16 pages: the records read in place (dots_h / pv_h) */
    const int bf = kv->dtype == TERN_DT_BF16;
    const tern_tile_rows kr = {kp, kh, bf ? TERN_TILE_BF16 : TERN_TILE_F32}; /* V = K[0:dv] */
    for (int c = 0; c < cnt; c++) {
        int b = sr ? sr[c] : c;
        if (b < 0 || b > pos) continue;
        long i = tern__glm_rec(kv, s, b);
        if (i < 0) continue;
        if (bf) kh[nk] = (const uint16_t *)kv->k + (size_t)i * (size_t)D;
        else kp[nk] = (const float *)kv->k + (size_t)i * (size_t)D;
        nk++;
        if (nk == TK) { tern__tile_attend(a->gk, &t, nq, &kr, &kr, nk, D, a->dv, a->scale, 0.0f, NULL); nk = 0; }
    }
    if (nk) tern__tile_attend(a->gk, &t, nq, &kr, &kr, nk, D, a->dv, a->scale, 0.0f, NULL);
    for (int i = 0; i < nq; i++)
        if (t.l[i] > 0.0f)
            for (int j = 0; j < a->dv; j++) t.op[i][j] /= t.l[i];
}

static void att_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    att_ctx *a = arg;
    for (;;) {
        int64_t it = atomic_fetch_add(&a->next, 1);
        if (it >= a->items) return;
        it = a->items - 1 - it; /* last rows (most keys) first */
        int r = (int)(it / a->nhb), h0 = (int)(it % a->nhb) * a->hb;
        att_item(a, r, h0, TERN_MIN(h0 + a->hb, a->nh));
    }
}

void tern__glm_attention_latent(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                                const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel) {
    tern_glm_state *g = tern__glm_state(be);
    if (g && g->spec) { tern__cpu_glm_ops.attention_latent(be, out, q, rows, nh, kv, dv, scale, sel, k_sel); return; }
    if (!g) {
        for (size_t j = 0; j < (size_t)rows->n * nh * dv; j++) out[j] = NAN;
        return;
    }
    /* head blocks: large enough to share key loads, small enough to give every thread work */
    int hb = HB_MAX;
    while (hb > 4 && (int64_t)rows->n * ((nh + hb - 1) / hb) < 2 * g->nth) hb /= 2;
    att_ctx a = {.gk = g->gk, .out = out, .q = q, .rows = rows, .nh = nh, .hb = hb, .nhb = (nh + hb - 1) / hb,
                 .kv = kv, .dv = dv, .scale = scale, .sel = sel, .k_sel = k_sel};
    a.items = (int64_t)rows->n * a.nhb;
    atomic_init(&a.next, 0);
    int64_t keys = 0;
    for (int r = 0; r < rows->n; r++) keys += sel ? k_sel : rows->pos[r] + 1;
    if (g->nth > 1 && a.items > 1 && keys * nh * kv->head_dim >= (int64_t)1 << 16) tern_pool_run(g->pool, att_task, &a);
    else att_task(&a, 0, 1);
}

/* ---- DSA indexer ------------------------------------------------------------------------ */

/* Order-preserving rank of (score, position): higher key = better (score desc, position asc). */
static uint64_t rank_key(float s, int32_t b) {
    uint32_t u;
    if (isnan(s)) u = 0;
    else {
        if (s == 0.0f) s = 0.0f; /* -0 ties with +0, as == says */
        memcpy(&u, &s, 4);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((uint64_t)u << 32) | (uint32_t)(0xffffffffu - (uint32_t)b);
}

static float key_score(uint64_t key) {
    uint32_t u = (uint32_t)(key >> 32);
    if (u == 0) return NAN;
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    float s;
    memcpy(&s, &u, 4);
    return s;
}

static int cmp_desc(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a < b) - (a > b);
}

/* Reorder a[0..n) so that a[0..k) holds the k largest (unique keys), 0 < k < n. */
static void top_partition(uint64_t *a, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    for (int depth = 0; hi - lo > 16; depth++) {
        if (depth > 64) { qsort(a + lo, hi - lo, sizeof *a, cmp_desc); return; }
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        uint64_t x = a[lo], y = a[mid], z = a[last]; /* median of three as pivot, moved to the end */
        size_t pi = (x < y) ? (y < z ? mid : (x < z ? last : lo)) : (x < z ? lo : (y < z ? last : mid));
        uint64_t piv = a[pi], t;
        a[pi] = a[last]; a[last] = piv;
        size_t st = lo;
        for (size_t i = lo; i < last; i++)
            if (a[i] > piv) { t = a[i]; a[i] = a[st]; a[st] = t; st++; }
        a[last] = a[st]; a[st] = piv;
        if (st + 1 == k || st == k) return; /* a[0..k) are the k largest */
        if (st > k) hi = st;
        else lo = st + 1;
    }
    qsort(a + lo, hi - lo, sizeof *a, cmp_desc);
}

typedef struct dsa_ctx {
    const tern_glm_kern *gk;
    tern_glm_state *g;
    int32_t *sel;
    const float *q, *w;
    const tern_rows *rows;
    int nh, k;
    const tern_kv_layer *kv;
    float scale;
    int split;       /* 1: one row, candidates [0, nc) split over threads (buffers of thread 0) */
    int row, nc;
    atomic_int next;
} dsa_ctx;

/* scores of candidates [c0, c1) of row r into sc[] (positions in cp[]) */
static void dsa_scores(const dsa_ctx *a, int r, const int32_t *cp, float *sc, int c0, int c1) {
    const tern_kv_layer *kv = a->kv;
    int Dv = kv->v_dim, nh = a->nh, s = a->rows->slot[r];
    const float *qr = a->q + (size_t)r * nh * Dv, *wr = a->w + (size_t)r * nh;
    float d[4 * TK];
    float kbuf[kv->dtype == TERN_DT_BF16 ? TK * Dv : 1]; /* bf16 pages: the tile decoded */
    for (int c = c0; c < c1; c += TK) {
        int nk = TERN_MIN(TK, c1 - c);
        const float *kp[TK];
        for (int i = 0; i < nk; i++) {
            sc[c + i] = 0.0f;
            kp[i] = tern__glm_rec_f32(kv, kv->v, tern__glm_rec(kv, s, cp[c + i]), Dv,
                                      kbuf + (kv->dtype == TERN_DT_BF16 ? (size_t)i * Dv : 0));
        }
        for (int j0 = 0; j0 < nh; j0 += 4) {
            const float *qp[4];
            int nj = TERN_MIN(4, nh - j0);
            for (int j = 0; j < nj; j++) qp[j] = qr + (size_t)(j0 + j) * Dv;
            for (int i = 0; i < nk; i += 4) a->gk->dots(qp, nj, kp + i, TERN_MIN(4, nk - i), Dv, d + i, TK);
            for (int j = 0; j < nj; j++) /* heads in ascending order per key, as the spec */
                for (int i = 0; i < nk; i++) {
                    float v = d[j * TK + i] * a->scale;
                    if (v > 0.0f) sc[c + i] += wr[j0 + j] * v;
                }
        }
    }
}

/* Candidates of row r (resident positions, ascending); returns their count, or -1 when the
 * row is dense (pos+1 <= k) and already written. */
static int dsa_begin(const dsa_ctx *a, int r, int32_t *cp) {
    int pos = a->rows->pos[r], s = a->rows->slot[r], nc = 0;
    int32_t *out = a->sel + (size_t)r * a->k;
    for (int i = 0; i < a->k; i++) out[i] = -1;
    a->g->gap[r] = NAN;
    if (pos + 1 <= a->k) {
        for (int b = 0; b <= pos; b++) out[b] = b;
        return -1;
    }
    if (!a->kv->v) return -1;
    for (int b = 0; b <= pos; b++)
        if (tern__glm_rec(a->kv, s, b) >= 0) cp[nc++] = b;
    return nc;
}

static void dsa_select(const dsa_ctx *a, int r, const int32_t *cp, const float *sc, uint64_t *key, int nc) {
    int32_t *out = a->sel + (size_t)r * a->k;
    int k = a->k;
    if (nc <= k) {
        memcpy(out, cp, sizeof(int32_t) * (size_t)nc);
        return;
    }
    for (int i = 0; i < nc; i++) key[i] = rank_key(sc[i], cp[i]);
    top_partition(key, (size_t)nc, (size_t)k);
    uint64_t thr = key[0], best_out = key[k];
    for (int i = 1; i < k; i++) thr = key[i] < thr ? key[i] : thr;
    for (int i = k + 1; i < nc; i++) best_out = key[i] > best_out ? key[i] : best_out;
    int j = 0;
    for (int i = 0; i < nc && j < k; i++)
        if (rank_key(sc[i], cp[i]) >= thr) out[j++] = cp[i];
    a->g->gap[r] = key_score(thr) - key_score(best_out);
}

static void dsa_task(void *arg, int ith, int nth) {
    dsa_ctx *a = arg;
    tern_glm_state *g = a->g;
    if (a->split) { /* one row: this thread's share of the candidates */
        int64_t lo, hi;
        tern__cpu_split(a->nc, TK, ith, nth, &lo, &hi);
        if (lo < hi) dsa_scores(a, a->row, g->cpos, g->sc, (int)lo, (int)hi);
        return;
    }
    int32_t *cp = g->cpos + (size_t)ith * g->cap;
    float *sc = g->sc + (size_t)ith * g->cap;
    uint64_t *key = g->key + (size_t)ith * g->cap;
    for (;;) {
        int r = atomic_fetch_add(&a->next, 1);
        if (r >= a->rows->n) return;
        r = a->rows->n - 1 - r; /* last rows (most keys) first */
        int nc = dsa_begin(a, r, cp);
        if (nc < 0) continue;
        dsa_scores(a, r, cp, sc, 0, nc);
        dsa_select(a, r, cp, sc, key, nc);
    }
}

void tern__glm_dsa_topk(tern_backend *be, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                        const tern_kv_layer *kv, float scale, int k, float *min_gap) {
    tern_glm_state *g = tern__glm_state(be);
    if (g && g->spec) { tern__cpu_glm_ops.dsa_topk(be, sel, q, w, rows, nh, kv, scale, k, min_gap); return; }
    size_t cap = (size_t)kv->max_blocks * (size_t)kv->block_size;
    if (!g || !tern__glm_reserve_keys(g, cap) || !tern__glm_reserve_rows(g, rows->n)) {
        for (size_t i = 0; i < (size_t)rows->n * k; i++) sel[i] = -1;
        return;
    }
    dsa_ctx a = {.gk = g->gk, .g = g, .sel = sel, .q = q, .w = w, .rows = rows, .nh = nh, .k = k, .kv = kv,
                 .scale = scale};
    atomic_init(&a.next, 0);
    if (g->nth == 1) dsa_task(&a, 0, 1);
    else if (rows->n >= g->nth) tern_pool_run(g->pool, dsa_task, &a);
    else { /* few rows: split each row's keys over the pool */
        a.split = 1;
        for (int r = 0; r < rows->n; r++) {
            int nc = dsa_begin(&a, r, g->cpos);
            if (nc < 0) continue;
            a.row = r;
            a.nc = nc;
            if ((int64_t)nc * nh * kv->v_dim >= (int64_t)1 << 16) tern_pool_run(g->pool, dsa_task, &a);
            else dsa_task(&a, 0, 1);
            dsa_select(&a, r, g->cpos, g->sc, g->key, nc);
        }
    }
    for (int r = 0; min_gap && r < rows->n; r++) /* row order, the spec's rule */
        if (isnan(*min_gap) || g->gap[r] < *min_gap) *min_gap = g->gap[r];
}
