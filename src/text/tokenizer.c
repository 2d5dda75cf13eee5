/*
 * tokenizer.c — loading a tokenizer.json (+ tokenizer_config.json, special_tokens_map.json)
 * into the tables the pipeline uses, lookups, and free.
 *
 * Load steps: the streaming scanner (tokenizer_json.c) reads model.vocab and model.merges
 * straight from the bytes and cJSON parses the small rest; model (must be BPE: vocab object,
 * merges as "a b" strings or ["a","b"] pairs; each merge needs a, b and a+b in the vocab,
 * else the file is malformed — HF refuses it too), added tokens (ids may lie
 * outside the model vocab), normalizer / pre-tokenizer / post-processor / decoder (each
 * parsed into a small tree; unknown types → TERN_EUNSUPPORTED naming them).
 * The id → string table prefers an added token's content (its normalized form for
 * normalized:true tokens), like HF's decode. BOS/EOS come from tokenizer_config.json
 * (strings or {"content": ...} objects), else special_tokens_map.json.
 */
#include "text/tokenizer_int.h"

#include "base/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_ID (1 << 24) /* real vocabularies are < 300k; a larger id is a corrupt file, not a table to allocate */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    struct stat sb;
    if (!fstat(fileno(f), &sb) && S_ISREG(sb.st_mode) && sb.st_size > 0 && (uint64_t)sb.st_size < SIZE_MAX / 2) {
        cap = (size_t)sb.st_size + 65536 + 2; /* one read, no regrowth (the loop still handles a growing file) */
        if (!(buf = malloc(cap))) { fclose(f); return NULL; }
    }
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t c = cap ? cap * 2 : 1 << 20;
            char *p = realloc(buf, c);
            if (!p) { free(buf); fclose(f); return NULL; }
            buf = p;
            cap = c;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

static const char *token_str(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static int get_flag(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
}

static tern_status load_model(tern_tokenizer *tok, const cJSON *m, const char *js, const tk_jspan *vs,
                              const tk_jspan *ms, tern_error *err) {
    tk_bpe *b = &tok->bpe;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (cJSON_IsString(ty) && strcmp(ty->valuestring, "BPE"))
        return tern_err(err, TERN_EUNSUPPORTED, "%s: model type '%s' not supported (only BPE)", tok->name, ty->valuestring);
    if (!cJSON_IsObject(m) || !vs->len || !ms->len)
        return tern_err(err, TERN_EFORMAT, "%s: model needs a 'vocab' object and a 'merges' array", tok->name);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return tern_err(err, TERN_EUNSUPPORTED, "%s: BPE dropout %g not supported", tok->name, dropout->valuedouble);
    b->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "fuse_unk"));
    b->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "byte_fallback"));
    b->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "ignore_merges"));
    const cJSON *cp = cJSON_GetObjectItemCaseSensitive(m, "continuing_subword_prefix");
    const cJSON *ew = cJSON_GetObjectItemCaseSensitive(m, "end_of_word_suffix");
    if (cJSON_IsString(cp) && cp->valuestring[0]) { b->cont_prefix = strdup(cp->valuestring); b->cont_len = strlen(cp->valuestring); }
    if (cJSON_IsString(ew) && ew->valuestring[0]) { b->eow_suffix = strdup(ew->valuestring); b->eow_len = strlen(ew->valuestring); }
    if ((b->cont_len && !b->cont_prefix) || (b->eow_len && !b->eow_suffix)) return tern_err(err, TERN_ENOMEM, "out of memory");
    tern_status st = tk_json_vocab(tok, js + vs->off, vs->len, err);
    if (!st) st = tk_json_merges(tok, js + ms->off, ms->len, err);
    if (st) return st;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    b->unk_id = -1;
    if (cJSON_IsString(unk)) {
        b->unk_id = tk_strmap_get(&b->vocab, unk->valuestring, strlen(unk->valuestring));
        if (b->unk_id < 0) tern_log(TERN_LOG_WARN, "%s: unk_token '%s' not in vocab; unknown characters are dropped", tok->name, unk->valuestring);
    }
    for (int i = 0; i < 256; i++) {
        char hx[8];
        snprintf(hx, sizeof hx, "<0x%02X>", i);
        b->byte_id[i] = tk_strmap_get(&b->vocab, hx, 6);
    }
    return TERN_OK;
}

