/* SPDX-License-Identifier: MIT */
/*
 * deval-ctl - devald's status and administration tool.
 *
 *   deval-ctl [--socket PATH] [--json[=pretty|short]] COMMAND
 *
 * COMMAND: status, groups, group NAME, watch [NAME], abort NAME, dump NAME, topo.
 * Exit status: 0 done, 1 devald said no, 2 usage, 3 devald unreachable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "deval.h"

#include "sock.h"
#include "util.h"
#include "wire.h"

enum {
        JSON_OFF,
        JSON_PRETTY,
        JSON_SHORT
};

static const char *arg_socket;
static int arg_json = JSON_OFF;
/* Exit statuses: 0 done; 1 devald answered no (no such group, not permitted, failed);
 * 2 a usage error; 3 devald could not be reached or did not answer. */
enum {
        EXIT_REFUSED = 1,
        EXIT_USAGE = 2,
        EXIT_UNREACHABLE = 3
};
static bool unreachable;          /* the last request never got an answer */
static double arg_interval = 1.0; /* watch: seconds between refreshes */
static long arg_count;            /* watch: refreshes; 0: until interrupted */

static const char *state_name(uint32_t s) {
        switch (s) {
        case DV_GROUP_FORMING:
                return "forming";
        case DV_GROUP_STARTING:
                return "starting";
        case DV_GROUP_ACTIVE:
                return "active";
        case DV_GROUP_FAILED:
                return "failed";
        case DV_GROUP_CLOSING:
                return "closing";
        }
        return "unknown";
}

/* Group names are user text: escape them for JSON. */
static void json_string(const char *s) {
        putchar('"');
        for (; *s; s++) {
                unsigned char c = (unsigned char)*s;
                if (c == '"' || c == '\\')
                        printf("\\%c", c);
                else if (c < 0x20)
                        printf("\\u%04x", c);
                else
                        putchar(c);
        }
        putchar('"');
}

/* A pass's rate (samples a second since it opened) and the seconds left at it; -1: unknown. */
static void pass_rate(const DvPassInfo *p, double *rate, double *eta) {
        *rate = p->age_us ? (double)p->samples / ((double)p->age_us / 1e6) : -1;
        *eta = *rate > 0 ? (double)(p->total - p->samples) / *rate : -1;
}

/* ,"pass":{...} of a group (null when no pass is open) */
static void pass_json(const DvPassInfo *p, const char *sp) {
        printf(",%s\"pass\":%s", sp, sp);
        if (p->total < 0) {
                printf("null");
                return;
        }
        double rate, eta;
        pass_rate(p, &rate, &eta);
        printf("{\"samples\":%s%" PRId64 ",%s\"total\":%s%" PRId64 ",%s\"age_us\":%s%" PRIu64
               ",%s\"rate\":%s%.1f,%s\"eta_s\":%s%.1f,%s\"batches_min\":%s%u,%s\"batches_max\":%s%u"
               ",%s\"lag_rank\":%s%d,%s\"lag_batches\":%s%u,%s\"ended\":%s%u}",
               sp, p->samples, sp, sp, p->total, sp, sp, p->age_us, sp, sp, rate, sp, sp, eta, sp,
               sp, p->batches_min, sp, sp, p->batches_max, sp, sp, p->lag_rank, sp, sp,
               p->batches_max - p->batches_min, sp, sp, p->ended);
}

/* One line of a group's open pass: its samples, rate, ETA, and the rank that lags. */
static void pass_line(const char *name, const DvPassInfo *p) {
        double rate, eta;
        pass_rate(p, &rate, &eta);
        printf("eval pass of '%s': %" PRId64 " of %" PRId64 " samples (%.1f%%)", name, p->samples,
               p->total, p->total ? 100.0 * (double)p->samples / (double)p->total : 100.0);
        if (rate >= 0)
                printf(", %.1f samples/s", rate);
        if (eta >= 0)
                printf(", ETA %.1f s", eta);
        printf("; batches %u", p->batches_min);
        if (p->batches_max != p->batches_min)
                printf("..%u", p->batches_max);
        printf(" a rank");
        if (p->lag_rank >= 0)
                printf(", rank %d lags by %u", p->lag_rank, p->batches_max - p->batches_min);
        if (p->ended)
                printf(", %u ended", p->ended);
        printf("\n");
}

