/* SPDX-License-Identifier: MIT */
/*
 * sd_daemon.h - systemd's side of devald (sd_daemon.c).
 */
#pragma once

#include "daemon.h"

/* Send state ("READY=1", "STATUS=...") to $NOTIFY_SOCKET, if set. */
void sd_notify_state(const char *state);
/* Take the listening socket systemd passed: 1 taken, 0 none, -1 unusable (said why). */
int sd_listen_inherited(Daemon *d, char *why, size_t whylen);
