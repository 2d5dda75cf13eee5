/*
 * safetensors.c — open, validate and index .safetensors files (single, sharded, directory).
 *
 * Layout of one file: u64 LE header length N | N bytes JSON header | data section.
 * Every tensor is checked when the file is opened, so later code can trust an entry:
 * known dtype, shape of non-negative ints (≤ TERN_MAX_DIMS), data_offsets [begin, end]
 * inside the data section with end-begin == prod(shape)*dtype size (overflow-checked),
 * no two tensors overlapping, no name present twice (within a file or across shards).
 * Offsets need not be aligned; consumers read with memcpy-safe loads.
 *
 * A directory is opened through model.safetensors.index.json when present (its weight_map
 * must name existing shard files, and each tensor must really live in the shard the map
 * names) or else as every *.safetensors file in it, in sorted order.
 * Names are found through an open-addressing hash table (FNV-1a).
 * Messages always carry the file path and, where there is one, the tensor name.
 * --no-mmap (load_copy): once a file is validated, its tensors (minus those the keep_mapped rule
 * names) are packed in offset order into one anonymous 2 MB-aligned buffer advised for huge
 * pages (runs of tensors separated by < 64 KB are read as one pread; each run keeps its file
 * offset modulo 64), and the entries are re-pointed there; a file with nothing kept is unmapped.
 */
#include "io/safetensors.h"

#include "base/file.h"
#include "base/json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct st_file {
    char *path;
    tern_map map;
    int mapped; /* we own the map (0 for tern__st_parse_buffer) */
    void *copy; /* --no-mmap: the anonymous mapping (copy_len bytes) holding this file's tensors */
    size_t copy_len;
} st_file;

typedef struct st_meta {
    char *key, *val;
} st_meta;

struct tern_st_set {
    st_file *files;
    int n_files;
    tern_st_entry *ent;
    int n, cap;
    int *hash; /* entry index + 1; 0 = empty */
    size_t hcap;
    st_meta *meta;
    int n_meta;
    tern_st_opts opts;
    size_t copied; /* bytes read into anonymous memory over every file */
};

/* ---- dtype table ---------------------------------------------------------------- */

/* Returns >= 0 (tern_dtype), -1 unknown, -2 a safetensors dtype tern does not support. */
static int parse_dtype(const char *s) {
    static const struct { const char *name; int dt; } tab[] = {
        {"F64", TERN_DT_F64},   {"F32", TERN_DT_F32}, {"F16", TERN_DT_F16},         {"BF16", TERN_DT_BF16},
        {"F8_E4M3", TERN_DT_F8_E4M3}, {"I64", TERN_DT_I64}, {"I32", TERN_DT_I32}, {"U32", TERN_DT_U32},
        {"I16", TERN_DT_I16},   {"I8", TERN_DT_I8},   {"U8", TERN_DT_U8},           {"BOOL", TERN_DT_BOOL},
        {"F8_E5M2", -2},        {"F8_E8M0", -2},      {"U16", -2},                  {"U64", -2},
        {"F6_E2M3", -2},        {"F6_E3M2", -2},      {"F4", -2},                   {"C64", -2},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(tab); i++)
        if (!strcmp(s, tab[i].name)) return tab[i].dt;
    return -1;
}

