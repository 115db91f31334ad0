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

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu.h"
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
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket, .timeout_ms = 10000,
                             .on_device = 1, .device = device};
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

/*
 * GPUs that cannot read each other's memory ($DEVAL_GPU_FAKE_NOP2P: the fake's kernel then
 * refuses a source on another GPU, as a real one would fault): the workers' test copies
 * find out, and the inputs of the other GPU come through pinned host memory.
 */
static void test_device_group_without_p2p(void **state) {
        setenv("DEVAL_GPU_FAKE_NOP2P", "1", 1);
        before_cuda(state);
        int failed = harness_run(&H, 3, rank_device_group, NULL, 30);
        char out[4096];
        int rc = harness_ctl(&H, "topo --json", out, sizeof(out));
        unsetenv("DEVAL_GPU_FAKE_NOP2P");
        after_cuda(state);
        assert_int_equal(failed, 0);
        assert_int_equal(rc, 0);
        assert_non_null(strstr(out, "\"p2p\":[]"));
}

/*
 * GPUs without POSIX file descriptor handles: arenas go through legacy CUDA IPC handles,
 * wrapped in sealed memfds, to the ranks and to the other GPU's worker
 * ($DEVAL_GPU_FAKE_LEGACY_IPC makes the fake hand out such handles).
 */
static void test_device_group_legacy_ipc(void **state) {
        setenv("DEVAL_GPU_FAKE_LEGACY_IPC", "1", 1);
        before_cuda(state);
        int failed = harness_run(&H, 3, rank_device_group, NULL, 30);
        unsetenv("DEVAL_GPU_FAKE_LEGACY_IPC");
        after_cuda(state);
        assert_int_equal(failed, 0);
}

/*
 * A sticky CUDA error on GPU 1 (the fake's copy kernel "faults" once): the group on GPU 1
 * fails with DEVAL_ESYS naming the GPU, and again on its next call (its device memory went
 * with the worker); a group on GPU 0 and a host group, running all along, never notice;
 * a new group on GPU 1 works, on a new worker process.
 */
static char sticky_file[128];

static int gather_once(deval_group *g, int rank, int dev, int round) {
        int64_t rows = 50 + rank + round % 7;
        float x[64 * 4];
        for (int64_t i = 0; i < rows * 4; i++)
                x[i] = (float)(rank * 1000 + round + i);
        deval_tensor in = {.data = x,
                           .dtype = DEVAL_F32,
                           .ndim = 2,
                           .shape = {rows, 4},
                           .device = dev < 0 ? -1 : dev},
                     out;
        void *d = NULL;
        if (dev >= 0)
                in.data = d = to_device(dev, x, sizeof(float) * (size_t)rows * 4);
        int r = deval_gather(g, 1, &in, NULL, &out);
        if (r == 0) {
                int64_t total = 2 * 50 + 1 + 2 * (round % 7);
                float first[4];
                if (out.shape[0] != total)
                        r = DEVAL_EMISMATCH;
                else if (dev >= 0)
                        dv_gpu()->copy_to_host(dev, first, (DvDevPtr)(uintptr_t)out.data,
                                               sizeof(first));
                else
                        memcpy(first, out.data, sizeof(first));
                if (r == 0 && first[1] != (float)(round + 1))
                        r = DEVAL_EMISMATCH;
        }
        if (d)
                dv_gpu()->free(dev, (DvDevPtr)(uintptr_t)d);
        return r;
}

