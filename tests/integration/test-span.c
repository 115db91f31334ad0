/* SPDX-License-Identifier: MIT */
/*
 * test-span.c - groups that span "nodes", with forked ranks and a real devald, and an engine
 * between the leaders made of shared memory (the tests' own; tests/python/test_span.py runs
 * the real ones, MPI and gloo). It runs in every build the suites run in, so the sanitizers
 * see span.c: the sequence of span-seq.c against a flat group byte for byte, in several
 * layouts; an engine that fails or stops on one node; an engine that garbles what it carries;
 * ranks that disagree on the layout.
 */
#define _GNU_SOURCE
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "deval.h"

#include "gpu.h"
#include "harness.h"
#include "span-engine.h"
#include "span-seq.h"

static int rank_compare(const Harness *h, int rank, int world, void *arg) {
        const Span *sp = arg;
        deval_group *g, *flat;
        CHECK_OK(span_join(h, sp, rank, world, &g), NULL);
        int node, nodes = deval_nodes(g, &node);
        CHECK(node == sp->layout[rank] && nodes >= 2, "node %d of %d", node, nodes);
        CHECK(deval_rank(g) == rank && deval_world_size(g) == world, "rank %d of %d", deval_rank(g),
              deval_world_size(g));
        SpanLog a = {0}, b = {0};
        span_seq(g, &a, rank, world, true);
        CHECK_OK(harness_join(h, sp->name, rank, world, 30000, &flat), NULL);
        span_seq(flat, &b, rank, world, false);
        char why[160];
        CHECK(span_seq_diff(&a, &b, why, sizeof(why)) == 0, "rank %d: %s", rank, why);
        CHECK(a.entries > 60 && a.failed < 3, "%d entries, %d failed", a.entries, a.failed);
        span_log_free(&a);
        span_log_free(&b);
        CHECK_OK(deval_leave(g), NULL);
        CHECK_OK(deval_leave(flat), NULL);
        return 0;
}

static void run_layout(const int *layout, int world, const char *name) {
        Harness h;
        harness_start(&h, NULL);
        span_engine_reset();
        Span sp = {.layout = layout, .timeout_ms = 30000, .name = name};
        assert_int_equal(harness_run(&h, world, rank_compare, &sp, 240), 0);
        harness_stop(&h);
}

static void test_two_by_two(void **state) {
        (void)state;
        run_layout((const int[]){0, 0, 1, 1}, 4, "span22");
}

static void test_three_nodes(void **state) {
        (void)state;
        run_layout((const int[]){0, 1, 1, 2}, 4, "span3");
}

static void test_interleaved(void **state) {
        (void)state;
        run_layout((const int[]){1, 0, 1, 0, 0}, 5, "spanil");
}

/* CUDA tensors in a spanning group (the GPU table's fake): staged through host memory, the
 * results host views, reduce and broadcast written back to the device */
static int rank_device(const Harness *h, int rank, int world, void *arg) {
        const Span *sp = arg;
        deval_group *g;
        setenv("DEVAL_GPU_FAKE", "2", 1);
        CHECK_OK(span_join(h, sp, rank, world, &g), NULL);
        int dev = rank % 2;
        int64_t rows = 1 + rank, cols = 2 + rank;
        float host[64];
        for (int i = 0; i < rows * cols; i++)
                host[i] = (float)(rank * 100 + i);
        DvDevPtr d, dv;
        CHECK(dv_gpu()->alloc(dev, sizeof(host), &d) == 0 &&
                      dv_gpu()->copy_to_device(dev, d, host, sizeof(host)) == 0,
              "fake alloc");
        deval_tensor in = {.data = (void *)(uintptr_t)d,
                           .dtype = DEVAL_F32,
                           .ndim = 2,
                           .shape = {rows, cols},
                           .device = dev};
        deval_tensor out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.pad_value = -1;
        CHECK_OK(deval_gather(g, 1, &in, &o, &out), g);
        CHECK(out.device == -1 && out.shape[1] == 1 + world, "a host view of width %lld",
              (long long)out.shape[1]);
        int64_t k = 0;
        for (int r = 0; r < world; r++)
                for (int64_t i = 0; i < 1 + r; i++, k++)
                        for (int64_t j = 0; j < 1 + world; j++) {
                                float want = j < 2 + r ? (float)(r * 100 + i * (2 + r) + j) : -1;
                                CHECK(((float *)out.data)[k * (1 + world) + j] == want,
                                      "(%lld, %lld)", (long long)k, (long long)j);
                        }
        double v[2] = {rank + 1.0, -1.0};
        CHECK(dv_gpu()->alloc(dev, sizeof(v), &dv) == 0 &&
                      dv_gpu()->copy_to_device(dev, dv, v, sizeof(v)) == 0,
              "fake alloc");
        deval_tensor t = {.data = (void *)(uintptr_t)dv,
                          .dtype = DEVAL_F64,
                          .ndim = 1,
                          .shape = {2},
                          .device = dev};
        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
        CHECK(dv_gpu()->copy_to_host(dev, v, dv, sizeof(v)) == 0, "copy");
        CHECK(v[0] == world * (world + 1) / 2.0 && v[1] == -world, "sum %g %g", v[0], v[1]);
        v[0] = rank;
        CHECK(dv_gpu()->copy_to_device(dev, dv, v, sizeof(v)) == 0, "copy");
        CHECK_OK(deval_broadcast(g, &t, world - 1), g);
        CHECK(dv_gpu()->copy_to_host(dev, v, dv, sizeof(v)) == 0, "copy");
        CHECK(v[0] == world - 1, "broadcast %g", v[0]);
        dv_gpu()->free(dev, d);
        dv_gpu()->free(dev, dv);
        CHECK_OK(deval_leave(g), NULL);
        return 0;
}

