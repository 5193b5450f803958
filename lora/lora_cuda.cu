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

static __global__ void dropout_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, int64_t n, uint64_t seed, float p,
                                      int accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = __bfloat162float(x[i]) * mt_lora_dropout_factor(seed, p, (uint64_t)i);
        out[i] = __float2bfloat16_rn(accumulate ? __bfloat162float(out[i]) + v : v);
    }
}

extern "C" void mt_lora_dropout_cuda(mt_backend *be, mt_bf16 *out, const mt_bf16 *x, int64_t n, uint64_t seed,
                                     float p, int accumulate) {
    if (n == 0) return;
    cudaStream_t s = mt_cuda_begin(be);
    dropout_kernel<<<mt_cuda_blocks(n, THREADS, 8192), THREADS, 0, s>>>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)x,
                                                                        n, seed, p, accumulate);
    MT_CHECK_LAUNCH();
}
