/* SPDX-License-Identifier: MIT */
/*
 * ident.c - an eval pass whose samples carry their identity.
 *
 * Counting rows by position is right only while nothing shifts which rows are samples: a
 * batch peeked before the loop, a rank that leaves early, a sampler that deals contiguous
 * chunks, a call with k rows per sample each shift it, and the total still comes out right.
 * In a pass with keys every batch declares its samples' keys (deval_eval_batch_keys(): a
 * dataset index, or a sample's place in the unsharded sampler's draws), and each gather for
 * metrics sends them as one more tensor, ahead of the caller's. devald gathers them like any
 * tensor, in rank order, dropping nothing (the pass asks for DV_IDENT_UNCOUNTED samples), and
 * its plan moves whole samples of k rows each. Here, every rank then orders the samples by
 * key and keeps the first of each key the stream has not returned before, nor any stream in
 * a batch before this one (a call made in some batches only, the last say, has not returned
 * the samples whose repeats pad the last round): the duplicates a sharding adds are dropped,
 * wherever they fell. The close checks that each stream that every batch called returned
 * num_samples distinct keys, and names those missing.
 *
 * Every rank sees the same results in the same order (a parked rank through its replay), so
 * every rank reaches the same verdict on them; a rank whose own input is wrong fails alone,
 * before it sends anything, and the others hear it leave (deval_eval_abandon()).
 */
#define _GNU_SOURCE
#include "ident.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "util.h"

#define ITEM_HDR 16 /* before each object of a pass with keys: its key, its place in its sample */

typedef struct {
        uint64_t *seen; /* [num_keys bits]: keys this stream returned */
        /* [num_keys] each, made at the first sample with rows to compare (same_rows): a hash
         * of each returned sample's exact rows (sign()), and of the padded shape they were
         * hashed in; a stream that compares nothing costs its bits alone */
        uint64_t *sig;
        uint64_t *shp;
        int64_t count;                /* how many */
        int64_t dropped;              /* samples it dropped as repeats of a key it had returned */
        int64_t most;                 /* the most samples one call brought: one round of batches */
        int64_t k[DEVAL_MAX_TENSORS]; /* rows (items) per sample of each tensor; -1: not yet */
        bool used;
} Stream;

typedef struct {
        int64_t key;
        int64_t at;   /* the sample's place in the result (for objects: its first item) */
        uint64_t sig; /* its rows' hash; 0: nothing exact to compare */
        uint64_t shp; /* the padded shape of those rows: another pads them otherwise */
} Entry;

struct DvIdent {
        int64_t num_samples, num_keys;
        bool check_due;
        uint64_t *before; /* [num_keys bits]: keys some stream returned in a batch before */
        int64_t *fresh;   /* keys first returned in this batch, for before at the next */
        size_t nfresh, fresh_cap;
        int64_t *keys; /* the batch's; nkeys < 0: a batch declared without keys */
        int64_t nkeys;
        size_t keys_cap;
        Stream *st; /* [nst]: DV_SITE_STREAM(site, objects), sites.h, made as calls first use them */
        size_t nst;
        Entry *ent;
        size_t ent_cap;
        uint8_t *buf; /* the reordered results, valid until the next call */
        size_t buf_cap;
        deval_bytes *items; /* the call's items, then the result's */
        size_t items_cap;
};

static int grow(deval_group *g, const char *fn, void **p, size_t *cap, size_t need, size_t elem) {
        if (need <= *cap)
                return 0;
        size_t n = DV_MAX(need, 2 * *cap);
        void *q = n <= SIZE_MAX / elem ? realloc(*p, n * elem) : NULL;
        if (!q)
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory for %zu keys", fn, need);
        *p = q;
        *cap = n;
        return 0;
}

/** dv_ident_free() - end g's pass with keys, if any; its results' views go with it. */
void dv_ident_free(deval_group *g) {
        DvIdent *id = g->ident;
        if (!id)
                return;
        for (size_t s = 0; s < id->nst; s++) {
                free(id->st[s].seen);
                free(id->st[s].sig);
                free(id->st[s].shp);
        }
        free(id->st);
        free(id->before);
        free(id->fresh);
        free(id->keys);
        free(id->ent);
        free(id->buf);
        free(id->items);
        free(id);
        g->ident = NULL;
}

