/* SPDX-License-Identifier: MIT */
/*
 * mirror.h - small reduces, gathers and barriers every rank runs by itself (mirror.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "deval.h"

#include "plan.h"
#include "wire.h"

/* Describe step seq in this rank's record. Return: whether this rank may mirror it. */
bool dv_mirror_post(deval_group *g, uint32_t seq, uint64_t now);
/* Run step seq here once every record is there: 1 run, 0 not yet, -1 not a step to mirror. */
int dv_mirror_run(deval_group *g, uint32_t seq);
