/*
 * kvq_write.cu — kv_write for compressed KV pages on the GPU (F16, BF16, affine 8/4-bit,
 * TurboQuant 2..4 bits; byte layout in ops/kvq.h). The bytes written are the CPU encoder's
 * (tern_kvq_encode) exactly; tests/gpu/cuda_ops_tests_kvq.h compares them with memcmp.
 *
 * One block encodes one record: grid (rows x kv heads, 2) with blockIdx.y = 0 for K, 1 for V,
 * so the grid depends only on the step's row count (CUDA-graph safe; positions and slots are
 * read on the device, rows whose block-table entry is < 0 are skipped as on the CPU).
 *
 * How identity is kept where the obvious parallel code would round differently:
 *   - AFFINE: one thread scans each group in order (min/max keep the first of +0/-0 exactly as
 *     the reference's `<` / `>` scan does); scale/min/codes use _rn division and rintf (the
 *     reference's lrintf, round-to-nearest-even).
 *   - TURBO: the rotation is the reference's butterfly network (bitwise equal whatever thread
 *     runs which butterfly); the two double-precision sums (‖y‖² and Σ C[q]²) are
 *     order-dependent, so one thread adds them in index order like the reference — P dependent
 *     double adds (P <= 512 at the head dims the attention supports), a few microseconds.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kvq_common.cuh"

extern "C" {
#include "ops/kvq.h"
}

struct KvwArgs {
    uint8_t *pool[2];
    const float *src[2];
    size_t rb[2];
    int kind[2], bits[2], group[2];
    const int32_t *bt, *pos, *slot;
    int max_blocks, bs, nkv, d, P;
    const float *rot;
};

__device__ __forceinline__ float clamp_f16(float x) {
    if (!(x == x)) return 0.0f;
    return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x;
}

__device__ __forceinline__ void st_u16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v & 0xffu);
    p[1] = (uint8_t)(v >> 8);
}

/* shared scratch of one block */
struct KvwShared {
    float y[TERN_KVQ_MAX_ROT];
    float gsc[TERN_KVQ_MAX_ROT / 2], gmn[TERN_KVQ_MAX_ROT / 2];
    uint8_t qc[TERN_KVQ_MAX_ROT];
    double ss;
    float nrm, scale;
};

__device__ void encode_affine(KvwShared &sh, const float *x, uint8_t *rec, int d, int g, int b) {
    const int ng = d / g, qmax = (1 << b) - 1, tid = threadIdx.x, nt = blockDim.x;
    for (int gi = tid; gi < ng; gi += nt) {
        const float *xg = x + (size_t)gi * g;
        float mn = clamp_f16(xg[0]), mx = mn;
        for (int i = 1; i < g; i++) {
            const float v = clamp_f16(xg[i]);
            if (v < mn) mn = v;
            if (v > mx) mx = v;
        }
        const float sc = __fdiv_rn(__fsub_rn(mx, mn), (float)qmax);
        uint32_t hs = kvq_f32_to_f16(sc);
        if (kvq_f16_to_f32(hs) < sc) hs++; /* round the scale up, as the reference */
        const uint32_t hm = kvq_f32_to_f16(mn);
        sh.gsc[gi] = kvq_f16_to_f32(hs);
        sh.gmn[gi] = kvq_f16_to_f32(hm);
        st_u16(rec + (size_t)gi * 2, hs);
        st_u16(rec + (size_t)ng * 2 + (size_t)gi * 2, hm);
    }
    __syncthreads();
    uint8_t *codes = rec + (size_t)ng * 4;
    const int nbytes = d * b / 8, per = 8 / b;
    for (int j = tid; j < nbytes; j += nt) {
        uint32_t byte = 0;
        for (int k = 0; k < per; k++) {
            const int i = j * per + k, gi = i / g;
            const float scr = sh.gsc[gi], mnr = sh.gmn[gi];
            float q = scr > 0.0f ? rintf(__fdiv_rn(__fsub_rn(clamp_f16(x[i]), mnr), scr)) : 0.0f;
            q = q < 0.0f ? 0.0f : q > (float)qmax ? (float)qmax : q;
            byte |= (uint32_t)q << (k * b);
        }
        codes[j] = (uint8_t)byte;
    }
}

