// core/cublaslt_grouped.h — the pieces of cuBLASLt's grouped matmul that the CUDA 13.0/13.1
// headers this project builds against do not declare yet. They came with cuBLAS 13.3 (Blackwell)
// and 13.4 (Hopper), marked experimental: a matrix layout whose rows, columns and leading
// dimension are read per group from device arrays (int32 by default), passed to cublasLtMatmul
// with device arrays of per-group pointers in place of A, B, C and D. core/gemm_rows_cuda.cu finds
// the function in the loaded library at run time (dlsym); the emulator's stand-in
// (tests/cudasim/cublaslt.cc) defines it. Our own names for the attribute values, so that newer
// headers, which declare them as enumerators, do not collide.
#pragma once
#include <cublasLt.h>

// cublasLtMatmulPreferenceAttributes_t values (default 0; 13.4's header says uint32_t, NVIDIA's
// own callers pass int64_t): hints for the heuristic, since the shapes themselves are on the
// device.
#define MT_LT_PREF_GROUPED_AVG_K 13     // CUBLASLT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM
#define MT_LT_PREF_GROUPED_AVG_ROWS 14  // CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS
#define MT_LT_PREF_GROUPED_AVG_COLS 15  // CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS

// The run-time version (cublasLtGetVersion) from which a grouped bf16 matmul runs on Hopper
// (sm_90; Blackwell's came with 13.3), and the versions that corrupt grouped outputs written to
// separate addresses (13.7.0 up to 13.8.1, as NVIDIA's TransformerEngine records).
#define MT_LT_GROUPED_VERSION_HOPPER 130400
#define MT_LT_GROUPED_BAD_FROM 130700
#define MT_LT_GROUPED_BAD_UNTIL 130801

// cublasLtGroupedMatrixLayoutCreate: `groups` matrices of one type; rows, cols and ld are device
// arrays of `groups` entries each.
typedef cublasStatus_t (*mt_lt_grouped_layout_create_fn)(cublasLtMatrixLayout_t *layout, cudaDataType type, int groups,
                                                         const void *rows, const void *cols, const void *ld);

#ifdef __cplusplus
extern "C" {
#endif
// The emulator's stand-in (SIM=1 builds only; a CUDA build resolves the library's).
cublasStatus_t cublasLtGroupedMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, int groups,
                                                 const void *rows, const void *cols, const void *ld);
#ifdef __cplusplus
}
#endif
