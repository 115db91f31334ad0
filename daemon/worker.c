/* SPDX-License-Identifier: MIT */
/*
 * worker.c - one thread per active group: wait until every rank has arrived at the next
 * step (futex on the control segment's arrive word), run the step, publish it (done_seq)
 * and wake the ranks. A failure of the group (a rank gone, a timeout, devald stopping) is
 * published here too, between steps, so that no step is seen done by some ranks and failed
 * by others.
 */
#define _GNU_SOURCE
#include "worker.h"

#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon.h"
#include "fault.h"
#include "flight_dump.h"
#include "log.h"
#include "proc.h"
#include "step.h"
#include "util.h"

#define SLICE_NS (100 * 1000 * 1000)

/* Wake the ranks: they sleep on the fast area's word, which whoever finishes a step bumps. */
static void worker_wake_ranks(Group *g) {
        atomic_fetch_add_explicit(&g->dhdr->wake, 1, memory_order_release);
        atomic_fetch_add_explicit(&g->hdr->fast.wake, 1, memory_order_seq_cst);
        dv_futex_wake(&g->hdr->fast.wake);
}

static void worker_publish_abort(Group *g) {
        DvDoneHeader *h = g->dhdr;

        pthread_mutex_lock(&g->lock);
        memcpy(h->abort_msg, g->locked.abort_msg, sizeof(h->abort_msg));
        int status = g->locked.abort_status;
        pthread_mutex_unlock(&g->lock);
        /* release: abort_msg is complete before a client can see abort_status */
        atomic_store_explicit(&h->abort_status, status, memory_order_release);
        worker_wake_ranks(g);
}

static int worker_aborted(Group *g) {
        pthread_mutex_lock(&g->lock);
        int s = g->locked.abort_status;
        pthread_mutex_unlock(&g->lock);
        return s;
}

