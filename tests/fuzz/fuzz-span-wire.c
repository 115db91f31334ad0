/* SPDX-License-Identifier: MIT */
/*
 * fuzz-span-wire.c - what a spanning group's ranks read from other machines
 * (libclient/span_wire.c): whatever the bytes, dv_span_wire_parse() and
 * dv_span_wire_round1_check() either fail with one of deval's statuses and a terminated
 * sentence, or hand back every rank's part inside the bytes they were given, each rank once,
 * on a node of the layout; and whatever a well-behaved rank and leader encode, every rank
 * decodes to the same requests and bytes, or the same failure.
 *
 * An input is 4 bytes, then what they choose:
 *   [0] mode (bits 1-2) and hello (bit 0): 0 the global bytes a leader hands its node;
 *       1 every leader's first round, each as a 16-bit length and that many of its first
 *       bytes (the rest zeros), assembled into the global bytes when they fit; 2 parts a
 *       well-behaved rank encodes from the rest (requests and bytes), round-tripped;
 *       3 a failure, round-tripped
 *   [1] nodes - 1 (1..8), [2] world - nodes (0..15), [3] a status or a size, by mode.
 * The layout a step checks against (hello clear) is node n's ranks n * W / N onwards.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "check.h"
#include "span_wire.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NODES_MAX 8
#define WORLD_MAX (NODES_MAX + 15)

typedef struct {
        int node_of[WORLD_MAX], node_ranks[WORLD_MAX], node_start[NODES_MAX + 1];
        DvRequest reqs[WORLD_MAX];
        const uint8_t *data[WORLD_MAX];
        uint64_t dlen[WORLD_MAX];
        DvSpanParts p;
} Parts;

static volatile uint8_t sink;

static void parts_init(Parts *ps, int world, int nodes, bool hello) {
        memset(ps, 0, sizeof(*ps));
        for (int n = 0; n <= nodes; n++)
                ps->node_start[n] = n * world / nodes;
        for (int n = 0; n < nodes; n++)
                for (int k = ps->node_start[n]; k < ps->node_start[n + 1]; k++) {
                        ps->node_of[k] = n;
                        ps->node_ranks[k] = k;
                }
        ps->p = (DvSpanParts){.world = world,
                              .nodes = nodes,
                              .self = 0,
                              .hello = hello,
                              .node_of = ps->node_of,
                              .node_ranks = ps->node_ranks,
                              .node_start = ps->node_start,
                              .reqs = ps->reqs,
                              .data = ps->data,
                              .dlen = ps->dlen};
}

/* A failure: one of deval's statuses, and a terminated sentence of printable ASCII (another
 * machine's words are filtered, as a rank's are on one machine) */
static void check_msg(int r, const char *msg, size_t len) {
        if (r < DEVAL_ESYS || r >= 0 || !memchr(msg, 0, len))
                abort();
        for (const char *p = msg; *p; p++)
                if (*p < 0x20 || *p > 0x7e)
                        abort();
}

/* Parse len bytes at b (their own allocation, so a read past them is caught) and check what
 * comes back. Return: parse's status, its sentence in msg (DV_MSG_MAX bytes). */
static int parse(Parts *ps, const uint8_t *b, uint64_t len, char *msg) {
        int W = ps->p.world, N = ps->p.nodes;
        int expect_node[WORLD_MAX];
        memcpy(expect_node, ps->node_of, sizeof(expect_node));
        int r = dv_span_wire_parse(&ps->p, b, len, msg, DV_MSG_MAX);
        if (r < 0) {
                check_msg(r, msg, DV_MSG_MAX);
                return r;
        }
        bool seen[WORLD_MAX] = {false};
        for (int k = 0; k < W; k++) {
                if (ps->data[k] < b || ps->dlen[k] > len ||
                    (uint64_t)(ps->data[k] - b) > len - ps->dlen[k])
                        abort();
                if (ps->node_of[k] < 0 || ps->node_of[k] >= N ||
                    ps->reqs[k].ntensors > DEVAL_MAX_TENSORS)
                        abort();
                if (!ps->p.hello && ps->node_of[k] != expect_node[k])
                        abort();
                uint8_t x = 0;
                for (uint64_t i = 0; i < ps->dlen[k]; i++)
                        x ^= ps->data[k][i];
                sink = x;
        }
        if (ps->p.hello) {
                if (ps->node_start[0] != 0 || ps->node_start[N] != W)
                        abort();
                for (int n = 0; n < N; n++) {
                        if (ps->node_start[n + 1] <= ps->node_start[n])
                                abort();
                        for (int i = ps->node_start[n]; i < ps->node_start[n + 1]; i++) {
                                int k = ps->node_ranks[i];
                                if (k < 0 || k >= W || seen[k] || ps->node_of[k] != n)
                                        abort();
                                seen[k] = true;
                        }
                }
        }
        return 0;
}

