/* SPDX-License-Identifier: MIT */
/*
 * span_exchange.h - a spanning group's exchange: every rank's part reaches every rank, through
 * its node's devald, its node's leader and the engine between the leaders.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "deval.h"

int dv_span_exchange(deval_group *g, const char *fn, bool hello);
void dv_span_say_timeout(char *msg, size_t len, int node_ms);
