/* SPDX-License-Identifier: MIT */
/*
 * span_wire.c - the wire format of a spanning group's exchange (span_exchange.c moves the
 * bytes): what a rank sends its leader (a part: a header, its request, its input), what a
 * leader sends the other leaders (its node's parts, the first DV_SPAN_ROUND1 bytes in a round
 * of a fixed size), and what a leader hands its node (every node's parts at a stride, or a
 * failure). Encoders write into memory the caller sized with the matching _len function;
 * decoders check every length, count and offset against the bytes they were given, with no
 * arithmetic that can overflow, since the bytes arrive through the job's engine: a
 * malformed message is a status and a sentence, never a read out of bounds.
 */
#define _GNU_SOURCE
#include "span_wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "deval.h"

#include "check.h"
#include "util.h"

/* the most request bytes a part may carry: the request's fields and every tensor */
#define HEAD_MIN offsetof(DvRequest, t)
#define HEAD_MAX (offsetof(DvRequest, t) + DEVAL_MAX_TENSORS * sizeof(DvTensorDesc))

_Static_assert(sizeof(DvSpanPartHdr) == 48, "wire layout");
_Static_assert(sizeof(DvSpanGlobalHdr) == 24, "wire layout");
_Static_assert(sizeof(DvSpanRound1) == DV_SPAN_ROUND1, "wire layout");
_Static_assert(sizeof(DvSpanHello) == 64, "wire layout");
_Static_assert(HEAD_MAX == sizeof(DvRequest), "a part's request fits in a DvRequest");
_Static_assert(DV_SPAN_PART_HEAD_MAX % DV_ARENA_ALIGN == 0, "a part's input stays aligned");

static int say(char *msg, size_t len, int status, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
static int say(char *msg, size_t len, int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, len, fmt, ap);
        va_end(ap);
        return status;
}

/* A failure another machine sent: its status (one of ours, else DEVAL_EPROTO) and its
 * sentence, each byte outside printable ASCII replaced, as devald treats a rank's words. */
static int peer_failure(char *msg, size_t len, int32_t status, const char *text, size_t n) {
        dv_printable(msg, len, text, n);
        return status < DEVAL_ESYS ? DEVAL_EPROTO : status;
}

/* The tensors q's part carries (none for a failed stage) and the input bytes they span. */
static uint32_t part_tensors(const DvRequest *q, uint64_t *ret_data) {
        uint32_t nt = q->ntensors > DEVAL_MAX_TENSORS ? 0 : q->ntensors;
        uint64_t data = 0;
        for (uint32_t i = 0; i < nt; i++)
                if (q->t[i].nbytes)
                        data = DV_MAX(data, q->t[i].offset + q->t[i].nbytes);
        *ret_data = data;
        return nt;
}

static uint64_t part_at(uint32_t head) {
        return DV_ALIGN(sizeof(DvSpanPartHdr) + head, DV_ARENA_ALIGN);
}

/**
 * dv_span_wire_part_head() - the shape of the part that carries q: its head (a header, the
 * request's fields and the tensors it has, up to the next 64-byte boundary), then its input,
 * up to the end of its last tensor.
 * @q: this rank's request, checked by the collective that made it (its offsets and sizes
 *     do not overflow)
 * @ret_data: the input's bytes
 * Return: the head's bytes, a multiple of DV_ARENA_ALIGN, at most DV_SPAN_PART_HEAD_MAX.
 */
uint64_t dv_span_wire_part_head(const DvRequest *q, uint64_t *ret_data) {
        uint32_t nt = part_tensors(q, ret_data);
        return part_at((uint32_t)(HEAD_MIN + nt * sizeof(DvTensorDesc)));
}

/**
 * dv_span_wire_part_write_head() - a rank's part but its input: a header saying who it is and
 * how long its input is, its request (a count of tensors past DEVAL_MAX_TENSORS, a failed
 * stage, goes as none), zeros to the input.
 * @dst: dv_span_wire_part_head(q) bytes; the input follows them, the caller's to write (a rank
 *       stages it there, so that its part is whole without a copy)
 * @who: the rank's place in the group
 * @q: its request
 */
