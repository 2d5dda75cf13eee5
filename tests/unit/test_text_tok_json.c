/* test_text_tok_json.c — the streaming reader of model.vocab / model.merges
 * (src/text/tokenizer_json.c): JSON string escapes (\uXXXX with surrogate pairs, \n \" \\ \/),
 * key order, escaped keys, whitespace, both merge forms; malformed input (every truncation
 * of a valid file, lone surrogates, bad ids) is an error, never a crash; and the real files
 * load with the same tables as a reference built from cJSON (when fetched). */
#include "test.h"
#include "base/base.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>

static tern_tokenizer *load(const char *json, size_t n, tern_error *e) {
    tern_tokenizer *t = NULL;
    tern_tokenizer_load_json(&t, json, n, NULL, "j.json", e);
    return t;
}

static int32_t tid(const tern_tokenizer *t, const char *s) { return tern_tokenizer_token_to_id(t, s, strlen(s)); }

TEST(escapes_and_layout) {
    /* merges before vocab, escaped "model" and "vocab" keys, odd whitespace, every escape */
    const char *j =
        "{ \"added_tokens\" : [ ] ,\n\t\"mod\\u0065l\":{\"merges\" : [ [\"a\", \"\\\"\"], \"\\\\ \\/\", [\"\\ud83d\\ude00\",\"\\n\"] ],"
        " \"type\":\"BPE\", \"v\\u006fcab\" :{ \"a\":0, \"\\\"\":1 , \"a\\\"\":2,\"\\\\\":3,\"/\":4,\"\\\\/\":5,"
        "\"\\ud83d\\ude00\":6,\"\\n\":7,\"\\ud83d\\ude00\\n\":8, \"\\u00e9\\t\\b\\f\\r\" : 9 } } , \"decoder\":null }";
    tern_error e = {0};
    tern_tokenizer *t = load(j, strlen(j), &e);
    CHECK(t, "load: %s", e.msg);
    if (!t) return;
    CHECK(tid(t, "\"") == 1 && tid(t, "a\"") == 2 && tid(t, "\\") == 3 && tid(t, "/") == 4 && tid(t, "\\/") == 5, "escapes");
    CHECK(tid(t, "\xF0\x9F\x98\x80") == 6 && tid(t, "\xF0\x9F\x98\x80\n") == 8, "surrogate pair");
    CHECK(tid(t, "\xC3\xA9\t\b\f\r") == 9, "control escapes");
    int32_t *ids;
    size_t n;
    CHECK(!tern_tokenizer_encode(t, "a\"\\/\xF0\x9F\x98\x80\n", 10, 0, 1, &ids, &n, &e) && n == 3 && ids[0] == 2 && ids[1] == 5 &&
              ids[2] == 8, "merges applied (n=%zu)", n);
    free(ids);
    tern_tokenizer_free(t);
    /* a NUL inside a key (\u0000) stays part of the key */
    const char *z = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\\u0000b\":0,\"a\":1},\"merges\":[]}}";
    t = load(z, strlen(z), &e);
    CHECK(t && tern_tokenizer_token_to_id(t, "a\0b", 3) == 0 && tid(t, "a") == 1, "NUL in key: %s", e.msg);
    tern_tokenizer_free(t);
}

/* an empty vocab key stored twice (the later id wins, as in a JSON object) must not touch the key stored after it:
 * the id table (vocab size, id → token) agrees with lookups (fuzzed: "" shared its offset with the next key) */
TEST(empty_key_twice) {
    const char *j = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"\":1,\"ab\":712,\"b\":3,\"\":2},"
                    "\"merges\":[[\"a\",\"b\"]]}}";
    tern_error e = {0};
    tern_tokenizer *t = load(j, strlen(j), &e);
    CHECK(t, "load: %s", e.msg);
    if (!t) return;
    size_t n = 0;
    const char *s = tern_tokenizer_id_to_token(t, 712, &n);
    CHECK(tid(t, "ab") == 712 && tern_tokenizer_vocab_size(t) == 713 && s && n == 2 && !memcmp(s, "ab", 2),
          "ab: id %d, vocab %zu", tid(t, "ab"), tern_tokenizer_vocab_size(t));
    CHECK(tern_tokenizer_token_to_id(t, "", 0) == 2, "empty key: %d", tern_tokenizer_token_to_id(t, "", 0));
    tern_tokenizer_free(t);
}

