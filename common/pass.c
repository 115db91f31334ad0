/* SPDX-License-Identifier: MIT */
/*
 * pass.c - ranks that end an eval pass while others still call.
 *
 * A rank whose loader ran out ends the pass first and is parked: until the pass closes, its
 * part of the others' collectives is an empty contribution shaped like theirs, which is the
 * truth for a gather for metrics (it has no samples left), a pad and a barrier, and a lie for
 * anything else (a plain gather of a metric's state, a reduce, a broadcast). A rank that leaves its loop early (a break, an exception) while
 * the others go on has rows left that nobody will gather: the pass fails on every rank, so
 * that no one gets a result that silently lacks them.
 */
#include "pass.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/*
 * Only a collective that counts samples is answered truly by a rank with none left: a plain
 * gather or object gather (a metric's state, synced by the others) would return the others'
 * part as if it were everyone's.
 */
static bool empty_answers(uint32_t op) {
        switch (op) {
        case DV_OP_GATHER_METRICS:
        case DV_OP_OBJECTS_METRICS:
        case DV_OP_PAD:
        case DV_OP_BARRIER:
                return true;
        default:
                return false;
        }
}

/**
 * dv_pass_park() - park the ranks of step q[world] that end the open pass ps while another
 * still calls. Ranks parked before stay parked; the newly parked are added, never a rank that
 * left early. @pk: filled in any case.
 * Return: true when the step goes on; false when it must fail (pk->left >= 0: a rank left its
 * loop early; else tmpl's op cannot be answered for the parked ranks).
 */
bool dv_pass_park(DvPass *ps, const DvRequest *q, bool on_gpus, DvPark *pk) {
        int world = ps->world;
        bool *parked = ps->parked;
        *pk = (DvPark){
                .tmpl = -1, .first = -1, .left = -1, .can_answer = !on_gpus, .on_gpus = on_gpus};
        for (int k = 0; k < world && pk->tmpl < 0; k++)
                if (!parked[k] && q[k].op != DV_OP_EVAL_END)
                        pk->tmpl = k;
        if (pk->tmpl < 0)
                return true; /* every rank has ended the pass: this step closes it */
        for (int k = 0; k < world; k++) {
                if (parked[k] || q[k].op != DV_OP_EVAL_END)
                        continue;
                if (q[k].flags & DV_END_LEFT) {
                        if (pk->left < 0)
                                pk->left = k;
                        continue;
                }
                parked[k] = true;
        }
        ps->nparked = 0;
        for (int k = 0; k < world; k++) {
                ps->nparked += parked[k];
                if (parked[k] && pk->first < 0)
                        pk->first = k;
        }
        if (pk->left >= 0)
                return false;
        if (pk->first < 0)
                return true;
        pk->can_answer = !on_gpus && empty_answers(q[pk->tmpl].op);
        return pk->can_answer;
}

/**
 * dv_pass_park_msg() - the words for dv_pass_park()'s false. @tmpl_name names pk->tmpl;
 * @other_name the rank that ended the pass (pk->left, else pk->first).
 */
void dv_pass_park_msg(char *buf, size_t len, const DvPark *pk, const DvRequest *q, uint32_t seq,
                      const char *tmpl_name, const char *other_name) {
        char why[sizeof(q->why)];
        if (pk->left >= 0 && dv_printable(why, sizeof(why), q[pk->left].why, sizeof(q->why)))
                snprintf(buf, len,
                         "collective #%u: %s left the eval pass during its batch %u, raising "
                         "\"%s\"; %s fails with it (it went on to call %s)",
                         seq, other_name, q[pk->left].batch, why, tmpl_name,
                         dv_op_name(q[pk->tmpl].op));
        else if (pk->left >= 0)
                snprintf(buf, len,
                         "collective #%u: %s left the eval pass during its batch %u (a break or "
                         "an exception in its loop) while %s went on to call %s; the samples "
                         "it did not gather would be missing from every result. Run the loop to "
                         "the end on every rank, or leave it at the same batch on all of them",
                         seq, other_name, q[pk->left].batch, tmpl_name, dv_op_name(q[pk->tmpl].op));
        else if (pk->on_gpus)
                snprintf(buf, len,
                         "collective #%u: %s called %s, but %s has already ended its eval pass "
                         "(its loader ran out): a device group keeps its results on GPUs, where "
                         "a rank that ended its pass could not keep them to replay, so every "
                         "rank must run the same number of batches (a DistributedSampler "
                         "without drop_last pads them even), or join a host group",
                         seq, tmpl_name, dv_op_name(q[pk->tmpl].op), other_name);
        else
                snprintf(buf, len,
                         "collective #%u: %s called %s, but %s has already ended its eval pass "
                         "(its loader ran out); only gathers for metrics, pad_across_processes "
                         "and barriers can be answered for it (its part of a plain gather, a "
                         "reduce or a broadcast is not empty: sync a metric's state after the "
                         "loop)",
                         seq, tmpl_name, dv_op_name(q[pk->tmpl].op), other_name);
}

/** dv_pass_advance() - see pass.h. */
void dv_pass_advance(int stream, int world, const int64_t *contributed, DvPassCounts *c,
                     int64_t *rows) {
        int64_t call = 0;
        c->used |= 1u << stream;
        for (int k = 0; k < world; k++) {
                rows[stream * world + k] += contributed[k];
                call += contributed[k];
        }
        c->total[stream] += call;
        if (call > c->most[stream])
                c->most[stream] = call;
}

/* dv_pass_plan() - see pass.h. */
void dv_pass_plan(const DvPassCounts *c, const int64_t *rows, int world, int stream,
                  DvPlanInput *in) {
        in->in_pass = true;
        in->order = c->order;
        in->num_samples = c->num_samples;
        in->pass_total = c->total[stream];
        in->pass_rows = &rows[stream * world];
}

/* dv_pass_plan_based() - see pass.h. */
void dv_pass_plan_based(int order, int64_t num_samples, const DvRequest *q, int world,
                        int64_t *rows, DvPlanInput *in) {
        in->in_pass = true;
        in->order = order;
        in->num_samples = num_samples;
        in->pass_total = q[0].base_total;
        for (int k = 0; k < world; k++)
                rows[k] = q[k].base_rows;
        in->pass_rows = rows;
}

/* dv_pass_counts_valid() - see pass.h. */
bool dv_pass_counts_valid(const DvPassCounts *c, const int64_t *rows, int world) {
        for (int st = 0; st < DV_PASS_STREAMS; st++)
                if (!dv_pass_counts_ok(&rows[st * world], world, c->total[st]) ||
                    (c->total[st] && !(c->used & (1u << st))) || c->most[st] < 0 ||
                    c->most[st] > c->total[st])
                        return false;
        return true;
}

/*
 * The close of a pass: every stream dropped fewer rows past the end than one round of
 * batches (its largest step) holds, as a sampler pads, and when every rank's loader ran out
 * (exhausted), every stream returned all num_samples samples, but a stream some rank's batch
 * did not call (partial: a gather of examples on the first batch), which holds only the
 * samples of the batches that called it. Counting by position, a row is a sample only while every call of the
 * stream is one batch's: a second call per batch, or a loader that yields its samples twice,
 * gathers past the end far more than a sampler pads, and is caught here.
 * Return: 0, or DEVAL_EMISMATCH with why in buf.
 */
static int pass_close(const DvPass *ps, bool exhausted, uint32_t partial, char *buf, size_t len) {
        const DvPassCounts *c = &ps->c;
        for (int st = 0; st < DV_PASS_STREAMS; st++) {
                if (!(c->used & (1u << st)) || (partial & (1u << st)))
                        continue;
                int64_t kept = dv_pass_kept(c->num_samples, c->order, c->total[st],
                                            &ps->rows[st * ps->world], ps->world);
                const char *kind = st < DV_PASS_SITES ? "tensors" : "objects";
                if (exhausted && kept < c->num_samples) {
                        snprintf(buf, len,
                                 "the eval pass returned %" PRId64 " of its %" PRId64
                                 " samples from call %d of each batch (%s), though every rank's "
                                 "loader ran out: num_samples is larger than what the loaders "
                                 "hold (a sampler that drops the last batch?), or some batches "
                                 "skipped that call",
                                 kept, c->num_samples, st % DV_PASS_SITES + 1, kind);
                        return DEVAL_EMISMATCH;
                }
                /* a sampler pads less than a round: the round's first row is a sample */
                if (c->total[st] > kept && c->total[st] - kept >= c->most[st]) {
                        snprintf(buf, len,
                                 "call %d of each batch (%s) gathered %" PRId64
                                 " rows for a pass of %" PRId64 " samples: the %" PRId64
                                 " rows past the end are a round of batches (%" PRId64 " rows) or "
                                 "more, more than any sampler pads, so the rows kept may not be "
                                 "the samples: each row of a pass without dataset indices "
                                 "counts as a sample ([batch*k, ...] outputs are k rows each). "
                                 "Make one call per batch (eval_pass; eval_loop counts "
                                 "each call apart), give num_samples as all the loaders hold, "
                                 "and shard an IterableDataset by DataLoader worker too",
                                 st % DV_PASS_SITES + 1, kind, c->total[st], c->num_samples,
                                 c->total[st] - kept, c->most[st]);
                        return DEVAL_EMISMATCH;
                }
        }
        return 0;
}

/* dv_pass_init() - see pass.h. */
int dv_pass_init(DvPass *ps, int world) {
        *ps = (DvPass){.world = world};
        ps->rows = calloc((size_t)DV_PASS_STREAMS * (size_t)world, sizeof(int64_t));
        ps->parked = calloc((size_t)world, sizeof(bool));
        ps->base = calloc((size_t)world, sizeof(int64_t));
        if (!ps->rows || !ps->parked || !ps->base) {
                dv_pass_deinit(ps);
                return DEVAL_ENOMEM;
        }
        return 0;
}

void dv_pass_deinit(DvPass *ps) {
        free(ps->rows);
        free(ps->parked);
        free(ps->base);
        ps->rows = NULL;
        ps->parked = NULL;
        ps->base = NULL;
}

/* dv_pass_reset() - see pass.h. */
void dv_pass_reset(DvPass *ps) {
        ps->open = false;
        memset(&ps->c, 0, sizeof(ps->c));
        memset(ps->rows, 0, (size_t)DV_PASS_STREAMS * (size_t)ps->world * sizeof(int64_t));
        memset(ps->parked, 0, (size_t)ps->world * sizeof(bool));
        ps->nparked = 0;
        ps->status = 0;
        ps->msg[0] = '\0';
}

/* dv_pass_begin() - see pass.h. */
int dv_pass_begin(DvPass *ps, const DvRequest *q, const char *group, char *buf, size_t len) {
        if (ps->open) {
                snprintf(buf, len,
                         "an eval pass is already open on group '%s'; end it with "
                         "deval_eval_end first",
                         group);
                return DEVAL_EINVAL;
        }
        dv_pass_reset(ps);
        ps->open = true;
        ps->c.order = q[0].order;
        ps->c.num_samples = q[0].num_samples;
        return 0;
}

/*
 * A rank that left its loop raising an error of its own (deval_eval_abandon_why()) at the
 * point where the others ended the pass: they made every call it made, so none of theirs
 * failed, yet their results may hold what it refused (a batch it could not tell apart), and
 * the error is everyone's. Return: 0, or DEVAL_EMISMATCH quoting the first such rank.
 */
static int left_raising(const DvRequest *q, int world, char *buf, size_t len) {
        char why[sizeof(q->why)];
        for (int k = 0; k < world; k++)
                if ((q[k].flags & DV_END_LEFT) &&
                    dv_printable(why, sizeof(why), q[k].why, sizeof(q->why))) {
                        snprintf(buf, len,
                                 "rank %d left the eval pass during its batch %u, raising \"%s\", "
                                 "where the others ended it: their results may hold what it "
                                 "refused",
                                 k, q[k].batch, why);
                        return DEVAL_EMISMATCH;
                }
        return 0;
}

/* dv_pass_end() - see pass.h. */
int dv_pass_end(DvPass *ps, const DvRequest *q, const char *group, char *buf, size_t len) {
        if (!ps->open) {
                snprintf(buf, len, "no eval pass is open on group '%s'", group);
                return DEVAL_EINVAL;
        }
        bool exhausted = true; /* parked ranks, too, arrive with their eval_end */
        uint32_t partial = 0;
        for (int k = 0; k < ps->world; k++) {
                exhausted &= (q[k].flags & DV_END_EXHAUSTED) != 0;
                partial |= q[k].partial;
        }
        int r = ps->status;
        if (r)
                snprintf(buf, len, "%s", ps->msg);
        else if ((r = left_raising(q, ps->world, buf, len)) == 0)
                r = pass_close(ps, exhausted, partial, buf, len);
        dv_pass_reset(ps);
        return r;
}

/* dv_pass_end_flags() - see pass.h. */
uint32_t dv_pass_end_flags(const DvRequest *q, int world) {
        for (int k = 0; k < world; k++)
                if (q[k].flags & DV_END_LEFT)
                        return DV_RES_UNCHECKED;
        return 0;
}

/* dv_pass_failed() - see pass.h. */
void dv_pass_failed(DvPass *ps, int status, uint32_t call, uint32_t op, const char *msg) {
        if (ps->status || !ps->open || !ps->nparked)
                return;
        ps->status = status;
        snprintf(ps->msg, sizeof(ps->msg),
                 "collective #%u (%s) failed after this rank ended the pass: %.*s", call,
                 dv_op_name(op), DV_MSG_MAX - 96, msg);
}

int dv_pass_sites(const DvRequest *q, int world, int *bad) {
        for (int k = 0; k < world; k++) {
                *bad = k;
                uint32_t how = DV_SITE_UNCOUNTED | DV_SITE_BASED;
                if (q[k].site != q[0].site || (q[k].flags & how) != (q[0].flags & how))
                        return DEVAL_EMISMATCH;
        }
        return 0;
}

void dv_pass_sites_msg(char *buf, size_t len, const DvRequest *q, int bad, uint32_t seq,
                       const char *name0, const char *namek) {
        snprintf(buf, len,
                 "collective #%u (%s): ranks are at different calls of their batch: %s makes "
                 "call %" PRIu64 ", %s call %" PRIu64 "; every rank must make the same "
                 "gather_for_metrics calls in each batch",
                 seq, dv_op_name(q[0].op), name0, (uint64_t)q[0].site + 1, namek,
                 (uint64_t)q[bad].site + 1);
}
