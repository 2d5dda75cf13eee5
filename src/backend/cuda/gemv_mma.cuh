/*
 * gemv_mma.cuh — the device pieces of the tensor-core Q GEMV (gemv_mma.cu) that the MoE pair kernel
 * (moe_mma.cu) shares: the MMA, the code decode (a 32-bit word's nibbles as exact bf16 integers), the
 * exact three-part bf16 split of x, scale loads, and two steps of the kernels' inner loop:
 *   mm_stage — x of one K slice staged in shared memory as a table of MMA B fragments (x split
 *              hi + mid + lo into the columns of the group the lane's bytes belong to, zeros
 *              elsewhere) plus Σx per (step, scale group);
 *   mm_step  — one 64-byte step of a warp's 16 rows: 8 MMAs per column tile against the table, then
 *              the per-group scale fold acc += s·D and the bias term acc += b·Σx.
 * See gemv_mma.cu's top comment for the layout (warp = 16 rows, lane (g, t) holds 16 bytes of rows g
 * and g+8 per step; a step holds GPS = 64/GB scale groups) and why the products are exact.
 * TAIL (moe_mma.cu): inputs from `nin` on count as zero (a row whose bytes end inside a step); the
 * dense kernel instantiates TAIL = false, the same code as before the move.
 * Include after cuda_common.cuh.
 */
#ifndef TERN_GEMV_MMA_CUH
#define TERN_GEMV_MMA_CUH

#define MM_CNT TERN_CUDA_MM_CNT /* row-block counters (cuda_internal.h) */

template <bool F16 = false> /* F16: f16 operands (gemv_mma.cu's Q8X: codes as 1024 + byte, x scaled into f16's range) */
__device__ __forceinline__ void mm_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    if constexpr (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* the word's 4 bf16 pairs (nibble j, nibble j+4), j = 0..3, as exact small integers. The and-or is one
 * LOP3 only when its second constant sits in a register: `magic` (= 0x43004300) comes from the kernel
 * arguments so the compiler cannot fold it back into an immediate (two immediates: two LOP3s) */
/* FOLD (Q4; default in the bf16 compute mode, TERN_CUDA_GEMV_FOLD): leave the pairs at 128 + nibble (no
 * subtraction) and fold the 128 into the group's bias, y = s·Σ(128+q)·x + (b - 128·s)·Σx: 4 fewer
 * instructions per word; the f32 sums carry 128·x (measured: rel 2.1e-6 against cpu-ref, the unfolded
 * kernel 2.0e-6) */
template <bool FOLD = false> __device__ __forceinline__ void mm_decode(uint32_t w, uint32_t magic, uint32_t *r) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t p;
        asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(p) : "r"(w >> (4 * j)), "r"(magic)); /* (a & b) | c */
        if constexpr (FOLD) {
            r[j] = p;
        } else {
            __nv_bfloat162 h = __hsub2(*(__nv_bfloat162 *)&p, *(const __nv_bfloat162 *)&magic);
            r[j] = *(uint32_t *)&h;
        }
    }
}

/* part p (0 hi, 1 mid, 2 lo) of v0, v1 packed as a bf16 pair (low half = v0); x = hi + mid + lo */
__device__ __forceinline__ void mm_split(float v0, float v1, uint32_t *o) {
    __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    float2 f = __bfloat1622float2(h);
    const float r0 = v0 - f.x, r1 = v1 - f.y; /* exact */
    o[0] = *(uint32_t *)&h;
    h = __floats2bfloat162_rn(r0, r1);
    o[1] = *(uint32_t *)&h;
    f = __bfloat1622float2(h);
    h = __floats2bfloat162_rn(r0 - f.x, r1 - f.y); /* <= 8 significant bits left: exact */
    o[2] = *(uint32_t *)&h;
}

template <bool F16S> __device__ __forceinline__ float mm_scale(uint32_t u) {
    if constexpr (F16S) return __half2float(__ushort_as_half((unsigned short)u));
    else return __uint_as_float(u << 16);
}

/* weight words are read once: no L1 allocation (plain __ldg and an L2::128B prefetch hint measured
 * the same on the H200) */
/* a warp tile's row sums: each lane's acc0 (row g) and acc1 (row g+8, or a pair's up row) summed over the 4 lanes t of
 * the row, in a fixed order (every lane gets the sums) */
__device__ __forceinline__ void mm_row_sums(float &acc0, float &acc1) {
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
}

