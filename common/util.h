/* SPDX-License-Identifier: MIT */
/*
 * util.h - small helpers shared by the daemon, the library and the tools: scope-bound
 * cleanup, monotonic time, futexes on shared memory, and overflow-checked arithmetic.
 */
#pragma once

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define _cleanup_(f)     __attribute__((cleanup(f)))
#define _unused_         __attribute__((unused))
#define DV_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define DV_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define DV_MAX(a, b)     ((a) > (b) ? (a) : (b))
#define DV_ALIGN(x, a)   (((x) + (a)-1) & ~((uint64_t)(a)-1))

/* Take ownership of a pointer out of a _cleanup_ variable. */
#define TAKE_PTR(p)                     \
        ({                              \
                __typeof__(p) _p = (p); \
                (p) = NULL;             \
                _p;                     \
        })
#define TAKE_FD(fd)             \
        ({                      \
                int _fd = (fd); \
                (fd) = -1;      \
                _fd;            \
        })

static inline void freep(void *p) {
        free(*(void **)p);
}

static inline void closep(int *fd) {
        if (*fd >= 0) {
                int saved = errno;
                close(*fd);
                errno = saved;
        }
}

static inline uint64_t dv_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void dv_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ volatile("yield");
#endif
}

/*
 * Sleep while *word == expected, at most timeout_ns (< 0: no limit). The word lives in
 * shared memory, so the futex is not FUTEX_PRIVATE. Returns 0 when woken or the value
 * differed, -ETIMEDOUT, or -EINTR.
 */
static inline int dv_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
        struct timespec ts, *tsp = NULL;
        if (timeout_ns >= 0) {
                ts.tv_sec = timeout_ns / 1000000000;
                ts.tv_nsec = timeout_ns % 1000000000;
                tsp = &ts;
        }
        if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, tsp, NULL, 0) < 0) {
                if (errno == EAGAIN)
                        return 0;
                return -errno;
        }
        return 0;
}

static inline void dv_futex_wake(_Atomic uint32_t *word) {
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Product of n sizes into *ret; false on overflow past INT64_MAX. */
static inline int dv_mul_ok(int64_t a, int64_t b, int64_t *ret) {
        return !__builtin_mul_overflow(a, b, ret);
}
