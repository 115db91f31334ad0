/* SPDX-License-Identifier: MIT */
/*
 * deval.h - the public API of libdeval, the client library of the deval daemon.
 *
 * An evaluation process joins a named group of world_size ranks at the node-local devald,
 * then runs collectives (gather, gather_for_metrics, reduce, broadcast, ...) on it. Results
 * are views into shared memory that stay valid until the next collective on the same group.
 * Every call returns 0 or a negative DEVAL_E* status; deval_errmsg() says what happened.
 *
 * Thread safety: a deval_group handle must not be used by two threads at once; distinct
 * handles are independent. The library installs no signal handlers and keeps no mutable
 * globals.
 */
#ifndef DEVAL_H
#define DEVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DEVAL_VERSION_MAJOR 0
#define DEVAL_VERSION_MINOR 2

/* Status codes. The same numbers travel on the wire. */
#define DEVAL_OK        0
#define DEVAL_EINVAL    (-1)  /* bad argument in this call */
#define DEVAL_EMISMATCH (-2)  /* ranks disagree */
#define DEVAL_EPEER     (-3)  /* another rank died or left */
#define DEVAL_EDAEMON   (-4)  /* daemon unreachable or gone */
#define DEVAL_ETIMEDOUT (-5)  /* some ranks never arrived */
#define DEVAL_ENOMEM    (-6)  /* over the group's quota, or out of memory */
#define DEVAL_EPERM     (-7)  /* not allowed */
#define DEVAL_EPROTO    (-8)  /* version mismatch or malformed message */
#define DEVAL_EABORTED  (-9)  /* group aborted */
#define DEVAL_ENOTSUP   (-10) /* not supported by this build or backend */
#define DEVAL_ESYS      (-11) /* a system call failed */

typedef struct deval_group deval_group; /* one rank's membership of a group */

typedef enum {
        DEVAL_BOOL = 1,
        DEVAL_U8,
        DEVAL_I8,
        DEVAL_I16,
        DEVAL_I32,
        DEVAL_I64,
        DEVAL_F16,
        DEVAL_BF16,
        DEVAL_F32,
        DEVAL_F64,
} deval_dtype;

#define DEVAL_MAX_DIMS    8
#define DEVAL_MAX_TENSORS 64 /* tensors in one collective */
#define DEVAL_PASS_SITES  16 /* calls per batch a pass by position counts (deval_eval_batch) */
#define DEVAL_MAX_WORLD   512

typedef struct {
        void *data;    /* contiguous, row-major */
        int32_t dtype; /* deval_dtype */
        int32_t ndim;  /* 0..DEVAL_MAX_DIMS; a 0-d tensor gathers as shape [1] */
        int64_t shape[DEVAL_MAX_DIMS];
        /* -1: host memory; >= 0: a CUDA device ordinal, data a device pointer. On the host
         * backend such a tensor is staged through host memory (the CUDA driver is loaded on
         * first use) and results are host views; reduce and broadcast write back to it. */
        int32_t device;
        int32_t reserved;
} deval_tensor;

typedef struct {
        const void *data;
        size_t len;
} deval_bytes;

/*
 * Options structs begin with their size, so that later versions can add fields: initialise
 * them with DEVAL_JOIN_OPTS_INIT / DEVAL_GATHER_OPTS_INIT (libdeval refuses a size of 0, and
 * fields it does not know that are set).
 */
typedef struct {
        uint32_t size;           /* sizeof(deval_join_opts) */
        int32_t timeout_ms;      /* join and every collective; 0: default (300 s); < 0: forever */
        const char *socket_path; /* NULL: $DEVAL_SOCKET, else the default path */
        int32_t on_device;       /* bool: a device group; this rank's tensors live on the CUDA
                                    device below (devald --backend cuda; every rank alike) */
        int32_t device;          /* the CUDA device ordinal, as this process sees it */
        int32_t autostart;       /* when nothing answers at an unnamed socket, start a private
                                    devald: 0: unless $DEVAL_AUTOSTART=0; > 0: yes; < 0: no */
        int32_t reserved;
} deval_join_opts;
/* the first member, for an initialiser: deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, ...}; */
#define DEVAL_JOIN_OPTS_INIT .size = sizeof(deval_join_opts)

typedef enum {
        DEVAL_ORDER_RANK = 0,
        DEVAL_ORDER_STRIDED = 1
} deval_order;

