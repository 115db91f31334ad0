/* SPDX-License-Identifier: MIT */
/*
 * agree.c - the step's contract (agree.h): the checks of every op, in one order, each failure
 * in one set of words. An executor calls dv_agree() once the step's requests are copied and
 * the pass has parked whom it parks; what is left to it is planning and copying.
 */
#include "agree.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "deval.h"

#include "check.h"
#include "dtype.h"
#include "pass.h"

/** dv_agree_fail() - the step fails with status, for the reason fmt says. Return: status. */
int dv_agree_fail(DvAgree *a, int status, const char *fmt, ...) {
        if (!a->msg)
                return status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(a->msg, a->msg_len, fmt, ap);
        va_end(ap);
        return status;
}

/**
 * dv_pass_stream() - which stream of an open pass request q counts its samples in: a call
 * site of the batch, for tensors or for objects. Return: the stream, or -1 for none.
 */
int dv_pass_stream(bool pass_open, const DvRequest *q) {
        if (!pass_open || q->site >= DV_PASS_SITES || (q->flags & DV_SITE_UNCOUNTED))
                return -1;
        if (q->op == DV_OP_GATHER_METRICS)
                return (int)q->site;
        if (q->op == DV_OP_OBJECTS_METRICS)
                return DV_PASS_SITES + (int)q->site;
        return -1;
}

/** dv_pass_based() - see agree.h. */
bool dv_pass_based(bool pass_open, const DvRequest *q) {
        return pass_open && dv_pass_stream(pass_open, q) < 0 && (q->flags & DV_SITE_BASED) &&
               (q->op == DV_OP_GATHER_METRICS || q->op == DV_OP_OBJECTS_METRICS);
}

#define SAME_ON_ALL(a, field, fmtspec, what)                                                      \
        do {                                                                                      \
                for (int _k = 1; _k < (a)->world; _k++)                                           \
                        if ((a)->q[_k].field != (a)->q[0].field)                                  \
                                return dv_agree_fail(                                             \
                                        (a), DEVAL_EMISMATCH,                                     \
                                        "collective #%u (%s): ranks disagree on " what            \
                                        ": rank 0 has " fmtspec ", rank %d has " fmtspec,         \
                                        (a)->call, dv_op_name((a)->q[0].op), (a)->q[0].field, _k, \
                                        (a)->q[_k].field);                                        \
        } while (0)

/* rank k in the executor's words, or "" in the try mode */
static void who(const DvAgree *a, int k, char *w, size_t len) {
        if (a->msg)
                a->who(a, k, w, len);
        else
                w[0] = '\0';
}

static int malformed(DvAgree *a, int k, const char *what) {
        char w[64];
        who(a, k, w, sizeof(w));
        return dv_agree_fail(a, DEVAL_EPROTO, "malformed %s from %s", what, w);
}

static int ntensors(DvAgree *a, uint32_t lo, uint32_t hi) {
        for (int k = 0; k < a->world; k++)
                if (a->q[k].ntensors < lo || a->q[k].ntensors > hi) {
                        char w[64];
                        who(a, k, w, sizeof(w));
                        return dv_agree_fail(a, DEVAL_EPROTO,
                                             "malformed request from %s: %u tensors", w,
                                             a->q[k].ntensors);
                }
        return 0;
}

static int pad_value_same(DvAgree *a) {
        for (int k = 1; k < a->world; k++)
                if (memcmp(&a->q[k].pad_value, &a->q[0].pad_value, sizeof(double)) != 0)
                        return dv_agree_fail(a, DEVAL_EMISMATCH,
                                             "collective #%u (%s): ranks disagree on pad_value: "
                                             "rank 0 has %g, rank %d has %g",
                                             a->call, dv_op_name(a->q[0].op), a->q[0].pad_value, k,
                                             a->q[k].pad_value);
        return 0;
}

