// tests/cudasim/cublaslt.cc — a cuBLASLt stand-in: the documented semantics of the calls
// moetrain makes, a reference GEMM behind them, and the documented refusals.
//
// D = alpha · op(A) · op(B) + beta · C, column-major (CUBLASLT_ORDER_COL; ORDER_ROW read as
// documented), with batches (BATCH_COUNT, STRIDED_BATCH_OFFSET), sums in double, the result
// rounded once to D's type. C is not read when beta == 0 (as BLAS promises), so a D buffer full
// of the emulator's NaN pattern works as output. The matmul is queued on its stream like a
// kernel and touches device memory only there.
//
// It checks what the caller controls: each descriptor and layout attribute set (type and size of
// the value), the type combination, the shapes against the transposes, leading dimensions,
// C/D agreement, the workspace against the preference, and the pointers' alignment against the
// alignment and types the algorithm was chosen for (cublasLtMatmulAlgoCheck judges the same for
// a cached algorithm on changed layouts). Rules cite the cuBLAS documentation
// (docs.nvidia.com/cuda/cublas, "cuBLASLt API Reference"). It does not model NVIDIA's kernels:
// their accumulation order, their speed, or which algorithms exist for which shapes.
//
// The grouped matmul (cuBLAS 13.4's header, marked experimental: core/cublaslt_grouped.h) as
// that header describes it: four grouped layouts of one group count, whose rows, cols and ld are
// int32 device arrays, and A, B, C, D passed as device arrays of per-group pointers. The arrays
// are read when the matmul runs on its stream, not when it is queued, as the library reads them
// on the device; a group whose shapes disagree is reported then. Scalars in device memory
// (CUBLASLT_POINTER_MODE_DEVICE) are read when the matmul runs too. The stand-in claims version
// 13.4.0 (CUDASIM_CUBLASLT_VERSION=N claims N: a library without the grouped matmul).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cublaslt_grouped.h"
#include "runtime.h"

namespace {

struct Layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t order = CUBLASLT_ORDER_COL;
    int32_t batch = 1;
    int64_t stride = 0;
    int groups = 0;  // > 0: a grouped layout; its shapes are the device arrays below
    const int32_t *g_rows = nullptr, *g_cols = nullptr, *g_ld = nullptr;
};
struct Desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t sm_target = 0;  // CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: kept, not used (a hint)
};
struct Pref {
    uint64_t max_ws = 0;
    uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: the documented default
};
const int ALGO_MAGIC = 0x5157u;  // in algo.data[0]: "chosen by this stand-in's heuristic"
// algo.data as int32 words: [0] the magic, [1..4] the alignments of A, B, C, D it was chosen for,
// [5..8] the types of A, B, C, D, [9] the compute type. A real cublasLtMatmulAlgo_t is bound to
// its type combination (cublasLtMatmulAlgoInit takes them), not to a problem size.
enum { ALGO_W_ALIGN = 1, ALGO_W_TYPES = 5, ALGO_W_COMPUTE = 9 };

cublasStatus_t refuse(cublasStatus_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t refuse(cublasStatus_t st, const char *fmt, ...) {
    if (getenv("CUDASIM_QUIET_CUBLAS")) return st;
    va_list ap;
    va_start(ap, fmt);
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudasim cuBLASLt: %s (%s)\n", msg,
            st == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED" : "CUBLAS_STATUS_INVALID_VALUE");
    return st;
}

// The set-attribute calls: "CUBLAS_STATUS_INVALID_VALUE: buf is NULL or sizeInBytes doesn't match
// the size of the internal storage for the selected attribute".
bool size_ok(size_t got, size_t want, const char *attr) {
    if (got == want) return true;
    refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: %zu bytes, the attribute holds %zu", attr, got, want);
    return false;
}

size_t type_size(cudaDataType_t t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: case CUDA_R_16F: return 2;
    case CUDA_R_64F: return 8;
    case CUDA_R_8I: return 1;
    case CUDA_R_32I: return 4;
    default: return 0;
    }
}
double load(const void *p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_64F: return ((const double *)p)[i];
    default: return 0;
    }
}
void store(void *p, cudaDataType_t t, size_t i, double v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    default: break;
    }
}
// Element (r, c) of a matrix with this layout, batch b.
size_t index(const Layout &l, uint64_t r, uint64_t c, int b) {
    const size_t base = (size_t)b * (size_t)l.stride;
    return base + (l.order == CUBLASLT_ORDER_ROW ? r * (size_t)l.ld + c : c * (size_t)l.ld + r);
}
// Bytes a matrix spans in memory, all batches.
size_t span_bytes(const Layout &l) {
    const size_t one = l.order == CUBLASLT_ORDER_ROW ? (l.rows - 1) * (size_t)l.ld + l.cols
                                                     : (l.cols - 1) * (size_t)l.ld + l.rows;
    return ((size_t)(l.batch - 1) * (size_t)l.stride + one) * type_size(l.type);
}

