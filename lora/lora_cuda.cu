// lora/lora_cuda.cu — LoRA dropout on the device, regenerated from the CPU's hash
// (lora/lora_dropout.h), so the masks are the same elements on both. The GEMMs around it are
// lora/lora_dev.c's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "lora/lora_dropout.h"
#include "lora/lora_cuda.h"

enum { THREADS = 256 };

// Rows over blocks, columns over threads (no division per element); element (r, j) masked as
// element r·width + j of the contiguous matrix.
static __global__ void dropout_kernel(__nv_bfloat16 *out, int64_t ldo, const __nv_bfloat16 *x, int64_t ldx, int64_t rows,
                                      int64_t width, uint64_t seed, float p, int accumulate) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
            float v = __bfloat162float(x[r * ldx + j]) * mt_lora_dropout_factor(seed, p, (uint64_t)(r * width + j));
            __nv_bfloat16 *o = out + r * ldo + j;
            *o = __float2bfloat16_rn(accumulate ? __bfloat162float(*o) + v : v);
        }
}

extern "C" void mt_lora_dropout_cuda(mt_backend *be, mt_bf16 *out, int64_t ldo, const mt_bf16 *x, int64_t ldx,
                                     int64_t rows, int64_t width, uint64_t seed, float p, int accumulate) {
    if (rows == 0 || width == 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    dropout_kernel<<<mt_cuda_blocks(rows, 1), THREADS, 0, s>>>((__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)x, ldx,
                                                               rows, width, seed, p, accumulate);
    MT_CHECK_LAUNCH();
}
