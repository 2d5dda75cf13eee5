/*
 * kvq_attn.cu — paged attention over compressed KV pages (F16, BF16, affine 8/4-bit,
 * TurboQuant; any mix of K and V formats, layout in ops/kvq.h), prefill and split-K decode.
 *
 * Same plan as the f32 kernel in attention.cu: a block owns R rows of one KV slot times HB
 * query heads of one KV-head group, walks the visible keys in tiles of T positions with an
 * online softmax in exact f32, and (decode: too few blocks to fill the GPU) cuts the key range
 * into `splits` pieces merged by a second kernel. What differs is the tile load: each K/V
 * record of the tile is read once from the pool and decoded into f32 shared memory (chunks of 4
 * elements, 8 for TurboQuant codes), then used by all R*HB queries of the block (GQA reuse).
 *
 * TurboQuant: keys are kept rotated (ŷ = scale·C[q], y = R·x), so the block rotates its queries
 * once (sign flip, the reference's Walsh–Hadamard butterflies, 1/√P) and dots them with ŷ over
 * P = rot_dim coordinates; values are accumulated rotated and each query's accumulator is
 * un-rotated once at the end (attention is linear in V), before the split-K partials are
 * written, so the merge is the plain one. Decoded values equal tern_kvq_decode's bitwise
 * (products/sums with _rn intrinsics); results differ from the reference (attention over the
 * decoded cache) by f32 summation order and the rotation's rounding, ~1e-7 relative.
 *
 * CUDA graphs: while a step is recorded the grid is planned without host positions (one row
 * per tile, split count for the whole context), exactly like attention.cu.
 * Bidirectional spans (rows->vis_lo/vis_hi): the same union mask as attention.cu; a span step
 * is never recorded (recording one marks the capture bad).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kvq_common.cuh"
#include "backend/cuda/attn_tile.cuh"

#include <math.h>

extern "C" {
#include "ops/kvq.h"
}

struct QAttnArgs {
    float *out;
    const float *q;
    const int32_t *pos, *slot;
    const int32_t *vlo, *vhi;      /* span ranges [n] or NULL */
    int n, nh, nkv, d, G, dk, dv;
    const uint8_t *kp, *vp;
    size_t kb, vb;                 /* record bytes */
    int kkind, kbits, kgroup, vkind, vbits, vgroup;
    const float *rot;              /* [P] signs (TURBO) */
    const int32_t *bt;
    int max_blocks, bs, window;
    float scale, softcap;
    int R, HB, T, splits, hsplit;
    float *part;
};

/* Decode elements [i0, i0 + CH) of a record into dst: CH = 4 for float/affine kinds, 8 codes
 * for TURBO (rotated-space values). Values equal tern_kvq_decode / decode_rotated bitwise. */
