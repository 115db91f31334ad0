/* SPDX-License-Identifier: MIT */
/*
 * test-ident.c - eval passes whose samples carry their keys (deval_eval_begin_keys()), and
 * ranks that leave a pass early (deval_eval_abandon()), against a real devald with forked
 * ranks: results in key order with each key once over a stream, whatever the sharding
 * repeated; k rows (objects) per sample kept whole; a rank parked and replaying; the close
 * naming missing keys; rows that are not whole samples refused; a rank that leaves while the
 * others go on failing the pass on every rank; a pass by position that drops more rows past
 * its end than a sampler pads.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <string.h>

#include "harness.h"

static Harness H;

static int setup(void **state) {
        (void)state;
        harness_start(&H, NULL);
        return 0;
}

static int teardown(void **state) {
        (void)state;
        harness_stop(&H);
        return 0;
}

#define N     10
#define WORLD 3
#define CALLS 2

/*
 * DistributedSampler's dealing of a shuffled dataset of N over WORLD ranks: the permutation
 * padded with its own start to 12 draws, rank r taking draws r, r+3, ...; batches of 2. Rank
 * r's batch c holds KEYS[r][c]; keys 7 and 2 come twice (the padding), in the second call.
 */
static const int64_t KEYS[WORLD][CALLS][2] = {{{7, 0}, {8, 4}}, {{2, 5}, {1, 7}}, {{9, 3}, {6, 2}}};

static int rank_keys(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        int64_t seen[N] = {0};
        CHECK_OK(harness_join(h, "keys", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, N, N), g);
        for (int c = 0; c < CALLS; c++) {
                const int64_t *keys = KEYS[rank][c];
                /* a: 3 rows per sample (a generation's k); b: one row of w columns, the
                 * first 2 the sample's, the rest padding (-1): w is 2 + rank in the first call
                 * (4 padded), 2 or 3 in the second (3 padded), where the duplicates come back
                 * padded otherwise than the first time */
                int w = c == 0 ? 2 + rank : 2 + (rank == 0), wmax = c == 0 ? 4 : 3;
                int32_t a[6], b[2][4];
                char text[2][16];
                deval_bytes items[2];
                for (int j = 0; j < 2; j++) {
                        for (int q = 0; q < 3; q++)
                                a[j * 3 + q] = (int32_t)(keys[j] * 10 + q);
                        for (int q = 0; q < w; q++)
                                b[j][q] = q < 2 ? (int32_t)(keys[j] * 100 + q) : -1;
                        snprintf(text[j], sizeof(text[j]), "s%lld", (long long)keys[j]);
                        items[j] = (deval_bytes){text[j], strlen(text[j])};
                }
                int32_t bb[2 * 4];
                for (int j = 0; j < 2; j++)
                        memcpy(bb + j * w, b[j], (size_t)w * sizeof(int32_t));
                deval_tensor in[2] = {
                        {.data = a, .dtype = DEVAL_I32, .ndim = 1, .shape = {6}, .device = -1},
                        {.data = bb, .dtype = DEVAL_I32, .ndim = 2, .shape = {2, w}, .device = -1}};
                deval_tensor out[2];
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.pad_value = -1;
                o.same_rows = 3; /* both are the samples' own data: a duplicate repeats them */
                CHECK_OK(deval_eval_batch_keys(g, 2, keys), g);
                CHECK_OK(deval_gather_for_metrics(g, 2, in, &o, out), g);
                /* the keys this call owes, in order: those not returned before */
                int64_t want[2 * WORLD];
                int m = 0;
                for (int64_t key = 0; key < N; key++) {
                        bool here = false;
                        for (int r = 0; r < world; r++)
                                here |= KEYS[r][c][0] == key || KEYS[r][c][1] == key;
                        if (here && !seen[key])
                                want[m++] = key;
                }
                CHECK(out[0].shape[0] == 3 * m && out[1].shape[0] == m && out[1].shape[1] == wmax,
                      "call %d: %lld and %lld rows for %d samples", c, (long long)out[0].shape[0],
                      (long long)out[1].shape[0], m);
                const int32_t *ra = out[0].data, *rb = out[1].data;
                for (int s = 0; s < m; s++) {
                        int64_t key = want[s];
                        seen[key] = 1;
                        for (int q = 0; q < 3; q++)
                                CHECK(ra[s * 3 + q] == key * 10 + q, "call %d sample %d row %d: %d",
                                      c, s, q, ra[s * 3 + q]);
                        for (int q = 0; q < wmax; q++) {
                                int32_t v = q < 2 ? (int32_t)(key * 100 + q) : -1;
                                CHECK(rb[s * wmax + q] == v, "call %d sample %d col %d: %d, not %d",
                                      c, s, q, rb[s * wmax + q], v);
                        }
                }
                /* (the views above last until this call) */
                size_t on;
                const deval_bytes *oi;
                CHECK_OK(deval_gather_objects_for_metrics(g, 2, items, NULL, &on, &oi), g);
                CHECK(on == (size_t)m, "call %d: %zu objects for %d samples", c, on, m);
                for (int s = 0; s < m; s++) {
                        char w[16];
                        snprintf(w, sizeof(w), "s%lld", (long long)want[s]);
                        CHECK(oi[s].len == strlen(w) && memcmp(oi[s].data, w, oi[s].len) == 0,
                              "call %d object %d", c, s);
                }
        }
        CHECK_OK(deval_eval_complete(g), g);
        /* after the pass, a gather for metrics is a gather again */
        int32_t one = rank;
        deval_tensor t = {.data = &one, .dtype = DEVAL_I32, .ndim = 1, .shape = {1}, .device = -1};
        deval_tensor o1;
        CHECK_OK(deval_gather_for_metrics(g, 1, &t, NULL, &o1), g);
        CHECK(o1.shape[0] == world, "%lld rows after the pass", (long long)o1.shape[0]);
        deval_leave(g);
        return 0;
}

