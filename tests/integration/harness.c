/* SPDX-License-Identifier: MIT */
/*
 * harness.c - start and stop a real devald, fork ranks and collect how they ended.
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

#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double harness_now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool can_connect(const char *path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (fd >= 0)
                close(fd);
        return ok;
}

/*
 * /dev/shm as the first devald found it: devald's segments are memfds, which never appear
 * there, so every harness_stop() checks it is unchanged.
 */
static char shm_before[8192];

static void shm_list(char *buf, size_t len) {
        DIR *d = opendir("/dev/shm");
        struct dirent *e;
        size_t n = 0;
        buf[0] = '\0';
        /* POSIX semaphores are other programs' (Python's multiprocessing, beside the tests
         * on a shared machine): devald makes none */
        while (d && (e = readdir(d)))
                if (e->d_name[0] != '.' && strncmp(e->d_name, "sem.", 4) != 0 && n < len)
                        n += (size_t)snprintf(buf + n, len - n, "%s\n", e->d_name);
        if (d)
                closedir(d);
}

/*
 * A forked child of the test (a rank, a devald) gets sig when the test ends: a test that
 * fails an assertion never stops what it started, and what it started holds the test's
 * output open, so that the test runner waits on it until its timeout.
 */
void harness_die_with(pid_t parent, int sig) {
        prctl(PR_SET_PDEATHSIG, sig);
        if (getppid() != parent) /* it ended before the line above */
                raise(sig);
}

void harness_start(Harness *h, const char *const *extra) {
        harness_start_within(h, extra, 5);
}

void harness_start_within(Harness *h, const char *const *extra, int seconds) {
        if (!shm_before[0]) { /* "-" ends it, so that an empty /dev/shm is taken once */
                shm_list(shm_before, sizeof(shm_before) - 1);
                strcat(shm_before, "-");
        }
        const char *devald = getenv("DEVALD");
        const char *argv[32];
        int n = 0;

        assert_non_null(devald);
        snprintf(h->dir, sizeof(h->dir), "/tmp/deval-test-XXXXXX");
        assert_non_null(mkdtemp(h->dir));
        snprintf(h->socket, sizeof(h->socket), "%s/devald.sock", h->dir);
        argv[n++] = devald;
        argv[n++] = "--socket";
        argv[n++] = h->socket;
        argv[n++] = "--log-level";
        argv[n++] = getenv("DEVAL_TEST_LOG") ? getenv("DEVAL_TEST_LOG") : "warn";
        for (int i = 0; extra && extra[i] && n < 30; i++)
                argv[n++] = extra[i];
        argv[n] = NULL;
        pid_t parent = getpid();
        h->daemon = fork();
        assert_true(h->daemon >= 0);
        if (h->daemon == 0) {
                harness_die_with(parent, SIGTERM);
                execv(devald, (char *const *)argv);
                _exit(127);
        }
        for (int i = 0; i < seconds * 100; i++) {
                if (can_connect(h->socket))
                        return;
                int st;
                if (waitpid(h->daemon, &st, WNOHANG) == h->daemon)
                        fail_msg("devald exited during start-up");
                usleep(10000);
        }
        fail_msg("devald did not listen on %s within %d s", h->socket, seconds);
}

void harness_stop(Harness *h) {
        int st = 0;
        if (h->daemon <= 0)
                return;
        kill(h->daemon, SIGTERM);
        for (int i = 0; i < 500; i++) {
                if (waitpid(h->daemon, &st, WNOHANG) == h->daemon) {
                        h->daemon = 0;
                        break;
                }
                usleep(10000);
        }
        if (h->daemon) {
                kill(h->daemon, SIGKILL);
                waitpid(h->daemon, &st, 0);
                h->daemon = 0;
                fail_msg("devald did not stop within 5 s of SIGTERM");
        }
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        struct stat sb;
        assert_int_equal(stat(h->socket, &sb), -1); /* the socket was removed */
        char shm_now[8192];
        shm_list(shm_now, sizeof(shm_now) - 1);
        strcat(shm_now, "-");
        if (strcmp(shm_now, shm_before) != 0)
                fail_msg("/dev/shm changed while devald ran:\nbefore:\n%s\nnow:\n%s", shm_before,
                         shm_now);
        rmdir(h->dir);
}

int harness_run(const Harness *h, int world, RankFn fn, void *arg, int timeout_s) {
        pid_t pids[DEVAL_MAX_WORLD];
        int failed = 0;

        fflush(NULL);
        for (int r = 0; r < world; r++) {
                pid_t parent = getpid();
                pids[r] = fork();
                assert_true(pids[r] >= 0);
                if (pids[r] == 0) {
                        harness_die_with(parent, SIGKILL);
                        alarm((unsigned)timeout_s + 5); /* a hung rank must not hang the suite */
                        int rc = fn(h, r, world, arg);
                        fflush(NULL);
                        _exit(rc);
                }
        }
        double deadline = harness_now() + timeout_s;
        /* wait for the ranks by pid: devald is a child too and must not be reaped here */
        for (int left = world; left > 0;) {
                for (int r = 0; r < world; r++) {
                        int st;
                        if (pids[r] <= 0 || waitpid(pids[r], &st, WNOHANG) != pids[r])
                                continue;
                        pids[r] = 0;
                        left--;
                        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                                failed++;
                                fprintf(stderr, "rank %d %s %d\n", r,
                                        WIFEXITED(st) ? "exited with" : "killed by signal",
                                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                        }
                }
                if (left > 0 && harness_now() > deadline) {
                        for (int r = 0; r < world; r++) {
                                int st;
                                if (pids[r] <= 0)
                                        continue;
                                fprintf(stderr, "rank %d timed out\n", r);
                                kill(pids[r], SIGKILL);
                                waitpid(pids[r], &st, 0);
                                failed++;
                        }
                        break;
                }
                usleep(2000);
        }
        return failed;
}

int harness_join(const Harness *h, const char *group, int rank, int world, int timeout_ms,
                 deval_group **g) {
        char name[64];
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = h->socket,
                             .timeout_ms = timeout_ms};
        snprintf(name, sizeof(name), "%s-%d", group, (int)getppid());
        return deval_join(name, rank, world, &o, g);
}

int harness_ctl(const Harness *h, const char *args, char *buf, size_t len) {
        char cmd[512];
        const char *ctl = getenv("DEVAL_CTL");
        assert_non_null(ctl);
        snprintf(cmd, sizeof(cmd), "%s --socket %s %s 2>&1", ctl, h->socket, args);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        size_t n = fread(buf, 1, len - 1, f);
        buf[n] = '\0';
        int st = pclose(f);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