// "cublasLtMatmul(): Datatypes Supported" (the table of computeType, scaleType and
// Atype/Btype/Ctype/Dtype): with CUBLAS_COMPUTE_32F and scaleType CUDA_R_32F, A and B of one
// type among 16BF, 16F and 32F; C = D of that type, or 32F for 16BF/16F inputs.
bool types_supported(const Desc &d, cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cudaDataType_t dt) {
    if (d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_PEDANTIC) return false;
    if (d.scale != CUDA_R_32F || a != b || c != dt) return false;
    if (a == CUDA_R_16BF || a == CUDA_R_16F) return c == a || c == CUDA_R_32F;
    return a == CUDA_R_32F && c == CUDA_R_32F;
}

// Every rule the heuristic and the matmul share; returns SUCCESS or the status to give.
cublasStatus_t check_problem(const Desc &d, const Layout &A, const Layout &B, const Layout &C, const Layout &D) {
    // cublasLtMatmulDescAttributes_t, CUBLASLT_MATMUL_DESC_TRANSA/B: CUBLAS_OP_N or CUBLAS_OP_T
    // (CUBLAS_OP_C means T for real types).
    if (!types_supported(d, A.type, B.type, C.type, D.type))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "type combination compute=%d scale=%d A=%d B=%d C=%d D=%d is not in "
                      "the Datatypes Supported table of cublasLtMatmul()", (int)d.compute, (int)d.scale, (int)A.type,
                      (int)B.type, (int)C.type, (int)D.type);
    // Grouped: all four layouts grouped, one group count; their shapes are judged per group when
    // the matmul runs (they are on the device).
    if (A.groups || B.groups || C.groups || D.groups) {
        if (A.groups != D.groups || B.groups != D.groups || C.groups != D.groups)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "grouped matmul: A, B, C, D have %d, %d, %d, %d groups (all four "
                          "grouped layouts of one group count)", A.groups, B.groups, C.groups, D.groups);
        if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "grouped matmul: epilogue %u is not modelled", d.epilogue);
        return CUBLAS_STATUS_SUCCESS;
    }
    const bool ta = d.transa != CUBLAS_OP_N, tb = d.transb != CUBLAS_OP_N;
    const uint64_t m = ta ? A.cols : A.rows, k = ta ? A.rows : A.cols;
    const uint64_t kb = tb ? B.cols : B.rows, n = tb ? B.rows : B.cols;
    // cublasLtMatmul(): op(A) is m x k, op(B) k x n, C and D m x n.
    if (k != kb || D.rows != m || D.cols != n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "shapes disagree: op(A) %llu x %llu, op(B) %llu x %llu, D %llu x %llu",
                      (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb, (unsigned long long)n,
                      (unsigned long long)D.rows, (unsigned long long)D.cols);
    // cublasLtMatmul(): out-of-place C and D "must have the same data type, number of rows, number
    // of columns, batch size, and memory order"; the leading dimensions may differ.
    if (C.rows != D.rows || C.cols != D.cols || C.batch != D.batch || C.order != D.order)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "C and D layouts disagree on shape, batch or order");
    // cublasLtMatrixLayoutAttribute_t, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: A, B, C, D of one
    // batch count (A or B may be broadcast with a stride of 0).
    if (A.batch != D.batch || B.batch != D.batch)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "batch counts differ: A %d, B %d, D %d", A.batch, B.batch, D.batch);
    // cublasLtMatmulDescAttributes_t, CUBLASLT_MATMUL_DESC_EPILOGUE: a bias epilogue needs
    // CUBLASLT_MATMUL_DESC_BIAS_POINTER.
    if ((d.epilogue & CUBLASLT_EPILOGUE_BIAS) && !d.bias)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "a bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
    if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && d.epilogue != CUBLASLT_EPILOGUE_RELU &&
        d.epilogue != CUBLASLT_EPILOGUE_BIAS && d.epilogue != CUBLASLT_EPILOGUE_RELU_BIAS)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u: not modelled by the cudasim stand-in (the library "
                      "may support it; the stand-in says so rather than guess)", d.epilogue);
    return CUBLAS_STATUS_SUCCESS;
}