static int rank_sticky(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        int which = rank / 2, r2 = rank % 2; /* 0: GPU 0, 1: host, 2: GPU 1 */
        deval_group *g;
        if (which == 1)
                CHECK_OK(harness_join(h, "sticky-host", r2, 2, 10000, &g), NULL);
        else
                CHECK_OK(
                        join_on(h, which ? "sticky-gpu1" : "sticky-gpu0", r2, 2, which ? 1 : 0, &g),
                        NULL);
        int dev = which == 0 ? 0 : which == 2 ? 1 : -1;
        if (which == 2) {
                int r = gather_once(g, r2, dev, 0);
                CHECK(r == DEVAL_ESYS && strstr(deval_errmsg(g), "GPU 1") &&
                              strstr(deval_errmsg(g), "sticky"),
                      "got %s: %s", deval_strerror(r), deval_errmsg(g));
                r = gather_once(g, r2, dev, 1);
                CHECK(r == DEVAL_ESYS && strstr(deval_errmsg(g), "restarted"), "got %s: %s",
                      deval_strerror(r), deval_errmsg(g));
                deval_leave(g);
                /* a new group on GPU 1 gets a new worker */
                CHECK_OK(join_on(h, "sticky-gpu1-again", r2, 2, 1, &g), NULL);
                for (int round = 0; round < 20; round++)
                        CHECK_OK(gather_once(g, r2, dev, round), g);
                deval_leave(g);
                return 0;
        }
        /* the others run until well after the fault, and every step must succeed; the
         * pair agrees (a reduce) on when each saw it happen */
        int32_t after = 0;
        for (int round = 0; after < 100; round++) {
                CHECK_OK(gather_once(g, r2, dev, round), g);
                int32_t seen = access(sticky_file, F_OK) != 0;
                deval_tensor t = {.data = &seen, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
                CHECK_OK(deval_reduce(g, &t, DEVAL_MAX), g);
                after += seen;
                CHECK(round < 100000, "the fault never happened");
        }
        deval_leave(g);
        return 0;
}

/*
 * More GPUs than a topology reply once held (16) and than a 32-bit peer mask covers: 40
 * fake ones. deval-ctl topo lists every one, and GPU 39 reads GPU 38 and GPU 0.
 */
static void test_forty_gpus(void **state) {
        (void)state;
        static char out[65536];
        harness_stop(&H);
        setenv("DEVAL_GPU_FAKE", "40", 1);
        const char *extra[] = {"--backend", "cuda", NULL};
        /* 40 GPU worker processes start first: seconds under the sanitizers */
        harness_start_within(&H, extra, 60);
        int rc = harness_ctl(&H, "topo --json", out, sizeof(out));
        after_cuda(state);
        assert_int_equal(rc, 0);
        int n = 0;
        for (const char *p = out; (p = strstr(p, "\"uuid\"")); p++)
                n++;
        if (n != 40)
                fail_msg("deval-ctl topo lists %d GPUs, not 40:\n%.2000s", n, out);
        const char *last = strrchr(out, '{');
        if (!last || !strstr(last, "\"p2p\":[0,") || !strstr(last, ",38]"))
                fail_msg("GPU 39's peers are not 0..38: %s", last ? last : out);
}

static void touch(const char *path) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
}

