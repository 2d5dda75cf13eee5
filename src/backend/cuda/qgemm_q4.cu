/*
 * qgemm_q4.cu — MLX affine Q4 (groups 32/64/128, BF16 scales and biases) times 5..128 activation rows
 * (from 5: gemv_xr.cu below) in the plain bf16 mode, on tensor cores, with the weight and x tiles
 * streamed through a cp.async ring in shared memory. Batch decode's matmul (llama3-8b q4 at 64
 * sequences spent ~80 % of a step in qgemm.cu, which runs 85 µs on 14336x4096 at n = 64: 0.4 TB/s,
 * 90 TFLOP/s). qgemm keeps its weight
 * words in a register ring of two K blocks at one block of 8 warps per SM, so few bytes are in flight,
 * and decodes every code through f32 (extract, or with 2^23, subtract, FMA, convert).
 *
 * Here, per block of 8 warps × 16 weight rows (BM = 128) and BN = 8·NT activation rows, K advances in
 * tiles of 128 inputs through ST = 4 stages of shared memory (W: 128 rows × 64 bytes, x: BN rows ×
 * 256 bytes), three tiles in flight while one is multiplied; 2 blocks (3 at NT = 2) share an SM. The
 * weight tiles of the first stages are requested before pdl_wait (they do not depend on the previous
 * kernel). x is rounded to bf16 once per call by a small kernel into gemm_scratch, in an order that
 * matches the decode below: in every run of 8 inputs the pairs (0,4) (1,5) (2,6) (3,7).
 *
 * Decode (two codes per step, exact): ((w >> 4i) & 0x000F000F) | 0x43004300 is the bf16 pair
 * (128 + q_i, 128 + q_{i+4}); subtracting 128 (exact) leaves (q_i, q_{i+4}); one bf16x2 FMA with the
 * group's (s, s) and (b, b) gives bf16(s·q + b) rounded once — the plain mode's weight (qgemm rounds
 * fmaf(s, q, b) to bf16: the same value but where the f32 rounding lands on a bf16 tie). MMA
 * m16n8k16 (M = weight rows, N = x rows): lane (g, t) owns inputs 32t..32t+31 of rows g and g+8 of its
 * warp's 16 (one 16-byte shared read per row and tile); word sp of a row gives steps 2sp, 2sp+1:
 * k-slots 2t, 2t+1 = inputs (0, 4) and 2t+8, 2t+9 = (1, 5) of the word's 8, then (2, 6), (3, 7) —
 * the staged x's order, so one 16-byte read of x per column tile and word gives both steps' B
 * fragments (qgemm_frag.cuh's swizzle keeps those reads conflict-free).
 *
 * Forms (gemv1.cu's matmul_n / matmul_glu / matmul_add for n >= 2): up to three matrices sharing `in`
 * in one grid (q|k|v: grid.x runs over their row blocks), y += W·x, and act(gate)·up. Small grids split
 * K over blockIdx.y into `part`; qg4_reduce sums the slices in slice order (deterministic; the split
 * depends on the shape and n), adds the residual or applies act(gate)·up. TERN_CUDA_QG4=0 turns it off
 * (qgemm.cu and the separate ops run).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemm_frag.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qgemm_q4.cuh"

#define Q4_ST 4      /* shared-memory stages */
#define Q4_MAXN 128  /* rows served; above, dequantize + cuBLASLt is faster (H200, 14336x4096 at 256 rows:
                      * 122 vs 168 µs) */

extern "C" int tern__cuda_qg4_on, tern__cuda_qg4_max_n, tern__cuda_qg4_mul, tern__cuda_qg4_wave;
int tern__cuda_qg4_on = -1;            /* -1 unread (TERN_CUDA_QG4, default 1); tests set it */
int tern__cuda_qg4_max_n = Q4_MAXN;
int tern__cuda_qg4_mul = 0;            /* blocks per SM the K split aims at; 0: the kernel's occupancy */
/* the K split's wave rule (TERN_CUDA_QG4_WAVE): 0 never rounded, 1 rounded down to one wave always, 2 that at 17-32 rows;
 * 3 every launch but the direct pair by tern__cuda_split_waves; 4 (default since session 78) 3 from 17 rows (the wgmma
 * tiles), 0's rule at 5-16 (one wave lost there: session 68 below). H100, 3 against 2 (TMA default, TERN_QGEMM_WAVE=1),
 * dec tok/s at 32 / 64 sequences: llama3-8b q4 8041 / 12674 → 8085 / 13063 (+0.6 / +3.1 %), gemma4-12b q4 3498 / 5626 →
 * 3497 / 5682 (0 / +1.0 %), ids digests equal (session 78, NOTES (cl)); e4b / 26b-a4b q4 at 64 +2.5 / +2.4 % with
 * TERN_QGEMM_WAVE (session 76, NOTES (cj)) */
