/*
 * tp.c — the tensor/expert-parallel group of tp.h: ranks, lockstep threads, the shard hook
 * that cuts each rank's weights out of the store, and the CPU communicator.
 *
 * Ranks' backends: each rank wraps the real backend (CPU or CUDA device r) in a copy of its
 * vtable with three changes: allreduce_sum is set (NCCL, or the host sum below), the step-graph
 * entries go through the group (below), and, for MoE models, route_topk (GLM-5: route_group,
 * through a copy of the GLM op table) is followed by a remap of the chosen expert ids to the
 * rank's local stack (id - e0 for its experts, -1 for the others, which moe_mlp skips). The
 * real backend keeps its impl, so every op runs unchanged.
 *
 * Lockstep: rank 0 runs on the caller's thread (the engine thread); ranks 1..N-1 each have a
 * thread that waits on the `start` barrier, runs the same batch through its own model and cache
 * (block tables copied from rank 0's cache first: tern_kv_mirror) and meets at `done`. Every
 * rank validates the same batch identically, so an invalid batch fails on all ranks before any
 * collective. CPU allreduce: every rank publishes its buffer; rank r sums chunk r over the ranks
 * in rank order and writes the sum back to every buffer (two barriers) — the same bits on all
 * ranks, deterministic.
 *
 * Step graphs per rank (CUDA): every rank records its own decode-step graph, NCCL calls
 * included (each rank captures the same collective sequence on its own stream), and replays it
 * from its own thread. A rank that replays while another runs eagerly or records would wait in
 * its all-reduce forever, so every graph decision is the group's: the graph key is the mix of
 * all ranks' keys (exchanged at a spin barrier, one per replay/begin/end), recording starts
 * only where it started on every rank, and a graph is kept only where every rank kept it (else
 * all ranks drop their graphs and the key is never tried again). The rank caches then stay
 * identical, so a lookup hits or misses on all ranks alike. Steps whose wanted rows mix host
 * and device sampling (rank 0 alone would run them eagerly) run eagerly on every rank.
 * TERN_TP_GRAPHS=0 (or TERN_GRAPHS=0) keeps groups eager.
 *
 * Output head, vocabulary-parallel: rank r holds rows [hv0[r], hv0[r] + hvn[r]) of the head
 * (the shard hook cuts lm_head; a tied embedding stays whole for the lookup and model.c takes a
 * row view of it), computes softcap(slice · norm(x)) and gathers it into rank 0's rows
 * (gather_cols) whenever rank 0 wants logits or draws (head_need, set on every rank per step).
 * Each logit is the same dot product as with the whole head: bitwise the replicated layout
 * (TERN_TP_VOCAB=0). Residual adds after o_proj / down_proj go through allreduce_add (the add in
 * the all-reduce: bitwise allreduce + add; TERN_TP_FUSED_ADD=0 separates them). On 2 H200s (bench/NOTES.md
 * (m)): fused add bitwise, the split head within 1.7e-7 of the replicated one (cuBLAS over fewer rows),
 * greedy ids equal; llama3-8b bf16 b1 222.9 -> 229.0 tok/s, b64 3780 -> 3886.
 */
#include "model/tp.h"
#include "model/internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct tp_rank {
    tern_backend be;          /* first: the rank's backend as model code sees it */
    tern_backend_vt vt;       /* copy of the real vtable with allreduce / remap / group graphs */
    tern_backend_vt test_vt;  /* tern__tp_test_graphs: the real vtable plus the test's graph ops */
    tern_glm_ops glm;         /* copy of the real GLM op table with route_group remapped (GLM-5) */
    tern_backend *real;
    struct tern_tp *tp;
    int rank;
    int e0, e1;               /* local experts [e0, e1) (MoE) */
    tern_model_config cfg;    /* rank-local config (layers owned) */
    tern_model *m;
    tern_kv *kv;
    pthread_t thread;
    int has_thread;
    tern_status st;
    tern_error err;
    unsigned xround;          /* exchanges done (the slot parity of the next one) */
    uint64_t cap_g;           /* group key of the graph being recorded */
} tp_rank;

/* A barrier that spins (then yields): for the few short waits inside a step. */
typedef struct spin_bar {
    atomic_int count;
    atomic_uint gen;
} spin_bar;

#define TP_MAX_BAD 32

struct tern_tp {
    int n, cuda;
    tp_rank r[TERN_TP_MAX];
    tern__nccl *nccl;
    /* lockstep */
    pthread_barrier_t start, done, ar;
    int barriers;
    int quit;
    const tern_batch *job;
    /* CPU allreduce (+ the residual of allreduce_add), CPU gather (rank 0's destination) */
    float *ar_ptr[TERN_TP_MAX], *ax_ptr[TERN_TP_MAX], *gdst;
    /* vocabulary-parallel head: rank r's rows [hv0[r], hv0[r] + hvn[r]) (hvn[0] 0: replicated) */
    int hv0[TERN_TP_MAX], hvn[TERN_TP_MAX];
    int vocab_off, add_off;   /* TERN_TP_VOCAB=0, TERN_TP_FUSED_ADD=0 (read at open) */
    /* step graphs: exchanged values (two slots: one barrier per exchange), keys never to retry */
    spin_bar xbar;
    uint64_t xval[2][TERN_TP_MAX];
    uint64_t bad[TP_MAX_BAD];
    int n_bad;
    int step_eager;           /* this step runs eagerly on every rank (set before the ranks start) */
    int graphs_off;           /* TERN_TP_GRAPHS=0 */
    /* gathered weight columns (o_proj / down_proj), freed at close */
    void **bufs;
    int n_bufs, cap_bufs;
    const tern_model_config *gcfg; /* the global config while loading */
    tern_model_config *own_cfg;
    tern_weights *own_ws;
};

int tern_tp_env(void) {
    const char *e = getenv("TERN_TP");
    int n = e ? atoi(e) : 1;
    return n >= 1 && n <= TERN_TP_MAX ? n : 1;
}

