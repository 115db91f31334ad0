/* SPDX-License-Identifier: MIT */
/*
 * test-cuda-abi.c - deval's hand-written CUDA driver declarations (common/cuda_abi.h)
 * against the toolkit's own: struct layouts and constants against cuda.h at compile time,
 * and at run time every symbol gpu.c resolves against the toolkit's libcuda stub, which
 * exports the driver's whole API (and whose cuInit fails: it is no driver). Built only
 * where the toolkit is installed.
 */
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

#include "cuda_abi.h"
#include "gpu.h"

#define SAME_LAYOUT(ours, theirs, field)                                                   \
        _Static_assert(offsetof(ours, field) == offsetof(theirs, field) &&                 \
                               sizeof(((ours *)0)->field) == sizeof(((theirs *)0)->field), \
                       #ours "." #field " differs from cuda.h")

_Static_assert(sizeof(DvCuMemHandle) == sizeof(CUmemGenericAllocationHandle), "handle");
_Static_assert(sizeof(DvCuMemLocation) == sizeof(CUmemLocation), "CUmemLocation");
SAME_LAYOUT(DvCuMemLocation, CUmemLocation, type);
SAME_LAYOUT(DvCuMemLocation, CUmemLocation, id);
_Static_assert(sizeof(DvCuMemAllocationProp) == sizeof(CUmemAllocationProp), "CUmemAllocationProp");
SAME_LAYOUT(DvCuMemAllocationProp, CUmemAllocationProp, type);
SAME_LAYOUT(DvCuMemAllocationProp, CUmemAllocationProp, requestedHandleTypes);
SAME_LAYOUT(DvCuMemAllocationProp, CUmemAllocationProp, location);
SAME_LAYOUT(DvCuMemAllocationProp, CUmemAllocationProp, win32HandleMetaData);
SAME_LAYOUT(DvCuMemAllocationProp, CUmemAllocationProp, allocFlags);
_Static_assert(sizeof(DvCuMemAccessDesc) == sizeof(CUmemAccessDesc), "CUmemAccessDesc");
SAME_LAYOUT(DvCuMemAccessDesc, CUmemAccessDesc, location);
SAME_LAYOUT(DvCuMemAccessDesc, CUmemAccessDesc, flags);
_Static_assert(sizeof(DvDevPtr) == sizeof(CUdeviceptr), "CUdeviceptr");
_Static_assert(sizeof(DvCuIpcMemHandle) == sizeof(CUipcMemHandle), "CUipcMemHandle");

#define SAME_VALUE(ours, theirs) _Static_assert((int)(ours) == (int)(theirs), #ours)
SAME_VALUE(DV_CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME_VALUE(DV_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
SAME_VALUE(DV_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME_VALUE(DV_CUDA_ERROR_ECC_UNCORRECTABLE, CUDA_ERROR_ECC_UNCORRECTABLE);
SAME_VALUE(DV_CUDA_ERROR_NVLINK_UNCORRECTABLE, CUDA_ERROR_NVLINK_UNCORRECTABLE);
SAME_VALUE(DV_CUDA_ERROR_CONTAINED, CUDA_ERROR_CONTAINED);
SAME_VALUE(DV_CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS);
SAME_VALUE(DV_CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_TIMEOUT);
SAME_VALUE(DV_CUDA_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_HARDWARE_STACK_ERROR);
SAME_VALUE(DV_CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_FAILED);
SAME_VALUE(DV_CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);
/* the sticky range 714..719 is contiguous in cuda.h */
SAME_VALUE(DV_CUDA_ERROR_HARDWARE_STACK_ERROR + 1, CUDA_ERROR_ILLEGAL_INSTRUCTION);
SAME_VALUE(DV_CUDA_ERROR_HARDWARE_STACK_ERROR + 2, CUDA_ERROR_MISALIGNED_ADDRESS);
SAME_VALUE(DV_CUDA_ERROR_HARDWARE_STACK_ERROR + 3, CUDA_ERROR_INVALID_ADDRESS_SPACE);
SAME_VALUE(DV_CUDA_ERROR_HARDWARE_STACK_ERROR + 4, CUDA_ERROR_INVALID_PC);
SAME_VALUE(DV_CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(DV_CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED);
SAME_VALUE(DV_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME_VALUE(DV_CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME_VALUE(DV_CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME_VALUE(DV_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
SAME_VALUE(DV_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
SAME_VALUE(DV_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE);
SAME_VALUE(DV_CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_DEVICEMAP);

static const char *stub(void) {
        const char *p = getenv("DEVAL_CUDA_STUB");
        return p && *p ? p : NULL;
}

/* Every name gpu.c resolves is one the driver exports. */
static void test_symbols_exist(void **state) {
        (void)state;
        void *lib = dlopen(stub(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
                fprintf(stderr, "%s\n", dlerror());
                fail();
        }
        int missing = 0;
#define CHECK_SYM(name)                                          \
        if (!dlsym(lib, #name)) {                                \
                fprintf(stderr, "the driver lacks %s\n", #name); \
                missing++;                                       \
        }
        DV_CUDA_SYMBOLS(CHECK_SYM)
#undef CHECK_SYM
        dlclose(lib);
        assert_int_equal(missing, 0);
}

/*
 * gpu.c's loader on the stub: it resolves every symbol and gets as far as cuInit, which
 * the stub refuses; that is reported as DEVAL_ENOTSUP naming cuInit.
 */
static void test_loader_reaches_cuinit(void **state) {
        (void)state;
        setenv("DEVAL_CUDA_LIBRARY", stub(), 1);
        unsetenv("DEVAL_GPU_FAKE");
        const DvGpuApi *gpu = dv_gpu();
        assert_string_equal(gpu->name, "cuda");
        assert_int_equal(gpu->init(), DEVAL_ENOTSUP);
        fprintf(stderr, "the stub says: %s\n", dv_gpu_error());
        assert_non_null(strstr(dv_gpu_error(), "cuInit"));
}

int main(void) {
        if (!stub()) {
                fprintf(stderr, "no libcuda stub ($DEVAL_CUDA_STUB): skipped\n");
                return 77;
        }
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_symbols_exist),
                cmocka_unit_test(test_loader_reaches_cuinit),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
