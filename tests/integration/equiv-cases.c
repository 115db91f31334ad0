/* SPDX-License-Identifier: MIT */
/*
 * equiv-cases.c - the cases of the equivalence suite (test-equiv.c). Each is a run of calls
 * on a fresh group of EQ_WORLD ranks; a rank writes one line a call: its status, the message
 * of a failure, a digest of what it returned. Every executor of a step (devald, the ranks,
 * the mirrored step, a spanning group, a replay) must write the same lines.
 *
 * The cases cover every op and option (span-seq.c's sequence, digested), a mismatch of each
 * field a step checks, arguments each rank refuses alike, eval passes that go wrong (the wrong
 * call of a batch, a parked rank asked for what it cannot answer, a replay that differs, a
 * pass short of samples, keys out of range), the group's quota, a rank that exits and a rank
 * that stalls past the timeout.
 */
#define _GNU_SOURCE
#include "equiv-cases.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "span-seq.h"

/* failures that end the group: a case stops at the first */
static bool fatal(int r) {
        return r == DEVAL_EPEER || r == DEVAL_ETIMEDOUT || r == DEVAL_EDAEMON || r == DEVAL_EPROTO;
}

/*
 * A message as the suite compares it: where a rank runs is the run's own (its pid, and its
 * node in a spanning group: "rank 3 (pid 812, node 1)" reads "rank 3"), so is the suffix
 * that keeps the group's name apart from other runs' ("GROUP"), and so is whether /proc still
 * held a dead rank's exit status when devald looked ("exited with status 0" reads "exited").
 */
static void normalise(char *out, size_t len, const char *m, const char *group) {
        size_t o = 0, gl = strlen(group);
        while (*m && o + 8 < len) {
                if (strncmp(m, " with status ", 13) == 0 && m[13] >= '0' && m[13] <= '9') {
                        m += 13;
                        while (*m >= '0' && *m <= '9')
                                m++;
                        continue;
                }
                if (gl && strncmp(m, group, gl) == 0) {
                        o += (size_t)snprintf(out + o, len - o, "GROUP");
                        m += gl;
                        continue;
                }
                out[o++] = *m;
                if (strncmp(m, "rank ", 5) == 0 && m[5] >= '0' && m[5] <= '9') {
                        const char *p = m + 5;
                        while (*p >= '0' && *p <= '9')
                                p++;
                        memcpy(out + o, m + 1, (size_t)(p - m - 1));
                        o += (size_t)(p - m - 1);
                        m = p;
                        if (m[0] == ' ' && m[1] == '(' &&
                            (strncmp(m + 2, "pid ", 4) == 0 || strncmp(m + 2, "node ", 5) == 0)) {
                                const char *end = strchr(m, ')');
                                m = end ? end + 1 : m + strlen(m);
                        }
                        continue;
                }
                m++;
        }
        out[o] = '\0';
}

/* Write down call what, which returned r; r. Once the group is over, nothing is called. */
static int say(EqLog *l, deval_group *g, const char *what, int r) {
        l->calls++;
        if (r < 0) {
                char m[1024];
                normalise(m, sizeof(m), deval_errmsg(g), l->group);
                fprintf(l->f, "%d %s: %s: %s\n", l->calls, what, deval_strerror(r), m);
        } else {
                fprintf(l->f, "%d %s: %d\n", l->calls, what, r);
        }
        l->over |= fatal(r);
        return r;
}

#define CALL(what, expr) (l->over ? DEVAL_EPEER : say(l, g, (what), (expr)))

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
        const uint8_t *b = p;
        for (size_t i = 0; i < n; i++)
                h = (h ^ b[i]) * 1099511628211ull;
        return h;
}

/* a result: its dtype, shape and a digest of its bytes, read back from a GPU's (the
 * fake's) where a device group left it */
