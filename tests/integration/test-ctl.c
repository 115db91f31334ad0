/* SPDX-License-Identifier: MIT */
/*
 * test-ctl.c - deval-ctl status against a real devald while a group is running: the table
 * and the JSON name the group with its world size, ranks, collectives and bytes moved, and
 * how far its eval pass has come (deval_eval_progress() on a rank says the same); and
 * the tool's exit statuses for an unreachable devald and for usage errors.
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

#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static Harness H;
static volatile int *phase; /* shared: 1 once the ranks are mid-run, 2 when checked */

static int setup(void **state) {
        (void)state;
        phase = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        harness_start(&H, NULL);
        return 0;
}

static int teardown(void **state) {
        (void)state;
        harness_stop(&H);
        return 0;
}

/*
 * deval-ctl ARGS as uid 65534; its exit status. The binary is copied next to the socket first:
 * the build tree may sit under a directory that uid cannot enter (a fresh clone in a
 * mktemp -d directory, say).
 */
static int ctl_as_nobody(const Harness *h, const char *args) {
        char copy[256], cmd[2048];
        snprintf(copy, sizeof(copy), "%s/deval-ctl", h->dir);
        snprintf(cmd, sizeof(cmd), "cp %s %s && chmod 0755 %s", getenv("DEVAL_CTL"), copy, copy);
        if (system(cmd) != 0)
                return -2;
        pid_t p = fork();
        if (p == 0) {
                /* status: exit 77 when it lists no group at all, as another uid should see */
                snprintf(cmd, sizeof(cmd),
                         "out=$(%s --socket %s %s 2>&1); rc=$?; "
                         "case \"$out\" in *'\"total_groups\":0'*) exit 77;; esac; exit $rc",
                         copy, h->socket, args);
                if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
                    setresuid(65534, 65534, 65534) < 0)
                        _exit(99);
                execl("/bin/sh", "sh", "-c", cmd, NULL);
                _exit(98);
        }
        int st;
        waitpid(p, &st, 0);
        unlink(copy);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int rank_busy(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "ctl", rank, world, 10000, &g), NULL);
        for (int i = 0; i < 5; i++)
                CHECK_OK(deval_barrier(g), g);
        int64_t x[100] = {0};
        deval_tensor t = {.data = x, .dtype = DEVAL_I64, .ndim = 1, .shape = {100}, .device = -1},
                     out;
        CHECK_OK(deval_gather(g, 1, &t, NULL, &out), g); /* 3 x 800 bytes moved */
        if (rank == 0) {
                char buf[8192], want[128];
                CHECK(harness_ctl(h, "status", buf, sizeof(buf)) == 0, "status: %s", buf);
                snprintf(want, sizeof(want), "ctl-%d", (int)getppid());
                CHECK(strstr(buf, want) && strstr(buf, "active") && strstr(buf, "backend host"),
                      "table:\n%s", buf);
                CHECK(harness_ctl(h, "--json=short status", buf, sizeof(buf)) == 0, "json");
                snprintf(want, sizeof(want),
                         "{\"name\":\"ctl-%d\",\"uid\":%u,\"state\":\"active\",\"world_size\":3,"
                         "\"joined\":3,\"collectives\":6,\"bytes_moved\":2400,",
                         (int)getppid(), (unsigned)getuid());
                CHECK(strstr(buf, want), "json lacks\n%s\nin\n%s", want, buf);
                CHECK(strstr(buf, "\"total_groups\":1") && strstr(buf, "\"backend\":\"host\""),
                      "json: %s", buf);
                *phase = 2;
        }
        while (*phase != 2)
                usleep(1000);
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static int rank_inspected(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        char name[64];
        snprintf(name, sizeof(name), "inspect-%d", (int)getppid());
        CHECK_OK(harness_join(h, "inspect", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                char buf[8192], args[128], want[64];
                snprintf(args, sizeof(args), "group %s", name);
                usleep(200000); /* the others are waiting in collective #2 by now */
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "group: %s", buf);
                CHECK(strstr(buf, "waiting for collective #2") && strstr(buf, "RANK") &&
                              strstr(buf, "no (last #1)"),
                      "table:\n%s", buf);
                snprintf(args, sizeof(args), "--json=short group %s", name);
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "json: %s", buf);
                snprintf(want, sizeof(want), "{\"rank\":0,\"pid\":%d,\"state\":\"joined\"",
                         (int)getpid());
                CHECK(strstr(buf, want) && strstr(buf, "\"waiting_for\":2") &&
                              strstr(buf, "\"arrived\":true"),
                      "json lacks %s:\n%s", want, buf);
                /* someone else's group is not theirs to see or abort */
                chmod(h->dir, 0755);
                chmod(h->socket, 0777);
                /* nor to list: another uid's status shows no group of ours */
                int st = ctl_as_nobody(h, "--json=short status");
                CHECK(st == 77, "nobody's status (exit status %d)", st);
                snprintf(args, sizeof(args), "group %s", name);
                st = ctl_as_nobody(h, args);
                CHECK(st == 1, "nobody may not look (exit status %d)", st);
                snprintf(args, sizeof(args), "abort %s", name);
                st = ctl_as_nobody(h, args);
                CHECK(st == 1, "nobody may not abort (exit status %d)", st);
                CHECK(harness_ctl(h, "group no-such-group", buf, sizeof(buf)) == 1, "unknown");
                /* the owner may: every rank's collective fails with DEVAL_EABORTED */
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "abort: %s", buf);
        }
        int r = deval_barrier(g);
        CHECK(r == DEVAL_EABORTED && strstr(deval_errmsg(g), "aborted by uid 0"), "got %s: %s",
              deval_strerror(r), deval_errmsg(g));
        deval_leave(g);
        return 0;
}

