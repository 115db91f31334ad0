/* SPDX-License-Identifier: MIT */
/*
 * copy.h - writing large outputs on the CPU: copies and pad fills, optionally with
 * non-temporal stores, which skip reading every destination line before overwriting it
 * (a third crossing of memory for each byte of an output too large for the caches). Used by
 * devald's host executor and by the ranks that write their own rows (libclient/fast.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Outputs from this size on will not stay in the caches anyway: stream them. */
#define DV_STREAM_MIN (8u << 20)
/* Rows of copy + pad up to this size are assembled in a buffer, then streamed whole. */
#define DV_ROW_MAX 4096

/* memcpy, or with stream, 16-byte non-temporal stores for the aligned middle. */
static inline void dv_copy_out(bool stream, uint8_t *dst, const uint8_t *src, uint64_t len) {
#if defined(__SSE2__)
        if (stream && len >= 256) {
                uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
                memcpy(dst, src, head);
                dst += head;
                src += head;
                len -= head;
                for (; len >= 64; len -= 64, dst += 64, src += 64) {
                        __m128i a = _mm_loadu_si128((const __m128i *)src);
                        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
                        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
                        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
                        _mm_stream_si128((__m128i *)dst, a);
                        _mm_stream_si128((__m128i *)(dst + 16), b);
                        _mm_stream_si128((__m128i *)(dst + 32), c);
                        _mm_stream_si128((__m128i *)(dst + 48), d);
                }
                for (; len >= 16; len -= 16, dst += 16, src += 16)
                        _mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
        }
#else
        (void)stream;
#endif
        memcpy(dst, src, len);
}

/* Non-temporal stores are weakly ordered: fence them before the output is published. */
static inline void dv_stream_fence(bool stream) {
#if defined(__SSE2__)
        if (stream)
                _mm_sfence();
#else
        (void)stream;
#endif
}

/* len bytes of the es-byte element pat, repeated from dst (on an element boundary). */
static inline void dv_fill_pattern(uint8_t *dst, uint64_t len, const uint8_t *pat, size_t es) {
        if (len == es) {
                memcpy(dst, pat, es);
                return;
        }
        bool same = true;
        for (size_t i = 1; i < es; i++)
                same &= pat[i] == pat[0];
        if (same) {
                memset(dst, pat[0], len);
                return;
        }
        uint64_t done = len < es ? len : es;
        memcpy(dst, pat, done);
        while (done < len) { /* double the filled prefix */
                uint64_t n = done < len - done ? done : len - done;
                memcpy(dst + done, dst, n);
                done += n;
        }
}

/*
 * count rows of stride bytes, streamed whole: row c is len bytes from src + c * src_stride,
 * then the es-byte element pat up to stride (stride <= DV_ROW_MAX). Each is assembled in a
 * buffer first, so every output line is written once, by one non-temporal store.
 */
static inline void dv_stream_padded_rows(uint8_t *dst, uint64_t stride, const uint8_t *src,
                                         uint64_t src_stride, uint64_t len, uint64_t count,
                                         const uint8_t *pat, size_t es) {
        _Alignas(64) uint8_t row[DV_ROW_MAX];
        dv_fill_pattern(row + len, stride - len, pat, es);
        for (uint64_t c = 0; c < count; c++) {
                memcpy(row, src + c * src_stride, len);
                dv_copy_out(true, dst + c * stride, row, stride);
        }
}
