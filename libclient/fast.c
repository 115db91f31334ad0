/* SPDX-License-Identifier: MIT */
/*
 * fast.c - steps the ranks run themselves (DvFast in wire.h). A rank whose input fits in its
 * inline bytes writes it there instead of its input arena; the last rank to arrive plans the
 * step with the code devald runs and writes the result into the group's control segment (or,
 * for a large one, publishes the plan for every rank to copy a share of), so a collective
 * costs no wake-up of devald. A rank whose gather input is large leaves it in its own memory
 * (DV_REQ_DIRECT): the plan then has every rank copy its own rows straight into the group's
 * direct output, each byte once. Only the plain case runs here: whatever is unusual (an op
 * the ranks cannot run, an input that does not fit, ranks that disagree, a malformed
 * request) goes to devald's worker, which checks it as always and names what was wrong; or,
 * when some rank's input is in its own memory, comes back unrun to be called again staged.
 */
#define _GNU_SOURCE
#include "fast.h"

#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "arena.h"
#include "check.h"
#include "copy.h"
#include "dtype.h"
#include "fault.h"
#include "handle.h"
#include "kernel_plan.h"
#include "pass.h"
#include "plan.h"
#include "util.h"

/* May end bytes of this rank's input go to its inline bytes? */
bool dv_fast_inline_ok(const deval_group *g, uint64_t end) {
        return g->rank_steps && g->device < 0 && g->inl_size && end <= g->inl_size;
}

/* Ops the ranks run. */
static bool fast_op(uint32_t op) {
        switch (op) {
        case DV_OP_GATHER:
        case DV_OP_GATHER_METRICS:
        case DV_OP_PAD:
        case DV_OP_REDUCE:
        case DV_OP_BROADCAST:
        case DV_OP_BARRIER:
                return true;
        default:
                return false;
        }
}

/* Every rank's request, copied out once; false when one cannot run here. *direct: some
 * rank's input is in its own memory (DV_REQ_DIRECT). Whether they agree is dv_agree()'s. */
static bool fast_requests(deval_group *g, uint32_t seq, DvRequest *reqs, bool *direct) {
        *direct = false;
        for (int k = 0; k < g->world; k++) {
                const DvSlot *s = &g->hdr->slots[k];
                if (atomic_load_explicit(&s->arrived_seq, memory_order_acquire) != seq)
                        return false;
                DvRequest *q = &reqs[k];
                /* up to why: the rest of the header is for a failed stage, never run here */
                memcpy(q, &s->req, offsetof(DvRequest, why));
                bool own = q->flags & DV_REQ_DIRECT;
                if (q->seq != seq || !(q->flags & DV_REQ_INLINE) == !own || q->status != 0 ||
                    q->ntensors > DEVAL_MAX_TENSORS || !fast_op(q->op) ||
                    (own && q->op != DV_OP_GATHER && q->op != DV_OP_GATHER_METRICS))
                        return false;
                memcpy(q->t, s->req.t, q->ntensors * sizeof(DvTensorDesc));
                *direct |= own;
        }
        return true;
}

/* Has some rank its input of step seq in its own memory? All have arrived. */
static bool any_direct(const deval_group *g) {
        for (int k = 0; k < g->world; k++)
                if (g->hdr->slots[k].req.flags & DV_REQ_DIRECT)
                        return true;
        return false;
}

/* For dv_agree(): rank k's tensor i lies within its inline bytes, or in its own memory. */
static int fast_desc(const DvAgree *a, int k, int i, bool with_data) {
        const deval_group *g = a->ctx;
        const DvRequest *q = &a->q[k];
        uint64_t bound = q->flags & DV_REQ_DIRECT ? UINT64_MAX : g->inl_size;
        return dv_desc_check(&q->t[i], bound, with_data) == DV_DESC_OK ? 0 : DEVAL_EPROTO;
}

static const uint8_t *inl_of(const deval_group *g, int k, const DvTensorDesc *t) {
        return g->inl_all + (uint64_t)k * g->inl_size + t->offset;
}

