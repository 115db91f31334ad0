/* SPDX-License-Identifier: MIT */
/*
 * job.c - name the job this process belongs to from what its launcher put in the
 * environment, so that deval_join(NULL, -1, -1, ...) needs no name from the user.
 *
 * Each launcher sets a key that every rank of one job shares and that no other running job
 * has: torchrun (and accelerate launch, which runs it) its rendezvous id and the port of
 * its store, with the restart count so that a restarted job gets a fresh group; Open MPI
 * its job id; Slurm the job and step ids; deval.launch an id of its own; Lightning, whose
 * rank 0 starts the others, the address and port of its store with that process. The group name is
 * the launcher's name and a hash of that key. The first launcher found wins, in the order
 * below: deval.launch and torchrun before the MPI and Slurm that may have started them.
 * $MASTER_PORT alone (ranks a script started itself, mp.spawn as the DDP tutorial shows) is
 * a constant of the user's code that two jobs share: the process that started the ranks,
 * their parent, is part of that key, so two such jobs never meet (ranks that different
 * parents start must name their group).
 */
#define _GNU_SOURCE
#include "job.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deval.h"

#include "journal.h"
#include "tunables.h"
#include "util.h"

static const char *env(const char *name) {
        const char *v = secure_getenv(name);
        return v && *v ? v : NULL;
}

/**
 * dv_env_int() - a whole number in [0, INT_MAX] from $name.
 * Return: the number; -1 when unset or empty; -2 when not such a number.
 */
int dv_env_int(const char *name) {
        const char *v = env(name);
        if (!v)
                return -1;
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (errno || *end || n < 0 || n > INT_MAX)
                return -2;
        return (int)n;
}

typedef struct {
        const char *launcher;
        const char *present; /* the variable that says this launcher started us */
        const char *absent;  /* ... where this one is unset (NULL: always) */
        const char *rank, *world;
        const char *keys[5]; /* what makes the job unique, NULL-terminated */
        /* what names the job across its restarts (resume.c); none: it restarts nothing */
        const char *resume[3];
        bool resume_parent;   /* with the process that restarts the ranks (torchrun's agent) */
        const char *local;    /* its ranks on this machine, if it says */
        const char *nodes[2]; /* the machines it runs on, if it says: the first set wins */
        const char *node[2];  /* which of them this process runs on, if it says: the first set */
        bool by_parent;       /* the keys are a user's constants (a MASTER_PORT hard-coded for
                                 mp.spawn): the process that started the ranks tells jobs apart */
        bool by_first;        /* the same, where rank 0 started the others (Lightning): the
                                 process of local rank 0 tells jobs apart */
        const char *machine;  /* this machine's index among the job's, if it says: above 0, the
                                 job runs on more than one */
} Launcher;

