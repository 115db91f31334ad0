/* SPDX-License-Identifier: MIT */
/*
 * gpu_cuda.c - the CUDA driver behind dv_gpu(), loaded with dlopen() on first use.
 *
 * The driver's prototypes are declared here with plain types rather than taken from cuda.h,
 * so that deval builds where the toolkit is absent. Contexts: each device's primary context,
 * retained once and made current around each call, which is what the CUDA runtime (and so
 * torch) uses too, so pointers from torch are valid in it.
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

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;

#define MAX_DEVICES DV_MAX_GPUS

typedef DvCuMemHandle CUmemGenericAllocationHandle;
typedef DvCuMemAllocationProp CUmemAllocationProp;
typedef DvCuMemAccessDesc CUmemAccessDesc;

static struct {
        pthread_once_t once;
        int status;
        void *lib;
        CUresult (*cuInit)(unsigned);
        CUresult (*cuGetErrorString)(CUresult, const char **);
        CUresult (*cuDeviceGetCount)(int *);
        CUresult (*cuDeviceGet)(CUdevice *, int);
        CUresult (*cuDeviceGetUuid_v2)(uint8_t *, CUdevice);
        CUresult (*cuDeviceGetPCIBusId)(char *, int, CUdevice);
        CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
        CUresult (*cuCtxSetCurrent)(CUcontext);
        CUresult (*cuCtxSynchronize)(void);
        CUresult (*cuMemAlloc_v2)(DvDevPtr *, size_t);
        CUresult (*cuMemFree_v2)(DvDevPtr);
        CUresult (*cuMemcpyDtoH_v2)(void *, DvDevPtr, size_t);
        CUresult (*cuMemcpyHtoD_v2)(DvDevPtr, const void *, size_t);
        CUresult (*cuMemcpyDtoD_v2)(DvDevPtr, DvDevPtr, size_t);
        CUresult (*cuMemsetD8_v2)(DvDevPtr, unsigned char, size_t);
        CUresult (*cuModuleLoadData)(CUmodule *, const void *);
        CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
        CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, void *, void **, void **);
        CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
        CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                unsigned long long);
        CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
        CUresult (*cuMemAddressReserve)(DvDevPtr *, size_t, size_t, DvDevPtr, unsigned long long);
        CUresult (*cuMemAddressFree)(DvDevPtr, size_t);
        CUresult (*cuMemMap)(DvDevPtr, size_t, size_t, CUmemGenericAllocationHandle,
                             unsigned long long);
        CUresult (*cuMemUnmap)(DvDevPtr, size_t);
        CUresult (*cuMemSetAccess)(DvDevPtr, size_t, const CUmemAccessDesc *, size_t);
        CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
                                                 unsigned long long);
        CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
        CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
        CUresult (*cuDeviceCanAccessPeer)(int *, CUdevice, CUdevice);
        CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
        CUresult (*cuMemHostGetDevicePointer_v2)(DvDevPtr *, void *, unsigned);
        CUresult (*cuMemFreeHost)(void *);
        CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned);
        CUresult (*cuIpcGetMemHandle)(DvCuIpcMemHandle *, DvDevPtr);
        CUresult (*cuIpcOpenMemHandle_v2)(DvDevPtr *, DvCuIpcMemHandle, unsigned);
        CUresult (*cuIpcCloseMemHandle)(DvDevPtr);
        pthread_mutex_t lock; /* guards the per-device state below */
        CUcontext ctx[MAX_DEVICES];
        CUfunction copy[MAX_DEVICES];
} cu = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/*
 * The errors after which the context stays broken for the rest of the process's life (so
 * cuda.h documents them): uncorrectable ECC and NVLink errors, contained errors, the kernel
 * faults 700, 702 and 714-719, and unknown errors.
 */
