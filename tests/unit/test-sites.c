/* SPDX-License-Identifier: MIT */
/*
 * test-sites.c - an eval pass's call sites: calls take sites 0, 1, ... in turn unless named;
 * a site every batch called is whole, one some batch skipped is not from the batch after it
 * on (and stays so), one first called after the first batch never is; the close's mask names
 * the skipped ones as a pass's counters number them; many sites grow as memory holds; the
 * counted calls of every batch before say where a batch starts.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "deval.h"

#include "sites.h"

static uint32_t take(DvSites *s, int objects, bool *whole) {
        uint32_t site;
        assert_int_equal(dv_sites_take(s, objects, &site, whole), 0);
        return site;
}

static void test_calls_in_turn_and_named(void **state) {
        (void)state;
        DvSites s = {0};
        dv_sites_free(&s);
        bool whole;
        dv_sites_batch(&s);
        assert_int_equal(take(&s, 0, &whole), 0);
        assert_int_equal(take(&s, 0, &whole), 1);
        assert_int_equal(take(&s, 1, &whole), 0); /* objects apart */
        dv_sites_name(&s, 0, 7);
        assert_int_equal(dv_sites_peek(&s, 0), 7);
        assert_int_equal(take(&s, 0, &whole), 7);
        assert_int_equal(take(&s, 0, &whole), 8); /* an unnamed call after a named one */
        dv_sites_batch(&s);
        assert_int_equal(dv_sites_peek(&s, 0), 0);
        dv_sites_free(&s);
}

static void test_a_skipped_site_is_not_whole(void **state) {
        (void)state;
        DvSites s = {0};
        dv_sites_free(&s);
        bool whole;
        /* site 0 in batches 1 and 3, sites 1 and 2 in all three */
        for (uint32_t b = 1; b <= 3; b++) {
                dv_sites_batch(&s);
                if (b != 2) {
                        dv_sites_name(&s, 0, 0);
                        assert_int_equal(dv_sites_whole_next(&s, 0), b == 1);
                        take(&s, 0, &whole);
                        assert_int_equal(whole, b == 1);
                }
                dv_sites_name(&s, 0, 1);
                assert_true(dv_sites_whole_next(&s, 0));
                take(&s, 0, &whole);
                assert_true(whole);
                take(&s, 0, &whole); /* (site 2: the next in turn after a named one) */
                assert_true(whole);
        }
        assert_false(dv_sites_whole(&s, DV_SITE_STREAM(0, 0)));
        assert_true(dv_sites_whole(&s, DV_SITE_STREAM(1, 0)));
        assert_true(dv_sites_whole(&s, DV_SITE_STREAM(5, 1))); /* never called */
        /* site 0 of tensors: bit 0; objects' sites from bit DEVAL_PASS_SITES */
        assert_int_equal(dv_sites_partial(&s, DEVAL_PASS_SITES), 1u << 0);
        /* a batch 4 that calls nothing (a replayed one counts too): every site was skipped */
        dv_sites_batch(&s);
        assert_int_equal(dv_sites_partial(&s, DEVAL_PASS_SITES), 0x7u);
        dv_sites_name(&s, 1, 3);
        take(&s, 1, &whole);
        assert_false(whole);
        assert_int_equal(dv_sites_partial(&s, DEVAL_PASS_SITES),
                         0x7u | 1u << (DEVAL_PASS_SITES + 3));
        dv_sites_free(&s);
}

static void test_a_site_first_called_late_is_never_whole(void **state) {
        (void)state;
        DvSites s = {0};
        dv_sites_free(&s);
        bool whole;
        dv_sites_batch(&s);
        take(&s, 0, &whole);
        dv_sites_batch(&s);
        dv_sites_name(&s, 0, 1);
        assert_false(dv_sites_whole_next(&s, 0));
        take(&s, 0, &whole);
        assert_false(whole);
        dv_sites_batch(&s);
        dv_sites_name(&s, 0, 1);
        take(&s, 0, &whole);
        assert_false(whole); /* (called in batches 2 and 3: still not 1) */
        dv_sites_free(&s);
}

static void test_many_sites(void **state) {
        (void)state;
        DvSites s = {0};
        dv_sites_free(&s);
        bool whole;
        for (uint32_t b = 1; b <= 2; b++) {
                dv_sites_batch(&s);
                for (uint32_t i = 0; i < 5000; i++)
                        assert_int_equal(take(&s, (int)(i & 1), &whole), i / 2);
                assert_true(whole);
        }
        assert_int_equal(dv_sites_partial(&s, DEVAL_PASS_SITES), 0);
        dv_sites_free(&s);
}

/* a counted call of the current batch at site (tensors) returned own of kept samples */
static void counted(DvSites *s, uint32_t site, int64_t valid, int64_t own, int64_t kept) {
        bool whole;
        dv_sites_name(s, 0, site);
        take(s, 0, &whole);
        dv_sites_counts(s, valid);
        dv_sites_done(s, own, kept);
}

static void base_is(const DvSites *s, int64_t kept, int64_t own) {
        int64_t k = -1, o = -1;
        assert_true(dv_sites_base(s, DEVAL_PASS_SITES, &k, &o));
        assert_int_equal(k, kept);
        assert_int_equal(o, own);
}

static void test_where_a_batch_starts(void **state) {
        (void)state;
        DvSites s = {0};
        dv_sites_free(&s);
        bool whole;
        int64_t k, o;
        dv_sites_batch(&s);
        base_is(&s, 0, 0); /* the first batch starts the pass */
        counted(&s, 1, -1, 4, 12);
        base_is(&s, 0, 0);
        dv_sites_batch(&s);
        base_is(&s, 12, 4);
        counted(&s, 1, 3, 4, 11); /* valid_rows 3: 3 of its 4 rows */
        base_is(&s, 12, 4);       /* (the batch's own call leaves its start) */
        dv_sites_batch(&s);
        base_is(&s, 23, 7);
        /* a call not counted (the result of a root-only call, say) says nothing */
        dv_sites_name(&s, 0, 1);
        take(&s, 0, &whole);
        dv_sites_done(&s, 5, 5);
        dv_sites_batch(&s);
        assert_false(dv_sites_base(&s, DEVAL_PASS_SITES, &k, &o));
        dv_sites_free(&s);

        /* site 0 skips batch 2: site 2, counted in every batch, says where batch 3 starts;
         * a site past the counted ones says nothing */
        for (uint32_t b = 1; b <= 3; b++) {
                dv_sites_batch(&s);
                if (b == 3)
                        base_is(&s, 20, 4);
                if (b != 2)
                        counted(&s, 0, -1, 1, 3);
                counted(&s, 2, -1, 2, 10);
                counted(&s, DEVAL_PASS_SITES, -1, 7, 7);
        }
        dv_sites_batch(&s);
        base_is(&s, 30, 6);
        assert_false(dv_sites_base(&s, 0, &k, &o));
        dv_sites_free(&s);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_calls_in_turn_and_named),
                cmocka_unit_test(test_a_skipped_site_is_not_whole),
                cmocka_unit_test(test_a_site_first_called_late_is_never_whole),
                cmocka_unit_test(test_many_sites),
                cmocka_unit_test(test_where_a_batch_starts),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
