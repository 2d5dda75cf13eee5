/*
 * gemv_avx512.c — fused batch-1 GEMV (decode) kernels for AVX-512 (F/BW/VL, + VNNI for int8).
 *
 * Decode is memory-bound only if the work per weight byte is small, so these kernels never
 * write decoded weights anywhere: each pass reads up to 4 weight rows once against one x
 * prepared per call (gemv_prep: reordered to match how packed weights unpack into lanes,
 * Σx per group). Per-core ceilings (L2-resident, GB/s of weights) are in bench/NOTES.md.
 *   BF16: 32 weights = 16 dwords; even weights = dword << 16, odd = dword & 0xffff0000; rows
 *     one at a time (one sequential stream per thread, no software prefetch; see k_bf16).
 *   Q8 (exact): Σ_g s_g·Σ_t q_t·x_t + Σ_g b_g·Σx_g; q via vpmovzxbd + vcvtdq2ps + FMA.
 *   Q4 (exact): per group a 16-entry table of s·q + b (the reference's rounding), per 32
 *     weights one widen, one shift, two vpermps lookups. Three vector ops per 16 weights
 *     on two ports is this kernel's floor (~13 GB/s per core), below DRAM speed.
 * The exact kinds are f32 arithmetic on unrounded x; they differ from the reference by
 * summation order and (Q8) the reference's per-weight rounding of s·q + b: test_kern_gemv
 * holds |y − y_ref| ≤ 1e-6·Σ|w·x| (observed ~2e-7).
 *   Q8_I8 / Q4_I8 (the int8 mode: --compute int8 or TERN_CPU_INT8=1): x quantized per weight group g to int8,
 *     x̂ = d_g·xq with d_g = max_g|x|/127, and vpdpbusd (u8 weights × s8 x). The result is
 *     Σ_g s_g·Σ(q−C)·x̂ + Σ_g (b_g + C·s_g)·Σx_g with exact f32 group sums Σx_g and the
 *     code midpoint C (8 or 128), computed as s·d·Σq·xq + b·Σx + C·s·Σ(x − x̂). So
 *     |y − y_exact| ≤ ½ Σ_g d_g · Σ_{t∈g} |s_g|·|q_t − C| (+ f32 rounding); ~0.1% relative
 *     L2 on random data. test_kern_gemv checks every output against that bound. Q4_I8 reads
 *     rows one at a time with 4 accumulator chains and an L1 prefetch (k_q4i8s: the sums of k_q4i8r, bitwise, in
 *     fewer instructions per 64 code bytes; TERN_CPU_Q4_SEQ=3: k_q4i8r, 0: k_q4i8).
 * Opt-outs for before/after A/B: TERN_CPU_BF16_X4=1 (4-row BF16), TERN_CPU_Q4_SEQ=0 (4-row Q4_I8), TERN_CPU_Q4_SEQ=2
 * (k_q4i8r with the former L2 prefetch), TERN_CPU_Q4_SEQ=3 (k_q4i8r, sessions 19-20).
 */
#include "backend/cpu/gemv_avx512.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>


/* ---- x preparation ---- */

static void group_sums(const float *x, int in, int gs, float *gsum) {
    for (int g = 0; g * gs < in; g++) {
        __m512 s = _mm512_setzero_ps();
        for (int t = 0; t < gs; t += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * gs + t));
        gsum[g] = _mm512_reduce_add_ps(s);
    }
}

/* dst[0..16) = round(v·inv) clamped to [-127, 127] (round half to even); returns the ints */
static inline __m512i quant16(__m512 v, __m512 inv, int8_t *dst) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(q));
    return q;
}

