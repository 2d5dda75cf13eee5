/*
 * qgemm.cu — batched matmul (n >= 2 rows) on tensor cores that reads every weight tile once,
 * in its stored format: BF16, F16 and MLX affine Q (bits 2,3,4,5,6,8; groups 32/64/128; F32/F16/
 * BF16 scales and biases). bf16 compute mode only; the f32 mode never comes here.
 *
 * y[n, out] = x[n, in] · W[out, in]ᵀ with mma.sync m16n8k16 (bf16 in, f32 accumulate): the MMA's
 * M = weight rows, N = activation rows, K = inputs. A block of 8 warps owns 128 weight rows and
 * BN = 8·NT activation rows; each warp owns 16 weight rows and all BN columns (NT f32 fragments).
 * K advances in blocks of 128. Inside a K block, lane (g = lane/4, t = lane%4) decodes the 32
 * consecutive inputs [32t, 32t+32) of weight rows g and g+8: one contiguous vector load per row
 * (bits words for Q, 64 bytes for F16/BF16; a run of 32 never crosses a scale group). The MMA's
 * k-slots are a permutation of the inputs (any permutation works if A and B agree): at step s
 * (0..7) slots 2t,2t+1 hold inputs 32t+4s+{0,1} and slots 2t+8,2t+9 inputs 32t+4s+{2,3}, so the
 * B fragment of step pair (s, s+1) is one 16-byte read of x from shared memory.
 *
 * Accuracy = the bf16x2 compute mode's contract (gemm.c): x = xh + xl, W = Wh + Wl (Wl = 0 for
 * BF16, exact for F16), y = Wh·xh + Wh·xl + Wl·xh with f32 accumulation — an f32-like bound; in
 * the bf16 mode, weights not flagged precise take Wh·xh only (a third of the MMAs).
 * x is converted to the (hi, lo) pair while the block stages it (double-buffered shared memory,
 * 16-byte chunks xor-swizzled so both the stores and the fragment reads are conflict-free);
 * weight words sit in a register ring of 2-3 K blocks, so 1-2 blocks of loads are in flight while
 * one is multiplied (three only for n <= 16 and narrow codes, where bytes per block are few).
 * Too few blocks for the GPU (small out) -> split K over grid.y into the backend's `part`
 * scratch and a fixed-order reduction (deterministic). Other shapes/dtypes return 0 and the
 * caller takes the GEMV / cuBLASLt paths. TERN_QGEMM=0 in the environment turns the kernel off
 * (before/after comparisons of whole models). Measured on the H200: bench/NOTES.md.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemm_frag.cuh"

#include <stdlib.h>

/* Row-count limits (bench_cuda --batched sets them to compare paths): above them gemm.c (cuBLASLt)
 * is faster on the H200 — since the plain bf16 mode and the 8-codes-per-thread dequantize (session
 * 6, NOTES (o)): BF16 weights from n = 16, Q weights from n = 128 (qgemm still wins at 64). */
extern "C" int tern__cuda_qgemm_max_n_q, tern__cuda_qgemm_max_n_bf16;
int tern__cuda_qgemm_max_n_q = 64; /* H200, q4 plain: dequantize + cuBLASLt wins from n = 128 (107.8 vs 157.9 us, 14336x4096) */
int tern__cuda_qgemm_max_n_bf16 = 8; /* H200: cuBLASLt wins from n = 16 (34.0 vs 46.0 us, 14336x4096) */
/* K is split until the grid has about split_mul x SM-count blocks (bench_cuda sweeps it) */
extern "C" int tern__cuda_qgemm_split_mul;
int tern__cuda_qgemm_split_mul = 2;
/* TERN_QGEMM_WAVE (session 76, default 1; 0: the fill rule alone): the 17..64-row instance (one block an SM) splits K
 * by tern__cuda_split_waves — Gemma 4's precise q / k of Q weights at 64 rows ran 160 blocks of 2 K blocks on 132 SMs
 * (gemma4-e4b q, 20 µs; ncu, NOTES (cj)) where 112 of 3 fill one wave. H100, session 76, with TERN_CUDA_QG4_WAVE=3,
 * one rep each at 64 sequences: gemma4-e4b q4 9503 → 9744 dec tok/s (+2.5 %), gemma4-26b-a4b q4 6085 → 6232 (+2.4 %),
 * the ids digests equal. -1 unread; tests set it */
extern "C" int tern__cuda_qgemm_wave;
int tern__cuda_qgemm_wave = -1;

