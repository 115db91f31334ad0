/* SPDX-License-Identifier: MIT */
/*
 * collective.c - libdeval's collectives. Each one checks its arguments, copies the inputs
 * into this rank's input arena, fills this rank's slot of the control segment, arrives
 * (release store + futex wake of the worker) and sleeps on the group's wake word until
 * devald publishes the step, a failure of the group, or hangs up. No socket traffic on this
 * path, except to grow the input arena or map a new output arena.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "arena.h"
#include "client.h"
#include "dtype.h"
#include "fault.h"
#include "gpu.h"
#include "ident.h"
#include "span_step.h"
#include "util.h"

#define SLICE_NS         (20 * 1000 * 1000) /* how often a sleeping rank checks devald is alive */
#define WAIT_GRACE_NS    (2000ll * 1000 * 1000)
#define CROWDED_YIELD_NS (1000 * 1000) /* a crowded machine: as with more ranks than cores */

static int group_fail_local(deval_group *g, int status, const char *msg) {
        g->failed = status;
        return dv_set_err(g, status, "%s", msg);
}

/* Only the process that joined may use the handle: a forked child shares its slot. */
static int coll_owner(deval_group *g) {
        if (g->forks != dv_forks() && g->pid != getpid())
                return dv_set_err(g, DEVAL_EINVAL,
                                  "this group handle belongs to pid %d, which joined as rank %d; "
                                  "a forked process must join a group of its own",
                                  (int)g->pid, g->rank);
        return 0;
}

/* A collective may start: the group has not failed (a failure sticks, with its message). */
static int coll_begin(deval_group *g) {
        int r = coll_owner(g);
        if (r < 0)
                return r;
        if (g->replaying && dv_replay_pending(g))
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

static int check_tensor(deval_group *g, const char *fn, int i, const deval_tensor *t,
                        bool need_data, uint64_t *ret_bytes) {
        int64_t numel = 1, bytes;

        if (!dv_dtype_valid(t->dtype))
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d has unknown dtype %d", fn, i,
                                  t->dtype);
        if (t->ndim < 0 || t->ndim > DEVAL_MAX_DIMS)
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d has ndim %d, not 0..%d", fn, i,
                                  t->ndim, DEVAL_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++) {
                if (t->shape[d] < 0)
                        return dv_set_err(g, DEVAL_EINVAL,
                                          "%s: tensor %d has a negative size %" PRId64 " in dim %d",
                                          fn, i, t->shape[d], d);
                if (!dv_mul_ok(numel, t->shape[d], &numel))
                        return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d's size overflows", fn, i);
        }
        if (!dv_mul_ok(numel, (int64_t)dv_dtype_size(t->dtype), &bytes) || bytes > INT64_MAX / 2)
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d's size overflows", fn, i);
        if (t->device < -1)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: tensor %d has device %d, not -1 (host) "
                                  "or a CUDA device ordinal",
                                  fn, i, t->device);
        if (t->device >= 0) {
                /* staged through host memory: the driver loads on first use */
                const DvGpuApi *gpu = dv_gpu();
                int r, count = 0;
                if ((r = gpu->init()) < 0 || (r = gpu->device_count(&count)) < 0)
                        return dv_set_err(g, r, "%s: tensor %d: %s", fn, i, dv_gpu_error());
                if (t->device >= count)
                        return dv_set_err(g, DEVAL_EINVAL,
                                          "%s: tensor %d is on CUDA device %d, but %d are visible",
                                          fn, i, t->device, count);
        }
        if (need_data && bytes > 0 && !t->data)
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d's data is NULL", fn, i);
        *ret_bytes = (uint64_t)bytes;
        return 0;
}

/*
 * Start this rank's request in its shared slot. The slot is the joining process's: checked
 * before a byte of it is written, since a forked child maps the same slot, and its parent's
 * request may be waiting there for the other ranks.
 */
static int req_start(deval_group *g, uint32_t op, DvRequest **ret) {
        int r = coll_owner(g);
        if (r < 0)
                return r;
        DvRequest *q = g->req;
        memset(q, 0, offsetof(DvRequest, t));
        q->seq = g->seq + 1;
        q->op = op;
        q->batch = g->batch_no;
        q->valid_rows = -1;
        q->keep_rows = -1;
        q->root = -1;
        *ret = q;
        return 0;
}

/* Which call of the batch a *_METRICS request is (deval_eval_batch()); 0 without batches. */
static int req_site(deval_group *g, const char *fn, DvRequest *q) {
        int kind = q->op == DV_OP_OBJECTS_METRICS;
        if (q->op != DV_OP_GATHER_METRICS && !kind)
                return 0;
        if (!g->batch)
                return 0;
        if (g->site[kind] >= DV_PASS_SITES)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: more than %d calls in one batch of the eval pass; gather "
                                  "the tensors of a batch in fewer calls",
                                  fn, DV_PASS_SITES);
        q->site = g->site[kind]++;
        return 0;
}

static void desc_set(DvTensorDesc *d, const deval_tensor *t, uint64_t offset, uint64_t bytes) {
        memset(d, 0, sizeof(*d));
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        for (int k = 0; k < t->ndim; k++)
                d->shape[k] = t->shape[k];
        d->offset = offset;
        d->nbytes = bytes;
}

