/*
 * gemv_mma_args.cuh — the dense tensor-core Q GEMV's pieces around its walk (gemv_mma.cu; shared with
 * two variants that lost and were removed, gemv_ring.cu and gemv_flat.cu): the launch arguments, a lane's two rows of a warp tile, the
 * output store of each mode, x staging with the optional pre-norm / residual prologue, and the split-K
 * reduction by the last slice block of a row block. Include after cuda_common.cuh and gemv_mma.cuh.
 */
#ifndef TERN_GEMV_MMA_ARGS_CUH
#define TERN_GEMV_MMA_ARGS_CUH

#include "backend/cuda/rope_kv.cuh"
#include "backend/cuda/split_k.cuh"

#define MM_WARPS 8
#define MM_MINE 64   /* row blocks one block may walk (split K: it may have to reduce each) */
#define MM_JMAX 4    /* chunks of S steps per K slice */

struct MmArgs {
    const uint8_t *data[3], *scales[3], *biases[3];
    float *y[3];
    int out[3], nm, rows; /* rows: plain/RES = out[0]+out[1]+out[2]; pair = out[0] (outputs) */
    int in, ng, mode, ks;     /* ng groups per row, ks K slices (blockIdx.y) of J·S steps */
    int J;                    /* chunks of S steps per K slice (1..MM_JMAX; mm_chunks) */
    int rblocks;              /* row blocks (128 rows; pair: 64 outputs); gridDim.x <= rblocks walk them */
    const float *x;
    const float *nw; /* pre-norm (ops.h norm_matmul, xn != NULL): x staged as rmsnorm(x)·nw; the */
    float *xn;       /* blocks of blockIdx.x 0 write their slice of it to xn */
    float eps;
    const float *rh, *rw, *rs; /* with xn, norm_matmul's res: the pre-norm is of x' = (x + rmsnorm(rh)·rw)·rs, */
    float *rxo;                /* whose slices blocks of blockIdx.x 0 write to rxo */
    float *part; /* [ks][units] partials (pair: 2 per output) */
    int *cnt;
    int l2pf;       /* items of the walk each warp prefetches into L2 before pdl_wait (gemv_mma.cu) */
    int rmsu;       /* > 1: the pre-norm's sums load 8 elements a virtual thread at once (TERN_CUDA_GEMV_RMSU) */
    uint32_t magic; /* 0x43004300: the bf16 pair (128, 128), see mm_decode */
    tern__cuda_rope_kv rope; /* ROPE instances only (appended): rope_kv_write in the split-K epilogue */
    int rot; /* mm_stage's rotated table stores (TERN_CUDA_MM_ROT) */
};

/* the final value of one output unit (row of the concatenated matrices, or a pair output) of x row xr
 * (gemv_xr.cu's several rows: y row xr of matrix m at y[m] + xr·out[m], of a pair at y[0] + xr·rows) */
__device__ __forceinline__ void mm_store(const MmArgs &a, int unit, float v, float up, int xr = 0) {
    if (a.mode == G1_SILU || a.mode == G1_GELU) {
        a.y[0][(size_t)xr * a.rows + unit] = (a.mode == G1_SILU ? silu(v) : gelu_tanh(v)) * up; /* as gemv1 */
        return;
    }
    int m = 0;
    while (m < a.nm - 1 && unit >= a.out[m]) unit -= a.out[m++];
    float *yp = a.y[m] + (size_t)xr * a.out[m] + unit;
    *yp = a.mode == G1_RES ? *yp + v : v;
}

/* a lane's two rows of warp tile `tile`: units (row of the concatenated matrices, or pair output),
 * liveness, and the addresses of its bytes, scales and biases */
struct MmRows {
    const uint8_t *w0, *w1;
    const uint16_t *s0, *b0, *s1, *b1;
    int unit0, unit1;
    bool live0, live1;
};

