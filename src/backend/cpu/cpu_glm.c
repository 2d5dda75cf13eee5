/*
 * cpu_glm.c — scalar CPU implementation of the GLM-5 ops (ops.h tern_glm_ops): strided
 * copies, LayerNorm with bias, interleaved RoPE on a head slice, the MLA latent cache
 * (write + absorbed attention with an optional DSA selection), the DSA indexer top-k and
 * the grouped sigmoid router.
 *
 * Conventions every other backend must share (they are what the parity tests pin down):
 *   - top-k orders (indexer and router): higher score first, ties to the lower position /
 *     expert / group. The indexer's chosen positions are returned sorted ascending, so the
 *     attention sums keys in position order whether DSA selected them or not (a row with
 *     pos+1 <= k is exactly the dense row) — this keeps decode, prefill and batches equal.
 *   - a non-resident key (block-table entry < 0) is never read: it is neither scored by
 *     the indexer nor attended.
 *   - NaN index scores rank below every number.
 *   - bf16 latent pages (kv->dtype TERN_DT_BF16): records are written rounded to nearest even
 *     and every read decodes them exactly; the arithmetic is the f32 pages' on those values.
 * This table serves "cpu-ref" and is the spec; the fast backend's table (glm_fast.c) shares
 * the row helpers below (tern__glm_*_row) and re-implements attention and the indexer.
 * Scratch: the indexer heap (k entries) and the attention scores (longest row) are
 * malloc'd once per call; on allocation failure outputs are NaN / -1 so it is visible.
 */
#include "backend/cpu/cpu_glm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void copy_2d(tern_backend *be, float *dst, int ldd, const float *src, int lds, int n, int w) {
    (void)be;
    for (int r = 0; r < n; r++) memcpy(dst + (size_t)r * ldd, src + (size_t)r * lds, sizeof(float) * (size_t)w);
}

void tern__glm_layernorm_row(float *yr, const float *xr, int d, const float *w, const float *b, float eps) {
    double mu = 0, var = 0;
    for (int j = 0; j < d; j++) mu += xr[j];
    mu /= d;
    for (int j = 0; j < d; j++) var += ((double)xr[j] - mu) * ((double)xr[j] - mu);
    float inv = (float)(1.0 / sqrt(var / d + (double)eps));
    for (int j = 0; j < d; j++) yr[j] = ((float)(xr[j] - mu) * inv) * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
}

static void layernorm(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, const float *b,
                      float eps) {
    (void)be;
    for (int r = 0; r < rows; r++) tern__glm_layernorm_row(y + (size_t)r * d, x + (size_t)r * d, d, w, b, eps);
}

/* cos/sin of one row's angles are computed once and shared by its heads (same values) */
void tern__glm_rope_row(float *x, int h0, int h1, int hs, int off, int d, int32_t pos, const float *inv_freq,
                        float mscale) {
    float cs[256], sn[256];
    int half = d / 2, nt = TERN_MIN(half, 256);
    for (int i = 0; i < nt; i++) {
        float th = (float)pos * inv_freq[i]; /* f32 angle, as transformers */
        cs[i] = (float)cos((double)th);
        sn[i] = (float)sin((double)th);
    }
    for (int h = h0; h < h1; h++) {
        float *v = x + (size_t)h * hs + off;
        for (int i = 0; i < half; i++) {
            float th = (float)pos * inv_freq[i];
            float c = i < nt ? cs[i] : (float)cos((double)th), s = i < nt ? sn[i] : (float)sin((double)th);
            float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = (a * c - b * s) * mscale;
            v[2 * i + 1] = (b * c + a * s) * mscale;
        }
    }
}

static void rope_interleaved(tern_backend *be, float *x, int n, int nh, int hs, int off, int d, const int32_t *pos,
                             const float *inv_freq, float mscale) {
    (void)be;
    for (int r = 0; r < n; r++) tern__glm_rope_row(x + (size_t)r * nh * hs, 0, nh, hs, off, d, pos[r], inv_freq, mscale);
}

