/* SPDX-License-Identifier: MIT */
/*
 * test-plan.c - the plan against a naive reference: materialise every rank's tensors, pad
 * them element by element, order the samples by sorting (rank, dataset position) pairs, trim,
 * and compare byte for byte with what the plan's segments build. Thousands of random cases
 * cover 1-8 ranks, every dtype, 0-4 dims, 0-row inputs, both orders, pad_first, valid_rows,
 * keep_rows and eval-pass positions; hand-written cases pin the documented examples.
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

#include "dtype.h"
#include "pass.h"
#include "plan-cases.h"
#include "plan.h"
#include "util.h"

/* Run the plan's segments the simplest way. */
static void execute(const DvPlan *p, Case *c, uint8_t *out, bool pad_plan) {
        for (size_t i = 0; i < p->nsegs; i++) {
                const DvSeg *s = &p->segs[i];
                for (uint64_t k = 0; k < s->count; k++) {
                        uint8_t *dst = out + s->dst + k * s->dst_stride;
                        if (s->kind == DV_SEG_COPY) {
                                int t = pad_plan ? 0 : s->tensor;
                                const uint8_t *src =
                                        c->data[s->rank * c->n + t] + s->src + k * s->src_stride;
                                memcpy(dst, src, s->len);
                        } else {
                                size_t es = dv_dtype_size(p->out[s->tensor].dtype);
                                assert_int_equal(s->len % es, 0);
                                for (uint64_t b = 0; b < s->len; b += es)
                                        memcpy(dst + b, p->fill[s->tensor], es);
                        }
                }
        }
}

/* Element at multi-index idx of dst dims dd, taken from src dims sd or the pad element. */
static const uint8_t *ref_elem(const uint8_t *src, const int64_t *sd, const int64_t *dd, int nd,
                               const int64_t *idx, bool pad_first, size_t es, const uint8_t *pad) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) {
                int64_t i = idx[d];
                if (pad_first)
                        i -= dd[d] - sd[d];
                if (i < 0 || i >= sd[d])
                        return pad;
                off = off * sd[d] + i;
        }
        return src + off * (int64_t)es;
}

/* Write the padded block of src (dims sd) as dims dd into dst. */
static void ref_pad(uint8_t *dst, const uint8_t *src, const int64_t *sd, const int64_t *dd, int nd,
                    bool pad_first, size_t es, const uint8_t *pad) {
        int64_t total = 1, idx[DEVAL_MAX_DIMS] = {0};
        for (int d = 0; d < nd; d++)
                total *= dd[d];
        for (int64_t e = 0; e < total; e++) {
                int64_t rem = e;
                for (int d = nd - 1; d >= 0; d--) {
                        idx[d] = rem % dd[d];
                        rem /= dd[d];
                }
                memcpy(dst + e * (int64_t)es, ref_elem(src, sd, dd, nd, idx, pad_first, es, pad),
                       es);
        }
}

typedef struct {
        int64_t pos;
        int rank;
        int64_t sample;
} Pick;

static int pick_cmp(const void *a, const void *b) {
        const Pick *x = a, *y = b;
        if (x->pos != y->pos)
                return x->pos < y->pos ? -1 : 1;
        return x->rank - y->rank;
}

/* The reference: which (rank, sample) pairs make the result, in order. */
static size_t ref_order(const Case *c, const int64_t *contributed, Pick *picks) {
        const DvPlanInput *in = &c->in;
        size_t n = 0;
        int64_t at = in->in_pass ? in->pass_total : 0;
        for (int r = 0; r < c->world; r++)
                for (int64_t j = 0; j < contributed[r]; j++) {
                        Pick p = {.rank = r, .sample = j};
                        if (in->order == DEVAL_ORDER_RANK)
                                p.pos = at++;
                        else
                                p.pos = ((in->in_pass ? in->pass_rows[r] : 0) + j) * c->world + r;
                        if (in->in_pass && p.pos >= in->num_samples)
                                continue;
                        picks[n++] = p;
                }
        if (in->order == DEVAL_ORDER_STRIDED)
                qsort(picks, n, sizeof(*picks), pick_cmp);
        if (in->keep_rows >= 0 && (size_t)in->keep_rows < n)
                n = (size_t)in->keep_rows;
        return n;
}

static void shape_norm(const DvShape *s, DvShape *r) {
        *r = *s;
        if (r->ndim == 0) {
                r->ndim = 1;
                r->shape[0] = 1;
        }
}