static int prep(const cpu_wrow *w, int in, int mode, const float *x, void *buf, cpu_gx *gx) {
    if (in <= 0 || in > CPU_GX_MAX_IN || in % 64) return 0;
    const int int8 = mode & CPU_GX_INT8;
    int kind = 0;
    if (w->dtype == TERN_DT_BF16 && (mode & CPU_GX_XBF16) && __builtin_cpu_supports("avx512bf16")) {
        uint16_t *xb = buf; /* bf16(x), round to nearest even: the bf16 GEMM's rounding (gemm_avx512.c pack_x) */
        for (int t = 0; t < in; t += 32)
            _mm512_storeu_si512(xb + t, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + t + 16), _mm512_loadu_ps(x + t)));
        memset(gx, 0, sizeof *gx);
        gx->kind = CPU_GX_BF16R;
        gx->pf_data = 4096; /* gemv_nx's prefetch (the one-x kernel streams without) */
        gx->in = in;
        gx->xb = xb;
        return 1;
    }
    if (w->dtype == TERN_DT_BF16) kind = CPU_GX_BF16;
    else if (w->dtype == TERN_DT_Q && w->bits == 8) kind = int8 ? CPU_GX_Q8_I8 : CPU_GX_Q8;
    else if (w->dtype == TERN_DT_Q && w->bits == 4) kind = int8 ? CPU_GX_Q4_I8 : CPU_GX_Q4;
    if (!kind) return 0;
    if (kind >= CPU_GX_Q8_I8 && !__builtin_cpu_supports("avx512vnni")) kind -= 2; /* exact kinds instead */
    int inr = (in + 127) / 128 * 128; /* q4 kinds lay x out in whole 128-input chunks */
    float *xp = buf, *gsum = xp + inr, *xd = gsum + inr / 32;
    int8_t *xq = (int8_t *)(xd + inr / 4);
    memset(gx, 0, sizeof *gx);
    gx->pf_data = 1024;
    gx->kind = kind;
    gx->in = in;
    gx->gs = w->gs;
    gx->xp = xp;
    if (kind == CPU_GX_BF16) { /* per 32 inputs: the 16 even ones, then the 16 odd ones */
        cpu_q4_permute(x, in, xp);
        return 1;
    }
    group_sums(x, in, w->gs, gsum);
    gx->gsum = gsum;
    if (kind == CPU_GX_Q8) { gx->xp = x; return 1; }
    if (kind == CPU_GX_Q4) { /* per 32 inputs: the 16 even ones, then the 16 odd ones */
        cpu_q4_permute(x, in, xp);
        return 1;
    }
    /* int8 kinds: one scale per weight group, d_g = max|x|/127 over the group; q8 keeps the
     * natural order, q4 per 128 inputs the 64 even ones, then the 64 odd ones */
    int gs = w->gs;
    for (int g = 0; g * gs < in; g++) {
        __m512 m = _mm512_setzero_ps();
        for (int t = 0; t < gs; t += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + g * gs + t)));
        float amax = _mm512_reduce_max_ps(m);
        xd[g] = amax / 127.0f;
        xp[g] = amax > 0.0f ? 127.0f / amax : 0.0f; /* xp: scratch for 1/d */
    }
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    /* centring term rq[g] = C·Σ_g (x − x̂), C = 8 (q4) or 128 (q8), see the top comment */
    float *rq = xd + inr / 32, cq = kind == CPU_GX_Q4_I8 ? 8.0f : 128.0f;
    int32_t sq = 0;
    for (int c = 0; c < inr; c += 128)
        for (int b = 0; b < 4; b++) { /* inputs c+32b .. c+32b+31: one group (gs >= 32) */
            int base = c + 32 * b, live = base < in;
            __m512 v0 = live ? _mm512_loadu_ps(x + base) : _mm512_setzero_ps();
            __m512 v1 = live ? _mm512_loadu_ps(x + base + 16) : _mm512_setzero_ps();
            __m512 iv = _mm512_set1_ps(live ? xp[base / gs] : 0.0f);
            __m512i q0, q1;
            if (kind == CPU_GX_Q8_I8) {
                q0 = quant16(v0, iv, xq + base);
                q1 = quant16(v1, iv, xq + base + 16);
            } else {
                q0 = quant16(_mm512_permutex2var_ps(v0, ev, v1), iv, xq + c + 16 * b);
                q1 = quant16(_mm512_permutex2var_ps(v0, od, v1), iv, xq + c + 64 + 16 * b);
            }
            if (!live) continue;
            sq += _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            if ((base + 32) % gs == 0) { /* last block of group g */
                int g = base / gs;
                rq[g] = cq * (gsum[g] - xd[g] * (float)sq);
                sq = 0;
            }
        }
    gx->xq = xq;
    gx->xd = xd;
    gx->rq = rq;
    static _Atomic unsigned long long gen_next = 1; /* 64 bits: no wrap-around in practice */
    gx->gen = atomic_fetch_add(&gen_next, 1);
    return 1;
}