/* Describe the ranks missing from step seq and fail the group with DEVAL_ETIMEDOUT. */
static void worker_timeout(Group *g, uint32_t seq, uint32_t op) {
        char msg[DV_MSG_MAX];
        /* the call of the step, as a rank that came counts it (wire.h) */
        uint32_t call = seq;
        for (int k = 0; k < g->world; k++)
                if (atomic_load_explicit(&g->hdr->slots[k].arrived_seq, memory_order_acquire) ==
                    seq) {
                        call = g->hdr->slots[k].req.call;
                        break;
                }
        int n = snprintf(msg, sizeof(msg),
                         "collective #%u (%s) timed out after %lld ms (the shortest timeout its "
                         "ranks joined with; " DV_TIMEOUT_SET ");",
                         call, dv_op_name(op), (long long)(g->timeout_ns / 1000000));
        for (int k = 0; k < g->world && n < (int)sizeof(msg) - 64; k++) {
                if (atomic_load_explicit(&g->hdr->slots[k].arrived_seq, memory_order_acquire) ==
                    seq)
                        continue;
                char how[96];
                proc_state(g->members[k].pid, how, sizeof(how));
                n += snprintf(msg + n, sizeof(msg) - (size_t)n, " rank %d (pid %d%s%s)", k,
                              (int)g->members[k].pid, how[0] ? "," : "", how);
                /* its slot holds its last request still, unless it is writing the next */
                const DvRequest *last = &g->hdr->slots[k].req;
                if (seq > 1 && last->seq == seq - 1)
                        n += snprintf(msg + n, sizeof(msg) - (size_t)n,
                                      " never arrived, still after collective #%u (%s);", call - 1,
                                      dv_op_name(last->op));
                else if (seq > 1)
                        n += snprintf(msg + n, sizeof(msg) - (size_t)n,
                                      " never arrived, still after collective #%u;", call - 1);
                else
                        n += snprintf(msg + n, sizeof(msg) - (size_t)n,
                                      " never arrived at its first collective;");
        }
        /* every rank came: the last one was running the step itself and never finished, or,
         * for a step it planned for all to copy a share of, some rank did not copy its own */
        int runner = g->hdr->fast.runner, all = 1;
        for (int k = 0; k < g->world; k++)
                all &= atomic_load_explicit(&g->hdr->slots[k].arrived_seq, memory_order_acquire) ==
                       seq;
        bool shared = atomic_load_explicit(&g->hdr->fast.share_seq, memory_order_acquire) == seq;
        if (all && shared) { /* planned: who has not copied its share */
                n += snprintf(msg + n, sizeof(msg) - (size_t)n, " every rank arrived;");
                for (int k = 0; k < g->world && n < (int)sizeof(msg) - 128; k++) {
                        if (atomic_load_explicit(&g->hdr->slots[k].shared_seq,
                                                 memory_order_acquire) == seq)
                                continue;
                        char how[96];
                        proc_state(g->members[k].pid, how, sizeof(how));
                        n += snprintf(msg + n, sizeof(msg) - (size_t)n,
                                      " rank %d (pid %d%s%s) had not copied its share;", k,
                                      (int)g->members[k].pid, how[0] ? "," : "", how);
                }
        } else if (all && runner >= 0 && runner < g->world && n < (int)sizeof(msg) - 128) {
                char how[96];
                proc_state(g->members[runner].pid, how, sizeof(how));
                n += snprintf(msg + n, sizeof(msg) - (size_t)n,
                              " every rank arrived; rank %d (pid %d%s%s) was running it", runner,
                              (int)g->members[runner].pid, how[0] ? "," : "", how);
        }
        if (n > 0 && msg[n - 1] == ';')
                msg[n - 1] = '\0';
        /* the step that never ran goes into the recorder with whoever came */
        DvRequest *reqs = calloc((size_t)g->world, sizeof(*reqs));
        uint64_t *arrived = calloc((size_t)g->world, sizeof(*arrived));
        for (int k = 0; reqs && arrived && k < g->world; k++)
                if (atomic_load_explicit(&g->hdr->slots[k].arrived_seq, memory_order_acquire) ==
                    seq) {
                        memcpy(&reqs[k], &g->hdr->slots[k].req, sizeof(reqs[k]));
                        arrived[k] = g->members[k].arrived_ns ? g->members[k].arrived_ns : 1;
                }
        pthread_mutex_lock(&g->lock);
        if (!g->locked.abort_status) {
                g->locked.abort_status = DEVAL_ETIMEDOUT;
                memcpy(g->locked.abort_msg, msg, sizeof(msg));
        }
        if (reqs && arrived)
                flight_record(&g->locked.flight, seq, reqs, arrived, DEVAL_ETIMEDOUT, msg, 0);
        pthread_mutex_unlock(&g->lock);
        free(reqs);
        free(arrived);
        log_info("group '%s': %s", g->name, msg);
        group_flight_dump(g, "timed out");
}

/* The worker waits for step seq now, for deval-ctl: nobody has arrived yet. */
static void worker_waiting(Group *g, uint32_t seq) {
        pthread_mutex_lock(&g->lock);
        g->locked.waiting_seq = seq;
        g->locked.waiting_since_ns = 0;
        pthread_mutex_unlock(&g->lock);
}

/* Take c as the last step the ranks finished, when it is at or after seq: a rank's word,
 * believed only as far as a group could have run since. */
static void ranks_done_take(uint32_t seq, uint32_t c, bool *any, uint32_t *done) {
        if ((int32_t)(c - seq) < 0 || c - seq >= (1u << 30))
                return;
        if (!*any || (int32_t)(c - *done) > 0)
                *done = c;
        *any = true;
}

/*
 * The last step the ranks finished without devald, when it is seq or later: one a rank ran
 * (fast.done_seq), one every rank mirrored (fast.mirror_seq, stored by rank 0), or the step
 * before one some rank arrived at, which it could not do before that step was done (should
 * rank 0 stop before it says so). Return: whether there is one, in *done.
 */
