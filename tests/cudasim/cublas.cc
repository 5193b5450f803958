// tests/cudasim/cublas.cc — a cuBLAS stand-in for the one cuBLAS (not cuBLASLt) routine moetrain
// calls, cublasGemmGroupedBatchedEx, and the handle calls around it: the documented checks and a
// reference GEMM queued on the handle's stream.
//
// cuBLAS documentation (docs.nvidia.com/cuda/cublas), "cublasGemmGroupedBatchedEx()":
//   for each group i and each of its group_size[i] problems: C = alpha_i·op(A)·op(B) + beta_i·C,
//   column-major, op(A) m_i × k_i, op(B) k_i × n_i; transa_array .. ldc_array, alpha_array and
//   beta_array are host arrays of group_count entries (CUBLAS_POINTER_MODE_HOST); Aarray, Barray
//   and Carray are device arrays of problem_count device pointers, read when the call runs on
//   the stream; "CUBLAS_STATUS_INVALID_VALUE: the parameters m_array[i], n_array[i],
//   k_array[i], group_size[i] < 0, or lda_array[i] < max(1, m_array[i]) if transa_array[i] ==
//   CUBLAS_OP_N and lda_array[i] < max(1, k_array[i]) otherwise, or ldb ... < max(1, k) if N,
//   max(1, n) otherwise, or ldc_array[i] < max(1, m_array[i])"; the type table of the routine
//   (here: A = B = CUDA_R_16BF, C = CUDA_R_16BF or CUDA_R_32F, CUBLAS_COMPUTE_32F; the float
//   alpha and beta of that compute type). It does not model NVIDIA's kernels.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime.h"