/* Buffer i of the group's scratch, of bytes at least: kept from step to step. */
static void *scratch(deval_group *g, int i, size_t bytes) {
        if (g->fast.scratch_size[i] < bytes) {
                void *p = realloc(g->fast.scratch[i], bytes);
                if (!p)
                        return NULL;
                g->fast.scratch[i] = p;
                g->fast.scratch_size[i] = bytes;
        }
        return g->fast.scratch[i];
}

/* p as the copy kernel's segments (kernel_plan.h), in the group's scratch. */
static bool kernel_segs(deval_group *g, const DvPlan *p, int per_rank, bool first_tensor,
                        DvKernelSeg **segs, uint64_t **starts) {
        *segs = scratch(g, 3, (p->nsegs + 1) * sizeof(**segs));
        *starts = scratch(g, 4, (p->nsegs + 1) * sizeof(**starts));
        if (!*segs || !*starts)
                return false;
        dv_kernel_plan(p, per_rank, first_tensor, *segs, *starts);
        return true;
}

/*
 * dv_fast_gather_to() - plan the gather in and copy it at once, here, from srcs (one a tensor
 * of each rank) into out, which ends at in->max_out; the result's descriptors into *res.
 * Return: 0, or the planner's status (DEVAL_ENOMEM too for a result past in->max_out).
 */
int dv_fast_gather_to(deval_group *g, const DvPlanInput *in, const uint8_t *const *srcs,
                      uint8_t *out, DvResult *res) {
        DvPlan *p = &g->fast.plan;

        dv_plan_reset(p);
        int r = dv_plan_gather(in, p);
        if (r < 0)
                return r;
        if ((r = dv_plan_run(g, p, in->ntensors, false, srcs, out)) < 0)
                return r;
        res->ntensors = (uint32_t)in->ntensors;
        for (int i = 0; i < in->ntensors; i++)
                dv_desc_of(&p->out[i], p->out_offset[i], p->out_nbytes[i], &res->t[i]);
        return 0;
}

/*
 * dv_plan_run() - copy plan p here, into out (p->out_end bytes at least), from srcs: rank k's
 * input i at srcs[k * per_rank + i]. Return: 0; DEVAL_ENOMEM.
 */
int dv_plan_run(deval_group *g, const DvPlan *p, int per_rank, bool first_tensor,
                const uint8_t *const *srcs, uint8_t *out) {
        DvKernelSeg *segs;
        uint64_t *starts;
        if (!kernel_segs(g, p, per_rank, first_tensor, &segs, &starts))
                return DEVAL_ENOMEM;
        dv_kplan_run(segs, starts, (uint32_t)p->nsegs, 0, starts[p->nsegs], out, srcs);
        return 0;
}

/* Publish plan p (at most DV_SHARE_SEGS segments) for every rank to copy from, in mode
 * (DvShare): what both modes share; the caller adds what its mode needs. */
static DvShare *share_set(deval_group *g, uint32_t mode, const DvPlan *p, const DvKernelSeg *segs,
                          const uint64_t *starts, size_t nsrc, uint32_t seq) {
        DvShare *sh = g->fast.share;
        sh->mode = mode;
        sh->nsegs = (uint32_t)p->nsegs;
        sh->nsrcs = (uint32_t)nsrc;
        sh->total = starts[p->nsegs];
        memcpy(sh->segs, segs, p->nsegs * sizeof(*segs));
        memcpy(sh->starts, starts, (p->nsegs + 1) * sizeof(*starts));
        if (DV_FAULT_SAYS("fast_plan", seq, "garbage"))
                memset(sh->segs, 0xa5, sizeof(sh->segs[0]));
        (void)seq; /* read only by the fault point, which release builds leave out */
        return sh;
}

/* The largest result a direct step plans for; devald's quota decides before that. */
#define DIRECT_MAX (1ull << 46)

/*
 * A gather: planned and run here, or planned for every rank to copy a share of (*shared):
 * by bytes, from the inline inputs into the output area; or, when some rank's input is in
 * its own memory (direct), each rank its own rows into the direct output, grown here first.
 */
