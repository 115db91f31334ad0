/* SPDX-License-Identifier: MIT */
/*
 * test-accelerate.c - the behaviours Accelerate's own distributed tests pin, through deval:
 * gather, gather_object, broadcast, pad_across_processes and reduce, and gather_for_metrics
 * returning exactly the dataset for lengths 82, 99 and 512 with batch 16 on 2-4 ranks.
 *
 * The samplers are re-implemented here from their documented behaviour: Accelerate's
 * BatchSamplerShard (even_batches on and off, drop_last) and IterableDatasetShard, which both
 * deal whole batches round-robin and complete the last round by cycling from the start, and
 * torch's DistributedSampler, which pads the index list by repeating its head and deals
 * single samples round-robin. Every sample i predicts 7*i % 13 and a ragged token row of
 * length 1 + i % 4, padded per batch on its rank (dynamic padding) and across ranks by deval.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdlib.h>
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

#define MAXB 80
#define BS   16

typedef struct {
        int nb;
        int len[MAXB];
        int64_t idx[MAXB][BS];
} Batches;

enum {
        ACCEL_EVEN,
        ACCEL_UNEVEN,
        ACCEL_DROP_LAST,
        ITERABLE,
        DIST_SAMPLER,
        DIST_DROP_LAST
};

static const char *const sampler_names[] = {
        "accelerate even_batches", "accelerate uneven",  "accelerate drop_last",
        "iterable dataset",        "DistributedSampler", "DistributedSampler drop_last"};

static void push(Batches *b, const int64_t *idx, int n) {
        assert_true(b->nb < MAXB);
        memcpy(b->idx[b->nb], idx, (size_t)n * sizeof(int64_t));
        b->len[b->nb++] = n;
}

/* Accelerate's BatchSamplerShard without split_batches, for process r of W. */
static void batch_shard(int64_t N, int W, int r, bool drop_last, bool even, Batches *out) {
        int64_t initial[4 * BS * 8];
        int ninit = 0;
        int64_t to_yield[BS], batch[BS];
        int nyield = 0, nbatch = 0;
        int64_t idx = 0, nbatches = drop_last ? N / BS : (N + BS - 1) / BS;

        for (idx = 0; idx < nbatches; idx++) {
                nbatch = 0;
                for (int64_t i = idx * BS; i < N && i < (idx + 1) * BS; i++)
                        batch[nbatch++] = i;
                if (!drop_last && idx < W)
                        for (int k = 0; k < nbatch; k++)
                                initial[ninit++] = batch[k];
                if (idx % W == r) {
                        memcpy(to_yield, batch, sizeof(batch));
                        nyield = nbatch;
                }
                if (idx % W == W - 1 && nbatch == BS) {
                        push(out, to_yield, nyield);
                        nyield = 0;
                }
        }
        if (drop_last || ninit == 0)
                return;
        idx--; /* Python's loop variable keeps the last index */
        if (!even) {
                if (nyield > 0)
                        push(out, to_yield, nyield);
                return;
        }
        if (nyield == BS)
                push(out, to_yield, nyield);
        while (ninit < W * BS) {
                memcpy(initial + ninit, initial, (size_t)ninit * sizeof(int64_t));
                ninit *= 2;
        }
        if (nbatch == BS) {
                nbatch = 0;
                idx++;
        }
        int cycle = 0;
        while (idx % W != 0 || nbatch > 0) {
                int end = cycle + BS - nbatch;
                for (int k = cycle; k < end; k++)
                        batch[nbatch++] = initial[k];
                if (idx % W == r)
                        push(out, batch, nbatch);
                cycle = end;
                nbatch = 0;
                idx++;
        }
}