/**
 * dv_ident_begin() - g's next pass carries keys in [0, num_keys) and returns num_samples
 * distinct ones from every stream. Return: 0; DEVAL_EINVAL; DEVAL_ENOTSUP on a device group
 * (its results stay on GPUs, where this file cannot reorder them); DEVAL_ENOMEM.
 */
int dv_ident_begin(deval_group *g, const char *fn, int64_t num_samples, int64_t num_keys) {
        dv_ident_free(g);
        if (num_keys < 0 || num_keys >= DV_IDENT_UNCOUNTED || num_samples < 0 ||
            num_samples > num_keys)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: num_samples is %" PRId64 " and num_keys %" PRId64
                                  "; a pass returns at most one sample per key",
                                  fn, num_samples, num_keys);
        if (g->device >= 0)
                return dv_set_err(g, DEVAL_ENOTSUP,
                                  "%s: a device group keeps its results on GPUs; a pass with "
                                  "keys needs a host group",
                                  fn);
        DvIdent *id = calloc(1, sizeof(*id));
        if (!id)
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory", fn);
        id->num_samples = num_samples;
        id->num_keys = num_keys;
        id->nkeys = -1;
        g->ident = id;
        id->before = calloc(DV_MAX((size_t)(num_keys + 63) / 64, (size_t)1), sizeof(uint64_t));
        if (!id->before) {
                dv_ident_free(g);
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory for %" PRId64 " keys", fn,
                                  num_keys);
        }
        return 0;
}

/* deval_eval_batch() in a pass with keys: this batch's samples are not known. */
void dv_ident_batch_unkeyed(deval_group *g) {
        if (g->ident)
                g->ident->nkeys = -1;
}

/**
 * dv_ident_batch() - the current batch holds n samples, keys[0..n). Each key must lie in
 * [0, num_keys). Return: 0; DEVAL_EINVAL; DEVAL_ENOMEM.
 */
int dv_ident_batch(deval_group *g, const char *fn, int64_t n, const int64_t keys[]) {
        DvIdent *id = g->ident;
        if (!id)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: no eval pass with keys is open (deval_eval_begin_keys())",
                                  fn);
        id->nkeys = -1;
        for (size_t j = 0; j < id->nfresh; j++) /* the batch before is over */
                id->before[id->fresh[j] / 64] |= (uint64_t)1 << (id->fresh[j] % 64);
        id->nfresh = 0;
        if (n < 0 || (n > 0 && !keys))
                return dv_set_err(g, DEVAL_EINVAL, "%s: %" PRId64 " keys at %p", fn, n,
                                  (const void *)keys);
        int r = grow(g, fn, (void **)&id->keys, &id->keys_cap, (size_t)DV_MAX(n, 1),
                     sizeof(*id->keys));
        if (r < 0)
                return r;
        for (int64_t j = 0; j < n; j++)
                if (keys[j] < DEVAL_KEY_PAD || keys[j] >= id->num_keys)
                        return dv_set_err(g, DEVAL_EINVAL,
                                          "%s: sample %" PRId64 " of the batch has key %" PRId64
                                          ", outside the pass's 0..%" PRId64 " (or DEVAL_KEY_PAD)",
                                          fn, j, keys[j], id->num_keys - 1);
        if (n)
                memcpy(id->keys, keys, (size_t)n * sizeof(*keys));
        id->nkeys = n;
        return 0;
}

static int batch_keys(deval_group *g, const char *fn) {
        if (g->ident->nkeys < 0)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: in an eval pass with keys, each batch says which samples "
                                  "it holds (deval_eval_batch_keys()) before its gathers",
                                  fn);
        return 0;
}

static int opts_plain(deval_group *g, const char *fn, const deval_gather_opts *o) {
        if (o && (o->valid_rows >= 0 || o->keep_rows >= 0 || o->root >= 0))
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: in an eval pass with keys the keys decide which rows "
                                  "count; valid_rows, keep_rows and root must be unset",
                                  fn);
        return 0;
}

