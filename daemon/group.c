/* SPDX-License-Identifier: MIT */
/*
 * group.c - groups and their shared memory, as the main thread sees them: forming a group
 * from joins, activating it (segments, worker), growing a member's input arena under the
 * group's quota, a member leaving or dying, failing a group, and freeing it once no client
 * holds it.
 */
#define _GNU_SOURCE
#include "group.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "check.h"
#include "daemon.h"
#include "exec_host.h"
#include "gpu_jobs.h"
#include "log.h"
#include "proc.h"
#include "reply.h"
#include "usage.h"
#include "util.h"
#include "worker.h"

#define ARENA_INITIAL (256 * 1024)

/* The live group called name (forming or active), or NULL. */
Group *group_lookup(Daemon *d, const char *name) {
        for (Group *g = d->groups; g; g = g->next)
                if (g->loop.listed && strcmp(g->name, name) == 0)
                        return g;
        return NULL;
}

static int group_new(Daemon *d, const DvJoinReq *req, Usage *usage, Group **ret) {
        Group *g = calloc(1, sizeof(*g));
        if (!g)
                return DEVAL_ENOMEM;
        g->members = calloc((size_t)req->world_size, sizeof(*g->members));
        if (!g->members) {
                free(g);
                return DEVAL_ENOMEM;
        }
        if (flight_init(&g->locked.flight, req->world_size) < 0) {
                free(g->members);
                free(g);
                return DEVAL_ENOMEM;
        }
        for (int r = 0; r < req->world_size; r++) {
                g->members[r].in = g->members[r].in_pending = ARENA_NULL;
                g->members[r].din = g->members[r].din_pending = DEV_ARENA_NULL;
                g->members[r].device = -1;
                g->members[r].numa = -1;
        }
        for (int k = 0; k < DV_MAX_GPUS; k++)
                g->locked.dout[k] = DEV_ARENA_NULL;
        g->device_group = req->has_device != 0;
        g->numa = -1;
        g->d = d;
        memcpy(g->name, req->group, sizeof(g->name));
        memcpy(g->launcher, req->launcher, sizeof(g->launcher)); /* checked: terminated */
        g->uid = usage->uid;
        g->usage = usage;
        usage->groups++;
        g->world = req->world_size;
        g->loop.state = DV_GROUP_FORMING;
        g->loop.listed = true;
        g->created_ns = dv_now_ns();
        g->ctl = g->done = g->locked.out = g->loop.direct = ARENA_NULL;
        pthread_mutex_init(&g->lock, NULL);
        g->next = d->groups;
        d->groups = g;
        d->ngroups++;
        *ret = g;
        return 0;
}

static void group_free(Group *g);

/* On a job's thread: the group's worker ends its step (a GPU kernel: up to its timeout). */
static void group_reap_work(GpuJob *j) {
        pthread_join(j->g->worker, NULL);
}

/* Back on the loop: the worker has ended; the rest of the group goes now. */
static void group_reaped(GpuJob *j) {
        Group *g = j->g;
        g->loop.jobs--;
        g->loop.worker_started = false;
        g->loop.reaping = false;
        group_free(g);
}

/*
 * Stop the group's worker: told between steps, it ends at once, but one in the middle of a
 * step ends after it. That is waited for here up to 20 ms; past that, a job waits for it and
 * the group is freed when it is done (the group stays listed, closing, till then).
 * Return: true when the worker has ended, false when a job took the wait.
 */
static bool group_stop_worker(Group *g) {
        pthread_mutex_lock(&g->lock);
        if (!g->locked.abort_status) {
                g->locked.abort_status = DEVAL_EABORTED;
                snprintf(g->locked.abort_msg, sizeof(g->locked.abort_msg), "group '%s' was closed",
                         g->name);
        }
        pthread_mutex_unlock(&g->lock);
        atomic_fetch_add_explicit(&g->hdr->arrive, 1, memory_order_release);
        dv_futex_wake(&g->hdr->arrive);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 20 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
        }
        if (pthread_timedjoin_np(g->worker, NULL, &until) == 0)
                return true;
        GpuJob *j = gpu_job_new(g->d, g, 0);
        if (j) {
                j->work = group_reap_work;
                j->done = group_reaped;
                if (gpu_job_start(j) == 0) {
                        g->loop.jobs++;
                        g->loop.reaping = true;
                        g->loop.state = DV_GROUP_CLOSING;
                        g->loop.listed = false; /* its name is free for a new group */
                        log_debug("group '%s': its worker ends its step, off the loop", g->name);
                        return false;
                }
                free(j->arenas);
                free(j);
        }
        pthread_join(g->worker, NULL); /* no thread for a job: here, then */
        return true;
}

