/* SPDX-License-Identifier: MIT */
/*
 * main.c - devald's main: options, the listening socket, and the epoll loop with a signalfd
 * that drives connections (conn.c, control.c), join deadlines, idle groups and the
 * watchdog. Runs in the foreground and never forks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "backend.h"
#include "config.h"
#include "conn.h"
#include "control.h"
#include "daemon.h"
#include "gpu_jobs.h"
#include "gpu_serve.h"
#include "gpu_worker.h"
#include "group.h"
#include "journals.h"
#include "log.h"
#include "sd_daemon.h"
#include "topo.h"
#include "util.h"

/* Listen on d->socket_path, replacing a stale socket file. 0, or a negative errno with why. */
static int listen_on(Daemon *d, char *why, size_t whylen) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        char dir[sizeof(d->socket_path)];
        int e;

        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->socket_path);
        snprintf(dir, sizeof(dir), "%s", d->socket_path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                        e = errno;
                        snprintf(why, whylen, "cannot create %s: %s", dir, strerror(e));
                        return -e;
                }
        }
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
                e = errno;
                snprintf(why, whylen, "socket: %s", strerror(e));
                return -e;
        }
        /* a socket file left by a devald that died is stale: nobody answers on it */
        int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
                snprintf(why, whylen, "another devald already listens on %s", d->socket_path);
                close(probe);
                close(fd);
                return -EADDRINUSE;
        }
        if (probe >= 0)
                close(probe);
        unlink(d->socket_path);
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
                e = errno;
                snprintf(why, whylen, "cannot listen on %s: %s", d->socket_path, strerror(e));
                close(fd);
                return -e;
        }
        /* every user may connect (as devald.socket's SocketMode=0666 says): each group is
         * kept to the uid that made it */
        if (chmod(d->socket_path, 0666) < 0)
                log_warn("cannot open %s to every user: %m", d->socket_path);
        d->listen_fd = fd;
        return 0;
}

/*
 * --exit-idle: a devald that nobody uses (no group, no client) for that long exits, as one
 * that libdeval started for a user does, so that it neither lingers nor needs stopping.
 * Return: true when it is time to exit; else *next_ns is lowered to when it may be.
 */
static bool exit_when_idle(Daemon *d, uint64_t now, int64_t *next_ns) {
        /* journals in memory alone would be lost: they hold devald until --resume-keep */
        if (d->exit_idle_s <= 0 || d->ngroups > 0 || d->conns || journals_in_memory(d)) {
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
        /* devald --gpu-worker N [--no-p2p]: one GPU's worker process (gpu_serve.h), on fd 3 */
        if (argc >= 3 && strcmp(argv[1], "--gpu-worker") == 0) {
                log_setup(LOG_LEVEL_INFO);
                return gpu_serve_main(3, atoi(argv[2]),
                                      argc >= 4 && strcmp(argv[3], "--no-p2p") == 0);
        }
        int r = config_parse(&d, argc, argv);
        if (r != 0) /* 2: a usage error, as getopt's tools exit */
                return r == CONFIG_DONE ? 0 : r == -EINVAL ? 2 : 1;
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
        char why[512];
        int inherited;
        if (backend_setup(&d, why, sizeof(why)) < 0 || gpu_jobs_init(&d, why, sizeof(why)) < 0 ||
            (inherited = sd_listen_inherited(&d, why, sizeof(why))) < 0 ||
            (inherited == 0 && listen_on(&d, why, sizeof(why)) < 0)) {
                log_err("%s", why);
                return 1;
        }
        const char *wd = getenv("WATCHDOG_USEC"), *wd_pid = getenv("WATCHDOG_PID");
        if (wd && (!wd_pid || strtol(wd_pid, NULL, 10) == getpid()))
                d.watchdog_ns = strtoull(wd, NULL, 10) * 1000;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &d.listen_fd};
        epoll_ctl(d.epfd, EPOLL_CTL_ADD, d.listen_fd, &ev);
        ev.data.ptr = &d.signal_fd;
        epoll_ctl(d.epfd, EPOLL_CTL_ADD, d.signal_fd, &ev);
        d.start_ns = dv_now_ns();
        journals_load(&d);
        log_info("listening on %s%s (backend %s, %d copy threads, quota %" PRIu64
                 " bytes per group)",
                 d.socket_path, d.socket_activated ? " (from systemd)" : "",
                 d.gpu ? "cuda" : "host", d.threads, d.max_group_bytes);
        sd_notify_state("READY=1\nSTATUS=listening, no groups");
        int last_groups = 0;

        while (!d.stopping) {
                struct epoll_event evs[64];
                int64_t next_ns = -1;
                conns_expire(&d, dv_now_ns(), &next_ns);
                group_expire_joins(&d, dv_now_ns(), &next_ns);
                group_expire_idle(&d, dv_now_ns(), &next_ns);
                journals_expire(&d, dv_now_ns(), &next_ns);
                if (exit_when_idle(&d, dv_now_ns(), &next_ns))
                        break;
                if (d.watchdog_ns) { /* keep-alive at half the watchdog interval */
                        uint64_t now = dv_now_ns(), half = d.watchdog_ns / 2;
                        if (now - d.watchdog_last >= half) {
                                sd_notify_state("WATCHDOG=1");
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
                        sd_notify_state(status);
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
                                conns_accept(&d);
                        } else if (p == &d.jobs_fd) {
                                gpu_jobs_finish(&d);
                        } else if (p == &d.signal_fd) {
                                struct signalfd_siginfo si;
                                if (read(d.signal_fd, &si, sizeof(si)) != sizeof(si))
                                        continue;
                                if (si.ssi_signo == SIGHUP) {
                                        config_reload(&d, argc, argv);
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
                                        keep = control_handle(&d, c);
                                if (!keep || (evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP) &&
                                              !(evs[i].events & EPOLLIN)))
                                        conn_hangup(&d, c);
                        }
                }
                conns_reap(&d);
        }

        sd_notify_state("STOPPING=1");
        gpu_jobs_drain(&d); /* groups still starting fail now, and their members hear it */
        group_stop_all(&d, DEVAL_EDAEMON, "devald is shutting down");
        while (d.conns) {
                Conn *c = d.conns;
                if (c->group)
                        c->group->loop.state = DV_GROUP_CLOSING;
                conn_close(&d, c);
        }
        conns_reap(&d);
        while (d.groups) { /* only groups no connection held are left; free them */
                Group *g = d.groups;
                for (int k = 0; k < g->world; k++)
                        g->members[k].conn = NULL;
                group_maybe_free(g);
                if (d.groups == g) /* a job holds it: its done() frees it */
                        gpu_jobs_drain(&d);
        }
        gpu_jobs_drain(&d); /* what the groups' freeing gave back */
        journals_close(&d);
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
