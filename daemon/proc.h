/* SPDX-License-Identifier: MIT */
/*
 * proc.h - what /proc says of a client process (proc.c).
 */
#pragma once

#include <stddef.h>
#include <sys/types.h>

enum {
        PROC_RUNNING, /* or gone without a trace */
        PROC_STOPPED,
        PROC_ENDED /* a zombie: buf says how it ended */
};
int proc_state(pid_t pid, char *buf, size_t len);
long long proc_stat_field(pid_t pid, int n);