static void print_json(const DvStatusReply *r, bool groups_only) {
        const char *nl = arg_json == JSON_PRETTY ? "\n" : "";
        const char *in1 = arg_json == JSON_PRETTY ? "  " : "";
        const char *in2 = arg_json == JSON_PRETTY ? "    " : "";
        const char *sp = arg_json == JSON_PRETTY ? " " : "";

        if (groups_only) { /* the array alone */
                in2 = in1;
                goto groups;
        }
        printf("{%s%s\"pid\":%s%d,%s%s\"version\":%s", nl, in1, sp, r->pid, nl, in1, sp);
        json_string(r->version);
        printf(",%s%s\"backend\":%s", nl, in1, sp);
        json_string(r->backend);
        printf(",%s%s\"uptime_us\":%s%" PRIu64 ",%s%s\"max_group_bytes\":%s%" PRIu64
               ",%s%s\"unexpected_fds\":%s%" PRIu64 ",%s%s\"total_groups\":%s%u,%s%s\"groups\":%s[",
               nl, in1, sp, r->uptime_us, nl, in1, sp, r->max_group_bytes, nl, in1, sp,
               r->unexpected_fds, nl, in1, sp, r->total_groups, nl, in1, sp);
groups:
        if (groups_only)
                printf("[");
        for (uint32_t i = 0; i < r->ngroups; i++) {
                const DvGroupInfo *g = &r->groups[i];
                printf("%s%s%s{\"name\":%s", i ? "," : "", nl, in2, sp);
                json_string(g->name);
                printf(",%s\"uid\":%s%u,%s\"state\":%s\"%s\",%s\"world_size\":%s%d,%s\"joined\":%s%"
                       "d,"
                       "%s\"collectives\":%s%" PRIu64 ",%s\"bytes_moved\":%s%" PRIu64
                       ",%s\"bytes_mapped\":%s%" PRIu64 ",%s\"age_us\":%s%" PRIu64
                       ",%s\"launcher\":%s",
                       sp, sp, g->uid, sp, sp, state_name(g->state), sp, sp, g->world_size, sp, sp,
                       g->joined, sp, sp, g->collectives, sp, sp, g->bytes_moved, sp, sp,
                       g->bytes_mapped, sp, sp, g->age_us, sp, sp);
                char launcher[DV_LAUNCHER_MAX];
                snprintf(launcher, sizeof(launcher), "%.*s", DV_LAUNCHER_MAX - 1, g->launcher);
                json_string(launcher);
                pass_json(&g->pass, sp);
                printf("}");
        }
        if (groups_only)
                printf("%s]\n", r->ngroups ? nl : "");
        else
                printf("%s%s]%s}\n", r->ngroups ? nl : "", r->ngroups ? in1 : "", nl);
}

static void human_bytes(uint64_t b, char *buf, size_t len) {
        const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
        double v = (double)b;
        int u = 0;
        while (v >= 1024 && u < 4) {
                v /= 1024;
                u++;
        }
        if (u == 0)
                snprintf(buf, len, "%" PRIu64 " B", b);
        else
                snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void print_table(const DvStatusReply *r, bool groups_only) {
        char quota[32];
        human_bytes(r->max_group_bytes, quota, sizeof(quota));
        if (!groups_only) {
                printf("devald pid %d, version %s, backend %s, up %.1f s, quota %s per group\n",
                       r->pid, r->version, r->backend, (double)r->uptime_us / 1e6, quota);
                /* which binary answers: another checkout's devald may hold the socket */
                char link[64], exe[PATH_MAX];
                snprintf(link, sizeof(link), "/proc/%d/exe", (int)r->pid);
                ssize_t n = readlink(link, exe, sizeof(exe) - 1);
                if (n > 0) {
                        exe[n] = '\0';
                        printf("devald is %s\n", exe);
                }
                printf("%u group%s\n", r->total_groups, r->total_groups == 1 ? "" : "s");
                if (r->unexpected_fds)
                        printf("%" PRIu64 " file descriptors sent by clients unasked were closed\n",
                               r->unexpected_fds);
        }
        if (!r->ngroups) {
                if (groups_only)
                        printf("no groups\n");
                return;
        }
        printf("%-30s %5s %6s %11s %11s %11s %-8s %s\n", "GROUP", "WORLD", "JOINED", "COLLECTIVES",
               "MOVED", "MAPPED", "STATE", "LAUNCHER");
        for (uint32_t i = 0; i < r->ngroups; i++) {
                const DvGroupInfo *g = &r->groups[i];
                char moved[32], mapped[32];
                human_bytes(g->bytes_moved, moved, sizeof(moved));
                human_bytes(g->bytes_mapped, mapped, sizeof(mapped));
                printf("%-30s %5d %6d %11" PRIu64 " %11s %11s %-8s %.*s\n", g->name, g->world_size,
                       g->joined, g->collectives, moved, mapped, state_name(g->state),
                       DV_LAUNCHER_MAX - 1, g->launcher[0] ? g->launcher : "-");
        }
        if (r->ngroups < r->total_groups)
                printf("(%u more not shown)\n", r->total_groups - r->ngroups);
        for (uint32_t i = 0; i < r->ngroups; i++)
                if (r->groups[i].pass.total >= 0)
                        pass_line(r->groups[i].name, &r->groups[i].pass);
}

/* Connect to devald; -1 after saying why on stderr. */
static int ctl_connect(char *path, size_t len) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};

        bool named; /* (the system devald's socket when one answers, else this user's) */
        if (dv_client_socket_path(arg_socket, path, len, &named) < 0) {
                fprintf(stderr, "deval-ctl: the socket path is too long\n");
                return -1;
        }
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                unreachable = true;
                fprintf(stderr, "deval-ctl: cannot reach devald at %s: %s\n", path,
                        strerror(errno));
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        return fd;
}

/*
 * Send req and receive one answer of at most cap bytes, and the descriptor that came with
 * it into *ret_fd when ret_fd is not NULL (-1: none); its length, or -1 (said why).
 */
