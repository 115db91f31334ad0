/* SPDX-License-Identifier: MIT */
/*
 * resume.h - a pass that survives a crash (resume.c): this rank's journal of the results its
 * loop got, batch by batch, kept by devald under the job's resume key; and, in a job started
 * again, the batches already done answered from it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deval.h"

#include "journal.h"
#include "wire.h"

typedef struct {
        char key[DV_RESUME_KEY_MAX];   /* the job's resume key; "": this process keeps none */
        char group[DV_GROUP_NAME_MAX]; /* the group's, as every run of the job names it */
        uint32_t ordinal;              /* passes begun on the handle */
        uint8_t *base;                 /* the journal, mapped; NULL: none */
        uint64_t size;
        bool on;       /* this pass writes its batches to the journal */
        bool stopped;  /* it could not grow: batches from here on are not kept */
        uint64_t kept; /* the pass's first batches, answered from the journal */
        uint64_t *at;  /* where each of them starts */
        uint64_t step; /* answering: the next step of the batch, and where the batch ends */
        uint64_t rec_end;
        uint32_t steps_left;
        bool writing; /* a batch is being written: its record starts at rec, ends at tail */
        uint64_t rec, tail;
        uint32_t nsteps;
        uint64_t digest;
        DvResult res; /* the result being answered */
        /* deval_eval_kept_state(): the latest state kept in the first state_scanned batches */
        const uint8_t *state;
        uint64_t state_len;
        uint32_t state_scanned;
} DvResumeState;

/* At the join: the job's resume key, from $DEVAL_RESUME_KEY or the launcher (job.h), and
 * the group's name as every run of the job gives it (group). */
void dv_resume_init(deval_group *g, const char *group);
/* The handle goes: unmap what it holds. */
void dv_resume_free(deval_group *g);
/* A pass begins on g: the next ordinal; nothing of the last pass is kept here. */
void dv_resume_pass_begin(deval_group *g);
/* deval_eval_batch(): the last batch is whole (written); the next is answered or written. */
int dv_resume_batch(deval_group *g, const char *fn);
/* Is the collective in flight answered from the journal? */
bool dv_resume_answers(const deval_group *g);
/* Answer it, when it is the call the kept batch made there (replay.h's check). */
int dv_resume_take(deval_group *g, const char *fn, const DvRequest *q, const DvResult **ret);
/* Write res, the result of a collective of the batch, to the journal (when it keeps one);
 * NULL: the collective failed, so the batch is not whole, nor any after it. */
void dv_resume_keep(deval_group *g, const DvResult *res);
/* This rank ends its pass; whole: its loop ran to the end, so the last batch is whole.
 * Return: 0, or DEVAL_EMISMATCH when a batch answered from the journal made fewer calls
 * than the kept one. */
int dv_resume_pass_end(deval_group *g, const char *fn, bool whole);
/* The pass closed: its journal is dropped (devald's too). */
void dv_resume_pass_closed(deval_group *g);
