/* SPDX-License-Identifier: MIT */
/*
 * test-gpu.c - the copy kernel on a real GPU, through the CUDA driver (never the fake).
 *
 *   test-gpu            device tensors through a real devald ($DEVALD) on 2 ranks, then the
 *                       kernel on random gather plans against its CPU body; exit 77
 *                       (skipped) with the reason when no driver or GPU is there
 *                       and a device group (devald --backend cuda) on GPU 0
 *   test-gpu --bench    ragged gathers of device tensors through devald, 2, 4 and 8 ranks,
 *                       1 to 256 MiB per rank, next to cuMemcpyDtoD of the output in the same
 *                       run, and 4-byte reduce latency; then the copy kernel alone
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "deval.h"

#include "gpu.h"
#include "kernel_plan.h"
#include "plan-cases.h"

static const DvGpuApi *gpu;

#define TRY(call)                                                                     \
        do {                                                                          \
                int _r = (call);                                                      \
                if (_r < 0) {                                                         \
                        fprintf(stderr, "test-gpu: %s: %s\n", #call, dv_gpu_error()); \
                        exit(1);                                                      \
                }                                                                     \
        } while (0)

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Run p on device 0 with sources uploaded from srcs_host; the output comes back in out. */
static void run_on_gpu(const DvPlan *p, int nsrcs, uint8_t *const *srcs_host,
                       const uint64_t *src_bytes, int per_rank, bool pad, uint8_t *out) {
        DvKernelSeg *segs = calloc(p->nsegs + 1, sizeof(*segs));
        uint64_t *starts = calloc(p->nsegs + 1, sizeof(*starts));
        DvDevPtr srcs[64], d_out;
        dv_kernel_plan(p, per_rank, pad, segs, starts);
        for (int i = 0; i < nsrcs; i++) {
                TRY(gpu->alloc(0, src_bytes[i], &srcs[i]));
                TRY(gpu->copy_to_device(0, srcs[i], srcs_host[i], src_bytes[i]));
        }
        TRY(gpu->alloc(0, p->out_end, &d_out));
        TRY(gpu->run_plan(0, segs, starts, (uint32_t)p->nsegs, d_out, srcs, (uint32_t)nsrcs));
        TRY(gpu->copy_to_host(0, out, d_out, p->out_end));
        for (int i = 0; i < nsrcs; i++)
                gpu->free(0, srcs[i]);
        gpu->free(0, d_out);
        free(segs);
        free(starts);
}

static int check_random_plans(void) {
        int bad = 0;
        for (int iter = 0; iter < 300 && !bad; iter++) {
                Case c;
                DvPlan p;
                make_case(&c);
                dv_plan_init(&p);
                if (dv_plan_gather(&c.in, &p) != 0 || p.out_end == 0) {
                        dv_plan_deinit(&p);
                        case_free(&c);
                        continue;
                }
                uint64_t bytes[24];
                for (int i = 0; i < c.world * c.n; i++)
                        bytes[i] =
                                (uint64_t)numel_of(&c.shape[i]) * dv_dtype_size(c.shape[i].dtype);
                uint8_t *a = calloc(1, p.out_end), *b = calloc(1, p.out_end);
                DvKernelSeg *segs = calloc(p.nsegs + 1, sizeof(*segs));
                uint64_t *starts = calloc(p.nsegs + 1, sizeof(*starts));
                dv_kernel_plan(&p, c.n, false, segs, starts);
                dv_kplan_run(segs, starts, (uint32_t)p.nsegs, 0, starts[p.nsegs], a,
                             (const uint8_t *const *)c.data);
                run_on_gpu(&p, c.world * c.n, c.data, bytes, c.n, false, b);
                for (int i = 0; i < p.nout && !bad; i++)
                        if (memcmp(a + p.out_offset[i], b + p.out_offset[i], p.out_nbytes[i])) {
                                fprintf(stderr, "test-gpu: case %d output %d differs\n", iter, i);
                                bad = 1;
                        }
                free(a);
                free(b);
                free(segs);
                free(starts);
                dv_plan_deinit(&p);
                case_free(&c);
        }
        printf("copy kernel on the GPU vs its CPU body, 300 random gather plans: %s\n",
               bad ? "MISMATCH" : "identical");
        return bad;
}

