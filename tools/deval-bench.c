/* SPDX-License-Identifier: MIT */
/*
 * deval-bench - latency and bandwidth of deval's collectives, against memcpy as the limit
 * and against Open MPI as the peer.
 *
 * For 2, 4 and 8 ranks and 64 B to 64 MiB per rank it times a ragged gather (f32, the last
 * dim one element shorter on odd ranks so it is padded, and the last rank's last row
 * trimmed with valid_rows), then a 16-byte reduce and a barrier. Every figure is the slowest
 * rank's time in each iteration (p50 and p99 over the iterations), printed next to a
 * two-thread memcpy of the same output, measured in the same run, and, with --mpi FILE
 * (what deval-mpi-bench printed just before), next to MPI doing the same: ratios, because
 * the machine is shared and noisy.
 *
 * With --load N, N processes keep a core busy each for the whole run: the shared machine
 * of CI or a cluster node, where a rank that spins takes the core another needs (give
 * deval-mpi-bench the same --load for the MPI column).
 *
 *   deval-bench [--devald PATH | --socket PATH] [--quick] [--min-world N] [--max-world N]
 *               [--size BYTES] [--zero-copy] [--mpi FILE] [--load N]
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "deval.h"

#include "load.h"
#include "spawn-devald.h"

#define MAX_ITERS 4000

static const char *arg_socket;
static const char *arg_devald;
static int arg_quick;
static int arg_max_world = 8;
static int arg_min_world = 2;
static int arg_zero_copy;
static size_t arg_only_size;
static const char *arg_mpi;
static int arg_load;

#define MAX_WORLD 8

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
        qsort(v, (size_t)n, sizeof(*v), cmp_double);
        int i = (int)(q * (n - 1) + 0.5);
        return v[i];
}

typedef struct {
        char *dst;
        const char *src;
        size_t n;
} Half;

static void *copy_half(void *arg) {
        Half *h = arg;
        memcpy(h->dst, h->src, h->n);
        return NULL;
}

/* Median time of memcpy of bytes on two threads (half each), buffers touched first: what
 * the machine's memory does, the limit of any gather of that output. Under 1 MiB, where
 * starting a thread costs more than the copy, on one. */
static double memcpy_time(size_t bytes, int iters) {
        char *a = malloc(bytes), *b = malloc(bytes);
        double t[64];
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        if (iters > 64)
                iters = 64;
        size_t half = bytes >= (1u << 20) ? bytes / 2 / 64 * 64 : 0;
        for (int i = 0; i < iters; i++) {
                Half h = {b + half, a + half, bytes - half};
                pthread_t th;
                double t0 = now_s();
                int threaded = half && pthread_create(&th, NULL, copy_half, &h) == 0;
                if (threaded) {
                        memcpy(b, a, half);
                        pthread_join(th, NULL);
                } else {
                        memcpy(b, a, bytes);
                }
                t[i] = now_s() - t0;
                a[i % bytes] = (char)i; /* keep the copy from being elided */
        }
        volatile char sink = b[bytes / 2];
        (void)sink;
        free(a);
        free(b);
        return quantile(t, iters, 0.5);
}

/* What deval-mpi-bench measured for a case: its p50 and p99 in us; false when it has none. */
static bool mpi_figure(const char *kind, int world, size_t bytes, double *p50, double *p99) {
        FILE *f = arg_mpi ? fopen(arg_mpi, "r") : NULL;
        char k[32];
        int w;
        size_t b;
        double x, y;
        bool found = false;
        if (!f)
                return false;
        while (!found && fscanf(f, "%31s %d %zu %lf %lf", k, &w, &b, &x, &y) == 5)
                if (strcmp(k, kind) == 0 && w == world && b == bytes) {
                        *p50 = x;
                        *p99 = y;
                        found = true;
                }
        fclose(f);
        return found;
}

/* The slowest rank's time of each iteration. */
static void slowest(const double *lat, int world, int iters, double *ret) {
        for (int it = 0; it < iters; it++) {
                ret[it] = 0;
                for (int k = 0; k < world; k++)
                        if (lat[k * MAX_ITERS + it] > ret[it])
                                ret[it] = lat[k * MAX_ITERS + it];
        }
}

typedef struct {
        int kind; /* 0 gather, 1 reduce, 2 barrier */
        int world;
        size_t bytes;
        int iters;
        char group[48];
        double *lat; /* shared, [rank * MAX_ITERS + iteration] */
        double *out_bytes;
        int *failed;
} Job;

static void shape_for(size_t bytes, int rank, int64_t *rows, int64_t *cols) {
        if (bytes <= 256) {
                *rows = 2;
                *cols = (int64_t)(bytes / 8);
        } else {
                *cols = 64;
                *rows = (int64_t)(bytes / 256);
        }
        if (rank % 2 && *cols > 1)
                (*cols)--;
}

