// SPDX-License-Identifier: MIT
//
// copy_kernel.cu - the cuda backend's copy kernel: one launch per destination GPU executes a
// flattened plan, each thread taking 256-byte chunks of the output in a grid-stride loop and
// writing them through the same dv_kplan_run() the CPU tests exercise. Sources are the
// ranks' arenas, read through peer access (or a pinned host staging copy).
#include "kernel_body.h"

extern "C" __global__ void dv_copy_kernel(const DvKernelSeg *segs, const uint64_t *starts,
                                          uint32_t nsegs, uint8_t *out,
                                          const uint8_t *const *srcs) {
        const uint64_t chunk = 256;
        uint64_t total = nsegs ? starts[nsegs] : 0;
        uint64_t step = (uint64_t)gridDim.x * blockDim.x * chunk;
        for (uint64_t i = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) * chunk; i < total;
             i += step) {
                uint64_t n = total - i < chunk ? total - i : chunk;
                dv_kplan_run(segs, starts, nsegs, i, n, out, srcs);
        }
}