/* the op's tensors have one shape on every rank (dv_agree() names the call) */
static int same_shapes(DvAgree *a) {
        const DvTensorDesc *t = &a->q[0].t[0];
        for (int k = 1; k < a->world; k++) {
                const DvTensorDesc *b = &a->q[k].t[0];
                if (t->dtype != b->dtype)
                        return dv_agree_fail(a, DEVAL_EMISMATCH,
                                             "ranks disagree on the dtype: rank 0 has %s, "
                                             "rank %d has %s",
                                             dv_dtype_name(t->dtype), k, dv_dtype_name(b->dtype));
                if (t->ndim != b->ndim)
                        return dv_agree_fail(a, DEVAL_EMISMATCH,
                                             "ranks disagree on the ndim: rank 0 has %d, "
                                             "rank %d has %d",
                                             t->ndim, k, b->ndim);
                for (int d = 0; d < t->ndim && d < DEVAL_MAX_DIMS; d++)
                        if (t->shape[d] != b->shape[d])
                                return dv_agree_fail(a, DEVAL_EMISMATCH,
                                                     "ranks disagree on the shape: dim %d is "
                                                     "%lld on rank 0, %lld on rank %d",
                                                     d, (long long)t->shape[d],
                                                     (long long)b->shape[d], k);
        }
        return 0;
}

static int gather_opts(DvAgree *a) {
        const DvRequest *q = a->q;
        int r;
        SAME_ON_ALL(a, pad_first, "%u", "pad_first");
        SAME_ON_ALL(a, keep_rows, "%" PRId64, "keep_rows");
        SAME_ON_ALL(a, root, "%d", "root");
        for (int k = 1; k < a->world; k++)
                if (q[k].names != q[0].names)
                        return dv_agree_fail(a, DEVAL_EMISMATCH,
                                             "collective #%u (%s): ranks disagree on the names "
                                             "of the call's tensors (a dict's keys): rank 0's "
                                             "and rank %d's differ; each tensor meets the one "
                                             "of its name on every rank",
                                             a->call, dv_op_name(q[0].op), k);
        bool metrics = q[0].op == DV_OP_GATHER_METRICS || q[0].op == DV_OP_OBJECTS_METRICS;
        int bad;
        if (metrics && a->pass_open && (r = dv_pass_sites(q, a->world, &bad)) < 0) {
                char n0[64], nk[64];
                who(a, 0, n0, sizeof(n0));
                who(a, bad, nk, sizeof(nk));
                if (a->msg)
                        dv_pass_sites_msg(a->msg, a->msg_len, q, bad, a->call, n0, nk);
                return r;
        }
        if (metrics && dv_pass_based(a->pass_open, &q[0])) { /* (said by each rank) */
                for (int k = 0; k < a->world; k++)
                        if (q[k].base_total < 0 || q[k].base_total > (1ll << 50) ||
                            q[k].base_rows < 0 || q[k].base_rows > (1ll << 50))
                                return malformed(a, k, "request");
                SAME_ON_ALL(a, base_total, "%" PRId64,
                            "how many samples of the eval pass came before this batch");
        }
        bool stream = dv_pass_stream(a->pass_open, &q[0]) >= 0;
        if (!stream) /* in a pass, the pass's order is the order */
                SAME_ON_ALL(a, order, "%d", "order");
        if ((r = pad_value_same(a)) < 0)
                return r;
        if (q[0].root < -1 || q[0].root >= a->world)
                return dv_agree_fail(a, DEVAL_EPROTO, "root %d is out of range", q[0].root);
        if (!stream && q[0].order != DEVAL_ORDER_RANK && q[0].order != DEVAL_ORDER_STRIDED)
                return dv_agree_fail(a, DEVAL_EPROTO, "order %d is unknown", q[0].order);
        return 0;
}

static int agree_gather(DvAgree *a) {
        int r;
        if ((r = ntensors(a, 1, DEVAL_MAX_TENSORS)) < 0)
                return r;
        SAME_ON_ALL(a, ntensors, "%u", "the number of tensors");
        if ((r = gather_opts(a)) < 0)
                return r;
        for (int k = 0; k < a->world; k++)
                for (int i = 0; i < (int)a->q[0].ntensors; i++)
                        if ((r = a->desc(a, k, i, true)) < 0)
                                return r;
        return 0;
}