/* Check a successful gather plan against the reference. */
static void check_gather(Case *c, const DvPlan *p) {
        int W = c->world, n = c->n;
        int64_t contributed[8];

        for (int r = 0; r < W; r++) {
                DvShape s0;
                shape_norm(&c->shape[r * n], &s0);
                contributed[r] = s0.shape[0];
                if (c->valid[r] >= 0 && c->valid[r] < contributed[r])
                        contributed[r] = c->valid[r];
                assert_int_equal(p->contributed[r], contributed[r]);
        }
        Pick *picks = calloc(64 * 8 + 1, sizeof(*picks));
        size_t npicks = ref_order(c, contributed, picks);
        assert_int_equal(p->samples, (int64_t)npicks);

        uint8_t *out = calloc(1, p->out_end + 1);
        execute(p, c, out, false);
        for (int i = 0; i < n; i++) {
                DvShape first;
                shape_norm(&c->shape[i], &first);
                int nd = first.ndim;
                int64_t dd[DEVAL_MAX_DIMS] = {0};
                int64_t k = -1;
                for (int r = 0; r < W; r++) {
                        DvShape s, s0;
                        shape_norm(&c->shape[r * n + i], &s);
                        shape_norm(&c->shape[r * n], &s0);
                        for (int d = 1; d < nd; d++)
                                dd[d] = DV_MAX(dd[d], s.shape[d]);
                        if (s0.shape[0] > 0)
                                k = s.shape[0] / s0.shape[0];
                }
                if (k < 0)
                        k = 0;
                size_t es = dv_dtype_size(first.dtype);
                uint8_t pad[8];
                dv_dtype_encode(first.dtype, c->in.pad_value, pad);
                assert_int_equal(p->out[i].ndim, nd);
                assert_int_equal(p->out[i].dtype, first.dtype);
                assert_int_equal(p->out[i].shape[0], (int64_t)npicks * k);
                int64_t drow = (int64_t)es;
                for (int d = 1; d < nd; d++) {
                        assert_int_equal(p->out[i].shape[d], dd[d]);
                        drow *= dd[d];
                }
                assert_int_equal(p->out_nbytes[i], (uint64_t)(drow * (int64_t)npicks * k));
                assert_int_equal(p->out_offset[i] % DV_ARENA_ALIGN, 0);
                uint8_t *want = calloc(1, (size_t)(drow * k) + 1);
                for (size_t j = 0; j < npicks; j++) {
                        DvShape s;
                        shape_norm(&c->shape[picks[j].rank * n + i], &s);
                        int64_t sd[DEVAL_MAX_DIMS];
                        int64_t srow = (int64_t)es;
                        for (int d = 1; d < nd; d++) {
                                sd[d] = s.shape[d];
                                srow *= sd[d];
                        }
                        sd[0] = dd[0] = k;
                        ref_pad(want, c->data[picks[j].rank * n + i] + picks[j].sample * k * srow,
                                sd, dd, nd, c->in.pad_first, es, pad);
                        assert_memory_equal(out + p->out_offset[i] + (int64_t)j * drow * k, want,
                                            (size_t)(drow * k));
                }
                free(want);
        }
        free(out);
        free(picks);
}

static void test_random_gathers(void **state) {
        (void)state;
        for (int iter = 0; iter < 6000; iter++) {
                Case c;
                DvPlan p;
                make_case(&c);
                dv_plan_init(&p);
                int r = dv_plan_gather(&c.in, &p);
                if (r != 0)
                        fail_msg("case %d: %s", iter, p.err);
                check_gather(&c, &p);
                dv_plan_deinit(&p);
                case_free(&c);
        }
}

static void test_mismatches(void **state) {
        (void)state;
        for (int iter = 0; iter < 500; iter++) {
                Case c;
                DvPlan p;
                make_case(&c);
                if (c.world < 2) {
                        case_free(&c);
                        continue;
                }
                int r = c.world - 1, what = (int)rnd(2);
                DvShape *s = &c.shape[r * c.n];
                if (what == 0)
                        s->dtype = s->dtype == DEVAL_F64 ? DEVAL_F32 : s->dtype + 1;
                else /* 0-d gathers as [1], so 0 and 1 dims agree; move further */
                        s->ndim = s->ndim >= 3 ? s->ndim - 2 : s->ndim + 2;
                dv_plan_init(&p);
                assert_int_equal(dv_plan_gather(&c.in, &p), DEVAL_EMISMATCH);
                assert_non_null(strstr(p.err, what == 0 ? "dtype" : "ndim"));
                dv_plan_deinit(&p);
                case_free(&c);
        }
}

