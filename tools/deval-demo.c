/* SPDX-License-Identifier: MIT */
/*
 * deval-demo - a 4-rank evaluation through devald, next to the same evaluation in one
 * process, to show why the exact union of predictions matters.
 *
 * The task is sequence tagging: 1003 sentences of 3 to 40 tokens, a deterministic "model"
 * that tags each token right or wrong, and token accuracy as the metric. The dataset is
 * sharded the way Accelerate shards it (batches of 16 dealt round-robin, the last round
 * completed by cycling from the start), so the last batches hold duplicates, and every batch
 * is padded only to its own longest sentence (dynamic padding), so ranks disagree on the
 * sequence dim. Each rank gathers predictions and labels with deval_gather_for_metrics in an
 * eval pass; devald pads the sequence dim, concatenates, and drops the duplicates.
 *
 *   deval-demo [--socket PATH] [--ranks N] [--samples N] [--batch N]
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "deval.h"

#define MAX_RANKS 16
#define MAX_LEN   40
#define IGNORE    (-100) /* the label of a padding token, as in HuggingFace */

static const char *arg_socket;
static int arg_ranks = 4;
static int64_t arg_samples = 1003;
static int arg_batch = 16;

/* Sentence i: its length and, for token t, its gold tag and the model's tag. */
static int sent_len(int64_t i) {
        return 3 + (int)((i * 2654435761u) % (MAX_LEN - 2));
}

static int gold_tag(int64_t i, int t) {
        return (int)((i * 31 + t * 7) % 9);
}

static int pred_tag(int64_t i, int t) {
        /* right about 4 times in 5, worse on long sentences */
        uint32_t h = (uint32_t)(i * 2246822519u ^ (uint32_t)t * 3266489917u);
        int wrong = (h >> 8) % 100 < (uint32_t)(10 + sent_len(i) / 2);
        return wrong ? (gold_tag(i, t) + 1) % 9 : gold_tag(i, t);
}

typedef struct {
        long correct, total; /* through deval */
        long rows;           /* rows gathered */
        long local_correct[MAX_RANKS], local_total[MAX_RANKS], local_rows[MAX_RANKS];
        int failed;
        char msg[512];
} Shared;

/* Batches of rank r: Accelerate's even_batches sharding of arg_samples into arg_batch. */
static int rank_batches(int r, int64_t (*out)[64], int *lens) {
        int64_t nb = (arg_samples + arg_batch - 1) / arg_batch;
        int64_t rounds = (nb + arg_ranks - 1) / arg_ranks;
        int n = 0;
        for (int64_t k = 0; k < rounds; k++) {
                int64_t b = k * arg_ranks + r;
                lens[n] = arg_batch;
                for (int j = 0; j < arg_batch; j++) /* past the end: cycle from the start */
                        out[n][j] = (b * arg_batch + j) % arg_samples;
                n++;
        }
        return n;
}

