/* SPDX-License-Identifier: MIT */
/*
 * plan.c - turn ragged per-rank tensors into output shapes and copy/fill segments.
 *
 * Gather: each rank's samples past valid_rows are dropped, the rest are ordered (rank order
 * concatenates, strided order deals round-robin), an eval pass drops samples whose dataset
 * position is past its end, keep_rows keeps a prefix, and every tensor's non-leading dims are
 * padded to the largest size any rank has. Segments are produced by walking each sample
 * block dim by dim and merged on the fly into strided pieces, so a block whose only ragged
 * dim is the last becomes one segment.
 */
#include "plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "util.h"

void dv_plan_init(DvPlan *p) {
        memset(p, 0, sizeof(*p));
}

/* Ready p for another plan, keeping what it allocated. */
void dv_plan_reset(DvPlan *p) {
        p->nout = 0;
        p->out_end = 0;
        p->nsegs = 0;
        p->nruns = 0;
        p->samples = 0;
        p->open_world = 0;
        p->err[0] = '\0';
}

void dv_plan_deinit(DvPlan *p) {
        free(p->out);
        free(p->out_offset);
        free(p->out_nbytes);
        free(p->fill);
        free(p->segs);
        free(p->runs);
        free(p->contributed);
        free(p->open);
        dv_plan_init(p);
}

static int plan_fail(DvPlan *p, int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, sizeof(p->err), fmt, ap);
        va_end(ap);
        return status;
}

bool dv_pass_counts_ok(const int64_t *rows, int world, int64_t total) {
        if (total < 0 || total > (1ll << 50))
                return false;
        int64_t sum = 0;
        for (int k = 0; k < world; k++) {
                if (rows[k] < 0 || rows[k] > total)
                        return false;
                sum += rows[k];
        }
        return sum == total;
}

DvShape dv_shape_of(const DvTensorDesc *t) {
        DvShape sh = {.dtype = t->dtype, .ndim = t->ndim};
        memcpy(sh.shape, t->shape, sizeof(sh.shape));
        return sh;
}

void dv_desc_of(const DvShape *sh, uint64_t offset, uint64_t nbytes, DvTensorDesc *t) {
        memset(t, 0, sizeof(*t));
        t->dtype = sh->dtype;
        t->ndim = sh->ndim;
        memcpy(t->shape, sh->shape, sizeof(t->shape));
        t->offset = offset;
        t->nbytes = nbytes;
}

/** dv_root_only() - see plan.h. */
void dv_root_only(DvResult *res, int root, int rank) {
        for (uint32_t i = 0; root >= 0 && root != rank && i < res->ntensors; i++) {
                res->t[i].shape[0] = 0;
                res->t[i].nbytes = 0;
                res->t[i].offset = 0;
        }
}

bool dv_shape_numel(const DvShape *s, int64_t *ret) {
        int64_t n = 1;
        for (int d = 0; d < s->ndim; d++)
                if (!dv_mul_ok(n, s->shape[d], &n))
                        return false;
        *ret = n;
        return true;
}

/* Grow *arr to n elements of size es (kept for reuse, dv_plan_reset()); its first n zeroed. */
static bool plan_array(void *arr, size_t *cap, size_t n, size_t es) {
        void **a = arr;
        if (n > *cap) {
                void *p = realloc(*a, n * es);
                if (!p)
                        return false;
                *a = p;
                *cap = n;
        }
        memset(*a, 0, n * es);
        return true;
}

static int plan_alloc_outputs(DvPlan *p, int nout, int world) {
        size_t n = (size_t)DV_MAX(nout, 1), cap = p->out_cap;
        p->nout = nout;
        bool ok = plan_array(&p->out, &cap, n, sizeof(*p->out));
        cap = p->out_cap;
        ok = ok && plan_array(&p->out_offset, &cap, n, sizeof(*p->out_offset));
        cap = p->out_cap;
        ok = ok && plan_array(&p->out_nbytes, &cap, n, sizeof(*p->out_nbytes));
        cap = p->out_cap;
        ok = ok && plan_array(&p->fill, &cap, n, sizeof(*p->fill));
        if (ok)
                p->out_cap = cap;
        ok = ok &&
             plan_array(&p->contributed, &p->world_cap, (size_t)world, sizeof(*p->contributed));
        ok = ok && plan_array(&p->open, &p->open_cap, 2 * (size_t)world, sizeof(*p->open));
        if (!ok)
                return plan_fail(p, DEVAL_ENOMEM, "out of memory while planning");
        p->open_world = world;
        return 0;
}

