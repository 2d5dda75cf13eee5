/*
 * test.h — the tiny test harness every C test uses.
 *
 * Each test binary prints one line per test: "PASS: name", "FAIL: name" or
 * "SKIP: name: why"; tests/run.sh counts them across binaries and scripts and ends with
 * "N passed, N failed". A binary that dies without printing FAIL is counted as a failure.
 *
 *   TEST(parses_header) { CHECK(x == 1, "x=%d", x); }
 *   int main(void) { RUN(parses_header); return test_done(); }
 * TERN_TEST_ONLY=part,part runs only the tests whose names contain a part.
 */
#ifndef TERN_TEST_H
#define TERN_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int t_pass_, t_fail_, t_cur_fail_;

#define TEST(name) static void name(void)
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            t_cur_fail_++;                                                     \
            printf("  check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                               \
            printf("\n");                                                      \
            fflush(stdout);                                                    \
        }                                                                      \
    } while (0)
/* TERN_TEST_ONLY=a,b: run only the tests whose names contain one of the comma-separated parts (the
 * others print nothing; for short GPU calls) */
static inline int t_selected_(const char *name) {
    const char *only = getenv("TERN_TEST_ONLY");
    if (!only || !*only) return 1;
    char part[128];
    for (const char *p = only; *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof part) {
            memcpy(part, p, n);
            part[n] = 0;
            if (strstr(name, part)) return 1;
        }
        p += n + (p[n] == ',');
    }
    return 0;
}

static inline double t_now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* a test that took 2 s or more says so after its name (slow GPU / sanitizer runs show where the time went) */
#define RUN(name)                                                              \
    do {                                                                       \
        if (!t_selected_(#name)) break;                                        \
        t_cur_fail_ = 0;                                                       \
        const double t0_ = t_now_();                                           \
        name();                                                                \
        const double dt_ = t_now_() - t0_;                                     \
        printf("%s: %s", t_cur_fail_ ? "FAIL" : "PASS", #name);               \
        if (dt_ >= 2.0) printf(" (%.1f s)", dt_);                              \
        printf("\n");                                                          \
        if (t_cur_fail_) t_fail_++;                                            \
        else t_pass_++;                                                        \
        fflush(stdout);                                                        \
    } while (0)
#define SKIP(name, why) (printf("SKIP: %s: %s\n", name, why), fflush(stdout))

static inline int test_done(void) { return t_fail_ ? 1 : 0; }

/* ||a-b||2 / ||b||2 */
static inline double test_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Deterministic PRNG for tests (xorshift64*). */
static inline unsigned long long test_rand_u64(unsigned long long *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static inline float test_randf(unsigned long long *s) { /* uniform [-1, 1) */
    return (float)((test_rand_u64(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

#endif