/* Accelerate's IterableDatasetShard (no split_batches), then batches of BS per process. */
static void iterable_shard(int64_t N, int W, int r, Batches *out) {
        int64_t cur[BS * 8 * 2], first[BS * 8];
        int ncur = 0, nfirst = -1;
        int64_t stream[4096];
        int nstream = 0;
        for (int64_t e = 0; e < N; e++) {
                cur[ncur++] = e;
                if (ncur == BS * W) {
                        for (int i = r * BS; i < (r + 1) * BS; i++)
                                stream[nstream++] = cur[i];
                        if (nfirst < 0) {
                                memcpy(first, cur, sizeof(int64_t) * (size_t)ncur);
                                nfirst = ncur;
                        }
                        ncur = 0;
                }
        }
        if (ncur > 0) {
                if (nfirst < 0) {
                        memcpy(first, cur, sizeof(int64_t) * (size_t)ncur);
                        nfirst = ncur;
                }
                while (ncur < BS * W) {
                        memcpy(cur + ncur, first, sizeof(int64_t) * (size_t)nfirst);
                        ncur += nfirst;
                }
                for (int i = r * BS; i < (r + 1) * BS; i++)
                        stream[nstream++] = cur[i];
        }
        for (int i = 0; i < nstream; i += BS)
                push(out, stream + i, nstream - i < BS ? nstream - i : BS);
}

/* torch's DistributedSampler (shuffle=False), then a DataLoader of BS. */
static void dist_sampler(int64_t N, int W, int r, bool drop_last, Batches *out) {
        int64_t per = drop_last && N % W ? N / W : (N + W - 1) / W, total = per * W;
        int64_t mine[1024];
        int n = 0;
        for (int64_t k = r; k < total; k += W)
                mine[n++] = k % N; /* padding repeats the head of the index list */
        for (int i = 0; i < n; i += BS)
                push(out, mine + i, n - i < BS ? n - i : BS);
}

static void make_batches(int sampler, int64_t N, int W, int r, Batches *b) {
        memset(b, 0, sizeof(*b));
        switch (sampler) {
        case ACCEL_EVEN:
                batch_shard(N, W, r, false, true, b);
                break;
        case ACCEL_UNEVEN:
                batch_shard(N, W, r, false, false, b);
                break;
        case ACCEL_DROP_LAST:
                batch_shard(N, W, r, true, true, b);
                break;
        case ITERABLE:
                iterable_shard(N, W, r, b);
                break;
        case DIST_SAMPLER:
                dist_sampler(N, W, r, false, b);
                break;
        case DIST_DROP_LAST:
                dist_sampler(N, W, r, true, b);
                break;
        }
}

/* What a single process sees: the distinct samples the loaders cover, in dataset order. */
static int64_t expected_count(int sampler, int64_t N, int W) {
        switch (sampler) {
        case ACCEL_DROP_LAST:
                return N / BS / W * W * BS;
        case DIST_DROP_LAST:
                return N % W ? N / W * W : N;
        }
        return N;
}

typedef struct {
        int sampler;
        int64_t N;
        /* the loop people write: each rank only its own batches (no dummy calls), a
         * deval_eval_batch() per batch, predictions and tokens in two calls, and
         * deval_eval_complete() when the loader runs out */
        bool loop;
} PassArgs;

#define PAD (-100)

