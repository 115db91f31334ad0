/* SPDX-License-Identifier: MIT */
/*
 * test-failures.c - what happens when things go wrong, with a real devald and real ranks:
 * a rank killed or exiting mid-collective, devald killed or stopped, a rank that never
 * arrives, ranks that disagree, bad arguments, quotas, a client that scribbles on shared
 * memory. Every other rank must get the right status quickly with a message that names who
 * and where, devald must survive and keep serving other groups, and a failed group's memory
 * must be freed.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "handle.h"
#include "harness.h"
#include "sock.h"
#include "util.h"
#include "wire.h"

static Harness H;

/* Shared between ranks: pids and timestamps, in an anonymous shared mapping. */
typedef struct {
        pid_t pid[8];
        double t_event;
        int flag;
        int hung; /* ranks that hung up (test_hangups_do_not_stall) */
} Shared;
static Shared *S;

static int setup(void **state) {
        (void)state;
        S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(S != MAP_FAILED);
        return 0;
}

static int before(void **state) {
        (void)state;
        memset(S, 0, sizeof(*S));
        harness_start(&H, NULL);
        return 0;
}

static int after(void **state) {
        (void)state;
        harness_stop(&H);
        return 0;
}

/* Everyone but the victim gathers; the victim dies 300 ms into the collective. */
static int rank_victim(const Harness *h, int rank, int world, void *arg) {
        int how = *(int *)arg; /* 0: SIGKILL, 1: exit without leaving, 2: SIGKILL with a
                                 forked child still holding the rank's socket */
        deval_group *g;
        CHECK_OK(harness_join(h, "victim", rank, world, 20000, &g), NULL);
        S->pid[rank] = getpid();
        CHECK_OK(deval_barrier(g), g);
        if (rank == world - 1) {
                usleep(300000);
                if (how == 2 && fork() == 0) { /* a DataLoader-like worker, outliving it */
                        usleep(3000000);
                        _exit(0);
                }
                S->t_event = harness_now();
                if (how != 1)
                        raise(SIGKILL);
                _exit(0);
        }
        float x[4] = {1, 2, 3, 4};
        deval_tensor in = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {4}, .device = -1},
                     out;
        int r = deval_gather(g, 1, &in, NULL, &out);
        double now = harness_now();
        CHECK(r == DEVAL_EPEER, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        CHECK(now - S->t_event < 1.0, "EPEER came %.3f s after the death", now - S->t_event);
        char want[64];
        snprintf(want, sizeof(want), "rank %d (pid %d)", world - 1, (int)S->pid[world - 1]);
        CHECK(strstr(deval_errmsg(g), want), "message '%s' does not name '%s'", deval_errmsg(g),
              want);
        CHECK(strstr(deval_errmsg(g), "gather"), "message '%s' does not say where",
              deval_errmsg(g));
        /* the failure sticks */
        CHECK(deval_barrier(g) == DEVAL_EPEER, "later collectives must fail too");
        /* but a bad argument is still named as such */
        int32_t iv = 1;
        deval_tensor it = {.data = &iv, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
        CHECK(deval_reduce(g, &it, DEVAL_MEAN) == DEVAL_EINVAL, "mean of i32 on a failed group");
        in.ndim = 9;
        CHECK(deval_gather(g, 1, &in, NULL, &out) == DEVAL_EINVAL, "ndim 9 on a failed group");
        deval_leave(g);
        return 0;
}

static void test_rank_killed(void **state) {
        (void)state;
        int how = 0;
        assert_int_equal(harness_run(&H, 3, rank_victim, &how, 20), 1); /* the victim itself */
}

static void test_rank_killed_socket_inherited(void **state) {
        (void)state;
        int how = 2;
        assert_int_equal(harness_run(&H, 3, rank_victim, &how, 20), 1);
}

static void test_rank_exits(void **state) {
        (void)state;
        int how = 1;
        assert_int_equal(harness_run(&H, 4, rank_victim, &how, 20), 0);
}

/*
 * devald is killed while the ranks run barriers: each gets DEVAL_EDAEMON within 1 s. A small
 * step runs on the ranks, so the barriers under way as devald dies may still complete.
 */
static int rank_daemon_killed(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "dkill", rank, world, 20000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                usleep(300000);
                S->t_event = harness_now();
                kill(h->daemon, SIGKILL);
        }
        int r, n = 0;
        while ((r = deval_barrier(g)) == 0 && n < 1000000)
                n++;
        double now = harness_now();
        CHECK(r == DEVAL_EDAEMON, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        CHECK(now - S->t_event < 1.0, "EDAEMON came %.3f s after the kill", now - S->t_event);
        CHECK(deval_barrier(g) == DEVAL_EDAEMON, "the failure must stick");
        deval_leave(g);
        return 0;
}

static void test_daemon_killed(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_daemon_killed, NULL, 20), 0);
        int st;
        assert_int_equal(waitpid(H.daemon, &st, 0), H.daemon);
        assert_true(WIFSIGNALED(st));
        H.daemon = 0;
        unlink(H.socket);
        rmdir(H.dir);
}

/* SIGTERM mid-collective: ranks get DEVAL_EDAEMON saying devald is shutting down. */
static int rank_daemon_stopped(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "dstop", rank, world, 20000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                usleep(300000);
                S->t_event = harness_now();
                kill(h->daemon, SIGTERM);
        }
        /* a step already in flight may finish; the first that fails says why, quickly */
        int r = 0;
        for (int i = 0; i < 1000 && r == 0; i++)
                r = deval_barrier(g);
        CHECK(r == DEVAL_EDAEMON, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        CHECK(strstr(deval_errmsg(g), "shutting down"), "'%s'", deval_errmsg(g));
        CHECK(harness_now() - S->t_event < 1.0, "EDAEMON came %.3f s after SIGTERM",
              harness_now() - S->t_event);
        deval_leave(g);
        return 0;
}

