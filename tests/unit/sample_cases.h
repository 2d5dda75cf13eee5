/*
 * sample_cases.h — random sampling cases shared by the CPU test (test_sample_device.c) and the
 * CUDA op test (tests/gpu/cuda_ops_tests_sample.h): logit rows of several shapes (spread,
 * peaked, flat, quantized to force exact ties, -inf holes, signed zeros), parameter sets
 * over every stage of the chain, and a penalty history; plus the reference: the CPU sampler
 * itself (tern_sampler_new / accept / sample), whose tokens the device op must reproduce.
 * Header-only.
 */
#ifndef TERN_SAMPLE_CASES_H
#define TERN_SAMPLE_CASES_H

#include "sample/sampler.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SC_NPARAM 12

/* Parameter set i (0 .. SC_NPARAM-1); bias lists point at static storage. */
static tern_sampler_params sc_params(int i, int V, uint64_t seed) {
    static int32_t bid[3];
    static float bval[3];
    tern_sampler_params p = tern_sampler_defaults();
    p.seed = seed;
    p.penalty_last_n = 32;
    switch (i) {
    case 0: p.temperature = 0; break;
    case 1: p.temperature = 1; break;
    case 2: p.temperature = 0.7f; p.top_k = 40; break;
    case 3: p.temperature = 1; p.top_p = 0.9f; break;
    case 4: p.temperature = 0.8f; p.top_k = 50; p.top_p = 0.95f; p.min_p = 0.05f; break;
    case 5: p.temperature = 1.5f; p.min_p = 0.1f; break;
    case 6: p.temperature = 1; p.repetition_penalty = 1.3f; p.presence_penalty = 0.5f; p.frequency_penalty = 0.25f; break;
    case 7: p.temperature = 0; p.repetition_penalty = 1.5f; break;
    case 8: p.temperature = 3.0f; p.top_p = 0.5f; break;
    case 9: p.temperature = 0.2f; p.top_k = 1; break;
    case 10: p.temperature = 1; p.top_k = 3; p.top_p = 0.3f; p.frequency_penalty = -0.5f; break;
    default:
        p.temperature = 0.9f;
        bid[0] = 1 % V; bid[1] = 5 % V; bid[2] = 1 % V;  /* a repeated id: added twice, in order */
        bval[0] = 2.5f; bval[1] = -INFINITY; bval[2] = 0.75f;
        p.bias_ids = bid; p.bias_values = bval; p.n_bias = 3;
        p.top_p = 0.99f;
        break;
    }
    return p;
}

/* Row kind k of V logits. */
static void sc_row(float *l, int V, int k, unsigned long long *rs) {
    for (int i = 0; i < V; i++) {
        float u = test_randf(rs);
        switch (k % 6) {
        case 0: l[i] = 4.0f * u; break;                                 /* spread */
        case 1: l[i] = 12.0f * u * u * u; break;                        /* peaked */
        case 2: l[i] = 0.01f * u; break;                                /* flat */
        case 3: l[i] = floorf(u * 4.0f) * 0.5f; break;                  /* exact ties */
        case 4: l[i] = (test_rand_u64(rs) & 3) ? 3.0f * u : -INFINITY; break; /* holes */
        default: l[i] = (test_rand_u64(rs) & 1) ? 0.0f : -0.0f; if (i % 7 == 0) l[i] = 0.5f * u; break;
        }
    }
}

/* A sampler for parameter set pi with a history of `nh` tokens; NULL on failure. */
static tern_sampler *sc_sampler(int pi, int V, uint64_t seed, int nh, unsigned long long *rs) {
    tern_sampler_params p = sc_params(pi, V, seed);
    tern_sampler *s = NULL;
    tern_error e = {0};
    if (tern_sampler_new(&p, V, &s, &e)) { printf("  sampler_new: %s\n", e.msg); return NULL; }
    for (int i = 0; i < nh; i++) tern_sampler_accept(s, (int32_t)(test_rand_u64(rs) % (unsigned)(V < 50 ? V : 50)));
    return s;
}

#endif
