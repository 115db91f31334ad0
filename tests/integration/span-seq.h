/* SPDX-License-Identifier: MIT */
/* span-seq.h - the sequence a spanning group and a flat group must answer alike (span-seq.c) */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "deval.h"

typedef struct {
        unsigned char *b;
        size_t n, cap;
        int entries, failed;
} SpanLog;

/* rank span_stop_rank stops itself (SIGSTOP) at call span_stop_at of a spanning run */
extern int span_stop_rank, span_stop_at;

/* Run the sequence as rank of world on g, logging into l. A group's failure (DEVAL_EPEER,
 * DEVAL_ETIMEDOUT, DEVAL_EDAEMON, DEVAL_EPROTO) is printed and ends the process (exit 3). */
void span_seq(deval_group *g, SpanLog *l, int rank, int world, bool span);
/* Part of it: 1, every op and option and the even passes; 2, the passes with uneven loaders
 * (their replay) and with keys; 0, both. */
void span_seq_part(deval_group *g, SpanLog *l, int rank, int world, bool span, int part);
/* How a result on a GPU is read back (a device group's): NULL, none is expected. */
extern int (*span_seq_read_device)(int device, void *dst, const void *src, size_t bytes);
/* 0 when a and b are identical; 1 with where they differ in why. */
int span_seq_diff(const SpanLog *a, const SpanLog *b, char *why, size_t len);
void span_log_free(SpanLog *l);