/* Two ranks, k = 2 rows per sample on one tensor but 3 on the other rank. */
static void test_rows_per_sample_mismatch(void **state) {
        (void)state;
        DvShape sh[4] = {
                {DEVAL_I64, 1, {2}},
                {DEVAL_F32, 2, {4, 3}},
                {DEVAL_I64, 1, {1}},
                {DEVAL_F32, 2, {3, 3}},
        };
        int64_t valid[2] = {-1, -1};
        DvPlanInput in = {.world = 2,
                          .ntensors = 2,
                          .in = sh,
                          .valid_rows = valid,
                          .keep_rows = -1,
                          .max_out = 1 << 20};
        DvPlan p;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), DEVAL_EMISMATCH);
        assert_non_null(strstr(p.err, "rows per sample"));
        dv_plan_deinit(&p);
        sh[3].shape[0] = 4; /* 4 rows for 1 sample: whole, but 4 != 2 */
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), DEVAL_EMISMATCH);
        dv_plan_deinit(&p);
        sh[3].shape[0] = 5; /* 5 rows for 1 sample is whole too; 7 for 2 is not */
        sh[1].shape[0] = 7;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), DEVAL_EMISMATCH);
        assert_non_null(strstr(p.err, "whole number"));
        dv_plan_deinit(&p);
}

/* A ragged last dim becomes one strided copy per rank, not one piece per row. */
static void test_segments_merge(void **state) {
        (void)state;
        DvShape sh[2] = {{DEVAL_F32, 2, {1000, 7}}, {DEVAL_F32, 2, {1000, 9}}};
        int64_t valid[2] = {-1, -1};
        DvPlanInput in = {.world = 2,
                          .ntensors = 1,
                          .in = sh,
                          .valid_rows = valid,
                          .keep_rows = -1,
                          .max_out = 1 << 30};
        DvPlan p;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), 0);
        /* rank 0: one strided copy and one strided fill; rank 1: one contiguous copy */
        assert_int_equal(p.nsegs, 3);
        assert_int_equal(p.segs[0].count, 1000);
        assert_int_equal(p.segs[0].len, 28);
        assert_int_equal(p.segs[0].dst_stride, 36);
        /* strided order, where the ranks' rows alternate: still one strided copy per rank
         * and one strided fill for rank 0 (each rank keeps its own segments open) */
        in.order = DEVAL_ORDER_STRIDED;
        dv_plan_reset(&p);
        assert_int_equal(dv_plan_gather(&in, &p), 0);
        assert_int_equal(p.nsegs, 3);
        for (size_t k = 0; k < p.nsegs; k++) {
                assert_int_equal(p.segs[k].count, 1000);
                assert_int_equal(p.segs[k].dst_stride, 2 * 36);
        }
        dv_plan_deinit(&p);
}

/* The eval pass: 10 samples over 4 ranks with batches of 2 leaves 6 duplicates. */
static void test_pass_drops_tail(void **state) {
        (void)state;
        DvShape sh[4];
        int64_t valid[4] = {-1, -1, -1, -1}, rows[4] = {2, 2, 2, 2};
        for (int r = 0; r < 4; r++)
                sh[r] = (DvShape){DEVAL_I32, 1, {2}};
        DvPlanInput in = {.world = 4,
                          .ntensors = 1,
                          .in = sh,
                          .valid_rows = valid,
                          .keep_rows = -1,
                          .in_pass = true,
                          .num_samples = 10,
                          .pass_total = 8,
                          .pass_rows = rows,
                          .max_out = 1 << 20};
        DvPlan p;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), 0);
        assert_int_equal(p.samples, 2); /* rank order: positions 8, 9 are rank 0's two rows */
        assert_int_equal(p.nruns, 1);
        assert_int_equal(p.runs[0].rank, 0);
        dv_plan_deinit(&p);
        in.order = DEVAL_ORDER_STRIDED; /* positions (2+j)*4 + r: 8 (r0) and 9 (r1) */
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), 0);
        assert_int_equal(p.samples, 2);
        assert_int_equal(p.runs[0].rank, 0);
        assert_int_equal(p.runs[1].rank, 1);
        dv_plan_deinit(&p);
}

/* A call no stream counts but that says where its batch starts is planned as the counted
 * stream's at that point: the same 10 samples over 4 ranks, from requests. */
