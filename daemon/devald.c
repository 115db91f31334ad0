/* SPDX-License-Identifier: MIT */
/*
 * devald.c - the deval daemon: command line, the listening socket, the epoll loop with a
 * signalfd, client connections and their control messages, the status answer, and the
 * systemd readiness notification. Runs in the foreground and never forks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "daemon.h"
#include "gpu_worker.h"
#include "log.h"
#include "sock.h"
#include "util.h"

#define MAX_CONNS 4096

static int nconns;

/* sd_notify(3) in a few lines: one datagram to $NOTIFY_SOCKET, if set. */
static void notify(const char *state) {
        const char *path = getenv("NOTIFY_SOCKET");
        struct sockaddr_un sa = {.sun_family = AF_UNIX};

        if (!path || (path[0] != '/' && path[0] != '@') || strlen(path) >= sizeof(sa.sun_path))
                return;
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return;
        strncpy(sa.sun_path, path, sizeof(sa.sun_path) - 1);
        if (sa.sun_path[0] == '@')
                sa.sun_path[0] = '\0';
        socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
        if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
                log_debug("sd_notify failed: %m");
        close(fd);
}

/**
 * conn_send_reply(, 0, 0) - answer c with a DvReply, descriptors and sizes. A client that does not
 * read its socket is not waited for: the send never blocks, and a failed send is logged.
 */
void conn_send_reply(Conn *c, int status, const char *msg, const int *fds, int nfds,
                     const uint64_t *sizes, uint64_t gen, uint64_t dev_gen, uint32_t flags) {
        DvReply r = {.hdr = {DV_PROTO_VERSION, DV_MSG_REPLY},
                     .status = status,
                     .nfds = (uint32_t)nfds,
                     .gen = gen,
                     .dev_gen = dev_gen,
                     .flags = flags};
        for (int i = 0; i < nfds; i++)
                r.size[i] = sizes[i];
        snprintf(r.msg, sizeof(r.msg), "%s", msg ? msg : "");
        if (c->hangup_ns) /* nobody is listening */
                return;
        ssize_t n = dv_send_msg(c->fd, &r, sizeof(r), fds, nfds, MSG_DONTWAIT);
        if (n < 0)
                log_warn("could not answer pid %d: %s", (int)c->pid, strerror((int)-n));
}

/*
 * Close c: its group learns the member is gone, its descriptors close, and the Conn itself
 * waits on d->closed until the current batch of events is done, since a later event of the
 * same batch may still point at it.
 */
static void conn_close(Daemon *d, Conn *c) {
        if (c->fd < 0)
                return;
        if (c->hangup_ns) {
                c->hangup_ns = 0;
                d->hungup--;
        }
        if (c->group) {
                Group *g = c->group;
                group_member_gone(g, c->rank, false);
                c->group = NULL;
                group_maybe_free(g);
        }
        epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        if (c->pidfd >= 0) {
                epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->pidfd, NULL);
                close(c->pidfd);
                c->pidfd = -1;
        }
        for (Conn **p = &d->conns; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        c->next = d->closed;
        d->closed = c;
        nconns--;
        c->usage->conns--;
        c->usage->fds -= 2;
        usage_put(d, c->usage);
        c->usage = NULL;
}

/* How long a member that hung up may take to end before it is closed as one that left. */
#define HANGUP_GRACE_NS (20 * 1000 * 1000ull)

static bool process_ended(int pidfd) {
        struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
        return poll(&pfd, 1, /* timeout_ms= */ 0) > 0;
}

/*
 * c's client hung up (or broke the protocol). A dying process closes its sockets before it
 * becomes a zombie, and only the zombie tells how it ended (group_member_gone() reads it
 * from /proc). So a group member is closed when its pidfd says it ended (the event is
 * already watched) or HANGUP_GRACE_NS later (conns_expire()), whichever comes first; the
 * loop goes on meanwhile, so a crashed large group never stalls the others. Anyone else is
 * closed at once.
 */
static void conn_hangup(Daemon *d, Conn *c) {
        if (c->fd < 0 || c->hangup_ns)
                return;
        if (!c->group || c->pidfd < 0 || process_ended(c->pidfd)) {
                conn_close(d, c);
                return;
        }
        epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        c->hangup_ns = dv_now_ns() + HANGUP_GRACE_NS;
        d->hungup++;
}

/* Close the members whose grace after hanging up is over; next_ns: when the next one is. */
static void conns_expire(Daemon *d, uint64_t now, int64_t *next_ns) {
        if (!d->hungup)
                return;
        for (Conn *c = d->conns, *next; c; c = next) {
                next = c->next;
                if (!c->hangup_ns)
                        continue;
                if (c->hangup_ns <= now) {
                        log_debug("pid %d hung up and did not end within %llu ms", (int)c->pid,
                                  HANGUP_GRACE_NS / 1000000);
                        conn_close(d, c);
                        continue;
                }
                int64_t left = (int64_t)(c->hangup_ns - now);
                if (*next_ns < 0 || left < *next_ns)
                        *next_ns = left;
        }
}

static void conns_reap(Daemon *d) {
        while (d->closed) {
                Conn *c = d->closed;
                d->closed = c->next;
                free(c);
        }
}

