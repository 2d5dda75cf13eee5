/*
 * queue.h — the only place where the engine thread and the other threads meet.
 *
 * Any thread may submit a request, cancel one by id, ask the engine to stop, or read the
 * published statistics; all of that goes through one mutex. The engine thread drains the
 * submissions and cancellations at the start of each step (tern__queue_drain) and publishes
 * a statistics snapshot at its end, so the scheduler itself never locks anything.
 *
 * Items are intrusive: a request struct starts with a tern__qitem, so pushing allocates
 * nothing. Cancellations of requests the engine already holds are kept as ids until the next
 * drain (a small array that grows under the lock; cancel of an unknown id is harmless).
 * tern__queue_wait sleeps on the condition variable until there is work or a stop request.
 */
#ifndef TERN_RUNTIME_QUEUE_H
#define TERN_RUNTIME_QUEUE_H

#include "tern.h"
#include <pthread.h>

typedef struct tern__qitem {
    struct tern__qitem *next;
    uint64_t id;
    int cancelled;            /* set under the lock while still in the queue */
} tern__qitem;

typedef struct tern__queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tern__qitem *head, *tail;  /* submitted, not yet drained (FCFS) */
    int n_in;
    uint64_t *cancel;         /* ids to cancel at the next drain */
    int n_cancel, cap_cancel;
    int stop;                 /* tern_engine_stop was called */
    int n_live;               /* submitted and not finished (tern_engine_pending) */
    uint64_t next_id;
    tern_engine_stats stats;  /* engine-published snapshot (running, counters, KV) */
} tern__queue;

tern_status tern__queue_init(tern__queue *q, tern_error *err);
void tern__queue_free(tern__queue *q);          /* items still queued are not freed */

/* Assign the next id to `it`, append it, wake the engine. */
uint64_t tern__queue_push(tern__queue *q, tern__qitem *it);
/* Mark `id` cancelled (in place if still queued, else remembered for the next drain). */
void tern__queue_cancel(tern__queue *q, uint64_t id);
void tern__queue_stop(tern__queue *q);
/* Engine thread: take every queued item (list in FCFS order) and the pending cancel ids
 * (copied into ids[0..*n_ids), at most max_ids; the rest stay for the next drain). */
tern__qitem *tern__queue_drain(tern__queue *q, uint64_t *ids, int max_ids, int *n_ids);
/* Engine thread: a request finished (decrements the live count). */
void tern__queue_done(tern__queue *q, int n);
int tern__queue_live(tern__queue *q);
/* Engine thread: sleep until something is queued, a cancel is pending or stop is set, unless
 * `busy`. Returns 1 if stop was requested (and clears it). */
int tern__queue_wait(tern__queue *q, int busy);
/* Publish / read the statistics snapshot (waiting counts the not yet drained items too). */
void tern__queue_publish(tern__queue *q, const tern_engine_stats *st);
void tern__queue_stats(tern__queue *q, tern_engine_stats *st);

#endif
