/* SPDX-License-Identifier: MIT */
/*
 * test-job.c - naming a job from its launcher's environment: every launcher's variables give
 * a name, a rank and a world size; two jobs never share a name; a restarted torchrun job gets
 * a new one; deval.launch and torchrun win over the MPI or Slurm that started them;
 * nothing at all is an error that names what was looked for; a job its launcher says
 * runs on more than one machine is named as such; Lightning's launcher, which sets no $RANK,
 * names its ranks by its first.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "deval.h"

#include "job.h"

static const char *const all_vars[] = {"DEVAL_LAUNCH_ID",
                                       "TORCHELASTIC_RUN_ID",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "RANK",
                                       "WORLD_SIZE",
                                       "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "PMIX_NAMESPACE",
                                       "OMPI_MCA_ess_base_jobid",
                                       "OMPI_MCA_orte_ess_jobid",
                                       "SLURM_JOB_ID",
                                       "SLURM_STEP_ID",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_RESTART_COUNT",
                                       "LOCAL_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                                       "SLURM_STEP_NUM_NODES",
                                       "SLURM_NNODES",
                                       "SLURM_NODEID",
                                       "GROUP_RANK",
                                       "DEVAL_NODE",
                                       "NODE_RANK",
                                       "LOCAL_RANK",
                                       "DEVAL_ONE_MACHINE"};

static void clear(void) {
        for (size_t i = 0; i < sizeof(all_vars) / sizeof(all_vars[0]); i++)
                unsetenv(all_vars[i]);
}

static DvJob job(void) {
        DvJob j;
        char err[640];
        int r = dv_job_from_env(&j, err, sizeof(err));
        if (r != 0)
                fail_msg("dv_job_from_env: %s", err);
        return j;
}

static void torchrun(const char *port, const char *restart, const char *rank) {
        clear();
        setenv("TORCHELASTIC_RUN_ID", "none", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port, 1);
        setenv("TORCHELASTIC_RESTART_COUNT", restart, 1);
        setenv("RANK", rank, 1);
        setenv("WORLD_SIZE", "4", 1);
}

static void test_torchrun(void **state) {
        (void)state;
        torchrun("29500", "0", "2");
        DvJob a = job();
        assert_string_equal(a.launcher, "torchrun");
        assert_int_equal(a.rank, 2);
        assert_int_equal(a.world, 4);
        assert_true(strncmp(a.name, "torchrun-", 9) == 0);
        torchrun("29500", "0", "3"); /* another rank of the same job: the same group */
        DvJob b = job();
        assert_string_equal(a.name, b.name);
        assert_int_equal(b.rank, 3);
        torchrun("29501", "0", "2"); /* another job at the same time */
        assert_string_not_equal(job().name, a.name);
        torchrun("29500", "1", "2"); /* the same job restarted */
        assert_string_not_equal(job().name, a.name);
}

/* The resume key: what every run of one job shares (its restarts'), and no other job. */
static void test_resume_key(void **state) {
        (void)state;
        torchrun("29500", "0", "2");
        DvJob a = job();
        assert_true(strncmp(a.resume, "torchrun-", 9) == 0);
        assert_string_not_equal(a.resume, a.name);
        torchrun("29777", "1", "3"); /* restarted: another port, another group, the same key */
        DvJob b = job();
        assert_string_equal(b.resume, a.resume);
        assert_string_not_equal(b.name, a.name);
        setenv("TORCHELASTIC_RUN_ID", "another", 1); /* another job */
        assert_string_not_equal(job().resume, a.resume);
        char key[64];
        assert_int_equal(dv_job_resume_key(key, sizeof(key)), 0);
        assert_string_equal(key, job().resume);

        clear();
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_PROCID", "5", 1);
        setenv("SLURM_NTASKS", "8", 1);
        DvJob s = job();
        setenv("SLURM_RESTART_COUNT", "1", 1); /* requeued */
        DvJob t = job();
        assert_string_equal(s.resume, t.resume);
        assert_string_not_equal(s.name, t.name);
        setenv("SLURM_JOB_ID", "78", 1);
        assert_string_not_equal(job().resume, s.resume);

        /* launchers that restart nothing: each run is a job of its own */
        clear();
        setenv("DEVAL_LAUNCH_ID", "123-456", 1);
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "2", 1);
        assert_string_equal(job().resume, "");
        assert_int_equal(dv_job_resume_key(key, sizeof(key)), DEVAL_EINVAL);
        clear();
        setenv("MASTER_PORT", "12355", 1);
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "2", 1);
        assert_string_equal(job().resume, "");
}

