/* SPDX-License-Identifier: MIT */
/*
 * run.c - where a collective runs, and its result (run.h): the one interface every entry
 * point calls once its request is staged. A step runs on every rank (mirror.c), on the last
 * rank to arrive (fast.c), on devald, or across machines (span_step.c); a rank that replays
 * what devald answered for it takes the kept result (replay.c). This rank arrives (release
 * store, futex wake), spins, yields or sleeps on the group's wake word until the step is
 * done, the group fails or devald hangs up, and takes the result from where the step ran.
 * No socket traffic on this path.
 */
#define _GNU_SOURCE
#include "run.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "deval.h"

#include "arena.h"
#include "calls.h"
#include "dtype.h"
#include "fast.h"
#include "fault.h"
#include "handle.h"
#include "mirror.h"
#include "plan.h"
#include "replay.h"
#include "util.h"

#define SLICE_NS         (20 * 1000 * 1000) /* how often a sleeping rank checks devald is alive */
#define WAIT_GRACE_NS    (2000ll * 1000 * 1000)
#define CROWDED_YIELD_NS (1000 * 1000) /* a crowded machine: as with more ranks than cores */

static int group_fail_local(deval_group *g, int status, const char *msg) {
        g->failed = status;
        return dv_set_err(g, status, "%s", msg);
}

/* Only the process that joined may use the handle: a forked child shares its slot. */
int dv_coll_owner(deval_group *g) {
        if (g->forks != dv_forks() && g->pid != getpid())
                return dv_set_err(g, DEVAL_EINVAL,
                                  "this group handle belongs to pid %d, which joined as rank %d; "
                                  "a forked process must join a group of its own",
                                  (int)g->pid, g->rank);
        return 0;
}

/* Is the collective in flight answered from the pass's journal (resume.c, once a pass began)? */
static bool journal_answers(const deval_group *g) {
        return g->resume_ops && g->resume_ops->answers(g);
}

bool dv_coll_kept(const deval_group *g) {
        return (g->replay.on && dv_replay_pending(g)) || journal_answers(g);
}

/* A collective may start: the group has not failed (a failure sticks, with its message). */
int dv_coll_begin(deval_group *g) {
        int r = dv_coll_owner(g);
        if (r < 0)
                return r;
        if (dv_coll_kept(g))
                return 0; /* answered from what was kept, whatever the group did since */
        if (g->failed)
                return g->failed;
        if (g->span)
                return 0;
        int s = atomic_load_explicit(&g->done->abort_status, memory_order_acquire);
        if (s)
                return group_fail_local(g, s, g->done->abort_msg);
        return 0;
}

/*
 * Would a collective that begins now take a step? dv_coll_begin()'s checks (this process's
 * handle, not answered from what was kept, the group neither failed nor aborted), without
 * its side effects: it records an abort as the group's failure.
 */
bool dv_coll_steps(const deval_group *g) {
        if (g->forks != dv_forks() && g->pid != getpid())
                return false;
        if (dv_coll_kept(g) || g->failed)
                return false;
        return g->span || !atomic_load_explicit(&g->done->abort_status, memory_order_acquire);
}

/* Who ran a step this rank saw done (coll_arrive()). */
enum {
        BY_DEVALD, /* the result is in the completion segment and the output arena */
        BY_RANK,   /* the last rank to arrive ran it: DvFast */
        BY_MIRROR  /* this rank ran it, as every rank did (mirror.c) */
};

/* Step seq is done: by devald (*by BY_DEVALD), or by the rank that arrived last (BY_RANK). */
static bool coll_done(const deval_group *g, uint32_t seq, int *by) {
        /* acquire pairs with the release stores after every result was written */
        if (atomic_load_explicit(&g->hdr->fast.done_seq, memory_order_seq_cst) == seq) {
                *by = BY_RANK;
                return true;
        }
        uint32_t done = atomic_load_explicit(&g->done->done_seq, memory_order_acquire);
        *by = BY_DEVALD;
        return (int32_t)(done - seq) >= 0;
}

/*
 * Is step seq done? While this rank waits to mirror it (*mirror), it is done once every
 * rank's record is there and this rank ran it (BY_MIRROR); when the records say it is not a
 * step to mirror, this rank counts itself in as for any other (*mirror turns false).
 */
static bool step_done(deval_group *g, uint32_t seq, bool *mirror, int *by) {
        if (*mirror) {
                int m = dv_mirror_run(g, seq);
                if (m > 0) {
                        *by = BY_MIRROR;
                        return true;
                }
                if (m == 0)
                        return false;
                *mirror = false;
                dv_fast_arrive(g, seq);
        }
        return coll_done(g, seq, by);
}