/* A call's rows for the batch's samples: none for none, else a whole number per sample. */
static int whole(deval_group *g, const char *fn, const char *what, int i, int64_t rows, int64_t b) {
        if (b == 0 ? rows == 0 : rows > 0 && rows % b == 0)
                return 0;
        return dv_set_err(g, DEVAL_EINVAL,
                          "%s: %s %d has %" PRId64 " rows for the batch's %" PRId64
                          " samples; each needs a whole number of rows per sample (k rows each, "
                          "as generation with num_return_sequences=k gives). Gather per-sample "
                          "tensors ([batch, ...], padded), not rows flattened across samples",
                          fn, what, i, rows, b);
}

/**
 * dv_ident_call() - the tensors a gather for metrics of a pass with keys sends: call[0] the
 * batch's keys, call[1..n] the caller's in[]. Checks that each holds a whole number of rows
 * per sample of the batch. Return: 0; DEVAL_EINVAL (nothing was sent yet: the call's refusal).
 */
int dv_ident_call(deval_group *g, const char *fn, int n, const deval_tensor in[],
                  const deval_gather_opts *opts, deval_tensor call[]) {
        DvIdent *id = g->ident;
        int r;

        if (n < 1 || n > DEVAL_MAX_TENSORS - 1)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: n is %d, not 1..%d (in a pass with keys the batch's keys "
                                  "travel as one more tensor)",
                                  fn, n, DEVAL_MAX_TENSORS - 1);
        if (!in)
                return dv_set_err(g, DEVAL_EINVAL, "%s: in is NULL", fn);
        if ((r = opts_plain(g, fn, opts)) < 0 || (r = batch_keys(g, fn)) < 0)
                return r;
        for (int i = 0; i < n; i++) {
                int64_t rows = in[i].ndim == 0 ? 1 : in[i].shape[0];
                if ((r = whole(g, fn, "tensor", i, rows, id->nkeys)) < 0)
                        return r;
                call[i + 1] = in[i];
        }
        call[0] = (deval_tensor){.data = id->keys,
                                 .dtype = DEVAL_I64,
                                 .ndim = 1,
                                 .shape = {id->nkeys},
                                 .device = -1};
        return 0;
}

/* Bytes of one row of t (of a 0-d tensor, its one element). */
static uint64_t row_bytes(const deval_tensor *t) {
        uint64_t b = deval_dtype_size(t->dtype);
        for (int d = 1; d < t->ndim; d++)
                b *= (uint64_t)t->shape[d];
        return b;
}

/*
 * msg, said of the tensors a gather of a pass with keys sent (the batch's keys, then the
 * caller's), in the caller's numbering: "tensor 0" is the keys tensor, "tensor i + 1" the
 * caller's tensor i, and a number of tensors is one more than the caller passed.
 */
static void say_callers(char *msg, size_t cap) {
        char out[sizeof(((deval_group *)0)->errmsg)];
        size_t o = 0;
        bool counts = false; /* past "the number of tensors": each "has N" counts the keys */
        for (const char *m = msg; *m && o + 1 < sizeof(out);) {
                bool word = m == msg || !isalnum((unsigned char)m[-1]);
                const char *d = NULL;
                if (word && strncmp(m, "number of tensors", 17) == 0)
                        counts = true;
                if (word && strncmp(m, "tensor ", 7) == 0 && isdigit((unsigned char)m[7]))
                        d = m + 7;
                else if (counts && word && strncmp(m, "has ", 4) == 0 &&
                         isdigit((unsigned char)m[4]))
                        d = m + 4;
                if (!d) {
                        out[o++] = *m++;
                        continue;
                }
                char *end;
                unsigned long k = strtoul(d, &end, 10);
                if (d == m + 7 && k == 0)
                        o += (size_t)snprintf(out + o, sizeof(out) - o, "the keys tensor");
                else
                        o += (size_t)snprintf(out + o, sizeof(out) - o, "%.*s%lu", (int)(d - m), m,
                                              k ? k - 1 : 0);
                o = DV_MIN(o, sizeof(out) - 1);
                m = end;
        }
        out[o] = '\0';
        snprintf(msg, cap, "%s", out);
}

/**
 * dv_ident_explain() - a gather of a pass with keys failed with status r: say its message in
 * the caller's numbering of tensors (the keys travel as one more, first), and when the ranks'
 * plan found rows that are not whole samples, say what it numbered. Return: r.
 */