__device__ __forceinline__ uint4 mm_ld4(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* packed scales of the groups of one step: GPS = 1, 2, 4 bf16/f16 values */
template <int GPS> struct SVec { using T = uint32_t; };
template <> struct SVec<4> { using T = uint2; };
template <int GPS> __device__ __forceinline__ typename SVec<GPS>::T mm_lds(const uint16_t *p) {
    if constexpr (GPS == 4) return __ldg((const uint2 *)p);
    else if constexpr (GPS == 2) return __ldg((const uint32_t *)p);
    else return (uint32_t)__ldg(p);
}
template <int GPS, bool F16S> __device__ __forceinline__ float mm_sget(typename SVec<GPS>::T v, int gi) {
    uint32_t u;
    if constexpr (GPS == 4) u = (gi & 2) ? v.y : v.x;
    else u = v;
    if constexpr (GPS > 1) u = (gi & 1) ? u >> 16 : u & 0xffffu;
    return mm_scale<F16S>(u);
}


/* ---- the other MLX widths (bits 2, 3, 5, 6) on XP1's walk (gemv_mma.cu, the plain bf16 mode) ----
 * A step is 128 codes of each row for every width but Q8 (Q4: 64 bytes). Q4's lane t holds codes 32t..32t+31 of a
 * step; the other widths load a double step at once (256 codes, `in` a multiple of 256): lane t's 8·BITS contiguous
 * bytes there (mm_lb: 16 / 24 / 40 / 48, 8-byte aligned: one 16-byte load for Q2, three 8-byte for Q3, five for Q5,
 * three 16-byte for Q6) hold codes 64t..64t+63, the first 32 its part of the even step, the rest of the odd one, so
 * a step's lane words are BITS words either way. A lane's 32 codes of a step become 16 bf16 pairs P[0..15] (MMA m
 * takes P[2m] as a0 and P[2m+1] as a2, as Q4's word / nibble order does); pair p is (code lo, code lo + dp) of the
 * lane's 32, a fixed table per width that mm_stage stages x in (mm_plo): Q4 / Q6 lo = 8·(p/4) + p%4, dp = 4; Q2 /
 * Q3 / Q5 lo = 16·(p/8) + p%8, dp = 8. Codes are < 128, so ((v >> s) & mask) | 0x43004300 is the pair
 * (128 + lo, 128 + hi), one LOP3, with FOLD's bias (the 128 folded into b). The codes of a pair sit 16 bits apart
 * in v: Q2 in a word as it is (codes n and n + 8); Q3 / Q6 / Q5 pack 3- / 3- / 5-byte units (8 / 4 / 8 codes,
 * MLX's layout), and a pair is code i of two adjacent units, brought 16 bits apart by a byte permute (PRMT) of the
 * units' bytes k, k+1 (Q5: funnel shifts first where the 7 bytes span three words). The groups of a step are no
 * longer contiguous in x, so a lane's MMA column is its group's place in the chunk (mm_stage), which keeps XP1's
 * fold (column c = the chunk's group c) and its Σx per group. */
/* inputs per step (X1: the XP1 walk, whose Q8 step is 128 codes too: gemv_mma.cu's Q8X) and steps per chunk (q4
 * g32 and the other widths' 32-code groups: two MMA tiles, fewer registers; Q5 / Q6 / Q8X: 40 / 48 / 32 bytes a lane
 * and row per double step or step) — the kernel's CPS and S, and gemv_mma.cu's plan of them */
__host__ __device__ constexpr int mm_cps(int bits, bool x1) { return bits == 8 && !x1 ? 64 : 128; }
__host__ __device__ constexpr int mm_steps(int bits, int gs, bool x1) {
    return (bits == 8 && x1) || bits == 5 || bits == 6 || (bits != 8 && gs == 32) ? 2 : 4;
}
template <int BITS, bool X1 = false> __host__ __device__ constexpr int mm_cps() { return mm_cps(BITS, X1); }
template <int BITS> __host__ __device__ constexpr bool mm_ds() { return BITS != 4 && BITS != 8; } /* double steps */
/* a lane's bytes of a row per load unit (Q4 / Q8: a step, the others: a double step) and a row's bytes per step */
template <int BITS> __host__ __device__ constexpr int mm_lb() { return mm_ds<BITS>() ? 8 * BITS : 16; }
template <int BITS, bool X1 = false> __host__ __device__ constexpr int mm_sb() {
    return mm_ds<BITS>() ? 16 * BITS : BITS == 8 && X1 ? 128 : 64;
}
template <int BITS> __device__ __forceinline__ constexpr int mm_plo(int p) {
    return BITS == 4 || BITS == 6 ? 8 * (p >> 2) + (p & 3) : 16 * (p >> 3) + (p & 7);
}
template <int BITS> __device__ __forceinline__ constexpr int mm_pdp() { return BITS == 4 || BITS == 6 ? 4 : 8; }

/* the lane's words of one row and step: Q4 / Q8 a uint4, the others NW = BITS words */
template <int NW> struct MmWn { uint32_t v[NW]; };
template <int BITS> struct MmWord { using T = MmWn<BITS>; };
template <> struct MmWord<4> { using T = uint4; };
template <> struct MmWord<8> { using T = uint4; };

/* (v >> s) & m | magic as one LOP3 */
template <int S, uint32_t M> __device__ __forceinline__ uint32_t mm_pick(uint32_t v, uint32_t magic) {
    uint32_t p;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(p) : "r"(v >> S), "n"(M), "r"(magic));
    return p;
}

/* Q2 / Q3 / Q5 / Q6: the lane's 16 pairs (FOLD: 128 + code) of one row from its BITS words of a step; Q8 (Q8X,
 * magic = 0x64006400): the f16 pairs (1024 + byte 0, 1024 + byte 2), (1024 + byte 1, 1024 + byte 3) of each word */
