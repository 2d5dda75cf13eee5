/*
 * test_server_jsonfsm.c — the JSON grammar / automaton / token mask of src/server/jsonfsm.c.
 *
 * 1. Byte-level acceptance: valid documents are accepted and complete, invalid ones are
 *    refused at the first bad byte, for json_object mode and for schemas.
 * 2. Random constrained walks: a vocabulary of single bytes plus multi-byte pieces, random
 *    logits, mask, pick; every finished output parses with cJSON and matches the schema.
 * 3. Cost: one mask on a synthetic 262,144-token vocabulary (Gemma size) with the state
 *    inside a string (the worst case: nearly every token allowed) — printed, and bounded.
 */
#include "test.h"

#include "base/base.h"
#include "server/jsonfsm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv_jgram *gram(const char *schema) {
    cJSON *s = schema ? cJSON_Parse(schema) : NULL;
    srv_jgram *g = NULL;
    tern_error e = {0};
    tern_status st = srv_jgram_compile(s, &g, &e);
    if (st) printf("# compile: %s\n", e.msg);
    cJSON_Delete(s);
    return g;
}

/* vocabulary: 0 = EOS (no bytes), 1..256 = bytes, then some multi-byte pieces */
static const char *k_pieces[] = {"{\"", "\":", "\",\"", "\"}", "true", "false", "null", "12", "[1,", "]}", "name",
                                 "age", "\"name\":\"", "  ", "\n", "}\n", "abc", "\xC3\xA9", "\\u00e9", "-0.5e3"};
#define NP (int)(sizeof k_pieces / sizeof k_pieces[0])

static srv_jvocab *small_vocab(void) {
    int n = 257 + NP;
    const char **t = calloc((size_t)n, sizeof *t);
    size_t *l = calloc((size_t)n, sizeof *l);
    static char bytes[256];
    for (int b = 0; b < 256; b++) { bytes[b] = (char)b; t[1 + b] = &bytes[b]; l[1 + b] = 1; }
    for (int i = 0; i < NP; i++) { t[257 + i] = k_pieces[i]; l[257 + i] = strlen(k_pieces[i]); }
    int eos = 0;
    srv_jvocab *v = NULL;
    tern_error e = {0};
    if (srv_jvocab_from_bytes(t, l, n, &eos, 1, &v, &e)) printf("# vocab: %s\n", e.msg);
    free(t);
    free(l);
    return v;
}

static int accepts(srv_jgram *g, srv_jvocab *v, const char *text, int want_complete) {
    srv_jmatch *m = NULL;
    if (srv_jmatch_new(g, v, &m, NULL)) return 0;
    int ok = srv_jmatch_feed(m, text, strlen(text)) == 0 && srv_jmatch_complete(m) == want_complete;
    srv_jmatch_free(m);
    return ok;
}

TEST(json_object_accepts) {
    srv_jvocab *v = small_vocab();
    srv_jgram *g = gram(NULL);
    CHECK(g && v, "%s", "");
    CHECK(accepts(g, v, "{}", 1), "%s", "");
    CHECK(accepts(g, v, " {\"a\": [1, -2.5e+3, true, null, \"x\\u00e9\\n\"], \"b\": {}}", 1), "%s", "");
    CHECK(accepts(g, v, "{\"a\": 1", 0), "%s", "");
    CHECK(accepts(g, v, "{\"\xC3\xA9\": \"\xE2\x9C\x93\"}", 1), "%s", "");
    CHECK(!accepts(g, v, "[1]", 0) && !accepts(g, v, "[1]", 1), "%s", "");          /* top level must be an object */
    const char *bad[] = {"{,", "{\"a\" 1}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":tru}", "{\"a\":\"\x01\"}",
                         "{\"a\":\"\\x\"}", "{\"a\":\"\xC0\xAF\"}", "{} {}", "{\"a\":1}}", "{\"a\":-}", "{\"a\":1.}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        srv_jmatch *m = NULL;
        srv_jmatch_new(g, v, &m, NULL);
        CHECK(srv_jmatch_feed(m, bad[i], strlen(bad[i])) == -1 || !srv_jmatch_complete(m), "%s", "");
        srv_jmatch_free(m);
    }
    CHECK(!accepts(g, v, "{}         ", 1), "%s", "");                              /* whitespace run capped */
    /* numbers stop at 24 bytes, and a byte that needs another after it (e, ., -, e+) is refused at byte 24, so the
     * mask never runs dry (fuzzed: "13.5...7e" at 24 bytes left no token allowed) */
    CHECK(accepts(g, v, "{\"a\":13.50735185176777117777}", 1), "%s", "");             /* 23 bytes */
    CHECK(!accepts(g, v, "{\"a\":13.50735185176777117777e", 0), "%s", "");             /* e as byte 24 */
    CHECK(accepts(g, v, "{\"a\":13.507351851767771177778}", 1), "%s", "");            /* digit as byte 24 */
    {
        srv_jmatch *m = NULL;
        srv_jmatch_new(g, v, &m, NULL);
        const char *t23 = "{\"a\":13.50735185176777117777";
        CHECK(srv_jmatch_feed(m, t23, strlen(t23)) == 0, "%s", "");
        float lg[300];
        for (int i = 0; i < 300; i++) lg[i] = 0.0f;
        CHECK(srv_jmatch_mask(m, lg, 257 + NP) == 0 && lg[1 + 'e'] == -INFINITY && lg[1 + '7'] == 0.0f, "%s", "");
        srv_jmatch_free(m);
    }
    srv_jgram_free(g);
    srv_jvocab_free(v);
}

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3]}},\"ok\":{\"type\":[\"boolean\",\"null\"]},"
    "\"pos\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},\"required\":[\"x\"],"
    "\"additionalProperties\":false}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

