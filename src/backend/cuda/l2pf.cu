/*
 * l2pf.cu — weights into L2 while a latency-bound kernel runs (TERN_CUDA_L2PF_O, session 63).
 *
 * Why: in a one-row decode step the attention kernels read little (one row's K / V) and stall on latency, so DRAM is
 * nearly idle for their 5–25 µs, and the o projection that follows then streams its weights at the copy rate. A
 * kernel launched just before the attention asks L2 for the first bytes of o's weights (codes, then scales and biases):
 * the o GEMV then finds those lines in L2 and DRAM has that much less to stream after the attention. (The weights are
 * constants of the model, so nothing waits for the kernel before them; the launch only rides the stream's order.)
 *
 * TERN_CUDA_L2PF_NEXT=MB (ops.h prefetch): the models hint the weights of the GEMV after next (llama / Gemma 4: down
 * before the glu, the next layer's q|k|v or Gemma 4's per-layer gate / projection before down), for the one-row walks
 * that stream below the copy rate (Q4: instruction-latency bound with loads from DRAM in flight, NOTES (bo)).
 *
 * The kernel: pdl_trigger at once (the attention's blocks launch under it), the prefetches, then pdl_wait, so its end
 * still implies the previous kernel's and the attention's own pdl_wait keeps its meaning. Modes (TERN_CUDA_L2PF_MODE):
 * 1 `prefetch.global.L2` a 128-byte line a thread, grid-stride; 2 `cp.async.bulk.prefetch.L2` (the TMA unit), one bulk
 * request of up to 64 KB a thread; 3 as 1 with the evict_last priority. Nothing is written: no result can change.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

extern "C" unsigned long long tern__cuda_l2pf_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_l2pf_calls = 0;

#define L2PF_RANGES 9 /* three matrices' codes, scales and biases */
struct L2pfArgs {
    const char *p[L2PF_RANGES];
    unsigned long long n[L2PF_RANGES]; /* bytes of each range (a multiple of 16 in mode 2) */
    int mode;
};

__global__ void __launch_bounds__(256) l2pf_kernel(L2pfArgs a) {
    pdl_trigger();
    /* consecutive lines (bulk pieces) on consecutive blocks: a short range still spreads over every block's SM */
    const size_t t = (size_t)threadIdx.x * gridDim.x + blockIdx.x, nt = (size_t)gridDim.x * blockDim.x;
#pragma unroll
    for (int i = 0; i < L2PF_RANGES; i++) {
        const char *p = a.p[i];
        const size_t n = a.n[i];
        if (a.mode == 2) {
            for (size_t off = t << 16; off < n; off += nt << 16) {
                const size_t len = n - off < (1u << 16) ? n - off : (1u << 16);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"((unsigned)len) : "memory");
            }
        } else if (a.mode == 3) {
            for (size_t off = t << 7; off < n; off += nt << 7)
                asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + off));
        } else {
            for (size_t off = t << 7; off < n; off += nt << 7) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
        }
    }
    pdl_wait();
}

static int l2pf_env(const char *name, int dflt, int lo, int hi) {
    int v = tern__cuda_env_int(name, dflt);
    return v < lo ? lo : v > hi ? hi : v;
}

/* at most `budget` bytes of matrix 0 of each w[0..k) (k <= 3) into L2 on the backend's stream: codes, scales and biases
 * in proportion (the GEMVs walk the rows in order, so the same leading rows of each); TERN_CUDA_L2PF_MODE above,
 * _BLOCKS the grid */
extern "C" int tern__cuda_l2pf_mode; /* -1 until read (tests set it) */
int tern__cuda_l2pf_mode = -1;
extern "C" void tern__cuda_l2pf_ws(tern__cuda *c, const tern__cuda_w *const *w, int k, size_t budget) {
    static int blocks = -1;
    if (tern__cuda_l2pf_mode < 0) tern__cuda_l2pf_mode = l2pf_env("TERN_CUDA_L2PF_MODE", 1, 1, 3);
    if (blocks < 0) blocks = l2pf_env("TERN_CUDA_L2PF_BLOCKS", 32, 1, 1024);
    if (!c || !w || k <= 0 || k > L2PF_RANGES / 3 || !budget) return;
    L2pfArgs a = {};
    a.mode = tern__cuda_l2pf_mode;
    const void *ps[L2PF_RANGES] = {};
    size_t ns[L2PF_RANGES] = {}, total = 0;
    for (int j = 0; j < k; j++) {
        if (!w[j] || !w[j]->data) continue;
        ps[3 * j] = w[j]->data, ps[3 * j + 1] = w[j]->scales, ps[3 * j + 2] = w[j]->biases;
        ns[3 * j] = w[j]->mat_bytes;
        ns[3 * j + 1] = w[j]->scales ? w[j]->mat_bytes_s : 0;
        ns[3 * j + 2] = w[j]->biases ? w[j]->mat_bytes_s : 0;
        total += ns[3 * j] + ns[3 * j + 1] + ns[3 * j + 2];
    }
    if (!total) return;
    const double f = total > budget ? (double)budget / (double)total : 1.0;
    for (int i = 0; i < L2PF_RANGES; i++) {
        if (!ps[i] || !ns[i]) continue;
        a.p[i] = (const char *)ps[i];
        a.n[i] = (unsigned long long)((size_t)((double)ns[i] * f) & ~(size_t)127);
    }
    cudaSetDevice(c->device);
    tern_launch(c->stream, l2pf_kernel, dim3((unsigned)blocks), dim3(256), 0, a);
    tern__cuda_check(c, "l2pf");
    tern__cuda_l2pf_calls++;
}
extern "C" void tern__cuda_l2pf_w(tern__cuda *c, const tern__cuda_w *w, size_t budget) {
    const tern__cuda_w *const ws[1] = {w};
    tern__cuda_l2pf_ws(c, ws, 1, budget);
}

/* the same for tern_tensors (ops.h prefetch; bench_cuda's probes, which see no tern__cuda_w) */
extern "C" void tern__cuda_l2pf_tensors(tern__cuda *c, const tern_tensor *const *t, int k, size_t budget) {
    tern__cuda_w w[3];
    const tern__cuda_w *pw[3] = {};
    if (!t || k <= 0 || k > 3) return;
    for (int j = 0; j < k; j++)
        if (t[j] && t[j]->data && t[j]->ndim >= 2) {
            tern__cuda_wview(t[j], &w[j]);
            pw[j] = &w[j];
        }
    tern__cuda_l2pf_ws(c, pw, k, budget);
}
extern "C" void tern__cuda_l2pf_tensor(tern__cuda *c, const tern_tensor *t, size_t budget) {
    const tern_tensor *const ts[1] = {t};
    tern__cuda_l2pf_tensors(c, ts, 1, budget);
}
