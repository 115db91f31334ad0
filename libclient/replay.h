/* SPDX-License-Identifier: MIT */
/*
 * replay.h - the results devald answered for this rank while it was parked in eval_end, kept
 * and given back as the rank runs its loop body for the batches it missed (replay.c).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "deval.h"

#include "wire.h"

void dv_replay_clear(deval_group *g);
int dv_replay_keep(deval_group *g, const char *fn, const DvResult *res);
bool dv_replay_pending(const deval_group *g);
int dv_kept_match(deval_group *g, const char *fn, const char *what, const char *who,
                  const DvRequest *q, const DvResult *res);
int dv_replay_take(deval_group *g, const char *fn, const DvRequest *q, const DvResult **ret);
int dv_replay_batch(deval_group *g);
