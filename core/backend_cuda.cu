// core/backend_cuda.cu — the CUDA backend: one GPU, one stream, cuBLASLt for matmul.
//
// Memory is plain cudaMalloc (the ledger reservation is made by the caller, mt_backend_alloc).
// Matmul: row-major c [M, N] = alpha · op(a) · op(b) + beta · c, fp32 accumulation
// (CUBLAS_COMPUTE_32F, never TF32). cuBLASLt is column-major, so we ask it for
// c^T [N, M] = op(b)^T · op(a)^T: a row-major matrix read column-major is its transpose, so
// cuBLASLt's "A" is our b and its "B" is our a, each with its own transpose flag; nothing is
// copied or transposed in memory. Descriptors and the chosen algorithm are cached in a small
// LRU table keyed on (bucket(M), N, bucket(K), row strides, transposes, dtypes, pointer
// alignment), where bucket(x) is the next power of two: an expert's token count changes every
// step, as M of its forward and dx GEMMs and as K of its weight (LoRA) gradients, and an exact
// key re-planned nearly every call. The heuristic picks the algorithm for the buckets' largest
// M and K (capped by the row strides that bound them); each call sets the real M and K on the
// plan's layouts and has cuBLASLt check the algorithm for them (cublasLtMatmulAlgoCheck), falling
// back to a fresh heuristic for that call on a refusal.
// One workspace is allocated at creation through the ledger under `work`.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_check.h"  // first: it makes core/common.h digestible for nvcc
#include "core/backend.h"
#include "core/common.h"
#include "core/profile.h"

enum {
    CUDA_WORKSPACE_BYTES = 32 << 20,  // cuBLASLt workspace (Hopper kernels want up to 32 MiB)
    // Cached matmul plans; the least recently used is evicted. A step of the tiny test model
    // meets ~100 distinct keys (every call site × buckets of M and K): 64 slots thrashed, every
    // step re-planned. A plan is a few hundred bytes of host memory.
    CUDA_PLAN_SLOTS = 512,
};

// ---------------------------------------------------------------------------------------------
// State

// What a cached plan is valid for. m_bucket, k_bucket: the next power of two ≥ M, ≥ K. Powers
// of two because cuBLASLt's tiles are too (64, 128, 256 rows): within one octave the heuristic's
// choice is mostly the same tile, while M = 1..300 needs only 10 plans; a finer geometric bucket
// would cost more heuristic calls for choices that rarely differ (and the per-call check catches
// those that do). A fixed K is planned exactly whenever a dense operand's row stride is K.
typedef struct {
    int64_t m_bucket, n, k_bucket;
    int64_t lda, ldb, ldc;  // row strides (elements)
    int trans_a, trans_b;
    mt_dtype ta, tb, tc;
    uint32_t align_a, align_b, align_c;  // pointer alignment the chosen algorithm may assume (≤ 16)
    int32_t sm_target;                   // SMs the heuristic plans for; 0: the device's (cuda_ctx)
} matmul_key;

typedef struct {
    matmul_key key;
    uint64_t hash;  // of key, compared first: a lookup scans every slot
    int used;
    uint64_t last_use;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lay_b;  // cuBLASLt's A: our b, read column-major
    cublasLtMatrixLayout_t lay_a;  // cuBLASLt's B: our a, read column-major
    cublasLtMatrixLayout_t lay_c;  // C and D: our c, read column-major ([N, M], ld N)
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo;   // the heuristic's choice for (m_plan, k_plan)
    int64_t m_plan, k_plan;      // what the heuristic saw: the buckets' tops, capped by row strides
    int64_t m_set, k_set;        // what the layouts describe now
    int64_t m_checked, k_checked;  // the last (M, K) cublasLtMatmulAlgoCheck accepted `algo` for
} matmul_plan;

typedef struct {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    matmul_plan plans[CUDA_PLAN_SLOTS];
    uint64_t clock;  // ticks once per matmul, for LRU eviction
    uint64_t plans_built;     // heuristic runs that filled a cache slot (mt_cuda_matmul_plans_built)
    uint64_t algo_fallbacks;  // calls whose cached algorithm cuBLASLt refused for the real M
    // mt_cuda_mem_peak_start/stop: the driver's used memory sampled after every allocation (it
    // only grows there), so the ledger's peak can be checked against what the device really held.
    int sample_used;
    size_t used_peak;
    // Stream-ordered allocation (cudaMallocAsync/cudaFreeAsync on `stream`) where the device has
    // memory pools: a free does not stall the device the way cudaFree does, which matters for
    // the step's many short-lived work buffers. The device's default pool gets a release
    // threshold of UINT64_MAX: freed memory stays in the pool for the next allocation instead of
    // going back to the driver at every synchronisation (and coming back through the OS on the
    // next step). So the driver's used memory is the pool's high-water mark, not the ledger's
    // current count; cudaMemPoolTrimTo(pool, 0) hands the unused part back (an allocation
    // refused for lack of memory does that and retries once). Memory used on another stream
    // (NCCL's) is ordered by the comm's events.
    int async_alloc;
    cudaMemPool_t pool;  // the device's default pool, when async_alloc
    cudaStream_t side;   // a second stream, made on first use (mt_cuda_backend_side_stream)
    cublasHandle_t blas; // cuBLAS (its grouped GEMM), made on first use, sharing `workspace`
    int sm_count;        // the device's multiprocessors
    int sm_target;       // what the GEMMs plan for (mt_cuda_gemm_sm_reserve); 0: sm_count
    // mt_download_begin/end: a pinned staging buffer (a copy into pageable memory would return
    // only once the stream's work before it is done), the event after the copy, the pending one.
    void *stage;
    size_t stage_bytes, stage_pending;
    void *stage_dst;
    cudaEvent_t staged;
} cuda_ctx;

