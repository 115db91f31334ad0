/* SPDX-License-Identifier: MIT */
/*
 * crowd.h - is the machine crowded: more tasks ready to run than it has cores (crowd.c)?
 * A rank that spins while it waits takes a core; on a crowded machine that is the core the
 * rank it waits for needs, and every step then costs a spin.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct {
        uint64_t checked_ns; /* when /proc/loadavg was last read */
        long cores;
        bool crowded;
} DvCrowd;

void dv_crowd_init(DvCrowd *c);
bool dv_crowded(DvCrowd *c, uint64_t now_ns);
