/* SPDX-License-Identifier: MIT */
/*
 * output.c - a group's output arenas, grown by its worker to fit a step's result: a new
 * sealed arena (host) or one per receiving GPU (device), charged to the quotas, swapped in
 * under the group's lock with a new generation that ranks follow.
 */
#define _GNU_SOURCE
#include "output.h"

#include <stdio.h>

#include "daemon.h"
#include "usage.h"

/**
 * output_ensure() - make the output arena at least size bytes, within the quota. A
 * new arena gets a new generation; clients fetch it when they see the generation change.
 * Return: 0, or DEVAL_ENOMEM with msg.
 */
int output_ensure(Group *g, uint64_t size, char *msg, size_t msglen) {
        Arena a;
        char name[96];
        int r;

        if (size <= g->out.size)
                return 0;
        Charge ch;
        char why[160];
        if (charge_take(g, g->out.size, size, &ch, why, sizeof(why)) < 0) {
                snprintf(msg, msglen, "the result needs %llu bytes, which would take %s",
                         (unsigned long long)size, why);
                return DEVAL_ENOMEM;
        }
        snprintf(name, sizeof(name), "deval-out-%s", g->name);
        if ((r = arena_new(name, ch.want, ARENA_OUTPUT, &a)) == 0)
                topo_prefer_memory(a.map, ch.want, g->numa);
        if (r < 0) {
                charge_drop(&ch);
                snprintf(msg, msglen, "devald could not allocate %llu bytes for the result",
                         (unsigned long long)ch.want);
                return r;
        }
        pthread_mutex_lock(&g->lock);
        Arena old = g->out;
        g->out = a;
        g->out_gen++;
        charge_commit(&ch);
        pthread_mutex_unlock(&g->lock);
        arena_deinit(&old);
        g->dhdr->out_gen = g->out_gen;
        g->dhdr->out_size = g->out.size;
        return 0;
}

/**
 * output_ensure_dev() - output_ensure() for a device group: every GPU that
 * receives gets an output arena of at least size bytes.
 */
int output_ensure_dev(Group *g, uint64_t size, char *msg, size_t msglen) {
        for (int dev = 0; dev < DV_MAX_GPUS; dev++) {
                DevArena *cur = &g->dout[dev], a;
                if (cur->device < 0 || size <= cur->size)
                        continue;
                Charge ch;
                char why[160];
                if (charge_take(g, cur->size, size, &ch, why, sizeof(why)) < 0) {
                        snprintf(msg, msglen,
                                 "the result needs %llu bytes on GPU %d, which would take %s",
                                 (unsigned long long)size, dev, why);
                        return DEVAL_ENOMEM;
                }
                int r = dev_arena_new(dev, ch.want, &a);
                if (r < 0) {
                        charge_drop(&ch);
                        snprintf(msg, msglen, "devald could not allocate %llu bytes on GPU %d: %s",
                                 (unsigned long long)ch.want, dev, dv_gpu_error());
                        return r;
                }
                pthread_mutex_lock(&g->lock);
                DevArena old = *cur;
                *cur = a; /* its fd stays open: ranks fetch it with DV_MSG_DEV_OUTPUT */
                g->dev_out_gen++;
                charge_commit(&ch);
                pthread_mutex_unlock(&g->lock);
                dev_arena_deinit(&old);
                g->dhdr->dev_out_gen = g->dev_out_gen;
        }
        return 0;
}
