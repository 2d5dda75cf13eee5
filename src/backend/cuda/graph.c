/*
 * graph.c — CUDA graphs for whole forward steps, and asynchronous small uploads.
 *
 * A decode step is hundreds of small kernels; launching them one by one costs more than the
 * kernels themselves. The forward driver (src/model/model.c) asks for a graph per step shape
 * (`key`: model, KV views, row count, input kind); the first time, the step's ops are recorded
 * by stream capture (nothing runs), instantiated, and from then on each step is one
 * cudaGraphLaunch. Every kernel of the step reads positions, slots and tokens from device
 * buffers the driver uploads before the launch, so one graph serves every step of that shape;
 * while recording, attention ignores the host copies of positions (it sizes its grid for the
 * whole context and lets the blocks past a row's last key exit early).
 *
 * Downloads made while recording become copies into pinned staging owned by the graph (at the
 * same offset as in the caller's output range); replay copies them out after the launch. The
 * staging has two halves (the second allocated at its first use): a launch that does not wait
 * (graph_launch, the pipelined decode) names a half, and the graph's copy nodes are pointed at it
 * (cudaGraphExecMemcpyNodeSetParams1D, which leaves launches already queued alone), so two queued
 * steps of one graph never write the same outputs — one graph serves both parities of the
 * pipeline.
 * An upload or a download outside the output range while recording marks the recording bad:
 * graph_end then drops it and the driver runs the step eagerly. At most TERN_CUDA_MAX_GRAPHS
 * graphs are kept (least recently used goes first).
 *
 * Uploads of up to 1/16 of the pinned ring are copied into the ring and enqueued without a
 * wait (the caller may reuse its buffer at once); when the ring wraps, the stream is drained
 * first so that no pending copy still reads the part being overwritten.
 */
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_COPIES 8

typedef struct tern__cuda_graph {
    uint64_t key;
    int used;
    cudaGraph_t graph; /* kept: its copy nodes are the handles graph_launch retargets */
    cudaGraphExec_t exec;
    uint8_t *pin[2];   /* pinned staging for the step's downloads, two halves of pin_bytes (the second lazily) */
    size_t pin_bytes;
    int half;          /* the half the copy nodes write now */
    int n_copies;
    size_t off[MAX_COPIES], bytes[MAX_COPIES];
    const void *src[MAX_COPIES];     /* the device side of each recorded download */
    cudaGraphNode_t node[MAX_COPIES]; /* its copy node (NULL: not found, the graph cannot switch halves) */
    uint64_t last_use;
    cudaEvent_t done[2]; /* graph_launch: recorded after the last launch into each half, for graph_wait */
} tern__cuda_graph;

static void drop(tern__cuda_graph *g) {
    if (!g->used) return;
    for (int h = 0; h < 2; h++)
        if (g->done[h]) { /* a launch without a wait may still be running */
            cudaEventSynchronize(g->done[h]);
            cudaEventDestroy(g->done[h]);
        }
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    for (int h = 0; h < 2; h++)
        if (g->pin[h]) cudaFreeHost(g->pin[h]);
    memset(g, 0, sizeof *g);
}

tern_status tern__cuda_graph_open(tern__cuda *c, tern_error *err) {
    c->graphs = calloc(TERN_CUDA_MAX_GRAPHS, sizeof *c->graphs);
    if (!c->graphs) return tern_err(err, TERN_ENOMEM, "cuda: out of host memory");
    if (cudaHostAlloc((void **)&c->up_ring, TERN_CUDA_UP_RING, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        c->up_ring = NULL; /* uploads stay synchronous */
    }
    return TERN_OK;
}

void tern__cuda_graph_close(tern__cuda *c) {
    if (!c) return;
    if (c->graphs) {
        for (int i = 0; i < TERN_CUDA_MAX_GRAPHS; i++) drop(&c->graphs[i]);
        free(c->graphs);
        c->graphs = NULL;
    }
    if (c->up_ring) cudaFreeHost(c->up_ring);
    c->up_ring = NULL;
}

void tern__cuda_graph_reset(tern__cuda *c) {
    if (!c->graphs) return;
    cudaStreamSynchronize(c->stream);
    for (int i = 0; i < TERN_CUDA_MAX_GRAPHS; i++) drop(&c->graphs[i]);
}

int tern__cuda_upload_async(tern__cuda *c, void *dst, const void *src, size_t bytes) {
    if (c->capturing) {
        c->capture_bad = 1; /* the recorded step would miss this data */
        return 1;
    }
    if (!c->up_ring || bytes > TERN_CUDA_UP_RING / 16) return 0;
    size_t need = (bytes + 255) & ~(size_t)255;
    if (c->up_off + need > TERN_CUDA_UP_RING) {
        cudaStreamSynchronize(c->stream);
        c->up_off = 0;
    }
    uint8_t *p = c->up_ring + c->up_off;
    memcpy(p, src, bytes);
    c->up_off += need;
    cudaError_t e = cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess && c->sticky == cudaSuccess) {
        c->sticky = e;
        tern_log(TERN_LOG_ERROR, "cuda: upload: %s", cudaGetErrorString(e));
    }
    return 1;
}

