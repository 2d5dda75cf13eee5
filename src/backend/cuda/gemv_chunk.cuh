/*
 * gemv_chunk.cuh — the chunk decoding shared by gemv.cu (multi-row and expert GEMVs) and gemv1.cu
 * (the one-row GEMV and the fused MoE gate/up): chunk geometry per weight kind, the vector loads of
 * a chunk, element decode and the per-chunk dot product (s·Σq·x + b·Σx for Q rows), so every kernel
 * runs the same f32 operations per chunk and their results stay bitwise comparable.
 */
#pragma once
#include <type_traits>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"


/* chunk geometry per kind: KIND 2..8 = Q bits, 9 = block FP8 (e4m3 bytes, one f32 scale per
 * chunk: block columns are a multiple of 32), 16 = F16, 17 = BF16, 32 = F32 */
template <int KIND> struct Kind {
    static constexpr bool Q = KIND <= 8;
    static constexpr bool F8 = KIND == 9;
    static constexpr int CH = (Q || F8) ? 32 : (KIND == 32 ? 8 : 16); /* elements per chunk */
    static constexpr int WORDS = Q ? KIND : 8;                /* 32-bit words per chunk */
    static constexpr int EB = F8 ? 1 : (KIND == 32 ? 4 : 2);  /* bytes per element (not Q) */
};
/* rows per warp: Q reuses each x read over 4 rows while registers allow */
template <int KIND, int NX> struct Rows { static constexpr int R = (KIND <= 8 && NX <= 4) ? 4 : 2; };

template <int KIND> __device__ __forceinline__ void load_chunk(const uint8_t *row, int c, uint32_t *wd) {
    constexpr int W = Kind<KIND>::WORDS;
    const uint8_t *p = row + (size_t)c * (W * 4);
    if constexpr ((W * 4) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < W / 4; i++) {
            uint4 v = __ldg((const uint4 *)p + i);
            wd[4 * i] = v.x; wd[4 * i + 1] = v.y; wd[4 * i + 2] = v.z; wd[4 * i + 3] = v.w;
        }
    } else if constexpr ((W * 4) % 8 == 0) {
#pragma unroll
        for (int i = 0; i < W / 2; i++) {
            uint2 v = __ldg((const uint2 *)p + i);
            wd[2 * i] = v.x; wd[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < W; i++) wd[i] = __ldg((const uint32_t *)p + i);
    }
}

/* Element j (0 <= j < CH) of a chunk: the integer code q for Q kinds (exact), else the weight. */
template <int KIND> __device__ __forceinline__ float elem(const uint32_t *wd, int j) {
    if constexpr (KIND == 4 || KIND == 8) {
        constexpr int PER = 32 / KIND, HALF = PER / 2;       /* codes per word, per half-word */
        const int word = j / PER, p = j % PER % HALF;
        const uint32_t v = (j % PER) >= HALF ? wd[word] >> 16 : wd[word];
        const uint32_t mask = ((1u << KIND) - 1u) << (KIND * p);
        const uint32_t ex = (uint32_t)(150 - KIND * p) << 23;
        return __uint_as_float((v & mask) | ex) - __uint_as_float(ex); /* (2^(23-KIND p) + q) - 2^(23-KIND p) */
    } else if constexpr (Kind<KIND>::Q) {
        constexpr unsigned mask = (1u << KIND) - 1u;
        const int bit = j * KIND, word = bit >> 5, sh = bit & 31;
        uint32_t v = wd[word] >> sh;
        if (sh + KIND > 32) v |= wd[word + 1] << (32 - sh);
        return __uint_as_float(0x4B000000u | (v & mask)) - 8388608.0f; /* exact */
    } else if constexpr (KIND == 9) {
        return f8e4m3((wd[j >> 2] >> (8 * (j & 3))) & 0xffu);
    } else if constexpr (KIND == 17) {
        const uint32_t v = wd[j / 2];
        return __uint_as_float((j & 1) ? (v & 0xffff0000u) : (v << 16));
    } else if constexpr (KIND == 16) {
        const uint32_t v = wd[j / 2];
        return __half2float(__ushort_as_half((unsigned short)((j & 1) ? (v >> 16) : (v & 0xffffu))));
    } else {
        return __uint_as_float(wd[j]);
    }
}

