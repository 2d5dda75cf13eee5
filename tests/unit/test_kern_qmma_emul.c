/*
 * test_kern_qmma_emul.c — the arithmetic of src/backend/cuda/qmma.cu emulated on the CPU, so CI
 * (no GPU) covers the bit tricks and the fragment bookkeeping:
 *   - 4-bit codes: ((w >> 4i) & 0x000F000F) | 0x43004300 read as a bf16 pair is (128 + q_i,
 *     128 + q_{i+4}) and one bf16 subtraction of 128 is exact, for every code value;
 *   - 8-bit codes: byte_perm(w, 0x4B000000, 0x7440 + i) read as f32 minus 2^23 is the byte, and
 *     its bf16 rounding is exact;
 *   - the x split: xh + xl within 2^-16 |x|; xh + xm + xl == x exactly (f32 option);
 *   - one whole matmul done the kernel's way: lanes (g, t) decode their words into A fragment
 *     registers, the staged x tile (permuted pairs, swizzled chunks) gives B fragments, the
 *     m16n8k16 products are formed from the fragments exactly as the PTX layout defines them, per
 *     scale group, then acc += s·acc_g + b·Σx_g; compared with Σ (s·q + b)·x in double.
 * The emulation mirrors the kernel's index expressions; change both together.
 */
#include "base/base.h"
#include "ops/tensor.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long g_seed = 12345;

static float as_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t as_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf_f(uint16_t h) { return as_f((uint32_t)h << 16); }
static uint16_t bf_rn(float f) { /* round to nearest even (finite inputs) */
    uint32_t u = as_u(f);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static uint32_t bf2(float lo, float hi) { return (uint32_t)bf_rn(lo) | (uint32_t)bf_rn(hi) << 16; }

/* CUDA __byte_perm: result byte k = byte (s >> 4k) & 7 of the 8 bytes {x, y} */
static uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) r |= (uint32_t)((v >> (8 * ((s >> (4 * k)) & 7))) & 0xff) << (8 * k);
    return r;
}

