/*
 * sample_math.h — the arithmetic of a draw, shared word for word by the CPU sampler
 * (sample_ref.c) and the CUDA kernel (src/backend/cuda/sample.cu), so that both give the same
 * token for the same (logits, parameters, seed, step).
 *
 * Why it is exact on both sides: every value that decides a token is built from IEEE basic
 * operations (+ - * / on float and double, floor, integer ops), which are correctly rounded on
 * x86-64 and on the GPU alike. What is not: libm exp/log (different ulp errors) and fused
 * multiply-add (the GPU compiler fuses a*b+c unless told not to). So
 *   - weights use our own exp (sample_exp: Cody-Waite range reduction + a degree-13 Taylor
 *     polynomial, each step a separate rounded op; __dmul_rn/__dadd_rn on the device);
 *   - a weight is a 42-bit fixed-point integer W(x) = floor(exp(x) * 2^42), 0 below x = -30;
 *     sums of weights are uint64 (associative: any reduction order gives the same total);
 *   - the draw is integer too: target = floor(u53 * total / 2^53) with u53 the 53-bit output
 *     of the counter-based RNG; the token is the survivor (in id order) whose cumulative
 *     interval [cum_before, cum_before + w) holds target.
 * logf(min_p) and 1/temperature are computed once on the host and handed to both sides.
 * Host code must be compiled without FP contraction (GCC: -std=c11 implies
 * -ffp-contract=off; the x86-64 baseline has no FMA anyway).
 */
#ifndef TERN_SAMPLE_MATH_H
#define TERN_SAMPLE_MATH_H

#include <stdint.h>

#if defined(__CUDACC__)
#define TERN_SM_FN static __host__ __device__ __forceinline__
#else
#define TERN_SM_FN static inline
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
#endif

#if defined(__CUDA_ARCH__)
#define TSM_DADD(a, b) __dadd_rn((a), (b))
#define TSM_DSUB(a, b) __dsub_rn((a), (b))
#define TSM_DMUL(a, b) __dmul_rn((a), (b))
#define TSM_FADD(a, b) __fadd_rn((a), (b))
#define TSM_FSUB(a, b) __fsub_rn((a), (b))
#define TSM_FMUL(a, b) __fmul_rn((a), (b))
#define TSM_FDIV(a, b) __fdiv_rn((a), (b))
#else
#define TSM_DADD(a, b) ((a) + (b))
#define TSM_DSUB(a, b) ((a) - (b))
#define TSM_DMUL(a, b) ((a) * (b))
#define TSM_FADD(a, b) ((a) + (b))
#define TSM_FSUB(a, b) ((a) - (b))
#define TSM_FMUL(a, b) ((a) * (b))
#define TSM_FDIV(a, b) ((a) / (b))
#endif

#define TERN_SAMPLE_WBITS 42           /* fixed-point bits of a weight: W(0) = 2^42 */
#define TERN_SAMPLE_XMIN (-30.0)       /* W(x) = 0 below (e^-30 < 2^-42 anyway) */
#define TERN_SAMPLE_MAX_VOCAB (1 << 21) /* 2^21 * 2^42 < 2^63: sums never overflow */

/* floor(x) for |x| < 2^52 using only exact operations (no libm on either side) */
TERN_SM_FN double tsm_floor(double x) {
    double t = (double)(int64_t)x; /* truncation toward zero: exact */
    return t > x ? t - 1.0 : t;
}

/* e^x for x in [-31, 0]: result in (0, 1]; e^0 = 1 exactly. */
TERN_SM_FN double tern_sample_exp(double x) {
    const double log2e = 1.4426950408889634074;
    const double ln2_hi = 6.93147180369123816490e-01; /* high bits of ln 2: k * ln2_hi is exact */
    const double ln2_lo = 1.90821492927058770002e-10;
    double k = tsm_floor(TSM_DADD(TSM_DMUL(x, log2e), 0.5));
    double r = TSM_DSUB(TSM_DSUB(x, TSM_DMUL(k, ln2_hi)), TSM_DMUL(k, ln2_lo)); /* |r| <= ~0.35 */
    /* Taylor polynomial to degree 13, Horner with a rounding after every op */
#define TSM_H(c) p = TSM_DADD(TSM_DMUL(p, r), (c))
    double p = 1.0 / 6227020800.0;
    TSM_H(1.0 / 479001600.0); TSM_H(1.0 / 39916800.0); TSM_H(1.0 / 3628800.0); TSM_H(1.0 / 362880.0);
    TSM_H(1.0 / 40320.0); TSM_H(1.0 / 5040.0); TSM_H(1.0 / 720.0); TSM_H(1.0 / 120.0); TSM_H(1.0 / 24.0);
    TSM_H(1.0 / 6.0); TSM_H(0.5); TSM_H(1.0); TSM_H(1.0);
#undef TSM_H
    /* times 2^k, k in [-45, 0]: build the power of two from its bits (exact) */
    int64_t bits = (int64_t)(1023 + (int)k) << 52;
    double two_k;
#if defined(__CUDA_ARCH__)
    two_k = __longlong_as_double(bits);
#else
    union { int64_t i; double d; } u;
    u.i = bits;
    two_k = u.d;
#endif
    return TSM_DMUL(p, two_k);
}

/* W(x) = floor(e^x * 2^42) for x <= 0 (0 below TERN_SAMPLE_XMIN or for NaN) */
TERN_SM_FN uint64_t tern_sample_weight(double x) {
    if (!(x >= TERN_SAMPLE_XMIN)) return 0;
    if (x > 0) x = 0;
    return (uint64_t)TSM_DMUL(tern_sample_exp(x), 4398046511104.0 /* 2^42 */);
}

/* x of a logit: (l - mx) in double (then * inv_t for the draw temperature) */
TERN_SM_FN double tern_sample_x(float l, float mx) { return TSM_DSUB((double)l, (double)mx); }

/* The RNG: splitmix64 finalizer over (seed, step); 53 random bits. */
TERN_SM_FN uint64_t tern_sample_u53(uint64_t seed, uint64_t step) {
    uint64_t z = seed ^ ((step + 1) * 0x9E3779B97F4A7C15ULL);
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z >> 11;
}

/* floor(u53 * total / 2^53) < total (total < 2^63) */
TERN_SM_FN uint64_t tern_sample_target(uint64_t u53, uint64_t total) {
#if defined(__CUDA_ARCH__)
    uint64_t hi = __umul64hi(u53, total), lo = u53 * total;
    return (hi << 11) | (lo >> 53);
#else
    return (uint64_t)(((unsigned __int128)u53 * total) >> 53);
#endif
}

/* top-p threshold on the temperature-1 weights: (uint64)(top_p * total), both in double */
TERN_SM_FN uint64_t tern_sample_top_p_thr(float top_p, uint64_t total) {
    return (uint64_t)TSM_DMUL((double)top_p, (double)total);
}

/* Penalties of one distinct history token seen `count` times (HF / llama.cpp rule). */
TERN_SM_FN float tern_sample_penalize(float l, float rep, float presence, float frequency, float count) {
    if (rep != 1.0f) l = l > 0 ? TSM_FDIV(l, rep) : TSM_FMUL(l, rep);
    return TSM_FSUB(l, TSM_FADD(presence, TSM_FMUL(frequency, count)));
}

/* Order of candidates: logit descending, then id ascending. True when (la, ia) comes first. */
TERN_SM_FN int tern_sample_before(float la, int32_t ia, float lb, int32_t ib) {
    return la > lb || (la == lb && ia < ib);
}

#endif
