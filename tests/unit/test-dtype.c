/* SPDX-License-Identifier: MIT */
/*
 * test-dtype.c - the dtype table, half-precision rounding against a brute-force nearest-value
 * search, pad-value encoding, and the element-wise reductions.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <string.h>

#include "dtype.h"
#include "util.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd64(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

static void test_sizes(void **state) {
        (void)state;
        static const size_t want[] = {0, 1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
        for (int t = DEVAL_BOOL; t <= DEVAL_F64; t++)
                assert_int_equal(dv_dtype_size(t), want[t]);
        assert_int_equal(dv_dtype_size(0), 0);
        assert_int_equal(dv_dtype_size(11), 0);
        assert_false(dv_dtype_valid(-3));
        assert_string_equal(dv_dtype_name(DEVAL_BF16), "bf16");
}

/* Every non-NaN half decodes and re-encodes to itself. */
static void test_half_round_trip(void **state) {
        (void)state;
        for (uint32_t h = 0; h < 65536; h++) {
                double f = dv_f16_to_f64((uint16_t)h), b = dv_bf16_to_f64((uint16_t)h);
                if (!isnan(f))
                        assert_int_equal(dv_f64_to_f16(f), h);
                else
                        assert_true(isnan(dv_f16_to_f64(dv_f64_to_f16(f))));
                if (!isnan(b))
                        assert_int_equal(dv_f64_to_bf16(b), h);
        }
}

/* Nearest half to x >= 0 by binary search over the ordered finite encodings; ties to even. */
static uint16_t nearest(double x, double (*dec)(uint16_t), uint16_t max_finite) {
        uint32_t lo = 0, hi = max_finite;
        if (x >= dec(max_finite)) {
                double ulp = dec(max_finite) - dec((uint16_t)(max_finite - 1));
                return x < dec(max_finite) + ulp / 2 ? max_finite : (uint16_t)(max_finite + 1);
        }
        while (lo < hi) { /* largest h with dec(h) <= x */
                uint32_t mid = (lo + hi + 1) / 2;
                if (dec((uint16_t)mid) <= x)
                        lo = mid;
                else
                        hi = mid - 1;
        }
        double a = dec((uint16_t)lo), b = dec((uint16_t)(lo + 1));
        if (x - a < b - x)
                return (uint16_t)lo;
        if (x - a > b - x)
                return (uint16_t)(lo + 1);
        return (uint16_t)((lo & 1) ? lo + 1 : lo);
}

static void test_half_rounding(void **state) {
        (void)state;
        for (int i = 0; i < 200000; i++) {
                /* random magnitudes across and past both formats' ranges */
                double x = ldexp((double)(rnd64() >> 11) / 9007199254740992.0,
                                 (int)(rnd64() % 300) - 150);
                if (i % 4 == 0) /* exact ties between neighbours */
                        x = (dv_f16_to_f64((uint16_t)(rnd64() % 0x7bff)) +
                             dv_f16_to_f64((uint16_t)(rnd64() % 0x7bff + 1))) /
                            2;
                assert_int_equal(dv_f64_to_f16(x), nearest(x, dv_f16_to_f64, 0x7bff));
                assert_int_equal(dv_f64_to_f16(-x), 0x8000 | nearest(x, dv_f16_to_f64, 0x7bff));
                assert_int_equal(dv_f64_to_bf16(x), nearest(x, dv_bf16_to_f64, 0x7f7f));
        }
        assert_int_equal(dv_f64_to_f16(INFINITY), 0x7c00);
        assert_int_equal(dv_f64_to_bf16(-INFINITY), 0xff80);
        assert_true(isnan(dv_f16_to_f64(dv_f64_to_f16(NAN))));
        assert_int_equal(dv_f64_to_f16(65520.0), 0x7c00); /* halfway past the max: inf */
        assert_int_equal(dv_f64_to_f16(65519.99), 0x7bff);
}