static bool fast_gather(deval_group *g, const DvRequest *q, bool pass_open, bool direct,
                        DvResult *res, uint64_t *moved, bool *shared) {
        int W = g->world, n = (int)q[0].ntensors;

        size_t nsrc = (size_t)W * (size_t)n;
        DvShape *shapes = scratch(g, 0, nsrc * sizeof(DvShape));
        int64_t *valid = scratch(g, 1, (size_t)W * sizeof(int64_t));
        const uint8_t **srcs = scratch(g, 2, nsrc * sizeof(*srcs));
        DvKernelSeg *segs;
        uint64_t *starts;
        DvPlan *p = &g->fast.plan;

        dv_plan_reset(p);
        if (!shapes || !valid || !srcs)
                return false;
        for (int k = 0; k < W; k++) {
                for (int i = 0; i < n; i++) {
                        const DvTensorDesc *t = &q[k].t[i];
                        shapes[k * n + i] = dv_shape_of(t);
                        srcs[k * n + i] = q[k].flags & DV_REQ_DIRECT ? NULL : inl_of(g, k, t);
                }
                valid[k] = q[k].valid_rows;
        }
        /* a gather for metrics in an open pass: planned with the pass's counters (wire.h),
         * copied out and checked, since ranks write them */
        DvPassShared *sh = g->pass_sh;
        int stream = dv_pass_stream(pass_open, &q[0]);
        DvPlanInput in = {.world = W,
                          .ntensors = n,
                          .in = shapes,
                          .valid_rows = valid,
                          .keep_rows = q[0].keep_rows,
                          .order = q[0].order,
                          .pad_first = q[0].pad_first != 0,
                          .pad_value = q[0].pad_value,
                          .max_out = direct ? DIRECT_MAX : g->fast.out_size};
        if (stream >= 0) { /* the stream's counters, copied out once and checked */
                size_t at = (size_t)stream * (size_t)W;
                int64_t *rows = scratch(g, 5, (size_t)DV_PASS_STREAMS * (size_t)W * sizeof(*rows));
                if (!rows)
                        return false;
                DvPassCounts c = {.order = sh->c.order, .num_samples = sh->c.num_samples};
                c.total[stream] = sh->c.total[stream];
                memcpy(&rows[at], &sh->rows[at], (size_t)W * sizeof(*rows));
                if (c.num_samples < 0 ||
                    (c.order != DEVAL_ORDER_RANK && c.order != DEVAL_ORDER_STRIDED) ||
                    !dv_pass_counts_ok(&rows[at], W, c.total[stream]))
                        return false;
                dv_pass_plan(&c, rows, W, stream, &in); /* which reads the stream's alone */
        } else if (dv_pass_based(pass_open, &q[0])) {   /* (agreed: every rank's request is) */
                int64_t *rows = scratch(g, 5, (size_t)W * sizeof(*rows));
                int order = sh->c.order;
                int64_t num = sh->c.num_samples;
                if (!rows || num < 0 || (order != DEVAL_ORDER_RANK && order != DEVAL_ORDER_STRIDED))
                        return false;
                dv_pass_plan_based(order, num, q, W, rows, &in);
        }
        if (dv_plan_gather(&in, p) < 0 || (!direct && p->out_end > g->fast.out_size))
                return false;
        if (!kernel_segs(g, p, n, false, &segs, &starts))
                return false;
        if (direct) { /* every rank copies its own rows (share_own()) */
                if (p->nsegs > DV_SHARE_SEGS ||
                    (p->out_end > g->direct.size && dv_direct_output(g, p->out_end) < 0))
                        return false;
                DvShare *sh = share_set(g, DV_SHARE_OWN, p, segs, starts, nsrc, q[0].seq);
                sh->per_rank = (uint32_t)n;
                sh->gen = g->direct.gen;
                *shared = true;
        } else if (W > 1 && p->nsegs > 0 && p->out_end >= g->fast.share_min &&
                   p->nsegs <= DV_SHARE_SEGS) {
                /* every rank copies a share of it (dv_fast_share()) */
                DvShare *sh = share_set(g, DV_SHARE_BYTES, p, segs, starts, nsrc, q[0].seq);
                for (int k = 0; k < W; k++)
                        for (int i = 0; i < n; i++)
                                sh->src_off[k * n + i] =
                                        (uint64_t)k * g->inl_size + q[k].t[i].offset;
                *shared = true;
        } else {
                dv_kplan_run(segs, starts, (uint32_t)p->nsegs, 0, starts[p->nsegs], g->fast.out,
                             srcs);
        }
        if (stream >= 0) /* what the pass gathered, as devald counts it */
                dv_pass_advance(stream, W, p->contributed, &sh->c, sh->rows);
        res->ntensors = (uint32_t)n;
        for (int i = 0; i < n; i++)
                dv_desc_of(&p->out[i], p->out_offset[i], p->out_nbytes[i], &res->t[i]);
        *moved = p->out_end;
        return true;
}