/* ---- hash table ----------------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int hash_find(const tern_st_set *s, const char *name) {
    if (!s->hcap) return -1;
    size_t m = s->hcap - 1;
    for (size_t i = fnv1a(name) & m;; i = (i + 1) & m) {
        int v = s->hash[i];
        if (!v) return -1;
        if (!strcmp(s->ent[v - 1].name, name)) return v - 1;
    }
}

static void hash_put(tern_st_set *s, int idx) {
    size_t m = s->hcap - 1;
    size_t i = fnv1a(s->ent[idx].name) & m;
    while (s->hash[i]) i = (i + 1) & m;
    s->hash[i] = idx + 1;
}

static tern_status hash_grow(tern_st_set *s, tern_error *err) {
    if ((size_t)(s->n + 1) * 2 <= s->hcap) return TERN_OK;
    size_t cap = s->hcap ? s->hcap * 2 : 64;
    while ((size_t)(s->n + 1) * 2 > cap) cap *= 2;
    int *h = calloc(cap, sizeof *h);
    if (!h) return tern_err(err, TERN_ENOMEM, "safetensors: out of memory for the name index");
    free(s->hash);
    s->hash = h;
    s->hcap = cap;
    for (int i = 0; i < s->n; i++) hash_put(s, i);
    return TERN_OK;
}

/* ---- one file ------------------------------------------------------------------- */

typedef struct range {
    uint64_t begin, end;
    int idx;
} range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

static tern_status keep_metadata(tern_st_set *s, const cJSON *md, const char *path, tern_error *err) {
    if (!cJSON_IsObject(md)) return tern_err(err, TERN_EFORMAT, "%s: __metadata__ is not an object", path);
    for (const cJSON *c = md->child; c; c = c->next) {
        if (!c->string || !cJSON_IsString(c) || !c->valuestring) continue;
        st_meta *m = realloc(s->meta, (size_t)(s->n_meta + 1) * sizeof *m);
        if (!m) return tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
        s->meta = m;
        m[s->n_meta].key = strdup(c->string);
        m[s->n_meta].val = strdup(c->valuestring);
        if (!m[s->n_meta].key || !m[s->n_meta].val) {
            free(m[s->n_meta].key);
            free(m[s->n_meta].val);
            return tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
        }
        s->n_meta++;
    }
    return TERN_OK;
}

