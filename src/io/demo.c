/*
 * demo.c — the embedded demo model (see demo.h). Files: config.json, generation_config.json,
 * tokenizer.json (byte-level BPE, no merges: 8 special tokens, then the 256 bytes),
 * tokenizer_config.json (chat template), model.safetensors (bf16, fixed-seed weights).
 */
#include "io/demo.h"
#include "io/st_write.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEMO_VERSION "demo-v1"
#define DEMO_V 264
#define DEMO_H 64
#define DEMO_FF 128
#define DEMO_L 4
#define DEMO_NH 4
#define DEMO_NKV 2
#define DEMO_DS 16
#define DEMO_DF 32

static const char k_config[] =
    "{\"architectures\": [\"Gemma4ForCausalLM\"], \"model_type\": \"gemma4_text\", \"vocab_size\": 264,"
    " \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"global_head_dim\": 32,"
    " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"],"
    " \"sliding_window\": 32, \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},"
    " \"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0}},"
    " \"hidden_size_per_layer_input\": 0, \"num_kv_shared_layers\": 0, \"final_logit_softcapping\": 30.0,"
    " \"tie_word_embeddings\": true, \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 4096,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"bos_token_id\": 2, \"eos_token_id\": [1, 4], \"pad_token_id\": 0}\n";

static const char k_gen_config[] = "{\"bos_token_id\": 2, \"eos_token_id\": [1, 4], \"pad_token_id\": 0, \"temperature\": 0.8, \"top_p\": 0.95}\n";

static const char *k_specials[8] = {"<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<unused0>", "<unused1>", "<unused2>"};

static const char k_template[] =
    "{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n{{ m['content'] | trim }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}";

/* GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100.. in order. */
static int byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

static void add_special(cJSON *added, cJSON *vocab, int id, const char *content) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", 1);
    cJSON_AddItemToArray(added, a);
    cJSON_AddNumberToObject(vocab, content, id);
}

static cJSON *byte_level(cJSON *parent, const char *key) {
    cJSON *o = cJSON_AddObjectToObject(parent, key);
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", 0);
    cJSON_AddBoolToObject(o, "trim_offsets", 1);
    cJSON_AddBoolToObject(o, "use_regex", 0);
    return o;
}

static void template_piece(cJSON *arr, const char *kind, const char *id, int type_id) {
    cJSON *o = cJSON_CreateObject(), *in = cJSON_AddObjectToObject(o, kind);
    cJSON_AddStringToObject(in, "id", id);
    cJSON_AddNumberToObject(in, "type_id", type_id);
    cJSON_AddItemToArray(arr, o);
}

char *tern_bytelevel_tokenizer_json(const char *const *head, int n_head, const char *const *tail, int n_tail,
                                    const char *bos) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "version", "1.0");
    cJSON *added = cJSON_AddArrayToObject(t, "added_tokens");
    cJSON_AddNullToObject(t, "normalizer");
    byte_level(t, "pre_tokenizer");
    if (bos) { /* TemplateProcessing: BOS before each sequence */
        cJSON *post = cJSON_AddObjectToObject(t, "post_processor");
        cJSON_AddStringToObject(post, "type", "TemplateProcessing");
        cJSON *single = cJSON_AddArrayToObject(post, "single"), *pair = cJSON_AddArrayToObject(post, "pair");
        template_piece(single, "SpecialToken", bos, 0);
        template_piece(single, "Sequence", "A", 0);
        template_piece(pair, "SpecialToken", bos, 0);
        template_piece(pair, "Sequence", "A", 0);
        template_piece(pair, "Sequence", "B", 1);
        cJSON *sp = cJSON_AddObjectToObject(post, "special_tokens"), *b = cJSON_AddObjectToObject(sp, bos);
        cJSON_AddStringToObject(b, "id", bos);
        int bos_id = 0;
        for (int i = 0; i < n_head; i++) if (!strcmp(head[i], bos)) bos_id = i;
        cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "ids"), cJSON_CreateNumber(bos_id));
        cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "tokens"), cJSON_CreateString(bos));
    }
    byte_level(t, "decoder");
    cJSON *model = cJSON_AddObjectToObject(t, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < n_head; i++) add_special(added, vocab, i, head[i]);
    for (int b = 0; b < 256; b++) {
        char u[4] = {0};
        int cp = byte_to_cp(b);
        if (cp < 0x80) u[0] = (char)cp;
        else { u[0] = (char)(0xc0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3f)); }
        cJSON_AddNumberToObject(vocab, u, n_head + b);
    }
    for (int i = 0; i < n_tail; i++) add_special(added, vocab, n_head + 256 + i, tail[i]);
    char *js = cJSON_Print(t);
    cJSON_Delete(t);
    return js;
}

static char *tokenizer_config_json(void) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "bos_token", "<bos>");
    cJSON_AddStringToObject(t, "eos_token", "<turn|>");
    cJSON_AddStringToObject(t, "pad_token", "<pad>");
    cJSON_AddBoolToObject(t, "add_bos_token", 1);
    cJSON_AddStringToObject(t, "chat_template", k_template);
    char *js = cJSON_Print(t);
    cJSON_Delete(t);
    return js;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static float rng_normal(uint64_t *s) { /* Box-Muller */
    double u1 = ((rng_next(s) >> 11) + 1.0) / 9007199254740993.0, u2 = (rng_next(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2 * M_PI * u2));
}

typedef struct wlist { tern_st_wentry e[128]; char names[128][96]; uint16_t *bufs[128]; int n; } wlist;