static void test_sticky_error_contained(void **state) {
        char topo[4096], status[4096];
        snprintf(sticky_file, sizeof(sticky_file), "/tmp/deval-sticky-%d", (int)getpid());
        setenv("DEVAL_GPU_FAKE_STICKY_ONCE", sticky_file, 1);
        /* first the fault hits GPU 1's worker in its P2P test copy, as devald starts: the
         * worker is started again without test copies, and GPU 1 stages what it reads */
        touch(sticky_file);
        before_cuda(state);
        int rc_topo = harness_ctl(&H, "topo --json", topo, sizeof(topo));
        bool probe_faulted = access(sticky_file, F_OK) != 0;
        /* then in a group's copy kernel */
        touch(sticky_file);
        int failed = harness_run(&H, 6, rank_sticky, NULL, 60);
        int rc = harness_ctl(&H, "status", status, sizeof(status));
        bool step_faulted = access(sticky_file, F_OK) != 0;
        unlink(sticky_file);
        unsetenv("DEVAL_GPU_FAKE_STICKY_ONCE");
        after_cuda(state);
        assert_true(probe_faulted);
        assert_int_equal(rc_topo, 0);
        /* GPU 0 proved it reads GPU 1; GPU 1's new worker did not try */
        assert_non_null(strstr(topo, "\"p2p\":[1]}"));
        assert_non_null(strstr(topo, "\"p2p\":[]}"));
        assert_int_equal(failed, 0);
        assert_int_equal(rc, 0);
        assert_true(step_faulted);
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

/*
 * devald's loop never waits for a GPU: with every device allocation taking 400 ms (the fake's
 * $DEVAL_GPU_FAKE_ALLOC_MS), a device group of 2 ranks starts for over a second, during which
 * deval-ctl shows it starting, and a host group that comes later joins and runs 50
 * collectives, all before the device group's join returns; its ranks then grow their device
 * inputs (more slow allocations) while the host group goes on.
 */
typedef struct {
        double host_done;  /* when the host group's ranks finished */
        double device_in;  /* when the device group's join returned */
        double device_out; /* when its ranks finished their large gathers */
        double host_more;  /* when the host group's second round finished */
        int saw_starting;
} SlowTimes;

static SlowTimes *slow;

static int rank_slow_alloc(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g;
        if (rank < 2) { /* the device group */
                CHECK_OK(join_on(h, "slowdev", rank, 2, rank, &g), NULL);
                slow->device_in = harness_now();
                /* large enough to grow each rank's device input: more slow allocations */
                static float x[1 << 18];
                for (int round = 0; round < 2; round++) {
                        deval_tensor in = {.data = to_device(rank, x, sizeof(x)),
                                           .dtype = DEVAL_F32,
                                           .ndim = 1,
                                           .shape = {(int64_t)DV_ARRAY_SIZE(x)},
                                           .device = rank},
                                     out;
                        CHECK(in.data, "fake alloc");
                        CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
                        CHECK(out.shape[0] == 2 * (int64_t)DV_ARRAY_SIZE(x), "rows");
                        dv_gpu()->free(rank, (DvDevPtr)(uintptr_t)in.data);
                }
                slow->device_out = harness_now();
                deval_leave(g);
                return 0;
        }
        usleep(200 * 1000); /* the device group is starting by now */
        if (rank == 2) {
                char out[4096], args[128];
                snprintf(args, sizeof(args), "status");
                CHECK(harness_ctl(h, args, out, sizeof(out)) == 0, "status: %s", out);
                slow->saw_starting = strstr(out, "starting") != NULL;
        }
        CHECK_OK(harness_join(h, "slowhost", rank - 2, 2, 10000, &g), NULL);
        for (int i = 0; i < 50; i++)
                CHECK_OK(deval_barrier(g), g);
        slow->host_done = harness_now();
        while (!slow->device_in)
                usleep(1000);
        for (int i = 0; i < 50; i++) {
                int64_t v = rank;
                deval_tensor t = {.data = &v, .dtype = DEVAL_I64, .ndim = 0, .device = -1};
                CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                CHECK(v == 5, "sum %lld", (long long)v);
        }
        slow->host_more = harness_now();
        deval_leave(g);
        return 0;
}

static void test_slow_gpu_never_stalls_devald(void **state) {
        (void)state;
        slow = mmap(NULL, sizeof(*slow), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(slow != MAP_FAILED);
        memset(slow, 0, sizeof(*slow));
        harness_stop(&H);
        setenv("DEVAL_GPU_FAKE", "2", 1);
        setenv("DEVAL_GPU_FAKE_ALLOC_MS", "400", 1); /* devald's GPU workers inherit it */
        const char *extra[] = {"--backend", "cuda", NULL};
        harness_start(&H, extra);
        unsetenv("DEVAL_GPU_FAKE_ALLOC_MS"); /* the ranks' own fake allocations are quick */
        int failed = harness_run(&H, 4, rank_slow_alloc, NULL, 60);
        after_cuda(state);
        assert_int_equal(failed, 0);
        printf("slow GPU: the host group ran 50 barriers %.3f s before the device group's join "
               "returned\n",
               slow->device_in - slow->host_done);
        assert_true(slow->saw_starting);
        assert_true(slow->host_done < slow->device_in);
        assert_true(slow->host_more > 0 && slow->device_out > 0);
        munmap(slow, sizeof(*slow));
}

/* Is pid gone: no such process, or a zombie nobody reaped yet? */
static bool gone(pid_t pid) {
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f)
                return true;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *p = strrchr(buf, ')');
        return p && p[1] == ' ' && p[2] == 'Z';
}

/* A rank of device group arg: one gather, then another that the test makes hang in the
 * GPU's kernel (the fake's $DEVAL_GPU_FAKE_HANG) until devald is killed under it, or the
 * rank itself. */
static char hang_file[128];

/* devald --backend cuda on 2 fake GPUs whose kernels hang while hang_file (named after tag)
 * exists; it does not yet. */
static void start_hanging_devald(const char *tag) {
        snprintf(hang_file, sizeof(hang_file), "/tmp/deval-test-%s-%d", tag, (int)getpid());
        unlink(hang_file);
        harness_stop(&H);
        setenv("DEVAL_GPU_FAKE", "2", 1);
        setenv("DEVAL_GPU_FAKE_HANG", hang_file, 1); /* devald's GPU workers inherit it */
        const char *extra[] = {"--backend", "cuda", NULL};
        harness_start(&H, extra);
        unsetenv("DEVAL_GPU_FAKE_HANG");
}

static int rank_hang(const Harness *h, int rank, int world, void *arg) {
        deval_group *g;
        CHECK_OK(join_on(h, arg, rank, world, rank, &g), NULL);
        CHECK_OK(gather_once(g, rank, rank, 0), g);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                FILE *f = fopen(hang_file, "w");
                CHECK(f, "cannot create %s", hang_file);
                fclose(f);
        }
        CHECK_OK(deval_barrier(g), g);
        int r = gather_once(g, rank, rank, 1);
        CHECK(r == DEVAL_EDAEMON, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        return 0;
}

/*
 * devald's GPU workers end with devald, even killed while a worker is in a kernel: they
 * watch devald's pidfd. (Not PR_SET_PDEATHSIG, which fires when the thread that forked
 * ends: workers are also restarted from short-lived threads, and the one that
 * test_sticky_error_contained restarts must outlive the thread that started it.)
 */
static void test_workers_end_with_devald(void **state) {
        (void)state;
        start_hanging_devald("hang");
        pid_t workers[8];
        int n = 0;
        DIR *proc = opendir("/proc");
        assert_non_null(proc);
        for (struct dirent *e; (e = readdir(proc)) && n < 8;) {
                char path[300], buf[512];
                snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
                FILE *f = fopen(path, "r");
                if (!f)
                        continue;
                size_t k = fread(buf, 1, sizeof(buf) - 1, f);
                fclose(f);
                buf[k] = '\0';
                const char *p = strrchr(buf, ')');
                int ppid;
                if (p && sscanf(p + 2, "%*c %d", &ppid) == 1 && ppid == H.daemon)
                        workers[n++] = (pid_t)atoi(e->d_name);
        }
        closedir(proc);
        assert_int_equal(n, 2); /* one per fake GPU */
        pid_t runner = fork();
        if (runner == 0)
                _exit(harness_run(&H, 2, rank_hang, (void *)"hang", 30));
        /* the second gather is in the workers' kernels, which wait on the file */
        while (access(hang_file, F_OK) != 0)
                usleep(10000);
        usleep(500000);
        kill(H.daemon, SIGKILL);
        waitpid(H.daemon, NULL, 0);
        H.daemon = 0;
        double t0 = harness_now();
        for (int k = 0; k < n; k++)
                while (!gone(workers[k]) && harness_now() - t0 < 10)
                        usleep(10000);
        double took = harness_now() - t0;
        bool all_gone = true;
        for (int k = 0; k < n; k++)
                all_gone &= gone(workers[k]);
        unlink(hang_file); /* a worker that outlived devald ends its kernel now */
        int st;
        waitpid(runner, &st, 0);
        unlink(H.socket);
        rmdir(H.dir);
        unsetenv("DEVAL_GPU_FAKE");
        harness_start(&H, NULL);
        printf("GPU workers ended %.3f s after devald was killed in their kernels\n", took);
        assert_true(all_gone);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/*
 * A device group whose ranks are killed while its step is in a GPU kernel that does not end
 * (the fake's $DEVAL_GPU_FAKE_HANG): devald's loop does not wait for the group's worker to
 * finish that step. deval-ctl shows the group closing, a host group joins and runs, and once
 * the kernel ends the group is freed.
 */
static int rank_quick(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "quick", rank, world, 10000, &g), NULL);
        for (int i = 0; i < 20; i++)
                CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_group_freed_off_the_loop(void **state) {
        (void)state;
        static char out[16384];
        start_hanging_devald("hangkill");
        pid_t ranks[2];
        for (int k = 0; k < 2; k++)
                if ((ranks[k] = fork()) == 0)
                        _exit(rank_hang(&H, k, 2, (void *)"hangkill"));
        while (access(hang_file, F_OK) != 0)
                usleep(10000);
        usleep(300000); /* both ranks' step is in the kernels now */
        for (int k = 0; k < 2; k++) {
                kill(ranks[k], SIGKILL);
                waitpid(ranks[k], NULL, 0);
        }
        usleep(300000); /* devald saw them go, failed the group and went to free it */
        int rc = harness_ctl(&H, "status", out, sizeof(out));
        bool closing = rc == 0 && strstr(out, "hangkill") && strstr(out, "closing");
        int quick = harness_run(&H, 2, rank_quick, NULL, 20);
        unlink(hang_file); /* the kernels end; the group goes */
        bool freed = false;
        for (int i = 0; i < 500 && !freed; i++) {
                usleep(10000);
                freed = harness_ctl(&H, "status", out, sizeof(out)) == 0 &&
                        !strstr(out, "hangkill");
        }
        after_cuda(state);
        assert_true(closing);
        assert_int_equal(quick, 0);
        assert_true(freed);
}

int main(void) {
#ifndef DEVAL_FAKE_GPU
        fprintf(stderr, "a build without the GPU table's fake (-Dfake_gpu=disabled): skipped\n");
        return 77;
#endif
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_device_tensors_staged),
                cmocka_unit_test(test_without_driver),
                cmocka_unit_test(test_device_group_needs_cuda_backend),
                cmocka_unit_test_setup_teardown(test_device_group, before_cuda, after_cuda),
                cmocka_unit_test_setup_teardown(test_device_group_refuses_host_ranks, before_cuda,
                                                after_cuda),
                cmocka_unit_test(test_device_out_of_memory),
                cmocka_unit_test(test_device_group_without_p2p),
                cmocka_unit_test(test_forty_gpus),
                cmocka_unit_test(test_device_group_legacy_ipc),
                cmocka_unit_test(test_sticky_error_contained),
                cmocka_unit_test(test_slow_gpu_never_stalls_devald),
                cmocka_unit_test(test_workers_end_with_devald),
                cmocka_unit_test(test_group_freed_off_the_loop),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
