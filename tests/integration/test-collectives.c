/* SPDX-License-Identifier: MIT */
/*
 * test-collectives.c - every collective of the API against a real devald with forked ranks:
 * ragged gathers in both orders with padding, valid_rows, keep_rows, root and several
 * tensors per sample, for every dtype; 0-d and 0-row inputs; arena growth; objects; every
 * reduce op; broadcasts; barriers; pad_across_processes; independent groups at once; gathers
 * the ranks write straight into the result, and the steps they hand back unrun.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "handle.h"
#include "harness.h"
#include "util.h"

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

/* The value every test writes at element e of rank r's tensor, as a double. */
static double val(int r, int64_t row, int64_t col) {
        return (double)(r * 1000 + row * 10 + col);
}

typedef struct {
        int dtype;
        int order;
        int pad_first;
        int64_t keep_rows;
        int valid_tail; /* rank r keeps rows - (valid_tail ? r % 2 : 0) */
        int root;
} GatherArgs;

/* rank r: rows = r + 1 (rank 2 has 0), cols = 2 + r, element (row, col) = val(r, row, col) */
static int64_t rows_of(int r) {
        return r == 2 ? 0 : r + 1;
}

static int rank_gather(const Harness *h, int rank, int world, void *arg) {
        const GatherArgs *a = arg;
        deval_group *g;
        size_t es = dv_dtype_size(a->dtype);
        CHECK_OK(harness_join(h, "gather", rank, world, 10000, &g), NULL);

        int64_t rows = rows_of(rank), cols = 2 + rank;
        uint8_t *x = malloc((size_t)(rows * cols) * es + 1);
        for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                        dv_dtype_encode(a->dtype, val(rank, i, j), x + (i * cols + j) * es);
        deval_tensor in = {
                .data = x, .dtype = a->dtype, .ndim = 2, .shape = {rows, cols}, .device = -1};
        deval_tensor out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.pad_value = -1;
        o.order = a->order;
        o.pad_first = a->pad_first;
        o.keep_rows = a->keep_rows;
        o.valid_rows = a->valid_tail ? rows - rank % 2 : -1;
        if (o.valid_rows < -1)
                o.valid_rows = 0;
        o.root = a->root;
        CHECK_OK(deval_gather(g, 1, &in, &o, &out), g);

        /* expected: the samples in order, each padded to the widest row */
        int64_t maxc = 1 + world, want_rows = 0;
        int pr[64];
        int64_t prow[64];
        int64_t have[8];
        for (int r = 0; r < world; r++) {
                have[r] = rows_of(r);
                if (a->valid_tail && have[r] - r % 2 < have[r])
                        have[r] = have[r] - r % 2 < 0 ? 0 : have[r] - r % 2;
        }
        if (a->order == DEVAL_ORDER_RANK) {
                for (int r = 0; r < world; r++)
                        for (int64_t i = 0; i < have[r]; i++) {
                                pr[want_rows] = r;
                                prow[want_rows++] = i;
                        }
        } else {
                for (int64_t i = 0; i < 8; i++)
                        for (int r = 0; r < world; r++)
                                if (i < have[r]) {
                                        pr[want_rows] = r;
                                        prow[want_rows++] = i;
                                }
        }
        if (a->keep_rows >= 0 && a->keep_rows < want_rows)
                want_rows = a->keep_rows;
        if (a->root >= 0 && rank != a->root) {
                CHECK(out.shape[0] == 0 && out.data == NULL, "non-root got %lld rows",
                      (long long)out.shape[0]);
                deval_leave(g);
                free(x);
                return 0;
        }
        CHECK(out.dtype == a->dtype && out.ndim == 2, "dtype %d ndim %d", out.dtype, out.ndim);
        CHECK(out.shape[0] == want_rows && out.shape[1] == maxc, "shape %lld x %lld",
              (long long)out.shape[0], (long long)out.shape[1]);
        uint8_t want[8];
        for (int64_t k = 0; k < want_rows; k++) {
                int r = pr[k];
                int64_t c = 2 + r, pad = maxc - c;
                for (int64_t j = 0; j < maxc; j++) {
                        int64_t sj = a->pad_first ? j - pad : j;
                        double v = sj >= 0 && sj < c ? val(r, prow[k], sj) : -1.0;
                        dv_dtype_encode(a->dtype, v, want);
                        CHECK(memcmp((uint8_t *)out.data + (k * maxc + j) * (int64_t)es, want,
                                     es) == 0,
                              "row %lld col %lld (rank %d) differs", (long long)k, (long long)j, r);
                }
        }
        free(x);
        CHECK_OK(deval_leave(g), NULL);
        return 0;
}

static void test_gather_every_dtype(void **state) {
        (void)state;
        for (int dt = DEVAL_BOOL; dt <= DEVAL_F64; dt++) {
                GatherArgs a = {.dtype = dt, .keep_rows = -1, .root = -1};
                /* bool cannot hold the test values; it checks truthiness only */
                assert_int_equal(harness_run(&H, 4, rank_gather, &a, 20), 0);
        }
}

static void test_gather_options(void **state) {
        (void)state;
        GatherArgs cases[] = {
                {.dtype = DEVAL_F32, .order = DEVAL_ORDER_STRIDED, .keep_rows = -1, .root = -1},
                {.dtype = DEVAL_I64, .pad_first = 1, .keep_rows = -1, .root = -1},
                {.dtype = DEVAL_I32, .keep_rows = 3, .root = -1},
                {.dtype = DEVAL_I32, .order = DEVAL_ORDER_STRIDED, .keep_rows = 4, .root = -1},
                {.dtype = DEVAL_F64, .valid_tail = 1, .keep_rows = -1, .root = -1},
                {.dtype = DEVAL_F64,
                 .order = DEVAL_ORDER_STRIDED,
                 .valid_tail = 1,
                 .keep_rows = -1,
                 .root = -1},
                {.dtype = DEVAL_F16, .keep_rows = -1, .root = 1},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                for (int world = 1; world <= 5; world += 2)
                        if (cases[i].root < world)
                                assert_int_equal(harness_run(&H, world, rank_gather, &cases[i], 20),
                                                 0);
        }
}

