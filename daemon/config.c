/* SPDX-License-Identifier: MIT */
/*
 * config.c - devald's options: the command line, the configuration file (the same long options,
 * one per line), and SIGHUP's reload of what can change while running.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>

#include "daemon.h"
#include "log.h"
#include "sd_daemon.h"
#include "sock.h"
#include "util.h"

#define DEFAULT_CONFIG "/etc/deval/devald.conf"

static void help(void) {
        printf("Usage: devald [OPTIONS]\n\n"
               "The deval daemon: shared buffers and collectives for distributed evaluation.\n\n"
               "  -s --socket=PATH          listen on PATH (default: $DEVAL_SOCKET, else\n"
               "                            $XDG_RUNTIME_DIR/deval/devald.sock, or\n"
               "                            /run/deval/devald.sock for root)\n"
               "  -b --backend=NAME         auto (default: cuda when a GPU is visible, else "
               "host),\n"
               "                            host, or cuda (device groups on the GPUs)\n"
               "  -l --log-level=LEVEL      err, warn, info (default) or debug\n"
               "     --max-group-bytes=N    shared memory one group may hold (default: a quarter\n"
               "                            of RAM); suffixes K, M, G\n"
               "     --max-groups=N         groups at once (default 1024)\n"
               "     --threads=N            copy threads per group (default: online CPUs, max 8)\n"
               "     --spin-us=N            busy-wait N us for arrivals before sleeping (default:\n"
               "                            20 when the cores outnumber a group's ranks + 1, else "
               "0)\n"
               "     --max-user-bytes=N     shared memory all of one uid's groups may hold\n"
               "                            (default: half of RAM)\n"
               "     --max-user-groups=N    groups one uid may have (default 64)\n"
               "     --max-user-conns=N     connections one uid may have (default 1024)\n"
               "     --max-user-fds=N       descriptors devald may hold for one uid (default\n"
               "                            4096)\n"
               "     --max-world=N          ranks per group (default 512)\n"
               "     --idle-timeout=SECONDS fail groups with no collective this long (default\n"
               "                            86400; 0: never)\n"
               "     --exit-idle=SECONDS    exit after this long with no group and no client\n"
               "                            (default 0: never; a devald libdeval starts: 60)\n"
               "     --config=PATH          options from PATH, one 'option = value' per line,\n"
               "                            before the command line's (default:\n"
               "                            " DEFAULT_CONFIG " if it exists; '' for none);\n"
               "                            SIGHUP reads it again\n"
               "  -h --help                 show this help\n"
               "     --version              show the version\n");
}

static int parse_size(const char *s, uint64_t *ret) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *s == '-')
                return -1;
        uint64_t mul = 1;
        switch (*end) {
        case 'K':
        case 'k':
                mul = 1ull << 10;
                end++;
                break;
        case 'M':
        case 'm':
                mul = 1ull << 20;
                end++;
                break;
        case 'G':
        case 'g':
                mul = 1ull << 30;
                end++;
                break;
        }
        if (*end || v > UINT64_MAX / mul)
                return -1;
        *ret = v * mul;
        return 0;
}

char arg_backend[8] = "auto";

/*
 * The configuration file: "option = value" lines, one per line, for any long option but
 * --config itself; blank lines and lines starting with '#' are skipped. Each line becomes
 * the argument "--option=value" ahead of the command line's, so the command line wins.
 * Return: 0 with *ret_args (malloc'd, each malloc'd) and *ret_n, or -1 after saying where
 * the file is wrong. A missing file is no error unless required.
 */
