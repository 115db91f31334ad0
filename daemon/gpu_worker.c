/* SPDX-License-Identifier: MIT */
/*
 * gpu_worker.c - devald's side of its GPU worker processes (gpu_serve.c): starting one per
 * GPU, talking to it (gpu_proto.h), timing it out, and saying how it ended.
 *
 * devald starts "devald --gpu-worker N" for each GPU N (a fresh exec: CUDA does not survive
 * fork()) on a socketpair. The calls are synchronous: each worker has a lock, held from
 * request to reply, so the group workers and the main thread can share it.
 *
 * A worker that dies, hits a sticky CUDA error (it says so and exits), or does not answer in
 * time is reaped and its generation bumped; the next call starts a new one. An arena made
 * by an older generation belongs to a dead context: using it fails, naming the GPU.
 */
#define _GNU_SOURCE
#include "gpu_worker.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "deval.h"

#include "gpu_proto.h"
#include "log.h"
#include "tunables.h"
#include "util.h"
#include "wire.h"

typedef struct {
        pthread_mutex_t lock;
        int device;
        pid_t pid; /* 0: not running */
        int sock;
        uint32_t gen;       /* bumped each time a worker goes down */
        uint64_t p2p;       /* from the running worker's test copies */
        bool no_p2p;        /* a test copy crashed a worker: the next ones do not try */
        uint64_t *imported; /* ids of other GPUs' arenas this worker has mapped */
        size_t nimported, cap;
} Worker;

static Worker workers[DV_MAX_GPUS];
static int nworkers;
static char self_exe[PATH_MAX];
static _Atomic uint64_t next_id = 1;
/* How long a worker may take to answer (a copy of a few GiB takes well under a second):
 * $DEVAL_GPU_WORKER_TIMEOUT_MS, read when the workers start. */
static int timeout_ms = 60000;

static int worker_timeout_ms(void) {
        return timeout_ms;
}

static void describe_exit(int status, char *buf, size_t len) {
        if (WIFEXITED(status))
                snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
        else if (WIFSIGNALED(status))
                snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status),
                         strsignal(WTERMSIG(status)));
        else
                snprintf(buf, len, "ended");
}

/*
 * Hang up on w's process and reap it: it exits at end of stream, or after a sticky error;
 * one that is wedged in the driver gets a second, then SIGKILL. Locked.
 * Return: its wait status (0 when none ran).
 */
static int worker_reap(Worker *w) {
        int status = 0;
        if (w->sock >= 0)
                close(w->sock);
        w->sock = -1;
        if (w->pid <= 0)
                return 0;
        for (int i = 0; i < 100; i++) {
                if (waitpid(w->pid, &status, WNOHANG) == w->pid)
                        return status;
                usleep(10000);
        }
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &status, 0);
        return status;
}

/*
 * Take w down and say so; arenas it made are now stale. Locked. Return: the wait status.
 */
static int worker_down(Worker *w, const char *why) {
        char how[96];
        pid_t pid = w->pid;
        int status = worker_reap(w);
        if (pid > 0) {
                describe_exit(status, how, sizeof(how));
                log_warn("GPU %d: worker process %d %s (%s); its groups fail, new work gets a "
                         "new worker",
                         w->device, (int)pid, how, why);
        }
        w->pid = 0;
        w->gen++;
        w->nimported = 0;
        w->p2p = 0;
        return status;
}