/* pad_across_processes: each rank's tensor padded along dim to the longest; every rank's
 * result is its own, so where it lies goes into its slot (pad_off, pad_len) */
static bool fast_pad(deval_group *g, const DvRequest *q, DvResult *res, uint64_t *moved) {
        int W = g->world, dim = q[0].dim;
        DvShape *shapes = scratch(g, 0, (size_t)W * sizeof(DvShape));
        const uint8_t **srcs = scratch(g, 2, (size_t)W * sizeof(*srcs));
        DvPlan *p = &g->fast.plan;
        if (!shapes || !srcs)
                return false;
        for (int k = 0; k < W; k++) {
                shapes[k] = dv_shape_of(&q[k].t[0]);
                srcs[k] = inl_of(g, k, &q[k].t[0]);
        }
        dv_plan_reset(p);
        if (dv_plan_pad(W, shapes, dim, q[0].pad_first != 0, q[0].pad_value, 0, g->fast.out_size,
                        p) < 0 ||
            p->out_end > g->fast.out_size)
                return false;
        DvKernelSeg *segs;
        uint64_t *starts;
        if (!kernel_segs(g, p, 1, true, &segs, &starts))
                return false;
        dv_kplan_run(segs, starts, (uint32_t)p->nsegs, 0, starts[p->nsegs], g->fast.out, srcs);
        for (int k = 0; k < W; k++) {
                g->hdr->slots[k].pad_off = p->out_offset[k];
                g->hdr->slots[k].pad_len = dim < p->out[k].ndim ? p->out[k].shape[dim] : 0;
        }
        res->ntensors = 1;
        dv_desc_of(&p->out[0], p->out_offset[0], p->out_nbytes[0], &res->t[0]);
        *moved = p->out_end;
        return true;
}

static bool fast_reduce(deval_group *g, const DvRequest *q, DvResult *res, uint64_t *moved) {
        const DvTensorDesc *t = &q[0].t[0];
        const uint8_t **srcs = scratch(g, 2, (size_t)g->world * sizeof(*srcs));
        if (t->nbytes > g->fast.out_size || !srcs)
                return false;
        for (int k = 0; k < g->world; k++)
                srcs[k] = inl_of(g, k, &q[k].t[0]);
        dv_reduce_ranks(t->dtype, q[0].reduce_op, g->world, srcs,
                        t->nbytes / dv_dtype_size(t->dtype), g->fast.out);
        res->ntensors = 1;
        DvShape sh = dv_shape_of(t);
        dv_desc_of(&sh, 0, t->nbytes, &res->t[0]);
        *moved = t->nbytes;
        return true;
}

static bool fast_broadcast(deval_group *g, const DvRequest *q, DvResult *res, uint64_t *moved) {
        const DvTensorDesc *t = &q[q[0].root].t[0];
        if (t->nbytes > g->fast.out_size)
                return false;
        memcpy(g->fast.out, inl_of(g, q[0].root, t), t->nbytes);
        res->ntensors = 1;
        DvShape sh = dv_shape_of(t);
        dv_desc_of(&sh, 0, t->nbytes, &res->t[0]);
        *moved = t->nbytes;
        return true;
}

/*
 * dv_fast_stat() - for devald's figures of step seq, which a rank ran: rank last arrived
 * last, at lastt, the first at first (the ranks' own clock readings).
 */