TEST(json_schema_accepts) {
    srv_jvocab *v = small_vocab();
    srv_jgram *g = gram(k_schema);
    CHECK(g != NULL, "%s", "");
    CHECK(accepts(g, v, "{\"name\":\"x\",\"age\":3}", 1), "%s", "");
    CHECK(accepts(g, v, "{\"age\": -3, \"name\": \"\", \"tags\": [\"a\", 3, \"b\"], \"ok\": null, \"pos\": {\"x\": 1.5}}", 1), "%s", "");
    CHECK(accepts(g, v, "{\"name\":\"x\"", 0), "%s", "");
    srv_jmatch *m = NULL;
    const char *bad[] = {"{\"name\":\"x\"}", "{\"age\":1.5", "{\"nam\":", "{\"name\":1", "{\"name\":\"x\",\"name\"",
                         "{\"tags\":[\"c\"", "{\"tags\":[33", "{\"pos\":{}", "{\"ok\":\"\"", "{\"extra\":1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        srv_jmatch_new(g, v, &m, NULL);
        int r = srv_jmatch_feed(m, bad[i], strlen(bad[i]));
        if (r != -1) printf("# accepted bad[%zu]: %s\n", i, bad[i]);
        CHECK(r == -1, "%s", "");
        srv_jmatch_free(m);
    }
    srv_jgram_free(g);
    /* scalar root, enum root */
    g = gram("{\"type\":\"integer\"}");
    CHECK(accepts(g, v, "42", 1) && accepts(g, v, "-", 0) && !accepts(g, v, "4.2", 1), "%s", "");
    srv_jgram_free(g);
    g = gram("{\"enum\":[\"red\",\"green\",12,1]}");
    CHECK(accepts(g, v, "\"green\"", 1) && accepts(g, v, "1", 1) && accepts(g, v, "12", 1) && !accepts(g, v, "\"blue\"", 1), "%s", "");
    srv_jgram_free(g);
    /* refused keywords name themselves */
    cJSON *s = cJSON_Parse("{\"anyOf\":[{\"type\":\"string\"}]}");
    tern_error e = {0};
    srv_jgram *x = NULL;
    CHECK(srv_jgram_compile(s, &x, &e) == TERN_EINVAL && strstr(e.msg, "anyOf"), "%s", "");
    cJSON_Delete(s);
    srv_jvocab_free(v);
}

static uint64_t rng = 0x1234567;
static double urand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Check a parsed value against the test schema (the subset used above). */
static int matches(const cJSON *o) {
    if (!cJSON_IsObject(o)) return 0;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name"), *a = cJSON_GetObjectItemCaseSensitive(o, "age");
    if (!cJSON_IsString(n) || !cJSON_IsNumber(a) || a->valuedouble != floor(a->valuedouble)) return 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, o) {
        const char *k = x->string;
        if (!strcmp(k, "tags")) {
            if (!cJSON_IsArray(x)) return 0;
            const cJSON *t;
            cJSON_ArrayForEach(t, x) if (!(cJSON_IsString(t) && (!strcmp(t->valuestring, "a") || !strcmp(t->valuestring, "b"))) &&
                                         !(cJSON_IsNumber(t) && t->valuedouble == 3)) return 0;
        } else if (!strcmp(k, "ok")) { if (!cJSON_IsBool(x) && !cJSON_IsNull(x)) return 0; }
        else if (!strcmp(k, "pos")) {
            if (!cJSON_IsObject(x) || cJSON_GetArraySize(x) != 1 || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(x, "x"))) return 0;
        } else if (strcmp(k, "name") && strcmp(k, "age")) return 0;
    }
    return 1;
}