int tern__cuda_qg4_wave = 4;
/* TERN_CUDA_QG4_MINT: the fewest K tiles a block of the split walks; default (0) 2 where a wgmma-sized launch has one
 * column tile (17..64 rows), else the ring's stages (65..128 rows; the mma.sync kernel's 5..16). Gemma 4 E4B's matrices have K = 2560 (20 tiles), so at 4 the
 * split stops at 5 slices and its launches at 64 rows fill 100-120 of the 264 block slots; 2 lets it reach 10. H200,
 * session 75 (NOTES (ci)), MINT 4 → 2 for every launch: gemma4-e4b q4 at 32 / 64 / 128 sequences 5610 / 9472 / 12778
 * → 5782 / 9777 / 12312 dec tok/s (+3.1 / +3.2 / −3.6 %, two reps alike), gemma4-26b-a4b a tie (2921 / 6198 / 7530 →
 * 2921 / 6178 / 7555); llama3-8b's and gemma4-12b's launches at up to 64 rows split the same either way (their caps
 * do not bind). Other slices, so other partial sums */
extern "C" int tern__cuda_qg4_mint;
int tern__cuda_qg4_mint = 0;
/* TERN_CUDA_QG4_ST=6: six stages instead of four for up to 16 rows (NT = 2: 74 KB a block, 3 per SM), where
 * the kernel is bandwidth-bound at ~0.5 of the floor; written in session 15 after its last device call, for
 * an A/B (gpu_ab.sh section 14). -1 until read (tests set it) */
extern "C" int tern__cuda_qg4_st;
int tern__cuda_qg4_st = -1;
extern "C" unsigned long long tern__cuda_qg4_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_qg4_calls = 0;

/* x [n][in] f32 -> bf16 with every 8 inputs stored as the pairs (0,4) (1,5) (2,6) (3,7) */
__global__ void q4_stage_x(uint4 *xb, const float4 *x, size_t chunks) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < chunks; i += (size_t)gridDim.x * blockDim.x) {
        const float4 u = x[2 * i], v = x[2 * i + 1];
        uint4 o;
        o.x = bf2_bits(__floats2bfloat162_rn(u.x, v.x));
        o.y = bf2_bits(__floats2bfloat162_rn(u.y, v.y));
        o.z = bf2_bits(__floats2bfloat162_rn(u.z, v.z));
        o.w = bf2_bits(__floats2bfloat162_rn(u.w, v.w));
        xb[i] = o;
    }
}

/* NT: column tiles of 8 x rows per block; each warp: 16 weight rows over all NT tiles (32-row warp tiles over
 * half the columns, each shared x fragment feeding two MMAs, lost on the H200: llama3-8b q4 decode at 32 / 64
 * sequences 6068 / 8492 → 5032 / 7790 tok/s) */
