/* SPDX-License-Identifier: MIT */
/*
 * test-users.c - devald shared by users: a group belongs to the uid that made it (root may
 * watch and abort it, not join it), and each uid is held to its quotas, checked before
 * anything is allocated: bytes across its groups, groups, ranks per group, connections.
 * Idle groups expire. Runs as root (CI does) and plays two unprivileged uids through
 * setresuid() in the forked ranks; as another user it skips.
 */
#define _GNU_SOURCE
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "wire.h"

static Harness H;

enum {
        ALICE = 61001,
        BOB = 61002,
        USER_CONNS = 64,
        USER_GROUPS = 3,
        MAX_WORLD = 16,
        IDLE_S = 2
};
#define USER_BYTES (32ull << 20)

typedef struct {
        int stage; /* the owner's progress, for the others to wait on */
        pid_t owner_pid;
} Shared;
static Shared *S;

static int become(uid_t uid) {
        return setgroups(0, NULL) == 0 && setresgid(uid, uid, uid) == 0 &&
                               setresuid(uid, uid, uid) == 0
                       ? 0
                       : -1;
}

static int join(const Harness *h, const char *name, int rank, int world, deval_group **g) {
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket, .timeout_ms = 10000};
        return deval_join(name, rank, world, &o, g);
}

static int gather_bytes(deval_group *g, size_t bytes) {
        uint8_t *x = calloc(1, bytes ? bytes : 1);
        deval_tensor in = {.data = x,
                           .dtype = DEVAL_U8,
                           .ndim = 1,
                           .shape = {(int64_t)bytes},
                           .device = -1},
                     out;
        int r = deval_gather(g, 1, &in, NULL, &out);
        free(x);
        return r;
}

static void wait_stage(int stage) {
        for (int i = 0; i < 2000 && S->stage < stage; i++)
                usleep(5000);
}

/*
 * rank 0 and 1: alice's group. rank 2: bob, who may not join it. rank 3: root, who may not
 * either, but sees it with deval-ctl and aborts it.
 */
static int rank_owners(const Harness *h, int rank, int world, void *arg) {
        (void)world;
        const char *name = arg;
        deval_group *g;
        if (rank < 2) {
                CHECK(become(ALICE) == 0, "setresuid");
                CHECK_OK(join(h, name, rank, 2, &g), NULL);
                CHECK_OK(deval_barrier(g), g);
                if (rank == 0)
                        S->stage = 1;
                int r = 0;
                for (int i = 0; i < 1000000 && r == 0; i++)
                        r = deval_barrier(g);
                CHECK(r == DEVAL_EABORTED && strstr(deval_errmsg(g), "aborted by uid 0"),
                      "alice got %s: %s", deval_strerror(r), deval_errmsg(g));
                deval_leave(g);
                return 0;
        }
        wait_stage(1);
        if (rank == 2) {
                CHECK(become(BOB) == 0, "setresuid");
                int r = join(h, name, 0, 2, &g);
                CHECK(r == DEVAL_EPERM && strstr(deval_errmsg(NULL), "belongs to uid 61001"),
                      "bob got %s: %s", deval_strerror(r), deval_errmsg(NULL));
                S->stage = 2;
                return 0;
        }
        wait_stage(2);
        int r = join(h, name, 1, 2, &g); /* root: not a member of anyone else's group */
        CHECK(r == DEVAL_EPERM && strstr(deval_errmsg(NULL), "belongs to uid 61001"),
              "root got %s: %s", deval_strerror(r), deval_errmsg(NULL));
        char args[128], out[4096];
        snprintf(args, sizeof(args), "group %s", name);
        CHECK(harness_ctl(h, args, out, sizeof(out)) == 0 && strstr(out, "uid 61001"),
              "root may look: %s", out);
        snprintf(args, sizeof(args), "abort %s", name);
        CHECK(harness_ctl(h, args, out, sizeof(out)) == 0, "root may abort: %s", out);
        return 0;
}

static void test_groups_belong_to_their_uid(void **state) {
        (void)state;
        char name[64];
        snprintf(name, sizeof(name), "alice-%d", (int)getpid());
        S->stage = 0;
        assert_int_equal(harness_run(&H, 4, rank_owners, name, 30), 0);
}

