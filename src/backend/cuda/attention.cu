/*
 * attention.cu — paged KV cache write and attention (ops.h: kv_write, attention).
 *
 * One kernel serves prefill and decode. A block owns a set of query vectors: R batch rows
 * (consecutive rows of one KV slot, tiled only when the host copies of slot/pos show it) times
 * HB query heads of one KV-head group (GQA: heads h with h / (nh/n_head_kv) == g share the
 * group's K/V), so every K/V tile read from the paged pool serves R*HB queries. Key tiles of T
 * positions are staged in shared memory; each query keeps an online softmax (running max M,
 * sum L, accumulator acc[d] in shared memory) in exact f32 with expf/tanhf.
 * Masking per query: key position p' is visible iff p' <= pos and (window == 0 or
 * p' > pos - window), or (bidirectional spans, rows->vis_lo set) vis_lo <= p' <= vis_hi —
 * the union, as tern_key_range_of in ops.h; keys whose block-table entry is < 0 are never
 * read. A span step is never recorded into a graph (the driver runs it eagerly; recording one
 * here marks the capture bad).
 *
 * Split-K (flash-decoding): when the (tile, group) blocks cannot fill the GPU — decode — each
 * block's key range is cut into `splits` pieces handled by separate blocks; partial (M, L, acc)
 * go to the preallocated scratch `part` and a second kernel merges them. Head dims up to 512
 * (d % 4 == 0); shared memory is sized per launch (up to ~140 KB at d = 512).
 * Prefill runs (>= 32 rows of one slot, host copies given) go to the
 * tensor-core flash kernel of attn_prefill.cu when it takes them (d 64/128/256/512; compute mode
 * bf16, or f32 with tern__cuda_fa_f32); this kernel is the exact path and the fallback.
 * tern__cuda_attn_runs (the run split) serves kvq_attn.cu's BF16 pages too.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_tile.cuh"

#include <math.h>
#include <stdlib.h>

struct AttnArgs {
    float *out;
    const float *q;
    const int32_t *pos, *slot;
    const int32_t *vlo, *vhi; /* span ranges [n] or NULL */
    int n, nh, nkv, d, G;
    const float *kp, *vp;
    const int32_t *bt;
    int max_blocks, bs, window;
    float scale, softcap;
    int R, HB, T, splits, hsplit;
    float *part; /* [splits][n][nh][d] accumulators, then [splits][n][nh][2] (M, L) */
};

__global__ void kv_write_kernel(float *kpool, float *vpool, const int32_t *bt, int max_blocks, int bs, int nkv,
                                int d, const int32_t *pos, const int32_t *slot, int n, const float *k,
                                const float *v) {
    pdl_start();
    const size_t total = (size_t)n * nkv * d;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(t / ((size_t)nkv * d));
        const size_t within = t % ((size_t)nkv * d);
        const int p = pos[r], s = slot[r];
        if (p < 0 || p / bs >= max_blocks) continue;
        const int blk = bt[(size_t)s * max_blocks + p / bs];
        if (blk < 0) continue;
        const size_t dst = ((size_t)blk * bs + p % bs) * nkv * d + within;
        kpool[dst] = k[t];
        vpool[dst] = v[t];
    }
}

extern "C" void tern__cuda_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                                    const float *v) {
    const size_t total = (size_t)rows->n * kv->n_head_kv * kv->head_dim;
    if (!total) return;
    cudaSetDevice(c->device);
    size_t b = (total + 255) / 256;
    tern_launch(c->stream, kv_write_kernel, (unsigned)(b > 65535 * 4 ? 65535 * 4 : b), 256, 0, 
        (float *)kv->k, (float *)kv->v, kv->block_table, kv->max_blocks, kv->block_size, kv->n_head_kv,
        kv->head_dim, rows->pos, rows->slot, rows->n, k, v);
    tern__cuda_check(c, "kv_write");
}

