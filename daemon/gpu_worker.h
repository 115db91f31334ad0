/* SPDX-License-Identifier: MIT */
/*
 * gpu_worker.h - devald's GPUs, each driven by its own worker process (gpu_worker.c: devald's
 * side; gpu_serve.c: the process; gpu_proto.h: what they say to each other).
 *
 * A sticky CUDA error (an illegal address in a kernel, an uncorrectable ECC error) leaves
 * the CUDA context unusable, and the driver's only documented way out is to end the
 * process. So devald itself never makes a CUDA context: every device allocation, export
 * and copy kernel runs in a worker process per GPU ("devald --gpu-worker"), started with
 * the daemon and restarted after it dies. A fault then takes down that GPU's worker and
 * the groups whose memory lived in it, and nothing else: not the groups on other GPUs,
 * not the host groups, not devald.
 *
 * Each worker proves with a test copy which peers' memory its copy kernel can read, and
 * stages the others' inputs through pinned host memory.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"

/*
 * Device memory a group shares with its ranks (cuda backend), made by the GPU's worker
 * process; devald holds the export descriptor, which maps it into the ranks and into other
 * GPUs' workers.
 */
typedef struct DevArena {
        int device;   /* devald's ordinal; -1: none */
        int fd;       /* the export descriptor */
        DvDevPtr ptr; /* where the worker mapped it (nonzero: allocated) */
        uint64_t size;
        uint64_t id;  /* names it to the workers */
        uint32_t gen; /* the worker generation that made it */
} DevArena;

#define DEV_ARENA_NULL ((DevArena){.device = -1, .fd = -1})

typedef struct {
        const DevArena *arena;
        uint64_t off;   /* where the tensor starts in the arena */
        uint64_t bytes; /* how many bytes of it the plan reads */
} GpuwSrc;

/* Start one worker per GPU (0..ngpus-1); 0, or a negative errno with why. */
int gpuw_start(int ngpus, char *why, size_t whylen);
/* Stop every worker and wait for them. */
void gpuw_stop(void);
/* The peers whose memory GPU device's kernel reads directly (bit k: GPU k). */
uint64_t gpuw_p2p(int device);

/*
 * Device memory: allocated, zeroed and exported by device's worker. Fill ret; 0, or a
 * negative DEVAL_E* with dv_gpu_error() saying why.
 */
int gpuw_alloc(int device, uint64_t size, DevArena *ret);
void gpuw_free(DevArena *a);
/* Run a plan on device into out; 0, or a negative DEVAL_E* with dv_gpu_error() set. */
int gpuw_run(int device, const DvKernelSeg *segs, const uint64_t *starts, uint32_t nsegs,
             const DevArena *out, const GpuwSrc *srcs, uint32_t nsrcs);
