/*
 * kern.h — the per-ISA kernel table of the fast CPU backend (internal to src/backend/cpu).
 *
 * Every weight format has a decoder that turns a slice of one weight row into f32 exactly
 * as the reference decoder does (MLX affine: s·q + b, rounded the same way); everything
 * after decoding is f32 arithmetic in small register-blocked microkernels. Batch-1 GEMV of
 * the common formats (BF16, Q8, Q4) skips the decode through fused kernels (gemv_*.c) that
 * stay exact f32 arithmetic on unrounded x (Q: s·Σq·x + b·Σx, a reordering); their
 * int8-activation variant (the int8 compute mode, with the prefill GEMM of gemm_i8_avx512.c)
 * is opt-in and has its own error bound. Three tables exist — portable C, AVX2+FMA+F16C, AVX-512
 * (F/BW/VL/VBMI) — and cpu_kern_pick() chooses one from cpuid (capped by TERN_CPU_ISA).
 */
#ifndef TERN_CPU_KERN_H
#define TERN_CPU_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "ops/tensor.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* An on/off switch of the CPU backend read from the environment once (*cache < 0: unread; the tests' *_set
 * functions store 0 / 1, or -1 to read it again): on by default unless `name` is "0", or (dflt 0) off unless its
 * value starts with '1'. */
static inline int tern__cpu_switch(_Atomic int *cache, const char *name, int dflt) {
    int v = *cache;
    if (v < 0) {
        const char *e = getenv(name);
        v = dflt ? !(e && !strcmp(e, "0")) : e && e[0] == '1';
        *cache = v;
    }
    return v;
}

/* Most groups a decode slice can span (slices are <= 512 inputs, groups >= 32). */
#define CPU_MAX_GROUPS 64

/* One weight row, located. For TERN_DT_Q, scales/biases point at the row's first group. For
 * block-scaled FP8 (dtype F8_E4M3, scales != NULL): scales points at the row block's F32 scale
 * row, gs = columns per block, biases NULL; W[j] = e4m3(data[j]) · scales[j/gs]. */
typedef struct cpu_wrow {
    const uint8_t *data;
    const uint8_t *scales, *biases;
    tern_dtype dtype, sdtype;
    int bits, gs;
} cpu_wrow;

/* x prepared once per call for the fused GEMV (kept in a per-thread buffer). */
#define CPU_GX_MAX_IN 32768 /* longest row the fused GEMV takes; longer rows use decode + dot */
/* What gemv_prep writes for a row of `in` inputs, over whole 128-input chunks r: x reordered (4r), Σx per group (r/8),
 * the int8 kinds' d and rq (r), int8 x (r), plus 256 bytes; 64-byte rounded. */
#define CPU_GX_BYTES(in) (((size_t)((in) + 127) / 128 * 128 * 49 / 8 + 256 + 63) / 64 * 64)
#define CPU_GX_BUF CPU_GX_BYTES(CPU_GX_MAX_IN) /* one buffer for any row */
enum { CPU_GX_BF16 = 1, CPU_GX_Q8, CPU_GX_Q4, CPU_GX_Q8_I8, CPU_GX_Q4_I8, CPU_GX_BF16R };
/* gemv_prep's mode bits: the int8 mode (Q rows take x quantized per group, VNNI), the bf16 mode (BF16 rows take x
 * rounded to bf16, vdpbf16ps: CPU_GX_BF16R; the caller sets it only for BF16 weights not marked precise). */
enum { CPU_GX_INT8 = 1, CPU_GX_XBF16 = 2 };
typedef struct cpu_gx {
    int kind, in, gs;
    const float *xp;    /* x in the kernel's order (exact kinds) */
    const float *gsum;  /* [in/gs] Σ x over each weight group, f32 (Q kinds) */
    const int8_t *xq;   /* int8 kinds: x quantized per 32 inputs, in the kernel's order */
    const float *xd;    /* int8 kinds: [in/gs] x scale d_g of each weight group */
    const float *rq;    /* int8 kinds: [in/gs] C·Σ_g (x − d_g·xq), the centring correction */
    const uint16_t *xb; /* CPU_GX_BF16R: x rounded to bf16 (nearest even), natural order */
    /* Software prefetch, set by the driver after gemv_prep (prep sets the defaults): while a
     * pass reads byte b of row r it prefetches byte b + pf_data of the weight data (the same
     * offset in a row a few passes ahead, rows being contiguous), and once per pass the
     * scales/biases at + pf_sb (0: none). Only the access order changes, never the sums. */
    ptrdiff_t pf_data, pf_sb;
    unsigned long long gen; /* int8 kinds: gemv_prep's serial number for this x (never 0), so a kernel may cache what it
                             * derives from a set of x (gemv_nx_avx512.c); 0: not set */
} cpu_gx;

