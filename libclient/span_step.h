/* SPDX-License-Identifier: MIT */
/*
 * span_step.h - the step of a spanning group, run by every rank alike over every rank's part.
 */
#pragma once

#include <stdbool.h>

#include "deval.h"

int dv_span_step(deval_group *g, bool *closed);
int dv_span_pass_open(const deval_group *g);
