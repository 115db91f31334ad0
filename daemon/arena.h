/* SPDX-License-Identifier: MIT */
/*
 * arena.h - shared memory segments (arena.c).
 */
#pragma once

#include <stdint.h>

#include "gpu.h"
#include "gpu_worker.h"

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

/* Device memory (DevArena, gpu_worker.h): made and given back by the GPU's worker. */
int dev_arena_new(int device, uint64_t size, DevArena *ret);
void dev_arena_deinit(DevArena *a);
