/* SPDX-License-Identifier: MIT */
/*
 * topo.h - the machine's topology, as devald places groups on it (topo.c, hwloc): NUMA nodes
 * of processes and GPUs, binding a worker thread, preferring a node for memory.
 */
#pragma once

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "daemon.h"
#include "wire.h"

void topo_setup(void);
void topo_describe(Daemon *d, DvTopoReply *r);
/* The NUMA node process pid runs on (its affinity, else the CPU it last ran on); -1. */
int topo_node_of_pid(pid_t pid);
/* The NUMA node nearest GPU gpu (devald's ordinal); -1 when unknown. */
int topo_node_of_gpu(Daemon *d, int gpu);
/* Bind thread t to node's cores; 0 with their list in cpus, or -1. */
int topo_bind_thread(pthread_t t, int node, char *cpus, size_t len);
/* Prefer node for the pages of [addr, addr + len) (a shared mapping: for every user). */
int topo_prefer_memory(void *addr, size_t len, int node);
