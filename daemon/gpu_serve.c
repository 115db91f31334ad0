/* SPDX-License-Identifier: MIT */
/*
 * gpu_serve.c - a GPU's worker process ("devald --gpu-worker N", started by gpu_worker.c):
 * it owns the GPU's CUDA context, allocates, exports, imports and frees device memory, and
 * runs the copy kernel, each at devald's request (gpu_proto.h).
 *
 * It first proves with a test copy which peers' memory its copy kernel reads, and stages the
 * others' inputs through pinned host memory. After a sticky CUDA error it replies, saying
 * so, and exits without touching the context again; devald starts a new one.
 */
#define _GNU_SOURCE
#include "gpu_serve.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "deval.h"

#include "gpu.h"
#include "gpu_proto.h"
#include "log.h"
#include "util.h"
#include "wire.h"

typedef struct {
        uint64_t id;
        int device; /* where the memory lives */
        DvDevPtr ptr;
        uint64_t size;
} Mapping;

typedef struct {
        const DvGpuApi *api;
        int device;
        uint64_t p2p;
        Mapping *maps;
        size_t nmaps, cap;
        void *stage; /* pinned host memory for the inputs of GPUs without P2P */
        DvDevPtr stage_dev;
        size_t stage_size;
} Gw;

static Mapping *gw_find(Gw *gw, uint64_t id) {
        for (size_t i = 0; i < gw->nmaps; i++)
                if (gw->maps[i].id == id)
                        return &gw->maps[i];
        return NULL;
}

static int gw_add(Gw *gw, Mapping m) {
        int r = gpu_proto_grow(&gw->maps, gw->nmaps, &gw->cap, sizeof(*gw->maps), 64);
        if (r < 0)
                return r;
        gw->maps[gw->nmaps++] = m;
        return 0;
}

/*
 * Whether this GPU's kernel reads peer's memory correctly: the driver must say it can, and
 * a 64 KiB test copy through the copy kernel from memory exported on peer must arrive
 * intact. A sticky error here ends the process (exit 4): devald then starts a worker that
 * does not try.
 */
static bool gw_probe_peer(Gw *gw, int peer) {
        const DvGpuApi *api = gw->api;
        enum {
                N = 64 << 10
        };
        int ok = 0, fd = -1;
        DvDevPtr src = 0, dst = 0;
        bool proven = false;
        _cleanup_(freep) uint8_t *pat = malloc(N);
        _cleanup_(freep) uint8_t *back = malloc(N);

        if (!pat || !back || api->can_access_peer(gw->device, peer, &ok) < 0 || !ok)
                return false;
        for (int i = 0; i < N; i++)
                pat[i] = (uint8_t)(i * 131 + peer * 7 + 1);
        if (api->export_alloc(peer, N, &src, &fd) < 0)
                goto out;
        close(fd);
        DvKernelSeg seg = {.kind = DV_KSEG_COPY, .len = N, .count = 1};
        uint64_t starts[2] = {0, N};
        if (api->alloc(gw->device, N, &dst) < 0 || api->copy_to_device(peer, src, pat, N) < 0)
                goto out;
        if (api->run_plan(gw->device, &seg, starts, 1, dst, &src, 1) < 0) {
                if (dv_gpu_sticky())
                        _exit(4);
                goto out;
        }
        proven = api->copy_to_host(gw->device, back, dst, N) == 0 && memcmp(pat, back, N) == 0;
out:
        if (dst)
                api->free(gw->device, dst);
        if (src)
                api->unmap(peer, src, N);
        if (!proven)
                log_info("GPU %d: kernels here do not read GPU %d's memory directly (%s); its "
                         "inputs are staged through host memory",
                         gw->device, peer, dv_gpu_error()[0] ? dv_gpu_error() : "test copy");
        return proven;
}

/* Whether this GPU's kernel reads m directly: its own memory, or a peer's proven by P2P. */
static bool gw_reads(const Gw *gw, const Mapping *m) {
        return m->device == gw->device || (gw->p2p >> m->device & 1);
}

