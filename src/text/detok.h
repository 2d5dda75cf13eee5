/*
 * detok.h — incremental detokenization for streaming output.
 *
 * Feed generated ids one at a time; each step returns the text that became final. Same
 * algorithm as HF `DecodeStream::step`: keep a small window of ids and the text already
 * emitted for it (the prefix); after appending an id, decode the window; emit the part past
 * the prefix only when the text grew and does not end in U+FFFD (an incomplete UTF-8
 * sequence or an unfinished <0xXX> byte run is held back); then slide the window so it keeps
 * the ids of the last emitted chunk as context. Because the window always starts with
 * already-emitted context, decoder rules that look at the first token (Metaspace, Strip of
 * the leading space) act exactly as they do when decoding the whole sequence, and the
 * concatenation of all steps plus tern_detok_flush equals tern_tokenizer_decode of all ids.
 * (Exception, shared with HF: an *invalid* byte-fallback run, which a full decode renders as
 * one U+FFFD per byte of the whole run, may show differently once its valid head has been
 * emitted; the output is still valid UTF-8.)
 * Cost per step is O(window), independent of the stream length. Not thread-safe per object.
 */
#ifndef TERN_TEXT_DETOK_H
#define TERN_TEXT_DETOK_H

#include "text/tokenizer.h"

typedef struct tern_detok tern_detok;

tern_status tern_detok_new(tern_detok **out, const tern_tokenizer *tok, int skip_special, tern_error *err);
/* Append one id. *text / *len: newly completed text (len 0: nothing yet). The pointer stays
 * valid until the next call on d. Always valid UTF-8. */
tern_status tern_detok_step(tern_detok *d, int32_t id, const char **text, size_t *len, tern_error *err);
/* End of stream: the text still held back (may end in U+FFFD for a truly broken byte run);
 * the detokenizer is then reset. */
tern_status tern_detok_flush(tern_detok *d, const char **text, size_t *len, tern_error *err);
void tern_detok_reset(tern_detok *d);
void tern_detok_free(tern_detok *d);

#endif