__device__ __forceinline__ void dec_chunk(int kind, int bits, int group, int d, const uint8_t *rec, int i0,
                                          const float *cb, float *dst) {
    switch (kind) {
    case TERN_KV_F32: {
        const float4 v = __ldg((const float4 *)(rec + 4 * (size_t)i0));
        dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
        break;
    }
    case TERN_KV_F16: case TERN_KV_BF16: {
        const uint2 w = __ldg((const uint2 *)(rec + 2 * (size_t)i0));
        const uint32_t h[4] = {w.x & 0xffffu, w.x >> 16, w.y & 0xffffu, w.y >> 16};
        for (int j = 0; j < 4; j++) dst[j] = kind == TERN_KV_F16 ? kvq_f16_to_f32(h[j]) : __uint_as_float(h[j] << 16);
        break;
    }
    case TERN_KV_AFFINE: {
        const int ng = d / group;
        const uint8_t *codes = rec + (size_t)ng * 4;
        const uint32_t w = bits == 8 ? ld_u32(codes + i0) : ld_u16(codes + i0 / 2);
        int gcur = -1;
        float sc = 0.0f, mn = 0.0f;
        for (int j = 0; j < 4; j++) {
            const int gi = (i0 + j) / group;
            if (gi != gcur) {
                gcur = gi;
                sc = kvq_f16_to_f32(ld_u16(rec + (size_t)gi * 2));
                mn = kvq_f16_to_f32(ld_u16(rec + (size_t)ng * 2 + (size_t)gi * 2));
            }
            const uint32_t q = (w >> (j * bits)) & ((1u << bits) - 1u);
            dst[j] = __fadd_rn(__fmul_rn(sc, (float)q), mn);
        }
        break;
    }
    case TERN_KV_TURBO: {
        const float scale = __uint_as_float(ld_u32(rec));
        const uint8_t *c = rec + 4 + (size_t)i0 * bits / 8;
        const uint32_t w = bits == 4 ? ld_u32(c) : bits == 2 ? ld_u16(c)
                                                             : (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16;
        const uint32_t mask = (1u << bits) - 1u;
        for (int j = 0; j < 8; j++) dst[j] = __fmul_rn(scale, cb[(w >> (j * bits)) & mask]);
        break;
    }
    default:
        for (int j = 0; j < 4; j++) dst[j] = 0.0f;
        break;
    }
}

__global__ void __launch_bounds__(256) kvq_attn_kernel(QAttnArgs a) {
    pdl_start();
    extern __shared__ float sm[];
    const int QV = a.R * a.HB, d = a.d, dk = a.dk, dv = a.dv, T = a.T, tid = threadIdx.x, nt = blockDim.x;
    float *qs = sm, *acc = qs + QV * dk, *Ks = acc + QV * dv, *Vs = Ks + T * (dk + 1), *S = Vs + T * dv;
    float *M = S + QV * T, *cbk = M + 3 * QV, *cbv = cbk + 16; /* M, L, AL (AtQ), the codebooks */
    const AtQ q = {M, (int *)(cbv + 16), QV};                 /* qpos, qlo, qvlo, qvhi */
    __shared__ int range[2];
    const bool kt = a.kkind == TERN_KV_TURBO, vt = a.vkind == TERN_KV_TURBO;

    const int row0 = blockIdx.x * a.R;
    const int g = blockIdx.y / a.hsplit, h0 = (blockIdx.y % a.hsplit) * a.HB;
    const int slot = a.slot[row0];
    if (tid < 16) {
        cbk[tid] = kt && tid < (1 << a.kbits) ? k_kvq_cb[(1 << a.kbits) - 4 + tid] : 0.0f;
        cbv[tid] = vt && tid < (1 << a.vbits) ? k_kvq_cb[(1 << a.vbits) - 4 + tid] : 0.0f;
    }
    at_rows(a, q, QV, row0, h0, tid, nt);
    for (int idx = tid; idx < QV * dk; idx += nt) {
        const int qv = idx / dk, i = idx % dk, ri = qv / a.HB, hi = qv % a.HB, r = row0 + ri;
        const bool ok = r < a.n && h0 + hi < a.G && i < d;
        float x = ok ? a.q[((size_t)r * a.nh + g * a.G + h0 + hi) * d + i] : 0.0f;
        qs[idx] = kt && ok ? __fmul_rn(x, a.rot[i]) : x;
    }
    for (int idx = tid; idx < QV * dv; idx += nt) acc[idx] = 0.0f;
    if (kt) { /* q -> R·q, once per block */
        kvq_fwht_block(qs, QV, dk, dk);
        const float inv = __fdiv_rn(1.0f, __fsqrt_rn((float)dk));
        for (int idx = tid; idx < QV * dk; idx += nt) qs[idx] = __fmul_rn(qs[idx], inv);
    }
    __syncthreads();
    if (tid == 0) at_range(a, q, QV, T, range);
    __syncthreads();
    const int lo = range[0], hi = range[1];
    const int chk = kt ? 8 : 4, chv = vt ? 8 : 4, nck = dk / chk, ncv = dv / chv;
    const int32_t *btrow = a.bt + (size_t)slot * a.max_blocks;

    for (int kb = lo; kb <= hi; kb += T) {
        __syncthreads(); /* previous tile's PV is done with Ks/Vs/S */
        for (int idx = tid; idx < T * (nck + ncv); idx += nt) {
            const bool isv = idx >= T * nck;
            const int j = isv ? idx - T * nck : idx, nc = isv ? ncv : nck, t = j / nc, c = j % nc, kpos = kb + t;
            const int ch = isv ? chv : chk;
            float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (kpos <= hi && kpos / a.bs < a.max_blocks) {
                const int blk = btrow[kpos / a.bs];
                if (blk >= 0) {
                    const size_t rec = ((size_t)blk * a.bs + kpos % a.bs) * a.nkv + g;
                    if (isv) dec_chunk(a.vkind, a.vbits, a.vgroup, d, a.vp + rec * a.vb, c * ch, cbv, x);
                    else dec_chunk(a.kkind, a.kbits, a.kgroup, d, a.kp + rec * a.kb, c * ch, cbk, x);
                }
            }
            float *dst = isv ? Vs + t * dv + c * ch : Ks + t * (dk + 1) + c * ch;
            for (int e = 0; e < ch; e++) dst[e] = x[e];
        }
        __syncthreads();
        at_tile(a, q, QV, T, dk, dv, kb, hi, btrow, qs, Ks, Vs, S, acc, tid, nt);
    }
    __syncthreads();
    if (vt) kvq_fwht_block(acc, QV, dv, dv); /* Rᵀ: butterflies, then 1/√P and the signs below */
    const float inv = vt ? __fdiv_rn(1.0f, __fsqrt_rn((float)dv)) : 1.0f;
    for (int idx = tid; idx < QV * d; idx += nt) {
        const int qv = idx / d, i = idx % d, ri = qv / a.HB, hi2 = qv % a.HB, r = row0 + ri;
        if (r >= a.n || h0 + hi2 >= a.G) continue;
        float val = acc[qv * dv + i];
        if (vt) val = __fmul_rn(__fmul_rn(val, inv), a.rot[i]);
        at_store(a, q, qv, i, r, g * a.G + h0 + hi2, val);
    }
}

extern "C" void tern__cuda_kvq_init(tern__cuda *c) {
    cudaFuncSetAttribute(kvq_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(c->smem_optin - 1024));
    cudaGetLastError();
}

static void kvq_attn_rows(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap);

extern "C" void tern__cuda_attention_q(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                       const tern_kv_layer *kv, float scale, float softcap) {
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    const bool kt = kv->kf.kind == TERN_KV_TURBO, vt = kv->vf.kind == TERN_KV_TURBO;
    const size_t kb = tern_kvq_vec_bytes(&kv->kf, d), vb = tern_kvq_vec_bytes(&kv->vf, d);
    if (n <= 0 || nh <= 0 || nkv <= 0 || nh % nkv || d <= 0 || d % 4 || d > 512 || !kb || !vb ||
        ((kt || vt) && (!kv->rot || kv->rot_dim != tern_kvq_rot_dim(d)))) {
        if (n > 0)
            tern_log(TERN_LOG_ERROR, "cuda attention (compressed KV): unsupported nh %d nkv %d d %d K kind %d V kind %d",
                     nh, nkv, d, kv->kf.kind, kv->vf.kind);
        return;
    }
    if (tern__cuda_attn_is_decode(c, rows) && tern__cuda_attn_decode_q(c, out, q, rows, nh, kv, scale, softcap)) return;
    if (kv->kf.kind == TERN_KV_BF16 && kv->vf.kind == TERN_KV_BF16) /* prefill runs: attn_prefill.cu's flash kernel */
        tern__cuda_attn_runs(c, out, q, rows, nh, kv, scale, softcap, kvq_attn_rows);
    else
        kvq_attn_rows(c, out, q, rows, nh, kv, scale, softcap);
}

/* the general kernel over any page kinds (the arguments checked by tern__cuda_attention_q) */
static void kvq_attn_rows(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap) {
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    const bool kt = kv->kf.kind == TERN_KV_TURBO, vt = kv->vf.kind == TERN_KV_TURBO;
    const size_t kb = tern_kvq_vec_bytes(&kv->kf, d), vb = tern_kvq_vec_bytes(&kv->vf, d);
    cudaSetDevice(c->device);
    QAttnArgs a = {};
    a.out = out;
    a.q = q;
    a.pos = rows->pos;
    a.slot = rows->slot;
    a.vlo = rows->vis_lo && rows->vis_hi ? rows->vis_lo : NULL;
    a.vhi = a.vlo ? rows->vis_hi : NULL;
    if (a.vlo && c->capturing) c->capture_bad = 1; /* span steps run eagerly, never from a graph */
    a.n = n;
    a.nh = nh;
    a.nkv = nkv;
    a.d = d;
    a.G = nh / nkv;
    a.dk = kt ? kv->rot_dim : d;
    a.dv = vt ? kv->rot_dim : d;
    a.kp = (const uint8_t *)kv->k;
    a.vp = (const uint8_t *)kv->v;
    a.kb = kb;
    a.vb = vb;
    a.kkind = kv->kf.kind;
    a.kbits = kv->kf.bits;
    a.kgroup = kv->kf.group;
    a.vkind = kv->vf.kind;
    a.vbits = kv->vf.bits;
    a.vgroup = kv->vf.group;
    a.rot = kv->rot;
    a.bt = kv->block_table;
    a.max_blocks = kv->max_blocks;
    a.bs = kv->block_size;
    a.window = kv->window;
    a.scale = scale;
    a.softcap = softcap;
    const int dm = a.dk > a.dv ? a.dk : a.dv;
    a.T = dm <= 128 ? 64 : dm <= 256 ? 32 : 16;
    const int qvmax = 8192 / dm < 8 ? 8 : 8192 / dm;
    a.HB = a.G < qvmax ? a.G : qvmax;
    a.hsplit = (a.G + a.HB - 1) / a.HB;
    tern__cuda_attn_plan(c, rows, kv, n, nh, d, a.T, qvmax, a.HB, a.hsplit, a.vlo != NULL, &a.R, &a.splits);
    const int tiles = (n + a.R - 1) / a.R;
    a.part = c->part;
    const int QV = a.R * a.HB;
    const size_t smem = sizeof(float) * ((size_t)QV * a.dk + (size_t)QV * a.dv + (size_t)a.T * (a.dk + 1) +
                                         (size_t)a.T * a.dv + (size_t)QV * a.T + 3 * (size_t)QV + 32) +
                        sizeof(int) * 4 * QV;
    if (smem + 1024 > c->smem_optin) {
        tern_log(TERN_LOG_ERROR, "cuda attention (compressed KV): %zu bytes of shared memory needed (d %d)", smem, d);
        return;
    }
    dim3 grid((unsigned)tiles, (unsigned)(nkv * a.hsplit), (unsigned)a.splits);
    tern_launch(c->stream, kvq_attn_kernel, grid, 256, smem, a);
    tern__cuda_check(c, "attention (compressed KV)");
    if (a.splits > 1) {
        tern__cuda_attn_merge(c, out, n * nh, d, a.splits, "attention merge (compressed KV)");
    }
}
