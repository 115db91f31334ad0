/* SPDX-License-Identifier: MIT */
/*
 * join_err.h - why a join failed, for deval_errmsg(NULL) on this thread (handle.c). Exported
 * outside the API (libdeval.sym's DEVAL_PRIVATE) for libdeval-mpi, whose joins say why too.
 */
#pragma once

int dv_join_err(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
