/* SPDX-License-Identifier: MIT */
/*
 * test-device.c - tensors that live on a CUDA device, on the host backend: staged through
 * host memory on the way in, written back for reduce and broadcast. Runs against the GPU
 * table's fake ($DEVAL_GPU_FAKE: "device memory" in host memory), so it needs no GPU; a
 * machine with one runs the same calls for real in tests/gpu. Without the fake and without a
 * CUDA driver, a device tensor is refused with DEVAL_ENOTSUP naming the missing driver.
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
#include <unistd.h>

#include "gpu.h"
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

/* A device copy of host data, on device dev of the fake. */
static void *to_device(int dev, const void *src, size_t bytes) {
        DvDevPtr p;
        if (dv_gpu()->alloc(dev, bytes, &p) < 0 || dv_gpu()->copy_to_device(dev, p, src, bytes) < 0)
                return NULL;
        return (void *)(uintptr_t)p;
}

static int rank_device(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        setenv("DEVAL_GPU_FAKE", "2", 1);
        deval_group *g;
        CHECK_OK(harness_join(h, "device", rank, world, 10000, &g), NULL);
        int dev = rank % 2;
        /* a ragged gather of a device tensor next to a host one, in one collective */
        int64_t rows = 2 + rank, cols = 3 + rank;
        float host[64];
        for (int i = 0; i < rows * cols; i++)
                host[i] = (float)(rank * 100 + i);
        int32_t ids[8];
        for (int i = 0; i < rows; i++)
                ids[i] = rank * 10 + i;
        void *d = to_device(dev, host, sizeof(float) * (size_t)(rows * cols));
        CHECK(d, "fake alloc");
        deval_tensor in[2] = {
                {.data = d, .dtype = DEVAL_F32, .ndim = 2, .shape = {rows, cols}, .device = dev},
                {.data = ids, .dtype = DEVAL_I32, .ndim = 1, .shape = {rows}, .device = -1},
        };
        deval_tensor out[2];
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.pad_value = -1;
        CHECK_OK(deval_gather(g, 2, in, &o, out), g);
        CHECK(out[0].device == -1, "results are host views");
        int64_t k = 0, width = 2 + world;
        for (int r = 0; r < world; r++)
                for (int64_t i = 0; i < 2 + r; i++, k++) {
                        CHECK(((int32_t *)out[1].data)[k] == r * 10 + i, "id %lld", (long long)k);
                        for (int64_t j = 0; j < width; j++) {
                                float want = j < 3 + r ? (float)(r * 100 + i * (3 + r) + j) : -1;
                                CHECK(((float *)out[0].data)[k * width + j] == want, "(%lld, %lld)",
                                      (long long)k, (long long)j);
                        }
                }
        /* reduce and broadcast write back into device memory */
        double v[2] = {rank + 1.0, -1.0};
        void *dv = to_device(dev, v, sizeof(v));
        deval_tensor t = {.data = dv, .dtype = DEVAL_F64, .ndim = 1, .shape = {2}, .device = dev};
        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
        CHECK(dv_gpu()->copy_to_host(dev, v, (DvDevPtr)(uintptr_t)dv, sizeof(v)) == 0, "copy");
        CHECK(v[0] == world * (world + 1) / 2.0 && v[1] == -world, "sum %g %g", v[0], v[1]);
        v[0] = rank;
        dv_gpu()->copy_to_device(dev, (DvDevPtr)(uintptr_t)dv, v, sizeof(v));
        CHECK_OK(deval_broadcast(g, &t, world - 1), g);
        dv_gpu()->copy_to_host(dev, v, (DvDevPtr)(uintptr_t)dv, sizeof(v));
        CHECK(v[0] == world - 1, "broadcast %g", v[0]);
        /* a device that does not exist is a bad argument, caught before anything is sent */
        t.device = 7;
        CHECK(deval_reduce(g, &t, DEVAL_SUM) == DEVAL_EINVAL, "device 7");
        CHECK(strstr(deval_errmsg(g), "device 7"), "'%s'", deval_errmsg(g));
        CHECK_OK(deval_barrier(g), g);
        dv_gpu()->free(dev, (DvDevPtr)(uintptr_t)d);
        dv_gpu()->free(dev, (DvDevPtr)(uintptr_t)dv);
        deval_leave(g);
        return 0;
}

static void test_device_tensors_staged(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_device, NULL, 20), 0);
}

