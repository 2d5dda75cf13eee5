/*
 * fuzz_request.c — libFuzzer target for what an HTTP client controls beyond the transport: the
 * request body's sampling / limit fields (srv_params_parse, both APIs) and a response_format
 * JSON Schema compiled into the constrained-decoding grammar (srv_jgram_compile), which then
 * masks a small byte vocabulary and accepts what it allows for a few steps.
 *
 * The input is parsed as JSON. Every call either succeeds or fails with a message (and an HTTP
 * status in 4xx for the parameters); a compiled grammar must never leave no token allowed
 * (srv_jmatch_mask's -1: a bug) and must accept the token it unmasked.
 */
#include "server/jsonfsm.h"
#include "server/srv.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* the server's seam to the engine's request defaults (engine_real.c's, without the engine) */
tern_request tern__srv_request_default(void) { return tern_request_default(); }

/* the vocabulary: every single byte (as a byte-level tokenizer has: some token always fits), some multi-byte
 * pieces, and an EOS with no bytes last */
#define NM 23
#define NV (256 + NM + 1)
static const char *const k_multi[NM] = {"{\"", "\":", "\",\"", "\"}", "[1", "],", "  ", "\n  ", "ab\"", "12", "-0", ".5",
                                        "e3", "E-", "true", "false", "null", "\"x\"", "\\n", "\\u00e9", "\\ud83d",
                                        "\xc3\xa9", "name"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static srv_jvocab *voc;
    tern_error err;
    if (!voc) {
        static char bytes[256];
        const char *tok[NV];
        size_t lens[NV];
        for (int i = 0; i < 256; i++) { bytes[i] = (char)i; tok[i] = &bytes[i]; lens[i] = 1; }
        for (int i = 0; i < NM; i++) { tok[256 + i] = k_multi[i]; lens[256 + i] = strlen(k_multi[i]); }
        tok[NV - 1] = "";
        lens[NV - 1] = 0;
        const int eos = NV - 1;
        if (srv_jvocab_from_bytes(tok, lens, NV, &eos, 1, &voc, &err) != TERN_OK) __builtin_trap();
    }
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    if (!j) return 0;
    for (int api = 0; api < 2; api++) {
        srv_params p;
        memset(&p, 0, sizeof p);
        srv_error e;
        memset(&e, 0, sizeof e);
        if (srv_params_parse(&p, j, (srv_api)api, 1000, 4096, &e) != 0 && (e.http < 400 || e.http > 499 || !e.msg[0]))
            __builtin_trap();
        srv_params_free(&p);
    }
    srv_jgram *g = NULL;
    err.msg[0] = 0;
    if (srv_jgram_compile(j, &g, &err) != TERN_OK) {
        if (!err.msg[0] || g) __builtin_trap();
    } else {
        srv_jmatch *m = NULL;
        if (srv_jmatch_new(g, voc, &m, &err) != TERN_OK) __builtin_trap();
        float logits[NV];
        for (int step = 0; step < 24; step++) {
            for (int i = 0; i < NV; i++) logits[i] = 0.0f;
            if (srv_jmatch_mask(m, logits, NV) != 0) __builtin_trap();
            int pick = -1; /* a pseudo-random allowed token, seeded by the input */
            for (int k = 0; k < NV; k++) {
                const int i = (int)((k * 37 + step * 7 + (size ? data[step % size] * 11 : 0)) % NV);
                if (logits[i] != -INFINITY) { pick = i; break; }
            }
            if (pick < 0) __builtin_trap();
            if (pick == NV - 1) break; /* EOS: the value is complete */
            if (srv_jmatch_accept(m, pick) != 0) __builtin_trap();
        }
        srv_jmatch_free(m);
        srv_jgram_free(g);
    }
    cJSON_Delete(j);
    return 0;
}
