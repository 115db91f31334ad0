/* SPDX-License-Identifier: MIT */
/*
 * test-kernel.c - the cuda backend's copy kernel body, run on the CPU: for random gather and
 * pad plans it must build exactly what the host backend's executor builds, however the output
 * is split among threads (random chunk sizes, chunks crossing segment boundaries, chunks in
 * any order).
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
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "exec_host.h"
#include "gpu.h"
#include "kernel_plan.h"
#include "plan-cases.h"

/* exec_host() runs on a group; these tests need only its copy-thread settings. */
static Daemon daemon_ = {.threads = 2};
static Group group_ = {.d = &daemon_};

typedef struct {
        Case *c;
        bool pad;
} Src;

static const uint8_t *src_of(void *arg, int rank, int tensor) {
        Src *s = arg;
        return s->c->data[rank * s->c->n + (s->pad ? 0 : tensor)];
}

/* Run the flattened plan in chunks of random sizes, in a shuffled order. */
static void run_kernel_body(const DvPlan *p, Case *c, bool pad, uint8_t *out) {
        DvKernelSeg *segs = calloc(p->nsegs + 1, sizeof(*segs));
        uint64_t *starts = calloc(p->nsegs + 1, sizeof(*starts));
        const uint8_t *srcs[8 * 3];
        dv_kernel_plan(p, pad ? 1 : c->n, pad, segs, starts);
        for (int i = 0; i < c->world * c->n; i++)
                srcs[i] = c->data[i];
        if (pad) /* pad plans read rank k's only tensor: source k */
                for (int k = 0; k < c->world; k++)
                        srcs[k] = c->data[k * c->n];
        uint64_t total = starts[p->nsegs];
        uint64_t chunk = 1 + rnd(300);
        uint64_t nchunks = total ? (total + chunk - 1) / chunk : 0;
        uint64_t *order = malloc(sizeof(*order) * (nchunks + 1));
        for (uint64_t i = 0; i < nchunks; i++)
                order[i] = i;
        for (uint64_t i = nchunks; i > 1; i--) { /* threads finish in any order */
                uint64_t j = rnd((uint32_t)i), t = order[i - 1];
                order[i - 1] = order[j];
                order[j] = t;
        }
        for (uint64_t i = 0; i < nchunks; i++) {
                uint64_t at = order[i] * chunk;
                uint64_t n = total - at < chunk ? total - at : chunk;
                dv_kplan_run(segs, starts, (uint32_t)p->nsegs, at, n, out, srcs);
        }
        free(order);
        free(segs);
        free(starts);
}

static void compare(const DvPlan *p, Case *c, bool pad) {
        uint8_t *a = malloc(p->out_end + 1), *b = malloc(p->out_end + 1);
        /* different garbage in each, so a byte that neither writes would differ */
        memset(a, 0xa5, p->out_end + 1);
        memset(b, 0x5a, p->out_end + 1);
        Src s = {.c = c, .pad = pad};
        ExecJob job = {.plan = p, .src = src_of, .ctx = &s, .out = a};
        exec_host(&group_, &job);
        run_kernel_body(p, c, pad, b);
        for (int i = 0; i < p->nout; i++)
                assert_memory_equal(a + p->out_offset[i], b + p->out_offset[i], p->out_nbytes[i]);
        free(a);
        free(b);
}

static void test_gathers_match_host(void **state) {
        (void)state;
        for (int iter = 0; iter < 3000; iter++) {
                Case c;
                DvPlan p;
                make_case(&c);
                dv_plan_init(&p);
                assert_int_equal(dv_plan_gather(&c.in, &p), 0);
                compare(&p, &c, false);
                dv_plan_deinit(&p);
                case_free(&c);
        }
}

static void test_pads_match_host(void **state) {
        (void)state;
        for (int iter = 0; iter < 1000; iter++) {
                Case c;
                DvPlan p;
                make_case(&c);
                DvShape shapes[8];
                int dim = 0;
                for (int k = 0; k < c.world; k++) /* tensor 0: the same ndim on every rank */
                        shapes[k] = c.shape[k * c.n];
                if (shapes[0].ndim == 0) {
                        case_free(&c);
                        continue;
                }
                dim = (int)rnd((uint32_t)shapes[0].ndim);
                dv_plan_init(&p);
                assert_int_equal(dv_plan_pad(c.world, shapes, dim, rnd(2), -3.0, 0, 1 << 30, &p),
                                 0);
                compare(&p, &c, true);
                dv_plan_deinit(&p);
                case_free(&c);
        }
}

