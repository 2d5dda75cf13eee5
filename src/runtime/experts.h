/*
 * experts.h — the expert store: MoE expert weights stay where the weight store put them (mmap'd
 * safetensors on disk, or host RAM) in their stored format, and a bounded pool of slots in the
 * backend's memory (RAM on the CPU, VRAM on CUDA) holds the hot ones (issue 8, docs/OFFLOAD.md).
 *
 * Per MoE layer: an expert -> slot table over a fixed pool of S slots (each slot holds one
 * expert's gate, up and down matrices in the stored format: packed data + scales + biases, bf16,
 * or FP8 + block scales), LRU per layer. A MoE call downloads the routed ids (n*k int32), pins
 * the unique experts of the step, loads each miss once (memcpy from the stored bytes; file
 * pages are dropped from the process afterwards), and runs the backend's moe_mlp over slot views
 * (tern_tensor.mat_map): the kernels read exactly the bytes they read without offload, in the
 * same order, so results are bit-identical by construction.
 * A step whose unique experts exceed S: on the CPU it reads the stored stacks in place (zero
 * copy, identical); on a device it runs in row chunks whose unique experts fit (the CUDA moe is
 * per-row deterministic, so identical too). Minimum useful S: k (one row's experts).
 * TERN_EXPERTS_CHUNKS=1 in the environment makes CPU backends take the chunked path too (tests
 * exercise it there; the CPU moe is not bitwise batch-invariant, so it is close, not identical).
 *
 * Sizing: opts.slots (> 0) per layer, else opts.cap_bytes / (MoE layers x one expert's bytes),
 * at least k and at most E. Trace: one JSON line per MoE call:
 *   {"layer":L,"rows":n,"unique":U,"hits":h,"misses":m,"bytes":b,"direct":0|1,"chunks":c,
 *    "ahead":a,"ids":[..]}      (misses: experts copied for this call, now or ahead by the I/O
 *    thread; ahead: of those, the ones the previous layer predicted (copied ahead or madvised);
 *    bytes: the misses' bytes)
 */
#ifndef TERN_RUNTIME_EXPERTS_H
#define TERN_RUNTIME_EXPERTS_H

#include "io/config.h"
#include "io/weights.h"
#include "ops/ops.h"

typedef struct tern_experts tern_experts;

typedef struct tern_experts_opts {
    size_t cap_bytes;         /* slot memory over every MoE layer (used when slots == 0) */
    int slots;                /* > 0: slots per MoE layer (overrides cap_bytes) */
    const char *trace;        /* path of the JSON-lines routing trace (appended), or NULL */
    int e0;                   /* (appended) global id of the stacks' expert 0: an expert-parallel rank
                                 holds experts [e0, e0 + E) and routes (and reads ahead) with the
                                 global router; 0 on a single device */
} tern_experts_opts;

/* the global id of the store's expert 0 (tern_experts_opts.e0); 0 for NULL */
int tern_experts_e0(const tern_experts *x);

typedef struct tern_experts_stats {
    int n_layers;             /* MoE layers registered */
    int n_expert, slots;      /* E, slots per layer */
    size_t expert_bytes;      /* one expert (gate + up + down) as stored, largest layer */
    size_t slot_bytes;        /* backend memory allocated for slots (all layers) */
    size_t cap_bytes;         /* the configured cap (0 when sized by slots) */
    int64_t calls, hits, misses, direct, chunks;
    uint64_t bytes_read;      /* bytes copied into slots (+ read in place by direct calls) */
    int64_t predicted;        /* experts read ahead for the next layer (not resident when predicted) */
    int64_t pred_used;        /* of the slot loads, how many had been read ahead */
    /* appended: the I/O thread (CPU backends; TERN_EXPERTS_PREFETCH=0 turns it off) */
    int64_t prefetched;       /* experts copied into slots ahead of their layer by the I/O thread */
    int64_t prefetch_hits;    /* of those, used by the next call of their layer */
    int prefetch_on;          /* 1 when the I/O thread runs */
    /* appended: staging slots (the only slots the I/O thread fills; see add_router) */
    int staging;              /* staging slots per layer (k with the thread on and >= 2k slots, else 0) */
    int64_t staged;           /* routed experts found in a staging slot (prefetched, or demoted there and not
                                 yet overwritten): promoted without a copy; counted in misses, not in bytes */
    uint64_t prefetch_bytes;  /* bytes copied by the I/O thread (included in bytes_read) */
} tern_experts_stats;