// Makes the backend's device current (cheap when it already is) and returns its state.
static cuda_ctx *cuda_enter(mt_backend *be) {
    cuda_ctx *cx = (cuda_ctx *)be->ctx;
    int cur = -1;
    MT_CHECK_CUDA(cudaGetDevice(&cur));
    if (cur != cx->device) MT_CHECK_CUDA(cudaSetDevice(cx->device));
    return cx;
}

// ---------------------------------------------------------------------------------------------
// Memory

static int cuda_alloc(mt_backend *be, size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return 0;
    cuda_ctx *cx = cuda_enter(be);
    cudaError_t e = cx->async_alloc ? cudaMallocAsync(out, bytes, cx->stream) : cudaMalloc(out, bytes);
    if (e == cudaErrorMemoryAllocation && cx->async_alloc) {
        // The pool may hold freed memory in pieces too small for this request: wait for the frees
        // queued on the stream, give every unused byte back to the driver and ask once more.
        (void)cudaGetLastError();
        MT_CHECK_CUDA(cudaStreamSynchronize(cx->stream));
        be->host_syncs++;
        MT_CHECK_CUDA(cudaMemPoolTrimTo(cx->pool, 0));
        e = cudaMallocAsync(out, bytes, cx->stream);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
        *out = NULL;
        size_t free_b = 0, total_b = 0;
        MT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
        mt_error_set("cuda backend: out of device memory on GPU %d: asked %zu bytes (%.3f GiB); "
                     "ledger: %llu bytes reserved and a peak of %llu, both counting this request; "
                     "driver: %zu bytes free of %zu (%.3f of %.3f GiB)",
                     cx->device, bytes, bytes / 1073741824.0,
                     (unsigned long long)be->ledger.total_cur,
                     (unsigned long long)be->ledger.total_peak, free_b, total_b,
                     free_b / 1073741824.0, total_b / 1073741824.0);
        return -1;
    }
    MT_CHECK_CUDA(e);
    if (cx->sample_used) {
        size_t free_b = 0, total_b = 0;
        MT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
        cx->used_peak = MT_MAX(cx->used_peak, total_b - free_b);
    }
    return 0;
}

static void cuda_free(mt_backend *be, void *ptr) {
    if (!ptr) return;
    cuda_ctx *cx = cuda_enter(be);
    if (cx->async_alloc) MT_CHECK_CUDA(cudaFreeAsync(ptr, cx->stream));  // after the work queued on it
    else MT_CHECK_CUDA(cudaFree(ptr));
}

// Returns once host_src may be reused: pageable memory is staged by the driver before
// cudaMemcpyAsync returns; pinned or managed memory is read later, so we wait for it.
static void cuda_upload(mt_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return;
    cuda_ctx *cx = cuda_enter(be);
    MT_CHECK_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cx->stream));
    cudaPointerAttributes attr;
    MT_CHECK_CUDA(cudaPointerGetAttributes(&attr, host_src));
    if (attr.type != cudaMemoryTypeUnregistered) {
        MT_CHECK_CUDA(cudaStreamSynchronize(cx->stream));
        be->host_syncs++;
    }
}

static void cuda_download(mt_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    cuda_ctx *cx = cuda_enter(be);
    if (mt_prof_active) mt_prof_wait_begin((double)bytes);  // the copy and the wait: the host's
    MT_CHECK_CUDA(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    MT_CHECK_CUDA(cudaStreamSynchronize(cx->stream));
    if (mt_prof_active) mt_prof_wait_end();
    be->host_syncs++;
}

extern "C" void mt_cuda_download_begin(mt_backend *be, void *host_dst, const void *src, size_t bytes) {
    cuda_ctx *cx = cuda_enter(be);
    if (cx->stage_pending) mt_fatal(MT_EXIT_ERROR, "cuda: a download begun before the previous one ended");
    if (bytes == 0) return;
    if (bytes > cx->stage_bytes) {  // no copy is pending: the old buffer is free
        if (cx->stage) MT_CHECK_CUDA(cudaFreeHost(cx->stage));
        cx->stage = NULL, cx->stage_bytes = 0;
        MT_CHECK_CUDA(cudaMallocHost(&cx->stage, bytes));
        cx->stage_bytes = bytes;
    }
    if (!cx->staged) MT_CHECK_CUDA(cudaEventCreateWithFlags(&cx->staged, cudaEventDisableTiming));
    MT_CHECK_CUDA(cudaMemcpyAsync(cx->stage, src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    MT_CHECK_CUDA(cudaEventRecord(cx->staged, cx->stream));
    cx->stage_dst = host_dst, cx->stage_pending = bytes;
}

extern "C" void mt_cuda_download_end(mt_backend *be) {
    cuda_ctx *cx = cuda_enter(be);
    if (!cx->stage_pending) return;
    if (mt_prof_active) mt_prof_wait_begin((double)cx->stage_pending);  // the wait only: the copy ran in order
    MT_CHECK_CUDA(cudaEventSynchronize(cx->staged));
    if (mt_prof_active) mt_prof_wait_end();
    memcpy(cx->stage_dst, cx->stage, cx->stage_pending);
    cx->stage_pending = 0;
    be->host_syncs++;
}

static void cuda_fill_zero(mt_backend *be, void *dst, size_t bytes) {
    if (bytes == 0) return;
    cuda_ctx *cx = cuda_enter(be);
    MT_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, cx->stream));
}

static void cuda_copy(mt_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    cuda_ctx *cx = cuda_enter(be);
    MT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
}

static void scale_cuda(cuda_ctx *cx, void *x, mt_dtype t, size_t n, float s);

static void cuda_copy2d(mt_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows);
static void cuda_scale_op(mt_backend *be, void *x, mt_dtype dtype, size_t n, float s) {
    if (n) scale_cuda(cuda_enter(be), x, dtype, n, s);
}

static void cuda_synchronize(mt_backend *be) {
    cuda_ctx *cx = cuda_enter(be);
    if (mt_prof_active) mt_prof_wait_begin(0);
    MT_CHECK_CUDA(cudaStreamSynchronize(cx->stream));
    if (mt_prof_active) mt_prof_wait_end();
    be->host_syncs++;
}

extern "C" void mt_cuda_backend_sync(mt_backend *be) { cuda_synchronize(be); }

// ---------------------------------------------------------------------------------------------
// Kernels

static __device__ float to_f32(float x) { return x; }
static __device__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ float to_f32(__half x) { return __half2float(x); }
template <typename T> static __device__ T from_f32(float x);
template <> __device__ float from_f32<float>(float x) { return x; }
template <> __device__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __half from_f32<__half>(float x) { return __float2half(x); }

// x [n] *= s, in place (matmul with K = 0: c = beta · c).
template <typename T> static __global__ void scale_kernel(T *x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = from_f32<T>(to_f32(x[i]) * s);
}

// A column block: rows of `width` words (T: the widest word every pitch and address divides into).
template <typename T>
static __global__ void copy2d_kernel(T *dst, size_t dpitch, const T *src, size_t spitch, size_t width, size_t rows) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * width;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i / width * dpitch + i % width] = src[i / width * spitch + i % width];
}