struct QgArgs {
    const uint8_t *w, *s, *b; /* matrix e */
    size_t rb;                /* bytes per weight row */
    int out, in, gs_shift, sdtype;
    const float *x;
    int n;
    float *y;                 /* y, or partials [S][n][out] when S > 1 */
    int kb_per, nkb;
    int plain; /* bf16 mode (not bf16x2) and the weight is not precise: Wh·xh only (gemm.c) */
};

/* PL: the plain mode compiled in (q4/q8 only): no Wl half is computed at all (a.plain alone skips
 * its MMAs but the split of every dequantized weight stays in the instruction stream) */
template <int KIND, int NT, bool PL = false>
__global__ void __launch_bounds__(256, NT <= 2 ? 2 : 1) qgemm_kernel(QgArgs a) {
    pdl_start();
    constexpr int W = QgKind<KIND>::W, BN = NT * 8, XT = BN * 16 / 256; /* x chunks per thread */
    constexpr bool Q = QgKind<KIND>::Q, LO = KIND != 17 && !PL;
    extern __shared__ uint4 xs[]; /* [2 buffers][hi, lo][BN rows][16 chunks] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * QG_BM + warp * 16, n0 = blockIdx.z * BN;
    const int kb0 = blockIdx.y * a.kb_per, kb1 = min(kb0 + a.kb_per, a.nkb);
    const int r0 = min(row0 + g, a.out - 1), r1 = min(row0 + g + 8, a.out - 1);
    const size_t kstep = (size_t)W * 16; /* bytes per row per K block */
    const uint8_t *p0 = a.w + (size_t)r0 * a.rb + (size_t)t * W * 4, *p1 = a.w + (size_t)r1 * a.rb + (size_t)t * W * 4;
    const int ng = Q ? a.in >> a.gs_shift : 0;

    /* acc: Wh·xh; cor: the correction terms Wh·xl + Wl·xh in their own accumulators when
     * registers allow (NT = 2), so that consecutive MMAs do not wait on one another */
    constexpr int NC = NT <= 2 ? NT : 1;
    float acc[NT][4], cor[NC][4];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < NC; i++) cor[i][0] = cor[i][1] = cor[i][2] = cor[i][3] = 0.0f;

    /* x staging: task i -> row i/16, chunk i%16 (8 inputs) */
    float4 xr[XT][2];
    auto load_x = [&](int kb) {
#pragma unroll
        for (int j = 0; j < XT; j++) {
            const int i = threadIdx.x + j * 256, r = i >> 4, c = i & 15;
            if (n0 + r < a.n) {
                const float4 *src = (const float4 *)(a.x + (size_t)(n0 + r) * a.in + (size_t)kb * QG_KB + c * 8);
                xr[j][0] = __ldg(src);
                xr[j][1] = __ldg(src + 1);
            } else {
                xr[j][0] = xr[j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
    };
    auto store_x = [&](int buf) {
#pragma unroll
        for (int j = 0; j < XT; j++) {
            const int i = threadIdx.x + j * 256, r = i >> 4, c = i & 15;
            uint4 h, l;
            split2(xr[j][0].x, xr[j][0].y, h.x, l.x);
            split2(xr[j][0].z, xr[j][0].w, h.y, l.y);
            split2(xr[j][1].x, xr[j][1].y, h.z, l.z);
            split2(xr[j][1].z, xr[j][1].w, h.w, l.w);
            xs[((buf * 2 + 0) * BN + r) * 16 + swz(c, r)] = h;
            xs[((buf * 2 + 1) * BN + r) * 16 + swz(c, r)] = l;
        }
    };
    /* weight ring: slot u % D holds K block base + u; D - 1 blocks are in flight while one is
     * multiplied (more for narrow codes, whose blocks are few bytes) */
    constexpr int D = NT <= 2 && W <= 6 ? 3 : 2; /* slots; NT = 8 is bound by the MMAs, not by loads */
    uint32_t w0[D][W], w1[D][W];
    float s0[D], b0[D], s1[D], b1[D];
    auto load_w = [&](int kb, int u) {
        ld_words<W>(p0 + (size_t)kb * kstep, w0[u]);
        ld_words<W>(p1 + (size_t)kb * kstep, w1[u]);
        if constexpr (Q) {
            const int gc = (kb * QG_KB + 32 * t) >> a.gs_shift;
            s0[u] = load_s(a.s, a.sdtype, (size_t)r0 * ng + gc);
            b0[u] = load_s(a.b, a.sdtype, (size_t)r0 * ng + gc);
            s1[u] = load_s(a.s, a.sdtype, (size_t)r1 * ng + gc);
            b1[u] = load_s(a.b, a.sdtype, (size_t)r1 * ng + gc);
        } else {
            s0[u] = b0[u] = s1[u] = b1[u] = 0.0f;
        }
    };

    if (kb0 < kb1) {
        load_x(kb0);
        store_x(0);
    }
#pragma unroll
    for (int u = 0; u < D - 1; u++)
        if (kb0 + u < kb1) load_w(kb0 + u, u);
    __syncthreads();
    for (int base = kb0; base < kb1; base += D) {
#pragma unroll
        for (int u = 0; u < D; u++) {
            const int kb = base + u; /* the same for the whole block: barriers stay uniform */
            if (kb >= kb1) break;
            const int buf = (kb - kb0) & 1;
            const bool more = kb + 1 < kb1;
            if (kb + D - 1 < kb1) load_w(kb + D - 1, (u + D - 1) % D);
            if (more) load_x(kb + 1);
            const uint4 *xh = xs + (size_t)(buf * 2) * BN * 16, *xl = xh + BN * 16;
#pragma unroll
            for (int sp = 0; sp < 4; sp++) { /* step pair (2sp, 2sp+1): one 16-byte x read */
                uint32_t ah[2][4], al[2][4];
                frag_a<KIND>(w0[u], w1[u], s0[u], b0[u], s1[u], b1[u], 2 * sp, ah[0], al[0]);
                frag_a<KIND>(w0[u], w1[u], s0[u], b0[u], s1[u], b1[u], 2 * sp + 1, ah[1], al[1]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int r = nt * 8 + g, ph = swz(4 * t + sp, r);
                    const uint4 h = xh[r * 16 + ph], l = xl[r * 16 + ph];
                    float *cc = NT <= 2 ? cor[nt % NC] : acc[nt];
                    if (PL || a.plain) { /* uniform branch: Wh·xh only */
                        mma16816(acc[nt], ah[0], h.x, h.y);
                        mma16816(acc[nt], ah[1], h.z, h.w);
                        continue;
                    }
                    mma16816(acc[nt], ah[0], h.x, h.y);
                    mma16816(cc, ah[0], l.x, l.y);
                    mma16816(acc[nt], ah[1], h.z, h.w);
                    mma16816(cc, ah[1], l.z, l.w);
                    if constexpr (LO) {
                        mma16816(cc, al[0], h.x, h.y);
                        mma16816(cc, al[1], h.z, h.w);
                    }
                }
            }
            if (more) store_x(buf ^ 1);
            __syncthreads();
        }
    }

    if constexpr (NT <= 2) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] += cor[nt][i];
    }
    float *dst = a.y + (size_t)blockIdx.y * a.n * a.out; /* blockIdx.y = 0 when not split */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = row0 + g + (i >> 1) * 8, col = n0 + nt * 8 + 2 * t + (i & 1);
            if (row < a.out && col < a.n) dst[(size_t)col * a.out + row] = acc[nt][i];
        }
}

