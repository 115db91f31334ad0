/* SPDX-License-Identifier: MIT */
/*
 * journal.h - the layout of a pass's journal (journal.c): the results one rank's loop got,
 * batch by batch, in a segment devald keeps for the job (daemon/journal.c), so that a job
 * restarted after a crash answers the batches already done from it (libclient/resume.c).
 *
 * The segment is a header, then whole batches, one after the other. A batch is a record
 * header (its size, the loader's digest of the batch, a hash of what follows) and its steps,
 * each a result (DvResult's head and descriptors, offsets relative to the step's data) and
 * its data. The writer appends a batch's steps past the end, then writes the record header
 * and publishes the new end and count with release stores: a reader sees whole batches, and
 * a rank killed in the middle of one leaves the batches before it. Whatever a segment holds
 * is checked before it is used (dv_journal_scan()): a torn or hostile record ends the
 * journal there.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define DV_JOURNAL_MAGIC   0x4e524a44u /* "DJRN" */
#define DV_JOURNAL_VERSION 1u
#define DV_RESUME_KEY_MAX  64 /* including the terminating NUL */
#define DV_JOURNAL_ALIGN   64

/* DvJournalHdr.flags: devald wants each batch on disk before it counts (--state-dir) */
#define DV_JOURNAL_SYNC 1u

typedef struct {
        uint32_t magic;
        uint32_t version;
        uint64_t ident;           /* the pass it keeps (libclient/resume.c); 0: none yet */
        _Atomic uint64_t batches; /* whole batches, published after their bytes */
        _Atomic uint64_t end;     /* where the whole batches end, from the segment's start */
        uint64_t made_s;          /* when the pass it keeps began, in seconds since the epoch */
        int32_t rank, world;
        uint32_t ordinal; /* which of the group's passes in the process (1, 2, ...) */
        uint32_t flags;   /* DV_JOURNAL_*: devald's */
        char key[DV_RESUME_KEY_MAX];
        char group[DV_GROUP_NAME_MAX];
        uint64_t loader; /* the loader_digest of the pass it keeps (deval_eval_resume()) */
        uint8_t reserved[64];
} DvJournalHdr;
_Static_assert(sizeof(DvJournalHdr) == 256, "the journal header is 256 bytes");

typedef struct {
        uint64_t size;   /* the record, this header included, a multiple of DV_JOURNAL_ALIGN */
        uint64_t digest; /* the loader's digest of the batch (deval_eval_batch_digest()) */
        uint64_t check;  /* dv_journal_hash() of the record's bytes past this header */
        uint32_t nsteps;
        uint32_t reserved;
} DvJournalBatch;

/* The op of a step that is no collective: bytes of the caller's own, kept with the batch
 * (deval_eval_batch_state()), one U8 tensor. */
#define DV_JOURNAL_STATE 0u

/* A step: this header, then its result's head and res.ntensors descriptors (offsets from
 * the step's data), then, at data, the data. */
typedef struct {
        uint64_t size; /* the step, this header included, a multiple of DV_JOURNAL_ALIGN */
        uint64_t data; /* where its data starts, from the step's start */
} DvJournalStep;

/* The bytes of a step's header and result for a result of n tensors. */
#define DV_JOURNAL_STEP_HEAD(n) \
        (sizeof(DvJournalStep) + offsetof(DvResult, t) + (uint64_t)(n) * sizeof(DvTensorDesc))

/* A 64-bit hash of n bytes, folded into h (start with DV_JOURNAL_HASH0). */
#define DV_JOURNAL_HASH0 0x9e3779b97f4a7c15ull
uint64_t dv_journal_hash(uint64_t h, const void *p, uint64_t n);

/*
 * The whole batches of the journal in base[0..size): their count, where the last ends, and,
 * when at is not NULL, where each of the first max starts. A record that leaves the segment,
 * whose steps do not fill it exactly, or whose hash differs ends the scan there, as does a
 * header that is not a journal's (0 batches). Reads base as untrusted.
 */
uint64_t dv_journal_scan(const uint8_t *base, uint64_t size, uint64_t *end, uint64_t *at,
                         uint64_t max);

/*
 * The step at off of the batch record [rec, rec_end) in base: its result, with descriptors
 * whose offsets are from *data, which holds *data_size bytes. Return: the step's end, or 0
 * when it is malformed.
 */
uint64_t dv_journal_step(const uint8_t *base, uint64_t off, uint64_t rec_end, DvResult *res,
                         const uint8_t **data, uint64_t *data_size);
