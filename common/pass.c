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

#include <stdio.h>

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
 * dv_pass_park() - park the ranks of step q[world] that end an open pass while another still
 * calls. @parked: [world], the ranks parked before this step; the newly parked are added,
 * never a rank that left early. @pk: filled in any case.
 * Return: true when the step goes on; false when it must fail (pk->left >= 0: a rank left its
 * loop early; else tmpl's op cannot be answered for the parked ranks).
 */
bool dv_pass_park(const DvRequest *q, int world, bool *parked, DvPark *pk) {
        *pk = (DvPark){.tmpl = -1, .first = -1, .left = -1, .can_answer = true};
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
        for (int k = 0; k < world && pk->first < 0; k++)
                if (parked[k])
                        pk->first = k;
        if (pk->left >= 0)
                return false;
        if (pk->first < 0)
                return true;
        pk->can_answer = empty_answers(q[pk->tmpl].op);
        return pk->can_answer;
}

/**
 * dv_pass_park_msg() - the words for dv_pass_park()'s false. @tmpl_name names pk->tmpl;
 * @other_name the rank that ended the pass (pk->left, else pk->first).
 */
void dv_pass_park_msg(char *buf, size_t len, const DvPark *pk, const DvRequest *q, uint32_t seq,
                      const char *tmpl_name, const char *other_name) {
        if (pk->left >= 0)
                snprintf(buf, len,
                         "collective #%u: %s left the eval pass during its batch %u (a break or "
                         "an exception in its loop) while %s went on to call %s; the samples "
                         "it did not gather would be missing from every result. Run the loop to "
                         "the end on every rank, or leave it at the same batch on all of them",
                         seq, other_name, q[pk->left].batch, tmpl_name, dv_op_name(q[pk->tmpl].op));
        else
                snprintf(buf, len,
                         "collective #%u: %s called %s, but %s has already ended its eval pass "
                         "(its loader ran out); only gathers for metrics, pad_across_processes "
                         "and barriers can be answered for it (its part of a plain gather, a "
                         "reduce or a broadcast is not empty: sync a metric's state after the "
                         "loop)",
                         seq, tmpl_name, dv_op_name(q[pk->tmpl].op), other_name);
}
