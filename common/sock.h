/* SPDX-License-Identifier: MIT */
/*
 * sock.h - one message at a time over SOCK_SEQPACKET, with file descriptors riding along
 * as SCM_RIGHTS, and the default socket path.
 */
#pragma once

#include <stdbool.h>
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
/* Where the system's devald (systemd, or root by hand) listens. */
#define DV_SYSTEM_SOCKET "/run/deval/devald.sock"
/* This user's own devald's socket: $XDG_RUNTIME_DIR/deval/devald.sock, else
 * /tmp/deval-UID/devald.sock; 0 or -ENAMETOOLONG. */
int dv_user_socket_path(char *buf, size_t len);
/* Does a devald answer at path? */
bool dv_socket_answers(const char *path);
/* Where a client connects: path when given, else $DEVAL_SOCKET (both *ret_explicit), else the
 * system devald's socket when one answers there, else this user's own. 0 or -ENAMETOOLONG. */
int dv_client_socket_path(const char *path, char *buf, size_t len, bool *ret_explicit);
