/* SPDX-License-Identifier: MIT */
/*
 * gpu.c - dv_gpu(), the GPU table in use (the CUDA driver, gpu_cuda.c, or in test builds
 * the fake, gpu_fake.c), and the thread-local record of why a GPU call failed.
 */
#define _GNU_SOURCE
#include "gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deval.h"

#include "cuda_abi.h"
#include "gpu_impl.h"
#include "util.h"
#include "wire.h"

static __thread char gpu_err[256];
static __thread int gpu_sticky;

const char *dv_gpu_error(void) {
        return gpu_err;
}

int dv_gpu_sticky(void) {
        return gpu_sticky;
}

/**
 * dv_gpu_fail() - record why a GPU call failed (thread-local), not sticky.
 * Return: status.
 */
int dv_gpu_fail(int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(gpu_err, sizeof(gpu_err), fmt, ap);
        va_end(ap);
        gpu_sticky = 0;
        return status;
}

void dv_gpu_set_sticky(int sticky) {
        gpu_sticky = sticky;
}

/**
 * dv_gpu() - the GPU table: in a build with the fake, the fake when $DEVAL_GPU_FAKE is set;
 * else the CUDA driver.
 */
const DvGpuApi *dv_gpu(void) {
#ifdef DEVAL_FAKE_GPU
        const char *fake = secure_getenv("DEVAL_GPU_FAKE");
        if (fake && *fake)
                return &dv_gpu_fake;
#endif
        return &dv_gpu_cuda;
}
