/* SPDX-License-Identifier: MIT */
/*
 * test-faults.c - the fault-injection matrix: every way a rank or devald can stop (exit,
 * abort, SIGKILL, SIGSTOP, a long sleep), at every fault point (common/fault.h), with 2 to
 * 8 ranks, against a real devald. What must hold:
 *
 *   - a rank that dies: every other rank gets DEVAL_EPEER within 1 s, naming the rank, its
 *     pid and how it ended;
 *   - a rank that stops or sleeps: the others get DEVAL_ETIMEDOUT at the deadline, naming
 *     it; deval-ctl shows it stopped and not arrived, and for how long the group waited;
 *   - devald that dies mid-step: every rank gets DEVAL_EDAEMON within 1 s; one that stops:
 *     DEVAL_ETIMEDOUT at the deadline;
 *   - an aborted group fails every later call at once with DEVAL_EABORTED;
 *   - a rank killed in one group leaves a concurrent group's 1000 collectives untouched.
 *
 * Ranks are forked here rather than by the harness, so that a dead rank stays a zombie
 * until the others are done: only a zombie tells devald how a process ended.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "handle.h"
#include "harness.h"
#include "util.h"

static Harness H;

enum {
        MAX_RANKS = 8
};

typedef struct {
        int status;    /* of the first failing call */
        double t_err;  /* when it returned */
        double t_call; /* when it called collective #2 */
        int calls;     /* gathers that succeeded */
        char msg[512];
} Outcome;

typedef struct {
        double t_fault;
        pid_t pid[MAX_RANKS];
        Outcome out[MAX_RANKS];
} Shared;

static Shared *S;

typedef struct {
        const char *phase;  /* a fault point, or NULL: none */
        const char *action; /* exit, abort, sigkill, sigstop, sleep */
        int world;
        int victim;       /* the rank that faults; -1: devald does */
        int timeout_ms;   /* the group's deadline */
        const char *name; /* the group */
} Case;

#ifndef DEVAL_FAULT_POINTS
#define FAULTS_BUILT false
#else
#define FAULTS_BUILT true
#endif

/* A gather of a few rows of two tensors, which the last rank to arrive runs (fast.c): a
 * step of one small tensor, every rank would run by itself (mirror.c). 0 or the status. */
static int gather(deval_group *g, int rank) {
        float x[16];
        int32_t id[3] = {rank, rank, rank};
        for (int i = 0; i < 16; i++)
                x[i] = (float)(rank * 100 + i);
        deval_tensor in[2] = {{.data = x,
                               .dtype = DEVAL_F32,
                               .ndim = 2,
                               .shape = {1 + rank % 3, 4},
                               .device = -1},
                              {.data = id,
                               .dtype = DEVAL_I32,
                               .ndim = 1,
                               .shape = {1 + rank % 3},
                               .device = -1}},
                     out[2];
        return deval_gather(g, 2, in, NULL, out);
}

/* A reduce of 16 bytes, which every rank runs by itself (mirror.c); 0 or the status. */
static int reduce(deval_group *g, int rank) {
        float x[4] = {(float)rank, 1, 2, 3};
        deval_tensor t = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {4}, .device = -1};
        int r = deval_reduce(g, &t, DEVAL_SUM);
        return r;
}

/* The collective of a case: the mirror_ points are reached by a mirrored step. */
static int step(const Case *c, deval_group *g, int rank) {
        return c->phase && strncmp(c->phase, "mirror_", 7) == 0 ? reduce(g, rank) : gather(g, rank);
}

static void run_rank(const Case *c, int rank) {
        deval_group *g;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = H.socket,
                             .timeout_ms = c->timeout_ms};
        Outcome *me = &S->out[rank];
        me->status = deval_join(c->name, rank, c->world, &o, &g);
        if (me->status < 0) {
                snprintf(me->msg, sizeof(me->msg), "join: %s", deval_errmsg(NULL));
                _exit(1);
        }
        if ((me->status = step(c, g, rank)) < 0) /* collective #1: everyone is there */
                goto failed;
        me->calls = 1;
        char spec[64];
        if (rank == c->victim) {
                snprintf(spec, sizeof(spec), "%s:%s:1500@2", c->phase, c->action);
                setenv("DEVAL_FAULT", spec, 1);
                S->t_fault = harness_now();
                /* the points of a step a rank runs are reached by the last to arrive */
                if (strncmp(c->phase, "fast_", 5) == 0)
                        usleep(200000);
        }
        me->t_call = harness_now();
        for (int i = 0; i < 20; i++) { /* #2 faults; the others go on until they fail */
                if ((me->status = step(c, g, rank)) < 0)
                        goto failed;
                me->calls++;
        }
        _exit(0);
