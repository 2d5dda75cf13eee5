/*
 * glm_state.h — what the fast GLM-5 op files share (glm_fast.c: table, scratch, light ops;
 * glm_attn.c: latent attention and the DSA indexer). Internal to src/backend/cpu.
 *
 * One tern_glm_state per fast CPU backend, in cpu_impl.glm, made by the first GLM op and
 * freed by the backend's close. Buffers only grow, and only when a larger shape appears.
 */
#ifndef TERN_GLM_STATE_H
#define TERN_GLM_STATE_H

#include "backend/cpu/cpu_glm.h"
#include "backend/cpu/cpu_impl.h"

typedef struct tern_glm_state {
    const tern_glm_kern *gk;   /* inner products of the backend's ISA level */
    tern_pool *pool;
    int nth;
    size_t par_min;            /* light ops go over the pool from this much work */
    int spec;                  /* TERN_CPU_GLM=ref: every op runs the scalar spec (benchmarks) */
    /* dsa_topk: per thread `cap` candidates (score, position, rank key) */
    size_t cap;
    float *sc;
    int32_t *cpos;
    uint64_t *key;
    float *gap;                /* [gap_cap] per-row gaps (NaN: none) */
    int gap_cap;
    int *rblk;                 /* [rblk_cap] the tiled attention's row blocks (cpu_attn.c): first row of each, then n */
    int rblk_cap;
    /* route_group: per thread 2*route_e floats and route_e + route_g bytes */
    int route_e, route_g;
    float *rsg;
    unsigned char *rkeep;
} tern_glm_state;

/* The backend's state, made on first use; NULL when out of memory. */
tern_glm_state *tern__glm_state(tern_backend *be);
/* Grow the per-thread candidate buffers to `cap` keys / the per-row arrays to n rows; 0 on failure. */
int tern__glm_reserve_keys(tern_glm_state *g, size_t cap);
int tern__glm_reserve_rows(tern_glm_state *g, int n);
int tern__glm_reserve_blocks(tern_glm_state *g, int n); /* rblk for n + 1 entries */

/* One tile of flash-style attention for up to TERN_TILE_HB queries that share their keys (the GLM
 * latent attention's heads; cpu_attn.c's query heads of one KV head): scores q·k over d through
 * the ISA's 4x4 `dots`, times scale (then softcap when > 0), a tile-wise online softmax (running
 * max m, sum l; the output rescaled by exp(m_old - m_new) when the max grows), o += p·v over dv
 * through `pv`. The order of every sum is fixed by the ISA and the key stream. vis (NULL: every key) gives per
 * query the tile's slots it sees (bit c: kp[c]); the others score -inf, weigh exactly 0 and so change nothing
 * (fma(0, v, o) = o: o starts at +0 and never becomes -0), which lets queries of several rows share a tile. */
#define TERN_TILE_K 32  /* keys per tile */
#define TERN_TILE_HB 32 /* queries per tile */
typedef struct tern_tile_acc {
    const float *qp[TERN_TILE_HB];
    float *op[TERN_TILE_HB];
    float m[TERN_TILE_HB], l[TERN_TILE_HB];
    float sc[TERN_TILE_HB * TERN_TILE_K];
} tern_tile_acc;
/* A tile's key (or value) rows: f[c] (f32) or, for 16-bit pages read in place, h[c] (bf16 / f16). */
enum { TERN_TILE_F32 = 0, TERN_TILE_BF16 = 1, TERN_TILE_F16 = 2 };
typedef struct tern_tile_rows {
    const float *const *f;
    const uint16_t *const *h;
    int fmt;
} tern_tile_rows;
void tern__tile_attend(const tern_glm_kern *gk, tern_tile_acc *t, int nq, const tern_tile_rows *k, const tern_tile_rows *v,
                       int nk, int d, int dv, float scale, float softcap, const uint32_t *vis);

void tern__glm_dsa_topk(tern_backend *be, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                        const tern_kv_layer *kv, float scale, int k, float *min_gap);
void tern__glm_attention_latent(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                                const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel);

#endif