static void group_info(const Group *g, uint64_t now, DvGroupInfo *i) {
        memcpy(i->name, g->name, sizeof(i->name));
        i->uid = (uint32_t)g->uid;
        i->state = (uint32_t)g->state;
        /* the worker fails a group on a timeout without touching the main thread's state */
        pthread_mutex_lock((pthread_mutex_t *)&g->lock);
        if (g->abort_status && g->state == DV_GROUP_ACTIVE)
                i->state = DV_GROUP_FAILED;
        pthread_mutex_unlock((pthread_mutex_t *)&g->lock);
        i->world_size = g->world;
        i->joined = g->joined;
        i->collectives = atomic_load(&((Group *)g)->collectives);
        i->bytes_moved = atomic_load(&((Group *)g)->bytes_moved);
        i->age_us = (now - g->created_ns) / 1000;
        memcpy(i->launcher, g->launcher, sizeof(i->launcher));
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
                group_info(g, now, i);
                pthread_mutex_lock(&g->lock);
                i->bytes_mapped = g->bytes_mapped;
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
        conn_send_reply(c, status, msg, NULL, 0, NULL, 0, 0, 0);
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
        group_info(g, dv_now_ns(), &r->info);
        pthread_mutex_lock(&g->lock);
        r->waiting_seq = g->waiting_seq;
        r->worker_tid = atomic_load(&g->worker_tid);
        r->numa = g->numa;
        snprintf(r->worker_cpus, sizeof(r->worker_cpus), "%s", g->worker_cpus);
        uint64_t now = dv_now_ns();
        if (g->waiting_since_ns && now > g->waiting_since_ns)
                r->waiting_ms = (uint32_t)DV_MIN((now - g->waiting_since_ns) / 1000000, UINT32_MAX);
        uint32_t n = DV_MIN(g->lat_n, 256u), lat[256];
        memcpy(lat, g->lat_us, n * sizeof(*lat));
        r->latency_n = n;
        r->info.bytes_mapped = g->bytes_mapped;
        snprintf(r->abort_msg, sizeof(r->abort_msg), "%s", g->abort_msg);
        for (int k = 0; k < g->world; k++) {
                const Member *m = &g->members[k];
                DvRankInfo *ri = &r->ranks[k];
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
        if (g->state == DV_GROUP_FORMING) { /* nobody is in a collective yet: tell the joiners */
                snprintf(msg, sizeof(msg), "group '%s' was aborted by uid %u before it formed",
                         g->name, (unsigned)c->uid);
                g->listed = false;
                g->state = DV_GROUP_FAILED;
                for (int k = 0; k < g->world; k++)
                        if (g->members[k].conn)
                                conn_send_reply(g->members[k].conn, DEVAL_EABORTED, msg, NULL, 0,
                                                NULL, 0, 0, 0);
        } else {
                char why[64];
                snprintf(why, sizeof(why), "was aborted by uid %u", (unsigned)c->uid);
                group_flight_dump(g, why);
                group_fail(g, DEVAL_EABORTED, "group '%s' was aborted by uid %u (deval-ctl abort)",
                           g->name, (unsigned)c->uid);
        }
        conn_send_reply(c, 0, "", NULL, 0, NULL, 0, 0, 0);
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
                conn_send_reply(c, DEVAL_ENOMEM, "devald could not write the recorder out", NULL, 0,
                                NULL, 0, 0, 0);
                return;
        }
        uint64_t size = len;
        conn_send_reply(c, 0, "", &fd, 1, &size, 0, 0, 0);
}