static int rank_pass(const Harness *h, int rank, int world, void *arg) {
        const PassArgs *a = arg;
        bool strided = a->sampler == DIST_SAMPLER || a->sampler == DIST_DROP_LAST;
        deval_group *g;
        CHECK_OK(harness_join(h, "pass", rank, world, 10000, &g), NULL);

        Batches *mine = malloc(sizeof(*mine));
        int steps = 0;
        for (int r = 0; r < world; r++) { /* every rank calls as often as the busiest */
                make_batches(a->sampler, a->N, world, r, mine);
                steps = mine->nb > steps ? mine->nb : steps;
        }
        make_batches(a->sampler, a->N, world, rank, mine);
        if (a->loop)
                steps = mine->nb;
        /* the loop mode's num_samples is what the loaders hold, as eval_loop derives it */
        int64_t num_samples = a->loop ? expected_count(a->sampler, a->N, world) : a->N;

        int64_t *got_pred = malloc(sizeof(int64_t) * 2048);
        int32_t *got_tok = malloc(sizeof(int32_t) * 2048 * 4);
        char(*got_name)[16] = malloc(16 * 2048);
        int64_t ngot = 0, nnames = 0;
        CHECK_OK(deval_eval_begin(g, num_samples, strided ? DEVAL_ORDER_STRIDED : DEVAL_ORDER_RANK),
                 g);
        int total = steps;
        for (int s = 0;; s++) {
                if (a->loop && s == steps) {
                        /* the loader ran out: end the pass, then replay on empty batches what
                         * the others gathered after that */
                        CHECK_OK(deval_eval_complete(g), g);
                        int64_t missed = deval_eval_missed(g);
                        CHECK(missed >= 0 && missed <= MAXB, "missed %lld", (long long)missed);
                        total = steps + (int)missed;
                }
                if (s >= total)
                        break;
                if (a->loop)
                        CHECK_OK(deval_eval_batch(g), g);
                int n = s < mine->nb ? mine->len[s] : 0;
                int64_t pred[BS];
                int32_t tok[BS * 4];
                char names[BS][16];
                deval_bytes items[BS];
                int width = 0;
                for (int k = 0; k < n; k++)
                        width = 1 + (int)(mine->idx[s][k] % 4) > width
                                        ? 1 + (int)(mine->idx[s][k] % 4)
                                        : width;
                for (int k = 0; k < n; k++) {
                        int64_t i = mine->idx[s][k];
                        pred[k] = 7 * i % 13;
                        for (int t = 0; t < width; t++)
                                tok[k * width + t] = t < 1 + i % 4 ? (int32_t)(i * 10 + t) : PAD;
                        snprintf(names[k], sizeof(names[k]), "s%lld", (long long)i);
                        items[k] = (deval_bytes){names[k], strlen(names[k])};
                }
                deval_tensor in[2] = {
                        {.data = pred, .dtype = DEVAL_I64, .ndim = 1, .shape = {n}, .device = -1},
                        {.data = tok,
                         .dtype = DEVAL_I32,
                         .ndim = 2,
                         .shape = {n, width},
                         .device = -1},
                };
                deval_tensor out[2];
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.pad_value = PAD;
                if (a->loop) {
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in[0], &o, &out[0]), g);
                        int64_t *keep = malloc(sizeof(int64_t) * (size_t)(out[0].shape[0] + 1));
                        memcpy(keep, out[0].data, sizeof(int64_t) * (size_t)out[0].shape[0]);
                        CHECK_OK(deval_gather_for_metrics(g, 1, &in[1], &o, &out[1]), g);
                        out[0].data = keep; /* the first result's view ended with this call */
                } else {
                        CHECK_OK(deval_gather_for_metrics(g, 2, in, &o, out), g);
                }
                CHECK(out[0].shape[0] == out[1].shape[0], "rows differ: %lld and %lld",
                      (long long)out[0].shape[0], (long long)out[1].shape[0]);
                CHECK(ngot + out[0].shape[0] <= 2048, "too many rows");
                for (int64_t k = 0; k < out[0].shape[0]; k++) {
                        got_pred[ngot + k] = ((int64_t *)out[0].data)[k];
                        for (int t = 0; t < 4; t++)
                                got_tok[(ngot + k) * 4 + t] =
                                        t < out[1].shape[1]
                                                ? ((int32_t *)out[1].data)[k * out[1].shape[1] + t]
                                                : PAD;
                }
                ngot += out[0].shape[0];
                if (a->loop)
                        free(out[0].data);
                size_t on;
                const deval_bytes *oi;
                CHECK_OK(deval_gather_objects_for_metrics(g, (size_t)n, items, &o, &on, &oi), g);
                for (size_t k = 0; k < on && nnames < 2048; k++, nnames++)
                        snprintf(got_name[nnames], 16, "%.*s", (int)oi[k].len,
                                 (const char *)oi[k].data);
        }
        CHECK_OK(a->loop ? deval_eval_replay_done(g) : deval_eval_end(g), g);

        int64_t want = expected_count(a->sampler, a->N, world);
        CHECK(ngot == want, "%s, N=%lld, %d ranks: %lld rows, want %lld", sampler_names[a->sampler],
              (long long)a->N, world, (long long)ngot, (long long)want);
        CHECK(nnames == want, "%lld names, want %lld", (long long)nnames, (long long)want);
        for (int64_t i = 0; i < want; i++) {
                char name[16];
                CHECK(got_pred[i] == 7 * i % 13, "%s: row %lld is not sample %lld",
                      sampler_names[a->sampler], (long long)i, (long long)i);
                for (int t = 0; t < 4; t++)
                        CHECK(got_tok[i * 4 + t] == (t < 1 + i % 4 ? i * 10 + t : PAD),
                              "sample %lld token %d", (long long)i, t);
                snprintf(name, sizeof(name), "s%lld", (long long)i);
                CHECK(strcmp(got_name[i], name) == 0, "name %lld is %s", (long long)i, got_name[i]);
        }
        free(mine);
        free(got_pred);
        free(got_tok);
        free(got_name);
        deval_leave(g);
        return 0;
}