static void test_keys_order_and_duplicates(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, WORLD, rank_keys, NULL, 30), 0);
}

/*
 * Uneven loaders: rank 1 has one batch, rank 0 two. Rank 1 is parked while rank 0 gathers
 * its second, replays it, and both end with all 4 keys; a pass owed 5 names key 4.
 */
static int rank_uneven(const Harness *h, int rank, int world, void *arg) {
        int64_t owed = *(int64_t *)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, owed == 4 ? "uneven" : "missing", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, owed, 5), g);
        static const int64_t keys[2][2][2] = {{{0, 1}, {3, 0}}, {{2, 2}, {0, 0}}};
        int batches = rank == 0 ? 2 : 1;
        int64_t got[8];
        int ngot = 0;
        for (int c = 0; c < batches; c++) {
                int64_t v[2] = {keys[rank][c][0] * 7, keys[rank][c][1] * 7};
                int nk = rank == 1 ? 1 : 2;
                deval_tensor in = {
                        .data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {nk}, .device = -1};
                deval_tensor out;
                CHECK_OK(deval_eval_batch_keys(g, nk, keys[rank][c]), g);
                CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                for (int64_t j = 0; j < out.shape[0]; j++)
                        got[ngot++] = ((int64_t *)out.data)[j];
        }
        int r = deval_eval_complete(g);
        int64_t missed = deval_eval_missed(g);
        CHECK(missed == (rank == 1 ? 1 : 0), "rank %d missed %lld batches", rank,
              (long long)missed);
        for (int64_t b = 0; r == 0 && b < missed; b++) {
                deval_tensor in = {
                        .data = NULL, .dtype = DEVAL_I64, .ndim = 1, .shape = {0}, .device = -1};
                deval_tensor out;
                CHECK_OK(deval_eval_batch_keys(g, 0, NULL), g);
                CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                for (int64_t j = 0; j < out.shape[0]; j++)
                        got[ngot++] = ((int64_t *)out.data)[j];
        }
        if (r == 0 && missed)
                r = deval_eval_replay_done(g);
        if (owed == 5) {
                CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "4 distinct samples") &&
                              strstr(deval_errmsg(g), "missing keys 4"),
                      "the close said %s: %s", deval_strerror(r), deval_errmsg(g));
        } else {
                CHECK(r == 0, "the close: %s", deval_errmsg(g));
        }
        /* 0, 1, 2 in the first call (2 once); 3 in the second (0 again dropped) */
        CHECK(ngot == 4 && got[0] == 0 && got[1] == 7 && got[2] == 14 && got[3] == 21,
              "rank %d got %d values", rank, ngot);
        deval_leave(g);
        return 0;
}