static void result(EqLog *l, const deval_tensor *t) {
        size_t bytes = deval_dtype_size(t->dtype);
        fprintf(l->f, "  = dtype %d [", t->dtype);
        for (int d = 0; d < t->ndim; d++) {
                fprintf(l->f, d ? " %lld" : "%lld", (long long)t->shape[d]);
                bytes *= (size_t)t->shape[d];
        }
        if (t->ndim == 0 && !t->data)
                bytes = 0;
        const void *data = t->data;
        void *host = NULL;
        if (t->device >= 0 && bytes) {
                host = malloc(bytes);
                if (!host || dv_gpu()->copy_to_host(t->device, host, (DvDevPtr)(uintptr_t)t->data,
                                                    bytes) < 0) {
                        fprintf(l->f, "] unreadable on device %d\n", t->device);
                        free(host);
                        return;
                }
                data = host;
        }
        fprintf(l->f, "] %016llx\n", (unsigned long long)fnv(1469598103934665603ull, data, bytes));
        free(host);
}

static void objects_result(EqLog *l, size_t n, const deval_bytes *items) {
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < n; i++) {
                h = fnv(h, &items[i].len, sizeof(items[i].len));
                h = fnv(h, items[i].data, items[i].len);
        }
        fprintf(l->f, "  = %zu objects %016llx\n", n, (unsigned long long)h);
}

/* rows x cols f32 of rank r, from sample first on */
static deval_tensor rows_of(float *x, int r, int first, int rows, int cols) {
        for (int i = 0; i < rows * cols; i++)
                x[i] = (float)(r * 1000 + first + i / cols) + (float)(i % cols) / 8.0f;
        return (deval_tensor){
                .data = x, .dtype = DEVAL_F32, .ndim = 2, .shape = {rows, cols}, .device = -1};
}

/* the small gather after a failure: the group still answers */
static void still_works(deval_group *g, EqLog *l) {
        float x[8];
        deval_tensor in = rows_of(x, l->rank, 0, 1 + l->rank % 2, 2), out;
        if (CALL("gather after", deval_gather(g, 1, &in, NULL, &out)) == 0)
                result(l, &out);
}

static int read_device(int device, void *dst, const void *src, size_t bytes) {
        return dv_gpu()->copy_to_host(device, dst, (DvDevPtr)(uintptr_t)src, bytes);
}

static void seq_part(deval_group *g, EqLog *l, int part) {
        SpanLog s = {0};
        span_seq_read_device = read_device;
        span_seq_part(g, &s, l->rank, l->world, false, part);
        fprintf(l->f, "sequence: %d calls, %d failed, %016llx\n", s.entries, s.failed,
                (unsigned long long)fnv(1469598103934665603ull, s.b, s.n));
        span_log_free(&s);
}

/* span-seq.c's sequence, its log digested: every op and option, passes of several calls, both
 * orders, root, keep and valid rows */
static void sequence(deval_group *g, EqLog *l) {
        seq_part(g, l, 1);
}

/* the rest of it: passes over uneven loaders, their replay, and passes with keys */
static void sequence_uneven(deval_group *g, EqLog *l) {
        seq_part(g, l, 2);
}

enum {
        MIS_OP,
        MIS_DTYPE,
        MIS_NDIM,
        MIS_COLS,
        MIS_NTENSORS,
        MIS_ORDER,
        MIS_PAD_FIRST,
        MIS_KEEP_ROWS,
        MIS_PAD_VALUE,
        MIS_ROOT,
        MIS_NAMES,
        MIS_OBJECTS,
        MIS_N
};

static const char *const mis_names[MIS_N] = {"op",        "dtype", "ndim",      "cols",
                                             "ntensors",  "order", "pad_first", "keep_rows",
                                             "pad_value", "root",  "names",     "objects"};

