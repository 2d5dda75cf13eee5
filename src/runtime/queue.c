/*
 * queue.c — the submission / cancellation queue between any thread and the engine thread
 * (see queue.h). Every function takes the one mutex for a few instructions; only
 * tern__queue_wait sleeps (on the condition variable, woken by push, cancel and stop).
 */
#include "runtime/queue.h"

#include "base/base.h"
#include <stdlib.h>
#include <string.h>

tern_status tern__queue_init(tern__queue *q, tern_error *err) {
    memset(q, 0, sizeof *q);
    if (pthread_mutex_init(&q->mu, NULL)) return tern_err(err, TERN_EINTERNAL, "queue: pthread_mutex_init failed");
    if (pthread_cond_init(&q->cv, NULL)) {
        pthread_mutex_destroy(&q->mu);
        return tern_err(err, TERN_EINTERNAL, "queue: pthread_cond_init failed");
    }
    q->next_id = 1;
    return TERN_OK;
}

void tern__queue_free(tern__queue *q) {
    if (!q) return;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->cancel);
    q->cancel = NULL;
}

uint64_t tern__queue_push(tern__queue *q, tern__qitem *it) {
    pthread_mutex_lock(&q->mu);
    it->id = q->next_id++;
    it->next = NULL;
    it->cancelled = 0;
    if (q->tail) q->tail->next = it;
    else q->head = it;
    q->tail = it;
    q->n_in++;
    q->n_live++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return it->id;
}

void tern__queue_cancel(tern__queue *q, uint64_t id) {
    pthread_mutex_lock(&q->mu);
    int found = 0;
    for (tern__qitem *it = q->head; it; it = it->next)
        if (it->id == id) { it->cancelled = 1; found = 1; break; }
    /* ids never issued cannot name anything: ignore them (keeps the array bounded) */
    if (!found && id > 0 && id < q->next_id) {
        if (q->n_cancel == q->cap_cancel) {
            int cap = q->cap_cancel ? 2 * q->cap_cancel : 16;
            uint64_t *p = realloc(q->cancel, sizeof *p * (size_t)cap);
            if (p) { q->cancel = p; q->cap_cancel = cap; }
        }
        if (q->n_cancel < q->cap_cancel) q->cancel[q->n_cancel++] = id;
    }
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void tern__queue_stop(tern__queue *q) {
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

tern__qitem *tern__queue_drain(tern__queue *q, uint64_t *ids, int max_ids, int *n_ids) {
    pthread_mutex_lock(&q->mu);
    tern__qitem *list = q->head;
    q->head = q->tail = NULL;
    q->n_in = 0;
    int n = TERN_MIN(q->n_cancel, max_ids);
    if (n > 0) {
        memcpy(ids, q->cancel, sizeof *ids * (size_t)n);
        memmove(q->cancel, q->cancel + n, sizeof *ids * (size_t)(q->n_cancel - n));
        q->n_cancel -= n;
    }
    *n_ids = n;
    pthread_mutex_unlock(&q->mu);
    return list;
}

void tern__queue_done(tern__queue *q, int n) {
    pthread_mutex_lock(&q->mu);
    q->n_live -= n;
    pthread_mutex_unlock(&q->mu);
}

int tern__queue_live(tern__queue *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->n_live;
    pthread_mutex_unlock(&q->mu);
    return n;
}

int tern__queue_wait(tern__queue *q, int busy) {
    pthread_mutex_lock(&q->mu);
    while (!busy && !q->stop && !q->head && !q->n_cancel) pthread_cond_wait(&q->cv, &q->mu);
    int stop = q->stop;
    q->stop = 0;
    pthread_mutex_unlock(&q->mu);
    return stop;
}

void tern__queue_publish(tern__queue *q, const tern_engine_stats *st) {
    pthread_mutex_lock(&q->mu);
    q->stats = *st;
    pthread_mutex_unlock(&q->mu);
}

void tern__queue_stats(tern__queue *q, tern_engine_stats *st) {
    pthread_mutex_lock(&q->mu);
    *st = q->stats;
    st->waiting += q->n_in;
    pthread_mutex_unlock(&q->mu);
}
