/* SPDX-License-Identifier: MIT */
/*
 * mirror.c - small reduces, gathers and barriers every rank runs by itself (DvMirror in
 * wire.h).
 *
 * When the last rank to arrive runs a step (fast.c), the step costs two crossings between
 * cores one after the other: the others' inputs to it, then its result back to them. Here
 * every rank describes its step, with its input, in a record of its own; once every rank's
 * record is there, each one runs the step itself: a reduce in rank order, a gather through
 * the planner devald uses. The records cross once, all at the same time, and nobody waits
 * for a publication. The decision is made by every rank from the same records, so all agree
 * on it: whatever the records do not all describe alike goes on as any step does, where the
 * runner or devald checks it and names what is wrong.
 */
#define _GNU_SOURCE
#include "mirror.h"

#include <stddef.h>
#include <string.h>

#include "agree.h"
#include "dtype.h"
#include "fast.h"
#include "fault.h"
#include "handle.h"
#include "util.h"

/* A tensor described in a record: its dims, and data of nbytes (DV_MIRROR_BYTES at most)
 * that they account for. */
static bool tensor_ok(int32_t dtype, int32_t ndim, const int64_t *shape, uint64_t nbytes) {
        if (!dv_dtype_valid(dtype) || ndim < 0 || ndim > DEVAL_MAX_DIMS || nbytes > DV_MIRROR_BYTES)
                return false;
        uint64_t numel = 1;
        for (int d = 0; d < ndim; d++) {
                if (shape[d] < 0 || (uint64_t)shape[d] > DV_MIRROR_BYTES)
                        return false;
                numel *= (uint64_t)shape[d]; /* 128^8 at most: no overflow */
        }
        return numel * dv_dtype_size(dtype) == nbytes;
}

static inline bool same_bits(double x, double y) {
        uint64_t a, b;
        memcpy(&a, &x, sizeof(a));
        memcpy(&b, &y, sizeof(b));
        return a == b;
}

/* Do records a and b describe the same step, in every field dv_agree() reads of them? */
static inline bool same_description(const DvMirror *a, const DvMirror *b) {
        if (a->op != b->op || a->dtype != b->dtype || a->ndim != b->ndim ||
            a->nbytes != b->nbytes || a->reduce_op != b->reduce_op ||
            a->valid_rows != b->valid_rows || a->keep_rows != b->keep_rows ||
            a->order != b->order || a->pad_first != b->pad_first ||
            !same_bits(a->pad_value, b->pad_value) || a->ndim < 0 || a->ndim > DEVAL_MAX_DIMS)
                return false;
        for (int d = 0; d < a->ndim; d++)
                if (a->shape[d] != b->shape[d])
                        return false;
        return true;
}

/* Can this rank mirror the step of request q? A copy of its own request. */
static bool mirror_op(const deval_group *g, const DvRequest *q) {
        if (!g->mirror.on || !g->rank_steps || g->device >= 0 || !g->inl_size ||
            !(q->flags & DV_REQ_INLINE))
                return false;
        if (q->op == DV_OP_BARRIER)
                return true;
        if (q->names) /* (a record has no room for them: a named tensor is no plain step) */
                return false;
        const DvTensorDesc *t = &q->t[0];
        if (q->ntensors != 1 || t->offset > g->inl_size || t->nbytes > g->inl_size - t->offset ||
            !tensor_ok(t->dtype, t->ndim, t->shape, t->nbytes))
                return false;
        int op = q->reduce_op;
        switch (q->op) {
        case DV_OP_REDUCE:
                return op >= DEVAL_SUM && op <= DEVAL_PROD &&
                       (op != DEVAL_MEAN || dv_dtype_is_float(t->dtype));
        case DV_OP_GATHER_METRICS: /* an eval pass counts samples in shared counters */
                if (atomic_load_explicit(&g->pass_sh->open, memory_order_relaxed))
                        return false;
                /* fall through */
        case DV_OP_GATHER:
                return q->root == -1 &&
                       (q->order == DEVAL_ORDER_RANK || q->order == DEVAL_ORDER_STRIDED);
        default:
                return false;
        }
}

/*
 * dv_mirror_post() - describe the step in this rank's slot (step seq) in its record of the
 * step, mirrored or not, for the others to decide with. Return: whether this rank may mirror
 * it, and so waits for the others' records before it counts itself in (dv_fast_arrive()).
 */
