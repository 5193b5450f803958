// model/grouped_cuda.h — the CUDA side of model/grouped.h (model/grouped_cuda.cu): dequantization
// and cuBLASLt calls per expert on the backend's streams; nothing waits for them. They take
// arguments model/grouped.c has already checked (dtypes, shapes, offsets, one W per expert with
// rows) and the scratch it allocated through the ledger (model/expert_scratch.h's sizes).
//
// Plain C, no CUDA types: any build may include this header; the functions exist only in CUDA
// builds (MT_CUDA).
#pragma once
#include "model/grouped.h"

#ifdef __cplusplus
extern "C" {
#endif

// mt_grouped_gemm on the cuda backend `be` (c, a and every W on it). deq_scratch: two slots of
// slot_elems bf16 each (NULL when no expert is 4-bit); drop_scratch: [rows, width] f32 when
// g->seed is set (width K with drop_a, else N).
void mt_grouped_gemm_cuda(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_grouped *g,
                          void *deq_scratch, size_t slot_elems, void *drop_scratch);
// mt_grouped_gemm_tn on the cuda backend `be`; drop_scratch as above, width N (Y's).
void mt_grouped_gemm_tn_cuda(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y,
                             const mt_grouped *gr, void *drop_scratch);

#ifdef __cplusplus
}
#endif
