/* SPDX-License-Identifier: MIT */
/*
 * stage.c - a collective's request and its inputs, and views of its result (stage.h): the
 * arguments checked, the request started in this rank's slot, the inputs copied where the
 * step reads them (inline bytes, the input arena, the device input arena) or left in this
 * rank's memory for it to copy into the result itself (DV_REQ_DIRECT), and each result
 * descriptor checked before it becomes a view.
 */
#define _GNU_SOURCE
#include "stage.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "arena.h"
#include "dtype.h"
#include "fast.h"
#include "fault.h"
#include "gpu.h"
#include "handle.h"
#include "run.h"
#include "util.h"

int dv_check_tensor(deval_group *g, const char *fn, int i, const deval_tensor *t, bool need_data,
                    uint64_t *ret_bytes) {
        int64_t numel = 1, bytes;

        if (!dv_dtype_valid(t->dtype))
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d has unknown dtype %d", fn, i,
                                  t->dtype);
        if (t->ndim < 0 || t->ndim > DEVAL_MAX_DIMS)
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d has ndim %d, not 0..%d", fn, i,
                                  t->ndim, DEVAL_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++) {
                if (t->shape[d] < 0)
                        return dv_set_err(g, DEVAL_EINVAL,
                                          "%s: tensor %d has a negative size %" PRId64 " in dim %d",
                                          fn, i, t->shape[d], d);
                if (!dv_mul_ok(numel, t->shape[d], &numel))
                        return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d's size overflows", fn, i);
        }
        if (!dv_mul_ok(numel, (int64_t)dv_dtype_size(t->dtype), &bytes) || bytes > INT64_MAX / 2)
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d's size overflows", fn, i);
        if (t->device < -1)
                return dv_set_err(g, DEVAL_EINVAL,
                                  "%s: tensor %d has device %d, not -1 (host) "
                                  "or a CUDA device ordinal",
                                  fn, i, t->device);
        if (t->device >= 0) {
                /* staged through host memory: the driver loads on first use */
                const DvGpuApi *gpu = dv_gpu();
                int r, count = 0;
                if ((r = gpu->init()) < 0 || (r = gpu->device_count(&count)) < 0)
                        return dv_set_err(g, r, "%s: tensor %d: %s", fn, i, dv_gpu_error());
                if (t->device >= count)
                        return dv_set_err(g, DEVAL_EINVAL,
                                          "%s: tensor %d is on CUDA device %d, but %d are visible",
                                          fn, i, t->device, count);
        }
        if (need_data && bytes > 0 && !t->data)
                return dv_set_err(g, DEVAL_EINVAL, "%s: tensor %d's data is NULL", fn, i);
        *ret_bytes = (uint64_t)bytes;
        return 0;
}

/*
 * Start this rank's request in its shared slot. The slot is the joining process's: checked
 * before a byte of it is written, since a forked child maps the same slot, and its parent's
 * request may be waiting there for the other ranks.
 */
int dv_req_start(deval_group *g, uint32_t op, DvRequest **ret) {
        int r = dv_coll_owner(g);
        if (r < 0)
                return r;
        DvRequest *q = g->req;
        memset(q, 0, offsetof(DvRequest, t));
        q->seq = g->seq + 1;
        q->op = op;
        q->batch = g->batch_no;
        q->valid_rows = -1;
        q->keep_rows = -1;
        q->root = -1;
        *ret = q;
        return 0;
}

/*
 * Which call of the batch a *_METRICS request is (its site, sites.h); 0 without batches. A
 * pass with keys takes any number of calls per batch (each its own stream in ident.c; devald
 * counts none of them); a pass that counts samples by position keeps DV_PASS_SITES counters
 * per batch in the group's control segment. A call past them, or at a site that some batch
 * before did not call (whose count no longer follows the loop's samples), is gathered
 * uncounted: it says where its batch starts in the pass (DV_SITE_BASED), as a site that every
 * batch before called counted it (dv_sites_base()), and the step cuts its rows as that site's
 * own; where none did, it takes the rank's real rows from the caller (valid_rows), and is
 * refused without them, by every rank alike since every rank makes the same calls.
 */
