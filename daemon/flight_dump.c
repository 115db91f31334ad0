/* SPDX-License-Identifier: MIT */
/*
 * flight_dump.c - a group's flight recorder written out: as JSON for deval-ctl dump, and as a file
 * beside devald's socket (and into the log) when the group fails.
 */
#define _GNU_SOURCE
#include "flight_dump.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include "daemon.h"
#include "log.h"
#include "util.h"

/**
 * group_flight_json() - g's flight recorder as JSON (malloc'd), or NULL out of memory.
 */
char *group_flight_json(Group *g, size_t *ret_len) {
        pthread_mutex_lock(&g->lock);
        char *json = flight_json(&g->locked.flight, g->name, ret_len);
        pthread_mutex_unlock(&g->lock);
        return json;
}

/**
 * group_flight_dump() - write g's flight recorder beside devald's socket, as
 * flight-NAME.json (0600, owned by the group's uid when devald is root), and into the log:
 * whole when it is short, else where the file is. Any thread.
 */
void group_flight_dump(Group *g, const char *why) {
        size_t len;
        _cleanup_(freep) char *json = group_flight_json(g, &len);
        if (!json)
                return;
        char path[PATH_MAX], name[DV_GROUP_NAME_MAX];
        snprintf(name, sizeof(name), "%s", g->name);
        for (char *p = name; *p; p++) /* a file name of the group's, whatever it holds */
                if (!(*p == '-' || *p == '_' || *p == '.' || (*p >= '0' && *p <= '9') ||
                      (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
                        *p = '_';
        snprintf(path, sizeof(path), "%s", g->d->socket_path);
        char *slash = strrchr(path, '/');
        size_t dir = slash ? (size_t)(slash - path) : 1;
        snprintf(path + dir, sizeof(path) - dir, "/flight-%s.json", name);
        if (!slash)
                path[0] = '.';
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 || fchmod(fd, 0600) < 0 || write(fd, json, len) != (ssize_t)len) {
                log_warn("group '%s': cannot write its flight recorder to %s: %m", g->name, path);
        } else if (geteuid() == 0 && fchown(fd, g->uid, (gid_t)-1) < 0) {
                log_warn("group '%s': cannot give %s to uid %u: %m", g->name, path,
                         (unsigned)g->uid);
        }
        if (fd >= 0)
                close(fd);
        if (len < 16384)
                log_info("group '%s' %s; flight recorder (%s): %.*s", g->name, why, path,
                         (int)len - 1, json);
        else
                log_info("group '%s' %s; flight recorder in %s", g->name, why, path);
}
