/*
 * cuda_backend.c — the CUDA backend's C side: open/close, memory, weight upload and the
 * vtable that forwards each op of src/ops/ops.h to its launcher in a .cu file.
 *
 * One backend = one device + one stream. Every op is enqueued on that stream and returns at
 * once; download() and sync() wait for it. Kernel launch errors cannot be returned by the
 * void ops, so the first one is remembered ("sticky") and logged at the next sync/download.
 *
 * Weights: upload_weight copies the tensor's stored bytes (bf16 stays bf16, MLX packed stays
 * packed with its scales/biases as stored, block FP8 stays e4m3 bytes + F32 block scales) into one
 * device allocation per tensor, repacking
 * strided 3-D views (mat_stride != 0) into tight [E][out][row] order, and rewrites *t to point
 * at the device copy (device = GPU index, mat_stride = 0).
 *
 * Compute modes: TERN_COMPUTE_F32 is exact f32 (no TF32 anywhere: cuBLASLt runs with
 * CUBLAS_COMPUTE_32F_PEDANTIC); TERN_COMPUTE_BF16 lets the prefill GEMM run on tensor cores
 * as split-bf16 (hi + lo pairs, f32 accumulation, f32-like bound; see gemm.c).
 * Step graphs and the asynchronous small-upload ring live in graph.c (vt->graph_*).
 */
#include "backend/cuda/gemm.h"

#include <stdlib.h>
#include <string.h>

/* kernels launched as programmatic dependents (cuda_common.cuh tern_launch); TERN_CUDA_PDL=0 off.
 * Default since session 5: op tests, parity and the 64-row graph ids digest unchanged on the H200,
 * llama3-8b q4 decode +6 % (bench/NOTES.md (n)) */
int tern__cuda_pdl_on = -1; /* tests set it */
int tern__cuda_pdl(void) {
    if (tern__cuda_pdl_on < 0) tern__cuda_pdl_on = tern__cuda_env_int("TERN_CUDA_PDL", 1) != 0;
    return tern__cuda_pdl_on;
}

/* TERN_CUDA_CARVE=P (0..100, opt-in, session 19; unset: each kernel keeps its own preference): every kernel
 * launched through tern_launch gets the shared-memory carveout preference P % once (100: MaxShared). An A/B of
 * whether the SMs' changes of shared-memory configuration between a step's kernels (GEMVs 100 KB, rope_kv 32 KB,
 * the split tensor-core attention 228 KB: ncu, NOTES (aa)) cost the PDL overlap. -2 until read (tests set it) */
int tern__cuda_carve_pct = -2;
void tern__cuda_carve_apply(const void *k) {
    static const void *seen[1024];
    if (tern__cuda_carve_pct == -2) {
        const char *e = getenv("TERN_CUDA_CARVE");
        const int v = e && *e ? atoi(e) : -3;
        tern__cuda_carve_pct = v >= 0 && v <= 100 ? v : -1;
    }
    if (tern__cuda_carve_pct < 0 || !k) return;
    size_t h = ((uintptr_t)k >> 4) % 1024;
    for (int i = 0; i < 1024 && seen[h] != k; i++, h = (h + 1) % 1024) {
        if (!seen[h]) {
            seen[h] = k;
            cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, tern__cuda_carve_pct);
            cudaGetLastError();
            return;
        }
    }
}

static tern__cuda *C(tern_backend *be) { return (tern__cuda *)be->impl; }

void tern__cuda_check(tern__cuda *c, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && c->sticky == cudaSuccess) {
        c->sticky = e;
        tern_log(TERN_LOG_ERROR, "cuda: %s: %s", what, cudaGetErrorString(e));
    }
}

