/* SPDX-License-Identifier: MIT */
/*
 * kernel_plan.h - a plan flattened for the copy kernel (see kernel_body.h).
 */
#pragma once

#include "kernel_body.h"
#include "plan.h"

/*
 * Flatten p's segments into segs[p->nsegs] and starts[p->nsegs + 1]. A copy reads source
 * table entry rank * per_rank + tensor (per_rank = 1 and tensor 0 for pad plans: pass
 * first_tensor).
 */
void dv_kernel_plan(const DvPlan *p, int per_rank, bool first_tensor, DvKernelSeg *segs,
                    uint64_t *starts);
