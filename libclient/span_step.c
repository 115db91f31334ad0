/* SPDX-License-Identifier: MIT */
/*
 * span_step.c - the step of a spanning group's collective, run by every rank alike once the
 * exchange (span_exchange.c) has brought it every rank's part: the same checks as devald's
 * worker, then devald's planner and reduction over all parts in global ranks, so that each
 * result is the one a single machine gives, byte for byte. The eval pass is kept here too,
 * alike on every rank, with ranks that ended it parked as devald parks them.
 *
 * Trust: the parts come from the group's own ranks, through the job's engine. Their framing
 * is checked by span_wire.c; their requests and tensors here, against the bytes each carries
 * (never a crash), as devald checks what ranks write. Owns the step's part of the state
 * (span.h): parked ranks, the pass, the planner's inputs, the result.
 */
#define _GNU_SOURCE
#include "span_step.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "agree.h"
#include "check.h"
#include "dtype.h"
#include "fast.h"
#include "handle.h"
#include "pass.h"
#include "plan.h"
#include "span_state.h"
#include "util.h"

static const char *who(const DvSpan *sp, int k, char *buf, size_t len) {
        snprintf(buf, len, "rank %d (node %d)", k, sp->node_of[k]);
        return buf;
}

static int bad_part(DvSpan *sp, int k, int i) {
        char a[48];
        return dv_span_fail(sp, DEVAL_EPROTO, "collective #%u: %s sent a malformed tensor %d",
                            sp->reqs[k].call, who(sp, k, a, sizeof(a)), i);
}

/* sp->shapes and sp->srcs for n inputs at least, kept from step to step */
static bool inputs(DvSpan *sp, size_t n) {
        if (n <= sp->inputs_cap)
                return true;
        DvShape *shapes = realloc(sp->shapes, n * sizeof(*shapes));
        if (shapes)
                sp->shapes = shapes;
        const uint8_t **srcs = realloc(sp->srcs, n * sizeof(*srcs));
        if (srcs)
                sp->srcs = srcs;
        if (!shapes || !srcs)
                return false;
        sp->inputs_cap = n;
        return true;
}

static uint8_t *out_of(DvSpan *sp, uint64_t bytes) {
        if (!dv_span_grow(&sp->out, &sp->out_cap, (size_t)bytes))
                return NULL;
        return sp->out;
}

static void plan_input(DvSpan *sp, int W, int n, DvPlanInput *in) {
        const DvRequest *q = sp->reqs;
        int stream = dv_pass_stream(sp->pass.open, q);
        *in = (DvPlanInput){.world = W,
                            .ntensors = n,
                            .in = sp->shapes,
                            .valid_rows = sp->valid,
                            .keep_rows = q->keep_rows,
                            .order = q->order,
                            .pad_first = q->pad_first != 0,
                            .pad_value = q->pad_value,
                            .max_out = sp->max_out};
        if (stream >= 0)
                dv_pass_plan(&sp->pass.c, sp->pass.rows, W, stream, in);
        else if (dv_pass_based(sp->pass.open, q))
                dv_pass_plan_based(sp->pass.c.order, sp->pass.c.num_samples, q, W, sp->pass.base,
                                   in);
}

static void pass_advance(DvSpan *sp, int W, const DvPlan *p) {
        DvPass *ps = &sp->pass;
        int stream = dv_pass_stream(ps->open, sp->reqs);
        if (stream >= 0)
                dv_pass_advance(stream, W, p->contributed, &ps->c, ps->rows);
}

static int plan_failed(DvSpan *sp, int r, const DvPlan *p) {
        return dv_span_fail(sp, r, "collective #%u (%s): %s", sp->reqs[0].call,
                            dv_op_name(sp->reqs[0].op), p->err);
}

