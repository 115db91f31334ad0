/* SPDX-License-Identifier: MIT */
/*
 * check.c - validating what clients send, before devald uses any of it.
 */
#include "check.h"

#include <stdio.h>
#include <string.h>

#include "deval.h"

#include "dtype.h"
#include "util.h"

/**
 * dv_msg_check() - a request's header and size: the protocol version, a type a client may
 * send, and exactly that type's size.
 */
int dv_msg_check(const void *buf, size_t n) {
        DvMsgHdr h;
        if (n < sizeof(h))
                return -1;
        memcpy(&h, buf, sizeof(h));
        if (h.version != DV_PROTO_VERSION)
                return -1;
        size_t want;
        switch (h.type) {
        case DV_MSG_JOIN:
                want = sizeof(DvJoinReq);
                break;
        case DV_MSG_GROW:
        case DV_MSG_DIRECT:
                want = sizeof(DvGrowReq);
                break;
        case DV_MSG_GROUP:
        case DV_MSG_ABORT:
        case DV_MSG_DUMP:
                want = sizeof(DvNameReq);
                break;
        case DV_MSG_SPAN:
                want = sizeof(DvSpanReq);
                break;
        case DV_MSG_JOURNAL:
        case DV_MSG_JOURNALS:
                want = sizeof(DvJournalReq);
                break;
        case DV_MSG_OUTPUT:
        case DV_MSG_DEV_OUTPUT:
        case DV_MSG_LEAVE:
        case DV_MSG_STATUS:
        case DV_MSG_TOPO:
                want = sizeof(DvMsgHdr);
                break;
        default:
                return -1;
        }
        return n == want ? (int)h.type : -1;
}

/**
 * dv_join_check() - a join's name (1 to DV_GROUP_NAME_MAX - 1 bytes, NUL-terminated in its
 * field), world size (1..DEVAL_MAX_WORLD) and rank (0..world-1).
 */
int dv_join_check(const DvJoinReq *req, char *why, size_t len) {
        if (req->group[0] == '\0' || memchr(req->group, 0, sizeof(req->group)) == NULL) {
                snprintf(why, len, "the group name must be 1 to %d bytes", DV_GROUP_NAME_MAX - 1);
                return DEVAL_EINVAL;
        }
        if (req->world_size < 1 || req->world_size > DEVAL_MAX_WORLD) {
                snprintf(why, len, "world size %d is out of range 1..%d", req->world_size,
                         DEVAL_MAX_WORLD);
                return DEVAL_EINVAL;
        }
        if (req->rank < 0 || req->rank >= req->world_size) {
                snprintf(why, len, "rank %d is out of range for world size %d", req->rank,
                         req->world_size);
                return DEVAL_EINVAL;
        }
        const char *end = memchr(req->launcher, 0, sizeof(req->launcher));
        for (const char *c = req->launcher; end && c < end; c++)
                if (*c < 0x21 || *c > 0x7e)
                        end = NULL;
        if (!end) {
                snprintf(why, len, "the launcher's name must be up to %d printable bytes",
                         DV_LAUNCHER_MAX - 1);
                return DEVAL_EINVAL;
        }
        return 0;
}

int dv_staging_status(int32_t status) {
        return status == DEVAL_ENOMEM || status == DEVAL_ESYS || status == DEVAL_EINVAL ? status
                                                                                        : 0;
}

size_t dv_printable(char *dst, size_t len, const char *src, size_t srclen) {
        size_t n = 0;
        if (!len)
                return 0;
        for (; n < len - 1 && n < srclen && src[n]; n++)
                dst[n] = src[n] >= 0x20 && src[n] < 0x7f ? src[n] : '?';
        dst[n] = '\0';
        return n;
}

int dv_desc_check(const DvTensorDesc *t, uint64_t arena, bool with_data) {
        int64_t numel = 1, bytes;
        if (!dv_dtype_valid(t->dtype) || t->ndim < 0 || t->ndim > DEVAL_MAX_DIMS)
                return DV_DESC_BAD_TYPE;
        for (int d = 0; d < t->ndim; d++)
                if (t->shape[d] < 0 || !dv_mul_ok(numel, t->shape[d], &numel))
                        return DV_DESC_BAD_SHAPE;
        if (!with_data)
                return DV_DESC_OK;
        if (!dv_mul_ok(numel, (int64_t)dv_dtype_size(t->dtype), &bytes) ||
            (uint64_t)bytes != t->nbytes || t->offset % 8 != 0 || t->offset > arena ||
            t->nbytes > arena - t->offset)
                return DV_DESC_BAD_PLACE;
        return DV_DESC_OK;
}

/**
 * dv_span_check() - a span record's fields: its name, the node within the nodes, the nodes
 * listed, their ranks and hosts, and the spanning group's rank of each of local_world ranks,
 * each once, within the world.
 */
int dv_span_check(const DvSpanInfo *s, int local_world, char *why, size_t len) {
        if (s->group[0] == '\0' || !memchr(s->group, 0, sizeof(s->group)))
                return snprintf(why, len, "malformed span record: its group name"), DEVAL_EINVAL;
        if (s->world < local_world || s->world > DEVAL_MAX_WORLD || s->nodes < 1 ||
            s->nodes > s->world || s->node < 0 || s->node >= s->nodes ||
            s->listed != (s->nodes < DV_SPAN_NODES ? s->nodes : DV_SPAN_NODES))
                return snprintf(why, len,
                                "malformed span record: node %d of %d, %d listed, world %d",
                                s->node, s->nodes, s->listed, s->world),
                       DEVAL_EINVAL;
        for (int n = 0; n < s->listed; n++) {
                const DvSpanNode *x = &s->node_info[n];
                if (!memchr(x->host, 0, sizeof(x->host)) || x->nranks < 1 || x->nranks > s->world ||
                    x->leader < 0 || x->leader >= s->world)
                        return snprintf(why, len, "malformed span record: node %d", n),
                               DEVAL_EINVAL;
        }
        for (int k = 0; k < local_world; k++) {
                if (s->ranks[k] < 0 || s->ranks[k] >= s->world)
                        return snprintf(why, len, "malformed span record: local rank %d", k),
                               DEVAL_EINVAL;
                for (int j = 0; j < k; j++)
                        if (s->ranks[j] == s->ranks[k])
                                return snprintf(why, len, "malformed span record: rank %d twice",
                                                s->ranks[k]),
                                       DEVAL_EINVAL;
        }
        return 0;
}