static tern_status parse_entry(tern_st_set *s, int file, const cJSON *t, const uint8_t *data, uint64_t dsize,
                               tern_error *err) {
    const char *path = s->files[file].path, *name = t->string;
    char got[64];
    if (!cJSON_IsObject(t))
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s': expected an object, got %s", path, name,
                        tern_json_describe(t, got, sizeof got));
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s': dtype: expected a string, got %s", path, name,
                        tern_json_describe(jd, got, sizeof got));
    int dt = parse_dtype(jd->valuestring);
    if (dt == -1)
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s': unknown dtype \"%.40s\"", path, name, jd->valuestring);
    if (dt == -2)
        return tern_err(err, TERN_EUNSUPPORTED, "%s: tensor '%.200s': dtype %s is not supported", path, name,
                        jd->valuestring);
    if (!cJSON_IsArray(js))
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s': shape: expected an array, got %s", path, name,
                        tern_json_describe(js, got, sizeof got));
    int nd = cJSON_GetArraySize(js);
    if (nd > TERN_MAX_DIMS)
        return tern_err(err, TERN_EUNSUPPORTED, "%s: tensor '%.200s': %d dimensions (at most %d supported)", path,
                        name, nd, TERN_MAX_DIMS);
    tern_st_entry e;
    memset(&e, 0, sizeof e);
    e.dtype = (tern_dtype)dt;
    e.ndim = nd;
    e.file = file;
    size_t nbytes = tern_dtype_size(e.dtype);
    int overflow = 0, i = 0;
    for (const cJSON *d = js->child; d; d = d->next, i++) {
        char what[300];
        int64_t v;
        snprintf(what, sizeof what, "%s: tensor '%.200s': shape[%d]", path, name, i);
        if (tern_json_value_int(d, what, 0, INT64_MAX / 2, &v, err)) return TERN_EFORMAT;
        e.shape[i] = v;
        if (!tern_mul_ok(nbytes, (size_t)v, &nbytes)) overflow = 1;
    }
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s': data_offsets: expected [begin, end], got %s", path,
                        name, tern_json_describe(jo, got, sizeof got));
    int64_t b, en;
    char what[300];
    snprintf(what, sizeof what, "%s: tensor '%.200s': data_offsets[0]", path, name);
    if (tern_json_value_int(jo->child, what, 0, INT64_MAX / 2, &b, err)) return TERN_EFORMAT;
    snprintf(what, sizeof what, "%s: tensor '%.200s': data_offsets[1]", path, name);
    if (tern_json_value_int(jo->child->next, what, 0, INT64_MAX / 2, &en, err)) return TERN_EFORMAT;
    if (b > en)
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s': data_offsets [%lld, %lld]: begin > end", path, name,
                        (long long)b, (long long)en);
    if ((uint64_t)en > dsize)
        return tern_err(err, TERN_EFORMAT,
                        "%s: tensor '%.200s': data_offsets end %lld is beyond the data section (%llu bytes)", path,
                        name, (long long)en, (unsigned long long)dsize);
    if (overflow || nbytes != (size_t)(en - b)) {
        char shp[128] = "";
        size_t k = 0;
        for (int j = 0; j < nd && k < sizeof shp - 24; j++)
            k += (size_t)snprintf(shp + k, sizeof shp - k, "%s%lld", j ? ", " : "", (long long)e.shape[j]);
        return tern_err(err, TERN_EFORMAT,
                        "%s: tensor '%.200s': %s [%s] needs %s%zu bytes but data_offsets [%lld, %lld] hold %lld",
                        path, name, jd->valuestring, shp, overflow ? "more than " : "", overflow ? SIZE_MAX : nbytes,
                        (long long)b, (long long)en, (long long)(en - b));
    }
    e.nbytes = nbytes;
    e.data = data + b;
    int prev = hash_find(s, name);
    if (prev >= 0)
        return tern_err(err, TERN_EFORMAT, "%s: tensor '%.200s' is duplicated (also in %s)", path, name,
                        s->files[s->ent[prev].file].path);
    if (hash_grow(s, err)) return TERN_ENOMEM;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        tern_st_entry *ne = realloc(s->ent, (size_t)cap * sizeof *ne);
        if (!ne) return tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
        s->ent = ne;
        s->cap = cap;
    }
    e.name = strdup(name);
    if (!e.name) return tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
    s->ent[s->n] = e;
    hash_put(s, s->n);
    s->n++;
    return TERN_OK;
}