/* one entry of added_tokens into tok->added[n_added] and the added map; nb: scratch for its normalized text */
static tern_status add_one(tern_tokenizer *tok, const cJSON *j, tk_buf *nb, tern_error *err) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id"), *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= MAX_ID || !cJSON_IsString(c))
        return tern_err(err, TERN_EFORMAT, "%s: added token %zu needs 'id' and 'content'", tok->name, tok->n_added);
    if (!c->valuestring[0]) return TERN_OK; /* HF ignores empty added tokens */
    tk_added *a = &tok->added[tok->n_added];
    a->id = (int32_t)id->valuedouble;
    a->len = strlen(c->valuestring);
    a->content = strdup(c->valuestring);
    a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "special"));
    a->normalized = get_flag(j, "normalized") == 1 || (get_flag(j, "normalized") < 0 && !a->special);
    a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "lstrip"));
    a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "rstrip"));
    a->single_word = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "single_word"));
    if (!a->content) return tern_err(err, TERN_ENOMEM, "out of memory");
    tok->n_added++;
    if (a->normalized && tok->has_norm) {
        if (tk_norm_apply(&tok->norm, a->content, a->len, nb)) return tern_err(err, TERN_ENOMEM, "out of memory");
        a->norm = malloc(nb->n + 1);
        if (!a->norm) return tern_err(err, TERN_ENOMEM, "out of memory");
        memcpy(a->norm, nb->p, nb->n + 1);
        a->norm_len = nb->n;
    }
    if (tk_strmap_put(&tok->added_map, a->content, a->len, a->id)) return tern_err(err, TERN_ENOMEM, "out of memory");
    return TERN_OK;
}

static tern_status load_added(tern_tokenizer *tok, const cJSON *arr, tern_error *err) {
    if (!arr || cJSON_IsNull(arr)) return TERN_OK;
    if (!cJSON_IsArray(arr)) return tern_err(err, TERN_EFORMAT, "%s: 'added_tokens' must be an array", tok->name);
    tok->added = calloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof *tok->added);
    if (!tok->added) return tern_err(err, TERN_ENOMEM, "out of memory");
    const cJSON *j;
    tk_buf nb = {0};
    tern_status st = TERN_OK;
    cJSON_ArrayForEach(j, arr) {
        if ((st = add_one(tok, j, &nb, err))) break;
    }
    tk_buf_free(&nb); /* on every path: an entry's error may follow an earlier one's normalized text (fuzzed) */
    if (st) return st;
    for (size_t i = 0; i < tok->n_added; i++) {
        tk_added *a = &tok->added[i];
        int rc = a->normalized ? tk_trie_add(&tok->trie_norm, a->norm ? a->norm : a->content, a->norm ? a->norm_len : a->len, (int32_t)i)
                               : tk_trie_add(&tok->trie_raw, a->content, a->len, (int32_t)i);
        if (a->special) { /* the injection guard escapes these (tokenizer_guard.c) */
            unsigned char c0 = (unsigned char)a->content[0];
            tok->esc_first[c0 >> 3] |= (uint8_t)(1u << (c0 & 7));
            rc = rc || tk_trie_add(&tok->trie_esc, a->content, a->len, (int32_t)i);
        }
        if (rc) return tern_err(err, TERN_ENOMEM, "out of memory");
    }
    return TERN_OK;
}

static tern_status build_id_table(tern_tokenizer *tok, tern_error *err) {
    const tk_strmap *v = &tok->bpe.vocab;
    size_t n = 0;
    for (size_t i = 0; i < v->n; i++) n = TERN_MAX(n, (size_t)v->e[i].val + 1);
    for (size_t i = 0; i < tok->n_added; i++) n = TERN_MAX(n, (size_t)tok->added[i].id + 1);
    /* the post-processor's ids too: every id encode can emit has a slot (a token-less one decodes to nothing) */
    for (size_t i = 0; i < tok->n_post_pre; i++) n = TERN_MAX(n, (size_t)tok->post_pre[i] + 1);
    for (size_t i = 0; i < tok->n_post_suf; i++) n = TERN_MAX(n, (size_t)tok->post_suf[i] + 1);
    tok->n_ids = n;
    tok->id_off = malloc((n + 1) * sizeof *tok->id_off);
    tok->id_len = calloc(n + 1, sizeof *tok->id_len);
    tok->id_special = calloc(n + 1, 1);
    if (!tok->id_off || !tok->id_len || !tok->id_special) return tern_err(err, TERN_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) tok->id_off[i] = SIZE_MAX;
    for (size_t i = 0; i < v->n; i++) {
        tok->id_off[v->e[i].val] = tok->id_text.n;
        tok->id_len[v->e[i].val] = v->e[i].klen;
        if (tk_buf_put(&tok->id_text, v->keys.p + v->e[i].koff, v->e[i].klen) || tk_buf_put(&tok->id_text, "", 1))
            return tern_err(err, TERN_ENOMEM, "out of memory");
    }
    tk_strmap special = {0};
    for (size_t i = 0; i < tok->n_added; i++) {
        const tk_added *a = &tok->added[i];
        const char *s = a->norm ? a->norm : a->content;
        size_t l = a->norm ? a->norm_len : a->len;
        tok->id_off[a->id] = tok->id_text.n;
        tok->id_len[a->id] = (uint32_t)l;
        if (tk_buf_put(&tok->id_text, s, l) || tk_buf_put(&tok->id_text, "", 1) ||
            (a->special && tk_strmap_put(&special, a->content, a->len, 1))) {
            tk_strmap_free(&special);
            return tern_err(err, TERN_ENOMEM, "out of memory");
        }
    }
    for (size_t i = 0; i < n && special.n; i++)
        if (tok->id_off[i] != SIZE_MAX) tok->id_special[i] = tk_strmap_get(&special, tok->id_text.p + tok->id_off[i], tok->id_len[i]) >= 0;
    tk_strmap_free(&special);
    return TERN_OK;
}

