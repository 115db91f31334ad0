/* SPDX-License-Identifier: MIT */
/*
 * collective.c - libdeval's collectives (deval.h): gathers, objects, pad, reduce, broadcast,
 * barrier. Each checks its arguments, stages its request (stage.h), runs it (run.h) and
 * hands back views of the result.
 */
#define _GNU_SOURCE
#include "collective.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "arena.h"
#include "dtype.h"
#include "fast.h"
#include "gpu.h"
#include "handle.h"
#include "ident.h"
#include "run.h"
#include "stage.h"
#include "util.h"

static const deval_gather_opts default_opts = DEVAL_GATHER_OPTS_INIT;

/*
 * A call's own checks refused it (r is DEVAL_EINVAL and g->seq is still seq, what it was
 * when the call began: nothing was sent). The others make this call too, and a rank that
 * skipped it would pair its next call with theirs: a wrong result, without an error, where
 * the next call is of the same kind. So it still takes its step, as a refusal with its own
 * words, and every rank's call there fails naming it; this rank keeps its own message. A
 * call that takes no step (a replay, a resumed pass's journal, a failed group) refuses alone.
 */
static int refused(deval_group *g, const char *fn, uint32_t op, uint32_t seq, int r) {
        if (r != DEVAL_EINVAL || !g || g->seq != seq || !dv_coll_steps(g))
                return r;
        char own[sizeof(g->errmsg)];
        memcpy(own, g->errmsg, sizeof(own));
        DvRequest *q;
        const DvResult *res;
        if (dv_req_start(g, op, &q) < 0)
                return r;
        q->status = DEVAL_EINVAL;
        snprintf(q->why, sizeof(q->why), "%s", own);
        int s = dv_coll_run(g, fn, &res);
        if (s != DEVAL_EINVAL) /* (the group failed meanwhile: that says more) */
                return s < 0 ? s : dv_set_err(g, DEVAL_EPROTO, "%s: devald accepted a refusal", fn);
        return dv_set_err(g, DEVAL_EINVAL, "%s", own);
}