static void report(tern__cuda *c, cudaError_t e, const char *what) {
    if (e != cudaSuccess && c->sticky == cudaSuccess) {
        c->sticky = e;
        tern_log(TERN_LOG_ERROR, "cuda: %s: %s", what, cudaGetErrorString(e));
    }
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* matrices, rows per matrix, stored bytes per matrix (data, scales) */
static void geom(const tern_tensor *t, int64_t *nmat, int64_t *out, size_t *mb, size_t *mbs) {
    int64_t in = t->ndim ? t->shape[t->ndim - 1] : 1;
    *out = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    *nmat = 1;
    for (int i = 0; i + 2 < t->ndim; i++) *nmat *= t->shape[i];
    *mb = (size_t)*out * tern_tensor_row_bytes(t);
    *mbs = t->dtype == TERN_DT_Q ? (size_t)*out * (size_t)(in / t->group_size) * tern_dtype_size(t->sdtype)
                                 : tern_tensor_fp8_scale_bytes(t);
}

void tern__cuda_wview(const tern_tensor *t, tern__cuda_w *w) {
    int64_t nmat, out;
    size_t mb, mbs;
    geom(t, &nmat, &out, &mb, &mbs);
    w->dtype = t->dtype;
    w->sdtype = t->sdtype;
    w->bits = t->bits;
    w->group_size = t->group_size;
    w->out = (int)out;
    w->nmat = (int)nmat;
    w->in = (int)(t->ndim ? t->shape[t->ndim - 1] : 1);
    w->data = t->data;
    w->scales = t->scales;
    w->biases = t->biases;
    w->mat_bytes = mb;
    w->mat_bytes_s = mbs;
    w->blk_rows = tern_tensor_is_fp8_block(t) ? t->blk_rows : 0;
    w->precise = t->precise;
}

/* ---- memory ---- */

static void *be_alloc(tern_backend *be, size_t bytes) {
    void *p = NULL;
    cudaSetDevice(C(be)->device);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void be_free(tern_backend *be, void *p) {
    if (!p) return;
    cudaSetDevice(C(be)->device);
    cudaFree(p);
}

static void be_upload(tern_backend *be, void *dst, const void *src, size_t bytes) {
    tern__cuda *c = C(be);
    cudaSetDevice(c->device);
    /* the caller may reuse src at once: small copies go through the pinned ring (graph.c) */
    if (tern__cuda_upload_async(c, dst, src, bytes)) return;
    report(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
    report(c, cudaStreamSynchronize(c->stream), "upload sync");
}

/* upload_side (ops.h): the expert store's I/O thread fills slots of the next MoE layer while the
 * engine thread's kernels run. The host bytes (often file pages being read in) are copied into one
 * of two pinned staging buffers while the other one's copy is in flight on a stream of its own;
 * returns when every byte has landed. Without the staging (allocation failed), a synchronous copy. */
#define SIDE_CHUNK ((size_t)4 << 20)
static int side_open(tern__cuda *c) {
    if (c->side_state) return c->side_state > 0;
    c->side_state = -1; /* what was made is freed at close */
    if (cudaStreamCreateWithFlags(&c->side_stream, cudaStreamNonBlocking) != cudaSuccess) {
        c->side_stream = NULL;
        cudaGetLastError();
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        if (cudaHostAlloc(&c->side_pin[i], SIDE_CHUNK, cudaHostAllocDefault) != cudaSuccess) c->side_pin[i] = NULL;
        if (cudaEventCreateWithFlags(&c->side_ev[i], cudaEventDisableTiming) != cudaSuccess) c->side_ev[i] = NULL;
        if (!c->side_pin[i] || !c->side_ev[i]) {
            cudaGetLastError();
            return 0;
        }
    }
    c->side_state = 1;
    return 1;
}

static void be_upload_side(tern_backend *be, void *dst, const void *src, size_t bytes) {
    tern__cuda *c = C(be);
    cudaSetDevice(c->device); /* per host thread */
    cudaError_t e = cudaSuccess;
    if (!side_open(c)) {
        e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    } else {
        int i = 0;
        for (size_t off = 0; off < bytes && e == cudaSuccess; off += SIDE_CHUNK, i ^= 1) {
            const size_t len = bytes - off < SIDE_CHUNK ? bytes - off : SIDE_CHUNK;
            e = cudaEventSynchronize(c->side_ev[i]); /* this buffer's previous copy is done */
            if (e != cudaSuccess) break;
            memcpy(c->side_pin[i], (const uint8_t *)src + off, len);
            e = cudaMemcpyAsync((uint8_t *)dst + off, c->side_pin[i], len, cudaMemcpyHostToDevice, c->side_stream);
            if (e == cudaSuccess) e = cudaEventRecord(c->side_ev[i], c->side_stream);
        }
        const cudaError_t e2 = cudaStreamSynchronize(c->side_stream);
        if (e == cudaSuccess) e = e2;
    }
    /* not through report(): the engine thread owns c->sticky */
    if (e != cudaSuccess) tern_log(TERN_LOG_ERROR, "cuda upload_side: %s", cudaGetErrorString(e));
}

static void be_download(tern_backend *be, void *dst, const void *src, size_t bytes) {
    tern__cuda *c = C(be);
    cudaSetDevice(c->device);
    if (tern__cuda_download_recorded(c, dst, src, bytes)) return; /* recording a step graph */
    report(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download");
    report(c, cudaStreamSynchronize(c->stream), "download sync");
}

static void be_sync(tern_backend *be) {
    tern__cuda *c = C(be);
    if (c->capturing) return; /* nothing runs while a step is recorded */
    cudaSetDevice(c->device);
    report(c, cudaStreamSynchronize(c->stream), "sync");
}

static tern_status be_upload_weight(tern_backend *be, tern_tensor *t, tern_error *err) {
    tern__cuda *c = C(be);
    const char *nm = t->name ? t->name : "?";
    if (t->device >= 0) return TERN_OK;
    if (t->ndim < 1 || t->ndim > 3) return tern_err(err, TERN_EUNSUPPORTED, "cuda: weight '%s': %d dims", nm, t->ndim);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] <= 0 || t->shape[i] > INT32_MAX)
            return tern_err(err, TERN_EINVAL, "cuda: weight '%s': bad shape[%d] = %lld", nm, i, (long long)t->shape[i]);
    int64_t in = t->shape[t->ndim - 1];
    switch (t->dtype) {
    case TERN_DT_F32: case TERN_DT_F16: case TERN_DT_BF16: break;
    case TERN_DT_Q:
        if (t->bits < 2 || t->bits > 8 || t->bits == 7)
            return tern_err(err, TERN_EUNSUPPORTED, "cuda: weight '%s': %d-bit quantization", nm, t->bits);
        if (t->group_size != 32 && t->group_size != 64 && t->group_size != 128)
            return tern_err(err, TERN_EUNSUPPORTED, "cuda: weight '%s': group_size %d", nm, t->group_size);
        if (in % t->group_size)
            return tern_err(err, TERN_EINVAL, "cuda: weight '%s': in %lld not a multiple of group_size %d", nm,
                            (long long)in, t->group_size);
        if (t->sdtype != TERN_DT_F32 && t->sdtype != TERN_DT_F16 && t->sdtype != TERN_DT_BF16)
            return tern_err(err, TERN_EUNSUPPORTED, "cuda: weight '%s': scales dtype %s", nm, tern_dtype_name(t->sdtype));
        if (!t->scales || !t->biases)
            return tern_err(err, TERN_EINVAL, "cuda: weight '%s': quantized without scales/biases", nm);
        break;
    case TERN_DT_F8_E4M3: /* block-scaled only (tensor.h) */
        if (!t->scales || t->sdtype != TERN_DT_F32 || t->blk_rows <= 0 || t->group_size <= 0 || t->ndim < 2)
            return tern_err(err, TERN_EUNSUPPORTED, "cuda: weight '%s': F8_E4M3 needs F32 block scales", nm);
        break;
    default:
        return tern_err(err, TERN_EUNSUPPORTED, "cuda: weight '%s': dtype %s", nm, tern_dtype_name(t->dtype));
    }
    int scaled = t->dtype == TERN_DT_Q || t->dtype == TERN_DT_F8_E4M3;
    if (!t->data) return tern_err(err, TERN_EINVAL, "cuda: weight '%s': no data", nm);
    int64_t nmat, out;
    size_t mb, mbs, total_d, total_s, total;
    geom(t, &nmat, &out, &mb, &mbs);
    if (!tern_mul_ok((size_t)nmat, mb, &total_d) || !tern_mul_ok((size_t)nmat, mbs, &total_s) ||
        !tern_add_ok(align256(total_d), 2 * align256(total_s), &total))
        return tern_err(err, TERN_EINVAL, "cuda: weight '%s': size overflows", nm);
    cudaSetDevice(c->device);
    uint8_t *d = NULL;
    if (cudaMalloc((void **)&d, total ? total : 1) != cudaSuccess) {
        cudaGetLastError();
        return tern_err(err, TERN_ENOMEM, "cuda: weight '%s': cannot allocate %zu bytes on GPU %d", nm, total,
                        c->device);
    }
    uint8_t *ds = d + align256(total_d), *db = ds + align256(total_s);
    cudaError_t e = cudaSuccess;
    size_t sd = t->mat_stride ? t->mat_stride : mb, ss = t->mat_stride_s ? t->mat_stride_s : mbs;
    /* on the backend's stream, then wait: cudaMemcpy from pageable memory runs on the legacy stream,
     * which our non-blocking stream does not wait for, and may return before its DMA has landed — a
     * kernel launched next could read the old bytes (seen as a flaky fp8 embedding test) */
    for (int64_t m = 0; m < nmat && e == cudaSuccess; m++) {
        e = cudaMemcpyAsync(d + m * mb, (const uint8_t *)t->data + m * sd, mb, cudaMemcpyHostToDevice, c->stream);
        if (scaled && e == cudaSuccess) {
            e = cudaMemcpyAsync(ds + m * mbs, (const uint8_t *)t->scales + m * ss, mbs, cudaMemcpyHostToDevice,
                                c->stream);
            if (e == cudaSuccess && t->dtype == TERN_DT_Q)
                e = cudaMemcpyAsync(db + m * mbs, (const uint8_t *)t->biases + m * ss, mbs, cudaMemcpyHostToDevice,
                                    c->stream);
        }
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaFree(d);
        return tern_err(err, TERN_EDEVICE, "cuda: weight '%s': copy to GPU failed: %s", nm, cudaGetErrorString(e));
    }
    t->data = d;
    if (scaled) t->scales = ds;
    if (t->dtype == TERN_DT_Q) t->biases = db;
    t->mat_stride = t->mat_stride_s = 0;
    t->device = c->device;
    return TERN_OK;
}

static void be_free_weight(tern_backend *be, tern_tensor *t) {
    if (!t || t->device < 0 || !t->data) return;
    cudaSetDevice(C(be)->device);
    if (!t->joined) cudaFree((void *)t->data); /* joined: the group's first tensor owns the bytes */
    t->data = t->scales = t->biases = NULL;
    t->device = -1;
    t->joined = 0;
}

/* ops.h join_weights: 2-D BF16 / F16 / F32 matrices of one `in` (no scales, no expert map) copied into one allocation
 * back to back, every offset a multiple of 256 bytes (each matrix keeps the alignment the GEMM paths want); the old
 * allocations freed. Only under TERN_CUDA_QKV_ONE (gemm.c tern__cuda_qkv_one), the path that reads them as one. */
static int be_join_weights(tern_backend *be, tern_tensor *const *w, int k) {
    tern__cuda *c = C(be);
    if (!tern__cuda_qkv_one() || k < 2 || k > 4) return 0;
    size_t off[5] = {0};
    for (int i = 0; i < k; i++) {
        const tern_tensor *t = w[i];
        if (!t || t->device < 0 || !t->data || t->joined || t->ndim != 2 || t->scales || t->mat_map ||
            (t->dtype != TERN_DT_BF16 && t->dtype != TERN_DT_F16 && t->dtype != TERN_DT_F32) || t->dtype != w[0]->dtype ||
            t->shape[1] != w[0]->shape[1])
            return 0;
        const size_t bytes = (size_t)t->shape[0] * (size_t)t->shape[1] * tern_dtype_size(t->dtype);
        if (bytes % 256) return 0;
        off[i + 1] = off[i] + bytes;
    }
    cudaSetDevice(c->device);
    uint8_t *d = NULL;
    if (cudaMalloc((void **)&d, off[k]) != cudaSuccess) {
        cudaGetLastError();
        return 0; /* no room for the copy: they stay apart */
    }
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < k && e == cudaSuccess; i++)
        e = cudaMemcpyAsync(d + off[i], w[i]->data, off[i + 1] - off[i], cudaMemcpyDeviceToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d);
        return 0;
    }
    for (int i = 0; i < k; i++) {
        cudaFree((void *)w[i]->data);
        w[i]->data = d + off[i];
        w[i]->joined = i > 0;
    }
    return 1;
}

