/* SPDX-License-Identifier: MIT */
/*
 * group_arena.c - a running group's arenas as its members ask for them on the main thread: a
 * larger input, under the group's and the uid's quotas (host memory made here; device memory
 * made by a job, off the loop, and handed over when it is done), and the descriptors of the
 * output arenas the worker replaces as results grow.
 */
#define _GNU_SOURCE
#include "group_arena.h"

#include <stdio.h>

#include "daemon.h"
#include "gpu_jobs.h"
#include "group.h"
#include "reply.h"
#include "topo.h"
#include "usage.h"
#include "util.h"

/**
 * group_grow_input() - give rank a larger input arena of at least size bytes, within the
 * group's quota. The worker swaps it in before the rank's next step.
 * Return: 0 with *ret describing the new arena (fd owned by the group; send it, don't close
 * it), DEVAL_ENOMEM past the quota, DEVAL_EINVAL when size is absurd.
 */
int group_grow_input(Group *g, int rank, uint64_t size, Arena *ret, char *msg, size_t msglen) {
        Member *m = &g->members[rank];
        Arena a;
        char name[96];
        int r;

        Charge ch;
        /* bytes_mapped counts the arena the rank will use next: the pending one, if any */
        pthread_mutex_lock(&g->lock);
        uint64_t current = m->in_pending.map ? m->in_pending.size : m->in.size;
        pthread_mutex_unlock(&g->lock);
        char why[160];
        if (charge_take(g, current, size, &ch, why, sizeof(why)) < 0) {
                snprintf(msg, msglen, "rank %d needs %llu bytes of input, which would take %s",
                         rank, (unsigned long long)size, why);
                return DEVAL_ENOMEM;
        }
        snprintf(name, sizeof(name), "deval-in-%s-%d", g->name, rank);
        if ((r = arena_new(name, ch.want, ARENA_INPUT, &a)) == 0)
                topo_prefer_memory(a.map, ch.want, m->numa);
        if (r < 0) {
                charge_drop(&ch);
                snprintf(msg, msglen, "devald could not allocate %llu bytes: %s",
                         (unsigned long long)ch.want, deval_strerror(r));
                return r;
        }
        pthread_mutex_lock(&g->lock);
        arena_deinit(&m->in_pending);
        m->in_pending = a;
        charge_commit(&ch);
        pthread_mutex_unlock(&g->lock);
        *ret = a;
        return 0;
}

/* The job that made a rank's larger device input is done: hand it over, or say why not. */
static void group_dev_input_done(GpuJob *j) {
        Group *g = j->g;
        Member *m = &g->members[j->rank];
        bool asking = m->conn == j->conn; /* the member that asked is still connected */

        g->loop.jobs--;
        if (j->status == 0 && asking && g->loop.state == DV_GROUP_ACTIVE) {
                DevArena a = j->arenas[0];
                j->arenas[0] = DEV_ARENA_NULL;
                pthread_mutex_lock(&g->lock);
                DevArena old = m->din_pending;
                m->din_pending = a;
                charge_commit(&j->charge);
                pthread_mutex_unlock(&g->lock);
                gpu_jobs_free_arenas(g->d, &old, 1);
                /* the fd stays the group's: this rank's next growth is what replaces it */
                conn_reply_segments(j->conn, &(ConnSegments){.fds = &a.fd,
                                                             .sizes = &a.size,
                                                             .n = 1,
                                                             .flags = DV_REPLY_DEVICE});
        } else {
                charge_drop(&j->charge);
                if (asking && j->status < 0) {
                        char msg[DV_MSG_MAX];
                        snprintf(msg, sizeof(msg),
                                 "devald could not allocate %llu bytes on GPU %d: %.*s",
                                 (unsigned long long)j->charge.want, m->device, DV_MSG_MAX - 96,
                                 j->msg);
                        conn_reply(j->conn, j->status, msg);
                } else if (asking) {
                        conn_reply(j->conn, DEVAL_EABORTED, "the group failed");
                }
        }
        gpu_jobs_free_arenas(g->d, j->arenas, j->n); /* what was not handed over */
        group_maybe_free(g);
}

/**
 * group_grow_dev_input() - group_grow_input() for a device group's device input arena, made
 * by a job off the loop (gpu_jobs.h): c is answered when it is done.
 * Return: 1 (the answer follows), or DEVAL_ENOMEM / DEVAL_ESYS with msg.
 */
int group_grow_dev_input(Group *g, Conn *c, uint64_t size, char *msg, size_t msglen) {
        Member *m = &g->members[c->rank];
        Charge ch;

        pthread_mutex_lock(&g->lock);
        uint64_t current = m->din_pending.ptr ? m->din_pending.size : m->din.size;
        pthread_mutex_unlock(&g->lock);
        char why[160];
        if (charge_take(g, current, size, &ch, why, sizeof(why)) < 0) {
                snprintf(msg, msglen,
                         "rank %d needs %llu bytes of device input, which would take %s", c->rank,
                         (unsigned long long)size, why);
                return DEVAL_ENOMEM;
        }
        GpuJob *j = gpu_job_new(g->d, g, 1);
        if (j) {
                j->arenas[0] = (DevArena){.device = m->device, .fd = -1, .size = ch.want};
                j->conn = c;
                j->rank = c->rank;
                j->charge = ch;
                j->done = group_dev_input_done;
        }
        if (!j || gpu_job_start(j) < 0) {
                if (j) {
                        free(j->arenas);
                        free(j);
                }
                charge_drop(&ch);
                snprintf(msg, msglen, "devald could not start allocating %llu bytes on GPU %d",
                         (unsigned long long)ch.want, m->device);
                return DEVAL_ESYS;
        }
        g->loop.jobs++;
        return 1;
}

/**
 * group_dev_output_fd() - the output arena on rank's GPU: its size into *size, the device
 * outputs' generation into *gen. Any thread.
 * Return: its descriptor (the group's: send it, don't close it), or -1 for a host rank.
 */
int group_dev_output_fd(Group *g, int rank, uint64_t *size, uint64_t *gen) {
        int dev = g->members[rank].device;
        if (dev < 0)
                return -1;
        pthread_mutex_lock(&g->lock);
        int fd = g->locked.dout[dev].fd;
        *size = g->locked.dout[dev].size;
        *gen = g->locked.dev_out_gen;
        pthread_mutex_unlock(&g->lock);
        return fd;
}

/**
 * group_output_fd() - the current host output arena: its size into *size, its generation
 * into *gen. Any thread.
 * Return: its descriptor (the group's: send it, don't close it), or -1 when there is none.
 */
int group_output_fd(Group *g, uint64_t *size, uint64_t *gen) {
        pthread_mutex_lock(&g->lock);
        int fd = g->locked.out.fd;
        *size = g->locked.out.size;
        *gen = g->locked.out_gen;
        pthread_mutex_unlock(&g->lock);
        return fd;
}
