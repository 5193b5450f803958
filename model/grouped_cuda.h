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

// The scratch of one call (model/grouped.c allocates it): deq, two slots of slot_elems bf16 each
// (NULL when no expert with rows is 4-bit); drop, [rows, width] f32 when the call has dropout
// (width K with drop_a, else N; for the weight gradient, Y's N); ptrs, MT_GROUPED_PTR_BYTES
// (model/expert_scratch.h) for the grouped calls' pointer and shape arrays.
typedef struct mt_grouped_scratch {
    void *deq, *drop, *ptrs;
    size_t slot_elems;
} mt_grouped_scratch;

// mt_grouped_gemm on the cuda backend `be` (c, a and every W on it).
void mt_grouped_gemm_cuda(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_grouped *g,
                          const mt_grouped_scratch *s);
// mt_grouped_gemm_tn on the cuda backend `be`.
void mt_grouped_gemm_tn_cuda(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y,
                             const mt_grouped *gr, const mt_grouped_scratch *s);

#ifdef __cplusplus
}
#endif