static void run_passes(int sampler) {
        static const int64_t lengths[] = {82, 99, 512};
        for (int loop = 0; loop < 2; loop++)
                for (size_t l = 0; l < 3; l++)
                        for (int world = 2; world <= 4; world++) {
                                PassArgs a = {.sampler = sampler, .N = lengths[l], .loop = loop};
                                assert_int_equal(harness_run(&H, world, rank_pass, &a, 60), 0);
                        }
}

/*
 * Rank 0 has one batch, rank 1 three: rank 0 ends the pass first and devald answers rank 1's
 * pad, tensor and object gathers for it; rank 0 then replays those two batches on empty
 * inputs and has seen all 8 samples too. Then: a pass that returns fewer samples than
 * num_samples fails deval_eval_complete() on every rank, and a reduce that devald cannot
 * answer for a finished rank fails rank 1's call and, at the close, rank 0's eval_end too.
 */
typedef enum {
        UNEVEN_OK,
        UNEVEN_SHORT,
        UNEVEN_REDUCE
} UnevenCase;

/* One batch of the loop body: pad, gather_for_metrics, objects; n rows from sample first. */
static int uneven_body(deval_group *g, int b, int n, int first, int64_t *seen) {
        float x[2][3];
        for (int k = 0; k < n; k++)
                for (int t = 0; t < 3; t++)
                        x[k][t] = (float)(first + k) + 0.25f * (float)t;
        deval_tensor in = {.data = x, .dtype = DEVAL_F32, .ndim = 2, .shape = {n, 3}, .device = -1};
        deval_tensor out, padded;
        if (b > 0) { /* pad_across_processes is answered for the finished rank too */
                CHECK_OK(deval_pad_across_processes(g, &in, 1, -1.0, false, &padded), g);
                CHECK(padded.shape[0] == n && padded.shape[1] == 3, "padded to %lldx%lld",
                      (long long)padded.shape[0], (long long)padded.shape[1]);
        }
        CHECK_OK(deval_gather_for_metrics(g, 1, &in, NULL, &out), g);
        int64_t expect_rows = b > 0 ? 2 : 4;
        CHECK(out.shape[0] == expect_rows, "batch %d: %lld rows, want %lld", b,
              (long long)out.shape[0], (long long)expect_rows);
        for (int64_t k = 0; k < out.shape[0]; k++, (*seen)++)
                CHECK(((float *)out.data)[k * 3] == (float)*seen, "row %lld is %g",
                      (long long)*seen, (double)((float *)out.data)[k * 3]);
        char name[2][24];
        deval_bytes item[2];
        for (int k = 0; k < n; k++) {
                snprintf(name[k], sizeof(name[k]), "n%d", first + k);
                item[k] = (deval_bytes){name[k], strlen(name[k])};
        }
        size_t on;
        const deval_bytes *oi;
        CHECK_OK(deval_gather_objects_for_metrics(g, (size_t)n, item, NULL, &on, &oi), g);
        CHECK(on == (size_t)expect_rows, "%zu objects", on);
        char want[24];
        snprintf(want, sizeof(want), "n%lld", (long long)(*seen - (int64_t)on));
        CHECK(oi[0].len == strlen(want) && memcmp(oi[0].data, want, oi[0].len) == 0,
              "first object of batch %d", b);
        return 0;
}