static int rank_no_driver(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        unsetenv("DEVAL_GPU_FAKE");
        deval_group *g;
        CHECK_OK(harness_join(h, "nodriver", rank, world, 10000, &g), NULL);
        float x = 1;
        deval_tensor t = {.data = &x, .dtype = DEVAL_F32, .ndim = 0, .device = 0};
        int r = deval_reduce(g, &t, DEVAL_SUM);
        if (dv_gpu()->init() == 0) { /* a machine with a driver: tests/gpu covers it */
                deval_leave(g);
                return 0;
        }
        CHECK(r == DEVAL_ENOTSUP && strstr(deval_errmsg(g), "CUDA"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        CHECK_OK(deval_barrier(g), g); /* nothing was sent: the group is in step */
        deval_leave(g);
        return 0;
}

static void test_without_driver(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_no_driver, NULL, 20), 0);
}

/* ---- device groups: devald --backend cuda, on the fake's two "GPUs" ---------------------- */

static int before_cuda(void **state) {
        (void)state;
        harness_stop(&H);
        setenv("DEVAL_GPU_FAKE", "2", 1); /* devald inherits it */
        const char *extra[] = {"--backend", "cuda", NULL};
        harness_start(&H, extra);
        return 0;
}

static int after_cuda(void **state) {
        (void)state;
        harness_stop(&H);
        unsetenv("DEVAL_GPU_FAKE");
        harness_start(&H, NULL);
        return 0;
}

static int join_on(const Harness *h, const char *group, int rank, int world, int device,
                   deval_group **g) {
        char name[64];
        deval_join_opts o = {
                .socket_path = h->socket, .timeout_ms = 10000, .on_device = 1, .device = device};
        snprintf(name, sizeof(name), "%s-%d", group, (int)getppid());
        return deval_join(name, rank, world, &o, g);
}

static int rank_device_group(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        int dev = rank % 2;
        deval_group *g;
        CHECK_OK(join_on(h, "devgroup", rank, world, dev, &g), NULL);
        for (int round = 0; round < 2; round++) {
                /* round 1 is large enough to grow the device arenas */
                int64_t rows = (round ? 3000 : 2) + rank, cols = 3 + rank;
                size_t bytes = sizeof(float) * (size_t)(rows * cols);
                float *host = malloc(bytes);
                for (int64_t i = 0; i < rows * cols; i++)
                        host[i] = (float)(rank * 1e6 + i);
                /* one tensor on this rank's GPU, one in host memory: both go to the GPU */
                void *d = to_device(dev, host, bytes);
                int64_t *ids = malloc(sizeof(int64_t) * (size_t)rows);
                for (int64_t i = 0; i < rows; i++)
                        ids[i] = rank * 100000 + i;
                deval_tensor in[2] = {
                        {.data = d,
                         .dtype = DEVAL_F32,
                         .ndim = 2,
                         .shape = {rows, cols},
                         .device = dev},
                        {.data = ids, .dtype = DEVAL_I64, .ndim = 1, .shape = {rows}, .device = -1},
                };
                deval_tensor out[2];
                deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                o.pad_value = -1;
                o.order = DEVAL_ORDER_STRIDED;
                CHECK_OK(deval_gather(g, 2, in, &o, out), g);
                CHECK(out[0].device == dev && out[1].device == dev, "results on the rank's GPU");
                int64_t width = 2 + world, total = 0;
                for (int r = 0; r < world; r++)
                        total += (round ? 3000 : 2) + r;
                CHECK(out[0].shape[0] == total && out[0].shape[1] == width, "shape");
                /* read the device views back through the fake driver */
                size_t ob = (size_t)(total * width) * sizeof(float);
                float *o0 = malloc(ob);
                int64_t *o1 = malloc(sizeof(int64_t) * (size_t)total);
                CHECK(dv_gpu()->copy_to_host(dev, o0, (DvDevPtr)(uintptr_t)out[0].data, ob) == 0,
                      "copy");
                dv_gpu()->copy_to_host(dev, o1, (DvDevPtr)(uintptr_t)out[1].data,
                                       sizeof(int64_t) * (size_t)total);
                int64_t k = 0;
                for (int64_t i = 0; k < total; i++)
                        for (int r = 0; r < world; r++) {
                                if (i >= (round ? 3000 : 2) + r)
                                        continue;
                                CHECK(o1[k] == r * 100000 + i, "id of row %lld", (long long)k);
                                for (int64_t j = 0; j < width; j++) {
                                        float want = j < 3 + r ? (float)(r * 1e6 + i * (3 + r) + j)
                                                               : -1.0f;
                                        CHECK(o0[k * width + j] == want, "round %d (%lld, %lld)",
                                              round, (long long)k, (long long)j);
                                }
                                k++;
                        }
                free(o0);
                free(o1);
                free(host);
                free(ids);
                dv_gpu()->free(dev, (DvDevPtr)(uintptr_t)d);
        }
        /* pad_across_processes lands on the GPU too; reduce goes through host memory */
        float p[4] = {1, 2, 3, 4};
        deval_tensor pin = {.data = p,
                            .dtype = DEVAL_F32,
                            .ndim = 1,
                            .shape = {1 + rank},
                            .device = -1},
                     pout;
        CHECK_OK(deval_pad_across_processes(g, &pin, 0, 9, false, &pout), g);
        float pv[4];
        CHECK(pout.device == dev && pout.shape[0] == world, "pad result");
        dv_gpu()->copy_to_host(dev, pv, (DvDevPtr)(uintptr_t)pout.data, sizeof(float) * world);
        for (int i = 0; i < world; i++)
                CHECK(pv[i] == (i <= rank ? p[i] : 9), "pad %d", i);
        int32_t v = rank + 1;
        deval_tensor t = {.data = &v, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
        CHECK(v == world * (world + 1) / 2, "sum %d", v);
        deval_leave(g);
        return 0;
}

static void test_device_group(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_device_group, NULL, 30), 0);
}

