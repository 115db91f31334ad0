/* SPDX-License-Identifier: MIT */
/*
 * group.c - a group's life as the main thread sees it: made by the first join, found by name,
 * its members leaving or dying, failed for good, expired when its joins or its collectives do
 * not come, stopped with devald, and freed once no client and no job holds it (its worker
 * ended first, off the loop when it is in the middle of a step). Forming and starting it is
 * group_join.c's job; the arenas its members grow later, group_arena.c's.
 */
#define _GNU_SOURCE
#include "group.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "daemon.h"
#include "exec_host.h"
#include "gpu_jobs.h"
#include "log.h"
#include "proc.h"
#include "reply.h"
#include "usage.h"
#include "util.h"

/**
 * group_lookup() - the live group called name (forming, starting or active): one that has
 * failed or is closing no longer holds its name. Main thread.
 * Return: the group, or NULL.
 */
Group *group_lookup(Daemon *d, const char *name) {
        for (Group *g = d->groups; g; g = g->next)
                if (g->loop.listed && strcmp(g->name, name) == 0)
                        return g;
        return NULL;
}

/**
 * group_new() - a group forming from req's join: req->world_size empty ranks, the uid of
 * usage (which it counts a group more), listed first in d's groups. Main thread.
 * Return: 0 with the group in *ret, or DEVAL_ENOMEM.
 */
int group_new(Daemon *d, const DvJoinReq *req, Usage *usage, Group **ret) {
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
        dv_pass_deinit(&g->work.pass);
        free(g->work.pass_load);
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

/**
 * group_maybe_free() - free g once no connection refers to it any more and no job holds it;
 * else leave it be. Main thread.
 */
void group_maybe_free(Group *g) {
        if (g->loop.jobs)
                return;
        for (int r = 0; r < g->world; r++)
                if (g->members[r].conn)
                        return;
        group_free(g);
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

/**
 * group_fail_published() - wait until the group's worker has published its failure to the
 * ranks (it writes the completion segment alone), at most wait_ms: a step it is running ends
 * first. So an abort reaches the ranks before deval-ctl returns, and a call its user makes
 * next fails rather than completes among ranks that had not heard.
 * Return: true when published (or when no worker runs), false when wait_ms passed.
 */
bool group_fail_published(Group *g, int wait_ms) {
        if (!g->loop.worker_started)
                return true;
        for (int i = 0; i < wait_ms * 5; i++) {
                /* acquire pairs with worker_publish_abort()'s release */
                if (atomic_load_explicit(&g->dhdr->abort_status, memory_order_acquire))
                        return true;
                struct timespec ts = {0, 200 * 1000};
                nanosleep(&ts, NULL);
        }
        return false;
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

/**
 * group_expire_joins() - answer joins whose deadline passed with DEVAL_ETIMEDOUT naming the
 * ranks that never joined, and free forming groups no rank is left in. Main thread.
 * *next_ns: lowered to when the next deadline falls, if sooner.
 */
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
                                         "group '%s' did not form within %d ms (this rank's "
                                         "join timeout; " DV_TIMEOUT_SET "): %d of %d ranks "
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
 * group_stop_all() - devald stops: answer every forming group's ranks with status and why,
 * fail every other group with them, and wait for the workers no job waits for. Main thread.
 */
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
