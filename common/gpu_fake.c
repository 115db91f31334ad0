/* SPDX-License-Identifier: MIT */
/*
 * gpu_fake.c - the GPU table's fake, for tests on machines without a GPU: "device memory"
 * in host memory (memfds, so that it can be shared like exported device memory), the copy
 * kernel's body run on the CPU, and the failures a real GPU can have on demand:
 * $DEVAL_GPU_FAKE (how many devices), $DEVAL_GPU_FAKE_NOP2P, $DEVAL_GPU_FAKE_LEGACY_IPC and
 * $DEVAL_GPU_FAKE_STICKY. Built only with -Dfake_gpu (auto: every build but release), so
 * that no installed devald or libdeval reads these variables.
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
#include "util.h"
#include "wire.h"

static int fake_devices(void) {
        const char *env = secure_getenv("DEVAL_GPU_FAKE");
        int n = env ? atoi(env) : 0;
        return n > 0 && n <= DV_MAX_GPUS ? n : 2;
}

static int fake_check(int device) {
        if (device < 0 || device >= fake_devices())
                return gpu_fail(DEVAL_EINVAL, "fake device %d does not exist (%d visible)", device,
                                fake_devices());
        return 0;
}

static int fake_init(void) {
        return 0;
}

static int fake_device_count(int *ret) {
        *ret = fake_devices();
        return 0;
}

static int fake_device_uuid(int device, uint8_t uuid[16]) {
        int r = fake_check(device);
        if (r)
                return r;
        for (int i = 0; i < 16; i++)
                uuid[i] = (uint8_t)(0xf0 ^ (device * 16 + i));
        return 0;
}

static int fake_device_busid(int device, char *buf, int len) {
        int r = fake_check(device);
        if (r)
                return r;
        snprintf(buf, (size_t)len, "fake:%02x", device); /* matches no real PCI device */
        return 0;
}

static int fake_alloc(int device, size_t bytes, DvDevPtr *ret) {
        int r = fake_check(device);
        if (r)
                return r;
        void *p = malloc(bytes ? bytes : 1);
        if (!p)
                return gpu_fail(DEVAL_ENOMEM, "fake device %d is out of memory", device);
        *ret = (DvDevPtr)(uintptr_t)p;
        return 0;
}

static int fake_free(int device, DvDevPtr p) {
        int r = fake_check(device);
        if (r)
                return r;
        free((void *)(uintptr_t)p);
        return 0;
}

static int fake_copy_to_host(int device, void *dst, DvDevPtr src, size_t bytes) {
        int r = fake_check(device);
        if (r)
                return r;
        memcpy(dst, (const void *)(uintptr_t)src, bytes);
        return 0;
}

static int fake_copy_to_device(int device, DvDevPtr dst, const void *src, size_t bytes) {
        int r = fake_check(device);
        if (r)
                return r;
        memcpy((void *)(uintptr_t)dst, src, bytes);
        return 0;
}

static int fake_copy_device(int device, DvDevPtr dst, DvDevPtr src, size_t bytes) {
        int r = fake_check(device);
        if (r)
                return r;
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
        return 0;
}

/*
 * Where the fake's shareable mappings live, so that with $DEVAL_GPU_FAKE_NOP2P set (no GPU
 * reaches another's memory) run_plan() refuses a source on another device, as a real GPU
 * without P2P would fault on it.
 */
static struct {
        pthread_mutex_t lock;
        struct {
                uintptr_t p;
                size_t size;
                int device;
        } m[4096];
} fake_maps = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool fake_nop2p(void) {
        const char *env = secure_getenv("DEVAL_GPU_FAKE_NOP2P");
        return env && *env && strcmp(env, "0") != 0;
}

static void fake_map_note(void *p, size_t size, int device) {
        pthread_mutex_lock(&fake_maps.lock);
        for (size_t i = 0; i < DV_ARRAY_SIZE(fake_maps.m); i++)
                if (!fake_maps.m[i].p) {
                        fake_maps.m[i].p = (uintptr_t)p;
                        fake_maps.m[i].size = size;
                        fake_maps.m[i].device = device;
                        break;
                }
        pthread_mutex_unlock(&fake_maps.lock);
}

static void fake_map_forget(uintptr_t p) {
        pthread_mutex_lock(&fake_maps.lock);
        for (size_t i = 0; i < DV_ARRAY_SIZE(fake_maps.m); i++)
                if (fake_maps.m[i].p == p)
                        fake_maps.m[i].p = 0;
        pthread_mutex_unlock(&fake_maps.lock);
}

