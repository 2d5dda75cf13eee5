/* test_text_tok_stream.c — incremental detokenizer and stop matcher.
 * Streaming must equal the full decode (byte-fallback runs, Metaspace first-token rule,
 * Strip, ByteLevel), never emit broken UTF-8, and hold back partial stop strings. When the
 * real tokenizer files fetched by scripts/fetch_tokenizers.sh are present under
 * build/tokenizers/, random id streams are checked on them too (else SKIP). */
#include "base/base.h"
#include "test.h"
#include "text/detok.h"
#include "text/stop.h"
#include "text/tokenizer.h"

#include <sys/stat.h>

static tern_tokenizer *load(const char *json) {
    tern_tokenizer *t = NULL;
    tern_error e = {0};
    if (tern_tokenizer_load_json(&t, json, strlen(json), NULL, "test.json", &e)) printf("  load: %s\n", e.msg);
    return t;
}

static int utf8_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Stream ids through a detokenizer; compare the concatenation with the full decode.
 * Returns 1 on success; *steps_held counts steps that emitted nothing. With lenient set,
 * a full decode holding U+FFFD (an invalid byte-fallback run, which HF renders as one U+FFFD
 * per byte of the whole run while a stream may already have shown its valid head) only
 * needs valid UTF-8; *compared tells whether the texts were compared. */
static int stream_cmp(const tern_tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *held, int lenient,
                      int *compared) {
    tern_detok *d;
    tern_error e = {0};
    if (tern_detok_new(&d, t, skip, &e)) return 0;
    char *acc = malloc(1);
    size_t an = 0;
    int ok = 1;
    if (held) *held = 0;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *s;
        size_t l;
        tern_status st = i < n ? tern_detok_step(d, ids[i], &s, &l, &e) : tern_detok_flush(d, &s, &l, &e);
        if (st) { ok = 0; break; }
        if (!utf8_ok(s, l)) { printf("  broken UTF-8 emitted at step %zu\n", i); ok = 0; }
        if (held && i < n && !l) (*held)++;
        acc = realloc(acc, an + l + 1);
        memcpy(acc + an, s, l);
        an += l;
    }
    char *full;
    size_t fl;
    if (compared) *compared = 0;
    if (ok && !tern_tokenizer_decode(t, ids, n, skip, &full, &fl, &e)) {
        int skip_cmp = lenient && strstr(full, "\xEF\xBF\xBD");
        if (compared) *compared = !skip_cmp;
        ok = skip_cmp || (fl == an && !memcmp(full, acc, an));
        if (!ok) printf("  stream '%.*s' != decode '%s'\n", (int)an, acc, full);
        free(full);
    }
    free(acc);
    tern_detok_free(d);
    return ok;
}

static int stream_equals_decode(const tern_tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *held) {
    return stream_cmp(t, ids, n, skip, held, 0, NULL);
}

/* byte fallback + Metaspace-like Replace, as Gemma */
static const char *k_sp =
    "{\"added_tokens\":[{\"id\":1,\"content\":\"<bos>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false}],"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"<bos>\":1,\"\\u2581hi\":2,\"x\":3,\"<0xE2>\":4,\"<0x82>\":5,\"<0xAC>\":6,\"<0xC3>\":7,\"<0xA9>\":8},\"merges\":[]}}";

TEST(detok_byte_fallback_held_back) {
    tern_tokenizer *t = load(k_sp);
    CHECK(t, "load");
    if (!t) return;
    int32_t ids[] = {1, 2, 4, 5, 6, 2, 7, 8, 3, 2};
    CHECK(stream_equals_decode(t, ids, 10, 0, NULL), "stream == decode");
    CHECK(stream_equals_decode(t, ids, 10, 1, NULL), "stream == decode (skip special)");
    /* the 3-byte € must come out in one piece: steps 2..4 */
    tern_detok *d;
    tern_detok_new(&d, t, 1, NULL);
    const char *s;
    size_t l, lens[10];
    for (int i = 0; i < 10; i++) { tern_detok_step(d, ids[i], &s, &l, NULL); lens[i] = l; }
    CHECK(lens[2] == 0 && lens[3] == 0 && lens[4] == 3, "held back until complete: %zu %zu %zu", lens[2], lens[3], lens[4]);
    tern_detok_free(d);
    int32_t broken[] = {2, 4, 5, 3};
    CHECK(stream_equals_decode(t, broken, 4, 0, NULL), "broken byte run decodes as U+FFFD");
    int32_t tail[] = {2, 4, 5};
    CHECK(stream_equals_decode(t, tail, 3, 0, NULL), "flush releases the held tail");
    tern_tokenizer_free(t);
}