/* ---- kernels (NR = 1..4 rows sharing x) ---- */


/* BF16 rows one after another, whatever NR: each thread then reads its slice of the weight as
 * one sequential stream. Reading 4 rows at once (4 streams a row apart) with a 1 KB or passes-ahead
 * prefetch streamed ~20 % slower inside the model (bench/NOTES.md (ab)). The stream is the software
 * prefetch's alone: every line prefetched into L1 2 KB ahead and read by a masked load (all lanes) —
 * on this project's Zen CPUs masked loads do not train the hardware prefetcher, and a stream fed only
 * by software prefetch reads ~1.2x faster than plain loads with or without one (a 1 GiB streaming
 * probe; without the prefetch masked loads read at ~0.4x). bench_seq's token of llama3-1b bf16 GEMVs
 * 1.07-1.12x (NOTES (bk)); the same is why Q4_I8's q4g_dots_stream and Q8_I8 stream faster. Per row 8
 * accumulators over 128 inputs; the sum order depends only on `in`, so a row's result does not depend
 * on NR. */
AI void k_bf16(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) {
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    const __mmask64 all = sw_stream_mask();
    const float *xp = gx->xp;
    const int in = gx->in;
    for (int r = 0; r < NR; r++) {
        const uint16_t *p = (const uint16_t *)rw[r].data;
        __m512 a[8];
        _Pragma("GCC unroll 8")
        for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
        int t = 0;
        for (; t + 128 <= in; t += 128) {
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++) {
                PF_T0(p + t + 32 * u);
                __m512i v = _mm512_maskz_loadu_epi8(all, p + t + 32 * u);
                PIN(v);
                a[2 * u] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_loadu_ps(xp + t + 32 * u), a[2 * u]);
                a[2 * u + 1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), _mm512_loadu_ps(xp + t + 32 * u + 16),
                                               a[2 * u + 1]);
            }
        }
        for (; t < in; t += 32) { /* in % 128 == 64 */
            __m512i v = _mm512_loadu_si512(p + t);
            a[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_loadu_ps(xp + t), a[0]);
            a[1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), _mm512_loadu_ps(xp + t + 16), a[1]);
        }
        __m512 s0 = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[4], a[6]));
        __m512 s1 = _mm512_add_ps(_mm512_add_ps(a[1], a[3]), _mm512_add_ps(a[5], a[7]));
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

/* The former kernel, 4 rows per pass with the 1 KB (or the driver's) prefetch: TERN_CPU_BF16_X4=1 or
 * tern__cpu_bf16_x4_set (before/after A/B; its sums differ from k_bf16's in order). */
static _Atomic int bf16_x4 = -1;
void tern__cpu_bf16_x4_set(int on) { bf16_x4 = on < 0 ? -1 : on != 0; }
static int bf16_x4_on(void) {
    return tern__cpu_switch(&bf16_x4, "TERN_CPU_BF16_X4", 0);
}
AI void k_bf16x4(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) {
    const ptrdiff_t pfd = gx->pf_data;
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    const float *xp = gx->xp;
    const uint16_t *p[4];
    __m512 ae[4], ao[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) { p[r] = (const uint16_t *)rw[r].data; ae[r] = ao[r] = _mm512_setzero_ps(); }
    for (int t = 0; t < gx->in; t += 32) {
        __m512 xe = _mm512_loadu_ps(xp + t), xo = _mm512_loadu_ps(xp + t + 16);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) {
            PF(p[r] + t);
            __m512i v = _mm512_loadu_si512(p[r] + t);
            ae[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), xe, ae[r]);
            ao[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), xo, ao[r]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) y[r] = _mm512_reduce_add_ps(_mm512_add_ps(ae[r], ao[r]));
}

/* BF16R (bf16r_nx in gemv_avx512.h with one x), rows one after another. */
static void k_bf16r(const cpu_gx *gx, const cpu_wrow *rw, float *y, int nr) {
    for (int r = 0; r < nr; r++) bf16r_nx(gx, rw + r, y + r, 1, 1);
}

