/* SPDX-License-Identifier: MIT */
/*
 * dtype.c - dtype table, half-precision rounding and element-wise reductions.
 *
 * Half formats are rounded straight from double, never through float, so that a value is
 * rounded once (double rounding would be off by one ulp on ties).
 */
#include "dtype.h"

#include <math.h>
#include <string.h>

#include "deval.h"

static const struct {
        const char *name;
        size_t size;
} dtypes[] = {
        [DEVAL_BOOL] = {"bool", 1}, [DEVAL_U8] = {"u8", 1},     [DEVAL_I8] = {"i8", 1},
        [DEVAL_I16] = {"i16", 2},   [DEVAL_I32] = {"i32", 4},   [DEVAL_I64] = {"i64", 8},
        [DEVAL_F16] = {"f16", 2},   [DEVAL_BF16] = {"bf16", 2}, [DEVAL_F32] = {"f32", 4},
        [DEVAL_F64] = {"f64", 8},
};

bool dv_dtype_valid(int dtype) {
        return dtype >= DEVAL_BOOL && dtype <= DEVAL_F64;
}

size_t dv_dtype_size(int dtype) {
        return dv_dtype_valid(dtype) ? dtypes[dtype].size : 0;
}

size_t deval_dtype_size(int dtype) {
        return dv_dtype_size(dtype);
}

const char *dv_dtype_name(int dtype) {
        return dv_dtype_valid(dtype) ? dtypes[dtype].name : "unknown";
}

bool dv_dtype_is_float(int dtype) {
        return dtype == DEVAL_F16 || dtype == DEVAL_BF16 || dtype == DEVAL_F32 ||
               dtype == DEVAL_F64;
}

/* Decode a binary float of ebits exponent and mbits mantissa bits held in the low bits. */
static double small_to_f64(uint32_t v, int ebits, int mbits) {
        uint32_t sign = v >> (ebits + mbits) & 1;
        uint32_t exp = v >> mbits & ((1u << ebits) - 1);
        uint32_t man = v & ((1u << mbits) - 1);
        int bias = (1 << (ebits - 1)) - 1;
        double r;

        if (exp == (1u << ebits) - 1)
                r = man ? NAN : INFINITY;
        else if (exp == 0)
                r = ldexp((double)man, 1 - bias - mbits);
        else
                r = ldexp((double)(man | 1u << mbits), (int)exp - bias - mbits);
        return sign ? -r : r;
}

/* Round a double to the nearest binary float of ebits/mbits, ties to even. */
static uint16_t f64_to_small(double x, int ebits, int mbits) {
        uint64_t b;
        memcpy(&b, &x, sizeof(b));
        uint32_t sign = (uint32_t)(b >> 63) << (ebits + mbits);
        uint32_t exp = (uint32_t)(b >> 52) & 0x7ff;
        uint64_t man = b & ((1ull << 52) - 1);
        int bias = (1 << (ebits - 1)) - 1;
        uint32_t emax = (1u << ebits) - 1;

        if (exp == 0x7ff) /* inf, or a quiet NaN */
                return (uint16_t)(sign | emax << mbits | (man ? 1u << (mbits - 1) : 0));
        if (exp == 0) /* zero or a double subnormal: far below half the smallest target */
                return (uint16_t)sign;

        int te = (int)exp - 1023 + bias; /* biased target exponent */
        uint64_t sig = man | 1ull << 52;
        int shift = 52 - mbits + (te >= 1 ? 0 : 1 - te);
        if (shift > 54) /* below half of the smallest subnormal */
                return (uint16_t)sign;
        uint64_t q = sig >> shift;
        uint64_t rem = sig & ((1ull << shift) - 1);
        uint64_t half = 1ull << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
                q++;
        if (te < 1) /* subnormal; a carry into bit mbits is the smallest normal, same bits */
                return (uint16_t)(sign | q);
        if (q == 1ull << (mbits + 1)) {
                q >>= 1;
                te++;
        }
        if (te >= (int)emax)
                return (uint16_t)(sign | emax << mbits);
        return (uint16_t)(sign | (uint32_t)te << mbits | (uint32_t)(q & ((1u << mbits) - 1)));
}

double dv_f16_to_f64(uint16_t h) {
        return small_to_f64(h, 5, 10);
}

double dv_bf16_to_f64(uint16_t b) {
        return small_to_f64(b, 8, 7);
}

uint16_t dv_f64_to_f16(double x) {
        return f64_to_small(x, 5, 10);
}