template <int NT, int ST = Q4_ST>
__global__ void __launch_bounds__(256, NT == 2 ? 3 : 2) qg4_kernel(Q4Args a) {
    constexpr int BN = NT * 8, WCH = QG_BM * 4, XCH = BN * 16, STG = WCH + XCH; /* 16-byte chunks */
    extern __shared__ uint4 sm[]; /* [ST][W chunks | x chunks] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mi = a.k > 2 && (int)blockIdx.x >= a.m[2].mb0 ? 2 : a.k > 1 && (int)blockIdx.x >= a.m[1].mb0 ? 1 : 0;
    const uint8_t *const W = a.m[mi].w;
    const uint16_t *const Sc = a.m[mi].s, *const Bi = a.m[mi].b;
    const int out = a.m[mi].out;
    const int rowb = ((int)blockIdx.x - a.m[mi].mb0) * QG_BM, n0 = blockIdx.z * BN;
    const int kt0 = blockIdx.y * a.kt_per, nkt = min(a.kt_per, a.nkt - kt0);
    const int ra = min(rowb + warp * 16 + g, out - 1), rbw = min(rowb + warp * 16 + g + 8, out - 1);

    /* scales of tile kt for this lane's rows: (s | b << 16), row g and row g + 8 */
    uint32_t sbr[ST][2];
    auto load_sb = [&](int kt, int u) { q4_sb(sbr[u], a, Sc, Bi, ra, rbw, kt0 + kt, t); };
    auto load_w = [&](int kt, int u) { /* 512 chunks: 2 per thread */
        uint4 *dst = sm + u * STG;
#pragma unroll
        for (int j = 0; j < WCH / 256; j++) {
            const int c = threadIdx.x + j * 256, r = c >> 2, row = rowb + r;
            const uint8_t *src = W + (size_t)min(row, out - 1) * a.rb + (size_t)(kt0 + kt) * (QG_KB / 2) + (c & 3) * 16;
            mma_cp16(mma_smem_u32(dst + c), src, row < out);
        }
    };
    auto load_x = [&](int kt, int u) {
        uint4 *dst = sm + u * STG + WCH;
#pragma unroll
        for (int j = 0; j < (XCH + 255) / 256; j++) {
            const int c = threadIdx.x + j * 256;
            if (XCH % 256 == 0 || c < XCH) {
                const int r = c >> 4, ch = c & 15;
                const uint4 *src = a.x + ((size_t)min(n0 + r, a.n - 1) * a.in + (size_t)(kt0 + kt) * QG_KB) / 8 + ch;
                mma_cp16(mma_smem_u32(dst + r * 16 + swz(ch, r)), src, n0 + r < a.n);
            }
        }
    };

    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    auto tile = [&](int u) {
        const uint4 *ws = sm + u * STG, *xs = ws + WCH;
        const uint4 wa = ws[(warp * 16 + g) * 4 + t], wb = ws[(warp * 16 + g + 8) * 4 + t];
        const __nv_bfloat162 sa = q4_dup(sbr[u][0], false), ba = q4_dup(sbr[u][0], true);
        const __nv_bfloat162 sb = q4_dup(sbr[u][1], false), bb = q4_dup(sbr[u][1], true);
        /* the 8-column form (3 blocks an SM, 80 registers) keeps the immediate: the register spilled there */
        const uint32_t mg = NT == 2 ? 0x43004300u : a.magic;
#pragma unroll
        for (int sp = 0; sp < 4; sp++) {
            const uint32_t w0 = sp == 0 ? wa.x : sp == 1 ? wa.y : sp == 2 ? wa.z : wa.w;
            const uint32_t w1 = sp == 0 ? wb.x : sp == 1 ? wb.y : sp == 2 ? wb.z : wb.w;
            uint32_t a0[4], a1[4];
            a0[0] = q4_deq(w0, 0, sa, ba, mg); a0[1] = q4_deq(w1, 0, sb, bb, mg);
            a0[2] = q4_deq(w0, 1, sa, ba, mg); a0[3] = q4_deq(w1, 1, sb, bb, mg);
            a1[0] = q4_deq(w0, 2, sa, ba, mg); a1[1] = q4_deq(w1, 2, sb, bb, mg);
            a1[2] = q4_deq(w0, 3, sa, ba, mg); a1[3] = q4_deq(w1, 3, sb, bb, mg);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int r = nt * 8 + g;
                const uint4 h = xs[r * 16 + swz(4 * t + sp, r)];
                mma16816(acc[nt], a0, h.x, h.y);
                mma16816(acc[nt], a1, h.z, h.w);
            }
        }
    };
    q4_ring<ST, false>(nkt, load_w, load_x, load_sb, tile);
    /* direct: y (y += for G1_RES); else this slice's partials */
    qw_store<NT, false>(a, &acc[0][0], nullptr, mi, out, rowb, rowb + warp * 16, n0, warp, g, t);
}

/* the S slices of the partials summed in slice order into the outputs: matrix i's block of a slice
 * to y_i (+= for G1_RES), or for a pair act(Σ gate)·Σ up into y_0 */
__global__ void qg4_reduce(Q4Args a, int S) {
    pdl_start();
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const size_t m = pair ? a.m[1].poff : a.slice;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m; i += (size_t)gridDim.x * blockDim.x) {
        const float v = part_sum(a.part + i, a.slice, S);
        if (pair) {
            a.m[0].y[i] = (a.mode == G1_SILU ? silu(v) : gelu_tanh(v)) * part_sum(a.part + m + i, a.slice, S);
            continue;
        }
        const int mi = a.k > 2 && i >= a.m[2].poff ? 2 : a.k > 1 && i >= a.m[1].poff ? 1 : 0;
        float *p = a.m[mi].y + (i - a.m[mi].poff);
        *p = a.mode == G1_RES ? *p + v : v;
    }
}

