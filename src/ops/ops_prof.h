/*
 * ops_prof.h — what the two per-op profilers (src/backend/cpu/cpu_prof.c, TERN_CPU_PROFILE; src/backend/cuda/prof.c,
 * TERN_CUDA_PROFILE) share: the ops of ops.h they wrap the same way as X-macro lists (plain: void, no weight to
 * name, X(name, (parameters), (arguments)); weight and fused ops: with a label), and the name a matmul's row takes
 * in their tables ("matmul n=1 4096x4096 BF16",
 * "... q4/g64"). Each profiler defines its own wrapper body (CPU: the monotonic clock on the calling thread; CUDA:
 * events around the op).
 */
#ifndef TERN_OPS_PROF_H
#define TERN_OPS_PROF_H

#include "ops/ops.h"

#include <stdio.h>

#define TERN_PROF_PLAIN_OPS(X)                                                                                        \
    X(rmsnorm, (tern_backend * be, float *y, const float *x, int rows, int d, const float *w, float eps),             \
      (be, y, x, rows, d, w, eps))                                                                                     \
    X(rope, (tern_backend * be, float *x, int n, int nh, int d, const int32_t *pos, const float *f, float ms),        \
      (be, x, n, nh, d, pos, f, ms))                                                                                   \
    X(kv_write, (tern_backend * be, const tern_kv_layer *kv, const tern_rows *rows, const float *k, const float *v),  \
      (be, kv, rows, k, v))                                                                                            \
    X(attention,                                                                                                       \
      (tern_backend * be, float *out, const float *q, const tern_rows *rows, int nh, const tern_kv_layer *kv,          \
       float scale, float softcap),                                                                                    \
      (be, out, q, rows, nh, kv, scale, softcap))                                                                      \
    X(add, (tern_backend * be, float *y, const float *a, const float *b, size_t n), (be, y, a, b, n))                 \
    X(mul, (tern_backend * be, float *y, const float *a, const float *b, size_t n), (be, y, a, b, n))                 \
    X(scale, (tern_backend * be, float *y, const float *x, float s, size_t n), (be, y, x, s, n))                      \
    X(scale_dev, (tern_backend * be, float *y, const float *x, const float *s, size_t n), (be, y, x, s, n))           \
    X(gelu_tanh_mul, (tern_backend * be, float *y, const float *g, const float *u, size_t n), (be, y, g, u, n))       \
    X(silu_mul, (tern_backend * be, float *y, const float *g, const float *u, size_t n), (be, y, g, u, n))            \
    X(softcap, (tern_backend * be, float *y, size_t n, float cap), (be, y, n, cap))                                   \
    X(add_bias, (tern_backend * be, float *y, const float *bias, int n, int d), (be, y, bias, n, d))                  \
    X(copy_cols, (tern_backend * be, float *dst, const float *src, int n, int w, int ss, int off),                    \
      (be, dst, src, n, w, ss, off))                                                                                   \
    X(route_topk,                                                                                                      \
      (tern_backend * be, int32_t *idx, float *wts, const float *lg, int n, int E, int k, int mode, const float *pes), \
      (be, idx, wts, lg, n, E, k, mode, pes))                                                                          \
    X(moe_mlp,                                                                                                         \
      (tern_backend * be, float *y, const float *x, int n, int H, const int32_t *idx, const float *wts, int k,         \
       const tern_tensor *g, const tern_tensor *u, const tern_tensor *d, int act, float *scr),                         \
      (be, y, x, n, H, idx, wts, k, g, u, d, act, scr))

/* The ops both profilers name the same way, X(name, (parameters), (arguments), label): the label is an expression
 * that may write the row's name into `nm` (char[64], the wrapper's) with tern__prof_wname. WEIGHT ops return
 * nothing; FUSED ops return 1 when they ran (the label) or 0 when they refused ("(name refused)"). */