static int rank_main(const Job *j, int rank) {
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = arg_socket, .timeout_ms = 120000};
        deval_group *g;
        int r = deval_join(j->group, rank, j->world, &o, &g);
        if (r) {
                fprintf(stderr, "deval-bench: join: %s\n", deval_errmsg(NULL));
                return 1;
        }
        int64_t rows, cols;
        shape_for(j->bytes, rank, &rows, &cols);
        float *x = malloc((size_t)(rows * cols) * sizeof(float) + 8);
        for (int64_t i = 0; i < rows * cols; i++)
                x[i] = (float)i;
        deval_tensor in = {.data = x,
                           .dtype = DEVAL_F32,
                           .ndim = 2,
                           .shape = {rows, cols},
                           .device = -1},
                     out;
        double v[2] = {rank, 1};
        deval_tensor red = {.data = v, .dtype = DEVAL_F64, .ndim = 1, .shape = {2}, .device = -1};
        deval_gather_opts go = DEVAL_GATHER_OPTS_INIT;
        if (rank == j->world - 1)
                go.valid_rows = rows - 1;
        int warm = j->iters / 10 + 2;
        for (int it = -warm; it < j->iters && !r; it++) {
                r = deval_barrier(g);
                if (!r && j->kind == 0 && arg_zero_copy) {
                        /* the producer writes its output straight into the arena */
                        void *buf;
                        size_t bytes = (size_t)(rows * cols) * sizeof(float);
                        r = deval_input_buffer(g, bytes, &buf);
                        if (!r)
                                memcpy(buf, x, bytes);
                        in.data = buf;
                }
                double t0 = now_s();
                if (!r && j->kind == 0)
                        r = deval_gather(g, 1, &in, &go, &out);
                else if (!r && j->kind == 1)
                        r = deval_reduce(g, &red, DEVAL_SUM);
                else if (!r)
                        r = deval_barrier(g);
                double t = now_s() - t0;
                if (it >= 0)
                        j->lat[rank * MAX_ITERS + it] = t;
                if (rank == 0 && !r && j->kind == 0)
                        *j->out_bytes = (double)(out.shape[0] * out.shape[1]) * sizeof(float);
        }
        if (r)
                fprintf(stderr, "deval-bench: rank %d: %s\n", rank, deval_errmsg(g));
        deval_leave(g);
        free(x);
        return r != 0;
}

static int run_job(Job *j);

/* Run one case on world ranks: the slowest rank's p50 and p99 per call, in us. */
static int measure(int kind, int world, size_t bytes, int iters, double *lat, double *out_bytes,
                   int *failed, double *p50, double *p99) {
        static double worst[MAX_ITERS];
        Job j = {.kind = kind,
                 .world = world,
                 .bytes = bytes,
                 .iters = iters,
                 .lat = lat,
                 .out_bytes = out_bytes,
                 .failed = failed};
        if (run_job(&j))
                return -1;
        slowest(lat, world, iters, worst);
        *p50 = quantile(worst, iters, 0.5) * 1e6;
        *p99 = quantile(worst, iters, 0.99) * 1e6;
        return 0;
}

static int run_job(Job *j) {
        static int seq;
        pid_t pids[MAX_WORLD];
        snprintf(j->group, sizeof(j->group), "bench-%d-%d", (int)getpid(), seq++);
        *j->failed = 0;
        fflush(NULL);
        for (int r = 0; r < j->world; r++) {
                pids[r] = fork();
                if (pids[r] == 0)
                        _exit(rank_main(j, r));
        }
        int bad = 0;
        for (int r = 0; r < j->world; r++) {
                int st;
                waitpid(pids[r], &st, 0);
                bad |= !WIFEXITED(st) || WEXITSTATUS(st);
        }
        return bad;
}