static const Launcher launchers[] = {
        {"deval.launch", "DEVAL_LAUNCH_ID", NULL, "RANK", "WORLD_SIZE", {"DEVAL_LAUNCH_ID"}},
        {"torchrun",
         "TORCHELASTIC_RUN_ID",
         NULL,
         "RANK",
         "WORLD_SIZE",
         {"TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"},
         {"TORCHELASTIC_RUN_ID"},
         true,
         "LOCAL_WORLD_SIZE",
         {NULL},
         {"GROUP_RANK"}},
        /* Lightning's own launcher: rank 0 runs the script, which starts the others with
         * $LOCAL_RANK (and $NODE_RANK, $WORLD_SIZE, $MASTER_PORT), but no $RANK */
        {"lightning",
         "NODE_RANK",
         "RANK",
         "LOCAL_RANK",
         "WORLD_SIZE",
         {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK"},
         {NULL},
         false,
         NULL,
         {NULL},
         {"NODE_RANK"},
         false,
         true,
         "NODE_RANK"},
        {"torch",
         "MASTER_PORT",
         NULL,
         "RANK",
         "WORLD_SIZE",
         {"MASTER_ADDR", "MASTER_PORT"},
         {NULL},
         false,
         "LOCAL_WORLD_SIZE",
         {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, /* ranks srun started, or spawned under it */
         {"GROUP_RANK", "SLURM_NODEID"},           /* a torchrun agent's, or srun's */
         true},
        {"mpirun",
         "OMPI_COMM_WORLD_SIZE",
         NULL,
         "OMPI_COMM_WORLD_RANK",
         "OMPI_COMM_WORLD_SIZE",
         {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"},
         {NULL},
         false,
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"srun",
         "SLURM_JOB_ID",
         NULL,
         "SLURM_PROCID",
         "SLURM_NTASKS",
         {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"},
         {"SLURM_JOB_ID", "SLURM_STEP_ID"},
         false,
         NULL,
         {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"},
         {"SLURM_NODEID"}},
};

/* Did l start this process, as its variables say? */
static bool started_us(const Launcher *l) {
        return env(l->present) && !(l->absent && env(l->absent));
}

/* The name of l's job that its restarts share, from l->resume; "" when it has none. */
static void resume_key(const Launcher *l, char *key, size_t len) {
        uint64_t h = 0xcbf29ce484222325ull;
        char part[512];
        key[0] = '\0';
        if (!l->resume[0])
                return;
        for (int i = 0; i < 3 && l->resume[i]; i++) {
                const char *v = env(l->resume[i]);
                if (!v)
                        return;
                snprintf(part, sizeof(part), "%s=%s;", l->resume[i], v);
                for (const char *c = part; *c; c++)
                        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
        }
        if (l->resume_parent) {
                snprintf(part, sizeof(part), "parent=%ld;", (long)getppid());
                for (const char *c = part; *c; c++)
                        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
        }
        snprintf(key, len, "%s-%016" PRIx64, l->launcher, h);
}

/**
 * dv_job_from_env() - the job this process belongs to, from its launcher's variables.
 * @ret: filled on success.
 * @err: why not, on failure.
 * Return: 0; DEVAL_EINVAL when no launcher is found (err names the variables looked for),
 * or a rank or world size that is not a number.
 */
int dv_job_from_env(DvJob *ret, char *err, size_t errlen) {
        for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
                const Launcher *l = &launchers[i];
                if (!started_us(l))
                        continue;
                int rank = dv_env_int(l->rank), world = dv_env_int(l->world);
                if (rank == -2 || world == -2) {
                        snprintf(err, errlen, "$%s or $%s (set by %s) is not a number", l->rank,
                                 l->world, l->launcher);
                        return DEVAL_EINVAL;
                }
                /* FNV-1a over the launcher and its keys, each with its name */
                uint64_t h = 0xcbf29ce484222325ull;
                bool any = false;
                for (const char *const *k = l->keys; *k; k++) {
                        const char *v = env(*k);
                        char part[512];
                        snprintf(part, sizeof(part), "%s=%s;", *k, v ? v : "");
                        any |= v != NULL;
                        for (const char *c = part; *c; c++)
                                h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
                }
                if (l->by_parent || l->by_first) {
                        /* by_first: local rank 0 is the process that started the others */
                        long first = l->by_first && rank == 0 ? (long)getpid() : (long)getppid();
                        char part[64];
                        snprintf(part, sizeof(part), "parent=%ld;", first);
                        for (const char *c = part; *c; c++)
                                h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
                }
                if (!any) {
                        snprintf(err, errlen,
                                 "%s started this process but set none of the variables that "
                                 "tell its job from others ($%s ...); name the group",
                                 l->launcher, l->keys[0]);
                        return DEVAL_EINVAL;
                }
                memset(ret, 0, sizeof(*ret));
                snprintf(ret->launcher, sizeof(ret->launcher), "%s", l->launcher);
                snprintf(ret->name, sizeof(ret->name), "%s-%016" PRIx64, l->launcher, h);
                resume_key(l, ret->resume, sizeof(ret->resume));
                ret->rank = rank;
                ret->world = world;
                ret->local = ret->nodes = ret->machine = -1;
                if (l->machine && (ret->machine = dv_env_int(l->machine)) >= 0)
                        snprintf(ret->machine_var, sizeof(ret->machine_var), "%s", l->machine);
                ret->machine = DV_MAX(ret->machine, -1);
                if (l->local && (ret->local = dv_env_int(l->local)) >= 0)
                        snprintf(ret->local_var, sizeof(ret->local_var), "%s", l->local);
                for (int k = 0; k < 2 && l->nodes[k] && ret->nodes < 0; k++)
                        if ((ret->nodes = dv_env_int(l->nodes[k])) >= 0)
                                snprintf(ret->nodes_var, sizeof(ret->nodes_var), "%s", l->nodes[k]);
                ret->local = DV_MAX(ret->local, -1); /* not a number: not said */
                ret->nodes = DV_MAX(ret->nodes, -1);
                return 0;
        }
        snprintf(err, errlen,
                 "no group name, and nothing says which job this process belongs to: looked "
                 "for $DEVAL_LAUNCH_ID (python -m deval.launch), $TORCHELASTIC_RUN_ID or "
                 "$MASTER_PORT with $RANK and $WORLD_SIZE (torchrun, accelerate launch), "
                 "$NODE_RANK, $LOCAL_RANK and $WORLD_SIZE (Lightning's launcher), "
                 "$OMPI_COMM_WORLD_RANK and $OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), "
                 "$SLURM_JOB_ID, $SLURM_PROCID and $SLURM_NTASKS (srun); name the group "
                 "and give the rank and world size (0 and 1 for a process on its own)");
        return DEVAL_EINVAL;
}

/**
 * dv_job_resume_key() - the key every run of this job shares, its restarts' too: what
 * names the job without the launcher's restart count (resume.c keeps a pass's results
 * under it).
 * Return: 0 with key; DEVAL_EINVAL when no launcher names a job that restarts alike.
 */
int dv_job_resume_key(char *key, size_t len) {
        DvJob job;
        char err[640];
        if (dv_job_from_env(&job, err, sizeof(err)) < 0 || !job.resume[0])
                return DEVAL_EINVAL;
        snprintf(key, len, "%s", job.resume);
        return 0;
}

/**
 * dv_job_journal_key() - the key a pass's journal is kept under (resume.c), where the job
 * asks for one: $DEVAL_RESUME=1, or a $DEVAL_RESUME_KEY of the user's (unless
 * $DEVAL_RESUME=0).
 * @tun: the join's tunables
 * @key: where the key goes: the user's key hashed, or the launcher's (dv_job_resume_key());
 *       "" where the job keeps no journal
 * @len: key's size, DV_RESUME_KEY_MAX
 */
void dv_job_journal_key(const DvTunables *tun, char *key, size_t len) {
        char k[DV_RESUME_KEY_MAX] = "";
        const char *v = secure_getenv("DEVAL_RESUME_KEY");
        if (len)
                key[0] = '\0';
        /* asked for: $DEVAL_RESUME=1, or a resume key of the user's (unless $DEVAL_RESUME=0) */
        if (!dv_tun_or(tun, DV_TUN_RESUME, v && *v))
                return;
        if (v && *v) {
                uint64_t h = dv_journal_hash(DV_JOURNAL_HASH0, v, strlen(v));
                snprintf(k, sizeof(k), "user-%016" PRIx64, h);
        } else if (dv_job_resume_key(k, sizeof(k)) < 0) {
                return; /* no launcher names a job: nothing to resume */
        }
        snprintf(key, len, "%s", k);
}

/* $DEVAL_ONE_MACHINE=1: every rank runs here, whatever the launcher says. 1 when it says
 * so, 0 when not, DEVAL_EINVAL (with err) when it says something else. */
static int one_machine_said(char *err, size_t errlen) {
        bool set;
        uint64_t v;
        int r = dv_tunable_read(DV_TUN_ONE_MACHINE, &set, &v, err, errlen);
        return r < 0 ? r : set && v;
}

/* Does job say it runs on more than one machine? says: what it says, in a phrase. */
static bool spans(const DvJob *job, char *says, size_t len) {
        if (job->local >= 0 && job->world >= 0 && job->local < job->world)
                snprintf(says, len, "%s says %d of its %d ranks run on this one ($%s)",
                         job->launcher, job->local, job->world, job->local_var);
        else if (job->nodes > 1)
                snprintf(says, len, "%s says it runs on %d machines ($%s)", job->launcher,
                         job->nodes, job->nodes_var);
        else if (job->machine > 0)
                snprintf(says, len, "%s says this is machine %d of its job ($%s)", job->launcher,
                         job->machine, job->machine_var);
        else
                return false;
        return true;
}

/**
 * dv_job_one_machine() - does the job run on this machine alone, as far as its launcher
 * says? A group holds the ranks of one machine (one devald): joined as the whole job's world,
 * the ranks of the other machines would never come, and the join would wait for them until
 * its deadline.
 * $DEVAL_ONE_MACHINE=1 says every rank runs here.
 * Return: 0; DEVAL_ENOTSUP, with err saying so and what to do instead.
 */
int dv_job_one_machine(const DvJob *job, char *err, size_t errlen) {
        char says[160];
        int r = one_machine_said(err, errlen);
        if (r != 0)
                return r < 0 ? r : 0;
        if (!spans(job, says, sizeof(says)))
                return 0;
        snprintf(err, errlen,
                 "this job runs on more than one machine: %s; deval_join() holds the "
                 "ranks of one machine, so the others would never join it. Join a group that "
                 "spans the machines through the job's engine (deval_mpi_join() of "
                 "libdeval-mpi; in Python, deval.join() once torch.distributed is initialised), "
                 "give each machine a group of its own, or set DEVAL_ONE_MACHINE=1 if every "
                 "rank does run here",
                 says);
        return DEVAL_ENOTSUP;
}

/**
 * deval_job_spans() - does the launcher that started this process say that its job runs on
 * more than one machine (torchrun's $LOCAL_WORLD_SIZE below its world size, mpirun's
 * $OMPI_COMM_WORLD_LOCAL_SIZE below its size, srun on more than one node)? What the first
 * launcher found says decides, as for deval_join(NULL, ...); $DEVAL_ONE_MACHINE=1 says every
 * rank runs here. @why (may be NULL) gets what it says.
 * Return: 1 when it says so, 0 when it does not (or no launcher is found); DEVAL_EINVAL,
 * with why, when $DEVAL_ONE_MACHINE is neither 1 nor 0.
 */
int deval_job_spans(char *why, size_t why_len) {
        DvJob job;
        char err[640], says[160];
        int r = one_machine_said(err, sizeof(err));
        if (r < 0 && why && why_len)
                snprintf(why, why_len, "%s", err);
        if (r != 0)
                return r < 0 ? r : 0;
        if (dv_job_from_env(&job, err, sizeof(err)) < 0 || !spans(&job, says, sizeof(says)))
                return 0;
        if (why && why_len)
                snprintf(why, why_len, "%s", says);
        return 1;
}

/**
 * deval_job_node() - the machine this process runs on, as a spanning join tells machines
 * apart: $DEVAL_NODE, else what the launcher that started it says (torchrun's $GROUP_RANK,
 * srun's $SLURM_NODEID; ranks with $MASTER_PORT alone, either), else the host name. Every rank of a job finds it alike, so two
 * ranks are on one machine when their ids are equal.
 * @id: gets the id, NUL-terminated (truncated to len - 1 bytes).
 * Return: 0; DEVAL_EINVAL when id is NULL or len is 0.
 */
int deval_job_node(char *id, size_t len) {
        if (!id || !len)
                return DEVAL_EINVAL;
        const char *v = env("DEVAL_NODE");
        for (size_t i = 0; !v && i < sizeof(launchers) / sizeof(launchers[0]); i++)
                if (started_us(&launchers[i])) {
                        for (int k = 0; k < 2 && !v && launchers[i].node[k]; k++)
                                v = env(launchers[i].node[k]);
                        break; /* the first launcher found decides, as for the job's name */
                }
        char host[256] = "";
        if (!v) {
                gethostname(host, sizeof(host) - 1);
                v = host;
        }
        snprintf(id, len, "%s", v);
        return 0;
}
