/* SPDX-License-Identifier: MIT */
/*
 * wire.h - everything devald and libdeval must agree on: the socket messages of the
 * control plane, the layout of a group's shared control segment, and the collective ops.
 * Every field is fixed-width, reserved fields are zero, and sizes are pinned by static
 * asserts so that a change of layout is a change of DV_PROTO_VERSION.
 *
 * Status codes on the wire are the DEVAL_E* numbers of deval.h.
 */
#pragma once

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

#include "deval.h"

#define DV_PROTO_VERSION  17
#define DV_GROUP_NAME_MAX 64 /* including the terminating NUL */
#define DV_LAUNCHER_MAX   16 /* "torchrun", "mpirun", ...: who started a job */
#define DV_MSG_MAX        512
/* pad_across_processes of a dim outside the tensor: each rank's own, as it is */
#define DV_PAD_OUTSIDE    DEVAL_MAX_DIMS
#define DV_CTL_MAGIC      0x4c564544u /* "DEVL" */
#define DV_ARENA_ALIGN    64
#define DV_VERSION_STRING "0.2.0"

/* ---- control plane: SOCK_SEQPACKET messages ---------------------------------------------- */

enum {
        /* DvJoinReq -> DvReply + fds {control, input, output} and, in a device group (flags
         * DV_REPLY_DEVICE), {device input, device output} */
        DV_MSG_JOIN = 1,
        DV_MSG_GROW = 2,   /* DvGrowReq -> DvReply + fd {input, or device input} */
        DV_MSG_OUTPUT = 3, /* DvMsgHdr -> DvReply + fd {output} */
        DV_MSG_LEAVE = 4,  /* DvMsgHdr -> DvReply */
        DV_MSG_STATUS = 5, /* DvMsgHdr -> DvStatusReply */
        DV_MSG_REPLY = 6,
        DV_MSG_GROUP = 7, /* DvNameReq -> DvGroupReply, or DvReply on failure */
        DV_MSG_ABORT = 8, /* DvNameReq -> DvReply */
        /* DvMsgHdr -> DvReply + fd {this member's device output} (device groups) */
        DV_MSG_DEV_OUTPUT = 9,
        DV_MSG_TOPO = 10, /* DvMsgHdr -> DvTopoReply */
        DV_MSG_DUMP = 11, /* DvNameReq -> DvReply + fd {the flight recorder's JSON, size[0]} */
        /* DvGrowReq -> DvReply + fd {the direct output, gen}: of size bytes at least, grown
         * if need be (size 0: the current one). See DV_REQ_DIRECT. */
        DV_MSG_DIRECT = 12,
        DV_MSG_SPAN = 13, /* DvSpanReq -> DvReply: this member's group spans machines */
        /* DvJournalReq -> DvReply + fd {the journal, size[0]} (DV_JOURNAL_OPEN, _GROW), or
         * DvReply (DV_JOURNAL_DROP): a pass's journal (common/journal.h) */
        DV_MSG_JOURNAL = 14,
        DV_MSG_JOURNALS = 15, /* DvJournalReq -> DvJournalList: the caller's uid's journals */
};

typedef struct {
        uint32_t version;
        uint32_t type;
} DvMsgHdr;

typedef struct {
        DvMsgHdr hdr;
        char name[DV_GROUP_NAME_MAX];
} DvNameReq;

typedef struct {
        DvMsgHdr hdr;
        char group[DV_GROUP_NAME_MAX];
        int32_t rank;
        int32_t world_size;
        int32_t timeout_ms;
        uint32_t has_device; /* 1: this rank's tensors live on the GPU named by device_uuid */
        uint8_t device_uuid[16];
        char launcher[DV_LAUNCHER_MAX]; /* what named the group; "" when the caller did */
} DvJoinReq;

typedef struct {
        DvMsgHdr hdr;
        uint64_t size;
        uint32_t device; /* 1: the device input arena */
        uint32_t reserved;
} DvGrowReq;