failed:
        me->t_err = harness_now();
        snprintf(me->msg, sizeof(me->msg), "%s", deval_errmsg(g));
        _exit(0);
}

/* Fork the ranks; wait for the survivors, and only then reap the victim. */
static void run_case(const Case *c) {
        memset(S, 0, sizeof(*S));
        /* fast_share is reached when every rank copies a share of each step, fast_direct
         * when every rank copies its own rows into the result (the ranks inherit these) */
        unsetenv("DEVAL_SHARE_MIN");
        unsetenv("DEVAL_DIRECT_MIN");
        if (c->phase && strcmp(c->phase, "fast_share") == 0)
                setenv("DEVAL_SHARE_MIN", "0", 1);
        if (c->phase && strcmp(c->phase, "fast_direct") == 0)
                setenv("DEVAL_DIRECT_MIN", "0", 1);
        for (int k = 0; k < c->world; k++) {
                pid_t parent = getpid(), pid = fork();
                assert_true(pid >= 0);
                if (pid == 0) {
                        harness_die_with(parent, SIGKILL);
                        run_rank(c, k);
                }
                S->pid[k] = pid;
        }
        unsetenv("DEVAL_SHARE_MIN"); /* the ranks have them */
        unsetenv("DEVAL_DIRECT_MIN");
        for (int k = 0; k < c->world; k++) {
                if (k == c->victim)
                        continue;
                int st;
                assert_int_equal(waitpid(S->pid[k], &st, 0), S->pid[k]);
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                        fail_msg("%s:%s, %d ranks: rank %d ended with status 0x%x: %s", c->phase,
                                 c->action, c->world, k, st, S->out[k].msg);
        }
        if (c->victim >= 0) {
                int st;
                kill(S->pid[c->victim], SIGKILL);
                kill(S->pid[c->victim], SIGCONT);
                waitpid(S->pid[c->victim], &st, 0);
        }
}

static const char *how_it_ended(const char *action) {
        if (strcmp(action, "exit") == 0)
                return "exited with status 3";
        if (strcmp(action, "abort") == 0)
                return "was killed by signal 6";
        if (strcmp(action, "sigkill") == 0)
                return "was killed by signal 9";
        return "is stopped";
}

static void check_survivors(const Case *c, int want, double lo, double hi, const char *say) {
        for (int k = 0; k < c->world; k++) {
                if (k == c->victim)
                        continue;
                const Outcome *o = &S->out[k];
                double dt = o->t_err - S->t_fault;
                if (o->status != want || dt < lo || dt > hi || (say && !strstr(o->msg, say)))
                        fail_msg("%s:%s, %d ranks, rank %d: got %s after %.3f s (want %s in "
                                 "[%.2f, %.2f] s saying '%s'): %s",
                                 c->phase, c->action, c->world, k, deval_strerror(o->status), dt,
                                 deval_strerror(want), lo, hi, say ? say : "", o->msg);
        }
}

static void test_rank_faults(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        static const char *const phases[] = {"before_write", "before_arrive", "after_arrive",
                                             "fast_run",     "fast_publish",  "fast_share",
                                             "fast_direct",  "mirror_post",   "mirror_run"};
        static const char *const deaths[] = {"exit", "abort", "sigkill"};
        static const int worlds[] = {2, 5, 8};
        int n = 0;
        for (size_t p = 0; p < DV_ARRAY_SIZE(phases); p++)
                for (size_t a = 0; a < DV_ARRAY_SIZE(deaths); a++)
                        for (size_t w = 0; w < DV_ARRAY_SIZE(worlds); w++) {
                                char name[64];
                                snprintf(name, sizeof(name), "death-%d-%d", (int)getpid(), n++);
                                Case c = {phases[p],
                                          deaths[a],
                                          worlds[w],
                                          /* victim= */ (int)(n % (size_t)worlds[w]),
                                          10000,
                                          name};
                                run_case(&c);
                                char say[96];
                                snprintf(say, sizeof(say), "rank %d (pid %d) %s", c.victim,
                                         (int)S->pid[c.victim], how_it_ended(c.action));
                                check_survivors(&c, DEVAL_EPEER, 0.0, 1.0, say);
                        }
        printf("rank deaths: %d cases (9 points x exit/abort/SIGKILL x 2, 5, 8 ranks)\n", n);
}

