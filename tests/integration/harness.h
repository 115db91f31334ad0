/* SPDX-License-Identifier: MIT */
/*
 * harness.h - integration test support: a real devald on a socket in a temporary directory,
 * ranks as forked processes, and checks that report from inside a rank.
 *
 * A rank's function returns 0 on success; CHECK() prints where and why it failed and
 * returns 1 from it. The parent's cmocka test asserts every rank exited 0.
 */
#pragma once

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "deval.h"

typedef struct {
        char dir[64];
        char socket[100];
        pid_t daemon;
} Harness;

typedef int (*RankFn)(const Harness *h, int rank, int world, void *arg);

/* In a child forked by the test (pid parent): get sig when the test ends. */
void harness_die_with(pid_t parent, int sig);
/* Start devald (its path from $DEVALD) with extra arguments (NULL-terminated, may be NULL). */
void harness_start(Harness *h, const char *const *extra);
/* the same, waiting up to seconds for devald to listen (harness_start(): 5) */
void harness_start_within(Harness *h, const char *const *extra, int seconds);
/* SIGTERM devald; asserts it exits 0 within 5 s and removed its socket. */
void harness_stop(Harness *h);
/* Run fn on world forked ranks; returns how many failed (non-zero exit, signal, timeout). */
int harness_run(const Harness *h, int world, RankFn fn, void *arg, int timeout_s);
/* Join group (suffixed with the test's pid so runs never collide). */
int harness_join(const Harness *h, const char *group, int rank, int world, int timeout_ms,
                 deval_group **g);
/* Run deval-ctl (from $DEVAL_CTL) and return its output in buf; its exit status. */
int harness_ctl(const Harness *h, const char *args, char *buf, size_t len);
double harness_now(void);

#define CHECK(cond, ...)                                                                        \
        do {                                                                                    \
                if (!(cond)) {                                                                  \
                        fprintf(stderr, "rank check failed at %s:%d: %s: ", __FILE__, __LINE__, \
                                #cond);                                                         \
                        fprintf(stderr, __VA_ARGS__);                                           \
                        fprintf(stderr, "\n");                                                  \
                        return 1;                                                               \
                }                                                                               \
        } while (0)

#define CHECK_OK(call, g)                                                                   \
        do {                                                                                \
                int _r = (call);                                                            \
                CHECK(_r == 0, "%s -> %s: %s", #call, deval_strerror(_r), deval_errmsg(g)); \
        } while (0)
