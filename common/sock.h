/* SPDX-License-Identifier: MIT */
/*
 * sock.h - one message at a time over SOCK_SEQPACKET, with file descriptors riding along
 * as SCM_RIGHTS, and the default socket path.
 */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#define DV_MAX_FDS 6

ssize_t dv_send_msg(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags);
ssize_t dv_recv_msg(int sock, void *buf, size_t len, int *fds, int *nfds, int flags);
/* dv_recv_msg(), saying in *ret_dropped how many descriptors past *nfds it closed. */
ssize_t dv_recv_msg_counted(int sock, void *buf, size_t len, int *fds, int *nfds, int flags,
                            int *ret_dropped);
/* Write the socket path devald and clients use when none is given; 0 or -ENAMETOOLONG. */
int dv_default_socket_path(char *buf, size_t len);
