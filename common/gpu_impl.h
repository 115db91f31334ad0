/* SPDX-License-Identifier: MIT */
/*
 * gpu_impl.h - what the GPU tables (gpu_cuda.c, gpu_fake.c) share behind gpu.h: the record
 * of a failure, and legacy CUDA IPC (gpu_legacy.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "gpu.h"

#define gpu_fail dv_gpu_fail

/* A failure that leaves the device's context unusable (sticky), or not. */
void dv_gpu_set_sticky(int sticky);

extern const DvGpuApi dv_gpu_cuda;
#ifdef DEVAL_FAKE_GPU
extern const DvGpuApi dv_gpu_fake;
#endif

/*
 * Where a GPU cannot export memory as a file descriptor (no virtual memory management, or
 * no POSIX handles: some virtualised GPUs), deval falls back to cuIpcGetMemHandle()'s
 * 64-byte handles. So that they travel exactly like descriptors (SCM_RIGHTS from devald to
 * ranks and GPU workers), a handle is wrapped in a sealed memfd; import_fd() tells the two
 * apart. $DEVAL_CUDA_LEGACY_IPC=1 forces the fallback (to test it on a GPU that has both).
 */
#define LEGACY_MAGIC "deval-cuda-ipc1"

typedef struct {
        char magic[16];
        uint8_t handle[64];
        uint64_t size;
} LegacyBlob;

enum {
        LEGACY_NONE = 0,
        LEGACY_OWN,   /* allocated here and exported: cuMemFree() */
        LEGACY_OPENED /* opened from a handle: cuIpcCloseMemHandle() */
};

/* $env set to something other than "" or "0". */
int dv_legacy_forced(const char *env);
/* Remember how p was made (LEGACY_OWN, LEGACY_OPENED), with the fake's backing fd; 0 or
 * DEVAL_ENOMEM when too many are held. */
int dv_legacy_note(DvDevPtr p, int kind, int fd);
/* Forget p; return how it was made (LEGACY_NONE: not through legacy IPC), and its fd. */
int dv_legacy_take(DvDevPtr p, int *ret_fd);
/* A sealed memfd holding handle; 0 with *ret_fd, or DEVAL_ENOMEM. */
int dv_legacy_wrap(const void *handle, uint64_t size, int *ret_fd);
/* 1 with *ret filled when fd is a wrapped handle (sealed, the right size and magic), else 0. */
int dv_legacy_unwrap(int fd, LegacyBlob *ret);