// One group's reference GEMM (the plain matmul's arithmetic), its layouts already resolved.
void gemm_ref(const Desc &D, const Layout &A, const Layout &B, const Layout &C, const Layout &Dl, float al, float be,
              const void *A_, const void *B_, const void *C_, void *D_) {
    const bool ta = D.transa != CUBLAS_OP_N, tb = D.transb != CUBLAS_OP_N;
    const uint64_t m = Dl.rows, n = Dl.cols, k = ta ? A.rows : A.cols;
    std::vector<double> opa(m * k), opb(n * k);
    for (uint64_t i = 0; i < m; i++)
        for (uint64_t p = 0; p < k; p++) opa[i * k + p] = load(A_, A.type, ta ? index(A, p, i, 0) : index(A, i, p, 0));
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t p = 0; p < k; p++) opb[j * k + p] = load(B_, B.type, tb ? index(B, j, p, 0) : index(B, p, j, 0));
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            double s = 0;
            for (uint64_t p = 0; p < k; p++) s += opa[i * k + p] * opb[j * k + p];
            float v = al * (float)s;
            if (be != 0) v += be * (float)load(C_, C.type, index(C, i, j, 0));
            store(D_, Dl.type, index(Dl, i, j, 0), v);
        }
}

// Group g's layout: the grouped one's type with its shapes read from the device arrays; p, its
// matrix, and its columns must be 16-byte aligned. The library documents no alignment for the
// groups' pointers, which it reads on the device and cannot choose a kernel by; 16 bytes is what
// its vector loads want and what NVIDIA's callers keep (cuBLAS's grouped GEMM faulted on less on
// an H100: docs/gpu-results.md), so the stand-in holds callers to it.
Layout group_layout(const Layout &l, int g, const void *p, char which) {
    Layout x{l.type, (uint64_t)l.g_rows[g], (uint64_t)l.g_cols[g], (int64_t)l.g_ld[g]};
    if (l.g_rows[g] < 0 || l.g_cols[g] < 0 || l.g_ld[g] < 0 || (uint64_t)l.g_ld[g] < x.rows)
        cudasim::fail("cuBLASLt grouped matmul: group %d's %c is %d x %d with ld %d (ld below rows, or negative)", g, which,
                      l.g_rows[g], l.g_cols[g], l.g_ld[g]);
    if ((uintptr_t)p % 16 || ((size_t)x.ld * type_size(x.type)) % 16)
        cudasim::fail("cuBLASLt grouped matmul: group %d's %c at %p with columns %lld bytes apart is not 16-byte aligned",
                      g, which, p, (long long)((size_t)x.ld * type_size(x.type)));
    return x;
}