static int parse_copy(Parts *ps, const uint8_t *b, size_t len, char *msg) {
        uint8_t *copy = malloc(len ? len : 1);
        if (!copy)
                return 0;
        memcpy(copy, b, len);
        int r = parse(ps, copy, len, msg);
        free(copy);
        return r;
}

/* Mode 1: every leader's first round from the input, then the global bytes when they fit. */
static void rounds(Parts *ps, const uint8_t *in, size_t len) {
        int N = ps->p.nodes;
        uint8_t *all = calloc((size_t)N, sizeof(DvSpanRound1));
        char msg[DV_MSG_MAX];
        uint64_t most = 0;
        if (!all)
                return;
        for (int k = 0; k < N && len >= 2; k++) {
                size_t n = DV_MIN((size_t)(in[0] | in[1] << 8), len - 2);
                n = DV_MIN(n, sizeof(DvSpanRound1));
                memcpy(all + (size_t)k * sizeof(DvSpanRound1), in + 2, n);
                in += 2 + n;
                len -= 2 + n;
        }
        int r = dv_span_wire_round1_check(all, N, &most, msg, sizeof(msg));
        if (r < 0) {
                check_msg(r, msg, sizeof(msg));
        } else if (most < 8 || most > DV_SPAN_LEN_MAX) {
                abort();
        } else if (most <= sizeof(((DvSpanRound1 *)0)->bytes)) {
                uint64_t head = dv_span_wire_global_head(N);
                uint64_t stride = dv_span_wire_global_stride(most);
                if (head < sizeof(DvSpanGlobalHdr) + 8 * (uint64_t)N || stride < most ||
                    stride % DV_ARENA_ALIGN)
                        abort();
                uint8_t *b = malloc(head + stride * (uint64_t)N);
                if (b) {
                        memset(b, 0xa5, head + stride * (uint64_t)N); /* the gaps: anything */
                        dv_span_wire_global_start(b, all, N, stride);
                        dv_span_wire_global_round1(b, all, N, stride);
                        parse(ps, b, head + stride * (uint64_t)N, msg);
                        free(b);
                }
        }
        free(all);
}

/* Mode 2: each rank's request and input from the input, encoded as a well-behaved rank and its
 * leader do, must decode to the same on every rank, in the join's parse and a step's. */