template <int BITS> __device__ __forceinline__ void mm_decode_w(const uint32_t *w, uint32_t magic, uint32_t *P) {
    if constexpr (BITS == 8) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            P[2 * i] = mm_pick<0, 0x00FF00FFu>(w[i], magic);
            P[2 * i + 1] = mm_pick<8, 0x00FF00FFu>(w[i], magic);
        }
    } else if constexpr (BITS == 2) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            P[8 * u + 0] = mm_pick<0, 0x00030003u>(w[u], magic);  P[8 * u + 1] = mm_pick<2, 0x00030003u>(w[u], magic);
            P[8 * u + 2] = mm_pick<4, 0x00030003u>(w[u], magic);  P[8 * u + 3] = mm_pick<6, 0x00030003u>(w[u], magic);
            P[8 * u + 4] = mm_pick<8, 0x00030003u>(w[u], magic);  P[8 * u + 5] = mm_pick<10, 0x00030003u>(w[u], magic);
            P[8 * u + 6] = mm_pick<12, 0x00030003u>(w[u], magic); P[8 * u + 7] = mm_pick<14, 0x00030003u>(w[u], magic);
        }
    } else if constexpr (BITS == 3) { /* units of 3 bytes at 0, 3 (pairs 0..7) and 6, 9 (pairs 8..15) */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const uint32_t a = w[q], b = w[q + 1];
            const uint32_t X = __byte_perm(a, b, q ? 0x6532 : 0x4310), Y = __byte_perm(a, b, q ? 0x7643 : 0x5421);
            P[8 * q + 0] = mm_pick<0, 0x00070007u>(X, magic);  P[8 * q + 1] = mm_pick<3, 0x00070007u>(X, magic);
            P[8 * q + 2] = mm_pick<6, 0x00070007u>(X, magic);  P[8 * q + 3] = mm_pick<9, 0x00070007u>(X, magic);
            P[8 * q + 4] = mm_pick<12, 0x00070007u>(X, magic); P[8 * q + 5] = mm_pick<7, 0x00070007u>(Y, magic);
            P[8 * q + 6] = mm_pick<10, 0x00070007u>(Y, magic); P[8 * q + 7] = mm_pick<13, 0x00070007u>(Y, magic);
        }
    } else if constexpr (BITS == 6) { /* units of 3 bytes at 6q, 6q + 3: pairs 4q..4q+3 */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int w0 = (6 * q) >> 2;
            const uint32_t a = w[w0], b = w[w0 + 1];
            const uint32_t X = __byte_perm(a, b, q & 1 ? 0x6532 : 0x4310), Y = __byte_perm(a, b, q & 1 ? 0x7643 : 0x5421);
            P[4 * q + 0] = mm_pick<0, 0x003F003Fu>(X, magic); P[4 * q + 1] = mm_pick<6, 0x003F003Fu>(X, magic);
            P[4 * q + 2] = mm_pick<4, 0x003F003Fu>(Y, magic); P[4 * q + 3] = mm_pick<10, 0x003F003Fu>(Y, magic);
        }
    } else { /* 5: units of 5 bytes at 0, 5 (pairs 0..7) and 10, 15 (pairs 8..15); window k = bytes k, k+1 of both */
        static_assert(BITS == 5, "Q2 / Q3 / Q5 / Q6 / Q8");
        const uint32_t s1 = __funnelshift_r(w[0], w[1], 16), s2 = __funnelshift_r(w[1], w[2], 16); /* bytes 2-5, 6-9 */
        const uint32_t t1 = __funnelshift_r(w[2], w[3], 16), t2 = __funnelshift_r(w[3], w[4], 16); /* 10-13, 14-17 */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const uint32_t K0 = q ? __byte_perm(t1, t2, 0x6510) : __byte_perm(w[0], w[1], 0x6510);
            const uint32_t K1 = q ? __byte_perm(t1, t2, 0x7621) : __byte_perm(w[0], w[1], 0x7621);
            const uint32_t K2 = q ? __byte_perm(w[3], w[4], 0x6510) : __byte_perm(s1, s2, 0x6510);
            const uint32_t K3 = q ? __byte_perm(w[3], w[4], 0x7621) : __byte_perm(s1, s2, 0x7621);
            P[8 * q + 0] = mm_pick<0, 0x001F001Fu>(K0, magic);  P[8 * q + 1] = mm_pick<5, 0x001F001Fu>(K0, magic);
            P[8 * q + 2] = mm_pick<10, 0x001F001Fu>(K0, magic); P[8 * q + 3] = mm_pick<7, 0x001F001Fu>(K1, magic);
            P[8 * q + 4] = mm_pick<4, 0x001F001Fu>(K2, magic);  P[8 * q + 5] = mm_pick<9, 0x001F001Fu>(K2, magic);
            P[8 * q + 6] = mm_pick<6, 0x001F001Fu>(K3, magic);  P[8 * q + 7] = mm_pick<11, 0x001F001Fu>(K3, magic);
        }
    }
}

/* Q2 / Q3 / Q5 / Q6: the lane's 8·BITS bytes of a row's double step (8-byte aligned; Q2 / Q6 16) into the words
 * of its even (e) and odd (o) step. Cached in L1: the four lanes' pieces of a row share sectors */
