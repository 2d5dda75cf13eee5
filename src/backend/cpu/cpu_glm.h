/*
 * cpu_glm.h — the GLM-5 op table of both CPU backends (ops.h tern_glm_ops; cpu_glm.c).
 *
 * One scalar implementation serves "cpu-ref" and "cpu": it is the spec the CUDA kernels
 * will be tested against, and at the sizes of the parity fixtures it is fast enough. The
 * fast backend can replace entries with threaded versions later without changing callers.
 */
#ifndef TERN_CPU_GLM_H
#define TERN_CPU_GLM_H

#include "ops/ops.h"

extern const tern_glm_ops tern__cpu_glm_ops;

#endif
