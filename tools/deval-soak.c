/* SPDX-License-Identifier: MIT */
/*
 * deval-soak - many small collectives against one devald, to find what only shows after a
 * million: lost wake-ups, deadline hits, memory or descriptors that devald does not give
 * back. RANKS ranks run OPS collectives in turn (a ragged gather, a sum, a barrier), each
 * checked, with random pauses of up to 200 us before a tenth of them. devald's RSS and
 * descriptor count are printed at the start and the end; the exit status is 0 only if every
 * collective succeeded, none came near the deadline, and devald's descriptors are as many
 * as at the start.
 *
 *   deval-soak --devald PATH [--ops N] [--ranks N]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
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

#include "spawn-devald.h"

typedef struct {
        _Atomic uint64_t done;
        uint64_t slow;   /* collectives over SLOW_NS: a lost wake-up costs a 20 ms slice */
        uint64_t max_ns; /* the slowest */
        int failed;
        int deadline; /* it failed with DEVAL_ETIMEDOUT */
        char msg[256];
} RankOut;

#define SLOW_NS (15 * 1000 * 1000ull)

static const char *arg_devald;
static uint64_t arg_ops = 1000000;
static int arg_ranks = 4;

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long rss_kib(pid_t pid) {
        char path[64], line[256];
        long kib = -1;
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
                        break;
        if (f)
                fclose(f);
        return kib;
}

static int fds_of(pid_t pid) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
        DIR *d = opendir(path);
        struct dirent *e;
        int n = 0;
        while (d && (e = readdir(d)))
                n += e->d_name[0] != '.';
        if (d)
                closedir(d);
        return n;
}

static int run_rank(const char *sock, int rank, RankOut *out) {
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = sock, .timeout_ms = 10000};
        deval_group *g;
        int r = deval_join("soak", rank, arg_ranks, &o, &g);
        if (r < 0) {
                snprintf(out->msg, sizeof(out->msg), "join: %s", deval_errmsg(NULL));
                return 1;
        }
        uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
        int32_t rows[4];
        for (uint64_t i = 0; i < arg_ops; i++) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                if (seed % 10 == 0)
                        usleep((useconds_t)(seed >> 32) % 200);
                uint64_t t0 = now_ns();
                switch (i % 3) {
                case 0: { /* ragged: rank k gives k % 3 + 1 rows */
                        int n = rank % 3 + 1;
                        for (int j = 0; j < n; j++)
                                rows[j] = (int32_t)(i * 16 + (uint64_t)rank);
                        deval_tensor in = {.data = rows,
                                           .dtype = DEVAL_I32,
                                           .ndim = 1,
                                           .shape = {n},
                                           .device = -1},
                                     res;
                        if ((r = deval_gather(g, 1, &in, NULL, &res)) < 0)
                                break;
                        const int32_t *v = res.data;
                        int64_t k = 0;
                        for (int q = 0; q < arg_ranks && r == 0; q++)
                                for (int j = 0; j < q % 3 + 1; j++, k++)
                                        if (v[k] != (int32_t)(i * 16 + (uint64_t)q))
                                                r = DEVAL_EPROTO;
                        break;
                }
                case 1: {
                        int64_t x = rank + 1;
                        deval_tensor t = {.data = &x, .dtype = DEVAL_I64, .ndim = 0, .device = -1};
                        if ((r = deval_reduce(g, &t, DEVAL_SUM)) == 0 &&
                            x != (int64_t)arg_ranks * (arg_ranks + 1) / 2)
                                r = DEVAL_EPROTO;
                        break;
                }
                default:
                        r = deval_barrier(g);
                }
                uint64_t dt = now_ns() - t0;
                if (r < 0) {
                        snprintf(out->msg, sizeof(out->msg), "collective %" PRIu64 ": %s: %s", i,
                                 deval_strerror(r),
                                 r == DEVAL_EPROTO ? "wrong result" : deval_errmsg(g));
                        out->failed = 1;
                        out->deadline = r == DEVAL_ETIMEDOUT;
                        return 1;
                }
                if (dt > SLOW_NS)
                        out->slow++;
                if (dt > out->max_ns)
                        out->max_ns = dt;
                atomic_store_explicit(&out->done, i + 1, memory_order_relaxed);
        }
        deval_leave(g);
        return 0;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                {"devald", required_argument, NULL, 'd'},
                {"ops", required_argument, NULL, 'n'},
                {"ranks", required_argument, NULL, 'r'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        int c;
        while ((c = getopt_long(argc, argv, "d:n:r:h", opts, NULL)) >= 0) {
                switch (c) {
                case 'd':
                        arg_devald = optarg;
                        break;
                case 'n':
                        arg_ops = strtoull(optarg, NULL, 10);
                        break;
                case 'r':
                        arg_ranks = atoi(optarg);
                        break;
                case 'h':
                        printf("usage: deval-soak --devald PATH [--ops N] [--ranks N]\n");
                        return 0;
                default:
                        return 2;
                }
        }
        if (!arg_devald || arg_ops < 3 || arg_ranks < 2 || arg_ranks > 64) {
                fprintf(stderr, "usage: deval-soak --devald PATH [--ops N>=3] [--ranks 2..64]\n");
                return 2;
        }
        char sock[108];
        pid_t d = spawn_devald(arg_devald, sock, sizeof(sock));
        if (d < 0) {
                fprintf(stderr, "deval-soak: could not start %s\n", arg_devald);
                return 1;
        }
        usleep(50000); /* the last probe's connection is gone */
        long rss0 = rss_kib(d);
        int fds0 = fds_of(d);
        printf("devald pid %d at the start: RSS %ld KiB, %d descriptors\n", (int)d, rss0, fds0);
        RankOut *out = mmap(NULL, sizeof(*out) * (size_t)arg_ranks, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (out == MAP_FAILED)
                return 1;
        memset(out, 0, sizeof(*out) * (size_t)arg_ranks);
        uint64_t t0 = now_ns();
        pid_t ranks[64];
        for (int k = 0; k < arg_ranks; k++)
                if ((ranks[k] = fork()) == 0)
                        _exit(run_rank(sock, k, &out[k]));
        int bad = 0;
        for (int k = 0; k < arg_ranks; k++) {
                int st;
                waitpid(ranks[k], &st, 0);
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                        fprintf(stderr, "rank %d failed: %s\n", k, out[k].msg);
                        bad = 1;
                }
        }
        double secs = (double)(now_ns() - t0) / 1e9;
        usleep(100000); /* devald sees the ranks leave */
        long rss1 = rss_kib(d);
        int fds1 = fds_of(d);
        uint64_t slow = 0, max_ns = 0;
        int deadlines = 0;
        for (int k = 0; k < arg_ranks; k++) {
                deadlines += out[k].deadline;
                slow += out[k].slow;
                max_ns = out[k].max_ns > max_ns ? out[k].max_ns : max_ns;
        }
        printf("%" PRIu64 " collectives x %d ranks in %.1f s (%.1f us each): %s, %" PRIu64
               " over 15 ms (slowest %.2f ms), %d deadline hits\n",
               arg_ops, arg_ranks, secs, secs * 1e6 / (double)arg_ops,
               bad ? "FAILED" : "all correct", slow, (double)max_ns / 1e6, deadlines);
        printf("devald pid %d at the end:   RSS %ld KiB, %d descriptors\n", (int)d, rss1, fds1);
        stop_devald(d, sock);
        if (fds1 != fds0) {
                fprintf(stderr, "devald holds %d descriptors, %d at the start\n", fds1, fds0);
                bad = 1;
        }
        return bad;
}
