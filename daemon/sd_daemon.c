/* SPDX-License-Identifier: MIT */
/*
 * sd_daemon.c - systemd's side of devald in a few lines: the readiness notification
 * (sd_notify(3)) and the socket systemd made from devald.socket (sd_listen_fds(3)).
 */
#define _GNU_SOURCE
#include "sd_daemon.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "daemon.h"
#include "log.h"
#include "util.h"

/* sd_notify(3) in a few lines: one datagram to $NOTIFY_SOCKET, if set. */
void sd_notify_state(const char *state) {
        const char *path = getenv("NOTIFY_SOCKET");
        struct sockaddr_un sa = {.sun_family = AF_UNIX};

        if (!path || (path[0] != '/' && path[0] != '@') || strlen(path) >= sizeof(sa.sun_path))
                return;
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return;
        strncpy(sa.sun_path, path, sizeof(sa.sun_path) - 1);
        if (sa.sun_path[0] == '@')
                sa.sun_path[0] = '\0';
        socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
        if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
                log_debug("sd_notify failed: %m");
        close(fd);
}

/*
 * Socket activation (sd_listen_fds(3) in a few lines): with LISTEN_PID our pid and
 * LISTEN_FDS=1, fd 3 is a listening socket that systemd made from devald.socket.
 * Return: 1 when it was taken, 0 when there is none, -EINVAL with why when it is unusable.
 */
int sd_listen_inherited(Daemon *d, char *why, size_t whylen) {
        const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
        int type = 0;
        socklen_t len = sizeof(type);
        struct sockaddr_un sa;
        socklen_t salen = sizeof(sa);

        if (!pid || !fds || strtol(pid, NULL, 10) != getpid())
                return 0;
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        if (strcmp(fds, "1") != 0) {
                snprintf(why, whylen, "systemd passed %s sockets; devald takes exactly one", fds);
                return -EINVAL;
        }
        if (getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET ||
            getsockname(3, (struct sockaddr *)&sa, &salen) < 0 || sa.sun_family != AF_UNIX) {
                snprintf(why, whylen,
                         "the socket systemd passed is not a SOCK_SEQPACKET Unix socket "
                         "(ListenSequentialPacket= in devald.socket)");
                return -EINVAL;
        }
        fcntl(3, F_SETFD, FD_CLOEXEC);
        fcntl(3, F_SETFL, fcntl(3, F_GETFL) | O_NONBLOCK);
        d->listen_fd = 3;
        d->socket_activated = true;
        if (salen > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0])
                snprintf(d->socket_path, sizeof(d->socket_path), "%s", sa.sun_path);
        return 1;
}
