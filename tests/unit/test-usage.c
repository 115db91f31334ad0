/* SPDX-License-Identifier: MIT */
/*
 * test-usage.c - per-uid records and the quota charges of devald's arenas (daemon/usage.c):
 * records made once per uid and forgotten when empty; a reservation never passes the uid's
 * limit, also when threads race for the last bytes; an arena's growth by half again, cut
 * down to what is needed near the group's or the uid's quota, refused past either with a
 * message naming the option, and committed to the group or given back.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "usage.h"

static void test_records(void **state) {
        (void)state;
        Daemon d = {0};
        Usage *a = usage_get(&d, 1000), *b = usage_get(&d, 1001);
        assert_non_null(a);
        assert_non_null(b);
        assert_ptr_equal(usage_get(&d, 1000), a);
        assert_ptr_not_equal(a, b);
        a->conns = 1;
        usage_put(&d, a); /* holds a connection: kept */
        assert_ptr_equal(usage_get(&d, 1000), a);
        a->conns = 0;
        atomic_store(&a->bytes, 5);
        usage_put(&d, a); /* holds bytes: kept */
        assert_ptr_equal(d.usage, b);
        atomic_store(&a->bytes, 0);
        usage_put(&d, a);
        usage_put(&d, b);
        usage_put(&d, NULL);
        assert_null(d.usage);
}

typedef struct {
        Usage *u;
        uint64_t limit;
        int taken;
} Racer;

static void *race(void *arg) {
        Racer *r = arg;
        for (int i = 0; i < 100000; i++)
                r->taken += usage_reserve(r->u, r->limit, 4096);
        return NULL;
}

static void test_reserve_never_passes_the_limit(void **state) {
        (void)state;
        Usage u = {.uid = 7};
        assert_false(usage_reserve(&u, 100, 101));
        assert_true(usage_reserve(&u, 100, 100));
        assert_false(usage_reserve(&u, 100, 1));
        atomic_store(&u.bytes, 0);
        /* four threads race for 1000 pages: exactly 1000 are handed out */
        Racer r[4];
        pthread_t t[4];
        for (int i = 0; i < 4; i++) {
                r[i] = (Racer){.u = &u, .limit = 1000 * 4096};
                assert_int_equal(pthread_create(&t[i], NULL, race, &r[i]), 0);
        }
        int taken = 0;
        for (int i = 0; i < 4; i++) {
                pthread_join(t[i], NULL);
                taken += r[i].taken;
        }
        assert_int_equal(taken, 1000);
        assert_int_equal(atomic_load(&u.bytes), 1000 * 4096);
        /* near UINT64_MAX nothing wraps */
        assert_false(usage_reserve(&u, UINT64_MAX, UINT64_MAX));
}

static void group_init(Group *g, Daemon *d, Usage *u, uint64_t mapped) {
        memset(g, 0, sizeof(*g));
        g->d = d;
        g->usage = u;
        g->uid = u->uid;
        g->locked.bytes_mapped = mapped;
        snprintf(g->name, sizeof(g->name), "eval");
        pthread_mutex_init(&g->lock, NULL);
}

static void test_growth_and_quotas(void **state) {
        (void)state;
        Daemon d = {.max_group_bytes = 1u << 30, .max_user_bytes = 3u << 29};
        Usage u = {.uid = 1000};
        Group g;
        char why[256];
        Charge ch;
        /* a 1 MiB arena of a group holding 2 MiB grows by half again at least */
        group_init(&g, &d, &u, 2u << 20);
        assert_int_equal(charge_take(&g, 1u << 20, (1u << 20) + 1, &ch, why, sizeof(why)), 0);
        assert_int_equal(ch.want, 3u << 19);
        assert_int_equal(atomic_load(&u.bytes), ch.want - (1u << 20)); /* the growth, taken */
        charge_commit(&ch); /* in place: the group counts it */
        assert_int_equal(g.locked.bytes_mapped, (2u << 20) + ch.want - (1u << 20));
        g.locked.bytes_mapped = 2u << 20;
        /* a large request gets what it asks, page-aligned */
        atomic_store(&u.bytes, 0);
        assert_int_equal(charge_take(&g, 1u << 20, 100000000, &ch, why, sizeof(why)), 0);
        assert_int_equal(ch.want, 100003840); /* 100000000 up to a page */
        charge_drop(&ch);
        assert_int_equal(atomic_load(&u.bytes), 0);
        /* near the group's quota: no headroom, just what is needed */
        g.locked.bytes_mapped = (1u << 30) - (100u << 20);
        assert_int_equal(charge_take(&g, 1u << 20, 80u << 20, &ch, why, sizeof(why)), 0);
        assert_int_equal(ch.want, 80u << 20);
        atomic_store(&u.bytes, 0);
        /* past it: refused, naming the option, nothing taken */
        assert_int_equal(charge_take(&g, 1u << 20, 200u << 20, &ch, why, sizeof(why)),
                         DEVAL_ENOMEM);
        assert_non_null(strstr(why, "--max-group-bytes"));
        assert_non_null(strstr(why, "'eval'"));
        assert_int_equal(atomic_load(&u.bytes), 0);
        /* the uid's quota across groups: the headroom first goes, then the request */
        g.locked.bytes_mapped = 1u << 20;
        atomic_store(&u.bytes, (3u << 29) - (64u << 20));
        assert_int_equal(charge_take(&g, 1u << 20, 60u << 20, &ch, why, sizeof(why)), 0);
        assert_int_equal(ch.want, 60u << 20);
        assert_int_equal(charge_take(&g, 1u << 20, 60u << 20, &ch, why, sizeof(why)), DEVAL_ENOMEM);
        assert_non_null(strstr(why, "--max-user-bytes"));
        assert_non_null(strstr(why, "uid 1000"));
        pthread_mutex_destroy(&g.lock);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_records),
                cmocka_unit_test(test_reserve_never_passes_the_limit),
                cmocka_unit_test(test_growth_and_quotas),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
