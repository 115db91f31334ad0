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
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "daemon.h"
#include "log.h"
#include "sd_daemon.h"
#include "sock.h"
#include "util.h"

#define DEFAULT_CONFIG "/etc/deval/devald.conf"

/* What an option sets and how its value is read. */
typedef enum {
        OPT_SOCKET,  /* a path into d->socket_path */
        OPT_DIR,     /* a directory into d->state_dir */
        OPT_BACKEND, /* arg_backend */
        OPT_LEVEL,   /* the log level */
        OPT_SIZE,    /* a uint64_t of d at field, > 0, with K, M or G */
        OPT_INT,     /* an int of d at field, in [lo, hi] */
        OPT_CONFIG,  /* the configuration file, read before anything else */
        OPT_HELP,
        OPT_VERSION
} OptKind;

/*
 * Every option, once: its name, what it sets, whether SIGHUP takes it while devald runs,
 * and its help. getopt's table, the configuration file's known names, --help and the
 * reload all come from here.
 */
typedef struct {
        const char *name;
        char letter; /* its short form, or 0 */
        OptKind kind;
        size_t field; /* OPT_SIZE, OPT_INT: offsetof(Daemon, ...) */
        long lo, hi;  /* OPT_INT */
        bool reload;  /* SIGHUP takes a new value while running */
        const char *arg, *help;
} Opt;

#define FIELD(f) offsetof(Daemon, f)
static const Opt options[] = {
        {"socket", 's', OPT_SOCKET, 0, 0, 0, false, "PATH",
         "listen on PATH (default: $DEVAL_SOCKET, else\n$XDG_RUNTIME_DIR/deval/devald.sock, or\n"
         "/run/deval/devald.sock for root)"},
        {"backend", 'b', OPT_BACKEND, 0, 0, 0, false, "NAME",
         "auto (default: cuda when a GPU is visible, else host),\nhost, or cuda (device groups "
         "on the GPUs)"},
        {"log-level", 'l', OPT_LEVEL, 0, 0, 0, true, "LEVEL", "err, warn, info (default) or debug"},
        {"max-group-bytes", 0, OPT_SIZE, FIELD(max_group_bytes), 0, 0, true, "N",
         "shared memory one group may hold (default: a quarter\nof RAM); suffixes K, M, G"},
        {"max-groups", 0, OPT_INT, FIELD(max_groups), 1, 1000000000, true, "N",
         "groups at once (default 1024)"},
        {"threads", 0, OPT_INT, FIELD(threads), 1, 64, true, "N",
         "copy threads per group (default: online CPUs, max 8)"},
        {"spin-us", 0, OPT_INT, FIELD(spin_us), 0, 10000, true, "N",
         "busy-wait N us for arrivals before sleeping (default:\n20 when the cores outnumber a "
         "group's ranks + 1, else 0)"},
        {"max-user-bytes", 0, OPT_SIZE, FIELD(max_user_bytes), 0, 0, true, "N",
         "shared memory all of one uid's groups may hold\n(default: half of RAM)"},
        {"max-user-groups", 0, OPT_INT, FIELD(max_user_groups), 1, 1000000000, true, "N",
         "groups one uid may have (default 64)"},
        {"max-user-conns", 0, OPT_INT, FIELD(max_user_conns), 1, 1000000000, true, "N",
         "connections one uid may have (default 1024)"},
        {"max-user-fds", 0, OPT_INT, FIELD(max_user_fds), 1, 1000000000, true, "N",
         "descriptors devald may hold for one uid (default\n4096)"},
        {"max-world", 0, OPT_INT, FIELD(max_world), 1, DEVAL_MAX_WORLD, true, "N",
         "ranks per group (default 512)"},
        {"idle-timeout", 0, OPT_INT, FIELD(idle_timeout_s), 0, 1000000000, true, "SECONDS",
         "fail groups with no collective this long (default\n86400; 0: never)"},
        {"exit-idle", 0, OPT_INT, FIELD(exit_idle_s), 0, 1000000000, true, "SECONDS",
         "exit after this long with no group and no client\n(default 0: never; a devald libdeval "
         "starts: 60)"},
        {"resume-keep", 0, OPT_INT, FIELD(resume_keep_s), 0, 1000000000, true, "SECONDS",
         "drop a pass's resume journal idle this long\n(default 3600; 0: never)"},
        {"state-dir", 0, OPT_DIR, 0, 0, 0, false, "DIR",
         "write resume journals through to DIR/journal\n(default: the socket's directory)"},
        {"config", 0, OPT_CONFIG, 0, 0, 0, true, "PATH",
         "options from PATH, one 'option = value' per line,\nbefore the command line's "
         "(default:\n" DEFAULT_CONFIG " if it exists; '' for none);\nSIGHUP reads it again"},
        {"help", 'h', OPT_HELP, 0, 0, 0, false, NULL, "show this help"},
        {"version", 0, OPT_VERSION, 0, 0, 0, false, NULL, "show the version"},
};
#define NOPTS (sizeof(options) / sizeof(options[0]))