/* One lane's chunk of R weight rows (wd[r]) against C4 float4 of x, xat(k4) giving the k4-th:
 * qa[r] = Σ_j elem(j)·x[j] as one fmaf chain in element order; SUMX: xsum += (x+y)+(z+w) per
 * float4 (the Σx of the Q kinds' b·Σx term). Shared by gemv_q1_kernel and gemv1_kernel. */
template <int KIND, int R, int C4, bool SUMX, int W, class XAt>
__device__ __forceinline__ void chunk_dot(const uint32_t (&wd)[R][W], XAt xat, float (&qa)[R], float &xsum) {
#pragma unroll
    for (int r = 0; r < R; r++) qa[r] = 0.0f;
#pragma unroll
    for (int k4 = 0; k4 < C4; k4++) {
        const float4 xv = xat(k4);
        if constexpr (SUMX) xsum += (xv.x + xv.y) + (xv.z + xv.w);
#pragma unroll
        for (int r = 0; r < R; r++) {
            qa[r] = fmaf(elem<KIND>(wd[r], 4 * k4), xv.x, qa[r]);
            qa[r] = fmaf(elem<KIND>(wd[r], 4 * k4 + 1), xv.y, qa[r]);
            qa[r] = fmaf(elem<KIND>(wd[r], 4 * k4 + 2), xv.z, qa[r]);
            qa[r] = fmaf(elem<KIND>(wd[r], 4 * k4 + 3), xv.w, qa[r]);
        }
    }
}

/* Where a round's scales live: Q rows' scale and bias arrays (group index orow·ng + chunk's group), or
 * an F8 matrix's block scales (f32 [rows / br][ncs], groups of gs inputs) */
struct RoundScales {
    int ng, gs_shift, sdtype, br, ncs, gs;
};

/* One round of a lane's weight loads: U chunks (c0 + 32u + lane, those < nch; none when !on) of each of
 * R rows (bytes at rowp[r], scales/biases at sp(r)/bp(r), row index orow[r]) with their scale and
 * bias (Q) or block scale (F8). gemv1 and gemv_q1 issue the loads of a round before any product. */
template <int KIND, int R, int U, class SP, class BP>
__device__ __forceinline__ void load_round(const uint8_t *const (&rowp)[R], SP sp, BP bp, const int (&orow)[R], int c0,
                                           int lane, int nch, bool on, const RoundScales &q,
                                           uint32_t (&wd)[U][R][Kind<KIND>::WORDS], float (&s)[U][R], float (&b)[U][R]) {
    using K = Kind<KIND>;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * 32 + lane;
        if (on && c < nch) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                load_chunk<KIND>(rowp[r], c, wd[u][r]);
                if constexpr (K::Q) {
                    const size_t gi = (size_t)orow[r] * q.ng + ((c * 32) >> q.gs_shift);
                    s[u][r] = load_s(sp(r), q.sdtype, gi);
                    b[u][r] = load_s(bp(r), q.sdtype, gi);
                } else if constexpr (K::F8) {
                    s[u][r] = ((const float *)sp(r))[(size_t)(orow[r] / q.br) * q.ncs + (size_t)(c * 32 / q.gs)];
                }
            }
        }
    }
}

static inline int kind_of(const tern__cuda_w *w) {
    switch (w->dtype) {
    case TERN_DT_Q: return w->bits;
    case TERN_DT_F8_E4M3: return 9;
    case TERN_DT_F16: return 16;
    case TERN_DT_BF16: return 17;
    default: return 32;
    }
}

static inline int chunk_of(int kind) { return kind <= 9 ? 32 : (kind == 32 ? 8 : 16); }

/* f(std::integral_constant<int, KIND>{}) for a runtime kind (kind_of): one switch for every launch
 * site that instantiates a kernel per chunked format */
template <class F> static inline auto by_kind(int kind, F &&f) {
    switch (kind) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 9: return f(std::integral_constant<int, 9>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 17: return f(std::integral_constant<int, 17>{});
    default: return f(std::integral_constant<int, 32>{});
    }
}

/* gemv1.cu: can matrices w[0..k) (2-D views) run through gemv1 for one row x; launch it; its init */
bool tern__cuda_g1_fits(const tern__cuda_w *const *w, int k, const float *x);
bool tern__cuda_gemv_row_g1(const tern__cuda_w *w, const float *x); /* gemv.cu: one row of w (past gemv_mma) via gemv1 */
void tern__cuda_g1_launch(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                          const float *x, int mode);
void tern__cuda_gemv1_init(void);
