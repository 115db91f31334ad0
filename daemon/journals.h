/* SPDX-License-Identifier: MIT */
/*
 * journals.h - the journals devald keeps for passes that may resume (journals.c): one
 * segment per rank of each open pass of a job, in memory or written through to a file,
 * counted in its uid's quota, dropped when the pass closes, when deval-ctl says, or once
 * idle for --resume-keep seconds.
 */
#pragma once

#include <stdint.h>

#include "daemon.h"

/* Answer c's DV_MSG_JOURNAL or DV_MSG_JOURNALS request (m: sizeof(DvJournalReq) bytes). */
void journals_request(Daemon *d, Conn *c, const DvJournalReq *m);
/* Learn the journals written through to files by an earlier devald. */
void journals_load(Daemon *d);
/* Drop the journals idle past --resume-keep; *next_ns lowered to when the next one is due. */
void journals_expire(Daemon *d, uint64_t now, int64_t *next_ns);
/* Does devald hold journals only its memory keeps (so that exiting would lose them)? */
bool journals_in_memory(const Daemon *d);
/* Drop them all (devald exits): files stay, for the next devald. */
void journals_close(Daemon *d);