/* ---- ops: thin forwards ---- */

/* compressed KV pages (kvq_write.cu, kvq_attn.cu; formats in ops/kvq.h) */
void tern__cuda_kv_write_q(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                           const float *v);
void tern__cuda_attention_q(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                            const tern_kv_layer *kv, float scale, float softcap);
void tern__cuda_kvq_init(tern__cuda *c); /* at open: shared-memory limit */

static void be_matmul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w) {
    tern__cuda_w v;
    tern__cuda_wview(w, &v);
    tern__cuda_matmul(C(be), y, x, n, &v, 0);
}
static void be_matmul_expert(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int e) {
    tern__cuda_w v;
    tern__cuda_wview(w, &v);
    tern__cuda_matmul(C(be), y, x, n, &v, e);
}
static void be_embed(tern_backend *be, float *y, const int32_t *ids, int n, const tern_tensor *emb, float scale) {
    tern__cuda_w v;
    tern__cuda_wview(emb, &v);
    tern__cuda_embed(C(be), y, ids, n, &v, scale);
}
static void be_rmsnorm(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, float eps) {
    tern__cuda_rmsnorm(C(be), y, x, rows, d, w, eps);
}
int tern__cuda_env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && e[0] ? atoi(e) : dflt;
}

/* rmsnorm_n in one launch (TERN_CUDA_NORM_N=0: k launches). Its callers now: Gemma 4's MoE block (three norms of h,
 * gemma4-26b-a4b: two launches fewer a layer) and norm_rope_kv_write's fallback (NORM_ROPE runs q, k, v's head norms
 * inside the rope launch). Session 11 (H200): +1.9 % on gemma4-12b alone when it served the head norms. Default on
 * since session 31 (NOTES (ar)); tests set it */