static void round_trip(Parts *ps, const uint8_t *in, size_t len, uint8_t big) {
        int W = ps->p.world, N = ps->p.nodes;
        static DvRequest q[WORLD_MAX];
        uint8_t *stage[WORLD_MAX] = {NULL}, *part[WORLD_MAX] = {NULL};
        deval_bytes items[WORLD_MAX];
        DvSpanRound1 *all = calloc((size_t)N, sizeof(DvSpanRound1));
        uint8_t *b = NULL;
        char msg[DV_MSG_MAX];
        if (!all)
                return;
        for (int k = 0; k < W; k++) {
                /* up to 3 tensors of bytes of the input, each at an 8-aligned offset */
                memset(&q[k], 0, sizeof(q[k]));
                uint32_t nt = len ? in[0] % 4 : 0;
                uint64_t at = 0;
                q[k].seq = 7;
                q[k].op = DV_OP_GATHER;
                q[k].ntensors = nt;
                for (uint32_t i = 0; i < nt; i++) {
                        uint64_t n = len > 1 ? in[1 + i % (len - 1)] : 0;
                        if (big & 1)
                                n *= 64; /* past the first round */
                        q[k].t[i] = (DvTensorDesc){.dtype = DEVAL_U8,
                                                   .ndim = 1,
                                                   .shape = {(int64_t)n},
                                                   .offset = at,
                                                   .nbytes = n};
                        at = DV_ALIGN(at + n, 8);
                }
                stage[k] = malloc(at ? at : 1);
                if (!stage[k])
                        goto out;
                for (uint64_t i = 0; i < at; i++)
                        stage[k][i] = len ? in[i % len] ^ (uint8_t)k : (uint8_t)k;
                if (len) {
                        in++;
                        len--;
                }
                uint64_t pdata, phead = dv_span_wire_part_head(&q[k], &pdata);
                uint64_t plen = phead + pdata;
                if (phead % DV_ARENA_ALIGN || phead > DV_SPAN_PART_HEAD_MAX || pdata > at)
                        abort();
                part[k] = malloc(plen);
                if (!part[k])
                        goto out;
                int n = ps->node_of[k];
                DvSpanWho who = {.rank = k,
                                 .node = n,
                                 .world = W,
                                 .nodes = N,
                                 .local_rank = k - ps->node_start[n],
                                 .local_world = ps->node_start[n + 1] - ps->node_start[n]};
                dv_span_wire_part_write_head(part[k], &who, &q[k]);
                memcpy(part[k] + phead, stage[k], pdata);
                items[k] = (deval_bytes){part[k], plen};
        }
        /* the leaders: a first round each, then the global bytes */
        uint64_t node_len[NODES_MAX];
        for (int n = 0; n < N; n++) {
                const deval_bytes *its = items + ps->node_start[n];
                size_t cnt = (size_t)(ps->node_start[n + 1] - ps->node_start[n]);
                node_len[n] = dv_span_wire_round1_init(&all[n], 0, "", its, cnt);
                if (node_len[n] != dv_span_wire_node_len(its, cnt))
                        abort();
        }
        uint64_t most;
        if (dv_span_wire_round1_check((const uint8_t *)all, N, &most, msg, sizeof(msg)) != 0)
                abort();
        uint64_t head = dv_span_wire_global_head(N), stride = dv_span_wire_global_stride(most);
        uint64_t glen = head + stride * (uint64_t)N;
        b = calloc(1, glen);
        if (!b)
                goto out;
        dv_span_wire_global_start(b, (const uint8_t *)all, N, stride);
        if (most > sizeof(all[0].bytes)) { /* the second round: each node's in its place */
                for (int n = 0; n < N; n++)
                        dv_span_wire_node_write(
                                b + head + (uint64_t)n * stride, items + ps->node_start[n],
                                (size_t)(ps->node_start[n + 1] - ps->node_start[n]));
        } else {
                dv_span_wire_global_round1(b, (const uint8_t *)all, N, stride);
        }
        for (int hello = 1; hello >= 0; hello--) {
                ps->p.hello = hello;
                if (parse(ps, b, glen, msg) != 0)
                        abort();
                for (int k = 0; k < W; k++) {
                        uint64_t want;
                        dv_span_wire_part_head(&q[k], &want);
                        if (memcmp(&ps->reqs[k], &q[k],
                                   offsetof(DvRequest, t) + q[k].ntensors * sizeof(DvTensorDesc)) ||
                            ps->dlen[k] != want || memcmp(ps->data[k], stage[k], want))
                                abort();
                }
        }
out:
        for (int k = 0; k < W; k++) {
                free(stage[k]);
                free(part[k]);
        }
        free(b);
        free(all);
}

/* Mode 3: a failure, as a leader sends it to the others and to its node. */
static void failure(Parts *ps, const uint8_t *in, size_t len, uint8_t code) {
        int N = ps->p.nodes, status = -1 - code % 16; /* some none of ours */
        int want = status < DEVAL_ESYS ? DEVAL_EPROTO : status;
        char why[DV_MSG_MAX], msg[DV_MSG_MAX], said[DV_MSG_MAX];
        size_t n = DV_MIN(len, sizeof(why) - 1);
        memcpy(why, in, n);
        why[n] = '\0';
        dv_printable(said, sizeof(said), why, n); /* what the others read of it */
        DvSpanRound1 *all = calloc((size_t)N, sizeof(DvSpanRound1));
        uint8_t *b = malloc(DV_SPAN_FAILURE_MAX);
        uint64_t most;
        if (!all || !b)
                goto out;
        for (int k = 0; k < N; k++)
                dv_span_wire_round1_init(&all[k], k == N - 1 ? status : 0, why, NULL, 0);
        if (dv_span_wire_round1_check((const uint8_t *)all, N, &most, msg, sizeof(msg)) != want ||
            strcmp(msg, said) != 0)
                abort();
        size_t blen = dv_span_wire_global_failure(b, want, msg);
        if (blen > DV_SPAN_FAILURE_MAX || parse_copy(ps, b, blen, msg) != want || strcmp(msg, said))
                abort();
out:
        free(all);
        free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static Parts ps;
        char msg[DV_MSG_MAX];
        if (size < 4)
                return 0;
        int mode = (data[0] >> 1) & 3, nodes = 1 + data[1] % NODES_MAX;
        int world = nodes + data[2] % (WORLD_MAX - NODES_MAX + 1);
        parts_init(&ps, world, nodes, data[0] & 1);
        switch (mode) {
        case 0:
                parse_copy(&ps, data + 4, size - 4, msg);
                break;
        case 1:
                rounds(&ps, data + 4, size - 4);
                break;
        case 2:
                round_trip(&ps, data + 4, size - 4, data[3]);
                break;
        case 3:
                failure(&ps, data + 4, size - 4, data[3]);
                break;
        }
        return 0;
}
