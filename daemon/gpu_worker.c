/* SPDX-License-Identifier: MIT */
/*
 * gpu_worker.c - one worker process per GPU, and devald's side of talking to them.
 *
 * devald starts "devald --gpu-worker N" for each GPU N (a fresh exec: CUDA does not survive
 * fork()) on a socketpair. Requests and replies are fixed headers plus arrays, over a stream
 * socket because a plan's segment table can be large; the descriptor of exported memory
 * rides on the reply (SCM_RIGHTS). The calls are synchronous: each worker has a lock, held
 * from request to reply, so the group workers and the main thread can share it.
 *
 * A worker that dies, hits a sticky CUDA error (it says so and exits), or does not answer in
 * time is reaped and its generation bumped; the next call starts a new one. An arena made
 * by an older generation belongs to a dead context: using it fails, naming the GPU.
 */
#define _GNU_SOURCE
#include "gpu_worker.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
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

#include "log.h"
#include "util.h"
#include "wire.h"

enum {
        GW_ALLOC = 1, /* size -> ptr, and the export descriptor */
        GW_IMPORT,    /* id, device (where it lives), size, and a descriptor */
        GW_FREE,      /* id: unmap, whether made here or imported */
        GW_RUN        /* out_id, nsegs, nsrcs; then segs, starts, GwSrc[nsrcs] */
};

typedef struct {
        uint32_t op;
        int32_t device;
        uint64_t id;
        uint64_t size;
        uint64_t out_id;
        uint32_t nsegs;
        uint32_t nsrcs;
} GwReq;

typedef struct {
        uint64_t id;
        uint64_t off;
        uint64_t bytes;
} GwSrc;

typedef struct {
        int32_t status;
        uint32_t sticky; /* the worker hit a sticky error and exits after this reply */
        uint64_t ptr;
        uint64_t p2p; /* the first reply: the peers proven readable */
        char err[232];
} GwRep;

_Static_assert(sizeof(GwRep) == 256, "GwRep is one 256-byte record");

/* A plan no larger than this many segments (devald's plans are bounded far below). */
#define GW_MAX_SEGS (1u << 26)
#define GW_MAX_SRCS (1u << 20)

/* ---- transport --------------------------------------------------------------------------- */

/* Write all of iov, with fd (if >= 0) on the first byte. 0, or -errno. */
static int send_all(int sock, struct iovec *iov, int n, int fd) {
        char cbuf[CMSG_SPACE(sizeof(int))] = {0};
        bool fd_sent = fd < 0;
        while (n > 0) {
                struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
                if (!fd_sent) {
                        mh.msg_control = cbuf;
                        mh.msg_controllen = sizeof(cbuf);
                        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
                        c->cmsg_level = SOL_SOCKET;
                        c->cmsg_type = SCM_RIGHTS;
                        c->cmsg_len = CMSG_LEN(sizeof(int));
                        memcpy(CMSG_DATA(c), &fd, sizeof(int));
                }
                ssize_t k = sendmsg(sock, &mh, MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                fd_sent = true;
                while (n > 0 && (size_t)k >= iov->iov_len) {
                        k -= (ssize_t)iov->iov_len;
                        iov++;
                        n--;
                }
                if (n > 0) {
                        iov->iov_base = (char *)iov->iov_base + k;
                        iov->iov_len -= (size_t)k;
                }
        }
        return 0;
}

/*
 * Read exactly len bytes, taking a descriptor that rides along into *ret_fd (when ret_fd is
 * NULL, or one came already, it is closed). timeout_ms < 0: wait forever.
 * 0, -EPIPE at end of stream, -ETIMEDOUT, or -errno.
 */
static int recv_all(int sock, void *buf, size_t len, int *ret_fd, int timeout_ms) {
        uint8_t *p = buf;
        uint64_t deadline = timeout_ms < 0 ? 0 : dv_now_ns() + (uint64_t)timeout_ms * 1000000;
        while (len > 0) {
                if (timeout_ms >= 0) {
                        uint64_t now = dv_now_ns();
                        if (now >= deadline)
                                return -ETIMEDOUT;
                        struct pollfd pfd = {.fd = sock, .events = POLLIN};
                        int ms = (int)DV_MIN((deadline - now) / 1000000 + 1, (uint64_t)INT_MAX);
                        int r = poll(&pfd, 1, ms);
                        if (r < 0 && errno != EINTR)
                                return -errno;
                        if (r <= 0)
                                continue;
                }
                char cbuf[CMSG_SPACE(sizeof(int) * 4)];
                struct iovec iov = {.iov_base = p, .iov_len = len};
                struct msghdr mh = {.msg_iov = &iov,
                                    .msg_iovlen = 1,
                                    .msg_control = cbuf,
                                    .msg_controllen = sizeof(cbuf)};
                ssize_t k = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        int nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                        for (int i = 0; i < nfd; i++) {
                                int fd;
                                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                                if (ret_fd && *ret_fd < 0)
                                        *ret_fd = fd;
                                else
                                        close(fd);
                        }
                }
                if (k == 0)
                        return -EPIPE;
                p += k;
                len -= (size_t)k;
        }
        return 0;
}

