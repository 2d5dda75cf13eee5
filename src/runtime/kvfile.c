/*
 * kvfile.c — KV save / restore (see kvfile.h).
 *
 * Layout (little-endian, offsets in bytes):
 *   0   header (struct kvf_header, 80 bytes)
 *   80  tokens int32 [n_tokens], zero-padded to a multiple of 64
 *   ..  for each owning layer l in order, for each saved block index b of its group
 *       (full: [0, n_blocks); sliding: [lo, n_blocks)): K page, then V page (exact page
 *       sizes of the layer's formats; a latent layer without V pool has none)
 * The checksum covers everything after the header. Pages come from tern_kv_block_copy.
 */
#include "runtime/kvfile.h"

#include "base/file.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_MAGIC "TERNKV\x00\x01"
#define KVF_VERSION 1

typedef struct kvf_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t model_id, layout_id;
    uint32_t n_tokens, block_size, n_layer, window;
    uint32_t lo, n_blocks;          /* first sliding block saved; blocks of the sequence */
    uint64_t payload_bytes, checksum;
    uint64_t reserved;
} kvf_header;

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { uint64_t w; memcpy(&w, b + i, 8); h = mix(h, w); }
    uint64_t t = 0;
    for (size_t j = 0; i + j < n; j++) t |= (uint64_t)b[i + j] << (8 * j);
    return mix(h, t ^ ((uint64_t)n << 56));
}

uint64_t tern_kv_config_id(const tern_model_config *c) {
    uint64_t h = mix(0x6b7666696c65ULL, (uint64_t)c->arch);
    h = mix(h, (uint64_t)c->n_layer);
    h = mix(h, (uint64_t)c->n_embd);
    h = mix(h, (uint64_t)c->n_vocab);
    h = mix(h, (uint64_t)c->sliding_window);
    for (int l = 0; l < c->n_layer; l++) {
        const tern_layer_config *lc = &c->layers[l];
        h = mix(h, (uint64_t)lc->type);
        h = mix(h, (uint64_t)lc->n_head_kv);
        h = mix(h, (uint64_t)lc->head_dim);
        h = mix(h, (uint64_t)lc->kv_src);
    }
    return h;
}

uint64_t tern_kv_weights_id(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t h = 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        tern_map m = {0};
        if (tern_map_open(&m, path, NULL)) continue;
        /* order-independent: directory order is not stable */
        uint64_t fh = hash_bytes(mix(0, m.size), de->d_name, len);
        size_t k = m.size < 65536 ? m.size : 65536;
        if (m.data) {
            fh = hash_bytes(fh, m.data, k);
            fh = hash_bytes(fh, (const char *)m.data + m.size - k, k);
        }
        h += mix(fh, 1);
        n++;
        tern_map_close(&m);
    }
    closedir(d);
    return n ? h : 0;
}

/* Layout id + number of payload page bytes for a sequence of n_blocks with sliding start lo. */
static uint64_t layout(const tern_kv *kv, int n_layer, int n_blocks, int lo, uint64_t *page_bytes) {
    uint64_t h = mix(0x6c61796f7574ULL, (uint64_t)tern_kv_block_size(kv)), pb = 0;
    for (int l = 0; l < n_layer; l++) {
        int g = tern_kv_layer_group(kv, l);
        const tern_kv_layer *v = tern_kv_view(kv, l);
        size_t bk = tern_kv_layer_page_bytes(kv, l, 0), bv = tern_kv_layer_page_bytes(kv, l, 1);
        h = mix(mix(mix(h, (uint64_t)(g + 1)), bk), bv);
        if (g < 0) continue;
        /* page formats: same sizes can still mean different codes (affine vs turbo) */
        h = mix(mix(mix(h, (uint64_t)v->kf.kind), (uint64_t)v->kf.bits), (uint64_t)v->kf.group);
        h = mix(mix(mix(h, (uint64_t)v->vf.kind), (uint64_t)v->vf.bits), (uint64_t)v->vf.group);
        pb += (uint64_t)(bk + bv) * (uint64_t)(g ? n_blocks - lo : n_blocks);
    }
    *page_bytes = pb;
    return h;
}

static size_t tok_bytes(int n) { return ((size_t)n * 4 + 63) / 64 * 64; }

static tern_status write_all(FILE *f, const void *p, size_t n, uint64_t *ck, const char *path, tern_error *err) {
    if (ck) *ck = hash_bytes(*ck, p, n);
    if (n && fwrite(p, 1, n, f) != n) return tern_err(err, TERN_EIO, "%s: write failed (disk full?)", path);
    return TERN_OK;
}