static void test_device_tensors_staged(void **state) {
        (void)state;
#ifndef DEVAL_FAKE_GPU
        skip(); /* a build without the GPU table's fake */
#endif
        Harness h;
        harness_start(&h, NULL);
        span_engine_reset();
        Span sp = {.layout = (const int[]){0, 1, 1}, .timeout_ms = 30000, .name = "spandev"};
        assert_int_equal(harness_run(&h, 3, rank_device, &sp, 60), 0);
        harness_stop(&h);
}

/* Gathers in a loop until one fails: every rank must fail, in time, saying why. */
static int rank_until_failure(const Harness *h, int rank, int world, void *arg) {
        const Span *sp = arg;
        deval_group *g;
        CHECK_OK(span_join(h, sp, rank, world, &g), NULL);
        double t0 = harness_now();
        int r = 0, i;
        for (i = 0; i < 400 && r == 0; i++) {
                if (span_shm->mode == FAIL_RANK_DIES && rank == 3 && i == span_shm->round)
                        _exit(0); /* as a killed rank: its socket closes */
                int64_t v[64];
                for (int k = 0; k < 64; k++)
                        v[k] = rank * 1000 + k + i;
                deval_tensor t = {.data = v,
                                  .dtype = DEVAL_I64,
                                  .ndim = 1,
                                  .shape = {1 + i % 64},
                                  .device = -1};
                deval_tensor out;
                r = deval_gather(g, 1, &t, NULL, &out);
                for (int64_t k = 0; r == 0 && span_shm->mode != FAIL_GARBLE && k < out.shape[0];
                     k++)
                        CHECK(((int64_t *)out.data)[k] % 1000 == (k % (1 + i % 64)) + i,
                              "step %d: row %lld", i, (long long)k);
        }
        if (span_shm->mode == FAIL_GARBLE) { /* whatever came through, nothing crashed or hung */
                fprintf(stderr, "rank %d: %d steps, then %s: %s\n", rank, i, deval_strerror(r),
                        r ? deval_errmsg(g) : "");
                deval_leave(g);
                return 0;
        }
        CHECK(r < 0, "rank %d: no failure in %d steps", rank, i);
        CHECK(harness_now() - t0 < sp->timeout_ms / 1e3 + 20, "took %.1f s", harness_now() - t0);
        const char *msg = deval_errmsg(g);
        fprintf(stderr, "rank %d: %s at step %d: %s\n", rank, deval_strerror(r), i - 1, msg);
        CHECK(strstr(msg, "node 1") != NULL, "rank %d: %s: %s", rank, deval_strerror(r), msg);
        if (span_shm->mode == FAIL_RANK_DIES) /* every other rank, on both nodes, names it */
                CHECK(r == DEVAL_EPEER && strstr(msg, "rank 3") && strstr(msg, "node 1"),
                      "rank %d: %s: %s", rank, deval_strerror(r), msg);
        else if (sp->layout[rank] == 1 && span_shm->mode == FAIL_ERROR) /* the engine's words */
                CHECK(r == DEVAL_EPEER && strstr(msg, "the cable is cut"), "rank %d: %s: %s", rank,
                      deval_strerror(r), msg);
        else if (sp->layout[rank] != 1) /* this engine's failed leader posts nothing */
                CHECK(r == DEVAL_ETIMEDOUT && strstr(msg, "node 1 did not answer") &&
                              strstr(msg, "the join's timeout; set timeout_ms"),
                      "rank %d: %s: %s", rank, deval_strerror(r), msg);
        /* the failure sticks */
        CHECK(deval_barrier(g) == r, "rank %d: a later call", rank);
        deval_leave(g);
        return 0;
}

static void run_failure(int mode, int round, int timeout_ms, int expect_failed) {
        Harness h;
        harness_start(&h, NULL);
        span_engine_reset();
        span_shm->mode = mode;
        span_shm->node = 1;
        span_shm->round = round;
        const int layout[] = {0, 0, 1, 1};
        Span sp = {.layout = layout, .timeout_ms = timeout_ms, .name = "spanfail"};
        int failed = harness_run(&h, 4, rank_until_failure, &sp, 120);
        assert_int_equal(failed, expect_failed);
        harness_stop(&h);
}

/* rank 3 (node 1) dies: its leader learns it from devald, node 0 from that leader */
static void test_rank_dies_on_the_other_node(void **state) {
        (void)state;
        run_failure(FAIL_RANK_DIES, 9, 20000, 0);
}