static void test_keys_uneven_and_missing(void **state) {
        (void)state;
        int64_t owed = 4;
        assert_int_equal(harness_run(&H, 2, rank_uneven, &owed, 30), 0);
        owed = 5;
        assert_int_equal(harness_run(&H, 2, rank_uneven, &owed, 30), 0);
}

/*
 * Rank 1's call holds 3 rows for its 2 samples: refused there, before anything is sent, yet
 * it takes its step as a refusal, so rank 0, in the same call, fails with rank 1's words;
 * both leave the pass, and their next collective pairs with each other's.
 */
static int rank_not_whole(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "whole", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, 4, 4), g);
        int64_t keys[2] = {rank, rank + 2}, v[3] = {1, 2, 3};
        deval_tensor in = {
                .data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {rank ? 3 : 2}, .device = -1};
        deval_tensor out;
        CHECK_OK(deval_eval_batch_keys(g, 2, keys), g);
        int r = deval_gather_for_metrics(g, 1, &in, NULL, &out);
        if (rank == 1)
                CHECK(r == DEVAL_EINVAL && strstr(deval_errmsg(g), "3 rows for the batch's 2") &&
                              !strstr(deval_errmsg(g), "refused its own call"),
                      "%s: %s", deval_strerror(r), deval_errmsg(g));
        else
                CHECK(r == DEVAL_EINVAL && strstr(deval_errmsg(g), "rank 1 (pid") &&
                              strstr(deval_errmsg(g), "refused its own call") &&
                              strstr(deval_errmsg(g), "3 rows for the batch's 2"),
                      "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        r = deval_eval_abandon(g);
        CHECK(r == 0 || r == DEVAL_EINVAL, "abandon: %s: %s", deval_strerror(r), deval_errmsg(g));
        int64_t mine = 10 + rank;
        deval_tensor one = {
                .data = &mine, .dtype = DEVAL_I64, .ndim = 1, .shape = {1}, .device = -1};
        CHECK_OK(deval_gather(g, 1, &one, NULL, &out), g);
        CHECK(out.shape[0] == 2 && ((int64_t *)out.data)[0] == 10 && ((int64_t *)out.data)[1] == 11,
              "rank %d: the next gather paired another call", rank);
        deval_leave(g);
        return 0;
}

static void test_rows_not_whole_samples(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_not_whole, NULL, 30), 0);
}

/*
 * The keys travel as one more tensor, first; a failure names the caller's tensors as the
 * caller numbered them: rank 1's second tensor has another dtype (its tensor 1, sent as 2),
 * then rank 1 passes one tensor fewer (1 against 2, sent as 2 against 3).
 */
static int rank_numbered(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "numbered", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, 4, 4), g);
        int64_t keys[2] = {rank, rank + 2}, v[2] = {1, 2};
        double d[2] = {1, 2};
        deval_tensor in[2] = {
                {.data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1},
                {.data = rank ? (void *)d : (void *)v,
                 .dtype = rank ? DEVAL_F64 : DEVAL_I64,
                 .ndim = 1,
                 .shape = {2},
                 .device = -1}};
        deval_tensor out[2];
        CHECK_OK(deval_eval_batch_keys(g, 2, keys), g);
        int r = deval_gather_for_metrics(g, 2, in, NULL, out);
        CHECK(r == DEVAL_EMISMATCH &&
                      strstr(deval_errmsg(g), "on tensor 1's dtype: rank 0 has i64"),
              "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        r = deval_gather_for_metrics(g, rank ? 1 : 2, in, NULL, out);
        CHECK(r == DEVAL_EMISMATCH &&
                      strstr(deval_errmsg(g), "number of tensors: rank 0 has 2, rank 1 has 1"),
              "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        deval_leave(g);
        return 0;
}

static void test_failures_number_the_callers_tensors(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_numbered, NULL, 30), 0);
}

