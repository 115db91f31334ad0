/* SPDX-License-Identifier: MIT */
/*
 * conn.h - client connections (conn.c).
 */
#pragma once

#include <stdint.h>

#include "daemon.h"

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