int tern_tp_size(const tern_tp *tp) { return tp ? tp->n : 1; }
tern_backend *tern_tp_backend(const tern_tp *tp, int rank) {
    return tp && rank >= 0 && rank < tp->n ? (tern_backend *)&tp->r[rank].be : NULL;
}

/* ---- communication --------------------------------------------------------------------- */

/* y = the rank-order sum of every rank's y (x == NULL), or x += that sum: two barriers, each rank
 * sums one chunk for all (bitwise allreduce then add: one rounding per add, addition commutes) */
static void cpu_sum(tp_rank *rk, float *x, float *y, size_t count) {
    tern_tp *tp = rk->tp;
    int n = tp->n, r = rk->rank;
    tp->ar_ptr[r] = y;
    tp->ax_ptr[r] = x;
    pthread_barrier_wait(&tp->ar);
    size_t lo = count * (size_t)r / (size_t)n, hi = count * (size_t)(r + 1) / (size_t)n;
    for (size_t i = lo; i < hi; i++) {
        float s = tp->ar_ptr[0][i];
        for (int q = 1; q < n; q++) s += tp->ar_ptr[q][i];
        if (x)
            for (int q = 0; q < n; q++) tp->ax_ptr[q][i] = tp->ax_ptr[q][i] + s;
        else
            for (int q = 0; q < n; q++) tp->ar_ptr[q][i] = s;
    }
    pthread_barrier_wait(&tp->ar);
}

static void cpu_allreduce(tern_backend *be, float *y, size_t count) { cpu_sum((tp_rank *)be, NULL, y, count); }

static void cpu_allreduce_add(tern_backend *be, float *x, float *y, size_t count) {
    cpu_sum((tp_rank *)be, x, y, count);
}

/* Every rank copies its logits slice into rank 0's rows (rank 0 publishes them first). */
static void cpu_gather_cols(tern_backend *be, float *dst, const float *src, int rows, int ld, int c0, int w) {
    tp_rank *rk = (tp_rank *)be;
    tern_tp *tp = rk->tp;
    if (rk->rank == 0) tp->gdst = dst;
    pthread_barrier_wait(&tp->ar);
    for (int i = 0; i < rows && tp->gdst; i++)
        memcpy(tp->gdst + (size_t)i * ld + c0, src + (size_t)i * w, sizeof(float) * (size_t)w);
    pthread_barrier_wait(&tp->ar);
}

#ifdef TERN_HAVE_CUDA
static void cuda_allreduce(tern_backend *be, float *y, size_t count) {
    tp_rank *rk = (tp_rank *)be;
    tern__nccl_allreduce(rk->tp->nccl, rk->rank, rk->real, y, count);
}

static void cuda_allreduce_add(tern_backend *be, float *x, float *y, size_t count) {
    tp_rank *rk = (tp_rank *)be;
    if (tern__nccl_allreduce_add(rk->tp->nccl, rk->rank, rk->real, x, y, count)) return;
    tern__nccl_allreduce(rk->tp->nccl, rk->rank, rk->real, y, count); /* NCCL sizes: then one add */
    rk->real->vt->add(rk->real, x, x, y, count);
}

static void cuda_gather_cols(tern_backend *be, float *dst, const float *src, int rows, int ld, int c0, int w) {
    tp_rank *rk = (tp_rank *)be;
    (void)c0; (void)w; /* the group's table says where every rank's slice goes */
    tern__nccl_gather_cols(rk->tp->nccl, rk->rank, rk->real, dst, src, rows, ld, rk->tp->hv0, rk->tp->hvn);
}
#endif

/* route_topk, then the chosen ids mapped to this rank's expert stack (-1: not here). */
static void route_local(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                        int mode, const float *pes) {
    tp_rank *rk = (tp_rank *)be;
    rk->real->vt->route_topk(be, idx, wts, logits, n, E, k, mode, pes);
#ifdef TERN_HAVE_CUDA
    if (rk->real->device >= 0) { tern__cuda_expert_remap(rk->real, idx, n * k, rk->e0, rk->e1); return; }
#endif
    for (int i = 0; i < n * k; i++) idx[i] = idx[i] >= rk->e0 && idx[i] < rk->e1 ? idx[i] - rk->e0 : -1;
}

/* GLM-5: the grouped sigmoid routing (replicated: every rank routes every row), then the same
 * remap to this rank's expert stack. */
static void route_group_local(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                              const tern_route_group *p) {
    tp_rank *rk = (tp_rank *)be;
    rk->real->vt->glm->route_group(be, idx, wts, logits, n, E, k, p);
#ifdef TERN_HAVE_CUDA
    if (rk->real->device >= 0) { tern__cuda_expert_remap(rk->real, idx, n * k, rk->e0, rk->e1); return; }
#endif
    for (int i = 0; i < n * k; i++) idx[i] = idx[i] >= rk->e0 && idx[i] < rk->e1 ? idx[i] - rk->e0 : -1;
}

/* ---- step graphs of the group ------------------------------------------------------------ */

static void spin_wait(spin_bar *b, int n) {
    unsigned g = atomic_load(&b->gen);
    if (atomic_fetch_add(&b->count, 1) == n - 1) { /* last in: release the others */
        atomic_store(&b->count, 0);
        atomic_fetch_add(&b->gen, 1);
        return;
    }
    for (unsigned i = 0; atomic_load(&b->gen) == g; i++)
        if (i > 4096) sched_yield();
}

/* Every rank puts v in, every rank gets all ranks' values out (same order on all ranks). Two
 * slots used alternately: a rank can only reuse a slot after every rank passed the barrier of
 * the exchange in between, i.e. after every rank read it. */
static void exchange(tp_rank *rk, uint64_t v, uint64_t *all) {
    tern_tp *tp = rk->tp;
    unsigned p = rk->xround++ & 1;
    tp->xval[p][rk->rank] = v;
    spin_wait(&tp->xbar, tp->n);
    for (int q = 0; q < tp->n; q++) all[q] = tp->xval[p][q];
}

