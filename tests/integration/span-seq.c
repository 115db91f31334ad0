/* SPDX-License-Identifier: MIT */
/*
 * span-seq.c - the sequence of calls that a group spanning "nodes" must answer as a flat group
 * of the same ranks does, byte for byte (span-check under mpirun, test-span with a test
 * engine). Each call's status and result are logged; span_seq_diff() compares two logs.
 *
 * It covers ragged gathers (rank and strided order, pad_first, valid_rows, keep_rows, a
 * root), objects, reduce (f32 sums that round: bitwise), broadcast, bytes,
 * pad_across_processes, barrier, a mismatch every rank reports alike, gathers longer than
 * the engine's first round, and eval passes: Accelerate-like batches with two calls and
 * objects per batch, a DistributedSampler's strided order, and uneven loaders (ranks whose
 * loader runs out first, then replay what they missed).
 */
#define _GNU_SOURCE
#include "span-seq.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int span_stop_rank = -1, span_stop_at = -1;
int (*span_seq_read_device)(int device, void *dst, const void *src, size_t bytes);
static int R, W, step_no;

static void put(SpanLog *l, const void *p, size_t n) {
        if (l->n + n > l->cap) {
                l->cap = (l->n + n) * 2 + 4096;
                l->b = realloc(l->b, l->cap);
                if (!l->b)
                        abort();
        }
        memcpy(l->b + l->n, p, n);
        l->n += n;
}

static void put_tensor(SpanLog *l, const deval_tensor *t) {
        size_t bytes = deval_dtype_size(t->dtype);
        put(l, &t->dtype, 4);
        put(l, &t->ndim, 4);
        for (int d = 0; d < t->ndim; d++) {
                put(l, &t->shape[d], 8);
                bytes *= (size_t)t->shape[d];
        }
        if (t->ndim == 0)
                bytes = t->data ? bytes : 0;
        if (bytes && t->device >= 0) { /* a device group's result, read back */
                void *host = malloc(bytes);
                if (!host || !span_seq_read_device ||
                    span_seq_read_device(t->device, host, t->data, bytes) < 0)
                        abort();
                put(l, host, bytes);
                free(host);
        } else if (bytes) {
                put(l, t->data, bytes);
        }
}

/* one entry per call: its status, then what it returned */
static void entry(SpanLog *l, int status) {
        l->entries++;
        l->failed += status < 0;
        put(l, &status, 4);
}

static int check(deval_group *g, SpanLog *l, int r, const char *what) {
        if (r < 0 &&
            (r == DEVAL_EPEER || r == DEVAL_ETIMEDOUT || r == DEVAL_EDAEMON || r == DEVAL_EPROTO)) {
                printf("span-check: rank %d: %s: %s: %s\n", R, what, deval_strerror(r),
                       deval_errmsg(g));
                fflush(stdout);
                exit(3);
        }
        entry(l, r);
        if (r < 0 && getenv("SPAN_VERBOSE"))
                fprintf(stderr, "span-check: rank %d: %s: %s\n", R, what, deval_errmsg(g));
        return r;
}

static void maybe_stop(bool span) {
        step_no++;
        if (span && R == span_stop_rank && step_no == span_stop_at)
                raise(SIGSTOP);
}

static float val(int r, int i, int j) {
        return (float)(r * 1000 + i) + (float)j / 7.0f + 1e-3f * (float)(r + 1);
}

/* n rows of [rows, cols] f32 and [rows] i64 from rank r, starting at sample first */
static void make(int r, int first, int rows, int cols, float *x, int64_t *y, deval_tensor t[2]) {
        for (int i = 0; i < rows; i++) {
                for (int j = 0; j < cols; j++)
                        x[i * cols + j] = val(r, first + i, j);
                y[i] = (int64_t)(first + i) * 10 + r;
        }
        t[0] = (deval_tensor){
                .data = x, .dtype = DEVAL_F32, .ndim = 2, .shape = {rows, cols}, .device = -1};
        t[1] = (deval_tensor){
                .data = y, .dtype = DEVAL_I64, .ndim = 1, .shape = {rows}, .device = -1};
}

