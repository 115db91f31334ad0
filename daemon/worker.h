/* SPDX-License-Identifier: MIT */
/*
 * worker.h - a group's worker thread (worker.c).
 */
#pragma once

#include <stdint.h>

#include "daemon.h"

/* The worker's thread: waits for each step's arrivals, runs it (step.c), publishes it. */
void *worker_main(void *arg);
/* Count the steps the ranks ran that the worker has not seen yet, for deval-ctl; waits for
 * the worker up to deadline_ns. */
void worker_catch_up(Group *g, uint64_t deadline_ns);
#define CATCH_UP_NS (50ull * 1000 * 1000) /* how long deval-ctl's answer may wait for it */
