/* SPDX-License-Identifier: MIT */
/*
 * collective.h - what the entry points of collective.c share with eval.c and span_exchange.c.
 */
#pragma once

#include <stdint.h>

#include "deval.h"

#include "wire.h"

/* A step with no tensors (a barrier, an eval_begin): staged and run. */
int dv_simple_op(deval_group *g, uint32_t op, const char *fn, int64_t num_samples, int order);

/* Where dv_gather_object_placed() wants its item, at the least: past the length it writes. */
#define DV_OBJECT_PLACED_AT DV_ARENA_ALIGN

int dv_gather_object_placed(deval_group *g, deval_bytes item, const deval_gather_opts *opts,
                            size_t *out_n, const deval_bytes **out_items);
