/* SPDX-License-Identifier: MIT */
/*
 * step.c - run one collective on a group's worker: copy every rank's request out of shared
 * memory once, check it against the rank's arena and against the other ranks, plan, grow the
 * output if needed, execute, and write each rank's result. A request is client-written
 * memory, so every field is checked before use; a malformed one fails the step on every rank
 * with DEVAL_EPROTO naming the rank, and disagreeing ranks get DEVAL_EMISMATCH naming the
 * ranks and the field.
 */
#define _GNU_SOURCE
#include "step.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "check.h"
#include "daemon.h"
#include "dtype.h"
#include "exec_host.h"
#include "fault.h"
#include "gpu_worker.h"
#include "kernel_plan.h"
#include "log.h"
#include "output.h"
#include "pass.h"
#include "plan.h"
#include "util.h"

typedef struct {
        Group *g;
        uint32_t seq;
        uint32_t call; /* the ranks' count of their calls: what messages name (wire.h) */
        const DvRequest *reqs;
        DvCtlHeader *h;
        bool dev; /* tensors are in the ranks' device input arenas (gather, pad) */
        char msg[DV_MSG_MAX];
} Step;

static int step_fail(Step *s, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static int step_fail(Step *s, int status, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->msg, sizeof(s->msg), fmt, ap);
        va_end(ap);
        return status;
}

static DvResult *res_of(Step *s, int k) {
        return &s->g->dhdr->res[k];
}

/* Rank k's request has its input in its inline bytes of the control segment (wire.h). */
static bool in_inline(const Step *s, int k) {
        return !s->dev && (s->reqs[k].flags & DV_REQ_INLINE);
}

/* Where rank k's host input of this step lies: its input arena, or its inline bytes. */
static const uint8_t *in_base(const Group *g, const DvRequest *q) {
        int k = (int)(q - g->work.reqs);
        if (q->flags & DV_REQ_INLINE)
                return g->ctl.map + g->layout.inl_off + (uint64_t)k * g->layout.inline_size;
        return g->members[k].in.map;
}

/* A descriptor some rank wrote: its shape must be sane; with data, it must lie in the arena. */
static int check_desc(Step *s, int k, int i, bool with_data) {
        const DvTensorDesc *t = &s->reqs[k].t[i];
        const Member *m = &s->g->members[k];
        uint64_t arena = s->dev            ? m->din.size
                         : in_inline(s, k) ? s->g->layout.inline_size
                                           : m->in.size;

        switch (dv_desc_check(t, arena, with_data)) {
        case DV_DESC_OK:
                return 0;
        case DV_DESC_BAD_TYPE:
                return step_fail(s, DEVAL_EPROTO,
                                 "malformed request from rank %d (pid %d): tensor %d has dtype "
                                 "%d and ndim %d",
                                 k, (int)m->pid, i, t->dtype, t->ndim);
        case DV_DESC_BAD_SHAPE:
                return step_fail(s, DEVAL_EPROTO,
                                 "malformed request from rank %d (pid %d): tensor %d has "
                                 "a negative or overflowing shape",
                                 k, (int)m->pid, i);
        default:
                return step_fail(s, DEVAL_EPROTO,
                                 "malformed request from rank %d (pid %d): tensor %d's %llu bytes "
                                 "at offset %llu do not match its shape or its %llu-byte arena",
                                 k, (int)m->pid, i, (unsigned long long)t->nbytes,
                                 (unsigned long long)t->offset, (unsigned long long)arena);
        }
}

typedef struct {
        Group *g;
        const DvRequest *reqs;
        bool first_tensor; /* pad plans read each rank's only tensor */
} SrcCtx;

static const uint8_t *src_of(void *arg, int rank, int tensor) {
        SrcCtx *c = arg;
        return in_base(c->g, &c->reqs[rank]) + c->reqs[rank].t[c->first_tensor ? 0 : tensor].offset;
}

static int plan_status(Step *s, int r, const DvPlan *p) {
        return step_fail(s, r, "collective #%u (%s): %s", s->call, dv_op_name(s->reqs[0].op),
                         p->err);
}

