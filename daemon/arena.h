/* SPDX-License-Identifier: MIT */
/*
 * arena.h - shared memory segments (arena.c).
 */
#pragma once

#include <stdint.h>

#include "gpu.h"

typedef struct {
        int fd;
        uint8_t *map;
        uint64_t size;
} Arena;

#define ARENA_NULL ((Arena){.fd = -1})

/* Who writes an arena: both (the control segment), the client (input), devald (output). */
enum {
        ARENA_SHARED,
        ARENA_INPUT,
        ARENA_OUTPUT
};
int arena_new(const char *name, uint64_t size, int kind, Arena *ret);
void arena_deinit(Arena *a);

/*
 * Device memory a group shares with its ranks (cuda backend), made by the GPU's worker
 * process (gpu_worker.h); devald holds the export descriptor, which maps it into the ranks
 * and into other GPUs' workers.
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

int dev_arena_new(int device, uint64_t size, DevArena *ret);
void dev_arena_deinit(DevArena *a);
