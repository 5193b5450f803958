// scripts/step_time.h — the roofline's time of one op of scripts/step_model.h on an H100 SXM:
// max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency)). Shared by the projection
// (scripts/roofline.c) and the measured-beside-projected table (scripts/profile_table.h).
#pragma once
#include <math.h>
#include <string.h>

#include "scripts/step_model.h"

// The card. Datasheets (nvidia.com/en-us/data-center/h100, /h200, "SXM" columns): dense bf16
// tensor core 989 TFLOP/s on both (1979 is with sparsity), HBM3 3.35 TB/s (H100), HBM3e 4.8 TB/s
// (H200). Measured on the GPU machine (docs/gpu-results.md, 2026-11-27): a device-to-device
// copy (read + write) 3006 GB/s on the H100 and 4251 on the H200; bf16 GEMM 8192³ through our
// cuBLASLt path 798 (the H100's first reading; 770 in run 1) and 781 TFLOP/s; the expert
// dequantization at 0.61 and 0.495 of the copy; skinny GEMMs' bytes (LoRA's r = 16 products)
// at ~1.47 and ~1.6 TB/s, the same on both cards: latency, not bandwidth, bounds them.
// Instruction issue: 132 SMs × 4 schedulers × one warp instruction (32 threads) a clock (the
// Hopper whitepaper's SM) at 1.83 GHz, the clock 989 TFLOP/s implies at 4096 dense bf16 FLOP a
// clock per SM.
typedef struct {
    const char *key, *name;
    double peak_bf16, hbm_bw, copy_bw, cublas_8192, dequant_frac, skinny_bw;
    int profiled;  // 1: STEP_MEASURED's byte rates were measured on this card (else skinny_bw)
} step_device;
static const step_device STEP_DEVICES[] = {
    {"h100", "H100 SXM", 989e12, 3.35e12, 3006e9, 798e12, 0.61, 1.47e12, 0},
    {"h200", "H200", 989e12, 4.80e12, 4251e9, 781e12, 0.495, 1.60e12, 1},
};
static const step_device *step_dev = &STEP_DEVICES[0];
// Selects the card by key ("h100", "h200") or by a device name containing "H200"; 0 when known.
static inline int step_device_set(const char *key_or_name) {
    for (size_t i = 0; i < sizeof STEP_DEVICES / sizeof STEP_DEVICES[0]; i++)
        if (!strcmp(key_or_name, STEP_DEVICES[i].key)) return step_dev = &STEP_DEVICES[i], 0;
    if (strstr(key_or_name, "H200")) return step_dev = &STEP_DEVICES[1], 0;
    if (strstr(key_or_name, "H100")) return step_dev = &STEP_DEVICES[0], 0;
    return -1;
}
#define PEAK_BF16 (step_dev->peak_bf16)
#define PEAK_FP32 67e12
#define HBM_BW (step_dev->hbm_bw)
#define H100_SMS 132
#define H100_CLOCK 1.83e9
#define ISSUE_RATE (H100_SMS * 4.0 * 32.0 * H100_CLOCK)
// Efficiencies, each named where it is printed (scripts/roofline.c).
//   cuBLASLt bf16 GEMMs (STEP_GEMM): the card's measured 8192³ rate (step_device). Other shapes,
//     assumed: the same core
//     rate, times the tile utilisation of the better of two Hopper tiles (128×256, 128×128: rows
//     and columns of the last tile idle, the last wave of tiles over 132 SMs part-empty) and
//     K / (K + 128) (a tile's pipeline fill and epilogue cost about two 64-deep K steps). The core
//     rate is calibrated so that 8192³ gives the measured rate. Expert GEMMs (rows set by the
//     routing, step_op.imbalance = STEP_ROUTING_SPREAD) average the tile use over rows spread ±20% around the balanced
//     T·k/E: routing is never exactly balanced, and a few rows past a multiple of 128 add a
//     wave. On the H200 (2026-11-27, rows ≈ 1024 an expert) the balanced figure projected
//     770-790 TFLOP/s where cuBLASLt ran 556-665; the spread projects 630-730.
//   Skinny GEMMs (N or K at most 64: LoRA's r = 16 products, the router's N = E), assumed at half
//     the core rate: cuBLASLt runs them with narrow or split-K tiles, not the wide tiles above,
//     and at that rate they are bound by their bytes (a few FLOPs a byte) whatever the factor.
//     Their bytes move at the card's skinny_bw (measured, step_device), or on the H200 at the
//     rate STEP_MEASURED gives the row.
#define CUBLAS_8192_FLOPS (step_dev->cublas_8192)
#define GEMM_K_OVERHEAD 128.0
#define GEMM_SKINNY 64.0
#define EFF_SKINNY 0.5
//   Memory-bound kernels (STEP_MEM): a fraction of the card's measured copy bandwidth, per row
//     (STEP_MEASURED below: the H200's profile of case C at seq 4096 and 16384, 2026-11-27,
//     run 6, the mean of the two); a row not measured at EFF_MEM, the measured rows' median.
//     Assumed: the H100 reaches the same fractions of its copy (the one row measured on both,
//     the expert dequantization, reached 0.61 there and 0.495 on the H200: small kernels are
//     partly latency-bound, so the H100 projection of these rows may be pessimistic).
#define EFF_MEM 0.62
//   The dequantization kernel (STEP_DEQUANT): the card's measured fraction of its copy
//     (step_device.dequant_frac; issue 27's goal is 0.85), or its instructions at the issue
//     rate, whichever is slower.
#define EFF_DEQUANT (step_dev->dequant_frac)
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