/* Is devald still there? Its hang-up (or any unexpected message) means it is gone. */
bool dv_daemon_alive(const deval_group *g) {
        struct pollfd p = {.fd = g->sock, .events = POLLIN | POLLRDHUP};
        return poll(&p, 1, 0) == 0;
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
        uint32_t call = slot->req.call = g->call_as ? g->call_as : seq - g->restages;
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
                if (!step_done(g, seq, &mirror, by))
                        dv_futex_wait(&f->wake, w, SLICE_NS);
                atomic_fetch_sub_explicit(&f->sleepers, 1, memory_order_seq_cst);
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

static int stage_failed(deval_group *g, const char *fn, DvRequest *q, int status, uint64_t bytes);

#define FAST_RESTAGED 1 /* fast_result(): the step was not run; call again, staged */

/*
 * The result of a step a rank ran: the same for every rank, but for a gather to one root,
 * which the others get with no rows. Another rank wrote it, so it is checked like devald's.
 */
static int fast_result(deval_group *g, const char *fn, bool pass_end, const DvResult **ret) {
        const DvFast *f = &g->hdr->fast;
        const DvRequest *q = &g->hdr->slots[g->rank].req;
        DvResult *res = &g->fast_res;

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
                if (res->ntensors != 1 || q->dim < 0 || q->dim >= t->ndim)
                        return dv_set_err(g, DEVAL_EPROTO,
                                          "%s: rank %d wrote a malformed result of collective #%u",
                                          fn, f->executor, g->seq);
                t->shape[q->dim] = slot->pad_len;
                DvShape sh = dv_shape_of(t);
                if (t->shape[q->dim] < 0 || !dv_shape_numel(&sh, &numel) || numel > INT64_MAX / 16)
                        return dv_set_err(g, DEVAL_EPROTO,
                                          "%s: rank %d wrote a malformed result of "
                                          "collective #%u",
                                          fn, f->executor, g->seq);
                t->offset = slot->pad_off;
                t->nbytes = (uint64_t)numel * dv_dtype_size(t->dtype);
        }
        bool gather = q->op == DV_OP_GATHER || q->op == DV_OP_GATHER_METRICS;
        for (uint32_t i = 0; gather && q->root >= 0 && q->root != g->rank && i < res->ntensors;
             i++) {
                res->t[i].shape[0] = 0;
                res->t[i].nbytes = 0;
                res->t[i].offset = 0;
        }
        if (g->direct_seq == g->seq) { /* every rank wrote its rows into the direct output */
                g->view = g->direct;
                g->view_size = g->direct_size;
        } else {
                g->view = g->fast_out;
                g->view_size = g->fast_out_size;
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
        if (!inl && (r = dv_reserve_input(g, end)) < 0)
                return stage_failed(g, fn, q, r, end);
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
 * coll_wait() - run the collective filled in this rank's slot and take its result.
 * @pass_end: the request is an eval_end. devald may park this rank (its loader ran out
 *            before the others'): then every step it completes answers the others' collective
 *            for this rank, whose result is kept to replay (replay.c) before the rank arrives
 *            again with its eval_end, until the step that closes the pass releases it.
 * Return: 0 with the rank's result in *ret; the step's status with its message; or the
 * group's failure (DEVAL_EPEER, DEVAL_EDAEMON, DEVAL_ETIMEDOUT, DEVAL_EABORTED), which sticks.
 */
static int coll_wait(deval_group *g, const char *fn, bool pass_end, const DvResult **ret) {
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
                        g->view = g->mirror_out;
                        g->view_size = sizeof(g->mirror_out);
                        *ret = &g->mirror_res;
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
                                                  fn, g->hdr->fast.executor, g->seq - g->restages);
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
 * coll_run() - coll_wait() for any collective but eval_end. While this rank replays what
 * devald answered for it in its last pass, the next kept result answers instead.
 */
static int coll_run(deval_group *g, const char *fn, const DvResult **ret) {
        if (g->replaying && dv_replay_pending(g))
                return dv_replay_take(g, fn, g->req, ret);
        if (g->span)
                return dv_span_run(g, fn, false, ret);
        return coll_wait(g, fn, /* pass_end= */ false, ret);
}

/* A result descriptor as a view into the arena at base (size bytes), after checking it fits. */
static int view_in(deval_group *g, const char *fn, const DvTensorDesc *d, const uint8_t *base,
                   uint64_t size, deval_tensor *out) {
        int64_t numel = 1;
        if (!dv_dtype_valid(d->dtype) || d->ndim < 0 || d->ndim > DEVAL_MAX_DIMS ||
            d->offset > size || d->nbytes > size - d->offset)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        memset(out, 0, sizeof(*out));
        out->dtype = d->dtype;
        out->ndim = d->ndim;
        for (int k = 0; k < d->ndim; k++) {
                out->shape[k] = d->shape[k];
                if (d->shape[k] < 0 || !dv_mul_ok(numel, d->shape[k], &numel))
                        return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result",
                                          fn);
        }
        if ((uint64_t)numel * dv_dtype_size(d->dtype) != d->nbytes)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        out->device = -1;
        out->data = d->nbytes ? (void *)(base + d->offset) : NULL;
        return 0;
}

static int view_of(deval_group *g, const char *fn, const DvTensorDesc *d, deval_tensor *out) {
        return view_in(g, fn, d, g->view, g->view_size, out);
}

static const deval_gather_opts default_opts = DEVAL_GATHER_OPTS_INIT;

/* The caller's options, through their size (dv_opts_copy()), into *own. */
static int take_opts(deval_group *g, const char *fn, const deval_gather_opts *opts,
                     deval_gather_opts *own) {
        char why[256];
        if (dv_opts_copy(own, sizeof(*own), opts, opts->size, "deval_gather_opts", why,
                         sizeof(why)) < 0)
                return dv_set_err(g, DEVAL_EINVAL, "%s: %s", fn, why);
        return 0;
}

static int check_opts(deval_group *g, const char *fn, const deval_gather_opts *o) {
        if (o->order != DEVAL_ORDER_RANK && o->order != DEVAL_ORDER_STRIDED)
                return dv_set_err(g, DEVAL_EINVAL, "%s: unknown order %d", fn, o->order);
        if (o->root < -1 || o->root >= g->world)
                return dv_set_err(g, DEVAL_EINVAL, "%s: root %d is out of range -1..%d", fn,
                                  o->root, g->world - 1);
        return 0;
}

static void req_set_opts(DvRequest *q, const deval_gather_opts *o) {
        q->pad_value = o->pad_value;
        q->pad_first = o->pad_first != 0;
        q->order = o->order;
        q->valid_rows = o->valid_rows < 0 ? -1 : o->valid_rows;
        q->keep_rows = o->keep_rows < 0 ? -1 : o->keep_rows;
        q->root = o->root;
}

/*
 * The input did not fit: over the quota, every rank must learn it, so arrive with the
 * failure and let the step fail everywhere. A dead devald needs no arrival.
 */
static int stage_failed(deval_group *g, const char *fn, DvRequest *q, int status, uint64_t bytes) {
        const DvResult *res;
        if (status != DEVAL_ENOMEM && status != DEVAL_ESYS)
                return status;
        q->status = status;
        q->staged_bytes = bytes;
        /* its own account travels with it, cut to fit */
        memcpy(q->why, g->errmsg, sizeof(q->why) - 1);
        q->why[sizeof(q->why) - 1] = '\0';
        q->ntensors = 0;
        int r = coll_run(g, fn, &res);
        return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: devald accepted a failed stage", fn);
}

/* A result into the caller's tensor, wherever it lives. */
static int write_back(deval_group *g, const char *fn, deval_tensor *t, const void *src,
                      uint64_t bytes) {
        if (t->device < 0) {
                memcpy(t->data, src, bytes);
                return 0;
        }
        int r = dv_gpu()->copy_to_device(t->device, (DvDevPtr)(uintptr_t)t->data, src, bytes);
        return r < 0 ? dv_set_err(g, r, "%s: %s", fn, dv_gpu_error()) : 0;
}

/* Where tensor data already lies in the buffer deval_input_buffer() gave: its offset. */
static bool in_buffer(const deval_group *g, const void *data, uint64_t bytes, uint64_t *ret) {
        const uint8_t *p = data;
        if (!g->in_keep || !p || p < g->in || p > g->in + g->in_keep ||
            bytes > (uint64_t)(g->in + g->in_keep - p) || (uint64_t)(p - g->in) % 8 != 0)
                return false;
        *ret = (uint64_t)(p - g->in);
        return true;
}

/*
 * Describe n tensors in q, copying each into the input arena (64-byte aligned, after the
 * deval_input_buffer() region) unless it already lies in that region.
 */
/* One tensor into the device input arena of a device group, from wherever it lives. */
static int put_on_device(deval_group *g, uint64_t off, const deval_tensor *t, uint64_t bytes) {
        const DvGpuApi *gpu = dv_gpu();
        DvDevPtr dst = g->din + off, src = (DvDevPtr)(uintptr_t)t->data;
        if (t->device == g->device)
                return gpu->copy_device(g->device, dst, src, bytes);
        if (t->device < 0)
                return gpu->copy_to_device(g->device, dst, t->data, bytes);
        void *bounce = malloc(bytes); /* another GPU of this process: through host memory */
        if (!bounce) /* said as GPU failures are, so that the caller names this one */
                return dv_gpu_fail(DEVAL_ENOMEM,
                                   "no host memory for a %llu-byte copy from GPU %d to GPU %d",
                                   (unsigned long long)bytes, t->device, g->device);
        int r = gpu->copy_to_host(t->device, bounce, src, bytes);
        if (r == 0)
                r = gpu->copy_to_device(g->device, dst, bounce, bytes);
        free(bounce);
        return r;
}

static int put_tensors_to(deval_group *g, const char *fn, int n, const deval_tensor *in,
                          const bool *with_data, DvRequest *q, bool dev) {
        uint64_t bytes[DEVAL_MAX_TENSORS], off[DEVAL_MAX_TENSORS], end = dev ? 0 : g->in_keep;
        bool placed[DEVAL_MAX_TENSORS];
        int r;

        for (int i = 0; i < n; i++) {
                bool wd = with_data ? with_data[i] : true;
                if ((r = check_tensor(g, fn, i, &in[i], wd, &bytes[i])) < 0)
                        return r;
                if (!wd)
                        bytes[i] = 0;
                placed[i] = !dev && bytes[i] && in[i].device < 0 &&
                            in_buffer(g, in[i].data, bytes[i], &off[i]);
                if (placed[i])
                        continue;
                off[i] = DV_ALIGN(end, DV_ARENA_ALIGN);
                if (bytes[i] > UINT64_MAX / 4 - off[i])
                        return dv_set_err(g, DEVAL_EINVAL, "%s: the inputs are too large", fn);
                end = off[i] + bytes[i];
        }
        /* the arguments are fine: now the group's state decides */
        if ((r = coll_begin(g)) < 0)
                return r;
        /* small host inputs go to this rank's inline bytes, where the last rank to arrive
         * reads them to run the step itself (fast.c), or devald does; a large gather's stay
         * where they are, for this rank to copy into the result (DV_REQ_DIRECT) */
        bool inl = !dev, direct;
        uint64_t iend = 0, ioff[DEVAL_MAX_TENSORS];
        for (int i = 0; inl && i < n; i++) {
                inl = !placed[i] && !(bytes[i] && in[i].device >= 0);
                ioff[i] = DV_ALIGN(iend, DV_ARENA_ALIGN);
                iend = ioff[i] + bytes[i];
        }
        direct = inl && g->rank_steps && g->world > 1 && !with_data &&
                 (q->op == DV_OP_GATHER || q->op == DV_OP_GATHER_METRICS) &&
                 (iend >= g->direct_min || !dv_fast_inline_ok(g, iend));
        inl = inl && !direct && dv_fast_inline_ok(g, iend);
        g->own_n = n;
        if (direct) {
                for (int i = 0; i < n; i++) {
                        desc_set(&q->t[i], &in[i], 0, bytes[i]);
                        g->own_src[i] = in[i].data;
                        g->own_bytes[i] = bytes[i];
                }
                q->ntensors = (uint32_t)n;
                q->flags |= DV_REQ_DIRECT;
                return 0;
        }
        if (inl) {
                memcpy(off, ioff, sizeof(off[0]) * (size_t)n);
                end = iend;
        } else if ((r = dev ? dv_reserve_dev_input(g, end) : dv_reserve_input(g, end)) < 0) {
                return stage_failed(g, fn, q, r, end);
        }
        uint8_t *base = inl ? g->inl : g->in;
        DV_FAULT("before_write", g->seq + 1);
        for (int i = 0; i < n; i++) {
                if (bytes[i] && dev) {
                        if ((r = put_on_device(g, off[i], &in[i], bytes[i])) < 0) {
                                dv_set_err(g, r, "%s: tensor %d: %s", fn, i, dv_gpu_error());
                                return stage_failed(g, fn, q, r == DEVAL_ENOMEM ? r : DEVAL_ESYS,
                                                    end);
                        }
                } else if (bytes[i] && !placed[i] && in[i].device >= 0) {
                        r = dv_gpu()->copy_to_host(in[i].device, g->in + off[i],
                                                   (DvDevPtr)(uintptr_t)in[i].data, bytes[i]);
                        if (r < 0) {
                                dv_set_err(g, r, "%s: tensor %d: %s", fn, i, dv_gpu_error());
                                return stage_failed(g, fn, q, r, end);
                        }
                } else if (bytes[i] && !placed[i]) {
                        memcpy(base + off[i], in[i].data, bytes[i]);
                }
                desc_set(&q->t[i], &in[i], off[i], bytes[i]);
                g->own_src[i] = dev ? NULL : base + off[i];
                g->own_bytes[i] = bytes[i];
                if (with_data && !with_data[i]) {
                        int64_t numel = 1;
                        for (int k = 0; k < in[i].ndim; k++)
                                numel *= in[i].shape[k];
                        q->t[i].nbytes = (uint64_t)numel * dv_dtype_size(in[i].dtype);
                        q->t[i].offset = 0;
                }
        }
        q->ntensors = (uint32_t)n;
        if (inl)
                q->flags |= DV_REQ_INLINE;
        return 0;
}

static int put_tensors(deval_group *g, const char *fn, int n, const deval_tensor *in,
                       const bool *with_data, DvRequest *q) {
        return put_tensors_to(g, fn, n, in, with_data, q, false);
}

/* A result in a device group's output arena: a view on this rank's GPU. */
static int view_of_dev(deval_group *g, const char *fn, const DvTensorDesc *d, deval_tensor *out) {
        int r;
        if ((r = dv_refresh_dev_output(g)) < 0)
                return r;
        r = view_in(g, fn, d, (const uint8_t *)(uintptr_t)g->dout, g->dout_size, out);
        if (r == 0)
                out->device = g->device;
        return r;
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
        else if ((r = take_opts(g, fn, opts, &own)) < 0)
                return r;
        else
                opts = &own;
        if ((r = check_opts(g, fn, opts)) < 0)
                return r;
        DvRequest *q;
        if ((r = req_start(g, op, &q)) < 0)
                return r;
        req_set_opts(q, opts);
        if ((r = req_site(g, fn, q)) < 0)
                return r;
        bool dev = g->device >= 0;
        if ((r = put_tensors_to(g, fn, n, in, NULL, q, dev)) < 0)
                return r;
        if ((r = coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != (uint32_t)n)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        for (int i = 0; i < n; i++)
                if ((r = dev ? view_of_dev(g, fn, &res->t[i], &out[i])
                             : view_of(g, fn, &res->t[i], &out[i])) < 0)
                        return r;
        return 0;
}

/**
 * deval_gather() - gather n tensors from every rank in one collective. Dim 0 (samples) is
 * concatenated in opts->order; every other dim that differs is padded with pad_value.
 * @out: n views into shared memory, read-only, valid until the next call on g. A rank other
 *       than opts->root (when root >= 0) gets shapes with 0 rows and NULL data.
 * Return: 0; DEVAL_EINVAL (bad argument, nothing sent); DEVAL_EMISMATCH (ranks disagree: the
 * message names the ranks and the field); DEVAL_ENOMEM (over quota); DEVAL_EPEER,
 * DEVAL_EDAEMON, DEVAL_ETIMEDOUT (the group failed for good).
 */
int deval_gather(deval_group *g, int n, const deval_tensor in[], const deval_gather_opts *opts,
                 deval_tensor out[]) {
        return gather_common(g, DV_OP_GATHER, "deval_gather", n, in, opts, out);
}

/**
 * deval_gather_for_metrics() - deval_gather() that, inside an eval pass, drops every sample
 * whose dataset position is past num_samples and orders by the pass's order. Outside a pass
 * it is deval_gather().
 */
int deval_gather_for_metrics(deval_group *g, int n, const deval_tensor in[],
                             const deval_gather_opts *opts, deval_tensor out[]) {
        const char *fn = "deval_gather_for_metrics";
        if (!g || !g->ident)
                return gather_common(g, DV_OP_GATHER_METRICS, fn, n, in, opts, out);
        /* a pass with keys: the batch's keys go first, and decide what the result keeps */
        deval_tensor call[DEVAL_MAX_TENSORS], res[DEVAL_MAX_TENSORS];
        deval_gather_opts own = DEVAL_GATHER_OPTS_INIT;
        int stream = (int)g->site[0], r;
        if (!out)
                return dv_set_err(g, DEVAL_EINVAL, "%s: out is NULL", fn);
        if (opts && (r = take_opts(g, fn, opts, &own)) < 0)
                return r;
        opts = &own;
        if ((r = dv_ident_call(g, fn, n, in, opts, call)) < 0)
                return r;
        /* (req_site() refuses a call past DV_PASS_SITES, so stream names one) */
        if ((r = gather_common(g, DV_OP_GATHER_METRICS, fn, n + 1, call, opts, res)) < 0)
                return dv_ident_explain(g, r);
        return dv_ident_result(g, fn, stream, n, res, own.same_rows, out);
}

static int batch_start(deval_group *g);

/**
 * deval_eval_batch() - a new batch of the eval pass starts on this rank. From here on, the
 * first deval_gather_for_metrics() of the batch, the second, ... each count their samples
 * apart (and the object calls theirs), so a loop that gathers predictions and labels in two
 * calls per batch gets every sample once from each. Without it every call of a pass counts
 * in one sequence: one call per batch. Local: nothing is sent.
 * Return: 0; DEVAL_EINVAL when g is NULL.
 */
int deval_eval_batch(deval_group *g) {
        if (!g)
                return DEVAL_EINVAL;
        dv_ident_batch_unkeyed(g);
        return batch_start(g);
}

/**
 * deval_eval_batch_keys() - deval_eval_batch() in a pass with keys (deval_eval_begin_keys()):
 * the batch holds n samples, whose keys are keys[0..n) (each in [0, num_keys); the sharding's
 * duplicates repeat a key). Every gather for metrics of the batch then holds a whole number of
 * rows (objects) per sample, the same number in every batch. Local: nothing is sent.
 * Return: 0; DEVAL_EINVAL (no pass with keys is open, a key out of range); DEVAL_ENOMEM.
 */
int deval_eval_batch_keys(deval_group *g, int64_t n, const int64_t keys[]) {
        if (!g)
                return DEVAL_EINVAL;
        int r = batch_start(g);
        if (r < 0)
                return r;
        return dv_ident_batch(g, "deval_eval_batch_keys", n, keys);
}

static int batch_start(deval_group *g) {
        if (dv_replay_pending(g)) {
                int r = dv_replay_batch(g);
                if (r < 0)
                        return r;
        } else {
                g->batch_no++;
        }
        g->batch = true;
        g->site[0] = g->site[1] = 0;
        return 0;
}

static int simple_op(deval_group *g, uint32_t op, const char *fn, int64_t num_samples, int order) {
        const DvResult *res;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if ((r = coll_begin(g)) < 0)
                return r;
        DvRequest *q;
        if ((r = req_start(g, op, &q)) < 0)
                return r;
        q->num_samples = num_samples;
        q->order = order;
        if (dv_fast_inline_ok(g, 0))
                q->flags |= DV_REQ_INLINE;
        return coll_run(g, fn, &res);
}

static int eval_end_step(deval_group *g, const char *fn, uint32_t flags);

/*
 * End this rank's pass. A pass with keys checks itself (ident.c), so devald is not asked to
 * count: it checks now, or after the replay of what this rank missed (@check).
 */
static int eval_end(deval_group *g, const char *fn, uint32_t flags, bool check) {
        if (!g)
                return DEVAL_EINVAL;
        if (!g->ident)
                return eval_end_step(g, fn, flags | (check ? DV_END_EXHAUSTED : 0));
        int r = eval_end_step(g, fn, flags);
        bool replay = r == 0 && deval_eval_missed(g) > 0;
        if (r < 0 || (!replay && !check)) {
                dv_ident_free(g);
                return r;
        }
        if (!replay)
                return dv_ident_check(g, fn);
        if (check)
                dv_ident_check_later(g);
        return 0;
}

static int eval_end_step(deval_group *g, const char *fn, uint32_t flags) {
        const DvResult *res;
        int r;

        g->batch = false;
        g->site[0] = g->site[1] = 0;
        if ((r = coll_begin(g)) < 0)
                return r;
        dv_replay_clear(g);
        DvRequest *q;
        if ((r = req_start(g, DV_OP_EVAL_END, &q)) < 0)
                return r;
        q->flags = flags;
        if (g->span)
                return dv_span_run(g, fn, true, &res);
        return coll_wait(g, fn, /* pass_end= */ true, &res);
}

/* What this rank kept of its last pass (batches, a replay not finished, keys) is over. */
static void pass_forget(deval_group *g) {
        g->batch = false;
        g->site[0] = g->site[1] = 0;
        g->batch_no = 0;
        dv_replay_clear(g);
        dv_ident_free(g);
}

/**
 * deval_eval_begin() - open an eval pass over a dataset of num_samples samples, in order.
 * Return: 0; DEVAL_EINVAL (negative num_samples, unknown order, a pass already open);
 * DEVAL_EMISMATCH when ranks pass different values; the group's failures.
 */
int deval_eval_begin(deval_group *g, int64_t num_samples, deval_order order) {
        if (!g)
                return DEVAL_EINVAL;
        if (num_samples < 0)
                return dv_set_err(g, DEVAL_EINVAL, "deval_eval_begin: num_samples is %" PRId64,
                                  num_samples);
        if (order != DEVAL_ORDER_RANK && order != DEVAL_ORDER_STRIDED)
                return dv_set_err(g, DEVAL_EINVAL, "deval_eval_begin: unknown order %d", order);
        pass_forget(g);
        return simple_op(g, DV_OP_EVAL_BEGIN, "deval_eval_begin", num_samples, order);
}

/**
 * deval_eval_begin_keys() - open an eval pass whose samples carry their identity: a key in
 * [0, num_keys) each (a dataset index; or a sample's place in the unsharded sampler's draws,
 * when a sampler may draw a sample twice on purpose), which each batch declares with
 * deval_eval_batch_keys(). A gather for metrics then returns its samples in key order, a key
 * it (or an earlier call of the same stream) already returned dropped: the duplicates a
 * sharding adds, wherever they fall. Nothing is counted by position, so a batch peeked before
 * the loop, a sampler of contiguous chunks or k rows per sample change nothing.
 * deval_eval_complete() (after the replay, deval_eval_replay_done()) checks that every stream
 * returned num_samples distinct keys and names those missing. A device group cannot (its
 * results stay on GPUs).
 * Return: as deval_eval_begin(); DEVAL_EINVAL when num_samples > num_keys; DEVAL_ENOTSUP.
 */
int deval_eval_begin_keys(deval_group *g, int64_t num_samples, int64_t num_keys) {
        const char *fn = "deval_eval_begin_keys";
        if (!g)
                return DEVAL_EINVAL;
        pass_forget(g);
        int r = dv_ident_begin(g, fn, num_samples, num_keys);
        if (r < 0)
                return r;
        /* the count devald checks the ranks agree on carries num_keys: every rank must read
         * a dataset of one length, or their keys mean different samples */
        r = simple_op(g, DV_OP_EVAL_BEGIN, fn, DV_IDENT_UNCOUNTED + num_keys, DEVAL_ORDER_RANK);
        if (r < 0)
                dv_ident_free(g);
        if (r == DEVAL_EMISMATCH && strstr(g->errmsg, "num_samples"))
                return dv_set_err(g, r,
                                  "%s: ranks disagree on num_keys (this rank has %" PRId64
                                  "): every rank's loader must read the same dataset, whole, "
                                  "for a dataset index to name one sample",
                                  fn, num_keys);
        return r;
}

/**
 * deval_eval_end() - this rank is done with the eval pass. Ranks may end it at different
 * collectives: a rank whose loader ran out first waits here while devald answers the other
 * ranks' gathers, gather_for_metrics, pad_across_processes and barriers for it with empty
 * contributions; the pass closes, and every rank returns, when the last rank ends it.
 * Return: 0; DEVAL_EINVAL if no pass is open; DEVAL_EMISMATCH when another rank called
 * something devald cannot answer for a finished rank (reduce, broadcast), or the status of any
 * collective that failed after this rank ended the pass; the group's failures.
 */
int deval_eval_end(deval_group *g) {
        return eval_end(g, "deval_eval_end", 0, false);
}

/**
 * deval_eval_complete() - deval_eval_end() for a rank whose loader ran out: when every rank
 * ends the pass this way, the pass also checks that each gather_for_metrics call of the batch
 * (and each object call) returned all num_samples samples. Use deval_eval_end() for a pass
 * stopped early on purpose.
 * Return: as deval_eval_end(), and DEVAL_EMISMATCH naming the call and the count when a call
 * returned fewer samples than num_samples.
 */
int deval_eval_complete(deval_group *g) {
        return eval_end(g, "deval_eval_complete", 0, true);
}

/**
 * deval_eval_abandon() - deval_eval_end() for a rank that leaves its loop before its loader
 * ran out (a break, an exception): its remaining samples will never be gathered, so a rank
 * that still calls a collective of the pass fails, on every rank, with DEVAL_EMISMATCH
 * naming this rank and its batch, rather than return results that silently lack them. When
 * every rank abandons (or ends) the pass at the same point, it closes without a check.
 * Return: as deval_eval_end().
 */
int deval_eval_abandon(deval_group *g) {
        return eval_end(g, "deval_eval_abandon", DV_END_LEFT, false);
}

/**
 * deval_eval_open() - is an eval pass open on g, as its last collective left it? A
 * collective of the pass that fails because a rank left the pass while the others went on
 * closes it on every rank: this rank must not end it again (its deval_eval_abandon() would
 * be a collective the others never call).
 * Return: 1 or 0; DEVAL_EINVAL when g is NULL.
 */
int deval_eval_open(const deval_group *g) {
        if (!g)
                return DEVAL_EINVAL;
        if (g->span)
                return dv_span_pass_open(g);
        /* acquire pairs with devald's store after its step, published with done_seq */
        return atomic_load_explicit(&g->pass_sh->open, memory_order_acquire) != 0;
}

/** deval_barrier() - return once every rank has called it. */
int deval_barrier(deval_group *g) {
        return simple_op(g, DV_OP_BARRIER, "deval_barrier", 0, 0);
}

/**
 * deval_pad_across_processes() - pad in along dim to the largest size any rank has there,
 * like Accelerate's pad_across_processes. dim may be negative; a dim outside the tensor's
 * rank returns *in unchanged without a collective.
 * @out: this rank's padded tensor, a view valid until the next call on g.
 */
int deval_pad_across_processes(deval_group *g, const deval_tensor *in, int dim, double pad_value,
                               bool pad_first, deval_tensor *out) {
        const char *fn = "deval_pad_across_processes";
        const DvResult *res;
        int r;

        if (!g)
                return DEVAL_EINVAL;
        if (!in || !out)
                return dv_set_err(g, DEVAL_EINVAL, "%s: in or out is NULL", fn);
        uint64_t bytes;
        if ((r = check_tensor(g, fn, 0, in, true, &bytes)) < 0)
                return r;
        if (dim >= in->ndim || dim < -in->ndim) { /* no collective, whatever the group's state */
                *out = *in;
                return 0;
        }
        if (dim < 0)
                dim += in->ndim;
        DvRequest *q;
        if ((r = req_start(g, DV_OP_PAD, &q)) < 0)
                return r;
        q->dim = dim;
        q->pad_value = pad_value;
        q->pad_first = pad_first;
        bool dev = g->device >= 0;
        if ((r = put_tensors_to(g, fn, 1, in, NULL, q, dev)) < 0)
                return r;
        if ((r = coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        return dev ? view_of_dev(g, fn, &res->t[0], out) : view_of(g, fn, &res->t[0], out);
}

static int objects_common(deval_group *g, uint32_t op, const char *fn, size_t n,
                          const deval_bytes items[], const deval_gather_opts *opts, size_t *out_n,
                          const deval_bytes **out_items) {
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
        else if ((r = take_opts(g, fn, opts, &own)) < 0)
                return r;
        else
                opts = &own;
        if ((r = check_opts(g, fn, opts)) < 0)
                return r;
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
                if (!items[i].data && items[i].len)
                        return dv_set_err(g, DEVAL_EINVAL, "%s: item %zu's data is NULL", fn, i);
                if (items[i].len > (uint64_t)INT64_MAX / 4 - total)
                        return dv_set_err(g, DEVAL_EINVAL, "%s: the items are too large", fn);
                total += items[i].len;
        }
        if ((r = coll_begin(g)) < 0)
                return r;
        uint64_t blob_off = DV_ALIGN(n * 8, DV_ARENA_ALIGN);
        DvRequest *q;
        if ((r = req_start(g, op, &q)) < 0)
                return r;
        req_set_opts(q, opts);
        if ((r = req_site(g, fn, q)) < 0)
                return r;
        if ((r = dv_reserve_input(g, blob_off + total)) < 0)
                return stage_failed(g, fn, q, r, blob_off + total);
        uint64_t pos = 0;
        for (size_t i = 0; i < n; i++) {
                int64_t len = (int64_t)items[i].len;
                memcpy(g->in + i * 8, &len, 8);
                if (items[i].len)
                        memcpy(g->in + blob_off + pos, items[i].data, items[i].len);
                pos += items[i].len;
        }
        deval_tensor lens = {.dtype = DEVAL_I64, .ndim = 1, .shape = {(int64_t)n}, .device = -1};
        deval_tensor blob = {.dtype = DEVAL_U8, .ndim = 1, .shape = {(int64_t)total}, .device = -1};
        desc_set(&q->t[0], &lens, 0, n * 8);
        desc_set(&q->t[1], &blob, blob_off, total);
        q->ntensors = 2;
        if ((r = coll_run(g, fn, &res)) < 0)
                return r;
        deval_tensor ol, ob;
        if (res->ntensors != 2 || (r = view_of(g, fn, &res->t[0], &ol)) < 0 ||
            (r = view_of(g, fn, &res->t[1], &ob)) < 0 || ol.dtype != DEVAL_I64 ||
            ob.dtype != DEVAL_U8)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
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
        return objects_common(g, DV_OP_OBJECTS, "deval_gather_objects", n, items, opts, out_n,
                              out_items);
}

/**
 * deval_gather_objects_for_metrics() - deval_gather_objects() that, inside an eval pass,
 * drops items past the dataset's end. Objects count in their own stream of the pass, so a
 * loop that gathers tensors and objects once per batch drops the same samples from both.
 */
int deval_gather_objects_for_metrics(deval_group *g, size_t n, const deval_bytes items[],
                                     const deval_gather_opts *opts, size_t *out_n,
                                     const deval_bytes **out_items) {
        const char *fn = "deval_gather_objects_for_metrics";
        if (!g || !g->ident)
                return objects_common(g, DV_OP_OBJECTS_METRICS, fn, n, items, opts, out_n,
                                      out_items);
        /* a pass with keys: each item travels behind its sample's key */
        const deval_bytes *call, *res;
        size_t res_n;
        deval_gather_opts own = DEVAL_GATHER_OPTS_INIT;
        int stream = DV_PASS_SITES + (int)g->site[1], r;
        if ((n > 0 && !items) || !out_n || !out_items)
                return dv_set_err(g, DEVAL_EINVAL, "%s: items, out_n or out_items is NULL", fn);
        if (opts && (r = take_opts(g, fn, opts, &own)) < 0)
                return r;
        opts = &own;
        if ((r = dv_ident_items_call(g, fn, n, items, opts, &call)) < 0 ||
            (r = objects_common(g, DV_OP_OBJECTS_METRICS, fn, n, call, opts, &res_n, &res)) < 0)
                return r;
        return dv_ident_items_result(g, fn, stream, res_n, res, own.same_rows & 1, out_n,
                                     out_items);
}

/**
 * deval_reduce() - element-wise op over every rank's inout, in rank order (bitwise
 * reproducible); the result replaces inout's data. f16/bf16 are computed in double and
 * rounded once. MEAN needs a floating dtype.
 */
int deval_reduce(deval_group *g, deval_tensor *inout, deval_reduce_op op) {
        const char *fn = "deval_reduce";
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
        if ((r = req_start(g, DV_OP_REDUCE, &q)) < 0)
                return r;
        q->reduce_op = op;
        if ((r = put_tensors(g, fn, 1, inout, NULL, q)) < 0)
                return r;
        if ((r = coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1 || (r = view_of(g, fn, &res->t[0], &out)) < 0)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        if (res->t[0].nbytes && (r = write_back(g, fn, inout, out.data, res->t[0].nbytes)) < 0)
                return r;
        return 0;
}

/**
 * deval_broadcast() - every rank's inout gets root's data. All ranks pass the same dtype
 * and shape (DEVAL_EMISMATCH otherwise); non-root data is overwritten.
 */
int deval_broadcast(deval_group *g, deval_tensor *inout, int root) {
        const char *fn = "deval_broadcast";
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
        if ((r = req_start(g, DV_OP_BROADCAST, &q)) < 0)
                return r;
        q->root = root;
        bool with_data = g->rank == root;
        uint64_t bytes;
        if ((r = check_tensor(g, fn, 0, inout, true, &bytes)) < 0)
                return r;
        if ((r = put_tensors(g, fn, 1, inout, &with_data, q)) < 0)
                return r;
        if ((r = coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1 || (r = view_of(g, fn, &res->t[0], &out)) < 0 ||
            res->t[0].nbytes != bytes)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        if (g->rank != root && bytes && (r = write_back(g, fn, inout, out.data, bytes)) < 0)
                return r;
        return 0;
}

/**
 * deval_broadcast_bytes() - every rank gets root's len bytes; data and len are ignored on
 * the other ranks. @out: a view valid until the next call on g.
 */
int deval_broadcast_bytes(deval_group *g, const void *data, size_t len, int root,
                          deval_bytes *out) {
        const char *fn = "deval_broadcast_bytes";
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
        if ((r = coll_begin(g)) < 0)
                return r;
        DvRequest *q;
        if ((r = req_start(g, DV_OP_BROADCAST_BYTES, &q)) < 0)
                return r;
        q->root = root;
        if (g->rank == root) {
                deval_tensor t = {.data = (void *)data,
                                  .dtype = DEVAL_U8,
                                  .ndim = 1,
                                  .shape = {(int64_t)len},
                                  .device = -1};
                if ((r = put_tensors(g, fn, 1, &t, NULL, q)) < 0)
                        return r;
        }
        if ((r = coll_run(g, fn, &res)) < 0)
                return r;
        if (res->ntensors != 1 || (r = view_of(g, fn, &res->t[0], &view)) < 0)
                return r < 0 ? r : dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
        out->data = view.data ? view.data : (const void *)g->out;
        out->len = (size_t)res->t[0].nbytes;
        return 0;
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
        if ((r = coll_begin(g)) < 0)
                return r;
        g->in_keep = 0; /* a new buffer replaces the old one; its contents need not move */
        if ((r = dv_reserve_input(g, bytes)) < 0)
                return r;
        g->in_keep = bytes;
        *ret = g->in;
        return 0;
}