__device__ void encode_turbo(KvwShared &sh, const float *x, uint8_t *rec, int d, int P, int b, const float *rot) {
    const int tid = threadIdx.x, nt = blockDim.x, n = 1 << b;
    const float *cb = k_kvq_cb + (n - 4);
    for (int i = tid; i < P; i += nt) sh.y[i] = i < d ? __fmul_rn(x[i], rot[i]) : 0.0f;
    kvq_fwht_block(sh.y, 1, P, P);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn((float)P));
    for (int i = tid; i < P; i += nt) sh.y[i] = __fmul_rn(sh.y[i], inv);
    __syncthreads();
    if (tid == 0) { /* in index order: the reference's rounding of the double sum */
        double ss = 0.0;
        for (int i = 0; i < P; i++) ss = __dadd_rn(ss, __dmul_rn((double)sh.y[i], (double)sh.y[i]));
        sh.ss = ss;
        sh.nrm = __double2float_rn(__dsqrt_rn(ss));
    }
    __syncthreads();
    const float nrm = sh.nrm;
    if (nrm > 0.0f) { /* uniform branch */
        const float u_scale = __fdiv_rn(__fsqrt_rn((float)P), nrm);
        for (int i = tid; i < P; i += nt) {
            const float u = __fmul_rn(sh.y[i], u_scale);
            int q = 0;
            while (q + 1 < n && u > __fmul_rn(0.5f, __fadd_rn(cb[q], cb[q + 1]))) q++;
            sh.qc[i] = (uint8_t)q;
        }
        __syncthreads();
        if (tid == 0) {
            double cc = 0.0;
            for (int i = 0; i < P; i++) {
                const double c = (double)cb[sh.qc[i]];
                cc = __dadd_rn(cc, __dmul_rn(c, c));
            }
            const double ss = sh.ss;
            sh.scale = __double2float_rn(ss > 0.0 ? __dsqrt_rn(__ddiv_rn(ss, cc)) : 0.0);
        }
    } else {
        for (int i = tid; i < P; i += nt) sh.qc[i] = 0;
        if (tid == 0) sh.scale = (!(nrm == nrm) || nrm > 3.0e38f) ? __int_as_float(0x7fc00000) : 0.0f;
    }
    __syncthreads();
    uint8_t *codes = rec + 4;
    for (int j = tid; j < P * b / 8; j += nt) {
        uint32_t byte = 0;
        for (int t = 0; t < 8; t++) {
            const int bit = 8 * j + t;
            byte |= (uint32_t)((sh.qc[bit / b] >> (bit % b)) & 1u) << t;
        }
        codes[j] = (uint8_t)byte;
    }
    if (tid == 0) {
        const uint32_t s = __float_as_uint(sh.scale);
        for (int k = 0; k < 4; k++) rec[k] = (uint8_t)(s >> (8 * k));
    }
}

__global__ void __launch_bounds__(128) kvq_write_kernel(KvwArgs a) {
    pdl_start();
    __shared__ KvwShared sh;
    const int it = blockIdx.x, w = blockIdx.y, r = it / a.nkv, h = it % a.nkv;
    const int p = a.pos[r], s = a.slot[r];
    if (p < 0 || s < 0 || p / a.bs >= a.max_blocks) return; /* uniform over the block */
    const int blk = a.bt[(size_t)s * a.max_blocks + p / a.bs];
    if (blk < 0) return;
    uint8_t *rec = a.pool[w] + (((size_t)blk * a.bs + p % a.bs) * a.nkv + h) * a.rb[w];
    const float *x = a.src[w] + (size_t)it * a.d;
    const int d = a.d, tid = threadIdx.x, nt = blockDim.x;
    switch (a.kind[w]) {
    case TERN_KV_F32:
        for (int i = tid; i < d; i += nt) ((float *)rec)[i] = x[i];
        break;
    case TERN_KV_F16:
        for (int i = tid; i < d; i += nt) ((uint16_t *)rec)[i] = (uint16_t)kvq_f32_to_f16(x[i]);
        break;
    case TERN_KV_BF16:
        for (int i = tid; i < d; i += nt) ((uint16_t *)rec)[i] = (uint16_t)kvq_f32_to_bf16(x[i]);
        break;
    case TERN_KV_AFFINE: encode_affine(sh, x, rec, d, a.group[w], a.bits[w]); break;
    case TERN_KV_TURBO: encode_turbo(sh, x, rec, d, a.P, a.bits[w], a.rot); break;
    default: break;
    }
}

extern "C" void tern__cuda_kv_write_q(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                                      const float *v) {
    const int n = rows->n, nkv = kv->n_head_kv, d = kv->head_dim;
    if (n <= 0 || nkv <= 0) return;
    KvwArgs a = {};
    const tern_kv_fmt *f[2] = {&kv->kf, &kv->vf};
    int turbo = 0;
    for (int w = 0; w < 2; w++) {
        a.rb[w] = tern_kvq_vec_bytes(f[w], d);
        a.kind[w] = f[w]->kind;
        a.bits[w] = f[w]->bits;
        a.group[w] = f[w]->group;
        turbo |= f[w]->kind == TERN_KV_TURBO;
        if (!a.rb[w] || d > TERN_KVQ_MAX_ROT) {
            tern_log(TERN_LOG_ERROR, "cuda kv_write: %s format kind %d bits %d group %d invalid for head_dim %d",
                     w ? "V" : "K", f[w]->kind, f[w]->bits, f[w]->group, d);
            return;
        }
    }
    if (turbo && (!kv->rot || kv->rot_dim != tern_kvq_rot_dim(d))) {
        tern_log(TERN_LOG_ERROR, "cuda kv_write: turbo layer without its rotation (rot_dim %d, head_dim %d)",
                 kv->rot_dim, d);
        return;
    }
    cudaSetDevice(c->device);
    a.pool[0] = (uint8_t *)kv->k;
    a.pool[1] = (uint8_t *)kv->v;
    a.src[0] = k;
    a.src[1] = v;
    a.bt = kv->block_table;
    a.pos = rows->pos;
    a.slot = rows->slot;
    a.max_blocks = kv->max_blocks;
    a.bs = kv->block_size;
    a.nkv = nkv;
    a.d = d;
    a.P = turbo ? kv->rot_dim : 0;
    a.rot = kv->rot;
    dim3 grid((unsigned)((long)n * nkv), 2);
    tern_launch(c->stream, kvq_write_kernel, grid, 128, 0, a);
    tern__cuda_check(c, "kv_write (compressed)");
}