/* The group's key: the ranks' keys mixed in rank order (the same value on every rank). */
static uint64_t group_key(tp_rank *rk, uint64_t key) {
    uint64_t all[TERN_TP_MAX], h = 0x243f6a8885a308d3ULL;
    exchange(rk, key, all);
    for (int q = 0; q < rk->tp->n; q++) {
        h ^= all[q] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        h *= 0xbf58476d1ce4e5b9ULL;
    }
    return h ^ (h >> 31);
}

static int all_true(tp_rank *rk, int v) {
    uint64_t all[TERN_TP_MAX];
    exchange(rk, (uint64_t)(v != 0), all);
    for (int q = 0; q < rk->tp->n; q++)
        if (!all[q]) return 0;
    return 1;
}

static int is_bad(const tern_tp *tp, uint64_t g) {
    for (int i = 0; i < tp->n_bad; i++)
        if (tp->bad[i] == g) return 1;
    return 0;
}

static int tp_graph_replay(tern_backend *be, uint64_t key, void *out, size_t out_bytes) {
    tp_rank *rk = (tp_rank *)be;
    if (rk->tp->step_eager || rk->tp->graphs_off) return 0;
    uint64_t g = group_key(rk, key);
    if (is_bad(rk->tp, g)) return 0;
    return rk->real->vt->graph_replay(rk->real, g, out, out_bytes);
}

static int tp_graph_begin(tern_backend *be, uint64_t key, void *out, size_t out_bytes) {
    tp_rank *rk = (tp_rank *)be;
    if (rk->tp->step_eager || rk->tp->graphs_off) return 0;
    uint64_t g = group_key(rk, key);
    int ok = !is_bad(rk->tp, g) && rk->real->vt->graph_begin(rk->real, g, out, out_bytes);
    rk->cap_g = g;
    if (all_true(rk, ok)) return 1;
    if (ok) rk->real->vt->graph_end(rk->real, 0); /* another rank could not start: drop ours */
    return 0;
}

static int tp_graph_end(tern_backend *be, int ok) {
    tp_rank *rk = (tp_rank *)be;
    tern_tp *tp = rk->tp;
    int kept = rk->real->vt->graph_end(rk->real, ok);
    if (all_true(rk, kept)) return 1;
    /* not kept everywhere: every rank drops every graph (the caches stay the same on all ranks)
     * and rank 0 notes the key, read by the others only after the next exchange */
    rk->real->vt->graph_reset(rk->real);
    if (rk->rank == 0 && tp->n_bad < TP_MAX_BAD) {
        tp->bad[tp->n_bad++] = rk->cap_g;
        tern_log(TERN_LOG_WARN, "tensor parallel: a step graph was not kept on every rank: that step shape runs eagerly");
    }
    return 0;
}

static void tp_graph_reset(tern_backend *be) {
    tp_rank *rk = (tp_rank *)be;
    rk->real->vt->graph_reset(rk->real);
}

/* TERN_TP_VOCAB=0 / TERN_TP_FUSED_ADD=0: the replicated head / the separate add (both on otherwise) */
static int env_off(const char *name) {
    const char *e = getenv(name);
    return e && e[0] == '0';
}

static int tp_graphs_enabled(void) {
    const char *e = getenv("TERN_TP_GRAPHS");
    return !(e && e[0] == '0');
}

/* A step is eager on every rank when rank 0 samples some wanted rows on the device and others
 * on the host (its driver runs such steps eagerly: model.c forward_graph). */
static int mixed_sampling(const tern_model *m, const tern_batch *b) {
    if (!m->samp) return 0;
    int n_want = 0, dev = 0;
    for (int r = 0; r < b->n; r++) n_want += !b->want || b->want[r];
    for (int k = 0; k < n_want; k++) dev += m->samp->rows[k].mode == TERN_SAMPLE_DRAW;
    return dev > 0 && dev < n_want;
}

void tern__tp_test_graphs(tern_tp *tp, const tern_tp_graph_ops *ops) {
    if (!tp || !ops || tp->n < 2) return;
    for (int r = 0; r < tp->n; r++) {
        tp_rank *rk = &tp->r[r];
        rk->test_vt = *rk->real->vt;
        rk->test_vt.graph_replay = ops->replay;
        rk->test_vt.graph_begin = ops->begin;
        rk->test_vt.graph_end = ops->end;
        rk->test_vt.graph_reset = ops->reset;
        rk->real->vt = &rk->test_vt;
        rk->vt.graph_replay = tp_graph_replay;
        rk->vt.graph_begin = tp_graph_begin;
        rk->vt.graph_end = tp_graph_end;
        rk->vt.graph_reset = tp_graph_reset;
    }
}

/* ---- open / close ---------------------------------------------------------------------- */

/* The calling thread's current GPU := rank's (CUDA ops that do not set it use the current one). */
static void bind(const tp_rank *rk) {
#ifdef TERN_HAVE_CUDA
    if (rk->real && rk->real->device >= 0) tern__cuda_bind(rk->real);
#else
    (void)rk;
#endif
}

static void *rank_main(void *arg) {
    tp_rank *rk = arg;
    tern_tp *tp = rk->tp;
    bind(rk);
    for (;;) {
        pthread_barrier_wait(&tp->start);
        if (tp->quit) break;
        memset(&rk->err, 0, sizeof rk->err);
        rk->st = tern__model_forward_local(rk->m, tp->job, rk->kv, NULL, &rk->err);
        pthread_barrier_wait(&tp->done);
    }
    return NULL;
}