typedef struct tern_cpu_kern {
    const char *name;
    /* dst[0..len) = W[row][j0 .. j0+len) as f32. For Q, j0 and len are multiples of gs and
     * len <= CPU_MAX_GROUPS * gs; otherwise any j0/len. Reads only bytes that belong to the slice. */
    void (*decode)(const cpu_wrow *w, int j0, int len, float *dst);
    /* acc[i][j] = Σ_t w[i][t] · x[j][t] for i < nw, j < nx (1..4 each), t < len. */
    void (*mk)(const float *const *w, int nw, const float *const *x, int nx, int len, float acc[4][4]);
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);       /* y += a·x */
    void (*scal)(float *y, float a, int n);                        /* y *= a */
    double (*readsum)(const float *p, size_t n);                   /* bandwidth probe body */
    /* Greedy pick over x[0, n): the index of the largest value (the lowest index on ties; -inf entries never
     * count), or -1 when every entry is -inf, -2 / -3 when the first NaN / +inf entry comes before any other of
     * either: the same answer as the sampler's first pass (src/sample/sample_ref.c tern__sample_draw) at
     * temperature 0 (the codes are TERN_SAMPLE_ERR_MASKED / _NAN / _INF). */
    int32_t (*argmax)(const float *x, int n);
    /* Optional (NULL if absent) fused GEMV for 4-bit MLX rows: returns Σ_j W[j]·x[j] over the
     * whole row (in inputs, multiple of 32) with x given in q4 order (cpu_q4_permute). */
    float (*gemv_q4)(const cpu_wrow *w, int in, const float *xq4);
    /* Optional fused batch-1 GEMV (cpu_gemv_*.c). gemv_prep looks at one row of the weight
     * and, when it has a fused kernel for that format and `in`, lays x out in the kernel's
     * order in `buf` (CPU_GX_BUF bytes, 64-byte aligned) and returns 1; else 0. gemv then
     * writes y[i] = Σ_j W_i[j]·x[j] for nr (1..gemv_nr, or 1..4 when gemv_nr is 0) rows that
     * share the prepared x; a row's result does not depend on nr or on the other rows. */
    int (*gemv_prep)(const cpu_wrow *w, int in, int mode, const float *x, void *buf, cpu_gx *gx); /* mode: CPU_GX_INT8 | CPU_GX_XBF16 */
    void (*gemv)(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y);
    int gemv_nr;
    /* Rows per gemv call in the decode driver (cpu_decode.c), per cpu_gx kind; 0 = 4. One row
     * per call makes each thread's read of its slice one sequential stream (plus the scales and
     * biases of Q rows) instead of 4 streams a row apart. */
    unsigned char gemv_pass[CPU_GX_BF16R + 1];
    /* Optional blocked GEMM for batched matmuls (gemm_*.c; driver in cpu_matmul.c).
     * gemm_pack: a strip of nrows (<= gemm_nr) weight rows, inputs [t0, t0+len), to f32 packed
     * input-major, wp[t·gemm_nr + i] (64-byte aligned; features i >= nrows are 0). BF16/F32 rows
     * are converted in registers; other formats go through `decode` into tmp (gemm_nr rows of
     * ld floats) first. gemm_pack_x: mr activation rows xr[r][0..len) to xp[t·mr + r].
     * gemm_mk: for mr (1..gemm_mr) packed activation rows and the first ns (1..gemm_nr)
     * features of a strip, acc[r][i] = Σ_t xp[t·mr + r]·wp[t·gemm_nr + i] (one sequential f32
     * FMA chain per element), then yp[r][i] = acc (add 0), yp[r][i] += acc (add 1, ys NULL) or
     * yp[r][i] += ys[r]·acc (add 1). Meanwhile it prefetches the npf (<= len/8) cache lines
     * pf[] into L2, one per 8 inputs (the driver's next strip). */
    int gemm_nr, gemm_mr;
    void (*gemm_pack)(const cpu_wrow *rows, int nrows, int t0, int len, float *tmp, int ld, float *wp,
                      void (*decode)(const cpu_wrow *w, int j0, int len, float *dst));
    void (*gemm_pack_x)(const float *const *xr, int mr, int len, float *xp);
    void (*gemm_mk)(int len, const float *xp, int mr, const float *wp, float *const *yp, const float *ys, int add,
                    int ns, const uint8_t *const *pf, int npf);
    /* (appended) the same three for the bf16 compute mode over BF16 weights (AVX512-BF16; NULL elsewhere):
     * inputs in pairs, len even; wp holds bf16 pairs wp[p·2·gemm_nr + 2i + j] = w[i][t0 + 2p + j], xp dwords
     * xp[p·mr + r] = (bf16(x[r][2p]), bf16(x[r][2p+1])) (round to nearest even); acc = Σ_p of vdpbf16ps (exact
     * products, f32 sums; denormals flushed). Taken only where the CPU has AVX512-BF16 (cpu_impl.bf16). */
    void (*gemm_bf16_pack)(const cpu_wrow *rows, int nrows, int t0, int len, float *tmp, int ld, float *wp,
                           void (*decode)(const cpu_wrow *w, int j0, int len, float *dst));
    void (*gemm_bf16_pack_x)(const float *const *xr, int mr, int len, float *xp);
    void (*gemm_bf16_mk)(int len, const float *xp, int mr, const float *wp, float *const *yp, const float *ys, int add,
                         int ns, const uint8_t *const *pf, int npf);
    /* (appended) elementwise activations, in every table: y = cap·tanh(y / cap); y = gelu_tanh(g)·u (u NULL:
     * gelu_tanh(g)); y = silu(g)·u. Scalar and AVX2: libm's formulas (tern__cpu_*_scalar); AVX-512: vector versions
     * within a few f32 ulp of them (kern_avx512.c vtanh, vexp). The fused ops (cpu_decode.c matmul_glu, the MoE) call
     * the same kernels as the ops, so they stay bitwise the ops. */
    void (*softcap)(float *y, int64_t n, float cap);
    void (*gelu_mul)(float *y, const float *g, const float *u, int64_t n);
    void (*silu_mul)(float *y, const float *g, const float *u, int64_t n); /* y = silu(g)·u (u NULL: silu(g)); vector exp */
    /* (appended, optional) gemv for nx (>= 1) prepared x of the same kind on the same nr rows: y[j·ys + i] is
     * bitwise gemv(&gx[j], rows, nr)[i]; each weight row is loaded and unpacked once for all x (gemv_nx_avx512.c).
     * Returns 0, having written nothing, for a kind it does not take (the caller then runs gemv per x). */
    int (*gemv_nx)(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys);
    /* (appended, optional) rows per gemv_nx call the decode driver passes for several x, per cpu_gx kind (0: as for one
     * x, gemv_pass; at most 16): the x-in-lanes Q4_I8 kernel reuses each group's x vectors across the call's rows. */
    unsigned char gemv_nx_pass[CPU_GX_BF16R + 1];
    /* RMSNorm's scaling: y[j] = x[j]·s·w[j] (w NULL: x[j]·s), each element rounded as that expression is in C (y may
     * be x). Every table has it. */
    void (*norm_apply)(float *y, const float *x, float s, const float *w, int n);
} tern_cpu_kern;

