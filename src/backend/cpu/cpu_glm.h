/*
 * cpu_glm.h — the GLM-5 op tables of the CPU backends (ops.h tern_glm_ops) and what their
 * files share. Internal to src/backend/cpu.
 *
 *   tern__cpu_glm_ops       cpu_glm.c: the scalar spec ("cpu-ref"), single-threaded loops.
 *   tern__cpu_glm_fast_ops  glm_fast.c (+ glm_attn.c, glm_avx2.c, glm_avx512.c): the fast
 *                           backend's ("cpu"): threaded over the pool, SIMD inner products,
 *                           scratch kept per backend (cpu_impl.glm) and never allocated per
 *                           decode step.
 * The light ops (layernorm, RoPE, routing, cache writes) are one row function each, used by
 * both tables, so their results are bit-identical; the attention and the indexer scores of the
 * fast table sum in a different (fixed) order and are tested against the spec.
 */
#ifndef TERN_CPU_GLM_H
#define TERN_CPU_GLM_H

#include "ops/ops.h"

#include <math.h>
#include <stdint.h>

extern const tern_glm_ops tern__cpu_glm_ops;
extern const tern_glm_ops tern__cpu_glm_fast_ops;

/* The fast table's per-backend scratch (stored in cpu_impl.glm, made on first use); accepts NULL. */
void tern__cpu_glm_free(void *state);

/* ---- row helpers shared by both tables (cpu_glm.c) ---- */

/* Record index (block * block_size + offset) of (slot, pos) in a latent view, -1 when not resident. */
long tern__glm_rec(const tern_kv_layer *kv, int slot, int pos);
/* One row of layernorm (double statistics, f32 output; y may alias x). */
void tern__glm_layernorm_row(float *y, const float *x, int d, const float *w, const float *b, float eps);
/* Interleaved RoPE of heads [h0, h1) of one row (ops.h rope_interleaved; x = the row). */
void tern__glm_rope_row(float *x, int h0, int h1, int hs, int off, int d, int32_t pos, const float *inv_freq,
                        float mscale);
/* One row of kv_write_latent (bf16 pages: each element rounded to nearest even). */
void tern__glm_kv_write_row(const tern_kv_layer *kv, int slot, int pos, const float *k, const float *v);
/* Record i of a latent pool (kv->k or kv->v) of n elements as f32: the record itself on f32 pages, else decoded
 * into buf (n floats) and buf returned. */
const float *tern__glm_rec_f32(const tern_kv_layer *kv, const void *pool, long i, int n, float *buf);
/* One row of route_group; scratch sg holds 2*E floats, keep E + n_group bytes. */
void tern__glm_route_row(int32_t *idx, float *wts, const float *z, int E, int k, const tern_route_group *p, float *sg,
                         unsigned char *keep);

/* ---- inner-product kernels of the fast table, one per ISA (glm_avx512.c, glm_avx2.c, glm_fast.c) ----
 * Both are exact f32 arithmetic whose order per output element is fixed by the ISA alone:
 * a result never depends on how many other rows/keys a call handles, so the fast ops are
 * deterministic for any thread count and batch composition. */
typedef struct tern_glm_kern {
    const char *name;
    /* out[i*ldo + j] = Σ_t a[i][t]·b[j][t] for i < na, j < nb (1..4 each), t < len. */
    void (*dots)(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo);
    /* o[i][0..n) = o[i]·corr[i] (corr NULL: as is), then += Σ_c p[i*ldp + c] · v[c][0..n) for i < no (1..4), c < nv
     * (in c order). */
    void (*pv)(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n, const float *corr);
    /* The tile's scores of nq queries, s[i*lds + c] (c < nk <= TERN_TILE_K): each = scale·s, then cap·tanh(s / cap)
     * when cap > 0, for the slots c whose bit is set in vis[i]; the others become -inf (keys query i does not see).
     * mx[i] = the largest of query i's (NaN scores ignored; -inf for none). */
    void (*tile_max)(float *s, int lds, int nq, int nk, float scale, float cap, const uint32_t *vis, float *mx);
    /* s[i*lds + c] = e^(s - m[i]) for c < nk (a score of -inf: exactly 0), l[i] += their sum (order fixed by the ISA). */
    void (*tile_exp)(float *s, int lds, int nq, int nk, const float *m, float *l);
    /* dots and pv with the keys / values as 16-bit floats (bf: 1 bf16, 0 f16), widened to f32 as they are loaded:
     * bitwise dots / pv on the widened rows (BF16 / F16 KV pages and GLM's bf16 latent pages read in place). */
    void (*dots_h)(const float *const *a, int na, const uint16_t *const *b, int nb, int len, float *out, int ldo, int bf);
    void (*pv_h)(float *const *o, int no, const float *p, int ldp, const uint16_t *const *v, int nv, int n,
                 const float *corr, int bf);
} tern_glm_kern;

/* The portable tile_max / tile_exp (glm_fast.c; expf and tanhf, sums in c order). */
void tern__glm_tile_max_scalar(float *s, int lds, int nq, int nk, float scale, float cap, const uint32_t *vis, float *mx);
void tern__glm_tile_exp_scalar(float *s, int lds, int nq, int nk, const float *m, float *l);

extern const tern_glm_kern tern__glm_kern_scalar;
extern const tern_glm_kern tern__glm_kern_avx2;
extern const tern_glm_kern tern__glm_kern_avx512;

#endif
