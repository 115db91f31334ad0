/* SPDX-License-Identifier: MIT */
/*
 * span.c - a group that spans machines: its join, its collectives from start to end, and its
 * handle's life.
 *
 * Each machine's ranks form a group at their own devald (the node's group, named after the
 * spanning group and the node); its local rank 0 is the node's leader. The spanning handle
 * runs collective.c's checks and staging unchanged, into memory of its own, and each
 * collective is then one exchange of every rank's part (span_exchange.c, in span_wire.c's
 * bytes) and one step every rank runs over all parts, in global ranks (span_step.c). A
 * failure travels the same way in place of the parts, so every rank of every node returns it.
 * The join is an exchange too: every rank's node, local rank and host, checked to agree, then
 * the layout every later exchange relies on.
 *
 * Trust: parts come from the group's own ranks, through the job's engine. They are checked
 * for bounds before use (never a crash), as devald checks what ranks write.
 */
#define _GNU_SOURCE
#include "span.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deval.h"

#include "arena.h"
#include "calls.h"
#include "check.h"
#include "handle.h"
#include "job.h"
#include "replay.h"
#include "sock.h"
#include "span_exchange.h"
#include "span_state.h"
#include "span_step.h"
#include "span_wire.h"
#include "util.h"

/**
 * dv_span_run() - the collective described in g->req, across every node: an exchange, then
 * the step, here.
 * @g: a spanning handle, its input staged in g->in
 * @fn: the user's call, to name in a failure
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
                g->req->call = dv_call_no(g, g->req->seq); /* (a spanning group restages nothing) */
                if ((r = dv_span_exchange(g, fn, false)) < 0)
                        return r;
                g->seq++;
                bool closed;
                r = dv_span_step(g, &closed);
                g->out = sp->out;
                g->out_size = sp->out_cap;
                g->view = g->out;
                g->view_size = g->out_size;
                if (!pass_end || closed || !sp->pass.parked[g->rank])
                        break;
                if (r == 0 && (r = dv_replay_keep(g, fn, &sp->res)) < 0)
                        return dv_span_broken(g, r, fn, deval_errmsg(g));
                if (r < 0) /* the others saw it; this rank at the close */
                        dv_pass_failed(&sp->pass, r, g->seq, sp->res.op, sp->msg);
        }
        if (r < 0)
                return dv_set_err(g, r, "%s: %s", fn, sp->msg);
        *ret = &sp->res;
        return 0;
}

/**
 * dv_span_reserve() - dv_reserve_input() for a spanning handle: its input lies in its node
 * group's input arena, DV_SPAN_IN_AT bytes in (span_state.h), grown with what
 * deval_input_buffer() handed out kept.
 * @g: a spanning handle
 * @size: the bytes of input it needs
 * Return: 0; DEVAL_ENOMEM past 2^46 bytes, or the node group's failure to grow (its quota, a
 * connection), with its message in g.
 */
int dv_span_reserve(deval_group *g, uint64_t size) {
        deval_group *L = g->span->local;
        if (g->in && size <= g->in_size)
                return 0;
        if (size > (1ull << 46))
                return dv_set_err(g, DEVAL_ENOMEM, "an input of %" PRIu64 " bytes", size);
        L->in_keep = g->in ? DV_SPAN_IN_AT + g->in_keep : 0; /* moves along with the arena */
        int r = dv_reserve_input(L, DV_SPAN_IN_AT + size);
        dv_span_input_at(g);
        return r < 0 ? dv_set_err(g, r, "%s", deval_errmsg(L)) : 0;
}

/**
 * dv_span_free() - leave the node's group, release the engine (once the join laid the group
 * out) and free the spanning state with the handle's input; g itself stays.
 * @g: a handle; nothing happens where it does not span machines
 */
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
        free(sp->reqs);
        free(sp->data);
        free(sp->dlen);
        free(sp->shapes);
        free(sp->valid);
        free(sp->srcs);
        dv_pass_deinit(&sp->pass);
        free(sp->out);
        g->in = NULL; /* inside the node group's arena */
        g->out = NULL;
        free(sp);
        g->span = NULL;
        g->span_ops = NULL;
}