namespace {

struct Handle {
    cudaStream_t stream = nullptr;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
    int sm_target = 0;  // cublasSetSmCountTarget: kept, not used (a hint)
};

cublasStatus_t refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
cublasStatus_t refuse(const char *fmt, ...) {
    if (getenv("CUDASIM_QUIET_CUBLAS")) return CUBLAS_STATUS_INVALID_VALUE;
    va_list ap;
    va_start(ap, fmt);
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudasim cuBLAS: %s (CUBLAS_STATUS_INVALID_VALUE)\n", msg);
    return CUBLAS_STATUS_INVALID_VALUE;
}

double load(const void *p, cudaDataType_t t, size_t i) {
    return t == CUDA_R_32F ? ((const float *)p)[i] : __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
void store(void *p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}
size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// Bytes a column-major rows × cols matrix with leading dimension ld spans.
size_t span(uint64_t rows, uint64_t cols, int64_t ld, cudaDataType_t t) {
    return rows && cols ? ((cols - 1) * (size_t)ld + rows) * type_size(t) : 0;
}

struct Group {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, size;
    float alpha, beta;
};

// C = alpha·op(A)·op(B) + beta·C of one problem (column-major), its operands checked as device memory.
void gemm(const Group &g, const void *A, cudaDataType_t Atype, const void *B, cudaDataType_t Btype, void *C,
          cudaDataType_t Ctype, const char *who) {
    if (g.m == 0 || g.n == 0) return;
    const std::string w(who);
    const uint64_t ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    const uint64_t br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    if (g.k) {
        cudasim::lib_check_device(A, span(ar, ac, g.lda, Atype), (w + " A").c_str());
        cudasim::lib_check_device(B, span(br, bc, g.ldb, Btype), (w + " B").c_str());
    }
    cudasim::lib_check_device(C, span((uint64_t)g.m, (uint64_t)g.n, g.ldc, Ctype), (w + " C").c_str());
    for (int c = 0; c < g.n; c++)
        for (int r = 0; r < g.m; r++) {
            double s = 0;
            for (int q = 0; q < g.k; q++) {
                double a = load(A, Atype, g.ta == CUBLAS_OP_N ? (size_t)q * g.lda + r : (size_t)r * g.lda + q);
                double b = load(B, Btype, g.tb == CUBLAS_OP_N ? (size_t)c * g.ldb + q : (size_t)q * g.ldb + c);
                s += a * b;
            }
            const size_t ci = (size_t)c * g.ldc + r;
            float v = g.alpha * (float)s;  // C is not read when beta == 0 (BLAS's promise)
            if (g.beta != 0) v += g.beta * (float)load(C, Ctype, ci);
            store(C, Ctype, ci, v);
        }
}

// The checks both routines make of one group's shape: "", or what is wrong.
std::string shape_error(const Group &g) {
    char msg[256];
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.size < 0)
        return snprintf(msg, sizeof msg, "m %d, n %d, k %d, group_size %d: none may be negative", g.m, g.n, g.k, g.size), msg;
    const int arows = g.ta == CUBLAS_OP_N ? g.m : g.k, brows = g.tb == CUBLAS_OP_N ? g.k : g.n;
    if (g.lda < (arows > 1 ? arows : 1) || g.ldb < (brows > 1 ? brows : 1) || g.ldc < (g.m > 1 ? g.m : 1))
        return snprintf(msg, sizeof msg, "lda %d, ldb %d, ldc %d below the rows of A (%d), B (%d), C (%d) as stored",
                        g.lda, g.ldb, g.ldc, arows, brows, g.m), msg;
    if ((g.ta != CUBLAS_OP_N && g.ta != CUBLAS_OP_T) || (g.tb != CUBLAS_OP_N && g.tb != CUBLAS_OP_T))
        return snprintf(msg, sizeof msg, "transa %d, transb %d: N or T for real types", (int)g.ta, (int)g.tb), msg;
    return "";
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = (cublasHandle_t) new Handle();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete (Handle *)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    ((Handle *)h)->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

// "cublasSetSmCountTarget()": the SMs its kernels plan for, 0 for the device's; a hint that
// changes no product.
cublasStatus_t cublasSetSmCountTarget(cublasHandle_t h, int sms) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (sms < 0) return refuse("cublasSetSmCountTarget: %d is negative", sms);
    ((Handle *)h)->sm_target = sms;
    return CUBLAS_STATUS_SUCCESS;
}

// "cublasSetWorkspace(): ... workspace must be aligned to at least 256 bytes".
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && ((uintptr_t)ws % 256)) return refuse("cublasSetWorkspace: workspace %p not aligned to 256 bytes", ws);
    if (bytes) cudasim::lib_check_device(ws, bytes, "cublasSetWorkspace workspace");
    ((Handle *)h)->workspace = ws, ((Handle *)h)->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void *alpha_array,
                                          const void *const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void *beta_array, void *const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (group_count < 0) return refuse("cublasGemmGroupedBatchedEx: group_count %d < 0", group_count);
    if (group_count == 0) return CUBLAS_STATUS_SUCCESS;
    // The routine's type table has A = B = C; cuBLAS 13.1 on the H100 answered an f32 C with
    // CUBLAS_STATUS_NOT_SUPPORTED (2026-11-27).
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_16BF || computeType != CUBLAS_COMPUTE_32F) {
        refuse("cublasGemmGroupedBatchedEx: types A %d, B %d, C %d, compute %d: not a combination this "
               "stand-in accepts (bf16 x bf16 -> bf16, CUBLAS_COMPUTE_32F)",
               (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array || !beta_array ||
        !lda_array || !ldb_array || !ldc_array || !group_size || !Aarray || !Barray || !Carray)
        return refuse("cublasGemmGroupedBatchedEx: NULL array argument");
    std::vector<Group> groups((size_t)group_count);
    int64_t problems = 0;
    for (int i = 0; i < group_count; i++) {
        Group &g = groups[(size_t)i];
        g.ta = transa_array[i], g.tb = transb_array[i];
        g.m = m_array[i], g.n = n_array[i], g.k = k_array[i];
        g.lda = lda_array[i], g.ldb = ldb_array[i], g.ldc = ldc_array[i], g.size = group_size[i];
        g.alpha = ((const float *)alpha_array)[i], g.beta = ((const float *)beta_array)[i];
        const std::string why = shape_error(g);
        if (!why.empty()) return refuse("cublasGemmGroupedBatchedEx: group %d: %s", i, why.c_str());
        problems += g.size;
    }
    // The pointer arrays live in device memory: a host array here is the caller's bug.
    cudasim::lib_check_device(Aarray, (size_t)problems * sizeof(void *), "cublasGemmGroupedBatchedEx Aarray");
    cudasim::lib_check_device(Barray, (size_t)problems * sizeof(void *), "cublasGemmGroupedBatchedEx Barray");
    cudasim::lib_check_device(Carray, (size_t)problems * sizeof(void *), "cublasGemmGroupedBatchedEx Carray");
    const cudaStream_t stream = ((Handle *)h)->stream;
    cudasim::lib_enqueue(stream, "cublasGemmGroupedBatchedEx", [=] {
        int64_t p = 0;
        for (const Group &g : groups)
            for (int j = 0; j < g.size; j++, p++) {
                const void *A = Aarray[p], *B = Barray[p];
                void *C = Carray[p];
                if (g.m == 0 || g.n == 0) continue;
                // The pointers are read on the device, where no kernel can be chosen by them: on the
                // H100 one not 16-byte aligned faulted ('misaligned address', 2026-11-27).
                if (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) % 16)
                    cudasim::fail("cublasGemmGroupedBatchedEx: problem %lld: A %p, B %p or C %p not 16-byte aligned",
                                       (long long)p, A, B, C);
                gemm(g, A, Atype, B, Btype, C, Ctype, "cublasGemmGroupedBatchedEx");
            }
    }, false);
    return CUBLAS_STATUS_SUCCESS;
}

// "cublasGemmEx()": one problem, pointers and scalars from the host; bf16 x bf16 -> bf16 or f32
// with CUBLAS_COMPUTE_32F (rows of its type table); the algorithm a hint.
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || (Ctype != CUDA_R_16BF && Ctype != CUDA_R_32F) ||
        computeType != CUBLAS_COMPUTE_32F) {
        refuse("cublasGemmEx: types A %d, B %d, C %d, compute %d: not a combination this stand-in accepts "
               "(bf16 x bf16 -> bf16|f32, CUBLAS_COMPUTE_32F)", (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!alpha || !beta) return refuse("cublasGemmEx: NULL alpha or beta");
    Group g;
    g.ta = transa, g.tb = transb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.size = 1;
    g.alpha = *(const float *)alpha, g.beta = *(const float *)beta;
    const std::string why = shape_error(g);
    if (!why.empty()) return refuse("cublasGemmEx: %s", why.c_str());
    cudasim::lib_enqueue(((Handle *)h)->stream, "cublasGemmEx", [=] { gemm(g, A, Atype, B, Btype, C, Ctype, "cublasGemmEx"); }, false);
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
