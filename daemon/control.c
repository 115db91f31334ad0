/* SPDX-License-Identifier: MIT */
/*
 * control.c - the control messages of a connection: join, grow, output, leave, and deval-ctl's
 * status, group, abort, topology and flight dump, each checked before it is acted on.
 */
#define _GNU_SOURCE
#include "control.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "check.h"
#include "daemon.h"
#include "flight_dump.h"
#include "group.h"
#include "group_arena.h"
#include "group_join.h"
#include "journals.h"
#include "log.h"
#include "output.h"
#include "proc.h"
#include "progress.h"
#include "reply.h"
#include "sock.h"
#include "topo.h"
#include "util.h"
#include "worker.h"

/* Its open eval pass, as its ranks' progress says; each rank's into ranks[world] (or NULL). */
static void group_pass(const Group *g, uint64_t now, DvPassInfo *p, DvRankProgress *ranks) {
        *p = (DvPassInfo){.total = -1, .lag_rank = -1};
        if (g->loop.state != DV_GROUP_ACTIVE || !g->hdr ||
            !dv_progress_read(g->hdr, group_pass_shared(g), g->world, p, ranks))
                return;
        uint64_t since = atomic_load(&((Group *)g)->pass_since_ns);
        p->age_us = since && now > since ? (now - since) / 1000 : 0;
}

/* What a group is, for status and group; its ranks' progress into ranks[world] (or NULL). */
static void group_info(const Group *g, uint64_t now, DvGroupInfo *i, DvRankProgress *ranks) {
        memcpy(i->name, g->name, sizeof(i->name));
        i->uid = (uint32_t)g->uid;
        i->state = (uint32_t)g->loop.state;
        /* the worker fails a group on a timeout without touching the main thread's state */
        pthread_mutex_lock((pthread_mutex_t *)&g->lock);
        if (g->locked.abort_status && g->loop.state == DV_GROUP_ACTIVE)
                i->state = DV_GROUP_FAILED;
        pthread_mutex_unlock((pthread_mutex_t *)&g->lock);
        i->world_size = g->world;
        i->joined = g->loop.joined;
        i->collectives = atomic_load(&((Group *)g)->collectives);
        i->bytes_moved = atomic_load(&((Group *)g)->bytes_moved);
        i->age_us = (now - g->created_ns) / 1000;
        memcpy(i->launcher, g->launcher, sizeof(i->launcher));
        group_pass(g, now, &i->pass, ranks);
}

/* Which groups a client may see: its own uid's, or every group for root. */
static bool visible_to(const Group *g, const Conn *c) {
        return c->uid == 0 || g->uid == c->uid;
}

static void handle_status(Daemon *d, Conn *c) {
        uint32_t n = 0;
        for (Group *g = d->groups; g; g = g->next)
                n += visible_to(g, c);
        uint32_t shown = DV_MIN(n, (uint32_t)DV_STATUS_MAX_GROUPS);
        size_t len = sizeof(DvStatusReply) + shown * sizeof(DvGroupInfo);
        _cleanup_(freep) DvStatusReply *r = calloc(1, len);
        if (!r)
                return;
        r->hdr = (DvMsgHdr){DV_PROTO_VERSION, DV_MSG_STATUS};
        r->pid = (int32_t)getpid();
        snprintf(r->version, sizeof(r->version), "%s", DV_VERSION_STRING);
        snprintf(r->backend, sizeof(r->backend), "%s", d->gpu ? "cuda" : "host");
        uint64_t now = dv_now_ns();
        r->uptime_us = (now - d->start_ns) / 1000;
        r->max_group_bytes = d->max_group_bytes;
        r->unexpected_fds = d->unexpected_fds;
        r->total_groups = n;
        uint64_t deadline = now + CATCH_UP_NS;
        for (Group *g = d->groups; g; g = g->next)
                if (visible_to(g, c))
                        worker_catch_up(g, deadline);
        for (Group *g = d->groups; g && r->ngroups < shown; g = g->next) {
                if (!visible_to(g, c))
                        continue;
                DvGroupInfo *i = &r->groups[r->ngroups++];
                group_info(g, now, i, NULL);
                pthread_mutex_lock(&g->lock);
                i->bytes_mapped = g->locked.bytes_mapped;
                pthread_mutex_unlock(&g->lock);
        }
        ssize_t k = dv_send_msg(c->fd, r, len, NULL, 0, MSG_DONTWAIT);
        if (k < 0)
                log_warn("could not send status to pid %d: %s", (int)c->pid, strerror((int)-k));
}

/*
 * The group req names, if c may see it: a group's details are its owner's and root's
 * business. Otherwise c has been answered why, and the result is NULL.
 */