/* A job named by $MASTER_PORT alone (mp.spawn): the name in a child of this process. */
static void spawned_name(char *buf, size_t len, bool grandchild) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                if (grandchild && fork() != 0) { /* the middle process: wait, then go */
                        wait(NULL);
                        _exit(0);
                }
                char err[256];
                DvJob j;
                memset(&j, 0, sizeof(j));
                if (dv_job_from_env(&j, err, sizeof(err)) != 0)
                        snprintf(j.name, sizeof(j.name), "error: %.40s", err);
                ssize_t w = write(fds[1], j.name, sizeof(j.name));
                _exit(w == (ssize_t)sizeof(j.name) ? 0 : 1);
        }
        close(fds[1]);
        char name[sizeof(((DvJob *)0)->name)];
        assert_int_equal(read(fds[0], name, sizeof(name)), (ssize_t)sizeof(name));
        close(fds[0]);
        waitpid(pid, NULL, 0);
        snprintf(buf, len, "%s", name);
}

static void test_master_port_alone(void **state) {
        (void)state;
        clear();
        setenv("MASTER_ADDR", "localhost", 1);
        setenv("MASTER_PORT", "12355", 1);
        char a[128], b[128], c[128];
        spawned_name(a, sizeof(a), false);
        spawned_name(b, sizeof(b), false);
        spawned_name(c, sizeof(c), true);
        assert_true(strncmp(a, "torch-", 6) == 0);
        assert_string_equal(a, b);     /* two ranks one process spawned: one job */
        assert_string_not_equal(a, c); /* ranks another process spawned: another job */
}

static void test_mpirun_srun_launch(void **state) {
        (void)state;
        clear();
        setenv("OMPI_COMM_WORLD_RANK", "1", 1);
        setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
        setenv("PMIX_NAMESPACE", "prterun-host-1234@1", 1);
        DvJob m = job();
        assert_string_equal(m.launcher, "mpirun");
        assert_int_equal(m.rank, 1);
        assert_int_equal(m.world, 4);
        setenv("PMIX_NAMESPACE", "prterun-host-1235@1", 1);
        assert_string_not_equal(job().name, m.name);

        clear();
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_PROCID", "5", 1);
        setenv("SLURM_NTASKS", "8", 1);
        DvJob s = job();
        assert_string_equal(s.launcher, "srun");
        assert_int_equal(s.rank, 5);
        assert_int_equal(s.world, 8);
        setenv("SLURM_STEP_ID", "1", 1); /* the next step of the job */
        assert_string_not_equal(job().name, s.name);

        /* torchrun started by srun: torchrun's ranks are the ones that count */
        torchrun("29500", "0", "1");
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_PROCID", "0", 1);
        setenv("SLURM_NTASKS", "1", 1);
        assert_string_equal(job().launcher, "torchrun");
        assert_int_equal(job().rank, 1);

        clear();
        setenv("DEVAL_LAUNCH_ID", "123-456", 1);
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "2", 1);
        assert_string_equal(job().launcher, "deval.launch");
}

static void test_nothing_names_the_job(void **state) {
        (void)state;
        DvJob j;
        char err[640];
        clear();
        setenv("RANK", "0", 1); /* a rank alone does not tell one job from another */
        assert_int_equal(dv_job_from_env(&j, err, sizeof(err)), DEVAL_EINVAL);
        assert_non_null(strstr(err, "TORCHELASTIC_RUN_ID"));
        assert_non_null(strstr(err, "OMPI_COMM_WORLD_RANK"));
        assert_non_null(strstr(err, "SLURM_JOB_ID"));
        torchrun("29500", "0", "x");
        assert_int_equal(dv_job_from_env(&j, err, sizeof(err)), DEVAL_EINVAL);
        assert_non_null(strstr(err, "not a number"));
}

