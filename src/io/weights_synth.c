/*
 * weights_synth.c — the synthetic weight store behind tern_weights_open_synth: tensors are
 * made when the model asks for them, with the requested shape, so `tern bench --random NAME`
 * runs real geometries without files. Values are random but tame (no NaN/Inf): bf16 with
 * magnitudes in [2^-7, 2^-5), MLX codes uniformly random with small scales, norm vectors ≈ 1.
 * Filling is multi-GB for large models: a 64-bit xorshift writes 8 bytes per step.
 * Buffers of >= 2 MB are advised MADV_HUGEPAGE before the first write (2 MB pages where the
 * kernel allows THP: fewer TLB misses when decode streams them; TERN_THP=0 keeps 4 KB pages).
 * Smaller ones (MLX scales/biases, norms: 2 KB-1 MB each) are carved from 4 MB slabs whose
 * 2 MB-aligned part is advised the same way, so the Q formats' scale streams stop walking
 * 4 KB page tables next to weights on 2 MB pages (bench/NOTES.md (j), (k)).
 */
#include "io/weights.h"

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
    if (p) s->bufs[s->n++] = p;
    tern_advise_huge(p, bytes);
    return p;
}

static uint64_t next(uint64_t *x) {
    *x ^= *x >> 12; *x ^= *x << 25; *x ^= *x >> 27;
    return *x * 2685821657736338717ULL;
}

/* Fill with random 64-bit words, then apply `and`/`or` masks per word (keeps bf16 finite). */
static void fill(tern_synth *s, void *p, size_t bytes, uint64_t and_mask, uint64_t or_mask) {
    uint64_t *w = p, x = s->rng;
    size_t nw = bytes / 8;
    for (size_t i = 0; i < nw; i++) w[i] = (next(&x) & and_mask) | or_mask;
    for (size_t i = nw * 8; i < bytes; i++) ((uint8_t *)p)[i] = (uint8_t)next(&x);
    s->rng = x;
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
        for (size_t i = 0; i < rows * ng; i++) { sc[i] = scale; bi[i] = bias; }
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