bool dv_mirror_post(deval_group *g, uint32_t seq, uint64_t now) {
        DvSlot *slot = &g->hdr->slots[g->rank];
        DvMirror *m = &slot->mirror[seq % 2], *own = &g->mirror.own;
        DvFast *f = &g->hdr->fast;
        size_t head = offsetof(DvMirror, data);
        /* the request as this rank wrote it, read once: the slot is shared memory */
        DvRequest *q = &g->mirror.req;
        memcpy(q, &slot->req, offsetof(DvRequest, why));
        memcpy(q->t, slot->req.t, sizeof(q->t[0]));

        bool on = mirror_op(g, q);
        /* with devald gone, nobody would notice a rank dying: the step goes on as any other,
         * whose runner asks too. Asked at most once a millisecond: a system call. */
        if (on && now - g->alive_ns > 1000000) {
                on = dv_daemon_alive(g);
                if (on)
                        g->alive_ns = now;
        }
        /* this rank's own description is the copy here: its slot is for the others */
        memset(own, 0, head);
        own->op = on ? q->op : 0;
        own->arrived_ns = now;
        if (on && q->op != DV_OP_BARRIER) {
                const DvTensorDesc *t = &q->t[0];
                own->dtype = t->dtype;
                own->reduce_op = q->reduce_op;
                own->ndim = t->ndim;
                own->nbytes = (uint32_t)t->nbytes;
                memcpy(own->shape, t->shape, (size_t)t->ndim * sizeof(own->shape[0]));
                own->valid_rows = q->valid_rows;
                own->keep_rows = q->keep_rows;
                own->pad_value = q->pad_value;
                own->order = q->order;
                own->pad_first = q->pad_first;
                memcpy(m->data, g->inl + t->offset, t->nbytes);
        }
        /* a step dv_agree() accepted lately: records that all describe it again need not be
         * asked about (same_step()) */
        g->mirror.known = false;
        for (int i = 0; on && i < g->mirror.nknown && !g->mirror.known; i++)
                g->mirror.known = same_description(own, &g->mirror.known_steps[i]);
        /* up to seq, which goes last */
        memcpy((uint8_t *)m + sizeof(m->seq), (const uint8_t *)own + sizeof(own->seq),
               head - sizeof(m->seq));
        if (DV_FAULT_SAYS("mirror_post", seq, "garbage"))
                memset(&m->op, 0xa5, sizeof(*m) - offsetof(DvMirror, op));
        DV_FAULT("mirror_post", seq);
        g->mirror.next = 0;
        /* seq_cst with the sleepers' count: a rank going to sleep sees the record, or is
         * seen here and woken */
        atomic_store_explicit(&m->seq, seq, memory_order_seq_cst);
        if (atomic_load_explicit(&f->sleepers, memory_order_seq_cst)) {
                atomic_fetch_add_explicit(&f->wake, 1, memory_order_seq_cst);
                dv_futex_wake(&f->wake);
        }
        return on;
}

/* For dv_agree(): rank k's tensor, as its record describes it. */
static int mirror_desc(const DvAgree *a, int k, int i, bool with_data) {
        (void)with_data; /* a record holds its data */
        const DvTensorDesc *t = &a->q[k].t[i];
        return tensor_ok(t->dtype, t->ndim, t->shape, t->nbytes) ? 0 : DEVAL_EPROTO;
}

/* The request record m describes, as dv_agree() reads one of these ops with no pass open:
 * its op's options and its one tensor. Field by field, not cleared first: clearing the two
 * structures cost more than the whole check. */
static void record_request(const DvMirror *m, uint32_t call, DvRequest *q) {
        q->status = 0;
        q->op = m->op;
        q->call = call;
        q->ntensors = m->op == DV_OP_BARRIER ? 0 : 1;
        q->reduce_op = m->reduce_op;
        q->valid_rows = m->valid_rows;
        q->keep_rows = m->keep_rows;
        q->pad_value = m->pad_value;
        q->order = m->order;
        q->pad_first = m->pad_first;
        q->names = 0;
        q->root = -1;
        DvTensorDesc *t = &q->t[0];
        t->dtype = m->dtype;
        t->ndim = m->ndim;
        memcpy(t->shape, m->shape, sizeof(t->shape));
        t->offset = 0;
        t->nbytes = m->nbytes;
}

/* dv_agree()'s answer for records that describe no step it accepted lately; a step it
 * accepts is kept among those */
static __attribute__((noinline)) bool agree_records(deval_group *g, const DvMirror *recs) {
        DvRequest *q = g->fast.reqs; /* the runner's, free while this step is mirrored */
        for (int k = 0; k < g->world; k++)
                record_request(&recs[k], g->mirror.req.call, &q[k]);
        DvAgree a = {.q = q, .world = g->world, .desc = mirror_desc};
        if (dv_agree(&a) < 0)
                return false;
        DvMirrorState *ms = &g->mirror;
        ms->known_steps[ms->next_known] = recs[0];
        ms->next_known = (ms->next_known + 1) % DV_MIRROR_KNOWN;
        ms->nknown = DV_MIN(ms->nknown + 1, DV_MIRROR_KNOWN);
        return true;
}

/*
 * Do the records (copies, this rank's own among them) describe one step to mirror, as
 * devald would check it? The try mode of dv_agree(): what does not agree goes on as any
 * step, whose runner or devald names it. Records that all describe one step dv_agree()
 * accepted lately (this rank's own, g->mirror.known) are accepted without asking it again:
 * copies of one record of an accepted step pass every check it makes, so every rank comes
 * to the same answer, whether it asked or remembered.
 */
static bool same_step(deval_group *g, const DvMirror *recs) {
        int k = 0;
        while (g->mirror.known && k < g->world && same_description(&recs[k], &g->mirror.own))
                k++;
        if (g->mirror.known && k == g->world)
                return true;
        return agree_records(g, recs);
}