static int config_read(const char *path, bool required, const struct option *opts, char ***ret_args,
                       int *ret_n) {
        *ret_args = NULL;
        *ret_n = 0;
        FILE *f = fopen(path, "re");
        if (!f) {
                if (!required && errno == ENOENT)
                        return 0;
                fprintf(stderr, "devald: cannot read %s: %s\n", path, strerror(errno));
                return -1;
        }
        char line[1024];
        int lineno = 0, r = 0;
        while (r == 0 && fgets(line, sizeof(line), f)) {
                lineno++;
                char *p = line + strspn(line, " \t");
                p[strcspn(p, "\r\n")] = '\0';
                if (!*p || *p == '#')
                        continue;
                char *eq = strchr(p, '=');
                size_t klen = eq ? strcspn(p, " \t=") : strlen(p);
                const char *v = eq ? eq + 1 + strspn(eq + 1, " \t") : NULL;
                bool known = false;
                for (const struct option *o = opts; o->name && !known; o++)
                        known = strlen(o->name) == klen && strncmp(o->name, p, klen) == 0 &&
                                o->has_arg == required_argument && strcmp(o->name, "config");
                if (!eq || !known || !*v) {
                        fprintf(stderr, "devald: %s:%d: %s\n", path, lineno,
                                !eq      ? "expected 'option = value'"
                                : !known ? "unknown option"
                                         : "the value is missing");
                        r = -1;
                        break;
                }
                size_t vlen = strlen(v);
                while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
                        vlen--;
                char *arg = NULL;
                char **grown = realloc(*ret_args, sizeof(char *) * (size_t)(*ret_n + 1));
                if (!grown || asprintf(&arg, "--%.*s=%.*s", (int)klen, p, (int)vlen, v) < 0) {
                        if (grown)
                                *ret_args = grown;
                        r = -1;
                        break;
                }
                *ret_args = grown;
                (*ret_args)[(*ret_n)++] = arg;
        }
        fclose(f);
        if (r < 0) {
                for (int i = 0; i < *ret_n; i++)
                        free((*ret_args)[i]);
                free(*ret_args);
                *ret_args = NULL;
                *ret_n = 0;
        }
        return r;
}

/* The configuration's arguments and the argument vector built around them. */
typedef struct {
        char **args;
        int n;
        char **all;
} ArgVec;

static void argvec_free(ArgVec *v) {
        for (int i = 0; i < v->n; i++)
                free(v->args[i]);
        free(v->args);
        free(v->all);
}

