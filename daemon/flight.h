/* SPDX-License-Identifier: MIT */
/*
 * flight.h - each group's flight recorder: the last FLIGHT_STEPS collectives, each with
 * every rank's operation, a fingerprint of its arguments and when it arrived, the bytes
 * moved and the outcome. When a group times out or is aborted devald writes it out as JSON
 * (to its log and to a 0600 file beside its socket), and `deval-ctl dump GROUP` asks for it
 * at any time: the first step where the ranks' calls diverged is usually the bug.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define FLIGHT_STEPS 64

typedef struct {
        uint32_t seq;
        int32_t status; /* the step's outcome; DEVAL_ETIMEDOUT for one that never ran */
        uint64_t first_ns;
        uint64_t bytes;
        char msg[200];
} FlightStep;

typedef struct {
        uint32_t op; /* 0: did not arrive */
        uint32_t fingerprint;
        uint32_t arrival_us; /* after the step's first arrival */
        uint32_t reserved;
} FlightRank;

typedef struct {
        int world;
        uint64_t written; /* steps recorded so far; the ring holds the last FLIGHT_STEPS */
        FlightStep steps[FLIGHT_STEPS];
        FlightRank *ranks; /* [FLIGHT_STEPS][world] */
} Flight;

int flight_init(Flight *f, int world);
void flight_deinit(Flight *f);
/* What a request asks for, without its data or dims: equal on ranks whose calls agree. */
uint32_t flight_fingerprint(const DvRequest *q);
/*
 * Record step seq: reqs[k] (NULL where rank k did not arrive) and when each arrived
 * (arrived_ns[k], 0: not). The caller serialises records and reads.
 */
void flight_record(Flight *f, uint32_t seq, const DvRequest *reqs, const uint64_t *arrived_ns,
                   int status, const char *msg, uint64_t bytes);
/* The recorder as JSON (malloc'd, NUL-terminated; *ret_len without the NUL), or NULL. */
char *flight_json(const Flight *f, const char *group, size_t *ret_len);
