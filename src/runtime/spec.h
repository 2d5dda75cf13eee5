/*
 * spec.h — prompt-lookup (n-gram) drafting for speculative decoding.
 *
 * A decoding sequence often repeats itself (code, quotes of the prompt, lists): the tokens
 * that followed an earlier occurrence of its current suffix are a cheap guess of what comes
 * next. The scheduler (sched.c) feeds [last token, draft...] as consecutive rows of one step
 * and keeps the longest prefix of the draft that the model itself would have produced (see
 * sched.h for the acceptance rule and why the output does not change).
 */
#ifndef TERN_RUNTIME_SPEC_H
#define TERN_RUNTIME_SPEC_H

#include <stdint.h>

/* Longest suffix (TERN_SPEC_NGRAM_MAX..1 tokens) of tok[0..n) that occurred earlier (most
 * recent occurrence wins); writes the k tokens that followed it (continued periodically past
 * the end of tok) into draft[] and returns k (0: no match, or k <= 0). */
#define TERN_SPEC_NGRAM_MAX 3
int tern__spec_draft(const int32_t *tok, int n, int k, int32_t *draft);

#endif