static void test_daemon_sigterm(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_daemon_stopped, NULL, 20), 0);
        int st;
        assert_int_equal(waitpid(H.daemon, &st, 0), H.daemon);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        H.daemon = 0;
        struct stat sb;
        assert_int_equal(stat(H.socket, &sb), -1);
        rmdir(H.dir);
}

/* Rank 2 never arrives at collective #2: the others time out naming it and where it is. */
static int rank_straggler(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "late", rank, world, 1000, &g), NULL);
        S->pid[rank] = getpid();
        CHECK_OK(deval_barrier(g), g);
        if (rank == 2) {
                usleep(2500000);
                deval_leave(g);
                return 0;
        }
        double t0 = harness_now();
        int64_t v = 1;
        deval_tensor t = {.data = &v, .dtype = DEVAL_I64, .ndim = 0, .device = -1};
        int r = deval_reduce(g, &t, DEVAL_SUM);
        double dt = harness_now() - t0;
        CHECK(r == DEVAL_ETIMEDOUT, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        CHECK(dt >= 0.95 && dt < 2.0, "timed out after %.3f s, the timeout is 1 s", dt);
        char want[64];
        snprintf(want, sizeof(want), "rank 2 (pid %d)", (int)S->pid[2]);
        const char *m = deval_errmsg(g);
        CHECK(strstr(m, want) && strstr(m, "collective #1 (barrier)") &&
                      strstr(m, "collective #2 (reduce)"),
              "message '%s' must name the rank, its pid and where it is", m);
        CHECK(!strstr(m, "rank 0 (") && !strstr(m, "rank 1 ("), "'%s' blames arrived ranks", m);
        /* the figure the ranks joined with, and where to change it */
        CHECK(strstr(m, "timed out after 1000 ms (the shortest timeout its ranks joined with; set "
                        "timeout_ms in deval_join_opts, or timeout= in deval.join(), to wait "
                        "longer)"),
              "message '%s' must say which timeout it is and where it is set", m);
        if (rank == 0) { /* while its members still hold it, the group shows as failed */
                char out[4096];
                CHECK(harness_ctl(h, "--json=short groups", out, sizeof(out)) == 0, "%s", out);
                CHECK(strstr(out, "\"state\":\"failed\""), "deval-ctl groups: %s", out);
        }
        if (rank == 1)
                usleep(500000); /* still a member while rank 0 looks */
        deval_leave(g);
        return 0;
}

static void test_timeout(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_straggler, NULL, 20), 0);
}

/* The group never forms: the joiner times out naming the ranks that never came. */
static int rank_lonely(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g = NULL;
        int r = harness_join(h, "lonely", rank, 4, 500, &g);
        CHECK(r == DEVAL_ETIMEDOUT, "got %s", deval_strerror(r));
        CHECK(strstr(deval_errmsg(NULL), "never joined: 1 2 3"), "'%s'", deval_errmsg(NULL));
        CHECK(strstr(deval_errmsg(NULL), "did not form within 500 ms (this rank's join timeout; "
                                         "set timeout_ms in deval_join_opts"),
              "'%s' must say which timeout it is and where it is set", deval_errmsg(NULL));
        CHECK(g == NULL, "no handle on failure");
        return 0;
}

static void test_join_timeout(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 1, rank_lonely, NULL, 10), 0);
}

typedef struct {
        const char *field;
        int what;
} MismatchArgs;

static int rank_mismatch(const Harness *h, int rank, int world, void *arg) {
        const MismatchArgs *a = arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "mismatch", rank, world, 10000, &g), NULL);
        int odd = rank == world - 1;
        float xf[6] = {0};
        double xd[6] = {0};
        deval_tensor in = {.data = xf,
                           .dtype = DEVAL_F32,
                           .ndim = 2,
                           .shape = {2, 3},
                           .device = -1},
                     out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        int r;
        if (odd) {
                switch (a->what) {
                case 1:
                        in.data = xd;
                        in.dtype = DEVAL_F64;
                        break;
                case 2:
                        in.ndim = 1;
                        in.shape[0] = 6;
                        break;
                case 3:
                        o.order = DEVAL_ORDER_STRIDED;
                        break;
                case 4:
                        o.pad_first = 1;
                        break;
                case 5:
                        o.keep_rows = 3;
                        break;
                case 6:
                        o.pad_value = -1;
                        break;
                case 7:
                        o.root = 0;
                        break;
                }
        }
        if (a->what == 0 && odd)
                r = deval_barrier(g);
        else
                r = deval_gather(g, 1, &in, &o, &out);
        const char *m = deval_errmsg(g);
        CHECK(r == DEVAL_EMISMATCH, "got %s: %s", deval_strerror(r), m);
        char who[32];
        snprintf(who, sizeof(who), "rank %d", world - 1);
        CHECK(strstr(m, a->field) && strstr(m, "rank 0") && strstr(m, who),
              "'%s' must name the field '%s' and the ranks", m, a->field);
        /* a mismatch fails one step, not the group */
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_mismatch(void **state) {
        (void)state;
        MismatchArgs cases[] = {{"op", 0},        {"dtype", 1},     {"ndim", 2},      {"order", 3},
                                {"pad_first", 4}, {"keep_rows", 5}, {"pad_value", 6}, {"root", 7}};
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
                assert_int_equal(harness_run(&H, 3, rank_mismatch, &cases[i], 20), 0);
}

