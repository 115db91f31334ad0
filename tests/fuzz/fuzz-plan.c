/* SPDX-License-Identifier: MIT */
/*
 * fuzz-plan.c - descriptors as hostile ranks write them, through devald's validator and
 * into the plan builder: every descriptor dv_desc_check() accepts lies inside its arena,
 * and every segment of every plan built from accepted ones reads inside its rank's tensor
 * and writes inside the output. Any violation aborts.
 *
 * Input: a byte of world size, one of tensors per rank, one of flags, then per rank its
 * arena size and valid rows, then per tensor a compact descriptor (dtype, ndim, dims,
 * offset, nbytes; flag 0x20 makes nbytes match the shape so that plans get built).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "check.h"
#include "dtype.h"
#include "plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
        const uint8_t *p;
        size_t n;
} In;

static uint64_t take(In *in, size_t bytes) {
        uint64_t v = 0;
        for (size_t i = 0; i < bytes; i++) {
                v |= (uint64_t)(in->n ? *in->p : 0) << (8 * i);
                if (in->n) {
                        in->p++;
                        in->n--;
                }
        }
        return v;
}

static void check_seg(const DvPlan *p, const DvSeg *s, const uint64_t *nbytes, int ntensors,
                      int world, bool gather) {
        uint64_t span;
        if (s->count == 0 || s->len == 0)
                return;
        if (__builtin_mul_overflow(s->count - 1, s->dst_stride, &span) ||
            __builtin_add_overflow(span, s->len, &span) ||
            __builtin_add_overflow(span, s->dst, &span) || span > p->out_end)
                abort(); /* writes past the output */
        if (s->kind != DV_SEG_COPY)
                return;
        /* a gather's segment names the rank's input tensor; a pad's names its output (one
         * per rank) and reads the rank's only input */
        if (s->rank < 0 || s->rank >= world || s->tensor < 0 ||
            s->tensor >= (gather ? ntensors : world))
                abort();
        uint64_t have = gather ? nbytes[s->rank * ntensors + s->tensor] : nbytes[s->rank];
        if (__builtin_mul_overflow(s->count - 1, s->src_stride, &span) ||
            __builtin_add_overflow(span, s->len, &span) ||
            __builtin_add_overflow(span, s->src, &span) || span > have)
                abort(); /* reads past the rank's tensor */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        In in = {data, size};
        int world = 1 + (int)(take(&in, 1) % 8);
        int ntensors = 1 + (int)(take(&in, 1) % 4);
        unsigned flags = (unsigned)take(&in, 1);
        uint64_t arena[8];
        int64_t valid[8];
        DvShape shapes[8 * 4];
        uint64_t nbytes[8 * 4];
        for (int k = 0; k < world; k++) {
                arena[k] = take(&in, 3) * 8;
                valid[k] = (flags & 8) ? (int16_t)take(&in, 2) : -1;
        }
        for (int k = 0; k < world; k++)
                for (int i = 0; i < ntensors; i++) {
                        DvTensorDesc t = {0};
                        t.dtype = (int8_t)take(&in, 1);
                        t.ndim = (int8_t)take(&in, 1);
                        for (int d = 0; d < DEVAL_MAX_DIMS; d++)
                                t.shape[d] = d < 4 ? (int16_t)take(&in, 2) : 1;
                        t.offset = take(&in, 2) * 8;
                        t.nbytes = take(&in, 3);
                        if ((flags & 0x20) && dv_dtype_valid(t.dtype) && t.ndim >= 0 &&
                            t.ndim <= DEVAL_MAX_DIMS) {
                                int64_t numel = 1;
                                bool ok = true;
                                for (int d = 0; d < t.ndim && ok; d++)
                                        ok = t.shape[d] >= 0 &&
                                             !__builtin_mul_overflow(numel, t.shape[d], &numel);
                                if (ok)
                                        t.nbytes = (uint64_t)numel * dv_dtype_size(t.dtype);
                        }
                        if (dv_desc_check(&t, arena[k], true) != DV_DESC_OK)
                                return 0; /* devald fails the step here */
                        if (t.offset > arena[k] || t.nbytes > arena[k] - t.offset)
                                abort(); /* accepted, yet outside its arena */
                        shapes[k * ntensors + i] = (DvShape){.dtype = t.dtype, .ndim = t.ndim};
                        memcpy(shapes[k * ntensors + i].shape, t.shape, sizeof(t.shape));
                        nbytes[k * ntensors + i] = t.nbytes;
                }
        DvPlan p;
        dv_plan_init(&p);
        if (flags & 0x10) { /* pad_across_processes of each rank's first tensor */
                DvShape first[8];
                uint64_t nb[8];
                for (int k = 0; k < world; k++) {
                        first[k] = shapes[k * ntensors];
                        nb[k] = nbytes[k * ntensors];
                }
                int dim = (int)take(&in, 1) % 5;
                if (dv_plan_pad(world, first, dim, flags & 2, 0.0, 0, 1ull << 32, &p) == 0)
                        for (size_t s = 0; s < p.nsegs; s++)
                                check_seg(&p, &p.segs[s], nb, 1, world, false);
        } else {
                DvPlanInput pi = {.world = world,
                                  .ntensors = ntensors,
                                  .in = shapes,
                                  .valid_rows = valid,
                                  .keep_rows = (flags & 4) ? (int16_t)take(&in, 2) : -1,
                                  .order = flags & 1,
                                  .pad_first = flags & 2,
                                  .max_out = 1ull << 32};
                if (dv_plan_gather(&pi, &p) == 0) {
                        if (p.out_end > pi.max_out)
                                abort();
                        for (size_t s = 0; s < p.nsegs; s++)
                                check_seg(&p, &p.segs[s], nbytes, ntensors, world, true);
                }
        }
        dv_plan_deinit(&p);
        return 0;
}