static void group_free(Group *g) {
        Daemon *d = g->d;

        if (g->loop.worker_started) {
                if (!group_stop_worker(g))
                        return;
                g->loop.worker_started = false;
        }
        for (Group **p = &d->groups; *p; p = &(*p)->next)
                if (*p == g) {
                        *p = g->next;
                        break;
                }
        d->ngroups--;
        for (int r = 0; r < g->world; r++) {
                arena_deinit(&g->members[r].in);
                arena_deinit(&g->members[r].in_pending);
                /* device memory goes back through the GPUs' workers: off the loop */
                gpu_jobs_free_arenas(d, &g->members[r].din, 1);
                gpu_jobs_free_arenas(d, &g->members[r].din_pending, 1);
        }
        gpu_jobs_free_arenas(d, g->locked.dout, DV_MAX_GPUS);
        arena_deinit(&g->ctl);
        arena_deinit(&g->done);
        arena_deinit(&g->locked.out);
        arena_deinit(&g->loop.direct);
        exec_pool_free(g->work.pool);
        free(g->work.pass.rows);
        free(g->work.pass_load);
        free(g->work.pass.parked);
        free(g->work.reqs);
        free(g->work.arrivals);
        free(g->loop.span);
        free(g->members);
        flight_deinit(&g->locked.flight);
        pthread_mutex_destroy(&g->lock);
        log_info("group '%s' freed", g->name);
        atomic_fetch_sub(&g->usage->bytes, g->locked.bytes_mapped);
        g->usage->fds -= g->loop.fds_charged;
        g->usage->groups--;
        usage_put(d, g->usage);
        free(g);
}

/* Free the group once no connection refers to it any more. */
void group_maybe_free(Group *g) {
        if (g->loop.jobs)
                return;
        for (int r = 0; r < g->world; r++)
                if (g->members[r].conn)
                        return;
        group_free(g);
}

/*
 * Each rank's inline bytes (wire.h): up to DV_INLINE_MAX, so that the inline inputs and the
 * output area of the steps the ranks run take an eighth of the group's quota at most. A
 * device group's ranks stage on their GPUs: none.
 */
static uint32_t inline_size_for(const Group *g) {
        if (g->device_group)
                return 0;
        uint64_t per = g->d->max_group_bytes / 16 / (uint64_t)g->world;
        uint32_t s = DV_INLINE_MAX;
        while (s > per && s > DV_INLINE_MIN)
                s /= 2;
        return s;
}

static int group_start_worker(Group *g, char *msg, size_t msglen);
static void group_reply_all(Group *g, int status, const char *msg);

/* Why a starting group cannot go on (a member gone, devald stopping), in msg; or false. */
static bool group_start_blocked(Group *g, char *msg, size_t msglen) {
        if (g->d->stopping) {
                snprintf(msg, msglen, "devald is shutting down");
                return true;
        }
        for (int k = 0; k < g->world; k++) {
                const Member *m = &g->members[k];
                if (m->state != MEMBER_JOINED) {
                        snprintf(msg, msglen,
                                 "rank %d (pid %d) %s while devald set up group '%s' on its GPUs",
                                 k, (int)m->pid, m->state == MEMBER_LEFT ? "left" : "exited",
                                 g->name);
                        return true;
                }
        }
        return false;
}

/*
 * The job that made a device group's GPU memory is done: the group starts, or fails (the
 * job failed, a member is gone, devald stops), and every member still there is answered.
 */