/* Start a tensor: no segment is open for merging. */
static void segs_close(DvPlan *p) {
        for (size_t k = 0; k < 2 * (size_t)p->open_world; k++)
                p->open[k] = SIZE_MAX;
}

static DvSeg *seg_push(DvPlan *p) {
        if (p->nsegs == p->segs_cap) {
                size_t cap = p->segs_cap ? p->segs_cap * 2 : 64;
                DvSeg *s = realloc(p->segs, cap * sizeof(*s));
                if (!s)
                        return NULL;
                p->segs = s;
                p->segs_cap = cap;
        }
        DvSeg *s = &p->segs[p->nsegs++];
        memset(s, 0, sizeof(*s));
        return s;
}

/*
 * Append one piece, extending the open segment of the same kind and rank when the piece
 * continues it: contiguously (a longer piece) or at the same stride (one more piece). Every
 * segment writes bytes no other writes, so each rank keeps an open segment of each kind: in
 * strided order, where the ranks' rows alternate, each rank's rows still make one segment.
 */
static int seg_add(DvPlan *p, int kind, int tensor, int rank, uint64_t src, uint64_t dst,
                   uint64_t len) {
        size_t *open = &p->open[(kind == DV_SEG_COPY ? 0 : (size_t)p->open_world) + (size_t)rank];

        if (len == 0)
                return 0;
        if (*open != SIZE_MAX) {
                DvSeg *s = &p->segs[*open];
                bool same = s->tensor == tensor && s->rank == rank;
                if (same && s->count == 1 && s->dst + s->len == dst &&
                    (kind == DV_SEG_FILL || s->src + s->len == src)) {
                        s->len += len;
                        return 0;
                }
                if (same && s->len == len) {
                        if (s->count == 1 && dst > s->dst &&
                            (kind == DV_SEG_FILL || src > s->src)) {
                                s->src_stride = kind == DV_SEG_COPY ? src - s->src : 0;
                                s->dst_stride = dst - s->dst;
                                s->count = 2;
                                return 0;
                        }
                        if (s->count > 1 && dst == s->dst + s->count * s->dst_stride &&
                            (kind == DV_SEG_FILL || src == s->src + s->count * s->src_stride)) {
                                s->count++;
                                return 0;
                        }
                }
        }
        DvSeg *s = seg_push(p);
        if (!s)
                return plan_fail(p, DEVAL_ENOMEM, "out of memory while planning");
        *s = (DvSeg){.kind = kind,
                     .rank = rank,
                     .tensor = tensor,
                     .src = src,
                     .dst = dst,
                     .len = len,
                     .count = 1};
        *open = (size_t)(s - p->segs);
        return 0;
}

typedef struct {
        DvPlan *p;
        int tensor, rank, ndim;
        bool pad_first;
        const int64_t *sd, *dd;
        uint64_t svol[DEVAL_MAX_DIMS + 1], dvol[DEVAL_MAX_DIMS + 1]; /* bytes from dim k on */
} Block;

static int block_dim(Block *b, int k, uint64_t src, uint64_t dst) {
        if (b->svol[k] == 0)
                return seg_add(b->p, DV_SEG_FILL, b->tensor, b->rank, 0, dst, b->dvol[k]);
        if (b->svol[k] == b->dvol[k]) /* no dim from k on differs: one contiguous piece */
                return seg_add(b->p, DV_SEG_COPY, b->tensor, b->rank, src, dst, b->svol[k]);

        uint64_t pad = (uint64_t)(b->dd[k] - b->sd[k]);
        uint64_t off = b->pad_first ? pad : 0;
        if (b->svol[k + 1] == b->dvol[k + 1]) {
                /* only this dim differs: its sd[k] sub-blocks are contiguous on both sides */
                int r = seg_add(b->p, DV_SEG_COPY, b->tensor, b->rank, src,
                                dst + off * b->dvol[k + 1], (uint64_t)b->sd[k] * b->svol[k + 1]);
                if (r < 0)
                        return r;
        } else {
                for (int64_t i = 0; i < b->sd[k]; i++) {
                        int r = block_dim(b, k + 1, src + (uint64_t)i * b->svol[k + 1],
                                          dst + ((uint64_t)i + off) * b->dvol[k + 1]);
                        if (r < 0)
                                return r;
                }
        }
        uint64_t pad_at = b->pad_first ? 0 : (uint64_t)b->sd[k] * b->dvol[k + 1];
        return seg_add(b->p, DV_SEG_FILL, b->tensor, b->rank, 0, dst + pad_at,
                       pad * b->dvol[k + 1]);
}