extern const tern_cpu_kern tern__cpu_kern_scalar;
extern const tern_cpu_kern tern__cpu_kern_avx2;
extern const tern_cpu_kern tern__cpu_kern_avx512;

const tern_cpu_kern *tern__cpu_kern_pick(void);

/* q4 order: within each block of 32 inputs, the 16 even inputs then the 16 odd ones (the
 * order in which 16 packed bytes unpack into low and high nibbles). */
static inline void cpu_q4_permute(const float *x, int in, float *xq) {
    for (int b = 0; b < in; b += 32)
        for (int i = 0; i < 16; i++) { xq[b + i] = x[b + 2 * i]; xq[b + 16 + i] = x[b + 2 * i + 1]; }
}

/* Fused GEMV prefetch distance in bytes (cpu_matmul.c; 0: fixed 1 KB; -1: TERN_CPU_PF or the
 * default). For A/B benchmarks (bench_kernels --pf); not thread-safe against running matmuls. */
void tern__cpu_gemv_pf_set(long bytes);

/* Fused GEMV entry points of the ISA files (gemv_avx512.c, gemv_avx2.c). */
int tern__cpu_gemv_prep_avx512(const cpu_wrow *w, int in, int mode, const float *x, void *buf, cpu_gx *gx);
void tern__cpu_gemv_avx512(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y);
int tern__cpu_gemv_nx_avx512(const cpu_gx *gx, int nx, const cpu_wrow *rows, int nr, float *y, size_t ys);
int tern__cpu_gemv_avx512_std(int kind); /* gemv runs kind's default kernel (not a TERN_CPU_Q4_SEQ / _BF16_X4 opt-out) */
void tern__cpu_bf16_x4_set(int on); /* A/B: 1 the former 4-row BF16 kernel, 0 the default, -1 TERN_CPU_BF16_X4 */
void tern__cpu_q4_seq_set(int on);  /* A/B: 1 one-row Q4_I8 (default, k_q4i8s), 0 the 4-row kernel, 2 k_q4i8r with the L2 prefetch, 3 k_q4i8r, -1 TERN_CPU_Q4_SEQ */
int tern__cpu_gemv_prep_avx2(const cpu_wrow *w, int in, int mode, const float *x, void *buf, cpu_gx *gx);
void tern__cpu_gemv_avx2(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y);

