/* SPDX-License-Identifier: MIT */
/*
 * mpi.c - libdeval-mpi: MPI as the engine between the machines of a spanning group.
 *
 * The leaders' allgather is a send to and a receive from every other leader, polled until
 * the group's deadline, so that a leader that stops answering is named rather than waited
 * for: MPI's own collectives have no deadline. The leaders' communicator returns errors
 * instead of aborting the job; whether a dead process is reported or ends the job is the MPI
 * runtime's choice (Open MPI's mpirun ends it).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deval_mpi.h"
#include "join_err.h"

#define TAG 0x5e7a

typedef struct {
        MPI_Comm leaders; /* MPI_COMM_NULL on the ranks that are not leaders */
        int node, nodes;
        MPI_Request *reqs; /* [2 * nodes] */
} Engine;

static long long now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int mpi_fail(int err, const char *what, char *why, size_t len) {
        char s[MPI_MAX_ERROR_STRING];
        int n = 0;
        MPI_Error_string(err, s, &n);
        snprintf(why, len, "%s: %.*s", what, n, s);
        return DEVAL_EPEER;
}

static int allgather(void *ctx, const void *send, void *recv, size_t len, int timeout_ms, char *why,
                     size_t why_len) {
        Engine *e = ctx;
        int N = e->nodes, err;

        if (len > (size_t)1 << 30) {
                snprintf(why, why_len, "a node's part of %zu bytes is over MPI's 1 GiB count", len);
                return DEVAL_ENOTSUP;
        }
        char *own = (char *)recv + (size_t)e->node * len;
        if (own != send) /* libdeval passes its own place in recv */
                memcpy(own, send, len);
        for (int n = 0; n < N; n++) {
                if (n == e->node)
                        continue;
                err = MPI_Irecv((char *)recv + (size_t)n * len, (int)len, MPI_BYTE, n, TAG,
                                e->leaders, &e->reqs[n]);
                if (err != MPI_SUCCESS)
                        return mpi_fail(err, "MPI_Irecv", why, why_len);
                err = MPI_Isend(send, (int)len, MPI_BYTE, n, TAG, e->leaders, &e->reqs[N + n]);
                if (err != MPI_SUCCESS)
                        return mpi_fail(err, "MPI_Isend", why, why_len);
        }
        long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
        for (unsigned spin = 0;; spin++) {
                int done = 0;
                for (int i = 0; i < 2 * N; i++) {
                        if (e->reqs[i] == MPI_REQUEST_NULL) {
                                done++;
                                continue;
                        }
                        int flag = 0;
                        err = MPI_Test(&e->reqs[i], &flag, MPI_STATUS_IGNORE);
                        if (err != MPI_SUCCESS)
                                return mpi_fail(err, "MPI_Test", why, why_len);
                        done += flag;
                }
                if (done == 2 * N)
                        return 0;
                if (deadline >= 0 && now_ms() > deadline)
                        break;
                if (spin > 1000) {
                        struct timespec ts = {0, 50000};
                        nanosleep(&ts, NULL);
                }
        }
        size_t o = (size_t)snprintf(why, why_len, "no answer within %d ms from node", timeout_ms);
        for (int n = 0; n < N && o < why_len; n++)
                if (n != e->node && e->reqs[n] != MPI_REQUEST_NULL)
                        o += (size_t)snprintf(why + o, why_len - o, " %d", n);
        for (int i = 0; i < 2 * N; i++)
                if (e->reqs[i] != MPI_REQUEST_NULL) {
                        MPI_Cancel(&e->reqs[i]);
                        MPI_Request_free(&e->reqs[i]);
                }
        return DEVAL_ETIMEDOUT;
}

static void release(void *ctx) {
        Engine *e = ctx;
        if (!e)
                return;
        if (e->leaders != MPI_COMM_NULL)
                MPI_Comm_free(&e->leaders);
        free(e->reqs);
        free(e);
}

/* A join's MPI call failed: DEVAL_ESYS, with MPI's words for deval_errmsg(NULL). */
static int mpi_join_fail(int err, const char *call) {
        char s[MPI_MAX_ERROR_STRING] = "";
        int n = 0;
        MPI_Error_string(err, s, &n);
        return dv_join_err(DEVAL_ESYS, "deval_mpi_join: %s failed: %s", call, s);
}

/**
 * deval_mpi_join() - join a group of comm's ranks, across machines through MPI (deval_mpi.h).
 */
int deval_mpi_join(MPI_Comm comm, const char *group, const deval_join_opts *opts,
                   deval_group **out) {
        int rank, world, lrank, lworld, color, err;
        MPI_Comm node_comm;

        if ((err = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS ||
            (err = MPI_Comm_size(comm, &world)) != MPI_SUCCESS)
                return mpi_join_fail(err, "MPI_Comm_rank or MPI_Comm_size");
        const char *env = secure_getenv("DEVAL_NODE");
        if (env && *env) {
                char *end;
                long v = strtol(env, &end, 10);
                if (*end || v < 0 || v > 1 << 20)
                        return dv_join_err(DEVAL_EINVAL,
                                           "deval_mpi_join: $DEVAL_NODE is '%.32s', not a "
                                           "machine's number (0 to 2^20)",
                                           env);
                color = (int)v;
                err = MPI_Comm_split(comm, color, rank, &node_comm);
        } else {
                err = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                          &node_comm);
        }
        if (err != MPI_SUCCESS)
                return mpi_join_fail(err, env && *env ? "MPI_Comm_split" : "MPI_Comm_split_type");
        MPI_Comm_rank(node_comm, &lrank);
        MPI_Comm_size(node_comm, &lworld);
        Engine *e = calloc(1, sizeof(*e));
        if (!e) {
                MPI_Comm_free(&node_comm);
                return dv_join_err(DEVAL_ENOMEM, "deval_mpi_join: out of memory");
        }
        e->leaders = MPI_COMM_NULL;
        err = MPI_Comm_split(comm, lrank == 0 ? 0 : MPI_UNDEFINED, rank, &e->leaders);
        int nn[2] = {0, 0};
        if (err == MPI_SUCCESS && e->leaders != MPI_COMM_NULL) {
                MPI_Comm_set_errhandler(e->leaders, MPI_ERRORS_RETURN);
                MPI_Comm_rank(e->leaders, &nn[0]);
                MPI_Comm_size(e->leaders, &nn[1]);
        }
        if (err == MPI_SUCCESS)
                err = MPI_Bcast(nn, 2, MPI_INT, 0, node_comm);
        MPI_Comm_free(&node_comm);
        e->node = nn[0];
        e->nodes = nn[1];
        e->reqs = calloc(2 * (size_t)(e->nodes > 0 ? e->nodes : 1), sizeof(MPI_Request));
        if (err != MPI_SUCCESS || !e->reqs) {
                release(e);
                return err != MPI_SUCCESS
                               ? mpi_join_fail(err, "MPI_Comm_split or MPI_Bcast among the node's "
                                                    "ranks")
                               : dv_join_err(DEVAL_ENOMEM, "deval_mpi_join: out of memory");
        }
        for (int i = 0; i < 2 * e->nodes; i++)
                e->reqs[i] = MPI_REQUEST_NULL;
        deval_engine eng = {DEVAL_ENGINE_INIT, .nodes = e->nodes,      .node = e->node,
                            .ctx = e,          .allgather = allgather, .release = release};
        int r = deval_join_spanning(group, rank, world, lrank, lworld, opts, &eng, out);
        if (r < 0)
                release(e);
        return r;
}
