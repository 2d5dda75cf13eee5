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

/* ---- KV cache view (one per layer; allocation lives in src/runtime/kv.c) ----
 * Pools are laid out [n_blocks][block_size][n_head_kv][head_dim] in `dtype`.
 * Token at position p of slot s lives in block block_table[s*max_blocks + p/block_size],
 * offset p%block_size. A table entry < 0 means "not resident" (e.g. freed because it fell
 * out of a sliding window) and must never be read. */
typedef struct tern_kv_layer {
    tern_dtype dtype;          /* TERN_DT_F32 for now (F16/BF16/quantized kinds later) */
    int n_head_kv, head_dim;
    int block_size;
    int window;                /* 0: full attention; W > 0: key b visible to query a iff a-W < b <= a */
    void *k, *v;               /* device pools */
    const int32_t *block_table;/* device array [n_slots * max_blocks] */
    int max_blocks;
} tern_kv_layer;

typedef struct tern_rows {
    int n;
    const int32_t *pos;        /* [n] device array: absolute positions */
    const int32_t *slot;       /* [n] device array: KV slot (block-table row) */
    /* host copies of the same (backends may use them to plan work) */
    const int32_t *pos_host, *slot_host;
} tern_rows;

typedef struct tern_backend tern_backend;

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
     * positions allowed by the layer's window and causality (key pos <= row pos). GQA: head h
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
} tern_backend_vt;

enum { TERN_ROUTE_SOFTMAX_TOPK = 0 };
enum { TERN_ACT_GELU_TANH = 0, TERN_ACT_SILU = 1 };

typedef enum { TERN_COMPUTE_F32 = 0, TERN_COMPUTE_BF16 = 1 } tern_compute;

struct tern_backend {
    const tern_backend_vt *vt;
    int device;               /* -1 CPU, >=0 GPU index */
    tern_compute compute;
    void *impl;
};

/* Backend constructors. */
typedef struct tern_backend_opts {
    int n_threads;            /* CPU: 0 = all cores */
    int device;               /* GPU index */
    tern_compute compute;
} tern_backend_opts;

tern_status tern_backend_cpu_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err);
/* Returns TERN_EUNSUPPORTED with a message when built without CUDA or no GPU is present. */
tern_status tern_backend_cuda_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err);
void tern_backend_close(tern_backend *be); /* accepts NULL */

#endif
