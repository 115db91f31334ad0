/* SPDX-License-Identifier: MIT */
/*
 * daemon.h - devald's objects: the daemon, its client connections, groups and their members,
 * and the shared-memory arenas a group owns.
 *
 * Threads: the main thread runs the epoll loop and owns connections and the group list; each
 * active group has one worker thread that runs its collectives; GPU jobs (gpu_jobs.h) make
 * the device calls that would block the loop. A Group's fields are laid out by owner: what
 * it is (read-only once its worker runs), loop (the main thread's), locked (shared, written
 * under its lock), work (its worker's) and the atomics; a Member's fields say whose they are.
 */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "arena.h"
#include "flight.h"
#include "gpu.h"
#include "pass.h"
#include "plan.h"
#include "wire.h"

typedef struct Daemon Daemon;
typedef struct Group Group;
typedef struct Conn Conn;
typedef struct Journal Journal; /* journals.c's */

/*
 * What one uid holds in devald, against its quotas (--max-user-*). conns and groups are
 * the main thread's; bytes (every arena of its groups) is reserved by charge_take() from
 * any thread before an arena is made, so two groups growing at once cannot both take the
 * last bytes. A record lives while the uid holds anything.
 */
typedef struct Usage {
        struct Usage *next;
        uid_t uid;
        int conns;
        int groups;
        int fds; /* descriptors devald holds for it: 2 a connection, a group's segments */
        _Atomic uint64_t bytes;
} Usage;

enum {
        MEMBER_EMPTY = 0,
        MEMBER_JOINED,
        MEMBER_LEFT,
        MEMBER_DEAD
};

typedef struct {
        Conn *conn; /* NULL once the client hung up */
        pid_t pid;
        int state;
        int timeout_ms;
        uint64_t join_deadline_ns; /* while the group forms; 0: none */
        Arena in;                  /* worker's */
        Arena in_pending;          /* under lock: grown, the worker swaps it in before a step */
        int device;                /* devald's ordinal of the rank's GPU; -1: a host rank */
        int numa;                  /* the NUMA node it ran on when the group formed; -1 */
        DevArena din;              /* device groups: the rank's device input, worker's */
        DevArena din_pending;      /* under lock, like in_pending */
        uint64_t arrived_ns;       /* worker's: when it arrived at the current step */
        uint64_t times_last;       /* under lock: steps it arrived at last */
        uint64_t late_ns;          /* under lock: summed lateness behind the first arrival */
} Member;

struct Group {
        Group *next; /* the main thread's: the daemon's list */
        Daemon *d;

        /* What it is: set as it forms and starts, read-only once its worker runs. */
        char name[DV_GROUP_NAME_MAX];
        char launcher[DV_LAUNCHER_MAX]; /* what named it from the job's environment, or "" */
        uid_t uid;
        Usage *usage; /* its uid's */
        int world;
        uint64_t created_ns;
        bool device_group;    /* every rank's tensors live on a GPU (cuda backend) */
        int64_t timeout_ns;   /* < 0: none */
        uint64_t spin_ns;     /* the worker busy-waits this long for arrivals before sleeping */
        int numa;             /* where its worker runs and its output lives; -1: anywhere */
        char worker_cpus[64]; /* the cores its worker is bound to; "" when not bound */
        Member *members;      /* [world]; each field says whose it is */
        Arena ctl;            /* the ranks write it: slots, the arrive word */
        DvCtlHeader *hdr;
        Arena done; /* devald writes it; the ranks map it read-only */
        DvDoneHeader *dhdr;
        DvCtlLayout layout; /* of the control segment: devald's copy, never read back from it */
        pthread_t worker;
        pthread_mutex_t lock;

        /* The main thread's. */
        struct {
                int state;   /* DV_GROUP_* */
                bool listed; /* still findable by name */
                int joined;
                bool worker_started;
                bool reaping;    /* a job waits for its worker to end a step (group_free()) */
                int fds_charged; /* descriptors counted against its uid */
                int jobs;        /* GPU jobs running for it, which keep it (gpu_jobs.h) */
                Arena direct;    /* host groups: what the ranks write (output_direct()) */
                uint64_t direct_gen;
                DvSpanInfo *span; /* what its leader said it is part of (DV_MSG_SPAN), or NULL */
        } loop;