static ssize_t ctl_request_fd(const void *req, size_t len, void *buf, size_t cap, int *ret_fd) {
        char p[108];
        unreachable = false;
        _cleanup_(closep) int fd = ctl_connect(p, sizeof(p));
        if (fd < 0)
                return -1;
        if (dv_send_msg(fd, req, len, NULL, 0, 0) < 0) {
                unreachable = true;
                fprintf(stderr, "deval-ctl: devald at %s hung up\n", p);
                return -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 5000) <= 0) {
                unreachable = true;
                fprintf(stderr, "deval-ctl: devald at %s did not answer\n", p);
                return -1;
        }
        int fds[DV_MAX_FDS], nfds = ret_fd ? 1 : 0;
        ssize_t n = dv_recv_msg(fd, buf, cap, fds, &nfds, 0);
        if (n < (ssize_t)sizeof(DvMsgHdr) || ((DvMsgHdr *)buf)->version != DV_PROTO_VERSION) {
                fprintf(stderr, "deval-ctl: devald at %s sent a malformed answer\n", p);
                for (int i = 0; n >= 0 && i < nfds; i++)
                        close(fds[i]);
                return -1;
        }
        if (ret_fd)
                *ret_fd = nfds ? fds[0] : -1;
        return n;
}

static ssize_t ctl_request(const void *req, size_t len, void *buf, size_t cap) {
        return ctl_request_fd(req, len, buf, cap, NULL);
}

/* A DvReply with a failure: say it, exit status 1. */
static int ctl_failed(const void *buf, ssize_t n) {
        const DvReply *r = buf;
        if ((size_t)n != sizeof(DvReply) || r->hdr.type != DV_MSG_REPLY)
                return 0;
        if (r->status == 0)
                return 0;
        fprintf(stderr, "deval-ctl: %s: %.*s\n", deval_strerror(r->status), DV_MSG_MAX, r->msg);
        return 1;
}

/* status: devald and its groups; groups_only: just the groups (a table, or a JSON array). */
static int cmd_status(bool groups_only) {
        DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_STATUS};
        size_t cap = sizeof(DvStatusReply) + DV_STATUS_MAX_GROUPS * sizeof(DvGroupInfo);
        _cleanup_(freep) DvStatusReply *r = calloc(1, cap);
        if (!r)
                return 1;
        ssize_t n = ctl_request(&req, sizeof(req), r, cap);
        if (n < 0)
                return 1;
        if (n < (ssize_t)sizeof(DvStatusReply) || r->hdr.type != DV_MSG_STATUS ||
            r->ngroups > DV_STATUS_MAX_GROUPS ||
            (size_t)n != sizeof(DvStatusReply) + r->ngroups * sizeof(DvGroupInfo)) {
                fprintf(stderr, "deval-ctl: devald sent a malformed status\n");
                return 1;
        }
        r->version[sizeof(r->version) - 1] = r->backend[sizeof(r->backend) - 1] = '\0';
        for (uint32_t i = 0; i < r->ngroups; i++)
                r->groups[i].name[DV_GROUP_NAME_MAX - 1] = '\0';
        if (arg_json)
                print_json(r, groups_only);
        else
                print_table(r, groups_only);
        return 0;
}

static const char *pass_state(uint32_t s) {
        switch (s) {
        case DV_PASS_RANK_IN:
                return "in";
        case DV_PASS_RANK_ENDED:
                return "ended";
        }
        return "-";
}

static const char *rank_state(uint32_t s) {
        switch (s) {
        case DV_RANK_JOINED:
                return "joined";
        case DV_RANK_LEFT:
                return "left";
        case DV_RANK_DEAD:
                return "dead";
        case DV_RANK_STOPPED:
                return "stopped";
        }
        return "-";
}

/*
 * A group that spans machines is, at this devald, the group of this machine's ranks, named
 * after it and the node ("NAME.n1"): name the one that holds NAME's ranks here, when name is
 * not a group here itself. Return: name, or the local group's name in buf.
 */
static const char *span_local(const char *name, char *buf, size_t len) {
        DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_STATUS};
        size_t cap = sizeof(DvStatusReply) + DV_STATUS_MAX_GROUPS * sizeof(DvGroupInfo);
        _cleanup_(freep) DvStatusReply *r = calloc(1, cap);
        if (!r || ctl_request(&req, sizeof(req), r, cap) < (ssize_t)sizeof(DvStatusReply) ||
            r->hdr.type != DV_MSG_STATUS || r->ngroups > DV_STATUS_MAX_GROUPS)
                return name;
        size_t n = strlen(name), found = 0;
        for (uint32_t i = 0; i < r->ngroups; i++) {
                const char *g = r->groups[i].name;
                if (!memchr(g, 0, DV_GROUP_NAME_MAX))
                        continue;
                if (strcmp(g, name) == 0)
                        return name;
                if (strncmp(g, name, n) == 0 && strncmp(g + n, ".n", 2) == 0 && g[n + 2] &&
                    strspn(g + n + 2, "0123456789") == strlen(g + n + 2)) {
                        snprintf(buf, len, "%s", g);
                        found++;
                }
        }
        return found == 1 ? buf : name;
}

