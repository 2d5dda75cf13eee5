/*
 * sample_ref.c — the reference draw of sample_ref.h, plus the host-memory backend op.
 *
 * Cost: one pass over the vocabulary for the candidates; then everything works on the set
 * A of tokens that can carry weight (x >= -30 at temperature 1 or T), kept in id order.
 * top-k uses a quickselect on a copy of A, top-p a sort of the (top-k) survivors of A;
 * the cut they leave is one (logit, id) position of the order O, and a token survives when
 * it comes no later than the cut. The draw walks A in id order twice (sum, then pick),
 * recomputing the weights instead of storing them. Nothing is allocated.
 */
#include "sample/sample_ref.h"
#include "sample/sample_math.h"

#include <math.h>
#include <stdlib.h>

typedef struct cand { float logit; int32_t id; } cand;

static int cand_cmp(const void *a, const void *b) { /* the order O */
    const cand *x = a, *y = b;
    if (tern_sample_before(x->logit, x->id, y->logit, y->id)) return -1;
    if (tern_sample_before(y->logit, y->id, x->logit, x->id)) return 1;
    return 0;
}
static int better(const cand *x, const cand *y) { return tern_sample_before(x->logit, x->id, y->logit, y->id); }

/* Move the k best candidates to c[0..k) (unordered): quickselect. */
static void select_top(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand piv = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (better(&c[i], &piv)) i++;
            while (better(&piv, &c[j])) j--;
            if (i <= j) { cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int32_t tern__sample_argmax(const float *logits, int V, float *mx_out, int *bad) {
    *bad = -1;
    int best = -1;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (isnan(l)) { *bad = i; return TERN_SAMPLE_ERR_NAN; }
        if (l == -INFINITY) continue;
        if (l == INFINITY) { *bad = i; return TERN_SAMPLE_ERR_INF; }
        if (best < 0 || l > mx) { mx = l; best = i; } /* strict: the lowest id wins ties */
    }
    if (mx_out) *mx_out = mx;
    return best < 0 ? TERN_SAMPLE_ERR_MASKED : best;
}

int32_t tern__sample_draw(const float *logits, int V, const tern_sample_row *p, void *scratch, int *bad) {
    float mx;
    const int32_t best = tern__sample_argmax(logits, V, &mx, bad);
    if (best < 0 || p->temperature == 0) return best;

    /* A: the tokens that can carry weight, in id order */
    cand *a = scratch, *b = a + V;
    int na = 0;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (l == -INFINITY) continue;
        double x1 = tern_sample_x(l, mx);
        if (x1 >= TERN_SAMPLE_XMIN || x1 * p->inv_t >= TERN_SAMPLE_XMIN) a[na++] = (cand){l, i};
    }
    int has_cut = 0;
    cand cut = {0, 0};
    int nb = 0;
    if (p->top_k > 0 && p->top_k < na) {
        for (int i = 0; i < na; i++) b[i] = a[i];
        select_top(b, na, p->top_k);
        cut = b[0];
        for (int i = 1; i < p->top_k; i++) if (better(&cut, &b[i])) cut = b[i];
        has_cut = 1;
    }
    if (p->top_p < 1) {
        nb = 0;
        for (int i = 0; i < na; i++)
            if (!has_cut || !better(&cut, &a[i])) b[nb++] = a[i];
        qsort(b, (size_t)nb, sizeof *b, cand_cmp);
        uint64_t total = 0;
        for (int i = 0; i < nb; i++) total += tern_sample_weight(tern_sample_x(b[i].logit, mx));
        uint64_t thr = tern_sample_top_p_thr(p->top_p, total), cum = 0;
        int keep = nb - 1;
        for (int i = 0; i < nb; i++) {
            cum += tern_sample_weight(tern_sample_x(b[i].logit, mx));
            if (cum >= thr) { keep = i; break; }
        }
        cut = b[keep];
        has_cut = 1;
    }
    float lmin = mx + p->min_p_log; /* -inf when min-p is off */
    uint64_t total = 0;
    for (int i = 0; i < na; i++) {
        if ((has_cut && better(&cut, &a[i])) || !(a[i].logit >= lmin)) continue;
        total += tern_sample_weight(tern_sample_x(a[i].logit, mx) * p->inv_t);
    }
    uint64_t target = tern_sample_target(tern_sample_u53(p->seed, p->step), total), cum = 0;
    for (int i = 0; i < na; i++) {
        if ((has_cut && better(&cut, &a[i])) || !(a[i].logit >= lmin)) continue;
        cum += tern_sample_weight(tern_sample_x(a[i].logit, mx) * p->inv_t);
        if (target < cum) return a[i].id;
    }
    return best; /* unreachable: target < total and the max carries weight 2^42 */
}

int32_t tern__sample_row(float *logits, int V, const tern_sample_row *p, const tern_sample_pair *pairs,
                         void *scratch) {
    for (int i = 0; i < p->n_bias; i++) {
        const tern_sample_pair *e = &pairs[p->bias_off + i];
        if (e->id >= 0 && e->id < V) logits[e->id] = logits[e->id] + e->v;
    }
    for (int i = 0; i < p->n_hist; i++) {
        const tern_sample_pair *e = &pairs[p->hist_off + i];
        if (e->id >= 0 && e->id < V)
            logits[e->id] = tern_sample_penalize(logits[e->id], p->rep, p->presence, p->frequency, e->v);
    }
    int bad;
    return tern__sample_draw(logits, V, p, scratch, &bad);
}

void tern_sample_op_host(tern_backend *be, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
                         const tern_sample_pair *pairs, void *scratch) {
    (void)be;
    for (int r = 0; r < n; r++)
        if (rows[r].mode == TERN_SAMPLE_DRAW) ids[r] = tern__sample_row(logits + (size_t)r * V, V, &rows[r], pairs, scratch);
}
