/* test_kern_fp8.c — block-scaled FP8 weights (DeepSeek-V3 / GLM-5-FP8 layout, tensor.h):
 *   - the reference row decoder against an independent e4m3 formula on all 256 codes;
 *   - fast CPU matmul / matmul_expert / embed vs the scalar reference at every ISA level, over
 *     block sizes that do and do not divide the shape (ceil grids), strided expert views;
 *   - config.json quantization_config {"quant_method": "fp8"} parsing and rejections;
 *   - weights.c resolution of `<m>.weight` F8_E4M3 + `<m>.weight_scale_inv`, per-expert stacks
 *     and the fused HF `experts.gate_up_proj` + `_scale_inv` split, with precise errors. */
#include "io/config.h"
#include "io/weights.h"
#include "io_util.h"
#include "test_kern_util.h"

#include <math.h>

#define REQUIRE(cond, ...) do { int ok_ = !!(cond); CHECK(ok_, __VA_ARGS__); if (!ok_) return; } while (0) /* evaluates cond once */

/* e4m3 (fn) by the textbook: sign, 4-bit exponent bias 7, 3-bit mantissa, subnormals at e=0,
 * only S.1111.111 is NaN (no infinities). */
static double e4m3_formula(unsigned v) {
    unsigned s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    double x = e ? (1.0 + m / 8.0) * pow(2.0, (double)e - 7.0) : m / 8.0 * pow(2.0, -6.0);
    return s ? -x : x;
}

/* E matrices [out, in] of e4m3 codes + F32 scales [ceil(out/br), ceil(in/bc)] per matrix;
 * `pad` extra rows (and scale rows) between matrices exercise mat_stride views. */
typedef struct fp8w {
    tern_tensor t;
    uint8_t *q;
    float *s;
} fp8w;

static void fp8_make(fp8w *w, int E, int out, int in, int br, int bc, int pad, unsigned long long seed) {
    unsigned long long r = seed * 0x9E3779B97F4A7C15ull + 3;
    memset(w, 0, sizeof *w);
    int sro = (out + br - 1) / br, sco = (in + bc - 1) / bc, padr = pad ? (pad + br - 1) / br : 0;
    size_t rows = (size_t)E * (size_t)(out + pad), srows = (size_t)E * (size_t)(sro + padr);
    w->q = malloc(rows * (size_t)in + 64);
    w->s = malloc(srows * (size_t)sco * sizeof(float) + 64);
    for (size_t i = 0; i < rows * (size_t)in; i++) {
        uint8_t b = (uint8_t)test_rand_u64(&r);
        w->q[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b & 0xfe) : b; /* no NaN codes in weights */
    }
    for (size_t i = 0; i < srows * (size_t)sco; i++) w->s[i] = (0.5f + 0.5f * test_randf(&r)) / 448.0f;
    tern_tensor *t = &w->t;
    t->dtype = TERN_DT_F8_E4M3;
    t->ndim = E > 1 ? 3 : 2;
    if (E > 1) { t->shape[0] = E; t->shape[1] = out; t->shape[2] = in; }
    else { t->shape[0] = out; t->shape[1] = in; }
    t->data = w->q;
    t->scales = w->s;
    t->sdtype = TERN_DT_F32;
    t->group_size = bc;
    t->blk_rows = br;
    t->device = -1;
    t->name = "fp8test";
    if (pad) {
        t->mat_stride = (size_t)(out + pad) * (size_t)in;
        t->mat_stride_s = (size_t)(sro + padr) * (size_t)sco * sizeof(float);
    }
}

static void fp8_free(fp8w *w) { free(w->q); free(w->s); }

TEST(fp8_row_decoder_matches_formula) {
    /* one row of all 256 codes, scales 1 then 0.25 over two column blocks of 128 */
    uint8_t q[256];
    float s[2] = {1.0f, 0.25f}, row[256];
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)i;
    tern_tensor t = {.dtype = TERN_DT_F8_E4M3, .ndim = 2, .shape = {1, 256}, .data = q, .scales = s,
                     .sdtype = TERN_DT_F32, .group_size = 128, .blk_rows = 128, .device = -1};
    CHECK(tern_tensor_fp8_scale_cols(&t) == 2 && tern_tensor_fp8_scale_bytes(&t) == 8, "scale grid");
    tern_tensor_row_f32(&t, 0, row);
    int bad = 0;
    for (int i = 0; i < 256; i++) {
        double want = e4m3_formula((unsigned)i) * (i < 128 ? 1.0 : 0.25);
        if (isnan(want) ? !isnan(row[i]) : (double)row[i] != want) bad++;
    }
    CHECK(bad == 0, "%d codes decode differently from the e4m3 formula", bad);
    CHECK(row[0x7e] == 448.0f && row[0x01] == 0x1p-9f, "max %g, min subnormal %g", row[0x7e], row[1]);
}