__device__ __forceinline__ void mm_rows(const MmArgs &a, int tile, int g, int t, size_t rb, bool pair, MmRows &r,
                                        int lb = 16 /* the lane's bytes of a row step (mm_lb) */) {
    int unit[2], mat[2], lrow[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int u = pair ? tile * 8 + g : tile * 16 + g + 8 * h, m = pair ? h : 0;
        live[h] = u < a.rows;
        unit[h] = u;
        if (!live[h]) u = 0, m = 0; /* clamp: recompute a valid row, never written */
        if (!pair)
            while (m < a.nm - 1 && u >= a.out[m]) u -= a.out[m++];
        mat[h] = m;
        lrow[h] = u;
    }
    r.w0 = a.data[mat[0]] + (size_t)lrow[0] * rb + t * lb;
    r.w1 = a.data[mat[1]] + (size_t)lrow[1] * rb + t * lb;
    r.s0 = (const uint16_t *)a.scales[mat[0]] + (size_t)lrow[0] * a.ng;
    r.b0 = (const uint16_t *)a.biases[mat[0]] + (size_t)lrow[0] * a.ng;
    r.s1 = (const uint16_t *)a.scales[mat[1]] + (size_t)lrow[1] * a.ng;
    r.b1 = (const uint16_t *)a.biases[mat[1]] + (size_t)lrow[1] * a.ng;
    r.unit0 = unit[0]; r.unit1 = unit[1];
    r.live0 = live[0]; r.live1 = live[1];
}

/* XP1 / XI8: the scales and biases of the lane's two chunk groups G + 2t, G + 2t + 1 (NC: the chunk's
 * groups; clamped inside the row where not live, those columns are never folded) for rows g and g+8,
 * packed low = column 2t: q = {s0, b0, s1, b1} */
__device__ __forceinline__ void mm_pair_scales(const MmRows &r, int G, int t, int NC, int ng, uint32_t *q) {
    const int c = min(2 * t, NC - 2), G1 = min(G + c + 1, ng - 1), G0 = min(G + c, G1);
    q[0] = __ldg(r.s0 + G0) | (uint32_t)__ldg(r.s0 + G1) << 16;
    q[1] = __ldg(r.b0 + G0) | (uint32_t)__ldg(r.b0 + G1) << 16;
    q[2] = __ldg(r.s1 + G0) | (uint32_t)__ldg(r.s1 + G1) << 16;
    q[3] = __ldg(r.b1 + G0) | (uint32_t)__ldg(r.b1 + G1) << 16;
}

/* unit u's slices summed in slice order (L2 loads of other blocks' partials, several in flight: a
 * volatile load per slice waited ~L2 latency each, 28 slices at in = 14336), then stored; partials
 * [slice][x row of n][units] (one row: n = 1, xr = 0) */
__device__ __forceinline__ void mm_sum_slices(const MmArgs &a, int u, bool pair, int units, int xr = 0, int n = 1) {
    float v = 0.f, up = 0.f;
#pragma unroll 4
    for (int s = 0; s < a.ks; s++) {
        const float *qq = a.part + ((size_t)s * n + xr) * units;
        if (pair) { v += __ldcg(qq + 2 * u); up += __ldcg(qq + 2 * u + 1); }
        else v += __ldcg(qq + u);
    }
    mm_store(a, u, v, up, xr);
}