tern_status tern_experts_open(tern_experts **out, tern_backend *be, int n_layer, const tern_experts_opts *o,
                              tern_error *err);
void tern_experts_close(tern_experts *x); /* accepts NULL */

/* At load: register stack `which` (0 gate [E,I,H], 1 up [E,I,H], 2 down [E,H,I]) of MoE layer
 * `layer` as stored (host memory; not uploaded). `file_backed`: the bytes are a file mapping
 * (their pages are dropped from the process after each copy). */
tern_status tern_experts_add(tern_experts *x, int layer, int which, const tern_tensor *t, int file_backed,
                             tern_error *err);
/* Same for a stack built from per-expert tensors that were not copied (weights.h expert views):
 * src[e] gives expert e's stored bytes (E entries, copied into the store); t gives the layout
 * (t's data is expert 0's). Slot loads copy from src; a call with more experts than slots on
 * the CPU copies them into a temporary pool for that call (no contiguous stack to read in place). */
tern_status tern_experts_add_src(tern_experts *x, int layer, int which, const tern_tensor *t,
                                 const tern_expert_src *src, int file_backed, tern_error *err);
/* At load (optional): the router [E, H] of MoE layer `layer`, as uploaded. With routers, each
 * MoE call of a decode-sized step (<= 8 rows) predicts the next MoE layer's experts as the top-k
 * of that layer's router applied to this call's input, and asks the kernel to read the
 * non-resident ones ahead (madvise WILLNEED on their stored bytes, file-backed stores only), so
 * disk reads overlap this layer's compute. With TERN_EXPERTS_PREFETCH=1 and at least 2k slots,
 * k of each layer's slots are staging slots and an I/O thread copies the predicted experts into
 * staging slots of the next layer while this layer computes; a routed expert found there becomes
 * a regular slot by table swap (no copy). The other S - k slots are a plain LRU cache that a
 * prefetch never touches; that layer's call waits for the copies before it uses any slot. A wrong
 * guess costs only bandwidth: results never depend on it. */
tern_status tern_experts_add_router(tern_experts *x, int layer, const tern_tensor *router, tern_error *err);
/* After every add: size and allocate the slot pools. k = experts per row. */
tern_status tern_experts_plan(tern_experts *x, int k, tern_error *err);

/* 1 when `layer`'s experts are in the store (registered and planned), else 0. */
int tern_experts_layer(const tern_experts *x, int layer);
/* The MoE block of `layer` over its slots: same arguments and result as vt->moe_mlp. */
void tern_experts_moe_mlp(tern_experts *x, int layer, float *y, const float *xin, int n, int H, const int32_t *idx,
                          const float *wts, int k, int act, float *scratch);

void tern_experts_get_stats(const tern_experts *x, tern_experts_stats *st);

/* `tern fit`: one expert's stored bytes b, E experts per layer, nl MoE layers, k per token,
 * cache cap (bytes): slots per layer S = min(E, max(k, cap / (nl*b))) (0 when cap == 0: off),
 * expected bytes read per decode token with uniform routing (hit rate S/E): nl*k*b*(1 - S/E). */
typedef struct tern_experts_fit {
    int slots;
    double resident_frac;     /* S / E */
    size_t resident_bytes;    /* nl * S * b */
    double bytes_per_token;   /* expected misses' bytes per decode token */
} tern_experts_fit;
void tern_experts_fit_plan(size_t expert_bytes, int E, int nl, int k, size_t cap, tern_experts_fit *f);

#endif
