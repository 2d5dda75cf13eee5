/*
 * sse.c — Server-Sent Events responses driven by a job (srv.h).
 *
 * The response is created with MHD_create_response_from_callback and an unknown size, so
 * MHD sends it with chunked transfer encoding. The content callback runs on the
 * connection's own thread (thread-per-connection mode), so it may block in srv_job_next
 * until the next text piece (a piece holds everything that arrived since the last one, so
 * one wake-up makes one write); each piece is formatted by the API family (start / piece /
 * end / error) straight into one reusable buffer (srv_sse_begin/end around the JSON writer,
 * no per-token allocation once it has grown) that is handed out in as many callback calls
 * as needed. Every
 * call returns at least one byte until the end, so MHD writes (and flushes) each event as
 * it is produced. When the client goes away, either srv_job_next sees the closed socket or
 * MHD fails a write and calls the free callback; both cancel the job.
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>

typedef struct sse {
    tern_server *s;
    srv_job *job;
    const srv_stream_fmt *f;
    void *ctx;
    tern_jw out;
    size_t sent;
    int started, finished;
} sse;

void srv_sse_data(tern_jw *out, const char *event, const char *json, size_t n) {
    if (event) {
        tern_jw_text(out, "event: ", 7);
        tern_jw_text(out, event, strlen(event));
        tern_jw_text(out, "\n", 1);
    }
    tern_jw_text(out, "data: ", 6);
    tern_jw_text(out, json, n);
    tern_jw_text(out, "\n\n", 2);
}

void srv_sse_begin(tern_jw *out, const char *event) {
    if (event) {
        tern_jw_text(out, "event: ", 7);
        tern_jw_text(out, event, strlen(event));
        tern_jw_text(out, "\n", 1);
    }
    tern_jw_text(out, "data: ", 6);
}

void srv_sse_end(tern_jw *out) { tern_jw_text(out, "\n\n", 2); }

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    sse *x = cls;
    (void)pos;
    while (x->out.len - x->sent == 0) {
        if (x->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        tern_jw_reset(&x->out);
        x->sent = 0;
        if (!x->started) {
            x->started = 1;
            x->f->start(x->ctx, &x->out);
            continue;
        }
        srv_piece p;
        srv_result res;
        srv_error e = {0};
        int rc = srv_job_next(x->job, &p, &res, &e);
        if (rc > 0) x->f->piece(x->ctx, &p, &x->out);
        else if (rc == 0) { x->f->end(x->ctx, &res, &x->out); x->finished = 1; }
        else {
            if (e.http == 499) { x->finished = 1; return MHD_CONTENT_READER_END_WITH_ERROR; } /* nobody to tell */
            x->f->error(x->ctx, &e, &x->out);
            x->finished = 1;
        }
        if (x->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = x->out.len - x->sent;
    if (n > max) n = max;
    memcpy(buf, x->out.buf + x->sent, n);
    x->sent += n;
    return (ssize_t)n;
}

static void release(void *cls) {
    sse *x = cls;
    srv_job_free(x->job);                       /* cancels the request if it still runs */
    if (x->f->free_ctx) x->f->free_ctx(x->ctx);
    tern_jw_free(&x->out);
    free(x);
}

enum MHD_Result srv_stream(tern_server *s, struct MHD_Connection *c, srv_job *j, const srv_stream_fmt *f, void *ctx) {
    sse *x = calloc(1, sizeof *x);
    if (!x) {
        srv_job_free(j);
        if (f->free_ctx) f->free_ctx(ctx);
        return MHD_NO;
    }
    x->s = s;
    x->job = j;
    x->f = f;
    x->ctx = ctx;
    tern_jw_init(&x->out);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, x, release);
    if (!resp) { release(x); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    srv_add_common_headers(s, resp);
    atomic_fetch_add(&s->n_streams, 1);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}
