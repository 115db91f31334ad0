/* SPDX-License-Identifier: MIT */
/*
 * replay.c - what a rank missed while its loader was exhausted, kept and handed back.
 *
 * In an eval pass, a rank whose loader runs out before the others' ends its pass and is
 * parked in eval_end: devald answers the others' gathers for it with empty contributions.
 * The results of those steps are what the others' loops saw in their last batches; this rank's
 * loop never ran them. They are kept here, in order, with the batch each belonged to. After
 * the pass, deval_eval_missed() says how many batches that was; the caller runs its loop body
 * that many more times on empty inputs, each after deval_eval_batch(), and every collective of
 * those bodies is answered from here, checked against what the others called. So every rank
 * ends the pass having seen every result, whatever its loader held.
 */
#define _GNU_SOURCE
#include "replay.h"

#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "handle.h"
#include "ident.h"
#include "util.h"

struct DvKept {
        DvResult *res; /* the descriptors, offsets into data */
        uint8_t *data;
        uint64_t size;
};

/** dv_replay_clear() - drop everything kept; the handle may keep a new pass's. */
void dv_replay_clear(deval_group *g) {
        for (size_t i = 0; i < g->replay.n; i++) {
                free(g->replay.kept[i].res);
                free(g->replay.kept[i].data);
        }
        free(g->replay.kept);
        g->replay.kept = NULL;
        g->replay.n = g->replay.cap = g->replay.next = g->replay.at = 0;
        g->replay.on = false;
}

/**
 * dv_replay_keep() - keep a copy of res, a result devald wrote for this parked rank into the
 * output arena (mapped and current). Return: 0; DEVAL_EPROTO when a descriptor leaves the
 * arena; DEVAL_ENOMEM. The message is in g.
 */
int dv_replay_keep(deval_group *g, const char *fn, const DvResult *res) {
        struct DvKept k = {0};
        uint32_t n = res->ntensors;
        uint64_t size = 0;

        for (uint32_t i = 0; i < n; i++) {
                const DvTensorDesc *t = &res->t[i];
                if (t->offset > g->out_size || t->nbytes > g->out_size - t->offset)
                        return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result",
                                          fn);
                size = DV_ALIGN(size, DV_ARENA_ALIGN) + t->nbytes;
        }
        if (g->replay.n == g->replay.cap) {
                size_t cap = g->replay.cap ? 2 * g->replay.cap : 16;
                struct DvKept *p = realloc(g->replay.kept, cap * sizeof(*p));
                if (!p)
                        return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory", fn);
                g->replay.kept = p;
                g->replay.cap = cap;
        }
        k.res = malloc(offsetof(DvResult, t) + (size_t)n * sizeof(DvTensorDesc));
        k.data = malloc(DV_MAX(size, (uint64_t)1));
        if (!k.res || !k.data) {
                free(k.res);
                free(k.data);
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory keeping %llu bytes", fn,
                                  (unsigned long long)size);
        }
        memcpy(k.res, res, offsetof(DvResult, t) + (size_t)n * sizeof(DvTensorDesc));
        uint64_t at = 0;
        for (uint32_t i = 0; i < n; i++) {
                at = DV_ALIGN(at, DV_ARENA_ALIGN);
                memcpy(k.data + at, g->out + res->t[i].offset, res->t[i].nbytes);
                k.res->t[i].offset = at;
                at += res->t[i].nbytes;
        }
        k.size = size;
        g->replay.kept[g->replay.n++] = k;
        return 0;
}

/* Does this rank hold results it has not replayed yet? */
bool dv_replay_pending(const deval_group *g) {
        return g->replay.next < g->replay.n;
}

/* Does kept result i start a batch of the others' loop (their deval_eval_batch())? */
static bool starts_batch(const deval_group *g, size_t i) {
        return i == 0 || g->replay.kept[i].res->batch != g->replay.kept[i - 1].res->batch;
}

/**
 * dv_kept_match() - is q the call res answered where it was kept: the same op, call of the
 * batch, number of tensors and dtypes? @what says where ("while replaying ..."), and @who who
 * made the kept call ("they"), for the message. Return: 0; DEVAL_EMISMATCH naming what
 * differs; q's own staging failure.
 */
