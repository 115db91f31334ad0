/* SPDX-License-Identifier: MIT */
/*
 * gpu_proto.h - what devald (gpu_worker.c) and its GPU worker processes (gpu_serve.c) say to
 * each other, and how (gpu_proto.c).
 *
 * A worker talks to devald on one end of a socketpair. Requests and replies are fixed headers
 * plus arrays, over a stream socket because a plan's segment table can be large; the
 * descriptor of exported memory rides on the reply (SCM_RIGHTS), that of memory to import on
 * the request. A worker's first record is its hello, a GwRep with the peers it proved it reads.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum {
        GW_ALLOC = 1, /* size -> ptr, and the export descriptor */
        GW_IMPORT,    /* id, device (where it lives), size, and a descriptor */
        GW_FREE,      /* id: unmap, whether made here or imported */
        GW_RUN        /* out_id, nsegs, nsrcs; then segs, starts, GwSrc[nsrcs] */
};

typedef struct {
        uint32_t op;
        int32_t device;
        uint64_t id;
        uint64_t size;
        uint64_t out_id;
        uint32_t nsegs;
        uint32_t nsrcs;
} GwReq;

typedef struct {
        uint64_t id;
        uint64_t off;
        uint64_t bytes;
} GwSrc;

typedef struct {
        int32_t status;
        uint32_t sticky; /* the worker hit a sticky error and exits after this reply */
        uint64_t ptr;
        uint64_t p2p; /* the first reply: the peers proven readable */
        char err[232];
} GwRep;

_Static_assert(sizeof(GwRep) == 256, "GwRep is one 256-byte record");

/* A plan no larger than this many segments (devald's plans are bounded far below). */
#define GW_MAX_SEGS (1u << 26)
#define GW_MAX_SRCS (1u << 20)

/* Write all of iov, with fd (if >= 0) on the first byte. 0, or -errno. */
int gpu_proto_send(int sock, struct iovec *iov, int n, int fd);
/* Read exactly len bytes, a descriptor riding along into *ret_fd; timeout_ms < 0: no limit.
 * 0, -EPIPE at end of stream, -ETIMEDOUT, or -errno. */
int gpu_proto_recv(int sock, void *buf, size_t len, int *ret_fd, int timeout_ms);
/* Room for one more element in a growing array: 0, or DEVAL_ENOMEM with dv_gpu_error(). */
int gpu_proto_grow(void *arr, size_t n, size_t *cap, size_t elem, size_t first);
