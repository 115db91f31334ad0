/* SPDX-License-Identifier: MIT */
/*
 * fuzz-msg.c - devald's first look at a client's socket message (common/check.c): whatever
 * the bytes, dv_msg_check() names a type only when the size is that type's, a join that
 * passes dv_join_check() has a terminated name and a rank inside its world, and a span record
 * that passes dv_span_check() (for the group sizes a join allows) lists its nodes and ranks
 * inside its world, each rank once.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int span_check(const uint8_t *data, size_t size) {
        if (size != sizeof(DvSpanReq))
                abort();
        DvSpanReq req;
        memcpy(&req, data, sizeof(req));
        const DvSpanInfo *s = &req.info;
        char why[DV_MSG_MAX];
        for (int local = 1; local <= 4; local++) {
                if (dv_span_check(s, local, why, sizeof(why)) != 0)
                        continue;
                if (!memchr(s->group, 0, sizeof(s->group)) || s->node < 0 || s->node >= s->nodes ||
                    s->world > DEVAL_MAX_WORLD || s->listed > DV_SPAN_NODES || s->listed < 1)
                        abort();
                for (int k = 0; k < local; k++)
                        if (s->ranks[k] < 0 || s->ranks[k] >= s->world)
                                abort();
                for (int n = 0; n < s->listed; n++)
                        if (!memchr(s->node_info[n].host, 0, sizeof(s->node_info[n].host)))
                                abort();
        }
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        int type = dv_msg_check(data, size);
        if (type < 0)
                return 0;
        if (size < sizeof(DvMsgHdr))
                abort();
        if (type == DV_MSG_SPAN)
                return span_check(data, size);
        if (type != DV_MSG_JOIN)
                return 0;
        if (size != sizeof(DvJoinReq))
                abort();
        DvJoinReq req; /* devald's copy: the receive buffer is a union, so aligned */
        memcpy(&req, data, sizeof(req));
        char why[DV_MSG_MAX];
        if (dv_join_check(&req, why, sizeof(why)) == 0 &&
            (!memchr(req.group, 0, sizeof(req.group)) || req.rank < 0 ||
             req.rank >= req.world_size || req.world_size > DEVAL_MAX_WORLD))
                abort();
        return 0;
}
