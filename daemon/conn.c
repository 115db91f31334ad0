/* SPDX-License-Identifier: MIT */
/*
 * conn.c - client connections: accepting them (credentials, per-user limits, the pidfd that
 * tells of the process's end), answering them, and closing them, at once or, for a group
 * member that hung up, once its process has ended.
 */
#define _GNU_SOURCE
#include "conn.h"

#include <poll.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "daemon.h"
#include "group.h"
#include "log.h"
#include "reply.h"
#include "usage.h"
#include "util.h"

#define MAX_CONNS 4096

static int nconns;

/*
 * Close c: its group learns the member is gone, its descriptors close, and the Conn itself
 * waits on d->closed until the current batch of events is done, since a later event of the
 * same batch may still point at it.
 */
void conn_close(Daemon *d, Conn *c) {
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
void conn_hangup(Daemon *d, Conn *c) {
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
void conns_expire(Daemon *d, uint64_t now, int64_t *next_ns) {
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

void conns_reap(Daemon *d) {
        while (d->closed) {
                Conn *c = d->closed;
                d->closed = c->next;
                free(c);
        }
}

void conns_accept(Daemon *d) {
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
                        conn_reply(c, DEVAL_ENOMEM, msg);
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
