/* SPDX-License-Identifier: MIT */
/*
 * calls.h - the caller's numbering of its calls, which every failure names ("collective #3"):
 * libdeval's steps, less the steps posted again (restaged, the same call under a new step
 * number) and those a binding made of its own (an eval pass's begin and end, which the user of
 * the binding never called); whether a call for metrics is one its pass counts, and which
 * site of its batch a binding names it. dv_calls(), dv_uncount(), dv_site_counted() and
 * dv_site_next() are exported outside the API (libdeval.sym's DEVAL_PRIVATE) for the Python
 * binding.
 */
#pragma once

#include <stdint.h>

#include "handle.h"

/* The caller's number of g's step seq. */
static inline uint32_t dv_call_no(const deval_group *g, uint32_t seq) {
        return seq - g->restages - g->uncounted;
}

uint32_t dv_calls(const deval_group *g);
void dv_uncount(deval_group *g, uint32_t steps);
int dv_site_counted(const deval_group *g, int objects);
int dv_site_next(deval_group *g, int objects, int64_t site);