/* Q8 exact (q8_nx in gemv_avx512.h with one x). */
AI void k_q8(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) { q8_nx(gx, rw, y, 1, NR, 1); }

/* Q4 exact (q4_nx in gemv_avx512.h with one x): the kernel the several-x path repeats per x. */
AI void k_q4(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) { q4_nx(gx, rw, y, 1, NR, 1); }

/* Q8_I8, up to 8 rows per pass (more weight streams in flight per x load; rows are summed
 * independently, so a row's result does not depend on NR). BC (gs a multiple of 64): every
 * 64-byte chunk lies in one group, its scale s·d is a broadcast load instead of a lane
 * permute. */
AI void k_q8i8(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR, const int BC) {
    const ptrdiff_t pfd = gx->pf_data;
    pf_groups(gx, rw, NR);
    const int gs = gx->gs, in = gx->in;
    const __m512i map = lane_groups(4, gs);
    const int gsh = __builtin_ctz((unsigned)gs);
    float sc[8][CPU_MAX_GROUPS + 16]; /* ds = s·d per group */
    __m512 tot[8], bs[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; r++) tot[r] = bs[r] = _mm512_setzero_ps();
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
        int len = in - j0 < ch ? in - j0 : ch, ng = len / gs;
        _Pragma("GCC unroll 8")
        for (int r = 0; r < NR; r++) bs[r] = _mm512_add_ps(bs[r], grp_i8(&rw[r], j0 / gs, ng, gx, sc[r]));
        for (int c = 0; c < len; c += 64) {
            __m512i xq = _mm512_loadu_si512(gx->xq + j0 + c);
            /* the codes through a masked load (the row's bytes only; all 64 but in a last half chunk): the same sums,
             * and the token's GEMVs stream 1.05-1.13x faster than with a plain load folded into the vpdpbusd
             * (bench_seq --fmt q8 --int8, paired; a plain load kept in a register does not do it): masked loads leave
             * the stream to the software prefetch (k_bf16's comment; NOTES (bk)) */
            const __mmask64 ld = len - c >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (len - c)) - 1;
            _Pragma("GCC unroll 8")
            for (int r = 0; r < NR; r++) {
                PF(rw[r].data + j0 + c);
                __m512i wv = _mm512_maskz_loadu_epi8(ld, rw[r].data + j0 + c);
                PIN(wv);
                __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xq);
                __m512 ds = BC ? _mm512_set1_ps(sc[r][c >> gsh]) : _mm512_permutexvar_ps(map, _mm512_loadu_ps(sc[r] + (c >> gsh)));
                tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), ds, tot[r]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < NR; r++) y[r] = _mm512_reduce_add_ps(tot[r]) + _mm512_reduce_add_ps(bs[r]);
}

/* Q4_I8: per 128 inputs, low nibbles (even inputs) and high nibbles (odd inputs) of the same
 * 64 bytes go through two vpdpbusd into one int32 accumulator: lane i covers inputs
 * 8i..8i+7 of the chunk, one weight group and one x group, so the sums share a scale. */
AI void k_q4i8(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) {
    const ptrdiff_t pfd = gx->pf_data;
    pf_groups(gx, rw, NR);
    const int gs = gx->gs, in = gx->in;
    const __m512i map = lane_groups(8, gs), nib = _mm512_set1_epi8(0x0f);
    const int gsh = __builtin_ctz((unsigned)gs); /* c / gs without a division per chunk */
    float sc[4][CPU_MAX_GROUPS + 16]; /* ds = s·d per group */
    __m512 tot[4], bs[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) tot[r] = bs[r] = _mm512_setzero_ps();
    for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
        int len = in - j0 < ch ? in - j0 : ch, ng = len / gs;
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) bs[r] = _mm512_add_ps(bs[r], grp_i8(&rw[r], j0 / gs, ng, gx, sc[r]));
        for (int c = 0; c < len; c += 128) {
            __m512i xl = _mm512_loadu_si512(gx->xq + j0 + c), xh = _mm512_loadu_si512(gx->xq + j0 + c + 64);
            PIN(xl); /* x once per chunk for all NR rows, not folded into each row's dpbusd */
            PIN(xh);
            __mmask64 ld = len - c >= 128 ? ~(__mmask64)0 : 0xffffffffull; /* a half chunk at the end */
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) {
                const uint8_t *src = rw[r].data + ((size_t)(j0 + c) >> 1);
                PF(src);
                __m512i raw = _mm512_maskz_loadu_epi8(ld, src);
                __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
                __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh);
                __m512 ds = _mm512_permutexvar_ps(map, _mm512_loadu_ps(sc[r] + (c >> gsh)));
                tot[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), ds, tot[r]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NR; r++) y[r] = _mm512_reduce_add_ps(tot[r]) + _mm512_reduce_add_ps(bs[r]);
}

