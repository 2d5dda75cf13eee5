/* test_text_tok.c — tokenizer components on small synthetic tokenizer.json files: BPE merge
 * order (string and pair merges), ignore_merges, byte fallback, unk fusing, added tokens
 * (longest match, special/parse_special, lstrip/rstrip, single_word, normalized), Gemma-style
 * Replace + Split, Llama-2 Prepend, Metaspace, NFC, ByteLevel + Split regex, decoders,
 * TemplateProcessing, invalid UTF-8, unsupported components. Expected ids were worked out by
 * hand from HF's algorithm (and the real-file behaviour is covered by tests/text/). */
#include "test.h"
#include "base/base.h"
#include "text/tokenizer.h"

static tern_tokenizer *load(const char *json) {
    tern_tokenizer *t = NULL;
    tern_error e = {0};
    if (tern_tokenizer_load_json(&t, json, strlen(json), NULL, "test.json", &e)) printf("  load: %s\n", e.msg);
    return t;
}

/* encode and compare to the expected id list (terminated by -1) */
static int enc_is(const tern_tokenizer *t, const char *text, int add, int parse, const int *want) {
    int32_t *ids;
    size_t n;
    tern_error e = {0};
    if (tern_tokenizer_encode(t, text, strlen(text), add, parse, &ids, &n, &e)) { printf("  encode: %s\n", e.msg); return 0; }
    size_t k = 0;
    while (want[k] >= 0) k++;
    int ok = k == n;
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        printf("  '%s' -> [", text);
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("]\n");
    }
    free(ids);
    return ok;
}

static int dec_is(const tern_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want) {
    char *s;
    size_t len;
    tern_error e = {0};
    if (tern_tokenizer_decode(t, ids, n, skip, &s, &len, &e)) { printf("  decode: %s\n", e.msg); return 0; }
    int ok = len == strlen(want) && !memcmp(s, want, len);
    if (!ok) printf("  decode -> '%s' (want '%s')\n", s, want);
    free(s);
    return ok;
}

#define V(...) ((const int[]){__VA_ARGS__, -1})

/* a b c ab bc abc; ranks: "b c" < "a b" < "a bc" */
static const char *k_bpe_str =
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"<unk>\":6},"
    "\"merges\":[\"b c\",\"a b\",\"a bc\"],\"unk_token\":\"<unk>\",\"fuse_unk\":true}}";
static const char *k_bpe_pair =
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"<unk>\":6},"
    "\"merges\":[[\"b\",\"c\"],[\"a\",\"b\"],[\"a\",\"bc\"]],\"unk_token\":\"<unk>\",\"fuse_unk\":false}}";

TEST(bpe_merge_order_both_forms) {
    tern_tokenizer *a = load(k_bpe_str), *b = load(k_bpe_pair);
    CHECK(a && b, "load");
    if (!a || !b) { tern_tokenizer_free(a); tern_tokenizer_free(b); return; }
    CHECK(enc_is(a, "abc", 0, 1, V(5)), "abc");        /* b c first, then a+bc */
    CHECK(enc_is(b, "abc", 0, 1, V(5)), "abc pair");
    CHECK(enc_is(a, "abab", 0, 1, V(3, 3)), "abab");
    CHECK(enc_is(a, "cab", 0, 1, V(2, 3)), "cab");
    CHECK(enc_is(a, "abxyc", 0, 1, V(3, 6, 2)), "fused unk");
    CHECK(enc_is(b, "abxyc", 0, 1, V(3, 6, 6, 2)), "unfused unk");
    CHECK(enc_is(a, "", 0, 1, V(-1)), "empty");
    CHECK(tern_tokenizer_vocab_size(a) == 7, "vocab %zu", tern_tokenizer_vocab_size(a));
    CHECK(tern_tokenizer_token_to_id(a, "bc", 2) == 4, "token_to_id");
    size_t l;
    CHECK(!strcmp(tern_tokenizer_id_to_token(a, 5, &l), "abc") && l == 3, "id_to_token");
    CHECK(tern_tokenizer_id_to_token(a, 99, NULL) == NULL, "bad id");
    int32_t ids[] = {5, 6, 99, -4, 3};
    CHECK(dec_is(a, ids, 5, 0, "abc <unk> ab"), "no decoder joins with spaces, drops unknown ids");
    tern_tokenizer_free(a);
    tern_tokenizer_free(b);
}