static void plan_input(Step *s, int n, const DvShape *shapes, const int64_t *valid,
                       DvPlanInput *in) {
        Group *g = s->g;
        const DvRequest *q = &s->reqs[0];
        int stream = dv_pass_stream(g->work.pass.open, q);

        *in = (DvPlanInput){.world = g->world,
                            .ntensors = n,
                            .in = shapes,
                            .valid_rows = valid,
                            .keep_rows = q->keep_rows,
                            .order = q->order,
                            .pad_first = q->pad_first != 0,
                            .pad_value = q->pad_value,
                            .max_out = g->d->max_group_bytes};
        if (stream >= 0)
                dv_pass_plan(&g->work.pass.c, g->work.pass.rows, g->world, stream, in);
        else if (dv_pass_based(g->work.pass.open, q))
                dv_pass_plan_based(g->work.pass.c.order, g->work.pass.c.num_samples, s->reqs,
                                   g->world, g->work.pass.base, in);
}

static void pass_advance(Group *g, const DvRequest *q, const DvPlan *p) {
        DvPass *ps = &g->work.pass;
        int stream = dv_pass_stream(ps->open, q);
        if (stream >= 0)
                dv_pass_advance(stream, g->world, p->contributed, &ps->c, ps->rows);
}

/*
 * Before a step of an open pass: its counters as the ranks left them (they run the gathers
 * for metrics they can, fast.c), copied out once and checked, since ranks can write them.
 */
static int pass_load(Step *s) {
        Group *g = s->g;
        DvPass *ps = &g->work.pass;
        const DvPassShared *sh = group_pass_shared(g);
        size_t n = (size_t)DV_PASS_STREAMS * (size_t)g->world;

        if (!ps->open)
                return 0;
        DvPassCounts c = sh->c;
        int64_t *rows = g->work.pass_load;
        memcpy(rows, sh->rows, n * sizeof(*rows));
        if (!dv_pass_counts_valid(&c, rows, g->world))
                return step_fail(s, DEVAL_EPROTO,
                                 "collective #%u: the eval pass's counters in the group's "
                                 "control segment are corrupt (a rank overwrote them)",
                                 s->call);
        /* what only devald writes stays devald's */
        c.order = ps->c.order;
        c.num_samples = ps->c.num_samples;
        ps->c = c;
        memcpy(ps->rows, rows, n * sizeof(*rows));
        return 0;
}

/* After every step: the pass's state, for the ranks that run the next gathers for metrics. */
static void pass_store(Group *g) {
        const DvPass *ps = &g->work.pass;
        DvPassShared *sh = group_pass_shared(g);
        sh->c = ps->c;
        memcpy(sh->rows, ps->rows, (size_t)DV_PASS_STREAMS * (size_t)g->world * sizeof(int64_t));
        /* published with the step (done_seq, release) */
        atomic_store_explicit(&sh->open, ps->open ? 1u : 0u, memory_order_relaxed);
        uint64_t since = atomic_load_explicit(&g->pass_since_ns, memory_order_relaxed);
        if (ps->open != (since != 0)) /* for deval-ctl's rate */
                atomic_store_explicit(&g->pass_since_ns, ps->open ? dv_now_ns() : 0,
                                      memory_order_relaxed);
}

/*
 * In an eval pass, a rank that calls eval_end while others still gather is parked: its
 * loader ran out first. From now until the pass closes, devald answers every collective of
 * the others for it with an empty contribution shaped like theirs, so uneven loaders need no
 * dummy calls (common/pass.c says which collectives an empty contribution answers, and what
 * a rank that left its loop early does to the pass).
 * Return: 0, or the step's failure.
 */
static int pass_park(Step *s) {
        Group *g = s->g;
        DvPass *ps = &g->work.pass;
        DvPark pk;

        if (!ps->open)
                return 0;
        bool ok = dv_pass_park(ps, g->work.reqs, g->device_group, &pk);
        if (!ok) {
                char a[48], b[48], msg[DV_MSG_MAX];
                int other = pk.left >= 0 ? pk.left : pk.first;
                snprintf(a, sizeof(a), "rank %d (pid %d)", pk.tmpl, (int)g->members[pk.tmpl].pid);
                snprintf(b, sizeof(b), "rank %d (pid %d)", other, (int)g->members[other].pid);
                dv_pass_park_msg(msg, sizeof(msg), &pk, g->work.reqs, s->call, a, b);
                return step_fail(s, DEVAL_EMISMATCH, "%s", msg);
        }
        if (pk.tmpl < 0 || !ps->nparked)
                return 0;
        const DvRequest *t = &g->work.reqs[pk.tmpl];
        for (int k = 0; k < g->world; k++)
                if (ps->parked[k])
                        dv_req_empty(&g->work.reqs[k], t, s->seq);
        return 0;
}