tern_status tern_tp_open(tern_tp **out, const tern_tp_opts *o, tern_error *err) {
    *out = NULL;
    if (!o || o->n < 1 || o->n > TERN_TP_MAX)
        return tern_err(err, TERN_EINVAL, "tensor parallel: %d ranks requested, expected 1..%d", o ? o->n : 0, TERN_TP_MAX);
    tern_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return tern_err(err, TERN_ENOMEM, "out of memory");
    tp->n = o->n;
    tp->cuda = o->cuda;
    tp->graphs_off = !tp_graphs_enabled();
    tp->vocab_off = env_off("TERN_TP_VOCAB");
    tp->add_off = env_off("TERN_TP_FUSED_ADD");
    tern_status st = TERN_OK;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = o->n_threads > 0 ? o->n_threads : (int)(ncpu > 0 ? ncpu : 1);
    for (int r = 0; r < tp->n && !st; r++) {
        tern_backend_opts bo = {.n_threads = TERN_MAX(1, threads / tp->n), .device = r, .compute = o->compute};
        tp_rank *rk = &tp->r[r];
        rk->tp = tp;
        rk->rank = r;
        st = o->cuda ? tern_backend_cuda_open(&rk->real, &bo, err) : tern_backend_cpu_open(&rk->real, &bo, err);
        if (st) { st = tern_err_wrap(err, st, "tensor parallel: rank %d (%s %d)", r, o->cuda ? "GPU" : "CPU", r); break; }
        rk->vt = *rk->real->vt;
        if (tp->n > 1) { /* graphs go through the group (CUDA ranks; CPU backends have none) */
            int has = rk->vt.graph_replay && rk->vt.graph_begin && rk->vt.graph_end && rk->vt.graph_reset;
            rk->vt.graph_replay = has ? tp_graph_replay : NULL;
            rk->vt.graph_begin = has ? tp_graph_begin : NULL;
            rk->vt.graph_end = has ? tp_graph_end : NULL;
            rk->vt.graph_reset = has ? tp_graph_reset : NULL;
        }
        rk->vt.close = NULL; /* the real backend is closed by tern_tp_close */
        rk->vt.allreduce_sum = tp->n > 1 ? cpu_allreduce : NULL;
        rk->vt.allreduce_add = tp->n > 1 && !tp->add_off ? cpu_allreduce_add : NULL;
        rk->vt.gather_cols = tp->n > 1 ? cpu_gather_cols : NULL;
        rk->be = *rk->real;
        rk->be.vt = &rk->vt;
    }
#ifdef TERN_HAVE_CUDA
    if (!st && o->cuda && tp->n > 1) {
        tern_backend *bes[TERN_TP_MAX];
        for (int r = 0; r < tp->n; r++) bes[r] = tp->r[r].real;
        st = tern__nccl_open(&tp->nccl, bes, tp->n, err);
        for (int r = 0; r < tp->n && !st; r++) {
            tp->r[r].vt.allreduce_sum = cuda_allreduce;
            tp->r[r].vt.allreduce_add = tp->add_off ? NULL : cuda_allreduce_add;
            tp->r[r].vt.gather_cols = cuda_gather_cols;
        }
    }
#else
    if (!st && o->cuda) st = tern_err(err, TERN_EUNSUPPORTED, "tensor parallel on GPUs needs a CUDA build");
#endif
    if (!st) {
        unsigned n = (unsigned)tp->n;
        if (pthread_barrier_init(&tp->start, NULL, n) || pthread_barrier_init(&tp->done, NULL, n) ||
            pthread_barrier_init(&tp->ar, NULL, n))
            st = tern_err(err, TERN_EINTERNAL, "tensor parallel: cannot create barriers");
        else tp->barriers = 1;
    }
    for (int r = 1; r < tp->n && !st; r++) {
        if (pthread_create(&tp->r[r].thread, NULL, rank_main, &tp->r[r]))
            st = tern_err(err, TERN_EINTERNAL, "tensor parallel: cannot start the thread of rank %d", r);
        else tp->r[r].has_thread = 1;
    }
    if (st) { tern_tp_close(tp); return st; }
    *out = tp;
    return TERN_OK;
}

void tern_tp_close(tern_tp *tp) {
    if (!tp) return;
    int running = 1, stuck = 0;
    for (int r = 1; r < tp->n; r++) running &= tp->r[r].has_thread;
    for (int r = 1; r < tp->n; r++) stuck |= !running && tp->r[r].has_thread;
    if (tp->barriers && running && tp->n > 1) {
        tp->quit = 1;
        pthread_barrier_wait(&tp->start);
    }
    for (int r = 1; r < tp->n; r++) { /* threads left waiting by a failed open cannot be woken: let them be */
        if (tp->r[r].has_thread && running) pthread_join(tp->r[r].thread, NULL);
        else if (tp->r[r].has_thread) pthread_detach(tp->r[r].thread);
    }
    for (int r = 0; r < tp->n; r++) {
        tp_rank *rk = &tp->r[r];
        bind(rk);
        tern_kv_close(rk->kv);
        tern_model_free(rk->m);
        free(rk->cfg.layers);
    }
#ifdef TERN_HAVE_CUDA
    tern__nccl_close(tp->nccl);
#endif
    for (int r = 0; r < tp->n; r++) tern_backend_close(tp->r[r].real);
    if (stuck) return; /* a thread still waits on tp->start: keep the barriers and the struct (leaked) */
    if (tp->barriers) {
        pthread_barrier_destroy(&tp->start);
        pthread_barrier_destroy(&tp->done);
        pthread_barrier_destroy(&tp->ar);
    }
    for (int i = 0; i < tp->n_bufs; i++) tern_afree(tp->bufs[i]);
    free(tp->bufs);
    tern_weights_close(tp->own_ws);
    if (tp->own_cfg) { tern_config_free(tp->own_cfg); free(tp->own_cfg); }
    free(tp);
}

/* ---- geometry: what each rank holds ----------------------------------------------------- */

/* KV heads of rank r in layer l: [*kv0, *kv0 + *nkv). Split with their q heads, or one
 * replicated head per rank when the layer has fewer kv heads than ranks. */
static void kv_heads(const tern_model_config *c, int N, int r, int l, int *kv0, int *nkv) {
    int nKV = c->layers[l].n_head_kv, nHl = c->n_head / N;
    if (nKV % N == 0) { *nkv = nKV / N; *kv0 = r * *nkv; return; }
    *nkv = 1;
    *kv0 = r * nHl / (c->n_head / nKV);
}

/* GLM-5: heads, the dense width, the experts and the shared-expert width must divide by N
 * (the latent cache, indexer and router are replicated: no constraint from them). */