__global__ void __launch_bounds__(256) attn_kernel(AttnArgs a) {
    pdl_start();
    extern __shared__ float sm[];
    const int QV = a.R * a.HB, d = a.d, T = a.T, tid = threadIdx.x, nt = blockDim.x;
    float *qs = sm, *acc = qs + QV * d, *Ks = acc + QV * d, *Vs = Ks + T * (d + 1), *S = Vs + T * d;
    float *M = S + QV * T;                  /* then L, AL (AtQ) */
    const AtQ q = {M, (int *)(M + 3 * QV), QV}; /* qpos, qlo, qvlo, qvhi */
    __shared__ int range[2];

    const int row0 = blockIdx.x * a.R;
    const int g = blockIdx.y / a.hsplit, h0 = (blockIdx.y % a.hsplit) * a.HB;
    const int slot = a.slot[row0];
    /* query vectors: qv = ri * HB + hi -> row row0 + ri, head g*G + h0 + hi */
    at_rows(a, q, QV, row0, h0, tid, nt);
    for (int idx = tid; idx < QV * d; idx += nt) {
        const int qv = idx / d, i = idx % d, ri = qv / a.HB, hi = qv % a.HB, r = row0 + ri;
        const bool ok = r < a.n && h0 + hi < a.G;
        qs[idx] = ok ? a.q[((size_t)r * a.nh + g * a.G + h0 + hi) * d + i] : 0.0f;
        acc[idx] = 0.0f;
    }
    __syncthreads();
    if (tid == 0) at_range(a, q, QV, T, range);
    __syncthreads();
    const int lo = range[0], hi = range[1];
    const int d4 = d / 4, kvstride = a.nkv * d;
    const int32_t *btrow = a.bt + (size_t)slot * a.max_blocks;

    for (int kb = lo; kb <= hi; kb += T) {
        __syncthreads(); /* previous tile's PV is done with Ks/Vs/S */
        for (int idx = tid; idx < T * d4; idx += nt) {
            const int t = idx / d4, i4 = idx % d4, kpos = kb + t;
            float4 kv4 = make_float4(0.f, 0.f, 0.f, 0.f), vv4 = kv4;
            if (kpos <= hi && kpos / a.bs < a.max_blocks) {
                const int blk = btrow[kpos / a.bs];
                if (blk >= 0) {
                    const size_t off = ((size_t)blk * a.bs + kpos % a.bs) * kvstride + (size_t)g * d;
                    kv4 = __ldg((const float4 *)(a.kp + off) + i4);
                    vv4 = __ldg((const float4 *)(a.vp + off) + i4);
                }
            }
            float *kr = Ks + t * (d + 1) + 4 * i4;
            kr[0] = kv4.x; kr[1] = kv4.y; kr[2] = kv4.z; kr[3] = kv4.w;
            *(float4 *)(Vs + t * d + 4 * i4) = vv4;
        }
        __syncthreads();
        at_tile(a, q, QV, T, d, d, kb, hi, btrow, qs, Ks, Vs, S, acc, tid, nt);
    }
    __syncthreads();
    for (int idx = tid; idx < QV * d; idx += nt) {
        const int qv = idx / d, i = idx % d, ri = qv / a.HB, hi2 = qv % a.HB, r = row0 + ri;
        if (r >= a.n || h0 + hi2 >= a.G) continue;
        at_store(a, q, qv, i, r, g * a.G + h0 + hi2, acc[idx]);
    }
}

#define MERGE_MAX TERN_CUDA_MERGE_MAX
__global__ void attn_merge_kernel(float *out, const float *part, int nrow, int d, int splits) {
    pdl_start();
    /* block (rh, y): row rh's outputs y·64 .. (d: gridDim.y = 1 gives every output of the row to the block's threads);
     * the (M, L) of every split in one parallel load, then per element a sum over the splits with
     * its loads batched (a loop of dependent global loads cost ~0.5 us per split). Same terms in the
     * same order as a serial merge: out = Σ_z part_z·e^{M_z - M} / Σ_z L_z·e^{M_z - M}, empty splits
     * (M_z = -inf) skipped. */
    __shared__ float sm_m[MERGE_MAX], sm_w[MERGE_MAX], sm_l[MERGE_MAX];
    __shared__ float s_den;
    const int rh = blockIdx.x;
    const float *ml = part + (size_t)splits * nrow * d;
    for (int z = threadIdx.x; z < splits; z += blockDim.x) {
        sm_m[z] = ml[((size_t)z * nrow + rh) * 2];
        sm_l[z] = ml[((size_t)z * nrow + rh) * 2 + 1];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int z = 0; z < splits; z++) mx = fmaxf(mx, sm_m[z]);
    for (int z = threadIdx.x; z < splits; z += blockDim.x) sm_w[z] = sm_m[z] != -INFINITY ? expf(sm_m[z] - mx) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        float den = 0.0f;
        for (int z = 0; z < splits; z++)
            if (sm_m[z] != -INFINITY) den += sm_l[z] * sm_w[z];
        s_den = den;
    }
    __syncthreads();
    const float den = s_den;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < d; i += gridDim.y * blockDim.x) {
        const float *pz = part + (size_t)rh * d + i;
        const size_t stride = (size_t)nrow * d;
        float num = 0.0f;
#pragma unroll 16
        for (int z = 0; z < splits; z++) {
            const float v = pz[(size_t)z * stride];
            if (sm_m[z] != -INFINITY) num += v * sm_w[z];
        }
        out[(size_t)rh * d + i] = den > 0.0f ? num / den : 0.0f;
    }
}