int dv_req_site(deval_group *g, const char *fn, DvRequest *q) {
        int kind = q->op == DV_OP_OBJECTS_METRICS;
        if (q->op != DV_OP_GATHER_METRICS && !kind)
                return 0;
        if (!g->batch)
                return 0;
        uint32_t site;
        bool whole;
        if (dv_sites_take(&g->sites, kind, &site, &whole) < 0)
                return dv_set_err(g, DEVAL_ENOMEM, "%s: out of memory", fn);
        q->site = site;
        if (g->ident)
                return 0;
        if (site < DV_PASS_SITES && whole) {
                if (q->root < 0 && q->keep_rows < 0) /* (a result with every sample kept) */
                        dv_sites_counts(&g->sites, q->valid_rows);
                return 0;
        }
        q->order = g->pass_order; /* uncounted: the pass's order, as its counted calls */
        if (!whole)
                q->flags |= DV_SITE_UNCOUNTED;
        if (dv_sites_base(&g->sites, DV_PASS_SITES, &q->base_total, &q->base_rows)) {
                q->flags |= DV_SITE_BASED;
                return 0;
        }
        if (q->valid_rows >= 0)
                return 0;
        return dv_set_err(g, DEVAL_EINVAL,
                          "%s: call %u of batch %u is one that no counter of this eval pass "
                          "counts (the pass counts samples by position, its batches carry no "
                          "dataset indices, and this call is %s), and no call of the batch "
                          "was made in every batch before it, which would say where the "
                          "batch's samples start: such a call must say which of the rank's "
                          "rows are real (valid_rows). Make one call in every batch, or "
                          "iterate a map-style dataset through a DataLoader",
                          fn, site + 1, g->sites.batch,
                          whole ? "past the ones it counts" : "at a site a batch before skipped");
}

void dv_desc_set(DvTensorDesc *d, const deval_tensor *t, uint64_t offset, uint64_t bytes) {
        memset(d, 0, sizeof(*d));
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        for (int k = 0; k < t->ndim; k++)
                d->shape[k] = t->shape[k];
        d->offset = offset;
        d->nbytes = bytes;
}

/* A result descriptor as a view into the arena at base (size bytes), after checking it fits. */
static int view_in(deval_group *g, const char *fn, const DvTensorDesc *d, const uint8_t *base,
                   uint64_t size, deval_tensor *out) {
        int64_t numel = 1;
        if (!dv_dtype_valid(d->dtype) || d->ndim < 0 || d->ndim > DEVAL_MAX_DIMS ||
            d->offset > size || d->nbytes > size - d->offset)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        memset(out, 0, sizeof(*out));
        out->dtype = d->dtype;
        out->ndim = d->ndim;
        for (int k = 0; k < d->ndim; k++) {
                out->shape[k] = d->shape[k];
                if (d->shape[k] < 0 || !dv_mul_ok(numel, d->shape[k], &numel))
                        return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result",
                                          fn);
        }
        if ((uint64_t)numel * dv_dtype_size(d->dtype) != d->nbytes)
                return dv_set_err(g, DEVAL_EPROTO, "%s: devald sent a malformed result", fn);
        out->device = -1;
        out->data = d->nbytes ? (void *)(base + d->offset) : NULL;
        return 0;
}

int dv_view_of(deval_group *g, const char *fn, const DvTensorDesc *d, deval_tensor *out) {
        return view_in(g, fn, d, g->view, g->view_size, out);
}

/* The caller's options, through their size (dv_opts_copy()), into *own. */
int dv_take_opts(deval_group *g, const char *fn, const deval_gather_opts *opts,
                 deval_gather_opts *own) {
        char why[256];
        if (dv_opts_copy(own, sizeof(*own), opts, opts->size, "deval_gather_opts", why,
                         sizeof(why)) < 0)
                return dv_set_err(g, DEVAL_EINVAL, "%s: %s", fn, why);
        return 0;
}

int dv_check_opts(deval_group *g, const char *fn, const deval_gather_opts *o) {
        if (o->order != DEVAL_ORDER_RANK && o->order != DEVAL_ORDER_STRIDED)
                return dv_set_err(g, DEVAL_EINVAL, "%s: unknown order %d", fn, o->order);
        if (o->root < -1 || o->root >= g->world)
                return dv_set_err(g, DEVAL_EINVAL, "%s: root %d is out of range -1..%d", fn,
                                  o->root, g->world - 1);
        return 0;
}