TEST(malformed_never_crashes) {
    const char *good = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u00e9\":3},"
                       "\"merges\":[\"a b\",[\"a\",\"b\"]]},\"added_tokens\":[{\"id\":4,\"content\":\"<s>\",\"special\":true}]}";
    tern_error e = {0};
    tern_tokenizer *t = load(good, strlen(good), &e);
    CHECK(t, "good: %s", e.msg);
    tern_tokenizer_free(t);
    /* every truncation (a copy of exactly that length, so reads past the end are caught by ASan/valgrind) */
    int loaded = 0;
    for (size_t n = 0; n < strlen(good); n++) {
        char *cut = malloc(n ? n : 1);
        memcpy(cut, good, n);
        tern_error e2 = {0};
        t = load(cut, n, &e2);
        loaded += t != NULL;
        CHECK(t || e2.msg[0], "truncation %zu: no message", n);
        tern_tokenizer_free(t);
        free(cut);
    }
    CHECK(!loaded, "%d truncated files loaded", loaded);
    const char *bad[][2] = {
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\ud83d\":0},\"merges\":[]}}", "malformed"},        /* lone high */
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\ude00x\":0},\"merges\":[]}}", "malformed"},       /* lone low */
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\q\":0},\"merges\":[]}}", "malformed"},            /* bad escape */
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u12\":0},\"merges\":[]}}", "malformed"},          /* short \\u */
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999},\"merges\":[]}}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", "neither"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}}", "neither"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a\"]}}", "missing from the vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", "needs a 'vocab' object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}", "needs a 'vocab' object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"x\":[}", "not a JSON object"},
        {"[1,2]", "not a JSON object"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(bad); i++) {
        tern_error e3 = {0};
        t = load(bad[i][0], strlen(bad[i][0]), &e3);
        CHECK(!t && strstr(e3.msg, bad[i][1]), "case %zu: '%s'", i, e3.msg);
        tern_tokenizer_free(t);
    }
}

/* The real files: every vocab entry (as cJSON reads it) maps to its id. */
TEST(real_files_match_cjson) {
    const char *names[] = {"gemma3", "qwen3", "llama3", "llama2", "deepseek_v3"};
    for (size_t k = 0; k < TERN_ARRAY_LEN(names); k++) {
        char p[256];
        snprintf(p, sizeof p, "build/tokenizers/%s/tokenizer.json", names[k]);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = malloc((size_t)n + 1);
        size_t got = fread(buf, 1, (size_t)n, f);
        fclose(f);
        buf[got] = 0;
        tern_tokenizer *t = NULL;
        tern_error e = {0};
        CHECK(!tern_tokenizer_load(&t, p, &e), "%s: %s", names[k], e.msg);
        cJSON *root = cJSON_ParseWithLength(buf, got);
        const cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "vocab"), *v;
        size_t bad = 0, total = 0;
        cJSON_ArrayForEach(v, vocab) {
            total++;
            if (tern_tokenizer_token_to_id(t, v->string, strlen(v->string)) != (int32_t)v->valuedouble) bad++;
        }
        CHECK(t && total && !bad, "%s: %zu of %zu vocab entries missing", names[k], bad, total);
        cJSON_Delete(root);
        free(buf);
        tern_tokenizer_free(t);
    }
}

int main(void) {
    RUN(escapes_and_layout);
    RUN(empty_key_twice);
    RUN(malformed_never_crashes);
    struct stat sb;
    if (!stat("build/tokenizers", &sb)) RUN(real_files_match_cjson);
    else SKIP("real_files_match_cjson", "no tokenizer files under build/tokenizers (run scripts/fetch_tokenizers.sh)");
    return test_done();
}
