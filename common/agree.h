/* SPDX-License-Identifier: MIT */
/*
 * agree.h - the step's contract: what the ranks' requests for one step must agree on, and the
 * words that say where they do not (agree.c). Every executor of a step (devald's worker, the
 * spanning step) checks through dv_agree(), so that a step fails alike, status and message,
 * wherever it runs; each adapts it with its own words for a rank and its own check of where
 * a rank's bytes lie.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

typedef struct DvAgree DvAgree;

struct DvAgree {
        const DvRequest *q; /* [world]: the step's requests, copied out of reach of the ranks */
        int world;
        uint32_t call;  /* the collective's number, as the ranks count their calls (wire.h) */
        bool pass_open; /* an eval pass is open: its gathers for metrics count by stream */
        /* rank k, in the executor's words, where a message names one rank as the culprit
         * ("rank 3 (pid 812)", "rank 3 (node 1)") */
        void (*who)(const DvAgree *a, int k, char *buf, size_t len);
        /* the executor's check of rank k's tensor i (with_data: its bytes are read): 0, or a
         * status with its words in msg */
        int (*desc)(const DvAgree *a, int k, int i, bool with_data);
        void *ctx; /* the executor's */
        /* why the step fails; NULL asks for the try mode: a fast path that declines what does
         * not agree, for an executor that names it, pays for no words (who is never called) */
        char *msg;
        size_t msg_len;
};

int dv_agree(DvAgree *a);
int dv_agree_fail(DvAgree *a, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
int dv_pass_stream(bool pass_open, const DvRequest *q);
/* Whether q (every rank's alike, once agreed) is a call of an open pass that no stream counts
 * and that says where its batch starts (DV_SITE_BASED): dv_pass_plan_based() plans it. */
bool dv_pass_based(bool pass_open, const DvRequest *q);
