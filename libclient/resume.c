/* SPDX-License-Identifier: MIT */
/*
 * resume.c - a pass that survives a crash.
 *
 * In a pass with keys, each rank writes what its loop's collectives returned, batch by
 * batch, to a journal devald keeps for the job (common/journal.h; daemon/journals.c): the
 * job's resume key (the launcher's job id without its restart count), the group, the pass's
 * ordinal and the rank name it. A batch counts once whole: a rank killed in the middle of
 * one leaves the batches before it.
 *
 * Only where asked for ($DEVAL_RESUME=1, or a $DEVAL_RESUME_KEY of the user's): a loop whose
 * body keeps state of its own across batches (a running sum, a carried hidden state) would
 * lose the kept batches' part of it, so resuming is the user's call.
 *
 * When the job starts again (its launcher restarts it, or the user reruns it with the same
 * $DEVAL_RESUME_KEY), deval_eval_resume() finds each rank's journal of the pass and the
 * ranks agree, in one reduce, on the batches every rank kept whole: K. The pass's first K
 * batches are then answered from the journal, as the replay answers a parked rank's
 * (replay.h checks each call against the kept one); from batch K + 1 on the pass runs and
 * writes as before. A journal of another pass (another dataset, first batch, sampler order,
 * world, or collectives before it) is not used: the pass starts over and says why. Each
 * batch's digest (the binding's, of its dataset indices and data) is checked as it is
 * answered. The journal is dropped when the pass closes.
 */
#define _GNU_SOURCE
#include "resume.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "deval.h"

#include "calls.h"
#include "handle.h"
#include "ident.h"
#include "journal.h"
#include "replay.h"
#include "sock.h"
#include "tunables.h"
#include "util.h"

static void unmap(DvResumeState *s) {
        if (s->base)
                munmap(s->base, s->size);
        s->base = NULL;
        s->size = 0;
}

/* Forget this pass's journal state, keeping the key and the ordinal. */
static void reset(DvResumeState *s) {
        unmap(s);
        free(s->at);
        s->at = NULL;
        s->on = s->stopped = s->writing = false;
        s->kept = s->step = s->rec_end = s->rec = s->tail = s->digest = 0;
        s->steps_left = s->nsteps = 0;
        s->state = NULL;
        s->state_len = 0;
        s->state_scanned = 0;
}

void dv_resume_free(deval_group *g) {
        reset(&g->resume);
}

/* What the layers below reach through the handle (handle.h). */
static const DvResumeOps resume_ops = {
        .answers = dv_resume_answers,
        .take = dv_resume_take,
        .keep = dv_resume_keep,
        .free = dv_resume_free,
};

void dv_resume_pass_begin(deval_group *g) {
        reset(&g->resume);
        g->resume.ordinal++;
        g->resume_ops = &resume_ops;
}

/* Ask devald for this rank's journal of the pass (action), at least size bytes; map it. */
static int journal_request(deval_group *g, uint32_t action, uint64_t size) {
        DvResumeState *s = &g->resume;
        DvJournalReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_JOURNAL},
                            .action = action,
                            .ordinal = s->ordinal,
                            .rank = g->rank,
                            .world = g->world,
                            .size = size};
        if (dv_tun_or(&g->tun, DV_TUN_RESUME_WRITE_THROUGH, 0))
                req.flags |= DV_JOURNAL_REQ_FILE;
        snprintf(req.key, sizeof(req.key), "%s", s->key);
        snprintf(req.group, sizeof(req.group), "%s", s->group);
        DvReply rep;
        int fds[DV_MAX_FDS], nfds, r;
        if ((r = dv_request(g, &req, sizeof(req), &rep, fds, &nfds)) < 0)
                return r;
        if (rep.status < 0) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                return dv_set_err(g, rep.status, "%.*s", DV_MSG_MAX, rep.msg);
        }
        if (action == DV_JOURNAL_DROP || action == DV_JOURNAL_DROP_STALE)
                return 0;
        if (nfds != 1 || rep.size[0] < sizeof(DvJournalHdr) || rep.size[0] < size) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                return dv_set_err(g, DEVAL_EPROTO, "devald sent a malformed journal");
        }
        void *p = mmap(NULL, rep.size[0], PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
        close(fds[0]);
        if (p == MAP_FAILED)
                return dv_set_err(g, DEVAL_ENOMEM, "cannot map the resume journal: %s",
                                  strerror(errno));
        unmap(s);
        s->base = p;
        s->size = rep.size[0];
        return 0;
}