/* DvJournalReq.action */
enum {
        DV_JOURNAL_OPEN = 1, /* this rank's journal of the pass, made empty if there is none */
        DV_JOURNAL_GROW,     /* the same, at least size bytes */
        DV_JOURNAL_DROP,     /* forget this rank's journal of the pass */
        DV_JOURNAL_DROP_KEY, /* forget every journal of key ("": every one of the uid's) */
        /* forget this rank's journals of the group's other passes over the same loader
         * (size: the loader digest): evaluations the job has run again since */
        DV_JOURNAL_DROP_STALE,
};
#define DV_JOURNAL_REQ_FILE 1u /* DV_JOURNAL_OPEN: keep it in a file (write-through) */

typedef struct {
        DvMsgHdr hdr;
        uint32_t action; /* DV_JOURNAL_* */
        uint32_t flags;  /* DV_JOURNAL_REQ_* */
        char key[64];    /* the job's resume key (DV_RESUME_KEY_MAX) */
        char group[DV_GROUP_NAME_MAX];
        uint32_t ordinal; /* which of the group's passes */
        int32_t rank, world;
        uint32_t reserved;
        uint64_t size;
} DvJournalReq;

typedef struct {
        char key[64];
        char group[DV_GROUP_NAME_MAX];
        uint32_t ordinal;
        int32_t rank, world;
        uint32_t file;  /* 1: written through to a file */
        uint64_t bytes; /* devald holds */
        uint64_t used;  /* of them, the whole batches' (the header says; untrusted) */
        uint64_t batches;
        uint64_t idle_s; /* since a rank last opened or grew it */
} DvJournalInfo;

#define DV_JOURNALS_MAX 256
typedef struct {
        DvMsgHdr hdr;
        int32_t status;
        uint32_t n;      /* entries that follow */
        uint32_t total;  /* journals the uid has */
        uint32_t keep_s; /* devald drops a journal idle this long */
        DvJournalInfo j[];
} DvJournalList;

#define DV_REPLY_DEVICE 1u /* a device group: device arenas come with the join */

typedef struct {
        DvMsgHdr hdr;
        int32_t status;
        uint32_t nfds;
        uint64_t size[6]; /* of the segments whose fds come with the reply, in order */
        uint64_t
                gen; /* output arena generation (DV_MSG_OUTPUT, a join); direct output's (DV_MSG_DIRECT) */
        uint64_t dev_gen; /* device output generation, with DV_MSG_DEV_OUTPUT and a join */
        uint32_t flags;   /* DV_REPLY_* */
        uint32_t reserved;
        char msg[DV_MSG_MAX];
} DvReply;

enum {
        DV_GROUP_FORMING = 1,
        DV_GROUP_ACTIVE,
        DV_GROUP_FAILED,
        DV_GROUP_CLOSING,
        DV_GROUP_STARTING /* every rank joined; devald makes its GPU memory */
};

/* A group's open eval pass, as its ranks' progress says (common/progress.h). */
typedef struct {
        int64_t total;                     /* the pass's samples; -1: no pass is open */
        int64_t samples;                   /* every rank's gathered so far (at most total) */
        uint64_t age_us;                   /* since it opened */
        uint32_t batches_min, batches_max; /* of the ranks still in it */
        int32_t lag_rank; /* the first of those with batches_min; -1: every one has batches_max */
        uint32_t ended;   /* ranks that ended their pass (their loader ran out) */
} DvPassInfo;

typedef struct {
        char name[DV_GROUP_NAME_MAX];
        uint32_t uid;
        uint32_t state;
        int32_t world_size;
        int32_t joined;
        uint64_t collectives;
        uint64_t bytes_moved;
        uint64_t bytes_mapped;
        uint64_t age_us;
        char launcher[DV_LAUNCHER_MAX];
        DvPassInfo pass;
} DvGroupInfo;

#define DV_STATUS_MAX_GROUPS 512
typedef struct {
        DvMsgHdr hdr;
        int32_t status;
        int32_t pid;
        char version[16];
        char backend[16];
        uint64_t uptime_us;
        uint64_t max_group_bytes;
        uint64_t unexpected_fds; /* descriptors clients sent devald unasked (closed at once) */
        uint32_t ngroups;        /* entries that follow */
        uint32_t total_groups;
        DvGroupInfo groups[];
} DvStatusReply;

