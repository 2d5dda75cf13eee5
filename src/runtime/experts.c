/*
 * experts.c — the expert store of experts.h: slot pools, LRU per layer, miss loading, the
 * routing trace, and the `tern fit` estimate.
 *
 * Layout of one layer's pool (one backend allocation): for each stack (gate, up, down) the data
 * of S experts, then (MLX affine) their scales and biases, or (block FP8) their scales, each
 * region 256-byte aligned and tightly packed per expert, so a slot view is a 3-D stack with
 * mat_stride = one expert's data bytes exactly like an uploaded stack (the CUDA kernels assume
 * tight matrices). The view's mat_map (backend memory [E]) sends logical expert e to its slot;
 * entries of experts that are not resident are 0 and never read (only routed ids are).
 *
 * A call: download ids -> unique experts (stamp per call) -> hits stamped first (pinned), then
 * each miss takes the least recently used regular slot not stamped by this call (ties: lower
 * expert id, so the choice follows contents, not positions) -> copy its stored bytes (vt->upload:
 * memcpy on the CPU, stream-ordered copy on CUDA) -> upload the map when it changed ->
 * vt->moe_mlp over the views. read_ahead() predicts the next MoE layer's experts with its router
 * and asks the kernel to page them in (madvise WILLNEED).
 * Staging slots (TERN_EXPERTS_PREFETCH=1 and S >= 2k; else P = 0 and no thread): P = k of each
 * layer's S slots are flagged staging. read_ahead() also copies the predicted experts that are not
 * resident into staging slots of the next layer (never a regular slot, nor a staging slot holding
 * another expert predicted in the same pass) on one I/O thread, while this layer computes: memcpy
 * on CPU backends, vt->upload_side on a GPU (its own stream through pinned staging, so the copy
 * engine works beside the kernels). At that layer's call a routed expert found in a staging slot
 * (prefetched, or demoted there earlier and not yet overwritten) turns the slot regular (table
 * swap, no copy), misses take regular LRU slots, and afterwards the least recently used regular
 * slots turn staging until P are again (their experts stay valid there until overwritten; a call
 * with more experts than S - P also uses staging slots, and the count is restored at the next
 * read-ahead). So the regular slots evolve exactly like an LRU cache of S - P slots whatever the
 * predictions are: a wrong guess costs its copy, never a cached expert (tests: skew at S slots
 * has the hits and misses of no prefetch at S - P). Only the engine thread touches the tables;
 * the thread only copies bytes into staging slots of the next layer, and every call waits for the
 * queue to be empty before it touches any slot, so a slot being filled is never used. On a GPU a
 * staging slot of the next layer is not read by queued kernels either: the call that queues the
 * copies has just downloaded its routed ids, which waits for every kernel queued before.
 * CPU A/B (session 9, bench_experts --ab): on 2 cores the thread's copies compete with the compute threads and
 * the staged wins do not pay for them; the thread stays opt-in.
 * Per-expert sources (esrc, from weights.c expert views): each expert's stored bytes apart; a
 * call with more experts than slots copies them into a temporary pool for that call.
 */
#include "runtime/experts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALIGN_UP(v) (((v) + 255) & ~(size_t)255)

typedef struct xstack {
    tern_tensor src;          /* the stored stack (host) */
    size_t dlen, slen;        /* one expert's data bytes; scales bytes (biases too when Q) */
    size_t dstride, sstride;  /* stored bytes between experts */
    int nreg;                 /* 1 data, 2 + scales (FP8), 3 + biases (Q) */
    size_t off[3];            /* region offsets inside the layer's pool */
    tern_tensor view;
    tern_expert_src *esrc;    /* [E] per-expert stored bytes (owned), or NULL: src is one stack */
} xstack;

typedef struct xlayer {
    int have;                 /* bit per registered stack */
    int file_backed;
    xstack st[3];
    size_t expert_bytes;
    uint8_t *pool;
    int32_t *slot_of;         /* host [E]: slot or -1 */
    int32_t *map_host, *map_dev; /* [E] */
    int32_t *owner;           /* [S]: expert or -1 */
    uint64_t *stamp;          /* [S]: last call that used the slot (0 = never) */
    tern_tensor router;       /* uploaded [E, H] (data NULL: none registered) */
    uint8_t *ahead;           /* [E]: read ahead by the previous layer, not loaded since */
    uint8_t *pre;             /* [S]: filled by the I/O thread, not used since */
    uint8_t *stg;             /* [S]: a staging slot (only those are filled by the I/O thread) */
    int nstg;                 /* staging slots now (x->P after every call that fits the regular slots) */
    int map_dirty;            /* map_host changed by a prefetch, map_dev not yet uploaded */
} xlayer;

typedef struct xjob { xlayer *L; int e, s; } xjob;

#define PRED_ROWS 8           /* read-ahead only for decode-sized steps */

