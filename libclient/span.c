/* SPDX-License-Identifier: MIT */
/*
 * span.c - a group that spans machines.
 *
 * Each machine's ranks form a group at their own devald (the node's group, named after the
 * spanning group and the node); its local rank 0 is the node's leader. The spanning handle
 * runs collective.c's checks and staging unchanged, into memory of its own, and each
 * collective is then one exchange:
 *   1. every rank writes a part: its request and its input bytes;
 *   2. the node's parts reach its leader through devald (a gather of objects to root 0);
 *   3. the leaders swap their nodes' parts through the job's engine (deval_engine): one round
 *      of a fixed size carries each node's length and its first bytes, a second round the rest
 *      when some node's parts are longer;
 *   4. each leader hands every node's parts to its node (a broadcast of bytes through devald);
 *   5. every rank runs the step over all parts, in global ranks, with devald's planner and
 *      reduction, so each result is the one a single machine gives, byte for byte.
 * A failure (a rank, a devald, the engine) travels the same way in place of the parts, so
 * every rank of every node returns it, naming the rank and the node.
 *
 * Trust: parts come from the group's own ranks, through the job's engine. They are checked
 * for bounds before use (never a crash), as devald checks what ranks write.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deval.h"

#include "check.h"
#include "client.h"
#include "dtype.h"
#include "job.h"
#include "pass.h"
#include "sock.h"
#include "util.h"

#define PART_MAGIC   0x44565350u /* "DVSP" */
#define GLOBAL_MAGIC 0x44564742u /* "DVGB" */
#define ROUND1       4096        /* bytes each leader sends in the engine's first round */
#define HELLO_OP     0xffffu     /* the join's exchange: the parts describe the layout */
#define HOST_MAX     56          /* a host name, as the join's parts carry it */

typedef struct { /* what the join's part of a rank carries */
        char host[HOST_MAX];
        uint64_t max_out; /* the largest result it takes: $DEVAL_SPAN_MAX_BYTES, else a
                             quarter of its machine's memory */
} Hello;
/* the node's group outlives a leader's wait on the engine: its ranks hear why it failed */
#define LOCAL_GRACE_MS 15000

typedef struct { /* a rank's part: this header, its request (head bytes), its input */
        uint32_t magic;
        int32_t rank;
        int32_t node;
        int32_t world, nodes, local_rank, local_world;
        uint32_t head;
        uint64_t data;
        uint64_t reserved;
} PartHdr;

typedef struct { /* what a leader broadcasts to its node */
        uint32_t magic;
        int32_t status; /* < 0: msg follows instead of the nodes' parts */
        uint32_t nodes;
        uint32_t reserved;
        uint64_t stride; /* status 0: uint64_t len[nodes], then node k's bytes at k * stride
                            from the first 64-byte boundary after them */
} GlobalHdr;

typedef struct { /* a leader's first round */
        int32_t status;
        uint32_t reserved;
        uint64_t len;
        uint8_t bytes[ROUND1 - 16]; /* the node's first bytes, or the failure's sentence */
} Round1;

typedef struct {
        bool active;
        int32_t order;
        int64_t num_samples;
        uint32_t used;
        int status; /* a step that failed after this rank ended the pass */
        char msg[DV_MSG_MAX];
        int64_t total[DV_PASS_STREAMS];
        int64_t most[DV_PASS_STREAMS];
        int64_t *rows; /* [stream * world + rank] */
} SpanPass;

struct DvSpan {
        deval_group *local; /* this rank in its node's group */
        deval_engine eng;
        int node, nodes, local_rank, local_world;
        int *node_of;    /* [world] */
        int *node_ranks; /* [world]: each node's ranks in local rank order, node by node */
        int *node_start; /* [nodes + 1] into node_ranks */
        bool laid_out;   /* the join's exchange filled them */
        uint8_t *part;   /* this rank's part */
        size_t part_cap;
        uint8_t *round1; /* a leader's: every node's first round */
        size_t round1_cap;
        uint8_t *failure; /* a leader's: a failure it broadcasts to its node */
        size_t failure_cap;
        DvRequest *reqs; /* [world] as each rank described its step */
        const uint8_t **data;
        uint64_t *dlen;
        bool *parked;
        int64_t **prefix; /* objects */
        DvShape *shapes;  /* [inputs_cap] */
        const uint8_t **srcs;
        size_t inputs_cap;
        int64_t *valid;
        SpanPass pass;
        uint64_t max_out; /* the largest result: the smallest any rank takes, alike on all */
        uint8_t *out;
        uint64_t out_cap;
        DvResult res;
        DvRequest req; /* this rank's request: g->req */
        char msg[DV_MSG_MAX];
};

/* Step failures: in the span's message, with the status. */
static int fail(DvSpan *sp, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(DvSpan *sp, int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sp->msg, sizeof(sp->msg), fmt, ap);
        va_end(ap);
        return status;
}

/* A failure of the exchange: every later call returns it. */
static int broken(deval_group *g, int status, const char *fn, const char *msg) {
        if (status < DEVAL_ESYS || status >= 0)
                status = DEVAL_EPROTO;
        g->failed = status;
        return dv_set_err(g, status, "%s: %s", fn, msg);
}