#define TERN_PROF_WEIGHT_OPS(X)                                                                                       \
    X(matmul, (tern_backend * be, float *y, const float *x, int n, const tern_tensor *w), (be, y, x, n, w),           \
      tern__prof_wname(n == 1 ? "matmul n=1" : "matmul n>1", w, nm, sizeof nm))                                       \
    X(matmul_expert, (tern_backend * be, float *y, const float *x, int n, const tern_tensor *w, int e),               \
      (be, y, x, n, w, e), tern__prof_wname("matmul_expert", w, nm, sizeof nm))
#define TERN_PROF_FUSED_OPS(X)                                                                                        \
    X(matmul_glu,                                                                                                      \
      (tern_backend * be, float *y, const float *x, int n, const tern_tensor *g, const tern_tensor *u, int act),       \
      (be, y, x, n, g, u, act), tern__prof_wname("matmul_glu (gate)", g, nm, sizeof nm))                              \
    X(matmul_add, (tern_backend * be, float *y, const float *x, int n, const tern_tensor *w), (be, y, x, n, w),       \
      tern__prof_wname("matmul_add", w, nm, sizeof nm))                                                                \
    X(rope_kv_write,                                                                                                   \
      (tern_backend * be, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k, const float *v, int nh,  \
       const float *f, float ms),                                                                                      \
      (be, kv, rows, q, k, v, nh, f, ms), "rope_kv_write")                                                             \
    X(norm_qkv_rope_kv,                                                                                                \
      (tern_backend * be, float *xn, const float *x, const float *nw, float eps, float *q, float *k, float *v,         \
       const tern_tensor *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh, const float *inv_freq,     \
       float mscale),                                                                                                  \
      (be, xn, x, nw, eps, q, k, v, w, kv, rows, nh, inv_freq, mscale),                                                \
      tern__prof_wname("norm_qkv_rope_kv", w[0], nm, sizeof nm))                                                     \
    X(norm_mlp,                                                                                                        \
      (tern_backend * be, float *xn, const float *x, const float *nw, float eps, int n, float *y, int add,             \
       const tern_tensor *const *w, int act, const tern_norm_res *res),                                                \
      (be, xn, x, nw, eps, n, y, add, w, act, res), tern__prof_wname("norm_mlp (gate)", w[0], nm, sizeof nm))

/* The wrappers themselves: a profiler defines TERN_PROF_BEGIN (a statement that starts timing; `be` is in scope)
 * and TERN_PROF_END(label) (the statement that ends it under that row name), then expands the lists with
 * TERN_PROF_WRAP_WEIGHT / TERN_PROF_WRAP_FUSED (TERN_PROF_WRAP_PLAIN: the weight form named after the op). */
#define TERN_PROF_WRAP_WEIGHT(op, params, args, label)                                                              \
    static void p_##op params {                                                                                     \
        char nm[64];                                                                                                \
        (void)nm;                                                                                                   \
        TERN_PROF_BEGIN;                                                                                            \
        g_base->op args;                                                                                            \
        TERN_PROF_END(label);                                                                                       \
    }
#define TERN_PROF_WRAP_FUSED(op, params, args, label)                                                               \
    static int p_##op params {                                                                                      \
        char nm[64];                                                                                                \
        (void)nm;                                                                                                   \
        TERN_PROF_BEGIN;                                                                                            \
        int r = g_base->op args;                                                                                    \
        TERN_PROF_END(r ? label : "(" #op " refused)");                                                             \
        return r;                                                                                                   \
    }
#define TERN_PROF_WRAP_PLAIN(op, params, args) TERN_PROF_WRAP_WEIGHT(op, params, args, #op)

/* "op OUTxIN q4/g64" or "op OUTxIN BF16": a matmul's row in the profilers' tables */
static inline const char *tern__prof_wname(const char *op, const tern_tensor *w, char *buf, size_t n) {
    const int nd = w->ndim;
    const long out = nd >= 2 ? (long)w->shape[nd - 2] : 1, in = nd ? (long)w->shape[nd - 1] : 1;
    if (w->dtype == TERN_DT_Q) snprintf(buf, n, "%s %ldx%ld q%d/g%d", op, out, in, w->bits, w->group_size);
    else snprintf(buf, n, "%s %ldx%ld %s", op, out, in, tern_dtype_name(w->dtype));
    return buf;
}

#endif
