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
/*
 * A charge for replacing one of g's arenas, of current bytes, by one of want bytes: taken
 * against the group's and its uid's quotas by charge_take(), then either committed once the
 * new arena is in place (g->bytes_mapped moves by want - current) or dropped (the uid gets
 * the bytes back). Every growth of an arena goes through one.
 */
typedef struct {
        Group *g;
        uint64_t current, want;
} Charge;

/* Size the replacement of an arena of current bytes that must hold size (growth by half
 * again, cut to the need near either quota) and reserve it: 0 with *ret (ret->want: the
 * size to make), or DEVAL_ENOMEM saying why (naming the option). */
int charge_take(Group *g, uint64_t current, uint64_t size, Charge *ret, char *why, size_t whylen);
/* The new arena is in place: count it in the group. Under g->lock. */
void charge_commit(Charge *c);
/* It was not made after all: give the reservation back. */
void charge_drop(Charge *c);
