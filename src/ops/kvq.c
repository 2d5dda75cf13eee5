/*
 * kvq.c — the reference codec of the compressed KV page formats (layout in kvq.h).
 *
 * Plain scalar code, deliberately: kv_write of every backend may call tern_kvq_encode
 * directly (one record per token and head, not a hot loop), and attention kernels are
 * tested against tern_kvq_decode. Rounding choices that the bounds in the tests rely on:
 *   - AFFINE: the f16 scale is rounded *up* so (max-min)/scale never exceeds 2^b-1; the min
 *     is rounded to nearest. Codes are computed from the rounded values, so the error per
 *     element is at most scale/2 + |min - f16(min)|.
 *   - TURBO: the norm and the rotation use f32 with double accumulation of the norm; codes
 *     pick the nearest centroid (ties to the lower one).
 * The Lloyd–Max tables were computed by Lloyd iteration on the N(0,1) density to
 * convergence (centroid = (φ(a)−φ(b))/(Φ(b)−Φ(a)), thresholds at midpoints); their MSE per
 * coordinate is 0.3634, 0.1175, 0.03455, 0.009501 for 1..4 bits. test_kvq_format re-derives
 * them.
 */
#include "ops/kvq.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const float cb1[2] = {-0.7978846f, 0.7978846f};
static const float cb2[4] = {-1.5104176f, -0.4527800f, 0.4527800f, 1.5104176f};
static const float cb3[8] = {-2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f,
                             0.2450942f, 0.7560053f, 1.3439093f, 2.1519457f};
static const float cb4[16] = {-2.7325896f, -2.0690172f, -1.6180464f, -1.2562312f,
                              -0.9423405f, -0.6567591f, -0.3880483f, -0.1283950f,
                              0.1283950f, 0.3880483f, 0.6567591f, 0.9423405f,
                              1.2562312f, 1.6180464f, 2.0690172f, 2.7325896f};

const float *tern_kvq_codebook(int bits) {
    switch (bits) {
    case 1: return cb1;
    case 2: return cb2;
    case 3: return cb3;
    case 4: return cb4;
    default: return NULL;
    }
}

int tern_kvq_rot_dim(int head_dim) {
    int p = 8;
    while (p < head_dim) p *= 2;
    return p;
}

size_t tern_kvq_vec_bytes(const tern_kv_fmt *f, int d) {
    if (d <= 0) return 0;
    switch (f->kind) {
    case TERN_KV_F32: return (size_t)d * 4;
    case TERN_KV_F16: case TERN_KV_BF16: return (size_t)d * 2;
    case TERN_KV_AFFINE:
        if ((f->bits != 4 && f->bits != 8) || f->group < 2 || d % f->group || (d * f->bits) % 8) return 0;
        return (size_t)(d / f->group) * 4 + (size_t)d * (size_t)f->bits / 8;
    case TERN_KV_TURBO: {
        if (f->bits < 2 || f->bits > 4 || d > TERN_KVQ_MAX_ROT) return 0;
        int P = tern_kvq_rot_dim(d);
        return 4 + (size_t)P * (size_t)f->bits / 8;
    }
    default: return 0;
    }
}

tern_status tern_kvq_check(const tern_kv_fmt *f, int d, const char *what, tern_error *err) {
    if (tern_kvq_vec_bytes(f, d)) return TERN_OK;
    switch (f->kind) {
    case TERN_KV_AFFINE:
        return tern_err(err, TERN_EUNSUPPORTED, "kv %s: affine %d-bit with group %d does not fit head_dim %d (bits 4|8, group dividing head_dim)",
                        what, f->bits, f->group, d);
    case TERN_KV_TURBO:
        return tern_err(err, TERN_EUNSUPPORTED, "kv %s: turbo %d-bit with head_dim %d is not supported (bits 2..4, head_dim <= %d)",
                        what, f->bits, d, TERN_KVQ_MAX_ROT);
    default:
        return tern_err(err, TERN_EINVAL, "kv %s: unknown cache kind %d", what, f->kind);
    }
}

double tern_kvq_bits_per_elem(const tern_kv_fmt *f, int d) {
    return d > 0 ? 8.0 * (double)tern_kvq_vec_bytes(f, d) / (double)d : 0.0;
}

