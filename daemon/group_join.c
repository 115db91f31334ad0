/* SPDX-License-Identifier: MIT */
/*
 * group_join.c - a group formed from its ranks' joins and started: the checks on a join, the
 * group's quota and descriptors, where its memory and worker go (NUMA), its control,
 * completion, input and output segments, a device group's GPU memory (made by a job, off the
 * loop), its worker thread, and the answer to every member with its segments.
 */
#define _GNU_SOURCE
#include "group_join.h"

#include <stdio.h>

#include "check.h"
#include "daemon.h"
#include "gpu_jobs.h"
#include "group.h"
#include "log.h"
#include "reply.h"
#include "topo.h"
#include "usage.h"
#include "util.h"
#include "worker.h"

#define ARENA_INITIAL (256 * 1024)

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
        g->work.pass_load = calloc((size_t)DV_PASS_STREAMS * (size_t)g->world, sizeof(int64_t));
        if (!g->work.reqs || !g->work.arrivals || !g->work.pass_load ||
            dv_pass_init(&g->work.pass, g->world) < 0) {
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
