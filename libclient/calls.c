/* SPDX-License-Identifier: MIT */
/*
 * calls.c - what a binding tells libdeval of its own steps (calls.h).
 */
#include "calls.h"

/**
 * dv_calls() - the calls g has made so far, as the caller numbers them: the number of its
 * last step. A binding reads it around steps of its own, to dv_uncount() them.
 * @g: a handle, or NULL (0)
 */
uint32_t dv_calls(const deval_group *g) {
        return g ? dv_call_no(g, g->seq) : 0;
}

/**
 * dv_uncount() - the last steps of g were the binding's own, not its user's calls: the calls
 * that follow are numbered as if they had not been made. A step the binding makes of its own
 * is numbered, while it runs, as the user's next call.
 * @g: a handle, or NULL (nothing)
 * @steps: how many
 */
void dv_uncount(deval_group *g, uint32_t steps) {
        if (g)
                g->uncounted += steps;
}

/**
 * dv_site_counted() - whether g's next call for metrics (of objects where @objects, else of
 * tensors) counts its samples, or needs its real rows said: 0 only for a call of a batch
 * (deval_eval_batch()) of a pass by position past the DV_PASS_SITES it counts, or at a site
 * that some batch before did not call, which dv_req_site() takes only with valid_rows.
 * @g: a handle, or NULL (1)
 */
int dv_site_counted(const deval_group *g, int objects) {
        return !g || g->ident || !g->batch ||
               (dv_sites_peek(&g->sites, objects) < DV_PASS_SITES &&
                dv_sites_whole_next(&g->sites, objects));
}

/**
 * dv_site_next() - name the site of g's next call for metrics of the current batch (of
 * objects where @objects, else of tensors): a binding that tells its user's calls apart by
 * where the user's code makes them, so that a call made in some batches only keeps the
 * others at their sites (sites.h). Without it, the batch's calls take sites 0, 1, ... in turn.
 * @g: a handle, or NULL (nothing)
 * @site: >= 0
 * Return: 0; DEVAL_EINVAL when g is NULL or site is out of range.
 */
int dv_site_next(deval_group *g, int objects, int64_t site) {
        if (!g || site < 0 || site >= UINT32_MAX)
                return DEVAL_EINVAL;
        dv_sites_name(&g->sites, objects, (uint32_t)site);
        return 0;
}
