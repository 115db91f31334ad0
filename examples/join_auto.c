/* SPDX-License-Identifier: MIT */
/*
 * join_auto.c - a C rank that names nothing: the group, its rank and the world size come
 * from the launcher, and a devald is started if none answers.
 *
 *     mpirun -np 4 ./join_auto        (or srun, torchrun --no-python, python -m deval.launch)
 */
#include <inttypes.h>
#include <stdio.h>

#include <deval.h>

int main(void) {
        deval_group *g;
        if (deval_join(NULL, -1, -1, NULL, &g) != 0) {
                fprintf(stderr, "join: %s\n", deval_errmsg(NULL));
                return 1;
        }
        int rank = deval_rank(g), world = deval_world_size(g);
        int64_t mine[2] = {rank, 10 * rank};
        deval_tensor in = {.data = mine, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1};
        deval_tensor out;
        if (deval_gather(g, 1, &in, NULL, &out) != 0) {
                fprintf(stderr, "gather: %s\n", deval_errmsg(g));
                return 1;
        }
        const int64_t *all = out.data;
        for (int r = 0; r < world; r++)
                if (out.shape[0] != 2 * world || all[2 * r] != r || all[2 * r + 1] != 10 * r) {
                        fprintf(stderr, "rank %d: wrong gather\n", rank);
                        return 1;
                }
        printf("rank %d of %d in group %s: gathered %" PRId64 " values\n", rank, world,
               deval_group_name(g), out.shape[0]);
        deval_leave(g);
        return 0;
}