static tern_status check_geometry_glm(const tern_model_config *c, int N, tern_error *err) {
    int dense = 0, moe = 0, Is = c->n_ff_expert * c->n_shared_experts;
    for (int l = 0; l < c->n_layer; l++) moe |= c->layers[l].moe, dense |= !c->layers[l].moe;
    if (c->n_head % N)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: num_attention_heads %d is not a multiple of %d ranks",
                        c->n_head, N);
    if (dense && c->n_ff % N)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: intermediate_size %d (dense layers) is not a multiple "
                        "of %d ranks", c->n_ff, N);
    if (moe && c->n_expert % N)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: %d experts do not split over %d ranks", c->n_expert, N);
    if (moe && Is % N)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: shared experts' width %d (moe_intermediate_size x "
                        "n_shared_experts) is not a multiple of %d ranks", Is, N);
    return TERN_OK;
}

static tern_status check_geometry(const tern_model_config *c, int N, tern_error *err) {
    if (c->arch == TERN_ARCH_GLM5) return check_geometry_glm(c, N, err);
    if (c->n_head % N)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: num_attention_heads %d is not a multiple of %d ranks",
                        c->n_head, N);
    for (int l = 0; l < c->n_layer; l++) {
        const tern_layer_config *lc = &c->layers[l];
        int nKV = lc->n_head_kv, g = nKV > 0 ? c->n_head / nKV : 0;
        if (nKV <= 0 || c->n_head % nKV)
            return tern_err(err, TERN_EFORMAT, "tensor parallel: layer %d has %d kv heads for %d heads", l, nKV, c->n_head);
        if (nKV % N && (N % nKV || g % (c->n_head / N)))
            return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: layer %d: %d kv heads (%d q heads each) cannot be "
                            "split or replicated over %d ranks", l, nKV, g, N);
        if (lc->n_ff % N)
            return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: layer %d: intermediate_size %d is not a multiple of "
                            "%d ranks", l, lc->n_ff, N);
    }
    if (c->n_expert > 0 && c->n_expert % N)
        return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: %d experts do not split over %d ranks", c->n_expert, N);
    return TERN_OK;
}

/* ---- the shard hook (weights.h) --------------------------------------------------------- */

enum { CUT_NONE, CUT_ROWS, CUT_COLS, CUT_EXPERTS };

static void *keep_buf(tern_tp *tp, size_t bytes) {
    if (tp->n_bufs == tp->cap_bufs) {
        int nc = tp->cap_bufs ? 2 * tp->cap_bufs : 64;
        void **nb = realloc(tp->bufs, sizeof *nb * (size_t)nc);
        if (!nb) return NULL;
        tp->bufs = nb;
        tp->cap_bufs = nc;
    }
    void *p = tern_aalloc(bytes ? bytes : 64);
    if (p) tp->bufs[tp->n_bufs++] = p;
    return p;
}

/* GLM-5's cuts (rank r of N, layer l, name after "layers.L."): heads of q_b_proj (rows of
 * nope+rope), kv_b_proj (rows of nope+v per head), embed_q / unembed_out (stacks by head) and
 * o_proj (input columns of v per head); dense and shared-expert MLPs like a dense MLP; routed
 * experts by id. Everything else (q_a, kv_a, norms, indexer, router) is replicated. */
static int plan_cut_glm(const tern_model_config *c, int N, int r, const char *rest, int bias, int *lo, int *cnt,
                        int64_t *full) {
    int H = c->n_head, Hl = H / N, dq = c->qk_nope_head_dim + c->qk_rope_head_dim;
    int dkv = c->qk_nope_head_dim + c->v_head_dim, dv = c->v_head_dim;
    int Is = c->n_ff_expert * c->n_shared_experts, Il = c->n_ff / N;
    if (bias) return CUT_NONE;
#define CUT(unit, total, kind) do { *lo = r * (unit); *cnt = (unit); *full = (total); return (kind); } while (0)
    if (!strcmp(rest, "self_attn.q_b_proj")) CUT(Hl * dq, (int64_t)H * dq, CUT_ROWS);
    if (!strcmp(rest, "self_attn.kv_b_proj")) CUT(Hl * dkv, (int64_t)H * dkv, CUT_ROWS);
    if (!strcmp(rest, "self_attn.embed_q") || !strcmp(rest, "self_attn.unembed_out")) CUT(Hl, H, CUT_EXPERTS);
    if (!strcmp(rest, "self_attn.o_proj")) CUT(Hl * dv, (int64_t)H * dv, CUT_COLS);
    if (!strcmp(rest, "mlp.gate_proj") || !strcmp(rest, "mlp.up_proj")) CUT(Il, c->n_ff, CUT_ROWS);
    if (!strcmp(rest, "mlp.down_proj")) CUT(Il, c->n_ff, CUT_COLS);
    if (!strcmp(rest, "mlp.shared_experts.gate_proj") || !strcmp(rest, "mlp.shared_experts.up_proj"))
        CUT(Is / N, Is, CUT_ROWS);
    if (!strcmp(rest, "mlp.shared_experts.down_proj")) CUT(Is / N, Is, CUT_COLS);
    if (!strcmp(rest, "experts.gate") || !strcmp(rest, "experts.up") || !strcmp(rest, "experts.down"))
        CUT(c->n_expert / N, c->n_expert, CUT_EXPERTS);
#undef CUT
    return CUT_NONE;
}