/* Q4_I8 one row at a time with 4 accumulator chains (128-input chunk u of every 512 inputs into tot[u]): one
 * weight stream per thread (k_q4i8 reads 4 rows a row apart) with about the ILP of 4 rows (one row and one
 * chain ran ~30 % slower from L2). The default for every NR, so a row's result does not depend on NR;
 * llama3-1b q4 int8 decode ~35 -> ~38.6 tok/s median, 3 of 4 interleaved rounds (NOTES (ac)).
 * The code prefetch goes to L1 (T0), unlike the other kernels' L2 (PF): the GEMV sequence of llama3-1b streamed
 * +17-24 % faster, paired, 1 and 2 threads (bench_layout, NOTES (ae)); only the access order changes, not the sums.
 * In the model +9 % (bench_seq, 120 pairs; `tern bench` could not resolve it on this box). 8 chains gained nothing.
 * TERN_CPU_Q4_SEQ=0 or tern__cpu_q4_seq_set(0): k_q4i8 (4 rows per pass; its sum order differs); 2: the L2 (T1)
 * prefetch of sessions 19-20; 3: this kernel (bitwise the same results as 2 and as k_q4i8s, 4, for A/B). */
AI void k_q4i8r_t(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR, const int T0) {
    const ptrdiff_t pfd = gx->pf_data;
    const int gs = gx->gs, in = gx->in;
    const __m512i map = lane_groups(8, gs), nib = _mm512_set1_epi8(0x0f);
    const int gsh = __builtin_ctz((unsigned)gs);
    float sc[CPU_MAX_GROUPS + 16];
    for (int r = 0; r < NR; r++) {
        pf_groups(gx, rw + r, 1);
        __m512 tot[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        __m512 bs = _mm512_setzero_ps();
        for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
            int len = in - j0 < ch ? in - j0 : ch, ng = len / gs;
            bs = _mm512_add_ps(bs, grp_i8(&rw[r], j0 / gs, ng, gx, sc));
            int c = 0;
            for (; c + 512 <= len; c += 512) {
                _Pragma("GCC unroll 4")
                for (int u = 0; u < 4; u++) {
                    const int cc = c + 128 * u;
                    const uint8_t *src = rw[r].data + ((size_t)(j0 + cc) >> 1);
                    if (T0) _mm_prefetch((const char *)src + pfd, _MM_HINT_T0);
                    else PF(src);
                    __m512i raw = _mm512_loadu_si512(src);
                    __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
                    __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(gx->xq + j0 + cc)),
                                                    hi, _mm512_loadu_si512(gx->xq + j0 + cc + 64));
                    __m512 ds = _mm512_permutexvar_ps(map, _mm512_loadu_ps(sc + (cc >> gsh)));
                    tot[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), ds, tot[u]);
                }
            }
            for (; c < len; c += 128) {
                const uint8_t *src = rw[r].data + ((size_t)(j0 + c) >> 1);
                __mmask64 ld = len - c >= 128 ? ~(__mmask64)0 : 0xffffffffull;
                if (T0) _mm_prefetch((const char *)src + pfd, _MM_HINT_T0);
                else PF(src);
                __m512i raw = _mm512_maskz_loadu_epi8(ld, src);
                __m512i lo = _mm512_and_si512(raw, nib), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
                __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(gx->xq + j0 + c)),
                                                hi, _mm512_loadu_si512(gx->xq + j0 + c + 64));
                __m512 ds = _mm512_permutexvar_ps(map, _mm512_loadu_ps(sc + (c >> gsh)));
                tot[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), ds, tot[0]);
            }
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(tot[0], tot[1]), _mm512_add_ps(tot[2], tot[3]))) +
               _mm512_reduce_add_ps(bs);
    }
}

