/* SPDX-License-Identifier: MIT */
/*
 * load.h - a competing load for the benches: N processes that keep a core busy each, as
 * other jobs on a shared machine do, for the run of a bench (--load N). Header-only: the
 * benches are single files, deval-mpi-bench built by mpicc apart from the rest.
 */
#pragma once

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOAD_MAX 64

static pid_t load_pids[LOAD_MAX];
static int load_n;

/* Start n spinning processes (at most LOAD_MAX); they end with load_stop() or this process. */
static inline void load_start(int n) {
        pid_t parent = getpid();
        for (load_n = 0; load_n < n && load_n < LOAD_MAX; load_n++) {
                pid_t p = fork();
                if (p == 0) {
                        prctl(PR_SET_PDEATHSIG, SIGKILL);
                        if (getppid() != parent)
                                _exit(0);
                        for (volatile unsigned long i = 0;; i++) {
                        }
                }
                if (p < 0) {
                        perror("load: fork");
                        break;
                }
                load_pids[load_n] = p;
        }
}

static inline void load_stop(void) {
        for (int i = 0; i < load_n; i++) {
                kill(load_pids[i], SIGKILL);
                waitpid(load_pids[i], NULL, 0);
        }
        load_n = 0;
}
