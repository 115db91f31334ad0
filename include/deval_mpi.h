/* SPDX-License-Identifier: MIT */
/*
 * deval_mpi.h - libdeval-mpi: a deval group over the ranks of an MPI communicator, on one
 * machine or several. libdeval itself never links MPI; this library does, and lends it to
 * libdeval as the engine between machines (deval_engine in deval.h).
 */
#ifndef DEVAL_MPI_H
#define DEVAL_MPI_H

#include <mpi.h>

#include "deval.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Join a group of every rank of comm, rank for rank (a collective call on comm). The ranks of
 * each machine (MPI_COMM_TYPE_SHARED; $DEVAL_NODE, an integer, overrides it) meet in its
 * devald; each machine's lowest rank of comm is its leader, and the leaders exchange through
 * a communicator of their own, split from comm, with MPI_ERRORS_RETURN and a deadline. group
 * NULL: named after the job. Leave with deval_leave(). MPI must stay initialised until then.
 * Return: as deval_join_spanning(); DEVAL_ESYS when an MPI call fails.
 */
int deval_mpi_join(MPI_Comm comm, const char *group, const deval_join_opts *opts,
                   deval_group **out);

#ifdef __cplusplus
}
#endif
#endif