void dv_req_set_opts(DvRequest *q, const deval_gather_opts *o) {
        q->pad_value = o->pad_value;
        q->names = o->names;
        q->pad_first = o->pad_first != 0;
        q->order = o->order;
        q->valid_rows = o->valid_rows < 0 ? -1 : o->valid_rows;
        q->keep_rows = o->keep_rows < 0 ? -1 : o->keep_rows;
        q->root = o->root;
}

/* A result into the caller's tensor, wherever it lives. */
int dv_write_back(deval_group *g, const char *fn, deval_tensor *t, const void *src,
                  uint64_t bytes) {
        if (t->device < 0) {
                memcpy(t->data, src, bytes);
                return 0;
        }
        int r = dv_gpu()->copy_to_device(t->device, (DvDevPtr)(uintptr_t)t->data, src, bytes);
        return r < 0 ? dv_set_err(g, r, "%s: %s", fn, dv_gpu_error()) : 0;
}

/* Where tensor data already lies in the buffer deval_input_buffer() gave: its offset. */
static bool in_buffer(const deval_group *g, const void *data, uint64_t bytes, uint64_t *ret) {
        const uint8_t *p = data;
        if (!g->in_keep || !p || p < g->in || p > g->in + g->in_keep ||
            bytes > (uint64_t)(g->in + g->in_keep - p) || (uint64_t)(p - g->in) % 8 != 0)
                return false;
        *ret = (uint64_t)(p - g->in);
        return true;
}

/*
 * Describe n tensors in q, copying each into the input arena (64-byte aligned, after the
 * deval_input_buffer() region) unless it already lies in that region.
 */
/* One tensor into the device input arena of a device group, from wherever it lives. */
static int put_on_device(deval_group *g, uint64_t off, const deval_tensor *t, uint64_t bytes) {
        const DvGpuApi *gpu = dv_gpu();
        DvDevPtr dst = g->din + off, src = (DvDevPtr)(uintptr_t)t->data;
        if (t->device == g->device)
                return gpu->copy_device(g->device, dst, src, bytes);
        if (t->device < 0)
                return gpu->copy_to_device(g->device, dst, t->data, bytes);
        void *bounce = malloc(bytes); /* another GPU of this process: through host memory */
        if (!bounce) /* said as GPU failures are, so that the caller names this one */
                return dv_gpu_fail(DEVAL_ENOMEM,
                                   "no host memory for a %llu-byte copy from GPU %d to GPU %d",
                                   (unsigned long long)bytes, t->device, g->device);
        int r = gpu->copy_to_host(t->device, bounce, src, bytes);
        if (r == 0)
                r = gpu->copy_to_device(g->device, dst, bounce, bytes);
        free(bounce);
        return r;
}