/* Bad arguments fail fast with DEVAL_EINVAL and leave the group usable. */
static int rank_bad_args(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "badargs", rank, world, 10000, &g), NULL);
        float x[4] = {1, 2, 3, 4};
        deval_tensor ok = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {4}, .device = -1};
        deval_tensor bad, out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        bad = ok;
        bad.ndim = 9;
        CHECK(deval_gather(g, 1, &bad, NULL, &out) == DEVAL_EINVAL, "ndim 9");
        CHECK(strstr(deval_errmsg(g), "ndim 9"), "'%s'", deval_errmsg(g));
        bad = ok;
        bad.shape[0] = -4;
        CHECK(deval_gather(g, 1, &bad, NULL, &out) == DEVAL_EINVAL, "negative size");
        CHECK(strstr(deval_errmsg(g), "negative"), "'%s'", deval_errmsg(g));
        bad = ok;
        bad.ndim = 4;
        bad.shape[0] = bad.shape[1] = bad.shape[2] = bad.shape[3] = INT64_MAX / 1000;
        CHECK(deval_gather(g, 1, &bad, NULL, &out) == DEVAL_EINVAL, "overflow");
        CHECK(strstr(deval_errmsg(g), "overflow"), "'%s'", deval_errmsg(g));
        bad = ok;
        bad.data = NULL;
        CHECK(deval_gather(g, 1, &bad, NULL, &out) == DEVAL_EINVAL, "NULL data");
        CHECK(strstr(deval_errmsg(g), "NULL"), "'%s'", deval_errmsg(g));
        bad = ok;
        bad.dtype = 42;
        CHECK(deval_gather(g, 1, &bad, NULL, &out) == DEVAL_EINVAL, "dtype 42");
        CHECK(strstr(deval_errmsg(g), "dtype 42"), "'%s'", deval_errmsg(g));
        CHECK(deval_gather(g, 0, &ok, NULL, &out) == DEVAL_EINVAL, "n = 0");
        CHECK(deval_gather(g, 1, NULL, NULL, &out) == DEVAL_EINVAL, "in NULL");
        o.root = world;
        CHECK(deval_gather(g, 1, &ok, &o, &out) == DEVAL_EINVAL, "root = world");
        o = (deval_gather_opts)DEVAL_GATHER_OPTS_INIT;
        o.order = 7;
        CHECK(deval_gather(g, 1, &ok, &o, &out) == DEVAL_EINVAL, "order 7");
        /* options carry their size: 0 is a struct nobody initialised; a larger one, from a
         * newer deval.h, is fine while the fields this libdeval lacks are 0 */
        deval_gather_opts zero = {0};
        CHECK(deval_gather(g, 1, &ok, &zero, &out) == DEVAL_EINVAL, "size 0");
        CHECK(strstr(deval_errmsg(g), "DEVAL_GATHER_OPTS_INIT"), "'%s'", deval_errmsg(g));
        struct {
                deval_gather_opts o;
                uint64_t later;
        } newer = {DEVAL_GATHER_OPTS_INIT, 1};
        newer.o.size = sizeof(newer);
        CHECK(deval_gather(g, 1, &ok, &newer.o, &out) == DEVAL_EINVAL, "an unknown field set");
        CHECK(strstr(deval_errmsg(g), "newer deval.h"), "'%s'", deval_errmsg(g));
        newer.later = 0;
        newer.o.keep_rows = 1;
        CHECK_OK(deval_gather(g, 1, &ok, &newer.o, &out), g);
        CHECK(out.shape[0] == 1, "keep_rows through a larger struct: %lld rows",
              (long long)out.shape[0]);
        deval_join_opts jz = {0};
        deval_group *g2 = NULL;
        CHECK(deval_join("never", 0, 1, &jz, &g2) == DEVAL_EINVAL && !g2, "join opts size 0");
        CHECK(strstr(deval_errmsg(NULL), "DEVAL_JOIN_OPTS_INIT"), "'%s'", deval_errmsg(NULL));
        int32_t iv = 3;
        deval_tensor it = {.data = &iv, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
        CHECK(deval_reduce(g, &it, DEVAL_MEAN) == DEVAL_EINVAL, "mean of i32");
        CHECK(deval_reduce(g, &it, (deval_reduce_op)9) == DEVAL_EINVAL, "op 9");
        CHECK(deval_broadcast(g, &it, -1) == DEVAL_EINVAL, "root -1");
        CHECK(deval_eval_begin(g, -5, DEVAL_ORDER_RANK) == DEVAL_EINVAL, "num_samples -5");
        CHECK(deval_gather_objects(g, 2, NULL, NULL, NULL, NULL) == DEVAL_EINVAL, "objects");
        CHECK(deval_gather(NULL, 1, &ok, NULL, &out) == DEVAL_EINVAL, "NULL group");
        /* every rank refused each at its own step: the group works, and in step */
        CHECK_OK(deval_gather(g, 1, &ok, NULL, &out), g);
        CHECK(out.shape[0] == 4 * world, "%lld rows", (long long)out.shape[0]);
        CHECK_OK(deval_reduce(g, &it, DEVAL_SUM), g);
        CHECK(iv == 3 * world, "sum %d", iv);
        deval_leave(g);
        return 0;
}

/*
 * One rank's bad argument, the others' good ones: the call fails on every rank, within 1 s,
 * with that rank's words, and the ranks' next calls pair with each other's, not with the
 * refused one (a rank that skipped its step paired its next gather with the others' refused
 * one: a wrong result, without an error).
 */
static int rank_one_bad_arg(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "onebad", rank, world, 10000, &g), NULL);
        float x[2] = {(float)rank, (float)rank};
        deval_tensor in = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {2}, .device = -1};
        deval_tensor out;
        if (rank == 1)
                in.ndim = 9;
        double t0 = harness_now();
        int r = deval_gather(g, 1, &in, NULL, &out);
        double took = harness_now() - t0;
        CHECK(r == DEVAL_EINVAL && strstr(deval_errmsg(g), "ndim 9"), "rank %d: %s: %s", rank,
              deval_strerror(r), deval_errmsg(g));
        CHECK(rank == 1 || (strstr(deval_errmsg(g), "rank 1 (pid") &&
                            strstr(deval_errmsg(g), "refused its own call")),
              "rank %d: '%s'", rank, deval_errmsg(g));
        CHECK(took < 1, "rank %d heard it after %.3f s", rank, took);
        int32_t iv = rank;
        float fv = (float)rank;
        deval_tensor it = {.data = &iv, .dtype = DEVAL_I32, .ndim = 0, .device = -1};
        deval_tensor ft = {.data = &fv, .dtype = DEVAL_F32, .ndim = 0, .device = -1};
        r = deval_reduce(g, rank == 2 ? &it : &ft, DEVAL_MEAN);
        CHECK(r == DEVAL_EINVAL && strstr(deval_errmsg(g), "mean needs a floating dtype") &&
                      (rank == 2 || strstr(deval_errmsg(g), "rank 2 (pid")),
              "rank %d: %s: %s", rank, deval_strerror(r), deval_errmsg(g));
        in.ndim = 1;
        in.shape[0] = 1;
        CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
        const float *v = out.data;
        CHECK(out.shape[0] == world && v[0] == 0 && v[1] == 1 && v[2] == 2,
              "rank %d: the next gather has %lld rows", rank, (long long)out.shape[0]);
        deval_leave(g);
        return 0;
}