void dv_span_wire_part_write_head(uint8_t *dst, const DvSpanWho *who, const DvRequest *q) {
        uint64_t data;
        uint32_t nt = part_tensors(q, &data);
        DvSpanPartHdr h = {.magic = DV_SPAN_PART_MAGIC,
                           .rank = who->rank,
                           .node = who->node,
                           .world = who->world,
                           .nodes = who->nodes,
                           .local_rank = who->local_rank,
                           .local_world = who->local_world,
                           .head = (uint32_t)(HEAD_MIN + nt * sizeof(DvTensorDesc)),
                           .data = data};
        memcpy(dst, &h, sizeof(h));
        memcpy(dst + sizeof(h), q, h.head);
        if (nt != q->ntensors) { /* a failed stage: no tensors */
                uint32_t none = 0;
                memcpy(dst + sizeof(h) + offsetof(DvRequest, ntensors), &none, sizeof(none));
        }
        memset(dst + sizeof(h) + h.head, 0, part_at(h.head) - sizeof(h) - h.head);
}

/**
 * dv_span_wire_node_len() - the length of a node's parts as its leader sends them.
 * @items: the node's parts, in local rank order
 * @n: how many
 * Return: the bytes dv_span_wire_node_write() writes.
 */
uint64_t dv_span_wire_node_len(const deval_bytes *items, size_t n) {
        uint64_t len = 8;
        for (size_t i = 0; i < n; i++)
                len += 8 + DV_ALIGN(items[i].len, 8);
        return len;
}

/**
 * dv_span_wire_node_write() - a node's parts: their count, then each one's length and its
 * bytes, padded with zeros to 8 bytes.
 * @dst: dv_span_wire_node_len(items, n) bytes
 * @items: the node's parts, in local rank order
 * @n: how many
 */
void dv_span_wire_node_write(uint8_t *dst, const deval_bytes *items, size_t n) {
        uint64_t at = 8, count = n;
        memcpy(dst, &count, 8);
        for (size_t i = 0; i < n; i++) {
                uint64_t l = items[i].len;
                memcpy(dst + at, &l, 8);
                memcpy(dst + at + 8, items[i].data, l);
                memset(dst + at + 8 + l, 0, DV_ALIGN(l, 8) - l);
                at += 8 + DV_ALIGN(l, 8);
        }
}

/**
 * dv_span_wire_round1_init() - a leader's first round: its failure, or its node's length and,
 * when they fit, its node's parts.
 * @r: the round to fill
 * @status: < 0: the node failed, and why says how; else items carry its parts
 * @why: the failure's sentence (cut to fit)
 * @items: the node's parts
 * @n: how many
 * Return: the length of the node's parts (0 for a failure).
 */
uint64_t dv_span_wire_round1_init(DvSpanRound1 *r, int status, const char *why,
                                  const deval_bytes *items, size_t n) {
        uint64_t node_len = status < 0 ? 0 : dv_span_wire_node_len(items, n);
        *r = (DvSpanRound1){.status = status, .len = node_len};
        if (status < 0)
                snprintf((char *)r->bytes, sizeof(r->bytes), "%s", why);
        else if (node_len <= sizeof(r->bytes))
                dv_span_wire_node_write(r->bytes, items, n);
        return node_len;
}

/**
 * dv_span_wire_round1_check() - every leader's first round, as the engine delivered it.
 * @all: nodes rounds of DV_SPAN_ROUND1 bytes, node k's at k * DV_SPAN_ROUND1 (any alignment)
 * @nodes: how many, >= 1
 * @ret_most: the longest node's length, set on success
 * @msg: the failure's sentence
 * @msg_len: its size
 * Return: 0; the status of the first node that failed (its sentence in msg), DEVAL_EPROTO
 * where that status is none of ours; DEVAL_EPROTO for a length under 8 or past
 * DV_SPAN_LEN_MAX.
 */
