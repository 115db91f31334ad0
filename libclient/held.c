/* SPDX-License-Identifier: MIT */
/*
 * held.c - the groups this process holds, by name and devald socket. A forked child holds
 * none of its parent's: their memberships are the parent's.
 */
#define _GNU_SOURCE
#include "held.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "handle.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static deval_group *held; /* linked through held_next */

/** dv_held_add() - g, just joined, is held by this process until dv_held_remove(). */
void dv_held_add(deval_group *g) {
        pthread_mutex_lock(&lock);
        g->held_next = held;
        held = g;
        pthread_mutex_unlock(&lock);
}

/** dv_held_remove() - g is no longer held (a no-op for a handle never added). */
void dv_held_remove(deval_group *g) {
        pthread_mutex_lock(&lock);
        for (deval_group **p = &held; *p; p = &(*p)->held_next)
                if (*p == g) {
                        *p = g->held_next;
                        break;
                }
        g->held_next = NULL;
        pthread_mutex_unlock(&lock);
}

/**
 * dv_held_find() - the handle by which this process holds group @name of the devald at
 * @socket_path, or NULL. The caller only reads its rank and world size.
 */
const deval_group *dv_held_find(const char *name, const char *socket_path) {
        pid_t me = getpid();
        const deval_group *found = NULL;
        pthread_mutex_lock(&lock);
        for (const deval_group *g = held; g && !found; g = g->held_next)
                if (g->pid == me && strcmp(g->name, name) == 0 &&
                    strcmp(g->socket_path, socket_path) == 0)
                        found = g;
        pthread_mutex_unlock(&lock);
        return found;
}