static void test_pass_based(void **state) {
        (void)state;
        DvShape sh[4];
        int64_t valid[4] = {-1, -1, -1, -1}, base[4];
        DvRequest q[4];
        memset(q, 0, sizeof(q));
        for (int r = 0; r < 4; r++) {
                sh[r] = (DvShape){DEVAL_I32, 1, {2}};
                q[r].flags = DV_SITE_BASED;
                q[r].base_total = 8;
                q[r].base_rows = 2;
        }
        for (int order = DEVAL_ORDER_RANK; order <= DEVAL_ORDER_STRIDED; order++) {
                DvPlanInput in = {.world = 4,
                                  .ntensors = 1,
                                  .in = sh,
                                  .valid_rows = valid,
                                  .keep_rows = -1,
                                  .order = DEVAL_ORDER_RANK,
                                  .max_out = 1 << 20};
                dv_pass_plan_based(order, 10, q, 4, base, &in);
                DvPlan p;
                dv_plan_init(&p);
                assert_int_equal(dv_plan_gather(&in, &p), 0);
                assert_int_equal(p.samples, 2);
                assert_int_equal(p.runs[0].rank, 0);
                assert_int_equal(p.runs[order == DEVAL_ORDER_STRIDED].rank,
                                 order == DEVAL_ORDER_STRIDED);
                dv_plan_deinit(&p);
        }
        /* strided, ranks' rows 2^40 apart (as a hostile rank may say): the gap is skipped */
        q[1].base_rows = 1ll << 40;
        DvPlanInput in = {.world = 2,
                          .ntensors = 1,
                          .in = sh,
                          .valid_rows = valid,
                          .keep_rows = -1,
                          .max_out = 1 << 20};
        q[0].base_rows = 0;
        dv_pass_plan_based(DEVAL_ORDER_STRIDED, 1ll << 45, q, 2, base, &in);
        DvPlan p;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), 0);
        assert_int_equal(p.samples, 4);
        dv_plan_deinit(&p);
}

static void test_quota(void **state) {
        (void)state;
        DvShape sh[2] = {{DEVAL_F64, 2, {1000, 1}}, {DEVAL_F64, 2, {0, 1000000000}}};
        int64_t valid[2] = {-1, -1};
        DvPlanInput in = {.world = 2,
                          .ntensors = 1,
                          .in = sh,
                          .valid_rows = valid,
                          .keep_rows = -1,
                          .max_out = 1 << 30};
        DvPlan p;
        dv_plan_init(&p);
        assert_int_equal(dv_plan_gather(&in, &p), DEVAL_ENOMEM);
        assert_non_null(strstr(p.err, "quota"));
        dv_plan_deinit(&p);
}

static void test_random_pads(void **state) {
        (void)state;
        for (int iter = 0; iter < 2000; iter++) {
                int W = 1 + (int)rnd(8), nd = 1 + (int)rnd(4), dt = DEVAL_BOOL + (int)rnd(10);
                int dim = (int)rnd((uint32_t)nd);
                bool first = rnd(2);
                double padv = rnd(2) ? -7.0 : 0.5;
                Case c = {.world = W, .n = 1};
                for (int r = 0; r < W; r++) {
                        DvShape *s = &c.shape[r];
                        *s = (DvShape){.dtype = dt, .ndim = nd};
                        for (int d = 0; d < nd; d++)
                                s->shape[d] = rnd(4);
                        size_t bytes = (size_t)numel_of(s) * dv_dtype_size(dt);
                        c.data[r] = malloc(bytes + 1);
                        fill_random(c.data[r], bytes);
                }
                DvPlan p;
                dv_plan_init(&p);
                assert_int_equal(dv_plan_pad(W, c.shape, dim, first, padv, 0, 1 << 30, &p), 0);
                uint8_t *out = calloc(1, p.out_end + 1);
                execute(&p, &c, out, true);
                int64_t longest = 0;
                for (int r = 0; r < W; r++)
                        longest = DV_MAX(longest, c.shape[r].shape[dim]);
                uint8_t pad[8];
                dv_dtype_encode(dt, padv, pad);
                for (int r = 0; r < W; r++) {
                        DvShape want = c.shape[r];
                        want.shape[dim] = longest;
                        assert_memory_equal(&p.out[r], &want, sizeof(want));
                        size_t bytes = (size_t)numel_of(&want) * dv_dtype_size(dt);
                        uint8_t *ref = malloc(bytes + 1);
                        ref_pad(ref, c.data[r], c.shape[r].shape, want.shape, nd, first,
                                dv_dtype_size(dt), pad);
                        assert_memory_equal(out + p.out_offset[r], ref, bytes);
                        free(ref);
                }
                free(out);
                dv_plan_deinit(&p);
                case_free(&c);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_random_gathers),
                cmocka_unit_test(test_mismatches),
                cmocka_unit_test(test_rows_per_sample_mismatch),
                cmocka_unit_test(test_segments_merge),
                cmocka_unit_test(test_pass_drops_tail),
                cmocka_unit_test(test_pass_based),
                cmocka_unit_test(test_quota),
                cmocka_unit_test(test_random_pads),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