static DvJournalHdr *hdr(const DvResumeState *s) {
        return (DvJournalHdr *)s->base;
}

/* Make the journal hold no batch, for the pass ident. */
static void journal_start(deval_group *g, uint64_t ident, uint64_t loader) {
        DvJournalHdr *h = hdr(&g->resume);
        atomic_store_explicit(&h->batches, 0, memory_order_release);
        atomic_store_explicit(&h->end, sizeof(*h), memory_order_release);
        g->resume.tail = sizeof(*h);
        h->ident = ident;
        h->loader = loader;
        h->made_s = (uint64_t)time(NULL);
        h->rank = g->rank;
        h->world = g->world;
        h->ordinal = g->resume.ordinal;
        snprintf(h->key, sizeof(h->key), "%s", g->resume.key);
        snprintf(h->group, sizeof(h->group), "%s", g->resume.group);
        h->version = DV_JOURNAL_VERSION;
        h->magic = DV_JOURNAL_MAGIC; /* (read by a later run, or devald's listing) */
}

/* The pass this rank runs, as a journal names it: what it reads and where it stands. */
static uint64_t pass_ident(const deval_group *g, uint64_t loader_digest, uint64_t state_digest) {
        uint64_t v[7] = {loader_digest,
                         state_digest,
                         (uint64_t)g->world,
                         (uint64_t)g->rank,
                         g->resume.ordinal,
                         dv_calls(g),
                         0};
        dv_ident_sizes(g, (int64_t *)&v[5], NULL);
        uint64_t h = dv_journal_hash(DV_JOURNAL_HASH0, v, sizeof(v));
        int64_t keys;
        dv_ident_sizes(g, NULL, &keys);
        h = dv_journal_hash(h, &keys, sizeof(keys));
        return h ? h : 1;
}

/**
 * deval_eval_resume() - in a pass with keys, just begun (deval_eval_begin_keys()), before its
 * first batch: keep what the pass's batches return in a journal devald holds for the job, and
 * answer the batches a run of the same job that stopped (a crash, a kill) already did from
 * its journal. Every rank calls it (one collective, when the job has a resume key: a
 * launcher's job id without its restart count, or $DEVAL_RESUME_KEY). The pass's first K
 * batches, K returned, each after deval_eval_batch_keys() and deval_eval_batch_digest(), get
 * every collective answered from the journal (checked against the call kept there), with no
 * collective and whatever the inputs hold; run the loop body on a batch of one padding
 * sample for them, as for a replay. A journal of another pass (another loader_digest:
 * dataset, order, first batch; another state_digest; another world, or another number of
 * collectives before the pass) is dropped and the pass starts over: note says so. A journal
 * of another of the group's passes over the same loader_digest is dropped too: the job has
 * evaluated that loader again since (a training job restarted from a checkpoint).
 * @loader_digest: the caller's digest of what the pass reads (its first batch at least).
 * @state_digest: the caller's digest of where the job stands (its random generators' state).
 * @note: (may be NULL) what happened, for the user: empty when nothing was kept.
 * Return: K >= 0; DEVAL_EINVAL (no pass with keys just begun); the collective's failures.
 * Returns 0 without a collective where no journal is kept: a device or spanning group, a
 * job with no resume key, resume not asked for ($DEVAL_RESUME=1, or $DEVAL_RESUME_KEY).
 */