/* Which cut applies to `name` for rank r, and the slice [*lo, *lo + *cnt) of *full. */
static int plan_cut(const tern_tp *tp, int r, const char *name, int *lo, int *cnt, int64_t *full, int *bias) {
    const tern_model_config *c = tp->gcfg;
    int N = tp->n, l = -1, off = 0;
    *bias = 0;
    if (!strcmp(name, "lm_head")) { /* vocabulary-parallel head (a stored tied copy too: ignored) */
        if (!tp->hvn[r]) return CUT_NONE;
        *lo = tp->hv0[r]; *cnt = tp->hvn[r]; *full = c->n_vocab; return CUT_ROWS;
    }
    if (sscanf(name, "layers.%d.%n", &l, &off) != 1 || !off || l < 0 || l >= c->n_layer) return CUT_NONE;
    const char *rest = name + off;
    const tern_layer_config *lc = &c->layers[l];
    int D = lc->head_dim, nHl = c->n_head / N, kv0, nkv, Il = lc->n_ff / N;
    kv_heads(c, N, r, l, &kv0, &nkv);
    size_t rl = strlen(rest);
    *bias = rl > 5 && !strcmp(rest + rl - 5, ".bias");
    char base[64];
    snprintf(base, sizeof base, "%.*s", (int)(*bias ? rl - 5 : rl), rest);
    if (c->arch == TERN_ARCH_GLM5) return plan_cut_glm(c, N, r, base, *bias, lo, cnt, full);
    if (!strcmp(base, "self_attn.q_proj")) { *lo = r * nHl * D; *cnt = nHl * D; *full = (int64_t)c->n_head * D; return CUT_ROWS; }
    if (!strcmp(base, "self_attn.k_proj") || !strcmp(base, "self_attn.v_proj")) {
        *lo = kv0 * D; *cnt = nkv * D; *full = (int64_t)lc->n_head_kv * D; return CUT_ROWS;
    }
    if (*bias) return CUT_NONE;
    if (!strcmp(base, "mlp.gate_proj") || !strcmp(base, "mlp.up_proj")) { *lo = r * Il; *cnt = Il; *full = lc->n_ff; return CUT_ROWS; }
    if (!strcmp(base, "self_attn.o_proj")) { *lo = r * nHl * D; *cnt = nHl * D; *full = (int64_t)c->n_head * D; return CUT_COLS; }
    if (!strcmp(base, "mlp.down_proj")) { *lo = r * Il; *cnt = Il; *full = lc->n_ff; return CUT_COLS; }
    if (c->n_expert > 0 && (!strcmp(base, "experts.gate") || !strcmp(base, "experts.up") || !strcmp(base, "experts.down"))) {
        int El = c->n_expert / N;
        *lo = r * El; *cnt = El; *full = c->n_expert; return CUT_EXPERTS;
    }
    return CUT_NONE;
}

static size_t scale_row_bytes(const tern_tensor *t) { /* scales (or biases) of one weight row */
    return (size_t)(t->shape[t->ndim - 1] / t->group_size) * tern_dtype_size(t->sdtype);
}

static int cut_rows(tern_tensor *t, int lo, int cnt, const char *name, tern_error *err) {
    if (t->ndim == 1) {
        size_t es = tern_dtype_size(t->dtype);
        if (!es || t->dtype == TERN_DT_Q) return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: '%s': cannot split dtype %s", name, tern_dtype_name(t->dtype));
        t->data = (const uint8_t *)t->data + (size_t)lo * es;
        t->shape[0] = cnt;
        return 1;
    }
    size_t rb = tern_tensor_row_bytes(t);
    if (tern_tensor_is_fp8_block(t)) {
        if (lo % t->blk_rows || (cnt % t->blk_rows && lo + cnt != t->shape[0]))
            return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: '%s': rows [%d, %d) do not align with its FP8 scale "
                            "blocks of %d rows", name, lo, lo + cnt, t->blk_rows);
        t->scales = (const uint8_t *)t->scales + (size_t)(lo / t->blk_rows) * (size_t)tern_tensor_fp8_scale_cols(t) * 4;
    } else if (t->dtype == TERN_DT_Q) {
        t->scales = (const uint8_t *)t->scales + (size_t)lo * scale_row_bytes(t);
        t->biases = (const uint8_t *)t->biases + (size_t)lo * scale_row_bytes(t);
    }
    t->data = (const uint8_t *)t->data + (size_t)lo * rb;
    t->shape[0] = cnt;
    return 1;
}

static int cut_experts(tern_tensor *t, int lo, int cnt) {
    size_t mb = t->mat_stride ? t->mat_stride : (size_t)t->shape[1] * tern_tensor_row_bytes(t);
    size_t ms = t->mat_stride_s;
    if (!ms && t->dtype == TERN_DT_Q) ms = (size_t)t->shape[1] * scale_row_bytes(t);
    if (!ms && tern_tensor_is_fp8_block(t)) ms = tern_tensor_fp8_scale_bytes(t);
    t->data = (const uint8_t *)t->data + (size_t)lo * mb;
    if (t->scales) t->scales = (const uint8_t *)t->scales + (size_t)lo * ms;
    if (t->biases) t->biases = (const uint8_t *)t->biases + (size_t)lo * ms;
    t->shape[0] = cnt;
    return 1;
}

/* Copy columns [c0, c0+w) of rows [0, rows) (row stride `ld` bytes, element `es` bytes or, for
 * packed codes, `bits`) into a new buffer. */
static const void *gather(tern_tp *tp, const void *src, int64_t rows, size_t ld, size_t off, size_t wb) {
    uint8_t *dst = keep_buf(tp, (size_t)rows * wb);
    if (!dst) return NULL;
    for (int64_t i = 0; i < rows; i++) memcpy(dst + (size_t)i * wb, (const uint8_t *)src + (size_t)i * ld + off, wb);
    return dst;
}

