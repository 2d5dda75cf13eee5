/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors header validator.
 *
 * The input is a whole safetensors image; tern__st_parse_buffer must either reject it
 * with a status or accept it, and every accepted entry must lie inside the buffer (we
 * read its first and last byte so ASan catches a range the validator let through).
 * Build and run with tests/fuzz/build.sh; tests/fuzz/regress.sh replays the corpus.
 */
#include "io/safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tern_st_set *s = NULL;
    tern_error err;
    if (tern__st_parse_buffer(&s, data, size, "fuzz.safetensors", &err) == TERN_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < tern_st_count(s); i++) {
            const tern_st_entry *e = tern_st_at(s, i);
            if (e->nbytes) sink ^= ((const uint8_t *)e->data)[0] ^ ((const uint8_t *)e->data)[e->nbytes - 1];
            if (tern_st_find(s, e->name) != e) __builtin_trap();
            if (e->ndim < 0 || e->ndim > TERN_MAX_DIMS) __builtin_trap();
        }
        (void)tern_st_metadata(s, "format");
        (void)sink;
    } else if (err.msg[0] == 0) {
        __builtin_trap(); /* every failure must carry a message */
    }
    tern_st_close(s);
    return 0;
}
