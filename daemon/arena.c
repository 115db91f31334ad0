/* SPDX-License-Identifier: MIT */
/*
 * arena.c - shared memory segments: sealed memfds mapped into devald, and the device memory a
 * GPU worker exports (cuda backend).
 */
#define _GNU_SOURCE
#include "arena.h"

#include <fcntl.h>
#include <sys/mman.h>

#include "deval.h"

#include "gpu_worker.h"
#include "util.h"

/**
 * arena_new() - a sealed memfd of size bytes, mapped into the daemon.
 * @kind: ARENA_OUTPUT: devald writes it and clients may only map it read-only
 *        (F_SEAL_FUTURE_WRITE); ARENA_INPUT: a client writes it and devald maps it read-only;
 *        ARENA_SHARED: both write it.
 * Return: 0, or DEVAL_ENOMEM / DEVAL_ESYS.
 */
int arena_new(const char *name, uint64_t size, int kind, Arena *ret) {
        _cleanup_(closep) int fd = -1;
        int seals = F_SEAL_SHRINK | F_SEAL_GROW;

        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return DEVAL_ESYS;
        if (ftruncate(fd, (off_t)size) < 0)
                return errno == ENOSPC || errno == ENOMEM ? DEVAL_ENOMEM : DEVAL_ESYS;
        int prot = kind == ARENA_INPUT ? PROT_READ : PROT_READ | PROT_WRITE;
        void *map = mmap(NULL, size ? size : 1, prot, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
                return DEVAL_ENOMEM;
        if (kind == ARENA_OUTPUT)
                seals |= F_SEAL_FUTURE_WRITE;
        if (fcntl(fd, F_ADD_SEALS, seals | F_SEAL_SEAL) < 0) {
                munmap(map, size ? size : 1);
                return DEVAL_ESYS;
        }
        *ret = (Arena){.fd = TAKE_FD(fd), .map = map, .size = size};
        return 0;
}

void arena_deinit(Arena *a) {
        if (a->map)
                munmap(a->map, a->size ? a->size : 1);
        if (a->fd >= 0)
                close(a->fd);
        *a = ARENA_NULL;
}

/**
 * dev_arena_new() - size bytes of shareable memory on devald's GPU device (cuda backend).
 * Return: 0, or DEVAL_ENOMEM / DEVAL_ESYS with dv_gpu_error() saying why.
 */
int dev_arena_new(int device, uint64_t size, DevArena *ret) {
        return gpuw_alloc(device, size, ret);
}

void dev_arena_deinit(DevArena *a) {
        gpuw_free(a);
        *a = DEV_ARENA_NULL;
}
