/* SPDX-License-Identifier: MIT */
/*
 * arena.h - a rank's view of its group's shared memory (arena.c).
 */
#pragma once

#include <stdint.h>

#include "handle.h"

/* Map a segment devald sent after checking it is a memfd of exactly size bytes sealed
 * against shrinking and growing: 0 with *ret, -EPROTO if it is not, or -errno. Closes fd. */
int dv_map_fd(int fd, uint64_t size, int prot, void **ret);
/* Import a device group's segment on this rank's GPU: 0 with *ret, or a DEVAL_E* status. */
int dv_import_dev(deval_group *g, int fd, uint64_t size, uint64_t *ret);
/* Make sure the input arena holds size bytes, asking devald to grow it: 0, DEVAL_ENOMEM past
 * the group's quota, or a connection failure. */
int dv_reserve_input(deval_group *g, uint64_t size);
/* Room for size bytes of this rank's input, what deval_input_buffer() handed out kept: in
 * the input arena devald grows, or in a spanning handle's part. */
static inline int dv_reserve(deval_group *g, uint64_t size) {
        return g->span ? g->span_ops->reserve(g, size) : dv_reserve_input(g, size);
}
/* Map the current output arena if devald replaced it: 0, or a connection failure. */
int dv_refresh_output(deval_group *g);
/* Map the group's direct output, asking devald to make it hold size bytes (0: the current
 * one): 0, DEVAL_ENOMEM past the group's quota, or a connection failure. */
int dv_direct_output(deval_group *g, uint64_t size);
/* The same two for a device group's device input and output. */
int dv_reserve_dev_input(deval_group *g, uint64_t size);
int dv_refresh_dev_output(deval_group *g);