static void print_span(const DvGroupReply *r, const char *sp) {
        const DvSpanInfo *s = &r->span;
        int local = r->nranks < DEVAL_MAX_WORLD ? (int)r->nranks : DEVAL_MAX_WORLD;
        int listed = s->listed < DV_SPAN_NODES ? s->listed : DV_SPAN_NODES;
        if (arg_json) {
                printf(",%s\"span\":%s", sp, sp);
                if (s->nodes <= 0) {
                        printf("null");
                        return;
                }
                printf("{\"group\":%s", sp);
                json_string(s->group);
                printf(",%s\"node\":%s%d,%s\"nodes\":%s%d,%s\"world_size\":%s%d,%s\"ranks\":%s[",
                       sp, sp, s->node, sp, sp, s->nodes, sp, sp, s->world, sp, sp);
                for (int k = 0; k < local; k++)
                        printf("%s%d", k ? "," : "", s->ranks[k]);
                printf("],%s\"node_list\":%s[", sp, sp);
                for (int n = 0; n < listed; n++) {
                        printf("%s{\"node\":%s%d,%s\"host\":%s", n ? "," : "", sp, n, sp, sp);
                        json_string(s->node_info[n].host);
                        printf(",%s\"ranks\":%s%d,%s\"leader\":%s%d}", sp, sp,
                               s->node_info[n].nranks, sp, sp, s->node_info[n].leader);
                }
                printf("]}");
                return;
        }
        if (s->nodes <= 0)
                return;
        const DvSpanNode *me = s->node < listed ? &s->node_info[s->node] : NULL;
        printf("spans %d machines as group '%s' of %d ranks: this is node %d", s->nodes, s->group,
               s->world, s->node);
        if (me)
                printf(" (host %s), led by rank %d", me->host, me->leader);
        printf("; its ranks here are ");
        for (int k = 0; k < local; k++)
                printf("%s%d", k ? ", " : "", s->ranks[k]);
        printf(" (local ranks 0..%d)\n", local - 1);
        for (int n = 0; n < listed; n++)
                if (n != s->node)
                        printf("  node %d: host %s, %d rank%s, led by rank %d\n", n,
                               s->node_info[n].host, s->node_info[n].nranks,
                               s->node_info[n].nranks == 1 ? "" : "s", s->node_info[n].leader);
        if (s->nodes > listed)
                printf("  and %d more nodes\n", s->nodes - listed);
}