// ---------------------------------------------------------------------------------------------
// Launchers

static void scale_cuda(cuda_ctx *cx, void *x, mt_dtype t, size_t n, float s) {
    if (n == 0) return;
    unsigned block = 256, grid = (unsigned)MT_MIN((n + block - 1) / block, (size_t)4096);
    switch (t) {
    case MT_F32: scale_kernel<<<grid, block, 0, cx->stream>>>((float *)x, n, s); break;
    case MT_BF16: scale_kernel<<<grid, block, 0, cx->stream>>>((__nv_bfloat16 *)x, n, s); break;
    case MT_F16: scale_kernel<<<grid, block, 0, cx->stream>>>((__half *)x, n, s); break;
    default: mt_fatal(MT_EXIT_ERROR, "cuda scale: dtype %s", mt_dtype_name(t));
    }
    MT_CHECK_CUDA(cudaGetLastError());
}

// One kernel, not a cudaMemcpy per row: in words of 4 or 2 bytes where everything aligns.
static void cuda_copy2d(mt_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows) {
    if (!width || !rows) return;
    cuda_ctx *cx = cuda_enter(be);
    size_t all = dpitch | spitch | width | (size_t)(uintptr_t)dst | (size_t)(uintptr_t)src;
    size_t w = all % 4 == 0 ? 4 : all % 2 == 0 ? 2 : 1, n = rows * (width / w);
    unsigned block = 256, grid = (unsigned)MT_MIN((n + block - 1) / block, (size_t)4096);
    if (w == 4)
        copy2d_kernel<<<grid, block, 0, cx->stream>>>((uint32_t *)dst, dpitch / 4, (const uint32_t *)src, spitch / 4,
                                                      width / 4, rows);
    else if (w == 2)
        copy2d_kernel<<<grid, block, 0, cx->stream>>>((uint16_t *)dst, dpitch / 2, (const uint16_t *)src, spitch / 2,
                                                      width / 2, rows);
    else
        copy2d_kernel<<<grid, block, 0, cx->stream>>>((uint8_t *)dst, dpitch, (const uint8_t *)src, spitch, width, rows);
    MT_CHECK_CUDA(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// Matmul through cuBLASLt

static cudaDataType_t cuda_dtype(mt_dtype t) {
    switch (t) {
    case MT_BF16: return CUDA_R_16BF;
    case MT_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

// bf16 × bf16 → bf16 or f32, f16 × f16 → f16 or f32, f32 × f32 → f32 (the combinations cuBLASLt
// runs with CUBLAS_COMPUTE_32F and an fp32 scale).
static int matmul_dtypes_ok(mt_dtype a, mt_dtype b, mt_dtype c) {
    if (a != b) return 0;
    if (a == MT_BF16 || a == MT_F16) return c == a || c == MT_F32;
    return a == MT_F32 && c == MT_F32;
}

// The pointer's alignment as the algorithm may assume it, capped at 16 bytes: cuBLASLt's kernels
// load at most 16 bytes at a time, so nothing is gained above it, and uncapped a buffer's rows
// at different offsets (an expert's rows inside the permuted buffer) would split one shape into
// several plans. PyTorch caps the same way (aten/src/ATen/cuda/CUDABlas.cpp, _getAlignment).
static uint32_t ptr_alignment(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 16;
    while (a > 1 && (u & (a - 1))) a >>= 1;
    return a;
}

// FNV-1a over the key's bytes (the key is zeroed before it is filled, padding included).
static uint64_t key_hash(const matmul_key *k) {
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int key_equal(const matmul_key *x, const matmul_key *y) {
    return x->m_bucket == y->m_bucket && x->n == y->n && x->k_bucket == y->k_bucket && x->lda == y->lda && x->ldb == y->ldb &&
           x->ldc == y->ldc && x->trans_a == y->trans_a &&
           x->trans_b == y->trans_b && x->ta == y->ta && x->tb == y->tb && x->tc == y->tc &&
           x->align_a == y->align_a && x->align_b == y->align_b && x->align_c == y->align_c &&
           x->sm_target == y->sm_target;
}

static void plan_destroy(matmul_plan *p) {
    if (!p->used) return;
    MT_CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(p->pref));
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(p->lay_c));
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(p->lay_a));
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(p->lay_b));
    MT_CHECK_CUBLAS(cublasLtMatmulDescDestroy(p->desc));
    memset(p, 0, sizeof *p);
}

// The heuristic's best algorithm for p's descriptors as they stand (M, K = p->m_set, k_set).
// 0 with *algo; 1 when cuBLASLt has none (the error set); a failing call is fatal.
static int plan_heuristic(cuda_ctx *cx, const matmul_plan *p, cublasLtMatmulAlgo_t *algo) {
    const matmul_key *k = &p->key;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cx->lt, p->desc, p->lay_b, p->lay_a, p->lay_c,
                                                       p->lay_c, p->pref, 1, &res, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
        mt_error_set("cuda matmul: cuBLASLt has no algorithm for [%lld, %lld] x [%lld, %lld] "
                     "(trans_a=%d trans_b=%d, %s x %s -> %s, alignment %u/%u/%u bytes)",
                     (long long)p->m_set, (long long)p->k_set, (long long)p->k_set, (long long)k->n, k->trans_a,
                     k->trans_b, mt_dtype_name(k->ta), mt_dtype_name(k->tb), mt_dtype_name(k->tc),
                     k->align_a, k->align_b, k->align_c);
        return 1;
    }
    MT_CHECK_CUBLAS(st);
    *algo = res.algo;
    return 0;
}

