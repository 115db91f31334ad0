/* SPDX-License-Identifier: MIT */
/*
 * test-equiv.c - the equivalence suite: every case of equiv-cases.c run through each executor
 * of a step, and each rank's lines (statuses, messages, digests of the results) compared with
 * those of the reference, devald's worker running every step. A difference fails the test and
 * is printed, the reference's line beside the executor's.
 *
 * The executors: devald (the reference; $DEVAL_RANK_STEPS=0 $DEVAL_MIRROR=0), the runner rank
 * ($DEVAL_MIRROR=0), the mirrored step (the default), every rank copying a share of each step
 * ($DEVAL_SHARE_MIN=0), inputs written straight into the result ($DEVAL_DIRECT_MIN=0), and a
 * group spanning two "nodes" of two ranks over the tests' engine (span-engine.c), and a device
 * group on devald's GPU path over the fake's two "GPUs" ($DEVAL_GPU_FAKE). The replay is in
 * every host executor: the cases' uneven passes replay what a rank missed.
 */
#define _GNU_SOURCE
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deval.h"

#include "equiv-cases.h"
#include "harness.h"
#include "span-engine.h"

typedef struct {
        const char *name;
        const char *env[3]; /* NAME=VALUE, set in each rank before it joins */
        bool span;
        bool device; /* a device group, on devald --backend cuda over the fake's 2 "GPUs" */
        /* cases whose failures this executor says in words of its own (statuses and results
         * are still compared), and cases it does not run; each with the reason in the table */
        const char *own_words[4], *skip[4];
} Executor;

static const Executor executors[] = {
        {"devald", {"DEVAL_RANK_STEPS=0", "DEVAL_MIRROR=0"}, false},
        {"runner", {"DEVAL_MIRROR=0"}, false},
        {"mirror", {NULL}, false},
        {"shared", {"DEVAL_SHARE_MIN=0", "DEVAL_DIRECT_MIN=18446744073709551615"}, false},
        {"direct", {"DEVAL_DIRECT_MIN=0"}, false},
        /* Across machines, each machine's devald counts its own group's bytes against the
         * quota: the parts' framing, and on a leader every node's parts, so the numbers a
         * quota failure gives are the machine's. A node that stalls is named by the engine,
         * which cannot see which of its ranks is late, and a node whose late rank comes within
         * the node group's grace finishes a step the other nodes already failed: that case is
         * a known difference (docs/architecture.md), not run here. */
        {"span", {NULL}, true, false, {"quota"}, {"rank-stalls"}},
        /* A device group keeps its results on GPUs, where a rank that ended its pass could
         * not keep them to replay: a pass over uneven loaders fails there, saying so, and a
         * pass with keys is refused. A quota failure names the device input it counted. */
        {"gpu",
         {NULL},
         false,
         true,
         {"quota"},
         {"sequence-uneven", "pass-parked", "pass-replay-differs", "pass-keys"}},
};

static bool listed(const char *const *list, const char *name) {
        for (int i = 0; i < 4 && list[i]; i++)
                if (strcmp(list[i], name) == 0)
                        return true;
        return false;
}

static char logdir[64];

typedef struct {
        const Executor *ex;
        const EqCase *c;
} Run;

static void log_path(char *buf, size_t len, const char *ex, const EqCase *c, int rank) {
        snprintf(buf, len, "%s/%s.%s.%d", logdir, ex, c->name, rank);
}

static int rank_case(const Harness *h, int rank, int world, void *arg) {
        const Run *run = arg;
        for (int i = 0; i < 3 && run->ex->env[i]; i++)
                putenv((char *)run->ex->env[i]);
        int timeout = run->c->timeout_ms ? run->c->timeout_ms : 20000;
        char name[64], full[80], path[256];
        snprintf(name, sizeof(name), "eq-%s", run->c->name);
        snprintf(full, sizeof(full), "%s-%d", name, (int)getppid()); /* as harness_join() */
        deval_group *g;
        int r;
        if (run->ex->device) {
                deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket,
                                     .timeout_ms = timeout, .on_device = 1, .device = rank % 2};
                r = deval_join(full, rank, world, &o, &g);
        } else if (run->ex->span) {
                Span sp = {
                        .layout = (const int[]){0, 0, 1, 1}, .timeout_ms = timeout, .name = name};
                r = span_join(h, &sp, rank, world, &g);
        } else {
                r = harness_join(h, name, rank, world, timeout, &g);
        }
        CHECK_OK(r, NULL);
        log_path(path, sizeof(path), run->ex->name, run->c, rank);
        EqLog l = {.f = fopen(path, "w"), .rank = rank, .world = world, .group = full};
        CHECK(l.f, "cannot write %s", path);
        run->c->run(g, &l);
        fclose(l.f);
        deval_leave(g);
        return 0;
}

