/* SPDX-License-Identifier: MIT */
/*
 * join.c - joining a group (deval_join(): the socket, JOIN, mapping the segments devald
 * sends; a group across machines through span.c) and leaving it (deval_leave()).
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "arena.h"
#include "autostart.h"
#include "gpu.h"
#include "handle.h"
#include "held.h"
#include "ident.h"
#include "job.h"
#include "replay.h"
#include "sock.h"
#include "tunables.h"
#include "util.h"

#define DEFAULT_TIMEOUT_MS 300000

static void group_free(deval_group *g) {
        if (!g)
                return;
        dv_held_remove(g);
        if (g->device >= 0 && g->din)
                dv_gpu()->unmap(g->device, g->din, g->din_size);
        if (g->device >= 0 && g->dout)
                dv_gpu()->unmap(g->device, g->dout, g->dout_size);
        if (g->hdr)
                munmap(g->hdr, g->ctl_size);
        if (g->done)
                munmap((void *)g->done, g->done_size);
        if (g->in)
                munmap(g->in, g->in_size ? g->in_size : 1);
        if (g->out)
                munmap((void *)g->out, g->out_size ? g->out_size : 1);
        if (g->direct.out)
                munmap(g->direct.out, g->direct.size ? g->direct.size : 1);
        if (g->sock >= 0)
                close(g->sock);
        dv_replay_clear(g);
        dv_ident_free(g);
        dv_sites_free(&g->sites);
        if (g->resume_ops)
                g->resume_ops->free(g);
        free(g->fast.reqs);
        free(g->mirror.recs);
        free(g->mirror.shapes);
        free(g->mirror.valid);
        free(g->mirror.srcs);
        dv_plan_deinit(&g->fast.plan);
        for (size_t i = 0; i < DV_ARRAY_SIZE(g->fast.scratch); i++)
                free(g->fast.scratch[i]);
        free(g->items);
        free(g);
}

static void group_freep(deval_group **g) {
        group_free(*g);
}

/* Tunable k, in microseconds, as nanoseconds (at most 2^64-1); dflt_ns when it is not set. */
static uint64_t tun_us(const DvTunables *t, DvTun k, uint64_t dflt_ns) {
        uint64_t us = dv_tun_or(t, k, dflt_ns / 1000);
        return us > UINT64_MAX / 1000 ? UINT64_MAX : us * 1000;
}

/*
 * Spinning before sleeping saves a sleep and a wake-up (tens of microseconds on a busy
 * machine) when every rank has a core of its own: the last rank to arrive runs a small step
 * itself, so a spinning rank sees it done at once, and a step of a few hundred KiB is done
 * within 200 us. A step handed to devald is waited for asleep. With more ranks than cores,
 * spinners would take the core the last rank needs: a waiting rank yields its core for 1 ms
 * instead, so that the ranks still to arrive run at once. So it does, too, while other
 * programs crowd the machine (crowd.h): there, spinning made every small step cost a spin,
 * 400 us where a quiet machine takes 10. $DEVAL_SPIN_US and $DEVAL_YIELD_US override.
 */
static void wait_policy(deval_group *g, int world_size) {
        bool own_cores = sysconf(_SC_NPROCESSORS_ONLN) >= world_size;
        g->spin_ns = tun_us(&g->tun, DV_TUN_SPIN_US, own_cores ? 200000 : 0);
        g->yield_ns = tun_us(&g->tun, DV_TUN_YIELD_US, own_cores ? 0 : 1000000);
        g->crowd_aware = own_cores && !dv_tun_set(&g->tun, DV_TUN_SPIN_US) &&
                         !dv_tun_set(&g->tun, DV_TUN_YIELD_US);
        dv_crowd_init(&g->crowd);
        /* a large step the ranks run is copied by all of them where each has a core of its
         * own; $DEVAL_SHARE_MIN (bytes of output) overrides, cores or not */
        g->fast.share_min =
                dv_tun_or(&g->tun, DV_TUN_SHARE_MIN, own_cores ? 256u << 10 : UINT64_MAX);
        /* a rank whose gather input is this large copies it once, straight into the result
         * (DV_REQ_DIRECT), rather than staging it; $DEVAL_DIRECT_MIN (bytes) overrides */
        g->direct.min = dv_tun_or(&g->tun, DV_TUN_DIRECT_MIN, 64u << 10);
}