static void test_one_rank_bad_argument(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_one_bad_arg, NULL, 20), 0);
}

static void test_bad_arguments(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_bad_args, NULL, 20), 0);
}

static int rank_bad_joins(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g = NULL, *g2 = NULL;
        CHECK(harness_join(h, "joins", 2, 2, 1000, &g) == DEVAL_EINVAL, "rank >= world");
        CHECK(strstr(deval_errmsg(NULL), "rank 2"), "'%s'", deval_errmsg(NULL));
        CHECK(harness_join(h, "joins", 0, 0, 1000, &g) == DEVAL_EINVAL, "world 0");
        CHECK(harness_join(h, "joins", -1, 2, 1000, &g) == DEVAL_EINVAL, "rank -1");
        CHECK(harness_join(h, "", 0, 2, 1000, &g) != 0, "empty name");
        if (rank == 0) {
                /* rank 0 takes its place; rank 1 tries to take the same one */
                S->flag = 1;
                CHECK_OK(harness_join(h, "joins", 0, 2, 5000, &g), NULL);
                CHECK_OK(deval_barrier(g), g);
                deval_leave(g);
                return 0;
        }
        while (!S->flag)
                usleep(1000);
        usleep(100000);
        int r = harness_join(h, "joins", 0, 2, 1000, &g2);
        CHECK(r == DEVAL_EINVAL, "second rank 0: %s", deval_strerror(r));
        CHECK(strstr(deval_errmsg(NULL), "already joined"), "'%s'", deval_errmsg(NULL));
        r = harness_join(h, "joins", 1, 3, 1000, &g2);
        CHECK(r == DEVAL_EINVAL && strstr(deval_errmsg(NULL), "world size 2"),
              "other world size: '%s'", deval_errmsg(NULL));
        CHECK_OK(harness_join(h, "joins", 1, 2, 5000, &g2), NULL);
        CHECK_OK(deval_barrier(g2), g2);
        deval_leave(g2);
        return 0;
}

static void test_bad_joins(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_bad_joins, NULL, 20), 0);
}

/* One group dies while another keeps working; then devald holds no group at all. */
static int rank_survive(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g;
        if (rank >= 2) { /* the healthy group */
                CHECK_OK(harness_join(h, "healthy", rank - 2, 2, 10000, &g), NULL);
                for (int i = 0; i < 50; i++) {
                        CHECK_OK(deval_barrier(g), g);
                        usleep(10000);
                }
                deval_leave(g);
                return 0;
        }
        CHECK_OK(harness_join(h, "doomed", rank, 2, 10000, &g), NULL);
        double big[4096];
        memset(big, 0, sizeof(big));
        deval_tensor t = {.data = big,
                          .dtype = DEVAL_F64,
                          .ndim = 1,
                          .shape = {4096},
                          .device = -1},
                     out;
        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
        if (rank == 1)
                raise(SIGKILL);
        CHECK(deval_barrier(g) == DEVAL_EPEER, "EPEER");
        deval_leave(g);
        return 0;
}

static void test_daemon_survives(void **state) {
        (void)state;
        char buf[4096];
        assert_int_equal(harness_run(&H, 4, rank_survive, NULL, 20), 1);
        usleep(100000);
        assert_int_equal(harness_ctl(&H, "--json=short status", buf, sizeof(buf)), 0);
        /* every group, the failed one included, is gone with its memory */
        assert_non_null(strstr(buf, "\"total_groups\":0"));
        assert_non_null(strstr(buf, "\"groups\":[]"));
}

static int rank_quota(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "quota", rank, world, 10000, &g), NULL);
        size_t n = 1 << 20; /* 8 MiB of f64 per rank: over a 4 MiB quota */
        double *x = calloc(n, sizeof(double));
        deval_tensor t = {.data = x,
                          .dtype = DEVAL_F64,
                          .ndim = 1,
                          .shape = {(int64_t)n},
                          .device = -1},
                     out;
        /* rank 0's input is over the quota: every rank's step fails, naming it */
        t.shape[0] = rank == 0 ? (int64_t)n : 1000;
        int r = deval_gather(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_ENOMEM, "got %s: %s", deval_strerror(r), deval_errmsg(g));
        CHECK(strstr(deval_errmsg(g), "quota") && strstr(deval_errmsg(g), "rank 0"), "'%s'",
              deval_errmsg(g));
        t.shape[0] = 1000;
        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
        /* 1.5 MiB inputs fit; the 3 MiB result does not, whether the ranks write it
         * (DV_REQ_DIRECT) or devald does */
        t.shape[0] = 3 << 16;
        r = deval_gather(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(g), "quota"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        CHECK_OK(deval_barrier(g), g);
        free(x);
        deval_leave(g);
        return 0;
}

static void test_quota(void **state) {
        (void)state;
        harness_stop(&H);
        const char *extra[] = {"--max-group-bytes=4M", NULL};
        harness_start(&H, extra);
        assert_int_equal(harness_run(&H, 2, rank_quota, NULL, 20), 0);
}