template <int BITS> __device__ __forceinline__ void mm_ldw2(const uint8_t *p, MmWn<BITS> &e, MmWn<BITS> &o) {
    uint32_t v[2 * BITS];
    if constexpr (BITS == 2 || BITS == 6) {
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) {
            const uint4 u = __ldg((const uint4 *)p + i);
            v[4 * i] = u.x; v[4 * i + 1] = u.y; v[4 * i + 2] = u.z; v[4 * i + 3] = u.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < BITS; i++) {
            const uint2 u = __ldg((const uint2 *)p + i);
            v[2 * i] = u.x; v[2 * i + 1] = u.y;
        }
    }
#pragma unroll
    for (int i = 0; i < BITS; i++) { e.v[i] = v[i]; o.v[i] = v[BITS + i]; }
}

/* Σx of each (step, group) of the slice into xs: one float4 per thread and round, then a fixed xor tree over the
 * CG/4 consecutive lanes of a group (CG/4 = 8, 16 or 32 divides the warp); whole warps take part in every round
 * (the bound is rounded up to 32). XR (XP1, Q8X): Σx of the bf16-rounded x the MMAs see, so FOLD's 128·s·Σx cancels
 * their 128s exactly (with the f32 x's sum the bf16 rounding errors came back times 128·s: ~4 % rel L2 at Q4, 16 % at
 * Q2, against the bf16 x's own 0.17 %; gemv_xr.cu's rows always summed the rounded x). Returns the thread's max |x|
 * (of the values summed; mm_stage_q8x's scale) */
template <int CPS, int GPS, bool TAIL, bool XR, class TF>
__device__ __forceinline__ float mm_group_sums(float *xs, const float *x, int st0, int ns, int nin, TF nx) {
    constexpr int CG = CPS / GPS, L = CG / 4;
    const int nf = ns * CPS / 4, nfw = (nf + 31) & ~31;
    auto xr = [](float v) { return XR ? __bfloat162float(__float2bfloat16_rn(v)) : v; };
    float am = 0.0f;
    for (int f = threadIdx.x; f < nfw; f += blockDim.x) {
        float e = 0.0f;
        if (f < nf && (!TAIL || st0 * CPS + 4 * f < nin)) {
            const float4 v = __ldg((const float4 *)(x + (size_t)st0 * CPS) + f);
            const size_t k = (size_t)st0 * CPS + 4 * (size_t)f;
            const float a0 = xr(nx(v.x, k)), a1 = xr(nx(v.y, k + 1)), a2 = xr(nx(v.z, k + 2)), a3 = xr(nx(v.w, k + 3));
            e = (a0 + a1) + (a2 + a3);
            if constexpr (XR) am = fmaxf(am, fmaxf(fmaxf(fabsf(a0), fabsf(a1)), fmaxf(fabsf(a2), fabsf(a3))));
        }
#pragma unroll
        for (int o = 1; o < L; o <<= 1) e += __shfl_xor_sync(0xffffffffu, e, o);
        if ((f & (L - 1)) == 0 && f < nf) xs[f / L] = e;
    }
    return am;
}

/* stage x for steps st0 .. st0+ns-1 (x: the activation row): the B fragments — entry (step, MMA,
 * column tile, lane (g', t')) is part c % 3 of the x pair of (step, MMA, t') when column c = 8·tile + g'
 * belongs to the group of lane t''s bytes (groups use columns 3γ..3γ+2), else 0, so every MMA's B load
 * is one unconditional 8-byte load per lane — into tbl, and Σx per step group into xs */
struct MmAsIs { /* mm_stage's default: x staged as it is */
    __device__ __forceinline__ float operator()(float v, size_t) const { return v; }
};
/* XP = 1 (Q4, the plain bf16 mode: gemv_mma.cu's XP1): x rounded to bf16, one column per (step of the
 * chunk of S, group), so a chunk's S·GPS <= 8 groups share one MMA tile and are folded once per chunk
 * (mm_fold1): column c = (sl % S)·GPS + γ */
/* rot (gemv_mma.cu's TERN_CUDA_MM_ROT, on by default): a thread's 8 stores of an entry row go in the order gg = (k + m) & 7, so
 * that one store instruction of a warp (8 MMAs m x 4 lanes tt) hits 16 distinct 8-byte slots of a 128-byte row (two
 * wavefronts) instead of 4 (the same gg of every m: 8-way bank conflicts, ncu: 71 % of the stores' wavefronts); the
 * same table */