/* alice against each quota in turn; bob, meanwhile, is not affected. */
static int rank_quotas(const Harness *h, int rank, int world, void *arg) {
        (void)world;
        const char *base = arg;
        char name[80];
        deval_group *g[USER_GROUPS + 1] = {0}, *extra;
        if (rank == 1) { /* bob, once alice is at her limits */
                CHECK(become(BOB) == 0, "setresuid");
                wait_stage(1);
                snprintf(name, sizeof(name), "%s-bob", base);
                CHECK_OK(join(h, name, 0, 1, &g[0]), NULL);
                CHECK_OK(gather_bytes(g[0], 8u << 20), g[0]);
                deval_leave(g[0]);
                S->stage = 2;
                return 0;
        }
        CHECK(become(ALICE) == 0, "setresuid");
        for (int i = 0; i < USER_GROUPS; i++) {
                snprintf(name, sizeof(name), "%s-%d", base, i);
                CHECK_OK(join(h, name, 0, 1, &g[i]), NULL);
        }
        /* groups */
        snprintf(name, sizeof(name), "%s-more", base);
        int r = join(h, name, 0, 1, &extra);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(NULL), "--max-user-groups"),
              "a 4th group: %s: %s", deval_strerror(r), deval_errmsg(NULL));
        /* ranks per group */
        deval_leave(g[2]);
        g[2] = NULL;
        r = join(h, name, 0, MAX_WORLD + 1, &extra);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(NULL), "--max-world"), "world %d: %s: %s",
              MAX_WORLD + 1, deval_strerror(r), deval_errmsg(NULL));
        /* 1 TiB: refused before anything is allocated, and the group goes on */
        void *p;
        r = deval_input_buffer(g[0], (size_t)1 << 40, &p);
        CHECK(r == DEVAL_ENOMEM, "1 TiB: %s: %s", deval_strerror(r), deval_errmsg(g[0]));
        CHECK_OK(gather_bytes(g[0], 1000), g[0]);
        /* bytes across groups (inputs and results): 10 MiB fit in one, not 10 more in another */
        CHECK_OK(gather_bytes(g[0], 10u << 20), g[0]);
        r = gather_bytes(g[1], 10u << 20);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(g[1]), "--max-user-bytes") &&
                      strstr(deval_errmsg(g[1]), "uid 61001"),
              "10 MiB more in a second group: %s: %s", deval_strerror(r), deval_errmsg(g[1]));
        CHECK_OK(gather_bytes(g[1], 1000), g[1]); /* a failed step, not a failed group */
        S->stage = 1;
        wait_stage(2);
        /* leaving gives the bytes back */
        deval_leave(g[0]);
        CHECK_OK(gather_bytes(g[1], 10u << 20), g[1]);
        deval_leave(g[1]);
        return 0;
}

static void test_user_quotas(void **state) {
        (void)state;
        char name[64];
        snprintf(name, sizeof(name), "quota-%d", (int)getpid());
        S->stage = 0;
        assert_int_equal(harness_run(&H, 2, rank_quotas, name, 60), 0);
}

static int raw_connect(const char *path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                close(fd);
                return -1;
        }
        return fd;
}

/* 1000 connections from one uid: the first USER_CONNS stay, the rest are refused. */
static int rank_flood(const Harness *h, int rank, int world, void *arg) {
        (void)world;
        const char *base = arg;
        char name[80];
        deval_group *g;
        if (rank == 1) { /* bob joins and gathers while alice floods */
                CHECK(become(BOB) == 0, "setresuid");
                wait_stage(1);
                snprintf(name, sizeof(name), "%s-bob", base);
                CHECK_OK(join(h, name, 0, 1, &g), NULL);
                for (int i = 0; i < 100; i++)
                        CHECK_OK(gather_bytes(g, 4096), g);
                deval_leave(g);
                S->stage = 2;
                return 0;
        }
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        CHECK(become(ALICE) == 0, "setresuid");
        static int fds[1000];
        for (int i = 0; i < 1000; i++)
                CHECK((fds[i] = raw_connect(h->socket)) >= 0, "connect %d: %s", i, strerror(errno));
        S->stage = 1;
        /* a refused connection carries devald's answer, then the hang-up */
        int refused = 0, open = 0;
        usleep(500000); /* devald accepted them all by now */
        for (int i = 0; i < 1000; i++) {
                struct pollfd p = {.fd = fds[i], .events = POLLIN};
                if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP))) {
                        DvReply rep;
                        ssize_t n = recv(fds[i], &rep, sizeof(rep), 0);
                        CHECK(n == (ssize_t)sizeof(rep) && rep.status == DEVAL_ENOMEM &&
                                      strstr(rep.msg, "--max-user-conns"),
                              "connection %d: %zd bytes, status %d", i, n, rep.status);
                        refused++;
                } else {
                        open++;
                }
        }
        CHECK(open == USER_CONNS && refused == 1000 - USER_CONNS, "%d open, %d refused", open,
              refused);
        int r = join(h, base, 0, 1, &g);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(NULL), "--max-user-conns"),
              "a join past the limit: %s: %s", deval_strerror(r), deval_errmsg(NULL));
        wait_stage(2);
        for (int i = 0; i < 1000; i++)
                close(fds[i]);
        usleep(100000); /* devald sees the hang-ups */
        CHECK_OK(join(h, base, 0, 1, &g), NULL);
        CHECK_OK(gather_bytes(g, 4096), g);
        deval_leave(g);
        return 0;
}

static void test_connection_flood(void **state) {
        (void)state;
        char name[64];
        snprintf(name, sizeof(name), "flood-%d", (int)getpid());
        S->stage = 0;
        assert_int_equal(harness_run(&H, 2, rank_flood, name, 60), 0);
}

