/*
 * test_io_weights.c — canonical-name lookup over synthetic model directories: every
 * prefix, bare tensors, tied/untied lm_head, MLX-quantized modules (shape inference, bit
 * overrides, consistency errors), HF fused gate_up views (rows checked with
 * tern_tensor_row_f32), mlx switch_glu / GLM switch_mlp stacks, per-expert stacking, and
 * the unused-tensor listing.
 */
#include "io/weights.h"
#include "io_util.h"
#include "test.h"

static tern_error e;

static tern_model_config mkcfg(const char *quant_json, int n_expert) {
    char js[2048];
    tern_model_config c;
    snprintf(js, sizeof js,
             "{\"model_type\":\"llama\",\"vocab_size\":4,\"hidden_size\":2,\"intermediate_size\":4,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":1%s%s}",
             quant_json ? ",\"quantization\":" : "", quant_json ? quant_json : "");
    if (tern_config_parse(&c, js, strlen(js), "config.json", &e)) {
        printf("config: %s\n", e.msg);
        exit(1);
    }
    c.n_expert = n_expert;
    return c;
}

static char *model_dir(const char *name) {
    static char p[512];
    io_mkdir(name);
    snprintf(p, sizeof p, "%s", io_path(name));
    return p;
}

static void write_model(const char *dir, const st_t *t, int n) {
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    io_write_st(p, t, n, NULL);
}

TEST(w_prefixes_and_basics) {
    static const char *pre[] = {"model.language_model.", "language_model.model.", "model.", ""};
    float emb[8] = {1, 2, 3, 4, 5, 6, 7, 8}, nrm[2] = {9, 10}, sc = 0.5f;
    for (int i = 0; i < 4; i++) {
        char n0[96], n1[96], n2[96], n3[96], dn[32];
        snprintf(n0, sizeof n0, "%sembed_tokens.weight", pre[i]);
        snprintf(n1, sizeof n1, "%snorm.weight", pre[i]);
        snprintf(n2, sizeof n2, "%slayers.0.layer_scalar", pre[i]);
        snprintf(n3, sizeof n3, "%slayers.0.self_attn.rotary_emb.inv_freq", pre[i]);
        st_t t[] = {{n0, "F32", 2, {4, 2}, emb, 32}, {n1, "F32", 1, {2}, nrm, 8}, {n2, "F32", 1, {1}, &sc, 4},
                    {n3, "F32", 1, {1}, &sc, 4}, {"model.vision_tower.patch.weight", "F32", 1, {1}, &sc, 4},
                    {"extra.weight", "F32", 1, {1}, &sc, 4}};
        snprintf(dn, sizeof dn, "pfx%d", i);
        char *dir = model_dir(dn);
        write_model(dir, t, 6);
        tern_model_config cfg = mkcfg(NULL, 0);
        tern_weights *w = NULL;
        CHECK(tern_weights_open(&w, dir, &cfg, &e) == TERN_OK, "%s", e.msg);
        if (!w) continue;
        CHECK(!strcmp(tern_weights_prefix(w), pre[i]), "prefix %d = '%s'", i, tern_weights_prefix(w));
        tern_tensor x;
        int64_t es[2] = {4, 2};
        CHECK(tern_weights_get(w, "embed_tokens", 2, es, &x, &e) == TERN_OK, "%s", e.msg);
        CHECK(x.dtype == TERN_DT_F32 && x.device == -1 && !strcmp(x.name, n0) && tern_load_f32(x.data, x.dtype, 7) == 8,
              "embed");
        CHECK(tern_weights_get(w, "norm", 1, NULL, &x, &e) == TERN_OK, "%s", e.msg);
        CHECK(tern_weights_get(w, "layers.0.layer_scalar", 0, NULL, &x, &e) == TERN_OK && x.shape[0] == 1, "bare");
        int64_t bad[2] = {2, 4};
        CHECK(tern_weights_get(w, "embed_tokens", 2, bad, &x, &e) == TERN_EFORMAT && strstr(e.msg, "[2, 4]") &&
                  strstr(e.msg, "[4, 2]") && strstr(e.msg, "model.safetensors"), "%s", e.msg);
        CHECK(tern_weights_get(w, "layers.0.mlp.up_proj", 0, NULL, &x, &e) == TERN_ENOTFOUND &&
                  strstr(e.msg, "layers.0.mlp.up_proj"), "%s", e.msg);
        CHECK(tern_weights_try(w, "layers.0.mlp.up_proj", 0, NULL, &x, &e) == 0 && x.data == NULL, "try absent");
        CHECK(tern_weights_try(w, "lm_head", 0, NULL, &x, &e) == 0, "tied lm_head");
        const char *names[4];
        int nu = tern_weights_unused(w, names, 4);
        CHECK(nu == 1, "unused %d", nu);
        if (nu == 1) CHECK(!strcmp(names[0], "extra.weight"), "%s", names[0]);
        if (i != 3) {
            CHECK(tern_weights_try(w, "lm_head", 0, NULL, &x, &e) == 0, "lm_head");
        }
        tern_weights_close(w);
        tern_config_free(&cfg);
    }
    tern_weights_close(NULL);
    /* no embed_tokens at all */
    float v = 1;
    st_t t[] = {{"foo.weight", "F32", 1, {1}, &v, 4}};
    char *dir = model_dir("noembed");
    write_model(dir, t, 1);
    tern_weights *w = NULL;
    CHECK(tern_weights_open(&w, dir, NULL, &e) == TERN_ENOTFOUND && strstr(e.msg, "embed_tokens"), "%s", e.msg);
}