/*
 * A device group's plan: the copy kernel on every GPU that receives, reading the ranks'
 * device input arenas. Sources: rank k's tensor i at k * per_rank + i.
 */
static int exec_device(Step *s, const DvPlan *p, bool pad) {
        Group *g = s->g;
        int W = g->world, per_rank = pad ? 1 : (int)s->reqs[0].ntensors;
        uint32_t nsrcs = (uint32_t)(W * per_rank);
        _cleanup_(freep) DvKernelSeg *segs = calloc(p->nsegs + 1, sizeof(*segs));
        _cleanup_(freep) uint64_t *starts = calloc(p->nsegs + 1, sizeof(*starts));
        _cleanup_(freep) GpuwSrc *srcs = calloc(nsrcs, sizeof(*srcs));
        int r;

        if (!segs || !starts || !srcs)
                return step_fail(s, DEVAL_ENOMEM, "devald is out of memory");
        if ((r = output_ensure_dev(g, p->out_end, s->msg, sizeof(s->msg))) < 0)
                return r;
        dv_kernel_plan(p, per_rank, pad, segs, starts);
        for (int k = 0; k < W; k++)
                for (int i = 0; i < per_rank; i++)
                        srcs[k * per_rank + i] = (GpuwSrc){.arena = &g->members[k].din,
                                                           .off = s->reqs[k].t[i].offset,
                                                           .bytes = s->reqs[k].t[i].nbytes};
        for (int dev = 0; dev < DV_MAX_GPUS; dev++) {
                if (g->locked.dout[dev].device < 0)
                        continue;
                r = gpuw_run(dev, segs, starts, (uint32_t)p->nsegs, &g->locked.dout[dev], srcs,
                             nsrcs);
                if (r < 0)
                        return step_fail(s, r, "collective #%u (%s): the copy on GPU %d failed: %s",
                                         s->call, dv_op_name(s->reqs[0].op), dev, dv_gpu_error());
        }
        return 0;
}

static int step_gather(Step *s) {
        Group *g = s->g;
        int W = g->world, r;

        int n = (int)s->reqs[0].ntensors;
        _cleanup_(freep) DvShape *shapes =
                calloc((size_t)(unsigned)W * (size_t)(unsigned)n, sizeof(*shapes));
        _cleanup_(freep) int64_t *valid = calloc((size_t)(unsigned)W, sizeof(*valid));
        if (!shapes || !valid)
                return step_fail(s, DEVAL_ENOMEM, "devald is out of memory");
        for (int k = 0; k < W; k++) {
                for (int i = 0; i < n; i++)
                        shapes[k * n + i] = dv_shape_of(&s->reqs[k].t[i]);
                valid[k] = s->reqs[k].valid_rows;
        }

        DvPlanInput in;
        DvPlan p;
        plan_input(s, n, shapes, valid, &in);
        dv_plan_init(&p);
        if ((r = dv_plan_gather(&in, &p)) < 0)
                goto out;
        DV_FAULT("daemon_copy", s->seq);
        if (s->dev) {
                if ((r = exec_device(s, &p, false)) < 0)
                        goto out_msg;
        } else {
                if ((r = output_ensure(g, p.out_end, s->msg, sizeof(s->msg))) < 0)
                        goto out_msg;
                SrcCtx ctx = {.g = g, .reqs = s->reqs};
                ExecJob job = {.plan = &p, .src = src_of, .ctx = &ctx, .out = g->locked.out.map};
                exec_host(g, &job);
        }
        pass_advance(g, &s->reqs[0], &p);
        atomic_fetch_add_explicit(&g->bytes_moved, p.out_end, memory_order_relaxed);
        for (int k = 0; k < W; k++) {
                DvResult *res = res_of(s, k);
                res->ntensors = (uint32_t)n;
                for (int i = 0; i < n; i++)
                        dv_desc_of(&p.out[i], p.out_offset[i], p.out_nbytes[i], &res->t[i]);
                dv_root_only(res, s->reqs[0].root, k);
        }
        dv_plan_deinit(&p);
        return 0;
out:
        plan_status(s, r, &p);
out_msg:
        dv_plan_deinit(&p);
        return r;
}