/*
 * A pass by position: rank 2 breaks out of its loop after one batch while ranks 0 and 1 go
 * on. Every rank fails, naming rank 2 and its batch; none returns a result lacking its rows.
 * Ranks that all leave at the same batch end the pass as before.
 */
static int rank_leaves(const Harness *h, int rank, int world, void *arg) {
        bool all = *(bool *)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, all ? "all-leave" : "one-leaves", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin(g, 6, DEVAL_ORDER_STRIDED), g);
        int r = 0;
        for (int c = 0; c < 2 && r == 0; c++) {
                if (c == 1 && (all || rank == 2)) {
                        r = deval_eval_abandon(g);
                        break;
                }
                int64_t v = rank + c * world;
                deval_tensor in = {
                        .data = &v, .dtype = DEVAL_I64, .ndim = 1, .shape = {1}, .device = -1};
                deval_tensor out;
                CHECK_OK(deval_eval_batch(g), g);
                r = deval_gather_for_metrics(g, 1, &in, NULL, &out);
        }
        if (all) {
                CHECK(r == 0, "rank %d: %s", rank, deval_errmsg(g));
        } else {
                if (r == 0 && rank != 2)
                        r = deval_eval_complete(g);
                CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "rank 2 (pid") &&
                              strstr(deval_errmsg(g), "left the eval pass during its batch 1"),
                      "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        }
        deval_leave(g);
        return 0;
}

static void test_rank_leaves_early(void **state) {
        (void)state;
        bool all = false;
        assert_int_equal(harness_run(&H, 3, rank_leaves, &all, 30), 0);
        all = true;
        assert_int_equal(harness_run(&H, 3, rank_leaves, &all, 30), 0);
}

/*
 * A pass by position, two calls per batch without deval_eval_batch(): every call counts as
 * the next samples, so half the rows fall past the end, far more than a sampler pads. The
 * close says so, on every rank, even without deval_eval_complete(). One call per batch with
 * a padded last round closes clean.
 */
static int rank_two_calls(const Harness *h, int rank, int world, void *arg) {
        int calls = *(int *)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, calls == 2 ? "two-calls" : "one-call", rank, world, 10000, &g),
                 NULL);
        CHECK_OK(deval_eval_begin(g, 5, DEVAL_ORDER_STRIDED), g);
        for (int b = 0; b < 3; b++) /* 6 rows for 5 samples: the sampler's padding */
                for (int c = 0; c < calls; c++) {
                        int64_t v = b * world + rank;
                        deval_tensor in = {.data = &v,
                                           .dtype = DEVAL_I64,
                                           .ndim = 1,
                                           .shape = {1},
                                           .device = -1};
                        deval_tensor out;
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                }
        int r = deval_eval_end(g);
        if (calls == 2)
                CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "gathered 12 rows") &&
                              strstr(deval_errmsg(g), "more than any sampler pads"),
                      "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        else
                CHECK(r == 0, "rank %d: %s", rank, deval_errmsg(g));
        deval_leave(g);
        return 0;
}

static void test_rows_past_the_end(void **state) {
        (void)state;
        int calls = 2;
        assert_int_equal(harness_run(&H, 2, rank_two_calls, &calls, 30), 0);
        calls = 1;
        assert_int_equal(harness_run(&H, 2, rank_two_calls, &calls, 30), 0);
}

/*
 * Rows that are not the samples their keys say (a collate_fn reordered rank 1's batch): the
 * duplicate of key 1 comes back with other data. With same_rows on that tensor every rank
 * fails; without it (a model's output, which another batch may round otherwise) the first
 * copy is kept.
 */