int tern__cuda_download_recorded(tern__cuda *c, void *dst, const void *src, size_t bytes) {
    if (!c->capturing) return 0;
    tern__cuda_graph *g = c->cap;
    const uint8_t *d = dst;
    if (!g || !c->cap_out || d < c->cap_out || bytes > c->cap_out_bytes ||
        (size_t)(d - c->cap_out) > c->cap_out_bytes - bytes || g->n_copies == MAX_COPIES) {
        c->capture_bad = 1;
        return 1;
    }
    size_t off = (size_t)(d - c->cap_out);
    if (cudaMemcpyAsync(g->pin[0] + off, src, bytes, cudaMemcpyDeviceToHost, c->stream) != cudaSuccess) {
        c->capture_bad = 1;
        return 1;
    }
    g->src[g->n_copies] = src;
    g->off[g->n_copies] = off;
    g->bytes[g->n_copies++] = bytes;
    return 1;
}

static tern__cuda_graph *find(tern__cuda *c, uint64_t key) {
    if (!c->graphs) return NULL;
    for (int i = 0; i < TERN_CUDA_MAX_GRAPHS; i++)
        if (c->graphs[i].used && c->graphs[i].exec && c->graphs[i].key == key) return &c->graphs[i];
    return NULL;
}

/* a failed launch or wait: the backend's sticky error (the first one is logged) */
static void graph_error(tern__cuda *c, cudaError_t e, const char *what) {
    cudaGetLastError();
    if (c->sticky == cudaSuccess) {
        c->sticky = e;
        tern_log(TERN_LOG_ERROR, "cuda: %s: %s", what, cudaGetErrorString(e));
    }
}

/* the downloads a finished launch of g recorded into half h, from its pinned staging into the caller's output range */
static void copy_out(const tern__cuda_graph *g, int h, void *out) {
    for (int i = 0; i < g->n_copies; i++) memcpy((uint8_t *)out + g->off[i], g->pin[h] + g->off[i], g->bytes[i]);
}

/* graph_end: each recorded download's copy node (matched by its pinned destination), for set_half */
static void find_copy_nodes(tern__cuda_graph *g) {
    size_t n = 0;
    if (!g->n_copies || cudaGraphGetNodes(g->graph, NULL, &n) != cudaSuccess || !n) return;
    cudaGraphNode_t *all = malloc(n * sizeof *all);
    if (all && cudaGraphGetNodes(g->graph, all, &n) == cudaSuccess) {
        for (size_t k = 0; k < n; k++) {
            enum cudaGraphNodeType t;
            struct cudaMemcpy3DParms p;
            if (cudaGraphNodeGetType(all[k], &t) != cudaSuccess || t != cudaGraphNodeTypeMemcpy ||
                cudaGraphMemcpyNodeGetParams(all[k], &p) != cudaSuccess)
                continue;
            for (int i = 0; i < g->n_copies; i++)
                if ((uint8_t *)p.dstPtr.ptr + p.dstPos.x == g->pin[0] + g->off[i]) g->node[i] = all[k];
        }
    }
    free(all);
    cudaGetLastError();
}

/* point g's copy nodes at half h (allocated at its first use); 0 when it cannot (logged once) */
static int set_half(tern__cuda_graph *g, int h) {
    static int warned;
    if (g->half == h || !g->n_copies) {
        g->half = h;
        return 1;
    }
    cudaError_t e = cudaSuccess;
    if (!g->pin[h]) e = cudaHostAlloc((void **)&g->pin[h], g->pin_bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) g->pin[h] = NULL;
    for (int i = 0; i < g->n_copies && e == cudaSuccess; i++)
        e = g->node[i] ? cudaGraphExecMemcpyNodeSetParams1D(g->exec, g->node[i], g->pin[h] + g->off[i], g->src[i],
                                                            g->bytes[i], cudaMemcpyDeviceToHost)
                       : cudaErrorInvalidValue; /* its node was not found at graph_end */
    if (e != cudaSuccess) { /* the nodes may point at mixed halves: the caller drops the graph */
        cudaGetLastError();
        if (!warned++)
            tern_log(TERN_LOG_WARN, "cuda: a step graph's outputs cannot switch staging halves (%s): the pipelined "
                     "decode waits for each step instead", cudaGetErrorString(e));
        return 0;
    }
    g->half = h;
    return 1;
}

int tern__cuda_graph_replay(tern__cuda *c, uint64_t key, void *out, size_t out_bytes) {
    tern__cuda_graph *g = find(c, key);
    if (!g || c->capturing || (g->n_copies && (!out || out_bytes < g->pin_bytes))) return 0;
    cudaSetDevice(c->device);
    const double t0 = tern_time_s();
    cudaError_t e = cudaGraphLaunch(g->exec, c->stream);
    const double t1 = tern_time_s();
    if (c->gr_last > 0 && t1 - c->gr_last < 5e-4) {
        c->gr_gap += t1 - c->gr_last;
        c->gr_launch += t1 - t0;
        c->gr_n++;
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        graph_error(c, e, "graph launch");
        drop(g);
        return 0;
    }
    copy_out(g, g->half, out);
    g->last_use = ++c->use_clock;
    c->gr_last = tern_time_s();
    return 1;
}