enum {
        DV_RANK_EMPTY = 0,
        DV_RANK_JOINED,
        DV_RANK_LEFT,
        DV_RANK_DEAD,
        DV_RANK_STOPPED /* joined, and its process is stopped (SIGSTOP, a debugger) */
};

typedef struct {
        int32_t rank;
        int32_t pid;
        uint32_t state;       /* DV_RANK_* */
        uint32_t arrived_seq; /* the last collective it arrived at */
        uint64_t input_bytes; /* its input arena */
        uint64_t times_last;  /* collectives it arrived at last */
        uint64_t late_us;     /* when last, how long after the first arrival, on average */
        int32_t numa;         /* the NUMA node its input arena prefers; -1: none */
        uint32_t pass_state;  /* DV_PASS_RANK_* */
        int64_t pass_samples; /* in the open pass: what it gave so far */
        uint32_t pass_batches;
        uint32_t reserved;
} DvRankInfo;

/*
 * A group that spans machines (libclient/span.c) is, at each machine's devald, the group of
 * that machine's ranks; its leader tells devald what it is part of, for deval-ctl.
 */
#define DV_SPAN_NODES 64 /* the nodes a span record lists */
typedef struct {
        int32_t leader; /* its leader's rank in the spanning group */
        int32_t nranks;
        char host[56];
} DvSpanNode;

typedef struct {
        char group[DV_GROUP_NAME_MAX]; /* the spanning group's name */
        int32_t node, nodes;           /* nodes 0: not a spanning group */
        int32_t world;                 /* ranks of the spanning group */
        int32_t listed;                /* entries of node_info: min(nodes, DV_SPAN_NODES) */
        DvSpanNode node_info[DV_SPAN_NODES];
        int16_t ranks[DEVAL_MAX_WORLD]; /* the spanning group's rank of each local rank */
} DvSpanInfo;

typedef struct {
        DvMsgHdr hdr;
        DvSpanInfo info;
} DvSpanReq;

typedef struct {
        DvMsgHdr hdr;
        int32_t status;
        uint32_t waiting_seq; /* the collective the group waits for */
        int32_t timeout_ms;   /* < 0: none */
        uint32_t nranks;      /* entries that follow */
        uint32_t p50_us;      /* collectives' time from first arrival to completion, */
        uint32_t p99_us;      /* over the last latency_n of them */
        uint32_t latency_n;
        uint32_t waiting_ms;  /* since the first rank arrived at waiting_seq; 0: none yet */
        int32_t worker_tid;   /* devald's thread running the group's collectives */
        int32_t numa;         /* the NUMA node of the worker and the output; -1: none */
        char worker_cpus[64]; /* the cores the worker is bound to; "" when not bound */
        DvGroupInfo info;
        char abort_msg[DV_MSG_MAX];
        DvSpanInfo span;
        DvRankInfo ranks[];
} DvGroupReply;

/*
 * The machine's limits, one constant each: GPUs devald drives (a peer mask is a uint64_t),
 * NUMA nodes it places memory on (an mbind mask of one unsigned long per 64), and NUMA nodes a
 * topology reply lists.
 */
#define DV_MAX_GPUS       64
#define DV_MAX_NUMA       64
#define DV_TOPO_MAX_NODES 16
_Static_assert(DV_MAX_GPUS <= 64, "a GPU's peers are the bits of a uint64_t");
_Static_assert(DV_TOPO_MAX_NODES <= DV_MAX_NUMA, "the reply lists nodes devald places on");

typedef struct {
        int32_t os_index;
        uint32_t reserved;
        uint64_t memory; /* bytes local to the node */
        char cpus[64];   /* cpu list, "0-7,16-23" */
} DvTopoNode;

typedef struct {
        uint8_t uuid[16];
        char busid[16]; /* PCI "0000:17:00.0", empty when unknown */
        int32_t numa;   /* the NUMA node nearest to it; -1 when unknown */
        uint32_t reserved;
        uint64_t p2p;  /* bit k: its copy kernel reads GPU k's memory directly (a test copy
                           proved it); the others' inputs are staged through host memory */
        char cpus[64]; /* the cores nearest to it */
} DvTopoGpu;