static Group *group_for(Daemon *d, Conn *c, const DvNameReq *req) {
        char msg[DV_MSG_MAX];
        int status;
        Group *g = NULL;

        if (!memchr(req->name, 0, sizeof(req->name))) {
                status = DEVAL_EPROTO;
                snprintf(msg, sizeof(msg), "malformed group name");
        } else if (!(g = group_lookup(d, req->name))) {
                status = DEVAL_EINVAL;
                snprintf(msg, sizeof(msg), "no group '%s' is forming or active", req->name);
        } else if (c->uid != 0 && c->uid != g->uid) {
                status = DEVAL_EPERM;
                snprintf(msg, sizeof(msg), "group '%s' belongs to uid %u", g->name,
                         (unsigned)g->uid);
                g = NULL;
        } else {
                return g;
        }
        conn_reply(c, status, msg);
        return NULL;
}

static int cmp_u32(const void *a, const void *b) {
        uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
        return x < y ? -1 : x > y;
}

static void handle_group(Daemon *d, Conn *c, const DvNameReq *req) {
        Group *g = group_for(d, c, req);
        if (!g)
                return;
        worker_catch_up(g, dv_now_ns() + CATCH_UP_NS);
        size_t len = sizeof(DvGroupReply) + (size_t)g->world * sizeof(DvRankInfo);
        _cleanup_(freep) DvGroupReply *r = calloc(1, len);
        if (!r)
                return;
        r->hdr = (DvMsgHdr){DV_PROTO_VERSION, DV_MSG_GROUP};
        r->nranks = (uint32_t)g->world;
        r->timeout_ms = g->timeout_ns < 0 ? -1 : (int32_t)(g->timeout_ns / 1000000);
        _cleanup_(freep) DvRankProgress *prog = calloc((size_t)g->world, sizeof(*prog));
        if (!prog)
                return;
        group_info(g, dv_now_ns(), &r->info, prog);
        if (g->loop.span)
                r->span = *g->loop.span;
        pthread_mutex_lock(&g->lock);
        r->waiting_seq = g->locked.waiting_seq;
        r->worker_tid = atomic_load(&g->worker_tid);
        r->numa = g->numa;
        snprintf(r->worker_cpus, sizeof(r->worker_cpus), "%s", g->worker_cpus);
        uint64_t now = dv_now_ns();
        if (g->locked.waiting_since_ns && now > g->locked.waiting_since_ns)
                r->waiting_ms =
                        (uint32_t)DV_MIN((now - g->locked.waiting_since_ns) / 1000000, UINT32_MAX);
        uint32_t n = DV_MIN(g->locked.lat_n, 256u), lat[256];
        memcpy(lat, g->locked.lat_us, n * sizeof(*lat));
        r->latency_n = n;
        r->info.bytes_mapped = g->locked.bytes_mapped;
        snprintf(r->abort_msg, sizeof(r->abort_msg), "%s", g->locked.abort_msg);
        for (int k = 0; k < g->world; k++) {
                const Member *m = &g->members[k];
                DvRankInfo *ri = &r->ranks[k];
                ri->pass_state = prog[k].state;
                ri->pass_samples = prog[k].samples;
                ri->pass_batches = prog[k].batches;
                ri->rank = k;
                ri->pid = (int32_t)m->pid;
                ri->state = (uint32_t)m->state;
                ri->numa = m->numa;
                char how[96];
                if (m->state == MEMBER_JOINED) {
                        if (proc_state(m->pid, how, sizeof(how)) == PROC_STOPPED)
                                ri->state = DV_RANK_STOPPED;
                }
                ri->input_bytes = m->in_pending.map ? m->in_pending.size : m->in.size;
                ri->times_last = m->times_last;
                ri->late_us = m->times_last ? m->late_ns / m->times_last / 1000 : 0;
                if (g->hdr)
                        ri->arrived_seq = atomic_load_explicit(&g->hdr->slots[k].arrived_seq,
                                                               memory_order_relaxed);
        }
        pthread_mutex_unlock(&g->lock);
        if (n) {
                qsort(lat, n, sizeof(*lat), cmp_u32);
                r->p50_us = lat[(n - 1) / 2];
                r->p99_us = lat[(n - 1) * 99 / 100];
        }
        ssize_t k = dv_send_msg(c->fd, r, len, NULL, 0, MSG_DONTWAIT);
        if (k < 0)
                log_warn("could not send group details to pid %d: %s", (int)c->pid,
                         strerror((int)-k));
}

