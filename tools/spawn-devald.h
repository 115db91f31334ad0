/* SPDX-License-Identifier: MIT */
/*
 * spawn-devald.h - a private devald for the tools that bring their own (deval-bench,
 * deval-soak): on a socket in a fresh temporary directory, waited for until it answers,
 * and ended again.
 */
#pragma once

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* Start devald; its socket path in sock. Return: its pid, or -1 if it never listened. */
static inline pid_t spawn_devald(const char *devald, char *sock, size_t len) {
        char dir[] = "/tmp/deval-tool-XXXXXX";
        if (!mkdtemp(dir))
                return -1;
        snprintf(sock, len, "%s/devald.sock", dir);
        pid_t p = fork();
        if (p == 0) {
                execl(devald, devald, "--socket", sock, "--log-level", "warn", (char *)NULL);
                _exit(127);
        }
        for (int i = 0; p > 0 && i < 500; i++) {
                struct sockaddr_un sa = {.sun_family = AF_UNIX};
                snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
                int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
                if (fd >= 0)
                        close(fd);
                if (ok)
                        return p;
                usleep(10000);
        }
        if (p > 0) {
                kill(p, SIGKILL);
                waitpid(p, NULL, 0);
        }
        rmdir(dir);
        return -1;
}

/* SIGTERM devald, wait for it, and remove the directory around its socket. */
static inline void stop_devald(pid_t p, const char *sock) {
        char dir[108];
        kill(p, SIGTERM);
        waitpid(p, NULL, 0);
        snprintf(dir, sizeof(dir), "%s", sock);
        char *slash = strrchr(dir, '/');
        if (slash) {
                *slash = '\0';
                rmdir(dir);
        }
}