static int rank_reordered(const Harness *h, int rank, int world, void *arg) {
        uint64_t same = *(uint64_t *)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, same ? "reordered" : "not-checked", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, 3, 3), g);
        int64_t keys[2][2] = {{0, 1}, {2, 1}};     /* key 1 twice: a sharding's padding */
        int64_t label[2][2] = {{0, 10}, {10, 20}}; /* rank 1's rows swapped: 1 has 2's label */
        deval_tensor in = {
                .data = label[rank], .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1};
        deval_tensor out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.same_rows = same;
        CHECK_OK(deval_eval_batch_keys(g, 2, keys[rank]), g);
        int r = deval_gather_for_metrics(g, 1, &in, &o, &out);
        if (same)
                CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "sample 1 came back twice"),
                      "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        else
                CHECK(r == 0 && out.shape[0] == 3, "rank %d: %s", rank, deval_errmsg(g));
        deval_eval_end(g);
        deval_leave(g);
        return 0;
}

static void test_rows_that_are_not_their_samples(void **state) {
        (void)state;
        uint64_t same = 1;
        assert_int_equal(harness_run(&H, 2, rank_reordered, &same, 30), 0);
        same = 0;
        assert_int_equal(harness_run(&H, 2, rank_reordered, &same, 30), 0);
}

/* Bad arguments: nothing is sent, the pass goes on. */
/*
 * Padding whose original the pass does not hold (the rounds Accelerate's skip_first_batches
 * skipped held it): its key is DEVAL_KEY_PAD, and its rows and objects are in no result, nor
 * counted as samples or as repeats. Keys below DEVAL_KEY_PAD are refused.
 */
static const int64_t PADDED[WORLD][2] = {
        {4, 5}, {6, DEVAL_KEY_PAD}, {DEVAL_KEY_PAD, DEVAL_KEY_PAD}};

static int rank_padding_keys(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "pad-keys", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, 3, N), g);
        int64_t bad[1] = {DEVAL_KEY_PAD - 1};
        CHECK(deval_eval_batch_keys(g, 1, bad) == DEVAL_EINVAL &&
                      strstr(deval_errmsg(g), "or DEVAL_KEY_PAD"),
              "%s", deval_errmsg(g));
        const int64_t *keys = PADDED[rank];
        int32_t v[2];
        char text[2][16];
        deval_bytes items[2];
        for (int j = 0; j < 2; j++) {
                v[j] = keys[j] == DEVAL_KEY_PAD ? 999 : (int32_t)(keys[j] * 10);
                snprintf(text[j], sizeof(text[j]), "s%lld", (long long)keys[j]);
                items[j] = (deval_bytes){text[j], strlen(text[j])};
        }
        deval_tensor in = {.data = v, .dtype = DEVAL_I32, .ndim = 1, .shape = {2}, .device = -1};
        deval_tensor out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.same_rows = 1;
        CHECK_OK(deval_eval_batch_keys(g, 2, keys), g);
        CHECK_OK(deval_gather_for_metrics(g, 1, &in, &o, &out), g);
        const int32_t *r = out.data;
        CHECK(out.shape[0] == 3 && r[0] == 40 && r[1] == 50 && r[2] == 60, "%lld rows: %d %d %d",
              (long long)out.shape[0], r[0], out.shape[0] > 1 ? r[1] : -1,
              out.shape[0] > 2 ? r[2] : -1);
        size_t on;
        const deval_bytes *oi;
        CHECK_OK(deval_gather_objects_for_metrics(g, 2, items, NULL, &on, &oi), g);
        CHECK(on == 3 && oi[0].len == 2 && memcmp(oi[0].data, "s4", 2) == 0 &&
                      memcmp(oi[2].data, "s6", 2) == 0,
              "%zu objects", on);
        CHECK_OK(deval_eval_complete(g), g);
        deval_leave(g);
        return 0;
}

static void test_padding_keys_are_dropped(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, WORLD, rank_padding_keys, NULL, 30), 0);
}

