/*
 * pool.c — persistent worker threads with a spin-then-sleep start signal and a spinning
 * completion barrier.
 *
 * Start: the caller publishes (fn, ctx), then bumps `gen`. A worker that has seen
 * generation g spins on `gen` for a while (cheap when kernels come back-to-back), then
 * registers itself in `n_sleeping` and waits on `cv` after re-checking `gen` under the
 * mutex. The caller broadcasts only when someone sleeps; because the sleeper increments
 * `n_sleeping` before its locked re-check and the caller reads it after bumping `gen`
 * (both seq_cst), a wake-up can never be lost.
 * Finish: each worker increments `n_done`; the caller runs its own share (ith 0) and spins
 * (with sched_yield after a while) until all nth-1 workers reported.
 */
#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS 4000 /* pause is ~10-140 cycles: ~0.05-0.3 ms of spinning before sleeping */

typedef struct worker {
    struct tern_pool *pool;
    int ith;
    pthread_t th;
} worker;

struct tern_pool {
    int nth;
    worker *w;
    tern_pool_fn fn;
    void *ctx;
    atomic_uint gen;
    atomic_int n_done;
    atomic_int n_sleeping;
    atomic_int quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

int tern_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    tern_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ITERS) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        p->fn(p->ctx, w->ith, p->nth);
        atomic_fetch_add(&p->n_done, 1);
    }
    return NULL;
}

tern_pool *tern_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = tern_cpu_count();
    if (n_threads > 1024) n_threads = 1024;
    tern_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->w = calloc((size_t)n_threads, sizeof *p->w);
        if (!p->w) { tern_pool_free(p); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            p->w[i].pool = p;
            p->w[i].ith = i;
            if (pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]) != 0) {
                p->nth = i; /* only threads 1..i-1 exist: shut those down */
                tern_pool_free(p);
                return NULL;
            }
        }
    }
    return p;
}

int tern_pool_size(const tern_pool *pool) { return pool ? pool->nth : 1; }

void tern_pool_run(tern_pool *p, tern_pool_fn fn, void *ctx) {
    if (!p || p->nth == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->n_done, 0);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->nth);
    int spins = 0;
    while (atomic_load(&p->n_done) < p->nth - 1) {
        if (++spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
}

void tern_pool_free(tern_pool *p) {
    if (!p) return;
    if (p->w) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->quit, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->nth; i++) pthread_join(p->w[i].th, NULL);
        free(p->w);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