static int cmd_group(const char *name) {
        DvNameReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_GROUP}};
        char local[DV_GROUP_NAME_MAX];
        name = span_local(name, local, sizeof(local));
        size_t cap = sizeof(DvGroupReply) + DEVAL_MAX_WORLD * sizeof(DvRankInfo);
        _cleanup_(freep) DvGroupReply *r = calloc(1, cap);
        if (!r)
                return 1;
        snprintf(req.name, sizeof(req.name), "%s", name);
        ssize_t n = ctl_request(&req, sizeof(req), r, cap);
        if (n < 0 || ctl_failed(r, n))
                return 1;
        if (n < (ssize_t)sizeof(DvGroupReply) || r->hdr.type != DV_MSG_GROUP ||
            r->nranks > DEVAL_MAX_WORLD ||
            (size_t)n != sizeof(DvGroupReply) + r->nranks * sizeof(DvRankInfo)) {
                fprintf(stderr, "deval-ctl: devald sent a malformed answer\n");
                return 1;
        }
        r->info.name[DV_GROUP_NAME_MAX - 1] = '\0';
        r->abort_msg[DV_MSG_MAX - 1] = '\0';
        r->worker_cpus[sizeof(r->worker_cpus) - 1] = '\0';
        r->span.group[DV_GROUP_NAME_MAX - 1] = '\0';
        for (int i = 0; i < DV_SPAN_NODES; i++)
                r->span.node_info[i].host[sizeof(r->span.node_info[i].host) - 1] = '\0';
        const DvGroupInfo *g = &r->info;
        if (arg_json) {
                const char *sp = arg_json == JSON_PRETTY ? " " : "";
                printf("{\"name\":%s", sp);
                json_string(g->name);
                printf(",%s\"state\":%s\"%s\",%s\"uid\":%s%u,%s\"world_size\":%s%d,%s\"joined\":%s%"
                       "d,"
                       "%s\"collectives\":%s%" PRIu64 ",%s\"bytes_moved\":%s%" PRIu64
                       ",%s\"bytes_mapped\":%s%" PRIu64
                       ",%s\"waiting_for\":%s%u,%s\"waiting_ms\":%s%u,%s\"timeout_ms\":%s%d,"
                       "%s\"p50_us\":%s%u,%s\"p99_us\":%s%u,%s\"latency_n\":%s%u,%s\"failure\":%s",
                       sp, sp, state_name(g->state), sp, sp, g->uid, sp, sp, g->world_size, sp, sp,
                       g->joined, sp, sp, g->collectives, sp, sp, g->bytes_moved, sp, sp,
                       g->bytes_mapped, sp, sp, r->waiting_seq, sp, sp, r->waiting_ms, sp, sp,
                       r->timeout_ms, sp, sp, r->p50_us, sp, sp, r->p99_us, sp, sp, r->latency_n,
                       sp, sp);
                json_string(r->abort_msg);
                printf(",%s\"worker_tid\":%s%d,%s\"numa\":%s%d,%s\"worker_cpus\":%s", sp, sp,
                       r->worker_tid, sp, sp, r->numa, sp, sp);
                json_string(r->worker_cpus);
                pass_json(&g->pass, sp);
                print_span(r, sp);
                printf(",%s\"ranks\":%s[", sp, sp);
                for (uint32_t k = 0; k < r->nranks; k++) {
                        const DvRankInfo *ri = &r->ranks[k];
                        printf("%s{\"rank\":%s%d,%s\"pid\":%s%d,%s\"state\":%s\"%s\",%s\"arrived\":"
                               "%s%s,"
                               "%s\"last_arrived_at\":%s%u,%s\"input_bytes\":%s%" PRIu64
                               ",%s\"times_last\":%s%" PRIu64 ",%s\"late_us\":%s%" PRIu64
                               ",%s\"numa\":%s%d,%s\"pass_state\":%s\"%s\",%s\"pass_batches\":%s%u"
                               ",%s\"pass_samples\":%s%" PRId64 "}",
                               k ? "," : "", sp, ri->rank, sp, sp, ri->pid, sp, sp,
                               rank_state(ri->state), sp, sp,
                               ri->arrived_seq == r->waiting_seq ? "true" : "false", sp, sp,
                               ri->arrived_seq, sp, sp, ri->input_bytes, sp, sp, ri->times_last, sp,
                               sp, ri->late_us, sp, sp, ri->numa, sp, sp,
                               pass_state(ri->pass_state), sp, sp, ri->pass_batches, sp, sp,
                               ri->pass_samples);
                }
                printf("]}\n");
                return 0;
        }
        char moved[32], mapped[32];
        human_bytes(g->bytes_moved, moved, sizeof(moved));
        human_bytes(g->bytes_mapped, mapped, sizeof(mapped));
        printf("group '%s': %s, uid %u, %d of %d ranks joined, %" PRIu64
               " collectives, %s moved, %s mapped, up %.1f s\n",
               g->name, state_name(g->state), g->uid, g->joined, g->world_size, g->collectives,
               moved, mapped, (double)g->age_us / 1e6);
        print_span(r, "");
        if (r->abort_msg[0])
                printf("failed: %s\n", r->abort_msg);
        else if (g->state == DV_GROUP_ACTIVE && r->waiting_ms)
                printf("waiting for collective #%u for %.1f s (timeout %d ms)\n", r->waiting_seq,
                       r->waiting_ms / 1e3, r->timeout_ms);
        else if (g->state == DV_GROUP_ACTIVE)
                printf("waiting for collective #%u (timeout %d ms)\n", r->waiting_seq,
                       r->timeout_ms);
        if (r->latency_n)
                printf("collective latency, first arrival to done: p50 %u us, p99 %u us (last "
                       "%u)\n",
                       r->p50_us, r->p99_us, r->latency_n);
        bool pass = g->pass.total >= 0;
        if (pass)
                pass_line(g->name, &g->pass);
        if (r->worker_cpus[0])
                printf("worker: thread %d on NUMA node %d, cpus %s; the output prefers node %d\n",
                       r->worker_tid, r->numa, r->worker_cpus, r->numa);
        printf("%5s %8s %-7s %-20s %11s %4s %9s %10s", "RANK", "PID", "STATE", "ARRIVED", "INPUT",
               "NODE", "LAST", "LATE(avg)");
        printf(pass ? " %8s %10s %s\n" : "\n", "BATCHES", "SAMPLES", "PASS");
        for (uint32_t k = 0; k < r->nranks; k++) {
                const DvRankInfo *ri = &r->ranks[k];
                char in[32], arrived[32];
                human_bytes(ri->input_bytes, in, sizeof(in));
                if (g->state != DV_GROUP_ACTIVE)
                        snprintf(arrived, sizeof(arrived), "-");
                else if (ri->arrived_seq == r->waiting_seq)
                        snprintf(arrived, sizeof(arrived), "yes");
                else
                        snprintf(arrived, sizeof(arrived), "no (last #%u)", ri->arrived_seq);
                char late[32] = "-";
                if (ri->times_last)
                        snprintf(late, sizeof(late), "%.1f ms", (double)ri->late_us / 1000);
                char node[16] = "-";
                if (ri->numa >= 0)
                        snprintf(node, sizeof(node), "%d", ri->numa);
                printf("%5d %8d %-7s %-20s %11s %4s %9" PRIu64 " %10s", ri->rank, ri->pid,
                       rank_state(ri->state), arrived, in, node, ri->times_last, late);
                if (pass)
                        printf(" %8u %10" PRId64 " %s", ri->pass_batches, ri->pass_samples,
                               pass_state(ri->pass_state));
                printf("\n");
        }
        return 0;
}

static void uuid_str(const uint8_t *u, char *buf) {
        char *p = buf;
        for (int i = 0; i < 16; i++) {
                if (i == 4 || i == 6 || i == 8 || i == 10)
                        *p++ = '-';
                p += sprintf(p, "%02x", u[i]);
        }
}