static int cmp_double(const void *x, const void *y) {
        double a = *(const double *)x, b = *(const double *)y;
        return a < b ? -1 : a > b;
}

static void bench(void) {
        static const uint64_t sizes[] = {1 << 20, 16 << 20, 64 << 20, 256 << 20};
        printf("%5s %9s %11s %11s %11s %7s\n", "ranks", "per rank", "kernel GB/s", "D2D GB/s",
               "output", "ratio");
        for (int world = 2; world <= 8; world *= 2) {
                for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                        DvShape sh[8];
                        int64_t valid[8];
                        uint64_t per = sizes[s];
                        if (per * (uint64_t)world > (3ull << 30))
                                continue;
                        for (int r = 0; r < world; r++) {
                                int64_t cols = 256 - r % 2;
                                sh[r] = (DvShape){DEVAL_F32, 2, {(int64_t)(per / 1024), cols}};
                                valid[r] = r == world - 1 ? sh[r].shape[0] - 1 : -1;
                        }
                        DvPlanInput in = {.world = world,
                                          .ntensors = 1,
                                          .in = sh,
                                          .valid_rows = valid,
                                          .keep_rows = -1,
                                          .max_out = 1ull << 40};
                        DvPlan p;
                        dv_plan_init(&p);
                        if (dv_plan_gather(&in, &p) != 0)
                                exit(1);
                        DvKernelSeg *segs = calloc(p.nsegs + 1, sizeof(*segs));
                        uint64_t *starts = calloc(p.nsegs + 1, sizeof(*starts));
                        DvDevPtr srcs[8], out, scratch;
                        dv_kernel_plan(&p, 1, false, segs, starts);
                        for (int r = 0; r < world; r++)
                                TRY(gpu->alloc(0, (uint64_t)numel_of(&sh[r]) * 4, &srcs[r]));
                        TRY(gpu->alloc(0, p.out_end, &out));
                        TRY(gpu->alloc(0, p.out_end, &scratch));
                        double tk[7], tc[7];
                        for (int i = 0; i < 7; i++) {
                                double t0 = now_s();
                                TRY(gpu->run_plan(0, segs, starts, (uint32_t)p.nsegs, out, srcs,
                                                  (uint32_t)world));
                                tk[i] = now_s() - t0;
                                t0 = now_s();
                                TRY(gpu->copy_device(0, scratch, out, p.out_end));
                                tc[i] = now_s() - t0;
                        }
                        qsort(tk, 7, sizeof(double), cmp_double);
                        qsort(tc, 7, sizeof(double), cmp_double);
                        printf("%5d %6llu MiB %11.1f %11.1f %8.0f MiB %6.2fx\n", world,
                               (unsigned long long)(per >> 20), (double)p.out_end / tk[3] / 1e9,
                               (double)p.out_end / tc[3] / 1e9, (double)p.out_end / (1 << 20),
                               tc[3] / tk[3]);
                        fflush(stdout);
                        for (int r = 0; r < world; r++)
                                gpu->free(0, srcs[r]);
                        gpu->free(0, out);
                        gpu->free(0, scratch);
                        free(segs);
                        free(starts);
                        dv_plan_deinit(&p);
                }
        }
}

