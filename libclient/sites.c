/* SPDX-License-Identifier: MIT */
/*
 * sites.c - the call sites of an eval pass's batches, and which of them some batch skipped
 * (sites.h).
 */
#include "sites.h"

#include <stdlib.h>
#include <string.h>

#include "deval.h"

/** dv_sites_batch() - see sites.h. */
void dv_sites_batch(DvSites *s) {
        s->batch++;
        s->next[0] = s->next[1] = 0;
        s->named[0] = s->named[1] = -1;
}

/** dv_sites_free() - see sites.h. */
void dv_sites_free(DvSites *s) {
        free(s->uses);
        free(s->last);
        free(s->gap);
        *s = (DvSites){.named = {-1, -1}};
}

/** dv_sites_name() - see sites.h. */
void dv_sites_name(DvSites *s, int objects, uint32_t site) {
        s->named[objects != 0] = site;
}

/** dv_sites_peek() - see sites.h. */
uint32_t dv_sites_peek(const DvSites *s, int objects) {
        int kind = objects != 0;
        return s->named[kind] >= 0 ? (uint32_t)s->named[kind] : s->next[kind];
}

/* Whether stream st, called now, has called in every batch of the pass. */
static bool whole_now(const DvSites *s, size_t st) {
        uint32_t batch = s->batch;
        if (st >= s->n || !s->uses[st])
                return batch <= 1; /* its first call: whole only in the pass's first batch */
        if (s->gap[st])
                return false;
        uint32_t uses = s->uses[st] + (s->last[st] != batch);
        return uses >= batch;
}

/** dv_sites_whole_next() - see sites.h. */
bool dv_sites_whole_next(const DvSites *s, int objects) {
        return whole_now(s, DV_SITE_STREAM(dv_sites_peek(s, objects), objects));
}

static int grow(DvSites *s, size_t st) {
        size_t n = s->n ? s->n : 8;
        while (n <= st) {
                if (n > SIZE_MAX / 2 / sizeof(uint32_t))
                        return DEVAL_ENOMEM;
                n *= 2;
        }
        uint32_t *uses = realloc(s->uses, n * sizeof(*uses));
        if (uses)
                s->uses = uses;
        uint32_t *last = realloc(s->last, n * sizeof(*last));
        if (last)
                s->last = last;
        bool *gap = realloc(s->gap, n * sizeof(*gap));
        if (gap)
                s->gap = gap;
        if (!uses || !last || !gap)
                return DEVAL_ENOMEM;
        memset(uses + s->n, 0, (n - s->n) * sizeof(*uses));
        memset(last + s->n, 0, (n - s->n) * sizeof(*last));
        memset(gap + s->n, 0, (n - s->n) * sizeof(*gap));
        s->n = n;
        return 0;
}

/** dv_sites_take() - see sites.h. */
int dv_sites_take(DvSites *s, int objects, uint32_t *ret_site, bool *ret_whole) {
        int kind = objects != 0;
        uint32_t site = dv_sites_peek(s, objects);
        size_t st = DV_SITE_STREAM(site, objects);
        if (st >= s->n) {
                int r = grow(s, st);
                if (r < 0)
                        return r;
        }
        bool whole = whole_now(s, st);
        if (s->last[st] != s->batch) {
                s->gap[st] = !whole;
                s->uses[st]++;
                s->last[st] = s->batch;
        }
        s->named[kind] = -1;
        if (site >= s->next[kind])
                s->next[kind] = site + 1; /* (an unnamed call after a named one: the next) */
        *ret_site = site;
        *ret_whole = whole;
        return 0;
}

/** dv_sites_whole() - see sites.h. */
bool dv_sites_whole(const DvSites *s, size_t stream) {
        if (stream >= s->n || !s->uses[stream])
                return true;
        return !s->gap[stream] && s->uses[stream] >= s->batch;
}

/** dv_sites_partial() - see sites.h. */
uint32_t dv_sites_partial(const DvSites *s, uint32_t nsites) {
        uint32_t mask = 0;
        for (uint32_t site = 0; site < nsites && 2 * nsites <= 32; site++)
                for (int objects = 0; objects < 2; objects++)
                        if (!dv_sites_whole(s, DV_SITE_STREAM(site, objects)))
                                mask |= 1u << (objects ? nsites + site : site);
        return mask;
}
