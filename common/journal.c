/* SPDX-License-Identifier: MIT */
/*
 * journal.c - reading a pass's journal (journal.h) as untrusted bytes: its hash, its whole
 * batches, and the steps of one.
 */
#include "journal.h"

#include <string.h>

#include "dtype.h"
#include "plan.h"
#include "util.h"

/* Eight bytes at a time, multiplied and rotated: the journal's bytes cross memory once more
 * as they are copied in, so the hash must cost about a copy. */
uint64_t dv_journal_hash(uint64_t h, const void *p, uint64_t n) {
        const uint8_t *b = p;
        uint64_t w;
        for (; n >= 8; n -= 8, b += 8) {
                memcpy(&w, b, 8);
                h = (h ^ w) * 0x9fb21c651e98df25ull;
                h ^= h >> 29;
        }
        w = 0;
        memcpy(&w, b, n);
        h = (h ^ w ^ (n << 56)) * 0x9fb21c651e98df25ull;
        return h ^ (h >> 32);
}

/* Is d a descriptor a result may hold: a known dtype, dims in range, bytes its shape's? */
static bool desc_ok(const DvTensorDesc *d, uint64_t data_size) {
        int64_t numel = 1;
        if (!dv_dtype_valid(d->dtype) || d->ndim < 0 || d->ndim > DEVAL_MAX_DIMS)
                return false;
        DvShape sh = dv_shape_of(d);
        if (!dv_shape_numel(&sh, &numel) || numel > INT64_MAX / 16)
                return false;
        if ((uint64_t)numel * dv_dtype_size(d->dtype) != d->nbytes)
                return false;
        return d->offset <= data_size && d->nbytes <= data_size - d->offset;
}

uint64_t dv_journal_step(const uint8_t *base, uint64_t off, uint64_t rec_end, DvResult *res,
                         const uint8_t **data, uint64_t *data_size) {
        DvJournalStep s;
        if (off > rec_end || rec_end - off < DV_JOURNAL_STEP_HEAD(0))
                return 0;
        memcpy(&s, base + off, sizeof(s));
        memcpy(res, base + off + sizeof(s), offsetof(DvResult, t));
        uint32_t n = res->ntensors;
        if (n > DEVAL_MAX_TENSORS || s.size > rec_end - off || s.size % DV_JOURNAL_ALIGN ||
            s.data < DV_JOURNAL_STEP_HEAD(n) || s.data > s.size)
                return 0;
        memcpy(res->t, base + off + sizeof(s) + offsetof(DvResult, t), n * sizeof(DvTensorDesc));
        *data = base + off + s.data;
        *data_size = s.size - s.data;
        for (uint32_t i = 0; i < n; i++)
                if (!desc_ok(&res->t[i], *data_size))
                        return 0;
        return off + s.size;
}

/* Is the batch record at off, ending at or before limit, whole? Return: its end, or 0. */
static uint64_t batch_ok(const uint8_t *base, uint64_t off, uint64_t limit) {
        DvJournalBatch b;
        DvResult res;
        const uint8_t *data;
        uint64_t data_size;

        if (limit - off < sizeof(b))
                return 0;
        memcpy(&b, base + off, sizeof(b));
        if (b.size < DV_ALIGN(sizeof(b), DV_JOURNAL_ALIGN) || b.size > limit - off ||
            b.size % DV_JOURNAL_ALIGN)
                return 0;
        uint64_t end = off + b.size;
        uint64_t body = off + DV_ALIGN(sizeof(b), DV_JOURNAL_ALIGN);
        if (dv_journal_hash(DV_JOURNAL_HASH0, base + body, end - body) != b.check)
                return 0;
        uint64_t at = body;
        for (uint32_t i = 0; i < b.nsteps; i++)
                if (!(at = dv_journal_step(base, at, end, &res, &data, &data_size)))
                        return 0;
        return at == end ? end : 0;
}

uint64_t dv_journal_scan(const uint8_t *base, uint64_t size, uint64_t *end, uint64_t *at,
                         uint64_t max) {
        DvJournalHdr h;
        uint64_t n = 0, off = sizeof(h);

        *end = off;
        if (size < sizeof(h))
                return 0;
        memcpy(&h, base, offsetof(DvJournalHdr, batches));
        uint64_t said =
                atomic_load_explicit(&((const DvJournalHdr *)base)->batches, memory_order_acquire);
        uint64_t limit =
                atomic_load_explicit(&((const DvJournalHdr *)base)->end, memory_order_relaxed);
        if (h.magic != DV_JOURNAL_MAGIC || h.version != DV_JOURNAL_VERSION)
                return 0;
        limit = DV_MIN(limit, size);
        while (n < said && off < limit) {
                uint64_t next = batch_ok(base, off, limit);
                if (!next)
                        break;
                if (at && n < max)
                        at[n] = off;
                n++;
                off = next;
        }
        *end = off;
        return n;
}
