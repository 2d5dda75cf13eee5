/*
 * fuzz_tokenizer.c — libFuzzer target for tokenizer.json loading (tern_tokenizer_load_json),
 * the file a model directory ships and the engine trusts least after the weights.
 *
 * A load either fails with a message or gives a tokenizer that must then encode a few fixed
 * texts (ASCII, multi-byte UTF-8, an invalid byte, a special-looking token, the escaped mode)
 * and decode what it produced without crashing: every id it returns is below its vocab size.
 */
#include "text/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *texts[] = {"Hello world, 12345!", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
                                  "a\xff" "b  \n\n\t x", "<s>[INST] <|im_start|>user\n", ""};
    tern_error err;
    err.msg[0] = 0;
    tern_tokenizer *tok = NULL;
    if (tern_tokenizer_load_json(&tok, (const char *)data, size, NULL, "tokenizer.json", &err) != TERN_OK) {
        if (err.msg[0] == 0 || tok) __builtin_trap();
        return 0;
    }
    const size_t vocab = tern_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        for (int mode = 0; mode < 3; mode++) {
            int32_t *ids = NULL;
            size_t n = 0;
            err.msg[0] = 0;
            const tern_status st = mode < 2 ? tern_tokenizer_encode(tok, texts[i], strlen(texts[i]), 1, mode, &ids, &n, &err)
                                            : tern_tokenizer_encode_ex(tok, texts[i], strlen(texts[i]), TERN_ENC_ESCAPED,
                                                                       &ids, &n, &err);
            if (st != TERN_OK) {
                if (err.msg[0] == 0) __builtin_trap();
                free(ids);
                continue;
            }
            for (size_t j = 0; j < n; j++)
                if (ids[j] < 0 || (size_t)ids[j] >= vocab) __builtin_trap();
            char *s = NULL;
            size_t len = 0;
            if (tern_tokenizer_decode(tok, ids, n, mode, &s, &len, &err) == TERN_OK && (!s || strlen(s) > len))
                __builtin_trap();
            free(s);
            free(ids);
        }
    tern_tokenizer_free(tok);
    return 0;
}
