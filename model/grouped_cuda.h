// model/grouped_cuda.h — the CUDA launchers behind model/grouped.h (kernels: model/grouped_cuda.cu).
// They take arguments model/grouped.c has already checked (dtypes, shapes, offsets, one W per
// expert with rows) and launch one kernel on the backend's stream; nothing waits for it.
//
// Plain C, no CUDA types: any build may include this header; the functions exist only in CUDA
// builds (MT_CUDA).
#pragma once
#include "model/grouped.h"

#ifdef __cplusplus
extern "C" {
#endif

// mt_grouped_gemm on the cuda backend `be` (c, a and every W on it).
void mt_grouped_gemm_cuda(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_grouped *g);
// mt_grouped_gemm_tn on the cuda backend `be`.
void mt_grouped_gemm_tn_cuda(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y,
                             const mt_grouped *gr);

#ifdef __cplusplus
}
#endif
