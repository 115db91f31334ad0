/* SPDX-License-Identifier: MIT */
/*
 * sites.h - the call sites of an eval pass's batches (sites.c). Each gather for metrics of a
 * batch is at a site, a stream whose samples the pass counts apart: the first call of the
 * batch is site 0, the second site 1 (objects apart), unless the binding names the site by
 * where its user's code made the call (dv_site_next()), so that a call made in some batches
 * only does not shift the calls after it into other streams. A site that some batch did not
 * call holds none of that batch's samples: it cannot be counted by position from then on (its
 * calls say their real rows, as a call past the counted sites does), and the close does not
 * ask it for every sample.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
        uint32_t batch;   /* the pass's batches so far, replayed ones too: the current one */
        uint32_t next[2]; /* the site of the batch's next call when none is named */
        int64_t named[2]; /* the site named for the next call; -1: none */
        uint32_t *uses;   /* [stream]: the pass's batches that called there */
        uint32_t *last;   /* [stream]: the last of them (its batch number) */
        bool *gap;        /* [stream]: a batch before its last did not call there */
        size_t n;         /* streams allocated */
} DvSites;

/* The stream of a site, for tensors or objects: as many as memory holds. */
#define DV_SITE_STREAM(site, objects) ((size_t)(site)*2 + ((objects) ? 1 : 0))

/* A new batch (one replayed too): its calls are numbered from site 0 again, none named. */
void dv_sites_batch(DvSites *s);
/* The pass is over: forget its sites (s may be all zero). */
void dv_sites_free(DvSites *s);
/* Name the site of the next call of the batch (objects: of objects, else of tensors). */
void dv_sites_name(DvSites *s, int objects, uint32_t site);
/* The site the next call of the batch is at. */
uint32_t dv_sites_peek(const DvSites *s, int objects);
/* Whether the next call's site has called in every batch of the pass, the current one
 * included, so that its samples can be counted by position. */
bool dv_sites_whole_next(const DvSites *s, int objects);
/*
 * The next call is made: *ret_site its site, *ret_whole whether that site has called in every
 * batch so far, this one included. Return: 0, or DEVAL_ENOMEM.
 */
int dv_sites_take(DvSites *s, int objects, uint32_t *ret_site, bool *ret_whole);
/* Whether stream (DV_SITE_STREAM()) called in each of the pass's batches so far; a stream
 * never called is whole. */
bool dv_sites_whole(const DvSites *s, size_t stream);
/* The streams of the first nsites sites of each kind that some batch of the pass did not
 * call, as a pass's counters number them (tensors' sites, then objects'). */
uint32_t dv_sites_partial(const DvSites *s, uint32_t nsites);