int64_t deval_eval_resume(deval_group *g, uint64_t loader_digest, uint64_t state_digest, char *note,
                          size_t note_len) {
        const char *fn = "deval_eval_resume";
        if (!g)
                return DEVAL_EINVAL;
        if (note && note_len)
                note[0] = '\0';
        DvResumeState *s = &g->resume;
        if (!g->ident || g->batch_no || s->base || s->kept)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: call it once per pass with keys, after "
                                  "deval_eval_begin_keys() and before its first batch",
                                  fn);
        if (g->span || g->device >= 0 || !s->key[0])
                return 0;

        uint64_t ident = pass_ident(g, loader_digest, state_digest);
        int64_t mine = 0, other = 0;
        uint64_t end = sizeof(DvJournalHdr), made = 0;
        /* a journal of another pass of the group over this loader is of an evaluation this
         * run has made again (a training job restarted from a checkpoint evaluates the same
         * loader after each epoch): its model may be older than the one this pass will have */
        int r = journal_request(g, DV_JOURNAL_DROP_STALE, loader_digest);
        if (r == 0)
                r = journal_request(g, DV_JOURNAL_OPEN, 0);
        if (r == 0) {
                DvJournalHdr *h = hdr(s);
                uint64_t n = dv_journal_scan(s->base, s->size, &end, NULL, 0);
                if (h->magic == DV_JOURNAL_MAGIC && h->ident != ident && n)
                        other = 1;
                else if (h->magic == DV_JOURNAL_MAGIC && h->ident == ident)
                        mine = (int64_t)n;
                made = h->magic == DV_JOURNAL_MAGIC ? h->made_s : 0;
        } else {
                other = 2; /* no journal here: none of the ranks resumes */
        }
        int64_t v[2] = {mine, -other};
        deval_tensor t = {.data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1};
        int rr = deval_reduce(g, &t, DEVAL_MIN);
        if (rr < 0)
                return rr;
        int64_t k = v[0], why = -v[1];
        if (r < 0) { /* devald refused (its quota): the pass runs without a journal */
                if (note && note_len)
                        snprintf(note, note_len, "deval: this pass keeps no resume journal: %s",
                                 g->errmsg);
                reset(s);
                return 0;
        }
        if (why || k == 0) {
                journal_start(g, ident, loader_digest);
                s->on = true;
                if (why == 1 && note && note_len)
                        snprintf(note, note_len,
                                 "deval: results kept from an earlier run of this job's pass "
                                 "#%u were of another pass (another dataset, first batch or "
                                 "sampler order, seed or random state, world size, or other "
                                 "collectives before it), so the pass starts over",
                                 s->ordinal);
                return 0;
        }
        if (!(s->at = malloc(((size_t)k + 1) * sizeof(*s->at))))
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory", fn);
        dv_journal_scan(s->base, s->size, &end, s->at, (uint64_t)k + 1);
        if (k < mine) /* what this rank kept past K is not every rank's: written again */
                end = s->at[k];
        atomic_store_explicit(&hdr(s)->batches, (uint64_t)k, memory_order_release);
        atomic_store_explicit(&hdr(s)->end, end, memory_order_release);
        s->kept = (uint64_t)k;
        s->tail = end;
        s->on = true;
        if (note && note_len) {
                char when[32] = "";
                time_t t0 = (time_t)made;
                struct tm tm;
                if (made && localtime_r(&t0, &tm))
                        strftime(when, sizeof(when), " (begun %Y-%m-%d %H:%M:%S)", &tm);
                snprintf(note, note_len,
                         "deval: resuming pass #%u of this job at batch %" PRId64 ": its first "
                         "%" PRId64 " batches are answered from the results kept by the run "
                         "that stopped%s; what a rank counted by itself in them (a running "
                         "sum of its own rows) is not, so gather what you count",
                         s->ordinal, k + 1, k, when);
        }
        return k;
}

/* Write the batch being written: its record, then the journal's end and count. */
static void commit(deval_group *g) {
        DvResumeState *s = &g->resume;
        if (!s->writing)
                return;
        s->writing = false;
        if (s->stopped)
                return;
        uint64_t body = s->rec + DV_ALIGN(sizeof(DvJournalBatch), DV_JOURNAL_ALIGN);
        DvJournalBatch b = {
                .size = s->tail - s->rec,
                .digest = s->digest,
                .check = dv_journal_hash(DV_JOURNAL_HASH0, s->base + body, s->tail - body),
                .nsteps = s->nsteps};
        memcpy(s->base + s->rec, &b, sizeof(b));
        DvJournalHdr *h = hdr(s);
        if (h->flags & DV_JOURNAL_SYNC) { /* on disk before it counts */
                uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), from = s->rec / page * page;
                msync(s->base + from, s->tail - from, MS_SYNC);
        }
        atomic_store_explicit(&h->end, s->tail, memory_order_release);
        atomic_fetch_add_explicit(&h->batches, 1, memory_order_release);
        if (h->flags & DV_JOURNAL_SYNC)
                msync(s->base, sizeof(*h), MS_SYNC);
}