TEST(w_lm_head_forms) {
    float emb[8] = {0}, head[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    st_t a[] = {{"model.language_model.embed_tokens.weight", "F32", 2, {4, 2}, emb, 32},
                {"lm_head.weight", "F32", 2, {4, 2}, head, 32}};
    char *dir = model_dir("head_hf");
    write_model(dir, a, 2);
    tern_weights *w = NULL;
    tern_tensor x;
    int64_t sh[2] = {4, 2};
    CHECK(tern_weights_open(&w, dir, NULL, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_try(w, "lm_head", 2, sh, &x, &e) == 1 && tern_load_f32(x.data, x.dtype, 7) == 8, "hf head");
    CHECK(tern_weights_unused(w, NULL, 0) == 1, "embed not yet used");
    tern_weights_close(w);
    st_t b[] = {{"language_model.model.embed_tokens.weight", "F32", 2, {4, 2}, emb, 32},
                {"language_model.lm_head.weight", "F32", 2, {4, 2}, head, 32}};
    dir = model_dir("head_mlx");
    write_model(dir, b, 2);
    CHECK(tern_weights_open(&w, dir, NULL, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_try(w, "lm_head", 2, sh, &x, &e) == 1 && !strcmp(x.name, "language_model.lm_head.weight"),
          "mlx head");
    tern_weights_close(w);
}

/* pack codes q[out][in] (bits) as the MLX LE bit stream into u32 words */
static void pack(const uint8_t *q, int out, int in, int bits, uint32_t *dst) {
    int words = in * bits / 32;
    memset(dst, 0, (size_t)out * words * 4);
    uint8_t *bytes = (uint8_t *)dst;
    for (int o = 0; o < out; o++)
        for (int j = 0; j < in; j++) {
            uint64_t bit = (uint64_t)j * bits;
            for (int b = 0; b < bits; b++)
                if (q[o * in + j] >> b & 1) bytes[(size_t)o * words * 4 + (bit + b) / 8] |= (uint8_t)(1u << ((bit + b) % 8));
        }
}

TEST(w_quantized) {
    enum { OUT = 3, IN = 64 };
    uint8_t q[OUT * IN];
    uint32_t p4[OUT * IN * 4 / 32], p8[OUT * IN * 8 / 32], p6[OUT * IN * 6 / 32];
    uint16_t sc[OUT * 2], bi[OUT * 2];
    for (int i = 0; i < OUT * IN; i++) q[i] = (uint8_t)((i * 7) & 15);
    for (int i = 0; i < OUT * 2; i++) {
        sc[i] = tern_f32_to_bf16(0.5f + (float)i);
        bi[i] = tern_f32_to_bf16(-1.0f * (float)i);
    }
    pack(q, OUT, IN, 4, p4);
    pack(q, OUT, IN, 8, p8);
    pack(q, OUT, IN, 6, p6);
    float emb[8] = {0};
    st_t t[] = {
        {"model.embed_tokens.weight", "F32", 2, {4, 2}, emb, 32},
        {"model.layers.0.self_attn.q_proj.weight", "U32", 2, {OUT, IN * 4 / 32}, p4, sizeof p4},
        {"model.layers.0.self_attn.q_proj.scales", "BF16", 2, {OUT, 2}, sc, sizeof sc},
        {"model.layers.0.self_attn.q_proj.biases", "BF16", 2, {OUT, 2}, bi, sizeof bi},
        {"model.layers.0.mlp.down_proj.weight", "U32", 2, {OUT, IN * 8 / 32}, p8, sizeof p8},
        {"model.layers.0.mlp.down_proj.scales", "BF16", 2, {OUT, 2}, sc, sizeof sc},
        {"model.layers.0.mlp.down_proj.biases", "BF16", 2, {OUT, 2}, bi, sizeof bi},
        {"model.layers.0.mlp.up_proj.weight", "U32", 2, {OUT, IN * 6 / 32}, p6, sizeof p6},
        {"model.layers.0.mlp.up_proj.scales", "BF16", 2, {OUT, 2}, sc, sizeof sc},
        {"model.layers.0.mlp.up_proj.biases", "BF16", 2, {OUT, 2}, bi, sizeof bi},
        /* scales with the wrong number of columns */
        {"model.layers.0.mlp.gate_proj.weight", "U32", 2, {OUT, IN * 4 / 32}, p4, sizeof p4},
        {"model.layers.0.mlp.gate_proj.scales", "BF16", 2, {OUT, 3}, NULL, OUT * 3 * 2},
        {"model.layers.0.mlp.gate_proj.biases", "BF16", 2, {OUT, 3}, NULL, OUT * 3 * 2},
        /* no biases */
        {"model.layers.0.self_attn.k_proj.weight", "U32", 2, {OUT, IN * 4 / 32}, p4, sizeof p4},
        {"model.layers.0.self_attn.k_proj.scales", "BF16", 2, {OUT, 2}, sc, sizeof sc},
        /* wrong dtype for the packed weight */
        {"model.layers.0.self_attn.v_proj.weight", "F32", 2, {OUT, IN * 4 / 32}, p4, sizeof p4},
        {"model.layers.0.self_attn.v_proj.scales", "BF16", 2, {OUT, 2}, sc, sizeof sc},
        {"model.layers.0.self_attn.v_proj.biases", "BF16", 2, {OUT, 2}, bi, sizeof bi},
    };
    char *dir = model_dir("quant");
    write_model(dir, t, (int)(sizeof t / sizeof t[0]));
    tern_model_config cfg = mkcfg("{\"bits\":4,\"group_size\":32,\"model.layers.0.mlp.down_proj\":{\"bits\":8},"
                                  "\"model.layers.0.mlp.up_proj\":{\"bits\":6},\"model.embed_tokens\":false}", 0);
    tern_weights *w = NULL;
    CHECK(tern_weights_open(&w, dir, &cfg, &e) == TERN_OK, "%s", e.msg);
    if (!w) return;
    const char *mods[] = {"layers.0.self_attn.q_proj", "layers.0.mlp.down_proj", "layers.0.mlp.up_proj"};
    const int bits[] = {4, 8, 6};
    for (int m = 0; m < 3; m++) {
        tern_tensor x;
        int64_t sh[2] = {OUT, IN};
        CHECK(tern_weights_get(w, mods[m], 2, sh, &x, &e) == TERN_OK, "%s: %s", mods[m], e.msg);
        if (x.dtype != TERN_DT_Q) continue;
        CHECK(x.bits == bits[m] && x.group_size == 32 && x.sdtype == TERN_DT_BF16 && x.shape[1] == IN, "%s", mods[m]);
        float row[IN];
        int ok = 1;
        for (int o = 0; o < OUT; o++) {
            tern_tensor_row_f32(&x, o, row);
            for (int j = 0; j < IN; j++) {
                float want = tern_bf16_to_f32(sc[o * 2 + j / 32]) * (float)q[o * IN + j] + tern_bf16_to_f32(bi[o * 2 + j / 32]);
                if (row[j] != want) ok = 0;
            }
        }
        CHECK(ok, "dequantized rows of %s", mods[m]);
    }
    tern_tensor x;
    CHECK(tern_weights_get(w, "layers.0.mlp.gate_proj", 0, NULL, &x, &e) == TERN_EFORMAT &&
              strstr(e.msg, "model.layers.0.mlp.gate_proj.weight") && strstr(e.msg, "have 3"), "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.self_attn.k_proj", 0, NULL, &x, &e) == TERN_EFORMAT &&
              strstr(e.msg, "k_proj.biases"), "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.self_attn.v_proj", 0, NULL, &x, &e) == TERN_EFORMAT &&
              strstr(e.msg, "v_proj.weight") && strstr(e.msg, "U32"), "%s", e.msg);
    CHECK(tern_weights_get(w, "embed_tokens", 0, NULL, &x, &e) == TERN_OK && x.dtype == TERN_DT_F32, "plain embed");
    CHECK(tern_weights_unused(w, NULL, 0) == 0, "all used: %d", tern_weights_unused(w, NULL, 0));
    tern_weights_close(w);
    tern_config_free(&cfg);

    /* .scales present but the config has no quantization block */
    cfg = mkcfg(NULL, 0);
    CHECK(tern_weights_open(&w, dir, &cfg, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.self_attn.q_proj", 0, NULL, &x, &e) == TERN_EFORMAT &&
              strstr(e.msg, "q_proj.weight") && strstr(e.msg, "no quantization block"), "%s", e.msg);
    tern_weights_close(w);
    tern_config_free(&cfg);
    /* .scales present but the module is marked false */
    cfg = mkcfg("{\"bits\":4,\"group_size\":32,\"model.layers.0.self_attn.q_proj\":false}", 0);
    CHECK(tern_weights_open(&w, dir, &cfg, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.self_attn.q_proj", 0, NULL, &x, &e) == TERN_EFORMAT &&
              strstr(e.msg, "not quantized"), "%s", e.msg);
    tern_weights_close(w);
    tern_config_free(&cfg);
}

#define E_ 2
#define I_ 3
#define H_ 4

TEST(w_experts) {
    float emb[8] = {0}, gu[E_ * 2 * I_ * H_], dn[E_ * H_ * I_], pe[3][I_ * H_];
    for (int ex = 0; ex < E_; ex++)
        for (int r = 0; r < 2 * I_; r++)
            for (int j = 0; j < H_; j++) gu[(ex * 2 * I_ + r) * H_ + j] = (float)(ex * 100 + r * 10 + j);
    for (int i = 0; i < E_ * H_ * I_; i++) dn[i] = (float)i;
    for (int ex = 0; ex < 3; ex++)
        for (int i = 0; i < I_ * H_; i++) pe[ex][i] = (float)(ex * 1000 + i);
    char *n = "model.language_model.";
    (void)n;
    st_t t[] = {
        {"model.language_model.embed_tokens.weight", "F32", 2, {4, 2}, emb, 32},
        {"model.language_model.layers.0.experts.gate_up_proj", "F32", 3, {E_, 2 * I_, H_}, gu, sizeof gu},
        {"model.language_model.layers.0.experts.down_proj", "F32", 3, {E_, H_, I_}, dn, sizeof dn},
        {"model.language_model.layers.1.experts.switch_glu.gate_proj.weight", "F32", 3, {E_, I_, H_}, gu, E_ * I_ * H_ * 4},
        {"model.language_model.layers.2.mlp.switch_mlp.up_proj.weight", "F32", 3, {E_, I_, H_}, gu, E_ * I_ * H_ * 4},
        {"model.language_model.layers.3.mlp.experts.0.gate_proj.weight", "F32", 2, {I_, H_}, pe[0], sizeof pe[0]},
        {"model.language_model.layers.3.mlp.experts.1.gate_proj.weight", "F32", 2, {I_, H_}, pe[1], sizeof pe[1]},
        {"model.language_model.layers.3.mlp.experts.2.gate_proj.weight", "F32", 2, {I_, H_}, pe[2], sizeof pe[2]},
        {"model.language_model.layers.3.mlp.experts.0.up_proj.weight", "F32", 2, {I_, H_}, pe[0], sizeof pe[0]},
        {"model.language_model.layers.3.mlp.experts.2.up_proj.weight", "F32", 2, {I_, H_}, pe[2], sizeof pe[2]},
        {"model.language_model.layers.3.mlp.experts.0.down_proj.weight", "F32", 2, {I_, H_}, pe[0], sizeof pe[0]},
        {"model.language_model.layers.3.mlp.experts.1.down_proj.weight", "F16", 2, {I_, H_}, pe[1], sizeof pe[1] / 2},
        {"model.language_model.layers.3.mlp.experts.2.down_proj.weight", "F32", 2, {I_, H_}, pe[2], sizeof pe[2]},
    };
    char *dir = model_dir("experts");
    write_model(dir, t, (int)(sizeof t / sizeof t[0]));
    tern_model_config cfg = mkcfg(NULL, 3);
    tern_weights *w = NULL;
    CHECK(tern_weights_open(&w, dir, &cfg, &e) == TERN_OK, "%s", e.msg);
    if (!w) return;
    tern_tensor g, u, d;
    int64_t sgu[3] = {E_, I_, H_}, sd[3] = {E_, H_, I_};
    CHECK(tern_weights_get(w, "layers.0.experts.gate", 3, sgu, &g, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.experts.up", 3, sgu, &u, &e) == TERN_OK, "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.0.experts.down", 3, sd, &d, &e) == TERN_OK, "%s", e.msg);
    float row[H_];
    int ok = 1;
    for (int ex = 0; ex < E_; ex++)
        for (int r = 0; r < I_; r++) {
            tern_tensor_row_f32(&g, ex * I_ + r, row);
            for (int j = 0; j < H_; j++) ok &= row[j] == (float)(ex * 100 + r * 10 + j);
            tern_tensor_row_f32(&u, ex * I_ + r, row);
            for (int j = 0; j < H_; j++) ok &= row[j] == (float)(ex * 100 + (I_ + r) * 10 + j);
        }
    CHECK(ok, "fused gate/up views decode the right rows");
    CHECK(g.mat_stride == 2 * I_ * H_ * 4 && d.mat_stride == 0, "strides");
    /* mlx switch_glu / GLM switch_mlp */
    CHECK(tern_weights_get(w, "layers.1.experts.gate", 3, sgu, &g, &e) == TERN_OK &&
              strstr(g.name, "switch_glu.gate_proj"), "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.2.experts.up", 3, sgu, &g, &e) == TERN_OK && strstr(g.name, "switch_mlp.up_proj"),
          "%s", e.msg);
    /* per-expert stacking */
    int64_t s3[3] = {3, I_, H_};
    CHECK(tern_weights_get(w, "layers.3.experts.gate", 3, s3, &g, &e) == TERN_OK, "%s", e.msg);
    ok = 1;
    for (int ex = 0; ex < 3; ex++)
        for (int r = 0; r < I_; r++) {
            tern_tensor_row_f32(&g, ex * I_ + r, row);
            for (int j = 0; j < H_; j++) ok &= row[j] == (float)(ex * 1000 + r * H_ + j);
        }
    CHECK(ok, "stacked rows");
    tern_tensor g2;
    CHECK(tern_weights_get(w, "layers.3.experts.gate", 3, s3, &g2, &e) == TERN_OK && g2.data == g.data, "cached");
    CHECK(tern_weights_get(w, "layers.3.experts.up", 3, s3, &u, &e) == TERN_ENOTFOUND && strstr(e.msg, "expert 1"),
          "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.3.experts.down", 3, s3, &d, &e) == TERN_EFORMAT &&
              strstr(e.msg, "experts.1.down_proj"), "%s", e.msg);
    CHECK(tern_weights_get(w, "layers.9.experts.gate", 3, s3, &d, &e) == TERN_ENOTFOUND &&
              strstr(e.msg, "layers.9"), "%s", e.msg);
    /* unused: the embedding (never requested) and the experts after the failed ones */
    const char *names[8];
    int nu = tern_weights_unused(w, names, 8);
    CHECK(nu == 3 && !strcmp(names[0], "model.language_model.embed_tokens.weight") &&
              !strcmp(names[1], "model.language_model.layers.3.mlp.experts.2.up_proj.weight"), "unused %d", nu);
    tern_weights_ignore(w, "embed_tokens");
    tern_weights_ignore(w, "layers.3.mlp.experts.");
    CHECK(tern_weights_unused(w, names, 8) == 0, "ignored");
    tern_weights_close(w);
    tern_config_free(&cfg);
}

int main(void) {
    RUN(w_prefixes_and_basics);
    RUN(w_lm_head_forms);
    RUN(w_quantized);
    RUN(w_experts);
    io_cleanup();
    return test_done();
}