static void test_group_details_and_abort(void **state) {
        (void)state;
        if (getuid() != 0)
                skip(); /* needs root to act as another user */
        assert_int_equal(harness_run(&H, 3, rank_inspected, NULL, 20), 0);
}

/* Rank 2 comes 60 ms late to each of 5 barriers: group shows it as the straggler. */
static int rank_straggles(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        char name[64], args[128], buf[8192];
        snprintf(name, sizeof(name), "straggle-%d", (int)getppid());
        CHECK_OK(harness_join(h, "straggle", rank, world, 10000, &g), NULL);
        for (int i = 0; i < 5; i++) {
                if (rank == 2)
                        usleep(60000);
                CHECK_OK(deval_barrier(g), g);
        }
        if (rank == 0) {
                snprintf(args, sizeof(args), "--json=short group %s", name);
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "json: %s", buf);
                CHECK(strstr(buf, "\"latency_n\":5"), "latency over 5: %s", buf);
                /* rank 2 last at every barrier, 60 ms or so behind */
                char *r2 = strstr(buf, "{\"rank\":2,");
                CHECK(r2 && strstr(r2, "\"times_last\":5,"), "rank 2 not last 5 times: %s", buf);
                unsigned long late = strtoul(strstr(r2, "\"late_us\":") + 10, NULL, 10);
                CHECK(late >= 50000 && late < 1000000, "rank 2 late by %lu us", late);
                snprintf(args, sizeof(args), "group %s", name);
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "table: %s", buf);
                CHECK(strstr(buf, "p50 ") && strstr(buf, "LATE(avg)"), "table: %s", buf);
        }
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_straggler_view(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_straggles, NULL, 20), 0);
}

/* One batch of the pass: rows samples of this rank, gathered for metrics. */
static int pass_batch(deval_group *g, int64_t rows) {
        int64_t x[4] = {0};
        deval_tensor t = {.data = x, .dtype = DEVAL_I64, .ndim = 1, .shape = {rows}, .device = -1},
                     out;
        int r = deval_eval_batch(g);
        return r < 0 ? r : deval_gather_for_metrics(g, 1, &t, NULL, &out);
}

