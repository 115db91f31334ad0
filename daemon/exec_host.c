/* SPDX-License-Identifier: MIT */
/*
 * exec_host.c - the host backend's executor: run a plan's copy and fill segments with
 * memcpy and fills. A plan of a few MiB or more is cut into pieces of about a quarter MiB
 * and spread over a small pool of threads per group (--threads), each taking the next piece
 * from an atomic counter. Outputs too large for the caches are written with non-temporal
 * stores, which skip reading every destination line before overwriting it.
 */
#define _GNU_SOURCE
#include "exec_host.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "daemon.h"
#include "dtype.h"
#include "util.h"

#define PARALLEL_MIN (2u << 20)
#define PIECE_BYTES  (256u << 10)

typedef struct {
        uint32_t seg;
        uint32_t pad;    /* a fill segment run piece by piece with seg, or UINT32_MAX */
        uint64_t c0, c1; /* pieces of the segment */
        uint64_t b0, b1; /* bytes within each piece */
} Item;

typedef struct {
        const ExecJob *job;
        const Item *items;
        size_t nitems;
        _Atomic size_t next;
} Work;

typedef struct {
        int n; /* helper threads */
        pthread_t *threads;
        pthread_mutex_t mu;
        pthread_cond_t go, done;
        uint64_t gen;
        int busy;
        bool quit;
        Work *work;
} Pool;

/*
 * A row padded at its end is a copy segment followed by a fill segment of the same pieces
 * (the plan opens them together). Run them piece by piece, so each output cache line is
 * written once while it is hot, instead of a second pass over the whole output for the pad.
 */
static bool pairs_with(const DvPlan *plan, size_t i) {
        if (i + 1 >= plan->nsegs)
                return false;
        const DvSeg *s = &plan->segs[i], *f = &plan->segs[i + 1];
        return s->kind == DV_SEG_COPY && f->kind == DV_SEG_FILL && s->count > 1 &&
               f->count == s->count && f->dst_stride == s->dst_stride && f->dst > s->dst &&
               f->dst - s->dst < s->dst_stride && f->len <= PIECE_BYTES && s->len <= PIECE_BYTES;
}

static void item_run(const ExecJob *job, const Item *it) {
        const DvSeg *s = &job->plan->segs[it->seg];
        uint64_t len = it->b1 - it->b0;

        if (it->pad != UINT32_MAX) {
                const DvSeg *f = &job->plan->segs[it->pad];
                const uint8_t *src = job->src(job->ctx, s->rank, s->tensor) + s->src;
                size_t es = dv_dtype_size(job->plan->out[f->tensor].dtype);
                const uint8_t *pat = job->plan->fill[f->tensor];
                if (job->stream && f->dst == s->dst + s->len && s->len + f->len == s->dst_stride &&
                    s->dst_stride <= DV_ROW_MAX) {
                        /* the row is exactly copy + pad: assemble it, then stream it whole */
                        dv_stream_padded_rows(job->out + s->dst + it->c0 * s->dst_stride,
                                              s->dst_stride, src + it->c0 * s->src_stride,
                                              s->src_stride, s->len, it->c1 - it->c0, pat, es);
                        return;
                }
                for (uint64_t c = it->c0; c < it->c1; c++) {
                        memcpy(job->out + s->dst + c * s->dst_stride, src + c * s->src_stride,
                               s->len);
                        dv_fill_pattern(job->out + f->dst + c * f->dst_stride, f->len, pat, es);
                }
                return;
        }
        if (s->kind == DV_SEG_COPY) {
                const uint8_t *src = job->src(job->ctx, s->rank, s->tensor) + s->src;
                for (uint64_t c = it->c0; c < it->c1; c++)
                        dv_copy_out(job->stream, job->out + s->dst + c * s->dst_stride + it->b0,
                                    src + c * s->src_stride + it->b0, len);
        } else {
                size_t es = dv_dtype_size(job->plan->out[s->tensor].dtype);
                const uint8_t *pat = job->plan->fill[s->tensor];
                for (uint64_t c = it->c0; c < it->c1; c++) {
                        /* pieces start on element boundaries, so the pattern lines up */
                        dv_fill_pattern(job->out + s->dst + c * s->dst_stride + it->b0, len, pat,
                                        es);
                }
        }
}

static void work_run(Work *w) {
        for (;;) {
                size_t i = atomic_fetch_add_explicit(&w->next, 1, memory_order_relaxed);
                if (i >= w->nitems) {
                        dv_stream_fence(w->job->stream);
                        return;
                }
                item_run(w->job, &w->items[i]);
        }
}

