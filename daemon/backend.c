/* SPDX-License-Identifier: MIT */
/*
 * backend.c - the backend devald serves: host memory only, or the GPUs it sees (cuda), with their
 * GPU worker processes.
 */
#define _GNU_SOURCE
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "daemon.h"
#include "gpu_worker.h"
#include "log.h"
#include "util.h"

/*
 * The cuda backend: the GPUs devald sees, by UUID (ranks name theirs by UUID, since their
 * ordinals depend on their CUDA_VISIBLE_DEVICES). auto falls back to host without a GPU.
 * Return: 0, or -ENODEV / -EIO with why.
 */
int backend_setup(Daemon *d, char *why, size_t whylen) {
        if (strcmp(arg_backend, "host") == 0)
                return 0;
        const DvGpuApi *gpu = dv_gpu();
        int n = 0;
        if (gpu->init() < 0 || gpu->device_count(&n) < 0 || n < 1) {
                if (strcmp(arg_backend, "auto") == 0) {
                        log_info("backend auto: no GPU (%s), so host",
                                 n < 1 && !dv_gpu_error()[0] ? "none visible" : dv_gpu_error());
                        return 0;
                }
                snprintf(why, whylen, "backend cuda: %s",
                         n < 1 && !dv_gpu_error()[0] ? "no GPU visible" : dv_gpu_error());
                return -ENODEV;
        }
        d->ngpus = DV_MIN(n, DV_MAX_GPUS);
        for (int k = 0; k < d->ngpus; k++)
                if (gpu->device_uuid(k, d->gpu_uuid[k]) < 0) {
                        snprintf(why, whylen, "backend cuda: %s", dv_gpu_error());
                        return -EIO;
                }
        int r = gpuw_start(d->ngpus, why, whylen);
        if (r < 0)
                return r;
        d->gpu = gpu;
        log_info("backend cuda (%s driver): %d GPU%s", gpu->name, d->ngpus,
                 d->ngpus == 1 ? "" : "s");
        return 0;
}
