/* SPDX-License-Identifier: MIT */
/*
 * gpu_proto.c - the transport between devald and its GPU worker processes (gpu_proto.h):
 * whole records over a stream socket, with a descriptor riding on a record's first byte, and
 * the growing arrays in which either side keeps what the other has mapped.
 */
#define _GNU_SOURCE
#include "gpu_proto.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "deval.h"

#include "gpu.h"
#include "util.h"

/**
 * gpu_proto_send() - write all of iov[0..n) on sock, with fd (if >= 0) on the first byte.
 * @sock: a stream socket to the other side
 * @iov: what to write; advanced in place as it goes out
 * @n: how many entries iov has
 * @fd: a descriptor to pass (SCM_RIGHTS), still the caller's afterwards; -1: none
 *
 * Blocks until everything is written; EINTR is retried, SIGPIPE is not raised.
 * Return: 0, or a negative errno.
 */
int gpu_proto_send(int sock, struct iovec *iov, int n, int fd) {
        char cbuf[CMSG_SPACE(sizeof(int))] = {0};
        bool fd_sent = fd < 0;
        while (n > 0) {
                struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
                if (!fd_sent) {
                        mh.msg_control = cbuf;
                        mh.msg_controllen = sizeof(cbuf);
                        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
                        c->cmsg_level = SOL_SOCKET;
                        c->cmsg_type = SCM_RIGHTS;
                        c->cmsg_len = CMSG_LEN(sizeof(int));
                        memcpy(CMSG_DATA(c), &fd, sizeof(int));
                }
                ssize_t k = sendmsg(sock, &mh, MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                fd_sent = true;
                while (n > 0 && (size_t)k >= iov->iov_len) {
                        k -= (ssize_t)iov->iov_len;
                        iov++;
                        n--;
                }
                if (n > 0) {
                        iov->iov_base = (char *)iov->iov_base + k;
                        iov->iov_len -= (size_t)k;
                }
        }
        return 0;
}

/**
 * gpu_proto_recv() - read exactly len bytes from sock into buf.
 * @sock: a stream socket to the other side
 * @buf: where the bytes go
 * @len: how many
 * @ret_fd: takes a descriptor that rides along when *ret_fd is still < 0 (the caller's to
 *          close); one more, or any when ret_fd is NULL, is closed
 * @timeout_ms: how long all of it may take; < 0: wait forever
 *
 * Return: 0, -EPIPE at end of stream, -ETIMEDOUT, or a negative errno.
 */
int gpu_proto_recv(int sock, void *buf, size_t len, int *ret_fd, int timeout_ms) {
        uint8_t *p = buf;
        uint64_t deadline = timeout_ms < 0 ? 0 : dv_now_ns() + (uint64_t)timeout_ms * 1000000;
        while (len > 0) {
                if (timeout_ms >= 0) {
                        uint64_t now = dv_now_ns();
                        if (now >= deadline)
                                return -ETIMEDOUT;
                        struct pollfd pfd = {.fd = sock, .events = POLLIN};
                        int ms = (int)DV_MIN((deadline - now) / 1000000 + 1, (uint64_t)INT_MAX);
                        int r = poll(&pfd, 1, ms);
                        if (r < 0 && errno != EINTR)
                                return -errno;
                        if (r <= 0)
                                continue;
                }
                char cbuf[CMSG_SPACE(sizeof(int) * 4)];
                struct iovec iov = {.iov_base = p, .iov_len = len};
                struct msghdr mh = {.msg_iov = &iov,
                                    .msg_iovlen = 1,
                                    .msg_control = cbuf,
                                    .msg_controllen = sizeof(cbuf)};
                ssize_t k = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        int nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                        for (int i = 0; i < nfd; i++) {
                                int fd;
                                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                                if (ret_fd && *ret_fd < 0)
                                        *ret_fd = fd;
                                else
                                        close(fd);
                        }
                }
                if (k == 0)
                        return -EPIPE;
                p += k;
                len -= (size_t)k;
        }
        return 0;
}

/**
 * gpu_proto_grow() - make room for one more element in a growing array (the tables of
 * mappings either side keeps).
 * @arr: the address of the array's pointer, replaced when it moves
 * @n: how many elements are in use
 * @cap: how many fit; updated when it grows
 * @elem: the size of one element
 * @first: how many the first allocation holds; it doubles from there
 *
 * Return: 0, or DEVAL_ENOMEM with dv_gpu_error() set and the array untouched.
 */
int gpu_proto_grow(void *arr, size_t n, size_t *cap, size_t elem, size_t first) {
        if (n < *cap)
                return 0;
        size_t want = *cap ? *cap * 2 : first;
        void *p = realloc(*(void **)arr, want * elem);
        if (!p)
                return dv_gpu_fail(DEVAL_ENOMEM, "devald is out of memory");
        *(void **)arr = p;
        *cap = want;
        return 0;
}
