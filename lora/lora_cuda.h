// lora/lora_cuda.h — CUDA twins of lora/lora.h's forward and backward (lora/lora_cuda.cu),
// conventions as in model/ops_cuda.h; CUDA builds (MT_CUDA) only.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "lora/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

// A, B, dA, dB of `l` are f32 tensors of `be`; the matmuls go through the backend
// (cuBLASLt), dropout is regenerated from the same hash as the CPU (lora/lora_dropout.h).

void mt_lora_forward_cuda(mt_backend *be, const mt_lora *l, float *y, const float *x, float *xa, int64_t n);
void mt_lora_backward_cuda(mt_backend *be, const mt_lora *l, float *dx, const float *dy, const float *x,
                           const float *xa, float *scratch, int64_t n);

#ifdef __cplusplus
}
#endif