static void test_rank_stops(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        static const char *const phases[] = {"before_write", "before_arrive", "after_arrive",
                                             "fast_run",     "fast_publish",  "fast_share",
                                             "fast_direct",  "mirror_post",   "mirror_run"};
        static const char *const stops[] = {"sigstop", "sleep"};
        static const int worlds[] = {2, 8};
        int n = 0;
        for (size_t p = 0; p < DV_ARRAY_SIZE(phases); p++)
                for (size_t a = 0; a < DV_ARRAY_SIZE(stops); a++)
                        for (size_t w = 0; w < DV_ARRAY_SIZE(worlds); w++) {
                                char name[64];
                                snprintf(name, sizeof(name), "stop-%d-%d", (int)getpid(), n++);
                                Case c = {phases[p],     stops[a], worlds[w],
                                          worlds[w] - 1, 1000,     name};
                                run_case(&c);
                                char say[96];
                                snprintf(say, sizeof(say), "rank %d (pid %d", c.victim,
                                         (int)S->pid[c.victim]);
                                /* the deadline runs from the first arrival; after_arrive
                                 * completes #2 and stalls #3, a little later */
                                check_survivors(&c, DEVAL_ETIMEDOUT, 0.9, 2.5, say);
                                if (strcmp(c.action, "sigstop") == 0 &&
                                    strcmp(c.phase, "after_arrive") != 0)
                                        check_survivors(&c, DEVAL_ETIMEDOUT, 0.9, 2.5,
                                                        "is stopped");
                        }
        printf("rank stops: %d cases (9 points x SIGSTOP/sleep x 2, 8 ranks)\n", n);
}

