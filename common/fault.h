/* SPDX-License-Identifier: MIT */
/*
 * fault.h - named fault points for the failure tests.
 *
 * Builds with -Dfault_injection=true (the default outside release builds) compile them
 * in; elsewhere DV_FAULT() is nothing. At a point, $DEVAL_FAULT decides what happens:
 *
 *     DEVAL_FAULT=PHASE:ACTION[:MS][@SEQ]
 *
 * PHASE names the point: in libdeval before_write (inputs not yet in the arena), before_arrive
 * (written, not yet announced), after_arrive (announced, not yet waiting), wait_done (waiting: the
 * step not seen done, a failure not yet looked for), wait_sleep (counted among the sleepers, the
 * step not yet looked at again); in the rank that runs a small step itself (fast.c) fast_run
 * (about to run it), fast_plan (garbage: a junk segment in the plan every rank copies from) and
 * fast_publish (its result written, not yet published); in every rank of such a step fast_share
 * (its share not yet copied) and fast_direct (its own rows checked, not yet copied); in every rank
 * of a step each runs by itself (mirror.c) mirror_post (its record not yet there) and mirror_run
 * (every record there, the step not yet run); in devald daemon_copy (a step validated, its copy
 * not done) and before_wake (results written, ranks not yet woken). ACTION is exit (_exit(3): no
 * goodbye), abort, sigkill, sigstop, sleep for MS milliseconds, or garbage, which the point itself
 * acts on (fast_publish: the result is overwritten with junk; fast_plan: a segment of the plan;
 * mirror_post: the rank's record). @SEQ limits it to collective number SEQ.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef DEVAL_FAULT_POINTS
void dv_fault(const char *phase, uint32_t seq);
bool dv_fault_says(const char *phase, uint32_t seq, const char *action);
#define DV_FAULT(phase, seq)              dv_fault(phase, seq)
#define DV_FAULT_SAYS(phase, seq, action) dv_fault_says(phase, seq, action)
#else
#define DV_FAULT(phase, seq)              ((void)0)
#define DV_FAULT_SAYS(phase, seq, action) false
#endif
