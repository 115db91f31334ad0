/* SPDX-License-Identifier: MIT */
/*
 * span_exchange.c - the exchange of a spanning group's collective, and of its join:
 *   1. every rank writes a part: its request and its input bytes;
 *   2. the node's parts reach its leader through devald (a gather of objects to root 0);
 *   3. the leaders swap their nodes' parts through the job's engine (deval_engine): one round
 *      of a fixed size carries each node's length and its first bytes, a second round the rest
 *      when some node's parts are longer;
 *   4. each leader hands every node's parts to its node (a broadcast of bytes through devald);
 *   5. every rank reads every rank's part out of them, by global rank.
 * A failure (a rank, a devald, the engine) travels the same way in place of the parts, so
 * every rank of every node returns it, naming the rank and the node: what the node's group
 * says in its local ranks is said again here in global ones.
 *
 * What each byte means is span_wire.c's, which checks what arrives before it is used; this
 * file moves the bytes, and owns the round1 and failure buffers of the state (span_state.h), and
 * the part's buffer with span.c, which stages the rank's input in it.
 */
#define _GNU_SOURCE
#include "span_exchange.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "handle.h"
#include "span_state.h"
#include "span_wire.h"
#include "util.h"

/**
 * dv_span_say_timeout() - msg, which a node's group (or its devald) wrote, with its timeout
 * said as the user set it. The node's group waits the join's timeout and DV_SPAN_GRACE_MS
 * more, so its "21000 ms (the ... timeout ...; set ...)" of a join's 6000 ms becomes "6000 ms
 * (...) and 15000 ms more that ...": the figure the user set, then the grace.
 * @msg: NUL-terminated, rewritten in place within len bytes
 * @node_ms: the node's group's timeout; < 0 (none) leaves msg as it is
 */
void dv_span_say_timeout(char *msg, size_t len, int node_ms) {
        if (node_ms < DV_SPAN_GRACE_MS)
                return;
        char needle[32];
        int nl = snprintf(needle, sizeof(needle), "%d ms (", node_ms);
        const char *at = strstr(msg, needle);
        while (at && at > msg && isdigit((unsigned char)at[-1]))
                at = strstr(at + 1, needle);
        if (!at)
                return;
        const char *close = at + nl; /* the parenthesis that says which timeout, nested ones in */
        int depth = 1;
        for (; *close && depth; close++)
                depth += *close == '(' ? 1 : *close == ')' ? -1 : 0;
        if (depth)
                return;
        char out[DV_MSG_MAX + 256];
        snprintf(out, sizeof(out),
                 "%.*s%d ms%.*s and %d ms more that a machine's ranks give their leader to reach "
                 "the other machines%s",
                 (int)(at - msg), msg, node_ms - DV_SPAN_GRACE_MS, (int)(close - at - nl + 2),
                 at + nl - 2, DV_SPAN_GRACE_MS, close);
        snprintf(msg, len, "%s", out);
}

/*
 * The node's group said msg about one of its steps: say it as a group of one machine says it
 * of the user's call (op, its number in the node's requests' call, wire.h), each rank by its
 * global rank, with its node beside its pid: "rank 3 (node 1, pid 812)". A message that names
 * no rank (the node's devald is gone) names the node before it: "node 1: devald at ...".
 */
static void say_global(const DvSpan *sp, uint32_t op, const char *msg, char *out, size_t len) {
        size_t o = 0;
        const int *ranks = sp->laid_out ? sp->node_ranks + sp->node_start[sp->node] : NULL;
        const char *colon = strstr(msg, ": ");
        if (strncmp(msg, "deval_", 6) == 0 && colon && colon - msg < 40)
                msg = colon + 2; /* which of the node's calls it was is span.c's business */
        out[0] = '\0';
        for (const char *m = msg; *m && o + 1 < len;) {
                if (strncmp(m, "collective #", 12) == 0 && isdigit((unsigned char)m[12])) {
                        const char *d = m + 12, *e = d;
                        while (isdigit((unsigned char)*e))
                                e++;
                        o += (size_t)snprintf(out + o, len - o, "collective #%.*s", (int)(e - d),
                                              d);
                        m = e;
                        const char *close = strncmp(m, " (", 2) == 0 ? strchr(m, ')') : NULL;
                        if (close && close - m < 32) { /* the node's op: the user's */
                                o += (size_t)snprintf(out + o, len - o, " (%s)", dv_op_name(op));
                                m = close + 1;
                        }
                        continue;
                }
                if (ranks && strncmp(m, "rank ", 5) == 0 && isdigit((unsigned char)m[5]) &&
                    (m == msg || !isalpha((unsigned char)m[-1]))) {
                        char *end;
                        long k = strtol(m + 5, &end, 10);
                        if (k >= 0 && k < sp->local_world) {
                                bool pid = strncmp(end, " (pid ", 6) == 0;
                                o += (size_t)snprintf(out + o, len - o, "rank %d (node %d%s",
                                                      ranks[k], sp->node, pid ? ", " : ")");
                                m = pid ? end + 2 : end;
                                continue;
                        }
                }
                out[o++] = *m++;
        }
        out[DV_MIN(o, len - 1)] = '\0';
        dv_span_say_timeout(out, len, sp->local ? sp->local->timeout_ms : -1);
        char node[16];
        snprintf(node, sizeof(node), "(node %d", sp->node);
        if (!strstr(out, node)) {
                size_t n = strlen(out),
                       p = (size_t)snprintf(node, sizeof(node), "node %d: ", sp->node);
                if (n + p < len) {
                        memmove(out + p, out, n + 1);
                        memcpy(out, node, p);
                }
        }
}

