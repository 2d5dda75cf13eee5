/*
 * ops.h — the kernel contract between model code and backends.
 *
 * Model code (src/model) calls only these ops; it never sees CUDA, SIMD or threads.
 * A backend (src/backend/cpu, src/backend/cuda) fills a tern_backend_vt. Every op has a
 * scalar reference implementation on the CPU (src/backend/cpu/ref) that is the spec:
 * every SIMD and CUDA kernel is tested against it.
 *
 * Data conventions
 *   - Activations are f32, row-major, in the backend's memory ("device pointers"; plain host
 *     pointers on the CPU backend). n = number of rows (tokens) in the step.
 *   - Weights are tern_tensor (any stored dtype incl. MLX affine TERN_DT_Q), made usable by
 *     upload_weight(); small vectors (norm weights, scalars) are passed as f32 device arrays.
 *   - Ops are asynchronous on devices; download() and sync() order them.
 *   - Ops never fail on valid shapes; shape validation happens at load time. Ops that
 *     allocate (none in the decode path) return tern_status.
 *
 * The batch is a set of rows from several sequences (tern_rows): row r belongs to KV slot
 * slot[r] at absolute position pos[r]. Attention reads keys/values through a tern_kv_layer
 * view (paged: fixed-size blocks, a block table per slot); the runtime owns allocation.
 */
#ifndef TERN_OPS_H
#define TERN_OPS_H

#include "base/base.h"
#include "ops/tensor.h"

#include <stdlib.h>

/* ---- KV cache view (one per layer; allocation lives in src/runtime/kv.c) ----
 * Pools are laid out [n_blocks][block_size][n_head_kv][head_dim] in `dtype`.
 * Token at position p of slot s lives in block block_table[s*max_blocks + p/block_size],
 * offset p%block_size. A table entry < 0 means "not resident" (e.g. freed because it fell
 * out of a sliding window) and must never be read. */
/* Page formats of one layer's K or V cache (src/ops/kvq.h has the byte layout and the
 * reference codec). Zero-initialised = F32, the format of every existing view. */
enum {
    TERN_KV_F32 = 0,
    TERN_KV_F16 = 1,
    TERN_KV_BF16 = 2,
    TERN_KV_AFFINE = 3,        /* bits 4|8, groups of `group` along head_dim: f16 scale + f16 min each */
    TERN_KV_TURBO = 4,         /* bits 2|3|4: random Hadamard rotation, Lloyd-Max codes, f32 scale */
};
typedef struct tern_kv_fmt {
    int kind;                  /* TERN_KV_* */
    int bits;                  /* AFFINE / TURBO code bits */
    int group;                 /* AFFINE group size (divides head_dim) */
} tern_kv_fmt;

typedef struct tern_kv_layer {
    tern_dtype dtype;          /* F32 / F16 / BF16 when K and V share that float kind, else TERN_DT_Q */
    int n_head_kv, head_dim;
    int block_size;
    int window;                /* 0: full attention; W > 0: key b visible to query a iff a-W < b <= a */
    void *k, *v;               /* device pools */
    const int32_t *block_table;/* device array [n_slots * max_blocks] */
    int max_blocks;
    /* Compressed kinds: the pools hold one record of tern_kvq_vec_bytes(fmt, head_dim) bytes
     * per (token, kv head) instead of head_dim floats. TURBO keys are stored rotated (queries
     * are rotated by the same R before the dot product); TURBO values are stored rotated and
     * the attention output is un-rotated once per head. */
    tern_kv_fmt kf, vf;        /* K and V formats (zero = F32) */
    int rot_dim;               /* P = smallest power of two >= head_dim (TURBO only) */
    const float *rot;          /* device [rot_dim] ±1 signs of the layer's rotation R (TURBO only) */
    /* MLA latent kind (GLM-5; appended): k holds one record of head_dim elements per token
     * (n_head_kv = 1: normalized latent then roped key), v holds v_dim per token (the DSA
     * indexer key) or is NULL when v_dim == 0; elements f32, or bf16 when dtype is TERN_DT_BF16
     * (written rounded to nearest even, read exactly). Same block table / positions as the
     * other kinds. */
    int latent;
    int v_dim;
} tern_kv_layer;

typedef struct tern_rows {
    int n;
    const int32_t *pos;        /* [n] device array: absolute positions */
    const int32_t *slot;       /* [n] device array: KV slot (block-table row) */
    /* host copies of the same (backends may use them to plan work) */
    const int32_t *pos_host, *slot_host;
    /* Bidirectional spans (appended; NULL = none, the plain causal step). Row r additionally
     * sees the keys of its slot at positions vis_lo[r] <= b <= vis_hi[r] (vis_lo > vis_hi: no
     * extra keys): later positions and positions below the window's lower bound included. The
     * forward driver sets them for the rows of a span (tern_batch.span: the whole span) and to
     * pos..pos for the other rows of such a step. Extra keys must be resident and written (this
     * step's kv_write or earlier). The host copies may be NULL (planning only). */
    const int32_t *vis_lo, *vis_hi;            /* [n] device arrays */
    const int32_t *vis_lo_host, *vis_hi_host;  /* [n] host copies or NULL */
} tern_rows;

/* The attention mask of row r, host side (CPU backends; the CUDA kernel computes the same):
 * key b is visible iff lo <= b <= hi (causal, window) or vlo <= b <= vhi (span); every
 * visible key lies in [first, last]. Scanning b = first..last in order with
 * tern_key_visible() is the reference order; a row without a span scans lo..hi exactly as
 * before spans existed (bit-identical results). */