int dv_span_wire_round1_check(const uint8_t *all, int nodes, uint64_t *ret_most, char *msg,
                              size_t msg_len) {
        uint64_t most = 0;
        for (int k = 0; k < nodes; k++) {
                const uint8_t *r = all + (size_t)k * sizeof(DvSpanRound1);
                int32_t status;
                uint64_t len;
                memcpy(&status, r + offsetof(DvSpanRound1, status), sizeof(status));
                memcpy(&len, r + offsetof(DvSpanRound1, len), sizeof(len));
                if (status < 0)
                        return peer_failure(msg, msg_len, status,
                                            (const char *)r + offsetof(DvSpanRound1, bytes),
                                            sizeof(((DvSpanRound1 *)0)->bytes));
                if (status > 0)
                        return say(msg, msg_len, DEVAL_EPROTO, "node %d sent a malformed status",
                                   k);
                if (len < 8 || len > DV_SPAN_LEN_MAX)
                        return say(msg, msg_len, DEVAL_EPROTO, "node %d sent a malformed length",
                                   k);
                most = DV_MAX(most, len);
        }
        *ret_most = most;
        return 0;
}

/**
 * dv_span_wire_global_head() - where the nodes' bytes begin in the global bytes.
 * @nodes: how many nodes, >= 1
 * Return: the header and the nodes' lengths, rounded up to DV_ARENA_ALIGN.
 */
uint64_t dv_span_wire_global_head(int nodes) {
        return DV_ALIGN(sizeof(DvSpanGlobalHdr) + (uint64_t)nodes * 8, DV_ARENA_ALIGN);
}

/**
 * dv_span_wire_global_stride() - the room each node's bytes take in the global bytes.
 * @most: the longest node's length, <= DV_SPAN_LEN_MAX (dv_span_wire_round1_check())
 * Return: most rounded up to DV_ARENA_ALIGN.
 */
uint64_t dv_span_wire_global_stride(uint64_t most) {
        return DV_ALIGN(most, DV_ARENA_ALIGN);
}

/**
 * dv_span_wire_global_start() - the global bytes' header and every node's length, from the
 * first rounds.
 * @b: dv_span_wire_global_head(nodes) + nodes * stride bytes
 * @all: the first rounds, checked by dv_span_wire_round1_check()
 * @nodes: how many
 * @stride: dv_span_wire_global_stride() of the longest
 */
void dv_span_wire_global_start(uint8_t *b, const uint8_t *all, int nodes, uint64_t stride) {
        DvSpanGlobalHdr gh = {
                .magic = DV_SPAN_GLOBAL_MAGIC, .nodes = (uint32_t)nodes, .stride = stride};
        memcpy(b, &gh, sizeof(gh));
        for (int k = 0; k < nodes; k++)
                memcpy(b + sizeof(gh) + (size_t)k * 8,
                       all + (size_t)k * sizeof(DvSpanRound1) + offsetof(DvSpanRound1, len), 8);
}

/**
 * dv_span_wire_global_round1() - every node's bytes, each in its place, from the first
 * rounds, when the longest fits in one (DV_SPAN_ROUND1 - 16 bytes).
 * @b: as dv_span_wire_global_start()
 * @all: the first rounds, checked by dv_span_wire_round1_check()
 * @nodes: how many
 * @stride: as dv_span_wire_global_start()
 */
void dv_span_wire_global_round1(uint8_t *b, const uint8_t *all, int nodes, uint64_t stride) {
        uint64_t head = dv_span_wire_global_head(nodes);
        for (int k = 0; k < nodes; k++) {
                const uint8_t *r = all + (size_t)k * sizeof(DvSpanRound1);
                uint64_t len;
                memcpy(&len, r + offsetof(DvSpanRound1, len), sizeof(len));
                memcpy(b + head + (uint64_t)k * stride, r + offsetof(DvSpanRound1, bytes), len);
        }
}

/**
 * dv_span_wire_global_failure() - a failure as a leader broadcasts it to its node.
 * @dst: DV_SPAN_FAILURE_MAX bytes
 * @status: the failure, < 0
 * @msg: its sentence, cut at DV_MSG_MAX - 1 bytes
 * Return: the bytes written.
 */
size_t dv_span_wire_global_failure(uint8_t *dst, int status, const char *msg) {
        DvSpanGlobalHdr gh = {.magic = DV_SPAN_GLOBAL_MAGIC, .status = status};
        memcpy(dst, &gh, sizeof(gh));
        size_t n = strnlen(msg, DV_MSG_MAX - 1);
        memcpy(dst + sizeof(gh), msg, n);
        dst[sizeof(gh) + n] = '\0';
        return sizeof(gh) + n + 1;
}