/* The longest key list any row of this call can have: the rows' largest position + 1 from the host
 * copies, or the whole table while a step is recorded into a graph (replays see other positions),
 * at most the table. Every split-K attention plan sizes its splits from it. */
extern "C" long tern__cuda_attn_max_keys(const tern__cuda *c, const tern_rows *rows, const tern_kv_layer *kv) {
    const long cap = (long)kv->max_blocks * kv->block_size;
    if (c->capturing || !rows->pos_host) return cap;
    long m = 1;
    for (int r = 0; r < rows->n; r++) m = rows->pos_host[r] + 1L > m ? rows->pos_host[r] + 1L : m;
    return m < cap ? m : cap;
}

/* Split-K plan of one attention call, shared by attention.cu and kvq_attn.cu: R rows per tile
 * (rows of one slot share key loads) and the number of key splits (enough blocks to fill the SMs,
 * bounded by the longest key range, 64, and the partials buffer). T = keys per tile, HB = query
 * heads per block, hsplit = blocks per kv head, span = the step has bidirectional spans. */
extern "C" void tern__cuda_attn_plan(tern__cuda *c, const tern_rows *rows, const tern_kv_layer *kv, int n, int nh,
                                     int d, int T, int qvmax, int HB, int hsplit, int span, int *R_out,
                                     int *splits_out) {
    /* Host copies of slot/pos plan the work (row tiles, split count) for this call only; a step
     * being recorded into a graph is replayed with other positions, so it plans without them:
     * one row per tile and a split count sized for the whole context (blocks past a row's
     * last key exit at once). */
    const int32_t *slot_host = c->capturing ? NULL : rows->slot_host;
    const int32_t *pos_host = c->capturing ? NULL : rows->pos_host;
    *R_out = 1;
    if (slot_host && pos_host && n > 1) {
        int R = qvmax / HB;
        if (R > n) R = n;
        while (R > 1) {
            bool same = true;
            for (int r = 0; r < n && same; r++) same = slot_host[r] == slot_host[r - r % R];
            if (same) break;
            R /= 2;
        }
        *R_out = R < 1 ? 1 : R;
    }
    const int tiles = (n + *R_out - 1) / *R_out;
    const long blocks = (long)tiles * kv->n_head_kv * hsplit;
    long maxlen = tern__cuda_attn_max_keys(c, rows, kv);
    if (kv->window > 0 && maxlen > kv->window + *R_out) maxlen = kv->window + *R_out;
    if (span) { /* spans reach past the window and past pos: bound by the farthest key */
        maxlen = (long)kv->max_blocks * kv->block_size;
        if (pos_host && rows->vis_hi_host) {
            maxlen = 1;
            for (int r = 0; r < n; r++) {
                long last = pos_host[r] > rows->vis_hi_host[r] ? pos_host[r] : rows->vis_hi_host[r];
                maxlen = last + 1 > maxlen ? last + 1 : maxlen;
            }
        }
    }
    *splits_out = tern__cuda_attn_splits(c, blocks, maxlen, T, n, nh, d);
}

/* Split count of a split-K attention plan whose `blocks` blocks (before splitting) may not fill the
 * GPU: 1 once they reach `full` blocks per SM, else enough splits for `want` blocks per SM, with at
 * least `min_keys` keys per split, at most `cap` (<= MERGE_MAX), partials ([splits][n][nh][d + 2])
 * within `part`. */
