/* SPDX-License-Identifier: MIT */
/*
 * progress.h - how far a group's open eval pass has come, for figures alone (deval-ctl
 * watch, a progress bar on rank 0), read from the group's control segment without a
 * collective: each rank publishes its batches and its state in its slot (and, in a pass with
 * keys, the samples its batches held); the executors of a pass by position keep its counters
 * (DvPassShared), which are exact after each step. Ranks write all of it: it is read once,
 * clamped, and never used for anything but display.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

/* One rank's part of the pass. */
typedef struct {
        uint32_t state;   /* DV_PASS_RANK_* */
        uint32_t batches; /* its batches so far */
        int64_t samples;  /* the samples it gave so far */
} DvRankProgress;

/* A rank opens its pass (num_samples; in a pass with keys, keyed: it counts its samples). */
void dv_progress_begin(DvSlot *s, int64_t num_samples, bool keyed);
/* ... starts its batch no (1, 2, ...), which holds n samples (a pass with keys; else 0) */
void dv_progress_batch(DvSlot *s, uint32_t no, int64_t n);
/* ... ended its pass */
void dv_progress_end(DvSlot *s);

/*
 * The pass of the group whose control segment h has world ranks, and whose pass counters
 * are sh: into *p (total -1 when none is open; age_us is the caller's) and, when ranks is not
 * NULL, each rank's into ranks[world]. Return: whether a pass is open.
 */
bool dv_progress_read(const DvCtlHeader *h, const DvPassShared *sh, int world, DvPassInfo *p,
                      DvRankProgress *ranks);