void dv_fast_stat(deval_group *g, uint32_t seq, int last, uint64_t first, uint64_t lastt) {
        uint64_t now = dv_now_ns();
        DvFastStat *st = &g->hdr->fast.stats[seq % DV_FAST_STATS];
        st->last = last;
        st->late_us = (uint32_t)DV_MIN((lastt - first) / 1000, (uint64_t)UINT32_MAX);
        st->lat_us = (uint32_t)DV_MIN((now - DV_MIN(first, now)) / 1000, (uint64_t)UINT32_MAX);
        st->seq = seq;
}

/* Who arrived last and when, from the slots. */
static void fast_stat(deval_group *g, uint32_t seq) {
        uint64_t first = UINT64_MAX, lastt = 0;
        int last = 0;
        for (int k = 0; k < g->world; k++) {
                uint64_t t = g->hdr->slots[k].arrived_ns;
                first = DV_MIN(first, t);
                if (t > lastt) {
                        lastt = t;
                        last = k;
                }
        }
        dv_fast_stat(g, seq, last, first, lastt);
}

_Static_assert(sizeof(DvKernelSeg) == sizeof(((DvShare *)0)->segs[0]), "DvShare holds segments");

enum {
        RUN_DEVALD, /* hand it to devald */
        RUN_DONE,   /* done here */
        RUN_SHARED  /* planned here; every rank copies its share */
};

/* Run step seq here, or plan it for every rank to copy a share of, or leave it to devald. */
static int fast_run(deval_group *g, uint32_t seq) {
        DvRequest *q = g->fast.reqs;
        DvResult res;
        uint64_t moved = 0;
        bool ok, shared = false, direct;

        if (!fast_requests(g, seq, q, &direct))
                return RUN_DEVALD;
        /* what does not agree, devald runs, and names */
        bool pass_open = atomic_load_explicit(&g->pass_sh->open, memory_order_relaxed);
        DvAgree a = {.q = q,
                     .world = g->world,
                     .call = q[0].call,
                     .pass_open = pass_open,
                     .desc = fast_desc,
                     .ctx = g};
        if (dv_agree(&a) < 0)
                return RUN_DEVALD;
        memset(&res, 0, offsetof(DvResult, t));
        switch (q[0].op) {
        case DV_OP_GATHER:
        case DV_OP_GATHER_METRICS:
                ok = fast_gather(g, q, pass_open, direct, &res, &moved, &shared);
                break;
        case DV_OP_PAD:
                ok = fast_pad(g, q, &res, &moved);
                break;
        case DV_OP_REDUCE:
                ok = fast_reduce(g, q, &res, &moved);
                break;
        case DV_OP_BROADCAST:
                ok = fast_broadcast(g, q, &res, &moved);
                break;
        default: /* a barrier: every rank is here */
                ok = true;
                break;
        }
        if (!ok)
                return RUN_DEVALD;
        res.op = q[0].op;
        res.site = q[0].site;
        res.batch = q[0].batch;
        DvFast *f = &g->hdr->fast;
        memcpy(&f->res, &res, offsetof(DvResult, t) + res.ntensors * sizeof(DvTensorDesc));
        f->executor = g->rank;
        atomic_fetch_add_explicit(&f->bytes_moved, moved, memory_order_relaxed);
        fast_stat(g, seq);
        return shared ? RUN_SHARED : RUN_DONE;
}

/* Store seq into word (done_seq, share_seq) and wake the ranks asleep. seq_cst with the
 * sleepers' count: a rank going to sleep sees the word, or is seen here and woken. */
static void fast_announce(deval_group *g, _Atomic uint32_t *word, uint32_t seq) {
        DvFast *f = &g->hdr->fast;
        atomic_store_explicit(word, seq, memory_order_seq_cst);
        atomic_fetch_add_explicit(&f->wake, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&f->sleepers, memory_order_seq_cst))
                dv_futex_wake(&f->wake);
}

/* Step seq is done: publish it. */
static void fast_publish(deval_group *g, uint32_t seq) {
        fast_announce(g, &g->hdr->fast.done_seq, seq);
}

/* Step seq cannot run on the ranks, and some rank's input is in its own memory, where
 * devald cannot read it: done unrun, for every rank to call again with its input staged. */