int tern__cuda_norm_n = -1;
static int be_rmsnorm_n(tern_backend *be, int k, float *const *y, const float *const *x, const int *rows, int d,
                        const float *const *w, float eps) {
    if (tern__cuda_norm_n < 0) tern__cuda_norm_n = tern__cuda_env_int("TERN_CUDA_NORM_N", 1) != 0;
    if (!tern__cuda_norm_n || k < 1 || k > 3) return 0;
    tern__cuda_rmsnorm_n(C(be), k, y, x, rows, d, w, eps);
    return 1;
}
static int be_norm_route_topk(tern_backend *be, int n, int d, float *const *y, const float *const *x,
                              const float *const *w, float eps, const tern_tensor *router, float *logits,
                              int32_t *idx, float *wts, int E, int k, int mode, const float *pes) {
    tern__cuda_w v;
    tern__cuda_wview(router, &v);
    return tern__cuda_norm_route_topk(C(be), n, d, y, x, w, eps, &v, logits, idx, wts, E, k, mode, pes);
}
static double be_copy_rate(tern_backend *be, size_t bytes) {
    tern__cuda *c = C(be);
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    cudaSetDevice(c->device);
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream); /* warm-up */
        for (int round = 0; round < 3; round++) {
            cudaEventRecord(e0, c->stream);
            for (int k = 0; k < 8; k++)
                cudaMemcpyAsync((k & 1) ? a : b, (k & 1) ? b : a, bytes, cudaMemcpyDeviceToDevice, c->stream);
            cudaEventRecord(e1, c->stream);
            float ms = 0;
            if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0) {
                const double gbs = 8.0 * 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
                if (gbs > best) best = gbs;
            }
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaGetLastError();
    return best;
}
static int be_rmsnorm_add2(tern_backend *be, float *x, float *h, const float *h2, int rows, int d, const float *w,
                           const float *w2, float eps, const float *s) {
    static int on = -1; /* TERN_CUDA_NORM_ADD2=0: two rmsnorm_add launches (A/B) */
    if (on < 0) on = tern__cuda_env_int("TERN_CUDA_NORM_ADD2", 1) != 0;
    if (!on) return 0;
    tern__cuda_rmsnorm_add2(C(be), x, h, h2, rows, d, w, w2, eps, s);
    return 1;
}
static int be_rmsnorm_add(tern_backend *be, float *x, const float *h, int rows, int d, const float *w, float eps,
                          const float *s) {
    static int on = -1; /* TERN_CUDA_NORM_ADD=0: the separate ops (A/B) */
    if (on < 0) on = tern__cuda_env_int("TERN_CUDA_NORM_ADD", 1) != 0;
    if (!on) return 0;
    tern__cuda_rmsnorm_add(C(be), x, h, rows, d, w, eps, s);
    return 1;
}
static void be_rope(tern_backend *be, float *x, int n, int nh, int d, const int32_t *pos, const float *inv_freq,
                    float mscale) {
    tern__cuda_rope(C(be), x, n, nh, d, pos, inv_freq, mscale);
}
static void be_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                        const float *v) {
    if (kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32) tern__cuda_kv_write_q(C(be), kv, rows, k, v);
    else tern__cuda_kv_write(C(be), kv, rows, k, v);
}
static void be_attention(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                         const tern_kv_layer *kv, float scale, float softcap) {
    if (kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32) tern__cuda_attention_q(C(be), out, q, rows, nh, kv, scale, softcap);
    else tern__cuda_attention(C(be), out, q, rows, nh, kv, scale, softcap);
}
static int be_attention_o(tern_backend *be, float *y, float *att, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap, const tern_tensor *wo, int add) {
    tern__cuda_w v;
    if (wo->ndim != 2 || rows->n < 2) return 0;
    tern__cuda_wview(wo, &v);
    if (!tern__cuda_attn_o_begin(C(be), y, att, rows->n, nh * kv->head_dim, &v)) return 0;
    be_attention(be, att, q, rows, nh, kv, scale, softcap);
    return tern__cuda_attn_o_end(C(be), y, att, rows->n, &v, add);
}
static void be_add(tern_backend *be, float *y, const float *a, const float *b, size_t n) {
    tern__cuda_ew(C(be), TERN__EW_ADD, y, a, b, 0, n);
}
static void be_mul(tern_backend *be, float *y, const float *a, const float *b, size_t n) {
    tern__cuda_ew(C(be), TERN__EW_MUL, y, a, b, 0, n);
}
static void be_scale(tern_backend *be, float *y, const float *x, float s, size_t n) {
    tern__cuda_ew(C(be), TERN__EW_SCALE, y, x, NULL, s, n);
}
static void be_scale_dev(tern_backend *be, float *y, const float *x, const float *s, size_t n) {
    tern__cuda_ew(C(be), TERN__EW_SCALE_DEV, y, x, s, 0, n);
}
static void be_gelu_tanh_mul(tern_backend *be, float *y, const float *gate, const float *up, size_t n) {
    tern__cuda_ew(C(be), TERN__EW_GELU, y, gate, up, 0, n);
}
static void be_silu_mul(tern_backend *be, float *y, const float *gate, const float *up, size_t n) {
    tern__cuda_ew(C(be), TERN__EW_SILU, y, gate, up, 0, n);
}
static void be_softcap(tern_backend *be, float *y, size_t n, float cap) {
    tern__cuda_ew(C(be), TERN__EW_SOFTCAP, y, y, NULL, cap, n);
}
static void be_add_bias(tern_backend *be, float *y, const float *bias, int n, int d) {
    tern__cuda_add_bias(C(be), y, bias, n, d);
}
static void be_copy_cols(tern_backend *be, float *dst, const float *src, int n, int w, int ss, int off) {
    tern__cuda_copy_cols(C(be), dst, src, n, w, ss, off);
}
static void be_route_topk(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                          int mode, const float *per_expert_scale) {
    tern__cuda_route_topk(C(be), idx, wts, logits, n, E, k, mode, per_expert_scale);
}
static void be_moe_mlp(tern_backend *be, float *y, const float *x, int n, int H, const int32_t *idx,
                       const float *wts, int k, const tern_tensor *gate, const tern_tensor *up,
                       const tern_tensor *down, int act, float *scratch) {
    tern__cuda_w g, u, d;
    tern__cuda_wview(gate, &g);
    tern__cuda_wview(up, &u);
    tern__cuda_wview(down, &d);
    if (gate->mat_map) { /* expert slot views (tensor.h): one map for the three stacks */
        idx = tern__cuda_moe_remap(C(be), idx, gate->mat_map, n * k);
        if (!idx) { tern_log(TERN_LOG_ERROR, "cuda moe_mlp: cannot allocate the slot id buffer"); return; }
    }
    tern__cuda_moe_mlp(C(be), y, x, n, H, idx, wts, k, &g, &u, &d, act, scratch);
}