typedef struct {
        uint32_t size;      /* sizeof(deval_gather_opts) */
        int32_t pad_first;  /* bool: pad at the start of a dim instead of the end */
        double pad_value;   /* converted to each tensor's dtype */
        int64_t valid_rows; /* this rank's real rows; < 0: all */
        int64_t keep_rows;  /* keep only the first rows of the result; < 0: all */
        int32_t order;      /* deval_order; inside an eval pass, the pass's order wins */
        int32_t root;       /* only this rank receives the result; -1: every rank */
        /* In a pass with keys, bit i: tensor i (objects: bit 0) is the batch's data as the
         * loader gave it (labels, ids; not a model's output), so a sample the sharding repeats
         * comes back with the same rows, and one whose rows differ fails the call (the rows
         * are not the samples the keys say: a collate_fn reordered the batch). */
        uint64_t same_rows;
        /* What the caller names its tensors (a digest of a dict's keys), or 0: ranks whose
         * names differ fail the call with DEVAL_EMISMATCH instead of pairing tensors of other
         * names by their place. */
        uint64_t names;
} deval_gather_opts;
/* positional, in field order: size, pad_first, pad_value, valid_rows, keep_rows, order, root,
 * same_rows, names */
#define DEVAL_GATHER_OPTS_INIT \
        { sizeof(deval_gather_opts), 0, 0.0, -1, -1, DEVAL_ORDER_RANK, -1, 0, 0 }

typedef enum {
        DEVAL_SUM = 0,
        DEVAL_MEAN,
        DEVAL_MAX,
        DEVAL_MIN,
        DEVAL_PROD
} deval_reduce_op;

const char *deval_version(void);
const char *deval_strerror(int status);
const char *deval_errmsg(const deval_group *g);

/* group NULL: name the group after the job that started this process (torchrun, accelerate
 * launch, mpirun, srun, deval.launch); rank or world_size < 0: take them from it too. A
 * group holds the ranks of one machine: a world size taken from a launcher that says the job
 * runs on more than one is DEVAL_ENOTSUP ($DEVAL_ONE_MACHINE=1: every rank runs here). */
int deval_join(const char *group, int rank, int world_size, const deval_join_opts *opts,
               deval_group **out);
int deval_leave(deval_group *g);
int deval_rank(const deval_group *g);
int deval_world_size(const deval_group *g);
/* The group's name: the one deval_join() took from the launcher when given NULL. */
const char *deval_group_name(const deval_group *g);
/* 1 when the launcher that started this process says its job runs on more than one machine
 * (what it says in why, when not NULL), else 0; $DEVAL_ONE_MACHINE=1: 0. */
int deval_job_spans(char *why, size_t why_len);
/* The machine this process runs on, as a spanning join tells machines apart ($DEVAL_NODE,
 * the launcher's node, else the host name), into id[len]. 0, or DEVAL_EINVAL. */
int deval_job_node(char *id, size_t len);

/*
 * A group may span machines: each machine's ranks meet in their own devald, and one rank per
 * machine (its leader, local rank 0) exchanges bytes with the other leaders through the
 * engine the job already runs (MPI: libdeval-mpi's deval_mpi_join(); torch.distributed: the
 * Python binding). Every collective then has the semantics of one machine, in global ranks.
 */
typedef struct {
        uint32_t size; /* sizeof(deval_engine) */
        int32_t nodes; /* machines the group spans, >= 1 */
        int32_t node;  /* this machine's index, 0..nodes-1, the same on all its ranks */
        int32_t reserved;
        void *ctx; /* handed to allgather */
        /* Called on leaders only, by all of them alike: each passes len bytes at send, and
         * recv (nodes * len bytes) receives node k's at recv + k * len (send may be this
         * node's place there). Return 0, or a
         * DEVAL_E* status with a sentence in why (naming the node that failed or did not
         * answer), within timeout_ms when that is >= 0. */
        int (*allgather)(void *ctx, const void *send, void *recv, size_t len, int timeout_ms,
                         char *why, size_t why_len);
        /* Called once by deval_leave() (and not when the join fails); may be NULL. */
        void (*release)(void *ctx);
} deval_engine;
#define DEVAL_ENGINE_INIT .size = sizeof(deval_engine)

/* Join a group of world_size ranks on engine->nodes machines: rank is this rank's place in
 * the whole group, local_rank its place among the local_world ranks of this machine. group
 * NULL: named after the job. Return: as deval_join(); DEVAL_EMISMATCH when the ranks'
 * layouts disagree (a rank twice, a node's ranks not on one machine). */
int deval_join_spanning(const char *group, int rank, int world_size, int local_rank,
                        int local_world, const deval_join_opts *opts, const deval_engine *engine,
                        deval_group **out);
/* The machines g spans and this rank's (1 and 0 for a group of one machine). */
int deval_nodes(const deval_group *g, int *node);

/* n tensors per rank in one collective; out[i] are views valid until the next call on g */
int deval_gather(deval_group *g, int n, const deval_tensor in[], const deval_gather_opts *opts,
                 deval_tensor out[]);
int deval_eval_begin(deval_group *g, int64_t num_samples, deval_order order);
int deval_gather_for_metrics(deval_group *g, int n, const deval_tensor in[],
                             const deval_gather_opts *opts, deval_tensor out[]);
int deval_eval_end(deval_group *g);
/* A new batch of the pass: each gather_for_metrics call of a batch counts its samples apart. */
int deval_eval_batch(deval_group *g);
/* deval_eval_end() for a rank whose loader ran out: checks every call returned num_samples. */
int deval_eval_complete(deval_group *g);
/* deval_eval_end() for a rank that leaves its loop early (a break, an exception): a rank that
 * still calls in the pass fails with DEVAL_EMISMATCH naming this one, on every rank. */
