/* SPDX-License-Identifier: MIT */
/*
 * usage.c - what each uid holds in devald, and the quotas a group's arenas are charged against:
 * the group's (--max-group-bytes) and its uid's across its groups (--max-user-bytes).
 */
#define _GNU_SOURCE
#include "usage.h"

#include <stdio.h>

#include "daemon.h"
#include "util.h"

/**
 * usage_get() - uid's record, made on first use. Return: it, or NULL out of memory.
 */
Usage *usage_get(Daemon *d, uid_t uid) {
        for (Usage *u = d->usage; u; u = u->next)
                if (u->uid == uid)
                        return u;
        Usage *u = calloc(1, sizeof(*u));
        if (!u)
                return NULL;
        u->uid = uid;
        u->next = d->usage;
        d->usage = u;
        return u;
}

/**
 * usage_put() - forget u once its uid holds nothing in devald. Accepts NULL.
 */
void usage_put(Daemon *d, Usage *u) {
        if (!u || u->conns || u->groups || u->fds || atomic_load(&u->bytes))
                return;
        for (Usage **p = &d->usage; *p; p = &(*p)->next)
                if (*p == u) {
                        *p = u->next;
                        break;
                }
        free(u);
}

/*
 * Take n more bytes for u's groups if that stays within limit. Any thread: two groups of a
 * uid that grow at once each get a share or a refusal, never the same bytes.
 */
bool usage_reserve(Usage *u, uint64_t limit, uint64_t n) {
        uint64_t have = atomic_load_explicit(&u->bytes, memory_order_relaxed);
        do {
                if (n > limit || have > limit - n)
                        return false;
        } while (!atomic_compare_exchange_weak_explicit(
                &u->bytes, &have, have + n, memory_order_relaxed, memory_order_relaxed));
        return true;
}

/**
 * charge_take() - size a replacement for an arena of current bytes that must hold size.
 * Growth is by half again at least (a few regrowths for a growing workload), but never past
 * the group's quota, which counts every arena of the group (bytes_mapped).
 * @ret: the charge; ret->want is the size to allocate. Commit or drop it.
 * Return: 0, or DEVAL_ENOMEM when even size does not fit.
 */
int charge_take(Group *g, uint64_t current, uint64_t size, Charge *ret, char *why, size_t whylen) {
        uint64_t max = g->d->max_group_bytes, user_max = g->d->max_user_bytes;
        pthread_mutex_lock(&g->lock);
        uint64_t others = g->locked.bytes_mapped - current;
        pthread_mutex_unlock(&g->lock);
        if (size > max || others + size > max) {
                snprintf(why, whylen, "group '%s' past its quota of %llu bytes (--max-group-bytes)",
                         g->name, (unsigned long long)max);
                return DEVAL_ENOMEM;
        }
        uint64_t want = DV_ALIGN(DV_MAX(size, current + current / 2), 4096);
        if (others + want > max)
                want = DV_ALIGN(size, 4096);
        /* the uid's quota across its groups: take the growth now */
        if (want > current && !usage_reserve(g->usage, user_max, want - current)) {
                want = DV_ALIGN(size, 4096);
                if (want > current && !usage_reserve(g->usage, user_max, want - current)) {
                        snprintf(why, whylen,
                                 "uid %u past its quota of %llu bytes across its groups "
                                 "(--max-user-bytes)",
                                 (unsigned)g->uid, (unsigned long long)user_max);
                        return DEVAL_ENOMEM;
                }
        }
        *ret = (Charge){.g = g, .current = current, .want = want};
        return 0;
}

void charge_commit(Charge *c) {
        c->g->locked.bytes_mapped += c->want - c->current;
}

void charge_drop(Charge *c) {
        if (c->want > c->current)
                atomic_fetch_sub(&c->g->usage->bytes, c->want - c->current);
}