static void handle_abort(Daemon *d, Conn *c, const DvNameReq *req) {
        Group *g = group_for(d, c, req);
        if (!g)
                return;
        char msg[DV_MSG_MAX];
        log_info("group '%s' aborted by uid %u (pid %d)", g->name, (unsigned)c->uid, (int)c->pid);
        /* forming: nobody is in a collective yet, so tell the joiners */
        if (g->loop.state == DV_GROUP_FORMING) {
                snprintf(msg, sizeof(msg), "group '%s' was aborted by uid %u before it formed",
                         g->name, (unsigned)c->uid);
                g->loop.listed = false;
                g->loop.state = DV_GROUP_FAILED;
                for (int k = 0; k < g->world; k++)
                        if (g->members[k].conn)
                                conn_reply(g->members[k].conn, DEVAL_EABORTED, msg);
        } else {
                char why[64];
                snprintf(why, sizeof(why), "was aborted by uid %u", (unsigned)c->uid);
                group_flight_dump(g, why);
                group_fail(g, DEVAL_EABORTED, "group '%s' was aborted by uid %u (deval-ctl abort)",
                           g->name, (unsigned)c->uid);
                if (!group_fail_published(g, 1000))
                        log_info("group '%s': its worker has not yet told the ranks of the abort "
                                 "(a step runs still)",
                                 g->name);
        }
        conn_reply(c, 0, "");
}

/* deval-ctl dump NAME: the group's flight recorder, as JSON in a sealed memfd. */
static void handle_dump(Daemon *d, Conn *c, const DvNameReq *req) {
        Group *g = group_for(d, c, req);
        if (!g)
                return;
        worker_catch_up(g, dv_now_ns() + CATCH_UP_NS);
        size_t len = 0;
        _cleanup_(freep) char *json = group_flight_json(g, &len);
        _cleanup_(closep) int fd =
                json ? memfd_create("deval-flight", MFD_CLOEXEC | MFD_ALLOW_SEALING) : -1;
        if (fd < 0 || write(fd, json, len) != (ssize_t)len ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                conn_reply(c, DEVAL_ENOMEM, "devald could not write the recorder out");
                return;
        }
        uint64_t size = len;
        conn_reply_segments(c, &(ConnSegments){.fds = &fd, .sizes = &size, .n = 1});
}