/* A GPU that runs out of memory: every rank's step fails with DEVAL_ENOMEM naming it. */
static int rank_gpu_oom(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(join_on(h, "gpuoom", rank, world, 0, &g), NULL);
        float *x = calloc(1 << 20, sizeof(float)); /* 4 MiB: past the fake's 3 MiB */
        deval_tensor t = {.data = x,
                          .dtype = DEVAL_F32,
                          .ndim = 1,
                          .shape = {1 << 20},
                          .device = -1},
                     out;
        int r = deval_gather(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(g), "fake device 0"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        t.shape[0] = 1000; /* and the group goes on */
        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
        /* an output that does not fit on the GPU */
        t.shape[0] = 500000; /* 2 MiB in each of 2 ranks: a 4 MiB result */
        r = deval_gather(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(g), "GPU 0"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        CHECK_OK(deval_barrier(g), g);
        free(x);
        deval_leave(g);
        return 0;
}

static void test_device_out_of_memory(void **state) {
        (void)state;
        setenv("DEVAL_GPU_FAKE_MEM", "3145728", 1);
        before_cuda(state);
        int failed = harness_run(&H, 2, rank_gpu_oom, NULL, 30);
        unsetenv("DEVAL_GPU_FAKE_MEM");
        after_cuda(state);
        assert_int_equal(failed, 0);
}

static int rank_mixed(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g = NULL;
        int r;
        if (rank == 0) {
                r = join_on(h, "mixed", rank, world, 0, &g);
                CHECK(r == DEVAL_ETIMEDOUT || r == DEVAL_EINVAL, "rank 0: %s", deval_strerror(r));
                return 0;
        }
        usleep(200000);
        r = harness_join(h, "mixed", rank, world, 1000, &g);
        CHECK(r == DEVAL_EINVAL && strstr(deval_errmsg(NULL), "GPU"), "got %s: %s",
              deval_strerror(r), deval_errmsg(NULL));
        return 0;
}

static void test_device_group_refuses_host_ranks(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_mixed, NULL, 20), 0);
}

static int rank_host_backend(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        setenv("DEVAL_GPU_FAKE", "2", 1);
        deval_group *g = NULL;
        int r = join_on(h, "hostbackend", rank, world, 0, &g);
        CHECK(r == DEVAL_ENOTSUP && strstr(deval_errmsg(NULL), "--backend cuda"), "got %s: %s",
              deval_strerror(r), deval_errmsg(NULL));
        return 0;
}

static void test_device_group_needs_cuda_backend(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 1, rank_host_backend, NULL, 20), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_device_tensors_staged),
                cmocka_unit_test(test_without_driver),
                cmocka_unit_test(test_device_group_needs_cuda_backend),
                cmocka_unit_test_setup_teardown(test_device_group, before_cuda, after_cuda),
                cmocka_unit_test_setup_teardown(test_device_group_refuses_host_ranks, before_cuda,
                                                after_cuda),
                cmocka_unit_test(test_device_out_of_memory),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