/* Validate and index the image of file `file` (already in s->files). */
static tern_status parse_file(tern_st_set *s, int file, const uint8_t *buf, size_t size, tern_error *err) {
    const char *path = s->files[file].path;
    if (size < 8)
        return tern_err(err, TERN_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length", path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > TERN_ST_MAX_HEADER)
        return tern_err(err, TERN_EFORMAT, "%s: header length %llu is absurd (limit %llu; not a safetensors file?)",
                        path, (unsigned long long)hlen, (unsigned long long)TERN_ST_MAX_HEADER);
    if (hlen > size - 8)
        return tern_err(err, TERN_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                        (unsigned long long)hlen, size);
    char what[300];
    snprintf(what, sizeof what, "%s: header", path);
    cJSON *h = NULL;
    if (tern_json_parse((const char *)buf + 8, (size_t)hlen, what, &h, err)) return TERN_EFORMAT;
    tern_status st = TERN_OK;
    range *rg = NULL;
    int first = s->n, nr = 0;
    if (!cJSON_IsObject(h)) {
        char got[64];
        st = tern_err(err, TERN_EFORMAT, "%s: header: expected a JSON object, got %s", path,
                      tern_json_describe(h, got, sizeof got));
        goto done;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;
    for (const cJSON *t = h->child; t; t = t->next) {
        if (!t->string) continue;
        if (!strcmp(t->string, "__metadata__")) st = keep_metadata(s, t, path, err);
        else st = parse_entry(s, file, t, data, dsize, err);
        if (st) goto done;
    }
    /* overlap check over this file's non-empty tensors, sorted by begin */
    rg = malloc((size_t)(s->n - first + 1) * sizeof *rg);
    if (!rg) {
        st = tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int i = first; i < s->n; i++) {
        if (!s->ent[i].nbytes) continue;
        uint64_t b = (uint64_t)((const uint8_t *)s->ent[i].data - data);
        rg[nr++] = (range){b, b + s->ent[i].nbytes, i};
    }
    qsort(rg, (size_t)nr, sizeof *rg, cmp_range);
    for (int i = 1; i < nr; i++)
        if (rg[i].begin < rg[i - 1].end) {
            st = tern_err(err, TERN_EFORMAT, "%s: tensors '%.150s' [%llu, %llu) and '%.150s' [%llu, %llu) overlap", path,
                          s->ent[rg[i - 1].idx].name, (unsigned long long)rg[i - 1].begin,
                          (unsigned long long)rg[i - 1].end, s->ent[rg[i].idx].name, (unsigned long long)rg[i].begin,
                          (unsigned long long)rg[i].end);
            goto done;
        }
done:
    free(rg);
    cJSON_Delete(h);
    return st;
}

/* ---- --no-mmap: tensor bytes into anonymous memory -------------------------------------- */

#define RUN_GAP ((uint64_t)64 << 10) /* read across holes smaller than this */
#define HUGE_2M ((size_t)2 << 20)

int tern_st_is_routed_expert(const char *name, void *ctx) {
    (void)ctx;
    return name && (strstr(name, ".experts.") || strstr(name, ".switch_mlp.") || strstr(name, ".switch_glu."));
}

static tern_status pread_all(int fd, uint8_t *dst, size_t n, uint64_t off, const char *path, tern_error *err) {
    while (n) {
        size_t want = n < ((size_t)64 << 20) ? n : ((size_t)64 << 20);
        ssize_t r = pread(fd, dst, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return tern_err(err, TERN_EIO, "%s: reading %zu bytes at offset %llu (--no-mmap): %s", path, want,
                            (unsigned long long)off, strerror(errno));
        if (r == 0)
            return tern_err(err, TERN_EFORMAT, "%s: file ended at byte %llu while reading tensor bytes (--no-mmap; "
                            "truncated while open?)", path, (unsigned long long)off);
        dst += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return TERN_OK;
}

/* Physical memory in bytes (0 if unknown). */
static uint64_t phys_bytes(void) {
    long pg = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    return pg > 0 && ps > 0 ? (uint64_t)pg * (uint64_t)ps : 0;
}

/* Copy the tensors of file `file` (entries [first, s->n)) out of its mapping (see the top). */
static tern_status load_copy(tern_st_set *s, int file, int first, tern_error *err) {
    if (!s->opts.no_mmap) return TERN_OK;
    st_file *f = &s->files[file];
    const uint8_t *base = f->map.data;
    range *rg = malloc((size_t)(s->n - first + 1) * sizeof *rg);
    if (!rg) return tern_err(err, TERN_ENOMEM, "%s: out of memory", f->path);
    int nr = 0, kept = 0;
    for (int i = first; i < s->n; i++) {
        if (!s->ent[i].nbytes) continue;
        if (s->opts.keep_mapped && s->opts.keep_mapped(s->ent[i].name, s->opts.ctx)) { kept++; continue; }
        uint64_t b = (uint64_t)((const uint8_t *)s->ent[i].data - base);
        rg[nr++] = (range){b, b + s->ent[i].nbytes, i};
    }
    qsort(rg, (size_t)nr, sizeof *rg, cmp_range);
    /* pass 1: size of the packed image (runs start at their file offset modulo 64) */
    size_t total = 0;
    for (int i = 0; i < nr;) {
        int j = i + 1;
        uint64_t end = rg[i].end;
        while (j < nr && rg[j].begin - end < RUN_GAP) end = rg[j].end > end ? rg[j].end : end, j++;
        total = ((total + 63) & ~(size_t)63) + (size_t)(rg[i].begin & 63) + (size_t)(end - rg[i].begin);
        i = j;
    }
    tern_status st = TERN_OK;
    if (!total) goto out;
    uint64_t phys = phys_bytes();
    if (phys && (uint64_t)s->copied + total > phys) {
        st = tern_err(err, TERN_ENOMEM, "%s: --no-mmap needs %.1f MB of memory for this file's tensors (%.1f MB already "
                      "read), more than this machine's %.1f MB; use the default (mmap) mode", f->path, total / 1e6,
                      s->copied / 1e6, phys / 1e6);
        goto out;
    }
    size_t len = ((total + HUGE_2M - 1) & ~(HUGE_2M - 1)) + HUGE_2M;
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        st = tern_err(err, TERN_ENOMEM, "%s: --no-mmap: out of memory allocating %.1f MB for the tensors (%s); use the "
                      "default (mmap) mode", f->path, total / 1e6, strerror(errno));
        goto out;
    }
    f->copy = mem;
    f->copy_len = len;
    uint8_t *dst0 = (uint8_t *)(((uintptr_t)mem + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
    tern_advise_huge(dst0, total);
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = tern_err(err, TERN_EIO, "%s: cannot open for reading (--no-mmap): %s", f->path, strerror(errno));
        goto out;
    }
    size_t at = 0;
    for (int i = 0; i < nr && !st;) {
        int j = i + 1;
        uint64_t end = rg[i].end;
        while (j < nr && rg[j].begin - end < RUN_GAP) end = rg[j].end > end ? rg[j].end : end, j++;
        at = ((at + 63) & ~(size_t)63) + (size_t)(rg[i].begin & 63);
        st = pread_all(fd, dst0 + at, (size_t)(end - rg[i].begin), rg[i].begin, f->path, err);
        for (int k = i; k < j && !st; k++) s->ent[rg[k].idx].data = dst0 + at + (rg[k].begin - rg[i].begin);
        at += (size_t)(end - rg[i].begin);
        i = j;
    }
    close(fd);
    if (st) goto out;
    s->copied += total;
    if (!kept) { /* nothing reads the mapping any more; empty tensors point at the copy */
        for (int i = first; i < s->n; i++)
            if (!s->ent[i].nbytes) s->ent[i].data = dst0;
        tern_map_close(&f->map);
        f->mapped = 0;
    }
out:
    free(rg);
    return st;
}

static tern_status add_file(tern_st_set *s, const char *path, tern_error *err) {
    st_file *f = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *f);
    if (!f) return tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
    s->files = f;
    memset(&f[s->n_files], 0, sizeof *f);
    f[s->n_files].path = strdup(path);
    if (!f[s->n_files].path) return tern_err(err, TERN_ENOMEM, "%s: out of memory", path);
    s->n_files++;
    return TERN_OK;
}

static tern_status open_file(tern_st_set *s, const char *path, tern_error *err) {
    if (add_file(s, path, err)) return TERN_ENOMEM;
    st_file *f = &s->files[s->n_files - 1];
    tern_status st = tern_map_open(&f->map, path, err);
    if (st) return st;
    f->mapped = 1;
    int first = s->n;
    st = parse_file(s, s->n_files - 1, f->map.data, f->map.size, err);
    return st ? st : load_copy(s, s->n_files - 1, first, err);
}

/* ---- sets ----------------------------------------------------------------------- */

static tern_status open_index(tern_st_set *s, const char *dir, const char *ipath, tern_error *err) {
    char *txt = NULL;
    size_t len = 0;
    tern_status st = tern_file_read(ipath, (size_t)256 << 20, &txt, &len, err);
    if (st) return st;
    cJSON *j = NULL;
    const char *iname = tern_path_base(ipath);
    st = tern_json_parse(txt, len, ipath, &j, err);
    free(txt);
    if (st) return st;
    const cJSON *wm = tern_json_item(j, "weight_map");
    char path[4096], got[64];
    int *fidx = NULL, nmap = 0;
    if (!cJSON_IsObject(wm)) {
        st = tern_err(err, TERN_EFORMAT, "%s: weight_map: expected an object, got %s", ipath,
                      tern_json_describe(wm, got, sizeof got));
        goto done;
    }
    nmap = cJSON_GetArraySize(wm);
    fidx = calloc((size_t)nmap + 1, sizeof *fidx);
    if (!fidx) {
        st = tern_err(err, TERN_ENOMEM, "%s: out of memory", ipath);
        goto done;
    }
    /* unique shard files, in order of first mention */
    int k = 0;
    for (const cJSON *c = wm->child; c; c = c->next, k++) {
        if (!cJSON_IsString(c) || !c->valuestring || !c->valuestring[0] || strchr(c->valuestring, '/')) {
            st = tern_err(err, TERN_EFORMAT, "%s: weight_map['%.200s']: expected a shard file name, got %s", iname,
                          c->string ? c->string : "", tern_json_describe(c, got, sizeof got));
            goto done;
        }
        if ((st = tern_path_join(path, sizeof path, dir, c->valuestring, err))) goto done;
        int f = -1;
        for (int i = s->n_files - 1; i >= 0; i--)
            if (!strcmp(s->files[i].path, path)) { f = i; break; }
        if (f < 0) {
            if (!tern_is_file(path)) {
                st = tern_err(err, TERN_ENOTFOUND, "%s: weight_map['%.200s'] names shard %s, which does not exist",
                              iname, c->string ? c->string : "", c->valuestring);
                goto done;
            }
            if ((st = add_file(s, path, err))) goto done;
            f = s->n_files - 1;
        }
        fidx[k] = f;
    }
    for (int i = 0; i < s->n_files; i++) {
        st_file *f = &s->files[i];
        if ((st = tern_map_open(&f->map, f->path, err))) goto done;
        f->mapped = 1;
        int first = s->n;
        if ((st = parse_file(s, i, f->map.data, f->map.size, err))) goto done;
        if ((st = load_copy(s, i, first, err))) goto done;
    }
    k = 0;
    for (const cJSON *c = wm->child; c; c = c->next, k++) {
        const char *tn = c->string ? c->string : "";
        int e = hash_find(s, tn);
        if (e < 0) {
            st = tern_err(err, TERN_EFORMAT, "%s: weight_map says tensor '%.200s' is in %s, but it is in no shard",
                          iname, tn, c->valuestring);
            goto done;
        }
        if (s->ent[e].file != fidx[k]) {
            st = tern_err(err, TERN_EFORMAT, "%s: weight_map says tensor '%.200s' is in %s, but it is in %s", iname, tn,
                          c->valuestring, tern_path_base(s->files[s->ent[e].file].path));
            goto done;
        }
    }
    if (s->n > nmap)
        tern_log(TERN_LOG_WARN, "%s: %d tensors in the shards are not listed in weight_map", ipath, s->n - nmap);
done:
    free(fidx);
    cJSON_Delete(j);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static tern_status open_dir(tern_st_set *s, const char *dir, tern_error *err) {
    DIR *d = opendir(dir);
    if (!d) return tern_err(err, TERN_EIO, "%s: cannot open directory", dir);
    char **names = NULL;
    int n = 0;
    tern_status st = TERN_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") || de->d_name[0] == '.') continue;
        char **nn = realloc(names, (size_t)(n + 1) * sizeof *nn);
        if (!nn || !(nn[n] = strdup(de->d_name))) {
            if (nn) names = nn;
            st = tern_err(err, TERN_ENOMEM, "%s: out of memory", dir);
            break;
        }
        names = nn;
        n++;
    }
    closedir(d);
    if (!st && n == 0) st = tern_err(err, TERN_ENOTFOUND, "%s: no *.safetensors files (and no index)", dir);
    if (!st) qsort(names, (size_t)n, sizeof *names, cmp_str);
    char path[4096];
    for (int i = 0; !st && i < n; i++) {
        st = tern_path_join(path, sizeof path, dir, names[i], err);
        if (!st) st = open_file(s, path, err);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

tern_status tern_st_open(tern_st_set **out, const char *path, tern_error *err) {
    return tern_st_open_opts(out, path, NULL, err);
}

tern_status tern_st_open_opts(tern_st_set **out, const char *path, const tern_st_opts *opts, tern_error *err) {
    *out = NULL;
    if (!path || !*path) return tern_err(err, TERN_EINVAL, "safetensors: empty path");
    tern_st_set *s = calloc(1, sizeof *s);
    if (!s) return tern_err(err, TERN_ENOMEM, "safetensors: out of memory");
    if (opts) s->opts = *opts;
    tern_status st;
    char ipath[4096];
    if (tern_is_dir(path)) {
        st = tern_path_join(ipath, sizeof ipath, path, "model.safetensors.index.json", err);
        if (!st) st = tern_is_file(ipath) ? open_index(s, path, ipath, err) : open_dir(s, path, err);
    } else if (tern_is_file(path)) {
        st = open_file(s, path, err);
    } else {
        st = tern_err(err, TERN_ENOTFOUND, "%s: no such file or directory", path);
    }
    if (st) {
        tern_st_close(s);
        return st;
    }
    *out = s;
    return TERN_OK;
}

tern_status tern__st_parse_buffer(tern_st_set **out, const void *buf, size_t len, const char *name,
                                  tern_error *err) {
    *out = NULL;
    tern_st_set *s = calloc(1, sizeof *s);
    if (!s) return tern_err(err, TERN_ENOMEM, "safetensors: out of memory");
    tern_status st = add_file(s, name ? name : "(buffer)", err);
    if (!st) {
        s->files[0].map.data = buf;
        s->files[0].map.size = len;
        st = parse_file(s, 0, buf, len, err);
    }
    if (st) {
        tern_st_close(s);
        return st;
    }
    *out = s;
    return TERN_OK;
}

void tern_st_close(tern_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].mapped) tern_map_close(&s->files[i].map);
        if (s->files[i].copy) munmap(s->files[i].copy, s->files[i].copy_len);
        free(s->files[i].path);
    }
    for (int i = 0; i < s->n; i++) free(s->ent[i].name);
    for (int i = 0; i < s->n_meta; i++) {
        free(s->meta[i].key);
        free(s->meta[i].val);
    }
    free(s->meta);
    free(s->files);
    free(s->ent);
    free(s->hash);
    free(s);
}

int tern_st_count(const tern_st_set *s) { return s ? s->n : 0; }

const tern_st_entry *tern_st_at(const tern_st_set *s, int i) {
    return (s && i >= 0 && i < s->n) ? &s->ent[i] : NULL;
}

const tern_st_entry *tern_st_find(const tern_st_set *s, const char *name) {
    if (!s || !name) return NULL;
    int i = hash_find(s, name);
    return i >= 0 ? &s->ent[i] : NULL;
}

const char *tern_st_file_name(const tern_st_set *s, int file) {
    return (s && file >= 0 && file < s->n_files) ? s->files[file].path : "?";
}

int tern_st_file_count(const tern_st_set *s) { return s ? s->n_files : 0; }

size_t tern_st_copied_bytes(const tern_st_set *s) { return s ? s->copied : 0; }

const char *tern_st_metadata(const tern_st_set *s, const char *key) {
    if (!s || !key) return NULL;
    for (int i = 0; i < s->n_meta; i++)
        if (!strcmp(s->meta[i].key, key)) return s->meta[i].val;
    return NULL;
}