static void group_devices_done(GpuJob *j) {
        Group *g = j->g;
        char msg[DV_MSG_MAX];
        int r = j->status;

        g->loop.jobs--;
        if (r < 0)
                snprintf(msg, sizeof(msg), "devald could not set up group '%s' on its GPUs: %.*s",
                         g->name, DV_MSG_MAX - 128, j->msg);
        else if (group_start_blocked(g, msg, sizeof(msg)))
                r = DEVAL_EABORTED;
        if (r == 0) {
                for (int k = 0, at = 0; k < g->world; k++) {
                        int dev = g->members[k].device;
                        g->members[k].din = j->arenas[at++];
                        j->arenas[at - 1] = DEV_ARENA_NULL;
                        if (g->locked.dout[dev].device < 0) {
                                g->locked.dout[dev] = j->arenas[at++];
                                j->arenas[at - 1] = DEV_ARENA_NULL;
                        }
                }
                g->locked.dev_out_gen = 1;
                g->dhdr->dev_out_gen = 1;
                r = group_start_worker(g, msg, sizeof(msg));
        }
        gpu_jobs_free_arenas(g->d, j->arenas, j->n); /* what a failure left */
        if (r < 0) {
                log_err("%s", msg);
                g->loop.state = DV_GROUP_FAILED;
                g->loop.listed = false;
                group_reply_all(g, r, msg);
        } else {
                log_info("group '%s' active: %d ranks", g->name, g->world);
                group_reply_all(g, 0, "");
        }
        group_maybe_free(g);
}

/*
 * A device group's GPU memory: each rank's input and an output per GPU that receives, made
 * by a job, off the loop (gpu_jobs.h); the group starts when it is done.
 * Return: 1 (the answer follows), or a status with msg.
 */
static int group_alloc_devices(Group *g, char *msg, size_t msglen) {
        bool seen[DV_MAX_GPUS] = {false};
        int n = g->world;
        for (int k = 0; k < g->world; k++)
                if (!seen[g->members[k].device]) {
                        seen[g->members[k].device] = true;
                        n++;
                }
        GpuJob *j = gpu_job_new(g->d, g, n);
        if (!j) {
                snprintf(msg, msglen, "devald could not set up group '%s': out of memory", g->name);
                return DEVAL_ENOMEM;
        }
        memset(seen, 0, sizeof(seen));
        for (int k = 0, at = 0; k < g->world; k++) { /* in the order group_devices_done() reads */
                int dev = g->members[k].device;
                j->arenas[at++] = (DevArena){.device = dev, .fd = -1, .size = ARENA_INITIAL};
                if (!seen[dev]) {
                        seen[dev] = true;
                        j->arenas[at++] =
                                (DevArena){.device = dev, .fd = -1, .size = ARENA_INITIAL};
                }
        }
        j->done = group_devices_done;
        if (gpu_job_start(j) < 0) {
                free(j->arenas);
                free(j);
                snprintf(msg, msglen, "devald could not set up group '%s': no thread for its GPUs",
                         g->name);
                return DEVAL_ESYS;
        }
        g->loop.jobs++;
        g->loop.state = DV_GROUP_STARTING;
        return 1;
}