uint16_t dv_f64_to_bf16(double x) {
        return f64_to_small(x, 8, 7);
}

/* Integers: truncate toward zero then wrap to the width, as a cast in C would for in-range
 * values; NaN becomes 0. */
static int64_t to_i64(double v) {
        if (isnan(v))
                return 0;
        if (v >= 9223372036854775807.0)
                return INT64_MAX;
        if (v <= -9223372036854775808.0)
                return INT64_MIN;
        return (int64_t)v;
}

void dv_dtype_encode(int dtype, double v, void *out) {
        switch (dtype) {
        case DEVAL_BOOL:
                *(uint8_t *)out = v != 0.0;
                break;
        case DEVAL_U8:
                *(uint8_t *)out = (uint8_t)(uint64_t)to_i64(v);
                break;
        case DEVAL_I8:
                *(int8_t *)out = (int8_t)to_i64(v);
                break;
        case DEVAL_I16: {
                int16_t x = (int16_t)to_i64(v);
                memcpy(out, &x, 2);
                break;
        }
        case DEVAL_I32: {
                int32_t x = (int32_t)to_i64(v);
                memcpy(out, &x, 4);
                break;
        }
        case DEVAL_I64: {
                int64_t x = to_i64(v);
                memcpy(out, &x, 8);
                break;
        }
        case DEVAL_F16: {
                uint16_t x = dv_f64_to_f16(v);
                memcpy(out, &x, 2);
                break;
        }
        case DEVAL_BF16: {
                uint16_t x = dv_f64_to_bf16(v);
                memcpy(out, &x, 2);
                break;
        }
        case DEVAL_F32: {
                float x = (float)v;
                memcpy(out, &x, 4);
                break;
        }
        case DEVAL_F64:
                memcpy(out, &v, 8);
                break;
        }
}

double dv_dtype_decode(int dtype, const void *in) {
        switch (dtype) {
        case DEVAL_BOOL:
        case DEVAL_U8:
                return *(const uint8_t *)in;
        case DEVAL_I8:
                return *(const int8_t *)in;
        case DEVAL_I16: {
                int16_t x;
                memcpy(&x, in, 2);
                return x;
        }
        case DEVAL_I32: {
                int32_t x;
                memcpy(&x, in, 4);
                return x;
        }
        case DEVAL_I64: {
                int64_t x;
                memcpy(&x, in, 8);
                return (double)x;
        }
        case DEVAL_F16: {
                uint16_t x;
                memcpy(&x, in, 2);
                return dv_f16_to_f64(x);
        }
        case DEVAL_BF16: {
                uint16_t x;
                memcpy(&x, in, 2);
                return dv_bf16_to_f64(x);
        }
        case DEVAL_F32: {
                float x;
                memcpy(&x, in, 4);
                return x;
        }
        case DEVAL_F64: {
                double x;
                memcpy(&x, in, 8);
                return x;
        }
        }
        return 0.0;
}

size_t dv_reduce_acc_size(int dtype) {
        return dtype == DEVAL_F16 || dtype == DEVAL_BF16 ? sizeof(double) : dv_dtype_size(dtype);
}

/* Integer ops wrap (two's complement) like torch; unsigned arithmetic keeps that defined. */
#define REDUCE_INT(T, UT)                                         \
        do {                                                      \
                T *a = acc;                                       \
                const T *b = x;                                   \
                for (size_t k = 0; k < n; k++) {                  \
                        switch (op) {                             \
                        case DEVAL_SUM:                           \
                                a[k] = (T)((UT)a[k] + (UT)b[k]);  \
                                break;                            \
                        case DEVAL_PROD:                          \
                                a[k] = (T)((UT)a[k] * (UT)b[k]);  \
                                break;                            \
                        case DEVAL_MAX:                           \
                                a[k] = b[k] > a[k] ? b[k] : a[k]; \
                                break;                            \
                        case DEVAL_MIN:                           \
                                a[k] = b[k] < a[k] ? b[k] : a[k]; \
                                break;                            \
                        }                                         \
                }                                                 \
        } while (0)

/* NaN propagates through max and min, as in torch. */
#define REDUCE_FLOAT(T, LOAD)                                               \
        do {                                                                \
                T *a = acc;                                                 \
                for (size_t k = 0; k < n; k++) {                            \
                        T b = LOAD;                                         \
                        switch (op) {                                       \
                        case DEVAL_SUM:                                     \
                        case DEVAL_MEAN:                                    \
                                a[k] += b;                                  \
                                break;                                      \
                        case DEVAL_PROD:                                    \
                                a[k] *= b;                                  \
                                break;                                      \
                        case DEVAL_MAX:                                     \
                                a[k] = isnan(a[k]) || b <= a[k] ? a[k] : b; \
                                break;                                      \
                        case DEVAL_MIN:                                     \
                                a[k] = isnan(a[k]) || b >= a[k] ? a[k] : b; \
                                break;                                      \
                        }                                                   \
                }                                                           \
        } while (0)