typedef struct {
        DvMsgHdr hdr;
        int32_t status;
        uint32_t hwloc; /* 1: from hwloc; 0: devald was built without it */
        uint32_t cores; /* physical cores */
        uint32_t pus;   /* hardware threads */
        uint32_t nnodes;
        uint32_t ngpus;
        DvTopoNode nodes[DV_TOPO_MAX_NODES];
        DvTopoGpu gpus[DV_MAX_GPUS];
} DvTopoReply;

/* ---- data plane: the control segment of one group ----------------------------------------- */

enum {
        DV_OP_GATHER = 1,
        DV_OP_GATHER_METRICS,
        DV_OP_EVAL_BEGIN,
        DV_OP_EVAL_END,
        DV_OP_PAD,
        DV_OP_OBJECTS,
        DV_OP_OBJECTS_METRICS,
        DV_OP_REDUCE,
        DV_OP_BROADCAST,
        DV_OP_BROADCAST_BYTES,
        DV_OP_BARRIER,
        DV_OP_MAX_,
};

typedef struct {
        int32_t dtype;
        int32_t ndim;
        int64_t shape[DEVAL_MAX_DIMS];
        uint64_t offset; /* in the rank's input arena (request) or the output arena (result) */
        uint64_t nbytes;
} DvTensorDesc;

/* What a rank asks for: written by the client, copied once and validated by the daemon. */
typedef struct {
        uint32_t seq;
        uint32_t op;
        uint32_t ntensors;
        uint32_t pad_first;
        double pad_value;
        int64_t valid_rows;
        int64_t keep_rows;
        int32_t order;
        int32_t root;
        int32_t reduce_op;
        int32_t dim; /* DV_OP_PAD: 0..ndim-1, or DV_PAD_OUTSIDE */
        int64_t num_samples;
        int32_t status; /* < 0: this rank could not stage its input; the step fails */
        uint32_t site;  /* *_METRICS in an eval pass: which call of the batch */
        uint32_t flags; /* DV_OP_EVAL_END: DV_END_*; *_METRICS: DV_SITE_* */
        uint32_t batch; /* deval_eval_batch() calls since the pass began */
        /* the rank's collective calls so far, this one included: what messages name. seq is
         * the step's; a step turned back unrun is posted again under the next seq, and a
         * spanning group's call runs as several steps of its node, each of the same call */
        uint32_t call;
        /* DV_OP_EVAL_END: a bit per stream (dv_pass_stream()) that some batch of this rank
         * did not call: the close does not ask it for every sample */
        uint32_t partial;
        uint64_t staged_bytes; /* with status: how much it tried to stage */
        /* *_METRICS with DV_SITE_BASED: where the call's batch starts in the pass, as a
         * counted site says it: the pass's samples before it, and this rank's */
        int64_t base_total;
        int64_t base_rows;
        uint64_t names; /* deval_gather_opts.names: the same on every rank */
        char why[256];  /* with status, or DV_END_LEFT: the rank's own words (untrusted text) */
        DvTensorDesc t[DEVAL_MAX_TENSORS];
} DvRequest;

/*
 * An eval pass counts the samples of each call site of a batch apart: the first
 * gather_for_metrics after deval_eval_batch() is site 0, the second site 1, and so on; objects
 * count in sites of their own. Without deval_eval_batch() every call is site 0. The first
 * DV_PASS_SITES sites of each kind are counted (a pass by position needs them); the calls
 * past them are gathered uncounted, as a pass with keys does every call (libclient/ident.c),
 * and a pass by position takes them only with the rank's real rows (valid_rows) said.
 */
#define DV_PASS_SITES DEVAL_PASS_SITES

/* DV_OP_EVAL_END: the rank's loader ran out (deval_eval_complete()), so the pass may check
 * that every site gathered all num_samples samples. */
#define DV_END_EXHAUSTED 1u
/* DV_OP_EVAL_END: the rank left its loop before its loader ran out (deval_eval_abandon()): a
 * step where another rank still calls fails on every rank (common/pass.c). */
#define DV_END_LEFT 2u
/* *_METRICS in a pass by position: the call's site is one that some batch before did not
 * call (libclient/sites.h), so its rows no longer follow the loop's samples: no stream counts
 * it, and valid_rows says the rank's real rows, as for a call past DV_PASS_SITES. */