/* deval-ctl --json=short group NAME has want, else say what it has */
#define CTL_HAS(h, name, want)                                                  \
        do {                                                                    \
                char _a[128], _b[8192];                                         \
                snprintf(_a, sizeof(_a), "--json=short group %s", name);        \
                CHECK(harness_ctl(h, _a, _b, sizeof(_b)) == 0, "json: %s", _b); \
                CHECK(strstr(_b, want), "json lacks\n%s\nin\n%s", want, _b);    \
        } while (0)

/*
 * A pass of 30 samples, 4 a batch: ranks 0 and 1 read 12 (3 batches), rank 2 reads 6 (2). What
 * deval-ctl shows of it, and what deval_eval_progress() says on a rank, at each step.
 */
static int rank_in_pass(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        char name[64], want[256];
        int64_t done = -1, total = -1;
        snprintf(name, sizeof(name), "progress-%d", (int)getppid());
        CHECK_OK(harness_join(h, "progress", rank, world, 10000, &g), NULL);
        CHECK(deval_eval_progress(g, &done, &total) == 0, "no pass is open yet");
        CHECK_OK(deval_eval_begin(g, 30, DEVAL_ORDER_RANK), g);
        CHECK_OK(pass_batch(g, 4), g);
        if (rank != 0) /* ranks 1 and 2 start their second batch after rank 0 looked */
                while (*phase != 1)
                        usleep(1000);
        CHECK_OK(deval_eval_batch(g), g);
        if (rank == 0) {
                usleep(100000);
                /* 12 gathered; rank 0 is in its second batch, the others still in their first */
                CHECK(deval_eval_progress(g, &done, &total) == 1 && done == 12 && total == 30,
                      "progress %lld of %lld", (long long)done, (long long)total);
                CTL_HAS(h, name, "\"pass\":{\"samples\":12,\"total\":30,");
                CTL_HAS(h, name,
                        "\"batches_min\":1,\"batches_max\":2,\"lag_rank\":1,"
                        "\"lag_batches\":1,\"ended\":0}");
                snprintf(want, sizeof(want),
                         "\"pass_state\":\"in\",\"pass_batches\":2,\"pass_samples\":4}");
                CTL_HAS(h, name, want);
                *phase = 1;
        }
        int64_t x[4] = {0};
        deval_tensor t = {.data = x,
                          .dtype = DEVAL_I64,
                          .ndim = 1,
                          .shape = {rank == 2 ? 2 : 4},
                          .device = -1},
                     out;
        CHECK_OK(deval_gather_for_metrics(g, 1, &t, NULL, &out), g);
        CHECK(deval_eval_progress(g, &done, &total) == 1 && done == 22, "progress %lld",
              (long long)done);
        /* rank 2's loader ran out: devald answers for it from here on */
        if (rank != 2)
                CHECK_OK(pass_batch(g, 4), g);
        if (rank == 0) {
                char args[128], buf[8192];
                CHECK(deval_eval_progress(g, &done, &total) == 1 && done == 30, "progress %lld",
                      (long long)done);
                CTL_HAS(h, name, "\"pass\":{\"samples\":30,\"total\":30,");
                CTL_HAS(h, name,
                        "\"batches_min\":3,\"batches_max\":3,\"lag_rank\":-1,"
                        "\"lag_batches\":0,\"ended\":1}");
                CTL_HAS(h, name, "\"pass_state\":\"ended\",\"pass_batches\":2,\"pass_samples\":6}");
                snprintf(args, sizeof(args), "group %s", name);
                CHECK(harness_ctl(h, args, buf, sizeof(buf)) == 0, "table: %s", buf);
                snprintf(want, sizeof(want), "eval pass of '%s': 30 of 30 samples (100.0%%)", name);
                CHECK(strstr(buf, want) && strstr(buf, "batches 3 a rank, 1 ended") &&
                              strstr(buf, "BATCHES"),
                      "table:\n%s", buf);
                CHECK(harness_ctl(h, "status", buf, sizeof(buf)) == 0 && strstr(buf, want),
                      "status:\n%s", buf);
        }
        if (rank != 2)
                CHECK_OK(deval_barrier(g), g); /* (answered for rank 2) */
        CHECK_OK(deval_eval_complete(g), g);
        CHECK(deval_eval_progress(g, &done, &total) == 0, "the pass closed");
        if (rank == 0)
                CTL_HAS(h, name, "\"pass\":null");
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_pass_progress(void **state) {
        (void)state;
        *phase = 0;
        assert_int_equal(harness_run(&H, 3, rank_in_pass, NULL, 30), 0);
}

static void test_status_of_a_running_group(void **state) {
        (void)state;
        assert_int_equal(harness_run(&H, 3, rank_busy, NULL, 20), 0);
}

/* deval-ctl topo: what hwloc sees here, which has cores and at least one NUMA node. */
static void test_topology(void **state) {
        (void)state;
        char buf[8192];
        assert_int_equal(harness_ctl(&H, "--json=short topo", buf, sizeof(buf)), 0);
        assert_non_null(strstr(buf, "\"hwloc\":true"));
        assert_non_null(strstr(buf, "\"numa_nodes\":[{\"os_index\":"));
        assert_null(strstr(buf, "\"cores\":0,"));
        assert_non_null(strstr(buf, "\"gpus\":[]")); /* the host backend here */
        assert_int_equal(harness_ctl(&H, "topo", buf, sizeof(buf)), 0);
        assert_non_null(strstr(buf, "NUMA node"));
}

static int run(const char *cmd) {
        char full[512];
        snprintf(full, sizeof(full), "%s %s >/dev/null 2>&1", getenv("DEVAL_CTL"), cmd);
        int st = system(full);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_exit_statuses(void **state) {
        (void)state;
        assert_int_equal(run("--socket /nonexistent/devald.sock status"), 3);
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "--socket %s group no-such-group", H.socket);
        assert_int_equal(run(cmd), 1);
        snprintf(cmd, sizeof(cmd), "--socket %s groups", H.socket);
        assert_int_equal(run(cmd), 0);
        snprintf(cmd, sizeof(cmd), "--socket %s --count 2 --interval 0.05 watch", H.socket);
        assert_int_equal(run(cmd), 0);
        assert_int_equal(run("--count 0 watch"), 2);
        assert_int_equal(run("watch a b"), 2);
        assert_int_equal(run("status --json=fancy"), 2);
        assert_int_equal(run("frobnicate"), 2);
        assert_int_equal(run("group"), 2);
        assert_int_equal(run("abort a b"), 2);
        assert_int_equal(run(""), 2);
        assert_int_equal(run("--help"), 0);
        assert_int_equal(run("--version"), 0);
}

/*
 * devald --config FILE: the file's options, the command line's winning; SIGHUP reads the
 * file again and takes the new quota; a file with an error changes nothing.
 */
static uint64_t quota_now(void) {
        char out[4096];
        assert_int_equal(harness_ctl(&H, "--json=short status", out, sizeof(out)), 0);
        const char *q = strstr(out, "\"max_group_bytes\":");
        assert_non_null(q);
        return strtoull(q + strlen("\"max_group_bytes\":"), NULL, 10);
}

static void write_config(const char *path, const char *text) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

static void test_config_and_reload(void **state) {
        (void)state;
        char path[] = "/tmp/deval-conf-XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        write_config(path, "# quotas\nmax-group-bytes = 64M\n\nmax-world=8\nlog-level = warn\n");
        harness_stop(&H);
        const char *extra[] = {"--config", path, "--max-world", "4", NULL};
        harness_start(&H, extra);
        assert_int_equal(quota_now(), 64ull << 20);
        /* the command line's --max-world 4 wins over the file's 8 */
        deval_group *g;
        assert_int_equal(harness_join(&H, "big", 0, 5, 1000, &g), DEVAL_ENOMEM);
        assert_non_null(strstr(deval_errmsg(NULL), "limit of 4 ranks"));
        write_config(path, "max-group-bytes = 128M\n");
        kill(H.daemon, SIGHUP);
        for (int i = 0; i < 100 && quota_now() != 128ull << 20; i++)
                usleep(10000);
        assert_int_equal(quota_now(), 128ull << 20);
        write_config(path, "max-group-bytes = 256M\nno such option = 1\n");
        kill(H.daemon, SIGHUP);
        usleep(200000);
        assert_int_equal(quota_now(), 128ull << 20);
        harness_stop(&H);
        unlink(path);
        harness_start(&H, NULL);
}

/*
 * Placement: the group's worker thread is bound to the cores of the NUMA node its ranks run
 * on, and each rank's input arena prefers the rank's node, as deval-ctl group says and as
 * /proc shows for devald's own thread and mappings.
 */
static int rank_placed(const Harness *h, int rank, int world, void *arg) {
        (void)arg;
        deval_group *g;
        CHECK_OK(harness_join(h, "placed", rank, world, 10000, &g), NULL);
        CHECK_OK(deval_barrier(g), g);
        if (rank == 0) {
                char args[128], out[8192], name[64];
                snprintf(name, sizeof(name), "placed-%d", (int)getppid());
                snprintf(args, sizeof(args), "--json=short group %s", name);
                CHECK(harness_ctl(h, args, out, sizeof(out)) == 0, "%s", out);
                const char *t = strstr(out, "\"worker_tid\":"), *n = strstr(out, "\"numa\":");
                const char *c = strstr(out, "\"worker_cpus\":\"");
                CHECK(t && n && c, "no placement in %s", out);
                int tid = atoi(t + strlen("\"worker_tid\":")), node = atoi(n + strlen("\"numa\":"));
                char cpus[64] = "";
                sscanf(c + strlen("\"worker_cpus\":\""), "%63[^\"]", cpus);
                CHECK(tid > 0 && node >= 0 && cpus[0], "placement: tid %d node %d cpus '%s'", tid,
                      node, cpus);
                /* devald's worker thread runs where it says */
                char path[128], line[512], allowed[128] = "";
                snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)h->daemon, tid);
                FILE *f = fopen(path, "r");
                CHECK(f, "%s", path);
                while (fgets(line, sizeof(line), f))
                        if (sscanf(line, "Cpus_allowed_list: %127s", allowed) == 1)
                                break;
                fclose(f);
                CHECK(strcmp(allowed, cpus) == 0, "worker allowed on %s, said %s", allowed, cpus);
                /* and every rank's input arena prefers its node */
                snprintf(path, sizeof(path), "/proc/%d/numa_maps", (int)h->daemon);
                f = fopen(path, "r");
                CHECK(f, "%s", path);
                char want[32], arena[96];
                snprintf(want, sizeof(want), "prefer:%d", node);
                snprintf(arena, sizeof(arena), "deval-in-%s-", name);
                int inputs = 0, preferred = 0;
                while (fgets(line, sizeof(line), f))
                        if (strstr(line, arena)) {
                                inputs++;
                                preferred += strstr(line, want) != NULL;
                        }
                fclose(f);
                CHECK(inputs == world && preferred == world, "%d inputs, %d prefer node %d", inputs,
                      preferred, node);
        }
        CHECK_OK(deval_barrier(g), g);
        deval_leave(g);
        return 0;
}

static void test_placement(void **state) {
        (void)state;
#ifndef DEVAL_HAVE_HWLOC
        skip(); /* built without hwloc: nothing is placed */
#endif
        assert_int_equal(harness_run(&H, 3, rank_placed, NULL, 30), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_status_of_a_running_group),
                cmocka_unit_test(test_exit_statuses),
                cmocka_unit_test(test_group_details_and_abort),
                cmocka_unit_test(test_topology),
                cmocka_unit_test(test_straggler_view),
                cmocka_unit_test(test_pass_progress),
                cmocka_unit_test(test_config_and_reload),
                cmocka_unit_test(test_placement),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