/* Generation with num_return_sequences=3: tensor 1 has 3 rows per sample, ragged in length;
 * the last rank drops its duplicate last sample, and samples never split. */
static int rank_multi_k(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "multik", rank, world, 10000, &g), NULL);
        int64_t samples = 1 + rank, len = 2 + rank;
        int64_t ids[8];
        int32_t seqs[8 * 3 * 8];
        for (int64_t s = 0; s < samples; s++) {
                ids[s] = rank * 100 + s;
                for (int64_t q = 0; q < 3; q++)
                        for (int64_t t = 0; t < len; t++)
                                seqs[(s * 3 + q) * len + t] = (int32_t)(ids[s] * 100 + q * 10 + t);
        }
        deval_tensor in[2] = {
                {.data = ids, .dtype = DEVAL_I64, .ndim = 1, .shape = {samples}, .device = -1},
                {.data = seqs,
                 .dtype = DEVAL_I32,
                 .ndim = 2,
                 .shape = {samples * 3, len},
                 .device = -1},
        };
        deval_tensor out[2];
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.order = DEVAL_ORDER_STRIDED;
        o.pad_value = -5;
        o.valid_rows = rank == world - 1 ? samples - 1 : -1; /* last rank: a duplicate tail */
        CHECK_OK(deval_gather(g, 2, in, &o, out), g);
        int64_t maxlen = 1 + world;
        const int64_t *oid = out[0].data;
        const int32_t *oseq = out[1].data;
        CHECK(out[1].shape[0] == out[0].shape[0] * 3, "%lld seq rows for %lld samples",
              (long long)out[1].shape[0], (long long)out[0].shape[0]);
        CHECK(out[1].shape[1] == maxlen, "seq len %lld", (long long)out[1].shape[1]);
        int64_t k = 0;
        for (int64_t s = 0; s < 8; s++)
                for (int r = 0; r < world; r++) {
                        int64_t have = 1 + r - (r == world - 1);
                        if (s >= have)
                                continue;
                        int64_t id = r * 100 + s;
                        CHECK(oid[k] == id, "sample %lld is %lld, not %lld", (long long)k,
                              (long long)oid[k], (long long)id);
                        for (int64_t q = 0; q < 3; q++)
                                for (int64_t t = 0; t < maxlen; t++) {
                                        int32_t want =
                                                t < 2 + r ? (int32_t)(id * 100 + q * 10 + t) : -5;
                                        CHECK(oseq[(k * 3 + q) * maxlen + t] == want,
                                              "sample %lld seq %lld tok %lld", (long long)k,
                                              (long long)q, (long long)t);
                                }
                        k++;
                }
        CHECK(k == out[0].shape[0], "%lld samples, want %lld", (long long)out[0].shape[0],
              (long long)k);
        deval_leave(g);
        return 0;
}

static void test_samples_move_whole(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_multi_k, NULL, 20), 0);
        assert_int_equal(harness_run(&H, 1, rank_multi_k, NULL, 20), 0);
}

/* 0-d tensors gather as [world]; zero-row inputs on every rank give a [0, ...] result. */
static int rank_scalars(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "scalar", rank, world, 10000, &g), NULL);
        double loss = rank + 0.5;
        deval_tensor in = {.data = &loss, .dtype = DEVAL_F64, .ndim = 0, .device = -1}, out;
        CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
        CHECK(out.ndim == 1 && out.shape[0] == world, "shape [%lld]", (long long)out.shape[0]);
        for (int r = 0; r < world; r++)
                CHECK(((double *)out.data)[r] == r + 0.5, "element %d", r);
        deval_tensor empty = {.data = NULL,
                              .dtype = DEVAL_I16,
                              .ndim = 3,
                              .shape = {0, 2 + rank, 3},
                              .device = -1};
        CHECK_OK(deval_gather(g, 1, &empty, NULL, &out), g);
        CHECK(out.shape[0] == 0 && out.shape[1] == 1 + world && out.shape[2] == 3,
              "shape [%lld, %lld, %lld]", (long long)out.shape[0], (long long)out.shape[1],
              (long long)out.shape[2]);
        deval_leave(g);
        return 0;
}

static void test_scalars_and_empty(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 4, rank_scalars, NULL, 20), 0);
}

/* Inputs far past the initial arenas: devald grows input and output arenas. */
static int rank_large(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "large", rank, world, 20000, &g), NULL);
        for (int round = 0; round < 3; round++) {
                int64_t rows = 1000 * (round + 1) + rank, cols = 257 + rank;
                float *x = malloc((size_t)(rows * cols) * sizeof(float));
                for (int64_t i = 0; i < rows * cols; i++)
                        x[i] = (float)(rank * 1e6 + i);
                deval_tensor in = {.data = x,
                                   .dtype = DEVAL_F32,
                                   .ndim = 2,
                                   .shape = {rows, cols},
                                   .device = -1},
                             out;
                CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
                int64_t off = 0;
                for (int r = 0; r < rank; r++)
                        off += 1000 * (round + 1) + r;
                const float *o = (const float *)out.data + off * out.shape[1];
                for (int64_t i = 0; i < rows; i++)
                        for (int64_t j = 0; j < out.shape[1]; j++) {
                                float want = j < cols ? (float)(rank * 1e6 + i * cols + j) : 0.0f;
                                CHECK(o[i * out.shape[1] + j] == want, "round %d (%lld, %lld)",
                                      round, (long long)i, (long long)j);
                        }
                free(x);
        }
        deval_leave(g);
        return 0;
}

static void test_arena_growth(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_large, NULL, 60), 0);
}

/*
 * Ranks whose inputs fit in their inline bytes and a rank whose input does not, in the same
 * steps (devald then runs them, reading each rank where its input lies), between steps the
 * ranks run themselves: every result exact, and deval-ctl dump shows both kinds.
 */