static int gather_common(deval_group *g, uint32_t op, const char *fn, int n,
                         const deval_tensor in[], const deval_gather_opts *opts,
                         deval_tensor out[]) {
        const DvResult *res;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (n < 1 || n > DEVAL_MAX_TENSORS)
                return dv_set_err(g, DEVAL_EINVAL, "%s: n is %d, not 1..%d", fn, n,
                                  DEVAL_MAX_TENSORS);
        if (!in || !out)
                return dv_set_err(g, DEVAL_EINVAL, "%s: in or out is NULL", fn);
        deval_gather_opts own;
        if (!opts)
                opts = &default_opts;
        else if ((r = dv_take_opts(g, fn, opts, &own)) < 0)
                return r;
        else
                opts = &own;
        if ((r = dv_check_opts(g, fn, opts)) < 0)
                return r;
        DvRequest *q;
        if ((r = dv_req_start(g, op, &q)) < 0)
                return r;
        dv_req_set_opts(q, opts);
        if ((r = dv_req_site(g, fn, q)) < 0)
                return r;
        bool dev = g->device >= 0;
        if ((r = dv_put_tensors_to(g, fn, n, in, NULL, q, dev)) < 0)
                return r;
        if ((r = dv_coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != (uint32_t)n)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        for (int i = 0; i < n; i++)
                if ((r = dev ? dv_view_of_dev(g, fn, &res->t[i], &out[i])
                             : dv_view_of(g, fn, &res->t[i], &out[i])) < 0)
                        return r;
        if (op == DV_OP_GATHER_METRICS) /* (its samples: tensor 0's rows, a 0-d one's one) */
                dv_sites_done(&g->sites, in[0].ndim ? in[0].shape[0] : 1,
                              out[0].ndim ? out[0].shape[0] : 1);
        return 0;
}

/**
 * deval_gather() - gather n tensors from every rank in one collective. Dim 0 (samples) is
 * concatenated in opts->order; every other dim that differs is padded with pad_value.
 * @out: n views into shared memory, read-only, valid until the next call on g. A rank other
 *       than opts->root (when root >= 0) gets shapes with 0 rows and NULL data.
 * Return: 0; DEVAL_EINVAL (a bad argument, on every rank: refused()); DEVAL_EMISMATCH (ranks disagree: the
 * message names the ranks and the field); DEVAL_ENOMEM (over quota); DEVAL_EPEER,
 * DEVAL_EDAEMON, DEVAL_ETIMEDOUT (the group failed for good).
 */
int deval_gather(deval_group *g, int n, const deval_tensor in[], const deval_gather_opts *opts,
                 deval_tensor out[]) {
        uint32_t seq = g ? g->seq : 0;
        int r = gather_common(g, DV_OP_GATHER, "deval_gather", n, in, opts, out);
        return refused(g, "deval_gather", DV_OP_GATHER, seq, r);
}

/**
 * deval_gather_for_metrics() - deval_gather() that, inside an eval pass, drops every sample
 * whose dataset position is past num_samples and orders by the pass's order. Outside a pass
 * it is deval_gather().
 */
static int gather_for_metrics(deval_group *g, const char *fn, int n, const deval_tensor in[],
                              const deval_gather_opts *opts, deval_tensor out[]) {
        if (!g || !g->ident)
                return gather_common(g, DV_OP_GATHER_METRICS, fn, n, in, opts, out);
        /* a pass with keys: the batch's keys go first, and decide what the result keeps */
        deval_tensor call[DEVAL_MAX_TENSORS], res[DEVAL_MAX_TENSORS];
        deval_gather_opts own = DEVAL_GATHER_OPTS_INIT;
        int stream = (int)DV_SITE_STREAM(dv_sites_peek(&g->sites, false), false), r;
        if (!out)
                return dv_set_err(g, DEVAL_EINVAL, "%s: out is NULL", fn);
        if (opts && (r = dv_take_opts(g, fn, opts, &own)) < 0)
                return r;
        opts = &own;
        if ((r = dv_ident_call(g, fn, n, in, opts, call)) < 0)
                return r;
        if ((r = gather_common(g, DV_OP_GATHER_METRICS, fn, n + 1, call, opts, res)) < 0)
                return dv_ident_explain(g, r);
        return dv_ident_result(g, fn, stream, n, res, own.same_rows, out);
}

int deval_gather_for_metrics(deval_group *g, int n, const deval_tensor in[],
                             const deval_gather_opts *opts, deval_tensor out[]) {
        const char *fn = "deval_gather_for_metrics";
        uint32_t seq = g ? g->seq : 0;
        int r = gather_for_metrics(g, fn, n, in, opts, out);
        return refused(g, fn, DV_OP_GATHER_METRICS, seq, r);
}

int dv_simple_op(deval_group *g, uint32_t op, const char *fn, int64_t num_samples, int order) {
        const DvResult *res;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if ((r = dv_coll_begin(g)) < 0)
                return r;
        DvRequest *q;
        if ((r = dv_req_start(g, op, &q)) < 0)
                return r;
        q->num_samples = num_samples;
        q->order = order;
        if (dv_fast_inline_ok(g, 0))
                q->flags |= DV_REQ_INLINE;
        return dv_coll_run(g, fn, &res);
}

/** deval_barrier() - return once every rank has called it. */
int deval_barrier(deval_group *g) {
        return dv_simple_op(g, DV_OP_BARRIER, "deval_barrier", 0, 0);
}

/**
 * deval_pad_across_processes() - pad in along dim to the largest size any rank has there,
 * like Accelerate's pad_across_processes. dim may be negative; a dim outside the tensor's
 * rank returns *in unchanged, once every rank has found it outside its own tensor too (it
 * still takes its step: a rank whose tensor has a dim more fails it on every rank, where
 * skipping it would pair this rank's next call with the others' pad).
 * @out: this rank's padded tensor, a view valid until the next call on g.
 */
static int pad_across_processes(deval_group *g, const char *fn, const deval_tensor *in, int dim,
                                double pad_value, bool pad_first, deval_tensor *out) {
        const DvResult *res;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (!in || !out)
                return dv_set_err(g, DEVAL_EINVAL, "%s: in or out is NULL", fn);
        uint64_t bytes;
        if ((r = dv_check_tensor(g, fn, 0, in, true, &bytes)) < 0)
                return r;
        bool outside = dim >= in->ndim || dim < -in->ndim;
        if (outside)
                dim = DV_PAD_OUTSIDE;
        else if (dim < 0)
                dim += in->ndim;
        DvRequest *q;
        if ((r = dv_req_start(g, DV_OP_PAD, &q)) < 0)
                return r;
        q->dim = dim;
        q->pad_value = pad_value;
        q->pad_first = pad_first;
        bool dev = g->device >= 0;
        if ((r = dv_put_tensors_to(g, fn, 1, in, NULL, q, dev)) < 0)
                return r;
        if ((r = dv_coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        if (outside) {
                *out = *in;
                return 0;
        }
        return dev ? dv_view_of_dev(g, fn, &res->t[0], out) : dv_view_of(g, fn, &res->t[0], out);
}

int deval_pad_across_processes(deval_group *g, const deval_tensor *in, int dim, double pad_value,
                               bool pad_first, deval_tensor *out) {
        const char *fn = "deval_pad_across_processes";
        uint32_t seq = g ? g->seq : 0;
        int r = pad_across_processes(g, fn, in, dim, pad_value, pad_first, out);
        return refused(g, fn, DV_OP_PAD, seq, r);
}

static int objects_common(deval_group *g, uint32_t op, const char *fn, size_t n,
                          const deval_bytes items[], bool placed, const deval_gather_opts *opts,
                          size_t *out_n, const deval_bytes **out_items) {
        const DvResult *res;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if ((n > 0 && !items) || !out_n || !out_items)
                return dv_set_err(g, DEVAL_EINVAL, "%s: items, out_n or out_items is NULL", fn);
        if (n > (size_t)INT64_MAX / 16)
                return dv_set_err(g, DEVAL_EINVAL, "%s: too many items", fn);
        deval_gather_opts own;
        if (!opts)
                opts = &default_opts;
        else if ((r = dv_take_opts(g, fn, opts, &own)) < 0)
                return r;
        else
                opts = &own;
        if ((r = dv_check_opts(g, fn, opts)) < 0)
                return r;
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
                if (!items[i].data && items[i].len)
                        return dv_set_err(g, DEVAL_EINVAL, "%s: item %zu's data is NULL", fn, i);
                if (items[i].len > (uint64_t)INT64_MAX / 4 - total)
                        return dv_set_err(g, DEVAL_EINVAL, "%s: the items are too large", fn);
                total += items[i].len;
        }
        if ((r = dv_coll_begin(g)) < 0)
                return r;
        uint64_t blob_off = DV_ALIGN(n * 8, DV_ARENA_ALIGN);
        if (placed) { /* dv_gather_object_placed(): one item, where the caller staged it */
                const uint8_t *p = items[0].data;
                if (n != 1 || !p || p < g->in + blob_off || p > g->in + g->in_keep ||
                    items[0].len > (uint64_t)(g->in + g->in_keep - p) ||
                    (uint64_t)(p - g->in) % DV_ARENA_ALIGN != 0)
                        return dv_set_err(g, DEVAL_EINVAL,
                                          "%s: the item is not where it was staged", fn);
                blob_off = (uint64_t)(p - g->in);
        }
        DvRequest *q;
        if ((r = dv_req_start(g, op, &q)) < 0)
                return r;
        dv_req_set_opts(q, opts);
        if ((r = dv_req_site(g, fn, q)) < 0)
                return r;
        if ((r = dv_reserve(g, blob_off + total)) < 0)
                return dv_stage_failed(g, fn, q, r, blob_off + total);
        uint64_t pos = 0;
        for (size_t i = 0; i < n; i++) {
                int64_t len = (int64_t)items[i].len;
                memcpy(g->in + i * 8, &len, 8);
                if (items[i].len && !placed)
                        memcpy(g->in + blob_off + pos, items[i].data, items[i].len);
                pos += items[i].len;
        }
        deval_tensor lens = {.dtype = DEVAL_I64, .ndim = 1, .shape = {(int64_t)n}, .device = -1};
        deval_tensor blob = {.dtype = DEVAL_U8, .ndim = 1, .shape = {(int64_t)total}, .device = -1};
        dv_desc_set(&q->t[0], &lens, 0, n * 8);
        dv_desc_set(&q->t[1], &blob, blob_off, total);
        q->ntensors = 2;
        if ((r = dv_coll_run(g, fn, &res)) < 0)
                return r;
        deval_tensor ol, ob;
        if (res->ntensors != 2 || (r = dv_view_of(g, fn, &res->t[0], &ol)) < 0 ||
            (r = dv_view_of(g, fn, &res->t[1], &ob)) < 0 || ol.dtype != DEVAL_I64 ||
            ob.dtype != DEVAL_U8)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        if (op == DV_OP_OBJECTS_METRICS)
                dv_sites_done(&g->sites, (int64_t)n, ol.shape[0]);
        size_t count = (size_t)ol.shape[0];
        if (count > g->items_cap) {
                deval_bytes *p = realloc(g->items, DV_MAX(count, (size_t)1) * sizeof(*p));
                if (!p)
                        return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory", fn);
                g->items = p;
                g->items_cap = count;
        }
        uint64_t at = 0;
        for (size_t i = 0; i < count; i++) {
                int64_t len;
                memcpy(&len, (const uint8_t *)ol.data + i * 8, 8);
                if (len < 0 || (uint64_t)len > (uint64_t)ob.shape[0] - at)
                        return dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
                g->items[i].data = (const uint8_t *)ob.data + at;
                g->items[i].len = (size_t)len;
                at += (uint64_t)len;
        }
        *out_n = count;
        *out_items = g->items;
        return 0;
}

/**
 * deval_gather_objects() - gather lists of byte strings with deval_gather()'s ordering and
 * de-duplication rules (valid_rows, keep_rows, order, root).
 * @out_items: *out_n views, valid until the next call on g.
 */
int deval_gather_objects(deval_group *g, size_t n, const deval_bytes items[],
                         const deval_gather_opts *opts, size_t *out_n,
                         const deval_bytes **out_items) {
        const char *fn = "deval_gather_objects";
        uint32_t seq = g ? g->seq : 0;
        int r = objects_common(g, DV_OP_OBJECTS, fn, n, items, false, opts, out_n, out_items);
        return refused(g, fn, DV_OP_OBJECTS, seq, r);
}

/**
 * dv_gather_object_placed() - deval_gather_objects() of one item that the caller staged in
 * g's input arena, in the region deval_input_buffer() lent: it goes where it lies, not copied.
 * @item: 64-byte aligned, at least DV_OBJECT_PLACED_AT bytes in, ending inside the region;
 *        the arena's first bytes take its length
 */
int dv_gather_object_placed(deval_group *g, deval_bytes item, const deval_gather_opts *opts,
                            size_t *out_n, const deval_bytes **out_items) {
        const char *fn = "deval_gather_objects";
        uint32_t seq = g ? g->seq : 0;
        int r = objects_common(g, DV_OP_OBJECTS, fn, 1, &item, true, opts, out_n, out_items);
        return refused(g, fn, DV_OP_OBJECTS, seq, r);
}

/**
 * deval_gather_objects_for_metrics() - deval_gather_objects() that, inside an eval pass,
 * drops items past the dataset's end. Objects count in their own stream of the pass, so a
 * loop that gathers tensors and objects once per batch drops the same samples from both.
 */
static int objects_for_metrics(deval_group *g, const char *fn, size_t n, const deval_bytes items[],
                               const deval_gather_opts *opts, size_t *out_n,
                               const deval_bytes **out_items) {
        if (!g || !g->ident)
                return objects_common(g, DV_OP_OBJECTS_METRICS, fn, n, items, false, opts, out_n,
                                      out_items);
        /* a pass with keys: each item travels behind its sample's key */
        const deval_bytes *call, *res;
        size_t res_n;
        deval_gather_opts own = DEVAL_GATHER_OPTS_INIT;
        int stream = (int)DV_SITE_STREAM(dv_sites_peek(&g->sites, true), true), r;
        if ((n > 0 && !items) || !out_n || !out_items)
                return dv_set_err(g, DEVAL_EINVAL, "%s: items, out_n or out_items is NULL", fn);
        if (opts && (r = dv_take_opts(g, fn, opts, &own)) < 0)
                return r;
        opts = &own;
        if ((r = dv_ident_items_call(g, fn, n, items, opts, &call)) < 0 ||
            (r = objects_common(g, DV_OP_OBJECTS_METRICS, fn, n, call, false, opts, &res_n, &res)) <
                    0)
                return r;
        return dv_ident_items_result(g, fn, stream, res_n, res, own.same_rows & 1, out_n,
                                     out_items);
}

int deval_gather_objects_for_metrics(deval_group *g, size_t n, const deval_bytes items[],
                                     const deval_gather_opts *opts, size_t *out_n,
                                     const deval_bytes **out_items) {
        const char *fn = "deval_gather_objects_for_metrics";
        uint32_t seq = g ? g->seq : 0;
        int r = objects_for_metrics(g, fn, n, items, opts, out_n, out_items);
        return refused(g, fn, DV_OP_OBJECTS_METRICS, seq, r);
}

/**
 * deval_reduce() - element-wise op over every rank's inout, in rank order (bitwise
 * reproducible); the result replaces inout's data. f16/bf16 are computed in double and
 * rounded once. MEAN needs a floating dtype.
 */
static int reduce(deval_group *g, const char *fn, deval_tensor *inout, deval_reduce_op op) {
        const DvResult *res;
        deval_tensor out;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (!inout)
                return dv_set_err(g, DEVAL_EINVAL, "%s: inout is NULL", fn);
        if (op < DEVAL_SUM || op > DEVAL_PROD)
                return dv_set_err(g, DEVAL_EINVAL, "%s: unknown op %d", fn, op);
        if (op == DEVAL_MEAN && dv_dtype_valid(inout->dtype) && !dv_dtype_is_float(inout->dtype))
                return dv_set_err(g, DEVAL_EINVAL, "%s: mean needs a floating dtype, not %s", fn,
                                  dv_dtype_name(inout->dtype));
        DvRequest *q;
        if ((r = dv_req_start(g, DV_OP_REDUCE, &q)) < 0)
                return r;
        q->reduce_op = op;
        if ((r = dv_put_tensors(g, fn, 1, inout, NULL, q)) < 0)
                return r;
        if ((r = dv_coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1 || (r = dv_view_of(g, fn, &res->t[0], &out)) < 0)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        if (res->t[0].nbytes && (r = dv_write_back(g, fn, inout, out.data, res->t[0].nbytes)) < 0)
                return r;
        return 0;
}

int deval_reduce(deval_group *g, deval_tensor *inout, deval_reduce_op op) {
        uint32_t seq = g ? g->seq : 0;
        int r = reduce(g, "deval_reduce", inout, op);
        return refused(g, "deval_reduce", DV_OP_REDUCE, seq, r);
}

/**
 * deval_broadcast() - every rank's inout gets root's data. All ranks pass the same dtype
 * and shape (DEVAL_EMISMATCH otherwise); non-root data is overwritten.
 */
static int broadcast(deval_group *g, const char *fn, deval_tensor *inout, int root) {
        const DvResult *res;
        deval_tensor out;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (!inout)
                return dv_set_err(g, DEVAL_EINVAL, "%s: inout is NULL", fn);
        if (root < 0 || root >= g->world)
                return dv_set_err(g, DEVAL_EINVAL, "%s: root %d is out of range 0..%d", fn, root,
                                  g->world - 1);
        DvRequest *q;
        if ((r = dv_req_start(g, DV_OP_BROADCAST, &q)) < 0)
                return r;
        q->root = root;
        bool with_data = g->rank == root;
        uint64_t bytes;
        if ((r = dv_check_tensor(g, fn, 0, inout, true, &bytes)) < 0)
                return r;
        if ((r = dv_put_tensors(g, fn, 1, inout, &with_data, q)) < 0)
                return r;
        if ((r = dv_coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1 || (r = dv_view_of(g, fn, &res->t[0], &out)) < 0 ||
            res->t[0].nbytes != bytes)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        if (g->rank != root && bytes && (r = dv_write_back(g, fn, inout, out.data, bytes)) < 0)
                return r;
        return 0;
}

int deval_broadcast(deval_group *g, deval_tensor *inout, int root) {
        uint32_t seq = g ? g->seq : 0;
        int r = broadcast(g, "deval_broadcast", inout, root);
        return refused(g, "deval_broadcast", DV_OP_BROADCAST, seq, r);
}

/**
 * deval_broadcast_bytes() - every rank gets root's len bytes; data and len are ignored on
 * the other ranks. @out: a view valid until the next call on g.
 */
static int broadcast_bytes(deval_group *g, const char *fn, const void *data, size_t len, int root,
                           deval_bytes *out) {
        const DvResult *res;
        deval_tensor view;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (!out)
                return dv_set_err(g, DEVAL_EINVAL, "%s: out is NULL", fn);
        if (root < 0 || root >= g->world)
                return dv_set_err(g, DEVAL_EINVAL, "%s: root %d is out of range 0..%d", fn, root,
                                  g->world - 1);
        if (g->rank == root && len > (size_t)INT64_MAX / 4)
                return dv_set_err(g, DEVAL_EINVAL, "%s: len %zu is too large", fn, len);
        if (g->rank == root && len && !data)
                return dv_set_err(g, DEVAL_EINVAL, "%s: data is NULL", fn);
        if ((r = dv_coll_begin(g)) < 0)
                return r;
        DvRequest *q;
        if ((r = dv_req_start(g, DV_OP_BROADCAST_BYTES, &q)) < 0)
                return r;
        q->root = root;
        if (g->rank == root) {
                deval_tensor t = {.data = (void *)data,
                                  .dtype = DEVAL_U8,
                                  .ndim = 1,
                                  .shape = {(int64_t)len},
                                  .device = -1};
                if ((r = dv_put_tensors(g, fn, 1, &t, NULL, q)) < 0)
                        return r;
        }
        if ((r = dv_coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1 || (r = dv_view_of(g, fn, &res->t[0], &view)) < 0)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        out->data = view.data ? view.data : (const void *)g->out;
        out->len = (size_t)res->t[0].nbytes;
        return 0;
}

int deval_broadcast_bytes(deval_group *g, const void *data, size_t len, int root,
                          deval_bytes *out) {
        const char *fn = "deval_broadcast_bytes";
        uint32_t seq = g ? g->seq : 0;
        int r = broadcast_bytes(g, fn, data, len, root, out);
        return refused(g, fn, DV_OP_BROADCAST_BYTES, seq, r);
}

/**
 * deval_refuse() - this rank's own checks refused its collective call before it reached
 * libdeval (why): take its step as a refusal, so that every rank's call there fails naming
 * this rank and why (refused()). Where the call takes no step (a replay, a failed group),
 * only this rank fails.
 */
int deval_refuse(deval_group *g, const char *why) {
        if (!g)
                return DEVAL_EINVAL;
        dv_set_err(g, DEVAL_EINVAL, "%s", why ? why : "a bad argument");
        return refused(g, "deval_refuse", DV_OP_BARRIER, g->seq, DEVAL_EINVAL);
}

/**
 * deval_input_buffer() - lend the caller the first bytes of this rank's input arena.
 * Tensors of the next collective whose data lies in it are used in place, not copied.
 * @ret: the buffer, 64-byte aligned; valid until the next call on g.
 * Return: 0; DEVAL_EINVAL for a NULL argument; DEVAL_ENOMEM past the group's quota; a
 * connection failure.
 */
int deval_input_buffer(deval_group *g, size_t bytes, void **ret) {
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (!ret)
                return dv_set_err(g, DEVAL_EINVAL, "deval_input_buffer: ret is NULL");
        if ((r = dv_coll_begin(g)) < 0)
                return r;
        g->in_keep = 0; /* a new buffer replaces the old one; its contents need not move */
        if ((r = dv_reserve(g, bytes)) < 0)
                return r;
        g->in_keep = bytes;
        *ret = g->in;
        return 0;
}