/* qg4_reduce over S slices; what: the label of the launch check. Lost and removed in session 73 (H100, NOTES (cg)):
 * TERN_CUDA_QG4_RED (the slices' loads issued 8 at a time: llama3-8b q4 at 32 / 64 sequences -2.5 / -0.6 %) and
 * TERN_CUDA_QG4_LB (the tile's last slice block summing the split inside the GEMM instead of this launch: -24 % at 64;
 * that block's S serial L2 round trips sit on the end of every split launch) */
static void qg4_reduce_run(tern__cuda *c, const Q4Args &a, int S, const char *what) {
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const size_t m = pair ? a.m[1].poff : a.slice, rb = (m + 255) / 256;
    tern_launch(c->stream, qg4_reduce, (unsigned)(rb < 4096 ? rb : 4096), 256, 0, a, S);
    tern__cuda_check(c, what);
}

static size_t q4_smem(int nt, int st = Q4_ST) { return (size_t)st * (QG_BM * 4 + nt * 8 * 16) * 16; }

/* at open (gemv.cu's init, the device current): shared-memory limits of the instances */
template <int NT, int ST = Q4_ST> static void q4_attr() {
    cudaFuncSetAttribute(qg4_kernel<NT, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)q4_smem(NT, ST));
}
extern "C" int tern__cuda_qgemm_max_n_q, tern__cuda_qgemm_max_n_bf16; /* qgemm.cu */
extern "C" void tern__cuda_qg4_init(tern__cuda *c) {
    (void)c;
    /* The several-row paths' row limits as A/B switches (read at open; defaults unchanged): TERN_CUDA_QG4_MAX_N (this
     * kernel, Q4), TERN_CUDA_QGEMM_MAX_N_Q / _BF16 (qgemm.cu). Session 36 saw Gemma 4 batch decode slower at some row
     * counts than at more (gemma4-e4b q4: 10.2 ms a step at 32 rows, 7.3 at 64; bf16: 6.4 at 8, 5.7 at 32; NOTES (av)) */
    tern__cuda_qg4_max_n = tern__cuda_env_int("TERN_CUDA_QG4_MAX_N", tern__cuda_qg4_max_n);
    tern__cuda_qgemm_max_n_q = tern__cuda_env_int("TERN_CUDA_QGEMM_MAX_N_Q", tern__cuda_qgemm_max_n_q);
    tern__cuda_qgemm_max_n_bf16 = tern__cuda_env_int("TERN_CUDA_QGEMM_MAX_N_BF16", tern__cuda_qgemm_max_n_bf16);
    /* TERN_CUDA_QG4_MUL=M (session 66, an A/B knob): the K split aims at M blocks an SM instead of the kernel's
     * occupancy (fewer slices: fewer partials and blocks) */
    tern__cuda_qg4_mul = tern__cuda_env_int("TERN_CUDA_QG4_MUL", tern__cuda_qg4_mul);
    /* TERN_CUDA_QG4_WAVE (session 67): the split's slices rounded down to fit one wave (ncu of a 64-sequence
     * llama3-8b q4 step on an H100, NOTES (ca): down and q|k|v at 288 blocks for 264 slots). H100, session 68
     * (NOTES (cb)), dec tok/s off → on at 8 / 32 / 64 sequences: llama3-8b q4 2258 / 6929 / 11623 → 2009 / 7239 /
     * 11781, gemma4-12b q4 1093 / 3234 / 5291 → 1022 / 3325 / 5276: 2 takes it for the 4-fragment tile
     * (17-32 rows) only; 4 (the default) splits the wgmma tiles by waves instead (above) */
    tern__cuda_qg4_wave = tern__cuda_env_int("TERN_CUDA_QG4_WAVE", tern__cuda_qg4_wave);
    tern__cuda_qg4_mint = tern__cuda_env_int("TERN_CUDA_QG4_MINT", tern__cuda_qg4_mint);
    if (tern__cuda_qg4_mint < 0) tern__cuda_qg4_mint = 0; /* 0: the default rule */
    q4_attr<2>(); q4_attr<4>(); q4_attr<8>(); q4_attr<2, 6>();
    tern__cuda_qg4w_init();
    cudaGetLastError();
}

/* a.m[0..k) for matrix e of each stack w[i] (scales and biases where it has them) writing y[i]: its first row
 * block of QG_BM rows after the previous matrices' (mb0) and its [n][out] block after theirs in a slice of partials
 * (poff). Returns the row blocks; *rows = Σ out */