/* A call's result out in batch b (from 0): want rows, first, first + 1, ... in turn. */
static int rows_from(const char *what, int b, const deval_tensor *out, int64_t want,
                     int64_t first) {
        const int64_t *got = out->data;
        CHECK(out->shape[0] == want, "%s, batch %d: %lld rows, not %lld", what, b + 1,
              (long long)out->shape[0], (long long)want);
        for (int64_t j = 0; j < want; j++)
                CHECK(got[j] == first + j, "%s, batch %d row %lld: %lld", what, b + 1, (long long)j,
                      (long long)got[j]);
        return 0;
}

/* Rank rank's two rows of batch b (from 0), strided: the pass's (2b + j)*world + rank. */
static deval_tensor strided_rows(int64_t v[2], int b, int world, int rank) {
        v[0] = 2 * b * world + rank;
        v[1] = (2 * b + 1) * world + rank;
        return (deval_tensor){.data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1};
}

/*
 * More calls per batch than the counted sites (DV_PASS_SITES, 16), tensors and objects alike:
 * in a pass with keys each call is its own stream, returns each key once in key order, and
 * the close finds every call complete; a pass by position refuses call 17 on every rank
 * without valid_rows, and with them returns what the counted calls of the batch returned.
 */
#define MANY 40

static int rank_many_calls(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        int64_t seen[MANY][N] = {{0}};
        CHECK_OK(harness_join(h, "many-calls", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, N, N), g);
        for (int c = 0; c < CALLS; c++) {
                const int64_t *keys = KEYS[rank][c];
                CHECK_OK(deval_eval_batch_keys(g, 2, keys), g);
                for (int call = 0; call < MANY; call++) {
                        int64_t v[2] = {keys[0] * 1000 + call, keys[1] * 1000 + call};
                        deval_tensor in = {.data = v,
                                           .dtype = DEVAL_I64,
                                           .ndim = 1,
                                           .shape = {2},
                                           .device = -1};
                        deval_tensor out;
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                        const int64_t *got = out.data;
                        for (int64_t j = 0; j < out.shape[0]; j++) {
                                int64_t key = got[j] / 1000;
                                CHECK(got[j] % 1000 == call && key >= 0 && key < N &&
                                              !seen[call][key] && (j == 0 || got[j - 1] < got[j]),
                                      "batch %d call %d row %lld: %lld", c, call, (long long)j,
                                      (long long)got[j]);
                                seen[call][key] = 1;
                        }
                        char text[24];
                        snprintf(text, sizeof(text), "%d:%lld", call, (long long)keys[0]);
                        deval_bytes items[2] = {{text, strlen(text)}, {text, strlen(text)}};
                        size_t on;
                        const deval_bytes *oi;
                        CHECK_OK(deval_gather_objects_for_metrics(g, 2, items, NULL, &on, &oi), g);
                }
        }
        CHECK_OK(deval_eval_complete(g), g);
        for (int call = 0; call < MANY; call++)
                for (int key = 0; key < N; key++)
                        CHECK(seen[call][key], "call %d never returned key %d", call, key);
        /* by position, 3 batches of 2 rows a rank, 6*world - 1 samples in each order (the
         * last rank's last row padding): the calls past the 16 counted start where call 0 of
         * every batch before says, and are cut as it is; in the last batch, every other one
         * says valid_rows too */
        for (int order = DEVAL_ORDER_RANK; order <= DEVAL_ORDER_STRIDED; order++) {
                int64_t n = 6 * world - 1;
                CHECK_OK(deval_eval_begin(g, n, order), g);
                for (int b = 0; b < 3; b++) {
                        CHECK_OK(deval_eval_batch(g), g);
                        int64_t v[2];
                        deval_tensor in = strided_rows(v, b, world, rank);
                        if (order == DEVAL_ORDER_RANK) /* (each row's place in the pass) */
                                for (int j = 0; j < 2; j++)
                                        v[j] = 2 * b * world + 2 * rank + j;
                        for (int call = 0; call < DEVAL_PASS_SITES + 4; call++) {
                                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                                if (b == 2 && call >= DEVAL_PASS_SITES && call % 2)
                                        o.valid_rows = rank == world - 1 ? 1 : 2;
                                deval_tensor out;
                                char what[32];
                                snprintf(what, sizeof(what), "order %d call %d", order, call + 1);
                                CHECK_OK(deval_gather_for_metrics(g, 1, &in, &o, &out), g);
                                if (rows_from(what, b, &out, b == 2 ? 2 * world - 1 : 2 * world,
                                              2 * b * world))
                                        return 1;
                        }
                }
                CHECK_OK(deval_eval_complete(g), g);
        }
        deval_leave(g);
        return 0;
}