static int step_gather(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        int n = (int)q[0].ntensors;
        if (!inputs(sp, (size_t)W * (size_t)n))
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        DvShape *shapes = sp->shapes;
        const uint8_t **srcs = sp->srcs;
        for (int k = 0; k < W; k++) {
                for (int i = 0; i < n; i++) {
                        shapes[k * n + i] = dv_shape_of(&q[k].t[i]);
                        srcs[k * n + i] = sp->data[k] ? sp->data[k] + q[k].t[i].offset : NULL;
                }
                sp->valid[k] = q[k].valid_rows;
        }
        DvPlanInput in;
        DvPlan *p = &g->fast.plan;
        plan_input(sp, W, n, &in);
        dv_plan_reset(p);
        if ((r = dv_plan_gather(&in, p)) < 0)
                return plan_failed(sp, r, p);
        uint8_t *out = out_of(sp, p->out_end);
        if (!out || dv_plan_run(g, p, n, false, srcs, out) < 0)
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory for a %" PRIu64 "-byte result",
                                    p->out_end);
        pass_advance(sp, W, p);
        sp->res.ntensors = (uint32_t)n;
        for (int i = 0; i < n; i++)
                dv_desc_of(&p->out[i], p->out_offset[i], p->out_nbytes[i], &sp->res.t[i]);
        dv_root_only(&sp->res, sp->reqs[0].root, g->rank);
        return 0;
}

static int step_objects(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        for (int k = 0; k < W; k++) {
                const DvTensorDesc *lens = &q[k].t[0], *blob = &q[k].t[1];
                int64_t *pre = realloc(sp->prefix[k], ((size_t)lens->shape[0] + 1) * 8);
                if (!pre)
                        return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
                sp->prefix[k] = pre;
                const uint8_t *src = sp->data[k] ? sp->data[k] + lens->offset : NULL;
                if (lens->shape[0] && !src)
                        return bad_part(sp, k, 0);
                if (!dv_objects_prefix(src, lens->shape[0], blob->shape[0], pre))
                        return bad_part(sp, k, 1);
        }
        if (!inputs(sp, (size_t)W))
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        DvShape *shapes = sp->shapes;
        const uint8_t **blobs = sp->srcs;
        for (int k = 0; k < W; k++) {
                shapes[k] = dv_shape_of(&q[k].t[0]);
                sp->valid[k] = q[k].valid_rows;
                blobs[k] = sp->data[k] ? sp->data[k] + q[k].t[1].offset : NULL;
        }
        DvPlanInput in;
        DvPlan *p = &g->fast.plan;
        plan_input(sp, W, 1, &in);
        dv_plan_reset(p);
        if ((r = dv_plan_gather(&in, p)) < 0)
                return plan_failed(sp, r, p);
        uint64_t blob_bytes = dv_objects_bytes(p, sp->prefix);
        uint64_t lens_bytes = (uint64_t)p->samples * 8;
        uint64_t blob_off = DV_ALIGN(lens_bytes, DV_ARENA_ALIGN);
        uint8_t *out = out_of(sp, blob_off + blob_bytes);
        if (!out)
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        dv_objects_copy(p, sp->prefix, blobs, out, blob_off);
        pass_advance(sp, W, p);
        DvShape ls = {.dtype = DEVAL_I64, .ndim = 1, .shape = {p->samples}};
        DvShape bs = {.dtype = DEVAL_U8, .ndim = 1, .shape = {(int64_t)blob_bytes}};
        sp->res.ntensors = 2;
        dv_desc_of(&ls, 0, lens_bytes, &sp->res.t[0]);
        dv_desc_of(&bs, blob_off, blob_bytes, &sp->res.t[1]);
        dv_root_only(&sp->res, sp->reqs[0].root, g->rank);
        return 0;
}

static int step_pad(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world, r;
        DvRequest *q = sp->reqs;

        if (!inputs(sp, (size_t)W))
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        DvShape *shapes = sp->shapes;
        const uint8_t **srcs = sp->srcs;
        for (int k = 0; k < W; k++) {
                shapes[k] = dv_shape_of(&q[k].t[0]);
                srcs[k] = sp->data[k] ? sp->data[k] + q[k].t[0].offset : NULL;
        }
        DvPlan *p = &g->fast.plan;
        dv_plan_reset(p);
        if ((r = dv_plan_pad(W, shapes, q[0].dim, q[0].pad_first != 0, q[0].pad_value, 0,
                             sp->max_out, p)) < 0)
                return plan_failed(sp, r, p);
        uint8_t *out = out_of(sp, p->out_end);
        if (!out || dv_plan_run(g, p, 1, true, srcs, out) < 0)
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        sp->res.ntensors = 1;
        dv_desc_of(&p->out[g->rank], p->out_offset[g->rank], p->out_nbytes[g->rank], &sp->res.t[0]);
        return 0;
}

