/* SPDX-License-Identifier: MIT */
/*
 * deval-mpi-bench - the peer deval is measured against: what Accelerate's
 * pad_across_processes + gather_for_metrics do, done with MPI on host memory, and MPI's own
 * small collectives. Run under mpirun with 2, 4 or 8 processes; rank 0 prints one line per
 * case for deval-bench --mpi to read:
 *
 *     gather WORLD BYTES_PER_RANK P50_US P99_US
 *     reduce WORLD 16 P50_US P99_US
 *     barrier WORLD 0 P50_US P99_US
 *
 * The gather is deval-bench's: f32 rows of 64 (of bytes / 8 when under 256 B), one element
 * shorter on odd ranks, the last rank's last row trimmed. Each iteration: MPI_Allgather of
 * every rank's shape, padding to the widest on the ranks that are narrower (a copy, as
 * Accelerate does), MPI_Allgatherv of the padded rows, and the trim (a view, no copy). Every
 * figure is the slowest rank's time in each iteration, p50 and p99 over the iterations.
 *
 *   mpirun -np N deval-mpi-bench [--quick] [--size BYTES] [--load N]
 *
 * --load N: rank 0 starts N processes that keep a core busy each for the run (load.h).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load.h"

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/* The slowest rank's time of each iteration, to rank 0; there, p50 and p99. */
static void report(const char *kind, int world, size_t bytes, double *t, int iters) {
        int rank;
        double *worst = malloc(sizeof(double) * (size_t)iters);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Reduce(t, worst, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
                qsort(worst, (size_t)iters, sizeof(double), cmp_double);
                printf("%s %d %zu %.2f %.2f\n", kind, world, bytes,
                       worst[(int)(0.5 * (iters - 1) + 0.5)] * 1e6,
                       worst[(int)(0.99 * (iters - 1) + 0.5)] * 1e6);
                fflush(stdout);
        }
        free(worst);
}

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

static void bench_gather(int rank, int world, size_t bytes, int iters) {
        int64_t rows, cols, shape[2], *shapes = malloc(sizeof(int64_t) * 2 * (size_t)world);
        shape_for(bytes, rank, &rows, &cols);
        float *x = malloc((size_t)(rows * cols) * sizeof(float) + 4);
        for (int64_t i = 0; i < rows * cols; i++)
                x[i] = (float)i;
        int64_t max_cols = cols + 1, max_rows = rows;
        float *padded = malloc((size_t)(max_rows * max_cols) * sizeof(float));
        float *out = malloc((size_t)(world * max_rows * max_cols) * sizeof(float));
        int *counts = malloc(sizeof(int) * (size_t)world),
            *displs = malloc(sizeof(int) * (size_t)world);
        double *t = malloc(sizeof(double) * (size_t)iters);
        volatile int64_t kept = 0;
        int warm = iters / 10 + 2;

        for (int it = -warm; it < iters; it++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                /* pad_across_processes: every rank's shape, then pad to the widest */
                shape[0] = rows;
                shape[1] = cols;
                MPI_Allgather(shape, 2, MPI_INT64_T, shapes, 2, MPI_INT64_T, MPI_COMM_WORLD);
                int64_t wide = 0, total = 0;
                for (int k = 0; k < world; k++)
                        wide = shapes[2 * k + 1] > wide ? shapes[2 * k + 1] : wide;
                const float *send = x;
                if (wide > cols) {
                        for (int64_t r = 0; r < rows; r++) {
                                memcpy(padded + r * wide, x + r * cols,
                                       (size_t)cols * sizeof(float));
                                for (int64_t c = cols; c < wide; c++)
                                        padded[r * wide + c] = 0.0f;
                        }
                        send = padded;
                }
                /* gather: every rank's padded rows, in rank order */
                for (int k = 0; k < world; k++) {
                        counts[k] = (int)(shapes[2 * k] * wide);
                        displs[k] = (int)total;
                        total += counts[k];
                }
                MPI_Allgatherv(send, (int)(rows * wide), MPI_FLOAT, out, counts, displs, MPI_FLOAT,
                               MPI_COMM_WORLD);
                /* gather_for_metrics' trim: the last rank's last row is a duplicate */
                kept = total / wide - 1;
                double dt = MPI_Wtime() - t0;
                if (it >= 0)
                        t[it] = dt;
        }
        (void)kept;
        report("gather", world, bytes, t, iters);
        free(t);
        free(displs);
        free(counts);
        free(out);
        free(padded);
        free(x);
        free(shapes);
}

static void bench_small(int world, int kind, int iters) {
        double v[2] = {1, 2}, r[2];
        double *t = malloc(sizeof(double) * (size_t)iters);
        int warm = iters / 10 + 2;
        for (int it = -warm; it < iters; it++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (kind == 0)
                        MPI_Allreduce(v, r, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
                else
                        MPI_Barrier(MPI_COMM_WORLD);
                double dt = MPI_Wtime() - t0;
                if (it >= 0)
                        t[it] = dt;
        }
        report(kind == 0 ? "reduce" : "barrier", world, kind == 0 ? 16 : 0, t, iters);
        free(t);
}

int main(int argc, char **argv) {
        int rank, world, quick = 0;
        size_t only = 0;
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--quick") == 0)
                        quick = 1;
                else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
                        only = strtoull(argv[++i], NULL, 10);
                else if (strcmp(argv[i], "--load") == 0 && i + 1 < argc && rank == 0)
                        load_start(atoi(argv[++i]));
        }
        static const size_t sizes[] = {64, 4 << 10, 256 << 10, 4 << 20, 64 << 20};
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                size_t bytes = sizes[s];
                if ((quick && bytes > (4u << 20)) || (only && bytes != only))
                        continue;
                int iters = bytes >= (64u << 20) ? 10 : bytes >= (4u << 20) ? 40 : 1000;
                if (quick)
                        iters = iters > 200 ? 200 : iters;
                bench_gather(rank, world, bytes, iters);
        }
        bench_small(world, 0, quick ? 500 : 4000);
        bench_small(world, 1, quick ? 500 : 4000);
        load_stop();
        MPI_Finalize();
        return 0;
}
