/*
 * weights_synth.c — the synthetic weight store behind tern_weights_open_synth: tensors are
 * made when the model asks for them, with the requested shape, so `tern bench --random NAME`
 * runs real geometries without files. Values are random but tame (no NaN/Inf): bf16 with
 * magnitudes in [2^-7, 2^-5), MLX codes uniformly random with small scales, norm vectors ≈ 1.
 * Filling is multi-GB for large models: a 64-bit xorshift writes 8 bytes per step, in 1 MB chunks with their own
 * seeds, large buffers over one thread per core (fill_run: the same bytes for any thread count).
 * Buffers of >= 2 MB are advised MADV_HUGEPAGE before the first write (2 MB pages where the
 * kernel allows THP: fewer TLB misses when decode streams them; TERN_THP=0 keeps 4 KB pages).
 * Smaller ones (MLX scales/biases, norms: 2 KB-1 MB each) are carved from 4 MB slabs whose
 * 2 MB-aligned part is advised the same way, so the Q formats' scale streams stop walking
 * 4 KB page tables next to weights on 2 MB pages (bench/NOTES.md (j), (k)).
 */
#include "io/weights.h"

#include "base/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct tern_synth {
    const tern_model_config *cfg;
    tern_synth_spec spec;
    uint64_t rng;
    void **bufs;
    int n, cap;
    uint8_t *slab; /* small buffers: bump allocation in [slab, slab_end) */
    uint8_t *slab_end;
    size_t bytes; /* allocated (slabs whole) */
} tern_synth;

#define SLAB_HUGE ((size_t)2 << 20)
#define SLAB_BYTES (2 * SLAB_HUGE)

tern_synth *tern__synth_new(const tern_model_config *cfg, const tern_synth_spec *spec) {
    tern_synth *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = cfg;
    if (spec) s->spec = *spec;
    if (!s->spec.group_size) s->spec.group_size = 64;
    s->rng = s->spec.seed ? s->spec.seed : 0x5eed5eedULL;
    return s;
}

size_t tern__synth_bytes(const tern_synth *s) { return s ? s->bytes : 0; }

void tern__synth_free(tern_synth *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) tern_afree(s->bufs[i]);
    free(s->bufs);
    free(s);
}

static void *buf(tern_synth *s, size_t bytes);

/* A buffer of < 1 MB from the current slab (a new 4 MB one, 2 MB-aligned and advised, when
 * it is full); NULL when out of memory. 64-byte aligned like tern_aalloc. */
static void *small(tern_synth *s, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (!s->slab || (size_t)(s->slab_end - s->slab) < bytes) {
        uint8_t *raw = buf(s, SLAB_BYTES + SLAB_HUGE); /* tracked (freed) like any buffer */
        if (!raw) return NULL;
        uintptr_t a = ((uintptr_t)raw + SLAB_HUGE - 1) & ~(uintptr_t)(SLAB_HUGE - 1);
        s->slab = (uint8_t *)a;
        s->slab_end = s->slab + SLAB_BYTES;
    }
    void *p = s->slab;
    s->slab += bytes;
    return p;
}

static void *buf(tern_synth *s, size_t bytes) {
    if (bytes < SLAB_HUGE / 2) return small(s, bytes);
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 256;
        void **nb = realloc(s->bufs, sizeof(void *) * (size_t)nc);
        if (!nb) return NULL;
        s->bufs = nb;
        s->cap = nc;
    }
    void *p = tern_aalloc(bytes);
    if (p) s->bufs[s->n++] = p, s->bytes += bytes;
    tern_advise_huge(p, bytes);
    return p;
}

static uint64_t next(uint64_t *x) {
    *x ^= *x >> 12; *x ^= *x << 25; *x ^= *x >> 27;
    return *x * 2685821657736338717ULL;
}

/* Filling runs in chunks of FILL_CHUNK bytes, chunk c from its own generator seeded by (the call's draw from the
 * store's generator, c), so the bytes do not depend on how many threads wrote them; buffers of at least
 * FILL_PAR bytes are split over up to one thread per core (capped at FILL_THREADS): the first touch of their pages
 * (the kernel zeroing them) and the generator then run in parallel — GLM-5's ~390 GB at 4 bits would take minutes
 * on one thread. */
#define FILL_CHUNK ((size_t)1 << 20)
#define FILL_PAR ((size_t)64 << 20)
#define FILL_THREADS 64

typedef struct fill_job {
    uint8_t *p;
    size_t bytes;
    uint64_t seed, and_mask, or_mask; /* random words: (word & and_mask) | or_mask */
    int konst;                        /* 1: every 16-bit lane = (uint16_t)or_mask, no generator */
    atomic_size_t next;               /* next chunk to take */
} fill_job;