static void help(void) {
        printf("Usage: devald [OPTIONS]\n\n"
               "The deval daemon: shared buffers and collectives for distributed evaluation.\n\n");
        for (size_t i = 0; i < NOPTS; i++) {
                const Opt *o = &options[i];
                char lead[48];
                snprintf(lead, sizeof(lead), "%c%c --%s%s%s", o->letter ? '-' : ' ',
                         o->letter ? o->letter : ' ', o->name, o->arg ? "=" : "",
                         o->arg ? o->arg : "");
                printf("  %-26s", lead);
                for (const char *h = o->help; *h;) { /* continuation lines under the first */
                        size_t n = strcspn(h, "\n");
                        printf("%s%.*s\n", h == o->help ? (strlen(lead) > 26 ? " " : "") : "",
                               (int)n, h);
                        h += n;
                        if (*h == '\n' && *++h)
                                printf("%28s", "");
                }
        }
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
static int config_read(const char *path, bool required, char ***ret_args, int *ret_n) {
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
                for (size_t i = 0; i < NOPTS && !known; i++)
                        known = strlen(options[i].name) == klen &&
                                strncmp(options[i].name, p, klen) == 0 &&
                                options[i].kind < OPT_CONFIG;
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

/* Set what o sets from v (its value; NULL for an option without one). */
static int opt_apply(Daemon *d, const Opt *o, const char *v, int *level) {
        char *end;
        switch (o->kind) {
        case OPT_SOCKET:
                if (strlen(v) >= sizeof(d->socket_path)) {
                        fprintf(stderr, "devald: socket path too long: %s\n", v);
                        return -EINVAL;
                }
                snprintf(d->socket_path, sizeof(d->socket_path), "%s", v);
                return 0;
        case OPT_DIR:
                if (strlen(v) >= sizeof(d->state_dir) - 16 || v[0] != '/') {
                        fprintf(stderr,
                                "devald: --state-dir needs an absolute path, shorter "
                                "than %zu bytes: %s\n",
                                sizeof(d->state_dir) - 16, v);
                        return -EINVAL;
                }
                snprintf(d->state_dir, sizeof(d->state_dir), "%s", v);
                return 0;
        case OPT_BACKEND:
                if (strcmp(v, "host") && strcmp(v, "auto") && strcmp(v, "cuda")) {
                        fprintf(stderr, "devald: unknown backend '%s' (host, cuda, auto)\n", v);
                        return -EINVAL;
                }
                snprintf(arg_backend, sizeof(arg_backend), "%s", v);
                return 0;
        case OPT_LEVEL:
                if ((*level = log_parse_level(v)) < 0) {
                        fprintf(stderr, "devald: unknown log level '%s'\n", v);
                        return -EINVAL;
                }
                return 0;
        case OPT_SIZE: {
                uint64_t *f = (uint64_t *)((char *)d + o->field);
                if (parse_size(v, f) < 0 || !*f) {
                        fprintf(stderr, "devald: bad --%s '%s'\n", o->name, v);
                        return -EINVAL;
                }
                return 0;
        }
        case OPT_INT: {
                errno = 0;
                long x = strtol(v, &end, 10);
                if (errno || *end || end == v || x < o->lo || x > o->hi) {
                        fprintf(stderr, "devald: bad --%s '%s' (%ld..%ld)\n", o->name, v, o->lo,
                                o->hi);
                        return -EINVAL;
                }
                *(int *)((char *)d + o->field) = (int)x;
                return 0;
        }
        case OPT_CONFIG:
                return 0; /* read before the others */
        case OPT_HELP:
                help();
                return CONFIG_DONE;
        case OPT_VERSION:
                printf("devald %s\n", DV_VERSION_STRING);
                return CONFIG_DONE;
        }
        return -EINVAL;
}

int config_parse(Daemon *d, int argc, char **argv) {
        struct option longopts[NOPTS + 1];
        char shorts[2 * NOPTS + 1], *sp = shorts;
        for (size_t i = 0; i < NOPTS; i++) {
                const Opt *o = &options[i];
                longopts[i] = (struct option){o->name, o->arg ? required_argument : no_argument,
                                              NULL, 0x100 + (int)i};
                if (o->letter) {
                        *sp++ = o->letter;
                        if (o->arg)
                                *sp++ = ':';
                }
        }
        longopts[NOPTS] = (struct option){0};
        *sp = '\0';
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
        if (!(config && !*config) &&
            config_read(config ? config : DEFAULT_CONFIG, config != NULL, &av.args, &av.n) < 0)
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
        d->resume_keep_s = 3600;
        d->spin_us = -1;
        d->threads = (int)DV_MIN(DV_MAX(ncpu, 1), 8);
        if (dv_default_socket_path(d->socket_path, sizeof(d->socket_path)) < 0)
                d->socket_path[0] = '\0';
        while ((c = getopt_long(argc, argv, shorts, longopts, NULL)) >= 0) {
                const Opt *o = NULL;
                for (size_t k = 0; k < NOPTS && !o; k++)
                        if (c == 0x100 + (int)k || (options[k].letter && c == options[k].letter))
                                o = &options[k];
                int r = o ? opt_apply(d, o, optarg, &level) : -EINVAL; /* '?': getopt said why */
                if (r != 0)
                        return r;
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
        for (size_t i = 0; i < NOPTS; i++) { /* what the table says SIGHUP takes */
                const Opt *o = &options[i];
                if (o->reload && o->kind == OPT_SIZE)
                        memcpy((char *)d + o->field, (char *)&fresh + o->field, sizeof(uint64_t));
                else if (o->reload && o->kind == OPT_INT)
                        memcpy((char *)d + o->field, (char *)&fresh + o->field, sizeof(int));
        }
        memcpy(d->config_path, fresh.config_path, sizeof(d->config_path));
        log_info("SIGHUP: reloaded%s%s: quota %" PRIu64 " bytes per group, %" PRIu64
                 " per user, %d groups, %d per user, %d connections per user, %d ranks per "
                 "group, idle timeout %d s, %d copy threads",
                 d->config_path[0] ? " " : "", d->config_path, d->max_group_bytes,
                 d->max_user_bytes, d->max_groups, d->max_user_groups, d->max_user_conns,
                 d->max_world, d->idle_timeout_s, d->threads);
        sd_notify_state("READY=1");
}
