/* SPDX-License-Identifier: MIT */
/*
 * stage.h - a collective's request, its inputs, and views of its result (stage.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "deval.h"

#include "wire.h"

/* Tensor i of the call fn: its fields, its size in *ret_bytes; need_data: data is read. */
int dv_check_tensor(deval_group *g, const char *fn, int i, const deval_tensor *t, bool need_data,
                    uint64_t *ret_bytes);
/* Start this rank's request of op in its slot (the handle's owner only). */
int dv_req_start(deval_group *g, uint32_t op, DvRequest **ret);
/* Which call of the batch a *_METRICS request is (deval_eval_batch()). */
int dv_req_site(deval_group *g, const char *fn, DvRequest *q);
void dv_desc_set(DvTensorDesc *d, const deval_tensor *t, uint64_t offset, uint64_t bytes);
/* The caller's gather options, through their size, into *own; checked; into a request. */
int dv_take_opts(deval_group *g, const char *fn, const deval_gather_opts *opts,
                 deval_gather_opts *own);
int dv_check_opts(deval_group *g, const char *fn, const deval_gather_opts *o);
void dv_req_set_opts(DvRequest *q, const deval_gather_opts *o);
/*
 * n tensors into q: checked, then copied where the step reads them (dev: the device input
 * arena), or described where they lie. with_data[i] false (NULL: all true): tensor i's shape
 * only. Return: 0, or the failure (a failed stage is every rank's, dv_stage_failed()).
 */
int dv_put_tensors_to(deval_group *g, const char *fn, int n, const deval_tensor *in,
                      const bool *with_data, DvRequest *q, bool dev);
int dv_put_tensors(deval_group *g, const char *fn, int n, const deval_tensor *in,
                   const bool *with_data, DvRequest *q);
/* A result descriptor as a view: in the host result, or on this rank's GPU. */
int dv_view_of(deval_group *g, const char *fn, const DvTensorDesc *d, deval_tensor *out);
int dv_view_of_dev(deval_group *g, const char *fn, const DvTensorDesc *d, deval_tensor *out);
/* A result into the caller's tensor, on the host or a GPU. */
int dv_write_back(deval_group *g, const char *fn, deval_tensor *t, const void *src, uint64_t bytes);