static void load_config(tern_tokenizer *tok, const cJSON *cfg, bool fill_only) {
    if (!cfg) return;
    const char *bos = token_str(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
    const char *eos = token_str(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    if (bos && (!fill_only || tok->bos_id < 0)) tok->bos_id = tern_tokenizer_token_to_id(tok, bos, strlen(bos));
    if (eos && (!fill_only || tok->eos_id < 0)) tok->eos_id = tern_tokenizer_token_to_id(tok, eos, strlen(eos));
    if (!fill_only) {
        tok->add_bos = get_flag(cfg, "add_bos_token");
        tok->add_eos = get_flag(cfg, "add_eos_token");
    }
}

tern_status tern_tokenizer_load_json(tern_tokenizer **out, const char *json, size_t len, const char *config_json,
                                     const char *name, tern_error *err) {
    *out = NULL;
    tern_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return tern_err(err, TERN_ENOMEM, "out of memory");
    pthread_mutex_init(&tok->bpe.mu, NULL);
    tok->bos_id = tok->eos_id = -1;
    tok->add_bos = tok->add_eos = -1;
    tok->name = strdup(name ? name : "tokenizer.json");
    /* model.vocab / model.merges are read by the streaming scanner (tokenizer_json.c);
     * cJSON parses the rest of the file with those two values emptied */
    tk_jspan vs, ms;
    char *rest = NULL;
    size_t rest_n = 0;
    cJSON *root = NULL;
    tern_status st = TERN_OK;
    size_t bad = len;
    if (!tok->name) st = tern_err(err, TERN_ENOMEM, "out of memory");
    else if ((bad = tk_utf8_invalid_at(json, len)) < len) /* JSON is UTF-8 (HF's loader refuses the rest too); the */
        st = tern_err(err, TERN_EFORMAT, "%s: not valid UTF-8 at byte %zu", tok->name, bad); /* regexes rely on it */
    else st = tk_json_split(json, len, &vs, &ms, &rest, &rest_n, tok->name, err);
    if (!st) {
        root = cJSON_ParseWithLength(rest, rest_n);
        free(rest);
        if (!cJSON_IsObject(root)) st = tern_err(err, TERN_EFORMAT, "%s: not a JSON object", tok->name);
    }
    const cJSON *j;
    if (!st) st = load_model(tok, cJSON_GetObjectItemCaseSensitive(root, "model"), json, &vs, &ms, err);
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "normalizer")) && !cJSON_IsNull(j)) {
        tok->has_norm = true;
        st = tk_norm_parse(&tok->norm, j, err);
    }
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")) && !cJSON_IsNull(j)) {
        tok->has_pretok = true;
        st = tk_pretok_parse(&tok->pretok, j, err);
    }
    if (!st && (j = cJSON_GetObjectItemCaseSensitive(root, "decoder")) && !cJSON_IsNull(j)) {
        tok->has_dec = true;
        st = tk_dec_parse(&tok->dec, j, err);
    }
    if (!st) st = tk_post_parse(tok, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err);
    if (!st) st = load_added(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err);
    if (!st) st = build_id_table(tok, err);
    cJSON_Delete(root);
    if (!st && config_json) {
        cJSON *cfg = cJSON_Parse(config_json);
        if (!cfg) st = tern_err(err, TERN_EFORMAT, "%s: tokenizer_config.json is not valid JSON", tok->name);
        load_config(tok, cfg, false);
        cJSON_Delete(cfg);
    }
    if (st) {
        if (err && st != TERN_ENOMEM && strncmp(err->msg, tok->name, strlen(tok->name)))
            tern_err_wrap(err, st, "%s", tok->name);
        tern_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return TERN_OK;
}