/* Record index (block * block_size + offset) of (slot, pos), or -1 when not resident. */
long tern__glm_rec(const tern_kv_layer *kv, int slot, int pos) {
    if (slot < 0 || pos < 0 || pos / kv->block_size >= kv->max_blocks) return -1;
    int32_t blk = kv->block_table[(size_t)slot * kv->max_blocks + pos / kv->block_size];
    return blk < 0 ? -1 : (long)blk * kv->block_size + pos % kv->block_size;
}
#define rec tern__glm_rec

static void put_rec(const tern_kv_layer *kv, void *pool, long i, const float *x, size_t n) {
    if (kv->dtype != TERN_DT_BF16) {
        memcpy((float *)pool + (size_t)i * n, x, n * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)pool + (size_t)i * n;
    for (size_t j = 0; j < n; j++) o[j] = tern_f32_to_bf16(x[j]);
}

void tern__glm_kv_write_row(const tern_kv_layer *kv, int slot, int pos, const float *k, const float *v) {
    long i = rec(kv, slot, pos);
    if (i < 0) return;
    size_t D = (size_t)kv->head_dim, Dv = (size_t)kv->v_dim;
    put_rec(kv, kv->k, i, k, D);
    if (Dv && v && kv->v) put_rec(kv, kv->v, i, v, Dv);
}

const float *tern__glm_rec_f32(const tern_kv_layer *kv, const void *pool, long i, int n, float *buf) {
    if (kv->dtype != TERN_DT_BF16) return (const float *)pool + (size_t)i * (size_t)n;
    const uint16_t *p = (const uint16_t *)pool + (size_t)i * (size_t)n;
    for (int j = 0; j < n; j++) buf[j] = tern_bf16_to_f32(p[j]);
    return buf;
}

static void kv_write_latent(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                            const float *v) {
    (void)be;
    size_t D = (size_t)kv->head_dim, Dv = (size_t)kv->v_dim;
    for (int r = 0; r < rows->n; r++)
        tern__glm_kv_write_row(kv, rows->slot[r], rows->pos[r], k + (size_t)r * D, v ? v + (size_t)r * Dv : NULL);
}

/* ---- DSA indexer ----------------------------------------------------------------------- */

/* a ranks below b: lower score, or equal score and higher position (NaN lowest) */
static int worse(float sa, int pa, float sb, int pb) {
    if (isnan(sa)) return isnan(sb) ? pa > pb : 1;
    if (isnan(sb)) return 0;
    return sa < sb || (sa == sb && pa > pb);
}

/* min-heap by rank: h[0] is the worst kept entry */
static void sift_down(float *hs, int *hp, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(hs[l], hp[l], hs[m], hp[m])) m = l;
        if (r < n && worse(hs[r], hp[r], hs[m], hp[m])) m = r;
        if (m == i) return;
        float ts = hs[i]; hs[i] = hs[m]; hs[m] = ts;
        int tp = hp[i]; hp[i] = hp[m]; hp[m] = tp;
        i = m;
    }
}

static void sift_up(float *hs, int *hp, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!worse(hs[i], hp[i], hs[p], hp[p])) return;
        float ts = hs[i]; hs[i] = hs[p]; hs[p] = ts;
        int tp = hp[i]; hp[i] = hp[p]; hp[p] = tp;
        i = p;
    }
}

static int cmp_int(const void *a, const void *b) { return (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b); }