// Rows measured on the H200 (run 6, commit b17536d, case C, 4 layers, seq 4096 and 16384; GB/s
// over the copy's 4251, the mean of the two lengths), each replacing the assumption it corrected
// (0.80 of HBM for memory-bound rows; cuBLASLt's tile model for the chunked lm_head GEMMs,
// which ran at 0.41-0.52 of peak). phase 0: any phase.
typedef struct {
    const char *name;
    char phase;
    double frac;  // memory rows: of the copy bandwidth; GEMM rows: of the bf16 peak
    double bw;      // skinny GEMM rows: their bytes' rate on the H200, bytes/s (other cards: skinny_bw)
    double call_s;  // seconds a call of the model's count beyond its bytes (0: LAUNCH_GAP_S); every card
} step_measured;
// Rows fitted as calls · call_s + bytes / rate use both lengths (two figures, two unknowns).
static const step_measured STEP_MEASURED[] = {
    {"embedding", 0, 1.00, 0, 18e-6},         // 1999, 3462 GB/s: near the copy, and a fixed 18 us
    {"rmsnorm", 0, 0.70, 0, 0},               // 2649-2736, 3002-3364
    {"dequant NF4->bf16 q,k,v,o", 0, 0.32, 0, 0},  // 1349-1385: 16 small matrices a layer
    {"rope (q, k)", 0, 0.45, 0, 0},           // 1683-1712, 2046-2093
    {"residual adds", 0, 1.00, 0, 4.4e-6},    // 3476-3760, 4095-4205: the copy, 4.4 us a call
    {"permute/gather + combine", 'R', 0.96, 0, 0},  // 4115, 4080: the replay's gather alone
    {"permute/gather + combine", 0, 0.63, 0, 0},    // 2373-2448, 2711-3193
    {"SwiGLU", 'B', 0.81, 0, 0},              // 3543, 3329
    {"SwiGLU", 0, 0.58, 0, 0},                // 2559-2604, 2326-2376
    {"cross-entropy gradient", 0, 0.30, 0, 0},  // 1300, 1274
    {"AdamW", 0, 0.46, 0, 0},                 // 1914, 1995
    {"lm_head GEMM + loss", 0, 0.50, 0, 0},   // 517, 480 TFLOP/s
    {"lm_head GEMM (dx)", 0, 0.41, 0, 0},     // 446, 368 TFLOP/s
    // Skinny GEMMs (r = 16 or E = 8 columns): grouped cuBLAS over the experts' rows (the H100
    // ran them at 1462-1488 GB/s), plain GEMMs over all T rows for the router and its LoRA.
    {"LoRA experts w1,w3,w2 (cuBLAS)", 'B', 0, 1.87e12, 0},  // 1563, 2169 GB/s
    {"LoRA experts w1,w3,w2 (cuBLAS)", 0, 0, 1.57e12, 0},    // 1457-1678
    {"LoRA gate", 'B', 0, 2.92e12, 23e-6},    // 1614, 2425
    {"LoRA gate", 0, 0, 3.79e12, 7.5e-6},     // 2054-2085, 3095-3141
    {"router GEMM + top-k", 0, 0, 3.54e12, 7.3e-6},  // the recompute's 1085, 2267 (the forward's
                                                     // aux statistics were slow: fixed since)
};
static inline const step_measured *step_measured_of(const step_op *o) {
    for (size_t i = 0; i < sizeof STEP_MEASURED / sizeof STEP_MEASURED[0]; i++)
        if ((!STEP_MEASURED[i].phase || STEP_MEASURED[i].phase == o->phase) && !strcmp(o->name, STEP_MEASURED[i].name))
            return &STEP_MEASURED[i];
    return NULL;
}