static bool grow(uint8_t **p, size_t *cap, size_t need) {
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

/* The node's group said msg in its local ranks: say it in global ranks, naming the node. */
static void say_global(const DvSpan *sp, const char *msg, char *out, size_t len) {
        size_t o = (size_t)snprintf(out, len, "node %d: ", sp->node);
        const int *ranks = sp->laid_out ? sp->node_ranks + sp->node_start[sp->node] : NULL;
        const char *colon = strstr(msg, ": ");
        if (strncmp(msg, "deval_", 6) == 0 && colon && colon - msg < 40)
                msg = colon + 2; /* which of the node's calls it was is span.c's business */
        for (const char *m = msg; *m && o + 1 < len;) {
                if (strncmp(m, "collective #", 12) == 0) { /* the node's steps, not the user's */
                        o += (size_t)snprintf(out + o, len - o, "node step #");
                        m += 12;
                        continue;
                }
                if (ranks && strncmp(m, "rank ", 5) == 0 && isdigit((unsigned char)m[5]) &&
                    (m == msg || !isalpha((unsigned char)m[-1]))) {
                        char *end;
                        long k = strtol(m + 5, &end, 10);
                        if (k >= 0 && k < sp->local_world) {
                                o += (size_t)snprintf(out + o, len - o, "rank %d", ranks[k]);
                                m = end;
                                continue;
                        }
                }
                out[o++] = *m++;
        }
        out[DV_MIN(o, len - 1)] = '\0';
}

static int local_failed(deval_group *g, const char *fn, int status) {
        DvSpan *sp = g->span;
        char msg[DV_MSG_MAX];
        say_global(sp, deval_errmsg(sp->local), msg, sizeof(msg));
        return broken(g, status, fn, msg);
}

/* The node's parts as its leader sends them: their count, then each one's length and bytes. */
static uint64_t node_size(const deval_bytes *items, size_t n) {
        uint64_t len = 8;
        for (size_t i = 0; i < n; i++)
                len += 8 + DV_ALIGN(items[i].len, 8);
        return len;
}

static void node_write(uint8_t *dst, const deval_bytes *items, size_t n) {
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

static int engine_failed(DvSpan *sp, int r, const char *why) {
        return fail(sp, r < DEVAL_ESYS ? DEVAL_EPROTO : r, "the engine between nodes: %s",
                    why[0] ? why : deval_strerror(r));
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
        uint64_t node_len = status < 0 ? 0 : node_size(items, n);
        Round1 mine = {.status = status, .len = node_len};

        if (status < 0)
                snprintf((char *)mine.bytes, sizeof(mine.bytes), "%s", why);
        else if (node_len <= sizeof(mine.bytes))
                node_write(mine.bytes, items, n);
        if (!grow(&sp->round1, &sp->round1_cap, (size_t)N * sizeof(Round1)))
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        if ((r = sp->eng.allgather(sp->eng.ctx, &mine, sp->round1, sizeof(Round1), g->timeout_ms,
                                   ewhy, sizeof(ewhy))) < 0)
                return engine_failed(sp, r, ewhy);
        const Round1 *all = (const Round1 *)sp->round1;
        uint64_t most = 0;
        for (int k = 0; k < N; k++) {
                if (all[k].status < 0) {
                        int st = all[k].status < DEVAL_ESYS ? DEVAL_EPROTO : all[k].status;
                        return fail(sp, st, "%.*s", (int)sizeof(all[k].bytes), all[k].bytes);
                }
                if (all[k].len < 8 || all[k].len > (1ull << 40))
                        return fail(sp, DEVAL_EPROTO, "node %d sent a malformed length", k);
                most = DV_MAX(most, all[k].len);
        }
        uint64_t head = DV_ALIGN(sizeof(GlobalHdr) + (uint64_t)N * 8, DV_ARENA_ALIGN);
        uint64_t stride = DV_ALIGN(most, DV_ARENA_ALIGN);
        void *buf;
        if ((r = deval_input_buffer(sp->local, head + stride * (uint64_t)N, &buf)) < 0)
                return fail(sp, r, "node %d's leader: %s", sp->node, deval_errmsg(sp->local));
        uint8_t *b = buf;
        *(GlobalHdr *)b =
                (GlobalHdr){.magic = GLOBAL_MAGIC, .nodes = (uint32_t)N, .stride = stride};
        for (int k = 0; k < N; k++)
                memcpy(b + sizeof(GlobalHdr) + (size_t)k * 8, &all[k].len, 8);
        if (most > sizeof(mine.bytes)) { /* every node's bytes, each in its place */
                uint8_t *own = b + head + (uint64_t)sp->node * stride;
                node_write(own, items, n);
                memset(own + node_len, 0, stride - node_len);
                if ((r = sp->eng.allgather(sp->eng.ctx, own, b + head, stride, g->timeout_ms, ewhy,
                                           sizeof(ewhy))) < 0)
                        return engine_failed(sp, r, ewhy);
        } else {
                for (int k = 0; k < N; k++)
                        memcpy(b + head + (uint64_t)k * stride, all[k].bytes, all[k].len);
        }
        *out = b;
        *len = head + stride * (uint64_t)N;
        return 0;
}

/* A failure as a leader broadcasts it. */
static uint64_t global_failure(DvSpan *sp, int status) {
        if (!grow(&sp->failure, &sp->failure_cap, sizeof(GlobalHdr) + sizeof(sp->msg)))
                return 0;
        GlobalHdr *gh = (GlobalHdr *)sp->failure;
        *gh = (GlobalHdr){.magic = GLOBAL_MAGIC, .status = status};
        size_t n = strnlen(sp->msg, sizeof(sp->msg) - 1);
        memcpy(sp->failure + sizeof(*gh), sp->msg, n);
        sp->failure[sizeof(*gh) + n] = '\0';
        return sizeof(*gh) + n + 1;
}

/* Read every node's parts out of the global bytes into reqs, data and dlen, by global rank. */
static int parse(deval_group *g, const uint8_t *b, uint64_t len, bool hello) {
        DvSpan *sp = g->span;
        int W = g->world, N = sp->nodes;
        const GlobalHdr *gh = (const GlobalHdr *)b;

        if (len < sizeof(*gh) || gh->magic != GLOBAL_MAGIC)
                return fail(sp, DEVAL_EPROTO, "the leader of node %d sent malformed bytes",
                            sp->node);
        if (gh->status < 0) {
                int s = gh->status < DEVAL_ESYS ? DEVAL_EPROTO : gh->status;
                uint64_t n = DV_MIN(len - sizeof(*gh), (uint64_t)sizeof(sp->msg) - 1);
                return fail(sp, s, "%.*s", (int)n, (const char *)(gh + 1));
        }
        uint64_t head = DV_ALIGN(sizeof(*gh) + (uint64_t)N * 8, DV_ARENA_ALIGN);
        if (gh->nodes != (uint32_t)N || len < head || gh->stride > (len - head) / (uint64_t)N)
                return fail(sp, DEVAL_EPROTO, "the leaders disagree on the nodes: %u, not %d",
                            gh->nodes, N);
        for (int k = 0; k < W; k++)
                sp->dlen[k] = UINT64_MAX; /* not seen */
        int placed = 0;
        for (int n = 0; n < N; n++) {
                uint64_t nlen;
                if (hello)
                        sp->node_start[n] = placed;
                memcpy(&nlen, b + sizeof(*gh) + (size_t)n * 8, 8);
                if (nlen > gh->stride)
                        return fail(sp, DEVAL_EPROTO, "node %d's bytes are cut short", n);
                const uint8_t *p = b + head + (uint64_t)n * gh->stride, *end = p + nlen;
                uint64_t count;
                if (nlen < 8)
                        return fail(sp, DEVAL_EPROTO, "node %d sent no parts", n);
                memcpy(&count, p, 8);
                p += 8;
                if (!hello && count != (uint64_t)(sp->node_start[n + 1] - sp->node_start[n]))
                        return fail(sp, DEVAL_EPROTO, "node %d sent %" PRIu64 " parts, not %d", n,
                                    count, sp->node_start[n + 1] - sp->node_start[n]);
                for (uint64_t i = 0; i < count; i++) {
                        uint64_t plen;
                        PartHdr h;
                        if ((uint64_t)(end - p) < 8 + sizeof(h))
                                return fail(sp, DEVAL_EPROTO, "node %d's parts are cut short", n);
                        memcpy(&plen, p, 8);
                        p += 8;
                        memcpy(&h, p, sizeof(h));
                        size_t hmax =
                                offsetof(DvRequest, t) + DEVAL_MAX_TENSORS * sizeof(DvTensorDesc);
                        if (plen > (uint64_t)(end - p) || h.magic != PART_MAGIC || h.rank < 0 ||
                            h.rank >= W || h.head < offsetof(DvRequest, t) || h.head > hmax ||
                            (h.head - offsetof(DvRequest, t)) % sizeof(DvTensorDesc) ||
                            plen < DV_ALIGN(sizeof(h) + h.head, DV_ARENA_ALIGN) ||
                            h.data > plen - DV_ALIGN(sizeof(h) + h.head, DV_ARENA_ALIGN))
                                return fail(sp, DEVAL_EPROTO, "node %d sent a malformed part", n);
                        int k = h.rank;
                        if (sp->dlen[k] != UINT64_MAX)
                                return fail(sp, DEVAL_EMISMATCH,
                                            "rank %d joined twice: on node %d and on node %d", k,
                                            sp->node_of[k], n);
                        if (hello && (h.world != W || h.nodes != N || h.node != n ||
                                      h.local_rank != (int)i || h.local_world != (int)count))
                                return fail(sp, DEVAL_EMISMATCH,
                                            "ranks disagree on the layout: rank %d (local rank "
                                            "%d of %d on node %d of %d, world %d) arrived as "
                                            "part %" PRIu64 " of %" PRIu64 " from node %d of "
                                            "%d, world %d",
                                            k, h.local_rank, h.local_world, h.node, h.nodes,
                                            h.world, i, count, n, N, W);
                        if (!hello && sp->node_of[k] != n)
                                return fail(sp, DEVAL_EPROTO, "rank %d's part came from node %d", k,
                                            n);
                        DvRequest *q = &sp->reqs[k];
                        memset(q, 0, offsetof(DvRequest, t));
                        memcpy(q, p + sizeof(h), h.head);
                        uint32_t nt = (uint32_t)((h.head - offsetof(DvRequest, t)) /
                                                 sizeof(DvTensorDesc));
                        if (q->ntensors != nt)
                                return fail(sp, DEVAL_EPROTO, "rank %d sent a malformed part", k);
                        sp->node_of[k] = n;
                        if (hello)
                                sp->node_ranks[placed++] = k;
                        sp->data[k] = p + DV_ALIGN(sizeof(h) + h.head, DV_ARENA_ALIGN);
                        sp->dlen[k] = h.data;
                        p += DV_ALIGN(plen, 8);
                        if (p > end)
                                p = end;
                }
        }
        for (int k = 0; k < W; k++)
                if (sp->dlen[k] == UINT64_MAX)
                        return fail(sp, DEVAL_EMISMATCH, "rank %d joined on no node", k);
        if (hello)
                sp->node_start[N] = placed;
        for (int n = 0; hello && n < N; n++)
                if (sp->node_start[n + 1] == sp->node_start[n])
                        return fail(sp, DEVAL_EMISMATCH, "node %d has no ranks", n);
        return 0;
}

/* This rank's part: its request and the bytes it staged (in g->in, up to the last tensor). */
static int make_part(deval_group *g, const DvRequest *q, size_t *len) {
        DvSpan *sp = g->span;
        uint32_t nt = q->ntensors > DEVAL_MAX_TENSORS ? 0 : q->ntensors;
        uint64_t data = 0;
        for (uint32_t i = 0; i < nt; i++)
                if (q->t[i].nbytes)
                        data = DV_MAX(data, q->t[i].offset + q->t[i].nbytes);
        PartHdr h = {.magic = PART_MAGIC,
                     .rank = g->rank,
                     .node = sp->node,
                     .world = g->world,
                     .nodes = sp->nodes,
                     .local_rank = sp->local_rank,
                     .local_world = sp->local_world,
                     .head = (uint32_t)(offsetof(DvRequest, t) + nt * sizeof(DvTensorDesc)),
                     .data = data};
        size_t at = DV_ALIGN(sizeof(h) + h.head, DV_ARENA_ALIGN);
        if (!grow(&sp->part, &sp->part_cap, at + data))
                return dv_set_err(g, DEVAL_ENOMEM, "out of memory for a %" PRIu64 "-byte part",
                                  (uint64_t)(at + data));
        memcpy(sp->part, &h, sizeof(h));
        memcpy(sp->part + sizeof(h), q, h.head);
        if (nt != q->ntensors) /* a failed stage: no tensors */
                ((DvRequest *)(sp->part + sizeof(h)))->ntensors = 0;
        if (data)
                memcpy(sp->part + at, g->in, data);
        *len = at + data;
        return 0;
}

/*
 * One exchange: this rank's part goes out, every rank's comes back into reqs, data and dlen.
 * Return: 0, or the failure of the group (it sticks), with its message in g.
 */
static int exchange(deval_group *g, const char *fn, bool hello) {
        DvSpan *sp = g->span;
        deval_group *L = sp->local;
        size_t part_len = 0;
        int r;

        if ((r = make_part(g, g->req, &part_len)) < 0)
                return r;
        deval_bytes item = {sp->part, part_len}, view;
        const deval_bytes *items = NULL;
        size_t n = 0;
        deval_gather_opts to_leader = DEVAL_GATHER_OPTS_INIT;
        to_leader.root = 0;
        r = deval_gather_objects(L, 1, &item, &to_leader, &n, &items);
        if (sp->local_rank != 0) {
                if (r < 0 || (r = deval_broadcast_bytes(L, NULL, 0, 0, &view)) < 0)
                        return local_failed(g, fn, r);
        } else {
                char why[DV_MSG_MAX] = "";
                uint8_t *global = NULL;
                uint64_t len = 0;
                if (r < 0)
                        say_global(sp, deval_errmsg(L), why, sizeof(why));
                int s = leader_swap(g, r, why, items, n, &global, &len);
                if (r < 0) /* the node's ranks know; the others know from the engine */
                        return broken(g, r, fn, why);
                if (s < 0) {
                        len = global_failure(sp, s);
                        global = sp->failure;
                }
                if ((r = deval_broadcast_bytes(L, global, len, 0, &view)) < 0)
                        return local_failed(g, fn, r);
        }
        if ((r = parse(g, view.data, view.len, hello)) < 0)
                return broken(g, r, fn, sp->msg);
        return 0;
}

/* ---- the step, run on every rank alike -------------------------------------------------- */

static const char *who(const DvSpan *sp, int k, char *buf, size_t len) {
        snprintf(buf, len, "rank %d (node %d)", k, sp->node_of[k]);
        return buf;
}

#define SAME(sp, W, q, field, fmtspec, what)                                               \
        do {                                                                               \
                for (int _k = 1; _k < (W); _k++)                                           \
                        if ((q)[_k].field != (q)[0].field) {                               \
                                char _a[48], _b[48];                                       \
                                return fail((sp), DEVAL_EMISMATCH,                         \
                                            "collective #%u (%s): ranks disagree on " what \
                                            ": %s has " fmtspec ", %s has " fmtspec,       \
                                            (q)[0].seq, dv_op_name((q)[0].op),             \
                                            who((sp), 0, _a, sizeof(_a)), (q)[0].field,    \
                                            who((sp), _k, _b, sizeof(_b)), (q)[_k].field); \
                        }                                                                  \
        } while (0)

static int bad_part(DvSpan *sp, int k, int i) {
        char a[48];
        return fail(sp, DEVAL_EPROTO, "collective #%u: %s sent a malformed tensor %d",
                    sp->reqs[k].seq, who(sp, k, a, sizeof(a)), i);
}

static int check_tensors(DvSpan *sp, int W, uint32_t lo, uint32_t hi, int root) {
        for (int k = 0; k < W; k++) {
                if (sp->reqs[k].ntensors < lo || sp->reqs[k].ntensors > hi)
                        return bad_part(sp, k, -1);
                for (uint32_t i = 0; i < sp->reqs[k].ntensors; i++)
                        if (dv_desc_check(&sp->reqs[k].t[i], sp->dlen[k], root < 0 || k == root))
                                return bad_part(sp, k, (int)i);
        }
        return 0;
}

static int same_shapes(DvSpan *sp, int W, const char *what) {
        const DvTensorDesc *a = &sp->reqs[0].t[0];
        char x[48], y[48];
        for (int k = 1; k < W; k++) {
                const DvTensorDesc *b = &sp->reqs[k].t[0];
                if (a->dtype != b->dtype)
                        return fail(sp, DEVAL_EMISMATCH,
                                    "%s: ranks disagree on the dtype: %s has %s, %s has %s", what,
                                    who(sp, 0, x, sizeof(x)), dv_dtype_name(a->dtype),
                                    who(sp, k, y, sizeof(y)), dv_dtype_name(b->dtype));
                if (a->ndim != b->ndim)
                        return fail(sp, DEVAL_EMISMATCH,
                                    "%s: ranks disagree on the ndim: %s has %d, %s has %d", what,
                                    who(sp, 0, x, sizeof(x)), a->ndim, who(sp, k, y, sizeof(y)),
                                    b->ndim);
                for (int d = 0; d < a->ndim; d++)
                        if (a->shape[d] != b->shape[d])
                                return fail(sp, DEVAL_EMISMATCH,
                                            "%s: ranks disagree on the shape: dim %d is %lld on "
                                            "%s, %lld on %s",
                                            what, d, (long long)a->shape[d],
                                            who(sp, 0, x, sizeof(x)), (long long)b->shape[d],
                                            who(sp, k, y, sizeof(y)));
        }
        return 0;
}

/* sp->shapes and sp->srcs for n inputs at least, kept from step to step */
static bool inputs(DvSpan *sp, size_t n) {
        if (n <= sp->inputs_cap)
                return true;
        DvShape *shapes = realloc(sp->shapes, n * sizeof(*shapes));
        if (shapes)
                sp->shapes = shapes;
        const uint8_t **srcs = realloc(sp->srcs, n * sizeof(*srcs));
        if (srcs)
                sp->srcs = srcs;
        if (!shapes || !srcs)
                return false;
        sp->inputs_cap = n;
        return true;
}

static uint8_t *out_of(DvSpan *sp, uint64_t bytes) {
        if (!grow(&sp->out, (size_t *)&sp->out_cap, (size_t)bytes))
                return NULL;
        return sp->out;
}

static int pass_stream(const DvSpan *sp, const DvRequest *q) {
        if (!sp->pass.active || q->site >= DV_PASS_SITES)
                return -1;
        if (q->op == DV_OP_GATHER_METRICS)
                return (int)q->site;
        if (q->op == DV_OP_OBJECTS_METRICS)
                return DV_PASS_SITES + (int)q->site;
        return -1;
}

static int gather_opts(DvSpan *sp, int W) {
        DvRequest *q = sp->reqs;
        SAME(sp, W, q, pad_first, "%u", "pad_first");
        SAME(sp, W, q, keep_rows, "%" PRId64, "keep_rows");
        SAME(sp, W, q, root, "%d", "root");
        int bad, r;
        if ((q[0].op == DV_OP_GATHER_METRICS || q[0].op == DV_OP_OBJECTS_METRICS) &&
            sp->pass.active && (r = dv_pass_sites(q, W, &bad)) < 0) {
                char n0[48], nk[48];
                dv_pass_sites_msg(sp->msg, sizeof(sp->msg), r, q, bad, q[0].seq,
                                  who(sp, 0, n0, sizeof(n0)), who(sp, bad, nk, sizeof(nk)));
                return r;
        }
        if (pass_stream(sp, q) < 0)
                SAME(sp, W, q, order, "%d", "order");
        for (int k = 1; k < W; k++)
                if (memcmp(&q[k].pad_value, &q[0].pad_value, sizeof(double)) != 0) {
                        char a[48], b[48];
                        return fail(sp, DEVAL_EMISMATCH,
                                    "collective #%u (%s): ranks disagree on pad_value: %s has "
                                    "%g, %s has %g",
                                    q[0].seq, dv_op_name(q[0].op), who(sp, 0, a, sizeof(a)),
                                    q[0].pad_value, who(sp, k, b, sizeof(b)), q[k].pad_value);
                }
        if (q[0].root < -1 || q[0].root >= W || q[0].site >= DV_PASS_SITES ||
            (q[0].order != DEVAL_ORDER_RANK && q[0].order != DEVAL_ORDER_STRIDED))
                return fail(sp, DEVAL_EPROTO, "collective #%u: malformed options", q[0].seq);
        return 0;
}

static void plan_input(DvSpan *sp, int W, int n, DvPlanInput *in) {
        const DvRequest *q = sp->reqs;
        int stream = pass_stream(sp, q);
        *in = (DvPlanInput){.world = W,
                            .ntensors = n,
                            .in = sp->shapes,
                            .valid_rows = sp->valid,
                            .keep_rows = q->keep_rows,
                            .order = q->order,
                            .pad_first = q->pad_first != 0,
                            .pad_value = q->pad_value,
                            .max_out = sp->max_out};
        if (stream >= 0) {
                in->in_pass = true;
                in->order = sp->pass.order;
                in->num_samples = sp->pass.num_samples;
                in->pass_total = sp->pass.total[stream];
                in->pass_rows = &sp->pass.rows[stream * W];
        }
}

static void pass_advance(DvSpan *sp, int W, const DvPlan *p) {
        SpanPass *ps = &sp->pass;
        int stream = pass_stream(sp, sp->reqs);
        if (stream >= 0)
                dv_pass_advance(stream, W, p->contributed, &ps->used, ps->total, ps->most,
                                ps->rows);
}

static int plan_failed(DvSpan *sp, int r, const DvPlan *p) {
        return fail(sp, r, "collective #%u (%s): %s", sp->reqs[0].seq, dv_op_name(sp->reqs[0].op),
                    p->err);
}

static void root_only(deval_group *g, DvResult *res) {
        int root = g->span->reqs[0].root;
        for (uint32_t i = 0; root >= 0 && root != g->rank && i < res->ntensors; i++) {
                res->t[i].shape[0] = 0;
                res->t[i].nbytes = 0;
                res->t[i].offset = 0;
        }
}

static int step_gather(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        if ((r = check_tensors(sp, W, 1, DEVAL_MAX_TENSORS, -1)) < 0)
                return r;
        SAME(sp, W, q, ntensors, "%u", "the number of tensors");
        if ((r = gather_opts(sp, W)) < 0)
                return r;
        int n = (int)q[0].ntensors;
        if (!inputs(sp, (size_t)W * (size_t)n))
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        DvShape *shapes = sp->shapes;
        const uint8_t **srcs = sp->srcs;
        for (int k = 0; k < W; k++) {
                for (int i = 0; i < n; i++) {
                        shapes[k * n + i] = dv_shape_of(&q[k].t[i]);
                        srcs[k * n + i] = sp->data[k] ? sp->data[k] + q[k].t[i].offset : NULL;
                }
                sp->valid[k] = q[k].valid_rows;
        }
        DvPlanInput in;
        DvPlan *p = &g->plan;
        plan_input(sp, W, n, &in);
        dv_plan_reset(p);
        if ((r = dv_plan_gather(&in, p)) < 0)
                return plan_failed(sp, r, p);
        uint8_t *out = out_of(sp, p->out_end);
        if (!out || dv_plan_run(g, p, n, false, srcs, out) < 0)
                return fail(sp, DEVAL_ENOMEM, "out of memory for a %" PRIu64 "-byte result",
                            p->out_end);
        pass_advance(sp, W, p);
        sp->res.ntensors = (uint32_t)n;
        for (int i = 0; i < n; i++)
                dv_desc_of(&p->out[i], p->out_offset[i], p->out_nbytes[i], &sp->res.t[i]);
        root_only(g, &sp->res);
        return 0;
}

static int step_objects(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        if ((r = check_tensors(sp, W, 2, 2, -1)) < 0 || (r = gather_opts(sp, W)) < 0)
                return r;
        for (int k = 0; k < W; k++) {
                const DvTensorDesc *lens = &q[k].t[0], *blob = &q[k].t[1];
                if (lens->dtype != DEVAL_I64 || lens->ndim != 1 || blob->dtype != DEVAL_U8 ||
                    blob->ndim != 1)
                        return bad_part(sp, k, 0);
                int64_t *pre = realloc(sp->prefix[k], ((size_t)lens->shape[0] + 1) * 8);
                if (!pre)
                        return fail(sp, DEVAL_ENOMEM, "out of memory");
                sp->prefix[k] = pre;
                const uint8_t *src = sp->data[k] ? sp->data[k] + lens->offset : NULL;
                if (lens->shape[0] && !src)
                        return bad_part(sp, k, 0);
                if (!dv_objects_prefix(src, lens->shape[0], blob->shape[0], pre))
                        return bad_part(sp, k, 1);
        }
        if (!inputs(sp, (size_t)W))
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        DvShape *shapes = sp->shapes;
        const uint8_t **blobs = sp->srcs;
        for (int k = 0; k < W; k++) {
                shapes[k] = dv_shape_of(&q[k].t[0]);
                sp->valid[k] = q[k].valid_rows;
                blobs[k] = sp->data[k] ? sp->data[k] + q[k].t[1].offset : NULL;
        }
        DvPlanInput in;
        DvPlan *p = &g->plan;
        plan_input(sp, W, 1, &in);
        dv_plan_reset(p);
        if ((r = dv_plan_gather(&in, p)) < 0)
                return plan_failed(sp, r, p);
        uint64_t blob_bytes = dv_objects_bytes(p, sp->prefix);
        uint64_t lens_bytes = (uint64_t)p->samples * 8;
        uint64_t blob_off = DV_ALIGN(lens_bytes, DV_ARENA_ALIGN);
        uint8_t *out = out_of(sp, blob_off + blob_bytes);
        if (!out)
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        dv_objects_copy(p, sp->prefix, blobs, out, blob_off);
        pass_advance(sp, W, p);
        DvShape ls = {.dtype = DEVAL_I64, .ndim = 1, .shape = {p->samples}};
        DvShape bs = {.dtype = DEVAL_U8, .ndim = 1, .shape = {(int64_t)blob_bytes}};
        sp->res.ntensors = 2;
        dv_desc_of(&ls, 0, lens_bytes, &sp->res.t[0]);
        dv_desc_of(&bs, blob_off, blob_bytes, &sp->res.t[1]);
        root_only(g, &sp->res);
        return 0;
}

static int step_pad(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        if ((r = check_tensors(sp, W, 1, 1, -1)) < 0)
                return r;
        SAME(sp, W, q, dim, "%d", "dim");
        SAME(sp, W, q, pad_first, "%u", "pad_first");
        SAME(sp, W, q, t[0].ndim, "%d", "ndim");
        if ((r = gather_opts(sp, W)) < 0)
                return r;
        if (q[0].dim < 0 || q[0].dim >= q[0].t[0].ndim)
                return fail(sp, DEVAL_EPROTO, "dim %d is out of range", q[0].dim);
        if (!inputs(sp, (size_t)W))
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        DvShape *shapes = sp->shapes;
        const uint8_t **srcs = sp->srcs;
        for (int k = 0; k < W; k++) {
                shapes[k] = dv_shape_of(&q[k].t[0]);
                srcs[k] = sp->data[k] ? sp->data[k] + q[k].t[0].offset : NULL;
        }
        DvPlan *p = &g->plan;
        dv_plan_reset(p);
        if ((r = dv_plan_pad(W, shapes, q[0].dim, q[0].pad_first != 0, q[0].pad_value, 0,
                             sp->max_out, p)) < 0)
                return plan_failed(sp, r, p);
        uint8_t *out = out_of(sp, p->out_end);
        if (!out || dv_plan_run(g, p, 1, true, srcs, out) < 0)
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        sp->res.ntensors = 1;
        dv_desc_of(&p->out[g->rank], p->out_offset[g->rank], p->out_nbytes[g->rank], &sp->res.t[0]);
        return 0;
}

#define REDUCE_CHUNK 1024

static int step_reduce(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        if ((r = check_tensors(sp, W, 1, 1, -1)) < 0)
                return r;
        SAME(sp, W, q, reduce_op, "%d", "the reduce op");
        if ((r = same_shapes(sp, W, "reduce")) < 0)
                return r;
        const DvTensorDesc *t = &q[0].t[0];
        int op = q[0].reduce_op;
        if (op < DEVAL_SUM || op > DEVAL_PROD)
                return fail(sp, DEVAL_EPROTO, "reduce op %d is unknown", op);
        if (op == DEVAL_MEAN && !dv_dtype_is_float(t->dtype))
                return fail(sp, DEVAL_EINVAL, "mean needs a floating dtype, not %s",
                            dv_dtype_name(t->dtype));
        uint8_t *out = out_of(sp, t->nbytes);
        if (!out)
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        size_t es = dv_dtype_size(t->dtype);
        uint64_t numel = t->nbytes / es;
        double acc[REDUCE_CHUNK];                            /* an accumulator is 8 bytes at most */
        for (uint64_t e = 0; e < numel; e += REDUCE_CHUNK) { /* in global rank order */
                size_t n = (size_t)DV_MIN((uint64_t)REDUCE_CHUNK, numel - e);
                dv_reduce_init(t->dtype, acc, sp->data[0] + q[0].t[0].offset + e * es, n);
                for (int k = 1; k < W; k++)
                        dv_reduce_accumulate(t->dtype, op, acc,
                                             sp->data[k] + q[k].t[0].offset + e * es, n);
                dv_reduce_finish(t->dtype, op, W, acc, out + e * es, n);
        }
        sp->res.ntensors = 1;
        DvShape sh = dv_shape_of(t);
        dv_desc_of(&sh, 0, t->nbytes, &sp->res.t[0]);
        return 0;
}

static int step_broadcast(deval_group *g, bool bytes) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        SAME(sp, W, q, root, "%d", "root");
        int root = q[0].root;
        if (root < 0 || root >= W)
                return fail(sp, DEVAL_EPROTO, "root %d is out of range", root);
        if (bytes) {
                if (q[root].ntensors != 1 || dv_desc_check(&q[root].t[0], sp->dlen[root], true))
                        return bad_part(sp, root, 0);
        } else if ((r = check_tensors(sp, W, 1, 1, root)) < 0 ||
                   (r = same_shapes(sp, W, "broadcast")) < 0) {
                return r;
        }
        const DvTensorDesc *t = &q[root].t[0];
        uint8_t *out = out_of(sp, t->nbytes);
        if (!out)
                return fail(sp, DEVAL_ENOMEM, "out of memory");
        if (t->nbytes)
                memcpy(out, sp->data[root] + t->offset, t->nbytes);
        sp->res.ntensors = 1;
        DvShape sh = dv_shape_of(t);
        dv_desc_of(&sh, 0, t->nbytes, &sp->res.t[0]);
        return 0;
}

static void pass_reset(DvSpan *sp, int W) {
        SpanPass *ps = &sp->pass;
        ps->active = false;
        ps->used = 0;
        ps->status = 0;
        ps->msg[0] = '\0';
        memset(ps->total, 0, sizeof(ps->total));
        memset(ps->most, 0, sizeof(ps->most));
        memset(ps->rows, 0, (size_t)DV_PASS_STREAMS * (size_t)W * sizeof(int64_t));
        memset(sp->parked, 0, (size_t)W * sizeof(bool));
}

static int step_eval_begin(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world;
        DvRequest *q = sp->reqs;

        SAME(sp, W, q, num_samples, "%" PRId64, "num_samples");
        SAME(sp, W, q, order, "%d", "order");
        if (q[0].num_samples < 0 ||
            (q[0].order != DEVAL_ORDER_RANK && q[0].order != DEVAL_ORDER_STRIDED))
                return fail(sp, DEVAL_EPROTO, "malformed eval_begin");
        if (sp->pass.active)
                return fail(sp, DEVAL_EINVAL,
                            "an eval pass is already open on group '%s'; end it with "
                            "deval_eval_end first",
                            g->name);
        pass_reset(sp, W);
        sp->pass.active = true;
        sp->pass.order = q[0].order;
        sp->pass.num_samples = q[0].num_samples;
        return 0;
}

/* Every rank ended the pass: close it, and check it when every loader ran out. */
static int step_eval_end(deval_group *g) {
        DvSpan *sp = g->span;
        SpanPass *ps = &sp->pass;
        int W = g->world, r = 0;

        if (!ps->active)
                return fail(sp, DEVAL_EINVAL, "no eval pass is open on group '%s'", g->name);
        bool exhausted = true;
        for (int k = 0; k < W; k++)
                exhausted &= (sp->reqs[k].flags & DV_END_EXHAUSTED) != 0;
        if (ps->status) {
                r = fail(sp, ps->status, "%s", ps->msg);
        } else {
                char msg[DV_MSG_MAX];
                r = dv_pass_close(msg, sizeof(msg), exhausted, ps->num_samples, ps->order, W,
                                  ps->used, ps->total, ps->most, ps->rows);
                if (r < 0)
                        r = fail(sp, r, "%s", msg);
        }
        pass_reset(sp, W);
        return r;
}

/*
 * Ranks that called eval_end while others still call are parked: each of their parts stands
 * for an empty contribution to the others' collective, as devald answers for a parked rank.
 * Return: the first rank still calling (-1: every rank has ended the pass), or the failure
 * when the others called something an empty contribution cannot answer.
 */
static int park(deval_group *g, int *tmpl) {
        DvSpan *sp = g->span;
        int W = g->world;
        DvRequest *q = sp->reqs;
        DvPark pk;

        *tmpl = -1;
        for (int k = 0; k < W && *tmpl < 0; k++)
                if (q[k].op != DV_OP_EVAL_END)
                        *tmpl = k;
        if (*tmpl < 0 || !sp->pass.active)
                return 0;
        if (!dv_pass_park(q, W, sp->parked, &pk)) {
                char a[48], b[48], msg[DV_MSG_MAX];
                dv_pass_park_msg(msg, sizeof(msg), &pk, q, q[pk.tmpl].seq,
                                 who(sp, pk.tmpl, a, sizeof(a)),
                                 who(sp, pk.left >= 0 ? pk.left : pk.first, b, sizeof(b)));
                return fail(sp, DEVAL_EMISMATCH, "%s", msg);
        }
        if (pk.first < 0)
                return 0;
        DvRequest tm = q[*tmpl];
        for (int k = 0; k < W; k++)
                if (sp->parked[k]) {
                        dv_req_empty(&q[k], &tm, tm.seq);
                        sp->data[k] = NULL;
                        sp->dlen[k] = 0;
                }
        return 0;
}

/* Run the step every rank described, here. *closed: it was the close of the eval pass. */
static int step(deval_group *g, bool *closed) {
        DvSpan *sp = g->span;
        int W = g->world, tmpl, r;
        DvRequest *q = sp->reqs;
        char a[48], b[48];

        sp->msg[0] = '\0';
        memset(&sp->res, 0, offsetof(DvResult, t));
        *closed = false;
        for (int k = 0; k < W; k++) {
                if (q[k].seq != q[0].seq)
                        return fail(sp, DEVAL_EPROTO, "%s is at collective #%u, %s at #%u",
                                    who(sp, 0, a, sizeof(a)), q[0].seq, who(sp, k, b, sizeof(b)),
                                    q[k].seq);
                if (q[k].status != 0) {
                        int s = dv_staging_status(q[k].status);
                        if (!s)
                                return fail(sp, DEVAL_EPROTO,
                                            "malformed request from %s: status %d",
                                            who(sp, k, a, sizeof(a)), q[k].status);
                        char why[sizeof(q[k].why)];
                        size_t n = dv_printable(why, sizeof(why), q[k].why, sizeof(q[k].why));
                        return fail(sp, s,
                                    "collective #%u (%s): %s could not stage its %llu bytes of "
                                    "input: %s",
                                    q[k].seq, dv_op_name(q[k].op), who(sp, k, a, sizeof(a)),
                                    (unsigned long long)q[k].staged_bytes,
                                    n ? why : deval_strerror(s));
                }
        }
        if ((r = park(g, &tmpl)) < 0)
                return r;
        if (tmpl < 0) {
                *closed = true;
                return step_eval_end(g);
        }
        for (int k = 0; k < W; k++)
                if (q[k].op != q[0].op)
                        return fail(sp, DEVAL_EMISMATCH,
                                    "collective #%u: ranks disagree on the op: %s called %s, %s "
                                    "called %s",
                                    q[0].seq, who(sp, 0, a, sizeof(a)), dv_op_name(q[0].op),
                                    who(sp, k, b, sizeof(b)), dv_op_name(q[k].op));
        sp->res.op = q[tmpl].op;
        sp->res.site = q[tmpl].site;
        sp->res.batch = q[tmpl].batch;
        switch (q[0].op) {
        case DV_OP_GATHER:
        case DV_OP_GATHER_METRICS:
                return step_gather(g);
        case DV_OP_OBJECTS:
        case DV_OP_OBJECTS_METRICS:
                return step_objects(g);
        case DV_OP_PAD:
                return step_pad(g);
        case DV_OP_REDUCE:
                return step_reduce(g);
        case DV_OP_BROADCAST:
                return step_broadcast(g, false);
        case DV_OP_BROADCAST_BYTES:
                return step_broadcast(g, true);
        case DV_OP_EVAL_BEGIN:
                return step_eval_begin(g);
        case DV_OP_BARRIER:
                return 0;
        }
        return fail(sp, DEVAL_EPROTO, "collective #%u: unknown op %u", q[0].seq, q[0].op);
}

/*
 * dv_span_run() - the collective described in g->req, across every node.
 * @pass_end: an eval_end. While others still call, this rank is parked: each of their steps
 *            is run here too, with this rank's part empty, and kept to replay (replay.c).
 * Return: 0 with the result in *ret (views into g->out); the step's status; or the failure
 * of the group, which sticks.
 */
int dv_span_run(deval_group *g, const char *fn, bool pass_end, const DvResult **ret) {
        DvSpan *sp = g->span;
        int r;

        g->in_keep = 0;
        for (;;) {
                g->req->seq = g->seq + 1;
                if ((r = exchange(g, fn, false)) < 0)
                        return r;
                g->seq++;
                bool closed;
                r = step(g, &closed);
                g->out = sp->out;
                g->out_size = sp->out_cap;
                g->view = g->out;
                g->view_size = g->out_size;
                if (!pass_end || closed || !sp->parked[g->rank])
                        break;
                if (r == 0 && (r = dv_replay_keep(g, fn, &sp->res)) < 0)
                        return broken(g, r, fn, deval_errmsg(g));
                if (r < 0 && !sp->pass.status) { /* the others saw it; this rank at the close */
                        sp->pass.status = r;
                        snprintf(sp->pass.msg, sizeof(sp->pass.msg),
                                 "collective #%u (%s) failed after this rank ended the pass: "
                                 "%.*s",
                                 g->seq, dv_op_name(sp->res.op), DV_MSG_MAX - 96, sp->msg);
                }
        }
        if (r < 0)
                return dv_set_err(g, r, "%s: %s", fn, sp->msg);
        *ret = &sp->res;
        return 0;
}

/* dv_reserve_input() for a spanning handle: its input is memory of its own. */
int dv_span_reserve(deval_group *g, uint64_t size) {
        if (size <= g->in_size)
                return 0;
        if (size > (1ull << 46))
                return dv_set_err(g, DEVAL_ENOMEM, "an input of %" PRIu64 " bytes", size);
        size_t cap = g->in_size;
        /* what deval_input_buffer() handed out moves along, as grow() keeps the bytes */
        if (!grow(&g->in, &cap, size))
                return dv_set_err(g, DEVAL_ENOMEM, "out of memory for %" PRIu64 " bytes", size);
        g->in_size = cap;
        return 0;
}

void dv_span_free(deval_group *g) {
        DvSpan *sp = g->span;
        if (!sp)
                return;
        if (sp->local)
                deval_leave(sp->local);
        if (sp->laid_out && sp->eng.release)
                sp->eng.release(sp->eng.ctx);
        for (int k = 0; sp->prefix && k < g->world; k++)
                free(sp->prefix[k]);
        free(sp->prefix);
        free(sp->round1);
        free(sp->failure);
        free(sp->node_of);
        free(sp->node_ranks);
        free(sp->node_start);
        free(sp->part);
        free(sp->reqs);
        free(sp->data);
        free(sp->dlen);
        free(sp->parked);
        free(sp->shapes);
        free(sp->valid);
        free(sp->srcs);
        free(sp->pass.rows);
        free(sp->out);
        free(g->in);
        g->in = NULL;
        g->out = NULL;
        free(sp);
        g->span = NULL;
}

static int join_fail(deval_group *g, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static int join_fail(deval_group *g, int status, const char *fmt, ...) {
        char msg[DV_MSG_MAX + 128];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        if (g) {
                dv_span_free(g);
                dv_plan_deinit(&g->plan);
                for (size_t i = 0; i < DV_ARRAY_SIZE(g->scratch); i++)
                        free(g->scratch[i]);
                free(g);
        }
        return dv_join_err(status, "%s", msg);
}

/* The largest result this rank takes: $DEVAL_SPAN_MAX_BYTES, else a quarter of memory. */
static uint64_t max_result(void) {
        const char *env = secure_getenv("DEVAL_SPAN_MAX_BYTES");
        if (env && *env)
                return strtoull(env, NULL, 10);
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || size <= 0)
                return 1ull << 32;
        return (uint64_t)pages * (uint64_t)size / 4;
}

/*
 * The join's exchange: every rank's node, local rank and host, checked to agree, then the
 * layout in node_ranks and node_start. The leader tells its devald what its group is part of.
 */
static int hello(deval_group *g, const char *fn) {
        DvSpan *sp = g->span;
        int r;

        if ((r = dv_span_reserve(g, sizeof(Hello))) < 0)
                return r;
        Hello mine = {.max_out = max_result()};
        gethostname(mine.host, HOST_MAX - 1);
        memcpy(g->in, &mine, sizeof(mine));
        DvRequest *q = &sp->req;
        memset(q, 0, sizeof(*q));
        q->op = HELLO_OP;
        q->ntensors = 1;
        q->t[0] = (DvTensorDesc){
                .dtype = DEVAL_U8, .ndim = 1, .shape = {sizeof(Hello)}, .nbytes = sizeof(Hello)};
        if ((r = exchange(g, fn, true)) < 0)
                return r;
        sp->max_out = UINT64_MAX;
        for (int k = 0; k < g->world; k++) {
                Hello h;
                if (sp->reqs[k].ntensors != 1 || sp->dlen[k] < sizeof(Hello))
                        return broken(g, DEVAL_EPROTO, fn,
                                      "a rank's part of the join is malformed");
                memcpy(&h, sp->data[k], sizeof(h));
                sp->max_out = DV_MIN(sp->max_out, DV_MAX(h.max_out, (uint64_t)1 << 20));
        }
        sp->laid_out = true;
        if (sp->local_rank != 0)
                return 0;
        DvSpanReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_SPAN}};
        DvSpanInfo *si = &req.info;
        snprintf(si->group, sizeof(si->group), "%s", g->name);
        si->node = sp->node;
        si->nodes = sp->nodes;
        si->world = g->world;
        si->listed = DV_MIN(sp->nodes, DV_SPAN_NODES);
        for (int n = 0; n < si->listed; n++) {
                int leader = sp->node_ranks[sp->node_start[n]];
                si->node_info[n].leader = leader;
                si->node_info[n].nranks = sp->node_start[n + 1] - sp->node_start[n];
                snprintf(si->node_info[n].host, sizeof(si->node_info[n].host), "%.*s", HOST_MAX - 1,
                         ((const Hello *)sp->data[leader])->host);
        }
        for (int i = 0; i < sp->local_world; i++)
                si->ranks[i] = (int16_t)sp->node_ranks[sp->node_start[sp->node] + i];
        DvReply rep;
        int fds[DV_MAX_FDS], nfds = DV_MAX_FDS;
        if (dv_request(sp->local, &req, sizeof(req), &rep, fds, &nfds) == 0) /* for deval-ctl */
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
        return 0;
}