static int gw_run(Gw *gw, const GwReq *req, const DvKernelSeg *segs, const uint64_t *starts,
                  const GwSrc *srcs) {
        const DvGpuApi *api = gw->api;
        Mapping *out = gw_find(gw, req->out_id);
        if (!out || out->device != gw->device)
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: the output arena is not here", gw->device);
        if (starts[0] != 0 || starts[req->nsegs] > out->size)
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: the plan writes past the output",
                                   gw->device);
        _cleanup_(freep) DvDevPtr *ptrs = calloc(req->nsrcs ? req->nsrcs : 1, sizeof(*ptrs));
        _cleanup_(freep) Mapping **ms = calloc(req->nsrcs ? req->nsrcs : 1, sizeof(*ms));
        if (!ptrs || !ms)
                return dv_gpu_fail(DEVAL_ENOMEM, "GPU worker: out of memory");
        size_t staged = 0;
        for (uint32_t i = 0; i < req->nsrcs; i++) {
                Mapping *m = ms[i] = gw_find(gw, srcs[i].id);
                if (!m || srcs[i].off > m->size || srcs[i].bytes > m->size - srcs[i].off)
                        return dv_gpu_fail(DEVAL_ESYS, "GPU %d: source %u is not mapped here",
                                           gw->device, i);
                if (!gw_reads(gw, m))
                        staged += DV_ALIGN(srcs[i].bytes, 64);
        }
        if (staged > gw->stage_size) {
                api->host_free(gw->stage);
                gw->stage = NULL;
                gw->stage_size = 0;
                int r = api->host_alloc(staged, &gw->stage, &gw->stage_dev);
                if (r < 0)
                        return r;
                gw->stage_size = staged;
        }
        size_t at = 0;
        for (uint32_t i = 0; i < req->nsrcs; i++) {
                Mapping *m = ms[i];
                ptrs[i] = m->ptr + srcs[i].off;
                if (gw_reads(gw, m))
                        continue;
                /* no P2P from m's GPU: its bytes come through pinned host memory */
                int r = api->copy_to_host(m->device, (uint8_t *)gw->stage + at, ptrs[i],
                                          srcs[i].bytes);
                if (r < 0)
                        return r;
                ptrs[i] = gw->stage_dev + at;
                at += DV_ALIGN(srcs[i].bytes, 64);
        }
        return api->run_plan(gw->device, segs, starts, req->nsegs, out->ptr, ptrs, req->nsrcs);
}

/* A request devald and this worker disagree on: the worker stops. Not a DEVAL_E* (-1 is
 * DEVAL_EINVAL, which a driver call may return and devald must hear). */
#define GW_STOP INT_MIN

/* Serve one request; fills rep and *ret_fd (to send). Return: -1 at end of stream. */
static int gw_serve(Gw *gw, int sock, GwRep *rep, int *ret_fd) {
        GwReq req;
        int fd = -1, r;
        if (gpu_proto_recv(sock, &req, sizeof(req), &fd, -1) < 0)
                return -1;
        *rep = (GwRep){0};
        dv_gpu_fail(0, "%s", "");
        switch (req.op) {
        case GW_ALLOC: {
                DvDevPtr p;
                r = gw->api->export_alloc(gw->device, req.size, &p, ret_fd);
                if (r == 0 && (r = gw_add(gw, (Mapping){req.id, gw->device, p, req.size})) < 0) {
                        gw->api->unmap(gw->device, p, req.size);
                        close(*ret_fd);
                        *ret_fd = -1;
                }
                rep->ptr = r == 0 ? p : 0;
                break;
        }
        case GW_IMPORT: {
                DvDevPtr p;
                r = fd < 0 ? dv_gpu_fail(DEVAL_ESYS, "GPU %d: import without a descriptor",
                                         gw->device)
                           : gw->api->import_fd(req.device, fd, req.size, &p);
                if (r == 0 && (r = gw_add(gw, (Mapping){req.id, req.device, p, req.size})) < 0)
                        gw->api->unmap(req.device, p, req.size);
                break;
        }
        case GW_FREE: {
                Mapping *m = gw_find(gw, req.id);
                r = 0;
                if (m) {
                        r = gw->api->unmap(m->device, m->ptr, m->size);
                        *m = gw->maps[--gw->nmaps];
                }
                break;
        }
        case GW_RUN: {
                if (req.nsegs > GW_MAX_SEGS || req.nsrcs > GW_MAX_SRCS) {
                        r = GW_STOP;
                        break;
                }
                size_t nseg = req.nsegs, nsrc = req.nsrcs;
                _cleanup_(freep) DvKernelSeg *segs = malloc((nseg ? nseg : 1) * sizeof(*segs));
                _cleanup_(freep) uint64_t *starts = malloc((nseg + 1) * sizeof(*starts));
                _cleanup_(freep) GwSrc *srcs = malloc((nsrc ? nsrc : 1) * sizeof(*srcs));
                if (!segs || !starts || !srcs ||
                    gpu_proto_recv(sock, segs, nseg * sizeof(*segs), NULL, -1) < 0 ||
                    gpu_proto_recv(sock, starts, (nseg + 1) * sizeof(*starts), NULL, -1) < 0 ||
                    gpu_proto_recv(sock, srcs, nsrc * sizeof(*srcs), NULL, -1) < 0) {
                        r = GW_STOP;
                        break;
                }
                r = gw_run(gw, &req, segs, starts, srcs);
                break;
        }
        default:
                r = GW_STOP;
        }
        if (fd >= 0)
                close(fd);
        if (r == GW_STOP)
                return -1; /* devald and this worker disagree on the protocol: stop */
        rep->status = r;
        rep->sticky = r < 0 && dv_gpu_sticky();
        if (r < 0)
                snprintf(rep->err, sizeof(rep->err), "GPU %d: %s%s", gw->device, dv_gpu_error(),
                         rep->sticky ? " (a sticky error: the GPU's worker process restarts)" : "");
        return 0;
}

