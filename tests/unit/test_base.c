/* test_base.c — error helpers, dtype conversions, reference row decoder. */
#include "base/base.h"
#include "ops/tensor.h"
#include "test.h"

TEST(err_formats_and_returns_code) {
    tern_error e = {0};
    tern_status s = tern_err(&e, TERN_EFORMAT, "%s: field '%s'", "config.json", "hidden_size");
    CHECK(s == TERN_EFORMAT, "code %d", s);
    CHECK(!strcmp(e.msg, "config.json: field 'hidden_size'"), "msg %s", e.msg);
    tern_err_wrap(&e, TERN_EFORMAT, "loading %s", "m");
    CHECK(!strcmp(e.msg, "loading m: config.json: field 'hidden_size'"), "msg %s", e.msg);
    CHECK(tern_err(NULL, TERN_EIO, "x") == TERN_EIO, "NULL err");
    CHECK(tern_status_exit_code(TERN_EFORMAT) == 2 && tern_status_exit_code(TERN_ENOMEM) == 1, "exit codes");
}

TEST(half_conversions_roundtrip) {
    unsigned long long s = 1;
    for (int i = 0; i < 100000; i++) {
        uint16_t h = (uint16_t)test_rand_u64(&s);
        if (((h >> 10) & 0x1f) == 0x1f) continue; /* inf/nan */
        CHECK(tern_f32_to_f16(tern_f16_to_f32(h)) == h, "f16 %04x", h);
        uint16_t b = (uint16_t)test_rand_u64(&s);
        if (((b >> 7) & 0xff) == 0xff) continue;
        CHECK(tern_f32_to_bf16(tern_bf16_to_f32(b)) == b, "bf16 %04x", b);
    }
    CHECK(tern_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 ties to even"); /* 1 + 2^-8 -> 1.0 */
    CHECK(tern_f8e4m3_to_f32(0x38) == 1.0f, "e4m3 1.0");
    CHECK(tern_f8e4m3_to_f32(0x7e) == 448.0f, "e4m3 max");
}

/* Pack codes q[j] (bits each) as MLX does: little-endian bit stream per row. */
static void pack_row(const unsigned *q, int n, int bits, uint8_t *out) {
    memset(out, 0, (size_t)n * bits / 8);
    for (int j = 0; j < n; j++)
        for (int b = 0; b < bits; b++)
            if (q[j] >> b & 1) out[(j * bits + b) / 8] |= (uint8_t)(1u << ((j * bits + b) % 8));
}

TEST(mlx_affine_row_decode_all_bits) {
    int bitsv[] = {2, 3, 4, 5, 6, 8};
    unsigned long long s = 7;
    for (size_t bi = 0; bi < TERN_ARRAY_LEN(bitsv); bi++) {
        int bits = bitsv[bi], K = 128, gs = 32, rows = 3;
        unsigned q[3 * 128];
        uint8_t packed[3 * 128];
        float sc[3 * 4], bs[3 * 4], out[128];
        for (int i = 0; i < rows * K; i++) q[i] = (unsigned)(test_rand_u64(&s) % (1u << bits));
        for (int r = 0; r < rows; r++) pack_row(q + r * K, K, bits, packed + r * K * bits / 8);
        for (int i = 0; i < rows * 4; i++) { sc[i] = test_randf(&s); bs[i] = test_randf(&s); }
        tern_tensor t = {.dtype = TERN_DT_Q, .ndim = 2, .shape = {rows, K}, .data = packed, .bits = bits,
                         .group_size = gs, .sdtype = TERN_DT_F32, .scales = sc, .biases = bs};
        for (int r = 0; r < rows; r++) {
            tern_tensor_row_f32(&t, r, out);
            for (int j = 0; j < K; j++) {
                float want = sc[r * 4 + j / gs] * (float)q[r * K + j] + bs[r * 4 + j / gs];
                CHECK(out[j] == want, "bits %d r %d j %d: %g vs %g", bits, r, j, out[j], want);
            }
        }
    }
}

int main(void) {
    RUN(err_formats_and_returns_code);
    RUN(half_conversions_roundtrip);
    RUN(mlx_affine_row_decode_all_bits);
    return test_done();
}