/* One message from c. Return: false when the connection must be closed. */
static bool conn_handle(Daemon *d, Conn *c) {
        union {
                DvMsgHdr hdr;
                DvJoinReq join;
                DvGrowReq grow;
                DvNameReq name;
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
                conn_send_reply(c, DEVAL_EPROTO, why, NULL, 0, NULL, 0, 0, 0);
                return false;
        }
        switch (dv_msg_check(&m, (size_t)n)) {
        case DV_MSG_JOIN: {
                int r = group_join(d, c, &m.join, msg, sizeof(msg));
                if (r < 0) {
                        log_info("join refused for pid %d: %s", (int)c->pid, msg);
                        conn_send_reply(c, r, msg, NULL, 0, NULL, 0, 0, 0);
                }
                return true;
        }
        case DV_MSG_GROW: {
                Group *g = c->group;
                Arena a;
                if (!g || g->state != DV_GROUP_ACTIVE) {
                        conn_send_reply(c, g ? DEVAL_EABORTED : DEVAL_EPROTO,
                                        "this connection has no active group", NULL, 0, NULL, 0, 0,
                                        0);
                        return true;
                }
                if (m.grow.device) {
                        DevArena da;
                        int r = g->device_group ? group_grow_dev_input(g, c->rank, m.grow.size, &da,
                                                                       msg, sizeof(msg))
                                                : DEVAL_EPROTO;
                        if (r < 0) {
                                conn_send_reply(c, r, g->device_group ? msg : "not a device group",
                                                NULL, 0, NULL, 0, 0, 0);
                                return true;
                        }
                        conn_send_reply(c, 0, "", &da.fd, 1, &da.size, 0, 0, DV_REPLY_DEVICE);
                        return true;
                }
                int r = group_grow_input(g, c->rank, m.grow.size, &a, msg, sizeof(msg));
                if (r < 0) {
                        conn_send_reply(c, r, msg, NULL, 0, NULL, 0, 0, 0);
                        return true;
                }
                conn_send_reply(c, 0, "", &a.fd, 1, &a.size, 0, 0, 0);
                return true;
        }
        case DV_MSG_DEV_OUTPUT: {
                Group *g = c->group;
                uint64_t size, gen;
                int fd = g && g->state != DV_GROUP_FORMING && g->device_group
                                 ? group_dev_output_fd(g, c->rank, &size, &gen)
                                 : -1;
                if (fd < 0) {
                        conn_send_reply(c, DEVAL_EPROTO, "this connection has no device group",
                                        NULL, 0, NULL, 0, 0, 0);
                        return true;
                }
                conn_send_reply(c, 0, "", &fd, 1, &size, 0, gen, DV_REPLY_DEVICE);
                return true;
        }
        case DV_MSG_OUTPUT: {
                Group *g = c->group;
                uint64_t size, gen;
                if (!g || g->state == DV_GROUP_FORMING) {
                        conn_send_reply(c, DEVAL_EPROTO, "this connection has no active group",
                                        NULL, 0, NULL, 0, 0, 0);
                        return true;
                }
                int fd = group_output_fd(g, &size, &gen);
                if (fd < 0) {
                        conn_send_reply(c, DEVAL_EABORTED, "the group is closed", NULL, 0, NULL, 0,
                                        0, 0);
                        return true;
                }
                conn_send_reply(c, 0, "", &fd, 1, &size, gen, 0, 0);
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
                        conn_send_reply(c, 0, "", NULL, 0, NULL, 0, 0, 0);
                        return true;
                }
                conn_send_reply(c, 0, "", NULL, 0, NULL, 0, 0, 0);
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
        conn_send_reply(c, DEVAL_EPROTO, "malformed message", NULL, 0, NULL, 0, 0, 0);
        return false;
}

static void accept_conns(Daemon *d) {
        static unsigned refused;
        for (;;) {
                int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EINTR)
                                log_warn("accept: %m");
                        return;
                }
                struct ucred cred;
                socklen_t len = sizeof(cred);
                if (nconns >= MAX_CONNS ||
                    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                        log_warn("refusing a connection: %s",
                                 nconns >= MAX_CONNS ? "too many clients" : "no credentials");
                        close(fd);
                        continue;
                }
                Usage *u = usage_get(d, cred.uid);
                Conn *c = u ? calloc(1, sizeof(*c)) : NULL;
                if (!c) {
                        usage_put(d, u);
                        close(fd);
                        continue;
                }
                if (u->conns >= d->max_user_conns || u->fds + 2 > d->max_user_fds) {
                        /* refused cleanly: the client reads this as the answer to its
                         * first request, then the hang-up */
                        char msg[160];
                        if (u->conns >= d->max_user_conns)
                                snprintf(msg, sizeof(msg),
                                         "uid %u already has %d connections to devald "
                                         "(--max-user-conns)",
                                         (unsigned)cred.uid, u->conns);
                        else
                                snprintf(msg, sizeof(msg),
                                         "uid %u already has devald hold %d descriptors "
                                         "(--max-user-fds)",
                                         (unsigned)cred.uid, u->fds);
                        c->fd = fd;
                        c->pid = cred.pid;
                        conn_send_reply(c, DEVAL_ENOMEM, msg, NULL, 0, NULL, 0, 0, 0);
                        close(fd);
                        free(c);
                        if (refused++ % 1000 == 0)
                                log_warn("pid %d: %s", (int)cred.pid, msg);
                        continue;
                }
                *c = (Conn){.next = d->conns,
                            .d = d,
                            .fd = fd,
                            .pidfd = -1,
                            .pid = cred.pid,
                            .uid = cred.uid,
                            .usage = u,
                            .rank = -1};
                struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
                if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
                        close(fd);
                        free(c);
                        usage_put(d, u);
                        continue;
                }
                /*
                 * The socket alone can outlive its process: a child forked after the join
                 * (a DataLoader worker, say) inherits it. Watch the process itself too
                 * (pidfd, Linux 5.3); its events carry the Conn pointer with bit 0 set.
                 */
                c->pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
                if (c->pidfd >= 0) {
                        struct epoll_event pev = {.events = EPOLLIN,
                                                  .data.u64 = (uint64_t)(uintptr_t)c | 1};
                        if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, c->pidfd, &pev) < 0) {
                                close(c->pidfd);
                                c->pidfd = -1;
                        }
                }
                d->conns = c;
                u->conns++;
                u->fds += 2; /* the socket and the pidfd */
                nconns++;
        }
}

/*
 * Socket activation (sd_listen_fds(3) in a few lines): with LISTEN_PID our pid and
 * LISTEN_FDS=1, fd 3 is a listening socket that systemd made from devald.socket.
 * Return: 1 when it was taken, 0 when there is none, -1 when it is unusable.
 */
