/*
 * tp_util.h — for the tensor-parallel tests that can also run on GPU ranks (TERN_TEST_DEVICE=cuda):
 * tp_gpus_ok(n, what) opens and closes a group of n CUDA ranks; when that fails (fewer GPUs, no
 * CUDA build) it prints "SKIP: what: reason" and returns 0. Header-only; test_model_tp*.c.
 */
#ifndef TERN_TP_UTIL_H
#define TERN_TP_UTIL_H

#include "model/tp.h"

#include <stdio.h>

static inline int tp_gpus_ok(int n, const char *what) {
    tern_tp *tp = NULL;
    tern_error e = {0};
    tern_tp_opts to = {.n = n, .cuda = 1};
    if (tern_tp_open(&tp, &to, &e)) {
        printf("SKIP: %s: %s\n", what, e.msg);
        return 0;
    }
    tern_tp_close(tp);
    return 1;
}

#endif
