/* SPDX-License-Identifier: MIT */
/*
 * output.h - a group's output arenas (output.c).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

/* Make the host output arena hold size bytes: 0, or DEVAL_ENOMEM / an allocation failure
 * with msg saying why. Worker thread. */
int output_ensure(Group *g, uint64_t size, char *msg, size_t msglen);
/* The same for a device group: every receiving GPU's output arena. */
int output_ensure_dev(Group *g, uint64_t size, char *msg, size_t msglen);
/* Make a host group's direct output hold size bytes (made on first use): 0 with it in *ret
 * and its generation in *gen, or DEVAL_ENOMEM / an allocation failure with msg. Main thread. */
int output_direct(Group *g, uint64_t size, Arena *ret, uint64_t *gen, char *msg, size_t msglen);
