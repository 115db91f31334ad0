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
        s->pending = SIZE_MAX;
}

/** dv_sites_free() - see sites.h. */
void dv_sites_free(DvSites *s) {
        free(s->st);
        *s = (DvSites){.named = {-1, -1}, .taken = SIZE_MAX, .pending = SIZE_MAX};
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
        if (st >= s->n || !s->st[st].uses)
                return batch <= 1; /* its first call: whole only in the pass's first batch */
        const DvSiteStream *t = &s->st[st];
        if (t->gap)
                return false;
        return t->uses + (t->last != batch) >= batch;
}

/** dv_sites_whole_next() - see sites.h. */
bool dv_sites_whole_next(const DvSites *s, int objects) {
        return whole_now(s, DV_SITE_STREAM(dv_sites_peek(s, objects), objects));
}

static int grow(DvSites *s, size_t st) {
        size_t n = s->n ? s->n : 8;
        while (n <= st) {
                if (n > SIZE_MAX / 2 / sizeof(DvSiteStream))
                        return DEVAL_ENOMEM;
                n *= 2;
        }
        DvSiteStream *p = realloc(s->st, n * sizeof(*p));
        if (!p)
                return DEVAL_ENOMEM;
        memset(p + s->n, 0, (n - s->n) * sizeof(*p));
        s->st = p;
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
        DvSiteStream *t = &s->st[st];
        if (t->last != s->batch) {
                t->gap = !whole;
                t->uses++;
                t->last = s->batch;
        }
        s->named[kind] = -1;
        s->taken = st;
        s->pending = SIZE_MAX;
        if (site >= s->next[kind])
                s->next[kind] = site + 1; /* (an unnamed call after a named one: the next) */
        *ret_site = site;
        *ret_whole = whole;
        return 0;
}

/** dv_sites_whole() - see sites.h. */
bool dv_sites_whole(const DvSites *s, size_t stream) {
        if (stream >= s->n || !s->st[stream].uses)
                return true;
        return !s->st[stream].gap && s->st[stream].uses >= s->batch;
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

/** dv_sites_counts() - see sites.h. */
void dv_sites_counts(DvSites *s, int64_t valid_rows) {
        s->pending = s->taken;
        s->pending_valid = valid_rows;
}

/** dv_sites_done() - see sites.h. */
void dv_sites_done(DvSites *s, int64_t own, int64_t kept) {
        size_t st = s->pending;
        s->pending = SIZE_MAX;
        if (st >= s->n)
                return; /* (a call no stream counts) */
        if (s->pending_valid >= 0 && s->pending_valid < own)
                own = s->pending_valid;
        DvSiteStream *t = &s->st[st];
        if (t->done_last != s->batch) {
                t->done++;
                t->done_last = s->batch;
                t->kept_before = t->kept;
                t->own_before = t->own;
        }
        t->kept += kept;
        t->own += own;
}

/** dv_sites_base() - see sites.h. */
bool dv_sites_base(const DvSites *s, uint32_t nsites, int64_t *kept, int64_t *own) {
        uint32_t before = s->batch ? s->batch - 1 : 0;
        *kept = *own = 0;
        if (!before)
                return true; /* the first batch starts the pass */
        for (size_t st = 0; st < s->n && st < 2 * (size_t)nsites; st++) {
                const DvSiteStream *t = &s->st[st];
                bool now = t->done_last == s->batch;
                if (t->gap || t->done - now != before)
                        continue; /* (a batch before did not count a call there) */
                *kept = now ? t->kept_before : t->kept;
                *own = now ? t->own_before : t->own;
                return true;
        }
        return false;
}