/* Objects: t[0] is an i64 [n] of item lengths, t[1] the u8 [sum] of their bytes. */
static int step_objects(Step *s) {
        Group *g = s->g;
        int W = g->world, r;

        _cleanup_(freep) DvShape *shapes = calloc((size_t)(unsigned)W, sizeof(*shapes));
        _cleanup_(freep) int64_t *valid = calloc((size_t)(unsigned)W, sizeof(*valid));
        _cleanup_(freep) int64_t **prefix = calloc((size_t)(unsigned)W, sizeof(*prefix));
        _cleanup_(freep) const uint8_t **blobs = calloc((size_t)(unsigned)W, sizeof(*blobs));
        if (!shapes || !valid || !prefix || !blobs)
                return step_fail(s, DEVAL_ENOMEM, "devald is out of memory");
        for (int k = 0; k < W; k++) {
                const DvTensorDesc *lens = &s->reqs[k].t[0], *blob = &s->reqs[k].t[1];
                /* lengths are copied out of the arena once, then checked and used */
                int64_t n = lens->shape[0];
                prefix[k] = malloc(((size_t)n + 1) * sizeof(int64_t));
                if (!prefix[k]) {
                        r = step_fail(s, DEVAL_ENOMEM, "devald is out of memory");
                        goto out;
                }
                const uint8_t *src = in_base(g, &s->reqs[k]) + lens->offset;
                if (!dv_objects_prefix(src, n, blob->shape[0], prefix[k])) {
                        r = step_fail(s, DEVAL_EPROTO,
                                      "malformed object request from rank %d (pid %d): item "
                                      "lengths do not add up to its %lld bytes",
                                      k, (int)g->members[k].pid, (long long)blob->shape[0]);
                        goto out;
                }
                shapes[k] = dv_shape_of(lens);
                valid[k] = s->reqs[k].valid_rows;
        }

        DvPlanInput in;
        DvPlan p;
        plan_input(s, 1, shapes, valid, &in);
        dv_plan_init(&p);
        if ((r = dv_plan_gather(&in, &p)) < 0) {
                plan_status(s, r, &p);
                dv_plan_deinit(&p);
                goto out;
        }
        uint64_t blob_bytes = dv_objects_bytes(&p, prefix);
        uint64_t lens_off = 0, lens_bytes = (uint64_t)p.samples * 8;
        uint64_t blob_off = DV_ALIGN(lens_bytes, DV_ARENA_ALIGN);
        if ((r = output_ensure(g, blob_off + blob_bytes, s->msg, sizeof(s->msg))) < 0) {
                dv_plan_deinit(&p);
                goto out;
        }
        for (int k = 0; k < W; k++)
                blobs[k] = in_base(g, &s->reqs[k]) + s->reqs[k].t[1].offset;
        dv_objects_copy(&p, prefix, blobs, g->locked.out.map + lens_off, blob_off);
        pass_advance(g, &s->reqs[0], &p);
        atomic_fetch_add_explicit(&g->bytes_moved, blob_off + blob_bytes, memory_order_relaxed);
        for (int k = 0; k < W; k++) {
                DvResult *res = res_of(s, k);
                DvShape ls = {.dtype = DEVAL_I64, .ndim = 1, .shape = {p.samples}};
                DvShape bs = {.dtype = DEVAL_U8, .ndim = 1, .shape = {(int64_t)blob_bytes}};
                res->ntensors = 2;
                dv_desc_of(&ls, lens_off, lens_bytes, &res->t[0]);
                dv_desc_of(&bs, blob_off, blob_bytes, &res->t[1]);
                dv_root_only(res, s->reqs[0].root, k);
        }
        dv_plan_deinit(&p);
        r = 0;
out:
        for (int k = 0; k < W; k++)
                free(prefix[k]);
        return r;
}