int dv_ident_explain(deval_group *g, int r) {
        say_callers(g->errmsg, sizeof(g->errmsg));
        size_t len = strlen(g->errmsg);
        if (r == DEVAL_EMISMATCH && strstr(g->errmsg, "rows per sample"))
                snprintf(g->errmsg + len, sizeof(g->errmsg) - len,
                         " (in a pass with keys, the keys tensor, one per sample, numbers the "
                         "batch's samples); rows must be whole samples, the same number per "
                         "sample on every rank: gather per-sample tensors ([batch, ...], padded), "
                         "not rows flattened across samples");
        return r;
}

static int cmp_entry(const void *a, const void *b) {
        const Entry *x = a, *y = b;
        if (x->key != y->key)
                return x->key < y->key ? -1 : 1;
        return x->at < y->at ? -1 : x->at > y->at;
}

static bool seen(const Stream *s, int64_t key) {
        return s->seen[key / 64] >> (key % 64) & 1;
}

static bool returned_before(const DvIdent *id, int64_t key) {
        return id->before[key / 64] >> (key % 64) & 1;
}

/*
 * The stream of a call of the batch (DV_SITE_STREAM()), made the first time a batch makes
 * that many calls: as many calls per batch as memory holds, each its own stream.
 */
static int stream_at(deval_group *g, const char *fn, int stream, Stream **ret) {
        DvIdent *id = g->ident;
        if (stream < 0)
                return dv_set_err(g, DEVAL_EPROTO, "%s: call stream %d", fn, stream);
        if ((size_t)stream >= id->nst) {
                size_t n = DV_MAX((size_t)stream + 1, 2 * id->nst);
                Stream *st = n <= SIZE_MAX / sizeof(*st) ? realloc(id->st, n * sizeof(*st)) : NULL;
                if (!st)
                        return dv_set_err(g, DEVAL_ENOMEM,
                                          "%s: out of memory for call %d of the batch", fn,
                                          stream / 2 + 1);
                memset(st + id->nst, 0, (n - id->nst) * sizeof(*st));
                for (size_t s = id->nst; s < n; s++)
                        for (int i = 0; i < DEVAL_MAX_TENSORS; i++)
                                st[s].k[i] = -1;
                id->st = st;
                id->nst = n;
        }
        Stream *s = &id->st[stream];
        if (!s->seen) {
                size_t words = (size_t)(id->num_keys + 63) / 64;
                s->seen = calloc(DV_MAX(words, (size_t)1), sizeof(uint64_t));
                if (!s->seen)
                        return dv_set_err(g, DEVAL_ENOMEM,
                                          "%s: out of memory for the keys of call %d of the "
                                          "batch",
                                          fn, stream / 2 + 1);
                s->used = true;
        }
        *ret = s;
        return 0;
}

/* The signature arrays of s, for a call with rows to compare. */
static int stream_sigs(deval_group *g, const char *fn, Stream *s) {
        if (s->sig)
                return 0;
        size_t n = (size_t)DV_MAX(g->ident->num_keys, 1);
        s->sig = calloc(n, sizeof(uint64_t));
        s->shp = calloc(n, sizeof(uint64_t));
        if (!s->sig || !s->shp) {
                free(s->sig);
                free(s->shp);
                s->sig = s->shp = NULL;
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory", fn);
        }
        return 0;
}

/*
 * The same sample comes back twice only as a sharding's duplicate, and then the batch's own
 * data in it (labels, ids: deval_gather_opts.same_rows; not a model's output, which another
 * batch may round otherwise) is the same: it is hashed, and a duplicate whose hash differs
 * in the same padded shape means the rows are not the samples the keys say (a collate_fn
 * that reordered the batch, batches yielded out of the order they were drawn in). 0 stands
 * for nothing to compare.
 */
static uint64_t sign(uint64_t h, const uint8_t *p, uint64_t n) {
        for (; n >= 8; n -= 8, p += 8) {
                uint64_t w;
                memcpy(&w, p, 8);
                h = (h ^ w) * 0x100000001b3ull;
                h ^= h >> 29;
        }
        for (; n; n--, p++)
                h = (h ^ *p) * 0x100000001b3ull;
        return h;
}

/* Tensor i of the call repeats exactly for a sample's duplicate (deval_gather_opts). */
static bool exact(uint64_t same_rows, int i) {
        return same_rows >> i & 1;
}