static void human(double bytes, char *buf, size_t len) {
        if (bytes >= 1 << 20)
                snprintf(buf, len, "%.0f MiB", bytes / (1 << 20));
        else if (bytes >= 1 << 10)
                snprintf(buf, len, "%.0f KiB", bytes / (1 << 10));
        else
                snprintf(buf, len, "%.0f B", bytes);
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"devald", required_argument, NULL, 'd'},
                {"quick", no_argument, NULL, 'q'},
                {"max-world", required_argument, NULL, 'w'},
                {"min-world", required_argument, NULL, 'm'},
                {"size", required_argument, NULL, 'z'},
                {"zero-copy", no_argument, NULL, 'Z'},
                {"mpi", required_argument, NULL, 'M'},
                {"load", required_argument, NULL, 'L'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        static char sock[100];
        int c;
        pid_t daemon = 0;

        while ((c = getopt_long(argc, argv, "s:d:qw:m:z:ZM:L:h", opts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        arg_socket = optarg;
                        break;
                case 'd':
                        arg_devald = optarg;
                        break;
                case 'q':
                        arg_quick = 1;
                        break;
                case 'w':
                        arg_max_world = atoi(optarg);
                        break;
                case 'Z':
                        arg_zero_copy = 1;
                        break;
                case 'm':
                        arg_min_world = atoi(optarg);
                        break;
                case 'z':
                        arg_only_size = strtoull(optarg, NULL, 10);
                        break;
                case 'M':
                        arg_mpi = optarg;
                        break;
                case 'L':
                        arg_load = atoi(optarg);
                        break;
                case 'h':
                        printf("Usage: deval-bench [--devald PATH | --socket PATH] [--quick] "
                               "[--min-world N] [--max-world N] [--size BYTES] [--zero-copy] "
                               "[--mpi FILE] [--load N]\n");
                        return 0;
                default:
                        return 2;
                }
        }
        if (arg_max_world > MAX_WORLD || arg_min_world < 1) {
                fprintf(stderr, "deval-bench: 1 to %d ranks\n", MAX_WORLD);
                return 2;
        }
        if (arg_devald) {
                daemon = spawn_devald(arg_devald, sock, sizeof(sock));
                if (daemon < 0) {
                        fprintf(stderr, "deval-bench: could not start %s\n", arg_devald);
                        return 1;
                }
                arg_socket = sock;
        }

        if (arg_load > 0) {
                printf("beside a competing load: %d processes spinning, one core each\n", arg_load);
                load_start(arg_load);
        }
        double *lat = mmap(NULL, sizeof(double) * (MAX_WORLD * MAX_ITERS + 2),
                           PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        double *out_bytes = lat + MAX_WORLD * MAX_ITERS;
        int *failed = (int *)(out_bytes + 1);
        static const size_t sizes[] = {64, 4 << 10, 256 << 10, 4 << 20, 64 << 20};
        int rc = 0;
        double m50, m99;

        printf("ragged gather, f32, pad dim 1, last row of the last rank trimmed%s;\n"
               "the slowest rank's time per call; vs MPI: MPI's p50 / deval's (> 1: deval is "
               "faster);\nvs memcpy: a two-thread memcpy of the output / deval's p50 (1: the "
               "memory's limit)\n",
               arg_zero_copy ? ", inputs written into deval_input_buffer()" : "");
        printf("%5s %9s %9s %10s %10s %10s %8s %8s %9s\n", "ranks", "per rank", "output", "p50 us",
               "p99 us", "MPI p50", "vs MPI", "GB/s", "vs memcpy");
        for (int world = arg_min_world; world <= arg_max_world; world *= 2) {
                for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                        size_t bytes = sizes[s];
                        if ((arg_quick && bytes > (4u << 20)) ||
                            (arg_only_size && bytes != arg_only_size))
                                continue;
                        int iters = bytes >= (64u << 20) ? 10 : bytes >= (4u << 20) ? 40 : 1000;
                        if (arg_quick)
                                iters = iters > 200 ? 200 : iters;
                        double p50, p99;
                        if (measure(0, world, bytes, iters, lat, out_bytes, failed, &p50, &p99)) {
                                rc = 1;
                                continue;
                        }
                        double mc = memcpy_time((size_t)*out_bytes, iters) * 1e6;
                        char a[16], b[16], m[16] = "-", v[16] = "-";
                        human((double)bytes, a, sizeof(a));
                        human(*out_bytes, b, sizeof(b));
                        if (mpi_figure("gather", world, bytes, &m50, &m99)) {
                                snprintf(m, sizeof(m), "%.1f", m50);
                                snprintf(v, sizeof(v), "%.2fx", m50 / p50);
                        }
                        printf("%5d %9s %9s %10.1f %10.1f %10s %8s %8.2f %8.2fx\n", world, a, b,
                               p50, p99, m, v, *out_bytes / p50 / 1e3, mc / p50);
                        fflush(stdout);
                }
        }

        const char *names[] = {"16-byte reduce", "barrier"};
        const char *mpi_names[] = {"reduce", "barrier"};
        printf("\n%-15s %5s %10s %10s %10s %10s %8s\n", "collective", "ranks", "p50 us", "p99 us",
               "MPI p50", "MPI p99", "vs MPI");
        for (int kind = 1; kind <= 2; kind++) {
                for (int world = arg_min_world; world <= arg_max_world; world *= 2) {
                        int iters = arg_quick ? 500 : MAX_ITERS;
                        double p50, p99;
                        if (measure(kind, world, 16, iters, lat, out_bytes, failed, &p50, &p99)) {
                                rc = 1;
                                continue;
                        }
                        char m[16] = "-", n[16] = "-", v[16] = "-";
                        if (mpi_figure(mpi_names[kind - 1], world, kind == 1 ? 16 : 0, &m50,
                                       &m99)) {
                                snprintf(m, sizeof(m), "%.1f", m50);
                                snprintf(n, sizeof(n), "%.1f", m99);
                                snprintf(v, sizeof(v), "%.2fx", m50 / p50);
                        }
                        printf("%-15s %5d %10.2f %10.2f %10s %10s %8s\n", names[kind - 1], world,
                               p50, p99, m, n, v);
                        fflush(stdout);
                }
        }
        load_stop();
        if (daemon > 0)
                stop_devald(daemon, sock);
        return rc;
}