/* The worker's watch on devald (its pidfd on fd 4): devald gone, the worker goes too,
 * even in the middle of a kernel. */
static void *parent_watch(void *arg) {
        struct pollfd p = {.fd = (int)(intptr_t)arg, .events = POLLIN};
        while (poll(&p, 1, -1) < 0 && errno == EINTR)
                ;
        _exit(0);
}

/**
 * gpu_serve_main() - the worker process for GPU device, serving devald on sock until devald
 * hangs up; exits after a sticky error (status 3) or a faulting test copy (status 4).
 * @sock: its end of the socketpair devald made (fd 3)
 * @device: devald's ordinal of the GPU
 * @no_p2p: skip the test copies: read every peer's memory through pinned host memory
 *
 * Expects devald's pidfd on fd 4 (none on a kernel without pidfds): devald gone, the process
 * ends at once. Sends its hello (gpu_proto.h) first.
 * Return: the process's exit code: 0 when devald hung up or is gone, 1 when the GPU could
 * not be set up or devald did not take the hello, 3 after a sticky error (a test copy that
 * faults ends it with 4 before the hello).
 */
int gpu_serve_main(int sock, int device, int no_p2p) {
        pthread_t watch;
        struct pollfd probe = {.fd = 4, .events = POLLIN};
        int ready = poll(&probe, 1, 0); /* POLLNVAL: a kernel without pidfds, no watch */
        if (ready == 1 && !(probe.revents & POLLNVAL))
                return 0; /* devald is already gone */
        if (ready == 0 && pthread_create(&watch, NULL, parent_watch, (void *)(intptr_t)4) == 0)
                pthread_detach(watch);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_IGN); /* a ^C to devald's terminal is devald's to handle */
        signal(SIGPIPE, SIG_IGN);
        Gw gw = {.api = dv_gpu(), .device = device};
        GwRep rep = {0};
        int n = 0;

        rep.status = gw.api->init();
        if (rep.status == 0)
                rep.status = gw.api->device_count(&n);
        if (rep.status == 0 && (device < 0 || device >= n))
                rep.status = dv_gpu_fail(DEVAL_EINVAL, "no GPU %d (%d visible)", device, n);
        for (int k = 0; rep.status == 0 && !no_p2p && k < n && k < DV_MAX_GPUS; k++)
                if (k != device && gw_probe_peer(&gw, k))
                        gw.p2p |= 1ull << k;
        if (rep.status < 0)
                snprintf(rep.err, sizeof(rep.err), "%s", dv_gpu_error());
        rep.p2p = gw.p2p;
        struct iovec iov = {.iov_base = &rep, .iov_len = sizeof(rep)};
        if (gpu_proto_send(sock, &iov, 1, -1) < 0 || rep.status < 0)
                return 1;
        int status = 0;
        for (;;) {
                int fd = -1;
                if (gw_serve(&gw, sock, &rep, &fd) < 0)
                        break;
                iov = (struct iovec){.iov_base = &rep, .iov_len = sizeof(rep)};
                int r = gpu_proto_send(sock, &iov, 1, fd);
                if (fd >= 0)
                        close(fd);
                if (r < 0)
                        break;
                if (rep.sticky) {
                        status = 3; /* the context is gone: exit without touching it again */
                        break;
                }
        }
        for (size_t i = 0; status == 0 && i < gw.nmaps; i++)
                gw.api->unmap(gw.maps[i].device, gw.maps[i].ptr, gw.maps[i].size);
        free(gw.maps);
        if (status == 0)
                gw.api->host_free(gw.stage);
        return status;
}
