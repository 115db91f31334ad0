/* SPDX-License-Identifier: MIT */
/*
 * span.h - a group that spans machines (span.c): a collective across every node (an
 * exchange, then the step), the room of a rank's input, the handle's end. Its state is
 * span_state.h's.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "deval.h"

#include "handle.h"
#include "wire.h"

int dv_span_run(deval_group *g, const char *fn, bool pass_end, const DvResult **ret);
int dv_span_reserve(deval_group *g, uint64_t size);
void dv_span_free(deval_group *g);
