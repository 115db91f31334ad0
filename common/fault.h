/* SPDX-License-Identifier: MIT */
/*
 * fault.h - named fault points for the failure tests.
 *
 * Builds with -Dfault_injection=true (the default outside release builds) compile them
 * in; elsewhere DV_FAULT() is nothing. At a point, $DEVAL_FAULT decides what happens:
 *
 *     DEVAL_FAULT=PHASE:ACTION[:MS][@SEQ]
 *
 * PHASE names the point: in libdeval before_write (inputs not yet in the arena),
 * before_arrive (written, not yet announced), after_arrive (announced, not yet waiting);
 * in devald daemon_copy (a step validated, its copy not done) and before_wake (results
 * written, ranks not yet woken). ACTION is exit (_exit(3): no goodbye), abort, sigkill,
 * sigstop, or sleep for MS milliseconds. @SEQ limits it to collective number SEQ.
 */
#pragma once

#include <stdint.h>

#ifdef DEVAL_FAULT_POINTS
void dv_fault(const char *phase, uint32_t seq);
#define DV_FAULT(phase, seq) dv_fault(phase, seq)
#else
#define DV_FAULT(phase, seq) ((void)0)
#endif