static int be_graph_replay(tern_backend *be, uint64_t key, void *out, size_t out_bytes) {
    return tern__cuda_graph_replay(C(be), key, out, out_bytes);
}
int tern__cuda_graph_launch(tern__cuda *c, uint64_t key, int half); /* graph.c */
int tern__cuda_graph_wait(tern__cuda *c, uint64_t key, int half, void *out, size_t out_bytes);
static int be_graph_launch(tern_backend *be, uint64_t key, int half) { return tern__cuda_graph_launch(C(be), key, half); }
static int be_graph_wait(tern_backend *be, uint64_t key, int half, void *out, size_t out_bytes) {
    return tern__cuda_graph_wait(C(be), key, half, out, out_bytes);
}
static int be_graph_begin(tern_backend *be, uint64_t key, void *out, size_t out_bytes) {
    return tern__cuda_graph_begin(C(be), key, out, out_bytes);
}
static int be_graph_end(tern_backend *be, int ok) { return tern__cuda_graph_end(C(be), ok); }
static void be_graph_reset(tern_backend *be) { tern__cuda_graph_reset(C(be)); }

/* fused decode ops (gemv.cu, fused.cu); 0 = not fused here, the model runs the separate ops */
/* Views of k 2-D weights (pv[i] = &v[i]) for the fused matmul entry points; 0 when one is not 2-D */
static int wviews(const tern_tensor *const *w, int k, tern__cuda_w *v, const tern__cuda_w **pv) {
    for (int i = 0; i < k; i++) {
        if (w[i]->ndim != 2) return 0;
        tern__cuda_wview(w[i], &v[i]);
        pv[i] = &v[i];
    }
    return 1;
}
static int be_matmul_n(tern_backend *be, int k, float *const *y, const float *x, int n, const tern_tensor *const *w) {
    tern__cuda_w v[3];
    const tern__cuda_w *pv[3];
    if (k < 1 || k > 3 || !wviews(w, k, v, pv)) return 0;
    if (n > 1 && tern__cuda_gemm_n(C(be), k, y, x, n, pv)) return 1; /* gemm.c: plain bf16, many rows */
    return tern__cuda_matmul_n(C(be), k, y, x, n, pv);
}
static int be_matmul_glu(tern_backend *be, float *y, const float *x, int n, const tern_tensor *gate,
                         const tern_tensor *up, int act) {
    tern__cuda_w g, u;
    if (gate->ndim != 2 || up->ndim != 2) return 0;
    tern__cuda_wview(gate, &g);
    tern__cuda_wview(up, &u);
    if (n > 1 && tern__cuda_gemm_glu(C(be), y, x, n, &g, &u, act)) return 1;
    return tern__cuda_matmul_glu(C(be), y, x, n, &g, &u, act);
}
static int be_norm_matmul(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, int k,
                          float *const *y, const tern_tensor *const *w, int act, const tern_norm_res *res) {
    static int on = -1; /* TERN_CUDA_NORM_FUSE=0: rmsnorm and the matmul as two launches (A/B) */
    if (on < 0) on = tern__cuda_env_int("TERN_CUDA_NORM_FUSE", 1) != 0;
    tern__cuda_w v[3];
    const tern__cuda_w *pv[3];
    if (!on || k < 1 || k > 3 || (act >= 0 && k != 2) || !wviews(w, k, v, pv)) return 0;
    const int mode = act < 0 ? G1_PLAIN : act == TERN_ACT_SILU ? G1_SILU : G1_GELU;
    if (n > 1) return tern__cuda_gemm_norm(C(be), xn, x, nw, eps, n, k, y, pv, mode, res); /* gemm.c: many rows */
    return tern__cuda_norm_matmul(C(be), xn, x, nw, eps, n, k, y, pv, mode, res);
}
static int be_norm_mlp(tern_backend *be, float *xn, const float *x, const float *nw, float eps, int n, float *y, int add,
                       const tern_tensor *const *w, int act, const tern_norm_res *res) {
    tern__cuda_w v[3];
    const tern__cuda_w *pv[3];
    return n > 1 && wviews(w, 3, v, pv) && tern__cuda_gemm_mlp(C(be), xn, x, nw, eps, n, y, add, pv, act, res);
}
static int be_matmul_add(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w) {
    tern__cuda_w v;
    if (w->ndim != 2) return 0;
    tern__cuda_wview(w, &v);
    if (n > 1 && tern__cuda_gemm_add(C(be), y, x, n, &v)) return 1;
    return tern__cuda_matmul_add(C(be), y, x, n, &v);
}
/* Gemma 4's head norms inside the rope + cache-store launch (TERN_CUDA_NORM_ROPE=0: three rmsnorm
 * launches, then rope_kv_write). H200, session 11, batch-1 bf16 decode at 512: gemma4-12b 125.5 → 128.3
 * tok/s, e4b 207.2 → 210.2 (op test cuda_norm_rope_kv bitwise, parity 18/18); tests set it */
