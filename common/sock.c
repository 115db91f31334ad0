/* SPDX-License-Identifier: MIT */
/*
 * sock.c - SOCK_SEQPACKET messages with SCM_RIGHTS, shared by devald, libdeval and the
 * tools. Received descriptors are close-on-exec (MSG_CMSG_CLOEXEC); a message that arrives
 * with more descriptors than asked for has the extras closed, never leaked.
 */
#define _GNU_SOURCE
#include "sock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/**
 * dv_send_msg() - send one message, with nfds descriptors (0..DV_MAX_FDS).
 * Return: bytes sent, or -errno.
 */
ssize_t dv_send_msg(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags) {
        union {
                char buf[CMSG_SPACE(sizeof(int) * DV_MAX_FDS)];
                struct cmsghdr align;
        } ctl;
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

        if (nfds > 0) {
                memset(&ctl, 0, sizeof(ctl));
                mh.msg_control = ctl.buf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
                struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
        }
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
        return n < 0 ? -errno : n;
}

/**
 * dv_recv_msg() - receive one message into buf and up to *nfds descriptors into fds.
 * On return *nfds holds how many arrived. A truncated message is -EMSGSIZE.
 * Return: bytes received (0 when the peer hung up), or -errno.
 */
ssize_t dv_recv_msg(int sock, void *buf, size_t len, int *fds, int *nfds, int flags) {
        int dropped;
        return dv_recv_msg_counted(sock, buf, len, fds, nfds, flags, &dropped);
}

ssize_t dv_recv_msg_counted(int sock, void *buf, size_t len, int *fds, int *nfds, int flags,
                            int *ret_dropped) {
        union {
                char buf[CMSG_SPACE(sizeof(int) * DV_MAX_FDS)];
                struct cmsghdr align;
        } ctl;
        struct iovec iov = {.iov_base = buf, .iov_len = len};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = ctl.buf,
                            .msg_controllen = sizeof(ctl.buf)};
        int want = nfds ? *nfds : 0, got = 0;
        *ret_dropped = 0;

        ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
        if (n < 0)
                return -errno;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                /* the control buffer holds DV_MAX_FDS; the kernel closes any past it */
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                int tmp[DV_MAX_FDS];
                if (k > DV_MAX_FDS)
                        k = DV_MAX_FDS;
                memcpy(tmp, CMSG_DATA(c), sizeof(int) * k);
                for (size_t i = 0; i < k; i++) {
                        if (got < want) {
                                fds[got++] = tmp[i];
                        } else {
                                close(tmp[i]);
                                (*ret_dropped)++;
                        }
                }
        }
        if (nfds)
                *nfds = got;
        if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
                for (int i = 0; i < got; i++)
                        close(fds[i]);
                if (nfds)
                        *nfds = 0;
                return -EMSGSIZE;
        }
        return n;
}

int dv_default_socket_path(char *buf, size_t len) {
        const char *env = secure_getenv("DEVAL_SOCKET");
        int n;

        if (env && *env)
                n = snprintf(buf, len, "%s", env);
        else if (geteuid() != 0) /* a user's own devald */
                return dv_user_socket_path(buf, len);
        else
                n = snprintf(buf, len, "%s", DV_SYSTEM_SOCKET);
        return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int dv_user_socket_path(char *buf, size_t len) {
        const char *xdg = secure_getenv("XDG_RUNTIME_DIR");
        int n;

        if (xdg && *xdg)
                n = snprintf(buf, len, "%s/deval/devald.sock", xdg);
        else
                n = snprintf(buf, len, "/tmp/deval-%u/devald.sock", (unsigned)geteuid());
        return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

bool dv_socket_answers(const char *path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof(sa.sun_path))
                return false;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return false;
        bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        close(fd);
        return ok;
}

/**
 * dv_client_socket_path() - the socket a client uses. A path the caller names, or
 * $DEVAL_SOCKET, is used as it is; otherwise a system devald wins when it answers, and this
 * user's own socket (where libdeval may start a private devald) is the rest.
 * Return: 0, or -ENAMETOOLONG.
 */
int dv_client_socket_path(const char *path, char *buf, size_t len, bool *ret_explicit) {
        const char *env = secure_getenv("DEVAL_SOCKET");
        int n;

        if ((path && *path) || (env && *env)) {
                *ret_explicit = true;
                n = snprintf(buf, len, "%s", path && *path ? path : env);
                return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
        }
        *ret_explicit = false;
        if (dv_socket_answers(DV_SYSTEM_SOCKET)) {
                n = snprintf(buf, len, "%s", DV_SYSTEM_SOCKET);
                return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
        }
        return dv_user_socket_path(buf, len);
}