int deval_eval_abandon(deval_group *g);
/* deval_eval_abandon() that says why this rank leaves: the others' failure quotes it. */
int deval_eval_abandon_why(deval_group *g, const char *why);
/* An eval pass whose samples carry their identity, a key in [0, num_keys) each (a dataset
 * index): results in key order, each key once, whatever the sharding repeated or shifted; the
 * close checks that every call returned num_samples distinct keys. Each batch declares its keys
 * with deval_eval_batch_keys() (instead of deval_eval_batch()). */
int deval_eval_begin_keys(deval_group *g, int64_t num_samples, int64_t num_keys);
int deval_eval_batch_keys(deval_group *g, int64_t n, const int64_t keys[]);
/* The key of a batch's sample that is a sharding's padding whose original the pass does not
 * hold (Accelerate's skip_first_batches skipped it): its rows are dropped from every result. */
#define DEVAL_KEY_PAD (-1)
/* A pass that survives a crash: after deval_eval_begin_keys(), before the first batch, every
 * rank calls deval_eval_resume() (one collective), which keeps the pass's results in a journal
 * devald holds for the job and returns K, the batches a run of the job that stopped already
 * did: the pass's first K batches are answered from it. loader_digest names what the pass
 * reads, state_digest where the job stands (a journal of another is not used; note says
 * so); each batch's digest follows its deval_eval_batch_keys(). */
int64_t deval_eval_resume(deval_group *g, uint64_t loader_digest, uint64_t state_digest, char *note,
                          size_t note_len);
int deval_eval_batch_digest(deval_group *g, uint64_t digest);
/* Bytes of the caller's own (its random generators' state at the end of a batch's body) kept
 * with the batch being written; in a batch answered from the journal, the latest kept. */
int deval_eval_journaled(const deval_group *g);
int deval_eval_batch_state(deval_group *g, const void *data, size_t len);
int deval_eval_kept_state(deval_group *g, const void **data, size_t *len);
/* After a pass: the other ranks' batches that ran after this rank's loader ran out. Run the
 * loop body that often more on empty inputs, each after deval_eval_batch(): its calls return
 * what the others got, with no collective; then deval_eval_replay_done(). */
int64_t deval_eval_missed(const deval_group *g);
/* 1 while an eval pass is open on g; 0 once it closed, also when a collective of the pass
 * failed because a rank left it (the pass is then over on every rank). */
int deval_eval_open(const deval_group *g);
/* How far the open pass has come: every rank's samples together, out of num_samples, as the
 * ranks publish them in shared memory (no collective; figures for a progress bar). Return: 1,
 * 0 when no pass is open, DEVAL_ENOTSUP in a group spanning machines. */
int deval_eval_progress(const deval_group *g, int64_t *samples, int64_t *num_samples);
int deval_eval_replay_done(deval_group *g);
int deval_pad_across_processes(deval_group *g, const deval_tensor *in, int dim, double pad_value,
                               bool pad_first, deval_tensor *out);
int deval_gather_objects(deval_group *g, size_t n, const deval_bytes items[],
                         const deval_gather_opts *opts, size_t *out_n,
                         const deval_bytes **out_items);
int deval_gather_objects_for_metrics(deval_group *g, size_t n, const deval_bytes items[],
                                     const deval_gather_opts *opts, size_t *out_n,
                                     const deval_bytes **out_items);
int deval_reduce(deval_group *g, deval_tensor *inout, deval_reduce_op op);
int deval_broadcast(deval_group *g, deval_tensor *inout, int root);
int deval_broadcast_bytes(deval_group *g, const void *data, size_t len, int root, deval_bytes *out);
int deval_barrier(deval_group *g);
/* This rank's own checks refused the collective call it was making (a binding's, a wrapper's,
 * why) before it reached libdeval: the call still takes its step, as a refusal, so that every
 * rank's call there fails with DEVAL_EINVAL naming this rank and why, and the ranks' next
 * calls pair with each other's. (A collective that libdeval itself refuses does so already.)
 * Return: DEVAL_EINVAL, with why as this rank's message; the group's failure where it failed. */
int deval_refuse(deval_group *g, const char *why);

/*
 * A buffer of at least bytes in this rank's shared input arena, for the next collective: a
 * tensor whose data lies inside it is not copied by deval_gather(), deval_gather_for_metrics(),
 * deval_pad_across_processes(), deval_reduce() or deval_broadcast(). Write your outputs there
 * to save a copy of every byte. Valid until the next call on g.
 */
int deval_input_buffer(deval_group *g, size_t bytes, void **ret);

/* Size in bytes of one element of dtype, 0 for an unknown dtype. */
size_t deval_dtype_size(int dtype);

#ifdef __cplusplus
}
#endif
#endif
