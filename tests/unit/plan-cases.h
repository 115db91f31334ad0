/* SPDX-License-Identifier: MIT */
/*
 * plan-cases.h - random gather cases for the plan's tests and the copy kernel's: 1-8 ranks,
 * 1-3 tensors of every dtype, 0-4 dims with ragged sizes, 0-row inputs, both orders,
 * pad_first, valid_rows, keep_rows and eval-pass positions, with random data.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "plan.h"
#include "util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return n ? (uint32_t)(rng_state % n) : 0;
}

typedef struct {
        int world, n;
        DvShape shape[8 * 3];
        uint8_t *data[8 * 3];
        int64_t valid[8];
        DvPlanInput in;
        int64_t pass_rows[8];
} Case;

static int64_t numel_of(const DvShape *s) {
        int64_t n = 1;
        for (int d = 0; d < s->ndim; d++)
                n *= s->shape[d];
        return n;
}

static void case_free(Case *c) {
        for (int i = 0; i < c->world * c->n; i++)
                free(c->data[i]);
}

static void fill_random(uint8_t *p, size_t len) {
        for (size_t i = 0; i < len; i++)
                p[i] = (uint8_t)rnd(256);
}

static void make_case(Case *c) {
        static const double pads[] = {0.0, -1.0, 3.5, -100.0, 1e30, 65504.0};
        memset(c, 0, sizeof(*c));
        c->world = 1 + (int)rnd(8);
        c->n = 1 + (int)rnd(3);
        int nd[3], dt[3], kk[3];
        for (int i = 0; i < c->n; i++) {
                nd[i] = i == 0 ? (int)rnd(5) : 1 + (int)rnd(4);
                dt[i] = DEVAL_BOOL + (int)rnd(10);
                kk[i] = i == 0 ? 1 : (int)rnd(4);
        }
        for (int r = 0; r < c->world; r++) {
                int64_t samples = nd[0] == 0 ? 1 : rnd(4) == 0 ? 0 : 1 + rnd(6);
                for (int i = 0; i < c->n; i++) {
                        DvShape *s = &c->shape[r * c->n + i];
                        s->dtype = dt[i];
                        s->ndim = nd[i];
                        for (int d = 1; d < nd[i]; d++)
                                s->shape[d] = rnd(3) == 0 ? 2 : (int64_t)rnd(5);
                        if (nd[i] > 0)
                                s->shape[0] = i == 0 ? samples : samples * kk[i];
                        int64_t bytes = numel_of(s) * (int64_t)dv_dtype_size(dt[i]);
                        c->data[r * c->n + i] = malloc((size_t)bytes + 1);
                        fill_random(c->data[r * c->n + i], (size_t)bytes);
                }
                c->valid[r] = rnd(3) == 0 ? (int64_t)rnd(8) : -1;
                c->pass_rows[r] = rnd(6);
        }
        c->in = (DvPlanInput){.world = c->world,
                              .ntensors = c->n,
                              .in = c->shape,
                              .valid_rows = c->valid,
                              .keep_rows = rnd(3) == 0 ? (int64_t)rnd(20) : -1,
                              .order = (int)rnd(2),
                              .pad_first = rnd(2) != 0,
                              .pad_value = pads[rnd(DV_ARRAY_SIZE(pads))],
                              .in_pass = rnd(2) != 0,
                              .num_samples = rnd(50),
                              .pass_total = rnd(30),
                              .pass_rows = c->pass_rows,
                              .out_base = rnd(2) ? 0 : 8 * rnd(100),
                              .max_out = 1ull << 40};
}
