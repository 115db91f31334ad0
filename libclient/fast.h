/* SPDX-License-Identifier: MIT */
/*
 * fast.h - steps the ranks run without devald (fast.c): the last rank to arrive runs a small
 * host step, or plans it for every rank to copy a share of.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "deval.h"

#include "plan.h"
#include "wire.h"

/* May end bytes of this rank's input go to its inline bytes? */
bool dv_fast_inline_ok(const deval_group *g, uint64_t end);
/* Count this rank in at step seq; the last to arrive runs it, or hands it to devald. */
void dv_fast_arrive(deval_group *g, uint32_t seq);
/* The runner's plan of step seq is published: copy this rank's share of it. */
void dv_fast_share(deval_group *g, uint32_t seq);
bool dv_fast_share_due(const deval_group *g, uint32_t seq);
/* For devald's figures of step seq, which a rank ran. */
void dv_fast_stat(deval_group *g, uint32_t seq, int last, uint64_t first, uint64_t lastt);
/* A gather planned from in, copied from srcs into out; its descriptors in res. */
int dv_fast_gather_to(deval_group *g, const DvPlanInput *in, const uint8_t *const *srcs,
                      uint8_t *out, DvResult *res);
/* Plan p run by this rank, from srcs into out. */
int dv_plan_run(deval_group *g, const DvPlan *p, int per_rank, bool first_tensor,
                const uint8_t *const *srcs, uint8_t *out);