int tern__cuda_norm_rope = -1;
static int be_matmul_act_mul(tern_backend *be, float *y, const float *x, int n, const tern_tensor *w, int act,
                             const float *v, const tern_norm_res *res, float eps) {
    tern__cuda_w wv;
    const tern__cuda_w *pv;
    if (!wviews(&w, 1, &wv, &pv)) return 0;
    return tern__cuda_matmul_act_mul(C(be), y, x, n, pv, act, v, res, eps);
}
static int be_norm_rope_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k,
                                 float *v, int nh, const float *inv_freq, float mscale, const float *qw, const float *kw,
                                 float eps) {
    if (tern__cuda_norm_rope < 0) tern__cuda_norm_rope = tern__cuda_env_int("TERN_CUDA_NORM_ROPE", 1) != 0;
    return tern__cuda_norm_rope && tern__cuda_norm_rope_kv_write(C(be), kv, rows, q, k, v, nh, inv_freq, mscale, qw, kw, eps);
}
static int be_norm_qkv_rope_kv(tern_backend *be, float *xn, const float *x, const float *nw, float eps, float *q, float *k,
                               float *v, const tern_tensor *const *w, const tern_kv_layer *kv, const tern_rows *rows,
                               int nh, const float *inv_freq, float mscale) {
    tern__cuda_w wv[3];
    const tern__cuda_w *pv[3];
    float *const y[3] = {q, k, v};
    if (!wviews(w, 3, wv, pv)) return 0;
    if (rows->n > 1)
        return tern__cuda_gemm_qkv_rope(C(be), xn, x, nw, eps, y, pv, kv, rows, nh, inv_freq, mscale) ||
               tern__cuda_q4_qkv_rope(C(be), xn, x, nw, eps, y, pv, kv, rows, nh, inv_freq, mscale);
    return tern__cuda_norm_qkv_rope_kv(C(be), xn, x, nw, eps, y, pv, kv, rows, nh, inv_freq, mscale);
}
/* ops.h ple_block: many rows (gemm.c tern__cuda_ple_block declines the rest) */
static int be_ple_block(tern_backend *be, float *y, float *pg, const float *x, int n, const tern_tensor *wg,
                        const tern_tensor *wp, int act, const float *v, long ldv, const tern_norm_res *res, float eps) {
    tern__cuda_w g, p;
    tern__cuda_wview(wg, &g);
    tern__cuda_wview(wp, &p);
    return tern__cuda_ple_block(C(be), y, pg, x, n, &g, &p, act, v, ldv, res, eps);
}
/* ops.h norm_qkv_norm_rope_kv: many rows only (gemm.c tern__cuda_gemm_qkv_nrk); w[2] NULL: V = K */
static int be_norm_qkv_norm_rope_kv(tern_backend *be, float *xn, const float *x, const float *nw, float eps,
                                    float *const *y, const tern_tensor *const *w, const tern_kv_layer *kv,
                                    const tern_rows *rows, int nh, const float *inv_freq, float mscale, const float *qw,
                                    const float *kw, const tern_norm_res *res) {
    tern__cuda_w wv[3];
    const tern__cuda_w *pv[3] = {NULL, NULL, NULL};
    return rows->n > 1 && wviews(w, w[2] ? 3 : 2, wv, pv) &&
           tern__cuda_gemm_qkv_nrk(C(be), xn, x, nw, eps, y, pv, kv, rows, nh, inv_freq, mscale, qw, kw, res);
}
/* ops.h norm_qkv_attention_o: the q|k|v GEMM over joined weights (gemm.c), then the batch decode attention roping q
 * and k and writing the cache itself (attn_decode.cu tern__cuda_attn_decode_rope: one rope_kv_rows launch fewer a
 * layer), then the o GEMM on the attention's bf16 output (attention_o). Where the attention cannot take the rope, or its
 * bf16 output would overlap the GEMM's rows, rope_kv_rows and the plain attention run instead: the same bits */
/* TERN_CUDA_QKV_ATT (default 1 since session 30; 0 off): see be_norm_qkv_attention_o. -1 until read (tests set it) */
int tern__cuda_qkv_att = -1;
static int be_norm_qkv_attention_o(tern_backend *be, float *xn, const float *x, const float *nw, float eps, float *q,
                                   float *k, float *v, const tern_tensor *const *w, const tern_kv_layer *kv,
                                   const tern_rows *rows, int nh, const float *inv_freq, float mscale, float *y, float *att,
                                   float scale, float softcap, const tern_tensor *wo) {
    if (tern__cuda_qkv_att < 0) tern__cuda_qkv_att = tern__cuda_env_int("TERN_CUDA_QKV_ATT", 1) != 0;
    tern__cuda *c = C(be);
    tern__cuda_w wv[3], ov;
    const tern__cuda_w *pv[3];
    const int n = rows->n, d = kv->head_dim;
    if (!tern__cuda_qkv_att || n < 2 || wo->ndim != 2 || !wviews(w, 3, wv, pv)) return 0;
    tern__cuda_wview(wo, &ov);
    if (!tern__cuda_attn_o_begin(c, y, att, n, nh * d, &ov)) return 0;
    size_t xb = 0;
    const float *cs = tern__cuda_qkv_one_gemm(c, xn, x, nw, eps, pv, kv, rows, nh, &xb);
    if (!cs) {
        tern__cuda_attn_o_cancel(c);
        return 0;
    }
    const int M = pv[0]->out + pv[1]->out + pv[2]->out;
    if ((size_t)n * nh * d * 2 > xb ||
        !tern__cuda_attn_decode_rope(c, att, rows, nh, kv, scale, softcap, cs, M, inv_freq, mscale)) {
        tern__cuda_rope_kv_rows(c, kv, rows, cs, M, q, k, v, nh, inv_freq, mscale);
        be_attention(be, att, q, rows, nh, kv, scale, softcap);
    }
    return tern__cuda_attn_o_end(c, y, att, n, &ov, 1);
}
static int be_rope_kv_write(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k,
                            const float *v, int nh, const float *inv_freq, float mscale) {
    return tern__cuda_rope_kv_write(C(be), kv, rows, q, k, v, nh, rows->pos, inv_freq, mscale);
}

