/* SPDX-License-Identifier: MIT */
/*
 * exec_host.h - the host backend's executor (exec_host.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon.h"

typedef struct {
        const DvPlan *plan;
        const uint8_t *(*src)(void *ctx, int rank, int tensor);
        void *ctx;
        uint8_t *out;
        bool stream; /* set by exec_host: write with non-temporal stores */
} ExecJob;
void exec_host(Group *g, const ExecJob *job);
void exec_pool_free(void *pool);
