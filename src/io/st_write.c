/*
 * st_write.c — safetensors writer (see st_write.h).
 */
#include "io/st_write.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tern_status tern_st_write(const char *path, const tern_st_wentry *e, int n, tern_error *err) {
    cJSON *h = cJSON_CreateObject();
    if (!h) return tern_err(err, TERN_ENOMEM, "out of memory");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = tern_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) bytes *= (size_t)e[i].shape[d];
        cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
        cJSON_AddStringToObject(t, "dtype", tern_dtype_name(e[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!js) return tern_err(err, TERN_ENOMEM, "out of memory");
    size_t hl = strlen(js), padded = (hl + 7) & ~(size_t)7;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { free(js); return tern_err(err, TERN_EIO, "cannot create '%s'", tmp); }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(js, 1, hl, f) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(js);
    for (int i = 0; ok && i < n; i++) {
        size_t bytes = tern_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) bytes *= (size_t)e[i].shape[d];
        ok = fwrite(e[i].data, 1, bytes, f) == bytes;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return tern_err(err, TERN_EIO, "cannot write '%s'", path);
    }
    return TERN_OK;
}