int dv_kept_match(deval_group *g, const char *fn, const char *what, const char *who,
                  const DvRequest *q, const DvResult *res) {
        if (q->status < 0)
                return dv_set_err(g, q->status, "%s: %.*s", fn, (int)sizeof(q->why), q->why);
        if (res->op != q->op || res->site != q->site || res->ntensors != q->ntensors)
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "%s: %s, this call is %s (call %u of the batch, %u tensors) "
                                  "where %s called %s (call %u, %u tensors); the loop body "
                                  "must make the same calls on every rank",
                                  fn, what, dv_op_name(q->op), q->site + 1, q->ntensors, who,
                                  dv_op_name(res->op), res->site + 1, res->ntensors);
        for (uint32_t t = 0; t < res->ntensors; t++)
                if (res->t[t].dtype != q->t[t].dtype)
                        return dv_set_err(g, DEVAL_EMISMATCH,
                                          "%s: %s, tensor %u has dtype %d where %s had %d", fn,
                                          what, t, q->t[t].dtype, who, res->t[t].dtype);
        return 0;
}

/**
 * dv_replay_take() - answer the collective in q with the next kept result, when it is what
 * the others called there. The views point into the kept copy until the next call on g.
 * Return: 0; DEVAL_EMISMATCH naming what differs (the body replayed is not the one the others
 * ran); q's own staging failure.
 */
int dv_replay_take(deval_group *g, const char *fn, const DvRequest *q, const DvResult **ret) {
        size_t i = g->replay.next;
        const DvResult *res = g->replay.kept[i].res;
        int r;

        if (q->status < 0)
                return dv_set_err(g, q->status, "%s: %.*s", fn, (int)sizeof(q->why), q->why);
        if (starts_batch(g, i) && i != g->replay.at)
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "%s: while replaying the others' batches, this batch calls more "
                                  "than they did; the batch they ran made %s its next call after "
                                  "deval_eval_batch()",
                                  fn, dv_op_name(res->op));
        if ((r = dv_kept_match(g, fn, "while replaying the others' batches", "they", q, res)) < 0)
                return r;
        g->replay.next++;
        g->view = g->replay.kept[i].data;
        g->view_size = g->replay.kept[i].size;
        *ret = res;
        return 0;
}

/**
 * deval_eval_missed() - after an eval pass: how many batches of the other ranks' loops ran
 * while this rank's loader was already exhausted (0 when it ran to the end with them). Run
 * the loop body that many more times, on empty inputs (0 rows, the same dtypes), each time
 * after deval_eval_batch(): every collective in them returns what the others got there,
 * without a collective. Then deval_eval_replay_done().
 * Return: the count (>= 0), or DEVAL_EINVAL when g is NULL.
 */
int64_t deval_eval_missed(const deval_group *g) {
        if (!g)
                return DEVAL_EINVAL;
        int64_t n = 0;
        for (size_t i = g->replay.next; i < g->replay.n; i++)
                n += starts_batch(g, i);
        return n;
}

/**
 * dv_replay_batch() - deval_eval_batch() while results are kept: the previous replayed batch
 * must have taken all of its batch's results. Return: 0 or DEVAL_EMISMATCH.
 */
int dv_replay_batch(deval_group *g) {
        size_t i = g->replay.next;
        if (g->replay.on && i < g->replay.n && !starts_batch(g, i))
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "deval_eval_batch: the replayed batch made fewer calls than the "
                                  "others' batch, whose next call was %s",
                                  dv_op_name(g->replay.kept[i].res->op));
        g->replay.on = true;
        g->replay.at = i;
        return 0;
}

/**
 * deval_eval_replay_done() - end the replay of deval_eval_missed()'s batches and free what
 * was kept. Return: 0; DEVAL_EMISMATCH when the replayed bodies took fewer results than the
 * others' batches had (the rest is dropped all the same); DEVAL_EINVAL when g is NULL.
 */
int deval_eval_replay_done(deval_group *g) {
        if (!g)
                return DEVAL_EINVAL;
        size_t left = g->replay.n - g->replay.next;
        uint32_t op = left ? g->replay.kept[g->replay.next].res->op : 0;
        dv_replay_clear(g);
        if (!left && dv_ident_check_due(g))
                return dv_ident_check(g, "deval_eval_replay_done");
        dv_ident_free(g);
        if (left)
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "deval_eval_replay_done: %zu of the others' collectives were not "
                                  "replayed, the next a %s; the loop body must make the same "
                                  "calls on every rank",
                                  left, dv_op_name(op));
        return 0;
}
