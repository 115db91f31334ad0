/* SPDX-License-Identifier: MIT */
/*
 * group_join.h - a group formed from its ranks' joins and started (group_join.c).
 */
#pragma once

#include <stddef.h>

#include "daemon.h"

int group_join(Daemon *d, Conn *c, const DvJoinReq *req, char *msg, size_t msglen);
