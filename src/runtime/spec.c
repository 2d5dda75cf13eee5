/*
 * spec.c — prompt-lookup drafting (see spec.h).
 *
 * For n = 3, 2, 1: the suffix s = tok[len-n, len) is searched backwards for an earlier start
 * i < len - n with tok[i, i+n) == s; the draft is tok[i+n, i+n+k), where positions >= len
 * read the draft itself (the pattern is extrapolated with period len - n - i: a run of one
 * token drafts k copies instead of one). The most recent occurrence is taken because it
 * reflects the local pattern (e.g. the current loop of a repetition) better than the first. The scan is O(len) per n, a few microseconds at the
 * context lengths we serve, negligible next to a forward step; no state is kept between steps.
 */
#include "runtime/spec.h"

#include <string.h>

static int suffix_at(const int32_t *tok, int len, int n, int i) {
    return !memcmp(tok + i, tok + len - n, sizeof(int32_t) * (size_t)n);
}

int tern__spec_draft(const int32_t *tok, int n, int k, int32_t *draft) {
    if (!tok || k <= 0 || n < 2) return 0;
    for (int g = TERN_SPEC_NGRAM_MAX; g >= 1; g--) {
        if (g >= n) continue;
        for (int i = n - g - 1; i >= 0; i--) {
            if (tok[i + g - 1] != tok[n - 1] || !suffix_at(tok, n, g, i)) continue;
            int d = 0;
            /* past the end, the continuation repeats itself (period n - g - i) */
            for (int j = i + g; d < k; j++) draft[d++] = j < n ? tok[j] : draft[j - n];
            return d;
        }
    }
    return 0;
}