/* A forked child holding its parent's handle gets a clear error, and the parent goes on. */
static int rank_forks(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "forks", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        pid_t child = fork();
        if (child == 0) {
                int r = deval_barrier(g);
                int ok = r == DEVAL_EINVAL && strstr(deval_errmsg(g), "forked");
                deval_leave(g); /* frees the child's copy, says nothing to devald */
                _exit(ok ? 0 : 1);
        }
        int st;
        waitpid(child, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child was not refused");
        CHECK_OK(deval_barrier(g), g); /* the parent's membership is intact */

        /* a child calling while its parent's request waits in the shared slot must not touch
         * that slot: rank 0's gather waits for rank 1, and rank 0's child calls a reduce */
        int64_t mine[3] = {rank, rank, rank}, got[6];
        deval_tensor in = {
                .data = mine, .dtype = DEVAL_I64, .ndim = 1, .shape = {rank + 2}, .device = -1};
        deval_tensor out;
        if (rank == 0 && (child = fork()) == 0) {
                usleep(100 * 1000); /* the parent has arrived by now */
                double v = 1;
                deval_tensor t = {.data = &v, .dtype = DEVAL_F64, .ndim = 0, .device = -1};
                int r = deval_reduce(g, &t, DEVAL_SUM);
                _exit(r == DEVAL_EINVAL ? 0 : 1);
        }
        if (rank == 1)
                usleep(400 * 1000);
        CHECK_OK(deval_gather(g, 1, &in, NULL, &out), g);
        CHECK(out.shape[0] == 5, "%lld rows", (long long)out.shape[0]);
        memcpy(got, out.data, sizeof(int64_t) * 5);
        CHECK(got[0] == 0 && got[1] == 0 && got[2] == 1 && got[3] == 1 && got[4] == 1,
              "the gather is not what the ranks sent");
        if (rank == 0) {
                waitpid(child, &st, 0);
                CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the second child was not refused");
        }
        deval_leave(g);
        return 0;
}

static void test_forked_child(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_forks, NULL, 20), 0);
}

/*
 * A client that writes garbage into its slot fails the step with EPROTO naming it: a tensor
 * far outside its arena, (arg "direct") a well-formed one flagged as lying in its own
 * memory (DV_REQ_DIRECT), which devald must refuse rather than read its arena instead, or
 * (arg "status") a staging status no rank may report, as the spanning step says too.
 */
static int rank_hostile(const Harness *h, int rank, int world, void *arg) {
        bool direct = arg && strcmp(arg, "direct") == 0;
        bool status = arg && strcmp(arg, "status") == 0;
        deval_group *g;
        /* the honest rank stages its input, so that devald sees the forged request beside it;
         * with its input in its own memory (DV_REQ_DIRECT), the step is not devald's to run */
        setenv("DEVAL_DIRECT_MIN", "18446744073709551615", 1);
        CHECK_OK(harness_join(h, "hostile", rank, world, 10000, &g), NULL);
        float x[2] = {1, 2};
        deval_tensor t = {.data = x, .dtype = DEVAL_F32, .ndim = 1, .shape = {2}, .device = -1},
                     out;
        if (rank == 1) {
                usleep(200000); /* the others have arrived: this rank hands the step over */
                /* forge a request: a tensor far outside the arena */
                DvSlot *s = &g->hdr->slots[rank];
                memset(&s->req, 0, offsetof(DvRequest, t));
                s->req.seq = g->seq + 1;
                s->req.op = DV_OP_GATHER;
                s->req.ntensors = 1;
                s->req.valid_rows = s->req.keep_rows = -1;
                s->req.root = -1;
                s->req.t[0] = (DvTensorDesc){.dtype = DEVAL_F32,
                                             .ndim = 1,
                                             .shape = {1 << 28},
                                             .offset = 1ull << 40,
                                             .nbytes = 1ull << 30};
                if (direct || status) {
                        s->req.t[0] = (DvTensorDesc){
                                .dtype = DEVAL_F32, .ndim = 1, .shape = {2}, .nbytes = 8};
                        s->req.flags = direct ? DV_REQ_DIRECT : 0;
                        s->req.status = status ? 12345 : 0;
                }
                g->seq++;
                /* its record says the step is not one to mirror (wire.h), so the others
                 * count themselves in */
                DvFast *f = &g->hdr->fast;
                DvMirror *m = &s->mirror[g->seq % 2];
                m->op = 0;
                atomic_store(&m->seq, g->seq);
                atomic_fetch_add(&f->wake, 1);
                dv_futex_wake(&f->wake);
                atomic_store(&s->arrived_seq, g->seq);
                /* the last to arrive hands the step to devald: after the others, which count
                 * themselves in once they have read its record */
                for (int i = 0; i < 10000 && atomic_load(&f->count) != (uint32_t)world - 1; i++)
                        usleep(1000);
                if (atomic_fetch_add(&f->count, 1) + 1 == (uint32_t)world) {
                        atomic_store(&f->count, 0);
                        atomic_store(&f->handoff_seq, g->seq);
                        atomic_fetch_add(&g->hdr->arrive, 1);
                        dv_futex_wake(&g->hdr->arrive);
                }
                while (atomic_load(&g->done->done_seq) != g->seq)
                        usleep(1000);
                CHECK(g->done->res[rank].status == DEVAL_EPROTO, "status %d",
                      g->done->res[rank].status);
                /* what devald writes (completions, failures, results) is not ours to forge:
                 * the segment is sealed against writes, so it cannot be made writable */
                CHECK(mprotect((void *)g->done, g->done_size, PROT_READ | PROT_WRITE) < 0,
                      "the completion segment could be made writable");
        } else {
                int r = deval_gather(g, 1, &t, NULL, &out);
                CHECK(r == DEVAL_EPROTO, "got %s: %s", deval_strerror(r), deval_errmsg(g));
                CHECK(strstr(deval_errmsg(g), "rank 1") &&
                              (!direct || strstr(deval_errmsg(g), "own memory")) &&
                              (!status || strstr(deval_errmsg(g), "malformed request")),
                      "'%s'", deval_errmsg(g));
        }
        /* the group goes on */
        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
        CHECK(out.shape[0] == 2 * world, "rows");
        deval_leave(g);
        return 0;
}