struct tern_experts {
    tern_backend *be;
    int n_layer, E, S, k;
    int P;                    /* staging slots per layer: k with the I/O thread, else 0 */
    size_t cap;
    int slots_req;
    xlayer *L;
    int chunk_on_host;        /* TERN_EXPERTS_CHUNKS=1: host backends take the device path (tests) */
    int32_t *ids;             /* host copy of the routed ids */
    size_t ids_cap;
    int32_t *uniq;            /* [E] */
    uint64_t *seen;           /* [E]: call stamp */
    uint64_t clock;
    FILE *trace;
    tern_experts_stats st;
    int e0;                   /* global id of local expert 0 (expert-parallel rank; 0 alone) */
    int RE;                   /* router rows (global experts) of the read-ahead, >= e0 + E */
    float *d_lg, *h_lg;       /* read-ahead router logits [PRED_ROWS, RE]: backend / host */
    uint8_t *gsel;            /* [RE]: read-ahead selection marks (2: this row, 4: this pass) */
    int64_t ahead_call;       /* misses of the current call that had been read ahead */
    /* I/O thread (CPU backends): a queue of slot copies for the next MoE layer */
    int io_on;
    int skew;                 /* TERN_EXPERTS_PREFETCH=skew (tests): prefetch expert id + 1 (mostly wrong) */
    pthread_t io;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_idle;
    xjob *q;                  /* [S]: at most one layer's slots are queued at a time */
    int qn, qi, busy, stop;
    int32_t *pred;            /* [PRED_ROWS * k] predicted experts of one pass */
};

tern_status tern_experts_open(tern_experts **out, tern_backend *be, int n_layer, const tern_experts_opts *o,
                              tern_error *err) {
    *out = NULL;
    tern_experts *x = calloc(1, sizeof *x);
    if (!x || !(x->L = calloc((size_t)(n_layer > 0 ? n_layer : 1), sizeof *x->L))) {
        free(x);
        return tern_err(err, TERN_ENOMEM, "expert store: out of memory");
    }
    x->be = be;
    x->n_layer = n_layer;
    x->cap = o ? o->cap_bytes : 0;
    x->slots_req = o ? o->slots : 0;
    x->e0 = o && o->e0 > 0 ? o->e0 : 0;
    const char *ch = getenv("TERN_EXPERTS_CHUNKS");
    x->chunk_on_host = ch && ch[0] == '1';
    if (o && o->trace && *o->trace && !(x->trace = fopen(o->trace, "w"))) {
        free(x->L);
        free(x);
        return tern_err(err, TERN_EIO, "expert trace '%s': cannot open for writing", o->trace);
    }
    *out = x;
    return TERN_OK;
}

static void io_stop(tern_experts *x);

void tern_experts_close(tern_experts *x) {
    if (!x) return;
    io_stop(x);
    for (int l = 0; l < x->n_layer; l++) {
        xlayer *L = &x->L[l];
        if (L->pool) x->be->vt->free(x->be, L->pool);
        if (L->map_dev) x->be->vt->free(x->be, L->map_dev);
        free(L->slot_of);
        free(L->map_host);
        free(L->owner);
        free(L->stamp);
        free(L->ahead);
        free(L->pre);
        free(L->stg);
        for (int w = 0; w < 3; w++) free(L->st[w].esrc);
    }
    free(x->q);
    free(x->pred);
    if (x->d_lg) x->be->vt->free(x->be, x->d_lg);
    free(x->h_lg);
    free(x->gsel);
    if (x->trace) fclose(x->trace);
    free(x->L);
    free(x->ids);
    free(x->uniq);
    free(x->seen);
    free(x);
}

int tern_experts_e0(const tern_experts *x) { return x ? x->e0 : 0; }

tern_status tern_experts_add(tern_experts *x, int layer, int which, const tern_tensor *t, int file_backed,
                             tern_error *err) {
    return tern_experts_add_src(x, layer, which, t, NULL, file_backed, err);
}