/*
 * coll_arrive() - arrive at the step filled in this rank's slot (for g->seq + 1) and wait
 * until it is done: by every rank, if it is one they mirror; by this rank, if it is the last
 * and the step is one the ranks run; by another rank, or by devald. Return: 0 with *by
 * saying where the result is, or the group's failure, which sticks.
 */
static int coll_arrive(deval_group *g, const char *fn, int *by) {
        DvCtlHeader *h = g->hdr;
        DvFast *f = &h->fast;
        const DvDoneHeader *d = g->done;
        DvSlot *slot = &h->slots[g->rank];
        uint32_t seq = ++g->seq;
        uint32_t call = slot->req.call = g->call_as ? g->call_as : dv_call_no(g, seq);
        uint64_t start = dv_now_ns();
        /* on a crowded machine, waiting ranks leave their cores to the ranks still to come */
        bool crowded = g->crowd_aware && dv_crowded(&g->crowd, start);
        uint64_t spin_ns = crowded ? 0 : g->spin_ns;
        uint64_t yield_ns = crowded ? CROWDED_YIELD_NS : g->yield_ns;
        int64_t limit = g->timeout_ms < 0 ? -1 : (int64_t)g->timeout_ms * 1000000 + WAIT_GRACE_NS;

        DV_FAULT("before_arrive", seq);
        slot->arrived_ns = start;
        bool mirror = dv_mirror_post(g, seq, start);
        /* release: the request is complete before the others or devald can see the arrival */
        atomic_store_explicit(&slot->arrived_seq, seq, memory_order_release);
        if (!mirror)
                dv_fast_arrive(g, seq);
        DV_FAULT("after_arrive", seq);

        for (;;) {
                uint32_t w = atomic_load_explicit(&f->wake, memory_order_acquire);
                if (step_done(g, seq, &mirror, by))
                        return 0;
                DV_FAULT("wait_done", seq);
                /* A failure seen now may have come after this step was done: another rank
                 * saw it done and left before this one looked. The failure's release store
                 * comes after that done_seq, so a second look at done_seq sees it. */
                int s = atomic_load_explicit(&d->abort_status, memory_order_acquire);
                if (s)
                        return step_done(g, seq, &mirror, by)
                                       ? 0
                                       : group_fail_local(g, s, d->abort_msg);
                if (dv_fast_share_due(g, seq)) { /* the runner's plan: copy a share of it */
                        dv_fast_share(g, seq);
                        continue;
                }
                uint64_t now = dv_now_ns();
                /* a step handed to devald needs its worker on a core: no spinning then */
                bool handed = atomic_load_explicit(&f->handoff_seq, memory_order_relaxed) == seq;
                if (!handed && now - start < spin_ns) {
                        dv_cpu_relax();
                        continue;
                }
                if (!handed && now - start < spin_ns + yield_ns) {
                        sched_yield(); /* more ranks than cores: let the others arrive */
                        continue;
                }
                if (limit >= 0 && (int64_t)(now - start) > limit) {
                        if (step_done(g, seq, &mirror, by))
                                return 0;
                        char msg[384];
                        snprintf(msg, sizeof(msg),
                                 "%s: collective #%u did not finish within %d ms (the join's "
                                 "timeout; " DV_TIMEOUT_SET ")",
                                 fn, call, g->timeout_ms);
                        return group_fail_local(g, DEVAL_ETIMEDOUT, msg);
                }
                /* seq_cst with the finisher: it sees this sleeper, or this sees its done_seq */
                atomic_fetch_add_explicit(&f->sleepers, 1, memory_order_seq_cst);
                DV_FAULT("wait_sleep", seq);
                /* seen done now, the step is taken now: a mirrored step run twice would be
                 * counted twice */
                bool done = step_done(g, seq, &mirror, by);
                if (!done)
                        dv_futex_wait(&f->wake, w, SLICE_NS);
                atomic_fetch_sub_explicit(&f->sleepers, 1, memory_order_seq_cst);
                if (done)
                        return 0;
                if (!dv_daemon_alive(g)) {
                        if (step_done(g, seq, &mirror, by)) /* done before devald went */
                                return 0;
                        /* devald publishes its shutdown before it hangs up: prefer its words */
                        s = atomic_load_explicit(&d->abort_status, memory_order_acquire);
                        if (s)
                                return group_fail_local(g, s, d->abort_msg);
                        char msg[256];
                        snprintf(msg, sizeof(msg), "%s: devald at %s is gone (collective #%u)", fn,
                                 g->socket_path, call);
                        return group_fail_local(g, DEVAL_EDAEMON, msg);
                }
        }
}

#define FAST_RESTAGED 1 /* fast_result(): the step was not run; call again, staged */