#define DV_SITE_UNCOUNTED 1u
/* *_METRICS in a pass by position, at a site no stream counts: the request says where its
 * batch starts (base_total, base_rows), and the step cuts its rows at the pass's end as a
 * counted stream's at that point (dv_pass_plan_based()); no counter moves. */
#define DV_SITE_BASED 2u
/* Any op: the rank's input also lies in its slot's inline bytes, at the offsets of its
 * descriptors, so a rank may run the step (see DvFast). */
#define DV_REQ_INLINE 0x100u
/*
 * A gather: the rank's input lies in its own memory, which nobody else can read. The last
 * rank to arrive plans the step and publishes the plan (DvShare, DV_SHARE_OWN); every rank
 * then copies its own rows, padded, straight to their place in the group's direct output,
 * a segment every rank maps writable: each byte crosses memory once. A step the ranks cannot
 * run that way is never handed to devald, which could not read the inputs: the runner
 * publishes it done with status DV_FAST_RESTAGE, and every rank calls again with its input
 * staged (inline or in its input arena).
 */
#define DV_REQ_DIRECT   0x200u
#define DV_FAST_RESTAGE 1

/* What a rank gets back: written by the daemon before it publishes done_seq. */
typedef struct {
        int32_t status;
        uint32_t ntensors;
        /* the collective this answers: for a rank parked in eval_end, the others' call */
        uint32_t op;
        uint32_t site;
        uint32_t batch;
        uint32_t flags; /* DV_RES_* */
        DvTensorDesc t[DEVAL_MAX_TENSORS];
} DvResult;
/* eval_end, the step that closed the pass: a rank left its loop early, so no rank checks what
 * the pass gathered (common/pass.c, dv_pass_end_flags()) */
#define DV_RES_UNCHECKED 1u

/*
 * A rank whose inputs fit in its inline bytes (DvCtlHeader.inline_size, set by devald for the
 * group: DV_INLINE_MIN to DV_INLINE_MAX, a power of two) writes them there instead of its
 * input arena, so that the last rank to arrive can run the step without devald; devald reads
 * them there when it runs the step. Such a step writes its result into the control segment's
 * output area, of world_size inline sizes and DV_FAST_OUT_MIN at least.
 */
#define DV_INLINE_MIN   (4u << 10)
#define DV_INLINE_MAX   (1u << 20)
#define DV_FAST_OUT_MIN (64u << 10)

/*
 * A small reduce, gather or barrier every rank runs by itself (mirrored): no rank runs it for
 * the others, so it costs one crossing of each rank's record and no publication. Before it
 * arrives, every rank describes its step in its record of the step's parity, with its input
 * (op 0: a step it cannot mirror), and stores seq last. Once every rank's record of seq is
 * there, every rank decides the same from the same records: when all describe the same
 * reduce (op, dtype, shape, bytes), the same gather of one tensor (op, dtype, ndim, options;
 * a result of DV_MIRROR_OUT bytes at most) or all a barrier, each runs it itself, as devald
 * would; otherwise they go on as for any step (DvFast). A rank writes its record of step
 * seq + 2 only after every rank has arrived at seq + 1, so after every rank has read the
 * records of seq: two records a rank suffice. Rank 0 stores mirror_seq (DvFast) after each,
 * for devald's worker, which would otherwise wait for the step.
 */
#define DV_MIRROR_BYTES 128
#define DV_MIRROR_OUT   4096
typedef struct {
        alignas(64) _Atomic uint32_t seq; /* the step described; stored (release) last */
        uint32_t op; /* DV_OP_REDUCE, DV_OP_GATHER(_METRICS), DV_OP_BARRIER; 0: not mirrored */
        int32_t dtype;
        int32_t ndim;
        uint32_t nbytes; /* of data, DV_MIRROR_BYTES at most */
        int32_t reduce_op;
        uint64_t arrived_ns; /* CLOCK_MONOTONIC at the arrival, for devald's figures only */
        /* a gather's options (its root is -1) */
        int64_t valid_rows;
        int64_t keep_rows;
        double pad_value;
        int32_t order;
        uint32_t pad_first;
        int64_t shape[DEVAL_MAX_DIMS];
        uint8_t data[DV_MIRROR_BYTES];
} DvMirror;

