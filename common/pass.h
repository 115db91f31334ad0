/* SPDX-License-Identifier: MIT */
/*
 * pass.h - what an eval pass makes of ranks that end it while others still call: which are
 * parked (their loader ran out), which left their loop early, and the words that say why a
 * step cannot go on. One definition for every executor that runs a pass's steps (devald's
 * worker, the spanning step); each names the ranks in its own words.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "wire.h"

typedef struct {
        int tmpl;  /* the first rank still calling; -1: every rank has ended the pass */
        int first; /* the first parked rank (after this step); -1: none */
        int left;  /* a rank that left its loop early (DV_END_LEFT) while tmpl calls; -1: none */
        bool can_answer; /* tmpl's op is one an empty contribution answers */
} DvPark;

/*
 * The step's requests q[world] in an open pass: ranks that send eval_end while another rank
 * still calls are marked in parked[world] (ranks parked before stay parked). Return: true
 * when the step goes on (nothing to park, or every parked rank can be answered for); false
 * when it fails, and pk says why (dv_pass_park_msg()).
 */
bool dv_pass_park(const DvRequest *q, int world, bool *parked, DvPark *pk);

/*
 * Why the step fails, for dv_pass_park()'s false: seq is the collective's number; name(k)
 * gives the executor's words for rank k ("rank 3 (pid 88)", "rank 3 (node 1)").
 */
void dv_pass_park_msg(char *buf, size_t len, const DvPark *pk, const DvRequest *q, uint32_t seq,
                      const char *tmpl_name, const char *other_name);

/*
 * A gather for metrics in an open pass: every rank's request q[world] is at the same call of
 * its batch. Return: 0; DEVAL_EPROTO (a call number no rank can send: *bad is the rank) or
 * DEVAL_EMISMATCH (*bad is the rank that differs from rank 0), with why in buf; seq is the
 * collective's number, name0 and namek the executor's words for rank 0 and rank *bad.
 */
int dv_pass_sites(const DvRequest *q, int world, int *bad);
void dv_pass_sites_msg(char *buf, size_t len, int status, const DvRequest *q, int bad, uint32_t seq,
                       const char *name0, const char *namek);

/*
 * A gather for metrics of stream gathered contributed[world] samples: add them to the pass's
 * counters, used (bit per stream), total[stream], most[stream] (the most one call gathered:
 * one round of batches) and rows[stream * world + rank].
 */
void dv_pass_advance(int stream, int world, const int64_t *contributed, uint32_t *used,
                     int64_t *total, int64_t *most, int64_t *rows);

/*
 * The close of a pass: no stream dropped more rows past the end than one round of batches
 * can pad, and when every rank's loader ran out (exhausted), every stream returned all
 * num_samples samples. Return: 0, or DEVAL_EMISMATCH with why in buf.
 */
int dv_pass_close(char *buf, size_t len, bool exhausted, int64_t num_samples, int order, int world,
                  uint32_t used, const int64_t *total, const int64_t *most, const int64_t *rows);