static void test_many_calls_per_batch(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, WORLD, rank_many_calls, NULL, 60), 0);
}

/*
 * A call made in some batches only, by position (strided, 3 batches of 2 rows a rank, the
 * last rank's last row padding): call A in batches 1 and 3, call B in all three, each at the
 * site the binding names (dv_site_next(), as the Python binding names them by the user's
 * code). B is counted and checked; A, skipped in batch 2, is counted nowhere from batch 3 on:
 * there it starts where B says batch 3 starts, and is cut as B; the close checks B alone and
 * passes. Where no site was called in every batch before, A is refused without valid_rows,
 * then returns the real rows said.
 */
int dv_site_next(deval_group *g, int objects, int64_t site); /* (libdeval.sym's private) */

static int rank_partial_site(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "partial-site", rank, world, 10000, &g), NULL);
        int64_t n = 6 * world - 1, b_next = 0;
        CHECK_OK(deval_eval_begin(g, n, DEVAL_ORDER_STRIDED), g);
        for (int b = 0; b < 3; b++) {
                CHECK_OK(deval_eval_batch(g), g);
                int64_t v[2];
                deval_tensor in = strided_rows(v, b, world, rank), out;
                if (b != 1) { /* call A */
                        CHECK_OK(dv_site_next(g, 0, 0), g);
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                        if (rows_from("A", b, &out, b == 2 ? 2 * world - 1 : 2 * world,
                                      2 * b * world))
                                return 1;
                }
                CHECK_OK(dv_site_next(g, 0, 1), g); /* call B */
                CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                const int64_t *got = out.data;
                for (int64_t j = 0; j < out.shape[0]; j++, b_next++)
                        CHECK(got[j] == b_next, "B, batch %d row %lld: %lld", b + 1, (long long)j,
                              (long long)got[j]);
        }
        CHECK(b_next == n, "B returned %lld rows of %lld", (long long)b_next, (long long)n);
        CHECK_OK(deval_eval_complete(g), g);
        /* no site called in every batch before batch 3 (A in 1 and 3, B in 2): nothing says
         * where batch 3 starts, so A there is refused without valid_rows, on every rank */
        CHECK_OK(deval_eval_begin(g, n, DEVAL_ORDER_STRIDED), g);
        for (int b = 0; b < 3; b++) {
                CHECK_OK(deval_eval_batch(g), g);
                int64_t v[2];
                deval_tensor in = strided_rows(v, b, world, rank), out;
                CHECK_OK(dv_site_next(g, 0, b == 1), g);
                if (b < 2) {
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                        continue;
                }
                CHECK(deval_gather_for_metrics(g, 1, &in, NULL, &out) == DEVAL_EINVAL &&
                              strstr(deval_errmsg(g), "call 1 of batch 3") &&
                              strstr(deval_errmsg(g), "valid_rows"),
                      "A, batch 3: %s", deval_errmsg(g));
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.valid_rows = rank == world - 1 ? 1 : 2;
                CHECK_OK(dv_site_next(g, 0, 0), g);
                CHECK_OK(deval_gather_for_metrics(g, 1, &in, &o, &out), g);
                if (rows_from("A", b, &out, 2 * world - 1, 4 * world))
                        return 1;
        }
        CHECK_OK(deval_eval_end(g), g);
        deval_leave(g);
        return 0;
}

static void test_a_call_some_batches_skip(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, WORLD, rank_partial_site, NULL, 30), 0);
}

