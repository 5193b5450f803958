// core/gemm_rows.h — GEMMs over groups of rows whose sizes stay on the device: a layer's experts,
// whose routing counts the host then never has to wait for. One cuBLASLt grouped matmul per call
// (core/cublaslt_grouped.h: the library reads each group's shape from device arrays; cuBLAS
// 13.4+ on Hopper, 13.3+ on Blackwell), after one small kernel that turns the offsets into the
// call's pointer and shape arrays. Row-major, as core/backend.h's matmul.
//
// Group e owns rows [off[e], off[e+1]) of the row operands; off is a device int32 array [E+1],
// non-decreasing, its last entry at most the operands' rows (what the routing's device prefix
// sum writes; a later run of groups passes off + e0):
//
//   mt_gemm_rows     c[rows e] = alpha · a[rows e] · op(w[e]) + beta · c[rows e]
//                    a [R, K] bf16; w[e] bf16, [N, K] when trans (op = ᵀ) else [K, N]; c [R, N]
//   mt_gemm_rows_tn  g[e] = alpha · x[rows e]ᵀ · y[rows e] + beta · g[e]
//                    x [R, M], y [R, N] bf16; g[e] [M, N] (a group without rows: beta · g[e])
//
// Every w[e] (g[e]) has one shape, row stride and dtype; c and g are bf16 or f32; any operand may
// be a view with a row stride, but every operand's first element and row stride must be 16-byte
// aligned (each group's rows start at any row, and the library reads its pointers on the device:
// it cannot pick a kernel by them; refused otherwise). rows_total: the rows the groups are expected to hold in all (the
// heuristic's hint and the profile's count; the host does not know the real ones). Nothing
// waits for the device: the call is queued on the backend's
// stream, its arrays written into `scratch` (MT_GEMM_ROWS_SCRATCH_BYTES of device memory, the
// caller's, so that the ledger counts it; free it only after the stream has passed the call).
// 0, or -1 with an error: the grouped matmul is missing (mt_gemm_rows_available says why), bad
// shapes or dtypes, E outside 1..MT_GEMM_ROWS_MAX. Offsets beyond the operands are the caller's
// bug: the host cannot see them.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_GEMM_ROWS_MAX 256
// Four pointer arrays and nine int32 shape arrays of MT_GEMM_ROWS_MAX entries, alpha and beta.
#define MT_GEMM_ROWS_SCRATCH_BYTES (MT_GEMM_ROWS_MAX * (4 * sizeof(void *) + 9 * sizeof(int32_t)) + 16)

// 1 when be's device and its cuBLASLt run the grouped matmul; else 0, with the reason (the
// library's version, the device's architecture, a CPU build) in why when it is not NULL.
int mt_gemm_rows_available(mt_backend *be, char *why, size_t why_bytes);
// The same, and on the first call per process a small problem run both through the grouped
// matmul and through one plain GEMM per group (a few host waits): 0 with the difference in why
// when they disagree. The library's grouped matmul is marked experimental; the step trusts it
// only after this.
int mt_gemm_rows_checked(mt_backend *be, char *why, size_t why_bytes);
// How many times the calls below ran cuBLASLt's heuristic: once per kind of problem (the
// groups, transposes, output type, the average shape it is told, the SM target, the workspace
// and the device), its choice kept after (64 kinds at a time, the oldest replaced; for the one
// host thread that drives the backends, as every CUDA call here).
uint64_t mt_gemm_rows_heuristic_calls(void);

int mt_gemm_rows(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *const *w, int trans, int experts,
                 const int32_t *off, int64_t rows_total, float alpha, float beta, void *scratch);
int mt_gemm_rows_tn(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, int experts,
                    const int32_t *off, int64_t rows_total, float alpha, float beta, void *scratch);

#ifdef __cplusplus
}
#endif