enum {
        DV_PASS_RANK_NONE = 0, /* no pass of its own open */
        DV_PASS_RANK_IN,       /* in its pass's batches */
        DV_PASS_RANK_ENDED     /* ended its pass while others may go on */
};

typedef struct {
        /* Bumped (release) by the client once req is complete; read (acquire) by the worker. */
        alignas(64) _Atomic uint32_t arrived_seq;
        _Atomic uint32_t shared_seq; /* the last step whose share of the copy it did (DvShare) */
        uint64_t arrived_ns;         /* CLOCK_MONOTONIC at the arrival, for devald's figures only */
        /* a pad the ranks ran (DvFast): where this rank's padded tensor lies in the output
         * area, and its length along the padded dim */
        uint64_t pad_off;
        int64_t pad_len;
        /* this rank's progress through the open eval pass, for figures alone (a progress bar,
         * deval-ctl watch: common/progress.h); reset when it opens one */
        _Atomic int64_t pass_total;    /* the pass's num_samples */
        _Atomic int64_t pass_samples;  /* a pass with keys: the samples its batches held */
        _Atomic uint32_t pass_batches; /* its batches so far */
        _Atomic uint32_t pass_state;   /* DV_PASS_RANK_* */
        uint32_t reserved1[2];
        DvRequest req;
        DvMirror mirror[2]; /* [seq % 2] */
} DvSlot;

/*
 * Steps the ranks run themselves. Every rank adds 1 to count after its slot is complete; the
 * rank that brings it to world_size is the last to arrive. When every request is a small
 * host-memory gather, reduce, broadcast or barrier with its input inline, and the ranks agree
 * on everything the step needs, that rank plans it (common/plan.c, the code devald runs),
 * writes the result here and publishes done_seq: no wake-up of devald on the way. Any other
 * step, and any disagreement or malformed request, it hands to devald (handoff_seq, then the
 * arrive word), whose worker checks it as always and names what was wrong; unless some
 * rank's input is in its own memory (DV_REQ_DIRECT), when it publishes the step unrun.
 * A step every rank mirrors (DvMirror) never comes here: only one the records do not agree
 * on does, its ranks counting themselves in once they have read every record.
 *
 * This is memory every rank of the group writes: a rank trusts the other ranks of its group
 * with the results of the steps they run, as it trusts them with their inputs; ranks and
 * devald check every offset and size they read here. devald still owns membership, memory,
 * the failure of the group and its timeouts: it sees arrivals in the slots and done_seq here.
 */
/* What the rank that ran step seq saw, for devald's figures (who was last, by how much). */
#define DV_FAST_STATS 256
typedef struct {
        uint32_t seq;
        int32_t last;     /* the rank that arrived last */
        uint32_t late_us; /* its arrival after the first */
        uint32_t lat_us;  /* first arrival to the result */
} DvFastStat;

typedef struct {
        alignas(64) _Atomic uint32_t count;    /* ranks arrived at the step in progress */
        alignas(64) _Atomic uint32_t done_seq; /* last step a rank ran; stored (release) last */
        _Atomic uint32_t wake;        /* bumped by whoever finishes a step; ranks sleep on it */
        _Atomic uint32_t sleepers;    /* ranks asleep on wake: the finisher wakes them */
        _Atomic uint32_t handoff_seq; /* last step handed to devald (release) */
        /* a large step the ranks run: the runner publishes its plan (DvShare) at share_seq,
         * every rank copies its share of the output and counts itself in shared; the last
         * publishes done_seq. share_bad: a rank found the plan malformed. */
        _Atomic uint32_t share_seq;
        _Atomic uint32_t shared;
        _Atomic uint32_t share_bad;
        uint32_t reserved2;
        int32_t executor;                /* the rank that ran done_seq */
        int32_t runner;                  /* the rank running the step in progress */
        _Atomic uint64_t bytes_moved;    /* by the steps the ranks ran, for devald's figures */
        DvResult res;                    /* done_seq's result, the same for every rank */
        DvFastStat stats[DV_FAST_STATS]; /* [seq % DV_FAST_STATS] */
        /* written by rank 0 alone: the last step mirrored (DvMirror), and the bytes of the
         * results of those steps, for devald's figures */
        alignas(64) _Atomic uint32_t mirror_seq;
        uint32_t reserved3;
        _Atomic uint64_t mirror_bytes;
} DvFast;

