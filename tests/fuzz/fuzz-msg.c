/* SPDX-License-Identifier: MIT */
/*
 * fuzz-msg.c - devald's first look at a client's socket message (common/check.c): whatever
 * the bytes, dv_msg_check() names a type only when the size is that type's, and a join
 * that passes dv_join_check() has a terminated name and a rank inside its world.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        int type = dv_msg_check(data, size);
        if (type < 0)
                return 0;
        if (size < sizeof(DvMsgHdr))
                abort();
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
