/* SPDX-License-Identifier: MIT */
/*
 * topo.c - the machine as devald sees it, through hwloc: cores, NUMA nodes with their memory,
 * and for each GPU of the cuda backend the NUMA node and cores nearest to it (matched by PCI
 * bus id). Built without hwloc, it reports the CPU count alone.
 */
#define _GNU_SOURCE

#include "topo.h"

#include "daemon.h"
#include "gpu_worker.h"
#include "proc.h"
#include "util.h"

#ifdef DEVAL_HAVE_HWLOC
#include <hwloc.h>

static void cpulist(hwloc_const_bitmap_t set, char *buf, size_t len) {
        if (!set || hwloc_bitmap_list_snprintf(buf, len, set) < 0)
                snprintf(buf, len, "?");
}

/* The machine, read once at start and kept for devald's life (NULL: hwloc failed). */
static hwloc_topology_t topology;

/**
 * topo_setup() - before any thread: read the machine's topology.
 *
 * Only the PCI plugin is wanted (devald matches GPUs by bus id itself): hwloc's GPU plugins
 * would initialise CUDA, NVML or OpenCL inside devald, which must hold no CUDA context
 * (gpu_worker.h), and the OpenCL loader they pull in leaks. hwloc loads plugins with each
 * topology, so only its environment keeps them out; an administrator's setting wins. The
 * topology is never destroyed: destroying it unloads the PCI plugin, whose library leaves
 * its allocations behind.
 */
void topo_setup(void) {
        setenv("HWLOC_PLUGINS_BLACKLIST",
               "hwloc_cuda,hwloc_nvml,hwloc_opencl,hwloc_rsmi,hwloc_levelzero,hwloc_gl",
               /* overwrite= */ 0);
        hwloc_topology_t t;
        if (hwloc_topology_init(&t) < 0)
                return;
        hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        if (hwloc_topology_load(t) < 0) {
                hwloc_topology_destroy(t);
                return;
        }
        topology = t;
}

void topo_describe(Daemon *d, DvTopoReply *r) {
        hwloc_topology_t t = topology;

        if (!t)
                return;
        r->hwloc = 1;
        r->cores = (uint32_t)hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
        r->pus = (uint32_t)hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
        int nn = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
        for (int i = 0; i < nn && r->nnodes < DV_TOPO_MAX_NODES; i++) {
                hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
                DvTopoNode *n = &r->nodes[r->nnodes++];
                n->os_index = (int32_t)o->os_index;
                n->memory = o->attr ? o->attr->numanode.local_memory : 0;
                cpulist(o->cpuset, n->cpus, sizeof(n->cpus));
        }
        for (int k = 0; d->gpu && k < d->ngpus && r->ngpus < DV_MAX_GPUS; k++) {
                DvTopoGpu *g = &r->gpus[r->ngpus++];
                memcpy(g->uuid, d->gpu_uuid[k], 16);
                g->numa = -1;
                g->p2p = gpuw_p2p(k);
                snprintf(g->cpus, sizeof(g->cpus), "?");
                if (d->gpu->device_busid(k, g->busid, sizeof(g->busid)) < 0)
                        continue;
                hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(t, g->busid);
                hwloc_obj_t near = pci ? hwloc_get_non_io_ancestor_obj(t, pci) : NULL;
                if (!near)
                        continue;
                cpulist(near->cpuset, g->cpus, sizeof(g->cpus));
                hwloc_obj_t numa = NULL;
                for (hwloc_obj_t o = near; o && !numa; o = o->parent)
                        if (o->memory_arity > 0)
                                numa = o->memory_first_child;
                g->numa = numa ? (int32_t)numa->os_index : -1;
        }
}
/* The NUMA node whose cpuset holds cpu, or -1. */
static int node_of_cpu(unsigned cpu) {
        hwloc_obj_t pu = topology ? hwloc_get_pu_obj_by_os_index(topology, cpu) : NULL;
        for (hwloc_obj_t o = pu; o; o = o->parent)
                if (o->memory_arity > 0 && o->memory_first_child)
                        return (int)o->memory_first_child->os_index;
        return -1;
}