/* Objects: t[0] is an i64 [n] of item lengths, t[1] the u8 [sum] of their bytes. */
static int agree_objects(DvAgree *a) {
        int r;
        if ((r = ntensors(a, 2, 2)) < 0 || (r = gather_opts(a)) < 0)
                return r;
        for (int k = 0; k < a->world; k++) {
                const DvTensorDesc *lens = &a->q[k].t[0], *blob = &a->q[k].t[1];
                if ((r = a->desc(a, k, 0, true)) < 0 || (r = a->desc(a, k, 1, true)) < 0)
                        return r;
                if (lens->dtype != DEVAL_I64 || lens->ndim != 1 || blob->dtype != DEVAL_U8 ||
                    blob->ndim != 1)
                        return malformed(a, k, "object request");
        }
        return 0;
}

static int agree_pad(DvAgree *a) {
        int r;
        if ((r = ntensors(a, 1, 1)) < 0)
                return r;
        SAME_ON_ALL(a, pad_first, "%u", "pad_first");
        if ((r = pad_value_same(a)) < 0)
                return r;
        for (int k = 0; k < a->world; k++)
                if ((r = a->desc(a, k, 0, true)) < 0)
                        return r;
        /* (before dim: a rank whose tensor has a dim fewer finds the dim outside it) */
        SAME_ON_ALL(a, t[0].ndim, "%d", "the tensor's ndim");
        SAME_ON_ALL(a, dim, "%d", "dim");
        int dim = a->q[0].dim;
        if (dim < 0 || (dim >= a->q[0].t[0].ndim && dim != DV_PAD_OUTSIDE))
                return dv_agree_fail(a, DEVAL_EPROTO, "dim %d is out of range", dim);
        return 0;
}

static int agree_reduce(DvAgree *a) {
        int r;
        if ((r = ntensors(a, 1, 1)) < 0)
                return r;
        SAME_ON_ALL(a, reduce_op, "%d", "the reduce op");
        for (int k = 0; k < a->world; k++)
                if ((r = a->desc(a, k, 0, true)) < 0)
                        return r;
        if ((r = same_shapes(a)) < 0)
                return r;
        int op = a->q[0].reduce_op, dtype = a->q[0].t[0].dtype;
        if (op < DEVAL_SUM || op > DEVAL_PROD)
                return dv_agree_fail(a, DEVAL_EPROTO, "reduce op %d is unknown", op);
        if (op == DEVAL_MEAN && !dv_dtype_is_float(dtype))
                return dv_agree_fail(a, DEVAL_EINVAL, "mean needs a floating dtype, not %s",
                                     dv_dtype_name(dtype));
        return 0;
}

static int agree_broadcast(DvAgree *a, bool bytes) {
        int r;
        SAME_ON_ALL(a, root, "%d", "root");
        int root = a->q[0].root;
        if (root < 0 || root >= a->world)
                return dv_agree_fail(a, DEVAL_EPROTO, "root %d is out of range", root);
        if (bytes) {
                if (a->q[root].ntensors != 1)
                        return dv_agree_fail(a, DEVAL_EPROTO, "malformed request from root %d",
                                             root);
        } else {
                if ((r = ntensors(a, 1, 1)) < 0)
                        return r;
                for (int k = 0; k < a->world; k++)
                        if ((r = a->desc(a, k, 0, k == root)) < 0)
                                return r;
                if ((r = same_shapes(a)) < 0)
                        return r;
        }
        return a->desc(a, root, 0, true);
}

static int agree_eval_begin(DvAgree *a) {
        SAME_ON_ALL(a, num_samples, "%" PRId64, "num_samples");
        SAME_ON_ALL(a, order, "%d", "order");
        if (a->q[0].num_samples < 0 ||
            (a->q[0].order != DEVAL_ORDER_RANK && a->q[0].order != DEVAL_ORDER_STRIDED))
                return dv_agree_fail(a, DEVAL_EPROTO, "malformed eval_begin request");
        return 0;
}