// The grouped matmul: checks what the host can (the arrays of pointers are device memory), then
// queues the groups' GEMMs; shapes, pointers and device scalars are read when it runs.
cublasStatus_t grouped_matmul(const Desc D, const Layout A, const Layout B, const Layout C, const Layout Dl,
                              const void *alpha, const void *beta, const void *A_, const void *B_, const void *C_,
                              void *D_, cudaStream_t stream) {
    const size_t bytes = (size_t)Dl.groups * sizeof(void *);
    cudasim::lib_check_device(A_, bytes, "grouped A pointer array");
    cudasim::lib_check_device(B_, bytes, "grouped B pointer array");
    cudasim::lib_check_device(C_, bytes, "grouped C pointer array");
    cudasim::lib_check_device(D_, bytes, "grouped D pointer array");
    const bool dev = D.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
    if (dev) {
        cudasim::lib_check_device(alpha, 4, "alpha (device pointer mode)");
        cudasim::lib_check_device(beta, 4, "beta (device pointer mode)");
    }
    const float al_h = dev ? 0.0f : *(const float *)alpha, be_h = dev ? 0.0f : *(const float *)beta;
    cudasim::lib_enqueue(stream, "cublasLtMatmul (grouped)", [=] {
        const float al = dev ? *(const float *)alpha : al_h, be = dev ? *(const float *)beta : be_h;
        const void *const *pa = (const void *const *)A_, *const *pb = (const void *const *)B_;
        const void *const *pc = (const void *const *)C_;
        void *const *pd = (void *const *)D_;
        const bool ta = D.transa != CUBLAS_OP_N, tb = D.transb != CUBLAS_OP_N;
        for (int g = 0; g < Dl.groups; g++) {
            const Layout a = group_layout(A, g, pa[g], 'A'), b = group_layout(B, g, pb[g], 'B');
            const Layout c = group_layout(C, g, pc[g], 'C'), d = group_layout(Dl, g, pd[g], 'D');
            const uint64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
            const uint64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
            if (k != kb || d.rows != m || d.cols != n || c.rows != d.rows || c.cols != d.cols)
                cudasim::fail("cuBLASLt grouped matmul: group %d: op(A) %llu x %llu, op(B) %llu x %llu, C %llu x %llu, "
                              "D %llu x %llu", g, (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb,
                              (unsigned long long)n, (unsigned long long)c.rows, (unsigned long long)c.cols,
                              (unsigned long long)d.rows, (unsigned long long)d.cols);
            if (m == 0 || n == 0) continue;
            if (k) {
                cudasim::lib_check_device(pa[g], span_bytes(a), "grouped A");
                cudasim::lib_check_device(pb[g], span_bytes(b), "grouped B");
            }
            if (be != 0) cudasim::lib_check_device(pc[g], span_bytes(c), "grouped C");
            cudasim::lib_check_device(pd[g], span_bytes(d), "grouped D");
            gemm_ref(D, a, b, c, d, al, be, pa[g], pb[g], pc[g], pd[g]);
        }
    }, false);
    return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
    return a;
}

}  // namespace

extern "C" {

// The stand-in claims 13.4.0, the first version whose grouped matmul runs on Hopper (the
// emulated device's architecture), or CUDASIM_CUBLASLT_VERSION.
size_t cublasLtGetVersion(void) {
    const char *v = getenv("CUDASIM_CUBLASLT_VERSION");
    return v ? (size_t)strtoul(v, nullptr, 10) : 130400;
}

// cublasLtGroupedMatrixLayoutCreate (13.4's header): rows, cols, ld device arrays of `groups`
// int32 entries (CUBLASLT_GROUPED_MATRIX_LAYOUT_*_INTEGER_WIDTH's default), read at matmul time.
cublasStatus_t cublasLtGroupedMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, int groups,
                                                 const void *rows, const void *cols, const void *ld) {
    if (!l || groups < 1 || !rows || !cols || !ld)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtGroupedMatrixLayoutCreate: %d groups, or a NULL array", groups);
    if (!type_size(t)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtGroupedMatrixLayoutCreate: data type %d", (int)t);
    {
        cudasim::LibCall lock;
        cudasim::lib_check_device(rows, (size_t)groups * 4, "grouped layout rows array");
        cudasim::lib_check_device(cols, (size_t)groups * 4, "grouped layout cols array");
        cudasim::lib_check_device(ld, (size_t)groups * 4, "grouped layout ld array");
    }
    Layout *x = new Layout{t, 0, 0, 0};
    x->groups = groups;
    x->g_rows = (const int32_t *)rows, x->g_cols = (const int32_t *)cols, x->g_ld = (const int32_t *)ld;
    *l = (cublasLtMatrixLayout_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t) new int(1);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete (int *)h;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    default: return "CUBLAS_STATUS (cudasim: other)";
    }
}
const char *cublasLtGetStatusName(cublasStatus_t s) { return cublasLtGetStatusString(s); }