/* Room for n more bytes past the tail, asking devald to grow the journal. */
static bool room(deval_group *g, uint64_t n) {
        DvResumeState *s = &g->resume;
        if (s->stopped)
                return false;
        if (n <= s->size - s->tail)
                return true;
        char saved[sizeof(g->errmsg)];
        memcpy(saved, g->errmsg, sizeof(saved));
        if (journal_request(g, DV_JOURNAL_GROW, s->tail + n) < 0) {
                /* the evaluation goes on; only a restart learns this batch is not kept */
                fprintf(stderr,
                        "deval: rank %d: the resume journal of pass #%u stops at batch %u "
                        "(%s); a restart will compute the batches from there again\n",
                        g->rank, s->ordinal, g->batch_no, g->errmsg);
                memcpy(g->errmsg, saved, sizeof(saved));
                s->stopped = true;
                return false;
        }
        return true;
}

/* The collectives among the n steps of the batch record at s->step (a state is not one). */
static uint32_t calls_in(const DvResumeState *s, uint32_t n) {
        uint64_t at = s->step;
        uint32_t calls = 0;
        for (uint32_t i = 0; i < n && at; i++) {
                DvResult r;
                const uint8_t *d;
                uint64_t size;
                if ((at = dv_journal_step(s->base, at, s->rec_end, &r, &d, &size)))
                        calls += r.op != DV_JOURNAL_STATE;
        }
        return calls;
}

/* The answered batch that ends now made fewer calls than the kept one: say so, once. */
static int fewer_calls(deval_group *g, const char *fn, uint32_t batch) {
        uint32_t left = g->resume.steps_left;
        g->resume.steps_left = 0;
        return dv_set_err(g, DEVAL_EMISMATCH,
                          "%s: batch %u, answered from the resume journal, made %u fewer calls "
                          "than the run that kept it; the loop body must make the same calls "
                          "whatever its batch holds (here one padding sample), or the job "
                          "cannot resume: DEVAL_RESUME=0",
                          fn, batch, left);
}

int dv_resume_batch(deval_group *g, const char *fn) {
        DvResumeState *s = &g->resume;
        if (!s->on)
                return 0;
        if (s->steps_left)
                return fewer_calls(g, fn, g->batch_no - 1);
        commit(g);
        s->digest = 0;
        if (g->batch_no <= s->kept) {
                DvJournalBatch b;
                uint64_t at = s->at[g->batch_no - 1];
                memcpy(&b, s->base + at, sizeof(b));
                s->step = at + DV_ALIGN(sizeof(b), DV_JOURNAL_ALIGN);
                s->rec_end = at + b.size;
                s->steps_left = calls_in(s, b.nsteps);
                s->digest = b.digest;
                return 0;
        }
        uint64_t head = DV_ALIGN(sizeof(DvJournalBatch), DV_JOURNAL_ALIGN);
        if (!room(g, head))
                return 0;
        s->writing = true;
        s->rec = s->tail;
        s->tail += head;
        s->nsteps = 0;
        return 0;
}

/**
 * deval_eval_batch_digest() - the caller's digest of the batch just declared (its dataset
 * indices and data): kept with the batch's results; for a batch answered from the resume
 * journal (deval_eval_resume()), checked against the kept one.
 * Return: 0; DEVAL_EMISMATCH when the batch is not the one the kept run had there (the
 * journal is then dropped, so that the job started again begins the pass anew);
 * DEVAL_EINVAL when g is NULL.
 */
