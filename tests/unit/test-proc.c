/* SPDX-License-Identifier: MIT */
/*
 * test-proc.c - devald's reading of /proc (daemon/proc.c) on real processes: a running
 * child, a stopped one, zombies that exited or were killed, one gone without a trace, and a
 * command name built to fool a parser (spaces and parentheses in it).
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"

/* A child that sleeps (after naming itself name, if given) until killed. */
static pid_t child(const char *name) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                if (name)
                        prctl(PR_SET_NAME, name);
                char c = 1;
                if (write(p[1], &c, 1) != 1)
                        _exit(9);
                for (;;)
                        pause();
        }
        char c;
        assert_int_equal(read(p[0], &c, 1), 1);
        close(p[0]);
        close(p[1]);
        return pid;
}

/* Wait until pid's state (field 3) is what want says, without reaping it. */
static int state_soon(pid_t pid, int want, char *buf, size_t len) {
        int got = -1;
        for (int i = 0; i < 2000 && (got = proc_state(pid, buf, len)) != want; i++) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
        }
        return got;
}

static void test_running_and_stopped(void **state) {
        (void)state;
        char how[96];
        pid_t pid = child(NULL);
        assert_int_equal(proc_state(pid, how, sizeof(how)), PROC_RUNNING);
        assert_string_equal(how, "");
        kill(pid, SIGSTOP);
        assert_int_equal(state_soon(pid, PROC_STOPPED, how, sizeof(how)), PROC_STOPPED);
        assert_string_equal(how, " is stopped");
        kill(pid, SIGCONT);
        assert_int_equal(state_soon(pid, PROC_RUNNING, how, sizeof(how)), PROC_RUNNING);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
}

static void test_zombies_say_how_they_ended(void **state) {
        (void)state;
        char how[96];
        pid_t pid = child(NULL);
        kill(pid, SIGKILL);
        assert_int_equal(state_soon(pid, PROC_ENDED, how, sizeof(how)), PROC_ENDED);
        assert_string_equal(how, " was killed by signal 9 (Killed)");
        waitpid(pid, NULL, 0);
        /* reaped: gone without a trace */
        assert_int_equal(proc_state(pid, how, sizeof(how)), PROC_RUNNING);
        assert_string_equal(how, "");

        pid = fork();
        if (pid == 0)
                _exit(3);
        assert_int_equal(state_soon(pid, PROC_ENDED, how, sizeof(how)), PROC_ENDED);
        assert_string_equal(how, " exited with status 3");
        waitpid(pid, NULL, 0);
}

static void test_stat_fields(void **state) {
        (void)state;
        /* field 4 is the parent's pid, field 5 the process group */
        assert_int_equal(proc_stat_field(getpid(), 4), getppid());
        assert_int_equal(proc_stat_field(getpid(), 5), getpgrp());
        /* a name with ") " and spaces in it does not shift the fields */
        pid_t pid = child("a) b ) c (d");
        assert_int_equal(proc_stat_field(pid, 4), getpid());
        char how[96];
        kill(pid, SIGSTOP);
        assert_int_equal(state_soon(pid, PROC_STOPPED, how, sizeof(how)), PROC_STOPPED);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        /* nothing there: -1 */
        assert_int_equal(proc_stat_field(pid, 4), -1);
        assert_int_equal(proc_stat_field(getpid(), 4000), -1);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_running_and_stopped),
                cmocka_unit_test(test_zombies_say_how_they_ended),
                cmocka_unit_test(test_stat_fields),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