void dv_reduce_accumulate(int dtype, int op, void *acc, const void *x, size_t n) {
        switch (dtype) {
        case DEVAL_BOOL: {
                uint8_t *a = acc;
                const uint8_t *b = x;
                for (size_t k = 0; k < n; k++) {
                        bool p = a[k] != 0, q = b[k] != 0;
                        /* sum and max are "any", prod and min are "all" */
                        a[k] = (op == DEVAL_SUM || op == DEVAL_MAX) ? (p || q) : (p && q);
                }
                break;
        }
        case DEVAL_U8:
                REDUCE_INT(uint8_t, uint8_t);
                break;
        case DEVAL_I8:
                REDUCE_INT(int8_t, uint8_t);
                break;
        case DEVAL_I16:
                REDUCE_INT(int16_t, uint16_t);
                break;
        case DEVAL_I32:
                REDUCE_INT(int32_t, uint32_t);
                break;
        case DEVAL_I64:
                REDUCE_INT(int64_t, uint64_t);
                break;
        case DEVAL_F16:
                REDUCE_FLOAT(double, dv_f16_to_f64(((const uint16_t *)x)[k]));
                break;
        case DEVAL_BF16:
                REDUCE_FLOAT(double, dv_bf16_to_f64(((const uint16_t *)x)[k]));
                break;
        case DEVAL_F32:
                REDUCE_FLOAT(float, ((const float *)x)[k]);
                break;
        case DEVAL_F64:
                REDUCE_FLOAT(double, ((const double *)x)[k]);
                break;
        }
}

void dv_reduce_init(int dtype, void *acc, const void *x, size_t n) {
        if (dtype == DEVAL_F16 || dtype == DEVAL_BF16) {
                double *a = acc;
                const uint16_t *h = x;
                for (size_t k = 0; k < n; k++)
                        a[k] = dtype == DEVAL_F16 ? dv_f16_to_f64(h[k]) : dv_bf16_to_f64(h[k]);
        } else {
                memcpy(acc, x, n * dv_dtype_size(dtype));
        }
}

void dv_reduce_finish(int dtype, int op, int world, const void *acc, void *out, size_t n) {
        switch (dtype) {
        case DEVAL_F16:
        case DEVAL_BF16: {
                const double *a = acc;
                uint16_t *o = out;
                for (size_t k = 0; k < n; k++) {
                        double v = op == DEVAL_MEAN ? a[k] / world : a[k];
                        o[k] = dtype == DEVAL_F16 ? dv_f64_to_f16(v) : dv_f64_to_bf16(v);
                }
                break;
        }
        case DEVAL_F32: {
                const float *a = acc;
                float *o = out;
                for (size_t k = 0; k < n; k++)
                        o[k] = op == DEVAL_MEAN ? a[k] / (float)world : a[k];
                break;
        }
        case DEVAL_F64: {
                const double *a = acc;
                double *o = out;
                for (size_t k = 0; k < n; k++)
                        o[k] = op == DEVAL_MEAN ? a[k] / world : a[k];
                break;
        }
        default:
                memmove(out, acc, n * dv_dtype_size(dtype));
                break;
        }
}

/* Elements reduced at a time: the accumulator, 8 bytes an element at most, stays in L1. */
#define REDUCE_CHUNK 1024

/** dv_reduce_ranks() - see dtype.h. */
void dv_reduce_ranks(int dtype, int op, int world, const uint8_t *const *srcs, uint64_t numel,
                     void *out) {
        size_t es = dv_dtype_size(dtype);
        double acc[REDUCE_CHUNK];
        for (uint64_t e = 0; e < numel; e += REDUCE_CHUNK) {
                size_t n = numel - e < REDUCE_CHUNK ? (size_t)(numel - e) : REDUCE_CHUNK;
                dv_reduce_init(dtype, acc, srcs[0] + e * es, n);
                for (int k = 1; k < world; k++)
                        dv_reduce_accumulate(dtype, op, acc, srcs[k] + e * es, n);
                dv_reduce_finish(dtype, op, world, acc, (uint8_t *)out + e * es, n);
        }
}