static int rank_mixed(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        char name[64], args[128], out[16384];
        snprintf(name, sizeof(name), "mixed-%d", (int)getppid());
        CHECK_OK(harness_join(h, "mixed", rank, world, 20000, &g), NULL);
        for (int round = 0; round < 6; round++) {
                /* odd rounds: rank 1 sends 4 MiB, past any inline size */
                int64_t rows = round % 2 && rank == 1 ? 16384 : 3 + rank, cols = 64;
                float *x = malloc((size_t)(rows * cols) * sizeof(float));
                for (int64_t i = 0; i < rows * cols; i++)
                        x[i] = (float)(rank * 1e7 + round * 1e5 + i);
                deval_tensor in = {.data = x,
                                   .dtype = DEVAL_F32,
                                   .ndim = 2,
                                   .shape = {rows, cols},
                                   .device = -1},
                             o;
                CHECK_OK(deval_gather(g, 1, &in, NULL, &o), g);
                const float *v = o.data;
                int64_t at = 0;
                for (int k = 0; k < world; k++) {
                        int64_t rk = round % 2 && k == 1 ? 16384 : 3 + k;
                        for (int64_t i = 0; i < rk * cols; i += 61)
                                CHECK(v[at * cols + i] == (float)(k * 1e7 + round * 1e5 + i),
                                      "round %d, rank %d's element %lld", round, k, (long long)i);
                        at += rk;
                }
                CHECK(o.shape[0] == at, "round %d: %lld rows", round, (long long)o.shape[0]);
                free(x);
                double s = rank + 1;
                deval_tensor r = {.data = &s, .dtype = DEVAL_F64, .ndim = 0, .device = -1};
                CHECK_OK(deval_reduce(g, &r, DEVAL_SUM), g);
                CHECK(s == world * (world + 1) / 2.0, "round %d: sum %g", round, s);
        }
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                snprintf(args, sizeof(args), "dump %s", name);
                CHECK(harness_ctl(h, args, out, sizeof(out)) == 0, "dump: %s", out);
                if (!getenv("DEVAL_RANK_STEPS"))
                        CHECK(strstr(out, "ran on the ranks"), "no step ran on the ranks:\n%s",
                              out);
        }
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_inline_and_arena_inputs(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_mixed, NULL, 60), 0);
}

/*
 * An eval pass whose gathers for metrics the ranks run themselves, with the pass's counters
 * in shared memory: 3 ranks, 3 batches of 2 and a last of 1 on ranks 0 and 1 (the sampler's
 * padding on rank 2), 2 calls per batch. Every sample exactly once, in dataset order, from
 * both calls; the steps ran on the ranks (the dump says so); the close checks the counts.
 */
static int rank_pass(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        char name[64], args[128], out[16384];
        snprintf(name, sizeof(name), "pass-%d", (int)getppid());
        CHECK_OK(harness_join(h, "pass", rank, world, 20000, &g), NULL);
        const int64_t n = 3 * 3 * 2 - 1; /* 17 samples: rank 2's last is a duplicate */
        CHECK_OK(deval_eval_begin(g, n, DEVAL_ORDER_STRIDED), g);
        int64_t got[2] = {0, 0};
        for (int b = 0; b < 3; b++) {
                CHECK_OK(deval_eval_batch(g), g);
                int64_t idx[2];
                for (int j = 0; j < 2; j++) /* DistributedSampler: sample (b*2+j)*world+rank */
                        idx[j] = ((int64_t)(b * 2 + j) * world + rank) % n;
                for (int call = 0; call < 2; call++) {
                        int64_t v[2] = {idx[0] * 10 + call, idx[1] * 10 + call};
                        deval_tensor in = {.data = v,
                                           .dtype = DEVAL_I64,
                                           .ndim = 1,
                                           .shape = {2},
                                           .device = -1},
                                     o;
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &o), g);
                        const int64_t *r = o.data;
                        for (int64_t i = 0; i < o.shape[0]; i++)
                                CHECK(r[i] == (got[call] + i) * 10 + call,
                                      "batch %d call %d: row %lld is %lld", b, call, (long long)i,
                                      (long long)r[i]);
                        got[call] += o.shape[0];
                }
        }
        CHECK(got[0] == n && got[1] == n, "%lld and %lld samples, not %lld", (long long)got[0],
              (long long)got[1], (long long)n);
        if (rank == 0 && !getenv("DEVAL_RANK_STEPS")) {
                snprintf(args, sizeof(args), "dump %s", name);
                CHECK(harness_ctl(h, args, out, sizeof(out)) == 0, "dump: %s", out);
                CHECK(strstr(out, "ran on the ranks") &&
                              strstr(out, "\"op\":\"gather_for_metrics\""),
                      "the gathers for metrics did not run on the ranks:\n%s", out);
        }
        CHECK_OK(deval_eval_complete(g), g);
        deval_leave(g);
        return 0;
}

static void test_pass_on_the_ranks(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_pass, NULL, 60), 0);
}

static int rank_objects(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "objects", rank, world, 10000, &g), NULL);
        char text[4][48];
        deval_bytes items[4];
        int n = rank + 1;
        for (int i = 0; i < n; i++) {
                snprintf(text[i], sizeof(text[i]), "rank %d item %d%s", rank, i,
                         i % 2 ? " (odd)" : "");
                items[i] = (deval_bytes){text[i], strlen(text[i])};
        }
        items[0].len = rank == 1 ? 0 : items[0].len; /* an empty object */
        size_t on;
        const deval_bytes *oi;
        for (int order = 0; order < 2; order++) {
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.order = order;
                CHECK_OK(deval_gather_objects(g, (size_t)n, items, &o, &on, &oi), g);
                size_t k = 0;
                for (int a = 0; a < 4; a++)
                        for (int b = 0; b < 4; b++) {
                                int r = order ? b : a, i = order ? a : b;
                                if (r >= world || i > r)
                                        continue;
                                char want[48];
                                snprintf(want, sizeof(want), "rank %d item %d%s", r, i,
                                         i % 2 ? " (odd)" : "");
                                size_t wl = r == 1 && i == 0 ? 0 : strlen(want);
                                CHECK(k < on && oi[k].len == wl &&
                                              memcmp(oi[k].data, want, wl) == 0,
                                      "object %zu (order %d)", k, order);
                                k++;
                        }
                CHECK(k == on, "%zu objects, want %zu", on, k);
        }
        CHECK_OK(deval_gather_objects(g, 0, NULL, NULL, &on, &oi), g);
        CHECK(on == 0, "%zu objects from nothing", on);
        deval_leave(g);
        return 0;
}