template <int BITS, int GB, int S, bool TAIL = false, int XP = 3, class TF = MmAsIs>
__device__ __forceinline__ void mm_stage(uint2 *tbl, float *xs, const float *x, int st0, int ns, int nin,
                                         TF nx = TF{}, bool rot = false) {
    /* nx(x[k], k): the value staged for input k (gemv_mma.cu: the pre-norm, and the residual add before it) */
    constexpr int GPS = GB >= 64 ? 1 : 64 / GB;   /* groups per step */
    static_assert(XP == 3 || (XP == 1 && BITS != 8 && S * GPS <= 8), "one x part: not Q8, a chunk's groups in 8 columns");
    static_assert(XP == 1 || BITS == 4 || BITS == 8, "the other widths: XP1 only");
    static_assert(!TAIL || BITS == 4, "TAIL: Q4 (moe_mma.cu)");
    constexpr int NCOL = XP == 1 ? 8 : 3 * GPS, NT = (NCOL + 7) / 8;
    constexpr int CPS = mm_cps<BITS>();           /* inputs per step */
    constexpr int CPW = 32 / BITS;                /* codes per word (Q4, Q8) */
    for (int it = threadIdx.x; it < ns * 32; it += blockDim.x) {
        const int sl = it >> 5, m = (it >> 2) & 7, tt = it & 3;
        const int i = m >> 1, j = 2 * (m & 1);
        const float *xw = x + (size_t)(st0 + sl) * CPS + (tt * 4 + i) * CPW;
        float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f; /* nibbles j, j+4 (register 2m) and j+1, j+5 (register 2m+1) */
        if constexpr (mm_ds<BITS>()) { /* pairs 2m, 2m+1 of the lane's 32 codes of the step (mm_plo, mm_lb) */
            const float *xb = x + (size_t)(st0 + (sl & ~1)) * CPS + tt * 64 + (sl & 1) * 32; /* st0 is even */
            const size_t k = (size_t)(xb - x);
            constexpr int dp = mm_pdp<BITS>();
            const int l0 = mm_plo<BITS>(2 * m), l1 = mm_plo<BITS>(2 * m + 1);
            v0 = nx(xb[l0], k + l0); v1 = nx(xb[l0 + dp], k + l0 + dp); v2 = nx(xb[l1], k + l1); v3 = nx(xb[l1 + dp], k + l1 + dp);
        } else if (!TAIL || (st0 + sl) * CPS + tt * 4 * CPW < nin) {
            const size_t k = (size_t)(xw - x);
            if constexpr (BITS == 4) {
                v0 = nx(xw[j], k + j); v1 = nx(xw[j + 4], k + j + 4); v2 = nx(xw[j + 1], k + j + 1); v3 = nx(xw[j + 5], k + j + 5);
            } else {
                v0 = nx(xw[j >> 1], k + (j >> 1)); v1 = nx(xw[2 + (j >> 1)], k + 2 + (j >> 1)); v2 = 16.0f * v0; v3 = 16.0f * v1;
            }
        }
        const int gt = GPS == 1 ? 0 : tt * 16 / GB, sm = sl * 8 + m;
        if constexpr (XP == 1) {
            const __nv_bfloat162 ha = __floats2bfloat162_rn(v0, v1), hb = __floats2bfloat162_rn(v2, v3);
            /* the group's place in the chunk (a double step's lane pieces: 256 · (its place in the chunk) + 64 tt +
             * 32 (odd step) codes into it; groups of 2·GB codes) */
            const int col = mm_ds<BITS>() ? (((sl % S) >> 1) * 256 + tt * 64 + (sl & 1) * 32) / (2 * GB) : (sl % S) * GPS + gt;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int gg = rot ? (k + m) & 7 : k;
                tbl[sm * 32 + gg * 4 + tt] = gg == col ? make_uint2(*(const uint32_t *)&ha, *(const uint32_t *)&hb)
                                                       : make_uint2(0u, 0u);
            }
            continue;
        }
        uint32_t pa[3], pb[3];
        mm_split(v0, v1, pa);
        mm_split(v2, v3, pb);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int gg = rot ? (k + m) & 7 : k, c = nt * 8 + gg, p = c % 3;
                const bool on = c < NCOL && c / 3 == gt;
                tbl[(sm * NT + nt) * 32 + gg * 4 + tt] =
                    on ? make_uint2(p == 0 ? pa[0] : p == 1 ? pa[1] : pa[2], p == 0 ? pb[0] : p == 1 ? pb[1] : pb[2])
                       : make_uint2(0u, 0u);
            }
    }
    mm_group_sums<CPS, GPS, TAIL, XP == 1>(xs, x, st0, ns, nin, nx);
}

/* Q8X (gemv_mma.cu: Q8 on XP1's walk, f16 MMAs): lane t of a 128-code step holds codes 16t..16t+15 (words 0..3)
 * and 64+16t..64+16t+15 (words 4..7), two 16-byte loads of 64 contiguous bytes a row each; word i's pairs are codes
 * (4i', 4i'+2) and (4i'+1, 4i'+3) of its run. x is the bf16-rounded row (the mode's x) times 2^-e, e such that the
 * slice's max |x| lands in [2^13, 2^14): exact in f16 (11 significant bits, normal down to 2^-14 of that), so the
 * products are exact and D·2^e (the fold's dsc) is XP1's sum. Pass 1 Σx per group of the rounded x (as mm_stage's
 * XP1) and the slice's max |x| (a block reduction: every thread of the block calls this), pass 2 the B table.
 * Returns dsc = 2^e. */
/* Q8X's exponent e for a max |x| of am: am·2^-e lands in [2^13, 2^14) (inf / NaN rows stay unscaled: their sums are
 * not finite anyway); gemv_xr.cu's several rows take it per row */
__device__ __forceinline__ int mm_q8x_exp(float am) {
    int ex = 0;
    if (am > 0.0f && am <= 3.0e38f) { /* am < 2^ex */
        frexpf(am, &ex);
        ex = max(-100, min(100, ex - 14));
    }
    return ex;
}

