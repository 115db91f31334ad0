/* SPDX-License-Identifier: MIT */
/*
 * crowd.c - whether more tasks are ready to run than the machine has cores, from the kernel's
 * count of runnable tasks (/proc/loadavg's fourth field), read at most every 20 ms so that a
 * collective of a few microseconds does not pay for it.
 */
#define _GNU_SOURCE
#include "crowd.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define RECHECK_NS (20 * 1000000ull)

/** dv_crowd_init() - a crowd not checked yet, on this machine's online cores. */
void dv_crowd_init(DvCrowd *c) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        *c = (DvCrowd){.cores = n > 0 ? n : 1, .checked_ns = 0};
}

/* Runnable tasks now (this one included), or -1 when /proc says nothing. */
static long runnable(void) {
        char buf[128];
        int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -1;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return -1;
        buf[n] = '\0';
        double a, b, d;
        long run, all;
        if (sscanf(buf, "%lf %lf %lf %ld/%ld", &a, &b, &d, &run, &all) != 5)
                return -1;
        return run;
}

/**
 * dv_crowded() - are more tasks ready to run than there are cores (as of at most 20 ms
 * before now_ns)? Unknown (no /proc): no.
 */
bool dv_crowded(DvCrowd *c, uint64_t now_ns) {
        if (c->checked_ns && now_ns - c->checked_ns < RECHECK_NS)
                return c->crowded;
        c->checked_ns = now_ns ? now_ns : 1;
        long run = runnable();
        c->crowded = run > c->cores;
        return c->crowded;
}