/* a gather where rank odd differs from the others in one field */
static void gather_mismatch(deval_group *g, EqLog *l) {
        for (int odd = l->world - 1; odd >= 1; odd -= 2)
                for (int m = 0; m < MIS_N && !l->over; m++) {
                        float x[16];
                        double xd[16] = {0};
                        deval_tensor in[2], out[2];
                        in[0] = rows_of(x, l->rank, 0, 2, 3);
                        in[1] = in[0];
                        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
                        int n = 1, r;
                        char what[48];
                        snprintf(what, sizeof(what), "%s by rank %d", mis_names[m], odd);
                        if (l->rank == odd && m == MIS_OP) {
                                r = CALL(what, deval_barrier(g));
                        } else if (l->rank == odd && m == MIS_OBJECTS) {
                                deval_bytes it = {"x", 1};
                                size_t on;
                                const deval_bytes *oi;
                                r = CALL(what, deval_gather_objects(g, 1, &it, NULL, &on, &oi));
                        } else {
                                if (l->rank == odd) {
                                        in[0].data = m == MIS_DTYPE ? (void *)xd : (void *)x;
                                        in[0].dtype = m == MIS_DTYPE ? DEVAL_F64 : DEVAL_F32;
                                        in[0].ndim = m == MIS_NDIM ? 1 : 2;
                                        in[0].shape[0] = m == MIS_NDIM ? 6 : m == MIS_COLS ? 3 : 2;
                                        in[0].shape[1] = m == MIS_COLS ? 2 : 3;
                                        n = m == MIS_NTENSORS ? 2 : 1;
                                        o.order = m == MIS_ORDER ? DEVAL_ORDER_STRIDED
                                                                 : DEVAL_ORDER_RANK;
                                        o.pad_first = m == MIS_PAD_FIRST;
                                        o.keep_rows = m == MIS_KEEP_ROWS ? 3 : -1;
                                        o.pad_value = m == MIS_PAD_VALUE ? -1 : 0;
                                        o.root = m == MIS_ROOT ? 0 : -1;
                                        o.names = m == MIS_NAMES ? 7 : 0;
                                }
                                r = CALL(what, deval_gather(g, n, in, &o, out));
                        }
                        if (r == 0) /* a mismatch that went through: what came back */
                                result(l, &out[0]);
                        still_works(g, l);
                }
}

/* reduce, broadcast, bytes and pad, each with one rank differing in one field */
static void other_mismatch(deval_group *g, EqLog *l) {
        bool odd = l->rank == l->world - 1;
        double d[4] = {1, 2, 3, 4};
        float f[4] = {1, 2, 3, 4};
        deval_tensor t = {.data = d, .dtype = DEVAL_F64, .ndim = 1, .shape = {4}, .device = -1};
        deval_tensor tf = t;
        tf.data = f;
        tf.dtype = DEVAL_F32;
        CALL("reduce dtype", deval_reduce(g, odd ? &tf : &t, DEVAL_SUM));
        still_works(g, l);
        t.shape[0] = odd ? 3 : 4;
        CALL("reduce shape", deval_reduce(g, &t, DEVAL_SUM));
        still_works(g, l);
        t.shape[0] = 4;
        CALL("reduce op", deval_reduce(g, &t, odd ? DEVAL_MAX : DEVAL_SUM));
        still_works(g, l);
        CALL("broadcast root", deval_broadcast(g, &t, odd ? 1 : 0));
        still_works(g, l);
        t.shape[0] = odd ? 2 : 4;
        CALL("broadcast shape", deval_broadcast(g, &t, 0));
        still_works(g, l);
        deval_bytes bo;
        CALL("bytes root", deval_broadcast_bytes(g, "abc", 3, odd ? 2 : 0, &bo));
        still_works(g, l);
        float x[16];
        deval_tensor in = rows_of(x, l->rank, 0, 2, 1 + l->rank), out;
        CALL("pad dim", deval_pad_across_processes(g, &in, odd ? 0 : 1, 0, false, &out));
        still_works(g, l);
        CALL("pad first", deval_pad_across_processes(g, &in, 1, 0, odd, &out));
        still_works(g, l);
        CALL("pad value", deval_pad_across_processes(g, &in, 1, odd ? 2 : 0, false, &out));
        still_works(g, l);
        CALL("reduce vs barrier", odd ? deval_barrier(g) : deval_reduce(g, &t, DEVAL_SUM));
        still_works(g, l);
}