// Rows and columns, column-major, of cuBLASLt's view of our a and b for M, K (a row-major
// [r, c] matrix is column-major [c, r]): a is [M, K] stored, or [K, M] when trans_a; b is [K, N],
// or [N, K] when trans_b.
static void a_dims(const matmul_key *k, int64_t m, int64_t kk, uint64_t *rows, uint64_t *cols) {
    *rows = (uint64_t)(k->trans_a ? m : kk), *cols = (uint64_t)(k->trans_a ? kk : m);
}
static void b_dims(const matmul_key *k, int64_t kk, uint64_t *rows, uint64_t *cols) {
    *rows = (uint64_t)(k->trans_b ? kk : k->n), *cols = (uint64_t)(k->trans_b ? k->n : kk);
}

static void layout_set_dims(cublasLtMatrixLayout_t l, uint64_t rows, uint64_t cols) {
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows));
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
}

// The layouts made to describe M = m, K = kk (c is [N, M] column-major).
static void plan_set_mk(matmul_plan *p, int64_t m, int64_t kk) {
    if (p->m_set == m && p->k_set == kk) return;
    uint64_t r, c;
    a_dims(&p->key, m, kk, &r, &c);
    layout_set_dims(p->lay_a, r, c);
    if (p->k_set != kk) {
        b_dims(&p->key, kk, &r, &c);
        layout_set_dims(p->lay_b, r, c);
    }
    if (p->m_set != m) layout_set_dims(p->lay_c, (uint64_t)p->key.n, (uint64_t)m);
    p->m_set = m, p->k_set = kk;
}

// Fills p for key k: descriptors, layouts, preference and the heuristic's best algorithm for
// the buckets' tops. A row stride bounds the dimension it strides over (a [K, M] stored with
// lda ≥ M, a [M, K] with lda ≥ K, b [N, K] with ldb ≥ K), so the planning M and K are capped by
// those (every M and K this key serves is): a dense operand's K is planned exactly. Returns 0,
// or -1 with an error when cuBLASLt has no algorithm for it (p left unused).
static int plan_build(cuda_ctx *cx, matmul_plan *p, const matmul_key *k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->m_plan = k->trans_a ? MT_MIN(k->m_bucket, k->lda) : k->m_bucket;
    p->k_plan = k->k_bucket;
    if (!k->trans_a) p->k_plan = MT_MIN(p->k_plan, k->lda);
    if (k->trans_b) p->k_plan = MT_MIN(p->k_plan, k->ldb);
    MT_CHECK_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t op_b = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's transa
    int32_t op_a = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's transb
    MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
    MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
    if (k->sm_target > 0)
        MT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &k->sm_target,
                                                       sizeof k->sm_target));

    // Leading dimension = the row stride of the row-major matrix.
    uint64_t ar, ac, br, bc;
    a_dims(k, p->m_plan, p->k_plan, &ar, &ac);
    b_dims(k, p->k_plan, &br, &bc);
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->lay_b, cuda_dtype(k->tb), br, bc, k->ldb));
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->lay_a, cuda_dtype(k->ta), ar, ac, k->lda));
    MT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->lay_c, cuda_dtype(k->tc), (uint64_t)k->n, (uint64_t)p->m_plan, k->ldc));
    p->m_set = p->m_plan, p->k_set = p->k_plan;

    MT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&p->pref));
    uint64_t ws = cx->workspace_bytes;
    MT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    // cuBLASLt's A/B are our b/a; C and D are both c.
    const struct { cublasLtMatmulPreferenceAttributes_t attr; uint32_t bytes; } aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k->align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k->align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k->align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k->align_c},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(aligns); i++)
        MT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(p->pref, aligns[i].attr, &aligns[i].bytes,
                                                             sizeof aligns[i].bytes));
    p->used = 1;  // from here on plan_destroy releases the descriptors
    if (plan_heuristic(cx, p, &p->algo) != 0) {
        plan_destroy(p);
        return -1;
    }
    p->m_checked = p->m_plan, p->k_checked = p->k_plan;
    cx->plans_built++;
    return 0;
}