static void test_encode(void **state) {
        (void)state;
        uint8_t b[8];
        dv_dtype_encode(DEVAL_I64, -100.0, b);
        int64_t i64;
        memcpy(&i64, b, 8);
        assert_int_equal(i64, -100);
        dv_dtype_encode(DEVAL_BOOL, 0.5, b);
        assert_int_equal(b[0], 1);
        dv_dtype_encode(DEVAL_U8, -1.0, b);
        assert_int_equal(b[0], 255);
        dv_dtype_encode(DEVAL_I32, NAN, b);
        int32_t i32;
        memcpy(&i32, b, 4);
        assert_int_equal(i32, 0);
        dv_dtype_encode(DEVAL_F16, 1.0, b);
        uint16_t h;
        memcpy(&h, b, 2);
        assert_int_equal(h, 0x3c00);
        assert_true(dv_dtype_decode(DEVAL_F32, (float[]){2.5f}) == 2.5);
}

static void reduce3(int dtype, int op, const void *a, const void *b, const void *c, void *out,
                    size_t n) {
        double acc[16];
        size_t es = dv_dtype_size(dtype);
        dv_reduce_init(dtype, acc, a, n);
        dv_reduce_accumulate(dtype, op, acc, b, n);
        dv_reduce_accumulate(dtype, op, acc, c, n);
        dv_reduce_finish(dtype, op, 3, acc, out, n);
        (void)es;
}

static void test_reduce(void **state) {
        (void)state;
        int32_t a[2] = {INT32_MAX, 5}, b[2] = {1, -7}, c[2] = {0, 9}, o[2];
        reduce3(DEVAL_I32, DEVAL_SUM, a, b, c, o, 2);
        assert_int_equal(o[0], INT32_MIN); /* wraps like torch */
        assert_int_equal(o[1], 7);
        reduce3(DEVAL_I32, DEVAL_MAX, a, b, c, o, 2);
        assert_int_equal(o[1], 9);
        reduce3(DEVAL_I32, DEVAL_MIN, a, b, c, o, 2);
        assert_int_equal(o[1], -7);
        reduce3(DEVAL_I32, DEVAL_PROD, a, b, c, o, 2);
        assert_int_equal(o[1], -315);

        /* f16: 2048 + 1 + 1 rounds once to 2050; adding in f16 one at a time gives 2048 */
        uint16_t x = dv_f64_to_f16(2048), y = dv_f64_to_f16(1), hz, ho;
        reduce3(DEVAL_F16, DEVAL_SUM, &x, &y, &y, &ho, 1);
        assert_true(dv_f16_to_f64(ho) == 2050.0);
        reduce3(DEVAL_BF16, DEVAL_MEAN, (uint16_t[]){dv_f64_to_bf16(1)},
                (uint16_t[]){dv_f64_to_bf16(2)}, (uint16_t[]){dv_f64_to_bf16(4)}, &hz, 1);
        assert_int_equal(hz, dv_f64_to_bf16(7.0 / 3.0));

        float f[3] = {1.5f, NAN, 2.0f}, fo;
        reduce3(DEVAL_F32, DEVAL_MAX, &f[0], &f[1], &f[2], &fo, 1);
        assert_true(isnan(fo));
        double d[3] = {1, 2, 6}, dout;
        reduce3(DEVAL_F64, DEVAL_MEAN, &d[0], &d[1], &d[2], &dout, 1);
        assert_true(dout == 3.0);

        uint8_t t[3] = {0, 1, 0}, bo;
        reduce3(DEVAL_BOOL, DEVAL_SUM, &t[0], &t[1], &t[2], &bo, 1);
        assert_int_equal(bo, 1);
        reduce3(DEVAL_BOOL, DEVAL_PROD, &t[0], &t[1], &t[2], &bo, 1);
        assert_int_equal(bo, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_sizes),         cmocka_unit_test(test_half_round_trip),
                cmocka_unit_test(test_half_rounding), cmocka_unit_test(test_encode),
                cmocka_unit_test(test_reduce),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