TEST(detok_metaspace_first_token) {
    const char *j = "{\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\"},"
                    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u2581a\":0,\"\\u2581b\":1,\"c\":2},\"merges\":[]}}";
    tern_tokenizer *t = load(j);
    CHECK(t, "load");
    if (!t) return;
    int32_t ids[] = {0, 1, 2, 0, 0};
    CHECK(stream_equals_decode(t, ids, 5, 0, NULL), "Metaspace stream");
    tern_tokenizer_free(t);
}

TEST(stop_matcher_partial_and_multi) {
    const char *stops[] = {"</s>", "STOP", "", "ab"};
    tern_stop *s;
    tern_error e = {0};
    CHECK(!tern_stop_new(&s, stops, 4, &e), "new");
    const char *o;
    size_t n;
    CHECK(tern_stop_feed(s, "hello <", 7, &o, &n) == 0 && n == 6 && !memcmp(o, "hello ", 6), "hold '<' (%zu)", n);
    CHECK(tern_stop_feed(s, "/", 1, &o, &n) == 0 && n == 0, "hold '</'");
    CHECK(tern_stop_feed(s, "x", 1, &o, &n) == 0 && n == 3 && !memcmp(o, "</x", 3), "release '</x'");
    CHECK(tern_stop_feed(s, "yy ST", 5, &o, &n) == 0 && n == 3, "hold 'ST'");
    CHECK(tern_stop_feed(s, "OP tail", 7, &o, &n) == 1 && n == 0, "match STOP across chunks");
    CHECK(tern_stop_which(s) == 1, "which %d", tern_stop_which(s));
    CHECK(tern_stop_feed(s, "more", 4, &o, &n) == 1 && n == 0, "done after stop");
    tern_stop_reset(s);
    CHECK(tern_stop_feed(s, "x</s>ab", 7, &o, &n) == 1 && n == 1 && o[0] == 'x' && tern_stop_which(s) == 0, "earliest end wins");
    tern_stop_reset(s);
    CHECK(tern_stop_feed(s, "caa", 3, &o, &n) == 0 && n == 2, "hold 'a'");
    tern_stop_flush(s, &o, &n);
    CHECK(n == 1 && o[0] == 'a', "flush releases held text");
    tern_stop_free(s);
    /* chunking independence: feeding byte by byte gives the same result */
    const char *text = "The answer is 42.</s>ignored";
    tern_stop_new(&s, stops, 4, &e);
    char acc[64];
    size_t an = 0;
    int hit = 0;
    for (size_t i = 0; text[i] && !hit; i++) {
        hit = tern_stop_feed(s, text + i, 1, &o, &n);
        memcpy(acc + an, o, n);
        an += n;
    }
    CHECK(hit == 1 && an == 17 && !memcmp(acc, "The answer is 42.", 17), "byte-by-byte: '%.*s'", (int)an, acc);
    tern_stop_free(s);
    tern_stop_free(NULL);
}