// cublasLtMatmulDescCreate(): computeType and scaleType; combinations are judged at matmul.
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t s) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    Desc *x = new Desc;
    x->compute = c;
    x->scale = s;
    *d = (cublasLtMatmulDesc_t)x;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete (Desc *)d;
    return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmulDescSetAttribute(): "CUBLAS_STATUS_INVALID_VALUE: buf is NULL or sizeInBytes
// doesn't match the size of the internal storage for the selected attribute".
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t dd, cublasLtMatmulDescAttributes_t a,
                                              const void *v, size_t n) {
    Desc *d = (Desc *)dd;
    if (!d || !v) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: NULL descriptor or buffer");
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        if (!size_ok(n, sizeof(int32_t), "TRANSA/B")) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t op;
        memcpy(&op, v, 4);
        // cublasOperation_t: N, T or C (C is T for real data).
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "transpose %d is not a cublasOperation_t", op);
        (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = op;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (!size_ok(n, sizeof(uint32_t), "EPILOGUE")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->epilogue, v, 4);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (!size_ok(n, sizeof(void *), "BIAS_POINTER")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, v, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: {  // a planning hint: the product is the same
        if (!size_ok(n, sizeof(int32_t), "SM_COUNT_TARGET")) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t sms;
        memcpy(&sms, v, 4);
        if (sms < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, "SM count target %d is negative", sms);
        d->sm_target = sms;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        if (!size_ok(n, sizeof(int32_t), "POINTER_MODE")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->pointer_mode, v, 4);
        if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST && d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "pointer mode %d: the stand-in models host and device scalars",
                          d->pointer_mode);
        return CUBLAS_STATUS_SUCCESS;
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matmul descriptor attribute %d is not modelled by cudasim", (int)a);
    }
}

