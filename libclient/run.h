/* SPDX-License-Identifier: MIT */
/*
 * run.h - where a collective runs, and its result (run.c): the one interface an entry point
 * calls once its request is staged in this rank's slot (stage.h).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "deval.h"

#include "wire.h"

/* Only the process that joined may use the handle. Return: 0, or DEVAL_EINVAL with why. */
int dv_coll_owner(deval_group *g);
/* Is the next collective answered from what was kept (a replay, a resumed pass's journal),
 * taking no step? */
bool dv_coll_kept(const deval_group *g);
/* Would a collective that begins now take a step? dv_coll_begin()'s checks, without their
 * side effects. */
bool dv_coll_steps(const deval_group *g);
/* A collective may start: the group has not failed or been aborted (a failure sticks). */
int dv_coll_begin(deval_group *g);
/*
 * Run the collective in this rank's request and point *ret at its result: from a replay, a
 * spanning group's step, or the group's (dv_coll_wait()). Return: 0, the step's status with
 * its message, or the group's failure.
 */
int dv_coll_run(deval_group *g, const char *fn, const DvResult **ret);
/* dv_coll_run() on this machine's group; pass_end: the request is an eval_end (replay.c). */
int dv_coll_wait(deval_group *g, const char *fn, bool pass_end, const DvResult **ret);
/*
 * This rank could not stage its input (status, bytes): over the quota or out of memory,
 * every rank must learn it, so it arrives with the failure. Return: the step's status.
 */
int dv_stage_failed(deval_group *g, const char *fn, DvRequest *q, int status, uint64_t bytes);