static int listen_inherited(Daemon *d) {
        const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
        int type = 0;
        socklen_t len = sizeof(type);
        struct sockaddr_un sa;
        socklen_t salen = sizeof(sa);

        if (!pid || !fds || strtol(pid, NULL, 10) != getpid())
                return 0;
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        if (strcmp(fds, "1") != 0) {
                log_err("systemd passed %s sockets; devald takes exactly one", fds);
                return -1;
        }
        if (getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET ||
            getsockname(3, (struct sockaddr *)&sa, &salen) < 0 || sa.sun_family != AF_UNIX) {
                log_err("the socket systemd passed is not a SOCK_SEQPACKET Unix socket "
                        "(ListenSequentialPacket= in devald.socket)");
                return -1;
        }
        fcntl(3, F_SETFD, FD_CLOEXEC);
        fcntl(3, F_SETFL, fcntl(3, F_GETFL) | O_NONBLOCK);
        d->listen_fd = 3;
        d->socket_activated = true;
        if (salen > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0])
                snprintf(d->socket_path, sizeof(d->socket_path), "%s", sa.sun_path);
        return 1;
}

static int listen_on(Daemon *d) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        char dir[sizeof(d->socket_path)];

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->socket_path);
        snprintf(dir, sizeof(dir), "%s", d->socket_path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                        log_err("cannot create %s: %m", dir);
                        return -1;
                }
        }
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
                log_err("socket: %m");
                return -1;
        }
        /* a socket file left by a devald that died is stale: nobody answers on it */
        int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
                log_err("another devald already listens on %s", d->socket_path);
                close(probe);
                close(fd);
                return -1;
        }
        if (probe >= 0)
                close(probe);
        unlink(d->socket_path);
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
                log_err("cannot listen on %s: %m", d->socket_path);
                close(fd);
                return -1;
        }
        /* every user may connect (as devald.socket's SocketMode=0666 says): each group is
         * kept to the uid that made it */
        if (chmod(d->socket_path, 0666) < 0)
                log_warn("cannot open %s to every user: %m", d->socket_path);
        d->listen_fd = fd;
        return 0;
}

#define DEFAULT_CONFIG "/etc/deval/devald.conf"

static void help(void) {
        printf("Usage: devald [OPTIONS]\n\n"
               "The deval daemon: shared buffers and collectives for distributed evaluation.\n\n"
               "  -s --socket=PATH          listen on PATH (default: $DEVAL_SOCKET, else\n"
               "                            $XDG_RUNTIME_DIR/deval/devald.sock, or\n"
               "                            /run/deval/devald.sock for root)\n"
               "  -b --backend=NAME         auto (default: cuda when a GPU is visible, else "
               "host),\n"
               "                            host, or cuda (device groups on the GPUs)\n"
               "  -l --log-level=LEVEL      err, warn, info (default) or debug\n"
               "     --max-group-bytes=N    shared memory one group may hold (default: a quarter\n"
               "                            of RAM); suffixes K, M, G\n"
               "     --max-groups=N         groups at once (default 1024)\n"
               "     --threads=N            copy threads per group (default: online CPUs, max 8)\n"
               "     --spin-us=N            busy-wait N us for arrivals before sleeping (default:\n"
               "                            20 when the cores outnumber a group's ranks + 1, else "
               "0)\n"
               "     --max-user-bytes=N     shared memory all of one uid's groups may hold\n"
               "                            (default: half of RAM)\n"
               "     --max-user-groups=N    groups one uid may have (default 64)\n"
               "     --max-user-conns=N     connections one uid may have (default 1024)\n"
               "     --max-user-fds=N       descriptors devald may hold for one uid (default\n"
               "                            4096)\n"
               "     --max-world=N          ranks per group (default 512)\n"
               "     --idle-timeout=SECONDS fail groups with no collective this long (default\n"
               "                            86400; 0: never)\n"
               "     --exit-idle=SECONDS    exit after this long with no group and no client\n"
               "                            (default 0: never; a devald libdeval starts: 60)\n"
               "     --config=PATH          options from PATH, one 'option = value' per line,\n"
               "                            before the command line's (default:\n"
               "                            " DEFAULT_CONFIG " if it exists; '' for none);\n"
               "                            SIGHUP reads it again\n"
               "  -h --help                 show this help\n"
               "     --version              show the version\n");
}

static int parse_size(const char *s, uint64_t *ret) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *s == '-')
                return -1;
        uint64_t mul = 1;
        switch (*end) {
        case 'K':
        case 'k':
                mul = 1ull << 10;
                end++;
                break;
        case 'M':
        case 'm':
                mul = 1ull << 20;
                end++;
                break;
        case 'G':
        case 'g':
                mul = 1ull << 30;
                end++;
                break;
        }
        if (*end || v > UINT64_MAX / mul)
                return -1;
        *ret = v * mul;
        return 0;
}

static char arg_backend[8] = "auto";

/*
 * The cuda backend: the GPUs devald sees, by UUID (ranks name theirs by UUID, since their
 * ordinals depend on their CUDA_VISIBLE_DEVICES). auto falls back to host without a GPU.
 * Return: 0, or -1 after saying why.
 */
