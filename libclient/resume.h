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

#include "wire.h"

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