static int cut_cols(tern_tp *tp, tern_tensor *t, int c0, int w, const char *name, tern_error *err) {
    int64_t rows = t->shape[0], in = t->shape[1];
    size_t rb = tern_tensor_row_bytes(t);
    const void *d, *s = NULL, *b = NULL;
    if (t->dtype == TERN_DT_Q || tern_tensor_is_fp8_block(t)) {
        int gs = t->group_size;
        if (c0 % gs || w % gs)
            return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: '%s' (%s, groups of %d inputs): its %lld input "
                            "columns split into %d per rank, not a multiple of the group size; use fewer ranks",
                            name, t->dtype == TERN_DT_Q ? "MLX affine" : "FP8 block", gs, (long long)in, w);
    }
    if (t->dtype == TERN_DT_Q) {
        size_t sb = tern_dtype_size(t->sdtype), ng = (size_t)(in / t->group_size);
        d = gather(tp, t->data, rows, rb, (size_t)c0 * t->bits / 8, (size_t)w * t->bits / 8);
        s = gather(tp, t->scales, rows, ng * sb, (size_t)(c0 / t->group_size) * sb, (size_t)(w / t->group_size) * sb);
        b = gather(tp, t->biases, rows, ng * sb, (size_t)(c0 / t->group_size) * sb, (size_t)(w / t->group_size) * sb);
    } else if (tern_tensor_is_fp8_block(t)) {
        int64_t sc = tern_tensor_fp8_scale_cols(t), srows = (rows + t->blk_rows - 1) / t->blk_rows;
        d = gather(tp, t->data, rows, rb, (size_t)c0, (size_t)w);
        s = gather(tp, t->scales, srows, (size_t)sc * 4, (size_t)(c0 / t->group_size) * 4, (size_t)(w / t->group_size) * 4);
    } else {
        size_t es = tern_dtype_size(t->dtype);
        if (!es) return tern_err(err, TERN_EUNSUPPORTED, "tensor parallel: '%s': cannot split dtype %s", name, tern_dtype_name(t->dtype));
        d = gather(tp, t->data, rows, rb, (size_t)c0 * es, (size_t)w * es);
    }
    if (!d || (t->scales && !s) || (t->biases && !b)) return tern_err(err, TERN_ENOMEM, "tensor parallel: out of memory splitting '%s'", name);
    t->data = d;
    t->scales = s;
    t->biases = b;
    t->shape[1] = w;
    return 1;
}

typedef struct hook_ctx { tern_tp *tp; int rank; } hook_ctx;

static int shard_hook(void *ctx, const char *name, int ndim, const int64_t *shape, tern_tensor *t, tern_error *err) {
    hook_ctx *h = ctx;
    tern_tp *tp = h->tp;
    int lo = 0, cnt = 0, bias = 0;
    int64_t full = 0;
    int cut = plan_cut(tp, h->rank, name, &lo, &cnt, &full, &bias);
    if (cut == CUT_NONE || !shape || t->ndim != ndim) return 0;
    if (cut == CUT_EXPERTS) {
        if (ndim != 3 || t->shape[0] != full) return 0;
        for (int i = 1; i < 3; i++) if (t->shape[i] != shape[i]) return 0;
        return cut_experts(t, lo, cnt);
    }
    int ax = cut == CUT_COLS ? 1 : 0;
    if (ndim != (bias ? 1 : 2) || t->shape[ax] == shape[ax]) return 0; /* already local (synthetic, 1 kv head) */
    if (t->shape[ax] != full || shape[ax] != cnt || (ndim == 2 && t->shape[1 - ax] != shape[1 - ax])) return 0;
    return cut == CUT_COLS ? cut_cols(tp, t, lo, cnt, name, err) : cut_rows(t, lo, cnt, name, err);
}

/* The synthetic store's companion (weights.h tern_weights_set_shard_local): a stack cut by expert (or GLM-5 head)
 * is made with only the rank's cnt matrices, so shard_hook leaves it as made. */
static void shard_local(void *ctx, const char *name, int ndim, int64_t *shape) {
    hook_ctx *h = ctx;
    int lo = 0, cnt = 0, bias = 0;
    int64_t full = 0;
    if (plan_cut(h->tp, h->rank, name, &lo, &cnt, &full, &bias) == CUT_EXPERTS && ndim == 3 && shape[0] == full)
        shape[0] = cnt;
}

/* ---- load ------------------------------------------------------------------------------ */

static tern_status local_config(const tern_model_config *c, int N, int r, int hv0, int hvn, tern_model_config *out,
                                tern_error *err) {
    *out = *c;
    out->layers = malloc(sizeof *out->layers * (size_t)c->n_layer);
    if (!out->layers) return tern_err(err, TERN_ENOMEM, "out of memory");
    memcpy(out->layers, c->layers, sizeof *out->layers * (size_t)c->n_layer);
    out->n_head = c->n_head / N;
    out->n_ff = c->n_ff / N;
    for (int l = 0; l < c->n_layer; l++) {
        int kv0, nkv;
        kv_heads(c, N, r, l, &kv0, &nkv);
        out->layers[l].n_head_kv = nkv;
        out->layers[l].n_ff = c->layers[l].n_ff / N;
    }
    out->n_head_kv = c->n_layer > 0 ? out->layers[0].n_head_kv : c->n_head_kv / N;
    if (c->arch == TERN_ARCH_GLM5) { /* latent cache: one replicated record per token (n_head_kv 1 per layer) */
        out->n_head_kv = c->n_head_kv / N;
        out->n_ff_shared = c->n_ff_expert * c->n_shared_experts / N;
    }
    out->head_v0 = hv0;
    out->head_vn = hvn;
    return TERN_OK;
}

/* The vocabulary split: contiguous row ranges, boundaries on multiples of 128 rows for real
 * vocabularies (FP8 blocks, aligned device rows), of 1 for tiny ones; none (every rank holds
 * the whole head, rank 0 alone computes it) when a rank would get no rows or TERN_TP_VOCAB=0. */
static void vocab_table(int V, int N, int off, int *hv0, int *hvn) {
    const int unit = V >= 256 * N ? 128 : 1;
    int ok = N > 1 && !off;
    for (int r = 0; r < N; r++) {
        const int64_t a = (int64_t)V * r / N / unit * unit, b = r + 1 == N ? V : (int64_t)V * (r + 1) / N / unit * unit;
        hv0[r] = (int)a;
        hvn[r] = (int)(b - a);
        ok &= hvn[r] > 0;
    }
    for (int r = 0; r < N && !ok; r++) hv0[r] = hvn[r] = 0;
}

static void vocab_split(tern_tp *tp, int V) { vocab_table(V, tp->n, tp->vocab_off, tp->hv0, tp->hvn); }