static int group_activate(Group *g, char *msg, size_t msglen) {
        Daemon *d = g->d;
        char name[96];
        int r;

        g->layout = dv_ctl_layout(g->world, inline_size_for(g));
        uint64_t total =
                g->layout.total + dv_done_size(g->world) + ARENA_INITIAL * (uint64_t)(g->world + 1);
        if (g->device_group) { /* an input per rank, an output per GPU that receives */
                total += ARENA_INITIAL * (uint64_t)g->world;
                bool seen[DV_MAX_GPUS] = {false};
                for (int k = 0; k < g->world; k++)
                        if (!seen[g->members[k].device]) {
                                seen[g->members[k].device] = true;
                                total += ARENA_INITIAL;
                        }
        }
        if (total > d->max_group_bytes) {
                snprintf(msg, msglen,
                         "group '%s' needs %llu bytes to start, over the quota of %llu bytes "
                         "(--max-group-bytes)",
                         g->name, (unsigned long long)total,
                         (unsigned long long)d->max_group_bytes);
                return DEVAL_ENOMEM;
        }
        /* the descriptors devald keeps: control, completion and output segments, a host
         * group's direct output (once a rank asks for it), and for a device group each rank's
         * input and each receiving GPU's output */
        int fds = g->device_group ? 3 : 4;
        if (g->device_group) {
                bool seen[DV_MAX_GPUS] = {false};
                fds += g->world;
                for (int k = 0; k < g->world; k++)
                        if (!seen[g->members[k].device]) {
                                seen[g->members[k].device] = true;
                                fds++;
                        }
        }
        if (g->usage->fds + fds > d->max_user_fds) {
                snprintf(msg, msglen,
                         "group '%s' needs devald to hold %d more descriptors, which would take "
                         "uid %u past its %d (--max-user-fds)",
                         g->name, fds, (unsigned)g->uid, d->max_user_fds);
                return DEVAL_ENOMEM;
        }
        if (!usage_reserve(g->usage, d->max_user_bytes, total)) {
                snprintf(msg, msglen,
                         "group '%s' needs %llu bytes to start, which would take uid %u past "
                         "its quota of %llu bytes across its groups (--max-user-bytes)",
                         g->name, (unsigned long long)total, (unsigned)g->uid,
                         (unsigned long long)d->max_user_bytes);
                return DEVAL_ENOMEM;
        }
        g->locked.bytes_mapped = total; /* reserved: group_free() gives it back */
        g->loop.fds_charged = fds;
        g->usage->fds += fds;
        /*
         * Placement: each rank's input on the NUMA node it runs on (it writes it); the worker
         * and the output where most ranks are, or, for a device group, near the first GPU
         * that receives (the worker there mostly drives that GPU).
         */
        int votes[DV_MAX_NUMA] = {0};
        g->numa = -1;
        for (int k = 0; k < g->world; k++) {
                Member *m = &g->members[k];
                m->numa = topo_node_of_pid(m->pid);
                if (m->numa >= DV_MAX_NUMA)
                        m->numa = -1; /* a node devald cannot place on */
                if (m->numa >= 0 && ++votes[m->numa] > (g->numa >= 0 ? votes[g->numa] : 0))
                        g->numa = m->numa;
        }
        for (int k = 0; g->device_group && k < g->world; k++) {
                int n = topo_node_of_gpu(d, g->members[k].device);
                if (n >= 0) {
                        g->numa = n;
                        break;
                }
        }
        snprintf(name, sizeof(name), "deval-ctl-%s", g->name);
        if ((r = arena_new(name, g->layout.total, ARENA_SHARED, &g->ctl)) < 0)
                goto fail;
        g->hdr = (DvCtlHeader *)g->ctl.map;
        g->hdr->magic = DV_CTL_MAGIC;
        g->hdr->version = DV_PROTO_VERSION;
        g->hdr->world_size = g->world;
        g->hdr->inline_size = g->layout.inline_size;
        g->hdr->inl_off = g->layout.inl_off;
        g->hdr->out_off = g->layout.out_off;
        g->hdr->out_size = g->layout.out_size;
        /* the ranks get this one sealed against writing: it is devald's word to them */
        snprintf(name, sizeof(name), "deval-done-%s", g->name);
        if ((r = arena_new(name, dv_done_size(g->world), ARENA_OUTPUT, &g->done)) < 0)
                goto fail;
        g->dhdr = (DvDoneHeader *)g->done.map;
        g->dhdr->magic = DV_CTL_MAGIC;
        g->dhdr->version = DV_PROTO_VERSION;
        g->dhdr->world_size = g->world;
        for (int k = 0; k < g->world; k++) {
                snprintf(name, sizeof(name), "deval-in-%s-%d", g->name, k);
                if ((r = arena_new(name, ARENA_INITIAL, ARENA_INPUT, &g->members[k].in)) < 0)
                        goto fail;
                topo_prefer_memory(g->members[k].in.map, ARENA_INITIAL, g->members[k].numa);
        }
        snprintf(name, sizeof(name), "deval-out-%s", g->name);
        if ((r = arena_new(name, ARENA_INITIAL, ARENA_OUTPUT, &g->locked.out)) < 0)
                goto fail;
        topo_prefer_memory(g->locked.out.map, ARENA_INITIAL, g->numa);
        g->locked.out_gen = 1;
        g->dhdr->out_gen = 1;
        g->dhdr->out_size = g->locked.out.size;
        if (g->device_group) /* its GPU memory, made by a job: the rest once it is there */
                return group_alloc_devices(g, msg, msglen);
        return group_start_worker(g, msg, msglen);
fail:
        snprintf(msg, msglen, "devald could not set up group '%s': %s", g->name, deval_strerror(r));
        return r;
}

