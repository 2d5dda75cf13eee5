/*
 * attn_decode.cuh — the launch arguments of the decode-attention kernels (attn_decode.cu's split kernel,
 * attn_decode1p.cu's one-pass kernel, which reads the fields up to the softcap and ignores the split plan),
 * and the one-pass launcher attn_decode.cu dispatches to.
 */
#ifndef TERN_CUDA_ATTN_DECODE_CUH
#define TERN_CUDA_ATTN_DECODE_CUH

#include "backend/cuda/cuda_internal.h"

struct AdArgs {
    float *out, *part;
    const float *q;
    const void *kp, *vp;
    const int32_t *pos, *slot, *bt;
    int *cnt;
    int n, nh, nkv, G, D, max_blocks, bs, window, splits, chmax, chmin;
    int hs, GB; /* blocks per kv head (a group larger than the kernel's GM split in hs), heads per block */
    int region; /* floats before the record table in shared memory */
    int vpre;   /* V rows of a one-round warp load with its K rows (TERN_CUDA_AD_VPRE=0: after the scores) */
    int cl;     /* > 1: the splits (gridDim.y = cl) are one thread-block cluster, merged in shared memory */
    float scale, softcap;
};

/* attn_decode1p.cu: a's rows over pages of `kind` (TERN_KV_F32 / BF16 / F16), a block per (row, kv head),
 * one pass per warp (TERN_CUDA_AD_1P, opt-in): 1 when it ran, 0 when the shape is not served */
int tern__cuda_attn_decode_1p(tern__cuda *c, const AdArgs &a, int kind);

#endif
