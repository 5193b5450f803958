// quant/dequant_cuda.cuh — the device side of one 4-bit element's value (.cu files only), shared
// by quant/quant.cu's dequantize kernels, so that a format has one device definition. The formats
// themselves: quant/formats.h.
//
// The codebooks are `static` __constant__ / __device__ copies made from formats.h's lists: every
// .cu including this gets its own (no relocatable device code), all from the same text.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda_check.h"  // first: it makes core/common.h digestible for nvcc
#include "quant/qweight.h"

static __constant__ float mt_c_nf4_map[16] = {MT_NF4_MAP_VALUES};
static __constant__ float mt_c_fp4_map[16] = {MT_FP4_MAP_VALUES};
static __constant__ float mt_c_e2m1_map[16] = {MT_E2M1_VALUES};
static __device__ float mt_d_dynamic_map[256] = {MT_DYNAMIC_MAP_VALUES};  // read as a plain pointer

// What a kernel needs of a weight, by value.
struct mt_deq_args {
    const uint8_t *packed;
    const void *absmax;          // F32 absmax, U8 codes (double quant), F16 scales (int4) or U8 e8m0 (mxfp4)
    const __half *zero;          // int4 minimums
    const float *nested_absmax;  // double quant
    const float *nested_map;
    float offset;
    int bs;
    int type;                    // mt_quant
    int dq;
};

// Host: q's device pointers (the canonical nested map: this file's device copy).
static inline mt_deq_args mt_deq_args_of(const mt_qweight *q) {
    mt_deq_args a;
    a.packed = (const uint8_t *)q->packed->data;
    a.absmax = q->absmax->data;
    a.zero = q->zero ? (const __half *)q->zero->data : NULL;
    a.nested_absmax = q->nested_absmax ? (const float *)q->nested_absmax->data : NULL;
    a.nested_map = NULL;
    if (q->double_quant) {
        if (q->nested_map) a.nested_map = (const float *)q->nested_map->data;
        else MT_CHECK_CUDA(cudaGetSymbolAddress((void **)&a.nested_map, mt_d_dynamic_map));
    }
    a.offset = q->offset;
    a.bs = q->blocksize;
    a.type = (int)q->type;
    a.dq = q->double_quant;
    return a;
}

// The 16-entry table of q's format (NF4, FP4 or MXFP4's e2m1; INT4 uses none), from constant memory.
static __device__ __forceinline__ float mt_deq_lut(int type, unsigned c) {
    return type == MT_QUANT_FP4 ? mt_c_fp4_map[c] : type == MT_QUANT_MXFP4 ? mt_c_e2m1_map[c] : mt_c_nf4_map[c];
}

// Code of element i: element 2j in the high nibble of byte j (MXFP4: in the low one).
static __device__ __forceinline__ unsigned mt_deq_code(int type, const uint8_t *packed, int64_t i) {
    int shift = type == MT_QUANT_MXFP4 ? (int)(i & 1) << 2 : (int)(~i & 1) << 2;
    return (packed[i >> 1] >> shift) & 15u;
}

// The scale of block b (and, for int4, its minimum).
static __device__ __forceinline__ float mt_deq_block_scale(const mt_deq_args &a, int64_t b, float *m) {
    if (a.type == MT_QUANT_INT4) {
        *m = __half2float(a.zero[b]);
        return __half2float(((const __half *)a.absmax)[b]);
    }
    if (a.type == MT_QUANT_MXFP4) return mt_e8m0_half(((const uint8_t *)a.absmax)[b]);  // times 2·e2m1
    if (!a.dq) return ((const float *)a.absmax)[b];
    uint8_t c = ((const uint8_t *)a.absmax)[b];
    return __fadd_rn(__fmul_rn(a.nested_map[c], a.nested_absmax[b / MT_Q4_NESTED_BLOCKSIZE]), a.offset);
}

// Code c's value in a block of scale s (int4: and minimum m); lut: the format's 16-entry table.
static __device__ __forceinline__ float mt_deq_value(const mt_deq_args &a, const float *lut, unsigned c, float s,
                                                     float m) {
    if (a.type == MT_QUANT_MXFP4) return __fmul_rn(__fmul_rn(lut[c], 2.0f), s);  // s = 2^(e−128): mt_mxfp4_value
    return a.type == MT_QUANT_INT4 ? mt_int4_value(c, s, m) : __fmul_rn(lut[c], s);
}