/* The device whose memory holds p, or -1 (host memory, or not the fake's). */
static int fake_map_device(uintptr_t p) {
        int dev = -1;
        pthread_mutex_lock(&fake_maps.lock);
        for (size_t i = 0; i < DV_ARRAY_SIZE(fake_maps.m); i++)
                if (fake_maps.m[i].p && p >= fake_maps.m[i].p &&
                    p < fake_maps.m[i].p + fake_maps.m[i].size)
                        dev = fake_maps.m[i].device;
        pthread_mutex_unlock(&fake_maps.lock);
        return dev;
}

/*
 * A sticky error on demand: when the file $DEVAL_GPU_FAKE_STICKY_ONCE names exists, the
 * next run_plan() on device $DEVAL_GPU_FAKE_STICKY_DEVICE (default 1) removes it and fails
 * as an illegal address in a kernel would: sticky, so the process must not use the device
 * again. Removing the file makes it happen once, whichever process gets there first.
 */
static bool fake_sticky_now(int device) {
        const char *path = secure_getenv("DEVAL_GPU_FAKE_STICKY_ONCE");
        const char *dev = secure_getenv("DEVAL_GPU_FAKE_STICKY_DEVICE");
        if (!path || !*path || device != (dev ? atoi(dev) : 1))
                return false;
        return unlink(path) == 0;
}

/*
 * Fake shareable device memory: a memfd, mapped (zero-filled, like the real one after its
 * memset). $DEVAL_GPU_FAKE_MEM caps one allocation, to exercise out-of-memory paths;
 * $DEVAL_GPU_FAKE_ALLOC_MS makes each take that long, as a GPU busy with a kernel would.
 */
static int fake_export_alloc(int device, size_t bytes, DvDevPtr *ret, int *ret_fd) {
        int r = fake_check(device);
        if (r)
                return r;
        const char *slow = secure_getenv("DEVAL_GPU_FAKE_ALLOC_MS");
        if (slow && *slow)
                usleep((useconds_t)strtoul(slow, NULL, 10) * 1000);
        const char *cap = secure_getenv("DEVAL_GPU_FAKE_MEM");
        if (cap && bytes > strtoull(cap, NULL, 10))
                return gpu_fail(DEVAL_ENOMEM, "fake device %d is out of memory (%zu bytes asked)",
                                device, bytes);
        int fd = memfd_create("deval-fake-device", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)(bytes ? bytes : 1)) < 0) {
                if (fd >= 0)
                        close(fd);
                return gpu_fail(DEVAL_ENOMEM, "fake device %d is out of memory", device);
        }
        void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
                close(fd);
                return gpu_fail(DEVAL_ENOMEM, "fake device %d is out of memory", device);
        }
        fake_map_note(p, bytes ? bytes : 1, device);
        if (dv_legacy_forced("DEVAL_GPU_FAKE_LEGACY_IPC")) {
                /*
                 * The fake's legacy handle: this process and the backing memfd's number,
                 * opened by importers through /proc (a real handle is just as bound to
                 * the exporting process staying alive).
                 */
                uint8_t handle[64] = {0};
                int32_t who[2] = {(int32_t)getpid(), fd}, wrapped = -1;
                memcpy(handle, who, sizeof(who));
                if ((r = dv_legacy_wrap(handle, bytes ? bytes : 1, &wrapped)) < 0 ||
                    (r = dv_legacy_note((DvDevPtr)(uintptr_t)p, LEGACY_OWN, fd)) < 0) {
                        if (wrapped >= 0)
                                close(wrapped);
                        fake_map_forget((uintptr_t)p);
                        munmap(p, bytes ? bytes : 1);
                        close(fd);
                        return r;
                }
                fd = wrapped;
        }
        *ret = (DvDevPtr)(uintptr_t)p;
        *ret_fd = fd;
        return 0;
}