TEST(json_random_walks_parse) {
    srv_jvocab *v = small_vocab();
    const char *schemas[] = {NULL, k_schema};
    int n_vocab = 257 + NP, finished = 0;
    float *lg = malloc(sizeof(float) * (size_t)n_vocab);
    for (int sc = 0; sc < 2; sc++) {
        srv_jgram *g = gram(schemas[sc]);
        for (int run = 0; run < 200; run++) {
            srv_jmatch *m = NULL;
            srv_jmatch_new(g, v, &m, NULL);
            char out[4096];
            size_t len = 0;
            int ended = 0;
            for (int step = 0; step < 600 && !ended; step++) {
                for (int i = 0; i < n_vocab; i++) lg[i] = (float)urand();
                lg[0] = 0.95f;                                /* EOS likely once allowed */
                lg['"' + 1] += 0.3f;                          /* close strings now and then */
                if (srv_jmatch_mask(m, lg, n_vocab)) { CHECK(0, "%s", "mask failed"); break; }
                int best = -1;
                for (int i = 0; i < n_vocab; i++) if (lg[i] > -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
                CHECK(best >= 0, "%s", "");
                if (best == 0) { CHECK(srv_jmatch_complete(m), "%s", "eos early"); ended = 1; break; }
                const char *t = best <= 256 ? NULL : k_pieces[best - 257];
                char b = (char)(best - 1);
                size_t l = t ? strlen(t) : 1;
                if (len + l >= sizeof out) break;
                memcpy(out + len, t ? t : &b, l);
                len += l;
                CHECK(srv_jmatch_accept(m, best) == 0, "%s", "");
            }
            out[len] = 0;
            if (ended) {
                finished++;
                cJSON *j = cJSON_ParseWithLength(out, len);
                if (!j || !(sc == 0 ? cJSON_IsObject(j) : matches(j))) printf("# bad output (%d): %s\n", sc, out);
                CHECK(j != NULL, "%s", "");
                CHECK(sc == 0 ? cJSON_IsObject(j) : matches(j), "%s", "");
                cJSON_Delete(j);
            }
            srv_jmatch_free(m);
        }
        srv_jgram_free(g);
    }
    printf("# %d of 400 random walks finished\n", finished);
    CHECK(finished > 200, "%s", "");
    free(lg);
    srv_jvocab_free(v);
}

TEST(json_mask_cost_262k) {
    int n = 262144;
    char **t = malloc(sizeof(char *) * (size_t)n);
    size_t *l = malloc(sizeof(size_t) * (size_t)n);
    uint64_t r = 99;
    for (int i = 0; i < n; i++) {                    /* word-like pieces: 1..12 bytes, mostly letters */
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int len = 1 + (int)((r >> 33) % 12);
        t[i] = malloc((size_t)len);
        for (int k = 0; k < len; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int x = (int)((r >> 35) % 40);
            t[i][k] = x < 26 ? (char)('a' + x) : x < 30 ? ' ' : x < 32 ? '"' : x < 34 ? ',' : x < 36 ? (char)('0' + x % 10) : ':';
        }
        l[i] = (size_t)len;
    }
    int eos = 1;
    l[eos] = 0;
    srv_jvocab *v = NULL;
    double t0 = tern_time_s();
    CHECK(srv_jvocab_from_bytes((const char *const *)t, l, n, &eos, 1, &v, NULL) == TERN_OK, "%s", "");
    double t_build = tern_time_s() - t0;
    srv_jgram *g = gram(NULL);
    srv_jmatch *m = NULL;
    srv_jmatch_new(g, v, &m, NULL);
    CHECK(srv_jmatch_feed(m, "{\"key\": \"some text", 18) == 0, "%s", "");
    float *lg = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) lg[i] = 0;
    t0 = tern_time_s();
    CHECK(srv_jmatch_mask(m, lg, n) == 0, "%s", "");
    double t_walk = tern_time_s() - t0;
    int allowed = 0;
    for (int i = 0; i < n; i++) allowed += lg[i] == 0;
    for (int i = 0; i < n; i++) lg[i] = 0;
    t0 = tern_time_s();
    CHECK(srv_jmatch_mask(m, lg, n) == 0, "%s", "");            /* same state: cached */
    double t_cached = tern_time_s() - t0;
    printf("# 262k vocab: build %.1f ms, mask walk %.2f ms (%d allowed), cached %.3f ms\n", t_build * 1e3, t_walk * 1e3,
           allowed, t_cached * 1e3);
    CHECK(allowed > 1000 && allowed < n, "%s", "");
    CHECK(t_walk < 0.5, "%s", "");                               /* generous: CI machines are slow */
    free(lg);
    srv_jmatch_free(m);
    srv_jgram_free(g);
    srv_jvocab_free(v);
    for (int i = 0; i < n; i++) free(t[i]);
    free(t);
    free(l);
}

int main(void) {
    RUN(json_object_accepts);
    RUN(json_schema_accepts);
    RUN(json_random_walks_parse);
    RUN(json_mask_cost_262k);
    return test_done();
}