static int rank_main(Shared *s, int rank) {
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .socket_path = arg_socket, .timeout_ms = 30000};
        deval_group *g;
        char group[64];
        snprintf(group, sizeof(group), "demo-%d", (int)getppid());
        if (deval_join(group, rank, arg_ranks, &o, &g) != 0) {
                snprintf(s->msg, sizeof(s->msg), "rank %d: %s", rank, deval_errmsg(NULL));
                return 1;
        }
        int64_t(*batches)[64] = calloc(4096, sizeof(*batches));
        int *lens = calloc(4096, sizeof(int));
        int nb = rank_batches(rank, batches, lens);
        int32_t *pred = malloc(sizeof(int32_t) * 64 * MAX_LEN);
        int32_t *gold = malloc(sizeof(int32_t) * 64 * MAX_LEN);
        int r = deval_eval_begin(g, arg_samples, DEVAL_ORDER_RANK);
        for (int b = 0; b < nb && r == 0; b++) {
                int width = 0;
                for (int j = 0; j < lens[b]; j++)
                        width = sent_len(batches[b][j]) > width ? sent_len(batches[b][j]) : width;
                for (int j = 0; j < lens[b]; j++) {
                        int64_t i = batches[b][j];
                        for (int t = 0; t < width; t++) {
                                bool real = t < sent_len(i);
                                pred[j * width + t] = real ? pred_tag(i, t) : IGNORE;
                                gold[j * width + t] = real ? gold_tag(i, t) : IGNORE;
                                /* what each rank would compute alone, duplicates and all */
                                s->local_correct[rank] += real && pred_tag(i, t) == gold_tag(i, t);
                                s->local_total[rank] += real;
                        }
                }
                s->local_rows[rank] += lens[b];
                deval_tensor in[2] =
                        {
                                {.data = pred,
                                 .dtype = DEVAL_I32,
                                 .ndim = 2,
                                 .shape = {lens[b], width},
                                 .device = -1},
                                {.data = gold,
                                 .dtype = DEVAL_I32,
                                 .ndim = 2,
                                 .shape = {lens[b], width},
                                 .device = -1},
                        },
                             out[2];
                deval_gather_opts go = DEVAL_GATHER_OPTS_INIT;
                go.pad_value = IGNORE;
                r = deval_gather_for_metrics(g, 2, in, &go, out);
                if (r == 0 && rank == 0) {
                        const int32_t *p = out[0].data, *l = out[1].data;
                        for (int64_t k = 0; k < out[0].shape[0] * out[0].shape[1]; k++) {
                                if (l[k] == IGNORE)
                                        continue;
                                s->total++;
                                s->correct += p[k] == l[k];
                        }
                        s->rows += out[0].shape[0];
                }
        }
        if (r == 0)
                r = deval_eval_end(g);
        if (r != 0)
                snprintf(s->msg, sizeof(s->msg), "rank %d: %s: %s", rank, deval_strerror(r),
                         deval_errmsg(g));
        deval_leave(g);
        free(batches);
        free(lens);
        free(pred);
        free(gold);
        return r != 0;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},  {"ranks", required_argument, NULL, 'r'},
                {"samples", required_argument, NULL, 'n'}, {"batch", required_argument, NULL, 'b'},
                {"help", no_argument, NULL, 'h'},          {},
        };
        int c;
        while ((c = getopt_long(argc, argv, "s:r:n:b:h", opts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        arg_socket = optarg;
                        break;
                case 'r':
                        arg_ranks = atoi(optarg);
                        break;
                case 'n':
                        arg_samples = atoll(optarg);
                        break;
                case 'b':
                        arg_batch = atoi(optarg);
                        break;
                case 'h':
                        printf("Usage: deval-demo [--socket PATH] [--ranks N] [--samples N] "
                               "[--batch N]\n");
                        return 0;
                default:
                        return 2;
                }
        }
        if (arg_ranks < 1 || arg_ranks > MAX_RANKS || arg_batch < 1 || arg_batch > 64 ||
            arg_samples < 1 || (arg_samples + arg_batch - 1) / arg_batch > 4000) {
                fprintf(stderr, "deval-demo: --ranks 1..%d, --batch 1..64, --samples 1..%d\n",
                        MAX_RANKS, 4000 * arg_batch);
                return 2;
        }

        Shared *s =
                mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t pids[MAX_RANKS];
        fflush(NULL);
        for (int r = 0; r < arg_ranks; r++) {
                pids[r] = fork();
                if (pids[r] == 0)
                        _exit(rank_main(s, r));
        }
        int bad = 0;
        for (int r = 0; r < arg_ranks; r++) {
                int st;
                waitpid(pids[r], &st, 0);
                bad |= !WIFEXITED(st) || WEXITSTATUS(st);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (bad) {
                fprintf(stderr, "deval-demo: a rank failed: %s\n", s->msg);
                return 1;
        }

        /* the same evaluation in one process: every sentence once */
        long correct = 0, total = 0;
        for (int64_t i = 0; i < arg_samples; i++)
                for (int t = 0; t < sent_len(i); t++) {
                        correct += pred_tag(i, t) == gold_tag(i, t);
                        total++;
                }
        double naive = 0;
        long yielded = 0;
        for (int r = 0; r < arg_ranks; r++) {
                naive += (double)s->local_correct[r] / (double)s->local_total[r] / arg_ranks;
                yielded += s->local_rows[r];
        }
        double acc_deval = (double)s->correct / (double)s->total;
        double acc_single = (double)correct / (double)total;
        printf("deval demo: token accuracy of a sequence tagger, %d ranks, batch %d\n", arg_ranks,
               arg_batch);
        printf("  dataset                    %lld sentences, %ld tokens\n", (long long)arg_samples,
               total);
        printf("  rows the ranks evaluated   %ld (%ld duplicates in the last batches)\n", yielded,
               yielded - (long)arg_samples);
        printf("  rows gathered by deval     %ld, %ld tokens\n", s->rows, s->total);
        printf("  accuracy through deval     %.6f (%ld/%ld)\n", acc_deval, s->correct, s->total);
        printf("  accuracy in one process    %.6f (%ld/%ld)\n", acc_single, correct, total);
        printf("  naive mean of per-rank     %.6f (off by %+.6f)\n", naive, naive - acc_single);
        printf("  wall time                  %.1f ms\n",
               (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
        if (s->correct != correct || s->total != total || s->rows != arg_samples) {
                printf("MISMATCH: deval's union differs from the single-process evaluation\n");
                return 1;
        }
        printf("  deval == single process    yes, exactly\n");
        return 0;
}