static int differs(deval_group *g, const char *fn, int stream, int64_t key) {
        return dv_set_err(g, DEVAL_EMISMATCH,
                          "%s: call %d of the batch: sample %" PRId64
                          " came back twice with different %s, so the rows are not the "
                          "samples their dataset indices say: a collate_fn that reorders or "
                          "drops a batch's samples, batches yielded out of the order the "
                          "sampler drew them, or ranks that read different datasets (a shard of "
                          "its own on each rank, whose indices collide) hide which sample a row "
                          "is. Keep the sampler's order in each batch, and one dataset",
                          fn, stream / 2 + 1, key,
                          stream % 2 ? "objects" : "rows of the batch's own data");
}

/*
 * Sort the nent samples of a result by key and keep, in id->ent[0..*kept), those whose key
 * this stream has not returned, nor any stream in a batch before; mark them returned. *same:
 * the kept are all of them, in the order they came.
 */
static int select_new(deval_group *g, const char *fn, int stream, size_t nent, size_t *kept,
                      bool *same) {
        DvIdent *id = g->ident;
        Stream *s = &id->st[stream];
        bool sorted = true;
        for (size_t j = 1; j < nent && sorted; j++)
                sorted = id->ent[j - 1].key < id->ent[j].key;
        if (!sorted)
                qsort(id->ent, nent, sizeof(*id->ent), cmp_entry);
        for (size_t j = 0; j < nent && !s->sig; j++) {
                int r = id->ent[j].sig ? stream_sigs(g, fn, s) : 0;
                if (r < 0)
                        return r;
        }
        size_t m = 0, pads = 0;
        for (size_t j = 0; j < nent; j++) {
                int64_t key = id->ent[j].key;
                if (key == DEVAL_KEY_PAD) { /* padding the loader named: never a sample */
                        pads++;
                        continue;
                }
                if (seen(s, key)) { /* an earlier call, or a lower rank of this one, has it */
                        if (s->sig && id->ent[j].sig != s->sig[key] &&
                            id->ent[j].shp == s->shp[key])
                                return differs(g, fn, stream, key);
                        continue;
                }
                if (returned_before(id, key)) /* (a stream some batch did not call) */
                        continue;
                if (id->nfresh == id->fresh_cap) {
                        int r = grow(g, fn, (void **)&id->fresh, &id->fresh_cap, id->nfresh + 1,
                                     sizeof(*id->fresh));
                        if (r < 0)
                                return r;
                }
                id->fresh[id->nfresh++] = key;
                s->seen[key / 64] |= (uint64_t)1 << (key % 64);
                if (s->sig) {
                        s->sig[key] = id->ent[j].sig;
                        s->shp[key] = id->ent[j].shp;
                }
                id->ent[m++] = id->ent[j];
        }
        s->count += (int64_t)m;
        s->dropped += (int64_t)(nent - pads - m);
        s->most = DV_MAX(s->most, (int64_t)nent);
        *kept = m;
        *same = sorted && m == nent;
        /* a sharding repeats samples only to fill its last round of batches */
        if (s->dropped > s->most)
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "%s: call %d of the batch: %" PRId64
                                  " samples so far came back as repeats of a dataset index the "
                                  "pass had returned, more than a sharding pads (one round of "
                                  "batches, %" PRId64 "): the ranks do not read one dataset (a "
                                  "shard or Subset of its own on each rank: give every rank the "
                                  "whole dataset behind a DistributedSampler), or a sampler "
                                  "repeats indices (one process would count every draw: gather "
                                  "such an evaluation without a pass)",
                                  fn, stream / 2 + 1, s->dropped, s->most);
        return 0;
}

static int k_same(deval_group *g, const char *fn, Stream *s, int stream, int i, int64_t k) {
        if (s->k[i] >= 0 && s->k[i] != k)
                return dv_set_err(g, DEVAL_EMISMATCH,
                                  "%s: call %d of the batch: %s %d has %" PRId64
                                  " rows per sample here and had %" PRId64
                                  " in earlier batches; rows must be whole samples (pad "
                                  "per-sample rows to one length instead of flattening them)",
                                  fn, stream / 2 + 1, stream % 2 ? "object list" : "tensor", i, k,
                                  s->k[i]);
        s->k[i] = k;
        return 0;
}