tern_status tern_tp_rank_config(const tern_model_config *cfg, int N, int r, tern_model_config *out, tern_error *err) {
    memset(out, 0, sizeof *out);
    if (!cfg || N < 1 || N > TERN_TP_MAX || r < 0 || r >= N) return tern_err(err, TERN_EINVAL, "tern_tp_rank_config: bad arguments");
    tern_status st = check_geometry(cfg, N, err);
    if (st) return st;
    int hv0[TERN_TP_MAX], hvn[TERN_TP_MAX];
    vocab_table(cfg->n_vocab, N, env_off("TERN_TP_VOCAB"), hv0, hvn);
    return local_config(cfg, N, r, hv0[r], hvn[r], out, err);
}

tern_status tern_tp_load(tern_tp *tp, const tern_model_config *cfg, tern_weights *ws, const tern_model_opts *mo,
                         tern_model **out, tern_error *err) {
    *out = NULL;
    if (!tp || !cfg || !ws) return tern_err(err, TERN_EINVAL, "tern_tp_load: NULL argument");
    if (tp->r[0].m) return tern_err(err, TERN_EINVAL, "tern_tp_load: the group already holds a model");
    int N = tp->n;
    tern_status st = check_geometry(cfg, N, err);
    if (st) return st;
    tp->gcfg = cfg;
    vocab_split(tp, cfg->n_vocab);
    hook_ctx h[TERN_TP_MAX];
    for (int r = 0; r < N && !st; r++) {
        tp_rank *rk = &tp->r[r];
        if ((st = local_config(cfg, N, r, tp->hv0[r], tp->hvn[r], &rk->cfg, err))) break;
        if (cfg->n_expert > 0 && N > 1) {
            rk->e0 = r * (cfg->n_expert / N);
            rk->e1 = rk->e0 + cfg->n_expert / N;
            rk->vt.route_topk = route_local;
            if (cfg->arch == TERN_ARCH_GLM5 && rk->real->vt->glm) {
                rk->glm = *rk->real->vt->glm;
                rk->glm.route_group = route_group_local;
                rk->vt.glm = &rk->glm;
            }
        }
        h[r] = (hook_ctx){tp, r};
        bind(rk);
        tern_weights_set_shard(ws, N > 1 ? shard_hook : NULL, &h[r]);
        tern_weights_set_shard_local(ws, N > 1 ? shard_local : NULL);
        /* expert offload: each rank caches its own experts [e0, e1) in 1/N of the slot memory; the
         * routing trace is rank 0's (its experts' lines) */
        tern_model_opts ro = mo ? *mo : (tern_model_opts){0};
        if (mo && (mo->expert_cache_bytes || mo->expert_slots)) {
            ro.expert_cache_bytes = mo->expert_cache_bytes / (size_t)N;
            ro.expert_e0 = rk->e0;
            if (r > 0) ro.expert_trace = NULL;
        }
        st = tern_model_load_from(&rk->m, &rk->cfg, ws, &rk->be, mo ? &ro : NULL, err);
        if (st) st = tern_err_wrap(err, st, "rank %d of %d", r, N);
    }
    tern_weights_set_shard(ws, NULL, NULL);
    tp->gcfg = NULL;
    bind(&tp->r[0]);
    if (st) return st;
    tp->r[0].m->tp = N > 1 ? tp : NULL;
    *out = tp->r[0].m;
    return TERN_OK;
}

tern_status tern_tp_load_dir(tern_tp *tp, const char *dir, const tern_model_opts *mo, tern_model **out,
                             tern_error *err) {
    *out = NULL;
    if (!tp || tp->own_cfg) return tern_err(err, TERN_EINVAL, "tern_tp_load_dir: bad group");
    if (!(tp->own_cfg = calloc(1, sizeof *tp->own_cfg))) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_status st = tern_config_load(tp->own_cfg, dir, err);
    if (!st) st = tern_weights_open(&tp->own_ws, dir, tp->own_cfg, err);
    if (!st) st = tern_tp_load(tp, tp->own_cfg, tp->own_ws, mo, out, err);
    return st;
}

tern_status tern_tp_kv_open(tern_tp *tp, const tern_kv_opts *ko, tern_kv **out, tern_error *err) {
    *out = NULL;
    if (!tp || !tp->r[0].m) return tern_err(err, TERN_EINVAL, "tern_tp_kv_open: load the model first");
    if (tp->r[0].kv) return tern_err(err, TERN_EINVAL, "tern_tp_kv_open: the group already has its caches");
    for (int r = 0; r < tp->n; r++) {
        tp_rank *rk = &tp->r[r];
        bind(rk);
        tern_status st = tern_kv_open(&rk->kv, &rk->be, &rk->cfg, ko, err);
        if (st) return tern_err_wrap(err, st, "tensor parallel rank %d KV cache", r);
    }
    bind(&tp->r[0]);
    *out = tp->r[0].kv;
    return TERN_OK;
}

/* ---- forward ----------------------------------------------------------------------------- */

tern_status tern__tp_forward(tern_tp *tp, const tern_batch *b, tern_kv *kv, float *logits, tern_error *err) {
    if (kv != tp->r[0].kv)
        return tern_err(err, TERN_EINVAL, "tensor parallel: forward needs the group's own cache (tern_tp_kv_open)");
    for (int r = 1; r < tp->n; r++) {
        tern_status st = tern_kv_mirror(tp->r[r].kv, kv, err);
        if (st) return st;
    }
    tp->job = b;
    tp->step_eager = mixed_sampling(tp->r[0].m, b);
    for (int r = 0; r < tp->n; r++) tp->r[r].m->head_need = logits != NULL || tp->r[0].m->samp != NULL;
    bind(&tp->r[0]); /* the engine thread may not be the one that loaded the group */
    pthread_barrier_wait(&tp->start);
    tern_status st = tern__model_forward_local(tp->r[0].m, b, kv, logits, err);
    pthread_barrier_wait(&tp->done);
    tp->job = NULL;
    for (int r = 1; r < tp->n && !st; r++)
        if (tp->r[r].st) {
            if (err) *err = tp->r[r].err;
            st = tern_err_wrap(err, tp->r[r].st, "tensor parallel rank %d", r);
        }
    return st;
}
