/* SPDX-License-Identifier: MIT */
/*
 * handle.h - libdeval's group handle, and what every part of libdeval does with it
 * (handle.c): errors, devald's control messages, devald's liveness, forks, options structs.
 */
#pragma once

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "deval.h"

#include "crowd.h"
#include "join_err.h"
#include "journal.h"
#include "plan.h"
#include "sites.h"
#include "tunables.h"
#include "wire.h"

/* The state struct deval_group embeds for other modules: here, so that the handle includes
 * none of their headers (the layers: tools/check-layers) and none of them is both below and
 * above it. Each is its module's alone; the join sets it up and frees it. */

/* What devald answered for this rank while it was parked, to replay: the handle's replay
 * (replay.c). */
typedef struct {
        struct DvKept *kept;
        size_t n, cap, next;
        bool on;   /* deval_eval_batch() started replaying them */
        size_t at; /* where the batch being replayed starts in kept */
} DvReplayState;

/* What a rank keeps to run steps for the others: the handle's fast (fast.c). */
typedef struct {
        DvRequest *reqs; /* [world]: the requests of a step this rank runs */
        DvPlan plan;     /* of a step this rank runs, and what it plans with */
        void *scratch[6];
        size_t scratch_size[6];
        uint8_t *out; /* the output area of the steps the ranks run */
        uint64_t out_size;
        DvShare *share;     /* the plan of a step every rank copies a share of */
        uint64_t share_min; /* outputs from this size up are copied by every rank */
        uint32_t share_did; /* the last step this rank copied its share of */
        DvResult res;       /* this rank's copy of the result of a step a rank ran */
} DvFastState;

/* The direct output (DV_REQ_DIRECT), mapped writable once a step needed it (fast.c). */
typedef struct {
        uint8_t *out;
        uint64_t size;
        uint64_t gen;
        uint64_t min; /* a rank gathers this many bytes of input and up directly */
        uint32_t seq; /* the last step whose result this rank wrote into it */
} DvDirect;

#define DV_MIRROR_KNOWN 4

/* What a rank keeps to mirror steps: the handle's mirror (mirror.c). */
typedef struct {
        bool on;        /* small reduces and barriers may be ($DEVAL_MIRROR=0: never) */
        int next;       /* the first rank whose record of the step is not seen yet */
        uint64_t bytes; /* rank 0: bytes of the results of those steps, for devald */
        DvRequest req;  /* its copy of its own request, with one tensor */
        DvMirror own;   /* this rank's description of the step in flight */
        DvMirror *recs; /* [world]: copies of the records of a step */
        /* a record of each step dv_agree() accepted lately: records that all describe one of
         * them again need not be asked about (a loop's reduces and barriers, step after step) */
        DvMirror known_steps[DV_MIRROR_KNOWN];
        int nknown, next_known;
        bool known;           /* this rank's step is one of them */
        DvShape *shapes;      /* [world]: a mirrored gather's inputs */
        int64_t *valid;       /* [world] */
        const uint8_t **srcs; /* [world] */
        DvResult res;         /* the result of the last one */
        alignas(64) uint8_t out[DV_MIRROR_OUT];
} DvMirrorState;

/* A pass's journal, and the batches it answers: the handle's resume (resume.c). */
typedef struct {
        char key[DV_RESUME_KEY_MAX];   /* the job's resume key; "": this process keeps none */
        char group[DV_GROUP_NAME_MAX]; /* the group's, as every run of the job names it */
        uint32_t ordinal;              /* passes begun on the handle */
        uint8_t *base;                 /* the journal, mapped; NULL: none */
        uint64_t size;
        bool on;       /* this pass writes its batches to the journal */
        bool stopped;  /* it could not grow: batches from here on are not kept */
        uint64_t kept; /* the pass's first batches, answered from the journal */
        uint64_t *at;  /* where each of them starts */
        uint64_t step; /* answering: the next step of the batch, and where the batch ends */
        uint64_t rec_end;
        uint32_t steps_left;
        bool writing; /* a batch is being written: its record starts at rec, ends at tail */
        uint64_t rec, tail;
        uint32_t nsteps;
        uint64_t digest;
        DvResult res; /* the result being answered */
        /* deval_eval_kept_state(): the latest state kept in the first state_scanned batches */
        const uint8_t *state;
        uint64_t state_len;
        uint32_t state_scanned;
} DvResumeState;

/* What the pass's journal does to each collective: resume.c's, which the layers below it
 * reach through the handle rather than by name (tools/check-layers). resume.c sets it when
 * a pass begins; NULL before: no collective is answered from a journal or kept in one. */
typedef struct {
        /* is the collective in flight answered from the journal (dv_resume_answers()) */
        bool (*answers)(const deval_group *g);
        /* answer it (dv_resume_take()) */
        int (*take)(deval_group *g, const char *fn, const DvRequest *q, const DvResult **ret);
        /* keep a collective's result; NULL: it failed (dv_resume_keep()) */
        void (*keep)(deval_group *g, const DvResult *res);
        /* the handle goes: unmap what the journal holds (dv_resume_free()) */
        void (*free)(deval_group *g);
} DvResumeOps;

typedef struct DvSpan DvSpan;

/* What a group across machines does in place of its node's group: span.c's, which the
 * layers below it reach through the handle rather than by name (tools/check-layers). */