/* A rank overwrites the eval pass's counters in shared memory: the next gather for metrics
 * fails on every rank with EPROTO saying so, whoever runs it. */
static int rank_pass_forged(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "forged", rank, world, 10000, &g), NULL);
        int64_t v[2] = {rank, rank};
        deval_tensor t = {.data = v, .dtype = DEVAL_I64, .ndim = 1, .shape = {2}, .device = -1},
                     out;
        CHECK_OK(deval_eval_begin(g, 100, DEVAL_ORDER_RANK), g);
        CHECK_OK(deval_gather_for_metrics(g, 1, &t, NULL, &out), g);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 1)
                g->pass_sh->c.total[0] = -5;
        int r = deval_gather_for_metrics(g, 1, &t, NULL, &out);
        CHECK(r == DEVAL_EPROTO && strstr(deval_errmsg(g), "counters"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        deval_leave(g);
        return 0;
}

static void test_pass_counters_forged(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 2, rank_pass_forged, NULL, 20), 0);
}

/*
 * A hostile rank at full speed: a thread rewrites its slot's request, its input arena and
 * inline bytes, and the result of the steps the ranks run, with garbage without pause
 * (random fields, lying sizes and offsets, now valid, now not) while its group gathers 300
 * times. Every step of that group ends in success, EPROTO or
 * EMISMATCH, never a hang or a crash; a second group gathers 300 times meanwhile with
 * exact results; devald answers at the end. The suite runs this under ASan and UBSan too.
 */
static _Atomic int hostile_stop;

static void *scribble(void *arg) {
        deval_group *g = arg;
        DvSlot *s = &g->hdr->slots[g->rank];
        uint64_t x = 88172645463325252ull;
        while (!atomic_load(&hostile_stop)) {
                x ^= x << 13; /* xorshift64 */
                x ^= x >> 7;
                x ^= x << 17;
                DvRequest *q = &s->req;
                DvFast *f = &g->hdr->fast;
                switch (x % 10) {
                case 0:
                        q->op = (uint32_t)(x >> 8) % (DV_OP_MAX_ + 2);
                        break;
                case 1:
                        q->ntensors = (uint32_t)(x >> 8) % (DEVAL_MAX_TENSORS + 3);
                        break;
                case 2:
                        q->t[0].offset = (x >> 7) & 1 ? x >> 20 : (x >> 32) % 4096;
                        break;
                case 3:
                        q->t[0].nbytes = (x >> 7) & 1 ? x : (x >> 40) % 100000;
                        break;
                case 4:
                        q->t[0].shape[(x >> 8) % DEVAL_MAX_DIMS] = (int64_t)(x >> 3);
                        break;
                case 5:
                        q->t[0].ndim = (int32_t)((x >> 8) % 12) - 2;
                        q->t[0].dtype = (int32_t)((x >> 16) % 14) - 2;
                        break;
                case 6:
                        q->valid_rows = (int64_t)(x >> 20) - (1 << 20);
                        q->keep_rows = (int64_t)(x >> 30) % 7 - 1;
                        q->order = (int32_t)(x % 3);
                        break;
                case 7: /* the result of a step the ranks run, as others read it */
                        f->res.ntensors = (uint32_t)(x >> 8) % (DEVAL_MAX_TENSORS + 3);
                        f->res.t[0].offset = (x >> 7) & 1 ? x >> 20 : (x >> 32) % 4096;
                        f->res.t[0].nbytes = (x >> 9) & 1 ? x : (x >> 40) % 100000;
                        f->res.t[0].ndim = (int32_t)((x >> 12) % 12) - 2;
                        break;
                case 8:
                        f->res.op = (uint32_t)(x >> 8) % (DV_OP_MAX_ + 2);
                        f->res.t[0].shape[(x >> 8) % DEVAL_MAX_DIMS] = (int64_t)(x >> 3);
                        break;
                default:
                        if (g->in_size)
                                g->in[(x >> 16) % g->in_size] = (uint8_t)x;
                        if (g->inl_size)
                                g->inl[(x >> 16) % g->inl_size] = (uint8_t)x;
                }
        }
        return NULL;
}

/*
 * The hostile group's ranks, in both tests: rank 1 runs scribbler beside its own steps, and
 * every rank runs step 300 times, each ending in success or one of the statuses in allowed
 * (0-terminated), never a hang or a crash. Return: 0, or 1 when a check failed.
 */
static int hostile_steps(deval_group *g, int r3, void *(*scribbler)(void *),
                         int (*step)(deval_group *g, int r3, int i), const int *allowed,
                         const char *what) {
        pthread_t th;
        if (r3 == 1)
                pthread_create(&th, NULL, scribbler, g);
        int ok = 0, bad = 0;
        for (int i = 0; i < 300; i++) {
                int r = step(g, r3, i);
                bool known = r == 0;
                for (const int *a = allowed; *a && !known; a++)
                        known = r == *a;
                CHECK(known, "step %d: %s: %s", i, deval_strerror(r), deval_errmsg(g));
                if (r == 0)
                        ok++;
                else if (!bad++)
                        printf("rank %d, step %d: %s\n", r3, i, deval_errmsg(g));
        }
        if (r3 == 1) {
                atomic_store(&hostile_stop, 1);
                pthread_join(th, NULL);
        }
        if (r3 == 0)
                printf("%s: %d steps succeeded, %d did not\n", what, ok, bad);
        deval_leave(g);
        return 0;
}

/* Six ranks: a hostile group of three (rank_fn's first three) and two bystanders. */
static void hostile_run(int (*rank_fn)(const Harness *, int, int, void *)) {
#if defined(__SANITIZE_THREAD__)
        skip(); /* the scribbling thread races with its own rank on purpose */
#endif
        hostile_stop = 0;
        assert_int_equal(harness_run(&H, 6, rank_fn, NULL, 120), 0);
        char out[4096];
        assert_int_equal(harness_ctl(&H, "status", out, sizeof(out)), 0);
}

