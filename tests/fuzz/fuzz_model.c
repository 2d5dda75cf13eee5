/*
 * fuzz_model.c — libFuzzer target for loading a whole model directory and running it: config.json and a
 * safetensors file → tern_model_load on the CPU backend (architecture dispatch, stored-name mapping, MLX
 * quantization and FP8 block scales, expert stacks, the presence / shape / dtype checks every architecture makes
 * before compute), then, when the model loads, one forward of three tokens through a small paged KV cache.
 *
 * Input: config.json's bytes, a NUL, the safetensors header JSON; optionally a second NUL and up to 8 bytes, a
 * signed little-endian delta to the data section's length. The harness writes the file itself: 8-byte header
 * length, the header as given, then a data section as long as the largest end offset the header declares (plus
 * the delta, clamped to [0, 8 MiB]: lying and truncated files), each declared range filled with small finite
 * values of its dtype. So mutations land on the config and the header, not on megabytes of tensor bytes.
 * Seeds: tests/fuzz/corpus/fuzz_model, made from the parity fixtures by scripts/fuzz_model_seeds.sh.
 * Every rejection must carry a message; nothing may crash, leak or read outside a buffer.
 */
#include "model/model.h"
#include "runtime/kv.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DATA_CAP ((size_t)8 << 20)

static char g_dir[256];
static tern_backend *g_be;

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static int write_file(const char *name, const void *p, size_t n, const void *q, size_t m) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p, 1, n, f) == n && (!m || fwrite(q, 1, m, f) == m);
    return fclose(f) == 0 && ok;
}

/* small finite values of the dtype over [a, b) of the data section (clipped to its length n) */
static void fill(uint8_t *d, size_t n, const char *dtype, double a, double b, uint64_t *s) {
    if (!(a >= 0 && b >= a) || a >= (double)n) return;
    size_t lo = (size_t)a, hi = b > (double)n ? n : (size_t)b;
    if (!strcmp(dtype, "F32")) {
        for (size_t i = lo; i + 4 <= hi; i += 4) {
            float v = ((float)(lcg(s) & 0xffff) / 65536.0f - 0.5f) * 0.5f;
            memcpy(d + i, &v, 4);
        }
    } else if (!strcmp(dtype, "BF16") || !strcmp(dtype, "F16")) {
        const int bf = dtype[0] == 'B';
        for (size_t i = lo; i + 2 <= hi; i += 2) {
            float v = ((float)(lcg(s) & 0xffff) / 65536.0f - 0.5f) * 0.5f;
            uint32_t u;
            memcpy(&u, &v, 4);
            /* f16: sign, a small exponent (2^-4 .. 2^-1), random mantissa */
            uint16_t h = bf ? (uint16_t)(u >> 16) : (uint16_t)((u >> 16 & 0x8000) | (11 + (lcg(s) & 3)) << 10 | (lcg(s) & 0x3ff));
            memcpy(d + i, &h, 2);
        }
    } else if (!strcmp(dtype, "F8_E4M3")) {
        for (size_t i = lo; i < hi; i++) d[i] = (uint8_t)(lcg(s) & 0xb7); /* no NaN (S.1111.111) */
    } else {
        for (size_t i = lo; i < hi; i++) d[i] = (uint8_t)lcg(s);
    }
}

static void run_model(void) {
    tern_error err = {0};
    tern_model *m = NULL;
    tern_kv *kv = NULL;
    tern_model_opts mo = {.max_batch = 4};
    if (tern_model_load(&m, g_dir, g_be, &mo, &err) != TERN_OK) {
        if (!err.msg[0]) __builtin_trap(); /* every failure names its cause */
        return;
    }
    const tern_model_config *c = tern_model_cfg(m);
    const int V = c->n_vocab;
    if (V > 0 && V <= (1 << 20)) {
        tern_kv_opts ko = {.n_slots = 1, .max_ctx = 8, .block_size = 4, .chunk = 4};
        err.msg[0] = 0;
        if (tern_kv_open(&kv, g_be, c, &ko, &err) == TERN_OK && tern_kv_reserve(kv, 0, 3, &err) == TERN_OK) {
            int32_t tok[3] = {1 % V, 2 % V, (V - 1) % V}, pos[3] = {0, 1, 2}, slot[3] = {0, 0, 0};
            float *lg = malloc(sizeof(float) * 3 * (size_t)V);
            tern_batch b = {.n = 3, .tokens = tok, .pos = pos, .slot = slot};
            if (lg && tern_model_forward(m, &b, kv, lg, &err) != TERN_OK && !err.msg[0]) __builtin_trap();
            free(lg);
        } else if (!err.msg[0]) {
            __builtin_trap();
        }
    }
    tern_kv_close(kv);
    tern_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/tern_fuzz_model_XXXXXX", t && *t ? t : "/tmp");
        tern_backend_opts bo = {.n_threads = 1};
        tern_error e;
        if (!mkdtemp(g_dir) || tern_backend_cpu_open(&g_be, &bo, &e) != TERN_OK) __builtin_trap();
    }
    const uint8_t *nul = memchr(data, 0, size);
    const size_t clen = nul ? (size_t)(nul - data) : size;
    const uint8_t *hdr = nul ? nul + 1 : data + size;
    const uint8_t *nul2 = memchr(hdr, 0, (size_t)(data + size - hdr));
    const size_t hlen = (size_t)((nul2 ? nul2 : data + size) - hdr);
    int64_t delta = 0;
    if (nul2) {
        uint64_t u = 0;
        size_t k = (size_t)(data + size - nul2 - 1);
        memcpy(&u, nul2 + 1, k > 8 ? 8 : k);
        delta = (int64_t)u;
    }
    /* the data section: the header's largest end offset (+ delta), each range filled by dtype */
    char *htxt = malloc(hlen + 1);
    if (!htxt) return 0;
    memcpy(htxt, hdr, hlen);
    htxt[hlen] = 0;
    cJSON *j = cJSON_Parse(htxt);
    double end = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        const cJSON *b = cJSON_GetArrayItem(off, 1);
        if (cJSON_IsNumber(b) && b->valuedouble > end) end = b->valuedouble;
    }
    if (!(end <= (double)DATA_CAP)) end = (double)DATA_CAP;
    int64_t n = (int64_t)end + (delta % ((int64_t)DATA_CAP + 1));
    n = n < 0 ? 0 : n > (int64_t)DATA_CAP ? (int64_t)DATA_CAP : n;
    uint8_t *d = calloc((size_t)n + 8, 1);
    uint64_t seed = 0x7465726eull;
    cJSON_ArrayForEach(e, j) {
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *a = cJSON_GetArrayItem(off, 0), *b = cJSON_GetArrayItem(off, 1);
        if (d && cJSON_IsString(dt) && cJSON_IsNumber(a) && cJSON_IsNumber(b))
            fill(d, (size_t)n, dt->valuestring, a->valuedouble, b->valuedouble, &seed);
    }
    cJSON_Delete(j);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    char st[300];
    snprintf(st, sizeof st, "%s/model.safetensors", g_dir);
    if (d && write_file("config.json", data, clen, NULL, 0) && write_file("model.safetensors", len8, 8, htxt, hlen)) {
        FILE *f = fopen(st, "ab");
        int ok = f && fwrite(d, 1, (size_t)n, f) == (size_t)n;
        if (f) ok &= fclose(f) == 0;
        if (ok) run_model();
    }
    free(d);
    free(htxt);
    return 0;
}