/*
 * Emit segments that copy a block of source dims sd into destination dims dd (each dd[k] >=
 * sd[k]), padding every dim where they differ. Sizes were checked against max_out already,
 * so the byte volumes below cannot overflow.
 */
static int block_emit(DvPlan *p, int tensor, int rank, int ndim, size_t es, const int64_t *sd,
                      const int64_t *dd, bool pad_first, uint64_t src, uint64_t dst) {
        Block b = {.p = p,
                   .tensor = tensor,
                   .rank = rank,
                   .ndim = ndim,
                   .pad_first = pad_first,
                   .sd = sd,
                   .dd = dd};
        b.svol[ndim] = b.dvol[ndim] = es;
        for (int k = ndim - 1; k >= 0; k--) {
                b.svol[k] = b.svol[k + 1] * (uint64_t)sd[k];
                b.dvol[k] = b.dvol[k + 1] * (uint64_t)dd[k];
        }
        return block_dim(&b, 0, src, dst);
}

static int run_add(DvPlan *p, int rank, int64_t first, int64_t count) {
        if (count <= 0)
                return 0;
        if (p->nruns > 0) {
                DvRun *last = &p->runs[p->nruns - 1];
                if (last->rank == rank && last->first + last->count == first) {
                        last->count += count;
                        p->samples += count;
                        return 0;
                }
        }
        if (p->nruns == p->runs_cap) {
                size_t cap = p->runs_cap ? p->runs_cap * 2 : 16;
                DvRun *r = realloc(p->runs, cap * sizeof(*r));
                if (!r)
                        return plan_fail(p, DEVAL_ENOMEM, "out of memory while planning");
                p->runs = r;
                p->runs_cap = cap;
        }
        p->runs[p->nruns++] = (DvRun){.rank = rank, .first = first, .count = count};
        p->samples += count;
        return 0;
}

/* Order the samples that survived valid_rows, apply the pass's end and keep_rows. */
static int plan_order(const DvPlanInput *in, DvPlan *p) {
        int64_t keep = in->keep_rows < 0 ? INT64_MAX : in->keep_rows;
        int W = in->world;
        int r;

        if (in->order == DEVAL_ORDER_RANK) {
                int64_t limit = INT64_MAX;
                if (in->in_pass)
                        limit = in->num_samples > in->pass_total ? in->num_samples - in->pass_total
                                                                 : 0;
                limit = DV_MIN(limit, keep);
                for (int k = 0; k < W && p->samples < limit; k++) {
                        int64_t n = DV_MIN(p->contributed[k], limit - p->samples);
                        if ((r = run_add(p, k, 0, n)) < 0)
                                return r;
                }
                return 0;
        }

        /* Strided: rank k's j-th sample of the pass sits at dataset position (base_k + j)*W + k,
         * so sorting by position is sorting by t = base_k + j, then by rank. */
        int64_t tmin = INT64_MAX, tend = 0;
        for (int k = 0; k < W; k++) {
                int64_t base = in->in_pass ? in->pass_rows[k] : 0;
                if (p->contributed[k] == 0)
                        continue;
                tmin = DV_MIN(tmin, base);
                tend = DV_MAX(tend, base + p->contributed[k]);
        }
        for (int64_t t = tmin; t < tend && p->samples < keep; t++) {
                if (in->in_pass && t * W >= in->num_samples)
                        break;
                int64_t next = INT64_MAX; /* the next t some rank's rows start at */
                for (int k = 0; k < W && p->samples < keep; k++) {
                        int64_t base = in->in_pass ? in->pass_rows[k] : 0;
                        if (t < base || t >= base + p->contributed[k]) {
                                if (t < base && p->contributed[k])
                                        next = DV_MIN(next, base);
                                continue;
                        }
                        next = t + 1;
                        if (in->in_pass && t * W + k >= in->num_samples)
                                break;
                        if ((r = run_add(p, k, t - base, 1)) < 0)
                                return r;
                }
                if (next == INT64_MAX)
                        break;
                t = next - 1; /* (ranks' rows far apart: the gap, skipped) */
        }
        return 0;
}