static void test_objects(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_objects, NULL, 20), 0);
}

static int rank_reduce(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "reduce", rank, world, 10000, &g), NULL);
        for (int dt = DEVAL_BOOL; dt <= DEVAL_F64; dt++) {
                for (int op = DEVAL_SUM; op <= DEVAL_PROD; op++) {
                        size_t es = dv_dtype_size(dt);
                        uint8_t x[6 * 8], want[6 * 8];
                        double accd[6];
                        uint8_t acc[6 * 8];
                        for (int e = 0; e < 6; e++)
                                dv_dtype_encode(dt, (rank + 1) * (e + 1) * (e % 2 ? -1 : 1),
                                                x + e * es);
                        deval_tensor t = {
                                .data = x, .dtype = dt, .ndim = 2, .shape = {2, 3}, .device = -1};
                        int r = deval_reduce(g, &t, (deval_reduce_op)op);
                        if (op == DEVAL_MEAN && !dv_dtype_is_float(dt)) {
                                CHECK(r == DEVAL_EINVAL, "mean of %s -> %d", dv_dtype_name(dt), r);
                                continue;
                        }
                        CHECK(r == 0, "reduce %d of %s: %s", op, dv_dtype_name(dt),
                              deval_errmsg(g));
                        /* the reference: the same element-wise fold in rank order */
                        void *a = (dt == DEVAL_F16 || dt == DEVAL_BF16) ? (void *)accd : acc;
                        for (int k = 0; k < world; k++) {
                                uint8_t y[6 * 8];
                                for (int e = 0; e < 6; e++)
                                        dv_dtype_encode(dt, (k + 1) * (e + 1) * (e % 2 ? -1 : 1),
                                                        y + e * es);
                                if (k == 0)
                                        dv_reduce_init(dt, a, y, 6);
                                else
                                        dv_reduce_accumulate(dt, op, a, y, 6);
                        }
                        dv_reduce_finish(dt, op, world, a, want, 6);
                        CHECK(memcmp(x, want, 6 * es) == 0, "reduce %d of %s differs", op,
                              dv_dtype_name(dt));
                }
        }
        /* a concrete one: sum of i32 over 3 ranks */
        int32_t v = rank + 1;
        deval_tensor t = {.data = &v, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
        CHECK(v == world * (world + 1) / 2, "sum is %d", v);
        deval_leave(g);
        return 0;
}

static void test_reduce_all(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_reduce, NULL, 30), 0);
}

static int rank_broadcast(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "bcast", rank, world, 10000, &g), NULL);
        for (int root = 0; root < world; root++) {
                int16_t x[5];
                for (int e = 0; e < 5; e++)
                        x[e] = (int16_t)(rank == root ? root * 10 + e : -1);
                deval_tensor t = {
                        .data = x, .dtype = DEVAL_I16, .ndim = 1, .shape = {5}, .device = -1};
                CHECK_OK(deval_broadcast(g, &t, root), g);
                for (int e = 0; e < 5; e++)
                        CHECK(x[e] == root * 10 + e, "root %d element %d is %d", root, e, x[e]);
                char msg[64];
                int n = snprintf(msg, sizeof(msg), "config from %d", root);
                deval_bytes b;
                CHECK_OK(deval_broadcast_bytes(g, rank == root ? msg : NULL,
                                               rank == root ? (size_t)n : 0, root, &b),
                         g);
                snprintf(msg, sizeof(msg), "config from %d", root);
                CHECK(b.len == strlen(msg) && memcmp(b.data, msg, b.len) == 0, "bytes differ");
                CHECK_OK(deval_barrier(g), g);
        }
        deval_leave(g);
        return 0;
}

static void test_broadcast_and_barrier(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_broadcast, NULL, 20), 0);
}

static int rank_pad(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "pad", rank, world, 10000, &g), NULL);
        int64_t rows = 1 + rank, cols = 3 - rank % 2;
        int64_t x[16];
        for (int i = 0; i < rows * cols; i++)
                x[i] = rank * 100 + i;
        deval_tensor in = {.data = x,
                           .dtype = DEVAL_I64,
                           .ndim = 2,
                           .shape = {rows, cols},
                           .device = -1},
                     out;
        /* dim 1 (and -1), padding at the end and at the start */
        for (int dim = 1; dim >= -1; dim -= 2)
                for (int first = 0; first < 2; first++) {
                        CHECK_OK(deval_pad_across_processes(g, &in, dim, -100, first, &out), g);
                        CHECK(out.shape[0] == rows && out.shape[1] == 3, "shape");
                        const int64_t *o = out.data;
                        for (int64_t i = 0; i < rows; i++)
                                for (int64_t j = 0; j < 3; j++) {
                                        int64_t sj = first ? j - (3 - cols) : j;
                                        int64_t want =
                                                sj >= 0 && sj < cols ? x[i * cols + sj] : -100;
                                        CHECK(o[i * 3 + j] == want, "dim %d first %d (%lld,%lld)",
                                              dim, first, (long long)i, (long long)j);
                                }
                }
        /* dim 0 pads rows */
        CHECK_OK(deval_pad_across_processes(g, &in, 0, 7, false, &out), g);
        CHECK(out.shape[0] == world && out.shape[1] == cols, "dim 0 shape");
        for (int64_t i = rows; i < world; i++)
                for (int64_t j = 0; j < cols; j++)
                        CHECK(((int64_t *)out.data)[i * cols + j] == 7, "dim 0 pad");
        /* past every rank's tensor: unchanged */
        CHECK_OK(deval_pad_across_processes(g, &in, 2, 0, false, &out), g);
        CHECK(out.data == x && out.shape[1] == cols, "dim 2 changed the tensor");
        CHECK_OK(deval_pad_across_processes(g, &in, -3, 0, false, &out), g);
        CHECK(out.data == x, "dim -3 changed the tensor");
        /* past rank 1's tensor alone (a squeezed batch of one): the call fails on every rank,
         * naming the ndims, and the next call pairs with the others' next call */
        deval_tensor flat = {
                .data = x, .dtype = DEVAL_I64, .ndim = 1, .shape = {rows * cols}, .device = -1};
        int r = deval_pad_across_processes(g, rank == 1 ? &flat : &in, 1, 0, false, &out);
        CHECK(r == DEVAL_EMISMATCH, "a dim outside rank 1's tensor alone: %d (%s)", r,
              deval_errmsg(g));
        CHECK(strstr(deval_errmsg(g), "ndim: rank 0 has 2, rank 1 has 1"), "said: %s",
              deval_errmsg(g));
        CHECK_OK(deval_pad_across_processes(g, &in, 1, -100, false, &out), g);
        CHECK(out.shape[1] == 3, "the next pad: width %lld", (long long)out.shape[1]);
        /* tensors named otherwise on rank 1 (a dict's keys): every rank's call fails */
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.names = rank == 1 ? 0x5eed : 0xfeed;
        r = deval_gather(g, 1, &flat, &o, &out);
        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "names"), "names: %d (%s)", r,
              deval_errmsg(g));
        o.names = 0xfeed;
        CHECK_OK(deval_gather(g, 1, &flat, &o, &out), g);
        deval_leave(g);
        return 0;
}

