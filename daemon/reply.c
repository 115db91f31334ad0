/* SPDX-License-Identifier: MIT */
/*
 * reply.c - answering a client's request on its connection: a status and a message, or
 * success with the shared segments it asked for. A send never blocks: a client that does
 * not read its socket is not waited for.
 */
#define _GNU_SOURCE
#include "reply.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "sock.h"
#include "util.h"

/* Send r; a client that does not read its socket is not waited for, a failed send is logged. */
static void conn_send(Conn *c, const DvReply *r, const int *fds, int nfds) {
        if (c->hangup_ns) /* nobody is listening */
                return;
        ssize_t n = dv_send_msg(c->fd, r, sizeof(*r), fds, nfds, MSG_DONTWAIT);
        if (n < 0)
                log_warn("could not answer pid %d: %s", (int)c->pid, strerror((int)-n));
}

/**
 * conn_reply() - answer c's request with status and msg (shown to the user as it is: say
 * what was wrong and what to change). Never blocks.
 */
void conn_reply(Conn *c, int status, const char *msg) {
        DvReply r = {.hdr = {DV_PROTO_VERSION, DV_MSG_REPLY}, .status = status};
        snprintf(r.msg, sizeof(r.msg), "%s", msg ? msg : "");
        conn_send(c, &r, NULL, 0);
}

/**
 * conn_reply_segments() - answer c's request with success and shared segments: s->n
 * descriptors (still devald's: the kernel duplicates them) with their sizes, the output
 * generations and DV_REPLY_* flags. Never blocks.
 */
void conn_reply_segments(Conn *c, const ConnSegments *s) {
        DvReply r = {.hdr = {DV_PROTO_VERSION, DV_MSG_REPLY},
                     .nfds = (uint32_t)s->n,
                     .gen = s->gen,
                     .dev_gen = s->dev_gen,
                     .flags = s->flags};
        assert(s->n >= 0 && s->n <= (int)DV_ARRAY_SIZE(r.size));
        for (int i = 0; i < s->n; i++)
                r.size[i] = s->sizes[i];
        conn_send(c, &r, s->fds, s->n);
}