/* The group's worker and what it needs: the group is active. 0, or a status with msg. */
static int group_start_worker(Group *g, char *msg, size_t msglen) {
        Daemon *d = g->d;
        int r;

        g->timeout_ns = -1;
        for (int k = 0; k < g->world; k++) {
                int t = g->members[k].timeout_ms;
                if (t > 0 && (g->timeout_ns < 0 || (int64_t)t * 1000000 < g->timeout_ns))
                        g->timeout_ns = (int64_t)t * 1000000;
        }
        /* spinning only pays when every rank and the worker can have a core */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (d->spin_us >= 0)
                g->spin_ns = (uint64_t)d->spin_us * 1000;
        else
                g->spin_ns = ncpu >= g->world + 2 ? 20000 : 0;
        g->work.reqs = calloc((size_t)g->world, sizeof(*g->work.reqs));
        g->work.arrivals = calloc((size_t)g->world, sizeof(*g->work.arrivals));
        g->work.pass.rows = calloc((size_t)PASS_STREAMS * (size_t)g->world, sizeof(int64_t));
        g->work.pass_load = calloc((size_t)PASS_STREAMS * (size_t)g->world, sizeof(int64_t));
        g->work.pass.parked = calloc((size_t)g->world, sizeof(bool));
        if (!g->work.reqs || !g->work.arrivals || !g->work.pass.rows || !g->work.pass_load ||
            !g->work.pass.parked) {
                r = DEVAL_ENOMEM;
                goto fail;
        }
        if (pthread_create(&g->worker, NULL, worker_main, g) != 0) {
                r = DEVAL_ESYS;
                goto fail;
        }
        g->loop.worker_started = true;
        /* the ranks may run their first steps without it: deval-ctl shows it from the start
         * (its thread id comes from the thread itself, within microseconds) */
        for (int i = 0; i < 10000 && !atomic_load(&g->worker_tid); i++)
                usleep(100);
        if (topo_bind_thread(g->worker, g->numa, g->worker_cpus, sizeof(g->worker_cpus)) == 0)
                log_debug("group '%s': worker on NUMA node %d (cpus %s)", g->name, g->numa,
                          g->worker_cpus);
        g->loop.state = DV_GROUP_ACTIVE;
        return 0;
fail:
        snprintf(msg, msglen, "devald could not set up group '%s': %s", g->name, deval_strerror(r));
        return r;
}

static void group_reply_all(Group *g, int status, const char *msg) {
        for (int k = 0; k < g->world; k++) {
                Member *m = &g->members[k];
                if (!m->conn)
                        continue;
                if (status < 0) {
                        conn_reply(m->conn, status, msg);
                        continue;
                }
                /* the worker runs: the outputs are its to replace, under the lock */
                pthread_mutex_lock(&g->lock);
                int fds[6] = {g->ctl.fd, g->done.fd, m->in.fd, g->locked.out.fd};
                uint64_t sizes[6] = {g->ctl.size, g->done.size, m->in.size, g->locked.out.size};
                uint64_t gen = g->locked.out_gen, dev_gen = g->locked.dev_out_gen;
                int n = 4;
                if (g->device_group) {
                        fds[4] = m->din.fd;
                        sizes[4] = m->din.size;
                        fds[5] = g->locked.dout[m->device].fd;
                        sizes[5] = g->locked.dout[m->device].size;
                        n = 6;
                }
                pthread_mutex_unlock(&g->lock);
                conn_reply_segments(
                        m->conn, &(ConnSegments){.fds = fds,
                                                 .sizes = sizes,
                                                 .n = n,
                                                 .gen = gen,
                                                 .dev_gen = dev_gen,
                                                 .flags = g->device_group ? DV_REPLY_DEVICE : 0});
                /* the client maps its copies; devald keeps its own mappings */
                close(m->in.fd);
                m->in.fd = -1;
        }
}

/**
 * group_join() - handle a JOIN from c: find or create the group, take the rank, and when the
 * group is complete activate it and answer every member.
 * Return: 1 when the reply is deferred until the group forms, 0 when it was sent (the group
 * just formed), or a negative status with msg for the caller to send.
 */
