/* SPDX-License-Identifier: MIT */
/*
 * eval.c - the eval pass's entry points (deval.h): begin, batch, end, complete, abandon,
 * open. A pass's meaning is common/pass.c's, run wherever its steps run (run.h); what a rank
 * keeps of it here is its batch count, its call sites, its replay (replay.c) and its keys
 * (ident.c).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "deval.h"

#include "collective.h"
#include "handle.h"
#include "ident.h"
#include "progress.h"
#include "replay.h"
#include "resume.h"
#include "run.h"
#include "stage.h"

/* This rank's slot, where it publishes its progress through a pass; NULL: it has none here
 * (a group spanning machines keeps its pass in its ranks, span_step.c). */
static DvSlot *progress_slot(deval_group *g) {
        return g->span || !g->hdr ? NULL : &g->hdr->slots[g->rank];
}

static int batch_start(deval_group *g, const char *fn, int64_t n) {
        int r = 0;
        if (dv_replay_pending(g)) {
                if ((r = dv_replay_batch(g)) < 0)
                        return r;
        } else {
                g->batch_no++;
                if (progress_slot(g))
                        dv_progress_batch(progress_slot(g), g->batch_no, n);
                r = dv_resume_batch(g, fn);
        }
        g->batch = true;
        dv_sites_batch(&g->sites);
        return r;
}

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
        return batch_start(g, "deval_eval_batch", 0);
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
        int64_t real = 0; /* for the progress figures: the batch's samples, not its padding */
        for (int64_t j = 0; keys && j < n; j++)
                real += keys[j] != DEVAL_KEY_PAD;
        int r = batch_start(g, "deval_eval_batch_keys", real);
        if (r < 0)
                return r;
        return dv_ident_batch(g, "deval_eval_batch_keys", n, keys);
}

/* End this rank's pass; *unchecked (when not NULL): a rank left its loop early, so the pass
 * closed without a check (DV_RES_UNCHECKED). */
static int eval_end_step(deval_group *g, const char *fn, uint32_t flags, const char *why,
                         bool *unchecked) {
        const DvResult *res;
        int r;

        int left = dv_resume_pass_end(g, fn, !(flags & DV_END_LEFT));
        if (progress_slot(g))
                dv_progress_end(progress_slot(g));
        uint32_t partial = g->batch ? dv_sites_partial(&g->sites, DV_PASS_SITES) : 0;
        g->batch = false;
        if ((r = dv_coll_begin(g)) < 0)
                return r;
        dv_replay_clear(g);
        DvRequest *q;
        if ((r = dv_req_start(g, DV_OP_EVAL_END, &q)) < 0)
                return r;
        q->flags = flags;
        q->partial = partial;
        if (why) /* the others' failure quotes it (common/pass.c) */
                snprintf(q->why, sizeof(q->why), "%s", why);
        r = g->span ? g->span_ops->run(g, fn, true, &res)
                    : dv_coll_wait(g, fn, /* pass_end= */ true, &res);
        if (r == 0 && !deval_eval_open(g))
                dv_resume_pass_closed(g); /* done with: nothing to resume */
        if (r == 0 && unchecked)
                *unchecked = (res->flags & DV_RES_UNCHECKED) != 0;
        return r < 0 ? r : left;
}

/*
 * End this rank's pass. A pass with keys checks itself (ident.c), so devald is not asked to
 * count: it checks now, or after the replay of what this rank missed (@check).
 */
static int eval_end(deval_group *g, const char *fn, uint32_t flags, bool check, const char *why) {
        if (!g)
                return DEVAL_EINVAL;
        if (!g->ident)
                return eval_end_step(g, fn, flags | (check ? DV_END_EXHAUSTED : 0), why, NULL);
        bool unchecked = false;
        int r = eval_end_step(g, fn, flags, why, &unchecked);
        check &= !unchecked; /* as devald checks no pass a rank left early (pass.h) */
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

/* What this rank kept of its last pass (batches, a replay not finished, keys) is over. */
static void pass_forget(deval_group *g) {
        g->batch = false;
        dv_sites_free(&g->sites);
        g->batch_no = 0;
        dv_replay_clear(g);
        dv_ident_free(g);
        dv_resume_pass_begin(g);
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
        g->pass_order = order;
        if (progress_slot(g))
                dv_progress_begin(progress_slot(g), num_samples, false);
        return dv_simple_op(g, DV_OP_EVAL_BEGIN, "deval_eval_begin", num_samples, order);
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
        if (progress_slot(g))
                dv_progress_begin(progress_slot(g), num_samples, true);
        /* the count devald checks the ranks agree on carries num_keys: every rank must read
         * a dataset of one length, or their keys mean different samples */
        r = dv_simple_op(g, DV_OP_EVAL_BEGIN, fn, DV_IDENT_UNCOUNTED + num_keys, DEVAL_ORDER_RANK);
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
        return eval_end(g, "deval_eval_end", 0, false, NULL);
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
        return eval_end(g, "deval_eval_complete", 0, true, NULL);
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
        return eval_end(g, "deval_eval_abandon", DV_END_LEFT, false, NULL);
}

/**
 * deval_eval_abandon_why() - deval_eval_abandon() for a rank that leaves its loop because of
 * an error of its own (a check that refused its batch, an exception of its body): the other
 * ranks' failure quotes why (its first 255 bytes, printable ASCII), so that every rank
 * learns at once which rank refused, and what.
 * Return: as deval_eval_abandon().
 */
int deval_eval_abandon_why(deval_group *g, const char *why) {
        return eval_end(g, "deval_eval_abandon", DV_END_LEFT, false, why);
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
                return g->span_ops->pass_open(g);
        /* acquire pairs with devald's store after its step, published with done_seq */
        return atomic_load_explicit(&g->pass_sh->open, memory_order_acquire) != 0;
}

/**
 * deval_eval_progress() - how far the open eval pass has come, every rank's samples together,
 * as the ranks publish them in the group's shared memory: no collective, on any rank, at any
 * time (a progress bar). Figures only: exact after each gather for metrics of a pass by
 * position, and from each batch's start in a pass with keys.
 * Return: 1 with *samples and *num_samples set (either may be NULL); 0: no pass is open;
 * DEVAL_EINVAL (g is NULL); DEVAL_ENOTSUP in a group spanning machines (its pass lives in its
 * ranks, not in shared memory).
 */
int deval_eval_progress(const deval_group *g, int64_t *samples, int64_t *num_samples) {
        if (!g)
                return DEVAL_EINVAL;
        if (g->span || !g->hdr)
                return DEVAL_ENOTSUP;
        DvPassInfo p;
        if (!dv_progress_read(g->hdr, g->pass_sh, g->world, &p, NULL))
                return 0;
        if (samples)
                *samples = p.samples;
        if (num_samples)
                *num_samples = p.total;
        return 1;
}