#define TOL 3e-6

static double check_mm(tern_backend *fast, tern_backend *ref, int E, int out, int in, int br, int bc, int n, int pad,
                       unsigned long long seed) {
    fp8w w;
    fp8_make(&w, E, out, in, br, bc, pad, seed);
    double worst = kt_matmul_worst(fast, ref, &w.t, E, out, in, n, seed + 1);
    fp8_free(&w);
    return worst;
}

static void grid(const char *isa) {
    tern_backend *fast = kt_open_cpu(isa, 2), *ref = kt_open_ref();
    static const int blocks[][2] = {{128, 128}, {32, 64}, {7, 16}, {1, 1000}};
    static const int ins[] = {1, 16, 100, 300, 515, 1031};
    static const int ns[] = {1, 2, 5, 9, 17};
    unsigned long long seed = 5;
    for (size_t b = 0; b < TERN_ARRAY_LEN(blocks); b++)
        for (size_t i = 0; i < TERN_ARRAY_LEN(ins); i++)
            for (size_t k = 0; k < TERN_ARRAY_LEN(ns); k++) {
                int out = 1 + (int)((seed * 37) % 150);
                double err = check_mm(fast, ref, 1, out, ins[i], blocks[b][0], blocks[b][1], ns[k], 0, seed++);
                CHECK(err <= TOL, "%s fp8 block %dx%d out=%d in=%d n=%d: rel err %.3g", isa, blocks[b][0],
                      blocks[b][1], out, ins[i], ns[k], err);
            }
    /* expert stacks, tight and strided (pad rows between matrices) */
    double e1 = check_mm(fast, ref, 3, 130, 200, 128, 128, 1, 0, 91);
    double e2 = check_mm(fast, ref, 4, 40, 96, 16, 32, 3, 8, 92);
    double e3 = check_mm(fast, ref, 2, 33, 600, 32, 128, 9, 5, 93);
    CHECK(e1 <= TOL && e2 <= TOL && e3 <= TOL, "%s experts: %.3g %.3g %.3g", isa, e1, e2, e3);
    /* the embedding decoder is bit-identical to the reference */
    fp8w w;
    fp8_make(&w, 1, 9, 272, 4, 128, 0, 77);
    int32_t ids[4] = {0, 8, 5, -1};
    float y0[4 * 272], y1[4 * 272];
    ref->vt->embed(ref, y0, ids, 4, &w.t, 1.5f);
    fast->vt->embed(fast, y1, ids, 4, &w.t, 1.5f);
    CHECK(!memcmp(y0, y1, sizeof y0), "%s fp8 embed differs", isa);
    fp8_free(&w);
    tern_backend_close(fast);
    tern_backend_close(ref);
}

TEST(fp8_matmul_scalar) { grid("scalar"); }
TEST(fp8_matmul_avx2) { grid("avx2"); }
TEST(fp8_matmul_avx512) { grid("avx512"); }

TEST(fp8_upload_checks) {
    tern_backend *be = kt_open_cpu("scalar", 1);
    fp8w w;
    tern_error e = {0};
    fp8_make(&w, 1, 8, 64, 128, 128, 0, 1);
    CHECK(be->vt->upload_weight(be, &w.t, &e) == TERN_OK, "%s", e.msg);
    w.t.blk_rows = 0;
    CHECK(be->vt->upload_weight(be, &w.t, &e) == TERN_EUNSUPPORTED && strstr(e.msg, "fp8test"), "%s", e.msg);
    w.t.blk_rows = 128;
    w.t.sdtype = TERN_DT_BF16;
    CHECK(be->vt->upload_weight(be, &w.t, &e) == TERN_EUNSUPPORTED, "bf16 block scales accepted");
    fp8_free(&w);
    tern_backend_close(be);
}

/* ---- config + weights ---- */

#define CFG_HEAD "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4," \
                 " \"num_key_value_heads\": 2, \"intermediate_size\": 160, \"vocab_size\": 32, \"num_local_experts\": 2,"
