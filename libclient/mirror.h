/* SPDX-License-Identifier: MIT */
/*
 * mirror.h - small reduces, gathers and barriers every rank runs by itself (mirror.c).
 */
#pragma once

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>

#include "deval.h"

#include "plan.h"
#include "wire.h"

#define DV_MIRROR_KNOWN 4

/* What a rank keeps to mirror steps: the handle's mirror. */
typedef struct {
        bool on;        /* small reduces and barriers may be ($DEVAL_MIRROR=0: never) */
        int next;       /* the first rank whose record of the step is not seen yet */
        uint64_t bytes; /* rank 0: bytes of the results of those steps, for devald */
        DvRequest req;  /* its copy of its own request, with one tensor */
        DvMirror own;   /* this rank's description of the step in flight */
        DvMirror *recs; /* [world]: copies of the records of a step */
        /* a record of each step dv_agree() accepted lately: records that all describe one of
         * them again need not be asked about (a loop's reduces and barriers, step after step) */
        DvMirror known_steps[DV_MIRROR_KNOWN];
        int nknown, next_known;
        bool known;           /* this rank's step is one of them */
        DvShape *shapes;      /* [world]: a mirrored gather's inputs */
        int64_t *valid;       /* [world] */
        const uint8_t **srcs; /* [world] */
        DvResult res;         /* the result of the last one */
        alignas(64) uint8_t out[DV_MIRROR_OUT];
} DvMirrorState;

/* Describe step seq in this rank's record. Return: whether this rank may mirror it. */
bool dv_mirror_post(deval_group *g, uint32_t seq, uint64_t now);
/* Run step seq here once every record is there: 1 run, 0 not yet, -1 not a step to mirror. */
int dv_mirror_run(deval_group *g, uint32_t seq);