static void test_pad_across_processes(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_pad, NULL, 20), 0);
}

/* Inputs written straight into the arena are used in place, also when the arena grows. */
static int rank_input_buffer(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "zerocopy", rank, world, 10000, &g), NULL);
        for (int round = 0; round < 2; round++) {
                int64_t n = 100 + rank;
                void *buf;
                CHECK_OK(deval_input_buffer(g, (size_t)n * sizeof(int32_t), &buf), g);
                int32_t *ids = buf;
                for (int64_t i = 0; i < n; i++)
                        ids[i] = (int32_t)(rank * 1000 + i);
                /* round 1: a second tensor large enough to make the arena grow */
                int64_t m = round ? (1 << 14) : 3;
                float *big = malloc(sizeof(float) * (size_t)(n * m));
                for (int64_t i = 0; i < n * m; i++)
                        big[i] = (float)(rank + i);
                deval_tensor in[2] = {
                        {.data = ids, .dtype = DEVAL_I32, .ndim = 1, .shape = {n}, .device = -1},
                        {.data = big, .dtype = DEVAL_F32, .ndim = 2, .shape = {n, m}, .device = -1},
                };
                deval_tensor out[2];
                CHECK_OK(deval_gather(g, round ? 2 : 1, in, NULL, out), g);
                int64_t k = 0;
                for (int r = 0; r < world; r++)
                        for (int64_t i = 0; i < 100 + r; i++, k++)
                                CHECK(((int32_t *)out[0].data)[k] == r * 1000 + i,
                                      "round %d row %lld", round, (long long)k);
                CHECK(k == out[0].shape[0], "rows");
                free(big);
        }
        deval_leave(g);
        return 0;
}

static void test_input_buffer(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_input_buffer, NULL, 30), 0);
}

/* Two groups at once on one devald, each with its own ranks. */
static int rank_two_groups(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g;
        const char *name = rank < 2 ? "left" : "right";
        int r = rank % 2;
        CHECK_OK(harness_join(h, name, r, 2, 10000, &g), NULL);
        for (int i = 0; i < 200; i++) {
                int64_t v = rank * 1000 + i;
                deval_tensor t = {.data = &v, .dtype = DEVAL_I64, .ndim = 0, .device = -1};
                CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                int64_t want = (rank < 2 ? 1000 : 5000) + 2 * i;
                CHECK(v == want, "%s: %lld, want %lld", name, (long long)v, (long long)want);
        }
        deval_leave(g);
        return 0;
}

static void test_groups_are_independent(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 4, rank_two_groups, NULL, 30), 0);
}

/* Element (i, j) of rank r's first tensor in round k of the direct test, and its second's. */
static float direct_a(int r, int k, int64_t i, int64_t j) {
        return (float)(r * 100000 + k * 10000 + i * 16 + j);
}

static int64_t direct_b(int r, int k, int64_t i) {
        return (int64_t)r * 1000000000 + k * 1000000 + i;
}

/* round 7 is past the size from which ranks stream their rows (DV_STREAM_MIN) */
static int64_t direct_rows(int r, int k) {
        return (k == 7 ? 40000 : (k + 1) * 300) + r * 7;
}

/*
 * Gathers each rank copies straight into the result (DV_REQ_DIRECT), on 4 ranks: rank 3's
 * inputs inline (it stages them), the others' in their own memory, in the same steps; two
 * tensors per rank, ragged in rows and columns, padded first or last, in rank or strided
 * order; sizes growing round by round, so that the runner grows the direct output and the
 * other ranks follow its generation, up to a result large enough to be streamed. Every result exact, and (white box) written into the
 * direct output. Then steps the ranks cannot run come back unrun, go to devald staged and
 * fail naming what differs (a dtype, an op), and the group goes on.
 */