static int setup_backend(Daemon *d) {
        if (strcmp(arg_backend, "host") == 0)
                return 0;
        const DvGpuApi *gpu = dv_gpu();
        int n = 0;
        if (gpu->init() < 0 || gpu->device_count(&n) < 0 || n < 1) {
                if (strcmp(arg_backend, "auto") == 0) {
                        log_info("backend auto: no GPU (%s), so host",
                                 n < 1 && !dv_gpu_error()[0] ? "none visible" : dv_gpu_error());
                        return 0;
                }
                log_err("backend cuda: %s",
                        n < 1 && !dv_gpu_error()[0] ? "no GPU visible" : dv_gpu_error());
                return -1;
        }
        d->ngpus = DV_MIN(n, DV_MAX_GPUS);
        for (int k = 0; k < d->ngpus; k++)
                if (gpu->device_uuid(k, d->gpu_uuid[k]) < 0) {
                        log_err("backend cuda: %s", dv_gpu_error());
                        return -1;
                }
        if (gpuw_start(d->ngpus) < 0)
                return -1;
        d->gpu = gpu;
        log_info("backend cuda (%s driver): %d GPU%s", gpu->name, d->ngpus,
                 d->ngpus == 1 ? "" : "s");
        return 0;
}

/*
 * The configuration file: "option = value" lines, one per line, for any long option but
 * --config itself; blank lines and lines starting with '#' are skipped. Each line becomes
 * the argument "--option=value" ahead of the command line's, so the command line wins.
 * Return: 0 with *ret_args (malloc'd, each malloc'd) and *ret_n, or -1 after saying where
 * the file is wrong. A missing file is no error unless required.
 */
static int config_read(const char *path, bool required, const struct option *opts, char ***ret_args,
                       int *ret_n) {
        *ret_args = NULL;
        *ret_n = 0;
        FILE *f = fopen(path, "re");
        if (!f) {
                if (!required && errno == ENOENT)
                        return 0;
                fprintf(stderr, "devald: cannot read %s: %s\n", path, strerror(errno));
                return -1;
        }
        char line[1024];
        int lineno = 0, r = 0;
        while (r == 0 && fgets(line, sizeof(line), f)) {
                lineno++;
                char *p = line + strspn(line, " \t");
                p[strcspn(p, "\r\n")] = '\0';
                if (!*p || *p == '#')
                        continue;
                char *eq = strchr(p, '=');
                size_t klen = eq ? strcspn(p, " \t=") : strlen(p);
                const char *v = eq ? eq + 1 + strspn(eq + 1, " \t") : NULL;
                bool known = false;
                for (const struct option *o = opts; o->name && !known; o++)
                        known = strlen(o->name) == klen && strncmp(o->name, p, klen) == 0 &&
                                o->has_arg == required_argument && strcmp(o->name, "config");
                if (!eq || !known || !*v) {
                        fprintf(stderr, "devald: %s:%d: %s\n", path, lineno,
                                !eq      ? "expected 'option = value'"
                                : !known ? "unknown option"
                                         : "the value is missing");
                        r = -1;
                        break;
                }
                size_t vlen = strlen(v);
                while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
                        vlen--;
                char *arg = NULL;
                char **grown = realloc(*ret_args, sizeof(char *) * (size_t)(*ret_n + 1));
                if (!grown || asprintf(&arg, "--%.*s=%.*s", (int)klen, p, (int)vlen, v) < 0) {
                        if (grown)
                                *ret_args = grown;
                        r = -1;
                        break;
                }
                *ret_args = grown;
                (*ret_args)[(*ret_n)++] = arg;
        }
        fclose(f);
        if (r < 0) {
                for (int i = 0; i < *ret_n; i++)
                        free((*ret_args)[i]);
                free(*ret_args);
                *ret_args = NULL;
                *ret_n = 0;
        }
        return r;
}

/* The configuration's arguments and the argument vector built around them. */
typedef struct {
        char **args;
        int n;
        char **all;
} ArgVec;

static void argvec_free(ArgVec *v) {
        for (int i = 0; i < v->n; i++)
                free(v->args[i]);
        free(v->args);
        free(v->all);
}

