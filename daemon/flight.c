/* SPDX-License-Identifier: MIT */
/*
 * flight.c - the flight recorder's ring and its JSON.
 */
#define _GNU_SOURCE
#include "flight.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int flight_init(Flight *f, int world) {
        *f = (Flight){.world = world};
        f->ranks = calloc((size_t)FLIGHT_STEPS * (size_t)world, sizeof(*f->ranks));
        return f->ranks ? 0 : DEVAL_ENOMEM;
}

void flight_deinit(Flight *f) {
        free(f->ranks);
        f->ranks = NULL;
}

static uint32_t fnv(uint32_t h, const void *p, size_t n) {
        const uint8_t *b = p;
        for (size_t i = 0; i < n; i++)
                h = (h ^ b[i]) * 16777619u;
        return h;
}

/**
 * flight_fingerprint() - FNV-1a over what must agree across ranks: the operation, the
 * options, and each tensor's dtype and number of dims. Not the dims themselves: ranks may
 * differ in any of them (dim 0 is concatenated, the others padded).
 */
uint32_t flight_fingerprint(const DvRequest *q) {
        uint32_t h = 2166136261u;
        uint32_t n = DV_MIN(q->ntensors, (uint32_t)DEVAL_MAX_TENSORS);
        h = fnv(h, &q->op, sizeof(q->op));
        h = fnv(h, &q->ntensors, sizeof(q->ntensors));
        h = fnv(h, &q->pad_first, sizeof(q->pad_first));
        h = fnv(h, &q->keep_rows, sizeof(q->keep_rows));
        h = fnv(h, &q->order, sizeof(q->order));
        h = fnv(h, &q->root, sizeof(q->root));
        h = fnv(h, &q->reduce_op, sizeof(q->reduce_op));
        h = fnv(h, &q->dim, sizeof(q->dim));
        for (uint32_t i = 0; i < n; i++) {
                const DvTensorDesc *t = &q->t[i];
                h = fnv(h, &t->dtype, sizeof(t->dtype));
                h = fnv(h, &t->ndim, sizeof(t->ndim));
        }
        return h;
}

void flight_record(Flight *f, uint32_t seq, const DvRequest *reqs, const uint64_t *arrived_ns,
                   int status, const char *msg, uint64_t bytes) {
        size_t at = f->written % FLIGHT_STEPS;
        FlightStep *s = &f->steps[at];
        FlightRank *r = &f->ranks[at * (size_t)f->world];
        uint64_t first = 0;
        for (int k = 0; k < f->world; k++)
                if (arrived_ns[k] && (!first || arrived_ns[k] < first))
                        first = arrived_ns[k];
        *s = (FlightStep){.seq = seq, .status = status, .first_ns = first, .bytes = bytes};
        snprintf(s->msg, sizeof(s->msg), "%s", msg ? msg : "");
        for (int k = 0; k < f->world; k++) {
                bool came = arrived_ns[k] != 0;
                r[k] = (FlightRank){
                        .op = came ? reqs[k].op : 0,
                        .fingerprint = came ? flight_fingerprint(&reqs[k]) : 0,
                        .arrival_us = came ? (uint32_t)DV_MIN((arrived_ns[k] - first) / 1000,
                                                              (uint64_t)UINT32_MAX)
                                           : 0,
                };
        }
        f->written++;
}

typedef struct {
        char *buf;
        size_t len, cap;
        bool failed;
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...) {
        va_list ap;
        for (int tries = 0; tries < 2 && !o->failed; tries++) {
                va_start(ap, fmt);
                int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
                va_end(ap);
                if (n < 0) {
                        o->failed = true;
                        return;
                }
                if ((size_t)n < o->cap - o->len) {
                        o->len += (size_t)n;
                        return;
                }
                size_t cap = (o->cap + (size_t)n) * 2;
                char *p = realloc(o->buf, cap);
                if (!p) {
                        o->failed = true;
                        return;
                }
                o->buf = p;
                o->cap = cap;
        }
}

/* A JSON string of untrusted text (a rank's words may be in a step's message). */
static void put_string(Out *o, const char *s) {
        put(o, "\"");
        for (; *s; s++) {
                unsigned char c = (unsigned char)*s;
                if (c == '"' || c == '\\')
                        put(o, "\\%c", c);
                else if (c < 0x20 || c >= 0x7f)
                        put(o, "\\u%04x", c);
                else
                        put(o, "%c", c);
        }
        put(o, "\"");
}

/* Whether the ranks' calls at a recorded step disagree, or some rank never came. */
static bool diverged(const Flight *f, size_t at) {
        const FlightRank *r = &f->ranks[at * (size_t)f->world];
        for (int k = 0; k < f->world; k++)
                if (!r[k].op || r[k].op != r[0].op || r[k].fingerprint != r[0].fingerprint)
                        return true;
        return false;
}

char *flight_json(const Flight *f, const char *group, size_t *ret_len) {
        Out o = {.cap = 4096};
        if (!(o.buf = malloc(o.cap)))
                return NULL;
        uint64_t n = DV_MIN(f->written, (uint64_t)FLIGHT_STEPS);
        uint64_t from = f->written - n;
        int64_t first_div = -1;
        for (uint64_t i = from; i < f->written && first_div < 0; i++)
                if (diverged(f, i % FLIGHT_STEPS))
                        first_div = f->steps[i % FLIGHT_STEPS].seq;
        put(&o, "{\"group\":");
        put_string(&o, group);
        put(&o, ",\"world_size\":%d,\"recorded\":%llu,\"first_divergence\":", f->world,
            (unsigned long long)f->written);
        if (first_div < 0)
                put(&o, "null");
        else
                put(&o, "%lld", (long long)first_div);
        put(&o, ",\"steps\":[");
        for (uint64_t i = from; i < f->written; i++) {
                size_t at = i % FLIGHT_STEPS;
                const FlightStep *s = &f->steps[at];
                put(&o, "%s{\"seq\":%u,\"status\":", i == from ? "" : ",", s->seq);
                put_string(&o, s->status ? deval_strerror(s->status) : "ok");
                put(&o,
                    ",\"bytes\":%llu,\"diverged\":%s,\"message\":", (unsigned long long)s->bytes,
                    diverged(f, at) ? "true" : "false");
                put_string(&o, s->msg);
                put(&o, ",\"ranks\":[");
                const FlightRank *r = &f->ranks[at * (size_t)f->world];
                for (int k = 0; k < f->world; k++) {
                        put(&o, "%s{\"rank\":%d,\"op\":", k ? "," : "", k);
                        if (r[k].op)
                                put_string(&o, dv_op_name(r[k].op));
                        else
                                put(&o, "null");
                        put(&o, ",\"fingerprint\":\"%08x\",\"arrival_us\":%u}", r[k].fingerprint,
                            r[k].arrival_us);
                }
                put(&o, "]}");
        }
        put(&o, "]}\n");
        if (o.failed) {
                free(o.buf);
                return NULL;
        }
        *ret_len = o.len;
        return o.buf;
}