int dv_put_tensors_to(deval_group *g, const char *fn, int n, const deval_tensor *in,
                      const bool *with_data, DvRequest *q, bool dev) {
        uint64_t bytes[DEVAL_MAX_TENSORS], off[DEVAL_MAX_TENSORS], end = dev ? 0 : g->in_keep;
        bool placed[DEVAL_MAX_TENSORS];
        int r;

        for (int i = 0; i < n; i++) {
                bool wd = with_data ? with_data[i] : true;
                if ((r = dv_check_tensor(g, fn, i, &in[i], wd, &bytes[i])) < 0)
                        return r;
                if (!wd)
                        bytes[i] = 0;
                placed[i] = !dev && bytes[i] && in[i].device < 0 &&
                            in_buffer(g, in[i].data, bytes[i], &off[i]);
                if (placed[i])
                        continue;
                off[i] = DV_ALIGN(end, DV_ARENA_ALIGN);
                if (bytes[i] > UINT64_MAX / 4 - off[i])
                        return dv_set_err(g, DEVAL_EINVAL, "%s: the inputs are too large", fn);
                end = off[i] + bytes[i];
        }
        /* the arguments are fine: now the group's state decides */
        if ((r = dv_coll_begin(g)) < 0)
                return r;
        /* small host inputs go to this rank's inline bytes, where the last rank to arrive
         * reads them to run the step itself (fast.c), or devald does; a large gather's stay
         * where they are, for this rank to copy into the result (DV_REQ_DIRECT) */
        bool inl = !dev, direct;
        uint64_t iend = 0, ioff[DEVAL_MAX_TENSORS];
        for (int i = 0; inl && i < n; i++) {
                inl = !placed[i] && !(bytes[i] && in[i].device >= 0);
                ioff[i] = DV_ALIGN(iend, DV_ARENA_ALIGN);
                iend = ioff[i] + bytes[i];
        }
        direct = inl && g->rank_steps && g->world > 1 && !with_data &&
                 (q->op == DV_OP_GATHER || q->op == DV_OP_GATHER_METRICS) &&
                 (iend >= g->direct.min || !dv_fast_inline_ok(g, iend));
        inl = inl && !direct && dv_fast_inline_ok(g, iend);
        g->own_n = n;
        if (direct) {
                for (int i = 0; i < n; i++) {
                        dv_desc_set(&q->t[i], &in[i], 0, bytes[i]);
                        g->own_src[i] = in[i].data;
                        g->own_bytes[i] = bytes[i];
                }
                q->ntensors = (uint32_t)n;
                q->flags |= DV_REQ_DIRECT;
                return 0;
        }
        if (inl) {
                memcpy(off, ioff, sizeof(off[0]) * (size_t)n);
                end = iend;
        } else if ((r = dev ? dv_reserve_dev_input(g, end) : dv_reserve(g, end)) < 0) {
                return dv_stage_failed(g, fn, q, r, end);
        }
        uint8_t *base = inl ? g->inl : g->in;
        DV_FAULT("before_write", g->seq + 1);
        for (int i = 0; i < n; i++) {
                if (bytes[i] && dev) {
                        if ((r = put_on_device(g, off[i], &in[i], bytes[i])) < 0) {
                                dv_set_err(g, r, "%s: tensor %d: %s", fn, i, dv_gpu_error());
                                return dv_stage_failed(g, fn, q, r == DEVAL_ENOMEM ? r : DEVAL_ESYS,
                                                       end);
                        }
                } else if (bytes[i] && !placed[i] && in[i].device >= 0) {
                        r = dv_gpu()->copy_to_host(in[i].device, g->in + off[i],
                                                   (DvDevPtr)(uintptr_t)in[i].data, bytes[i]);
                        if (r < 0) {
                                dv_set_err(g, r, "%s: tensor %d: %s", fn, i, dv_gpu_error());
                                return dv_stage_failed(g, fn, q, r, end);
                        }
                } else if (bytes[i] && !placed[i]) {
                        memcpy(base + off[i], in[i].data, bytes[i]);
                }
                dv_desc_set(&q->t[i], &in[i], off[i], bytes[i]);
                g->own_src[i] = dev ? NULL : base + off[i];
                g->own_bytes[i] = bytes[i];
                if (with_data && !with_data[i]) {
                        int64_t numel = 1;
                        for (int k = 0; k < in[i].ndim; k++)
                                numel *= in[i].shape[k];
                        q->t[i].nbytes = (uint64_t)numel * dv_dtype_size(in[i].dtype);
                        q->t[i].offset = 0;
                }
        }
        q->ntensors = (uint32_t)n;
        if (inl)
                q->flags |= DV_REQ_INLINE;
        return 0;
}

int dv_put_tensors(deval_group *g, const char *fn, int n, const deval_tensor *in,
                   const bool *with_data, DvRequest *q) {
        return dv_put_tensors_to(g, fn, n, in, with_data, q, false);
}

/* A result in a device group's output arena: a view on this rank's GPU. */
int dv_view_of_dev(deval_group *g, const char *fn, const DvTensorDesc *d, deval_tensor *out) {
        int r;
        if ((r = dv_refresh_dev_output(g)) < 0)
                return r;
        r = view_in(g, fn, d, (const uint8_t *)(uintptr_t)g->dout, g->dout_size, out);
        if (r == 0)
                out->device = g->device;
        return r;
}
