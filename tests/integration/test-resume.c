/* SPDX-License-Identifier: MIT */
/*
 * test-resume.c - a pass that survives a crash (deval_eval_resume()), against a real devald
 * with forked ranks: a run dies at a batch (a rank exits), a second run of the job (the same
 * $DEVAL_RESUME_KEY) answers the batches every rank kept from the journal and ends with every
 * result equal to an uninterrupted run's, a gather per rank (pad) and objects included; a
 * batch that is not the kept one fails, naming it; a pass over another loader starts over,
 * saying so; a journal is dropped when its pass closes.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static Harness H;

static int setup(void **state) {
        (void)state;
        harness_start(&H, NULL);
        return 0;
}

static int teardown(void **state) {
        (void)state;
        harness_stop(&H);
        return 0;
}

#define WORLD   3
#define BATCHES 6
#define PER     2 /* samples per rank per batch */
#define N       (WORLD * BATCHES * PER)

typedef struct {
        const char *key; /* $DEVAL_RESUME_KEY */
        int die_rank;    /* this rank exits at die_batch (-1: none) */
        int die_batch;   /* before its first call there */
        int64_t want_k;  /* what deval_eval_resume() must return on every rank (-1: >= 1) */
        uint64_t loader; /* the loader's digest */
        int bad_rank;    /* this rank declares another digest at batch bad_batch */
        int bad_batch;
} Run;

static int64_t key_of(int rank, int batch, int j) {
        return ((int64_t)batch * WORLD + rank) * PER + j;
}

/*
 * A call of the pass failed: in a run where a rank dies, the others' fail (any status); where
 * a rank's batch is not the kept one, the others' fail with DEVAL_EMISMATCH once they need it.
 * Return: 0 when that is what this was, else 1 (said).
 */
static int expected_failure(const Run *run, deval_group *g, int r, int b) {
        const char *msg = deval_errmsg(g);
        if (run->die_rank < 0 && (run->bad_rank < 0 || r != DEVAL_EMISMATCH)) {
                fprintf(stderr, "batch %d: %s: %s\n", b, deval_strerror(r), msg);
                return 1;
        }
        deval_leave(g);
        return 0;
}

#define STEP(call)                                              \
        do {                                                    \
                int _r = (call);                                \
                if (_r < 0)                                     \
                        return expected_failure(run, g, _r, b); \
        } while (0)

/*
 * One run of the job: a pass with keys of BATCHES batches, each a gather for metrics of a
 * [PER, 3] float tensor, a pad of a row of 1 + batch % 3 columns, and a gather of strings.
 * Every result is compared with what an uninterrupted run returns, whether it came from the
 * group or from the journal.
 */
