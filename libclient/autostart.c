/* SPDX-License-Identifier: MIT */
/*
 * autostart.c - start a private devald for this user when nothing answers at the socket a
 * join resolved, so that a user never has to know a daemon exists.
 *
 * Ranks of one job start at once: they serialise on a lock file beside the socket, and the
 * first one in finds nothing answering, starts devald and waits until it answers; the others
 * then find it. devald runs detached (its own session, reparented away from the rank, so it
 * outlives a rank that dies), logs to devald.log beside the socket, and exits by itself after
 * a while with no group ($DEVAL_IDLE_EXIT seconds, default 60), so a second evaluation right
 * after the first reuses it. A socket file left by a killed devald answers nobody; devald
 * replaces it when it binds.
 */
#define _GNU_SOURCE
#include "autostart.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "deval.h"

extern char **environ;

#include "sock.h"
#include "util.h"

#define START_TIMEOUT_MS 10000

/* $DEVALD, else the devald installed beside this library, else where meson installed it. */
static int find_devald(char *buf, size_t len) {
        const char *env = secure_getenv("DEVALD");
        if (env && *env) {
                snprintf(buf, len, "%s", env);
                return access(buf, X_OK) == 0 ? 0 : -errno;
        }
        Dl_info info;
        if (dladdr((void *)find_devald, &info) && info.dli_fname) {
                char dir[PATH_MAX];
                snprintf(dir, sizeof(dir), "%s", info.dli_fname);
                char *slash = strrchr(dir, '/');
                if (slash) {
                        *slash = '\0';
                        int n = snprintf(buf, len, "%s/devald", dir);
                        if (n > 0 && (size_t)n < len && access(buf, X_OK) == 0)
                                return 0;
                }
        }
#ifdef DEVALD_PATH
        snprintf(buf, len, "%s", DEVALD_PATH);
        if (access(buf, X_OK) == 0)
                return 0;
#endif
        return -ENOENT;
}

/* The socket's directory, made private to this user if it is new; refused if others may
 * write into it (they could put a socket of theirs in our devald's place). */
static int private_dir(const char *dir, char *err, size_t errlen) {
        struct stat st;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
                snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
                return -1;
        }
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
            (st.st_mode & 022)) {
                snprintf(err, errlen,
                         "%s is not a directory of this user's that only it may write; "
                         "remove it, or name a socket",
                         dir);
                return -1;
        }
        return 0;
}

static void sleep_ms(int ms) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
}

/*
 * Start devald on sock, detached: fork, setsid, fork again; the grandchild execs devald with
 * its output in log. Between fork and exec only async-signal-safe calls: the rank may have
 * threads. Return: 0 once the intermediate child is reaped, or -errno.
 */
static int spawn(const char *devald, const char *sock, const char *log, const char *idle) {
        char *const argv[] = {(char *)"devald",      (char *)"--socket", (char *)sock,
                              (char *)"--exit-idle", (char *)idle,       NULL};
        /* the rank's environment, less what is the rank's alone: its share of the GPUs (devald
         * serves every rank's), its fault points, and a service manager's words to it */
        static const char *const drop[] = {
                "CUDA_VISIBLE_DEVICES=", "DEVAL_FAULT=",    "NOTIFY_SOCKET=", "LISTEN_FDS=",
                "LISTEN_PID=",           "LISTEN_FDNAMES=", "WATCHDOG_USEC=", "WATCHDOG_PID="};
        size_t n = 0;
        while (environ[n])
                n++;
        _cleanup_(freep) char **envp = calloc(n + 1, sizeof(char *));
        if (!envp)
                return -ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
                bool keep = true;
                for (size_t d = 0; d < sizeof(drop) / sizeof(drop[0]); d++)
                        keep &= strncmp(environ[i], drop[d], strlen(drop[d])) != 0;
                if (keep)
                        envp[k++] = environ[i];
        }
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                if (setsid() < 0 || fork() != 0)
                        _exit(0); /* the intermediate child; its child goes on */
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                for (int s = 1; s < NSIG; s++)
                        if (s != SIGKILL && s != SIGSTOP)
                                signal(s, SIG_DFL);
                int in = open("/dev/null", O_RDONLY);
                int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
                if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
                        _exit(127);
                if (syscall(SYS_close_range, 3u, ~0u, 0u) < 0)
                        for (int fd = 3; fd < 4096; fd++)
                                close(fd);
                execve(devald, argv, envp);
                _exit(127);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        return 0;
}

/**
 * dv_autostart() - make a devald answer at sock, starting one if nobody does.
 * @sock: this user's socket path (not one the caller named).
 * @idle_exit_s: how long the devald started waits with no group and no client before it exits.
 * @err: why not, on failure: what to run instead.
 * Return: 0 when a devald answers at sock; DEVAL_EDAEMON with err otherwise.
 */
int dv_autostart(const char *sock, uint64_t idle_exit_s, char *err, size_t errlen) {
        char dir[PATH_MAX], lock[PATH_MAX + 16], log[PATH_MAX + 16], devald[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", sock);
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) {
                snprintf(err, errlen, "cannot start devald for the socket %s", sock);
                return DEVAL_EDAEMON;
        }
        *slash = '\0';
        snprintf(lock, sizeof(lock), "%s/devald.lock", dir);
        snprintf(log, sizeof(log), "%s/devald.log", dir);
        if (private_dir(dir, err, errlen) < 0)
                return DEVAL_EDAEMON;
        int r = find_devald(devald, sizeof(devald));
        if (r < 0) {
                snprintf(err, errlen,
                         "no devald answers at %s, and none was found to start (beside "
                         "libdeval, $DEVALD%s); install deval, or set $DEVALD",
                         sock,
#ifdef DEVALD_PATH
                         ", " DEVALD_PATH
#else
                         ""
#endif
                );
                return DEVAL_EDAEMON;
        }
        int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
                snprintf(err, errlen, "cannot open %s: %s", lock, strerror(errno));
                return DEVAL_EDAEMON;
        }
        uint64_t deadline = dv_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000;
        while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                if ((errno != EWOULDBLOCK && errno != EINTR) || dv_now_ns() > deadline) {
                        snprintf(err, errlen, "cannot lock %s to start devald: %s", lock,
                                 errno == EWOULDBLOCK ? "another process holds it"
                                                      : strerror(errno));
                        close(fd);
                        return DEVAL_EDAEMON;
                }
                sleep_ms(5);
        }
        /* another rank may have started it while this one waited for the lock */
        if (dv_socket_answers(sock)) {
                close(fd);
                return 0;
        }
        char idle_s[24];
        snprintf(idle_s, sizeof(idle_s), "%llu", (unsigned long long)idle_exit_s);
        if ((r = spawn(devald, sock, log, idle_s)) < 0) {
                snprintf(err, errlen, "cannot start %s: %s", devald, strerror(-r));
                close(fd);
                return DEVAL_EDAEMON;
        }
        while (!dv_socket_answers(sock)) {
                if (dv_now_ns() > deadline) {
                        snprintf(err, errlen,
                                 "started %s for %s, but it did not answer within %d s; see %s",
                                 devald, sock, START_TIMEOUT_MS / 1000, log);
                        close(fd);
                        return DEVAL_EDAEMON;
                }
                sleep_ms(5);
        }
        close(fd); /* unlocks */
        return 0;
}
