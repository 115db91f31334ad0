/* SPDX-License-Identifier: MIT */
/*
 * output.c - a group's output arenas, grown by its worker to fit a step's result: a new
 * sealed arena (host) or one per receiving GPU (device), charged to the quotas, swapped in
 * under the group's lock with a new generation that ranks follow; and a host group's direct
 * output, which the ranks write themselves (DV_REQ_DIRECT), grown on a rank's request.
 */
#define _GNU_SOURCE
#include "output.h"

#include <stdio.h>

#include "daemon.h"
#include "topo.h"
#include "usage.h"

/*
 * Replace *slot, one of g's host arenas, by one of kind holding size bytes (prefix-GROUP by
 * name), within the quota, under the group's lock with *gen bumped; the old one is unmapped.
 * Return: 0, or DEVAL_ENOMEM / an allocation failure with msg.
 */
static int output_replace(Group *g, Arena *slot, uint64_t *gen, int kind, const char *prefix,
                          uint64_t size, char *msg, size_t msglen) {
        Arena a;
        char name[96];
        int r;

        Charge ch;
        char why[160];
        if (charge_take(g, slot->size, size, &ch, why, sizeof(why)) < 0) {
                snprintf(msg, msglen, "the result needs %llu bytes, which would take %s",
                         (unsigned long long)size, why);
                return DEVAL_ENOMEM;
        }
        snprintf(name, sizeof(name), "%s-%s", prefix, g->name);
        if ((r = arena_new(name, ch.want, kind, &a)) == 0)
                topo_prefer_memory(a.map, ch.want, g->numa);
        if (r < 0) {
                charge_drop(&ch);
                snprintf(msg, msglen, "devald could not allocate %llu bytes for the result",
                         (unsigned long long)ch.want);
                return r;
        }
        pthread_mutex_lock(&g->lock);
        Arena old = *slot;
        *slot = a;
        (*gen)++;
        charge_commit(&ch);
        pthread_mutex_unlock(&g->lock);
        arena_deinit(&old);
        return 0;
}

/**
 * output_ensure() - make the output arena at least size bytes, within the quota. A
 * new arena gets a new generation; clients fetch it when they see the generation change.
 * Return: 0, or DEVAL_ENOMEM with msg.
 */
int output_ensure(Group *g, uint64_t size, char *msg, size_t msglen) {
        if (size <= g->locked.out.size)
                return 0;
        int r = output_replace(g, &g->locked.out, &g->locked.out_gen, ARENA_OUTPUT, "deval-out",
                               size, msg, msglen);
        if (r < 0)
                return r;
        g->dhdr->out_gen = g->locked.out_gen;
        g->dhdr->out_size = g->locked.out.size;
        return 0;
}

/**
 * output_ensure_dev() - output_ensure() for a device group: every GPU that
 * receives gets an output arena of at least size bytes.
 */
int output_ensure_dev(Group *g, uint64_t size, char *msg, size_t msglen) {
        for (int dev = 0; dev < DV_MAX_GPUS; dev++) {
                DevArena *cur = &g->locked.dout[dev], a;
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
                g->locked.dev_out_gen++;
                charge_commit(&ch);
                pthread_mutex_unlock(&g->lock);
                dev_arena_deinit(&old);
                g->dhdr->dev_out_gen = g->locked.dev_out_gen;
        }
        return 0;
}

/**
 * output_direct() - the group's direct output (wire.h, DV_REQ_DIRECT), made or grown to hold
 * size bytes within the quota: a memfd every rank maps writable, sealed against resizing, that
 * devald never reads. A new one gets a new generation. Main thread.
 * Return: 0 with its fd (the group's: send it, don't close it), size and generation in *ret,
 * or DEVAL_ENOMEM / an allocation failure with msg.
 */
int output_direct(Group *g, uint64_t size, Arena *ret, uint64_t *gen, char *msg, size_t msglen) {
        if (size > g->loop.direct.size || g->loop.direct.fd < 0) {
                int r = output_replace(g, &g->loop.direct, &g->loop.direct_gen, ARENA_SHARED,
                                       "deval-direct", size, msg, msglen);
                if (r < 0)
                        return r;
        }
        *ret = g->loop.direct;
        *gen = g->loop.direct_gen;
        return 0;
}