static int q4_mats(Q4Args &a, float *const *y, const tern__cuda_w *const *w, int k, int n, int e, size_t *rows) {
    int mb = 0;
    *rows = 0;
    for (int i = 0; i < k; i++) {
        Q4Mat &m = a.m[i];
        m.w = (const uint8_t *)w[i]->data + (size_t)e * w[i]->mat_bytes;
        m.s = w[i]->scales ? (const uint16_t *)((const uint8_t *)w[i]->scales + (size_t)e * w[i]->mat_bytes_s) : NULL;
        m.b = w[i]->biases ? (const uint16_t *)((const uint8_t *)w[i]->biases + (size_t)e * w[i]->mat_bytes_s) : NULL;
        m.y = y[i];
        m.out = w[i]->out;
        m.mb0 = mb;
        m.poff = (size_t)n * *rows;
        mb += (m.out + QG_BM - 1) / QG_BM;
        *rows += (size_t)m.out;
    }
    return mb;
}

/* y[i] (op) W_i·x for n rows of x and matrices w[0..k) (k <= 3, matrix e of each stack) sharing in and
 * the format; mode G1_PLAIN, G1_RES (y += W·x) or a pair (G1_SILU / G1_GELU: y[0] = act(W_0·x)·W_1·x).
 * 1 when it ran, 0 when not served (the caller runs its other paths). how: Q4_RUN (x in f32, staged here),
 * Q4_STAGED_OK (launch nothing: 1 where Q4_STAGED would run), Q4_STAGED (x already in gemm_scratch in the wgmma
 * kernel's order, q4w_stage_x's bytes: norm.cu's rmsnorm_q4s; x unused). parts (Q4_STAGED): the caller sums the K
 * slices itself — *parts = their count S in c->part (slices of n·Σout floats, matrix i's [n][out] block at n·Σ
 * the outs before it), 0 when the launch wrote y (one slice) */