/* One part at p (its length, its header, its request, its input), at most end - p bytes. */
static int parse_part(const DvSpanParts *ps, const uint8_t **pp, const uint8_t *end, int n,
                      uint64_t i, uint64_t count, int *placed, char *msg, size_t msg_len) {
        const uint8_t *p = *pp;
        int W = ps->world, N = ps->nodes;
        uint64_t plen;
        DvSpanPartHdr h;

        if ((uint64_t)(end - p) < 8 + sizeof(h))
                return say(msg, msg_len, DEVAL_EPROTO, "node %d's parts are cut short", n);
        memcpy(&plen, p, 8);
        p += 8;
        memcpy(&h, p, sizeof(h));
        /* h.head is bounded before part_at() adds to it, plen before h.data is compared */
        if (plen > (uint64_t)(end - p) || h.magic != DV_SPAN_PART_MAGIC || h.rank < 0 ||
            h.rank >= W || h.head < HEAD_MIN || h.head > HEAD_MAX ||
            (h.head - HEAD_MIN) % sizeof(DvTensorDesc) || plen < part_at(h.head) ||
            h.data > plen - part_at(h.head))
                return say(msg, msg_len, DEVAL_EPROTO, "node %d sent a malformed part", n);
        int k = h.rank;
        if (ps->dlen[k] != UINT64_MAX)
                return say(msg, msg_len, DEVAL_EMISMATCH,
                           "rank %d joined twice: on node %d and on node %d", k, ps->node_of[k], n);
        if (ps->hello && (h.world != W || h.nodes != N || h.node != n || h.local_rank != (int)i ||
                          h.local_world != (int)count))
                return say(msg, msg_len, DEVAL_EMISMATCH,
                           "ranks disagree on the layout: rank %d (local rank %d of %d on node %d "
                           "of %d, world %d) arrived as part %" PRIu64 " of %" PRIu64
                           " from node %d of %d, world %d",
                           k, h.local_rank, h.local_world, h.node, h.nodes, h.world, i, count, n, N,
                           W);
        if (!ps->hello && ps->node_of[k] != n)
                return say(msg, msg_len, DEVAL_EPROTO, "rank %d's part came from node %d", k, n);
        DvRequest *q = &ps->reqs[k];
        memset(q, 0, HEAD_MIN);
        memcpy(q, p + sizeof(h), h.head);
        uint32_t nt = (uint32_t)((h.head - HEAD_MIN) / sizeof(DvTensorDesc));
        if (q->ntensors != nt)
                return say(msg, msg_len, DEVAL_EPROTO, "rank %d sent a malformed part", k);
        ps->node_of[k] = n;
        if (ps->hello)
                ps->node_ranks[(*placed)++] = k;
        ps->data[k] = p + part_at(h.head);
        ps->dlen[k] = h.data;
        /* the next part starts 8-aligned, or the node's bytes end */
        uint64_t next = DV_ALIGN(plen, 8);
        *pp = next < (uint64_t)(end - p) ? p + next : end;
        return 0;
}

/**
 * dv_span_wire_parse() - every node's parts, out of the global bytes a leader handed its node.
 * @p: the group's shape and where the parts go, by global rank (see DvSpanParts); with
 *     hello false, node_start is the layout the join's parse filled, and each node must send
 *     exactly its ranks
 * @b: the global bytes (any alignment); data[] points into them
 * @len: their length
 * @msg: the failure's sentence
 * @msg_len: its size
 *
 * Every rank of the world must send exactly one well-formed part: its header's magic, rank,
 * request size and input size inside the bytes its node sent; its request's tensor count the
 * one its size says. The tensors themselves are the step's to check. On failure the outputs
 * hold what was read so far.
 * Return: 0; the leader's failure (its status and sentence, DEVAL_EPROTO for a status none of
 * ours); DEVAL_EPROTO for malformed bytes; DEVAL_EMISMATCH when the ranks disagree on the
 * layout: a rank twice, a rank on no node, a node with no ranks, a part's place not its own.
 */