/*
 * Make room for one more element in *arr (n used of *cap, elem bytes each), doubling from
 * first. Return: 0, or DEVAL_ENOMEM with the array untouched.
 */
static int grow(void *arr, size_t n, size_t *cap, size_t elem, size_t first) {
        if (n < *cap)
                return 0;
        size_t want = *cap ? *cap * 2 : first;
        void *p = realloc(*(void **)arr, want * elem);
        if (!p)
                return dv_gpu_fail(DEVAL_ENOMEM, "devald is out of memory");
        *(void **)arr = p;
        *cap = want;
        return 0;
}

/* ---- devald's side ----------------------------------------------------------------------- */

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

/* How long a worker may take to answer (a copy of a few GiB takes well under a second). */
static int worker_timeout_ms(void) {
        const char *env = getenv("DEVAL_GPU_WORKER_TIMEOUT_MS");
        int ms = env ? atoi(env) : 0;
        return ms > 0 ? ms : 60000;
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
                 * with devald: it watches devald's pidfd (fd 4, gpuw_main()). Not
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
        int r = recv_all(w->sock, &hello, sizeof(hello), NULL, worker_timeout_ms());
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
        if ((r = send_all(w->sock, iov, niov, fd_out)) == 0)
                r = recv_all(w->sock, rep, sizeof(*rep), ret_fd, worker_timeout_ms());
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
        int r = grow(&w->imported, w->nimported, &w->cap, sizeof(*w->imported), 16);
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

/* ---- the worker process ------------------------------------------------------------------ */

typedef struct {
        uint64_t id;
        int device; /* where the memory lives */
        DvDevPtr ptr;
        uint64_t size;
} Mapping;

typedef struct {
        const DvGpuApi *api;
        int device;
        uint64_t p2p;
        Mapping *maps;
        size_t nmaps, cap;
        void *stage; /* pinned host memory for the inputs of GPUs without P2P */
        DvDevPtr stage_dev;
        size_t stage_size;
} Gw;

static Mapping *gw_find(Gw *gw, uint64_t id) {
        for (size_t i = 0; i < gw->nmaps; i++)
                if (gw->maps[i].id == id)
                        return &gw->maps[i];
        return NULL;
}

static int gw_add(Gw *gw, Mapping m) {
        int r = grow(&gw->maps, gw->nmaps, &gw->cap, sizeof(*gw->maps), 64);
        if (r < 0)
                return r;
        gw->maps[gw->nmaps++] = m;
        return 0;
}

/*
 * Whether this GPU's kernel reads peer's memory correctly: the driver must say it can, and
 * a 64 KiB test copy through the copy kernel from memory exported on peer must arrive
 * intact. A sticky error here ends the process (exit 4): devald then starts a worker that
 * does not try.
 */
static bool gw_probe_peer(Gw *gw, int peer) {
        const DvGpuApi *api = gw->api;
        enum {
                N = 64 << 10
        };
        int ok = 0, fd = -1;
        DvDevPtr src = 0, dst = 0;
        bool proven = false;
        _cleanup_(freep) uint8_t *pat = malloc(N);
        _cleanup_(freep) uint8_t *back = malloc(N);

        if (!pat || !back || api->can_access_peer(gw->device, peer, &ok) < 0 || !ok)
                return false;
        for (int i = 0; i < N; i++)
                pat[i] = (uint8_t)(i * 131 + peer * 7 + 1);
        if (api->export_alloc(peer, N, &src, &fd) < 0)
                goto out;
        close(fd);
        DvKernelSeg seg = {.kind = DV_KSEG_COPY, .len = N, .count = 1};
        uint64_t starts[2] = {0, N};
        if (api->alloc(gw->device, N, &dst) < 0 || api->copy_to_device(peer, src, pat, N) < 0)
                goto out;
        if (api->run_plan(gw->device, &seg, starts, 1, dst, &src, 1) < 0) {
                if (dv_gpu_sticky())
                        _exit(4);
                goto out;
        }
        proven = api->copy_to_host(gw->device, back, dst, N) == 0 && memcmp(pat, back, N) == 0;
out:
        if (dst)
                api->free(gw->device, dst);
        if (src)
                api->unmap(peer, src, N);
        if (!proven)
                log_info("GPU %d: kernels here do not read GPU %d's memory directly (%s); its "
                         "inputs are staged through host memory",
                         gw->device, peer, dv_gpu_error()[0] ? dv_gpu_error() : "test copy");
        return proven;
}

/* Whether this GPU's kernel reads m directly: its own memory, or a peer's proven by P2P. */
static bool gw_reads(const Gw *gw, const Mapping *m) {
        return m->device == gw->device || (gw->p2p >> m->device & 1);
}

static int gw_run(Gw *gw, const GwReq *req, const DvKernelSeg *segs, const uint64_t *starts,
                  const GwSrc *srcs) {
        const DvGpuApi *api = gw->api;
        Mapping *out = gw_find(gw, req->out_id);
        if (!out || out->device != gw->device)
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: the output arena is not here", gw->device);
        if (starts[0] != 0 || starts[req->nsegs] > out->size)
                return dv_gpu_fail(DEVAL_ESYS, "GPU %d: the plan writes past the output",
                                   gw->device);
        _cleanup_(freep) DvDevPtr *ptrs = calloc(req->nsrcs ? req->nsrcs : 1, sizeof(*ptrs));
        _cleanup_(freep) Mapping **ms = calloc(req->nsrcs ? req->nsrcs : 1, sizeof(*ms));
        if (!ptrs || !ms)
                return dv_gpu_fail(DEVAL_ENOMEM, "GPU worker: out of memory");
        size_t staged = 0;
        for (uint32_t i = 0; i < req->nsrcs; i++) {
                Mapping *m = ms[i] = gw_find(gw, srcs[i].id);
                if (!m || srcs[i].off > m->size || srcs[i].bytes > m->size - srcs[i].off)
                        return dv_gpu_fail(DEVAL_ESYS, "GPU %d: source %u is not mapped here",
                                           gw->device, i);
                if (!gw_reads(gw, m))
                        staged += DV_ALIGN(srcs[i].bytes, 64);
        }
        if (staged > gw->stage_size) {
                api->host_free(gw->stage);
                gw->stage = NULL;
                gw->stage_size = 0;
                int r = api->host_alloc(staged, &gw->stage, &gw->stage_dev);
                if (r < 0)
                        return r;
                gw->stage_size = staged;
        }
        size_t at = 0;
        for (uint32_t i = 0; i < req->nsrcs; i++) {
                Mapping *m = ms[i];
                ptrs[i] = m->ptr + srcs[i].off;
                if (gw_reads(gw, m))
                        continue;
                /* no P2P from m's GPU: its bytes come through pinned host memory */
                int r = api->copy_to_host(m->device, (uint8_t *)gw->stage + at, ptrs[i],
                                          srcs[i].bytes);
                if (r < 0)
                        return r;
                ptrs[i] = gw->stage_dev + at;
                at += DV_ALIGN(srcs[i].bytes, 64);
        }
        return api->run_plan(gw->device, segs, starts, req->nsegs, out->ptr, ptrs, req->nsrcs);
}

/* A request devald and this worker disagree on: the worker stops. Not a DEVAL_E* (-1 is
 * DEVAL_EINVAL, which a driver call may return and devald must hear). */
#define GW_STOP INT_MIN

/* Serve one request; fills rep and *ret_fd (to send). Return: -1 at end of stream. */
static int gw_serve(Gw *gw, int sock, GwRep *rep, int *ret_fd) {
        GwReq req;
        int fd = -1, r;
        if (recv_all(sock, &req, sizeof(req), &fd, -1) < 0)
                return -1;
        *rep = (GwRep){0};
        dv_gpu_fail(0, "%s", "");
        switch (req.op) {
        case GW_ALLOC: {
                DvDevPtr p;
                r = gw->api->export_alloc(gw->device, req.size, &p, ret_fd);
                if (r == 0 && (r = gw_add(gw, (Mapping){req.id, gw->device, p, req.size})) < 0) {
                        gw->api->unmap(gw->device, p, req.size);
                        close(*ret_fd);
                        *ret_fd = -1;
                }
                rep->ptr = r == 0 ? p : 0;
                break;
        }
        case GW_IMPORT: {
                DvDevPtr p;
                r = fd < 0 ? dv_gpu_fail(DEVAL_ESYS, "GPU %d: import without a descriptor",
                                         gw->device)
                           : gw->api->import_fd(req.device, fd, req.size, &p);
                if (r == 0 && (r = gw_add(gw, (Mapping){req.id, req.device, p, req.size})) < 0)
                        gw->api->unmap(req.device, p, req.size);
                break;
        }
        case GW_FREE: {
                Mapping *m = gw_find(gw, req.id);
                r = 0;
                if (m) {
                        r = gw->api->unmap(m->device, m->ptr, m->size);
                        *m = gw->maps[--gw->nmaps];
                }
                break;
        }
        case GW_RUN: {
                if (req.nsegs > GW_MAX_SEGS || req.nsrcs > GW_MAX_SRCS) {
                        r = GW_STOP;
                        break;
                }
                size_t nseg = req.nsegs, nsrc = req.nsrcs;
                _cleanup_(freep) DvKernelSeg *segs = malloc((nseg ? nseg : 1) * sizeof(*segs));
                _cleanup_(freep) uint64_t *starts = malloc((nseg + 1) * sizeof(*starts));
                _cleanup_(freep) GwSrc *srcs = malloc((nsrc ? nsrc : 1) * sizeof(*srcs));
                if (!segs || !starts || !srcs ||
                    recv_all(sock, segs, nseg * sizeof(*segs), NULL, -1) < 0 ||
                    recv_all(sock, starts, (nseg + 1) * sizeof(*starts), NULL, -1) < 0 ||
                    recv_all(sock, srcs, nsrc * sizeof(*srcs), NULL, -1) < 0) {
                        r = GW_STOP;
                        break;
                }
                r = gw_run(gw, &req, segs, starts, srcs);
                break;
        }
        default:
                r = GW_STOP;
        }
        if (fd >= 0)
                close(fd);
        if (r == GW_STOP)
                return -1; /* devald and this worker disagree on the protocol: stop */
        rep->status = r;
        rep->sticky = r < 0 && dv_gpu_sticky();
        if (r < 0)
                snprintf(rep->err, sizeof(rep->err), "GPU %d: %s%s", gw->device, dv_gpu_error(),
                         rep->sticky ? " (a sticky error: the GPU's worker process restarts)" : "");
        return 0;
}

/**
 * gpuw_main() - the worker process for GPU device, serving devald on sock until devald
 * hangs up; exits after a sticky error (status 3) or a faulting test copy (status 4).
 */
/* The worker's watch on devald (its pidfd on fd 4): devald gone, the worker goes too,
 * even in the middle of a kernel. */
static void *parent_watch(void *arg) {
        struct pollfd p = {.fd = (int)(intptr_t)arg, .events = POLLIN};
        while (poll(&p, 1, -1) < 0 && errno == EINTR)
                ;
        _exit(0);
}

int gpuw_main(int sock, int device, int no_p2p) {
        pthread_t watch;
        struct pollfd probe = {.fd = 4, .events = POLLIN};
        int ready = poll(&probe, 1, 0); /* POLLNVAL: a kernel without pidfds, no watch */
        if (ready == 1 && !(probe.revents & POLLNVAL))
                return 0; /* devald is already gone */
        if (ready == 0 && pthread_create(&watch, NULL, parent_watch, (void *)(intptr_t)4) == 0)
                pthread_detach(watch);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_IGN); /* a ^C to devald's terminal is devald's to handle */
        signal(SIGPIPE, SIG_IGN);
        Gw gw = {.api = dv_gpu(), .device = device};
        GwRep rep = {0};
        int n = 0;

        rep.status = gw.api->init();
        if (rep.status == 0)
                rep.status = gw.api->device_count(&n);
        if (rep.status == 0 && (device < 0 || device >= n))
                rep.status = dv_gpu_fail(DEVAL_EINVAL, "no GPU %d (%d visible)", device, n);
        for (int k = 0; rep.status == 0 && !no_p2p && k < n && k < DV_MAX_GPUS; k++)
                if (k != device && gw_probe_peer(&gw, k))
                        gw.p2p |= 1ull << k;
        if (rep.status < 0)
                snprintf(rep.err, sizeof(rep.err), "%s", dv_gpu_error());
        rep.p2p = gw.p2p;
        struct iovec iov = {.iov_base = &rep, .iov_len = sizeof(rep)};
        if (send_all(sock, &iov, 1, -1) < 0 || rep.status < 0)
                return 1;
        int status = 0;
        for (;;) {
                int fd = -1;
                if (gw_serve(&gw, sock, &rep, &fd) < 0)
                        break;
                iov = (struct iovec){.iov_base = &rep, .iov_len = sizeof(rep)};
                int r = send_all(sock, &iov, 1, fd);
                if (fd >= 0)
                        close(fd);
                if (r < 0)
                        break;
                if (rep.sticky) {
                        status = 3; /* the context is gone: exit without touching it again */
                        break;
                }
        }
        for (size_t i = 0; status == 0 && i < gw.nmaps; i++)
                gw.api->unmap(gw.maps[i].device, gw.maps[i].ptr, gw.maps[i].size);
        free(gw.maps);
        if (status == 0)
                gw.api->host_free(gw.stage);
        return status;
}