tern_status tern_experts_add_src(tern_experts *x, int layer, int which, const tern_tensor *t,
                                 const tern_expert_src *src, int file_backed, tern_error *err) {
    const char *nm = t->name ? t->name : "?";
    if (layer < 0 || layer >= x->n_layer || which < 0 || which > 2)
        return tern_err(err, TERN_EINVAL, "expert store: '%s': layer %d / stack %d out of range", nm, layer, which);
    if (t->ndim != 3 || t->shape[0] <= 0 || t->shape[0] > (1 << 20))
        return tern_err(err, TERN_EINVAL, "expert store: '%s' is not an expert stack [E, out, in]", nm);
    if (x->E && t->shape[0] != x->E)
        return tern_err(err, TERN_EINVAL, "expert store: '%s' has %lld experts, other layers %d", nm,
                        (long long)t->shape[0], x->E);
    x->E = (int)t->shape[0];
    xlayer *L = &x->L[layer];
    xstack *s = &L->st[which];
    free(s->esrc);
    memset(s, 0, sizeof *s);
    s->src = *t;
    if (src) {
        if (!(s->esrc = malloc(sizeof *s->esrc * (size_t)x->E)))
            return tern_err(err, TERN_ENOMEM, "expert store: out of memory");
        memcpy(s->esrc, src, sizeof *s->esrc * (size_t)x->E);
    }
    int64_t out = t->shape[1], in = t->shape[2];
    s->dlen = (size_t)out * tern_tensor_row_bytes(t);
    s->dstride = t->mat_stride ? t->mat_stride : s->dlen;
    s->nreg = 1;
    if (t->dtype == TERN_DT_Q) {
        if (t->group_size <= 0 || in % t->group_size || !t->scales || !t->biases)
            return tern_err(err, TERN_EINVAL, "expert store: '%s': bad quantization (group %d)", nm, t->group_size);
        s->slen = (size_t)(out * (in / t->group_size)) * tern_dtype_size(t->sdtype);
        s->sstride = t->mat_stride_s ? t->mat_stride_s : s->slen;
        s->nreg = 3;
    } else if (tern_tensor_is_fp8_block(t)) {
        s->slen = tern_tensor_fp8_scale_bytes(t);
        s->sstride = t->mat_stride_s ? t->mat_stride_s : s->slen;
        s->nreg = 2;
    }
    L->have |= 1 << which;
    L->file_backed = file_backed;
    return TERN_OK;
}

/* Pool bytes of one layer with S slots (regions 256-byte aligned), and of every layer. */
static size_t pool_bytes(const xlayer *L, int S) {
    size_t off = 0;
    for (int w = 0; w < 3; w++)
        for (int r = 0; r < L->st[w].nreg; r++) off += ALIGN_UP((r ? L->st[w].slen : L->st[w].dlen) * (size_t)S);
    return off;
}

static size_t total_bytes(const tern_experts *x, int S) {
    size_t t = 0;
    for (int l = 0; l < x->n_layer; l++)
        if (x->L[l].have) t += pool_bytes(&x->L[l], S);
    return t;
}

tern_status tern_experts_add_router(tern_experts *x, int layer, const tern_tensor *router, tern_error *err) {
    if (layer < 0 || layer >= x->n_layer || router->ndim != 2)
        return tern_err(err, TERN_EINVAL, "expert store: router '%s' of layer %d is not a [E, H] matrix",
                        router->name ? router->name : "?", layer);
    x->L[layer].router = *router;
    return TERN_OK;
}

/* ---- the I/O thread: copies queued by read_ahead into slots of the next MoE layer ---- */

static void load_slot(tern_experts *x, xlayer *L, int e, int s, int side);

static void *io_main(void *arg) {
    tern_experts *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->stop && x->qi == x->qn) pthread_cond_wait(&x->cv_job, &x->mu);
        if (x->qi == x->qn) break; /* stop, queue drained */
        xjob j = x->q[x->qi++];
        x->busy = 1;
        pthread_mutex_unlock(&x->mu);
        load_slot(x, j.L, j.e, j.s, x->be->device >= 0); /* CPU: vt->upload is a memmove */
        pthread_mutex_lock(&x->mu);
        x->busy = 0;
        if (x->qi == x->qn) pthread_cond_broadcast(&x->cv_idle);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static int io_start(tern_experts *x) {
    if (pthread_mutex_init(&x->mu, NULL)) return -1;
    if (pthread_cond_init(&x->cv_job, NULL) || pthread_cond_init(&x->cv_idle, NULL) ||
        pthread_create(&x->io, NULL, io_main, x)) {
        pthread_mutex_destroy(&x->mu);
        return -1;
    }
    x->io_on = 1;
    return 0;
}

/* Wait until every queued copy is done (the engine thread, before it touches any slot). */
static void io_wait(tern_experts *x) {
    if (!x->io_on) return;
    pthread_mutex_lock(&x->mu);
    while (x->qi < x->qn || x->busy) pthread_cond_wait(&x->cv_idle, &x->mu);
    x->qi = x->qn = 0;
    pthread_mutex_unlock(&x->mu);
}

static void io_push(tern_experts *x, xlayer *L, int e, int s) {
    pthread_mutex_lock(&x->mu);
    x->q[x->qn++] = (xjob){L, e, s};
    pthread_cond_signal(&x->cv_job);
    pthread_mutex_unlock(&x->mu);
}

static void io_stop(tern_experts *x) {
    if (!x->io_on) return;
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_cond_broadcast(&x->cv_job);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->io, NULL);
    pthread_cond_destroy(&x->cv_job);
    pthread_cond_destroy(&x->cv_idle);
    pthread_mutex_destroy(&x->mu);
    x->io_on = 0;
}