/* Start w's process and read its hello. Locked. 0, or DEVAL_ESYS with the error set. */
static int worker_spawn(Worker *w) {
        int sv[2];
        char dev[16];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: socketpair: %s", w->device,
                                   strerror(errno));
        snprintf(dev, sizeof(dev), "%d", w->device);
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
                close(sv[0]);
                close(sv[1]);
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: fork: %s", w->device, strerror(errno));
        }
        if (pid == 0) {
                /*
                 * Only async-signal-safe calls until exec: devald has threads. The worker ends
                 * with devald: it watches devald's pidfd (fd 4, gpu_serve_main()). Not
                 * PR_SET_PDEATHSIG, which fires when the *thread* that forked ends, and
                 * workers are started from short-lived threads (gpu_jobs.c) too.
                 */
                int pfd = (int)syscall(SYS_pidfd_open, parent, 0);
                if (getppid() != parent)
                        _exit(126);
                if (dup2(sv[1], 3) < 0) /* dup2 clears close-on-exec on 3 */
                        _exit(126);
                if (pfd >= 0 && dup2(pfd, 4) < 0)
                        _exit(126);
                char *argv[] = {"devald", "--gpu-worker", dev, w->no_p2p ? "--no-p2p" : NULL, NULL};
                execv(self_exe, argv);
                _exit(127);
        }
        close(sv[1]);
        w->pid = pid;
        w->sock = sv[0];
        GwRep hello;
        int r = gpu_proto_recv(w->sock, &hello, sizeof(hello), NULL, worker_timeout_ms());
        if (r < 0 || hello.status < 0) {
                char why[300];
                hello.err[sizeof(hello.err) - 1] = '\0';
                snprintf(why, sizeof(why), "%s", r < 0 ? "it did not start" : hello.err);
                int status = worker_down(w, why);
                if (WIFEXITED(status) && WEXITSTATUS(status) == 4)
                        w->no_p2p = true; /* its test copy faulted: the next one skips it */
                return dv_gpu_fail(r < 0 ? DEVAL_ESYS : hello.status,
                                   "GPU %d: its worker process could not start: %s", w->device,
                                   why);
        }
        w->p2p = hello.p2p;
        log_debug("GPU %d: worker process %d up, reads peers 0x%llx directly", w->device, (int)pid,
                  (unsigned long long)w->p2p);
        return 0;
}

/*
 * One request and its reply, on a running worker (started if need be). Locked.
 * Return: the worker's status; a dead or silent worker is taken down (DEVAL_ESYS).
 */
static int worker_call(Worker *w, struct iovec *iov, int niov, int fd_out, GwRep *rep,
                       int *ret_fd) {
        int r;
        if (w->pid == 0 && (r = worker_spawn(w)) < 0)
                return r;
        if ((r = gpu_proto_send(w->sock, iov, niov, fd_out)) == 0)
                r = gpu_proto_recv(w->sock, rep, sizeof(*rep), ret_fd, worker_timeout_ms());
        if (r < 0) {
                char why[96];
                snprintf(why, sizeof(why), "%s",
                         r == -ETIMEDOUT ? "it stopped answering" : "it hung up");
                pid_t pid = w->pid;
                worker_down(w, why);
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: its worker process %d %s", w->device,
                                   (int)pid, why);
        }
        rep->err[sizeof(rep->err) - 1] = '\0';
        if (rep->status < 0) {
                dv_gpu_fail(rep->status, "%s", rep->err);
                if (rep->sticky)
                        worker_down(w, rep->err);
        }
        return rep->status < 0 ? rep->status : 0;
}

/**
 * gpuw_start() - start the workers of GPUs 0..ngpus-1 (the ordinals devald sees).
 * Return: 0, or a negative errno with why (which could not start).
 */
int gpuw_start(int ngpus, char *why, size_t whylen) {
        bool set;
        uint64_t ms;
        if (dv_tunable_read(DV_TUN_GPU_WORKER_TIMEOUT_MS, &set, &ms, why, whylen) < 0)
                return -EINVAL;
        timeout_ms = set && ms > 0 ? (int)DV_MIN(ms, (uint64_t)INT32_MAX) : 60000;
        ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
        if (n <= 0) {
                int e = errno;
                snprintf(why, whylen, "cannot find devald's own executable for its GPU workers: %s",
                         strerror(e));
                return -e;
        }
        self_exe[n] = '\0';
        nworkers = DV_MIN(ngpus, DV_MAX_GPUS);
        for (int k = 0; k < nworkers; k++) {
                Worker *w = &workers[k];
                pthread_mutex_init(&w->lock, NULL);
                w->device = k;
                w->sock = -1;
                /* a worker whose test copy faulted gets one more try, without test copies */
                if (worker_spawn(w) < 0 && (!w->no_p2p || worker_spawn(w) < 0)) {
                        snprintf(why, whylen, "%s", dv_gpu_error());
                        return -EIO;
                }
        }
        return 0;
}