int dv_span_wire_parse(const DvSpanParts *p, const uint8_t *b, uint64_t len, char *msg,
                       size_t msg_len) {
        int W = p->world, N = p->nodes, r;
        DvSpanGlobalHdr gh;

        if (len < sizeof(gh))
                goto malformed;
        memcpy(&gh, b, sizeof(gh));
        if (gh.magic != DV_SPAN_GLOBAL_MAGIC)
                goto malformed;
        if (gh.status < 0)
                return peer_failure(msg, msg_len, gh.status, (const char *)b + sizeof(gh),
                                    (size_t)DV_MIN(len - sizeof(gh), (uint64_t)msg_len - 1));
        if (gh.status > 0)
                goto malformed;
        uint64_t head = dv_span_wire_global_head(N);
        if (gh.nodes != (uint32_t)N || len < head || gh.stride > (len - head) / (uint64_t)N)
                return say(msg, msg_len, DEVAL_EPROTO,
                           "the leaders disagree on the nodes: %u, not %d", gh.nodes, N);
        for (int k = 0; k < W; k++)
                p->dlen[k] = UINT64_MAX; /* not seen */
        int placed = 0;
        for (int n = 0; n < N; n++) {
                uint64_t nlen;
                if (p->hello)
                        p->node_start[n] = placed;
                memcpy(&nlen, b + sizeof(gh) + (size_t)n * 8, 8);
                if (nlen > gh.stride)
                        return say(msg, msg_len, DEVAL_EPROTO, "node %d's bytes are cut short", n);
                const uint8_t *q = b + head + (uint64_t)n * gh.stride, *end = q + nlen;
                uint64_t count;
                if (nlen < 8)
                        return say(msg, msg_len, DEVAL_EPROTO, "node %d sent no parts", n);
                memcpy(&count, q, 8);
                q += 8;
                if (!p->hello && count != (uint64_t)(p->node_start[n + 1] - p->node_start[n]))
                        return say(msg, msg_len, DEVAL_EPROTO,
                                   "node %d sent %" PRIu64 " parts, not %d", n, count,
                                   p->node_start[n + 1] - p->node_start[n]);
                for (uint64_t i = 0; i < count; i++)
                        if ((r = parse_part(p, &q, end, n, i, count, &placed, msg, msg_len)) < 0)
                                return r;
        }
        for (int k = 0; k < W; k++)
                if (p->dlen[k] == UINT64_MAX)
                        return say(msg, msg_len, DEVAL_EMISMATCH, "rank %d joined on no node", k);
        if (p->hello)
                p->node_start[N] = placed;
        for (int n = 0; p->hello && n < N; n++)
                if (p->node_start[n + 1] == p->node_start[n])
                        return say(msg, msg_len, DEVAL_EMISMATCH, "node %d has no ranks", n);
        return 0;
malformed:
        return say(msg, msg_len, DEVAL_EPROTO, "the leader of node %d sent malformed bytes",
                   p->self);
}

/**
 * dv_span_wire_hello_write() - the join's request and input: one tensor of bytes, the hello.
 * @q: the request to fill (zeroed first)
 * @in: sizeof(DvSpanHello) bytes of input
 * @h: what this rank says
 */
void dv_span_wire_hello_write(DvRequest *q, uint8_t *in, const DvSpanHello *h) {
        memcpy(in, h, sizeof(*h));
        memset(q, 0, sizeof(*q));
        q->op = DV_SPAN_HELLO_OP;
        q->ntensors = 1;
        q->t[0] = (DvTensorDesc){.dtype = DEVAL_U8,
                                 .ndim = 1,
                                 .shape = {sizeof(DvSpanHello)},
                                 .nbytes = sizeof(DvSpanHello)};
}

/**
 * dv_span_wire_hello_read() - what a rank said at the join, as its part carried it.
 * @q: its request, as dv_span_wire_parse() read it
 * @data: its input
 * @dlen: the input's length
 * @ret: the hello, set on success; its host need not be terminated
 * Return: true, or false when the part carries no hello.
 */
bool dv_span_wire_hello_read(const DvRequest *q, const uint8_t *data, uint64_t dlen,
                             DvSpanHello *ret) {
        if (q->ntensors != 1 || dlen < sizeof(DvSpanHello))
                return false;
        memcpy(ret, data, sizeof(*ret));
        return true;
}