// cublasLtMatrixLayoutCreate(): rows, cols, ld of a column-major matrix by default.
// cublasLtMatrixLayoutAttribute_t, CUBLASLT_MATRIX_LAYOUT_LD: "must be large enough so that
// matrix memory locations are not overlapping (e.g., greater or equal to
// CUBLASLT_MATRIX_LAYOUT_ROWS in case of CUBLASLT_ORDER_COL)". Judged at matmul time, since
// ORDER may still change; a negative ld is refused here.
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t r, uint64_t c, int64_t ld) {
    if (!l || ld < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: ld %lld", (long long)ld);
    if (!type_size(t)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutCreate: data type %d", (int)t);
    Layout *x = new Layout{t, r, c, ld};
    *l = (cublasLtMatrixLayout_t)x;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete (Layout *)l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t ll, cublasLtMatrixLayoutAttribute_t a,
                                                const void *v, size_t n) {
    Layout *l = (Layout *)ll;
    if (!l || !v) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute: NULL");
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
        if (!size_ok(n, 4, "ORDER")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->order, v, 4);
        // cublasLtOrder_t: the stand-in reads COL and ROW; the tiled orders are for int8/fp8 kernels.
        if (l->order != CUBLASLT_ORDER_COL && l->order != CUBLASLT_ORDER_ROW)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "order %d: only COL and ROW are modelled", l->order);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        if (!size_ok(n, 4, "BATCH_COUNT")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->batch, v, 4);
        if (l->batch < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "batch count %d", l->batch);
        return CUBLAS_STATUS_SUCCESS;
    // cublasLtMatrixLayoutAttribute_t: ROWS and COLS are uint64_t ("usually only values that can
    // be expressed as int32_t are supported"); what changes M of a cached layout per call.
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
    case CUBLASLT_MATRIX_LAYOUT_COLS: {
        if (!size_ok(n, 8, "ROWS/COLS")) return CUBLAS_STATUS_INVALID_VALUE;
        uint64_t x;
        memcpy(&x, v, 8);
        if (x > 0x7fffffffu) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s %llu does not fit int32_t",
                                           a == CUBLASLT_MATRIX_LAYOUT_ROWS ? "ROWS" : "COLS", (unsigned long long)x);
        (a == CUBLASLT_MATRIX_LAYOUT_ROWS ? l->rows : l->cols) = x;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        if (!size_ok(n, 8, "STRIDED_BATCH_OFFSET")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->stride, v, 8);
        return CUBLAS_STATUS_SUCCESS;
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "layout attribute %d is not modelled by cudasim", (int)a);
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t) new Pref;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete (Pref *)p;
    return CUBLAS_STATUS_SUCCESS;
}
// cublasLtMatmulPreferenceAttributes_t: MAX_WORKSPACE_BYTES is uint64_t; MIN_ALIGNMENT_*_BYTES
// are uint32_t ("Selecting a smaller value will exclude algorithms that can not work with
// matrix X that is not as strictly aligned as they need"; default 256).
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pp, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *v, size_t n) {
    Pref *p = (Pref *)pp;
    if (!p || !v) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceSetAttribute: NULL");
    switch ((int)a) {  // int: the grouped hints are not in these headers' enum
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (!size_ok(n, 8, "MAX_WORKSPACE_BYTES")) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, v, 8);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
        if (!size_ok(n, 4, "MIN_ALIGNMENT")) return CUBLAS_STATUS_INVALID_VALUE;
        uint32_t x;
        memcpy(&x, v, 4);
        if (!x || (x & (x - 1))) return refuse(CUBLAS_STATUS_INVALID_VALUE, "alignment %u is not a power of 2", x);
        p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = x;
        return CUBLAS_STATUS_SUCCESS;
    }
    case MT_LT_PREF_GROUPED_AVG_K:  // the grouped matmul's hints: int64_t, as NVIDIA's callers pass
    case MT_LT_PREF_GROUPED_AVG_ROWS:  // them (13.4's header says uint32_t; the stand-in takes what
    case MT_LT_PREF_GROUPED_AVG_COLS:  // the library is seen to take)
        return size_ok(n, 8, "GROUPED_AVERAGE_*") ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d is not modelled by cudasim", (int)a);
    }
}

// The leading dimensions, checked when the order is final.
static cublasStatus_t check_ld(const Layout &l, const char *name) {
    if (l.groups) return CUBLAS_STATUS_SUCCESS;  // per group, when the matmul runs
    const uint64_t need = l.order == CUBLASLT_ORDER_ROW ? l.cols : l.rows;
    if ((uint64_t)l.ld < need)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: ld %lld < %s %llu (CUBLASLT_MATRIX_LAYOUT_LD)", name,
                      (long long)l.ld, l.order == CUBLASLT_ORDER_ROW ? "cols" : "rows", (unsigned long long)need);
    return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmulAlgoGetHeuristic(): one algorithm when the problem is valid; its workspace fits
// the preference, and it remembers the alignments it was chosen for (algo.data).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pp, int req,
                                              cublasLtMatmulHeuristicResult_t *res, int *found) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!dd || !a || !b || !c || !d || !pp || !res || !found || req < 1)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: NULL argument or requestedAlgoCount < 1");
    *found = 0;
    const Desc &D = *(Desc *)dd;
    const Layout &A = *(Layout *)a, &B = *(Layout *)b, &C = *(Layout *)c, &Dl = *(Layout *)d;
    cublasStatus_t st = check_problem(D, A, B, C, Dl);
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(A, "A");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(B, "B");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(C, "C");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(Dl, "D");
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const Pref &P = *(Pref *)pp;
    // Every element access needs at least its own size of alignment: an algorithm for 16-bit
    // data cannot run on 1-byte-aligned pointers.
    const size_t es[4] = {type_size(A.type), type_size(B.type), type_size(C.type), type_size(Dl.type)};
    for (int i = 0; i < 4; i++)
        if (P.align[i] < es[i]) return CUBLAS_STATUS_SUCCESS;  // *found = 0: no algorithm
    memset(res, 0, sizeof *res);
    int32_t *w = (int32_t *)res->algo.data;
    w[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) w[ALGO_W_ALIGN + i] = (int32_t)P.align[i];
    const cudaDataType_t types[4] = {A.type, B.type, C.type, Dl.type};
    for (int i = 0; i < 4; i++) w[ALGO_W_TYPES + i] = (int32_t)types[i];
    w[ALGO_W_COMPUTE] = (int32_t)D.compute;
    res->workspaceSize = 0;  // the reference GEMM needs none (real algorithms may: MAX_WORKSPACE_BYTES caps them)
    res->state = CUBLAS_STATUS_SUCCESS;
    res->wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// An algorithm from this stand-in's heuristic, for these types: SUCCESS, or INVALID_VALUE as