// The cached plan for k, built on a miss into a free or the least recently used slot.
static matmul_plan *plan_get(cuda_ctx *cx, const matmul_key *k) {
    const uint64_t h = key_hash(k);
    matmul_plan *victim = &cx->plans[0];
    for (int i = 0; i < CUDA_PLAN_SLOTS; i++) {
        matmul_plan *p = &cx->plans[i];
        if (p->used && p->hash == h && key_equal(&p->key, k)) {
            p->last_use = ++cx->clock;
            return p;
        }
        if (!p->used) {
            if (victim->used) victim = p;
        } else if (victim->used && p->last_use < victim->last_use) {
            victim = p;
        }
    }
    plan_destroy(victim);
    if (plan_build(cx, victim, k) != 0) return NULL;
    victim->hash = h;
    victim->last_use = ++cx->clock;
    return victim;
}

// The algorithm for p at (M, K) = (m, kk), the layouts set to them: the cached one when cuBLASLt
// accepts it there with a workspace that fits ours (checked once per new (M, K)), else a fresh
// heuristic's choice for this call into *scratch. NULL with an error when cuBLASLt has none.
static const cublasLtMatmulAlgo_t *plan_algo_for(cuda_ctx *cx, matmul_plan *p, int64_t m, int64_t kk,
                                                 cublasLtMatmulAlgo_t *scratch) {
    plan_set_mk(p, m, kk);
    if (p->m_checked == m && p->k_checked == kk) return &p->algo;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    // Any refusal (INVALID_VALUE, NOT_SUPPORTED, ARCH_MISMATCH) means "the algo will not run".
    cublasStatus_t st = cublasLtMatmulAlgoCheck(cx->lt, p->desc, p->lay_b, p->lay_a, p->lay_c, p->lay_c,
                                                &p->algo, &res);
    if (st == CUBLAS_STATUS_SUCCESS && res.workspaceSize <= cx->workspace_bytes) {
        p->m_checked = m, p->k_checked = kk;
        return &p->algo;
    }
    cx->algo_fallbacks++;
    return plan_heuristic(cx, p, scratch) == 0 ? scratch : NULL;
}