/* The node's group failed this rank's call: the group, when the node's group failed (it
 * sticks), else the step alone, as on one machine. */
static int local_failed(deval_group *g, const char *fn, int status) {
        DvSpan *sp = g->span;
        char msg[DV_MSG_MAX];
        say_global(sp, g->req->op, deval_errmsg(sp->local), msg, sizeof(msg));
        if (sp->local->failed)
                return dv_span_broken(g, status, NULL, msg);
        return dv_span_step_failed(g, status, fn, msg);
}

/* The engine failed; one that waited past the join's timeout says where that is set. */
static int engine_failed(DvSpan *sp, int r, const char *why) {
        return dv_span_fail(sp, r < DEVAL_ESYS ? DEVAL_EPROTO : r, "the engine between nodes: %s%s",
                            why[0] ? why : deval_strerror(r),
                            r == DEVAL_ETIMEDOUT ? " (the join's timeout; " DV_TIMEOUT_SET ")"
                                                 : "");
}

/*
 * A leader's turn at the engine: its node's parts (items), or its failure, go to every
 * leader; what every node sent comes back as the global bytes, laid out in the node group's
 * input buffer (*out, *len), where the broadcast to the node takes them without a copy: a
 * header, each node's length, then node k's bytes at a stride every node's fit in.
 */
static int leader_swap(deval_group *g, int status, const char *why, const deval_bytes *items,
                       size_t n, uint8_t **out, uint64_t *len) {
        DvSpan *sp = g->span;
        int N = sp->nodes, r;
        char ewhy[DV_MSG_MAX] = "";
        DvSpanRound1 mine;
        uint64_t node_len = dv_span_wire_round1_init(&mine, status, why, items, n);

        if (!dv_span_grow(&sp->round1, &sp->round1_cap, (size_t)N * sizeof(DvSpanRound1)))
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        if ((r = sp->eng.allgather(sp->eng.ctx, &mine, sp->round1, sizeof(DvSpanRound1),
                                   g->timeout_ms, ewhy, sizeof(ewhy))) < 0)
                return engine_failed(sp, r, ewhy);
        uint64_t most;
        if ((r = dv_span_wire_round1_check(sp->round1, N, &most, sp->msg, sizeof(sp->msg))) < 0)
                return r;
        uint64_t head = dv_span_wire_global_head(N);
        uint64_t stride = dv_span_wire_global_stride(most);
        void *buf;
        if ((r = deval_input_buffer(sp->local, head + stride * (uint64_t)N, &buf)) < 0)
                return dv_span_fail(sp, r, "node %d's leader: %s", sp->node,
                                    deval_errmsg(sp->local));
        uint8_t *b = buf;
        dv_span_wire_global_start(b, sp->round1, N, stride);
        if (most > sizeof(mine.bytes)) { /* every node's bytes, each in its place */
                uint8_t *own = b + head + (uint64_t)sp->node * stride;
                dv_span_wire_node_write(own, items, n);
                memset(own + node_len, 0, stride - node_len);
                if ((r = sp->eng.allgather(sp->eng.ctx, own, b + head, stride, g->timeout_ms, ewhy,
                                           sizeof(ewhy))) < 0)
                        return engine_failed(sp, r, ewhy);
        } else {
                dv_span_wire_global_round1(b, sp->round1, N, stride);
        }
        *out = b;
        *len = head + stride * (uint64_t)N;
        return 0;
}

/*
 * This rank's part: its request and the bytes it staged in g->in, up to its last tensor. The
 * head goes right in front of them (span_state.h: DV_SPAN_IN_AT), so the part is whole, in the
 * node group's input arena, without a copy of the input; *ret points there.
 */
