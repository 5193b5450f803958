// core/ — the ground floor: tensors and dtypes, the backend interface and its cpu, cuda and null
// backends, the memory ledger, comm (single, MPI, NCCL), safetensors, JSON/YAML, logging, RNG,
// index sets. Uses only system libraries (BLAS, cJSON, libyaml, MPI, CUDA); used by every folder.
// This header is its centre.
//
// core/backend.h — the op interface every backend fills in (cpu, cuda, null), and tensors.
//
// A backend owns one device's memory and its ledger. Every allocation goes through
// mt_backend_alloc(), which reserves the bytes in the ledger under a category first.
// The model calls ops in order; there is no graph.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/ledger.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MAX_DIMS 4

typedef struct mt_backend mt_backend;

typedef struct mt_tensor {
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    int64_t ld;       // 2-D views only: elements from one row to the next; 0 = shape[1] (dense).
                      // matmul honours it (a column block of a wider matrix); nothing else does
    size_t nbytes;
    void *data;       // memory of `be` (host for cpu, device for cuda, NULL for null)
    mt_backend *be;
    mt_mem_cat cat;
} mt_tensor;

typedef enum { MT_BACKEND_CPU, MT_BACKEND_CUDA, MT_BACKEND_NULL } mt_backend_kind;

typedef struct mt_backend_ops {
    const char *name;
    mt_backend_kind kind;  // folders outside core/ dispatch their own ops on it
    // Allocate `bytes` of backend memory. 0 on success; -1 with mt_error_set() on failure.
    int (*alloc)(mt_backend *be, size_t bytes, void **out);
    void (*free)(mt_backend *be, void *ptr);
    void (*upload)(mt_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(mt_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*fill_zero)(mt_backend *be, void *dst, size_t bytes);
    // dst and src both memory of `be` (device to device on cuda, ordered on its stream).
    void (*copy)(mt_backend *be, void *dst, const void *src, size_t bytes);
    // `rows` rows of `width` bytes from src (rows `spitch` bytes apart) to dst (`dpitch` apart), both
    // memory of `be`: a column block of a row-major matrix (MLA's latent and rope key of one GEMM).
    void (*copy2d)(mt_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t rows);
    // x [n] *= s, x f32 or bf16 memory of `be` (gradient accumulation's average).
    void (*scale)(mt_backend *be, void *x, mt_dtype dtype, size_t n, float s);
    // c [M, N] = alpha · op(a) · op(b) + beta · c, row-major, fp32 accumulation.
    // op(a) [M, K] is a [M, K], or a [K, M] transposed when trans_a; likewise b.
    // Returns 0, or -1 with mt_error_set() for unsupported dtypes or mismatched shapes.
    int (*matmul)(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *b,
                  int trans_a, int trans_b, float alpha, float beta);
    void (*synchronize)(mt_backend *be);
    void (*destroy)(mt_backend *be);
} mt_backend_ops;

struct mt_backend {
    const mt_backend_ops *ops;
    mt_ledger ledger;
    uint64_t host_syncs;  // times the host waited for the device (cuda; 0 elsewhere): the step's
                          // count goes into metrics.jsonl
    uint64_t device_ops;  // op launchers entered and matmuls issued on the device (cuda; 0
                          // elsewhere): what tests count to see that work is batched
    void *ctx;  // backend-private state
};

mt_backend *mt_backend_cpu_new(void);
mt_backend *mt_backend_null_new(void);
// CUDA device `device`; NULL with mt_error_set() when built without CUDA or no GPU is present.
mt_backend *mt_backend_cuda_new(int device);
int mt_cuda_device_count(void);  // 0 without CUDA or without a GPU
// The device's free and total memory as the driver sees it (cudaMemGetInfo: every process and
// context on the GPU, not only this backend's allocations). 0, or -1 with an error when built
// without CUDA or `be` is not a cuda backend.
// mt_cuda_mem_peak_start/stop: the driver's used memory (total - free) at its highest, sampled
// after every allocation of `be` between the two (one cudaMemGetInfo each: for measuring, not
// for timed runs). 0 or -1 as above.
int mt_cuda_mem_info(mt_backend *be, size_t *free_bytes, size_t *total_bytes);
int mt_cuda_mem_peak_start(mt_backend *be);
int mt_cuda_mem_peak_stop(mt_backend *be, size_t *used_peak);
// Once the work queued so far is done (one host wait), hands the stream-ordered pool's unused
// memory back to the driver: after a build that freed much in pieces (model/mixtral.c gives
// kept experts' 4-bit codes back), so that the driver's used memory is the ledger's again rather
// than the ledger's plus pieces a larger allocation cannot reuse. 0 (nothing to do without a
// pool), or -1 with an error when built without CUDA or `be` is not a cuda backend.
int mt_cuda_mem_trim(mt_backend *be);
// Matmul plans (cuBLASLt descriptors + heuristic) built so far by `be`: plans are cached per
// power-of-two bucket of M and of K, so this grows with distinct buckets, not distinct token
// counts. 0 without CUDA or for another backend (with an error).
uint64_t mt_cuda_matmul_plans_built(mt_backend *be);
// The backend's GEMMs (cuBLASLt's heuristic, cuBLAS's grouped call) planned for the device's
// multiprocessors less `reserve`, which a kernel on the side stream running beside them (the
// experts' dequantization) may then take: CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET. 0 (the default):
// all of them. For measuring (scripts/bench_gpu.c's overlap figures): whether the overlap gains
// more than the GEMMs lose is the GPU's to say. 0, or -1 with an error (not a cuda backend, or
// reserve not in [0, SMs)).
int mt_cuda_gemm_sm_reserve(mt_backend *be, int reserve);
// The reserve in force (MT_GEMM_SM_RESERVE's at creation, or the last one set); 0 elsewhere.
int mt_cuda_gemm_sm_reserved(mt_backend *be);
// CUDA builds: the backend's stream (a cudaStream_t), for kernels outside core/ to launch on.
void *mt_cuda_backend_stream(mt_backend *be);
// The same stream, after making the backend's device current (what every op launcher calls first).
void *mt_cuda_backend_enter(mt_backend *be);
// mt_download_begin / mt_download_end on the cuda backend (core/backend_cuda.cu).
void mt_cuda_download_begin(mt_backend *be, void *host_dst, const void *src, size_t bytes);
void mt_cuda_download_end(mt_backend *be);
// The backend's cuBLASLt handle (a cublasLtHandle_t), its workspace and the SMs its GEMMs plan
// for (0: all; mt_cuda_gemm_sm_reserve), after making its device current: for GEMMs outside
// core/backend_cuda.cu that share them (core/gemm_rows_cuda.cu).
void mt_cuda_backend_lt(mt_backend *be, void **lt, void **workspace, size_t *workspace_bytes, int *sm_target);
// A second stream of the backend's device (made on first use, destroyed with the backend), for
// work that overlaps the main stream's; the caller orders the two with events. Device current.
void *mt_cuda_backend_side_stream(mt_backend *be);
// A grouped GEMM on the cuda backend (cuBLAS's cublasGemmGroupedBatchedEx: one call for many
// small products, the experts' LoRA and weight gradients). Problem i, row-major:
//   c[i] [m[i], n] = alpha · op(a[i]) · op(b[i]) + beta · c[i]
// op(a[i]) is [m[i], k[i]] (a[i] stored [k[i], m[i]] when trans_a), op(b[i]) [k[i], n]; every
// problem shares n, the transposes, the row strides and the dtypes (a, b bf16; c bf16 or f32).
// Pointers are device memory of be; m, k host arrays; `ptrs` device memory of
// MT_GEMM_GROUP_PTR_BYTES for the problems' pointer arrays (the caller's scratch: the null backend
// counts it too). 0, or -1 with an error (not cuda, a count above MT_GEMM_GROUP_MAX, bad sizes).
#define MT_GEMM_GROUP_MAX 256
#define MT_GEMM_GROUP_PTR_BYTES (3 * MT_GEMM_GROUP_MAX * sizeof(void *))
typedef struct mt_gemm_group {
    int count;
    const int64_t *m, *k;
    int64_t n, lda, ldb, ldc;
    int trans_a, trans_b;
    mt_dtype tc;
    float alpha, beta;
    const void *const *a, *const *b;
    void *const *c;
    void *ptrs;
} mt_gemm_group;
int mt_cuda_gemm_grouped(mt_backend *be, const mt_gemm_group *g);
// Waits for the backend's stream and counts the wait in be->host_syncs: every host wait of a
// cuda op goes through it (or through download / synchronize, which count theirs).
void mt_cuda_backend_sync(mt_backend *be);
// By name: "cpu", "null" or "cuda"; NULL with an error otherwise.
mt_backend *mt_backend_new(const char *name);
void mt_backend_free(mt_backend *be);

// Reserve in the ledger, then allocate. 0 or -1 with an error naming the bytes and category.
int mt_backend_alloc(mt_backend *be, mt_mem_cat cat, size_t bytes, void **out);
void mt_backend_release(mt_backend *be, mt_mem_cat cat, size_t bytes, void *ptr);

// Tensors. mt_tensor_new returns NULL with an error when the ledger or the device refuses.
mt_tensor *mt_tensor_new(mt_backend *be, mt_mem_cat cat, mt_dtype dtype, int ndim,
                         const int64_t *shape);
void mt_tensor_free(mt_tensor *t);
int64_t mt_tensor_numel(const mt_tensor *t);
void mt_tensor_upload(mt_tensor *t, const void *host_src);    // host bytes in t's dtype
void mt_tensor_download(const mt_tensor *t, void *host_dst);
// A download the host collects later, so that the device goes on working while the host waits
// (the GPU step's expert counts: what does not need them is queued before the wait). begin
// queues the copy of `bytes` from src after the work queued so far and returns at once; end waits
// for it (one host wait, counted and profiled as a download's) and fills host_dst. One at a time
// per backend; end without a begun download does nothing. The cpu and null backends copy in begin.
void mt_download_begin(mt_backend *be, void *host_dst, const void *src, size_t bytes);
void mt_download_end(mt_backend *be);
// The same from / to host f32 values, converted to / from t's float dtype (f32, bf16, f16).
void mt_tensor_upload_f32(mt_tensor *t, const float *host_src);
void mt_tensor_download_f32(const mt_tensor *t, float *host_dst);
// A 2-D view of `rows` rows of `cols` elements of be's memory at p, rows `ld` elements apart
// (0: cols); nothing allocated (cat work, for messages). p may be NULL (the null backend).
mt_tensor mt_view2(mt_backend *be, const void *p, mt_dtype dtype, int64_t rows, int64_t cols, int64_t ld);
// Rows [row0, row0 + rows) of a 2-D tensor or view (same dtype, columns and ld).
mt_tensor mt_view_rows(const mt_tensor *t, int64_t row0, int64_t rows);
// Matmul through the tensor's backend (all three on the same backend).
int mt_matmul(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, int trans_a, int trans_b,
              float alpha, float beta);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// For backend implementations: validate 2-D matmul shapes and row strides (ld ≥ columns) and
// return M, N, K. mt_tensor_ld: a 2-D tensor's row stride in elements.
int mt_matmul_shapes(const mt_tensor *c, const mt_tensor *a, const mt_tensor *b, int trans_a,
                     int trans_b, int64_t *m, int64_t *n, int64_t *k);
static inline int64_t mt_tensor_ld(const mt_tensor *t) { return t->ld ? t->ld : t->shape[1]; }
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// Transient scratch of a kernel, counted under `work` for its lifetime. A refusal is fatal
// (MT_EXIT_OOM) with the ledger's message: scratch is sized by the plan, not by input data.
// The null backend returns NULL (nothing to touch); mt_work_free releases `bytes` all the same,
// so every mt_work_alloc needs its mt_work_free.
void *mt_work_alloc(mt_backend *be, size_t bytes);
void mt_work_free(mt_backend *be, void *ptr, size_t bytes);
#ifdef __cplusplus
}
#endif