extern "C" int tern__cuda_split_count(const tern__cuda *c, long blocks, int full, int want, long keys, long min_keys,
                                      int cap, int n, int nh, int d) {
    if (blocks >= (long)full * c->n_sm) return 1;
    long s = ((long)want * c->n_sm + blocks - 1) / blocks;
    const long byk = (keys + min_keys - 1) / min_keys;
    if (s > byk) s = byk;
    if (s > cap) s = cap;
    while (s > 1 && (size_t)s * n * nh * (d + 2) > TERN_CUDA_PART_FLOATS) s /= 2;
    return s < 1 ? 1 : (int)s;
}

/* The paged and GLM latent plans: about two blocks per SM, at least two key tiles of T per split,
 * at most 64 */
extern "C" int tern__cuda_attn_splits(const tern__cuda *c, long blocks, long keys, int T, int n, int nh, int d) {
    return tern__cuda_split_count(c, blocks, 1, 2, keys, 2L * T, 64, n, nh, d);
}

/* The split-K merge: out[rh] = Σ_z part_z · e^{M_z - M} / Σ_z L_z · e^{M_z - M} over the splits
 * (partials [splits][nrow][d], then (M, L) pairs [splits][nrow]); every split-K attention kernel
 * (paged, compressed pages, GLM latent) writes this layout. */
extern "C" void tern__cuda_attn_merge(tern__cuda *c, float *out, int nrow, int d, int splits, const char *what) {
    if (splits > MERGE_MAX) { /* cannot happen: every plan caps its splits */
        tern_log(TERN_LOG_ERROR, "cuda %s: %d splits (at most %d)", what, splits, MERGE_MAX);
        return;
    }
    /* a block per (row, 64 outputs): one thread an output, its splits' loads batched — a block per row took ~15 µs for
     * one row of 16 heads × 512 over 33 splits (H100, NOTES (bt)): each thread walked 4 outputs' splits in turn */
    tern_launch(c->stream, attn_merge_kernel, dim3((unsigned)nrow, (unsigned)((d + 63) / 64)), 64, 0, out, c->part, nrow,
                d, splits);
    tern__cuda_check(c, what);
}

/* attn_prefill.cu: tensor-core flash attention over one run of rows of one slot (host copies
 * set); returns 0 when it does not take the call (head dim, compute mode, TERN_CUDA_FA). */
extern "C" void tern__cuda_attn_prefill_init(tern__cuda *c);
extern "C" int tern__cuda_attn_prefill(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                       const tern_kv_layer *kv, float scale, float softcap);
/* Shorter runs (decode, small verify chunks) stay on attn_cores; TERN_CUDA_FA_MIN=k lowers the
 * bar (k = 1: every run with host copies, so the tiny parity fixtures reach the kernel). */
static int fa_min_rows = 32;

/* The kernel's dynamic shared-memory limit is raised once, at backend open (never while a
 * graph is being recorded). */
extern "C" void tern__cuda_attn_init(tern__cuda *c) {
    cudaFuncSetAttribute(attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(c->smem_optin - 1024));
    cudaGetLastError();
    tern__cuda_attn_prefill_init(c);
    tern__cuda_attn_decode_init(c);
    const int fa_min = tern__cuda_env_int("TERN_CUDA_FA_MIN", 0);
    if (fa_min >= 1) fa_min_rows = fa_min;
}

/* The CUDA-core kernel over any rows (the reference-exact path and the fallback). */
static void attn_cores(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                       const tern_kv_layer *kv, float scale, float softcap) {
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    if (n <= 0 || nh <= 0 || nkv <= 0 || nh % nkv || d <= 0 || d % 4 || d > 512) {
        if (n > 0) tern_log(TERN_LOG_ERROR, "cuda attention: unsupported shape nh %d nkv %d d %d", nh, nkv, d);
        return;
    }
    cudaSetDevice(c->device);
    AttnArgs a = {};
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
    a.kp = (const float *)kv->k;
    a.vp = (const float *)kv->v;
    a.bt = kv->block_table;
    a.max_blocks = kv->max_blocks;
    a.bs = kv->block_size;
    a.window = kv->window;
    a.scale = scale;
    a.softcap = softcap;
    a.T = d <= 128 ? 64 : d <= 256 ? 32 : 16;
    const int qvmax = 8192 / d < 8 ? 8 : 8192 / d;
    a.HB = a.G < qvmax ? a.G : qvmax;
    a.hsplit = (a.G + a.HB - 1) / a.HB;
    tern__cuda_attn_plan(c, rows, kv, n, nh, d, a.T, qvmax, a.HB, a.hsplit, a.vlo != NULL, &a.R, &a.splits);
    const int tiles = (n + a.R - 1) / a.R;
    a.part = c->part;
    const int QV = a.R * a.HB;
    const size_t smem = sizeof(float) * ((size_t)2 * QV * d + (size_t)a.T * (d + 1) + (size_t)a.T * d +
                                         (size_t)QV * a.T + 3 * QV) + sizeof(int) * 4 * QV;
    if (smem + 1024 > c->smem_optin) {
        tern_log(TERN_LOG_ERROR, "cuda attention: %zu bytes of shared memory needed (d %d)", smem, d);
        return;
    }
    dim3 grid((unsigned)tiles, (unsigned)(nkv * a.hsplit), (unsigned)a.splits);
    tern_launch(c->stream, attn_kernel, grid, 256, smem, a);
    tern__cuda_check(c, "attention");
    if (a.splits > 1) {
        tern__cuda_attn_merge(c, out, n * nh, d, a.splits, "attention merge");
    }
}

