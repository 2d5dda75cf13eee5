/*
 * pool.h — one persistent thread pool for CPU kernels.
 *
 * tern_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once for every ith in [0, nth) —
 * ith 0 on the calling thread, the others on the pool's workers — and returns when all
 * have finished (a barrier). Workers spin briefly waiting for the next job (kernels come
 * back-to-back in a forward pass) and then sleep on a condition variable, so an idle pool
 * costs no CPU. A pool is driven by one thread at a time; fn must not call tern_pool_run
 * on the same pool (no nesting).
 *
 *   tern_pool *p = tern_pool_create(0);     // 0: one thread per online core
 *   tern_pool_run(p, work, &args);
 *   tern_pool_free(p);                       // accepts NULL
 */
#ifndef TERN_POOL_H
#define TERN_POOL_H

typedef struct tern_pool tern_pool;
typedef void (*tern_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: number of online cores. NULL when threads cannot be created
 * (a pool of 1 never fails except out of memory). */
tern_pool *tern_pool_create(int n_threads);
int tern_pool_size(const tern_pool *pool);     /* 1 for a NULL pool */
void tern_pool_run(tern_pool *pool, tern_pool_fn fn, void *ctx); /* NULL pool: fn(ctx, 0, 1) */
void tern_pool_free(tern_pool *pool);
int tern_cpu_count(void);                      /* online cores (>= 1) */

#endif
