/* SPDX-License-Identifier: MIT */
/*
 * gpu_jobs.h - device memory made and given back off devald's event loop (gpu_jobs.c).
 *
 * Allocating or freeing device memory waits on the GPU's worker process, which may be in a
 * copy kernel for up to its timeout, and so may joining a group's worker thread in the middle
 * of a step: on the event loop that would stall every group and deval-ctl. So the loop hands
 * such calls to a job, a thread of its own that makes them and posts the job back (an
 * eventfd in the loop's epoll); the loop then finishes it, on the main thread. A job's group
 * is its owner's to hold (group.c, group_join.c and group_arena.c count them in
 * g->loop.jobs).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "daemon.h"
#include "usage.h"

#define GPU_JOB_ARENAS (2 * DV_MAX_GPUS)

typedef struct GpuJob GpuJob;
struct GpuJob {
        Daemon *d;
        Group *g; /* NULL: a job of no group's (freeing what a freed group held) */
        /* on the job's thread: work(j) when set; else allocate arenas[0..n) (each .device
         * and .size set), or free them when free is set; any failure gives back what it made */
        void (*work)(GpuJob *j);
        bool free;
        int n;
        DevArena *arenas; /* [n] */
        int status;       /* 0, or the first failure, said in msg */
        char msg[DV_MSG_MAX];
        /* then on the main thread, unless NULL; the job is freed after it */
        void (*done)(GpuJob *j);
        /* for done(): who asked, what was charged */
        Conn *conn;
        int rank;
        Charge charge;
        GpuJob *next;
};

/* The job table: its eventfd into d's epoll. 0, or a negative errno with why. */
int gpu_jobs_init(Daemon *d, char *why, size_t whylen);
/* A job of n arenas for g (NULL: none), zeroed but for those: NULL out of memory. */
GpuJob *gpu_job_new(Daemon *d, Group *g, int n);
/* Start j on a thread of its own: 0, or DEVAL_ESYS (j untouched, still the caller's). */
int gpu_job_start(GpuJob *j);
/* Give arenas[0..n) back on a job, or here when no thread starts; they are left null. */
void gpu_jobs_free_arenas(Daemon *d, DevArena *arenas, int n);
/* The eventfd is readable: finish the jobs that are done. */
void gpu_jobs_finish(Daemon *d);
/* devald stops: wait for every job and finish it. */
void gpu_jobs_drain(Daemon *d);