/* Whether the launcher says the job runs on this machine alone, and what it says when not. */
static int one_machine(char *err, size_t len) {
        DvJob j = job();
        return dv_job_one_machine(&j, err, len);
}

static void test_more_than_one_machine(void **state) {
        (void)state;
        char err[640];
        torchrun("29500", "0", "2");                        /* 4 ranks */
        assert_int_equal(one_machine(err, sizeof(err)), 0); /* it does not say */
        setenv("LOCAL_WORLD_SIZE", "4", 1);
        assert_int_equal(one_machine(err, sizeof(err)), 0);
        setenv("LOCAL_WORLD_SIZE", "2", 1); /* torchrun --nnodes=2 */
        assert_int_equal(one_machine(err, sizeof(err)), DEVAL_ENOTSUP);
        assert_non_null(strstr(err, "torchrun says 2 of its 4 ranks run on this one"));
        assert_non_null(strstr(err, "$LOCAL_WORLD_SIZE"));
        char why[160];
        assert_int_equal(deval_job_spans(why, sizeof(why)), 1); /* the exported answer */
        assert_non_null(strstr(err, why));
        setenv("DEVAL_ONE_MACHINE", "1", 1);
        assert_int_equal(deval_job_spans(why, sizeof(why)), 0);
        setenv("DEVAL_ONE_MACHINE", "maybe", 1); /* neither: refused, naming it */
        assert_int_equal(deval_job_spans(why, sizeof(why)), DEVAL_EINVAL);
        assert_non_null(strstr(why, "$DEVAL_ONE_MACHINE is 'maybe'"));
        char bad[160];
        assert_int_equal(one_machine(bad, sizeof(bad)), DEVAL_EINVAL);
        unsetenv("DEVAL_ONE_MACHINE");
        /* a single-machine torchrun inside a two-node Slurm allocation: torchrun decides */
        setenv("LOCAL_WORLD_SIZE", "4", 1);
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_NNODES", "2", 1);
        assert_int_equal(deval_job_spans(why, sizeof(why)), 0);
        unsetenv("SLURM_JOB_ID");
        unsetenv("SLURM_NNODES");
        assert_non_null(strstr(err, "DEVAL_ONE_MACHINE=1"));
        setenv("LOCAL_WORLD_SIZE", "two", 1); /* not a number: not said */
        assert_int_equal(one_machine(err, sizeof(err)), 0);

        clear();
        setenv("OMPI_COMM_WORLD_RANK", "1", 1);
        setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
        setenv("PMIX_NAMESPACE", "prterun-host-1234@1", 1);
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
        assert_int_equal(one_machine(err, sizeof(err)), 0);
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
        assert_int_equal(one_machine(err, sizeof(err)), DEVAL_ENOTSUP);
        assert_non_null(strstr(err, "$OMPI_COMM_WORLD_LOCAL_SIZE"));

        clear();
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_PROCID", "5", 1);
        setenv("SLURM_NTASKS", "8", 1);
        setenv("SLURM_NNODES", "4", 1);         /* the allocation */
        setenv("SLURM_STEP_NUM_NODES", "1", 1); /* the step: srun -N1 */
        assert_int_equal(one_machine(err, sizeof(err)), 0);
        unsetenv("SLURM_STEP_NUM_NODES");
        assert_int_equal(one_machine(err, sizeof(err)), DEVAL_ENOTSUP);
        assert_non_null(strstr(err, "srun says it runs on 4 machines ($SLURM_NNODES)"));
}

/* The name a Lightning rank computes, in a child: local rank 0 is the process that starts
 * the others, which compute theirs in processes it started (as Lightning's launcher runs them). */