/* One message from c. Return: false when the connection must be closed. */
bool control_handle(Daemon *d, Conn *c) {
        union {
                DvMsgHdr hdr;
                DvJoinReq join;
                DvGrowReq grow;
                DvNameReq name;
                DvSpanReq span;
                DvJournalReq journal;
                char raw[256];
        } m;
        char msg[DV_MSG_MAX] = "";
        int nfds = 0;

        int dropped = 0;
        ssize_t n = dv_recv_msg_counted(c->fd, &m, sizeof(m), NULL, &nfds, MSG_DONTWAIT, &dropped);
        if (dropped) { /* no request carries descriptors: close them, count them, say so */
                static unsigned events; /* said the first times, then every 1000th */
                if (events++ < 10 || events % 1000 == 0)
                        log_warn("pid %d (uid %u) sent %d file descriptor%s devald did not ask "
                                 "for; closed",
                                 (int)c->pid, (unsigned)c->uid, dropped, dropped == 1 ? "" : "s");
                d->unexpected_fds += (uint64_t)dropped;
        }
        if (n == -EAGAIN || n == -EINTR)
                return true;
        if (n <= 0)
                return false;
        if ((size_t)n < sizeof(DvMsgHdr) || m.hdr.version != DV_PROTO_VERSION) {
                char why[96];
                snprintf(why, sizeof(why),
                         "devald %s speaks protocol version %d; use the libdeval of its version",
                         DV_VERSION_STRING, DV_PROTO_VERSION);
                log_warn("pid %d speaks another protocol version; closing", (int)c->pid);
                conn_reply(c, DEVAL_EPROTO, why);
                return false;
        }
        switch (dv_msg_check(&m, (size_t)n)) {
        case DV_MSG_JOIN: {
                int r = group_join(d, c, &m.join, msg, sizeof(msg));
                if (r < 0) {
                        log_info("join refused for pid %d: %s", (int)c->pid, msg);
                        conn_reply(c, r, msg);
                }
                return true;
        }
        case DV_MSG_GROW: {
                Group *g = c->group;
                Arena a;
                if (!g || g->loop.state != DV_GROUP_ACTIVE) {
                        conn_reply(c, g ? DEVAL_EABORTED : DEVAL_EPROTO,
                                   "this connection has no active group");
                        return true;
                }
                if (m.grow.device) { /* answered when a job has made it (gpu_jobs.h) */
                        int r = g->device_group
                                        ? group_grow_dev_input(g, c, m.grow.size, msg, sizeof(msg))
                                        : DEVAL_EPROTO;
                        if (r < 0)
                                conn_reply(c, r, g->device_group ? msg : "not a device group");
                        return true;
                }
                int r = group_grow_input(g, c->rank, m.grow.size, &a, msg, sizeof(msg));
                if (r < 0) {
                        conn_reply(c, r, msg);
                        return true;
                }
                conn_reply_segments(c, &(ConnSegments){.fds = &a.fd, .sizes = &a.size, .n = 1});
                return true;
        }
        case DV_MSG_SPAN: {
                Group *g = c->group;
                if (!g || g->loop.state != DV_GROUP_ACTIVE) {
                        conn_reply(c, DEVAL_EPROTO, "this connection has no active group");
                        return true;
                }
                int r = dv_span_check(&m.span.info, g->world, msg, sizeof(msg));
                if (r == 0 && !g->loop.span && !(g->loop.span = malloc(sizeof(DvSpanInfo))))
                        r = DEVAL_ENOMEM;
                if (r == 0)
                        memcpy(g->loop.span, &m.span.info, sizeof(DvSpanInfo));
                conn_reply(c, r, r == DEVAL_ENOMEM ? "devald is out of memory" : msg);
                return true;
        }
        case DV_MSG_DIRECT: {
                Group *g = c->group;
                Arena a;
                uint64_t gen;
                if (!g || g->loop.state != DV_GROUP_ACTIVE || g->device_group || m.grow.device) {
                        conn_reply(c,
                                   g && g->loop.state != DV_GROUP_ACTIVE ? DEVAL_EABORTED
                                                                         : DEVAL_EPROTO,
                                   "this connection has no active host group");
                        return true;
                }
                int r = output_direct(g, m.grow.size, &a, &gen, msg, sizeof(msg));
                if (r < 0) {
                        conn_reply(c, r, msg);
                        return true;
                }
                conn_reply_segments(
                        c, &(ConnSegments){.fds = &a.fd, .sizes = &a.size, .n = 1, .gen = gen});
                return true;
        }
        case DV_MSG_DEV_OUTPUT: {
                Group *g = c->group;
                uint64_t size, gen;
                int fd = g && g->loop.state != DV_GROUP_FORMING && g->device_group
                                 ? group_dev_output_fd(g, c->rank, &size, &gen)
                                 : -1;
                if (fd < 0) {
                        conn_reply(c, DEVAL_EPROTO, "this connection has no device group");
                        return true;
                }
                conn_reply_segments(c, &(ConnSegments){.fds = &fd,
                                                       .sizes = &size,
                                                       .n = 1,
                                                       .dev_gen = gen,
                                                       .flags = DV_REPLY_DEVICE});
                return true;
        }
        case DV_MSG_OUTPUT: {
                Group *g = c->group;
                uint64_t size, gen;
                if (!g || g->loop.state == DV_GROUP_FORMING) {
                        conn_reply(c, DEVAL_EPROTO, "this connection has no active group");
                        return true;
                }
                int fd = group_output_fd(g, &size, &gen);
                if (fd < 0) {
                        conn_reply(c, DEVAL_EABORTED, "the group is closed");
                        return true;
                }
                conn_reply_segments(
                        c, &(ConnSegments){.fds = &fd, .sizes = &size, .n = 1, .gen = gen});
                return true;
        }
        case DV_MSG_LEAVE: {
                Group *g = c->group;
                if (g) {
                        log_debug("group '%s': rank %d left", g->name, c->rank);
                        group_member_gone(g, c->rank, true);
                        c->group = NULL;
                        /* freed before the answer: what it held is back when leave returns */
                        group_maybe_free(g);
                        conn_reply(c, 0, "");
                        return true;
                }
                conn_reply(c, 0, "");
                return true;
        }
        case DV_MSG_STATUS:
                handle_status(d, c);
                return true;
        case DV_MSG_TOPO: {
                DvTopoReply r = {.hdr = {DV_PROTO_VERSION, DV_MSG_TOPO}};
                topo_describe(d, &r);
                ssize_t k = dv_send_msg(c->fd, &r, sizeof(r), NULL, 0, MSG_DONTWAIT);
                if (k < 0)
                        log_warn("could not send the topology to pid %d: %s", (int)c->pid,
                                 strerror((int)-k));
                return true;
        }
        case DV_MSG_JOURNAL:
        case DV_MSG_JOURNALS:
                journals_request(d, c, &m.journal);
                return true;
        case DV_MSG_GROUP:
        case DV_MSG_ABORT:
        case DV_MSG_DUMP:
                if (m.hdr.type == DV_MSG_GROUP)
                        handle_group(d, c, &m.name);
                else if (m.hdr.type == DV_MSG_ABORT)
                        handle_abort(d, c, &m.name);
                else
                        handle_dump(d, c, &m.name);
                return true;
        }
        log_warn("malformed message (type %u, %zd bytes) from pid %d; closing", m.hdr.type, n,
                 (int)c->pid);
        conn_reply(c, DEVAL_EPROTO, "malformed message");
        return false;
}
