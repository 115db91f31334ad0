/* SPDX-License-Identifier: MIT */
/*
 * test-gpu.c - the copy kernel on a real GPU, through the CUDA driver (never the fake).
 *
 *   test-gpu            device tensors through a real devald ($DEVALD) on 2 ranks, then the
 *                       kernel on random gather plans against its CPU body; exit 77
 *                       (skipped) with the reason when no driver or GPU is there
 *   test-gpu --bench    a ragged gather's plan for 2, 4 and 8 ranks and 1 to 256 MiB per
 *                       rank, sources and output on one GPU, next to cuMemcpyDtoD of the
 *                       same output bytes in the same run
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
        deval_join_opts o = {.socket_path = sock, .timeout_ms = 20000};
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

/* Before this process touches CUDA (a forked child cannot use a parent's CUDA state). */
static int check_staged(void) {
        const char *devald = getenv("DEVALD");
        if (!devald)
                return 0;
        char dir[] = "/tmp/deval-gpu-XXXXXX", sock[128];
        if (!mkdtemp(dir))
                return 1;
        snprintf(sock, sizeof(sock), "%s/devald.sock", dir);
        pid_t d = fork();
        if (d == 0) {
                execl(devald, devald, "--socket", sock, "--log-level", "warn", NULL);
                _exit(127);
        }
        struct stat st;
        for (int i = 0; i < 500 && stat(sock, &st) != 0; i++)
                usleep(10000);
        pid_t ranks[2];
        for (int r = 0; r < 2; r++)
                if ((ranks[r] = fork()) == 0)
                        _exit(staged_rank(sock, r));
        int worst = 0;
        for (int r = 0; r < 2; r++) {
                int status;
                waitpid(ranks[r], &status, 0);
                int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
                if (code && worst != 1)
                        worst = code;
        }
        kill(d, SIGTERM);
        waitpid(d, NULL, 0);
        rmdir(dir);
        if (worst == 0)
                printf("device tensors through devald on 2 ranks (staged, written back): ok\n");
        return worst;
}

int main(int argc, char **argv) {
        int count = 0;
        unsetenv("DEVAL_GPU_FAKE"); /* the real driver, or nothing */
        gpu = dv_gpu();
        bool benching = argc > 1 && strcmp(argv[1], "--bench") == 0;
        int staged = benching ? 0 : check_staged();
        if (staged == 1)
                return 1;
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