typedef struct tern_key_range { int lo, hi, vlo, vhi, first, last; } tern_key_range;

static inline tern_key_range tern_key_range_of(const tern_kv_layer *kv, const tern_rows *rows, int r) {
    tern_key_range k;
    k.hi = rows->pos[r];
    k.lo = kv->window > 0 ? k.hi - kv->window + 1 : 0;
    if (k.lo < 0) k.lo = 0;
    k.vlo = 0;
    k.vhi = -1;
    if (rows->vis_lo && rows->vis_hi) {
        k.vlo = rows->vis_lo[r] < 0 ? 0 : rows->vis_lo[r];
        k.vhi = rows->vis_hi[r];
    }
    k.first = k.lo;
    k.last = k.hi;
    if (k.vlo <= k.vhi) {
        if (k.vlo < k.first) k.first = k.vlo;
        if (k.vhi > k.last) k.last = k.vhi;
    }
    return k;
}

static inline int tern_key_visible(const tern_key_range *k, int b) {
    return (b >= k->lo && b <= k->hi) || (b >= k->vlo && b <= k->vhi);
}

/* Long-context steps: rows whose longest row sees at least tern_long_keys() keys (TERN_LONG_KEYS, default 4096).
 * The CUDA attention takes its split tensor-core decode kernel for them (attn_decode.cu, TERN_CUDA_AD_TCS), which wins
 * from ~4k keys and loses below in a batch-1 step (bench/NOTES.md (ab)); model.c's step-graph key holds the class,
 * so a recorded step is replayed only for steps of its own class. */
static inline long tern_long_keys(void) {
    static long v = -1;
    if (v < 0) {
        const char *e = getenv("TERN_LONG_KEYS");
        const long x = e && *e ? atol(e) : 4096;
        v = x < 1 ? 1 : x;
    }
    return v;
}
static inline int tern_rows_long(const int32_t *pos, int n) {
    long m = 0;
    for (int r = 0; pos && r < n; r++) m = pos[r] + 1L > m ? pos[r] + 1L : m;
    return m >= tern_long_keys();
}

/* Distinct slot ids among n rows (sequences in the step). The CUDA attention takes its decode kernel
 * when n <= 2 * seqs (at most two rows per sequence on average), and model.c's step-graph key holds
 * the count so that replayed steps choose as eager ones do. Distinct, not runs: rows of two
 * sequences interleaved (tests; never the scheduler) must choose as their sequences alone would.
 * Slot ids >= 65536 (none in practice) count as new at each run. */
static inline int tern_slot_seqs(const int32_t *slot, int n) {
    if (!slot) return n > 0;
    uint64_t seen[1024] = {0};
    int seqs = 0;
    for (int r = 0; r < n; r++) {
        if (r > 0 && slot[r] == slot[r - 1]) continue;
        const uint32_t s = (uint32_t)slot[r];
        if (s >= 65536u) { seqs++; continue; }
        if (!(seen[s >> 6] >> (s & 63) & 1)) seqs++;
        seen[s >> 6] |= 1ull << (s & 63);
    }
    return seqs;
}

typedef struct tern_backend tern_backend;

typedef struct tern_glm_ops tern_glm_ops; /* GLM-5 op table, defined below */

/* ---- on-device sampling (appended; the chain and why it is exact: src/sample/) ---------- */
enum { TERN_SAMPLE_SKIP = 0, TERN_SAMPLE_DRAW = 1 };
enum { TERN_SAMPLE_ERR_MASKED = -1, TERN_SAMPLE_ERR_NAN = -2, TERN_SAMPLE_ERR_INF = -3 };

typedef struct tern_sample_pair { int32_t id; float v; } tern_sample_pair;

/* One row's sampling parameters, built on the host by tern_sampler_device_row(). */
typedef struct tern_sample_row {
    int32_t mode;              /* TERN_SAMPLE_SKIP / TERN_SAMPLE_DRAW */
    int32_t top_k;             /* 0 = off */
    float temperature;         /* 0 = greedy: argmax, lowest id on ties */
    float top_p;               /* 1 = off */
    float min_p_log;           /* logf(min_p); -INFINITY = off */
    float rep, presence, frequency; /* penalties (1, 0, 0 = off) over the history list */
    int32_t bias_off, n_bias;  /* pairs[bias_off ..): (id, bias), added in list order */
    int32_t hist_off, n_hist;  /* pairs[hist_off ..): (distinct id, count) of the penalty window */
    double inv_t;              /* 1.0 / temperature (computed on the host) */
    uint64_t seed, step;       /* RNG counter: (seed, step) */
} tern_sample_row;

static inline size_t tern_sample_scratch_bytes(int V) { return (size_t)(V > 0 ? V : 1) * 16; }

/* The post-norm residual add that ops.h norm_matmul may fold in front of its pre-norm (see there) */
typedef struct tern_norm_res {
    float *x_out;     /* [n, d]: x' = (x + rmsnorm(h)·w)·(s ? s[0] : 1) */
    const float *h;   /* [n, d] */
    const float *w;   /* [d] or NULL */
    const float *s;   /* device scalar or NULL */
    /* (appended) h2 != NULL: an inner post-norm add first, h' = h + rmsnorm(h2)·w2 (rmsnorm_add without a scalar; w2
     * may be NULL), and x' is taken of h' — bitwise rmsnorm_add(h, h2, w2) then rmsnorm_add(x, h, w, s); h and h2 are
     * scratch afterwards. Gemma 4's MoE layers: the experts' post-norm add onto the dense branch's output. A backend
     * that does not serve h2 declines the op (0), as for any res it does not take. */
    const float *h2;  /* [n, d] or NULL */
    const float *w2;  /* [d] or NULL */
} tern_norm_res;

