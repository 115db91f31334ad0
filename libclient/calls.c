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