static bool cu_sticky(CUresult r) {
        return r == DV_CUDA_ERROR_ECC_UNCORRECTABLE || r == DV_CUDA_ERROR_NVLINK_UNCORRECTABLE ||
               r == DV_CUDA_ERROR_CONTAINED || r == DV_CUDA_ERROR_ILLEGAL_ADDRESS ||
               r == DV_CUDA_ERROR_LAUNCH_TIMEOUT ||
               (r >= DV_CUDA_ERROR_HARDWARE_STACK_ERROR && r <= DV_CUDA_ERROR_LAUNCH_FAILED) ||
               r == DV_CUDA_ERROR_UNKNOWN;
}

static int cu_check(CUresult r, const char *what) {
        const char *s = NULL;
        if (r == 0)
                return 0;
        if (cu.cuGetErrorString)
                cu.cuGetErrorString(r, &s);
        int status = gpu_fail(r == DV_CUDA_ERROR_OUT_OF_MEMORY ? DEVAL_ENOMEM : DEVAL_ESYS,
                              "%s: CUDA error %d (%s)", what, r, s ? s : "unknown");
        dv_gpu_set_sticky(cu_sticky(r));
        return status;
}

static void cu_load(void) {
        /* $DEVAL_CUDA_LIBRARY: another driver library (tests load the toolkit's stub) */
        const char *path = secure_getenv("DEVAL_CUDA_LIBRARY");
        path = path && *path ? path : "libcuda.so.1";
        cu.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!cu.lib) {
                cu.status = gpu_fail(DEVAL_ENOTSUP,
                                     "device tensors need the CUDA driver, and %s could not be "
                                     "loaded: %s",
                                     path, dlerror());
                return;
        }