/* One rank: device tensors in, host views out, reduce written back to the device. */
static int staged_rank(const char *sock, int rank) {
        int count = 0;
        if (gpu->init() < 0 || gpu->device_count(&count) < 0 || count == 0)
                return 77;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = sock, .timeout_ms = 20000};
        deval_group *g;
        if (deval_join("gpu-staged", rank, 2, &o, &g) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, deval_errmsg(NULL));
                return 1;
        }
        float host[6] = {rank * 10.0f, 1, 2, 3, 4, 5};
        DvDevPtr d;
        TRY(gpu->alloc(0, sizeof(host), &d));
        TRY(gpu->copy_to_device(0, d, host, sizeof(host)));
        deval_tensor in = {.data = (void *)(uintptr_t)d,
                           .dtype = DEVAL_F32,
                           .ndim = 2,
                           .shape = {2, 3},
                           .device = 0},
                     out;
        int bad = deval_gather(g, 1, &in, NULL, &out) != 0 || out.shape[0] != 4 ||
                  ((float *)out.data)[0] != 0.0f || ((float *)out.data)[6] != 10.0f;
        bad |= deval_reduce(g, &in, DEVAL_SUM) != 0;
        TRY(gpu->copy_to_host(0, host, d, sizeof(host)));
        bad |= host[0] != 10.0f || host[5] != 10.0f;
        if (bad)
                fprintf(stderr, "rank %d: staged device tensors: %s\n", rank, deval_errmsg(g));
        deval_leave(g);
        gpu->free(0, d);
        return bad;
}

typedef int (*RankFn)(const char *sock, int rank, int world, void *arg);

/*
 * How many GPUs the driver sees, asked in a forked child so that this process does not touch
 * CUDA before its ranks fork. Where it sees one, every failure to start or run the cuda
 * backend fails the check; only a machine without a GPU skips.
 */
static int gpus_seen(void) {
        fflush(NULL);
        pid_t p = fork();
        if (p == 0) {
                int n = 0;
                if (gpu->init() < 0 || gpu->device_count(&n) < 0)
                        n = 0;
                _exit(n > 100 ? 100 : n);
        }
        int st;
        if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st))
                return 0;
        return WEXITSTATUS(st);
}

static int n_gpus; /* gpus_seen(), once */

/*
 * devald with backend, and world forked ranks running fn; the worst exit code (77 when the
 * ranks found no GPU). Runs before this process touches CUDA: a forked child cannot use its
 * parent's CUDA state.
 */
static int with_devald(const char *backend, int world, RankFn fn, void *arg) {
        const char *devald = getenv("DEVALD");
        if (!devald) {
                if (!n_gpus)
                        return 0;
                fprintf(stderr,
                        "test-gpu: FAILED: $DEVALD is not set, so nothing checks the "
                        "%s backend end to end on this machine's %d GPU(s)\n",
                        backend, n_gpus);
                return 1;
        }
        char dir[] = "/tmp/deval-gpu-XXXXXX", sock[128];
        if (!mkdtemp(dir))
                return 1;
        snprintf(sock, sizeof(sock), "%s/devald.sock", dir);
        fflush(NULL);
        pid_t d = fork();
        if (d == 0) {
                execl(devald, devald, "--socket", sock, "--log-level", "warn", "--backend", backend,
                      NULL);
                _exit(127);
        }
        struct stat st;
        for (int i = 0; i < 1000 && stat(sock, &st) != 0; i++) {
                if (waitpid(d, NULL, WNOHANG) == d) {
                        rmdir(dir);
                        if (!n_gpus)
                                return 77; /* no GPU: devald said why on stderr */
                        fprintf(stderr,
                                "test-gpu: FAILED: devald --backend %s exited at start "
                                "(above), though the driver sees %d GPU(s)\n",
                                backend, n_gpus);
                        return 1;
                }
                usleep(10000);
        }
        pid_t ranks[16];
        for (int r = 0; r < world; r++)
                if ((ranks[r] = fork()) == 0)
                        _exit(fn(sock, r, world, arg));
        int worst = 0;
        for (int r = 0; r < world; r++) {
                int status;
                waitpid(ranks[r], &status, 0);
                int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
                if (code == 77 && n_gpus) /* a rank that found no GPU where there is one */
                        code = 1;
                if (code && worst != 1)
                        worst = code;
        }
        kill(d, SIGTERM);
        waitpid(d, NULL, 0);
        unlink(sock);
        rmdir(dir);
        return worst;
}

static int staged_rank_fn(const char *sock, int rank, int world, void *arg) {
        (void)world;
        (void)arg;
        return staged_rank(sock, rank);
}

