/* SPDX-License-Identifier: MIT */
/*
 * client.h - libdeval's internals: the group handle and the helpers its collectives share.
 */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "deval.h"

#include "wire.h"

struct deval_group {
        int sock;
        int rank, world;
        pid_t pid;      /* the process that joined; a forked child may not use the handle */
        int timeout_ms; /* < 0: forever */
        char name[DV_GROUP_NAME_MAX];
        char socket_path[108];
        DvCtlHeader *hdr; /* what this rank writes: its slot, the arrive word */
        uint64_t ctl_size;
        const DvDoneHeader *done; /* what devald writes, mapped read-only */
        uint64_t done_size;
        uint8_t *in;
        uint64_t in_size;
        uint64_t in_keep; /* bytes at the arena's start handed out by deval_input_buffer() */
        const uint8_t *out;
        uint64_t out_size;
        uint64_t out_gen;
        int device;   /* a device group: this rank's CUDA device; -1: host arenas only */
        uint64_t din; /* device input arena, mapped here */
        uint64_t din_size;
        uint64_t dout; /* device output arena on this rank's GPU, mapped here */
        uint64_t dout_size;
        uint64_t dout_gen;
        uint32_t seq;
        int failed; /* sticky status once the group is unusable */
        bool debug;
        uint64_t spin_ns; /* busy-wait this long before sleeping on the futex */
        deval_bytes *items;
        size_t items_cap;
        char errmsg[DV_MSG_MAX + 128];
};

int dv_set_err(deval_group *g, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
int dv_request(deval_group *g, const void *req, size_t len, DvReply *rep, int *fds, int *nfds);
int dv_reserve_input(deval_group *g, uint64_t size);
int dv_refresh_output(deval_group *g);
int dv_reserve_dev_input(deval_group *g, uint64_t size);
int dv_refresh_dev_output(deval_group *g);
