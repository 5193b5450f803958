// lora/lora_cuda.h — the LoRA's device kernel (lora/lora_cuda.cu), conventions as in
// model/ops_cuda.h; CUDA builds (MT_CUDA) only. The GEMMs are lora/lora_dev.c's.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "lora/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

// out [rows, width] = x [rows, width] · factor (accumulate 0) or out += x · factor (1), bf16, rows
// ldo and ldx elements apart; factor of element (r, j) from lora/lora_dropout.h's hash of
// (seed, r·width + j): the CPU's mask of the contiguous matrix, element for element.
void mt_lora_dropout_cuda(mt_backend *be, mt_bf16 *out, int64_t ldo, const mt_bf16 *x, int64_t ldx, int64_t rows,
                          int64_t width, uint64_t seed, float p, int accumulate);

#ifdef __cplusplus
}
#endif