/**
 * gpuw_stop() - end every worker (they exit at end of stream) and reap them.
 */
void gpuw_stop(void) {
        for (int k = 0; k < nworkers; k++) {
                Worker *w = &workers[k];
                pthread_mutex_lock(&w->lock);
                worker_reap(w);
                w->pid = 0;
                free(w->imported);
                w->imported = NULL;
                w->nimported = w->cap = 0;
                pthread_mutex_unlock(&w->lock);
        }
}

/**
 * gpuw_p2p() - the peers whose memory device's copy kernel reads directly, as its running
 * worker proved them (bit k: GPU k). Takes the worker's lock.
 * Return: the mask; 0 for a device with no worker, or none running.
 */
uint64_t gpuw_p2p(int device) {
        if (device < 0 || device >= nworkers)
                return 0;
        pthread_mutex_lock(&workers[device].lock);
        uint64_t m = workers[device].p2p;
        pthread_mutex_unlock(&workers[device].lock);
        return m;
}

static Worker *worker_of(int device) {
        if (device < 0 || device >= nworkers) {
                dv_gpu_fail(DEVAL_EINVAL, "GPU %d has no worker", device);
                return NULL;
        }
        return &workers[device];
}

/**
 * gpuw_alloc() - size bytes on device, zeroed, exported: ret gets the descriptor to hand
 * to ranks (owned by ret), an id, and the worker's generation.
 * Return: 0, or DEVAL_ENOMEM (naming the GPU) / DEVAL_ESYS with dv_gpu_error() set.
 */
int gpuw_alloc(int device, uint64_t size, DevArena *ret) {
        Worker *w = worker_of(device);
        if (!w)
                return DEVAL_EINVAL;
        GwReq req = {.op = GW_ALLOC,
                     .device = device,
                     .id = atomic_fetch_add(&next_id, 1),
                     .size = size};
        struct iovec iov = {.iov_base = &req, .iov_len = sizeof(req)};
        GwRep rep;
        int fd = -1;
        pthread_mutex_lock(&w->lock);
        int r = worker_call(w, &iov, 1, -1, &rep, &fd);
        uint32_t gen = w->gen;
        pthread_mutex_unlock(&w->lock);
        if (r == 0 && fd < 0)
                r = dv_gpu_fail(DEVAL_ESYS, "GPU %d: its worker sent no descriptor", device);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                return r;
        }
        *ret = (DevArena){
                .device = device, .fd = fd, .ptr = rep.ptr, .size = size, .id = req.id, .gen = gen};
        return 0;
}

static bool imported_has(Worker *w, uint64_t id, size_t *ret_at) {
        for (size_t i = 0; i < w->nimported; i++)
                if (w->imported[i] == id) {
                        if (ret_at)
                                *ret_at = i;
                        return true;
                }
        return false;
}

/**
 * gpuw_free() - unmap a's memory in its worker and in every worker that imported it,
 * close its descriptor. Accepts a null arena. Failures only log: the memory goes with the
 * worker at the latest.
 */
void gpuw_free(DevArena *a) {
        if (a->device < 0 || !a->ptr) {
                if (a->fd >= 0)
                        close(a->fd);
                return;
        }
        GwReq req = {.op = GW_FREE, .id = a->id};
        for (int k = 0; k < nworkers; k++) {
                Worker *w = &workers[k];
                GwRep rep;
                size_t at;
                pthread_mutex_lock(&w->lock);
                bool mine = k == a->device && w->gen == a->gen && w->pid > 0;
                bool imported = imported_has(w, a->id, &at);
                if (imported)
                        w->imported[at] = w->imported[--w->nimported];
                if (mine || imported) {
                        struct iovec iov = {.iov_base = &req, .iov_len = sizeof(req)};
                        if (worker_call(w, &iov, 1, -1, &rep, NULL) < 0)
                                log_warn("GPU %d: freeing device memory: %s", k, dv_gpu_error());
                }
                pthread_mutex_unlock(&w->lock);
        }
        if (a->fd >= 0)
                close(a->fd);
}