TEST(ignore_merges_takes_whole_word) {
    /* "abc" is in the vocab but no merge path reaches it */
    const char *j = "{\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4},"
                    "\"merges\":[\"a b\"]}}";
    char buf[512];
    snprintf(buf, sizeof buf, j, "true");
    tern_tokenizer *t = load(buf);
    snprintf(buf, sizeof buf, j, "false");
    tern_tokenizer *f = load(buf);
    CHECK(t && f, "load");
    if (t && f) {
        CHECK(enc_is(t, "abc", 0, 1, V(4)), "ignore_merges");
        CHECK(enc_is(f, "abc", 0, 1, V(3, 2)), "merges");
    }
    tern_tokenizer_free(t);
    tern_tokenizer_free(f);
}

/* Gemma-style: Replace " "→"▁", Split " " MergedWithPrevious (a no-op after Replace), byte
 * fallback, decoder Replace/ByteFallback/Fuse, TemplateProcessing <bos> $A. */
static const char *k_gemma =
    "{\"added_tokens\":["
    "{\"id\":0,\"content\":\"<pad>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false},"
    "{\"id\":1,\"content\":\"<bos>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false},"
    "{\"id\":2,\"content\":\"<unk>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false},"
    "{\"id\":20,\"content\":\"<t>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false},"
    "{\"id\":21,\"content\":\"<t>x\",\"special\":false,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false},"
    "{\"id\":22,\"content\":\"\\n\\n\",\"special\":false,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false}],"
    "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"},"
    "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":false},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<bos>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<bos>\":{\"id\":\"<bos>\",\"ids\":[1],\"tokens\":[\"<bos>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"fuse_unk\":true,\"unk_token\":\"<unk>\",\"vocab\":{"
    "\"<pad>\":0,\"<bos>\":1,\"<unk>\":2,\"h\":3,\"i\":4,\"\\u2581\":5,\"hi\":6,\"\\u2581hi\":7,\"x\":8,\"\\n\":9,"
    "\"<0xC3>\":10,\"<0xA9>\":11,\"<0xE2>\":12,\"<0x82>\":13,\"<0xAC>\":14,\"<0xEF>\":15,\"<0xBF>\":16,\"<0xBD>\":17},"
    "\"merges\":[[\"h\",\"i\"],[\"\\u2581\",\"hi\"]]}}";

TEST(gemma_style_pipeline) {
    tern_tokenizer *t = load(k_gemma);
    CHECK(t, "load");
    if (!t) return;
    CHECK(enc_is(t, "hi hi", 1, 1, V(1, 6, 7)), "bos + merges across the replaced space");
    CHECK(enc_is(t, "hi hi", 0, 1, V(6, 7)), "no special");
    CHECK(enc_is(t, "h\xC3\xA9", 0, 1, V(3, 10, 11)), "byte fallback é");
    CHECK(enc_is(t, "h\xE2\x82\xAC", 0, 1, V(3, 12, 13, 14)), "byte fallback €");
    CHECK(enc_is(t, "hzzq", 0, 1, V(3, 2)), "fused unk (no byte tokens for z)");
    CHECK(enc_is(t, "<t>xhi", 0, 1, V(21, 6)), "longest added token wins");
    CHECK(enc_is(t, "<t>hi", 0, 1, V(20, 6)), "special token parsed");
    CHECK(enc_is(t, "<bos>hi\n\nhi", 0, 1, V(1, 6, 22, 6)), "special + non-special added");
    CHECK(enc_is(t, "<bos>hi", 0, 0, V(2, 6)), "parse_special=0 keeps text (< b o s > → unk)");
    CHECK(enc_is(t, "hi\n\nhi", 0, 0, V(6, 22, 6)), "parse_special=0 still matches non-special");
    CHECK(enc_is(t, "h\xFF" "i", 0, 1, V(3, 15, 16, 17, 4)), "invalid UTF-8 → U+FFFD (EF BF BD)");
    int32_t a[] = {1, 6, 7, 10, 11, 5, 12, 13, 14};
    CHECK(dec_is(t, a, 9, 0, "<bos>hi hi\xC3\xA9 \xE2\x82\xAC"), "decode");
    CHECK(dec_is(t, a, 9, 1, "hi hi\xC3\xA9 \xE2\x82\xAC"), "decode skip special");
    int32_t b[] = {6, 10, 6, 12, 13};
    CHECK(dec_is(t, b, 5, 0, "hi\xEF\xBF\xBDhi\xEF\xBF\xBD\xEF\xBF\xBD"), "invalid byte runs → one U+FFFD per byte");
    CHECK(tern_tokenizer_is_special(t, 1) && !tern_tokenizer_is_special(t, 21), "is_special");
    tern_tokenizer_free(t);
}