/* A device group on GPU 0 shared by every rank: gathers land in device memory. */
static int device_rank(const char *sock, int rank, int world, void *arg) {
        (void)arg;
        int count = 0;
        if (gpu->init() < 0 || gpu->device_count(&count) < 0 || count == 0)
                return 77;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = sock, .timeout_ms = 30000,
                             .on_device = 1, .device = 0};
        deval_group *g;
        if (deval_join("gpu-device-group", rank, world, &o, &g) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, deval_errmsg(NULL));
                return 1;
        }
        int bad = 0;
        for (int round = 0; round < 2 && !bad; round++) {
                int64_t rows = (round ? 20000 : 3) + rank, cols = 31 + rank; /* round 1 grows */
                size_t bytes = sizeof(float) * (size_t)(rows * cols);
                float *h = malloc(bytes);
                for (int64_t i = 0; i < rows * cols; i++)
                        h[i] = (float)(rank * 1e7 + i);
                DvDevPtr d;
                TRY(gpu->alloc(0, bytes, &d));
                TRY(gpu->copy_to_device(0, d, h, bytes));
                deval_tensor in = {.data = (void *)(uintptr_t)d,
                                   .dtype = DEVAL_F32,
                                   .ndim = 2,
                                   .shape = {rows, cols},
                                   .device = 0},
                             out;
                deval_gather_opts go = DEVAL_GATHER_OPTS_INIT;
                go.pad_value = -1;
                if (deval_gather(g, 1, &in, &go, &out) != 0 || out.device != 0) {
                        fprintf(stderr, "rank %d: %s\n", rank, deval_errmsg(g));
                        bad = 1;
                        break;
                }
                int64_t width = 30 + world, total = out.shape[0];
                float *o2 = malloc(sizeof(float) * (size_t)(total * width));
                TRY(gpu->copy_to_host(0, o2, (DvDevPtr)(uintptr_t)out.data,
                                      sizeof(float) * (size_t)(total * width)));
                int64_t k = 0;
                for (int r = 0; r < world && !bad; r++)
                        for (int64_t i = 0; i < (round ? 20000 : 3) + r && !bad; i++, k++)
                                for (int64_t j = 0; j < width && !bad; j++) {
                                        float want = j < 31 + r
                                                             ? (float)(r * 1e7 + i * (31 + r) + j)
                                                             : -1.0f;
                                        if (o2[k * width + j] != want) {
                                                fprintf(stderr, "rank %d: row %lld col %lld\n",
                                                        rank, (long long)k, (long long)j);
                                                bad = 1;
                                        }
                                }
                free(o2);
                free(h);
                gpu->free(0, d);
        }
        deval_leave(g);
        return bad;
}

typedef struct {
        int iters;
} BenchArgs;

