/* SPDX-License-Identifier: MIT */
/*
 * span-engine.h - the tests' engine between the leaders of a spanning group: shared memory
 * in one anonymous mapping the forked ranks inherit, with ways to go wrong on one node
 * (span-engine.c). test-span and test-equiv join spanning groups through it.
 */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#include "deval.h"

#include "harness.h"

#define SPAN_MAX_NODES 4
#define SPAN_SLOT      (1u << 20)

enum {
        FAIL_NONE,
        FAIL_ERROR,     /* the engine returns an error */
        FAIL_SILENT,    /* the engine answers long past the deadline */
        FAIL_GARBLE,    /* the engine flips bytes of what it carries */
        FAIL_RANK_DIES, /* (the tests' own) a rank exits */
};

typedef struct {
        _Atomic uint64_t posted[SPAN_MAX_NODES];     /* the last round each leader's bytes are in */
        int mode, node, round;                       /* what goes wrong, on which node, from when */
        uint8_t slots[2][SPAN_MAX_NODES][SPAN_SLOT]; /* by the round's parity */
} SpanShm;

typedef struct {
        const int *layout; /* rank -> node */
        int timeout_ms;
        const char *name;
} Span;

/* The engine's memory, mapped by span_engine_setup() before the ranks fork. */
extern SpanShm *span_shm;

/* Map span_shm; 0, or -1 when mmap fails. */
int span_engine_setup(void);
/* Forget the last run's rounds and failure; what goes wrong next is set in span_shm after. */
void span_engine_reset(void);
/* The allgather of a deval_engine on span_shm (ctx: the node's Engine, see span_join()). */
int span_engine_allgather(void *ctx, const void *send, void *recv, size_t len, int timeout_ms,
                          char *why, size_t why_len);
/* Join sp->name (suffixed like harness_join()) as rank of world on node sp->layout[rank]. */
int span_join(const Harness *h, const Span *sp, int rank, int world, deval_group **g);
/* The same with a group name of the caller's and its node's engine made here. */
int span_join_named(const Harness *h, const char *name, int node, int nodes, int rank, int world,
                    int local_rank, int local_world, int timeout_ms, deval_group **g);