static void gathers(deval_group *g, SpanLog *l, bool span) {
        float x[64 * 8];
        int64_t y[64];
        deval_tensor in[2], out[2];
        for (int c = 0; c < 8; c++) {
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.order = c % 2 ? DEVAL_ORDER_STRIDED : DEVAL_ORDER_RANK;
                o.pad_first = c == 2;
                o.pad_value = c == 3 ? -2.5 : 0;
                o.valid_rows = c == 4 ? R % 3 : -1;
                o.keep_rows = c == 5 ? 3 * W - 2 : -1;
                o.root = c == 6 ? W - 1 : -1;
                int rows = c == 7 ? (R % 2 ? 0 : 5) : 1 + (R * 3 + c) % 5;
                make(R, c * 100, rows, 1 + (R + c) % 4, x, y, in);
                maybe_stop(span);
                int r = deval_gather(g, c == 3 ? 1 : 2, in, &o, out);
                if (check(g, l, r, "gather") == 0)
                        for (int i = 0; i < (c == 3 ? 1 : 2); i++)
                                put_tensor(l, &out[i]);
        }
}

/* n items (< 0: some); in a pass, one per sample */
static void objects(deval_group *g, SpanLog *l, bool span, bool metrics, int n) {
        char s[8][32];
        deval_bytes items[8];
        if (n < 0)
                n = (R * 5 + step_no) % 4;
        for (int i = 0; i < n; i++) {
                snprintf(s[i], sizeof(s[i]), "r%d-item%d-%.*s", R, i, i, "xyzw");
                items[i] = (deval_bytes){s[i], strlen(s[i])};
        }
        size_t on;
        const deval_bytes *oi;
        maybe_stop(span);
        int r = metrics ? deval_gather_objects_for_metrics(g, (size_t)n, items, NULL, &on, &oi)
                        : deval_gather_objects(g, (size_t)n, items, NULL, &on, &oi);
        if (check(g, l, r, "objects") == 0) {
                put(l, &on, sizeof(on));
                for (size_t i = 0; i < on; i++) {
                        put(l, &oi[i].len, sizeof(oi[i].len));
                        put(l, oi[i].data, oi[i].len);
                }
        }
}

static void others(deval_group *g, SpanLog *l, bool span) {
        float f[5];
        for (int i = 0; i < 5; i++)
                f[i] = 0.1f * (float)(R + 1) + 1e7f * (float)(i % 2) + 1.0f / (float)(R + 3);
        deval_tensor t = {.data = f, .dtype = DEVAL_F32, .ndim = 1, .shape = {5}, .device = -1};
        maybe_stop(span);
        if (check(g, l, deval_reduce(g, &t, DEVAL_SUM), "reduce") == 0)
                put_tensor(l, &t);
        double d[3] = {R * 0.3, -R / 7.0, 1e-9 * R};
        t = (deval_tensor){.data = d, .dtype = DEVAL_F64, .ndim = 1, .shape = {3}, .device = -1};
        maybe_stop(span);
        if (check(g, l, deval_reduce(g, &t, DEVAL_MEAN), "reduce mean") == 0)
                put_tensor(l, &t);
        int32_t b[4] = {R, R * 2, -R, 7};
        t = (deval_tensor){.data = b, .dtype = DEVAL_I32, .ndim = 1, .shape = {4}, .device = -1};
        maybe_stop(span);
        if (check(g, l, deval_broadcast(g, &t, W - 1), "broadcast") == 0)
                put_tensor(l, &t);
        char msg[64];
        snprintf(msg, sizeof(msg), "from rank %d", R);
        deval_bytes bo;
        maybe_stop(span);
        if (check(g, l, deval_broadcast_bytes(g, msg, strlen(msg), W > 1 ? 1 : 0, &bo), "bytes") ==
            0)
                put(l, bo.data, bo.len);
        float x[6 * 5];
        int64_t y[6];
        deval_tensor in[2], out;
        make(R, 0, 1 + R % 3, 2 + R % 4, x, y, in);
        maybe_stop(span);
        if (check(g, l, deval_pad_across_processes(g, &in[0], 1, -1.0, true, &out), "pad") == 0)
                put_tensor(l, &out);
        maybe_stop(span);
        check(g, l, deval_barrier(g), "barrier");
        /* a mismatch every rank must report alike */
        maybe_stop(span);
        t = (deval_tensor){
                .data = f, .dtype = DEVAL_F32, .ndim = 1, .shape = {R == 0 ? 4 : 5}, .device = -1};
        check(g, l, deval_reduce(g, &t, DEVAL_SUM), "mismatched reduce");
}