/* dv_agree()'s checks, in its order; a failure's words may not name the call yet */
static int agree_run(DvAgree *a) {
        const DvRequest *q = a->q;
        for (int k = 0; k < a->world; k++) {
                if (q[k].status == 0)
                        continue;
                char w[64];
                who(a, k, w, sizeof(w));
                if (!dv_staging_status(q[k].status))
                        return dv_agree_fail(a, DEVAL_EPROTO,
                                             "malformed request from %s: status %d", w,
                                             q[k].status);
                char why[sizeof(q[k].why)];
                size_t n = dv_printable(why, sizeof(why), q[k].why, sizeof(q[k].why));
                /* a rank's own refusal: its op may be a guess (deval_refuse()); name the others' */
                if (q[k].status == DEVAL_EINVAL)
                        return dv_agree_fail(a, DEVAL_EINVAL,
                                             "collective #%u (%s): %s refused its own call, so "
                                             "this one fails on every rank: %s",
                                             a->call, dv_op_name(q[k ? 0 : a->world > 1].op), w,
                                             n ? why : "a bad argument");
                return dv_agree_fail(a, q[k].status,
                                     "collective #%u (%s): %s could not stage its %llu bytes of "
                                     "input: %s",
                                     a->call, dv_op_name(q[k].op), w,
                                     (unsigned long long)q[k].staged_bytes,
                                     n ? why : deval_strerror(q[k].status));
        }
        for (int k = 1; k < a->world; k++)
                if (q[k].op != q[0].op)
                        return dv_agree_fail(a, DEVAL_EMISMATCH,
                                             "collective #%u: ranks disagree on the op: rank 0 "
                                             "called %s, rank %d called %s; every rank makes "
                                             "the same calls, in the same order",
                                             a->call, dv_op_name(q[0].op), k, dv_op_name(q[k].op));
        switch (q[0].op) {
        case DV_OP_GATHER:
        case DV_OP_GATHER_METRICS:
                return agree_gather(a);
        case DV_OP_OBJECTS:
        case DV_OP_OBJECTS_METRICS:
                return agree_objects(a);
        case DV_OP_PAD:
                return agree_pad(a);
        case DV_OP_REDUCE:
                return agree_reduce(a);
        case DV_OP_BROADCAST:
        case DV_OP_BROADCAST_BYTES:
                return agree_broadcast(a, q[0].op == DV_OP_BROADCAST_BYTES);
        case DV_OP_EVAL_BEGIN:
                return agree_eval_begin(a);
        case DV_OP_EVAL_END:
        case DV_OP_BARRIER:
                return 0;
        default:
                return dv_agree_fail(a, DEVAL_EPROTO, "collective #%u: unknown op %u", a->call,
                                     q[0].op);
        }
}

/**
 * dv_agree() - do the step's requests agree, as its op needs? In order: a rank that could not
 * stage its input fails the step with its own status and words; every rank called the same
 * op; then the op's own checks (its options, the same on every rank; its tensors, as its
 * executor checks where they lie; their shapes, where the op needs them equal).
 *
 * Every failure names the user's call first, "collective #3 (reduce): ...", as the ranks count
 * their calls (a->call), whichever check or executor's callback found it.
 * Return: 0, or the step's status with why in a->msg.
 */
int dv_agree(DvAgree *a) {
        int r = agree_run(a);
        if (r >= 0 || !a->msg || !a->msg_len || strncmp(a->msg, "collective #", 12) == 0)
                return r;
        char why[DV_MSG_MAX];
        snprintf(why, sizeof(why), "%s", a->msg);
        snprintf(a->msg, a->msg_len, "collective #%u (%s): %s", a->call, dv_op_name(a->q[0].op),
                 why);
        return r;
}