static void fast_restage(deval_group *g, uint32_t seq) {
        DvFast *f = &g->hdr->fast;
        memset(&f->res, 0, offsetof(DvResult, t));
        f->res.status = DV_FAST_RESTAGE;
        f->res.op = g->hdr->slots[g->rank].req.op;
        f->executor = g->rank;
        fast_stat(g, seq);
        fast_publish(g, seq);
}

static bool add_ok(uint64_t a, uint64_t b, uint64_t *ret) {
        return !__builtin_add_overflow(a, b, ret);
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *ret) {
        return !__builtin_mul_overflow(a, b, ret);
}

/* Does piece count - 1 of len bytes at base + (count - 1) * stride end within size? */
static bool pieces_fit(uint64_t base, uint64_t stride, uint64_t count, uint64_t len,
                       uint64_t size) {
        uint64_t last, end;
        return mul_ok(count - 1, stride, &last) && add_ok(base, last, &end) &&
               add_ok(end, len, &end) && end <= size;
}

/*
 * The runner's plan, copied out and checked segment by segment against the output area and
 * the inline inputs (the runner is another process: its plan is not trusted further than
 * its data). Return: the segment count, or -1.
 */
static int share_plan(deval_group *g, DvKernelSeg **ret_segs, uint64_t **ret_starts,
                      const uint8_t ***ret_srcs, uint64_t *ret_total) {
        const DvShare *sh = g->fast.share;
        uint32_t nsegs = sh->nsegs, nsrcs = sh->nsrcs;
        uint64_t total = sh->total, inl_all = (uint64_t)g->world * g->inl_size;
        if (nsegs == 0 || nsegs > DV_SHARE_SEGS || nsrcs > (uint32_t)g->world * DEVAL_MAX_TENSORS ||
            total > g->fast.out_size)
                return -1;
        DvKernelSeg *segs = scratch(g, 3, nsegs * sizeof(*segs));
        uint64_t *starts = scratch(g, 4, (nsegs + 1) * sizeof(*starts));
        const uint8_t **srcs = scratch(g, 2, (nsrcs + 1) * sizeof(*srcs));
        uint64_t *off = scratch(g, 1, (nsrcs + 1) * sizeof(*off));
        if (!segs || !starts || !srcs || !off)
                return -1;
        memcpy(segs, sh->segs, nsegs * sizeof(*segs));
        memcpy(starts, sh->starts, (nsegs + 1) * sizeof(*starts));
        memcpy(off, sh->src_off, nsrcs * sizeof(*off));
        if (starts[0] != 0 || starts[nsegs] != total)
                return -1;
        for (uint32_t k = 0; k < nsegs; k++) {
                const DvKernelSeg *s = &segs[k];
                uint64_t bytes, next;
                if ((s->kind != DV_KSEG_COPY && s->kind != DV_KSEG_FILL) || !s->len || !s->count ||
                    !mul_ok(s->len, s->count, &bytes) || !add_ok(starts[k], bytes, &next) ||
                    next != starts[k + 1] ||
                    !pieces_fit(s->dst, s->dst_stride, s->count, s->len, g->fast.out_size))
                        return -1;
                if (s->kind == DV_KSEG_FILL && (s->elem < 1 || s->elem > 8))
                        return -1;
                if (s->kind == DV_KSEG_COPY && (s->src >= nsrcs || off[s->src] > inl_all ||
                                                !pieces_fit(off[s->src] + s->src_off, s->src_stride,
                                                            s->count, s->len, inl_all) ||
                                                s->src_off > inl_all))
                        return -1;
        }
        for (uint32_t j = 0; j < nsrcs; j++)
                srcs[j] = g->inl_all + off[j];
        *ret_segs = segs;
        *ret_starts = starts;
        *ret_srcs = srcs;
        *ret_total = total;
        return (int)nsegs;
}

/* This rank's bytes [rank, rank + 1) * total / world of a plan shared by bytes; -1 for a
 * plan that does not check out. */