/* GLM-5 ops (glm.cu, glm_attn.cu) */
extern const tern_glm_ops tern__cuda_glm_ops;
void tern__cuda_glm_init(tern__cuda *c);

static void be_close(tern_backend *be) {
    if (!be) return;
    tern__cuda *c = C(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        tern__cuda_graph_report(c);
        tern__cuda_graph_close(c);
        tern__cuda_prof_report(); /* TERN_CUDA_PROFILE=1: the per-op table (prof.c) */
        tern__cuda_lt_cache_free(c);
        cudaFree(c->lt_ws);
        cudaFree(c->part);
        cudaFree(c->gemm_scratch);
        cudaFree(c->moe_idx);
        cudaFree(c->mm_cnt);
        cudaFree(c->ad_cnt);
        if (c->side_stream) cudaStreamDestroy(c->side_stream);
        if (c->tune_stream) cudaStreamDestroy(c->tune_stream);
        for (int i = 0; i < 2; i++) {
            if (c->side_pin[i]) cudaFreeHost(c->side_pin[i]);
            if (c->side_ev[i]) cudaEventDestroy(c->side_ev[i]);
        }
        tern__cuda_moe_blas_close(c);
        size_t mfree = 0, mtotal = 0; /* the context with every kernel the run loaded (tern_backend_cuda_context_bytes) */
        if (cudaMemGetInfo(&mfree, &mtotal) == cudaSuccess)
            tern_log(TERN_LOG_INFO, "cuda: device %d: %.3f GB in use at close with our buffers freed (the context, "
                     "cuBLAS and whatever else is still allocated: the model's weights and KV if not freed yet)",
                     c->device, (mtotal - mfree) / 1073741824.0);
        else
            cudaGetLastError();
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

static void be_sample(tern_backend *be, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
                      const tern_sample_pair *pairs, void *scratch) {
    (void)scratch;
    tern__cuda_sample(C(be), ids, logits, n, V, rows, pairs);
}

static tern_status be_reserve_rows(tern_backend *be, int rows, tern_error *err);

static const tern_backend_vt k_cuda_vt = {
    .name = "cuda",
    .close = be_close,
    .alloc = be_alloc,
    .free = be_free,
    .upload = be_upload,
    .download = be_download,
    .sync = be_sync,
    .upload_weight = be_upload_weight,
    .free_weight = be_free_weight,
    .join_weights = be_join_weights,
    .attention_o = be_attention_o,
    .matmul = be_matmul,
    .matmul_expert = be_matmul_expert,
    .embed = be_embed,
    .rmsnorm = be_rmsnorm,
    .rope = be_rope,
    .kv_write = be_kv_write,
    .attention = be_attention,
    .add = be_add,
    .mul = be_mul,
    .scale = be_scale,
    .scale_dev = be_scale_dev,
    .gelu_tanh_mul = be_gelu_tanh_mul,
    .silu_mul = be_silu_mul,
    .softcap = be_softcap,
    .add_bias = be_add_bias,
    .copy_cols = be_copy_cols,
    .route_topk = be_route_topk,
    .moe_mlp = be_moe_mlp,
    .graph_replay = be_graph_replay,
    .graph_launch = be_graph_launch,
    .graph_wait = be_graph_wait,
    .graph_begin = be_graph_begin,
    .graph_end = be_graph_end,
    .graph_reset = be_graph_reset,
    .glm = &tern__cuda_glm_ops,
    .matmul_n = be_matmul_n,
    .matmul_glu = be_matmul_glu,
    .matmul_add = be_matmul_add,
    .rope_kv_write = be_rope_kv_write,
    .sample = be_sample,
    .rmsnorm_add = be_rmsnorm_add,
    .norm_matmul = be_norm_matmul,
    .rmsnorm_n = be_rmsnorm_n,
    .norm_rope_kv_write = be_norm_rope_kv_write,
    .norm_qkv_rope_kv = be_norm_qkv_rope_kv,
    .norm_qkv_attention_o = be_norm_qkv_attention_o,
    .norm_mlp = be_norm_mlp,
    .matmul_act_mul = be_matmul_act_mul,
    .norm_route_topk = be_norm_route_topk,
    .rmsnorm_add2 = be_rmsnorm_add2,
    .norm_qkv_norm_rope_kv = be_norm_qkv_norm_rope_kv,
    .ple_block = be_ple_block,
    .copy_rate = be_copy_rate,
    .upload_side = be_upload_side,
    .reserve_rows = be_reserve_rows,
};

/* The prefill GEMM scratch for forwards of `rows` rows: 256 MB (TERN_CUDA_GEMM_SCRATCH_MB) a 2048 rows, at least
 * 256 MB. Its users grow with the rows: x staged in bf16, the bf16 MLP's gate | up and h (gemm.c: 193 MB at 2048
 * rows of llama3-8b), a MoE chunk's padded expert rows (moe_blas.cu: ~1.5·rows·k·(H + I)·2 bytes, 173 MB at 2048
 * rows of gemma4-26b-a4b), the materialized attention's sub-chunks (attn_mat.cu). With less, the MoE splits a
 * chunk into passes and the MLP takes the f32 path: an 8192-row chunk of gemma4-26b-a4b ran 40.4k tok/s at an 8k
 * prompt with 1024 MB and 30.5k at 4096 rows with 256 MB (NOTES (al)). TERN_CUDA_SCRATCH_MB (64..16384) sets it. */
static size_t gemm_scratch_bytes(int rows) {
    const int per = TERN_CUDA_GEMM_SCRATCH_MB, steps = rows > 2048 ? (rows + 2047) / 2048 : 1;
    const int mb = tern__cuda_env_int("TERN_CUDA_SCRATCH_MB", steps > 16384 / per ? 16384 : per * steps);
    return (size_t)(mb < 64 ? 64 : mb > 16384 ? 16384 : mb) << 20;
}

size_t tern_backend_cuda_fixed_bytes(int rows) {
    return gemm_scratch_bytes(rows) + TERN_CUDA_LT_WS_BYTES + (size_t)TERN_CUDA_PART_FLOATS * sizeof(float);
}

/* H200, CUDA 13.0, session 26: 0.839 GB in use right after open, 0.312 GB of it our buffers (TERN_LOG=info logs both, and
 * what is left at close once our buffers are freed) */
#define TERN_CUDA_CONTEXT_BYTES ((size_t)540 << 20)
size_t tern_backend_cuda_context_bytes(void) { return TERN_CUDA_CONTEXT_BYTES; }

size_t tern_backend_cuda_device_bytes(int device) {
    int count = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return prop.totalGlobalMem;
}

/* vt reserve_rows: grow gemm_scratch for forwards of `rows` rows (never shrinks; the old buffer stays on failure) */
static tern_status be_reserve_rows(tern_backend *be, int rows, tern_error *err) {
    tern__cuda *c = C(be);
    const size_t want = gemm_scratch_bytes(rows);
    if (want <= c->gemm_scratch_bytes) return TERN_OK;
    void *p = NULL;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream); /* nothing queued may still read the old buffer */
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_err(err, TERN_ENOMEM, "cuda: device %d: %.0f MB of prefill scratch for %d rows a step: %s "
                        "(lower --max-batch-tokens or set TERN_CUDA_SCRATCH_MB)", c->device, want / 1048576.0, rows,
                        cudaGetErrorString(e));
    }
    cudaFree(c->gemm_scratch);
    c->gemm_scratch = p;
    c->gemm_scratch_bytes = want;
    tern__cuda_graph_reset(c); /* a recorded step may have captured the old address */
    return TERN_OK;
}