static bool ranks_done(Group *g, uint32_t seq, uint32_t *done) {
        DvFast *f = &g->hdr->fast;
        bool any = false;
        ranks_done_take(seq, atomic_load_explicit(&f->done_seq, memory_order_acquire), &any, done);
        ranks_done_take(seq, atomic_load_explicit(&f->mirror_seq, memory_order_acquire), &any,
                        done);
        for (int k = 0; k < g->world; k++)
                ranks_done_take(
                        seq,
                        atomic_load_explicit(&g->hdr->slots[k].arrived_seq, memory_order_acquire) -
                                1,
                        &any, done);
        return any;
}

/*
 * Steps up to done ran on the ranks (fast.c, mirror.c): count them, and record the last in
 * the flight recorder with the requests still in the slots (a rank already at the next step
 * shows as not arrived).
 */
static void worker_fast_done(Group *g, uint32_t seq, uint32_t done) {
        DvFast *f = &g->hdr->fast;
        uint32_t n = done - seq + 1;
        uint64_t moved = atomic_load_explicit(&f->bytes_moved, memory_order_relaxed) +
                         atomic_load_explicit(&f->mirror_bytes, memory_order_relaxed);
        bool mirrored = atomic_load_explicit(&f->mirror_seq, memory_order_relaxed) == done;
        uint64_t delta = moved - g->work.fast_moved;
        g->work.fast_moved = moved;
        int executor = f->executor;

        /* the ranks agreed on it, or it would not have run there: a rank already at the next
         * step is shown with the request of one that is not */
        int at = -1, own = 0;
        for (int k = 0; k < g->world; k++)
                if (g->hdr->slots[k].req.seq == done) {
                        at = k;
                        own++;
                }
        /* with every rank at the next step: the op of the result a rank ran, or of the
         * records of a step all ran, which stay until every rank is past the next one */
        uint32_t op = f->res.op;
        for (int k = 0; mirrored && k < g->world; k++) {
                const DvMirror *m = &g->hdr->slots[k].mirror[done % 2];
                if (atomic_load_explicit(&m->seq, memory_order_acquire) == done) {
                        op = m->op;
                        break;
                }
        }
        pthread_mutex_lock(&g->lock);
        for (int k = 0; k < g->world; k++) {
                const DvSlot *sl = &g->hdr->slots[k];
                bool mine = sl->req.seq == done;
                if (at >= 0)
                        memcpy(&g->work.reqs[k], &g->hdr->slots[mine ? k : at].req,
                               sizeof(DvRequest));
                else
                        g->work.reqs[k] = (DvRequest){.seq = done, .op = op};
                /* arrival times only when every rank's are still there */
                g->work.arrivals[k] = own == g->world && sl->arrived_ns ? sl->arrived_ns : 1;
        }
        char msg[200];
        if (mirrored)
                snprintf(msg, sizeof(msg),
                         "collectives #%u..#%u ran on the ranks; every rank ran the last", seq,
                         done);
        else
                snprintf(msg, sizeof(msg),
                         "collectives #%u..#%u ran on the ranks; rank %d ran the last", seq, done,
                         executor);
        flight_record(&g->locked.flight, done, g->work.reqs, g->work.arrivals, 0, msg, delta);
        /* the figures of the last DV_FAST_STATS of them, as their runners saw them */
        for (uint32_t s = n > DV_FAST_STATS ? done - DV_FAST_STATS + 1 : seq;
             (int32_t)(done - s) >= 0; s++) {
                DvFastStat st = f->stats[s % DV_FAST_STATS];
                if (st.seq != s)
                        continue;
                if (g->world > 1 && st.last >= 0 && st.last < g->world) {
                        g->members[st.last].times_last++;
                        g->members[st.last].late_ns += (uint64_t)st.late_us * 1000;
                }
                g->locked.lat_us[g->locked.lat_n++ % 256] = st.lat_us;
        }
        pthread_mutex_unlock(&g->lock);
        atomic_fetch_add_explicit(&g->collectives, n, memory_order_relaxed);
        atomic_fetch_add_explicit(&g->bytes_moved, delta, memory_order_relaxed);
        uint64_t now = dv_now_ns();
        atomic_store_explicit(&g->done_ns, now, memory_order_relaxed);
        for (int k = 0; k < g->world; k++)
                g->members[k].arrived_ns = 0;
}

