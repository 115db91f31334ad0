/* SPDX-License-Identifier: MIT */
/*
 * handle.c - what every part of libdeval does with a group handle (handle.h): record why a
 * call failed, send devald a control message and wait for its reply, see that devald is
 * still there, tell the process that joined from a forked child, and read an options
 * struct by its size. The handle's public getters live here too.
 */
#define _GNU_SOURCE
#include "handle.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sock.h"
#include "tunables.h"
#include "util.h"

/* deval_errmsg(NULL): why this thread's last deval_join failed. */
static __thread char join_errmsg[DV_MSG_MAX + 128];

/*
 * Forks seen by this process's copy of libdeval: a collective checks that it runs in the
 * process that joined without a getpid() system call each time.
 */
static _Atomic unsigned forks;

static void forked_child(void) {
        atomic_fetch_add_explicit(&forks, 1, memory_order_relaxed);
}

__attribute__((constructor)) static void watch_forks(void) {
        pthread_atfork(NULL, NULL, forked_child);
}

unsigned dv_forks(void) {
        return atomic_load_explicit(&forks, memory_order_relaxed);
}

/*
 * dv_opts_copy() - an options struct that begins with its size, into known (its layout in
 * this libdeval, of known_size bytes): a size of 0 is an uninitialised struct; a smaller one
 * an older layout (the missing fields stay 0: there is none yet); a larger one a newer
 * deval.h, accepted when the fields this libdeval does not know are all 0.
 * Return: 0, or -1 with why.
 */
int dv_opts_copy(void *known, size_t known_size, const void *opts, uint32_t size, const char *what,
                 char *why, size_t len) {
        const unsigned char *p = opts;
        if (size == 0 || size > 4096 || size < sizeof(uint32_t)) {
                snprintf(why, len,
                         "%s.size is %u; initialise the options with %s, which sets it to "
                         "sizeof(%s)",
                         what, size,
                         strcmp(what, "deval_join_opts") == 0 ? "DEVAL_JOIN_OPTS_INIT"
                                                              : "DEVAL_GATHER_OPTS_INIT",
                         what);
                return -1;
        }
        for (uint32_t i = (uint32_t)known_size; i < size; i++)
                if (p[i]) {
                        snprintf(why, len,
                                 "%s comes from a newer deval.h (%u bytes, this libdeval %s "
                                 "knows %zu) and sets a field this libdeval does not have",
                                 what, size, deval_version(), known_size);
                        return -1;
                }
        memset(known, 0, known_size);
        memcpy(known, opts, DV_MIN((size_t)size, known_size));
        return 0;
}

const char *deval_version(void) {
        return DV_VERSION_STRING;
}

const char *deval_errmsg(const deval_group *g) {
        return g ? g->errmsg : join_errmsg;
}

int deval_rank(const deval_group *g) {
        return g ? g->rank : DEVAL_EINVAL;
}

int deval_world_size(const deval_group *g) {
        return g ? g->world : DEVAL_EINVAL;
}

/** deval_group_name() - the group's name (the one deval_join() derived, when it was NULL). */
const char *deval_group_name(const deval_group *g) {
        return g ? g->name : NULL;
}

static int vset_err(char *buf, size_t len, bool debug, int status, const char *fmt, va_list ap)
        __attribute__((format(printf, 5, 0)));
static int vset_err(char *buf, size_t len, bool debug, int status, const char *fmt, va_list ap) {
        vsnprintf(buf, len, fmt, ap);
        if (debug)
                fprintf(stderr, "deval: %s: %s\n", deval_strerror(status), buf);
        return status;
}

/**
 * dv_set_err() - record why a call on g failed. Return: status, for tail calls.
 */
int dv_set_err(deval_group *g, int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vset_err(g->errmsg, sizeof(g->errmsg), g->debug, status, fmt, ap);
        va_end(ap);
        return status;
}

/** dv_dv_join_err() - record why a join failed, for deval_errmsg(NULL). Return: status. */
int dv_join_err(int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        bool set;
        uint64_t debug = 0;
        char why[128];
        dv_tunable_read(DV_TUN_DEBUG, &set, &debug, why, sizeof(why)); /* a flag: never fails */
        vset_err(join_errmsg, sizeof(join_errmsg), set && debug, status, fmt, ap);
        va_end(ap);
        return status;
}

/* Wait up to timeout_ms (< 0: forever) for a reply; fds are closed if the status is bad. */
int dv_recv_reply(int sock, int timeout_ms, DvReply *rep, int *fds, int *nfds) {
        struct pollfd p = {.fd = sock, .events = POLLIN};
        int r;
        do
                r = poll(&p, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        if (r == 0)
                return DEVAL_ETIMEDOUT;
        ssize_t n = dv_recv_msg(sock, rep, sizeof(*rep), fds, nfds, 0);
        /*
         * devald that refuses a connection (a quota) answers and closes at once, before
         * reading what the client sent; the kernel then reports the reset ahead of the
         * answer still queued here. Read the answer.
         */
        if (n == -ECONNRESET)
                n = dv_recv_msg(sock, rep, sizeof(*rep), fds, nfds, MSG_DONTWAIT);
        if (n == 0 || n == -ECONNRESET || n == -EAGAIN)
                return DEVAL_EDAEMON;
        if (n < 0 || (size_t)n != sizeof(*rep) || rep->hdr.version != DV_PROTO_VERSION ||
            rep->hdr.type != DV_MSG_REPLY) {
                if (n > 0)
                        for (int i = 0; i < *nfds; i++)
                                close(fds[i]);
                return DEVAL_EPROTO;
        }
        rep->msg[sizeof(rep->msg) - 1] = '\0';
        if ((uint32_t)*nfds != rep->nfds) {
                for (int i = 0; i < *nfds; i++)
                        close(fds[i]);
                return DEVAL_EPROTO;
        }
        return 0;
}

/**
 * dv_request() - send a control message and wait for devald's reply.
 * @fds: room for DV_MAX_FDS received descriptors; *nfds holds how many arrived.
 * Return: 0 with *rep filled (rep->status may still be a failure), or DEVAL_EDAEMON /
 * DEVAL_EPROTO / DEVAL_ETIMEDOUT with g's message set.
 */
int dv_request(deval_group *g, const void *req, size_t len, DvReply *rep, int *fds, int *nfds) {
        ssize_t n = dv_send_msg(g->sock, req, len, NULL, 0, 0);
        if (n < 0)
                return dv_set_err(g, DEVAL_EDAEMON, "devald at %s is gone: %s", g->socket_path,
                                  strerror((int)-n));
        *nfds = DV_MAX_FDS;
        int r = dv_recv_reply(g->sock, g->timeout_ms < 0 ? -1 : g->timeout_ms + REPLY_GRACE_MS, rep,
                              fds, nfds);
        if (r == DEVAL_EDAEMON)
                return dv_set_err(g, r, "devald at %s is gone", g->socket_path);
        if (r < 0)
                return dv_set_err(g, r, "devald at %s did not answer properly (%s)", g->socket_path,
                                  deval_strerror(r));
        return 0;
}

/* Is devald still there? Its hang-up (or any unexpected message) means it is gone. */
bool dv_daemon_alive(const deval_group *g) {
        struct pollfd p = {.fd = g->sock, .events = POLLIN | POLLRDHUP};
        return poll(&p, 1, 0) == 0;
}
