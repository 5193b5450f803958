// model/expert_scratch.h — the GPU step's transient buffers for its experts' GEMMs, sized here
// once so that the step (model/grouped_cuda.cu allocates them) and the planner (plan/, its
// `work` category) count the same bytes.
//
// Experts run through cuBLASLt on bf16 weights: a 4-bit expert's W is dequantized into a slot of
// the dequantization scratch just before its GEMM, the next expert's into the other slot
// meanwhile (two slots: double-buffered). A slot holds one expert's w1‖w3 stacked, [2f, d] bf16,
// the largest matrix one call dequantizes (w2 is [d, f]). A LoRA's dropout needs one buffer of
// [rows, width] f32 for the call's rows: the masked copy of an operand (bf16, half of it), or
// the product that dx += drop(dxa·A) masks before adding (f32: one rounding, into dx).
#pragma once
#include <stdint.h>

#define MT_EXPERT_SCRATCH_SLOTS 2

// Bytes of the dequantization scratch for experts of hidden d and intermediate f (the call that
// runs 4-bit experts holds it for its duration; dense experts need none).
static inline int64_t mt_expert_dequant_scratch_bytes(int64_t d, int64_t f) {
    return MT_EXPERT_SCRATCH_SLOTS * 2 * f * d * 2;
}

// Bytes of the dropout buffer of a call over `rows` rows of `width` columns (LoRA dropout > 0).
static inline int64_t mt_expert_dropout_scratch_bytes(int64_t rows, int64_t width) { return rows * width * 4; }