static int share_bytes(deval_group *g) {
        DvKernelSeg *segs;
        uint64_t *starts, total;
        const uint8_t **srcs;

        int n = share_plan(g, &segs, &starts, &srcs, &total);
        if (n < 0)
                return -1;
        uint64_t lo = total / (uint64_t)g->world * (uint64_t)g->rank;
        uint64_t hi = g->rank == g->world - 1
                              ? total
                              : total / (uint64_t)g->world * (uint64_t)(g->rank + 1);
        dv_kplan_run(segs, starts, (uint32_t)n, lo, hi - lo, g->fast.out, srcs);
        return 0;
}

/*
 * Write checked own segment k into the direct output; with stream, a copy whose rows are
 * completed by the pad segment after it (the plan opens them together) is written row by
 * row, assembled in a buffer and streamed whole, so each output line is written once.
 * Return: the segments written beyond k (0, or 1 for that pad).
 */
static uint32_t own_write(deval_group *g, const DvKernelSeg *segs, uint32_t k, uint32_t n,
                          bool stream) {
        const DvKernelSeg *s = &segs[k], *f = k + 1 < n ? &segs[k + 1] : NULL;
        uint8_t *out = g->direct.out;

        if (s->kind == DV_KSEG_FILL) {
                for (uint64_t c = 0; c < s->count; c++)
                        dv_fill_pattern(out + s->dst + c * s->dst_stride, s->len, s->pat, s->elem);
                return 0;
        }
        const uint8_t *src = g->own_src[s->src] + s->src_off;
        if (stream && f && f->kind == DV_KSEG_FILL && f->count == s->count &&
            f->dst == s->dst + s->len && f->dst_stride == s->dst_stride &&
            s->len + f->len == s->dst_stride && s->dst_stride <= DV_ROW_MAX) {
                dv_stream_padded_rows(out + s->dst, s->dst_stride, src, s->src_stride, s->len,
                                      s->count, f->pat, f->elem);
                return 1;
        }
        for (uint64_t c = 0; c < s->count; c++)
                dv_copy_out(stream, out + s->dst + c * s->dst_stride, src + c * s->src_stride,
                            s->len);
        return 0;
}

/*
 * This rank's rows of a step every rank writes into the direct output (DV_SHARE_OWN): the
 * plan's segments of its own sources, read where this rank's own record says its inputs lie
 * (never where the shared slot says), each checked against those inputs and the direct
 * output of the plan's generation before a byte is copied. Every segment must be some
 * rank's. Return: 0, or -1 for a plan that does not check out.
 */
static int share_own(deval_group *g, uint32_t seq) {
        const DvShare *sh = g->fast.share;
        uint32_t nsegs = sh->nsegs, per = sh->per_rank, mine = 0;
        uint64_t gen = sh->gen, sh_total = sh->total;

        if (nsegs > DV_SHARE_SEGS || per != (uint32_t)g->own_n || per == 0)
                return -1;
        /* a runner grew it: map the new one */
        if (gen != g->direct.gen && dv_direct_output(g, 0) < 0)
                return -1;
        DvKernelSeg *segs = scratch(g, 3, (nsegs + 1) * sizeof(*segs));
        if (gen != g->direct.gen || !segs)
                return -1;
        memcpy(segs, sh->segs, nsegs * sizeof(*segs));
        for (uint32_t k = 0; k < nsegs; k++) {
                DvKernelSeg s = segs[k];
                uint64_t bytes;
                if (s.src / per >= (uint32_t)g->world)
                        return -1;
                if (s.src / per != (uint32_t)g->rank)
                        continue;
                s.src %= per;
                if ((s.kind != DV_KSEG_COPY && s.kind != DV_KSEG_FILL) || !s.len || !s.count ||
                    !mul_ok(s.len, s.count, &bytes) ||
                    !pieces_fit(s.dst, s.dst_stride, s.count, s.len, g->direct.size))
                        return -1;
                if (s.kind == DV_KSEG_FILL && (s.elem < 1 || s.elem > 8))
                        return -1;
                if (s.kind == DV_KSEG_COPY &&
                    !pieces_fit(s.src_off, s.src_stride, s.count, s.len, g->own_bytes[s.src]))
                        return -1;
                segs[mine++] = s;
        }
        DV_FAULT("fast_direct", seq);
        /* a large output will not stay in the caches: stream it, as devald's executor does */
        bool stream = sh_total >= DV_STREAM_MIN;
        for (uint32_t k = 0; k < mine; k++)
                k += own_write(g, segs, k, mine, stream);
        dv_stream_fence(stream);
        g->direct.seq = seq;
        return 0;
}

