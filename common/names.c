/* SPDX-License-Identifier: MIT */
/*
 * names.c - names of statuses and collective ops, for messages on both sides of the wire.
 */
#include "deval.h"

#include "wire.h"

const char *dv_op_name(uint32_t op) {
        static const char *const names[] = {
                [DV_OP_GATHER] = "gather",
                [DV_OP_GATHER_METRICS] = "gather_for_metrics",
                [DV_OP_EVAL_BEGIN] = "eval_begin",
                [DV_OP_EVAL_END] = "eval_end",
                [DV_OP_PAD] = "pad_across_processes",
                [DV_OP_OBJECTS] = "gather_objects",
                [DV_OP_OBJECTS_METRICS] = "gather_objects_for_metrics",
                [DV_OP_REDUCE] = "reduce",
                [DV_OP_BROADCAST] = "broadcast",
                [DV_OP_BROADCAST_BYTES] = "broadcast_bytes",
                [DV_OP_BARRIER] = "barrier",
        };
        return op < DV_OP_MAX_ && names[op] ? names[op] : "unknown";
}

const char *deval_strerror(int status) {
        switch (status) {
        case DEVAL_OK:
                return "success";
        case DEVAL_EINVAL:
                return "invalid argument";
        case DEVAL_EMISMATCH:
                return "ranks disagree";
        case DEVAL_EPEER:
                return "another rank died or left";
        case DEVAL_EDAEMON:
                return "devald unreachable or gone";
        case DEVAL_ETIMEDOUT:
                return "timed out";
        case DEVAL_ENOMEM:
                return "out of memory or over quota";
        case DEVAL_EPERM:
                return "permission denied";
        case DEVAL_EPROTO:
                return "protocol error";
        case DEVAL_EABORTED:
                return "group aborted";
        case DEVAL_ENOTSUP:
                return "not supported";
        case DEVAL_ESYS:
                return "system error";
        }
        return "unknown status";
}