/* A launch that does not wait (ops.h graph_launch; the pipelined decode of runtime/generate.c and sched.c): the step
 * runs after whatever the stream holds, writing its downloads into half h of the staging, and an event marks its end;
 * graph_wait(h) waits for that event and copies half h out. Between the two the caller may queue more work (the next
 * step, into the other half) — half h is rewritten only by a later launch into h, which the caller queues after
 * waiting. */
int tern__cuda_graph_launch(tern__cuda *c, uint64_t key, int h) {
    tern__cuda_graph *g = find(c, key);
    h &= 1;
    if (!g || c->capturing) return 0;
    cudaSetDevice(c->device);
    if (!g->done[h] && cudaEventCreateWithFlags(&g->done[h], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        g->done[h] = NULL;
        return 0;
    }
    if (!set_half(g, h)) {
        drop(g);
        return 0;
    }
    cudaError_t e = cudaGraphLaunch(g->exec, c->stream);
    if (e == cudaSuccess) e = cudaEventRecord(g->done[h], c->stream);
    if (e != cudaSuccess) {
        graph_error(c, e, "graph launch");
        drop(g);
        return 0;
    }
    g->last_use = ++c->use_clock;
    return 1;
}
int tern__cuda_graph_wait(tern__cuda *c, uint64_t key, int h, void *out, size_t out_bytes) {
    tern__cuda_graph *g = find(c, key);
    h &= 1;
    if (!g || !g->done[h] || (g->n_copies && (!out || out_bytes < g->pin_bytes))) return 0;
    cudaSetDevice(c->device);
    const cudaError_t e = cudaEventSynchronize(g->done[h]);
    if (e != cudaSuccess) {
        graph_error(c, e, "graph wait");
        return 0;
    }
    copy_out(g, h, out);
    return 1;
}

/* at close (TERN_LOG=info): what the host spends between back-to-back step graphs — the GPU waits at least that long
 * plus the launch's own latency, since each replay waits for its step's outputs */
void tern__cuda_graph_report(const tern__cuda *c) {
    if (c->gr_n > 0)
        tern_log(TERN_LOG_INFO, "cuda: %ld back-to-back step-graph replays: %.1f us of host time from one's return to the "
                 "next launch's (%.1f of it in cudaGraphLaunch)", c->gr_n, 1e6 * c->gr_gap / (double)c->gr_n,
                 1e6 * c->gr_launch / (double)c->gr_n);
}

int tern__cuda_graph_begin(tern__cuda *c, uint64_t key, void *out, size_t out_bytes) {
    if (!c->graphs || c->capturing) return 0;
    tern__cuda_graph *g = find(c, key);
    if (g) drop(g);
    g = NULL;
    for (int i = 0; i < TERN_CUDA_MAX_GRAPHS && !g; i++)
        if (!c->graphs[i].used) g = &c->graphs[i];
    if (!g) { /* evict the least recently used */
        g = &c->graphs[0];
        for (int i = 1; i < TERN_CUDA_MAX_GRAPHS; i++)
            if (c->graphs[i].last_use < g->last_use) g = &c->graphs[i];
        cudaStreamSynchronize(c->stream);
        drop(g);
    }
    cudaSetDevice(c->device);
    g->used = 1;
    g->key = key;
    if (out && out_bytes) {
        if (cudaHostAlloc((void **)&g->pin[0], out_bytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            drop(g);
            return 0;
        }
        g->pin_bytes = out_bytes;
    }
    cudaStreamSynchronize(c->stream); /* earlier async uploads are done before recording */
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError();
        drop(g);
        return 0;
    }
    c->capturing = 1;
    c->capture_bad = 0;
    c->cap_key = key;
    c->cap_out = out;
    c->cap_out_bytes = out ? out_bytes : 0;
    c->cap = g;
    return 1;
}

int tern__cuda_graph_end(tern__cuda *c, int ok) {
    if (!c->capturing) return 0;
    tern__cuda_graph *g = c->cap;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    c->capturing = 0;
    c->cap = NULL;
    c->cap_out = NULL;
    int keep = ok && !c->capture_bad && e == cudaSuccess && graph;
    if (keep && cudaGraphInstantiate(&g->exec, graph, 0) != cudaSuccess) {
        g->exec = NULL;
        keep = 0;
    }
    if (keep) {
        g->graph = graph;
        find_copy_nodes(g);
    } else if (graph) {
        cudaGraphDestroy(graph);
    }
    cudaGetLastError(); /* a failed recording leaves no sticky error behind */
    if (!keep) {
        if (e != cudaSuccess) tern_log(TERN_LOG_DEBUG, "cuda: graph capture failed: %s", cudaGetErrorString(e));
        drop(g);
        return 0;
    }
    g->last_use = ++c->use_clock;
    return 1;
}
