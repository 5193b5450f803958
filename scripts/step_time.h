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
// Instruction issue: 132 SMs × 4 schedulers × one warp instruction (32 threads) a clock (the
// Hopper architecture whitepaper's SM), at 1.83 GHz, the clock the datasheet's 989 TFLOP/s implies
// at the whitepaper's 4096 dense bf16 FLOP a clock per SM: thread instructions a second.
#define H100_SMS 132
#define H100_CLOCK 1.83e9
#define ISSUE_RATE (H100_SMS * 4.0 * 32.0 * H100_CLOCK)
// Efficiencies, each named where it is printed (scripts/roofline.c).
//   cuBLASLt bf16 GEMMs (STEP_GEMM): measured 798 TFLOP/s at M = N = K = 8192 on the GPU
//     machine's H100 (issue 27; bench_gpu's matmul peak). Other shapes, assumed: the same core
//     rate, times the tile utilisation of the better of two Hopper tiles (128×256, 128×128: rows
//     and columns of the last tile idle, the last wave of tiles over 132 SMs part-empty) and
//     K / (K + 128) (a tile's pipeline fill and epilogue cost about two 64-deep K steps). The core
//     rate is calibrated so that 8192³ gives the measured 798.
//   Skinny GEMMs (N or K at most 64: LoRA's r = 16 products, the router's N = E), assumed at half
//     the core rate: cuBLASLt runs them with narrow or split-K tiles, not the wide tiles above,
//     and at that rate they are bound by their bytes (a few FLOPs a byte) whatever the factor.
//     Their bytes move at 0.44 of HBM, measured on the H100 (2026-11-27: the expert LoRA products
//     through grouped cuBLAS at 1462-1488 GB/s), not EFF_MEM's 0.80.
#define CUBLAS_8192_FLOPS 798e12
#define GEMM_K_OVERHEAD 128.0
#define GEMM_SKINNY 64.0
#define EFF_SKINNY 0.5
#define EFF_SKINNY_MEM 0.44
//   The grouped WMMA expert kernel (STEP_GROUPED, model/grouped_cuda.cu): 0.175 of the bf16 peak,
//     issue 27's static review (64×64×32 tiles, 4 warps, HMMA only, 2-byte staging loads: "near
//     15-20% of peak" even with free dequantization). Its dequantization is an ALU row of
//     STEP_GROUPED_DEQUANT_INSTR issue slots an element and tile.
#define EFF_GROUPED 0.175
//   Memory-bound kernels (STEP_MEM) 0.80 of 3.35 TB/s: docs/design.md expects ~3 TB/s (0.9) for
//     plain copies; gathers, reductions and small kernels reach less. Assumed.
#define EFF_MEM 0.80
//   The dequantization kernel (STEP_DEQUANT): 0.61 of the copy bandwidth (0.9 of HBM, the plain
//     copy docs/design.md expects): measured on the H100 (docs/gpu-results.md, 2026-11-27: NF4
//     double quant to bf16 at 1819 GB/s alone, 1831-1836 GB/s in the step, where the copy ran at
//     3006); issue 27's goal was 0.85. Or its instructions at the issue rate, whichever is slower.
#define EFF_COPY 0.90
#define EFF_DEQUANT 0.61
//   Attention on tensor cores (STEP_ATTN, model/ops_cuda.cu: WMMA 16×16×16 bf16, fp32
//     accumulate, flash-style). Backward: 0.028 of the bf16 peak, measured on the H100
//     (2026-11-27: 17.2 ms a layer at seq 4096, 32/8 heads, hd 128, counting the 7 units of
//     step_model.h); the assumption had been 0.20. Forward: 0.30 assumed, NOT measured (the step
//     measured ran cuDNN's forward) and likely as optimistic as the backward's was: issue 27's
//     static review put it at 15-20%.
#define EFF_ATTN_FWD 0.30
#define EFF_ATTN_BWD 0.028
//   cuDNN SDPA (STEP_SDPA), bf16, head dim 128, 4k sequence, H100 SXM5: 609 TFLOP/s forward and
//     499 backward, cuDNN's bars in the FlashAttention-3 paper's Figures 5 and 6 (Shah et al.,
//     2024, arXiv 2407.08608; without a causal mask). Causal, assumed: 0.85 of that (the
//     diagonal tiles half masked, short rows at a sequence's start).
#define SDPA_FWD_FLOPS 609e12
#define SDPA_BWD_FLOPS 499e12
#define SDPA_CAUSAL 0.85
//   Legacy GEMM model (a STEP_GEMM row without N and K): 0.75 × M / (M + 64), assumed.
#define EFF_GEMM 0.75
#define GEMM_HALF_M 64.0
//   The grouped WMMA kernel's in-kernel dequantization on the CUDA cores (STEP_ALU): its
//     instructions at the issue rate, added to the GEMM's time as if nothing overlapped (an upper
//     bound on its cost).
//   Kernel launches: each call costs its time plus a 2 µs gap (back-to-back kernels on one
//     stream without CUDA Graphs: launch latency not hidden behind a short kernel). Assumed.
#define LAUNCH_GAP_S 2e-6