template <int GB, int S, class TF = MmAsIs>
__device__ __forceinline__ float mm_stage_q8x(uint2 *tbl, float *xs, const float *x, int st0, int ns, TF nx = TF{}) {
    constexpr int GPS = GB >= 64 ? 1 : 64 / GB; /* groups of 2·GB codes */
    static_assert(S * GPS <= 8, "a chunk's groups in 8 columns");
    __shared__ float mx[8];
    auto xr = [](float v) { return __bfloat162float(__float2bfloat16_rn(v)); };
    float am = mm_group_sums<128, GPS, false, true>(xs, x, st0, ns, 0, nx);
#pragma unroll
    for (int o = 16; o; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    if ((threadIdx.x & 31) == 0) mx[threadIdx.x >> 5] = am;
    __syncthreads();
    am = fmaxf(fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3])), fmaxf(fmaxf(mx[4], mx[5]), fmaxf(mx[6], mx[7])));
    const int ex = mm_q8x_exp(am);
    const float sc = ldexpf(1.0f, -ex);
    for (int it = threadIdx.x; it < ns * 32; it += blockDim.x) {
        const int sl = it >> 5, m = (it >> 2) & 7, tt = it & 3;
        const int pos = (m < 4 ? 16 * tt + 4 * m : 64 + 16 * tt + 4 * (m - 4)); /* word m's first code in the step */
        const size_t k = (size_t)(st0 + sl) * 128 + pos;
        const float *xw = x + k;
        const float v0 = xr(nx(xw[0], k)) * sc, v1 = xr(nx(xw[2], k + 2)) * sc, v2 = xr(nx(xw[1], k + 1)) * sc,
                    v3 = xr(nx(xw[3], k + 3)) * sc;
        const __half2 ha = __floats2half2_rn(v0, v1), hb = __floats2half2_rn(v2, v3);
        const int col = ((sl % S) * 128 + pos) / (2 * GB);
#pragma unroll
        for (int gg = 0; gg < 8; gg++)
            tbl[(sl * 8 + m) * 32 + gg * 4 + tt] = gg == col ? make_uint2(*(const uint32_t *)&ha, *(const uint32_t *)&hb)
                                                             : make_uint2(0u, 0u);
    }
    return ldexpf(1.0f, ex);
}

/* the MMAs of step sl (of the slice) of a warp's 16 rows: per word pair i and half h, one MMA per
 * column tile nt into d[nt·4 ..] against the staged table tl ([step][8 MMAs][NT][lane]) */
template <bool FOLD, int NT>
__device__ __forceinline__ void mm_mmas(float *d, const uint32_t *wa, const uint32_t *wc, const uint2 *tl, int sl,
                                        uint32_t magic) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t ra[4], rc[4];
        mm_decode<FOLD>(wa[i], magic, ra);
        mm_decode<FOLD>(wc[i], magic, rc);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint2 bv = tl[((sl * 8 + 2 * i + h) * NT + nt) * 32];
                mm_mma(d + 4 * nt, ra[2 * h], rc[2 * h], ra[2 * h + 1], rc[2 * h + 1], bv.x, bv.y);
            }
    }
}

/* step sl of a warp's 16 rows (lane: rows g and g+8, words wa and wc, the step's packed scales and
 * biases of both rows): D[row][c] is group c/3's Σ q·x_part; fold acc += s·D (zero columns take any
 * scale) and, once per row and group, acc += b·Σx. tl: the staged table plus the lane, xs: Σx */
template <int GPS, bool F16S, bool FOLD>
__device__ __forceinline__ void mm_step(float &acc0, float &acc1, const uint32_t *wa, const uint32_t *wc,
                                        typename SVec<GPS>::T cs0, typename SVec<GPS>::T cb0,
                                        typename SVec<GPS>::T cs1, typename SVec<GPS>::T cb1, const uint2 *tl,
                                        const float *xs, int sl, uint32_t magic, int t) {
    constexpr int NCOL = 3 * GPS, NT = (NCOL + 7) / 8;
    float d[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
    mm_mmas<FOLD, NT>(&d[0][0], wa, wc, tl, sl, magic);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int gi = min((nt * 8 + 2 * t + q) / 3, GPS - 1);
            acc0 = fmaf(mm_sget<GPS, F16S>(cs0, gi), d[nt][q], acc0);
            acc1 = fmaf(mm_sget<GPS, F16S>(cs1, gi), d[nt][2 + q], acc1);
        }
    if (t < GPS) { /* b·Σx once per row and group */
        const float xg = xs[sl * GPS + t];
        if constexpr (FOLD) {
            acc0 = fmaf(fmaf(-128.0f, mm_sget<GPS, F16S>(cs0, t), mm_sget<GPS, F16S>(cb0, t)), xg, acc0);
            acc1 = fmaf(fmaf(-128.0f, mm_sget<GPS, F16S>(cs1, t), mm_sget<GPS, F16S>(cb1, t)), xg, acc1);
        } else {
            acc0 = fmaf(mm_sget<GPS, F16S>(cb0, t), xg, acc0);
            acc1 = fmaf(mm_sget<GPS, F16S>(cb1, t), xg, acc1);
        }
    }
}

/* XP1: the MMAs of step sl (of the slice) of a warp's 16 rows into the chunk's tile d (column = the
 * group's slot in the chunk, see mm_stage); no fold here */