/* Random ids on the real tokenizers (if fetched): stream == decode, always valid UTF-8. */
TEST(detok_real_tokenizers) {
    const char *names[] = {"gemma3", "qwen3", "llama3", "llama2"};
    int any = 0;
    for (size_t k = 0; k < TERN_ARRAY_LEN(names); k++) {
        char path[256];
        struct stat sb;
        snprintf(path, sizeof path, "build/tokenizers/%s/tokenizer.json", names[k]);
        if (stat(path, &sb)) continue;
        any = 1;
        tern_tokenizer *t = NULL;
        tern_error e = {0};
        if (tern_tokenizer_load(&t, path, &e)) { CHECK(0, "%s: %s", names[k], e.msg); continue; }
        unsigned long long seed = 99 + k;
        size_t V = tern_tokenizer_vocab_size(t), held = 0, total = 0, compared = 0;
        int32_t ids[200];
        /* text with multi-byte characters, then random ids (many byte tokens for Gemma/Llama-2) */
        const char *txts[] = {"Grüße, 世界! 👋🏽 <0x41>\n\n  x", "  leading spaces\n\nand 12345 ...",
                              "<bos><start_of_turn>user\nHi 😀<end_of_turn>\n", "𝕏 Ελληνικά עברית हिन्दी 한국어 ﬁ"};
        for (size_t x = 0; x < TERN_ARRAY_LEN(txts); x++) {
            int32_t *enc;
            size_t ne;
            if (tern_tokenizer_encode(t, txts[x], strlen(txts[x]), 1, 1, &enc, &ne, &e)) continue;
            CHECK(stream_equals_decode(t, enc, ne, 0, NULL), "%s: encoded text %zu", names[k], x);
            CHECK(stream_equals_decode(t, enc, ne, 1, NULL), "%s: encoded text %zu (skip special)", names[k], x);
            free(enc);
        }
        for (int r = 0; r < 40; r++) {
            size_t n = 1 + test_rand_u64(&seed) % 200;
            for (size_t i = 0; i < n; i++) {
                uint64_t x = test_rand_u64(&seed);
                /* bias toward low ids: byte tokens / short pieces live there */
                ids[i] = (int32_t)(x % 4 == 0 ? x % 600 : x % V);
            }
            size_t h;
            int cmp;
            CHECK(stream_cmp(t, ids, n, r & 1, &h, 1, &cmp), "%s: random stream %d", names[k], r);
            held += h;
            compared += (size_t)cmp;
            total += n;
        }
        /* random valid texts: exact equality required */
        static const char *parts[] = {"Hello", " world", "  ", "\n", "\n\n", "\t", "é", "世界", "👋🏽", "👨‍👩‍👧",
                                      "12345", " <unused0>", "<eos>", "<|im_end|>", "ﬁ", "𝕏", "Ω", " ", "\xE2\x96\x81", "x"};
        for (int r = 0; r < 40; r++) {
            char txt[512];
            size_t tl = 0;
            int np = 1 + (int)(test_rand_u64(&seed) % 30);
            for (int i = 0; i < np; i++) {
                const char *p = parts[test_rand_u64(&seed) % TERN_ARRAY_LEN(parts)];
                memcpy(txt + tl, p, strlen(p));
                tl += strlen(p);
            }
            int32_t *enc;
            size_t ne;
            if (tern_tokenizer_encode(t, txt, tl, 1, 1, &enc, &ne, &e)) continue;
            CHECK(stream_equals_decode(t, enc, ne, r & 1, NULL), "%s: random text %d", names[k], r);
            free(enc);
        }
        printf("  %s: %zu/%zu steps held back text; %zu/40 random streams compared exactly\n", names[k], held, total, compared);
        tern_tokenizer_free(t);
    }
    if (!any) SKIP("detok_real_tokenizers", "no tokenizer files under build/tokenizers (run scripts/fetch_tokenizers.sh)");
}

int main(void) {
    RUN(detok_byte_fallback_held_back);
    RUN(detok_metaspace_first_token);
    RUN(stop_matcher_partial_and_multi);
    struct stat sb;
    if (!stat("build/tokenizers", &sb)) RUN(detok_real_tokenizers);
    else SKIP("detok_real_tokenizers", "no tokenizer files under build/tokenizers (run scripts/fetch_tokenizers.sh)");
    return test_done();
}
