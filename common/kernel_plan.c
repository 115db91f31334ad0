/* SPDX-License-Identifier: MIT */
/*
 * kernel_plan.c - flatten a plan's segments for the copy kernel.
 */
#include "kernel_plan.h"

#include "dtype.h"

/**
 * dv_kernel_plan() - describe p's segments as DvKernelSeg, with the first byte of each in
 * starts[] and the total in starts[p->nsegs].
 */
void dv_kernel_plan(const DvPlan *p, int per_rank, bool first_tensor, DvKernelSeg *segs,
                    uint64_t *starts) {
        uint64_t at = 0;
        for (size_t i = 0; i < p->nsegs; i++) {
                const DvSeg *s = &p->segs[i];
                DvKernelSeg *k = &segs[i];
                memset(k, 0, sizeof(*k));
                k->kind = s->kind == DV_SEG_COPY ? DV_KSEG_COPY : DV_KSEG_FILL;
                k->src = (uint32_t)(s->rank * per_rank + (first_tensor ? 0 : s->tensor));
                k->elem = (uint32_t)dv_dtype_size(p->out[s->tensor].dtype);
                memcpy(k->pat, p->fill[s->tensor], sizeof(k->pat));
                k->src_off = s->src;
                k->dst = s->dst;
                k->len = s->len;
                k->count = s->count;
                k->src_stride = s->src_stride;
                k->dst_stride = s->dst_stride;
                starts[i] = at;
                at += s->len * s->count;
        }
        starts[p->nsegs] = at;
}