/* arguments every rank refuses alike, before any rank waits */
static void bad_arguments(deval_group *g, EqLog *l) {
        float x[16];
        deval_tensor in = rows_of(x, l->rank, 0, 2, 2), out;
        deval_gather_opts o = DEVAL_GATHER_OPTS_INIT;
        o.valid_rows = 3;
        CALL("valid_rows past the rows", deval_gather(g, 1, &in, &o, &out));
        o = (deval_gather_opts)DEVAL_GATHER_OPTS_INIT;
        o.root = l->world;
        CALL("root past the world", deval_gather(g, 1, &in, &o, &out));
        o = (deval_gather_opts)DEVAL_GATHER_OPTS_INIT;
        o.keep_rows = -2;
        CALL("keep_rows -2", deval_gather(g, 1, &in, &o, &out));
        CALL("no tensors", deval_gather(g, 0, &in, NULL, &out));
        deval_tensor bad = in;
        bad.dtype = 99;
        CALL("dtype 99", deval_gather(g, 1, &bad, NULL, &out));
        bad = in;
        bad.shape[1] = -1;
        CALL("negative shape", deval_gather(g, 1, &bad, NULL, &out));
        CALL("broadcast root -1", deval_broadcast(g, &in, -1));
        CALL("pad dim 2", deval_pad_across_processes(g, &in, 2, 0, false, &out));
        CALL("reduce op 9", deval_reduce(g, &in, (deval_reduce_op)9));
        CALL("eval_end outside a pass", deval_eval_end(g));
        CALL("eval_batch outside a pass", deval_eval_batch(g));
        still_works(g, l);
}

/* batches of bs rows from each rank, two gathers and objects each */
static int batch(deval_group *g, EqLog *l, int b, int bs, bool keyed, int64_t num) {
        float x[64];
        int first = b * l->world * bs + l->rank * bs;
        int64_t keys[16];
        for (int j = 0; j < bs; j++)
                keys[j] = (first + j) % num;
        if (keyed)
                CALL("eval_batch_keys", deval_eval_batch_keys(g, bs, keys));
        else
                CALL("eval_batch", deval_eval_batch(g));
        deval_tensor in = rows_of(x, l->rank, first, bs, 2), out;
        int r = CALL("gather_for_metrics", deval_gather_for_metrics(g, 1, &in, NULL, &out));
        if (r == 0)
                result(l, &out);
        char s[16][16];
        deval_bytes items[16];
        for (int j = 0; j < bs; j++) {
                snprintf(s[j], sizeof(s[j]), "s%d", first + j);
                items[j] = (deval_bytes){s[j], strlen(s[j])};
        }
        size_t on;
        const deval_bytes *oi;
        if (CALL("objects_for_metrics",
                 deval_gather_objects_for_metrics(g, (size_t)bs, items, NULL, &on, &oi)) == 0)
                objects_result(l, on, oi);
        return r;
}

/* the replay of what this rank missed, the body on empty inputs */
static void replay(deval_group *g, EqLog *l, bool keyed) {
        int64_t missed = deval_eval_missed(g);
        fprintf(l->f, "missed %lld\n", (long long)missed);
        for (int64_t m = 0; m < missed && !l->over; m++) {
                float x[2];
                if (keyed)
                        CALL("replay batch", deval_eval_batch_keys(g, 0, NULL));
                else
                        CALL("replay batch", deval_eval_batch(g));
                deval_tensor in = rows_of(x, l->rank, 0, 0, 2), out;
                if (CALL("replay gather", deval_gather_for_metrics(g, 1, &in, NULL, &out)) == 0)
                        result(l, &out);
        }
        if (missed)
                CALL("replay_done", deval_eval_replay_done(g));
}