/* What the layers below reach through the handle (handle.h). */
static const DvSpanOps span_ops = {
        .run = dv_span_run,
        .reserve = dv_span_reserve,
        .pass_open = dv_span_pass_open,
        .free = dv_span_free,
};

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
                dv_plan_deinit(&g->fast.plan);
                for (size_t i = 0; i < DV_ARRAY_SIZE(g->fast.scratch); i++)
                        free(g->fast.scratch[i]);
                free(g);
        }
        return dv_join_err(status, "%s", msg);
}

/* msg, which the join of node's group (named node_name) wrote, naming the group the user
 * joined: "group 'x' (node 1's part of it, 'x.n1')" for "group 'x.n1'". */
static void say_node_group(const char *msg, const char *node_name, const char *group, int node,
                           char *out, size_t len) {
        char quoted[DV_GROUP_NAME_MAX + 3];
        snprintf(quoted, sizeof(quoted), "'%s'", node_name);
        const char *at = strstr(msg, quoted);
        if (!at) {
                snprintf(out, len, "%s", msg);
                return;
        }
        snprintf(out, len, "%.*s'%s' (node %d's part of it, %s)%s", (int)(at - msg), msg, group,
                 node, quoted, at + strlen(quoted));
}

/* The largest result this rank takes: $DEVAL_SPAN_MAX_BYTES (read with the node group's
 * tunables, tunables.h), else a quarter of memory. */
static uint64_t max_result(const DvTunables *t) {
        if (dv_tun_set(t, DV_TUN_SPAN_MAX_BYTES))
                return dv_tun_or(t, DV_TUN_SPAN_MAX_BYTES, 0);
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

        if ((r = dv_span_reserve(g, sizeof(DvSpanHello))) < 0)
                return r;
        DvSpanHello mine = {.max_out = max_result(&sp->local->tun)};
        gethostname(mine.host, DV_SPAN_HOST_MAX - 1);
        dv_span_wire_hello_write(&sp->req, g->in, &mine);
        if ((r = dv_span_exchange(g, fn, true)) < 0)
                return r;
        sp->max_out = UINT64_MAX;
        for (int k = 0; k < g->world; k++) {
                DvSpanHello h;
                if (!dv_span_wire_hello_read(&sp->reqs[k], sp->data[k], sp->dlen[k], &h))
                        return dv_span_broken(g, DEVAL_EPROTO, fn,
                                              "a rank's part of the join is malformed");
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
                DvSpanHello h; /* every rank's was read above */
                dv_span_wire_hello_read(&sp->reqs[leader], sp->data[leader], sp->dlen[leader], &h);
                snprintf(si->node_info[n].host, sizeof(si->node_info[n].host), "%.*s",
                         DV_SPAN_HOST_MAX - 1, h.host);
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
        g->span_ops = &span_ops;
        g->sock = -1;
        g->rank = rank;
        g->world = world_size;
        g->device = -1;
        g->pid = getpid();
        g->forks = dv_forks();
        g->req = &sp->req;
        snprintf(g->name, sizeof(g->name), "%s", group);
        dv_plan_init(&g->fast.plan);
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
        sp->prefix = calloc(W, sizeof(*sp->prefix));
        sp->valid = calloc(W, sizeof(int64_t));
        if (!sp->node_of || !sp->node_ranks || !sp->node_start || !sp->reqs || !sp->data ||
            !sp->dlen || !sp->prefix || !sp->valid || dv_pass_init(&sp->pass, W) < 0)
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
        lo.timeout_ms = t < 0 ? -1 : t + DV_SPAN_GRACE_MS;
        if ((r = deval_join(name, local_rank, local_world, &lo, &sp->local)) < 0) {
                char msg[DV_MSG_MAX + 128];
                say_node_group(deval_errmsg(NULL), name, group, eng.node, msg, sizeof(msg));
                dv_span_say_timeout(msg, sizeof(msg), lo.timeout_ms);
                return join_fail(g, r, "%s", msg);
        }
        /* the node's ranks wait on the engine at every step, for longer than a spin pays
         * for: they sleep at once, leaving the cores to the leader's exchange, unless told
         * otherwise ($DEVAL_SPIN_US, $DEVAL_YIELD_US) */
        const DvTunables *tun = &sp->local->tun;
        if (!dv_tun_set(tun, DV_TUN_SPIN_US))
                sp->local->spin_ns = 0;
        if (!dv_tun_set(tun, DV_TUN_YIELD_US))
                sp->local->yield_ns = 0;
        sp->local->crowd_aware = false; /* it sleeps at once, crowded or not */
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
