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
#include "fast.h"
#include "join_err.h"
#include "mirror.h"
#include "plan.h"
#include "replay.h"
#include "resume.h"
#include "tunables.h"
#include "wire.h"

typedef struct DvSpan DvSpan;

struct deval_group {
        int sock;
        DvSpan *span;   /* a group that spans machines (span.c): this handle's collectives
                                run there, in global ranks; NULL: a group of one machine */
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
        uint32_t site[2];    /* the next gather_for_metrics call of the batch: tensors, objects */
        int32_t pass_order;  /* deval_eval_begin()'s: the order of a call past the counted sites */
        uint32_t batch_no;   /* deval_eval_batch() calls since the pass began */
        const uint8_t *view; /* where the last result's descriptors point: out, or a kept copy */
        uint64_t view_size;
        DvReplayState replay; /* what devald answered for this rank while parked (replay.h) */
        DvResumeState resume; /* the pass's journal, and the batches it answers (resume.h) */
        int failed;           /* sticky status once the group is unusable */
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