/* One eval pass: rank r runs batches(r) batches of bs rows; two calls and objects a batch.
 * keyed: a pass with keys, each sample's the dataset position its rows come from (past the
 * end, wrapped to the start: the sampler's padding). */
static void pass(deval_group *g, SpanLog *l, bool span, int num, int order, int bs, int extra,
                 bool keyed) {
        int nb = (num + W * bs - 1) / (W * bs);
        int mine = nb + (extra && R < extra ? 1 : 0) - (extra && R >= W - extra ? 1 : 0);
        float x[16 * 4];
        int64_t y[16];
        deval_tensor in[2], out[2];
        maybe_stop(span);
        check(g, l, keyed ? deval_eval_begin_keys(g, num, num) : deval_eval_begin(g, num, order),
              "eval_begin");
        for (int b = 0; b < mine; b++) {
                int first = order == DEVAL_ORDER_STRIDED ? b * bs : b * W * bs + R * bs;
                int64_t keys[16];
                for (int j = 0; j < bs; j++)
                        keys[j] = (order == DEVAL_ORDER_STRIDED ? (first + j) * W + R : first + j) %
                                  num;
                if (keyed)
                        deval_eval_batch_keys(g, bs, keys);
                else
                        deval_eval_batch(g);
                make(R, first, bs, 1 + (b + R) % 3, x, y, in);
                maybe_stop(span);
                if (check(g, l, deval_gather_for_metrics(g, 1, &in[0], NULL, out), "gfm") == 0)
                        put_tensor(l, &out[0]);
                maybe_stop(span);
                if (check(g, l, deval_gather_for_metrics(g, 1, &in[1], NULL, out), "gfm") == 0)
                        put_tensor(l, &out[0]);
                objects(g, l, span, true, bs);
        }
        maybe_stop(span);
        check(g, l, extra ? deval_eval_complete(g) : deval_eval_end(g), "eval_end");
        int64_t missed = deval_eval_missed(g);
        put(l, &missed, 8);
        for (int64_t m = 0; m < missed; m++) { /* the loop body on empty inputs */
                if (keyed)
                        deval_eval_batch_keys(g, 0, NULL);
                else
                        deval_eval_batch(g);
                make(R, 0, 0, 1, x, y, in);
                if (check(g, l, deval_gather_for_metrics(g, 1, &in[0], NULL, out), "replay") == 0)
                        put_tensor(l, &out[0]);
                if (check(g, l, deval_gather_for_metrics(g, 1, &in[1], NULL, out), "replay") == 0)
                        put_tensor(l, &out[0]);
                size_t on;
                const deval_bytes *oi;
                if (check(g, l, deval_gather_objects_for_metrics(g, 0, NULL, NULL, &on, &oi),
                          "replay objects") == 0)
                        put(l, &on, sizeof(on));
        }
        if (missed)
                check(g, l, deval_eval_replay_done(g), "replay_done");
}