static int cmd_topo(void) {
        DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_TOPO};
        _cleanup_(freep) DvTopoReply *r = calloc(1, sizeof(*r));
        if (!r)
                return 1;
        ssize_t n = ctl_request(&req, sizeof(req), r, sizeof(*r));
        if (n < 0 || ctl_failed(r, n))
                return 1;
        if ((size_t)n != sizeof(*r) || r->hdr.type != DV_MSG_TOPO ||
            r->nnodes > DV_TOPO_MAX_NODES || r->ngpus > DV_MAX_GPUS) {
                fprintf(stderr, "deval-ctl: devald sent a malformed answer\n");
                return 1;
        }
        for (uint32_t i = 0; i < r->nnodes; i++)
                r->nodes[i].cpus[sizeof(r->nodes[i].cpus) - 1] = '\0';
        for (uint32_t i = 0; i < r->ngpus; i++) {
                r->gpus[i].cpus[sizeof(r->gpus[i].cpus) - 1] = '\0';
                r->gpus[i].busid[sizeof(r->gpus[i].busid) - 1] = '\0';
        }
        if (arg_json) {
                const char *sp = arg_json == JSON_PRETTY ? " " : "";
                printf("{\"hwloc\":%s%s,%s\"cores\":%s%u,%s\"pus\":%s%u,%s\"numa_nodes\":%s[", sp,
                       r->hwloc ? "true" : "false", sp, sp, r->cores, sp, sp, r->pus, sp, sp);
                for (uint32_t i = 0; i < r->nnodes; i++) {
                        printf("%s{\"os_index\":%s%d,%s\"memory\":%s%" PRIu64 ",%s\"cpus\":%s",
                               i ? "," : "", sp, r->nodes[i].os_index, sp, sp, r->nodes[i].memory,
                               sp, sp);
                        json_string(r->nodes[i].cpus);
                        printf("}");
                }
                printf("],%s\"gpus\":%s[", sp, sp);
                for (uint32_t i = 0; i < r->ngpus; i++) {
                        char u[40];
                        uuid_str(r->gpus[i].uuid, u);
                        printf("%s{\"uuid\":%s\"%s\",%s\"pci\":%s", i ? "," : "", sp, u, sp, sp);
                        json_string(r->gpus[i].busid);
                        printf(",%s\"numa\":%s%d,%s\"cpus\":%s", sp, sp, r->gpus[i].numa, sp, sp);
                        json_string(r->gpus[i].cpus);
                        printf(",%s\"p2p\":%s[", sp, sp);
                        for (uint32_t k = 0, n = 0; k < r->ngpus; k++)
                                if (r->gpus[i].p2p >> k & 1)
                                        printf("%s%u", n++ ? "," : "", k);
                        printf("]}");
                }
                printf("]}\n");
                return 0;
        }
        printf("%u cores, %u hardware threads%s\n", r->cores, r->pus,
               r->hwloc ? "" : " (devald was built without hwloc: no more detail)");
        for (uint32_t i = 0; i < r->nnodes; i++) {
                char mem[32];
                human_bytes(r->nodes[i].memory, mem, sizeof(mem));
                printf("NUMA node %d: cpus %s, %s\n", r->nodes[i].os_index, r->nodes[i].cpus, mem);
        }
        if (!r->ngpus)
                printf("no GPUs (backend host)\n");
        for (uint32_t i = 0; i < r->ngpus; i++) {
                char u[40];
                uuid_str(r->gpus[i].uuid, u);
                printf("GPU %u: GPU-%s, PCI %s, NUMA node %d, near cpus %s\n", i, u,
                       r->gpus[i].busid[0] ? r->gpus[i].busid : "?", r->gpus[i].numa,
                       r->gpus[i].cpus);
        }
        if (r->ngpus > 1) { /* who reads whom: a row per GPU running the copy kernel */
                printf("P2P (row reads column directly; '-' staged through host memory)\n     ");
                for (uint32_t k = 0; k < r->ngpus; k++)
                        printf(" %3u", k);
                printf("\n");
                for (uint32_t i = 0; i < r->ngpus; i++) {
                        printf("  %3u", i);
                        for (uint32_t k = 0; k < r->ngpus; k++)
                                printf(" %3s", i == k ? "x" : r->gpus[i].p2p >> k & 1 ? "ok" : "-");
                        printf("\n");
                }
        }
        return 0;
}

static int cmd_abort(const char *name) {
        DvNameReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_ABORT}};
        DvReply r;
        snprintf(req.name, sizeof(req.name), "%s", name);
        ssize_t n = ctl_request(&req, sizeof(req), &r, sizeof(r));
        if (n < 0 || ctl_failed(&r, n))
                return 1;
        if (!arg_json)
                printf("group '%s' aborted\n", name);
        return 0;
}

/* The group's flight recorder: devald's JSON, as it is. */
static int cmd_dump(const char *name) {
        DvNameReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_DUMP}};
        DvReply r;
        int fd = -1;
        snprintf(req.name, sizeof(req.name), "%s", name);
        ssize_t n = ctl_request_fd(&req, sizeof(req), &r, sizeof(r), &fd);
        _cleanup_(closep) int owned = fd;
        if (n < 0 || ctl_failed(&r, n))
                return 1;
        struct stat st;
        if ((size_t)n != sizeof(r) || fd < 0 || fstat(fd, &st) < 0 ||
            (uint64_t)st.st_size != r.size[0] || r.size[0] > (1ull << 30)) {
                fprintf(stderr, "deval-ctl: devald sent a malformed answer\n");
                return 1;
        }
        _cleanup_(freep) char *json = malloc(r.size[0] + 1);
        if (!json || pread(fd, json, r.size[0], 0) != (ssize_t)r.size[0]) {
                fprintf(stderr, "deval-ctl: cannot read the recorder: %s\n", strerror(errno));
                return 1;
        }
        fwrite(json, 1, r.size[0], stdout);
        return 0;
}