/**
 * dv_ident_result() - out[0..n) from res[0..n], the result of dv_ident_call()'s call in
 * stream: samples in key order, each key at most once over the stream's pass. The views are
 * res's own when nothing moves, else a copy this rank holds until its next call.
 * Return: 0; DEVAL_EMISMATCH (rows per sample that change within the pass); DEVAL_EPROTO (a
 * key no rank could have sent); DEVAL_ENOMEM.
 */
int dv_ident_result(deval_group *g, const char *fn, int stream, int n, const deval_tensor res[],
                    uint64_t same_rows, deval_tensor out[]) {
        DvIdent *id = g->ident;
        Stream *s;
        int r;

        if (res[0].dtype != DEVAL_I64 || res[0].ndim != 1 || (res[0].shape[0] && !res[0].data))
                return dv_set_err(g, DEVAL_EPROTO, "%s: malformed keys in the result", fn);
        int64_t B = res[0].shape[0];
        int64_t k[DEVAL_MAX_TENSORS];
        if ((r = stream_at(g, fn, stream, &s)) < 0)
                return r;
        for (int i = 0; i < n; i++) {
                const deval_tensor *t = &res[i + 1];
                int64_t rows = t->ndim == 0 ? 1 : t->shape[0];
                out[i] = *t;
                if (B == 0 ? rows != 0 : rows % B != 0)
                        return dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
                k[i] = B ? rows / B : 0;
                if (B && (r = k_same(g, fn, s, stream, i, k[i])) < 0)
                        return r;
        }
        if (B == 0)
                return 0;
        if ((r = grow(g, fn, (void **)&id->ent, &id->ent_cap, (size_t)B, sizeof(Entry))) < 0)
                return r;
        const int64_t *keys = res[0].data;
        uint64_t block[DEVAL_MAX_TENSORS];
        bool any_exact = false;
        uint64_t shp = 0xcbf29ce484222325ull; /* the call's padded trailing dims */
        for (int i = 0; i < n; i++) {
                block[i] = row_bytes(&out[i]) * (uint64_t)k[i];
                any_exact |= exact(same_rows, i) && block[i];
                if (exact(same_rows, i))
                        shp = sign(shp, (const uint8_t *)&out[i].shape[1],
                                   (uint64_t)DV_MAX(out[i].ndim - 1, 0) * sizeof(int64_t));
        }
        for (int64_t j = 0; j < B; j++) {
                if (keys[j] < DEVAL_KEY_PAD || keys[j] >= id->num_keys)
                        return dv_set_err(g, DEVAL_EPROTO,
                                          "%s: a rank sent key %" PRId64
                                          ", outside the pass's 0..%" PRId64,
                                          fn, keys[j], id->num_keys - 1);
                uint64_t sig = 0;
                for (int i = 0; any_exact && i < n; i++)
                        if (exact(same_rows, i))
                                sig = sign(sig ? sig : 0xcbf29ce484222325ull,
                                           (const uint8_t *)out[i].data + (uint64_t)j * block[i],
                                           block[i]);
                id->ent[j] = (Entry){.key = keys[j], .at = j, .sig = sig, .shp = shp};
        }
        size_t m;
        bool same;
        if ((r = select_new(g, fn, stream, (size_t)B, &m, &same)) < 0)
                return r;
        if (same)
                return 0;
        /* the kept samples' rows, tensor by tensor, into this rank's buffer */
        uint64_t size = 0, off[DEVAL_MAX_TENSORS];
        for (int i = 0; i < n; i++) {
                off[i] = DV_ALIGN(size, 64);
                size = off[i] + block[i] * m;
        }
        if ((r = grow(g, fn, (void **)&id->buf, &id->buf_cap, (size_t)DV_MAX(size, 1), 1)) < 0)
                return r;
        for (int i = 0; i < n; i++) {
                const uint8_t *src = out[i].data;
                uint8_t *dst = id->buf + off[i];
                for (size_t j = 0; j < m && block[i]; j++)
                        memcpy(dst + j * block[i], src + (uint64_t)id->ent[j].at * block[i],
                               block[i]);
                out[i].data = dst;
                if (out[i].ndim == 0) {
                        out[i].ndim = 1;
                        out[i].shape[0] = 1;
                }
                out[i].shape[0] = k[i] * (int64_t)m;
        }
        return 0;
}

