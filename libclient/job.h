/* SPDX-License-Identifier: MIT */
/*
 * job.h - which job started this process, from its launcher's environment: a group name that
 * every rank of the job computes alike and no other job shares, and the rank and world size.
 */
#pragma once

#include <stddef.h>

#include "tunables.h"
#include "wire.h"

typedef struct {
        char launcher[DV_LAUNCHER_MAX]; /* "torchrun", "lightning", "mpirun", "srun", ... */
        char name[DV_GROUP_NAME_MAX];
        /* the same for every run of the job: the name without the launcher's restart count
         * (resume.c); "" when the launcher restarts nothing and its keys are the user's */
        char resume[DV_GROUP_NAME_MAX];
        int rank;    /* -1: the launcher does not say */
        int world;   /* -1: the launcher does not say */
        int local;   /* of them, ranks on this machine; -1: the launcher does not say */
        int nodes;   /* machines the job runs on; -1: the launcher does not say */
        int machine; /* this machine's index in the job; -1: the launcher does not say */
        char local_var[32], nodes_var[32], machine_var[32]; /* where they came from */
} DvJob;

int dv_job_from_env(DvJob *ret, char *err, size_t errlen);
int dv_job_one_machine(const DvJob *job, char *err, size_t errlen);
int dv_env_int(const char *name);
/* The job's resume key (DvJob.resume) into key; DEVAL_EINVAL when no launcher names one. */
int dv_job_resume_key(char *key, size_t len);
/* The key a pass's journal is kept under, where the job asks for one; "": none. */
void dv_job_journal_key(const DvTunables *tun, char *key, size_t len);
