/* SPDX-License-Identifier: MIT */
/*
 * test-agree.c - the step's contract says every failure in the user's words: whichever check
 * finds it, the message begins with the call the user made and its count, "collective #3
 * (reduce)", never a check's own name for it.
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
#include <string.h>

#include "agree.h"

static void who(const DvAgree *a, int k, char *buf, size_t len) {
        (void)a;
        snprintf(buf, len, "rank %d", k);
}

/* every rank's tensor lies where it says, unless ctx names a rank whose does not */
static int desc(const DvAgree *a, int k, int i, bool with_data) {
        (void)i;
        (void)with_data;
        const int *bad = a->ctx;
        if (bad && *bad == k) {
                snprintf(a->msg, a->msg_len, "rank %d's tensor lies outside its arena", k);
                return DEVAL_EPROTO;
        }
        return 0;
}

static char msg[DV_MSG_MAX];

static int agree(DvRequest *q, int world, const int *bad) {
        DvAgree a = {.q = q,
                     .world = world,
                     .call = 3,
                     .who = who,
                     .desc = desc,
                     .ctx = (void *)bad,
                     .msg = msg,
                     .msg_len = sizeof(msg)};
        msg[0] = '\0';
        return dv_agree(&a);
}

static void one_tensor(DvRequest *q, uint32_t op, int64_t rows) {
        memset(q, 0, sizeof(*q));
        q->seq = 7; /* the step: not what a message names */
        q->call = 3;
        q->op = op;
        q->ntensors = 1;
        q->root = op == DV_OP_BROADCAST ? 0 : -1;
        q->valid_rows = q->keep_rows = -1;
        q->t[0].dtype = DEVAL_F32;
        q->t[0].ndim = 1;
        q->t[0].shape[0] = rows;
}

/* a reduce whose shapes differ: the check of shapes named the op alone */
static void test_shapes_name_the_call(void **state) {
        (void)state;
        DvRequest q[2];
        one_tensor(&q[0], DV_OP_REDUCE, 2);
        one_tensor(&q[1], DV_OP_REDUCE, 3);
        assert_int_equal(agree(q, 2, NULL), DEVAL_EMISMATCH);
        assert_string_equal(msg, "collective #3 (reduce): ranks disagree on the shape: dim 0 is 2 "
                                 "on rank 0, 3 on rank 1");
        one_tensor(&q[0], DV_OP_BROADCAST, 2);
        one_tensor(&q[1], DV_OP_BROADCAST, 3);
        assert_int_equal(agree(q, 2, NULL), DEVAL_EMISMATCH);
        assert_string_equal(msg, "collective #3 (broadcast): ranks disagree on the shape: dim 0 "
                                 "is 2 on rank 0, 3 on rank 1");
}

/* what an executor's own check of a tensor says comes after the call too */
static void test_executor_words_name_the_call(void **state) {
        (void)state;
        DvRequest q[2];
        one_tensor(&q[0], DV_OP_GATHER, 2);
        one_tensor(&q[1], DV_OP_GATHER, 3);
        int bad = 1;
        assert_int_equal(agree(q, 2, &bad), DEVAL_EPROTO);
        assert_string_equal(msg, "collective #3 (gather): rank 1's tensor lies outside its arena");
        one_tensor(&q[0], DV_OP_REDUCE, 2);
        one_tensor(&q[1], DV_OP_REDUCE, 2);
        q[0].reduce_op = q[1].reduce_op = DEVAL_MEAN;
        q[0].t[0].dtype = q[1].t[0].dtype = DEVAL_I32;
        assert_int_equal(agree(q, 2, NULL), DEVAL_EINVAL);
        assert_string_equal(msg, "collective #3 (reduce): mean needs a floating dtype, not i32");
}

/* a message that names the call already is left as it is, said once */
static void test_named_once(void **state) {
        (void)state;
        DvRequest q[2];
        one_tensor(&q[0], DV_OP_GATHER, 2);
        one_tensor(&q[1], DV_OP_REDUCE, 2);
        assert_int_equal(agree(q, 2, NULL), DEVAL_EMISMATCH);
        assert_string_equal(msg, "collective #3: ranks disagree on the op: rank 0 called gather, "
                                 "rank 1 called reduce; every rank makes the same calls, in the "
                                 "same order");
        one_tensor(&q[0], DV_OP_GATHER, 2);
        one_tensor(&q[1], DV_OP_GATHER, 2);
        q[1].pad_first = 1;
        assert_int_equal(agree(q, 2, NULL), DEVAL_EMISMATCH);
        assert_string_equal(msg, "collective #3 (gather): ranks disagree on pad_first: rank 0 has "
                                 "0, rank 1 has 1");
        one_tensor(&q[1], DV_OP_GATHER, 5);
        assert_int_equal(agree(q, 2, NULL), 0);
}

/* a call of a pass no stream counts says where its batch starts: every rank alike, in range */
static void test_where_a_batch_starts_agrees(void **state) {
        (void)state;
        DvRequest q[2];
        for (int k = 0; k < 2; k++) {
                one_tensor(&q[k], DV_OP_GATHER_METRICS, 2);
                q[k].site = DEVAL_PASS_SITES;
                q[k].flags = DV_SITE_BASED;
                q[k].base_total = 12;
                q[k].base_rows = 6;
        }
        DvAgree a = {.q = q,
                     .world = 2,
                     .call = 3,
                     .who = who,
                     .desc = desc,
                     .msg = msg,
                     .msg_len = sizeof(msg),
                     .pass_open = true};
        assert_int_equal(dv_agree(&a), 0);
        q[1].base_total = 10;
        assert_int_equal(dv_agree(&a), DEVAL_EMISMATCH);
        assert_string_equal(msg, "collective #3 (gather_for_metrics): ranks disagree on how many "
                                 "samples of the eval pass came before this batch: rank 0 has "
                                 "12, rank 1 has 10");
        q[1].base_total = 12;
        q[1].base_rows = -1;
        assert_int_equal(dv_agree(&a), DEVAL_EPROTO);
        q[1].base_rows = 6;
        q[1].flags = 0; /* (one rank says where, the other not: not the same call) */
        assert_int_equal(dv_agree(&a), DEVAL_EMISMATCH);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_shapes_name_the_call),
                cmocka_unit_test(test_executor_words_name_the_call),
                cmocka_unit_test(test_named_once),
                cmocka_unit_test(test_where_a_batch_starts_agrees),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
