/* SPDX-License-Identifier: MIT */
/*
 * gather.c - one rank of a distributed evaluation through deval, in the fewest lines.
 *
 * Run one process per rank, with devald listening on $DEVAL_SOCKET:
 *
 *   for r in 0 1; do ./gather $r 2 & done; wait
 *
 * Each rank "predicts" a few samples whose token rows have ragged lengths; rank 0 prints
 * the gathered, padded, de-duplicated result in dataset order.
 */
#include <stdio.h>
#include <stdlib.h>

#include <deval.h>

int main(int argc, char **argv) {
        if (argc != 3 || atoi(argv[2]) < 1 || atoi(argv[2]) > 16) {
                fprintf(stderr, "usage: %s RANK WORLD_SIZE\n", argv[0]);
                return 2;
        }
        int rank = atoi(argv[1]), world = atoi(argv[2]);
        deval_group *g;
        if (deval_join("example-gather", rank, world, NULL, &g) != 0) {
                fprintf(stderr, "join: %s\n", deval_errmsg(NULL));
                return 1;
        }
        /* a dataset of 5 samples dealt round-robin (DistributedSampler): the last rank's
         * share is padded with a duplicate of sample 0, which the eval pass drops */
        int64_t num_samples = 5, per_rank = (num_samples + world - 1) / world;
        int64_t width = 2 + rank; /* this rank's batch is padded to its own longest row */
        int32_t tokens[64];
        for (int64_t j = 0; j < per_rank; j++)
                for (int64_t t = 0; t < width; t++)
                        tokens[j * width + t] =
                                (int32_t)(((j * world + rank) % num_samples) * 10 + t);
        deval_tensor in = {.data = tokens,
                           .dtype = DEVAL_I32,
                           .ndim = 2,
                           .shape = {per_rank, width},
                           .device = -1};
        deval_tensor out;
        deval_gather_opts opts = DEVAL_GATHER_OPTS_INIT;
        opts.pad_value = -100;

        int r = deval_eval_begin(g, num_samples, DEVAL_ORDER_STRIDED);
        if (r == 0)
                r = deval_gather_for_metrics(g, 1, &in, &opts, &out);
        if (r == 0 && rank == 0) {
                printf("%lld samples x %lld tokens:\n", (long long)out.shape[0],
                       (long long)out.shape[1]);
                for (int64_t i = 0; i < out.shape[0]; i++) {
                        for (int64_t t = 0; t < out.shape[1]; t++)
                                printf(" %4d", ((const int32_t *)out.data)[i * out.shape[1] + t]);
                        printf("\n");
                }
        }
        if (r == 0)
                r = deval_eval_end(g);
        if (r != 0)
                fprintf(stderr, "rank %d: %s\n", rank, deval_errmsg(g));
        deval_leave(g);
        return r != 0;
}