/* One stopped rank, watched through deval-ctl before the deadline. */
static int rank_watched(const Harness *h, int rank, int world, void *arg) {
        const char *name = arg;
        deval_group *g;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket, .timeout_ms = 3000};
        CHECK_OK(deval_join(name, rank, world, &o, &g), NULL);
        CHECK_OK(gather(g, rank), g);
        if (rank == 1) {
                S->pid[1] = getpid();
                raise(SIGSTOP);
                return 0;
        }
        int r = gather(g, rank);
        CHECK(r == DEVAL_ETIMEDOUT && strstr(deval_errmsg(g), "is stopped"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        return 0;
}

static void test_stopped_rank_in_ctl(void **state) {
        (void)state;
        char name[64], args[128], out[8192];
        snprintf(name, sizeof(name), "watched-%d", (int)getpid());
        memset(S, 0, sizeof(*S));
        pid_t parent = getpid(), runner = fork();
        if (runner == 0) {
                harness_die_with(parent, SIGKILL);
                _exit(harness_run(&H, 2, rank_watched, name, 20));
        }
        /* rank 0 waits for #2 from the first arrival on; look 1.2 s in */
        usleep(1500000);
        snprintf(args, sizeof(args), "group %s", name);
        int rc = harness_ctl(&H, args, out, sizeof(out));
        usleep(2000000); /* past the deadline: rank 0 is done */
        kill(S->pid[1], SIGKILL);
        int st;
        waitpid(runner, &st, 0);
        assert_int_equal(rc, 0);
        if (!strstr(out, "waiting for collective #2 for ") || !strstr(out, "stopped") ||
            !strstr(out, "no (last #1)"))
                fail_msg("deval-ctl %s does not show the stopped rank:\n%s", args, out);
        printf("%s", out);
        /* rank 1, killed while stopped, is the one failure */
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
}

static void test_daemon_faults(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        static const char *const phases[] = {"daemon_copy", "before_wake"};
        static const char *const actions[] = {"exit", "abort", "sigkill", "sigstop", "sleep"};
        int n = 0;
        harness_stop(&H);
        for (size_t p = 0; p < DV_ARRAY_SIZE(phases); p++)
                for (size_t a = 0; a < DV_ARRAY_SIZE(actions); a++) {
                        char spec[64], name[64];
                        snprintf(spec, sizeof(spec), "%s:%s:1500@2", phases[p], actions[a]);
                        setenv("DEVAL_FAULT", spec, 1);
                        harness_start(&H, NULL);
                        unsetenv("DEVAL_FAULT");
                        /* devald's points: its worker must run the steps, not the ranks */
                        setenv("DEVAL_RANK_STEPS", "0", 1);
                        snprintf(name, sizeof(name), "daemon-%d-%d", (int)getpid(), n++);
                        bool dies = strcmp(actions[a], "sigstop") != 0 &&
                                    strcmp(actions[a], "sleep") != 0;
                        Case c = {phases[p], actions[a], 3, -1, 1000, name};
                        run_case(&c);
                        /* devald faults once the last rank has come to #2 */
                        for (int k = 0; k < c.world; k++)
                                if (S->out[k].t_call > S->t_fault)
                                        S->t_fault = S->out[k].t_call;
                        if (dies) {
                                check_survivors(&c, DEVAL_EDAEMON, 0.0, 1.0, "devald");
                        } else if (strcmp(actions[a], "sigstop") == 0) {
                                /* the ranks' own deadline: the group's plus a grace of 2 s
                                 * in which devald's would have named the missing ranks */
                                check_survivors(&c, DEVAL_ETIMEDOUT, 2.9, 4.0, "within 1000 ms");
                        } else { /* 1.5 s asleep is slow, not dead: all 21 gathers work */
                                for (int k = 0; k < c.world; k++)
                                        if (S->out[k].status != 0 || S->out[k].calls != 21)
                                                fail_msg("%s: rank %d: %d calls, then %s: %s", spec,
                                                         k, S->out[k].calls,
                                                         deval_strerror(S->out[k].status),
                                                         S->out[k].msg);
                        }
                        /* devald is dead, stopped or asleep: end it, start the next */
                        int st;
                        kill(H.daemon, SIGKILL);
                        kill(H.daemon, SIGCONT);
                        waitpid(H.daemon, &st, 0);
                        unsetenv("DEVAL_RANK_STEPS");
                }
        harness_start(&H, NULL);
        printf("devald faults: %d cases (2 points x exit/abort/SIGKILL/SIGSTOP/sleep)\n", n);
}

/*
 * The flight recorder: rank 2 skips a gather, so at collective #2 it asks for a barrier
 * while the others gather (DEVAL_EMISMATCH); then it stalls past the deadline. deval-ctl
 * dump, asked in between, and the file devald writes at the timeout both point at #2.
 */
static int rank_desync(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "desync", rank, world, 1000, &g), NULL);
        CHECK_OK(gather(g, rank), g);
        int r = rank == 2 ? deval_barrier(g) : gather(g, rank);
        CHECK(r == DEVAL_EMISMATCH, "#2: %s: %s", deval_strerror(r), deval_errmsg(g));
        char name[64], args[128], out[16384];
        snprintf(name, sizeof(name), "desync-%d", (int)getppid());
        if (rank == 2) {
                usleep(1600000); /* never comes to #3 in time */
                return 0;
        }
        if (rank == 0) {
                snprintf(args, sizeof(args), "dump %s", name);
                CHECK(harness_ctl(h, args, out, sizeof(out)) == 0, "dump: %s", out);
                CHECK(strstr(out, "\"first_divergence\":2,") &&
                              strstr(out, "{\"rank\":2,\"op\":\"barrier\"") &&
                              strstr(out, "{\"rank\":1,\"op\":\"gather\""),
                      "dump:\n%s", out);
        }
        r = deval_barrier(g);
        CHECK(r == DEVAL_ETIMEDOUT, "#3: %s: %s", deval_strerror(r), deval_errmsg(g));
        if (rank == 0) { /* the post-mortem beside the socket, for the group's uid only */
                char path[256];
                struct stat st;
                snprintf(path, sizeof(path), "%s/flight-%s.json", h->dir, name);
                usleep(100000);
                CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "%s: %s", path,
                      strerror(errno));
                FILE *f = fopen(path, "r");
                CHECK(f, "%s", path);
                size_t n = fread(out, 1, sizeof(out) - 1, f);
                out[n] = '\0';
                fclose(f);
                CHECK(strstr(out, "\"first_divergence\":2,") &&
                              strstr(out, "{\"seq\":3,\"status\":\"timed out\"") &&
                              strstr(out, "{\"rank\":2,\"op\":null"),
                      "%s:\n%s", path, out);
                unlink(path);
        }
        return 0;
}

