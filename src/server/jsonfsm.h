/*
 * jsonfsm.h — constrained decoding for response_format json_object / json_schema.
 *
 * Three objects:
 *   srv_jgram   a compiled grammar: "any JSON object" (json_object) or a JSON Schema subset
 *               (type object/array/string/number/integer/boolean/null or a list of them,
 *               properties + required, additionalProperties false / schema, items, enum,
 *               const). Immutable; keywords that would change the language and are not
 *               supported ($ref, anyOf, oneOf, allOf, not, if, pattern, patternProperties)
 *               are refused with a message naming the keyword (HTTP 400).
 *   srv_jvocab  each token's bytes for one tokenizer, laid out as a trie in preorder (built
 *               once per server; ~1 s for a 262k vocabulary is too slow, it is ~50 ms).
 *   srv_jmatch  one request's position: a byte-level pushdown automaton over the grammar.
 *               srv_jmatch_mask sets to -INFINITY the logits of every token whose bytes would
 *               lead the automaton into an error, and of EOS until the value is complete.
 *               It walks the trie once, stepping a copy of the state per trie node and
 *               skipping whole subtrees on error; masks are cached by automaton state, so a
 *               long string or a repeated structure costs one walk per distinct state.
 * Practical limits, so that a weak model cannot wander forever in whitespace or digits:
 * at most 8 consecutive whitespace bytes between tokens, 24 bytes per number, nesting 32.
 * Strings are byte-validated UTF-8 (no control characters; escapes checked).
 */
#ifndef TERN_SERVER_JSONFSM_H
#define TERN_SERVER_JSONFSM_H

#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_jgram srv_jgram;
typedef struct srv_jvocab srv_jvocab;
typedef struct srv_jmatch srv_jmatch;

/* schema NULL: any JSON object (json_object mode). msg gets the reason on failure. */
tern_status srv_jgram_compile(const cJSON *schema, srv_jgram **out, tern_error *err);
void srv_jgram_free(srv_jgram *g);

/* From a tokenizer (special tokens get no bytes; eos ids are the ones allowed at the end). */
tern_status srv_jvocab_from_tokenizer(const tern_tokenizer *tok, int n_vocab, const int *eos, int n_eos,
                                      srv_jvocab **out, tern_error *err);
/* From explicit byte strings (tests): tokens[i] of lens[i] bytes (len 0 = never allowed). */
tern_status srv_jvocab_from_bytes(const char *const *tokens, const size_t *lens, int n_vocab, const int *eos,
                                  int n_eos, srv_jvocab **out, tern_error *err);
void srv_jvocab_free(srv_jvocab *v);

/* The matcher borrows g and v (they must outlive it). */
tern_status srv_jmatch_new(const srv_jgram *g, const srv_jvocab *v, srv_jmatch **out, tern_error *err);
void srv_jmatch_free(srv_jmatch *m);
/* Mask logits[n_vocab] in place. Returns 0, or -1 when no token is allowed (a bug). */
int srv_jmatch_mask(srv_jmatch *m, float *logits, int n_vocab);
/* Advance by one token (EOS ids are accepted when complete). 0 ok, -1 the token is invalid. */
int srv_jmatch_accept(srv_jmatch *m, int32_t tok);
/* Advance by raw bytes (tests). 0 ok, -1 invalid (the state is then unchanged). */
int srv_jmatch_feed(srv_jmatch *m, const char *bytes, size_t n);
/* 1 if the text so far is one complete value (EOS would be allowed). */
int srv_jmatch_complete(const srv_jmatch *m);

#endif
