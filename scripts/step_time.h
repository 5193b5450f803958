// scripts/step_time.h — the roofline's time of one op of scripts/step_model.h on an H100 SXM:
// max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency)). Shared by the projection
// (scripts/roofline.c) and the measured-beside-projected table (scripts/profile_table.h).
#pragma once
#include <math.h>

#include "scripts/step_model.h"

// NVIDIA H100 SXM5 datasheet (nvidia.com/en-us/data-center/h100, "H100 SXM" column): dense
// bf16 tensor core 989 TFLOP/s (1979 is with sparsity), fp32 (CUDA cores) 67 TFLOP/s, HBM3
// 3.35 TB/s.
#define PEAK_BF16 989e12
#define PEAK_FP32 67e12
#define HBM_BW 3.35e12
// Efficiencies.
//   GEMM 0.75 at large M: docs/design.md ("GPU performance conventions") takes ~800 TFLOP/s (0.81 of peak) as what
//     cuBLASLt's dense bf16 GEMMs reach on an H100; 0.75 leaves room for the step's non-square
//     shapes (N = 1024 for k and v, K = 16 LoRA products). Assumed, to be replaced by
//     bench_gpu's measured matmul peak.
//   Small M: × M / (M + 64). Assumed: a 128-row tile is on average half idle on the last
//     row-tile of each expert, and few row-tiles leave SMs idle (132 SMs); at M = 1024 rows per
//     expert (s = 4096, top-2 of 8) it gives 0.71, at M = 64 half the large-M rate.
//   Memory-bound kernels 0.80 of 3.35 TB/s: docs/design.md expects ~3 TB/s (0.9) for plain copies;
//     gathers, reductions and small kernels reach less. Assumed.
//   Attention on tensor cores (model/ops_cuda.cu: WMMA 16×16×16 bf16, fp32 accumulate, flash-
//     style) 0.30 of the bf16 peak forward and 0.20 backward. Source: the FlashAttention-3 paper
//     (Shah et al., 2024) puts FlashAttention-2, an mma.sync kernel of the same design, at about
//     35% utilisation of an H100 and FA3 (wgmma, TMA, warp specialisation) at up to 75%; ours is
//     simpler than FA2 (WMMA, the O/dQ/dK/dV accumulators through shared memory, a separate dq
//     pass), hence below it, and backward kernels reach less than forward ones (FA2's own paper).
//     Assumed: no H100 measurement of these kernels exists yet (scripts/gpu_check.sh is to take it).
#define EFF_GEMM 0.75
#define EFF_MEM 0.80
#define EFF_ATTN_FWD 0.30
#define EFF_ATTN_BWD 0.20
#define GEMM_HALF_M 64.0
// The grouped expert GEMMs' in-kernel dequantization on the CUDA cores (integer and fp32 ops
// counted alike at the fp32 rate): assumed 0.5 of it, added to the GEMM's time as if nothing
// overlapped: an upper bound on its cost.
#define EFF_ALU 0.50

static inline double op_eff(const step_op *o) {
    switch (o->cls) {
    case STEP_GEMM: return EFF_GEMM * o->m / (o->m + GEMM_HALF_M);
    case STEP_ATTN: return o->phase == 'B' ? EFF_ATTN_BWD : EFF_ATTN_FWD;
    case STEP_ALU: return EFF_ALU;
    default: return EFF_MEM;
    }
}

// MEM: unused (memory-bound by definition); ALU: the CUDA cores' fp32 rate
static inline double op_peak(const step_op *o) { return o->cls == STEP_MEM || o->cls == STEP_ALU ? PEAK_FP32 : PEAK_BF16; }

// Seconds, and whether compute (1) or memory (0) bounds it.
static inline double op_time(const step_op *o, int *compute_bound) {
    double tc = o->cls == STEP_MEM ? 0.0 : o->flops / (op_peak(o) * op_eff(o));
    double tm = o->bytes / (HBM_BW * (o->cls == STEP_MEM ? op_eff(o) : EFF_MEM));
    *compute_bound = tc > tm;
    return fmax(tc, tm);
}