static uint64_t chunk_seed(uint64_t seed, size_t c) { /* splitmix64 of the pair: never 0 for xorshift */
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (uint64_t)(c + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z ? z : 1;
}

static void fill_chunk(const fill_job *j, size_t c) {
    uint8_t *p = j->p + c * FILL_CHUNK;
    size_t n = j->bytes - c * FILL_CHUNK < FILL_CHUNK ? j->bytes - c * FILL_CHUNK : FILL_CHUNK;
    if (j->konst) {
        uint16_t v = (uint16_t)j->or_mask;
        for (size_t i = 0; i + 2 <= n; i += 2) memcpy(p + i, &v, 2);
        return;
    }
    uint64_t x = chunk_seed(j->seed, c), w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        w = (next(&x) & j->and_mask) | j->or_mask;
        memcpy(p + i, &w, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)next(&x);
}

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    size_t nc = (j->bytes + FILL_CHUNK - 1) / FILL_CHUNK, c;
    while ((c = atomic_fetch_add(&j->next, 1)) < nc) fill_chunk(j, c);
    return NULL;
}

static void fill_run(fill_job *j) {
    atomic_init(&j->next, 0);
    size_t nc = (j->bytes + FILL_CHUNK - 1) / FILL_CHUNK;
    int nt = j->bytes >= FILL_PAR ? tern_cpu_count() : 1;
    if (nt > FILL_THREADS) nt = FILL_THREADS;
    if ((size_t)nt > nc) nt = (int)nc;
    pthread_t th[FILL_THREADS];
    int started = 0;
    for (int t = 1; t < nt; t++, started++)
        if (pthread_create(&th[t - 1], NULL, fill_worker, j)) break; /* fewer threads: the same bytes */
    fill_worker(j);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}

/* Fill with random 64-bit words, then apply `and`/`or` masks per word (keeps bf16 finite). */
static void fill(tern_synth *s, void *p, size_t bytes, uint64_t and_mask, uint64_t or_mask) {
    fill_job j = {.p = p, .bytes = bytes, .seed = next(&s->rng), .and_mask = and_mask, .or_mask = or_mask};
    fill_run(&j);
}

/* Every 16-bit lane of [p, p + bytes) = v (bytes even). */
static void fill16(void *p, size_t bytes, uint16_t v) {
    fill_job j = {.p = p, .bytes = bytes, .konst = 1, .or_mask = v};
    fill_run(&j);
}

/* bf16 lanes: keep sign + 7 mantissa bits, exponent fixed in [2^-7, 2^-5) */
#define BF16_AND 0x807f807f807f807fULL
#define BF16_OR 0x3c003c003c003c00ULL

int tern__synth_try(tern_synth *s, const char *name, int ndim, const int64_t *shape, tern_tensor *t,
                    tern_error *err) {
    memset(t, 0, sizeof *t);
    if (!shape || ndim < 1 || ndim > TERN_MAX_DIMS) return 0;
    if (!strcmp(name, "lm_head") && s->cfg->tie_embeddings) return 0;
    t->ndim = ndim;
    size_t ne = 1;
    for (int i = 0; i < ndim; i++) { t->shape[i] = shape[i]; ne *= (size_t)shape[i]; }
    t->name = "synthetic";
    t->device = -1;
    int64_t in = shape[ndim - 1];
    if (ndim == 1) { /* norm weights, scales: f32 around 1 */
        float *v = buf(s, ne * 4);
        if (!v) return tern_err(err, TERN_ENOMEM, "synthetic weights: out of memory for '%s'", name);
        uint64_t x = s->rng;
        for (size_t i = 0; i < ne; i++) v[i] = 1.0f + (float)((int)(next(&x) & 1023) - 512) / 8192.0f;
        s->rng = x;
        t->dtype = TERN_DT_F32;
        t->data = v;
        return 1;
    }
    int bits = s->spec.bits, gs = s->spec.group_size;
    if (bits && in % gs == 0 && (in * bits) % 32 == 0) {
        size_t rows = ne / (size_t)in, ng = (size_t)(in / gs);
        void *q = buf(s, rows * (size_t)(in * bits / 8));
        uint16_t *sc = buf(s, rows * ng * 2), *bi = buf(s, rows * ng * 2);
        if (!q || !sc || !bi) return tern_err(err, TERN_ENOMEM, "synthetic weights: out of memory for '%s'", name);
        fill(s, q, rows * (size_t)(in * bits / 8), ~0ULL, 0);
        uint16_t scale = tern_f32_to_bf16(1.0f / 256.0f), bias = tern_f32_to_bf16(-(float)(1 << (bits - 1)) / 256.0f);
        fill16(sc, rows * ng * 2, scale);
        fill16(bi, rows * ng * 2, bias);
        t->dtype = TERN_DT_Q;
        t->bits = bits;
        t->group_size = gs;
        t->sdtype = TERN_DT_BF16;
        t->data = q;
        t->scales = sc;
        t->biases = bi;
        return 1;
    }
    void *d = buf(s, ne * 2);
    if (!d) return tern_err(err, TERN_ENOMEM, "synthetic weights: out of memory for '%s' (%zu bytes)", name, ne * 2);
    fill(s, d, ne * 2, BF16_AND, BF16_OR);
    t->dtype = TERN_DT_BF16;
    t->data = d;
    return 1;
}