/* the last rank makes another call than the others' at the second batch */
static void pass_wrong_call(deval_group *g, EqLog *l) {
        CALL("eval_begin", deval_eval_begin(g, 16, DEVAL_ORDER_RANK));
        batch(g, l, 0, 2, false, 16);
        CALL("eval_batch", deval_eval_batch(g));
        float x[8];
        deval_tensor in = rows_of(x, l->rank, 8, 2, 2), out;
        if (l->rank == l->world - 1) {
                deval_bytes it[2] = {{"a", 1}, {"b", 1}};
                size_t on;
                const deval_bytes *oi;
                CALL("objects in place of a gather",
                     deval_gather_objects_for_metrics(g, 2, it, NULL, &on, &oi));
        } else {
                CALL("gather_for_metrics", deval_gather_for_metrics(g, 1, &in, NULL, &out));
        }
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
}

/* the last rank goes on to its next batch while the others make a second call */
static void pass_calls_differ(deval_group *g, EqLog *l) {
        CALL("eval_begin", deval_eval_begin(g, 32, DEVAL_ORDER_RANK));
        batch(g, l, 0, 2, false, 32);
        float x[8];
        deval_tensor in = rows_of(x, l->rank, 0, 2, 2), out;
        if (l->rank != l->world - 1)
                CALL("second call", deval_gather_for_metrics(g, 1, &in, NULL, &out));
        batch(g, l, 1, 2, false, 32);
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
        if (l->rank == l->world - 1) /* as many calls as the others, so that none leaves first */
                still_works(g, l);
}

/* one rank counts another dataset */
static void pass_begin_differs(deval_group *g, EqLog *l) {
        CALL("eval_begin", deval_eval_begin(g, l->rank == 1 ? 17 : 16, DEVAL_ORDER_RANK));
        batch(g, l, 0, 2, false, 16);
        CALL("eval_end", deval_eval_end(g));
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
}

/* fewer samples than the pass was begun with */
static void pass_short(deval_group *g, EqLog *l) {
        CALL("eval_begin", deval_eval_begin(g, 20, DEVAL_ORDER_RANK));
        batch(g, l, 0, 2, false, 20);
        batch(g, l, 1, 2, false, 20);
        CALL("eval_complete", deval_eval_complete(g));
        replay(g, l, false);
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
}

/* the last rank's loader runs out first; the others then call a barrier, which a parked
 * rank cannot answer */
static void pass_parked(deval_group *g, EqLog *l) {
        bool last = l->rank == l->world - 1;
        CALL("eval_begin", deval_eval_begin(g, 14, DEVAL_ORDER_RANK));
        batch(g, l, 0, 2, false, 14);
        if (last) {
                CALL("eval_complete", deval_eval_complete(g));
        } else {
                batch(g, l, 1, 2, false, 14);
                CALL("barrier in the pass", deval_barrier(g));
                CALL("eval_complete", deval_eval_complete(g));
        }
        replay(g, l, false);
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
}

/* the parked rank replays the batch it missed with another call than the others made */
static void pass_replay_differs(deval_group *g, EqLog *l) {
        bool last = l->rank == l->world - 1;
        CALL("eval_begin", deval_eval_begin(g, 14, DEVAL_ORDER_RANK));
        batch(g, l, 0, 2, false, 14);
        if (!last)
                batch(g, l, 1, 2, false, 14);
        CALL("eval_complete", deval_eval_complete(g));
        if (last && deval_eval_missed(g) == 1) {
                CALL("replay batch", deval_eval_batch(g));
                size_t on;
                const deval_bytes *oi;
                CALL("replay objects in place of a gather",
                     deval_gather_objects_for_metrics(g, 0, NULL, NULL, &on, &oi));
                CALL("replay_done", deval_eval_replay_done(g));
        }
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
}

