/*
 * glm_avx512.c — AVX-512 inner products of the fast GLM-5 ops (cpu_glm.h tern_glm_kern).
 *
 * dots: up to 4×4 (query, key) pairs per call share their loads: per 16-float chunk, 4 + 4
 * loads feed 16 FMAs into 16 accumulators (24 of the 32 zmm registers). Every pair's sum is
 * the same sequence — one lane-wise FMA per chunk in t order (the tail chunk masked, zeros
 * add nothing), then _mm512_reduce_add_ps — whatever na/nb are, so a score does not depend
 * on which other heads or keys shared the call.
 * pv: per 16-float chunk of the output, the (up to 4) output rows stay in registers while the
 * value rows stream by: o += p_c·v_c in c order per element.
 * This file is compiled with AVX-512 flags (Makefile) and used only when cpuid says so.
 */
#include "backend/cpu/cpu_glm.h"

#include <immintrin.h>

static inline __mmask16 tail_mask(int rem) { return (__mmask16)((1u << rem) - 1u); }

static void dots_avx512(const float *const *a, int na, const float *const *b, int nb, int len, float *out, int ldo) {
    if (na == 4 && nb == 4) {
        __m512 acc[4][4];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
        int t = 0;
        for (; t + 16 <= len; t += 16) {
            __m512 va[4], vb[4];
            for (int i = 0; i < 4; i++) va[i] = _mm512_loadu_ps(a[i] + t);
            for (int j = 0; j < 4; j++) vb[j] = _mm512_loadu_ps(b[j] + t);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(va[i], vb[j], acc[i][j]);
        }
        if (t < len) {
            __mmask16 m = tail_mask(len - t);
            __m512 va[4], vb[4];
            for (int i = 0; i < 4; i++) va[i] = _mm512_maskz_loadu_ps(m, a[i] + t);
            for (int j = 0; j < 4; j++) vb[j] = _mm512_maskz_loadu_ps(m, b[j] + t);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(va[i], vb[j], acc[i][j]);
        }
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) out[i * ldo + j] = _mm512_reduce_add_ps(acc[i][j]);
        return;
    }
    /* edges: one query against up to 4 keys, the same per-pair sequence as above */
    for (int i = 0; i < na; i++) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        int t = 0;
        for (; t + 16 <= len; t += 16) {
            __m512 va = _mm512_loadu_ps(a[i] + t);
            for (int j = 0; j < nb; j++) acc[j] = _mm512_fmadd_ps(va, _mm512_loadu_ps(b[j] + t), acc[j]);
        }
        if (t < len) {
            __mmask16 m = tail_mask(len - t);
            __m512 va = _mm512_maskz_loadu_ps(m, a[i] + t);
            for (int j = 0; j < nb; j++) acc[j] = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b[j] + t), acc[j]);
        }
        for (int j = 0; j < nb; j++) out[i * ldo + j] = _mm512_reduce_add_ps(acc[j]);
    }
}

static void pv_avx512(float *const *o, int no, const float *p, int ldp, const float *const *v, int nv, int n) {
    for (int t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : tail_mask(n - t);
        __m512 acc[4];
        for (int i = 0; i < no; i++) acc[i] = _mm512_maskz_loadu_ps(m, o[i] + t);
        for (int c = 0; c < nv; c++) {
            __m512 vv = _mm512_maskz_loadu_ps(m, v[c] + t);
            for (int i = 0; i < no; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[i * ldp + c]), vv, acc[i]);
        }
        for (int i = 0; i < no; i++) _mm512_mask_storeu_ps(o[i] + t, m, acc[i]);
    }
}

const tern_glm_kern tern__glm_kern_avx512 = {"avx512", dots_avx512, pv_avx512};