static int add_tensor(wlist *w, uint64_t *rng, const char *name, int64_t d0, int64_t d1, float std, float mean) {
    if (w->n >= 128) return 0;
    size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    uint16_t *b = malloc(n * 2);
    if (!b) return 0;
    for (size_t i = 0; i < n; i++) b[i] = tern_f32_to_bf16(mean + std * rng_normal(rng));
    tern_st_wentry *e = &w->e[w->n];
    snprintf(w->names[w->n], sizeof w->names[0], "%s", name);
    e->name = w->names[w->n];
    e->dtype = TERN_DT_BF16;
    e->ndim = d1 ? 2 : 1;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->data = b;
    w->bufs[w->n++] = b;
    return 1;
}

static tern_status write_weights(const char *path, tern_error *err) {
    wlist *w = calloc(1, sizeof *w);
    if (!w) return tern_err(err, TERN_ENOMEM, "out of memory");
    uint64_t rng = 0x7e57d3e0ULL;
    int ok = add_tensor(w, &rng, "model.embed_tokens.weight", DEMO_V, DEMO_H, 1.0f, 0) &&
             add_tensor(w, &rng, "model.norm.weight", DEMO_H, 0, 0.1f, 1.0f);
    char n[96];
    float sh = 1.0f / sqrtf(DEMO_H), sf = 1.0f / sqrtf(DEMO_FF);
    for (int l = 0; ok && l < DEMO_L; l++) {
        int D = l == DEMO_L - 1 ? DEMO_DF : DEMO_DS;
        float so = 1.0f / sqrtf((float)(DEMO_NH * D));
#define T(sfx, d0, d1, sd, mu) (snprintf(n, sizeof n, "model.layers.%d.%s", l, sfx), add_tensor(w, &rng, n, d0, d1, sd, mu))
        ok = T("input_layernorm.weight", DEMO_H, 0, 0.1f, 1) && T("post_attention_layernorm.weight", DEMO_H, 0, 0.1f, 1) &&
             T("pre_feedforward_layernorm.weight", DEMO_H, 0, 0.1f, 1) && T("post_feedforward_layernorm.weight", DEMO_H, 0, 0.1f, 1) &&
             T("layer_scalar", 1, 0, 0.0f, 1) &&
             T("self_attn.q_proj.weight", DEMO_NH * D, DEMO_H, sh, 0) && T("self_attn.k_proj.weight", DEMO_NKV * D, DEMO_H, sh, 0) &&
             T("self_attn.v_proj.weight", DEMO_NKV * D, DEMO_H, sh, 0) && T("self_attn.o_proj.weight", DEMO_H, DEMO_NH * D, so, 0) &&
             T("self_attn.q_norm.weight", D, 0, 0.1f, 1) && T("self_attn.k_norm.weight", D, 0, 0.1f, 1) &&
             T("mlp.gate_proj.weight", DEMO_FF, DEMO_H, sh, 0) && T("mlp.up_proj.weight", DEMO_FF, DEMO_H, sh, 0) &&
             T("mlp.down_proj.weight", DEMO_H, DEMO_FF, sf, 0);
#undef T
    }
    tern_status s = ok ? tern_st_write(path, w->e, w->n, err) : tern_err(err, TERN_ENOMEM, "out of memory");
    for (int i = 0; i < w->n; i++) free(w->bufs[i]);
    free(w);
    return s;
}

static tern_status write_text(const char *dir, const char *name, const char *text, tern_error *err) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return tern_err(err, TERN_EIO, "cannot create '%s': %s", tmp, strerror(errno));
    size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) { remove(tmp); return tern_err(err, TERN_EIO, "cannot write '%s'", path); }
    return TERN_OK;
}

static int mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static tern_status materialize(const char *dir, tern_error *err) {
    char marker[4096];
    snprintf(marker, sizeof marker, "%s/model.safetensors", dir);
    struct stat st;
    if (stat(marker, &st) == 0) return TERN_OK; /* written last: its presence means complete */
    if (mkdirs(dir) != 0) return tern_err(err, TERN_EIO, "cannot create the demo model directory '%s': %s", dir, strerror(errno));
    char *tj = tern_bytelevel_tokenizer_json(k_specials, 8, NULL, 0, "<bos>"), *tc = tokenizer_config_json();
    tern_status s = (!tj || !tc) ? tern_err(err, TERN_ENOMEM, "out of memory") : TERN_OK;
    if (!s) s = write_text(dir, "config.json", k_config, err);
    if (!s) s = write_text(dir, "generation_config.json", k_gen_config, err);
    if (!s) s = write_text(dir, "tokenizer.json", tj, err);
    if (!s) s = write_text(dir, "tokenizer_config.json", tc, err);
    free(tj);
    free(tc);
    if (!s) s = write_weights(marker, err);
    return s;
}

tern_status tern_model_path_resolve(const char *model, char *buf, size_t n, tern_error *err) {
    if (model && strcmp(model, "demo")) {
        if (strlen(model) >= n) return tern_err(err, TERN_EINVAL, "model path too long");
        snprintf(buf, n, "%s", model);
        return TERN_OK;
    }
    const char *base = getenv("TERN_CACHE");
    char root[3800];
    if (base && *base) snprintf(root, sizeof root, "%s", base);
    else if ((base = getenv("XDG_CACHE_HOME")) && *base) snprintf(root, sizeof root, "%s/tern", base);
    else if ((base = getenv("HOME")) && *base) snprintf(root, sizeof root, "%s/.cache/tern", base);
    else snprintf(root, sizeof root, "/tmp/tern-cache-%d", (int)getuid());
    snprintf(buf, n, "%s/" DEMO_VERSION, root);
    tern_status s = materialize(buf, err);
    if (s && strncmp(root, "/tmp/", 5)) { /* unwritable cache: fall back to /tmp */
        snprintf(buf, n, "/tmp/tern-cache-%d/" DEMO_VERSION, (int)getuid());
        s = materialize(buf, err);
    }
    return s;
}
