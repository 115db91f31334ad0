/* SPDX-License-Identifier: MIT */
/*
 * proc.c - what /proc says of a client process: its state, how a zombie ended, any field of
 * its stat line.
 */
#define _GNU_SOURCE
#include "proc.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * /proc/PID/stat into buf, and where its field 3 (the state) starts: past the command's
 * name, which may hold anything but not a ')' after the last one. NULL when unreadable.
 */
static const char *proc_stat_read(pid_t pid, char *buf, size_t len) {
        char path[32];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return NULL;
        ssize_t n = read(fd, buf, len - 1);
        close(fd);
        if (n <= 0)
                return NULL;
        buf[n] = '\0';
        char *p = strrchr(buf, ')');
        return p && p[1] == ' ' ? p + 2 : NULL;
}

/* Field n (numbered as in proc(5), n >= 3) of a stat line whose field 3 starts at f3. */
static const char *stat_field(const char *f3, int n) {
        for (int i = 3; f3 && i < n; i++) {
                f3 = strchr(f3, ' ');
                f3 = f3 ? f3 + 1 : NULL;
        }
        return f3;
}

/**
 * proc_stat_field() - field n (n >= 4, numbered as in proc(5)) of /proc/PID/stat as a
 * number, or -1 when there is none.
 */
long long proc_stat_field(pid_t pid, int n) {
        char stat[1024];
        const char *f = stat_field(proc_stat_read(pid, stat, sizeof(stat)), n);
        return f ? atoll(f) : -1;
}

/**
 * proc_state() - how process pid is, as far as /proc tells, in buf: " was killed by signal
 * 9 (Killed)" or " exited with status 3" while it is a zombie nobody reaped yet, " is
 * stopped" (SIGSTOP, or a debugger), else "" (running, or gone without a trace).
 * Return: PROC_ENDED, PROC_STOPPED or PROC_RUNNING accordingly.
 */
int proc_state(pid_t pid, char *buf, size_t len) {
        char stat[1024];
        buf[0] = '\0';
        const char *f3 = proc_stat_read(pid, stat, sizeof(stat));
        if (!f3)
                return PROC_RUNNING;
        if (*f3 == 'T' || *f3 == 't') {
                snprintf(buf, len, " is stopped");
                return PROC_STOPPED;
        }
        /* field 52, exit_code (Linux 3.5): a zombie's wait status */
        const char *f52 = *f3 == 'Z' ? stat_field(f3, 52) : NULL;
        if (!f52)
                return PROC_RUNNING;
        int status = atoi(f52);
        if (WIFSIGNALED(status))
                snprintf(buf, len, " was killed by signal %d (%s)", WTERMSIG(status),
                         strsignal(WTERMSIG(status)));
        else if (WIFEXITED(status))
                snprintf(buf, len, " exited with status %d", WEXITSTATUS(status));
        return PROC_ENDED;
}