int group_join(Daemon *d, Conn *c, const DvJoinReq *req, char *msg, size_t msglen) {
        Group *g;
        int r;

        if (c->group) {
                snprintf(msg, msglen, "this connection already joined group '%s' as rank %d",
                         c->group->name, c->rank);
                return DEVAL_EINVAL;
        }
        if ((r = dv_join_check(req, msg, msglen)) < 0)
                return r;
        if (req->world_size > d->max_world) {
                snprintf(msg, msglen,
                         "world size %d is over devald's limit of %d ranks per group "
                         "(--max-world)",
                         req->world_size, d->max_world);
                return DEVAL_ENOMEM;
        }
        g = group_lookup(d, req->group);
        /* root may watch and abort another uid's group (deval-ctl), never join it */
        if (g && g->uid != c->uid) {
                snprintf(msg, msglen, "group '%s' belongs to uid %u", g->name, (unsigned)g->uid);
                return DEVAL_EPERM;
        }
        if (g && g->world != req->world_size) {
                snprintf(msg, msglen, "group '%s' has world size %d, not %d", g->name, g->world,
                         req->world_size);
                return DEVAL_EINVAL;
        }
        int device = -1;
        if (req->has_device) {
                if (!d->gpu) {
                        snprintf(msg, msglen,
                                 "devald runs the host backend; start it with --backend cuda for "
                                 "ranks whose tensors live on a GPU");
                        return DEVAL_ENOTSUP;
                }
                for (int k = 0; k < d->ngpus && device < 0; k++)
                        if (memcmp(d->gpu_uuid[k], req->device_uuid, 16) == 0)
                                device = k;
                if (device < 0) {
                        snprintf(msg, msglen, "rank %d's GPU is not one devald can see", req->rank);
                        return DEVAL_EINVAL;
                }
        }
        if (g && g->device_group != (req->has_device != 0)) {
                snprintf(msg, msglen,
                         "group '%s' has ranks %s a GPU; every rank joins with one, or none does",
                         g->name, g->device_group ? "with" : "without");
                return DEVAL_EINVAL;
        }
        if (g && g->members[req->rank].state != MEMBER_EMPTY) {
                snprintf(msg, msglen, "rank %d of group '%s' is already joined by pid %d",
                         req->rank, g->name, (int)g->members[req->rank].pid);
                return DEVAL_EINVAL;
        }
        if (!g) {
                if (d->ngroups >= d->max_groups) {
                        snprintf(msg, msglen, "devald already runs %d groups (--max-groups)",
                                 d->ngroups);
                        return DEVAL_ENOMEM;
                }
                if (c->usage->groups >= d->max_user_groups) {
                        snprintf(msg, msglen,
                                 "uid %u already has %d groups in devald (--max-user-groups)",
                                 (unsigned)c->uid, c->usage->groups);
                        return DEVAL_ENOMEM;
                }
                if ((r = group_new(d, req, c->usage, &g)) < 0) {
                        snprintf(msg, msglen, "out of memory");
                        return r;
                }
                log_info("group '%s' forming: world size %d, uid %u", g->name, g->world,
                         (unsigned)c->uid);
        }
        Member *m = &g->members[req->rank];
        m->conn = c;
        m->device = device;
        m->pid = c->pid;
        m->state = MEMBER_JOINED;
        m->timeout_ms = req->timeout_ms;
        m->join_deadline_ns =
                req->timeout_ms > 0 ? dv_now_ns() + (uint64_t)req->timeout_ms * 1000000ull : 0;
        c->group = g;
        c->rank = req->rank;
        g->loop.joined++;
        log_debug("group '%s': rank %d joined (pid %d)", g->name, req->rank, (int)c->pid);
        if (g->loop.joined < g->world)
                return 1;

        if ((r = group_activate(g, msg, msglen)) < 0) {
                log_err("%s", msg);
                g->loop.state = DV_GROUP_FAILED;
                g->loop.listed = false;
                group_reply_all(g, r, msg);
                return 0;
        }
        if (r > 0) { /* starting: its GPU memory is being made */
                log_debug("group '%s' starting: allocating its GPU memory", g->name);
                return 1;
        }
        log_info("group '%s' active: %d ranks", g->name, g->world);
        group_reply_all(g, 0, "");
        return 0;
}