template <bool FOLD>
__device__ __forceinline__ void mm_mmas1(float *d, const uint32_t *wa, const uint32_t *wc, const uint2 *tl, int sl,
                                         uint32_t magic) {
    mm_mmas<FOLD, 1>(d, wa, wc, tl, sl, magic);
}

/* XP1, Q2 / Q3 / Q5 / Q6 / Q8X: the 8 MMAs of step sl of a warp's 16 rows (lane words wa: row g, wc: row g+8)
 * into the chunk's tile d; FOLD's pairs (128 + code; Q8X f16 1024 + code). NT column tiles (gemv_xr.cu's several
 * x rows) into d[nt·4 ..] against the table [step][8 MMAs][NT][lane] */
template <int BITS, int NT = 1>
__device__ __forceinline__ void mm_mmas_w(float *d, const uint32_t *wa, const uint32_t *wc, const uint2 *tl, int sl,
                                          uint32_t magic) {
    uint32_t pa[16], pc[16];
    mm_decode_w<BITS>(wa, magic, pa);
    mm_decode_w<BITS>(wc, magic, pc);
#pragma unroll
    for (int m = 0; m < 8; m++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint2 bv = tl[((sl * 8 + m) * NT + nt) * 32];
            mm_mma<BITS == 8>(d + 4 * nt, pa[2 * m], pc[2 * m], pa[2 * m + 1], pc[2 * m + 1], bv.x, bv.y);
        }
}

/* XP1: fold a chunk's tile once: lane t holds columns 2t, 2t+1 (groups G0 + 2t, G0 + 2t + 1 of the
 * chunk) of rows g (d[0], d[1]) and g+8 (d[2], d[3]); s0/b0/s1/b1: those groups' scales and biases of
 * both rows as packed pairs (low half = column 2t); xg0, xg1: the two columns' Σx; nsc: the chunk's
 * steps (the last chunk may be short) */
template <int GPS, int S, bool F16S, bool FOLD, int OFF = 128, bool SC = false>
__device__ __forceinline__ void mm_fold1x(float &acc0, float &acc1, const float *d, uint32_t s0, uint32_t b0,
                                          uint32_t s1, uint32_t b1, float xg0, float xg1, int nsc, int t,
                                          float dsc = 1.0f) {
    /* OFF: the codes' offset FOLD folds into the bias (Q8X 1024); SC: D is of x·2^-e, dsc = 2^e */
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int c = 2 * t + q;
        if (c >= S * GPS || c / GPS >= nsc) continue;
        const float xg = q ? xg1 : xg0;
        const float sa = mm_scale<F16S>(q ? s0 >> 16 : s0 & 0xffffu), sb = mm_scale<F16S>(q ? s1 >> 16 : s1 & 0xffffu);
        float ba = mm_scale<F16S>(q ? b0 >> 16 : b0 & 0xffffu), bb = mm_scale<F16S>(q ? b1 >> 16 : b1 & 0xffffu);
        if constexpr (FOLD) { ba = fmaf(-(float)OFF, sa, ba); bb = fmaf(-(float)OFF, sb, bb); }
        acc0 = fmaf(ba, xg, fmaf(SC ? sa * dsc : sa, d[q], acc0));
        acc1 = fmaf(bb, xg, fmaf(SC ? sb * dsc : sb, d[2 + q], acc1));
    }
}

/* the same with Σx of the columns from the staged xs ([slice step][GPS]; c0: the chunk's first step) */
template <int GPS, int S, bool F16S, bool FOLD, int OFF = 128, bool SC = false>
__device__ __forceinline__ void mm_fold1(float &acc0, float &acc1, const float *d, uint32_t s0, uint32_t b0,
                                         uint32_t s1, uint32_t b1, const float *xs, int c0, int nsc, int t,
                                         float dsc = 1.0f) {
    const int c = min(2 * t, S * GPS - 2); /* columns past the chunk are not folded: any entry serves */
    mm_fold1x<GPS, S, F16S, FOLD, OFF, SC>(acc0, acc1, d, s0, b0, s1, b1, xs[c0 * GPS + c], xs[c0 * GPS + c + 1], nsc, t,
                                           dsc);
}


/* ---- the int8 mode (--compute int8 on a GPU; gemv_mma.cu's XI8, Q4 only) ----
 * x is quantized per weight group as the CPU's int8 kernels do (gemv_avx512.c): d = max|x|/127,
 * xq = rint(x/d) clamped to ±127, and codes meet it in mma.sync m16n8k32 u8·s8 → s32 (exact integer
 * sums). Per group y += s·(d·Σq·xq + 8·(Σx − d·Σxq)) + b·Σx, the CPU's midpoint form (code midpoint
 * C = 8), so |y − y_exact| ≤ ½ Σ_g d_g·Σ|s_g|·|q − 8| as there. A word's codes are two A registers:
 * w & 0x0F0F0F0F (nibbles 0, 2, 4, 6 as bytes: k-slots 4t..4t+3) and (w >> 4) & 0x0F0F0F0F (nibbles
 * 1, 3, 5, 7: k-slots 4t+16..4t+19); one MMA per word of rows g and g+8 (4 per step). Columns as XP1:
 * (step of the chunk)·GPS + group, folded once per chunk.
 * Staging: pass 1, per group, Σx, d, e = 8·(Σx − d·Σxq) and 1/d (xs, xd, xe, xi: [J·S][GPS]);
 * pass 2 the B table [step][MMA i][lane] of xq bytes (k-slots as above, zero outside the column). */