static int make_part(deval_group *g, const DvRequest *q, const uint8_t **ret, size_t *len) {
        DvSpan *sp = g->span;
        uint64_t data, head = dv_span_wire_part_head(q, &data);
        DvSpanWho who = {.rank = g->rank,
                         .node = sp->node,
                         .world = g->world,
                         .nodes = sp->nodes,
                         .local_rank = sp->local_rank,
                         .local_world = sp->local_world};
        /* staged already, through dv_span_reserve(); the join's hello reserved the first room,
         * so even a part that carries no input has its head's */
        if (!g->in || data > g->in_size)
                return dv_set_err(g, DEVAL_EPROTO,
                                  "a %" PRIu64 "-byte part whose input was not staged", data);
        sp->local->in_keep = DV_SPAN_IN_AT + data; /* where dv_gather_object_placed() finds it */
        uint8_t *dst = g->in - head;
        dv_span_wire_part_write_head(dst, &who, q);
        *ret = dst;
        *len = head + data;
        return 0;
}

static int exchange(deval_group *g, const char *fn, bool hello) {
        DvSpan *sp = g->span;
        deval_group *L = sp->local;
        const uint8_t *part = NULL;
        size_t part_len = 0;
        int r;

        if ((r = make_part(g, g->req, &part, &part_len)) < 0)
                return r;
        L->call_as = g->req->call; /* the node's steps serve this call (wire.h) */
        deval_bytes item = {part, part_len}, view;
        const deval_bytes *items = NULL;
        size_t n = 0;
        deval_gather_opts to_leader = DEVAL_GATHER_OPTS_INIT;
        to_leader.root = 0;
        r = dv_gather_object_placed(L, item, &to_leader, &n, &items);
        if (sp->local_rank != 0) {
                if (r < 0 || (r = deval_broadcast_bytes(L, NULL, 0, 0, &view)) < 0)
                        return local_failed(g, fn, r);
        } else {
                char why[DV_MSG_MAX] = "";
                uint8_t *global = NULL;
                uint64_t len = 0;
                if (r < 0)
                        say_global(sp, g->req->op, deval_errmsg(L), why, sizeof(why));
                int s = leader_swap(g, r, why, items, n, &global, &len);
                if (r < 0) /* the node's ranks know; the others know from the engine */
                        return L->failed ? dv_span_broken(g, r, NULL, why)
                                         : dv_span_step_failed(g, r, fn, why);
                if (s < 0) {
                        if (!dv_span_grow(&sp->failure, &sp->failure_cap, DV_SPAN_FAILURE_MAX))
                                len = 0;
                        else
                                len = dv_span_wire_global_failure(sp->failure, s, sp->msg);
                        global = sp->failure;
                }
                if ((r = deval_broadcast_bytes(L, global, len, 0, &view)) < 0)
                        return local_failed(g, fn, r);
        }
        DvSpanParts parts = {.world = g->world,
                             .nodes = sp->nodes,
                             .self = sp->node,
                             .hello = hello,
                             .node_of = sp->node_of,
                             .node_ranks = sp->node_ranks,
                             .node_start = sp->node_start,
                             .reqs = sp->reqs,
                             .data = sp->data,
                             .dlen = sp->dlen};
        if ((r = dv_span_wire_parse(&parts, view.data, view.len, sp->msg, sizeof(sp->msg))) < 0)
                return dv_span_step_failed(g, r, fn, sp->msg); /* (another node's, said) */
        return 0;
}

/**
 * dv_span_exchange() - one exchange: this rank's part (g->req and the input it staged in
 * g->in) goes out, every rank's comes back into the state's reqs, data and dlen, by global
 * rank; data points into the node group's output, valid until its next collective.
 * @g: a spanning handle; its node's group is used, and a leader's engine
 * @fn: the user's call, to name in the failure of its step
 * @hello: the join's exchange: lay out node_of, node_ranks and node_start from the parts;
 *         else check each node's parts against them
 * Return: 0, or the failure of the group (it sticks: g->failed), with its message in g:
 * DEVAL_ENOMEM for this rank's part; the node group's failure, said in global ranks; the
 * engine's; another node's; DEVAL_EPROTO or DEVAL_EMISMATCH for parts that are malformed or
 * disagree on the layout (dv_span_wire_parse()).
 */
int dv_span_exchange(deval_group *g, const char *fn, bool hello) {
        int r = exchange(g, fn, hello);
        dv_span_input_at(g); /* a leader's global bytes may have moved the node group's arena */
        return r;
}