/* Blocked GEMM entry points of the ISA files (gemm_avx512.c: nr 32, mr 12; gemm_avx2.c: 16, 6). */
#define CPU_GEMM_DECL(isa)                                                                                       \
    void tern__cpu_gemm_pack_##isa(const cpu_wrow *rows, int nrows, int t0, int len, float *tmp, int ld, float *wp, \
                                   void (*decode)(const cpu_wrow *w, int j0, int len, float *dst));              \
    void tern__cpu_gemm_pack_x_##isa(const float *const *xr, int mr, int len, float *xp);                         \
    void tern__cpu_gemm_mk_##isa(int len, const float *xp, int mr, const float *wp, float *const *yp,             \
                                 const float *ys, int add, int ns, const uint8_t *const *pf, int npf);
CPU_GEMM_DECL(avx512)
CPU_GEMM_DECL(bf16_avx512) /* the bf16 compute mode's (AVX512-BF16): x rounded to bf16, BF16 weights, vdpbf16ps */
CPU_GEMM_DECL(avx2)

#ifdef __AVX512F__
#include <immintrin.h>

/* The GEMM microkernels' epilogue (gemm_avx512.c, gemm_i8_avx512.c): a 32-feature strip row
 * r (v0: features 0-15, v1: 16-31) goes to y[0, ns) (masks from cpu_strip_masks); with add
 * the result is added to y, scaled first by ys[r] when ys != NULL (MoE routing weights). */
static inline __attribute__((always_inline)) void cpu_strip_masks(int ns, __mmask16 *m0, __mmask16 *m1) {
    *m0 = ns >= 16 ? 0xFFFF : (__mmask16)((1u << ns) - 1);
    *m1 = ns >= 32 ? 0xFFFF : ns > 16 ? (__mmask16)((1u << (ns - 16)) - 1) : 0;
}

static inline __attribute__((always_inline)) void cpu_strip_store(float *y, __m512 v0, __m512 v1, const float *ys,
                                                                  int r, int add, __mmask16 m0, __mmask16 m1) {
    if (add) {
        if (ys) {
            __m512 sv = _mm512_set1_ps(ys[r]);
            v0 = _mm512_mul_ps(sv, v0);
            v1 = _mm512_mul_ps(sv, v1);
        }
        v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), v0);
        v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), v1);
    }
    _mm512_mask_storeu_ps(y, m0, v0);
    _mm512_mask_storeu_ps(y + 16, m1, v1);
}
#endif

/* Portable helpers shared by the ISA files (kern_scalar.c). */
void tern__cpu_softcap_scalar(float *y, int64_t n, float cap);
void tern__cpu_gelu_mul_scalar(float *y, const float *g, const float *u, int64_t n);
void tern__cpu_silu_mul_scalar(float *y, const float *g, const float *u, int64_t n);
void tern__cpu_decode_scalar(const cpu_wrow *w, int j0, int len, float *dst);
float tern__cpu_sload(const uint8_t *p, tern_dtype t, int i); /* scale/bias element i */

#endif
