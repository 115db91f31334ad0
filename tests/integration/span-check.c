/* SPDX-License-Identifier: MIT */
/*
 * span-check - run under mpirun: every collective of a sequence, once on a group that
 * spans "nodes" (deval_mpi_join(); each rank's node and devald from $DEVAL_NODE and
 * $DEVAL_SOCKET) and once on a flat group of the same ranks at one devald
 * ($SPAN_FLAT_SOCKET); every result, status and shape must be identical, byte for byte.
 *
 *   span-check            the comparison; prints "span-check: rank R: N results identical"
 *   span-check stop R S   rank R stops itself (SIGSTOP) at collective S of the spanning run;
 *                         every other rank prints the status and message it got
 *   span-check timeout-ms T: the join's timeout (default 60000)
 *
 * The sequence is span-seq.c's.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "deval_mpi.h"
#include "span-seq.h"

int main(int argc, char **argv) {
        int timeout = 60000;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "stop") && i + 2 < argc) {
                        span_stop_rank = atoi(argv[i + 1]);
                        span_stop_at = atoi(argv[i + 2]);
                        i += 2;
                } else if (!strcmp(argv[i], "timeout-ms") && i + 1 < argc) {
                        timeout = atoi(argv[++i]);
                }
        }
        int R, W;
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &R);
        MPI_Comm_size(MPI_COMM_WORLD, &W);
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .timeout_ms = timeout};
        deval_group *span, *flat;
        int r = deval_mpi_join(MPI_COMM_WORLD, "spancheck", &o, &span);
        if (r < 0) {
                printf("span-check: rank %d: join: %s: %s\n", R, deval_strerror(r),
                       deval_errmsg(NULL));
                return 2;
        }
        int node, nodes = deval_nodes(span, &node);
        SpanLog a = {0}, b = {0};
        span_seq(span, &a, R, W, true);
        if (span_stop_rank >= 0) { /* every rank should have failed before here */
                printf("span-check: rank %d: no failure\n", R);
                return 4;
        }
        deval_join_opts fo = {DEVAL_JOIN_OPTS_INIT, .timeout_ms = timeout,
                              .socket_path = getenv("SPAN_FLAT_SOCKET")};
        if ((r = deval_join("spancheck-flat", R, W, &fo, &flat)) < 0) {
                printf("span-check: rank %d: flat join: %s\n", R, deval_errmsg(NULL));
                return 2;
        }
        span_seq(flat, &b, R, W, false);
        char why[160];
        if (span_seq_diff(&a, &b, why, sizeof(why))) {
                printf("span-check: rank %d (node %d of %d): results differ: %s\n", R, node, nodes,
                       why);
                return 1;
        }
        printf("span-check: rank %d (node %d of %d): %d results identical (%zu bytes, %d of them "
               "failures)\n",
               R, node, nodes, a.entries, a.n, a.failed);
        deval_leave(span);
        deval_leave(flat);
        span_log_free(&a);
        span_log_free(&b);
        MPI_Finalize();
        return 0;
}