const char *tern_kvq_name(const tern_kv_fmt *f, char *buf, size_t n) {
    switch (f->kind) {
    case TERN_KV_F32: snprintf(buf, n, "f32"); break;
    case TERN_KV_F16: snprintf(buf, n, "f16"); break;
    case TERN_KV_BF16: snprintf(buf, n, "bf16"); break;
    case TERN_KV_AFFINE: snprintf(buf, n, "q%dg%d", f->bits, f->group); break;
    case TERN_KV_TURBO: snprintf(buf, n, "turbo%d", f->bits); break;
    default: snprintf(buf, n, "kind%d", f->kind); break;
    }
    return buf;
}

/* ---- rotation ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tern_kvq_signs(uint64_t seed, float *signs, int n) {
    uint64_t s = seed, bits = 0;
    for (int i = 0; i < n; i++) {
        if (i % 64 == 0) bits = splitmix64(&s);
        signs[i] = (bits >> (i % 64)) & 1 ? -1.0f : 1.0f;
    }
}

void tern_kvq_fwht(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void tern_kvq_rotate(const float *signs, int P, const float *x, int d, float *y) {
    for (int i = 0; i < P; i++) y[i] = i < d ? x[i] * signs[i] : 0.0f;
    tern_kvq_fwht(y, P);
    float inv = 1.0f / sqrtf((float)P);
    for (int i = 0; i < P; i++) y[i] *= inv;
}

void tern_kvq_unrotate(const float *signs, int P, float *y, float *x, int d) {
    tern_kvq_fwht(y, P);
    float inv = 1.0f / sqrtf((float)P);
    for (int i = 0; i < d; i++) x[i] = y[i] * inv * signs[i];
}

/* ---- bit packing ---- */

static void put_code(uint8_t *p, int i, int b, unsigned v) {
    size_t bit = (size_t)i * (size_t)b;
    for (int k = 0; k < b; k++, bit++)
        if ((v >> k) & 1u) p[bit >> 3] |= (uint8_t)(1u << (bit & 7));
}

static unsigned get_code(const uint8_t *p, int i, int b) {
    size_t bit = (size_t)i * (size_t)b;
    unsigned w = p[bit >> 3];
    if ((bit & 7) + (size_t)b > 8) w |= (unsigned)p[(bit >> 3) + 1] << 8;
    return (w >> (bit & 7)) & ((1u << b) - 1u);
}

/* ---- codec ---- */

static float clamp_f16(float x) {
    if (!(x == x)) return 0.0f;                /* NaN -> 0: never poison a group's scale */
    return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x;
}

static void encode_affine(const tern_kv_fmt *f, int d, const float *x, uint8_t *rec) {
    int g = f->group, ng = d / g, b = f->bits, qmax = (1 << b) - 1;
    uint8_t *codes = rec + (size_t)ng * 4;
    memset(codes, 0, (size_t)d * (size_t)b / 8);
    for (int gi = 0; gi < ng; gi++) {
        const float *xg = x + (size_t)gi * g;
        float mn = clamp_f16(xg[0]), mx = mn;
        for (int i = 1; i < g; i++) {
            float v = clamp_f16(xg[i]);
            if (v < mn) mn = v;
            if (v > mx) mx = v;
        }
        float sc = (mx - mn) / (float)qmax;
        uint16_t hs = tern_f32_to_f16(sc);
        if (tern_f16_to_f32(hs) < sc) hs++;    /* round the (non-negative) scale up */
        uint16_t hm = tern_f32_to_f16(mn);
        float scr = tern_f16_to_f32(hs), mnr = tern_f16_to_f32(hm);
        memcpy(rec + (size_t)gi * 2, &hs, 2);
        memcpy(rec + (size_t)ng * 2 + (size_t)gi * 2, &hm, 2);
        for (int i = 0; i < g; i++) {
            long q = scr > 0.0f ? lrintf((clamp_f16(xg[i]) - mnr) / scr) : 0;
            if (q < 0) q = 0;
            if (q > qmax) q = qmax;
            put_code(codes, gi * g + i, b, (unsigned)q);
        }
    }
}