static int rank_job(const Harness *h, int rank, int world, void *arg) {
        const Run *run = arg;
        deval_group *g;
        char note[512];
        setenv("DEVAL_RESUME_KEY", run->key, 1);
        CHECK_OK(harness_join(h, run->key, rank, world, 10000, &g), NULL);
        CHECK_OK(deval_eval_begin_keys(g, N, N), g);
        int64_t k = deval_eval_resume(g, run->loader, 0, note, sizeof(note));
        CHECK(k >= 0, "deval_eval_resume: %s", deval_errmsg(g));
        CHECK(deval_eval_journaled(g) == 1, "no journal");
        CHECK(run->want_k < 0 ? k >= 1 : k == run->want_k, "k %lld want %lld", (long long)k,
              (long long)run->want_k);
        if (run->want_k == 0 && run->loader == 2)
                CHECK(strstr(note, "so the pass starts over"), "note: %s", note);
        if (k > 0)
                CHECK(strstr(note, "resuming pass #1"), "note: %s", note);
        for (int b = 0; b < BATCHES; b++) {
                if (rank == run->die_rank && b == run->die_batch)
                        _exit(3); /* (a crash: the others fail; nothing is ended) */
                int64_t keys[PER];
                float x[PER][3];
                for (int j = 0; j < PER; j++) {
                        keys[j] = key_of(rank, b, j);
                        for (int c = 0; c < 3; c++)
                                x[j][c] = (float)keys[j] * 10 + (float)c;
                }
                CHECK_OK(deval_eval_batch_keys(g, PER, keys), g);
                uint64_t d = (uint64_t)b + 100 + (rank == run->bad_rank && b == run->bad_batch);
                int r = deval_eval_batch_digest(g, d);
                if (rank == run->bad_rank && b == run->bad_batch) {
                        CHECK(r == DEVAL_EMISMATCH && strstr(deval_errmsg(g), "is not the one"),
                              "%s: %s", deval_strerror(r), deval_errmsg(g));
                        deval_eval_abandon(g);
                        deval_leave(g);
                        return 0;
                }
                CHECK_OK(r, g);
                deval_tensor in = {.data = x,
                                   .dtype = DEVAL_F32,
                                   .ndim = 2,
                                   .shape = {PER, 3},
                                   .device = -1},
                             out;
                STEP(deval_gather_for_metrics(g, 1, &in, NULL, &out));
                CHECK(out.shape[0] == WORLD * PER && out.shape[1] == 3, "shape");
                for (int i = 0; i < WORLD * PER; i++) {
                        int64_t key = (int64_t)b * WORLD * PER + i; /* key order */
                        for (int c = 0; c < 3; c++)
                                CHECK(((float *)out.data)[i * 3 + c] == (float)key * 10 + c,
                                      "batch %d row %d", b, i);
                }
                float row[3] = {(float)rank, 1, 2};
                deval_tensor p = {.data = row,
                                  .dtype = DEVAL_F32,
                                  .ndim = 2,
                                  .shape = {1, 1 + (rank + b) % 3},
                                  .device = -1};
                STEP(deval_pad_across_processes(g, &p, 1, -1, false, &out));
                /* (the ranks' widths are 1, 2 and 3 in some order: padded to 3) */
                CHECK(out.shape[1] == 3 && ((float *)out.data)[0] == (float)rank,
                      "pad at batch %d: width %lld", b, (long long)out.shape[1]);
                char word[PER][16];
                deval_bytes items[PER];
                for (int j = 0; j < PER; j++) {
                        snprintf(word[j], sizeof(word[j]), "w%lld", (long long)keys[j]);
                        items[j] = (deval_bytes){word[j], strlen(word[j])};
                }
                size_t n;
                const deval_bytes *got;
                STEP(deval_gather_objects_for_metrics(g, PER, items, NULL, &n, &got));
                CHECK(n == WORLD * PER, "objects: %zu", n);
                /* the batch's own state: kept with a batch written, the kept one given back in
                 * a batch answered from the journal (every other batch keeps one) */
                char mine[16];
                snprintf(mine, sizeof(mine), "s%d-%d", rank, b - b % 2);
                const void *kept;
                size_t kept_len;
                r = deval_eval_kept_state(g, &kept, &kept_len);
                if (b < k)
                        CHECK(r == 1 && kept_len == strlen(mine) && !memcmp(kept, mine, kept_len),
                              "kept state at batch %d: %d", b, r);
                else if (b % 2 == 0)
                        CHECK(deval_eval_batch_state(g, mine, strlen(mine)) == 1, "state %d", b);
                for (size_t i = 0; i < n; i++) {
                        char want[16];
                        snprintf(want, sizeof(want), "w%lld",
                                 (long long)((int64_t)b * WORLD * PER + (int64_t)i));
                        CHECK(got[i].len == strlen(want) && !memcmp(got[i].data, want, got[i].len),
                              "objects at batch %d item %zu", b, i);
                }
        }
        int b = BATCHES;
        STEP(deval_eval_complete(g));
        CHECK(run->die_rank < 0 && run->bad_rank < 0, "the pass closed where it must fail");
        deval_leave(g);
        return 0;
}

static void run_job(const Run *r, bool want_failed) {
        assert_int_equal(harness_run(&H, WORLD, rank_job, (void *)r, 30) > 0, want_failed);
}

static int journals(void) {
        char out[4096];
        assert_int_equal(harness_ctl(&H, "resume --json", out, sizeof(out)), 0);
        const char *p = strstr(out, "\"total\": ");
        assert_non_null(p);
        return atoi(p + 9);
}

/* A run dies at batch 4; the next answers the batches kept and finishes, exact. */
static void test_resumes(void **state) {
        (void)state;
        Run die = {"resume-a", 1, 4, 0, 1, -1, -1};
        run_job(&die, true);
        assert_int_equal(journals(), WORLD);
        Run again = {"resume-a", -1, -1, -1, 1, -1, -1};
        run_job(&again, false);
        assert_int_equal(journals(), 0); /* the close dropped them */
}

/* A batch that is not the kept one fails on its rank, and the others learn it. */
static void test_changed_batch_fails(void **state) {
        (void)state;
        Run die = {"resume-b", 2, 5, 0, 1, -1, -1};
        run_job(&die, true);
        Run changed = {"resume-b", -1, -1, -1, 1, 0, 1};
        run_job(&changed, false); /* rank 0's batch fails there, the others' later */
        char out[256];
        assert_int_equal(harness_ctl(&H, "resume drop all", out, sizeof(out)), 0);
        assert_non_null(strstr(out, "dropped 2 resume journals")); /* rank 0's is gone */
}

/* Another loader's pass starts over, and says so. */
static void test_other_loader_starts_over(void **state) {
        (void)state;
        Run die = {"resume-c", 0, 3, 0, 1, -1, -1};
        run_job(&die, true);
        Run other = {"resume-c", -1, -1, 0, 2, -1, -1};
        run_job(&other, false);
        assert_int_equal(journals(), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_resumes),
                cmocka_unit_test(test_changed_batch_fails),
                cmocka_unit_test(test_other_loader_starts_over),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