/* Run every case through ex, on a devald of its own. */
static void run_all(const Executor *ex) {
        const char *extra[] = {"--max-group-bytes=4M", NULL, NULL, NULL};
        Harness h;
        if (ex->device) { /* devald and the ranks inherit the fake */
                setenv("DEVAL_GPU_FAKE", "2", 1);
                extra[1] = "--backend";
                extra[2] = "cuda";
        }
        harness_start(&h, extra);
        for (int i = 0; i < eq_ncases; i++) {
                if (listed(ex->skip, eq_cases[i].name))
                        continue;
                Run run = {ex, &eq_cases[i]};
                span_engine_reset();
                int failed = harness_run(&h, EQ_WORLD, rank_case, &run, 60);
                if (failed)
                        fail_msg("%s: case %s: %d ranks failed", ex->name, eq_cases[i].name,
                                 failed);
        }
        harness_stop(&h);
        unsetenv("DEVAL_GPU_FAKE");
}

static char *slurp(const char *path) {
        FILE *f = fopen(path, "r");
        if (!f)
                return strdup("");
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
                fwrite(chunk, 1, n, m);
        fclose(f);
        fclose(m);
        return buf;
}

/* The length of line (n bytes) up to its message, when words are the executor's own: a
 * failure's line is "N what: STATUS: message". */
static size_t up_to_message(const char *line, size_t n, bool own_words) {
        const char *p = own_words ? memmem(line, n, ": ", 2) : NULL;
        p = p ? memmem(p + 2, n - (size_t)(p + 2 - line), ": ", 2) : NULL;
        return p ? (size_t)(p - line) : n;
}

/* Print where ref and got first differ; the lines compared, in *lines. */
static bool same(const char *what, const char *ex, const char *ref, const char *got, bool own_words,
                 int *lines) {
        for (int line = 1;; line++) {
                size_t a = strcspn(ref, "\n"), b = strcspn(got, "\n");
                size_t ca = up_to_message(ref, a, own_words), cb = up_to_message(got, b, own_words);
                if (ca != cb || memcmp(ref, got, ca) != 0) {
                        fprintf(stderr, "%s, line %d:\n  devald: %.*s\n  %6s: %.*s\n", what, line,
                                (int)a, *ref ? ref : "(nothing)", ex, (int)b,
                                *got ? got : "(nothing)");
                        return false;
                }
                if (!ref[a])
                        return true;
                ref += a + 1;
                got += b + 1;
                ++*lines;
        }
}

static void compare(const Executor *ex) {
        int differ = 0, lines = 0;
        for (int i = 0; i < eq_ncases; i++)
                for (int r = 0; r < EQ_WORLD && !listed(ex->skip, eq_cases[i].name); r++) {
                        char pa[256], pb[256], what[96];
                        log_path(pa, sizeof(pa), "devald", &eq_cases[i], r);
                        log_path(pb, sizeof(pb), ex->name, &eq_cases[i], r);
                        char *a = slurp(pa), *b = slurp(pb);
                        snprintf(what, sizeof(what), "%s: case %s, rank %d", ex->name,
                                 eq_cases[i].name, r);
                        differ += !same(what, ex->name, a, b,
                                        listed(ex->own_words, eq_cases[i].name), &lines);
                        free(a);
                        free(b);
                }
        fprintf(stderr, "%s: %d cases x %d ranks, %d lines alike, %d logs differ\n", ex->name,
                eq_ncases, EQ_WORLD, lines, differ);
        assert_int_equal(differ, 0);
}

static int setup(void **state) {
        (void)state;
        snprintf(logdir, sizeof(logdir), "/tmp/deval-equiv-XXXXXX");
        if (!mkdtemp(logdir) || span_engine_setup() < 0)
                return -1;
        run_all(&executors[0]);
        return 0;
}

static int teardown(void **state) {
        (void)state;
        char cmd[128];
        if (!getenv("EQUIV_KEEP")) {
                snprintf(cmd, sizeof(cmd), "rm -rf %s", logdir);
                if (system(cmd) != 0)
                        return -1;
        } else {
                fprintf(stderr, "the logs are in %s\n", logdir);
        }
        return 0;
}

static void test_executor(void **state) {
        const Executor *ex = *state;
        run_all(ex);
        compare(ex);
}

/* The reference itself: every case ran to its end, and the failures it is made of failed. */
static void test_reference(void **state) {
        (void)state;
        for (int i = 0; i < eq_ncases; i++) {
                char p[256];
                log_path(p, sizeof(p), "devald", &eq_cases[i], 0);
                char *a = slurp(p);
                bool fails = strstr(a, ": DEVAL_E") || strstr(a, "rror") || strstr(a, ": E");
                if (strcmp(eq_cases[i].name, "sequence") != 0 &&
                    strcmp(eq_cases[i].name, "rank-stalls") != 0 && !fails)
                        fprintf(stderr, "case %s, rank 0: no failure\n%s", eq_cases[i].name, a);
                assert_true(*a);
                free(a);
        }
}

int main(void) {
#define EX(i) cmocka_unit_test_prestate(test_executor, (void *)&executors[i])
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_reference), EX(1), EX(2), EX(3), EX(4), EX(5), EX(6),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