/* resume: the journals devald keeps of this uid's passes that may resume. */
static int cmd_resume(void) {
        DvJournalReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_JOURNALS}};
        size_t cap = sizeof(DvJournalList) + DV_JOURNALS_MAX * sizeof(DvJournalInfo);
        _cleanup_(freep) DvJournalList *r = calloc(1, cap);
        if (!r)
                return 1;
        ssize_t n = ctl_request(&req, sizeof(req), r, cap);
        if (n < 0)
                return 1;
        if (n < (ssize_t)sizeof(*r) || r->hdr.type != DV_MSG_JOURNALS || r->n > DV_JOURNALS_MAX ||
            (size_t)n != sizeof(*r) + r->n * sizeof(DvJournalInfo)) {
                if (n >= (ssize_t)sizeof(DvReply) && ctl_failed((DvReply *)r, n))
                        return 1;
                fprintf(stderr, "deval-ctl: devald sent a malformed answer\n");
                return 1;
        }
        if (arg_json)
                printf("{\"keep_s\": %u, \"total\": %u, \"journals\": [", r->keep_s, r->total);
        else if (r->n)
                printf("%-28s %-24s %4s %9s %8s %12s %8s %s\n", "KEY", "GROUP", "PASS", "RANK",
                       "BATCHES", "BYTES", "IDLE_S", "KEPT IN");
        for (uint32_t i = 0; i < r->n; i++) {
                DvJournalInfo *j = &r->j[i];
                j->key[sizeof(j->key) - 1] = j->group[sizeof(j->group) - 1] = '\0';
                if (arg_json) {
                        printf("%s{\"key\": ", i ? ", " : "");
                        json_string(j->key);
                        printf(", \"group\": ");
                        json_string(j->group);
                        printf(", \"pass\": %u, \"rank\": %d, \"world\": %d, \"batches\": "
                               "%" PRIu64 ", \"bytes\": %" PRIu64 ", \"used\": %" PRIu64
                               ", \"idle_s\": %" PRIu64 ", \"file\": %s}",
                               j->ordinal, j->rank, j->world, j->batches, j->bytes, j->used,
                               j->idle_s, j->file ? "true" : "false");
                        continue;
                }
                char rank[24];
                snprintf(rank, sizeof(rank), "%d/%d", j->rank, j->world);
                printf("%-28s %-24s %4u %9s %8" PRIu64 " %12" PRIu64 " %8" PRIu64 " %s\n", j->key,
                       j->group, j->ordinal, rank, j->batches, j->bytes, j->idle_s,
                       j->file ? "file" : "memory");
        }
        if (arg_json)
                printf("]}\n");
        else if (!r->n)
                printf("no resume journals (devald drops one idle for %u s)\n", r->keep_s);
        else if (r->total > r->n)
                printf("... and %u more\n", r->total - r->n);
        return 0;
}

/* resume drop KEY|all: forget the journals of a job (every one of the uid's). */
static int cmd_resume_drop(const char *key) {
        DvJournalReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_JOURNAL},
                            .action = DV_JOURNAL_DROP_KEY};
        DvReply r;
        if (strlen(key) >= sizeof(req.key)) {
                fprintf(stderr, "deval-ctl: no resume key is that long: %s\n", key);
                return EXIT_USAGE;
        }
        if (strcmp(key, "all") != 0)
                snprintf(req.key, sizeof(req.key), "%s", key);
        ssize_t n = ctl_request(&req, sizeof(req), &r, sizeof(r));
        if (n < 0 || ctl_failed(&r, n))
                return 1;
        if (!arg_json)
                printf("%.*s\n", (int)sizeof(r.msg), r.msg);
        return 0;
}

static int run_command(const char *cmd, int nargs, char **args);

/*
 * watch [NAME]: status, or one group's view, again every --interval seconds until ^C (or
 * --count times): on a terminal the screen is redrawn; with --json, one object per line.
 */
static int cmd_watch(const char *name) {
        bool tty = isatty(STDOUT_FILENO) && !arg_json;
        int r = 0;
        for (long i = 0; arg_count <= 0 || i < arg_count; i++) {
                if (i)
                        usleep((useconds_t)(arg_interval * 1e6));
                if (tty)
                        printf("\033[H\033[2J");
                if (!arg_json) {
                        time_t t = time(NULL);
                        char when[64];
                        strftime(when, sizeof(when), "%H:%M:%S", localtime(&t));
                        printf("deval-ctl watch%s%s, every %.1f s, %s\n\n", name ? " " : "",
                               name ? name : "", arg_interval, when);
                }
                char *one[1] = {(char *)name};
                r = run_command(name ? "group" : "status", name ? 1 : 0, one);
                fflush(stdout);
        }
        return r;
}