// cublasLtMatmulAlgoCheck() documents ("matrix layout descriptors or operation descriptor don't
// match algo descriptor").
static cublasStatus_t algo_matches(const cublasLtMatmulAlgo_t *algo, const Desc &D, const Layout &A, const Layout &B,
                                   const Layout &C, const Layout &Dl, const char *who) {
    const int32_t *w = (const int32_t *)algo->data;
    if (w[0] != ALGO_MAGIC)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: algo was not returned by cublasLtMatmulAlgoGetHeuristic", who);
    const cudaDataType_t types[4] = {A.type, B.type, C.type, Dl.type};
    for (int i = 0; i < 4; i++)
        if (w[ALGO_W_TYPES + i] != (int32_t)types[i])
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: matrix %c has type %d, the algo was chosen for %d", who,
                          "ABCD"[i], (int)types[i], w[ALGO_W_TYPES + i]);
    if (w[ALGO_W_COMPUTE] != (int32_t)D.compute)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: compute type %d, the algo was chosen for %d", who, (int)D.compute,
                      w[ALGO_W_COMPUTE]);
    return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmulAlgoCheck(): the problem as the heuristic judges it, and the algo against the
// descriptors; result gets the workspace (none) and wave count, result->algo is left alone
// ("algo field is never updated"). CUDASIM_ALGOCHECK=refuse answers NOT_SUPPORTED for every
// valid call ("algo configuration ... is not currently supported on given device"), which a
// real device may say of an algorithm chosen for another M: it drives the caller's fallback.
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *res) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!dd || !a || !b || !c || !d || !algo || !res)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoCheck: NULL argument");
    const Desc &D = *(Desc *)dd;
    const Layout &A = *(Layout *)a, &B = *(Layout *)b, &C = *(Layout *)c, &Dl = *(Layout *)d;
    cublasStatus_t st = check_problem(D, A, B, C, Dl);
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(A, "A");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(B, "B");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(C, "C");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(Dl, "D");
    if (st == CUBLAS_STATUS_SUCCESS) st = algo_matches(algo, D, A, B, C, Dl, "cublasLtMatmulAlgoCheck");
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const char *mode = getenv("CUDASIM_ALGOCHECK");
    if (mode && !strcmp(mode, "refuse"))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoCheck: refused as CUDASIM_ALGOCHECK=refuse asks");
    const cublasLtMatmulAlgo_t keep = *algo;  // algo may point to res->algo
    memset(res, 0, sizeof *res);
    res->algo = keep;
    res->workspaceSize = 0;
    res->state = CUBLAS_STATUS_SUCCESS;
    res->wavesCount = 1.0f;
    return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmul(): checks, then the GEMM queued on the stream. alpha and beta are host