#define FP8_QC "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\"," \
               " \"weight_block_size\": [32, 64], \"modules_to_not_convert\": [\"lm_head\", \"mlp.gate\"]}}"

TEST(fp8_config_parse) {
    tern_model_config c;
    tern_error e = {0};
    const char *ok = CFG_HEAD FP8_QC;
    CHECK(tern_config_parse(&c, ok, strlen(ok), "config.json", &e) == TERN_OK, "%s", e.msg);
    CHECK(c.quant.fp8 && !c.quant.enabled && c.quant.fp8_block[0] == 32 && c.quant.fp8_block[1] == 64 &&
              c.quant.n_fp8_skip == 2 && !strcmp(c.quant.fp8_skip[1], "mlp.gate"),
          "fp8 %d enabled %d block %dx%d skip %d", c.quant.fp8, c.quant.enabled, c.quant.fp8_block[0],
          c.quant.fp8_block[1], c.quant.n_fp8_skip);
    tern_config_free(&c);
    static const struct { const char *qc, *want; int st; } bad[] = {
        {"\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e5m2\", \"weight_block_size\": [128, 128]}}", "fmt", TERN_EUNSUPPORTED},
        {"\"quantization_config\": {\"quant_method\": \"fp8\"}}", "weight_block_size", TERN_EUNSUPPORTED},
        {"\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128]}}", "weight_block_size", TERN_EFORMAT},
        {"\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [0, 128]}}", "weight_block_size[0]", TERN_EFORMAT},
        {"\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"activation_scheme\": \"static\"}}", "activation_scheme", TERN_EUNSUPPORTED},
        {"\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": [3]}}", "modules_to_not_convert[0]", TERN_EFORMAT},
        {"\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}}", "quant_method", TERN_EUNSUPPORTED},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(bad); i++) {
        char js[1024];
        snprintf(js, sizeof js, "%s%s", CFG_HEAD, bad[i].qc);
        memset(&e, 0, sizeof e);
        tern_status st = tern_config_parse(&c, js, strlen(js), "config.json", &e);
        CHECK(st == bad[i].st && strstr(e.msg, bad[i].want), "case %zu: status %d msg '%s'", i, st, e.msg);
        tern_config_free(&c);
    }
}

/* A directory with embed (bf16), one FP8 linear, per-expert FP8 gate/up/down for layer 0 and a
 * fused HF gate_up_proj for layer 1. */
static void write_fp8_dir(const char *dir, int scale_rows_override) {
    static uint8_t q[2 * 320 * 64];
    static float s[64];
    static uint16_t emb[32 * 64];
    for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)(i * 7 + 1) & 0x7e;
    for (int i = 0; i < 64; i++) s[i] = 0.01f * (float)(i + 1);
    int sr = scale_rows_override ? scale_rows_override : 5; /* ceil(160/32) */
    st_t t[] = {
        {"model.embed_tokens.weight", "BF16", 2, {32, 64}, emb, sizeof emb},
        {"model.layers.0.self_attn.q_proj.weight", "F8_E4M3", 2, {40, 64}, q, 40 * 64},
        {"model.layers.0.self_attn.q_proj.weight_scale_inv", "F32", 2, {2, 1}, s, 8},
        {"model.layers.0.mlp.experts.0.gate_proj.weight", "F8_E4M3", 2, {160, 64}, q, 160 * 64},
        {"model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv", "F32", 2, {sr, 1}, s, (size_t)sr * 4},
        {"model.layers.0.mlp.experts.1.gate_proj.weight", "F8_E4M3", 2, {160, 64}, q + 64, 160 * 64},
        {"model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv", "F32", 2, {5, 1}, s + 5, 20},
        {"model.layers.1.experts.gate_up_proj", "F8_E4M3", 3, {2, 320, 64}, q, sizeof q},
        {"model.layers.1.experts.gate_up_proj_scale_inv", "F32", 3, {2, 10, 1}, s, 80},
    };
    io_mkdir(dir);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", io_path(dir));
    io_write_st(p, t, (int)TERN_ARRAY_LEN(t), NULL);
}

static tern_status open_dir(const char *dir, const char *cfgjs, tern_model_config *c, tern_weights **w, tern_error *e) {
    tern_status st = tern_config_parse(c, cfgjs, strlen(cfgjs), "config.json", e);
    return st ? st : tern_weights_open(w, io_path(dir), c, e);
}

