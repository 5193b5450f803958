// core/cuda_util.cuh — device helpers shared by the op kernels (.cu files only): warp and block
// reductions, grid sizing, the begin/end of a launcher on the backend's stream, and a sigmoid.
//
// Reductions combine in a fixed tree (shuffles, then warps in order), so a result depends only
// on the data and the launch shape: no float atomics anywhere.
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/cuda_check.h"  // first: it makes core/common.h digestible for nvcc
#include "core/backend.h"

// The backend's stream with its device made current; every launcher starts here.
static inline cudaStream_t mt_cuda_begin(mt_backend *be) {
    return (cudaStream_t)mt_cuda_backend_enter(be);
}

// After a launch: a bad configuration is reported here, a fault at the next synchronising call.
#define MT_CHECK_LAUNCH() MT_CHECK_CUDA(cudaGetLastError())

// Blocks for n items of `per_block` each, capped (grid-stride loops cover the rest).
static inline unsigned mt_cuda_blocks(int64_t n, int per_block, unsigned cap = 65535u) {
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : (b > (int64_t)cap ? cap : b));
}

// sigmoid(g) without overflow: e^-|g| ≤ 1 on either side.
static __device__ __forceinline__ float mt_sigmoid(float g) {
    if (g >= 0.0f) return 1.0f / (1.0f + expf(-g));
    const float z = expf(g);
    return z / (1.0f + z);
}

template <typename T> static __device__ __forceinline__ T mt_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float mt_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `red` is shared scratch of 32 elements; the call ends with the block synchronised.
template <typename T> static __device__ T mt_block_sum(T v, T *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mt_warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T s = lane < nw ? red[lane] : (T)0;
    return mt_warp_sum(s);
}

static __device__ float mt_block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mt_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = lane < nw ? red[lane] : -INFINITY;
    return mt_warp_max(m);
}