static void *pool_thread(void *arg) {
        Pool *p = arg;
        uint64_t seen = 0;

        pthread_mutex_lock(&p->mu);
        for (;;) {
                while (!p->quit && p->gen == seen)
                        pthread_cond_wait(&p->go, &p->mu);
                if (p->quit)
                        break;
                seen = p->gen;
                Work *w = p->work;
                pthread_mutex_unlock(&p->mu);
                work_run(w);
                pthread_mutex_lock(&p->mu);
                if (--p->busy == 0)
                        pthread_cond_signal(&p->done);
        }
        pthread_mutex_unlock(&p->mu);
        return NULL;
}

static Pool *pool_new(int n) {
        Pool *p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        p->threads = calloc((size_t)n, sizeof(*p->threads));
        if (!p->threads) {
                free(p);
                return NULL;
        }
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->go, NULL);
        pthread_cond_init(&p->done, NULL);
        for (int i = 0; i < n; i++) {
                if (pthread_create(&p->threads[i], NULL, pool_thread, p) != 0)
                        break;
                p->n++;
        }
        return p;
}

void exec_pool_free(void *arg) {
        Pool *p = arg;
        if (!p)
                return;
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n; i++)
                pthread_join(p->threads[i], NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->go);
        pthread_cond_destroy(&p->done);
        free(p->threads);
        free(p);
}

/* Cut every segment into items of about PIECE_BYTES; NULL when out of memory. */
static Item *items_make(const DvPlan *plan, size_t *ret_n) {
        size_t n = 0, cap = plan->nsegs + 16;
        Item *items = malloc(cap * sizeof(*items));
        if (!items)
                return NULL;
        for (size_t i = 0; i < plan->nsegs; i++) {
                const DvSeg *s = &plan->segs[i];
                uint32_t seg = (uint32_t)i, pad = UINT32_MAX;
                if (pairs_with(plan, i))
                        pad = (uint32_t)++i;
                size_t es = s->kind == DV_SEG_FILL ? dv_dtype_size(plan->out[s->tensor].dtype) : 1;
                uint64_t piece = pad == UINT32_MAX ? s->len : s->dst_stride;
                uint64_t per =
                        s->len >= PIECE_BYTES || piece >= PIECE_BYTES ? 1 : PIECE_BYTES / piece;
                uint64_t step = s->len >= PIECE_BYTES ? PIECE_BYTES / es * es : s->len;
                for (uint64_t c = 0; c < s->count; c += per) {
                        for (uint64_t b = 0; b < s->len; b += step) {
                                if (n == cap) {
                                        cap *= 2;
                                        Item *t = realloc(items, cap * sizeof(*items));
                                        if (!t) {
                                                free(items);
                                                return NULL;
                                        }
                                        items = t;
                                }
                                items[n++] = (Item){.seg = seg,
                                                    .pad = pad,
                                                    .c0 = c,
                                                    .c1 = DV_MIN(s->count, c + per),
                                                    .b0 = b,
                                                    .b1 = DV_MIN(s->len, b + step)};
                        }
                }
        }
        *ret_n = n;
        return items;
}

/**
 * exec_host() - execute job->plan into job->out, on the group's worker thread.
 * Large plans use the group's copy threads, created on first need; small plans, or any
 * failure to get threads or memory, run on the calling thread alone.
 */
void exec_host(Group *g, const ExecJob *arg) {
        const DvPlan *plan = arg->plan;
        uint64_t total = 0;

        for (size_t i = 0; i < plan->nsegs; i++)
                total += plan->segs[i].len * plan->segs[i].count;
        ExecJob copy = *arg, *job = &copy;
        job->stream = total >= DV_STREAM_MIN;

        if (total >= PARALLEL_MIN && g->d->threads > 1 && !g->work.pool)
                g->work.pool = pool_new(g->d->threads - 1);
        Pool *p = g->work.pool;
        size_t nitems = 0;
        Item *items = NULL;
        if (total >= PARALLEL_MIN && p && p->n > 0)
                items = items_make(plan, &nitems);
        if (!items) {
                for (size_t i = 0; i < plan->nsegs; i++) {
                        const DvSeg *s = &plan->segs[i];
                        Item it = {.seg = (uint32_t)i,
                                   .pad = UINT32_MAX,
                                   .c1 = s->count,
                                   .b1 = s->len};
                        if (pairs_with(plan, i))
                                it.pad = (uint32_t)++i;
                        item_run(job, &it);
                }
                dv_stream_fence(job->stream);
                return;
        }
        Work w = {.job = job, .items = items, .nitems = nitems};
        pthread_mutex_lock(&p->mu);
        p->work = &w;
        p->busy = p->n;
        p->gen++;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
        work_run(&w);
        pthread_mutex_lock(&p->mu);
        while (p->busy > 0)
                pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
        free(items);
}
