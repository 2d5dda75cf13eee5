/*
 * stop.h — stop strings over streamed text.
 *
 * Feed text chunks as they are produced; each call returns the text that is safe to show.
 * A suffix that could still become a stop string is held back; when a stop string is
 * complete, the call returns the text before it and the matcher is done (later feeds return
 * nothing). Among several stop strings the one whose occurrence *ends* first wins (ties: the
 * one that starts first), so the result does not depend on how the text was chunked.
 * Empty stop strings are ignored. Chunks and stop strings are byte strings; for valid UTF-8
 * input the held-back point is always a character boundary.
 */
#ifndef TERN_TEXT_STOP_H
#define TERN_TEXT_STOP_H

#include "tern.h"
#include <stddef.h>

typedef struct tern_stop tern_stop;

tern_status tern_stop_new(tern_stop **out, const char *const *stops, size_t n_stops, tern_error *err);
/* Feed a chunk. *text / *len: the text to emit now (pointer valid until the next call).
 * Returns 1 when a stop string has matched (then *text is the remaining text before it),
 * 0 otherwise, or a negative tern_status on allocation failure. */
int tern_stop_feed(tern_stop *s, const char *chunk, size_t n, const char **text, size_t *len);
/* End of stream without a stop: the held-back text. */
void tern_stop_flush(tern_stop *s, const char **text, size_t *len);
/* Index of the stop string that matched, or -1. */
int tern_stop_which(const tern_stop *s);
void tern_stop_reset(tern_stop *s);
void tern_stop_free(tern_stop *s);

#endif