static int parse_args(Daemon *d, int argc, char **argv) {
        enum {
                ARG_MAX_GROUP_BYTES = 0x100,
                ARG_MAX_GROUPS,
                ARG_THREADS,
                ARG_SPIN_US,
                ARG_MAX_USER_BYTES,
                ARG_MAX_USER_GROUPS,
                ARG_MAX_USER_CONNS,
                ARG_MAX_USER_FDS,
                ARG_MAX_WORLD,
                ARG_IDLE_TIMEOUT,
                ARG_EXIT_IDLE,
                ARG_CONFIG,
                ARG_VERSION
        };
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"backend", required_argument, NULL, 'b'},
                {"log-level", required_argument, NULL, 'l'},
                {"max-group-bytes", required_argument, NULL, ARG_MAX_GROUP_BYTES},
                {"max-groups", required_argument, NULL, ARG_MAX_GROUPS},
                {"threads", required_argument, NULL, ARG_THREADS},
                {"spin-us", required_argument, NULL, ARG_SPIN_US},
                {"max-user-bytes", required_argument, NULL, ARG_MAX_USER_BYTES},
                {"max-user-groups", required_argument, NULL, ARG_MAX_USER_GROUPS},
                {"max-user-conns", required_argument, NULL, ARG_MAX_USER_CONNS},
                {"max-user-fds", required_argument, NULL, ARG_MAX_USER_FDS},
                {"max-world", required_argument, NULL, ARG_MAX_WORLD},
                {"idle-timeout", required_argument, NULL, ARG_IDLE_TIMEOUT},
                {"exit-idle", required_argument, NULL, ARG_EXIT_IDLE},
                {"config", required_argument, NULL, ARG_CONFIG},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, ARG_VERSION},
                {},
        };
        int c, level = LOG_LEVEL_INFO;

        /* --config first: its lines go ahead of the command line's options */
        const char *config = NULL;
        for (int i = 1; i < argc; i++) {
                if (strncmp(argv[i], "--config=", 9) == 0)
                        config = argv[i] + 9;
                else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
                        config = argv[++i];
                else if (strcmp(argv[i], "--") == 0)
                        break;
        }
        _cleanup_(argvec_free) ArgVec av = {0};
        /* --config '' reads none; without --config the default is read if it exists */
        if (!(config && !*config) && config_read(config ? config : DEFAULT_CONFIG, config != NULL,
                                                 opts, &av.args, &av.n) < 0)
                return 2;
        snprintf(d->config_path, sizeof(d->config_path), "%s",
                 config ? config
                 : av.n ? DEFAULT_CONFIG
                        : "");
        if (!(av.all = calloc((size_t)(argc + av.n + 1), sizeof(char *))))
                return 1;
        av.all[0] = argv[0];
        if (av.n) /* memcpy() from NULL is undefined even for no bytes */
                memcpy(av.all + 1, av.args, sizeof(char *) * (size_t)av.n);
        memcpy(av.all + 1 + av.n, argv + 1, sizeof(char *) * (size_t)(argc - 1));
        argc += av.n;
        argv = av.all;
        optind = 0; /* a fresh scan, also when SIGHUP parses again */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

        d->max_group_bytes =
                pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : 1ull << 30;
        d->max_groups = 1024;
        d->max_user_bytes =
                pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 2ull << 30;
        d->max_user_groups = 64;
        d->max_user_conns = 1024;
        d->max_user_fds = 4096;
        d->max_world = DEVAL_MAX_WORLD;
        d->idle_timeout_s = 24 * 3600;
        d->spin_us = -1;
        d->threads = (int)DV_MIN(DV_MAX(ncpu, 1), 8);
        if (dv_default_socket_path(d->socket_path, sizeof(d->socket_path)) < 0)
                d->socket_path[0] = '\0';
        while ((c = getopt_long(argc, argv, "s:b:l:h", opts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        if (strlen(optarg) >= sizeof(d->socket_path)) {
                                fprintf(stderr, "devald: socket path too long: %s\n", optarg);
                                return 2;
                        }
                        snprintf(d->socket_path, sizeof(d->socket_path), "%s", optarg);
                        break;
                case 'b':
                        if (strcmp(optarg, "host") && strcmp(optarg, "auto") &&
                            strcmp(optarg, "cuda")) {
                                fprintf(stderr, "devald: unknown backend '%s' (host, cuda, auto)\n",
                                        optarg);
                                return 2;
                        }
                        snprintf(arg_backend, sizeof(arg_backend), "%s", optarg);
                        break;
                case 'l':
                        if ((level = log_parse_level(optarg)) < 0) {
                                fprintf(stderr, "devald: unknown log level '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case ARG_MAX_GROUP_BYTES:
                        if (parse_size(optarg, &d->max_group_bytes) < 0 || !d->max_group_bytes) {
                                fprintf(stderr, "devald: bad --max-group-bytes '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case ARG_MAX_GROUPS:
                        d->max_groups = atoi(optarg);
                        if (d->max_groups < 1) {
                                fprintf(stderr, "devald: bad --max-groups '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case ARG_MAX_USER_BYTES:
                        if (parse_size(optarg, &d->max_user_bytes) < 0 || !d->max_user_bytes) {
                                fprintf(stderr, "devald: bad --max-user-bytes '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case ARG_MAX_USER_GROUPS:
                case ARG_MAX_USER_CONNS:
                case ARG_MAX_USER_FDS:
                case ARG_MAX_WORLD:
                case ARG_IDLE_TIMEOUT:
                case ARG_EXIT_IDLE: {
                        char *end;
                        long v = strtol(optarg, &end, 10);
                        int lo = c == ARG_IDLE_TIMEOUT || c == ARG_EXIT_IDLE ? 0 : 1;
                        long hi = c == ARG_MAX_WORLD ? DEVAL_MAX_WORLD : 1000000000;
                        if (*end || end == optarg || v < lo || v > hi) {
                                fprintf(stderr, "devald: bad --%s '%s' (%d..%ld)\n",
                                        c == ARG_MAX_USER_GROUPS  ? "max-user-groups"
                                        : c == ARG_MAX_USER_CONNS ? "max-user-conns"
                                        : c == ARG_MAX_USER_FDS   ? "max-user-fds"
                                        : c == ARG_MAX_WORLD      ? "max-world"
                                        : c == ARG_EXIT_IDLE      ? "exit-idle"
                                                                  : "idle-timeout",
                                        optarg, lo, hi);
                                return 2;
                        }
                        *(c == ARG_MAX_USER_GROUPS  ? &d->max_user_groups
                          : c == ARG_MAX_USER_CONNS ? &d->max_user_conns
                          : c == ARG_MAX_USER_FDS   ? &d->max_user_fds
                          : c == ARG_MAX_WORLD      ? &d->max_world
                          : c == ARG_EXIT_IDLE      ? &d->exit_idle_s
                                                    : &d->idle_timeout_s) = (int)v;
                        break;
                }
                case ARG_THREADS:
                        d->threads = atoi(optarg);
                        if (d->threads < 1 || d->threads > 64) {
                                fprintf(stderr, "devald: bad --threads '%s' (1..64)\n", optarg);
                                return 2;
                        }
                        break;
                case ARG_SPIN_US:
                        d->spin_us = atoi(optarg);
                        if (d->spin_us < 0 || d->spin_us > 10000) {
                                fprintf(stderr, "devald: bad --spin-us '%s' (0..10000)\n", optarg);
                                return 2;
                        }
                        break;
                case ARG_CONFIG:
                        break; /* read above */
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("devald %s\n", DV_VERSION_STRING);
                        return 0;
                default:
                        return 2;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "devald: unexpected argument '%s'\n", argv[optind]);
                return 2;
        }
        if (!d->socket_path[0]) {
                fprintf(stderr, "devald: the default socket path is too long; use --socket\n");
                return 2;
        }
        log_setup(level);
        return -1;
}

/*
 * SIGHUP: read the configuration and the command line again and take what can change while
 * running: log level, quotas, limits, copy threads and spinning (for groups that form from
 * now on; running groups keep what they started with). The socket and the backend take a
 * restart, and say so. A configuration with errors changes nothing.
 */
static void reload(Daemon *d, int argc, char **argv) {
        Daemon fresh = {0};
        char backend[sizeof(arg_backend)];
        memcpy(backend, arg_backend, sizeof(backend));
        notify("RELOADING=1");
        int r = parse_args(&fresh, argc, argv);
        if (r >= 0) {
                log_err("SIGHUP: %s or the command line has errors (above); nothing changed",
                        d->config_path[0] ? d->config_path : "the configuration");
                memcpy(arg_backend, backend, sizeof(backend));
                notify("READY=1");
                return;
        }
        if (strcmp(fresh.socket_path, d->socket_path) != 0)
                log_warn("SIGHUP: the socket is now %s, which takes a restart; still %s",
                         fresh.socket_path, d->socket_path);
        if (strcmp(arg_backend, backend) != 0)
                log_warn("SIGHUP: the backend is now %s, which takes a restart; still %s",
                         arg_backend, backend);
        memcpy(arg_backend, backend, sizeof(backend));
        d->max_group_bytes = fresh.max_group_bytes;
        d->max_groups = fresh.max_groups;
        d->max_user_bytes = fresh.max_user_bytes;
        d->max_user_groups = fresh.max_user_groups;
        d->max_user_conns = fresh.max_user_conns;
        d->max_user_fds = fresh.max_user_fds;
        d->max_world = fresh.max_world;
        d->idle_timeout_s = fresh.idle_timeout_s;
        d->exit_idle_s = fresh.exit_idle_s;
        d->threads = fresh.threads;
        d->spin_us = fresh.spin_us;
        memcpy(d->config_path, fresh.config_path, sizeof(d->config_path));
        log_info("SIGHUP: reloaded%s%s: quota %" PRIu64 " bytes per group, %" PRIu64
                 " per user, %d groups, %d per user, %d connections per user, %d ranks per "
                 "group, idle timeout %d s, %d copy threads",
                 d->config_path[0] ? " " : "", d->config_path, d->max_group_bytes,
                 d->max_user_bytes, d->max_groups, d->max_user_groups, d->max_user_conns,
                 d->max_world, d->idle_timeout_s, d->threads);
        notify("READY=1");
}

/*
 * --exit-idle: a devald that nobody uses (no group, no client) for that long exits, as one
 * that libdeval started for a user does, so that it neither lingers nor needs stopping.
 * Return: true when it is time to exit; else *next_ns is lowered to when it may be.
 */
static bool exit_when_idle(Daemon *d, uint64_t now, int64_t *next_ns) {
        if (d->exit_idle_s <= 0 || d->ngroups > 0 || d->conns) {
                d->idle_since_ns = 0;
                return false;
        }
        if (!d->idle_since_ns)
                d->idle_since_ns = now;
        uint64_t limit = (uint64_t)d->exit_idle_s * 1000000000ull;
        if (now - d->idle_since_ns >= limit) {
                log_info("no group and no client for %d s: exiting", d->exit_idle_s);
                return true;
        }
        int64_t left = (int64_t)(d->idle_since_ns + limit - now);
        if (*next_ns < 0 || left < *next_ns)
                *next_ns = left;
        return false;
}

int main(int argc, char **argv) {
        Daemon d = {.epfd = -1, .listen_fd = -1, .signal_fd = -1};
        /* devald --gpu-worker N [--no-p2p]: one GPU's worker process (gpu_worker.h), on fd 3 */
        if (argc >= 3 && strcmp(argv[1], "--gpu-worker") == 0) {
                log_setup(LOG_LEVEL_INFO);
                return gpuw_main(3, atoi(argv[2]), argc >= 4 && strcmp(argv[3], "--no-p2p") == 0);
        }
        int r = parse_args(&d, argc, argv);
        if (r >= 0)
                return r;
        topo_setup();

        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGHUP);
        sigprocmask(SIG_BLOCK, &mask, NULL);
        signal(SIGPIPE, SIG_IGN);
        d.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        d.epfd = epoll_create1(EPOLL_CLOEXEC);
        if (d.signal_fd < 0 || d.epfd < 0) {
                log_err("cannot set up the event loop: %m");
                return 1;
        }
        if (setup_backend(&d) < 0)
                return 1;
        int inherited = listen_inherited(&d);
        if (inherited < 0 || (inherited == 0 && listen_on(&d) < 0))
                return 1;
        const char *wd = getenv("WATCHDOG_USEC"), *wd_pid = getenv("WATCHDOG_PID");
        if (wd && (!wd_pid || strtol(wd_pid, NULL, 10) == getpid()))
                d.watchdog_ns = strtoull(wd, NULL, 10) * 1000;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &d.listen_fd};
        epoll_ctl(d.epfd, EPOLL_CTL_ADD, d.listen_fd, &ev);
        ev.data.ptr = &d.signal_fd;
        epoll_ctl(d.epfd, EPOLL_CTL_ADD, d.signal_fd, &ev);
        d.start_ns = dv_now_ns();
        log_info("listening on %s%s (backend %s, %d copy threads, quota %" PRIu64
                 " bytes per group)",
                 d.socket_path, d.socket_activated ? " (from systemd)" : "",
                 d.gpu ? "cuda" : "host", d.threads, d.max_group_bytes);
        notify("READY=1\nSTATUS=listening, no groups");
        int last_groups = 0;

        while (!d.stopping) {
                struct epoll_event evs[64];
                int64_t next_ns = -1;
                conns_expire(&d, dv_now_ns(), &next_ns);
                group_expire_joins(&d, dv_now_ns(), &next_ns);
                group_expire_idle(&d, dv_now_ns(), &next_ns);
                if (exit_when_idle(&d, dv_now_ns(), &next_ns))
                        break;
                if (d.watchdog_ns) { /* keep-alive at half the watchdog interval */
                        uint64_t now = dv_now_ns(), half = d.watchdog_ns / 2;
                        if (now - d.watchdog_last >= half) {
                                notify("WATCHDOG=1");
                                d.watchdog_last = now;
                        }
                        int64_t left = (int64_t)(d.watchdog_last + half - now);
                        if (next_ns < 0 || left < next_ns)
                                next_ns = left < 0 ? 0 : left;
                }
                if (d.ngroups != last_groups) {
                        char status[64];
                        snprintf(status, sizeof(status), "STATUS=listening, %d group%s", d.ngroups,
                                 d.ngroups == 1 ? "" : "s");
                        notify(status);
                        last_groups = d.ngroups;
                }
                int timeout = next_ns < 0 ? -1 : (int)(next_ns / 1000000 + 1);
                int n = epoll_wait(d.epfd, evs, 64, timeout);
                if (n < 0 && errno != EINTR) {
                        log_err("epoll_wait: %m");
                        break;
                }
                for (int i = 0; i < n; i++) {
                        void *p = evs[i].data.ptr;
                        if (p == &d.listen_fd) {
                                accept_conns(&d);
                        } else if (p == &d.signal_fd) {
                                struct signalfd_siginfo si;
                                if (read(d.signal_fd, &si, sizeof(si)) != sizeof(si))
                                        continue;
                                if (si.ssi_signo == SIGHUP) {
                                        reload(&d, argc, argv);
                                        continue;
                                }
                                log_info("signal %u: stopping", si.ssi_signo);
                                d.stopping = true;
                        } else if (evs[i].data.u64 & 1) {
                                Conn *c = (Conn *)(uintptr_t)(evs[i].data.u64 & ~(uint64_t)1);
                                if (c->fd >= 0) {
                                        log_debug("pid %d exited", (int)c->pid);
                                        conn_close(&d, c);
                                }
                        } else {
                                Conn *c = p;
                                bool keep = true;
                                if (c->fd < 0)
                                        continue;
                                if (evs[i].events & EPOLLIN)
                                        keep = conn_handle(&d, c);
                                if (!keep || (evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP) &&
                                              !(evs[i].events & EPOLLIN)))
                                        conn_hangup(&d, c);
                        }
                }
                conns_reap(&d);
        }

        notify("STOPPING=1");
        group_stop_all(&d, DEVAL_EDAEMON, "devald is shutting down");
        while (d.conns) {
                Conn *c = d.conns;
                if (c->group)
                        c->group->state = DV_GROUP_CLOSING;
                conn_close(&d, c);
        }
        conns_reap(&d);
        while (d.groups) { /* only groups no connection held are left; free them */
                for (int k = 0; k < d.groups->world; k++)
                        d.groups->members[k].conn = NULL;
                group_maybe_free(d.groups);
        }
        if (d.gpu)
                gpuw_stop();
        if (!d.socket_activated) /* systemd owns an activated socket's file */
                unlink(d.socket_path);
        close(d.listen_fd);
        close(d.signal_fd);
        close(d.epfd);
        log_info("stopped");
        return 0;
}