static void k_q4i8r(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) { k_q4i8r_t(gx, rw, y, NR, 1); }
static void k_q4i8r_l2(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) { k_q4i8r_t(gx, rw, y, NR, 0); }

/* Q4_I8, the default from session 21 to 49 (TERN_CPU_Q4_SEQ=4 now, for A/B): k_q4i8r's sums in its order — bitwise its results — with fewer instructions and
 * loads per 64 code bytes and less per-row latency (bench/NOTES.md (ah)):
 * - the scales of all NR rows first (ds[r] = s·d for every group, bs[r] = the bias and centring terms, grp_i8 per
 *   slice as before), so a row's loop never waits on its own scale stores; each row is then one loop over its
 *   chunks (slices are whole 512-input steps, so chunk k still goes to chain k % 4 and the tail to chain 0);
 * - GS 64 (two groups per chunk, lanes 0-7 and 8-15): the scale as two broadcast FMAs, masked to a lane half, into
 *   two accumulators per chain (blended at the end: the same per-lane chain) instead of a lane permute of a
 *   64-byte load; GS 128: one broadcast FMA; other sizes keep the permute;
 * - codes loaded once (pinned), pointers stepped, the row's two reductions in one shuffle tree (red_pair).
 * One thread, codes in L1/L2 (a throwaway microbench; bench_kernels --hot in the notes): in 2048 ~7.3 -> ~5.3 cycles per 64 code
 * bytes, in 8192 ~5.0 -> ~4.0. Tried and dropped: the high nibbles by one GFNI affine op (no gain), two rows at once
 * sharing x (slower). TERN_CPU_Q4_SEQ=3: k_q4i8r. */