/*
 * A group's control segment, what the ranks write: each its own slot (devald copies a
 * request out once, then validates the copy) and the arrive word.
 */
typedef struct {
        uint32_t magic;
        uint32_t version;
        int32_t world_size;
        uint32_t reserved0;
        /* devald's layout of the segment (dv_ctl_layout()): ranks check it, devald never reads it */
        uint32_t inline_size; /* bytes of each rank's inline input */
        uint32_t reserved1;
        uint64_t inl_off; /* rank k's inline input at inl_off + k * inline_size */
        uint64_t out_off; /* the output area of the steps the ranks run */
        uint64_t out_size;
        /* A rank handing a step to devald adds 1 and FUTEX_WAKEs it; the worker sleeps on it. */
        alignas(64) _Atomic uint32_t arrive;
        alignas(64) DvFast fast;
        alignas(64) DvSlot slots[];
} DvCtlHeader;

/*
 * Its completion segment, what devald writes: sealed against writes before the ranks get
 * it, so they can only map it read-only and no rank can forge a completion, a failure or
 * another rank's result.
 */
typedef struct {
        uint32_t magic;
        uint32_t version;
        int32_t world_size;
        uint32_t reserved0;
        /* The worker adds 1 after publishing a step or a failure (and to fast.wake, which the
         * clients sleep on). */
        alignas(64) _Atomic uint32_t wake;
        /* Last completed step; stored (release) after every res and msg are written. */
        alignas(64) _Atomic uint32_t done_seq;
        /*
         * The last step at which ranks waiting in DV_OP_EVAL_END were released: the close of
         * an eval pass (or a refused eval_end). Ranks that finished their pass early wait on
         * it while devald answers the others' collectives for them. Stored (release) after
         * every res is written, before done_seq.
         */
        _Atomic uint32_t pass_end_seq;
        /* Non-zero once the group failed for good; abort_msg is written before (release). */
        _Atomic int32_t abort_status;
        uint64_t out_gen; /* generation of the output arena the results refer to */
        uint64_t out_size;
        uint64_t dev_out_gen; /* bumped when any device output arena of the group is replaced */
        char msg[DV_MSG_MAX]; /* why step done_seq failed, when it did */
        char abort_msg[DV_MSG_MAX];
        alignas(64) DvResult res[]; /* [world_size]: each rank's result */
} DvDoneHeader;

static inline uint64_t dv_ctl_size(int world_size) {
        return sizeof(DvCtlHeader) + (uint64_t)world_size * sizeof(DvSlot);
}

/*
 * The plan of a large step the ranks run, for every rank to copy its share of the output:
 * the copy kernel's segments (kernel_body.h) and, for each source, its offset in the inline
 * inputs. Written by the runner; every rank checks every segment against the output area
 * and the inline inputs before it copies a byte.
 */
#define DV_SHARE_SEGS 1024
enum {
        DV_SHARE_BYTES = 0, /* sources inline; rank k copies bytes [k, k + 1) * total / world */
        DV_SHARE_OWN = 1    /* rank k copies the segments of its own sources (src / per_rank
                             * == k), from its own memory or inline bytes, to the direct output */
};
typedef struct {
        uint32_t nsegs;
        uint32_t nsrcs;
        uint64_t total;    /* bytes of output the segments write */
        uint32_t mode;     /* DV_SHARE_* */
        uint32_t per_rank; /* DV_SHARE_OWN: sources per rank */
        uint64_t gen;      /* DV_SHARE_OWN: the direct output's generation the plan is for */
        uint8_t segs[DV_SHARE_SEGS][72]; /* DvKernelSeg, whose layout wire.h does not own */
        uint64_t starts[DV_SHARE_SEGS + 1];
        uint64_t src_off[]; /* [nsrcs], from the start of the inline inputs */
} DvShare;