/*
 * dv_fast_share() - this rank's share of step seq's copy, planned by its runner: a slice of
 * the bytes of the flattened plan (DV_SHARE_BYTES), or its own rows (DV_SHARE_OWN), after
 * checking the plan. Then it counts itself in; the last rank to do so publishes the step. A
 * plan that does not check out is copied by nobody here and fails the step on every rank.
 */
void dv_fast_share(deval_group *g, uint32_t seq) {
        DvFast *f = &g->hdr->fast;

        g->fast.share_did = seq;
        DV_FAULT("fast_share", seq);
        uint32_t mode = g->fast.share->mode;
        int r = mode == DV_SHARE_OWN     ? share_own(g, seq)
                : mode == DV_SHARE_BYTES ? share_bytes(g)
                                         : -1;
        if (r < 0)
                atomic_store_explicit(&f->share_bad, 1, memory_order_relaxed);
        atomic_store_explicit(&g->hdr->slots[g->rank].shared_seq, seq, memory_order_relaxed);
        uint32_t done = atomic_fetch_add_explicit(&f->shared, 1, memory_order_acq_rel) + 1;
        if (done == (uint32_t)g->world)
                fast_publish(g, seq);
}

/* Has the runner of step seq published a plan this rank has not copied its share of? */
bool dv_fast_share_due(const deval_group *g, uint32_t seq) {
        return g->fast.share_did != seq &&
               atomic_load_explicit(&g->hdr->fast.share_seq, memory_order_acquire) == seq;
}

/*
 * dv_fast_arrive() - count this rank in at step seq (its slot is complete and arrived_seq
 * stored). The last rank to arrive runs the step, or plans it for every rank to copy a
 * share of, or hands it to devald.
 */
void dv_fast_arrive(deval_group *g, uint32_t seq) {
        DvFast *f = &g->hdr->fast;
        uint32_t n = atomic_fetch_add_explicit(&f->count, 1, memory_order_acq_rel) + 1;
        if (n != (uint32_t)g->world)
                return; /* not the last; or a count some rank broke, which devald's timeout ends */
        /* nobody arrives at the next step before this one is published */
        atomic_store_explicit(&f->count, 0, memory_order_relaxed);
        f->runner = g->rank; /* for devald's words, should this rank stop here */
        DV_FAULT("fast_run", seq);
        /* with devald gone, nobody would notice a rank dying: then the step is devald's, and
         * the ranks find it gone. Asked at most once a millisecond: a system call. */
        uint64_t now = dv_now_ns();
        bool alive = true;
        if (now - g->alive_ns > 1000000) {
                alive = dv_daemon_alive(g);
                g->alive_ns = now;
        }
        int how = alive ? fast_run(g, seq) : RUN_DEVALD;
        if (how == RUN_DEVALD && any_direct(g)) {
                fast_restage(g, seq);
                return;
        }
        if (how == RUN_DONE) {
                DV_FAULT("fast_publish", seq);
                if (DV_FAULT_SAYS("fast_publish", seq, "garbage"))
                        memset(&f->res, 0xa5, sizeof(f->res));
                fast_publish(g, seq);
                return;
        }
        if (how == RUN_SHARED) {
                atomic_store_explicit(&f->share_bad, 0, memory_order_relaxed);
                atomic_store_explicit(&f->shared, 0, memory_order_relaxed);
                /* the plan, res and the resets are written before share_seq says so */
                fast_announce(g, &f->share_seq, seq);
                dv_fast_share(g, seq);
                return;
        }
        /* release: the reset count and every slot are visible to the worker, and through
         * its publication, to the ranks at the next step */
        atomic_store_explicit(&f->handoff_seq, seq, memory_order_release);
        atomic_fetch_add_explicit(&g->hdr->arrive, 1, memory_order_release);
        dv_futex_wake(&g->hdr->arrive);
}