/* node 1's engine fails: node 1's ranks return its words, node 0's time out naming node 1 */
static void test_engine_fails_on_one_node(void **state) {
        (void)state;
        run_failure(FAIL_ERROR, 9, 2000, 0);
}

/* node 1's leader stops answering: node 0 times out naming it, in about the timeout; node 1
 * hears its leader's own failure when it wakes */
static void test_node_stops_answering(void **state) {
        (void)state;
        run_failure(FAIL_SILENT, 9, 2000, 0);
}

/* the engine flips bytes of what it carries: every call returns, nothing crashes, and no
 * result is planned past the smallest limit any rank set */
static void test_garbled_engine(void **state) {
        (void)state;
        setenv("DEVAL_SPAN_MAX_BYTES", "67108864", 1);
        for (int round = 3; round < 40; round += 6) /* each run ends at its first damage */
                run_failure(FAIL_GARBLE, round, 3000, 0);
        unsetenv("DEVAL_SPAN_MAX_BYTES");
}

/* two ranks say they are rank 1: every rank refuses the layout */
static int rank_twice(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        char name[64];
        snprintf(name, sizeof(name), "spantwice-%d", (int)getppid());
        deval_group *g = NULL;
        int r = span_join_named(h, name, rank < 2 ? 0 : 1, 2, rank == 2 ? 1 : rank, world, rank % 2,
                                2, 10000, &g);
        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(NULL), "rank 1 joined twice"),
              "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(NULL));
        CHECK(g == NULL, "a handle on failure");
        return 0;
}

static void test_rank_twice(void **state) {
        (void)state;
        Harness h;
        harness_start(&h, NULL);
        span_engine_reset();
        assert_int_equal(harness_run(&h, 4, rank_twice, NULL, 60), 0);
        harness_stop(&h);
}

/* A node group's join fails (over devald's quota): the message names the group the user
 * joined, and the node's part of it by the name devald knows. */
static int rank_over_quota(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        char name[64], want[256];
        snprintf(name, sizeof(name), "spanquota-%d", (int)getppid());
        snprintf(want, sizeof(want), "group '%s' (node %d's part of it, '%s.n%d') needs", name,
                 rank, name, rank);
        deval_group *g = NULL;
        int r = span_join_named(h, name, rank, world, rank, world, 0, 1, 10000, &g);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(NULL), want), "rank %d: %s: %s", rank,
              deval_strerror(r), deval_errmsg(NULL));
        CHECK(g == NULL, "a handle on failure");
        return 0;
}

static void test_join_failure_names_the_group(void **state) {
        (void)state;
        Harness h;
        const char *const extra[] = {"--max-group-bytes", "4096", NULL};
        harness_start(&h, extra);
        span_engine_reset();
        assert_int_equal(harness_run(&h, 2, rank_over_quota, NULL, 60), 0);
        harness_stop(&h);
}

static void test_bad_arguments(void **state) {
        (void)state;
        deval_group *g = NULL;
        deval_engine eng = {DEVAL_ENGINE_INIT, .nodes = 2, .node = 2, .ctx = span_shm,
                            .allgather = span_engine_allgather};
        assert_int_equal(deval_join_spanning("x", 0, 4, 0, 2, NULL, &eng, &g), DEVAL_EINVAL);
        assert_non_null(strstr(deval_errmsg(NULL), "node 2 of 2"));
        eng.node = 0;
        eng.allgather = NULL;
        assert_int_equal(deval_join_spanning("x", 0, 4, 0, 2, NULL, &eng, &g), DEVAL_EINVAL);
        assert_non_null(strstr(deval_errmsg(NULL), "no allgather"));
        eng.allgather = span_engine_allgather;
        eng.size = 0;
        assert_int_equal(deval_join_spanning("x", 0, 4, 0, 2, NULL, &eng, &g), DEVAL_EINVAL);
        eng.size = sizeof(eng);
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .on_device = 1};
        assert_int_equal(deval_join_spanning("x", 0, 4, 0, 2, &o, &eng, &g), DEVAL_ENOTSUP);
        assert_null(g);
        char long_name[80];
        memset(long_name, 'n', sizeof(long_name) - 1);
        long_name[62] = '\0'; /* with ".n0", past 63 bytes */
        assert_int_equal(deval_join_spanning(long_name, 0, 4, 0, 2, NULL, &eng, &g), DEVAL_EINVAL);
        assert_non_null(strstr(deval_errmsg(NULL), "too long"));
        assert_int_equal(deval_nodes(NULL, NULL), DEVAL_EINVAL);
}

int main(void) {
        if (span_engine_setup() < 0)
                return 1;
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_join_failure_names_the_group),
                cmocka_unit_test(test_two_by_two),
                cmocka_unit_test(test_three_nodes),
                cmocka_unit_test(test_interleaved),
                cmocka_unit_test(test_device_tensors_staged),
                cmocka_unit_test(test_rank_dies_on_the_other_node),
                cmocka_unit_test(test_engine_fails_on_one_node),
                cmocka_unit_test(test_node_stops_answering),
                cmocka_unit_test(test_garbled_engine),
                cmocka_unit_test(test_rank_twice),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
