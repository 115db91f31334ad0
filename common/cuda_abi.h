/* SPDX-License-Identifier: MIT */
/*
 * cuda_abi.h - the part of the CUDA driver API deval calls, written out by hand so that
 * deval builds without the toolkit and loads libcuda.so.1 at run time (gpu.c).
 *
 * Hand-copied declarations can drift from the real ones without a compiler noticing, so
 * tests/unit/test-cuda-abi.c checks every struct layout and constant here against cuda.h,
 * and every symbol in DV_CUDA_SYMBOLS against the toolkit's libcuda stub, wherever the
 * toolkit is installed (CI has it).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef unsigned long long DvCuMemHandle; /* CUmemGenericAllocationHandle */

typedef struct {
        int type; /* DV_CU_MEM_LOCATION_TYPE_DEVICE */
        int id;
} DvCuMemLocation; /* CUmemLocation */

typedef struct {
        int type;                 /* DV_CU_MEM_ALLOCATION_TYPE_PINNED */
        int requestedHandleTypes; /* DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
        DvCuMemLocation location;
        void *win32HandleMetaData;
        struct {
                unsigned char compressionType;
                unsigned char gpuDirectRDMACapable;
                unsigned short usage;
                unsigned char reserved[4];
        } allocFlags;
} DvCuMemAllocationProp; /* CUmemAllocationProp */

typedef struct {
        DvCuMemLocation location;
        int flags;   /* DV_CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
} DvCuMemAccessDesc; /* CUmemAccessDesc */

typedef struct {
        char reserved[64];
} DvCuIpcMemHandle; /* CUipcMemHandle, passed by value */

enum {
        DV_CUDA_SUCCESS = 0,
        DV_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
        DV_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
        DV_CUDA_ERROR_OUT_OF_MEMORY = 2,
        DV_CUDA_ERROR_ECC_UNCORRECTABLE = 214,
        DV_CUDA_ERROR_NVLINK_UNCORRECTABLE = 220,
        DV_CUDA_ERROR_CONTAINED = 226,
        DV_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
        DV_CUDA_ERROR_LAUNCH_TIMEOUT = 702,
        DV_CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
        DV_CUDA_ERROR_LAUNCH_FAILED = 719,
        DV_CUDA_ERROR_UNKNOWN = 999,
        DV_CU_MEM_LOCATION_TYPE_DEVICE = 1,
        DV_CU_MEM_ALLOCATION_TYPE_PINNED = 1,
        DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
        DV_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
        DV_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        DV_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
        DV_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
        DV_CU_MEMHOSTALLOC_PORTABLE = 1,
        DV_CU_MEMHOSTALLOC_DEVICEMAP = 2,
};

/*
 * Every driver entry point gpu.c resolves, by the name the library exports (cuda.h maps
 * its API names to these versioned ones: cuMemAlloc is cuMemAlloc_v2, and so on).
 */
#define DV_CUDA_SYMBOLS(X)                \
        X(cuInit)                         \
        X(cuGetErrorString)               \
        X(cuDeviceGetCount)               \
        X(cuDeviceGet)                    \
        X(cuDeviceGetUuid_v2)             \
        X(cuDeviceGetPCIBusId)            \
        X(cuDeviceGetAttribute)           \
        X(cuDeviceCanAccessPeer)          \
        X(cuDevicePrimaryCtxRetain)       \
        X(cuCtxSetCurrent)                \
        X(cuCtxSynchronize)               \
        X(cuMemAlloc_v2)                  \
        X(cuMemFree_v2)                   \
        X(cuMemcpyDtoH_v2)                \
        X(cuMemcpyHtoD_v2)                \
        X(cuMemcpyDtoD_v2)                \
        X(cuMemsetD8_v2)                  \
        X(cuMemHostAlloc)                 \
        X(cuMemHostGetDevicePointer_v2)   \
        X(cuMemFreeHost)                  \
        X(cuModuleLoadData)               \
        X(cuModuleGetFunction)            \
        X(cuLaunchKernel)                 \
        X(cuMemGetAllocationGranularity)  \
        X(cuMemCreate)                    \
        X(cuMemRelease)                   \
        X(cuMemAddressReserve)            \
        X(cuMemAddressFree)               \
        X(cuMemMap)                       \
        X(cuMemUnmap)                     \
        X(cuMemSetAccess)                 \
        X(cuMemExportToShareableHandle)   \
        X(cuMemImportFromShareableHandle) \
        X(cuCtxEnablePeerAccess)          \
        X(cuIpcGetMemHandle)              \
        X(cuIpcOpenMemHandle_v2)          \
        X(cuIpcCloseMemHandle)
