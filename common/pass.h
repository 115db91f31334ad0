/* SPDX-License-Identifier: MIT */
/*
 * pass.h - the eval pass: its state (DvPass), its begin and end, its counters of the samples
 * each call site gathered, and what it makes of ranks that end it while others still call
 * (which are parked, their loader ran out; which left their loop early), with the words that
 * say why a step cannot go on. One definition for every executor that runs a pass's steps
 * (devald's worker, the spanning step, a rank that runs a gather for metrics); each names the
 * ranks in its own words.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "plan.h"
#include "wire.h"

/* An eval pass, as the executor that runs its steps keeps it. */
typedef struct {
        bool open;
        int world;
        DvPassCounts c;
        int64_t *rows; /* [stream * world + rank]: the samples each rank gave so far */
        int64_t *base; /* [world]: a based call's starts (dv_pass_plan_based()) */
        bool *parked;  /* [world]: ended its pass while others had not (dv_pass_park()) */
        int nparked;
        /* the first failure of a step that answered for parked ranks: theirs at the close */
        int status;
        char msg[DV_MSG_MAX];
} DvPass;

/* A closed pass for world ranks. Return: 0, or DEVAL_ENOMEM. */
int dv_pass_init(DvPass *ps, int world);
void dv_pass_deinit(DvPass *ps);
/* Close it, forgetting what it counted. */
void dv_pass_reset(DvPass *ps);

/*
 * Every rank called eval_begin (q[world], which agree): open the pass. Return: 0, or
 * DEVAL_EINVAL (one is open) with why in buf; group is the group's name, for the words.
 */
int dv_pass_begin(DvPass *ps, const DvRequest *q, const char *group, char *buf, size_t len);

/*
 * Every rank ended the pass (q[world], eval_end): close it, and check it when every loader
 * ran out (dv_pass_close()). Return: 0; DEVAL_EINVAL (none is open); a step's failure the
 * parked ranks had not been told of; DEVAL_EMISMATCH: a rank left raising an error of its own
 * (its why), or the counts are wrong. Why in buf.
 */
int dv_pass_end(DvPass *ps, const DvRequest *q, const char *group, char *buf, size_t len);

/*
 * What every rank gets back (DvResult.flags) from the step q[world] that closed the pass:
 * DV_RES_UNCHECKED when a rank left its loop early (a break: max steps, say), so that the
 * pass is checked nowhere, as dv_pass_end() does not check it (a pass with keys checks
 * itself on each rank).
 */
uint32_t dv_pass_end_flags(const DvRequest *q, int world);

/*
 * Step call (op) failed with status and msg while ranks were parked: the first such failure
 * is theirs, told at the close.
 */
void dv_pass_failed(DvPass *ps, int status, uint32_t call, uint32_t op, const char *msg);

/*
 * The planner's input for a gather of stream (dv_pass_stream(), >= 0) in a pass counted by c
 * and rows[stream * world + rank]: the pass's order, its size, and what it gathered so far.
 */
void dv_pass_plan(const DvPassCounts *c, const int64_t *rows, int world, int stream,
                  DvPlanInput *in);

/*
 * The same for a gather of every rank's request q[world] that no stream counts but says where
 * its batch starts (dv_pass_based()): as a counted stream's that held base_total samples,
 * base_rows of each rank's (into rows[world]), in a pass of order and num_samples.
 */
void dv_pass_plan_based(int order, int64_t num_samples, const DvRequest *q, int world,
                        int64_t *rows, DvPlanInput *in);

/*
 * Counters as a rank left them in shared memory: every stream's consistent (each rank's count
 * within its total, which a gather used, the most one call gathered within it).
 */
bool dv_pass_counts_valid(const DvPassCounts *c, const int64_t *rows, int world);

typedef struct {
        int tmpl;  /* the first rank still calling; -1: every rank has ended the pass */
        int first; /* the first parked rank (after this step); -1: none */
        int left;  /* a rank that left its loop early (DV_END_LEFT) while tmpl calls; -1: none */
        bool can_answer; /* tmpl's op is one an empty contribution answers */
        bool on_gpus;    /* the group's results live on GPUs: no rank can be parked */
} DvPark;

/*
 * The step's requests q[world] in the open pass ps: ranks that send eval_end while another
 * rank still calls are parked (ps->parked, ps->nparked; ranks parked before stay parked),
 * except in a group whose results live on GPUs (on_gpus), where a parked rank could not keep
 * them to replay: there the step fails. Return: true when the step goes on (nothing to park, or every parked rank can be answered
 * for); false when it fails, and pk says why (dv_pass_park_msg()).
 */
bool dv_pass_park(DvPass *ps, const DvRequest *q, bool on_gpus, DvPark *pk);

/*
 * Why the step fails, for dv_pass_park()'s false: seq is the collective's number; name(k)
 * gives the executor's words for rank k ("rank 3 (pid 88)", "rank 3 (node 1)").
 */
void dv_pass_park_msg(char *buf, size_t len, const DvPark *pk, const DvRequest *q, uint32_t seq,
                      const char *tmpl_name, const char *other_name);

/*
 * A gather for metrics in an open pass: every rank's request q[world] is at the same call of
 * its batch (any call: one past the counted sites counts nothing, dv_pass_stream()). Return:
 * 0, or DEVAL_EMISMATCH (*bad is the rank that differs from rank 0), with why in buf from
 * dv_pass_sites_msg(); seq is the collective's number, name0 and namek the executor's words
 * for rank 0 and rank *bad.
 */
int dv_pass_sites(const DvRequest *q, int world, int *bad);
void dv_pass_sites_msg(char *buf, size_t len, const DvRequest *q, int bad, uint32_t seq,
                       const char *name0, const char *namek);

/*
 * A gather for metrics of stream gathered contributed[world] samples: add them to the pass's
 * counters c (used, total, most: the most one call gathered, one round of batches) and
 * rows[stream * world + rank].
 */
void dv_pass_advance(int stream, int world, const int64_t *contributed, DvPassCounts *c,
                     int64_t *rows);