tern_status tern_kv_save(tern_kv *kv, int slot, const int32_t *tokens, int n_tokens, uint64_t model_id,
                         const char *path, tern_error *err) {
    if (!kv || !path || n_tokens <= 0 || !tokens || slot < 0 || slot >= tern_kv_n_slots(kv))
        return tern_err(err, TERN_EINVAL, "kv_save: bad argument (slot %d, %d tokens)", slot, n_tokens);
    int bs = tern_kv_block_size(kv), nl = tern_kv_n_layer(kv);
    int nb = (n_tokens + bs - 1) / bs, lo = tern_kv_window_first(kv, n_tokens);
    for (int g = 0; g < 2; g++)
        for (int b = g ? lo : 0; tern_kv_has_group(kv, g) && b < nb; b++)
            if (tern_kv_group_block(kv, g, slot, b) < 0)
                return tern_err(err, TERN_EINVAL, "kv_save: slot %d has no %s block at index %d for %d tokens",
                                slot, g ? "sliding" : "full", b, n_tokens);
    size_t maxbb = 0;
    for (int l = 0; l < nl; l++) maxbb = TERN_MAX(maxbb, tern_kv_layer_block_bytes(kv, l));
    char *buf = malloc(2 * maxbb + 64);   /* K page then V page, each at most maxbb */
    FILE *f = fopen(path, "wb");
    if (!buf || !f) {
        free(buf);
        if (f) fclose(f);
        return tern_err(err, f ? TERN_ENOMEM : TERN_EIO, "%s: cannot %s", path, f ? "allocate a page buffer" : "create the file");
    }
    kvf_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, KVF_MAGIC, 8);
    h.version = KVF_VERSION;
    h.header_bytes = sizeof h;
    h.model_id = model_id;
    h.layout_id = layout(kv, nl, nb, lo, &h.payload_bytes);
    h.payload_bytes += tok_bytes(n_tokens);
    h.n_tokens = (uint32_t)n_tokens;
    h.block_size = (uint32_t)bs;
    h.n_layer = (uint32_t)nl;
    h.window = (uint32_t)tern_kv_window(kv);
    h.lo = (uint32_t)lo;
    h.n_blocks = (uint32_t)nb;
    uint64_t ck = 0;
    tern_status st = write_all(f, &h, sizeof h, NULL, path, err);
    static const char zero[64];
    if (!st) st = write_all(f, tokens, (size_t)n_tokens * 4, &ck, path, err);
    if (!st) st = write_all(f, zero, tok_bytes(n_tokens) - (size_t)n_tokens * 4, &ck, path, err);
    for (int l = 0; !st && l < nl; l++) {
        int g = tern_kv_layer_group(kv, l);
        size_t bk = tern_kv_layer_page_bytes(kv, l, 0), bv = tern_kv_layer_page_bytes(kv, l, 1);
        for (int b = g ? lo : 0; g >= 0 && !st && b < nb; b++) {
            st = tern_kv_block_copy(kv, l, tern_kv_group_block(kv, g, slot, b), buf, buf + bk, 0, err);
            if (!st) st = write_all(f, buf, bk + bv, &ck, path, err);
        }
    }
    h.checksum = ck;
    if (!st && (fseek(f, 0, SEEK_SET) || fwrite(&h, sizeof h, 1, f) != 1))
        st = tern_err(err, TERN_EIO, "%s: cannot write the header", path);
    if (fclose(f) && !st) st = tern_err(err, TERN_EIO, "%s: write failed on close", path);
    free(buf);
    if (st) remove(path);
    return st;
}