/*
 * Wait until a rank hands step *seq to devald with every rank arrived. Steps the ranks ran
 * meanwhile move *seq on. Return: 0 to run *seq, else the group's failure.
 */
static int worker_wait(Group *g, uint32_t *seq) {
        DvCtlHeader *h = g->hdr;
        uint64_t first_ns = 0, spin_until = dv_now_ns() + g->spin_ns;
        uint32_t op = 0;

        for (;;) {
                /* acquire pairs with the clients' release increments of arrive */
                uint32_t w = atomic_load_explicit(&h->arrive, memory_order_acquire);
                int s = worker_aborted(g);
                if (s)
                        return s;
                uint32_t done;
                if (ranks_done(g, *seq, &done)) {
                        worker_fast_done(g, *seq, done);
                        *seq = done + 1;
                        first_ns = 0;
                        worker_waiting(g, *seq);
                        continue;
                }
                int arrived = 0;
                uint64_t now = dv_now_ns(), earliest = now;
                for (int k = 0; k < g->world; k++) {
                        /* acquire pairs with the client's release store after it filled req */
                        if (atomic_load_explicit(&h->slots[k].arrived_seq, memory_order_acquire) ==
                            *seq) {
                                arrived++;
                                op = h->slots[k].req.op;
                                /* the rank's own clock reading, if it is plausible */
                                uint64_t t = h->slots[k].arrived_ns;
                                if (!g->members[k].arrived_ns)
                                        g->members[k].arrived_ns =
                                                t && t <= now && now - t < 1000000000ull ? t : now;
                                earliest = DV_MIN(earliest, g->members[k].arrived_ns);
                        }
                }
                uint32_t handoff = atomic_load_explicit(&h->fast.handoff_seq, memory_order_acquire);
                if (arrived == g->world && handoff == *seq)
                        return 0;
                /* the deadline runs from the first arrival, as the ranks' clocks saw it: the
                 * worker may see it late, when the ranks ran the steps before */
                if (arrived && !first_ns) {
                        first_ns = earliest;
                        pthread_mutex_lock(&g->lock);
                        g->locked.waiting_since_ns = earliest;
                        pthread_mutex_unlock(&g->lock);
                }
                int64_t wait_ns = SLICE_NS;
                if (first_ns && g->timeout_ns >= 0) {
                        int64_t left = g->timeout_ns - (int64_t)(now - first_ns);
                        if (left <= 0) {
                                worker_timeout(g, *seq, op);
                                return DEVAL_ETIMEDOUT;
                        }
                        wait_ns = DV_MIN(wait_ns, left);
                }
                if (now < spin_until) {
                        dv_cpu_relax();
                        continue;
                }
                dv_futex_wait(&h->arrive, w, wait_ns);
        }
}

/* Swap in input arenas grown since the last step; the old ones are the worker's to unmap. */
static void worker_take_inputs(Group *g) {
        pthread_mutex_lock(&g->lock);
        for (int k = 0; k < g->world; k++) {
                Member *m = &g->members[k];
                if (!m->in_pending.map)
                        continue;
                arena_deinit(&m->in);
                m->in = m->in_pending;
                m->in_pending = ARENA_NULL;
                close(m->in.fd); /* sent to the client already */
                m->in.fd = -1;
        }
        for (int k = 0; k < g->world; k++) {
                Member *m = &g->members[k];
                if (!m->din_pending.ptr)
                        continue;
                dev_arena_deinit(&m->din);
                m->din = m->din_pending;
                m->din_pending = DEV_ARENA_NULL; /* its fd stays: other GPUs' workers map it */
        }
        pthread_mutex_unlock(&g->lock);
}