tern_status tern_experts_plan(tern_experts *x, int k, tern_error *err) {
    const tern_backend_vt *vt = x->be->vt;
    int nl = 0;
    size_t bmax = 0;
    for (int l = 0; l < x->n_layer; l++) {
        xlayer *L = &x->L[l];
        if (!L->have) continue;
        if (L->have != 7) return tern_err(err, TERN_EINVAL, "expert store: layer %d lacks gate, up or down", l);
        nl++;
        L->expert_bytes = 0;
        for (int w = 0; w < 3; w++) L->expert_bytes += L->st[w].dlen + (size_t)(L->st[w].nreg - 1) * L->st[w].slen;
        if (L->expert_bytes > bmax) bmax = L->expert_bytes;
    }
    x->k = k;
    if (!nl) return TERN_OK;
    int E = x->E, S = x->slots_req;
    if (S <= 0) S = (int)TERN_MIN((double)E, (double)x->cap / ((double)nl * (double)bmax));
    if (S < k) {
        tern_log(TERN_LOG_WARN, "expert cache: %d slots per layer is below the %d experts one token routes to; using %d "
                 "(%.3f GB)", S, k, k, (double)nl * k * bmax / 1073741824.0);
        S = k;
    }
    if (S > E) S = E;
    while (x->slots_req <= 0 && S > k && total_bytes(x, S) > x->cap) S--; /* alignment padding */
    x->S = S;
    if (!(x->uniq = malloc(sizeof(int32_t) * (size_t)E)) || !(x->seen = calloc((size_t)E, sizeof(uint64_t))))
        return tern_err(err, TERN_ENOMEM, "expert store: out of memory");
    const char *pf = getenv("TERN_EXPERTS_PREFETCH");
    /* opt-in (=1): on a box without a spare core the copies compete with the compute threads
     * (bench/NOTES.md: 4.06 -> 2.98 tok/s at k slots on 2 cores) */
    int want_io = (x->be->device < 0 || vt->upload_side) && pf && pf[0] && pf[0] != '0', routed = 0;
    /* k staging slots out of S, leaving at least k regular ones (a decode row's experts) */
    if (S < 2 * k) want_io = 0;
    x->skew = pf && !strcmp(pf, "skew");
    /* a router reads ahead for this store when its rows cover the store's experts [e0, e0 + E) */
    x->RE = 0;
    for (int l = 0; l < x->n_layer; l++) {
        xlayer *L = &x->L[l];
        if (L->router.data && L->router.shape[0] < (int64_t)x->e0 + E) L->router.data = NULL; /* not this store's routing */
        if (L->have && L->router.data) {
            routed = 1;
            if (L->router.shape[0] > x->RE) x->RE = (int)L->router.shape[0];
        }
    }
    for (int l = 0; l < x->n_layer; l++) {
        xlayer *L = &x->L[l];
        if (!L->have) continue;
        size_t off = 0;
        for (int w = 0; w < 3; w++) {
            xstack *s = &L->st[w];
            for (int r = 0; r < s->nreg; r++) {
                s->off[r] = off;
                off += ALIGN_UP((r ? s->slen : s->dlen) * (size_t)S);
            }
        }
        L->slot_of = malloc(sizeof(int32_t) * (size_t)E);
        L->map_host = calloc((size_t)E, sizeof(int32_t));
        L->owner = malloc(sizeof(int32_t) * (size_t)S);
        L->stamp = calloc((size_t)S, sizeof(uint64_t));
        L->ahead = calloc((size_t)E, 1);
        L->pre = calloc((size_t)S, 1);
        L->stg = calloc((size_t)S, 1);
        if (L->router.data && (L->file_backed || (want_io && routed)) && !x->d_lg) {
            x->d_lg = vt->alloc(x->be, sizeof(float) * PRED_ROWS * (size_t)x->RE);
            x->h_lg = malloc(sizeof(float) * PRED_ROWS * (size_t)x->RE);
            x->gsel = calloc((size_t)x->RE, 1);
            if (!x->d_lg || !x->h_lg || !x->gsel) return tern_err(err, TERN_ENOMEM, "expert store: out of memory");
        }
        L->pool = vt->alloc(x->be, off);
        L->map_dev = vt->alloc(x->be, sizeof(int32_t) * (size_t)E);
        if (!L->slot_of || !L->map_host || !L->owner || !L->stamp || !L->ahead || !L->pre || !L->stg || !L->pool || !L->map_dev)
            return tern_err(err, TERN_ENOMEM, "expert store: cannot allocate %d slots of %zu bytes for layer %d on the %s "
                            "backend", S, L->expert_bytes, l, vt->name);
        x->st.slot_bytes += off;
        for (int e = 0; e < E; e++) L->slot_of[e] = -1;
        for (int s = 0; s < S; s++) L->owner[s] = -1;
        vt->upload(x->be, L->map_dev, L->map_host, sizeof(int32_t) * (size_t)E);
        for (int w = 0; w < 3; w++) {
            xstack *s = &L->st[w];
            s->view = s->src;
            s->view.data = L->pool + s->off[0];
            s->view.scales = s->nreg > 1 ? L->pool + s->off[1] : NULL;
            s->view.biases = s->nreg > 2 ? L->pool + s->off[2] : NULL;
            s->view.mat_stride = s->dlen;
            s->view.mat_stride_s = s->slen;
            s->view.device = x->be->device;
            s->view.mat_map = L->map_dev;
        }
    }
    if (want_io && routed && x->d_lg) {
        if (!(x->q = malloc(sizeof *x->q * (size_t)S)) || !(x->pred = malloc(sizeof(int32_t) * PRED_ROWS * (size_t)k)))
            return tern_err(err, TERN_ENOMEM, "expert store: out of memory");
        if (io_start(x)) tern_log(TERN_LOG_WARN, "expert cache: cannot start the I/O thread; copies stay on the engine thread");
    }
    x->P = x->io_on ? k : 0; /* the last P slots of each layer start as (empty) staging slots */
    for (int l = 0; l < x->n_layer; l++)
        if (x->L[l].stg)
            for (int s = S - x->P; s < S; s++) x->L[l].stg[s] = 1, x->L[l].nstg++;
    x->st.staging = x->P;
    x->st.prefetch_on = x->io_on;
    x->st.n_layers = nl;
    x->st.n_expert = E;
    x->st.slots = S;
    x->st.expert_bytes = bmax;
    x->st.cap_bytes = x->slots_req > 0 ? 0 : x->cap;
    tern_log(TERN_LOG_INFO, "expert cache: %d of %d experts per layer resident (%d MoE layers, %.3f GB of slots, %d "
             "staging)", S, E, nl, (double)x->st.slot_bytes / 1073741824.0, x->P);
    return TERN_OK;
}