/*
 * An eval pass's counters: the samples each call site (stream) of a batch gathered so far
 * (pass.h owns what they mean). Every executor of a pass's steps keeps them in this form.
 */
#define DV_PASS_STREAMS (2 * DV_PASS_SITES)
typedef struct {
        int32_t order;
        uint32_t used; /* bit per stream that gathered in this pass */
        int64_t num_samples;
        int64_t total[DV_PASS_STREAMS];
        int64_t most[DV_PASS_STREAMS]; /* the most samples one call of the stream gathered */
} DvPassCounts;

/*
 * The counters of the group's eval pass, in the control segment after the output area.
 * Between steps they are the truth: devald loads them before a step it runs and stores them
 * after it; a rank that runs a gather for metrics plans it with them and adds what it
 * gathered. devald checks them when it loads them (they are rank-writable).
 */
typedef struct {
        _Atomic uint32_t open; /* a pass is open (written by devald) */
        uint32_t reserved;
        DvPassCounts c;
        int64_t rows[]; /* [stream * world_size + rank] */
} DvPassShared;

typedef struct {
        uint32_t inline_size;
        uint64_t inl_off, out_off, out_size, pass_off, share_off, total;
} DvCtlLayout;

/* Where the inline inputs and the output area of a group's control segment lie. */
static inline DvCtlLayout dv_ctl_layout(int world_size, uint32_t inline_size) {
        DvCtlLayout l = {.inline_size = inline_size};
        l.inl_off = (dv_ctl_size(world_size) + 4095) & ~4095ull;
        l.out_off = l.inl_off + (uint64_t)world_size * inline_size;
        l.out_size = (uint64_t)world_size * inline_size;
        if (l.out_size < DV_FAST_OUT_MIN)
                l.out_size = DV_FAST_OUT_MIN;
        l.pass_off = l.out_off + l.out_size;
        l.share_off = l.pass_off + sizeof(DvPassShared) +
                      (uint64_t)DV_PASS_STREAMS * (uint64_t)world_size * sizeof(int64_t);
        l.total = l.share_off + sizeof(DvShare) +
                  (uint64_t)world_size * DEVAL_MAX_TENSORS * sizeof(uint64_t);
        return l;
}

static inline uint64_t dv_done_size(int world_size) {
        return sizeof(DvDoneHeader) + (uint64_t)world_size * sizeof(DvResult);
}

_Static_assert(sizeof(DvMsgHdr) == 8, "wire layout");
_Static_assert(sizeof(DvJoinReq) == 120, "wire layout");
_Static_assert(sizeof(DvGrowReq) == 24, "wire layout");
_Static_assert(sizeof(DvReply) == 600, "wire layout");
_Static_assert(sizeof(DvTensorDesc) == 88, "wire layout");
_Static_assert(offsetof(DvRequest, staged_bytes) == 88, "wire layout");
_Static_assert(sizeof(DvGroupInfo) == 168, "wire layout");
_Static_assert(sizeof(DvSpanInfo) == 80 + 64 * DV_SPAN_NODES + 2 * DEVAL_MAX_WORLD, "wire layout");
_Static_assert(sizeof(DvRankInfo) == 64, "wire layout");
_Static_assert(sizeof(DvSlot) % 64 == 0, "slots on their own cache lines");
_Static_assert(offsetof(DvSlot, req) == 64, "wire layout");
_Static_assert(sizeof(DvMirror) == 256, "a mirror record is four cache lines");
_Static_assert(sizeof(DvPassShared) == 8 + 16 + 16 * DV_PASS_STREAMS, "wire layout");
_Static_assert(sizeof(DvCtlHeader) % 64 == 0, "slots on their own cache lines");

const char *dv_op_name(uint32_t op);

/*
 * What a message about a timeout says of where its figure comes from, so that the user can
 * change it: the timeout every rank gives deval_join() (deval.join() in Python, in seconds),
 * which bounds the join and every collective.
 */
#define DV_TIMEOUT_SET \
        "set timeout_ms in deval_join_opts, or timeout= in deval.join(), to wait longer"