/* Start a devald when nothing answers? The join option, else $DEVAL_AUTOSTART (on). */
static bool autostart_on(const deval_group *g, const deval_join_opts *opts) {
        if (opts && opts->autostart)
                return opts->autostart > 0;
        return dv_tun_or(&g->tun, DV_TUN_AUTOSTART, 1);
}

/*
 * Connect g->sock to the devald at g->socket_path; when nothing answers there and the socket
 * was not named, start one first (autostart.c).
 */
static int connect_devald(deval_group *g, const deval_join_opts *opts, bool named) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", g->socket_path);
        if (connect(g->sock, (struct sockaddr *)&sa, sizeof(sa)) == 0)
                return 0;
        int e = errno;
        if (named)
                return dv_join_err(DEVAL_EDAEMON,
                                   "cannot reach devald at %s: %s (is it running? start it with "
                                   "'devald --socket %s')",
                                   g->socket_path, strerror(e), g->socket_path);
        if (!autostart_on(g, opts))
                return dv_join_err(DEVAL_EDAEMON,
                                   "cannot reach devald at %s: %s, and starting one is off "
                                   "($DEVAL_AUTOSTART=0 or the join option); start it with "
                                   "'devald --socket %s &', or 'systemctl start devald' for the "
                                   "system's",
                                   g->socket_path, strerror(e), g->socket_path);
        char why[PATH_MAX * 2 + 256];
        int r = dv_autostart(g->socket_path, dv_tun_or(&g->tun, DV_TUN_IDLE_EXIT, 60), why,
                             sizeof(why));
        if (r < 0)
                return dv_join_err(r, "deval_join: %s", why);
        if (connect(g->sock, (struct sockaddr *)&sa, sizeof(sa)) == 0)
                return 0;
        return dv_join_err(DEVAL_EDAEMON, "cannot reach the devald started at %s: %s",
                           g->socket_path, strerror(errno));
}

/* Wait, up to 2 s, until the devald at path that hung up on a join is gone (its socket no
 * longer answers), so that the next connect starts a new one. */
static void wait_gone(const char *path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        for (int i = 0; i < 200; i++) {
                int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                bool answers = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
                if (fd >= 0)
                        close(fd);
                if (!answers)
                        return;
                usleep(10000);
        }
}

/**
 * deval_join() - join group as rank of world_size ranks, waiting until every rank joined.
 * @opts: socket path and timeout; NULL for the defaults.
 * @out: the handle, set only on success; free it with deval_leave().
 *
 * Return: 0; DEVAL_EINVAL for bad arguments, a rank already taken or a world size that
 * differs from the group's; DEVAL_EDAEMON when devald cannot be reached; DEVAL_ETIMEDOUT
 * when the group did not form in time (the message names the missing ranks); DEVAL_EPERM,
 * DEVAL_ENOMEM. deval_errmsg(NULL) says why, on this thread.
 */