/**
 * group_fail() - fail the group for good: every rank's current and later collectives return
 * status with the message. The worker publishes it between steps, so a step in flight
 * either completes on every rank or on none. The name becomes free for a new group.
 */
void group_fail(Group *g, int status, const char *fmt, ...) {
        va_list ap;
        bool first = false;

        pthread_mutex_lock(&g->lock);
        if (!g->locked.abort_status) {
                g->locked.abort_status = status;
                va_start(ap, fmt);
                vsnprintf(g->locked.abort_msg, sizeof(g->locked.abort_msg), fmt, ap);
                va_end(ap);
                first = true;
        }
        pthread_mutex_unlock(&g->lock);
        /* a rank leaving after its last collective is how a group normally ends */
        if (first)
                log_printf(status == DEVAL_EPEER && strstr(g->locked.abort_msg, "left the group")
                                   ? LOG_LEVEL_DEBUG
                                   : LOG_LEVEL_INFO,
                           "group '%s' failed: %s", g->name, g->locked.abort_msg);
        g->loop.state = DV_GROUP_FAILED;
        g->loop.listed = false;
        if (g->loop.worker_started) {
                atomic_fetch_add_explicit(&g->hdr->arrive, 1, memory_order_release);
                dv_futex_wake(&g->hdr->arrive);
        }
}

/*
 * What the group is doing now, for messages: "during collective #7 (gather)". The ranks run
 * steps devald never sees: the latest step any rank arrived at says where the group is, and
 * that rank's request names the call (wire.h).
 */
static void group_where(Group *g, char *buf, size_t len) {
        int who = -1;
        uint32_t latest = 0;
        for (int k = 0; k < g->world; k++) {
                uint32_t a =
                        atomic_load_explicit(&g->hdr->slots[k].arrived_seq, memory_order_acquire);
                if (a && (who < 0 || (int32_t)(a - latest) > 0)) {
                        latest = a;
                        who = k;
                }
        }
        if (who < 0) {
                snprintf(buf, len, "before its first collective");
                return;
        }
        const DvRequest *q = &g->hdr->slots[who].req;
        uint32_t done = atomic_load_explicit(&g->dhdr->done_seq, memory_order_acquire);
        /* the ranks' steps: run by one of them, or mirrored by all */
        uint32_t ranks[2] = {atomic_load_explicit(&g->hdr->fast.done_seq, memory_order_acquire),
                             atomic_load_explicit(&g->hdr->fast.mirror_seq, memory_order_acquire)};
        for (int i = 0; i < 2; i++)
                if ((int32_t)(ranks[i] - done) > 0)
                        done = ranks[i];
        if ((int32_t)(latest - done) > 0)
                snprintf(buf, len, "during collective #%u (%s)", q->call, dv_op_name(q->op));
        else
                snprintf(buf, len, "between collectives (#%u was the last to complete)", q->call);
}

/**
 * group_member_gone() - rank's client left (left=true) or hung up. A forming group gives the
 * rank back; an active group fails with DEVAL_EPEER naming the rank and its pid.
 */
void group_member_gone(Group *g, int rank, bool left) {
        Member *m = &g->members[rank];
        char where[128];

        m->conn = NULL;
        if (g->loop.state == DV_GROUP_FORMING) {
                m->state = MEMBER_EMPTY;
                g->loop.joined--;
                log_debug("group '%s': rank %d gave up before the group formed", g->name, rank);
                return;
        }
        if (m->state != MEMBER_JOINED)
                return;
        m->state = left ? MEMBER_LEFT : MEMBER_DEAD;
        if (g->loop.state != DV_GROUP_ACTIVE)
                return;
        char how[96];
        proc_state(m->pid, how, sizeof(how));
        group_where(g, where, sizeof(where));
        group_fail(g, DEVAL_EPEER, "rank %d (pid %d) %s %s", rank, (int)m->pid,
                   left     ? "left the group"
                   : how[0] ? how + 1
                            : "exited",
                   where);
}