/* A gather of 4 x 16 floats, rank r3's. */
static int scribbled_gather(deval_group *g, int r3, int i) {
        (void)i;
        float x[64];
        for (int k = 0; k < 64; k++)
                x[k] = (float)(r3 * 1000 + k);
        deval_tensor t = {.data = x, .dtype = DEVAL_F32, .ndim = 2, .shape = {4, 16}, .device = -1},
                     out;
        return deval_gather(g, 1, &t, NULL, &out);
}

static int rank_scribbled(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g;
        int which = rank / 3, r3 = rank % 3;
        if (which == 1) { /* the bystanders: two ranks of another group, exact throughout */
                if (r3 == 2)
                        return 0;
                CHECK_OK(harness_join(h, "bystander", r3, 2, 10000, &g), NULL);
                float x[64];
                for (int i = 0; i < 64; i++)
                        x[i] = (float)(r3 * 1000 + i);
                deval_tensor t = {.data = x,
                                  .dtype = DEVAL_F32,
                                  .ndim = 2,
                                  .shape = {4, 16},
                                  .device = -1},
                             out;
                for (int i = 0; i < 300; i++) {
                        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g);
                        const float *o = out.data;
                        CHECK(out.shape[0] == 8 && o[0] == 0 && o[64] == 1000 && o[127] == 1063,
                              "bystander result %d", i);
                }
                deval_leave(g);
                return 0;
        }
        CHECK_OK(harness_join(h, "scribbled", r3, 3, 10000, &g), NULL);
        return hostile_steps(g, r3, scribble, scribbled_gather,
                             (const int[]){DEVAL_EPROTO, DEVAL_EMISMATCH, 0}, "scribbled group");
}

static void test_hostile_full_speed(void **state) {
        (void)state;
        hostile_run(rank_scribbled);
}

/*
 * The same at the records of the steps every rank runs by itself (mirror.c): a thread
 * rewrites both of its rank's records (the step, the op, the shape, the sizes, the data) and
 * the word that tells devald of those steps, without pause, while its group reduces and
 * meets at barriers 300 times. A rank then mirrors a step, or not, as it reads the records:
 * ranks that read them differently wait for each other until the deadline. So every step
 * ends in success, EPROTO, EMISMATCH, ETIMEDOUT or (once another rank that failed so left)
 * EPEER, never a hang or a crash; another group meanwhile reduces 300 times with exact
 * results, and devald answers at the end.
 */
static void *scribble_mirror(void *arg) {
        deval_group *g = arg;
        DvSlot *s = &g->hdr->slots[g->rank];
        uint64_t x = 0x9e3779b97f4a7c15ull;
        while (!atomic_load(&hostile_stop)) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                DvMirror *m = &s->mirror[(x >> 4) & 1];
                switch (x % 8) {
                case 0:
                        atomic_store(&m->seq, (uint32_t)(x >> 32) % 4 + g->seq);
                        break;
                case 1:
                        m->op = (uint32_t)(x >> 8) % (DV_OP_MAX_ + 2);
                        break;
                case 2:
                        m->ndim = (int32_t)((x >> 8) % 20) - 5;
                        m->shape[(x >> 16) % DEVAL_MAX_DIMS] = (int64_t)(x >> 3);
                        break;
                case 3:
                        m->nbytes = (x >> 7) & 1 ? (uint32_t)(x >> 20) : (uint32_t)(x >> 40) % 200;
                        break;
                case 4:
                        m->dtype = (int32_t)((x >> 16) % 14) - 2;
                        m->reduce_op = (int32_t)((x >> 24) % 8) - 2;
                        break;
                case 5:
                        atomic_store(&g->hdr->fast.mirror_seq, (uint32_t)(x >> 32) % 3 + g->seq);
                        break;
                default:
                        m->data[(x >> 16) % DV_MIRROR_BYTES] = (uint8_t)x;
                }
        }
        return NULL;
}

/* A reduce of four floats, mirrored; every third step a barrier. */
static int scribbled_reduce(deval_group *g, int r3, int i) {
        float v[4] = {(float)r3, 1, 2, 3};
        deval_tensor t = {.data = v, .dtype = DEVAL_F32, .ndim = 1, .shape = {4}, .device = -1};
        return i % 3 ? deval_reduce(g, &t, DEVAL_SUM) : deval_barrier(g);
}

static int rank_scribbled_mirror(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        (void)world;
        deval_group *g;
        int which = rank / 3, r3 = rank % 3;
        if (which == 1) { /* the bystanders, exact throughout */
                if (r3 == 2)
                        return 0;
                CHECK_OK(harness_join(h, "bystander", r3, 2, 10000, &g), NULL);
                for (int i = 0; i < 300; i++) {
                        int32_t v[3] = {r3, i, r3 * i};
                        deval_tensor t = {.data = v,
                                          .dtype = DEVAL_I32,
                                          .ndim = 1,
                                          .shape = {3},
                                          .device = -1};
                        CHECK_OK(deval_reduce(g, &t, DEVAL_SUM), g);
                        CHECK(v[0] == 1 && v[1] == 2 * i && v[2] == i, "bystander result %d", i);
                }
                deval_leave(g);
                return 0;
        }
        CHECK_OK(harness_join(h, "scribbledmirror", r3, 3, 1000, &g), NULL);
        return hostile_steps(
                g, r3, scribble_mirror, scribbled_reduce,
                (const int[]){DEVAL_EPROTO, DEVAL_EMISMATCH, DEVAL_ETIMEDOUT, DEVAL_EPEER, 0},
                "scribbled records");
}

static void test_hostile_mirror_records(void **state) {
        (void)state;
        hostile_run(rank_scribbled_mirror);
}

/*
 * Descriptors sent to devald unasked (no request carries any) are closed at once and
 * counted: devald's descriptor count does not grow, and deval-ctl status shows the count.
 */