/* qm_decode: the lane's 8 codes as 4 bf16 pairs (q_i, q_{i+4}); returns 0 on an inexact step */
static int decode(int bits, const uint32_t *wd, uint32_t *r) {
    for (int i = 0; i < 4; i++) {
        if (bits == 4) {
            uint32_t p = ((wd[0] >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
            float lo = bf_f((uint16_t)p) - 128.0f, hi = bf_f((uint16_t)(p >> 16)) - 128.0f; /* __hsub2 */
            if (bf_f(bf_rn(lo)) != lo || bf_f(bf_rn(hi)) != hi) return 0;
            r[i] = bf2(lo, hi);
        } else {
            float f0 = as_f(byte_perm(wd[0], 0x4B000000u, 0x7440u + i)) - 8388608.0f;
            float f1 = as_f(byte_perm(wd[1], 0x4B000000u, 0x7440u + i)) - 8388608.0f;
            if (bf_f(bf_rn(f0)) != f0 || bf_f(bf_rn(f1)) != f1) return 0;
            r[i] = bf2(f0, f1);
        }
    }
    return 1;
}

static void split(int np, float v, float *o) {
    float h = bf_f(bf_rn(v)), r = v - h, m = bf_f(bf_rn(r));
    o[0] = h;
    o[1] = m;
    if (np == 3) o[2] = bf_f(bf_rn(r - m));
}

TEST(qmma_code_tricks) {
    int bad4 = 0, bad8 = 0;
    for (int it = 0; it < 20000; it++) {
        uint32_t wd[2] = {(uint32_t)test_rand_u64(&g_seed), (uint32_t)test_rand_u64(&g_seed)};
        if (it < 16) wd[0] = 0x11111111u * (uint32_t)it; /* every nibble value */
        if (it < 256) wd[0] = wd[1] = 0x01010101u * (uint32_t)it; /* every byte value */
        uint32_t r[4];
        if (!decode(4, wd, r)) bad4++;
        else
            for (int i = 0; i < 4; i++) {
                uint32_t q0 = (wd[0] >> (4 * i)) & 15, q1 = (wd[0] >> (4 * i + 16)) & 15;
                if (bf_f((uint16_t)r[i]) != (float)q0 || bf_f((uint16_t)(r[i] >> 16)) != (float)q1) bad4++;
            }
        if (!decode(8, wd, r)) bad8++;
        else
            for (int i = 0; i < 4; i++) {
                uint32_t q0 = (wd[0] >> (8 * i)) & 255, q1 = (wd[1] >> (8 * i)) & 255;
                if (bf_f((uint16_t)r[i]) != (float)q0 || bf_f((uint16_t)(r[i] >> 16)) != (float)q1) bad8++;
            }
    }
    CHECK(bad4 == 0, "4-bit codes: %d wrong", bad4);
    CHECK(bad8 == 0, "8-bit codes: %d wrong", bad8);
}

TEST(qmma_x_split) {
    int bad2 = 0, bad3 = 0;
    for (int it = 0; it < 200000; it++) {
        float v = test_randf(&g_seed) * ldexpf(1.0f, (int)(test_rand_u64(&g_seed) % 160) - 80);
        if (it < 4) v = it == 0 ? 0.0f : it == 1 ? 1.0f + 0x1p-23f : it == 2 ? -0x1.fffffep10f : 3.0e-30f;
        float o[3];
        split(2, v, o);
        if (fabs((double)v - ((double)o[0] + o[1])) > fabs((double)v) * 0x1p-16) bad2++;
        split(3, v, o);
        if ((double)o[0] + o[1] + o[2] != (double)v) bad3++;
    }
    CHECK(bad2 == 0, "xh + xl off by > 2^-16 |x| in %d cases", bad2);
    CHECK(bad3 == 0, "xh + xm + xl != x in %d cases", bad3);
}

/* ---- the kernel's matmul, lane by lane (one 16-row warp tile at a time, K tiles of 128) ---- */

static int swz(int c, int col) { return c ^ ((col & 1) << 2); }

/* y[n][out] from packed rows (bits 4/8), f32 scales/biases [out][in/gs]; 0 if a decode failed */
static int emulate(int bits, int gs, int np, int out, int in, int n, const uint8_t *w, const float *s, const float *b,
                   const float *x, double *y) {
    const int BN = ((n + 7) / 8) * 8, WW = bits == 4 ? 1 : 2, TB = 128 * bits / 8, ng = in / gs, cpg = gs / 8;
    const size_t rb = (size_t)in * bits / 8;
    uint32_t *xs = calloc((size_t)np * BN * 16 * 4, 4);
    double *sx = calloc((size_t)BN * 4, sizeof *sx);
    int ok = 1;
    for (int row0 = 0; row0 < out; row0 += 16) {
        double acc[16][64] = {{0}}, accg[16][64] = {{0}};
        for (int kt = 0; kt < in / 128; kt++) {
            /* stage: chunk c (8 inputs) of column col -> NP uint4 of pairs (v_i, v_{i+4}); Σx per group */
            for (int col = 0; col < BN; col++) {
                for (int c = 0; c < 16; c++) {
                    float v[8] = {0};
                    if (col < n) memcpy(v, x + (size_t)col * in + (size_t)kt * 128 + c * 8, sizeof v);
                    for (int i = 0; i < 4; i++) {
                        float a[3], bb[3];
                        split(np, v[i], a);
                        split(np, v[i + 4], bb);
                        for (int p = 0; p < np; p++) xs[(((size_t)p * BN + col) * 16 + swz(c, col)) * 4 + i] = bf2(a[p], bb[p]);
                    }
                }
                for (int gi = 0; gi < 128 / gs; gi++) {
                    float t = 0.0f; /* f32, as the kernel (order differs: the bound below covers it) */
                    for (int k = 0; k < gs; k++) t += col < n ? x[(size_t)col * in + (size_t)kt * 128 + gi * gs + k] : 0.0f;
                    sx[col * 4 + gi] = t;
                }
            }
            for (int j = 0; j < 4; j++) {
                /* A fragments of the two steps from every lane's decoded words */
                double A[2][16][16], B[2][16][64];
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, t = lane & 3;
                    uint32_t ra[4], rbv[4], wd0[2] = {0, 0}, wd1[2] = {0, 0};
                    const int r0 = row0 + g < out ? row0 + g : out - 1, r1 = row0 + g + 8 < out ? row0 + g + 8 : out - 1;
                    memcpy(wd0, w + (size_t)r0 * rb + (size_t)t * WW * 4 + (size_t)kt * TB + (size_t)j * WW * 16, WW * 4);
                    memcpy(wd1, w + (size_t)r1 * rb + (size_t)t * WW * 4 + (size_t)kt * TB + (size_t)j * WW * 16, WW * 4);
                    if (!decode(bits, wd0, ra) || !decode(bits, wd1, rbv)) ok = 0;
                    for (int h = 0; h < 2; h++) { /* a0 = (g, 2t..), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..) */
                        const uint32_t a[4] = {ra[2 * h], rbv[2 * h], ra[2 * h + 1], rbv[2 * h + 1]};
                        for (int e = 0; e < 8; e++) {
                            const int rowm = g + ((e >> 1) & 1) * 8, kk = 2 * t + (e & 1) + (e >= 4 ? 8 : 0);
                            A[h][rowm][kk] = bf_f((uint16_t)(a[e >> 1] >> (16 * (e & 1))));
                        }
                    }
                }
                /* B fragments: lane (g, t), column tile nt: b0 = (k 2t, 2t+1; col g), b1 = (k 2t+8, 2t+9) */
                memset(B, 0, sizeof B);
                for (int p = 0; p < np; p++)
                    for (int nt = 0; nt < BN / 8; nt++)
                        for (int lane = 0; lane < 32; lane++) {
                            const int g = lane >> 2, t = lane & 3, col = nt * 8 + g;
                            const uint32_t *xv = xs + (((size_t)p * BN + col) * 16 + swz(4 * j + t, col)) * 4;
                            for (int h = 0; h < 2; h++)
                                for (int e = 0; e < 4; e++) {
                                    const int kk = 2 * t + (e & 1) + (e >= 2 ? 8 : 0);
                                    B[h][kk][col] += bf_f((uint16_t)(xv[2 * h + (e >> 1)] >> (16 * (e & 1))));
                                }
                        }
                for (int h = 0; h < 2; h++)
                    for (int m = 0; m < 16; m++)
                        for (int c = 0; c < BN; c++)
                            for (int k = 0; k < 16; k++) accg[m][c] += A[h][m][k] * B[h][k][c];
                if (((j + 1) * 32) % gs == 0) {
                    const int gi = j * 32 / gs;
                    for (int m = 0; m < 16 && row0 + m < out; m++)
                        for (int c = 0; c < BN; c++) {
                            const size_t k = (size_t)(row0 + m) * ng + (size_t)kt * (128 / gs) + gi;
                            acc[m][c] += s[k] * accg[m][c] + b[k] * sx[c * 4 + gi];
                            accg[m][c] = 0.0;
                        }
                }
            }
        }
        for (int m = 0; m < 16 && row0 + m < out; m++)
            for (int c = 0; c < n; c++) y[(size_t)c * out + row0 + m] = acc[m][c];
    }
    (void)cpg;
    free(xs);
    free(sx);
    return ok;
}

TEST(qmma_fragment_matmul) {
    static const struct { int bits, gs, np, out, in, n; } C[] = {
        {4, 32, 2, 40, 256, 3}, {4, 64, 3, 20, 384, 9}, {4, 128, 2, 17, 256, 1}, {8, 32, 3, 24, 256, 8},
        {8, 64, 2, 33, 128, 17}, {8, 128, 3, 16, 512, 2},
    };
    for (size_t ci = 0; ci < TERN_ARRAY_LEN(C); ci++) {
        const int bits = C[ci].bits, gs = C[ci].gs, out = C[ci].out, in = C[ci].in, n = C[ci].n;
        const size_t rb = (size_t)in * bits / 8, ngr = (size_t)out * (in / gs);
        uint8_t *w = malloc(rb * out);
        float *s = malloc(ngr * 4), *b = malloc(ngr * 4), *x = malloc((size_t)n * in * 4);
        double *y = malloc((size_t)n * out * 8), *ref = malloc((size_t)n * out * 8);
        for (size_t i = 0; i < rb * out; i++) w[i] = (uint8_t)test_rand_u64(&g_seed);
        for (size_t i = 0; i < ngr; i++) {
            s[i] = 0.01f * (1.0f + 0.5f * test_randf(&g_seed));
            b[i] = -0.05f * (1.0f + 0.2f * test_randf(&g_seed));
        }
        for (size_t i = 0; i < (size_t)n * in; i++) x[i] = test_randf(&g_seed) * (i % 7 == 0 ? 100.0f : 1.0f);
        for (int c = 0; c < n; c++)
            for (int r = 0; r < out; r++) {
                double t = 0.0;
                for (int k = 0; k < in; k++) {
                    const size_t bit = (size_t)k * bits;
                    const unsigned q = (w[(size_t)r * rb + bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
                    const size_t gi = (size_t)r * (in / gs) + k / gs;
                    t += ((double)s[gi] * q + b[gi]) * x[(size_t)c * in + k];
                }
                ref[(size_t)c * out + r] = t;
            }
        const int ok = emulate(bits, gs, C[ci].np, out, in, n, w, s, b, x, y);
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)n * out; i++) {
            num += (y[i] - ref[i]) * (y[i] - ref[i]);
            den += ref[i] * ref[i];
        }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        CHECK(ok, "q%d/g%d decode inexact", bits, gs);
        /* 2 parts: x carried to 2^-16; 3 parts: exact x, only the f32 Σx differs */
        CHECK(rel <= (C[ci].np == 2 ? 2e-5 : 1e-6), "q%d/g%d np%d %dx%d n=%d rel %.3e", bits, gs, C[ci].np, out, in, n,
              rel);
        free(w); free(s); free(b); free(x); free(y); free(ref);
    }
}

int main(void) {
    RUN(qmma_code_tricks);
    RUN(qmma_x_split);
    RUN(qmma_fragment_matmul);
    return test_done();
}