int deval_eval_batch_digest(deval_group *g, uint64_t digest) {
        if (!g)
                return DEVAL_EINVAL;
        DvResumeState *s = &g->resume;
        if (!s->on || !g->batch || g->replay.on)
                return 0;
        if (g->batch_no > s->kept) {
                s->digest = digest;
                return 0;
        }
        if (digest == s->digest)
                return 0;
        uint32_t batch = g->batch_no;
        journal_request(g, DV_JOURNAL_DROP, 0);
        reset(s);
        return dv_set_err(g, DEVAL_EMISMATCH,
                          "deval_eval_batch_digest: batch %u of this rank's loader is not the "
                          "one the run that stopped had there (its dataset indices or data "
                          "differ): the loader changed since. The kept results are dropped; "
                          "run the job again to start the pass over",
                          batch);
}

/**
 * deval_eval_journaled() - does the pass keep a resume journal (deval_eval_resume() made
 * one, and it has not stopped)? Batch digests and states are kept only then.
 * Return: 1 or 0; DEVAL_EINVAL when g is NULL.
 */
int deval_eval_journaled(const deval_group *g) {
        if (!g)
                return DEVAL_EINVAL;
        return g->resume.on && !g->resume.stopped;
}

bool dv_resume_answers(const deval_group *g) {
        const DvResumeState *s = &g->resume;
        return s->kept && g->batch && g->batch_no >= 1 && g->batch_no <= s->kept && !g->replay.on;
}

int dv_resume_take(deval_group *g, const char *fn, const DvRequest *q, const DvResult **ret) {
        DvResumeState *s = &g->resume;
        const uint8_t *data;
        uint64_t data_size;
        int r;

        if (!s->steps_left)
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "%s: batch %u, answered from the resume journal, calls more "
                                  "than the run that kept it did; the loop body must make the "
                                  "same calls whatever its batch holds (here one padding "
                                  "sample), or the job cannot resume: DEVAL_RESUME=0",
                                  fn, g->batch_no);
        uint64_t next;
        do { /* (a state the caller kept is not a call) */
                next = dv_journal_step(s->base, s->step, s->rec_end, &s->res, &data, &data_size);
                if (!next)
                        return dv_set_err(g, DEVAL_EPROTO, "%s: the resume journal is malformed",
                                          fn);
                if (s->res.op == DV_JOURNAL_STATE)
                        s->step = next;
        } while (s->res.op == DV_JOURNAL_STATE);
        if ((r = dv_kept_match(g, fn, "in a batch answered from the resume journal",
                               "the run that stopped", q, &s->res)) < 0)
                return r;
        s->step = next;
        s->steps_left--;
        g->view = data;
        g->view_size = data_size;
        *ret = &s->res;
        return 0;
}

/* Append a step to the batch being written: res, its data at base + each offset (base holds
 * size bytes). Return: false when it cannot be kept (the journal then ends before it). */
static bool append(deval_group *g, const DvResult *res, const uint8_t *base, uint64_t size_in) {
        DvResumeState *s = &g->resume;
        uint32_t n = res->ntensors;
        uint64_t head = DV_ALIGN(DV_JOURNAL_STEP_HEAD(n), DV_JOURNAL_ALIGN), data = 0;
        for (uint32_t i = 0; i < n; i++) {
                const DvTensorDesc *t = &res->t[i];
                if (t->nbytes && (t->offset > size_in || t->nbytes > size_in - t->offset))
                        return false; /* (its reader refused it already) */
                data = DV_ALIGN(data, DV_ARENA_ALIGN) + t->nbytes;
        }
        uint64_t size = head + DV_ALIGN(data, DV_JOURNAL_ALIGN);
        if (!room(g, size))
                return true; /* (stopped, and said) */
        uint8_t *at = s->base + s->tail;
        DvJournalStep st = {.size = size, .data = head};
        DvResult r;
        memcpy(&r, res, offsetof(DvResult, t) + n * sizeof(DvTensorDesc));
        uint64_t off = 0;
        for (uint32_t i = 0; i < n; i++) {
                off = DV_ALIGN(off, DV_ARENA_ALIGN);
                if (r.t[i].nbytes)
                        memcpy(at + head + off, base + r.t[i].offset, r.t[i].nbytes);
                r.t[i].offset = off;
                off += r.t[i].nbytes;
        }
        memcpy(at, &st, sizeof(st));
        memcpy(at + sizeof(st), &r, offsetof(DvResult, t) + n * sizeof(DvTensorDesc));
        memset(at + DV_JOURNAL_STEP_HEAD(n), 0, head - DV_JOURNAL_STEP_HEAD(n));
        s->tail += size;
        s->nsteps++;
        return true;
}

