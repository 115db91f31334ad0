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

/* One stream of a pass's sites. */
typedef struct {
        uint32_t uses; /* the pass's batches that called there */
        uint32_t last; /* the last of them (its batch number) */
        bool gap;      /* a batch before its last did not call there */
        /* where its calls were counted (dv_sites_done()): the batches whose call gave a
         * result, the last of them, and what the stream held before it and after it */
        uint32_t done, done_last;
        int64_t kept, own;               /* the pass's samples it returned; this rank's */
        int64_t kept_before, own_before; /* the same before the batch done_last */
} DvSiteStream;

typedef struct {
        uint32_t batch;        /* the pass's batches so far, replayed ones too: the current one */
        uint32_t next[2];      /* the site of the batch's next call when none is named */
        int64_t named[2];      /* the site named for the next call; -1: none */
        DvSiteStream *st;      /* [n]: by DV_SITE_STREAM() */
        size_t n;              /* streams allocated */
        size_t taken;          /* the stream of the last call taken (dv_sites_take()) */
        size_t pending;        /* the same while it is under way, where it counts; else SIZE_MAX */
        int64_t pending_valid; /* its valid_rows */
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
/*
 * The call just taken is one the pass counts by position (valid_rows: the rows of its input
 * it said real; -1: all), and its result will hold every sample the step kept.
 */
void dv_sites_counts(DvSites *s, int64_t valid_rows);
/* The call under way returned: own samples of this rank's input, kept samples in all. */
void dv_sites_done(DvSites *s, int64_t own, int64_t kept);
/*
 * Where the current batch starts in a pass counted by position, for a call no stream counts
 * (one past the first nsites sites of a kind, or at a site some batch skipped): *kept, the
 * pass's samples before it, and *own, this rank's, as the first of the first nsites sites
 * whose calls every batch before made and counted says them (none before the first batch).
 * Return: false where no site says them.
 */
bool dv_sites_base(const DvSites *s, uint32_t nsites, int64_t *kept, int64_t *own);