#define SYM(name)                                                                               \
        do {                                                                                    \
                *(void **)&cu.name = dlsym(cu.lib, #name);                                      \
                if (!cu.name) {                                                                 \
                        cu.status = gpu_fail(DEVAL_ENOTSUP, "the CUDA driver lacks %s", #name); \
                        return;                                                                 \
                }                                                                               \
        } while (0);
        DV_CUDA_SYMBOLS(SYM)
#undef SYM
        int r = cu_check(cu.cuInit(0), "cuInit");
        cu.status = r ? DEVAL_ENOTSUP : 0;
}

static int cu_init(void) {
        pthread_once(&cu.once, cu_load);
        return cu.status;
}

/* Make device's primary context current on this thread. */
static int cu_use(int device) {
        CUdevice dev;
        int r, n = 0;

        if (device < 0 || device >= MAX_DEVICES)
                return gpu_fail(DEVAL_EINVAL, "CUDA device %d is out of range", device);
        pthread_mutex_lock(&cu.lock);
        if (!cu.ctx[device]) {
                if ((r = cu_check(cu.cuDeviceGetCount(&n), "cuDeviceGetCount")) < 0 ||
                    (device >= n &&
                     (r = gpu_fail(DEVAL_EINVAL, "CUDA device %d does not exist (%d visible)",
                                   device, n)) < 0) ||
                    (r = cu_check(cu.cuDeviceGet(&dev, device), "cuDeviceGet")) < 0 ||
                    (r = cu_check(cu.cuDevicePrimaryCtxRetain(&cu.ctx[device], dev),
                                  "cuDevicePrimaryCtxRetain")) < 0) {
                        pthread_mutex_unlock(&cu.lock);
                        return r;
                }
        }
        CUcontext ctx = cu.ctx[device];
        pthread_mutex_unlock(&cu.lock);
        return cu_check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

static int cu_device_count(int *ret) {
        return cu_check(cu.cuDeviceGetCount(ret), "cuDeviceGetCount");
}

static int cu_device_uuid(int device, uint8_t uuid[16]) {
        CUdevice dev;
        int r = cu_check(cu.cuDeviceGet(&dev, device), "cuDeviceGet");
        return r ? r : cu_check(cu.cuDeviceGetUuid_v2(uuid, dev), "cuDeviceGetUuid");
}

static int cu_device_busid(int device, char *buf, int len) {
        CUdevice dev;
        int r = cu_check(cu.cuDeviceGet(&dev, device), "cuDeviceGet");
        return r ? r : cu_check(cu.cuDeviceGetPCIBusId(buf, len, dev), "cuDeviceGetPCIBusId");
}

static int cu_alloc(int device, size_t bytes, DvDevPtr *ret) {
        int r = cu_use(device);
        return r ? r : cu_check(cu.cuMemAlloc_v2(ret, bytes ? bytes : 1), "cuMemAlloc");
}

static int cu_free(int device, DvDevPtr p) {
        int r = cu_use(device);
        return r ? r : cu_check(cu.cuMemFree_v2(p), "cuMemFree");
}

static int cu_copy_to_host(int device, void *dst, DvDevPtr src, size_t bytes) {
        int r = cu_use(device);
        return r ? r : cu_check(cu.cuMemcpyDtoH_v2(dst, src, bytes), "cuMemcpyDtoH");
}

static int cu_copy_to_device(int device, DvDevPtr dst, const void *src, size_t bytes) {
        int r = cu_use(device);
        return r ? r : cu_check(cu.cuMemcpyHtoD_v2(dst, src, bytes), "cuMemcpyHtoD");
}

static int cu_copy_device(int device, DvDevPtr dst, DvDevPtr src, size_t bytes) {
        int r = cu_use(device);
        if (r == 0)
                r = cu_check(cu.cuMemcpyDtoD_v2(dst, src, bytes), "cuMemcpyDtoD");
        return r ? r : cu_check(cu.cuCtxSynchronize(), "cuMemcpyDtoD");
}

static int cu_unmap(int device, DvDevPtr p, size_t bytes);

static size_t cu_round(int device, size_t bytes) {
        CUmemAllocationProp prop = {
                .type = DV_CU_MEM_ALLOCATION_TYPE_PINNED,
                .requestedHandleTypes = DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = {.type = DV_CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
        size_t gran = 2 << 20;
        if (cu.cuMemGetAllocationGranularity(&gran, &prop, DV_CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
                    0 ||
            gran == 0)
                gran = 2 << 20;
        bytes = bytes ? bytes : 1;
        return (bytes + gran - 1) / gran * gran;
}

/* Reserve, map and open handle h to every device that can reach it (peer access). */
static int cu_map(int device, CUmemGenericAllocationHandle h, size_t size, DvDevPtr *ret) {
        DvDevPtr p = 0;
        int r, n = 0;
        if ((r = cu_check(cu.cuMemAddressReserve(&p, size, 0, 0, 0), "cuMemAddressReserve")) < 0)
                return r;
        if ((r = cu_check(cu.cuMemMap(p, size, 0, h, 0), "cuMemMap")) < 0) {
                cu.cuMemAddressFree(p, size);
                return r;
        }
        CUmemAccessDesc own = {.location = {.type = DV_CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                               .flags = DV_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if ((r = cu_check(cu.cuMemSetAccess(p, size, &own, 1), "cuMemSetAccess")) < 0) {
                cu.cuMemUnmap(p, size);
                cu.cuMemAddressFree(p, size);
                return r;
        }
        cu.cuDeviceGetCount(&n);
        for (int d = 0; d < n; d++) { /* best effort: where P2P works, kernels there read it */
                CUmemAccessDesc peer = {
                        .location = {.type = DV_CU_MEM_LOCATION_TYPE_DEVICE, .id = d},
                        .flags = DV_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
                if (d != device)
                        cu.cuMemSetAccess(p, size, &peer, 1);
        }
        *ret = p;
        return 0;
}

/*
 * Whether device can export memory as a POSIX file descriptor through the virtual memory
 * management API (CUDA 10.2 and later on Linux; not under every virtualisation).
 */
static int cu_can_export(int device) {
        CUdevice dev;
        int vmm = 0, posix = 0, r;
        if ((r = cu_check(cu.cuDeviceGet(&dev, device), "cuDeviceGet")) < 0)
                return r;
        if ((r = cu_check(
                     cu.cuDeviceGetAttribute(
                             &vmm, DV_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                     "cuDeviceGetAttribute")) < 0 ||
            (r = cu_check(
                     cu.cuDeviceGetAttribute(
                             &posix,
                             DV_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                             dev),
                     "cuDeviceGetAttribute")) < 0)
                return r;
        if (!vmm || !posix)
                return gpu_fail(DEVAL_ENOTSUP,
                                "GPU %d cannot export memory as a file descriptor (virtual memory "
                                "management %s, POSIX handles %s); deval needs both",
                                device, vmm ? "yes" : "no", posix ? "yes" : "no");
        return 0;
}

/* cuMemAlloc() and cuIpcGetMemHandle(), wrapped: the fallback without POSIX handles. The
 * device's context is current. */
static int cu_export_legacy(size_t bytes, DvDevPtr *ret, int *ret_fd) {
        DvCuIpcMemHandle h;
        DvDevPtr p = 0;
        int r, fd = -1;
        size_t size = bytes ? bytes : 1;
        if ((r = cu_check(cu.cuMemAlloc_v2(&p, size), "cuMemAlloc")) < 0)
                return r;
        /* zeroed before anyone sees it: no stale data from another group */
        if ((r = cu_check(cu.cuMemsetD8_v2(p, 0, size), "cuMemsetD8")) < 0 ||
            (r = cu_check(cu.cuCtxSynchronize(), "cuMemsetD8")) < 0 ||
            (r = cu_check(cu.cuIpcGetMemHandle(&h, p), "cuIpcGetMemHandle")) < 0 ||
            (r = dv_legacy_wrap(&h, size, &fd)) < 0 ||
            (r = dv_legacy_note(p, LEGACY_OWN, -1)) < 0) {
                if (fd >= 0)
                        close(fd);
                cu.cuMemFree_v2(p);
                return r;
        }
        *ret = p;
        *ret_fd = fd;
        return 0;
}

static int cu_export_alloc(int device, size_t bytes, DvDevPtr *ret, int *ret_fd) {
        CUmemAllocationProp prop = {
                .type = DV_CU_MEM_ALLOCATION_TYPE_PINNED,
                .requestedHandleTypes = DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = {.type = DV_CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
        CUmemGenericAllocationHandle h;
        int r, fd = -1;
        if ((r = cu_use(device)) < 0)
                return r;
        if ((r = dv_legacy_forced("DEVAL_CUDA_LEGACY_IPC")) < 0)
                return r;
        if (r)
                return cu_export_legacy(bytes, ret, ret_fd);
        if ((r = cu_can_export(device)) == DEVAL_ENOTSUP)
                return cu_export_legacy(bytes, ret, ret_fd);
        if (r < 0)
                return r;
        size_t size = cu_round(device, bytes);
        if ((r = cu_check(cu.cuMemCreate(&h, size, &prop, 0), "cuMemCreate")) < 0)
                return r;
        if ((r = cu_check(cu.cuMemExportToShareableHandle(
                                  &fd, h, DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                          "cuMemExportToShareableHandle")) < 0 ||
            (r = cu_map(device, h, size, ret)) < 0) {
                if (fd >= 0)
                        close(fd);
                cu.cuMemRelease(h);
                return r;
        }
        cu.cuMemRelease(h);             /* the mapping and the descriptor keep it alive */
        fcntl(fd, F_SETFD, FD_CLOEXEC); /* the driver's descriptor: not for exec'd children */
        /* zeroed before anyone sees it: no stale data from another group */
        if ((r = cu_check(cu.cuMemsetD8_v2(*ret, 0, size), "cuMemsetD8")) < 0 ||
            (r = cu_check(cu.cuCtxSynchronize(), "cuMemsetD8")) < 0) {
                cu_unmap(device, *ret, size);
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

static int cu_import_fd(int device, int fd, size_t bytes, DvDevPtr *ret) {
        CUmemGenericAllocationHandle h;
        LegacyBlob blob;
        int r;
        if ((r = cu_use(device)) < 0)
                return r;
        if (dv_legacy_unwrap(fd, &blob)) {
                DvCuIpcMemHandle ipc;
                DvDevPtr p = 0;
                if (blob.size < bytes)
                        return gpu_fail(DEVAL_EINVAL,
                                        "a CUDA IPC handle for %llu bytes, %zu "
                                        "expected",
                                        (unsigned long long)blob.size, bytes);
                memcpy(&ipc, blob.handle, sizeof(ipc));
                if ((r = cu_check(cu.cuIpcOpenMemHandle_v2(&p, ipc,
                                                           DV_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                                  "cuIpcOpenMemHandle")) < 0)
                        return r;
                if ((r = dv_legacy_note(p, LEGACY_OPENED, -1)) < 0) {
                        cu.cuIpcCloseMemHandle(p);
                        return r;
                }
                *ret = p;
                return 0;
        }
        if ((r = cu_check(
                     cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                       DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     "cuMemImportFromShareableHandle")) < 0)
                return r;
        r = cu_map(device, h, cu_round(device, bytes), ret);
        cu.cuMemRelease(h);
        return r;
}

static int cu_unmap(int device, DvDevPtr p, size_t bytes) {
        int r = cu_use(device), fd;
        switch (dv_legacy_take(p, &fd)) {
        case LEGACY_OWN:
                return r ? r : cu_check(cu.cuMemFree_v2(p), "cuMemFree");
        case LEGACY_OPENED:
                return r ? r : cu_check(cu.cuIpcCloseMemHandle(p), "cuIpcCloseMemHandle");
        }
        size_t size = cu_round(device, bytes);
        if (r == 0)
                r = cu_check(cu.cuMemUnmap(p, size), "cuMemUnmap");
        if (r == 0)
                r = cu_check(cu.cuMemAddressFree(p, size), "cuMemAddressFree");
        return r;
}

static int cu_can_access_peer(int device, int peer, int *ret) {
        CUdevice a, b;
        int r;
        if ((r = cu_check(cu.cuDeviceGet(&a, device), "cuDeviceGet")) < 0 ||
            (r = cu_check(cu.cuDeviceGet(&b, peer), "cuDeviceGet")) < 0 ||
            (r = cu_check(cu.cuDeviceCanAccessPeer(ret, a, b), "cuDeviceCanAccessPeer")) < 0 ||
            !*ret)
                return r;
        /*
         * VMM mappings carry their own access rights (cu_map()); memory from cuMemAlloc() or
         * a legacy IPC handle lives in the peer's context, which device's context must be
         * allowed into. Where that fails, the peer is not reachable after all.
         */
        if ((r = cu_use(peer)) < 0 || (r = cu_use(device)) < 0)
                return r;
        pthread_mutex_lock(&cu.lock);
        CUcontext peer_ctx = cu.ctx[peer];
        pthread_mutex_unlock(&cu.lock);
        CUresult e = cu.cuCtxEnablePeerAccess(peer_ctx, 0);
        if (e != 0 && e != DV_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
                cu_check(e, "cuCtxEnablePeerAccess");
                *ret = 0;
        }
        return 0;
}

static int cu_host_alloc(size_t bytes, void **ret_host, DvDevPtr *ret_dev) {
        void *p = NULL;
        int r;
        /* every context may use it, and kernels read it through a device address */
        unsigned flags = DV_CU_MEMHOSTALLOC_PORTABLE | DV_CU_MEMHOSTALLOC_DEVICEMAP;
        if ((r = cu_check(cu.cuMemHostAlloc(&p, bytes ? bytes : 1, flags), "cuMemHostAlloc")) < 0)
                return r;
        if ((r = cu_check(cu.cuMemHostGetDevicePointer_v2(ret_dev, p, 0),
                          "cuMemHostGetDevicePointer")) < 0) {
                cu.cuMemFreeHost(p);
                return r;
        }
        *ret_host = p;
        return 0;
}

static void cu_host_free(void *host) {
        if (host)
                cu.cuMemFreeHost(host);
}

/* The kernel reads its segment table and source table from device memory. */
static int cu_run_plan(int device, const DvKernelSeg *segs, const uint64_t *starts, uint32_t nsegs,
                       DvDevPtr out, const DvDevPtr *srcs, uint32_t nsrcs) {
        int r;
        if (!dv_copy_kernel_fatbin)
                return gpu_fail(DEVAL_ENOTSUP, "this build has no copy kernel (no nvcc)");
        if ((r = cu_use(device)) < 0)
                return r;
        pthread_mutex_lock(&cu.lock);
        if (!cu.copy[device]) {
                CUmodule m;
                if ((r = cu_check(cu.cuModuleLoadData(&m, dv_copy_kernel_fatbin),
                                  "cuModuleLoadData")) < 0 ||
                    (r = cu_check(cu.cuModuleGetFunction(&cu.copy[device], m, "dv_copy_kernel"),
                                  "cuModuleGetFunction")) < 0) {
                        pthread_mutex_unlock(&cu.lock);
                        return r;
                }
        }
        CUfunction fn = cu.copy[device];
        pthread_mutex_unlock(&cu.lock);

        size_t seg_bytes = nsegs * sizeof(*segs), start_bytes = (nsegs + 1) * sizeof(*starts);
        size_t src_bytes = nsrcs * sizeof(*srcs);
        DvDevPtr table = 0;
        if ((r = cu_check(cu.cuMemAlloc_v2(&table, seg_bytes + start_bytes + src_bytes + 64),
                          "cuMemAlloc")) < 0)
                return r;
        DvDevPtr d_segs = table, d_starts = table + seg_bytes, d_srcs = d_starts + start_bytes;
        d_srcs = (d_srcs + 7) & ~(DvDevPtr)7;
        if ((r = cu_check(cu.cuMemcpyHtoD_v2(d_segs, segs, seg_bytes), "cuMemcpyHtoD")) < 0 ||
            (r = cu_check(cu.cuMemcpyHtoD_v2(d_starts, starts, start_bytes), "cuMemcpyHtoD")) < 0 ||
            (r = cu_check(cu.cuMemcpyHtoD_v2(d_srcs, srcs, src_bytes), "cuMemcpyHtoD")) < 0)
                goto out;
        uint64_t total = starts[nsegs];
        unsigned threads = 256;
        uint64_t want = (total / 256 + threads - 1) / threads;
        unsigned blocks = (unsigned)(want < 1 ? 1 : want > 4096 ? 4096 : want);
        void *args[] = {&d_segs, &d_starts, &nsegs, &out, &d_srcs};
        if ((r = cu_check(cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, NULL, args, NULL),
                          "cuLaunchKernel")) < 0)
                goto out;
        r = cu_check(cu.cuCtxSynchronize(), "the copy kernel");
out:
        cu.cuMemFree_v2(table);
        return r;
}

const DvGpuApi dv_gpu_cuda = {
        .name = "cuda",
        .init = cu_init,
        .device_count = cu_device_count,
        .device_uuid = cu_device_uuid,
        .device_busid = cu_device_busid,
        .alloc = cu_alloc,
        .free = cu_free,
        .copy_to_host = cu_copy_to_host,
        .copy_to_device = cu_copy_to_device,
        .copy_device = cu_copy_device,
        .export_alloc = cu_export_alloc,
        .import_fd = cu_import_fd,
        .unmap = cu_unmap,
        .can_access_peer = cu_can_access_peer,
        .host_alloc = cu_host_alloc,
        .host_free = cu_host_free,
        .run_plan = cu_run_plan,
};
