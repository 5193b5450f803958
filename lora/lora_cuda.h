// lora/lora_cuda.h — the LoRA's device kernel (lora/lora_cuda.cu), conventions as in
// model/ops_cuda.h; CUDA builds (MT_CUDA) only. The GEMMs are lora/lora_dev.c's.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "lora/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

// out [n] = x [n] · factor(i) (accumulate 0) or out [n] += x [n] · factor(i) (1), bf16 contiguous;
// factor from lora/lora_dropout.h's hash of (seed, i): the CPU's mask, element for element.
void mt_lora_dropout_cuda(mt_backend *be, mt_bf16 *out, const mt_bf16 *x, int64_t n, uint64_t seed, float p,
                          int accumulate);

#ifdef __cplusplus
}
#endif