/**
 * topo_node_of_pid() - where process pid's memory should live: the one NUMA node its CPU
 * affinity allows, or, when it may run anywhere, the node of the CPU it last ran on
 * (/proc/PID/stat, field 39).
 */
int topo_node_of_pid(pid_t pid) {
        if (!topology)
                return -1;
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        int node = -1;
        if (set && hwloc_get_proc_cpubind(topology, pid, set, HWLOC_CPUBIND_PROCESS) == 0) {
                hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
                if (nodes) {
                        hwloc_cpuset_to_nodeset(topology, set, nodes);
                        if (hwloc_bitmap_weight(nodes) == 1)
                                node = hwloc_bitmap_first(nodes);
                        hwloc_bitmap_free(nodes);
                }
        }
        hwloc_bitmap_free(set);
        if (node >= 0)
                return node;
        long long cpu = proc_stat_field(pid, 39); /* the CPU it last ran on */
        return cpu >= 0 ? node_of_cpu((unsigned)cpu) : -1;
}

int topo_node_of_gpu(Daemon *d, int gpu) {
        char busid[32];
        if (!topology || !d->gpu || gpu < 0 || gpu >= d->ngpus ||
            d->gpu->device_busid(gpu, busid, sizeof(busid)) < 0)
                return -1;
        hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topology, busid);
        hwloc_obj_t near = pci ? hwloc_get_non_io_ancestor_obj(topology, pci) : NULL;
        for (hwloc_obj_t o = near; o; o = o->parent)
                if (o->memory_arity > 0 && o->memory_first_child)
                        return (int)o->memory_first_child->os_index;
        return -1;
}

int topo_bind_thread(pthread_t t, int node, char *cpus, size_t len) {
        hwloc_obj_t n = topology && node >= 0
                                ? hwloc_get_numanode_obj_by_os_index(topology, (unsigned)node)
                                : NULL;
        if (!n || !n->cpuset || hwloc_set_thread_cpubind(topology, t, n->cpuset, 0) < 0)
                return -1;
        cpulist(n->cpuset, cpus, len);
        return 0;
}

#else
void topo_setup(void) {
}

int topo_node_of_pid(pid_t pid) {
        (void)pid;
        return -1;
}

int topo_node_of_gpu(Daemon *d, int gpu) {
        (void)d;
        (void)gpu;
        return -1;
}

int topo_bind_thread(pthread_t t, int node, char *cpus, size_t len) {
        (void)t;
        (void)node;
        (void)cpus;
        (void)len;
        return -1;
}

void topo_describe(Daemon *d, DvTopoReply *r) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        r->cores = r->pus = n > 0 ? (uint32_t)n : 0;
        for (int k = 0; d->gpu && k < d->ngpus && r->ngpus < DV_MAX_GPUS; k++) {
                memcpy(r->gpus[r->ngpus].uuid, d->gpu_uuid[k], 16);
                r->gpus[r->ngpus].numa = -1;
                r->gpus[r->ngpus].p2p = gpuw_p2p(k);
                r->ngpus++;
        }
}
#endif

/**
 * topo_prefer_memory() - MPOL_PREFERRED for node on a mapping of a shared segment: the
 * policy is the segment's own, so the pages go to node whoever touches them first (a rank
 * writing its input), and elsewhere rather than fail when node is full.
 */
int topo_prefer_memory(void *addr, size_t len, int node) {
        if (node < 0 || node >= DV_MAX_NUMA || !addr || !len)
                return -1;
        unsigned long mask[DV_MAX_NUMA / 64 + 1] = {0};
        mask[node / 64] = 1ul << (node % 64);
        /* 1: MPOL_PREFERRED; the kernel reads maxnode - 1 bits of the mask */
        return (int)syscall(SYS_mbind, addr, len, 1, mask, (unsigned long)DV_MAX_NUMA + 1, 0u);
}
