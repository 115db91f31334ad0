/* SPDX-License-Identifier: MIT */
/*
 * flight_dump.h - a group's flight recorder written out (flight_dump.c).
 */
#pragma once

#include <stddef.h>

#include "daemon.h"

/* g's flight recorder as JSON (malloc'd), or NULL out of memory. */
char *group_flight_json(Group *g, size_t *ret_len);
/* Write it beside devald's socket and into the log; any thread. */
void group_flight_dump(Group *g, const char *why);