static void decode_affine(const tern_kv_fmt *f, int d, const uint8_t *rec, float *x) {
    int g = f->group, ng = d / g, b = f->bits;
    const uint8_t *codes = rec + (size_t)ng * 4;
    for (int gi = 0; gi < ng; gi++) {
        uint16_t hs, hm;
        memcpy(&hs, rec + (size_t)gi * 2, 2);
        memcpy(&hm, rec + (size_t)ng * 2 + (size_t)gi * 2, 2);
        float sc = tern_f16_to_f32(hs), mn = tern_f16_to_f32(hm);
        for (int i = 0; i < g; i++) x[gi * g + i] = sc * (float)get_code(codes, gi * g + i, b) + mn;
    }
}

static void encode_turbo(const tern_kv_fmt *f, int d, const float *signs, const float *x, uint8_t *rec, float *y) {
    int P = tern_kvq_rot_dim(d), b = f->bits, n = 1 << b;
    const float *cb = tern_kvq_codebook(b);
    uint8_t *codes = rec + 4;
    memset(codes, 0, (size_t)P * (size_t)b / 8);
    tern_kvq_rotate(signs, P, x, d, y);
    double ss = 0.0;
    for (int i = 0; i < P; i++) ss += (double)y[i] * y[i];
    float nrm = (float)sqrt(ss), scale = 0.0f;
    if (nrm > 0.0f) {
        float u_scale = sqrtf((float)P) / nrm;
        double cc = 0.0;
        for (int i = 0; i < P; i++) {
            float u = y[i] * u_scale;
            int q = 0;
            while (q + 1 < n && u > 0.5f * (cb[q] + cb[q + 1])) q++;
            put_code(codes, i, b, (unsigned)q);
            cc += (double)cb[q] * cb[q];
        }
        scale = (float)(ss > 0.0 ? sqrt(ss / cc) : 0.0); /* ‖ŷ‖ = ‖y‖ */
    } else if (!(nrm == nrm) || nrm > 3.0e38f) {
        scale = NAN;                           /* non-finite input stays visible */
    }
    memcpy(rec, &scale, 4);
}

void tern_kvq_decode_rotated(const tern_kv_fmt *f, int P, const void *rec, float *y) {
    const uint8_t *r = rec;
    const float *cb = tern_kvq_codebook(f->bits);
    float scale;
    memcpy(&scale, r, 4);
    for (int i = 0; i < P; i++) y[i] = scale * cb[get_code(r + 4, i, f->bits)];
}

void tern_kvq_encode(const tern_kv_fmt *f, int d, const float *signs, const float *x, void *rec, float *scratch) {
    uint8_t *r = rec;
    switch (f->kind) {
    case TERN_KV_F32: memcpy(r, x, (size_t)d * 4); break;
    case TERN_KV_F16:
        for (int i = 0; i < d; i++) { uint16_t h = tern_f32_to_f16(x[i]); memcpy(r + 2 * (size_t)i, &h, 2); }
        break;
    case TERN_KV_BF16:
        for (int i = 0; i < d; i++) { uint16_t h = tern_f32_to_bf16(x[i]); memcpy(r + 2 * (size_t)i, &h, 2); }
        break;
    case TERN_KV_AFFINE: encode_affine(f, d, x, r); break;
    case TERN_KV_TURBO: encode_turbo(f, d, signs, x, r, scratch); break;
    default: break;
    }
}

void tern_kvq_decode(const tern_kv_fmt *f, int d, const float *signs, const void *rec, float *x, float *scratch) {
    const uint8_t *r = rec;
    uint16_t h;
    switch (f->kind) {
    case TERN_KV_F32: memcpy(x, r, (size_t)d * 4); break;
    case TERN_KV_F16:
        for (int i = 0; i < d; i++) { memcpy(&h, r + 2 * (size_t)i, 2); x[i] = tern_f16_to_f32(h); }
        break;
    case TERN_KV_BF16:
        for (int i = 0; i < d; i++) { memcpy(&h, r + 2 * (size_t)i, 2); x[i] = tern_bf16_to_f32(h); }
        break;
    case TERN_KV_AFFINE: decode_affine(f, d, r, x); break;
    case TERN_KV_TURBO: {
        int P = tern_kvq_rot_dim(d);
        tern_kvq_decode_rotated(f, P, r, scratch);
        tern_kvq_unrotate(signs, P, scratch, x, d);
        break;
    }
    default:
        for (int i = 0; i < d; i++) x[i] = NAN;
        break;
    }
}