int deval_join(const char *group, int rank, int world_size, const deval_join_opts *opts,
               deval_group **out) {
        _cleanup_(group_freep) deval_group *g = NULL;
        DvJoinReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_JOIN}};
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        DvReply rep = {0};
        DvJob job;
        int fds[DV_MAX_FDS], nfds = DV_MAX_FDS, r;

        if (!out)
                return dv_join_err(DEVAL_EINVAL, "deval_join: out is NULL");
        deval_join_opts own;
        if (opts) {
                char why[256];
                if (dv_opts_copy(&own, sizeof(own), opts, opts->size, "deval_join_opts", why,
                                 sizeof(why)) < 0)
                        return dv_join_err(DEVAL_EINVAL, "deval_join: %s", why);
                opts = &own;
        }
        if (!group || rank < 0 || world_size < 0) {
                char why[640];
                if ((r = dv_job_from_env(&job, why, sizeof(why))) < 0 && !group)
                        return dv_join_err(r, "deval_join: %s", why);
                if (r < 0) /* a name of the caller's; the rank and size may still be set */
                        job = (DvJob){.rank = DV_MAX(dv_env_int("RANK"), -1),
                                      .world = DV_MAX(dv_env_int("WORLD_SIZE"), -1)};
                if (!group) {
                        group = job.name;
                        snprintf(req.launcher, sizeof(req.launcher), "%s", job.launcher);
                }
                /* the launcher's world: is it all on this machine? */
                if (r == 0 && world_size < 0 &&
                    (r = dv_job_one_machine(&job, why, sizeof(why))) < 0)
                        return dv_join_err(r, "deval_join: %s", why);
                rank = rank < 0 ? job.rank : rank;
                world_size = world_size < 0 ? job.world : world_size;
                if (rank < 0 || world_size < 0)
                        return dv_join_err(DEVAL_EINVAL,
                                           "deval_join: no rank or world size given, and %s does "
                                           "not set them ($RANK and $WORLD_SIZE are the generic "
                                           "ones)",
                                           job.launcher[0] ? job.launcher : "the environment");
        }
        if (!group || !*group || strlen(group) >= DV_GROUP_NAME_MAX)
                return dv_join_err(DEVAL_EINVAL, "deval_join: the group name must be 1 to %d bytes",
                                   DV_GROUP_NAME_MAX - 1);
        if (world_size < 1 || world_size > DEVAL_MAX_WORLD)
                return dv_join_err(DEVAL_EINVAL, "deval_join: world size %d is out of range 1..%d",
                                   world_size, DEVAL_MAX_WORLD);
        if (rank < 0 || rank >= world_size)
                return dv_join_err(DEVAL_EINVAL,
                                   "deval_join: rank %d is out of range for world size %d", rank,
                                   world_size);

        g = calloc(1, sizeof(*g));
        if (!g)
                return dv_join_err(DEVAL_ENOMEM, "deval_join: out of memory");
        g->sock = -1;
        g->device = -1;
        dv_sites_free(&g->sites); /* (none yet: sets its empty state) */
        dv_plan_init(&g->fast.plan);
        size_t w = (size_t)world_size;
        g->fast.reqs = calloc(w, sizeof(DvRequest));
        g->mirror.recs = calloc(w, sizeof(DvMirror));
        g->mirror.shapes = calloc(w, sizeof(DvShape));
        g->mirror.valid = calloc(w, sizeof(int64_t));
        g->mirror.srcs = calloc(w, sizeof(const uint8_t *));
        if (!g->fast.reqs || !g->mirror.recs || !g->mirror.shapes || !g->mirror.valid ||
            !g->mirror.srcs)
                return dv_join_err(DEVAL_ENOMEM, "deval_join: out of memory");
        g->pid = getpid();
        g->forks = dv_forks();
        g->rank = rank;
        g->world = world_size;
        char why[160];
        if (dv_tunables_read(&g->tun, why, sizeof(why)) < 0)
                return dv_join_err(DEVAL_EINVAL, "deval_join: %s", why);
        g->debug = dv_tun_or(&g->tun, DV_TUN_DEBUG, 0);
        wait_policy(g, world_size);
        g->rank_steps = dv_tun_or(&g->tun, DV_TUN_RANK_STEPS, 1);
        g->mirror.on = dv_tun_or(&g->tun, DV_TUN_MIRROR, 1);
        g->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
        if (g->timeout_ms < 0)
                g->timeout_ms = -1;
        snprintf(g->name, sizeof(g->name), "%s", group);
        /* a pass's journal (resume.c) is the job's, under its key where it keeps one, and
         * the group's as every run of the job names it: a name the launcher gave changes with
         * its restarts, so the journal names it apart */
        dv_job_journal_key(&g->tun, g->resume.key, sizeof(g->resume.key));
        snprintf(g->resume.group, sizeof(g->resume.group), "%s",
                 req.launcher[0] ? req.launcher : group);
        bool named;
        if (dv_client_socket_path(opts ? opts->socket_path : NULL, g->socket_path,
                                  sizeof(g->socket_path), &named) < 0 ||
            strlen(g->socket_path) >= sizeof(sa.sun_path))
                return dv_join_err(DEVAL_EINVAL, "deval_join: the socket path is too long");
        const deval_group *had = dv_held_find(group, g->socket_path);
        if (had)
                return dv_join_err(DEVAL_EINVAL,
                                   "deval_join: this process already holds group '%s' as rank %d "
                                   "of %d; a second join of it would wait for a rank that never "
                                   "comes. Use the handle the first join returned, or leave it "
                                   "first",
                                   group, had->rank, had->world);

        if (opts && opts->on_device) {
                const DvGpuApi *gpu = dv_gpu();
                int count = 0;
                if ((r = gpu->init()) < 0 || (r = gpu->device_count(&count)) < 0)
                        return dv_join_err(r, "deval_join: %s", dv_gpu_error());
                if (opts->device < 0 || opts->device >= count)
                        return dv_join_err(DEVAL_EINVAL,
                                           "deval_join: CUDA device %d does not exist (%d visible)",
                                           opts->device, count);
                if ((r = gpu->device_uuid(opts->device, req.device_uuid)) < 0)
                        return dv_join_err(r, "deval_join: %s", dv_gpu_error());
                req.has_device = 1;
                g->device = opts->device;
        }
        snprintf(req.group, sizeof(req.group), "%s", group);
        req.rank = rank;
        req.world_size = world_size;
        req.timeout_ms = g->timeout_ms;
        /* a devald that libdeval started may be exiting, idle, as the join reaches it: it
         * hangs up or says it is shutting down; once it is gone, a new one is started */
        for (int attempt = 0;; attempt++) {
                bool again = attempt == 0 && !named && autostart_on(g, opts);
                if (attempt) {
                        close(g->sock);
                        wait_gone(g->socket_path);
                }
                g->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                if (g->sock < 0)
                        return dv_join_err(DEVAL_ESYS, "deval_join: socket: %s", strerror(errno));
                if ((r = connect_devald(g, opts, named)) < 0)
                        return r;
                nfds = DV_MAX_FDS;
                ssize_t n = dv_send_msg(g->sock, &req, sizeof(req), NULL, 0, 0);
                if (n < 0) {
                        /* devald refusing the connection (a quota) answered and hung up */
                        int nf = 0;
                        if (dv_recv_reply(g->sock, 0, &rep, fds, &nf) == 0 && rep.status < 0 &&
                            !(again && rep.status == DEVAL_EDAEMON))
                                return dv_join_err(rep.status, "deval_join: %.*s", DV_MSG_MAX,
                                                   rep.msg);
                        if (again)
                                continue;
                        return dv_join_err(DEVAL_EDAEMON, "devald at %s is gone: %s",
                                           g->socket_path, strerror((int)-n));
                }
                r = dv_recv_reply(g->sock, g->timeout_ms < 0 ? -1 : g->timeout_ms + REPLY_GRACE_MS,
                                  &rep, fds, &nfds);
                if (again && (r == DEVAL_EDAEMON || (r == 0 && rep.status == DEVAL_EDAEMON)))
                        continue;
                break;
        }
        if (r == DEVAL_ETIMEDOUT)
                return dv_join_err(r,
                                   "devald at %s did not answer the join of group '%s' within "
                                   "%d ms, the join's timeout, and %d ms more (" DV_TIMEOUT_SET ")",
                                   g->socket_path, group, g->timeout_ms, REPLY_GRACE_MS);
        if (r == DEVAL_EPROTO && rep.hdr.version && rep.hdr.version != DV_PROTO_VERSION)
                return dv_join_err(r,
                                   "devald at %s speaks protocol version %u, this libdeval %d: "
                                   "it is another deval's (one that ran before an upgrade, "
                                   "say); stop it, or wait for it to exit when idle",
                                   g->socket_path, (unsigned)rep.hdr.version, DV_PROTO_VERSION);
        if (r < 0)
                return dv_join_err(r, "devald at %s hung up during the join of group '%s'",
                                   g->socket_path, group);
        if (rep.status < 0)
                return dv_join_err(rep.status, "%s", rep.msg);
        int want = g->device >= 0 ? 6 : 4;
        if (nfds != want || rep.size[0] < dv_ctl_size(world_size) ||
            rep.size[1] < dv_done_size(world_size) ||
            (g->device >= 0) != ((rep.flags & DV_REPLY_DEVICE) != 0)) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                return dv_join_err(DEVAL_EPROTO, "devald sent malformed segments");
        }
        void *ctl = NULL, *done = NULL, *in = NULL, *outp = NULL;
        int e1 = dv_map_fd(fds[0], rep.size[0], PROT_READ | PROT_WRITE, &ctl);
        int e0 = dv_map_fd(fds[1], rep.size[1], PROT_READ, &done);
        int e2 = dv_map_fd(fds[2], rep.size[2], PROT_READ | PROT_WRITE, &in);
        int e3 = dv_map_fd(fds[3], rep.size[3], PROT_READ, &outp);
        g->hdr = ctl;
        g->ctl_size = rep.size[0];
        g->req = ctl ? &g->hdr->slots[g->rank].req : NULL;
        g->done = done;
        g->done_size = rep.size[1];
        g->in = in;
        g->in_size = rep.size[2];
        g->out = outp;
        g->out_size = rep.size[3];
        g->out_gen = rep.gen;
        if (g->device >= 0) {
                int e4 = dv_gpu()->import_fd(g->device, fds[4], rep.size[4], &g->din);
                int e5 = dv_gpu()->import_fd(g->device, fds[5], rep.size[5], &g->dout);
                close(fds[4]);
                close(fds[5]);
                if (e4 < 0 || e5 < 0)
                        return dv_join_err(DEVAL_ESYS, "cannot map the group's device memory: %s",
                                           dv_gpu_error());
                g->din_size = rep.size[4];
                g->dout_size = rep.size[5];
                g->dout_gen = rep.dev_gen;
        }
        if (e0 == -EPROTO || e1 == -EPROTO || e2 == -EPROTO || e3 == -EPROTO)
                return dv_join_err(DEVAL_EPROTO, "devald sent a segment that is not a sealed memfd "
                                                 "of the size it said");
        if (e0 < 0 || e1 < 0 || e2 < 0 || e3 < 0)
                return dv_join_err(DEVAL_ENOMEM, "cannot map the group's shared memory");
        if (g->hdr->magic != DV_CTL_MAGIC || g->hdr->version != DV_PROTO_VERSION ||
            g->hdr->world_size != world_size || g->done->magic != DV_CTL_MAGIC ||
            g->done->version != DV_PROTO_VERSION || g->done->world_size != world_size)
                return dv_join_err(DEVAL_EPROTO, "devald's control segment has another layout");
        /* where the inline inputs and the output of the steps the ranks run lie: devald's
         * layout, recomputed here, and only believed if it is that and fits */
        uint32_t inl = g->hdr->inline_size;
        DvCtlLayout l = dv_ctl_layout(world_size, inl);
        if ((inl && (inl < DV_INLINE_MIN || inl > DV_INLINE_MAX || (inl & (inl - 1)))) ||
            g->hdr->inl_off != l.inl_off || g->hdr->out_off != l.out_off ||
            g->hdr->out_size != l.out_size || l.total > g->ctl_size)
                return dv_join_err(DEVAL_EPROTO, "devald's control segment has another layout");
        g->inl_size = inl;
        g->inl = (uint8_t *)g->hdr + l.inl_off + (uint64_t)rank * inl;
        g->inl_all = (uint8_t *)g->hdr + l.inl_off;
        g->fast.out = (uint8_t *)g->hdr + l.out_off;
        g->fast.out_size = l.out_size;
        g->pass_sh = (DvPassShared *)((uint8_t *)g->hdr + l.pass_off);
        g->fast.share = (DvShare *)((uint8_t *)g->hdr + l.share_off);
        uint32_t a = atomic_load_explicit(&g->done->done_seq, memory_order_acquire);
        uint32_t b = atomic_load_explicit(&g->hdr->fast.done_seq, memory_order_acquire);
        g->seq = (int32_t)(b - a) > 0 ? b : a;
        dv_held_add(g);
        *out = TAKE_PTR(g);
        return 0;
}

/**
 * deval_leave() - leave the group and free the handle (NULL is a no-op). The other ranks'
 * next collectives fail with DEVAL_EPEER. Views from the last collective become invalid.
 * Return: 0, or DEVAL_EDAEMON when devald was already gone (the handle is freed anyway).
 */
int deval_leave(deval_group *g) {
        DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_LEAVE};
        DvReply rep;
        int fds[DV_MAX_FDS], nfds, r = 0;

        if (!g)
                return 0;
        if (g->span) { /* its node's group is left with it */
                g->span_ops->free(g);
                group_free(g);
                return 0;
        }
        if (g->pid != getpid()) { /* a forked child's copy: the membership is the parent's */
                g->sock = -1;     /* the parent's socket stays open for the parent */
                group_free(g);
                return 0;
        }
        if (g->failed != DEVAL_EDAEMON) {
                g->timeout_ms = 2000;
                r = dv_request(g, &req, sizeof(req), &rep, fds, &nfds);
                for (int i = 0; r == 0 && i < nfds; i++)
                        close(fds[i]);
        }
        group_free(g);
        return r;
}