TEST(added_token_flags) {
    const char *j =
        "{\"added_tokens\":["
        "{\"id\":10,\"content\":\"<m>\",\"special\":true,\"normalized\":false,\"lstrip\":true,\"rstrip\":true,\"single_word\":false},"
        "{\"id\":11,\"content\":\"ab\",\"special\":false,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":true},"
        "{\"id\":12,\"content\":\"B\",\"special\":false,\"normalized\":true,\"lstrip\":false,\"rstrip\":false,\"single_word\":false}],"
        "\"normalizer\":{\"type\":\"Lowercase\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\" \":2,\"c\":3},\"merges\":[]}}";
    tern_tokenizer *t = load(j);
    CHECK(t, "load");
    if (!t) return;
    CHECK(enc_is(t, "a  <m>  a", 0, 1, V(0, 10, 0)), "lstrip/rstrip eat the spaces");
    CHECK(enc_is(t, "ab cab", 0, 1, V(11, 2, 3, 0, 12)), "single_word only on word boundaries; normalized 'b' token");
    CHECK(enc_is(t, "AB", 0, 1, V(0, 12)), "normalized token matched after Lowercase");
    tern_tokenizer_free(t);
}

TEST(llama2_prepend_and_strip_decoder) {
    const char *j =
        "{\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"<s>\":1,\"\\u2581\":2,\"a\":3,\"\\u2581a\":4},\"merges\":[\"\\u2581 a\"]}}";
    tern_tokenizer *t = load(j);
    CHECK(t, "load");
    if (!t) return;
    CHECK(enc_is(t, "a a", 0, 1, V(4, 4)), "prepend");
    CHECK(enc_is(t, "<s>a", 0, 1, V(1, 4)), "prepend per piece after an added token");
    int32_t a[] = {4, 4};
    CHECK(dec_is(t, a, 2, 0, "a a"), "strip leading space");
    tern_tokenizer_free(t);
}

TEST(metaspace_pretokenizer_and_decoder) {
    const char *j =
        "{\"added_tokens\":[{\"id\":9,\"content\":\"<x>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false}],"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true},"
        "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u2581\":0,\"a\":1,\"\\u2581a\":2,\"b\":3,\"\\u2581b\":4},"
        "\"merges\":[\"\\u2581 a\",\"\\u2581 b\"]}}";
    tern_tokenizer *t = load(j);
    CHECK(t, "load");
    if (!t) return;
    CHECK(enc_is(t, "a b", 0, 1, V(2, 4)), "prepend first");
    CHECK(enc_is(t, "<x>a b", 0, 1, V(9, 1, 4)), "no prepend after an added token (not at offset 0)");
    CHECK(enc_is(t, "a  b", 0, 1, V(2, 0, 4)), "split MergedWithNext");
    int32_t a[] = {2, 4, 0, 4};
    CHECK(dec_is(t, a, 4, 0, "a b  b"), "first-token space dropped");
    tern_tokenizer_free(t);
}

/* ByteLevel + Split regex (Qwen-like, with NFC): vocab holds the bytes used. */
static const char *k_bytelevel =
    "{\"added_tokens\":[{\"id\":50,\"content\":\"<|e|>\",\"special\":true,\"normalized\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"h\":0,\"i\":1,\"\\u0120\":2,\"hi\":3,\"\\u0120hi\":4,\"1\":5,\"2\":6,\"\\u00c3\":7,\"\\u00a9\":8,"
    "\"\\u00c3\\u00a9\":9,\"\\u010a\":10,\"\\u0120\\u0120\":11,\"'s\":12,\"'\":13,\"s\":14,\"!\":15},"
    "\"merges\":[[\"h\",\"i\"],[\"\\u0120\",\"hi\"],[\"\\u00c3\",\"\\u00a9\"],[\"\\u0120\",\"\\u0120\"],[\"'\",\"s\"]]}}";

TEST(bytelevel_split_regex) {
    tern_tokenizer *t = load(k_bytelevel);
    CHECK(t, "load");
    if (!t) return;
    CHECK(enc_is(t, "hi hi", 1, 1, V(3, 4)), "Ġhi");
    CHECK(enc_is(t, "hi12", 0, 1, V(3, 5, 6)), "digits one per piece");
    CHECK(enc_is(t, "e\xCC\x81", 0, 1, V(9)), "NFC composes e + U+0301");
    CHECK(enc_is(t, "\xC3\xA9", 0, 1, V(9)), "é bytes");
    CHECK(enc_is(t, "hi   hi", 0, 1, V(3, 11, 4)), "\\s+(?!\\S) leaves one space for the word");
    CHECK(enc_is(t, "hi's!\n", 0, 1, V(3, 12, 15, 10)), "contraction, punct+newline");
    CHECK(enc_is(t, "hi<|e|>hi", 0, 1, V(3, 50, 3)), "added token");
    int32_t a[] = {3, 4, 9, 10, 50, 7};
    CHECK(dec_is(t, a, 6, 0, "hi hi\xC3\xA9\n<|e|>\xEF\xBF\xBD"), "byte-level decode, lone C3 → U+FFFD");
    CHECK(dec_is(t, a, 6, 1, "hi hi\xC3\xA9\n\xEF\xBF\xBD"), "skip special");
    tern_tokenizer_free(t);
}