typedef struct {
        /* the collective in g->req across every node (dv_span_run()) */
        int (*run)(deval_group *g, const char *fn, bool pass_end, const DvResult **ret);
        /* room for size bytes of this rank's input (dv_span_reserve()) */
        int (*reserve)(deval_group *g, uint64_t size);
        /* is an eval pass open on g (dv_span_pass_open()) */
        int (*pass_open)(const deval_group *g);
        /* leave the node's group and free the spanning state (dv_span_free()) */
        void (*free)(deval_group *g);
} DvSpanOps;

struct deval_group {
        int sock;
        DvSpan *span; /* a group that spans machines (span.c): this handle's collectives
                                run there, in global ranks; NULL: a group of one machine */
        const DvSpanOps *span_ops; /* what it does, set with span */
        DvRequest *req; /* where this rank describes its collective: its slot, or the span's */
        int rank, world;
        pid_t pid; /* the process that joined; a forked child may not use the handle */
        struct deval_group *held_next; /* held.c's list of this process's groups */
        unsigned forks; /* dv_forks() at the join: while it holds, this is that process */
        int timeout_ms; /* < 0: forever */
        char name[DV_GROUP_NAME_MAX];
        char socket_path[108];
        DvCtlHeader *hdr; /* what this rank writes: its slot, the arrive word */
        uint64_t ctl_size;
        const DvDoneHeader *done; /* what devald writes, mapped read-only */
        uint64_t done_size;
        uint8_t *in;
        uint64_t in_size;
        uint64_t in_keep; /* bytes at the arena's start handed out by deval_input_buffer() */
        const uint8_t *out;
        uint64_t out_size;
        uint64_t out_gen;
        int device;   /* a device group: this rank's CUDA device; -1: host arenas only */
        uint64_t din; /* device input arena, mapped here */
        uint64_t din_size;
        uint64_t dout; /* device output arena on this rank's GPU, mapped here */
        uint64_t dout_size;
        uint64_t dout_gen;
        uint32_t seq;
        uint32_t restages;   /* steps posted again under a new seq (calls.h) */
        uint32_t uncounted;  /* steps the binding made of its own (calls.h: dv_uncount()) */
        uint32_t call_as;    /* a spanning group's node group: the user's call its steps serve */
        DvTunables tun;      /* the environment's tunables, read once, at the join */
        bool batch;          /* deval_eval_batch() was called in this pass: calls count per site */
        DvSites sites;       /* the pass's call sites, and the next call's (sites.h) */
        int32_t pass_order;  /* deval_eval_begin()'s: the order of a call past the counted sites */
        uint32_t batch_no;   /* deval_eval_batch() calls since the pass began */
        const uint8_t *view; /* where the last result's descriptors point: out, or a kept copy */
        uint64_t view_size;
        DvReplayState replay; /* what devald answered for this rank while parked (replay.h) */
        DvResumeState resume; /* the pass's journal, and the batches it answers (resume.h) */
        const DvResumeOps *resume_ops; /* what it does, from the first pass on */
        int failed;                    /* sticky status once the group is unusable */
        bool debug;
        uint64_t spin_ns;  /* busy-wait this long before sleeping on the futex */
        uint64_t yield_ns; /* then yield the core this long (more ranks than cores) */
        bool crowd_aware;  /* no spinning while the machine is crowded (crowd.h) */
        DvCrowd crowd;
        bool rank_steps;       /* small steps may run on the ranks ($DEVAL_RANK_STEPS=0: never) */
        uint64_t alive_ns;     /* when this rank last saw devald alive, before running a step */
        uint8_t *inl;          /* this rank's inline input bytes in the control segment */
        uint8_t *inl_all;      /* rank k's at inl_all + k * inl_size */
        uint32_t inl_size;     /* 0: none (a device group) */
        DvPassShared *pass_sh; /* the eval pass's counters (wire.h) */
        DvFastState fast;      /* steps a rank runs for the others (fast.h) */
        DvMirrorState mirror;  /* steps every rank runs by itself (mirror.h) */
        DvDirect direct;       /* the output every rank writes its own rows into (fast.h) */
        /* this rank's inputs of the gather in flight, as it described them: where they lie
         * here (its own memory, inline bytes or input arena) and their size */
        int own_n;
        const uint8_t *own_src[DEVAL_MAX_TENSORS];
        uint64_t own_bytes[DEVAL_MAX_TENSORS];
        deval_bytes *items;
        size_t items_cap;
        struct DvIdent *ident; /* an eval pass with keys (ident.c); NULL: none */
        char errmsg[DV_MSG_MAX + 128];
};

int dv_set_err(deval_group *g, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
int dv_request(deval_group *g, const void *req, size_t len, DvReply *rep, int *fds, int *nfds);
/* devald's reply on sock within timeout_ms (< 0: forever), fds closed when it is bad. */
int dv_recv_reply(int sock, int timeout_ms, DvReply *rep, int *fds, int *nfds);
#define REPLY_GRACE_MS 5000 /* devald's time to answer, past the handle's timeout */

bool dv_daemon_alive(const deval_group *g);
unsigned dv_forks(void);
int dv_opts_copy(void *known, size_t known_size, const void *opts, uint32_t size, const char *what,
                 char *why, size_t len);
