/* SPDX-License-Identifier: MIT */
/*
 * tunables.c - reading deval's tunables (tunables.h) from the environment: every value is
 * checked, and one that is not of its kind is an error naming the variable and what it
 * takes, never a silent zero.
 */
#define _GNU_SOURCE
#include "tunables.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "deval.h"

#define DV_TUN_DEF_(id, name, kind, unit) [DV_TUN_##id] = {name, kind, unit},
const DvTunDef dv_tun_defs[DV_TUN_MAX_] = {DV_TUNABLES(DV_TUN_DEF_)};
#undef DV_TUN_DEF_

_Static_assert(DV_TUN_MAX_ <= 32, "DvTunables.set has a bit per tunable");

static int word(const char *s, const char *const *words) {
        for (int i = 0; words[i]; i++)
                if (strcasecmp(s, words[i]) == 0)
                        return 1;
        return 0;
}

static const char *const yes[] = {"1", "yes", "true", "on", NULL};
static const char *const no[] = {"0", "no", "false", "off", NULL};

/* Parse value s of tunable d into *ret. */
static int parse(const DvTunDef *d, const char *s, uint64_t *ret, char *why, size_t why_len) {
        switch (d->kind) {
        case DV_TUN_FLAG:
                *ret = !word(s, no);
                return 0;
        case DV_TUN_BOOL:
                if (word(s, yes) || word(s, no)) {
                        *ret = word(s, yes);
                        return 0;
                }
                snprintf(why, why_len, "$%s is '%.32s'; it takes 1 or 0 (yes/no, true/false)",
                         d->name, s);
                return DEVAL_EINVAL;
        default: {
                char *end;
                errno = 0;
                unsigned long long v = strtoull(s, &end, 10);
                if (*s >= '0' && *s <= '9' && !*end && errno == 0) {
                        *ret = v;
                        return 0;
                }
                snprintf(why, why_len,
                         "$%s is '%.32s'; it takes a whole number of %s (0 to 2^64-1)", d->name, s,
                         d->unit);
                return DEVAL_EINVAL;
        }
        }
}

/**
 * dv_tunable_read() - read tunable k from the environment (secure_getenv: nothing in a
 * process in secure-execution mode).
 * @ret_set: whether it is set (to a non-empty value); @ret: its value when set.
 * Return: 0, or DEVAL_EINVAL with why (naming the variable) when its value is not of its kind.
 */
int dv_tunable_read(DvTun k, bool *ret_set, uint64_t *ret, char *why, size_t why_len) {
        const DvTunDef *d = &dv_tun_defs[k];
        const char *s = secure_getenv(d->name);
        *ret_set = false;
        if (!s || !*s)
                return 0;
        int r = parse(d, s, ret, why, why_len);
        if (r < 0)
                return r;
        *ret_set = true;
        return 0;
}

/**
 * dv_tunables_read() - read every tunable from the environment into *t (all unset first).
 * Return: 0, or DEVAL_EINVAL with why for the first whose value is not of its kind.
 */
int dv_tunables_read(DvTunables *t, char *why, size_t why_len) {
        *t = (DvTunables){0};
        for (int k = 0; k < DV_TUN_MAX_; k++) {
                bool set;
                int r = dv_tunable_read((DvTun)k, &set, &t->v[k], why, why_len);
                if (r < 0)
                        return r;
                t->set |= (uint32_t)set << k;
        }
        return 0;
}