/*
 * Descriptors devald holds for a uid: 2 a connection, 3 a host group (control, completion,
 * output). With --max-user-fds 20, ten connections are all a uid gets, and a group needs
 * room for its three.
 */
static int setup(void **state);
static int teardown(void **state);

static int rank_fds(const Harness *h, int rank, int world, void *arg) {
        (void)rank;
        (void)world;
        const char *name = arg;
        CHECK(become(ALICE) == 0, "setresuid");
        int fds[10];
        for (int i = 0; i < 10; i++)
                CHECK((fds[i] = raw_connect(h->socket)) >= 0, "connect %d", i);
        usleep(200000);
        int extra = raw_connect(h->socket);
        CHECK(extra >= 0, "connect");
        DvReply rep;
        struct pollfd p = {.fd = extra, .events = POLLIN};
        CHECK(poll(&p, 1, 2000) == 1 && recv(extra, &rep, sizeof(rep), 0) == sizeof(rep) &&
                      rep.status == DEVAL_ENOMEM && strstr(rep.msg, "--max-user-fds"),
              "the 11th connection was not refused for its descriptors");
        close(extra);
        close(fds[9]);
        usleep(200000); /* 18 held: a join's connection fits, its group's 3 do not */
        deval_group *g;
        int r = join(h, name, 0, 1, &g);
        CHECK(r == DEVAL_ENOMEM && strstr(deval_errmsg(NULL), "--max-user-fds"), "got %s: %s",
              deval_strerror(r), deval_errmsg(NULL));
        for (int i = 0; i < 9; i++)
                close(fds[i]);
        usleep(200000);
        CHECK_OK(join(h, name, 0, 1, &g), NULL);
        CHECK_OK(gather_bytes(g, 100), g);
        deval_leave(g);
        return 0;
}

static void test_fd_quota(void **state) {
        char name[64];
        snprintf(name, sizeof(name), "fds-%d", (int)getpid());
        harness_stop(&H);
        const char *extra[] = {"--max-user-fds", "20", NULL};
        harness_start(&H, extra);
        chmod(H.dir, 0755);
        int failed = harness_run(&H, 1, rank_fds, name, 30);
        teardown(state);
        setup(state);
        assert_int_equal(failed, 0);
}

/* A group left idle expires; so does one that never forms. */
static int rank_idle(const Harness *h, int rank, int world, void *arg) {
        const char *base = arg;
        char name[80];
        deval_group *g;
        CHECK(become(ALICE) == 0, "setresuid");
        if (rank == 2) {
                snprintf(name, sizeof(name), "%s-lonely", base);
                deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket,
                                     .timeout_ms = -1};
                double t0 = harness_now();
                int r = deval_join(name, 0, 2, &o, &g);
                double dt = harness_now() - t0;
                CHECK(r == DEVAL_ETIMEDOUT && dt > IDLE_S - 0.5 && dt < IDLE_S + 1.5,
                      "a group that never forms: %s after %.2f s: %s", deval_strerror(r), dt,
                      deval_errmsg(NULL));
                return 0;
        }
        CHECK_OK(join(h, base, rank, 2, &g), NULL);
        CHECK_OK(gather_bytes(g, 100), g);
        usleep((IDLE_S + 1) * 1000000);
        int r = gather_bytes(g, 100);
        CHECK(r == DEVAL_ETIMEDOUT && strstr(deval_errmsg(g), "idle"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        (void)world;
        return 0;
}

static void test_idle_groups_expire(void **state) {
        (void)state;
        char name[64];
        snprintf(name, sizeof(name), "idle-%d", (int)getpid());
        assert_int_equal(harness_run(&H, 3, rank_idle, name, 30), 0);
}

static int setup(void **state) {
        (void)state;
        if (getuid() != 0) {
                fprintf(stderr, "not root: cannot play other users; skipped\n");
                return -1;
        }
        S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(S != MAP_FAILED);
        char conns[16], groups[16], world[16], idle[16];
        snprintf(conns, sizeof(conns), "%d", USER_CONNS);
        snprintf(groups, sizeof(groups), "%d", USER_GROUPS);
        snprintf(world, sizeof(world), "%d", MAX_WORLD);
        snprintf(idle, sizeof(idle), "%d", IDLE_S);
        const char *extra[] = {"--max-user-conns",
                               conns,
                               "--max-user-groups",
                               groups,
                               "--max-user-bytes",
                               "32M",
                               "--max-world",
                               world,
                               "--idle-timeout",
                               idle,
                               NULL};
        harness_start(&H, extra);
        chmod(H.dir, 0755); /* the other uids reach the socket */
        return 0;
}

static int teardown(void **state) {
        (void)state;
        harness_stop(&H);
        return 0;
}

int main(void) {
        if (getuid() != 0) {
                fprintf(stderr, "not root: cannot play other users; skipped\n");
                return 77;
        }
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_groups_belong_to_their_uid),
                cmocka_unit_test(test_user_quotas),
                cmocka_unit_test(test_connection_flood),
                cmocka_unit_test(test_fd_quota),
                cmocka_unit_test(test_idle_groups_expire),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
