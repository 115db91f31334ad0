/* SPDX-License-Identifier: MIT */
/*
 * collective.h - what the entry points of collective.c share with eval.c.
 */
#pragma once

#include <stdint.h>

#include "deval.h"

/* A step with no tensors (a barrier, an eval_begin): staged and run. */
int dv_simple_op(deval_group *g, uint32_t op, const char *fn, int64_t num_samples, int order);
