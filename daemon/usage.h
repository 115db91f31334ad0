/* SPDX-License-Identifier: MIT */
/*
 * usage.h - per-uid usage and the quotas arenas are charged against (usage.c).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

/* uid's record, made on first use; NULL out of memory. */
Usage *usage_get(Daemon *d, uid_t uid);
/* Forget u once its uid holds nothing in devald. Accepts NULL. */
void usage_put(Daemon *d, Usage *u);
/* Take n more bytes for u's groups if that stays within limit; any thread. */
bool usage_reserve(Usage *u, uint64_t limit, uint64_t n);
/* Size a replacement for an arena of current bytes that must hold size, within the group's
 * and its uid's quotas, and reserve the growth for the uid: 0 with *ret_want, or
 * DEVAL_ENOMEM saying why. */
int group_quota(Group *g, uint64_t current, uint64_t size, uint64_t *ret_want, char *why,
                size_t whylen);
/* Give back what group_quota() reserved (want - current) when the arena was not made. */
void group_quota_undo(Group *g, uint64_t reserved);