/**
 * dv_ident_items_call() - the items an object gather for metrics of a pass with keys sends:
 * each of the caller's, behind its sample's key and its place in that sample (k items per
 * sample, k whole). *call is this rank's until its next call. Return: 0; DEVAL_EINVAL (nothing
 * was sent); DEVAL_ENOMEM.
 */
int dv_ident_items_call(deval_group *g, const char *fn, size_t n, const deval_bytes items[],
                        const deval_gather_opts *opts, const deval_bytes **call) {
        DvIdent *id = g->ident;
        int r;

        if ((r = opts_plain(g, fn, opts)) < 0 || (r = batch_keys(g, fn)) < 0)
                return r;
        if (n > (size_t)INT64_MAX / ITEM_HDR)
                return dv_set_err(g, DEVAL_EINVAL, "%s: too many items", fn);
        if ((r = whole(g, fn, "the object list", 0, (int64_t)n, id->nkeys)) < 0)
                return r;
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
                if (n && !items)
                        return dv_set_err(g, DEVAL_EINVAL, "%s: items is NULL", fn);
                if (items[i].len > (uint64_t)INT64_MAX / 4 - total - ITEM_HDR)
                        return dv_set_err(g, DEVAL_EINVAL, "%s: the items are too large", fn);
                total += ITEM_HDR + items[i].len;
        }
        if ((r = grow(g, fn, (void **)&id->buf, &id->buf_cap, (size_t)DV_MAX(total, 1), 1)) < 0 ||
            (r = grow(g, fn, (void **)&id->items, &id->items_cap, DV_MAX(n, (size_t)1),
                      sizeof(deval_bytes))) < 0)
                return r;
        int64_t per = n ? (int64_t)n / id->nkeys : 0;
        uint64_t at = 0;
        for (size_t i = 0; i < n; i++) {
                int64_t hdr[2] = {id->keys[(int64_t)i / per], (int64_t)i % per};
                memcpy(id->buf + at, hdr, ITEM_HDR);
                if (items[i].len)
                        memcpy(id->buf + at + ITEM_HDR, items[i].data, items[i].len);
                id->items[i] = (deval_bytes){.data = id->buf + at, .len = ITEM_HDR + items[i].len};
                at += ITEM_HDR + items[i].len;
        }
        *call = id->items;
        return 0;
}

/**
 * dv_ident_items_result() - the caller's items from res[0..n), the result of
 * dv_ident_items_call()'s call in stream: whole samples in key order, each key at most once
 * over the stream's pass, without their headers. *out is this rank's until its next call.
 * Return: as dv_ident_result().
 */