typedef struct tern_backend_vt {
    const char *name;
    void (*close)(tern_backend *be);

    /* memory */
    void *(*alloc)(tern_backend *be, size_t bytes);                 /* NULL on failure */
    void (*free)(tern_backend *be, void *p);                        /* accepts NULL */
    void (*upload)(tern_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(tern_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(tern_backend *be);
    /* Make a host weight usable by this backend: may copy to device or repack; on
     * success *t is updated in place (data/scales/biases/device). */
    tern_status (*upload_weight)(tern_backend *be, tern_tensor *t, tern_error *err);
    void (*free_weight)(tern_backend *be, tern_tensor *t);

    /* y[n, out] = x[n, in] · W[out, in]ᵀ   (W: F32/F16/BF16/Q). In the f32 compute mode the
     * products and sums are exact f32 (no bf16/tf32 rounding of x). */
    void (*matmul)(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w);

    /* Same, with matrix `e` of a 3-D stack W[E, out, in]. */
    void (*matmul_expert)(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int e);

    /* y[n, H] = E[ids[r]] * scale  (E: [V, H], any dtype incl. Q). ids: device int32 [n]. */
    void (*embed)(tern_backend *be, float *y, const int32_t *ids, int n, const tern_tensor *emb, float scale);

    /* RMSNorm over rows of length d: y = x * rsqrt(mean(x²) + eps) * (w ? w : 1).
     * w: f32 device array [d] or NULL. y may alias x. */
    void (*rmsnorm)(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, float eps);

    /* Rotary embedding, half-split (NeoX) convention, in place on x[n, nh, d]:
     * for i < d/2: θ = pos[r]·inv_freq[i]; (x[i], x[i+d/2]) rotated by θ; then both scaled by
     * `mscale` (1.0 except yarn). inv_freq: f32 device array [d/2]; zero entries are identity. */
    void (*rope)(tern_backend *be, float *x, int n, int nh, int d, const int32_t *pos,
                 const float *inv_freq, float mscale);

    /* Write k,v [n, n_head_kv, head_dim] of each row into the cache at (slot, pos). */
    void (*kv_write)(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v);

    /* out[n, nh, d] = softmax(scale · q·Kᵀ + mask) · V over the keys of each row's slot with
     * positions allowed by the layer's window and causality (key pos <= row pos), or inside the
     * row's span range when rows->vis_lo is set (the union of both sets). GQA: head h
     * uses kv head h / (nh / n_head_kv). softcap > 0: scores = softcap·tanh(scores/softcap). */
    void (*attention)(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                      const tern_kv_layer *kv, float scale, float softcap);

    /* Elementwise (n = element count). y may alias inputs. */
    void (*add)(tern_backend *be, float *y, const float *a, const float *b, size_t n);
    void (*mul)(tern_backend *be, float *y, const float *a, const float *b, size_t n);
    void (*scale)(tern_backend *be, float *y, const float *x, float s, size_t n);
    /* y[r][j] = x[r][j] * s[0]  where s is a device f32 scalar (e.g. Gemma 4 layer_scalar) */
    void (*scale_dev)(tern_backend *be, float *y, const float *x, const float *s, size_t n);
    void (*gelu_tanh_mul)(tern_backend *be, float *y, const float *gate, const float *up, size_t n); /* y = gelu_tanh(gate)*up; up NULL: y = gelu_tanh(gate) */
    void (*silu_mul)(tern_backend *be, float *y, const float *gate, const float *up, size_t n);
    void (*softcap)(tern_backend *be, float *y, size_t n, float cap);        /* y = cap·tanh(y/cap) */
    /* y[r][:] += bias[:] for rows r < n (bias f32 device [d]) */
    void (*add_bias)(tern_backend *be, float *y, const float *bias, int n, int d);
    /* Copy strided column block: dst[r][0:w] = src[r][off:off+w], rows n, src row stride ss. */
    void (*copy_cols)(tern_backend *be, float *dst, const float *src, int n, int w, int ss, int off);

    /* MoE: top-k routing. logits [n, E] → idx [n, k] (int32), wts [n, k] (f32).
     * mode TERN_ROUTE_SOFTMAX_TOPK: softmax over E, top-k, renormalise over the k (Gemma 4, Qwen MoE).
     * per_expert_scale (f32 [E] or NULL) multiplies the chosen weights afterwards.
     * Ties: higher probability first, then lower expert index. */
    void (*route_topk)(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                       int mode, const float *per_expert_scale);

    /* Gated expert MLP over routed rows: y[n, H] = Σ_j wts[r][j] · down_e(act(gate_e x) * up_e x)
     * with e = idx[r][j]. gate/up: [E, I, H], down: [E, H, I]. act: TERN_ACT_GELU_TANH/SILU.
     * `scratch` holds at least n*k*(2*I) floats. */
    void (*moe_mlp)(tern_backend *be, float *y, const float *x, int n, int H, const int32_t *idx,
                    const float *wts, int k, const tern_tensor *gate, const tern_tensor *up,
                    const tern_tensor *down, int act, float *scratch);

    /* Optional step graphs (NULL on backends without them; the forward driver then runs every
     * op eagerly). `key` names everything a step's op sequence depends on (the driver hashes
     * model, KV views, rows, input kind); the graph reads its inputs from device buffers the
     * driver uploads before each replay.
     *   graph_replay: a graph for key exists -> run it, wait, copy the downloads it recorded
     *                 into out[0, out_bytes) (host) and return 1; otherwise return 0.
     *   graph_begin:  record (not run) the ops that follow; downloads made while recording must
     *                 land in [out, out + out_bytes). Returns 1 when recording started.
     *   graph_end:    stop recording; ok = 0 discards. Returns 1 when the graph was kept (the
     *                 caller then replays it), 0 when it was not (the caller runs eagerly).
     *   graph_reset:  drop every graph (buffers they use are about to be freed). */
    int (*graph_replay)(tern_backend *be, uint64_t key, void *out, size_t out_bytes);
    int (*graph_begin)(tern_backend *be, uint64_t key, void *out, size_t out_bytes);
    int (*graph_end)(tern_backend *be, int ok);
    void (*graph_reset)(tern_backend *be);
    /* optional, the pipelined decode (runtime/generate.c, sched.c): graph_launch runs the graph recorded for key
     * without waiting, its downloads into staging half `half` (0 or 1; 1 when launched); graph_wait waits for its last
     * launch into that half and copies the downloads into out. Two launches of one graph into different halves may be
     * queued at once */
    int (*graph_launch)(tern_backend *be, uint64_t key, int half);
    int (*graph_wait)(tern_backend *be, uint64_t key, int half, void *out, size_t out_bytes);

    /* GLM-5 ops (appended; NULL when the backend has none) */
    const tern_glm_ops *glm;

    /* Tensor parallelism (appended; src/model/tp.h): y[0, count) = the element-wise sum of y
     * over every rank of the backend's TP group, identical on every rank afterwards. Model code
     * calls it through tern_allreduce_sum() after each row-parallel matmul (o_proj, down_proj,
     * the MoE combine). NULL outside a group: then the call is a no-op. */
    void (*allreduce_sum)(tern_backend *be, float *y, size_t count);

    /* Fused decode ops (appended). Optional: NULL, or a return of 0 (shapes/formats the
     * backend does not fuse), means "not done" and the model runs the separate ops instead
     * (src/model/internal.h: tern__matmul_n & co.). When done, the results are bitwise those
     * of the separate ops on the same backend — except the matmuls for n > 1 rows in CUDA's plain
     * bf16 mode (gemm.c: one batched or beta = 1 cuBLASLt GEMM may run another algorithm), which
     * are within the bf16 mode's bound of the separate ops.
     *   matmul_n:      y[i][n, out_i] = x · W_iᵀ for i < k (k <= 3; the W_i share `in` and format)
     *   matmul_glu:    y[n, I] = act(x · gateᵀ) ⊙ (x · upᵀ), act TERN_ACT_SILU / TERN_ACT_GELU_TANH
     *   matmul_add:    y[n, out] = y + x · Wᵀ  (add after matmul)
     *   rope_kv_write: rope(q [n, nh, d]) and rope(k [n, n_head_kv, d]) in place (as rope, at
     *                  rows->pos), then kv_write(kv, rows, k, v) */
    int (*matmul_n)(tern_backend *be, int k, float *const *y, const float *x, int n, const tern_tensor *const *w);
    int (*matmul_glu)(tern_backend *be, float *y, const float *x, int n, const tern_tensor *gate,
                      const tern_tensor *up, int act);
    int (*matmul_add)(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w);
    int (*rope_kv_write)(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k,
                         const float *v, int nh, const float *inv_freq, float mscale);

    /* On-device sampling (appended; NULL when the backend has none: callers download logits).
     * For each row r < n of logits [n, V] (device; modified in place by bias and penalties)
     * with rows[r].mode == TERN_SAMPLE_DRAW: ids[r] = the token the CPU sampler chain
     * (src/sample/sampler.h) draws from that row with the same parameters, history, seed and
     * step — exactly the same token (src/sample/sample_math.h says how), or a negative
     * TERN_SAMPLE_ERR_*. Rows with mode TERN_SAMPLE_SKIP are not touched (ids[r] neither).
     * rows [n], pairs (the lists the rows point into) and ids [n]: backend memory; scratch:
     * tern_sample_scratch_bytes(V) bytes of backend memory (used by the CPU backends). */
    void (*sample)(tern_backend *be, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
                   const tern_sample_pair *pairs, void *scratch);

    /* Tensor parallelism, continued (appended; src/model/tp.h; NULL outside a group).
     *   allreduce_add: x[0, count) += the element-wise sum of y over the ranks (summed in rank
     *                  order, then one add: bitwise allreduce_sum(y) followed by add(x, x, y));
     *                  y is scratch afterwards. Model code calls tern_allreduce_add().
     *   gather_cols:   the vocabulary-parallel output head: this rank's src [rows, w] lands in
     *                  columns [c0, c0 + w) of rank 0's dst [rows, ld] (every rank calls it with
     *                  its own slice; dst is only written on rank 0, may be NULL elsewhere). */
    void (*allreduce_add)(tern_backend *be, float *x, float *y, size_t count);
    void (*gather_cols)(tern_backend *be, float *dst, const float *src, int rows, int ld, int c0, int w);

    /* Fused residual norm (appended; optional like the fused decode ops above): for rows r < rows
     * of d, x[r] = (x[r] + rmsnorm(h[r])·w) · (s ? s[0] : 1) (s: device scalar, the Gemma 4 layer
     * scalar). h is left as is here; the unfused path (src/model/internal.h tern__rmsnorm_add)
     * normalises h in place, so h is scratch afterwards either way. Bitwise the separate ops. */
    int (*rmsnorm_add)(tern_backend *be, float *x, const float *h, int rows, int d, const float *w, float eps,
                       const float *s);

    /* (appended, optional) the device's copy rate in GB/s, bytes read plus written (device-to-device
     * copies of `bytes`, best of a few timed rounds): the bandwidth of tern bench's floor. 0 when it
     * cannot be measured (no memory for the buffers). */
    double (*copy_rate)(tern_backend *be, size_t bytes);

    /* (appended, optional) upload from a thread other than the engine thread: copies `bytes` of host
     * memory into backend memory and returns when they have landed, without waiting for (or
     * delaying) the work the engine thread queued (CUDA: its own stream through pinned staging).
     * The caller guarantees nothing queued reads dst meanwhile. The expert store's I/O thread uses
     * it to fill the next MoE layer's slots while the GPU computes (src/runtime/experts.c). */
    void (*upload_side)(tern_backend *be, void *dst, const void *src, size_t bytes);

    /* Fused pre-norm (appended; optional like the fused decode ops): xn[n, d] = rmsnorm(x)·nw (nw may
     * be NULL; d = the weights' `in`; xn != x), then on xn: act < 0: matmul_n(k, y, xn, w) (k = 1: the
     * plain matmul), act >= 0: matmul_glu(y[0], xn, w[0], w[1], act). xn is written as rmsnorm writes
     * it, and the results are bitwise those of rmsnorm + the op. 0 = not done (the model runs both;
     * src/model/internal.h tern__norm_matmul_qkv / _glu / tern__norm_matmul). CUDA fuses one row (the
     * decode GEMV stages the row once per block; block_rms_inv repeats rmsnorm's reduction there).
     * res != NULL (optional even where norm_matmul is served: 0 = not done): first the post-norm
     * residual add of rmsnorm_add, x' = (x + rmsnorm(res->h)·res->w)·(res->s ? res->s[0] : 1), written
     * to res->x_out (neither x nor h; x is left as is), and the pre-norm is taken of x' — bitwise
     * rmsnorm_add + rmsnorm + the op. */
    int (*norm_matmul)(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, int k,
                       float *const *y, const tern_tensor *const *w, int act, const tern_norm_res *res);

    /* Several RMSNorms of one width (appended; optional): for i < k (k <= 3), y[i] [rows[i], d] =
     * rmsnorm(x[i])·w[i] (w[i] may be NULL; y[i] may be x[i]), bitwise k rmsnorm calls. 0 = not done
     * (src/model/internal.h tern__rmsnorm_n runs them one by one). Gemma 4's q, k, v head norms. */
    int (*rmsnorm_n)(tern_backend *be, int k, float *const *y, const float *const *x, const int *rows, int d,
                     const float *const *w, float eps);

    /* Head norms before rope_kv_write (appended; optional): per head of d = kv->head_dim, q = rmsnorm(q)·qw,
     * k = rmsnorm(k)·kw, v = rmsnorm(v) (no weight), all in place, then rope_kv_write(kv, rows, q, k, v,
     * nh, inv_freq, mscale): bitwise those ops. 0 = not done (src/model/internal.h
     * tern__norm_rope_kv_write runs them). Gemma 4's attention input. k = v = NULL (kw unused): q's norms and
     * rope only, nothing stored — bitwise rmsnorm + rope (a KV-shared layer's query: tern__norm_rope_q). */
    int (*norm_rope_kv_write)(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k,
                              float *v, int nh, const float *inv_freq, float mscale, const float *qw, const float *kw,
                              float eps);

    /* The pre-normed q|k|v projection with rope_kv_write after it (appended; optional): norm_matmul(xn, x, nw,
     * eps, rows->n, 3, {q, k, v}, w, -1, NULL), then rope_kv_write(kv, rows, q, k, v, nh, inv_freq, mscale):
     * bitwise those ops for one row. 0 = not done (src/model/internal.h tern__norm_qkv_rope_kv runs them). The CUDA
     * backend folds the rope and the cache stores into the one-row GEMV's epilogue; for many rows in the plain bf16
     * mode, with q|k|v joined (join_weights, TERN_CUDA_QKV_ONE), it runs one GEMM over the three and ropes from its
     * rows (the bf16 mode's bound, not bitwise). */
    int (*norm_qkv_rope_kv)(tern_backend *be, float *xn, const float *x, const float *nw, float eps, float *q,
                            float *k, float *v, const tern_tensor *const *w, const tern_kv_layer *kv,
                            const tern_rows *rows, int nh, const float *inv_freq, float mscale);

    /* The pre-normed MLP (appended; optional): xn[n, d] = rmsnorm(x)·nw written as rmsnorm writes it (xn != x), then
     * y[n, out] = (act(xn·w[0]ᵀ) ⊙ (xn·w[1]ᵀ))·w[2]ᵀ (add = 0) or y += that (add = 1, as matmul_add); w = {gate,
     * up, down}, act TERN_ACT_SILU / TERN_ACT_GELU_TANH. 0 = not done (src/model/internal.h tern__pending_mlp
     * runs norm_matmul + the down matmul). Served where a backend keeps the intermediates in its own form — CUDA's
     * plain bf16 mode for many rows keeps the gate / up products and their glu in bf16 (transformers' bf16 MLP) —
     * so within the bf16 mode's bound of the separate ops, not bitwise. Never in a tensor-parallel group with add.
     * res != NULL (optional: 0 = not done): norm_matmul's residual prologue first (x' to res->x_out, x left as is;
     * the pre-norm is taken of x'). */
    int (*norm_mlp)(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, float *y, int add,
                    const tern_tensor *const *w, int act, const tern_norm_res *res);

    /* (appended, optional) The most rows one forward will carry (the model's max_batch): a backend may size its
     * own prefill buffers for them (CUDA: the GEMM scratch, tern_backend_cuda_fixed_bytes). Called when a model
     * opens on the backend, before any step or graph; buffers only grow. Non-zero status (TERN_ENOMEM with the
     * sizes) when the device cannot hold them; the backend keeps its old buffers then. */
    tern_status (*reserve_rows)(tern_backend *be, int rows, tern_error *err);
    /* Weights consumed together (appended; optional): w[0..k) uploaded 2-D matrices of one dtype and one `in`, moved
     * into one allocation back to back (w[i + 1]'s data right after w[i]'s rows) so that one GEMM can read them as a
     * single [Σ out, in] matrix; w[1..k) get `joined` = 1 and w[0] owns the bytes (free it after the others). Values
     * unchanged. 1 when joined, 0 when not (nothing changed). CUDA: q|k|v of the llama family under
     * TERN_CUDA_QKV_ONE (norm_qkv_rope_kv for many rows as one GEMM). */
    int (*join_weights)(tern_backend *be, tern_tensor *const *w, int k);
    /* The attention and the output projection (appended; optional): attention(att, q, rows, nh, kv, scale, softcap),
     * then y[rows->n, wo.out] += wo·att (add = 1: matmul_add's contract) or = wo·att (add = 0: matmul's), where the
     * backend may hand the attention's output to the projection in its own format and leave att unwritten (scratch).
     * 0 = not done, nothing written (src/model/internal.h tern__attention_o runs the two ops). CUDA: many rows in the
     * plain bf16 mode, the batch decode attention writing the GEMM's bf16 input (one f32 write and one conversion
     * launch fewer). */
    int (*attention_o)(tern_backend *be, float *y, float *att, const float *q, const tern_rows *rows, int nh,
                       const tern_kv_layer *kv, float scale, float softcap, const tern_tensor *wo, int add);
    /* norm_qkv_rope_kv then attention_o with add = 1, as one op (appended; optional): the KV cache is written as
     * rope_kv_write writes it and y += wo·attention(q), while q, k, v and att are scratch the backend may leave
     * unwritten (the attention may rope q and k itself). 0 = not done, nothing written (src/model/internal.h
     * tern__norm_qkv_attention_o runs the two ops). CUDA: many rows in the plain bf16 mode over joined q|k|v, where
     * the batch decode attention on tensor cores ropes q and k and writes the cache itself (rows of distinct
     * sequences): one launch fewer a layer, the same bits in the op tests (TERN_CUDA_QKV_ATT, default on: docs/CUDA.md). */
    int (*norm_qkv_attention_o)(tern_backend *be, float *xn, const float *x, const float *nw, float eps, float *q,
                                float *k, float *v, const tern_tensor *const *w, const tern_kv_layer *kv,
                                const tern_rows *rows, int nh, const float *inv_freq, float mscale, float *y,
                                float *att, float scale, float softcap, const tern_tensor *wo);
    /* A gated projection after the residual add (appended; optional): x' = x, or with res the post-norm residual add
     * x' = (x + rmsnorm(res->h)·res->w)·(res->s ? res->s[0] : 1) (its rmsnorm at eps) written to res->x_out (x left as
     * is), then y[n, w.out] = act(x'·wᵀ) ⊙ v (v [n, w.out]; act TERN_ACT_SILU / TERN_ACT_GELU_TANH): bitwise
     * rmsnorm_add + matmul + gelu_tanh_mul / silu_mul. 0 = not done, nothing written (src/model/internal.h
     * tern__pending_matmul_act_mul runs those ops). Gemma 4's per-layer input gate; CUDA: one row, BF16 / F16. */
    int (*matmul_act_mul)(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int act,
                          const float *v, const tern_norm_res *res, float eps);
    /* A MoE block's head (appended; optional): rmsnorm_n(3, y, x, rows n each, d, w, eps) bitwise, then
     * logits[n, E] = y[1]·routerᵀ in f32 (x not rounded: the router is precise; within f32 rounding of matmul, another
     * summation order) and route_topk(idx, wts, logits, n, E, k, mode, per_expert_scale) over those logits. 0 = not
     * done, nothing written (src/model/internal.h tern__norm_route_topk runs the three ops). Gemma 4's MoE layers;
     * CUDA: one row, one launch. */
    int (*norm_route_topk)(tern_backend *be, int n, int d, float *const *y, const float *const *x,
                           const float *const *w, float eps, const tern_tensor *router, float *logits, int32_t *idx,
                           float *wts, int E, int k, int mode, const float *per_expert_scale);
    /* Two post-norm residual adds (appended; optional): h = h + rmsnorm(h2)·w2, then x = (x + rmsnorm(h)·w)·(s ? s[0] :
     * 1), for rows r < rows of d (w, w2 may be NULL): bitwise rmsnorm_add(h, h2, w2, NULL) then rmsnorm_add(x, h, w, s).
     * h holds h' afterwards, h2 is scratch. 0 = not done (src/model/internal.h tern__pending_add runs the two). Gemma 4's
     * MoE layers: the experts' post-norm add onto the dense branch, then the layer's last one, where no pre-norm op
     * folds them (tern_norm_res h2) — Q4 decode, prefill. */
    int (*rmsnorm_add2)(tern_backend *be, float *x, float *h, const float *h2, int rows, int d, const float *w,
                        const float *w2, float eps, const float *s);
    /* Gemma 4's attention input (appended; optional): norm_matmul(xn, x, nw, eps, rows->n, 3, {q, k, v}, w, -1, res)
     * (res: the pending post-norm add, x' to res->x_out, as there), then norm_rope_kv_write(kv, rows, q, k, v, nh,
     * inv_freq, mscale, qw, kw, eps): q, k, v and the cache as those ops leave them, within the bf16 mode's bound (not
     * bitwise: the backend may run the three projections as one GEMM). 0 = not done, x and the cache untouched
     * (src/model/gemma4.c runs the two ops). w[2] NULL (attention_k_eq_v): q|k only and v = the raw k projection (y[2]
     * gets it, then its norm, as gemma4.c's copy does). CUDA: decode steps of many rows in the bf16 mode over joined
     * weights. */
    int (*norm_qkv_norm_rope_kv)(tern_backend *be, float *xn, const float *x, const float *nw, float eps,
                                 float *const *y, const tern_tensor *const *w, const tern_kv_layer *kv,
                                 const tern_rows *rows, int nh, const float *inv_freq, float mscale, const float *qw,
                                 const float *kw, const tern_norm_res *res);
    /* Gemma 4's per-layer input block for many rows (appended; optional): x' = x, or with res the post-norm residual
     * add x' = (x + rmsnorm(res->h)·res->w)·s written to res->x_out (x left as is), then pg = act(x'·wgᵀ) ⊙ v (row r of v
     * at v + r·ldv: a column slice of the per-layer inputs) and y = pg·wpᵀ ([n, wp.out]); pg [n, wg.out] is scratch
     * the backend may leave unwritten. Bitwise what src/model/internal.h tern__pending_ple runs otherwise
     * (rmsnorm_add, copy_cols, matmul, gelu_tanh_mul / silu_mul, matmul). 0 = not done, nothing written but res->x_out.
     * CUDA: 9..128 rows in the plain bf16 mode (TERN_CUDA_PLE_N; its opt-in =2 runs kernels of its own with other
     * sums: the bf16 bound instead of these bits). */
    int (*ple_block)(tern_backend *be, float *y, float *pg, const float *x, int n, const tern_tensor *wg,
                     const tern_tensor *wp, int act, const float *v, long ldv, const tern_norm_res *res, float eps);
} tern_backend_vt;

/* ---- GLM-5 ops (appended; src/backend/cpu/cpu_glm.c is the scalar spec) ----
 * Backends without them leave the entries NULL; glm5.c then refuses to load (TERN_EUNSUPPORTED). */
typedef struct tern_route_group {
    int n_group, topk_group;   /* E/n_group contiguous experts per group; keep the best topk_group */
    int norm;                  /* renormalise the chosen weights: w / (Σw + 1e-20) */
    float scaling;             /* routed_scaling_factor, applied last */
    const float *bias;         /* device f32 [E]: e_score_correction_bias (choice only) or NULL */
} tern_route_group;

typedef struct tern_glm_ops {
    /* Strided block copy: dst[r*ldd + j] = src[r*lds + j] for r < n, j < w (gather/scatter
     * of column blocks; pointers already offset). */
    void (*copy_2d)(tern_backend *be, float *dst, int ldd, const float *src, int lds, int n, int w);
    /* LayerNorm with bias over rows of d: y = (x-μ)/sqrt(var+eps)·w + b (biased variance). y may alias x. */
    void (*layernorm)(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, const float *b,
                      float eps);
    /* Interleaved RoPE in place on a slice of every head: for row r, head h < nh (head stride
     * hs floats, row stride nh*hs), i < d/2: the pair (x[off+2i], x[off+2i+1]) is rotated by
     * θ = pos[r]·inv_freq[i], then both scaled by mscale. Pairs stay adjacent; transformers
     * writes the rotated evens then odds, a permutation that q and k share, so dot products
     * are identical (reference/glm5.md §3.3). */
    void (*rope_interleaved)(tern_backend *be, float *x, int n, int nh, int hs, int off, int d, const int32_t *pos,
                             const float *inv_freq, float mscale);
    /* Latent cache write: k [n, kv->head_dim] and (kv->v_dim > 0) v [n, kv->v_dim] of each row at
     * (slot, pos). v may be NULL only when kv->v_dim == 0. */
    void (*kv_write_latent)(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                            const float *v);
    /* DSA lightning indexer + top-k. For row r with keys b = 0..pos[r] of its slot (kI_b = the
     * v record of b):  I[b] = Σ_j w[r][j] · relu(scale · q[r][j]·kI_b),  j < nh, q [n, nh, v_dim].
     * When pos[r] + 1 > k: sel[r][0..k) = the k positions with the largest I (ties: lower
     * position first), sorted ascending; otherwise sel[r] = 0..pos[r] then -1 padding.
     * min_gap (NULL or host) receives the smallest I[k-th] - I[(k+1)-th] seen (diagnostics). */
    void (*dsa_topk)(tern_backend *be, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                     const tern_kv_layer *kv, float scale, int k, float *min_gap);
    /* Attention over a latent view (absorbed MLA): keys of the row's slot with position <= pos
     * (and, when sel != NULL, listed in sel[r][0..k_sel), entries < 0 ignored); for head h:
     * s_b = scale · q[r][h]·K_b over the whole record (head_dim floats), p = softmax(s),
     * out[r][h][0..dv) = Σ_b p_b · K_b[0..dv). q [n, nh, head_dim], out [n, nh, dv]. */
    void (*attention_latent)(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                             const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel);
    /* Sigmoid routing with correction bias and group limits (DeepSeek-V3 / GLM-5 noaux_tc):
     * σ = sigmoid(logits); χ = σ + bias; group score = sum of the top-2 χ of its experts; keep
     * the topk_group best groups (ties: lower group); the k best χ among kept experts (ties:
     * lower expert) -> idx; wts = σ[idx] (normalised if norm) · scaling. */
    void (*route_group)(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                        const tern_route_group *p);
    /* (appended; NULL = the model loops matmul_expert over heads) One matmul per head of a 3-D
     * stack W [nh, out, in] in one call: for r < n, h < nh, o < out
     *   y[r*ldy + h*hy + o] = Σ_i W[h][o][i] · x[r*ldx + h*hx + i]
     * with the arithmetic contract of matmul_expert (f32 mode: exact f32 products and sums). */
    void (*matmul_heads)(tern_backend *be, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                         const tern_tensor *w);
} tern_glm_ops;

enum { TERN_ROUTE_SOFTMAX_TOPK = 0 };
enum { TERN_ACT_GELU_TANH = 0, TERN_ACT_SILU = 1 };

/* INT8 (CPU): f32 like TERN_COMPUTE_F32 except that Q8/Q4 matmuls quantize x per weight
 * group to int8 (VNNI dot products; bound in src/backend/cpu/gemv_avx512.c). CUDA: the BF16 mode
 * (be->compute reports BF16) whose Q4 one-row GEMVs quantize x the same way (gemv_mma.cu XI8).
 * BF16 (CUDA): the matmuls' tensor-core GEMMs take x rounded to bf16, like every engine's bf16
 * mode (weights flagged tern_tensor.precise excepted); residual stream, norms, softmax in f32.
 * BF16 (CPU with AVX512-BF16): the same for BF16 weights in the prefill GEMM (n > 8 rows; gemm_avx512.c,
 * vdpbf16ps); one-row GEMVs, other formats and precise weights keep f32 x.
 * BF16X2 (CUDA, `--compute bf16x2`): x enters those GEMMs as a pair of bf16 (x = hi + lo), so the
 * products stay f32-accurate (2-3x the tensor-core work; batch-invariant to ~1e-6). A backend
 * opened with BF16X2 reports be->compute == BF16 (the model code sees one bf16 mode); the CPU
 * backend runs both as BF16. Bounds per mode: tests/unit/test_parity.c. */
typedef enum { TERN_COMPUTE_F32 = 0, TERN_COMPUTE_BF16 = 1, TERN_COMPUTE_INT8 = 2, TERN_COMPUTE_BF16X2 = 3 } tern_compute;

struct tern_backend {
    const tern_backend_vt *vt;
    int device;               /* -1 CPU, >=0 GPU index */
    tern_compute compute;
    void *impl;
    size_t mem_bytes;         /* (appended) the GPU's memory; 0 on the CPU */
};

/* Backend constructors. */
typedef struct tern_backend_opts {
    int n_threads;            /* CPU: 0 = all cores */
    int device;               /* GPU index */
    tern_compute compute;
} tern_backend_opts;

/* Sum y over the ranks of be's tensor-parallel group (no-op without one; see allreduce_sum). */
static inline void tern_allreduce_sum(tern_backend *be, float *y, size_t count) {
    if (be->vt->allreduce_sum) be->vt->allreduce_sum(be, y, count);
}

/* x += the sum of y over the ranks of be's group (x += y alone without one); y is scratch. */
static inline void tern_allreduce_add(tern_backend *be, float *x, float *y, size_t count) {
    if (be->vt->allreduce_add) { be->vt->allreduce_add(be, x, y, count); return; }
    tern_allreduce_sum(be, y, count);
    be->vt->add(be, x, x, y, count);
}

tern_status tern_backend_cpu_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err);
/* Returns TERN_EUNSUPPORTED with a message when built without CUDA or no GPU is present. */
tern_status tern_backend_cuda_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err);
/* Device memory one CUDA backend holds besides weights, KV pages and the model's scratch once a model of
 * `rows` rows a forward (max_batch) is open: the prefill GEMM scratch (256 MB a 2048 rows, at least 256 MB;
 * TERN_CUDA_SCRATCH_MB sets it), cuBLASLt's workspace and the split-K partials (the CUDA context: the next
 * function). 0 in a build without CUDA. For `tern fit` and the engine's memory budget. */
size_t tern_backend_cuda_fixed_bytes(int rows);
/* Device memory a CUDA backend's context costs besides its buffers (the CUDA context, cuBLAS / cuBLASLt handles and the
 * kernels a run loads), measured on an H200 with CUDA 13 (bench/NOTES.md (am)); 0 in a build without CUDA. Counted by
 * `tern fit` and the engine's memory budget on a GPU. */
size_t tern_backend_cuda_context_bytes(void);
/* Memory of GPU `device` in bytes; 0 without CUDA in the build or without that GPU (cheap: no context kept). */
size_t tern_backend_cuda_device_bytes(int device);
void tern_backend_close(tern_backend *be); /* accepts NULL */

#endif