static int step_pad(Step *s) {
        Group *g = s->g;
        int W = g->world, r;

        _cleanup_(freep) DvShape *shapes = calloc((size_t)(unsigned)W, sizeof(*shapes));
        if (!shapes)
                return step_fail(s, DEVAL_ENOMEM, "devald is out of memory");
        for (int k = 0; k < W; k++)
                shapes[k] = dv_shape_of(&s->reqs[k].t[0]);

        DvPlan p;
        dv_plan_init(&p);
        r = dv_plan_pad(W, shapes, s->reqs[0].dim, s->reqs[0].pad_first != 0, s->reqs[0].pad_value,
                        0, g->d->max_group_bytes, &p);
        if (r < 0) {
                plan_status(s, r, &p);
                goto out;
        }
        if (s->dev) {
                if ((r = exec_device(s, &p, true)) < 0)
                        goto out;
        } else {
                if ((r = output_ensure(g, p.out_end, s->msg, sizeof(s->msg))) < 0)
                        goto out;
                SrcCtx ctx = {.g = g, .reqs = s->reqs, .first_tensor = true};
                ExecJob job = {.plan = &p, .src = src_of, .ctx = &ctx, .out = g->locked.out.map};
                exec_host(g, &job);
        }
        atomic_fetch_add_explicit(&g->bytes_moved, p.out_end, memory_order_relaxed);
        for (int k = 0; k < W; k++) {
                DvResult *res = res_of(s, k);
                res->ntensors = 1;
                dv_desc_of(&p.out[k], p.out_offset[k], p.out_nbytes[k], &res->t[0]);
        }
out:
        dv_plan_deinit(&p);
        return r;
}

static int step_reduce(Step *s) {
        Group *g = s->g;
        int W = g->world, r;

        const DvTensorDesc *t = &s->reqs[0].t[0];
        if ((r = output_ensure(g, t->nbytes, s->msg, sizeof(s->msg))) < 0)
                return r;
        const uint8_t *srcs[DEVAL_MAX_WORLD];
        for (int k = 0; k < W; k++)
                srcs[k] = in_base(g, &s->reqs[k]) + s->reqs[k].t[0].offset;
        dv_reduce_ranks(t->dtype, s->reqs[0].reduce_op, W, srcs,
                        t->nbytes / dv_dtype_size(t->dtype), g->locked.out.map);
        atomic_fetch_add_explicit(&g->bytes_moved, t->nbytes, memory_order_relaxed);
        DvShape sh = dv_shape_of(t);
        for (int k = 0; k < W; k++) {
                DvResult *res = res_of(s, k);
                res->ntensors = 1;
                dv_desc_of(&sh, 0, t->nbytes, &res->t[0]);
        }
        return 0;
}

static int step_broadcast(Step *s) {
        Group *g = s->g;
        int W = g->world, r;

        int root = s->reqs[0].root;
        const DvTensorDesc *t = &s->reqs[root].t[0];
        if ((r = output_ensure(g, t->nbytes, s->msg, sizeof(s->msg))) < 0)
                return r;
        memcpy(g->locked.out.map, in_base(g, &s->reqs[root]) + t->offset, t->nbytes);
        atomic_fetch_add_explicit(&g->bytes_moved, t->nbytes, memory_order_relaxed);
        DvShape sh = dv_shape_of(t);
        for (int k = 0; k < W; k++) {
                DvResult *res = res_of(s, k);
                res->ntensors = 1;
                dv_desc_of(&sh, 0, t->nbytes, &res->t[0]);
        }
        return 0;
}

static int step_eval(Step *s, bool begin) {
        Group *g = s->g;
        char msg[DV_MSG_MAX];
        int r = begin ? dv_pass_begin(&g->work.pass, s->reqs, g->name, msg, sizeof(msg))
                      : dv_pass_end(&g->work.pass, s->reqs, g->name, msg, sizeof(msg));
        if (r < 0)
                return step_fail(s, r, "%s", msg);
        uint32_t flags = begin ? 0 : dv_pass_end_flags(s->reqs, g->world);
        for (int k = 0; k < g->world; k++)
                res_of(s, k)->flags = flags;
        return 0;
}

/* Rank k in devald's words: its rank and its pid. */
static void who(const DvAgree *a, int k, char *buf, size_t len) {
        const Step *s = a->ctx;
        snprintf(buf, len, "rank %d (pid %d)", k, (int)s->g->members[k].pid);
}

static int agree_desc(const DvAgree *a, int k, int i, bool with_data) {
        return check_desc(a->ctx, k, i, with_data);
}