/* split K: the block's partials are out; the last slice block of a row block sums its slices in order */
__device__ __forceinline__ void mm_claim(const MmArgs &a, int *mine, int *nmine) { /* the row blocks this block sums */
    if (threadIdx.x == 0) *nmine = 0;
    __syncthreads(); /* tern_arrive: the block's partial stores before the counts */
    for (int q = blockIdx.x + threadIdx.x * gridDim.x; q < a.rblocks; q += blockDim.x * gridDim.x)
        if (tern_arrive(a.cnt + q) == a.ks - 1) mine[atomicAdd(nmine, 1)] = q;
    __syncthreads();
}
__device__ __forceinline__ void mm_reduce_slices(const MmArgs &a, bool pair, int units, int *mine, int *nmine) {
    mm_claim(a, mine, nmine);
    const int per = pair ? 64 : 128;
    for (int k = 0; k < *nmine; k++) {
        const int q = mine[k], u0 = q * per;
        for (int i = threadIdx.x; i < per; i += blockDim.x) {
            const int u = u0 + i;
            if (u >= a.rows) break;
            mm_sum_slices(a, u, pair, units);
        }
        if (threadIdx.x == 0) a.cnt[q] = 0;
    }
}

/* mm_reduce_slices with rope_kv_write (ROPE instances, q|k|v of one row, rope_kv.cuh): the last slice block of a
 * row block sums its 128 rows' slices in the same order into shared memory, then thread i stores the rope pair
 * (i, i + d/2) of a q / k head (i % d < d/2) or the v rows (i, i + 1) (i even). Heads never straddle a row block
 * (d divides 128, and so do the q and k row counts: the launch checks). */
__device__ __forceinline__ void mm_reduce_rope(const MmArgs &a, const RopePage &pg, int units, int *mine, int *nmine) {
    __shared__ float rv[128];
    const int i = threadIdx.x, half = a.rope.d >> 1;
    /* thread i's rope dimension is i % d (d divides 128 and the q / k row counts): its inv_freq in flight during the
     * claim (pg, the page target: read before pdl_wait) */
    const float f = i < 128 && i % a.rope.d < half ? a.rope.inv_freq[i % a.rope.d] : 0.0f;
    mm_claim(a, mine, nmine);
    for (int k = 0; k < *nmine; k++) {
        const int q = mine[k], u = q * 128 + i;
        if (i < 128) {
            float v = 0.f;
#pragma unroll 4
            for (int s = 0; s < a.ks; s++) v += __ldcg(a.part + (size_t)s * units + u); /* mm_sum_slices' order */
            rv[i] = v;
        }
        __syncthreads();
        if (i < 128) {
            int m = 0, lr = u;
            while (m < a.nm - 1 && lr >= a.out[m]) lr -= a.out[m++];
            const int o = m < 2 ? half : 1;
            if (m < 2 ? lr % a.rope.d < half : !(lr & 1))
                rope_kv_put(a.rope, a.y, pg, m < 2 ? rope_rot_at(pg.pos, f) : RopeRot{}, m, lr, lr + o, rv[i], rv[i + o]);
        }
        __syncthreads();
        if (threadIdx.x == 0) a.cnt[q] = 0;
    }
}

/* a warp tile's sums of one row block are complete: reduce over the 4 lanes t of a row, then lane t = 0
 * stores (one K slice) or leaves its slice's partials in pp */
__device__ __forceinline__ void mm_finish(const MmArgs &a, float acc0, float acc1, int unit0, int unit1, bool live0,
                                          bool live1, bool pair, int t, float *pp) {
    mm_row_sums(acc0, acc1);
    if (t == 0) {
        if (a.ks == 1) {
            if (pair) {
                if (live0) mm_store(a, unit0, acc0, acc1);
            } else {
                if (live0) mm_store(a, unit0, acc0, 0.f);
                if (live1) mm_store(a, unit1, acc1, 0.f);
            }
        } else if (pair) {
            if (live0) { pp[2 * unit0] = acc0; pp[2 * unit0 + 1] = acc1; }
        } else {
            if (live0) pp[unit0] = acc0;
            if (live1) pp[unit1] = acc1;
        }
    }
}

/* stage x for the block's K slice (gemv_mma.cuh mm_stage), or its rmsnorm (every block sums the whole
 * row: bitwise norm.cu's), or first the residual add x' = (x + rmsnorm(h)·w)·s (norm_matmul's res:
 * rmsnorm_add's expression); blocks of blockIdx.x 0 write their slice of xn (and x'). No barrier. */
