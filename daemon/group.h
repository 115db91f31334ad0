/* SPDX-License-Identifier: MIT */
/*
 * group.h - a group's life as the main thread sees it (group.c): made, found, failed,
 * expired, stopped and freed. Joining it is group_join.h's; its members' arenas,
 * group_arena.h's.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

Group *group_lookup(Daemon *d, const char *name);
int group_new(Daemon *d, const DvJoinReq *req, Usage *usage, Group **ret);
void group_member_gone(Group *g, int rank, bool left);
void group_fail(Group *g, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool group_fail_published(Group *g, int wait_ms);
void group_expire_joins(Daemon *d, uint64_t now, int64_t *next_ns);
void group_expire_idle(Daemon *d, uint64_t now, int64_t *next_ns);
void group_maybe_free(Group *g);
void group_stop_all(Daemon *d, int status, const char *why);
