/* SPDX-License-Identifier: MIT */
/*
 * kernel_body.h - the per-byte work of the copy kernel, shared by the CUDA kernel and the
 * CPU, so that unit tests on a machine without a GPU run the very code the GPU runs.
 *
 * A plan's segments are flattened into DvKernelSeg (plain C, valid C++ for nvcc): each one
 * covers len * count bytes of output. dv_kseg_run() writes any byte range of a segment, so
 * the kernel can split the output among threads however it likes; dv_kseg_find() tells
 * which segment holds an output byte. Fills repeat an element pattern whose phase is the
 * destination offset modulo the element size: outputs start 64-byte aligned.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DV_HD __host__ __device__ __forceinline__
#else
#define DV_HD static inline
#endif

enum {
        DV_KSEG_COPY = 1,
        DV_KSEG_FILL = 2
};

typedef struct {
        uint32_t kind;
        uint32_t src;  /* COPY: index into the table of source base pointers */
        uint32_t elem; /* FILL: element size, 1..8; the pattern is pat[0..elem) */
        uint32_t reserved;
        uint64_t src_off; /* COPY: offset from the source base */
        uint64_t dst;     /* offset from the output base */
        uint64_t len;     /* bytes per piece */
        uint64_t count;   /* pieces */
        uint64_t src_stride;
        uint64_t dst_stride;
        uint8_t pat[8];
} DvKernelSeg;

DV_HD uint64_t dv_kseg_bytes(const DvKernelSeg *s) {
        return s->len * s->count;
}

/* Copy n bytes; 16 bytes at a time where both sides allow it. */
DV_HD void dv_kcopy(uint8_t *dst, const uint8_t *src, uint64_t n) {
#if defined(__CUDA_ARCH__)
        if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
                for (; n >= 16; n -= 16, dst += 16, src += 16)
                        *(uint4 *)dst = *(const uint4 *)src;
        }
        for (; n; n--)
                *dst++ = *src++;
#else
        memcpy(dst, src, n);
#endif
}

/**
 * dv_kseg_run() - write bytes [i0, i0 + n) of segment s's flattened output.
 * @out: the output base; @srcs: source base pointers, indexed by s->src.
 */
DV_HD void dv_kseg_run(const DvKernelSeg *s, uint64_t i0, uint64_t n, uint8_t *out,
                       const uint8_t *const *srcs) {
        while (n > 0) {
                uint64_t c = i0 / s->len, b = i0 % s->len;
                uint64_t run = s->len - b < n ? s->len - b : n;
                uint64_t dst = s->dst + c * s->dst_stride + b;
                if (s->kind == DV_KSEG_COPY) {
                        dv_kcopy(out + dst, srcs[s->src] + s->src_off + c * s->src_stride + b, run);
                } else {
                        for (uint64_t j = 0; j < run; j++)
                                out[dst + j] = s->pat[(dst + j) % s->elem];
                }
                i0 += run;
                n -= run;
        }
}

/* The segment holding flattened byte i: starts[k] is the first byte of segment k and
 * starts[nsegs] the total; binary search, nsegs >= 1, i < starts[nsegs]. */
DV_HD uint32_t dv_kseg_find(const uint64_t *starts, uint32_t nsegs, uint64_t i) {
        uint32_t lo = 0, hi = nsegs - 1;
        while (lo < hi) {
                uint32_t mid = lo + (hi - lo + 1) / 2;
                if (starts[mid] <= i)
                        lo = mid;
                else
                        hi = mid - 1;
        }
        return lo;
}

/* Bytes [i, i + n) of the whole flattened plan, across segment boundaries. */
DV_HD void dv_kplan_run(const DvKernelSeg *segs, const uint64_t *starts, uint32_t nsegs, uint64_t i,
                        uint64_t n, uint8_t *out, const uint8_t *const *srcs) {
        if (nsegs == 0 || n == 0)
                return;
        uint32_t k = dv_kseg_find(starts, nsegs, i);
        while (n > 0 && k < nsegs) {
                uint64_t end = starts[k + 1];
                uint64_t m = end - i < n ? end - i : n;
                dv_kseg_run(&segs[k], i - starts[k], m, out, srcs);
                i += m;
                n -= m;
                k++;
        }
}