static void dsa_topk(tern_backend *be, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                     const tern_kv_layer *kv, float scale, int k, float *min_gap) {
    (void)be;
    int Dv = kv->v_dim;
    float *hs = malloc(sizeof(float) * (size_t)k);
    int *hp = malloc(sizeof(int) * (size_t)k);
    float *kbuf = malloc(sizeof(float) * (size_t)(Dv > 0 ? Dv : 1));
    for (int r = 0; r < rows->n; r++) {
        int a = rows->pos[r], s = rows->slot[r], n = 0;
        int32_t *out = sel + (size_t)r * k;
        for (int i = 0; i < k; i++) out[i] = -1;
        if (a + 1 <= k) { /* every key is selected: the dense row */
            for (int b = 0; b <= a; b++) out[b] = b;
            continue;
        }
        if (!hs || !hp || !kbuf || !kv->v) continue;
        const float *qr = q + (size_t)r * nh * Dv, *wr = w + (size_t)r * nh;
        float best_out = NAN;
        int best_out_p = -1;
        for (int b = 0; b <= a; b++) {
            long i = rec(kv, s, b);
            if (i < 0) continue;
            const float *kb = tern__glm_rec_f32(kv, kv->v, i, Dv, kbuf);
            float score = 0.0f;
            for (int j = 0; j < nh; j++) {
                const float *qj = qr + (size_t)j * Dv;
                float dot = 0.0f;
                for (int c = 0; c < Dv; c++) dot += qj[c] * kb[c];
                dot *= scale;
                if (dot > 0.0f) score += wr[j] * dot;
            }
            int rp = b;
            float rs = score;
            if (n < k) {
                hs[n] = rs; hp[n] = rp;
                sift_up(hs, hp, n++);
                continue;
            }
            if (worse(hs[0], hp[0], rs, rp)) { /* evict the worst kept entry */
                float es = hs[0]; int ep = hp[0];
                hs[0] = rs; hp[0] = rp;
                sift_down(hs, hp, n, 0);
                rs = es; rp = ep;
            }
            if (best_out_p < 0 || worse(best_out, best_out_p, rs, rp)) { best_out = rs; best_out_p = rp; }
        }
        if (min_gap && n == k && best_out_p >= 0) {
            float g = hs[0] - best_out;
            if (isnan(*min_gap) || g < *min_gap) *min_gap = g;
        }
        for (int i = 0; i < n; i++) out[i] = hp[i];
        qsort(out, (size_t)n, sizeof *out, cmp_int);
    }
    free(hs);
    free(hp);
    free(kbuf);
}

/* ---- absorbed MLA attention over the latent cache ------------------------------------ */

static void attention_latent(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                             const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel) {
    (void)be;
    int D = kv->head_dim, maxn = 1;
    for (int r = 0; r < rows->n; r++) maxn = TERN_MAX(maxn, sel ? k_sel : rows->pos[r] + 1);
    float *sc = malloc(sizeof(float) * (size_t)maxn);
    long *ix = malloc(sizeof(long) * (size_t)maxn);
    float *kbuf = malloc(sizeof(float) * (size_t)(D > 0 ? D : 1));
    for (int r = 0; r < rows->n; r++) {
        int a = rows->pos[r], s = rows->slot[r], nk = 0;
        if (sc && ix && kbuf) {
            int cnt = sel ? k_sel : a + 1;
            for (int c = 0; c < cnt; c++) {
                int b = sel ? sel[(size_t)r * k_sel + c] : c;
                if (b < 0 || b > a) continue;
                long i = rec(kv, s, b);
                if (i >= 0) ix[nk++] = i;
            }
        }
        for (int h = 0; h < nh; h++) {
            const float *qv = q + ((size_t)r * nh + h) * D;
            float *o = out + ((size_t)r * nh + h) * dv;
            if (!sc || !ix || !kbuf) { for (int j = 0; j < dv; j++) o[j] = NAN; continue; }
            float m = -INFINITY;
            for (int c = 0; c < nk; c++) {
                const float *kb = tern__glm_rec_f32(kv, kv->k, ix[c], D, kbuf);
                float dot = 0.0f;
                for (int j = 0; j < D; j++) dot += qv[j] * kb[j];
                sc[c] = dot * scale;
                if (sc[c] > m) m = sc[c];
            }
            float sum = 0.0f;
            for (int c = 0; c < nk; c++) { sc[c] = expf(sc[c] - m); sum += sc[c]; }
            for (int j = 0; j < dv; j++) o[j] = 0.0f;
            for (int c = 0; c < nk; c++) {
                const float *kb = tern__glm_rec_f32(kv, kv->k, ix[c], D, kbuf);
                for (int j = 0; j < dv; j++) o[j] += sc[c] * kb[j];
            }
            if (sum > 0.0f)
                for (int j = 0; j < dv; j++) o[j] /= sum;
        }
    }
    free(sc);
    free(ix);
    free(kbuf);
}