static void shape_norm(const DvShape *s, DvShape *ret) {
        *ret = *s;
        if (ret->ndim == 0) { /* a 0-d tensor gathers as shape [1] */
                ret->ndim = 1;
                ret->shape[0] = 1;
        }
}

static int plan_out_bytes(DvPlan *p, int i, uint64_t *cursor, uint64_t max_out) {
        int64_t numel;
        int64_t bytes;
        if (!dv_shape_numel(&p->out[i], &numel) ||
            !dv_mul_ok(numel, (int64_t)dv_dtype_size(p->out[i].dtype), &bytes) ||
            (uint64_t)bytes > max_out)
                return plan_fail(p, DEVAL_ENOMEM,
                                 "output %d would be larger than the group's quota of %llu bytes",
                                 i, (unsigned long long)max_out);
        p->out_offset[i] = DV_ALIGN(*cursor, DV_ARENA_ALIGN);
        p->out_nbytes[i] = (uint64_t)bytes;
        if (p->out_offset[i] > max_out || (uint64_t)bytes > max_out - p->out_offset[i])
                return plan_fail(p, DEVAL_ENOMEM,
                                 "the result would be larger than the group's quota of %llu bytes",
                                 (unsigned long long)max_out);
        *cursor = p->out_offset[i] + (uint64_t)bytes;
        p->out_end = *cursor;
        return 0;
}

/**
 * dv_plan_gather() - plan a gather of in->ntensors tensors from in->world ranks.
 * @in: shapes and options; not modified.
 * @p: an initialised plan, filled on success; the caller deinits it in any case.
 *
 * Return: 0; DEVAL_EMISMATCH when the ranks' shapes cannot be gathered together (a dtype or
 * ndim that differs, or a tensor whose rows are not a whole multiple of the samples);
 * DEVAL_ENOMEM when the result would end past in->max_out or memory runs out. p->err says
 * what was wrong.
 */