static int run_command(const char *cmd, int nargs, char **args) {
        if (strcmp(cmd, "status") == 0 && nargs == 0)
                return cmd_status(false);
        if (strcmp(cmd, "groups") == 0 && nargs == 0)
                return cmd_status(true);
        if (strcmp(cmd, "topo") == 0 && nargs == 0)
                return cmd_topo();
        if (strcmp(cmd, "resume") == 0 && nargs == 0)
                return cmd_resume();
        if (strcmp(cmd, "resume") == 0 && nargs == 2 && strcmp(args[0], "drop") == 0)
                return cmd_resume_drop(args[1]);
        if (strcmp(cmd, "watch") == 0 && nargs <= 1)
                return cmd_watch(nargs ? args[0] : NULL);
        if ((strcmp(cmd, "group") == 0 || strcmp(cmd, "abort") == 0 || strcmp(cmd, "dump") == 0) &&
            nargs != 1) {
                fprintf(stderr, "deval-ctl: %s takes one group name\n", cmd);
                return EXIT_USAGE;
        }
        if (strcmp(cmd, "group") == 0)
                return cmd_group(args[0]);
        if (strcmp(cmd, "abort") == 0)
                return cmd_abort(args[0]);
        if (strcmp(cmd, "dump") == 0)
                return cmd_dump(args[0]);
        fprintf(stderr, "deval-ctl: unknown command '%s', or wrong arguments for it\n", cmd);
        return EXIT_USAGE;
}

static void help(void) {
        printf("Usage: deval-ctl [OPTIONS] COMMAND\n\n"
               "Query and administer devald.\n\n"
               "Commands:\n"
               "  status                  daemon pid, version, backend, uptime and its groups\n"
               "  groups                  the groups alone (a table, or a JSON array)\n"
               "  watch [NAME]            status, or one group, redrawn every --interval\n"
               "  group NAME              one group's ranks: pid, state, arrived or not, input\n"
               "  topo                    cores, NUMA nodes, and the GPUs with the cores near "
               "them\n"
               "  abort NAME              fail every rank's collectives with DEVAL_EABORTED\n"
               "                          (the group's owner or root)\n"
               "  dump NAME               the group's flight recorder (JSON): its last\n"
               "                          collectives, each rank's call and arrival\n"
               "  resume                  the journals kept of passes that may resume\n"
               "  resume drop KEY|all     forget a job's journals (all: every one of yours)\n\n"
               "Exit status: 0 done, 1 devald said no (no such group, not permitted),\n"
               "2 usage error, 3 devald could not be reached.\n\n"
               "Options:\n"
               "  -s --socket=PATH        devald's socket (default: $DEVAL_SOCKET, else the\n"
               "                          per-user or system default)\n"
               "     --json[=pretty|short] JSON on stdout (bare: pretty on a terminal)\n"
               "     --interval=SECONDS    watch: time between refreshes (default 1)\n"
               "     --count=N             watch: stop after N refreshes\n"
               "  -h --help               show this help\n"
               "     --version            show the version\n");
}

int main(int argc, char **argv) {
        enum {
                ARG_JSON = 0x100,
                ARG_INTERVAL,
                ARG_COUNT,
                ARG_VERSION
        };
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"json", optional_argument, NULL, ARG_JSON},
                {"interval", required_argument, NULL, ARG_INTERVAL},
                {"count", required_argument, NULL, ARG_COUNT},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, ARG_VERSION},
                {},
        };
        int c;

        while ((c = getopt_long(argc, argv, "s:h", opts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        arg_socket = optarg;
                        break;
                case ARG_JSON:
                        if (!optarg)
                                arg_json = isatty(STDOUT_FILENO) ? JSON_PRETTY : JSON_SHORT;
                        else if (strcmp(optarg, "pretty") == 0)
                                arg_json = JSON_PRETTY;
                        else if (strcmp(optarg, "short") == 0)
                                arg_json = JSON_SHORT;
                        else {
                                fprintf(stderr,
                                        "deval-ctl: --json takes pretty or short, not "
                                        "'%s'\n",
                                        optarg);
                                return 2;
                        }
                        break;
                case ARG_INTERVAL: {
                        char *end;
                        arg_interval = strtod(optarg, &end);
                        if (*end || end == optarg ||
                            !(arg_interval >= 0.05 && arg_interval <= 3600)) {
                                fprintf(stderr, "deval-ctl: --interval wants seconds, 0.05 to "
                                                "3600\n");
                                return EXIT_USAGE;
                        }
                        break;
                }
                case ARG_COUNT: {
                        char *end;
                        arg_count = strtol(optarg, &end, 10);
                        if (*end || end == optarg || arg_count < 1) {
                                fprintf(stderr, "deval-ctl: --count wants a positive number\n");
                                return EXIT_USAGE;
                        }
                        break;
                }
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("deval-ctl %s\n", DV_VERSION_STRING);
                        return 0;
                default:
                        return 2;
                }
        }
        if (optind >= argc) {
                fprintf(stderr, "deval-ctl: missing command (try 'deval-ctl status')\n");
                return 2;
        }
        const char *cmd = argv[optind];
        int nargs = argc - optind - 1;
        int r = run_command(cmd, nargs, argv + optind + 1);
        return r == EXIT_REFUSED && unreachable ? EXIT_UNREACHABLE : r;
}