/* a node's parts longer than the engine's first round: its second round carries them */
static void large(deval_group *g, SpanLog *l, bool span) {
        int rows = 200 + R * 37, cols = 16 + R % 3;
        float *x = malloc((size_t)rows * (size_t)cols * sizeof(float));
        int64_t *y = malloc((size_t)rows * sizeof(int64_t));
        deval_tensor in[2], out[2];
        make(R, 5000, rows, cols, x, y, in);
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.order = DEVAL_ORDER_STRIDED;
        maybe_stop(span);
        if (check(g, l, deval_gather(g, 2, in, &o, out), "large gather") == 0)
                for (int i = 0; i < 2; i++)
                        put_tensor(l, &out[i]);
        maybe_stop(span);
        deval_tensor t = in[0];
        t.shape[0] = 64; /* the same shape everywhere: 64 x 16 floats */
        t.shape[1] = 16;
        if (check(g, l, deval_reduce(g, &t, DEVAL_SUM), "large reduce") == 0)
                put_tensor(l, &t);
        free(x);
        free(y);
}

/* an input written straight into deval_input_buffer(), next to one the call stages after it
 * (growing the buffer's arena, which must keep what was written) */
static void buffered(deval_group *g, SpanLog *l, bool span) {
        void *buf;
        int rows = 3 + R, big = 4096 + 100 * R;
        maybe_stop(span);
        int r = deval_input_buffer(g, (size_t)rows * 4 * sizeof(float), &buf);
        if (check(g, l, r, "input buffer") < 0)
                return;
        for (int i = 0; i < rows * 4; i++)
                ((float *)buf)[i] = val(R, i / 4, i % 4);
        int64_t *y = malloc((size_t)big * sizeof(int64_t));
        for (int i = 0; i < big; i++)
                y[i] = (int64_t)R * 100000 + i;
        deval_tensor in[2] = {
                {.data = buf, .dtype = DEVAL_F32, .ndim = 2, .shape = {rows, 4}, .device = -1},
                {.data = y,
                 .dtype = DEVAL_I64,
                 .ndim = 2,
                 .shape = {rows, big / rows},
                 .device = -1}};
        deval_tensor out[2];
        if (check(g, l, deval_gather(g, 2, in, NULL, out), "buffered gather") == 0)
                for (int i = 0; i < 2; i++)
                        put_tensor(l, &out[i]);
        free(y);
}

void span_seq_part(deval_group *g, SpanLog *l, int rank, int world, bool span, int part) {
        R = rank;
        W = world;
        step_no = 0;
        if (part != 2) {
                gathers(g, l, span);
                large(g, l, span);
                buffered(g, l, span);
                objects(g, l, span, false, -1);
                others(g, l, span);
                pass(g, l, span, 37, DEVAL_ORDER_RANK, 4, 0, false);
                pass(g, l, span, 23, DEVAL_ORDER_STRIDED, 3, 0, false);
        }
        if (part != 1) {
                pass(g, l, span, 41, DEVAL_ORDER_RANK, 2, W > 2 ? 2 : 1, false);
                pass(g, l, span, 19, DEVAL_ORDER_STRIDED, 2, 1, false);
                pass(g, l, span, 29, DEVAL_ORDER_STRIDED, 3, 0, true);
                pass(g, l, span, 31, DEVAL_ORDER_RANK, 2, W > 2 ? 2 : 1, true);
        }
}

void span_seq(deval_group *g, SpanLog *l, int rank, int world, bool span) {
        span_seq_part(g, l, rank, world, span, 0);
}

int span_seq_diff(const SpanLog *a, const SpanLog *b, char *why, size_t len) {
        if (a->entries == b->entries && a->n == b->n && memcmp(a->b, b->b, a->n) == 0)
                return 0;
        size_t at = 0;
        while (at < a->n && at < b->n && a->b[at] == b->b[at])
                at++;
        snprintf(why, len, "%d and %d entries, %zu and %zu bytes, first difference at byte %zu",
                 a->entries, b->entries, a->n, b->n, at);
        return 1;
}

void span_log_free(SpanLog *l) {
        free(l->b);
        *l = (SpanLog){0};
}