/* the scale groups of a K slice: the length of each of XI8's staged arrays (Σx, d, e, 1/d) */
template <int S, int GB> __device__ __forceinline__ int mm_slice_groups(const MmArgs &a) {
    return a.J * S * (GB >= 64 ? 1 : 64 / GB);
}

/* XP: 3 the exact three-part split, 1 one bf16 column (XP1), 8 int8 (XI8). Returns the D scale of Q8X's staging
 * (mm_stage_q8x), else 1 */
template <int BITS, int GB, int S, int XP>
__device__ __forceinline__ float mm_stage_x(const MmArgs &a, uint2 *tbl, float *xs, int st0, int ns) {
    constexpr int CPS = mm_cps<BITS, XP == 1>(); /* inputs per step */
    constexpr bool Q8X = BITS == 8 && XP == 1;
    float dsc = 1.0f;
    const int ng = mm_slice_groups<S, GB>(a); /* XP 8 (int8): Σx, d, e, 1/d per group of the slice */
    (void)ng;
    if (a.xn) {
        __shared__ float red[32];
        auto rms = [&](auto x) { return a.rmsu > 1 ? block_rms_inv<8>(x, a.in, a.eps, red) : block_rms_inv(x, a.in, a.eps, red); };
        const float ih = a.rh ? rms([&](int j) { return a.rh[j]; }) : 0.0f;
        const float sc = a.rs ? a.rs[0] : 1.0f;
        auto xp = [&](float xv, size_t k) { /* x'[k] from x[k] (x itself without res) */
            if (!a.rh) return xv;
            return res_add(xv, rms_scale(a.rh[k], ih, a.rw != nullptr, a.rw ? a.rw[k] : 0.0f), a.rs != nullptr, sc);
        };
        const float inv = rms([&](int j) { return xp(a.x[j], (size_t)j); });
        auto nx = [&](float xv, size_t k) { return rms_scale(xp(xv, k), inv, a.nw != nullptr, a.nw ? a.nw[k] : 0.0f); };
        if constexpr (XP == 8) mm_stage_i8<GB, S>(tbl, xs, xs + ng, xs + 2 * ng, xs + 3 * ng, a.x, st0, ns, nx);
        else if constexpr (Q8X) dsc = mm_stage_q8x<GB, S>(tbl, xs, a.x, st0, ns, nx);
        else mm_stage<BITS, GB, S, false, XP>(tbl, xs, a.x, st0, ns, a.in, nx, a.rot);
        if (blockIdx.x == 0)
            for (int k = st0 * CPS + threadIdx.x; k < min(a.in, (st0 + ns) * CPS); k += blockDim.x) {
                a.xn[k] = nx(a.x[k], (size_t)k);
                if (a.rh) a.rxo[k] = xp(a.x[k], (size_t)k);
            }
    } else if constexpr (XP == 8) {
        mm_stage_i8<GB, S>(tbl, xs, xs + ng, xs + 2 * ng, xs + 3 * ng, a.x, st0, ns);
    } else if constexpr (Q8X) {
        dsc = mm_stage_q8x<GB, S>(tbl, xs, a.x, st0, ns);
    } else {
        mm_stage<BITS, GB, S, false, XP>(tbl, xs, a.x, st0, ns, a.in, MmAsIs{}, a.rot);
    }
    return dsc;
}

/* gemv_mma.cu's launch plan and the arguments both walks share (matrices w[0..k) with expert indices e,
 * outputs y, rows, row blocks, K slices, chunks per slice, partials, counters) into *a: 0 when the
 * format or shape is not served (gemv_xr.cu plans its several-row launches with it: walk 0, one block per
 * row block and slice; walk 1: gemv_mma.cu's persistent walk, whose J mm_balance may change) */
int tern__cuda_mm_args(const tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                       const float *x, int mode, int walk, MmArgs *a);

#endif