void dv_resume_keep(deval_group *g, const DvResult *res) {
        DvResumeState *s = &g->resume;
        if (!s->writing || s->stopped)
                return;
        /* a failed call: the batch is not whole, and the journal ends before it */
        if (!res || res->status != 0 || res->ntensors > DEVAL_MAX_TENSORS ||
            !append(g, res, g->view, g->view_size))
                s->stopped = true;
}

/**
 * deval_eval_batch_state() - keep len bytes of the caller's own with the batch being written
 * to the resume journal: what its process holds at the end of the batch's body (its random
 * number generators' state, say), for a later run to take back with deval_eval_kept_state().
 * Return: 1 when kept; 0 when the pass keeps no journal, or not this batch (one answered
 * from it); DEVAL_EINVAL (g NULL, data NULL with len > 0).
 */
int deval_eval_batch_state(deval_group *g, const void *data, size_t len) {
        if (!g || (!data && len))
                return DEVAL_EINVAL;
        DvResumeState *s = &g->resume;
        if (!s->writing || s->stopped || !g->batch)
                return 0;
        DvResult r = {.ntensors = 1, .op = DV_JOURNAL_STATE};
        r.t[0] = (DvTensorDesc){
                .dtype = DEVAL_U8, .ndim = 1, .shape = {(int64_t)len}, .nbytes = len};
        return append(g, &r, data, len) && !s->stopped;
}

/**
 * deval_eval_kept_state() - in a batch answered from the resume journal: the bytes the run
 * that stopped kept with deval_eval_batch_state() at the end of this batch, or of the latest
 * batch before it that kept any. Valid until the pass ends.
 * Return: 1 with *data and *len; 0 when it kept none up to this batch, or this batch is not
 * answered from the journal; DEVAL_EINVAL (an argument NULL).
 */
int deval_eval_kept_state(deval_group *g, const void **data, size_t *len) {
        if (!g || !data || !len)
                return DEVAL_EINVAL;
        DvResumeState *s = &g->resume;
        if (!dv_resume_answers(g))
                return 0;
        for (; s->state_scanned < g->batch_no; s->state_scanned++) {
                uint64_t at = s->at[s->state_scanned];
                DvJournalBatch b;
                memcpy(&b, s->base + at, sizeof(b));
                uint64_t step = at + DV_ALIGN(sizeof(b), DV_JOURNAL_ALIGN);
                for (uint32_t i = 0; i < b.nsteps; i++) {
                        DvResult r;
                        const uint8_t *d;
                        uint64_t size;
                        step = dv_journal_step(s->base, step, at + b.size, &r, &d, &size);
                        if (!step)
                                break; /* (scanned whole when the pass resumed) */
                        if (r.op == DV_JOURNAL_STATE) {
                                s->state = d + r.t[0].offset;
                                s->state_len = r.t[0].nbytes;
                        }
                }
        }
        if (!s->state)
                return 0;
        *data = s->state;
        *len = s->state_len;
        return 1;
}

int dv_resume_pass_end(deval_group *g, const char *fn, bool whole) {
        DvResumeState *s = &g->resume;
        if (!s->on)
                return 0;
        int r = s->steps_left ? fewer_calls(g, fn, g->batch_no) : 0;
        if (whole)
                commit(g);
        s->writing = false;
        return r;
}

void dv_resume_pass_closed(deval_group *g) {
        DvResumeState *s = &g->resume;
        if (!s->on)
                return;
        char saved[sizeof(g->errmsg)];
        memcpy(saved, g->errmsg, sizeof(saved));
        journal_request(g, DV_JOURNAL_DROP, 0); /* (devald gone: it kept nothing anyway) */
        memcpy(g->errmsg, saved, sizeof(saved));
        reset(s);
}