static int fake_import_fd(int device, int fd, size_t bytes, DvDevPtr *ret) {
        int r = fake_check(device);
        int opened = -1;
        LegacyBlob blob;
        if (r)
                return r;
        if (dv_legacy_unwrap(fd, &blob)) {
                int32_t who[2];
                char path[64];
                memcpy(who, blob.handle, sizeof(who));
                snprintf(path, sizeof(path), "/proc/%d/fd/%d", who[0], who[1]);
                if (blob.size < bytes || (opened = open(path, O_RDWR | O_CLOEXEC)) < 0)
                        return gpu_fail(DEVAL_ESYS, "fake legacy IPC handle %s: %s", path,
                                        blob.size < bytes ? "too small" : strerror(errno));
                fd = opened;
        }
        void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (opened >= 0)
                close(opened);
        if (p == MAP_FAILED)
                return gpu_fail(DEVAL_ENOMEM, "fake import of %zu bytes failed", bytes);
        if (opened >= 0 && (r = dv_legacy_note((DvDevPtr)(uintptr_t)p, LEGACY_OPENED, -1)) < 0) {
                munmap(p, bytes ? bytes : 1);
                return r;
        }
        fake_map_note(p, bytes ? bytes : 1, device);
        *ret = (DvDevPtr)(uintptr_t)p;
        return 0;
}

static int fake_unmap(int device, DvDevPtr p, size_t bytes) {
        int r = fake_check(device);
        if (r)
                return r;
        int backing = -1;
        if (dv_legacy_take(p, &backing) == LEGACY_OWN)
                close(backing); /* the exporter lets go: handles no longer open */
        fake_map_forget((uintptr_t)p);
        munmap((void *)(uintptr_t)p, bytes ? bytes : 1);
        return 0;
}

static int fake_can_access_peer(int device, int peer, int *ret) {
        int r = fake_check(device);
        if (r == 0)
                r = fake_check(peer);
        if (r == 0)
                *ret = !fake_nop2p();
        return r;
}

static int fake_host_alloc(size_t bytes, void **ret_host, DvDevPtr *ret_dev) {
        void *p = malloc(bytes ? bytes : 1);
        if (!p)
                return gpu_fail(DEVAL_ENOMEM, "fake pinned memory: out of memory");
        *ret_host = p;
        *ret_dev = (DvDevPtr)(uintptr_t)p;
        return 0;
}

static void fake_host_free(void *host) {
        free(host);
}

static int fake_run_plan(int device, const DvKernelSeg *segs, const uint64_t *starts,
                         uint32_t nsegs, DvDevPtr out, const DvDevPtr *srcs, uint32_t nsrcs) {
        int r = fake_check(device);
        if (r)
                return r;
        if (fake_sticky_now(device)) {
                r = gpu_fail(DEVAL_ESYS, "the copy kernel: CUDA error 700 (an illegal memory "
                                         "access was encountered; fake)");
                dv_gpu_set_sticky(1);
                return r;
        }
        for (uint32_t i = 0; fake_nop2p() && i < nsrcs; i++) {
                int where = fake_map_device((uintptr_t)srcs[i]);
                if (where >= 0 && where != device)
                        return gpu_fail(DEVAL_ESYS,
                                        "the copy kernel on fake device %d read source %u on "
                                        "device %d, which it cannot reach (no P2P)",
                                        device, i, where);
        }
        /* $DEVAL_GPU_FAKE_HANG: while that file exists, a kernel runs on (a minute at most) */
        const char *hang = secure_getenv("DEVAL_GPU_FAKE_HANG");
        for (int ms = 0; hang && *hang && ms < 60000 && access(hang, F_OK) == 0; ms += 10)
                usleep(10000);
        const uint8_t **host = calloc(nsrcs ? nsrcs : 1, sizeof(*host));
        if (!host)
                return gpu_fail(DEVAL_ENOMEM, "out of memory");
        for (uint32_t i = 0; i < nsrcs; i++)
                host[i] = (const uint8_t *)(uintptr_t)srcs[i];
        /* the same body the kernel runs, in the kernel's 256-byte chunks */
        uint64_t total = nsegs ? starts[nsegs] : 0;
        for (uint64_t i = 0; i < total; i += 256)
                dv_kplan_run(segs, starts, nsegs, i, total - i < 256 ? total - i : 256,
                             (uint8_t *)(uintptr_t)out, host);
        free(host);
        return 0;
}

const DvGpuApi dv_gpu_fake = {
        .name = "fake",
        .init = fake_init,
        .device_count = fake_device_count,
        .device_uuid = fake_device_uuid,
        .device_busid = fake_device_busid,
        .alloc = fake_alloc,
        .free = fake_free,
        .copy_to_host = fake_copy_to_host,
        .copy_to_device = fake_copy_to_device,
        .copy_device = fake_copy_device,
        .export_alloc = fake_export_alloc,
        .import_fd = fake_import_fd,
        .unmap = fake_unmap,
        .can_access_peer = fake_can_access_peer,
        .host_alloc = fake_host_alloc,
        .host_free = fake_host_free,
        .run_plan = fake_run_plan,
};
