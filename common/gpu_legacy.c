/* SPDX-License-Identifier: MIT */
/*
 * gpu_legacy.c - CUDA IPC's 64-byte handles wrapped in sealed memfds, so that they travel
 * like the descriptors of exportable memory (gpu_impl.h), and the record of what each
 * pointer that came through them must be let go with.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deval.h"

#include "cuda_abi.h"
#include "gpu_impl.h"
#include "tunables.h"
#include "util.h"
#include "wire.h"

/* The pointers that came through legacy IPC, so unmap() knows how to let go of each. */
static struct {
        pthread_mutex_t lock;
        struct {
                DvDevPtr p;
                int kind;
                int fd; /* the fake's backing memfd, for LEGACY_OWN */
        } m[1024];
} legacy = {.lock = PTHREAD_MUTEX_INITIALIZER};

/**
 * dv_legacy_forced() - does the environment ask for CUDA's legacy IPC handles
 * ($DEVAL_CUDA_LEGACY_IPC, tunables.h; the fake's own switch when env names it)?
 * Return: 1 or 0; DEVAL_EINVAL, with the GPU table's error set, for a value not a switch.
 */
int dv_legacy_forced(const char *env) {
        if (strcmp(env, "DEVAL_CUDA_LEGACY_IPC") == 0) {
                bool set;
                uint64_t v;
                char why[160];
                if (dv_tunable_read(DV_TUN_CUDA_LEGACY_IPC, &set, &v, why, sizeof(why)) < 0)
                        return gpu_fail(DEVAL_EINVAL, "%s", why);
                return set && v;
        }
        const char *v = secure_getenv(env); /* the tests' fake's */
        return v && *v && strcmp(v, "0") != 0;
}

int dv_legacy_note(DvDevPtr p, int kind, int fd) {
        int r = gpu_fail(DEVAL_ENOMEM, "too many legacy CUDA IPC mappings");
        pthread_mutex_lock(&legacy.lock);
        for (size_t i = 0; i < DV_ARRAY_SIZE(legacy.m); i++)
                if (!legacy.m[i].kind) {
                        legacy.m[i].p = p;
                        legacy.m[i].kind = kind;
                        legacy.m[i].fd = fd;
                        r = 0;
                        break;
                }
        pthread_mutex_unlock(&legacy.lock);
        return r;
}

/* Forget p; return how it was made (LEGACY_NONE: not through legacy IPC), and its fd. */
int dv_legacy_take(DvDevPtr p, int *ret_fd) {
        int kind = LEGACY_NONE;
        pthread_mutex_lock(&legacy.lock);
        for (size_t i = 0; i < DV_ARRAY_SIZE(legacy.m); i++)
                if (legacy.m[i].kind && legacy.m[i].p == p) {
                        kind = legacy.m[i].kind;
                        *ret_fd = legacy.m[i].fd;
                        legacy.m[i].kind = LEGACY_NONE;
                        break;
                }
        pthread_mutex_unlock(&legacy.lock);
        return kind;
}

/* A sealed memfd holding handle; 0 with *ret_fd, or DEVAL_ENOMEM. */
int dv_legacy_wrap(const void *handle, uint64_t size, int *ret_fd) {
        LegacyBlob b = {.size = size};
        memcpy(b.magic, LEGACY_MAGIC, sizeof(b.magic));
        memcpy(b.handle, handle, sizeof(b.handle));
        int fd = memfd_create("deval-cuda-ipc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || pwrite(fd, &b, sizeof(b), 0) != (ssize_t)sizeof(b) ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                if (fd >= 0)
                        close(fd);
                return gpu_fail(DEVAL_ENOMEM, "cannot wrap a CUDA IPC handle: %s", strerror(errno));
        }
        *ret_fd = fd;
        return 0;
}

/* 1 with *ret filled when fd is a wrapped handle (sealed, the right size and magic), else 0. */
int dv_legacy_unwrap(int fd, LegacyBlob *ret) {
        struct stat st;
        int seals = fcntl(fd, F_GET_SEALS);
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size != (off_t)sizeof(*ret) ||
            seals < 0 || !(seals & F_SEAL_WRITE))
                return 0;
        if (pread(fd, ret, sizeof(*ret), 0) != (ssize_t)sizeof(*ret) ||
            memcmp(ret->magic, LEGACY_MAGIC, sizeof(ret->magic)) != 0)
                return 0;
        return 1;
}
