// core/cuda_check.h — checked CUDA, cuBLAS(Lt) and NCCL calls (for .cu files).
//
//   MT_CHECK_CUDA(cudaMalloc(&p, n));
//   MT_CHECK_CUBLAS(cublasLtMatmul(...));
//   MT_CHECK_NCCL(ncclAllReduce(...));      // include <nccl.h> before using this one
//
// On failure: "moetrain: fatal: CUDA error 'out of memory' (cudaErrorMemoryAllocation) in
// `cudaMalloc(&p, n)`; hint: ... (file:line)", then exit with MT_EXIT_OOM for an out-of-memory
// error and MT_EXIT_ERROR otherwise. These are for runtime faults; a failure the caller can
// report (a refused allocation, an unsupported matmul) goes through mt_error_set() instead.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/common.h"

static inline const char *mt_cuda_error_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory; `moetrain plan` shows the budget per category "
               "(lower the batch or sequence length, or enable checkpointing)";
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
        return "no usable GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES";
    case cudaErrorInsufficientDriver:
        return "the NVIDIA driver is older than this CUDA toolkit; update the driver";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "this build has no code for this GPU (built for sm_80 and sm_90); "
               "rebuild with the GPU's architecture";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
        return "a kernel faulted (the context is now unusable); rerun under compute-sanitizer";
    default:
        return "rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing call";
    }
}

static inline const char *mt_cublas_error_hint(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cuBLASLt could not initialise (is the GPU visible and the driver recent enough?)";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "cuBLASLt could not allocate host or device memory";
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "shape, leading dimension, alignment or dtype combination is not supported";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "this operation needs a newer GPU architecture";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer";
    default:
        return "rerun with CUBLASLT_LOG_LEVEL=5 for cuBLASLt's own log";
    }
}

#define MT_CHECK_CUDA(expr)                                                                   \
    do {                                                                                      \
        cudaError_t mt_cuda_err_ = (expr);                                                    \
        if (mt_cuda_err_ != cudaSuccess)                                                      \
            mt_fatal_at(__FILE__, __LINE__,                                                   \
                        mt_cuda_err_ == cudaErrorMemoryAllocation ? MT_EXIT_OOM : MT_EXIT_ERROR, \
                        "CUDA error '%s' (%s) in `%s`; hint: %s",                             \
                        cudaGetErrorString(mt_cuda_err_), cudaGetErrorName(mt_cuda_err_),     \
                        #expr, mt_cuda_error_hint(mt_cuda_err_));                             \
    } while (0)

#define MT_CHECK_CUBLAS(expr)                                                                 \
    do {                                                                                      \
        cublasStatus_t mt_cublas_st_ = (expr);                                                \
        if (mt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                           \
            mt_fatal_at(__FILE__, __LINE__,                                                   \
                        mt_cublas_st_ == CUBLAS_STATUS_ALLOC_FAILED ? MT_EXIT_OOM : MT_EXIT_ERROR, \
                        "cuBLAS error '%s' (%d) in `%s`; hint: %s",                           \
                        cublasLtGetStatusString(mt_cublas_st_), (int)mt_cublas_st_, #expr,    \
                        mt_cublas_error_hint(mt_cublas_st_));                                 \
    } while (0)

// Needs <nccl.h>; kept a macro so that files without NCCL need not include it. Non-blocking
// communicators that expect ncclInProgress check it themselves.
#define MT_CHECK_NCCL(expr)                                                                   \
    do {                                                                                      \
        ncclResult_t mt_nccl_res_ = (expr);                                                   \
        if (mt_nccl_res_ != ncclSuccess)                                                      \
            mt_fatal_at(__FILE__, __LINE__, MT_EXIT_ERROR, "NCCL error '%s' (%d) in `%s`; hint: %s", \
                        ncclGetErrorString(mt_nccl_res_), (int)mt_nccl_res_, #expr,           \
                        mt_nccl_res_ == ncclSystemError                                       \
                            ? "a system call or network failed; rerun with NCCL_DEBUG=INFO"   \
                            : "rerun with NCCL_DEBUG=INFO (and check every rank reached this call)"); \
    } while (0)