AI void k_q4i8s_t(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR, const int GS) {
    const ptrdiff_t pfd = gx->pf_data;
    const int gs = GS ? GS : gx->gs, in = gx->in, n512 = in / 512 * 512;
    const __m512i map = lane_groups(8, gs), nib = _mm512_set1_epi8(0x0f);
    const int gsh = __builtin_ctz((unsigned)gs), gpc = 128 >> gsh; /* groups per chunk (gs <= 128) */
    float ds[4][CPU_GX_MAX_IN / 32 + 16] __attribute__((aligned(64)));
    __m512 bs[4];
    for (int r = 0; r < NR; r++) {
        pf_groups(gx, rw + r, 1);
        bs[r] = _mm512_setzero_ps();
        for (int j0 = 0, ch = CPU_MAX_GROUPS * gs; j0 < in; j0 += ch) {
            int len = in - j0 < ch ? in - j0 : ch;
            bs[r] = _mm512_add_ps(bs[r], grp_i8(&rw[r], j0 / gs, len / gs, gx, ds[r] + j0 / gs));
        }
    }
    if (n512 == 0 && NR > 1) { /* rows under 512 inputs: every chunk goes to chain 0, so each row is one dependent chain;
                                 * the rows run side by side (row r's operations and their order are the loop's below:
                                 * the same bits, more independent work in flight; in 192 ~14 -> ~8 ns a row hot) */
        __m512 t[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) t[r] = _mm512_setzero_ps();
        for (int c = 0; c < in; c += 128) {
            const __mmask64 ld = in - c >= 128 ? ~(__mmask64)0 : 0xffffffffull;
            _Pragma("GCC unroll 4")
            for (int r = 0; r < NR; r++) {
                const uint8_t *src = rw[r].data + c / 2;
                _mm_prefetch((const char *)src + pfd, _MM_HINT_T0);
                __m512i a = q4i8_chunk(src, gx->xq + c, nib, ld);
                t[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(map, _mm512_loadu_ps(ds[r] + (c >> gsh))), t[r]);
            }
        }
        const __m512 z = _mm512_setzero_ps(); /* chains 1-3 (and the GS 64 blend of zeros) */
        _Pragma("GCC unroll 4")
        for (int r = 0; r < NR; r++) y[r] = red_pair(_mm512_add_ps(_mm512_add_ps(t[r], z), _mm512_add_ps(z, z)), bs[r]);
        return;
    }
    for (int r = 0; r < NR; r++) {
        __m512 ta[4], tb[4]; /* GS 64: ta lanes 0-7, tb lanes 8-15 of chain u; else ta */
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) ta[u] = tb[u] = _mm512_setzero_ps();
        const uint8_t *src = rw[r].data;
        const int8_t *xq = gx->xq;
        const float *sp = ds[r];
        int c = 0;
        for (; c < n512; c += 512, src += 256, xq += 512, sp += 4 * gpc) {
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++) {
                _mm_prefetch((const char *)src + 64 * u + pfd, _MM_HINT_T0);
                __m512 af = _mm512_cvtepi32_ps(q4i8_chunk(src + 64 * u, xq + 128 * u, nib, ~(__mmask64)0));
                if (GS == 64) {
                    ta[u] = _mm512_mask3_fmadd_ps(af, _mm512_set1_ps(sp[2 * u]), ta[u], 0x00ff);
                    tb[u] = _mm512_mask3_fmadd_ps(af, _mm512_set1_ps(sp[2 * u + 1]), tb[u], 0xff00);
                } else if (GS == 128) ta[u] = _mm512_fmadd_ps(af, _mm512_set1_ps(sp[u]), ta[u]);
                else ta[u] = _mm512_fmadd_ps(af, _mm512_permutexvar_ps(map, _mm512_loadu_ps(sp + gpc * u)), ta[u]);
            }
        }
        if (GS == 64) {
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++) ta[u] = _mm512_mask_blend_ps(0xff00, ta[u], tb[u]);
        }
        for (; c < in; c += 128, src += 64, xq += 128, sp += gpc) { /* the tail, chain 0; a half chunk at the end */
            _mm_prefetch((const char *)src + pfd, _MM_HINT_T0);
            __m512i a = q4i8_chunk(src, xq, nib, in - c >= 128 ? ~(__mmask64)0 : 0xffffffffull);
            ta[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(map, _mm512_loadu_ps(sp)), ta[0]);
        }
        y[r] = red_pair(_mm512_add_ps(_mm512_add_ps(ta[0], ta[1]), _mm512_add_ps(ta[2], ta[3])), bs[r]);
    }
}
static void k_q4i8s(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) {
    if (gx->gs == 64) k_q4i8s_t(gx, rw, y, NR, 64);
    else if (gx->gs == 128) k_q4i8s_t(gx, rw, y, NR, 128);
    else if (gx->gs == 32) k_q4i8s_t(gx, rw, y, NR, 0);
    else k_q4i8r(gx, rw, y, NR); /* not an MLX group size: the former kernel */
}

/* Q4_I8, the default since session 50: q4g_scales and q4g_dots_stream (gemv_avx512.h) with one x — the scales of all NR rows
 * first, then each row's codes (as k_q4i8s did: no row waits on its own scale stores) — in the order the several-x
 * kernels share (a row's sums per group as one int32, f32 per 16 groups). Per 64 code bytes ~9 vector ops where
 * k_q4i8s spends ~11 (the converts and scale FMAs per chunk become ~2.6 in-lane shuffles and adds). bench_seq's
 * token of llama3-1b GEMVs against k_q4i8s, paired: 1.00x with the scales row by row, 1.13-1.26x (medians of four
 * runs) with them first and q4g_dots_stream's loop (NOTES (bj)). Groups other than 32 / 64 / 128 keep k_q4i8r. */
AI void k_q4i8g_t(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR, const int GS) {
    float ds[4][CPU_GX_MAX_IN / 32 + 16] __attribute__((aligned(64)));
    __m512 bs[4];
    for (int r = 0; r < NR; r++) q4g_scales(gx, rw + r, 1, GS, &ds[r], &bs[r]);
    for (int r = 0; r < NR; r++) q4g_dots_stream(gx, rw + r, y + r, 1, 1, GS, &ds[r], &bs[r]);
}
static void k_q4i8g(const cpu_gx *gx, const cpu_wrow *rw, float *y, const int NR) {
    if (gx->gs == 64) k_q4i8g_t(gx, rw, y, NR, 64);
    else if (gx->gs == 128) k_q4i8g_t(gx, rw, y, NR, 128);
    else if (gx->gs == 32) k_q4i8g_t(gx, rw, y, NR, 32);
    else k_q4i8r(gx, rw, y, NR);
}