__global__ void qgemm_reduce(float *y, const float *part, size_t m, int S) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m; i += (size_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int k = 1; k < S; k++) s += part[(size_t)k * m + i];
        y[i] = s;
    }
}

static size_t smem_bytes(int nt) { return (size_t)2 * 2 * nt * 8 * 16 * 16; }

template <int KIND, bool PL = false> static void launch(cudaStream_t st, dim3 grid, int nt, const QgArgs &a) {
    if constexpr ((KIND == 4 || KIND == 8) && !PL)
        if (a.plain) return launch<KIND, true>(st, grid, nt, a);
    if (nt == 2) tern_launch(st, qgemm_kernel<KIND, 2, PL>, grid, 256, smem_bytes(2), a);
    else tern_launch(st, qgemm_kernel<KIND, 8, PL>, grid, 256, smem_bytes(8), a);
}

template <int KIND, bool PL = false> static void allow() {
    cudaFuncSetAttribute(qgemm_kernel<KIND, 8, PL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes(8));
    if constexpr ((KIND == 4 || KIND == 8) && !PL) allow<KIND, true>();
}

static unsigned g_smem_ready; /* bit d: the NT = 8 instances may use > 48 KB on device d */

/* Raised at backend open (tern__cuda_qgemm_init). It used to be raised at the first 17..64-row call only: where that
 * call came inside a step graph's recording (a Gemma 4 batch of <= 32 rows is recorded at first sight, and its q / k
 * projections, flagged precise, take this kernel), the kernel declined and the graph kept the fallback — the n-row
 * CUDA-core GEMV — for good: gemma4-e4b q4 at 32 sequences 10.2 ms a step against 7.3 at 64 (NOTES (av)). */