/*
 * A call first made at the last batch of a pass with keys (examples logged there): KEYS'
 * batch 2 repeats keys 7 and 2 of batch 1 as padding, which that call has not returned but
 * the pass has, in a batch before: it returns the batch's 4 new samples alone, in key order,
 * and the close, which checks the call made in both batches, passes.
 */
static int rank_late_site(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "late-site", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, N, N), g);
        int64_t every = 0;
        for (int c = 0; c < CALLS; c++) {
                const int64_t *keys = KEYS[rank][c];
                CHECK_OK(deval_eval_batch_keys(g, 2, keys), g);
                int64_t v[2] = {keys[0], keys[1]};
                deval_tensor in = {
                        .data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1};
                deval_tensor out;
                if (c == CALLS - 1) {
                        CHECK_OK(dv_site_next(g, 0, 1), g);
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                        const int64_t want[4] = {1, 4, 6, 8}, *got = out.data;
                        CHECK(out.shape[0] == 4 && !memcmp(got, want, sizeof(want)),
                              "the last batch's own call: %lld rows, first %lld",
                              (long long)out.shape[0], (long long)got[0]);
                }
                CHECK_OK(dv_site_next(g, 0, 0), g);
                CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
                every += out.shape[0];
        }
        CHECK(every == N, "the call of every batch returned %lld", (long long)every);
        CHECK_OK(deval_eval_complete(g), g);
        deval_leave(g);
        return 0;
}

static void test_a_call_of_the_last_batch_only(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, WORLD, rank_late_site, NULL, 30), 0);
}

static int rank_bad_args(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "bad-keys", rank, world, 10000, &g), NULL);
        int64_t keys[2] = {0, 9};
        CHECK(deval_eval_batch_keys(g, 1, keys) == DEVAL_EINVAL, "keys without a pass");
        CHECK(deval_eval_begin_keys(g, 5, 4) == DEVAL_EINVAL, "num_samples > num_keys");
        CHECK_OK(deval_eval_begin_keys(g, 4, 4), g);
        CHECK(deval_eval_batch_keys(g, 2, keys) == DEVAL_EINVAL &&
                      strstr(deval_errmsg(g), "key 9, outside the pass's 0..3"),
              "%s", deval_errmsg(g));
        int64_t v = 1;
        deval_tensor in = {.data = &v, .dtype = DEVAL_I64, .ndim = 1, .shape = {1}, .device = -1};
        deval_tensor out;
        CHECK_OK(deval_eval_batch(g), g);
        CHECK(deval_gather_for_metrics(g, 1, &in, NULL, &out) == DEVAL_EINVAL &&
                      strstr(deval_errmsg(g), "deval_eval_batch_keys"),
              "%s", deval_errmsg(g));
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.keep_rows = 1;
        keys[0] = rank;
        CHECK_OK(deval_eval_batch_keys(g, 1, keys), g);
        CHECK(deval_gather_for_metrics(g, 1, &in, &o, &out) == DEVAL_EINVAL &&
                      strstr(deval_errmsg(g), "keep_rows"),
              "%s", deval_errmsg(g));
        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
        CHECK(out.shape[0] == world, "%lld rows", (long long)out.shape[0]);
        CHECK_OK(deval_eval_end(g), g);
        deval_leave(g);
        return 0;
}

static void test_bad_arguments(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_bad_args, NULL, 30), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_keys_order_and_duplicates),
                cmocka_unit_test(test_keys_uneven_and_missing),
                cmocka_unit_test(test_rows_not_whole_samples),
                cmocka_unit_test(test_failures_number_the_callers_tensors),
                cmocka_unit_test(test_rank_leaves_early),
                cmocka_unit_test(test_rows_past_the_end),
                cmocka_unit_test(test_rows_that_are_not_their_samples),
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_padding_keys_are_dropped),
                cmocka_unit_test(test_many_calls_per_batch),
                cmocka_unit_test(test_a_call_some_batches_skip),
                cmocka_unit_test(test_a_call_of_the_last_batch_only),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