int dv_ident_items_result(deval_group *g, const char *fn, int stream, size_t n,
                          const deval_bytes res[], bool same_rows, size_t *out_n,
                          const deval_bytes **out) {
        DvIdent *id = g->ident;
        Stream *s;
        size_t nent = 0;
        int64_t per = -1;
        int r;

        if ((r = stream_at(g, fn, stream, &s)) < 0 ||
            (r = grow(g, fn, (void **)&id->ent, &id->ent_cap, DV_MAX(n, (size_t)1),
                      sizeof(Entry))) < 0)
                return r;
        /* samples are runs of items whose places count 0, 1, .. per-1 under one key */
        for (size_t i = 0; i < n;) {
                int64_t hdr[2], h2[2];
                if (res[i].len < ITEM_HDR)
                        return dv_set_err(g, DEVAL_EPROTO, "%s: malformed result", fn);
                memcpy(hdr, res[i].data, ITEM_HDR);
                if (hdr[0] < DEVAL_KEY_PAD || hdr[0] >= id->num_keys || hdr[1] != 0)
                        return dv_set_err(g, DEVAL_EPROTO, "%s: malformed keys in the result", fn);
                size_t j = i + 1;
                for (; j < n && res[j].len >= ITEM_HDR; j++) {
                        memcpy(h2, res[j].data, ITEM_HDR);
                        if (h2[1] == 0)
                                break;
                        if (h2[0] != hdr[0] || h2[1] != (int64_t)(j - i))
                                return dv_set_err(g, DEVAL_EPROTO,
                                                  "%s: malformed keys in the result", fn);
                }
                if (per >= 0 && (int64_t)(j - i) != per)
                        return dv_set_err(g, DEVAL_EMISMATCH,
                                          "%s: call %d of the batch's objects: ranks give %" PRId64
                                          " and %zu objects per sample; every rank needs the "
                                          "same number per sample",
                                          fn, stream / 2 + 1, per, j - i);
                per = (int64_t)(j - i);
                uint64_t sig = 0xcbf29ce484222325ull;
                for (size_t q = i; same_rows && q < j; q++) {
                        uint64_t len = res[q].len - ITEM_HDR;
                        sig = sign(sign(sig, (const uint8_t *)&len, 8),
                                   (const uint8_t *)res[q].data + ITEM_HDR, len);
                }
                id->ent[nent++] = (Entry){
                        .key = hdr[0], .at = (int64_t)i, .sig = same_rows ? sig : 0, .shp = 1};
                i = j;
        }
        if (per > 0 && (r = k_same(g, fn, s, stream, 0, per)) < 0)
                return r;
        size_t m;
        bool same;
        if ((r = select_new(g, fn, stream, nent, &m, &same)) < 0)
                return r;
        size_t count = m * (size_t)DV_MAX(per, 0);
        /* the result's items stay where they are; only the list of them is this rank's */
        if ((r = grow(g, fn, (void **)&id->items, &id->items_cap, DV_MAX(count, (size_t)1),
                      sizeof(deval_bytes))) < 0)
                return r;
        deval_bytes *list = id->items;
        size_t at = 0;
        for (size_t e = 0; e < m; e++)
                for (int64_t q = 0; q < per; q++) {
                        const deval_bytes *b = &res[id->ent[e].at + q];
                        list[at++] = (deval_bytes){.data = (const uint8_t *)b->data + ITEM_HDR,
                                                   .len = b->len - ITEM_HDR};
                }
        *out_n = count;
        *out = list;
        return 0;
}

/* The close of a pass whose replay is still to come checks after it (deval_eval_replay_done). */
void dv_ident_check_later(deval_group *g) {
        if (g->ident)
                g->ident->check_due = true;
}

bool dv_ident_check_due(const deval_group *g) {
        return g->ident && g->ident->check_due;
}

/**
 * dv_ident_check() - every stream of the pass that each of this rank's batches called
 * returned num_samples distinct keys (one that some batch did not call, a gather of examples
 * on the first batch, holds only its batches' samples); then the pass with keys is over. Return: 0; DEVAL_EMISMATCH naming the stream and the missing keys.
 */
int dv_ident_check(deval_group *g, const char *fn) {
        DvIdent *id = g->ident;
        int r = 0;

        for (size_t st = 0; id && st < id->nst && r == 0; st++) {
                const Stream *s = &id->st[st];
                if (!s->used || s->count == id->num_samples || !dv_sites_whole(&g->sites, st))
                        continue;
                char missing[160] = "";
                size_t len = 0;
                int64_t shown = 0, absent = id->num_keys - s->count;
                /* which keys are missing is known only when every key is owed */
                for (int64_t key = 0;
                     id->num_samples == id->num_keys && key < id->num_keys && shown < 8; key++) {
                        if (seen(s, key))
                                continue;
                        len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64,
                                                shown ? ", " : "; missing keys ", key);
                        shown++;
                }
                if (shown && absent > shown)
                        snprintf(missing + len, sizeof(missing) - len, " and %" PRId64 " more",
                                 absent - shown);
                r = dv_set_err(g, DEVAL_EMISMATCH,
                               "%s: call %d of each batch (%s) returned %" PRId64
                               " distinct samples of the pass's %" PRId64
                               "%s: a rank's loader did not give every sample it owes (a batch "
                               "skipped that call, or a loader shorter than num_samples says)",
                               fn, (int)(st / 2 + 1), st % 2 ? "objects" : "tensors", s->count,
                               id->num_samples, missing);
        }
        dv_ident_free(g);
        return r;
}

void dv_ident_sizes(const deval_group *g, int64_t *num_samples, int64_t *num_keys) {
        if (num_samples)
                *num_samples = g->ident ? g->ident->num_samples : 0;
        if (num_keys)
                *num_keys = g->ident ? g->ident->num_keys : 0;
}