static int ensure_smem(tern__cuda *c) {
    return tern__cuda_attr_once(&g_smem_ready, c->device, c->capturing, [] {
        allow<2>(); allow<3>(); allow<4>(); allow<5>(); allow<6>(); allow<8>(); allow<16>(); allow<17>();
    });
}

extern "C" void tern__cuda_qgemm_init(tern__cuda *c) { ensure_smem(c); }

extern "C" int tern__cuda_qgemm(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    static int off = -1; /* TERN_QGEMM=0: the paths before this kernel (whole-model comparisons) */
    if (off < 0) off = tern__cuda_env_int("TERN_QGEMM", 1) == 0;
    if (off || c->compute != TERN_COMPUTE_BF16 || n < 2 || w->in % QG_KB != 0 || w->out < 1 || ((uintptr_t)x & 15)) return 0;
    int kind;
    switch (w->dtype) {
    case TERN_DT_Q:
        if (w->bits < 2 || w->bits > 8 || w->bits == 7) return 0;
        if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) return 0;
        if (n > tern__cuda_qgemm_max_n_q) return 0;
        kind = w->bits;
        break;
    case TERN_DT_F16: if (n > tern__cuda_qgemm_max_n_q) return 0; kind = 16; break;
    case TERN_DT_BF16: if (n > tern__cuda_qgemm_max_n_bf16) return 0; kind = 17; break;
    default: return 0;
    }
    const int nt = n <= 16 ? 2 : 8;
    if (nt == 8 && !ensure_smem(c)) return 0;
    QgArgs a;
    a.w = (const uint8_t *)w->data + (size_t)e * w->mat_bytes;
    a.s = w->scales ? (const uint8_t *)w->scales + (size_t)e * w->mat_bytes_s : NULL;
    a.b = w->biases ? (const uint8_t *)w->biases + (size_t)e * w->mat_bytes_s : NULL;
    a.rb = kind <= 8 ? (size_t)w->in * w->bits / 8 : (size_t)w->in * 2;
    a.out = w->out;
    a.in = w->in;
    a.gs_shift = w->group_size == 32 ? 5 : w->group_size == 64 ? 6 : 7;
    a.sdtype = w->sdtype;
    a.x = x;
    a.n = n;
    a.nkb = w->in / QG_KB;
    a.plain = !w->precise && !tern__cuda_bf16_split_all(c);
    /* split K until the grid covers the GPU about twice (partials must fit `part`) */
    const int mb = (w->out + QG_BM - 1) / QG_BM, nb = (n + nt * 8 - 1) / (nt * 8);
    const int mul = tern__cuda_qgemm_split_mul > 0 ? tern__cuda_qgemm_split_mul : 1;
    const long base = (long)mb * nb, target = (long)mul * (c->n_sm > 0 ? c->n_sm : 132);
    int S = base < target ? (int)((target + base - 1) / base) : 1;
    if (S > a.nkb / 2) S = a.nkb / 2;
    while (S > 1 && (size_t)S * n * w->out > TERN_CUDA_PART_FLOATS) S--;
    if (S < 1) S = 1;
    if (tern__cuda_qgemm_wave < 0) tern__cuda_qgemm_wave = tern__cuda_env_int("TERN_QGEMM_WAVE", 1) != 0;
    if (tern__cuda_qgemm_wave && nt == 8) /* one block an SM (208 registers): by waves, at most the slices above */
        S = tern__cuda_split_waves(base, c->n_sm > 0 ? c->n_sm : 132, a.nkb, S, 1);
    a.kb_per = (a.nkb + S - 1) / S;
    S = (a.nkb + a.kb_per - 1) / a.kb_per;
    a.y = S > 1 ? c->part : y;
    const dim3 grid((unsigned)mb, (unsigned)S, (unsigned)nb);
    switch (kind) {
    case 2: launch<2>(c->stream, grid, nt, a); break;
    case 3: launch<3>(c->stream, grid, nt, a); break;
    case 4: launch<4>(c->stream, grid, nt, a); break;
    case 5: launch<5>(c->stream, grid, nt, a); break;
    case 6: launch<6>(c->stream, grid, nt, a); break;
    case 8: launch<8>(c->stream, grid, nt, a); break;
    case 16: launch<16>(c->stream, grid, nt, a); break;
    default: launch<17>(c->stream, grid, nt, a); break;
    }
    tern__cuda_check(c, "qgemm");
    if (S > 1) {
        const size_t m = (size_t)n * w->out;
        const size_t blocks = (m + 255) / 256;
        tern_launch(c->stream, qgemm_reduce, (unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, y, c->part, m, S);
        tern__cuda_check(c, "qgemm_reduce");
    }
    return 1;
}
