// model/expert_scratch.h — the GPU step's transient buffers for its experts' GEMMs, sized here
// once so that the step (model/grouped_cuda.cu allocates them) and the planner (plan/, its
// `work` category) count the same bytes.
//
// Experts run through cuBLAS on bf16 weights: a 4-bit expert's W is dequantized into a slot of
// the dequantization scratch just before its GEMM, the next expert's into the other slot
// meanwhile (two slots: double-buffered). A slot holds one expert's W (w1‖w3 stacked is [2f, d]
// bf16, [2f, d + 2r] with its LoRAs' B beside when they fold; w2 [d, f]), or as many small experts' as fit in MT_EXPERT_SLOT_ELEMS elements (64 MiB),
// and at most the call's experts: those then run as one grouped GEMM (128 experts of Qwen3-MoE
// would otherwise cost a cuBLASLt call each). A LoRA's dropout needs one buffer of
// [rows, width] f32 for the call's rows: the masked copy of an operand (bf16, half of it), or
// the product that dx += drop(dxa·A) masks before adding (f32: one rounding, into dx). Every call
// also holds its grouped calls' pointer (and shape) arrays, MT_GROUPED_PTR_BYTES.
#pragma once
#include <stdint.h>

#include "core/backend.h"    // MT_GEMM_GROUP_PTR_BYTES: cuBLAS's grouped GEMM's pointer table (6 KiB)
#include "core/gemm_rows.h"  // MT_GEMM_ROWS_SCRATCH_BYTES: the grouped matmul's arrays (17 KiB)

// A call's arrays: the offsets' host copy takes cuBLAS's grouped GEMM, their device copy
// cuBLASLt's grouped matmul; the larger, whichever runs, so that the plan need not know which.
#define MT_GROUPED_PTR_BYTES \
    (MT_GEMM_ROWS_SCRATCH_BYTES > MT_GEMM_GROUP_PTR_BYTES ? MT_GEMM_ROWS_SCRATCH_BYTES : MT_GEMM_GROUP_PTR_BYTES)

#define MT_EXPERT_SCRATCH_SLOTS 2
#define MT_EXPERT_SLOT_ELEMS ((int64_t)32 << 20)  // bf16 elements a slot of small experts may take
#define MT_GROUPED_MAX 256                        // experts in one grouped call (model/grouped.h)

// Elements of one slot for a call of `experts` experts (at most MT_GROUPED_MAX: larger layers are
// split into calls of that many) whose W has w_elems elements each.
static inline int64_t mt_expert_slot_elems(int64_t w_elems, int64_t experts) {
    int64_t fit = MT_EXPERT_SLOT_ELEMS / (w_elems > 0 ? w_elems : 1);
    if (experts > MT_GROUPED_MAX) experts = MT_GROUPED_MAX;
    if (fit > experts) fit = experts;
    return (fit < 1 ? 1 : fit) * w_elems;
}

// Bytes of the dequantization scratch for a layer of E experts of hidden d and intermediate f:
// the larger of the w1‖w3 call's and the w2 call's (the call that runs 4-bit experts with rows
// holds it for its duration; dense experts need none). w2_under: rows stacked under each W2 [d, f]
// in the backward's dx call (w2's LoRA A, r rows, when it folds: model/experts_gpu.c), else 0.
// w13_beside: columns beside each [W1;W3]'s rows in the forward's call (w1's and w3's LoRA B,
// 2r, when they fold; the row stride rounded up to 8: model/grouped.h), else 0. w2_beside: the
// same beside each W2's rows in the forward's w2 call (w2's LoRA B, r), else 0.
static inline int64_t mt_expert_dequant_scratch_bytes(int64_t d, int64_t f, int64_t experts, int64_t w2_under,
                                                      int64_t w13_beside, int64_t w2_beside) {
    int64_t ld13 = w13_beside ? (d + w13_beside + 7) / 8 * 8 : d, ld2 = w2_beside ? (f + w2_beside + 7) / 8 * 8 : f;
    int64_t a = mt_expert_slot_elems(2 * f * ld13, experts), b = mt_expert_slot_elems((d + w2_under) * f, experts);
    int64_t c = mt_expert_slot_elems(d * ld2, experts), most = a > b ? a : b;
    return MT_EXPERT_SCRATCH_SLOTS * (most > c ? most : c) * 2;
}

// Bytes of the dropout buffer of a call over `rows` rows of `width` columns (LoRA dropout > 0).
static inline int64_t mt_expert_dropout_scratch_bytes(int64_t rows, int64_t width) { return rows * width * 4; }