static int rank_direct(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        setenv("DEVAL_DIRECT_MIN", rank == 3 ? "18446744073709551615" : "0", 1);
        CHECK_OK(harness_join(h, "direct", rank, world, 20000, &g), NULL);
        uint64_t gens = 0, gen = 0;
        for (int k = 0; k < 8; k += k == 5 ? 2 : 1) {
                int64_t rows = direct_rows(rank, k), cols = 3 + rank + k;
                float *a = malloc((size_t)(rows * cols) * sizeof(float));
                int64_t *b = malloc((size_t)rows * sizeof(int64_t));
                for (int64_t i = 0; i < rows; i++) {
                        for (int64_t j = 0; j < cols; j++)
                                a[i * cols + j] = direct_a(rank, k, i, j);
                        b[i] = direct_b(rank, k, i);
                }
                deval_tensor in[2] =
                        {{.data = a,
                          .dtype = DEVAL_F32,
                          .ndim = 2,
                          .shape = {rows, cols},
                          .device = -1},
                         {.data = b, .dtype = DEVAL_I64, .ndim = 1, .shape = {rows}, .device = -1}},
                             out[2];
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.pad_value = 7.5;
                o.pad_first = k % 3 == 1;
                o.order = k % 2 ? DEVAL_ORDER_STRIDED : DEVAL_ORDER_RANK;
                CHECK_OK(deval_gather(g, 2, in, &o, out), g);
                /* (unless every step is devald's: DEVAL_RANK_STEPS=0) */
                CHECK(!g->rank_steps ||
                              (g->direct.seq == g->seq && out[0].data >= (void *)g->direct.out &&
                               (uint8_t *)out[1].data + out[1].shape[0] * 8 <=
                                       g->direct.out + g->direct.size),
                      "round %d: the result is not in the direct output", k);
                gens += g->direct.gen != gen;
                gen = g->direct.gen;
                int64_t maxc = 3 + (world - 1) + k, total = 0, most = 0;
                for (int r = 0; r < world; r++) {
                        total += direct_rows(r, k);
                        if (direct_rows(r, k) > most)
                                most = direct_rows(r, k);
                }
                CHECK(out[0].shape[0] == total && out[0].shape[1] == maxc &&
                              out[1].shape[0] == total,
                      "round %d: shapes %lld x %lld, %lld", k, (long long)out[0].shape[0],
                      (long long)out[0].shape[1], (long long)out[1].shape[0]);
                const float *oa = out[0].data;
                const int64_t *ob = out[1].data;
                int64_t at = 0;
                for (int64_t i = 0; i < (o.order == DEVAL_ORDER_RANK ? 1 : most); i++)
                        for (int r = 0; r < world; r++) {
                                int64_t lo = o.order == DEVAL_ORDER_RANK ? 0 : i;
                                int64_t hi =
                                        o.order == DEVAL_ORDER_RANK ? direct_rows(r, k) : i + 1;
                                for (int64_t x = lo; x < hi && x < direct_rows(r, k); x++, at++) {
                                        int64_t c = 3 + r + k, pad = maxc - c;
                                        CHECK(ob[at] == direct_b(r, k, x),
                                              "round %d: row %lld is not rank %d's %lld", k,
                                              (long long)at, r, (long long)x);
                                        for (int64_t j = 0; j < maxc; j++) {
                                                int64_t sj = o.pad_first ? j - pad : j;
                                                float want = sj >= 0 && sj < c
                                                                     ? direct_a(r, k, x, sj)
                                                                     : 7.5f;
                                                CHECK(oa[at * maxc + j] == want,
                                                      "round %d: row %lld col %lld", k,
                                                      (long long)at, (long long)j);
                                        }
                                }
                        }
                CHECK(at == total, "round %d: %lld rows checked", k, (long long)at);
                free(a);
                free(b);
        }
        CHECK(!g->rank_steps || gens >= 2, "the direct output was never grown (%llu generations)",
              (unsigned long long)gens);

        /* ranks that disagree: handed back unrun, then named by devald */
        int32_t v[64] = {0};
        deval_tensor t = {.data = v,
                          .dtype = rank == 1 ? DEVAL_I32 : DEVAL_F32,
                          .ndim = 1,
                          .shape = {64},
                          .device = -1},
                     out;
        int r = deval_gather(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "dtype") &&
                      strstr(deval_errmsg(g), "rank 1"),
              "dtypes: got %s: %s", deval_strerror(r), deval_errmsg(g));
        t.dtype = DEVAL_F32;
        r = rank == 2 ? deval_barrier(g) : deval_gather(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "op"), "ops: got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        v[0] = rank;
        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
        CHECK(out.shape[0] == 64 * world && ((const int32_t *)out.data)[64 * 2] == 2,
              "the group does not go on");
        CHECK_OK(deval_leave(g), NULL);
        return 0;
}

static void test_direct_gathers(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 4, rank_direct, NULL, 60), 0);
}

/* Rank k's element (r, c) of the ragged gathers below, and its rows and columns at step i. */
static float mirror_val(int k, int64_t r, int64_t c, int i) {
        return (float)(k * 1000 + r * 10 + c + i);
}

static int64_t mirror_rows(int k, int i) {
        return 1 + (k + i) % 3;
}

static int64_t mirror_cols(int k) {
        return 2 + k;
}

/*
 * A ragged gather of one small f32 tensor per rank (rows and columns differ), padded at
 * either end, in rank or strided order, the last rank's last row dropped (valid_rows):
 * every element checked against a reference built here. Return: bytes of the result, or
 * -1 when a check failed (the message is out).
 */
static int64_t mirror_ragged(deval_group *g, int rank, int world, int i) {
        int64_t rows = mirror_rows(rank, i), cols = mirror_cols(rank);
        float x[3 * 5];
        for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++)
                        x[r * cols + c] = mirror_val(rank, r, c, i);
        deval_tensor t = {.data = x,
                          .dtype = DEVAL_F32,
                          .ndim = 2,
                          .shape = {rows, cols},
                          .device = -1},
                     out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.pad_first = i % 2;
        o.pad_value = -1.5;
        o.order = i % 4 < 2 ? DEVAL_ORDER_RANK : DEVAL_ORDER_STRIDED;
        if (rank == world - 1)
                o.valid_rows = rows - 1;
        int r = deval_gather(g, 1, &t, &o, &out);
        if (r < 0) {
                fprintf(stderr, "ragged gather %d: %s\n", i, deval_errmsg(g));
                return -1;
        }
        int64_t maxc = mirror_cols(world - 1), at = 0, most = 0;
        for (int k = 0; k < world; k++)
                most = DV_MAX(most, mirror_rows(k, i));
        const float *o_ = out.data;
        for (int64_t s = 0; s < most; s++)
                for (int k = 0; k < world; k++) {
                        int64_t valid = mirror_rows(k, i) - (k == world - 1);
                        int64_t lo = o.order == DEVAL_ORDER_RANK ? (s ? valid : 0) : s;
                        int64_t hi = o.order == DEVAL_ORDER_RANK ? valid : DV_MIN(s + 1, valid);
                        for (int64_t row = lo; row < hi; row++, at++) {
                                int64_t c = mirror_cols(k), pad = maxc - c;
                                for (int64_t j = 0; j < maxc; j++) {
                                        int64_t sj = o.pad_first ? j - pad : j;
                                        float want = sj >= 0 && sj < c ? mirror_val(k, row, sj, i)
                                                                       : -1.5f;
                                        if (o_[at * maxc + j] != want) {
                                                fprintf(stderr,
                                                        "ragged gather %d: row %lld col %lld is "
                                                        "%g, not %g\n",
                                                        i, (long long)at, (long long)j,
                                                        (double)o_[at * maxc + j], (double)want);
                                                return -1;
                                        }
                                }
                        }
                }
        if (out.ndim != 2 || out.shape[0] != at || out.shape[1] != maxc) {
                fprintf(stderr, "ragged gather %d: shape %lld x %lld\n", i, (long long)out.shape[0],
                        (long long)out.shape[1]);
                return -1;
        }
        return at * maxc * (int64_t)sizeof(float);
}

