/* SPDX-License-Identifier: MIT */
/*
 * test-config.c - devald's options (daemon/config.c): a configuration file's lines go ahead
 * of the command line, which wins; blank lines and comments are skipped, spaces around '='
 * and at the end are not part of the value; every malformed line is refused naming the file
 * and the line; --config '' reads none; the defaults without any.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static char path[64];

static void write_config(const char *text) {
        snprintf(path, sizeof(path), "/tmp/deval-config-%d.conf", (int)getpid());
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

/* config_parse() on argv, with what it said on stderr in err. */
static int parse(Daemon *d, char **argv, char *err, size_t len) {
        int argc = 0;
        while (argv[argc])
                argc++;
        memset(d, 0, sizeof(*d));
        fflush(stderr);
        FILE *tmp = tmpfile();
        int saved = dup(2);
        dup2(fileno(tmp), 2);
        int r = config_parse(d, argc, argv);
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        rewind(tmp);
        size_t n = fread(err, 1, len - 1, tmp);
        err[n] = '\0';
        fclose(tmp);
        return r;
}

static void test_file_then_command_line(void **state) {
        (void)state;
        Daemon d;
        char err[512];
        write_config("# devald.conf\n\n  max-group-bytes = 64M  \nthreads=3\nmax-world =\t12\n"
                     "socket = /tmp/x.sock\n");
        char *argv[] = {"devald", "--config", path, "--threads", "5", NULL};
        assert_int_equal(parse(&d, argv, err, sizeof(err)), 0);
        assert_int_equal(d.max_group_bytes, 64u << 20);
        assert_int_equal(d.threads, 5); /* the command line wins */
        assert_int_equal(d.max_world, 12);
        assert_string_equal(d.socket_path, "/tmp/x.sock");
        assert_string_equal(d.config_path, path);
        unlink(path);
}

static void test_malformed_lines(void **state) {
        (void)state;
        static const struct {
                const char *text, *says;
        } cases[] = {
                {"threads = 2\nbogus = 1\n", ":2: unknown option"},
                {"threads =\n", ":1: the value is missing"},
                {"threads 4\n", ":1: expected 'option = value'"},
                {"config = /etc/other.conf\n", ":1: unknown option"},
                {"help = yes\n", ":1: unknown option"},
                {"max-group-bytes = 12Q\n", "max-group-bytes"},
                {"threads = 0\n", "threads"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                Daemon d;
                char err[512];
                write_config(cases[i].text);
                char *argv[] = {"devald", "--config", path, NULL};
                int r = parse(&d, argv, err, sizeof(err));
                if (r != -EINVAL || !strstr(err, cases[i].says))
                        fail_msg("'%s': %d, said '%s' (want -EINVAL and '%s')", cases[i].text, r,
                                 err, cases[i].says);
                unlink(path);
        }
}

static void test_no_file(void **state) {
        (void)state;
        Daemon d;
        char err[512];
        char *none[] = {"devald", "--config=", NULL};
        assert_int_equal(parse(&d, none, err, sizeof(err)), 0);
        assert_string_equal(d.config_path, "");
        assert_true(d.threads >= 1 && d.threads <= 8);
        assert_int_equal(d.max_groups, 1024);
        assert_true(d.max_group_bytes > 0 && d.max_user_bytes >= d.max_group_bytes);
        char *missing[] = {"devald", "--config", "/nonexistent/devald.conf", NULL};
        assert_int_equal(parse(&d, missing, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "cannot read /nonexistent/devald.conf"));
        char *stray[] = {"devald", "--config=", "extra", NULL};
        assert_int_equal(parse(&d, stray, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "unexpected argument 'extra'"));
        char *version[] = {"devald", "--config=", "--version", NULL};
        assert_int_equal(parse(&d, version, err, sizeof(err)), CONFIG_DONE);
}

/* SIGHUP: what the table marks reloadable changes, the socket does not. */
static void test_reload(void **state) {
        (void)state;
        Daemon d;
        char err[512];
        write_config("threads = 2\nmax-groups = 10\nmax-user-bytes = 1G\nsocket = /tmp/a.sock\n");
        char *argv[] = {"devald", "--config", path, NULL};
        assert_int_equal(parse(&d, argv, err, sizeof(err)), 0);
        assert_int_equal(d.threads, 2);
        write_config("threads = 7\nmax-groups = 11\nmax-user-bytes = 2G\nidle-timeout = 5\n"
                     "socket = /tmp/b.sock\n");
        config_reload(&d, 3, argv);
        assert_int_equal(d.threads, 7);
        assert_int_equal(d.max_groups, 11);
        assert_int_equal(d.max_user_bytes, 2ull << 30);
        assert_int_equal(d.idle_timeout_s, 5);
        assert_string_equal(d.socket_path, "/tmp/a.sock"); /* takes a restart */
        /* a configuration with an error changes nothing */
        write_config("threads = 3\nbogus = 1\n");
        fflush(stderr);
        int saved = dup(2), null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        config_reload(&d, 3, argv);
        dup2(saved, 2);
        close(saved);
        close(null);
        assert_int_equal(d.threads, 7);
        unlink(path);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_file_then_command_line),
                cmocka_unit_test(test_malformed_lines),
                cmocka_unit_test(test_no_file),
                cmocka_unit_test(test_reload),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