void *worker_main(void *arg) {
        Group *g = arg;
        atomic_store(&g->worker_tid, (int)syscall(SYS_gettid));

        for (uint32_t seq = 1;; seq++) {
                worker_waiting(g, seq);
                if (worker_wait(g, &seq) != 0)
                        break;
                worker_take_inputs(g);
                uint64_t t0 = dv_now_ns();
                /* who kept the others waiting, and by how much */
                int last = 0;
                uint64_t first_ns = UINT64_MAX;
                for (int k = 0; k < g->world; k++) {
                        first_ns = DV_MIN(first_ns, g->members[k].arrived_ns);
                        if (g->members[k].arrived_ns > g->members[last].arrived_ns)
                                last = k;
                }
                uint64_t moved = atomic_load_explicit(&g->bytes_moved, memory_order_relaxed);
                int r = step_run(g, seq);
                char step_msg[DV_MSG_MAX] = ""; /* a failed step's words, for the recorder */
                if (r < 0)
                        snprintf(step_msg, sizeof(step_msg), "%.*s", DV_MSG_MAX - 1, g->dhdr->msg);
                pthread_mutex_lock(&g->lock);
                for (int k = 0; k < g->world; k++)
                        g->work.arrivals[k] = g->members[k].arrived_ns;
                flight_record(&g->locked.flight, seq, g->work.reqs, g->work.arrivals, r, step_msg,
                              atomic_load_explicit(&g->bytes_moved, memory_order_relaxed) - moved);
                pthread_mutex_unlock(&g->lock);
                log_debug("group '%s': collective #%u (%s) took %llu us: %s", g->name, seq,
                          dv_op_name(g->work.reqs[0].op),
                          (unsigned long long)((dv_now_ns() - t0) / 1000), deval_strerror(r));
                atomic_fetch_add_explicit(&g->collectives, 1, memory_order_relaxed);
                atomic_store_explicit(&g->done_ns, dv_now_ns(), memory_order_relaxed);
                DV_FAULT("before_wake", seq);
                /* release: res and msg are written before a rank parked in eval_end sees it */
                if (g->work.pass_released)
                        atomic_store_explicit(&g->dhdr->pass_end_seq, seq, memory_order_release);
                /* release: every slot's res and msg are written before done_seq says so */
                atomic_store_explicit(&g->dhdr->done_seq, seq, memory_order_release);
                worker_wake_ranks(g);
                uint64_t done_ns = dv_now_ns();
                pthread_mutex_lock(&g->lock);
                if (g->world > 1) {
                        g->members[last].times_last++;
                        g->members[last].late_ns += g->members[last].arrived_ns - first_ns;
                }
                g->locked.lat_us[g->locked.lat_n++ % 256] =
                        (uint32_t)DV_MIN((done_ns - first_ns) / 1000, (uint64_t)UINT32_MAX);
                pthread_mutex_unlock(&g->lock);
                for (int k = 0; k < g->world; k++)
                        g->members[k].arrived_ns = 0;
        }
        worker_publish_abort(g);
        return NULL;
}

/*
 * worker_catch_up() - have the worker count the steps the ranks ran since it last looked
 * (it looks when woken, or every SLICE_NS), so that deval-ctl shows them: wake it and wait
 * for it until deadline_ns at most. Called off the worker.
 */
static bool worker_behind(Group *g) {
        if (!g->hdr || !atomic_load(&g->worker_tid))
                return false;
        pthread_mutex_lock(&g->lock);
        uint32_t waiting = g->locked.waiting_seq, done;
        int failed = g->locked.abort_status;
        pthread_mutex_unlock(&g->lock);
        return !failed && ranks_done(g, waiting, &done);
}

void worker_catch_up(Group *g, uint64_t deadline_ns) {
        while (worker_behind(g)) {
                atomic_fetch_add_explicit(&g->hdr->arrive, 1, memory_order_release);
                dv_futex_wake(&g->hdr->arrive);
                if (dv_now_ns() > deadline_ns)
                        return;
                usleep(500);
        }
}