int dv_plan_gather(const DvPlanInput *in, DvPlan *p) {
        int W = in->world, n = in->ntensors;
        int64_t k_rows[DEVAL_MAX_TENSORS];
        int r;

        if ((r = plan_alloc_outputs(p, n, W)) < 0)
                return r;

        for (int i = 0; i < n; i++) {
                DvShape first;
                shape_norm(&in->in[i], &first);
                p->out[i] = first;
                for (int d = 1; d < first.ndim; d++)
                        p->out[i].shape[d] = 0;
                k_rows[i] = -1;
                for (int k = 0; k < W; k++) {
                        DvShape s, s0;
                        shape_norm(&in->in[k * n + i], &s);
                        if (s.dtype != first.dtype)
                                return plan_fail(p, DEVAL_EMISMATCH,
                                                 "ranks disagree on tensor %d's dtype: rank 0 has "
                                                 "%s, rank %d has %s",
                                                 i, dv_dtype_name(first.dtype), k,
                                                 dv_dtype_name(s.dtype));
                        if (s.ndim != first.ndim)
                                return plan_fail(p, DEVAL_EMISMATCH,
                                                 "ranks disagree on tensor %d's ndim: rank 0 has "
                                                 "%d, rank %d has %d",
                                                 i, first.ndim, k, s.ndim);
                        for (int d = 1; d < s.ndim; d++)
                                p->out[i].shape[d] = DV_MAX(p->out[i].shape[d], s.shape[d]);
                        if (i == 0)
                                continue;
                        shape_norm(&in->in[k * n], &s0);
                        int64_t samples = s0.shape[0];
                        if (samples == 0 ? s.shape[0] != 0 : s.shape[0] % samples != 0)
                                return plan_fail(p, DEVAL_EMISMATCH,
                                                 "tensor %d has %lld rows on rank %d for %lld "
                                                 "samples; every tensor needs the same whole "
                                                 "number of rows per sample",
                                                 i, (long long)s.shape[0], k, (long long)samples);
                        if (samples == 0)
                                continue;
                        int64_t kk = s.shape[0] / samples;
                        if (k_rows[i] >= 0 && kk != k_rows[i])
                                return plan_fail(p, DEVAL_EMISMATCH,
                                                 "ranks disagree on tensor %d's rows per sample: "
                                                 "%lld on one rank, %lld on rank %d",
                                                 i, (long long)k_rows[i], (long long)kk, k);
                        k_rows[i] = kk;
                }
                if (i == 0)
                        k_rows[0] = 1;
                if (k_rows[i] < 0)
                        k_rows[i] = 0;
                dv_dtype_encode(first.dtype, in->pad_value, p->fill[i]);
        }

        for (int k = 0; k < W; k++) {
                DvShape s0;
                shape_norm(&in->in[k * n], &s0);
                int64_t c = n > 0 ? s0.shape[0] : 0;
                if (in->valid_rows[k] >= 0)
                        c = DV_MIN(c, in->valid_rows[k]);
                p->contributed[k] = c;
        }
        if ((r = plan_order(in, p)) < 0)
                return r;

        uint64_t cursor = in->out_base;
        for (int i = 0; i < n; i++) {
                if (!dv_mul_ok(p->samples, k_rows[i], &p->out[i].shape[0]))
                        return plan_fail(p, DEVAL_EINVAL, "tensor %d's size overflows", i);
                if ((r = plan_out_bytes(p, i, &cursor, in->max_out)) < 0)
                        return r;
        }

        for (int i = 0; i < n; i++) {
                size_t es = dv_dtype_size(p->out[i].dtype);
                int nd = p->out[i].ndim;
                uint64_t drow = p->out_nbytes[i];
                if (p->out[i].shape[0] > 0)
                        drow /= (uint64_t)p->out[i].shape[0];
                uint64_t dst = p->out_offset[i];
                segs_close(p);
                for (size_t j = 0; j < p->nruns; j++) {
                        const DvRun *run = &p->runs[j];
                        DvShape s;
                        shape_norm(&in->in[run->rank * n + i], &s);
                        int64_t sd[DEVAL_MAX_DIMS], dd[DEVAL_MAX_DIMS];
                        uint64_t srow = es;
                        for (int d = 1; d < nd; d++) {
                                sd[d] = s.shape[d];
                                dd[d] = p->out[i].shape[d];
                                srow *= (uint64_t)s.shape[d];
                        }
                        sd[0] = dd[0] = run->count * k_rows[i];
                        uint64_t src = (uint64_t)(run->first * k_rows[i]) * srow;
                        if ((r = block_emit(p, i, run->rank, nd, es, sd, dd, in->pad_first, src,
                                            dst)) < 0)
                                return r;
                        dst += (uint64_t)sd[0] * drow;
                }
        }
        return 0;
}

/**
 * dv_plan_pad() - plan pad_across_processes: every rank's tensor padded along dim to the
 * largest size any rank has there, one output per rank.
 * @world: number of ranks; @in: [world] shapes; @dim: 0 <= dim < ndim, or a dim outside
 * the tensors (DV_PAD_OUTSIDE): each rank's tensor as it is, as Accelerate returns it.
 * @p: an initialised plan; p->out[k] is rank k's result.
 *
 * Return: 0; DEVAL_EMISMATCH when dtype or ndim differ; DEVAL_ENOMEM past max_out.
 */
int dv_plan_pad(int world, const DvShape *in, int dim, bool pad_first, double pad_value,
                uint64_t out_base, uint64_t max_out, DvPlan *p) {
        int64_t longest = 0;
        int r;

        if ((r = plan_alloc_outputs(p, world, world)) < 0)
                return r;
        bool outside = world < 1 || dim < 0 || dim >= in[0].ndim;
        for (int k = 0; k < world; k++) {
                if (in[k].dtype != in[0].dtype)
                        return plan_fail(p, DEVAL_EMISMATCH,
                                         "ranks disagree on the dtype: rank 0 has %s, rank %d has "
                                         "%s",
                                         dv_dtype_name(in[0].dtype), k, dv_dtype_name(in[k].dtype));
                if (in[k].ndim != in[0].ndim)
                        return plan_fail(
                                p, DEVAL_EMISMATCH,
                                "ranks disagree on the ndim: rank 0 has %d, rank %d has %d",
                                in[0].ndim, k, in[k].ndim);
                if (!outside)
                        longest = DV_MAX(longest, in[k].shape[dim]);
        }
        uint64_t cursor = out_base;
        for (int k = 0; k < world; k++) {
                p->out[k] = in[k];
                if (!outside)
                        p->out[k].shape[dim] = longest;
                dv_dtype_encode(in[k].dtype, pad_value, p->fill[k]);
                if ((r = plan_out_bytes(p, k, &cursor, max_out)) < 0)
                        return r;
        }
        for (int k = 0; k < world; k++) {
                segs_close(p);
                if ((r = block_emit(p, k, k, in[k].ndim, dv_dtype_size(in[k].dtype), in[k].shape,
                                    p->out[k].shape, pad_first, 0, p->out_offset[k])) < 0)
                        return r;
        }
        return 0;
}