enum { Q4_RUN, Q4_STAGED_OK, Q4_STAGED };
static int qg4_go(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, const float *x, int n, int mode,
                  int e, int how, int *parts = nullptr) {
    if (tern__cuda_qg4_on < 0) tern__cuda_qg4_on = tern__cuda_env_int("TERN_CUDA_QG4", 1) != 0;
    if (tern__cuda_qg4_st < 0) tern__cuda_qg4_st = tern__cuda_env_int("TERN_CUDA_QG4_ST", Q4_ST);
    if (!tern__cuda_qg4_on || n < 2 || n > tern__cuda_qg4_max_n || k < 1 || k > 3) return 0;
    if (c->compute != TERN_COMPUTE_BF16 || tern__cuda_bf16_split_all(c) || c->i8 || (how == Q4_RUN && ((uintptr_t)x & 15)))
        return 0;
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    if (pair && (k != 2 || w[0]->out != w[1]->out)) return 0;
    const tern__cuda_w *w0 = w[0];
    if ((w0->group_size != 32 && w0->group_size != 64 && w0->group_size != 128) || w0->in % QG_KB) return 0;
    for (int i = 0; i < k; i++)
        if (w[i]->dtype != TERN_DT_Q || w[i]->bits != 4 || w[i]->precise || w[i]->sdtype != TERN_DT_BF16 ||
            !w[i]->scales || !w[i]->biases || w[i]->in != w0->in || w[i]->group_size != w0->group_size ||
            w[i]->out < 1 || e >= w[i]->nmat)
            return 0;
    const size_t xbytes = (size_t)n * w0->in * 2;
    if (xbytes > c->gemm_scratch_bytes || (how == Q4_RUN && tern__cuda_in_scratch(c, x, (size_t)n * w0->in * 4)))
        return 0; /* x itself in the scratch */
    const int nt = n <= 16 ? 2 : n <= 32 ? 4 : 8;
    if (how != Q4_RUN && (nt < 4 || !tern__cuda_qg4w_on())) return 0; /* the staged order is the wgmma kernel's */
    Q4Args a = {};
    size_t rows;
    int mb = q4_mats(a, y, w, k, n, e, &rows);
    /* wgp: the wgmma kernel's pair form, a block per 64 rows of gate and of up, the whole K when that fills the
     * SMs (at 32-row tiles, memory-bound, the split wins: 32 sequences 6252 vs 5450 tok/s) */
    const bool wgp = pair && nt == 8 && tern__cuda_qg4w_pair();
    if (wgp) mb = (w0->out + 63) / 64;
    a.x = (const uint4 *)c->gemm_scratch;
    a.magic = 0x43004300u;
    a.part = c->part;
    a.rb = (size_t)w0->in / 2;
    a.slice = (size_t)n * rows;
    a.k = k;
    a.mode = mode;
    a.in = w0->in;
    a.n = n;
    a.gs_shift = w0->group_size == 32 ? 5 : w0->group_size == 64 ? 6 : 7;
    a.ng = w0->in >> a.gs_shift;
    a.nkt = w0->in / QG_KB;
    /* split K until the grid fills the SMs at the kernel's occupancy, at least `st` (its stages) tiles a
     * block; rounded down to one wave instead for 17-32 rows (TERN_CUDA_QG4_WAVE, at init). One wave for every
     * row count lost on the H200 in session 15: llama3-8b q4 decode at 8 / 16 / 64 sequences 2102 / 3884 / 8652 →
     * 1752 / 3317 / 8492 tok/s (the memory-bound row counts want the blocks) */
    const int nb = (n + nt * 8 - 1) / (nt * 8);
    const int st = nt == 2 && tern__cuda_qg4_st == 6 ? 6 : Q4_ST;
    int S = tern__cuda_qg4_split((long)mb * nb, nt, nb, a.nkt, a.slice, wgp, c->n_sm > 0 ? c->n_sm : 132,
                                 tern__cuda_qg4_mul, tern__cuda_qg4_wave, st, tern__cuda_qg4_mint, TERN_CUDA_PART_FLOATS);
    if ((size_t)S * a.slice > TERN_CUDA_PART_FLOATS && (pair || S > 1)) return 0;
    a.kt_per = (a.nkt + S - 1) / S;
    S = (a.nkt + a.kt_per - 1) / a.kt_per;
    a.direct = S == 1 && (!pair || wgp);
    if (how == Q4_STAGED_OK) return 1;
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)mb, (unsigned)S, (unsigned)nb);
    if (nt < 4 || !tern__cuda_qg4w_launch(c, a, grid, nt, how == Q4_STAGED ? NULL : x, xbytes, wgp)) {
        /* (above: qgemm_q4_wg.cu, TERN_CUDA_QG4_WG; here the mma.sync kernel) */
        const size_t chunks = xbytes / 16, blocks = (chunks + 255) / 256;
        tern_launch(c->stream, q4_stage_x, (unsigned)(blocks < 2048 ? blocks : 2048), 256, 0,
                    (uint4 *)c->gemm_scratch, (const float4 *)x, chunks);
        if (nt == 2 && st == 6) tern_launch(c->stream, qg4_kernel<2, 6>, grid, 256, q4_smem(2, 6), a);
        else if (nt == 2) tern_launch(c->stream, qg4_kernel<2>, grid, 256, q4_smem(2), a);
        else if (nt == 4) tern_launch(c->stream, qg4_kernel<4>, grid, 256, q4_smem(4), a);
        else tern_launch(c->stream, qg4_kernel<8>, grid, 256, q4_smem(8), a);
    }
    tern__cuda_check(c, "qgemm_q4");
    if (parts) *parts = a.direct ? 0 : S;
    else if (!a.direct) qg4_reduce_run(c, a, S, "qgemm_q4 reduce");
    tern__cuda_qg4_calls++;
    return 1;
}

extern "C" int tern__cuda_qg4_run(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, const float *x,
                                  int n, int mode, int e) {
    return qg4_go(c, y, w, k, x, n, mode, e, Q4_RUN);
}

/* cuda_internal.h: the pre-normed form (gemm.c's norm_matmul for many rows with TERN_CUDA_Q4_NORM) */
extern "C" int tern__cuda_qg4_staged(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, int n,
                                     int mode, int run, int *parts) {
    return qg4_go(c, y, w, k, NULL, n, mode, 0, run ? Q4_STAGED : Q4_STAGED_OK, run ? parts : nullptr);
}

/* cuda_internal.h: the several-row Q4 kernels in their order — gemv_xr.cu for the rows it serves (2..4 by
 * default; matrix 0 of a stack only), this file's kernel above */
extern "C" int tern__cuda_q4_rows(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, const float *x,
                                  int n, int mode, int e) {
    return (e == 0 && tern__cuda_gemv_xr_run(c, y, w, k, x, n, mode)) || tern__cuda_qg4_run(c, y, w, k, x, n, mode, e);
}
