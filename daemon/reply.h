/* SPDX-License-Identifier: MIT */
/*
 * reply.h - answering a client's request (reply.c).
 */
#pragma once

#include <stdint.h>

#include "daemon.h"

/* Answer c's request with status and msg; never blocks. */
void conn_reply(Conn *c, int status, const char *msg);

/* A successful answer's shared segments: n descriptors and their sizes, the output arenas'
 * generations (DV_MSG_OUTPUT, DV_MSG_DEV_OUTPUT, a join) and DV_REPLY_* flags. */
typedef struct {
        const int *fds;
        const uint64_t *sizes;
        int n;
        uint64_t gen, dev_gen;
        uint32_t flags;
} ConnSegments;

/* Answer c's request with success and s; never blocks. */
void conn_reply_segments(Conn *c, const ConnSegments *s);
