/* SPDX-License-Identifier: MIT */
/*
 * gpu.h - every CUDA call deval makes goes through this small table, so that nothing links
 * against CUDA (the driver is dlopen()ed on first use) and so that tests can swap in a fake
 * that keeps "device memory" in host memory and runs the copy kernel's body on the CPU.
 *
 * dv_gpu() picks the fake when $DEVAL_GPU_FAKE is set (its value: how many devices, default
 * 2), else the CUDA driver. A device pointer is a uint64_t, as the driver's CUdeviceptr.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernel_body.h"

typedef uint64_t DvDevPtr;

typedef struct {
        const char *name; /* "cuda" or "fake" */
        /* Load and initialise the driver; 0, or DEVAL_ENOTSUP with dv_gpu_error() set. */
        int (*init)(void);
        int (*device_count)(int *ret);
        int (*device_uuid)(int device, uint8_t uuid[16]);
        int (*device_busid)(int device, char *buf, int len); /* PCI "0000:17:00.0" */
        int (*alloc)(int device, size_t bytes, DvDevPtr *ret);
        int (*free)(int device, DvDevPtr p);
        int (*copy_to_host)(int device, void *dst, DvDevPtr src, size_t bytes);
        int (*copy_to_device)(int device, DvDevPtr dst, const void *src, size_t bytes);
        int (*copy_device)(int device, DvDevPtr dst, DvDevPtr src, size_t bytes);
        /*
         * Memory other processes can map: bytes on device, mapped here at *ret (readable and
         * writable by every device that can reach it), with *ret_fd a descriptor to pass over
         * a Unix socket. import_fd() maps such a descriptor on device; unmap() undoes
         * either. The memory lives until every mapping of it is gone.
         */
        int (*export_alloc)(int device, size_t bytes, DvDevPtr *ret, int *ret_fd);
        int (*import_fd)(int device, int fd, size_t bytes, DvDevPtr *ret);
        int (*unmap)(int device, DvDevPtr p, size_t bytes);
        /*
         * Whether kernels on device may read memory that lives on peer (the driver's word;
         * devald's GPU workers confirm it with a test copy before relying on it).
         */
        int (*can_access_peer)(int device, int peer, int *ret);
        /* Pinned host memory every device can read through *ret_dev (staging without P2P). */
        int (*host_alloc)(size_t bytes, void **ret_host, DvDevPtr *ret_dev);
        void (*host_free)(void *host);
        /* Run a flattened plan into out on device: the copy kernel (or its CPU body). */
        int (*run_plan)(int device, const DvKernelSeg *segs, const uint64_t *starts, uint32_t nsegs,
                        DvDevPtr out, const DvDevPtr *srcs, uint32_t nsrcs);
} DvGpuApi;

/* The table in use; its init() must succeed before any other entry is called. */
const DvGpuApi *dv_gpu(void);
/* Why the last failing call failed, for messages (thread-local). */
const char *dv_gpu_error(void);
/* Set that message and return status (for code wrapping the table). */
int dv_gpu_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * Whether the last failing call on this thread hit a sticky error: one after which the
 * CUDA context, and by the driver's rules the whole process, cannot be used again (an
 * illegal address in a kernel, an uncorrectable ECC error). Cleared by each failure that
 * is not sticky.
 */
int dv_gpu_sticky(void);

/* The copy kernel compiled by nvcc, when the build had nvcc (NULL, 0 otherwise). */
extern const unsigned char *dv_copy_kernel_fatbin;
extern const size_t dv_copy_kernel_fatbin_size;
