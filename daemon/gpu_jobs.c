/* SPDX-License-Identifier: MIT */
/*
 * gpu_jobs.c - device memory made and given back off devald's event loop: each job is a
 * detached thread that makes the blocking calls and queues the job for the main thread,
 * which an eventfd wakes.
 */
#define _GNU_SOURCE
#include "gpu_jobs.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gpu_worker.h"
#include "log.h"

/**
 * gpu_jobs_init() - the eventfd that jobs post to, in d's epoll (its data: &d->jobs_fd).
 * Return: 0, or a negative errno with why.
 */
int gpu_jobs_init(Daemon *d, char *why, size_t whylen) {
        pthread_mutex_init(&d->jobs_lock, NULL);
        d->jobs_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &d->jobs_fd};
        if (d->jobs_fd < 0 || epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->jobs_fd, &ev) < 0) {
                int e = errno;
                snprintf(why, whylen, "cannot set up devald's GPU jobs: %s", strerror(e));
                return -e;
        }
        return 0;
}

GpuJob *gpu_job_new(Daemon *d, Group *g, int n) {
        GpuJob *j = calloc(1, sizeof(*j));
        DevArena *a = calloc((size_t)(n > 0 ? n : 1), sizeof(*a));
        if (!j || !a) {
                free(j);
                free(a);
                return NULL;
        }
        for (int i = 0; i < n; i++)
                a[i] = DEV_ARENA_NULL;
        *j = (GpuJob){.d = d, .g = g, .n = n, .arenas = a, .rank = -1};
        return j;
}

static void job_free(GpuJob *j) {
        free(j->arenas);
        free(j);
}

/* The blocking part: its own work, every allocation (undone on a failure), or every free. */
static void job_work(GpuJob *j) {
        if (j->work) {
                j->work(j);
                return;
        }
        if (j->free) {
                for (int i = 0; i < j->n; i++)
                        dev_arena_deinit(&j->arenas[i]);
                return;
        }
        for (int i = 0; i < j->n; i++) {
                DevArena *a = &j->arenas[i];
                int r = dev_arena_new(a->device, a->size, a);
                if (r == 0)
                        continue;
                j->status = r;
                snprintf(j->msg, sizeof(j->msg), "%s", dv_gpu_error());
                for (int k = 0; k < i; k++)
                        dev_arena_deinit(&j->arenas[k]);
                return;
        }
}

static void *job_main(void *arg) {
        GpuJob *j = arg;
        Daemon *d = j->d;
        job_work(j);
        pthread_mutex_lock(&d->jobs_lock);
        j->next = d->jobs_done;
        d->jobs_done = j;
        pthread_mutex_unlock(&d->jobs_lock);
        uint64_t one = 1;
        if (write(d->jobs_fd, &one, sizeof(one)) < 0)
                log_warn("cannot wake devald's loop for a GPU job: %m");
        return NULL;
}

/**
 * gpu_job_start() - run j on a detached thread; it holds its group until it is finished.
 * Return: 0, or DEVAL_ESYS when no thread starts (j is still the caller's).
 */
int gpu_job_start(GpuJob *j) {
        pthread_attr_t attr;
        pthread_t t;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int e = pthread_create(&t, &attr, job_main, j);
        pthread_attr_destroy(&attr);
        if (e != 0) {
                log_warn("cannot start a GPU job: %s", strerror(e));
                return DEVAL_ESYS;
        }
        j->d->jobs_running++;
        return 0;
}

/**
 * gpu_jobs_free_arenas() - give arenas[0..n) back to their GPUs on a job, of no group, so
 * that the loop does not wait for it; where no thread starts, here. They are left null.
 */
void gpu_jobs_free_arenas(Daemon *d, DevArena *arenas, int n) {
        int k = 0;
        for (int i = 0; i < n; i++)
                k += arenas[i].device >= 0 || arenas[i].fd >= 0;
        if (k == 0)
                return;
        GpuJob *j = gpu_job_new(d, NULL, k);
        if (j) {
                j->free = true;
                for (int i = 0, at = 0; i < n; i++)
                        if (arenas[i].device >= 0 || arenas[i].fd >= 0)
                                j->arenas[at++] = arenas[i];
                if (gpu_job_start(j) == 0) {
                        for (int i = 0; i < n; i++)
                                arenas[i] = DEV_ARENA_NULL;
                        return;
                }
                job_free(j);
        }
        for (int i = 0; i < n; i++)
                dev_arena_deinit(&arenas[i]);
}

/**
 * gpu_jobs_finish() - the jobs done since the last call: each one's done() on this (the
 * main) thread, which releases its group.
 */
void gpu_jobs_finish(Daemon *d) {
        uint64_t n;
        if (read(d->jobs_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
                log_warn("reading devald's GPU job count: %m");
        pthread_mutex_lock(&d->jobs_lock);
        GpuJob *j = d->jobs_done;
        d->jobs_done = NULL;
        pthread_mutex_unlock(&d->jobs_lock);
        while (j) {
                GpuJob *next = j->next;
                if (j->done)
                        j->done(j);
                d->jobs_running--;
                job_free(j);
                j = next;
        }
}

/* devald stops: every job finished, the last ones' as they end. */
void gpu_jobs_drain(Daemon *d) {
        while (d->jobs_running > 0) {
                struct pollfd p = {.fd = d->jobs_fd, .events = POLLIN};
                if (poll(&p, 1, 1000) < 0 && errno != EINTR)
                        break;
                gpu_jobs_finish(d);
        }
}