// c [M, N] = alpha · op(a) [M, K] · op(b) [K, N] + beta · c, all row-major on this GPU.
static int cuda_matmul(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                       int trans_a, int trans_b, float alpha, float beta) {
    int64_t m, n, k;
    if (mt_matmul_shapes(c, a, b, trans_a, trans_b, &m, &n, &k) != 0) return -1;
    if (!matmul_dtypes_ok(a->dtype, b->dtype, c->dtype)) {
        mt_error_set("cuda matmul: unsupported dtypes %s x %s -> %s (supported: bf16 x bf16 -> bf16|f32, "
                     "f16 x f16 -> f16|f32, f32 x f32 -> f32)",
                     mt_dtype_name(a->dtype), mt_dtype_name(b->dtype), mt_dtype_name(c->dtype));
        return -1;
    }
    cuda_ctx *cx = cuda_enter(be);
    if (m == 0 || n == 0) return 0;
    be->device_ops++;
    if (k == 0) {  // an empty sum: c = beta · c (beta = 0 overwrites, as BLAS does)
        if (mt_tensor_ld(c) != n) {
            mt_error_set("cuda matmul: K = 0 into a strided c is not supported");
            return -1;
        }
        if (beta == 0.0f) MT_CHECK_CUDA(cudaMemsetAsync(c->data, 0, c->nbytes, cx->stream));
        else if (beta != 1.0f) scale_cuda(cx, c->data, c->dtype, (size_t)(m * n), beta);
        return 0;
    }
    if (mt_prof_active)  // 2·M·N·K; a, b read once, c written (and read when accumulated)
        mt_prof_count(2.0 * (double)m * (double)n * (double)k,
                      (double)mt_dtype_bytes(a->dtype, (size_t)(m * k)) + (double)mt_dtype_bytes(b->dtype, (size_t)(k * n)) +
                          (double)mt_dtype_bytes(c->dtype, (size_t)(m * n)) * (beta != 0.0f ? 2 : 1));
    matmul_key key;
    memset(&key, 0, sizeof key);
    key.m_bucket = key.k_bucket = 1;
    while (key.m_bucket < m) key.m_bucket <<= 1;
    while (key.k_bucket < k) key.k_bucket <<= 1;
    key.n = n;
    key.lda = mt_tensor_ld(a), key.ldb = mt_tensor_ld(b), key.ldc = mt_tensor_ld(c);
    key.trans_a = !!trans_a, key.trans_b = !!trans_b;
    key.ta = a->dtype, key.tb = b->dtype, key.tc = c->dtype;
    key.align_a = ptr_alignment(a->data), key.align_b = ptr_alignment(b->data);
    key.align_c = ptr_alignment(c->data);
    key.sm_target = cx->sm_target;
    matmul_plan *p = plan_get(cx, &key);
    if (!p) return -1;
    cublasLtMatmulAlgo_t fresh;
    const cublasLtMatmulAlgo_t *algo = plan_algo_for(cx, p, m, k, &fresh);
    if (!algo) return -1;
    MT_CHECK_CUBLAS(cublasLtMatmul(cx->lt, p->desc, &alpha, b->data, p->lay_b, a->data, p->lay_a, &beta,
                                   c->data, p->lay_c, c->data, p->lay_c, algo, cx->workspace,
                                   cx->workspace_bytes, cx->stream));
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Grouped GEMM (cuBLAS's cublasGemmGroupedBatchedEx): many small products in one call

// The problems' device pointers, written on the stream by a kernel that gets them as its
// parameter (6 KiB at most; kernel parameters may take 32 KiB since CUDA 12.1): no host buffer to
// keep alive, no pinned staging, no wait.
struct group_ptrs {
    const void *a[MT_GEMM_GROUP_MAX], *b[MT_GEMM_GROUP_MAX];
    void *c[MT_GEMM_GROUP_MAX];
};

static __global__ void group_ptrs_kernel(const __grid_constant__ group_ptrs P, int n, const void **out) {
    int i = threadIdx.x;
    if (i < n) out[i] = P.a[i], out[MT_GEMM_GROUP_MAX + i] = P.b[i], out[2 * MT_GEMM_GROUP_MAX + i] = P.c[i];
}

// Whether cublasGemmGroupedBatchedEx takes the problems (else one cublasGemmEx each). Seen on the
// H100 (cuBLAS 13.1, 2026-11-27, docs/gpu-results.md): an f32 C is CUBLAS_STATUS_NOT_SUPPORTED
// (its type table: A = B = C), and the call faults ('misaligned address') on pointers that are
// not 16-byte aligned: it reads them on the device and cannot choose a kernel by them, as
// cublasGemmEx does. Row strides that keep every row 16-byte aligned, for the same reason.
static bool grouped_call_ok(const mt_gemm_group *g, const group_ptrs *P, int n) {
    if (g->tc != MT_BF16 || (g->lda | g->ldb | g->ldc) % 8) return false;
    for (int i = 0; i < n; i++)
        if (((uintptr_t)P->a[i] | (uintptr_t)P->b[i] | (uintptr_t)P->c[i]) % 16) return false;
    return true;
}

static int group_fail(const char *fmt, int i, long long x) {
    mt_error_set(fmt, i, x);
    return -1;
}

extern "C" int mt_cuda_gemm_grouped(mt_backend *be, const mt_gemm_group *g) {
    if (be->ops->kind != MT_BACKEND_CUDA) return mt_error_set("mt_cuda_gemm_grouped: backend %s", be->ops->name), -1;
    if (g->count < 0 || g->count > MT_GEMM_GROUP_MAX)
        return mt_error_set("mt_cuda_gemm_grouped: %d problems, at most %d", g->count, MT_GEMM_GROUP_MAX), -1;
    if (!matmul_dtypes_ok(MT_BF16, MT_BF16, g->tc) || g->tc == MT_F16)
        return mt_error_set("mt_cuda_gemm_grouped: c is %s, must be bf16 or f32", mt_dtype_name(g->tc)), -1;
    if (g->n > INT32_MAX || g->lda > INT32_MAX || g->ldb > INT32_MAX || g->ldc > INT32_MAX)
        return mt_error_set("mt_cuda_gemm_grouped: n or a row stride beyond cuBLAS's int"), -1;
    cuda_ctx *cx = cuda_enter(be);
    if (g->count == 0 || g->n == 0) return 0;
    // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ (as cuda_matmul): cuBLAS's A is
    // our b, its B our a; m' = n, n' = m_i, k' = k_i.
    int n = g->count, mm[MT_GEMM_GROUP_MAX], nn[MT_GEMM_GROUP_MAX], kk[MT_GEMM_GROUP_MAX];
    int lda[MT_GEMM_GROUP_MAX], ldb[MT_GEMM_GROUP_MAX], ldc[MT_GEMM_GROUP_MAX], size[MT_GEMM_GROUP_MAX];
    float alpha[MT_GEMM_GROUP_MAX], beta[MT_GEMM_GROUP_MAX];
    cublasOperation_t ta[MT_GEMM_GROUP_MAX], tb[MT_GEMM_GROUP_MAX];
    group_ptrs P;
    memset(&P, 0, sizeof P);
    double flops = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        if (g->m[i] < 0 || g->m[i] > INT32_MAX) return group_fail("mt_cuda_gemm_grouped: m[%d] = %lld", i, (long long)g->m[i]);
        if (g->k[i] < 0 || g->k[i] > INT32_MAX) return group_fail("mt_cuda_gemm_grouped: k[%d] = %lld", i, (long long)g->k[i]);
        int64_t arow = g->trans_a ? g->m[i] : g->k[i], brow = g->trans_b ? g->k[i] : g->n;  // row lengths as stored
        if (g->lda < arow || g->ldb < brow || g->ldc < g->n)
            return group_fail("mt_cuda_gemm_grouped: problem %d: a row stride is shorter than its row (%lld)", i,
                              (long long)MT_MAX(arow, MT_MAX(brow, g->n)));
        mm[i] = (int)g->n, nn[i] = (int)g->m[i], kk[i] = (int)g->k[i];
        lda[i] = (int)g->ldb, ldb[i] = (int)g->lda, ldc[i] = (int)g->ldc, size[i] = 1;
        alpha[i] = g->alpha, beta[i] = g->beta;
        ta[i] = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb[i] = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        P.a[i] = g->b[i], P.b[i] = g->a[i], P.c[i] = g->c[i];
        flops += 2.0 * (double)g->m[i] * (double)g->n * (double)g->k[i];
        bytes += 2.0 * (double)(g->m[i] * g->k[i] + g->k[i] * g->n) +
                 (double)mt_dtype_bytes(g->tc, (size_t)(g->m[i] * g->n)) * (g->beta != 0.0f ? 2 : 1);
    }
    if (!cx->blas) {
        MT_CHECK_CUBLAS(cublasCreate(&cx->blas));
        MT_CHECK_CUBLAS(cublasSetStream(cx->blas, cx->stream));
        MT_CHECK_CUBLAS(cublasSetWorkspace(cx->blas, cx->workspace, cx->workspace_bytes));
        MT_CHECK_CUBLAS(cublasSetSmCountTarget(cx->blas, cx->sm_target));
    }
    be->device_ops++;
    if (mt_prof_active) mt_prof_count(flops, bytes);
    const void **dev = (const void **)g->ptrs;
    if (!dev) return mt_error_set("mt_cuda_gemm_grouped: no pointer scratch"), -1;
    cudaDataType_t ct = g->tc == MT_F32 ? CUDA_R_32F : CUDA_R_16BF;
    if (!grouped_call_ok(g, &P, n)) {  // one cublasGemmEx per problem: it sees each pointer
        for (int i = 0; i < n; i++)
            MT_CHECK_CUBLAS(cublasGemmEx(cx->blas, ta[i], tb[i], mm[i], nn[i], kk[i], &alpha[i], P.a[i], CUDA_R_16BF,
                                         lda[i], P.b[i], CUDA_R_16BF, ldb[i], &beta[i], P.c[i], ct, ldc[i],
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    group_ptrs_kernel<<<1, MT_GEMM_GROUP_MAX, 0, cx->stream>>>(P, n, dev);
    MT_CHECK_CUDA(cudaGetLastError());
    MT_CHECK_CUBLAS(cublasGemmGroupedBatchedEx(cx->blas, ta, tb, mm, nn, kk, alpha, dev, CUDA_R_16BF, lda,
                                               dev + MT_GEMM_GROUP_MAX, CUDA_R_16BF, ldb, beta,
                                               (void *const *)(dev + 2 * MT_GEMM_GROUP_MAX), ct, ldc, n, size,
                                               CUBLAS_COMPUTE_32F));
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Creation and teardown

static void cuda_destroy(mt_backend *be) {
    cuda_ctx *cx = cuda_enter(be);
    MT_CHECK_CUDA(cudaStreamSynchronize(cx->stream));
    mt_log(MT_LOG_DEBUG, "cuda: matmul plans_built=%llu algo_fallbacks=%llu", (unsigned long long)cx->plans_built,
           (unsigned long long)cx->algo_fallbacks);
    for (int i = 0; i < CUDA_PLAN_SLOTS; i++) plan_destroy(&cx->plans[i]);
    if (cx->workspace) mt_backend_release(be, MT_MEM_WORK, cx->workspace_bytes, cx->workspace);
    MT_CHECK_CUBLAS(cublasLtDestroy(cx->lt));
    if (cx->blas) MT_CHECK_CUBLAS(cublasDestroy(cx->blas));
    if (cx->side) {
        MT_CHECK_CUDA(cudaStreamSynchronize(cx->side));
        MT_CHECK_CUDA(cudaStreamDestroy(cx->side));
    }
    if (cx->stage) MT_CHECK_CUDA(cudaFreeHost(cx->stage));
    if (cx->staged) MT_CHECK_CUDA(cudaEventDestroy(cx->staged));
    MT_CHECK_CUDA(cudaStreamDestroy(cx->stream));
    free(cx);
    free(be);
}

static const mt_backend_ops cuda_ops = {
    .name = "cuda",
    .kind = MT_BACKEND_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .fill_zero = cuda_fill_zero,
    .copy = cuda_copy,
    .copy2d = cuda_copy2d,
    .scale = cuda_scale_op,
    .matmul = cuda_matmul,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
};

extern "C" void *mt_cuda_backend_stream(mt_backend *be) { return ((cuda_ctx *)be->ctx)->stream; }
extern "C" void mt_cuda_backend_lt(mt_backend *be, void **lt, void **workspace, size_t *workspace_bytes,
                                   int *sm_target) {
    cuda_ctx *cx = cuda_enter(be);
    *lt = cx->lt, *workspace = cx->workspace, *workspace_bytes = cx->workspace_bytes, *sm_target = cx->sm_target;
}
extern "C" void *mt_cuda_backend_side_stream(mt_backend *be) {
    cuda_ctx *cx = cuda_enter(be);
    if (!cx->side) MT_CHECK_CUDA(cudaStreamCreateWithFlags(&cx->side, cudaStreamNonBlocking));
    return cx->side;
}
extern "C" void *mt_cuda_backend_enter(mt_backend *be) {
    be->device_ops++;
    return cuda_enter(be)->stream;
}

// Refuses, with an error, a backend that is not this file's (its ctx is something else).
static cuda_ctx *cuda_ctx_of(mt_backend *be, const char *what) {
    if (be && be->ops->kind == MT_BACKEND_CUDA) return cuda_enter(be);
    mt_error_set("%s: not a cuda backend (%s)", what, be ? be->ops->name : "none");
    return NULL;
}

extern "C" int mt_cuda_mem_info(mt_backend *be, size_t *free_bytes, size_t *total_bytes) {
    if (!cuda_ctx_of(be, "mt_cuda_mem_info")) return -1;
    MT_CHECK_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
    return 0;
}

extern "C" int mt_cuda_mem_trim(mt_backend *be) {
    cuda_ctx *cx = cuda_ctx_of(be, "mt_cuda_mem_trim");
    if (!cx) return -1;
    if (!cx->async_alloc) return 0;  // cudaFree gave each piece back already
    MT_CHECK_CUDA(cudaStreamSynchronize(cx->stream));  // the frees queued on it have happened
    be->host_syncs++;
    MT_CHECK_CUDA(cudaMemPoolTrimTo(cx->pool, 0));
    return 0;
}

extern "C" int mt_cuda_mem_peak_start(mt_backend *be) {
    cuda_ctx *cx = cuda_ctx_of(be, "mt_cuda_mem_peak_start");
    size_t free_b = 0, total_b = 0;
    if (!cx) return -1;
    MT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    cx->used_peak = total_b - free_b;
    cx->sample_used = 1;
    return 0;
}

extern "C" int mt_cuda_mem_peak_stop(mt_backend *be, size_t *used_peak) {
    cuda_ctx *cx = cuda_ctx_of(be, "mt_cuda_mem_peak_stop");
    if (!cx) return -1;
    cx->sample_used = 0;
    *used_peak = cx->used_peak;
    return 0;
}

extern "C" uint64_t mt_cuda_matmul_plans_built(mt_backend *be) {
    cuda_ctx *cx = cuda_ctx_of(be, "mt_cuda_matmul_plans_built");
    return cx ? cx->plans_built : 0;
}

extern "C" int mt_cuda_gemm_sm_reserve(mt_backend *be, int reserve) {
    cuda_ctx *cx = cuda_ctx_of(be, "mt_cuda_gemm_sm_reserve");
    if (!cx) return -1;
    if (reserve < 0 || reserve >= cx->sm_count) {
        mt_error_set("GEMM SM reserve %d: the device has %d multiprocessors (0 to %d may be left out)", reserve,
                     cx->sm_count, cx->sm_count - 1);
        return -1;
    }
    cx->sm_target = reserve ? cx->sm_count - reserve : 0;  // a new key: plans are made for it
    if (cx->blas) MT_CHECK_CUBLAS(cublasSetSmCountTarget(cx->blas, cx->sm_target));
    return 0;
}

extern "C" int mt_cuda_gemm_sm_reserved(mt_backend *be) {
    cuda_ctx *cx = cuda_ctx_of(be, "mt_cuda_gemm_sm_reserved");
    return cx && cx->sm_target ? cx->sm_count - cx->sm_target : 0;
}

extern "C" int mt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" mt_backend *mt_backend_cuda_new(int device) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        mt_error_set("no CUDA GPU: cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        return NULL;
    }
    if (count == 0) {
        mt_error_set("no CUDA GPU: the CUDA driver reports no devices");
        return NULL;
    }
    if (device < 0 || device >= count) {
        mt_error_set("CUDA device %d does not exist (this machine has %d, numbered from 0)", device, count);
        return NULL;
    }
    cudaDeviceProp prop;
    MT_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8) {
        mt_error_set("CUDA device %d (%s) has compute capability %d.%d; the cuda backend needs 8.0 or "
                     "newer (bf16 tensor cores)", device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    MT_CHECK_CUDA(cudaSetDevice(device));

    mt_backend *be = (mt_backend *)mt_xcalloc(1, sizeof *be);
    cuda_ctx *cx = (cuda_ctx *)mt_xcalloc(1, sizeof *cx);
    be->ops = &cuda_ops;
    be->ctx = cx;
    mt_ledger_init(&be->ledger, 0);
    cx->device = device;
    cx->sm_count = prop.multiProcessorCount;
    MT_CHECK_CUDA(cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    MT_CHECK_CUDA(cudaDeviceGetAttribute(&cx->async_alloc, cudaDevAttrMemoryPoolsSupported, device));
    if (getenv("MT_CUDA_SYNC_ALLOC")) cx->async_alloc = 0;  // cudaMalloc/cudaFree, to rule the pool out
    if (cx->async_alloc) {  // the pool keeps what is freed (see cuda_ctx)
        uint64_t keep = UINT64_MAX;
        MT_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&cx->pool, device));
        MT_CHECK_CUDA(cudaMemPoolSetAttribute(cx->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    MT_CHECK_CUBLAS(cublasLtCreate(&cx->lt));
    if (mt_backend_alloc(be, MT_MEM_WORK, CUDA_WORKSPACE_BYTES, &cx->workspace) != 0) {
        mt_error_prefix("cuda backend: cuBLASLt workspace");
        MT_CHECK_CUBLAS(cublasLtDestroy(cx->lt));
        MT_CHECK_CUDA(cudaStreamDestroy(cx->stream));
        free(cx);
        free(be);
        return NULL;
    }
    cx->workspace_bytes = CUDA_WORKSPACE_BYTES;
    // MT_GEMM_SM_RESERVE=N: every GEMM planned for all SMs but N from the start (measuring the
    // whole step so: docs/gpu-check.md); refused, naming it, when not an integer in [0, SMs).
    const char *rs = getenv("MT_GEMM_SM_RESERVE");
    if (rs && rs[0]) {
        char *end;
        long r = strtol(rs, &end, 10);
        if (*end || r < 0 || r > INT_MAX || mt_cuda_gemm_sm_reserve(be, (int)r) != 0) {
            mt_error_set("MT_GEMM_SM_RESERVE=%s: not a number of SMs to leave out, 0 to %d (device %d has %d)", rs,
                         cx->sm_count - 1, device, cx->sm_count);
            mt_backend_free(be);
            return NULL;
        }
    }
    mt_log(MT_LOG_DEBUG, "cuda: device=%d name=\"%s\" cc=%d.%d mem_bytes=%zu workspace_bytes=%d async_alloc=%d "
           "pool_release_threshold=%s sm_target=%d",
           device, prop.name, prop.major, prop.minor, prop.totalGlobalMem, (int)CUDA_WORKSPACE_BYTES,
           cx->async_alloc, cx->async_alloc ? "max" : "none", cx->sm_target);
    return be;
}