/*
 * The result of a step a rank ran: the same for every rank, but for a gather to one root,
 * which the others get with no rows. Another rank wrote it, so it is checked like devald's.
 */
static int fast_result(deval_group *g, const char *fn, bool pass_end, const DvResult **ret) {
        const DvFast *f = &g->hdr->fast;
        const DvRequest *q = &g->hdr->slots[g->rank].req;
        DvResult *res = &g->fast.res;

        memcpy(res, &f->res, offsetof(DvResult, t));
        if (res->status == DV_FAST_RESTAGE)
                return FAST_RESTAGED;
        if (atomic_load_explicit(&f->share_seq, memory_order_acquire) == g->seq &&
            atomic_load_explicit(&f->share_bad, memory_order_relaxed))
                return dv_set_err(g, DEVAL_EPROTO,
                                  "%s: rank %d published a malformed plan of collective #%u", fn,
                                  f->executor, g->seq);
        if (pass_end || res->status != 0 || res->ntensors > DEVAL_MAX_TENSORS || res->op != q->op)
                return dv_set_err(g, DEVAL_EPROTO,
                                  "%s: rank %d wrote a malformed result of collective #%u", fn,
                                  f->executor, g->seq);
        memcpy(res->t, f->res.t, res->ntensors * sizeof(DvTensorDesc));
        if (q->op == DV_OP_PAD) { /* this rank's own: its shape, the length the runner wrote */
                const DvSlot *slot = &g->hdr->slots[g->rank];
                DvTensorDesc *t = &res->t[0];
                int64_t numel = 1;
                *t = q->t[0];
                bool outside = q->dim == DV_PAD_OUTSIDE; /* (its own shape) */
                if (res->ntensors != 1 || q->dim < 0 || (q->dim >= t->ndim && !outside))
                        return dv_set_err(g, DEVAL_EPROTO,
                                          "%s: rank %d wrote a malformed result of collective #%u",
                                          fn, f->executor, g->seq);
                if (!outside)
                        t->shape[q->dim] = slot->pad_len;
                DvShape sh = dv_shape_of(t);
                if ((!outside && t->shape[q->dim] < 0) || !dv_shape_numel(&sh, &numel) ||
                    numel > INT64_MAX / 16)
                        return dv_set_err(g, DEVAL_EPROTO,
                                          "%s: rank %d wrote a malformed result of "
                                          "collective #%u",
                                          fn, f->executor, g->seq);
                t->offset = slot->pad_off;
                t->nbytes = (uint64_t)numel * dv_dtype_size(t->dtype);
        }
        if (q->op == DV_OP_GATHER || q->op == DV_OP_GATHER_METRICS)
                dv_root_only(res, q->root, g->rank);
        if (g->direct.seq == g->seq) { /* every rank wrote its rows into the direct output */
                g->view = g->direct.out;
                g->view_size = g->direct.size;
        } else {
                g->view = g->fast.out;
                g->view_size = g->fast.out_size;
        }
        *ret = res;
        return 0;
}

/*
 * Step g->seq had this rank's input in its own memory (DV_REQ_DIRECT) and could not run on
 * the ranks: stage the input where devald reads it, inline or in the input arena, for the
 * call again. Return: 0, or the failure of the stage, as every rank learns it.
 */
static int restage(deval_group *g, const char *fn, DvRequest *q) {
        uint64_t off[DEVAL_MAX_TENSORS], end = 0;
        int n = g->own_n, r;

        if (!(q->flags & DV_REQ_DIRECT))
                return 0;
        q->flags &= ~DV_REQ_DIRECT;
        for (int i = 0; i < n; i++) {
                off[i] = DV_ALIGN(end, DV_ARENA_ALIGN);
                end = off[i] + g->own_bytes[i];
        }
        bool inl = dv_fast_inline_ok(g, end);
        if (!inl && (r = dv_reserve(g, end)) < 0)
                return dv_stage_failed(g, fn, q, r, end);
        uint8_t *base = inl ? g->inl : g->in;
        for (int i = 0; i < n; i++) {
                if (g->own_bytes[i])
                        memcpy(base + off[i], g->own_src[i], g->own_bytes[i]);
                g->own_src[i] = base + off[i];
                q->t[i].offset = off[i];
        }
        if (inl)
                q->flags |= DV_REQ_INLINE;
        return 0;
}

/**
 * dv_coll_wait() - run the collective filled in this rank's slot and take its result.
 * @pass_end: the request is an eval_end. devald may park this rank (its loader ran out
 *            before the others'): then every step it completes answers the others' collective
 *            for this rank, whose result is kept to replay (replay.c) before the rank arrives
 *            again with its eval_end, until the step that closes the pass releases it.
 * Return: 0 with the rank's result in *ret; the step's status with its message; or the
 * group's failure (DEVAL_EPEER, DEVAL_EDAEMON, DEVAL_ETIMEDOUT, DEVAL_EABORTED), which sticks.
 */
