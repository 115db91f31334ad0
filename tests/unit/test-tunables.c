/* SPDX-License-Identifier: MIT */
/*
 * test-tunables.c - the table of tunables: each kind of value is read as documented, a value
 * not of its kind is refused naming the variable, and the man pages document exactly the
 * table's variables (deval(3) and devald(8), in their ENVIRONMENT sections).
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "tunables.h"

static void unset_all(void) {
        for (int k = 0; k < DV_TUN_MAX_; k++)
                unsetenv(dv_tun_defs[k].name);
}

static void test_kinds(void **state) {
        (void)state;
        DvTunables t;
        char why[160];
        unset_all();
        assert_int_equal(dv_tunables_read(&t, why, sizeof(why)), 0);
        assert_int_equal(t.set, 0);
        assert_int_equal(dv_tun_or(&t, DV_TUN_SPIN_US, 7), 7);
        setenv("DEVAL_SPIN_US", "0", 1);
        setenv("DEVAL_MIRROR", "No", 1);
        setenv("DEVAL_RANK_STEPS", "true", 1);
        setenv("DEVAL_DEBUG", "anything", 1);
        setenv("DEVAL_DIRECT_MIN", "18446744073709551615", 1);
        setenv("DEVAL_AUTOSTART", "", 1); /* empty: not set */
        assert_int_equal(dv_tunables_read(&t, why, sizeof(why)), 0);
        assert_true(dv_tun_set(&t, DV_TUN_SPIN_US));
        assert_int_equal(dv_tun_or(&t, DV_TUN_SPIN_US, 7), 0);
        assert_int_equal(dv_tun_or(&t, DV_TUN_MIRROR, 1), 0);
        assert_int_equal(dv_tun_or(&t, DV_TUN_RANK_STEPS, 0), 1);
        assert_int_equal(dv_tun_or(&t, DV_TUN_DEBUG, 0), 1);
        assert_true(dv_tun_or(&t, DV_TUN_DIRECT_MIN, 0) == UINT64_MAX);
        assert_false(dv_tun_set(&t, DV_TUN_AUTOSTART));
        setenv("DEVAL_DEBUG", "0", 1); /* a flag that says no */
        assert_int_equal(dv_tunables_read(&t, why, sizeof(why)), 0);
        assert_int_equal(dv_tun_or(&t, DV_TUN_DEBUG, 1), 0);
        unset_all();
}

/* every value that is not of its kind: an error naming the variable and what it takes */
static void test_refused(void **state) {
        (void)state;
        const struct {
                const char *name, *value, *says;
        } bad[] = {
                {"DEVAL_SPIN_US", "abc", "microseconds"},
                {"DEVAL_SPIN_US", "-1", "microseconds"},
                {"DEVAL_SHARE_MIN", "64k", "bytes"},
                {"DEVAL_DIRECT_MIN", "18446744073709551616", "bytes"},
                {"DEVAL_IDLE_EXIT", " 5", "seconds"},
                {"DEVAL_MIRROR", "2", "1 or 0"},
                {"DEVAL_ONE_MACHINE", "maybe", "1 or 0"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                DvTunables t;
                char why[160] = "";
                unset_all();
                setenv(bad[i].name, bad[i].value, 1);
                assert_int_equal(dv_tunables_read(&t, why, sizeof(why)), DEVAL_EINVAL);
                if (!strstr(why, bad[i].name) || !strstr(why, bad[i].says))
                        fail_msg("%s=%s: '%s'", bad[i].name, bad[i].value, why);
        }
        unset_all();
}

/* deval_join() refuses it before it connects anywhere, naming it */
static void test_join_refuses(void **state) {
        (void)state;
        unset_all();
        setenv("DEVAL_YIELD_US", "1ms", 1);
        deval_group *g = NULL;
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = "/nonexistent/devald.sock"};
        assert_int_equal(deval_join("tun", 0, 1, &o, &g), DEVAL_EINVAL);
        assert_null(g);
        assert_non_null(strstr(deval_errmsg(NULL), "$DEVAL_YIELD_US is '1ms'"));
        unset_all();
}

static char *slurp(const char *path) {
        FILE *f = fopen(path, "r");
        if (!f)
                fail_msg("cannot read %s", path);
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = '\0';
        fclose(f);
        return strdup(buf);
}

/* The ENVIRONMENT section of a page: a variable is documented where a line starts with it. */
static bool documented(const char *page, const char *name) {
        const char *env = strstr(page, "\nENVIRONMENT\n");
        size_t n = strlen(name);
        for (const char *p = env; p && (p = strstr(p, name)); p += n)
                if (p[-1] == '\n' && (p[n] == '\n' || p[n] == '=' || p[n] == ','))
                        return true;
        return false;
}

static void test_documented(void **state) {
        (void)state;
        const char *dir = getenv("DEVAL_MAN_DIR");
        assert_non_null(dir);
        char path[512];
        snprintf(path, sizeof(path), "%s/deval.rst", dir);
        char *lib = slurp(path);
        snprintf(path, sizeof(path), "%s/devald.rst", dir);
        char *daemon = slurp(path);
        for (int k = 0; k < DV_TUN_MAX_; k++) {
                const char *name = dv_tun_defs[k].name;
                if (!documented(lib, name) && !documented(daemon, name))
                        fail_msg("%s is in the table but in neither page's ENVIRONMENT", name);
        }
        /* and every number or switch the pages document is the table's: the pages' other
         * variables name things (paths, nodes, launchers) or are the tests' own */
        const char *others[] = {"DEVAL_SOCKET",     "DEVALD",
                                "DEVAL_NODE",       "DEVAL_GPU_FAKE",
                                "DEVAL_FAULT",      "DEVAL_CUDA_LIBRARY",
                                "DEVAL_LAUNCH_ID",  "LOCAL_WORLD_SIZE",
                                "DEVAL_RESUME_KEY", NULL};
        char *pages[] = {lib, daemon};
        for (int i = 0; i < 2; i++) {
                for (const char *p = strstr(pages[i], "\nENVIRONMENT\n"); p && *p; p++) {
                        /* a definition: the term at the line's start, its text indented */
                        const char *next = strchr(p + 1, '\n');
                        if (p[0] != '\n' || strncmp(p + 1, "DEVAL", 5) != 0 || !next ||
                            strncmp(next + 1, "    ", 4) != 0)
                                continue;
                        char name[64];
                        size_t n = strcspn(p + 1, "=,\n ");
                        snprintf(name, sizeof(name), "%.*s", (int)n, p + 1);
                        bool known = false;
                        for (int k = 0; k < DV_TUN_MAX_; k++)
                                known |= strcmp(name, dv_tun_defs[k].name) == 0;
                        for (int o = 0; others[o]; o++)
                                known |= strcmp(name, others[o]) == 0;
                        if (!known)
                                fail_msg("the pages document %s, which is not in the table", name);
                }
        }
        free(lib);
        free(daemon);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_kinds),
                cmocka_unit_test(test_refused),
                cmocka_unit_test(test_join_refuses),
                cmocka_unit_test(test_documented),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
