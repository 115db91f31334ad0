/* SPDX-License-Identifier: MIT */
/*
 * span_wire.h - the bytes the ranks and leaders of a spanning group exchange: a rank's part
 * (its request and its input), a node's parts as its leader sends them, a leader's first
 * round at the engine, the global bytes a leader hands its node, and the join's payload.
 * Pure functions of their arguments, with no group state, so that the fuzz target
 * (tests/fuzz/fuzz-span-wire.c) drives exactly what every rank runs; the decoders take every
 * byte as hostile.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deval.h"

#include "wire.h"

#define DV_SPAN_PART_MAGIC   0x44565350u  /* "DVSP" */
#define DV_SPAN_GLOBAL_MAGIC 0x44564742u  /* "DVGB" */
#define DV_SPAN_ROUND1       4096         /* bytes each leader sends in the engine's first round */
#define DV_SPAN_HELLO_OP     0xffffu      /* the join's exchange: the parts describe the layout */
#define DV_SPAN_HOST_MAX     56           /* a host name, as the join's parts carry it */
#define DV_SPAN_LEN_MAX      (1ull << 40) /* the most bytes of parts a node may send */

typedef struct { /* what the join's part of a rank carries */
        char host[DV_SPAN_HOST_MAX];
        uint64_t max_out; /* the largest result it takes: $DEVAL_SPAN_MAX_BYTES, else a
                             quarter of its machine's memory */
} DvSpanHello;

typedef struct { /* a rank's part: this header, its request (head bytes), its input */
        uint32_t magic;
        int32_t rank;
        int32_t node;
        int32_t world, nodes, local_rank, local_world;
        uint32_t head;
        uint64_t data;
        uint64_t reserved;
} DvSpanPartHdr;

typedef struct { /* what a leader broadcasts to its node */
        uint32_t magic;
        int32_t status; /* < 0: msg follows instead of the nodes' parts */
        uint32_t nodes;
        uint32_t reserved;
        uint64_t stride; /* status 0: uint64_t len[nodes], then node k's bytes at k * stride
                            from the first 64-byte boundary after them */
} DvSpanGlobalHdr;

typedef struct { /* a leader's first round */
        int32_t status;
        uint32_t reserved;
        uint64_t len;
        uint8_t bytes[DV_SPAN_ROUND1 - 16]; /* the node's first bytes, or the failure's sentence */
} DvSpanRound1;

/* the largest failure a leader broadcasts: its header and a sentence */
#define DV_SPAN_FAILURE_MAX (sizeof(DvSpanGlobalHdr) + DV_MSG_MAX)

/* Who wrote a part: the rank's place in the group, as its part header says it. */
typedef struct {
        int32_t rank, node, world, nodes, local_rank, local_world;
} DvSpanWho;

/* What dv_span_wire_parse() reads the global bytes into, by global rank. */
typedef struct {
        int world, nodes;
        int self;        /* the node reading them: named when its leader sent malformed bytes */
        bool hello;      /* the join's: fill node_ranks and node_start; else check against them */
        int *node_of;    /* [world] out: each rank's node */
        int *node_ranks; /* [world] hello out: each node's ranks in local rank order */
        int *node_start; /* [nodes + 1] into node_ranks: hello out, else in */
        DvRequest *reqs; /* [world] out: as each rank described its step */
        const uint8_t **data; /* [world] out: each rank's input, inside the global bytes */
        uint64_t *dlen;       /* [world] out: its length */
} DvSpanParts;

/* the most bytes a part's head (its header, its request, up to its input) takes: a rank that
 * stages its input this far into a buffer can write any part's head in front of it */
#define DV_SPAN_PART_HEAD_MAX                                                                \
        ((sizeof(DvSpanPartHdr) + sizeof(DvRequest) + DV_ARENA_ALIGN - 1) / DV_ARENA_ALIGN * \
         DV_ARENA_ALIGN)

uint64_t dv_span_wire_part_head(const DvRequest *q, uint64_t *ret_data);
void dv_span_wire_part_write_head(uint8_t *dst, const DvSpanWho *who, const DvRequest *q);

uint64_t dv_span_wire_node_len(const deval_bytes *items, size_t n);
void dv_span_wire_node_write(uint8_t *dst, const deval_bytes *items, size_t n);

uint64_t dv_span_wire_round1_init(DvSpanRound1 *r, int status, const char *why,
                                  const deval_bytes *items, size_t n);
int dv_span_wire_round1_check(const uint8_t *all, int nodes, uint64_t *ret_most, char *msg,
                              size_t msg_len);

uint64_t dv_span_wire_global_head(int nodes);
uint64_t dv_span_wire_global_stride(uint64_t most);
void dv_span_wire_global_start(uint8_t *b, const uint8_t *all, int nodes, uint64_t stride);
void dv_span_wire_global_round1(uint8_t *b, const uint8_t *all, int nodes, uint64_t stride);
size_t dv_span_wire_global_failure(uint8_t *dst, int status, const char *msg);

int dv_span_wire_parse(const DvSpanParts *p, const uint8_t *b, uint64_t len, char *msg,
                       size_t msg_len);

void dv_span_wire_hello_write(DvRequest *q, uint8_t *in, const DvSpanHello *h);
bool dv_span_wire_hello_read(const DvRequest *q, const uint8_t *data, uint64_t dlen,
                             DvSpanHello *ret);