// scalars (CUBLASLT_POINTER_MODE_HOST), read now.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, const void *alpha, const void *A_,
                              cublasLtMatrixLayout_t a, const void *B_, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C_, cublasLtMatrixLayout_t c, void *D_, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
    cudasim::LibCall lock;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!dd || !a || !b || !c || !d || !alpha || !beta || !D_)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: NULL argument");
    const Desc D = *(Desc *)dd;  // copies: the caller may destroy the descriptors once queued
    const Layout A = *(Layout *)a, B = *(Layout *)b, C = *(Layout *)c, Dl = *(Layout *)d;
    cublasStatus_t st = check_problem(D, A, B, C, Dl);
    // The leading dimensions again: a cached layout's ROWS/COLS may have changed since the heuristic.
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(A, "A");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(B, "B");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(C, "C");
    if (st == CUBLAS_STATUS_SUCCESS) st = check_ld(Dl, "D");
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (Dl.groups) {  // A_..D_ are arrays of pointers: the alignments are the groups' matrices'
        if (algo && (st = algo_matches(algo, D, A, B, C, Dl, "cublasLtMatmul")) != CUBLAS_STATUS_SUCCESS) return st;
        return grouped_matmul(D, A, B, C, Dl, alpha, beta, A_, B_, C_, D_, stream);
    }
    if (algo) {
        const int32_t *w = (const int32_t *)algo->data;
        st = algo_matches(algo, D, A, B, C, Dl, "cublasLtMatmul");
        if (st != CUBLAS_STATUS_SUCCESS) return st;
        // An algorithm chosen under MIN_ALIGNMENT_X_BYTES = n may assume pointers aligned to n.
        const void *ptrs[4] = {A_, B_, C_, D_};
        const char *names = "ABCD";
        for (int i = 0; i < 4; i++)
            if (ptrs[i] && alignment_of(ptrs[i]) < (uint32_t)w[ALGO_W_ALIGN + i])
                return refuse(CUBLAS_STATUS_INVALID_VALUE, "matrix %c at %p is aligned to %u bytes, but the algorithm was "
                              "chosen for %d (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)", names[i], ptrs[i],
                              alignment_of(ptrs[i]), w[ALGO_W_ALIGN + i], names[i]);
    }
    (void)ws;
    (void)ws_bytes;  // the chosen algorithm needs no workspace (workspaceSize 0)
    const bool ta = D.transa != CUBLAS_OP_N, tb = D.transb != CUBLAS_OP_N;
    const uint64_t m = Dl.rows, n = Dl.cols, k = ta ? A.rows : A.cols;
    if (D.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "device scalars are modelled for the grouped matmul only");
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if (k) {
        cudasim::lib_check_device(A_, span_bytes(A), "A");
        cudasim::lib_check_device(B_, span_bytes(B), "B");
    }
    if (be != 0) cudasim::lib_check_device(C_, span_bytes(C), "C");
    cudasim::lib_check_device(D_, span_bytes(Dl), "D");
    cudasim::lib_enqueue(stream, "cublasLtMatmul", [=] {
        std::vector<double> opa(m * k), opb(n * k);  // op(A) by rows, op(B) by columns: both k-contiguous
        for (int bt = 0; bt < Dl.batch; bt++) {
            for (uint64_t i = 0; i < m; i++)
                for (uint64_t p = 0; p < k; p++)
                    opa[i * k + p] = load(A_, A.type, ta ? index(A, p, i, bt) : index(A, i, p, bt));
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t p = 0; p < k; p++)
                    opb[j * k + p] = load(B_, B.type, tb ? index(B, j, p, bt) : index(B, p, j, bt));
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t i = 0; i < m; i++) {
                    const double *x = &opa[i * k], *y = &opb[j * k];
                    double s = 0;
                    for (uint64_t p = 0; p < k; p++) s += x[p] * y[p];
                    // D = alpha (AB) + beta C, in fp32 as CUBLAS_COMPUTE_32F with an fp32 scale
                    float v = al * (float)s;
                    if (be != 0) v += be * (float)load(C_, C.type, index(C, i, j, bt));
                    if (D.epilogue & CUBLASLT_EPILOGUE_BIAS) v += (float)load(D.bias, Dl.type == CUDA_R_32F ? CUDA_R_32F : Dl.type, i);
                    if (D.epilogue == CUBLASLT_EPILOGUE_RELU || D.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS) v = v > 0 ? v : 0;
                    store(D_, Dl.type, index(Dl, i, j, bt), v);
                }
        }
    }, false);
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
