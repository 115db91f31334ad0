/* SPDX-License-Identifier: MIT */
/*
 * progress.c - a pass's progress, as its ranks publish it (progress.h).
 */
#include "progress.h"

#include <stdatomic.h>

void dv_progress_begin(DvSlot *s, int64_t num_samples, bool keyed) {
        atomic_store_explicit(&s->pass_total, num_samples, memory_order_relaxed);
        /* a pass by position: its counters say what each rank gave */
        atomic_store_explicit(&s->pass_samples, keyed ? 0 : -1, memory_order_relaxed);
        atomic_store_explicit(&s->pass_batches, 0, memory_order_relaxed);
        atomic_store_explicit(&s->pass_state, DV_PASS_RANK_IN, memory_order_relaxed);
}

void dv_progress_batch(DvSlot *s, uint32_t no, int64_t n) {
        atomic_store_explicit(&s->pass_batches, no, memory_order_relaxed);
        int64_t had = atomic_load_explicit(&s->pass_samples, memory_order_relaxed);
        if (had >= 0 && n > 0)
                atomic_store_explicit(&s->pass_samples, had + n, memory_order_relaxed);
}

void dv_progress_end(DvSlot *s) {
        atomic_store_explicit(&s->pass_state, DV_PASS_RANK_ENDED, memory_order_relaxed);
}

static int64_t load64(const int64_t *p) {
        return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* The stream of a pass by position that gathered the most: its first call of each batch. */
static int lead_stream(const DvPassShared *sh) {
        uint32_t used = __atomic_load_n(&sh->c.used, __ATOMIC_RELAXED);
        int lead = -1;
        int64_t most = -1;
        for (int s = 0; s < DV_PASS_STREAMS; s++) {
                int64_t t = load64(&sh->c.total[s]);
                if ((used >> s & 1u) && t > most) {
                        most = t;
                        lead = s;
                }
        }
        return lead;
}

bool dv_progress_read(const DvCtlHeader *h, const DvPassShared *sh, int world, DvPassInfo *p,
                      DvRankProgress *ranks) {
        *p = (DvPassInfo){.total = -1, .lag_rank = -1};
        if (!h || !sh || world < 1 || !atomic_load_explicit(&sh->open, memory_order_relaxed))
                return false;
        int64_t total = atomic_load_explicit(&h->slots[0].pass_total, memory_order_relaxed);
        p->total = total < 0 ? 0 : total;
        int lead = lead_stream(sh);
        int64_t sum = 0;
        uint32_t lo = UINT32_MAX, hi = 0, lo_all = UINT32_MAX, hi_all = 0;
        for (int k = 0; k < world; k++) {
                const DvSlot *s = &h->slots[k];
                DvRankProgress r = {
                        .state = atomic_load_explicit(&s->pass_state, memory_order_relaxed),
                        .batches = atomic_load_explicit(&s->pass_batches, memory_order_relaxed),
                        .samples = atomic_load_explicit(&s->pass_samples, memory_order_relaxed)};
                if (r.samples < 0) /* a pass by position */
                        r.samples = lead < 0 ? 0 : load64(&sh->rows[lead * world + k]);
                if (r.samples < 0 || r.samples > p->total)
                        r.samples = r.samples < 0 ? 0 : p->total;
                sum += r.samples;
                if (sum > p->total)
                        sum = p->total;
                lo_all = r.batches < lo_all ? r.batches : lo_all;
                hi_all = r.batches > hi_all ? r.batches : hi_all;
                if (r.state == DV_PASS_RANK_ENDED)
                        p->ended++;
                else if (r.batches < lo) {
                        lo = r.batches;
                        p->lag_rank = k;
                }
                if (r.state != DV_PASS_RANK_ENDED && r.batches > hi)
                        hi = r.batches;
                if (ranks)
                        ranks[k] = r;
        }
        p->samples = sum;
        if (lo == UINT32_MAX) { /* every rank ended it: the pass closes */
                lo = lo_all;
                hi = hi_all;
                p->lag_rank = -1;
        }
        p->batches_min = lo;
        p->batches_max = hi;
        if (lo == hi)
                p->lag_rank = -1;
        return true;
}