/* Large enough for the host executor's threads and streaming stores. */
static void test_large_plan_matches_host(void **state) {
        (void)state;
        Case c = {.world = 3, .n = 1};
        int64_t valid[3] = {-1, -1, -1};
        for (int k = 0; k < 3; k++) {
                c.shape[k] = (DvShape){DEVAL_F32, 2, {4000 + k, 700 + 3 * k}};
                size_t bytes = (size_t)numel_of(&c.shape[k]) * 4;
                c.data[k] = malloc(bytes);
                fill_random(c.data[k], bytes);
        }
        DvPlanInput in = {.world = 3,
                          .ntensors = 1,
                          .in = c.shape,
                          .valid_rows = valid,
                          .keep_rows = -1,
                          .pad_value = 1.5,
                          .max_out = 1ull << 32};
        DvPlan p;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), 0);
        assert_true(p.out_end >= (8u << 20));
        compare(&p, &c, false);
        dv_plan_deinit(&p);
        case_free(&c);
}

/* The GPU table's fake runs the same body through run_plan(), from "device" pointers. */
static void test_fake_gpu_matches_host(void **state) {
        (void)state;
#ifndef DEVAL_FAKE_GPU
        skip(); /* a build without the fake (-Dfake_gpu=disabled) */
#endif
        setenv("DEVAL_GPU_FAKE", "1", 1);
        const DvGpuApi *gpu = dv_gpu();
        assert_string_equal(gpu->name, "fake");
        assert_int_equal(gpu->init(), 0);
        for (int iter = 0; iter < 500; iter++) {
                Case c;
                DvPlan p;
                make_case(&c);
                dv_plan_init(&p);
                assert_int_equal(dv_plan_gather(&c.in, &p), 0);
                uint8_t *a = calloc(1, p.out_end + 1), *b = calloc(1, p.out_end + 1);
                Src s = {.c = &c};
                ExecJob job = {.plan = &p, .src = src_of, .ctx = &s, .out = a};
                exec_host(&group_, &job);
                DvKernelSeg *segs = calloc(p.nsegs + 1, sizeof(*segs));
                uint64_t *starts = calloc(p.nsegs + 1, sizeof(*starts));
                DvDevPtr srcs[8 * 3];
                dv_kernel_plan(&p, c.n, false, segs, starts);
                for (int i = 0; i < c.world * c.n; i++)
                        srcs[i] = (DvDevPtr)(uintptr_t)c.data[i];
                assert_int_equal(gpu->run_plan(0, segs, starts, (uint32_t)p.nsegs,
                                               (DvDevPtr)(uintptr_t)b, srcs,
                                               (uint32_t)(c.world * c.n)),
                                 0);
                for (int i = 0; i < p.nout; i++)
                        assert_memory_equal(a + p.out_offset[i], b + p.out_offset[i],
                                            p.out_nbytes[i]);
                free(a);
                free(b);
                free(segs);
                free(starts);
                dv_plan_deinit(&p);
                case_free(&c);
        }
        assert_int_equal(gpu->run_plan(5, NULL, NULL, 0, 0, NULL, 0), DEVAL_EINVAL);
        unsetenv("DEVAL_GPU_FAKE");
}

static void test_find(void **state) {
        (void)state;
        uint64_t starts[] = {0, 5, 5, 9, 20};
        assert_int_equal(dv_kseg_find(starts, 4, 0), 0);
        assert_int_equal(dv_kseg_find(starts, 4, 4), 0);
        assert_int_equal(dv_kseg_find(starts, 4, 5), 2); /* segment 1 is empty */
        assert_int_equal(dv_kseg_find(starts, 4, 8), 2);
        assert_int_equal(dv_kseg_find(starts, 4, 19), 3);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_find),
                cmocka_unit_test(test_gathers_match_host),
                cmocka_unit_test(test_pads_match_host),
                cmocka_unit_test(test_large_plan_matches_host),
                cmocka_unit_test(test_fake_gpu_matches_host),
        };
        int r = cmocka_run_group_tests(tests, NULL, NULL);
        exec_pool_free(group_.work.pool);
        return r;
}
