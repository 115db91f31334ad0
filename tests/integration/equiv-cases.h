/* SPDX-License-Identifier: MIT */
/*
 * equiv-cases.h - what every executor of a step must answer alike (equiv-cases.c): each case
 * is a run of calls on a fresh group whose every status, message and result a rank writes
 * down, one line a call, for test-equiv to compare across executors.
 */
#pragma once

#include <stdbool.h>
#include <stdio.h>

#include "deval.h"

#define EQ_WORLD 4 /* every case's ranks: 2 "nodes" of 2 when the group spans */

typedef struct {
        FILE *f;
        int rank, world;
        const char *group; /* its name, which messages may hold */
        int calls;
        bool over; /* a failure ended the group: the case stops */
} EqLog;

typedef struct {
        const char *name;
        void (*run)(deval_group *g, EqLog *l);
        int timeout_ms; /* the join's; 0: 20 s */
} EqCase;

extern const EqCase eq_cases[];
extern const int eq_ncases;
