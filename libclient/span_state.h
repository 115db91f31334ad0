/* SPDX-License-Identifier: MIT */
/*
 * span_state.h - the state of a group that spans machines, shared by the modules that run it:
 * span.c (the join, a collective from start to end, the handle's life), span_exchange.c (the
 * exchange of every rank's part through the node's leader and the engine) and span_step.c
 * (the step every rank runs over all parts). Each field says which of them writes it. The
 * bytes themselves are span_wire.h's.
 */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "collective.h"
#include "handle.h"
#include "pass.h"
#include "span_wire.h"
#include "util.h"
#include "wire.h"

/* the node's group outlives a leader's wait on the engine: its ranks hear why it failed. Its
 * timeout is the join's and this much more (span.c), which its messages say as the join's
 * (dv_span_say_timeout()). */
#define DV_SPAN_GRACE_MS 15000

struct DvSpan {
        /* the join's (span.c) */
        deval_group *local; /* this rank in its node's group */
        deval_engine eng;
        int node, nodes, local_rank, local_world;
        uint64_t max_out; /* the largest result: the smallest any rank takes, alike on all */
        DvRequest req;    /* this rank's request: g->req */
        /* the layout: filled by the join's exchange, read by every later one and the step */
        int *node_of;    /* [world] */
        int *node_ranks; /* [world]: each node's ranks in local rank order, node by node */
        int *node_start; /* [nodes + 1] into node_ranks */
        bool laid_out;   /* the join's exchange filled them */
        /* the exchange's (span_exchange.c) */
        uint8_t *round1; /* a leader's: every node's first round */
        size_t round1_cap;
        uint8_t *failure; /* a leader's: a failure it broadcasts to its node */
        size_t failure_cap;
        /* every rank's part, by global rank: the exchange writes them, the step reads them
         * (and empties a parked rank's) */
        DvRequest *reqs; /* [world] as each rank described its step */
        const uint8_t **data;
        uint64_t *dlen;
        /* the step's (span_step.c) */
        int64_t **prefix; /* objects */
        DvShape *shapes;  /* [inputs_cap] */
        const uint8_t **srcs;
        size_t inputs_cap;
        int64_t *valid;
        DvPass pass; /* the eval pass, as every rank runs it (span_step.c) */
        uint8_t *out;
        size_t out_cap;
        DvResult res;
        char msg[DV_MSG_MAX]; /* a failure of the exchange or the step, said in global ranks */
};

/* Step failures: in the span's message, with the status. */
static inline int dv_span_fail(DvSpan *sp, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static inline int dv_span_fail(DvSpan *sp, int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sp->msg, sizeof(sp->msg), fmt, ap);
        va_end(ap);
        return status;
}

/* Does a failure end the group (a rank or a devald gone, a node silent, bytes that broke the
 * protocol), or the step alone (ranks that disagree, a quota, an argument)? */
static inline bool dv_span_sticks(int status) {
        return status == DEVAL_EPEER || status == DEVAL_EDAEMON || status == DEVAL_ETIMEDOUT ||
               status == DEVAL_EABORTED || status == DEVAL_EPROTO || status < DEVAL_ESYS ||
               status >= 0;
}

/* A failure of the exchange: every later call returns it. fn, the user's call, is named
 * unless NULL: a failure of the group (a rank gone, a node silent) is the group's, as a group
 * of one machine says it. */
static inline int dv_span_broken(deval_group *g, int status, const char *fn, const char *msg) {
        if (status < DEVAL_ESYS || status >= 0)
                status = DEVAL_EPROTO;
        g->failed = status;
        return fn ? dv_set_err(g, status, "%s: %s", fn, msg) : dv_set_err(g, status, "%s", msg);
}

/* The step of call fn failed on every rank, for the reason msg says: the group goes on, as
 * on one machine, unless the failure is one that ends it (dv_span_sticks()). */
static inline int dv_span_step_failed(deval_group *g, int status, const char *fn, const char *msg) {
        if (dv_span_sticks(status))
                return dv_span_broken(g, status, NULL, msg);
        g->seq++; /* the step is over: the next call is the next one */
        return dv_set_err(g, status, "%s: %s", fn, msg);
}

/* *p holds at least need bytes (DV_ARENA_ALIGN aligned, what it held kept), or false. */
static inline bool dv_span_grow(uint8_t **p, size_t *cap, size_t need) {
        if (need <= *cap)
                return true;
        size_t n = DV_MAX(need, *cap * 2);
        void *q = NULL;
        if (posix_memalign(&q, DV_ARENA_ALIGN, DV_MAX(n, (size_t)64)) != 0)
                return false;
        if (*p)
                memcpy(q, *p, *cap);
        free(*p);
        *p = q;
        *cap = n;
        return true;
}

/*
 * Where a spanning handle's input (g->in) lies in its node group's input arena: past the room
 * for the part's head, which the exchange writes right in front of the staged input, and past
 * the item's length that the gather to the leader writes first (dv_gather_object_placed()).
 * So the part is whole, and goes to the leader, where the rank staged its input: no copy.
 */
#define DV_SPAN_IN_AT (DV_OBJECT_PLACED_AT + DV_SPAN_PART_HEAD_MAX)

/* g->in and g->in_size again, after a call on the node's group that may have moved its arena. */
static inline void dv_span_input_at(deval_group *g) {
        deval_group *L = g->span->local;
        bool has = L->in && L->in_size >= DV_SPAN_IN_AT;
        g->in = has ? L->in + DV_SPAN_IN_AT : NULL;
        g->in_size = has ? L->in_size - DV_SPAN_IN_AT : 0;
}