tern_status tern_kv_restore(tern_kv *kv, int slot, uint64_t model_id, const char *path, int32_t **tokens,
                            int *n_tokens, tern_error *err) {
    if (tokens) *tokens = NULL;
    if (n_tokens) *n_tokens = 0;
    if (!kv || !path || !tokens || !n_tokens || slot < 0 || slot >= tern_kv_n_slots(kv))
        return tern_err(err, TERN_EINVAL, "kv_restore: bad argument (slot %d)", slot);
    tern_map m = {0};
    tern_status st = tern_map_open(&m, path, err);
    if (st) return st;
    kvf_header h;
    const char *base = m.data;
    if (m.size < sizeof h) { tern_map_close(&m); return tern_err(err, TERN_EFORMAT, "%s: not a tern KV file (%zu bytes)", path, m.size); }
    memcpy(&h, base, sizeof h);
    int bs = tern_kv_block_size(kv), nl = tern_kv_n_layer(kv);
    uint64_t pages = 0, lay = 0;
    if (memcmp(h.magic, KVF_MAGIC, 8) || h.version != KVF_VERSION || h.header_bytes != sizeof h)
        st = tern_err(err, TERN_EFORMAT, "%s: not a tern KV file of version %d", path, KVF_VERSION);
    else if (h.model_id != model_id)
        st = tern_err(err, TERN_EINVAL, "%s: saved from a different model (fingerprint %016llx, this model %016llx)",
                      path, (unsigned long long)h.model_id, (unsigned long long)model_id);
    else if (h.block_size != (uint32_t)bs || h.n_layer != (uint32_t)nl || h.window != (uint32_t)tern_kv_window(kv))
        st = tern_err(err, TERN_EINVAL, "%s: KV layout differs (block size %u, %u layers, window %u; this cache: %d, %d, %d)",
                      path, h.block_size, h.n_layer, h.window, bs, nl, tern_kv_window(kv));
    else if (h.n_tokens == 0 || h.n_tokens > (uint32_t)tern_kv_max_ctx(kv))
        st = tern_err(err, TERN_EINVAL, "%s: %u tokens do not fit the context limit %d", path, h.n_tokens, tern_kv_max_ctx(kv));
    else if (h.n_blocks != (h.n_tokens + h.block_size - 1) / h.block_size ||
             h.lo != (uint32_t)tern_kv_window_first(kv, (int)h.n_tokens))
        st = tern_err(err, TERN_EFORMAT, "%s: inconsistent header (%u tokens, %u blocks)", path, h.n_tokens, h.n_blocks);
    else if ((lay = layout(kv, nl, (int)h.n_blocks, (int)h.lo, &pages)) != h.layout_id)
        st = tern_err(err, TERN_EINVAL, "%s: KV page format differs from this cache's (saved by another build or --kv-quant)", path);
    else if (pages + tok_bytes((int)h.n_tokens) != h.payload_bytes || m.size - sizeof h != h.payload_bytes)
        st = tern_err(err, TERN_EFORMAT, "%s: %zu bytes, expected %llu (truncated?)", path, m.size,
                      (unsigned long long)(h.payload_bytes + sizeof h));
    if (!st) {
        uint64_t ck = 0;
        ck = hash_bytes(ck, base + sizeof h, (size_t)h.n_tokens * 4);
        ck = hash_bytes(ck, base + sizeof h + (size_t)h.n_tokens * 4, tok_bytes((int)h.n_tokens) - (size_t)h.n_tokens * 4);
        const char *p = base + sizeof h + tok_bytes((int)h.n_tokens);
        for (int l = 0; l < nl; l++) {
            int g = tern_kv_layer_group(kv, l);
            size_t bkv = tern_kv_layer_page_bytes(kv, l, 0) + tern_kv_layer_page_bytes(kv, l, 1);
            for (int b = g ? (int)h.lo : 0; g >= 0 && b < (int)h.n_blocks; b++, p += bkv) ck = hash_bytes(ck, p, bkv);
        }
        if (ck != h.checksum) st = tern_err(err, TERN_EFORMAT, "%s: checksum mismatch (file corrupt)", path);
    }
    int32_t *tok = NULL;
    if (!st) {
        const int32_t *src = (const int32_t *)(const void *)(base + sizeof h);
        if (!(tok = malloc(sizeof(int32_t) * h.n_tokens))) st = tern_err(err, TERN_ENOMEM, "kv_restore: out of memory");
        else memcpy(tok, src, sizeof(int32_t) * h.n_tokens);
    }
    if (!st) st = tern_kv_reserve_resume(kv, slot, (int)h.n_tokens, err);
    if (!st) {
        const char *p = base + sizeof h + tok_bytes((int)h.n_tokens);
        for (int l = 0; !st && l < nl; l++) {
            int g = tern_kv_layer_group(kv, l);
            size_t bk = tern_kv_layer_page_bytes(kv, l, 0), bv = tern_kv_layer_page_bytes(kv, l, 1);
            for (int b = g ? (int)h.lo : 0; g >= 0 && !st && b < (int)h.n_blocks; b++, p += bk + bv)
                st = tern_kv_block_copy(kv, l, tern_kv_group_block(kv, g, slot, b), (void *)p, (void *)(p + bk), 1, err);
        }
        if (st) tern_kv_release(kv, slot);
    }
    tern_map_close(&m);
    if (st) { free(tok); return st; }
    *tokens = tok;
    *n_tokens = (int)h.n_tokens;
    return TERN_OK;
}
