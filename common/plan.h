/* SPDX-License-Identifier: MIT */
/*
 * plan.h - the plan: a pure function from every rank's tensor shapes and the options of a
 * collective to the output shapes and the list of copy and fill segments that build the
 * output. The daemon's backends only execute plans; the unit tests check plans against a
 * naive reference.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deval.h"

#include "wire.h"

typedef struct {
        int32_t dtype;
        int32_t ndim;
        int64_t shape[DEVAL_MAX_DIMS];
} DvShape;

enum {
        DV_SEG_COPY = 1,
        DV_SEG_FILL = 2
};

/*
 * count pieces of len bytes: piece c copies from src + c * src_stride of rank's tensor
 * (src is relative to the start of that tensor in the rank's input) to dst + c * dst_stride
 * of the output arena, or fills it with the tensor's pad element.
 */
typedef struct {
        int32_t kind;
        int32_t rank;
        int32_t tensor; /* index of the input (gather) or of the output (pad) it serves */
        int32_t reserved;
        uint64_t src;
        uint64_t dst;
        uint64_t len;
        uint64_t count;
        uint64_t src_stride;
        uint64_t dst_stride;
} DvSeg;

/* count samples of rank starting at its sample first, in output order. */
typedef struct {
        int32_t rank;
        int32_t reserved;
        int64_t first;
        int64_t count;
} DvRun;

typedef struct {
        int world;
        int ntensors;
        const DvShape *in;         /* [rank * ntensors + i] */
        const int64_t *valid_rows; /* [world]; < 0: all rows */
        int64_t keep_rows;         /* < 0: all */
        int order;                 /* DEVAL_ORDER_* */
        bool pad_first;
        double pad_value;
        bool in_pass; /* an eval pass assigns dataset positions and drops those past the end */
        int64_t num_samples;
        int64_t pass_total;       /* rank order: samples the pass has gathered so far */
        const int64_t *pass_rows; /* strided order: [world] samples each rank gave so far */
        uint64_t out_base;        /* where the first output tensor starts in the output arena */
        uint64_t max_out;         /* the output may not end past this offset */
} DvPlanInput;

typedef struct {
        int nout;
        DvShape *out;         /* [nout] output shapes */
        uint64_t *out_offset; /* [nout] in the output arena, DV_ARENA_ALIGN aligned */
        uint64_t *out_nbytes; /* [nout] */
        uint8_t (*fill)[8];   /* [nout] the pad element of each output */
        uint64_t out_end;     /* end of the last output */
        DvSeg *segs;
        size_t nsegs, segs_cap;
        DvRun *runs;
        size_t nruns, runs_cap;
        int64_t samples;      /* samples in the result */
        int64_t *contributed; /* [world] samples each rank gave after valid_rows */
        /* [2 * world]: each rank's open copy segment, then its open fill segment, which a
         * piece of the same tensor may extend; SIZE_MAX: none */
        size_t *open;
        size_t out_cap, world_cap, open_cap; /* what the arrays hold, kept for reuse */
        int open_world;
        char err[DV_MSG_MAX];
} DvPlan;

void dv_plan_init(DvPlan *p);
void dv_plan_deinit(DvPlan *p);
void dv_plan_reset(DvPlan *p);
int dv_plan_gather(const DvPlanInput *in, DvPlan *p);
int dv_plan_pad(int world, const DvShape *in, int dim, bool pad_first, double pad_value,
                uint64_t out_base, uint64_t max_out, DvPlan *p);
/* One stream's counters of an eval pass, as a rank left them in shared memory: each rank's
 * count within 0..total, their sum the total, the total within 0..2^50. */
bool dv_pass_counts_ok(const int64_t *rows, int world, int64_t total);
/* A descriptor's shape, and a descriptor of shape at offset. */
DvShape dv_shape_of(const DvTensorDesc *t);
void dv_desc_of(const DvShape *sh, uint64_t offset, uint64_t nbytes, DvTensorDesc *t);
/* A gather's result res as rank gets it: with a root (>= 0), a rank other than the root gets
 * every tensor with no rows. */
void dv_root_only(DvResult *res, int root, int rank);
/* Bytes of one sample (row) of shape, and its element count; false on overflow. */
bool dv_shape_numel(const DvShape *s, int64_t *ret);

/* Samples of one stream of an eval pass whose dataset position is inside the pass: what the
 * pass returned from it (rows: [world] each rank's count, for strided order). */
int64_t dv_pass_kept(int64_t num_samples, int order, int64_t total, const int64_t *rows, int world);
/* A finished rank's part of tmpl's collective (seq): no rows, tmpl's dtypes and trailing dims. */
void dv_req_empty(DvRequest *q, const DvRequest *tmpl, uint32_t seq);
/* Objects: prefix[0..n] from n item lengths (i64, at lens, any alignment); false when one is
 * negative or they do not add up to total. */
bool dv_objects_prefix(const uint8_t *lens, int64_t n, int64_t total, int64_t *prefix);
/* The bytes of the items plan p (of the lengths) keeps: prefix[k] is rank k's. */
uint64_t dv_objects_bytes(const DvPlan *p, int64_t *const *prefix);
/* Its result: p->samples lengths (i64) at out, the items' bytes at out + blob_off; blobs[k]
 * is rank k's bytes. */
void dv_objects_copy(const DvPlan *p, int64_t *const *prefix, const uint8_t *const *blobs,
                     uint8_t *out, uint64_t blob_off);