TEST(split_behaviors_and_digits) {
    const char *base =
        "{\"pre_tokenizer\":%s,\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"-\":1,\"a-\":2,\"-a\":3,\"--\":4,\"1\":5,\"11\":6},"
        "\"merges\":[\"a -\",\"- a\",\"- -\",\"1 1\"]}}";
    struct { const char *pt; const char *text; const int *want; } cs[] = {
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\",\"invert\":false}", "a-a", V(0, 1, 0)},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Removed\",\"invert\":false}", "a-a", V(0, 0)},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"MergedWithPrevious\",\"invert\":false}", "a-a", V(2, 0)},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"MergedWithNext\",\"invert\":false}", "a-a", V(0, 3)},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Contiguous\",\"invert\":false}", "a--a", V(0, 4, 0)},
        {"{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Removed\",\"invert\":true}", "a-a", V(0, 0)},
        {"{\"type\":\"Digits\",\"individual_digits\":true}", "11", V(5, 5)},
        {"{\"type\":\"Digits\",\"individual_digits\":false}", "11a", V(6, 0)},
    };
    char buf[1024];
    for (size_t i = 0; i < TERN_ARRAY_LEN(cs); i++) {
        snprintf(buf, sizeof buf, base, cs[i].pt);
        tern_tokenizer *t = load(buf);
        CHECK(t && enc_is(t, cs[i].text, 0, 1, cs[i].want), "case %zu: %s", i, cs[i].pt);
        tern_tokenizer_free(t);
    }
}

TEST(unsupported_and_malformed) {
    const char *bad[][2] = {
        {"{\"pre_tokenizer\":{\"type\":\"Whatever\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", "pre_tokenizer type 'Whatever' not supported"},
        {"{\"normalizer\":{\"type\":\"Precompiled\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", "normalizer type 'Precompiled' not supported"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "model type 'Unigram' not supported"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", "missing from the vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}", "is not 'a b'"},
        {"{\"decoder\":{\"type\":\"CTC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", "decoder type 'CTC' not supported"},
        {"{\"model\":", "not a JSON object"},
        /* raw bytes that are not UTF-8 (a Replace normalizer's content here) — the regexes assume UTF-8 (fuzzed) */
        {"{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\"},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", "not valid UTF-8 at byte 68"},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(bad); i++) {
        tern_tokenizer *t = NULL;
        tern_error e = {0};
        tern_status s = tern_tokenizer_load_json(&t, bad[i][0], strlen(bad[i][0]), NULL, "x.json", &e);
        CHECK(s != TERN_OK && !t && strstr(e.msg, bad[i][1]), "case %zu: status %d msg '%s'", i, s, e.msg);
    }
    tern_tokenizer *t = NULL;
    tern_error e = {0};
    CHECK(tern_tokenizer_load(&t, "/nonexistent/dir", &e) == TERN_EIO && !t, "missing dir: %s", e.msg);
    tern_tokenizer_free(NULL);
}

TEST(config_bos_eos) {
    const char *cfg = "{\"bos_token\":{\"content\":\"<bos>\"},\"eos_token\":\"<pad>\",\"add_bos_token\":true}";
    tern_tokenizer *t = NULL;
    tern_error e = {0};
    CHECK(!tern_tokenizer_load_json(&t, k_gemma, strlen(k_gemma), cfg, "g", &e), "%s", e.msg);
    if (!t) return;
    CHECK(tern_tokenizer_bos_id(t) == 1 && tern_tokenizer_eos_id(t) == 0, "bos %d eos %d", tern_tokenizer_bos_id(t), tern_tokenizer_eos_id(t));
    CHECK(tern_tokenizer_add_bos(t) == 1 && tern_tokenizer_add_eos(t) == -1, "flags");
    tern_tokenizer_free(t);
}

int main(void) {
    RUN(bpe_merge_order_both_forms);
    RUN(ignore_merges_takes_whole_word);
    RUN(gemma_style_pipeline);
    RUN(added_token_flags);
    RUN(llama2_prepend_and_strip_decoder);
    RUN(metaspace_pretokenizer_and_decoder);
    RUN(bytelevel_split_regex);
    RUN(split_behaviors_and_digits);
    RUN(unsupported_and_malformed);
    RUN(config_bos_eos);
    return test_done();
}
