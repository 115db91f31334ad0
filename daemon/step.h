/* SPDX-License-Identifier: MIT */
/*
 * step.h - running one step of a group (step.c).
 */
#pragma once

#include <stdint.h>

#include "daemon.h"

/* Run step seq of g on its worker thread and write every rank's result; the caller
 * publishes done_seq. Return: the step's status (0 or a negative DEVAL_E*). */
int step_run(Group *g, uint32_t seq);
