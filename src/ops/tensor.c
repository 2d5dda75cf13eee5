/*
 * tensor.c — dtype table, scalar conversions and the reference row decoder
 * (the spec every fast dequantizing kernel is tested against).
 */
#include "tensor.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; } k_dtypes[TERN_DT_COUNT] = {
    [TERN_DT_F32] = {"F32", 4},   [TERN_DT_F16] = {"F16", 2},   [TERN_DT_BF16] = {"BF16", 2},
    [TERN_DT_F64] = {"F64", 8},   [TERN_DT_F8_E4M3] = {"F8_E4M3", 1},
    [TERN_DT_I8] = {"I8", 1},     [TERN_DT_U8] = {"U8", 1},     [TERN_DT_I16] = {"I16", 2},
    [TERN_DT_I32] = {"I32", 4},   [TERN_DT_U32] = {"U32", 4},   [TERN_DT_I64] = {"I64", 8},
    [TERN_DT_BOOL] = {"BOOL", 1}, [TERN_DT_Q] = {"Q", 0},
};

const char *tern_dtype_name(tern_dtype t) {
    return (t >= 0 && t < TERN_DT_COUNT) ? k_dtypes[t].name : "?";
}

size_t tern_dtype_size(tern_dtype t) { return (t >= 0 && t < TERN_DT_COUNT) ? k_dtypes[t].size : 0; }

int64_t tern_tensor_nelem(const tern_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t tern_tensor_row_bytes(const tern_tensor *t) {
    int64_t in = t->ndim ? t->shape[t->ndim - 1] : 1;
    if (t->dtype == TERN_DT_Q) return (size_t)(in * t->bits / 8);
    return (size_t)in * tern_dtype_size(t->dtype);
}

float tern_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31) v.u = sign | 0x7f800000u | (man << 13);
    else v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t tern_f32_to_f16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t sign = (v.u >> 16) & 0x8000u;
    uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) { /* subnormal half */
        float x = fabsf(f) * 16777216.0f; /* 2^24 */
        uint32_t m = (uint32_t)nearbyintf(x);
        return (uint16_t)(sign | m);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float tern_f8e4m3_to_f32(uint8_t v) {
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float f;
    if (exp == 15 && man == 7) return NAN;
    if (exp == 0) f = ldexpf((float)man, -9);
    else f = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -f : f;
}

float tern_load_f32(const void *p, tern_dtype t, size_t i) {
    /* memcpy: safetensors data may sit at unaligned offsets */
    const uint8_t *b = (const uint8_t *)p;
    switch (t) {
    case TERN_DT_F32: { float v; memcpy(&v, b + 4 * i, 4); return v; }
    case TERN_DT_F16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return tern_f16_to_f32(v); }
    case TERN_DT_BF16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return tern_bf16_to_f32(v); }
    case TERN_DT_F64: { double v; memcpy(&v, b + 8 * i, 8); return (float)v; }
    case TERN_DT_F8_E4M3: return tern_f8e4m3_to_f32(b[i]);
    default: return 0.0f;
    }
}

int64_t tern_tensor_fp8_scale_cols(const tern_tensor *t) {
    if (!tern_tensor_is_fp8_block(t) || t->group_size <= 0) return 0;
    int64_t in = t->shape[t->ndim - 1];
    return (in + t->group_size - 1) / t->group_size;
}

size_t tern_tensor_fp8_scale_bytes(const tern_tensor *t) {
    if (!tern_tensor_is_fp8_block(t) || t->blk_rows <= 0) return 0;
    int64_t out = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    return (size_t)((out + t->blk_rows - 1) / t->blk_rows) * (size_t)tern_tensor_fp8_scale_cols(t) * 4;
}

void tern_tensor_row_f32(const tern_tensor *t, int64_t row, float *dst) {
    int64_t in = t->shape[t->ndim - 1];
    int64_t out = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    int64_t mat = row / out, r = row % out;
    if (t->mat_map) mat = t->mat_map[mat];
    size_t rb = tern_tensor_row_bytes(t);
    size_t mstride = t->mat_stride ? t->mat_stride : (size_t)out * rb;
    const uint8_t *base = (const uint8_t *)t->data + (size_t)mat * mstride + (size_t)r * rb;
    if (tern_tensor_is_fp8_block(t)) {
        /* e4m3 value times the f32 scale of its (row block, column block): one rounding */
        size_t ms = t->mat_stride_s ? t->mat_stride_s : tern_tensor_fp8_scale_bytes(t);
        const uint8_t *sc = (const uint8_t *)t->scales + (size_t)mat * ms +
                            (size_t)(r / t->blk_rows) * (size_t)tern_tensor_fp8_scale_cols(t) * 4;
        for (int64_t j = 0; j < in; j++)
            dst[j] = tern_f8e4m3_to_f32(base[j]) * tern_load_f32(sc, TERN_DT_F32, (size_t)(j / t->group_size));
        return;
    }
    if (t->dtype != TERN_DT_Q) {
        for (int64_t j = 0; j < in; j++) dst[j] = tern_load_f32(base, t->dtype, (size_t)j);
        return;
    }
    int64_t ng = in / t->group_size;
    size_t ss = tern_dtype_size(t->sdtype);
    size_t mstride_s = t->mat_stride_s ? t->mat_stride_s : (size_t)(out * ng) * ss;
    const uint8_t *sc = (const uint8_t *)t->scales + (size_t)mat * mstride_s + (size_t)(r * ng) * ss;
    const uint8_t *bi = (const uint8_t *)t->biases + (size_t)mat * mstride_s + (size_t)(r * ng) * ss;
    uint32_t mask = (1u << t->bits) - 1u;
    for (int64_t j = 0; j < in; j++) {
        /* element j occupies bits [j*bits, (j+1)*bits) of the row's little-endian bit stream */
        uint64_t bit = (uint64_t)j * (uint64_t)t->bits;
        uint64_t byte = bit >> 3;
        unsigned shift = (unsigned)(bit & 7);
        uint32_t w = base[byte];
        if (shift + (unsigned)t->bits > 8) w |= (uint32_t)base[byte + 1] << 8;
        uint32_t q = (w >> shift) & mask;
        int64_t g = j / t->group_size;
        float s = tern_load_f32(sc, t->sdtype, (size_t)g), b = tern_load_f32(bi, t->sdtype, (size_t)g);
        dst[j] = s * (float)q + b;
    }
}