static int rank_uneven(const Harness *h, int rank, int world, void *arg) {
        UnevenCase c = *(const UnevenCase *)arg;
        deval_group *g;
        (void)world;
        CHECK_OK(harness_join(h, "uneven", rank, 2, 10000, &g), NULL);
        /* rank order: rank 0 holds samples 0-1, rank 1 samples 2-7, two per batch */
        int nb = rank == 0 ? 1 : 3, first = rank == 0 ? 0 : 2;
        int64_t num = c == UNEVEN_SHORT ? 9 : 8, seen = 0;
        CHECK_OK(deval_eval_begin(g, num, DEVAL_ORDER_RANK), g);
        for (int b = 0; b < nb; b++) {
                CHECK_OK(deval_eval_batch(g), g);
                if (uneven_body(g, b, 2, first + 2 * b, &seen))
                        return 1;
        }
        if (c == UNEVEN_REDUCE && rank == 1) {
                double v = 1.0;
                deval_tensor t = {.data = &v, .dtype = DEVAL_F64, .ndim = 0, .device = -1};
                int r = deval_reduce(g, &t, DEVAL_SUM);
                CHECK(r == DEVAL_EMISMATCH, "reduce -> %s", deval_strerror(r));
                CHECK(strstr(deval_errmsg(g), "ended its eval pass"), "%s", deval_errmsg(g));
        }
        int r = deval_eval_complete(g);
        if (c == UNEVEN_OK) {
                CHECK(r == 0, "eval_complete -> %s: %s", deval_strerror(r), deval_errmsg(g));
                int64_t missed = deval_eval_missed(g);
                CHECK(missed == (rank == 0 ? 2 : 0), "rank %d missed %lld batches", rank,
                      (long long)missed);
                for (int b = nb; b < nb + missed; b++) {
                        CHECK_OK(deval_eval_batch(g), g);
                        if (uneven_body(g, b, 0, 0, &seen))
                                return 1;
                }
                CHECK_OK(deval_eval_replay_done(g), g);
                CHECK(seen == 8, "rank %d saw %lld samples", rank, (long long)seen);
        } else {
                CHECK(r == DEVAL_EMISMATCH, "eval_complete -> %s", deval_strerror(r));
                const char *want = c == UNEVEN_SHORT ? "returned 8 of its 9 samples"
                                                     : "failed after this rank ended the pass";
                CHECK(strstr(deval_errmsg(g), want), "%s", deval_errmsg(g));
        }
        /* the group goes on: a collective after the pass, on both ranks alike */
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_metrics_uneven_loaders(void **state) {
        (void)state;
        for (UnevenCase c = UNEVEN_OK; c <= UNEVEN_REDUCE; c++)
                assert_int_equal(harness_run(&H, 2, rank_uneven, &c, 30), 0);
}

static void test_metrics_even_batches(void **state) {
        (void)state;
        run_passes(ACCEL_EVEN);
}

static void test_metrics_uneven_batches(void **state) {
        (void)state;
        run_passes(ACCEL_UNEVEN);
}

static void test_metrics_drop_last(void **state) {
        (void)state;
        run_passes(ACCEL_DROP_LAST);
        run_passes(DIST_DROP_LAST);
}

static void test_metrics_iterable(void **state) {
        (void)state;
        run_passes(ITERABLE);
}

static void test_metrics_distributed_sampler(void **state) {
        (void)state;
        run_passes(DIST_SAMPLER);
}

/* Accelerate's test_gather, test_gather_object, test_broadcast, test_pad_across_processes,
 * test_reduce_sum / mean / max, on 2 ranks. */
static int rank_ops(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "ops", rank, world, 10000, &g), NULL);
        float t[3];
        for (int i = 0; i < 3; i++)
                t[i] = (float)(rank * 3 + i + 1);
        deval_tensor in = {.data = t, .dtype = DEVAL_F32, .ndim = 1, .shape = {3}, .device = -1},
                     out;
        CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
        CHECK(out.shape[0] == 3 * world, "gather size");
        for (int i = 0; i < 3 * world; i++)
                CHECK(((float *)out.data)[i] == i + 1, "gather value %d", i);

        char obj[8];
        snprintf(obj, sizeof(obj), "%d", rank);
        deval_bytes item = {obj, strlen(obj)};
        size_t on;
        const deval_bytes *oi;
        CHECK_OK(deval_gather_objects(g, 1, &item, NULL, &on, &oi), g);
        CHECK(on == (size_t)world, "gather_object size");
        for (int r = 0; r < world; r++)
                CHECK(oi[r].len == 1 && ((const char *)oi[r].data)[0] == '0' + r, "object %d", r);

        CHECK_OK(deval_broadcast(g, &in, 0), g);
        for (int i = 0; i < 3; i++)
                CHECK(t[i] == i + 1, "broadcast value %d", i);

        float p[3 * 10];
        for (int i = 0; i < (rank + 1) * 10; i++)
                p[i] = 1.0f + (float)i;
        deval_tensor pin = {
                .data = p, .dtype = DEVAL_F32, .ndim = 2, .shape = {rank + 1, 10}, .device = -1};
        CHECK_OK(deval_pad_across_processes(g, &pin, 0, 0, false, &out), g);
        CHECK(out.shape[0] == world && out.shape[1] == 10, "padded size");
        for (int i = (rank + 1) * 10; i < world * 10; i++)
                CHECK(((float *)out.data)[i] == 0.0f, "padding");
        CHECK(memcmp(out.data, p, sizeof(float) * (size_t)(rank + 1) * 10) == 0, "padded data");

        float rs[2] = {(float)(rank * 2 + 1), (float)(rank * 2 + 2)};
        deval_tensor rt = {.data = rs, .dtype = DEVAL_F32, .ndim = 1, .shape = {2}, .device = -1};
        CHECK_OK(deval_reduce(g, &rt, DEVAL_SUM), g);
        CHECK(rs[0] == 4 && rs[1] == 6, "sum %g %g", rs[0], rs[1]);
        rs[0] = (float)(rank * 2 + 1);
        rs[1] = (float)(rank * 2 + 2);
        CHECK_OK(deval_reduce(g, &rt, DEVAL_MEAN), g);
        CHECK(rs[0] == 2 && rs[1] == 3, "mean %g %g", rs[0], rs[1]);
        rs[0] = (float)(rank * 2 + 1);
        rs[1] = (float)(rank * 2 + 2);
        CHECK_OK(deval_reduce(g, &rt, DEVAL_MAX), g);
        CHECK(rs[0] == 3 && rs[1] == 4, "max %g %g", rs[0], rs[1]);
        deval_leave(g);
        return 0;
}

static void test_ops_like_accelerate(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_ops, NULL, 20), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_ops_like_accelerate),
                cmocka_unit_test(test_metrics_even_batches),
                cmocka_unit_test(test_metrics_uneven_batches),
                cmocka_unit_test(test_metrics_drop_last),
                cmocka_unit_test(test_metrics_iterable),
                cmocka_unit_test(test_metrics_distributed_sampler),
                cmocka_unit_test(test_metrics_uneven_loaders),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
