/* SPDX-License-Identifier: MIT */
/*
 * gather.c - one rank of a distributed evaluation through deval, in the fewest lines.
 *
 * Run one process per rank, with devald listening on $DEVAL_SOCKET (or none: one starts):
 *
 *   python -m deval.launch -n 2 ./gather    (or torchrun --no-python --nproc-per-node 2, mpirun)
 *   for r in 0 1; do ./gather $r 2 & done; wait          (the rank and world size by hand)
 *   ./gather 0 1                                          (one process on its own)
 *
 * Each rank "predicts" its share of 5 samples, dealt round-robin; sample i is a row of
 * 2 + i % 3 tokens, so each rank pads its rows to its own longest, with -100. Rank 0 prints
 * the gathered rows, padded to the longest of all, in dataset order, the sampler's padding
 * dropped: the same at any number of ranks.
 *
 *   5 samples x 4 tokens:
 *       0    1 -100 -100
 *      10   11   12 -100
 *      20   21   22   23
 *      30   31 -100 -100
 *      40   41   42 -100
 */
#include <stdio.h>
#include <stdlib.h>

#include <deval.h>

int main(int argc, char **argv) {
        if ((argc != 1 && argc != 3) || (argc == 3 && atoi(argv[2]) < 1)) {
                fprintf(stderr, "usage: %s [RANK WORLD_SIZE]\n", argv[0]);
                return 2;
        }
        deval_group *g;
        /* with no arguments the group, the rank and the world size come from the launcher */
        if (deval_join(argc == 3 ? "example-gather" : NULL, argc == 3 ? atoi(argv[1]) : -1,
                       argc == 3 ? atoi(argv[2]) : -1, NULL, &g) != 0) {
                fprintf(stderr, "join: %s\n", deval_errmsg(NULL));
                return 1;
        }
        int rank = deval_rank(g), world = deval_world_size(g);
        /* a dataset of 5 samples dealt round-robin (DistributedSampler): the last round is
         * padded with copies of the first samples, which the eval pass drops */
        int64_t num_samples = 5, per_rank = (num_samples + world - 1) / world, width = 0;
        for (int64_t j = 0; j < per_rank; j++) {
                int64_t i = (j * world + rank) % num_samples;
                width = 2 + i % 3 > width ? 2 + i % 3 : width;
        }
        int32_t tokens[5 * 4]; /* at most 5 rows of 4 */
        for (int64_t j = 0; j < per_rank; j++) {
                int64_t i = (j * world + rank) % num_samples;
                for (int64_t t = 0; t < width; t++)
                        tokens[j * width + t] = t < 2 + i % 3 ? (int32_t)(i * 10 + t) : -100;
        }
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