/* Gather the tensors the records describe (copies in recs) into g->mirror.out. Return: 0, or
 * the planner's status: the records alone decide it, but for memory this rank lacks. */
static int mirror_gather(deval_group *g, const DvMirror *recs, const DvSlot *slots, int p) {
        int W = g->world;
        const DvMirror *own = &recs[0]; /* the options, which every record agrees on */
        DvShape *shapes = g->mirror.shapes;
        int64_t *valid = g->mirror.valid;
        const uint8_t **srcs = g->mirror.srcs;
        for (int k = 0; k < W; k++) {
                shapes[k].dtype = recs[k].dtype;
                shapes[k].ndim = recs[k].ndim;
                memcpy(shapes[k].shape, recs[k].shape, sizeof(shapes[k].shape));
                valid[k] = recs[k].valid_rows;
                srcs[k] = slots[k].mirror[p].data;
        }
        DvPlanInput in = {.world = W,
                          .ntensors = 1,
                          .in = shapes,
                          .valid_rows = valid,
                          .keep_rows = own->keep_rows,
                          .order = own->order,
                          .pad_first = own->pad_first != 0,
                          .pad_value = own->pad_value,
                          .max_out = sizeof(g->mirror.out)};
        return dv_fast_gather_to(g, &in, srcs, g->mirror.out, &g->mirror.res);
}

/* Rank 0 tells devald of a mirrored step: its figures (who came last, by how much after the
 * first), its bytes, and that it is done. */
static void mirror_stat(deval_group *g, uint32_t seq, int last, uint64_t first, uint64_t lastt) {
        DvFast *f = &g->hdr->fast;
        dv_fast_stat(g, seq, last, first, lastt);
        g->mirror.bytes += g->mirror.res.ntensors ? g->mirror.res.t[0].nbytes : 0;
        atomic_store_explicit(&f->mirror_bytes, g->mirror.bytes, memory_order_relaxed);
        /* release: the figures are written before devald's worker counts the step */
        atomic_store_explicit(&f->mirror_seq, seq, memory_order_release);
}

/*
 * dv_mirror_run() - step seq, which this rank posted as one to mirror: once every rank's
 * record of it is there, run it here if they all describe the same one. Return: 1, run (the
 * result in g->mirror.res and g->mirror.out); 0, some rank's record is not there yet; -1,
 * not a step to mirror: this rank counts itself in as for any step.
 */
int dv_mirror_run(deval_group *g, uint32_t seq) {
        DvSlot *slots = g->hdr->slots;
        int p = seq % 2;

        for (; g->mirror.next < g->world; g->mirror.next++)
                /* acquire pairs with the release in the poster's store of seq */
                if (atomic_load_explicit(&slots[g->mirror.next].mirror[p].seq,
                                         memory_order_acquire) != seq)
                        return 0;
        DV_FAULT("mirror_run", seq);
        /* each record is copied once, then checked: a rank may rewrite its record at any
         * time */
        DvMirror *recs = g->mirror.recs;
        uint64_t first = UINT64_MAX, lastt = 0;
        int last = 0;
        size_t head = offsetof(DvMirror, data);
        for (int k = 0; k < g->world; k++) {
                memcpy(&recs[k], &slots[k].mirror[p], head);
                first = DV_MIN(first, recs[k].arrived_ns);
                if (recs[k].arrived_ns > lastt) {
                        lastt = recs[k].arrived_ns;
                        last = k;
                }
        }
        if (!same_step(g, recs))
                return -1;
        const DvMirror *own = &recs[0]; /* the step, which every record agrees on */
        DvResult *res = &g->mirror.res;
        memset(res, 0, offsetof(DvResult, t));
        res->op = own->op;
        res->site = g->mirror.req.site;
        res->batch = g->batch_no;
        /* The planner fails alike on every rank, for these records: then none mirrors it.
         * Only memory this rank could not get would set it apart; it then waits for the
         * others, which went on, until the group's deadline. */
        if ((own->op == DV_OP_GATHER || own->op == DV_OP_GATHER_METRICS) &&
            mirror_gather(g, recs, slots, p) < 0)
                return -1;
        if (own->op == DV_OP_REDUCE) {
                const uint8_t **srcs = g->mirror.srcs;
                for (int k = 0; k < g->world; k++)
                        srcs[k] = slots[k].mirror[p].data;
                /* in rank order, as devald and a runner reduce */
                dv_reduce_ranks(own->dtype, own->reduce_op, g->world, srcs,
                                own->nbytes / dv_dtype_size(own->dtype), g->mirror.out);
                res->ntensors = 1;
                DvTensorDesc *t = &res->t[0];
                memset(t, 0, sizeof(*t));
                t->dtype = own->dtype;
                t->ndim = own->ndim;
                memcpy(t->shape, own->shape, (size_t)own->ndim * sizeof(t->shape[0]));
                t->nbytes = own->nbytes;
        }
        if (g->rank == 0)
                mirror_stat(g, seq, last, first, lastt);
        return 1;
}