/* Answer joins whose deadline passed with DEVAL_ETIMEDOUT naming the missing ranks. */
void group_expire_joins(Daemon *d, uint64_t now, int64_t *next_ns) {
        for (Group *g = d->groups; g; g = g->next) {
                if (g->loop.state != DV_GROUP_FORMING)
                        continue;
                for (int k = 0; k < g->world; k++) {
                        Member *m = &g->members[k];
                        if (m->state != MEMBER_JOINED || !m->join_deadline_ns)
                                continue;
                        if (m->join_deadline_ns > now) {
                                int64_t left = (int64_t)(m->join_deadline_ns - now);
                                if (*next_ns < 0 || left < *next_ns)
                                        *next_ns = left;
                                continue;
                        }
                        char msg[DV_MSG_MAX];
                        int n = snprintf(msg, sizeof(msg),
                                         "group '%s' did not form within %d ms: %d of %d ranks "
                                         "joined; never joined:",
                                         g->name, m->timeout_ms, g->loop.joined, g->world);
                        for (int j = 0; j < g->world && n < (int)sizeof(msg) - 16; j++)
                                if (g->members[j].state == MEMBER_EMPTY)
                                        n += snprintf(msg + n, sizeof(msg) - (size_t)n, " %d", j);
                        Conn *c = m->conn;
                        conn_reply(c, DEVAL_ETIMEDOUT, msg);
                        c->group = NULL;
                        group_member_gone(g, k, true);
                }
        }
        for (Group **p = &d->groups; *p;) {
                Group *g = *p;
                if (g->loop.state == DV_GROUP_FORMING && g->loop.joined == 0) {
                        group_free(g); /* unlinks *p */
                        continue;
                }
                p = &g->next;
        }
}

/**
 * group_expire_idle() - fail groups that went --idle-timeout without a collective (forming
 * ones: without every rank joining), so that a forgotten session gives its memory back.
 * Main thread; *next_ns: when to look again.
 */
void group_expire_idle(Daemon *d, uint64_t now, int64_t *next_ns) {
        if (d->idle_timeout_s <= 0)
                return;
        uint64_t limit = (uint64_t)d->idle_timeout_s * 1000000000ull;
        for (Group *g = d->groups; g; g = g->next) {
                if (g->loop.state != DV_GROUP_FORMING && g->loop.state != DV_GROUP_ACTIVE)
                        continue;
                uint64_t last = atomic_load_explicit(&g->done_ns, memory_order_relaxed);
                last = DV_MAX(last, g->created_ns);
                uint64_t idle = now > last ? now - last : 0;
                if (idle < limit) {
                        int64_t left = (int64_t)(limit - idle);
                        if (*next_ns < 0 || left < *next_ns)
                                *next_ns = left;
                        continue;
                }
                if (g->loop.state == DV_GROUP_FORMING) {
                        /* group_expire_joins() answers the ranks that came, at once */
                        for (int k = 0; k < g->world; k++)
                                if (g->members[k].state == MEMBER_JOINED) {
                                        g->members[k].join_deadline_ns = 1;
                                        g->members[k].timeout_ms = d->idle_timeout_s * 1000;
                                }
                        *next_ns = 0;
                        continue;
                }
                group_fail(g, DEVAL_ETIMEDOUT,
                           "group '%s' was idle for %d s and expired (--idle-timeout)", g->name,
                           d->idle_timeout_s);
        }
}

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

/* rank's device output arena's fd (owned by the group), its size and generation, or -1. */
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

/* The current output arena's fd (owned by the group), its size and generation, or -1. */
int group_output_fd(Group *g, uint64_t *size, uint64_t *gen) {
        pthread_mutex_lock(&g->lock);
        int fd = g->locked.out.fd;
        *size = g->locked.out.size;
        *gen = g->locked.out_gen;
        pthread_mutex_unlock(&g->lock);
        return fd;
}

/* Fail every group with status (devald is stopping) and wait for their workers. */
void group_stop_all(Daemon *d, int status, const char *why) {
        for (Group *g = d->groups; g; g = g->next) {
                if (g->loop.state == DV_GROUP_FORMING) {
                        for (int k = 0; k < g->world; k++)
                                if (g->members[k].conn)
                                        conn_reply(g->members[k].conn, status, why);
                        continue;
                }
                group_fail(g, status, "%s", why);
        }
        for (Group *g = d->groups; g; g = g->next)
                if (g->loop.worker_started && !g->loop.reaping) { /* a job joins the others */
                        pthread_join(g->worker, NULL);
                        g->loop.worker_started = false;
                }
}