        /* The worker's and the main thread's: written under lock. The thread that alone
         * writes a field (the worker: outputs, waiting_*, lat_*) reads it without. */
        struct {
                Arena out;
                uint64_t out_gen;
                DevArena dout[DV_MAX_GPUS]; /* device groups: one output per GPU that receives */
                uint64_t dev_out_gen;
                int abort_status;
                char abort_msg[DV_MSG_MAX];
                uint64_t bytes_mapped;
                uint32_t waiting_seq;      /* the step the worker waits for */
                uint64_t waiting_since_ns; /* its first arrival; 0: none yet */
                Flight flight; /* the last collectives, for deval-ctl dump and post-mortems */
                uint32_t lat_us[256]; /* ring of step latencies (first arrival to completion) */
                uint32_t lat_n;
        } locked;

        /* The worker's. */
        struct {
                /* the group's eval pass (common/pass.h): a rank that ends it while others
                 * still gather is parked, and devald answers for it until the pass closes */
                DvPass pass;
                bool pass_released; /* the last step answered ranks waiting in eval_end */
                int64_t *pass_load; /* [DV_PASS_STREAMS * world]: the ranks' counters, checked */
                DvRequest *reqs;
                uint64_t *arrivals; /* [world], for the recorder */
                void *pool;
                uint64_t fast_moved; /* the fast area's bytes_moved when the worker last looked */
        } work;

        /* Anyone's, atomically. */
        _Atomic int worker_tid;
        _Atomic uint64_t collectives;
        _Atomic uint64_t done_ns; /* when the worker last completed a collective */
        _Atomic uint64_t bytes_moved;
        _Atomic uint64_t pass_since_ns; /* when its open eval pass opened; 0: none is open */
};

/* The counters of a group's eval pass, in its control segment (wire.h); its ranks write them. */
static inline DvPassShared *group_pass_shared(const Group *g) {
        return (DvPassShared *)(g->ctl.map + g->layout.pass_off);
}

struct Conn {
        Conn *next;
        Daemon *d;
        int fd;    /* -1 once closed; freed after the current batch of events */
        int pidfd; /* the client process, watched for its exit; -1 if unavailable */
        pid_t pid;
        uid_t uid;
        Usage *usage; /* its uid's */
        Group *group;
        int rank;
        uint64_t hangup_ns; /* hung up: when its close is due (conn_hangup()); 0: it has not */
};

struct Daemon {
        int epfd, listen_fd, signal_fd;
        int hungup; /* connections waiting for their process to end (conn_hangup()) */
        char socket_path[108];
        char config_path[256]; /* the configuration read, for SIGHUP; "" when none */
        uint64_t max_group_bytes;
        int max_groups;
        uint64_t max_user_bytes; /* every arena of one uid's groups */
        int max_user_groups;
        int max_user_conns;
        int max_user_fds;
        int max_world;       /* ranks per group */
        int idle_timeout_s;  /* a group without a collective this long fails; 0: never */
        int exit_idle_s;     /* exit after this long without a group or a client; 0: never */
        int resume_keep_s;   /* drop a resume journal idle this long; 0: never */
        char state_dir[256]; /* where written-through journals go; "": the socket's dir */
        Journal *journals;   /* the main thread's (journals.c) */
        int njournals;
        int journals_mem;       /* of them, held in memory alone */
        uint64_t idle_since_ns; /* main thread's: since when it has had neither; 0: it has */
        Usage *usage;
        uint64_t unexpected_fds; /* descriptors clients sent unasked, closed on arrival */
        int threads;             /* copy threads per group */
        int spin_us;             /* < 0: decide per group from the cores and the world size */
        const DvGpuApi *gpu;     /* the cuda backend's GPUs; NULL: host backend only */
        int ngpus;
        uint8_t gpu_uuid[DV_MAX_GPUS][16];
        uint64_t start_ns;
        Conn *conns;
        Conn *closed; /* closed during this batch of events, freed after it */
        Group *groups;
        int ngroups;
        /* GPU jobs (gpu_jobs.c): threads post finished jobs here and wake the loop */
        int jobs_fd;
        pthread_mutex_t jobs_lock;
        struct GpuJob *jobs_done; /* under jobs_lock */
        int jobs_running;         /* main thread's */
        bool stopping;
        bool socket_activated; /* the listening socket is systemd's: leave its file alone */
        uint64_t watchdog_ns;  /* $WATCHDOG_USEC: keep-alive every half of it; 0: none */
        uint64_t watchdog_last;
};
