/* SPDX-License-Identifier: MIT */
/*
 * check.h - the first look devald takes at what a client sent: a socket message's shape,
 * a join request's fields, a tensor descriptor copied out of shared memory. Pure functions
 * of their input, so the fuzz targets (tests/fuzz) drive exactly what devald runs.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* The type of a well-formed client request of n bytes (its size is its type's), or -1. */
int dv_msg_check(const void *buf, size_t n);
/* A join request's own fields: name, world size, rank. 0, or DEVAL_EINVAL with why. */
int dv_join_check(const DvJoinReq *req, char *why, size_t len);

/* The status a rank that could not make its call may report: DEVAL_ENOMEM or DEVAL_ESYS (its
 * input did not fit), DEVAL_EINVAL (its own checks refused its arguments), as it wrote it; any
 * other value is a malformed request (0). */
int dv_staging_status(int32_t status);
/* A rank's own account of a failure (client text): up to its first NUL, at most srclen
 * bytes, into dst (len bytes, terminated), each byte outside printable ASCII as '?'.
 * Return: the bytes copied. */
size_t dv_printable(char *dst, size_t len, const char *src, size_t srclen);

/* A span record for a group of local_world ranks: 0, or DEVAL_EINVAL with why. */
int dv_span_check(const DvSpanInfo *s, int local_world, char *why, size_t len);

enum {
        DV_DESC_OK = 0,
        DV_DESC_BAD_TYPE,  /* dtype or ndim */
        DV_DESC_BAD_SHAPE, /* a negative dim, or the element count overflows */
        DV_DESC_BAD_PLACE  /* nbytes does not match, or the bytes leave the arena */
};
/*
 * A tensor descriptor against the arena it claims to lie in (arena bytes); with_data false
 * checks the shape only. Every product and sum is checked for 64-bit overflow.
 */
int dv_desc_check(const DvTensorDesc *t, uint64_t arena, bool with_data);