/* rows [r0, r0 + n) of `rows` as a batch of their own */
static tern_rows rows_sub(const tern_rows *rows, int r0, int n) {
    tern_rows s = *rows;
    s.n = n;
    s.pos += r0;
    s.slot += r0;
    s.pos_host += r0;
    s.slot_host += r0;
    if (s.vis_lo) s.vis_lo += r0;
    if (s.vis_hi) s.vis_hi += r0;
    if (s.vis_lo_host) s.vis_lo_host += r0;
    if (s.vis_hi_host) s.vis_hi_host += r0;
    return s;
}

/* decode rows: at most two rows per sequence on average (attn_decode.cu takes them), from the host
 * copies also while a step is recorded (model.c's step key holds the number of sequences, so a graph
 * is replayed only for steps that decide alike: eager and replayed steps run the same kernels);
 * without host copies, a recorded step counts as decode rows */
extern "C" int tern__cuda_attn_is_decode(const tern__cuda *c, const tern_rows *rows) {
    if (!rows->slot_host) return c->capturing;
    return rows->n <= 2 * tern_slot_seqs(rows->slot_host, rows->n);
}

/* Runs of >= fa_min_rows consecutive rows of one slot go to the tensor-core kernel
 * (attn_prefill.cu) when it takes them; the rows between runs go to `rest` (the page kind's
 * general kernel) in contiguous pieces. Without host copies (graph recording) everything goes to
 * `rest`. Shared by the F32 pages (attn_cores) and the BF16 pages (kvq_attn.cu). */
extern "C" void tern__cuda_attn_runs(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                     const tern_kv_layer *kv, float scale, float softcap, tern__cuda_attn_fn rest) {
    const int n = rows->n;
    if (c->capturing || !rows->slot_host || !rows->pos_host || n < fa_min_rows || nh <= 0 ||
        kv->n_head_kv <= 0 || nh % kv->n_head_kv) {
        rest(c, out, q, rows, nh, kv, scale, softcap);
        return;
    }
    cudaSetDevice(c->device);
    const size_t rs = (size_t)nh * kv->head_dim;
    int pend = 0;
    for (int r = 0, e; r < n; r = e) {
        for (e = r + 1; e < n && rows->slot_host[e] == rows->slot_host[r];) e++;
        if (e - r < fa_min_rows) continue;
        tern_rows run = rows_sub(rows, r, e - r);
        if (!tern__cuda_attn_prefill(c, out + r * rs, q + r * rs, &run, nh, kv, scale, softcap)) continue;
        if (pend < r) {
            tern_rows part = rows_sub(rows, pend, r - pend);
            rest(c, out + pend * rs, q + pend * rs, &part, nh, kv, scale, softcap);
        }
        pend = e;
    }
    if (pend == 0) {
        rest(c, out, q, rows, nh, kv, scale, softcap);
    } else if (pend < n) {
        tern_rows part = rows_sub(rows, pend, n - pend);
        rest(c, out + pend * rs, q + pend * rs, &part, nh, kv, scale, softcap);
    }
}

extern "C" void tern__cuda_attention(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                     const tern_kv_layer *kv, float scale, float softcap) {
    if (tern__cuda_attn_is_decode(c, rows) && tern__cuda_attn_decode(c, out, q, rows, nh, kv, scale, softcap)) return;
    tern__cuda_attn_runs(c, out, q, rows, nh, kv, scale, softcap, attn_cores);
}