static void lightning_names(char *first, char *second, size_t len) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { /* local rank 0: the script */
                setenv("LOCAL_RANK", "0", 1);
                DvJob j = job();
                if (j.rank != 0 || strcmp(j.launcher, "lightning") != 0)
                        _exit(1);
                if (write(fds[1], j.name, sizeof(j.name)) != (ssize_t)sizeof(j.name))
                        _exit(1);
                pid_t child = fork(); /* local rank 1: started by it */
                if (child == 0) {
                        setenv("LOCAL_RANK", "1", 1);
                        DvJob k = job();
                        if (k.rank != 1 || k.world != 2)
                                _exit(1);
                        ssize_t w = write(fds[1], k.name, sizeof(k.name));
                        _exit(w == (ssize_t)sizeof(k.name) ? 0 : 1);
                }
                int status = 1;
                waitpid(child, &status, 0);
                _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
        }
        close(fds[1]);
        char name[sizeof(((DvJob *)0)->name)];
        assert_int_equal(read(fds[0], name, sizeof(name)), (ssize_t)sizeof(name));
        snprintf(first, len, "%s", name);
        assert_int_equal(read(fds[0], name, sizeof(name)), (ssize_t)sizeof(name));
        snprintf(second, len, "%s", name);
        close(fds[0]);
        int status = 1;
        waitpid(pid, &status, 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Lightning's launcher: $NODE_RANK, $LOCAL_RANK and $WORLD_SIZE, no $RANK. Its two ranks are
 * one job; the same script run again (another rank 0) is another, whatever its port; a
 * $RANK set by someone else's launcher wins; a node past the first says the job spans. */
static void test_lightning(void **state) {
        (void)state;
        clear();
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", "12910", 1);
        setenv("NODE_RANK", "0", 1);
        setenv("WORLD_SIZE", "2", 1);
        char a0[128], a1[128], b0[128], b1[128];
        lightning_names(a0, a1, sizeof(a0));
        lightning_names(b0, b1, sizeof(b0));
        assert_true(strncmp(a0, "lightning-", 10) == 0);
        assert_string_equal(a0, a1);
        assert_string_equal(b0, b1);
        assert_string_not_equal(a0, b0);
        char err[640];
        setenv("LOCAL_RANK", "1", 1);
        assert_int_equal(one_machine(err, sizeof(err)), 0);
        setenv("NODE_RANK", "1", 1); /* the second machine's ranks */
        assert_int_equal(one_machine(err, sizeof(err)), DEVAL_ENOTSUP);
        assert_non_null(strstr(err, "lightning says this is machine 1 of its job ($NODE_RANK)"));
        char id[64];
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, "1");
        setenv("RANK", "3", 1); /* numbered by another launcher ($MASTER_PORT's) */
        DvJob t = job();
        assert_string_equal(t.launcher, "torch");
        assert_int_equal(t.rank, 3);
        clear();
}

/* The machine this process runs on: $DEVAL_NODE, else the launcher's word, else the host. */
static void test_node(void **state) {
        (void)state;
        char id[64], host[256] = "";
        gethostname(host, sizeof(host) - 1);
        clear();
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, host);
        torchrun("29500", "0", "2");
        setenv("SLURM_NODEID", "7", 1); /* torchrun inside an allocation: torchrun decides */
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, host); /* torchrun --standalone sets no GROUP_RANK */
        setenv("GROUP_RANK", "1", 1);
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, "1");
        setenv("DEVAL_NODE", "n3", 1);
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, "n3");
        clear();
        setenv("SLURM_JOB_ID", "77", 1);
        setenv("SLURM_PROCID", "5", 1);
        setenv("SLURM_NTASKS", "8", 1);
        setenv("SLURM_NODEID", "3", 1);
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, "3");
        assert_int_equal(deval_job_node(id, 2), 0); /* truncated, terminated */
        assert_string_equal(id, "3");
        clear(); /* ranks started with $MASTER_PORT by a torchrun agent's hand, or by srun */
        setenv("MASTER_PORT", "29500", 1);
        setenv("GROUP_RANK", "2", 1);
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, "2");
        unsetenv("GROUP_RANK");
        setenv("SLURM_NODEID", "4", 1);
        assert_int_equal(deval_job_node(id, sizeof(id)), 0);
        assert_string_equal(id, "4");
        assert_int_equal(deval_job_node(NULL, 8), DEVAL_EINVAL);
        assert_int_equal(deval_job_node(id, 0), DEVAL_EINVAL);
        clear();
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_torchrun),
                cmocka_unit_test(test_resume_key),
                cmocka_unit_test(test_master_port_alone),
                cmocka_unit_test(test_mpirun_srun_launch),
                cmocka_unit_test(test_nothing_names_the_job),
                cmocka_unit_test(test_more_than_one_machine),
                cmocka_unit_test(test_node),
                cmocka_unit_test(test_lightning),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