/*
 * Small reduces, gathers and barriers every rank runs by itself (mirror.c), between steps of
 * every other kind, with ranks arriving in changing orders: each result exact, and (white
 * box) mirrored exactly where every rank could mirror it. A reduce too large to mirror, one
 * with a rank's input in its input buffer, gathers of two tensors or to one root, and ranks
 * that disagree on the shape go the other ways, the last to devald, which names it. With
 * arg 1, rank 1 never mirrors ($DEVAL_MIRROR=0): no step is mirrored and every result is
 * still exact. deval-ctl counts every step.
 */
static int rank_mirror(const Harness *h, int rank, int world, void *arg) {
        bool refuser = arg && rank == 1;
        deval_group *g;
        if (refuser)
                setenv("DEVAL_MIRROR", "0", 1);
        CHECK_OK(harness_join(h, arg ? "mirror-off" : "mirror", rank, world, 10000, &g), NULL);
        unsetenv("DEVAL_MIRROR");
        bool all = g->rank_steps && !arg; /* every rank mirrors what it can */
        /* but a gather it copies into the direct output (every gather: DEVAL_DIRECT_MIN=0) */
        bool gathers = all && g->direct.min > DV_MIRROR_BYTES;
        uint64_t bytes = 0;
        for (int i = 0; i < 270; i++) {
                if ((i * 7 + rank * 3) % 5 == 0) /* arrive in another order */
                        usleep((useconds_t)(20 * rank));
                uint64_t step_bytes = 0;
                bool mirrorable = false,
                     gather = i % 9 == 3 || i % 9 == 5 || i % 9 == 6 || i % 9 == 7;
                switch (i % 9) {
                case 0: { /* 16 bytes */
                        float x[4];
                        for (int e = 0; e < 4; e++)
                                x[e] = (float)(rank * 10 + i + e);
                        deval_tensor t = {.data = x,
                                          .dtype = DEVAL_F32,
                                          .ndim = 2,
                                          .shape = {2, 2},
                                          .device = -1};
                        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                        for (int e = 0; e < 4; e++)
                                CHECK(x[e] == (float)(10 * world * (world - 1) / 2 +
                                                      world * (i + e)),
                                      "step %d: element %d is %g", i, e, (double)x[e]);
                        mirrorable = true;
                        step_bytes = sizeof(x);
                        break;
                }
                case 1:
                        CHECK_OK(deval_barrier(g), g);
                        mirrorable = true;
                        break;
                case 2: { /* 160 bytes: past DV_MIRROR_BYTES, run by the last to arrive */
                        double x[20];
                        for (int e = 0; e < 20; e++)
                                x[e] = (rank + e) % world == 0 ? i : -e; /* some rank has i */
                        deval_tensor t = {.data = x,
                                          .dtype = DEVAL_F64,
                                          .ndim = 1,
                                          .shape = {20},
                                          .device = -1};
                        CHECK_OK(deval_reduce(g, &t, DEVAL_MAX), g);
                        for (int e = 0; e < 20; e++)
                                CHECK(x[e] == i, "step %d: max %d is %g", i, e, x[e]);
                        break;
                }
                case 3: {
                        int16_t x[3] = {(int16_t)rank, (int16_t)i, (int16_t)(rank * i)};
                        deval_tensor t = {.data = x,
                                          .dtype = DEVAL_I16,
                                          .ndim = 1,
                                          .shape = {3},
                                          .device = -1},
                                     out;
                        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
                        const int16_t *o = out.data;
                        CHECK(out.shape[0] == 3 * world && o[3 * (world - 1)] == world - 1 &&
                                      o[3 * (world - 1) + 2] == (int16_t)((world - 1) * i),
                              "step %d: gather", i);
                        mirrorable = true;
                        step_bytes = 3 * (uint64_t)world * sizeof(int16_t);
                        break;
                }
                case 4: { /* rank 2's input in its input buffer, where only devald reads it */
                        int32_t *x, own[3];
                        void *buf;
                        if (rank == 2) {
                                CHECK_OK(deval_input_buffer(g, sizeof(own), &buf), g);
                                x = buf;
                        } else {
                                x = own;
                        }
                        for (int e = 0; e < 3; e++)
                                x[e] = rank * e + i;
                        deval_tensor t = {.data = x,
                                          .dtype = DEVAL_I32,
                                          .ndim = 1,
                                          .shape = {3},
                                          .device = -1};
                        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                        for (int e = 0; e < 3; e++)
                                CHECK(x[e] == e * world * (world - 1) / 2 + world * i,
                                      "step %d: sum %d is %d", i, e, x[e]);
                        break;
                }
                case 5:
                case 6: {
                        int64_t b = mirror_ragged(g, rank, world, i);
                        CHECK(b >= 0, "step %d: ragged gather", i);
                        mirrorable = true;
                        step_bytes = (uint64_t)b;
                        break;
                }
                case 7: { /* outside an eval pass, as a plain gather */
                        int64_t x[2] = {rank, -i};
                        deval_tensor t = {.data = x,
                                          .dtype = DEVAL_I64,
                                          .ndim = 1,
                                          .shape = {2},
                                          .device = -1},
                                     out;
                        CHECK_OK(deval_gather_for_metrics(g, 1, &t, NULL, &out), g);
                        const int64_t *o = out.data;
                        CHECK(out.shape[0] == 2 * world && o[2] == 1 && o[2 * world - 1] == -i,
                              "step %d: gather_for_metrics", i);
                        mirrorable = true;
                        step_bytes = 2 * (uint64_t)world * sizeof(int64_t);
                        break;
                }
                default: { /* two tensors, or one root: the other ways */
                        int32_t x[2] = {rank, i};
                        deval_tensor t[2] = {{.data = x,
                                              .dtype = DEVAL_I32,
                                              .ndim = 1,
                                              .shape = {1},
                                              .device = -1},
                                             {.data = x + 1,
                                              .dtype = DEVAL_I32,
                                              .ndim = 1,
                                              .shape = {1},
                                              .device = -1}},
                                     out[2];
                        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                        o.root = i % 2 ? 1 : -1;
                        CHECK_OK(deval_gather(g, o.root < 0 ? 2 : 1, t, &o, out), g);
                        bool got = o.root < 0 || rank == o.root;
                        CHECK(out[0].shape[0] == (got ? world : 0) &&
                                      (!got ||
                                       ((const int32_t *)out[0].data)[world - 1] == world - 1),
                              "step %d: gather of %s", i, o.root < 0 ? "two" : "one root");
                }
                }
                bool mirrored = g->view == g->mirror.out;
                CHECK(mirrored == (mirrorable && (gather ? gathers : all)), "step %d (%d): %s", i,
                      i % 9, mirrored ? "mirrored" : "not mirrored");
                if (mirrored)
                        bytes += step_bytes;
        }
        /* ranks that disagree on the shape: none mirrors it, devald names it */
        float y[4] = {1, 2, 3, 4};
        deval_tensor t = {.data = y, .dtype = DEVAL_F32, .ndim = 2, .shape = {2, 2}, .device = -1};
        if (rank == 3) {
                t.ndim = 1;
                t.shape[0] = 4;
        }
        int r = deval_reduce(g, &t, DEVAL_SUM);
        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "ndim") &&
                      strstr(deval_errmsg(g), "rank 3"),
              "shapes: got %s: %s", deval_strerror(r), deval_errmsg(g));
        /* a gather the same way: ranks that disagree on the dtype */
        deval_tensor u = t, out;
        u.dtype = rank == 2 ? DEVAL_I32 : DEVAL_F32;
        r = deval_gather(g, 1, &u, NULL, &out);
        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "dtype") &&
                      strstr(deval_errmsg(g), "rank 2"),
              "dtypes: got %s: %s", deval_strerror(r), deval_errmsg(g));
        t.ndim = 2;
        t.shape[0] = 2;
        CHECK_OK(deval_reduce(g, &t, DEVAL_MIN), g);
        CHECK(y[0] == 1 && y[3] == 4 && (g->view == g->mirror.out) == all,
              "the group does not go on");
        bytes += all ? sizeof(y) : 0;
        if (rank == 0) {
                /* rank 0 tells devald of the steps every rank ran */
                CHECK(atomic_load(&g->hdr->fast.mirror_bytes) == bytes,
                      "mirrored %llu bytes, not %llu",
                      (unsigned long long)atomic_load(&g->hdr->fast.mirror_bytes),
                      (unsigned long long)bytes);
                char args[128], buf[8192], want[64];
                snprintf(args, sizeof(args), "--json=short group %s-%d",
                         arg ? "mirror-off" : "mirror", (int)getppid());
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "%s: %s", args, buf);
                /* every step this rank went through (a gather turned back unrun is two) */
                snprintf(want, sizeof(want), "\"collectives\":%u,", g->seq);
                CHECK(strstr(buf, want), "deval-ctl %s lacks %s:\n%s", args, want, buf);
        }
        CHECK_OK(deval_barrier(g), g); /* nobody leaves before rank 0 has asked */
        CHECK_OK(deval_leave(g), NULL);
        return 0;
}