/* keyed passes: an uneven one with its replay, then a key past the dataset */
static void pass_keys(deval_group *g, EqLog *l) {
        bool last = l->rank == l->world - 1;
        CALL("eval_begin_keys", deval_eval_begin_keys(g, 14, 14));
        batch(g, l, 0, 2, true, 14);
        if (!last)
                batch(g, l, 1, 2, true, 14);
        CALL("eval_complete", deval_eval_complete(g));
        replay(g, l, true);
        CALL("eval_begin_keys", deval_eval_begin_keys(g, 8, 8));
        int64_t keys[2] = {l->rank * 2, l->rank == 2 ? 8 : l->rank * 2 + 1};
        CALL("eval_batch_keys", deval_eval_batch_keys(g, 2, keys));
        float x[8];
        deval_tensor in = rows_of(x, l->rank, 0, 2, 2), out;
        if (CALL("gather_for_metrics", deval_gather_for_metrics(g, 1, &in, NULL, &out)) == 0)
                result(l, &out);
        CALL("eval_complete", deval_eval_complete(g));
        CALL("eval_abandon", deval_eval_abandon(g));
        still_works(g, l);
}

/* the group's quota (devald runs with --max-group-bytes=4M) */
static void quota(deval_group *g, EqLog *l) {
        size_t n = 1 << 20; /* 8 MiB of f64: over the quota */
        double *x = calloc(n, sizeof(double));
        if (!x)
                abort();
        deval_tensor t = {.data = x,
                          .dtype = DEVAL_F64,
                          .ndim = 1,
                          .shape = {l->rank == 0 ? (int64_t)n : 1000},
                          .device = -1},
                     out;
        CALL("input past the quota", deval_gather(g, 1, &t, NULL, &out));
        t.shape[0] = 1000;
        if (CALL("gather", deval_gather(g, 1, &t, NULL, &out)) == 0)
                result(l, &out);
        t.shape[0] = 3 << 15; /* 0.75 MiB each fits; their 3 MiB result does not */
        CALL("result past the quota", deval_gather(g, 1, &t, NULL, &out));
        free(x);
        still_works(g, l);
}

/* the last rank exits before its third call, once the others are waiting in theirs */
static void rank_gone(deval_group *g, EqLog *l) {
        for (int i = 0; i < 4 && !l->over; i++) {
                if (i == 2 && l->rank == l->world - 1) {
                        fflush(l->f);
                        usleep(300 * 1000);
                        _exit(0);
                }
                still_works(g, l);
        }
        CALL("barrier after", deval_barrier(g));
}

/* the last rank stalls past the group's timeout (1.5 s) before its second call */
static void rank_stalls(deval_group *g, EqLog *l) {
        for (int i = 0; i < 3 && !l->over; i++) {
                if (i == 1 && l->rank == l->world - 1)
                        usleep(3500 * 1000);
                still_works(g, l);
        }
        CALL("barrier after", deval_barrier(g));
}

const EqCase eq_cases[] = {
        {"sequence", sequence, 0},
        {"sequence-uneven", sequence_uneven, 0},
        {"gather-mismatch", gather_mismatch, 0},
        {"other-mismatch", other_mismatch, 0},
        {"bad-arguments", bad_arguments, 0},
        {"pass-wrong-call", pass_wrong_call, 0},
        {"pass-calls-differ", pass_calls_differ, 0},
        {"pass-begin-differs", pass_begin_differs, 0},
        {"pass-short", pass_short, 0},
        {"pass-parked", pass_parked, 0},
        {"pass-replay-differs", pass_replay_differs, 0},
        {"pass-keys", pass_keys, 0},
        {"quota", quota, 0},
        {"rank-gone", rank_gone, 0},
        {"rank-stalls", rank_stalls, 1500},
};
const int eq_ncases = sizeof(eq_cases) / sizeof(eq_cases[0]);
