/* SPDX-License-Identifier: MIT */
/*
 * dtype.h - the dtype table: sizes and names, half-precision conversions that round
 * correctly (to nearest, ties to even), a pad value as one element's bytes, and the
 * element-wise reduction used by reduce.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deval.h"

bool dv_dtype_valid(int dtype);
size_t dv_dtype_size(int dtype);
const char *dv_dtype_name(int dtype);
bool dv_dtype_is_float(int dtype);

double dv_f16_to_f64(uint16_t h);
double dv_bf16_to_f64(uint16_t b);
uint16_t dv_f64_to_f16(double x);
uint16_t dv_f64_to_bf16(double x);

/* Write value converted to dtype into out (dv_dtype_size(dtype) bytes). */
void dv_dtype_encode(int dtype, double value, void *out);
/* Read one element of dtype as a double (integers past 2^53 lose precision). */
double dv_dtype_decode(int dtype, const void *in);

/*
 * acc[k] = op(acc[k], x[k]) for k < n elements of dtype, in place, one rank at a time, so
 * that the result depends only on rank order. For f16/bf16, acc is a double array of n
 * elements (the caller rounds once at the end); for every other dtype, acc has the dtype.
 */
void dv_reduce_accumulate(int dtype, int op, void *acc, const void *x, size_t n);
/* Start an accumulator from rank 0's n elements. */
void dv_reduce_init(int dtype, void *acc, const void *x, size_t n);
/* Turn the accumulator after world ranks into the result (MEAN divides, f16/bf16 round). */
void dv_reduce_finish(int dtype, int op, int world, const void *acc, void *out, size_t n);
/* Bytes of accumulator per element. */
size_t dv_reduce_acc_size(int dtype);
/*
 * The reduce of a step: world ranks' numel elements of dtype (srcs[k], rank k's, any
 * alignment) reduced by op in rank order into out, as every executor of a reduce does it.
 */
void dv_reduce_ranks(int dtype, int op, int world, const uint8_t *const *srcs, uint64_t numel,
                     void *out);