/*
 * Every rank but 0 hangs up without leaving and stays alive: devald cannot tell how such a
 * member ended until a grace time has passed. It must not hold its loop meanwhile: rank 0,
 * a client of another group, is served at once (a loop that waited 20 ms per member took
 * HANG_WORLD x 20 ms, seconds), and still learns that its group lost its members.
 */
#define HANG_WORLD 192

static int rank_hangup(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g = NULL;
        CHECK_OK(harness_join(h, "hangup", rank, world, 30000, &g), g);
        CHECK_OK(deval_barrier(g), g);
        if (rank != 0) {
                close(g->sock); /* the connection, not a leave: devald sees a hang-up */
                __atomic_add_fetch(&S->hung, 1, __ATOMIC_SEQ_CST);
                usleep(1500 * 1000);
                _exit(0); /* alive until rank 0 is done; no leave */
        }
        while (__atomic_load_n(&S->hung, __ATOMIC_SEQ_CST) < world - 1)
                usleep(1000);
        double t0 = harness_now();
        deval_group *other = NULL;
        CHECK_OK(harness_join(h, "hangup-other", 0, 1, 5000, &other), other);
        CHECK_OK(deval_barrier(other), other);
        double took = harness_now() - t0;
        CHECK(took < 1.0, "another group waited %.3f s for devald's loop", took);
        deval_leave(other);
        int r = deval_barrier(g);
        CHECK(r == DEVAL_EPEER, "%s: %s", deval_strerror(r), deval_errmsg(g));
        deval_leave(g);
        return 0;
}

static void test_hangups_do_not_stall(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, HANG_WORLD, rank_hangup, NULL, 60), 0);
}

static int count_fds_of(pid_t pid) {
        char path[64];
        int n = 0;
        for (int fd = 0; fd < 4096; fd++) {
                snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
                n += access(path, F_OK) == 0;
        }
        return n;
}

static void test_unexpected_fds(void **state) {
        (void)state;
        int before = count_fds_of(H.daemon);
        for (int i = 0; i < 50; i++) {
                struct sockaddr_un sa = {.sun_family = AF_UNIX};
                snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", H.socket);
                int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                assert_true(s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
                int fds[3] = {0, 1, 2};
                DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_STATUS};
                assert_true(dv_send_msg(s, &req, sizeof(req), fds, 3, 0) == sizeof(req));
                char buf[65536];
                assert_true(recv(s, buf, sizeof(buf), 0) > 0); /* answered all the same */
                close(s);
        }
        usleep(100000);
        char out[4096];
        assert_int_equal(harness_ctl(&H, "--json=short status", out, sizeof(out)), 0);
        assert_non_null(strstr(out, "\"unexpected_fds\":150"));
        /* devald closes each connection when it sees the hang-up: give it that moment. The
         * 150 descriptors sent must be gone; a connection still being closed on a loaded
         * machine (a socket and a pidfd) is not what this is about. */
        int after = count_fds_of(H.daemon);
        for (int i = 0; i < 100 && after > before; i++) {
                usleep(10000);
                after = count_fds_of(H.daemon);
        }
        if (after > before + 2)
                fail_msg("devald holds %d descriptors, %d before", after, before);
}

/* A client of another protocol version is told which one devald speaks: this one's. */
static void test_other_protocol_version(void **state) {
        (void)state;
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", H.socket);
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_true(s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
        DvMsgHdr req = {DV_PROTO_VERSION + 7, DV_MSG_STATUS};
        assert_true(send(s, &req, sizeof(req), 0) == sizeof(req));
        DvReply rep;
        assert_true(recv(s, &rep, sizeof(rep), 0) == sizeof(rep));
        close(s);
        char want[64];
        snprintf(want, sizeof(want), "protocol version %d", DV_PROTO_VERSION);
        assert_int_equal(rep.status, DEVAL_EPROTO);
        if (!strstr(rep.msg, want))
                fail_msg("devald answered '%s', not naming %s", rep.msg, want);
}

static void test_hostile_client(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_hostile, NULL, 20), 0);
        assert_int_equal(harness_run(&H, 3, rank_hostile, (void *)"direct", 20), 0);
        assert_int_equal(harness_run(&H, 3, rank_hostile, (void *)"status", 20), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_rank_killed, before, after),
                cmocka_unit_test_setup_teardown(test_rank_exits, before, after),
                cmocka_unit_test_setup_teardown(test_rank_killed_socket_inherited, before, after),
                cmocka_unit_test_setup_teardown(test_daemon_killed, before, NULL),
                cmocka_unit_test_setup_teardown(test_daemon_sigterm, before, NULL),
                cmocka_unit_test_setup_teardown(test_timeout, before, after),
                cmocka_unit_test_setup_teardown(test_join_timeout, before, after),
                cmocka_unit_test_setup_teardown(test_mismatch, before, after),
                cmocka_unit_test_setup_teardown(test_other_protocol_version, before, after),
                cmocka_unit_test_setup_teardown(test_bad_arguments, before, after),
                cmocka_unit_test_setup_teardown(test_one_rank_bad_argument, before, after),
                cmocka_unit_test_setup_teardown(test_bad_joins, before, after),
                cmocka_unit_test_setup_teardown(test_daemon_survives, before, after),
                cmocka_unit_test_setup_teardown(test_quota, before, after),
                cmocka_unit_test_setup_teardown(test_hostile_client, before, after),
                cmocka_unit_test_setup_teardown(test_pass_counters_forged, before, after),
                cmocka_unit_test_setup_teardown(test_unexpected_fds, before, after),
                cmocka_unit_test_setup_teardown(test_hostile_full_speed, before, after),
                cmocka_unit_test_setup_teardown(test_hostile_mirror_records, before, after),
                cmocka_unit_test_setup_teardown(test_forked_child, before, after),
                cmocka_unit_test_setup_teardown(test_hangups_do_not_stall, before, after),
        };
        return cmocka_run_group_tests(tests, setup, NULL);
}