/**
 * deval_join_spanning() - join a group whose ranks run on engine->nodes machines. Every rank
 * of the group calls it: the ranks of each machine meet in its devald (opts as deval_join()),
 * then every rank learns the whole layout in one exchange through the node leaders' engine.
 * Return: 0; DEVAL_EINVAL (bad arguments); DEVAL_EMISMATCH (the ranks' layouts disagree); the
 * node group's join failures; the engine's.
 */
int deval_join_spanning(const char *group, int rank, int world_size, int local_rank,
                        int local_world, const deval_join_opts *opts, const deval_engine *engine,
                        deval_group **out) {
        const char *fn = "deval_join_spanning";
        deval_engine eng;
        char why[256], name[DV_GROUP_NAME_MAX];
        DvJob job;
        int r;

        if (!out || !engine)
                return join_fail(NULL, DEVAL_EINVAL, "%s: out or engine is NULL", fn);
        if (dv_opts_copy(&eng, sizeof(eng), engine, engine->size, "deval_engine", why,
                         sizeof(why)) < 0)
                return join_fail(NULL, DEVAL_EINVAL, "%s: %s", fn, why);
        if (world_size < 1 || world_size > DEVAL_MAX_WORLD || rank < 0 || rank >= world_size ||
            local_world < 1 || local_world > world_size || local_rank < 0 ||
            local_rank >= local_world || eng.nodes < 1 || eng.nodes > world_size || eng.node < 0 ||
            eng.node >= eng.nodes || !eng.allgather)
                return join_fail(NULL, DEVAL_EINVAL,
                                 "%s: rank %d of %d, local rank %d of %d, node %d of %d%s", fn,
                                 rank, world_size, local_rank, local_world, eng.node, eng.nodes,
                                 eng.allgather ? "" : ", no allgather");
        if (!group) {
                if ((r = dv_job_from_env(&job, why, sizeof(why))) < 0)
                        return join_fail(NULL, r, "%s: %s", fn, why);
                group = job.name;
        }
        if (snprintf(name, sizeof(name), "%s.n%d", group, eng.node) >= (int)sizeof(name))
                return join_fail(NULL, DEVAL_EINVAL,
                                 "%s: the name '%s' is too long for a group spanning machines "
                                 "(at most %d bytes with the node's suffix)",
                                 fn, group, DV_GROUP_NAME_MAX - 1);
        deval_group *g = calloc(1, sizeof(*g));
        DvSpan *sp = g ? calloc(1, sizeof(*sp)) : NULL;
        if (!sp) {
                free(g);
                return join_fail(NULL, DEVAL_ENOMEM, "%s: out of memory", fn);
        }
        size_t W = (size_t)world_size;
        g->span = sp;
        g->sock = -1;
        g->rank = rank;
        g->world = world_size;
        g->device = -1;
        g->pid = getpid();
        g->forks = dv_forks();
        g->req = &sp->req;
        snprintf(g->name, sizeof(g->name), "%s", group);
        dv_plan_init(&g->plan);
        sp->eng = eng;
        sp->node = eng.node;
        sp->nodes = eng.nodes;
        sp->local_rank = local_rank;
        sp->local_world = local_world;
        sp->node_of = calloc(W, sizeof(int));
        sp->node_ranks = calloc(W, sizeof(int));
        sp->node_start = calloc((size_t)eng.nodes + 1, sizeof(int));
        sp->reqs = calloc(W, sizeof(DvRequest));
        sp->data = calloc(W, sizeof(*sp->data));
        sp->dlen = calloc(W, sizeof(uint64_t));
        sp->parked = calloc(W, sizeof(bool));
        sp->prefix = calloc(W, sizeof(*sp->prefix));
        sp->valid = calloc(W, sizeof(int64_t));
        sp->pass.rows = calloc(W * DV_PASS_STREAMS, sizeof(int64_t));
        if (!sp->node_of || !sp->node_ranks || !sp->node_start || !sp->reqs || !sp->data ||
            !sp->dlen || !sp->parked || !sp->prefix || !sp->valid || !sp->pass.rows)
                return join_fail(g, DEVAL_ENOMEM, "%s: out of memory", fn);

        deval_join_opts lo = {DEVAL_JOIN_OPTS_INIT};
        if (opts && (r = dv_opts_copy(&lo, sizeof(lo), opts, opts->size, "deval_join_opts", why,
                                      sizeof(why))) < 0)
                return join_fail(g, DEVAL_EINVAL, "%s: %s", fn, why);
        if (lo.on_device)
                return join_fail(g, DEVAL_ENOTSUP,
                                 "%s: a device group cannot span machines yet; join a host "
                                 "group (tensors on GPUs are staged through host memory)",
                                 fn);
        int t = lo.timeout_ms == 0 ? 300000 : lo.timeout_ms;
        g->timeout_ms = t < 0 ? -1 : t;
        lo.timeout_ms = t < 0 ? -1 : t + LOCAL_GRACE_MS;
        if ((r = deval_join(name, local_rank, local_world, &lo, &sp->local)) < 0)
                return join_fail(g, r, "%s", deval_errmsg(NULL));
        /* the node's ranks wait on the engine at every step, for longer than a spin pays
         * for: they sleep at once, leaving the cores to the leader's exchange, unless told
         * otherwise ($DEVAL_SPIN_US, $DEVAL_YIELD_US) */
        if (!secure_getenv("DEVAL_SPIN_US"))
                sp->local->spin_ns = 0;
        if (!secure_getenv("DEVAL_YIELD_US"))
                sp->local->yield_ns = 0;
        if ((r = hello(g, fn)) < 0)
                return join_fail(g, r, "%s", deval_errmsg(g));
        *out = g;
        return 0;
}

/** deval_nodes() - the machines g spans (1 for a group of one machine); *node: this one's. */
int deval_nodes(const deval_group *g, int *node) {
        if (!g)
                return DEVAL_EINVAL;
        if (node)
                *node = g->span ? g->span->node : 0;
        return g->span ? g->span->nodes : 1;
}