/* ---- grouped sigmoid router ------------------------------------------------------------ */

void tern__glm_route_row(int32_t *ir, float *wr, const float *z, int E, int k, const tern_route_group *p, float *sg,
                         unsigned char *keep) {
    int G = p->n_group > 0 ? p->n_group : 1, per = E / G, Gk = p->topk_group > 0 ? p->topk_group : G;
    float *ch = sg + E;
    for (int e = 0; e < E; e++) {
        sg[e] = 1.0f / (1.0f + expf(-z[e]));
        ch[e] = sg[e] + (p->bias ? p->bias[e] : 0.0f);
    }
    unsigned char *gk = keep + E; /* chosen groups */
    memset(gk, 0, (size_t)G);
    for (int t = 0; t < Gk && G > 1; t++) {
        int bg = -1;
        float bs = 0;
        for (int g = 0; g < G; g++) {
            if (gk[g]) continue;
            float m1 = -INFINITY, m2 = -INFINITY; /* top-2 of the group */
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (ch[e] > m1) { m2 = m1; m1 = ch[e]; }
                else if (ch[e] > m2) m2 = ch[e];
            }
            float gs = m1 + m2;
            if (bg < 0 || gs > bs) { bg = g; bs = gs; }
        }
        gk[bg] = 1;
    }
    for (int e = 0; e < E; e++) keep[e] = G > 1 ? gk[e / per] : 1;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        int be_ = -1;
        for (int e = 0; e < E; e++)
            if (keep[e] && (be_ < 0 || ch[e] > ch[be_])) be_ = e;
        if (be_ < 0) { ir[j] = 0; wr[j] = 0.0f; continue; }
        keep[be_] = 0;
        ir[j] = be_;
        wr[j] = sg[be_];
        sum += sg[be_];
    }
    for (int j = 0; j < k; j++) {
        if (p->norm) wr[j] /= sum + 1e-20f;
        wr[j] *= p->scaling;
    }
}

static void route_group(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                        const tern_route_group *p) {
    (void)be;
    float sbuf[2 * 1024];
    unsigned char kbuf[2 * 1024];
    int G = p->n_group > 0 ? p->n_group : 1, big = E + G > 1024;
    float *sg = big ? malloc(sizeof(float) * 2 * (size_t)E) : sbuf;
    unsigned char *keep = big ? malloc((size_t)E + (size_t)G) : kbuf;
    for (int r = 0; r < n; r++) {
        int32_t *ir = idx + (size_t)r * k;
        float *wr = wts + (size_t)r * k;
        if (!sg || !keep) { for (int j = 0; j < k; j++) { ir[j] = 0; wr[j] = NAN; } continue; }
        tern__glm_route_row(ir, wr, logits + (size_t)r * E, E, k, p, sg, keep);
    }
    if (big) { free(sg); free(keep); }
}

const tern_glm_ops tern__cpu_glm_ops = {
    .copy_2d = copy_2d,
    .layernorm = layernorm,
    .rope_interleaved = rope_interleaved,
    .kv_write_latent = kv_write_latent,
    .dsa_topk = dsa_topk,
    .attention_latent = attention_latent,
    .route_group = route_group,
};