static void test_mirror_steps(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 4, rank_mirror, NULL, 60), 0);
        assert_int_equal(harness_run(&H, 4, rank_mirror, (void *)1, 60), 0);
}

/*
 * A mirrored step, then nothing past the group's deadline: devald's worker learns from rank 0
 * that the step is done (DvFast.mirror_seq), or it would wait for it and time the group out.
 */
static int rank_mirror_idle(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "mirroridle", rank, world, 300, &g), NULL);
        for (int i = 0; i < 3; i++) {
                int32_t v = rank + i;
                deval_tensor t = {.data = &v, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
                CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                CHECK(v == world * (world - 1) / 2 + world * i, "sum %d is %d", i, v);
                CHECK(!g->rank_steps || g->view == g->mirror.out, "not mirrored");
                usleep(700000);
        }
        CHECK_OK(deval_leave(g), NULL);
        return 0;
}

static void test_mirror_then_idle(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_mirror_idle, NULL, 20), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_gather_every_dtype),
                cmocka_unit_test(test_gather_options),
                cmocka_unit_test(test_samples_move_whole),
                cmocka_unit_test(test_scalars_and_empty),
                cmocka_unit_test(test_arena_growth),
                cmocka_unit_test(test_inline_and_arena_inputs),
                cmocka_unit_test(test_pass_on_the_ranks),
                cmocka_unit_test(test_objects),
                cmocka_unit_test(test_reduce_all),
                cmocka_unit_test(test_broadcast_and_barrier),
                cmocka_unit_test(test_pad_across_processes),
                cmocka_unit_test(test_groups_are_independent),
                cmocka_unit_test(test_input_buffer),
                cmocka_unit_test(test_direct_gathers),
                cmocka_unit_test(test_mirror_steps),
                cmocka_unit_test(test_mirror_then_idle),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