static void test_flight_recorder(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_desync, NULL, 30), 0);
}

/*
 * The rank that runs a small step writes junk where the result goes, or into the plan every
 * rank copies a share of: every rank gets DEVAL_EPROTO naming it, nobody crashes or hangs,
 * and the next step is exact.
 */
static int rank_garbage(const Harness *h, int rank, int world, void *arg) {
        const char *spec = arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "garbage", rank, world, 5000, &g), NULL);
        CHECK_OK(gather(g, rank), g);
        if (rank == world - 1) {
                setenv("DEVAL_FAULT", spec, 1);
                usleep(200000); /* the last to arrive runs #2 */
        }
        int r = gather(g, rank);
        char want[32];
        snprintf(want, sizeof(want), "rank %d %s", world - 1,
                 strstr(spec, "plan") ? "published" : "wrote");
        CHECK(r == DEVAL_EPROTO && strstr(deval_errmsg(g), want), "#2: %s: %s", deval_strerror(r),
              deval_errmsg(g));
        unsetenv("DEVAL_FAULT");
        float x[4] = {(float)rank, 1, 2, 3};
        deval_tensor in = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {4}, .device = -1},
                     out;
        CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
        const float *o = out.data;
        CHECK(out.shape[0] == 4 * world && o[0] == 0 && o[4 * (world - 1)] == world - 1,
              "#3 is not exact");
        deval_leave(g);
        return 0;
}

static void test_runner_writes_garbage(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        assert_int_equal(harness_run(&H, 3, rank_garbage, (void *)"fast_publish:garbage@2", 20), 0);
        /* a plan for every rank to copy a share of, with a segment of junk */
        setenv("DEVAL_SHARE_MIN", "0", 1);
        int r = harness_run(&H, 3, rank_garbage, (void *)"fast_plan:garbage@2", 20);
        unsetenv("DEVAL_SHARE_MIN");
        assert_int_equal(r, 0);
        /* and in the plan of a step every rank writes its own rows of, into the result */
        setenv("DEVAL_DIRECT_MIN", "0", 1);
        r = harness_run(&H, 3, rank_garbage, (void *)"fast_plan:garbage@2", 20);
        unsetenv("DEVAL_DIRECT_MIN");
        assert_int_equal(r, 0);
}

/*
 * A rank that writes junk into its record of a step every rank would run by itself
 * (mirror_post:garbage): no rank mirrors it, the step runs the other way with the inputs of
 * the slots, exact; and the next step is mirrored again.
 */
static int rank_record_garbage(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "recordgarbage", rank, world, 5000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 1)
                setenv("DEVAL_FAULT", "mirror_post:garbage@2", 1);
        for (int i = 2; i <= 3; i++) {
                int64_t v[2] = {rank, i};
                deval_tensor t = {
                        .data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1};
                CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                CHECK(v[0] == world * (world - 1) / 2 && v[1] == world * i, "#%d is not exact", i);
                CHECK((g->view == g->mirror.out) == (i == 3), "#%d: %s", i,
                      i == 3 ? "not mirrored" : "mirrored from a junk record");
        }
        unsetenv("DEVAL_FAULT");
        deval_leave(g);
        return 0;
}

static void test_record_garbage(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        assert_int_equal(harness_run(&H, 3, rank_record_garbage, NULL, 20), 0);
}

/*
 * A step done, then a rank that leaves at once: a rank that looked for the step's end just
 * before it and for a failure just after (the wait_done point holds it between the two)
 * still gets the step, not the failure the leave caused. Barrier #2 runs on rank 0, the last
 * to arrive, which leaves right after it.
 */
