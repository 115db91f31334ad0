/* SPDX-License-Identifier: MIT */
/*
 * group.h - a group's lifecycle as the main thread sees it (group.c).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

int group_join(Daemon *d, Conn *c, const DvJoinReq *req, char *msg, size_t msglen);
void group_member_gone(Group *g, int rank, bool left);
void group_fail(Group *g, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void group_expire_joins(Daemon *d, uint64_t now, int64_t *next_ns);
void group_maybe_free(Group *g);
int group_grow_input(Group *g, int rank, uint64_t size, Arena *ret, char *msg, size_t msglen);
int group_output_fd(Group *g, uint64_t *size, uint64_t *gen);
void group_expire_idle(Daemon *d, uint64_t now, int64_t *next_ns);
int group_grow_dev_input(Group *g, Conn *c, uint64_t size, char *msg, size_t msglen);
int group_dev_output_fd(Group *g, int rank, uint64_t *size, uint64_t *gen);
void group_stop_all(Daemon *d, int status, const char *why);
Group *group_lookup(Daemon *d, const char *name);