tern_status tern_backend_cuda_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err) {
    if (!out) return tern_err(err, TERN_EINVAL, "cuda: open: out is NULL");
    *out = NULL;
    int count = 0, dev = opts ? opts->device : 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        cudaGetLastError();
        return tern_err(err, TERN_EUNSUPPORTED, "no CUDA GPU (cudaGetDeviceCount: %s, count %d)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
    }
    if (dev < 0 || dev >= count)
        return tern_err(err, TERN_EINVAL, "cuda: device %d out of range (%d GPUs)", dev, count);
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return tern_err(err, TERN_EDEVICE, "cuda: device %d: %s", dev, cudaGetErrorString(e));
    if (prop.major < 9)
        return tern_err(err, TERN_EUNSUPPORTED, "cuda: device %d (%s) is sm_%d%d; this build needs sm_90 or newer",
                        dev, prop.name, prop.major, prop.minor);
    tern_backend *be = calloc(1, sizeof *be);
    tern__cuda *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return tern_err(err, TERN_ENOMEM, "cuda: out of host memory");
    }
    be->vt = tern__cuda_vt_select(&k_cuda_vt); /* TERN_CUDA_FUSED=0 / TERN_CUDA_PROFILE=1 (prof.c) */
    be->device = dev;
    be->mem_bytes = prop.totalGlobalMem;
    be->compute = opts ? opts->compute : TERN_COMPUTE_F32;
    c->bf16_x2 = be->compute == TERN_COMPUTE_BF16X2; /* the model and the kernels see one bf16 mode */
    if (c->bf16_x2) be->compute = TERN_COMPUTE_BF16;
    c->i8 = be->compute == TERN_COMPUTE_INT8; /* the bf16 mode, with int8 x in the Q4 one-row GEMVs (gemv_mma.cu) */
    if (c->i8) be->compute = TERN_COMPUTE_BF16;
    be->impl = c;
    c->device = dev;
    c->compute = be->compute;
    c->n_sm = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    {
        int mclk = 0, bus = 0; /* kHz, bits; DDR: two transfers a clock */
        if (cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
            c->mem_peak = 2.0 * mclk * 1e3 * bus / 8.0;
        cudaGetLastError();
    }
    const char *what = "cudaSetDevice";
    if ((e = cudaSetDevice(dev)) != cudaSuccess) goto fail;
    what = "cudaStreamCreate";
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) goto fail;
    what = "cudaMalloc (scratch)";
    if ((e = cudaMalloc(&c->lt_ws, TERN_CUDA_LT_WS_BYTES)) != cudaSuccess) goto fail;
    if ((e = cudaMalloc((void **)&c->part, (size_t)TERN_CUDA_PART_FLOATS * sizeof(float))) != cudaSuccess) goto fail;
    c->gemm_scratch_bytes = gemm_scratch_bytes(0); /* the model's reserve_rows grows it */
    if ((e = cudaMalloc(&c->gemm_scratch, c->gemm_scratch_bytes)) != cudaSuccess) goto fail;
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        c->lt = NULL;
        be_close(be);
        return tern_err(err, TERN_EDEVICE, "cuda: cublasLtCreate failed on device %d", dev);
    }
    tern_status gs = tern__cuda_graph_open(c, err);
    if (gs) {
        be_close(be);
        return gs;
    }
    tern__cuda_gemv_init(c);
    tern__cuda_attn_init(c);
    tern__cuda_kvq_init(c);
    tern__cuda_glm_init(c);
    tern__cuda_wgemm_init(c);
    size_t mfree = 0, mtotal = 0; /* what the context costs besides our buffers (tern fit does not count it yet) */
    if (cudaMemGetInfo(&mfree, &mtotal) == cudaSuccess)
        tern_log(TERN_LOG_INFO, "cuda: device %d (%s): %.2f GB, %.3f GB in use after open (context + %.3f GB of our buffers)",
                 dev, prop.name, mtotal / 1073741824.0, (mtotal - mfree) / 1073741824.0,
                 tern_backend_cuda_fixed_bytes(0) / 1073741824.0);
    else
        cudaGetLastError();
    *out = be;
    return TERN_OK;
fail:
    cudaGetLastError();
    be_close(be);
    return tern_err(err, e == cudaErrorMemoryAllocation ? TERN_ENOMEM : TERN_EDEVICE, "cuda: device %d: %s: %s", dev,
                    what, cudaGetErrorString(e));
}