static int step_reduce(deval_group *g) {
        DvSpan *sp = g->span;
        int W = g->world;
        DvRequest *q = sp->reqs;

        const DvTensorDesc *t = &q[0].t[0];
        uint8_t *out = out_of(sp, t->nbytes);
        if (!out || !inputs(sp, (size_t)W))
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        for (int k = 0; k < W; k++) /* in global rank order */
                sp->srcs[k] = sp->data[k] + q[k].t[0].offset;
        dv_reduce_ranks(t->dtype, q[0].reduce_op, W, sp->srcs, t->nbytes / dv_dtype_size(t->dtype),
                        out);
        sp->res.ntensors = 1;
        DvShape sh = dv_shape_of(t);
        dv_desc_of(&sh, 0, t->nbytes, &sp->res.t[0]);
        return 0;
}

static int step_broadcast(deval_group *g) {
        DvSpan *sp = g->span;
        DvRequest *q = sp->reqs;
        int root = q[0].root;
        const DvTensorDesc *t = &q[root].t[0];
        uint8_t *out = out_of(sp, t->nbytes);
        if (!out)
                return dv_span_fail(sp, DEVAL_ENOMEM, "out of memory");
        if (t->nbytes)
                memcpy(out, sp->data[root] + t->offset, t->nbytes);
        sp->res.ntensors = 1;
        DvShape sh = dv_shape_of(t);
        dv_desc_of(&sh, 0, t->nbytes, &sp->res.t[0]);
        return 0;
}

/* eval_begin, or eval_end when every rank ended the pass (pass.h) */
static int step_eval(deval_group *g, bool begin) {
        DvSpan *sp = g->span;
        char msg[DV_MSG_MAX];
        int r = begin ? dv_pass_begin(&sp->pass, sp->reqs, g->name, msg, sizeof(msg))
                      : dv_pass_end(&sp->pass, sp->reqs, g->name, msg, sizeof(msg));
        if (r < 0)
                return dv_span_fail(sp, r, "%s", msg);
        if (!begin)
                sp->res.flags = dv_pass_end_flags(sp->reqs, g->world);
        return 0;
}

/*
 * Ranks that called eval_end while others still call are parked: each of their parts stands
 * for an empty contribution to the others' collective, as devald answers for a parked rank.
 * Return: the first rank still calling (-1: every rank has ended the pass), or the failure
 * when the others called something an empty contribution cannot answer.
 */
static int park(deval_group *g, int *tmpl) {
        DvSpan *sp = g->span;
        int W = g->world;
        DvRequest *q = sp->reqs;
        DvPark pk;

        *tmpl = -1;
        for (int k = 0; k < W && *tmpl < 0; k++)
                if (q[k].op != DV_OP_EVAL_END)
                        *tmpl = k;
        if (*tmpl < 0 || !sp->pass.open)
                return 0;
        if (!dv_pass_park(&sp->pass, q, false, &pk)) {
                char a[48], b[48], msg[DV_MSG_MAX];
                dv_pass_park_msg(msg, sizeof(msg), &pk, q, q[pk.tmpl].call,
                                 who(sp, pk.tmpl, a, sizeof(a)),
                                 who(sp, pk.left >= 0 ? pk.left : pk.first, b, sizeof(b)));
                return dv_span_fail(sp, DEVAL_EMISMATCH, "%s", msg);
        }
        if (pk.first < 0)
                return 0;
        DvRequest tm = q[*tmpl];
        for (int k = 0; k < W; k++)
                if (sp->pass.parked[k]) {
                        dv_req_empty(&q[k], &tm, tm.seq);
                        sp->data[k] = NULL;
                        sp->dlen[k] = 0;
                }
        return 0;
}

/**
 * dv_span_step() - run here the step every rank described, over every rank's part (the
 * state's reqs, data and dlen, as the exchange left them).
 * @g: a spanning handle
 * @closed: set: the step was the close of the eval pass (every rank ended it)
 *
 * A rank parked in eval_end stands for an empty contribution while others still call; the
 * result goes to the state's res, its bytes to its out.
 * Return: 0; or the step's status with its sentence in the state's msg, the same on every
 * rank: DEVAL_EMISMATCH (ranks disagree), DEVAL_EPROTO (a malformed request), DEVAL_EINVAL,
 * DEVAL_ENOMEM, a staging rank's status, or the planner's or the pass's.
 */