int config_parse(Daemon *d, int argc, char **argv) {
        enum {
                ARG_MAX_GROUP_BYTES = 0x100,
                ARG_MAX_GROUPS,
                ARG_THREADS,
                ARG_SPIN_US,
                ARG_MAX_USER_BYTES,
                ARG_MAX_USER_GROUPS,
                ARG_MAX_USER_CONNS,
                ARG_MAX_USER_FDS,
                ARG_MAX_WORLD,
                ARG_IDLE_TIMEOUT,
                ARG_EXIT_IDLE,
                ARG_CONFIG,
                ARG_VERSION
        };
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"backend", required_argument, NULL, 'b'},
                {"log-level", required_argument, NULL, 'l'},
                {"max-group-bytes", required_argument, NULL, ARG_MAX_GROUP_BYTES},
                {"max-groups", required_argument, NULL, ARG_MAX_GROUPS},
                {"threads", required_argument, NULL, ARG_THREADS},
                {"spin-us", required_argument, NULL, ARG_SPIN_US},
                {"max-user-bytes", required_argument, NULL, ARG_MAX_USER_BYTES},
                {"max-user-groups", required_argument, NULL, ARG_MAX_USER_GROUPS},
                {"max-user-conns", required_argument, NULL, ARG_MAX_USER_CONNS},
                {"max-user-fds", required_argument, NULL, ARG_MAX_USER_FDS},
                {"max-world", required_argument, NULL, ARG_MAX_WORLD},
                {"idle-timeout", required_argument, NULL, ARG_IDLE_TIMEOUT},
                {"exit-idle", required_argument, NULL, ARG_EXIT_IDLE},
                {"config", required_argument, NULL, ARG_CONFIG},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, ARG_VERSION},
                {},
        };
        int c, level = LOG_LEVEL_INFO;

        /* --config first: its lines go ahead of the command line's options */
        const char *config = NULL;
        for (int i = 1; i < argc; i++) {
                if (strncmp(argv[i], "--config=", 9) == 0)
                        config = argv[i] + 9;
                else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
                        config = argv[++i];
                else if (strcmp(argv[i], "--") == 0)
                        break;
        }
        _cleanup_(argvec_free) ArgVec av = {0};
        /* --config '' reads none; without --config the default is read if it exists */
        if (!(config && !*config) && config_read(config ? config : DEFAULT_CONFIG, config != NULL,
                                                 opts, &av.args, &av.n) < 0)
                return -EINVAL;
        snprintf(d->config_path, sizeof(d->config_path), "%s",
                 config ? config
                 : av.n ? DEFAULT_CONFIG
                        : "");
        if (!(av.all = calloc((size_t)(argc + av.n + 1), sizeof(char *))))
                return -ENOMEM;
        av.all[0] = argv[0];
        if (av.n) /* memcpy() from NULL is undefined even for no bytes */
                memcpy(av.all + 1, av.args, sizeof(char *) * (size_t)av.n);
        memcpy(av.all + 1 + av.n, argv + 1, sizeof(char *) * (size_t)(argc - 1));
        argc += av.n;
        argv = av.all;
        optind = 0; /* a fresh scan, also when SIGHUP parses again */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);

        d->max_group_bytes =
                pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : 1ull << 30;
        d->max_groups = 1024;
        d->max_user_bytes =
                pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 2ull << 30;
        d->max_user_groups = 64;
        d->max_user_conns = 1024;
        d->max_user_fds = 4096;
        d->max_world = DEVAL_MAX_WORLD;
        d->idle_timeout_s = 24 * 3600;
        d->spin_us = -1;
        d->threads = (int)DV_MIN(DV_MAX(ncpu, 1), 8);
        if (dv_default_socket_path(d->socket_path, sizeof(d->socket_path)) < 0)
                d->socket_path[0] = '\0';
        while ((c = getopt_long(argc, argv, "s:b:l:h", opts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        if (strlen(optarg) >= sizeof(d->socket_path)) {
                                fprintf(stderr, "devald: socket path too long: %s\n", optarg);
                                return -EINVAL;
                        }
                        snprintf(d->socket_path, sizeof(d->socket_path), "%s", optarg);
                        break;
                case 'b':
                        if (strcmp(optarg, "host") && strcmp(optarg, "auto") &&
                            strcmp(optarg, "cuda")) {
                                fprintf(stderr, "devald: unknown backend '%s' (host, cuda, auto)\n",
                                        optarg);
                                return -EINVAL;
                        }
                        snprintf(arg_backend, sizeof(arg_backend), "%s", optarg);
                        break;
                case 'l':
                        if ((level = log_parse_level(optarg)) < 0) {
                                fprintf(stderr, "devald: unknown log level '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_MAX_GROUP_BYTES:
                        if (parse_size(optarg, &d->max_group_bytes) < 0 || !d->max_group_bytes) {
                                fprintf(stderr, "devald: bad --max-group-bytes '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_MAX_GROUPS:
                        d->max_groups = atoi(optarg);
                        if (d->max_groups < 1) {
                                fprintf(stderr, "devald: bad --max-groups '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_MAX_USER_BYTES:
                        if (parse_size(optarg, &d->max_user_bytes) < 0 || !d->max_user_bytes) {
                                fprintf(stderr, "devald: bad --max-user-bytes '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_MAX_USER_GROUPS:
                case ARG_MAX_USER_CONNS:
                case ARG_MAX_USER_FDS:
                case ARG_MAX_WORLD:
                case ARG_IDLE_TIMEOUT:
                case ARG_EXIT_IDLE: {
                        char *end;
                        long v = strtol(optarg, &end, 10);
                        int lo = c == ARG_IDLE_TIMEOUT || c == ARG_EXIT_IDLE ? 0 : 1;
                        long hi = c == ARG_MAX_WORLD ? DEVAL_MAX_WORLD : 1000000000;
                        if (*end || end == optarg || v < lo || v > hi) {
                                fprintf(stderr, "devald: bad --%s '%s' (%d..%ld)\n",
                                        c == ARG_MAX_USER_GROUPS  ? "max-user-groups"
                                        : c == ARG_MAX_USER_CONNS ? "max-user-conns"
                                        : c == ARG_MAX_USER_FDS   ? "max-user-fds"
                                        : c == ARG_MAX_WORLD      ? "max-world"
                                        : c == ARG_EXIT_IDLE      ? "exit-idle"
                                                                  : "idle-timeout",
                                        optarg, lo, hi);
                                return -EINVAL;
                        }
                        *(c == ARG_MAX_USER_GROUPS  ? &d->max_user_groups
                          : c == ARG_MAX_USER_CONNS ? &d->max_user_conns
                          : c == ARG_MAX_USER_FDS   ? &d->max_user_fds
                          : c == ARG_MAX_WORLD      ? &d->max_world
                          : c == ARG_EXIT_IDLE      ? &d->exit_idle_s
                                                    : &d->idle_timeout_s) = (int)v;
                        break;
                }
                case ARG_THREADS:
                        d->threads = atoi(optarg);
                        if (d->threads < 1 || d->threads > 64) {
                                fprintf(stderr, "devald: bad --threads '%s' (1..64)\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_SPIN_US:
                        d->spin_us = atoi(optarg);
                        if (d->spin_us < 0 || d->spin_us > 10000) {
                                fprintf(stderr, "devald: bad --spin-us '%s' (0..10000)\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_CONFIG:
                        break; /* read above */
                case 'h':
                        help();
                        return CONFIG_DONE;
                case ARG_VERSION:
                        printf("devald %s\n", DV_VERSION_STRING);
                        return CONFIG_DONE;
                default:
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "devald: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!d->socket_path[0]) {
                fprintf(stderr, "devald: the default socket path is too long; use --socket\n");
                return -EINVAL;
        }
        log_setup(level);
        return 0;
}

/*
 * SIGHUP: read the configuration and the command line again and take what can change while
 * running: log level, quotas, limits, copy threads and spinning (for groups that form from
 * now on; running groups keep what they started with). The socket and the backend take a
 * restart, and say so. A configuration with errors changes nothing.
 */
void config_reload(Daemon *d, int argc, char **argv) {
        Daemon fresh = {0};
        char backend[sizeof(arg_backend)];
        memcpy(backend, arg_backend, sizeof(backend));
        sd_notify_state("RELOADING=1");
        int r = config_parse(&fresh, argc, argv);
        if (r != 0) {
                log_err("SIGHUP: %s or the command line has errors (above); nothing changed",
                        d->config_path[0] ? d->config_path : "the configuration");
                memcpy(arg_backend, backend, sizeof(backend));
                sd_notify_state("READY=1");
                return;
        }
        if (strcmp(fresh.socket_path, d->socket_path) != 0)
                log_warn("SIGHUP: the socket is now %s, which takes a restart; still %s",
                         fresh.socket_path, d->socket_path);
        if (strcmp(arg_backend, backend) != 0)
                log_warn("SIGHUP: the backend is now %s, which takes a restart; still %s",
                         arg_backend, backend);
        memcpy(arg_backend, backend, sizeof(backend));
        d->max_group_bytes = fresh.max_group_bytes;
        d->max_groups = fresh.max_groups;
        d->max_user_bytes = fresh.max_user_bytes;
        d->max_user_groups = fresh.max_user_groups;
        d->max_user_conns = fresh.max_user_conns;
        d->max_user_fds = fresh.max_user_fds;
        d->max_world = fresh.max_world;
        d->idle_timeout_s = fresh.idle_timeout_s;
        d->exit_idle_s = fresh.exit_idle_s;
        d->threads = fresh.threads;
        d->spin_us = fresh.spin_us;
        memcpy(d->config_path, fresh.config_path, sizeof(d->config_path));
        log_info("SIGHUP: reloaded%s%s: quota %" PRIu64 " bytes per group, %" PRIu64
                 " per user, %d groups, %d per user, %d connections per user, %d ranks per "
                 "group, idle timeout %d s, %d copy threads",
                 d->config_path[0] ? " " : "", d->config_path, d->max_group_bytes,
                 d->max_user_bytes, d->max_groups, d->max_user_groups, d->max_user_conns,
                 d->max_world, d->idle_timeout_s, d->threads);
        sd_notify_state("READY=1");
}