int dv_coll_wait(deval_group *g, const char *fn, bool pass_end, const DvResult **ret) {
        const DvDoneHeader *d = g->done;
        const DvResult *res = &d->res[g->rank];
        int r;

        int by;
        int restaged = 0;
        g->in_keep = 0; /* the buffer served this collective */
        for (;;) {
                if ((r = coll_arrive(g, fn, &by)) < 0)
                        return r;
                if (by == BY_MIRROR) {
                        g->view = g->mirror.out;
                        g->view_size = sizeof(g->mirror.out);
                        *ret = &g->mirror.res;
                        return 0;
                }
                bool fast = by == BY_RANK;
                if (fast && (r = fast_result(g, fn, pass_end, ret)) != FAST_RESTAGED)
                        return r;
                if (fast) { /* not run: once, for a direct input; never twice in a row */
                        DvRequest *q = &g->hdr->slots[g->rank].req;
                        if (++restaged > 2)
                                return dv_set_err(g, DEVAL_EPROTO,
                                                  "%s: rank %d turned collective #%u back "
                                                  "unrun, again",
                                                  fn, g->hdr->fast.executor, dv_call_no(g, g->seq));
                        g->restages++; /* the same call, under the next step's number */
                        q->seq = g->seq + 1;
                        if ((r = restage(g, fn, q)) < 0)
                                return r;
                        continue;
                }
                restaged = 0;
                if (!pass_end)
                        break;
                /* acquire pairs with the worker's release store of pass_end_seq */
                uint32_t end = atomic_load_explicit(&((DvDoneHeader *)d)->pass_end_seq,
                                                    memory_order_acquire);
                if ((int32_t)(end - g->seq) >= 0)
                        break;
                if (res->status == 0) {
                        if (res->ntensors > DEVAL_MAX_TENSORS)
                                r = dv_set_err(g, DEVAL_EPROTO,
                                               "%s: devald sent a malformed result", fn);
                        else if ((r = dv_refresh_output(g)) == 0)
                                r = dv_replay_keep(g, fn, res);
                        if (r < 0) { /* the others cannot go on without this rank: it sticks */
                                g->failed = r;
                                return r;
                        }
                }
                g->hdr->slots[g->rank].req.seq = g->seq + 1;
        }
        if (res->status < 0) {
                int status = res->status;
                if (status < DEVAL_ESYS)
                        status = DEVAL_EPROTO;
                return dv_set_err(g, status, "%s: %.*s", fn, DV_MSG_MAX, d->msg);
        }
        if (res->ntensors > DEVAL_MAX_TENSORS)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        if ((r = dv_refresh_output(g)) < 0)
                return r;
        g->view = g->out;
        g->view_size = g->out_size;
        *ret = res;
        return 0;
}

/*
 * dv_coll_run() - dv_coll_wait() for any collective but eval_end. While this rank replays what
 * devald answered for it in its last pass, the next kept result answers instead; in a batch
 * a resumed pass kept, the journal's (resume.h). A batch's results go to the pass's journal.
 */
int dv_coll_run(deval_group *g, const char *fn, const DvResult **ret) {
        if (g->replay.on && dv_replay_pending(g))
                return dv_replay_take(g, fn, g->req, ret);
        if (journal_answers(g))
                return g->resume_ops->take(g, fn, g->req, ret);
        int r = g->span ? g->span_ops->run(g, fn, false, ret)
                        : dv_coll_wait(g, fn, /* pass_end= */ false, ret);
        if (g->batch && g->resume_ops) /* (a pass that keeps no journal: nothing) */
                g->resume_ops->keep(g, r == 0 ? *ret : NULL);
        return r;
}

/*
 * The input did not fit: over the quota, every rank must learn it, so arrive with the
 * failure and let the step fail everywhere. A dead devald needs no arrival.
 */
int dv_stage_failed(deval_group *g, const char *fn, DvRequest *q, int status, uint64_t bytes) {
        const DvResult *res;
        if (status != DEVAL_ENOMEM && status != DEVAL_ESYS)
                return status;
        q->status = status;
        q->staged_bytes = bytes;
        /* its own account travels with it, cut to fit */
        memcpy(q->why, g->errmsg, sizeof(q->why) - 1);
        q->why[sizeof(q->why) - 1] = '\0';
        q->ntensors = 0;
        int r = dv_coll_run(g, fn, &res);
        return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: devald accepted a failed stage", fn);
}