static void agree_who(const DvAgree *a, int k, char *buf, size_t len) {
        who(a->ctx, k, buf, len);
}

/* A part's tensor: its shape sane and, with data, its bytes within what the part carried. */
static int agree_desc(const DvAgree *a, int k, int i, bool with_data) {
        DvSpan *sp = a->ctx;
        if (dv_desc_check(&sp->reqs[k].t[i], sp->dlen[k], with_data))
                return bad_part(sp, k, i);
        return 0;
}

static int step(deval_group *g, bool *closed) {
        DvSpan *sp = g->span;
        int W = g->world, tmpl, r;
        DvRequest *q = sp->reqs;
        char a[48], b[48];

        sp->msg[0] = '\0';
        memset(&sp->res, 0, offsetof(DvResult, t));
        *closed = false;
        for (int k = 0; k < W; k++)
                if (q[k].seq != q[0].seq)
                        return dv_span_fail(sp, DEVAL_EPROTO, "%s is at collective #%u, %s at #%u",
                                            who(sp, 0, a, sizeof(a)), q[0].seq,
                                            who(sp, k, b, sizeof(b)), q[k].seq);
        if ((r = park(g, &tmpl)) < 0)
                return r;
        /* the contract (agree.c), over the parts as they came (their bytes in data, dlen) */
        DvAgree ag = {.q = q,
                      .world = W,
                      .call = q[0].call,
                      .pass_open = sp->pass.open,
                      .who = agree_who,
                      .desc = agree_desc,
                      .ctx = sp,
                      .msg = sp->msg,
                      .msg_len = sizeof(sp->msg)};
        if ((r = dv_agree(&ag)) < 0)
                return r;
        if (tmpl < 0) {
                *closed = true;
                return step_eval(g, false);
        }
        sp->res.op = q[tmpl].op;
        sp->res.site = q[tmpl].site;
        sp->res.batch = q[tmpl].batch;
        switch (q[0].op) {
        case DV_OP_GATHER:
        case DV_OP_GATHER_METRICS:
                return step_gather(g);
        case DV_OP_OBJECTS:
        case DV_OP_OBJECTS_METRICS:
                return step_objects(g);
        case DV_OP_PAD:
                return step_pad(g);
        case DV_OP_REDUCE:
                return step_reduce(g);
        case DV_OP_BROADCAST:
        case DV_OP_BROADCAST_BYTES:
                return step_broadcast(g);
        case DV_OP_EVAL_BEGIN:
                return step_eval(g, true);
        case DV_OP_BARRIER:
                return 0;
        }
        return dv_span_fail(sp, DEVAL_EPROTO, "collective #%u: unknown op %u", q[0].call, q[0].op);
}

/**
 * dv_span_step() - run here the step every rank described, over every rank's part (the
 * state's reqs, data and dlen, as the exchange left them).
 * @g: a spanning handle
 * @closed: set: the step was the close of the eval pass (every rank ended it)
 *
 * A rank parked in eval_end stands for an empty contribution while others still call; the
 * result goes to the state's res, its bytes to its out. A rank that ended the pass without
 * being parked (it left its loop while others went on) ends it for every rank, as devald
 * does: the step fails, and the pass is over.
 * Return: 0; or the step's status with its sentence in the state's msg, the same on every
 * rank: DEVAL_EMISMATCH (ranks disagree), DEVAL_EPROTO (a malformed request), DEVAL_EINVAL,
 * DEVAL_ENOMEM, a staging rank's status, or the planner's or the pass's.
 */
int dv_span_step(deval_group *g, bool *closed) {
        DvSpan *sp = g->span;
        int r = step(g, closed);
        bool released = false;
        for (int k = 0; k < g->world; k++)
                released |= sp->reqs[k].op == DV_OP_EVAL_END && !sp->pass.parked[k];
        if (released && sp->pass.open)
                dv_pass_reset(&sp->pass);
        return r;
}

/** dv_span_pass_open() - is an eval pass open on spanning handle g (deval_eval_open())? */
int dv_span_pass_open(const deval_group *g) {
        return g->span->pass.open;
}