static int rank_done_then_left(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "donethenleft", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                usleep(200000); /* rank 1 waits in #2 by now, held at wait_done */
                CHECK_OK(deval_barrier(g), g);
                deval_leave(g);
                return 0;
        }
        setenv("DEVAL_FAULT", "wait_done:sleep:600@2", 1);
        int r = deval_barrier(g);
        unsetenv("DEVAL_FAULT");
        CHECK(r == 0, "#2 was done before rank 0 left, yet: %s: %s", deval_strerror(r),
              deval_errmsg(g));
        r = deval_barrier(g); /* and now the group has failed */
        CHECK(r == DEVAL_EPEER && strstr(deval_errmsg(g), "rank 0"), "#3: %s: %s",
              deval_strerror(r), deval_errmsg(g));
        deval_leave(g);
        return 0;
}

static void test_done_then_left(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        assert_int_equal(harness_run(&H, 2, rank_done_then_left, NULL, 20), 0);
}

/*
 * A mirrored step its last record completes while a rank goes to sleep (the wait_sleep point
 * holds rank 0 there): rank 0 runs it once and counts it once, 16 bytes. Rank 0 neither
 * spins nor yields, so it is among the sleepers before rank 1 arrives.
 */
static int rank_mirrored_once(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        if (rank == 0) {
                setenv("DEVAL_SPIN_US", "0", 1);
                setenv("DEVAL_YIELD_US", "0", 1);
        }
        CHECK_OK(harness_join(h, "mirroredonce", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        float x[4] = {1, 2, 3, (float)rank};
        deval_tensor t = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {4}, .device = -1};
        if (rank == 0)
                setenv("DEVAL_FAULT", "wait_sleep:sleep:300@2", 1);
        else
                usleep(100000); /* rank 0 sleeps at wait_sleep by now */
        int r = deval_reduce(g, &t, DEVAL_SUM);
        unsetenv("DEVAL_FAULT");
        CHECK(r == 0 && x[0] == 2 && x[3] == 1, "reduce: %s: %s", deval_strerror(r),
              deval_errmsg(g));
        CHECK(g->view == g->mirror.out, "rank %d did not mirror the reduce", rank);
        if (rank == 0) {
                uint64_t b = atomic_load(&g->hdr->fast.mirror_bytes);
                CHECK(b == sizeof(x), "mirrored %llu bytes, not %zu", (unsigned long long)b,
                      sizeof(x));
        }
        CHECK_OK(deval_barrier(g), g);
        CHECK_OK(deval_leave(g), NULL);
        return 0;
}

static void test_mirrored_once(void **state) {
        (void)state;
        if (!FAULTS_BUILT)
                skip();
        assert_int_equal(harness_run(&H, 2, rank_mirrored_once, NULL, 20), 0);
}

/* An aborted group: every later call fails at once. */
static int rank_aborted(const Harness *h, int rank, int world, void *arg) {
        const char *name = arg;
        deval_group *g;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket, .timeout_ms = 10000};
        CHECK_OK(deval_join(name, rank, world, &o, &g), NULL);
        int r = 0;
        for (int i = 0; i < 100000 && r == 0; i++)
                r = gather(g, rank);
        CHECK(r == DEVAL_EABORTED, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        double t0 = harness_now();
        for (int i = 0; i < 100; i++)
                CHECK((r = gather(g, rank)) == DEVAL_EABORTED, "call %d: %s", i, deval_strerror(r));
        double each = (harness_now() - t0) / 100;
        CHECK(each < 0.001, "a call on an aborted group took %.6f s", each);
        return 0;
}

static void test_aborted_group(void **state) {
        (void)state;
        char name[64], args[128], out[4096];
        snprintf(name, sizeof(name), "aborted-%d", (int)getpid());
        pid_t parent = getpid(), runner = fork();
        if (runner == 0) {
                harness_die_with(parent, SIGKILL);
                _exit(harness_run(&H, 4, rank_aborted, name, 30));
        }
        usleep(300000);
        snprintf(args, sizeof(args), "abort %s", name);
        int rc = harness_ctl(&H, args, out, sizeof(out));
        int st;
        waitpid(runner, &st, 0);
        assert_int_equal(rc, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Two groups at once: a rank killed in one, the other's 1000 collectives go on. */
static int rank_two_groups(const Harness *h, int rank, int world, void *arg) {
        (void)world;
        const char *base = arg;
        char name[64];
        int which = rank / 2, r2 = rank % 2;
        snprintf(name, sizeof(name), "%s-%c", base, which ? 'b' : 'a');
        deval_group *g;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket, .timeout_ms = 10000};
        CHECK_OK(deval_join(name, r2, 2, &o, &g), NULL);
        if (which == 1) { /* group b: rank 1 dies in its 10th gather */
                for (int i = 0; i < 9; i++)
                        CHECK_OK(gather(g, r2), g);
                if (r2 == 1)
                        raise(SIGKILL);
                int r = gather(g, r2);
                CHECK(r == DEVAL_EPEER, "group b: got %s", deval_strerror(r));
                return 0;
        }
        for (int i = 0; i < 1000; i++)
                CHECK_OK(gather(g, r2), g);
        return 0;
}

static void test_other_group_untouched(void **state) {
        (void)state;
        char name[64];
        snprintf(name, sizeof(name), "pair-%d", (int)getpid());
        /* rank 3 (group b's rank 1) is meant to die: harness_run counts it */
        assert_int_equal(harness_run(&H, 4, rank_two_groups, name, 60), 1);
}

/*
 * devald killed with SIGKILL under load and started again, RESTARTS times, on the same
 * socket: every waiting rank returns DEVAL_EDAEMON within 1 s each time, joins the new
 * devald, and ends with the descriptors and memory it started with.
 */
enum {
        RESTARTS = 100,
        RESTART_RANKS = 3
};
/* the sanitizers keep freed memory in quarantine (ASan's holds 256 MiB by default), so RSS
 * drifts there by as much as the ranks free: 56-67 MiB over the 100 restarts in runs on the
 * 2-core VM, before and after groups could span machines. LSan checks leaks there; the plain
 * build keeps the tight bound. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RSS_SLACK_KIB (256 * 1024)
#else
#define RSS_SLACK_KIB 1024
#endif

typedef struct {
        _Atomic int cycle; /* the devald now running (1-based); 0: none yet */
        _Atomic int stop;
        _Atomic int gathers[RESTART_RANKS];
        _Atomic int failed[RESTART_RANKS]; /* cycles that ended in DEVAL_EDAEMON */
        double t_kill;
        double worst[RESTART_RANKS];
        int bad_status[RESTART_RANKS];
        int fds[RESTART_RANKS][2];  /* after the first cycle, after the last */
        long rss[RESTART_RANKS][2]; /* KiB */
        char msg[RESTART_RANKS][256];
} Restarts;

static int count_fds(void) {
        int n = 0;
        for (int fd = 0; fd < 1024; fd++)
                n += fcntl(fd, F_GETFD) >= 0;
        return n;
}

static long rss_kib(void) {
        long pages = 0, rss = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (f) {
                if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
                        rss = 0;
                fclose(f);
        }
        return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static void restart_rank(Restarts *R, const char *sock, int rank) {
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = sock, .timeout_ms = 10000};
        for (int done = 0; !R->stop;) {
                deval_group *g = NULL;
                if (R->cycle <= done || deval_join("restart", rank, RESTART_RANKS, &o, &g) < 0) {
                        usleep(2000); /* devald is not (yet) there: try again */
                        continue;
                }
                int r;
                while ((r = gather(g, rank)) == 0)
                        R->gathers[rank]++;
                double dt = harness_now() - R->t_kill;
                if (r != DEVAL_EDAEMON) {
                        R->bad_status[rank] = r;
                        snprintf(R->msg[rank], sizeof(R->msg[rank]), "%s", deval_errmsg(g));
                }
                if (dt > R->worst[rank])
                        R->worst[rank] = dt;
                deval_leave(g);
                done = R->cycle;
                int at = R->failed[rank] == 0 ? 0 : 1;
                R->fds[rank][at] = count_fds();
                R->rss[rank][at] = rss_kib();
                R->failed[rank]++;
        }
        _exit(0);
}

static void test_daemon_restarts(void **state) {
        (void)state;
        Restarts *R =
                mmap(NULL, sizeof(*R), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(R != MAP_FAILED);
        memset(R, 0, sizeof(*R));
        char dir[64] = "/tmp/deval-restart-XXXXXX", sock[100];
        assert_non_null(mkdtemp(dir));
        snprintf(sock, sizeof(sock), "%s/devald.sock", dir);
        pid_t ranks[RESTART_RANKS];
        pid_t parent = getpid();
        for (int k = 0; k < RESTART_RANKS; k++)
                if ((ranks[k] = fork()) == 0) {
                        harness_die_with(parent, SIGKILL);
                        restart_rank(R, sock, k);
                }
        double t0 = harness_now();
        for (int c = 1; c <= RESTARTS; c++) {
                pid_t d = fork();
                if (d == 0) {
                        harness_die_with(parent, SIGTERM);
                        execl(getenv("DEVALD"), "devald", "--socket", sock, "--log-level", "err",
                              (char *)NULL);
                        _exit(127);
                }
                int before[RESTART_RANKS];
                for (int k = 0; k < RESTART_RANKS; k++)
                        before[k] = R->gathers[k];
                R->cycle = c;
                /* under load: every rank has gathered on this devald */
                for (int k = 0, waited = 0; k < RESTART_RANKS; waited++) {
                        if (R->gathers[k] > before[k] + 2) {
                                k++;
                                continue;
                        }
                        if (waited > 10000)
                                fail_msg("restart %d: rank %d made no progress in 10 s", c, k);
                        usleep(1000);
                }
                R->t_kill = harness_now();
                kill(d, SIGKILL);
                waitpid(d, NULL, 0);
                for (int k = 0, waited = 0; k < RESTART_RANKS; waited++) {
                        if (R->failed[k] >= c) {
                                k++;
                                continue;
                        }
                        if (waited > 5000)
                                fail_msg("restart %d: rank %d is stuck after devald died", c, k);
                        usleep(1000);
                }
        }
        R->stop = 1;
        for (int k = 0; k < RESTART_RANKS; k++)
                waitpid(ranks[k], NULL, 0);
        unlink(sock);
        rmdir(dir);
        double worst = 0;
        for (int k = 0; k < RESTART_RANKS; k++) {
                if (R->bad_status[k])
                        fail_msg("rank %d got %s, not DEVAL_EDAEMON: %s", k,
                                 deval_strerror(R->bad_status[k]), R->msg[k]);
                worst = R->worst[k] > worst ? R->worst[k] : worst;
                printf("rank %d: %d gathers; after restart 1: %d fds, %ld KiB; after restart "
                       "%d: %d fds, %ld KiB\n",
                       k, R->gathers[k], R->fds[k][0], R->rss[k][0], RESTARTS, R->fds[k][1],
                       R->rss[k][1]);
                assert_int_equal(R->fds[k][0], R->fds[k][1]);
                assert_true(R->rss[k][1] - R->rss[k][0] < RSS_SLACK_KIB);
        }
        printf("%d restarts in %.1f s: DEVAL_EDAEMON at most %.0f ms after the kill\n", RESTARTS,
               harness_now() - t0, worst * 1e3);
        assert_true(worst < 1.0);
        munmap(R, sizeof(*R));
}

static int setup(void **state) {
        (void)state;
        S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(S != MAP_FAILED);
        harness_start(&H, NULL);
        return 0;
}

static int teardown(void **state) {
        (void)state;
        harness_stop(&H);
        return 0;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rank_faults),
                cmocka_unit_test(test_rank_stops),
                cmocka_unit_test(test_stopped_rank_in_ctl),
                cmocka_unit_test(test_aborted_group),
                cmocka_unit_test(test_other_group_untouched),
                cmocka_unit_test(test_flight_recorder),
                cmocka_unit_test(test_runner_writes_garbage),
                cmocka_unit_test(test_record_garbage),
                cmocka_unit_test(test_done_then_left),
                cmocka_unit_test(test_mirrored_once),
                /* last: these stop and start devald themselves */
                cmocka_unit_test(test_daemon_restarts),
                cmocka_unit_test(test_daemon_faults),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