template <int GB, int S, class TF = MmAsIs>
__device__ __forceinline__ void mm_stage_i8(uint2 *tbl, float *xs, float *xd, float *xe, float *xi, const float *x,
                                            int st0, int ns, TF nx = TF{}) {
    constexpr int GPS = 64 / GB, CG = 128 / GPS, L = CG / 4; /* groups per step, inputs per group, lanes per group */
    static_assert(S * GPS <= 8, "a chunk's groups in 8 columns");
    const int nf = ns * 128 / 4, nfw = (nf + 31) & ~31;
    for (int f = threadIdx.x; f < nfw; f += blockDim.x) { /* pass 1: L consecutive lanes hold a group */
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (f < nf) {
            const size_t k = (size_t)st0 * 128 + 4 * (size_t)f;
            const float4 u = __ldg((const float4 *)(x + k));
            v[0] = nx(u.x, k); v[1] = nx(u.y, k + 1); v[2] = nx(u.z, k + 2); v[3] = nx(u.w, k + 3);
        }
        float am = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
        float e = (v[0] + v[1]) + (v[2] + v[3]);
#pragma unroll
        for (int o = 1; o < L; o <<= 1) {
            am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
            e += __shfl_xor_sync(0xffffffffu, e, o);
        }
        const float d = am / 127.0f, inv = am > 0.0f ? 127.0f / am : 0.0f;
        int sq = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) sq += max(-127, min(127, __float2int_rn(v[q] * inv)));
#pragma unroll
        for (int o = 1; o < L; o <<= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if ((f & (L - 1)) == 0 && f < nf) {
            xs[f / L] = e;
            xd[f / L] = d;
            xe[f / L] = 8.0f * (e - d * (float)sq);
            xi[f / L] = inv;
        }
    }
    __syncthreads(); /* pass 2 reads every group's d */
    for (int it = threadIdx.x; it < ns * 16; it += blockDim.x) {
        const int sl = it >> 4, i = (it >> 2) & 3, tt = it & 3;
        const size_t k = (size_t)(st0 + sl) * 128 + (tt * 4 + i) * 8; /* the word's 8 inputs */
        const int gt = GPS == 1 ? 0 : tt * 16 / GB, grp = sl * GPS + gt;
        const float inv = xi[grp]; /* pass 1's: the same integers as its Σxq */
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const int q = max(-127, min(127, __float2int_rn(nx(x[k + n], k + n) * inv)));
            const uint32_t b = (uint32_t)(q & 0xff) << (8 * (n >> 1));
            if (n & 1) hi |= b; else lo |= b;
        }
        const int col = (sl % S) * GPS + gt;
#pragma unroll
        for (int gg = 0; gg < 8; gg++)
            tbl[((size_t)sl * 4 + i) * 32 + gg * 4 + tt] = gg == col ? make_uint2(lo, hi) : make_uint2(0u, 0u);
    }
}

__device__ __forceinline__ void mm_imma(int *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* XI8: the 4 MMAs of step sl (of the slice) into the chunk's integer tile */
__device__ __forceinline__ void mm_mmas_i8(int *d, const uint32_t *wa, const uint32_t *wc, const uint2 *tl, int sl) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint2 bv = tl[(sl * 4 + i) * 32];
        mm_imma(d, wa[i] & 0x0F0F0F0Fu, wc[i] & 0x0F0F0F0Fu, (wa[i] >> 4) & 0x0F0F0F0Fu, (wc[i] >> 4) & 0x0F0F0F0Fu, bv.x,
                bv.y);
    }
}

/* XI8: fold a chunk's integer tile once (lane t: columns 2t, 2t+1 of rows g and g+8; s/b pairs as
 * mm_fold1's) */
template <int GPS, int S, bool F16S>
__device__ __forceinline__ void mm_fold_i8(float &acc0, float &acc1, const int *d, uint32_t s0, uint32_t b0, uint32_t s1,
                                           uint32_t b1, const float *xs, const float *xd, const float *xe, int c0,
                                           int nsc, int t) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int c = 2 * t + q;
        if (c >= S * GPS || c / GPS >= nsc) continue;
        const int gi = c0 * GPS + c;
        const float xg = xs[gi], dg = xd[gi], eg = xe[gi];
        const float sa = mm_scale<F16S>(q ? s0 >> 16 : s0 & 0xffffu), sb = mm_scale<F16S>(q ? s1 >> 16 : s1 & 0xffffu);
        const float ba = mm_scale<F16S>(q ? b0 >> 16 : b0 & 0xffffu), bb = mm_scale<F16S>(q ? b1 >> 16 : b1 & 0xffffu);
        acc0 = fmaf(sa, fmaf(dg, (float)d[q], eg), fmaf(ba, xg, acc0));
        acc1 = fmaf(sb, fmaf(dg, (float)d[2 + q], eg), fmaf(bb, xg, acc1));
    }
}

#endif
