/* SPDX-License-Identifier: MIT */
/*
 * group_arena.h - a running group's arenas as its members ask for them (group_arena.c).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "daemon.h"

int group_grow_input(Group *g, int rank, uint64_t size, Arena *ret, char *msg, size_t msglen);
int group_grow_dev_input(Group *g, Conn *c, uint64_t size, char *msg, size_t msglen);
int group_output_fd(Group *g, uint64_t *size, uint64_t *gen);
int group_dev_output_fd(Group *g, int rank, uint64_t *size, uint64_t *gen);
