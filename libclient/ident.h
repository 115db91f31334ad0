/* SPDX-License-Identifier: MIT */
/*
 * ident.h - an eval pass whose samples carry their identity (ident.c).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deval.h"

/* What a pass with keys asks devald for: a count no gather reaches, so that devald drops
 * nothing by position and the keys alone decide what a result holds. */
#define DV_IDENT_UNCOUNTED ((int64_t)1 << 52)

typedef struct DvIdent DvIdent;

int dv_ident_begin(deval_group *g, const char *fn, int64_t num_samples, int64_t num_keys);
void dv_ident_free(deval_group *g);
void dv_ident_batch_unkeyed(deval_group *g);
int dv_ident_batch(deval_group *g, const char *fn, int64_t n, const int64_t keys[]);

int dv_ident_call(deval_group *g, const char *fn, int n, const deval_tensor in[],
                  const deval_gather_opts *opts, deval_tensor call[]);
int dv_ident_explain(deval_group *g, int r);
int dv_ident_result(deval_group *g, const char *fn, int stream, int n, const deval_tensor res[],
                    uint64_t same_rows, deval_tensor out[]);
int dv_ident_items_call(deval_group *g, const char *fn, size_t n, const deval_bytes items[],
                        const deval_gather_opts *opts, const deval_bytes **call);
int dv_ident_items_result(deval_group *g, const char *fn, int stream, size_t n,
                          const deval_bytes res[], bool same_rows, size_t *out_n,
                          const deval_bytes **out);

/* The pass's num_samples and num_keys (either pointer may be NULL); 0 without keys. */
void dv_ident_sizes(const deval_group *g, int64_t *num_samples, int64_t *num_keys);
void dv_ident_check_later(deval_group *g);
bool dv_ident_check_due(const deval_group *g);
int dv_ident_check(deval_group *g, const char *fn);