int64_t dv_pass_kept(int64_t num_samples, int order, int64_t total, const int64_t *rows,
                     int world) {
        if (order == DEVAL_ORDER_RANK)
                return total < num_samples ? total : num_samples;
        int64_t kept = 0;
        for (int k = 0; k < world && k < num_samples; k++) { /* j-th sample at j * world + k */
                int64_t fit = (num_samples - k + world - 1) / world;
                kept += rows[k] < fit ? rows[k] : fit;
        }
        return kept;
}

void dv_req_empty(DvRequest *q, const DvRequest *tmpl, uint32_t seq) {
        memset(q, 0, sizeof(*q));
        q->seq = seq;
        q->call = tmpl->call;
        q->op = tmpl->op;
        q->ntensors = tmpl->ntensors < DEVAL_MAX_TENSORS ? tmpl->ntensors : DEVAL_MAX_TENSORS;
        q->pad_first = tmpl->pad_first;
        q->pad_value = tmpl->pad_value;
        q->valid_rows = -1;
        q->keep_rows = tmpl->keep_rows;
        q->order = tmpl->order;
        q->root = tmpl->root;
        q->dim = tmpl->dim;
        q->site = tmpl->site;
        q->names = tmpl->names;
        /* (the same call, uncounted alike, from where the others start: it adds no rows) */
        q->flags = tmpl->flags & (DV_SITE_UNCOUNTED | DV_SITE_BASED);
        q->base_total = tmpl->base_total;
        q->batch = tmpl->batch;
        bool gather = tmpl->op != DV_OP_PAD;
        for (uint32_t i = 0; i < q->ntensors; i++) {
                const DvTensorDesc *t = &tmpl->t[i];
                DvTensorDesc *d = &q->t[i];
                d->dtype = t->dtype;
                d->ndim = t->ndim;
                if (d->ndim == 0 && gather) /* a 0-d tensor gathers as one row */
                        d->ndim = 1;
                for (int k = 1; k < t->ndim && k < DEVAL_MAX_DIMS; k++)
                        d->shape[k] = t->shape[k];
        }
}

bool dv_objects_prefix(const uint8_t *lens, int64_t n, int64_t total, int64_t *prefix) {
        prefix[0] = 0;
        for (int64_t j = 0; j < n; j++) {
                int64_t len;
                memcpy(&len, lens + j * 8, 8);
                if (len < 0 || __builtin_add_overflow(prefix[j], len, &prefix[j + 1]))
                        return false;
        }
        return prefix[n] == total;
}

uint64_t dv_objects_bytes(const DvPlan *p, int64_t *const *prefix) {
        uint64_t bytes = 0;
        for (size_t j = 0; j < p->nruns; j++) {
                const DvRun *run = &p->runs[j];
                const int64_t *pre = prefix[run->rank];
                bytes += (uint64_t)(pre[run->first + run->count] - pre[run->first]);
        }
        return bytes;
}

void dv_objects_copy(const DvPlan *p, int64_t *const *prefix, const uint8_t *const *blobs,
                     uint8_t *out, uint64_t blob_off) {
        uint64_t li = 0, bo = 0;
        for (size_t j = 0; j < p->nruns; j++) {
                const DvRun *run = &p->runs[j];
                const int64_t *pre = prefix[run->rank];
                for (int64_t q = run->first; q < run->first + run->count; q++) {
                        int64_t len = pre[q + 1] - pre[q];
                        memcpy(out + li++ * 8, &len, 8);
                }
                uint64_t b = (uint64_t)(pre[run->first + run->count] - pre[run->first]);
                if (b)
                        memcpy(out + blob_off + bo, blobs[run->rank] + pre[run->first], b);
                bo += b;
        }
}