#define KCASE(K, fn) \
    case K: \
        if (nr == 4) fn(gx, rows, y, 4); \
        else if (nr == 3) fn(gx, rows, y, 3); \
        else if (nr == 2) fn(gx, rows, y, 2); \
        else fn(gx, rows, y, 1); \
        return;

#define Q8I8(n) (bc ? k_q8i8(gx, rows, y, n, 1) : k_q8i8(gx, rows, y, n, 0))

static _Atomic int q4_seq = -1; /* 1 k_q4i8g (default), 0 k_q4i8, 2 k_q4i8r with the L2 prefetch, 3 k_q4i8r, 4 k_q4i8s */
void tern__cpu_q4_seq_set(int on) { q4_seq = on < 0 ? -1 : on; }
static int q4_seq_on(void) {
    int v = q4_seq;
    if (v < 0) {
        const char *e = getenv("TERN_CPU_Q4_SEQ");
        v = e && *e >= '0' && *e <= '4' ? *e - '0' : 1;
        q4_seq = v;
    }
    return v;
}

/* nr >= 1 (the driver passes up to the table's gemv_nr, 8; gemv_nx's one-x case up to 16): Q8_I8 takes up to 8 rows
 * per pass, the other kinds 4 */
static void gemv(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y) {
    for (; nr > 8; rows += 8, y += 8, nr -= 8) gemv(gx, rows, 8, y); /* rows are independent */
    if (gx->kind == CPU_GX_Q8_I8) {
        int bc = gx->gs % 64 == 0;
        switch (nr) {
        case 8: Q8I8(8); return;
        case 7: Q8I8(7); return;
        case 6: Q8I8(6); return;
        case 5: Q8I8(5); return;
        case 4: Q8I8(4); return;
        case 3: Q8I8(3); return;
        case 2: Q8I8(2); return;
        default: Q8I8(1); return;
        }
    }
    while (nr > 4) { /* rows are independent: separate calls give the same results */
        gemv(gx, rows, 4, y);
        rows += 4, y += 4, nr -= 4;
    }
    if (gx->kind == CPU_GX_Q4_I8 && q4_seq_on()) {
        switch (q4_seq_on()) {
        case 2: k_q4i8r_l2(gx, rows, y, nr); break;
        case 3: k_q4i8r(gx, rows, y, nr); break;
        case 4: k_q4i8s(gx, rows, y, nr); break;
        default: k_q4i8g(gx, rows, y, nr); break;
        }
        return;
    }
    if (gx->kind == CPU_GX_BF16 && bf16_x4_on()) {
        if (nr == 4) k_bf16x4(gx, rows, y, 4);
        else if (nr == 3) k_bf16x4(gx, rows, y, 3);
        else if (nr == 2) k_bf16x4(gx, rows, y, 2);
        else k_bf16x4(gx, rows, y, 1);
        return;
    }
    if (gx->kind == CPU_GX_BF16R) {
        k_bf16r(gx, rows, y, nr);
        return;
    }
    switch (gx->kind) {
        KCASE(CPU_GX_BF16, k_bf16)
        KCASE(CPU_GX_Q8, k_q8)
        KCASE(CPU_GX_Q4, k_q4)
        KCASE(CPU_GX_Q4_I8, k_q4i8)
    default: return;
    }
}

/* Whether gemv runs kind's default kernel (the one gemv_nx_avx512.c repeats for several x), not an A/B opt-out. */
int tern__cpu_gemv_avx512_std(int kind) { return kind != CPU_GX_Q4_I8 || q4_seq_on() == 1; }

int tern__cpu_gemv_prep_avx512(const cpu_wrow *w, int in, int mode, const float *x, void *buf, cpu_gx *gx) {
    return prep(w, in, mode, x, buf, gx);
}
void tern__cpu_gemv_avx512(const cpu_gx *gx, const cpu_wrow *rows, int nr, float *y) { gemv(gx, rows, nr, y); }