/* Map a (another GPU's) into w, once. Locked. */
static int worker_import(Worker *w, const DevArena *a) {
        if (a->fd < 0)
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d's arena %llu has no descriptor left",
                                   a->device, (unsigned long long)a->id);
        if (imported_has(w, a->id, NULL))
                return 0;
        int r = gpu_proto_grow(&w->imported, w->nimported, &w->cap, sizeof(*w->imported), 16);
        if (r < 0)
                return r;
        GwReq req = {.op = GW_IMPORT, .device = a->device, .id = a->id, .size = a->size};
        struct iovec iov = {.iov_base = &req, .iov_len = sizeof(req)};
        GwRep rep;
        r = worker_call(w, &iov, 1, a->fd, &rep, NULL);
        if (r == 0)
                w->imported[w->nimported++] = a->id;
        return r;
}

static int check_fresh(const DevArena *a) {
        if (a->device < 0 || a->device >= nworkers || !a->ptr)
                return dv_gpu_fail(DEVAL_ESYS, "a device arena is missing");
        if (workers[a->device].gen != a->gen)
                return dv_gpu_fail(DEVAL_ESYS,
                                   "GPU %d's worker process was restarted after a fault, and this "
                                   "group's device memory there went with it",
                                   a->device);
        return 0;
}

/**
 * gpuw_run() - run a plan on device: the copy kernel reads srcs (mapping other GPUs'
 * arenas into device's worker on first use) and writes out. Blocks until the kernel is done.
 * Return: 0, or a negative DEVAL_E* with dv_gpu_error() naming the GPU and why.
 */
int gpuw_run(int device, const DvKernelSeg *segs, const uint64_t *starts, uint32_t nsegs,
             const DevArena *out, const GpuwSrc *srcs, uint32_t nsrcs) {
        Worker *w = worker_of(device);
        if (!w)
                return DEVAL_EINVAL;
        if (nsegs > GW_MAX_SEGS || nsrcs > GW_MAX_SRCS)
                return dv_gpu_fail(DEVAL_ENOMEM,
                                   "a plan of %u segments from %u sources is too "
                                   "large for one kernel",
                                   nsegs, nsrcs);
        _cleanup_(freep) GwSrc *gs = calloc(nsrcs ? nsrcs : 1, sizeof(*gs));
        if (!gs)
                return dv_gpu_fail(DEVAL_ENOMEM, "devald is out of memory");
        int r = 0;
        pthread_mutex_lock(&w->lock);
        /* generations only change under their worker's lock; a stale read here just fails
         * the step a little later, in the worker */
        if ((r = check_fresh(out)) < 0)
                goto out;
        for (uint32_t i = 0; i < nsrcs; i++) {
                const DevArena *a = srcs[i].arena;
                if ((r = check_fresh(a)) < 0)
                        goto out;
                if (a->device != device && (r = worker_import(w, a)) < 0)
                        goto out;
                gs[i] = (GwSrc){.id = a->id, .off = srcs[i].off, .bytes = srcs[i].bytes};
        }
        GwReq req = {
                .op = GW_RUN, .device = device, .out_id = out->id, .nsegs = nsegs, .nsrcs = nsrcs};
        struct iovec iov[4] = {
                {.iov_base = &req, .iov_len = sizeof(req)},
                {.iov_base = (void *)segs, .iov_len = nsegs * sizeof(*segs)},
                {.iov_base = (void *)starts, .iov_len = (nsegs + 1) * sizeof(*starts)},
                {.iov_base = gs, .iov_len = nsrcs * sizeof(*gs)},
        };
        GwRep rep;
        r = worker_call(w, iov, 4, -1, &rep, NULL);
out:
        pthread_mutex_unlock(&w->lock);
        return r;
}