tern_status tern_tokenizer_load(tern_tokenizer **out, const char *path, tern_error *err) {
    *out = NULL;
    if (!path) return tern_err(err, TERN_EINVAL, "tokenizer: no path");
    struct stat sb;
    if (stat(path, &sb)) return tern_err(err, TERN_EIO, "%s: cannot open", path);
    size_t pl = strlen(path);
    char *dir = malloc(pl + 64), *file = malloc(pl + 64);
    if (!dir || !file) { free(dir); free(file); return tern_err(err, TERN_ENOMEM, "out of memory"); }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, pl + 64, "%s", path);
        snprintf(file, pl + 64, "%s/tokenizer.json", path);
    } else {
        snprintf(file, pl + 64, "%s", path);
        snprintf(dir, pl + 64, "%s", path);
        char *sl = strrchr(dir, '/');
        if (sl) *sl = 0; else snprintf(dir, pl + 64, ".");
    }
    size_t cl = 0, ml = 0;
    tern_map jm = {0}; /* mapped, not read: the scanner and cJSON take lengths, and no 33 MB copy */
    tern_error me = {0};
    tern_status st = tern_map_open(&jm, file, &me);
    if (st) st = tern_err(err, TERN_EIO, "%s (a model folder needs tokenizer.json)", me.msg);
    char *cfgpath = malloc(pl + 64);
    char *cfg = NULL, *map = NULL;
    if (!st && cfgpath) {
        snprintf(cfgpath, pl + 64, "%s/tokenizer_config.json", dir);
        cfg = read_file(cfgpath, &cl);
        snprintf(cfgpath, pl + 64, "%s/special_tokens_map.json", dir);
        map = read_file(cfgpath, &ml);
    }
    if (!st) st = tern_tokenizer_load_json(out, jm.data ? jm.data : "", jm.size, cfg, file, err);
    if (!st && map) {
        cJSON *m = cJSON_Parse(map);
        load_config(*out, m, true); /* fills bos/eos only where the config left them unset */
        cJSON_Delete(m);
    }
    tern_map_close(&jm);
    free(cfg);
    free(map);
    free(cfgpath);
    free(dir);
    free(file);
    return st;
}

void tern_tokenizer_free(tern_tokenizer *tok) {
    if (!tok) return;
    tk_bpe_free(&tok->bpe);
    tk_buf_free(&tok->id_text);
    free(tok->id_off);
    free(tok->id_len);
    free(tok->id_special);
    for (size_t i = 0; i < tok->n_added; i++) { free(tok->added[i].content); free(tok->added[i].norm); }
    free(tok->added);
    tk_strmap_free(&tok->added_map);
    tk_trie_free(&tok->trie_raw);
    tk_trie_free(&tok->trie_norm);
    tk_trie_free(&tok->trie_esc);
    if (tok->has_norm) tk_norm_free(&tok->norm);
    if (tok->has_pretok) tk_pretok_free(&tok->pretok);
    if (tok->has_dec) tk_dec_free(&tok->dec);
    free(tok->post_pre);
    free(tok->post_suf);
    free(tok->name);
    free(tok);
}

size_t tern_tokenizer_vocab_size(const tern_tokenizer *tok) { return tok ? tok->n_ids : 0; }
int32_t tern_tokenizer_bos_id(const tern_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t tern_tokenizer_eos_id(const tern_tokenizer *tok) { return tok ? tok->eos_id : -1; }
int tern_tokenizer_add_bos(const tern_tokenizer *tok) { return tok ? tok->add_bos : -1; }
int tern_tokenizer_add_eos(const tern_tokenizer *tok) { return tok ? tok->add_eos : -1; }

int32_t tern_tokenizer_token_to_id(const tern_tokenizer *tok, const char *s, size_t len) {
    if (!tok || !s) return -1;
    int32_t id = tk_strmap_get(&tok->added_map, s, len);
    return id >= 0 ? id : tk_strmap_get(&tok->bpe.vocab, s, len);
}

const char *tern_tokenizer_id_to_token(const tern_tokenizer *tok, int32_t id, size_t *len) {
    if (!tok || id < 0 || (size_t)id >= tok->n_ids || tok->id_off[id] == SIZE_MAX) return NULL;
    if (len) *len = tok->id_len[id];
    return tok->id_text.p + tok->id_off[id];
}

int tern_tokenizer_is_special(const tern_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && (size_t)id < tok->n_ids && tok->id_special[id];
}