/* Through devald: a ragged gather of device tensors, vs cuMemcpyDtoD of its output. */
static int bench_rank(const char *sock, int rank, int world, void *arg) {
        (void)arg;
        static const uint64_t sizes[] = {1 << 20, 16 << 20, 64 << 20, 256 << 20};
        int count = 0;
        if (gpu->init() < 0 || gpu->device_count(&count) < 0 || count == 0)
                return 77;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = sock, .timeout_ms = 60000,
                             .on_device = 1, .device = 0};
        deval_group *g;
        char name[64];
        snprintf(name, sizeof(name), "gpu-bench-%d", world);
        if (deval_join(name, rank, world, &o, &g) != 0) {
                fprintf(stderr, "rank %d: %s\n", rank, deval_errmsg(NULL));
                return 1;
        }
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                int64_t cols = 256 - rank % 2, rows = (int64_t)(sizes[s] / 1024);
                DvDevPtr d, scratch = 0;
                TRY(gpu->alloc(0, (size_t)(rows * cols) * 4, &d));
                deval_tensor in = {.data = (void *)(uintptr_t)d,
                                   .dtype = DEVAL_F32,
                                   .ndim = 2,
                                   .shape = {rows, cols},
                                   .device = 0},
                             out;
                deval_gather_opts go = DEVAL_GATHER_OPTS_INIT;
                if (rank == world - 1)
                        go.valid_rows = rows - 1;
                double t[9], c[9];
                for (int it = -2; it < 9; it++) {
                        deval_barrier(g);
                        double t0 = now_s();
                        if (deval_gather(g, 1, &in, &go, &out) != 0) {
                                fprintf(stderr, "rank %d: %s\n", rank, deval_errmsg(g));
                                return 1;
                        }
                        if (it >= 0)
                                t[it] = now_s() - t0;
                }
                uint64_t ob = (uint64_t)(out.shape[0] * out.shape[1]) * 4;
                if (rank == 0) {
                        TRY(gpu->alloc(0, ob, &scratch));
                        for (int it = 0; it < 9; it++) {
                                double t0 = now_s();
                                TRY(gpu->copy_device(0, scratch, (DvDevPtr)(uintptr_t)out.data,
                                                     ob));
                                c[it] = now_s() - t0;
                        }
                        qsort(t, 9, sizeof(double), cmp_double);
                        qsort(c, 9, sizeof(double), cmp_double);
                        printf("%5d %6llu MiB %11.1f %11.1f %8.0f MiB %6.2fx\n", world,
                               (unsigned long long)(sizes[s] >> 20), (double)ob / t[4] / 1e9,
                               (double)ob / c[4] / 1e9, (double)ob / (1 << 20), c[4] / t[4]);
                        fflush(stdout);
                        gpu->free(0, scratch);
                }
                gpu->free(0, d);
        }
        double lat[200];
        int32_t v = 1;
        deval_tensor red = {.data = &v, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
        for (int it = 0; it < 200; it++) {
                double t0 = now_s();
                deval_reduce(g, &red, DEVAL_SUM);
                lat[it] = now_s() - t0;
        }
        if (rank == 0) {
                qsort(lat, 200, sizeof(double), cmp_double);
                printf("%5d   4-byte reduce in a device group: p50 %.1f us, p99 %.1f us\n", world,
                       lat[100] * 1e6, lat[198] * 1e6);
                fflush(stdout); /* the rank ends with _exit() */
        }
        deval_leave(g);
        return 0;
}

int main(int argc, char **argv) {
        int count = 0;
        /* the real driver, or nothing; DEVAL_GPU_CHECK_FAKE=1 runs this program's own logic on
         * the fake, to check it on a machine without a GPU */
        if (!getenv("DEVAL_GPU_CHECK_FAKE"))
                unsetenv("DEVAL_GPU_FAKE");
        gpu = dv_gpu();
        n_gpus = gpus_seen();
        bool benching = argc > 1 && strcmp(argv[1], "--bench") == 0;
        if (benching && getenv("DEVALD")) { /* end to end first, before CUDA is touched here */
                printf("through devald (--backend cuda), device tensors on GPU 0, ragged "
                       "gather:\n%5s %9s %11s %11s %11s %7s\n",
                       "ranks", "per rank", "deval GB/s", "D2D GB/s", "output", "ratio");
                for (int world = 2; world <= 8; world *= 2)
                        if (with_devald("cuda", world, bench_rank, NULL) == 1)
                                return 1;
                printf("\nthe copy kernel alone (plan executed directly):\n");
        }
        if (!benching) {
                int r = with_devald("host", 2, staged_rank_fn, NULL);
                if (r == 1)
                        return 1;
                if (r == 0 && getenv("DEVALD"))
                        printf("device tensors through devald on 2 ranks (staged, written "
                               "back): ok\n");
                r = with_devald("cuda", 2, device_rank, NULL);
                if (r == 1)
                        return 1;
                if (r == 0 && getenv("DEVALD"))
                        printf("a device group on GPU 0, 2 ranks, through the copy kernel and "
                               "CUDA IPC (growth included): ok\n");
        }
        gpu = dv_gpu();
        if (gpu->init() < 0 || gpu->device_count(&count) < 0 || count == 0) {
                printf("test-gpu: skipped: %s\n",
                       count == 0 && dv_gpu_error()[0] == '\0' ? "no GPU" : dv_gpu_error());
                return 77;
        }
        if (!dv_copy_kernel_fatbin) {
                printf("test-gpu: skipped: built without nvcc, so without the copy kernel\n");
                return 77;
        }
        if (benching) {
                bench();
                return 0;
        }
        return check_random_plans();
}
