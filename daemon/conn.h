/* SPDX-License-Identifier: MIT */
/*
 * conn.h - client connections (conn.c).
 */
#pragma once

#include <stdint.h>

#include "daemon.h"

/* Answer c's request with status and msg; never blocks. */
void conn_reply(Conn *c, int status, const char *msg);

/* A successful answer's shared segments: n descriptors and their sizes, the output arenas'
 * generations (DV_MSG_OUTPUT, DV_MSG_DEV_OUTPUT, a join) and DV_REPLY_* flags. */
typedef struct {
        const int *fds;
        const uint64_t *sizes;
        int n;
        uint64_t gen, dev_gen;
        uint32_t flags;
} ConnSegments;

/* Answer c's request with success and s; never blocks. */
void conn_reply_segments(Conn *c, const ConnSegments *s);
/* Accept every pending connection on d->listen_fd. */
void conns_accept(Daemon *d);
/* Close c now: its group learns the member is gone; freed by conns_reap(). */
void conn_close(Daemon *d, Conn *c);
/* c hung up (or broke the protocol): closed at once, or, for a group member, once its
 * process has ended or a grace has passed (conns_expire()). */
void conn_hangup(Daemon *d, Conn *c);
/* Close the members whose grace after hanging up is over; *next_ns: when the next one is. */
void conns_expire(Daemon *d, uint64_t now, int64_t *next_ns);
/* Free the connections closed during the last batch of events. */
void conns_reap(Daemon *d);