TEST(fp8_weights_resolve) {
    write_fp8_dir("fp8ok", 0);
    tern_model_config c;
    tern_weights *w = NULL;
    tern_error e = {0};
    const char *js = CFG_HEAD FP8_QC;
    REQUIRE(open_dir("fp8ok", js, &c, &w, &e) == TERN_OK, "%s", e.msg);
    tern_tensor t;
    int64_t sh[2] = {40, 64};
    CHECK(tern_weights_get(w, "layers.0.self_attn.q_proj", 2, sh, &t, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_tensor_is_fp8_block(&t) && t.blk_rows == 32 && t.group_size == 64, "q_proj not block fp8");
    float row[64];
    tern_tensor_row_f32(&t, 33, row); /* row block 1: scale s[1] = 0.02 */
    CHECK(row[1] == tern_f8e4m3_to_f32((uint8_t)((33 * 64 + 1) * 7 + 1) & 0x7e) * 0.02f, "row 33 col 1 = %g", row[1]);
    /* per-expert stack */
    int64_t se[3] = {2, 160, 64};
    CHECK(tern_weights_get(w, "layers.0.experts.gate", 3, se, &t, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_tensor_is_fp8_block(&t) && !t.biases, "stack not block fp8");
    tern_tensor_row_f32(&t, 160 + 70, row); /* expert 1, row 70: its scale row 2 = s[5 + 2] */
    CHECK(row[0] == tern_f8e4m3_to_f32((uint8_t)((64 + 70 * 64) * 7 + 1) & 0x7e) * 0.08f, "expert 1 row 70 = %g", row[0]);
    /* fused gate_up: up row 3 of expert 1 = stored row 160 + 3 of matrix 1, scale row 5 + 0 */
    CHECK(tern_weights_get(w, "layers.1.experts.up", 3, se, &t, &e) == TERN_OK, "%s", e.msg);
    tern_tensor_row_f32(&t, 160 + 3, row);
    size_t qi = (size_t)320 * 64 + (size_t)(160 + 3) * 64;
    CHECK(row[2] == tern_f8e4m3_to_f32((uint8_t)((qi + 2) * 7 + 1) & 0x7e) * 0.16f, "fused up row = %g", row[2]);
    int64_t shemb[2] = {32, 64};
    CHECK(tern_weights_get(w, "embed_tokens", 2, shemb, &t, &e) == TERN_OK && t.dtype == TERN_DT_BF16, "%s", e.msg);
    CHECK(tern_weights_unused(w, NULL, 0) == 0, "%d unused tensors (scales must count as used)", tern_weights_unused(w, NULL, 0));
    tern_weights_close(w);
    tern_config_free(&c);

    /* no fp8 block in the config */
    const char *nofp8 = CFG_HEAD "\"rms_norm_eps\": 1e-5}";
    w = NULL;
    REQUIRE(open_dir("fp8ok", nofp8, &c, &w, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.self_attn.q_proj", 2, sh, &t, &e) == TERN_EFORMAT && strstr(e.msg, "quant_method"),
          "%s", e.msg);
    tern_weights_close(w);
    tern_config_free(&c);

    /* wrong scale grid */
    write_fp8_dir("fp8bad", 4);
    w = NULL;
    REQUIRE(open_dir("fp8bad", js, &c, &w, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.experts.gate", 3, se, &t, &e) == TERN_EFORMAT && strstr(e.msg, "ceil(out/32)") &&
              strstr(e.msg, "experts.0.gate_proj.weight_scale_inv"),
          "%s", e.msg);
    tern_weights_close(w);
    tern_config_free(&c);
}

int main(void) {
    RUN(fp8_row_decoder_matches_formula);
    RUN(fp8_matmul_scalar);
    if (kt_isa_ok("avx2")) RUN(fp8_matmul_avx2);
    else SKIP("fp8_matmul_avx2", "CPU lacks AVX2/FMA/F16C");
    if (kt_isa_ok("avx512")) RUN(fp8_matmul_avx512);
    else SKIP("fp8_matmul_avx512", "CPU lacks AVX-512 (F/BW/VL/VBMI)");
    RUN(fp8_upload_checks);
    RUN(fp8_config_parse);
    RUN(fp8_weights_resolve);
    io_cleanup();
    return test_done();
}