/* Drop the whole pages of [p, p+len) from the process (file pages stay in the page cache). */
static void drop_pages(const void *p, size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, lo = (a + pg - 1) & ~(uintptr_t)(pg - 1), hi = (a + len) & ~(uintptr_t)(pg - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static const uint8_t *src_region(const xstack *s, int r, int e) {
    if (s->esrc) return r == 0 ? s->esrc[e].data : r == 1 ? s->esrc[e].scales : s->esrc[e].biases;
    const uint8_t *b = r == 0 ? s->src.data : r == 1 ? s->src.scales : s->src.biases;
    return b + (size_t)e * (r ? s->sstride : s->dstride);
}

static void drop_expert(const xlayer *L, int e) {
    for (int w = 0; w < 3; w++)
        for (int r = 0; r < L->st[w].nreg; r++)
            drop_pages(src_region(&L->st[w], r, e), r ? L->st[w].slen : L->st[w].dlen);
}

/* Copy expert e's stored bytes into slot `slot` of a host pool laid out by off (temporary pools;
 * CPU backends only: their memory is host memory). */
static void copy_expert(xlayer *L, uint8_t *pool, const size_t off[3][3], int e, int slot) {
    for (int w = 0; w < 3; w++) {
        const xstack *st = &L->st[w];
        for (int r = 0; r < st->nreg; r++) {
            size_t len = r ? st->slen : st->dlen;
            memcpy(pool + off[w][r] + (size_t)slot * len, src_region(st, r, e), len);
        }
    }
    if (L->file_backed) drop_expert(L, e);
}

/* Copy expert e's stored bytes into slot s: vt->upload on the engine thread (memcpy on the CPU, a
 * copy on CUDA), or (side) vt->upload_side on the I/O thread of a GPU. */
static void load_slot(tern_experts *x, xlayer *L, int e, int s, int side) {
    for (int w = 0; w < 3; w++) {
        const xstack *st = &L->st[w];
        for (int r = 0; r < st->nreg; r++) {
            size_t len = r ? st->slen : st->dlen;
            (side ? x->be->vt->upload_side : x->be->vt->upload)(x->be, L->pool + st->off[r] + (size_t)s * len,
                                                                src_region(st, r, e), len);
        }
    }
    if (L->file_backed) drop_expert(L, e);
}

/* Give expert e slot v of L (tables only; the caller copies the bytes). */
static void assign(xlayer *L, int e, int v) {
    if (L->owner[v] >= 0) {
        L->slot_of[L->owner[v]] = -1;
        L->map_host[L->owner[v]] = 0;
    }
    L->owner[v] = e;
    L->slot_of[e] = v;
    L->map_host[e] = v;
    L->pre[v] = 0;
}

/* Least recently used slot of L among the regular (stg 0) or staging (stg 1) ones, not stamped
 * `now`, or -1. Ties (slots stamped by the same call) go to the lower expert id, empty slots
 * first: the choice depends on the slots' contents, not on where they sit, so the regular slots
 * evolve exactly like an LRU cache of that many slots whatever the staging slots do. */
static int victim(const tern_experts *x, const xlayer *L, uint64_t now, int stg) {
    int v = -1;
    for (int s = 0; s < x->S; s++) {
        if (L->stamp[s] == now || L->stg[s] != stg) continue;
        if (v < 0 || L->stamp[s] < L->stamp[v] || (L->stamp[s] == L->stamp[v] && L->owner[s] < L->owner[v])) v = s;
    }
    return v;
}

/* Back to P staging slots: demote the least recently used regular slots not stamped `now` (their
 * experts stay valid there until a prefetch overwrites them). */
static void rebalance(tern_experts *x, xlayer *L, uint64_t now) {
    while (L->nstg < x->P) {
        int v = victim(x, L, now, 0);
        if (v < 0) return; /* every regular slot is pinned by this call (U > S - P): next time */
        L->stg[v] = 1;
        L->nstg++;
    }
}

/* Make the unique experts uniq[0..U) (U <= S) resident; returns the misses (copied now, or found
 * in a staging slot: copied ahead by the I/O thread, or demoted there earlier). A routed expert in
 * a staging slot turns that slot regular (no copy); the misses take the regular LRU slots; then the
 * regular LRU slots beyond S - P turn staging. So the regular slots hold exactly what an LRU cache
 * of S - P slots would (hits equal), and a wrong prefetch never displaces a cached expert. */
static int prepare(tern_experts *x, xlayer *L, int U) {
    uint64_t now = ++x->clock;
    int miss = 0, changed = L->map_dirty;
    for (int i = 0; i < U; i++) {
        int e = x->uniq[i], s = L->slot_of[e];
        if (s < 0) continue;
        L->stamp[s] = now;
        if (!L->stg[s]) continue;
        L->stg[s] = 0; /* staging -> regular: a table swap */
        L->nstg--;
        miss++;
        x->st.staged++;
        if (L->pre[s]) { /* copied ahead for this call */
            L->pre[s] = 0;
            x->ahead_call++;
            x->st.pred_used++;
            x->st.prefetch_hits++;
        }
        L->ahead[e] = 0;
    }
    for (int i = 0; i < U; i++) {
        int e = x->uniq[i];
        if (L->slot_of[e] >= 0) continue;
        int v = victim(x, L, now, 0); /* never a slot pinned by this call */
        if (v < 0 && (v = victim(x, L, now, 1)) >= 0) { /* U > S - P: a staging slot serves too */
            L->stg[v] = 0;
            L->nstg--;
        }
        if (v < 0) break;          /* cannot happen: U <= S */
        assign(L, e, v);
        load_slot(x, L, e, v, 0);
        x->st.bytes_read += L->expert_bytes;
        if (L->ahead[e]) { x->ahead_call++; x->st.pred_used++; }
        L->ahead[e] = 0;
        L->stamp[v] = now;
        miss++;
        changed = 1;
    }
    rebalance(x, L, now);
    if (changed) x->be->vt->upload(x->be, L->map_dev, L->map_host, sizeof(int32_t) * (size_t)x->E);
    L->map_dirty = 0;
    x->st.hits += U - miss;
    x->st.misses += miss;
    return miss;
}

/* Read ahead for the next MoE layer after `layer` (experts.h): its router on this call's input
 * xin [n, H], the top-k of each row; madvise(WILLNEED) on the stored bytes of those that are
 * not resident (file-backed), and with the I/O thread, staging slots of that layer for them
 * (never a regular slot, nor a staging slot holding another predicted expert) filled on the
 * thread. Ordering on a device: the download waits for the router product only (queued after
 * this layer's routing), before this layer's experts run. */
static void read_ahead(tern_experts *x, int layer, const float *xin, int n) {
    int nx = layer + 1;
    while (nx < x->n_layer && !x->L[nx].have) nx++;
    if (nx >= x->n_layer || n > PRED_ROWS || !x->d_lg) return;
    xlayer *N = &x->L[nx];
    if (!N->router.data || !(N->file_backed || x->io_on) || !N->pool || N->router.shape[1] <= 0) return;
    int E = x->E, k = x->k, np = 0, RE = (int)N->router.shape[0];
    x->be->vt->matmul(x->be, x->d_lg, xin, n, &N->router);
    x->be->vt->download(x->be, x->h_lg, x->d_lg, sizeof(float) * (size_t)n * RE);
    uint8_t *sel = x->gsel;
    for (int r = 0; r < n; r++) {
        const float *lg = x->h_lg + (size_t)r * RE;
        for (int j = 0; j < k; j++) { /* the j-th largest logit over every expert (k is small) */
            int best = -1;
            for (int g = 0; g < RE; g++)
                if (!(sel[g] & 2) && (best < 0 || lg[g] > lg[best])) best = g;
            if (best < 0) break;
            sel[best] |= 2; /* chosen in this row */
            const int e = best - x->e0; /* this store's expert, or another rank's */
            if (e < 0 || e >= E) continue;
            if (!(sel[best] & 4) && x->pred) x->pred[np++] = (e + x->skew) % E;
            sel[best] |= 4; /* chosen in this pass */
            if (N->slot_of[e] >= 0 || (N->ahead[e] & 1)) continue;
            N->ahead[e] |= 1;
            x->st.predicted++;
            if (!N->file_backed) continue;
            for (int w = 0; w < 3; w++)
                for (int rg = 0; rg < N->st[w].nreg; rg++) {
                    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = rg ? N->st[w].slen : N->st[w].dlen;
                    uintptr_t a = (uintptr_t)src_region(&N->st[w], rg, e), lo = a & ~(uintptr_t)(pg - 1);
                    madvise((void *)lo, a + len - lo, MADV_WILLNEED);
                }
        }
        for (int g = 0; g < RE; g++) sel[g] &= 4;
    }
    memset(sel, 0, (size_t)RE);
    if (!x->io_on || !x->P) return;
    rebalance(x, N, UINT64_MAX); /* after a call wider than its regular slots (nothing pinned now) */
    uint64_t now = ++x->clock;
    for (int i = 0; i < np; i++) /* predicted experts already staged: kept this pass */
        if (N->slot_of[x->pred[i]] >= 0 && N->stg[N->slot_of[x->pred[i]]]) N->stamp[N->slot_of[x->pred[i]]] = now;
    for (int i = 0; i < np; i++) {
        int e = x->pred[i];
        if (N->slot_of[e] >= 0) continue;
        int v = victim(x, N, now, 1); /* a staging slot: an older guess, or a demoted expert */
        if (v < 0) break;          /* more predictions than staging slots (several rows) */
        assign(N, e, v);
        N->stamp[v] = now;
        N->pre[v] = 1;
        N->map_dirty = 1;
        x->st.prefetched++;
        x->st.bytes_read += N->expert_bytes;
        x->st.prefetch_bytes += N->expert_bytes;
        io_push(x, N, e, v);
    }
}

/* Unique experts of ids[0..cnt) into x->uniq (stamped with a fresh clock); returns U. */
static int collect(tern_experts *x, const int32_t *ids, size_t cnt) {
    uint64_t now = ++x->clock;
    int U = 0;
    for (size_t a = 0; a < cnt; a++) {
        int e = ids[a];
        if (e < 0 || e >= x->E || x->seen[e] == now) continue;
        x->seen[e] = now;
        x->uniq[U++] = e;
    }
    return U;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* More experts than slots on a host backend, per-expert sources (no stack to read in place):
 * copy the call's U experts into a temporary pool of U slots with its own map, run, free. */
static int run_spill(tern_experts *x, xlayer *L, int U, float *y, const float *xin, int n, int H,
                     const int32_t *idx, const float *wts, int k, int act, float *scratch) {
    const tern_backend_vt *vt = x->be->vt;
    size_t off[3][3] = {{0}}, tot = 0;
    for (int w = 0; w < 3; w++)
        for (int r = 0; r < L->st[w].nreg; r++) {
            off[w][r] = tot;
            tot += ALIGN_UP((r ? L->st[w].slen : L->st[w].dlen) * (size_t)U);
        }
    uint8_t *pool = vt->alloc(x->be, tot);
    int32_t *map = vt->alloc(x->be, sizeof(int32_t) * (size_t)x->E);
    if (!pool || !map) {
        if (pool) vt->free(x->be, pool);
        if (map) vt->free(x->be, map);
        return -1;
    }
    memset(map, 0, sizeof(int32_t) * (size_t)x->E);
    for (int i = 0; i < U; i++) {
        copy_expert(L, pool, (const size_t(*)[3])off, x->uniq[i], i);
        map[x->uniq[i]] = i;
    }
    tern_tensor v[3];
    for (int w = 0; w < 3; w++) {
        v[w] = L->st[w].view;
        v[w].data = pool + off[w][0];
        v[w].scales = L->st[w].nreg > 1 ? pool + off[w][1] : NULL;
        v[w].biases = L->st[w].nreg > 2 ? pool + off[w][2] : NULL;
        v[w].mat_map = map;
    }
    vt->moe_mlp(x->be, y, xin, n, H, idx, wts, k, &v[0], &v[1], &v[2], act, scratch);
    vt->free(x->be, pool);
    vt->free(x->be, map);
    return 0;
}

void tern_experts_moe_mlp(tern_experts *x, int layer, float *y, const float *xin, int n, int H, const int32_t *idx,
                          const float *wts, int k, int act, float *scratch) {
    tern_backend *be = x->be;
    const tern_backend_vt *vt = be->vt;
    xlayer *L = layer >= 0 && layer < x->n_layer ? &x->L[layer] : NULL;
    if (n <= 0 || !L || L->have != 7 || !L->pool) { /* never registered: nothing to run over */
        tern_log(TERN_LOG_ERROR, "expert store: layer %d has no registered experts", layer);
        return;
    }
    size_t nk = (size_t)n * (size_t)k;
    if (nk > x->ids_cap) { /* grows to the largest step once */
        int32_t *p = realloc(x->ids, sizeof(int32_t) * nk);
        if (!p) { tern_log(TERN_LOG_ERROR, "expert store: out of memory"); return; }
        x->ids = p;
        x->ids_cap = nk;
    }
    io_wait(x); /* the copies queued by the previous call are done before any slot is used */
    vt->download(be, x->ids, idx, sizeof(int32_t) * nk);
    int64_t h0 = x->st.hits, m0 = x->st.misses;
    int U = collect(x, x->ids, nk), direct = 0, chunks = 0, per_expert = 0;
    for (int w = 0; w < 3; w++) per_expert |= L->st[w].esrc != NULL;
    x->st.calls++;
    x->ahead_call = 0;
    if (U > x->S) read_ahead(x, layer, xin, n);
    if (U <= x->S) {
        prepare(x, L, U);
        read_ahead(x, layer, xin, n); /* the next layer's copies run while this one computes */
        vt->moe_mlp(be, y, xin, n, H, idx, wts, k, &L->st[0].view, &L->st[1].view, &L->st[2].view, act, scratch);
        chunks = 1;
    } else if (be->device < 0 && !x->chunk_on_host &&
               (!per_expert || !run_spill(x, L, U, y, xin, n, H, idx, wts, k, act, scratch))) {
        /* more experts than slots: host memory is the backend's memory, read them in place
         * (a contiguous stack) or from a temporary pool (per-expert sources, run_spill) */
        if (!per_expert) {
            vt->moe_mlp(be, y, xin, n, H, idx, wts, k, &L->st[0].src, &L->st[1].src, &L->st[2].src, act, scratch);
            if (L->file_backed)
                for (int i = 0; i < U; i++) drop_expert(L, x->uniq[i]);
        }
        x->st.direct++;
        x->st.misses += U;
        x->st.bytes_read += (uint64_t)U * L->expert_bytes;
        direct = 1;
    } else {
        /* device: row chunks whose unique experts fit the slots (rows are independent there) */
        for (int r0 = 0, r1; r0 < n; r0 = r1) {
            int cnt = 0;
            uint64_t now = ++x->clock;
            for (r1 = r0; r1 < n; r1++) {
                int add = 0;
                for (int j = 0; j < k; j++) {
                    int e = x->ids[(size_t)r1 * k + j];
                    if (e >= 0 && e < x->E && x->seen[e] != now) add++;
                }
                if (r1 > r0 && cnt + add > x->S) break;
                for (int j = 0; j < k; j++) {
                    int e = x->ids[(size_t)r1 * k + j];
                    if (e >= 0 && e < x->E && x->seen[e] != now) x->seen[e] = now;
                }
                cnt += add;
            }
            int Uc = collect(x, x->ids + (size_t)r0 * k, (size_t)(r1 - r0) * k);
            prepare(x, L, Uc);
            vt->moe_mlp(be, y + (size_t)r0 * H, xin + (size_t)r0 * H, r1 - r0, H, idx + (size_t)r0 * k,
                        wts + (size_t)r0 * k, k, &L->st[0].view, &L->st[1].view, &L->st[2].view, act, scratch);
            chunks++;
        }
        x->st.chunks += chunks;
    }
    if (x->trace) {
        int64_t mc = x->st.misses - m0;
        U = collect(x, x->ids, nk); /* the call's experts again (chunks reused uniq) */
        qsort(x->uniq, (size_t)U, sizeof *x->uniq, cmp_i32);
        fprintf(x->trace, "{\"layer\":%d,\"rows\":%d,\"unique\":%d,\"hits\":%lld,\"misses\":%lld,\"bytes\":%llu,"
                "\"direct\":%d,\"chunks\":%d,\"ahead\":%lld,\"ids\":[", layer, n, U, (long long)(x->st.hits - h0),
                (long long)mc, (unsigned long long)mc * L->expert_bytes, direct, chunks, (long long)x->ahead_call);
        for (int i = 0; i < U; i++) fprintf(x->trace, i ? ",%d" : "%d", x->uniq[i]);
        fputs("]}\n", x->trace);
        fflush(x->trace); /* a diagnostic: complete lines even if the process is killed */
    }
}

int tern_experts_layer(const tern_experts *x, int layer) {
    return x && layer >= 0 && layer < x->n_layer && x->L[layer].have == 7 && x->L[layer].pool;
}

void tern_experts_get_stats(const tern_experts *x, tern_experts_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (x) *st = x->st;
    if (x && x->trace) fflush(x->trace);
}

void tern_experts_fit_plan(size_t b, int E, int nl, int k, size_t cap, tern_experts_fit *f) {
    memset(f, 0, sizeof *f);
    if (E <= 0 || nl <= 0 || !b) return;
    double full = (double)nl * k * (double)b;
    if (!cap) { /* offload off: every expert resident */
        f->slots = E;
        f->resident_frac = 1.0;
        f->resident_bytes = (size_t)nl * (size_t)E * b;
        return;
    }
    int S = (int)TERN_MIN((double)E, (double)cap / ((double)nl * (double)b));
    if (S < k) S = k;
    if (S > E) S = E;
    f->slots = S;
    f->resident_frac = (double)S / E;
    f->resident_bytes = (size_t)nl * (size_t)S * b;
    f->bytes_per_token = full * (1.0 - f->resident_frac);
}