// cuBLASLt at (M, N, K) with rows spread ±spread around M (time-weighted: FLOPs over time).
static inline double cublas_eff_spread(double m, double n, double k, double spread) {
    if (spread <= 0) return cublas_eff(m, n, k);
    double flops = 0, time = 0;
    for (int i = 0; i <= 64; i++) {
        double mi = m * (1 - spread + 2 * spread * i / 64.0);
        flops += mi, time += mi / cublas_eff(mi, n, k);
    }
    return flops / time;
}

static inline double op_eff(const step_op *o) {
    switch (o->cls) {
    case STEP_GEMM: {
        const step_measured *x = step_measured_of(o);
        if (x && x->frac > 0) return x->frac;
        return o->n > 0 ? cublas_eff_spread(o->m, o->n, o->k, o->imbalance) : EFF_GEMM * o->m / (o->m + GEMM_HALF_M);
    }
    case STEP_ATTN: return o->phase == 'B' ? EFF_ATTN_BWD : EFF_ATTN_FWD;
    case STEP_SDPA: return SDPA_CAUSAL * (o->phase == 'B' ? SDPA_BWD_FLOPS : SDPA_FWD_FLOPS) / PEAK_BF16;
    case STEP_DEQUANT: return EFF_DEQUANT;
    default: {
        const step_measured *x = step_measured_of(o);
        return x && x->frac > 0 ? x->frac : EFF_MEM;
    }
    }
}

// The bandwidth an op's bytes move at (bytes/s): memory-bound rows at their fraction of the copy,
// skinny GEMMs at the card's measured rate, other kernels' operands at the copy's.
static inline double mem_bw(const step_op *o) {
    if (o->cls == STEP_GEMM && o->n > 0 && gemm_skinny(o->n, o->k)) {
        const step_measured *x = step_measured_of(o);
        return x && x->bw > 0 && step_dev->profiled ? x->bw : step_dev->skinny_bw;
    }
    if (o->cls == STEP_MEM || o->cls == STEP_DEQUANT) return step_dev->copy_bw * op_eff(o);
    return step_dev->copy_bw;
}
// The fraction of the copy bandwidth that is.
static inline double mem_eff(const step_op *o) { return mem_bw(o) / step_dev->copy_bw; }

// Seconds, and whether compute (1: tensor cores, or issue slots) or memory (0) bounds it.
static inline double op_time(const step_op *o, int *compute_bound) {
    double tc, tm;
    switch (o->cls) {
    case STEP_MEM: tc = 0, tm = o->bytes / mem_bw(o); break;
    case STEP_DEQUANT: tc = o->instr / ISSUE_RATE, tm = o->bytes / mem_bw(o); break;
    default: tc = o->flops / (PEAK_BF16 * op_eff(o)), tm = o->bytes / mem_bw(o); break;
    }
    *compute_bound = tc > tm;
    const step_measured *x = step_measured_of(o);
    const double call_s = x && x->call_s > 0 ? x->call_s : LAUNCH_GAP_S;
    return fmax(tc, tm) + o->count * call_s;
}
