/* SPDX-License-Identifier: MIT */
/*
 * tunables.h - deval's tunables: the environment variables that change how it runs, in one
 * table (tunables.c) that says each one's name and the kind of value it takes, read with
 * secure_getenv and checked in one place. What each one does is documented once, in the
 * ENVIRONMENT section of deval(3) (devald(8) for devald's), and a unit test holds the table
 * and the pages to the same names.
 *
 * The variables that name things (DEVAL_SOCKET, DEVALD, DEVAL_NODE, the launchers') and the
 * tests' own (DEVAL_GPU_FAKE*, DEVAL_FAULT) are read where they are used; this table holds
 * the ones whose value is a switch or a number.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
        DV_TUN_BOOL,  /* 1, yes, true, on / 0, no, false, off */
        DV_TUN_FLAG,  /* set at all (to anything but 0, no, false or off) */
        DV_TUN_COUNT, /* a whole number: bytes, microseconds, milliseconds, seconds */
};

/* name, kind, what a number counts (for messages) */
#define DV_TUNABLES(X)                                                                        \
        X(AUTOSTART, "DEVAL_AUTOSTART", DV_TUN_BOOL, NULL)                                    \
        X(IDLE_EXIT, "DEVAL_IDLE_EXIT", DV_TUN_COUNT, "seconds")                              \
        X(DEBUG, "DEVAL_DEBUG", DV_TUN_FLAG, NULL)                                            \
        X(ONE_MACHINE, "DEVAL_ONE_MACHINE", DV_TUN_BOOL, NULL)                                \
        X(SPIN_US, "DEVAL_SPIN_US", DV_TUN_COUNT, "microseconds")                             \
        X(YIELD_US, "DEVAL_YIELD_US", DV_TUN_COUNT, "microseconds")                           \
        X(RANK_STEPS, "DEVAL_RANK_STEPS", DV_TUN_BOOL, NULL)                                  \
        X(MIRROR, "DEVAL_MIRROR", DV_TUN_BOOL, NULL)                                          \
        X(SHARE_MIN, "DEVAL_SHARE_MIN", DV_TUN_COUNT, "bytes")                                \
        X(DIRECT_MIN, "DEVAL_DIRECT_MIN", DV_TUN_COUNT, "bytes")                              \
        X(SPAN_MAX_BYTES, "DEVAL_SPAN_MAX_BYTES", DV_TUN_COUNT, "bytes")                      \
        X(GPU_WORKER_TIMEOUT_MS, "DEVAL_GPU_WORKER_TIMEOUT_MS", DV_TUN_COUNT, "milliseconds") \
        X(CUDA_LEGACY_IPC, "DEVAL_CUDA_LEGACY_IPC", DV_TUN_BOOL, NULL)                        \
        X(RESUME, "DEVAL_RESUME", DV_TUN_BOOL, NULL)                                          \
        X(RESUME_WRITE_THROUGH, "DEVAL_RESUME_WRITE_THROUGH", DV_TUN_BOOL, NULL)

#define DV_TUN_ENUM_(id, name, kind, unit) DV_TUN_##id,
typedef enum {
        DV_TUNABLES(DV_TUN_ENUM_) DV_TUN_MAX_
} DvTun;
#undef DV_TUN_ENUM_

typedef struct {
        const char *name;
        int kind;
        const char *unit;
} DvTunDef;

/* The table, by DvTun. */
extern const DvTunDef dv_tun_defs[DV_TUN_MAX_];

/* The environment's tunables, as one read of it found them. */
typedef struct {
        uint64_t v[DV_TUN_MAX_];
        uint32_t set; /* bit k: dv_tun_defs[k] was set */
} DvTunables;

int dv_tunables_read(DvTunables *t, char *why, size_t why_len);
int dv_tunable_read(DvTun k, bool *ret_set, uint64_t *ret, char *why, size_t why_len);

/* Tunable k's value, or dflt where the environment did not set it. */
static inline uint64_t dv_tun_or(const DvTunables *t, DvTun k, uint64_t dflt) {
        return t->set & (1u << k) ? t->v[k] : dflt;
}

static inline bool dv_tun_set(const DvTunables *t, DvTun k) {
        return t->set & (1u << k);
}