// The fraction of a tile dimension `x` leaves busy in tiles of `t`.
static inline double tile_use(double x, double t) { return x / (ceil(x / t) * t); }

// cuBLASLt's efficiency at (M, N, K): the tile utilisation of the better tile, waves over 132 SMs.
static inline double cublas_tiles(double m, double n) {
    double best = 0;
    const double tn[2] = {256, 128};
    for (int i = 0; i < 2; i++) {
        double tiles = ceil(m / 128) * ceil(n / tn[i]);
        double waves = tiles / (ceil(tiles / H100_SMS) * H100_SMS);
        best = fmax(best, tile_use(m, 128) * tile_use(n, tn[i]) * waves);
    }
    return best;
}
static inline double cublas_core(void) {
    return CUBLAS_8192_FLOPS / PEAK_BF16 / (cublas_tiles(8192, 8192) * 8192 / (8192 + GEMM_K_OVERHEAD));
}
static inline int gemm_skinny(double n, double k) { return fmin(n, k) <= GEMM_SKINNY; }
static inline double cublas_eff(double m, double n, double k) {
    if (gemm_skinny(n, k)) return cublas_core() * EFF_SKINNY;
    return cublas_core() * cublas_tiles(m, n) * k / (k + GEMM_K_OVERHEAD);
}

static inline double op_eff(const step_op *o) {
    switch (o->cls) {
    case STEP_GEMM: return o->n > 0 ? cublas_eff(o->m, o->n, o->k) : EFF_GEMM * o->m / (o->m + GEMM_HALF_M);
    case STEP_GROUPED: return EFF_GROUPED;
    case STEP_ATTN: return o->phase == 'B' ? EFF_ATTN_BWD : EFF_ATTN_FWD;
    case STEP_SDPA: return SDPA_CAUSAL * (o->phase == 'B' ? SDPA_BWD_FLOPS : SDPA_FWD_FLOPS) / PEAK_BF16;
    case STEP_DEQUANT: return EFF_COPY * EFF_DEQUANT;
    case STEP_ALU: return 1.0;
    default: return EFF_MEM;
    }
}

// The fraction of HBM a memory-bound op's bytes move at.
static inline double mem_eff(const step_op *o) {
    if (o->cls == STEP_DEQUANT) return op_eff(o);
    return o->cls == STEP_GEMM && o->n > 0 && gemm_skinny(o->n, o->k) ? EFF_SKINNY_MEM : EFF_MEM;
}

// Seconds, and whether compute (1: tensor cores, or issue slots) or memory (0) bounds it.
static inline double op_time(const step_op *o, int *compute_bound) {
    double tc, tm;
    switch (o->cls) {
    case STEP_MEM: tc = 0, tm = o->bytes / (HBM_BW * mem_eff(o)); break;
    case STEP_ALU: tc = o->instr / ISSUE_RATE, tm = 0; break;
    case STEP_DEQUANT: tc = o->instr / ISSUE_RATE, tm = o->bytes / (HBM_BW * mem_eff(o)); break;
    default: tc = o->flops / (PEAK_BF16 * op_eff(o)), tm = o->bytes / (HBM_BW * mem_eff(o)); break;
    }
    *compute_bound = tc > tm;
    return fmax(tc, tm) + (o->cls == STEP_ALU ? 0 : o->count * LAUNCH_GAP_S);
}