static int step_dispatch(Step *s) {
        const DvRequest *q = s->reqs;

        for (int k = 0; k < s->g->world; k++) {
                if (q[k].seq != s->seq)
                        return step_fail(s, DEVAL_EPROTO,
                                         "malformed request from rank %d (pid %d): it is for "
                                         "collective #%u, not #%u",
                                         k, (int)s->g->members[k].pid, q[k].seq, s->seq);
                if (q[k].op < DV_OP_GATHER || q[k].op >= DV_OP_MAX_)
                        return step_fail(s, DEVAL_EPROTO,
                                         "malformed request from rank %d (pid %d): unknown op %u",
                                         k, (int)s->g->members[k].pid, q[k].op);
                /* its input is in its own memory: the ranks restage such a step, never hand
                 * it here (wire.h); reading its input arena instead would be a wrong result */
                if (q[k].flags & DV_REQ_DIRECT)
                        return step_fail(s, DEVAL_EPROTO,
                                         "collective #%u was handed to devald with the input of "
                                         "rank %d (pid %d) in that rank's own memory, where "
                                         "devald cannot read it: a rank broke the protocol",
                                         s->call, k, (int)s->g->members[k].pid);
        }
        int r = pass_load(s);
        if (r < 0)
                return r;
        if ((r = pass_park(s)) < 0)
                return r;
        /* the contract (agree.c); the tensors' bytes lie in the ranks' arenas, or on GPUs */
        s->dev = s->g->device_group && (q[0].op == DV_OP_GATHER ||
                                        q[0].op == DV_OP_GATHER_METRICS || q[0].op == DV_OP_PAD);
        DvAgree a = {.q = q,
                     .world = s->g->world,
                     .call = s->call,
                     .pass_open = s->g->work.pass.open,
                     .who = who,
                     .desc = agree_desc,
                     .ctx = s,
                     .msg = s->msg,
                     .msg_len = sizeof(s->msg)};
        if ((r = dv_agree(&a)) < 0)
                return r;
        switch (q[0].op) {
        case DV_OP_GATHER:
        case DV_OP_GATHER_METRICS:
                return step_gather(s);
        case DV_OP_OBJECTS:
        case DV_OP_OBJECTS_METRICS:
                return step_objects(s);
        case DV_OP_PAD:
                return step_pad(s);
        case DV_OP_REDUCE:
                return step_reduce(s);
        case DV_OP_BROADCAST:
                return step_broadcast(s);
        case DV_OP_BROADCAST_BYTES:
                return step_broadcast(s);
        case DV_OP_EVAL_BEGIN:
                return step_eval(s, true);
        case DV_OP_EVAL_END:
                return step_eval(s, false);
        case DV_OP_BARRIER:
                return 0;
        }
        return step_fail(s, DEVAL_EPROTO, "unknown op");
}

/**
 * step_run() - run step seq of g on its worker thread and write every rank's result; the
 * caller publishes done_seq afterwards.
 * Return: the step's status (0 or a negative DEVAL_E*), as every rank will see it.
 */
int step_run(Group *g, uint32_t seq) {
        Step s = {.g = g, .seq = seq, .reqs = g->work.reqs, .h = g->hdr};
        DvPass *ps = &g->work.pass;

        for (int k = 0; k < g->world; k++) {
                memcpy(&g->work.reqs[k], &g->hdr->slots[k].req, sizeof(DvRequest));
                memset(&g->dhdr->res[k], 0, offsetof(DvResult, t));
        }
        s.call = g->work.reqs[0].call;
        int r = step_dispatch(&s);
        for (int k = 0; k < g->world; k++) { /* what a parked rank needs to replay it */
                DvResult *res = res_of(&s, k);
                res->op = g->work.reqs[k].op;
                res->site = g->work.reqs[k].site;
                res->batch = g->work.reqs[k].batch;
        }
        /* a failure while devald answers for parked ranks is theirs too, when the pass closes */
        if (r < 0)
                dv_pass_failed(ps, r, s.call, g->work.reqs[0].op, s.msg);
        /* ranks that called eval_end and were not parked have their answer with this step */
        g->work.pass_released = false;
        for (int k = 0; k < g->world; k++)
                g->work.pass_released |= g->work.reqs[k].op == DV_OP_EVAL_END && !ps->parked[k];
        /* released ranks no longer answer for themselves in this pass: it is over for all
         * (only a close that failed before step_eval(), from a malformed request, gets here
         * with the pass still open) */
        if (g->work.pass_released && ps->open)
                dv_pass_reset(ps);
        if (r < 0) {
                for (int k = 0; k < g->world; k++) {
                        DvResult *res = res_of(&s, k);
                        res->status = r;
                        res->ntensors = 0;
                }
                log_debug("group '%s': %s", g->name, s.msg);
        }
        memcpy(g->dhdr->msg, s.msg, sizeof(s.msg));
        pass_store(g);
        return r;
}
